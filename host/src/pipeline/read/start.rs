//! Starting what a read brought: one delivery per entry, each holding a handler slot, run
//! together on as few tasks as the handler's time allows, their acks queued together.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use redis::RedisResult;
use tokio::sync::OwnedSemaphorePermit;

use super::Subscription;
use super::commands::ReadEntry;
use super::slots::Taken;
use crate::entry::delivery::{Delivery, Entry, Source};
use crate::pipeline::dispatch::Settled;
use crate::pipeline::settle::Ack;

impl Subscription {
    /// Start a delivery for each entry read, each with one of the slots the read was
    /// sized by; slots left over (deleted entries, a short read) are released.
    pub(super) async fn start_deliveries(
        self: &Arc<Self>,
        batch: Vec<(ReadEntry, u64)>,
        mut slots: Taken,
    ) {
        if let Ok(mut newest) = self.last_read.lock() {
            // Each source's entries come in id order: its last one is its newest.
            for source in self.plan.sources() {
                if let Some((read, _)) = batch.iter().rev().find(|(r, _)| r.source == source) {
                    let last = newest.entry(source).or_insert_with(|| read.id.clone());
                    if crate::entry::delivery::cmp_ids(&read.id, last).is_gt() {
                        last.clone_from(&read.id);
                    }
                }
            }
        }
        if let Some(order) = self.order.clone() {
            return self.start_ordered(&order, batch, slots).await;
        }
        if let Some(dedupe) = self.dedupe.clone() {
            // Judged on a task of its own: the next read goes out while Redis judges this one
            // (its slots are this batch's; the tracker waits for it on stop).
            let this = self.clone();
            self.tracker.spawn(async move {
                this.start_deduped(&dedupe, batch, slots).await;
            });
            return;
        }
        // A read's deliveries run together on as few tasks as their handler's time allows
        // (`spawn_group`): a task per delivery would hand most of them to another worker
        // thread (and their acks back), wake-ups that cost more than a light handler.
        let mut group = Vec::with_capacity(batch.len());
        for (read, delivery_count) in batch {
            let Some((entry, source, cut)) = self.kept(read, delivery_count).await else {
                continue;
            };
            let Some(permit) = self.permit(&mut slots, source, &mut group).await else {
                return;
            };
            if let Some(delivery) = self.delivery((entry, cut), source, delivery_count, permit) {
                group.push(delivery);
            }
        }
        self.spawn_group(group);
    }

    /// A handler slot for an entry from `source`: one the read was sized by, else (after
    /// starting the `group` that has its slots) the next that frees; `None` once stopping.
    async fn permit(
        self: &Arc<Self>,
        slots: &mut Taken,
        source: Source,
        group: &mut Vec<DeliveryTask>,
    ) -> Option<OwnedSemaphorePermit> {
        if let Some(permit) = slots.one_for(source) {
            return Some(permit);
        }
        self.spawn_group(std::mem::take(group));
        self.slots.one().await
    }

    /// What of a read entry is handled here: `None` when it is read again alone (past the
    /// read's budget) or was deleted while pending (then acknowledged).
    async fn kept(
        self: &Arc<Self>,
        read: ReadEntry,
        delivery_count: u64,
    ) -> Option<(Entry, Source, crate::store::redis_conn::lean::Cut)> {
        let (id, source, mut cut) = (read.id.clone(), read.source, read.cut);
        // Left out past the budget, but over the limit as a whole (many fields, each under
        // it): never read whole, dead-lettered from Redis. Counted as `max_entry_bytes`
        // counts, each field with its overhead (found by the attack review of issue 52: by
        // bytes alone a million one-byte fields passed, and were read again whole).
        if cut.fields > 0 && !cut.over {
            let overhead = crate::entry::delivery::FIELD_OVERHEAD;
            let kept: u64 = read
                .fields
                .iter()
                .flatten()
                .map(|(n, v)| (n.len() + v.len()) as u64 + overhead)
                .sum();
            let left_out = cut.bytes + cut.fields as u64 * overhead;
            cut.over = kept + left_out > self.plan.max_entry_bytes as u64;
        }
        if cut.fields > 0 && !cut.over {
            // Past the read's budget: read again alone, when a slot is free.
            self.read_alone(id, source, delivery_count);
            return None;
        }
        let Some(entry) = read.into_entry() else {
            self.drop_deleted(source, &id).await;
            return None;
        };
        Some((entry, source, cut))
    }

    /// Run `deliveries` in tasks of about [`GROUP_WORK`] of handler time each, which the
    /// runtime spreads over its workers: one task for a light handler's whole read, one per
    /// delivery for a heavy handler, and for one not yet timed (its first read) too.
    pub(super) fn spawn_group(self: &Arc<Self>, mut deliveries: Vec<DeliveryTask>) {
        let per_task = match self.dispatcher.typical_handler_time() {
            Some(typical) => usize::try_from(GROUP_WORK.as_nanos() / typical.as_nanos().max(1))
                .unwrap_or(usize::MAX)
                .max(1),
            None => 1,
        };
        while !deliveries.is_empty() {
            let rest = deliveries.split_off(per_task.min(deliveries.len()));
            let chunk = std::mem::replace(&mut deliveries, rest);
            self.spawn_together(chunk);
        }
    }

    /// Run `deliveries` concurrently on one task, queueing the acks of those that end
    /// together as one.
    pub(super) fn spawn_together(self: &Arc<Self>, mut deliveries: Vec<DeliveryTask>) {
        if deliveries.len() <= 1 {
            if let Some(delivery) = deliveries.pop() {
                self.spawn_alone(delivery);
            }
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let mut running: FuturesUnordered<DeliveryTask> = deliveries.into_iter().collect();
            while let Some(first) = running.next().await {
                let mut acks: Vec<Ack> = first.into_iter().collect();
                while let Some(Some(more)) = running.next().now_or_never() {
                    acks.extend(more);
                }
                this.dispatcher.ack_all(acks);
            }
        });
    }

    /// Run one delivery on a task of its own.
    pub(super) fn spawn_alone(self: &Arc<Self>, delivery: DeliveryTask) {
        let this = self.clone();
        tokio::spawn(async move {
            if let Some(ack) = delivery.await {
                this.dispatcher.ack_all(vec![ack]);
            }
        });
    }

    /// An entry that was deleted from the stream while pending has nothing left to handle:
    /// acknowledge it so it leaves the pending list.
    pub(super) async fn drop_deleted(&self, source: Source, id: &str) {
        tracing::warn!(
            stream = %self.plan.key(source),
            id,
            "pending entry was deleted from the stream; acknowledging it"
        );
        let mut conn = self.conn.clone();
        let acked: RedisResult<u64> = redis::cmd("XACK")
            .arg(self.plan.key(source))
            .arg(&*self.plan.group)
            .arg(id)
            .query_async(&mut conn)
            .await;
        if let Err(err) = acked {
            tracing::warn!(id, %err, "could not acknowledge deleted entry; it stays pending");
            return;
        }
        // A turn of its key it held goes to the key's next entry (a stream entry is its own
        // origin; a lane copy is the host's own, never deleted by a producer).
        if let Some(order) = &self.order
            && source == Source::Stream
            && let Err(err) = order.forget(&[id]).await
        {
            tracing::warn!(id, %err, "could not give back the key's turn a deleted entry held; `sluice keys --release` frees it");
        }
    }

    pub(super) fn spawn_delivery(
        self: &Arc<Self>,
        entry: Entry,
        source: Source,
        delivery_count: u64,
        permit: OwnedSemaphorePermit,
    ) {
        let delivery = self.new_delivery((entry, Default::default()), source, delivery_count);
        if let Some(dedupe) = self.dedupe.clone() {
            // An entry read again alone (past a read's byte budget) is judged like any.
            let this = self.clone();
            tokio::spawn(async move {
                let run = this
                    .judged(&dedupe, vec![delivery])
                    .await
                    .unwrap_or_default();
                if let Some(task) = run
                    .into_iter()
                    .next()
                    .and_then(|d| this.delivery_task(d, permit))
                {
                    this.spawn_alone(task);
                }
            });
            return;
        }
        let Some(order) = self.order.clone() else {
            if let Some(task) = self.delivery_task(delivery, permit) {
                self.spawn_alone(task);
            }
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            let run = this.in_turn(&order, vec![delivery]).await;
            if let Some(task) = run
                .into_iter()
                .next()
                .and_then(|d| this.delivery_task(d, permit))
            {
                this.spawn_alone(task);
            }
        });
    }

    /// Start a read's deliveries on an ordered subscription: those whose key's turn is free
    /// (or already theirs) run, the others are queued behind it in Redis (`pipeline::order`)
    /// and give their slots back at once.
    async fn start_ordered(
        self: &Arc<Self>,
        order: &crate::pipeline::order::Order,
        batch: Vec<(ReadEntry, u64)>,
        slots: Taken,
    ) {
        // Entries the order's read script delivered have their place already; the others (the
        // lane's: retries and entries let in hold their turn, a requeued dead letter takes one
        // or waits; this consumer's own pending, claimed ones) are looked up.
        let mut ready = Vec::with_capacity(batch.len());
        let mut deliveries = Vec::with_capacity(batch.len());
        for (read, delivery_count) in batch {
            let placed = read.placed;
            if let Some((entry, source, cut)) = self.kept(read, delivery_count).await {
                let delivery = self.new_delivery((entry, cut), source, delivery_count);
                if placed {
                    ready.push(delivery);
                } else {
                    deliveries.push(delivery);
                }
            }
        }
        if !deliveries.is_empty() {
            ready.extend(self.in_turn(order, deliveries).await);
        }
        self.start_ready(ready, slots).await;
    }

    /// Start `ready` (deliveries whose place is settled), each with a slot of the read's (or
    /// the next that frees), on as few tasks as their handler's time allows.
    async fn start_ready(self: &Arc<Self>, ready: Vec<Delivery>, mut slots: Taken) {
        let mut group = Vec::with_capacity(ready.len());
        for delivery in ready {
            let Some(permit) = self.permit(&mut slots, delivery.source, &mut group).await else {
                return;
            };
            if let Some(task) = self.delivery_task(delivery, permit) {
                group.push(task);
            }
        }
        self.spawn_group(group);
    }

    /// A deduplicating subscription's read: its stream entries judged first (duplicates are
    /// acknowledged unhandled), the rest run.
    async fn start_deduped(
        self: &Arc<Self>,
        dedupe: &crate::pipeline::dedupe::Deduper,
        batch: Vec<(ReadEntry, u64)>,
        slots: Taken,
    ) {
        let mut deliveries = Vec::with_capacity(batch.len());
        for (read, delivery_count) in batch {
            if let Some((entry, source, cut)) = self.kept(read, delivery_count).await {
                deliveries.push(self.new_delivery((entry, cut), source, delivery_count));
            }
        }
        if let Some(run) = self.judged(dedupe, deliveries).await {
            self.start_ready(run, slots).await;
        }
    }

    /// The deliveries of a deduplicating subscription that run (see
    /// [`crate::pipeline::dedupe::Deduper::judge`]), judging again with capped backoff while
    /// Redis fails; `None` once the subscription stops (the entries stay pending, and are
    /// judged when read again).
    async fn judged(
        &self,
        dedupe: &crate::pipeline::dedupe::Deduper,
        mut deliveries: Vec<Delivery>,
    ) -> Option<Vec<Delivery>> {
        let mut backoff = crate::store::redis_conn::ReconnectBackoff::default();
        let mut conn = self.conn.clone();
        loop {
            match dedupe
                .judge(&mut conn, &self.plan.consumer, deliveries)
                .await
            {
                Ok(run) => return Some(run),
                Err((err, back)) => {
                    deliveries = back;
                    let pause = backoff.next_delay();
                    tracing::warn!(
                        stream = %self.plan.stream,
                        entries = deliveries.len(),
                        %err,
                        retry_in_ms = pause.as_millis() as u64,
                        "could not judge a read's entries against the dedupe record; they stay pending, trying again"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = self.stop.cancelled() => return None,
                    }
                }
            }
        }
    }

    /// The deliveries that run now (see [`crate::pipeline::order::Order::admit`]), asking
    /// again with capped backoff while Redis fails; none once the subscription stops (the
    /// entries stay pending, and are read again).
    async fn in_turn(
        &self,
        order: &crate::pipeline::order::Order,
        mut deliveries: Vec<Delivery>,
    ) -> Vec<Delivery> {
        let mut backoff = crate::store::redis_conn::ReconnectBackoff::default();
        loop {
            match order.admit(deliveries).await {
                Ok(admitted) => return admitted.run,
                Err((err, back)) => {
                    deliveries = back;
                    let pause = backoff.next_delay();
                    tracing::warn!(
                        stream = %self.plan.stream,
                        entries = deliveries.len(),
                        %err,
                        retry_in_ms = pause.as_millis() as u64,
                        "could not take the keys' turns for a read; its entries stay pending, trying again"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = self.stop.cancelled() => return Vec::new(),
                    }
                }
            }
        }
    }

    /// One delivery from start to settle, holding its handler slot; `None` when it is being
    /// handled already.
    pub(super) fn delivery(
        self: &Arc<Self>,
        (entry, cut): (Entry, crate::store::redis_conn::lean::Cut),
        source: Source,
        delivery_count: u64,
        permit: OwnedSemaphorePermit,
    ) -> Option<DeliveryTask> {
        let delivery = self.new_delivery((entry, cut), source, delivery_count);
        self.delivery_task(delivery, permit)
    }

    /// The delivery of an entry read from `source`.
    pub(super) fn new_delivery(
        &self,
        (entry, cut): (Entry, crate::store::redis_conn::lean::Cut),
        source: Source,
        delivery_count: u64,
    ) -> Delivery {
        let mut delivery = Delivery::new(
            self.plan.stream.clone(),
            self.plan.group.clone(),
            (source, self.plan.key(source)),
            entry,
            delivery_count,
            self.secret.as_deref(),
        );
        delivery.cut = cut;
        delivery
    }

    /// `delivery` from start to settle, holding its handler slot; `None` when it is being
    /// handled already.
    pub(super) fn delivery_task(
        self: &Arc<Self>,
        delivery: Delivery,
        permit: OwnedSemaphorePermit,
    ) -> Option<DeliveryTask> {
        let (source, delivery_count) = (delivery.source, delivery.delivery_count);
        if let Some(Ok(mut in_flight)) = self.in_flight.as_ref().map(Mutex::lock)
            && !in_flight.insert((source, delivery.entry.id.clone()))
        {
            // XAUTOCLAIM handed back an entry this host is still handling.
            return None;
        }
        let this = self.clone();
        // The tracker counts deliveries, not tasks: shutdown waits for each to settle.
        let tracked = self.tracker.token();
        Some(Box::pin(async move {
            let _tracked = tracked;
            let id = delivery.entry.id.clone();
            // A panic (a bug in the host) must not take the rest of the read down with it.
            let settled = AssertUnwindSafe(this.dispatcher.dispatch(delivery))
                .catch_unwind()
                .await;
            drop(permit);
            if let Some(Ok(mut in_flight)) = this.in_flight.as_ref().map(Mutex::lock) {
                in_flight.remove(&(source, id.clone()));
            }
            let settled = settled.unwrap_or_else(|_| {
                let delay = this.dispatcher.failure_delay(delivery_count);
                tracing::error!(
                    stream = %this.plan.key(source),
                    id,
                    retry_in_ms = delay.as_millis() as u64,
                    "delivery panicked (a bug in the host); the entry stays pending and comes back after the backoff"
                );
                Settled::RetryPending(delay)
            });
            match settled {
                Settled::Ack(ack) => Some(ack),
                Settled::Done => None,
                Settled::RetryPending(delay) => {
                    this.retry_later(id, source, delivery_count, delay);
                    None
                }
            }
        }))
    }
}

/// How much handler time one task of a read's deliveries is given before the rest go to
/// another task. Below it, keeping them on one thread saves more than a second core would
/// gain; a handler that runs this long gets a task per delivery, as if there were no grouping.
/// A rare heavy call among light ones delays its task's others by up to one epoch tick, where
/// the guest yields. At 200 µs a read of 128 reused-instance WASM calls (about 3 µs each) went
/// to two tasks, woke the other worker and sent two XACKs; at 500 µs it is one task, and the
/// next read's task is what the other worker takes (issue 50: 20 % less host time per message
/// for `wasm`, the retry lane's p99 unchanged).
const GROUP_WORK: Duration = Duration::from_micros(500);

/// One delivery's work, to be run on a task alone or with the rest of its read; it ends with
/// the ack to queue, if the entry is to be acknowledged.
type DeliveryTask = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Ack>> + Send>>;
