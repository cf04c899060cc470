//! Flow control: whether a subscription may take entries now, decided for every host of its
//! group at once through Redis: an operator's pause (here, followed by every host through the
//! [`watcher`]), a shared rate limit ([`rate`]) and a circuit breaker ([`breaker`]); the flow
//! journal ([`journal`]) and the group's delivery counts ([`stats`]) are for the page.
//!
//! An operator pauses a subscription (`sluice pause`, the admin API, the page): the pause is a
//! field of the subscription's flow hash ([`crate::store::keys::flow_key`]), written with HSETNX so
//! a second pause keeps who paused first, and followed by a note in the change log
//! ([`crate::store::keys::FLOW_CHANGES`], a capped stream naming the flow hash) and an INCR of
//! [`crate::store::keys::FLOW_EPOCH`], in one script. Each host polls that one counter every [`POLL`]
//! per Redis ([`FlowWatcher`]); when it moves, it reads the log from where it stood and reads
//! again only the flow hashes the log names (at most [`CHANGES_PER_POLL`] notes a poll), so one
//! subscription's pause does not make every host read every subscription's hash. An epoch
//! that moves with nothing logged (a host of the earlier release, or any client's INCR) makes
//! a host read everything, at most every [`FULL_REREAD_EVERY`]. Each hash is read again every
//! [`FULL_REFRESH`] in any case, should a writer have died between its write and its note: a
//! few at each poll, at most [`MAX_REREAD_PER_POLL`], so past 1,200 subscriptions on one Redis
//! a round takes longer. A pause reaches every host within about [`POLL`], and a host that
//! starts while its subscription is paused learns it before its first read.
//!
//! What a paused subscription does (see the read loop in `pipeline/read/`): it reads nothing
//! new, claims nothing and takes over nothing; deliveries in flight finish and settle; due
//! retries stay parked, or wait in the retry lane where the sweep puts them, and a retry that
//! stays pending waits for the resume. A read that was already waiting when the pause came
//! leaves what it returns pending to this consumer, handled after the resume. Paused is a
//! state, not a fault: the host stays ready. Not knowing is a fault: flow controls this host
//! could not confirm for [`crate::observe::health::FLOW_STALE_AFTER`] make the subscription not ready.
//!
//! Bounds against what another writer to the same Redis may have left there: a pause record
//! is read through a script that returns at most [`MAX_RECORD`] bytes of it, a record that is
//! not Sluice's JSON still counts as a pause ("by an unknown writer"), and who paused and why
//! are cut to [`MAX_BY`] and [`MAX_REASON`] characters without control characters.

pub mod breaker;
pub mod journal;
pub mod rate;
pub mod stats;
mod watcher;

use std::time::{Duration, SystemTime};

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use crate::store::keys::{FLOW_CHANGES, FLOW_EPOCH, flow_key};
pub use watcher::{FlowWatch, FlowWatcher};

/// How often a host asks whether any flow control changed.
pub const POLL: Duration = Duration::from_millis(250);
/// How often a host reads every subscription's flow hash even when the epoch did not move.
pub const FULL_REFRESH: Duration = Duration::from_secs(30);
/// How often states found unchanged are confirmed for readiness (well within
/// [`crate::observe::health::FLOW_STALE_AFTER`]).
const CONFIRM_EVERY: Duration = Duration::from_secs(1);
/// The most flow states a poll reads again while nothing changed (see [`rolling_share`]).
pub const MAX_REREAD_PER_POLL: usize = 10;
/// The most bytes of a pause record a host reads.
pub const MAX_RECORD: usize = 4096;
/// The longest "who paused" kept, in characters.
pub const MAX_BY: usize = 200;
/// The longest reason kept, in characters.
pub const MAX_REASON: usize = 500;

/// The field of the flow hash that holds the pause.
const PAUSED: &str = "paused";
/// The field of the flow hash that holds a canary's record.
pub const CANARY: &str = "canary";
/// The field of the flow hash that holds a canary's verdict.
pub const CANARY_VERDICT: &str = "canary-verdict";

/// Who paused a subscription, when and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Paused {
    /// Who paused it: an operator's name, or where the call came from.
    pub by: String,
    /// When, in milliseconds since the Unix epoch (0: unknown).
    pub at_ms: u64,
    /// Why, if they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Paused {
    /// A pause by `by` now, for `reason`; both bounded and stripped of control characters.
    pub fn now(by: &str, reason: Option<&str>) -> Self {
        let at_ms = crate::support::clock::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            by: clean(by, MAX_BY),
            at_ms,
            reason: reason
                .map(|r| clean(r, MAX_REASON))
                .filter(|r| !r.is_empty()),
        }
        .bounded()
    }

    /// A record read from Redis: Sluice's JSON, bounded again (another writer may have put
    /// anything there); anything else is still a pause, by an unknown writer.
    fn from_record(record: &[u8]) -> Self {
        match serde_json::from_slice::<Self>(record) {
            Ok(paused) => paused.bounded(),
            Err(_) => Self {
                by: "an unknown writer (the pause record is not Sluice's)".to_owned(),
                at_ms: 0,
                reason: None,
            },
        }
    }

    fn bounded(self) -> Self {
        Self {
            by: clean(&self.by, MAX_BY),
            at_ms: self.at_ms,
            reason: self.reason.map(|r| clean(&r, MAX_REASON)),
        }
    }

    /// When, as RFC 3339 (empty when unknown).
    pub fn at(&self) -> String {
        if self.at_ms == 0 {
            return String::new();
        }
        crate::support::when::rfc3339_ms(i64::try_from(self.at_ms).unwrap_or(i64::MAX))
    }

    /// One line for logs and the CLI.
    pub fn describe(&self) -> String {
        let mut line = format!("paused by {}", self.by);
        if self.at_ms != 0 {
            line.push_str(&format!(" at {}", self.at()));
        }
        if let Some(reason) = &self.reason {
            line.push_str(&format!(": {reason}"));
        }
        line
    }
}

/// `text` without control characters, cut to `max` characters: what another writer to Redis
/// left in a record, made fit for a log line and the page.
pub(crate) fn clean(text: &str, max: usize) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(max)
        .collect::<String>()
        .trim()
        .to_owned()
}

/// What a host knows of a subscription's flow controls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowState {
    /// Whether it has been read from Redis yet: a host does not read a subscription before it
    /// knows whether it is paused.
    pub known: bool,
    /// The pause, if it is paused.
    pub paused: Option<Paused>,
    /// The circuit breaker, when it is open or half-open (closed: `None`).
    pub breaker: Option<breaker::BreakerState>,
    /// A canary's record, as stored (at most [`MAX_RECORD`] bytes; `crate::control::rollout` checks
    /// its seal): the flow hash is where every host of the group looks for it.
    pub canary: Option<Vec<u8>>,
    /// A canary's verdict, as stored (at most [`MAX_RECORD`] bytes).
    pub canary_verdict: Option<Vec<u8>>,
}

impl FlowState {
    /// Whether the subscription may take entries now.
    pub fn open(&self) -> bool {
        self.known && self.paused.is_none() && self.breaker.is_none()
    }
}

/// Why a pause or resume could not be written.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// Redis refused or could not be reached.
    #[error("cannot change the flow controls of stream `{stream}` group `{group}` in Redis")]
    Redis {
        /// The subscription's stream.
        stream: String,
        /// Its group.
        group: String,
        /// What Redis said.
        #[source]
        source: redis::RedisError,
    },
}

/// What a pause call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseResult {
    /// The subscription is paused now, by this call.
    Paused(Paused),
    /// It was paused already (by this record, which is kept).
    Already(Paused),
}

/// Pause the subscription to `stream` with `group` for every host of the group: `paused` is
/// recorded unless a pause is recorded already, then the epoch moves so hosts look.
pub async fn pause<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    paused: Paused,
) -> Result<PauseResult, FlowError> {
    let err = |source| FlowError::Redis {
        stream: stream.to_owned(),
        group: group.to_owned(),
        source,
    };
    let key = flow_key(stream, group);
    // Serializing a struct of strings and a number cannot fail.
    let record = serde_json::to_string(&paused).unwrap_or_default();
    let set: bool = redis::cmd("HSETNX")
        .arg(&key)
        .arg(PAUSED)
        .arg(&record)
        .query_async(conn)
        .await
        .map_err(err)?;
    let result = if set {
        journal::write(
            conn,
            stream,
            group,
            "paused",
            &paused.by,
            paused.reason.as_deref().unwrap_or(""),
        )
        .await;
        PauseResult::Paused(paused)
    } else {
        match state(conn, stream, group).await.map_err(err)? {
            Some(existing) => PauseResult::Already(existing),
            // Resumed between the two commands: try again once, as a fresh pause.
            None => return Box::pin(pause(conn, stream, group, paused)).await,
        }
    };
    bump(conn, stream, group).await.map_err(err)?;
    Ok(result)
}

/// Resume the subscription: its pause record is removed and the epoch moves. The record that
/// was removed, if it was paused.
pub async fn resume<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    by: &str,
) -> Result<Option<Paused>, FlowError> {
    let err = |source| FlowError::Redis {
        stream: stream.to_owned(),
        group: group.to_owned(),
        source,
    };
    let was = state(conn, stream, group).await.map_err(err)?;
    // A resume also closes a breaker left open: an operator's word ends both holds (a breaker
    // no running host is configured for would otherwise never be probed).
    let removed: u64 = redis::cmd("HDEL")
        .arg(flow_key(stream, group))
        .arg(PAUSED)
        .arg(breaker::FIELD)
        .query_async(conn)
        .await
        .map_err(err)?;
    if removed > 0 {
        let detail = match &was {
            Some(p) => format!("it was {}", p.describe()),
            None => "it was held by the circuit breaker".to_owned(),
        };
        journal::write(conn, stream, group, "resumed", &clean(by, MAX_BY), &detail).await;
    }
    bump(conn, stream, group).await.map_err(err)?;
    Ok(if removed > 0 { was } else { None })
}

/// How many changes the change log keeps (about): a host that falls further behind reads
/// everything again, at most every [`FULL_REREAD_EVERY`].
const CHANGES_KEPT: usize = 1_000;
/// The most changes a poll takes from the log; more wait for the next poll.
const CHANGES_PER_POLL: usize = 200;
/// The least time between two full re-reads the epoch alone asks for (a move with no change
/// logged: a host of the earlier release, or any client's INCR).
pub const FULL_REREAD_EVERY: Duration = Duration::from_secs(2);

/// Tell every host that the flow hash of `stream` and `group` changed.
pub(crate) async fn bump<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
) -> RedisResult<()> {
    static BUMP: std::sync::LazyLock<Script> =
        std::sync::LazyLock::new(|| Script::new(crate::store::lua!("pipeline/admit/lua/bump")));
    BUMP.key(FLOW_CHANGES)
        .key(FLOW_EPOCH)
        .arg(flow_key(stream, group))
        .arg(CHANGES_KEPT)
        .invoke_async(conn)
        .await
}

/// The flow hashes named in the change log after `after` (at most [`CHANGES_PER_POLL`]
/// entries), the id to read on from, and whether the log may hold more.
async fn changes<C: ConnectionLike>(
    conn: &mut C,
    after: &str,
) -> RedisResult<(Vec<Vec<u8>>, String, bool)> {
    type Reply = Option<Vec<(String, Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>)>>;
    let reply: Reply = redis::cmd("XREAD")
        .arg("COUNT")
        .arg(CHANGES_PER_POLL)
        .arg("STREAMS")
        .arg(FLOW_CHANGES)
        .arg(after)
        .query_async(conn)
        .await?;
    let mut last = after.to_owned();
    let mut keys = Vec::new();
    let mut read = 0;
    for (_, entries) in reply.unwrap_or_default() {
        for (id, fields) in entries {
            read += 1;
            last = id;
            keys.extend(
                fields
                    .into_iter()
                    .filter(|(name, _)| name == b"k")
                    .map(|(_, value)| value),
            );
        }
    }
    Ok((keys, last, read >= CHANGES_PER_POLL))
}

/// The id of the change log's newest entry (`0-0` when it is empty or unreadable).
async fn newest_change<C: ConnectionLike>(conn: &mut C) -> String {
    let newest: RedisResult<Vec<(String, redis::Value)>> = redis::cmd("XREVRANGE")
        .arg(FLOW_CHANGES)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await;
    newest
        .ok()
        .and_then(|entries| entries.into_iter().next())
        .map_or_else(|| "0-0".to_owned(), |(id, _)| id)
}

/// The pause of the subscription to `stream` with `group`, if it is paused (at most
/// [`MAX_RECORD`] bytes of the record are read).
pub async fn state<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
) -> RedisResult<Option<Paused>> {
    Ok(read(conn, stream, group).await?.paused)
}

/// The flow states of many subscriptions in one call per [`READ_MANY_AT_ONCE`] (`None` for a
/// hash of another type): a quiet host's periodic re-read. Only where keys need not share a
/// slot (a doorbell's Redis: no cluster).
pub(crate) async fn read_many<C: ConnectionLike>(
    conn: &mut C,
    keys: &[Vec<u8>],
) -> RedisResult<Vec<Option<FlowState>>> {
    static READ_MANY: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
        Script::new(crate::store::lua!("pipeline/admit/lua/read_many"))
    });
    type Fields = Option<Vec<Option<Vec<u8>>>>;
    let mut states = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(READ_MANY_AT_ONCE) {
        let mut call = READ_MANY.prepare_invoke();
        for key in chunk {
            call.key(key.as_slice());
        }
        call.arg(MAX_RECORD)
            .arg(PAUSED)
            .arg(breaker::FIELD)
            .arg(CANARY)
            .arg(CANARY_VERDICT);
        let replies: Vec<Fields> = call.invoke_async(conn).await?;
        states.extend(replies.into_iter().map(|fields| {
            let mut fields = fields?.into_iter();
            let mut next = || fields.next().flatten();
            let (paused, breaker, canary, canary_verdict) = (next(), next(), next(), next());
            Some(FlowState {
                known: true,
                paused: paused.map(|r| Paused::from_record(&r)),
                breaker: breaker.map(|r| breaker::BreakerState::from_record(&r)),
                canary,
                canary_verdict,
            })
        }));
    }
    Ok(states)
}

/// Flow hashes one [`read_many`] call reads.
pub const READ_MANY_AT_ONCE: usize = 200;

/// Everything the flow hash of the subscription to `stream` with `group` holds, known.
pub async fn read<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
) -> RedisResult<FlowState> {
    static READ: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
        Script::new(crate::store::lua!("pipeline/admit/lua/read_fields"))
    });
    type Fields = (
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
    );
    let (paused, breaker, canary, canary_verdict): Fields = READ
        .key(flow_key(stream, group))
        .arg(MAX_RECORD)
        .arg(PAUSED)
        .arg(breaker::FIELD)
        .arg(CANARY)
        .arg(CANARY_VERDICT)
        .invoke_async(conn)
        .await?;
    Ok(FlowState {
        known: true,
        paused: paused.map(|r| Paused::from_record(&r)),
        breaker: breaker.map(|r| breaker::BreakerState::from_record(&r)),
        canary,
        canary_verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_bounded_and_foreign_ones_still_pause() {
        let long = "x".repeat(10_000);
        let p = Paused::now(&format!("ops\u{1b}[31m{long}"), Some(&long));
        assert_eq!(p.by.chars().count(), MAX_BY);
        assert!(!p.by.contains('\u{1b}'));
        assert_eq!(
            p.reason.as_deref().map(|r| r.chars().count()),
            Some(MAX_REASON)
        );
        let hostile = serde_json::json!({ "by": long, "at_ms": 1, "reason": long }).to_string();
        let read = Paused::from_record(hostile.as_bytes());
        assert_eq!(read.by.chars().count(), MAX_BY);
        // A time past year 9999 is shown, not a panic.
        let far = Paused::from_record(br#"{"by":"x","at_ms":253402300800000}"#);
        assert!(far.describe().contains("9999-12-31"), "{}", far.describe());
        let foreign = Paused::from_record(b"1");
        assert!(foreign.by.contains("unknown writer"));
        assert_eq!(Paused::now("  ", Some("  ")).reason, None);
    }

    #[test]
    fn a_state_is_open_only_when_known_and_not_paused() {
        assert!(!FlowState::default().open());
        let known = FlowState {
            known: true,
            ..FlowState::default()
        };
        assert!(known.open());
        let paused = FlowState {
            known: true,
            paused: Some(Paused::now("ops", None)),
            ..FlowState::default()
        };
        assert!(!paused.open());
        let broken = FlowState {
            breaker: Some(breaker::BreakerState::from_record(b"{}")),
            ..known.clone()
        };
        assert!(!broken.open());
        assert!(!paused.open());
    }
}
