//! A canary in Redis: its sealed record, its verdict, and the scripts that start, judge and
//! abort it for every host of the group at once.
//!
//! - **Record**: the flow hash's `canary` field (`crate::pipeline::admit::CANARY`), so every host learns
//!   of it the way it learns of a pause. Its body (id, candidate and incumbent digests, share,
//!   start and end by the server's clock, thresholds, who) is sealed with the hosts' rollout
//!   key ([`super::key`]), which Redis never holds: a writer to Redis, whatever it reads there,
//!   cannot make the hosts run a component of its own. The candidate's bytes wait under
//!   [`crate::store::keys::component_key`]; a host checks them against the sealed digest.
//! - **Verdict**: sealed with the same key over the record's id, and written by a host
//!   (`lua/canary_verdict.lua`) only while no verdict for that record is there, or in place of
//!   one that does not verify; with it the candidate's bytes are deleted. A record's life is one
//!   way (running, then promoted or rolled back): a host that saw a verdict writes it back if it
//!   goes, and never joins that record again.
//! - **Judging** (`lua/canary_report.lua`): each host adds what its attempts came to, per
//!   version, every [`REPORT`], and the same call judges the group's totals: a rate (failure,
//!   dead letter, retry) whose lowest value the candidate's counts allow is above the highest
//!   the incumbent's allow plus the allowed increase (Wilson bounds, one-sided 99.95 % during
//!   the window, which is looked at hundreds of times, 99 % at its end) rolls the candidate
//!   back, at once during the window, as does a p99 handler time above the ratio; otherwise the
//!   window's end promotes it (or rolls it back if it had too few attempts to judge). The
//!   script only answers what it judged: the host seals it, and the first to write it
//!   (`canary-verdict`) decides for every host; every later report reads it.
//! - **Bounds**: the record and verdict are read through the flow module's bounded read; the
//!   judging script reads only its own 248 count fields, counts that are not numbers read as
//!   nothing (and are started again by the next report), counts above the attempts as the
//!   attempts; the component's bytes are read only up to `admin_max_upload`; what is shown
//!   of who and why is cut like a pause's.

use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use super::key::{RolloutKey, Use};
use crate::handler::{TIME_BUCKETS, Tally, bucket_floor_us};
use crate::pipeline::admit::clean;
use crate::store::keys::{canary_key, component_key, flow_key};

/// How often a host adds its counts to the group's and asks for the verdict.
pub const REPORT: Duration = Duration::from_millis(500);
/// How long after a canary's end without a verdict (every host judging it gone) another may
/// replace it, and a host ends its part on its own.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60);
/// How long after a canary starts its candidate begins taking entries (those added from then
/// on): the hosts see the record within a poll, and fetch and check the candidate meanwhile.
pub const JOIN_GRACE: Duration = Duration::from_secs(2);
/// The z of the bounds a canary is judged by at its window's end: one-sided 99 %.
const Z_END: f64 = 2.326;
/// The z during the window, where the counts are judged at every report (hundreds of looks):
/// one-sided 99.95 %, so that an equal candidate is not rolled back by one unlucky look.
const Z_WINDOW: f64 = 3.29;
/// How long a canary's counts and its candidate's bytes stay in Redis after its window.
pub const KEEP_AFTER: Duration = Duration::from_secs(7 * 86_400);
/// The longest "who" and "why" kept, in characters.
const MAX_TEXT: usize = 500;
/// Why a host without a rollout key neither starts nor joins a canary.
pub const NO_KEY: &str = "this host holds no rollout key (set rollout_key_file or rollout_key_env, or an admin token, the same on every host of the group): a canary makes hosts run code from Redis, which only a key Redis does not hold may allow";

/// How a canary is judged, as its record carries it: every host judges by the same numbers,
/// whatever its own configuration says.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Thresholds {
    /// See [`crate::config::Canary::failure_rate_increase`].
    pub failure_rate_increase: f64,
    /// See [`crate::config::Canary::dead_letter_rate_increase`].
    pub dead_letter_rate_increase: f64,
    /// See [`crate::config::Canary::retry_rate_increase`].
    pub retry_rate_increase: f64,
    /// See [`crate::config::Canary::p99_ratio`].
    pub p99_ratio: f64,
    /// See [`crate::config::Canary::p99_slack`], in milliseconds.
    pub p99_slack_ms: u64,
    /// See [`crate::config::Canary::min_deliveries`].
    pub min_deliveries: u64,
}

impl From<&crate::config::Canary> for Thresholds {
    fn from(c: &crate::config::Canary) -> Self {
        Self {
            failure_rate_increase: c.failure_rate_increase,
            dead_letter_rate_increase: c.dead_letter_rate_increase,
            retry_rate_increase: c.retry_rate_increase,
            p99_ratio: c.p99_ratio,
            p99_slack_ms: u64::try_from(c.p99_slack.as_millis()).unwrap_or(u64::MAX),
            min_deliveries: c.min_deliveries,
        }
    }
}

/// A canary, as its sealed record says.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// Random, 32 hex digits: names this canary (and keys which entries it tries).
    pub id: String,
    /// The subscription's stream.
    pub stream: String,
    /// Its group.
    pub group: String,
    /// The candidate's digest.
    pub candidate: String,
    /// The digest that served on the host that started it.
    pub incumbent: String,
    /// Of 10,000 deliveries, how many the candidate takes.
    pub share_bp: u32,
    /// When it started (ms since the Unix epoch, the server's clock).
    pub started_ms: u64,
    /// When its window ends.
    pub ends_ms: u64,
    /// Who started it.
    pub by: String,
    /// How it is judged.
    pub thresholds: Thresholds,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Sealed {
    body: String,
    seal: String,
}

impl Sealed {
    /// The body stored as `raw`, if it is sealed with `key` for `use_` over `parts` and the
    /// body; otherwise why not (`what` names it: "record", "verdict").
    fn open(
        raw: &[u8],
        key: Option<&RolloutKey>,
        (use_, what): (Use, &str),
        parts: &[&[u8]],
    ) -> Result<String, String> {
        let sealed: Sealed = serde_json::from_slice(raw)
            .map_err(|_| format!("the canary {what} is not Sluice's (not sealed)"))?;
        let key = key.ok_or_else(|| NO_KEY.to_owned())?;
        let mut all = parts.to_vec();
        all.push(sealed.body.as_bytes());
        if !key.verify(use_, &all, &sealed.seal) {
            return Err(format!(
                "the canary {what}'s seal does not verify with this host's rollout key (written by something that does not hold it, or by a host with another rollout key)"
            ));
        }
        Ok(sealed.body)
    }
}

impl Record {
    /// The record as stored: its body and the seal over stream, group and body.
    fn sealed(&self, key: &RolloutKey) -> String {
        // A struct of strings and numbers always serializes.
        let body = serde_json::to_string(self).unwrap_or_default();
        let seal = key.seal(
            Use::Record,
            &[
                self.stream.as_bytes(),
                self.group.as_bytes(),
                body.as_bytes(),
            ],
        );
        serde_json::to_string(&Sealed { body, seal }).unwrap_or_default()
    }

    /// The record stored as `raw` for the subscription to `stream` with `group`, if its seal
    /// verifies with `key` and it is for that subscription; otherwise why not.
    pub fn open(
        raw: &[u8],
        key: Option<&RolloutKey>,
        stream: &str,
        group: &str,
    ) -> Result<Self, String> {
        let body = Sealed::open(
            raw,
            key,
            (Use::Record, "record"),
            &[stream.as_bytes(), group.as_bytes()],
        )?;
        let record: Self = serde_json::from_str(&body)
            .map_err(|err| format!("the canary record's body does not read: {err}"))?;
        if record.stream != stream || record.group != group {
            return Err("the canary record names another subscription".to_owned());
        }
        Ok(record)
    }

    /// From when entries may run the candidate (see [`crate::handler::takes`]): [`JOIN_GRACE`]
    /// after the start, by when every host has seen the record.
    pub fn from_ms(&self) -> u64 {
        self.started_ms
            .saturating_add(u64::try_from(JOIN_GRACE.as_millis()).unwrap_or(0))
    }

    /// The share as a percentage.
    pub fn percent(&self) -> f64 {
        f64::from(self.share_bp) / 100.0
    }

    /// Its JSON for the API and the page.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "candidate": self.candidate,
            "incumbent": self.incumbent,
            "share_percent": self.percent(),
            "share_basis_points": self.share_bp,
            "eligible_from": crate::support::when::rfc3339_ms(i64::try_from(self.from_ms()).unwrap_or(i64::MAX)),
            "eligible_from_ms": self.from_ms(),
            "started": crate::support::when::rfc3339_ms(i64::try_from(self.started_ms).unwrap_or(i64::MAX)),
            "ends": crate::support::when::rfc3339_ms(i64::try_from(self.ends_ms).unwrap_or(i64::MAX)),
            "by": self.by,
            "thresholds": self.thresholds,
        })
    }
}

/// How a canary ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The candidate serves every delivery now.
    Promoted,
    /// The incumbent serves every delivery again.
    RolledBack,
}

impl Outcome {
    /// Its name in Redis, the API and the log.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Promoted => "promoted",
            Outcome::RolledBack => "rolled-back",
        }
    }
}

/// A canary's verdict, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The canary it is for.
    pub id: String,
    /// Promoted or rolled back.
    pub outcome: Outcome,
    /// Why, bounded.
    pub why: String,
    /// When (ms since the Unix epoch, server clock).
    pub at_ms: u64,
    /// Which host or operator decided, bounded.
    pub by: String,
}

impl Verdict {
    /// A new verdict for the canary `id`, its texts bounded.
    pub fn new(id: &str, outcome: Outcome, why: &str, at_ms: u64, by: &str) -> Self {
        Self {
            id: id.to_owned(),
            outcome,
            why: clean(why, MAX_TEXT),
            at_ms,
            by: clean(by, MAX_TEXT),
        }
    }

    /// The verdict as stored for the record of `stream` and `group`: its body and the seal
    /// over stream, group, the record's id and the body.
    pub fn sealed(&self, key: &RolloutKey, stream: &str, group: &str) -> String {
        let body = serde_json::json!({
            "id": self.id,
            "verdict": self.outcome.name(),
            "why": self.why,
            "at_ms": self.at_ms,
            "by": self.by,
        })
        .to_string();
        let seal = key.seal(
            Use::Verdict,
            &[
                stream.as_bytes(),
                group.as_bytes(),
                self.id.as_bytes(),
                body.as_bytes(),
            ],
        );
        serde_json::to_string(&Sealed { body, seal }).unwrap_or_default()
    }

    /// The verdict stored as `raw` for the record `id` of `stream` and `group`, if its seal
    /// verifies with `key`; otherwise why not (anything else is another writer's).
    pub fn open(
        raw: &[u8],
        key: Option<&RolloutKey>,
        (stream, group): (&str, &str),
        id: &str,
    ) -> Result<Self, String> {
        let body = Sealed::open(
            raw,
            key,
            (Use::Verdict, "verdict"),
            &[stream.as_bytes(), group.as_bytes(), id.as_bytes()],
        )?;
        let value: serde_json::Value = serde_json::from_str(&body)
            .map_err(|err| format!("the canary verdict's body does not read: {err}"))?;
        let text = |name: &str| {
            value
                .get(name)
                .and_then(serde_json::Value::as_str)
                .map(|t| clean(t, MAX_TEXT))
        };
        let outcome = match value.get("verdict").and_then(serde_json::Value::as_str) {
            Some("promoted") => Outcome::Promoted,
            Some("rolled-back") => Outcome::RolledBack,
            _ => return Err("the canary verdict names no outcome".to_owned()),
        };
        if text("id").as_deref() != Some(id) {
            return Err("the canary verdict is for another record".to_owned());
        }
        Ok(Self {
            id: id.to_owned(),
            outcome,
            why: text("why").unwrap_or_default(),
            at_ms: value
                .get("at_ms")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            by: text("by").unwrap_or_default(),
        })
    }

    /// Its JSON for the API and the page.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "verdict": self.outcome.name(),
            "why": self.why,
            "at": crate::support::when::rfc3339_ms(i64::try_from(self.at_ms).unwrap_or(i64::MAX)),
            "by": self.by,
        })
    }
}

/// Why a canary could not be started, judged or read.
#[derive(Debug, thiserror::Error)]
pub enum CanaryError {
    /// Redis refused or could not be reached.
    #[error("cannot reach the canary of stream `{stream}` group `{group}` in Redis")]
    Redis {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// What Redis said.
        #[source]
        source: redis::RedisError,
    },
    /// The stream's secret could not be read or made.
    #[error(transparent)]
    Secret(#[from] crate::store::keys::SecretError),
    /// Another canary runs.
    #[error(
        "a canary of {candidate} runs on stream `{stream}` group `{group}` until {ends}; wait for its verdict or abort it first"
    )]
    Running {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The running canary's candidate (short digest).
        candidate: String,
        /// When its window ends.
        ends: String,
    },
    /// No canary runs (to abort).
    #[error("no canary runs on stream `{stream}` group `{group}`")]
    NotRunning {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
    },
    /// The candidate's bytes are not in Redis, or not what the record names.
    #[error("the candidate {digest} cannot be fetched from Redis: {why}")]
    Fetch {
        /// Its digest.
        digest: String,
        /// Why.
        why: String,
    },
}

/// The time by the server's clock, in ms since the Unix epoch (`TIME`, as the page reads it).
pub async fn server_ms<C: ConnectionLike>(conn: &mut C) -> redis::RedisResult<u64> {
    Ok(u64::try_from(crate::store::inspect::server_now_ms(conn).await?).unwrap_or(0))
}

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
    static START: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
        Script::new(crate::store::lua!("control/rollout/lua/canary_start"))
    });
    let err = |source| CanaryError::Redis {
        stream: start.stream.to_owned(),
        group: start.group.to_owned(),
        source,
    };
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| {
        err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "no randomness for the canary's id",
            e.to_string(),
        )))
    })?;
    let now = server_ms(conn).await.map_err(err)?;
    let window_ms = u64::try_from(start.window.as_millis()).unwrap_or(u64::MAX);
    let record = Record {
        id: hex::encode(id),
        stream: start.stream.to_owned(),
        group: start.group.to_owned(),
        candidate: start.candidate.to_owned(),
        incumbent: start.incumbent.to_owned(),
        share_bp: start.share_bp.min(10_000),
        started_ms: now,
        ends_ms: now.saturating_add(window_ms),
        by: clean(start.by, MAX_TEXT),
        thresholds: start.thresholds,
    };
    // What is there and does not verify is another writer's: it holds no canary back.
    let flow = crate::pipeline::admit::read(conn, start.stream, start.group)
        .await
        .map_err(err)?;
    let forged = flow
        .canary
        .filter(|raw| Record::open(raw, Some(key), start.stream, start.group).is_err())
        .unwrap_or_default();
    let keep_ms = window_ms.saturating_add(u64::try_from(KEEP_AFTER.as_millis()).unwrap_or(0));
    redis::cmd("SET")
        .arg(component_key(start.stream, start.candidate))
        .arg(start.bytes)
        .arg("PX")
        .arg(keep_ms)
        .query_async::<()>(conn)
        .await
        .map_err(err)?;
    let (started, running): (u8, Vec<u8>) = START
        .key(flow_key(start.stream, start.group))
        .key(canary_key(start.stream, start.group))
        .arg(record.sealed(key))
        .arg(&record.id)
        .arg(u64::try_from(ABANDONED_AFTER.as_millis()).unwrap_or(u64::MAX))
        .arg(forged)
        .invoke_async(conn)
        .await
        .map_err(err)?;
    if started == 0 {
        let running = Record::open(&running, Some(key), start.stream, start.group).ok();
        return Err(CanaryError::Running {
            stream: start.stream.to_owned(),
            group: start.group.to_owned(),
            candidate: running
                .as_ref()
                .map_or("an unknown candidate".to_owned(), |r| short(&r.candidate)),
            ends: running.map_or_else(String::new, |r| {
                crate::support::when::rfc3339_ms(i64::try_from(r.ends_ms).unwrap_or(i64::MAX))
            }),
        });
    }
    crate::pipeline::admit::journal::write(
        conn,
        start.stream,
        start.group,
        "canary started",
        &record.by,
        &format!(
            "{}% of deliveries to {} (serving {}) until {}",
            record.percent(),
            short(&record.candidate),
            short(&record.incumbent),
            crate::support::when::rfc3339_ms(i64::try_from(record.ends_ms).unwrap_or(i64::MAX))
        ),
    )
    .await;
    crate::pipeline::admit::bump(conn, start.stream, start.group)
        .await
        .map_err(err)?;
    Ok(record)
}

/// The first 12 hex digits of a digest, as logs show it.
pub fn short(digest: &str) -> String {
    digest.chars().take(12).collect()
}

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
        Err(source) => Err(CanaryError::Redis {
            stream: stream.to_owned(),
            group: group.to_owned(),
            source,
        }),
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
    static VERDICT: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
        Script::new(crate::store::lua!("control/rollout/lua/canary_verdict"))
    });
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
    let err = |source| CanaryError::Redis {
        stream: stream.to_owned(),
        group: group.to_owned(),
        source,
    };
    let flow = crate::pipeline::admit::read(conn, stream, group)
        .await
        .map_err(err)?;
    let Some(raw) = flow.canary else {
        return Ok(CanaryState::default());
    };
    let (record, refused) = match Record::open(&raw, key, stream, group) {
        Ok(record) => (Some(record), None),
        Err(why) => (None, Some(why)),
    };
    let Some(record) = record else {
        return Ok(CanaryState {
            refused,
            ..CanaryState::default()
        });
    };
    let verdict_raw = flow.canary_verdict.unwrap_or_default();
    let (verdict, verdict_refused) = if verdict_raw.is_empty() {
        (None, None)
    } else {
        match Verdict::open(&verdict_raw, key, (stream, group), &record.id) {
            Ok(verdict) => (Some(verdict), None),
            // A verdict of an earlier canary is no verdict of this one.
            Err(_) if !contains(&verdict_raw, record.id.as_bytes()) => (None, None),
            Err(why) => (None, Some(why)),
        }
    };
    let key = canary_key(stream, group);
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
        let values: Vec<Option<String>> = cmd.query_async(conn).await.map_err(err)?;
        totals.push(Totals::from_fields(&values));
    }
    let id: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("id")
        .query_async(conn)
        .await
        .map_err(err)?;
    if id.as_deref() != Some(record.id.as_str()) {
        totals = vec![Totals::default(), Totals::default()];
    }
    let candidate = totals.pop().unwrap_or_default();
    let incumbent = totals.pop().unwrap_or_default();
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

/// Whether `needle` is in `haystack` (as the scripts' `string.find` looks for a record's id).
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

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
    (incumbent, candidate): (&Tally, &Tally),
) -> redis::RedisResult<Reported> {
    static REPORT_SCRIPT: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
        Script::new(crate::store::lua!("control/rollout/lua/canary_report"))
    });
    let t = &record.thresholds;
    let keep_ms = record
        .ends_ms
        .saturating_sub(record.started_ms)
        .saturating_add(u64::try_from(KEEP_AFTER.as_millis()).unwrap_or(0));
    let mut invocation = REPORT_SCRIPT.key(flow_key(&record.stream, &record.group));
    invocation
        .key(canary_key(&record.stream, &record.group))
        .arg(&record.id)
        .arg(record.ends_ms)
        .arg(t.failure_rate_increase)
        .arg(t.dead_letter_rate_increase)
        .arg(t.retry_rate_increase)
        .arg(t.p99_ratio)
        .arg(t.p99_slack_ms.saturating_mul(1000))
        .arg(t.min_deliveries)
        .arg(Z_WINDOW)
        .arg(Z_END)
        .arg(keep_ms)
        .arg(forged);
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
    let answer: Vec<Vec<u8>> = invocation.invoke_async(conn).await?;
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

/// The candidate's bytes, from Redis: at most `max` of them, and only when they are the
/// component `digest` names.
pub async fn fetch_component<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    digest: &str,
    max: u64,
) -> Result<Vec<u8>, CanaryError> {
    let failed = |why: String| CanaryError::Fetch {
        digest: short(digest),
        why,
    };
    let key = component_key(stream, digest);
    let len: u64 = redis::cmd("STRLEN")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if len == 0 {
        return Err(failed(format!("`{key}` is missing or empty")));
    }
    if len > max {
        return Err(failed(format!(
            "`{key}` holds {len} bytes, more than admin_max_upload ({max})"
        )));
    }
    let bytes: Vec<u8> = redis::cmd("GETRANGE")
        .arg(&key)
        .arg(0)
        .arg(max.saturating_sub(1))
        .query_async(conn)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let found = crate::support::digest::Digest::of(&bytes);
    if found.as_str() != digest {
        return Err(failed(format!(
            "`{key}` holds a component whose digest is {}, not the one the record names",
            found.short()
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            id: "0123456789abcdef0123456789abcdef".to_owned(),
            stream: "orders".to_owned(),
            group: "billing".to_owned(),
            candidate: "c".repeat(64),
            incumbent: "i".repeat(64),
            share_bp: 1000,
            started_ms: 1,
            ends_ms: 2,
            by: "ops".to_owned(),
            thresholds: Thresholds::from(&crate::config::Canary::default()),
        }
    }

    fn key(material: &str) -> RolloutKey {
        RolloutKey::derive(material, super::super::key::Origin::AdminToken)
    }

    #[test]
    fn only_a_record_sealed_for_its_subscription_opens() {
        let k = key("s3cret");
        let sealed = record().sealed(&k);
        assert_eq!(
            Record::open(sealed.as_bytes(), Some(&k), "orders", "billing"),
            Ok(record())
        );
        // Another key, another subscription, no key, an edited body: refused.
        assert!(Record::open(sealed.as_bytes(), Some(&key("other")), "orders", "billing").is_err());
        assert!(Record::open(sealed.as_bytes(), Some(&k), "orders", "audit").is_err());
        assert!(Record::open(sealed.as_bytes(), None, "orders", "billing").is_err());
        let edited = sealed.replace("\\\"share_bp\\\":1000", "\\\"share_bp\\\":10000");
        assert_ne!(edited, sealed);
        assert!(Record::open(edited.as_bytes(), Some(&k), "orders", "billing").is_err());
        assert!(Record::open(b"garbage", Some(&k), "orders", "billing").is_err());
    }

    #[test]
    fn verdicts_are_bounded_sealed_and_bound_to_their_record() {
        let k = key("s3cret");
        let long = "x".repeat(10_000);
        let v = Verdict::new("abc", Outcome::Promoted, &long, 5, "host\u{1b}[2J");
        let sealed = v.sealed(&k, "orders", "billing");
        let read = Verdict::open(sealed.as_bytes(), Some(&k), ("orders", "billing"), "abc")
            .expect("a verdict");
        assert_eq!(read.why.chars().count(), MAX_TEXT);
        assert_eq!(read.by, "host[2J");
        assert_eq!(read.outcome, Outcome::Promoted);
        assert_eq!(read.at_ms, 5);
        // Another record, subscription or key; the unsealed form; an edited outcome: refused.
        assert!(Verdict::open(sealed.as_bytes(), Some(&k), ("orders", "billing"), "abd").is_err());
        assert!(Verdict::open(sealed.as_bytes(), Some(&k), ("orders", "audit"), "abc").is_err());
        assert!(
            Verdict::open(
                sealed.as_bytes(),
                Some(&key("x")),
                ("orders", "billing"),
                "abc"
            )
            .is_err()
        );
        let plain = br#"{"id":"abc","verdict":"promoted","why":"","at_ms":1,"by":"x"}"#;
        assert!(Verdict::open(plain, Some(&k), ("orders", "billing"), "abc").is_err());
        let edited = sealed.replace("promoted", "rolled-back");
        assert!(Verdict::open(edited.as_bytes(), Some(&k), ("orders", "billing"), "abc").is_err());
    }

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
