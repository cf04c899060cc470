//! One consumer-group subscription: where entries come from.
//!
//! The read loop, in order:
//! 1. create the group if it does not exist (MKSTREAM, starting at the beginning of the
//!    stream, so entries added before any consumer ran are not skipped);
//! 2. once, at start: re-read this consumer's own pending entries (those it had read but not
//!    settled when it last stopped or crashed), oldest first; after a read failed on its
//!    connection, those newer than the newest it read (a read whose reply was lost still
//!    made its entries pending to this consumer), and those a take-over (below) claimed when
//!    its reply was lost;
//! 3. on a claiming subscription, take entries other consumers left idle for at least
//!    `min_idle` (XAUTOCLAIM, walking the group's pending list with a cursor);
//! 4. with a delayed-retry set, ask for a sweep pass (see [`crate::pipeline::delayed`]), without waiting
//!    for it: due retries are appended to the group's retry lane (or the stream's tail) and
//!    read, by this read if it blocks, else by the next;
//! 5. read new entries (XREADGROUP `>` with COUNT and BLOCK) on a connection of its own; a
//!    partition on one Redis node reads on the shared connection instead, and waits with the
//!    subscription's other partitions in one blocking read (`shared_read.rs`).
//!
//! With a retry lane (every subscription with a delayed set, unless `retry_lane = false`; see
//! [`crate::pipeline::delayed`]) every step covers the lane as well as the stream, the lane first. Step 5 reads the lane on its own first and gives the
//! stream only the room left (one blocking XREADGROUP over both when the lane is empty), so a
//! retry that comes due while a backlog waits in the stream is read at the next read; each
//! entry is settled in the stream it was read from. A read woken because the timer's sweep
//! just filled the lane skips step 4, and may use the handler slots kept for due retries
//! (`slots.rs`), which new stream entries never take. A lane read that used all its slots may
//! have left due retries behind: the lane is read again as soon as one of those slots frees.
//!
//! A non-claiming subscription also takes over the pending entries of consumers that are
//! gone (idle for `consumer_gone_after`, e.g. a host that came back under a new pod name):
//! every half of that interval it looks at the group's consumers (XINFO CONSUMERS) and XCLAIMs
//! what such a consumer still holds, each entry only if it too has been idle that long. An entry
//! a gone host left pending for a delayed retry is handled then, possibly before its delay.
//!
//! Each entry becomes a [`Delivery`] handed to the [`Dispatcher`], at most `max_in_flight` at a
//! time: the loop waits for free handler slots before it reads, and reads no more than it holds
//! (`slots.rs`). A read's deliveries run concurrently on one task, as many as the handler's
//! typical time fits in [`GROUP_WORK`], and the rest on further tasks the runtime spreads over
//! its threads: a light handler's deliveries and their acks then stay on one thread (a task per
//! delivery cost more in cross-thread wake-ups than the handler itself), while heavy handlers
//! still use every core. The acks of deliveries that end together go to the acker as one.
//!
//! A retry that stays pending comes back through a local timer (`pending_retry.rs`) that
//! re-claims the entry when its delay is over (XCLAIM, which also bumps Redis's delivery
//! counter); after a crash, step 2 brings it back instead. On a claiming subscription the timer
//! is not needed: XAUTOCLAIM takes the entry once it has been idle for `min_idle`, so the delay
//! is rounded up to `min_idle`.
//!
//! When a read fails the loop logs what kind of failure it was (see
//! [`crate::store::redis_conn::ErrorClass`]), drops its connection and tries again with capped
//! exponential backoff that only a successful read resets; nothing that was read is lost, since
//! unsettled entries stay pending. When the group is gone (NOGROUP: the stream or the group was
//! deleted) it is created again, starting after the last entry this host read (from the
//! beginning of the stream if it read none), and the log says from which id.
//!
//! Every read records its success or failure in a [`ReadHealth`], which `/readyz` reports: a
//! subscription that has not read successfully for longer than its block time (plus a grace)
//! makes the host not ready, with the reason.
//!
//! The files, in the loop's order: [`supervise`] keeps the loop running; [`group`] makes the
//! group; [`run`] is the loop, one turn per read as a row of steps; [`gates`] are the flow
//! controls a read passes ([`slots`] and the rate limit are the others); [`batch`] is what a
//! read brings (with [`rescue`], when to look for gone consumers); [`commands`] are the Redis
//! commands and their replies, [`shared_read`] the partitions' one blocking read; [`start`]
//! starts the deliveries; [`pending_retry`] takes back a retry that stays pending.

mod batch;
pub mod commands;
mod gates;
mod group;
mod pending_retry;
mod rescue;
mod run;
pub mod shared_read;
mod slots;
mod start;
mod supervise;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::entry::delivery::Source;
use crate::observe::health::ReadHealth;
use crate::pipeline::admit::FlowState;
use crate::pipeline::delayed::DelayedSet;
use crate::pipeline::dispatch::Dispatcher;
use crate::store::keys::Secret;
use crate::store::redis_conn::{ReconnectBackoff, RedisHandle};
use rescue::Quiet;
pub use shared_read::SharedRead;
use slots::Slots;

/// What a subscription needs to know about where and how to read.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    pub stream: Arc<str>,
    /// The retry lane, read before the stream, if the subscription has one.
    pub lane: Option<Arc<str>>,
    pub group: Arc<str>,
    /// This consumer's name.
    pub consumer: Arc<str>,
    /// XREADGROUP COUNT: the most entries one read asks for.
    pub count: usize,
    /// XREADGROUP BLOCK: how long one read waits for new entries.
    pub block: Duration,
    /// Set on a claiming subscription.
    pub claim_min_idle: Option<Duration>,
    /// On a non-claiming subscription: take over the pending entries of consumers idle this
    /// long.
    pub gone_after: Option<Duration>,
    /// Deliveries handled at once.
    pub max_in_flight: usize,
    /// Of those, how many only retry-lane entries may take (see `slots.rs`; 0 without a lane).
    pub lane_slots: usize,
    /// The largest entry of the latest read, in bytes: the next read asks for no more entries
    /// of that size than [`commands::MAX_READ_BYTES`] holds.
    pub largest_entry: Arc<std::sync::atomic::AtomicUsize>,
    /// `max_entry_bytes`: a field's name or value over this is not kept by a read (on the
    /// lean readers), and its entry is dead-lettered from Redis unhandled.
    pub max_entry_bytes: usize,
}

impl ReadPlan {
    /// The key of `source`.
    pub fn key(&self, source: Source) -> &str {
        source.key(&self.stream, self.lane.as_deref())
    }

    /// The sources this subscription reads, in the order it serves them: the lane first.
    pub fn sources(&self) -> impl Iterator<Item = Source> + use<> {
        let lane = self.lane.is_some().then_some(Source::Lane);
        lane.into_iter().chain([Source::Stream])
    }
}

/// A running subscription: one partition's read loop, and what its deliveries share.
pub struct Subscription {
    plan: ReadPlan,
    conn: RedisHandle,
    dispatcher: Arc<Dispatcher>,
    delayed: Option<Arc<DelayedSet>>,
    slots: Slots,
    /// Ids being handled, on a claiming subscription only: XAUTOCLAIM can hand back an entry
    /// this host is still handling. A plain subscription never reads an entry twice.
    in_flight: Option<Mutex<HashSet<(Source, String)>>>,
    stop: CancellationToken,
    tracker: TaskTracker,
    reconnects: prometheus_client::metrics::counter::Counter,
    secret: Option<Arc<Secret>>,
    health: Arc<ReadHealth>,
    /// The newest id this host read from each source: where a group deleted under it is
    /// created again.
    last_read: Mutex<HashMap<Source, String>>,
    /// When to look for gone consumers next.
    next_rescue: Mutex<tokio::time::Instant>,
    /// Whether the last look for gone consumers still holds (see [`Quiet`]).
    rescue_quiet: Mutex<Quiet>,
    /// The blocking read this partition shares with the subscription's other partitions, if
    /// it waits there rather than on a connection of its own.
    shared: Option<Arc<SharedRead>>,
    /// Its bell, when it waits on the host's doorbell instead of a blocking read.
    bell: Option<crate::store::doorbell::Bell>,
    /// Whether its last read found nothing (with a bell: the next waits for a ring first).
    idle: std::sync::atomic::AtomicBool,
    /// Whether it may take entries now (see [`crate::pipeline::admit`]).
    flow: watch::Receiver<FlowState>,
    /// The group's shared rate limit, if it has one.
    rate: Option<Arc<crate::pipeline::admit::rate::RateLimiter>>,
    /// The group's circuit breaker, if it has one.
    breaker: Option<Arc<crate::pipeline::admit::breaker::Breaker>>,
    /// Its keys' turns, on an ordered subscription.
    order: Option<Arc<crate::pipeline::order::Order>>,
    /// Its dedupe record, on a deduplicating subscription.
    dedupe: Option<Arc<crate::pipeline::dedupe::Deduper>>,
}

/// What a subscription shares with the rest of the host.
pub struct SubscriptionParts {
    /// Counts the deliveries in flight (each holds a token while it runs).
    pub tracker: TaskTracker,
    /// Ends the read loop and pending-retry timers.
    pub stop: CancellationToken,
    /// The stream's secret, which verifies the sweep's bookkeeping (none: nothing is trusted).
    pub secret: Option<Arc<Secret>>,
    /// Where the read loop reports how its reads go.
    pub health: Arc<ReadHealth>,
    /// The blocking read shared by the subscription's partitions (none: one of its own).
    pub shared: Option<Arc<SharedRead>>,
    /// Its bell on the host's doorbell: when set, it reads without blocking on the shared
    /// connection and, once idle, waits for a ring instead of a blocking read.
    pub bell: Option<crate::store::doorbell::Bell>,
    /// The subscription's flow controls, kept up to date by a [`crate::pipeline::admit::FlowWatcher`].
    pub flow: watch::Receiver<FlowState>,
    /// The group's shared rate limit (one for all partitions), if it has one.
    pub rate: Option<Arc<crate::pipeline::admit::rate::RateLimiter>>,
    /// The group's circuit breaker (one for all partitions), if it has one.
    pub breaker: Option<Arc<crate::pipeline::admit::breaker::Breaker>>,
    /// The partition's keys' turns, on an ordered subscription.
    pub order: Option<Arc<crate::pipeline::order::Order>>,
    /// The partition's dedupe record, on a deduplicating subscription.
    pub dedupe: Option<Arc<crate::pipeline::dedupe::Deduper>>,
}

impl Subscription {
    /// A subscription reading with `plan` through `client` (blocking reads get a connection of
    /// their own) and `conn` (everything else), handing entries to `dispatcher`.
    pub fn new(
        plan: ReadPlan,
        conn: RedisHandle,
        dispatcher: Arc<Dispatcher>,
        delayed: Option<Arc<DelayedSet>>,
        parts: SubscriptionParts,
        metrics: &crate::observe::metrics::Metrics,
    ) -> Arc<Self> {
        let labels = crate::observe::metrics::Metrics::labels(&plan.stream, &plan.group);
        let claiming = plan.claim_min_idle.is_some();
        Arc::new(Self {
            reconnects: metrics
                .reconnects
                .get_or_create(&metrics.series(&labels))
                .clone(),
            slots: Slots::new(&plan),
            plan,
            conn,
            dispatcher,
            delayed,
            in_flight: claiming.then(|| Mutex::new(HashSet::new())),
            stop: parts.stop,
            tracker: parts.tracker,
            secret: parts.secret,
            health: parts.health,
            last_read: Mutex::new(HashMap::new()),
            next_rescue: Mutex::new(tokio::time::Instant::now()),
            rescue_quiet: Mutex::new(Quiet::No),
            shared: parts.shared,
            bell: parts.bell,
            idle: std::sync::atomic::AtomicBool::new(false),
            flow: parts.flow,
            rate: parts.rate,
            breaker: parts.breaker,
            order: parts.order,
            dedupe: parts.dedupe,
        })
    }

    /// Every source at `id`, the lane first: where the own-pending re-read and the claim
    /// cursors start.
    fn every_source_at(&self, id: &str) -> Vec<(Source, String)> {
        self.plan.sources().map(|s| (s, id.to_owned())).collect()
    }

    /// Every source at the newest id this host read from it (`0` if none): where this
    /// consumer's pending entries that no reply brought begin. Entries it is handling or
    /// waiting to retry are all at or below that id, so none is started twice.
    fn after_last_read(&self) -> Vec<(Source, String)> {
        let Ok(newest) = self.last_read.lock() else {
            return self.every_source_at("0");
        };
        self.plan
            .sources()
            .map(|s| (s, newest.get(&s).cloned().unwrap_or_else(|| "0".to_owned())))
            .collect()
    }

    /// Log a Redis failure and wait before the next attempt; false if stopped meanwhile.
    async fn pause_after_error(&self, message: &str, backoff: &mut ReconnectBackoff) -> bool {
        let pause = backoff.next_delay();
        tracing::warn!(
            stream = %self.plan.stream,
            group = %self.plan.group,
            retry_in_ms = pause.as_millis() as u64,
            "{message}"
        );
        tokio::select! {
            () = tokio::time::sleep(pause) => true,
            () = self.stop.cancelled() => false,
        }
    }
}
