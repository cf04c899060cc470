//! A cluster as the host finds it: its seed nodes ([`ClusterSeeds`]), from which redis-rs's
//! cluster client learns the rest, and which the host asks itself for the master that serves a
//! stream's slot (`CLUSTER KEYSLOT`, `CLUSTER SLOTS`), so a read gets a lean connection of its
//! own to that master.

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, RedisError, TlsCertificates};

use super::lean::LeanConn;
use super::node::{ConnError, node_info};
use super::transport::{Endpoint, Tls};
use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};
use crate::config::RedisAccess;

/// What it takes to open another connection to a cluster.
pub(super) struct ClusterSeeds {
    nodes: Vec<ConnectionInfo>,
    /// The seeds' TLS files, which the read connections to cluster nodes use too.
    pub(super) tls: Option<TlsCertificates>,
}

impl ClusterSeeds {
    /// The seeds `urls`, logged in and with TLS as `access` says.
    pub(super) fn new(urls: &[String], access: &RedisAccess) -> Result<Self, ConnError> {
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
    pub(super) async fn connect(
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
    pub(super) fn settings(&self) -> redis::RedisConnectionInfo {
        self.nodes
            .first()
            .map(|n| n.redis_settings().clone())
            .unwrap_or_default()
    }

    /// The master that serves `key`'s slot now, as the first seed that answers sees it
    /// (asked directly, so that a node announced without a host, as a cluster of one or one
    /// set to `cluster-preferred-endpoint-type unknown-endpoint` announces it, is reached at
    /// the seed's host); reached over TLS when the seeds are.
    pub(super) async fn master_of(&self, key: &str, tls: &Tls) -> Result<Endpoint, RedisError> {
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
    tls: &Tls,
) -> Result<Endpoint, RedisError> {
    let timeouts = (CONNECT_TIMEOUT, COMMAND_TIMEOUT);
    let mut conn = LeanConn::connect(endpoint, tls, seed.redis_settings(), timeouts).await?;
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
