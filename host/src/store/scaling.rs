//! The scaling signal: per subscription, how many entries need a host now (unread, pending,
//! and parked retries or scheduled entries already due) and how long until the next parked one
//! is due. An autoscaler that reads only a stream's lag never wakes a deployment at zero for a
//! retry parked in a sorted set; this one does, `lead` before it is due.
//!
//! Read from Redis alone (so `sluice scaler` serves it with no host running), on Redis's clock
//! (the clock every due time is on), and shared: a [`Board`] reads each subscription at most
//! every [`FRESH`], [`AT_ONCE`] at a time, for at most [`BUDGET`] a request (the rest keep
//! their last reading), so however many callers poll, Redis answers four small commands per
//! subscription per [`FRESH`] at most.

use std::time::Duration;

use redis::RedisResult;

use crate::store::redis_conn::RedisHandle;

/// A reading younger than this is served again.
pub const FRESH: Duration = Duration::from_secs(2);
/// Subscriptions read at once.
const AT_ONCE: usize = 32;
/// The longest one request spends reading; the rest keep their last reading.
const BUDGET: Duration = Duration::from_secs(3);
/// The longest one subscription's reading may take.
const ONE: Duration = Duration::from_secs(1);
/// When a group's lag is unknown (entries deleted below it), unread entries are counted up to
/// this many with one XRANGE.
const COUNT_UP_TO: usize = 100;

/// The furthest ahead a next due time is said to be.
const TEN_YEARS_MS: i64 = 10 * 365 * 86_400_000;
/// A reading not renewed for this long (Redis stopped answering) counts as unanswered: an
/// autoscaler must not scale to zero on what Redis said before it went away.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// One subscription (one partition of a partitioned one) the signal covers.
#[derive(Clone)]
pub struct Target {
    /// The stream it reads.
    pub stream: String,
    /// Its group.
    pub group: String,
    /// Its delayed set, if it has one.
    pub delayed: Option<String>,
    /// Its retry lane, if it has one.
    pub lane: Option<String>,
    /// A connection to its Redis.
    pub conn: RedisHandle,
}

/// What one subscription's keys said at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Reading {
    /// Entries no consumer of the group has read yet (the retry lane's included).
    pub unread: u64,
    /// Entries read and not yet settled (the retry lane's included).
    pub pending: u64,
    /// Parked entries already due.
    pub due: u64,
    /// Parked entries in all.
    pub parked: u64,
    /// When the earliest parked entry is due (epoch ms, Redis's clock).
    #[serde(skip)]
    pub next_due_ms: Option<i64>,
    /// Redis's clock when read (epoch ms).
    #[serde(skip)]
    pub now_ms: i64,
}

impl Reading {
    /// Entries that need a host now.
    pub fn needs_host_now(&self) -> u64 {
        self.unread
            .saturating_add(self.pending)
            .saturating_add(self.due)
    }

    /// Seconds until the next parked entry is due (0 when one is), `None` when none is parked.
    pub fn next_due_seconds(&self) -> Option<f64> {
        self.next_due_ms.map(|due| {
            // Another writer's score may be anything (-inf, +inf): at most ten years ahead.
            let ahead = due.saturating_sub(self.now_ms).clamp(0, TEN_YEARS_MS);
            ahead as f64 / 1000.0
        })
    }
}

/// The group's unread and pending entries on `stream`: (0, 0) when the stream or the group
/// does not exist yet.
async fn group_counts(
    conn: &mut RedisHandle,
    stream: &str,
    group: &str,
) -> RedisResult<(u64, u64)> {
    let Some(info) = crate::store::inspect::group(conn, stream, group).await? else {
        return Ok((0, 0));
    };
    let pending = info.pending as u64;
    let unread = match info.lag {
        Some(lag) => lag as u64,
        // Entries were deleted below the group's position: count what follows it, up to a bound.
        None => {
            let after = format!("({}", info.last_delivered_id);
            let ids: Vec<redis::Value> = redis::cmd("XRANGE")
                .arg(stream)
                .arg(after)
                .arg("+")
                .arg("COUNT")
                .arg(COUNT_UP_TO)
                .query_async(conn)
                .await?;
            ids.len() as u64
        }
    };
    Ok((unread, pending))
}

/// Read one subscription.
pub async fn read(target: &Target) -> RedisResult<Reading> {
    let mut conn = target.conn.clone();
    let now_ms = crate::store::inspect::server_now_ms(&mut conn).await?;
    let (mut unread, mut pending) = group_counts(&mut conn, &target.stream, &target.group).await?;
    if let Some(lane) = &target.lane {
        let (u, p) = group_counts(&mut conn, lane, &target.group).await?;
        unread += u;
        pending += p;
    }
    let mut reading = Reading {
        unread,
        pending,
        now_ms,
        ..Reading::default()
    };
    if let Some(set) = &target.delayed {
        let summary = crate::store::inspect::delayed(&mut conn, set).await?;
        reading.parked = summary.parked;
        reading.next_due_ms = summary.next_due_ms;
        if summary.next_due_ms.is_some_and(|due| due <= now_ms) {
            reading.due = redis::cmd("ZCOUNT")
                .arg(set)
                .arg("-inf")
                .arg(now_ms)
                .query_async(&mut conn)
                .await?;
        }
    }
    Ok(reading)
}

/// The signal of a set of subscriptions, read on demand and shared by every caller.
pub struct Board {
    targets: Vec<Target>,
    /// Each target's last reading, when it was taken, and when it was last tried.
    readings: tokio::sync::Mutex<Vec<Slot>>,
}

/// One target's last reading (and when Redis gave it), and when it was last tried.
#[derive(Clone, Copy, Default)]
struct Slot {
    reading: Option<(Reading, tokio::time::Instant)>,
    tried: Option<tokio::time::Instant>,
}

impl Board {
    /// The board of `targets`.
    pub fn new(targets: Vec<Target>) -> Self {
        let readings = vec![Slot::default(); targets.len()];
        Self {
            targets,
            readings: tokio::sync::Mutex::new(readings),
        }
    }

    /// The subscriptions it covers.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Every subscription's reading (`None` for one Redis has not answered, or not for
    /// [`STALE_AFTER`]), each at most [`FRESH`] old where Redis answered within the budget.
    pub async fn readings(&self) -> Vec<Option<Reading>> {
        use futures::StreamExt;
        // Held while reading: a second caller waits and then finds the readings fresh.
        let mut readings = self.readings.lock().await;
        let now = tokio::time::Instant::now();
        let mut stale: Vec<usize> = (0..self.targets.len())
            .filter(|&i| {
                readings[i]
                    .tried
                    .is_none_or(|at| now.duration_since(at) >= FRESH)
            })
            .collect();
        // Those tried longest ago first: a Redis that does not answer goes to the back.
        stale.sort_by_key(|&i| readings[i].tried);
        let targets = &self.targets;
        let mut taken = futures::stream::iter(stale)
            .map(|i| async move { (i, tokio::time::timeout(ONE, read(&targets[i])).await) })
            .buffer_unordered(AT_ONCE);
        let deadline = now + BUDGET;
        while let Ok(Some((i, answer))) = tokio::time::timeout_at(deadline, taken.next()).await {
            let at = tokio::time::Instant::now();
            readings[i].tried = Some(at);
            match answer {
                Ok(Ok(reading)) => readings[i].reading = Some((reading, at)),
                Ok(Err(err)) => {
                    tracing::debug!(stream = %targets[i].stream, error = %err, "scaling signal not read");
                }
                Err(_) => {}
            }
        }
        readings
            .iter()
            .map(|slot| {
                slot.reading
                    .filter(|(_, at)| at.elapsed() < STALE_AFTER)
                    .map(|(r, _)| r)
            })
            .collect()
    }
}

/// The sums of `readings`: entries that need a host now, and the soonest next due time.
pub fn totals<'a>(readings: impl IntoIterator<Item = &'a Reading>) -> (u64, Option<f64>) {
    let mut needs = 0u64;
    let mut next: Option<f64> = None;
    for r in readings {
        needs = needs.saturating_add(r.needs_host_now());
        if let Some(due) = r.next_due_seconds() {
            next = Some(next.map_or(due, |n| n.min(due)));
        }
    }
    (needs, next)
}

/// What `GET /v1/scaling` answers: the sums, `wake` (the sum, plus one when the next parked
/// entry is due within `lead`: what an autoscaler scales on), and, with `list`, each
/// subscription (`stream` and `group` narrow it).
pub fn reply(
    targets: &[Target],
    readings: &[Option<Reading>],
    lead: Duration,
    list: bool,
    only: (Option<&str>, Option<&str>),
) -> serde_json::Value {
    let mut unknown = 0usize;
    let mut answered = Vec::new();
    let mut rows = Vec::new();
    for (target, reading) in targets.iter().zip(readings) {
        if only.0.is_some_and(|s| s != target.stream) || only.1.is_some_and(|g| g != target.group) {
            continue;
        }
        let Some(reading) = reading else {
            unknown += 1;
            if list {
                rows.push(serde_json::json!({
                    "stream": target.stream, "group": target.group,
                    "needs_host_now": null, "next_due_seconds": null,
                    "error": "Redis has not answered (or not for 10 s)",
                }));
            }
            continue;
        };
        answered.push(reading);
        if list {
            rows.push(serde_json::json!({
                "stream": target.stream, "group": target.group,
                "needs_host_now": reading.needs_host_now(),
                "next_due_seconds": reading.next_due_seconds(),
                "unread": reading.unread, "pending": reading.pending,
                "due": reading.due, "parked": reading.parked,
            }));
        }
    }
    let (needs, next) = totals(answered);
    let soon = next.is_some_and(|n| n <= lead.as_secs_f64());
    // A subscription Redis has not answered for counts as one entry waiting: an autoscaler
    // must not take a deployment to zero on a signal it could not read.
    let wake = needs
        .saturating_add(u64::from(soon))
        .saturating_add(unknown as u64);
    let mut answer = serde_json::json!({
        "needs_host_now": needs,
        "next_due_seconds": next,
        "lead_seconds": lead.as_secs_f64(),
        "wake": wake,
        "unanswered": unknown,
    });
    if list {
        answer["subscriptions"] = serde_json::Value::Array(rows);
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_due_is_zero_once_due_and_none_when_nothing_is_parked() {
        let mut r = Reading {
            now_ms: 10_000,
            next_due_ms: Some(15_000),
            ..Reading::default()
        };
        assert_eq!(r.next_due_seconds(), Some(5.0));
        r.now_ms = 16_000;
        assert_eq!(r.next_due_seconds(), Some(0.0));
        r.next_due_ms = None;
        assert_eq!(r.next_due_seconds(), None);
        // Another writer's -inf or +inf score: due now, or at most ten years ahead.
        r.next_due_ms = Some(i64::MIN);
        assert_eq!(r.next_due_seconds(), Some(0.0));
        r.next_due_ms = Some(i64::MAX);
        assert_eq!(r.next_due_seconds(), Some(TEN_YEARS_MS as f64 / 1000.0));
        r.unread = 2;
        r.pending = 3;
        r.due = 4;
        assert_eq!(r.needs_host_now(), 9);
    }
}
