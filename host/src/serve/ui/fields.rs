//! How an entry's data shows on a page: a field's value (pretty JSON, text or hex, long ones
//! folded), a dead letter's reason with its traceback, an entry's trace id. maud escapes every
//! value: an entry is untrusted input.

use maud::{Markup, html};

use crate::control::operate::printable;

/// Past this many characters or lines a value is folded: its first line shows, the rest opens.
const FOLD_CHARS: usize = 400;
const FOLD_LINES: usize = 12;

/// A field's value for a page: pretty JSON when it is JSON, text when it is UTF-8, hex bytes
/// otherwise. The caller's template escapes it.
fn shown(value: &[u8]) -> String {
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(value)
        && (json.is_object() || json.is_array())
        && let Ok(pretty) = serde_json::to_string_pretty(&json)
    {
        return pretty;
    }
    printable(value)
}

/// One value as the page shows it: whole when short, else folded under its first line with its
/// size, so a row of a 40 KB payload does not push every other row off the screen.
pub(super) fn value(text: &str) -> Markup {
    let lines = text.lines().count();
    if text.chars().count() <= FOLD_CHARS && lines <= FOLD_LINES {
        return html! { pre { (text) } };
    }
    let head: String = text.lines().next().unwrap_or("").chars().take(80).collect();
    html! {
        details.value {
            summary { code { (head) } " … " span.muted { (bytesize::ByteSize::b(text.len() as u64)) ", " (lines) " lines" } }
            pre { (text) }
        }
    }
}

/// An entry's fields, each name with its value (see [`value`]).
pub(super) fn fields(fields: &[(Vec<u8>, Vec<u8>)]) -> Markup {
    html! {
        @for (name, v) in fields {
            div.field { code { (printable(name)) } (value(&shown(v))) }
        }
    }
}

/// A dead letter's reason: text that wraps (long ones folded), and its traceback, when it has
/// one, as lines in a fold under it.
pub(super) fn reason_cell(reason: &str, trace: Option<&str>) -> Markup {
    html! {
        div.reason { (value(reason)) }
        @if let Some(trace) = trace {
            details.trace { summary { "traceback (" (trace.lines().count()) " lines)" } pre { (trace) } }
        }
    }
}

/// An entry's trace id under its origin id, a link when `trace_url` is set; nothing when
/// traces are neither exported nor linked.
pub(super) fn trace_cell(trace_id: Option<String>) -> Markup {
    let Some(id) = trace_id.filter(|_| crate::observe::telemetry::traces_shown()) else {
        return html! {};
    };
    html! {
        br;
        span.muted.trace-id {
            "trace "
            @match crate::observe::telemetry::trace_link(&id) {
                Some(link) => a href=(link) rel="noopener noreferrer" target="_blank" { code { (id) } },
                None => code { (id) },
            }
        }
    }
}
