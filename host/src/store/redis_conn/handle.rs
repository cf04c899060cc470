//! [`RedisHandle`]: the host's way to one Redis deployment, cloned by every part of the host
//! that sends commands. It hands out the shared connection for short commands (and, as a
//! [`ConnectionLike`], is that connection), a read connection of its own per subscription, or
//! the node's pool of lean read connections; what a failed command tells it is in
//! [`super::failover`].

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Client, RedisFuture};

use super::lean::LeanConn;
use super::node::ConnError;
use super::pool::{LeanPool, PoolNode};
use super::reader::Reader;
use super::redaction::redact;
use super::route::Route;
use super::transport::{Endpoint, Tls};
use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};
use crate::config::RedisAccess;

/// The host's way to one Redis deployment.
///
/// - One node: commands go to it; nothing ever moves.
/// - Behind Sentinel: commands go to the current master. A reply that says the node is no
///   longer the master (READONLY) or a lost connection makes the handle ask the sentinels again
///   and connect to the master they name, while the command that failed is retried by its
///   caller like any other transient failure.
/// - A cluster: redis-rs's cluster client routes each command and script by its key's slot,
///   follows MOVED and ASK, and reloads the slot map when the cluster changes (a slot
///   migrated, a replica promoted). Reads get a lean connection of their own to the master
///   that serves their stream's slot.
#[derive(Clone)]
pub struct RedisHandle {
    pub(super) inner: Arc<HandleInner>,
}

/// What the clones of one handle share.
pub(super) struct HandleInner {
    /// Where commands go.
    pub(super) route: Route,
    /// The URL, without credentials, for logs.
    pub(super) name: String,
    /// The lean read connections of non-blocking readers (one node), made with the first one
    /// that asks.
    pool: OnceLock<Option<Arc<LeanPool>>>,
    /// The TLS files the read connections present and trust (see [`super::transport`]).
    tls: Tls,
}

impl HandleInner {
    /// The client of the node commands go to now (the master behind Sentinel); `None` on a
    /// cluster.
    fn node_client(&self) -> Option<Client> {
        match &self.route {
            Route::Node { current, .. } => Some(current.load().0.clone()),
            Route::Cluster { .. } => None,
        }
    }
}

impl PoolNode for HandleInner {
    fn node_client(&self) -> Option<Client> {
        HandleInner::node_client(self)
    }

    fn tls(&self) -> &Tls {
        &self.tls
    }
}

impl RedisHandle {
    /// Connect to what `configured` names (see [`super::Target`]) as `access` says. A single
    /// URL whose server is a cluster node is used as the cluster's seed.
    pub async fn connect(configured: &str, access: &RedisAccess) -> Result<Self, ConnError> {
        let name = redact(configured);
        let (route, certs) = Route::open(configured, access, &name).await?;
        Ok(Self {
            inner: Arc::new(HandleInner {
                route,
                name,
                pool: OnceLock::new(),
                tls: Tls::new(certs),
            }),
        })
    }

    /// Whether both are clones of one handle (one Redis, one set of connections): a probe
    /// of one answers for the other.
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether commands go to a cluster (so every script's keys must share one slot).
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.route, Route::Cluster { .. })
    }

    /// A connection of its own for blocking reads of up to `block`: a blocked XREADGROUP
    /// would hold up every other command on a shared connection. On a cluster it goes to the
    /// master that serves `key`'s slot (on one node `key` is not used); when the slot moves,
    /// the read's MOVED fails the connection and the next one is made to the new master.
    pub async fn reader(&self, block: Duration, key: &str) -> Result<Reader, ConnError> {
        let timeouts = (CONNECT_TIMEOUT, block + COMMAND_TIMEOUT);
        let (endpoint, settings) = match &self.inner.route {
            Route::Node { current, .. } => {
                let client = current.load().0.clone();
                let info = client.get_connection_info();
                (Endpoint::of(info.addr()), info.redis_settings().clone())
            }
            Route::Cluster { seeds, .. } => {
                let endpoint = seeds
                    .master_of(key, &self.inner.tls)
                    .await
                    .map_err(|source| ConnError::Connect {
                        url: self.inner.name.clone(),
                        source,
                    })?;
                (Ok(endpoint), seeds.settings())
            }
        };
        let endpoint = endpoint.map_err(|source| ConnError::Connect {
            url: self.inner.name.clone(),
            source,
        })?;
        LeanConn::connect(&endpoint, &self.inner.tls, &settings, timeouts)
            .await
            .map(|conn| Reader::Lean(Box::new(conn)))
            .map_err(|source| ConnError::Connect {
                url: endpoint.to_string(),
                source,
            })
    }

    /// A reader for reads that never block: the node's pool of lean connections (see
    /// [`super::pool`]); `None` on a cluster, where every read has a connection of its own.
    pub fn non_blocking_reader(&self) -> Option<Reader> {
        self.read_pool().map(Reader::Pooled)
    }

    /// The handle's pool of lean read connections (made at the first call), if the node
    /// suits them.
    fn read_pool(&self) -> Option<Arc<LeanPool>> {
        self.inner
            .pool
            .get_or_init(|| match &self.inner.route {
                Route::Node { .. } => {
                    let inner: Weak<HandleInner> = Arc::downgrade(&self.inner);
                    Some(LeanPool::new(inner as Weak<dyn PoolNode>))
                }
                Route::Cluster { .. } => None,
            })
            .clone()
    }

    /// Use `other`'s pool of lean read connections (another handle to the same Redis with
    /// the same credentials), so that the pool's bound holds per Redis, not per handle.
    pub fn share_read_pool(&self, other: &RedisHandle) {
        // A pool already made here stays (it is not made before its first read).
        let _ = self.inner.pool.set(other.read_pool());
    }

    /// The client of the node commands go to now (the master behind Sentinel), for a
    /// connection of another kind (the doorbell's subscriber); `None` on a cluster.
    pub fn node_client(&self) -> Option<Client> {
        self.inner.node_client()
    }

    /// The URL without credentials, for logs.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A connection for short commands (it reconnects, and on a cluster routes, by itself).
    fn shared(&self) -> Shared {
        match &self.inner.route {
            Route::Node { current, .. } => Shared::Node(current.load().1.clone()),
            Route::Cluster { conn, .. } => Shared::Cluster(conn.clone()),
        }
    }
}

/// The connection a [`RedisHandle`] hands out for one command.
enum Shared {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        let conn = self.shared();
        Box::pin(async move {
            let reply = match conn {
                Shared::Node(mut c) => c.req_packed_command(cmd).await,
                Shared::Cluster(mut c) => c.req_packed_command(cmd).await,
            };
            if let Err(err) = &reply {
                self.saw_error(err);
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        let conn = self.shared();
        Box::pin(async move {
            let reply = match conn {
                Shared::Node(mut c) => c.req_packed_commands(cmd, offset, count).await,
                Shared::Cluster(mut c) => c.req_packed_commands(cmd, offset, count).await,
            };
            if let Err(err) = &reply {
                self.saw_error(err);
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner.route {
            Route::Node { current, .. } => current.load().1.get_db(),
            Route::Cluster { .. } => 0,
        }
    }
}
