//! Handler slots: how many deliveries a subscription runs at once, and the share of them that
//! only due retries may take.
//!
//! Every delivery holds one slot while its handler runs; the read loop takes slots before it
//! reads and reads no more entries than it holds. With a retry lane, `retry_lane_slots` of
//! them (by default an eighth of `max_in_flight`, none below 8) are *reserved*: new stream
//! entries never take those, so a retry that comes due while a backlog saturates the
//! subscription finds a free slot at once instead of waiting for a busy handler to finish.
//!
//! The reserve is a semaphore of its own rather than a count kept free in one semaphore:
//! tokio's semaphore is fair, so a read waiting for half a batch would queue every smaller
//! request behind it, and a due retry would wait for that half batch after all.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ReadPlan;
use crate::entry::delivery::Source;

/// A subscription's handler slots.
pub(super) struct Slots {
    /// Slots any entry may take.
    shared: Arc<Semaphore>,
    /// Slots only retry-lane entries may take (none without a lane).
    reserved: Option<Arc<Semaphore>>,
    /// How many slots `shared` has in all.
    shared_total: usize,
    /// How many slots `reserved` has in all.
    reserved_total: usize,
}

/// The slots one read holds: the most entries it may start.
pub(super) struct Taken {
    shared: Option<OwnedSemaphorePermit>,
    reserved: Option<OwnedSemaphorePermit>,
    /// Taken because a sweep of this host just filled the retry lane.
    pub(super) for_lane: bool,
}

impl Taken {
    /// Slots held in all: the most entries the read may start.
    pub(super) fn all(&self) -> usize {
        self.stream() + self.reserved.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Of those, the most that new stream entries may take.
    pub(super) fn stream(&self) -> usize {
        self.shared.as_ref().map_or(0, |p| p.num_permits())
    }

    /// The most entries of `source` the read may start.
    pub(super) fn room_for(&self, source: Source) -> usize {
        match source {
            Source::Lane => self.all(),
            Source::Stream => self.stream(),
        }
    }

    /// Give back every slot beyond `n`: the read may start no more (a rate limit's budget).
    /// Shared slots go first, so the lane keeps its reserve.
    pub(super) fn limit(&mut self, n: usize) {
        let mut excess = self.all().saturating_sub(n);
        for held in [&mut self.shared, &mut self.reserved] {
            if excess == 0 {
                return;
            }
            if let Some(permit) = held.as_mut() {
                let give = excess.min(permit.num_permits());
                if give == permit.num_permits() {
                    *held = None;
                } else {
                    drop(permit.split(give));
                }
                excess -= give;
            }
        }
    }

    /// One slot for an entry read from `source`: a lane entry takes a reserved one first.
    pub(super) fn one_for(&mut self, source: Source) -> Option<OwnedSemaphorePermit> {
        let reserved = match source {
            Source::Lane => self.reserved.as_mut().and_then(|p| p.split(1)),
            Source::Stream => None,
        };
        reserved.or_else(|| self.shared.as_mut().and_then(|p| p.split(1)))
    }
}

fn merge(into: &mut Option<OwnedSemaphorePermit>, more: OwnedSemaphorePermit) {
    match into {
        Some(held) => held.merge(more),
        None => *into = Some(more),
    }
}

impl Slots {
    /// `max_in_flight` slots, the lane's reserve among them.
    pub(super) fn new(plan: &ReadPlan) -> Self {
        let reserve = if plan.lane.is_some() {
            plan.lane_slots.min(plan.max_in_flight.saturating_sub(1))
        } else {
            0
        };
        let shared_total = plan.max_in_flight - reserve;
        Self {
            shared: Arc::new(Semaphore::new(shared_total)),
            reserved: (reserve > 0).then(|| Arc::new(Semaphore::new(reserve))),
            shared_total,
            reserved_total: reserve,
        }
    }

    /// Slots any entry may take, in all: what a read waits for half a batch of.
    pub(super) fn shared_total(&self) -> usize {
        self.shared_total
    }

    /// Wait for `n` shared slots (`None`: the semaphore was closed).
    pub(super) async fn shared(&self, n: usize) -> Option<Taken> {
        let shared = self
            .shared
            .clone()
            .acquire_many_owned(n as u32)
            .await
            .ok()?;
        Some(Taken {
            shared: Some(shared),
            reserved: None,
            for_lane: false,
        })
    }

    /// How many slots a read of a lane that still holds due retries waits for: half the
    /// reserve (at least one), or without a reserve the stream's `floor`.
    pub(super) fn lane_batch(&self, floor: usize) -> usize {
        match &self.reserved {
            Some(_) => (self.reserved_total / 2).max(1),
            None => floor,
        }
    }

    /// Wait for `n` slots a due retry may take: reserved ones if the lane has a reserve.
    pub(super) async fn for_lane(&self, n: usize) -> Option<Taken> {
        let mut taken = match &self.reserved {
            Some(reserved) => {
                let reserved = reserved
                    .clone()
                    .acquire_many_owned(n.clamp(1, self.reserved_total) as u32)
                    .await
                    .ok()?;
                Taken {
                    shared: None,
                    reserved: Some(reserved),
                    for_lane: true,
                }
            }
            None => self.shared(n.clamp(1, self.shared_total)).await?,
        };
        taken.for_lane = true;
        Some(taken)
    }

    /// Add the slots that are free now, up to `count` held in all; reserved ones only if the
    /// read is for the lane.
    pub(super) fn top_up(&self, taken: &mut Taken, count: usize) {
        if taken.for_lane
            && let Some(reserved) = &self.reserved
        {
            let more = reserved
                .available_permits()
                .min(count.saturating_sub(taken.all()));
            if more > 0
                && let Ok(extra) = reserved.clone().try_acquire_many_owned(more as u32)
            {
                merge(&mut taken.reserved, extra);
            }
        }
        let more = self
            .shared
            .available_permits()
            .min(count.saturating_sub(taken.all()));
        if more > 0
            && let Ok(extra) = self.shared.clone().try_acquire_many_owned(more as u32)
        {
            merge(&mut taken.shared, extra);
        }
    }

    /// Wait for one shared slot: for a delivery that did not come from a read (a pending
    /// retry's timer), or one more than a read was sized by.
    pub(super) async fn one(&self) -> Option<OwnedSemaphorePermit> {
        self.shared.clone().acquire_owned().await.ok()
    }
}
