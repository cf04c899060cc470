//! The console exporter: each finished span as one line on standard error, so a developer
//! sees an entry's trace (its root, each attempt, each HTTP call, a parked wait) with no
//! collector running (`[telemetry] protocol = "console"`, or `sluice dev --traces`).
//!
//! A line reads `trace <trace id> <span> <duration> <attributes>`: the trace id is the one the
//! delivery's log line and the page show, so the two can be matched by eye or with grep.

use std::fmt::Write as _;
use std::io::Write as _;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// The longest attribute value a line shows, in characters (a reason can be long).
const MAX_SHOWN: usize = 120;

/// Attributes the `tracing` bridge adds that say nothing to a developer reading the line.
const UNSHOWN: &[&str] = &["busy_ns", "idle_ns", "target", "thread.id", "thread.name"];

/// Writes spans to standard error, one line each.
#[derive(Debug, Default)]
pub struct Console;

impl SpanExporter for Console {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut out = String::new();
        for span in &batch {
            line(&mut out, span);
        }
        // One write per batch: lines of concurrent batches never interleave.
        let _ = std::io::stderr().lock().write_all(out.as_bytes());
        Ok(())
    }
}

/// `span` as one line, appended to `out`.
pub fn line(out: &mut String, span: &SpanData) {
    let took = span
        .end_time
        .duration_since(span.start_time)
        .unwrap_or_default();
    let _ = write!(
        out,
        "trace {} {} {:.1?}",
        span.span_context.trace_id(),
        span.name,
        took
    );
    for kv in span
        .attributes
        .iter()
        .filter(|kv| !UNSHOWN.contains(&kv.key.as_str()) && !kv.key.as_str().starts_with("code."))
    {
        let value = kv.value.to_string();
        let value: String = value.chars().take(MAX_SHOWN).collect();
        let _ = write!(out, " {}={}", kv.key, shown(&value));
    }
    if let opentelemetry::trace::Status::Error { description } = &span.status
        && !description.is_empty()
    {
        let _ = write!(out, " error={}", shown(description));
    }
    out.push('\n');
}

/// A value as it can stand in a line: quoted when it holds spaces, control characters
/// escaped (a payload field must not start a line of its own).
fn shown(value: &str) -> String {
    if value
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '"')
    {
        format!("{value:?}")
    } else {
        value.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_cannot_break_the_line() {
        assert_eq!(shown("ack"), "ack");
        assert_eq!(shown("a b"), "\"a b\"");
        assert_eq!(shown("x\ntrace 1 forged"), "\"x\\ntrace 1 forged\"");
    }
}
