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
//!
//! The files: [`canary`] is the canary in Redis (record, verdict, the scripts that start,
//! judge and end it); [`key`] the rollout key that seals them; [`replay`] the dry run on dead
//! letters. The host side of a canary: [`follow`] watches the flow state and converges on it,
//! [`join`] fetches and starts the candidate, [`report`] adds this host's counts and acts on
//! the verdict, [`end`] ends this host's trial. This file is the [`Rollout`] an operator
//! starts, aborts and replays through.

pub mod canary;
mod end;
mod follow;
mod join;
pub mod key;
pub mod replay;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::control::swap::{SwapControl, SwapError};
use crate::observe::metrics::Metrics;
use crate::store::redis_conn::RedisHandle;
use canary::{CanaryError, Record};
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
}
