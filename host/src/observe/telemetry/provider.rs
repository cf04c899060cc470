//! The tracer provider every `tracing` span goes through: made once, before any config is
//! read, with a span processor and a sampler (`Switch`) that pass everything to the running
//! exporter, or drop it while none runs.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};

use super::switch::ACTIVE;

/// The provider every span goes through: made once, with the `tracing` layer, before any
/// config is read; [`start`](super::exporter::start) later gives it somewhere to send spans
/// and a sampling ratio (until then, and after
/// [`Exporting::stop`](super::exporter::Exporting::stop), it samples nothing).
pub(super) fn provider() -> &'static SdkTracerProvider {
    static PROVIDER: std::sync::OnceLock<SdkTracerProvider> = std::sync::OnceLock::new();
    PROVIDER.get_or_init(|| {
        SdkTracerProvider::builder()
            .with_span_processor(Switch)
            .with_sampler(Switch)
            .build()
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
