//! Connections to Redis (one node, a master behind Sentinel, or a cluster): a managed,
//! self-reconnecting connection for acks and scripts, and a dedicated connection per
//! subscription for its blocking reads (a blocked XREADGROUP would otherwise hold up every
//! other command on a shared connection).
//!
//! Finding the way:
//! - [`target`]: what the configured value names (a node, Sentinel, cluster seeds).
//! - [`node`]: one node reached with the configured login and TLS files, the
//!   self-reconnecting connection for short commands, and why connecting failed.
//! - [`route`]: which way commands go, found at connect (Sentinel asked, a node that turns
//!   out to be a cluster's).
//! - [`cluster`]: the cluster's seeds, and the master that serves a stream's slot.
//!
//! The handle and its reads:
//! - [`handle`]: the [`RedisHandle`] every part of the host sends commands through.
//! - [`failover`]: following the master when it moves, replacing a connection that hangs.
//! - [`reader`]: a subscription's read connection, of its own or from the [`pool`].
//! - [`lean`]: the read connection that parses replies straight into entries, over a
//!   [`transport`] of its own.
//!
//! What every caller shares:
//! - [`error_class`]: what kind of failure a Redis error is.
//! - [`backoff`]: the capped pause before reaching Redis again.
//! - [`redaction`]: a URL without its password, for logs and errors.

use std::time::Duration;

mod backoff;
mod cluster;
mod error_class;
mod failover;
mod handle;
pub mod lean;
mod node;
pub mod pool;
mod reader;
mod redaction;
mod route;
mod target;
pub mod transport;

pub use backoff::{RECONNECT_BACKOFF, ReconnectBackoff};
pub use error_class::ErrorClass;
pub use handle::RedisHandle;
pub use node::{ConnError, client, manager};
pub use reader::Reader;
pub use redaction::redact;
pub use target::{SentinelUrl, Target};

/// How long a non-blocking command may take before it counts as failed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
