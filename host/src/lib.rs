//! The Sluice host: runs WebAssembly handler components on Redis Streams consumer groups.
//!
//! # The house, bottom up
//!
//! Each folder is a layer; a module uses only the layers below it (`tests/all/structure.rs`
//! checks it file by file). Read bottom-up, the layers are the data's way:
//!
//! 1. [`support`]: digests, error chains, times, the clock, memory, private files.
//! 2. [`config`]: the operator's TOML, validated before any task starts.
//! 3. [`observe`]: metrics, health, events and traces; everything above reports here.
//! 4. [`store`]: Redis connections, every key's name, reads of state, the doorbell.
//! 5. [`entry`]: what an entry is on its way: a delivery, the outcome decided for it, a
//!    parked member, its history.
//! 6. [`handler`]: what the pipeline calls for each delivery, the slot that holds the current
//!    one, and a trial beside it.
//! 7. [`runtime`]: the handler call for a WASM component: the wasmtime engine, components
//!    cached by digest, instances and their limits, the host side of the WIT imports.
//! 8. [`pipeline`]: the way itself, one folder per step: [`pipeline::admit`] →
//!    [`pipeline::read`] → [`pipeline::order`] → [`pipeline::dispatch`] → [`pipeline::settle`] →
//!    [`pipeline::delayed`] → back to read.
//! 9. [`control`]: changing a running pipeline: hot swap, rollout, acting on what waits,
//!    retention.
//! 10. [`serve`]: the admin API and the operator's page.
//! 11. [`service`]: a checked plan becomes running subscriptions, and drains on stop.
//! 12. [`project`]: a handler project before it is a component (`sluice new`, `build`, `dev`).
//! 13. [`cli`]: the subcommands `main` runs, one file each.

pub mod cli;
pub mod config;
pub mod control;
pub mod entry;
pub mod handler;
pub mod observe;
pub mod pipeline;
pub mod project;
pub mod runtime;
mod serve;
mod service;
pub mod store;
pub mod support;

/// What `sluice --version` says: the crate's version, the commit it was built from and the WIT
/// package its guests build against (a handler built for another WIT package is refused).
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SLUICE_COMMIT"),
    ", WIT ",
    env!("SLUICE_WIT_PACKAGE"),
    ")"
);

pub use config::Config;
pub use observe::events::{Event, EventKind, Listener};
pub use observe::metrics::Metrics;
pub use pipeline::settle::dead_letter_script_sha;
pub use service::plan::{Plan, SubscriptionPlan};
pub use service::{RunError, Service};
