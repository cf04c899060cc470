//! What one read brings, in order: this consumer's own pending entries, a lost take-over's,
//! those of consumers that are gone, idle entries to claim, then new entries (the retry lane
//! first), each with Redis's delivery counter.

use redis::RedisResult;

use super::Subscription;
use super::commands::{self, ReadEntry};
use super::rescue::Quiet;
use super::run::Cursors;
use super::slots::Taken;
use crate::entry::delivery::Source;
use crate::store::redis_conn::Reader;

/// Entries read, each with Redis's delivery counter.
type Batch = Vec<(ReadEntry, u64)>;

impl Subscription {
    /// The next entries to handle, with Redis's delivery counter for each: the first of these
    /// sources that has any.
    pub(super) async fn next_batch(
        &self,
        conn: &mut Reader,
        taken: &Taken,
        cursors: &mut Cursors,
        rung: bool,
    ) -> RedisResult<Batch> {
        if let Some(batch) = self
            .own_pending(conn, taken, &mut cursors.own_pending)
            .await?
        {
            return Ok(batch);
        }
        if let Some(batch) = self.lost_take_over(conn, &mut cursors.unanswered).await? {
            return Ok(batch);
        }
        if let Some(batch) = self
            .gone_consumers(conn, taken, &mut cursors.unanswered)
            .await?
        {
            return Ok(batch);
        }
        // With a bell, a subscription whose last read found nothing waited for a ring (a write
        // to its stream or lane, see the read loop) instead of reading: nothing is sent while
        // it is idle. Woken for its look for gone consumers only, it reads nothing more. Its
        // set's sweeps are the set's own bell's to ask for (see `delayed`).
        if let Some(bell) = &self.bell {
            use std::sync::atomic::Ordering;
            if self.idle.load(Ordering::Acquire) && !taken.for_lane && !rung {
                return Ok(Vec::new());
            }
            bell.seen();
        }
        // Every read asks the set's timer task for a pass (which also covers entries other
        // hosts parked) and does not wait for it: a read that blocks is woken by what the pass
        // appends, one that does not takes it at the next read. A read woken because a pass
        // just filled the lane needs no other, nor does a set with a bell of its own: other
        // hosts' parks ring it (or it passes every `block` while the doorbell cannot vouch).
        if let Some(delayed) = &self.delayed
            && !taken.for_lane
            && !delayed.has_bell()
        {
            delayed.sweep_soon();
        }
        if let Some(batch) = self.claim_idle(conn, taken, &mut cursors.claim).await? {
            return Ok(batch);
        }
        let entries = self.new_entries(conn, taken).await?;
        self.note_idle(taken, rung, entries.is_empty());
        Ok(entries.into_iter().map(|e| (e, 1)).collect())
    }

    /// This consumer's own pending entries (after a start, a restart or a failure), oldest
    /// first, a source at a time.
    pub(super) async fn own_pending(
        &self,
        conn: &mut Reader,
        taken: &Taken,
        own_pending: &mut Vec<(Source, String)>,
    ) -> RedisResult<Option<Batch>> {
        let plan = &self.plan;
        while let Some((source, cursor)) = own_pending.first_mut() {
            let source = *source;
            let room = taken.room_for(source);
            if room == 0 {
                // A read for the lane only: the stream's own entries wait for the next one.
                break;
            }
            let entries = commands::read_group(conn, plan, room, None, &[(source, cursor)]).await?;
            let Some(last) = entries.last() else {
                own_pending.remove(0);
                continue;
            };
            tracing::info!(
                stream = %plan.key(source),
                count = entries.len(),
                "re-reading this consumer's own pending entries"
            );
            *cursor = last.id.clone();
            return self.with_counts(conn, source, entries).await.map(Some);
        }
        Ok(None)
    }

    /// The entries a take-over whose reply was lost made this consumer's.
    pub(super) async fn lost_take_over(
        &self,
        conn: &mut Reader,
        unanswered: &mut Vec<(Source, Vec<String>)>,
    ) -> RedisResult<Option<Batch>> {
        let Some((source, ids)) = unanswered.last() else {
            return Ok(None);
        };
        let source = *source;
        let entries = commands::own_pending_among(conn, &self.plan, source, ids).await?;
        unanswered.pop();
        if entries.is_empty() {
            return Ok(None);
        }
        tracing::warn!(
            stream = %self.plan.key(source),
            count = entries.len(),
            "a take-over's reply was lost; handling the entries it made this consumer's"
        );
        Ok(Some(entries))
    }

    /// When it is time (see `rescue.rs`): the pending entries of consumers that are gone.
    pub(super) async fn gone_consumers(
        &self,
        conn: &mut Reader,
        taken: &Taken,
        unanswered: &mut Vec<(Source, Vec<String>)>,
    ) -> RedisResult<Option<Batch>> {
        let plan = &self.plan;
        let Some(gone_after) = plan.gone_after else {
            return Ok(None);
        };
        if !self.rescue_due(gone_after) {
            return Ok(None);
        }
        // Before the look: a write during it rings, and the next look is not skipped.
        let mark = self
            .bell
            .as_ref()
            .and_then(crate::store::doorbell::Bell::mark);
        let mut clear = true;
        self.set_rescue_quiet(Quiet::No);
        for source in plan.sources() {
            let room = taken.room_for(source);
            if room == 0 {
                clear = false;
                continue;
            }
            let mut asked = Vec::new();
            let mut vanished = Vec::new();
            let taken_over = commands::take_over_gone(
                conn,
                plan,
                source,
                gone_after,
                room,
                &mut asked,
                (&mut clear, &mut vanished),
            )
            .await;
            self.forget_vanished(source, &vanished).await;
            let entries = match taken_over {
                Ok(entries) => entries,
                Err(err) => {
                    let below = self.at_or_below_last_read(source, asked);
                    if !below.is_empty() {
                        unanswered.push((source, below));
                    }
                    return Err(err);
                }
            };
            if !entries.is_empty() {
                tracing::warn!(
                    stream = %plan.key(source),
                    count = entries.len(),
                    gone_after_ms = gone_after.as_millis() as u64,
                    "took over pending entries of consumers that are gone"
                );
                return self.with_counts(conn, source, entries).await.map(Some);
            }
        }
        if clear && self.bell.is_some() {
            self.set_rescue_quiet(mark.map_or(Quiet::Wanted, Quiet::Since));
        }
        Ok(None)
    }

    /// On a claiming subscription: entries other consumers left idle for `min_idle`.
    pub(super) async fn claim_idle(
        &self,
        conn: &mut Reader,
        taken: &Taken,
        claim_cursors: &mut [(Source, String)],
    ) -> RedisResult<Option<Batch>> {
        let plan = &self.plan;
        let Some(min_idle) = plan.claim_min_idle else {
            return Ok(None);
        };
        for (source, cursor) in claim_cursors.iter_mut() {
            let room = taken.room_for(*source);
            if room == 0 {
                continue;
            }
            let (next, entries, deleted) =
                commands::autoclaim(conn, plan, *source, min_idle, cursor, room).await?;
            *cursor = next;
            self.forget_vanished(*source, &deleted).await;
            if !entries.is_empty() {
                tracing::info!(stream = %plan.key(*source), count = entries.len(), "claimed idle entries");
                return self.with_counts(conn, *source, entries).await.map(Some);
            }
        }
        Ok(None)
    }

    /// On an ordered subscription: give back the turns that stream entries deleted while
    /// pending held (a claim found them gone), so their keys' next entries go.
    async fn forget_vanished(&self, source: Source, ids: &[String]) {
        let Some(order) = &self.order else {
            return;
        };
        if source != Source::Stream || ids.is_empty() {
            return;
        }
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        match order.forget(&ids).await {
            Ok(went) => tracing::warn!(
                stream = %self.plan.stream,
                deleted = ids.len(),
                let_in = went,
                "pending entries were deleted from the stream before they were handled; the turns they held are given back"
            ),
            Err(err) => tracing::warn!(
                stream = %self.plan.stream,
                %err,
                "could not give back the turns of entries deleted while pending; `sluice keys --release` frees their keys"
            ),
        }
    }

    /// New entries: the retry lane first, on its own, so that stream entries never take the
    /// room of due retries; the stream then gets what room is left (never the slots reserved
    /// for the lane). Nothing in either: a blocking read, or the wait of the partitions'
    /// shared read, or (with a bell) nothing, since the bell waits before the next read.
    pub(super) async fn new_entries(
        &self,
        conn: &mut Reader,
        taken: &Taken,
    ) -> RedisResult<Vec<ReadEntry>> {
        let plan = &self.plan;
        let room = taken.all();
        let newest = [(Source::Stream, ">")];
        let mut entries = Vec::new();
        if plan.lane.is_some() {
            entries = commands::read_group(conn, plan, room, None, &[(Source::Lane, ">")]).await?;
        }
        let left = taken.stream().min(room - entries.len());
        if left == 0 {
            return Ok(entries);
        }
        if let Some(order) = &self.order {
            let read = order
                .read_new(conn, (&plan.consumer, left, plan.max_entry_bytes as u64))
                .await?;
            return self.new_scripted(conn, read, entries).await;
        }

        let more = if !entries.is_empty() || (self.bell.is_some() && self.shared.is_none()) {
            commands::read_group(conn, plan, left, None, &newest).await?
        } else if let Some(shared) = &self.shared {
            // With the other partitions, once the stream too is found empty.
            let found = commands::read_group(conn, plan, left, None, &newest).await?;
            if found.is_empty() {
                shared.wait(plan, left).await?
            } else {
                found
            }
        } else {
            // Nothing to do yet: wait on the stream and the lane both (a blocked read is
            // answered with the entries of whichever gets some first).
            let both: Vec<(Source, &str)> = plan.sources().map(|s| (s, ">")).collect();
            commands::read_group(conn, plan, left, Some(plan.block), &both).await?
        };
        entries.extend(more);
        Ok(entries)
    }

    /// New stream entries of an ordered subscription, after the lane's `entries`: `read` by
    /// the order's script, which settles each one's place in its key's order as it delivers
    /// it. Nothing in either: without a bell, a blocking XREAD (which delivers nothing) waits
    /// for the next entry of either, and the next read takes it.
    async fn new_scripted(
        &self,
        conn: &mut Reader,
        read: crate::pipeline::order::NewEntries,
        mut entries: Vec<ReadEntry>,
    ) -> RedisResult<Vec<ReadEntry>> {
        let plan = &self.plan;
        entries.extend(read.entries.into_iter().map(|e| ReadEntry {
            id: e.id,
            source: Source::Stream,
            fields: Some(e.fields),
            cut: e.cut,
            placed: true,
        }));
        if let (true, None, Some((stream_id, lane_id))) =
            (entries.is_empty(), &self.bell, read.idle)
        {
            let mut wait = redis::cmd("XREAD");
            wait.arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(plan.block.as_millis() as u64);
            wait.arg("STREAMS").arg(&*plan.stream);
            match &plan.lane {
                Some(lane) => wait
                    .arg(&**lane)
                    .arg(or_start(&stream_id))
                    .arg(or_start(&lane_id)),
                None => wait.arg(or_start(&stream_id)),
            };
            let _: redis::Value = wait.query_async(conn).await?;
        }
        Ok(entries)
    }

    /// After a read of new entries, with a bell: whether the partition is idle now (its next
    /// read waits for a ring).
    pub(super) fn note_idle(&self, taken: &Taken, rung: bool, found_nothing: bool) {
        let Some(bell) = &self.bell else {
            return;
        };
        if taken.for_lane {
            return;
        }
        self.idle
            .store(found_nothing, std::sync::atomic::Ordering::Release);
        bell.set_idle(found_nothing);
        // Woken and nothing read: what rang went to another consumer. A polling bell does not
        // ring for the consumer that read made, and a look in this same wake may have come
        // before it: look again at the usual pace, not after the bell's 5 minutes (found by an
        // attack: a host that died holding such an entry was taken over after 5 minutes in
        // one race of three).
        if rung && found_nothing && bell.polls() {
            self.set_rescue_quiet(Quiet::No);
        }
    }

    /// Of the ids a take-over whose reply was lost asked for, those to look for after the next
    /// connect: at or below the newest id read from `source`, since the re-read after the
    /// failure (see [`Self::after_last_read`]) brings back everything newer, and must not be
    /// doubled.
    pub(super) fn at_or_below_last_read(
        &self,
        source: Source,
        mut asked: Vec<String>,
    ) -> Vec<String> {
        let newest = self
            .last_read
            .lock()
            .ok()
            .and_then(|newest| newest.get(&source).cloned());
        match newest {
            Some(newest) => asked.retain(|id| crate::entry::delivery::cmp_ids(id, &newest).is_le()),
            None => asked.clear(),
        }
        asked
    }

    /// `entries`, all read from `source`, each with Redis's delivery counter.
    pub(super) async fn with_counts(
        &self,
        conn: &mut Reader,
        source: Source,
        entries: Vec<ReadEntry>,
    ) -> RedisResult<Vec<(ReadEntry, u64)>> {
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let counts = commands::delivery_counts(conn, &self.plan, source, &ids).await?;
        Ok(entries
            .into_iter()
            .map(|e| {
                let count = counts.get(&e.id).copied().unwrap_or(1);
                (e, count)
            })
            .collect())
    }
}

/// Where a blocking wait starts when the group has read nothing yet: the beginning.
fn or_start(id: &str) -> &str {
    if id.is_empty() { "0-0" } else { id }
}
