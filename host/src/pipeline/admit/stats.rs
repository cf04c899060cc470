//! A subscription's delivery counts kept in Redis, for the whole group and across restarts:
//! what the page's tiles show (a host's own `/metrics` counters start at 0 with the process).
//!
//! Every [`EVERY`] each host adds what its partitions counted since its last flush to one
//! hash (`keys::stats_key`, in the stream's slot): one HINCRBY per outcome that moved, in one
//! round trip, nothing when idle. One task does it for every subscription of the host. The hash records when it was first written (`since_ms`).
//! Counts lost with a failed flush are added at the next one (the host keeps what it last
//! wrote); a host that dies loses at most one interval's counts. Another writer's values are
//! read as numbers or 0.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::observe::metrics::{Metrics, SubLabels};
use crate::store::redis_conn::RedisHandle;

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
        .arg(crate::store::keys::stats_key(stream, group))
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

/// One subscription's counts, as this host adds them to Redis.
pub struct Counted {
    stream: String,
    group: String,
    key: String,
    /// Its partitions' labels in this host's metrics.
    parts: Vec<SubLabels>,
    conn: RedisHandle,
    /// What this host has added so far, per outcome.
    written: [u64; 5],
}

impl Counted {
    /// The counts of the subscription to `stream` with `group`, whose partitions count under
    /// `parts` in this host's metrics, written through `conn`.
    pub fn new(stream: &str, group: &str, parts: Vec<SubLabels>, conn: RedisHandle) -> Self {
        Self {
            key: crate::store::keys::stats_key(stream, group),
            stream: stream.to_owned(),
            group: group.to_owned(),
            parts,
            conn,
            written: [0; 5],
        }
    }

    /// This host's counts now.
    fn now(&self, metrics: &Metrics) -> [u64; 5] {
        let mut now = [0u64; 5];
        for labels in &self.parts {
            for (i, (_, n)) in metrics.outcomes(labels).iter().enumerate().take(5) {
                now[i] += n;
            }
        }
        now
    }

    /// Add what moved since the last flush; false if Redis did not take it (added next time).
    async fn flush(&mut self, now: [u64; 5]) -> bool {
        let mut pipe = redis::pipe();
        for (i, field) in FIELDS.iter().enumerate() {
            let delta = now[i].saturating_sub(self.written[i]);
            if delta > 0 {
                pipe.cmd("HINCRBY")
                    .arg(&self.key)
                    .arg(*field)
                    .arg(delta)
                    .ignore();
            }
        }
        let now_ms = crate::support::clock::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        pipe.cmd("HSETNX")
            .arg(&self.key)
            .arg("since_ms")
            .arg(now_ms)
            .ignore();
        let mut c = self.conn.clone();
        match pipe.query_async::<()>(&mut c).await {
            Ok(()) => {
                self.written = now;
                true
            }
            Err(err) => {
                tracing::debug!(%err, stream = %self.stream, group = %self.group, "delivery counts not written to Redis; added at the next flush");
                false
            }
        }
    }
}

/// How many subscriptions' flushes one pass has in flight at once.
const FLUSHES_AT_ONCE: usize = 64;

/// Add every subscription's counts (`subs`) to Redis every [`EVERY`] until `stop`, and once
/// more then: one task for the host, which looks at no subscription while the host counted
/// no handler result since its last pass (an idle host does nothing).
pub async fn run(mut subs: Vec<Counted>, metrics: Arc<Metrics>, stop: CancellationToken) {
    use futures::StreamExt as _;
    let mut flushed: Option<u64> = None;
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep(EVERY) => false,
            () = stop.cancelled() => true,
        };
        // Read before the pass: a result counted during it makes the next pass look again.
        let counted = metrics.results_counted();
        if flushed != Some(counted) {
            let (moved, same): (Vec<_>, Vec<_>) = std::mem::take(&mut subs)
                .into_iter()
                .map(|sub| {
                    let now = sub.now(&metrics);
                    (sub, now)
                })
                .partition(|(sub, now)| *now != sub.written);
            subs.extend(same.into_iter().map(|(sub, _)| sub));
            let mut flushes =
                futures::stream::iter(moved.into_iter().map(|(mut sub, now)| async move {
                    let ok = sub.flush(now).await;
                    (sub, ok)
                }))
                .buffer_unordered(FLUSHES_AT_ONCE);
            let mut all = true;
            while let Some((sub, ok)) = flushes.next().await {
                all &= ok;
                subs.push(sub);
            }
            if all {
                flushed = Some(counted);
            }
        }
        if stopping {
            return;
        }
    }
}
