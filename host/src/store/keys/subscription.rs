//! [`SubscriptionKeys`]: the Redis keys one subscription uses (stream, group, dead-letter
//! stream, delayed set, retry lane), named once and handed around as one value.

use std::sync::Arc;

use super::names::{lane_key, secret_key};

/// The Redis keys one subscription uses, named once and handed around as one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionKeys {
    /// The stream read.
    pub stream: Arc<str>,
    /// The consumer group.
    pub group: Arc<str>,
    /// Where entries given up on go.
    pub dead_letter: Arc<str>,
    /// The delayed-retry set, if the subscription parks retries.
    pub delayed: Option<Arc<str>>,
    /// The retry lane (`<delayed set>.lane`), when due retries overtake new entries: the
    /// sweep appends them there and the reader serves it first.
    pub lane: Option<Arc<str>>,
    /// Trim the dead-letter stream to about this many entries on every write (`None`: never;
    /// trimming drops the oldest dead letters for good).
    pub dead_letter_maxlen: Option<u64>,
    /// Where an earlier release kept this group's dead letters, when the dead-letter stream is
    /// the default one (see `sluice_descriptor::legacy_dead_letter`).
    pub legacy_dead_letter: Option<Arc<str>>,
    /// How many entries' histories the subscription keeps (0: none).
    pub history_entries: u32,
}

/// How many entries' histories a subscription keeps when its config does not say (each up to
/// 32 records of about 170 bytes plus the reason).
pub const DEFAULT_HISTORY_ENTRIES: u32 = 1_000;

impl SubscriptionKeys {
    /// The keys of a subscription to `stream` as `group`.
    pub fn new(stream: &str, group: &str, dead_letter: &str, delayed: Option<&str>) -> Self {
        Self {
            stream: stream.into(),
            group: group.into(),
            dead_letter: dead_letter.into(),
            delayed: delayed.map(Into::into),
            lane: None,
            dead_letter_maxlen: None,
            legacy_dead_letter: None,
            history_entries: DEFAULT_HISTORY_ENTRIES,
        }
    }

    /// The keys of the resolved subscription (or partition) `part`, its lane not yet decided.
    pub fn of(part: &sluice_descriptor::ResolvedStream) -> Self {
        let mut keys = Self::new(
            &part.stream,
            &part.group,
            &part.dead_letter,
            part.delayed_retry
                .as_ref()
                .map(sluice_descriptor::DelayedRetry::key),
        );
        keys.legacy_dead_letter = part.legacy_dead_letter.as_deref().map(Into::into);
        keys
    }

    /// The same keys, with a retry lane next to the delayed set when `lane` is set (and there
    /// is a set).
    pub fn with_retry_lane(mut self, lane: bool) -> Self {
        self.lane = self
            .delayed
            .as_deref()
            .filter(|_| lane)
            .map(|set| lane_key(set).into());
        self
    }

    /// A copy of these keys with the retry lane next to the delayed set (if there is one).
    pub fn with_retry_lane_clone(&self) -> Self {
        self.clone().with_retry_lane(true)
    }

    /// The same keys, with the dead-letter stream trimmed to about `maxlen` entries.
    pub fn with_dead_letter_maxlen(mut self, maxlen: Option<u64>) -> Self {
        self.dead_letter_maxlen = maxlen;
        self
    }

    /// The same keys, keeping the histories of at most `entries` entries (0: none).
    pub fn with_history_entries(mut self, entries: u32) -> Self {
        self.history_entries = entries;
        self
    }

    /// The trim argument the scripts take: the length, or 0 for none.
    pub fn maxlen_arg(&self) -> u64 {
        self.dead_letter_maxlen.unwrap_or(0)
    }

    /// Where the stream's secret is kept.
    pub fn secret(&self) -> String {
        secret_key(&self.stream)
    }

    /// The streams whose entries may carry the subscription's bookkeeping: the stream, the
    /// retry lane, the dead-letter stream, and the earlier release's default dead-letter stream
    /// (see [`super::Secret::load_with`]).
    pub fn own_streams(&self) -> Vec<String> {
        let mut keys = vec![self.stream.to_string()];
        keys.extend(self.lane.as_deref().map(str::to_owned));
        keys.push(self.dead_letter.to_string());
        keys.extend(self.legacy_dead_letter.as_deref().map(str::to_owned));
        keys
    }

    /// Every key a script touches together with the stream (which is not in the list): on a
    /// Redis Cluster they must share its slot.
    pub fn with_stream(&self) -> Vec<String> {
        let mut keys = vec![self.dead_letter.to_string()];
        keys.extend(self.delayed.as_deref().map(str::to_owned));
        keys.extend(self.lane.as_deref().map(str::to_owned));
        keys.push(self.secret());
        keys
    }
}
