//! The service: from a checked plan to running subscriptions, and down again in order.
//!
//! - [`plan`] loads each component, lays the configuration over its descriptor and checks the
//!   result, before any task starts.
//! - This module's [`Service::run`] is the start and the stop, step by step: [`wiring`] holds
//!   what is started and starts each subscription (its flow controls, its handler slot and
//!   rollout), [`partition`] sets up each partition (keys, secret, delayed set, settler, read
//!   loop), [`connections`] shares a few connections and one doorbell per Redis, [`tasks`] are
//!   the background tasks a partition keeps (claims, migration), [`admin`] starts the admin
//!   server, and [`drain`] takes it all down in order; [`shutdown`] only turns SIGINT/SIGTERM
//!   into that stop.
//!
//! Shutdown, when `stop` is cancelled: every subscription stops reading; in-flight deliveries
//! get `shutdown_timeout` to finish; then the ackers flush what they hold. If the deadline
//! passes first, what is unfinished is abandoned: those entries stay pending in Redis and this
//! consumer re-reads them when it starts again.

mod admin;
mod connections;
mod drain;
mod partition;
pub(crate) mod plan;
pub(crate) mod shutdown;
mod tasks;
mod wiring;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::handler::Handler;
use crate::observe::events::Events;
use crate::runtime::WasmHandler;
use crate::service::plan::Plan;
use crate::store::redis_conn::ConnError;

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
    /// The read-only token is the operator's: whoever holds it could act.
    #[error(
        "admin_read_token and admin_token hold the same secret: the read-only token would act; give it its own (`openssl rand -hex 32`)"
    )]
    SameTokens,
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

    /// Run until `stop` is cancelled, then shut down. `dev_redis` is the URL used by
    /// subscriptions that have none of their own.
    pub async fn run(
        self,
        dev_redis: Option<String>,
        stop: CancellationToken,
    ) -> Result<(), RunError> {
        let rollout_key = self
            .rollout_key()
            .map_err(|err| RunError::RolloutKey(Box::new(err)))?;
        let mut wiring = self.wiring(dev_redis.as_deref(), rollout_key);
        for (sub, handler) in self.plan.subscriptions.iter().zip(self.handlers.clone()) {
            let url = sub
                .redis
                .clone()
                .or_else(|| dev_redis.clone())
                .ok_or_else(|| RunError::NoRedis(sub.stream.stream.clone()))?;
            // A stop asked for while Redis does not answer yet (a SIGTERM during start-up)
            // ends the start: nothing has been read, so nothing is in flight.
            let w = &mut wiring;
            let redis = tokio::select! {
                got = w.connections.get(&url, &sub.redis_access, &mut w.readers, &stop) => got?,
                () = stop.cancelled() => {
                    tracing::info!("stopped before every subscription had started; nothing was read");
                    return Ok(());
                }
            };
            self.start_subscription(&mut wiring, sub, handler, (&url, redis), &stop)
                .await?;
        }
        self.start_watchers(&mut wiring, &stop);
        let admin = self.start_admin(&mut wiring, &stop).await?;
        stop.cancelled().await;
        if let (Some(addr), Some(sub)) = (admin, self.plan.subscriptions.first()) {
            sub.component.runtime().protected().remove(addr);
        }
        self.drain(wiring).await
    }
}
