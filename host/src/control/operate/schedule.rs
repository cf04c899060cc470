//! Entries sent for later: `sluice send --at/--in`, `POST .../scheduled` and a producer's own
//! ZADD all put the entry in the subscription's delayed set (`lua/schedule.lua`), where the
//! sweep moves it to the group at its due time, exactly once, like a parked retry; it comes as
//! a first attempt (retry count 0), with the same lateness as a retry.
//!
//! A scheduled entry is a delayed-set member like a retry's, with retry count 0 and an id of
//! its own (`<ms>-<seq>`, shaped like a stream id, with a sequence number no stream reaches)
//! that is also its origin: listed, retried now, deleted and dead-lettered by that id like a
//! parked retry ([`super::parked`]); listings tell the two apart by the retry count.
//!
//! Bounds: at most [`MAX_AHEAD`] ahead; a time more than [`MAX_PAST`] in the past is refused
//! (a clock or unit mistake), a nearer one is due now. Times are the Redis server's.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use crate::store::options::ScriptOptions;

static SCHEDULE: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/operate/lua/schedule")));

/// The furthest ahead an entry may be scheduled: a year and a day.
pub const MAX_AHEAD: Duration = Duration::from_secs(366 * 24 * 3600);
/// The furthest in the past a time may be and still be taken as "now".
pub const MAX_PAST: Duration = Duration::from_secs(24 * 3600);

/// When a scheduled entry is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// At this time, epoch milliseconds.
    At(i64),
    /// This long after the Redis server's now.
    In(Duration),
}

/// An entry scheduled: its id and due time, and the server's now, epoch ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    /// Its id (also its origin id once delivered).
    pub id: String,
    /// When it is due.
    pub due_ms: i64,
    /// The server's time when it was scheduled.
    pub now_ms: i64,
}

/// Where a scheduled entry goes: the subscription's delayed set and its ttl.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The stream (of the partition) the subscription reads.
    pub stream: &'a str,
    /// Its group.
    pub group: &'a str,
    /// Its delayed set.
    pub set: &'a str,
    /// The set's ttl, if it has one.
    pub ttl: Option<Duration>,
}

/// Schedule the entry with `fields` for `target`'s group at `when`.
pub async fn schedule<C: ConnectionLike>(
    conn: &mut C,
    target: Target<'_>,
    when: When,
    fields: &[(Vec<u8>, Vec<u8>)],
) -> RedisResult<Scheduled> {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let (at_ms, in_ms) = match when {
        When::At(at) => (at.max(1) as u64, 0),
        When::In(after) => (0, ms(after).min(ms(MAX_AHEAD) + 1)),
    };
    // At least 10^18: no stream's sequence numbers get there.
    let seq = rand::random_range(1_000_000_000_000_000_000u64..u64::MAX);
    let options = ScriptOptions::default()
        .with("stream", target.stream)
        .with("group", target.group)
        .with("seq", seq.to_string())
        .with("at_ms", at_ms)
        .with("in_ms", in_ms)
        .with("max_ahead_ms", ms(MAX_AHEAD))
        .with("max_past_ms", ms(MAX_PAST))
        .with("ttl_ms", target.ttl.map_or(0, ms))
        .encode();
    let mut invocation = SCHEDULE.key(target.set);
    invocation.arg(options);
    for (name, value) in fields {
        invocation.arg(name).arg(value);
    }
    let (id, due_ms, now_ms): (String, i64, i64) = invocation.invoke_async(conn).await?;
    Ok(Scheduled { id, due_ms, now_ms })
}
