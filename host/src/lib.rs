//! The Sluice host: runs WebAssembly handler components on Redis Streams consumer groups.
//!
//! An entry travels through these modules, in this order:
//!
//! 1. [`config`] turns the operator's TOML (or a lone `.wasm`) into a validated [`Config`];
//!    [`plan`] loads each component, reads its descriptor, lays the config over it and checks
//!    the result, before any task starts.
//! 2. [`subscription`] owns one consumer-group subscription: it creates the group, re-reads this
//!    consumer's own pending entries after a restart, claims idle entries (XAUTOCLAIM) on a
//!    claiming subscription, and reads new entries with XREADGROUP, each as a [`delivery`].
//! 3. [`dispatch`] takes a permit (the in-flight limit), calls the handler, and hands the result
//!    to [`outcome`], a pure function that picks ack, retry or dead-letter.
//! 4. [`runtime`] is the handler: the wasmtime engine, components cached by digest, instances
//!    reused or fresh per delivery, and the host side of the WIT imports.
//! 5. [`settle`] carries the decision out in Redis: batched XACKs, atomic dead-lettering, and
//!    retries that stay pending until their delay has passed.
//!
//! Around them: [`swap`] replaces a subscription's handler while it runs (file watcher, admin
//! API), [`metrics`] and [`admin`] (Prometheus metrics, health, readiness, the handler API),
//! [`keys`] names every Redis key and bookkeeping field, [`devredis`] starts a
//! private `redis-server` when no URL is configured, [`events`] reports each settled delivery
//! to observers, and [`shutdown`] stops reading and drains in-flight deliveries on a signal.

pub mod admin;
pub mod commands;
pub mod config;
pub mod delayed;
pub mod delivery;
pub mod devredis;
pub mod dispatch;
pub mod events;
pub mod keys;
pub mod metrics;
pub mod outcome;
pub mod plan;
pub mod redis_conn;
pub mod runtime;
mod service;
pub mod settle;
pub mod shutdown;
pub mod subscription;
pub mod swap;

pub use config::Config;
pub use events::{Event, EventKind};
pub use plan::{Plan, SubscriptionPlan};
pub use service::{RunError, Service};
