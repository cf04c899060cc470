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
//!
//! - [`context`]: which trace an entry belongs to (a producer's `traceparent`, or its own,
//!   derived from the entry).
//! - [`console`]: the console exporter, one line per span on standard error (for a developer
//!   with no collector).
//! - [`exporter`]: starting and stopping the OTLP exporter ([`start`], [`Exporting`]).
//! - [`switch`]: the on/off switch the exporter sets, and the interest-cache rebuild when it
//!   flips ([`enabled`], [`sampled`]).
//! - [`provider`]: the tracer provider every `tracing` span goes through, passing spans to the
//!   exporter only while one runs.
//! - [`tracing_layer`]: the `tracing` layer ([`layer`]) and its call-site filter, and an
//!   attempt's span ([`AttemptTrace`]).
//! - [`queue`]: the bounded export queue and the count of dropped spans.
//! - [`spans`]: the host's own spans, written whole ([`Whole`]), and their attribute values.
//! - [`links`]: the `[telemetry]` table's trace links ([`trace_link`]).

pub mod console;
pub mod context;
pub mod exporter;
pub mod links;
pub mod provider;
pub mod queue;
pub mod spans;
pub mod switch;
pub mod tracing_layer;

pub use exporter::{EXPORT_TIMEOUT, Exporting, FLUSH_TIMEOUT, TelemetryError, start};
pub use links::{set_config, trace_link, traces_shown};
pub use queue::{MAX_QUEUED, count_dropped, dropped_total};
pub use spans::{
    MAX_ATTRIBUTE_BYTES, Whole, bounded, id_time, ms_time, number, operator_span, parent_of,
};
pub use switch::{enabled, sampled};
pub use tracing_layer::{ATTEMPT_SPAN, AttemptTrace, attempt_span, attempt_traceparent, layer};
