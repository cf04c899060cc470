//! Every Redis key name and bookkeeping field the host writes, in one place.
//!
//! Bookkeeping fields start with `sluice-`. The ones the sweep appends to a re-added retry are
//! trusted only together with their [`MARK`], keyed with the stream's [`Secret`]; a producer's
//! own `sluice-*` fields are its data like any other.

use std::sync::Arc;

/// The prefix of every field the host adds to an entry.
pub const FIELD_PREFIX: &str = "sluice-";
/// How many times the entry was parked and re-added (absent means 0).
pub const RETRY_COUNT: &str = "sluice-retry-count";
/// The id of the entry the producer first added: kept through every park, recorded on the
/// re-added copies and on the dead letter.
pub const ORIGIN_ID: &str = "sluice-origin-id";
/// The id of the entry that was dead-lettered (the origin, or the sweep's last copy of it).
pub const ENTRY_ID: &str = "sluice-entry-id";
/// When a parked retry was due (server clock, epoch ms), set by the sweep; it measures how
/// late the retry came back.
pub const DUE_MS: &str = "sluice-due-ms";
/// The sweep's mark over the bookkeeping it appended (retry count, origin id, due time): what
/// makes those fields trusted. See [`Secret`].
pub const MARK: &str = "sluice-mark";
/// Set on a dead letter whose fields were too many for one command from a script: the fields
/// are packed into this one value (MessagePack `[name, value, ...]`).
pub const PACKED_FIELDS: &str = "sluice-packed-fields";
/// A raw delayed-set member that could not be moved back onto the stream (dead-lettered).
pub const MEMBER: &str = "sluice-member";
/// On an entry an operator requeued from the dead-letter stream: the dead letter's id.
pub const REQUEUED_FROM: &str = "sluice-requeued-from";
/// The delayed-set key a dead-lettered member came from.
pub const ORIGIN_KEY: &str = "sluice-origin-key";

/// The most fields (name/value pairs) a script can hand to one XADD: Lua's `unpack` stops at
/// about 8,000 values. An entry with more is parked or dead-lettered differently (see
/// [`PACKED_FIELDS`]).
pub const SCRIPT_MAX_FIELDS: usize = 3_000;
/// The stream a dead-lettered entry came from.
pub const ORIGIN_STREAM: &str = "sluice-origin-stream";
/// The consumer group that gave up on a dead-lettered entry.
pub const ORIGIN_GROUP: &str = "sluice-origin-group";
/// Why an entry was dead-lettered.
pub const REASON: &str = "sluice-reason";
/// How many times Redis had delivered the entry when it was dead-lettered.
pub const DELIVERY_COUNT: &str = "sluice-delivery-count";

/// The part of `key` Redis Cluster hashes: the text between the first `{` and the next `}` if
/// it is not empty, else the whole key.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The retry lane of the delayed set `set`: a stream in the set's hash slot (it carries the
/// set's hash tag, if any).
pub fn lane_key(set: &str) -> String {
    format!("{set}.lane")
}

/// Where a stream's [`Secret`] is kept: in the stream's hash slot, so scripts can use it with
/// the stream on a cluster.
pub fn secret_key(stream: &str) -> String {
    format!("sluice-secret:{{{}}}", hash_tag(stream))
}

/// A random value shared by every host of a stream (kept in Redis under [`secret_key`]) that
/// keys the sweep's [`MARK`]. A producer that writes `sluice-retry-count` itself cannot make a
/// matching mark, so its fields change nothing about how attempts are counted.
///
/// The mark is `sha1(secret ‖ sha1(secret ‖ message))` in hex, the message being the stream
/// (length-prefixed), origin id, retry count and due time: a keyed hash Redis's Lua can compute
/// (`redis.sha1hex`), with the outer round against length extension.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    /// The stream's secret, created (SET NX) by whichever host comes first.
    pub async fn load_or_create<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
    ) -> redis::RedisResult<Self> {
        let key = secret_key(stream);
        let mut bytes = [0u8; 20];
        getrandom::fill(&mut bytes).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::Client,
                "no randomness for the stream secret",
                e.to_string(),
            ))
        })?;
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(hex::encode(bytes))
            .arg("NX")
            .query_async(conn)
            .await?;
        let secret: String = redis::cmd("GET").arg(&key).query_async(conn).await?;
        Ok(Self(secret))
    }

    /// The stream's secret if some host with a delayed-retry set made one; a subscription
    /// without a set never creates the key (a set, and what it costs, is opt-in).
    pub async fn load<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
    ) -> redis::RedisResult<Option<Self>> {
        let secret: Option<String> = redis::cmd("GET")
            .arg(secret_key(stream))
            .query_async(conn)
            .await?;
        Ok(secret.map(Self))
    }

    /// A secret with a known value (tests).
    pub fn from_value(value: &str) -> Self {
        Self(value.to_owned())
    }

    /// The value, to hand to the sweep script.
    pub fn value(&self) -> &str {
        &self.0
    }

    /// The mark over one re-added retry's bookkeeping.
    pub fn mark(&self, stream: &str, origin: &str, retry: &str, due: &str) -> String {
        use sha1::Digest as _;
        let message = format!("{}:{stream}:{origin}:{retry}:{due}", stream.len());
        let inner = hex::encode(sha1::Sha1::digest(format!("{}{message}", self.0)));
        hex::encode(sha1::Sha1::digest(format!("{}{inner}", self.0)))
    }

    /// Whether `mark` is this secret's mark over the bookkeeping (compared in constant time).
    pub fn verify(&self, stream: &str, origin: &str, retry: &str, due: &str, mark: &str) -> bool {
        use subtle::ConstantTimeEq as _;
        let expected = self.mark(stream, origin, retry, due);
        expected.as_bytes().ct_eq(mark.as_bytes()).into()
    }
}

/// A subscription's keys that Redis Cluster would put on different slots.
#[derive(Debug, thiserror::Error)]
#[error(
    "Redis is a cluster and the keys of the subscription to `{stream}` hash to different slots ({slots}); the park, sweep and dead-letter scripts touch them together and would fail with CROSSSLOT. Give them one hash tag, e.g. stream `{{{tag}}}`, delayed set `{{{tag}}}.delayed`, dead letter `{{{tag}}}.dead-letter`"
)]
pub struct CrossSlot {
    /// The subscription's stream.
    pub stream: String,
    /// Each key with its slot.
    pub slots: String,
    /// A suggested hash tag.
    pub tag: String,
}

/// Why the cluster check could not be made or failed.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The keys hash to different slots.
    #[error(transparent)]
    CrossSlot(#[from] CrossSlot),
    /// Redis could not be asked.
    #[error("cannot check whether Redis is a cluster")]
    Redis(#[from] redis::RedisError),
}

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
}

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
        }
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

    /// The same keys, with the dead-letter stream trimmed to about `maxlen` entries.
    pub fn with_dead_letter_maxlen(mut self, maxlen: Option<u64>) -> Self {
        self.dead_letter_maxlen = maxlen;
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

/// On a Redis Cluster, check that every key of the subscription shares the stream's slot; on a
/// plain server, do nothing.
pub async fn check_same_slot(
    conn: &mut crate::redis_conn::RedisHandle,
    keys: &SubscriptionKeys,
) -> Result<(), SlotError> {
    let stream = &*keys.stream;
    let others = keys.with_stream();
    if !conn.is_cluster() {
        return Ok(());
    }
    let mut slots = Vec::with_capacity(others.len() + 1);
    for key in std::iter::once(stream).chain(others.iter().map(String::as_str)) {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(conn)
            .await?;
        slots.push((key.to_string(), slot));
    }
    if slots.iter().all(|(_, s)| *s == slots[0].1) {
        return Ok(());
    }
    let tag = match (stream.find('{'), stream.find('}')) {
        (Some(open), Some(close)) if close > open + 1 => stream[open + 1..close].to_owned(),
        _ => stream.to_owned(),
    };
    Err(CrossSlot {
        stream: stream.to_owned(),
        slots: slots
            .iter()
            .map(|(k, s)| format!("`{k}` -> {s}"))
            .collect::<Vec<_>>()
            .join(", "),
        tag,
    }
    .into())
}
