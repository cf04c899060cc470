//! Loading a component: read, digest, compile (in a child process, see [`super::compile`],
//! or from the host's vouched-for cache), check it
//! against the handler world, and read the descriptor it exports.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_descriptor::{Backoff, DelayedRetry, RedisStream};
use wasmtime::component::Component;

use super::bindings::{self, sluice::handler::types as wit};
use super::guest::new_store;
use super::{Runtime, RuntimeError};
use crate::support::digest::Digest;

/// From this size on, loading a component is announced (it may take seconds).
const LARGE_COMPONENT: usize = 4 * 1024 * 1024;

/// How long a component's `subscription()` export may run.
const DESCRIPTOR_TIMEOUT: Duration = Duration::from_secs(5);

/// A compiled component that implements the handler world, ready to instantiate.
#[derive(Clone)]
pub struct LoadedComponent {
    path: PathBuf,
    digest: Digest,
    compiled: Arc<Compiled>,
    runtime: Runtime,
}

/// A component's code, loaded once per process however many subscriptions run it (see
/// [`super::Runtime`]'s `loaded`): 1,000 subscriptions of one component once held 1,000
/// copies of its code, about 2 MiB each, and loaded each in turn at start.
pub(crate) struct Compiled {
    pre: bindings::HandlerPre<super::guest::GuestState>,
    imports_wasi_http: bool,
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

pub(super) async fn load(runtime: &Runtime, path: &Path) -> Result<LoadedComponent, RuntimeError> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| RuntimeError::Read {
            path: path.to_owned(),
            source,
        })?;
    load_bytes(runtime, path, &bytes).await
}

/// Compile (or take from the cache) and check `bytes`; `path` names them in errors and logs.
pub(super) async fn load_bytes(
    runtime: &Runtime,
    path: &Path,
    bytes: &[u8],
) -> Result<LoadedComponent, RuntimeError> {
    let digest = Digest::of(bytes);
    if let Some(compiled) = runtime.loaded(&digest) {
        return Ok(LoadedComponent {
            path: path.to_owned(),
            digest,
            compiled,
            runtime: runtime.clone(),
        });
    }
    let started = Instant::now();
    let mib = bytes.len() as f64 / (1024.0 * 1024.0);
    let cached = runtime.artifacts().and_then(|cache| cache.get(&digest));
    let compiled = cached.is_none();
    if compiled && bytes.len() >= LARGE_COMPONENT {
        // Python and JavaScript components carry their interpreter: tens of MB, seconds to
        // compile the first time.
        tracing::info!(
            component = %path.display(),
            "loading a {mib:.1} MiB component: compiling it takes seconds the first time, later starts read it from the cache"
        );
    }
    let artifact = match cached {
        Some(artifact) => artifact,
        None => runtime.compiler().compile(path, bytes).await?,
    };
    let component = deserialize(runtime, path, &artifact)?;
    let took = started.elapsed();
    if compiled && (bytes.len() >= LARGE_COMPONENT || took >= Duration::from_secs(1)) {
        tracing::info!(
            component = %path.display(),
            digest = digest.short(),
            "compiled the {mib:.1} MiB component in {:.1}s{}",
            took.as_secs_f64(),
            if runtime.artifacts().is_some() { " (cached for the next start)" } else { "" }
        );
    }
    let (pre, imports_wasi_http) = linked(runtime, path, &component)?;
    // Only what passed every check is kept for the next start.
    if compiled && let Some(cache) = runtime.artifacts() {
        cache.put(&digest, &artifact);
    }
    tracing::debug!(
        component = %path.display(),
        digest = digest.short(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        compiled,
        "component loaded"
    );
    let compiled = runtime.keep_loaded(
        &digest,
        Compiled {
            pre,
            imports_wasi_http,
        },
    );
    Ok(LoadedComponent {
        path: path.to_owned(),
        digest,
        compiled,
        runtime: runtime.clone(),
    })
}

/// The compiled artifact made a component of this engine; a component over the pooling
/// allocator's bounds is refused as too big.
fn deserialize(runtime: &Runtime, path: &Path, artifact: &[u8]) -> Result<Component, RuntimeError> {
    // SAFETY: the artifact is native code for this engine's settings, made by this host's
    // own compiler process from `bytes`, or read back from a cache whose keyed hash (a key
    // only this host holds) vouches that this host wrote it. wasmtime checks the settings.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(runtime.engine(), artifact) }.map_err(|e| {
        let pool = format!("{e:#}").contains("pooling allocator");
        let source = super::cause(e);
        if pool {
            RuntimeError::TooBig {
                path: path.to_owned(),
                source,
            }
        } else {
            RuntimeError::Compile {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    Ok(component)
}

/// The component linked against the host's imports (with `wasi:http` only when it imports it):
/// a component of another world is refused here.
fn linked(
    runtime: &Runtime,
    path: &Path,
    component: &Component,
) -> Result<(bindings::HandlerPre<super::guest::GuestState>, bool), RuntimeError> {
    let wrong_world = |e: wasmtime::Error| RuntimeError::WrongWorld {
        path: path.to_owned(),
        source: super::cause(e),
    };
    let imports_wasi_http = component
        .component_type()
        .imports(runtime.engine())
        .any(|(name, _)| name.starts_with("wasi:http/"));
    let instance_pre = runtime
        .linker(imports_wasi_http)
        .instantiate_pre(component)
        .map_err(wrong_world)?;
    let pre = bindings::HandlerPre::new(instance_pre).map_err(wrong_world)?;
    Ok((pre, imports_wasi_http))
}

impl LoadedComponent {
    /// The component file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The SHA-256 of the component's bytes, in hex: which version of a handler this is.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    pub(super) fn pre(&self) -> &bindings::HandlerPre<super::guest::GuestState> {
        &self.compiled.pre
    }

    /// Whether it imports `wasi:http` (and so was linked with it).
    pub fn imports_wasi_http(&self) -> bool {
        self.compiled.imports_wasi_http
    }

    /// The runtime it was compiled for.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Instantiate once and call the component's `subscription()` export.
    pub async fn descriptor(&self) -> Result<RedisStream, RuntimeError> {
        let failed = |e: wasmtime::Error| RuntimeError::Descriptor {
            path: self.path.clone(),
            source: super::cause(e),
        };
        let limits = Arc::new(super::guest::StoreLimits {
            memory: 64 * 1024 * 1024,
            host_memory: crate::config::DEFAULT_HOST_MEMORY_LIMIT,
            log_lines: crate::config::DEFAULT_LOG_LINES,
            log_bytes: crate::config::DEFAULT_LOG_BYTES,
            log_dropped: Default::default(),
        });
        let _slot = self.runtime.instance_slot().await;
        let mut store = new_store(&self.runtime, Arc::from([]), limits, Arc::default());
        store.data_mut().deadline = Some(Instant::now() + DESCRIPTOR_TIMEOUT);
        // The epoch deadline stops a guest that computes; one waiting in a host call (a WASI
        // sleep) is stopped by the timer, and its store dropped with it.
        let call = async {
            let pre = self.compiled.pre.instance_pre();
            let instance = pre.instantiate_async(&mut store).await.map_err(failed)?;
            let handler = bindings::Handler::new(&mut store, &instance).map_err(failed)?;
            let subscription = handler
                .call_subscription(&mut store)
                .await
                .map_err(failed)?;
            // A component built before ordered keys has no such export: unordered.
            use super::ordering_bindings::exports::sluice::handler::ordering;
            let ordered = match ordering::GuestIndices::new(pre) {
                Ok(indices) => {
                    let guest = indices.load(&mut store, &instance).map_err(failed)?;
                    guest.call_ordering(&mut store).await.map_err(failed)?
                }
                Err(_) => None,
            };
            // Nor one built before the journal: live calls.
            use super::effects_bindings::exports::sluice::handler::effects;
            let effects = match effects::GuestIndices::new(pre) {
                Ok(indices) => {
                    let guest = indices.load(&mut store, &instance).map_err(failed)?;
                    Some(guest.call_effects(&mut store).await.map_err(failed)?)
                }
                Err(_) => None,
            };
            // Nor one built before dedupe: none.
            use super::dedupe_bindings::exports::sluice::handler::dedupe;
            let deduped = match dedupe::GuestIndices::new(pre) {
                Ok(indices) => {
                    let guest = indices.load(&mut store, &instance).map_err(failed)?;
                    guest.call_dedupe(&mut store).await.map_err(failed)?
                }
                Err(_) => None,
            };
            Ok::<_, RuntimeError>((subscription, ordered, (effects, deduped)))
        };
        let (subscription, ordered, (effects, deduped)) =
            tokio::time::timeout(DESCRIPTOR_TIMEOUT + super::EPOCH_TICK, call)
                .await
                .map_err(|_| RuntimeError::DescriptorTimeout {
                    path: self.path.clone(),
                    after: DESCRIPTOR_TIMEOUT,
                })??;
        let mut stream = from_wit(subscription);
        stream.ordered_by = ordered.map(ordered_from_wit);
        stream.dedupe = deduped.map(dedupe_from_wit);
        stream.effects = effects.map(|mode| {
            use super::effects_bindings::exports::sluice::handler::effects::Mode;
            match mode {
                Mode::Live => sluice_descriptor::Effects::Live,
                Mode::Journal => sluice_descriptor::Effects::Journal,
            }
        });
        Ok(stream)
    }
}

/// A component's dedupe, as the descriptor says it.
fn dedupe_from_wit(
    d: super::dedupe_bindings::exports::sluice::handler::dedupe::DedupeBy,
) -> sluice_descriptor::Dedupe {
    use super::dedupe_bindings::exports::sluice::handler::dedupe as wit;
    sluice_descriptor::Dedupe {
        key: match d.key {
            wit::DedupeKey::Field(name) => sluice_descriptor::OrderKey::Field(name),
            wit::DedupeKey::Payload(pointer) => sluice_descriptor::OrderKey::Payload(pointer),
        },
        window: std::time::Duration::from_secs(d.window_s),
        max_key_bytes: usize::try_from(d.max_key_bytes).unwrap_or(usize::MAX),
        max_keys: d.max_keys,
    }
}

/// A component's ordering, as the descriptor says it.
fn ordered_from_wit(
    o: super::ordering_bindings::exports::sluice::handler::ordering::OrderedBy,
) -> sluice_descriptor::OrderedBy {
    use super::ordering_bindings::exports::sluice::handler::ordering as wit;
    sluice_descriptor::OrderedBy {
        key: match o.key {
            wit::OrderKey::Field(name) => sluice_descriptor::OrderKey::Field(name),
            wit::OrderKey::Payload(pointer) => sluice_descriptor::OrderKey::Payload(pointer),
        },
        max_in_flight_per_key: o.max_in_flight_per_key,
        on_dead_letter: match o.on_dead_letter {
            wit::OnDeadLetter::Release => sluice_descriptor::OnDeadLetter::Release,
            wit::OnDeadLetter::Hold => sluice_descriptor::OnDeadLetter::Hold,
        },
        max_key_bytes: o.max_key_bytes as usize,
    }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn from_wit(s: wit::Subscription) -> RedisStream {
    RedisStream {
        stream: s.stream,
        group: s.group,
        consumer: s.consumer,
        claim_min_idle: s.claim_min_idle_ms.map(ms),
        block: s.block_ms.map(ms),
        count: s.count.map(|c| c as usize),
        dead_letter: s.dead_letter,
        max_retries: s.max_retries,
        delayed_retry: s.delayed_retry.map(|d| match d {
            wit::DelayedRetry::DurableZset(z) => DelayedRetry::DurableZset {
                key: z.key,
                ttl: z.ttl_ms.map(ms),
            },
        }),
        payload_field: s.payload_field,
        max_delay: s.max_delay_ms.map(ms),
        failure_backoff: s.failure_backoff.map(|b| Backoff {
            initial: ms(b.initial_ms),
            max: ms(b.max_ms),
        }),
        partitions: s.partitions,
        ordered_by: None,
        effects: None,
        dedupe: None,
    }
}
