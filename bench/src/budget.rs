//! The per-scenario budgets BENCHMARKS.md keeps: the host's µs of CPU per message at the last
//! accepted commit. Every run's table marks a scenario more than [`OVER`] over its budget, so a
//! slow creep of the per-delivery path shows in the next run anyone makes, not only in a
//! comparison nobody thought to make (issue 50: five steps of "under 5 %" added up to 40-80 %).
//!
//! The budgets are read from BENCHMARKS.md at build time, from the table between
//! `<!-- budgets -->` and `<!-- /budgets -->`: `| scenario | host µs per message | ... |`.

/// How far over its budget a scenario may be before the table marks it.
pub const OVER: f64 = 0.10;

const BENCHMARKS: &str = include_str!("../../BENCHMARKS.md");

/// The budget of `scenario`, in host µs per message, if BENCHMARKS.md sets one.
pub fn of(scenario: &str) -> Option<f64> {
    budgets(BENCHMARKS)
        .find(|(name, _)| *name == scenario)
        .map(|(_, us)| us)
}

/// The rows of the budgets table in `text`: scenario and host µs per message.
fn budgets(text: &str) -> impl Iterator<Item = (&str, f64)> {
    let start = text.find("<!-- budgets -->").map_or(text.len(), |i| i + 16);
    let end = text[start..]
        .find("<!-- /budgets -->")
        .map_or(start, |i| start + i);
    text[start..end].lines().filter_map(|line| {
        let mut cells = line.trim().strip_prefix('|')?.split('|').map(str::trim);
        let name = cells.next()?;
        let us = cells.next()?.parse().ok()?;
        Some((name, us))
    })
}

/// How far `host_us` is over `scenario`'s budget (0.25 is 25 % over), when it is more than
/// [`OVER`] over.
pub fn over(scenario: &str, host_us: f64) -> Option<f64> {
    let budget = of(scenario)?;
    let over = host_us / budget - 1.0;
    (over > OVER).then_some(over)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_between_the_markers_is_read() {
        let text = "| native | 9.9 |\n<!-- budgets -->\n| scenario | host µs per message |\n|---|---|\n| native | 3.5 | abc |\n| wasm | 10 |\n<!-- /budgets -->\n| wasm | 1 |";
        let rows: Vec<_> = budgets(text).collect();
        assert_eq!(rows, [("native", 3.5), ("wasm", 10.0)]);
    }

    #[test]
    fn benchmarks_md_has_budgets_for_the_hot_path() {
        for scenario in ["native", "wasm", "wasm-isolated"] {
            assert!(of(scenario).is_some(), "{scenario}");
        }
    }
}
