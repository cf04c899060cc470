//! `sluice status`: what each subscription has in Redis right now.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::{plan_after_redis, redis_url_for};
use crate::inspect;

/// One subscription's state, as `sluice status` reports it.
#[derive(Debug, serde::Serialize)]
struct SubscriptionStatus {
    stream: String,
    /// Set on a partitioned subscription: which partition of which stream this row is.
    partition: Option<Partition>,
    group: String,
    handler_digest: crate::digest::Digest,
    group_exists: bool,
    pending: u64,
    lag: Option<u64>,
    last_delivered_id: Option<String>,
    consumers: Vec<ConsumerStatus>,
    delayed_key: Option<String>,
    /// The retry lane (`retry_lane = true`): its key, and the group's pending and unread
    /// entries there.
    lane: Option<LaneStatus>,
    parked: Option<u64>,
    next_due_ms: Option<i64>,
    next_due_in_ms: Option<i64>,
    dead_letter: String,
    dead_letter_length: u64,
    /// The stream's length, memory and oldest entry.
    size: inspect::StreamSize,
    /// The age of the oldest entry, by the server's clock.
    oldest_age_ms: Option<i64>,
    /// What retention's last run did (`None`: it never ran).
    retention: Option<std::collections::HashMap<String, String>>,
    /// Who paused the subscription, when and why (`None`: it reads).
    paused: Option<crate::flow::Paused>,
    /// The circuit breaker, when open or half-open: one line.
    breaker: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct LaneStatus {
    key: String,
    pending: u64,
    lag: Option<u64>,
}

#[derive(Debug, serde::Serialize)]
struct Partition {
    of: String,
    index: u32,
    count: u32,
}

#[derive(Debug, serde::Serialize)]
struct ConsumerStatus {
    name: String,
    pending: u64,
    idle_ms: u64,
    /// Holds pending entries and has been idle long enough that a live host takes them over.
    gone: bool,
}

/// `sluice status`: for each subscription, the group's consumers and pending counts, parked
/// entries and the next due time, the dead-letter stream's length and the handler's digest.
pub async fn status(paths: &[PathBuf], redis: Option<&str>, json: bool) -> Result<String> {
    let plan = plan_after_redis(paths, redis).await?;
    let mut rows = Vec::new();
    for sub in &plan.subscriptions {
        let url = redis_url_for(sub.redis.as_deref())?;
        let mut conn = crate::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
        for (index, part) in sub.stream.partitioned().iter().enumerate() {
            let partition = (sub.stream.partitions > 1).then(|| Partition {
                of: sub.stream.stream.clone(),
                index: index as u32,
                count: sub.stream.partitions,
            });
            rows.push(partition_status(&mut conn, sub, part, partition).await?);
        }
    }
    render(&rows, json)
}

/// One partition's row (the subscription's, when it has one partition).
async fn partition_status(
    conn: &mut crate::redis_conn::RedisHandle,
    sub: &crate::plan::SubscriptionPlan,
    s: &sluice_descriptor::ResolvedStream,
    partition: Option<Partition>,
) -> Result<SubscriptionStatus> {
    let delayed_key = s.delayed_retry.as_ref().map(|d| d.key().to_owned());
    let lane_key = delayed_key
        .as_deref()
        .filter(|_| sub.retry_lane)
        .map(crate::keys::lane_key);
    let snapshot = inspect::snapshot(
        conn,
        &s.stream,
        &s.group,
        &s.dead_letter,
        delayed_key.as_deref(),
        lane_key.as_deref(),
    )
    .await
    .with_context(|| format!("cannot read the state of stream `{}`", s.stream))?;
    let group = snapshot.group;
    let consumers = if group.is_some() {
        inspect::consumers(conn, &s.stream, &s.group)
            .await
            .with_context(|| format!("XINFO CONSUMERS {} {}", s.stream, s.group))?
    } else {
        Vec::new()
    };
    // Gone: idle past the time after which a live host takes its entries over.
    let gone_after = sub.consumer_gone_after.or(s.claim_min_idle);
    let now_ms = inspect::server_now_ms(conn).await?;
    let size = inspect::stream_size(conn, &s.stream).await?;
    let retention = inspect::retention_record(conn, &s.stream).await?;
    let flow = crate::flow::read(conn, &sub.stream.stream, &sub.stream.group)
        .await
        .with_context(|| format!("cannot read whether stream `{}` is paused", s.stream))?;
    let paused = flow.paused;
    let breaker = flow.breaker.map(|b| b.describe());
    let next_due_ms = snapshot.delayed.and_then(|d| d.next_due_ms);
    let lane = lane_key.map(|key| LaneStatus {
        pending: snapshot.lane.as_ref().map_or(0, |g| g.pending as u64),
        lag: snapshot.lane.as_ref().and_then(|g| g.lag).map(|l| l as u64),
        key,
    });
    Ok(SubscriptionStatus {
        stream: s.stream.clone(),
        partition,
        group: s.group.clone(),
        handler_digest: sub.component.digest().clone(),
        group_exists: group.is_some(),
        pending: group.as_ref().map_or(0, |g| g.pending as u64),
        lag: group.as_ref().and_then(|g| g.lag).map(|l| l as u64),
        last_delivered_id: group.as_ref().map(|g| g.last_delivered_id.clone()),
        consumers: consumers
            .into_iter()
            .map(|c| ConsumerStatus {
                gone: c.pending > 0 && gone_after.is_some_and(|g| c.idle as u128 >= g.as_millis()),
                name: c.name,
                pending: c.pending as u64,
                idle_ms: c.idle as u64,
            })
            .collect(),
        delayed_key,
        lane,
        parked: snapshot.delayed.map(|d| d.parked),
        next_due_ms,
        next_due_in_ms: next_due_ms.map(|due| due - now_ms),
        dead_letter: s.dead_letter.clone(),
        dead_letter_length: snapshot.dead_letters,
        oldest_age_ms: size.oldest_ms.map(|oldest| now_ms - oldest),
        size,
        retention,
        paused,
        breaker,
    })
}

/// The rows as `sluice status` prints them: one JSON object per line, or text.
fn render(rows: &[SubscriptionStatus], json: bool) -> Result<String> {
    if json {
        let mut out = String::new();
        for row in rows {
            out.push_str(&serde_json::to_string(row)?);
            out.push('\n');
        }
        return Ok(out);
    }
    use std::fmt::Write as _;
    let mut out = String::new();
    for r in rows {
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
                    .map(super::format_ms)
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
    Ok(out)
}
