//! The name of every Redis key the host writes besides the streams, sets and dead-letter
//! streams a subscription names itself: each in its stream's hash slot (see [`hash_tag`]), so
//! the scripts may touch it together with the stream on a cluster.

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

/// Where a stream's [`super::Secret`] is kept: in the stream's hash slot, so scripts can use it with
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

/// The journal of one entry's outbound calls (see `runtime/journal.rs`): a hash, call position
/// -> the recorded call, in the stream's hash slot; one per (stream, group, origin id), so each
/// group's journal is its own.
pub fn effects_key(stream: &str, group: &str, origin_id: &str) -> String {
    format!(
        "sluice-effects:{{{}}}:{}:{stream}:{}:{group}:{origin_id}",
        hash_tag(stream),
        stream.len(),
        group.len()
    )
}

/// The prefix of the keys a group's dedupe record keeps (see `pipeline::dedupe`):
/// `<prefix>:key:<digest>` (a key's first entry, expiring with the window),
/// `<prefix>:taken:<period>` and `<prefix>:counts`; in the stream's hash slot, each group its
/// own.
pub fn dedupe_prefix(stream: &str, group: &str) -> String {
    format!(
        "sluice-dedupe:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// The prefix of every key a subscription's ordered keys keep (see `pipeline::order`): in the
/// stream's hash slot, named like [`flow_key`]. `<prefix>:names`, `<prefix>:waiting`,
/// `<prefix>:turns` and `<prefix>:load` are the subscription's; `<prefix>:wait:<digest>` is one
/// key's (the digest of the key, never the key itself, so a key's bytes cannot reach a key
/// name).
pub fn order_prefix(stream: &str, group: &str) -> String {
    format!(
        "sluice-order:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}

/// The prefix of a subscription's bulk jobs' keys (see `control::operate::jobs`):
/// `<prefix>:last` (the last job's record, a hash) and `<prefix>:lease` (held by the host
/// running one); in the stream's hash slot, named like [`flow_key`].
pub fn jobs_prefix(stream: &str, group: &str) -> String {
    format!(
        "sluice-jobs:{{{}}}:{}:{stream}:{group}",
        hash_tag(stream),
        stream.len()
    )
}
