//! Seeing what the host does: numbers, health, events and traces. Everything above reports
//! here; nothing here decides what happens to an entry.
//!
//! - [`metrics`] is the Prometheus registry, labelled by stream and group.
//! - [`health`] is how each subscription is doing, for `/readyz` and the page: its reads, and
//!   whether its sweep holds due retries back.
//! - [`events`] reports each settled delivery to whoever listens (tests, the bench), and costs
//!   nothing while nobody does.
//! - [`telemetry`] exports the spans (each attempt's) over OTLP to a collector, bounded, when
//!   `[telemetry]` or the `OTEL_*` variables name one.

pub(crate) mod events;
pub(crate) mod health;
pub(crate) mod metrics;
pub mod telemetry;

/// The table of every metric family (public: the book's metrics reference is written from it).
pub use metrics::series;
