//! The probes and the scrape: `GET /healthz` (the process is alive; routed in [`super`]),
//! `GET /readyz` (every subscription can read and its Redis answers a PING) and `GET /metrics`
//! (Prometheus text), whose gauges of Redis state (pending entries, lag, parked entries, dead
//! letters, stream sizes) are sampled at scrape time within a budget (see [`refresh_samples`]).

use std::collections::HashSet;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use super::{AdminState, AdminSubscription, PROBE_TIMEOUT};
use crate::observe::metrics::{Metrics, SubLabels};
use crate::store::inspect::StreamSize;

/// `GET /readyz`: 200 `ready` when every subscription can read and every Redis answers, else
/// 503 naming the first that does not.
pub(super) async fn ready_handler(State(state): State<AdminState>) -> impl IntoResponse {
    // One PING per Redis, however many subscriptions share it.
    let mut pinged: Vec<&crate::store::redis_conn::RedisHandle> = Vec::new();
    for sub in state.subscriptions.iter() {
        if let Some(problem) = sub.health.problem() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "not ready: the subscription to stream `{}` (group `{}`) cannot read: {problem}\n",
                    sub.labels.stream, sub.labels.group
                ),
            );
        }
        if pinged.iter().any(|conn| conn.same_as(&sub.conn)) {
            continue;
        }
        pinged.push(&sub.conn);
        let mut conn = sub.conn.clone();
        let ping = tokio::time::timeout(
            PROBE_TIMEOUT,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await;
        let problem = match ping {
            Ok(Ok(_)) => continue,
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: Redis for stream `{}` (group `{}`) is unreachable: {problem}\n",
                sub.labels.stream, sub.labels.group
            ),
        );
    }
    (StatusCode::OK, "ready\n".to_owned())
}

/// `GET /metrics`: the metrics in OpenMetrics text, the Redis gauges sampled first.
pub(super) async fn metrics_handler(State(state): State<AdminState>) -> impl IntoResponse {
    {
        // Held while sampling: a second scrape waits and then finds the samples fresh,
        // instead of asking Redis the same again.
        let mut samples = state.redis_samples.lock().await;
        refresh_samples(&state.subscriptions, &mut samples).await;
        let taken: Vec<RedisSample> = samples.iter().map(|(s, _)| s.clone()).collect();
        publish_samples(&state.metrics, &state.subscriptions, &taken);
    }
    let readings = state.scaling.readings().await;
    let labels: Vec<SubLabels> = state
        .subscriptions
        .iter()
        .map(|s| s.labels.clone())
        .collect();
    super::scaling::publish(&state.metrics, &labels, &readings);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// A sample younger than this is not taken again: scrapes more often than this cost Redis
/// nothing more.
const SAMPLE_FRESH: Duration = Duration::from_secs(5);
/// Subscriptions sampled at once (their commands pipelined on the shared connections).
const SAMPLE_AT_ONCE: usize = 32;
/// The longest a scrape spends sampling; subscriptions not reached keep their last sample.
const SAMPLE_BUDGET: Duration = Duration::from_secs(3);

/// Each subscription's last sample and when it was last tried (answered or not).
pub(super) type Samples = Vec<(RedisSample, Option<tokio::time::Instant>)>;

/// What one subscription's Redis state was when last sampled.
#[derive(Debug, Clone, Default)]
pub(super) struct RedisSample {
    taken: Option<tokio::time::Instant>,
    size: Option<StreamSize>,
    /// Its group's pending entries and unread ones, its retry lane's included.
    pending: Option<u64>,
    lag: Option<u64>,
    dead_letters: u64,
    /// Parked entries and the earliest due time (Unix seconds, 0 when none).
    parked: Option<(u64, i64)>,
}

/// Sample the subscriptions whose sample is older than [`SAMPLE_FRESH`], oldest first,
/// [`SAMPLE_AT_ONCE`] at a time, for at most [`SAMPLE_BUDGET`].
async fn refresh_samples(subscriptions: &[AdminSubscription], samples: &mut Samples) {
    use futures::StreamExt;
    samples.resize_with(subscriptions.len(), Default::default);
    let now = tokio::time::Instant::now();
    // By when each was last tried, answered or not: a Redis that does not answer goes to
    // the back of the line instead of taking every scrape's budget.
    let mut stale: Vec<usize> = (0..subscriptions.len())
        .filter(|&i| {
            samples[i]
                .1
                .is_none_or(|at| now.duration_since(at) >= SAMPLE_FRESH)
        })
        .collect();
    stale.sort_by_key(|&i| samples[i].1);
    let mut taken = futures::stream::iter(stale)
        .map(|i| async move {
            let sample = tokio::time::timeout(PROBE_TIMEOUT, sample(&subscriptions[i])).await;
            (i, sample)
        })
        .buffer_unordered(SAMPLE_AT_ONCE);
    let deadline = now + SAMPLE_BUDGET;
    loop {
        match tokio::time::timeout_at(deadline, taken.next()).await {
            Ok(Some((i, Ok(Some(sample))))) => {
                samples[i] = (sample, Some(tokio::time::Instant::now()));
            }
            Ok(Some((i, _))) => {
                samples[i].1 = Some(tokio::time::Instant::now());
                tracing::debug!(stream = %subscriptions[i].labels.stream, "Redis gauges not sampled");
            }
            Ok(None) => break,
            Err(_) => {
                tracing::debug!(
                    "Redis gauges: sampling budget spent, the rest keep their last sample"
                );
                break;
            }
        }
    }
}

/// One subscription's Redis state, `None` when Redis did not answer.
async fn sample(sub: &AdminSubscription) -> Option<RedisSample> {
    let mut conn = sub.conn.clone();
    let snapshot = crate::store::inspect::snapshot(
        &mut conn,
        &sub.labels.stream,
        &sub.labels.group,
        &sub.dead_letter,
        sub.delayed_key.as_deref(),
        sub.lane.as_deref(),
    )
    .await
    .ok()?;
    let size = crate::store::inspect::stream_size(&mut conn, &sub.labels.stream)
        .await
        .ok();
    // With a retry lane, its pending and unread entries count too: they are the same
    // subscription's work.
    let lane = snapshot.lane;
    let (pending, lag) = match snapshot.group {
        Some(group) => {
            let lane_pending = lane.as_ref().map_or(0, |l| l.pending as u64);
            let lag = group.lag.map(|lag| {
                let lane_lag = lane.as_ref().and_then(|l| l.lag).unwrap_or(0);
                (lag + lane_lag) as u64
            });
            (Some(group.pending as u64 + lane_pending), lag)
        }
        None => (None, None),
    };
    Some(RedisSample {
        taken: Some(tokio::time::Instant::now()),
        size,
        pending,
        lag,
        dead_letters: snapshot.dead_letters,
        parked: snapshot
            .delayed
            .map(|d| (d.parked, d.next_due_ms.map_or(0, |ms| ms / 1000))),
    })
}

/// Set the Redis-state gauges from the samples: each subscription's, or their sums per host
/// (a stream read by several groups counted once).
fn publish_samples(
    metrics: &Metrics,
    subscriptions: &[AdminSubscription],
    samples: &[RedisSample],
) {
    let now_ms = crate::support::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let taken = subscriptions
        .iter()
        .zip(samples)
        .filter(|(_, s)| s.taken.is_some());
    if metrics.per_subscription() {
        for (sub, s) in taken {
            publish_one(metrics, &sub.labels, s, now_ms);
        }
        return;
    }
    let mut sums = HostSums::default();
    for (sub, s) in taken {
        sums.add(sub, s, now_ms);
    }
    sums.publish(metrics);
}

/// A gauge's value from a count.
fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// How old a stream's oldest entry is at `now_ms`, in seconds (0 when empty).
fn age(size: &StreamSize, now_ms: i64) -> i64 {
    size.oldest_ms
        .map_or(0, |oldest| (now_ms - oldest).max(0) / 1000)
}

/// Set one subscription's gauges from its sample (`now_ms`: this host's clock).
fn publish_one(metrics: &Metrics, labels: &SubLabels, s: &RedisSample, now_ms: i64) {
    if let Some(size) = &s.size {
        metrics
            .stream_length
            .get_or_create(labels)
            .set(gauge(size.length));
        metrics
            .stream_bytes
            .get_or_create(labels)
            .set(gauge(size.bytes));
        metrics
            .stream_oldest_age
            .get_or_create(labels)
            .set(age(size, now_ms));
    }
    if let Some(pending) = s.pending {
        metrics.pending.get_or_create(labels).set(gauge(pending));
    }
    if let Some(lag) = s.lag {
        metrics.lag.get_or_create(labels).set(gauge(lag));
    }
    metrics
        .dead_letters
        .get_or_create(labels)
        .set(gauge(s.dead_letters));
    if let Some((parked, due)) = s.parked {
        metrics.parked.get_or_create(labels).set(gauge(parked));
        metrics.parked_oldest_due.get_or_create(labels).set(due);
    }
}

/// The host's sums of the samples: a stream (or a dead-letter stream) read by several groups
/// counted once.
#[derive(Default)]
struct HostSums<'a> {
    streams: HashSet<&'a str>,
    dead_letter_streams: HashSet<&'a str>,
    length: u64,
    bytes: u64,
    oldest_age: i64,
    pending: u64,
    lag: u64,
    dead_letters: u64,
    parked: u64,
    earliest_due: Option<i64>,
}

impl<'a> HostSums<'a> {
    /// Add one subscription's sample (`now_ms`: this host's clock).
    fn add(&mut self, sub: &'a AdminSubscription, s: &RedisSample, now_ms: i64) {
        if let Some(size) = &s.size
            && self.streams.insert(sub.labels.stream.as_str())
        {
            self.length = self.length.saturating_add(size.length);
            self.bytes = self.bytes.saturating_add(size.bytes);
            self.oldest_age = self.oldest_age.max(age(size, now_ms));
        }
        self.pending = self.pending.saturating_add(s.pending.unwrap_or(0));
        self.lag = self.lag.saturating_add(s.lag.unwrap_or(0));
        if self.dead_letter_streams.insert(sub.dead_letter.as_str()) {
            self.dead_letters = self.dead_letters.saturating_add(s.dead_letters);
        }
        if let Some((n, due)) = s.parked {
            self.parked = self.parked.saturating_add(n);
            if due > 0 {
                self.earliest_due = Some(self.earliest_due.map_or(due, |e| e.min(due)));
            }
        }
    }

    /// Set the host's gauges to the sums.
    fn publish(&self, metrics: &Metrics) {
        let host = metrics.series(&Metrics::labels("", ""));
        metrics
            .stream_length
            .get_or_create(&host)
            .set(gauge(self.length));
        metrics
            .stream_bytes
            .get_or_create(&host)
            .set(gauge(self.bytes));
        metrics
            .stream_oldest_age
            .get_or_create(&host)
            .set(self.oldest_age);
        metrics
            .pending
            .get_or_create(&host)
            .set(gauge(self.pending));
        metrics.lag.get_or_create(&host).set(gauge(self.lag));
        metrics
            .dead_letters
            .get_or_create(&host)
            .set(gauge(self.dead_letters));
        metrics.parked.get_or_create(&host).set(gauge(self.parked));
        metrics
            .parked_oldest_due
            .get_or_create(&host)
            .set(self.earliest_due.unwrap_or(0));
    }
}
