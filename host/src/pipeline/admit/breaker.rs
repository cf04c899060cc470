//! A subscription's circuit breaker, shared by every host of its group through Redis: when
//! most deliveries fail because the handler's world is broken, stop taking entries instead of
//! burning their attempts.
//!
//! - **Counting**: each host counts its attempts and their failures (traps, limits, and
//!   retries the handler marked "downstream down") and adds them every [`FLUSH`] to the group's
//!   window in Redis (`lua/breaker_record.lua`: 30 slots over `window`, in the stream's hash
//!   slot). The call that finds at least `min_deliveries` in the window with at least
//!   `failure_rate` of them failed opens the breaker: a `breaker` record in the flow hash, with
//!   when it may probe. That host bumps the flow epoch, so every host stops reading within
//!   about [`super::POLL`], as for a pause (new entries, due retries, retries that stay pending:
//!   all wait, and no attempt is counted).
//! - **Probing**: once `open_for` has passed, a host asks for a probe (`lua/breaker_probe.lua`):
//!   the first to ask moves the breaker to half-open with `probes` permits for the group; each
//!   permit lets one delivery through. Its answer (`lua/breaker_result.lua`) closes the breaker
//!   (success: everything reads again) or opens it for another `open_for` (failure). A round
//!   whose permits were all taken and never answered (a host died with one) starts again after
//!   `open_for`.
//! - **Bounds**: the window's script reads only its own 90 fields; a `breaker` record that is
//!   not Sluice's counts as open (never as closed) and a probe time more than two days ahead is
//!   taken as now; what is shown of a record is bounded like a pause's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Script;
use tokio_util::sync::CancellationToken;

use crate::config::CircuitBreaker;
use crate::observe::metrics::{Metrics, TransitionLabels};
use crate::store::redis_conn::RedisHandle;

/// The flow hash's field that holds the breaker's record.
pub const FIELD: &str = "breaker";
/// How often a host adds its counts to the group's window.
pub const FLUSH: Duration = Duration::from_millis(250);

/// Where the breaker stands, when it is not closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing is read until `until_ms`.
    Open,
    /// Probe deliveries go through.
    HalfOpen,
}

/// An open or half-open breaker, as its record in Redis says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerState {
    /// Open or half-open.
    pub state: Phase,
    /// Since when (ms since the Unix epoch, server clock; 0 unknown).
    pub since_ms: u64,
    /// Open: when it may probe. Half-open: when a round of probes that never answered is
    /// replaced.
    pub until_ms: u64,
    /// What opened it: failed deliveries of how many in the window (when the window did).
    pub failed: Option<(u64, u64)>,
    /// Why it opened again (a probe's failure), bounded.
    pub why: Option<String>,
    /// Which host moved it there (its consumer name), bounded.
    pub by: Option<String>,
}

impl BreakerState {
    /// A record read from Redis; anything that is not Sluice's counts as open.
    pub fn from_record(record: &[u8]) -> Self {
        let value: serde_json::Value = serde_json::from_slice(record).unwrap_or_default();
        let number = |name: &str| value.get(name).and_then(serde_json::Value::as_f64);
        let text = |name: &str| {
            value
                .get(name)
                .and_then(serde_json::Value::as_str)
                .map(|t| crate::entry::outcome::bounded_text(t, 300).0)
        };
        let ms = |name: &str| number(name).map_or(0, |n| n.max(0.0) as u64);
        let state = match value.get("state").and_then(serde_json::Value::as_str) {
            Some("half-open") => Phase::HalfOpen,
            Some("open") => Phase::Open,
            _ => {
                return Self {
                    state: Phase::Open,
                    since_ms: 0,
                    until_ms: 0,
                    failed: None,
                    why: None,
                    by: Some("an unknown writer (the record is not Sluice's)".to_owned()),
                };
            }
        };
        Self {
            state,
            since_ms: ms("since_ms"),
            until_ms: ms("until_ms"),
            failed: number("failed")
                .zip(number("of"))
                .map(|(f, of)| (f.max(0.0) as u64, of.max(0.0) as u64)),
            why: text("why"),
            by: text("by"),
        }
    }

    /// The metric's value: 1 open, 2 half-open.
    pub fn gauge(&self) -> i64 {
        match self.state {
            Phase::Open => 1,
            Phase::HalfOpen => 2,
        }
    }

    /// `open` or `half-open`.
    pub fn name(&self) -> &'static str {
        match self.state {
            Phase::Open => "open",
            Phase::HalfOpen => "half-open",
        }
    }

    /// One line for logs and the CLI.
    pub fn describe(&self) -> String {
        let mut line = match self.state {
            Phase::Open => "open: no entries are read".to_owned(),
            Phase::HalfOpen => "half-open: probe deliveries go through".to_owned(),
        };
        if let Some((failed, of)) = self.failed {
            line.push_str(&format!(
                "; {failed} of {of} deliveries failed in the window"
            ));
        }
        if let Some(why) = &self.why {
            line.push_str(&format!("; a probe failed: {why}"));
        }
        if self.state == Phase::Open && self.until_ms != 0 {
            line.push_str(&format!(
                "; probes from {}",
                crate::support::when::rfc3339_ms(i64::try_from(self.until_ms).unwrap_or(i64::MAX))
            ));
        }
        if let Some(by) = &self.by {
            line.push_str(&format!(" (by {by})"));
        }
        line
    }
}

/// What a host asking an open breaker may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// It is closed: read.
    Closed,
    /// One probe delivery may go through.
    Probe,
    /// Ask again after this long.
    Wait(Duration),
}

/// One subscription's breaker on this host: its counts, and the scripts that move it.
pub struct Breaker {
    config: CircuitBreaker,
    stream: String,
    group: String,
    flow_key: String,
    window_key: String,
    journal_key: String,
    /// This host's consumer name, recorded with what it moves.
    by: String,
    conn: RedisHandle,
    deliveries: AtomicU64,
    failures: AtomicU64,
    /// Probe permits this host took whose delivery has not answered yet.
    probes_out: AtomicU64,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Breaker {
    /// The breaker of the subscription to `stream` with `group`, for consumer `by`.
    pub fn new(
        stream: &str,
        group: &str,
        by: &str,
        config: CircuitBreaker,
        conn: RedisHandle,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config,
            stream: stream.to_owned(),
            group: group.to_owned(),
            flow_key: crate::store::keys::flow_key(stream, group),
            window_key: crate::store::keys::breaker_key(stream, group),
            journal_key: crate::store::keys::journal_key(stream, group),
            by: by.to_owned(),
            conn,
            deliveries: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            probes_out: AtomicU64::new(0),
            metrics,
        }
    }

    /// An attempt ended, `failed` or not: counted for the window, or, when it was a probe,
    /// answered to the half-open breaker at once.
    pub fn record(self: &Arc<Self>, failed: bool, why: &str) {
        let probe = self
            .probes_out
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if probe {
            let this = self.clone();
            let why = crate::entry::outcome::bounded_text(why, 300).0;
            tokio::spawn(async move { this.answer(!failed, &why).await });
            return;
        }
        self.deliveries.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A probe permit was taken and its read found nothing: it answers nothing.
    pub fn probe_unused(&self) {
        let _ = self
            .probes_out
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    fn transition(&self, to: &'static str) {
        let series = self
            .metrics
            .series(&crate::observe::metrics::Metrics::labels(
                &self.stream,
                &self.group,
            ));
        self.metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                stream: series.stream,
                group: series.group,
                to,
            })
            .inc();
    }

    /// Tell every host to look at the flow controls again.
    async fn bump(&self) {
        let mut conn = self.conn.clone();
        let bumped = super::bump(&mut conn, &self.stream, &self.group).await;
        if let Err(err) = bumped {
            tracing::warn!(%err, "cannot bump the flow epoch; hosts see the breaker's change within 30 s");
        }
    }

    /// Add this host's counts to the window every [`FLUSH`] until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        static RECORD: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(crate::store::lua!("pipeline/admit/lua/breaker_record"))
        });
        loop {
            tokio::select! {
                () = tokio::time::sleep(FLUSH) => {}
                () = stop.cancelled() => return,
            }
            let d = self.deliveries.swap(0, Ordering::AcqRel);
            let f = self.failures.swap(0, Ordering::AcqRel);
            if d == 0 {
                continue;
            }
            let mut conn = self.conn.clone();
            let recorded: redis::RedisResult<(String, String)> = RECORD
                .key(&self.window_key)
                .key(&self.flow_key)
                .key(&self.journal_key)
                .arg(d)
                .arg(f)
                .arg(self.config.window.as_millis() as u64)
                .arg(self.config.min_deliveries)
                .arg(self.config.failure_rate)
                .arg(self.config.open_for.as_millis() as u64)
                .arg(&self.by)
                .invoke_async(&mut conn)
                .await;
            match recorded {
                Ok((what, record)) if what == "opened" => {
                    let state = BreakerState::from_record(record.as_bytes());
                    tracing::warn!(
                        stream = %self.stream,
                        group = %self.group,
                        "circuit breaker opened by this host: {}",
                        state.describe()
                    );
                    self.transition("open");
                    self.bump().await;
                }
                Ok(_) => {}
                Err(err) => {
                    // Counts lost with a failed call only delay an opening: they are not
                    // added back, so a Redis that stays away cannot grow them.
                    tracing::warn!(
                        stream = %self.stream,
                        group = %self.group,
                        %err,
                        "cannot add this host's counts to the circuit breaker's window"
                    );
                }
            }
        }
    }

    /// Ask the open breaker what this host may do now.
    pub async fn gate(&self) -> Gate {
        static PROBE: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(crate::store::lua!("pipeline/admit/lua/breaker_probe"))
        });
        let mut conn = self.conn.clone();
        let asked: redis::RedisResult<(String, u64, String)> = PROBE
            .key(&self.flow_key)
            .key(&self.journal_key)
            .arg(self.config.probes)
            .arg(self.config.open_for.as_millis() as u64)
            .arg(&self.by)
            .invoke_async(&mut conn)
            .await;
        match asked {
            Ok((what, _, _)) if what == "closed" => Gate::Closed,
            Ok((what, _, record)) if what == "probe" => {
                self.probes_out.fetch_add(1, Ordering::AcqRel);
                let moved = serde_json::from_str::<serde_json::Value>(&record)
                    .ok()
                    .and_then(|v| v.get("moved").and_then(serde_json::Value::as_f64))
                    == Some(1.0);
                if moved {
                    tracing::info!(
                        stream = %self.stream,
                        group = %self.group,
                        probes = self.config.probes,
                        "circuit breaker half-open: probing"
                    );
                    self.transition("half-open");
                    self.bump().await;
                }
                Gate::Probe
            }
            // A wait beyond a day is not the script's: ask again in a second.
            Ok((_, wait_ms, _)) => Gate::Wait(if wait_ms > 86_400_000 {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(wait_ms.max(10))
            }),
            Err(err) => {
                self.conn.saw_error(&err);
                tracing::warn!(
                    stream = %self.stream,
                    group = %self.group,
                    %err,
                    "cannot ask the circuit breaker for a probe; reading nothing meanwhile"
                );
                Gate::Wait(Duration::from_secs(1))
            }
        }
    }

    /// A probe's answer: success closes the breaker, failure opens it again.
    async fn answer(&self, success: bool, why: &str) {
        static RESULT: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(crate::store::lua!("pipeline/admit/lua/breaker_result"))
        });
        let mut conn = self.conn.clone();
        let answered: redis::RedisResult<(String, String)> = RESULT
            .key(&self.flow_key)
            .key(&self.window_key)
            .key(&self.journal_key)
            .arg(if success { "1" } else { "0" })
            .arg(self.config.open_for.as_millis() as u64)
            .arg(why)
            .arg(&self.by)
            .invoke_async(&mut conn)
            .await;
        match answered {
            Ok((what, _)) if what == "closed" => {
                tracing::info!(
                    stream = %self.stream,
                    group = %self.group,
                    "circuit breaker closed: a probe succeeded; reading again"
                );
                self.transition("closed");
                self.bump().await;
            }
            Ok((what, _)) if what == "reopened" => {
                tracing::warn!(
                    stream = %self.stream,
                    group = %self.group,
                    why,
                    open_for_ms = self.config.open_for.as_millis() as u64,
                    "circuit breaker opened again: a probe failed"
                );
                self.transition("open");
                self.bump().await;
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(
                stream = %self.stream,
                group = %self.group,
                %err,
                "cannot give the circuit breaker a probe's answer; another round of probes follows"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_is_not_sluices_counts_as_open() {
        for record in [&b"nope"[..], b"{}", b"{\"state\":\"closed\"}", b"[1,2]"] {
            let state = BreakerState::from_record(record);
            assert_eq!(state.state, Phase::Open, "{record:?}");
            assert!(state.by.unwrap().contains("unknown writer"));
        }
        let long = "x".repeat(100_000);
        let hostile = serde_json::json!({
            "state": "half-open", "since_ms": -5, "until_ms": 1e300, "why": long, "by": long,
        })
        .to_string();
        let state = BreakerState::from_record(hostile.as_bytes());
        assert_eq!(state.state, Phase::HalfOpen);
        // A time past year 9999 is described, not a panic (humantime cannot write it).
        let far = BreakerState::from_record(br#"{"state":"open","until_ms":1e300}"#);
        assert!(far.describe().contains("9999-12-31"), "{}", far.describe());
        assert_eq!(state.since_ms, 0);
        assert!(state.why.unwrap().len() < 400);
    }
}
