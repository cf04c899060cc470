//! Reading an ordering's state for the operator (`sluice keys`, the admin API): which keys
//! have entries waiting, behind which turns, since when. Bounded: a page of keys, never every
//! key of a million.

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
    let mut listed = Vec::with_capacity(page.len());
    for (digest, since) in page {
        let mut state = key_state(conn, keys, &digest).await?;
        state.waiting_since_ms = Some(since as i64);
        listed.push(state);
    }
    Ok(Overview {
        waiting_keys,
        turns_held,
        keys: listed,
    })
}

/// One key's state, by its digest.
pub async fn key_state<C: ConnectionLike>(
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
    let run: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.run(digest))
        .query_async(conn)
        .await?;
    let mut holders: Vec<Holder> = run
        .into_iter()
        .map(|(origin_id, value)| {
            let (dead_letter, ms) = match value.strip_prefix("dead:") {
                Some(ms) => (true, ms),
                None => (false, value.as_str()),
            };
            Holder {
                origin_id,
                since_ms: ms.parse().ok(),
                dead_letter,
            }
        })
        .collect();
    holders.sort_by_key(|h| h.since_ms);
    Ok(KeyState {
        digest: digest.to_owned(),
        key: String::from_utf8_lossy(&key.unwrap_or_default()).into_owned(),
        waiting,
        waiting_since_ms: since.map(|s| s as i64),
        holders,
    })
}
