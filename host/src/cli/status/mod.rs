//! `sluice status`: what each subscription has in Redis right now. [`read`] reads the rows;
//! this file holds the command and what it prints of them: text (with many rows, a summary
//! and those with something to see) or JSON lines.

mod read;

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Result;

use super::args::parse_duration;
use super::format_ms;
use read::{Row, SubscriptionStatus, ask_all, connect_all, rows_to_ask};

/// `sluice status`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    // --json, --all, --stream and --timeout: what the library's callers give too.
    #[command(flatten)]
    options: StatusOptions,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice status`: the report goes to stdout, and the command fails when a row could not be
/// read.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let report = status(&args.paths, args.redis.as_deref(), &args.options).await?;
    print!("{}", report.text);
    if report.failed > 0 {
        anyhow::bail!(
            "{} subscription rows could not be read (named above)",
            report.failed
        );
    }
    Ok(())
}

/// What `sluice status` shows and how long it may take (its options: each doc comment is the
/// option's help).
#[derive(Debug, Clone, clap::Args)]
pub struct StatusOptions {
    /// One JSON object per subscription, one per line (every one).
    #[arg(long)]
    pub json: bool,
    /// Every subscription, not only those with something to see (with more than 20).
    #[arg(long)]
    pub all: bool,
    /// Only streams whose name contains this.
    #[arg(long)]
    pub stream: Option<String>,
    /// The longest the whole report may take; what has not answered by then is named.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
}

/// Up to this many rows, the text shows every one; above, the summary and the rows with
/// something to see (unless `--all`).
pub const SHOW_ALL_UP_TO: usize = 20;

/// What `sluice status` came to: the report, and how many rows Redis did not answer (the
/// command fails then, after printing what it has).
#[derive(Debug)]
pub struct StatusReport {
    /// The text (or JSON lines) to print.
    pub text: String,
    /// Rows that could not be read, each named in the text.
    pub failed: usize,
}

/// `sluice status`: for each subscription, the group's consumers and pending counts, parked
/// entries and the next due time, the dead-letter stream's length and the handler's digest;
/// with many, a summary first and the ones with something to see.
pub async fn status(
    paths: &[PathBuf],
    redis: Option<&str>,
    options: &StatusOptions,
) -> Result<StatusReport> {
    let deadline = tokio::time::Instant::now() + options.timeout;
    // Each Redis is asked first, once, under the deadline (and before anything is compiled):
    // one that does not answer has its rows named NOT READ, and the others are shown.
    let config = super::load(paths)?;
    let connections = connect_all(&config, redis, options.timeout).await?;
    let plan = super::plan_of(&config, redis, true).await?;
    let (asks, unreachable) = rows_to_ask(&plan, &connections, options.stream.as_deref())?;
    let asked = asks.len() + unreachable.len();
    let (answered, unanswered) = ask_all(asks, deadline).await;
    let mut rows = unreachable;
    rows.extend(answered);
    render(&rows, &unanswered, asked, options)
}

/// Whether a row has something an operator should look at, beyond the work it is doing
/// (pending and unread entries, parked retries not yet due).
fn needs_look(r: &SubscriptionStatus) -> bool {
    /// A retry overdue by more than this is not just waiting for its sweep.
    const OVERDUE_MS: i64 = 60_000;
    !r.group_exists
        || r.paused.is_some()
        || r.breaker.is_some()
        || r.dead_letter_length > 0
        || r.consumers.iter().any(|c| c.gone)
        || r.next_due_in_ms.is_some_and(|ms| ms < -OVERDUE_MS)
}

/// The rows as `sluice status` prints them: one JSON object per line, or text (with many, a
/// summary first and only the rows with something to see, unless `--all`).
fn render(
    rows: &[Row],
    unanswered: &[(String, String)],
    asked: usize,
    options: &StatusOptions,
) -> Result<StatusReport> {
    let failed = rows.iter().filter(|r| r.is_err()).count() + unanswered.len();
    let late = format!("no answer within {:?}", options.timeout);
    if options.json {
        let text = render_json(rows, unanswered, &late)?;
        return Ok(StatusReport { text, failed });
    }
    let mut out = String::new();
    let rows_read: Vec<&SubscriptionStatus> = rows.iter().filter_map(|r| r.as_ref().ok()).collect();
    let every = options.all || asked <= SHOW_ALL_UP_TO;
    if asked > 1 {
        let filter = options.stream.as_deref();
        write_summary(&mut out, &rows_read, (asked, failed), filter, every);
    }
    for row in rows {
        if let Err((who, why)) = row {
            write_not_read(&mut out, who, why);
        }
    }
    for who in unanswered {
        write_not_read(&mut out, who, &late);
    }
    for r in rows_read.into_iter().filter(|r| every || needs_look(r)) {
        write_state(&mut out, r);
        write_keys(&mut out, r);
    }
    Ok(StatusReport { text: out, failed })
}

/// One JSON object per row, one per line; a row not read is its stream, group and error.
fn render_json(rows: &[Row], unanswered: &[(String, String)], late: &str) -> Result<String> {
    let mut out = String::new();
    for row in rows {
        match row {
            Ok(row) => out.push_str(&serde_json::to_string(row)?),
            Err(((stream, group), why)) => out.push_str(&serde_json::to_string(
                &serde_json::json!({"stream": stream, "group": group, "error": why}),
            )?),
        }
        out.push('\n');
    }
    for (stream, group) in unanswered {
        out.push_str(&serde_json::to_string(
            &serde_json::json!({"stream": stream, "group": group, "error": late}),
        )?);
        out.push('\n');
    }
    Ok(out)
}

/// A row that could not be read, and why.
fn write_not_read(out: &mut String, (stream, group): &(String, String), why: &str) {
    let _ = writeln!(out, "stream `{stream}`, group `{group}`: NOT READ: {why}");
}

/// The summary over `asked` rows (`failed` of them not read; `filter`: `--stream`), and, unless
/// `every` row is shown, which are.
fn write_summary(
    out: &mut String,
    rows_read: &[&SubscriptionStatus],
    (asked, failed): (usize, usize),
    filter: Option<&str>,
    every: bool,
) {
    let count = |f: &dyn Fn(&SubscriptionStatus) -> bool| rows_read.iter().filter(|r| f(r)).count();
    let looks = count(&needs_look);
    let _ = writeln!(
        out,
        "{asked} subscription rows{}: {} with pending entries, {} with unread entries, {} with parked retries, {} with dead letters, {} with gone consumers, {} paused, {} with the circuit breaker open, {} groups not created yet{}",
        filter.map_or(String::new(), |s| format!(" (streams containing `{s}`)")),
        count(&|r| r.pending > 0),
        count(&|r| r.lag.is_some_and(|l| l > 0)),
        count(&|r| r.parked.is_some_and(|p| p > 0)),
        count(&|r| r.dead_letter_length > 0),
        count(&|r| r.consumers.iter().any(|c| c.gone)),
        count(&|r| r.paused.is_some()),
        count(&|r| r.breaker.is_some()),
        count(&|r| !r.group_exists),
        if failed > 0 {
            format!("; {failed} NOT READ")
        } else {
            String::new()
        },
    );
    if !every {
        let _ = writeln!(
            out,
            "showing the {} with something to see (dead letters, gone consumers, a pause, an open breaker, overdue retries, no group) and those not read; --all shows every one",
            looks
        );
    }
    let _ = writeln!(out);
}

/// A row's head and its group: which stream, a pause or open breaker, pending and unread
/// entries, each consumer.
fn write_state(out: &mut String, r: &SubscriptionStatus) {
    let part = r.partition.as_ref().map_or(String::new(), |p| {
        format!(" (partition {} of {} of `{}`)", p.index, p.count, p.of)
    });
    let _ = writeln!(
        out,
        "stream `{}`{part}, group `{}` (handler sha256 {})",
        r.stream,
        r.group,
        r.handler_digest.short()
    );
    if let Some(paused) = &r.paused {
        let _ = writeln!(
            out,
            "  PAUSED: {}; no host reads it until `sluice resume`",
            paused.describe()
        );
    }
    if let Some(breaker) = &r.breaker {
        let _ = writeln!(out, "  CIRCUIT BREAKER {breaker}");
    }
    if !r.group_exists {
        let _ = writeln!(
            out,
            "  group does not exist yet (created when a host starts)"
        );
    }
    let lag = r.lag.map_or("unknown".to_owned(), |l| l.to_string());
    let _ = writeln!(
        out,
        "  pending {}, unread {lag}, last delivered {}",
        r.pending,
        r.last_delivered_id.as_deref().unwrap_or("-")
    );
    for c in &r.consumers {
        let _ = writeln!(
            out,
            "  consumer {:<28} pending {:>6}  idle {:.1}s{}",
            c.name,
            c.pending,
            c.idle_ms as f64 / 1000.0,
            if c.gone {
                "  GONE: holds pending entries; a running host takes them over"
            } else {
                ""
            }
        );
    }
}

/// A row's keys: the delayed set (and retry lane), the dead letters, the stream's size and
/// what retention last did.
fn write_keys(out: &mut String, r: &SubscriptionStatus) {
    match (&r.delayed_key, r.parked) {
        (Some(key), Some(parked)) => {
            let next = r.next_due_in_ms.map_or("none".to_owned(), |ms| {
                if ms <= 0 {
                    "due now".to_owned()
                } else {
                    format!("in {:.1}s", ms as f64 / 1000.0)
                }
            });
            let _ = writeln!(out, "  parked {parked} in `{key}`, next due {next}");
            if let Some(lane) = &r.lane {
                let unread = lane.lag.map_or("?".to_owned(), |l| l.to_string());
                let _ = writeln!(
                    out,
                    "  retry lane `{}`: {} pending, {unread} due retries not yet read",
                    lane.key, lane.pending
                );
            }
        }
        _ => {
            let _ = writeln!(out, "  no delayed-retry set");
        }
    }
    for s in &r.schedules {
        let _ = writeln!(
            out,
            "  schedule `{}` ({}, {}, missed {}): next tick {}, last fired {}",
            s.name,
            s.cron,
            s.time_zone,
            s.missed,
            s.next_ms.map_or("never".to_owned(), format_ms),
            s.last_fired_ms.map_or("never".to_owned(), format_ms)
        );
    }
    let _ = writeln!(
        out,
        "  dead letters {} in `{}`",
        r.dead_letter_length, r.dead_letter
    );
    let _ = writeln!(
        out,
        "  stream {} entries, {} bytes, oldest {}",
        r.size.length,
        r.size.bytes,
        r.oldest_age_ms.map_or("-".to_owned(), |ms| format!(
            "{:.0}s old",
            ms as f64 / 1000.0
        ))
    );
    if let Some(last) = &r.retention {
        let get = |k: &str| last.get(k).map_or("?", String::as_str);
        let _ = writeln!(
            out,
            "  retention last ran at {} ({}): trimmed {} below {}{}",
            get("at_ms")
                .parse::<i64>()
                .map(format_ms)
                .unwrap_or_default(),
            get("holder"),
            get("trimmed"),
            get("threshold"),
            if get("blocked") == "1" {
                "; over max_len, but groups still need the rest"
            } else {
                ""
            }
        );
    }
}
