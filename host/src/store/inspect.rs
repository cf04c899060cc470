//! Looking at what a subscription has in Redis without changing it: the group (pending, lag,
//! last delivered id), its consumers, the delayed set and the dead-letter stream.
//!
//! `sluice status`, the `/metrics` gauges, the consumer-takeover check and the benchmark all
//! ask these questions; they ask them here, one way, through redis-rs's typed XINFO replies.

use redis::RedisResult;
use redis::aio::ConnectionLike;
use redis::streams::{
    StreamInfoConsumer, StreamInfoConsumersReply, StreamInfoGroup, StreamInfoGroupsReply,
};

/// What waits in a delayed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DelayedSummary {
    /// Retries parked in it.
    pub parked: u64,
    /// The earliest due time (epoch ms), if any is parked.
    pub next_due_ms: Option<i64>,
}

/// A subscription's state in Redis at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The group, `None` when the stream or the group does not exist yet.
    pub group: Option<StreamInfoGroup>,
    /// The delayed set, for a subscription that has one.
    pub delayed: Option<DelayedSummary>,
    /// The group on the retry lane, for a subscription that has one (`None` too while the lane
    /// or its group does not exist yet).
    pub lane: Option<StreamInfoGroup>,
    /// Entries in the dead-letter stream.
    pub dead_letters: u64,
}

/// Every consumer group of `stream` (XINFO GROUPS); none when the stream does not exist.
async fn all_groups<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
) -> RedisResult<Vec<StreamInfoGroup>> {
    match redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async::<StreamInfoGroupsReply>(conn)
        .await
    {
        Ok(reply) => Ok(reply.groups),
        // "ERR no such key": no stream yet.
        Err(err) if err.code() == Some("ERR") => Ok(Vec::new()),
        Err(err) => Err(err),
    }
}

/// The state of `group` on `stream` (XINFO GROUPS); `None` when the stream or the group does
/// not exist.
pub async fn group<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
) -> RedisResult<Option<StreamInfoGroup>> {
    Ok(all_groups(conn, stream)
        .await?
        .into_iter()
        .find(|g| g.name == group))
}

/// The names of every consumer group of `stream` (Sluice's or not): who reads it.
pub async fn groups<C: ConnectionLike>(conn: &mut C, stream: &str) -> RedisResult<Vec<String>> {
    Ok(all_groups(conn, stream)
        .await?
        .into_iter()
        .map(|g| g.name)
        .collect())
}

/// The consumers of `group` on `stream` (XINFO CONSUMERS), with their pending counts and idle
/// times.
pub async fn consumers<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
) -> RedisResult<Vec<StreamInfoConsumer>> {
    let reply: StreamInfoConsumersReply = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg(group)
        .query_async(conn)
        .await?;
    Ok(reply.consumers)
}

/// One entry pending to a consumer: its id, how long since it was last delivered (ms) and
/// how many times Redis delivered it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PendingEntry {
    /// The entry id.
    pub id: String,
    /// Since it was last delivered, ms.
    pub idle_ms: u64,
    /// Redis's delivery counter.
    pub deliveries: u64,
}

/// Up to `count` entries pending to `consumer` of `group` on `stream`, oldest first.
pub async fn pending_of<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    consumer: &str,
    count: usize,
) -> RedisResult<Vec<PendingEntry>> {
    let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(count)
        .arg(consumer)
        .query_async(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, _, idle_ms, deliveries)| PendingEntry {
            id,
            idle_ms,
            deliveries,
        })
        .collect())
}

/// How many retries wait in the delayed set `key`, and the earliest due time.
pub async fn delayed<C: ConnectionLike>(conn: &mut C, key: &str) -> RedisResult<DelayedSummary> {
    let parked: u64 = redis::cmd("ZCARD").arg(key).query_async(conn).await?;
    let first: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .query_async(conn)
        .await?;
    Ok(DelayedSummary {
        parked,
        next_due_ms: first.first().map(|(_, score)| *score as i64),
    })
}

/// The subscription's group, delayed set (when `delayed_key` is set), its group on the retry
/// lane (when `lane` is set) and dead-letter length.
pub async fn snapshot<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group_name: &str,
    dead_letter: &str,
    delayed_key: Option<&str>,
    lane: Option<&str>,
) -> RedisResult<Snapshot> {
    let group_state = group(conn, stream, group_name).await?;
    let lane = match lane {
        Some(lane) => group(conn, lane, group_name).await?,
        None => None,
    };
    let delayed = match delayed_key {
        Some(key) => Some(delayed(conn, key).await?),
        None => None,
    };
    let dead_letters: u64 = redis::cmd("XLEN")
        .arg(dead_letter)
        .query_async(conn)
        .await?;
    Ok(Snapshot {
        group: group_state,
        lane,
        delayed,
        dead_letters,
    })
}

/// The Redis server's clock, epoch milliseconds: every due time is on this clock.
pub async fn server_now_ms<C: ConnectionLike>(conn: &mut C) -> RedisResult<i64> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// What an operator wants to know about the Redis a subscription uses (INFO): which version
/// and role, how full it is, how many clients it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RedisFacts {
    /// `redis_version`.
    pub version: String,
    /// `role`: master or slave (a replica).
    pub role: String,
    /// `used_memory`, bytes.
    pub used_memory: u64,
    /// `maxmemory`, bytes (0: no limit).
    pub maxmemory: u64,
    /// `maxmemory_policy`.
    pub maxmemory_policy: String,
    /// `connected_clients`.
    pub clients: u64,
}

/// The facts of the Redis `conn` reaches (on a cluster: the node the command went to). Values
/// are cut to 64 bytes: a hostile server's INFO is not trusted to be small.
pub async fn redis_facts<C: ConnectionLike>(conn: &mut C) -> RedisResult<RedisFacts> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .arg("replication")
        .arg("memory")
        .arg("clients")
        .query_async(conn)
        .await?;
    let field = |name: &str| -> String {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().chars().take(64).collect())
            .unwrap_or_default()
    };
    let number = |name: &str| field(name).parse::<u64>().unwrap_or(0);
    Ok(RedisFacts {
        version: field("redis_version"),
        role: field("role"),
        used_memory: number("used_memory"),
        maxmemory: number("maxmemory"),
        maxmemory_policy: field("maxmemory_policy"),
        clients: number("connected_clients"),
    })
}

/// How big a stream is: entries, memory (MEMORY USAGE with a few samples: cheap on a big
/// stream), and its oldest entry's id time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StreamSize {
    /// XLEN.
    pub length: u64,
    /// MEMORY USAGE, sampled; 0 when the stream does not exist.
    pub bytes: u64,
    /// When the oldest entry was added (epoch ms from its id), if any.
    pub oldest_ms: Option<i64>,
}

/// The size of `stream`.
pub async fn stream_size<C: ConnectionLike>(conn: &mut C, stream: &str) -> RedisResult<StreamSize> {
    let length: u64 = redis::cmd("XLEN").arg(stream).query_async(conn).await?;
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(stream)
        .arg("SAMPLES")
        .arg(5)
        .query_async(conn)
        .await?;
    // Only the oldest entry's id comes here, never its fields: an entry of any size (one
    // dead-lettered for being over max_entry_bytes stays in its stream) would otherwise be
    // read whole at every scrape of /metrics (found by the attack review of issue 52: one
    // scrape of a stream holding a 400 MB entry killed a host held to 700 MiB).
    static OLDEST: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(crate::store::lua!("store/lua/oldest")));
    let first: Option<String> = OLDEST.key(stream).invoke_async(conn).await?;
    Ok(StreamSize {
        length,
        bytes: bytes.unwrap_or(0),
        oldest_ms: first.and_then(|id| id.split('-').next()?.parse().ok()),
    })
}

/// What retention's last run on `stream` recorded (`crate::control::retention`), if it ever ran.
pub async fn retention_record<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
) -> RedisResult<Option<std::collections::HashMap<String, String>>> {
    let record: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(crate::store::keys::retention_record_key(stream))
        .query_async(conn)
        .await?;
    Ok((!record.is_empty()).then_some(record))
}
