//! A verdict written for every host of the group (`lua/canary_verdict.lua`): while its record
//! is the canary and no verdict verifies there, sealed, with the candidate's bytes deleted,
//! the flow journal's entry written and every host's flow watcher woken. The judging (see
//! [`super::report()`]), an operator's [`abort`] and a host that cannot join ([`refuse`]) all
//! end a canary this way; the first verdict written decides.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use super::record::Record;
use super::state::read;
use super::verdict::{Outcome, Verdict};
use super::{CanaryError, server_ms};
use crate::control::rollout::key::RolloutKey;
use crate::store::keys::{component_key, flow_key};

/// `lua/canary_verdict.lua`.
static VERDICT: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/rollout/lua/canary_verdict")));

/// End the running canary by an operator's word (`by`): the candidate is rolled back on every
/// host. The record it ended.
pub async fn abort<C: ConnectionLike>(
    conn: &mut C,
    key: &RolloutKey,
    stream: &str,
    group: &str,
    by: &str,
) -> Result<Record, CanaryError> {
    let not_running = || CanaryError::NotRunning {
        stream: stream.to_owned(),
        group: group.to_owned(),
    };
    let state = read(conn, Some(key), stream, group).await?;
    let record = state.record.ok_or_else(not_running)?;
    if state.verdict.is_some() {
        return Err(not_running());
    }
    let why = format!("aborted by {by}");
    let verdict = Verdict::new(&record.id, Outcome::RolledBack, &why, 0, by);
    match decide(conn, key, &record, verdict, &state.verdict_raw).await {
        Ok(true) => Ok(record),
        Ok(false) => Err(not_running()),
        Err(source) => Err(CanaryError::redis(stream, group)(source)),
    }
}

/// End the canary `record` because the host `by` cannot run its candidate (`why`): a canary
/// runs on every host of the group or on none, or entries picked for the candidate would run
/// the incumbent on that host. `seen` is the verdict field as this host last read it (one that
/// does not verify is replaced). Whether this call ended it (false: it had a verdict already).
pub async fn refuse<C: ConnectionLike>(
    conn: &mut C,
    key: &RolloutKey,
    record: &Record,
    (by, why): (&str, &str),
    seen: &[u8],
) -> redis::RedisResult<bool> {
    let why = format!("{by} could not join it: {why}");
    let verdict = Verdict::new(&record.id, Outcome::RolledBack, &why, 0, by);
    decide(conn, key, record, verdict, seen).await
}

/// Write `verdict` for `record`, sealed, while that record is the canary and the verdict field
/// holds `seen` (what this host read: nothing, or what does not verify); the candidate's bytes
/// go with it. The flow journal gets the entry and every host's flow watcher is woken. Whether
/// it was written. A verdict's time (`at_ms` 0) is the server's.
pub async fn decide<C: ConnectionLike>(
    conn: &mut C,
    key: &RolloutKey,
    record: &Record,
    mut verdict: Verdict,
    seen: &[u8],
) -> redis::RedisResult<bool> {
    if verdict.at_ms == 0 {
        verdict.at_ms = server_ms(conn).await?;
    }
    let written = write_verdict(
        conn,
        record,
        &verdict.sealed(key, &record.stream, &record.group),
        seen,
    )
    .await?;
    if written {
        let what = match verdict.outcome {
            Outcome::Promoted => "canary promoted",
            Outcome::RolledBack => "canary rolled back",
        };
        crate::pipeline::admit::journal::write(
            conn,
            &record.stream,
            &record.group,
            what,
            &verdict.by,
            &verdict.why,
        )
        .await;
        crate::pipeline::admit::bump(conn, &record.stream, &record.group).await?;
    }
    Ok(written)
}

/// `lua/canary_verdict.lua`: `sealed` in place of `seen`, while `record` is the canary.
pub async fn write_verdict<C: ConnectionLike>(
    conn: &mut C,
    record: &Record,
    sealed: &str,
    seen: &[u8],
) -> redis::RedisResult<bool> {
    let written: u8 = VERDICT
        .key(flow_key(&record.stream, &record.group))
        .key(component_key(&record.stream, &record.candidate))
        .arg(sealed)
        .arg(&record.id)
        .arg(seen)
        .invoke_async(conn)
        .await?;
    Ok(written == 1)
}
