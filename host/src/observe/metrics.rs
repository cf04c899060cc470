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
//! | metric | type | meaning |
//! |---|---|---|
//! | `sluice_deliveries_total{outcome}` | counter | handler results: `ack`, `retry`, `dead_letter`, `trap`, `limit` |
//! | `sluice_handler_duration_seconds` | histogram | time in the handler per delivery |
//! | `sluice_in_flight` | gauge | deliveries being handled now |
//! | `sluice_pending_entries` | gauge | the group's pending-entries list (scrape time), its retry lane's included |
//! | `sluice_consumer_lag` | gauge | entries not yet read by the group (scrape time), its retry lane's included |
//! | `sluice_parked_entries` | gauge | entries waiting in the delayed-retry set (scrape time) |
//! | `sluice_parked_oldest_due_seconds` | gauge | due time of the earliest parked entry, Unix seconds |
//! | `sluice_sweep_moved` | histogram | entries moved back per sweep pass |
//! | `sluice_sweep_duration_seconds` | histogram | duration of a sweep pass |
//! | `sluice_retry_lateness_seconds` | histogram | handled time minus due time of a parked retry, both by the Redis server's clock |
//! | `sluice_retry_over_ttl_total` | counter | retries asked for longer than the set's ttl |
//! | `sluice_read_loop_restarts_total` | counter | read loops that ended or panicked without a stop, and were started again |
//! | `sluice_redis_reconnects_total` | counter | reads that had to reconnect to Redis |
//! | `sluice_dead_letter_entries` | gauge | length of the dead-letter stream (scrape time) |
//! | `sluice_handler_info{digest}` | gauge | 1 for the handler digest currently serving, 0 for earlier ones |
//! | `sluice_handler_swaps_total` | counter | hot swaps and rollbacks that took effect |
//! | `sluice_handler_swap_refusals_total` | counter | swaps refused (bad component, changed descriptor) |
//! | `sluice_http_denied_total` | counter | outbound HTTP requests refused by `allowed_outbound_hosts` |
//! | `sluice_retry_delay_clamped_total` | counter | retries asked for longer than `max_delay` (clamped to it) |
//! | `sluice_other_groups_retries_total` | counter | retry copies another group parked at the stream's tail (`retry_lane = false` with `other_groups_see_retries`), acknowledged by this group without handling them |
//! | `sluice_settle_errors_total` | counter | parks, dead letters refused by Redis in a way retrying cannot fix (entry kept pending) |
//! | `sluice_retention_trimmed_total` | counter | stream entries trimmed by retention (acknowledged by every group) |
//! | `sluice_retention_blocked_total` | counter | retention runs that left the stream over `max_len` because groups still need the rest |
//! | `sluice_stream_length` | gauge | entries in the stream (scrape time) |
//! | `sluice_stream_bytes` | gauge | the stream's memory, MEMORY USAGE sampled (scrape time) |
//! | `sluice_stream_oldest_age_seconds` | gauge | age of the stream's oldest entry (scrape time) |
//! | `sluice_reasons_cut_total` | counter | dead-letter reasons longer than 4 KiB, stored and logged cut to it |
//! | `sluice_guest_log_dropped_total` | counter | guest log lines dropped or truncated by the per-delivery log budget |
//! | `sluice_trace_spans_dropped_total` | counter | spans dropped because the trace exporter's queue was full (or past an attempt's cap of request spans) |
//! | `sluice_trace_context_rejected_total` | counter | producers' `traceparent`/`tracestate` fields ignored as invalid (the entry got a trace of its own) |

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
        Self {
            per_subscription,
            own: Mutex::default(),
            digests: Mutex::default(),
            deliveries: registered(
                &mut registry,
                "deliveries",
                "Handler results by outcome",
                Family::default(),
            ),
            handler_duration: registered(
                &mut registry,
                "handler_duration_seconds",
                "Time in the handler per delivery",
                Family::new_with_constructor(seconds_histogram),
            ),
            in_flight: registered(
                &mut registry,
                "in_flight",
                "Deliveries being handled",
                Family::default(),
            ),
            pending: registered(
                &mut registry,
                "pending_entries",
                "Entries in the group's pending list",
                Family::default(),
            ),
            lag: registered(
                &mut registry,
                "consumer_lag",
                "Entries the group has not read yet",
                Family::default(),
            ),
            parked: registered(
                &mut registry,
                "parked_entries",
                "Entries waiting in the delayed-retry set",
                Family::default(),
            ),
            parked_oldest_due: registered(
                &mut registry,
                "parked_oldest_due_seconds",
                "Due time of the earliest parked entry, Unix seconds (0 when none)",
                Family::default(),
            ),
            dead_letters: registered(
                &mut registry,
                "dead_letter_entries",
                "Length of the dead-letter stream",
                Family::default(),
            ),
            retention_trimmed: registered(
                &mut registry,
                "retention_trimmed",
                "Stream entries trimmed by retention (acknowledged by every group)",
                Family::default(),
            ),
            retention_blocked: registered(
                &mut registry,
                "retention_blocked",
                "Retention runs that left the stream over max_len because groups still need the rest",
                Family::default(),
            ),
            stream_length: registered(
                &mut registry,
                "stream_length",
                "Entries in the stream",
                Family::default(),
            ),
            stream_bytes: registered(
                &mut registry,
                "stream_bytes",
                "The stream's memory (MEMORY USAGE, sampled)",
                Family::default(),
            ),
            stream_oldest_age: registered(
                &mut registry,
                "stream_oldest_age_seconds",
                "Age of the stream's oldest entry",
                Family::default(),
            ),
            sweep_moved: registered(
                &mut registry,
                "sweep_moved",
                "Entries moved back onto the stream per sweep pass",
                Family::new_with_constructor(count_histogram),
            ),
            sweep_duration: registered(
                &mut registry,
                "sweep_duration_seconds",
                "Duration of a sweep pass",
                Family::new_with_constructor(seconds_histogram),
            ),
            retry_lateness: registered(
                &mut registry,
                "retry_lateness_seconds",
                "Handled time minus due time of a parked retry, both by the Redis server's clock",
                Family::new_with_constructor(seconds_histogram),
            ),
            retry_over_ttl: registered(
                &mut registry,
                "retry_over_ttl",
                "Retries asked for longer than the delayed set's ttl",
                Family::default(),
            ),
            reconnects: registered(
                &mut registry,
                "redis_reconnects",
                "Times the read loop reconnected to Redis",
                Family::default(),
            ),
            read_loop_restarts: registered(
                &mut registry,
                "read_loop_restarts",
                "Read loops that ended or panicked without a stop, and were started again",
                Family::default(),
            ),
            handler_info: registered(
                &mut registry,
                "handler_info",
                "The handler digest serving each subscription",
                Family::default(),
            ),
            swaps: registered(
                &mut registry,
                "handler_swaps",
                "Hot swaps and rollbacks that took effect",
                Family::default(),
            ),
            swap_refusals: registered(
                &mut registry,
                "handler_swap_refusals",
                "Hot swaps refused",
                Family::default(),
            ),
            http_denied: registered(
                &mut registry,
                "http_denied",
                "Outbound HTTP requests refused: not on the subscription's allowed_outbound_hosts",
                Family::default(),
            ),
            retry_delay_clamped: registered(
                &mut registry,
                "retry_delay_clamped",
                "Retries asked for longer than max_delay, clamped to it",
                Family::default(),
            ),
            settle_errors: registered(
                &mut registry,
                "settle_errors",
                "Parks and dead letters Redis refused in a way retrying cannot fix; the entry stays pending",
                Family::default(),
            ),
            other_groups_retries: registered(
                &mut registry,
                "other_groups_retries",
                "Retry copies another group parked at the stream's tail, acknowledged by this group without handling them",
                Family::default(),
            ),
            guest_log_dropped: registered(
                &mut registry,
                "guest_log_dropped",
                "Guest log lines dropped or truncated by the per-delivery log budget",
                Family::default(),
            ),
            reasons_cut: registered(
                &mut registry,
                "reasons_cut",
                "Dead-letter reasons longer than 4 KiB, stored and logged cut to it",
                Family::default(),
            ),
            trace_spans_dropped: registered(
                &mut registry,
                "trace_spans_dropped",
                "Spans dropped because the trace exporter's queue was full (the collector slow or away)",
                Counter::default(),
            ),
            trace_context_rejected: registered(
                &mut registry,
                "trace_context_rejected",
                "Producers' traceparent/tracestate fields ignored as invalid (the entry got a trace of its own)",
                Counter::default(),
            ),
            paused: registered(
                &mut registry,
                "paused",
                "1 while the subscription is paused: no host of its group takes new entries or due retries",
                Family::default(),
            ),
            rate_limit_calls: registered(
                &mut registry,
                "rate_limit_calls",
                "Script calls that took tokens from the group's shared rate-limit bucket (about one per read)",
                Family::default(),
            ),
            rate_limit_waits: registered(
                &mut registry,
                "rate_limit_waits",
                "Reads that waited for the group's shared rate limit",
                Family::default(),
            ),
            breaker_state: registered(
                &mut registry,
                "breaker_state",
                "The group's circuit breaker: 0 closed, 1 open (nothing read), 2 half-open (probing)",
                Family::default(),
            ),
            breaker_transitions: registered(
                &mut registry,
                "breaker_transitions",
                "Circuit-breaker transitions this host made, by the state it moved to",
                Family::default(),
            ),
            canary_deliveries: registered(
                &mut registry,
                "canary_deliveries",
                "Attempts of a running canary on this host, by version (incumbent, candidate) and result",
                Family::default(),
            ),
            canary_handler_duration: registered(
                &mut registry,
                "canary_handler_seconds",
                "Time in the handler during a canary on this host, by version",
                Family::new_with_constructor(seconds_histogram),
            ),
            canary_share: registered(
                &mut registry,
                "canary_share_basis_points",
                "Of 10,000 deliveries, how many a running canary's candidate takes (0: no canary)",
                Family::default(),
            ),
            canary_verdicts: registered(
                &mut registry,
                "canary_verdicts",
                "Canaries that ended while this host ran them, by verdict",
                Family::default(),
            ),
            registry,
            results_counted: Arc::default(),
        }
    }
}

/// Register `metric` under `name` and hand it back, so each field is declared in one place.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
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
