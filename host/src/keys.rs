//! Every Redis key name and bookkeeping field the host writes, in one place.
//!
//! Bookkeeping fields start with `sluice-`; they are stripped from what a handler sees and
//! kept on what the dead-letter stream records.

/// The prefix of every field the host adds to an entry.
pub const FIELD_PREFIX: &str = "sluice-";
/// How many times the entry was parked and re-added (absent means 0).
pub const RETRY_COUNT: &str = "sluice-retry-count";
/// The id of the entry this one was re-added from, or dead-lettered from.
pub const ORIGIN_ID: &str = "sluice-origin-id";
/// The stream a dead-lettered entry came from.
pub const ORIGIN_STREAM: &str = "sluice-origin-stream";
/// The consumer group that gave up on a dead-lettered entry.
pub const ORIGIN_GROUP: &str = "sluice-origin-group";
/// Why an entry was dead-lettered.
pub const REASON: &str = "sluice-reason";
/// How many times Redis had delivered the entry when it was dead-lettered.
pub const DELIVERY_COUNT: &str = "sluice-delivery-count";

/// The config value through which the host tells the guest which field holds the payload.
pub const CONFIG_PAYLOAD_FIELD: &str = "sluice.payload-field";

/// Whether `field` is one of the host's bookkeeping fields.
pub fn is_bookkeeping(field: &str) -> bool {
    field.starts_with(FIELD_PREFIX)
}
