//! Connections to Redis (one node, a master behind Sentinel, or a cluster): a managed,
//! self-reconnecting connection for acks and scripts, and a dedicated connection per
//! subscription for its blocking reads (a blocked XREADGROUP would otherwise hold up every
//! other command on a shared connection).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::RedisFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    Client, ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError,
    TlsCertificates,
};

use crate::config::{PrivateFileError, RedisAccess, read_private};
use transport::Endpoint;

pub mod lean;
pub mod pool;
pub mod transport;

/// How long a non-blocking command may take before it counts as failed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The first and the largest pause between reconnection attempts.
pub const RECONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(5));

/// Why Redis could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The URL does not parse.
    #[error("invalid Redis URL {url:?}")]
    Url {
        /// The URL as given.
        url: String,
        /// What redis-rs said.
        source: RedisError,
    },
    /// Connecting failed (refused, timed out, TLS verification, authentication).
    #[error("cannot connect to Redis at {url}")]
    Connect {
        /// The URL, without credentials.
        url: String,
        /// What failed.
        source: RedisError,
    },
    /// A credentials or TLS file could not be read.
    #[error("cannot read {what} {}", path.display())]
    File {
        /// Which setting named it.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the filesystem said.
        source: std::io::Error,
    },
    /// The password file could be read by every user of the machine.
    #[error(
        "the Redis password file {} is readable by every user; make it private (chmod 600)",
        .0.display()
    )]
    PasswordFileOpen(PathBuf),
    /// TLS files were given for a URL that does not use TLS.
    #[error(
        "redis_ca_file / redis_cert_file are set, but {0} does not use TLS: write rediss:// to connect with TLS"
    )]
    TlsWithoutRediss(String),
    /// TLS files were given for a Sentinel URL, where they would be ignored.
    #[error(
        "TLS files (redis_ca_file, redis_cert_file) are not supported behind Sentinel ({0}): connect to the master with rediss:// or drop the TLS files"
    )]
    TlsBehindSentinel(String),
}

/// A client for `url`, logging in and verifying TLS as `access` says.
pub fn client(url: &str, access: &RedisAccess) -> Result<Client, ConnError> {
    let (info, tls) = node_info(url, access)?;
    match tls {
        None => Client::open(info),
        Some(certs) => Client::build_with_tls(info, certs),
    }
    .map_err(|source| ConnError::Url {
        url: redact(url),
        source,
    })
}

/// `url` parsed, with `access`'s login applied and its TLS files read (`None`: no TLS files,
/// so a `rediss://` URL trusts the system roots).
fn node_info(
    url: &str,
    access: &RedisAccess,
) -> Result<(ConnectionInfo, Option<TlsCertificates>), ConnError> {
    let mut info = url
        .into_connection_info()
        .map_err(|source| ConnError::Url {
            url: redact(url),
            source,
        })?;
    if access.username.is_some() || access.password_file.is_some() {
        let settings = log_in(info.redis_settings().clone(), access)?;
        info = info.set_redis_settings(settings);
    }
    if !access.has_tls_files() {
        return Ok((info, None));
    }
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return Err(ConnError::TlsWithoutRediss(redact(url)));
    }
    let read = |what: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| ConnError::File {
            what,
            path: path.to_owned(),
            source,
        })
    };
    let root_cert = match &access.ca_file {
        Some(path) => Some(read("the Redis CA file", path)?),
        None => None,
    };
    let client_tls = match &access.client_cert {
        Some((cert, key)) => Some(ClientTlsConfig {
            client_cert: read("the Redis client certificate", cert)?,
            client_key: read("the Redis client key", key)?,
        }),
        None => None,
    };
    Ok((
        info,
        Some(TlsCertificates {
            client_tls,
            root_cert,
        }),
    ))
}

/// `settings` with `access`'s user and the password from its file.
fn log_in(
    mut settings: redis::RedisConnectionInfo,
    access: &RedisAccess,
) -> Result<redis::RedisConnectionInfo, ConnError> {
    if let Some(username) = &access.username {
        settings = settings.set_username(username);
    }
    if let Some(path) = &access.password_file {
        let password = read_private(path).map_err(|err| match err {
            PrivateFileError::Io(source) => ConnError::File {
                what: "the Redis password file",
                path: path.to_owned(),
                source,
            },
            PrivateFileError::WorldReadable => ConnError::PasswordFileOpen(path.to_owned()),
        })?;
        settings = settings.set_password(password);
    }
    Ok(settings)
}

/// The URL (or each of a cluster's seed URLs) with any password replaced, for logs and errors.
pub fn redact(url: &str) -> String {
    let one = |url: &str| match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    };
    let urls: Vec<String> = url.split_whitespace().map(one).collect();
    if urls.len() > 1 {
        urls.join(" ")
    } else {
        one(url)
    }
}

/// Which Redis deployment the configured value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server, which may turn out to be a cluster node when asked.
    Node(String),
    /// A master watched by sentinels.
    Sentinel(SentinelUrl),
    /// A cluster, by some of its nodes (any of them will do to find the rest).
    Cluster(Vec<String>),
}

impl Target {
    /// What `configured` names: URLs separated by whitespace (how the configuration carries a
    /// `redis = [..]` list) are a cluster's seed nodes.
    pub fn parse(configured: &str) -> Self {
        let urls: Vec<&str> = configured.split_whitespace().collect();
        match urls.as_slice() {
            [one] => SentinelUrl::parse(one)
                .map_or_else(|| Self::Node((*one).to_owned()), Self::Sentinel),
            [] => Self::Node(configured.to_owned()),
            many => Self::Cluster(many.iter().map(|u| (*u).to_owned()).collect()),
        }
    }
}

/// Where the sentinels are and which master they watch, from a
/// `redis+sentinel://host:port[,host:port...]/master-name` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels' addresses.
    pub sentinels: Vec<String>,
    /// The name the sentinels know the master by.
    pub master: String,
}

impl SentinelUrl {
    /// The URL's parts, or `None` when it is not a `redis+sentinel://` URL.
    pub fn parse(url: &str) -> Option<Self> {
        let rest = url.strip_prefix("redis+sentinel://")?;
        let (hosts, master) = rest.split_once('/')?;
        let sentinels: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{h}"))
            .collect();
        let master = master.trim_end_matches('/').to_owned();
        (!sentinels.is_empty() && !master.is_empty()).then_some(Self { sentinels, master })
    }
}

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
    inner: Arc<HandleInner>,
}

struct HandleInner {
    route: Route,
    /// The URL, without credentials, for logs.
    name: String,
    /// The lean read connections of non-blocking readers (one node), made with the first one
    /// that asks.
    pool: std::sync::OnceLock<Option<Arc<pool::LeanPool>>>,
    /// The TLS files the read connections present and trust (see [`transport`]).
    tls: transport::Tls,
}

enum Route {
    Node {
        current: ArcSwap<(Client, ConnectionManager)>,
        sentinel: Option<Box<tokio::sync::Mutex<SentinelClient>>>,
        /// Set while a re-resolution runs, so a burst of failures asks the sentinels once.
        refreshing: AtomicBool,
    },
    Cluster {
        conn: ClusterConnection,
        seeds: ClusterSeeds,
    },
}

/// What it takes to open another connection to a cluster.
struct ClusterSeeds {
    nodes: Vec<ConnectionInfo>,
    tls: Option<TlsCertificates>,
}

impl ClusterSeeds {
    fn new(urls: &[String], access: &RedisAccess) -> Result<Self, ConnError> {
        let mut nodes = Vec::with_capacity(urls.len());
        let mut tls = None;
        for url in urls {
            let (info, certs) = node_info(url, access)?;
            nodes.push(info);
            tls = tls.or(certs);
        }
        Ok(Self { nodes, tls })
    }

    /// A cluster connection whose commands may take up to `response_timeout`.
    async fn connect(
        &self,
        response_timeout: Duration,
        name: &str,
    ) -> Result<ClusterConnection, ConnError> {
        let mut builder = ClusterClientBuilder::new(self.nodes.clone())
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(response_timeout);
        if let Some(certs) = &self.tls {
            builder = builder.certs(certs.clone());
        }
        let client = builder.build().map_err(|source| ConnError::Url {
            url: name.to_owned(),
            source,
        })?;
        client
            .get_async_connection()
            .await
            .map_err(|source| ConnError::Connect {
                url: name.to_owned(),
                source,
            })
    }
}

impl ClusterSeeds {
    /// The login the seeds were given, for connections of the host's own to cluster nodes.
    fn settings(&self) -> redis::RedisConnectionInfo {
        self.nodes
            .first()
            .map(|n| n.redis_settings().clone())
            .unwrap_or_default()
    }

    /// The master that serves `key`'s slot now, as the first seed that answers sees it
    /// (asked directly, so that a node announced without a host, as a cluster of one or one
    /// set to `cluster-preferred-endpoint-type unknown-endpoint` announces it, is reached at
    /// the seed's host); reached over TLS when the seeds are.
    async fn master_of(&self, key: &str, tls: &transport::Tls) -> Result<Endpoint, RedisError> {
        let mut failed = None;
        for seed in &self.nodes {
            let asked = Endpoint::of(seed.addr());
            let answer = match &asked {
                Ok(endpoint) => ask_slots(endpoint, seed, key, tls).await,
                Err(err) => Err(err.clone()),
            };
            match answer {
                Ok(found) => return Ok(found),
                Err(err) => failed = Some((seed.addr().to_string(), err)),
            }
        }
        let (node, err) = failed.unwrap_or_else(|| {
            (
                "the cluster".to_owned(),
                RedisError::from((redis::ErrorKind::InvalidClientConfig, "no seed nodes")),
            )
        });
        Err(RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "cannot find the master of a stream's slot",
            format!("{key:?}: asking {node}: {err}"),
        )))
    }
}

/// `key`'s master, as the seed at `endpoint` (of `seed`) sees it.
async fn ask_slots(
    endpoint: &Endpoint,
    seed: &ConnectionInfo,
    key: &str,
    tls: &transport::Tls,
) -> Result<Endpoint, RedisError> {
    let timeouts = (CONNECT_TIMEOUT, COMMAND_TIMEOUT);
    let mut conn = lean::LeanConn::connect(endpoint, tls, seed.redis_settings(), timeouts).await?;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(&mut conn)
        .await?;
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await?;
    let (Endpoint::Tcp(seed_host, _) | Endpoint::Tls(seed_host, _)) = endpoint else {
        return Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a cluster seed on a Unix socket",
        )));
    };
    let Some((host, port)) = ranges.iter().find_map(|range| serving(range, slot)) else {
        return Err(RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "no master serves the slot",
            format!("slot {slot} (CLUSTER SLOTS)"),
        )));
    };
    let host = host.unwrap_or_else(|| seed_host.clone());
    Ok(match endpoint {
        Endpoint::Tls(..) => Endpoint::Tls(host, port),
        _ => Endpoint::Tcp(host, port),
    })
}

/// The address of the master in one range of a CLUSTER SLOTS reply
/// (`[start, end, [host, port, id, ..], replicas..]`) if the range holds `slot`; no host when
/// the node announces none (nil or empty: the node asked is to be reached as it was).
fn serving(range: &redis::Value, slot: i64) -> Option<(Option<String>, u16)> {
    use redis::Value;
    let Value::Array(items) = range else {
        return None;
    };
    let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
        (items.first(), items.get(1), items.get(2))
    else {
        return None;
    };
    if !(*start..=*end).contains(&slot) {
        return None;
    }
    let host = match master.first() {
        Some(Value::BulkString(host)) => String::from_utf8(host.clone()).ok(),
        _ => None,
    };
    let Some(Value::Int(port)) = master.get(1) else {
        return None;
    };
    Some((host.filter(|h| !h.is_empty()), u16::try_from(*port).ok()?))
}

impl RedisHandle {
    /// Connect to what `configured` names (see [`Target`]) as `access` says. A single URL whose
    /// server is a cluster node is used as the cluster's seed.
    pub async fn connect(configured: &str, access: &RedisAccess) -> Result<Self, ConnError> {
        let name = redact(configured);
        let connect_err = |source| ConnError::Connect {
            url: name.clone(),
            source,
        };
        // The TLS files of a single node (a cluster's seeds keep their own).
        let mut certs = None;
        let route = match Target::parse(configured) {
            Target::Cluster(urls) => Self::cluster_route(&urls, access, &name).await?,
            Target::Sentinel(target) => {
                // Whichever way the URL came (config, --redis, SLUICE_REDIS_URL): no TLS files
                // behind Sentinel, or the password would go in clear text.
                if access.has_tls_files() {
                    return Err(ConnError::TlsBehindSentinel(name));
                }
                let mut sentinel = sentinel_client(&target, access, &name)?;
                let client = sentinel.async_get_client().await.map_err(connect_err)?;
                let manager = manager(&client).await?;
                Route::Node {
                    current: ArcSwap::from_pointee((client, manager)),
                    sentinel: Some(Box::new(tokio::sync::Mutex::new(sentinel))),
                    refreshing: AtomicBool::new(false),
                }
            }
            Target::Node(url) => {
                let client = client(&url, access)?;
                certs = node_info(&url, access)?.1;
                let mut manager = manager(&client).await?;
                let info: String = match redis::cmd("INFO")
                    .arg("cluster")
                    .query_async(&mut manager)
                    .await
                {
                    Ok(info) => info,
                    // A user whose ACL denies INFO: a cluster would answer with MOVED to the
                    // first command on another node's slot, which the log would then name.
                    Err(err) if err.code() == Some("NOPERM") => {
                        tracing::info!(redis = %name, "INFO is not allowed for this user; assuming a single node (list the nodes to use a cluster)");
                        String::new()
                    }
                    Err(err) => return Err(connect_err(err)),
                };
                if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
                    tracing::info!(redis = %name, "the server is a cluster node; using it to find the cluster");
                    Self::cluster_route(&[url], access, &name).await?
                } else {
                    Route::Node {
                        current: ArcSwap::from_pointee((client, manager)),
                        sentinel: None,
                        refreshing: AtomicBool::new(false),
                    }
                }
            }
        };
        if let Route::Cluster { seeds, .. } = &route {
            certs = seeds.tls.clone();
        }
        Ok(Self {
            inner: Arc::new(HandleInner {
                route,
                name,
                pool: std::sync::OnceLock::new(),
                tls: transport::Tls::new(certs),
            }),
        })
    }

    async fn cluster_route(
        urls: &[String],
        access: &RedisAccess,
        name: &str,
    ) -> Result<Route, ConnError> {
        let seeds = ClusterSeeds::new(urls, access)?;
        let conn = seeds.connect(COMMAND_TIMEOUT, name).await?;
        Ok(Route::Cluster { conn, seeds })
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
        lean::LeanConn::connect(&endpoint, &self.inner.tls, &settings, timeouts)
            .await
            .map(|conn| Reader::Lean(Box::new(conn)))
            .map_err(|source| ConnError::Connect {
                url: endpoint.to_string(),
                source,
            })
    }

    /// A reader for reads that never block: the node's pool of lean connections (see
    /// [`pool`]); `None` on a cluster, where every read has a connection of its own.
    pub fn non_blocking_reader(&self) -> Option<Reader> {
        self.read_pool().map(Reader::Pooled)
    }

    /// The handle's pool of lean read connections (made at the first call), if the node
    /// suits them.
    fn read_pool(&self) -> Option<Arc<pool::LeanPool>> {
        self.inner
            .pool
            .get_or_init(|| match &self.inner.route {
                Route::Node { .. } => Some(pool::LeanPool::new(Arc::downgrade(&self.inner))),
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
        match &self.inner.route {
            Route::Node { current, .. } => Some(current.load().0.clone()),
            Route::Cluster { .. } => None,
        }
    }

    /// The URL without credentials, for logs.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Tell the handle a command failed with `err`. Behind Sentinel, a failure that may mean
    /// the master moved starts a re-resolution in the background. On one node or behind
    /// Sentinel, a command that timed out replaces the shared connection: a connection whose
    /// peer vanished without a reset (a half-open TCP connection) would otherwise hold every
    /// later command until the kernel gives up on it, about 15 minutes by default, while the
    /// blocking reads, on connections of their own, reconnect and go on taking entries that
    /// can never be settled.
    pub fn saw_error(&self, err: &RedisError) {
        let Route::Node {
            sentinel,
            refreshing,
            ..
        } = &self.inner.route
        else {
            return;
        };
        let timed_out = err.is_timeout();
        let moved = sentinel.is_some()
            && (err.code() == Some("READONLY") || ErrorClass::of(err) == ErrorClass::Connection);
        if !(moved || timed_out) || refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            this.refresh(timed_out).await;
            if let Route::Node { refreshing, .. } = &this.inner.route {
                refreshing.store(false, Ordering::Release);
            }
        });
    }

    /// Connect again: to the master the sentinels name now (if it moved), or, after a
    /// command timed out, to the same node over a new connection.
    async fn refresh(&self, timed_out: bool) {
        let Route::Node {
            current, sentinel, ..
        } = &self.inner.route
        else {
            return;
        };
        let client = match sentinel {
            Some(sentinel) => match sentinel.lock().await.async_get_client().await {
                Ok(client) => client,
                Err(err) => {
                    tracing::warn!(redis = %self.inner.name, %err, "the sentinels name no master; retrying");
                    return;
                }
            },
            None => current.load().0.clone(),
        };
        let addr = client.get_connection_info().addr().to_string();
        let moved = current.load().0.get_connection_info().addr().to_string() != addr;
        if !moved && !timed_out {
            return;
        }
        match manager(&client).await {
            Ok(manager) => {
                if moved {
                    tracing::warn!(redis = %self.inner.name, master = %addr, "the master moved (failover); following it");
                } else {
                    tracing::warn!(redis = %self.inner.name, "a command timed out on the shared connection; replaced it with a new one");
                }
                current.store(Arc::new((client, manager)));
            }
            Err(err) => {
                tracing::warn!(redis = %self.inner.name, %addr, %err, "cannot connect again yet")
            }
        }
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

/// A connection for one subscription's reads: every read is framed by the lean reader (see
/// [`lean`]), so none buffers a value over the subscription's `max_entry_bytes`.
pub enum Reader {
    /// A connection of its own, to the one node (or the current master behind Sentinel, or
    /// the cluster master that serves its stream), for blocking reads.
    Lean(Box<lean::LeanConn>),
    /// The node's pool of lean read connections, for reads that never block (see [`pool`]).
    Pooled(Arc<pool::LeanPool>),
}

impl Reader {
    /// XREADGROUP (as `cmd`), its reply parsed straight into entries and cut as
    /// [`lean::LeanConn::read_entries`] says.
    pub async fn read_entries<T>(
        &mut self,
        cmd: &redis::Cmd,
        cut_over: (usize, usize),
        make: impl FnMut(&[u8], String, lean::Fields, lean::Cut) -> T,
    ) -> Result<Vec<T>, RedisError> {
        match self {
            Self::Lean(c) => c.read_entries(cmd, cut_over, make).await,
            Self::Pooled(p) => p.read_entries(cmd, cut_over, make).await,
        }
    }
}

impl ConnectionLike for Reader {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        match self {
            Self::Lean(c) => c.req_packed_command(cmd),
            Self::Pooled(p) => p.command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Lean(c) => c.req_packed_commands(cmd, offset, count),
            Self::Pooled(p) => p.commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Lean(c) => c.get_db(),
            Self::Pooled(p) => p.db(),
        }
    }
}

fn sentinel_client(
    target: &SentinelUrl,
    access: &RedisAccess,
    name: &str,
) -> Result<SentinelClient, ConnError> {
    let settings = log_in(redis::RedisConnectionInfo::default(), access)?;
    let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(settings);
    SentinelClient::build(
        target.sentinels.clone(),
        target.master.clone(),
        Some(node),
        SentinelServerType::Master,
    )
    .map_err(|source| ConnError::Url {
        url: name.to_owned(),
        source,
    })
}

/// A connection manager for acks, scripts and other short commands; it reconnects by itself.
pub async fn manager(client: &Client) -> Result<ConnectionManager, ConnError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(COMMAND_TIMEOUT))
        .set_min_delay(RECONNECT_BACKOFF.0)
        .set_max_delay(RECONNECT_BACKOFF.1);
    ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(|source| ConnError::Connect {
            url: client.get_connection_info().addr().to_string(),
            source,
        })
}

/// What kind of failure a Redis error is: whether waiting and trying again can help, and how
/// to say what happened in a log line (never just "unavailable").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The connection failed, was refused, dropped or timed out.
    Connection,
    /// Redis answered that it cannot serve now (LOADING, BUSY, TRYAGAIN, MASTERDOWN,
    /// CLUSTERDOWN, READONLY, or UNBLOCKED: a blocked read cut off because its node turned
    /// replica).
    Busy,
    /// A cluster redirect (MOVED/ASK): the key lives on another node.
    Redirect,
    /// NOGROUP: the stream or the consumer group does not exist (any more).
    NoGroup,
    /// WRONGTYPE: a key holds another type than the command needs.
    WrongType,
    /// The reply could not be understood.
    Reply,
    /// Redis refused the command (a script error, a bad argument, missing permission).
    Refused,
}

impl ErrorClass {
    /// Classify `err` by its kind and code, never by its text.
    pub fn of(err: &RedisError) -> Self {
        use redis::ErrorKind;
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
        {
            return Self::Connection;
        }
        match err.code() {
            Some("MOVED" | "ASK") => return Self::Redirect,
            Some("NOGROUP") => return Self::NoGroup,
            Some("WRONGTYPE") => return Self::WrongType,
            Some(
                "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "READONLY"
                | "UNBLOCKED",
            ) => {
                return Self::Busy;
            }
            _ => {}
        }
        match err.kind() {
            ErrorKind::UnexpectedReturnType | ErrorKind::Parse => Self::Reply,
            ErrorKind::AuthenticationFailed | ErrorKind::ClusterConnectionNotFound => {
                Self::Connection
            }
            _ => Self::Refused,
        }
    }

    /// Whether trying the same command again later can succeed without anyone changing
    /// anything (a connection back, a server done loading).
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Connection | Self::Busy)
    }

    /// What happened, for log lines.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Connection => "Redis unreachable (connection failed, dropped or timed out)",
            Self::Busy => "Redis cannot serve now",
            Self::Redirect => {
                "Redis redirected the command to another cluster node (MOVED/ASK) and the redirect was not followed"
            }
            Self::NoGroup => "the stream or consumer group does not exist (NOGROUP)",
            Self::WrongType => "a key holds the wrong type of value (WRONGTYPE)",
            Self::Reply => "unexpected reply from Redis",
            Self::Refused => "Redis refused the command",
        }
    }
}

/// Capped exponential backoff between attempts to reach Redis again.
#[derive(Debug, Clone)]
pub struct ReconnectBackoff {
    next: Duration,
}

impl Default for ReconnectBackoff {
    fn default() -> Self {
        Self {
            next: RECONNECT_BACKOFF.0,
        }
    }
}

impl ReconnectBackoff {
    /// The pause before the next attempt; each call doubles it up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(RECONNECT_BACKOFF.1);
        delay
    }

    /// Start over after a success.
    pub fn reset(&mut self) {
        self.next = RECONNECT_BACKOFF.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_kind_and_code() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(ErrorClass::of(&io), ErrorClass::Connection);
        assert!(ErrorClass::of(&io).is_transient());
        let reply = RedisError::from((redis::ErrorKind::UnexpectedReturnType, "x"));
        assert_eq!(ErrorClass::of(&reply), ErrorClass::Reply);
        assert!(!ErrorClass::of(&reply).is_transient());
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let url =
            SentinelUrl::parse("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster").unwrap();
        assert_eq!(
            url.sentinels,
            ["redis://10.0.0.1:26379", "redis://10.0.0.2:26380"]
        );
        assert_eq!(url.master, "mymaster");
        assert_eq!(SentinelUrl::parse("redis://10.0.0.1:6379"), None);
        assert_eq!(SentinelUrl::parse("redis+sentinel://10.0.0.1:26379/"), None);
    }

    #[test]
    fn targets_are_a_node_a_sentinel_set_or_cluster_seeds() {
        assert_eq!(
            Target::parse("redis://h:1"),
            Target::Node("redis://h:1".into())
        );
        assert!(matches!(
            Target::parse("redis+sentinel://h:1/m"),
            Target::Sentinel(_)
        ));
        assert_eq!(
            Target::parse("redis://a:1 redis://b:2"),
            Target::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert_eq!(
            redact("redis://:pw@a:1 redis://:pw@b:2"),
            "redis://***@a:1 redis://***@b:2"
        );
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact("redis://:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }
}
