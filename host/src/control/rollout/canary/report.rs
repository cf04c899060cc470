//! A host's report: what its attempts came to since the last one, per version, added to the
//! group's counts of the canary and judged in the same call (`lua/canary_report.lua`, by the
//! [`super::rule`] the record carries). The script only answers what it judged: the host
//! seals that verdict and writes it ([`super::decide()`]); the first written decides for every
//! host, and every later report reads it.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use super::decide::decide;
use super::record::Record;
use super::verdict::{Outcome, Verdict};
use super::{KEEP_AFTER, ms};
use crate::control::rollout::key::RolloutKey;
use crate::handler::Tally;
use crate::store::keys::{canary_key, flow_key};

/// `lua/canary_report.lua`.
static REPORT_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/rollout/lua/canary_report")));

/// What a report found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// The canary is no longer recorded (replaced or removed).
    Gone,
    /// Still running.
    Running,
    /// A verdict for this record is there whose seal does not verify (another writer's): its
    /// field as read, for the next report to read past and a verdict to replace.
    Forged(Vec<u8>),
    /// Judged: by this call (`new`) or an earlier one.
    Decided {
        /// The verdict.
        verdict: Verdict,
        /// Whether this call wrote it.
        new: bool,
    },
}

/// Add `incumbent` and `candidate` to the group's counts of the canary `record` and judge it;
/// `by` names this host in a verdict it writes, sealed with `key`; `forged` is a verdict field
/// found not to verify (read as none).
pub async fn report<C: ConnectionLike>(
    conn: &mut C,
    key: &RolloutKey,
    record: &Record,
    (by, forged): (&str, &[u8]),
    tallies: (&Tally, &Tally),
) -> redis::RedisResult<Reported> {
    let answer = judge(conn, record, forged, tallies).await?;
    let text = |i: usize| {
        answer
            .get(i)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let labels = (record.stream.as_str(), record.group.as_str());
    Ok(match text(0).as_deref() {
        Some("running") => Reported::Running,
        Some("verdict") => {
            let raw = answer.get(1).cloned().unwrap_or_default();
            match Verdict::open(&raw, Some(key), labels, &record.id) {
                Ok(verdict) => Reported::Decided {
                    verdict,
                    new: false,
                },
                Err(_) => Reported::Forged(raw),
            }
        }
        Some("judged") => {
            let outcome = match text(1).as_deref() {
                Some("promoted") => Outcome::Promoted,
                _ => Outcome::RolledBack,
            };
            let at_ms = text(3).and_then(|t| t.parse().ok()).unwrap_or(0);
            let verdict =
                Verdict::new(&record.id, outcome, &text(2).unwrap_or_default(), at_ms, by);
            if decide(conn, key, record, verdict.clone(), forged).await? {
                Reported::Decided { verdict, new: true }
            } else {
                // Another host decided first: the next report reads its verdict.
                Reported::Running
            }
        }
        _ => Reported::Gone,
    })
}

/// `lua/canary_report.lua` for `record` with this host's `(incumbent, candidate)` counts,
/// reading `forged` as no verdict: its answer (`running`, `verdict` and the field, `judged`
/// and the outcome, why and when, or nothing when the canary is gone).
async fn judge<C: ConnectionLike>(
    conn: &mut C,
    record: &Record,
    forged: &[u8],
    (incumbent, candidate): (&Tally, &Tally),
) -> redis::RedisResult<Vec<Vec<u8>>> {
    let keep_ms = record
        .ends_ms
        .saturating_sub(record.started_ms)
        .saturating_add(ms(KEEP_AFTER));
    let mut invocation = REPORT_SCRIPT.key(flow_key(&record.stream, &record.group));
    invocation
        .key(canary_key(&record.stream, &record.group))
        .arg(&record.id)
        .arg(record.ends_ms);
    record.thresholds.add_to(&mut invocation);
    invocation.arg(keep_ms).arg(forged);
    for tally in [incumbent, candidate] {
        invocation
            .arg(tally.attempts)
            .arg(tally.failures)
            .arg(tally.dead_letters)
            .arg(tally.retries)
            .arg(tally.buckets.len());
        for (bucket, count) in &tally.buckets {
            invocation.arg(*bucket).arg(*count);
        }
    }
    invocation.invoke_async(conn).await
}
