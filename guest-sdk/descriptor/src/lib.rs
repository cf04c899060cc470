//! The subscription descriptor: one definition shared by guests and the host.
//!
//! A guest builds a [`RedisStream`] with the builder methods below and exports it from its
//! component; the host reads it back, lays its own configuration over it (any field can be
//! overridden there), and resolves the defaults with [`RedisStream::resolve`]. Keeping the type,
//! its defaults and its validation in this small crate means the guest SDK and the host cannot
//! drift apart.
//!
//! ```
//! use std::time::Duration;
//! use sluice_descriptor::{DelayedRetry, RedisStream};
//!
//! let bank_payments = RedisStream::new("bank-payments")
//!     .group("billing")
//!     .delayed_retry(DelayedRetry::DurableZset {
//!         key: "bank-payments.delayed".to_owned(),
//!         ttl: None,
//!     });
//! let resolved = bank_payments.resolve().unwrap();
//! assert_eq!(resolved.group, "billing");
//! assert_eq!(resolved.block, Duration::from_secs(1));
//! ```

use std::time::Duration;

mod dedupe;
mod effects;
mod order;
pub use dedupe::Dedupe;
pub use effects::Effects;
pub use order::{OnDeadLetter, OrderKey, OrderedBy};

/// Entries one read asks for when the descriptor does not say.
pub const DEFAULT_COUNT: usize = 64;
/// How long one read blocks when the descriptor does not say.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(1);
/// Failed attempts tolerated before an entry is dead-lettered, when the descriptor does not say.
pub const DEFAULT_MAX_RETRIES: u32 = 8;
/// The entry field that carries the JSON payload when the descriptor does not say.
pub const DEFAULT_PAYLOAD_FIELD: &str = "payload";
/// Config keys with this prefix are the host's: an operator cannot set them, a guest reads them.
pub const RESERVED_CONFIG_PREFIX: &str = "sluice.";
/// The config key through which the host tells the guest which field holds the payload.
pub const PAYLOAD_FIELD_CONFIG_KEY: &str = "sluice.payload-field";
/// The suffix of the dead-letter stream's default name (`<stream>.<group>.dead-letter`).
pub const DEFAULT_DEAD_LETTER_SUFFIX: &str = ".dead-letter";

/// The dead-letter stream of a subscription to `stream` as `group` that names none: one per
/// group, since every group of a stream gives up on entries of its own (two groups sharing one
/// would list, trim and requeue each other's).
pub fn default_dead_letter(stream: &str, group: &str) -> String {
    format!("{stream}.{group}{DEFAULT_DEAD_LETTER_SUFFIX}")
}

/// Where earlier releases put a subscription's dead letters when it named none
/// (`<stream>.dead-letter`, shared by every group of the stream); the host moves what it finds
/// there of its own group into [`default_dead_letter`].
pub fn legacy_dead_letter(stream: &str) -> String {
    format!("{stream}{DEFAULT_DEAD_LETTER_SUFFIX}")
}
/// How much a delayed set's ttl must exceed the declared `max_delay`: the ttl counts from the
/// set's latest due time, and is also how long every host may be down before the set and its
/// retries are deleted, so it must be more than just the delay.
pub const TTL_MARGIN: Duration = Duration::from_secs(60);
/// The failure backoff used when the descriptor does not say.
pub const DEFAULT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(60),
};

/// The most partitions one subscription may have.
pub const MAX_PARTITIONS: u32 = 1024;

/// The longest name (stream, group, consumer, key, field) a descriptor may hold, in bytes. A
/// name is repeated in every metric series, log line and page row of its subscription: one
/// 4 MiB stream name once made a single `/metrics` scrape take 440 MB.
pub const MAX_NAME_BYTES: usize = 256;
/// The most entries one read may ask for: a read's reply is held whole in memory.
pub const MAX_COUNT: usize = 10_000;
/// The longest duration any descriptor or configuration value may hold (ten years): longer
/// ones are surely mistakes, and every deadline computed from them must fit a clock.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `name` if it is short enough and free of control characters, the reason otherwise.
pub fn check_name(field: &'static str, name: &str) -> Result<(), DescriptorError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(DescriptorError::NameTooLong {
            field,
            len: name.len(),
            start: shown(name),
        });
    }
    if name.chars().any(char::is_control) {
        return Err(DescriptorError::ControlInName {
            field,
            name: name.escape_default().to_string(),
        });
    }
    Ok(())
}

/// The first characters of a name too long to print whole.
fn shown(name: &str) -> String {
    name.chars()
        .take(32)
        .collect::<String>()
        .escape_default()
        .to_string()
}

/// The Redis key of `name` (the stream, its delayed set or its dead-letter stream) in partition
/// `partition` of a subscription to `stream`: `<name>:{<stream>:<partition>}`.
///
/// The braces are a Redis Cluster hash tag: every key of one partition shares the tag, so the
/// park, sweep and dead-letter scripts touch one slot, while different partitions (and the
/// partitions of different streams) hash to different slots and spread over the cluster's
/// masters. Partition 3 of `payments` reads `payments:{payments:3}`, parks in
/// `payments.delayed:{payments:3}` and dead-letters to `payments.dead-letter:{payments:3}`.
pub fn partition_key(name: &str, stream: &str, partition: u32) -> String {
    format!("{name}:{{{stream}:{partition}}}")
}

/// The partition a producer writes an entry with this `key` (an account id, an order id:
/// whatever must stay in order) to: CRC-32 (IEEE, as zlib's `crc32`) of the key's bytes,
/// modulo `partitions`. Entries with one key always land in one partition, so one consumer at a
/// time handles them in the order they were added; any language can compute the same number.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    crc32fast::hash(key) % partitions.max(1)
}

/// The stream a producer adds an entry with `key` to, for a subscription to `stream` with
/// `partitions` partitions (just `stream` when there is one).
pub fn partition_stream(stream: &str, partitions: u32, key: &[u8]) -> String {
    if partitions <= 1 {
        return stream.to_owned();
    }
    partition_key(stream, stream, partition_for(key, partitions))
}

/// Where a `retry_after` waits until it is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelayedRetry {
    /// Park the entry in a Redis sorted set scored by its due time (wall-clock epoch
    /// milliseconds), so the retry survives any crash of the service and fires at its due time.
    DurableZset {
        /// The sorted set's key, e.g. `bank-payments.delayed`.
        key: String,
        /// Expire a set that no retry has refreshed for this long. It has to exceed the longest
        /// delay, or entries are dropped before they are due.
        ttl: Option<Duration>,
    },
}

impl DelayedRetry {
    /// Park retries in the sorted set `key`, kept until swept (no ttl).
    pub fn durable_zset(key: impl Into<String>) -> Self {
        Self::DurableZset {
            key: key.into(),
            ttl: None,
        }
    }

    /// The same set, expiring `ttl` after its latest due retry when no host sweeps it.
    pub fn with_ttl(self, ttl: Duration) -> Self {
        match self {
            Self::DurableZset { key, .. } => Self::DurableZset {
                key,
                ttl: Some(ttl),
            },
        }
    }

    /// The Redis key the retries wait in.
    pub fn key(&self) -> &str {
        match self {
            Self::DurableZset { key, .. } => key,
        }
    }
}

/// Exponential backoff after a failed attempt: `initial * 2^n`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub initial: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Backoff {
    /// The delay after a failure when `previous_failures` attempts had already failed.
    pub fn delay(&self, previous_failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(previous_failures.min(31))
            .unwrap_or(u32::MAX);
        self.initial
            .checked_mul(factor)
            .map_or(self.max, |d| d.min(self.max))
    }
}

/// A Redis Streams consumer-group subscription, as a guest or an operator describes it.
///
/// Every field but `stream` is optional; unset fields take the defaults above when the host
/// resolves the descriptor. The fields are public so the host can lay its configuration over
/// them; guests use the builder methods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisStream {
    /// The stream to read.
    pub stream: String,
    /// The consumer group (created with MKSTREAM if missing).
    pub group: Option<String>,
    /// This consumer's name inside the group (default `sluice-<hostname>`); must be unique per
    /// host.
    pub consumer: Option<String>,
    /// Set on a claiming subscription: each read also takes entries that other consumers left
    /// idle for at least this long (XAUTOCLAIM).
    pub claim_min_idle: Option<Duration>,
    /// How long one read blocks waiting for new entries.
    pub block: Option<Duration>,
    /// The most entries one read returns.
    pub count: Option<usize>,
    /// Where entries that are given up on go (default `<stream>.<group>.dead-letter`).
    pub dead_letter: Option<String>,
    /// Failed attempts tolerated before an entry is dead-lettered.
    pub max_retries: Option<u32>,
    /// Where retries wait; without it a retry stays pending in the stream.
    pub delayed_retry: Option<DelayedRetry>,
    /// The entry field holding the JSON payload.
    pub payload_field: Option<String>,
    /// The longest delay the handler will ask for; checked against a delayed set's ttl.
    pub max_delay: Option<Duration>,
    /// The backoff after a failed attempt (a trap or a limit hit).
    pub failure_backoff: Option<Backoff>,
    /// Split the stream into this many partitions (default 1: the stream itself); see
    /// [`partition_key`].
    pub partitions: Option<u32>,
    /// Handle entries with one key in order, one (or a few) at a time (see [`OrderedBy`]).
    pub ordered_by: Option<OrderedBy>,
    /// Keep the answers of outbound calls for later attempts (see [`Effects`]).
    pub effects: Option<Effects>,
    /// Acknowledge an entry whose key was handled within a window (see [`Dedupe`]).
    pub dedupe: Option<Dedupe>,
}

/// The descriptor fields an operator sets in the host's configuration; `None` keeps the
/// component's value. Kept next to [`RedisStream`] so a new descriptor field cannot be
/// forgotten here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Replaces [`RedisStream::stream`].
    pub stream: Option<String>,
    /// Replaces [`RedisStream::group`].
    pub group: Option<String>,
    /// Replaces [`RedisStream::consumer`].
    pub consumer: Option<String>,
    /// Replaces [`RedisStream::claim_min_idle`].
    pub claim_min_idle: Option<Duration>,
    /// Replaces [`RedisStream::block`].
    pub block: Option<Duration>,
    /// Replaces [`RedisStream::count`].
    pub count: Option<usize>,
    /// Replaces [`RedisStream::dead_letter`].
    pub dead_letter: Option<String>,
    /// Replaces [`RedisStream::max_retries`].
    pub max_retries: Option<u32>,
    /// Replaces [`RedisStream::payload_field`].
    pub payload_field: Option<String>,
    /// Replaces [`RedisStream::max_delay`].
    pub max_delay: Option<Duration>,
    /// Replaces [`RedisStream::failure_backoff`].
    pub failure_backoff: Option<Backoff>,
    /// Replaces [`RedisStream::partitions`].
    pub partitions: Option<u32>,
    /// `Some(None)` removes the descriptor's delayed-retry set, `Some(Some(..))` replaces it.
    pub delayed_retry: Option<Option<DelayedRetry>>,
    /// `Some(None)` removes the descriptor's ordering, `Some(Some(..))` replaces it.
    pub ordered_by: Option<Option<OrderedBy>>,
    /// Replaces the ordering's [`OrderedBy::max_in_flight_per_key`] (the host refuses it
    /// when the subscription is not ordered).
    pub max_in_flight_per_key: Option<u32>,
    /// Replaces [`RedisStream::effects`].
    pub effects: Option<Effects>,
    /// `Some(None)` removes the descriptor's dedupe, `Some(Some(..))` replaces it.
    pub dedupe: Option<Option<Dedupe>>,
}

/// Builder methods that set one optional field each: `name(value)` sets `self.name`.
macro_rules! setters {
    ($($(#[doc = $doc:expr])* $name:ident: $ty:ty,)*) => {
        $(
            $(#[doc = $doc])*
            pub fn $name(mut self, $name: impl Into<$ty>) -> Self {
                self.$name = Some($name.into());
                self
            }
        )*
    };
}

impl RedisStream {
    /// A subscription that reads new entries of `stream`.
    pub fn new(stream: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            ..Self::default()
        }
    }

    /// A claiming subscription: each read also takes entries that other consumers of the group
    /// left idle for at least `min_idle` (their consumer died or stalled).
    pub fn claiming(stream: impl Into<String>, min_idle: Duration) -> Self {
        Self {
            claim_min_idle: Some(min_idle),
            ..Self::new(stream)
        }
    }

    setters! {
        /// Read as this consumer group.
        group: String,
        /// Read under this consumer name (default: `sluice-<hostname>`, which stays the same
        /// across restarts so a restarted host re-reads its own pending entries). Two hosts
        /// must not share one.
        consumer: String,
        /// Block each read for at most this long.
        block: Duration,
        /// Read at most `count` entries at a time.
        count: usize,
        /// Send entries that are given up on to this stream.
        dead_letter: String,
        /// Dead-letter an entry after this many failed attempts.
        max_retries: u32,
        /// Keep retries in a delayed-retry set instead of leaving them pending.
        delayed_retry: DelayedRetry,
        /// Decode the payload from this entry field instead of `payload`.
        payload_field: String,
        /// Declare the longest `retry_after` the handler asks for, so a set's ttl can be checked.
        max_delay: Duration,
        /// Back off like this after a failed attempt.
        failure_backoff: Backoff,
        /// Read `partitions` streams, each with its own hash tag, delayed set and dead-letter
        /// stream, so one logical stream can spread over a Redis Cluster (see
        /// [`partition_key`]).
        partitions: u32,
        /// Handle entries with one key in order, across hosts and retries (see [`OrderedBy`]).
        ordered_by: OrderedBy,
        /// Record outbound calls' answers and replay them on later attempts of one entry, so
        /// a call that went through is not made twice (see [`Effects`]).
        effects: Effects,
        /// Acknowledge, without calling the handler, an entry whose key was handled within
        /// a window (see [`Dedupe`]).
        dedupe: Dedupe,
    }

    /// Lay an operator's overrides over this descriptor: every field the operator set wins.
    pub fn overlay(mut self, o: &Overrides) -> Self {
        macro_rules! set {
            ($($field:ident),*) => { $( if let Some(v) = &o.$field { self.$field = Some(v.clone()); } )* };
        }
        if let Some(stream) = &o.stream {
            self.stream = stream.clone();
        }
        set!(
            group,
            consumer,
            claim_min_idle,
            block,
            count,
            dead_letter,
            max_retries,
            payload_field,
            max_delay,
            failure_backoff,
            partitions,
            effects
        );
        if let Some(delayed) = &o.delayed_retry {
            self.delayed_retry = delayed.clone();
        }
        if let Some(ordered) = &o.ordered_by {
            self.ordered_by = ordered.clone();
        }
        if let Some(dedupe) = &o.dedupe {
            self.dedupe = dedupe.clone();
        }
        if let (Some(ordered), Some(n)) = (&mut self.ordered_by, o.max_in_flight_per_key) {
            ordered.max_in_flight_per_key = n;
        }
        self
    }

    /// Fill in the defaults and check the result, so a bad descriptor is refused before any
    /// task starts.
    pub fn resolve(&self) -> Result<ResolvedStream, DescriptorError> {
        // Names first, so no later message prints a name of any length.
        check_name("stream", &self.stream)?;
        for (field, name) in [
            ("group", self.group.as_deref()),
            ("consumer", self.consumer.as_deref()),
            ("dead_letter", self.dead_letter.as_deref()),
            ("payload_field", self.payload_field.as_deref()),
            (
                "delayed_retry key",
                self.delayed_retry.as_ref().map(DelayedRetry::key),
            ),
        ] {
            if let Some(name) = name {
                check_name(field, name)?;
            }
        }
        let ttl = self.delayed_retry.as_ref().and_then(|d| match d {
            DelayedRetry::DurableZset { ttl, .. } => *ttl,
        });
        for (field, value) in [
            ("block", self.block),
            ("claim_min_idle", self.claim_min_idle),
            ("max_delay", self.max_delay),
            (
                "failure_backoff.initial",
                self.failure_backoff.map(|b| b.initial),
            ),
            ("failure_backoff.max", self.failure_backoff.map(|b| b.max)),
            ("delayed_retry ttl", ttl),
        ] {
            if let Some(value) = value
                && value > MAX_DURATION
            {
                return Err(DescriptorError::DurationTooLong {
                    stream: self.stream.clone(),
                    field,
                    value,
                });
            }
        }
        let stream = self.stream.trim();
        if stream.is_empty() {
            return Err(DescriptorError::EmptyStream);
        }
        let group = self
            .group
            .clone()
            .ok_or_else(|| DescriptorError::MissingGroup(stream.to_owned()))?;
        if group.trim().is_empty() {
            return Err(DescriptorError::Empty {
                stream: stream.to_owned(),
                field: "group",
            });
        }
        let count = self.count.unwrap_or(DEFAULT_COUNT);
        if count == 0 || count > MAX_COUNT {
            return Err(DescriptorError::Count {
                stream: stream.to_owned(),
                count,
            });
        }
        let block = self.block.unwrap_or(DEFAULT_BLOCK);
        if block.is_zero() {
            // BLOCK 0 means "forever" to Redis: the loop could never stop or sweep.
            return Err(DescriptorError::ZeroBlock(stream.to_owned()));
        }
        let (dead_letter, legacy_dead_letter) = match &self.dead_letter {
            Some(named) => (named.clone(), None),
            None => (
                default_dead_letter(stream, &group),
                Some(legacy_dead_letter(stream)),
            ),
        };
        if dead_letter == stream {
            return Err(DescriptorError::DeadLetterIsStream(stream.to_owned()));
        }
        for (field, value) in [
            ("consumer", self.consumer.as_deref()),
            ("payload_field", self.payload_field.as_deref()),
            ("dead_letter", Some(dead_letter.as_str())),
        ] {
            if value.is_some_and(|v| v.trim().is_empty()) {
                return Err(DescriptorError::Empty {
                    stream: stream.to_owned(),
                    field,
                });
            }
        }
        if let Some(DelayedRetry::DurableZset { key, ttl }) = &self.delayed_retry {
            if key.trim().is_empty() || key == stream || *key == dead_letter {
                return Err(DescriptorError::BadDelayedKey {
                    stream: stream.to_owned(),
                    key: key.clone(),
                });
            }
            if let Some(ttl) = ttl {
                if ttl.is_zero() {
                    return Err(DescriptorError::ZeroTtl(key.clone()));
                }
                if let Some(max_delay) = self.max_delay
                    && max_delay.saturating_add(TTL_MARGIN) > *ttl
                {
                    return Err(DescriptorError::TtlBelowMaxDelay {
                        key: key.clone(),
                        ttl: *ttl,
                        max_delay,
                    });
                }
            }
        }
        if let Some(ordered) = &self.ordered_by {
            ordered.check(stream)?;
            if self.delayed_retry.is_none() {
                return Err(DescriptorError::Ordering {
                    stream: stream.to_owned(),
                    problem: "ordered_by needs a delayed-retry set: the entries a key's turn lets go pass through it on their way back to the group; add .delayed_retry(..) or `delayed_retry = { key = \"...\" }`".into(),
                });
            }
        }
        if let Some(dedupe) = &self.dedupe {
            dedupe.check(stream)?;
            if self.ordered_by.is_some() {
                return Err(DescriptorError::Dedupe {
                    stream: stream.to_owned(),
                    problem: "dedupe and ordered_by together are not supported yet: both settle an entry's place as it is read, in scripts of their own; keep one (a deduplicating producer, or one subscription each)".into(),
                });
            }
        }
        let failure_backoff = self.failure_backoff.unwrap_or(DEFAULT_BACKOFF);
        if failure_backoff.initial > failure_backoff.max {
            return Err(DescriptorError::BackoffInverted(stream.to_owned()));
        }
        let partitions = self.partitions.unwrap_or(1);
        if !(1..=MAX_PARTITIONS).contains(&partitions) {
            return Err(DescriptorError::Partitions {
                stream: stream.to_owned(),
                partitions,
            });
        }
        if partitions > 1 {
            let delayed = self.delayed_retry.as_ref().map(DelayedRetry::key);
            let names = [Some(stream), Some(dead_letter.as_str()), delayed];
            if let Some(name) = names.into_iter().flatten().find(|n| n.contains(['{', '}'])) {
                return Err(DescriptorError::BracesInPartitionedKey {
                    stream: stream.to_owned(),
                    key: name.to_owned(),
                });
            }
        }
        Ok(ResolvedStream {
            stream: stream.to_owned(),
            group,
            consumer: self.consumer.clone(),
            claim_min_idle: self.claim_min_idle,
            block,
            count,
            dead_letter,
            legacy_dead_letter,
            max_retries: self.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            delayed_retry: self.delayed_retry.clone(),
            payload_field: self
                .payload_field
                .clone()
                .unwrap_or_else(|| DEFAULT_PAYLOAD_FIELD.to_owned()),
            max_delay: self.max_delay,
            failure_backoff,
            partitions,
            ordered_by: self.ordered_by.clone(),
            effects: self.effects.unwrap_or_default(),
            dedupe: self.dedupe.clone(),
        })
    }
}

/// A descriptor with every default filled in and every rule checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedStream {
    /// The stream to read.
    pub stream: String,
    /// The consumer group.
    pub group: String,
    /// The consumer name, if one was given; the host picks one otherwise.
    pub consumer: Option<String>,
    /// Set on a claiming subscription.
    pub claim_min_idle: Option<Duration>,
    /// How long one read blocks.
    pub block: Duration,
    /// The most entries one read returns.
    pub count: usize,
    /// The dead-letter stream.
    pub dead_letter: String,
    /// When the dead-letter stream is the default one: where older releases put this group's
    /// dead letters (see [`legacy_dead_letter`]).
    pub legacy_dead_letter: Option<String>,
    /// Failed attempts tolerated before dead-lettering.
    pub max_retries: u32,
    /// Where retries wait, if anywhere but the stream's pending list.
    pub delayed_retry: Option<DelayedRetry>,
    /// The entry field holding the JSON payload.
    pub payload_field: String,
    /// The declared longest delay, if any.
    pub max_delay: Option<Duration>,
    /// The backoff after a failed attempt.
    pub failure_backoff: Backoff,
    /// How many partitions the stream has (1: the stream itself).
    pub partitions: u32,
    /// Entries with one key are handled in order (each partition keeps its own keys' order).
    pub ordered_by: Option<OrderedBy>,
    /// Whether outbound calls' answers are journaled for later attempts.
    pub effects: Effects,
    /// Entries whose key was handled within a window are acknowledged unhandled.
    pub dedupe: Option<Dedupe>,
}

impl ResolvedStream {
    /// Each partition's subscription, partition 0 first: the same settings over that
    /// partition's stream, delayed set and dead-letter stream (see [`partition_key`]). With
    /// one partition, the subscription itself.
    pub fn partitioned(&self) -> Vec<ResolvedStream> {
        if self.partitions <= 1 {
            return vec![self.clone()];
        }
        (0..self.partitions)
            .map(|p| {
                let key = |name: &str| partition_key(name, &self.stream, p);
                ResolvedStream {
                    stream: key(&self.stream),
                    dead_letter: key(&self.dead_letter),
                    legacy_dead_letter: self.legacy_dead_letter.as_deref().map(key),
                    delayed_retry: self.delayed_retry.as_ref().map(|d| match d {
                        DelayedRetry::DurableZset { key: set, ttl } => DelayedRetry::DurableZset {
                            key: key(set),
                            ttl: *ttl,
                        },
                    }),
                    partitions: 1,
                    ..self.clone()
                }
            })
            .collect()
    }
}

/// Why a descriptor was refused. Each message names the stream or key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// The stream name is empty.
    #[error("the subscription's stream name is empty")]
    EmptyStream,
    /// No consumer group was given.
    #[error(
        "subscription to `{0}` names no consumer group: add .group(\"...\") or `group = \"...\"`"
    )]
    MissingGroup(String),
    /// A name was given but is blank.
    #[error("subscription to `{stream}`: `{field}` is empty")]
    Empty {
        /// The subscription's stream.
        stream: String,
        /// The blank field.
        field: &'static str,
    },
    /// `count` is zero or above [`MAX_COUNT`].
    #[error("subscription to `{stream}`: count must be between 1 and {MAX_COUNT}, not {count}")]
    Count {
        /// The subscription's stream.
        stream: String,
        /// The count given.
        count: usize,
    },
    /// A name is longer than [`MAX_NAME_BYTES`].
    #[error(
        "the subscription's {field} is {len} bytes long (`{start}…`); names are at most {MAX_NAME_BYTES} bytes"
    )]
    NameTooLong {
        /// Which name.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// Its first characters, escaped.
        start: String,
    },
    /// A name holds a control character (a newline, an escape).
    #[error("the subscription's {field} `{name}` holds a control character")]
    ControlInName {
        /// Which name.
        field: &'static str,
        /// The name, escaped.
        name: String,
    },
    /// A duration is longer than [`MAX_DURATION`].
    #[error(
        "subscription to `{stream}`: {field} of {} is longer than the most any duration may be ({} days)",
        humanize(*value),
        MAX_DURATION.as_secs() / 86_400
    )]
    DurationTooLong {
        /// The subscription's stream.
        stream: String,
        /// Which duration.
        field: &'static str,
        /// What was given.
        value: Duration,
    },
    /// `block` is zero, which Redis reads as "block forever".
    #[error("subscription to `{0}`: block must be longer than 0 (Redis reads BLOCK 0 as forever)")]
    ZeroBlock(String),
    /// The dead-letter stream is the stream itself.
    #[error("subscription to `{0}`: the dead-letter stream must differ from the stream")]
    DeadLetterIsStream(String),
    /// The delayed set's key is empty or collides with the stream or the dead-letter stream.
    #[error(
        "subscription to `{stream}`: delayed-retry key `{key}` must be non-empty and differ from the stream and the dead-letter stream"
    )]
    BadDelayedKey {
        /// The subscription's stream.
        stream: String,
        /// The offending key.
        key: String,
    },
    /// The ttl is zero.
    #[error("delayed-retry set `{0}`: ttl must be longer than 0")]
    ZeroTtl(String),
    /// The set's ttl does not exceed the declared maximum delay by [`TTL_MARGIN`].
    #[error(
        "delayed-retry set `{key}`: ttl {} is shorter than the longest delay {} plus a margin of {}; the ttl is how long the set outlives its last due retry when no host sweeps it, so it must cover more than one delay; raise ttl or set ttl to none",
        humanize(*ttl),
        humanize(*max_delay),
        humanize(TTL_MARGIN)
    )]
    TtlBelowMaxDelay {
        /// The set's key.
        key: String,
        /// Its ttl.
        ttl: Duration,
        /// The declared longest delay.
        max_delay: Duration,
    },
    /// The backoff starts above its own cap.
    #[error("subscription to `{0}`: failure backoff initial delay exceeds its max")]
    BackoffInverted(String),
    /// The partition count is 0 or too large.
    #[error(
        "subscription to `{stream}`: partitions must be between 1 and {MAX_PARTITIONS}, not {partitions}"
    )]
    Partitions {
        /// The stream.
        stream: String,
        /// The count given.
        partitions: u32,
    },
    /// The dedupe settings are out of bounds.
    #[error("subscription to `{stream}`: {problem}")]
    Dedupe {
        /// The stream.
        stream: String,
        /// What is wrong.
        problem: String,
    },
    /// The ordering settings are out of bounds, or ordering lacks what it needs.
    #[error("subscription to `{stream}`: {problem}")]
    Ordering {
        /// The stream.
        stream: String,
        /// What is wrong.
        problem: String,
    },
    /// A partitioned subscription's key has a hash tag of its own.
    #[error(
        "subscription to `{stream}`: key `{key}` has braces, but a partitioned subscription gives each partition its own hash tag (`<key>:{{<stream>:<n>}}`); remove the braces"
    )]
    BracesInPartitionedKey {
        /// The stream.
        stream: String,
        /// The key with braces.
        key: String,
    },
}

/// Durations in error messages, as an operator would write them.
fn humanize(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_unset_fields() {
        let r = RedisStream::new("s").group("g").resolve().unwrap();
        assert_eq!(r.count, DEFAULT_COUNT);
        assert_eq!(r.dead_letter, "s.g.dead-letter");
        assert_eq!(r.legacy_dead_letter.as_deref(), Some("s.dead-letter"));
        assert_eq!(r.payload_field, "payload");
        assert_eq!(r.claim_min_idle, None);
        assert_eq!(r.effects, Effects::Live);
    }

    #[test]
    fn the_operators_effects_win_over_the_components() {
        let asked = RedisStream::new("s").group("g").effects(Effects::Journal);
        let effects = |o: Option<Effects>| {
            let o = Overrides {
                effects: o,
                ..Overrides::default()
            };
            asked.clone().overlay(&o).resolve().unwrap().effects
        };
        assert_eq!(effects(None), Effects::Journal);
        assert_eq!(effects(Some(Effects::Live)), Effects::Live);
    }

    #[test]
    fn partitions_name_their_keys_with_one_hash_tag_each() {
        let r = RedisStream::new("payments")
            .group("g")
            .partitions(8u32)
            .delayed_retry(DelayedRetry::DurableZset {
                key: "payments.delayed".into(),
                ttl: None,
            })
            .resolve()
            .unwrap();
        let parts = r.partitioned();
        assert_eq!(parts.len(), 8);
        assert_eq!(parts[3].stream, "payments:{payments:3}");
        assert_eq!(parts[3].dead_letter, "payments.g.dead-letter:{payments:3}");
        assert_eq!(
            parts[3].legacy_dead_letter.as_deref(),
            Some("payments.dead-letter:{payments:3}")
        );
        assert_eq!(
            parts[3].delayed_retry.as_ref().map(DelayedRetry::key),
            Some("payments.delayed:{payments:3}")
        );
        assert!(parts.iter().all(|p| p.partitions == 1 && p.group == "g"));
        // One partition: the stream itself, keys unchanged.
        let one = RedisStream::new("payments").group("g").resolve().unwrap();
        assert_eq!(one.partitioned(), vec![one.clone()]);
    }

    #[test]
    fn partition_counts_and_braces_are_checked() {
        let zero = RedisStream::new("s").group("g").partitions(0u32).resolve();
        assert!(zero.unwrap_err().to_string().contains("between 1 and"));
        let braces = RedisStream::new("{s}")
            .group("g")
            .partitions(2u32)
            .resolve();
        assert!(braces.unwrap_err().to_string().contains("`{s}` has braces"));
        let too_many = RedisStream::new("s")
            .group("g")
            .partitions(MAX_PARTITIONS + 1)
            .resolve();
        assert!(too_many.is_err());
    }

    #[test]
    fn names_counts_and_durations_are_bounded() {
        let long = "s".repeat(4 << 20);
        let err = RedisStream::new(long.as_str())
            .group("g")
            .resolve()
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("stream is 4194304 bytes long"), "{text}");
        assert!(
            text.len() < 300,
            "the message prints the name: {} bytes",
            text.len()
        );
        let err = RedisStream::new("s")
            .group("g\nINFO forged")
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains("group `g\\nINFO forged`"), "{err}");
        for (field, sub) in [
            (
                "consumer",
                RedisStream::new("s").group("g").consumer(long.as_str()),
            ),
            (
                "dead_letter",
                RedisStream::new("s").group("g").dead_letter(long.as_str()),
            ),
            (
                "payload_field",
                RedisStream::new("s")
                    .group("g")
                    .payload_field(long.as_str()),
            ),
            (
                "delayed_retry key",
                RedisStream::new("s")
                    .group("g")
                    .delayed_retry(DelayedRetry::durable_zset(long.as_str())),
            ),
        ] {
            let err = sub.resolve().unwrap_err().to_string();
            assert!(err.contains(field) && err.len() < 300, "{err}");
        }
        let ok = RedisStream::new("s".repeat(MAX_NAME_BYTES)).group("g");
        assert!(ok.resolve().is_ok());
        let count = RedisStream::new("s")
            .group("g")
            .count(MAX_COUNT + 1)
            .resolve();
        assert!(
            count
                .unwrap_err()
                .to_string()
                .contains("between 1 and 10000")
        );
        let century = Duration::from_secs(100 * 365 * 86_400);
        for (field, sub) in [
            ("block", RedisStream::new("s").group("g").block(century)),
            (
                "max_delay",
                RedisStream::new("s").group("g").max_delay(century),
            ),
            (
                "failure_backoff.max",
                RedisStream::new("s").group("g").failure_backoff(Backoff {
                    initial: Duration::from_secs(1),
                    max: century,
                }),
            ),
            (
                "delayed_retry ttl",
                RedisStream::new("s")
                    .group("g")
                    .delayed_retry(DelayedRetry::durable_zset("k").with_ttl(century)),
            ),
        ] {
            let err = sub.resolve().unwrap_err().to_string();
            assert!(err.contains(field) && err.contains("3650 days"), "{err}");
        }
    }

    #[test]
    fn producers_choose_partitions_like_zlib_crc32() {
        // Python: zlib.crc32(b"acct-42") == 1198172233; 1198172233 % 8 == 1.
        assert_eq!(partition_for(b"acct-42", 8), 1);
        assert_eq!(
            partition_stream("payments", 8, b"acct-42"),
            "payments:{payments:1}"
        );
        assert_eq!(partition_stream("payments", 1, b"acct-42"), "payments");
    }

    #[test]
    fn the_short_constructor_is_the_long_form() {
        assert_eq!(
            DelayedRetry::durable_zset("s.delayed"),
            DelayedRetry::DurableZset {
                key: "s.delayed".into(),
                ttl: None
            }
        );
        let hour = Duration::from_secs(3600);
        assert_eq!(
            DelayedRetry::durable_zset("s.delayed").with_ttl(hour),
            DelayedRetry::DurableZset {
                key: "s.delayed".into(),
                ttl: Some(hour)
            }
        );
    }

    #[test]
    fn missing_group_is_named() {
        let err = RedisStream::new("orders").resolve().unwrap_err();
        assert!(err.to_string().contains("`orders`"), "{err}");
    }

    #[test]
    fn ttl_below_max_delay_is_refused() {
        let err = RedisStream::new("s")
            .group("g")
            .max_delay(Duration::from_secs(60))
            .delayed_retry(DelayedRetry::DurableZset {
                key: "s.delayed".into(),
                ttl: Some(Duration::from_secs(30)),
            })
            .resolve()
            .unwrap_err();
        assert!(err.to_string().contains("s.delayed"), "{err}");
        assert!(err.to_string().contains("30s"), "{err}");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(700),
        };
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(400));
        assert_eq!(b.delay(3), Duration::from_millis(700));
        assert_eq!(b.delay(200), Duration::from_millis(700));
    }
}
