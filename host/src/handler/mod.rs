//! The handler a subscription runs, and the slot that lets it be replaced while it runs.
//!
//! [`Handler`] is what dispatch calls: the WASM runtime implements it for a component, tests
//! and the benchmark implement it natively. Each subscription's handler lives in a
//! [`HandlerSlot`]: an `ArcSwap` of the current [`Version`]. A delivery takes the current
//! version once, when it starts, and keeps it to the end, so deliveries that started on the old
//! version finish on it and every delivery that starts after a swap runs the new one. Nothing
//! is paused and no entry is re-read.
//!
//! A slot may also hold a [`Trial`]: a candidate version that a share of deliveries runs (a
//! canary, see `crate::control::rollout`), chosen per entry by a keyed hash of its origin id so that
//! every attempt of one entry runs on the same version. The trial counts what each version's
//! attempts came to; `crate::control::rollout` compares the two and ends the trial.
//!
//! Files: [`trial`] is a candidate version tried on a share of deliveries (and what its
//! attempts counted), [`slot`] is the slot itself (current version, history, trial).
//!
//! This module sits between the runtime (which implements [`Handler`]) and dispatch (which
//! calls it), so neither depends on the other; `swap` decides what gets published here.

mod slot;
mod trial;

use std::sync::Arc;
use std::time::SystemTime;

use futures::future::BoxFuture;

use crate::entry::delivery::Delivery;
use crate::entry::outcome::{Failure, Outcome};
use crate::support::digest::Digest;

pub use slot::*;
pub use trial::*;

/// Something that handles deliveries: a WASM component, or native code in tests and benches.
pub trait Handler: Send + Sync + 'static {
    /// Which version of the handler this is (a content digest for components).
    fn digest(&self) -> &Digest;

    /// Handle one delivery.
    fn handle<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<Outcome, Failure>>;

    /// A swap replaced this handler: release what it keeps for later deliveries (deliveries
    /// that already started finish on it).
    fn retire(&self) {}

    /// A rollback made this handler current again.
    fn activate(&self) {}
}

/// Where a subscription's handlers count what they refuse (kept across hot swaps).
#[derive(Debug, Clone, Default)]
pub struct HandlerCounters {
    /// Outbound HTTP requests refused (`sluice_http_denied_total`).
    pub http_denied: prometheus_client::metrics::counter::Counter,
    /// Guest log lines dropped or cut (`sluice_guest_log_dropped_total`).
    pub log_dropped: prometheus_client::metrics::counter::Counter,
}

/// One version of a subscription's handler.
pub struct Version {
    /// The handler.
    pub handler: Arc<dyn Handler>,
    /// Its digest (SHA-256 of the component).
    pub digest: Digest,
    /// When it started serving.
    pub since: SystemTime,
}

impl Version {
    /// A version serving from now on.
    pub fn new(handler: Arc<dyn Handler>) -> Self {
        Self {
            digest: handler.digest().clone(),
            handler,
            since: crate::support::clock::now(),
        }
    }
}

/// A rollback was asked for, but no version was replaced yet.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no previous version to roll back to")]
pub struct NoPrevious;
