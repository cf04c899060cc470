//! A delivery: one stream entry handed to a handler, with what the host knows about its
//! history (how often it was parked and re-added, how often Redis delivered it, which entry the
//! producer first added).
//!
//! Fields are bytes end to end, names included: Redis allows any bytes, so the host never
//! assumes text. Whether a handler can take a field name that is not UTF-8 is the handler's
//! business (the WASM runtime dead-letters such an entry with a reason).
//!
//! The host's own bookkeeping (`sluice-retry-count`, `sluice-origin-id`, `sluice-due-ms`) is
//! trusted only when the sweep wrote it: the sweep appends those fields last, followed by a
//! `sluice-mark` keyed with the stream's secret (see [`crate::keys::Secret`]). Anything else
//! named `sluice-*` is the producer's data: it is handed to the handler and kept when the entry
//! is parked or dead-lettered, and it never changes how the host counts attempts.

use crate::keys::{self, Secret};

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
    /// The retry lane next to the delayed set (see [`crate::keys::SubscriptionKeys::lane`]).
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

/// What the sweep recorded on an entry it re-added, verified by its mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bookkeeping {
    /// How many times the message was parked and re-added.
    pub retry_count: u32,
    /// The id of the entry the producer added.
    pub origin_id: String,
    /// When the retry was due, epoch ms by the Redis server's clock.
    pub due_ms: i64,
}

/// The bookkeeping the sweep appended to `entry` (the last four fields), if its mark verifies
/// with `secret`; also how many fields precede it.
fn trusted_tail(stream: &str, entry: &Entry, secret: Option<&Secret>) -> Option<Bookkeeping> {
    let secret = secret?;
    let n = entry.fields.len();
    let tail = entry.fields.get(n.checked_sub(4)?..)?;
    let names = [keys::RETRY_COUNT, keys::ORIGIN_ID, keys::DUE_MS, keys::MARK];
    if tail
        .iter()
        .zip(names)
        .any(|((n, _), want)| n != want.as_bytes())
    {
        return None;
    }
    let text = |i: usize| std::str::from_utf8(&tail[i].1).ok();
    let (retry, origin, due, mark) = (text(0)?, text(1)?, text(2)?, text(3)?);
    if !secret.verify(stream, origin, retry, due, mark) {
        return None;
    }
    Some(Bookkeeping {
        retry_count: retry.parse().ok()?,
        origin_id: origin.to_owned(),
        due_ms: due.parse::<f64>().ok()? as i64,
    })
}

/// An entry on its way to a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The stream it was read from.
    pub stream: String,
    /// The group that read it.
    pub group: String,
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
    /// How many leading fields are the producer's (the rest is verified bookkeeping).
    user_len: usize,
    /// When dispatch took its handler version (set by the dispatcher).
    pub started: Option<std::time::SystemTime>,
}

impl Delivery {
    /// Wrap an entry read from `stream` by `group`; bookkeeping fields count only if their
    /// mark verifies with the stream's `secret`.
    pub fn new(
        stream: &str,
        group: &str,
        entry: Entry,
        delivery_count: u64,
        secret: Option<&Secret>,
    ) -> Self {
        let trusted = trusted_tail(stream, &entry, secret);
        let user_len = entry.fields.len() - if trusted.is_some() { 4 } else { 0 };
        // Only worth a scan of every field when someone reads debug lines.
        if trusted.is_none()
            && tracing::enabled!(tracing::Level::DEBUG)
            && entry
                .fields
                .iter()
                .any(|(n, _)| n.starts_with(keys::FIELD_PREFIX.as_bytes()))
        {
            tracing::debug!(
                stream,
                id = %entry.id,
                "entry carries sluice-* fields the host did not write; treated as the producer's data"
            );
        }
        Self {
            stream: stream.to_owned(),
            group: group.to_owned(),
            source: Source::Stream,
            retry_count: trusted.as_ref().map_or(0, |b| b.retry_count),
            origin_id: trusted
                .as_ref()
                .map_or_else(|| entry.id.clone(), |b| b.origin_id.clone()),
            due_ms: trusted.as_ref().map(|b| b.due_ms),
            user_len,
            entry,
            delivery_count: delivery_count.max(1),
            started: None,
        }
    }

    /// The same delivery, read from `source`.
    pub fn from_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// The fields the producer wrote (everything but verified bookkeeping), in stream order.
    pub fn user_fields(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.entry.fields[..self.user_len]
    }

    /// Attempts of this message that came before this one: each park-and-re-add and each
    /// earlier delivery of this entry id. This is what `max_retries` is compared with.
    pub fn previous_attempts(&self) -> u64 {
        u64::from(self.retry_count) + self.delivery_count.saturating_sub(1)
    }
}

/// Order stream ids numerically (`ms-seq`).
pub fn cmp_ids(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(id: &str) -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    }
    parts(a).cmp(&parts(b))
}

#[cfg(test)]
mod tests {
    use super::cmp_ids;

    #[test]
    fn ids_compare_numerically() {
        assert_eq!(cmp_ids("10-0", "9-5"), std::cmp::Ordering::Greater);
        assert_eq!(cmp_ids("9-10", "9-9"), std::cmp::Ordering::Greater);
    }
}
