//! The bounded export queue: a count in front of the batch processor, so past [`MAX_QUEUED`]
//! waiting spans a new one is dropped and counted at once, never waited for (a slow or dead
//! collector never slows a delivery).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor};

/// The most spans waiting for export.
pub const MAX_QUEUED: usize = 4096;

/// Spans dropped since the process started (one exporter per process).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans dropped because the export queue was full, since the process started (the metric
/// `sluice_trace_spans_dropped_total`).
pub fn dropped_total() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Count a span the host chose not to make (past a per-attempt cap).
pub fn count_dropped() {
    DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// The batch processor behind a count of the spans it holds: past [`MAX_QUEUED`] a span is
/// dropped and counted here, at once (the SDK's own drops are not counted anywhere we can
/// read).
#[derive(Debug)]
pub(super) struct Bounded {
    pub(super) inner: BatchSpanProcessor,
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) dropped: Arc<AtomicU64>,
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
pub(super) struct Counted<E> {
    pub(super) inner: E,
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) dropped: Arc<AtomicU64>,
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
