//! The connections a host keeps to each Redis it uses: a few multiplexed command connections
//! the subscriptions take turns on (so connections do not grow with subscriptions), one pool of
//! lean read connections, and one doorbell.

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::store::redis_conn;

/// The most command connections a host opens to one Redis (for one set of credentials): the
/// subscriptions take turns on them, so connections do not grow with subscriptions (each
/// subscription's connection of its own once held two per subscription: 250 subscriptions,
/// 500 connections). Each is multiplexed; several keep one slow reply from holding up every
/// subscription's commands.
const CONNECTIONS_PER_REDIS: usize = 4;

/// The command connections and the doorbell of one Redis (and set of credentials).
pub(super) struct OneRedis {
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
pub(super) struct Connections {
    open: Vec<OneRedis>,
    /// What `doorbell` says.
    mode: crate::config::DoorbellMode,
    /// How many subscriptions of one partition each Redis URL serves in this host (whether
    /// its doorbell polls): a partitioned one waits in shared reads, not on the doorbell.
    pub(super) partitions: std::collections::HashMap<String, usize>,
}

impl Connections {
    /// None open yet; doorbells as `mode` says.
    pub(super) fn new(mode: crate::config::DoorbellMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// A connection to `url` as `access` says (a new one while there are fewer than
    /// [`CONNECTIONS_PER_REDIS`], else the next in turn) and that Redis's doorbell, opened
    /// with its first connection (and started in `tasks`).
    pub(super) async fn get(
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
