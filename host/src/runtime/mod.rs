//! The WebAssembly side of a delivery: one wasmtime [`Engine`] for the process, components
//! compiled once and cached on disk by content (wasmtime's own cache, keyed on the engine's
//! settings and version), and handlers that run a component's `handle` export.
//!
//! - [`compile`] compiles a component in a child process, bounded in time and memory, so a
//!   hostile component cannot take the host down with the compiler.
//! - [`component`] loads a `.wasm` file, checks it implements the `sluice:handler/handler`
//!   world, reads its descriptor, and builds the `InstancePre` every instance starts from.
//! - [`instance`] is the [`crate::handler::Handler`] for a component: it keeps reusable
//!   instances (or makes a fresh one per delivery), enforces the time and memory limits, and
//!   turns traps into [`crate::entry::outcome::Failure`]s.
//! - [`guest`] is the per-store state and the host side of the WIT imports (logging into
//!   `tracing`, the subscription's config values, WASI with every capability denied).
//! - [`http`] is outbound HTTP: the subscription's `allowed_outbound_hosts` and timeouts in
//!   front of `wasi:http`'s outgoing handler; [`effects`] names each call of an attempt
//!   (its idempotency key), the same on every retry of the entry, and [`journal`] records
//!   and replays them with `effects = "journal"`.
//!
//! Time limits use epoch interruption: a ticker thread bumps the engine's epoch every
//! [`EPOCH_TICK`]; at each tick a running guest yields to the async executor (so a busy guest
//! never starves other tasks) and traps once its delivery's deadline has passed.

pub mod compile;
pub mod component;
pub mod effects;
pub mod guest;
pub mod http;
pub mod instance;
pub mod journal;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::Engine;
use wasmtime::component::Linker;

pub use component::LoadedComponent;
pub use instance::WasmHandler;

/// How often the epoch advances: the granularity of time limits and of guest yields.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Bindings generated from `wit/sluice.wit`.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        exports: { default: async },
        // The delivery is lowered into the guest from borrowed slices of the entry: no copy
        // of its fields on the host side first.
        ownership: Borrowing {
            duplicate_if_necessary: true
        },
    });
}

/// Bindings of the optional `ordering` export (`wit/sluice.wit`): looked for in a component,
/// never required of it.
#[allow(missing_docs, clippy::all)]
pub mod ordering_bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "ordering-only",
        exports: { default: async },
    });
}

/// Bindings of the optional `effects` export (`wit/sluice.wit`): looked for in a component,
/// never required of it.
#[allow(missing_docs, clippy::all)]
pub mod effects_bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "effects-only",
        exports: { default: async },
    });
}

/// Bindings of the optional `dedupe` export (`wit/sluice.wit`): looked for in a component,
/// never required of it.
#[allow(missing_docs, clippy::all)]
pub mod dedupe_bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "dedupe-only",
        exports: { default: async },
    });
}

/// What wasmtime said, with its whole chain of causes.
pub type WasmtimeCause = Box<dyn std::error::Error + Send + Sync + 'static>;

fn cause(err: wasmtime::Error) -> WasmtimeCause {
    err.into_boxed_dyn_error()
}

/// Why the runtime could not start or a component could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The instance pool's address space could not be reserved.
    #[error(
        "cannot reserve address space for the instance pool: {instances} instances (`max_instances`, or what the subscriptions' `max_in_flight` add up to), each with room for a linear memory of up to {} (the largest `memory_limit`) and its guard regions; lower `max_instances`, or raise the process's address-space limit (`ulimit -v`)",
        bytesize::ByteSize::b(*max_memory)
    )]
    PoolReserve {
        /// Slots the pool asked for.
        instances: u32,
        /// The room each slot reserves for a linear memory.
        max_memory: u64,
        /// What wasmtime said.
        source: WasmtimeCause,
    },
    /// The engine could not be configured.
    #[error("cannot set up the WebAssembly engine")]
    Engine(#[source] WasmtimeCause),
    /// The compiled-component cache directory cannot be created or resolved.
    #[error("cannot use the compiled-component cache directory {}", path.display())]
    CacheDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The component file could not be read.
    #[error("cannot read component {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid component.
    #[error("{} is not a valid WebAssembly component", path.display())]
    Compile {
        /// The file.
        path: std::path::PathBuf,
        /// What wasmtime said.
        source: WasmtimeCause,
    },
    /// The component starts with more memory (or larger tables) than the instance pool's slots
    /// hold: the slots are sized by the largest `memory_limit`.
    #[error(
        "{} needs more memory to start than `memory_limit` allows: raise `memory_limit` for its subscription (the cause says how much it needs)",
        path.display()
    )]
    TooBig {
        /// The file.
        path: std::path::PathBuf,
        /// What wasmtime said.
        source: WasmtimeCause,
    },
    /// The component does not implement the handler world.
    #[error(
        "{} does not implement the sluice:handler/handler world (build it with the sluice-guest SDK)",
        path.display()
    )]
    WrongWorld {
        /// The file.
        path: std::path::PathBuf,
        /// What is missing or mismatched.
        source: WasmtimeCause,
    },
    /// Calling the component's `subscription` export failed.
    #[error("{}: its subscription() export failed", path.display())]
    Descriptor {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        source: WasmtimeCause,
    },
    /// The compiled-component cache directory may be written by others (or its key read).
    #[error(
        "the compiled-component cache {} is open to other users (mode {mode:o}): compiled code there runs as this host; make it private (chmod 700 the directory, 600 its key) or choose another cache_dir",
        path.display()
    )]
    CacheDirOpen {
        /// The directory or key file.
        path: std::path::PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The component was refused before or while compiling (its shape, a compile limit).
    #[error("{} was not compiled: {why}", path.display())]
    CompileRefused {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        why: String,
    },
    /// Compiling was cut off by its deadline.
    #[error("{} was not compiled: {why}", path.display())]
    CompileInterrupted {
        /// The file.
        path: std::path::PathBuf,
        /// Which deadline.
        why: String,
    },
    /// The component's `subscription` export did not return in time (it waits in a host call
    /// or computes for ever).
    #[error("{}: its subscription() export did not return within {after:?}", path.display())]
    DescriptorTimeout {
        /// The file.
        path: std::path::PathBuf,
        /// The limit.
        after: std::time::Duration,
    },
}

/// How big to make the pooling instance allocator: enough slots for every instance that can
/// exist at once, each with room for the largest memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSizing {
    /// Component instances alive at once (in flight plus idle, across subscriptions).
    pub instances: u32,
    /// The largest linear memory any instance may grow to, in bytes.
    pub max_memory: u64,
}

impl PoolSizing {
    /// Slots for what can run at once in the host: `max_instances`, or fewer when the
    /// subscriptions' shares add up to less. A share is `max_in_flight` instances (busy or
    /// idle), plus one to read each component's descriptor, twice: a canary's candidate runs
    /// beside the serving version, and each keeps its own instances. The pool does not grow
    /// with the number of subscriptions: they wait for a slot in turn, and idle instances give
    /// theirs up (see [`instance`]).
    pub fn for_config(config: &crate::config::Config) -> Self {
        let shares: usize = config
            .subscriptions
            .iter()
            .map(|s| 2 * (s.limits.max_in_flight + 1))
            .sum();
        let instances = u32::try_from(shares.max(1))
            .unwrap_or(u32::MAX)
            .min(config.max_instances.max(1));
        let max_memory = config
            .subscriptions
            .iter()
            .map(|s| s.limits.memory_limit)
            .max()
            .unwrap_or(crate::config::DEFAULT_MEMORY_LIMIT);
        Self {
            instances,
            max_memory,
        }
    }
}

/// Engine-wide settings, which every subscription of a process shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Use the pooling instance allocator, sized like this.
    pub pool: Option<PoolSizing>,
    /// Meter fuel (only when some subscription sets `fuel`: metering costs every call).
    pub fuel: bool,
    /// Turn epoch interruption off. Only for measuring what it costs: without it a handler's
    /// time limit is not enforced.
    pub no_epoch: bool,
    /// The most the compiled-component cache holds, in bytes (`None`:
    /// [`compile::DEFAULT_CACHE_MAX_SIZE`]).
    pub cache_max_size: Option<u64>,
    /// Compile without Cranelift's optimisations (`sluice dev`): an interpreter component
    /// compiles about a quarter faster and runs slower, which a dev loop does not feel.
    pub quick_compile: bool,
}

impl RuntimeOptions {
    /// What the subscriptions of `config` need.
    pub fn for_config(config: &crate::config::Config) -> Self {
        Self {
            pool: Some(PoolSizing::for_config(config)),
            fuel: config.subscriptions.iter().any(|s| s.limits.fuel.is_some()),
            no_epoch: false,
            cache_max_size: Some(config.cache_max_size),
            quick_compile: false,
        }
    }
}

/// The process-wide WebAssembly runtime: engine, linker and epoch ticker.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    fuel: bool,
    linker: Arc<Linker<guest::GuestState>>,
    http_linker: Arc<Linker<guest::GuestState>>,
    /// One permit per instance the pooling allocator has room for: an instance takes one
    /// before it is created and holds it while it lives, so creating one waits for room instead
    /// of failing with the pool's concurrency limit; idle instances give theirs up.
    slots: Option<Arc<instance::Slots>>,
    /// Compiled components kept on disk, each vouched for by this host's keyed hash.
    artifacts: Option<compile::ArtifactCache>,
    compiler: compile::Compiler,
    /// Components loaded now, by digest: a component run by many subscriptions (or loaded
    /// again by a swap to the same bytes) is loaded once. Weak: a version nobody runs any
    /// more goes.
    loaded: Arc<
        std::sync::Mutex<
            std::collections::HashMap<
                crate::support::digest::Digest,
                std::sync::Weak<component::Compiled>,
            >,
        >,
    >,
    protected: http::Protected,
    _ticker: Arc<Ticker>,
}

impl Runtime {
    /// Set up the engine, with compiled components cached under `cache_dir` (`None` disables
    /// the cache), fuel metering if asked, and, given a sizing, the pooling instance allocator (a fresh instance then
    /// costs a fraction of an on-demand one: memory and tables are reused, not mapped anew).
    pub fn new(cache_dir: Option<&Path>, options: RuntimeOptions) -> Result<Self, RuntimeError> {
        let mut config = engine_config(&options);
        if let Some(pool) = options.pool {
            let mut pooling = wasmtime::PoolingAllocationConfig::new();
            pooling
                .total_component_instances(pool.instances)
                // An interpreter component instantiates many core modules: componentize-py's
                // ~14 (CPython and its libraries), componentize-js's 4, a Rust one 3. The
                // limit is only a counter, so it is generous.
                .total_core_instances(pool.instances.saturating_mul(32))
                .total_memories(pool.instances.saturating_mul(2))
                .total_tables(pool.instances.saturating_mul(4))
                .max_memory_size(usize::try_from(pool.max_memory).unwrap_or(usize::MAX))
                // Keep the first pages of a reused slot resident: the next instance mostly
                // touches the same few pages, and zeroing them beats faulting them in again.
                .linear_memory_keep_resident(1 << 20)
                .table_keep_resident(1 << 16)
                .pagemap_scan(wasmtime::Enabled::Auto);
            config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pooling));
        }
        let engine = Engine::new(&config).map_err(|e| match options.pool {
            Some(pool) if is_reservation_failure(&e) => RuntimeError::PoolReserve {
                instances: pool.instances,
                max_memory: pool.max_memory,
                source: cause(e),
            },
            _ => RuntimeError::Engine(cause(e)),
        })?;
        let artifacts = match cache_dir {
            Some(dir) => Some(
                compile::ArtifactCache::open(dir, engine_tag(&engine))?.with_max_size(
                    options
                        .cache_max_size
                        .unwrap_or(compile::DEFAULT_CACHE_MAX_SIZE),
                ),
            ),
            None => None,
        };
        let (plain, http_linker) =
            guest::linkers(&engine).map_err(|e| RuntimeError::Engine(cause(e)))?;
        let slots = options
            .pool
            .map(|p| Arc::new(instance::Slots::new(p.instances as usize)));
        let ticker = Ticker::start(engine.clone(), slots.clone());
        let mut compiler = compile::Compiler::new(compile::child_args(&options));
        if options.quick_compile
            && let Some(cache) = &artifacts
        {
            compiler = compiler.with_functions(cache);
        }
        Ok(Self {
            fuel: options.fuel,
            engine,
            linker: Arc::new(plain),
            http_linker: Arc::new(http_linker),
            slots,
            artifacts,
            compiler,
            loaded: Arc::default(),
            protected: http::Protected::default(),
            _ticker: Arc::new(ticker),
        })
    }

    /// Where compiled components are kept between starts, if anywhere.
    pub(crate) fn artifacts(&self) -> Option<&compile::ArtifactCache> {
        self.artifacts.as_ref()
    }

    /// Compiles components in child processes, one at a time.
    pub(crate) fn compiler(&self) -> &compile::Compiler {
        &self.compiler
    }

    /// Wait for room for one more instance (with the pooling allocator), taking an idle
    /// instance's slot if none is free; the permit is the instance's until it is dropped.
    pub(crate) async fn instance_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.slots {
            Some(slots) => slots.acquire().await,
            None => None,
        }
    }

    /// The pool's slots, if there is a pool: where handlers register their idle instances.
    pub(crate) fn slots(&self) -> Option<&Arc<instance::Slots>> {
        self.slots.as_ref()
    }

    /// The component with `digest`, if one is loaded now.
    pub(crate) fn loaded(
        &self,
        digest: &crate::support::digest::Digest,
    ) -> Option<Arc<component::Compiled>> {
        let loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loaded.get(digest).and_then(std::sync::Weak::upgrade)
    }

    /// Keep `compiled` findable by `digest` while anything runs it.
    pub(crate) fn keep_loaded(
        &self,
        digest: &crate::support::digest::Digest,
        compiled: component::Compiled,
    ) -> Arc<component::Compiled> {
        let compiled = Arc::new(compiled);
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loaded.retain(|_, weak| weak.strong_count() > 0);
        loaded.insert(digest.clone(), Arc::downgrade(&compiled));
        compiled
    }

    /// The host's own listeners, which no guest's outbound HTTP may reach.
    pub fn protected(&self) -> &http::Protected {
        &self.protected
    }

    /// The linker for a component: with `wasi:http` only if it imports it.
    fn linker(&self, imports_wasi_http: bool) -> &Linker<guest::GuestState> {
        if imports_wasi_http {
            &self.http_linker
        } else {
            &self.linker
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Whether stores meter fuel. Known here rather than asked of each store: asking a store
    /// without fuel builds an error, and wasmtime errors capture a backtrace.
    pub fn fuel_enabled(&self) -> bool {
        self.fuel
    }

    /// Load, compile (or fetch from the cache) and check a component.
    pub async fn load(&self, path: &Path) -> Result<LoadedComponent, RuntimeError> {
        component::load(self, path).await
    }

    /// Compile and check a component given as bytes (an upload); `origin` names it in errors.
    /// The compile runs in a child process (see [`compile`]).
    pub async fn load_bytes(
        &self,
        origin: &Path,
        bytes: &[u8],
    ) -> Result<LoadedComponent, RuntimeError> {
        component::load_bytes(self, origin, bytes).await
    }
}

/// Whether the engine failed because the pool's address space could not be reserved (wasmtime
/// says "mmap failed to reserve" or "failed to create memory pool mapping").
fn is_reservation_failure(err: &wasmtime::Error) -> bool {
    err.chain().any(|cause| {
        let text = cause.to_string();
        text.contains("failed to reserve") || text.contains("memory pool mapping")
    })
}

/// The engine settings compiled code depends on, shared by the host and its compiling child
/// (which adds no instance allocator and no cache).
pub(crate) fn engine_config(options: &RuntimeOptions) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.consume_fuel(options.fuel);
    config.epoch_interruption(!options.no_epoch);
    // Sluice's world is synchronous WASI 0.2; the component-model concurrency machinery
    // only costs time on every call.
    config.concurrency_support(false);
    config.max_wasm_stack(1024 * 1024);
    if options.quick_compile {
        config.cranelift_opt_level(wasmtime::OptLevel::None);
    }
    config
}

/// Names `engine`'s compile settings and this build, so a cached artifact is only tried by
/// an engine that can run it.
fn engine_tag(engine: &Engine) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    env!("CARGO_PKG_VERSION").hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped, and once a second drops
/// the pool's instances that have been idle for [`instance::IDLE_INSTANCE_TTL`].
struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Ticker {
    fn start(engine: Engine, slots: Option<Arc<instance::Slots>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-epoch".into())
            .spawn(move || {
                let mut ticks = 0u32;
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                    ticks = ticks.wrapping_add(1);
                    if ticks.is_multiple_of(100)
                        && let Some(slots) = &slots
                    {
                        slots.expire_idle(instance::IDLE_INSTANCE_TTL);
                    }
                }
            });
        if let Err(err) = spawned {
            tracing::error!(%err, "cannot start the epoch ticker: handler time limits are not enforced");
        }
        Self { stop }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
