//! A delivery: one stream entry handed to a handler, with what the host knows about its
//! history (how often it was parked and re-added, how often Redis delivered it).

use crate::keys;

/// One stream entry as read from Redis: its id and all of its fields, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry id.
    pub id: String,
    /// Every field, including the host's `sluice-*` bookkeeping fields.
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    /// How many times this message was parked and re-added: the `sluice-retry-count` field,
    /// 0 when absent or unreadable.
    pub fn retry_count(&self) -> u32 {
        self.field(keys::RETRY_COUNT)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// The raw value of `name`, if present.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The fields a handler sees: everything but the bookkeeping fields.
    pub fn user_fields(&self) -> impl Iterator<Item = &(String, Vec<u8>)> {
        self.fields.iter().filter(|(n, _)| !keys::is_bookkeeping(n))
    }
}

/// An entry on its way to a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The stream it was read from.
    pub stream: String,
    /// The group that read it.
    pub group: String,
    /// The entry.
    pub entry: Entry,
    /// Parked-and-re-added count (from the entry's bookkeeping field).
    pub retry_count: u32,
    /// Redis's delivery counter for this entry id.
    pub delivery_count: u64,
    /// When dispatch took its handler version (set by the dispatcher).
    pub started: Option<std::time::SystemTime>,
}

impl Delivery {
    /// Wrap an entry read from `stream` by `group`.
    pub fn new(stream: &str, group: &str, entry: Entry, delivery_count: u64) -> Self {
        Self {
            stream: stream.to_owned(),
            group: group.to_owned(),
            retry_count: entry.retry_count(),
            entry,
            delivery_count: delivery_count.max(1),
            started: None,
        }
    }

    /// Attempts of this message that came before this one: each park-and-re-add and each
    /// earlier delivery of this entry id. This is what `max_retries` is compared with.
    pub fn previous_attempts(&self) -> u64 {
        u64::from(self.retry_count) + self.delivery_count.saturating_sub(1)
    }
}
