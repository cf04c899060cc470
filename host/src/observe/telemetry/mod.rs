//! Traces out: the OpenTelemetry tracer provider and its OTLP exporter, fed by the `tracing`
//! spans the host already makes (each delivery's `delivery` span is its attempt's span).
//!
//! The `tracing` subscriber is set up before any config is read, so the OpenTelemetry layer
//! ([`layer`]) is on it from the start, switched off (it sees no span, so it costs nothing)
//! until [`start`] gives it an exporter. Off unless `[telemetry]` or an
//! `OTEL_EXPORTER_OTLP_*ENDPOINT` variable names a collector. Spans the host knows whole (an
//! entry's root, its parked wait, a sweep, an operator's action) go to the same exporter
//! directly ([`Whole`]); [`context`] says which trace an entry belongs to.
//!
//! Bounded: spans wait in a queue of [`MAX_QUEUED`]; past it they are dropped and counted
//! ([`Exporting::dropped`]), never waited for: a slow or dead collector never slows a delivery.
//! Each export gives up after [`EXPORT_TIMEOUT`]. A graceful stop flushes what is queued, for at
//! most [`FLUSH_TIMEOUT`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub mod context;

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator as _, RandomIdGenerator, Sampler,
    SdkTracerProvider, ShouldSample as _, SpanData, SpanExporter, SpanProcessor,
};

use crate::config::telemetry::{Protocol, Telemetry};

/// The most spans waiting for export.
pub const MAX_QUEUED: usize = 4096;
/// The longest one export may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a graceful stop waits for queued spans to go out.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Spans dropped since the process started (one exporter per process).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// What the host's own spans (the ones not made through `tracing`: an entry's root, its parked
/// wait, a sweep, an operator's action) need: where they go and how entries are sampled.
struct Active {
    processor: Arc<Bounded>,
    sampler: Sampler,
    parent_based: Sampler,
    scope: opentelemetry::InstrumentationScope,
    ids: RandomIdGenerator,
}

static ACTIVE: arc_swap::ArcSwapOption<Active> = arc_swap::ArcSwapOption::const_empty();

/// [`ACTIVE`] is set: one relaxed load on every delivery's path instead of a swap's.
static ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether spans are exported (the host works out an entry's trace only then).
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Export through `active` (or stop exporting). When that turns exporting on or off, every
/// call site's interest is asked again: while nothing is exported the [`layer`] wants none, so
/// a span or event that the log does not print is ruled out at its call site, as if the
/// layer were not there (issue 50: its `sometimes` had every delivery make a span that no
/// layer kept, and `span_enabled!` answer yes).
fn set_active(active: Option<Arc<Active>>) {
    // One change at a time, so the flag and the exporter never end up out of step.
    static CHANGING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = CHANGING.lock().unwrap_or_else(|e| e.into_inner());
    let on = active.is_some();
    ACTIVE.store(active);
    if ON.swap(on, Ordering::SeqCst) != on {
        tracing::callsite::rebuild_interest_cache();
    }
}

/// Whether an entry's own trace (no producer's context) with this id is sampled, by the
/// configured ratio (the same answer on every host).
pub fn sampled(trace_id: opentelemetry::trace::TraceId) -> bool {
    ACTIVE.load().as_ref().is_some_and(|a| {
        matches!(
            a.sampler
                .should_sample(None, trace_id, "entry", &SpanKind::Consumer, &[], &[])
                .decision,
            opentelemetry_sdk::trace::SamplingDecision::RecordAndSample
        )
    })
}

/// The parent of an entry's spans, sampled by the configured ratio (see [`context`]).
pub fn parent_of(
    stream: &str,
    group: &str,
    origin_id: &str,
    fields: &[(Vec<u8>, Vec<u8>)],
) -> context::Parent {
    context::parent_of(stream, group, origin_id, fields, sampled)
}

/// The longest attribute value the host's own spans carry; longer ones are cut (at a
/// character boundary) and end with `…`.
pub const MAX_ATTRIBUTE_BYTES: usize = 4096;

/// A count or duration as a span attribute: `tracing` hands unsigned numbers to the exporter
/// as text (a backend's numeric queries then fail on them), signed ones as numbers.
pub fn number(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// `value` cut to [`MAX_ATTRIBUTE_BYTES`].
pub fn bounded(value: &str) -> String {
    if value.len() <= MAX_ATTRIBUTE_BYTES {
        return value.to_owned();
    }
    let mut end = MAX_ATTRIBUTE_BYTES - '…'.len_utf8();
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &value[..end])
}

/// A span the host writes whole, with times it knows (an entry's wait in its stream or in
/// the delayed set), rather than one it lives through.
#[derive(Debug)]
pub struct Whole {
    /// Its name.
    pub name: &'static str,
    /// When it started.
    pub start: std::time::SystemTime,
    /// When it ended.
    pub end: std::time::SystemTime,
    /// What it records.
    pub attributes: Vec<KeyValue>,
}

impl Whole {
    /// Export it as a child of `parent` (only if `parent` is sampled); with `id`, under that
    /// span id, without a parent (an entry's own root span, whose id is derived).
    pub fn emit(self, parent: &SpanContext, id: Option<SpanId>) -> Option<SpanContext> {
        let active = ACTIVE.load_full()?;
        if !parent.is_sampled() {
            return None;
        }
        let span_id = id.unwrap_or_else(|| active.ids.new_span_id());
        let span_context = SpanContext::new(
            parent.trace_id(),
            span_id,
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        );
        let (parent_span_id, parent_span_is_remote) = match id {
            Some(_) => (SpanId::INVALID, false),
            None => (parent.span_id(), parent.is_remote()),
        };
        active.processor.on_end(SpanData {
            span_context: span_context.clone(),
            parent_span_id,
            parent_span_is_remote,
            span_kind: SpanKind::Internal,
            name: self.name.into(),
            start_time: self.start,
            end_time: self.end.max(self.start),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: opentelemetry::trace::Status::Unset,
            instrumentation_scope: active.scope.clone(),
        });
        Some(span_context)
    }
}

/// An operator's action on an entry (a requeue, a retry-now), as a span of its own in the
/// entry's trace, from `start` to now.
pub fn operator_span(
    name: &'static str,
    entry: (&str, &str, &str),
    fields: &[(Vec<u8>, Vec<u8>)],
    start: std::time::SystemTime,
    mut attributes: Vec<KeyValue>,
) {
    if !enabled() {
        return;
    }
    let (stream, group, origin_id) = entry;
    let parent = parent_of(stream, group, origin_id, fields);
    attributes.extend([
        KeyValue::new("stream", bounded(stream)),
        KeyValue::new("group", bounded(group)),
        KeyValue::new("origin_id", bounded(origin_id)),
    ]);
    Whole {
        name,
        start,
        end: crate::support::clock::now(),
        attributes,
    }
    .emit(parent.span_context(), None);
}

/// The time an entry id names (its milliseconds), if it is one.
pub fn id_time(id: &str) -> Option<std::time::SystemTime> {
    let ms = crate::support::when::entry_ms(id)?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// An epoch-milliseconds time.
pub fn ms_time(ms: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Spans dropped because the export queue was full, since the process started (the metric
/// `sluice_trace_spans_dropped_total`).
pub fn dropped_total() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Count a span the host chose not to make (past a per-attempt cap).
pub fn count_dropped() {
    DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// The provider every span goes through: made once, with the `tracing` layer, before any
/// config is read; [`start`] later gives it somewhere to send spans and a sampling ratio
/// (until then, and after [`Exporting::stop`], it samples nothing).
fn provider() -> &'static SdkTracerProvider {
    static PROVIDER: std::sync::OnceLock<SdkTracerProvider> = std::sync::OnceLock::new();
    PROVIDER.get_or_init(|| {
        SdkTracerProvider::builder()
            .with_span_processor(Switch)
            .with_sampler(Switch)
            .build()
    })
}

fn scope() -> opentelemetry::InstrumentationScope {
    opentelemetry::InstrumentationScope::builder("sluice")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// The `tracing` layer that makes OpenTelemetry spans of the host's spans (each delivery's
/// `delivery` span is its attempt's span). It sees nothing while no exporter runs, so it costs
/// nothing then. `main` puts it first on the registry; [`start`] turns it on.
pub fn layer() -> impl tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync {
    use tracing_subscriber::Layer as _;
    tracing_opentelemetry::layer()
        .with_tracer(provider().tracer_with_scope(scope()))
        .with_location(false)
        .with_threads(false)
        .with_filter(
            tracing_subscriber::filter::dynamic_filter_fn(|meta, cx| {
                if meta.is_span() && meta.name() == ATTEMPT_SPAN {
                    // Set only while a sampled attempt's span is made, so only while exporting.
                    return ATTEMPT_SAMPLED.get();
                }
                if !enabled() {
                    return false;
                }
                // Anything else only inside a sampled attempt (its requests, its log lines).
                cx.lookup_current().is_some()
            })
            // Debug and trace call sites, and the exporter's own, are ruled out once (the
            // process's max level stays the log's), not on every call.
            .with_max_level_hint(tracing::level_filters::LevelFilter::INFO)
            .with_callsite_filter(|meta| {
                // Asked again whenever exporting starts or stops (see `set_active`).
                if enabled() && traced(meta) {
                    tracing::subscriber::Interest::sometimes()
                } else {
                    tracing::subscriber::Interest::never()
                }
            }),
        )
}

/// The name of an attempt's span (made by `dispatch`).
pub const ATTEMPT_SPAN: &str = "delivery";

/// The trace an attempt runs in, carried on its delivery while traces are exported: what its
/// outbound requests and `trace::traceparent` say, and the span its outcome is recorded on.
#[derive(Debug, Clone)]
pub struct AttemptTrace {
    /// The entry's parent (see [`context`]), sampled or not.
    pub parent: SpanContext,
    /// Its span, when sampled.
    pub span: Option<tracing::Span>,
}

/// The `traceparent` an attempt passes on: its span's when sampled, else the entry's parent
/// (unsampled, as W3C asks).
pub fn attempt_traceparent(trace: &AttemptTrace) -> String {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let sampled = trace
        .span
        .as_ref()
        .map(|s| s.context().span().span_context().clone())
        .filter(SpanContext::is_valid);
    context::traceparent(sampled.as_ref().unwrap_or(&trace.parent))
}

thread_local! {
    /// Whether the attempt span being made now is sampled (see [`attempt_span`]).
    static ATTEMPT_SAMPLED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Make an attempt's span with `make`, seen by the OpenTelemetry layer only when `sampled`:
/// an attempt that is not traced costs the layer nothing (no span data is built for it), which
/// is what keeps a low sampling ratio cheap.
pub fn attempt_span(sampled: bool, make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    ATTEMPT_SAMPLED.set(sampled);
    let span = make();
    ATTEMPT_SAMPLED.set(false);
    span
}

/// The crates the exporter itself runs on: tracing their spans would trace every export.
const EXPORTER_CRATES: &[&str] = &[
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tower",
    "reqwest",
    "opentelemetry",
];

/// Whether a span or event goes into traces: `info` and above (attempts, requests, what the
/// handler logs at info and above), except the exporter's own.
fn traced(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() <= tracing::Level::INFO
        && !EXPORTER_CRATES.iter().any(|c| {
            meta.target().strip_prefix(c).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with("::") || rest.starts_with('_')
            })
        })
}

/// Spans to the running exporter, if one runs.
#[derive(Debug, Clone, Copy)]
struct Switch;

impl SpanProcessor for Switch {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        if let Some(active) = ACTIVE.load().as_ref() {
            active.processor.on_start(span, cx);
        }
    }

    fn on_end(&self, span: SpanData) {
        if let Some(active) = ACTIVE.load().as_ref() {
            active.processor.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        match ACTIVE.load().as_ref() {
            Some(active) => active.processor.force_flush(),
            None => Ok(()),
        }
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // Each exporter is stopped by its own `Exporting::stop`.
        Ok(())
    }
}

impl opentelemetry_sdk::trace::ShouldSample for Switch {
    fn should_sample(
        &self,
        parent_context: Option<&opentelemetry::Context>,
        trace_id: opentelemetry::trace::TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> opentelemetry_sdk::trace::SamplingResult {
        match ACTIVE.load().as_ref() {
            Some(active) => active.parent_based.should_sample(
                parent_context,
                trace_id,
                name,
                span_kind,
                attributes,
                links,
            ),
            None => opentelemetry_sdk::trace::SamplingResult {
                decision: opentelemetry_sdk::trace::SamplingDecision::Drop,
                attributes: Vec::new(),
                trace_state: Default::default(),
            },
        }
    }
}

/// Why traces cannot be exported as configured.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The exporter refused its settings.
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The variables name a protocol this host does not speak.
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0}: this host exports with \"http/protobuf\" or \"grpc\""
    )]
    Protocol(String),
}

/// Traces going out: stop it (it flushes) when the host stops.
#[derive(Debug)]
pub struct Exporting {
    processor: Arc<Bounded>,
    dropped: Arc<AtomicU64>,
}

impl Exporting {
    /// Spans dropped because the queue was full (the collector slow or away).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Trace `per_million` of the entries from now on, or none and nothing at all (`None`: as
    /// if off, the exporter kept), without a new exporter: what a benchmark alternating settings
    /// within one run needs (a new exporter each time would flush and reconnect). Attempts
    /// already running keep the decision they were made with.
    pub fn set_sampling(&self, per_million: Option<u32>) {
        set_active(
            per_million.map(|per_million| Arc::new(active(self.processor.clone(), per_million))),
        );
    }

    /// Export what is queued now (for at most [`FLUSH_TIMEOUT`]).
    pub fn flush(&self) {
        if let Err(err) = self.processor.force_flush() {
            tracing::warn!(%err, "traces: queued spans were not all exported");
        }
    }

    /// Export what is queued (for at most [`FLUSH_TIMEOUT`]) and stop.
    pub fn stop(self) {
        set_active(None);
        if let Err(err) = self.processor.shutdown_with_timeout(FLUSH_TIMEOUT) {
            tracing::warn!(%err, "traces: the last spans were not all exported");
        }
    }
}

/// The collector named by the config or the environment, if any.
fn endpoint_named(config: Option<&Telemetry>) -> bool {
    config.is_some_and(|t| t.endpoint.is_some())
        || [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|e| !e.is_empty()))
}

/// The `[telemetry]` table in force, for its trace links (set by [`start`], even when it names
/// no collector).
static CONFIG: arc_swap::ArcSwapOption<Telemetry> = arc_swap::ArcSwapOption::const_empty();

/// Take the `[telemetry]` table's trace links (a command that exports nothing still shows
/// them).
pub fn set_config(config: Option<&Telemetry>) {
    CONFIG.store(config.cloned().map(Arc::new));
}

/// Whether trace ids mean anything here (traces are exported, or the config has a
/// `[telemetry]` table): the page and the CLI show them only then.
pub fn traces_shown() -> bool {
    enabled() || CONFIG.load().is_some()
}

/// The link to `trace_id` in the operator's trace viewer, when `trace_url` is set (see
/// [`Telemetry::link`]: only a trace id ever enters the URL).
pub fn trace_link(trace_id: &str) -> Option<String> {
    CONFIG.load().as_ref()?.link(trace_id)
}

/// Start exporting, if the config or the environment names a collector; `None` otherwise.
/// Spans reach it through [`layer`] (which the program must have put on its subscriber) and
/// the host's own spans directly.
pub fn start(config: Option<&Telemetry>) -> Result<Option<Exporting>, TelemetryError> {
    set_config(config);
    if !endpoint_named(config) {
        return Ok(None);
    }
    let defaults = Telemetry {
        endpoint: None,
        protocol: Protocol::HttpProtobuf,
        headers: Vec::new(),
        service_name: DEFAULT_SERVICE_NAME.to_owned(),
        sampling_per_million: 1_000_000,
        resource: Vec::new(),
        trace_url: None,
    };
    let t = config.unwrap_or(&defaults);
    let env_protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    let protocol = match (config.and_then(|c| c.endpoint.as_ref()), env_protocol) {
        (None, Ok(p)) if p == "grpc" => Protocol::Grpc,
        (None, Ok(p)) if p == "http/protobuf" || p.is_empty() => Protocol::HttpProtobuf,
        (None, Ok(p)) => return Err(TelemetryError::Protocol(p)),
        _ => t.protocol,
    };
    let dropped = Arc::new(AtomicU64::new(0));
    let queued = Arc::new(AtomicUsize::new(0));
    // The config's service name, unless it says nothing and OTEL_SERVICE_NAME does (the
    // builder reads that variable and OTEL_RESOURCE_ATTRIBUTES itself).
    let mut resource = opentelemetry_sdk::Resource::builder();
    if t.service_name != DEFAULT_SERVICE_NAME
        || std::env::var_os("OTEL_SERVICE_NAME").is_none_or(|v| v.is_empty())
    {
        resource = resource.with_service_name(t.service_name.clone());
    }
    let resource = resource
        .with_attributes(
            t.resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build();
    let mut exporter = Counted {
        inner: exporter(t, protocol)?,
        queued: queued.clone(),
        dropped: dropped.clone(),
    };
    // Set here: the processor is shared, so the provider cannot hand it the resource.
    exporter.set_resource(&resource);
    // The inner queue has room for more than the count lets in: only the count drops.
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(MAX_QUEUED * 2)
                .build(),
        )
        .build();
    let processor = Arc::new(Bounded {
        inner: batch,
        queued,
        dropped: dropped.clone(),
    });
    set_active(Some(Arc::new(active(
        processor.clone(),
        t.sampling_per_million,
    ))));
    tracing::info!(
        protocol = ?protocol,
        endpoint = t
            .endpoint
            .as_deref()
            .map_or_else(|| "(from OTEL_* variables)".to_owned(), redacted),
        "exporting traces"
    );
    Ok(Some(Exporting { processor, dropped }))
}

/// What spans go through while `processor` exports, sampling `per_million` entries.
fn active(processor: Arc<Bounded>, per_million: u32) -> Active {
    let ratio = Sampler::TraceIdRatioBased(f64::from(per_million) / 1e6);
    Active {
        processor,
        parent_based: Sampler::ParentBased(Box::new(ratio.clone())),
        sampler: ratio,
        scope: scope(),
        ids: RandomIdGenerator::default(),
    }
}

/// The service name when the config gives none.
const DEFAULT_SERVICE_NAME: &str = "sluice";

/// `endpoint` without the user and password it may carry (the log is no place for them).
fn redacted(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let hidden = if host.len() < authority.len() {
                "***@"
            } else {
                ""
            };
            format!("{scheme}://{hidden}{host}{path}")
        }
        None => endpoint.to_owned(),
    }
}

fn exporter(
    t: &Telemetry,
    protocol: Protocol,
) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    let exporter = match protocol {
        Protocol::HttpProtobuf => {
            // The protocol is set, so a stray OTEL_EXPORTER_OTLP_PROTOCOL cannot contradict it.
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(EXPORT_TIMEOUT)
                .with_headers(t.headers.iter().cloned().collect::<HashMap<_, _>>());
            if let Some(endpoint) = &t.endpoint {
                // The collector's base URL, as the OTEL_ variables give it: the signal's
                // path goes after it.
                builder =
                    builder.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
            }
            builder.build()?
        }
        Protocol::Grpc => {
            let mut metadata = http::HeaderMap::new();
            for (name, value) in &t.headers {
                if let (Ok(name), Ok(value)) = (
                    http::HeaderName::from_bytes(name.as_bytes()),
                    http::HeaderValue::from_str(value),
                ) {
                    metadata.insert(name, value);
                }
            }
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_timeout(EXPORT_TIMEOUT)
                .with_metadata(
                    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(metadata),
                );
            if let Some(endpoint) = &t.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()?
        }
    };
    Ok(exporter)
}

/// The batch processor behind a count of the spans it holds: past [`MAX_QUEUED`] a span is
/// dropped and counted here, at once (the SDK's own drops are not counted anywhere we can
/// read).
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
    dropped: Arc<AtomicU64>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= MAX_QUEUED {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting spans out of the queue as each batch is done with (sent or not),
/// and a batch the collector did not take as dropped.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
    dropped: Arc<AtomicU64>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.queued
            .fetch_sub(n.min(self.queued.load(Ordering::Acquire)), Ordering::AcqRel);
        if result.is_err() {
            self.dropped.fetch_add(n as u64, Ordering::Relaxed);
            DROPPED.fetch_add(n as u64, Ordering::Relaxed);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}
