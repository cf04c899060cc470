//! [`Reader`]: one subscription's read connection, of its own (for blocking reads) or the
//! node's pool (for reads that never block); either way every read is framed by the lean
//! reader, so none buffers a value over the subscription's `max_entry_bytes`.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{RedisError, RedisFuture};

use super::lean::{self, LeanConn};
use super::pool::LeanPool;

/// A connection for one subscription's reads: every read is framed by the lean reader (see
/// [`super::lean`]), so none buffers a value over the subscription's `max_entry_bytes`.
pub enum Reader {
    /// A connection of its own, to the one node (or the current master behind Sentinel, or
    /// the cluster master that serves its stream), for blocking reads.
    Lean(Box<LeanConn>),
    /// The node's pool of lean read connections, for reads that never block (see
    /// [`super::pool`]).
    Pooled(Arc<LeanPool>),
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
