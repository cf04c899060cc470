//! A subscription's canary as Redis holds it, read for the API, the page and an abort: the
//! record (opened with the rollout key), its verdict, and both versions' [`Totals`] for the
//! group, with the p99 read from the handler-time buckets the reports add up.

use redis::aio::ConnectionLike;

use super::CanaryError;
use super::record::Record;
use super::verdict::Verdict;
use crate::control::rollout::key::RolloutKey;
use crate::handler::{TIME_BUCKETS, bucket_floor_us};
use crate::store::keys::canary_key;

/// One version's totals in a canary, for the group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Attempts that ran the handler.
    pub attempts: u64,
    /// Traps and limits.
    pub failures: u64,
    /// Dead letters.
    pub dead_letters: u64,
    /// Retries.
    pub retries: u64,
    /// The handler time's p99 (the upper edge of its bucket), in ms, when there are times.
    pub p99_ms: Option<f64>,
}

impl Totals {
    fn from_fields(values: &[Option<String>]) -> Self {
        let num = |i: usize| {
            values
                .get(i)
                .and_then(Option::as_deref)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let buckets: Vec<u64> = (0..TIME_BUCKETS).map(|b| num(4 + b)).collect();
        let timed: u64 = buckets.iter().sum();
        let p99_ms = (timed > 0).then(|| {
            let want = (timed as f64 * 0.99).ceil() as u64;
            let mut seen = 0;
            let bucket = buckets
                .iter()
                .position(|n| {
                    seen += n;
                    seen >= want
                })
                .unwrap_or(TIME_BUCKETS - 1);
            bucket_floor_us(bucket + 1) / 1000.0
        });
        Self {
            attempts: num(0),
            failures: num(1),
            dead_letters: num(2),
            retries: num(3),
            p99_ms,
        }
    }

    fn rate(&self, n: u64) -> f64 {
        if self.attempts == 0 {
            0.0
        } else {
            n as f64 / self.attempts as f64
        }
    }

    /// Its JSON for the API and the page.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "attempts": self.attempts,
            "failures": self.failures,
            "dead_letters": self.dead_letters,
            "retries": self.retries,
            "failure_rate": self.rate(self.failures),
            "dead_letter_rate": self.rate(self.dead_letters),
            "retry_rate": self.rate(self.retries),
            "p99_ms": self.p99_ms,
        })
    }
}

/// A subscription's canary as Redis holds it: the last record (checked), its verdict, and
/// both versions' totals for the group.
#[derive(Debug, Clone, Default)]
pub struct CanaryState {
    /// The record, when there is one and its seal verifies.
    pub record: Option<Record>,
    /// Why a record that is there was not taken, if it was not.
    pub refused: Option<String>,
    /// The verdict, when it is for this record and its seal verifies.
    pub verdict: Option<Verdict>,
    /// The verdict field as read (what a new verdict may replace when `verdict` is `None`).
    pub verdict_raw: Vec<u8>,
    /// Why a verdict for this record that is there was not taken, if it was not.
    pub verdict_refused: Option<String>,
    /// The incumbent's totals.
    pub incumbent: Totals,
    /// The candidate's totals.
    pub candidate: Totals,
}

impl CanaryState {
    /// Whether the canary runs (a record without its verdict).
    pub fn running(&self) -> bool {
        self.record.is_some() && self.verdict.is_none()
    }

    /// Its JSON for the API and the page.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "running": self.running(),
            "record": self.record.as_ref().map(Record::to_json),
            "refused": self.refused,
            "verdict": self.verdict.as_ref().map(Verdict::to_json),
            "verdict_refused": self.verdict_refused,
            "incumbent": self.incumbent.to_json(),
            "candidate": self.candidate.to_json(),
        })
    }
}

/// The canary of the subscription to `stream` with `group`, as Redis holds it and `key`
/// verifies it.
pub async fn read<C: ConnectionLike>(
    conn: &mut C,
    key: Option<&RolloutKey>,
    stream: &str,
    group: &str,
) -> Result<CanaryState, CanaryError> {
    let err = CanaryError::redis(stream, group);
    let flow = crate::pipeline::admit::read(conn, stream, group)
        .await
        .map_err(&err)?;
    let Some(raw) = flow.canary else {
        return Ok(CanaryState::default());
    };
    let record = match Record::open(&raw, key, stream, group) {
        Ok(record) => record,
        Err(why) => {
            return Ok(CanaryState {
                refused: Some(why),
                ..CanaryState::default()
            });
        }
    };
    let verdict_raw = flow.canary_verdict.unwrap_or_default();
    let (verdict, verdict_refused) = verdict_of(&verdict_raw, key, &record);
    let (incumbent, candidate) = totals(conn, &record).await.map_err(&err)?;
    Ok(CanaryState {
        record: Some(record),
        refused: None,
        verdict,
        verdict_raw,
        verdict_refused,
        incumbent,
        candidate,
    })
}

/// The verdict field `raw` read for `record`: its verdict when the seal verifies, or why one
/// for this record was refused; a verdict of an earlier canary (or none) is neither.
fn verdict_of(
    raw: &[u8],
    key: Option<&RolloutKey>,
    record: &Record,
) -> (Option<Verdict>, Option<String>) {
    if raw.is_empty() {
        return (None, None);
    }
    match Verdict::open(raw, key, (&record.stream, &record.group), &record.id) {
        Ok(verdict) => (Some(verdict), None),
        // A verdict of an earlier canary is no verdict of this one.
        Err(_) if !contains(raw, record.id.as_bytes()) => (None, None),
        Err(why) => (None, Some(why)),
    }
}

/// The incumbent's and the candidate's totals of `record` for the group; nothing counted yet
/// when the counts are another canary's.
async fn totals<C: ConnectionLike>(
    conn: &mut C,
    record: &Record,
) -> redis::RedisResult<(Totals, Totals)> {
    let key = canary_key(&record.stream, &record.group);
    let mut totals = Vec::new();
    for role in ["i", "c"] {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&key);
        for name in ["attempts", "failures", "dead_letters", "retries"] {
            cmd.arg(format!("{role}:{name}"));
        }
        for b in 0..TIME_BUCKETS {
            cmd.arg(format!("{role}:h:{b}"));
        }
        let values: Vec<Option<String>> = cmd.query_async(conn).await?;
        totals.push(Totals::from_fields(&values));
    }
    let id: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("id")
        .query_async(conn)
        .await?;
    if id.as_deref() != Some(record.id.as_str()) {
        return Ok((Totals::default(), Totals::default()));
    }
    let candidate = totals.pop().unwrap_or_default();
    let incumbent = totals.pop().unwrap_or_default();
    Ok((incumbent, candidate))
}

/// Whether `needle` is in `haystack` (as the scripts' `string.find` looks for a record's id).
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_reads_the_bucket_that_holds_it() {
        let mut fields = vec![Some("100".to_owned()); 4];
        fields.extend((0..TIME_BUCKETS).map(|_| None));
        // 99 fast (bucket 40, about 1 ms) and one slow (bucket 60, about 32 ms).
        fields[4 + 40] = Some("99".to_owned());
        fields[4 + 60] = Some("1".to_owned());
        let t = Totals::from_fields(&fields);
        let p99 = t.p99_ms.expect("times");
        assert!((1.0..1.3).contains(&p99), "{p99}");
        fields[4 + 60] = Some("2".to_owned());
        let t = Totals::from_fields(&fields);
        assert!(t.p99_ms.expect("times") > 30.0);
        // Garbage another writer left reads as nothing.
        fields[0] = Some("lots".to_owned());
        assert_eq!(Totals::from_fields(&fields).attempts, 0);
    }
}
