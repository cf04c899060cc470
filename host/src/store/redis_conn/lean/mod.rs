//! A subscription's read connection over plain TCP that parses XREADGROUP replies where they
//! are read, straight into entries, instead of through redis-rs's connection task and its
//! `Value` tree.
//!
//! Reading is the hottest path of the host: every entry passes through one reply. redis-rs
//! parses each reply into a tree of `Value`s on a driver task and hands the tree to the reader,
//! which then copies it into entries; here the read loop itself reads the socket, waits until a
//! whole reply is buffered, and makes each entry's id and fields from the buffer in one pass
//! (`sluice-bench ceiling-lean` measures the difference). Every other command the read loop
//! sends (XPENDING, XAUTOCLAIM, XCLAIM, XINFO) goes the ordinary way: the reply is framed here
//! and parsed by redis-rs's own parser, so errors keep their kinds and codes.
//!
//! Every read goes this way, over whichever transport the node is reached by (plain TCP, TLS
//! or a Unix socket, see [`super::transport`]), on one node, behind Sentinel or on a cluster
//! node (see [`super::RedisHandle::reader`]): so no read path buffers a value over a
//! subscription's `max_entry_bytes`. The connection speaks RESP2 whatever protocol the URL
//! asks for (it is a read connection of the host's own: nothing here needs RESP3's pushes).
//! The login is what redis-rs would send: AUTH with the URL's or the configured user and
//! password, SELECT for a database other than 0.
//!
//! A request that is cut off (its future dropped, a timeout, an I/O error) leaves a reply
//! half-read on the socket, so the connection refuses every later request; the read loop then
//! drops it and connects again, as it does for any failed read.
//!
//! - [`frame`]: where a whole reply ends, cutting what is too big as it arrives.
//! - [`parse`]: a framed reply into entries (XREADGROUP) or a redis-rs `Value` (the rest).
//! - This file: the connection itself (log-in, one request and its replies, the timeouts), and
//!   the [`ConnectionLike`] that lets redis-rs's commands run on it.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisConnectionInfo, RedisError, RedisFuture, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::transport::{self, Endpoint, Io, Tls};
use frame::{Framing, frame_len, protocol_error};
use parse::{parse_read, parse_value};

mod frame;
mod parse;

pub use frame::{DEFER_OVER, FIELD_OVERHEAD};
pub use parse::{Cut, Fields};

/// How much more the read buffer asks the socket for at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Once an answer has begun, how long it may pause before the request counts as failed.
const KEEPS_COMING: Duration = Duration::from_secs(5);
/// How long an answer may take beyond the request's timeout, however steadily it comes: a
/// 512 MB entry at 2 MB/s (a reply that trickles for ever is a failed request).
const LONGEST_TRANSFER: Duration = Duration::from_secs(300);

/// The error of an answer that stopped coming, `got` bytes in.
fn stalled(got: usize) -> RedisError {
    let what = if got == 0 {
        "Redis did not answer in time".to_owned()
    } else {
        format!(
            "Redis's answer stopped coming for {} s, {got} bytes in",
            KEEPS_COMING.as_secs()
        )
    };
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

/// A connection to one Redis node, for one subscription's reads.
pub struct LeanConn {
    io: Io,
    /// Bytes read and not yet consumed: the start of the next reply.
    buf: Vec<u8>,
    out: Vec<u8>,
    /// The longest a request may take (the read's block time plus the command timeout).
    timeout: Duration,
    db: i64,
    /// A request was cut off: the socket may hold the rest of its reply.
    broken: bool,
    /// How far the reply at the start of `buf` is framed.
    framing: Framing,
}

impl LeanConn {
    /// Connect to `endpoint` (over TLS as `tls` says) and log in as `settings` say;
    /// requests may take up to `timeout`.
    pub async fn connect(
        endpoint: &Endpoint,
        tls: &Tls,
        settings: &RedisConnectionInfo,
        (connect_timeout, timeout): (Duration, Duration),
    ) -> Result<Self, RedisError> {
        let io = transport::connect(endpoint, tls, connect_timeout).await?;
        let mut conn = Self {
            io,
            buf: Vec::with_capacity(READ_CHUNK),
            out: Vec::new(),
            timeout: connect_timeout,
            db: settings.db(),
            broken: false,
            framing: Framing::START,
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            conn.req_packed_command(&auth).await?;
        }
        if settings.db() != 0 {
            conn.req_packed_command(redis::cmd("SELECT").arg(settings.db()))
                .await?;
        }
        conn.timeout = timeout;
        Ok(conn)
    }

    /// XREADGROUP (as `cmd`), its reply parsed straight into entries, each made by `make`
    /// from its stream's name, its id, its fields and what of them was cut: with `cut` as
    /// (`over`, `budget`), a name or value over `over` bytes is never held, not even in the
    /// read buffer, nor one of more than [`DEFER_OVER`] once the reply holds `budget` bytes.
    pub async fn read_entries<T>(
        &mut self,
        cmd: &Cmd,
        cut_over: (usize, usize),
        mut make: impl FnMut(&[u8], String, Fields, Cut) -> T,
    ) -> Result<Vec<T>, RedisError> {
        cmd.write_packed_command(self.out_cleared());
        let mut entries = None;
        self.request(1, cut_over, |frame| {
            entries = Some(if frame.first() == Some(&b'-') {
                Err(parse_value(frame)
                    .err()
                    .unwrap_or_else(|| protocol_error("an error reply")))
            } else {
                parse_read(frame, &mut make)
            });
        })
        .await?;
        entries.unwrap_or_else(|| Err(protocol_error("no reply")))
    }

    fn out_cleared(&mut self) -> &mut Vec<u8> {
        self.out.clear();
        &mut self.out
    }

    /// Send what `out` holds and hand each of the next `replies` whole replies to `each`.
    async fn request(
        &mut self,
        replies: usize,
        cut_over: (usize, usize),
        mut each: impl FnMut(&[u8]),
    ) -> Result<(), RedisError> {
        if self.broken {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "an earlier request on this connection was cut off",
            )));
        }
        // Cleared only when the whole exchange completes.
        self.broken = true;
        // The first byte of the answer may take the whole timeout (a blocked read); after it,
        // a reply only has to keep coming: a big one over a slow link is read (and cut) to
        // its end instead of being cut off and read again for ever (found by the attack
        // review of issue 52: a 200 MB entry at 20 MB/s was never dead-lettered).
        let first_by = tokio::time::Instant::now() + self.timeout;
        let exchange = async {
            self.io.write_all(&self.out).await?;
            let mut got = 0usize;
            for _ in 0..replies {
                self.framing = Framing::cutting(cut_over);
                let len = loop {
                    if let Some(len) = frame_len(&mut self.buf, &mut self.framing)? {
                        self.framing = Framing::START;
                        break len;
                    }
                    self.buf.reserve(READ_CHUNK);
                    let wait = if got == 0 {
                        first_by.saturating_duration_since(tokio::time::Instant::now())
                    } else {
                        KEEPS_COMING
                    };
                    let read = tokio::time::timeout(wait, self.io.read_buf(&mut self.buf)).await;
                    match read {
                        Ok(Ok(0)) => {
                            return Err(RedisError::from(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "Redis closed the connection",
                            )));
                        }
                        Ok(Ok(n)) => got = got.saturating_add(n),
                        Ok(Err(err)) => return Err(err.into()),
                        Err(_) => return Err(stalled(got)),
                    }
                };
                each(&self.buf[..len]);
                self.buf.drain(..len);
                // A big reply leaves a big buffer: give the memory back once it is read.
                if self.buf.capacity() > 4 * READ_CHUNK && self.buf.len() <= READ_CHUNK {
                    self.buf.shrink_to(READ_CHUNK);
                }
            }
            Ok(())
        };
        match tokio::time::timeout(self.timeout + LONGEST_TRANSFER, exchange).await {
            Ok(Ok(())) => {
                self.broken = false;
                Ok(())
            }
            Ok(Err(err)) => Err(err),
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "Redis's answer took more than {} s in all",
                    (self.timeout + LONGEST_TRANSFER).as_secs()
                ),
            ))),
        }
    }
}

impl ConnectionLike for LeanConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            cmd.write_packed_command(self.out_cleared());
            let mut value = None;
            self.request(1, (usize::MAX, usize::MAX), |frame| {
                value = Some(parse_value(frame));
            })
            .await?;
            value.unwrap_or_else(|| Err(protocol_error("no reply")))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.out.clear();
            self.out.extend_from_slice(&pipeline.get_packed_pipeline());
            let mut values = Vec::with_capacity(count);
            let mut seen = 0;
            self.request(offset + count, (usize::MAX, usize::MAX), |frame| {
                if seen >= offset {
                    values.push(redis::parse_redis_value(frame));
                }
                seen += 1;
            })
            .await?;
            values.into_iter().collect()
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests;
