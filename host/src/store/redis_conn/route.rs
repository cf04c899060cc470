//! Which way commands go ([`Route`]), found when a handle connects: to one node, to the
//! master the sentinels name (asked again when it moves, see [`super::failover`]), or through
//! redis-rs's cluster client. A single URL whose server says it is a cluster node becomes the
//! cluster's seed.

use std::sync::atomic::AtomicBool;

use arc_swap::ArcSwap;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, TlsCertificates};

use super::COMMAND_TIMEOUT;
use super::cluster::ClusterSeeds;
use super::node::{ConnError, client, log_in, manager, node_info};
use super::target::{SentinelUrl, Target};
use crate::config::RedisAccess;

/// Where a handle's commands go.
pub(super) enum Route {
    /// One node, or the master behind Sentinel.
    Node {
        /// The node's client and its connection for short commands; replaced when the master
        /// moves or a command timed out.
        current: ArcSwap<(Client, ConnectionManager)>,
        /// The sentinels to ask where the master is now (`None`: one node, nothing moves).
        sentinel: Option<Box<tokio::sync::Mutex<SentinelClient>>>,
        /// Set while a re-resolution runs, so a burst of failures asks the sentinels once.
        refreshing: AtomicBool,
    },
    /// A cluster: redis-rs routes each command by its key's slot.
    Cluster {
        /// The cluster connection for short commands.
        conn: ClusterConnection,
        /// The seeds, to find the master of a read's slot.
        seeds: ClusterSeeds,
    },
}

impl Route {
    /// The way to what `configured` names (`name`: it without credentials, for errors and
    /// logs) as `access` says, and the TLS files its read connections present and trust.
    pub(super) async fn open(
        configured: &str,
        access: &RedisAccess,
        name: &str,
    ) -> Result<(Self, Option<TlsCertificates>), ConnError> {
        let (route, certs) = match Target::parse(configured) {
            Target::Cluster(urls) => (Self::cluster(&urls, access, name).await?, None),
            Target::Sentinel(target) => (Self::sentinel(&target, access, name).await?, None),
            Target::Node(url) => Self::node(url, access, name).await?,
        };
        // The TLS files of a single node (a cluster's seeds keep their own).
        let certs = match &route {
            Self::Cluster { seeds, .. } => seeds.tls.clone(),
            Self::Node { .. } => certs,
        };
        Ok((route, certs))
    }

    /// The master the sentinels of `target` name now, and the sentinels to ask again.
    async fn sentinel(
        target: &SentinelUrl,
        access: &RedisAccess,
        name: &str,
    ) -> Result<Self, ConnError> {
        // Whichever way the URL came (config, --redis, SLUICE_REDIS_URL): no TLS files
        // behind Sentinel, or the password would go in clear text.
        if access.has_tls_files() {
            return Err(ConnError::TlsBehindSentinel(name.to_owned()));
        }
        let mut sentinel = sentinel_client(target, access, name)?;
        let client = sentinel
            .async_get_client()
            .await
            .map_err(|source| ConnError::Connect {
                url: name.to_owned(),
                source,
            })?;
        let manager = manager(&client).await?;
        Ok(Self::Node {
            current: ArcSwap::from_pointee((client, manager)),
            sentinel: Some(Box::new(tokio::sync::Mutex::new(sentinel))),
            refreshing: AtomicBool::new(false),
        })
    }

    /// The node `url` names, or the cluster it turns out to be a node of; with the node's TLS
    /// files.
    async fn node(
        url: String,
        access: &RedisAccess,
        name: &str,
    ) -> Result<(Self, Option<TlsCertificates>), ConnError> {
        let client = client(&url, access)?;
        let certs = node_info(&url, access)?.1;
        let mut manager = manager(&client).await?;
        if is_cluster_node(&mut manager, name).await? {
            tracing::info!(redis = %name, "the server is a cluster node; using it to find the cluster");
            return Ok((Self::cluster(&[url], access, name).await?, certs));
        }
        let route = Self::Node {
            current: ArcSwap::from_pointee((client, manager)),
            sentinel: None,
            refreshing: AtomicBool::new(false),
        };
        Ok((route, certs))
    }

    /// The cluster the seeds `urls` belong to.
    async fn cluster(urls: &[String], access: &RedisAccess, name: &str) -> Result<Self, ConnError> {
        let seeds = ClusterSeeds::new(urls, access)?;
        let conn = seeds.connect(COMMAND_TIMEOUT, name).await?;
        Ok(Self::Cluster { conn, seeds })
    }
}

/// Whether the node `manager` talks to says it is a cluster node (`INFO cluster`).
async fn is_cluster_node(manager: &mut ConnectionManager, name: &str) -> Result<bool, ConnError> {
    let info: String = match redis::cmd("INFO").arg("cluster").query_async(manager).await {
        Ok(info) => info,
        // A user whose ACL denies INFO: a cluster would answer with MOVED to the
        // first command on another node's slot, which the log would then name.
        Err(err) if err.code() == Some("NOPERM") => {
            tracing::info!(redis = %name, "INFO is not allowed for this user; assuming a single node (list the nodes to use a cluster)");
            String::new()
        }
        Err(source) => {
            return Err(ConnError::Connect {
                url: name.to_owned(),
                source,
            });
        }
    };
    Ok(info.lines().any(|l| l.trim() == "cluster_enabled:1"))
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
