//! The overview's charts, inline SVG drawn on the server from the host's own samples
//! ([`crate::serve::samples`]): deliveries per second for the last ten minutes, and for the
//! last hour per minute the deliveries (acked, retried, dead-lettered or failed), the retry
//! lateness p99 and the consumer lag.

use maud::{Markup, html};

use crate::observe::metrics::lateness::p99_between;
use crate::serve::samples::{MinuteSample, Sample};

const W: f64 = 1100.0;
const COLORS: [&str; 3] = ["#12805c", "#b54708", "#c01048"];

/// Lines of `series` (each point: when, and one value per line) scaled to the largest value.
fn lines(points: &[(i64, Vec<f64>)], height: f64, label: &str, unit: &str) -> Markup {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return html! { p.muted { "Collecting." } };
    };
    let top = points
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let span = (last.0 - first.0).max(1) as f64;
    let n = points.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let at = |t: i64, v: f64| {
        (
            40.0 + (t - first.0) as f64 / span * (W - 50.0),
            10.0 + (1.0 - v / top) * (height - 30.0),
        )
    };
    let line = |i: usize| -> String {
        points
            .iter()
            .filter_map(|(t, v)| v.get(i).map(|v| at(*t, *v)))
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let top_text = if top >= 10.0 {
        format!("{top:.0}{unit}")
    } else {
        format!("{top:.2}{unit}")
    };
    html! {
        svg viewBox=(format!("0 0 {W} {height}")) width="100%" height=(height) role="img" aria-label=(label) data-chart=(label) {
            line x1="40" y1=(height - 20.0) x2=(W - 10.0) y2=(height - 20.0) stroke="#e4e7ec" {}
            text x="0" y="16" { (top_text) }
            text x="0" y=(height - 20.0) { "0" }
            @for i in 0..n {
                polyline points=(line(i)) fill="none" stroke=(COLORS[i % 3]) stroke-width="2" {}
            }
        }
    }
}

fn legend(names: &[&str]) -> Markup {
    html! {
        div.legend {
            @for (name, color) in names.iter().zip(COLORS) { span { i style=(format!("background:{color}")) {} (name) } }
        }
    }
}

/// Deliveries per second between consecutive samples.
pub(super) fn per_second(samples: &[Sample]) -> Markup {
    if samples.len() < 2 {
        return html! { p.muted { "Collecting: the chart fills in after a few seconds." } };
    }
    let points: Vec<(i64, Vec<f64>)> = samples
        .windows(2)
        .map(|w| {
            let secs = ((w[1].at_ms - w[0].at_ms) as f64 / 1000.0).max(0.001);
            let rate = |i: usize| w[1].counts[i].saturating_sub(w[0].counts[i]) as f64 / secs;
            (w[1].at_ms, vec![rate(0), rate(1), rate(2)])
        })
        .collect();
    html! {
        (lines(&points, 140.0, "deliveries per second", "/s"))
        (legend(&["acked", "retried", "dead-lettered or failed"]))
    }
}

/// The last hour, per minute: deliveries, retry lateness p99, consumer lag.
pub(super) fn last_hour(minutes: &[MinuteSample]) -> Markup {
    let deliveries: Vec<(i64, Vec<f64>)> = minutes
        .windows(2)
        .map(|w| {
            let n = |i: usize| w[1].counts[i].saturating_sub(w[0].counts[i]) as f64;
            (w[1].at_ms, vec![n(0), n(1), n(2)])
        })
        .collect();
    let lateness: Vec<(i64, Vec<f64>)> = minutes
        .windows(2)
        .map(|w| {
            let p99 = p99_between(&w[0].lateness, &w[1].lateness).unwrap_or(0.0);
            (w[1].at_ms, vec![p99 * 1000.0])
        })
        .collect();
    let lag: Vec<(i64, Vec<f64>)> = minutes
        .iter()
        .filter_map(|m| m.lag.map(|lag| (m.at_ms, vec![lag as f64])))
        .collect();
    html! {
        div.card data-last-hour=(minutes.len()) {
            h2 { "Last hour, per minute" }
            @if minutes.len() < 2 {
                p.muted { "Collecting: the first minute's point comes after two minutes." }
            } @else {
                h3 { "Deliveries per minute" }
                (lines(&deliveries, 120.0, "deliveries per minute", ""))
                (legend(&["handled (acked)", "retried", "dead-lettered or failed"]))
                h3 { "Retry lateness, p99" }
                (lines(&lateness, 90.0, "retry lateness p99", " ms"))
            }
            h3 { "Consumer lag (unread entries)" }
            @if lag.is_empty() {
                p.muted { "Read each minute while this page is watched: it appears a minute after you open it." }
            } @else {
                (lines(&lag, 90.0, "consumer lag", ""))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::metrics::lateness::LatenessCounts;

    #[test]
    fn the_last_hour_draws_each_minutes_counts_lateness_p99_and_lag() {
        let late = LatenessCounts::default();
        let first = MinuteSample {
            at_ms: 0,
            counts: [0, 0, 0],
            lateness: late.read(),
            lag: None,
        };
        for _ in 0..100 {
            late.observe(0.004);
        }
        let second = MinuteSample {
            at_ms: 60_000,
            counts: [120, 30, 6],
            lateness: late.read(),
            lag: Some(42),
        };
        let html = last_hour(&[
            first,
            second.clone(),
            MinuteSample {
                at_ms: 120_000,
                ..second
            },
        ])
        .into_string();
        // The busiest minute's 120 handled is the top of its chart; lateness p99 is the
        // 4 ms bucket's bound (5.12 ms); the lag's 42 read twice.
        assert!(html.contains(">120<"), "{html}");
        assert!(html.contains(">5.12 ms<"), "{html}");
        assert!(html.contains(">42<"), "{html}");
        assert!(html.contains("data-chart=\"consumer lag\""));
        let empty = last_hour(&[]).into_string();
        assert!(empty.contains("Collecting"));
    }
}
