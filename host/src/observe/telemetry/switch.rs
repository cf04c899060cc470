//! The on/off switch: what the host's spans go through while an exporter runs (`ACTIVE`,
//! with `ON` as its cheap flag), and turning it on or off, which has every `tracing` call
//! site's interest asked again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::trace::{RandomIdGenerator, Sampler, ShouldSample as _};

use super::queue::Bounded;

/// What the host's own spans (the ones not made through `tracing`: an entry's root, its parked
/// wait, a sweep, an operator's action) need: where they go and how entries are sampled.
pub(super) struct Active {
    pub(super) processor: Arc<Bounded>,
    pub(super) sampler: Sampler,
    pub(super) parent_based: Sampler,
    pub(super) scope: opentelemetry::InstrumentationScope,
    pub(super) ids: RandomIdGenerator,
}

/// The running exporter and its sampling, if one runs.
pub(super) static ACTIVE: arc_swap::ArcSwapOption<Active> = arc_swap::ArcSwapOption::const_empty();

/// [`ACTIVE`] is set: one relaxed load on every delivery's path instead of a swap's.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (the host works out an entry's trace only then).
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Export through `active` (or stop exporting). When that turns exporting on or off, every
/// call site's interest is asked again: while nothing is exported the
/// [`layer`](super::tracing_layer::layer) wants none, so a span or event that the log does not print
/// is ruled out at its call site, as if the layer were not there (issue 50: its `sometimes`
/// had every delivery make a span that no layer kept, and `span_enabled!` answer yes).
pub(super) fn set_active(active: Option<Arc<Active>>) {
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

/// What spans go through while `processor` exports, sampling `per_million` entries.
pub(super) fn active(processor: Arc<Bounded>, per_million: u32) -> Active {
    let ratio = Sampler::TraceIdRatioBased(f64::from(per_million) / 1e6);
    Active {
        processor,
        parent_based: Sampler::ParentBased(Box::new(ratio.clone())),
        sampler: ratio,
        scope: scope(),
        ids: RandomIdGenerator::default(),
    }
}

/// The instrumentation scope every span of the host carries: `sluice` and its version.
pub(super) fn scope() -> opentelemetry::InstrumentationScope {
    opentelemetry::InstrumentationScope::builder("sluice")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}
