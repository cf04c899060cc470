//! The read loop: one turn per read, each a row of named steps. A step either gives the next
//! one what it needs (an admission, a ring, slots, tokens, a connection, a batch) or ends the
//! turn early ([`Turn::Again`]: start the next turn; [`Turn::Stop`]: the subscription stops).
//! A new gate is one more step here, not one more branch inside the loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Subscription;
use super::commands::ReadEntry;
use super::gates::Admission;
use super::slots::Taken;
use crate::entry::delivery::Source;
use crate::store::redis_conn::{ErrorClass, Reader, ReconnectBackoff};

/// Why a turn of the read loop ended before its entries were started.
pub(super) enum Turn {
    /// Start the next turn (held by a gate, or after a failure's pause).
    Again,
    /// The subscription is stopping.
    Stop,
}

/// A step of a turn: its result, or why the turn ends here.
pub(super) type Step<T> = Result<T, Turn>;

/// Where the next reads start, carried from one turn to the next.
pub(super) struct Cursors {
    /// This consumer's own pending entries still to re-read, per source from an id.
    pub(super) own_pending: Vec<(Source, String)>,
    /// XAUTOCLAIM's cursor per source (claiming subscriptions).
    pub(super) claim: Vec<(Source, String)>,
    /// Ids a take-over claimed whose reply never came (the connection failed): they may be
    /// pending to this consumer with nobody here handling them, below the newest id it read,
    /// where the re-read after a failure does not look. Looked for after a reconnect.
    pub(super) unanswered: Vec<(Source, Vec<String>)>,
}

/// What the read loop carries from one turn to the next.
struct LoopState {
    /// The read connection, once there is one (dropped on a failure).
    reader: Option<Reader>,
    cursors: Cursors,
    /// Delivery counts of entries a pause held back, restored when they are read again.
    held_counts: HashMap<(Source, String), u64>,
    /// A lane read that filled its room may have left due retries in the lane: those are read
    /// as soon as slots for them free (half the slots kept for due retries, so a lane holding
    /// thousands is read in batches, not an entry at a time), not at the next sweep that moves
    /// something.
    lane_more: bool,
    /// Only a successful read resets it: a server that accepts connections but refuses every
    /// read must not be asked 20 times a second.
    backoff: ReconnectBackoff,
}

impl Subscription {
    /// Read and dispatch until the stop. `restarted`: an earlier run of this loop ended
    /// unexpectedly, and its deliveries may still be running: own pending entries are read
    /// again only from after the newest id that run read (as after a reconnect), so none is
    /// handed out twice at once.
    pub async fn run(self: Arc<Self>, restarted: bool) {
        let plan = &self.plan;
        tracing::info!(
            stream = %plan.stream,
            group = %plan.group,
            consumer = %plan.consumer,
            claiming = plan.claim_min_idle.is_some(),
            "subscription starting"
        );
        if !self.create_group().await {
            return;
        }
        if let Some(shared) = &self.shared {
            // What a wait of the last run had read is pending by now, and re-read below.
            shared.settled(plan).await;
        }
        let mut state = LoopState {
            reader: None,
            cursors: Cursors {
                own_pending: if restarted {
                    self.after_last_read()
                } else {
                    self.every_source_at("0")
                },
                claim: self.every_source_at("0-0"),
                unanswered: Vec::new(),
            },
            held_counts: HashMap::new(),
            lane_more: false,
            backoff: ReconnectBackoff::default(),
        };
        while !matches!(self.turn(&mut state).await, Err(Turn::Stop)) {}
        tracing::info!(stream = %plan.stream, group = %plan.group, "subscription stopped reading");
    }

    /// One read: through the gates, the read itself, then its entries started.
    async fn turn(self: &Arc<Self>, state: &mut LoopState) -> Step<()> {
        let admission = self.admit(&mut state.cursors).await?;
        let rung = match self.wait_for_ring(&state.cursors).await {
            Ok(rung) => rung,
            Err(turn) => {
                // A probe the breaker granted goes back unused (found by the review of issue
                // 51: before, it stayed taken until the breaker's own timeout).
                self.unused(admission, 0, true);
                return Err(turn);
            }
        };
        let mut slots = self.take_slots(state.lane_more, admission).await?;
        let tokens = self.take_tokens(&mut slots).await?;
        // Waiting for slots or tokens may have taken a while: a pause (or an opened breaker)
        // that came meanwhile holds this read too, claims included.
        if admission.held_by(&self.flow.borrow()) {
            drop(slots);
            self.unused(admission, tokens, true);
            return Err(Turn::Again);
        }
        let conn = match self.connection(&mut state.reader).await {
            Ok(conn) => conn,
            Err(reason) => {
                drop(slots);
                self.unused(admission, tokens, true);
                self.health.failed(&reason);
                return self.pause_turn(&reason, &mut state.backoff).await;
            }
        };
        let read = tokio::select! {
            read = self.next_batch(conn, &slots, &mut state.cursors, rung) => read,
            // Entries a cut-off read had already taken stay pending and are re-read on restart.
            () = self.stop.cancelled() => return Err(Turn::Stop),
        };
        match read {
            Ok(batch) => {
                let batch = self.read_ok(state, admission, &slots, batch);
                self.unused(
                    admission,
                    tokens.saturating_sub(batch.len()),
                    batch.is_empty(),
                );
                self.start_deliveries(batch, slots).await;
                Ok(())
            }
            Err(err) => {
                drop(slots);
                self.unused(admission, tokens, true);
                self.read_failed(state, &err).await
            }
        }
    }

    /// The flow controls' gate: open, or wait (paused, breaker open) until they let a read
    /// through. After a hold, what a read held back is read again.
    async fn admit(&self, cursors: &mut Cursors) -> Step<Admission> {
        if self.flow.borrow().open() {
            return Ok(Admission::Open);
        }
        // No read runs while held: a read failure just before is not one that lasts (whether
        // Redis answers is then the flow watcher's to say).
        self.health.not_reading();
        let admission = self.admitted().await.ok_or(Turn::Stop)?;
        self.resumed(&mut cursors.own_pending);
        Ok(admission)
    }

    /// The bell's gate: idle with a bell, wait for a ring (a write to the stream or lane)
    /// before taking any slot or token, so that a retry taken back by its timer, or another
    /// read, is not kept waiting by a reader that has nothing to read. Whether it rang.
    async fn wait_for_ring(&self, cursors: &Cursors) -> Step<bool> {
        let Some(bell) = &self.bell else {
            return Ok(true);
        };
        if !self.idle.load(Ordering::Acquire)
            || !cursors.own_pending.is_empty()
            || !cursors.unanswered.is_empty()
        {
            return Ok(true);
        }
        let rung = tokio::select! {
            woke = bell.wait(self.plan.block, self.next_rescue_at()) => woke,
            () = self.stop.cancelled() => return Err(Turn::Stop),
        };
        // Paused meanwhile: the admission decides again.
        if !self.flow.borrow().open() {
            return Err(Turn::Again);
        }
        Ok(rung)
    }

    /// The slots' gate: read in batches, waiting until half a batch can start, then taking
    /// what else is free (reading as soon as one slot frees would turn a busy subscription
    /// into a stream of one-entry reads). Retries this host just moved into the retry lane
    /// are the exception: read as soon as one delivery can start, in the slots reserved for
    /// them if the stream holds all others (`slots.rs`).
    async fn take_slots(&self, lane_more: bool, admission: Admission) -> Step<Taken> {
        let count = self.plan.count;
        let floor = (count.min(self.slots.shared_total()) / 2).max(1);
        let lane_filled = async {
            match &self.delayed {
                Some(delayed) => delayed.lane_filled().await,
                None => std::future::pending().await,
            }
        };
        let taken = tokio::select! {
            taken = self.slots.shared(floor) => taken,
            taken = async {
                if lane_more {
                    self.slots.for_lane(self.slots.lane_batch(floor)).await
                } else {
                    lane_filled.await;
                    self.slots.for_lane(1).await
                }
            } => taken,
            () = self.stop.cancelled() => None,
        };
        let mut taken = taken.ok_or(Turn::Stop)?;
        self.slots.top_up(&mut taken, count);
        if admission == Admission::Probe {
            taken.limit(1);
        }
        Ok(taken)
    }

    /// The rate limit's gate: with a shared rate limit, no more entries than its budget gives
    /// now. The tokens taken (0 without a limit).
    async fn take_tokens(&self, slots: &mut Taken) -> Step<usize> {
        let Some(rate) = &self.rate else {
            return Ok(0);
        };
        let tokens = rate.take(slots.all(), &self.stop).await.ok_or(Turn::Stop)?;
        slots.limit(tokens);
        Ok(tokens)
    }

    /// The connection this read goes on: a subscription with a bell, or a partition (whose
    /// waits are the shared read's), takes the node's pooled lean connections, one for each
    /// read (a busy one reads as fast as on a connection of its own); others a connection of
    /// their own for blocking reads. Why there is none.
    async fn connection<'a>(
        &self,
        reader: &'a mut Option<Reader>,
    ) -> Result<&'a mut Reader, String> {
        if reader.is_none() && (self.bell.is_some() || self.shared.is_some()) {
            *reader = self.conn.non_blocking_reader();
        }
        if reader.is_none() {
            let conn = self
                .conn
                .reader(self.plan.block, &self.plan.stream)
                .await
                .map_err(|err| crate::support::chain::chain(&err))?;
            *reader = Some(conn);
        }
        reader
            .as_mut()
            .ok_or_else(|| "no read connection".to_owned())
    }

    /// A read succeeded: what of it to start now. A read that returned after a pause (or an
    /// opened breaker) came is held back whole; entries a pause held back come back with the
    /// delivery count they had.
    fn read_ok(
        &self,
        state: &mut LoopState,
        admission: Admission,
        slots: &Taken,
        batch: Vec<(ReadEntry, u64)>,
    ) -> Vec<(ReadEntry, u64)> {
        state.backoff.reset();
        self.health.read_ok();
        let from_lane = batch
            .iter()
            .filter(|(e, _)| e.source == Source::Lane)
            .count();
        state.lane_more = self.plan.lane.is_some() && from_lane > 0 && from_lane >= slots.all();
        if admission.held_by(&self.flow.borrow()) {
            let cursors = &mut state.cursors;
            self.hold_back(
                batch,
                &mut cursors.own_pending,
                &mut cursors.unanswered,
                &mut state.held_counts,
            );
            return Vec::new();
        }
        if state.held_counts.is_empty() {
            return batch;
        }
        batch
            .into_iter()
            .map(|(read, count)| {
                let held = state.held_counts.remove(&(read.source, read.id.clone()));
                (read, held.unwrap_or(count))
            })
            .collect()
    }

    /// A read failed: say why, repair what can be (a group made again, a new connection),
    /// and pause before the next turn.
    async fn read_failed(&self, state: &mut LoopState, err: &redis::RedisError) -> Step<()> {
        // The read's connection is its own: tell the handle, so a failover (READONLY, a lost
        // master) is followed before the next reconnect.
        self.conn.saw_error(err);
        let class = ErrorClass::of(err);
        let message = format!("read failed: {}: {err}", class.describe());
        self.health.failed(&message);
        // A failed read found nothing out: the next one reads (after the pause) instead of
        // waiting for a ring, which a repair such as a group made again does not cause when
        // the doorbell polls.
        self.idle.store(false, Ordering::Release);
        // Nor does it wait on its keys: a key that cannot be read (another type under its
        // name) is let go of, not watched by the doorbell for ever.
        if let Some(bell) = &self.bell {
            bell.set_idle(false);
        }
        if class == ErrorClass::NoGroup {
            // The stream or the group was deleted: make the group again (the connection is
            // fine) and read on; the pause still applies, so a group deleted over and over is
            // not recreated in a tight loop. A group made again has no pending entries; one
            // that still exists (another partition's group was the one gone) has those this
            // host is handling, which must not be started twice: only entries after the last
            // read are looked for, as after a reconnect.
            self.recreate_group().await;
        } else {
            state.reader = None;
            self.reconnects.inc();
            // Redis may have handed this consumer entries whose reply never arrived (the
            // connection died mid-reply): they are pending to it, and newer than anything it
            // read. Re-read those before anything else.
        }
        state.cursors.own_pending = self.after_last_read();
        self.pause_turn(&message, &mut state.backoff).await
    }

    /// Log a failure and wait out the backoff: the next turn, or the stop.
    async fn pause_turn(&self, message: &str, backoff: &mut ReconnectBackoff) -> Step<()> {
        if self.pause_after_error(message, backoff).await {
            Err(Turn::Again)
        } else {
            Err(Turn::Stop)
        }
    }
}
