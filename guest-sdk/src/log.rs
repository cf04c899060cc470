//! Guest `tracing` events, forwarded to the host's logs through the WIT `log` import.
//!
//! The layer is installed once per instance (on its first call), together with a panic hook
//! that logs the panic message before the instance traps, so the host can say why.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata};

use crate::__bindings::sluice::handler::log as wit;

/// Forwards events to the host. Spans are the host's business (each delivery runs inside the
/// host's span), so guest spans are accepted and ignored; this keeps the per-instance set-up to
/// almost nothing, which matters when every delivery gets a fresh instance.
struct HostSubscriber;

#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.pairs.push((field.name().to_owned(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        if field.name() == "message" {
            self.message.push_str(&text);
        } else {
            self.pairs.push((field.name().to_owned(), text));
        }
    }
}

impl tracing::Subscriber for HostSubscriber {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = match *event.metadata().level() {
            tracing::Level::TRACE => wit::Level::Trace,
            tracing::Level::DEBUG => wit::Level::Debug,
            tracing::Level::INFO => wit::Level::Info,
            tracing::Level::WARN => wit::Level::Warn,
            tracing::Level::ERROR => wit::Level::Error,
        };
        wit::log(level, &fields.message, &fields.pairs);
    }
}

/// Install the forwarding layer and the panic hook; later calls do nothing.
pub(crate) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(HostSubscriber);
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let payload = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            wit::log(
                wit::Level::Error,
                &format!("panicked{location}: {payload}"),
                &[("sluice.panic".to_owned(), "true".to_owned())],
            );
        }));
    });
}
