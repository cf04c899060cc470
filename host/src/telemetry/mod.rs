//! Traces out: the OpenTelemetry tracer provider and its OTLP exporter, fed by the `tracing`
//! spans the host already makes (each delivery's `delivery` span is its attempt's span).
//!
//! The `tracing` subscriber is set up before any config is read, so the OpenTelemetry layer
//! waits in a `reload` slot ([`Slot`]) that [`start`] fills once the config says where traces
//! go. Off unless `[telemetry]` or an `OTEL_EXPORTER_OTLP_*ENDPOINT` variable names a collector.
//!
//! Bounded: spans wait in a queue of [`MAX_QUEUED`]; past it they are dropped and counted
//! ([`Exporting::dropped`]), never waited for: a slow or dead collector never slows a delivery.
//! Each export gives up after [`EXPORT_TIMEOUT`]. A graceful stop flushes what is queued, for at
//! most [`FLUSH_TIMEOUT`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};

use crate::config::telemetry::{Protocol, Telemetry};

/// The most spans waiting for export.
pub const MAX_QUEUED: usize = 4096;
/// The longest one export may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a graceful stop waits for queued spans to go out.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The layer the subscriber holds for OpenTelemetry: empty until [`start`] fills it.
pub type OtelLayer = tracing_opentelemetry::OpenTelemetryLayer<
    tracing_subscriber::Registry,
    opentelemetry_sdk::trace::Tracer,
>;

/// Where [`start`] puts the layer (set once, by `main`).
pub type Slot = tracing_subscriber::reload::Handle<Option<OtelLayer>, tracing_subscriber::Registry>;

static SLOT: std::sync::OnceLock<Slot> = std::sync::OnceLock::new();

/// Spans dropped since the process started (one exporter per process).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans dropped because the export queue was full, since the process started (the metric
/// `sluice_trace_spans_dropped_total`).
pub fn dropped_total() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Give the library the subscriber's slot (`main` calls this once, after it sets the
/// subscriber up).
pub fn set_slot(slot: Slot) {
    let _ = SLOT.set(slot);
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
    provider: SdkTracerProvider,
    dropped: Arc<AtomicU64>,
}

impl Exporting {
    /// Spans dropped because the queue was full (the collector slow or away).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Export what is queued (for at most [`FLUSH_TIMEOUT`]) and stop.
    pub fn stop(self) {
        if let Err(err) = self.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
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

/// Start exporting, if the config or the environment names a collector; `None` otherwise
/// (or when no subscriber slot was set, as in a library user's own program).
pub fn start(config: Option<&Telemetry>) -> Result<Option<Exporting>, TelemetryError> {
    let Some(slot) = SLOT.get() else {
        return Ok(None);
    };
    if !endpoint_named(config) {
        return Ok(None);
    }
    let defaults = Telemetry {
        endpoint: None,
        protocol: Protocol::HttpProtobuf,
        headers: Vec::new(),
        service_name: "sluice".to_owned(),
        sampling_per_million: 1_000_000,
        resource: Vec::new(),
        trace_url: None,
    };
    let t = config.unwrap_or(&defaults);
    let protocol = match (
        config.and_then(|c| c.endpoint.as_ref()),
        std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"),
    ) {
        (None, Ok(p)) if p == "grpc" => Protocol::Grpc,
        (None, Ok(p)) if p == "http/protobuf" || p.is_empty() => Protocol::HttpProtobuf,
        (None, Ok(p)) => return Err(TelemetryError::Protocol(p)),
        _ => t.protocol,
    };
    let dropped = Arc::new(AtomicU64::new(0));
    let queued = Arc::new(AtomicUsize::new(0));
    let exporter = Counted {
        inner: exporter(t, protocol)?,
        queued: queued.clone(),
    };
    // The inner queue has room for more than the count lets in: only the count drops.
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(MAX_QUEUED * 2)
                .build(),
        )
        .build();
    let processor = Bounded {
        inner: batch,
        queued,
        dropped: dropped.clone(),
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(t.service_name.clone())
        .with_attributes(
            t.resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            t.sampling_ratio(),
        ))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("sluice");
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    if let Err(err) = slot.reload(Some(layer)) {
        tracing::warn!(%err, "traces: cannot attach the exporter to the log subscriber");
    }
    tracing::info!(
        protocol = ?protocol,
        endpoint = t.endpoint.as_deref().unwrap_or("(from OTEL_* variables)"),
        "exporting traces"
    );
    Ok(Some(Exporting { provider, dropped }))
}

fn exporter(
    t: &Telemetry,
    protocol: Protocol,
) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    let exporter = match protocol {
        Protocol::HttpProtobuf => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
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

/// The exporter, counting spans out of the queue as each batch is done with (sent or not).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.queued
            .fetch_sub(n.min(self.queued.load(Ordering::Acquire)), Ordering::AcqRel);
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
