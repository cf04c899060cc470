//! What a service starts, and starting each subscription: its flow controls (pause, rate
//! limit, breaker), its handler slot with its swap control and rollout, the shared reads of
//! its partitions, then each partition (see `partition.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connections::Connections;
use super::partition::{Common, StartedPartition};
use super::{RunError, Service};
use crate::control::rollout::Rollout;
use crate::control::rollout::key::RolloutKey;
use crate::control::swap::SwapControl;
use crate::handler::{Handler, HandlerSlot};
use crate::observe::metrics::Metrics;
use crate::pipeline::admit::breaker::Breaker;
use crate::pipeline::admit::rate::RateLimiter;
use crate::pipeline::admit::stats::Counted;
use crate::pipeline::admit::{FlowWatch, FlowWatcher};
use crate::pipeline::read::SharedRead;
use crate::service::plan::SubscriptionPlan;
use crate::store::doorbell::Doorbell;
use crate::store::redis_conn::RedisHandle;
use sluice_descriptor::ResolvedStream;

/// The most partitions one shared blocking read serves: each time who waits changes, the read
/// is made again over the keys of all its partitions, so its cost grows with them (1,024
/// partitions on one read: Redis spent 47 % of a core on a trickle of 90 entries a second).
const PARTITIONS_PER_READ: u32 = 64;

/// What `run` starts and later stops: the tasks, and what the admin server is handed.
pub(super) struct Wiring {
    /// Counts the deliveries in flight: the drain waits for them.
    pub(super) deliveries: TaskTracker,
    /// Cancelled when the drain gives up: settlers stop retrying.
    pub(super) abandon: CancellationToken,
    /// Read loops, sweeps, watchers: stopped first.
    pub(super) readers: JoinSet<()>,
    /// Each partition's acker; each ends with how many acks it could not send.
    pub(super) ackers: JoinSet<usize>,
    pub(super) admin_subscriptions: Vec<crate::serve::AdminSubscription>,
    pub(super) swap_controls: Vec<Arc<SwapControl>>,
    pub(super) rollouts: Vec<Arc<Rollout>>,
    pub(super) connections: Connections,
    /// The groups' delivery counts, kept in Redis for the page.
    counted: Vec<Counted>,
    rollout_key: Option<Arc<RolloutKey>>,
    /// One watch per component file, for every subscription that runs it.
    watched_files: Vec<(PathBuf, Vec<Arc<SwapControl>>)>,
    /// One flow watcher per Redis, whatever the number of its subscriptions.
    flow_watchers: Vec<(String, FlowWatcher)>,
}

impl Service {
    /// Nothing started yet: how many single-partition subscriptions each Redis serves
    /// (whether its doorbell polls), and the key that seals canaries.
    pub(super) fn wiring(
        &self,
        dev_redis: Option<&str>,
        rollout_key: Option<Arc<RolloutKey>>,
    ) -> Wiring {
        let mut connections = Connections::new(self.plan.doorbell);
        for sub in &self.plan.subscriptions {
            if let Some(url) = sub.redis.as_deref().or(dev_redis) {
                *connections.partitions.entry(url.to_owned()).or_default() +=
                    usize::from(sub.stream.partitions <= 1);
            }
        }
        Wiring {
            deliveries: TaskTracker::new(),
            abandon: CancellationToken::new(),
            readers: JoinSet::new(),
            ackers: JoinSet::new(),
            admin_subscriptions: Vec::new(),
            swap_controls: Vec::new(),
            rollouts: Vec::new(),
            connections,
            counted: Vec::new(),
            rollout_key,
            watched_files: Vec::new(),
            flow_watchers: Vec::new(),
        }
    }

    /// Start one subscription on `redis` (its URL, a connection and that Redis's doorbell):
    /// what its partitions share, then each partition.
    pub(super) async fn start_subscription(
        &self,
        w: &mut Wiring,
        sub: &SubscriptionPlan,
        handler: Arc<dyn Handler>,
        (url, (conn, doorbell)): (&str, (RedisHandle, Option<Arc<Doorbell>>)),
        stop: &CancellationToken,
    ) -> Result<(), RunError> {
        let flow = w.flow_watch(url, (&conn, doorbell.as_ref()), sub, &self.metrics);
        let (rate, breaker) = self.admission_controls(w, sub, &conn, stop);
        for warning in &sub.warnings {
            tracing::warn!(stream = %sub.stream.stream, "{warning}");
        }
        let slot = self.handler_slot(w, sub, handler, &conn, &flow, stop);
        let shared_reads = shared_reads(w, sub, &conn, stop);
        w.counted.push(Counted::new(
            &sub.stream.stream,
            &sub.stream.group,
            sub.stream
                .partitioned()
                .iter()
                .map(|p| Metrics::labels(&p.stream, &p.group))
                .collect(),
            conn.clone(),
        ));
        let common = Common {
            sub,
            conn: &conn,
            slot,
            flow,
            rate,
            breaker,
            doorbell,
        };
        for (index, part) in sub.stream.partitioned().into_iter().enumerate() {
            let shared = shared_reads
                .get(index / PARTITIONS_PER_READ as usize)
                .cloned();
            let tasks = (&w.deliveries, &w.abandon);
            let started = self
                .start_partition(tasks, &common, &part, shared, stop)
                .await?;
            self.run_partition(w, started, &part, stop);
        }
        Ok(())
    }

    /// The subscription's rate limit and circuit breaker, when configured: one for every
    /// partition (the breaker's watcher runs with the readers).
    fn admission_controls(
        &self,
        w: &mut Wiring,
        sub: &SubscriptionPlan,
        conn: &RedisHandle,
        stop: &CancellationToken,
    ) -> (Option<Arc<RateLimiter>>, Option<Arc<Breaker>>) {
        let (stream, group) = (&sub.stream.stream, &sub.stream.group);
        let rate = sub.rate_limit.map(|limit| {
            Arc::new(RateLimiter::new(
                stream,
                group,
                limit,
                conn.clone(),
                &self.metrics,
            ))
        });
        let breaker = sub.circuit_breaker.map(|config| {
            Arc::new(Breaker::new(
                stream,
                group,
                &sub.consumer,
                config,
                conn.clone(),
                self.metrics.clone(),
            ))
        });
        if let Some(breaker) = &breaker {
            w.readers.spawn(breaker.clone().run(stop.clone()));
        }
        (rate, breaker)
    }

    /// The subscription's handler slot, one for every partition, with what changes it: its
    /// swap control (and the component file's watch) and its rollout, which every read waits
    /// for until the host knows whether a canary runs.
    fn handler_slot(
        &self,
        w: &mut Wiring,
        sub: &SubscriptionPlan,
        handler: Arc<dyn Handler>,
        conn: &RedisHandle,
        flow: &FlowWatch,
        stop: &CancellationToken,
    ) -> Arc<HandlerSlot> {
        let labels = Metrics::labels(&sub.stream.stream, &sub.stream.group);
        let slot = Arc::new(HandlerSlot::new(handler, self.metrics.clone(), labels));
        let control = Arc::new(
            SwapControl::new(
                slot.clone(),
                sub.component.runtime().clone(),
                sub.overrides.clone(),
                sub.limits.clone(),
                sub.values.clone(),
            )
            .with_partitions(sub.stream.partitions)
            .with_ordered_by(sub.stream.ordered_by.clone())
            .with_effects(sub.stream.effects),
        );
        if self.plan.watch_interval.is_some() {
            let path = sub.component.path().to_owned();
            match w.watched_files.iter_mut().find(|(p, _)| *p == path) {
                Some((_, controls)) => controls.push(control.clone()),
                None => w.watched_files.push((path, vec![control.clone()])),
            }
        }
        let rollout = Arc::new(Rollout::new(
            control.clone(),
            conn.clone(),
            sub.canary,
            (sub.consumer.clone(), self.plan.admin_max_upload),
            self.metrics.clone(),
            w.rollout_key.clone(),
        ));
        // Nothing runs before the host knows whether a canary runs (and has joined it).
        slot.joining(crate::handler::Joining::new("", 10_000, 0));
        w.readers
            .spawn(rollout.clone().follow(flow.state.clone(), stop.clone()));
        w.rollouts.push(rollout);
        w.swap_controls.push(control);
        slot
    }

    /// Start what a set-up partition runs: its acker, its delayed set's waker, its retention,
    /// its dead-letter migration and its read loop (supervised).
    fn run_partition(
        &self,
        w: &mut Wiring,
        started: StartedPartition,
        part: &ResolvedStream,
        stop: &CancellationToken,
    ) {
        w.admin_subscriptions.push(started.admin);
        w.ackers.spawn(started.acker);
        for ticker in started.tickers {
            w.readers.spawn(ticker.run(stop.clone()));
        }
        if let Some(set) = started.delayed {
            w.readers.spawn(set.run_waker(stop.clone()));
        }
        if let Some(trimmer) = started.trimmer {
            w.readers.spawn(trimmer.run(stop.clone()));
        }
        if let Some(migration) = started.migration {
            let stop = stop.clone();
            w.readers.spawn(async move {
                tokio::select! {
                    () = migration => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        let labels = Metrics::labels(&part.stream, &part.group);
        let restarts = self
            .metrics
            .read_loop_restarts
            .get_or_create(&self.metrics.series(&labels))
            .clone();
        w.readers.spawn(started.subscription.supervise(restarts));
    }

    /// Once every subscription is set up: the flow watchers (one per Redis), the component
    /// files' watches, and the groups' delivery counts.
    pub(super) fn start_watchers(&self, w: &mut Wiring, stop: &CancellationToken) {
        for (_, watcher) in std::mem::take(&mut w.flow_watchers) {
            w.readers.spawn(Arc::new(watcher).run(stop.clone()));
        }
        if let Some(interval) = self.plan.watch_interval {
            for (path, controls) in std::mem::take(&mut w.watched_files) {
                w.readers.spawn(crate::control::swap::watch(
                    controls,
                    path,
                    interval,
                    stop.clone(),
                ));
            }
        }
        w.readers.spawn(crate::pipeline::admit::stats::run(
            std::mem::take(&mut w.counted),
            self.metrics.clone(),
            stop.clone(),
        ));
    }
}

impl Wiring {
    /// The subscription's flow state, from the one flow watcher of its Redis.
    fn flow_watch(
        &mut self,
        url: &str,
        (conn, doorbell): (&RedisHandle, Option<&Arc<Doorbell>>),
        sub: &SubscriptionPlan,
        metrics: &Metrics,
    ) -> FlowWatch {
        let index = match self.flow_watchers.iter().position(|(u, _)| u == url) {
            Some(index) => index,
            None => {
                self.flow_watchers.push((
                    url.to_owned(),
                    FlowWatcher::new(conn.clone(), doorbell.cloned()),
                ));
                self.flow_watchers.len() - 1
            }
        };
        self.flow_watchers[index]
            .1
            .watch(&sub.stream.stream, &sub.stream.group, metrics)
    }
}

/// Partitions on one node wait for new entries in one blocking read per
/// [`PARTITIONS_PER_READ`], so that connections do not grow with them; on a cluster each has
/// a slot of its own (and no shared read).
fn shared_reads(
    w: &mut Wiring,
    sub: &SubscriptionPlan,
    conn: &RedisHandle,
    stop: &CancellationToken,
) -> Vec<Arc<SharedRead>> {
    // An ordered subscription reads new entries through its own script (`pipeline::order`).
    if sub.stream.partitions <= 1 || conn.is_cluster() || sub.stream.ordered_by.is_some() {
        return Vec::new();
    }
    (0..sub.stream.partitions.div_ceil(PARTITIONS_PER_READ))
        .map(|_| {
            let shared = Arc::new(SharedRead::new(
                conn.clone(),
                (
                    sub.stream.group.as_str().into(),
                    sub.consumer.as_str().into(),
                ),
                sub.stream.block,
                usize::try_from(sub.limits.max_entry_bytes).unwrap_or(usize::MAX),
            ));
            w.readers.spawn(shared.clone().run(stop.clone()));
            shared
        })
        .collect()
}
