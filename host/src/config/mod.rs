//! The operator's configuration: raw TOML in, a validated [`Config`] out.
//!
//! `sluice run` and `sluice check` take TOML files and/or `.wasm` components. A lone component
//! runs with the descriptor it exports; a TOML file names one or more subscriptions, each with
//! its component, and may override any descriptor field. Everything is parsed and checked here,
//! before any task starts: unknown keys, bad durations and sizes, and missing files are errors
//! that name the key or the file.
//!
//! | key (top level)        | meaning                                                       | default |
//! |------------------------|---------------------------------------------------------------|---------|
//! | `redis`                | Redis URL for every subscription of this file                 | a private dev `redis-server` |
//! | `consumer`             | consumer name for every subscription of this file             | `sluice-<hostname>` |
//! | `cache_dir`            | where compiled components are cached                          | `.sluice/cache` |
//! | `shutdown_timeout`     | how long a shutdown waits for in-flight deliveries            | `10s` |
//! | `admin`                | address of the admin HTTP server (metrics, health), or `"off"` | `127.0.0.1:9187` |
//! | `admin_token_file`, `admin_token_env` | where the admin API's bearer token is; required beyond loopback | none |
//! | `admin_max_upload`     | largest component the admin API accepts                       | `64MiB` |
//! | `admin_open_on_loopback` | let swaps and rollbacks through without a token (loopback binds only) | `false`: they need the token |
//! | `watch_interval`       | how often component files are checked for a new version, or `"off"` | `1s` |
//!
//! | key (`[[subscription]]`) | meaning                                                     | default |
//! |--------------------------|-------------------------------------------------------------|---------|
//! | `component`              | path of the `.wasm` component (relative to the TOML file)   | required |
//! | `redis`, `consumer`      | as above, for this subscription only                        | the file's |
//! | `stream`, `group`        | override the descriptor's stream and group                  | the descriptor's |
//! | `claim_min_idle`         | make it a claiming subscription (XAUTOCLAIM after this idle) | the descriptor's |
//! | `consumer_gone_after`    | on a non-claiming subscription, take over the pending entries of another consumer idle this long (a host that came back under another name, or never came back), or `"off"` | `max(60s, 2 × handler_timeout + block)` |
//! | `block`, `count`         | XREADGROUP BLOCK and COUNT                                  | `1s`, `64` |
//! | `dead_letter`            | dead-letter stream                                          | `<stream>.dead-letter` |
//! | `max_retries`            | failed attempts before dead-lettering                       | `8` |
//! | `payload_field`          | entry field holding the JSON payload                        | `payload` |
//! | `max_delay`              | longest delay the handler asks for (checked against ttl)    | unset |
//! | `failure_backoff`        | `{ initial = "500ms", max = "1m" }` after a trap            | as shown |
//! | `delayed_retry`          | `{ key = "...", ttl = "1h" }`, or `"none"` to drop the descriptor's | the descriptor's |
//! | `max_in_flight`          | deliveries handled at once                                  | `16` |
//! | `isolation`              | `"reuse"` instances, or a fresh one `"per-delivery"`        | `reuse` |
//! | `recycle_after`          | deliveries before a reused instance is replaced             | `10000` |
//! | `handler_timeout`        | wall-clock limit of one delivery                            | `10s` |
//! | `memory_limit`           | linear-memory cap per instance, e.g. `"64MiB"`              | `64MiB` |
//! | `host_memory_limit`      | what the host holds for an instance: resource handles (one per 32KiB) and HTTP header maps (32KiB each) | `8MiB` |
//! | `log_lines`, `log_bytes` | guest log budget per delivery (past it lines are dropped and counted) | `100`, `64KiB` |
//! | `fuel`                   | deterministic instruction budget per delivery               | unmetered |
//! | `allowed_outbound_hosts` | hosts the guest may send HTTP requests to, e.g. `["https://*.example.com", "http://127.0.0.1:8080"]` | none |
//! | `http_timeout`           | longest an HTTP request may wait to connect, for a response, or between body chunks | `handler_timeout` |
//! | `[subscription.config]`  | string values the guest can read                            | empty |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sluice_descriptor::{Backoff, DelayedRetry, Overrides};

pub mod allow;

use allow::{AllowedHost, OutboundHttp};

/// How long a shutdown waits for in-flight deliveries when the config does not say.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the admin server listens when the config does not say: loopback only.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9187";
/// Deliveries handled at once per subscription when the config does not say.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;
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

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML did not parse or has unknown keys; toml's message names the key and line.
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What toml said.
        message: String,
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
    #[error("{}: component {} does not exist", origin.display(), component.display())]
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
    /// Fuel (roughly, wasm instructions) one delivery may burn; `None` leaves it unmetered.
    pub fuel: Option<u64>,
    /// Where the guest may send HTTP requests, and how long each may take. A grant, not a
    /// limit, but like the limits it is the operator's to set, never the component's.
    pub outbound_http: OutboundHttp,
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
            fuel: None,
            outbound_http: OutboundHttp::default(),
        }
    }
}

/// One subscription as configured (before its component's descriptor is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionConfig {
    /// The component file.
    pub component: PathBuf,
    /// The Redis URL, if configured.
    pub redis: Option<String>,
    /// Descriptor overrides.
    pub overrides: Overrides,
    /// Limits and instance policy.
    pub limits: Limits,
    /// Values the guest can read.
    pub values: BTreeMap<String, String>,
    /// `consumer_gone_after`: `None` for the default, `Some(None)` for "off".
    pub consumer_gone_after: Option<Option<Duration>>,
    /// Where this subscription was defined, for error messages.
    pub origin: PathBuf,
}

/// The validated configuration of one `sluice` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Every subscription, in the order given.
    pub subscriptions: Vec<SubscriptionConfig>,
    /// Where compiled components are cached.
    pub cache_dir: PathBuf,
    /// How long a shutdown waits for in-flight deliveries.
    pub shutdown_timeout: Duration,
    /// Where the admin HTTP server listens; `None` turns it off.
    pub admin: Option<std::net::SocketAddr>,
    /// Where the admin API's bearer token comes from.
    pub admin_token: Option<TokenSource>,
    /// The largest upload the admin API accepts, in bytes.
    pub admin_max_upload: u64,
    /// Mutating admin calls need no token (loopback only).
    pub admin_open_on_loopback: bool,
    /// How often component files are checked for a new version; `None` turns watching off.
    pub watch_interval: Option<Duration>,
}

/// Where a secret is read from, so it never sits in the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// A file holding the token.
    File(PathBuf),
    /// An environment variable holding the token.
    Env(String),
}

impl TokenSource {
    /// Read the token; an error names where it was looked for.
    pub fn read(&self) -> Result<String, String> {
        let token = match self {
            Self::File(path) => {
                use std::os::unix::fs::PermissionsExt as _;
                let meta = std::fs::metadata(path).map_err(|e| {
                    format!("cannot read the admin token file {}: {e}", path.display())
                })?;
                if meta.permissions().mode() & 0o004 != 0 {
                    return Err(format!(
                        "the admin token file {} is readable by every user; make it private (chmod 600)",
                        path.display()
                    ));
                }
                std::fs::read_to_string(path).map_err(|e| {
                    format!("cannot read the admin token file {}: {e}", path.display())
                })?
            }
            Self::Env(name) => std::env::var(name)
                .map_err(|e| format!("cannot read the admin token from ${name}: {e}"))?,
        };
        let token = token.trim().to_owned();
        if token.is_empty() {
            return Err(format!("the admin token from {self:?} is empty"));
        }
        Ok(token)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    redis: Option<String>,
    consumer: Option<String>,
    cache_dir: Option<PathBuf>,
    shutdown_timeout: Option<String>,
    admin: Option<String>,
    admin_token_file: Option<PathBuf>,
    admin_token_env: Option<String>,
    admin_max_upload: Option<String>,
    admin_open_on_loopback: Option<bool>,
    watch_interval: Option<String>,
    #[serde(default, rename = "subscription")]
    subscriptions: Vec<RawSubscription>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubscription {
    component: PathBuf,
    redis: Option<String>,
    stream: Option<String>,
    group: Option<String>,
    consumer: Option<String>,
    claim_min_idle: Option<String>,
    consumer_gone_after: Option<String>,
    block: Option<String>,
    count: Option<usize>,
    dead_letter: Option<String>,
    max_retries: Option<u32>,
    payload_field: Option<String>,
    max_delay: Option<String>,
    failure_backoff: Option<RawBackoff>,
    delayed_retry: Option<RawDelayedRetry>,
    max_in_flight: Option<usize>,
    isolation: Option<Isolation>,
    recycle_after: Option<u64>,
    handler_timeout: Option<String>,
    memory_limit: Option<String>,
    host_memory_limit: Option<String>,
    log_lines: Option<u32>,
    log_bytes: Option<String>,
    fuel: Option<u64>,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    http_timeout: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    initial: String,
    max: String,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawDelayedRetry {
    Keyword(String),
    Set(RawDurableZset),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDurableZset {
    key: String,
    ttl: Option<String>,
}

impl Config {
    /// Load and merge every argument of `sluice run`/`sluice check`: TOML files and `.wasm`
    /// components.
    pub fn load(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        let mut config = Config {
            subscriptions: Vec::new(),
            cache_dir: PathBuf::from(".sluice/cache"),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            admin: DEFAULT_ADMIN.parse().ok(),
            admin_token: None,
            admin_max_upload: 64 * 1024 * 1024,
            admin_open_on_loopback: false,
            watch_interval: Some(Duration::from_secs(1)),
        };
        let mut watch: Option<Option<Duration>> = None;
        let mut token: Option<TokenSource> = None;
        let mut max_upload: Option<u64> = None;
        let mut open_on_loopback: Option<bool> = None;
        let mut cache_dir: Option<PathBuf> = None;
        let mut shutdown: Option<Duration> = None;
        let mut admin: Option<Option<std::net::SocketAddr>> = None;
        for path in paths {
            match path.extension().and_then(|e| e.to_str()) {
                Some("wasm") => {
                    if !path.is_file() {
                        return Err(ConfigError::MissingComponent {
                            origin: path.clone(),
                            component: path.clone(),
                        });
                    }
                    config.subscriptions.push(SubscriptionConfig {
                        component: path.clone(),
                        redis: None,
                        overrides: Overrides::default(),
                        limits: Limits::default(),
                        values: BTreeMap::new(),
                        consumer_gone_after: None,
                        origin: path.clone(),
                    });
                }
                Some("toml") => {
                    let text =
                        std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                            path: path.clone(),
                            source,
                        })?;
                    let file = parse_file(path, &text)?;
                    merge_global(&mut cache_dir, file.cache_dir, "cache_dir")?;
                    merge_global(&mut shutdown, file.shutdown_timeout, "shutdown_timeout")?;
                    merge_global(&mut admin, file.admin, "admin")?;
                    merge_global(
                        &mut token,
                        file.admin_token,
                        "admin_token_file/admin_token_env",
                    )?;
                    merge_global(&mut max_upload, file.admin_max_upload, "admin_max_upload")?;
                    merge_global(
                        &mut open_on_loopback,
                        file.admin_open_on_loopback,
                        "admin_open_on_loopback",
                    )?;
                    merge_global(&mut watch, file.watch_interval, "watch_interval")?;
                    config.subscriptions.extend(file.subscriptions);
                }
                _ => return Err(ConfigError::UnknownKind(path.clone())),
            }
        }
        if let Some(dir) = cache_dir {
            config.cache_dir = dir;
        }
        if let Some(timeout) = shutdown {
            config.shutdown_timeout = timeout;
        }
        if let Some(admin) = admin {
            config.admin = admin;
        }
        config.admin_token = token;
        if let Some(watch) = watch {
            config.watch_interval = watch;
        }
        if let Some(max) = max_upload {
            config.admin_max_upload = max;
        }
        config.admin_open_on_loopback = open_on_loopback.unwrap_or(false);
        if config.admin_open_on_loopback
            && let Some(addr) = config.admin
            && !addr.ip().is_loopback()
        {
            return Err(ConfigError::Value {
                path: paths.first().cloned().unwrap_or_default(),
                key: "admin_open_on_loopback".into(),
                value: "true".into(),
                reason: format!(
                    "the admin server binds {addr}, beyond loopback: its mutating calls always need a token"
                ),
            });
        }
        if let Some(addr) = config.admin
            && !addr.ip().is_loopback()
            && config.admin_token.is_none()
        {
            return Err(ConfigError::Value {
                path: paths.first().cloned().unwrap_or_default(),
                key: "admin".into(),
                value: addr.to_string(),
                reason: "the admin server binds beyond loopback, so its API needs a bearer token: set admin_token_file or admin_token_env".into(),
            });
        }
        Ok(config)
    }
}

fn merge_global<T: PartialEq + std::fmt::Debug>(
    slot: &mut Option<T>,
    value: Option<T>,
    key: &'static str,
) -> Result<(), ConfigError> {
    match (slot.as_ref(), value) {
        (_, None) => Ok(()),
        (None, Some(v)) => {
            *slot = Some(v);
            Ok(())
        }
        (Some(a), Some(b)) if *a == b => Ok(()),
        (Some(a), Some(b)) => Err(ConfigError::Conflict {
            key,
            first: format!("{a:?}"),
            second: format!("{b:?}"),
        }),
    }
}

/// One parsed TOML file.
struct FileConfig {
    cache_dir: Option<PathBuf>,
    shutdown_timeout: Option<Duration>,
    admin: Option<Option<std::net::SocketAddr>>,
    admin_token: Option<TokenSource>,
    admin_max_upload: Option<u64>,
    admin_open_on_loopback: Option<bool>,
    watch_interval: Option<Option<Duration>>,
    subscriptions: Vec<SubscriptionConfig>,
}

fn parse_file(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    if raw.subscriptions.is_empty() {
        return Err(ConfigError::NoSubscriptions(path.to_owned()));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let v = Validator { path };
    let shutdown_timeout = raw
        .shutdown_timeout
        .as_deref()
        .map(|s| v.duration("shutdown_timeout", s))
        .transpose()?;
    let admin = match raw.admin.as_deref() {
        None => None,
        Some("off") => Some(None),
        Some(text) => Some(Some(text.parse().map_err(|e| {
            v.invalid(
                "admin",
                text,
                &format!("{e}; write an address like \"127.0.0.1:9187\" or \"off\""),
            )
        })?)),
    };
    let admin_token = match (raw.admin_token_file, raw.admin_token_env) {
        (Some(_), Some(_)) => {
            return Err(v.invalid(
                "admin_token_file",
                "",
                "set admin_token_file or admin_token_env, not both",
            ));
        }
        (Some(file), None) => Some(TokenSource::File(base.join(file))),
        (None, Some(var)) => Some(TokenSource::Env(var)),
        (None, None) => None,
    };
    let admin_max_upload = match raw.admin_max_upload.as_deref() {
        None => None,
        Some(text) => Some(
            text.parse::<bytesize::ByteSize>()
                .map_err(|e| v.invalid("admin_max_upload", text, &e))?
                .as_u64(),
        ),
    };
    let watch_interval = match raw.watch_interval.as_deref() {
        None => None,
        Some("off") => Some(None),
        Some(text) => {
            let interval = v.duration("watch_interval", text)?;
            if interval.is_zero() {
                return Err(v.invalid("watch_interval", text, "must be longer than 0, or \"off\""));
            }
            Some(Some(interval))
        }
    };
    let mut subscriptions = Vec::with_capacity(raw.subscriptions.len());
    for (i, sub) in raw.subscriptions.into_iter().enumerate() {
        let key = |name: &str| format!("subscription[{i}].{name}");
        let component = base.join(&sub.component);
        if !component.is_file() {
            return Err(ConfigError::MissingComponent {
                origin: path.to_owned(),
                component,
            });
        }
        let opt_duration = |name: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|s| v.duration(&key(name), s))
                .transpose()
        };
        let failure_backoff = match &sub.failure_backoff {
            None => None,
            Some(b) => Some(Backoff {
                initial: v.duration(&key("failure_backoff.initial"), &b.initial)?,
                max: v.duration(&key("failure_backoff.max"), &b.max)?,
            }),
        };
        let delayed_retry = match sub.delayed_retry {
            None => None,
            Some(RawDelayedRetry::Keyword(word)) if word == "none" => Some(None),
            Some(RawDelayedRetry::Keyword(word)) => {
                return Err(v.invalid(
                    &key("delayed_retry"),
                    &word,
                    "expected \"none\" or a table { key = \"...\", ttl = \"...\" }",
                ));
            }
            Some(RawDelayedRetry::Set(set)) => Some(Some(DelayedRetry::DurableZset {
                ttl: opt_duration("delayed_retry.ttl", &set.ttl)?,
                key: set.key,
            })),
        };
        let mut limits = Limits::default();
        if let Some(n) = sub.max_in_flight {
            if n == 0 {
                return Err(v.invalid(&key("max_in_flight"), "0", "must be at least 1"));
            }
            limits.max_in_flight = n;
        }
        if let Some(isolation) = sub.isolation {
            limits.isolation = isolation;
        }
        if let Some(n) = sub.recycle_after {
            if n == 0 {
                return Err(v.invalid(&key("recycle_after"), "0", "must be at least 1"));
            }
            limits.recycle_after = n;
        }
        if let Some(t) = opt_duration("handler_timeout", &sub.handler_timeout)? {
            if t.is_zero() {
                return Err(v.invalid(&key("handler_timeout"), "0", "must be longer than 0"));
            }
            limits.handler_timeout = t;
        }
        if let Some(m) = &sub.memory_limit {
            let size: bytesize::ByteSize = m
                .parse()
                .map_err(|e: String| v.invalid(&key("memory_limit"), m, &e))?;
            if size.as_u64() < 64 * 1024 {
                return Err(v.invalid(
                    &key("memory_limit"),
                    m,
                    "must be at least one 64KiB wasm page",
                ));
            }
            limits.memory_limit = size.as_u64();
        }
        if let Some(m) = &sub.host_memory_limit {
            let size = v.size(&key("host_memory_limit"), m)?;
            if size < 512 * 1024 {
                return Err(v.invalid(
                    &key("host_memory_limit"),
                    m,
                    "must be at least 512KiB (16 resources of 32KiB)",
                ));
            }
            limits.host_memory_limit = size;
        }
        if let Some(n) = sub.log_lines {
            limits.log_lines = n;
        }
        if let Some(b) = &sub.log_bytes {
            limits.log_bytes = v.size(&key("log_bytes"), b)?;
        }
        if let Some(fuel) = sub.fuel {
            if fuel == 0 {
                return Err(v.invalid(&key("fuel"), "0", "must be at least 1"));
            }
            limits.fuel = Some(fuel);
        }
        for (j, entry) in sub.allowed_outbound_hosts.iter().enumerate() {
            let host: AllowedHost = entry.parse().map_err(|e: allow::EntryError| {
                v.invalid(
                    &key(&format!("allowed_outbound_hosts[{j}]")),
                    entry,
                    &e.to_string(),
                )
            })?;
            limits.outbound_http.allowed.push(host);
        }
        limits.outbound_http.timeout = limits.handler_timeout;
        if let Some(t) = opt_duration("http_timeout", &sub.http_timeout)? {
            if t.is_zero() || t > limits.handler_timeout {
                return Err(v.invalid(
                    &key("http_timeout"),
                    sub.http_timeout.as_deref().unwrap_or_default(),
                    &format!(
                        "must be longer than 0 and at most handler_timeout ({}): a request cannot outlive its delivery",
                        humantime::format_duration(limits.handler_timeout)
                    ),
                ));
            }
            limits.outbound_http.timeout = t;
        }
        let mut values = BTreeMap::new();
        for (name, value) in sub.config {
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(v.invalid(
                        &key(&format!("config.{name}")),
                        &other.to_string(),
                        "config values must be strings, numbers or booleans",
                    ));
                }
            };
            if name.starts_with("sluice.") {
                return Err(v.invalid(
                    &key(&format!("config.{name}")),
                    &text,
                    "keys starting with `sluice.` are reserved for the host",
                ));
            }
            values.insert(name, text);
        }
        let consumer_gone_after = match sub.consumer_gone_after.as_deref() {
            None => None,
            Some("off") => Some(None),
            Some(text) => Some(Some(v.duration(&key("consumer_gone_after"), text)?)),
        };
        subscriptions.push(SubscriptionConfig {
            consumer_gone_after,
            component,
            redis: sub.redis.or_else(|| raw.redis.clone()),
            overrides: Overrides {
                stream: sub.stream,
                group: sub.group,
                consumer: sub.consumer.or_else(|| raw.consumer.clone()),
                claim_min_idle: opt_duration("claim_min_idle", &sub.claim_min_idle)?,
                block: opt_duration("block", &sub.block)?,
                count: sub.count,
                dead_letter: sub.dead_letter,
                max_retries: sub.max_retries,
                payload_field: sub.payload_field,
                max_delay: opt_duration("max_delay", &sub.max_delay)?,
                failure_backoff,
                delayed_retry,
            },
            limits,
            values,
            origin: path.to_owned(),
        });
    }
    Ok(FileConfig {
        cache_dir: raw.cache_dir.map(|d| base.join(d)),
        shutdown_timeout,
        admin,
        admin_token,
        admin_max_upload,
        admin_open_on_loopback: raw.admin_open_on_loopback,
        watch_interval,
        subscriptions,
    })
}

struct Validator<'a> {
    path: &'a Path,
}

impl Validator<'_> {
    fn invalid(&self, key: &str, value: &str, reason: &str) -> ConfigError {
        ConfigError::Value {
            path: self.path.to_owned(),
            key: key.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }

    fn size(&self, key: &str, value: &str) -> Result<u64, ConfigError> {
        value
            .parse::<bytesize::ByteSize>()
            .map(|s| s.as_u64())
            .map_err(|e: String| self.invalid(key, value, &e))
    }

    fn duration(&self, key: &str, value: &str) -> Result<Duration, ConfigError> {
        humantime::parse_duration(value).map_err(|e| {
            self.invalid(
                key,
                value,
                &format!("{e} (write durations like \"500ms\", \"30s\" or \"1h\")"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        let dir = std::env::temp_dir();
        let component = dir.join("sluice-config-test.wasm");
        std::fs::write(&component, b"\0asm").unwrap();
        parse_file(
            &dir.join("sluice.toml"),
            &text.replace("COMPONENT", "sluice-config-test.wasm"),
        )
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("[[subscription]]\ncomponent = \"COMPONENT\"\nblok = \"1s\"\n")
            .err()
            .unwrap();
        assert!(err.to_string().contains("blok"), "{err}");
    }

    #[test]
    fn bad_duration_is_named() {
        let err = parse("[[subscription]]\ncomponent = \"COMPONENT\"\nblock = \"soon\"\n")
            .err()
            .unwrap();
        let text = err.to_string();
        assert!(
            text.contains("subscription[0].block") && text.contains("soon"),
            "{text}"
        );
    }

    #[test]
    fn delayed_retry_none_removes_the_set() {
        let file = parse("[[subscription]]\ncomponent = \"COMPONENT\"\ndelayed_retry = \"none\"\n")
            .ok()
            .unwrap();
        assert_eq!(file.subscriptions[0].overrides.delayed_retry, Some(None));
    }

    #[test]
    fn memory_limit_parses_units() {
        let file = parse("[[subscription]]\ncomponent = \"COMPONENT\"\nmemory_limit = \"32MiB\"\n")
            .ok()
            .unwrap();
        assert_eq!(file.subscriptions[0].limits.memory_limit, 32 * 1024 * 1024);
    }

    #[test]
    fn outbound_hosts_and_http_timeout() {
        let file = parse(
            "[[subscription]]\ncomponent = \"COMPONENT\"\nhandler_timeout = \"5s\"\n\
             allowed_outbound_hosts = [\"https://*.example.com\", \"http://127.0.0.1:*\"]\n",
        )
        .ok()
        .unwrap();
        let http = &file.subscriptions[0].limits.outbound_http;
        assert_eq!(http.allowed.len(), 2);
        assert_eq!(
            http.timeout,
            Duration::from_secs(5),
            "defaults to handler_timeout"
        );
        assert!(
            http.check(&"https://api.example.com/x".parse().unwrap())
                .is_ok()
        );
    }

    #[test]
    fn bad_outbound_host_and_long_http_timeout_are_named() {
        let err = parse(
            "[[subscription]]\ncomponent = \"COMPONENT\"\nallowed_outbound_hosts = [\"https://a.com\", \"a.com\"]\n",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("subscription[0].allowed_outbound_hosts[1]") && err.contains("no scheme"),
            "{err}"
        );
        let err = parse(
            "[[subscription]]\ncomponent = \"COMPONENT\"\nhandler_timeout = \"1s\"\nhttp_timeout = \"2s\"\n",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("subscription[0].http_timeout") && err.contains("at most handler_timeout"),
            "{err}"
        );
    }
}
