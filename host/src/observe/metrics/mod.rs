//! Prometheus metrics, labelled by stream and group (never by entry id), or summed per host.
//!
//! With `metrics_per_subscription` (the default up to 200 subscriptions) every series carries
//! its subscription's `stream` and `group`. Without it, those labels are empty and each family
//! is one series per host (per `outcome`, `digest`, ... where it has such a label): counters
//! and histograms add every subscription's, scrape-time gauges add theirs (streams counted
//! once; the oldest age is the greatest, the due time the earliest), and the state gauges
//! count subscriptions (`paused`: how many are paused; `breaker_state`: how many breakers are
//! not closed; `canary_share_basis_points`: how many canaries run; `handler_info`: how many
//! subscriptions each digest serves). Each subscription's own counts are kept besides, for the
//! page, `/v1/subscriptions` and the counts in Redis, whatever `/metrics` shows.
//!
//! Counters and histograms are updated where things happen (dispatch, sweep, reconnect);
//! gauges that describe Redis state (pending entries, lag, parked entries, oldest due time) are
//! sampled when `/metrics` is scraped, so they are never stale and cost nothing in between.
//!
//! Every family, its type, labels and meaning are in one table, [`series::SERIES`], which
//! registers them here and writes the book's metrics reference.

pub mod lateness;
pub mod series;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// The labels every metric carries.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SubLabels {
    pub stream: String,
    pub group: String,
}

/// Labels of the deliveries counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub stream: String,
    pub group: String,
    /// [`HandlerResult::label`].
    pub outcome: &'static str,
}

/// Labels of the handler info metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerLabels {
    pub stream: String,
    pub group: String,
    /// The handler's SHA-256 digest.
    pub digest: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric family of the host.
pub struct Metrics {
    registry: Registry,
    /// Whether series carry their subscription's labels (see the module doc).
    per_subscription: bool,
    /// Each subscription's own counts, by name, whatever the series show.
    own: Mutex<HashMap<(SubLabels, &'static str), Counter>>,
    /// Held while a summed `handler_info` series moves, so that one going to 0 is removed
    /// before another subscription adds to it.
    digests: Mutex<()>,
    /// Handler results counted by this host, of every subscription: what moved since a look
    /// (see [`Metrics::results_counted`]).
    results_counted: Arc<AtomicU64>,
    /// Retry lateness counted per bucket, for the page's per-minute p99.
    pub lateness_counts: Arc<lateness::LatenessCounts>,
    /// Handler results.
    pub deliveries: Family<OutcomeLabels, Counter>,
    /// Time in the handler.
    pub handler_duration: HistogramFamily<SubLabels>,
    /// Deliveries in the handler now.
    pub in_flight: Family<SubLabels, Gauge>,
    /// PEL size, sampled at scrape.
    pub pending: Family<SubLabels, Gauge>,
    /// Unread entries, sampled at scrape.
    pub lag: Family<SubLabels, Gauge>,
    /// Parked entries, sampled at scrape.
    pub parked: Family<SubLabels, Gauge>,
    /// Earliest parked due time (Unix seconds), sampled at scrape.
    pub parked_oldest_due: Family<SubLabels, Gauge>,
    /// Dead-letter stream length, sampled at scrape.
    pub dead_letters: Family<SubLabels, Gauge>,
    /// Entries that need a host now (unread, pending, parked and due), sampled at scrape.
    pub scaling_needs_host_now: Family<SubLabels, Gauge>,
    /// Seconds until the next parked entry is due; absent when none is parked.
    pub scaling_next_due: Family<SubLabels, Gauge<f64, AtomicU64>>,
    /// Stream entries trimmed by retention.
    pub retention_trimmed: Family<SubLabels, Counter>,
    /// Retention runs blocked by what groups need.
    pub retention_blocked: Family<SubLabels, Counter>,
    /// Entries in the stream.
    pub stream_length: Family<SubLabels, Gauge>,
    /// The stream's memory.
    pub stream_bytes: Family<SubLabels, Gauge>,
    /// Age of the stream's oldest entry, seconds.
    pub stream_oldest_age: Family<SubLabels, Gauge>,
    /// Entries moved per sweep pass.
    pub sweep_moved: HistogramFamily<SubLabels>,
    /// Sweep pass duration.
    pub sweep_duration: HistogramFamily<SubLabels>,
    /// How late a due retry was moved back, seconds.
    pub retry_lateness: HistogramFamily<SubLabels>,
    /// Retries longer than the set's ttl.
    pub retry_over_ttl: Family<SubLabels, Counter>,
    /// Reconnections of the read loop.
    pub reconnects: Family<SubLabels, Counter>,
    /// Read loops restarted after they ended or panicked.
    pub read_loop_restarts: Family<SubLabels, Counter>,
    /// Which handler serves.
    pub handler_info: Family<HandlerLabels, Gauge>,
    /// Hot swaps and rollbacks.
    pub swaps: Family<SubLabels, Counter>,
    /// Refused swaps.
    pub swap_refusals: Family<SubLabels, Counter>,
    /// Outbound HTTP requests refused by `allowed_outbound_hosts`.
    pub http_denied: Family<SubLabels, Counter>,
    /// Retry delays clamped to `max_delay`.
    pub retry_delay_clamped: Family<SubLabels, Counter>,
    /// Settles Redis refused for good (the entry stays pending).
    pub settle_errors: Family<SubLabels, Counter>,
    /// Other groups' retry copies acknowledged unhandled.
    pub other_groups_retries: Family<SubLabels, Counter>,
    /// Guest log lines dropped or truncated by the log budget.
    pub guest_log_dropped: Family<SubLabels, Counter>,
    /// Dead-letter reasons cut to their bound.
    pub reasons_cut: Family<SubLabels, Counter>,
    /// Spans dropped because the trace exporter's queue was full (synced from
    /// [`crate::observe::telemetry::dropped_total`] when scraped).
    pub trace_spans_dropped: Counter,
    /// Producers' trace context fields ignored as invalid (synced from
    /// [`crate::observe::telemetry::context::rejected_total`] when scraped).
    pub trace_context_rejected: Counter,
    /// 1 while the subscription is paused (by an operator, for every host of its group).
    pub paused: Family<SubLabels, Gauge>,
    /// Script calls that took tokens from the shared rate limit's bucket.
    pub rate_limit_calls: Family<SubLabels, Counter>,
    /// Reads that waited for the shared rate limit's budget.
    pub rate_limit_waits: Family<SubLabels, Counter>,
    /// The circuit breaker: 0 closed, 1 open, 2 half-open (probing).
    pub breaker_state: Family<SubLabels, Gauge>,
    /// Circuit-breaker transitions this host made, by the state it moved to.
    pub breaker_transitions: Family<TransitionLabels, Counter>,
    /// A canary's attempts on this host, by version and result.
    pub canary_deliveries: Family<CanaryLabels, Counter>,
    /// A canary's handler time on this host, by version.
    pub canary_handler_duration: HistogramFamily<CanaryVersionLabels>,
    /// The share of deliveries a running canary's candidate takes, in basis points (0: none).
    pub canary_share: Family<SubLabels, Gauge>,
    /// Canaries ended while this host ran them, by verdict.
    pub canary_verdicts: Family<VerdictLabels, Counter>,
    /// Entries of ordered subscriptions handled unordered, by why.
    pub ordered_unkeyed: Family<ReasonLabels, Counter>,
    /// Entries queued behind their key's turn.
    pub ordered_held: Family<SubLabels, Counter>,
    /// Queued entries this host let in.
    pub ordered_let_in: Family<SubLabels, Counter>,
    /// Entries acknowledged as duplicates of their dedupe key's first entry.
    pub dedupe_duplicates: Family<SubLabels, Counter>,
    /// Entries of a deduplicating subscription handled without a key, by why.
    pub dedupe_unkeyed: Family<ReasonLabels, Counter>,
    /// Outbound calls through the journal (`effects = "journal"`), by what became of them.
    pub journal_calls: Family<ReasonLabels, Counter>,
    /// The registered families' names, in order.
    families: Vec<&'static str>,
}

/// The labels of a counter by reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub stream: String,
    pub group: String,
    /// Why.
    pub reason: &'static str,
}

/// The labels of a canary's attempt counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CanaryLabels {
    pub stream: String,
    pub group: String,
    /// `incumbent` or `candidate`.
    pub version: &'static str,
    /// `ack`, `retry`, `dead_letter` or `failure`.
    pub result: &'static str,
}

/// The labels of a canary's per-version handler time.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CanaryVersionLabels {
    pub stream: String,
    pub group: String,
    /// `incumbent` or `candidate`.
    pub version: &'static str,
}

/// The labels of a canary's verdict counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub stream: String,
    pub group: String,
    /// `promoted` or `rolled_back`.
    pub verdict: &'static str,
}

/// The labels of a circuit-breaker transition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub stream: String,
    pub group: String,
    /// `open`, `half-open` or `closed`.
    pub to: &'static str,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 22))
}

fn count_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 9))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Metrics {
    /// Every family, registered; `per_subscription` says whether series carry their
    /// subscription's labels or are summed per host (see the module doc).
    pub fn new(per_subscription: bool) -> Self {
        let mut registry = Registry::with_prefix("sluice");
        let mut families = Vec::new();
        // Each family registered under its name with its row's help (see `series.rs`).
        macro_rules! reg {
            ($name:literal, $metric:expr) => {
                registered(&mut registry, &mut families, $name, $metric)
            };
        }
        Self {
            per_subscription,
            own: Mutex::default(),
            digests: Mutex::default(),
            deliveries: reg!("deliveries", Family::default()),
            handler_duration: reg!(
                "handler_duration_seconds",
                Family::new_with_constructor(seconds_histogram)
            ),
            in_flight: reg!("in_flight", Family::default()),
            pending: reg!("pending_entries", Family::default()),
            lag: reg!("consumer_lag", Family::default()),
            parked: reg!("parked_entries", Family::default()),
            parked_oldest_due: reg!("parked_oldest_due_seconds", Family::default()),
            dead_letters: reg!("dead_letter_entries", Family::default()),
            scaling_needs_host_now: reg!("scaling_needs_host_now", Family::default()),
            scaling_next_due: reg!("scaling_next_due_seconds", Family::default()),
            retention_trimmed: reg!("retention_trimmed", Family::default()),
            retention_blocked: reg!("retention_blocked", Family::default()),
            stream_length: reg!("stream_length", Family::default()),
            stream_bytes: reg!("stream_bytes", Family::default()),
            stream_oldest_age: reg!("stream_oldest_age_seconds", Family::default()),
            sweep_moved: reg!("sweep_moved", Family::new_with_constructor(count_histogram)),
            sweep_duration: reg!(
                "sweep_duration_seconds",
                Family::new_with_constructor(seconds_histogram)
            ),
            retry_lateness: reg!(
                "retry_lateness_seconds",
                Family::new_with_constructor(seconds_histogram)
            ),
            retry_over_ttl: reg!("retry_over_ttl", Family::default()),
            reconnects: reg!("redis_reconnects", Family::default()),
            read_loop_restarts: reg!("read_loop_restarts", Family::default()),
            handler_info: reg!("handler_info", Family::default()),
            swaps: reg!("handler_swaps", Family::default()),
            swap_refusals: reg!("handler_swap_refusals", Family::default()),
            http_denied: reg!("http_denied", Family::default()),
            retry_delay_clamped: reg!("retry_delay_clamped", Family::default()),
            settle_errors: reg!("settle_errors", Family::default()),
            other_groups_retries: reg!("other_groups_retries", Family::default()),
            guest_log_dropped: reg!("guest_log_dropped", Family::default()),
            reasons_cut: reg!("reasons_cut", Family::default()),
            trace_spans_dropped: reg!("trace_spans_dropped", Counter::default()),
            trace_context_rejected: reg!("trace_context_rejected", Counter::default()),
            paused: reg!("paused", Family::default()),
            rate_limit_calls: reg!("rate_limit_calls", Family::default()),
            rate_limit_waits: reg!("rate_limit_waits", Family::default()),
            breaker_state: reg!("breaker_state", Family::default()),
            breaker_transitions: reg!("breaker_transitions", Family::default()),
            canary_deliveries: reg!("canary_deliveries", Family::default()),
            canary_handler_duration: reg!(
                "canary_handler_seconds",
                Family::new_with_constructor(seconds_histogram)
            ),
            canary_share: reg!("canary_share_basis_points", Family::default()),
            canary_verdicts: reg!("canary_verdicts", Family::default()),
            ordered_unkeyed: reg!("ordered_unkeyed", Family::default()),
            ordered_held: reg!("ordered_held", Family::default()),
            ordered_let_in: reg!("ordered_let_in", Family::default()),
            journal_calls: reg!("journal_calls", Family::default()),
            dedupe_duplicates: reg!("dedupe_duplicates", Family::default()),
            dedupe_unkeyed: reg!("dedupe_unkeyed", Family::default()),
            registry,
            results_counted: Arc::default(),
            lateness_counts: Arc::default(),
            families,
        }
    }

    /// The names of the families registered, in order (each has a row in [`series::SERIES`]).
    pub fn families(&self) -> &[&'static str] {
        &self.families
    }
}

/// Register `metric` under `name` with its help from [`series::SERIES`], and hand it back, so
/// each field is declared in one place.
fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    families: &mut Vec<&'static str>,
    name: &'static str,
    metric: M,
) -> M {
    registry.register(name, series::help(name), metric.clone());
    families.push(name);
    metric
}

impl Metrics {
    /// How many handler results this host has counted, of every subscription: a host-wide
    /// task that follows the counts does nothing while this does not move.
    pub fn results_counted(&self) -> u64 {
        self.results_counted.load(Ordering::Acquire)
    }

    /// Whether series carry their subscription's labels.
    pub fn per_subscription(&self) -> bool {
        self.per_subscription
    }

    /// The counter of `family` for `labels` (a subscription's series) and `reason`.
    pub fn reason_counter(
        family: &Family<ReasonLabels, Counter>,
        labels: &SubLabels,
        reason: &'static str,
    ) -> Counter {
        family
            .get_or_create(&ReasonLabels {
                stream: labels.stream.clone(),
                group: labels.group.clone(),
                reason,
            })
            .clone()
    }

    /// The labels a subscription's series carry: its own, or the host's (empty) when
    /// per-subscription metrics are off.
    pub fn series(&self, labels: &SubLabels) -> SubLabels {
        if self.per_subscription {
            labels.clone()
        } else {
            SubLabels {
                stream: String::new(),
                group: String::new(),
            }
        }
    }

    /// One subscription's count named `name`, kept for it and added to its series in
    /// `family`.
    pub fn count(
        &self,
        family: &Family<SubLabels, Counter>,
        labels: &SubLabels,
        name: &'static str,
    ) -> Count {
        Count {
            own: self.own(labels, name),
            series: family.get_or_create(&self.series(labels)).clone(),
        }
    }

    /// A gauge a subscription adds its value to (the whole gauge, with per-subscription
    /// series).
    pub fn share(&self, family: &Family<SubLabels, Gauge>, labels: &SubLabels) -> Share {
        Share {
            gauge: family.get_or_create(&self.series(labels)).clone(),
            mine: AtomicI64::new(0),
            summed: !self.per_subscription,
        }
    }

    /// With summed series: one more (`delta` 1) or one fewer (-1) subscription served by
    /// `digest`; a digest that serves none leaves `/metrics`, so swaps do not add series for
    /// ever.
    pub fn serve_digest(&self, digest: &str, delta: i64) {
        let Ok(_held) = self.digests.lock() else {
            return;
        };
        let labels = HandlerLabels {
            stream: String::new(),
            group: String::new(),
            digest: digest.to_owned(),
        };
        let now = self.handler_info.get_or_create(&labels).inc_by(delta) + delta;
        if now <= 0 {
            self.handler_info.remove(&labels);
        }
    }

    fn own(&self, labels: &SubLabels, name: &'static str) -> Counter {
        let Ok(mut own) = self.own.lock() else {
            return Counter::default();
        };
        own.entry((labels.clone(), name)).or_default().clone()
    }

    /// One subscription's count named `name` so far (0 if it has none).
    pub fn own_count(&self, labels: &SubLabels, name: &'static str) -> u64 {
        self.own
            .lock()
            .ok()
            .and_then(|own| own.get(&(labels.clone(), name)).map(Counter::get))
            .unwrap_or(0)
    }

    /// Reads of the subscription that waited for its rate limit's budget on this host.
    pub fn rate_limit_waits(&self, labels: &SubLabels) -> u64 {
        self.own_count(labels, "rate_limit_waits")
    }

    /// The labels of a subscription.
    pub fn labels(stream: &str, group: &str) -> SubLabels {
        SubLabels {
            stream: stream.to_owned(),
            group: group.to_owned(),
        }
    }

    /// One subscription's deliveries so far, per handler result (`ack`, `retry`, ...).
    pub fn outcomes(&self, labels: &SubLabels) -> Vec<(&'static str, u64)> {
        HandlerResult::ALL
            .iter()
            .map(|result| (result.label(), self.own_count(labels, result.label())))
            .collect()
    }

    /// How many handler results, of any kind, one subscription has had.
    pub fn handler_results(&self, labels: &SubLabels) -> u64 {
        HandlerResult::ALL
            .iter()
            .map(|result| self.own_count(labels, result.label()))
            .sum()
    }

    /// One subscription's per-delivery metrics, looked up once: a family lookup hashes the
    /// labels under a lock, which has no place on the path of every delivery.
    pub fn for_deliveries(&self, labels: &SubLabels) -> DeliveryMetrics {
        let series = self.series(labels);
        DeliveryMetrics {
            in_flight: self.in_flight.get_or_create(&series).clone(),
            duration: self.handler_duration.get_or_create(&series).clone(),
            lateness: self.retry_lateness.get_or_create(&series).clone(),
            lateness_counts: self.lateness_counts.clone(),
            clamped: self.retry_delay_clamped.get_or_create(&series).clone(),
            settle_errors: self.settle_errors.get_or_create(&series).clone(),
            other_groups_retries: self.other_groups_retries.get_or_create(&series).clone(),
            reasons_cut: self.reasons_cut.get_or_create(&series).clone(),
            deliveries: self.deliveries.clone(),
            own: HandlerResult::ALL.map(|result| self.own(labels, result.label())),
            labels: series,
            outcomes: Default::default(),
            counted: self.results_counted.clone(),
        }
    }

    /// The Prometheus (OpenMetrics) text exposition.
    pub fn encode(&self) -> String {
        let dropped = crate::observe::telemetry::dropped_total();
        let counted = self.trace_spans_dropped.get();
        if dropped > counted {
            self.trace_spans_dropped.inc_by(dropped - counted);
        }
        let rejected = crate::observe::telemetry::context::rejected_total();
        let counted = self.trace_context_rejected.get();
        if rejected > counted {
            self.trace_context_rejected.inc_by(rejected - counted);
        }
        let mut out = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(%err, "cannot encode metrics");
        }
        out
    }
}

/// The metrics a dispatcher updates on every delivery, resolved for its subscription.
pub struct DeliveryMetrics {
    /// Deliveries being handled.
    pub in_flight: Gauge,
    /// Time in the handler.
    pub duration: Histogram,
    /// Lateness of parked retries.
    pub lateness: Histogram,
    /// The host's lateness counts (see [`lateness`]).
    pub lateness_counts: Arc<lateness::LatenessCounts>,
    /// Retry delays clamped to `max_delay`.
    pub clamped: Counter,
    /// Settles refused for good.
    pub settle_errors: Counter,
    /// Other groups' retry copies acknowledged unhandled.
    pub other_groups_retries: Counter,
    /// Dead-letter reasons cut to their bound.
    pub reasons_cut: Counter,
    deliveries: Family<OutcomeLabels, Counter>,
    /// The subscription's own count of each outcome.
    own: [Counter; HandlerResult::ALL.len()],
    /// The labels of its series.
    labels: SubLabels,
    /// One counter per outcome, created on its first use (an outcome that never happened
    /// is not exported), then reused without a family lookup.
    outcomes: [std::sync::OnceLock<Counter>; HandlerResult::ALL.len()],
    counted: Arc<AtomicU64>,
}

/// What a handler call came to, as `sluice_deliveries_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerResult {
    /// The handler acked.
    Ack,
    /// The handler asked for a retry.
    Retry,
    /// The handler gave up on the entry.
    DeadLetter,
    /// The guest trapped or could not be instantiated.
    Trap,
    /// The guest hit a limit (time, memory, fuel, host resources).
    Limit,
}

impl HandlerResult {
    const ALL: [Self; 5] = [
        Self::Ack,
        Self::Retry,
        Self::DeadLetter,
        Self::Trap,
        Self::Limit,
    ];

    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::Retry => "retry",
            Self::DeadLetter => "dead_letter",
            Self::Trap => "trap",
            Self::Limit => "limit",
        }
    }
}

impl DeliveryMetrics {
    /// Count one handler result.
    pub fn count(&self, result: HandlerResult) {
        self.outcomes[result as usize]
            .get_or_init(|| {
                self.deliveries
                    .get_or_create(&OutcomeLabels {
                        stream: self.labels.stream.clone(),
                        group: self.labels.group.clone(),
                        outcome: result.label(),
                    })
                    .clone()
            })
            .inc();
        self.own[result as usize].inc();
        self.counted.fetch_add(1, Ordering::Release);
    }
}

/// A count of one subscription's: kept for it, and added to its series (shared with every
/// other subscription of the host when per-subscription metrics are off).
#[derive(Clone)]
pub struct Count {
    own: Counter,
    series: Counter,
}

impl Count {
    /// Count one.
    pub fn inc(&self) {
        self.own.inc();
        self.series.inc();
    }

    /// The subscription's own count.
    pub fn get(&self) -> u64 {
        self.own.get()
    }
}

/// One subscription's part of a gauge: setting it moves the gauge by the change, so a gauge
/// shared by every subscription of the host (per-subscription metrics off) holds their sum.
pub struct Share {
    gauge: Gauge,
    mine: AtomicI64,
    summed: bool,
}

impl Share {
    /// Make this subscription's part `value`.
    pub fn set(&self, value: i64) {
        let was = self.mine.swap(value, Ordering::AcqRel);
        if value != was {
            self.gauge.inc_by(value - was);
        }
    }

    /// Whether the gauge sums several subscriptions (then a state is best given as 0 or 1,
    /// so the sum counts the subscriptions in it).
    pub fn summed(&self) -> bool {
        self.summed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summed_series_add_every_subscription_and_keep_each_ones_own_count() {
        let metrics = Metrics::new(false);
        let (a, b) = (Metrics::labels("a", "g"), Metrics::labels("b", "g"));
        let (paused_a, paused_b) = (
            metrics.share(&metrics.paused, &a),
            metrics.share(&metrics.paused, &b),
        );
        paused_a.set(1);
        paused_b.set(1);
        paused_a.set(1);
        let host = metrics.series(&a);
        assert_eq!(metrics.paused.get_or_create(&host).get(), 2);
        paused_b.set(0);
        assert_eq!(metrics.paused.get_or_create(&host).get(), 1);

        let (swaps_a, swaps_b) = (
            metrics.count(&metrics.swaps, &a, "swaps"),
            metrics.count(&metrics.swaps, &b, "swaps"),
        );
        swaps_a.inc();
        swaps_a.inc();
        swaps_b.inc();
        assert_eq!((swaps_a.get(), swaps_b.get()), (2, 1));
        assert_eq!(metrics.swaps.get_or_create(&host).get(), 3);

        let deliveries = metrics.for_deliveries(&b);
        deliveries.count(HandlerResult::Ack);
        assert_eq!(metrics.handler_results(&b), 1);
        assert_eq!(metrics.handler_results(&a), 0);
        let text = metrics.encode();
        assert!(!text.contains("stream=\"a\""), "{text}");

        // A digest that serves no subscription any more leaves the metrics.
        metrics.serve_digest("d1", 1);
        metrics.serve_digest("d1", 1);
        metrics.serve_digest("d1", -1);
        assert!(metrics.encode().contains(r#"digest="d1"} 1"#));
        metrics.serve_digest("d1", -1);
        assert!(!metrics.encode().contains("d1"));
    }
}
