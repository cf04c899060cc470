//! The `tracing` layer that turns the host's spans into OpenTelemetry spans, its call-site
//! filter (only `info` and above, never the exporter's own crates, nothing while off), and an
//! attempt's span and trace ([`AttemptTrace`]).

use opentelemetry::trace::{SpanContext, TracerProvider as _};

use super::context;
use super::provider::provider;
use super::switch::{enabled, scope};

/// The `tracing` layer that makes OpenTelemetry spans of the host's spans (each delivery's
/// `delivery` span is its attempt's span). It sees nothing while no exporter runs, so it costs
/// nothing then. `main` puts it first on the registry; [`start`](super::exporter::start)
/// turns it on.
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
