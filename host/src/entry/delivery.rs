//! A delivery: one stream entry handed to a handler, with what the host knows about its
//! history (how often it was parked and re-added, how often Redis delivered it, which entry the
//! producer first added).
//!
//! Fields are bytes end to end, names included: Redis allows any bytes, so the host never
//! assumes text. Whether a handler can take a field name that is not UTF-8 is the handler's
//! business (the WASM runtime dead-letters such an entry with a reason).
//!
//! A retry copy carries the host's bookkeeping (retry count, origin id, due time), trusted only
//! when its seal (`sluice-mark`, keyed with the stream's secret, see [`crate::store::keys::Secret`])
//! verifies over the copy's own fields, stream and group. Three forms are read:
//!
//! | form | where | fields | seal covers |
//! |---|---|---|---|
//! | lane copy | the group's retry lane | `sluice-parked` (the member: fields and bookkeeping), `sluice-due-ms`, `sluice-mark` | stream, group, member, due time |
//! | tail copy | the stream (`retry_lane = false`) | the entry's fields (or `sluice-packed-fields`), then retry count, origin id, due time, group, mark | stream, group, origin, count, due time, digest of the fields |
//! | earlier release's copy | either | the entry's fields, then retry count, origin id, due time, mark | stream, origin, count, due time; trusted only on entries written before this release took over (plus a grace) |
//!
//! A tail copy another group parked is that group's retry: this group acknowledges it without
//! handling it ([`Trust::OtherGroup`]). An entry in the lane that is none of these was not
//! written by the host: it is dead-lettered without being handled ([`Delivery::stray`]).
//! Anything else named `sluice-*` is the producer's data:
//! it is handed to the handler and kept when the entry is parked or dead-lettered, and it never
//! changes how the host counts attempts.

use crate::store::keys::{self, Secret};

/// One stream entry as read from Redis: its id and all of its fields, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry id.
    pub id: String,
    /// Every field, including the host's `sluice-*` bookkeeping fields, as bytes.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Entry {
    /// The raw value of the first field called `name`, if present.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }
}

/// Which of a subscription's streams an entry was read from: where it is pending, so where it
/// is acknowledged, parked from or dead-lettered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Source {
    /// The subscription's stream.
    #[default]
    Stream,
    /// The retry lane next to the delayed set (see [`crate::store::keys::SubscriptionKeys::lane`]).
    Lane,
}

impl Source {
    /// The key of this source: `lane` for the lane (the stream if there is none), else
    /// `stream`.
    pub fn key<'a>(self, stream: &'a str, lane: Option<&'a str>) -> &'a str {
        match (self, lane) {
            (Source::Lane, Some(lane)) => lane,
            _ => stream,
        }
    }
}

/// What the sweep recorded on an entry it re-added, verified by its seal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bookkeeping {
    /// How many times the message was parked and re-added.
    pub retry_count: u32,
    /// The id of the entry the producer added.
    pub origin_id: String,
    /// When the retry was due, epoch ms by the Redis server's clock.
    pub due_ms: i64,
}

/// What the host makes of an entry's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// A retry copy of this subscription, verified: its bookkeeping, and the producer's fields
    /// (unpacked, for a lane copy or a packed tail copy).
    Own(Bookkeeping, Fields),
    /// A tail copy of a retry another group of the stream parked: not this group's to handle.
    OtherGroup(String),
    /// No bookkeeping the host wrote: the entry is the producer's, `sluice-*` fields included.
    Plain,
}

/// Where a verified copy's producer fields are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fields {
    /// The entry's first this many fields (the rest is bookkeeping).
    Leading(usize),
    /// Unpacked from the copy: a lane copy's member, or packed fields.
    Unpacked(Vec<(Vec<u8>, Vec<u8>)>),
}

/// An entry's fields, names and values as bytes.
type FieldList = [(Vec<u8>, Vec<u8>)];

/// Whether `fields` end with exactly `names`; the fields before them and the tail if so.
fn before_tail<'a>(
    fields: &'a FieldList,
    names: &[&str],
) -> Option<(&'a FieldList, &'a FieldList)> {
    let split = fields.len().checked_sub(names.len())?;
    let (own, tail) = fields.split_at(split);
    tail.iter()
        .zip(names)
        .all(|((n, _), want)| n == want.as_bytes())
        .then_some((own, tail))
}

/// A lane copy: the member, its due time and the seal over both, this stream and this group.
fn lane_copy(stream: &str, group: &str, entry: &Entry, secret: &Secret) -> Option<Trust> {
    let (own, tail) = before_tail(&entry.fields, &[keys::PARKED, keys::DUE_MS, keys::MARK])?;
    if !own.is_empty() {
        return None;
    }
    let (member, due, mark) = (&tail[0].1, &tail[1].1, &tail[2].1);
    let parts: [&[u8]; 4] = [stream.as_bytes(), group.as_bytes(), member, due];
    if !secret.verify(keys::Seal::Lane, &parts, mark) {
        return None;
    }
    let due_ms = std::str::from_utf8(due).ok()?.parse::<f64>().ok()? as i64;
    let parked = crate::entry::member::decode(member, due_ms).ok()?;
    if parked
        .owner
        .as_ref()
        .is_some_and(|(s, g)| s != stream || g != group)
    {
        return None;
    }
    // A requeued dead letter whose origin was not trusted has none: the copy is its own origin.
    let origin_id = if parked.origin_id.is_empty() {
        entry.id.clone()
    } else {
        parked.origin_id
    };
    let bookkeeping = Bookkeeping {
        retry_count: parked.retry_count,
        origin_id,
        due_ms,
    };
    Some(Trust::Own(bookkeeping, Fields::Unpacked(parked.fields)))
}

/// A tail copy: the fields, then retry count, origin id, due time, group and the seal.
fn tail_copy(stream: &str, group: &str, entry: &Entry, secret: &Secret) -> Option<Trust> {
    let names = [
        keys::RETRY_COUNT,
        keys::ORIGIN_ID,
        keys::DUE_MS,
        keys::ORIGIN_GROUP,
        keys::MARK,
    ];
    let (own, tail) = before_tail(&entry.fields, &names)?;
    let value = |i: usize| tail[i].1.as_slice();
    let digest = keys::fields_digest(own);
    let (retry, origin, due, parked_by) = (value(0), value(1), value(2), value(3));
    let parts: [&[u8]; 6] = [
        stream.as_bytes(),
        parked_by,
        origin,
        retry,
        due,
        digest.as_bytes(),
    ];
    // Which seal verifies says whether the fields are packed (too many for one XADD), so a
    // producer's own field of that name is never unpacked.
    let packed = match own {
        [(name, packed)] if name == keys::PACKED_FIELDS.as_bytes() => Some(packed),
        _ => None,
    };
    let unpack = if secret.verify(keys::Seal::Tail, &parts, value(4)) {
        false
    } else if packed.is_some() && secret.verify(keys::Seal::TailPacked, &parts, value(4)) {
        true
    } else {
        return None;
    };
    let parked_by = std::str::from_utf8(parked_by).ok()?;
    if parked_by != group {
        return Some(Trust::OtherGroup(parked_by.to_owned()));
    }
    // A requeued dead letter whose origin was not trusted has none: the copy is its own origin.
    let origin_id = match std::str::from_utf8(origin).ok()? {
        "" => entry.id.clone(),
        origin => origin.to_owned(),
    };
    let bookkeeping = Bookkeeping {
        retry_count: std::str::from_utf8(retry).ok()?.parse().ok()?,
        origin_id,
        due_ms: std::str::from_utf8(due).ok()?.parse::<f64>().ok()? as i64,
    };
    let fields = match packed.filter(|_| unpack) {
        Some(packed) => Fields::Unpacked(unpack_fields(packed)?),
        None => Fields::Leading(own.len()),
    };
    Some(Trust::Own(bookkeeping, fields))
}

/// A copy of the earlier release: the fields, then retry count, origin id, due time and its
/// mark, on an entry of `key` that was there before this release first used it.
fn legacy_copy(stream: &str, key: &str, entry: &Entry, secret: &Secret) -> Option<Trust> {
    let names = [keys::RETRY_COUNT, keys::ORIGIN_ID, keys::DUE_MS, keys::MARK];
    let (own, tail) = before_tail(&entry.fields, &names)?;
    let text = |i: usize| std::str::from_utf8(&tail[i].1).ok();
    let (retry, origin, due, mark) = (text(0)?, text(1)?, text(2)?, text(3)?);
    if !secret.verify_legacy(key, &entry.id, [stream, origin, retry, due], mark) {
        return None;
    }
    let bookkeeping = Bookkeeping {
        retry_count: retry.parse().ok()?,
        origin_id: origin.to_owned(),
        due_ms: due.parse::<f64>().ok()? as i64,
    };
    Some(Trust::Own(bookkeeping, Fields::Leading(own.len())))
}

/// What the bookkeeping of `entry`, read from `source` (whose key is `key`), is worth to `group`
/// of `stream`.
pub fn trust(
    stream: &str,
    group: &str,
    (source, key): (Source, &str),
    entry: &Entry,
    secret: Option<&Secret>,
) -> Trust {
    let Some(secret) = secret else {
        return Trust::Plain;
    };
    let current = match source {
        Source::Lane => lane_copy(stream, group, entry, secret),
        Source::Stream => tail_copy(stream, group, entry, secret),
    };
    current
        .or_else(|| legacy_copy(stream, key, entry, secret))
        .unwrap_or(Trust::Plain)
}

/// Fields packed into one MessagePack array `[name, value, ...]` (of str or bin items, as Lua's
/// cmsgpack and the host's packer write them).
pub fn unpack_fields(packed: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let rmpv::Value::Array(items) = rmpv::decode::read_value(&mut &packed[..]).ok()? else {
        return None;
    };
    let bytes = |v: &rmpv::Value| match v {
        rmpv::Value::Binary(b) => Some(b.clone()),
        rmpv::Value::String(s) => Some(s.as_bytes().to_vec()),
        _ => None,
    };
    items
        .chunks(2)
        .map(|pair| match pair {
            [name, value] => Some((bytes(name)?, bytes(value)?)),
            _ => None,
        })
        .collect()
}

/// An entry on its way to a handler. Not comparable: it carries its attempt's span.
#[derive(Debug)]
pub struct Delivery {
    /// The stream it was read from (shared with the subscription: no copy per delivery).
    pub stream: std::sync::Arc<str>,
    /// The group that read it.
    pub group: std::sync::Arc<str>,
    /// Whether it was read from the stream or from the retry lane (`stream` names the
    /// subscription's stream either way).
    pub source: Source,
    /// The entry.
    pub entry: Entry,
    /// Parked-and-re-added count (from verified bookkeeping; 0 otherwise).
    pub retry_count: u32,
    /// Redis's delivery counter for this entry id.
    pub delivery_count: u64,
    /// The id of the entry the producer added: this entry's own id unless the sweep re-added
    /// it from an earlier one.
    pub origin_id: String,
    /// When a re-added retry was due (Redis server clock, epoch ms).
    pub due_ms: Option<i64>,
    /// Set on a tail copy another group of the stream parked: that group's retry, which this
    /// group acknowledges without handling.
    pub other_group: Option<String>,
    /// Set on an entry of the retry lane that is no copy the host wrote (no valid seal): the
    /// lane is the host's own, so it is dead-lettered without being handled.
    pub stray: bool,
    /// How many leading fields are the producer's (the rest is verified bookkeeping).
    user_len: usize,
    /// When dispatch took its handler version (set by the dispatcher).
    pub started: Option<std::time::SystemTime>,
    /// The attempt's trace, while traces are exported (set by the dispatcher).
    pub trace: Option<crate::observe::telemetry::AttemptTrace>,
    /// The journal of its outbound calls, with `effects = "journal"` (set by the dispatcher).
    pub journal: Option<std::sync::Arc<crate::store::effects::DeliveryJournal>>,
    /// The key its calls' idempotency keys are made with, derived from the stream's secret so
    /// that no guest can work out another entry's (set by the dispatcher when calls carry
    /// keys; see [`crate::runtime::effects::call_key`]).
    pub call_key: Option<[u8; 32]>,
    /// What of its fields the read did not keep (see [`crate::store::redis_conn::lean::Cut`]): such
    /// an entry is dead-lettered from Redis, never handled.
    pub cut: crate::store::redis_conn::lean::Cut,
}

impl Delivery {
    /// Wrap an entry read from `source` (the stream or its lane, whose key is `key`) by `group`
    /// of `stream`; bookkeeping counts only if its seal verifies with the stream's `secret`.
    pub fn new(
        stream: impl Into<std::sync::Arc<str>>,
        group: impl Into<std::sync::Arc<str>>,
        (source, key): (Source, &str),
        mut entry: Entry,
        delivery_count: u64,
        secret: Option<&Secret>,
    ) -> Self {
        let (stream, group) = (stream.into(), group.into());
        let trust = trust(&stream, &group, (source, key), &entry, secret);
        let (bookkeeping, other_group) = match trust {
            Trust::Own(bookkeeping, Fields::Leading(n)) => (Some((bookkeeping, n)), None),
            Trust::Own(bookkeeping, Fields::Unpacked(fields)) => {
                let n = fields.len();
                entry.fields = fields;
                (Some((bookkeeping, n)), None)
            }
            Trust::OtherGroup(group) => (None, Some(group)),
            Trust::Plain => (None, None),
        };
        let stray = bookkeeping.is_none() && other_group.is_none() && source == Source::Lane;
        // Only worth a scan of every field when someone reads debug lines.
        if bookkeeping.is_none()
            && tracing::enabled!(tracing::Level::DEBUG)
            && entry
                .fields
                .iter()
                .any(|(n, _)| n.starts_with(keys::FIELD_PREFIX.as_bytes()))
        {
            tracing::debug!(
                stream = &*stream,
                id = %entry.id,
                "entry carries sluice-* fields the host did not write; treated as the producer's data"
            );
        }
        let user_len = bookkeeping.as_ref().map_or(entry.fields.len(), |(_, n)| *n);
        let bookkeeping = bookkeeping.map(|(b, _)| b);
        Self {
            stream,
            group,
            source,
            retry_count: bookkeeping.as_ref().map_or(0, |b| b.retry_count),
            origin_id: bookkeeping
                .as_ref()
                .map_or_else(|| entry.id.clone(), |b| b.origin_id.clone()),
            due_ms: bookkeeping.as_ref().map(|b| b.due_ms),
            other_group,
            stray,
            user_len,
            entry,
            delivery_count: delivery_count.max(1),
            trace: None,
            journal: None,
            call_key: None,
            cut: Default::default(),
            started: None,
        }
    }

    /// The fields the producer wrote (everything but verified bookkeeping), in stream order.
    pub fn user_fields(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.entry.fields[..self.user_len]
    }

    /// The effects epoch a requeue with new idempotency keys set (`sluice-effects-epoch`), if
    /// any: it names the entry's outbound calls and their journal.
    pub fn effects_epoch(&self) -> Option<&[u8]> {
        self.user_fields()
            .iter()
            .find(|(name, _)| name == crate::store::keys::EFFECTS_EPOCH.as_bytes())
            .map(|(_, value)| value.as_slice())
    }

    /// The entry's size as `max_entry_bytes` counts it: its fields' names and values, and
    /// [`FIELD_OVERHEAD`] for each field (a million one-byte fields are 8 MB of bytes but cost
    /// the host and the guest about 60 times that).
    pub fn entry_bytes(&self) -> u64 {
        let read: u64 = self
            .entry
            .fields
            .iter()
            .map(|(name, value)| (name.len() + value.len()) as u64 + FIELD_OVERHEAD)
            .sum();
        read + self.cut.bytes + self.cut.fields as u64 * FIELD_OVERHEAD
    }

    /// Attempts of this message that came before this one: each park-and-re-add and each
    /// earlier delivery of this entry id. This is what `max_retries` is compared with.
    pub fn previous_attempts(&self) -> u64 {
        u64::from(self.retry_count) + self.delivery_count.saturating_sub(1)
    }
}

pub use crate::store::redis_conn::lean::FIELD_OVERHEAD;

pub use crate::store::keys::cmp_ids;
