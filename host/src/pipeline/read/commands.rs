//! The Redis commands a subscription reads with, and the parsing of their replies into
//! [`Entry`]s (fields kept in stream order, as bytes).
//!
//! Longer than the house's ~600 lines on purpose: every Redis command the read loop sends and
//! the parsing of its reply, kept together so a reply's shape is checked where it is asked for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};

use super::ReadPlan;
use crate::entry::delivery::{Entry, Source};
use crate::store::redis_conn::Reader;

/// An entry id from a read; `None` fields mean the entry was deleted from the stream while it
/// was pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadEntry {
    pub id: String,
    /// Which of the subscription's streams it was read from.
    pub source: Source,
    /// Its fields, unless it was deleted.
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    /// What of its fields the read did not keep (over `max_entry_bytes`): such an entry is
    /// dead-lettered from Redis, never handled.
    pub cut: crate::store::redis_conn::lean::Cut,
    /// Set when an ordered subscription's read already settled its place in its key's order
    /// (`pipeline::order`): nothing more to look up before it runs.
    pub placed: bool,
}

impl ReadEntry {
    /// The entry, if it still exists.
    pub fn into_entry(self) -> Option<Entry> {
        let id = self.id;
        self.fields.map(|fields| Entry { id, fields })
    }
}

/// XGROUP CREATE with MKSTREAM; an existing group is fine. A new group starts at the beginning
/// of the stream (id 0), so entries that producers added before the first consumer started are
/// handled, not skipped.
pub async fn create_group<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
) -> RedisResult<()> {
    create_group_at(conn, stream, group, "0").await
}

/// XGROUP CREATE with MKSTREAM, the group's last delivered id being `from`; an existing group
/// is fine (another host made it first).
pub async fn create_group_at<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    from: &str,
) -> RedisResult<()> {
    let created: RedisResult<Value> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(from)
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
        Err(err) => Err(err),
    }
}

/// What one read's reply should hold at most, in bytes: the next read asks for fewer
/// entries when the latest ones were big (four 100 MB entries in one reply once took the
/// host to 873 MB).
pub const MAX_READ_BYTES: usize = 64 << 20;

/// An entry as XRANGE returns it: its id and its fields.
pub(super) type RawEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// What a lean read cuts, for a subscription whose `max_entry_bytes` is `limit`: a name or
/// value over it (never one of [`crate::store::redis_conn::lean::DEFER_OVER`] bytes or less: ids
/// and names stay), and, past [`MAX_READ_BYTES`] kept (or one whole value, if more), every
/// bigger one, whose entry is read again alone.
pub(super) fn cutting(limit: usize) -> (usize, usize) {
    let over = limit.max(crate::store::redis_conn::lean::DEFER_OVER);
    (over, MAX_READ_BYTES.max(over))
}

/// `count`, or fewer when the latest read's largest entry says that many would pass
/// [`MAX_READ_BYTES`]; at least one.
pub(super) fn budgeted(who: &ReadPlan, count: usize) -> usize {
    let largest = who.largest_entry.load(std::sync::atomic::Ordering::Relaxed);
    match MAX_READ_BYTES.checked_div(largest) {
        Some(fits) => count.min(fits.max(1)),
        None => count,
    }
}

/// Remember the largest entry of a read, for the next reads' budget: an empty read says
/// nothing (it keeps what was known), and a read of smaller entries only halves it, so one
/// idle read or one small entry does not open the next read to `count` big ones.
pub(super) fn note_sizes(who: &ReadPlan, entries: &[ReadEntry]) {
    if entries.is_empty() {
        return;
    }
    let largest = entries
        .iter()
        .map(|e| {
            e.fields.as_ref().map_or(0, |fields| {
                fields.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>()
            })
        })
        .max()
        .unwrap_or(0);
    let known = who.largest_entry.load(std::sync::atomic::Ordering::Relaxed);
    who.largest_entry
        .store(largest.max(known / 2), std::sync::atomic::Ordering::Relaxed);
}

/// XREADGROUP from each source at its id (`>` for new entries, an id to read this consumer's
/// pending ones), in one command; up to `count` entries from each (fewer when entries are
/// big, see [`MAX_READ_BYTES`]), in the order of `from`.
pub async fn read_group(
    conn: &mut Reader,
    who: &ReadPlan,
    count: usize,
    block: Option<Duration>,
    from: &[(Source, &str)],
) -> RedisResult<Vec<ReadEntry>> {
    let cmd = read_group_cmd(who, budgeted(who, count), block, from);
    let lane = who.lane.as_deref();
    let make = |stream: &[u8], id, fields, cut| ReadEntry {
        id,
        source: source_named(stream, lane),
        fields,
        cut,
        placed: false,
    };
    // Parsed where it is read, straight into entries.
    let entries = conn
        .read_entries(&cmd, cutting(who.max_entry_bytes), make)
        .await?;
    note_sizes(who, &entries);
    Ok(entries)
}

fn read_group_cmd(
    who: &ReadPlan,
    count: usize,
    block: Option<Duration>,
    from: &[(Source, &str)],
) -> redis::Cmd {
    let from = from.iter().map(|(source, id)| (who.key(*source), *id));
    xreadgroup_cmd(&who.group, &who.consumer, count, block, from)
}

/// XREADGROUP for `consumer` of `group`, up to `count` entries from each `(key, id)`.
fn xreadgroup_cmd<'a>(
    group: &str,
    consumer: &str,
    count: usize,
    block: Option<Duration>,
    from: impl Iterator<Item = (&'a str, &'a str)> + Clone,
) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count.max(1));
    if let Some(block) = block {
        cmd.arg("BLOCK")
            .arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX).max(1));
    }
    cmd.arg("STREAMS");
    for (key, _) in from.clone() {
        cmd.arg(key);
    }
    for (_, id) in from {
        cmd.arg(id);
    }
    cmd
}

/// XREADGROUP `>` over `keys` at once, blocking up to `block`: the one read that serves the
/// waiting partitions of a subscription (see `shared_read.rs`). Each entry comes with the index
/// in `keys` of the key it was read from and its source there; a reply naming a key that was
/// not asked for is an error.
pub async fn read_new_from(
    conn: &mut Reader,
    group: &str,
    consumer: &str,
    count: usize,
    (block, cut_over): (Duration, usize),
    keys: &[(Arc<str>, Source)],
) -> RedisResult<Vec<(usize, ReadEntry)>> {
    let from = keys.iter().map(|(key, _)| (&**key, ">"));
    let cmd = xreadgroup_cmd(group, consumer, count, Some(block), from);
    let index: HashMap<&[u8], (usize, Source)> = keys
        .iter()
        .enumerate()
        .map(|(i, (key, source))| (key.as_bytes(), (i, *source)))
        .collect();
    let mut stray = false;
    let entries = conn
        .read_entries(&cmd, cutting(cut_over), |stream, id, fields, cut| {
            let (i, source) = index.get(stream).copied().unwrap_or_else(|| {
                stray = true;
                (0, Source::Stream)
            });
            (
                i,
                ReadEntry {
                    id,
                    source,
                    fields,
                    cut,
                    placed: false,
                },
            )
        })
        .await?;
    if stray {
        return Err(unexpected(
            "XREADGROUP stream name",
            &Value::SimpleString("a stream that was not asked for".to_owned()),
        ));
    }
    Ok(entries)
}

/// XAUTOCLAIM: take up to `count` entries idle for at least `min_idle` from any consumer.
/// Returns the next cursor, the claimed entries, and the ids that were deleted meanwhile.
pub async fn autoclaim(
    conn: &mut Reader,
    who: &ReadPlan,
    source: Source,
    min_idle: Duration,
    cursor: &str,
    count: usize,
) -> RedisResult<(String, Vec<ReadEntry>, Vec<String>)> {
    let (stream, group, consumer) = (who.key(source), &*who.group, &*who.consumer);
    let mut cmd = redis::cmd("XAUTOCLAIM");
    cmd.arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(min_idle.as_millis() as u64)
        .arg(cursor)
        .arg("COUNT")
        .arg(count)
        // Ids only: the entries are read one by one through the lean reader, which never
        // holds a field over `max_entry_bytes` (another consumer's entries were never read
        // here, and could be of any size).
        .arg("JUSTID");
    let reply: Value = cmd.query_async(conn).await?;
    let Value::Array(parts) = reply else {
        return Err(unexpected("XAUTOCLAIM", &reply));
    };
    let mut parts = parts.into_iter();
    let next = match parts.next() {
        Some(v) => text(&v).ok_or_else(|| unexpected("XAUTOCLAIM cursor", &v))?,
        None => return Err(unexpected("XAUTOCLAIM", &Value::Nil)),
    };
    let entries = match parts.next() {
        Some(v) => read_each_alone(conn, who, source, &ids_of(v)?).await?,
        None => Vec::new(),
    };
    // Redis 7 removes entries deleted from the stream from the pending list here, and names
    // them: an ordered subscription gives back the turns they held.
    let deleted = match parts.next() {
        Some(v) => ids_of(v).unwrap_or_default(),
        None => Vec::new(),
    };
    Ok((next, entries, deleted))
}

/// The ids of a JUSTID reply.
fn ids_of(reply: Value) -> RedisResult<Vec<String>> {
    let Value::Array(items) = reply else {
        return Err(unexpected("claimed ids", &reply));
    };
    items
        .iter()
        .map(|v| text(v).ok_or_else(|| unexpected("claimed id", v)))
        .collect()
}

/// The id just before `id` (the history read after it starts at `id`); `None` for `0-0`.
fn id_before(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    match (ms, seq) {
        (_, seq) if seq > 0 => Some(format!("{ms}-{}", seq - 1)),
        (0, 0) => None,
        (ms, _) => Some(format!("{}-{}", ms - 1, u64::MAX)),
    }
}

/// The entries `ids` (just made this consumer's), each read alone from this consumer's
/// pending list on the lean reader: cut as any read is. Each read counts a delivery, as the
/// claim without JUSTID would have. One no longer pending to it is left out; one deleted comes
/// without fields.
async fn read_each_alone(
    conn: &mut Reader,
    who: &ReadPlan,
    source: Source,
    ids: &[String],
) -> RedisResult<Vec<ReadEntry>> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(before) = id_before(id) else {
            continue;
        };
        let found = read_group(conn, who, 1, None, &[(source, &before)]).await?;
        out.extend(found.into_iter().filter(|e| e.id == *id));
    }
    Ok(out)
}

/// XCLAIM one entry for `consumer` regardless of idle time: how a pending retry is taken back
/// when its delay is over. `None` when it is no longer pending or was deleted.
pub async fn claim_one<C: ConnectionLike>(
    conn: &mut C,
    who: &ReadPlan,
    source: Source,
    id: &str,
) -> RedisResult<Option<Entry>> {
    let (stream, group, consumer) = (who.key(source), &*who.group, &*who.consumer);
    let reply: Value = redis::cmd("XCLAIM")
        .arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(0)
        .arg(id)
        .query_async(conn)
        .await?;
    Ok(parse_entries(reply, source)?
        .into_iter()
        .next()
        .and_then(ReadEntry::into_entry))
}

/// Take over, for `consumer`, up to `count` pending entries of other consumers that have been
/// idle for `gone_after` (each entry only if it has been idle that long too). The ids it
/// claims are added to `asked` before each XCLAIM is sent, so that a caller whose claim failed
/// knows which entries may have become its own anyway. `clear` is left true only when the
/// look found no other consumer at all once done (each was gone and held nothing, and was
/// deleted): until its keys are written again, nothing can become pending to another consumer.
pub async fn take_over_gone(
    conn: &mut Reader,
    who: &ReadPlan,
    source: Source,
    gone_after: Duration,
    count: usize,
    asked: &mut Vec<String>,
    (clear, vanished): (&mut bool, &mut Vec<String>),
) -> RedisResult<Vec<ReadEntry>> {
    let (stream, group, consumer) = (who.key(source), &*who.group, &*who.consumer);
    let gone_ms = gone_after.as_millis() as u64;
    let mut taken = Vec::new();
    for gone in crate::store::inspect::consumers(conn, stream, group).await? {
        if gone.name == consumer {
            continue;
        }
        if (gone.idle as u64) < gone_ms {
            *clear = false;
            continue;
        }
        if gone.pending == 0 {
            if !forget_gone(conn, stream, group, &gone.name, gone_ms).await? {
                *clear = false;
            }
            continue;
        }
        *clear = false;
        let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .arg("IDLE")
            .arg(gone_ms)
            .arg("-")
            .arg("+")
            .arg(count - taken.len())
            .arg(&gone.name)
            .query_async(conn)
            .await?;
        if rows.is_empty() {
            continue;
        }
        let mut claim = redis::cmd("XCLAIM");
        claim.arg(stream).arg(group).arg(consumer).arg(gone_ms);
        for (id, ..) in &rows {
            claim.arg(id);
        }
        // Ids only, then each entry read alone and cut (see `autoclaim`).
        claim.arg("JUSTID");
        // Known before the XCLAIM goes out: if its reply is lost, these may be pending to
        // this consumer without anyone here handling them.
        asked.extend(rows.iter().map(|(id, ..)| id.clone()));
        let reply: Value = claim.query_async(conn).await?;
        tracing::warn!(
            stream,
            gone = %gone.name,
            idle_ms = gone.idle,
            pending = gone.pending,
            "consumer is gone; taking over its pending entries"
        );
        let claimed = ids_of(reply)?;
        // XCLAIM drops an entry deleted from the stream from the pending list without a word:
        // one asked for, not claimed, and gone from the stream was deleted.
        for (id, ..) in &rows {
            if !claimed.contains(id) {
                let found: Vec<Value> = redis::cmd("XRANGE")
                    .arg(stream)
                    .arg(id)
                    .arg(id)
                    .query_async(conn)
                    .await?;
                if found.is_empty() {
                    vanished.push(id.clone());
                }
            }
        }
        taken.extend(read_each_alone(conn, who, source, &claimed).await?);
        if taken.len() >= count {
            break;
        }
    }
    Ok(taken)
}

/// Delete consumer `name` of `group` if it holds nothing and has been idle for `idle_ms`
/// (checked in the same script): consumers are named after pods and hosts, and every one that
/// ever read would otherwise stay in the group for good, each making every look at the
/// group's consumers longer. One that comes back is made again by its next read. True when it
/// was deleted.
async fn forget_gone<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    name: &str,
    idle_ms: u64,
) -> RedisResult<bool> {
    static FORGET: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(crate::store::lua!("pipeline/read/lua/forget_gone"))
    });
    let deleted: i64 = FORGET
        .key(stream)
        .arg(group)
        .arg(name)
        .arg(idle_ms)
        .invoke_async(conn)
        .await?;
    if deleted == 1 {
        tracing::info!(
            stream,
            group,
            consumer = %name,
            idle_ms,
            "deleted a gone consumer that held nothing"
        );
    }
    Ok(deleted == 1)
}

/// Those of `ids` (ids of `source`) that are pending to this consumer, each with its fields and
/// Redis's delivery counter: what a take-over whose reply was lost made this consumer's. Only
/// reads: the consumer's pending list over the ids' range (entries this host is handling are
/// in it too, and are left alone), then each such entry alone (`XREAD COUNT 1` from just
/// before it, which counts no delivery, through the lean reader, cut as any read is: another
/// consumer's entry may be of any size); one deleted meanwhile comes back without fields.
pub async fn own_pending_among(
    conn: &mut Reader,
    who: &ReadPlan,
    source: Source,
    ids: &[String],
) -> RedisResult<Vec<(ReadEntry, u64)>> {
    let Some((first, last)) = id_range(ids) else {
        return Ok(Vec::new());
    };
    let mut counts = pending_counts(conn, who, source, first, last).await?;
    let mut found = Vec::new();
    for id in ids {
        let Some(count) = counts.remove(id) else {
            continue;
        };
        let read = match id_before(id) {
            Some(before) => {
                let mut cmd = redis::cmd("XREAD");
                cmd.arg("COUNT")
                    .arg(1)
                    .arg("STREAMS")
                    .arg(who.key(source))
                    .arg(before);
                conn.read_entries(&cmd, cutting(who.max_entry_bytes), |_, id, fields, cut| {
                    ReadEntry {
                        id,
                        source,
                        fields,
                        cut,
                        placed: false,
                    }
                })
                .await?
            }
            None => Vec::new(),
        };
        let entry = read.into_iter().find(|e| e.id == *id).unwrap_or(ReadEntry {
            id: id.clone(),
            source,
            fields: None,
            cut: Default::default(),
            placed: false,
        });
        found.push((entry, count));
    }
    Ok(found)
}

/// Redis's delivery counters for `ids`, which are pending for `consumer`.
pub async fn delivery_counts<C: ConnectionLike>(
    conn: &mut C,
    who: &ReadPlan,
    source: Source,
    ids: &[&str],
) -> RedisResult<HashMap<String, u64>> {
    match id_range(ids) {
        Some((first, last)) => pending_counts(conn, who, source, first, last).await,
        None => Ok(HashMap::new()),
    }
}

/// The smallest and the greatest of `ids`, as stream ids compare.
fn id_range<S: AsRef<str>>(ids: &[S]) -> Option<(&str, &str)> {
    let ids = || ids.iter().map(AsRef::as_ref);
    let first = ids().min_by(|a, b| crate::entry::delivery::cmp_ids(a, b))?;
    let last = ids().max_by(|a, b| crate::entry::delivery::cmp_ids(a, b))?;
    Some((first, last))
}

/// Redis's delivery counter of each entry of `source` from `first` to `last` that is pending
/// for `consumer` (XPENDING, extended form, page by page: the range may hold many more of its
/// entries than the caller asks about).
async fn pending_counts<C: ConnectionLike>(
    conn: &mut C,
    who: &ReadPlan,
    source: Source,
    first: &str,
    last: &str,
) -> RedisResult<HashMap<String, u64>> {
    const PAGE: usize = 1000;
    let (stream, group, consumer) = (who.key(source), &*who.group, &*who.consumer);
    let mut counts = HashMap::new();
    let mut start = first.to_owned();
    loop {
        let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .arg(&start)
            .arg(last)
            .arg(PAGE)
            .arg(consumer)
            .query_async(conn)
            .await?;
        let full = rows.len() == PAGE;
        let Some(next) = rows.last().map(|(id, ..)| format!("({id}")) else {
            break;
        };
        counts.extend(rows.into_iter().map(|(id, _, _, count)| (id, count)));
        if !full {
            break;
        }
        start = next;
    }
    Ok(counts)
}

fn unexpected(what: &str, value: &Value) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what}: {value:?}"),
    ))
}

/// A field name or value: any bytes (Redis never sends anything else for a stream field).
fn bytes(value: Value) -> RedisResult<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(unexpected("field name or value", &other)),
    }
}

/// An entry id, taken without a copy.
fn into_text(value: Value) -> RedisResult<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes)
            .map_err(|e| unexpected("entry id", &Value::BulkString(e.into_bytes()))),
        Value::SimpleString(s) => Ok(s),
        other => Err(unexpected("entry id", &other)),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Which source the stream called `name` in a reply is: the lane if it is the lane's name.
fn source_named(name: &[u8], lane: Option<&str>) -> Source {
    match lane {
        Some(lane) if name == lane.as_bytes() => Source::Lane,
        _ => Source::Stream,
    }
}

/// A list of `[id, [field, value, ...] | nil]` read from `source`.
fn parse_entries(value: Value, source: Source) -> RedisResult<Vec<ReadEntry>> {
    let Value::Array(items) = value else {
        return if value == Value::Nil {
            Ok(Vec::new())
        } else {
            Err(unexpected("entries", &value))
        };
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(pair) = item else {
            // XAUTOCLAIM on Redis 6.2 reports deleted entries as bare nils.
            continue;
        };
        let mut pair = pair.into_iter();
        let id = match pair.next() {
            Some(v) => into_text(v)?,
            None => continue,
        };
        let fields = match pair.next() {
            Some(Value::Array(flat)) => {
                let mut fields = Vec::with_capacity(flat.len() / 2);
                let mut flat = flat.into_iter();
                while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                    fields.push((bytes(name)?, bytes(value)?));
                }
                Some(fields)
            }
            Some(Value::Map(map)) => {
                let mut fields = Vec::with_capacity(map.len());
                for (name, value) in map {
                    fields.push((bytes(name)?, bytes(value)?));
                }
                Some(fields)
            }
            _ => None,
        };
        out.push(ReadEntry {
            id,
            source,
            fields,
            cut: Default::default(),
            placed: false,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_before_an_id() {
        assert_eq!(id_before("5-3").as_deref(), Some("5-2"));
        assert_eq!(id_before("5-0").as_deref(), Some("4-18446744073709551615"));
        assert_eq!(id_before("0-1").as_deref(), Some("0-0"));
        assert_eq!(id_before("0-0"), None);
        assert_eq!(id_before("x-1"), None);
    }

    #[test]
    fn field_names_are_bytes() {
        let reply = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"3-0".to_vec()),
            Value::Array(vec![
                Value::BulkString(vec![0xff, 0xfe]),
                Value::BulkString(vec![0x00]),
            ]),
        ])]);
        let entries = parse_entries(reply, Source::Stream).unwrap();
        assert_eq!(
            entries[0].fields.as_deref().unwrap(),
            &[(vec![0xff, 0xfe], vec![0x00])]
        );
    }
}
