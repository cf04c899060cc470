//! Redis as the host sees it: connections, the name of every key, and reading state without
//! changing it. The layers above say *what* to write; this one says *where* and *how to reach it*.
//!
//! - [`redis_conn`] opens connections (one node, Sentinel, a cluster) and classifies Redis
//!   errors; [`devredis`] starts a private `redis-server` when none is configured.
//! - [`keys`] names every Redis key and bookkeeping field, seals the host's bookkeeping and
//!   records which subscription owns a key.
//! - [`inspect`] reads a subscription's state (group, consumers, delayed set, dead letters) for
//!   the admin API, `sluice status` and the benchmark.
//! - [`scaling`] reads the scaling signal: entries that need a host now and when the next
//!   parked one is due (`/v1/scaling`, `sluice scaler`), shared by every caller.
//! - [`options`] sends a Lua script's many options as one map of named fields.
//! - [`effects`] keeps the journal of an entry's outbound calls (`effects = "journal"`).
//! - [`doorbell`] tells idle subscriptions and delayed sets when their keys are written
//!   (keyspace events on one connection per Redis), so an idle subscription holds no
//!   connection and sends no command.
//!
//! Lua: every script lives beside the module that runs it (`<module>/lua/*.lua`); what several
//! share is a helper in `store/lua/lib/`, which a script names with `-- @include lib/NAME`.
//! The build script expands the includes, and [`lua!`] loads the expanded text. Every script
//! opens with the same header: what it does, `KEYS`, `ARGV`, `Reply:`, and `Crash:` (what a
//! crash of the host or of Redis at each step leaves); `tests/all/lua.rs` runs each one alone.

pub mod devredis;
pub mod doorbell;
pub mod effects;
pub mod inspect;
pub mod keys;
pub(crate) mod options;
pub mod redis_conn;
pub mod scaling;

/// The text of a Lua script under `host/src`, its `-- @include lib/NAME` lines expanded by the
/// build script: `lua!("pipeline/delayed/lua/sweep")` is `pipeline/delayed/lua/sweep.lua` with
/// the helpers it names in front of its own code.
macro_rules! lua {
    ($path:literal) => {
        include_str!(concat!(env!("OUT_DIR"), "/lua/", $path, ".lua"))
    };
}
pub(crate) use lua;
