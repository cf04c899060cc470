//! A trial: a candidate version a share of deliveries runs beside the serving one (a canary),
//! chosen per entry by a keyed hash of its origin id, and what each version's attempts came to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::observe::metrics::{CanaryLabels, CanaryVersionLabels, Metrics, SubLabels};

use super::Version;

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
    pub(super) done: tokio::sync::watch::Sender<bool>,
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

    pub(super) fn holds(&self, origin_id: &str) -> bool {
        self.holds_all || self.split.takes(origin_id)
    }
}
