//! What the page's charts are drawn from, kept by the host itself (no Prometheus needed): the
//! delivery counts every [`SAMPLE_EVERY`] for the last ten minutes, and every minute for the
//! last hour the counts, the retry lateness per bucket (for the minute's p99) and the consumer
//! lag. The lag is read from Redis (the scaling board) only while someone has looked at the
//! page in the last [`WATCHED_FOR`]: an idle host nobody watches asks Redis nothing for it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::AdminState;
use crate::observe::metrics::lateness::Counts;

/// Deliveries counted so far at one moment: acked, retried, failed (dead-lettered by the
/// handler, trapped or over a limit).
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) at_ms: i64,
    pub(crate) counts: [u64; 3],
}

/// One minute's sample: the counts, the lateness buckets, and the lag when it was read.
#[derive(Debug, Clone)]
pub(crate) struct MinuteSample {
    pub(crate) at_ms: i64,
    pub(crate) counts: [u64; 3],
    pub(crate) lateness: Counts,
    /// Unread entries of every subscription (their retry lanes' too), if read this minute.
    pub(crate) lag: Option<u64>,
}

/// How often the counts are sampled, and how many samples are kept (10 minutes).
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const SAMPLES: usize = 121;
/// Minute samples kept (an hour).
const MINUTES: usize = 61;
/// Lag is read while the page was looked at within this long.
const WATCHED_FOR: Duration = Duration::from_secs(900);

/// The host's samples.
#[derive(Default)]
pub(crate) struct Samples {
    pub(crate) seconds: Mutex<VecDeque<Sample>>,
    pub(crate) minutes: Mutex<VecDeque<MinuteSample>>,
    /// When the page was last looked at (epoch ms).
    viewed_ms: AtomicI64,
}

impl Samples {
    /// Someone looks at the page: the lag is read for the next [`WATCHED_FOR`].
    pub(crate) fn viewed(&self) {
        self.viewed_ms
            .store(crate::support::when::now_ms(), Ordering::Relaxed);
    }

    fn watched(&self, now_ms: i64) -> bool {
        now_ms - self.viewed_ms.load(Ordering::Relaxed) < WATCHED_FOR.as_millis() as i64
    }
}

fn push<T>(ring: &Mutex<VecDeque<T>>, cap: usize, item: T) {
    if let Ok(mut ring) = ring.lock() {
        if ring.len() == cap {
            ring.pop_front();
        }
        ring.push_back(item);
    }
}

/// Every [`SAMPLE_EVERY`], the host's delivery counts; every minute, the minute's sample.
pub(super) async fn run(state: AdminState, stop: CancellationToken) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    let per_minute = (60 / SAMPLE_EVERY.as_secs()).max(1);
    let mut tick = 0u64;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let mut counts = [0u64; 3];
        for sub in state.subscriptions.iter() {
            for (label, n) in state.metrics.outcomes(&sub.labels) {
                let i = match label {
                    "ack" => 0,
                    "retry" => 1,
                    _ => 2,
                };
                counts[i] += n;
            }
        }
        let at_ms = crate::support::when::now_ms();
        push(&state.samples.seconds, SAMPLES, Sample { at_ms, counts });
        if tick.is_multiple_of(per_minute) {
            let lag = if state.samples.watched(at_ms) {
                let readings = state.scaling.readings().await;
                Some(readings.iter().flatten().map(|r| r.unread).sum())
            } else {
                None
            };
            let lateness = state.metrics.lateness_counts.read();
            push(
                &state.samples.minutes,
                MINUTES,
                MinuteSample {
                    at_ms,
                    counts,
                    lateness,
                    lag,
                },
            );
        }
        tick += 1;
    }
}
