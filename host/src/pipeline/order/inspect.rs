//! Reading an ordering's state for the operator (`sluice keys`, the admin API): which keys
//! have entries waiting, behind which turns, since when. Bounded: a page of keys, never every
//! key of a million.

use std::collections::HashMap;

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::OrderKeys;

/// What holds one turn of a key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Holder {
    /// The origin id of the entry that holds it.
    pub origin_id: String,
    /// When it took the turn (server clock, epoch ms).
    pub since_ms: Option<i64>,
    /// It is a dead letter that holds its key (`on_dead_letter = "hold"`).
    pub dead_letter: bool,
}

/// One key with entries waiting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyState {
    /// The key's digest, which names its state in Redis.
    pub digest: String,
    /// The key itself (lossy text; at most `max_key_bytes`).
    pub key: String,
    /// Entries waiting behind its turns.
    pub waiting: u64,
    /// When its entries started waiting (server clock, epoch ms).
    pub waiting_since_ms: Option<i64>,
    /// What holds its turns, oldest first.
    pub holders: Vec<Holder>,
    /// Every turn was scanned for `holders` (see [`MAX_TURNS_SCANNED`]).
    pub holders_complete: bool,
}

/// A page of the keys that wait, and the counts over all of them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Overview {
    /// Keys with entries waiting.
    pub waiting_keys: u64,
    /// Turns held (entries in flight, parked or held as dead letters), over every key.
    pub turns_held: u64,
    /// The keys that have waited longest, at most the page's size.
    pub keys: Vec<KeyState>,
}

/// The `limit` keys that have waited longest, and the counts.
pub async fn overview<C: ConnectionLike>(
    conn: &mut C,
    keys: &OrderKeys,
    limit: usize,
) -> RedisResult<Overview> {
    let waiting_keys: u64 = redis::cmd("ZCARD")
        .arg(&keys.waiting)
        .query_async(conn)
        .await?;
    let turns_held: u64 = redis::cmd("HLEN")
        .arg(&keys.turns)
        .query_async(conn)
        .await?;
    let page: Vec<(String, f64)> = if limit == 0 {
        Vec::new()
    } else {
        redis::cmd("ZRANGE")
            .arg(&keys.waiting)
            .arg(0)
            .arg(limit - 1)
            .arg("WITHSCORES")
            .query_async(conn)
            .await?
    };
    let digests: Vec<&str> = page.iter().map(|(d, _)| d.as_str()).collect();
    let mut holders = if digests.is_empty() {
        Holders::default()
    } else {
        holders(conn, keys, &digests).await?
    };
    let mut listed = Vec::with_capacity(page.len());
    for (digest, since) in &page {
        let mut state = key_waiting(conn, keys, digest).await?;
        state.waiting_since_ms = Some(*since as i64);
        state.holders = holders.by_key.remove(digest).unwrap_or_default();
        state.holders_complete = holders.complete;
        listed.push(state);
    }
    Ok(Overview {
        waiting_keys,
        turns_held,
        keys: listed,
    })
}

/// The most turns one listing scans for holders (a `HSCAN` of 1,000 at a time): past it, a
/// key's holders may be missing from the listing (it says so).
pub const MAX_TURNS_SCANNED: usize = 1_000_000;

/// The holders of some keys, found by scanning the turns.
#[derive(Debug, Default)]
pub struct Holders {
    /// Per key digest, what holds its turns, oldest first.
    pub by_key: HashMap<String, Vec<Holder>>,
    /// Every turn was scanned (false past [`MAX_TURNS_SCANNED`]).
    pub complete: bool,
}

/// What holds the turns of the keys with `digests`. The turns are indexed by origin id (what
/// settling needs, in one call per batch), so finding a key's holders takes a scan: bounded,
/// for the operator only.
pub async fn holders<C: ConnectionLike>(
    conn: &mut C,
    keys: &OrderKeys,
    digests: &[&str],
) -> RedisResult<Holders> {
    let mut found = Holders {
        by_key: digests
            .iter()
            .map(|d| ((*d).to_owned(), Vec::new()))
            .collect(),
        complete: false,
    };
    let mut cursor = 0u64;
    let mut scanned = 0;
    loop {
        let (next, page): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
            .arg(&keys.turns)
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        scanned += page.len();
        for (origin_id, value) in page {
            let Some((digest, rest)) = value.split_once(':') else {
                continue;
            };
            if let Some(list) = found.by_key.get_mut(digest) {
                let (dead_letter, ms) = match rest.strip_prefix("dead:") {
                    Some(ms) => (true, ms),
                    None => (false, rest),
                };
                list.push(Holder {
                    origin_id,
                    since_ms: ms.parse().ok(),
                    dead_letter,
                });
            }
        }
        cursor = next;
        if cursor == 0 {
            found.complete = true;
            break;
        }
        if scanned >= MAX_TURNS_SCANNED {
            break;
        }
    }
    for list in found.by_key.values_mut() {
        list.sort_by_key(|h| h.since_ms);
        list.dedup_by(|a, b| a.origin_id == b.origin_id);
    }
    Ok(found)
}

/// One key's state, by its digest.
pub async fn key_state<C: ConnectionLike>(
    conn: &mut C,
    keys: &OrderKeys,
    digest: &str,
) -> RedisResult<KeyState> {
    let mut holders = holders(conn, keys, &[digest]).await?;
    let mut state = key_waiting(conn, keys, digest).await?;
    state.holders = holders.by_key.remove(digest).unwrap_or_default();
    state.holders_complete = holders.complete;
    Ok(state)
}

/// One key's state but its holders.
async fn key_waiting<C: ConnectionLike>(
    conn: &mut C,
    keys: &OrderKeys,
    digest: &str,
) -> RedisResult<KeyState> {
    let key: Option<Vec<u8>> = redis::cmd("HGET")
        .arg(&keys.names)
        .arg(digest)
        .query_async(conn)
        .await?;
    let waiting: u64 = redis::cmd("LLEN")
        .arg(keys.wait(digest))
        .query_async(conn)
        .await?;
    let since: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys.waiting)
        .arg(digest)
        .query_async(conn)
        .await?;
    Ok(KeyState {
        digest: digest.to_owned(),
        key: String::from_utf8_lossy(&key.unwrap_or_default()).into_owned(),
        waiting,
        waiting_since_ms: since.map(|s| s as i64),
        holders: Vec::new(),
        holders_complete: true,
    })
}
