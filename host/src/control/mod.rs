//! Changing a running pipeline from outside it: which handler serves, what waits, what is kept.
//!
//! - [`swap`] checks a new component and publishes it into the subscription's handler slot
//!   (admin API, file watcher, `sluice swap`).
//! - [`rollout`] tries a candidate on a share of the deliveries (a canary every host of the
//!   group runs and judges through Redis) and replays dead letters against a candidate.
//! - [`operate`] acts on what waits: lists dead letters and parked retries, and requeues,
//!   retries now, deletes or dead-letters them (CLI, admin API and web page).
//! - [`audit`] records who did what through the admin API, the page and the CLI.
//! - [`retention`] trims what every consumer group of a stream has acknowledged.
//! - [`schedules`] fires cron schedules' ticks, each once for the whole group.

pub mod audit;
pub mod operate;
pub mod retention;
pub mod rollout;
pub mod schedules;
pub(crate) mod swap;
