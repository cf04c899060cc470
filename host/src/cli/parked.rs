//! `sluice parked`: the retries waiting in each delayed set.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use sluice_descriptor::ResolvedStream;

use super::{format_ms, plan_after_redis, redis_url_for};
use crate::entry::member::ParkedEntry;

/// `sluice parked`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Only the subscription to this stream.
    #[arg(long)]
    stream: Option<String>,
    /// One JSON object per set, one per line.
    #[arg(long)]
    json: bool,
    /// At most this many per set, earliest due first.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice parked`: the listing goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let listing = parked(
        &args.paths,
        args.redis.as_deref(),
        args.stream.as_deref(),
        args.json,
        args.limit,
    )
    .await?;
    print!("{listing}");
    Ok(())
}

/// `sluice parked`: what waits in each delayed-retry set, oldest first, at most `limit` per
/// set (read as one page: a set of millions is never read whole).
pub async fn parked(
    paths: &[PathBuf],
    redis: Option<&str>,
    stream: Option<&str>,
    json: bool,
    limit: usize,
) -> Result<String> {
    use sluice_descriptor::DelayedRetry;
    let plan = plan_after_redis(paths, redis).await?;
    let mut out = String::new();
    let mut seen = 0;
    for sub in &plan.subscriptions {
        let parts = sub.stream.partitioned();
        // `--stream` names the subscription's stream or one partition's.
        let parts: Vec<_> = parts
            .iter()
            .filter(|p| {
                stream.is_none_or(|name| name == p.stream || name == sub.stream.stream)
                    && p.delayed_retry.is_some()
            })
            .collect();
        if parts.is_empty() {
            continue;
        }
        let url = redis_url_for(sub.redis.as_deref())?;
        let mut conn =
            crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
        for s in parts {
            let Some(DelayedRetry::DurableZset { key, .. }) = &s.delayed_retry else {
                continue;
            };
            seen += 1;
            let set = read_set(&mut conn, key, limit).await?;
            if json {
                out.push_str(&json_line(s, key, &set).to_string());
                out.push('\n');
            } else {
                write_text(&mut out, s, key, &set, limit);
            }
        }
    }
    if seen == 0 {
        anyhow::bail!(
            "no subscription{} has a delayed-retry set",
            stream.map(|s| format!(" to `{s}`")).unwrap_or_default()
        );
    }
    Ok(out)
}

/// The first page of a delayed set, and the set's size, at the server's time.
struct SetPage {
    /// The server's clock when it was read.
    now_ms: i64,
    /// Every member of the set (the page's and the others).
    total: u64,
    /// The page's parked retries, earliest due first.
    entries: Vec<ParkedEntry>,
    /// Each one's trace, when its member says whose it is.
    traces: Vec<Option<String>>,
}

/// Read the first `limit` retries of the delayed set `key`.
async fn read_set(
    conn: &mut crate::store::redis_conn::RedisHandle,
    key: &str,
    limit: usize,
) -> Result<SetPage> {
    let read = async {
        let now_ms = crate::store::inspect::server_now_ms(conn).await?;
        let total: u64 = redis::cmd("ZCARD").arg(key).query_async(conn).await?;
        let page = crate::control::operate::parked::list(conn, key, None, limit).await?;
        Ok::<_, crate::control::operate::OperateError>((now_ms, total, page))
    };
    let (now_ms, total, page) = read
        .await
        .with_context(|| format!("cannot read the delayed set `{key}`"))?;
    Ok(SetPage {
        now_ms,
        total,
        traces: page.items.iter().map(|p| p.trace_id()).collect(),
        entries: page.items.into_iter().map(|p| p.entry).collect(),
    })
}

/// One set as one JSON object: its stream, group and key, and each retry.
fn json_line(s: &ResolvedStream, key: &str, set: &SetPage) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = set
        .entries
        .iter()
        .zip(&set.traces)
        .map(|(e, trace_id)| {
            serde_json::json!({
                "trace_id": trace_id,
                "trace_link": trace_id.as_deref().and_then(crate::observe::telemetry::trace_link),
                "entry_id": e.entry_id,
                "kind": if e.is_scheduled() { "scheduled" } else { "retry" },
                "retry_count": e.retry_count,
                "due_ms": e.due_ms,
                "due": format_ms(e.due_ms),
                "due_in_ms": e.due_ms - set.now_ms,
                "origin_id": e.origin_id,
                "fields": e.fields.iter().map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), serde_json::Value::String(String::from_utf8_lossy(v).into_owned()))).collect::<serde_json::Map<String, serde_json::Value>>(),
            })
        })
        .collect();
    serde_json::json!({
        "stream": s.stream,
        "group": s.group,
        "key": key,
        "total": set.entries.len(),
        "entries": rows,
    })
}

/// One set as a table: origin id, retry count (`sched` for an entry sent for later), due time
/// and time left; then the total.
fn write_text(out: &mut String, s: &ResolvedStream, key: &str, set: &SetPage, limit: usize) {
    use std::fmt::Write as _;
    let entries = &set.entries;
    let _ = writeln!(out, "{key} (stream `{}`, group `{}`)", s.stream, s.group);
    if !entries.is_empty() {
        let _ = writeln!(
            out,
            "  {:<24} {:>5}  {:<26} {:>10}",
            "ORIGIN ID", "RETRY", "DUE (UTC)", "DUE IN"
        );
    }
    for e in entries {
        let left = e.due_ms - set.now_ms;
        let due_in = if left <= 0 {
            "due now".to_owned()
        } else {
            format!("{:.1}s", left as f64 / 1000.0)
        };
        let _ = writeln!(
            out,
            "  {:<24} {:>5}  {:<26} {:>10}",
            e.origin_id,
            if e.is_scheduled() {
                "sched".to_owned()
            } else {
                e.retry_count.to_string()
            },
            format_ms(e.due_ms),
            due_in
        );
    }
    let total = set.total;
    let more = if (entries.len() as u64) < total && entries.len() >= limit {
        format!(" (showing the first {}: raise --limit)", entries.len())
    } else if (entries.len() as u64) < total {
        format!(
            " (showing {}: the others are not retries Sluice parked; the next sweep that finds them due dead-letters them raw)",
            entries.len()
        )
    } else {
        String::new()
    };
    let _ = writeln!(out, "  total: {total}{more}");
}
