//! The `[telemetry]` table in force, for its trace links: whether trace ids are shown at all,
//! and the link to one in the operator's trace viewer.

use std::sync::Arc;

use crate::config::telemetry::Telemetry;

use super::switch::enabled;

/// The `[telemetry]` table in force, for its trace links (set by
/// [`start`](super::exporter::start), even when it names no collector).
static CONFIG: arc_swap::ArcSwapOption<Telemetry> = arc_swap::ArcSwapOption::const_empty();

/// Take the `[telemetry]` table's trace links (a command that exports nothing still shows
/// them).
pub fn set_config(config: Option<&Telemetry>) {
    CONFIG.store(config.cloned().map(Arc::new));
}

/// Whether trace ids mean anything here (traces are exported, or the config has a
/// `[telemetry]` table): the page and the CLI show them only then.
pub fn traces_shown() -> bool {
    enabled() || CONFIG.load().is_some()
}

/// The link to `trace_id` in the operator's trace viewer, when `trace_url` is set (see
/// [`Telemetry::link`]: only a trace id ever enters the URL).
pub fn trace_link(trace_id: &str) -> Option<String> {
    CONFIG.load().as_ref()?.link(trace_id)
}
