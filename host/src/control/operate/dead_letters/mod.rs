//! The dead-letter stream: listing this subscription's dead letters newest first, decoding what
//! the host wrote there, and moving one back to its group (`lua/requeue.lua`) or deleting it.
//!
//! A dead letter is one of three shapes:
//! - from a delivery (`settle/lua/dead_letter.lua`): the entry's own fields, or one
//!   `sluice-packed-fields` holding them when there were too many, then the bookkeeping: reason,
//!   origin stream, origin group, origin id, entry id, retry count, delivery count, and the
//!   host's seal over the stream, group, origin id and fields (dead letters of the earlier
//!   release have no seal);
//! - from a parked retry that could not go back (`delayed/lua/sweep.lua`) or that an operator
//!   dead-lettered raw: the set's member, a reason, the set's key, the stream, the group and a
//!   seal (the earlier release wrote the first four only);
//! - anything else (written by someone else): shown, never requeued.
//!
//! A dead-letter stream belongs to one subscription (the plan refuses two that share one, and
//! Redis records its owner), but one written by hand, or shared under an earlier release, may
//! hold others' dead letters: listings show only this subscription's (and entries no Sluice
//! subscription wrote), and a requeue or delete touches only this subscription's.
//!
//! A requeue goes back to the subscription's group only (its retry lane, or with `retry_lane =
//! false` its stream), with the attempt count reset and the origin id kept, the idempotency
//! key, but only when the dead letter's origin can be trusted: it carries a seal that
//! verifies, or it is a dead letter the earlier release wrote before this one took over. Any
//! other goes back as a new entry of its own (its origin is its new id).
//!
//! Only the trailing bookkeeping is the host's: a producer's own `sluice-*` fields in front of
//! it are the producer's data and go back with the entry.
//!
//! The files:
//! - [`letter`]: the [`DeadLetter`] type, whose it is ([`Owner`]), and how a letter is shown
//!   (JSON, its trace, when it was written);
//! - [`decode`]: the layouts the host writes ([`TAIL`]), an entry of the stream read back into
//!   a [`DeadLetter`], and how trust in its bookkeeping is decided (the seal, or the earlier
//!   release's cutoff);
//! - [`listing`]: listing (newest first, filtered by reason, paged), one letter by id, and the
//!   requeueable ones for a bounded "requeue all";
//! - [`requeue`](mod@requeue): one letter back to its group (`lua/requeue.lua`);
//! - [`delete`](mod@delete): this subscription's letters among some ids, deleted;
//! - [`migrate`]: the earlier release's shared dead-letter stream moved into this one's
//!   (`lua/move_dead_letter.lua`), sealed on the way when its origin is trusted.

mod decode;
mod delete;
mod letter;
mod listing;
mod migrate;
mod requeue;

use redis::aio::ConnectionLike;

pub use decode::TAIL;
pub use delete::delete;
pub use letter::{DeadLetter, Owner, Shape};
pub use listing::{get, get_view, list, list_view, list_with, requeueable};
pub use migrate::{Migrated, migrate_legacy};
pub use requeue::{Requeued, requeue};

use super::OperateError;
use crate::store::keys::{Secret, SubscriptionKeys};

/// An entry of the dead-letter stream as Redis returns it: its id and its fields.
type RawEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// The stream's secret, with the legacy cutoffs of the subscription's streams (what verifies
/// the host's bookkeeping on copies and dead letters).
pub(crate) async fn secret_of<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
) -> Result<Option<Secret>, OperateError> {
    let own = keys.own_streams();
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    Ok(Secret::load(conn, &keys.stream, &own).await?)
}

/// Whether `id` has the shape of a stream entry id (`<ms>-<seq>`), so it can be passed to a
/// range command without changing its meaning.
pub fn is_entry_id(id: &str) -> bool {
    crate::store::keys::is_stream_id(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_are_checked_before_reaching_a_range_command() {
        assert!(is_entry_id("1700000000000-12"));
        for bad in ["+", "-", "(1-0", "1", "1-0-0", "a-1", ""] {
            assert!(!is_entry_id(bad), "{bad}");
        }
    }
}
