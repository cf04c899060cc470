//! The handler a subscription runs, and the slot that lets it be replaced while it runs.
//!
//! [`Handler`] is what dispatch calls: the WASM runtime implements it for a component, tests
//! and the benchmark implement it natively. Each subscription's handler lives in a
//! [`HandlerSlot`]: an `ArcSwap` of the current [`Version`]. A delivery takes the current
//! version once, when it starts, and keeps it to the end, so deliveries that started on the old
//! version finish on it and every delivery that starts after a swap runs the new one. Nothing
//! is paused and no entry is re-read.
//!
//! A slot may also hold a [`Trial`]: a candidate version that a share of deliveries runs (a
//! canary, see `crate::control::rollout`), chosen per entry by a keyed hash of its origin id so that
//! every attempt of one entry runs on the same version. The trial counts what each version's
//! attempts came to; `crate::control::rollout` compares the two and ends the trial.
//!
//! This module sits between the runtime (which implements [`Handler`]) and dispatch (which
//! calls it), so neither depends on the other; `swap` decides what gets published here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::entry::delivery::Delivery;
use crate::entry::outcome::{Failure, Outcome};
use crate::observe::metrics::{
    CanaryLabels, CanaryVersionLabels, HandlerLabels, Metrics, SubLabels,
};
use crate::support::digest::Digest;

/// Something that handles deliveries: a WASM component, or native code in tests and benches.
pub trait Handler: Send + Sync + 'static {
    /// Which version of the handler this is (a content digest for components).
    fn digest(&self) -> &Digest;

    /// Handle one delivery.
    fn handle<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<Outcome, Failure>>;

    /// A swap replaced this handler: release what it keeps for later deliveries (deliveries
    /// that already started finish on it).
    fn retire(&self) {}

    /// A rollback made this handler current again.
    fn activate(&self) {}
}

/// Where a subscription's handlers count what they refuse (kept across hot swaps).
#[derive(Debug, Clone, Default)]
pub struct HandlerCounters {
    /// Outbound HTTP requests refused (`sluice_http_denied_total`).
    pub http_denied: prometheus_client::metrics::counter::Counter,
    /// Guest log lines dropped or cut (`sluice_guest_log_dropped_total`).
    pub log_dropped: prometheus_client::metrics::counter::Counter,
}

/// One version of a subscription's handler.
pub struct Version {
    /// The handler.
    pub handler: Arc<dyn Handler>,
    /// Its digest (SHA-256 of the component).
    pub digest: Digest,
    /// When it started serving.
    pub since: SystemTime,
}

impl Version {
    /// A version serving from now on.
    pub fn new(handler: Arc<dyn Handler>) -> Self {
        Self {
            digest: handler.digest().clone(),
            handler,
            since: crate::support::clock::now(),
        }
    }
}

/// A rollback was asked for, but no version was replaced yet.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no previous version to roll back to")]
pub struct NoPrevious;

/// Which version of a trial ran an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The version that served before the trial.
    Incumbent,
    /// The version on trial.
    Candidate,
}

impl Role {
    /// Its name in metrics, the API and Redis.
    pub fn name(self) -> &'static str {
        match self {
            Role::Incumbent => "incumbent",
            Role::Candidate => "candidate",
        }
    }

    fn index(self) -> usize {
        match self {
            Role::Incumbent => 0,
            Role::Candidate => 1,
        }
    }
}

/// What one attempt came to, as a trial compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    /// Acknowledged.
    Ack = 0,
    /// To be retried (a delay the handler asked for, or a downstream it found down).
    Retry = 1,
    /// Dead-lettered (by the handler's word or the retry policy).
    DeadLetter = 2,
    /// Trapped or hit a limit: the handler decided nothing.
    Failure = 3,
}

impl AttemptKind {
    /// Its name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            AttemptKind::Ack => "ack",
            AttemptKind::Retry => "retry",
            AttemptKind::DeadLetter => "dead_letter",
            AttemptKind::Failure => "failure",
        }
    }
}

/// How many handler-time buckets a trial keeps: four per doubling of microseconds, from 1 us
/// to about 17 minutes (the last bucket holds everything longer).
pub const TIME_BUCKETS: usize = 120;

/// The bucket of a handler time: `floor(4 * log2(microseconds))`, capped. Every attempt of a
/// canary counts one, so it is worked out from the highest bit and three comparisons rather
/// than a floating-point logarithm.
pub fn time_bucket(elapsed: std::time::Duration) -> usize {
    /// 2^(1/4), 2^(2/4), 2^(3/4): where the quarters of a doubling begin.
    const QUARTERS: [f64; 3] = [
        1.189_207_115_002_721,
        std::f64::consts::SQRT_2,
        1.681_792_830_507_429,
    ];
    let us = u64::try_from(elapsed.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    let doublings = 63 - us.leading_zeros();
    let within = us as f64 / (1u64 << doublings) as f64;
    let quarter = QUARTERS.iter().filter(|&&q| within >= q).count();
    (doublings as usize * 4 + quarter).min(TIME_BUCKETS - 1)
}

/// The lower edge of a time bucket, in microseconds.
pub fn bucket_floor_us(bucket: usize) -> f64 {
    2f64.powf(bucket as f64 / 4.0)
}

/// What a version's attempts came to since they were last taken ([`TrialCounts::take`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Attempts that ran the handler.
    pub attempts: u64,
    /// Of them, traps and limits.
    pub failures: u64,
    /// Dead-lettered.
    pub dead_letters: u64,
    /// Retried.
    pub retries: u64,
    /// Handler times: (bucket, count), only buckets with a count.
    pub buckets: Vec<(usize, u64)>,
}

impl Tally {
    /// Add `other` to this one (a report that could not be sent waits with the next).
    pub fn merge(&mut self, other: Tally) {
        self.attempts += other.attempts;
        self.failures += other.failures;
        self.dead_letters += other.dead_letters;
        self.retries += other.retries;
        for (bucket, count) in other.buckets {
            match self.buckets.iter_mut().find(|(b, _)| *b == bucket) {
                Some((_, c)) => *c += count,
                None => self.buckets.push((bucket, count)),
            }
        }
    }

    /// Whether there is nothing in it.
    pub fn is_empty(&self) -> bool {
        self.attempts == 0
    }
}

/// One version's attempts during a trial, counted by the deliveries as they end.
pub struct TrialCounts {
    attempts: AtomicU64,
    failures: AtomicU64,
    dead_letters: AtomicU64,
    retries: AtomicU64,
    buckets: [AtomicU64; TIME_BUCKETS],
    /// `sluice_canary_deliveries_total` of this version, by [`AttemptKind`] (made once: an
    /// attempt only increments).
    results: [Counter; 4],
    seconds: Histogram,
}

impl TrialCounts {
    fn new(metrics: &Metrics, labels: &SubLabels, role: Role) -> Self {
        let labels = &metrics.series(labels);
        let version = CanaryVersionLabels {
            stream: labels.stream.clone(),
            group: labels.group.clone(),
            version: role.name(),
        };
        Self {
            attempts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            dead_letters: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            results: [
                AttemptKind::Ack,
                AttemptKind::Retry,
                AttemptKind::DeadLetter,
                AttemptKind::Failure,
            ]
            .map(|kind| {
                metrics
                    .canary_deliveries
                    .get_or_create(&CanaryLabels {
                        stream: labels.stream.clone(),
                        group: labels.group.clone(),
                        version: role.name(),
                        result: kind.name(),
                    })
                    .clone()
            }),
            seconds: metrics
                .canary_handler_duration
                .get_or_create(&version)
                .clone(),
        }
    }

    fn record(&self, kind: AttemptKind, elapsed: std::time::Duration) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        match kind {
            AttemptKind::Ack => {}
            AttemptKind::Retry => {
                self.retries.fetch_add(1, Ordering::Relaxed);
            }
            AttemptKind::DeadLetter => {
                self.dead_letters.fetch_add(1, Ordering::Relaxed);
            }
            AttemptKind::Failure => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.buckets[time_bucket(elapsed)].fetch_add(1, Ordering::Relaxed);
        self.results[kind as usize].inc();
        self.seconds.observe(elapsed.as_secs_f64());
    }

    /// What was counted since the last take, counted from zero again.
    pub fn take(&self) -> Tally {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let n = b.swap(0, Ordering::Relaxed);
                (n > 0).then_some((i, n))
            })
            .collect();
        Tally {
            attempts: self.attempts.swap(0, Ordering::Relaxed),
            failures: self.failures.swap(0, Ordering::Relaxed),
            dead_letters: self.dead_letters.swap(0, Ordering::Relaxed),
            retries: self.retries.swap(0, Ordering::Relaxed),
            buckets,
        }
    }
}

/// A candidate version that a share of a subscription's deliveries runs while the rest run
/// the current version: a canary. Which entries go to it is decided by a keyed hash of the
/// entry's origin id, the same on every host and for every attempt of the entry.
pub struct Trial {
    /// The canary's id (random, from its record in Redis): also the hash's key, so two
    /// canaries try different entries.
    pub id: String,
    /// The version on trial.
    pub candidate: Arc<Version>,
    /// Which entries run the candidate.
    split: Split,
    counts: [TrialCounts; 2],
}

impl Trial {
    /// A trial of `candidate` on `share_bp` of 10,000 deliveries of the subscription `labels`
    /// name, counted into `metrics`.
    pub fn new(
        id: String,
        candidate: Arc<Version>,
        (share_bp, from_ms): (u32, u64),
        metrics: &Metrics,
        labels: &SubLabels,
    ) -> Self {
        Self {
            split: Split::new(&id, share_bp, from_ms),
            id,
            candidate,
            counts: [
                TrialCounts::new(metrics, labels, Role::Incumbent),
                TrialCounts::new(metrics, labels, Role::Candidate),
            ],
        }
    }

    /// Whether the entry first added as `origin_id` runs on the candidate.
    pub fn takes(&self, origin_id: &str) -> bool {
        self.split.takes(origin_id)
    }

    /// Of 10,000 deliveries, how many the candidate runs.
    pub fn share_bp(&self) -> u32 {
        self.split.share_bp
    }

    /// Count an attempt `role` ran.
    pub fn record(&self, role: Role, kind: AttemptKind, elapsed: std::time::Duration) {
        self.counts[role.index()].record(kind, elapsed);
    }

    /// What `role`'s attempts came to since the last take.
    pub fn take(&self, role: Role) -> Tally {
        self.counts[role.index()].take()
    }
}

/// Whether the canary `id` with `share_bp` of 10,000 runs the entry first added as
/// `origin_id` on its candidate (see [`Split`]). The same on every host, for every attempt.
pub fn takes(id: &str, share_bp: u32, from_ms: u64, origin_id: &str) -> bool {
    Split::new(id, share_bp, from_ms).takes(origin_id)
}

/// Which entries a canary's candidate runs: those added at `from_ms` or later (their origin
/// id's milliseconds) whose SipHash-2-4 of the origin id, keyed with the first 16 bytes of
/// SHA-256 over the canary's id, modulo 10,000, is below the share. Keyed so that two canaries
/// try different entries and a producer cannot aim entries at the candidate without the id;
/// SipHash because every delivery of a canary pays for it (a tenth of SHA-256's cost on an id).
#[derive(Clone)]
pub struct Split {
    key: [u8; 16],
    share_bp: u32,
    from_ms: u64,
}

impl Split {
    /// The split of the canary `id` with `share_bp` of 10,000 from `from_ms`.
    pub fn new(id: &str, share_bp: u32, from_ms: u64) -> Self {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(id.as_bytes());
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        Self {
            key,
            share_bp: share_bp.min(10_000),
            from_ms,
        }
    }

    /// Whether the entry first added as `origin_id` runs on the candidate.
    pub fn takes(&self, origin_id: &str) -> bool {
        use std::hash::Hasher as _;
        if self.share_bp == 0
            || crate::support::when::entry_ms(origin_id).is_none_or(|ms| ms < self.from_ms)
        {
            return false;
        }
        let mut hasher = siphasher::sip::SipHasher24::new_with_key(&self.key);
        hasher.write(origin_id.as_bytes());
        hasher.finish() % 10_000 < u64::from(self.share_bp)
    }
}

/// A canary this host is joining (fetching and checking its candidate): the deliveries it
/// would take wait for the join to end, so that none of them runs the incumbent meanwhile.
pub struct Joining {
    split: Split,
    holds_all: bool,
    done: tokio::sync::watch::Sender<bool>,
}

impl Joining {
    /// The canary `id` with `share_bp` from `from_ms` (see [`takes`]); a host that starts
    /// holds every delivery (`share_bp` 10,000 from 0) until it knows whether a canary runs.
    pub fn new(id: &str, share_bp: u32, from_ms: u64) -> Self {
        Self {
            split: Split::new(id, share_bp, from_ms),
            holds_all: share_bp >= 10_000,
            done: tokio::sync::watch::channel(false).0,
        }
    }

    fn holds(&self, origin_id: &str) -> bool {
        self.holds_all || self.split.takes(origin_id)
    }
}

/// Which version a delivery runs, or that it must wait for a join first.
pub enum Picked {
    /// Run this version (with the trial and role to count the attempt in, during a canary).
    Run(Arc<Version>, Option<(Arc<Trial>, Role)>),
    /// Wait until this says the join ended, then pick again.
    Wait(tokio::sync::watch::Receiver<bool>),
}

/// The current handler of one subscription, and the one before it.
pub struct HandlerSlot {
    /// A candidate on trial, if a canary runs.
    trial: arc_swap::ArcSwapOption<Trial>,
    /// A canary being joined, if any.
    joining: arc_swap::ArcSwapOption<Joining>,
    /// Neither a trial nor a join is set: what every delivery asks first, one relaxed load
    /// instead of two swaps' (issue 50). Written under `changing`, after the swaps it sums up.
    plain: std::sync::atomic::AtomicBool,
    changing: Mutex<()>,
    /// The latest versions made current, newest last (at most [`HISTORY`]).
    history: Mutex<std::collections::VecDeque<Served>>,
    current: ArcSwap<Version>,
    previous: Mutex<Option<Arc<Version>>>,
    metrics: Arc<Metrics>,
    labels: SubLabels,
    swaps: crate::observe::metrics::Count,
    refusals: crate::observe::metrics::Count,
    /// The digests this slot counts in `sluice_handler_info` when it is summed per host.
    serving: Mutex<std::collections::HashSet<String>>,
    /// Where the handler versions of this subscription count what they refuse.
    counters: HandlerCounters,
}

/// How many version changes a slot remembers for the admin page.
pub const HISTORY: usize = 20;

/// One change of the version a subscription serves.
#[derive(Debug, Clone)]
pub struct Served {
    /// When.
    pub at: std::time::SystemTime,
    /// The version made current.
    pub digest: Digest,
    /// How: "started", "swapped in" or "rolled back to".
    pub how: &'static str,
}

impl HandlerSlot {
    /// A slot serving `handler`.
    pub fn new(handler: Arc<dyn Handler>, metrics: Arc<Metrics>, labels: SubLabels) -> Self {
        let version = Arc::new(Version::new(handler));
        let swaps = metrics.count(&metrics.swaps, &labels, "swaps");
        let refusals = metrics.count(&metrics.swap_refusals, &labels, "swap_refusals");
        let series = metrics.series(&labels);
        let counters = HandlerCounters {
            http_denied: metrics.http_denied.get_or_create(&series).clone(),
            log_dropped: metrics.guest_log_dropped.get_or_create(&series).clone(),
        };
        let slot = Self {
            history: Mutex::new(std::collections::VecDeque::from([Served {
                at: crate::support::clock::now(),
                digest: version.digest.clone(),
                how: "started",
            }])),
            counters,
            trial: arc_swap::ArcSwapOption::empty(),
            joining: arc_swap::ArcSwapOption::empty(),
            plain: std::sync::atomic::AtomicBool::new(true),
            changing: Mutex::default(),
            swaps,
            refusals,
            serving: Mutex::default(),
            current: ArcSwap::new(version.clone()),
            previous: Mutex::new(None),
            metrics,
            labels,
        };
        slot.mark_serving(&version.digest, true);
        slot
    }

    /// The version new deliveries run.
    pub fn current(&self) -> Arc<Version> {
        self.current.load_full()
    }

    /// The version a delivery of the entry first added as `origin_id` runs: the candidate of a
    /// trial when the trial takes it, the current version otherwise; with the trial and the
    /// role, for the delivery to count its attempt.
    pub fn pick(&self, origin_id: &str) -> Picked {
        if self.plain.load(std::sync::atomic::Ordering::Acquire) {
            return Picked::Run(self.current(), None);
        }
        if let Some(joining) = &*self.joining.load()
            && joining.holds(origin_id)
        {
            let wait = joining.done.subscribe();
            if !*wait.borrow() {
                return Picked::Wait(wait);
            }
        }
        let Some(trial) = self.trial.load_full() else {
            return Picked::Run(self.current(), None);
        };
        if trial.takes(origin_id) {
            Picked::Run(trial.candidate.clone(), Some((trial, Role::Candidate)))
        } else {
            Picked::Run(self.current(), Some((trial, Role::Incumbent)))
        }
    }

    /// Run `change` (a swap of the trial or the join) and say again whether either is set.
    fn changed<T>(&self, change: impl FnOnce() -> T) -> T {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        // Not plain before the change is seen, so no delivery misses a join for long.
        self.plain.store(false, std::sync::atomic::Ordering::SeqCst);
        let out = change();
        let plain = self.trial.load().is_none() && self.joining.load().is_none();
        self.plain.store(plain, std::sync::atomic::Ordering::SeqCst);
        out
    }

    /// The version a delivery of `origin_id` runs (see [`Self::pick`]), once no join holds it.
    pub async fn pick_when_ready(
        &self,
        origin_id: &str,
    ) -> (Arc<Version>, Option<(Arc<Trial>, Role)>) {
        loop {
            match self.pick(origin_id) {
                Picked::Run(version, trial) => return (version, trial),
                Picked::Wait(mut done) => {
                    // A sender dropped (replaced by another join) ends the wait as well.
                    let _ = done.wait_for(|done| *done).await;
                }
            }
        }
    }

    /// Hold the deliveries `joining` would take until [`Self::joined`].
    pub fn joining(&self, joining: Joining) {
        let old = self.changed(|| self.joining.swap(Some(Arc::new(joining))));
        if let Some(old) = old {
            old.done.send_replace(true);
        }
    }

    /// The join ended (with a trial started, or not): held deliveries go on.
    pub fn joined(&self) {
        if let Some(old) = self.changed(|| self.joining.swap(None)) {
            old.done.send_replace(true);
        }
    }

    /// The trial running, if any.
    pub fn trial(&self) -> Option<Arc<Trial>> {
        self.trial.load_full()
    }

    /// Start `trial` (replacing any other): from now on its share of deliveries runs its
    /// candidate.
    pub fn start_trial(&self, trial: Arc<Trial>) {
        trial.candidate.handler.activate();
        self.remember(&trial.candidate.digest, "on trial (canary)");
        self.mark_serving(&trial.candidate.digest, true);
        tracing::info!(
            stream = %self.labels.stream,
            group = %self.labels.group,
            candidate = trial.candidate.digest.short(),
            share_percent = f64::from(trial.share_bp()) / 100.0,
            "canary started: a share of deliveries runs the candidate"
        );
        if let Some(old) = self.changed(|| self.trial.swap(Some(trial))) {
            old.candidate.handler.retire();
        }
    }

    /// End the trial `id` (no other): with `promote`, its candidate becomes the current
    /// version (the one it replaces is the rollback target); otherwise every delivery that
    /// starts from now runs the current version again. Deliveries that started on the
    /// candidate finish on it. The trial, if it was running.
    pub fn end_trial(&self, id: &str, promote: bool) -> Option<Arc<Trial>> {
        let running = self.trial.load_full()?;
        if running.id != id {
            return None;
        }
        let ended = self.changed(|| self.trial.swap(None))?;
        if promote {
            self.publish_as(ended.candidate.clone(), "promoted (canary)");
        } else {
            ended.candidate.handler.retire();
            self.remember(&ended.candidate.digest, "rolled back (canary)");
            if ended.candidate.digest != self.current().digest {
                self.mark_serving(&ended.candidate.digest, false);
            }
        }
        Some(ended)
    }

    /// The version a rollback would restore.
    pub fn previous(&self) -> Option<Arc<Version>> {
        self.previous.lock().ok().and_then(|p| p.clone())
    }

    /// The subscription's labels.
    pub fn labels(&self) -> &SubLabels {
        &self.labels
    }

    /// Swaps and refusals so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.swaps.get(), self.refusals.get())
    }

    fn info_labels(&self, digest: &Digest) -> HandlerLabels {
        HandlerLabels {
            stream: self.labels.stream.clone(),
            group: self.labels.group.clone(),
            digest: digest.to_string(),
        }
    }

    fn mark_serving(&self, digest: &Digest, serving: bool) {
        if self.metrics.per_subscription() {
            self.metrics
                .handler_info
                .get_or_create(&self.info_labels(digest))
                .set(i64::from(serving));
            return;
        }
        let changed = self.serving.lock().is_ok_and(|mut digests| {
            if serving {
                digests.insert(digest.to_string())
            } else {
                digests.remove(&digest.to_string())
            }
        });
        if changed {
            self.metrics
                .serve_digest(&digest.to_string(), if serving { 1 } else { -1 });
        }
    }

    /// The latest version changes, oldest first.
    pub fn history(&self) -> Vec<Served> {
        self.history
            .lock()
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn remember(&self, digest: &Digest, how: &'static str) {
        if let Ok(mut history) = self.history.lock() {
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(Served {
                at: crate::support::clock::now(),
                digest: digest.clone(),
                how,
            });
        }
    }

    /// Make `version` current; the one it replaces becomes the rollback target.
    pub fn publish(&self, version: Arc<Version>) -> Arc<Version> {
        self.publish_as(version, "swapped in")
    }

    fn publish_as(&self, version: Arc<Version>, how: &'static str) -> Arc<Version> {
        self.remember(&version.digest, how);
        version.handler.activate();
        let old = self.current.swap(version.clone());
        old.handler.retire();
        let dropped = self
            .previous
            .lock()
            .ok()
            .and_then(|mut previous| previous.replace(old.clone()));
        self.mark_serving(&old.digest, false);
        self.mark_serving(&version.digest, true);
        // Only the serving and the rollback digest keep a series: one per upload would grow
        // `/metrics` without end.
        if let Some(dropped) = dropped
            && self.metrics.per_subscription()
            && dropped.digest != version.digest
            && dropped.digest != old.digest
        {
            self.metrics
                .handler_info
                .remove(&self.info_labels(&dropped.digest));
        }
        self.swaps.inc();
        tracing::info!(
            stream = %self.labels.stream,
            group = %self.labels.group,
            from = old.digest.short(),
            to = version.digest.short(),
            "handler swapped"
        );
        old
    }

    /// Put the previous version back.
    pub fn rollback(&self) -> Result<Arc<Version>, NoPrevious> {
        let previous = self.previous().ok_or(NoPrevious)?;
        self.publish_as(previous.clone(), "rolled back to");
        Ok(previous)
    }

    /// Count a refused swap (the caller logs why).
    pub fn count_refusal(&self) {
        self.refusals.inc();
    }

    /// Where the handler versions of this subscription count what they refuse.
    pub fn counters(&self) -> &HandlerCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_buckets_are_quarter_doublings_of_microseconds() {
        let mut us = 1u64;
        while us < 1 << 40 {
            for probe in [us, us + 1, us * 5 / 4, us * 3 / 2, us * 7 / 4] {
                let expected =
                    (((probe as f64).log2() * 4.0).floor() as usize).min(TIME_BUCKETS - 1);
                let got = time_bucket(std::time::Duration::from_micros(probe));
                assert_eq!(got, expected, "{probe} us");
                assert!(
                    bucket_floor_us(got) <= probe as f64 * (1.0 + 1e-12),
                    "{probe} us"
                );
            }
            us *= 2;
        }
        assert_eq!(time_bucket(std::time::Duration::ZERO), 0);
        assert_eq!(time_bucket(std::time::Duration::MAX), TIME_BUCKETS - 1);
    }

    #[test]
    fn a_split_takes_its_share_of_entries_after_its_start_and_only_them() {
        let ids: Vec<String> = (0..20_000)
            .map(|i| format!("{}-{}", 1_000 + i / 7, i % 7))
            .collect();
        let half = Split::new("canary-a", 5_000, 1_000);
        let taken: Vec<bool> = ids.iter().map(|id| half.takes(id)).collect();
        let share = taken.iter().filter(|t| **t).count();
        assert!((9_400..=10_600).contains(&share), "{share} of 20,000 taken");
        // Another canary's key splits the same entries differently.
        let other = Split::new("canary-b", 5_000, 1_000);
        let both = ids
            .iter()
            .zip(&taken)
            .filter(|(id, t)| **t && other.takes(id))
            .count();
        assert!((4_500..=5_500).contains(&both), "{both} taken by both");
        // The same on every call (every attempt, every host).
        assert!(ids.iter().zip(&taken).all(|(id, t)| half.takes(id) == *t));
        let all = Split::new("canary-a", 10_000, 1_000);
        assert!(ids.iter().all(|id| all.takes(id)));
        let none = Split::new("canary-a", 0, 1_000);
        assert!(!ids.iter().any(|id| none.takes(id)));
        // Entries added before the start, and ids that are not entry ids, never.
        assert!(!all.takes("999-0"));
        assert!(!all.takes("not-an-id") && !all.takes("") && !all.takes("5000"));
        assert!(!all.takes("-1") && !all.takes("99999999999999999999999-0"));
        assert_eq!(
            crate::support::when::entry_ms("1700000000000-3"),
            Some(1_700_000_000_000)
        );
    }
}
