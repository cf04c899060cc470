//! `sluice keys`: the ordered keys that wait, behind what (the turn's holder, its due time when
//! it is a parked retry, a dead letter that holds its key), and `--release KEY` to give every
//! turn of a key back (see [`crate::pipeline::order`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use sluice_descriptor::{DelayedRetry, OrderedBy, ResolvedStream};

use super::{format_ms, plan_after_redis, redis_url_for};
use crate::pipeline::order::{self, OrderKeys, inspect};

/// `sluice keys`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Only the subscription to this stream (or one partition's stream).
    #[arg(long)]
    stream: Option<String>,
    /// Give every turn of this key back and let its waiting entries go (what held a turn is
    /// not touched: a parked retry still comes back, then as an entry without a turn). A key
    /// that is no text is named by its digest, as the listing shows it: `sha1:<digest>`.
    #[arg(long)]
    release: Option<String>,
    /// One JSON object per subscription, one per line.
    #[arg(long)]
    json: bool,
    /// At most this many keys per subscription, longest waiting first.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice keys`: the listing (or what a release did) goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    print!("{}", keys(&args).await?);
    Ok(())
}

/// The ordered subscriptions' waiting keys, or the release of one key.
async fn keys(args: &Args) -> Result<String> {
    let plan = plan_after_redis(&args.paths, args.redis.as_deref()).await?;
    let mut out = String::new();
    let mut seen = 0;
    for sub in &plan.subscriptions {
        let parts: Vec<ResolvedStream> = sub
            .stream
            .partitioned()
            .into_iter()
            .filter(|p| {
                args.stream
                    .as_deref()
                    .is_none_or(|name| name == p.stream || name == sub.stream.stream)
                    && p.ordered_by.is_some()
            })
            .collect();
        if parts.is_empty() {
            continue;
        }
        let url = redis_url_for(sub.redis.as_deref())?;
        let mut conn =
            crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
        for s in &parts {
            seen += 1;
            let (Some(spec), Some(DelayedRetry::DurableZset { key: set, ttl })) =
                (&s.ordered_by, &s.delayed_retry)
            else {
                continue;
            };
            let keys = OrderKeys::new(&s.stream, &s.group);
            match &args.release {
                Some(key) => {
                    let ttl_ms = ttl.map_or(0, |t| t.as_millis().max(1) as u64);
                    release(&mut out, &mut conn, s, (spec, &keys, set, ttl_ms), key).await?;
                }
                None => list(&mut out, &mut conn, s, (&keys, set), args).await?,
            }
        }
    }
    if seen == 0 {
        anyhow::bail!(
            "no subscription{} is ordered (ordered_by)",
            args.stream
                .as_deref()
                .map(|s| format!(" to `{s}`"))
                .unwrap_or_default()
        );
    }
    Ok(out)
}

/// Release `key` on the subscription `s`.
async fn release(
    out: &mut String,
    conn: &mut crate::store::redis_conn::RedisHandle,
    s: &ResolvedStream,
    (spec, keys, set, ttl_ms): (&OrderedBy, &OrderKeys, &str, u64),
    key: &str,
) -> Result<()> {
    let digest = match key.strip_prefix("sha1:") {
        Some(digest) => digest.to_owned(),
        None => order::digest(key.as_bytes()),
    };
    let (turns, went) =
        order::release(conn, keys, set, &digest, spec.max_in_flight_per_key, ttl_ms)
            .await
            .with_context(|| format!("cannot release key `{key}` of stream `{}`", s.stream))?;
    let _ = writeln!(
        out,
        "stream `{}` group `{}` key `{key}`: {turns} turn(s) given back, {went} waiting entr{} let in (running hosts handle {} next)",
        s.stream,
        s.group,
        if went == 1 { "y" } else { "ies" },
        if went == 1 { "it" } else { "them" },
    );
    Ok(())
}

/// List the keys that wait on the subscription `s`, with their holders' due times when they
/// are parked retries.
async fn list(
    out: &mut String,
    conn: &mut crate::store::redis_conn::RedisHandle,
    s: &ResolvedStream,
    (keys, set): (&OrderKeys, &str),
    args: &Args,
) -> Result<()> {
    let overview = inspect::overview(conn, keys, args.limit)
        .await
        .with_context(|| format!("cannot read the ordered keys of stream `{}`", s.stream))?;
    // A page of the set, to say when a holder that is a parked retry is due.
    let parked = crate::control::operate::parked::list(conn, set, None, 1000)
        .await
        .with_context(|| format!("cannot read the delayed set `{set}`"))?;
    let due = |origin: &str| {
        parked
            .items
            .iter()
            .find(|p| p.entry.origin_id == origin)
            .map(|p| p.entry.due_ms)
    };
    if args.json {
        let _ = writeln!(out, "{}", json_line(s, &overview, &due));
        return Ok(());
    }
    let _ = writeln!(
        out,
        "stream `{}` group `{}`: {} key(s) with entries waiting, {} turn(s) held",
        s.stream, s.group, overview.waiting_keys, overview.turns_held
    );
    if !overview.keys.is_empty() {
        let _ = writeln!(
            out,
            "  {:<24} {:>7}  {:<26} BEHIND",
            "KEY", "WAITING", "SINCE (UTC)"
        );
    }
    for k in &overview.keys {
        let behind: Vec<String> = k
            .holders
            .iter()
            .map(|h| match (h.dead_letter, due(&h.origin_id)) {
                (true, _) => format!("{} (dead letter, held)", h.origin_id),
                (false, Some(due_ms)) => {
                    format!("{} (parked, due {})", h.origin_id, format_ms(due_ms))
                }
                (false, None) => format!("{} (in flight or coming back)", h.origin_id),
            })
            .collect();
        let behind = match (behind.is_empty(), k.holders_complete) {
            (true, true) => "nothing (let in next)".to_owned(),
            (true, false) => "not found in the first turns scanned".to_owned(),
            (false, _) => behind.join(", "),
        };
        let _ = writeln!(
            out,
            "  {:<24} {:>7}  {:<26} {behind}",
            if k.key.contains('\u{FFFD}') {
                format!("sha1:{}", k.digest)
            } else {
                crate::control::operate::printable(k.key.as_bytes())
            },
            k.waiting,
            k.waiting_since_ms.map(format_ms).unwrap_or_default(),
        );
    }
    Ok(())
}

/// One subscription's listing as one JSON object.
fn json_line(
    s: &ResolvedStream,
    overview: &inspect::Overview,
    due: &dyn Fn(&str) -> Option<i64>,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = overview
        .keys
        .iter()
        .map(|k| {
            let holders: Vec<serde_json::Value> = k
                .holders
                .iter()
                .map(|h| {
                    serde_json::json!({
                        "origin_id": h.origin_id,
                        "since_ms": h.since_ms,
                        "dead_letter": h.dead_letter,
                        "due_ms": due(&h.origin_id),
                    })
                })
                .collect();
            serde_json::json!({
                "key": k.key,
                "digest": k.digest,
                "waiting": k.waiting,
                "waiting_since_ms": k.waiting_since_ms,
                "holders": holders,
                "holders_complete": k.holders_complete,
            })
        })
        .collect();
    serde_json::json!({
        "stream": s.stream,
        "group": s.group,
        "waiting_keys": overview.waiting_keys,
        "turns_held": overview.turns_held,
        "keys": rows,
    })
}
