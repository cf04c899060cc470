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

/// Until when (server clock, epoch ms) marks of the earlier release's form are trusted on
/// `stream`: an entry whose id is older than that value. Set once, by the first host of this
/// release to start on the stream, to then plus [`LEGACY_MARK_GRACE`].
pub fn legacy_marks_key(stream: &str) -> String {
    format!("sluice-legacy-marks:{{{}}}:{stream}", hash_tag(stream))
}

/// How long after the first host of this release started on a stream the earlier release's
/// marks are still trusted on new entries: the time a rolling upgrade may take, while hosts of
/// the earlier release still write copies. Copies written later by such a host are handled as
/// new entries (their origin id and retry count are not trusted).
pub const LEGACY_MARK_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Where the owner of `key` (a delayed set, a retry lane, a dead-letter stream) is recorded:
/// the first subscription to use the key claims it, and a different one is refused at start.
/// In the key's own hash slot (the prefix has no braces).
pub fn claim_key(key: &str) -> String {
    format!("sluice-claim:{key}")
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
    /// A dead letter: over the stream, group, origin id and the digest of its fields.
    DeadLetter,
    /// A parked member the host dead-lettered raw: over its set, stream, group and the member.
    Member,
}

impl Seal {
    /// The name the scripts are given for it.
    pub fn name(self) -> &'static str {
        match self {
            Seal::Lane => "lane",
            Seal::Tail => "tail",
            Seal::DeadLetter => "dead-letter",
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
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Marks of the earlier release's form are trusted on entries older than this (epoch ms).
    legacy_until_ms: Option<i64>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `lua/secret.lua`: the stream's secret and its legacy-marks deadline, made by the first host.
static LOAD_OR_CREATE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("lua/secret.lua")));

impl Secret {
    /// The stream's secret, created (SET NX) by whichever host comes first, with the moment
    /// until which the earlier release's marks are trusted (set by the first host of this
    /// release).
    pub async fn load_or_create<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
    ) -> redis::RedisResult<Self> {
        let mut bytes = [0u8; 20];
        getrandom::fill(&mut bytes).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::Client,
                "no randomness for the stream secret",
                e.to_string(),
            ))
        })?;
        let grace_ms = LEGACY_MARK_GRACE.as_millis() as u64;
        let (value, until): (String, i64) = LOAD_OR_CREATE
            .key(secret_key(stream))
            .key(legacy_marks_key(stream))
            .arg(hex::encode(bytes))
            .arg(grace_ms)
            .invoke_async(conn)
            .await?;
        Ok(Self {
            value,
            legacy_until_ms: Some(until),
        })
    }

    /// The stream's secret if some host with a delayed-retry set made one; a subscription
    /// without a set never creates the key (a set, and what it costs, is opt-in).
    pub async fn load<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
    ) -> redis::RedisResult<Option<Self>> {
        let (value, until): (Option<String>, Option<i64>) = redis::pipe()
            .cmd("GET")
            .arg(secret_key(stream))
            .cmd("GET")
            .arg(legacy_marks_key(stream))
            .query_async(conn)
            .await?;
        Ok(value.map(|value| Self {
            value,
            legacy_until_ms: until,
        }))
    }

    /// A secret with a known value (tests), trusting no mark of the earlier release.
    pub fn from_value(value: &str) -> Self {
        Self {
            value: value.to_owned(),
            legacy_until_ms: None,
        }
    }

    /// The same secret, trusting the earlier release's marks on entries older than `until_ms`.
    pub fn with_legacy_until(mut self, until_ms: i64) -> Self {
        self.legacy_until_ms = Some(until_ms);
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

    /// Whether an entry with id `entry_id` may carry a mark of the earlier release's form: it
    /// was written before this release's hosts took over the stream (plus the grace).
    pub fn trusts_legacy(&self, entry_id: &str) -> bool {
        let written_ms = entry_id
            .split_once('-')
            .and_then(|(ms, _)| ms.parse::<i64>().ok());
        matches!((self.legacy_until_ms, written_ms), (Some(until), Some(ms)) if ms < until)
    }

    /// Whether `mark` is the earlier release's mark over this bookkeeping, on an entry (`entry_id`)
    /// old enough to carry one.
    pub fn verify_legacy(
        &self,
        entry_id: &str,
        [stream, origin, retry, due]: [&str; 4],
        mark: &str,
    ) -> bool {
        use subtle::ConstantTimeEq as _;
        if !self.trusts_legacy(entry_id) {
            return false;
        }
        let expected = self.legacy_mark(stream, origin, retry, due);
        expected.as_bytes().ct_eq(mark.as_bytes()).into()
    }
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
            legacy_dead_letter: None,
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

/// A key another subscription claimed first.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{key}` is the {role} of {owner}, and this subscription (stream `{stream}` group `{group}`) would use it as its {our_role}: each would take or trim the other's retries or dead letters; give this subscription a key of its own (or, if {owner} no longer exists, delete its claim: DEL {claim})"
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
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("lua/claim.lua")));

/// A subscription as its claims name it: the stream and group, as JSON.
fn owner_of(stream: &str, group: &str) -> String {
    serde_json::json!({ "stream": stream, "group": group }).to_string()
}

/// The subscription a claim's owner names, for a message.
fn describe_owner(owner: &str) -> String {
    let parsed: Option<(String, String)> = serde_json::from_str::<serde_json::Value>(owner)
        .ok()
        .and_then(|v| {
            Some((
                v.get("stream")?.as_str()?.to_owned(),
                v.get("group")?.as_str()?.to_owned(),
            ))
        });
    match parsed {
        Some((stream, group)) => format!("stream `{stream}` group `{group}`"),
        None => format!("the subscription recorded as {owner:?}"),
    }
}

/// Claim the keys only this subscription may use (its delayed set, retry lane and dead-letter
/// stream) in Redis: the first subscription to use a key owns it, across hosts and configs, and
/// a different one is refused here, before it reads, with an error naming both. Every host of
/// one subscription (one stream and group) shares them.
pub async fn claim<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
) -> Result<(), ClaimError> {
    let mut owned: Vec<(&str, &'static str)> = vec![(&keys.dead_letter, "dead-letter stream")];
    owned.extend(keys.delayed.as_deref().map(|k| (k, "delayed-retry set")));
    owned.extend(keys.lane.as_deref().map(|k| (k, "retry lane")));
    let mut invocation = CLAIM.prepare_invoke();
    invocation.arg(owner_of(&keys.stream, &keys.group));
    for (key, role) in &owned {
        invocation.key(claim_key(key)).arg(*role);
    }
    let conflict: Vec<redis::Value> = invocation.invoke_async(conn).await?;
    let [index, owner, role] = conflict.as_slice() else {
        return Ok(());
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let i = match index {
        redis::Value::Int(i) => usize::try_from(*i).unwrap_or(1).saturating_sub(1),
        _ => 0,
    };
    let (key, our_role) = owned.get(i).copied().unwrap_or(owned[0]);
    Err(Claimed {
        key: key.to_owned(),
        role: text(role),
        owner: describe_owner(&text(owner)),
        our_role,
        stream: keys.stream.to_string(),
        group: keys.group.to_string(),
        claim: claim_key(key),
    }
    .into())
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
