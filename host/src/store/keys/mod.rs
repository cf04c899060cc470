//! Every Redis key name and bookkeeping field the host writes, in one place, and the seal that
//! makes the host's bookkeeping trusted.
//!
//! Bookkeeping fields start with `sluice-`. A retry copy's (and a dead letter's) bookkeeping is
//! trusted only together with its [`MARK`], a seal keyed with the stream's [`Secret`] over the
//! copy's own fields, its stream and its group; a producer's own `sluice-*` fields are its data
//! like any other.

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
/// The host's seal over the bookkeeping of a retry copy or a dead letter, the copy's own fields,
/// its stream and its group: what makes those fields trusted. See [`Secret::seal`].
pub const MARK: &str = "sluice-mark";
/// On a retry copy in the retry lane: the parked member itself (MessagePack, see
/// `member`), which carries the entry's fields and its bookkeeping whatever their
/// number.
pub const PARKED: &str = "sluice-parked";
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
/// about 8,000 values. An entry with more is written with its fields packed into one value
/// (see [`PACKED_FIELDS`]).
pub const SCRIPT_MAX_FIELDS: usize = 3_000;
/// The stream a dead-lettered entry came from.
pub const ORIGIN_STREAM: &str = "sluice-origin-stream";
/// The consumer group that gave up on a dead-lettered entry, or that parked the retry a copy at
/// the stream's tail brings back.
pub const ORIGIN_GROUP: &str = "sluice-origin-group";
/// Why an entry was dead-lettered.
pub const REASON: &str = "sluice-reason";
/// The traceback of the failure that dead-lettered an entry, when its handler gave one; the
/// last field of the dead letter.
pub const TRACE: &str = "sluice-trace";
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

/// Which entries of a subscription's streams were there before this release first used them: a
/// hash, key name -> the last id the key had then (`0-0`: it did not exist). Only those entries
/// may carry the earlier release's unsealed bookkeeping (its copies' marks, its dead letters):
/// Redis gives every later entry a greater id, whoever adds it. In the stream's hash slot.
pub fn legacy_marks_key(stream: &str) -> String {
    format!("sluice-legacy-marks:{{{}}}:{stream}", hash_tag(stream))
}

/// Where a subscription's flow controls (its pause) are kept: a hash in the stream's hash
/// slot. The stream's length comes first, so no two (stream, group) pairs share a key whatever
/// their names hold.
pub fn flow_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-flow:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// The lease that makes one host at a time trim `stream` (a stream, or a dead-letter stream):
/// one per stream (streams that share a hash tag are trimmed each by its own holder), in the
/// stream's slot.
pub fn retention_lease_key(stream: &str) -> String {
    format!("sluice-retention:{{{}}}:{stream}", hash_tag(stream))
}

/// Where the last run's record of `stream` is kept (one per stream, in its slot).
pub fn retention_record_key(stream: &str) -> String {
    format!("sluice-retention-last:{{{}}}:{stream}", hash_tag(stream))
}

/// A subscription's shared rate-limit bucket (see `admit::rate`): a hash in the stream's hash
/// slot, named like [`flow_key`].
pub fn rate_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-rate:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// A subscription's circuit-breaker window (see `admit::breaker`): a hash in the stream's hash
/// slot (beside [`flow_key`], which its scripts use with it), named like it.
pub fn breaker_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-breaker:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// A subscription's delivery counts for the whole group (see `admit::stats`): a hash in the
/// stream's hash slot, named like [`flow_key`].
pub fn stats_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-stats:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// A subscription's flow journal (see `admit::journal`): a capped stream in the stream's hash
/// slot (beside [`flow_key`], which the breaker's scripts use with it), named like it.
pub fn journal_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-journal:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// A subscription's entry histories (see `history`): one hash in the stream's hash slot, a
/// field per entry, named like [`flow_key`]; [`history_index_key`] orders them by when each
/// may go. One pair of keys per subscription, however many entries retried.
pub fn history_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-histories:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// The index of [`history_key`]'s entries: a sorted set of origin ids by the time (ms) each
/// history may be removed.
pub fn history_index_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-histories-index:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// Where the earlier release kept one entry's history: a list per entry. Read (never written)
/// until it expires, 7 days after its last record.
pub fn legacy_history_key(stream: &str, group: &str, origin_id: &str) -> String {
    format!(
        "sluice-history:{{{}}}:{}:{stream}:{group}:{origin_id}",
        hash_tag(stream),
        stream.len()
    )
}

/// A canary's counts for the whole group (see `rollout::canary`): a hash in the stream's hash
/// slot (beside [`flow_key`], which the canary's scripts use with it), named like it.
pub fn canary_key(stream: &str, group: &str) -> String {
    format!(
        "sluice-canary:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// A component a canary tries, by its SHA-256 digest (lower-case hex), where every host of the
/// stream's groups fetches it from: a string in the stream's hash slot.
pub fn component_key(stream: &str, digest: &str) -> String {
    format!(
        "sluice-component:{{{}}}:{}:{stream}:{digest}",
        hash_tag(stream),
        stream.len()
    )
}

/// Bumped after every change of any subscription's flow controls on this Redis: hosts poll
/// this one key, and read the subscriptions' own keys only when it moves.
pub const FLOW_EPOCH: &str = "sluice-flow-epoch";

/// Which flow hashes changed, newest last: a capped stream in [`FLOW_EPOCH`]'s hash slot (its
/// hash tag is that key's whole name), so a host re-reads only what changed when the epoch
/// moves.
pub const FLOW_CHANGES: &str = "{sluice-flow-epoch}:changes";

/// Where the owner of `key` (a delayed set, a retry lane, a dead-letter stream) is recorded:
/// the first subscription to use the key claims it, and a different one is refused at start.
/// In the key's own hash slot (the prefix has no braces).
pub fn claim_key(key: &str) -> String {
    format!("sluice-claim:{key}")
}

/// What a producer's field named like the host's own gets in front of its name in a dead
/// letter, so that a reader that keeps the first value of a name (`sluice-reason`,
/// `sluice-origin-id`) reads the host's, never a producer's forgery.
pub const PRODUCER_PREFIX: &str = "producer:";

/// A producer's field name as a dead letter keeps it: one starting with `sluice-` (the host's
/// names) or with [`PRODUCER_PREFIX`] gets the prefix, so that [`producer_name`] gives back
/// exactly what the producer wrote.
pub fn escaped_name(name: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if name.starts_with(FIELD_PREFIX.as_bytes()) || name.starts_with(PRODUCER_PREFIX.as_bytes()) {
        let mut out = PRODUCER_PREFIX.as_bytes().to_vec();
        out.extend_from_slice(name);
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// The name a producer wrote, from a dead letter's (see [`escaped_name`]).
pub fn producer_name(name: &[u8]) -> &[u8] {
    name.strip_prefix(PRODUCER_PREFIX.as_bytes())
        .unwrap_or(name)
}

/// A list of byte strings as MessagePack: an array of str, each with the shortest header, as
/// Lua's `cmsgpack.pack` writes a table of strings (so Rust and the scripts hash the same bytes;
/// every part's length is in it, so no two lists read the same).
fn packed_strs<'a>(parts: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_array_len(&mut out, parts.len() as u32);
    for part in parts {
        let _ = rmp::encode::write_str_len(&mut out, part.len() as u32);
        out.extend_from_slice(part);
    }
    out
}

/// The digest of a list of fields that a seal covers instead of the fields themselves: SHA-1
/// (hex) of every name and value in order, packed as `keys/lua/seal.lua` packs them.
pub fn fields_digest(fields: &[(Vec<u8>, Vec<u8>)]) -> String {
    use sha1::Digest as _;
    let flat = fields
        .iter()
        .flat_map(|(name, value)| [name.as_slice(), value.as_slice()]);
    let flat: Vec<&[u8]> = flat.collect();
    hex::encode(sha1::Sha1::digest(packed_strs(flat.into_iter())))
}

/// What a seal is for: the first part of every seal, so a seal made for one use never verifies
/// for another (a lane copy's seal on a dead letter, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    /// A retry copy in the retry lane: over the stream, group, member and due time.
    Lane,
    /// A retry copy at the stream's tail: over the stream, the group that parked it, origin id,
    /// retry count, due time and the digest of the copy's fields.
    Tail,
    /// The same, when the copy carries the fields packed into one (too many for one XADD): a
    /// use of its own, so a producer's field that happens to be called `sluice-packed-fields`
    /// is never unpacked.
    TailPacked,
    /// A dead letter: over the stream, group, origin id and the digest of its fields.
    DeadLetter,
    /// The same, with the fields packed into one.
    DeadLetterPacked,
    /// A parked member the host dead-lettered raw: over its set, stream, group and the member.
    Member,
}

impl Seal {
    /// The name the scripts are given for it.
    pub fn name(self) -> &'static str {
        match self {
            Seal::Lane => "lane",
            Seal::Tail => "tail",
            Seal::TailPacked => "tail-packed",
            Seal::DeadLetter => "dead-letter",
            Seal::DeadLetterPacked => "dead-letter-packed",
            Seal::Member => "member",
        }
    }
}

/// A random value shared by every host of a stream (kept in Redis under [`secret_key`]) that
/// keys the host's seals ([`MARK`]). A producer that writes `sluice-retry-count` itself cannot
/// make a matching seal, so its fields change nothing about how attempts are counted; and since
/// a seal covers the fields it sits with, a seal copied onto other fields verifies for none.
///
/// A seal is `sha1(secret ‖ sha1(secret ‖ message))` in hex, the message being the use and the
/// parts it covers packed as MessagePack (an array of str): a keyed hash Redis's Lua can compute
/// (`redis.sha1hex`, `cmsgpack.pack`), with the outer round against length extension.
///
/// With the secret come the legacy cutoffs (see [`legacy_marks_key`]): which entries, per key,
/// may carry the earlier release's unsealed bookkeeping.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Key name -> the last id it had when this release first used it.
    legacy: std::collections::HashMap<String, String>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `lua/secret.lua`: the stream's secret and the legacy cutoffs of a subscription's keys.
static LOAD: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(crate::store::lua!("store/keys/lua/secret")));

/// Why the stream's secret could not be read or made. Never says the secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Redis refused or could not be reached.
    #[error("cannot read or create the secret of stream `{stream}` (`{key}`)")]
    Redis {
        /// The stream.
        stream: String,
        /// The secret's key.
        key: String,
        /// What Redis said.
        #[source]
        error: redis::RedisError,
    },
    /// The secret's key or the legacy record holds something else than this release writes.
    #[error(
        "the secret of stream `{stream}` or its legacy record (`{key}`, `{record}`) holds a value Sluice did not write; delete both for the host to make them anew (the bookkeeping of retries on their way and the origin of dead letters will not be trusted)"
    )]
    Malformed {
        /// The stream.
        stream: String,
        /// The secret's key.
        key: String,
        /// The legacy record's key.
        record: String,
    },
}

impl Secret {
    /// The stream's secret, created (SET NX) by whichever host comes first when `create`; and
    /// the legacy cutoffs of `keys` (the subscription's stream, lane and dead-letter streams),
    /// recorded the first time a host of this release uses each. `None` when there is no secret
    /// and `create` is false (a subscription without a set never creates one).
    pub async fn load_with<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
        keys: &[&str],
        create: bool,
    ) -> Result<Option<Self>, SecretError> {
        let mut bytes = [0u8; 20];
        getrandom::fill(&mut bytes).map_err(|e| SecretError::Redis {
            stream: stream.to_owned(),
            key: secret_key(stream),
            error: redis::RedisError::from((
                redis::ErrorKind::Client,
                "no randomness for the stream secret",
                e.to_string(),
            )),
        })?;
        let mut invocation = LOAD.key(secret_key(stream));
        invocation
            .key(legacy_marks_key(stream))
            .arg(hex::encode(bytes))
            .arg(u8::from(create));
        for key in keys {
            invocation.key(*key);
        }
        let reply: redis::Value =
            invocation
                .invoke_async(conn)
                .await
                .map_err(|error| SecretError::Redis {
                    stream: stream.to_owned(),
                    key: secret_key(stream),
                    error,
                })?;
        // Parsed by hand: a conversion error would print the value, and this one is the secret.
        let malformed = || SecretError::Malformed {
            stream: stream.to_owned(),
            key: secret_key(stream),
            record: legacy_marks_key(stream),
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let redis::Value::Array(items) = reply else {
            return Err(malformed());
        };
        let Some((first, cutoffs)) = items.split_first() else {
            return Err(malformed());
        };
        let value = match first {
            redis::Value::Nil | redis::Value::Boolean(false) => return Ok(None),
            v => text(v).ok_or_else(malformed)?,
        };
        let mut legacy = std::collections::HashMap::new();
        for (key, cutoff) in keys.iter().zip(cutoffs) {
            let cutoff = text(cutoff)
                .filter(|c| is_stream_id(c))
                .ok_or_else(malformed)?;
            legacy.insert((*key).to_owned(), cutoff);
        }
        Ok(Some(Self { value, legacy }))
    }

    /// The stream's secret, created by whichever host comes first, with the legacy cutoffs of
    /// `keys` (see [`Self::load_with`]).
    pub async fn load_or_create<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
        keys: &[&str],
    ) -> Result<Self, SecretError> {
        Self::load_with(conn, stream, keys, true)
            .await?
            .ok_or_else(|| SecretError::Malformed {
                stream: stream.to_owned(),
                key: secret_key(stream),
                record: legacy_marks_key(stream),
            })
    }

    /// The stream's secret if some host with a delayed-retry set made one, with the legacy
    /// cutoffs of `keys`; a subscription without a set never creates the key (a set, and what
    /// it costs, is opt-in).
    pub async fn load<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
        keys: &[&str],
    ) -> Result<Option<Self>, SecretError> {
        Self::load_with(conn, stream, keys, false).await
    }

    /// A secret with a known value (tests), trusting no bookkeeping of the earlier release.
    pub fn from_value(value: &str) -> Self {
        Self {
            value: value.to_owned(),
            legacy: std::collections::HashMap::new(),
        }
    }

    /// The same secret, trusting the earlier release's bookkeeping on the entries of `key` up to
    /// id `cutoff` (tests).
    pub fn with_legacy_cutoff(mut self, key: &str, cutoff: &str) -> Self {
        self.legacy.insert(key.to_owned(), cutoff.to_owned());
        self
    }

    /// The value, to hand to the scripts.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The seal for `use_` over `parts`.
    pub fn seal(&self, use_: Seal, parts: &[&[u8]]) -> String {
        use sha1::Digest as _;
        let all = std::iter::once(use_.name().as_bytes()).chain(parts.iter().copied());
        let all: Vec<&[u8]> = all.collect();
        let inner = sha1::Sha1::new()
            .chain_update(self.value.as_bytes())
            .chain_update(packed_strs(all.into_iter()))
            .finalize();
        let outer = sha1::Sha1::new()
            .chain_update(self.value.as_bytes())
            .chain_update(hex::encode(inner).as_bytes())
            .finalize();
        hex::encode(outer)
    }

    /// Whether `mark` is the seal for `use_` over `parts` (compared in constant time).
    pub fn verify(&self, use_: Seal, parts: &[&[u8]], mark: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        self.seal(use_, parts).as_bytes().ct_eq(mark).into()
    }

    /// The earlier release's mark over a re-added retry's bookkeeping (stream, origin, retry
    /// count and due time; not the fields, nor the group): what hosts of that release wrote.
    pub fn legacy_mark(&self, stream: &str, origin: &str, retry: &str, due: &str) -> String {
        use sha1::Digest as _;
        let message = format!("{}:{stream}:{origin}:{retry}:{due}", stream.len());
        let inner = hex::encode(sha1::Sha1::digest(format!("{}{message}", self.value)));
        hex::encode(sha1::Sha1::digest(format!("{}{inner}", self.value)))
    }

    /// Whether entry `entry_id` of `key` was there before this release first used the key, so
    /// it may carry the earlier release's unsealed bookkeeping.
    pub fn trusts_legacy(&self, key: &str, entry_id: &str) -> bool {
        self.legacy
            .get(key)
            .is_some_and(|cutoff| cutoff != "0-0" && cmp_ids(entry_id, cutoff).is_le())
    }

    /// Whether `mark` is the earlier release's mark over this bookkeeping, on entry `entry_id` of
    /// `key`, old enough to carry one.
    pub fn verify_legacy(
        &self,
        key: &str,
        entry_id: &str,
        [stream, origin, retry, due]: [&str; 4],
        mark: &str,
    ) -> bool {
        use subtle::ConstantTimeEq as _;
        if !self.trusts_legacy(key, entry_id) {
            return false;
        }
        let expected = self.legacy_mark(stream, origin, retry, due);
        expected.as_bytes().ct_eq(mark.as_bytes()).into()
    }
}

/// Whether `id` is a stream entry id (`<ms>-<seq>`, digits only, each part at most 20 digits
/// as a 64-bit number is): what may name an entry in a key, a cursor or a lookup.
pub fn is_stream_id(id: &str) -> bool {
    let Some((ms, seq)) = id.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    digits(ms) && digits(seq)
}

/// Order stream ids numerically (`ms-seq`, each part up to 2^64 - 1).
pub fn cmp_ids(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(id: &str) -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    }
    parts(a).cmp(&parts(b))
}

/// A subscription's keys that Redis Cluster would put on different slots.
#[derive(Debug, thiserror::Error)]
#[error(
    "Redis is a cluster and the keys of the subscription to `{stream}` hash to different slots ({slots}); the park, sweep and dead-letter scripts touch them together and would fail with CROSSSLOT. Give them one hash tag, e.g. stream `{{{tag}}}`, delayed set `{{{tag}}}.delayed`, dead letter `{{{tag}}}.<group>.dead-letter`"
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
    /// (see [`Secret::load_with`]).
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

/// A key another subscription claimed first.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{key}` is the {role} of {owner}, and this subscription (stream `{stream}` group `{group}`) would use it as its {our_role}: one would take, trim or read the other's entries; give this subscription a key of its own (or, if {owner} no longer runs: its claim lapses a day after its last host stopped, or delete it now: DEL {claim}; retries it left parked in a set are then dead-lettered by this subscription, where they can be requeued)"
)]
pub struct Claimed {
    /// The key.
    pub key: String,
    /// What it is for the subscription that claimed it.
    pub role: String,
    /// That subscription, as recorded.
    pub owner: String,
    /// What it would be for this one.
    pub our_role: &'static str,
    /// This subscription's stream.
    pub stream: String,
    /// This subscription's group.
    pub group: String,
    /// The claim's own key.
    pub claim: String,
}

/// Why the keys of a subscription could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another subscription has one of them.
    #[error(transparent)]
    Claimed(#[from] Claimed),
    /// Redis could not be asked.
    #[error("cannot record which subscription owns its keys")]
    Redis(#[from] redis::RedisError),
}

/// `lua/claim.lua`.
static CLAIM: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(crate::store::lua!("store/keys/lua/claim")));

/// What a stream read by subscriptions is, in its claim.
const STREAM_ROLE: &str = "stream";
/// What a dead-letter stream is, in its claim (another subscription may read it as a stream).
const DEAD_LETTER_ROLE: &str = "dead-letter stream";

/// Who claims a key, as the claims name it (JSON): the stream, and the group for the keys only
/// one subscription may use.
fn owner_of(stream: &str, group: Option<&str>) -> String {
    match group {
        Some(group) => serde_json::json!({ "stream": stream, "group": group }),
        None => serde_json::json!({ "stream": stream }),
    }
    .to_string()
}

/// The default dead-letter stream of the subscription a claim's owner names, if it names one.
fn default_dead_letter_of(owner: &str) -> Option<String> {
    let parsed: serde_json::Value = serde_json::from_str(owner).ok()?;
    let stream = parsed.get("stream")?.as_str()?;
    let group = parsed.get("group")?.as_str()?;
    Some(sluice_descriptor::default_dead_letter(stream, group))
}

/// The subscription a claim's owner names, for a message.
fn describe_owner(owner: &str) -> String {
    let parsed = serde_json::from_str::<serde_json::Value>(owner).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name)?.as_str().map(str::to_owned))
    };
    match (field("stream"), field("group")) {
        (Some(stream), Some(group)) => format!("stream `{stream}` group `{group}`"),
        (Some(stream), None) => format!("the subscriptions to stream `{stream}`"),
        _ => format!("the subscription recorded as {owner:?}"),
    }
}

/// How long a claim lasts unless its subscription renews it: a subscription gone (every host of
/// it stopped) for this long no longer holds its keys, and another may take them.
pub const CLAIM_LEASE: std::time::Duration = std::time::Duration::from_secs(86_400);
/// How often a running subscription renews its claims.
pub const CLAIM_RENEW: std::time::Duration = std::time::Duration::from_secs(3_600);

/// Claim the keys of this subscription in Redis: its stream (shared by every group that reads
/// it), and the keys only it may use (its delayed set, retry lane and dead-letter stream). The
/// first to use a key holds it, across hosts and configs, for [`CLAIM_LEASE`] after its last
/// claim (a running subscription claims again every [`CLAIM_RENEW`]), and a different one is
/// refused here, before it reads, with an error naming both. Every host of one subscription
/// (one stream and group) shares them. A dead-letter stream is read as a stream only under its
/// owner's default name (a subscription that handles dead letters): one named after another
/// subscription's stream never feeds it.
pub async fn claim<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
) -> Result<(), ClaimError> {
    let (stream, group) = (&*keys.stream, &*keys.group);
    let mut owned: Vec<(&str, &'static str, Option<&str>)> = vec![
        (stream, STREAM_ROLE, None),
        (&keys.dead_letter, DEAD_LETTER_ROLE, Some(group)),
    ];
    owned.extend(
        keys.delayed
            .as_deref()
            .map(|k| (k, "delayed-retry set", Some(group))),
    );
    owned.extend(keys.lane.as_deref().map(|k| (k, "retry lane", Some(group))));
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let lease = u64::try_from(CLAIM_LEASE.as_millis()).unwrap_or(u64::MAX);
    // Keys found to be another's dead-letter stream under its default name, which this one may
    // read as its stream: claimed again with them allowed (one more call, only then).
    let mut readable = String::new();
    let (i, owner, role) = loop {
        let mut invocation = CLAIM.prepare_invoke();
        for (key, role, group) in &owned {
            invocation
                .key(claim_key(key))
                .arg(owner_of(stream, *group))
                .arg(*role);
        }
        invocation
            .arg(DEAD_LETTER_ROLE)
            .arg(STREAM_ROLE)
            .arg(lease)
            .arg(&readable);
        let conflict: Vec<redis::Value> = invocation.invoke_async(conn).await?;
        let [index, owner, role] = conflict.as_slice() else {
            return Ok(());
        };
        let i = match index {
            redis::Value::Int(i) => usize::try_from(*i).unwrap_or(1).max(1),
            _ => 1,
        };
        let (owner, role) = (text(owner), text(role));
        let (key, our_role, _) = owned.get(i - 1).copied().unwrap_or(owned[0]);
        let marker = format!(",{i},");
        if role == DEAD_LETTER_ROLE
            && our_role == STREAM_ROLE
            && !readable.contains(&marker)
            && default_dead_letter_of(&owner).as_deref() == Some(key)
        {
            readable = format!("{readable},{i},");
            continue;
        }
        break (i - 1, owner, role);
    };
    let (key, our_role, _) = owned.get(i).copied().unwrap_or(owned[0]);
    Err(Claimed {
        key: key.to_owned(),
        role,
        owner: describe_owner(&owner),
        our_role,
        stream: stream.to_owned(),
        group: group.to_owned(),
        claim: claim_key(key),
    }
    .into())
}

/// On a Redis Cluster, check that every key of the subscription shares the stream's slot; on a
/// plain server, do nothing.
pub async fn check_same_slot(
    conn: &mut crate::store::redis_conn::RedisHandle,
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
