//! Stream retention: trimming what every consumer group of a stream has acknowledged, so a
//! stream does not grow forever, without ever trimming an entry some group still needs.
//!
//! XACK deletes nothing, and every delayed retry adds a copy of its entry when it comes back,
//! so a consumed stream only grows. Capping it with `XADD MAXLEN` trims blindly by count: it can
//! drop entries a slow group has not read, or entries still pending. Here, every `every` one host
//! per stream (the holder of the stream's lease key, renewed each run, in the stream's slot) runs
//! `lua/trim.lua`, which in one atomic step:
//! - finds what every group of the stream still needs (Sluice's groups and any other: from the
//!   smallest of each group's oldest pending id and last-delivered id on);
//! - trims below that, and only what is older than `keep_acked` (XTRIM MINID ~, bounded per run);
//! - with `max_len`, trims every acknowledged entry while the stream is longer, and reports
//!   (log line, `sluice_retention_blocked_total`) when what groups need keeps it longer;
//! - compares ids exactly, as two decimal parts (`lua/ids.lua`): producers may write explicit
//!   ids above 2^53, which a Lua number would round;
//! - trims dead letters older than `dead_letter_retention.keep`, under a lease of the dead-letter
//!   stream's own (every group of a stream has its dead letters, and its own `keep`);
//! - records what it did (`sluice-retention-last:{tag}:<stream>`), which `sluice status` shows.
//!
//! Parked retries live in the delayed set, not the stream: trimming never touches them, and a
//! retry whose original was trimmed comes back as a new entry like any other. Off by default:
//! history is kept until the operator says how long it matters.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use redis::{RedisResult, Script};
use tokio_util::sync::CancellationToken;

use crate::config::Retention;
use crate::store::keys::SubscriptionKeys;

/// `lua/trim.lua`, behind the exact id comparisons it shares with the sweep (`lua/ids.lua`).
static TRIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/retention/lua/trim")));

/// The most entries one run trims (from the stream, and from the dead-letter stream).
pub const MAX_TRIM_PER_RUN: u64 = 100_000;

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// Another host holds the stream's lease: it trims the stream (this host may still have
    /// trimmed its own dead letters, under their lease).
    NotHolder {
        /// Dead letters trimmed.
        dead_trimmed: u64,
    },
    /// This host trimmed.
    Trimmed {
        /// Entries trimmed from the stream.
        trimmed: u64,
        /// The stream's length after.
        length: u64,
        /// `max_len` could not be kept without trimming what a group needs.
        blocked: bool,
        /// Ids below this were allowed to go ('' when nothing could).
        threshold: String,
        /// Dead letters trimmed.
        dead_trimmed: u64,
    },
}

/// The retention of one stream (one partition).
pub struct Trimmer {
    keys: SubscriptionKeys,
    stream_policy: Option<Retention>,
    dead_letter_keep: Option<Duration>,
    every: Duration,
    holder: String,
    conn: crate::store::redis_conn::RedisHandle,
    trimmed: Counter,
    blocked: Counter,
}

impl Trimmer {
    /// Retention for `keys` by this host (`holder`: its consumer name).
    pub fn new(
        keys: SubscriptionKeys,
        stream_policy: Option<Retention>,
        dead_letter_keep: Option<Duration>,
        holder: &str,
        conn: crate::store::redis_conn::RedisHandle,
        metrics: &crate::observe::metrics::Metrics,
    ) -> Self {
        let labels = crate::observe::metrics::Metrics::labels(&keys.stream, &keys.group);
        let every = stream_policy.map_or(crate::config::DEFAULT_RETENTION_EVERY, |p| p.every);
        Self {
            trimmed: metrics
                .retention_trimmed
                .get_or_create(&metrics.series(&labels))
                .clone(),
            blocked: metrics
                .retention_blocked
                .get_or_create(&metrics.series(&labels))
                .clone(),
            keys,
            stream_policy,
            dead_letter_keep,
            every,
            holder: holder.to_owned(),
            conn,
        }
    }

    /// One run: trim if this host holds (or takes) the lease.
    pub async fn run_once(&self) -> RedisResult<Run> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut conn = self.conn.clone();
        // Without a stream policy only dead letters are trimmed.
        let (keep_acked, max_len, trim_stream) = match self.stream_policy {
            Some(p) => (ms(p.keep_acked), p.max_len.unwrap_or(0), 1),
            None => (0, 0, 0),
        };
        let (held, trimmed, length, blocked, threshold, dead_trimmed): (
            u8,
            u64,
            u64,
            u8,
            String,
            u64,
        ) = TRIM
            .key(&*self.keys.stream)
            .key(crate::store::keys::retention_lease_key(&self.keys.stream))
            .key(crate::store::keys::retention_record_key(&self.keys.stream))
            .key(&*self.keys.dead_letter)
            .key(crate::store::keys::retention_lease_key(
                &self.keys.dead_letter,
            ))
            .arg(&self.holder)
            .arg(ms(self.every * 3))
            .arg(keep_acked)
            .arg(max_len)
            .arg(self.dead_letter_keep.map_or(0, ms))
            .arg(MAX_TRIM_PER_RUN)
            .arg(trim_stream)
            .invoke_async(&mut conn)
            .await?;
        if held == 0 {
            return Ok(Run::NotHolder { dead_trimmed });
        }
        self.trimmed.inc_by(trimmed);
        if blocked == 1 {
            self.blocked.inc();
        }
        Ok(Run::Trimmed {
            trimmed,
            length,
            blocked: blocked == 1,
            threshold,
            dead_trimmed,
        })
    }

    /// Run every `every` until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut every = tokio::time::interval(self.every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = stop.cancelled() => return,
            }
            match self.run_once().await {
                Ok(Run::Trimmed {
                    trimmed,
                    length,
                    blocked,
                    threshold,
                    dead_trimmed,
                }) => {
                    if blocked {
                        let cap = self.stream_policy.and_then(|p| p.max_len).unwrap_or(0);
                        tracing::warn!(
                            stream = %self.keys.stream,
                            length,
                            max_len = cap,
                            needed_from = %threshold,
                            "the stream is longer than retention's max_len, but a consumer group still needs the rest (pending or unread); keeping it"
                        );
                    }
                    if trimmed > 0 || dead_trimmed > 0 {
                        tracing::info!(
                            stream = %self.keys.stream,
                            trimmed,
                            dead_trimmed,
                            below = %threshold,
                            length,
                            "retention trimmed acknowledged history"
                        );
                    }
                }
                Ok(Run::NotHolder { dead_trimmed }) => {
                    if dead_trimmed > 0 {
                        tracing::info!(
                            dead_letter = %self.keys.dead_letter,
                            dead_trimmed,
                            "retention trimmed old dead letters"
                        );
                    }
                }
                Err(err) => tracing::warn!(
                    stream = %self.keys.stream,
                    %err,
                    "retention could not run; trying again next time"
                ),
            }
        }
    }
}
