//! Deduplication: an entry whose key's first entry was read within the window is acknowledged
//! without calling the handler, counted and named in its history.
//!
//! The step sits where [`crate::pipeline::order`] does, between [`crate::pipeline::read`] and
//! [`crate::pipeline::dispatch`]: the stream entries of each read (new, this consumer's own
//! pending, claimed from a dead host) are judged before any is handled, in one pipeline: for
//! each entry, `SET <key's record> <origin id> NX GET PX <window>`. Redis answers each SET
//! atomically, so two hosts judging two entries of one key cannot both take it: the one whose
//! SET came first is the key's first entry, the other gets its id back and is a duplicate,
//! acknowledged with its history record in one script (`lua/duplicates.lua`). A crash before
//! that leaves the entries pending, judged again when they are read again: judging is
//! idempotent (the first entry finds its own id, a duplicate the first's).
//!
//! What is recorded is a key's *first entry*, when it is judged (before it is handled): its
//! duplicates are skipped whether it is in flight, parked for a retry, acked or
//! dead-lettered. The first entry itself is never its own duplicate: its retries come back
//! through the retry lane, which this step does not judge, or stay pending and are judged
//! again as its own; and a dead letter requeued carries its sealed origin, so the key's first
//! entry requeued runs again, while its duplicates within the window are still skipped.
//!
//! Bounds: a key's record is one Redis string named by 32 hex digits of the key's SHA-1 (never
//! its bytes), holding the first entry's origin id, expiring `window` after it was taken
//! (about 180 bytes). At most `max_keys` new keys are taken per window-long period
//! ([`DedupeKeys::taken`]); past it, new keys are not remembered (their entries run, counted
//! `over_max_keys`) while known keys still skip their duplicates: at most about twice
//! `max_keys` records live at once. A key over `max_key_bytes`, or none, makes the entry run
//! unjudged, counted.
//!
//! Two designs were measured and left (see the benchmarks journal): reading the entries inside
//! a script (Lua's copy of every entry: 0.3 x the plain throughput), and a hash with a sorted
//! set of expiry times judged by a script (5 us of Redis per entry against 2 for the SET).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::counter::Counter;
use redis::{RedisResult, Script};
use sluice_descriptor::Dedupe;

use crate::entry::delivery::{Delivery, Source};
use crate::observe::events::{Event, EventKind, Events};
use crate::pipeline::order::{KeyOf, key_in};
use crate::store::keys::{self, SubscriptionKeys};
use crate::store::redis_conn::RedisHandle;

static DUPLICATES: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/dedupe/lua/duplicates")));

/// The Redis keys of one group's dedupe record (see [`keys::dedupe_prefix`]).
#[derive(Debug, Clone)]
pub struct DedupeKeys {
    prefix: String,
    /// `duplicates`, counted by every host of the group.
    pub counts: String,
}

impl DedupeKeys {
    /// The keys of `stream`'s `group`.
    pub fn new(stream: &str, group: &str) -> Self {
        let prefix = keys::dedupe_prefix(stream, group);
        Self {
            counts: format!("{prefix}:counts"),
            prefix,
        }
    }

    /// The record of the key whose digest is `kd`: the id of its first entry.
    pub fn key(&self, kd: &str) -> String {
        format!("{}:key:{kd}", self.prefix)
    }

    /// How many new keys were taken in the window-long period `n` (epoch ms / window).
    pub fn taken(&self, n: u64) -> String {
        format!("{}:taken:{n}", self.prefix)
    }
}

/// How many duplicates every host of `stream`'s `group` skipped (within the last week of
/// them: the count goes a week after the last).
pub async fn duplicates_skipped<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
) -> RedisResult<u64> {
    let n: Option<u64> = redis::cmd("HGET")
        .arg(DedupeKeys::new(stream, group).counts)
        .arg("duplicates")
        .query_async(conn)
        .await?;
    Ok(n.unwrap_or(0))
}

/// One deduplicating subscription's record and counters.
pub struct Deduper {
    spec: Dedupe,
    payload_field: Arc<str>,
    stream: Arc<str>,
    group: Arc<str>,
    keys: DedupeKeys,
    histories: (String, String),
    history_cap: u32,
    events: Events,
    /// The window-long period in which `max_keys` new keys were taken, as far as this host
    /// knows (`u64::MAX`: none).
    full: AtomicU64,
    duplicates: Counter,
    missing: Counter,
    too_long: Counter,
    over_max_keys: Counter,
}

/// What one judgement found of each keyed entry.
enum Verdict {
    /// It took a new key, and runs.
    Took,
    /// It is its key's first entry already (judged again), and runs.
    Runs,
    /// A new key, not remembered: `max_keys` were judged this period.
    Unremembered,
    /// A duplicate of this first entry.
    Duplicate(String),
}

impl Deduper {
    /// The dedupe of the subscription with `keys`, as `spec` says.
    pub fn new(
        spec: Dedupe,
        payload_field: &str,
        keys: &SubscriptionKeys,
        events: Events,
        metrics: &crate::observe::metrics::Metrics,
    ) -> Self {
        let labels = metrics.series(&crate::observe::metrics::Metrics::labels(
            &keys.stream,
            &keys.group,
        ));
        let reason = |reason| {
            crate::observe::metrics::Metrics::reason_counter(
                &metrics.dedupe_unkeyed,
                &labels,
                reason,
            )
        };
        Self {
            missing: reason("missing"),
            too_long: reason("too_long"),
            over_max_keys: reason("over_max_keys"),
            duplicates: metrics.dedupe_duplicates.get_or_create(&labels).clone(),
            spec,
            payload_field: payload_field.into(),
            stream: keys.stream.clone(),
            group: keys.group.clone(),
            keys: DedupeKeys::new(&keys.stream, &keys.group),
            histories: (
                keys::history_key(&keys.stream, &keys.group),
                keys::history_index_key(&keys.stream, &keys.group),
            ),
            history_cap: keys.history_entries,
            events,
            full: AtomicU64::new(u64::MAX),
        }
    }

    /// The deliveries of `read` that run: stream entries that are duplicates are acknowledged
    /// and left out. On a failure every delivery comes back with the error (judging again is
    /// safe: it gives the same answers).
    pub async fn judge(
        &self,
        conn: &mut RedisHandle,
        consumer: &str,
        read: Vec<Delivery>,
    ) -> Result<Vec<Delivery>, (redis::RedisError, Vec<Delivery>)> {
        let keyed = self.keyed(&read);
        if keyed.is_empty() {
            return Ok(read);
        }
        let verdicts = match self.verdicts(conn, &read, &keyed).await {
            Ok(verdicts) => verdicts,
            Err(err) => return Err((err, read)),
        };
        let mut dups = Vec::new();
        for ((i, _), verdict) in keyed.iter().zip(verdicts) {
            match verdict {
                Verdict::Took | Verdict::Runs => {}
                Verdict::Unremembered => {
                    self.over_max_keys.inc();
                }
                Verdict::Duplicate(first) => dups.push((read[*i].entry.id.clone(), first)),
            }
        }
        if !dups.is_empty()
            && let Err(err) = self.acknowledge(conn, consumer, &dups).await
        {
            return Err((err, read));
        }
        let skipped: std::collections::HashSet<&str> =
            dups.iter().map(|(id, _)| id.as_str()).collect();
        Ok(read
            .into_iter()
            .filter(|d| d.source != Source::Stream || !skipped.contains(d.entry.id.as_str()))
            .collect())
    }

    /// The stream deliveries of `read` that have a key: their index and the key's digest
    /// (the others are counted).
    fn keyed(&self, read: &[Delivery]) -> Vec<(usize, String)> {
        let mut keyed = Vec::new();
        for (i, delivery) in read.iter().enumerate() {
            if delivery.source != Source::Stream {
                continue;
            }
            match key_in(
                delivery,
                &self.spec.key,
                &self.payload_field,
                self.spec.max_key_bytes,
            ) {
                KeyOf::Keyed(key) => keyed.push((i, digest(&key))),
                KeyOf::Missing => {
                    self.missing.inc();
                }
                KeyOf::TooLong => {
                    self.too_long.inc();
                }
            }
        }
        keyed
    }

    /// One pipeline: the period's count of new keys taken (by this host's clock: a skewed host
    /// counts in another period, which moves the bound, never a verdict), and each keyed
    /// entry's SET (a GET once the period took `max_keys` new keys: known keys still find
    /// their first entry). The keys taken are then counted, without waiting for the answer.
    async fn verdicts(
        &self,
        conn: &mut RedisHandle,
        read: &[Delivery],
        keyed: &[(usize, String)],
    ) -> RedisResult<Vec<Verdict>> {
        let window_ms = u64::try_from(self.spec.window.as_millis()).unwrap_or(u64::MAX);
        let period = crate::support::clock::now_ms() / window_ms.max(1);
        let full = self.full.load(Ordering::Relaxed) == period;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(self.keys.taken(period));
        for (i, kd) in keyed {
            if full {
                pipe.cmd("GET").arg(self.keys.key(kd));
            } else {
                pipe.cmd("SET")
                    .arg(self.keys.key(kd))
                    .arg(&read[*i].origin_id)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(window_ms);
            }
        }
        // A record's name holding another program's key of another type answers an error
        // for that entry alone: it runs unremembered (logged), the others are judged.
        let replies: Vec<RedisResult<redis::Value>> =
            pipe.ignore_errors().query_async(conn).await?;
        let mut replies = replies.into_iter();
        let taken_before: u64 = match replies.next() {
            Some(Ok(value)) => redis::from_redis_value::<Option<u64>>(value)?.unwrap_or(0),
            Some(Err(err)) => return Err(err),
            None => 0,
        };
        let mut verdicts = Vec::with_capacity(keyed.len());
        for (i, kd) in keyed {
            let holder: Option<String> = match replies.next() {
                Some(Ok(value)) => redis::from_redis_value(value)?,
                Some(Err(err)) if err.is_io_error() || err.is_timeout() => return Err(err),
                Some(Err(err)) => {
                    tracing::warn!(
                        stream = %self.stream,
                        group = %self.group,
                        record = %self.keys.key(kd),
                        %err,
                        "a dedupe record's name holds another program's key: the entry runs without dedupe"
                    );
                    verdicts.push(Verdict::Unremembered);
                    continue;
                }
                None => None,
            };
            verdicts.push(match holder {
                None if full => Verdict::Unremembered,
                None => Verdict::Took,
                Some(first) if first == read[*i].origin_id => Verdict::Runs,
                Some(first) => Verdict::Duplicate(first),
            });
        }
        let took = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Took))
            .count() as u64;
        if taken_before.saturating_add(took) >= self.spec.max_keys {
            self.full.store(period, Ordering::Relaxed);
        }
        if took > 0 {
            self.count_taken(conn, period, took, window_ms);
        }
        Ok(verdicts)
    }

    /// Add `took` new keys to `period`'s count, on a task of its own (the count bounds the
    /// record; a lost INCRBY lets a few more keys in, never a duplicate).
    fn count_taken(&self, conn: &RedisHandle, period: u64, took: u64, window_ms: u64) {
        let mut conn = conn.clone();
        let key = self.keys.taken(period);
        tokio::spawn(async move {
            let mut pipe = redis::pipe();
            pipe.cmd("INCRBY").arg(&key).arg(took).ignore();
            pipe.cmd("PEXPIRE")
                .arg(&key)
                .arg(window_ms.saturating_mul(2))
                .ignore();
            if let Err(err) = pipe.query_async::<()>(&mut conn).await {
                tracing::debug!(%err, "could not count the dedupe keys taken");
            }
        });
    }

    /// Acknowledge `dups` (id, first id) with their history records, counted.
    async fn acknowledge(
        &self,
        conn: &mut RedisHandle,
        consumer: &str,
        dups: &[(String, String)],
    ) -> RedisResult<()> {
        let options = crate::store::options::ScriptOptions::default()
            .with("group", &*self.group)
            .with("consumer", consumer)
            .with("history_cap", u64::from(self.history_cap))
            .with(
                "history_keep_ms",
                crate::entry::history::KEEP.as_millis() as u64,
            )
            .encode();
        let mut invocation = DUPLICATES.key(&*self.stream);
        invocation
            .key(&self.keys.counts)
            .key(&self.histories.0)
            .key(&self.histories.1)
            .arg(options);
        for (id, first) in dups {
            invocation.arg(id).arg(first);
        }
        let acked: u64 = invocation.invoke_async(conn).await?;
        self.duplicates.inc_by(acked);
        self.report(dups);
        Ok(())
    }

    /// Each duplicate acknowledged, to whoever listens.
    fn report(&self, duplicates: &[(String, String)]) {
        if !self.events.listened() {
            return;
        }
        for (id, of) in duplicates {
            self.events.send(Event {
                stream: self.stream.clone(),
                group: self.group.clone(),
                id: id.clone(),
                origin_id: id.clone(),
                retry_count: 0,
                delivery_count: 1,
                digest: crate::support::digest::Digest::named("dedupe"),
                started: None,
                kind: EventKind::Duplicate { of: of.clone() },
            });
        }
    }
}

/// The name of a key in the record: 32 hex digits of its SHA-1 (never the key's bytes).
pub fn digest(key: &[u8]) -> String {
    let mut hex = crate::pipeline::order::digest(key);
    hex.truncate(32);
    hex
}
