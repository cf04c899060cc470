//! Deduplication: an entry whose key's first entry was read within the window is acknowledged
//! without calling the handler, counted and named in its history.
//!
//! The step sits where [`crate::pipeline::order`] does, between [`crate::pipeline::read`] and
//! [`crate::pipeline::dispatch`], and like it settles an entry's place as it reads it
//! (`lua/read.lua`): XREADGROUP and the group's record are one atomic step, so two hosts of
//! the group reading two entries of one key cannot both take it, and a crash anywhere leaves
//! either the entry pending with its key taken, or acknowledged as a duplicate with its
//! record; never a key taken by an entry no one will handle.
//!
//! What is recorded is a key's *first entry*, when it is read (before it is handled): its
//! duplicates are skipped whether it is in flight, parked for a retry, acked or
//! dead-lettered. The first entry itself is never its own duplicate: its retries come back
//! through the retry lane or stay pending, which this step does not read; an entry read
//! again (its group set back) finds its own id; and a dead letter requeued names its origin
//! (`sluice-origin-id`), so the key's first entry requeued runs again, while its duplicates
//! within the window are still skipped.
//!
//! Bounds: a key is held as 32 hex digits of its SHA-1 (never its bytes), for `window` after
//! its first entry was read; at most `max_keys` keys (the oldest are forgotten early,
//! counted); a key over `max_key_bytes`, or none, makes the entry run unduplicated, counted.

use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::counter::Counter;
use redis::{RedisResult, Script};
use sluice_descriptor::{Dedupe, OrderKey};

use crate::observe::events::{Event, EventKind, Events};
use crate::pipeline::order::{NewEntries, OrderedEntry};
use crate::store::keys::{self, SubscriptionKeys};

static READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/dedupe/lua/read")));

/// The Redis keys of one group's dedupe record (see [`keys::dedupe_prefix`]).
#[derive(Debug, Clone)]
pub struct DedupeKeys {
    /// Key digest -> the id of the key's first entry.
    pub first: String,
    /// Key digest -> when the key is forgotten (epoch ms).
    pub until: String,
    /// `duplicates` and `forgotten_early`, counted by every host of the group.
    pub counts: String,
}

impl DedupeKeys {
    /// The keys of `stream`'s `group`.
    pub fn new(stream: &str, group: &str) -> Self {
        let prefix = keys::dedupe_prefix(stream, group);
        Self {
            first: format!("{prefix}:first"),
            until: format!("{prefix}:until"),
            counts: format!("{prefix}:counts"),
        }
    }
}

/// One deduplicating subscription's record and counters.
pub struct Deduper {
    spec: Dedupe,
    payload_field: Arc<str>,
    stream: Arc<str>,
    lane: Option<Arc<str>>,
    group: Arc<str>,
    keys: DedupeKeys,
    histories: (String, String),
    history_cap: u32,
    events: Events,
    duplicates: Counter,
    missing: Counter,
    too_long: Counter,
    forgotten_early: Counter,
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
            metrics
                .dedupe_unkeyed
                .get_or_create(&crate::observe::metrics::ReasonLabels {
                    stream: labels.stream.clone(),
                    group: labels.group.clone(),
                    reason,
                })
                .clone()
        };
        Self {
            missing: reason("missing"),
            too_long: reason("too_long"),
            duplicates: metrics.dedupe_duplicates.get_or_create(&labels).clone(),
            forgotten_early: metrics
                .dedupe_forgotten_early
                .get_or_create(&labels)
                .clone(),
            spec,
            payload_field: payload_field.into(),
            stream: keys.stream.clone(),
            lane: keys.lane.clone(),
            group: keys.group.clone(),
            keys: DedupeKeys::new(&keys.stream, &keys.group),
            histories: (
                keys::history_key(&keys.stream, &keys.group),
                keys::history_index_key(&keys.stream, &keys.group),
            ),
            history_cap: keys.history_entries,
            events,
        }
    }

    /// What the subscription deduplicates on.
    pub fn spec(&self) -> &Dedupe {
        &self.spec
    }

    /// Read up to `count` new stream entries, acknowledging the duplicates among them in the
    /// same step (`lua/read.lua`): those that run come back. When nothing was read, the ids a
    /// blocking wait starts from.
    pub async fn read_new<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
        (consumer, count, max_entry_bytes): (&str, usize, u64),
    ) -> RedisResult<NewEntries> {
        let (field, pointer) = match &self.spec.key {
            OrderKey::Field(name) => (name.as_str(), ""),
            OrderKey::Payload(pointer) => (&*self.payload_field, pointer.as_str()),
        };
        let options = crate::store::options::ScriptOptions::default()
            .with("group", &*self.group)
            .with("consumer", consumer)
            .with("count", count as u64)
            .with("field", field)
            .with("pointer", pointer)
            .with("max_key_bytes", self.spec.max_key_bytes as u64)
            .with("max_entry_bytes", max_entry_bytes)
            .with("field_overhead", crate::entry::delivery::FIELD_OVERHEAD)
            .with("window_ms", self.spec.window.as_millis() as u64)
            .with("max_keys", self.spec.max_keys)
            .with("history_cap", u64::from(self.history_cap))
            .with(
                "history_keep_ms",
                crate::entry::history::KEEP.as_millis() as u64,
            )
            .encode();
        let reply: redis::Value = READ
            .key(&self.keys.first)
            .key(&self.keys.until)
            .key(&*self.stream)
            .key(self.lane.as_deref().unwrap_or(&self.stream))
            .key(&self.keys.counts)
            .key(&self.histories.0)
            .key(&self.histories.1)
            .arg(options)
            .invoke_async(conn)
            .await?;
        let read = Reply::parse(reply)?;
        self.missing.inc_by(read.missing);
        self.too_long.inc_by(read.too_long);
        self.forgotten_early.inc_by(read.forgotten_early);
        self.duplicates.inc_by(read.duplicates.len() as u64);
        if read.forgotten_early > 0 {
            tracing::warn!(
                stream = %self.stream,
                group = %self.group,
                forgotten = read.forgotten_early,
                max_keys = self.spec.max_keys,
                "dedupe keys forgotten before their window ended: the group remembers max_keys at most (raise it, or shorten the window)"
            );
        }
        self.report(&read.duplicates);
        Ok(NewEntries::read(read.entries, read.idle))
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

/// What the read script answered (see the header of `lua/read.lua`).
struct Reply {
    entries: Vec<OrderedEntry>,
    idle: Option<(String, String)>,
    missing: u64,
    too_long: u64,
    duplicates: Vec<(String, String)>,
    forgotten_early: u64,
}

impl Reply {
    fn parse(reply: redis::Value) -> RedisResult<Self> {
        use redis::FromRedisValue;
        let bad = || {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "dedupe read: unexpected reply",
            ))
        };
        let redis::Value::Array(parts) = reply else {
            return Err(bad());
        };
        let mut parts = parts.into_iter();
        let (Some(ids), Some(missing), Some(too_long), Some(dups), Some(forgotten)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        let ids: Vec<String> = FromRedisValue::from_redis_value(ids)?;
        let dups: Vec<String> = FromRedisValue::from_redis_value(dups)?;
        Ok(Self {
            idle: match ids.as_slice() {
                [stream, lane] => Some((stream.clone(), lane.clone())),
                _ => None,
            },
            missing: FromRedisValue::from_redis_value(missing)?,
            too_long: FromRedisValue::from_redis_value(too_long)?,
            duplicates: dups
                .chunks_exact(2)
                .map(|pair| (pair[0].clone(), pair[1].clone()))
                .collect(),
            forgotten_early: FromRedisValue::from_redis_value(forgotten)?,
            entries: crate::pipeline::order::parse_rows(parts)?,
        })
    }
}
