//! The data's way, one step per module, in the order an entry takes them:
//!
//! 1. [`admit`] decides whether a subscription may take entries now: an operator's pause, a
//!    shared rate limit and a circuit breaker, followed by every host of the group.
//! 2. [`read`] reads: it creates the group, re-reads this consumer's own pending entries after
//!    a restart, takes over those of a consumer that is gone, claims idle entries, and reads
//!    new entries with XREADGROUP (the partitions of a subscription wait in one blocking read).
//! 3. [`order`] (on an ordered subscription) lets an entry run only when its key's turn is
//!    free or already its own, and queues the others in Redis behind it; [`dedupe`] (on a
//!    deduplicating subscription) judges each read's stream entries in one script and
//!    acknowledges unhandled those whose key's first entry was read within the window.
//! 4. [`dispatch`] runs the subscription's current handler on each delivery inside its span and
//!    decides with [`crate::entry::outcome`]; with `poison_check`, [`poison`] runs a failed
//!    attempt once more offline first.
//! 5. [`settle`] carries the decision out in Redis: batched XACKs, atomic dead-lettering, and
//!    retries that stay pending.
//! 6. [`delayed`] parks a retry in its durable sorted set and sweeps due retries into the
//!    group's retry lane, where step 2 reads them again.

pub mod admit;
pub mod dedupe;
pub mod delayed;
pub(crate) mod dispatch;
pub mod order;
pub(crate) mod poison;
pub(crate) mod read;
pub(crate) mod settle;
