//! A subscription's flow journal: every pause, resume and circuit-breaker transition, in a
//! stream in Redis ([`crate::store::keys::journal_key`], in the stream's hash slot) capped at the
//! newest [`MAX_ENTRIES`]. The breaker's scripts write their transitions in the same script
//! that makes them (`lua/journal.lua`), and a pause or resume right after it is recorded, so
//! the page and the API show each transition once, whichever host made it, across restarts.
//!
//! Writing is best effort: a journal key another program holds (of another type) never stops a
//! pause or a transition. Reading is bounded whatever the key holds: at most the asked number
//! of entries, each value cut to [`MAX_VALUE`] bytes.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

/// The most entries a journal keeps.
pub const MAX_ENTRIES: usize = 100;
/// The longest value a reader takes, in bytes.
pub const MAX_VALUE: usize = 1024;

/// One transition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JournalEntry {
    /// When, epoch ms by the Redis server's clock (the entry's id).
    pub at_ms: i64,
    /// What happened: `paused`, `resumed`, `breaker-opened`, `breaker-half-open`,
    /// `breaker-closed`, `breaker-reopened`.
    pub what: String,
    /// Who: an operator, or the consumer (host) whose deliveries moved the breaker.
    pub by: String,
    /// Why, or what the breaker counted.
    pub detail: String,
}

/// Record `what` by `by` with `detail`; a failure is logged, never returned.
pub async fn write<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    what: &str,
    by: &str,
    detail: &str,
) {
    let written: RedisResult<String> = redis::cmd("XADD")
        .arg(crate::store::keys::journal_key(stream, group))
        .arg("MAXLEN")
        .arg(MAX_ENTRIES)
        .arg("*")
        .arg("what")
        .arg(what)
        .arg("by")
        .arg(by)
        .arg("detail")
        .arg(detail)
        .query_async(conn)
        .await;
    if let Err(err) = written {
        tracing::warn!(stream, group, %err, "cannot write to the subscription's flow journal: {what}");
    }
}

/// The newest `count` (at most [`MAX_ENTRIES`]) entries, newest first; entries that are not
/// Sluice's are left out.
pub async fn read<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    count: usize,
) -> RedisResult<Vec<JournalEntry>> {
    static READ: LazyLock<Script> =
        LazyLock::new(|| Script::new(crate::store::lua!("pipeline/admit/lua/read_journal")));
    let raw: Vec<(String, Vec<String>)> = READ
        .key(crate::store::keys::journal_key(stream, group))
        .arg(count.min(MAX_ENTRIES))
        .arg(MAX_VALUE)
        .invoke_async(conn)
        .await?;
    Ok(raw
        .into_iter()
        .filter_map(|(id, fields)| {
            let at_ms = i64::try_from(crate::support::when::entry_ms(&id)?).ok()?;
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|pair| pair.first().is_some_and(|n| n == name))
                    .and_then(|pair| pair.get(1).cloned())
            };
            Some(JournalEntry {
                at_ms,
                what: field("what")?,
                by: field("by").unwrap_or_default(),
                detail: field("detail").unwrap_or_default(),
            })
        })
        .collect())
}
