//! The service: from a checked plan to running subscriptions, and down again in order.
//!
//! - [`plan`] loads each component, lays the configuration over its descriptor and checks the
//!   result, before any task starts.
//! - This module wires a [`Plan`] into running subscriptions and, when told to stop, drains
//!   in-flight deliveries and flushes their acks; [`shutdown`] only turns SIGINT/SIGTERM into
//!   that stop.
//!
//! Shutdown, when `stop` is cancelled: every subscription stops reading; in-flight deliveries
//! get `shutdown_timeout` to finish; then the ackers flush what they hold. If the deadline
//! passes first, what is unfinished is abandoned: those entries stay pending in Redis and this
//! consumer re-reads them when it starts again.

pub(crate) mod plan;
pub(crate) mod shutdown;

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::entry::outcome::Policy;
use crate::handler::Handler;
use crate::observe::events::Events;
use crate::pipeline::delayed::DelayedSet;
use crate::pipeline::dispatch::Dispatcher;
use crate::pipeline::read::{ReadPlan, Subscription, SubscriptionParts};
use crate::pipeline::settle::Settler;
use crate::runtime::WasmHandler;
use crate::service::plan::Plan;
use crate::store::keys::SubscriptionKeys;
use crate::store::redis_conn::{self, ConnError};
use sluice_descriptor::{DelayedRetry, ResolvedStream};

/// How long a stop waits for readers, watchers and sweeps to end by themselves before it
/// stops them: the rest of `shutdown_timeout` is for the deliveries in flight and their acks.
const READERS_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Redis could not be reached at start-up.
    #[error(transparent)]
    Redis(#[from] ConnError),
    /// A subscription has no Redis URL and no dev server was given.
    #[error("subscription to `{0}` has no Redis URL")]
    NoRedis(String),
    /// The subscription's keys cannot be used together on this Redis Cluster.
    #[error(transparent)]
    Slots(#[from] crate::store::keys::SlotError),
    /// Another subscription owns one of the subscription's keys.
    #[error(transparent)]
    Claim(#[from] crate::store::keys::ClaimError),
    /// Retries would go back to the tail of a stream other groups read.
    #[error(
        "stream `{stream}` is read by other consumer groups ({}) besides `{group}`, and retry_lane = false sends this subscription's due retries back to the stream's tail, where each of them would read every retry as a new entry. Remove retry_lane = false (retries then wait in the group's own lane), or set other_groups_see_retries = true to accept it",
        others.join(", ")
    )]
    TailWithOtherGroups {
        /// The stream.
        stream: String,
        /// This subscription's group.
        group: String,
        /// The others.
        others: Vec<String>,
    },
    /// The stream's secret could not be read or created.
    #[error(transparent)]
    Secret(#[from] crate::store::keys::SecretError),
    /// Redis could not say which groups read the stream.
    #[error("cannot list the consumer groups of stream `{stream}`")]
    Groups {
        /// The stream.
        stream: String,
        /// What Redis said.
        #[source]
        error: redis::RedisError,
    },
    /// The admin token could not be read.
    #[error("cannot use the admin token")]
    Token(#[from] crate::config::TokenError),
    /// The rollout key could not be read.
    #[error(transparent)]
    RolloutKey(Box<crate::control::rollout::key::KeyError>),
    /// The admin server could not start.
    #[error(transparent)]
    Admin(#[from] crate::serve::AdminError),
    /// The shutdown deadline passed with deliveries still in flight.
    #[error(
        "shutdown timed out with {0} deliveries still in flight; they stay pending in Redis and are re-read on restart"
    )]
    Abandoned(usize),
    /// Every delivery finished, but the shutdown deadline passed before all their acks
    /// reached Redis (Redis was away or slow).
    #[error(
        "shutdown timed out with {0} acks not yet in Redis; those entries stay pending and are handled again on restart"
    )]
    Unflushed(usize),
}

/// The most partitions one shared blocking read serves: each time who waits changes, the read
/// is made again over the keys of all its partitions, so its cost grows with them (1,024
/// partitions on one read: Redis spent 47 % of a core on a trickle of 90 entries a second).
const PARTITIONS_PER_READ: u32 = 64;

/// The most command connections a host opens to one Redis (for one set of credentials): the
/// subscriptions take turns on them, so connections do not grow with subscriptions (each
/// subscription's connection of its own once held two per subscription: 250 subscriptions,
/// 500 connections). Each is multiplexed; several keep one slow reply from holding up every
/// subscription's commands.
const CONNECTIONS_PER_REDIS: usize = 4;

/// The command connections and the doorbell of one Redis (and set of credentials).
struct OneRedis {
    url: String,
    access: crate::config::RedisAccess,
    handles: Vec<redis_conn::RedisHandle>,
    /// The handle the last subscription was given.
    turn: usize,
    /// `None` when the server does not publish keyspace events.
    doorbell: Option<Arc<crate::store::doorbell::Doorbell>>,
}

/// Every Redis the host talks to.
#[derive(Default)]
struct Connections {
    open: Vec<OneRedis>,
    /// What `doorbell` says.
    mode: crate::config::DoorbellMode,
    /// How many subscriptions of one partition each Redis URL serves in this host (whether
    /// its doorbell polls): a partitioned one waits in shared reads, not on the doorbell.
    partitions: std::collections::HashMap<String, usize>,
}

impl Connections {
    /// A connection to `url` as `access` says (a new one while there are fewer than
    /// [`CONNECTIONS_PER_REDIS`], else the next in turn) and that Redis's doorbell, opened
    /// with its first connection (and started in `tasks`).
    async fn get(
        &mut self,
        url: &str,
        access: &crate::config::RedisAccess,
        tasks: &mut JoinSet<()>,
        stop: &CancellationToken,
    ) -> Result<
        (
            redis_conn::RedisHandle,
            Option<Arc<crate::store::doorbell::Doorbell>>,
        ),
        RunError,
    > {
        let index = match self
            .open
            .iter()
            .position(|r| r.url == url && r.access == *access)
        {
            Some(index) => index,
            None => {
                tracing::info!(redis = %redis_conn::redact(url), "connecting to Redis");
                let first = redis_conn::RedisHandle::connect(url, access).await?;
                let on_it = self.partitions.get(url).copied().unwrap_or(0);
                let doorbell =
                    crate::store::doorbell::Doorbell::open(first.clone(), self.mode, on_it).await;
                if let Some(doorbell) = &doorbell {
                    tasks.spawn(doorbell.clone().run(stop.clone()));
                }
                self.open.push(OneRedis {
                    url: url.to_owned(),
                    access: access.clone(),
                    handles: vec![first.clone()],
                    turn: 0,
                    doorbell: doorbell.clone(),
                });
                return Ok((first, doorbell));
            }
        };
        let redis = &mut self.open[index];
        if redis.handles.len() < CONNECTIONS_PER_REDIS {
            let handle = redis_conn::RedisHandle::connect(url, access).await?;
            // One pool of lean read connections per Redis, not per handle (found by an
            // attack: four handles made the bound of 8 one of 32).
            if let Some(first) = redis.handles.first() {
                handle.share_read_pool(first);
            }
            redis.handles.push(handle.clone());
            return Ok((handle, redis.doorbell.clone()));
        }
        redis.turn = (redis.turn + 1) % redis.handles.len();
        Ok((redis.handles[redis.turn].clone(), redis.doorbell.clone()))
    }
}

/// One partition, set up and ready to run.
struct StartedPartition {
    subscription: Arc<Subscription>,
    /// Its retention, when configured.
    trimmer: Option<crate::control::retention::Trimmer>,
    /// Moves its dead letters out of an earlier release's shared default stream, when its
    /// dead-letter stream is the default one.
    migration: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    /// Sends the partition's acks; ends with how many it could not send.
    acker: std::pin::Pin<Box<dyn std::future::Future<Output = usize> + Send>>,
    delayed: Option<Arc<DelayedSet>>,
    admin: crate::serve::AdminSubscription,
}

/// The lane of `keys` and how many entries of its group it holds (pending or unread), when it
/// holds any.
async fn lane_work(
    conn: &redis_conn::RedisHandle,
    keys: &SubscriptionKeys,
) -> Option<(String, u64)> {
    let lane = keys.lane.as_deref()?;
    let group = crate::store::inspect::group(&mut conn.clone(), lane, &keys.group)
        .await
        .ok()
        .flatten()?;
    // An unknown lag (Redis cannot tell after deletions) may hide unread entries: read it.
    let unread = group.lag.unwrap_or(1);
    let work = group.pending as u64 + unread as u64;
    (work > 0).then(|| (lane.to_owned(), work))
}

/// How often a subscription looks for dead letters an earlier release's host put in the
/// stream's shared default dead-letter stream (only hosts of that release still write there,
/// during a rolling upgrade).
const MIGRATE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Move this subscription's dead letters out of the earlier release's default dead-letter
/// stream, at start and then every [`MIGRATE_EVERY`], each pass from where the last ended;
/// with a `bell` on that stream, a pass runs only when it was written (or the bell cannot
/// vouch that it was not), so thousands of idle subscriptions send nothing for it.
async fn migrate_dead_letters(
    keys: SubscriptionKeys,
    mut conn: redis_conn::RedisHandle,
    bell: Option<crate::store::doorbell::Bell>,
) {
    let mut cursor: Option<String> = None;
    let mut warned = false;
    loop {
        if let Some(bell) = &bell {
            // Before the pass: a write during it rings again.
            bell.seen();
        }
        match crate::control::operate::dead_letters::migrate_legacy(
            &mut conn,
            &keys,
            cursor.as_deref(),
        )
        .await
        {
            Ok(done) if !done.readers.is_empty() => {
                if !warned {
                    tracing::warn!(
                        from = keys.legacy_dead_letter.as_deref().unwrap_or_default(),
                        to = %keys.dead_letter,
                        readers = %done.readers.join(", "),
                        "an earlier release dead-lettered this group's entries to the stream's shared dead-letter stream, which consumer groups read: they stay there; this group dead-letters to its own stream now (point those readers at it, or set dead_letter to the old name)"
                    );
                    warned = true;
                }
            }
            Ok(done) => {
                if done.moved > 0 {
                    tracing::info!(
                        from = keys.legacy_dead_letter.as_deref().unwrap_or_default(),
                        to = %keys.dead_letter,
                        moved = done.moved,
                        "moved this group's dead letters from the earlier release's shared dead-letter stream to its own"
                    );
                }
                cursor = done.cursor;
            }
            Err(err) => tracing::warn!(
                from = keys.legacy_dead_letter.as_deref().unwrap_or_default(),
                %err,
                "cannot move dead letters of an earlier release yet; trying again later"
            ),
        }
        match &bell {
            Some(bell) => while !bell.wait(MIGRATE_EVERY, None).await {},
            None => tokio::time::sleep(MIGRATE_EVERY).await,
        }
    }
}

/// The running host: every subscription of a plan.
pub struct Service {
    plan: Plan,
    events: Events,
    metrics: Arc<crate::observe::metrics::Metrics>,
    admin_addr: tokio::sync::watch::Sender<Option<std::net::SocketAddr>>,
    handlers: Vec<Arc<dyn Handler>>,
}

impl Service {
    /// A service for `plan`, with each subscription's component as its handler.
    pub fn new(plan: Plan) -> Self {
        let metrics = Arc::new(crate::observe::metrics::Metrics::new(
            plan.metrics_per_subscription,
        ));
        let handlers = plan
            .subscriptions
            .iter()
            .map(|s| {
                let labels =
                    crate::observe::metrics::Metrics::labels(&s.stream.stream, &s.stream.group);
                Arc::new(WasmHandler::new(
                    s.component.clone(),
                    s.limits.clone(),
                    s.values.clone(),
                    crate::handler::HandlerCounters {
                        http_denied: metrics
                            .http_denied
                            .get_or_create(&metrics.series(&labels))
                            .clone(),
                        log_dropped: metrics
                            .guest_log_dropped
                            .get_or_create(&metrics.series(&labels))
                            .clone(),
                    },
                )) as Arc<dyn Handler>
            })
            .collect();
        Self {
            plan,
            events: Events::default(),
            metrics,
            admin_addr: tokio::sync::watch::Sender::new(None),
            handlers,
        }
    }

    /// Replace subscription `index`'s handler (a native handler in tests and benchmarks).
    pub fn with_handler(mut self, index: usize, handler: Arc<dyn Handler>) -> Self {
        if let Some(slot) = self.handlers.get_mut(index) {
            *slot = handler;
        }
        self
    }

    /// The host's metrics.
    pub fn metrics(&self) -> Arc<crate::observe::metrics::Metrics> {
        self.metrics.clone()
    }

    /// The address the admin server bound, once it has (`None` while starting or when off).
    pub fn admin_addr(&self) -> tokio::sync::watch::Receiver<Option<std::net::SocketAddr>> {
        self.admin_addr.subscribe()
    }

    /// The events of every settled delivery.
    pub fn events(&self) -> Events {
        self.events.clone()
    }

    /// Set up one partition of `sub` (the subscription itself when it has one): its keys,
    /// secret, delayed set, settler and read loop, sharing the subscription's handler `slot`.
    #[allow(clippy::too_many_arguments)]
    async fn start_partition(
        &self,
        sub: &crate::service::plan::SubscriptionPlan,
        s: &ResolvedStream,
        conn: &redis_conn::RedisHandle,
        slot: &Arc<crate::handler::HandlerSlot>,
        deliveries: &TaskTracker,
        stop: &CancellationToken,
        abandon: &CancellationToken,
        shared: Option<Arc<crate::pipeline::read::SharedRead>>,
        flow: &crate::pipeline::admit::FlowWatch,
        rate: Option<&Arc<crate::pipeline::admit::rate::RateLimiter>>,
        breaker: Option<&Arc<crate::pipeline::admit::breaker::Breaker>>,
        doorbell: Option<&Arc<crate::store::doorbell::Doorbell>>,
    ) -> Result<StartedPartition, RunError> {
        let rate = rate.cloned();
        let breaker = breaker.cloned();
        let mut keys = SubscriptionKeys::of(s)
            .with_dead_letter_maxlen(sub.dead_letter_maxlen)
            .with_history_entries(sub.history_entries)
            .with_retry_lane(sub.retry_lane);
        // Retries to the tail, but a lane left with work from when they went there: read it
        // until it is empty, so nothing stays stranded in it.
        if s.delayed_retry.is_some()
            && !sub.retry_lane
            && let Some(work) = lane_work(conn, &keys.with_retry_lane_clone()).await
        {
            tracing::warn!(
                stream = %s.stream,
                group = %s.group,
                lane = %work.0,
                entries = work.1,
                "retry_lane = false, but the retry lane still holds retries of this group (written while it was on): reading them too"
            );
            keys = keys.with_retry_lane(true);
        }
        crate::store::keys::check_same_slot(&mut conn.clone(), &keys).await?;
        crate::store::keys::claim(&mut conn.clone(), &keys).await?;
        tokio::spawn(renew_claims(conn.clone(), keys.clone(), stop.clone()));
        // The secret, made with the subscription's set; and which entries of its streams were
        // there before this release first used them (only those may carry the earlier
        // release's unsealed bookkeeping).
        let own_keys = keys.own_streams();
        let own_keys: Vec<&str> = own_keys.iter().map(String::as_str).collect();
        let secret = crate::store::keys::Secret::load_with(
            &mut conn.clone(),
            &s.stream,
            &own_keys,
            s.delayed_retry.is_some(),
        )
        .await?
        .map(Arc::new);
        if s.delayed_retry.is_some() && !sub.retry_lane {
            self.check_tail_readers(sub, s, conn).await?;
        }
        let mut health =
            crate::observe::health::ReadHealth::new(s.block).with_flow(flow.fresh.clone());
        if let Some(rate) = &rate {
            health = health.with_trouble(rate.trouble());
        }
        let health = Arc::new(health);
        // A set always has a secret: it was created above.
        let delayed = match (&s.delayed_retry, &secret) {
            (Some(DelayedRetry::DurableZset { ttl, .. }), Some(secret)) => {
                DelayedSet::new(&keys, *ttl, secret.clone(), conn.clone(), &self.metrics).map(
                    |set| {
                        Arc::new(
                            match doorbell {
                                Some(doorbell) => {
                                    let bell = doorbell.set_bell(set.key());
                                    set.with_bell(bell, s.block)
                                }
                                None => set,
                            }
                            .with_other_groups_see_retries(sub.other_groups_see_retries)
                            .sweeping_to_tail(!sub.retry_lane)
                            .with_health(health.clone()),
                        )
                    },
                )
            }
            _ => None,
        };
        let (settler, acker) = Settler::new(
            &keys,
            &sub.consumer,
            conn.clone(),
            delayed.clone(),
            secret.clone(),
            self.events.clone(),
            abandon.clone(),
        );
        let policy = Policy {
            max_retries: s.max_retries,
            failure_backoff: s.failure_backoff,
            max_delay: s.max_delay,
            min_delay: sub.min_delay,
            max_entry_bytes: sub.limits.max_entry_bytes,
        };
        let labels = crate::observe::metrics::Metrics::labels(&s.stream, &s.group);
        let admin = crate::serve::AdminSubscription {
            labels: labels.clone(),
            of: slot.labels().clone(),
            dead_letter_maxlen: sub.dead_letter_maxlen,
            conn: conn.clone(),
            delayed_key: s.delayed_retry.as_ref().map(|d| d.key().to_owned()),
            lane: keys.lane.as_deref().map(str::to_owned),
            dead_letter: s.dead_letter.clone(),
            health: health.clone(),
            warnings: sub.warnings.clone(),
            flow: flow.state.clone(),
            rate_limit: sub.rate_limit,
            circuit_breaker: sub.circuit_breaker,
            consumer: sub.consumer.clone(),
        };
        let dispatcher = Arc::new(
            Dispatcher::new(
                slot.clone(),
                policy,
                Arc::new(settler),
                &self.metrics,
                &labels,
            )
            .with_breaker(breaker.clone()),
        );
        let read_plan = ReadPlan {
            stream: s.stream.as_str().into(),
            lane: keys.lane.clone(),
            group: s.group.as_str().into(),
            consumer: sub.consumer.as_str().into(),
            count: s.count,
            block: s.block,
            claim_min_idle: s.claim_min_idle,
            gone_after: sub.consumer_gone_after,
            max_in_flight: sub.limits.max_in_flight,
            lane_slots: sub.retry_lane_slots,
            largest_entry: Arc::default(),
            max_entry_bytes: usize::try_from(sub.limits.max_entry_bytes).unwrap_or(usize::MAX),
        };
        // Idle, it waits on the host's doorbell rather than on a connection of its own; not
        // when it waits with its other partitions, nor when it claims (XAUTOCLAIM must run at
        // every read, idle or not).
        let bell = doorbell
            .filter(|_| shared.is_none() && read_plan.claim_min_idle.is_none())
            .map(|doorbell| {
                let keys: Vec<&str> = read_plan.sources().map(|s| read_plan.key(s)).collect();
                doorbell.bell(&keys)
            });
        let subscription = Subscription::new(
            read_plan,
            conn.clone(),
            dispatcher,
            delayed.clone(),
            SubscriptionParts {
                tracker: deliveries.clone(),
                stop: stop.clone(),
                secret,
                health,
                shared,
                bell,
                flow: flow.state.clone(),
                rate: rate.clone(),
                breaker: breaker.clone(),
            },
            &self.metrics,
        );
        let trimmer = (sub.retention.is_some() || sub.dead_letter_keep.is_some()).then(|| {
            crate::control::retention::Trimmer::new(
                keys.clone(),
                sub.retention,
                sub.dead_letter_keep,
                &sub.consumer,
                conn.clone(),
                &self.metrics,
            )
        });
        let migration = keys.legacy_dead_letter.as_deref().map(|legacy| {
            // With the doorbell, a pass runs only when the earlier stream was written.
            let bell = doorbell.map(|doorbell| {
                let bell = doorbell.bell(&[legacy]);
                bell.set_idle(true);
                bell
            });
            Box::pin(migrate_dead_letters(keys.clone(), conn.clone(), bell)) as _
        });
        Ok(StartedPartition {
            trimmer,
            migration,
            subscription,
            acker: Box::pin(acker),
            delayed,
            admin,
        })
    }

    /// With retries to the stream's tail (`retry_lane = false`): refuse to start while other
    /// groups read the stream, unless the operator accepted it (then warn).
    async fn check_tail_readers(
        &self,
        sub: &crate::service::plan::SubscriptionPlan,
        s: &ResolvedStream,
        conn: &redis_conn::RedisHandle,
    ) -> Result<(), RunError> {
        let groups = crate::store::inspect::groups(&mut conn.clone(), &s.stream)
            .await
            .map_err(|error| RunError::Groups {
                stream: s.stream.clone(),
                error,
            })?;
        let others: Vec<String> = groups.into_iter().filter(|g| *g != s.group).collect();
        if others.is_empty() {
            return Ok(());
        }
        if !sub.other_groups_see_retries {
            return Err(RunError::TailWithOtherGroups {
                stream: s.stream.clone(),
                group: s.group.clone(),
                others,
            });
        }
        tracing::warn!(
            stream = %s.stream,
            group = %s.group,
            others = %others.join(", "),
            "due retries go back to the stream's tail, where the other consumer groups read each as a new entry (other_groups_see_retries = true)"
        );
        Ok(())
    }

    /// This process's admin session key: the one the plan carries (`sluice dev` printed it in
    /// its banner), else a new one, written once to standard error (the terminal of whoever
    /// started the process), never to the log.
    fn session_key(&self) -> String {
        if let Some(key) = &self.plan.admin_session_key {
            return key.clone();
        }
        let key = crate::serve::new_session_key();
        eprintln!(
            "no admin token is configured: the admin API and page take this process's session key instead (set admin_token_file for a lasting one):\n  {key}"
        );
        tracing::warn!(
            "no admin token is configured: the admin API and page take this process's session key, written to standard error at start"
        );
        key
    }

    /// The key that seals canaries: configured, from the admin token, or (`sluice dev` on its
    /// private Redis) made for this process; `None` refuses and ignores canaries.
    fn rollout_key(
        &self,
    ) -> Result<
        Option<Arc<crate::control::rollout::key::RolloutKey>>,
        crate::control::rollout::key::KeyError,
    > {
        use crate::control::rollout::key::RolloutKey;
        let key = match RolloutKey::resolve(
            self.plan.rollout_key.as_ref(),
            self.plan.admin_token.as_ref(),
        )? {
            Some(key) => Some(key),
            None if self.plan.rollout_key_ephemeral => Some(RolloutKey::ephemeral()?),
            None => None,
        };
        if key.is_none() && !self.plan.subscriptions.is_empty() {
            tracing::info!(
                "no rollout key (rollout_key_file, rollout_key_env or an admin token): canaries are refused on this host, and records other hosts write are not joined"
            );
        }
        Ok(key.map(Arc::new))
    }

    /// Run until `stop` is cancelled, then shut down. `dev_redis` is the URL used by
    /// subscriptions that have none of their own.
    pub async fn run(
        self,
        dev_redis: Option<String>,
        stop: CancellationToken,
    ) -> Result<(), RunError> {
        let deliveries = TaskTracker::new();
        let abandon = CancellationToken::new();
        let mut readers = JoinSet::new();
        let mut ackers = JoinSet::new();
        let mut admin_subscriptions = Vec::new();
        let mut swap_controls = Vec::new();
        let mut rollouts = Vec::new();
        let mut counted = Vec::new();
        let rollout_key = self
            .rollout_key()
            .map_err(|err| RunError::RolloutKey(Box::new(err)))?;
        // One watch per component file, for every subscription that runs it.
        let mut watched_files: Vec<(
            std::path::PathBuf,
            Vec<Arc<crate::control::swap::SwapControl>>,
        )> = Vec::new();
        // One flow watcher per Redis, whatever the number of its subscriptions.
        let mut flow_watchers: Vec<(String, crate::pipeline::admit::FlowWatcher)> = Vec::new();
        let mut connections = Connections {
            mode: self.plan.doorbell,
            ..Connections::default()
        };
        for sub in &self.plan.subscriptions {
            if let Some(url) = sub.redis.clone().or_else(|| dev_redis.clone()) {
                *connections.partitions.entry(url).or_default() +=
                    usize::from(sub.stream.partitions <= 1);
            }
        }
        for (sub, handler) in self.plan.subscriptions.iter().zip(self.handlers.clone()) {
            let url = sub
                .redis
                .clone()
                .or_else(|| dev_redis.clone())
                .ok_or_else(|| RunError::NoRedis(sub.stream.stream.clone()))?;
            // A stop asked for while Redis does not answer yet (a SIGTERM during start-up)
            // ends the start: nothing has been read, so nothing is in flight.
            let (conn, doorbell) = tokio::select! {
                got = connections.get(&url, &sub.redis_access, &mut readers, &stop) => got?,
                () = stop.cancelled() => {
                    tracing::info!("stopped before every subscription had started; nothing was read");
                    return Ok(());
                }
            };
            let watcher = match flow_watchers.iter().position(|(u, _)| *u == url) {
                Some(i) => i,
                None => {
                    flow_watchers.push((
                        url.clone(),
                        crate::pipeline::admit::FlowWatcher::new(conn.clone()),
                    ));
                    flow_watchers.len() - 1
                }
            };
            let flow = flow_watchers[watcher].1.watch(
                &sub.stream.stream,
                &sub.stream.group,
                &self.metrics,
            );
            // One budget for every partition of the subscription.
            let rate = sub.rate_limit.map(|limit| {
                Arc::new(crate::pipeline::admit::rate::RateLimiter::new(
                    &sub.stream.stream,
                    &sub.stream.group,
                    limit,
                    conn.clone(),
                    &self.metrics,
                ))
            });
            let breaker = sub.circuit_breaker.map(|config| {
                Arc::new(crate::pipeline::admit::breaker::Breaker::new(
                    &sub.stream.stream,
                    &sub.stream.group,
                    &sub.consumer,
                    config,
                    conn.clone(),
                    self.metrics.clone(),
                ))
            });
            if let Some(breaker) = &breaker {
                readers.spawn(breaker.clone().run(stop.clone()));
            }
            for warning in &sub.warnings {
                tracing::warn!(stream = %sub.stream.stream, "{warning}");
            }
            // One handler (and one swap) for every partition of the subscription.
            let labels =
                crate::observe::metrics::Metrics::labels(&sub.stream.stream, &sub.stream.group);
            let slot = Arc::new(crate::handler::HandlerSlot::new(
                handler,
                self.metrics.clone(),
                labels,
            ));
            let control = Arc::new(
                crate::control::swap::SwapControl::new(
                    slot.clone(),
                    sub.component.runtime().clone(),
                    sub.overrides.clone(),
                    sub.limits.clone(),
                    sub.values.clone(),
                )
                .with_partitions(sub.stream.partitions),
            );
            if self.plan.watch_interval.is_some() {
                let path = sub.component.path().to_owned();
                match watched_files.iter_mut().find(|(p, _)| *p == path) {
                    Some((_, controls)) => controls.push(control.clone()),
                    None => watched_files.push((path, vec![control.clone()])),
                }
            }
            let rollout = Arc::new(crate::control::rollout::Rollout::new(
                control.clone(),
                conn.clone(),
                sub.canary,
                (sub.consumer.clone(), self.plan.admin_max_upload),
                self.metrics.clone(),
                rollout_key.clone(),
            ));
            // Nothing runs before the host knows whether a canary runs (and has joined it).
            slot.joining(crate::handler::Joining::new("", 10_000, 0));
            readers.spawn(rollout.clone().follow(flow.state.clone(), stop.clone()));
            rollouts.push(rollout);
            swap_controls.push(control);
            // Partitions on one node wait for new entries in one blocking read per
            // `PARTITIONS_PER_READ`, so that connections do not grow with them; on a cluster
            // each has a slot of its own.
            let shared_reads: Vec<_> = if sub.stream.partitions > 1 && !conn.is_cluster() {
                (0..sub.stream.partitions.div_ceil(PARTITIONS_PER_READ))
                    .map(|_| {
                        let shared = Arc::new(crate::pipeline::read::SharedRead::new(
                            conn.clone(),
                            (
                                sub.stream.group.as_str().into(),
                                sub.consumer.as_str().into(),
                            ),
                            sub.stream.block,
                            usize::try_from(sub.limits.max_entry_bytes).unwrap_or(usize::MAX),
                        ));
                        readers.spawn(shared.clone().run(stop.clone()));
                        shared
                    })
                    .collect()
            } else {
                Vec::new()
            };
            // The group's delivery counts, kept in Redis for the page.
            counted.push(crate::pipeline::admit::stats::Counted::new(
                &sub.stream.stream,
                &sub.stream.group,
                sub.stream
                    .partitioned()
                    .iter()
                    .map(|p| crate::observe::metrics::Metrics::labels(&p.stream, &p.group))
                    .collect(),
                conn.clone(),
            ));
            for (index, part) in sub.stream.partitioned().into_iter().enumerate() {
                let shared = shared_reads
                    .get(index / PARTITIONS_PER_READ as usize)
                    .cloned();
                let started = self
                    .start_partition(
                        sub,
                        &part,
                        &conn,
                        &slot,
                        &deliveries,
                        &stop,
                        &abandon,
                        shared,
                        &flow,
                        rate.as_ref(),
                        breaker.as_ref(),
                        doorbell.as_ref(),
                    )
                    .await?;
                admin_subscriptions.push(started.admin);
                ackers.spawn(started.acker);
                if let Some(set) = started.delayed {
                    readers.spawn(set.run_waker(stop.clone()));
                }
                if let Some(trimmer) = started.trimmer {
                    readers.spawn(trimmer.run(stop.clone()));
                }
                if let Some(migration) = started.migration {
                    let stop = stop.clone();
                    readers.spawn(async move {
                        tokio::select! {
                            () = migration => {}
                            () = stop.cancelled() => {}
                        }
                    });
                }
                let restarts =
                    self.metrics
                        .read_loop_restarts
                        .get_or_create(&self.metrics.series(
                            &crate::observe::metrics::Metrics::labels(&part.stream, &part.group),
                        ))
                        .clone();
                readers.spawn(started.subscription.supervise(restarts));
            }
        }
        for (_, watcher) in flow_watchers {
            readers.spawn(Arc::new(watcher).run(stop.clone()));
        }
        if let Some(interval) = self.plan.watch_interval {
            for (path, controls) in watched_files {
                readers.spawn(crate::control::swap::watch(
                    controls,
                    path,
                    interval,
                    stop.clone(),
                ));
            }
        }
        readers.spawn(crate::pipeline::admit::stats::run(
            counted,
            self.metrics.clone(),
            stop.clone(),
        ));

        let mut protected = None;
        if let Some(addr) = self.plan.admin {
            let token = match &self.plan.admin_token {
                Some(source) => Some(source.read().map_err(RunError::Token)?),
                None => None,
            };
            // No token: the page and API are bound to whoever started this process, by a key
            // made for it (unless the operator opened them on loopback on purpose).
            let session_key = token.is_none() && !self.plan.admin_open_on_loopback;
            let token = if session_key {
                Some(self.session_key())
            } else {
                token
            };
            let options = crate::serve::AdminOptions {
                token,
                session_key,
                max_upload: usize::try_from(self.plan.admin_max_upload).unwrap_or(usize::MAX),
                open_on_loopback: self.plan.admin_open_on_loopback,
                read_only: self.plan.admin_read_only,
                swaps: swap_controls,
                rollouts,
            };
            let bound = crate::serve::serve(
                addr,
                self.metrics.clone(),
                admin_subscriptions,
                options,
                stop.clone(),
            )
            .await?;
            // No guest's outbound HTTP may reach the host's own admin listener.
            if let Some(sub) = self.plan.subscriptions.first() {
                sub.component.runtime().protected().add(bound);
            }
            protected = Some(bound);
            self.admin_addr.send_replace(Some(bound));
        }

        stop.cancelled().await;
        if let (Some(addr), Some(sub)) = (protected, self.plan.subscriptions.first()) {
            sub.component.runtime().protected().remove(addr);
        }
        // The shutdown deadline counts from the signal: whatever the readers, watchers and
        // deliveries still do has that long in all.
        let timeout = self.plan.shutdown_timeout;
        let deadline = tokio::time::Instant::now() + timeout.min(sluice_descriptor::MAX_DURATION);
        tracing::info!("stopping: no new reads");
        // Readers get a short grace (a read in flight ends within its block time), never the
        // whole deadline: deliveries and acks need it more. A reader cut off loses nothing:
        // what its read made pending is read again at the next start.
        let readers_by = (tokio::time::Instant::now() + READERS_GRACE).min(deadline);
        let joined = tokio::time::timeout_at(readers_by, async {
            while readers.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !joined {
            tracing::info!(
                left = readers.len(),
                "readers and watchers still busy after {READERS_GRACE:?}; stopped"
            );
            readers.abort_all();
        }
        deliveries.close();
        let in_flight = deliveries.len();
        if in_flight > 0 {
            tracing::info!(
                in_flight,
                timeout_ms = timeout.as_millis() as u64,
                "stopped reading; waiting for in-flight deliveries"
            );
        }
        let drained = tokio::time::timeout_at(deadline, deliveries.wait())
            .await
            .is_ok();
        if !drained {
            abandon.cancel();
            return Err(RunError::Abandoned(deliveries.len()));
        }
        // Every settler is gone with its subscription; the ackers flush and end.
        let flushed = tokio::time::timeout_at(deadline, async {
            while ackers.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !flushed {
            abandon.cancel();
            let mut unsent = 0;
            while let Some(left) = ackers.join_next().await {
                unsent += left.unwrap_or(0);
            }
            return Err(RunError::Unflushed(unsent));
        }
        tracing::info!("all deliveries settled; stopped");
        Ok(())
    }
}

/// Claim `keys` again every [`crate::store::keys::CLAIM_RENEW`] until `stop`, so that they stay this
/// subscription's while it runs and lapse a day after its last host stopped.
async fn renew_claims(
    conn: redis_conn::RedisHandle,
    keys: SubscriptionKeys,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(crate::store::keys::CLAIM_RENEW) => {}
        }
        if let Err(err) = crate::store::keys::claim(&mut conn.clone(), &keys).await {
            tracing::error!(
                stream = %keys.stream,
                group = %keys.group,
                err = %crate::support::chain::chain(&err),
                "cannot renew this subscription's claim on its keys"
            );
        }
    }
}
