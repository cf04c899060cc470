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

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisConnectionInfo, RedisError, RedisFuture, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::transport::{self, Endpoint, Io, Tls};

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

fn protocol_error(what: &str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "unexpected reply from Redis",
        what.to_owned(),
    ))
}

/// Where the line starting at `at` ends (the index of its `\r`), if it is whole.
fn line_end(buf: &[u8], at: usize) -> Option<usize> {
    line_end_from(buf, at, at)
}

/// [`line_end`], searching from `from` (at or after `at`): the bytes before it were searched
/// already.
fn line_end_from(buf: &[u8], at: usize, from: usize) -> Option<usize> {
    let rest = buf.get(at..)?;
    let mut from = from.saturating_sub(at);
    while let Some(i) = rest[from..].iter().position(|&b| b == b'\r') {
        let cr = from + i;
        match rest.get(cr + 1) {
            Some(b'\n') => return Some(at + cr),
            Some(_) => from = cr + 1,
            None => return None,
        }
    }
    None
}

fn int(line: &[u8]) -> Result<i64, RedisError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| protocol_error("a length that is not a number"))
}

/// How far framing the reply at the start of the buffer has come: the values before `at` are
/// whole, `left` values (at least the one at `at`) are still to come. Kept between reads, so
/// a reply that arrives in many reads is walked once, not once per read.
///
/// A cutting frame (see [`Framing::cutting`]) also knows which bulk strings are an entry's
/// fields: in an XREADGROUP or XRANGE reply a bulk string follows its array's header with no
/// other array between them (a stream's name and an entry's id come first in their two-item
/// arrays, each followed by an array), so the bulk strings since the latest array header are
/// one "run", and a run's strings are fields when the run's array holds more than two items,
/// or for the second item of a two-item array (an entry of one field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Framing {
    /// The end of what is framed and kept.
    at: usize,
    /// Where framing reads on: the bytes between `at` and here were dropped (see
    /// [`frame_len`]).
    read: usize,
    left: u64,
    /// How far the line at `at` was searched for its end, so that a long line arriving in
    /// many reads is searched once.
    searched: usize,
    /// A bulk string that would take its run (an entry's fields) past this many bytes, each
    /// string counted with [`STRING_OVERHEAD`] more, is not kept: its header is marked `~` (no
    /// RESP2 reply starts so) and its bytes are dropped as they arrive.
    cut_over: usize,
    /// Field bytes kept in this reply: once one more field string would pass `budget`, it is
    /// not kept either, marked `^` (its entry is to be read again alone).
    kept: usize,
    budget: usize,
    /// Bytes of a cut bulk string (and its CRLF) still to drop.
    skip: usize,
    /// The items of the latest array header, the bulk strings seen since, and their bytes.
    run: (u64, u64, usize),
}

/// Bulk strings outside an entry's fields (stream names, ids) up to this size are always
/// kept; a field string is kept while its entry is under the cut and the reply under its
/// budget.
pub const DEFER_OVER: usize = 4096;

/// What a field costs beyond its bytes, as `max_entry_bytes` counts it: its two buffers and
/// their bookkeeping, in the host and again in the guest.
pub const FIELD_OVERHEAD: u64 = 64;

/// What a field string counts beyond its bytes, as `max_entry_bytes` counts a field (two
/// strings) with [`FIELD_OVERHEAD`] more: a million one-byte fields are cut as soon as a
/// million 64-byte ones would be.
const STRING_OVERHEAD: usize = FIELD_OVERHEAD as usize / 2;

impl Framing {
    const START: Self = Self {
        at: 0,
        read: 0,
        left: 1,
        searched: 0,
        cut_over: usize::MAX,
        kept: 0,
        budget: usize::MAX,
        skip: 0,
        run: (0, 0, 0),
    };

    /// The start of a reply whose entries are cut past `cut_over` bytes each, and which keeps
    /// at most `budget` bytes of fields (see [`Framing::kept`]).
    fn cutting((cut_over, budget): (usize, usize)) -> Self {
        Self {
            cut_over,
            budget,
            ..Self::START
        }
    }

    /// What to do with the next bulk string of `n` bytes: keep it (`None`), or drop it and mark
    /// its header `~` (over the cut) or `^` (past the budget). Asked again for the same string
    /// while its bytes are still arriving: it counts only once taken ([`Framing::took`]).
    fn mark(&self, n: usize) -> Option<u8> {
        let (items, seen, bytes) = self.run;
        let field = items > 2 || seen == 1;
        let cost = n.saturating_add(STRING_OVERHEAD);
        if n > self.cut_over || (field && bytes.saturating_add(cost) > self.cut_over) {
            Some(b'~')
        } else if field && self.kept.saturating_add(n) > self.budget {
            Some(b'^')
        } else {
            None
        }
    }

    /// The next bulk string (of `n` bytes) is taken whole (`kept`) or dropped.
    fn took(&mut self, n: usize, kept: bool) {
        let (items, seen, bytes) = &mut self.run;
        let field = *items > 2 || *seen == 1;
        *seen += 1;
        if kept {
            *bytes = bytes.saturating_add(n.saturating_add(STRING_OVERHEAD));
            if field {
                self.kept = self.kept.saturating_add(n);
            }
        }
    }
}

/// The longest header or simple-string line a reply may have: Redis's own are short (a
/// number, an error message); an endless one is a protocol error, not a growing buffer.
const MAX_LINE: usize = 1 << 20;

/// The length of the first whole RESP2 reply in `buf`, or `None` while it is incomplete
/// (then `state` says where to go on once more bytes came). A reply Redis could not have sent
/// (an empty or unknown header, a length past any buffer) is a protocol error, never a panic.
/// A bulk string over `state.cut_over` bytes leaves only its header, marked `~`: its bytes
/// are dropped from `buf` as they come, so a reply never holds it.
fn frame_len(buf: &mut Vec<u8>, state: &mut Framing) -> Result<Option<usize>, RedisError> {
    let framed = frame_more(buf, state);
    // What was dropped lies between `at` and `read`: it goes in one move, once the reply is
    // whole or once it is as big as what would move (so every byte moves a bounded number of
    // times, however many strings were dropped: one move per dropped string made an entry of
    // 400,000 one-byte fields cost 16 s, found by the second attack review of issue 52).
    let gap = state.read - state.at;
    if gap > 0 && (matches!(framed, Ok(Some(_))) || gap >= buf.len() - state.read) {
        buf.drain(state.at..state.read);
        state.read = state.at;
        state.searched = state.searched.saturating_sub(gap).max(state.read);
    }
    framed
}

/// [`frame_len`]'s walk: values are read at `read` and the ones kept are moved down to `at`.
fn frame_more(buf: &mut [u8], state: &mut Framing) -> Result<Option<usize>, RedisError> {
    loop {
        if state.skip > 0 {
            let drop = buf.len().saturating_sub(state.read).min(state.skip);
            state.read += drop;
            state.skip -= drop;
            state.searched = state.read;
            if state.skip > 0 {
                return Ok(None);
            }
        }
        if state.left == 0 {
            break;
        }
        let read = state.read;
        let Some(end) = line_end_from(buf, read, state.searched.max(read)) else {
            if buf.len().saturating_sub(read) > MAX_LINE {
                return Err(protocol_error("a line longer than 1 MiB"));
            }
            // The last byte may be a `\r` whose `\n` is still to come.
            state.searched = buf.len().saturating_sub(1).max(read);
            return Ok(None);
        };
        let (Some(&kind), Some(line)) = (buf.get(read), buf.get(read + 1..end)) else {
            return Err(protocol_error("an empty header line"));
        };
        // Up to where the value is kept; its bytes after that (a cut string's) are dropped.
        let mut keep_to = end + 2;
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                // Nil (-1) has no bytes.
                let n = usize::try_from(int(line)?).ok();
                let mark = n.and_then(|n| state.mark(n));
                if let (Some(n), Some(mark)) = (n, mark) {
                    buf[read] = mark;
                    state.skip = n
                        .checked_add(2)
                        .ok_or_else(|| protocol_error("a bulk length past any buffer"))?;
                    state.took(n, false);
                } else if let Some(n) = n {
                    let Some(after) = keep_to.checked_add(n).and_then(|a| a.checked_add(2)) else {
                        return Err(protocol_error("a bulk length past any buffer"));
                    };
                    if buf.len() < after {
                        return Ok(None);
                    }
                    state.took(n, true);
                    keep_to = after;
                }
            }
            b'*' => {
                let items = u64::try_from(int(line)?).unwrap_or(0);
                state.left = state
                    .left
                    .checked_add(items)
                    .ok_or_else(|| protocol_error("an array length past any buffer"))?;
                state.run = (items, 0, 0);
            }
            other => {
                return Err(protocol_error(&format!(
                    "a reply starting with {:?}",
                    other as char
                )));
            }
        }
        if state.at != read {
            buf.copy_within(read..keep_to, state.at);
        }
        state.at += keep_to - read;
        state.read = keep_to;
        state.left -= 1;
    }
    Ok(Some(state.at))
}

/// A cursor over one whole reply.
struct Frame<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Frame<'a> {
    /// `<kind><integer>\r\n`; a whole frame always has the line.
    fn header(&mut self, kind: u8) -> Result<i64, RedisError> {
        let end = line_end(self.buf, self.at).ok_or_else(|| protocol_error("a cut-off reply"))?;
        let (Some(&found), Some(line)) = (self.buf.get(self.at), self.buf.get(self.at + 1..end))
        else {
            return Err(protocol_error("an empty header line"));
        };
        if found != kind {
            return Err(protocol_error(&format!(
                "{:?} where {:?} was expected",
                found as char, kind as char
            )));
        }
        let n = int(line)?;
        self.at = end + 2;
        Ok(n)
    }

    /// A count from the reply, bounded by what the frame could hold (each element takes at
    /// least `min_bytes`): a count is only used to reserve room, and a broken one must not
    /// make the reservation fail.
    fn room_for(&self, count: usize, min_bytes: usize) -> usize {
        count.min(self.buf.len() / min_bytes)
    }

    /// An array's length; `None` for a nil array.
    fn array(&mut self) -> Result<Option<usize>, RedisError> {
        Ok(usize::try_from(self.header(b'*')?).ok())
    }

    /// A field's name or value: its bytes, or how many bytes it had when the framing cut it
    /// (over the limit, or past the reply's budget).
    fn bulk_or_cut(&mut self) -> Result<Bulk<'a>, RedisError> {
        for (mark, over) in [(b'~', true), (b'^', false)] {
            if self.buf.get(self.at) == Some(&mark) {
                let n = usize::try_from(self.header(mark)?)
                    .map_err(|_| protocol_error("a cut bulk string of no length"))?;
                return Ok(Bulk::Cut(n, over));
            }
        }
        self.bulk().map(Bulk::Bytes)
    }

    /// A bulk string's bytes (nil is an error: XREADGROUP has none where bytes are).
    fn bulk(&mut self) -> Result<&'a [u8], RedisError> {
        let n = usize::try_from(self.header(b'$')?)
            .map_err(|_| protocol_error("a nil where bytes were expected"))?;
        let bytes = self
            .at
            .checked_add(n)
            .and_then(|end| self.buf.get(self.at..end))
            .ok_or_else(|| protocol_error("a bulk string past the reply"))?;
        self.at += n + 2;
        Ok(bytes)
    }
}

/// An entry's fields as the reply holds them; `None` for an entry deleted while pending.
pub type Fields = Option<Vec<(Vec<u8>, Vec<u8>)>>;

/// A field's name or value in a reply.
enum Bulk<'a> {
    Bytes(&'a [u8]),
    /// Not kept: this many bytes, over the limit (`true`) or past the reply's budget.
    Cut(usize, bool),
}

/// What of an entry a read did not keep: its fields whose name or value was over the read's
/// cut or past its budget (left out of its fields), and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    /// Fields left out.
    pub fields: usize,
    /// Their names' and values' bytes.
    pub bytes: u64,
    /// Whether one of them was over the limit (else they were only past the budget: the
    /// entry is to be read again alone).
    pub over: bool,
}

/// XREADGROUP's reply: nil, or `[[stream, [[id, [field, value, ...] | nil], ...]], ...]`; each
/// entry made by `make` from its stream's name, its id and its fields.
fn parse_read<T>(
    frame: &[u8],
    mut make: impl FnMut(&[u8], String, Fields, Cut) -> T,
) -> Result<Vec<T>, RedisError> {
    let mut f = Frame { buf: frame, at: 0 };
    let mut out = Vec::new();
    for _ in 0..f.array()?.unwrap_or(0) {
        f.array()?;
        let stream = f.bulk()?;
        let n = f.array()?.unwrap_or(0);
        // An entry takes at least `*2\r\n$1\r\nx\r\n*-1\r\n`.
        out.reserve(f.room_for(n, 16));
        for _ in 0..n {
            f.array()?;
            let id = String::from_utf8(f.bulk()?.to_vec())
                .map_err(|_| protocol_error("an entry id that is not UTF-8"))?;
            let mut cut = Cut::default();
            let fields = match f.array()? {
                Some(flat) => {
                    let mut fields = Vec::with_capacity(f.room_for(flat / 2, 8));
                    for _ in 0..flat / 2 {
                        match (f.bulk_or_cut()?, f.bulk_or_cut()?) {
                            (Bulk::Bytes(name), Bulk::Bytes(value)) => {
                                fields.push((name.to_vec(), value.to_vec()));
                            }
                            (name, value) => {
                                let len = |b: &Bulk<'_>| match b {
                                    Bulk::Bytes(bytes) => bytes.len() as u64,
                                    Bulk::Cut(n, _) => *n as u64,
                                };
                                let over = |b: &Bulk<'_>| matches!(b, Bulk::Cut(_, true));
                                cut.fields += 1;
                                cut.bytes += len(&name) + len(&value);
                                cut.over |= over(&name) || over(&value);
                            }
                        }
                    }
                    Some(fields)
                }
                // Deleted while pending.
                None => None,
            };
            out.push(make(stream, id, fields, cut));
        }
    }
    Ok(out)
}

/// One reply as redis-rs's `Value`; an error reply as the error it is.
fn parse_value(frame: &[u8]) -> Result<Value, RedisError> {
    redis::parse_redis_value(frame)?.extract_error()
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
mod tests {
    use super::*;

    const REPLY: &[u8] = b"*2\r\n*2\r\n$1\r\ns\r\n*2\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\na\r\n$2\r\nxy\r\n*2\r\n$3\r\n2-0\r\n*-1\r\n*2\r\n$4\r\nlane\r\n*1\r\n*2\r\n$3\r\n3-0\r\n*0\r\n";

    /// Frame `buf` from the start, in one go.
    fn framed(buf: &[u8]) -> Result<Option<usize>, RedisError> {
        let mut state = Framing::START;
        frame_len(&mut buf.to_vec(), &mut state)
    }

    #[test]
    fn a_reply_is_framed_only_when_it_is_whole() {
        for cut in 0..REPLY.len() {
            assert_eq!(framed(&REPLY[..cut]).unwrap(), None, "cut at {cut}");
        }
        let mut two = REPLY.to_vec();
        two.extend_from_slice(b"+OK\r\n");
        assert_eq!(framed(&two).unwrap(), Some(REPLY.len()));
        assert_eq!(framed(b"$-1\r\n").unwrap(), Some(5));
        assert_eq!(framed(b"-NOGROUP no\r\n").unwrap(), Some(13));
        // A bulk string may hold "\r" and "\r\n" itself.
        assert_eq!(framed(b"$4\r\n\r\n\r\n\r\n").unwrap(), Some(10));
        assert!(framed(b"?what\r\n").is_err());
    }

    #[test]
    fn framing_goes_on_where_it_stopped() {
        // Byte by byte, as the slowest socket would deliver it: the same length at the end.
        let mut state = Framing::START;
        for cut in 0..REPLY.len() {
            assert_eq!(
                frame_len(&mut REPLY[..cut].to_vec(), &mut state).unwrap(),
                None
            );
        }
        assert_eq!(
            frame_len(&mut REPLY.to_vec(), &mut state).unwrap(),
            Some(REPLY.len())
        );
        // A long line in many reads, its "\r" and "\n" in different ones.
        let mut line = b"+".to_vec();
        line.extend(std::iter::repeat_n(b'x', 100_000));
        line.extend_from_slice(b"\r\n");
        let mut state = Framing::START;
        for cut in (1..line.len()).step_by(4096).chain([line.len() - 1]) {
            assert_eq!(
                frame_len(&mut line[..cut].to_vec(), &mut state).unwrap(),
                None
            );
        }
        assert!(state.searched > 90_000, "{state:?}");
        assert_eq!(
            frame_len(&mut line.clone(), &mut state).unwrap(),
            Some(line.len())
        );
    }

    /// An endless line (a hostile server's) is an error once past 1 MiB, not a buffer that
    /// grows and is searched again with every read.
    #[test]
    fn an_endless_line_is_an_error() {
        let mut line = b"+".to_vec();
        line.extend(std::iter::repeat_n(b'x', MAX_LINE + 1));
        let err = framed(&line).unwrap_err();
        assert!(err.to_string().contains("longer than 1 MiB"), "{err}");
    }

    #[test]
    fn replies_no_redis_sends_are_errors_not_panics() {
        for bad in [
            &b"\r\n"[..],
            b"*1\r\n\r\n",
            b"*9223372036854775807\r\n*9223372036854775807\r\n*9223372036854775807\r\n",
            b"$9223372036854775807\r\n",
            b"$18446744073709551615\r\n",
        ] {
            let _ = framed(bad);
            let _ = parse_read(bad, |_, id, _, _| id);
        }
        assert!(framed(b"\r\n").is_err());
        assert!(framed(b"*1\r\n\r\n").is_err());
        // Counts far beyond the reply: refused when the reply runs out, nothing reserved.
        let huge = b"*1\r\n*2\r\n$1\r\ns\r\n*4611686018427387903\r\n*2\r\n$3\r\n1-0\r\n*4611686018427387903\r\n";
        assert!(parse_read(huge, |_, id, _, _| id).is_err());
    }

    proptest::proptest! {
        #[test]
        fn random_and_mutated_replies_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            flips in proptest::collection::vec((0..REPLY.len(), proptest::prelude::any::<u8>()), 0..6),
            cut in 0..=REPLY.len(),
        ) {
            let _ = framed(&bytes);
            let _ = parse_read(&bytes, |_, id, _, _| id);
            let mut mutated = REPLY.to_vec();
            for (at, byte) in flips {
                mutated[at] = byte;
            }
            mutated.truncate(cut.max(1));
            if let Ok(Some(len)) = framed(&mutated) {
                let _ = parse_read(&mutated[..len], |_, id, _, _| id);
            }
            let _ = parse_read(&mutated, |_, id, _, _| id);
            // Resumed framing agrees with framing in one go.
            let mut state = Framing::START;
            let half = mutated.len() / 2;
            let first = frame_len(&mut mutated[..half].to_vec(), &mut state);
            if matches!(first, Ok(None)) {
                let resumed = frame_len(&mut mutated.clone(), &mut state).ok();
                proptest::prop_assert_eq!(resumed, framed(&mutated).ok());
            }
        }
    }

    #[test]
    fn entries_are_parsed_with_their_stream_and_deleted_ones_have_no_fields() {
        let entries =
            parse_read(REPLY, |stream, id, fields, _| (stream.to_vec(), id, fields)).unwrap();
        assert_eq!(
            entries,
            vec![
                (
                    b"s".to_vec(),
                    "1-0".to_owned(),
                    Some(vec![(b"a".to_vec(), b"xy".to_vec())])
                ),
                (b"s".to_vec(), "2-0".to_owned(), None),
                (b"lane".to_vec(), "3-0".to_owned(), Some(vec![])),
            ]
        );
        assert!(parse_read(b"*-1\r\n", |_, id, _, _| id).unwrap().is_empty());
    }

    /// A value over the cut is never held: its bytes are dropped as they come, byte by byte
    /// too, and the entry says what was left out; the rest of the reply reads as it was.
    #[test]
    fn a_value_over_the_cut_is_dropped_as_it_arrives() {
        let big = "x".repeat(100);
        let reply = format!(
            "*1\r\n*2\r\n$1\r\ns\r\n*2\r\n*2\r\n$3\r\n1-0\r\n*4\r\n$1\r\na\r\n$2\r\nxy\r\n$4\r\nblob\r\n$100\r\n{big}\r\n*2\r\n$3\r\n2-0\r\n*2\r\n$1\r\nb\r\n$1\r\nz\r\n"
        );
        let reply = reply.as_bytes();
        let expect =
            |frame: &[u8]| parse_read(frame, |_, id, fields, cut| (id, fields, cut)).unwrap();
        // In one go, and byte by byte.
        for step in [reply.len(), 1] {
            // The first entry passes 150 bytes (each string counted 32 more) with its blob.
            let mut state = Framing::cutting((150, usize::MAX));
            let mut buf = Vec::new();
            let mut largest = 0;
            let mut len = None;
            for chunk in reply.chunks(step) {
                buf.extend_from_slice(chunk);
                largest = largest.max(buf.len());
                len = frame_len(&mut buf, &mut state).unwrap();
                if len.is_some() {
                    break;
                }
            }
            let len = len.expect("framed");
            assert!(
                largest < reply.len() - 50 || step == reply.len(),
                "{largest}"
            );
            let entries = expect(&buf[..len]);
            assert_eq!(entries.len(), 2);
            assert_eq!(
                entries[0],
                (
                    "1-0".to_owned(),
                    Some(vec![(b"a".to_vec(), b"xy".to_vec())]),
                    Cut {
                        fields: 1,
                        bytes: 104,
                        over: true
                    }
                )
            );
            assert_eq!(entries[1].2, Cut::default());
            assert_eq!(entries[1].1, Some(vec![(b"b".to_vec(), b"z".to_vec())]));
        }
    }

    /// Past a reply's budget, bigger values are left for later (marked `^`, their entry says
    /// so), small ones and ids stay, and the framing goes on to the end of the reply.
    #[test]
    fn past_the_budget_bigger_values_are_left_for_later() {
        let big = "x".repeat(5000);
        let entry = |id: &str| {
            format!(
                "*2\r\n$3\r\n{id}\r\n*4\r\n$1\r\na\r\n$1\r\nb\r\n$4\r\nblob\r\n$5000\r\n{big}\r\n"
            )
        };
        let reply = format!(
            "*1\r\n*2\r\n$1\r\ns\r\n*2\r\n{}{}",
            entry("1-0"),
            entry("2-0")
        );
        let mut buf = reply.into_bytes();
        let mut state = Framing::cutting((usize::MAX, 6000));
        let len = frame_len(&mut buf, &mut state).unwrap().expect("framed");
        let entries = parse_read(&buf[..len], |_, id, fields, cut| (id, fields, cut)).unwrap();
        assert_eq!(entries[0].2, Cut::default());
        assert_eq!(entries[0].1.as_ref().unwrap().len(), 2);
        assert_eq!(
            entries[1].2,
            Cut {
                fields: 1,
                bytes: 5004,
                over: false
            }
        );
        assert_eq!(
            entries[1].1,
            Some(vec![(b"a".to_vec(), b"b".to_vec())]),
            "the small field kept"
        );
    }

    /// A reply of `entries` entries (ids `1-0`, `2-0`, ...) of `fields` fields each, every value
    /// `value_len` bytes, from a stream whose name is `stream`.
    fn reply_of(stream: &str, entries: usize, fields: usize, value_len: usize) -> Vec<u8> {
        let value = "v".repeat(value_len);
        let mut reply = format!(
            "*1\r\n*2\r\n${}\r\n{stream}\r\n*{entries}\r\n",
            stream.len()
        );
        for e in 1..=entries {
            let id = format!("{e}-0");
            reply += &format!("*2\r\n${}\r\n{id}\r\n*{}\r\n", id.len(), fields * 2);
            for f in 0..fields {
                let name = format!("f{f}");
                reply += &format!("${}\r\n{name}\r\n${value_len}\r\n{value}\r\n", name.len());
            }
        }
        reply.into_bytes()
    }

    /// An entry over the cut only as a whole (many small fields, none over it): the fields past
    /// the cut are dropped as they arrive and the entry is marked over (found by the attack
    /// review of issue 52: 50,000 fields of 4 KiB, 208 MB, were read whole on every path).
    #[test]
    fn an_entry_of_many_small_fields_is_cut_once_it_passes_the_cut() {
        let mut buf = reply_of("s", 2, 100, 100);
        let whole = buf.len();
        let mut state = Framing::cutting((2000, usize::MAX));
        let len = frame_len(&mut buf, &mut state).unwrap().expect("framed");
        assert!(
            len < whole / 4,
            "the cut fields' bytes are gone: {len} of {whole}"
        );
        let entries = parse_read(&buf[..len], |stream, id, fields, cut| {
            (stream.to_vec(), id, fields.map_or(0, |f| f.len()), cut)
        })
        .unwrap();
        assert_eq!(entries.len(), 2);
        for (stream, _, kept, cut) in &entries {
            assert_eq!(stream, b"s");
            // (2 + 32) + (100 + 32) bytes a field (3 + 32 for a name from `f10`): 12 fit
            // under 2,000.
            assert_eq!(*kept, 12);
            assert!(cut.over, "{cut:?}");
            assert_eq!(cut.fields, 88);
        }
        assert_eq!((&*entries[0].1, &*entries[1].1), ("1-0", "2-0"));
    }

    /// Past the reply's budget, small field values are left for a later read too (the budget
    /// once counted only values over 4 KiB, so 64 entries of 2,000 × 4 KiB fields each, every
    /// one under the limit, were held at once); stream names and ids stay.
    #[test]
    fn past_the_budget_small_values_are_left_for_later_too() {
        let mut buf = reply_of("a-stream-name", 3, 10, 100);
        let mut state = Framing::cutting((usize::MAX, 1500));
        let len = frame_len(&mut buf, &mut state).unwrap().expect("framed");
        let entries = parse_read(&buf[..len], |stream, id, fields, cut| {
            (stream.to_vec(), id, fields.map_or(0, |f| f.len()), cut)
        })
        .unwrap();
        let ids: Vec<&str> = entries.iter().map(|e| &*e.1).collect();
        assert_eq!(ids, ["1-0", "2-0", "3-0"]);
        assert!(entries.iter().all(|e| e.0 == b"a-stream-name"));
        // 1,020 bytes per entry: the first whole, the second in part, the third's names only.
        assert_eq!((entries[0].2, entries[0].3), (10, Cut::default()));
        let (second, third) = (entries[1].3, entries[2].3);
        assert!(second.fields > 0 && !second.over, "{second:?}");
        assert_eq!((third.fields, third.over), (10, false), "{third:?}");
    }

    /// Hundreds of thousands of tiny fields past the cut are dropped together, not each with a
    /// move of the rest of the buffer (which made 400,000 of them cost 16 s on a runtime
    /// worker), in one read and arriving in pieces alike.
    #[test]
    fn very_many_tiny_cut_fields_leave_a_small_frame() {
        let reply = reply_of("s", 1, 300_000, 1);
        for step in [reply.len(), 4096] {
            let mut state = Framing::cutting((2000, usize::MAX));
            let mut buf = Vec::new();
            let mut len = None;
            for chunk in reply.chunks(step) {
                buf.extend_from_slice(chunk);
                len = frame_len(&mut buf, &mut state).unwrap();
                if len.is_some() {
                    break;
                }
            }
            let len = len.expect("framed");
            // A dropped string leaves its header (`~1`): its byte and CRLF are gone.
            assert!(len < reply.len() * 3 / 4, "{len} of {}", reply.len());
            let entries = parse_read(&buf[..len], |_, _, fields, cut| {
                (fields.map_or(0, |f| f.len()), cut)
            })
            .unwrap();
            let (kept, cut) = entries[0];
            assert!(cut.over);
            assert_eq!(kept + cut.fields, 300_000);
        }
    }

    /// The doorbell's read keeps no field at all (a budget of 0): it only learns which streams
    /// answered.
    #[test]
    fn a_budget_of_nothing_keeps_names_and_ids_only() {
        let mut buf = reply_of("s", 2, 3, 10);
        let mut state = Framing::cutting((DEFER_OVER, 0));
        let len = frame_len(&mut buf, &mut state).unwrap().expect("framed");
        let entries = parse_read(&buf[..len], |stream, id, fields, cut| {
            (
                stream.to_vec(),
                id,
                fields.map_or(0, |f| f.len()),
                cut.fields,
            )
        })
        .unwrap();
        assert_eq!(
            entries,
            [
                (b"s".to_vec(), "1-0".to_owned(), 0, 3),
                (b"s".to_vec(), "2-0".to_owned(), 0, 3)
            ]
        );
    }

    #[test]
    fn error_replies_keep_their_code() {
        let err = parse_value(b"-NOGROUP No such key 's' or consumer group 'g'\r\n").unwrap_err();
        assert_eq!(err.code(), Some("NOGROUP"));
    }
}
