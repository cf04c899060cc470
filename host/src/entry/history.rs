//! An entry's history: one short record for every settle that parked it for a delayed retry or
//! dead-lettered it, kept in Redis (a field per entry of one hash per subscription,
//! [`crate::store::keys::history_key`], indexed by when each may go, both in the stream's hash slot),
//! so that the operator page can show each attempt of an entry, what it was told and by which
//! host, across hosts and restarts.
//!
//! The record is written by the settle script itself (`settle/lua/history.lua`), after the
//! entry's new place and before the XACK, with the Redis server's time: a crash never leaves a
//! park without its record, or a record without its park. Writing it is best effort: a key
//! another program left there (of another type) is skipped, never a reason for a settle to
//! fail.
//!
//! Bounds: the newest [`MAX_RECORDS`] records of an entry are kept (a record is about 170
//! bytes plus its reason); a reason is cut to
//! [`MAX_WHY`] bytes; an entry's history goes [`KEEP`] after its last due time or its dead
//! letter, and a subscription keeps at most `history_entries` of them (1,000 by default, 0 turns
//! history off: the ones due to go soonest leave first), whatever the number of entries that
//! retried or the dead-letter stream's length; both keys expire with the last history. A
//! reader takes at most [`MAX_RECORDS`] records of at most [`MAX_RECORD_BYTES`] each, whatever
//! the keys hold. An entry whose origin is no stream id has no history. Writes that Redis
//! refuses (`maxmemory`) are skipped, never a reason for a settle to fail.
//!
//! Not recorded: acks (an entry not pending, parked or dead-lettered was handled) and retries
//! that stay pending without a delayed set (Redis's delivery counter tells those).

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use crate::entry::delivery::Delivery;

/// The most records an entry's history keeps (the newest).
pub const MAX_RECORDS: usize = 32;
/// The longest reason a record keeps, in bytes.
pub const MAX_WHY: usize = 512;
/// The longest record a reader takes, in bytes.
pub const MAX_RECORD_BYTES: usize = 2048;
/// How long a history outlives the entry's last due time or its dead letter.
pub const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Parked for a delayed retry.
    Retry,
    /// Moved to the dead-letter stream.
    DeadLetter,
    /// Acknowledged unhandled: its dedupe key's first entry (`of`) was read within the window.
    Duplicate,
}

/// One settle of an entry, as stored (short names: there is one list per retried entry).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// When, epoch ms by the Redis server's clock (written by the script).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub at: i64,
    /// What was done.
    #[serde(rename = "do")]
    pub action: Action,
    /// The attempt (1 for the first delivery).
    pub n: u64,
    /// The consumer (host) that settled it.
    pub by: String,
    /// Why: the handler's cause for a retry, the reason for a dead letter.
    #[serde(default)]
    pub why: String,
    /// The id that was settled: the origin, or a retry's copy in the lane or the stream.
    pub id: String,
    /// For a retry, the delay asked for, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
    /// For a retry, its due time (epoch ms, server clock; written by the script).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due: Option<i64>,
    /// For a dead letter, its id in the dead-letter stream (written by the script).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dl: Option<String>,
    /// For a duplicate, the id of its dedupe key's first entry (written by the read script).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of: Option<String>,
}

impl Record {
    /// The note of `delivery` settled by `consumer` as `action` for `why` (a retry with its
    /// `delay`), as the settle script takes it (`settle/lua/history.lua`): the origin id, the
    /// most entries kept (`cap`), and the record as a JSON object without its closing brace
    /// (the script appends the server's time and what else only it knows); empty when the
    /// history is off or the entry's origin is no stream id.
    pub fn of(
        delivery: &Delivery,
        consumer: &str,
        action: Action,
        (why, delay): (&str, Option<Duration>),
        cap: u32,
    ) -> String {
        if cap == 0 || !is_stream_id(&delivery.origin_id) {
            return String::new();
        }
        let record = Record {
            at: 0,
            action,
            n: delivery.previous_attempts() + 1,
            by: crate::entry::outcome::bounded_text(consumer, 200).0,
            why: crate::entry::outcome::bounded_text(why, MAX_WHY).0,
            id: delivery.entry.id.clone(),
            ms: delay.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            due: None,
            dl: None,
            of: None,
        };
        let mut json = serde_json::to_string(&record).unwrap_or_default();
        // `at` is the script's to write: the object is left open after the last field.
        json.pop();
        format!("{} {cap} {json}", delivery.origin_id)
    }

    /// The record for the admin API, with times for people.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "at_ms": self.at,
            "at": crate::support::when::rfc3339_ms(self.at),
            "action": self.action,
            "attempt": self.n,
            "consumer": self.by,
            "why": self.why,
            "id": self.id,
            "delay_ms": self.ms,
            "due_ms": self.due,
            "due": self.due.map(crate::support::when::rfc3339_ms),
            "dead_letter_id": self.dl,
            "duplicate_of": self.of,
        })
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Whether `id` is a stream id (`<ms>-<seq>`, digits only): only those name a history.
pub fn is_stream_id(id: &str) -> bool {
    let Some((ms, seq)) = id.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    digits(ms) && digits(seq)
}

/// The history of the entry whose origin is `origin_id`, oldest first; records that are not
/// Sluice's are left out.
pub async fn read<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    group: &str,
    origin_id: &str,
) -> RedisResult<Vec<Record>> {
    static READ: LazyLock<Script> =
        LazyLock::new(|| Script::new(crate::store::lua!("entry/lua/read_history")));
    if !is_stream_id(origin_id) {
        return Ok(Vec::new());
    }
    let raw: Vec<Vec<u8>> = READ
        .key(crate::store::keys::history_key(stream, group))
        .key(crate::store::keys::legacy_history_key(
            stream, group, origin_id,
        ))
        .arg(origin_id)
        .arg(MAX_RECORDS)
        .arg(MAX_RECORD_BYTES)
        .invoke_async(conn)
        .await?;
    Ok(raw
        .iter()
        .filter_map(|r| serde_json::from_slice(r).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stream_ids_name_a_history() {
        assert!(is_stream_id("1700000000000-0"));
        assert!(is_stream_id("0-1"));
        for bad in [
            "", "-", "1-", "-1", "1", "1-2-3", "1-x", "a-1", "1-0:x", "{1}-0",
        ] {
            assert!(!is_stream_id(bad), "{bad}");
        }
        assert!(!is_stream_id(&format!("{}-0", "9".repeat(21))));
    }

    #[test]
    fn the_open_record_and_the_scripts_tail_make_one_object() {
        let record = Record {
            at: 0,
            action: Action::Retry,
            n: 1,
            by: "pod \"a\"".into(),
            why: "5xx }".into(),
            id: "5-0".into(),
            ms: Some(500),
            due: None,
            dl: None,
            of: None,
        };
        let mut head = serde_json::to_string(&record).unwrap();
        assert_eq!(head.pop(), Some('}'));
        let whole = format!("{head},\"at\":1700000000123,\"due\":1700000000623}}");
        let back: Record = serde_json::from_str(&whole).unwrap();
        assert_eq!(back.at, 1_700_000_000_123);
        assert_eq!(back.due, Some(1_700_000_000_623));
        assert_eq!(back.by, "pod \"a\"");
    }

    #[test]
    fn a_record_reads_back_with_what_the_script_adds() {
        let stored = r#"{"at":1700000000123,"do":"retry","n":2,"by":"pod-a","why":"gateway 503","id":"5-0","ms":500,"due":1700000000623}"#;
        let record: Record = serde_json::from_str(stored).unwrap();
        assert_eq!(record.action, Action::Retry);
        assert_eq!(record.due, Some(1_700_000_000_623));
        let dl = r#"{"at":1,"do":"dead-letter","n":3,"by":"b","why":"x","id":"6-0","dl":"9-0"}"#;
        let record: Record = serde_json::from_str(dl).unwrap();
        assert_eq!(record.dl.as_deref(), Some("9-0"));
    }
}
