//! A subscription's delivery counts kept in Redis, for the whole group and across restarts:
//! what the page's tiles show (a host's own `/metrics` counters start at 0 with the process).
//!
//! Every [`EVERY`] each host adds what its partitions counted since its last flush to one
//! hash (`keys::stats_key`, in the stream's slot): one HINCRBY per outcome that moved, in one
//! round trip, nothing when idle. The hash records when it was first written (`since_ms`).
//! Counts lost with a failed flush are added at the next one (the host keeps what it last
//! wrote); a host that dies loses at most one interval's counts. Another writer's values are
//! read as numbers or 0.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, SubLabels};
use crate::redis_conn::RedisHandle;

/// How often a host adds its counts.
pub const EVERY: Duration = Duration::from_secs(1);

/// The outcome fields, in the order of [`Metrics::outcomes`].
pub const FIELDS: [&str; 5] = ["ack", "retry", "dead_letter", "trap", "limit"];

/// The group's counts as Redis holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupCounts {
    /// Per outcome, in [`FIELDS`] order.
    pub counts: [u64; 5],
    /// When the first count was written (ms since the Unix epoch), if ever.
    pub since_ms: Option<u64>,
}

/// Read the counts of the subscription to `stream` with `group`.
pub async fn read(
    conn: &mut RedisHandle,
    stream: &str,
    group: &str,
) -> redis::RedisResult<GroupCounts> {
    let values: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(crate::keys::stats_key(stream, group))
        .arg(&FIELDS)
        .arg("since_ms")
        .query_async(conn)
        .await?;
    let number = |i: usize| {
        values
            .get(i)
            .and_then(Option::as_deref)
            .and_then(|v| v.parse::<u64>().ok())
    };
    let mut counts = [0u64; 5];
    for (i, slot) in counts.iter_mut().enumerate() {
        *slot = number(i).unwrap_or(0);
    }
    Ok(GroupCounts {
        counts,
        since_ms: number(FIELDS.len()),
    })
}

/// Add the partitions' counts (`parts`, this host's metrics labels) of the subscription to
/// `stream` with `group` to Redis every [`EVERY`] until `stop`, and once more then.
pub async fn run(
    stream: String,
    group: String,
    parts: Vec<SubLabels>,
    conn: RedisHandle,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let key = crate::keys::stats_key(&stream, &group);
    let mut written = [0u64; 5];
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep(EVERY) => false,
            () = stop.cancelled() => true,
        };
        let mut now = [0u64; 5];
        for labels in &parts {
            for (i, (_, n)) in metrics.outcomes(labels).iter().enumerate().take(5) {
                now[i] += n;
            }
        }
        if now != written {
            let mut pipe = redis::pipe();
            for (i, field) in FIELDS.iter().enumerate() {
                let delta = now[i].saturating_sub(written[i]);
                if delta > 0 {
                    pipe.cmd("HINCRBY")
                        .arg(&key)
                        .arg(*field)
                        .arg(delta)
                        .ignore();
                }
            }
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            pipe.cmd("HSETNX")
                .arg(&key)
                .arg("since_ms")
                .arg(now_ms)
                .ignore();
            let mut c = conn.clone();
            match pipe.query_async::<()>(&mut c).await {
                Ok(()) => written = now,
                Err(err) => {
                    tracing::debug!(%err, stream, group, "delivery counts not written to Redis; added at the next flush")
                }
            }
        }
        if stopping {
            return;
        }
    }
}
