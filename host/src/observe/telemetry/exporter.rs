//! Starting and stopping the OTLP exporter: which collector and protocol the config or the
//! `OTEL_*` variables name, the resource spans carry, and the bounded batch processor
//! ([`super::queue`]) it sits behind ([`Exporting`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanExporter as _, SpanProcessor as _,
};

use crate::config::telemetry::{Protocol, Telemetry};

use super::console::Console;
use super::links::set_config;
use super::queue::{Bounded, Counted, MAX_QUEUED};
use super::switch::{active, set_active};

/// The longest one export may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long spans gather before the console writes them.
const CONSOLE_DELAY: Duration = Duration::from_millis(250);

/// The longest a graceful stop waits for queued spans to go out.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

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

/// The collector named by the config or the environment, if any (or the console).
fn endpoint_named(config: Option<&Telemetry>) -> bool {
    config.is_some_and(|t| t.endpoint.is_some() || t.protocol == Protocol::Console)
        || [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|e| !e.is_empty()))
}

/// Start exporting, if the config or the environment names a collector; `None` otherwise.
/// Spans reach it through [`layer`](super::tracing_layer::layer) (which the program must have put on
/// its subscriber) and the host's own spans directly.
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
    let protocol = protocol_of(config, t)?;
    let dropped = Arc::new(AtomicU64::new(0));
    let processor = Arc::new(bounded_processor(t, protocol, dropped.clone())?);
    set_active(Some(Arc::new(active(
        processor.clone(),
        t.sampling_per_million,
    ))));
    if protocol == Protocol::Console {
        tracing::info!("writing each span to standard error (telemetry protocol \"console\")");
        return Ok(Some(Exporting { processor, dropped }));
    }
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

/// The protocol to export with: the config's when it names the endpoint, else what the
/// `OTEL_EXPORTER_OTLP_*PROTOCOL` variables say (refused when neither of ours).
fn protocol_of(config: Option<&Telemetry>, t: &Telemetry) -> Result<Protocol, TelemetryError> {
    let env_protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    Ok(
        match (
            config
                .and_then(|c| c.endpoint.as_ref())
                .or((t.protocol == Protocol::Console).then_some(&String::new())),
            env_protocol,
        ) {
            (None, Ok(p)) if p == "grpc" => Protocol::Grpc,
            (None, Ok(p)) if p == "http/protobuf" || p.is_empty() => Protocol::HttpProtobuf,
            (None, Ok(p)) => return Err(TelemetryError::Protocol(p)),
            _ => t.protocol,
        },
    )
}

/// The resource every span carries: the config's service name, unless it says nothing and
/// `OTEL_SERVICE_NAME` does (the builder reads that variable and `OTEL_RESOURCE_ATTRIBUTES`
/// itself), and the config's attributes.
fn resource_of(t: &Telemetry) -> opentelemetry_sdk::Resource {
    let mut resource = opentelemetry_sdk::Resource::builder();
    if t.service_name != DEFAULT_SERVICE_NAME
        || std::env::var_os("OTEL_SERVICE_NAME").is_none_or(|v| v.is_empty())
    {
        resource = resource.with_service_name(t.service_name.clone());
    }
    resource
        .with_attributes(
            t.resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

/// The exporter behind its batch processor, both counting into one queue bound
/// ([`MAX_QUEUED`]) and into `dropped`.
fn bounded_processor(
    t: &Telemetry,
    protocol: Protocol,
    dropped: Arc<AtomicU64>,
) -> Result<Bounded, TelemetryError> {
    let queued = Arc::new(AtomicUsize::new(0));
    let resource = resource_of(t);
    let batch = match protocol {
        // A developer watches the terminal: a span shows a moment after it ends.
        Protocol::Console => batched(Console, &resource, (&queued, &dropped), Some(CONSOLE_DELAY)),
        Protocol::HttpProtobuf => {
            let exporter = exporter(t, false)?;
            batched(exporter, &resource, (&queued, &dropped), None)
        }
        Protocol::Grpc => {
            let exporter = exporter(t, true)?;
            batched(exporter, &resource, (&queued, &dropped), None)
        }
    };
    Ok(Bounded {
        inner: batch,
        queued,
        dropped,
    })
}

/// `exporter` behind a batch processor, counting into `queued` and `dropped`.
fn batched<E: opentelemetry_sdk::trace::SpanExporter + 'static>(
    exporter: E,
    resource: &opentelemetry_sdk::Resource,
    (queued, dropped): (&Arc<AtomicUsize>, &Arc<AtomicU64>),
    delay: Option<Duration>,
) -> BatchSpanProcessor {
    let mut exporter = Counted {
        inner: exporter,
        queued: queued.clone(),
        dropped: dropped.clone(),
    };
    // Set here: the processor is shared, so the provider cannot hand it the resource.
    exporter.set_resource(resource);
    // The inner queue has room for more than the count lets in: only the count drops.
    // The SDK's delay (5 s, or OTEL_BSP_SCHEDULE_DELAY) unless `delay` says otherwise.
    let mut config = BatchConfigBuilder::default().with_max_queue_size(MAX_QUEUED * 2);
    if let Some(delay) = delay {
        config = config.with_scheduled_delay(delay);
    }
    BatchSpanProcessor::builder(exporter)
        .with_batch_config(config.build())
        .build()
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

/// The OTLP exporter, over gRPC or HTTP/protobuf, with the config's endpoint and headers (or
/// the `OTEL_*` variables').
fn exporter(t: &Telemetry, grpc: bool) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    let exporter = match grpc {
        false => {
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
        true => {
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
