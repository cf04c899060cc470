//! The lean read connections a Redis node's subscriptions with a bell share: they wait on the
//! doorbell, not in a read, so their reads never block.
//!
//! Each read takes a connection for its one command and gives it back: thousands of idle
//! subscriptions hold none, and a busy one still reads with the lean parser (replies straight
//! into entries, the buffer given back after a big one) instead of redis-rs's shared
//! connection and its value tree, which cost a busy subscription a third of its throughput
//! (`sluice-bench wasm-doorbell` against `wasm`).
//!
//! At most [`POOL_SIZE`] connections per Redis (a host's handles to one Redis share one pool,
//! see [`super::RedisHandle::share_read_pool`]), so a busy tenant's reads cannot take more: a
//! read waits for a free one (they are short, never blocking). A connection goes back only
//! after a command that succeeded; any error (a timeout, a reply cut off, a node that became a
//! replica) drops it, and the next read connects anew to the node commands go to now.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisFuture, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::lean::{Cut, Fields, LeanConn};
use super::transport::{Endpoint, Tls};
use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};

/// The most lean read connections one node's pool holds.
pub const POOL_SIZE: usize = 8;
/// How long a connection waits unused in the pool before it is closed: an idle host holds
/// none of them.
pub const POOL_IDLE: Duration = Duration::from_secs(10);

/// What a pool needs of the handle that holds it: where commands go now and how to reach it.
/// A seam of the pool's own, so the pool does not know the handle that owns it.
pub(super) trait PoolNode: Send + Sync {
    /// The client of the node commands go to now (`None` on a cluster).
    fn node_client(&self) -> Option<redis::Client>;
    /// The TLS files the pool's connections present and trust.
    fn tls(&self) -> &Tls;
}

/// A connection waiting in the pool, and since when.
struct Waiting {
    conn: LeanConn,
    since: Instant,
}

/// One node's pool (see the module doc).
pub struct LeanPool {
    /// The handle that holds the pool (weakly: it owns the pool).
    handle: Weak<dyn PoolNode>,
    /// The most recently used last: those at the front go unused, and close.
    idle: Mutex<Vec<Waiting>>,
    permits: Semaphore,
}

impl LeanPool {
    /// An empty pool for the node `handle` sends commands to, whose connections close after
    /// [`POOL_IDLE`] unused (a task on the current runtime closes them, if there is one).
    pub(super) fn new(handle: Weak<dyn PoolNode>) -> Arc<Self> {
        let pool = Arc::new(Self {
            handle,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(POOL_SIZE),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&pool);
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(POOL_IDLE / 2);
                loop {
                    tick.tick().await;
                    let Some(pool) = weak.upgrade() else { return };
                    pool.waiting()
                        .retain(|waiting| waiting.since.elapsed() < POOL_IDLE);
                }
            });
        }
        pool
    }

    fn waiting(&self) -> MutexGuard<'_, Vec<Waiting>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Run `request` on a connection of the pool (waiting for a free one), giving the
    /// connection back if the request succeeded.
    async fn with<T>(
        &self,
        request: impl AsyncFnOnce(&mut LeanConn) -> Result<T, RedisError>,
    ) -> Result<T, RedisError> {
        let _permit =
            self.permits.acquire().await.map_err(|_| {
                RedisError::from((redis::ErrorKind::Client, "the read pool closed"))
            })?;
        let pooled = self.waiting().pop();
        let mut conn = match pooled {
            Some(waiting) => waiting.conn,
            None => self.connect().await?,
        };
        let result = request(&mut conn).await;
        if result.is_ok() {
            self.waiting().push(Waiting {
                conn,
                since: Instant::now(),
            });
        }
        result
    }

    async fn connect(&self) -> Result<LeanConn, RedisError> {
        let Some(handle) = self.handle.upgrade() else {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "the Redis handle of this pool is gone",
            )));
        };
        let Some(client) = self.node_client() else {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no lean read pool on a cluster",
            )));
        };
        let info = client.get_connection_info();
        LeanConn::connect(
            &Endpoint::of(info.addr())?,
            handle.tls(),
            info.redis_settings(),
            (CONNECT_TIMEOUT, COMMAND_TIMEOUT),
        )
        .await
    }

    /// XREADGROUP (as `cmd`) on a pooled connection, parsed as [`LeanConn::read_entries`].
    pub async fn read_entries<T>(
        &self,
        cmd: &Cmd,
        cut_over: (usize, usize),
        make: impl FnMut(&[u8], String, Fields, Cut) -> T,
    ) -> Result<Vec<T>, RedisError> {
        self.with(async move |conn: &mut LeanConn| conn.read_entries(cmd, cut_over, make).await)
            .await
    }

    /// The client of the node commands go to now (`None` once the handle is gone).
    fn node_client(&self) -> Option<redis::Client> {
        self.handle.upgrade()?.node_client()
    }

    /// The database the pool's connections use.
    pub fn db(&self) -> i64 {
        self.node_client()
            .map_or(0, |c| c.get_connection_info().redis_settings().db())
    }
}

impl LeanPool {
    /// A command on a pooled connection (see [`ConnectionLike::req_packed_command`]).
    pub fn command<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.with(async move |conn: &mut LeanConn| conn.req_packed_command(cmd).await)
                .await
        })
    }

    /// A pipeline on a pooled connection (see [`ConnectionLike::req_packed_commands`]).
    pub fn commands<'a>(
        &'a self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.with(async move |conn: &mut LeanConn| {
                conn.req_packed_commands(pipeline, offset, count).await
            })
            .await
        })
    }
}
