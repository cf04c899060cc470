//! Compiling a component the host cannot trust: a tenant wrote it, and compile time grows with
//! its shape (300 nested loops × 300 locals, 4.7 KB, took 33 s and 159 MB; 8 KB took 128 s).
//!
//! - A structural check first ([`check_shape`]): function size, locals, and how deep loops
//!   nest, read with wasmparser in one linear pass, so the known blow-ups are refused in
//!   milliseconds with a message naming the function.
//! - Then the compile runs in a child process (`sluice __compile`, [`child_main`]) under a
//!   CPU-time and an address-space limit, with a wall-clock deadline; the child is killed when
//!   the deadline passes or the caller gives up (a stop, a request deadline), and one compile
//!   runs at a time on every path (start-up, uploads, the file watcher).
//! - Compiled code is native code the host will run: a cached artifact is loaded only when its
//!   keyed hash (HMAC-SHA256 with a key private to this host, stored beside the cache) matches,
//!   the cache directory must not be writable by others (it is created 0700), and only
//!   components that passed every check are cached.
//!
//! Its modules:
//!
//! - [`shape`]: the structural check, in named steps (types, each function's size, locals and
//!   loop depth).
//! - [`compiler`]: the parent side ([`Compiler`]): one child at a time, its deadline, and why
//!   it died.
//! - [`child`]: the child side ([`child_main`], [`serve_compiles`], [`child_args`]): the limits
//!   it sets on itself, the component in and the artifact out.
//! - [`cache`]: compiled components on disk ([`ArtifactCache`]), keyed-hash checked, and
//!   eviction ([`evict`], [`evict_files`]).
//! - [`functions`]: compiled functions kept between compiles, for incremental compiles.

use std::time::Duration;

pub mod cache;
pub mod child;
pub mod compiler;
pub mod functions;
pub mod shape;

pub use cache::{ArtifactCache, DEFAULT_CACHE_MAX_SIZE, MAX_CACHED, evict, evict_files};
pub use child::{child_args, child_main, serve_compiles};
pub use compiler::Compiler;
pub use functions::FUNCTIONS_MAX_SIZE;
pub use shape::{
    MAX_FUNCTION_BYTES, MAX_LOCALS, MAX_LOOP_DEPTH, MAX_LOOP_LOCALS, Shape, ShapeError, check_shape,
};

/// CPU time one compile may use (every compiler thread counted).
pub const COMPILE_CPU: Duration = Duration::from_secs(120);
/// Wall-clock time one compile may take, waiting for its turn not included.
pub const COMPILE_WALL: Duration = Duration::from_secs(180);
/// Address space the compiling process may map.
pub const COMPILE_ADDRESS_SPACE: u64 = 8 << 30;
