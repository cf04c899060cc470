//! The host's own spans, written whole rather than lived through ([`Whole`]: an entry's root,
//! its parked wait, a sweep, an operator's action), and the attribute values they carry, cut
//! to a bound.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind};
use opentelemetry_sdk::trace::{IdGenerator as _, SpanData, SpanProcessor as _};

use super::context;
use super::switch::{ACTIVE, enabled, sampled};

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
