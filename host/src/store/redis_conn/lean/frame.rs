//! RESP2 framing for the lean reader: where the first whole reply in the read buffer ends
//! ([`frame_len`]), resumed where the last read stopped so a big reply is walked once; and on
//! the way, which bulk strings are an entry's fields, so that one over the read's cut, or past
//! its budget, is dropped from the buffer as it arrives and never held.

use redis::{ErrorKind, RedisError};

/// A reply Redis could not have sent, as a parse error.
pub(super) fn protocol_error(what: &str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "unexpected reply from Redis",
        what.to_owned(),
    ))
}

/// Where the line starting at `at` ends (the index of its `\r`), if it is whole.
pub(super) fn line_end(buf: &[u8], at: usize) -> Option<usize> {
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

/// A header's number.
pub(super) fn int(line: &[u8]) -> Result<i64, RedisError> {
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
pub(super) struct Framing {
    /// The end of what is framed and kept.
    at: usize,
    /// Where framing reads on: the bytes between `at` and here were dropped (see
    /// [`frame_len`]).
    read: usize,
    left: u64,
    /// How far the line at `at` was searched for its end, so that a long line arriving in
    /// many reads is searched once.
    pub(super) searched: usize,
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
    /// The start of a reply that is kept whole.
    pub(super) const START: Self = Self {
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
    pub(super) fn cutting((cut_over, budget): (usize, usize)) -> Self {
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
pub(super) const MAX_LINE: usize = 1 << 20;

/// The length of the first whole RESP2 reply in `buf`, or `None` while it is incomplete
/// (then `state` says where to go on once more bytes came). A reply Redis could not have sent
/// (an empty or unknown header, a length past any buffer) is a protocol error, never a panic.
/// A bulk string over `state.cut_over` bytes leaves only its header, marked `~`: its bytes
/// are dropped from `buf` as they come, so a reply never holds it.
pub(super) fn frame_len(
    buf: &mut Vec<u8>,
    state: &mut Framing,
) -> Result<Option<usize>, RedisError> {
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
