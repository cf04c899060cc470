//! Parsing a framed reply: XREADGROUP's straight into entries ([`parse_read`]), with what the
//! framing cut from each ([`Cut`]); any other reply by redis-rs's own parser
//! ([`parse_value`]), so errors keep their kinds and codes.

use redis::{RedisError, Value};

use super::frame::{int, line_end, protocol_error};

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
pub(super) fn parse_read<T>(
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
pub(super) fn parse_value(frame: &[u8]) -> Result<Value, RedisError> {
    redis::parse_redis_value(frame)?.extract_error()
}
