//! The names of the fields the host adds to an entry (its bookkeeping, all starting with
//! [`FIELD_PREFIX`]), and how a producer's own field named like them is kept apart in a dead
//! letter ([`escaped_name`]): one name, one source, for Rust and (as ARGV) for the scripts.

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
/// its stream and its group: what makes those fields trusted. See [`super::Secret::seal`].
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
/// Set by a requeue that asks for new idempotency keys (the dead letter's id): the entry's
/// outbound calls then get keys no earlier attempt had (see `runtime/effects.rs`).
pub const EFFECTS_EPOCH: &str = "sluice-effects-epoch";
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
