//! Safe rollout: a candidate handler tried on a share of the traffic with an automatic verdict
//! (a canary, [`canary`]), and dead letters replayed against a candidate in a dry run
//! ([`replay`]).
//!
//! A canary's state lives in Redis, so every host of the group runs the same one: a host
//! follows the record ([`Rollout::follow`]) the way it follows a pause, fetches the candidate
//! from Redis, puts it on trial in the subscription's handler slot (see
//! [`crate::handler::Trial`]: the entry's origin id picks the version, the same for all its
//! attempts), reports what each version's attempts came to, and applies the verdict the first
//! host to judge wrote. A host that starts while a canary runs joins it. A canary never
//! changes what happens to an entry, only which version handles it: each entry is still
//! handled once per group, retried, parked and dead-lettered as before.

pub mod canary;
pub mod key;
pub mod replay;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::control::swap::{SwapControl, SwapError};
use crate::handler::{Joining, Role, Tally, Trial};
use crate::observe::metrics::{Metrics, VerdictLabels};
use crate::pipeline::admit::FlowState;
use crate::store::redis_conn::RedisHandle;
use canary::{CanaryError, Outcome, Record, Reported, Verdict};
use key::RolloutKey;

/// Why a canary could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// The candidate is refused as a swap would refuse it.
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// Redis, or the state in it, refused.
    #[error(transparent)]
    Canary(#[from] CanaryError),
    /// The share is not a share.
    #[error("a canary's share must be above 0% and below 100% (got {0}%)")]
    Share(f64),
    /// The window is out of bounds.
    #[error("a canary's window must be between 10s and 1 day (got {0:?})")]
    Window(Duration),
    /// This host holds no rollout key.
    #[error("{}", canary::NO_KEY)]
    NoKey,
    /// The candidate is what serves.
    #[error("the candidate is the version serving now ({0}): nothing to try")]
    Serving(String),
    /// Requeueing what a candidate acknowledged needs the candidate to serve.
    #[error(
        "requeue_acked: the candidate ({candidate}) is not the version serving ({serving}); requeued entries would run the serving version (swap the candidate in first)"
    )]
    NotServing {
        /// The candidate's short digest.
        candidate: String,
        /// The serving one's.
        serving: String,
    },
    /// The dead letters could not be read or requeued.
    #[error(transparent)]
    Operate(#[from] crate::control::operate::OperateError),
}

/// A replay of one dead-letter stream.
#[derive(Debug)]
pub struct ReplayOutcome {
    /// The dead-letter stream.
    pub dead_letters: String,
    /// What the candidate would do.
    pub report: replay::Report,
    /// What was requeued, when asked.
    pub requeued: Option<replay::RequeuedAcked>,
}

impl RolloutError {
    /// The refusal with its causes, as one line.
    pub fn explain(&self) -> String {
        crate::support::chain::chain(self)
    }
}

/// One subscription's rollouts: starts, follows and aborts its canaries.
pub struct Rollout {
    control: Arc<SwapControl>,
    conn: RedisHandle,
    config: crate::config::Canary,
    consumer: String,
    max_component: u64,
    metrics: Arc<Metrics>,
    /// Seals and checks records and verdicts; without it no canary starts or is joined.
    key: Option<Arc<RolloutKey>>,
    /// Its part of `sluice_canary_share_basis_points`, made with its first canary.
    share: std::sync::OnceLock<crate::observe::metrics::Share>,
}

impl Rollout {
    /// Rollouts of the subscription `control` swaps, through `conn`; `consumer` names this
    /// host in verdicts; a candidate of more than `max_component` bytes is not fetched; `key`
    /// seals and checks what lets hosts run a candidate.
    pub fn new(
        control: Arc<SwapControl>,
        conn: RedisHandle,
        config: crate::config::Canary,
        (consumer, max_component): (String, u64),
        metrics: Arc<Metrics>,
        key: Option<Arc<RolloutKey>>,
    ) -> Self {
        Self {
            control,
            conn,
            config,
            consumer,
            max_component,
            metrics,
            key,
            share: std::sync::OnceLock::new(),
        }
    }

    fn key(&self) -> Result<&RolloutKey, RolloutError> {
        self.key.as_deref().ok_or(RolloutError::NoKey)
    }

    /// Show a running canary's share (0: none) in the metrics; summed per host, a running
    /// canary counts one.
    fn show_share(&self, share_bp: u32) {
        let gauge = self.share.get_or_init(|| {
            self.metrics
                .share(&self.metrics.canary_share, self.control.slot().labels())
        });
        gauge.set(if gauge.summed() {
            i64::from(share_bp > 0)
        } else {
            i64::from(share_bp)
        });
    }

    fn stream(&self) -> &str {
        &self.control.slot().labels().stream
    }

    fn group(&self) -> &str {
        &self.control.slot().labels().group
    }

    /// The subscription's swap control.
    pub fn control(&self) -> &Arc<SwapControl> {
        &self.control
    }

    /// Start a canary of `bytes` on `percent` of the deliveries for `window` (the
    /// configured one when `None`), for every host of the group. The candidate is checked here
    /// first as a swap would check it.
    pub async fn start(
        &self,
        bytes: Vec<u8>,
        percent: f64,
        window: Option<Duration>,
        by: &str,
    ) -> Result<Record, RolloutError> {
        let key = self.key()?;
        if !percent.is_finite() || percent <= 0.0 || percent >= 100.0 {
            return Err(RolloutError::Share(percent));
        }
        let window = window.unwrap_or(self.config.window);
        if window < Duration::from_secs(10) || window > Duration::from_secs(86_400) {
            return Err(RolloutError::Window(window));
        }
        let serving = self.control.slot().current();
        let digest = crate::support::digest::Digest::of(&bytes);
        if digest == serving.digest {
            return Err(RolloutError::Serving(digest.short().to_owned()));
        }
        let origin = PathBuf::from(format!("canary for {}/{}", self.stream(), self.group()));
        self.control.prepare(origin, bytes.clone()).await?;
        let mut conn = self.conn.clone();
        let record = canary::start(
            &mut conn,
            key,
            canary::Start {
                stream: self.stream(),
                group: self.group(),
                bytes: &bytes,
                candidate: digest.as_str(),
                incumbent: serving.digest.as_str(),
                share_bp: (percent * 100.0).round().clamp(1.0, 9_999.0) as u32,
                window,
                thresholds: (&self.config).into(),
                by,
            },
        )
        .await?;
        Ok(record)
    }

    /// End the running canary by an operator's word: rolled back on every host.
    pub async fn abort(&self, by: &str) -> Result<Record, RolloutError> {
        let key = self.key()?;
        let mut conn = self.conn.clone();
        Ok(canary::abort(&mut conn, key, self.stream(), self.group(), by).await?)
    }

    /// Run `bytes` on up to `limit` dead letters of each of `keys` (the subscription's
    /// partitions) in a dry run, outbound HTTP only to `allowed`; with `requeue_acked`, then
    /// requeue those it acknowledged, which it may only when it is the version serving here.
    pub async fn replay(
        &self,
        bytes: &[u8],
        keys: &[crate::store::keys::SubscriptionKeys],
        allowed: Vec<crate::config::allow::AllowedHost>,
        (reason, limit): (Option<&str>, usize),
        requeue_acked: bool,
    ) -> Result<Vec<ReplayOutcome>, RolloutError> {
        let digest = crate::support::digest::Digest::of(bytes);
        let serving = self.control.slot().current().digest.clone();
        if requeue_acked && digest != serving {
            return Err(RolloutError::NotServing {
                candidate: digest.short().to_owned(),
                serving: serving.short().to_owned(),
            });
        }
        let origin = PathBuf::from(format!(
            "replay candidate for {}/{}",
            self.stream(),
            self.group()
        ));
        let (handler, counters) = self.control.dry_run_handler(origin, bytes, allowed).await?;
        let mut outcomes = Vec::new();
        for keys in keys {
            let mut conn = self.conn.clone();
            let report = replay::replay(
                &mut conn,
                keys,
                &handler,
                (reason, limit),
                self.control.limits().max_entry_bytes,
            )
            .await?;
            let requeued = if requeue_acked {
                Some(replay::requeue_acked(&mut conn, keys, &report).await?)
            } else {
                None
            };
            outcomes.push(ReplayOutcome {
                dead_letters: keys.dead_letter.to_string(),
                report,
                requeued,
            });
        }
        if counters.http_denied.get() > 0
            && let Some(first) = outcomes.first_mut()
        {
            first.report.http_denied = counters.http_denied.get();
        }
        Ok(outcomes)
    }

    /// The canary as Redis holds it.
    pub async fn state(&self) -> Result<canary::CanaryState, RolloutError> {
        let mut conn = self.conn.clone();
        Ok(canary::read(&mut conn, self.key.as_deref(), self.stream(), self.group()).await?)
    }

    /// Follow the subscription's canary, as `flow` shows it, until `stop`: join a running one,
    /// report this host's counts, apply the verdict.
    pub async fn follow(
        self: Arc<Self>,
        mut flow: watch::Receiver<FlowState>,
        stop: CancellationToken,
    ) {
        let mut follower = Follower {
            rollout: &self,
            forged: Vec::new(),
            ended: std::collections::VecDeque::new(),
            installed: None,
            pending: [Tally::default(), Tally::default()],
            failed: None,
            refused: None,
            report_failing: false,
            seen: None,
        };
        let mut tick = tokio::time::interval(canary::REPORT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut first = true;
        loop {
            // Only a canary this host runs (or could not join) needs the clock: with none,
            // the follower waits for the flow state to change, and an idle host's thousands
            // of subscriptions cost no wake-up here.
            let ticking = first || follower.installed.is_some() || follower.failed.is_some();
            first = false;
            tokio::select! {
                changed = flow.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tick.tick(), if ticking => {}
                () = stop.cancelled() => return,
            }
            let state = flow.borrow_and_update().clone();
            // The record is opened (parsed, its seal checked) only when it changed, or to try
            // joining again after a failure.
            let seen = (state.canary.clone(), state.canary_verdict.clone());
            let changed = follower.seen.as_ref() != Some(&seen);
            if state.known && (changed || follower.failed.is_some()) {
                follower.seen = Some(seen);
                follower.converge(&state).await;
                // Known now whether a canary runs: deliveries held since the start go on
                // (unless this host could neither join a canary nor end it: its share waits).
                if follower.failed.is_none() {
                    self.control.slot().joined();
                }
            }
            follower.report().await;
        }
    }
}

/// A trial this host runs, with the record it follows.
struct Installed {
    record: Record,
    trial: Arc<Trial>,
    /// When this host joined: a canary nobody judges is ended here after its window.
    joined: tokio::time::Instant,
}

struct Follower<'a> {
    rollout: &'a Rollout,
    /// A verdict field for the current record that does not verify (another writer's): read
    /// past by reports, replaced by a verdict.
    forged: Vec<u8>,
    /// The last canaries this host saw decided, with their verdicts: a record's life is one
    /// way, so a verdict that goes from Redis is written back and the record not joined again.
    ended: std::collections::VecDeque<Verdict>,
    installed: Option<Installed>,
    /// Counts not yet added to the group's (a report failed).
    pending: [Tally; 2],
    /// A canary this host could not join, and when it may try again.
    failed: Option<(String, tokio::time::Instant)>,
    /// The last record refused, not to log it on every look.
    refused: Option<Vec<u8>>,
    report_failing: bool,
    /// The record and verdict last converged on.
    seen: Option<Seen>,
}

/// A canary record and its verdict, as stored.
type Seen = (Option<Vec<u8>>, Option<Vec<u8>>);

/// How long a host waits before trying again to join a canary it could not.
const JOIN_RETRY: Duration = Duration::from_secs(5);
/// How many decided canaries a host remembers (see [`Follower::ended`]).
const REMEMBERED: usize = 16;

impl Follower<'_> {
    fn labels(&self) -> (&str, &str) {
        (self.rollout.stream(), self.rollout.group())
    }

    fn key(&self) -> Option<&RolloutKey> {
        self.rollout.key.as_deref()
    }

    fn remember(&mut self, verdict: &Verdict) {
        if self.ended.iter().any(|v| v.id == verdict.id) {
            return;
        }
        if self.ended.len() == REMEMBERED {
            self.ended.pop_front();
        }
        self.ended.push_back(verdict.clone());
    }

    /// The record in `state`, if its seal verifies (a refused one is logged once).
    fn record(&mut self, state: &FlowState) -> Option<Record> {
        let raw = state.canary.as_ref()?;
        let (stream, group) = self.labels();
        match Record::open(raw, self.key(), stream, group) {
            Ok(record) => {
                self.refused = None;
                Some(record)
            }
            Err(why) => {
                if self.refused.as_deref() != Some(raw.as_slice()) {
                    tracing::warn!(stream, group, "canary record ignored: {why}");
                    self.refused = Some(raw.clone());
                }
                None
            }
        }
    }

    /// The verdict for `record` in `state`, if one is there and its seal verifies; one that
    /// does not is kept in `forged` and logged.
    fn verdict(&mut self, state: &FlowState, record: &Record) -> Option<Verdict> {
        let raw = state.canary_verdict.as_deref().unwrap_or_default();
        if !canary::contains(raw, record.id.as_bytes()) {
            self.forged.clear();
            return None;
        }
        let (stream, group) = self.labels();
        match Verdict::open(raw, self.key(), (stream, group), &record.id) {
            Ok(verdict) => {
                self.forged.clear();
                Some(verdict)
            }
            Err(why) => {
                if self.forged != raw {
                    tracing::warn!(stream, group, "canary verdict ignored: {why}");
                    self.forged = raw.to_vec();
                }
                None
            }
        }
    }

    /// A canary this host saw decided whose verdict is gone or replaced: its verdict is
    /// written back, and the record stays ended.
    async fn restore(&mut self, record: &Record, state: &FlowState) -> bool {
        let Some(verdict) = self.ended.iter().find(|v| v.id == record.id).cloned() else {
            return false;
        };
        let Some(key) = self.key() else {
            return true;
        };
        let (stream, group) = self.labels();
        tracing::warn!(
            stream,
            group,
            candidate = %canary::short(&record.candidate),
            "the verdict of a canary this host saw {} is gone from Redis or not sealed: written back, and the canary stays ended",
            verdict.outcome.name()
        );
        let sealed = verdict.sealed(key, stream, group);
        let seen = state.canary_verdict.clone().unwrap_or_default();
        let mut conn = self.rollout.conn.clone();
        match canary::write_verdict(&mut conn, record, &sealed, &seen).await {
            Ok(_) => {
                let _ = crate::pipeline::admit::bump(&mut conn, stream, group).await;
            }
            Err(err) => {
                tracing::warn!(stream, group, %err, "cannot write the canary's verdict back")
            }
        }
        true
    }

    /// Whether the record's window is over by the server's clock (a minute's grace): a record
    /// past it is not joined (written back by another writer, say).
    async fn past_window(&self, record: &Record) -> bool {
        let mut conn = self.rollout.conn.clone();
        let now = canary::server_ms(&mut conn).await.unwrap_or(0);
        now > record
            .ends_ms
            .saturating_add(u64::try_from(canary::ABANDONED_AFTER.as_millis()).unwrap_or(0))
    }

    /// Make this host's part match what Redis says.
    async fn converge(&mut self, state: &FlowState) {
        let record = self.record(state);
        let Some(record) = record else {
            self.failed = None;
            self.forged.clear();
            if let Some(installed) = self.installed.take() {
                self.end(
                    installed,
                    Outcome::RolledBack,
                    "its record is gone from Redis",
                );
            }
            return;
        };
        let decided = self.verdict(state, &record);
        if let Some(verdict) = decided {
            self.failed = None;
            self.remember(&verdict);
            if let Some(installed) = self.installed.take() {
                if installed.record.id == record.id {
                    self.apply(installed, &verdict);
                } else {
                    self.end(installed, Outcome::RolledBack, "another canary replaced it");
                }
            }
            return;
        }
        if self.restore(&record, state).await {
            return;
        }
        if let Some(installed) = &self.installed {
            if installed.record.id == record.id {
                return;
            }
            if let Some(installed) = self.installed.take() {
                self.end(installed, Outcome::RolledBack, "another canary replaced it");
            }
        }
        if let Some((id, at)) = &self.failed
            && *id == record.id
            && at.elapsed() < JOIN_RETRY
        {
            return;
        }
        if self.past_window(&record).await {
            let (stream, group) = self.labels();
            tracing::warn!(
                stream,
                group,
                candidate = %canary::short(&record.candidate),
                "canary record not joined: its window ended more than a minute ago"
            );
            return;
        }
        match self.join(&record).await {
            Ok(installed) => {
                self.failed = None;
                self.installed = Some(installed);
            }
            Err(err) => self.could_not_join(&record, &err).await,
        }
    }

    /// This host cannot run the candidate of `record`: the canary ends for every host (it runs
    /// on every host or on none: the entries this host would run on the incumbent are the
    /// candidate's on the others). The deliveries the candidate would take stay held until it
    /// has ended.
    async fn could_not_join(&mut self, record: &Record, err: &RolloutError) {
        let (stream, group) = self.labels();
        let explained = err.explain();
        tracing::error!(
            stream,
            group,
            candidate = %canary::short(&record.candidate),
            err = %explained,
            "cannot join the canary: ending it for every host of the group"
        );
        let mut conn = self.rollout.conn.clone();
        let ended = match self.key() {
            Some(key) => {
                canary::refuse(
                    &mut conn,
                    key,
                    record,
                    (&self.rollout.consumer, &explained),
                    &self.forged,
                )
                .await
            }
            None => Ok(false),
        };
        match ended {
            Ok(_) => {
                self.rollout.control.slot().joined();
                self.failed = None;
            }
            Err(e) => {
                let (stream, group) = self.labels();
                tracing::error!(
                    stream,
                    group,
                    err = %e,
                    "cannot end the canary this host cannot join; its share of deliveries stays held (trying again in 5 s)"
                );
                self.failed = Some((record.id.clone(), tokio::time::Instant::now()));
            }
        }
    }

    /// Fetch, check and start the canary's candidate, holding the deliveries it would take
    /// meanwhile. On success they go on; on failure they stay held for the caller to end the
    /// canary first.
    async fn join(&self, record: &Record) -> Result<Installed, RolloutError> {
        let slot = self.rollout.control.slot();
        slot.joining(Joining::new(&record.id, record.share_bp, record.from_ms()));
        let joined = self.fetch_and_start(record).await;
        if joined.is_ok() {
            slot.joined();
        }
        joined
    }

    async fn fetch_and_start(&self, record: &Record) -> Result<Installed, RolloutError> {
        let mut conn = self.rollout.conn.clone();
        let bytes = canary::fetch_component(
            &mut conn,
            &record.stream,
            &record.candidate,
            self.rollout.max_component,
        )
        .await?;
        let origin = PathBuf::from(format!(
            "canary candidate {}",
            canary::short(&record.candidate)
        ));
        let candidate = self.rollout.control.prepare(origin, bytes).await?;
        let slot = self.rollout.control.slot();
        let serving = slot.current();
        if serving.digest.as_str() != record.incumbent {
            tracing::warn!(
                stream = %record.stream,
                group = %record.group,
                serving = serving.digest.short(),
                incumbent = %canary::short(&record.incumbent),
                "this host serves another version than the canary's incumbent; its deliveries count as the incumbent's"
            );
        }
        let trial = Arc::new(Trial::new(
            record.id.clone(),
            candidate,
            (record.share_bp, record.from_ms()),
            &self.rollout.metrics,
            slot.labels(),
        ));
        slot.start_trial(trial.clone());
        self.rollout.show_share(record.share_bp);
        Ok(Installed {
            record: record.clone(),
            trial,
            joined: tokio::time::Instant::now(),
        })
    }

    fn apply(&mut self, installed: Installed, verdict: &Verdict) {
        self.end(installed, verdict.outcome, &verdict.why);
    }

    fn end(&mut self, installed: Installed, outcome: Outcome, why: &str) {
        let slot = self.rollout.control.slot();
        let ended = slot
            .end_trial(&installed.record.id, outcome == Outcome::Promoted)
            .is_some();
        self.pending = [Tally::default(), Tally::default()];
        self.rollout.show_share(0);
        if !ended {
            return;
        }
        let series = self.rollout.metrics.series(slot.labels());
        self.rollout
            .metrics
            .canary_verdicts
            .get_or_create(&VerdictLabels {
                stream: series.stream,
                group: series.group,
                verdict: match outcome {
                    Outcome::Promoted => "promoted",
                    Outcome::RolledBack => "rolled_back",
                },
            })
            .inc();
        match outcome {
            Outcome::Promoted => tracing::info!(
                stream = %installed.record.stream,
                group = %installed.record.group,
                candidate = %canary::short(&installed.record.candidate),
                "canary promoted: the candidate serves every delivery now ({why})"
            ),
            Outcome::RolledBack => tracing::warn!(
                stream = %installed.record.stream,
                group = %installed.record.group,
                candidate = %canary::short(&installed.record.candidate),
                "canary rolled back: the current version serves every delivery again ({why})"
            ),
        }
    }

    /// Add this host's counts to the group's and act on the verdict, if any.
    async fn report(&mut self) {
        let Some(installed) = &self.installed else {
            return;
        };
        let Some(key) = self.rollout.key.clone() else {
            return;
        };
        self.pending[0].merge(installed.trial.take(Role::Incumbent));
        self.pending[1].merge(installed.trial.take(Role::Candidate));
        let mut conn = self.rollout.conn.clone();
        let result = canary::report(
            &mut conn,
            &key,
            &installed.record,
            (&self.rollout.consumer, &self.forged),
            (&self.pending[0], &self.pending[1]),
        )
        .await;
        let record = installed.record.clone();
        let overdue = installed.joined.elapsed()
            > Duration::from_millis(record.ends_ms.saturating_sub(record.started_ms))
                + canary::ABANDONED_AFTER;
        match result {
            Ok(reported) => {
                if self.report_failing {
                    tracing::info!(stream = %record.stream, group = %record.group, "canary reports reach Redis again");
                    self.report_failing = false;
                }
                self.reported(reported, &record, overdue);
            }
            Err(err) => {
                self.rollout.conn.saw_error(&err);
                if !self.report_failing {
                    tracing::warn!(stream = %record.stream, group = %record.group, %err, "cannot report the canary's counts to Redis; they wait for the next report");
                    self.report_failing = true;
                }
                if overdue && let Some(installed) = self.installed.take() {
                    self.end(
                        installed,
                        Outcome::RolledBack,
                        "its window ended a minute ago and it cannot be judged (Redis refuses the reports)",
                    );
                }
            }
        }
    }

    /// Act on what a report of `record` found.
    fn reported(&mut self, reported: Reported, record: &Record, overdue: bool) {
        // A forged verdict stopped the script before it counted: the counts wait.
        if !matches!(reported, Reported::Forged(_)) {
            self.pending = [Tally::default(), Tally::default()];
        }
        let end = |this: &mut Self, why: &str| {
            if let Some(installed) = this.installed.take() {
                this.end(installed, Outcome::RolledBack, why);
            }
        };
        match reported {
            Reported::Running if overdue => end(
                self,
                "its window ended a minute ago and Redis still judges it running (a clock far off?)",
            ),
            Reported::Running => {}
            // A verdict field another writer keeps changing must not keep a canary past its
            // window: ended here as if nobody judged it.
            Reported::Forged(_) if overdue => end(
                self,
                "its window ended a minute ago and its verdict field holds what no host wrote",
            ),
            Reported::Forged(raw) => {
                if self.forged != raw {
                    tracing::warn!(
                        stream = %record.stream,
                        group = %record.group,
                        "canary verdict ignored: its seal does not verify with this host's rollout key (not written by a host of the group); the canary goes on"
                    );
                    self.forged = raw;
                }
            }
            Reported::Gone => end(self, "its record is gone from Redis"),
            Reported::Decided { verdict, .. } => {
                self.remember(&verdict);
                if let Some(installed) = self.installed.take() {
                    self.apply(installed, &verdict);
                }
            }
        }
    }
}
