//! Hot swap: replacing a subscription's handler while it runs, without losing or duplicating a
//! delivery.
//!
//! Each subscription's handler lives in a [`HandlerSlot`]: an `ArcSwap` of the current
//! [`Version`]. A delivery takes the current version once, when it starts, and keeps it to the
//! end, so deliveries that started on the old version finish on it and every delivery that
//! starts after a swap runs the new one. Nothing is paused and no entry is re-read: a swap
//! changes which code handles the next entry, never which entries are handled.
//!
//! [`SwapControl::swap`] is the one way in: the new component is compiled off the async
//! executor, checked against the WIT world, and its descriptor (with the operator's overrides)
//! compared with the running subscription; a different stream or group is refused unless the
//! operator forces it. Only then is it published; the version it replaced is kept, so a
//! rollback is instant.
//!
//! Three ways in share that one mechanism: the admin API (`crate::admin`), `sluice swap`
//! (which calls the API), and [`watch`], which polls each subscription's component file and
//! swaps when it changed and has stayed unchanged for one more interval. Polling the file's
//! size, modification time and inode works the same on every filesystem (container volumes
//! and network mounts included); a half-written file that happens to sit still is refused by
//! the checks like any other bad component, and picked up once the write completes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;

use crate::config::{Limits, Overrides};
use crate::dispatch::Handler;
use crate::metrics::{HandlerLabels, Metrics, SubLabels};
use crate::plan::overlay;
use crate::runtime::{HandlerCounters, Runtime, RuntimeError, WasmHandler};

/// One version of a subscription's handler.
pub struct Version {
    /// The handler.
    pub handler: Arc<dyn Handler>,
    /// Its digest (SHA-256 of the component).
    pub digest: Arc<str>,
    /// When it started serving.
    pub since: SystemTime,
}

impl Version {
    /// A version serving from now on.
    pub fn new(handler: Arc<dyn Handler>) -> Self {
        Self {
            digest: handler.digest().into(),
            handler,
            since: SystemTime::now(),
        }
    }
}

/// Why a swap or rollback was refused. The old handler keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// The upload is not a component of the handler world.
    #[error(transparent)]
    Component(#[from] RuntimeError),
    /// Its descriptor does not resolve.
    #[error("the new component's descriptor is invalid: {0}")]
    Descriptor(#[from] sluice_descriptor::DescriptorError),
    /// Its descriptor names another stream or group.
    #[error(
        "the new component subscribes to stream `{new_stream}` group `{new_group}`, but this subscription reads stream `{stream}` group `{group}`; swap with force to accept"
    )]
    Changed {
        /// The running stream.
        stream: String,
        /// The running group.
        group: String,
        /// The new descriptor's stream.
        new_stream: String,
        /// The new descriptor's group.
        new_group: String,
    },
    /// There is nothing to roll back to.
    #[error("no previous version to roll back to")]
    NoPrevious,
    /// Compiling was cut off.
    #[error("compilation did not finish: {0}")]
    Interrupted(String),
}

/// The current handler of one subscription, and the one before it.
pub struct HandlerSlot {
    current: ArcSwap<Version>,
    previous: Mutex<Option<Arc<Version>>>,
    metrics: Arc<Metrics>,
    labels: SubLabels,
    swaps: Counter,
    refusals: Counter,
    /// Where the handler versions of this subscription count what they refuse.
    counters: HandlerCounters,
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

    fn mark_serving(&self, digest: &str, serving: bool) {
        self.metrics
            .handler_info
            .get_or_create(&HandlerLabels {
                stream: self.labels.stream.clone(),
                group: self.labels.group.clone(),
                digest: digest.to_owned(),
            })
            .set(i64::from(serving));
    }

    /// Make `version` current; the one it replaces becomes the rollback target.
    pub fn publish(&self, version: Arc<Version>) -> Arc<Version> {
        version.handler.activate();
        let old = self.current.swap(version.clone());
        old.handler.retire();
        if let Ok(mut previous) = self.previous.lock() {
            *previous = Some(old.clone());
        }
        self.mark_serving(&old.digest, false);
        self.mark_serving(&version.digest, true);
        self.swaps.inc();
        tracing::info!(
            stream = %self.labels.stream,
            group = %self.labels.group,
            from = &old.digest[..old.digest.len().min(12)],
            to = &version.digest[..version.digest.len().min(12)],
            "handler swapped"
        );
        old
    }

    /// Put the previous version back.
    pub fn rollback(&self) -> Result<Arc<Version>, SwapError> {
        let previous = self.previous().ok_or(SwapError::NoPrevious)?;
        self.publish(previous.clone());
        Ok(previous)
    }

    fn refused(&self, err: &SwapError) {
        self.refusals.inc();
        tracing::warn!(
            stream = %self.labels.stream,
            group = %self.labels.group,
            %err,
            "swap refused; the current handler keeps serving"
        );
    }
}

/// Everything needed to check and install a new component for one subscription.
pub struct SwapControl {
    slot: Arc<HandlerSlot>,
    runtime: Runtime,
    overrides: Overrides,
    limits: Limits,
    values: Vec<(String, String)>,
}

impl SwapControl {
    /// Control over `slot` (whose labels name the running stream and group), configured with
    /// `overrides`, `limits` and `values`.
    pub fn new(
        slot: Arc<HandlerSlot>,
        runtime: Runtime,
        overrides: Overrides,
        limits: Limits,
        values: Vec<(String, String)>,
    ) -> Self {
        Self {
            slot,
            runtime,
            overrides,
            limits,
            values,
        }
    }

    /// The slot.
    pub fn slot(&self) -> &Arc<HandlerSlot> {
        &self.slot
    }

    /// Check `bytes` and, if they pass, make them the subscription's handler. `origin` names
    /// the upload or file in errors.
    pub async fn swap(
        &self,
        origin: PathBuf,
        bytes: Vec<u8>,
        force: bool,
    ) -> Result<Arc<Version>, SwapError> {
        let result = self.check(origin, bytes, force).await;
        match result {
            Ok(version) => {
                self.slot.publish(version.clone());
                Ok(version)
            }
            Err(err) => {
                self.slot.refused(&err);
                Err(err)
            }
        }
    }

    async fn check(
        &self,
        origin: PathBuf,
        bytes: Vec<u8>,
        force: bool,
    ) -> Result<Arc<Version>, SwapError> {
        let runtime = self.runtime.clone();
        let component = tokio::task::spawn_blocking(move || runtime.load_bytes(&origin, &bytes))
            .await
            .map_err(|e| SwapError::Interrupted(e.to_string()))??;
        let descriptor = overlay(component.descriptor().await?, &self.overrides).resolve()?;
        let running = &self.slot.labels;
        if !force && (descriptor.stream != running.stream || descriptor.group != running.group) {
            return Err(SwapError::Changed {
                stream: running.stream.clone(),
                group: running.group.clone(),
                new_stream: descriptor.stream,
                new_group: descriptor.group,
            });
        }
        let handler = WasmHandler::new(
            component,
            self.limits.clone(),
            self.values.clone(),
            self.slot.counters.clone(),
        );
        Ok(Arc::new(Version::new(Arc::new(handler))))
    }

    /// Put the previous version back.
    pub fn rollback(&self) -> Result<Arc<Version>, SwapError> {
        self.slot.rollback()
    }
}

/// What identifies one state of a file, cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn fingerprint(path: &std::path::Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode: meta.ino(),
    })
}

/// Swap `control`'s handler whenever the file at `path` changes and then stays unchanged for
/// one more `interval` (a debounce: a file still being written keeps changing), until `stop`.
pub async fn watch(
    control: Arc<SwapControl>,
    path: PathBuf,
    interval: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    use sha2::Digest as _;
    let mut applied = fingerprint(&path);
    let mut candidate: Option<Fingerprint> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
        let now = fingerprint(&path);
        if now == applied || now.is_none() {
            candidate = None;
            continue;
        }
        if candidate != now {
            // Changed since the last look: wait until it holds still.
            candidate = now;
            continue;
        }
        candidate = None;
        applied = now;
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::warn!(path = %path.display(), %err, "component file changed but cannot be read");
                continue;
            }
        };
        let digest = hex::encode(sha2::Sha256::digest(&bytes));
        if *control.slot().current().digest == *digest {
            continue;
        }
        tracing::info!(path = %path.display(), "component file changed; swapping");
        // A refusal is logged and counted by `swap`; the current handler keeps serving.
        let _ = control.swap(path.clone(), bytes, false).await;
    }
}
