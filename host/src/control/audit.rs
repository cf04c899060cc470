//! The audit stream: who did what to which subscription, how many entries it moved, and when,
//! for every action taken through the admin API, the page and the CLI (`pause`, `resume`,
//! `requeue`, `retry-now`, `delete`; `swap` goes through the API). One stream per Redis,
//! [`AUDIT_STREAM`], read back newest first by the page.
//!
//! Attacks it is built against (docs/design/operator-page.md):
//! - an amplifier: one record per action (a bulk job writes two, started and ended, however
//!   many entries it moves), never per entry; only calls that passed the token check write one;
//!   the stream is trimmed to about [`KEEP`] records, and every field is cut to
//!   [`FIELD_BYTES`], so no caller makes it grow without bound;
//! - a forged record: it is written by the host after the action, from what the host knows
//!   (the session's role and label, never a name the caller gives).

use redis::aio::ConnectionLike;

/// The audit stream's key on each Redis.
pub const AUDIT_STREAM: &str = "sluice-audit";
/// About how many records are kept (`XADD ... MAXLEN ~`).
pub const KEEP: usize = 10_000;
/// The most bytes of any one field of a record.
pub const FIELD_BYTES: usize = 512;

/// One action, as it is recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Record {
    /// Who acted: `api operator`, `page operator 1a2b3c4d` (a session's random label), `cli
    /// <user>`, `loopback` (no token configured).
    pub who: String,
    /// What was done: the action's name, or the API call.
    pub what: String,
    /// The subscription it was about (empty for none).
    pub stream: String,
    /// Its group.
    pub group: String,
    /// How many entries it moved, when the action counts them.
    pub count: Option<u64>,
    /// What it came to, in words.
    pub result: String,
}

/// A record read back, with its id (its time on Redis's clock).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Recorded {
    /// The stream entry's id.
    pub id: String,
    /// When it was written (epoch ms, from the id).
    pub at_ms: i64,
    /// What it says.
    #[serde(flatten)]
    pub record: Record,
}

/// `text` cut to [`FIELD_BYTES`] on a character boundary.
fn cut(text: &str) -> &str {
    if text.len() <= FIELD_BYTES {
        return text;
    }
    let mut end = FIELD_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Append `record`; a failure is logged and returned (the action itself has happened).
pub async fn record<C: ConnectionLike>(conn: &mut C, record: &Record) -> redis::RedisResult<()> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(AUDIT_STREAM)
        .arg("MAXLEN")
        .arg("~")
        .arg(KEEP)
        .arg("*")
        .arg("who")
        .arg(cut(&record.who))
        .arg("what")
        .arg(cut(&record.what))
        .arg("stream")
        .arg(cut(&record.stream))
        .arg("group")
        .arg(cut(&record.group))
        .arg("result")
        .arg(cut(&record.result));
    if let Some(count) = record.count {
        cmd.arg("count").arg(count);
    }
    let written: redis::RedisResult<String> = cmd.query_async(conn).await;
    match written {
        Ok(_) => Ok(()),
        Err(err) => {
            tracing::error!(who = %record.who, what = %record.what, error = %err, "the audit stream could not be written");
            Err(err)
        }
    }
}

/// Who a command-line user is, for the record: `cli <user>@<host> (sluice <command>)`.
pub fn cli_who(command: &str) -> String {
    format!("cli {} (sluice {command})", user_at_host())
}

/// The command-line user, as `user@host`.
pub fn user_at_host() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "someone".to_owned());
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{user}@{host}")
}

/// Record what `sluice <command>` did to one subscription: how many it moved, in words.
pub async fn cli_action<C: ConnectionLike>(
    conn: &mut C,
    command: &str,
    (stream, group): (&str, &str),
    count: Option<u64>,
    result: &str,
) {
    let record = Record {
        who: cli_who(command),
        what: command.to_owned(),
        stream: stream.to_owned(),
        group: group.to_owned(),
        count,
        result: result.to_owned(),
    };
    // Logged inside; the action has happened either way.
    let _ = self::record(conn, &record).await;
}

/// One stream entry as read back: its id and fields.
type Row = (String, Vec<(String, Vec<u8>)>);

/// The newest `count` records (at most [`KEEP`]), newest first.
pub async fn recent<C: ConnectionLike>(
    conn: &mut C,
    count: usize,
) -> redis::RedisResult<Vec<Recorded>> {
    let rows: Vec<Row> = redis::cmd("XREVRANGE")
        .arg(AUDIT_STREAM)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(count.min(KEEP))
        .query_async(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, fields)| parse(id, fields))
        .collect())
}

/// A record from its stream entry; fields another writer left out stay empty.
fn parse(id: String, fields: Vec<(String, Vec<u8>)>) -> Recorded {
    let mut record = Record::default();
    for (name, value) in fields {
        let value = cut(&String::from_utf8_lossy(&value)).to_owned();
        match name.as_str() {
            "who" => record.who = value,
            "what" => record.what = value,
            "stream" => record.stream = value,
            "group" => record.group = value,
            "result" => record.result = value,
            "count" => record.count = value.parse().ok(),
            _ => {}
        }
    }
    let at_ms = id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or(0);
    Recorded { id, at_ms, record }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_cut_on_a_character_boundary() {
        let long = "é".repeat(FIELD_BYTES);
        let cut = cut(&long);
        assert!(cut.len() <= FIELD_BYTES && cut.len() >= FIELD_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_record_is_parsed_from_its_fields_and_its_id() {
        let read = parse(
            "1700000000123-0".into(),
            vec![
                ("who".into(), b"api operator".to_vec()),
                ("count".into(), b"12".to_vec()),
                ("what".into(), b"requeue".to_vec()),
            ],
        );
        assert_eq!(read.at_ms, 1_700_000_000_123);
        assert_eq!(read.record.count, Some(12));
        assert_eq!(read.record.who, "api operator");
    }
}
