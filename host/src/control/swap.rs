//! Hot swap: replacing a subscription's handler while it runs, without losing or duplicating a
//! delivery.
//!
//! A swap publishes a new [`Version`] into the subscription's [`HandlerSlot`]
//! (`crate::handler`): deliveries that started on the old version finish on it, every
//! delivery that starts after runs the new one. Nothing is paused and no entry is re-read: a
//! swap changes which code handles the next entry, never which entries are handled.
//!
//! [`SwapControl::swap`] is the one way in: the new component is compiled off the async
//! executor, checked against the WIT world, and its descriptor (with the operator's overrides)
//! compared with the running subscription; a different stream or group is refused unless the
//! operator forces it. Only then is it published; the version it replaced is kept, so a
//! rollback is instant.
//!
//! Three ways in share that one mechanism: the admin API (`crate::serve`), `sluice swap`
//! (which calls the API), and [`watch`], which polls each subscription's component file and
//! swaps when it changed and has stayed unchanged for one more interval. Polling the file's
//! size, modification time and inode works the same on every filesystem (container volumes
//! and network mounts included); a half-written file that happens to sit still is refused by
//! the checks like any other bad component, and picked up once the write completes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use sluice_descriptor::Overrides;

use crate::config::Limits;
use crate::handler::{HandlerSlot, NoPrevious, Version};
use crate::runtime::{Runtime, RuntimeError, WasmHandler};

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
    /// Its descriptor asks for another number of partitions.
    #[error(
        "the new component asks for {new} partition(s), but this subscription reads {running}; the partitions a host reads change only when it restarts (every host of the group with the same count); swap with force to keep reading {running}"
    )]
    Repartitioned {
        /// The partitions read now.
        running: u32,
        /// The new descriptor's count.
        new: u32,
    },
    /// Its descriptor orders entries otherwise than the running subscription.
    #[error(
        "the new component asks for {new}, but this subscription runs with {running}; the ordering changes only when the hosts restart (every host of the group alike); swap with force to keep {running}"
    )]
    Reordered {
        /// The running ordering, in words.
        running: String,
        /// The new descriptor's, in words.
        new: String,
    },
    /// Its descriptor keeps outbound calls otherwise than the running subscription.
    #[error(
        "the new component asks for effects {new:?}, but this subscription runs with {running:?}; whether calls are journaled changes only when the host restarts (or set effects in the config, which wins); swap with force to keep {running:?}"
    )]
    Effects {
        /// The running mode.
        running: sluice_descriptor::Effects,
        /// The new descriptor's.
        new: sluice_descriptor::Effects,
    },
    /// Its descriptor asks for more partitions than a component may.
    #[error(
        "the new component asks for {0} partitions; a component may ask for at most {max} (set partitions in the config)",
        max = crate::config::MAX_COMPONENT_PARTITIONS
    )]
    TooManyPartitions(u32),
    /// There is nothing to roll back to.
    #[error(transparent)]
    NoPrevious(#[from] NoPrevious),
    /// A canary runs: its verdict (or an abort) decides the version first.
    #[error(
        "a canary of {0} runs on this subscription; wait for its verdict or abort it (`sluice swap --abort-canary`) before swapping or rolling back"
    )]
    CanaryRunning(String),
    /// A deadline cut the check off (the compile, the descriptor call).
    #[error("the swap was cut off: {0}")]
    Interrupted(String),
}

impl SwapError {
    /// The refusal with every cause under it, as one line for the API's answer and the log
    /// (wasmtime's reason for refusing a component is a cause, not the headline).
    pub fn explain(&self) -> String {
        crate::support::chain::chain(self)
    }
}

/// Everything needed to check and install a new component for one subscription.
pub struct SwapControl {
    slot: Arc<HandlerSlot>,
    runtime: Runtime,
    overrides: Overrides,
    limits: Limits,
    values: Vec<(String, String)>,
    partitions: u32,
    /// How the running subscription orders its entries (a new component must ask the same).
    ordered_by: Option<sluice_descriptor::OrderedBy>,
    /// How the running subscription keeps its calls (a new component must ask the same).
    effects: sluice_descriptor::Effects,
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
            partitions: 1,
            ordered_by: None,
            effects: sluice_descriptor::Effects::Live,
        }
    }

    /// The running subscription orders its entries so (a new component must ask the same).
    pub fn with_ordered_by(mut self, ordered_by: Option<sluice_descriptor::OrderedBy>) -> Self {
        self.ordered_by = ordered_by;
        self
    }

    /// The running subscription's effects mode, as resolved (a new component must ask the
    /// same, unless the config decides it).
    pub fn with_effects(mut self, effects: sluice_descriptor::Effects) -> Self {
        self.effects = effects;
        self
    }

    /// The running subscription reads this many partitions (a new component must ask for as
    /// many).
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    pub fn slot(&self) -> &Arc<HandlerSlot> {
        &self.slot
    }

    /// The subscription's limits (what a replay's candidate runs under too).
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Check `bytes` and, if they pass, make them the subscription's handler. `origin` names
    /// the upload or file in errors.
    pub async fn swap(
        &self,
        origin: PathBuf,
        bytes: Vec<u8>,
        force: bool,
    ) -> Result<Arc<Version>, SwapError> {
        if let Some(trial) = self.slot.trial() {
            let err = SwapError::CanaryRunning(trial.candidate.digest.short().to_owned());
            self.slot.count_refusal();
            tracing::warn!(err = %err, "swap refused");
            return Err(err);
        }
        let serving = self.slot.current();
        if serving.digest == crate::support::digest::Digest::of(&bytes) {
            // What serves already: nothing to compile, and the rollback target stays.
            tracing::info!(
                digest = serving.digest.short(),
                "upload is the serving component; nothing swapped"
            );
            return Ok(serving);
        }
        // A swap whose future is dropped half-way (the admin request's deadline, a stop) is
        // a refusal too: counted and logged, its compile killed with it.
        let mut cut_off = CutOff {
            slot: &self.slot,
            armed: true,
        };
        let result = self.check(origin, bytes, force).await;
        cut_off.armed = false;
        match result {
            Ok(version) => {
                self.slot.publish(version.clone());
                Ok(version)
            }
            Err(err) => {
                self.slot.count_refusal();
                tracing::warn!(
                    stream = %self.slot.labels().stream,
                    group = %self.slot.labels().group,
                    err = %err.explain(),
                    "swap refused; the current handler keeps serving"
                );
                Err(err)
            }
        }
    }

    /// Check `bytes` as a swap would (the WIT world, the descriptor against the running
    /// subscription, never forced) and make them a version without publishing it: a canary's
    /// candidate.
    pub async fn prepare(
        &self,
        origin: PathBuf,
        bytes: Vec<u8>,
    ) -> Result<Arc<Version>, SwapError> {
        self.check(origin, bytes, false).await
    }

    /// `bytes` as a handler for a dry run (a replay): compiled and checked against the WIT
    /// world (its descriptor is not compared: a replay runs no subscription), under this
    /// subscription's limits and values, with outbound HTTP granted only to `allowed`; with the
    /// counters its refusals go to.
    pub async fn dry_run_handler(
        &self,
        origin: PathBuf,
        bytes: &[u8],
        allowed: Vec<crate::config::allow::AllowedHost>,
    ) -> Result<(WasmHandler, crate::handler::HandlerCounters), SwapError> {
        let component = self
            .runtime
            .load_bytes(&origin, bytes)
            .await
            .map_err(interrupted_or_refused)?;
        let mut limits = self.limits.clone();
        limits.outbound_http.allowed = allowed;
        let counters = crate::handler::HandlerCounters::default();
        let handler = WasmHandler::new(component, limits, self.values.clone(), counters.clone());
        Ok((handler, counters))
    }

    async fn check(
        &self,
        origin: PathBuf,
        bytes: Vec<u8>,
        force: bool,
    ) -> Result<Arc<Version>, SwapError> {
        let component = self
            .runtime
            .load_bytes(&origin, &bytes)
            .await
            .map_err(interrupted_or_refused)?;
        let descriptor = component
            .descriptor()
            .await
            .map_err(interrupted_or_refused)?
            .overlay(&self.overrides)
            .resolve()?;
        crate::config::check_component_partitions(&self.overrides, descriptor.partitions)
            .map_err(SwapError::TooManyPartitions)?;
        let running = self.slot.labels();
        if !force && (descriptor.stream != running.stream || descriptor.group != running.group) {
            return Err(SwapError::Changed {
                stream: running.stream.clone(),
                group: running.group.clone(),
                new_stream: descriptor.stream,
                new_group: descriptor.group,
            });
        }
        if !force && descriptor.ordered_by != self.ordered_by {
            let say = |o: &Option<sluice_descriptor::OrderedBy>| {
                o.as_ref().map_or_else(
                    || "no ordering".to_owned(),
                    |o| format!("ordered_by {}", o.describe()),
                )
            };
            return Err(SwapError::Reordered {
                running: say(&self.ordered_by),
                new: say(&descriptor.ordered_by),
            });
        }
        if !force && descriptor.effects != self.effects {
            return Err(SwapError::Effects {
                running: self.effects,
                new: descriptor.effects,
            });
        }
        if !force && descriptor.partitions != self.partitions {
            return Err(SwapError::Repartitioned {
                running: self.partitions,
                new: descriptor.partitions,
            });
        }
        let handler = WasmHandler::new(
            component,
            self.limits.clone(),
            self.values.clone(),
            self.slot.counters().clone(),
        );
        Ok(Arc::new(Version::new(Arc::new(handler))))
    }

    /// Put the previous version back.
    pub fn rollback(&self) -> Result<Arc<Version>, SwapError> {
        if let Some(trial) = self.slot.trial() {
            return Err(SwapError::CanaryRunning(
                trial.candidate.digest.short().to_owned(),
            ));
        }
        Ok(self.slot.rollback()?)
    }
}

/// Counts a swap that never finished as refused, when dropped still armed.
struct CutOff<'a> {
    slot: &'a HandlerSlot,
    armed: bool,
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.slot.count_refusal();
            tracing::warn!(
                stream = %self.slot.labels().stream,
                group = %self.slot.labels().group,
                "swap cut off before it finished (a deadline or a stop); the current handler keeps serving"
            );
        }
    }
}

/// A deadline's refusal as [`SwapError::Interrupted`], any other as the refusal it is.
fn interrupted_or_refused(err: RuntimeError) -> SwapError {
    match err {
        RuntimeError::CompileInterrupted { .. } | RuntimeError::DescriptorTimeout { .. } => {
            SwapError::Interrupted(err.to_string())
        }
        other => SwapError::Component(other),
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

/// How many subscriptions of one file swap at once (after the first, which compiles it for all).
const SWAPS_AT_ONCE: usize = 16;

/// Swap the handler of every subscription in `controls` (all run the file at `path`: one
/// watch per file, not per subscription) whenever the file changes and then stays unchanged
/// for one more `interval` (a debounce: a file still being written keeps changing), until
/// `stop`.
pub async fn watch(
    controls: Vec<Arc<SwapControl>>,
    path: PathBuf,
    interval: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
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
        // A file that holds what serves already is a no-op inside `swap`.
        tracing::info!(path = %path.display(), "component file changed; swapping");
        // A refusal is logged and counted by `swap`; the current handler keeps serving. A stop
        // cuts a swap short (its compile or descriptor call), which then never takes effect.
        let all = async {
            use futures::StreamExt as _;
            let mut rest = controls.iter();
            // The first compiles the file (or refuses it); the others find it compiled.
            if let Some(first) = rest.next() {
                let _ = first.swap(path.clone(), bytes.clone(), false).await;
            }
            let swaps = rest.cloned().map(|control| {
                let (path, bytes) = (path.clone(), bytes.clone());
                async move {
                    let _ = control.swap(path, bytes, false).await;
                }
            });
            futures::stream::iter(swaps)
                .buffer_unordered(SWAPS_AT_ONCE)
                .for_each(|()| async {})
                .await;
        };
        tokio::select! {
            () = all => {}
            () = stop.cancelled() => {
                tracing::info!(path = %path.display(), "stopping: the swap in progress is abandoned");
                return;
            }
        }
    }
}
