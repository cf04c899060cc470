//! The delayed-retry set: listing it in due order, finding a retry by its origin id, and making
//! retries due now (`lua/retry_now.lua`), deleting them, or dead-lettering them with the
//! operator's reason (`lua/dead_letter_now.lua`).
//!
//! A parked retry is identified to the operator by its origin id (the entry the producer first
//! added). Finding it is a ZSCAN over the set, filtered by Redis; when the caller also knows its
//! due time (the API and the web page do, from the listing) it is one ZRANGE at that score.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use super::{BATCH, OperateError, Page};
use crate::entry::member::{ParkedEntry, decode};
use crate::store::keys::{self, SubscriptionKeys};
use crate::store::options::ScriptOptions;

static RETRY_NOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/operate/lua/retry_now")));
/// `lua/dead_letter_now.lua`, behind the seal it shares with the sweep.
static DEAD_LETTER_NOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/operate/lua/dead_letter_now")));

/// One parked retry with the set member it is stored as (what the operations act on).
#[derive(Debug, Clone)]
pub struct Parked {
    /// The member, as stored.
    pub member: Vec<u8>,
    /// The member, decoded.
    pub entry: ParkedEntry,
}

impl Parked {
    /// The trace its deliveries are in (see [`crate::observe::telemetry::context`]), when the member
    /// says whose it is.
    pub fn trace_id(&self) -> Option<String> {
        let e = &self.entry;
        let (stream, group) = e.owner.as_ref()?;
        let origin = if e.origin_id.is_empty() {
            &e.entry_id
        } else {
            &e.origin_id
        };
        Some(crate::observe::telemetry::context::trace_id_of(
            stream, group, origin, &e.fields,
        ))
    }

    /// The retry as one JSON object (admin API), with how long until it is due from `now_ms`
    /// (server clock).
    pub fn to_json(&self, now_ms: i64) -> serde_json::Value {
        let e = &self.entry;
        let trace_id = self.trace_id();
        serde_json::json!({
            "origin_id": e.origin_id,
            "entry_id": e.entry_id,
            "kind": if e.is_scheduled() { "scheduled" } else { "retry" },
            "retry_count": e.retry_count,
            "due_ms": e.due_ms,
            "due": super::format_ms(e.due_ms),
            "due_in_ms": e.due_ms - now_ms,
            "trace_link": trace_id.as_deref().and_then(crate::observe::telemetry::trace_link),
            "trace_id": trace_id,
            "fields": super::fields_json(&e.fields),
        })
    }
}

/// Parked retries in due order, starting at `cursor` (from an earlier page), up to `limit`
/// (at most [`BATCH`]). Members Sluice did not write are skipped.
///
/// The cursor is `<score>:<skip>`: the due time to start at and how many members with exactly
/// that due time the earlier pages already showed.
pub async fn list<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    cursor: Option<&str>,
    limit: usize,
) -> Result<Page<Parked>, OperateError> {
    let (from, skip) = match cursor {
        None => (None, 0),
        Some(c) => {
            let parsed = c
                .split_once(':')
                .and_then(|(s, k)| Some((s.parse::<i64>().ok()?, k.parse::<usize>().ok()?)));
            let (score, skip) = parsed.ok_or_else(|| OperateError::Cursor(c.to_owned()))?;
            (Some(score), skip)
        }
    };
    let limit = limit.clamp(1, BATCH);
    let members: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGEBYSCORE")
        .arg(key)
        .arg(from.map_or("-inf".to_owned(), |s| s.to_string()))
        .arg("+inf")
        .arg("WITHSCORES")
        .arg("LIMIT")
        .arg(skip)
        .arg(limit)
        .query_async(conn)
        .await?;
    let next = (members.len() == limit)
        .then(|| {
            let last = members.last()?.1 as i64;
            let same = members.iter().filter(|(_, s)| *s as i64 == last).count();
            let skip = if Some(last) == from {
                skip + same
            } else {
                same
            };
            Some(format!("{last}:{skip}"))
        })
        .flatten();
    let items = members
        .into_iter()
        .filter_map(|(member, score)| {
            let entry = decode(&member, score as i64).ok()?;
            Some(Parked { member, entry })
        })
        .collect();
    Ok(Page { items, next })
}

/// The parked retries whose origin id is one of `origins`. With `due_ms` (from a listing) only
/// the members due then are read; otherwise the whole set is scanned, [`BATCH`] at a time on
/// the server, for members containing the id.
pub async fn find<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    origins: &[String],
    due_ms: Option<i64>,
) -> RedisResult<Vec<Parked>> {
    let mut found = Vec::new();
    let wanted = |entry: &ParkedEntry| origins.contains(&entry.origin_id);
    if let Some(due) = due_ms {
        let members: Vec<Vec<u8>> = redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg(due)
            .arg(due)
            .query_async(conn)
            .await?;
        for member in members {
            if let Ok(entry) = decode(&member, due)
                && wanted(&entry)
            {
                found.push(Parked { member, entry });
            }
        }
        return Ok(found);
    }
    for origin in origins {
        found.extend(scan_for(conn, key, origin, usize::MAX).await?.0);
    }
    Ok(found)
}

/// The parked retries whose origin id is `origin`, looked for over the whole set, or over
/// about `budget` members at most (1,000 a call, filtered by Redis); and whether the whole set
/// was looked at.
pub async fn scan_for<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    origin: &str,
    budget: usize,
) -> RedisResult<(Vec<Parked>, bool)> {
    let pattern = format!("*{}*", glob_escape(origin));
    let mut found = Vec::new();
    let mut cursor = 0u64;
    let mut looked = 0usize;
    loop {
        let (next, page): (u64, Vec<(Vec<u8>, f64)>) = redis::cmd("ZSCAN")
            .arg(key)
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        for (member, score) in page {
            if let Ok(entry) = decode(&member, score as i64)
                && entry.origin_id == origin
            {
                found.push(Parked { member, entry });
            }
        }
        looked = looked.saturating_add(1000);
        if next == 0 {
            return Ok((found, true));
        }
        if looked >= budget {
            return Ok((found, false));
        }
        cursor = next;
    }
}

/// `text` with Redis glob's special characters escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Make `members` due now; returns how many were still parked.
pub async fn retry_now<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    members: &[Vec<u8>],
) -> RedisResult<usize> {
    let mut moved = 0;
    for chunk in members.chunks(BATCH) {
        let started = crate::support::clock::now();
        let mut invocation = RETRY_NOW.key(key);
        invocation.arg(0);
        for member in chunk {
            invocation.arg(member.as_slice());
        }
        let n: usize = invocation.invoke_async(conn).await?;
        moved += n;
        if crate::observe::telemetry::enabled() {
            for member in chunk {
                if let Ok(entry) = crate::entry::member::decode(member, 0)
                    && let Some((stream, group)) = &entry.owner
                {
                    let origin = if entry.origin_id.is_empty() {
                        &entry.entry_id
                    } else {
                        &entry.origin_id
                    };
                    crate::observe::telemetry::operator_span(
                        "retry-now",
                        (stream, group, origin),
                        &entry.fields,
                        started,
                        vec![opentelemetry::KeyValue::new("set", key.to_owned())],
                    );
                }
            }
        }
    }
    Ok(moved)
}

/// Make up to [`BATCH`] retries that are not yet due, due now; returns how many (0: none left).
/// Call until it returns 0 to make every retry due: each call is one atomic batch.
pub async fn retry_batch_now<C: ConnectionLike>(conn: &mut C, key: &str) -> RedisResult<usize> {
    if crate::observe::telemetry::enabled() {
        // Named, so each gets its span in its entry's trace.
        let now_ms = crate::store::inspect::server_now_ms(conn).await?;
        let members: Vec<Vec<u8>> = redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .arg("LIMIT")
            .arg(0)
            .arg(BATCH)
            .query_async(conn)
            .await?;
        return retry_now(conn, key, &members).await;
    }
    RETRY_NOW.key(key).arg(BATCH).invoke_async(conn).await
}

/// Delete `members` from the set; returns how many were there. A parked retry that held its
/// ordered key's turn gives it back (the key's next entry goes).
pub async fn delete<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    members: &[Vec<u8>],
) -> RedisResult<usize> {
    let mut deleted = 0;
    for chunk in members.chunks(BATCH) {
        let n: usize = redis::cmd("ZREM")
            .arg(key)
            .arg(chunk)
            .query_async(conn)
            .await?;
        deleted += n;
        for parked in chunk.iter().filter_map(|m| decode(m, 0).ok()) {
            if let Some((stream, group)) = &parked.owner {
                crate::pipeline::order::forget(
                    conn,
                    (stream, group, key),
                    &[parked.origin_id.as_str()],
                    crate::pipeline::order::OPERATOR_LET_IN,
                )
                .await?;
            }
        }
    }
    Ok(deleted)
}

/// The dead-letter-now script's options (see the header of `lua/dead_letter_now.lua`).
fn dead_letter_now_options(keys: &SubscriptionKeys, reason: &str) -> Vec<u8> {
    ScriptOptions::default()
        .with("reason", reason)
        .with("stream", &*keys.stream)
        .with("group", &*keys.group)
        .with("max_fields", keys::SCRIPT_MAX_FIELDS as u64)
        .names(
            "fields",
            &[
                ("reason", keys::REASON),
                ("origin_stream", keys::ORIGIN_STREAM),
                ("origin_group", keys::ORIGIN_GROUP),
                ("origin_id", keys::ORIGIN_ID),
                ("entry_id", keys::ENTRY_ID),
                ("retry_count", keys::RETRY_COUNT),
                ("delivery_count", keys::DELIVERY_COUNT),
                ("member", keys::MEMBER),
                ("origin_key", keys::ORIGIN_KEY),
                ("mark", keys::MARK),
                ("packed_fields", keys::PACKED_FIELDS),
            ],
        )
        .with("dead_letter_maxlen", keys.maxlen_arg().to_string())
        .names(
            "seals",
            &[
                ("dead_letter", keys::Seal::DeadLetter.name()),
                ("member", keys::Seal::Member.name()),
                ("dead_letter_packed", keys::Seal::DeadLetterPacked.name()),
            ],
        )
        .encode()
}

/// Move `members` to the subscription's dead-letter stream with `reason`; returns how many
/// were still parked.
pub async fn dead_letter_now<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    members: &[Vec<u8>],
    reason: &str,
) -> Result<usize, OperateError> {
    let Some(set) = keys.delayed.as_deref() else {
        return Ok(0);
    };
    let mut moved = 0;
    for chunk in members.chunks(BATCH) {
        let mut invocation = DEAD_LETTER_NOW.key(set);
        invocation
            .key(&*keys.dead_letter)
            .key(keys.secret())
            .arg(dead_letter_now_options(keys, reason));
        for member in chunk {
            invocation.arg(member.as_slice());
        }
        let n: usize = invocation.invoke_async(conn).await?;
        moved += n;
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_in_an_origin_id_match_literally() {
        assert_eq!(glob_escape("1-0"), "1-0");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
