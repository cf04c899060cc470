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

pub mod commands;
mod pending_retry;
pub mod shared_read;
mod slots;

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use redis::RedisResult;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::entry::delivery::{Delivery, Entry, Source};
use crate::observe::health::ReadHealth;
use crate::pipeline::admit::FlowState;
use crate::pipeline::admit::breaker::Gate;
use crate::pipeline::delayed::DelayedSet;
use crate::pipeline::dispatch::{Dispatcher, Settled};
use crate::pipeline::settle::Ack;
use crate::store::keys::Secret;
use crate::store::redis_conn::{ErrorClass, Reader, ReconnectBackoff, RedisHandle};
use commands::ReadEntry;
pub use shared_read::SharedRead;
use slots::{Slots, Taken};

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

/// A running subscription.
/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The most delivery counts of held-back entries a read loop keeps (see `hold_back`).
const MAX_HELD_COUNTS: usize = 4096;
/// The first wait before a read loop that ended is started again; it doubles up to
/// [`SUPERVISE_BACKOFF_MAX`].
const SUPERVISE_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait before a read loop is started again.
const SUPERVISE_BACKOFF_MAX: Duration = Duration::from_secs(10);

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
}

/// What the last look for gone consumers of a partition with a bell found.
#[derive(Debug)]
enum Quiet {
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

/// Why a read was let through the flow controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    /// Nothing held the subscription.
    Open,
    /// A half-open breaker's probe: one delivery.
    Probe,
    /// The breaker's script found it closed before this host's watcher did.
    BreakerClosed,
}

impl Admission {
    /// Whether the flow controls hold a read let through this way, as they stand now: an
    /// ordinary read by any hold, a probe (or a read the breaker's own script let through)
    /// only by a pause.
    fn held_by(self, flow: &FlowState) -> bool {
        match self {
            Admission::Open => !flow.open(),
            Admission::Probe | Admission::BreakerClosed => flow.paused.is_some(),
        }
    }
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
        })
    }

    /// Create the group, then read until stopped.
    /// Run the read loop until the stop, restarting it (with backoff) whenever it ends or
    /// panics before then: a loop that died silently would leave the subscription unread
    /// while the host looked ready. Each restart is logged, counted
    /// (`sluice_read_loop_restarts_total`) and shown by readiness until the loop runs again.
    pub async fn supervise(
        self: Arc<Self>,
        restarts: prometheus_client::metrics::counter::Counter,
    ) {
        let mut backoff = SUPERVISE_BACKOFF_MIN;
        let mut restarted = false;
        loop {
            let started = tokio::time::Instant::now();
            let task = tokio::spawn(self.clone().run(restarted));
            // Aborting the supervisor (a stop past its grace) aborts the loop it runs.
            let _abort = AbortOnDrop(task.abort_handle());
            let ended = task.await;
            restarted = true;
            if self.stop.is_cancelled() {
                return;
            }
            let why = match ended {
                Ok(()) => "the read loop ended unexpectedly".to_owned(),
                Err(err) if err.is_panic() => {
                    let payload = err.into_panic();
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".to_owned());
                    let (message, _) = crate::entry::outcome::bounded_text(&message, 1024);
                    format!("the read loop panicked: {message}")
                }
                Err(err) => format!("the read loop was cancelled: {err}"),
            };
            if started.elapsed() > SUPERVISE_BACKOFF_MAX * 4 {
                backoff = SUPERVISE_BACKOFF_MIN;
            }
            restarts.inc();
            tracing::error!(
                stream = %self.plan.stream,
                group = %self.plan.group,
                restart_in_ms = backoff.as_millis() as u64,
                "{why}; restarting it"
            );
            self.health.loop_down(Some(format!("{why}; restarting")));
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.stop.cancelled() => return,
            }
            self.health.loop_down(None);
            backoff = (backoff * 2).min(SUPERVISE_BACKOFF_MAX);
        }
    }

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
        let mut reader: Option<Reader> = None;
        let mut own_pending = if restarted {
            self.after_last_read()
        } else {
            self.every_source_at("0")
        };
        let mut claim_cursor = self.every_source_at("0-0");
        // Ids a take-over claimed whose reply never came (the connection failed): they may be
        // pending to this consumer with nobody here handling them, below the newest id it
        // read, where the re-read after a failure does not look. Looked for after a reconnect.
        let mut unanswered: Vec<(Source, Vec<String>)> = Vec::new();
        // Delivery counts of entries a pause held back, restored when they are read again.
        let mut held_counts: HashMap<(Source, String), u64> = HashMap::new();
        // A lane read that filled its room may have left due retries in the lane: those are
        // read as soon as slots for them free (half the slots kept for due retries, so a lane
        // holding thousands is read in batches, not an entry at a time), not at the next sweep
        // that moves something.
        let mut lane_more = false;
        let mut backoff = ReconnectBackoff::default();
        loop {
            let mut admission = Admission::Open;
            if !self.flow.borrow().open() {
                // No read runs while held: a read failure just before is not one that lasts
                // (whether Redis answers is then the flow watcher's to say).
                self.health.not_reading();
                match self.admitted().await {
                    Some(how) => admission = how,
                    None => break,
                }
                self.resumed(&mut own_pending);
            }
            // Idle with a bell: wait for a ring (a write to the stream or lane) before taking
            // any slot or token, so that a retry taken back by its timer, or another read,
            // is not kept waiting by a reader that has nothing to read.
            let mut rung = true;
            if let Some(bell) = &self.bell
                && self.idle.load(std::sync::atomic::Ordering::Acquire)
                && own_pending.is_empty()
                && unanswered.is_empty()
            {
                tokio::select! {
                    woke = bell.wait(plan.block, self.next_rescue_at()) => rung = woke,
                    () = self.stop.cancelled() => break,
                }
                // Paused meanwhile: the admission above decides again.
                if !self.flow.borrow().open() {
                    continue;
                }
            }
            // Read in batches: wait until half a batch can start, then take what else is free.
            // Reading as soon as one slot frees would turn a busy subscription into a stream
            // of one-entry reads. Retries this host just moved into the retry lane are the
            // exception: they are read as soon as one delivery can start, in the slots
            // reserved for them if the stream holds all others (`slots.rs`).
            let floor = (plan.count.min(self.slots.shared_total()) / 2).max(1);
            let lane_filled = async {
                match &self.delayed {
                    Some(delayed) => delayed.lane_filled().await,
                    None => std::future::pending().await,
                }
            };
            let mut first = tokio::select! {
                taken = self.slots.shared(floor) => match taken {
                    Some(taken) => taken,
                    None => break,
                },
                taken = async {
                    if lane_more {
                        self.slots.for_lane(self.slots.lane_batch(floor)).await
                    } else {
                        lane_filled.await;
                        self.slots.for_lane(1).await
                    }
                } => match taken {
                    Some(taken) => taken,
                    None => break,
                },
                () = self.stop.cancelled() => break,
            };
            self.slots.top_up(&mut first, plan.count);
            if admission == Admission::Probe {
                first.limit(1);
            }
            // With a shared rate limit, no more entries than its budget gives now.
            let mut tokens = 0;
            if let Some(rate) = &self.rate {
                match rate.take(first.all(), &self.stop).await {
                    Some(n) => {
                        first.limit(n);
                        tokens = n;
                    }
                    None => break,
                }
            }
            // Waiting for slots or tokens may have taken a while: a pause (or an opened
            // breaker) that came meanwhile holds this read too, claims included.
            if admission.held_by(&self.flow.borrow()) {
                drop(first);
                self.unused(admission, tokens, true);
                continue;
            }
            // A subscription with a bell, or a partition (whose waits are the shared read's):
            // the node's pooled lean connections, one for each read (a busy one reads as fast
            // as on a connection of its own).
            if reader.is_none() && (self.bell.is_some() || self.shared.is_some()) {
                reader = self.conn.non_blocking_reader();
            }
            let conn = match &mut reader {
                Some(conn) => conn,
                // Only a successful read resets the backoff: a server that accepts connections
                // but refuses every read must not be asked 20 times a second.
                None => match self.conn.reader(plan.block, &plan.stream).await {
                    Ok(conn) => reader.insert(conn),
                    Err(err) => {
                        drop(first);
                        let reason = crate::support::chain::chain(&err);
                        self.health.failed(&reason);
                        if !self.pause_after_error(&reason, &mut backoff).await {
                            break;
                        }
                        continue;
                    }
                },
            };
            let batch = tokio::select! {
                batch = self.next_batch(conn, &first, &mut own_pending, &mut claim_cursor, &mut unanswered, rung) => batch,
                // Entries a cut-off read had already taken stay pending and are re-read on restart.
                () = self.stop.cancelled() => break,
            };
            match batch {
                Ok(batch) => {
                    backoff.reset();
                    self.health.read_ok();
                    let from_lane = batch
                        .iter()
                        .filter(|(e, _)| e.source == Source::Lane)
                        .count();
                    lane_more = plan.lane.is_some() && from_lane > 0 && from_lane >= first.all();
                    let batch = if admission.held_by(&self.flow.borrow()) {
                        self.hold_back(batch, &mut own_pending, &mut unanswered, &mut held_counts);
                        Vec::new()
                    } else if held_counts.is_empty() {
                        batch
                    } else {
                        // Entries held back by a pause come back with the count they had.
                        batch
                            .into_iter()
                            .map(|(read, count)| {
                                let held = held_counts.remove(&(read.source, read.id.clone()));
                                (read, held.unwrap_or(count))
                            })
                            .collect()
                    };
                    self.unused(
                        admission,
                        tokens.saturating_sub(batch.len()),
                        batch.is_empty(),
                    );
                    self.start_deliveries(batch, first).await;
                }
                Err(err) => {
                    drop(first);
                    self.unused(admission, tokens, true);
                    // The read's connection is its own: tell the handle, so a failover
                    // (READONLY, a lost master) is followed before the next reconnect.
                    self.conn.saw_error(&err);
                    let class = ErrorClass::of(&err);
                    let message = format!("read failed: {}: {err}", class.describe());
                    self.health.failed(&message);
                    // A failed read found nothing out: the next one reads (after the pause)
                    // instead of waiting for a ring, which a repair such as a group made again
                    // does not cause when the doorbell polls.
                    self.idle.store(false, std::sync::atomic::Ordering::Release);
                    // Nor does it wait on its keys: a key that cannot be read (another type
                    // under its name) is let go of, not watched by the doorbell for ever.
                    if let Some(bell) = &self.bell {
                        bell.set_idle(false);
                    }
                    if class == ErrorClass::NoGroup {
                        // The stream or the group was deleted: make the group again (the
                        // connection is fine) and read on; the pause still applies, so a
                        // group deleted over and over is not recreated in a tight loop.
                        // A group made again has no pending entries; one that still exists
                        // (another partition's group was the one gone) has those this host
                        // is handling, which must not be started twice: only entries after
                        // the last read are looked for, as after a reconnect.
                        self.recreate_group().await;
                        own_pending = self.after_last_read();
                    } else {
                        reader = None;
                        self.reconnects.inc();
                        // Redis may have handed this consumer entries whose reply never
                        // arrived (the connection died mid-reply): they are pending to it, and
                        // newer than anything it read. Re-read those before anything else.
                        own_pending = self.after_last_read();
                    }
                    if !self.pause_after_error(&message, &mut backoff).await {
                        break;
                    }
                }
            }
        }
        tracing::info!(stream = %plan.stream, group = %plan.group, "subscription stopped reading");
    }

    /// What a read did not use: `tokens` back to the rate limit's lease, and, when it started
    /// nothing (`nothing_started`), its probe permit.
    fn unused(&self, admission: Admission, tokens: usize, nothing_started: bool) {
        if let Some(rate) = &self.rate {
            rate.give_back(tokens, nothing_started);
        }
        if admission == Admission::Probe
            && nothing_started
            && let Some(breaker) = &self.breaker
        {
            breaker.probe_unused();
        }
    }

    /// Wait while the subscription is paused (or its flow state is not known yet); false if
    /// stopped meanwhile.
    pub(super) async fn wait_open(&self) -> bool {
        let mut flow = self.flow.clone();
        let mut said = false;
        loop {
            {
                let state = flow.borrow_and_update();
                if state.open() {
                    return true;
                }
                if let Some(paused) = &state.paused
                    && !said
                {
                    tracing::info!(
                        stream = %self.plan.stream,
                        group = %self.plan.group,
                        "{}; not reading until resumed",
                        paused.describe()
                    );
                    said = true;
                }
            }
            tokio::select! {
                changed = flow.changed() => {
                    if changed.is_err() {
                        // The watcher is gone: only a stop ends it.
                        self.stop.cancelled().await;
                        return false;
                    }
                }
                () = self.stop.cancelled() => return false,
            }
        }
    }

    /// Wait until the flow controls let this read through: paused, wait for the resume;
    /// with the breaker open, ask it (after the time it names) for a probe. `None` if stopped.
    async fn admitted(&self) -> Option<Admission> {
        let mut flow = self.flow.clone();
        let mut said = false;
        loop {
            let (open, paused, breaker) = {
                let state = flow.borrow_and_update();
                (
                    state.open(),
                    state.known.then(|| state.paused.clone()).flatten(),
                    state.known && state.breaker.is_some(),
                )
            };
            if open {
                return Some(Admission::Open);
            }
            let mut wait = None;
            if let Some(paused) = paused {
                if !said {
                    tracing::info!(
                        stream = %self.plan.stream,
                        group = %self.plan.group,
                        "{}; not reading until resumed",
                        paused.describe()
                    );
                    said = true;
                }
            } else if breaker && let Some(b) = &self.breaker {
                match b.gate().await {
                    Gate::Closed => return Some(Admission::BreakerClosed),
                    Gate::Probe => return Some(Admission::Probe),
                    Gate::Wait(after) => wait = Some(after),
                }
            }
            // A breaker another host's configuration opened, without one here: wait for it
            // to close like a pause.
            tokio::select! {
                changed = flow.changed() => {
                    if changed.is_err() {
                        self.stop.cancelled().await;
                        return None;
                    }
                }
                () = async {
                    match wait {
                        Some(after) => tokio::time::sleep(after).await,
                        None => std::future::pending().await,
                    }
                } => {}
                () = self.stop.cancelled() => return None,
            }
        }
    }

    /// After a pause: what a read held back is read again from this consumer's pending list
    /// (a claiming subscription's XAUTOCLAIM finds it instead), and no consumer counts as
    /// gone for another half `consumer_gone_after`. Every host of the group resumes at once,
    /// and each one's pending entries went idle while paused: this host takes its own back
    /// (which makes them busy again) before another one would take them over as a gone
    /// consumer's.
    fn resumed(&self, own_pending: &mut Vec<(Source, String)>) {
        // A claiming subscription too: waiting for XAUTOCLAIM would leave a held entry for
        // `claim_min_idle` (its in-flight set keeps a re-read entry from starting twice).
        *own_pending = self.after_last_read();
        if let Some(gone_after) = self.plan.gone_after
            && let Ok(mut next) = self.next_rescue.lock()
        {
            *next = (*next).max(tokio::time::Instant::now() + gone_after / 2);
        }
    }

    /// A read that returned after the pause (or an opened breaker) came: none of its entries
    /// is handled now. All are pending to this consumer: those newer than anything it read are
    /// read again from its pending list after the resume; those at or below (a claim, a
    /// take-over, a lost reply's entries) are looked for among its pending entries by id, as
    /// a lost take-over reply's are, since no re-read from the newest id would find them.
    /// Each one's delivery count is kept in `counts`: the re-read raises Redis's counter for
    /// a delivery that never ran, which must not count as an attempt.
    fn hold_back(
        &self,
        batch: Vec<(ReadEntry, u64)>,
        own_pending: &mut Vec<(Source, String)>,
        unanswered: &mut Vec<(Source, Vec<String>)>,
        counts: &mut HashMap<(Source, String), u64>,
    ) {
        if batch.is_empty() {
            return;
        }
        let newest = self.last_read.lock().map(|n| n.clone()).unwrap_or_default();
        let held = batch.len();
        // Bounded: ids never read again (another host took them over) are forgotten at worst
        // with an attempt counted too many.
        if counts.len() + held > MAX_HELD_COUNTS {
            counts.clear();
        }
        let mut older: Vec<(Source, Vec<String>)> = Vec::new();
        for (read, count) in batch {
            counts.insert((read.source, read.id.clone()), count);
            let at_or_below = newest
                .get(&read.source)
                .is_some_and(|last| crate::entry::delivery::cmp_ids(&read.id, last).is_le());
            if !at_or_below {
                continue;
            }
            match older.iter_mut().find(|(s, _)| *s == read.source) {
                Some((_, ids)) => ids.push(read.id),
                None => older.push((read.source, vec![read.id])),
            }
        }
        tracing::info!(
            stream = %self.plan.stream,
            group = %self.plan.group,
            held,
            "paused while a read waited: its entries stay pending until the resume"
        );
        unanswered.extend(older);
        *own_pending = self.after_last_read();
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

    async fn create_group(&self) -> bool {
        let mut backoff = ReconnectBackoff::default();
        loop {
            let mut conn = self.conn.clone();
            let mut created = Ok(());
            for source in self.plan.sources() {
                created =
                    commands::create_group(&mut conn, self.plan.key(source), &self.plan.group)
                        .await;
                if created.is_err() {
                    break;
                }
            }
            match created {
                Ok(()) => return true,
                Err(err) => {
                    let message = format!(
                        "cannot create consumer group: {}: {err}",
                        ErrorClass::of(&err).describe()
                    );
                    self.health.failed(&message);
                    if !self.pause_after_error(&message, &mut backoff).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Create the group again after it vanished (on the stream, the lane, or both), after the
    /// last entry this host read from each (or from the start), and say so.
    async fn recreate_group(&self) {
        for source in self.plan.sources() {
            let key = self.plan.key(source);
            let from = self
                .last_read
                .lock()
                .ok()
                .and_then(|last| last.get(&source).cloned())
                .unwrap_or_else(|| "0".to_owned());
            let mut conn = self.conn.clone();
            // An existing group is left as it is: only a vanished one is made again.
            let exists = crate::store::inspect::group(&mut conn, key, &self.plan.group).await;
            if matches!(exists, Ok(Some(_))) {
                continue;
            }
            match commands::create_group_at(&mut conn, key, &self.plan.group, &from).await {
                Ok(()) => tracing::warn!(
                    stream = %key,
                    group = %self.plan.group,
                    from = %from,
                    "consumer group was gone (the stream or the group was deleted); created it again, reading entries after id {from}"
                ),
                Err(err) => tracing::warn!(
                    stream = %key,
                    group = %self.plan.group,
                    %err,
                    "consumer group is gone and could not be created again: {}",
                    ErrorClass::of(&err).describe()
                ),
            }
        }
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

    /// The next entries to handle, with Redis's delivery counter for each.
    async fn next_batch(
        &self,
        conn: &mut Reader,
        taken: &Taken,
        own_pending: &mut Vec<(Source, String)>,
        claim_cursors: &mut [(Source, String)],
        unanswered: &mut Vec<(Source, Vec<String>)>,
        rung: bool,
    ) -> RedisResult<Vec<(ReadEntry, u64)>> {
        let plan = &self.plan;
        let room = taken.all();
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
            return self.with_counts(conn, source, entries).await;
        }
        if let Some((source, ids)) = unanswered.last() {
            let source = *source;
            let entries = commands::own_pending_among(conn, plan, source, ids).await?;
            unanswered.pop();
            if !entries.is_empty() {
                tracing::warn!(
                    stream = %plan.key(source),
                    count = entries.len(),
                    "a take-over's reply was lost; handling the entries it made this consumer's"
                );
                return Ok(entries);
            }
        }
        if let Some(gone_after) = plan.gone_after
            && self.rescue_due(gone_after)
        {
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
                let entries = match commands::take_over_gone(
                    conn, plan, source, gone_after, room, &mut asked, &mut clear,
                )
                .await
                {
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
                    return self.with_counts(conn, source, entries).await;
                }
            }
            if clear && self.bell.is_some() {
                self.set_rescue_quiet(mark.map_or(Quiet::Wanted, Quiet::Since));
            }
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
        if let Some(min_idle) = plan.claim_min_idle {
            for (source, cursor) in claim_cursors.iter_mut() {
                let room = taken.room_for(*source);
                if room == 0 {
                    continue;
                }
                let (next, entries) =
                    commands::autoclaim(conn, plan, *source, min_idle, cursor, room).await?;
                *cursor = next;
                if !entries.is_empty() {
                    tracing::info!(stream = %plan.key(*source), count = entries.len(), "claimed idle entries");
                    return self.with_counts(conn, *source, entries).await;
                }
            }
        }
        let mut entries = Vec::new();
        if plan.lane.is_some() {
            // The lane first, on its own, so that stream entries never take the room of due
            // retries; the stream then gets what room is left.
            entries = commands::read_group(conn, plan, room, None, &[(Source::Lane, ">")]).await?;
        }
        // New stream entries never take the slots reserved for the lane.
        let left = taken.stream().min(room - entries.len());
        if left > 0 {
            let more = if entries.is_empty() {
                match &self.shared {
                    // The bell waits instead, before the next read.
                    None if self.bell.is_some() => {
                        commands::read_group(conn, plan, left, None, &[(Source::Stream, ">")])
                            .await?
                    }
                    // Nothing to do yet: wait on the stream and the lane both (a blocked read
                    // is answered with the entries of whichever gets some first).
                    None => {
                        let newest: Vec<(Source, &str)> =
                            plan.sources().map(|s| (s, ">")).collect();
                        commands::read_group(conn, plan, left, Some(plan.block), &newest).await?
                    }
                    // With the other partitions, once the stream too is found empty.
                    Some(shared) => {
                        let found =
                            commands::read_group(conn, plan, left, None, &[(Source::Stream, ">")])
                                .await?;
                        if found.is_empty() {
                            shared.wait(plan, left).await?
                        } else {
                            found
                        }
                    }
                }
            } else {
                commands::read_group(conn, plan, left, None, &[(Source::Stream, ">")]).await?
            };
            entries.extend(more);
        }
        if let Some(bell) = &self.bell
            && !taken.for_lane
        {
            self.idle
                .store(entries.is_empty(), std::sync::atomic::Ordering::Release);
            bell.set_idle(entries.is_empty());
            // Woken and nothing read: what rang went to another consumer. A polling bell does
            // not ring for the consumer that read made, and a look in this same wake may have
            // come before it: look again at the usual pace, not after the bell's 5 minutes
            // (found by an attack: a host that died holding such an entry was taken over
            // after 5 minutes in one race of three).
            if rung && entries.is_empty() && bell.polls() {
                self.set_rescue_quiet(Quiet::No);
            }
        }
        Ok(entries.into_iter().map(|e| (e, 1)).collect())
    }

    /// Of the ids a take-over whose reply was lost asked for, those to look for after the next
    /// connect: at or below the newest id read from `source`, since the re-read after the
    /// failure (see [`Self::after_last_read`]) brings back everything newer, and must not be
    /// doubled.
    fn at_or_below_last_read(&self, source: Source, mut asked: Vec<String>) -> Vec<String> {
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

    /// Whether it is time to look for gone consumers: every half `gone_after`, unless the last
    /// look found no other consumer and nothing was written to the partition's keys since.
    fn rescue_due(&self, gone_after: Duration) -> bool {
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

    fn rescue_quiet(&self) -> std::sync::MutexGuard<'_, Quiet> {
        self.rescue_quiet
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the last look for gone consumers still holds (see [`Quiet::Since`]).
    fn rescue_is_quiet(&self) -> bool {
        match (&self.bell, &*self.rescue_quiet()) {
            (Some(bell), Quiet::Since(mark)) => bell.unrung_since(mark),
            _ => false,
        }
    }

    /// Whether a look that found the group clear is to be made again now that the bell can
    /// vouch for its rings (see [`Quiet::Wanted`]).
    fn rescue_wanted(&self) -> bool {
        match (&self.bell, &*self.rescue_quiet()) {
            (Some(bell), Quiet::Wanted) => bell.mark().is_some(),
            _ => false,
        }
    }

    fn set_rescue_quiet(&self, quiet: Quiet) {
        *self.rescue_quiet() = quiet;
    }

    /// When an idle reader must wake for its next look for gone consumers, if it must.
    fn next_rescue_at(&self) -> Option<tokio::time::Instant> {
        if self.plan.gone_after.is_none() || self.rescue_is_quiet() {
            return None;
        }
        self.next_rescue.lock().ok().map(|next| *next)
    }

    /// `entries`, all read from `source`, each with Redis's delivery counter.
    async fn with_counts(
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

    /// Start a delivery for each entry read, each with one of the slots the read was
    /// sized by; slots left over (deleted entries, a short read) are released.
    async fn start_deliveries(self: &Arc<Self>, batch: Vec<(ReadEntry, u64)>, mut slots: Taken) {
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
        // A read's deliveries run together on as few tasks as their handler's time allows
        // (`spawn_group`): a task per delivery would hand most of them to another worker
        // thread (and their acks back), wake-ups that cost more than a light handler.
        let mut group = Vec::with_capacity(batch.len());
        for (read, delivery_count) in batch {
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
                continue;
            }
            let Some(entry) = read.into_entry() else {
                self.drop_deleted(source, &id).await;
                continue;
            };
            let permit = match slots.one_for(source) {
                Some(permit) => permit,
                None => {
                    // Start what has its slots before waiting for more.
                    self.spawn_group(std::mem::take(&mut group));
                    match self.slots.one().await {
                        Some(permit) => permit,
                        None => return,
                    }
                }
            };
            if let Some(delivery) = self.delivery((entry, cut), source, delivery_count, permit) {
                group.push(delivery);
            }
        }
        self.spawn_group(group);
    }

    /// Run `deliveries` in tasks of about [`GROUP_WORK`] of handler time each, which the
    /// runtime spreads over its workers: one task for a light handler's whole read, one per
    /// delivery for a heavy handler, and for one not yet timed (its first read) too.
    fn spawn_group(self: &Arc<Self>, mut deliveries: Vec<DeliveryTask>) {
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
    fn spawn_together(self: &Arc<Self>, mut deliveries: Vec<DeliveryTask>) {
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
    fn spawn_alone(self: &Arc<Self>, delivery: DeliveryTask) {
        let this = self.clone();
        tokio::spawn(async move {
            if let Some(ack) = delivery.await {
                this.dispatcher.ack_all(vec![ack]);
            }
        });
    }

    /// An entry that was deleted from the stream while pending has nothing left to handle:
    /// acknowledge it so it leaves the pending list.
    async fn drop_deleted(&self, source: Source, id: &str) {
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
        }
    }

    fn spawn_delivery(
        self: &Arc<Self>,
        entry: Entry,
        source: Source,
        delivery_count: u64,
        permit: OwnedSemaphorePermit,
    ) {
        if let Some(delivery) =
            self.delivery((entry, Default::default()), source, delivery_count, permit)
        {
            self.spawn_alone(delivery);
        }
    }

    /// One delivery from start to settle, holding its handler slot; `None` when it is being
    /// handled already.
    fn delivery(
        self: &Arc<Self>,
        (entry, cut): (Entry, crate::store::redis_conn::lean::Cut),
        source: Source,
        delivery_count: u64,
        permit: OwnedSemaphorePermit,
    ) -> Option<DeliveryTask> {
        if let Some(Ok(mut in_flight)) = self.in_flight.as_ref().map(Mutex::lock)
            && !in_flight.insert((source, entry.id.clone()))
        {
            // XAUTOCLAIM handed back an entry this host is still handling.
            return None;
        }
        let mut delivery = Delivery::new(
            self.plan.stream.clone(),
            self.plan.group.clone(),
            (source, self.plan.key(source)),
            entry,
            delivery_count,
            self.secret.as_deref(),
        );
        delivery.cut = cut;
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
