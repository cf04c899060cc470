//! A canary in Redis: its sealed record, its verdict, and the scripts that start, judge and
//! abort it for every host of the group at once.
//!
//! - **Record**: the flow hash's `canary` field (`crate::pipeline::admit::CANARY`), so every host learns
//!   of it the way it learns of a pause. Its body (id, candidate and incumbent digests, share,
//!   start and end by the server's clock, thresholds, who) is sealed with the hosts' rollout
//!   key ([`super::key`]), which Redis never holds: a writer to Redis, whatever it reads there,
//!   cannot make the hosts run a component of its own. The candidate's bytes wait under
//!   [`crate::store::keys::component_key`]; a host checks them against the sealed digest.
//! - **Verdict**: sealed with the same key over the record's id, and written by a host
//!   (`lua/canary_verdict.lua`) only while no verdict for that record is there, or in place of
//!   one that does not verify; with it the candidate's bytes are deleted. A record's life is one
//!   way (running, then promoted or rolled back): a host that saw a verdict writes it back if it
//!   goes, and never joins that record again.
//! - **Judging** (`lua/canary_report.lua`): each host adds what its attempts came to, per
//!   version, every [`REPORT`], and the same call judges the group's totals: a rate (failure,
//!   dead letter, retry) whose lowest value the candidate's counts allow is above the highest
//!   the incumbent's allow plus the allowed increase (Wilson bounds, one-sided 99.95 % during
//!   the window, which is looked at hundreds of times, 99 % at its end) rolls the candidate
//!   back, at once during the window, as does a p99 handler time above the ratio; otherwise the
//!   window's end promotes it (or rolls it back if it had too few attempts to judge). The
//!   script only answers what it judged: the host seals it, and the first to write it
//!   (`canary-verdict`) decides for every host; every later report reads it.
//! - **Bounds**: the record and verdict are read through the flow module's bounded read; the
//!   judging script reads only its own 248 count fields, counts that are not numbers read as
//!   nothing (and are started again by the next report), counts above the attempts as the
//!   attempts; the component's bytes are read only up to `admin_max_upload`; what is shown
//!   of who and why is cut like a pause's.
//!
//! The files, in a canary's life:
//! - [`record`]: the [`Record`] and its seal (the sealed form the verdict shares);
//! - [`rule`]: the [`Thresholds`] a canary is judged by and the bounds' confidence;
//! - [`component`]: the candidate's bytes in Redis, stored at the start and fetched to join;
//! - [`start`](mod@start): starting a canary for every host ([`start()`], `lua/canary_start.lua`);
//! - [`state`]: the canary as Redis holds it ([`read`]): record, verdict, both versions'
//!   [`Totals`];
//! - [`verdict`]: the [`Verdict`] and how a canary ends ([`Outcome`]), its seal;
//! - [`decide`](mod@decide): a verdict written for every host ([`decide()`], `lua/canary_verdict.lua`), by
//!   the judging, an operator's abort or a host that cannot join;
//! - [`report`](mod@report): a host's counts added to the group's and judged ([`report()`],
//!   `lua/canary_report.lua`).

mod component;
mod decide;
mod record;
mod report;
mod rule;
mod start;
mod state;
mod verdict;

use std::time::Duration;

use redis::aio::ConnectionLike;

pub use component::fetch_component;
pub use decide::{abort, decide, refuse, write_verdict};
pub use record::Record;
pub use report::{Reported, report};
pub use rule::Thresholds;
pub use start::{Start, start};
pub use state::{CanaryState, Totals, contains, read};
pub use verdict::{Outcome, Verdict};

/// How often a host adds its counts to the group's and asks for the verdict.
pub const REPORT: Duration = Duration::from_millis(500);
/// How long after a canary's end without a verdict (every host judging it gone) another may
/// replace it, and a host ends its part on its own.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60);
/// How long after a canary starts its candidate begins taking entries (those added from then
/// on): the hosts see the record within a poll, and fetch and check the candidate meanwhile.
pub const JOIN_GRACE: Duration = Duration::from_secs(2);
/// How long a canary's counts and its candidate's bytes stay in Redis after its window.
pub const KEEP_AFTER: Duration = Duration::from_secs(7 * 86_400);
/// The longest "who" and "why" kept, in characters.
const MAX_TEXT: usize = 500;
/// Why a host without a rollout key neither starts nor joins a canary.
pub const NO_KEY: &str = "this host holds no rollout key (set rollout_key_file or rollout_key_env, or an admin token, the same on every host of the group): a canary makes hosts run code from Redis, which only a key Redis does not hold may allow";

/// Why a canary could not be started, judged or read.
#[derive(Debug, thiserror::Error)]
pub enum CanaryError {
    /// Redis refused or could not be reached.
    #[error("cannot reach the canary of stream `{stream}` group `{group}` in Redis")]
    Redis {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// What Redis said.
        #[source]
        source: redis::RedisError,
    },
    /// The stream's secret could not be read or made.
    #[error(transparent)]
    Secret(#[from] crate::store::keys::SecretError),
    /// Another canary runs.
    #[error(
        "a canary of {candidate} runs on stream `{stream}` group `{group}` until {ends}; wait for its verdict or abort it first"
    )]
    Running {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The running canary's candidate (short digest).
        candidate: String,
        /// When its window ends.
        ends: String,
    },
    /// No canary runs (to abort).
    #[error("no canary runs on stream `{stream}` group `{group}`")]
    NotRunning {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
    },
    /// The candidate's bytes are not in Redis, or not what the record names.
    #[error("the candidate {digest} cannot be fetched from Redis: {why}")]
    Fetch {
        /// Its digest.
        digest: String,
        /// Why.
        why: String,
    },
}

impl CanaryError {
    /// What Redis said (`source`) about the canary of `stream` and `group`: the error every
    /// step that reaches Redis maps its failure to.
    fn redis(stream: &str, group: &str) -> impl Fn(redis::RedisError) -> Self {
        move |source| Self::Redis {
            stream: stream.to_owned(),
            group: group.to_owned(),
            source,
        }
    }
}

/// The time by the server's clock, in ms since the Unix epoch (`TIME`, as the page reads it).
pub async fn server_ms<C: ConnectionLike>(conn: &mut C) -> redis::RedisResult<u64> {
    Ok(u64::try_from(crate::store::inspect::server_now_ms(conn).await?).unwrap_or(0))
}

/// A duration in whole milliseconds, `u64::MAX` past it (a window or a keep time as the
/// scripts take it).
fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An epoch-milliseconds time as RFC 3339 (UTC), for a record's or verdict's times.
fn rfc3339(ms: u64) -> String {
    crate::support::when::rfc3339_ms(i64::try_from(ms).unwrap_or(i64::MAX))
}
