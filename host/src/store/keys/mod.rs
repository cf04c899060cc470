//! Every Redis key name and bookkeeping field the host writes, in one place, and the seal that
//! makes the host's bookkeeping trusted.
//!
//! Bookkeeping fields start with `sluice-`. A retry copy's (and a dead letter's) bookkeeping is
//! trusted only together with its [`MARK`], a seal keyed with the stream's [`Secret`] over the
//! copy's own fields, its stream and its group; a producer's own `sluice-*` fields are its data
//! like any other.
//!
//! - [`fields`]: the names of the fields the host adds to an entry.
//! - [`names`]: the name of every key the host keeps beside a subscription's own.
//! - [`seal`]: the stream's [`Secret`] and the [`Seal`] it keys.
//! - [`ids`]: stream entry ids, checked and compared as numbers.
//! - [`subscription`]: the keys of one subscription, as one value.
//! - [`claims`]: which subscription owns a key, so two never share one.
//! - [`slot`]: on a cluster, a subscription's keys share the stream's slot.
//!
//! Every item is used by its path here (`store::keys::X`), not by its file's.

mod claims;
mod fields;
mod ids;
mod names;
mod seal;
mod slot;
mod subscription;

pub use claims::{CLAIM_LEASE, CLAIM_RENEW, ClaimError, Claimed, claim};
pub use fields::{
    DELIVERY_COUNT, DUE_MS, EFFECTS_EPOCH, ENTRY_ID, FIELD_PREFIX, MARK, MEMBER, ORIGIN_GROUP,
    ORIGIN_ID, ORIGIN_KEY, ORIGIN_STREAM, PACKED_FIELDS, PARKED, PRODUCER_PREFIX, REASON,
    REQUEUED_FROM, RETRY_COUNT, SCRIPT_MAX_FIELDS, TRACE, escaped_name, producer_name,
};
pub use ids::{cmp_ids, is_stream_id};
pub use names::{
    FLOW_CHANGES, FLOW_EPOCH, breaker_key, canary_key, claim_key, component_key, dedupe_prefix,
    effects_key, flow_key, hash_tag, history_index_key, history_key, jobs_prefix, journal_key,
    lane_key, legacy_history_key, legacy_marks_key, order_prefix, rate_key, retention_lease_key,
    retention_record_key, secret_key, stats_key,
};
pub use seal::{Seal, Secret, SecretError, fields_digest};
pub use slot::{CrossSlot, SlotError, check_same_slot};
pub use subscription::{DEFAULT_HISTORY_ENTRIES, SubscriptionKeys};
