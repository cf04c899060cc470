//! The Sluice host: runs WebAssembly handler components on Redis Streams consumer groups.
//!
//! # The data's way
//!
//! An entry travels through these modules, in this order:
//!
//! 1. [`subscription`] (`subscription/`) reads: it creates the group, re-reads this consumer's
//!    own pending entries after a restart, takes over those of a consumer that is gone, claims
//!    idle entries on a claiming subscription, and reads new entries with XREADGROUP (the
//!    partitions of a subscription on one node wait in one blocking read).
//! 2. [`delivery`] (`delivery.rs`) is what one read entry becomes: its id, fields as bytes, and
//!    the bookkeeping a delayed retry carries (checked against the stream's secret).
//! 3. [`dispatch`] (`dispatch.rs`) takes the delivery, runs the subscription's current
//!    [`handler`] inside the delivery's span, and settles what it decided.
//! 4. [`runtime`] (`runtime/`) is the handler call for a WASM component: the wasmtime engine,
//!    components cached by digest, instances and their limits, the host side of the WIT imports.
//! 5. [`outcome`] (`outcome.rs`) is a pure function from the handler's result and the retry
//!    policy to an action: ack, retry after a delay, or dead-letter.
//! 6. [`settle`] (`settle/`) carries the action out in Redis: batched XACKs, atomic
//!    dead-lettering (`settle/lua/dead_letter.lua`), and retries that stay pending.
//! 7. [`delayed`] (`delayed/`) parks a retry in its durable sorted set (`lua/park.lua`) and
//!    sweeps due retries into the group's retry lane (`lua/sweep.lua`), where step 1 reads them
//!    again; [`member`] (`member.rs`) is what a parked retry is in the set and in the lane.
//!    Every park and dead letter also adds a record to the entry's [`history`] (`history.rs`).
//!
//! # Around the way
//!
//! - [`config`] (`config/`) turns the operator's TOML into a validated configuration, and
//!   [`plan`] (`plan.rs`) loads each component, lays the configuration over its descriptor and
//!   checks the result, before any task starts.
//! - [`service`] (`service.rs`) starts a plan's tasks and, when told to stop, drains in-flight
//!   deliveries and flushes their acks; [`shutdown`] (`shutdown.rs`) only turns SIGINT/SIGTERM
//!   into that stop.
//! - [`swap`] (`swap.rs`) checks a new component and publishes it into the subscription's
//!   [`handler`] slot (admin API, file watcher, `sluice swap`).
//! - [`rollout`] (`rollout/`) tries a candidate on a share of the deliveries (a canary every
//!   host of the group runs and judges through Redis, promoting or rolling back by itself) and
//!   replays dead letters against a candidate in a dry run.
//! - [`flow`] (`flow/`) decides whether a subscription may take entries now: an operator's
//!   pause, stored in Redis and followed by every host of the group.
//! - [`admin`] (`admin/`) serves health, readiness, [`metrics`] and the handler API;
//!   [`inspect`] (`inspect.rs`) reads a subscription's state in Redis for them, for
//!   `sluice status` and for the benchmark.
//! - [`doorbell`] (`doorbell.rs`) tells idle subscriptions and delayed sets when their keys
//!   are written (keyspace events on one connection per Redis), so that an idle subscription
//!   holds no connection and sends no command.
//! - [`health`] (`health.rs`) is how each subscription is doing, for `/readyz` and the page:
//!   its reads, and whether its sweep holds due retries back.
//! - [`retention`] (`retention/`) trims what every consumer group of a stream has acknowledged,
//!   so streams do not grow forever.
//! - [`operate`] (`operate/`) acts on what waits: lists dead letters and parked retries, and
//!   requeues, retries now, deletes or dead-letters them (CLI, admin API and web page).
//! - [`commands`] (`commands/`) are the subcommands `main` runs, one file each.
//! - [`project`] (`project/`) is a handler project before it is a component: `sluice new`
//!   writes one (Rust, Python or JavaScript), `sluice build` builds it with its language's
//!   toolchain against the same WIT, `sluice dev` rebuilds it on every save.
//! - [`digest`] names a handler version (its component's SHA-256) in logs, metrics and the API.
//! - [`chain`] renders an error and its causes as one line (logs, `/readyz`, API answers).
//! - [`keys`] names every Redis key and bookkeeping field, seals the host's bookkeeping and
//!   records which subscription owns a key, [`redis_conn`] opens connections and
//!   classifies Redis errors, [`devredis`] starts a private `redis-server` when none is
//!   configured, and [`events`] reports each settled delivery to observers (tests, the bench).
//! - [`when`] writes times for people (RFC 3339), bounded whatever Redis holds; [`clock`] is
//!   the one read of this host's wall clock (a test moves it; Redis's clock decides due times).
//! - [`memory`] makes big buffers (a big entry's) go back to the kernel when freed, and
//!   [`private_file`] writes files only this user may read, whole or not at all.
//! - [`telemetry`] (`telemetry/`) exports the spans (each attempt's) over OTLP to a collector,
//!   bounded, when `[telemetry]` or the `OTEL_*` variables name one.

mod admin;
pub mod chain;
pub mod clock;
pub mod commands;
pub mod config;
pub mod delayed;
pub mod delivery;
pub mod devredis;
pub mod digest;
mod dispatch;
pub mod doorbell;
mod events;
pub mod flow;
pub mod handler;
mod health;
pub mod history;
pub mod inspect;
pub mod keys;
pub mod member;
pub mod memory;
mod metrics;
pub mod operate;
pub mod outcome;
mod plan;
mod private_file;
pub mod project;
pub mod redis_conn;
pub mod retention;
pub mod rollout;
pub mod runtime;
mod service;
mod settle;
mod shutdown;
mod subscription;
mod swap;
pub mod telemetry;
pub mod when;

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
pub use events::{Event, EventKind, Listener};
pub use metrics::Metrics;
pub use plan::{Plan, SubscriptionPlan};
pub use service::{RunError, Service};
pub use settle::dead_letter_script_sha;
