//! Starting a canary for every host of the group: a record with a random id and the server's
//! times, the candidate's bytes stored, then the record sealed and written
//! (`lua/canary_start.lua`) unless another canary runs. A record there that does not verify is
//! another writer's: it holds no canary back and is replaced. The flow journal gets the entry
//! and every host's flow watcher is woken, so each joins it.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use super::record::Record;
use super::rule::Thresholds;
use super::{ABANDONED_AFTER, CanaryError, KEEP_AFTER, MAX_TEXT, ms, rfc3339, server_ms};
use crate::control::rollout::key::RolloutKey;
use crate::pipeline::admit::clean;
use crate::store::keys::{canary_key, flow_key};
use crate::support::digest::short;

/// `lua/canary_start.lua`.
static START: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/rollout/lua/canary_start")));

/// What starting a canary needs to know.
pub struct Start<'a> {
    /// The subscription's stream.
    pub stream: &'a str,
    /// Its group.
    pub group: &'a str,
    /// The candidate's bytes (checked already).
    pub bytes: &'a [u8],
    /// Its digest.
    pub candidate: &'a str,
    /// The digest serving now.
    pub incumbent: &'a str,
    /// Of 10,000 deliveries, how many the candidate takes.
    pub share_bp: u32,
    /// How long it runs.
    pub window: Duration,
    /// How it is judged.
    pub thresholds: Thresholds,
    /// Who starts it.
    pub by: &'a str,
}

/// Start a canary for every host of the group: the candidate's bytes are stored, then the
/// record sealed with `key`, unless another canary runs (a record that does not verify is not
/// one: it is replaced). The record written.
pub async fn start<C: ConnectionLike>(
    conn: &mut C,
    key: &RolloutKey,
    start: Start<'_>,
) -> Result<Record, CanaryError> {
    let err = CanaryError::redis(start.stream, start.group);
    let id = new_id().map_err(&err)?;
    let now = server_ms(conn).await.map_err(&err)?;
    let record = start.record(id, now);
    let forged = forged(conn, key, start.stream, start.group)
        .await
        .map_err(&err)?;
    let keep_ms = ms(start.window).saturating_add(ms(KEEP_AFTER));
    super::component::store(conn, start.stream, start.candidate, (start.bytes, keep_ms))
        .await
        .map_err(&err)?;
    let (started, running) = write(conn, key, &record, &forged).await.map_err(&err)?;
    if started == 0 {
        return Err(start.running(key, &running));
    }
    announce(conn, &record).await;
    crate::pipeline::admit::bump(conn, start.stream, start.group)
        .await
        .map_err(&err)?;
    Ok(record)
}

impl Start<'_> {
    /// The record of this start: the canary `id`, started `now` by the server's clock.
    fn record(&self, id: String, now: u64) -> Record {
        Record {
            id,
            stream: self.stream.to_owned(),
            group: self.group.to_owned(),
            candidate: self.candidate.to_owned(),
            incumbent: self.incumbent.to_owned(),
            share_bp: self.share_bp.min(10_000),
            started_ms: now,
            ends_ms: now.saturating_add(ms(self.window)),
            by: clean(self.by, MAX_TEXT),
            thresholds: self.thresholds,
        }
    }

    /// Why this start was refused: the canary recorded as `running` (what the script found
    /// there), named as far as it opens with `key`.
    fn running(&self, key: &RolloutKey, running: &[u8]) -> CanaryError {
        let running = Record::open(running, Some(key), self.stream, self.group).ok();
        CanaryError::Running {
            stream: self.stream.to_owned(),
            group: self.group.to_owned(),
            candidate: running
                .as_ref()
                .map_or("an unknown candidate".to_owned(), |r| {
                    short(&r.candidate).to_owned()
                }),
            ends: running.map_or_else(String::new, |r| rfc3339(r.ends_ms)),
        }
    }
}

/// A new canary's id: 16 random bytes as 32 hex digits.
fn new_id() -> redis::RedisResult<String> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::Client,
            "no randomness for the canary's id",
            e.to_string(),
        ))
    })?;
    Ok(hex::encode(id))
}

/// The canary record of `stream` and `group` when it does not open with `key` (another
/// writer's, which the start may replace); empty when there is none or it opens.
async fn forged<C: ConnectionLike>(
    conn: &mut C,
    key: &RolloutKey,
    stream: &str,
    group: &str,
) -> redis::RedisResult<Vec<u8>> {
    // What is there and does not verify is another writer's: it holds no canary back.
    let flow = crate::pipeline::admit::read(conn, stream, group).await?;
    Ok(flow
        .canary
        .filter(|raw| Record::open(raw, Some(key), stream, group).is_err())
        .unwrap_or_default())
}

/// `lua/canary_start.lua`: `record`, sealed with `key`, in place of nothing, of `forged` or of
/// a canary abandoned past its window. Whether it was written (1), and the running record
/// when not.
async fn write<C: ConnectionLike>(
    conn: &mut C,
    key: &RolloutKey,
    record: &Record,
    forged: &[u8],
) -> redis::RedisResult<(u8, Vec<u8>)> {
    START
        .key(flow_key(&record.stream, &record.group))
        .key(canary_key(&record.stream, &record.group))
        .arg(record.sealed(key))
        .arg(&record.id)
        .arg(ms(ABANDONED_AFTER))
        .arg(forged)
        .invoke_async(conn)
        .await
}

/// The flow journal's entry for the started canary `record`.
async fn announce<C: ConnectionLike>(conn: &mut C, record: &Record) {
    crate::pipeline::admit::journal::write(
        conn,
        &record.stream,
        &record.group,
        "canary started",
        &record.by,
        &format!(
            "{}% of deliveries to {} (serving {}) until {}",
            record.percent(),
            short(&record.candidate),
            short(&record.incumbent),
            rfc3339(record.ends_ms)
        ),
    )
    .await;
}
