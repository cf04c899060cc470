//! `DelayedRetry::DurableZset`: retries that wait in a Redis sorted set, so they survive any
//! crash of the service and fire at their due time.
//!
//! - **Park** (`lua/park.lua`): a `retry-after(d)` adds the entry to the set with ZADD, scored
//!   by its due time (server `TIME` + `d`, in epoch milliseconds), with its retry count raised
//!   by one, refreshes the set's ttl, and acknowledges the original with XACK, all in one
//!   script. The member is a MessagePack array `[origin id, retry count, [name, value, ...]]`:
//!   unique per entry, and enough to rebuild it.
//! - **Sweep** (`lua/sweep.lua`): appends due members back onto the stream under new ids, with
//!   `sluice-retry-count` and `sluice-origin-id` set, and removes them, at most
//!   [`SWEEP_BATCH`] per pass, in one script; it also answers the earliest remaining due time.
//!   A member it cannot read (not written by the park script) is moved, raw, to the
//!   dead-letter stream rather than left to block every later sweep.
//! - **When sweeps run**: once before every read of the subscription, so the `block` interval
//!   bounds how late a due entry comes back even when another host parked it; and from a
//!   local timer set to the earliest due time this host knows of (from its own parks and from
//!   every sweep), so a retry normally comes back within milliseconds of its due time. The
//!   sweep's XADD wakes every reader blocked on the stream, here and on other hosts.
//! - **Clocks**: "now" is always the Redis server's clock, read inside the scripts; a host only
//!   turns "due in N ms by the server's clock" into a local timer, so hosts whose clocks drift
//!   cannot disagree about what is due.
//!
//! Nothing about a delay lives in the service: a restart or a crash loses no retry.

pub mod member;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use redis::aio::ConnectionManager;
use redis::{RedisResult, Script};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::delivery::Delivery;

/// The most entries one sweep pass moves.
pub const SWEEP_BATCH: usize = 128;

fn park_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("lua/park.lua")))
}

fn sweep_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("lua/sweep.lua")))
}

/// Where a park left the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// In the set, due at this server time (epoch ms).
    Due {
        /// Due time, server clock, epoch milliseconds.
        due_ms: i64,
    },
    /// The entry was no longer pending: someone else settled it; nothing was written.
    NotPending,
}

/// What one sweep pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Entries moved back onto the stream.
    pub moved: usize,
    /// How long until the earliest entry left is due (server clock), if any is left.
    pub next_due_in: Option<Duration>,
}

/// One subscription's delayed-retry set.
pub struct DelayedSet {
    stream: Arc<str>,
    group: Arc<str>,
    key: String,
    ttl: Option<Duration>,
    dead_letter: String,
    conn: ConnectionManager,
    sweep_moved: Histogram,
    sweep_duration: Histogram,
    over_ttl: Counter,
    /// The earliest local instant at which something this host knows of is due.
    next_wake: Mutex<Option<Instant>>,
    wake_changed: Notify,
}

impl DelayedSet {
    /// The set `key` for the subscription to `stream` by `group`; members the sweep cannot
    /// read go to `dead_letter`.
    pub fn new(
        stream: Arc<str>,
        group: Arc<str>,
        key: String,
        ttl: Option<Duration>,
        dead_letter: String,
        conn: ConnectionManager,
        metrics: &crate::metrics::Metrics,
    ) -> Self {
        let labels = crate::metrics::Metrics::labels(&stream, &group);
        Self {
            sweep_moved: metrics.sweep_moved.get_or_create(&labels).clone(),
            sweep_duration: metrics.sweep_duration.get_or_create(&labels).clone(),
            over_ttl: metrics.retry_over_ttl.get_or_create(&labels).clone(),
            stream,
            group,
            key,
            ttl,
            dead_letter,
            conn,
            next_wake: Mutex::new(None),
            wake_changed: Notify::new(),
        }
    }

    /// The set's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Park `delivery` for `delay` and acknowledge the original, atomically.
    pub async fn park(&self, delivery: &Delivery, delay: Duration) -> RedisResult<Parked> {
        if let Some(ttl) = self.ttl
            && delay > ttl
        {
            self.over_ttl.inc();
            tracing::warn!(
                key = %self.key,
                delay_ms = delay.as_millis() as u64,
                ttl_ms = ttl.as_millis() as u64,
                "retry delay is longer than the delayed set's ttl: if nothing else refreshes the set, it expires before this entry is due and the entry is lost"
            );
        }
        let delay_ms = delay.as_millis() as u64;
        let mut invocation = park_script().key(&*self.stream);
        invocation
            .key(&self.key)
            .arg(&*self.group)
            .arg(&delivery.entry.id)
            .arg(delay_ms)
            .arg(self.ttl.map_or(0, |t| t.as_millis().max(1) as u64))
            .arg(delivery.retry_count.saturating_add(1));
        for (name, value) in delivery.entry.user_fields() {
            invocation.arg(name).arg(value.as_slice());
        }
        let mut conn = self.conn.clone();
        let reply: Option<(i64, i64)> = invocation.invoke_async(&mut conn).await?;
        Ok(match reply {
            Some((due_ms, now_ms)) => {
                self.wake_in(Duration::from_millis((due_ms - now_ms).max(0) as u64));
                Parked::Due { due_ms }
            }
            None => Parked::NotPending,
        })
    }

    /// Move what is due (at most [`SWEEP_BATCH`] entries) back onto the stream.
    pub async fn sweep(&self) -> RedisResult<Swept> {
        let started = std::time::Instant::now();
        let mut conn = self.conn.clone();
        let (moved, next_due, now, malformed): (usize, i64, i64, usize) = sweep_script()
            .key(&*self.stream)
            .key(&self.key)
            .key(&self.dead_letter)
            .arg(SWEEP_BATCH)
            .invoke_async(&mut conn)
            .await?;
        self.sweep_duration.observe(started.elapsed().as_secs_f64());
        self.sweep_moved.observe(moved as f64);
        let next_due_in =
            (next_due >= 0).then(|| Duration::from_millis((next_due - now).max(0) as u64));
        if malformed > 0 {
            tracing::error!(
                key = %self.key,
                dead_letter = %self.dead_letter,
                malformed,
                "delayed set held members Sluice cannot read; moved them, raw, to the dead-letter stream"
            );
        }
        if moved > 0 {
            tracing::debug!(key = %self.key, moved, "swept due retries back onto the stream");
        }
        // What this pass saw replaces what this host knew: anything earlier has been moved.
        self.set_wake(next_due_in.map(|d| Instant::now() + d));
        Ok(Swept { moved, next_due_in })
    }

    fn wake_in(&self, delay: Duration) {
        let at = Instant::now() + delay;
        if let Ok(mut next) = self.next_wake.lock()
            && next.is_none_or(|current| at < current)
        {
            *next = Some(at);
            self.wake_changed.notify_one();
        }
    }

    fn set_wake(&self, at: Option<Instant>) {
        if let Ok(mut next) = self.next_wake.lock() {
            *next = at;
        }
        self.wake_changed.notify_one();
    }

    /// Sweep whenever the earliest known due time arrives, until `stop`.
    pub async fn run_waker(self: Arc<Self>, stop: CancellationToken) {
        let mut failures = crate::redis_conn::Backoff::default();
        loop {
            let next = self.next_wake.lock().ok().and_then(|n| *n);
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = sleep => {}
                () = self.wake_changed.notified() => continue,
                () = stop.cancelled() => return,
            }
            match self.sweep().await {
                Ok(_) => failures.reset(),
                Err(err) => {
                    let pause = failures.next_delay();
                    tracing::warn!(key = %self.key, %err, retry_in_ms = pause.as_millis() as u64, "timed sweep failed");
                    self.set_wake(Some(Instant::now() + pause));
                }
            }
        }
    }
}
