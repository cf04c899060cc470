//! When a partition looks for consumers that are gone (to take over what they left pending):
//! every half `consumer_gone_after`, unless the last look found none and the doorbell says
//! nothing was written to its keys since.

use std::sync::PoisonError;
use std::time::Duration;

use super::Subscription;

/// What the last look for gone consumers of a partition with a bell found.
#[derive(Debug)]
pub(super) enum Quiet {
    /// Another consumer was left (or there is no bell): the next look comes at its time.
    No,
    /// No other consumer was left, but the bell could not vouch for its rings then (the
    /// reader was not idle yet): one more look as soon as it can.
    Wanted,
    /// No other consumer was left, and these were the bell's rings before the look: until a
    /// key of the partition is written, no entry can become pending to another consumer, and
    /// no look is needed.
    Since(crate::store::doorbell::Mark),
}

impl Subscription {
    /// Whether it is time to look for gone consumers: every half `gone_after`, unless the last
    /// look found no other consumer and nothing was written to the partition's keys since.
    pub(super) fn rescue_due(&self, gone_after: Duration) -> bool {
        let now = tokio::time::Instant::now();
        let Ok(mut next) = self.next_rescue.lock() else {
            return false;
        };
        let wanted = self.rescue_wanted();
        if (now < *next && !wanted) || self.rescue_is_quiet() {
            return false;
        }
        *next = now + gone_after / 2;
        true
    }

    pub(super) fn rescue_quiet(&self) -> std::sync::MutexGuard<'_, Quiet> {
        self.rescue_quiet
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the last look for gone consumers still holds (see [`Quiet::Since`]).
    pub(super) fn rescue_is_quiet(&self) -> bool {
        match (&self.bell, &*self.rescue_quiet()) {
            (Some(bell), Quiet::Since(mark)) => bell.unrung_since(mark),
            _ => false,
        }
    }

    /// Whether a look that found the group clear is to be made again now that the bell can
    /// vouch for its rings (see [`Quiet::Wanted`]).
    pub(super) fn rescue_wanted(&self) -> bool {
        match (&self.bell, &*self.rescue_quiet()) {
            (Some(bell), Quiet::Wanted) => bell.mark().is_some(),
            _ => false,
        }
    }

    pub(super) fn set_rescue_quiet(&self, quiet: Quiet) {
        *self.rescue_quiet() = quiet;
    }

    /// When an idle reader must wake for its next look for gone consumers, if it must.
    pub(super) fn next_rescue_at(&self) -> Option<tokio::time::Instant> {
        if self.plan.gone_after.is_none() || self.rescue_is_quiet() {
            return None;
        }
        self.next_rescue.lock().ok().map(|next| *next)
    }
}
