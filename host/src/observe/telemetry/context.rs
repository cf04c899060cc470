//! Which trace an entry belongs to: one trace per entry and group, the same on every host,
//! after every restart, park, sweep, dead letter and requeue.
//!
//! - A producer's W3C `traceparent` field (with its `tracestate`) is the parent of every span
//!   of the entry, when it is valid. The field is one of the entry's own fields, so it travels
//!   wherever they go: in a parked member, on a lane or tail copy (under the copy's seal), in a
//!   dead letter and its requeue.
//! - Otherwise the trace is the entry's own: its trace id and root span id are derived from
//!   the stream, the group and the origin id (the id the producer's entry got, which every
//!   park, sweep and trusted requeue keeps, sealed). Any host computes the same ids without
//!   writing anything, so a crash between attempts (or during one) cannot split the trace. The
//!   root span (`entry`: from the producer's XADD to the first attempt) is written by the host
//!   of the first attempt.
//!
//! A field that is not a valid `traceparent` (malformed, oversized, an unknown shape, all-zero
//! ids) or a `tracestate` that W3C would not accept is ignored and counted
//! ([`rejected_total`]): the entry gets its own trace, and nothing else changes for it.

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use xxhash_rust::xxh3::{self, Xxh3};

/// The producer's field naming the span an entry was produced in.
pub const TRACEPARENT: &str = "traceparent";
/// The producer's vendor-specific trace data that goes with it.
pub const TRACESTATE: &str = "tracestate";
/// The longest `traceparent` or `tracestate` read (W3C: a `tracestate` of at most 512
/// characters is always propagated; a version-00 `traceparent` is 55).
pub const MAX_CONTEXT_BYTES: usize = 512;

static REJECTED: AtomicU64 = AtomicU64::new(0);

/// Producers' trace context fields ignored as invalid since the process started (the metric
/// `sluice_trace_context_rejected_total`).
pub fn rejected_total() -> u64 {
    REJECTED.load(Ordering::Relaxed)
}

/// Where an entry's trace comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    /// The producer's span, from the entry's `traceparent`.
    Producer(SpanContext),
    /// The entry's own trace: the derived root span (see the module's documentation).
    Own(SpanContext),
}

impl Parent {
    /// The span every span of the entry hangs from.
    pub fn span_context(&self) -> &SpanContext {
        match self {
            Parent::Producer(sc) | Parent::Own(sc) => sc,
        }
    }

    /// The trace id, as 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        self.span_context().trace_id().to_string()
    }

    /// An OpenTelemetry context with this parent, for a span to start in.
    pub fn context(&self) -> opentelemetry::Context {
        opentelemetry::Context::new().with_remote_span_context(self.span_context().clone())
    }
}

/// The trace id and root span id of an entry without a producer's context: XXH3-128 of the
/// length-prefixed parts, and XXH3-64 of that for the span. Every entry pays for this while
/// traces are exported, so it is a fast hash and not a cryptographic one: no one gains by
/// forging these ids, since a producer can name any trace in `traceparent`. XXH3's output is
/// fixed by its specification, so every host and version agrees.
pub fn own_ids(stream: &str, group: &str, origin_id: &str) -> (TraceId, SpanId) {
    let parts = ["sluice-trace", stream, group, origin_id];
    let len: usize = parts.iter().map(|p| 8 + p.len()).sum();
    let trace = if len <= SMALL {
        // The usual case, hashed in one pass over a buffer on the stack.
        let mut buf = [0u8; SMALL];
        let mut at = 0;
        for part in parts {
            buf[at..at + 8].copy_from_slice(&(part.len() as u64).to_be_bytes());
            buf[at + 8..at + 8 + part.len()].copy_from_slice(part.as_bytes());
            at += 8 + part.len();
        }
        xxh3::xxh3_128(&buf[..at])
    } else {
        let mut hash = Xxh3::new();
        for part in parts {
            hash.update(&(part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        hash.digest128()
    };
    let span = xxh3::xxh3_64(&trace.to_be_bytes());
    // Zero is W3C's "no id"; a hash gives it with probability 2^-128 (2^-64 for the span).
    (TraceId::from(trace.max(1)), SpanId::from(span.max(1)))
}

/// The longest input [`own_ids`] hashes from the stack.
const SMALL: usize = 256;

/// The first value of field `name`, as text, if any.
fn field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n.as_slice() == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

/// Whether `value` has the shape W3C gives a `traceparent`: `vv-<32 hex>-<16 hex>-ff`, lowercase,
/// more dash-separated parts only after a version other than `00` (and `ff` is no version).
/// The propagator checks the rest (all-zero ids, the version's range); it alone would accept
/// short or signed hex.
fn traceparent_shape(value: &str) -> bool {
    let lower_hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let mut parts = value.split('-');
    let (Some(version), Some(trace), Some(span), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let more = parts.next().is_some();
    lower_hex(version, 2)
        && version != "ff"
        && !(version == "00" && more)
        && lower_hex(trace, 32)
        && lower_hex(span, 16)
        && lower_hex(flags, 2)
}

struct Fields<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(self.traceparent),
            TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// Why a producer's context was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// No `traceparent` field.
    Absent,
    /// A `traceparent` that is not one (or too long, or not text).
    Invalid,
}

/// The producer's context in `fields`, if valid; a `tracestate` that is not valid is dropped
/// (the parent is kept) and counted like an invalid `traceparent`.
pub fn producer_context(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<SpanContext, Rejected> {
    let raw = field(fields, TRACEPARENT).ok_or(Rejected::Absent)?;
    let traceparent = (raw.len() <= MAX_CONTEXT_BYTES)
        .then(|| std::str::from_utf8(raw).ok())
        .flatten()
        .filter(|v| traceparent_shape(v))
        .ok_or(Rejected::Invalid)?;
    let tracestate = field(fields, TRACESTATE).and_then(|raw| {
        let ok = (raw.len() <= MAX_CONTEXT_BYTES)
            .then(|| std::str::from_utf8(raw).ok())
            .flatten()
            .filter(|v| v.parse::<TraceState>().is_ok());
        if ok.is_none() {
            REJECTED.fetch_add(1, Ordering::Relaxed);
        }
        ok
    });
    let cx = TraceContextPropagator::new().extract(&Fields {
        traceparent,
        tracestate,
    });
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        Ok(sc)
    } else {
        Err(Rejected::Invalid)
    }
}

/// The parent of an entry's spans (see the module's documentation), `sampled` saying whether an
/// entry without a producer's context is traced; an invalid producer context is counted.
pub fn parent_of(
    stream: &str,
    group: &str,
    origin_id: &str,
    fields: &[(Vec<u8>, Vec<u8>)],
    sampled: impl FnOnce(TraceId) -> bool,
) -> Parent {
    match producer_context(fields) {
        Ok(sc) => Parent::Producer(sc),
        Err(why) => {
            if why == Rejected::Invalid {
                REJECTED.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    "the entry's traceparent field is not a valid W3C trace context; the entry gets a trace of its own"
                );
            }
            Parent::Own(own_root(stream, group, origin_id, sampled))
        }
    }
}

/// The root span of an entry's own trace.
pub fn own_root(
    stream: &str,
    group: &str,
    origin_id: &str,
    sampled: impl FnOnce(TraceId) -> bool,
) -> SpanContext {
    let (trace, span) = own_ids(stream, group, origin_id);
    let flags = if sampled(trace) {
        opentelemetry::trace::TraceFlags::SAMPLED
    } else {
        opentelemetry::trace::TraceFlags::default()
    };
    SpanContext::new(trace, span, flags, true, TraceState::default())
}

/// The trace id of an entry (for the page and `sluice dead-letters`): its producer's, or its own.
/// Nothing is counted: this only shows what delivery used.
pub fn trace_id_of(
    stream: &str,
    group: &str,
    origin_id: &str,
    fields: &[(Vec<u8>, Vec<u8>)],
) -> String {
    match producer_context(fields) {
        Ok(sc) => sc.trace_id().to_string(),
        Err(_) => own_ids(stream, group, origin_id).0.to_string(),
    }
}

/// The W3C `traceparent` of a span context.
pub fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(tp: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b"payload".to_vec(), b"{}".to_vec()),
            (TRACEPARENT.as_bytes().to_vec(), tp.to_vec()),
        ]
    }

    const GOOD: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_valid_traceparent_is_the_parent() {
        let sc = producer_context(&with(GOOD.as_bytes())).unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(traceparent(&sc), GOOD);
        // A later version may add parts.
        let v1 = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra";
        assert!(producer_context(&with(v1.as_bytes())).is_ok());
    }

    #[test]
    fn every_bad_shape_is_rejected() {
        let big = format!("{GOOD}{}", "0".repeat(1 << 20));
        for bad in [
            "",
            "garbage",
            &GOOD.to_uppercase(),
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            "00-af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333\n-01",
            &big,
        ] {
            assert_eq!(
                producer_context(&with(bad.as_bytes())),
                Err(Rejected::Invalid),
                "{bad:.80}"
            );
        }
        assert_eq!(producer_context(&with(b"\xff\xfe")), Err(Rejected::Invalid));
        assert_eq!(producer_context(&[]), Err(Rejected::Absent));
    }

    #[test]
    fn a_bad_tracestate_is_dropped_but_the_parent_kept() {
        let mut fields = with(GOOD.as_bytes());
        fields.push((TRACESTATE.as_bytes().to_vec(), b"vendor=ok,x=1".to_vec()));
        let sc = producer_context(&fields).unwrap();
        assert_eq!(sc.trace_state().header(), "vendor=ok,x=1");
        let before = rejected_total();
        fields.last_mut().unwrap().1 = vec![b'a'; 100_000];
        let sc = producer_context(&fields).unwrap();
        assert_eq!(sc.trace_state().header(), "");
        assert!(rejected_total() > before);
    }

    #[test]
    fn an_entry_without_one_has_its_own_stable_trace() {
        let a = parent_of("s", "g", "1-0", &[], |_| true);
        let b = parent_of("s", "g", "1-0", &with(b"nonsense"), |_| true);
        assert_eq!(a, b, "an invalid context falls back to the entry's own");
        assert!(matches!(a, Parent::Own(_)));
        assert_ne!(
            a.trace_id(),
            parent_of("s", "g2", "1-0", &[], |_| true).trace_id()
        );
        assert_ne!(
            a.trace_id(),
            parent_of("s", "g", "1-1", &[], |_| true).trace_id()
        );
        // Parts cannot run into each other.
        assert_ne!(own_ids("ab", "c", "1-0"), own_ids("a", "bc", "1-0"));
        // Names too long for the stack buffer hash the same bytes, streamed.
        let long = "s".repeat(SMALL);
        let mut bytes = Vec::new();
        for part in ["sluice-trace", long.as_str(), "g", "1-0"] {
            bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
        let trace = xxh3::xxh3_128(&bytes);
        assert_eq!(
            own_ids(&long, "g", "1-0"),
            (
                TraceId::from(trace),
                SpanId::from(xxh3::xxh3_64(&trace.to_be_bytes()))
            )
        );
        assert_eq!(trace_id_of("s", "g", "1-0", &[]), a.trace_id());
        assert_eq!(
            trace_id_of("s", "g", "1-0", &with(GOOD.as_bytes())),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(
            !parent_of("s", "g", "1-0", &[], |_| false)
                .span_context()
                .is_sampled()
        );
    }
}

#[cfg(test)]
mod cost {
    #[test]
    #[ignore = "a measurement: cargo test --release -p sluice-host -- --ignored parent_cost --nocapture"]
    fn parent_cost() {
        let fields = vec![(b"payload".to_vec(), b"{\"n\":1}".to_vec())];
        let started = std::time::Instant::now();
        let mut sampled = 0;
        for i in 0..1_000_000u64 {
            let origin = format!("1700000000000-{i}");
            let p = super::parent_of("payments", "billing", &origin, &fields, |t| {
                (u128::from_be_bytes(t.to_bytes()) as u64).is_multiple_of(100)
            });
            sampled += usize::from(p.span_context().is_sampled());
        }
        eprintln!(
            "{:?} per entry ({sampled} sampled)",
            started.elapsed() / 1_000_000
        );
    }
}
