//! The bottom layer: small tools every other layer uses, none of them about Redis or handlers.
//!
//! - [`digest`] names a handler version (its component's SHA-256) in logs, metrics and the API.
//! - [`chain`] renders an error and its causes as one line (logs, `/readyz`, API answers).
//! - [`when`] writes times for people (RFC 3339), bounded whatever Redis holds; [`clock`] is the
//!   one read of this host's wall clock (a test moves it; Redis's clock decides due times).
//! - [`memory`] makes big buffers (a big entry's) go back to the kernel when freed, and
//!   [`private_file`] writes files only this user may read, whole or not at all.

pub mod chain;
pub mod clock;
pub mod digest;
pub mod memory;
pub(crate) mod private_file;
pub mod when;
