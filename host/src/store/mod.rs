//! Redis as the host sees it: connections, the name of every key, and reading state without
//! changing it. The layers above say *what* to write; this one says *where* and *how to reach it*.
//!
//! - [`redis_conn`] opens connections (one node, Sentinel, a cluster) and classifies Redis
//!   errors; [`devredis`] starts a private `redis-server` when none is configured.
//! - [`keys`] names every Redis key and bookkeeping field, seals the host's bookkeeping and
//!   records which subscription owns a key.
//! - [`inspect`] reads a subscription's state (group, consumers, delayed set, dead letters) for
//!   the admin API, `sluice status` and the benchmark.
//! - [`doorbell`] tells idle subscriptions and delayed sets when their keys are written
//!   (keyspace events on one connection per Redis), so an idle subscription holds no
//!   connection and sends no command.

pub mod devredis;
pub mod doorbell;
pub mod inspect;
pub mod keys;
pub mod redis_conn;
