//! The handler a subscription runs, and the slot that lets it be replaced while it runs.
//!
//! [`Handler`] is what dispatch calls: the WASM runtime implements it for a component, tests
//! and the benchmark implement it natively. Each subscription's handler lives in a
//! [`HandlerSlot`]: an `ArcSwap` of the current [`Version`]. A delivery takes the current
//! version once, when it starts, and keeps it to the end, so deliveries that started on the old
//! version finish on it and every delivery that starts after a swap runs the new one. Nothing
//! is paused and no entry is re-read.
//!
//! This module sits between the runtime (which implements [`Handler`]) and dispatch (which
//! calls it), so neither depends on the other; `swap` decides what gets published here.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;

use crate::delivery::Delivery;
use crate::digest::Digest;
use crate::metrics::{HandlerLabels, Metrics, SubLabels};
use crate::outcome::{Failure, Outcome};

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
            since: SystemTime::now(),
        }
    }
}

/// A rollback was asked for, but no version was replaced yet.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no previous version to roll back to")]
pub struct NoPrevious;

/// The current handler of one subscription, and the one before it.
pub struct HandlerSlot {
    /// The latest versions made current, newest last (at most [`HISTORY`]).
    history: Mutex<std::collections::VecDeque<Served>>,
    current: ArcSwap<Version>,
    previous: Mutex<Option<Arc<Version>>>,
    metrics: Arc<Metrics>,
    labels: SubLabels,
    swaps: Counter,
    refusals: Counter,
    /// Where the handler versions of this subscription count what they refuse.
    counters: HandlerCounters,
}

/// How many version changes a slot remembers for the admin page.
pub const HISTORY: usize = 20;

/// One change of the version a subscription serves.
#[derive(Debug, Clone)]
pub struct Served {
    /// When.
    pub at: std::time::SystemTime,
    /// The version made current.
    pub digest: Digest,
    /// How: "started", "swapped in" or "rolled back to".
    pub how: &'static str,
}

impl HandlerSlot {
    /// A slot serving `handler`.
    pub fn new(handler: Arc<dyn Handler>, metrics: Arc<Metrics>, labels: SubLabels) -> Self {
        let version = Arc::new(Version::new(handler));
        let swaps = metrics.swaps.get_or_create(&labels).clone();
        let refusals = metrics.swap_refusals.get_or_create(&labels).clone();
        let counters = HandlerCounters {
            http_denied: metrics.http_denied.get_or_create(&labels).clone(),
            log_dropped: metrics.guest_log_dropped.get_or_create(&labels).clone(),
        };
        let slot = Self {
            history: Mutex::new(std::collections::VecDeque::from([Served {
                at: std::time::SystemTime::now(),
                digest: version.digest.clone(),
                how: "started",
            }])),
            counters,
            swaps,
            refusals,
            current: ArcSwap::new(version.clone()),
            previous: Mutex::new(None),
            metrics,
            labels,
        };
        slot.mark_serving(&version.digest, true);
        slot
    }

    /// The version new deliveries run.
    pub fn current(&self) -> Arc<Version> {
        self.current.load_full()
    }

    /// The version a rollback would restore.
    pub fn previous(&self) -> Option<Arc<Version>> {
        self.previous.lock().ok().and_then(|p| p.clone())
    }

    /// The subscription's labels.
    pub fn labels(&self) -> &SubLabels {
        &self.labels
    }

    /// Swaps and refusals so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.swaps.get(), self.refusals.get())
    }

    fn info_labels(&self, digest: &Digest) -> HandlerLabels {
        HandlerLabels {
            stream: self.labels.stream.clone(),
            group: self.labels.group.clone(),
            digest: digest.to_string(),
        }
    }

    fn mark_serving(&self, digest: &Digest, serving: bool) {
        self.metrics
            .handler_info
            .get_or_create(&self.info_labels(digest))
            .set(i64::from(serving));
    }

    /// The latest version changes, oldest first.
    pub fn history(&self) -> Vec<Served> {
        self.history
            .lock()
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn remember(&self, digest: &Digest, how: &'static str) {
        if let Ok(mut history) = self.history.lock() {
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(Served {
                at: std::time::SystemTime::now(),
                digest: digest.clone(),
                how,
            });
        }
    }

    /// Make `version` current; the one it replaces becomes the rollback target.
    pub fn publish(&self, version: Arc<Version>) -> Arc<Version> {
        self.publish_as(version, "swapped in")
    }

    fn publish_as(&self, version: Arc<Version>, how: &'static str) -> Arc<Version> {
        self.remember(&version.digest, how);
        version.handler.activate();
        let old = self.current.swap(version.clone());
        old.handler.retire();
        let dropped = self
            .previous
            .lock()
            .ok()
            .and_then(|mut previous| previous.replace(old.clone()));
        self.mark_serving(&old.digest, false);
        self.mark_serving(&version.digest, true);
        // Only the serving and the rollback digest keep a series: one per upload would grow
        // `/metrics` without end.
        if let Some(dropped) = dropped
            && dropped.digest != version.digest
            && dropped.digest != old.digest
        {
            self.metrics
                .handler_info
                .remove(&self.info_labels(&dropped.digest));
        }
        self.swaps.inc();
        tracing::info!(
            stream = %self.labels.stream,
            group = %self.labels.group,
            from = old.digest.short(),
            to = version.digest.short(),
            "handler swapped"
        );
        old
    }

    /// Put the previous version back.
    pub fn rollback(&self) -> Result<Arc<Version>, NoPrevious> {
        let previous = self.previous().ok_or(NoPrevious)?;
        self.publish_as(previous.clone(), "rolled back to");
        Ok(previous)
    }

    /// Count a refused swap (the caller logs why).
    pub fn count_refusal(&self) {
        self.refusals.inc();
    }

    /// Where the handler versions of this subscription count what they refuse.
    pub fn counters(&self) -> &HandlerCounters {
        &self.counters
    }
}
