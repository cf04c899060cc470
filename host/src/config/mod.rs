//! The operator's configuration: raw TOML in, a validated [`Config`] out.
//!
//! The map of this layer, in the order a file is read:
//! - `file` reads one TOML file: `raw` is its shape as serde parses it (unknown keys refused)
//!   and `check` turns one text value into a duration or a size, naming the key when it is
//!   wrong;
//! - `globals` are the keys for the whole host, merged across files, with `admin` for the
//!   admin server's address, token and rollout key;
//! - `subscription` is one `[[subscription]]` table, each part in a step of its own: `limits`
//!   (and the outbound-HTTP grant), `redis_access` (URL, user, password and TLS files),
//!   `overrides` (of the component's descriptor; `dedupe` reads its dedupe table),
//!   `retention` (what stays in Redis, and how long), `admission` (rate limit and circuit
//!   breaker), `canary` and [`schedule`] (cron schedules);
//! - [`allow`] is the outbound-HTTP allow-list grammar, `token` where secrets such as the admin
//!   token come from, and [`telemetry`] the `[telemetry]` table (and the `OTEL_*` variables);
//! - this module holds the validated types and merges the files and components of one
//!   invocation into a [`Config`].
//!
//! `sluice run` and `sluice check` take TOML files and/or `.wasm` components. A lone component
//! runs with the descriptor it exports; a TOML file names one or more subscriptions, each with
//! its component, and may override any descriptor field. Everything is parsed and checked here,
//! before any task starts: unknown keys, bad durations and sizes, and missing files are errors
//! that name the key or the file.
//!
//! Every key, what it does and its default are in one table, [`reference::KEYS`] ([`reference`]): a test
//! checks it against the keys the parser accepts, and the book's configuration reference is
//! written from it.

mod admin;
mod admission;
pub mod allow;
mod canary;
mod check;
mod dedupe;
mod file;
mod globals;
mod limits;
mod overrides;
mod raw;
mod redis_access;
pub mod reference;
mod retention;
pub mod schedule;
mod subscription;
pub mod telemetry;
mod token;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sluice_descriptor::Overrides;

use allow::OutboundHttp;
pub use token::{PrivateFileError, TokenError, TokenSource, read_private};

/// The most the compiled-component cache holds by default, in bytes (`cache_max_size`):
/// Python and JavaScript components compile to tens of megabytes each.
pub const DEFAULT_CACHE_MAX_SIZE: u64 = 2 << 30;

/// The largest component the admin API accepts when the config does not say.
pub const DEFAULT_ADMIN_MAX_UPLOAD: u64 = 64 * 1024 * 1024;
/// How often component files are checked for a new version when the config does not say.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// How long a shutdown waits for in-flight deliveries when the config does not say.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the admin server listens when the config does not say: loopback only.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9187";
/// Handler instances alive at once in one host when the config does not say
/// (`max_instances`): far more than two cores keep busy, and its address space (each slot
/// reserves room for a 4 GiB linear memory and its guards) is a few TiB of the 128 TiB a
/// process has.
pub const DEFAULT_MAX_INSTANCES: u32 = 256;
/// How idle subscriptions learn that their streams were written (`doorbell`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DoorbellMode {
    /// Keyspace events when the server publishes them; without them, polling when a host has
    /// more than [`POLL_ABOVE`] subscriptions of one partition on one Redis, and a blocking
    /// read per subscription otherwise (the fastest path, and few connections).
    #[default]
    Auto,
    /// Keyspace events when published, polling otherwise, whatever the number.
    Poll,
    /// No doorbell: every subscription keeps a blocking read on a connection of its own (the
    /// fastest path for a few busy streams, keyspace events or not).
    Off,
}

/// With `doorbell = "auto"` and no keyspace events, a host polls for the idle streams of a
/// Redis only above this many subscriptions of one partition on it (partitions wait in
/// shared reads instead).
pub const POLL_ABOVE: usize = 100;

/// Up to this many subscriptions, `/metrics` labels its series by subscription unless
/// `metrics_per_subscription` says otherwise; above, it sums them per host, so that a host of
/// thousands does not export a quarter of a million series (about 40 per subscription).
pub const PER_SUBSCRIPTION_METRICS_UP_TO: usize = 200;
/// The most `max_instances` may say: the pool's counters (core instances, memories, tables)
/// are multiples of it and must fit in 32 bits.
pub const MAX_INSTANCES_CEILING: u32 = 16_384;

/// Deliveries handled at once per subscription when the config does not say.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;

/// Of `max_in_flight` handler slots, how many a subscription with a retry lane keeps for due
/// retries unless `retry_lane_slots` says: an eighth (none below 8). Enough for a burst of
/// retries to start within a read or two behind a saturated stream; small enough that a
/// backlog of slow handlers keeps most slots.
pub fn default_lane_slots(max_in_flight: usize) -> usize {
    max_in_flight / 8
}

/// The shortest wait of a retry when the config does not say (and the least it may say).
pub const DEFAULT_MIN_DELAY: Duration = Duration::from_millis(1);

/// Deliveries a reused instance handles before it is replaced.
pub const DEFAULT_RECYCLE_AFTER: u64 = 10_000;
/// The wall-clock limit of one delivery.
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(10);
/// The linear-memory cap of one instance.
pub const DEFAULT_MEMORY_LIMIT: u64 = 64 * 1024 * 1024;
/// What the host may hold on one instance's behalf (resources, HTTP fields).
pub const DEFAULT_HOST_MEMORY_LIMIT: u64 = 8 * 1024 * 1024;
/// Guest log lines one delivery may write.
pub const DEFAULT_LOG_LINES: u32 = 100;
/// Guest log bytes one delivery may write.
pub const DEFAULT_LOG_BYTES: u64 = 64 * 1024;
/// The largest entry handed to a handler, in bytes (its fields' names and values, and 64 per
/// field): a larger one is dead-lettered unhandled, with a reason saying so.
pub const DEFAULT_MAX_ENTRY_BYTES: u64 = 8 * 1024 * 1024;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML did not parse or has unknown keys; toml's error names the key and line.
    #[error("{} is not a valid sluice config", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What toml said.
        source: toml::de::Error,
    },
    /// A value is malformed.
    #[error("{}: `{key}` = {value:?} is not valid: {reason}", path.display())]
    Value {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A component file does not exist.
    #[error(
        "{}: component {} does not exist (not built yet? `sluice build` in its project writes it; `sluice dev` builds and runs it)",
        origin.display(),
        component.display()
    )]
    MissingComponent {
        /// The file that names it.
        origin: PathBuf,
        /// The missing component.
        component: PathBuf,
    },
    /// The argument is neither a `.toml` nor a `.wasm` file.
    #[error("{}: expected a .toml config or a .wasm component", .0.display())]
    UnknownKind(PathBuf),
    /// A TOML file names no subscription.
    #[error("{}: no [[subscription]] is defined", .0.display())]
    NoSubscriptions(PathBuf),
    /// Two files set a global value differently.
    #[error("`{key}` is set differently in two config files ({first} and {second})")]
    Conflict {
        /// The key.
        key: &'static str,
        /// One value.
        first: String,
        /// The other.
        second: String,
    },
}

/// Whether a subscription reuses instances or gets a fresh one per delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// Reuse an instance across deliveries (its state is built once); discard it after a trap
    /// and replace it after `recycle_after` deliveries.
    #[default]
    Reuse,
    /// A fresh store and instance for every delivery: nothing survives between deliveries.
    PerDelivery,
}

/// Limits and instance policy of one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Deliveries handled at once.
    pub max_in_flight: usize,
    /// Instance reuse policy.
    pub isolation: Isolation,
    /// Deliveries before a reused instance is replaced.
    pub recycle_after: u64,
    /// Wall-clock limit of one delivery.
    pub handler_timeout: Duration,
    /// Linear-memory cap per instance, in bytes.
    pub memory_limit: u64,
    /// What the host may hold on an instance's behalf (resource handles, HTTP fields), bytes.
    pub host_memory_limit: u64,
    /// Guest log lines one delivery may write.
    pub log_lines: u32,
    /// Guest log bytes one delivery may write.
    pub log_bytes: u64,
    /// The largest entry handed to the handler, in bytes.
    pub max_entry_bytes: u64,
    /// Fuel (roughly, wasm instructions) one delivery may burn; `None` leaves it unmetered.
    pub fuel: Option<u64>,
    /// Where the guest may send HTTP requests, and how long each may take. A grant, not a
    /// limit, but like the limits it is the operator's to set, never the component's.
    pub outbound_http: OutboundHttp,
    /// `poison_check`: an attempt that traps or raises runs once more at once, offline, and
    /// the same failure dead-letters the entry now instead of retrying it.
    pub poison_check: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            isolation: Isolation::Reuse,
            recycle_after: DEFAULT_RECYCLE_AFTER,
            handler_timeout: DEFAULT_HANDLER_TIMEOUT,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            host_memory_limit: DEFAULT_HOST_MEMORY_LIMIT,
            log_lines: DEFAULT_LOG_LINES,
            log_bytes: DEFAULT_LOG_BYTES,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            fuel: None,
            outbound_http: OutboundHttp::default(),
            poison_check: false,
        }
    }
}

/// How to reach Redis beyond its URL: who to log in as and the TLS material, each secret in a
/// file of its own, so none sits in the config file or in a URL that could be logged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisAccess {
    /// `redis_username`: the ACL user (the URL's, if it names one, otherwise `default`).
    pub username: Option<String>,
    /// `redis_password_file`: a file holding the password; it must not be readable by every
    /// user of the machine.
    pub password_file: Option<PathBuf>,
    /// `redis_ca_file`: PEM certificates to trust instead of the system's roots (`rediss://`).
    pub ca_file: Option<PathBuf>,
    /// `redis_cert_file` and `redis_key_file`: this host's certificate and key (PEM) for
    /// servers that require client certificates (mTLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl RedisAccess {
    /// Whether any TLS material is configured (which needs a `rediss://` URL).
    pub fn has_tls_files(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some()
    }
}

/// A subscription's shared rate limit: a token bucket in Redis that every host of the group
/// draws from (see [`crate::pipeline::admit::rate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Tokens added a second: the most deliveries a second, sustained.
    pub per_second: f64,
    /// The bucket's size: the most deliveries started at once after an idle while.
    pub burst: u64,
}

/// The highest rate (and burst) a rate limit may name.
pub const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;

// The rate is checked finite (never NaN) when the configuration is read.
impl Eq for RateLimit {}

/// A subscription's circuit breaker: when at least `failure_rate` of the deliveries of the last
/// `window` failed (traps, limits, retries the handler marked "downstream down"), and there were
/// at least `min_deliveries`, every host of the group stops reading for `open_for`; then
/// `probes` deliveries try, and the first answer closes it or opens it again (see
/// [`crate::pipeline::admit::breaker`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CircuitBreaker {
    /// The share of failed deliveries that opens it.
    pub failure_rate: f64,
    /// How far back deliveries count.
    pub window: Duration,
    /// The fewest deliveries in the window before the rate counts.
    pub min_deliveries: u64,
    /// How long it stays open before probing.
    pub open_for: Duration,
    /// Deliveries let through to probe, across the group.
    pub probes: u32,
}

// The rate is checked finite (never NaN) when the configuration is read.
impl Eq for CircuitBreaker {}

/// How a canary of a subscription is judged (see `crate::control::rollout`): the candidate is rolled
/// back as soon as one of its rates is shown (confidence bounds on both versions' counts) to
/// be more than the incumbent's plus the allowed increase, or its handler time p99 is more than `p99_ratio` times the
/// incumbent's (and `p99_slack` more); it is promoted when `window` passes within every
/// threshold with at least `min_deliveries` attempts on it, and rolled back if it had fewer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Canary {
    /// How long a canary runs unless `--for` says.
    pub window: Duration,
    /// Traps and limits: the most the candidate's share may exceed the incumbent's.
    pub failure_rate_increase: f64,
    /// Dead letters: the same.
    pub dead_letter_rate_increase: f64,
    /// Retries: the same.
    pub retry_rate_increase: f64,
    /// Handler time p99: the most the candidate's may be, as a multiple of the incumbent's.
    pub p99_ratio: f64,
    /// Handler time p99: a difference below this never counts (timer noise on fast handlers).
    pub p99_slack: Duration,
    /// The fewest attempts on each version before the p99 counts and before a promotion.
    pub min_deliveries: u64,
}

// The numbers are checked finite (never NaN) when the configuration is read.
impl Eq for Canary {}

impl Default for Canary {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(300),
            failure_rate_increase: 0.01,
            dead_letter_rate_increase: 0.01,
            retry_rate_increase: 0.05,
            p99_ratio: 2.0,
            p99_slack: Duration::from_millis(10),
            min_deliveries: 100,
        }
    }
}

/// Probe deliveries of a half-open breaker, unless configured.
pub const DEFAULT_PROBES: u32 = 3;

/// One subscription as configured (before its component's descriptor is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionConfig {
    /// The component file.
    pub component: PathBuf,
    /// The Redis URL, if configured.
    pub redis: Option<String>,
    /// Credentials and TLS files for that Redis.
    pub redis_access: RedisAccess,
    /// Descriptor overrides.
    pub overrides: Overrides,
    /// Limits and instance policy.
    pub limits: Limits,
    /// Values the guest can read.
    pub values: BTreeMap<String, String>,
    /// `consumer_gone_after`: `None` for the default, `Some(None)` for "off".
    pub consumer_gone_after: Option<Option<Duration>>,
    /// `dead_letter_maxlen`: trim the dead-letter stream to about this many entries.
    pub dead_letter_maxlen: Option<u64>,
    /// `history_entries`: how many entries' histories to keep (0: none); `None` for the default.
    pub history_entries: Option<u32>,
    /// `retry_lane`: `None` or `Some(true)` send due retries to the group's own lane, read
    /// before new entries; `Some(false)` to the stream's tail, where every group reads them.
    pub retry_lane: Option<bool>,
    /// `retry_lane_slots`: handler slots kept for due retries (the default is set by the plan,
    /// which knows whether there is a lane).
    pub retry_lane_slots: Option<usize>,
    /// `other_groups_see_retries`: with `retry_lane = false`, run even though other groups read
    /// the stream (and see every retry as a new entry).
    pub other_groups_see_retries: bool,
    /// `rate_limit`: the most deliveries a second the whole group may start, shared by its
    /// hosts through Redis.
    pub rate_limit: Option<RateLimit>,
    /// `circuit_breaker`: stop reading while most deliveries fail (shared through Redis).
    pub circuit_breaker: Option<CircuitBreaker>,
    /// `canary`: how a canary of this subscription is judged.
    pub canary: Canary,
    /// `min_delay`: the shortest wait of any retry.
    pub min_delay: Duration,
    /// `retention`: trim what every group has acknowledged (off when `None`).
    pub retention: Option<Retention>,
    /// `dead_letter_retention.keep`: trim dead letters older than this (kept for ever when
    /// `None`).
    pub dead_letter_keep: Option<Duration>,
    /// `[[subscription.schedule]]`: entries it gives itself on a cron schedule.
    pub schedules: Vec<schedule::Schedule>,
    /// Where this subscription was defined, for error messages.
    pub origin: PathBuf,
}

impl SubscriptionConfig {
    /// A `.wasm` argument alone: its descriptor as it exports it, every limit at its default.
    fn component_alone(path: &Path) -> Self {
        Self {
            component: path.to_owned(),
            redis: None,
            redis_access: RedisAccess::default(),
            overrides: Overrides::default(),
            limits: Limits::default(),
            values: BTreeMap::new(),
            consumer_gone_after: None,
            dead_letter_maxlen: None,
            history_entries: None,
            retry_lane: None,
            retry_lane_slots: None,
            rate_limit: None,
            circuit_breaker: None,
            canary: Canary::default(),
            other_groups_see_retries: false,
            min_delay: DEFAULT_MIN_DELAY,
            retention: None,
            dead_letter_keep: None,
            schedules: Vec::new(),
            origin: path.to_owned(),
        }
    }
}

/// How long acknowledged history is kept when `retention` does not say.
pub const DEFAULT_KEEP_ACKED: Duration = Duration::from_secs(3600);
/// How often retention runs when `retention` does not say.
pub const DEFAULT_RETENTION_EVERY: Duration = Duration::from_secs(10);

/// A stream's retention policy: what every consumer group has acknowledged goes once it is
/// older than `keep_acked`; never anything a group has pending or has not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Acknowledged entries younger than this stay.
    pub keep_acked: Duration,
    /// While the stream is longer, acknowledged entries go however young (never what a group
    /// needs: then the run reports it and keeps them).
    pub max_len: Option<u64>,
    /// How often one host runs it.
    pub every: Duration,
}

/// The validated configuration of one `sluice` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Every subscription, in the order given.
    pub subscriptions: Vec<SubscriptionConfig>,
    /// Where compiled components are cached.
    pub cache_dir: PathBuf,
    /// The most the compiled-component cache holds, in bytes; the least recently used go
    /// first.
    pub cache_max_size: u64,
    /// The most handler instances alive at once in this host, across subscriptions.
    pub max_instances: u32,
    /// Whether `/metrics` labels series by subscription: the number of series then grows with
    /// the subscriptions; off, every family is summed over the host.
    pub metrics_per_subscription: bool,
    /// How idle subscriptions learn that their streams were written.
    pub doorbell: DoorbellMode,
    /// How long a shutdown waits for in-flight deliveries.
    pub shutdown_timeout: Duration,
    /// Where the admin HTTP server listens; `None` turns it off.
    pub admin: Option<std::net::SocketAddr>,
    /// Where the admin API's bearer token comes from.
    pub admin_token: Option<TokenSource>,
    /// Where the read-only token comes from: it may look (the API's listings, the page, the
    /// scaling signal) and is refused every action, for dashboards, KEDA and on-call readers.
    pub admin_read_token: Option<TokenSource>,
    /// Where the key that seals canaries comes from; the admin token's when `None`.
    pub rollout_key: Option<TokenSource>,
    /// The largest upload the admin API accepts, in bytes.
    pub admin_max_upload: u64,
    /// Mutating admin calls need no token (loopback only).
    pub admin_open_on_loopback: bool,
    /// The admin API and page only show: every action is refused and hidden.
    pub admin_read_only: bool,
    /// How often component files are checked for a new version; `None` turns watching off.
    pub watch_interval: Option<Duration>,
    /// Where traces go (`[telemetry]`); `None`: only where `OTEL_*` variables say, if anywhere.
    pub telemetry: Option<telemetry::Telemetry>,
}

impl Config {
    /// Load and merge every argument of `sluice run`/`sluice check`: TOML files and `.wasm`
    /// components.
    pub fn load(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        let mut globals = globals::Globals::default();
        let mut subscriptions = Vec::new();
        for path in paths {
            match path.extension().and_then(|e| e.to_str()) {
                Some("wasm") => {
                    if !path.is_file() {
                        return Err(ConfigError::MissingComponent {
                            origin: path.clone(),
                            component: path.clone(),
                        });
                    }
                    subscriptions.push(SubscriptionConfig::component_alone(path));
                }
                Some("toml") => {
                    let text =
                        std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                            path: path.clone(),
                            source,
                        })?;
                    let file = file::parse_file(path, &text)?;
                    globals.merge(file.globals)?;
                    subscriptions.extend(file.subscriptions);
                }
                _ => return Err(ConfigError::UnknownKind(path.clone())),
            }
        }
        let config = Config {
            cache_dir: globals
                .cache_dir
                .unwrap_or_else(|| PathBuf::from(".sluice/cache")),
            cache_max_size: globals.cache_max_size.unwrap_or(DEFAULT_CACHE_MAX_SIZE),
            max_instances: globals.max_instances.unwrap_or(DEFAULT_MAX_INSTANCES),
            metrics_per_subscription: globals
                .metrics_per_subscription
                .unwrap_or(subscriptions.len() <= PER_SUBSCRIPTION_METRICS_UP_TO),
            doorbell: globals.doorbell.unwrap_or_default(),
            shutdown_timeout: globals.shutdown_timeout.unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT),
            admin: globals.admin.unwrap_or(DEFAULT_ADMIN.parse().ok()),
            admin_token: globals.admin_token,
            admin_read_token: globals.admin_read_token,
            rollout_key: globals.rollout_key,
            admin_max_upload: globals.admin_max_upload.unwrap_or(DEFAULT_ADMIN_MAX_UPLOAD),
            admin_open_on_loopback: globals.admin_open_on_loopback.unwrap_or(false),
            admin_read_only: globals.admin_read_only.unwrap_or(false),
            watch_interval: globals
                .watch_interval
                .unwrap_or(Some(DEFAULT_WATCH_INTERVAL)),
            telemetry: globals.telemetry,
            subscriptions,
        };
        config.check_admin(paths.first().cloned().unwrap_or_default())?;
        Ok(config)
    }
}

/// The most failed attempts a component's own descriptor may ask for before an entry is
/// dead-lettered: a component is a tenant's code, and `max_retries(u32::MAX)` with
/// `retry_after(0)` would keep one entry cycling for ever. The operator's `max_retries` in the
/// config is not capped.
pub const MAX_COMPONENT_RETRIES: u32 = 100;

/// The most partitions a component's own descriptor may ask for: each partition is a read
/// loop, a connection and a set of metric series, and one component asking for 1,024 once
/// opened 1,030 connections and made `/metrics` 9 MB. The operator's `partitions` in the
/// config may go up to [`sluice_descriptor::MAX_PARTITIONS`]. Refused, not capped: producers
/// write to as many partitions as the count says, and a smaller count would never read some.
pub const MAX_COMPONENT_PARTITIONS: u32 = 64;

/// `Err(asked)` when a component's own descriptor asks for more partitions than
/// [`MAX_COMPONENT_PARTITIONS`] and the operator did not set the count.
pub fn check_component_partitions(
    overrides: &sluice_descriptor::Overrides,
    partitions: u32,
) -> Result<(), u32> {
    if overrides.partitions.is_none() && partitions > MAX_COMPONENT_PARTITIONS {
        return Err(partitions);
    }
    Ok(())
}
