//! One TOML file, read: the raw shape serde parses (unknown keys refused), then each value
//! checked and turned into its typed form, one small step per part of the file. Errors name
//! the file, the key (`subscription[0].block`) and the value as written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sluice_descriptor::{Backoff, DelayedRetry, MAX_DURATION, Overrides};

use super::allow::{AllowedHost, EntryError};
use super::{ConfigError, Isolation, Limits, RedisAccess, SubscriptionConfig, TokenSource};

/// The most entries' histories a subscription may keep: about 5 GiB of Redis at the most.
const MAX_HISTORY_ENTRIES: u64 = 1_000_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    redis: Option<RawRedis>,
    redis_username: Option<String>,
    redis_password_file: Option<PathBuf>,
    redis_ca_file: Option<PathBuf>,
    redis_cert_file: Option<PathBuf>,
    redis_key_file: Option<PathBuf>,
    consumer: Option<String>,
    cache_dir: Option<PathBuf>,
    shutdown_timeout: Option<String>,
    admin: Option<String>,
    admin_token_file: Option<PathBuf>,
    admin_token_env: Option<String>,
    rollout_key_file: Option<PathBuf>,
    rollout_key_env: Option<String>,
    admin_max_upload: Option<String>,
    cache_max_size: Option<String>,
    max_instances: Option<u64>,
    metrics_per_subscription: Option<bool>,
    doorbell: Option<String>,
    admin_open_on_loopback: Option<bool>,
    admin_read_only: Option<bool>,
    watch_interval: Option<String>,
    telemetry: Option<super::telemetry::RawTelemetry>,
    #[serde(default, rename = "subscription")]
    subscriptions: Vec<RawSubscription>,
}

/// `redis = "url"`, or `redis = ["url", ...]`: a cluster's seed nodes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRedis {
    One(String),
    Seeds(Vec<String>),
}

impl RawRedis {
    /// The value as the rest of the host carries it: seed URLs separated by a space (a URL
    /// cannot hold one unescaped), which `redis_conn::Target::parse` splits again.
    fn resolve(&self, v: &Validator<'_>, key: &str) -> Result<String, ConfigError> {
        let urls = match self {
            Self::One(url) => return Ok(url.clone()),
            Self::Seeds(urls) => urls,
        };
        let shown = || format!("[{} URLs]", urls.len());
        if urls.is_empty() {
            return Err(v.invalid(key, "[]", "name at least one cluster node"));
        }
        if urls
            .iter()
            .any(|u| u.trim().is_empty() || u.contains(char::is_whitespace))
        {
            return Err(v.invalid(
                key,
                &shown(),
                "each cluster node is one URL, without spaces (e.g. \"redis://10.0.0.1:7000\")",
            ));
        }
        if urls.iter().any(|u| u.starts_with("redis+sentinel://")) {
            return Err(v.invalid(
                key,
                &shown(),
                "a list names cluster nodes; give a Sentinel URL as one string",
            ));
        }
        Ok(urls.join(" "))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubscription {
    component: PathBuf,
    redis: Option<RawRedis>,
    redis_username: Option<String>,
    redis_password_file: Option<PathBuf>,
    redis_ca_file: Option<PathBuf>,
    redis_cert_file: Option<PathBuf>,
    redis_key_file: Option<PathBuf>,
    stream: Option<String>,
    group: Option<String>,
    consumer: Option<String>,
    claim_min_idle: Option<String>,
    consumer_gone_after: Option<String>,
    dead_letter_maxlen: Option<u64>,
    history_entries: Option<u64>,
    retention: Option<RawRetention>,
    dead_letter_retention: Option<RawDeadLetterRetention>,
    block: Option<String>,
    count: Option<usize>,
    dead_letter: Option<String>,
    max_retries: Option<u32>,
    payload_field: Option<String>,
    max_delay: Option<String>,
    failure_backoff: Option<RawBackoff>,
    partitions: Option<u32>,
    delayed_retry: Option<RawDelayedRetry>,
    retry_lane: Option<bool>,
    retry_lane_slots: Option<usize>,
    other_groups_see_retries: Option<bool>,
    rate_limit: Option<RawRateLimit>,
    circuit_breaker: Option<RawBreaker>,
    canary: Option<RawCanary>,
    min_delay: Option<String>,
    max_in_flight: Option<usize>,
    isolation: Option<Isolation>,
    recycle_after: Option<u64>,
    handler_timeout: Option<String>,
    memory_limit: Option<String>,
    host_memory_limit: Option<String>,
    log_lines: Option<u32>,
    log_bytes: Option<String>,
    max_entry_bytes: Option<String>,
    fuel: Option<u64>,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    http_timeout: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    per_second: f64,
    burst: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    failure_rate: f64,
    window: String,
    min_deliveries: u64,
    open_for: String,
    probes: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCanary {
    window: Option<String>,
    failure_rate_increase: Option<f64>,
    dead_letter_rate_increase: Option<f64>,
    retry_rate_increase: Option<f64>,
    p99_ratio: Option<f64>,
    p99_slack: Option<String>,
    min_deliveries: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    initial: String,
    max: String,
}

/// `retention = { keep_acked = "1h", max_len = 1000000, every = "10s" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    keep_acked: Option<String>,
    max_len: Option<u64>,
    every: Option<String>,
}

/// `dead_letter_retention = { keep = "30d" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadLetterRetention {
    keep: String,
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

/// The settings of one file that apply to the whole host; `None` where the file is silent.
#[derive(Debug, Default)]
pub(super) struct Globals {
    pub(super) cache_dir: Option<PathBuf>,
    pub(super) shutdown_timeout: Option<Duration>,
    pub(super) admin: Option<Option<std::net::SocketAddr>>,
    pub(super) admin_token: Option<TokenSource>,
    pub(super) rollout_key: Option<TokenSource>,
    pub(super) admin_max_upload: Option<u64>,
    pub(super) cache_max_size: Option<u64>,
    pub(super) max_instances: Option<u32>,
    pub(super) metrics_per_subscription: Option<bool>,
    pub(super) doorbell: Option<super::DoorbellMode>,
    pub(super) admin_open_on_loopback: Option<bool>,
    pub(super) admin_read_only: Option<bool>,
    pub(super) watch_interval: Option<Option<Duration>>,
    pub(super) telemetry: Option<super::telemetry::Telemetry>,
}

impl Globals {
    /// Take `other`'s settings; two files that both set one must agree.
    pub(super) fn merge(&mut self, other: Globals) -> Result<(), ConfigError> {
        merge(&mut self.cache_dir, other.cache_dir, "cache_dir")?;
        merge(
            &mut self.shutdown_timeout,
            other.shutdown_timeout,
            "shutdown_timeout",
        )?;
        merge(&mut self.admin, other.admin, "admin")?;
        merge(
            &mut self.admin_token,
            other.admin_token,
            "admin_token_file/admin_token_env",
        )?;
        merge(
            &mut self.rollout_key,
            other.rollout_key,
            "rollout_key_file/rollout_key_env",
        )?;
        merge(
            &mut self.admin_max_upload,
            other.admin_max_upload,
            "admin_max_upload",
        )?;
        merge(&mut self.telemetry, other.telemetry, "telemetry")?;
        merge(
            &mut self.cache_max_size,
            other.cache_max_size,
            "cache_max_size",
        )?;
        merge(
            &mut self.max_instances,
            other.max_instances,
            "max_instances",
        )?;
        merge(
            &mut self.metrics_per_subscription,
            other.metrics_per_subscription,
            "metrics_per_subscription",
        )?;
        merge(&mut self.doorbell, other.doorbell, "doorbell")?;
        merge(
            &mut self.admin_open_on_loopback,
            other.admin_open_on_loopback,
            "admin_open_on_loopback",
        )?;
        merge(
            &mut self.admin_read_only,
            other.admin_read_only,
            "admin_read_only",
        )?;
        merge(
            &mut self.watch_interval,
            other.watch_interval,
            "watch_interval",
        )
    }
}

fn merge<T: PartialEq + std::fmt::Debug>(
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
#[derive(Debug)]
pub(super) struct FileConfig {
    pub(super) globals: Globals,
    pub(super) subscriptions: Vec<SubscriptionConfig>,
}

/// Parse and check the TOML file at `path`, whose text is `text`.
/// Whether `text` has the raw shape of a config file; the parser's own message when not (the
/// reference's test reads the keys it accepts from it).
#[cfg(test)]
pub(super) fn parse_str(text: &str) -> Result<(), String> {
    toml::from_str::<RawConfig>(text)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

pub(super) fn parse_file(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })?;
    if raw.subscriptions.is_empty() {
        return Err(ConfigError::NoSubscriptions(path.to_owned()));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let v = Validator { path };
    let globals = globals(&v, base, &raw)?;
    let shared = Shared {
        redis: raw
            .redis
            .as_ref()
            .map(|r| r.resolve(&v, "redis"))
            .transpose()?,
        redis_access: redis_access(
            &v,
            base,
            "",
            RawAccess {
                username: &raw.redis_username,
                password_file: &raw.redis_password_file,
                ca_file: &raw.redis_ca_file,
                cert_file: &raw.redis_cert_file,
                key_file: &raw.redis_key_file,
            },
            &RedisAccess::default(),
        )?,
        consumer: raw.consumer.as_deref(),
    };
    let subscriptions = raw
        .subscriptions
        .into_iter()
        .enumerate()
        .map(|(i, sub)| subscription(&v, base, i, sub, &shared))
        .collect::<Result<_, _>>()?;
    Ok(FileConfig {
        globals,
        subscriptions,
    })
}

/// Where the secret `<name>_file` or `<name>_env` names is (one of them at most).
fn secret_source(
    v: &Validator<'_>,
    base: &Path,
    name: &str,
    (file, env): (&Option<PathBuf>, &Option<String>),
) -> Result<Option<TokenSource>, ConfigError> {
    Ok(match (file, env) {
        (Some(_), Some(_)) => {
            return Err(v.invalid(
                &format!("{name}_file"),
                "",
                &format!("set {name}_file or {name}_env, not both"),
            ));
        }
        (Some(file), None) => Some(TokenSource::File(base.join(file))),
        (None, Some(var)) => Some(TokenSource::Env(var.clone())),
        (None, None) => None,
    })
}

fn globals(v: &Validator<'_>, base: &Path, raw: &RawConfig) -> Result<Globals, ConfigError> {
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
    let admin_token = secret_source(
        v,
        base,
        "admin_token",
        (&raw.admin_token_file, &raw.admin_token_env),
    )?;
    let rollout_key = secret_source(
        v,
        base,
        "rollout_key",
        (&raw.rollout_key_file, &raw.rollout_key_env),
    )?;
    let watch_interval = match raw.watch_interval.as_deref() {
        None => None,
        Some("off") => Some(None),
        Some(text) => Some(Some(v.positive("watch_interval", text, "or \"off\"")?)),
    };
    let telemetry = raw
        .telemetry
        .as_ref()
        .map(|t| t.check(v.path, base))
        .transpose()?;
    Ok(Globals {
        cache_dir: raw.cache_dir.as_ref().map(|d| base.join(d)),
        shutdown_timeout: v.opt_duration("shutdown_timeout", &raw.shutdown_timeout)?,
        admin,
        admin_token,
        rollout_key,
        admin_max_upload: raw
            .admin_max_upload
            .as_deref()
            .map(|text| v.size("admin_max_upload", text))
            .transpose()?,
        cache_max_size: raw
            .cache_max_size
            .as_deref()
            .map(|text| v.size("cache_max_size", text))
            .transpose()?,
        max_instances: raw.max_instances.map(|n| v.max_instances(n)).transpose()?,
        metrics_per_subscription: raw.metrics_per_subscription,
        doorbell: raw
            .doorbell
            .as_deref()
            .map(|text| v.doorbell(text))
            .transpose()?,
        admin_open_on_loopback: raw.admin_open_on_loopback,
        admin_read_only: raw.admin_read_only,
        watch_interval,
        telemetry,
    })
}

/// What a file's top level gives each of its subscriptions unless they say otherwise.
struct Shared<'a> {
    redis: Option<String>,
    redis_access: RedisAccess,
    consumer: Option<&'a str>,
}

fn subscription(
    v: &Validator<'_>,
    base: &Path,
    i: usize,
    sub: RawSubscription,
    shared: &Shared<'_>,
) -> Result<SubscriptionConfig, ConfigError> {
    let key = |name: &str| format!("subscription[{i}].{name}");
    let component = base.join(&sub.component);
    if !component.is_file() {
        return Err(ConfigError::MissingComponent {
            origin: v.path.to_owned(),
            component,
        });
    }
    let limits = limits(v, &key, &sub)?;
    // Whether the subscription has a delayed set is known only once its component's descriptor
    // is read (`crate::service::plan`): here only what the keys say among themselves is checked.
    if sub.retry_lane == Some(false)
        && let Some(n) = sub.retry_lane_slots
    {
        return Err(v.invalid(
            &key("retry_lane_slots"),
            &n.to_string(),
            "only means something with the retry lane (retry_lane = false sends retries to the stream's tail)",
        ));
    }
    if let Some(n) = sub.retry_lane_slots
        && n >= limits.max_in_flight
    {
        return Err(v.invalid(
            &key("retry_lane_slots"),
            &n.to_string(),
            &format!(
                "must be less than max_in_flight ({}): new stream entries need at least one slot",
                limits.max_in_flight
            ),
        ));
    }
    if sub.other_groups_see_retries == Some(true) && sub.retry_lane != Some(false) {
        return Err(v.invalid(
            &key("other_groups_see_retries"),
            "true",
            "only means something with retry_lane = false (the retry lane is read by this group alone)",
        ));
    }
    let min_delay = match &sub.min_delay {
        None => super::DEFAULT_MIN_DELAY,
        Some(text) => {
            let d = v.duration(&key("min_delay"), text)?;
            if d < super::DEFAULT_MIN_DELAY {
                return Err(v.invalid(
                    &key("min_delay"),
                    text,
                    "must be at least 1ms: a retry that comes back at once, for ever, keeps a core and Redis busy",
                ));
            }
            d
        }
    };
    let consumer_gone_after = match sub.consumer_gone_after.as_deref() {
        None => None,
        Some("off") => Some(None),
        Some(text) => Some(Some(v.duration(&key("consumer_gone_after"), text)?)),
    };
    let redis = match &sub.redis {
        Some(redis) => Some(redis.resolve(v, &key("redis"))?),
        None => shared.redis.clone(),
    };
    let redis_access = redis_access(
        v,
        base,
        &key(""),
        RawAccess {
            username: &sub.redis_username,
            password_file: &sub.redis_password_file,
            ca_file: &sub.redis_ca_file,
            cert_file: &sub.redis_cert_file,
            key_file: &sub.redis_key_file,
        },
        &shared.redis_access,
    )?;
    if let Some(url) = &redis
        && url.starts_with("redis+sentinel://")
        && redis_access.has_tls_files()
    {
        // Sentinel connections here do not carry TLS: better no start than a password sent
        // in clear text to whichever master the sentinels name.
        return Err(v.invalid(
            &key("redis"),
            "redis+sentinel://…",
            "TLS files (redis_ca_file, redis_cert_file) are not supported behind Sentinel: connect to the master with rediss:// or drop the TLS files",
        ));
    }
    Ok(SubscriptionConfig {
        component,
        redis,
        redis_access,
        overrides: overrides(v, &key, &sub, shared)?,
        limits,
        values: values(v, &key, sub.config)?,
        consumer_gone_after,
        retention: match &sub.retention {
            None => None,
            Some(r) => Some(super::Retention {
                keep_acked: v
                    .opt_duration(&key("retention.keep_acked"), &r.keep_acked)?
                    .unwrap_or(super::DEFAULT_KEEP_ACKED),
                max_len: match r.max_len {
                    Some(0) => {
                        return Err(v.invalid(
                            &key("retention.max_len"),
                            "0",
                            "must be at least 1 (leave it out for no cap)",
                        ));
                    }
                    other => other,
                },
                every: match &r.every {
                    Some(text) => {
                        v.positive(&key("retention.every"), text, "(leave it out for 10s)")?
                    }
                    None => super::DEFAULT_RETENTION_EVERY,
                },
            }),
        },
        dead_letter_keep: match &sub.dead_letter_retention {
            None => None,
            Some(r) => Some(v.positive(
                &key("dead_letter_retention.keep"),
                &r.keep,
                "(leave dead_letter_retention out to keep dead letters for ever)",
            )?),
        },
        rate_limit: match &sub.rate_limit {
            None => None,
            Some(r) => Some(rate_limit(v, &key, r)?),
        },
        circuit_breaker: match &sub.circuit_breaker {
            None => None,
            Some(b) => Some(breaker(v, &key, b)?),
        },
        canary: match &sub.canary {
            None => super::Canary::default(),
            Some(c) => canary(v, &key, c)?,
        },
        retry_lane: sub.retry_lane,
        retry_lane_slots: sub.retry_lane_slots,
        other_groups_see_retries: sub.other_groups_see_retries.unwrap_or(false),
        min_delay,
        dead_letter_maxlen: match sub.dead_letter_maxlen {
            Some(0) => {
                return Err(v.invalid(
                    &key("dead_letter_maxlen"),
                    "0",
                    "must be at least 1 (leave it out to never trim)",
                ));
            }
            other => other,
        },
        history_entries: match sub.history_entries {
            Some(n) if n > MAX_HISTORY_ENTRIES => {
                return Err(v.invalid(
                    &key("history_entries"),
                    &n.to_string(),
                    &format!("must be at most {MAX_HISTORY_ENTRIES} (0 turns the history off)"),
                ));
            }
            other => other.map(|n| n as u32),
        },
        origin: v.path.to_owned(),
    })
}

/// The `redis_*` keys of one table, as written.
struct RawAccess<'a> {
    username: &'a Option<String>,
    password_file: &'a Option<PathBuf>,
    ca_file: &'a Option<PathBuf>,
    cert_file: &'a Option<PathBuf>,
    key_file: &'a Option<PathBuf>,
}

/// The `redis_*` keys over `inherited` (a subscription's over its file's): files resolved
/// against the config's folder and required to exist, a certificate only with its key.
/// `prefix` is `subscription[i].` for a subscription's keys, empty at the top level.
fn redis_access(
    v: &Validator<'_>,
    base: &Path,
    prefix: &str,
    raw: RawAccess<'_>,
    inherited: &RedisAccess,
) -> Result<RedisAccess, ConfigError> {
    let file = |name: &str, path: &Option<PathBuf>| -> Result<Option<PathBuf>, ConfigError> {
        let Some(path) = path else {
            return Ok(None);
        };
        let path = base.join(path);
        if !path.is_file() {
            return Err(v.invalid(
                &format!("{prefix}{name}"),
                &path.display().to_string(),
                "no such file",
            ));
        }
        Ok(Some(path))
    };
    let client_cert = match (
        file("redis_cert_file", raw.cert_file)?,
        file("redis_key_file", raw.key_file)?,
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => inherited.client_cert.clone(),
        (Some(cert), None) | (None, Some(cert)) => {
            return Err(v.invalid(
                &format!("{prefix}redis_cert_file"),
                &cert.display().to_string(),
                "a client certificate needs both redis_cert_file and redis_key_file",
            ));
        }
    };
    Ok(RedisAccess {
        username: raw.username.clone().or_else(|| inherited.username.clone()),
        password_file: file("redis_password_file", raw.password_file)?
            .or_else(|| inherited.password_file.clone()),
        ca_file: file("redis_ca_file", raw.ca_file)?.or_else(|| inherited.ca_file.clone()),
        client_cert,
    })
}

/// The descriptor fields this subscription overrides.
fn overrides(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    sub: &RawSubscription,
    shared: &Shared<'_>,
) -> Result<Overrides, ConfigError> {
    let failure_backoff = match &sub.failure_backoff {
        None => None,
        Some(b) => Some(Backoff {
            initial: v.duration(&key("failure_backoff.initial"), &b.initial)?,
            max: v.duration(&key("failure_backoff.max"), &b.max)?,
        }),
    };
    let delayed_retry = match &sub.delayed_retry {
        None => None,
        Some(RawDelayedRetry::Keyword(word)) if word == "none" => Some(None),
        Some(RawDelayedRetry::Keyword(word)) => {
            return Err(v.invalid(
                &key("delayed_retry"),
                word,
                "expected \"none\" or a table { key = \"...\", ttl = \"...\" }",
            ));
        }
        Some(RawDelayedRetry::Set(set)) => Some(Some(DelayedRetry::DurableZset {
            ttl: v.opt_duration(&key("delayed_retry.ttl"), &set.ttl)?,
            key: set.key.clone(),
        })),
    };
    Ok(Overrides {
        stream: sub.stream.clone(),
        group: sub.group.clone(),
        consumer: sub.consumer.clone().or(shared.consumer.map(str::to_owned)),
        claim_min_idle: v.opt_duration(&key("claim_min_idle"), &sub.claim_min_idle)?,
        block: v.opt_duration(&key("block"), &sub.block)?,
        count: sub.count,
        dead_letter: sub.dead_letter.clone(),
        max_retries: sub.max_retries,
        payload_field: sub.payload_field.clone(),
        max_delay: v.opt_duration(&key("max_delay"), &sub.max_delay)?,
        failure_backoff,
        delayed_retry,
        partitions: sub.partitions,
    })
}

/// `circuit_breaker = { failure_rate, window, min_deliveries, open_for, probes }`: a rate in
/// (0, 1], a window and an open time of a second to a day, at least one delivery, 1 to 100
/// probes (default 3).
fn breaker(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawBreaker,
) -> Result<super::CircuitBreaker, ConfigError> {
    let rate = raw.failure_rate;
    if !rate.is_finite() || rate <= 0.0 || rate > 1.0 {
        return Err(v.invalid(
            &key("circuit_breaker.failure_rate"),
            &rate.to_string(),
            "must be above 0 and at most 1 (the share of failed deliveries that opens it)",
        ));
    }
    let span = |name: &str, text: &str| -> Result<std::time::Duration, ConfigError> {
        let d = v.duration(&key(name), text)?;
        if d < std::time::Duration::from_secs(1) || d > std::time::Duration::from_secs(86_400) {
            return Err(v.invalid(&key(name), text, "must be between 1s and 1 day"));
        }
        Ok(d)
    };
    let window = span("circuit_breaker.window", &raw.window)?;
    let open_for = span("circuit_breaker.open_for", &raw.open_for)?;
    if raw.min_deliveries == 0 || raw.min_deliveries > 1_000_000_000 {
        return Err(v.invalid(
            &key("circuit_breaker.min_deliveries"),
            &raw.min_deliveries.to_string(),
            "must be at least 1 (deliveries in the window before the rate counts)",
        ));
    }
    let probes = raw.probes.unwrap_or(super::DEFAULT_PROBES);
    if !(1..=100).contains(&probes) {
        return Err(v.invalid(
            &key("circuit_breaker.probes"),
            &probes.to_string(),
            "must be between 1 and 100",
        ));
    }
    Ok(super::CircuitBreaker {
        failure_rate: rate,
        window,
        min_deliveries: raw.min_deliveries,
        open_for,
        probes,
    })
}

/// `canary = { window, failure_rate_increase, dead_letter_rate_increase, retry_rate_increase,
/// p99_ratio, p99_slack, min_deliveries }`, each optional: a window of 10 s to a day, increases
/// in [0, 1], a ratio of at least 1, a slack up to a minute, 1 to a million attempts.
fn canary(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawCanary,
) -> Result<super::Canary, ConfigError> {
    let mut c = super::Canary::default();
    if let Some(text) = &raw.window {
        c.window = v.duration(&key("canary.window"), text)?;
        if c.window < std::time::Duration::from_secs(10)
            || c.window > std::time::Duration::from_secs(86_400)
        {
            return Err(v.invalid(&key("canary.window"), text, "must be between 10s and 1 day"));
        }
    }
    for (name, raw, field) in [
        (
            "canary.failure_rate_increase",
            raw.failure_rate_increase,
            &mut c.failure_rate_increase,
        ),
        (
            "canary.dead_letter_rate_increase",
            raw.dead_letter_rate_increase,
            &mut c.dead_letter_rate_increase,
        ),
        (
            "canary.retry_rate_increase",
            raw.retry_rate_increase,
            &mut c.retry_rate_increase,
        ),
    ] {
        if let Some(x) = raw {
            if !x.is_finite() || !(0.0..=1.0).contains(&x) {
                return Err(v.invalid(
                    &key(name),
                    &x.to_string(),
                    "must be between 0 and 1 (how much more of the candidate's attempts than the incumbent's may end so)",
                ));
            }
            *field = x;
        }
    }
    if let Some(x) = raw.p99_ratio {
        if !x.is_finite() || !(1.0..=1000.0).contains(&x) {
            return Err(v.invalid(
                &key("canary.p99_ratio"),
                &x.to_string(),
                "must be between 1 and 1000 (the candidate's p99 handler time over the incumbent's)",
            ));
        }
        c.p99_ratio = x;
    }
    if let Some(text) = &raw.p99_slack {
        c.p99_slack = v.duration(&key("canary.p99_slack"), text)?;
        if c.p99_slack > std::time::Duration::from_secs(60) {
            return Err(v.invalid(&key("canary.p99_slack"), text, "must be at most 1m"));
        }
    }
    if let Some(n) = raw.min_deliveries {
        if !(1..=1_000_000).contains(&n) {
            return Err(v.invalid(
                &key("canary.min_deliveries"),
                &n.to_string(),
                "must be between 1 and 1,000,000",
            ));
        }
        c.min_deliveries = n;
    }
    Ok(c)
}

/// `rate_limit = { per_second, burst }`: a rate above 0 and at most
/// [`super::MAX_RATE_PER_SECOND`], a burst of at least 1 (default: a tenth of a second's worth,
/// at least 1) and at most that maximum too.
fn rate_limit(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawRateLimit,
) -> Result<super::RateLimit, ConfigError> {
    let max = super::MAX_RATE_PER_SECOND;
    let rate = raw.per_second;
    if !rate.is_finite() || rate <= 0.0 || rate > max {
        return Err(v.invalid(
            &key("rate_limit.per_second"),
            &rate.to_string(),
            &format!("must be above 0 and at most {max} (entries a second, across every host of the group)"),
        ));
    }
    let burst = match raw.burst {
        Some(b) if b == 0 || b as f64 > max => {
            return Err(v.invalid(
                &key("rate_limit.burst"),
                &b.to_string(),
                &format!("must be at least 1 and at most {max}"),
            ));
        }
        Some(b) => b,
        None => ((rate / 10.0).ceil() as u64).max(1),
    };
    Ok(super::RateLimit {
        per_second: rate,
        burst,
    })
}

/// The subscription's limits and grants, each checked against its floor.
fn limits(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    sub: &RawSubscription,
) -> Result<Limits, ConfigError> {
    let at_least_one = |name: &str, n: u64| {
        if n == 0 {
            Err(v.invalid(&key(name), "0", "must be at least 1"))
        } else {
            Ok(n)
        }
    };
    let mut limits = Limits::default();
    if let Some(n) = sub.max_in_flight {
        limits.max_in_flight = at_least_one("max_in_flight", n as u64)? as usize;
    }
    if let Some(isolation) = sub.isolation {
        limits.isolation = isolation;
    }
    if let Some(n) = sub.recycle_after {
        limits.recycle_after = at_least_one("recycle_after", n)?;
    }
    if let Some(t) = &sub.handler_timeout {
        limits.handler_timeout = v.positive(&key("handler_timeout"), t, "")?;
    }
    if let Some(m) = &sub.memory_limit {
        limits.memory_limit =
            v.size_at_least(&key("memory_limit"), m, 64 * 1024, "one 64KiB wasm page")?;
    }
    if let Some(m) = &sub.host_memory_limit {
        limits.host_memory_limit = v.size_at_least(
            &key("host_memory_limit"),
            m,
            512 * 1024,
            "512KiB (16 resources of 32KiB)",
        )?;
    }
    if let Some(n) = sub.log_lines {
        limits.log_lines = n;
    }
    if let Some(b) = &sub.log_bytes {
        limits.log_bytes = v.size(&key("log_bytes"), b)?;
    }
    if let Some(b) = &sub.max_entry_bytes {
        limits.max_entry_bytes = v.size_at_least(&key("max_entry_bytes"), b, 1024, "1KiB")?;
    }
    if let Some(fuel) = sub.fuel {
        limits.fuel = Some(at_least_one("fuel", fuel)?);
    }
    for (j, entry) in sub.allowed_outbound_hosts.iter().enumerate() {
        let host: AllowedHost = entry.parse().map_err(|e: EntryError| {
            v.invalid(
                &key(&format!("allowed_outbound_hosts[{j}]")),
                entry,
                &e.to_string(),
            )
        })?;
        limits.outbound_http.allowed.push(host);
    }
    limits.outbound_http.timeout = limits.handler_timeout;
    if let Some(t) = v.opt_duration(&key("http_timeout"), &sub.http_timeout)? {
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
    Ok(limits)
}

/// `[subscription.config]`: string values the guest can read; `sluice.` keys are the host's.
fn values(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    config: BTreeMap<String, toml::Value>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut values = BTreeMap::new();
    for (name, value) in config {
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
        if name.starts_with(sluice_descriptor::RESERVED_CONFIG_PREFIX) {
            return Err(v.invalid(
                &key(&format!("config.{name}")),
                &text,
                "keys starting with `sluice.` are reserved for the host",
            ));
        }
        values.insert(name, text);
    }
    Ok(values)
}

/// Turns text values into typed ones, naming the file and key when one is wrong.
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

    /// `doorbell`: `auto`, `poll` or `off`.
    fn doorbell(&self, text: &str) -> Result<super::DoorbellMode, ConfigError> {
        match text {
            "auto" => Ok(super::DoorbellMode::Auto),
            "poll" => Ok(super::DoorbellMode::Poll),
            "off" => Ok(super::DoorbellMode::Off),
            _ => Err(self.invalid("doorbell", text, "write \"auto\", \"poll\" or \"off\"")),
        }
    }

    /// `max_instances`: at least one, and no more than a pool's counters can hold.
    fn max_instances(&self, n: u64) -> Result<u32, ConfigError> {
        match u32::try_from(n) {
            Ok(n) if (1..=super::MAX_INSTANCES_CEILING).contains(&n) => Ok(n),
            _ => Err(self.invalid(
                "max_instances",
                &n.to_string(),
                &format!("must be between 1 and {}", super::MAX_INSTANCES_CEILING),
            )),
        }
    }

    fn size_at_least(
        &self,
        key: &str,
        value: &str,
        floor: u64,
        floor_text: &str,
    ) -> Result<u64, ConfigError> {
        let size = self.size(key, value)?;
        if size < floor {
            return Err(self.invalid(key, value, &format!("must be at least {floor_text}")));
        }
        Ok(size)
    }

    /// A duration of at most [`MAX_DURATION`]: every deadline computed from it fits a clock.
    fn duration(&self, key: &str, value: &str) -> Result<Duration, ConfigError> {
        let duration = humantime::parse_duration(value).map_err(|e| {
            self.invalid(
                key,
                value,
                &format!("{e} (write durations like \"500ms\", \"30s\" or \"1h\")"),
            )
        })?;
        if duration > MAX_DURATION {
            let most = format!(
                "is longer than the most any duration may be ({} days)",
                MAX_DURATION.as_secs() / 86_400
            );
            return Err(self.invalid(key, value, &most));
        }
        Ok(duration)
    }

    fn opt_duration(
        &self,
        key: &str,
        value: &Option<String>,
    ) -> Result<Option<Duration>, ConfigError> {
        value.as_deref().map(|s| self.duration(key, s)).transpose()
    }

    /// A duration that must be longer than zero; `alternative` names what else may be written.
    fn positive(&self, key: &str, value: &str, alternative: &str) -> Result<Duration, ConfigError> {
        let duration = self.duration(key, value)?;
        if duration.is_zero() {
            let reason = format!("must be longer than 0 {alternative}");
            return Err(self.invalid(key, value, reason.trim_end()));
        }
        Ok(duration)
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
    fn a_list_of_redis_urls_names_a_cluster() {
        let file = parse(
            "redis = [\"redis://a:7000\", \"redis://b:7001\"]\n[[subscription]]\ncomponent = \"COMPONENT\"\n",
        )
        .unwrap();
        assert_eq!(
            file.subscriptions[0].redis.as_deref(),
            Some("redis://a:7000 redis://b:7001")
        );
        for (value, expected) in [
            ("[]", "at least one cluster node"),
            ("[\"redis://a:1 redis://b:2\"]", "without spaces"),
            ("[\"redis+sentinel://a:1/m\"]", "Sentinel URL as one string"),
        ] {
            let text = format!("[[subscription]]\ncomponent = \"COMPONENT\"\nredis = {value}\n");
            let err = crate::support::chain::chain(&parse(&text).err().unwrap());
            assert!(err.contains("subscription[0].redis"), "{err}");
            assert!(err.contains(expected), "{err}");
        }
    }

    #[test]
    fn metrics_are_per_subscription_up_to_200_subscriptions_unless_set() {
        let dir = std::env::temp_dir().join(format!("sluice-metrics-scope-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("c.wasm"), b"\0asm").unwrap();
        let load = |n: usize, key: &str| {
            let mut text = key.to_owned();
            for i in 0..n {
                text.push_str(&format!(
                    "[[subscription]]\ncomponent = \"c.wasm\"\nstream = \"s{i}\"\n"
                ));
            }
            let path = dir.join("sluice.toml");
            std::fs::write(&path, text).unwrap();
            crate::config::Config::load(&[path])
                .unwrap()
                .metrics_per_subscription
        };
        assert!(load(200, ""));
        assert!(!load(201, ""));
        assert!(load(201, "metrics_per_subscription = true\n"));
        assert!(!load(1, "metrics_per_subscription = false\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn doorbell_takes_auto_poll_or_off() {
        let file =
            parse("doorbell = \"poll\"\n[[subscription]]\ncomponent = \"COMPONENT\"\n").unwrap();
        assert_eq!(
            file.globals.doorbell,
            Some(crate::config::DoorbellMode::Poll)
        );
        let err = parse("doorbell = \"sometimes\"\n[[subscription]]\ncomponent = \"COMPONENT\"\n")
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("doorbell") && err.contains("sometimes"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("[[subscription]]\ncomponent = \"COMPONENT\"\nblok = \"1s\"\n")
            .err()
            .unwrap();
        let text = crate::support::chain::chain(&err);
        assert!(text.contains("blok"), "{text}");
    }

    #[test]
    fn tls_files_behind_sentinel_are_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-sentinel-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), b"-----BEGIN CERTIFICATE-----").unwrap();
        let text = format!(
            "redis = \"redis+sentinel://10.0.0.1:26379/mymaster\"\nredis_ca_file = \"{}\"\n[[subscription]]\ncomponent = \"COMPONENT\"\n",
            dir.join("ca.pem").display()
        );
        let err = parse(&text).err().unwrap().to_string();
        assert!(err.contains("not supported behind Sentinel"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
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

    /// The configs the Kubernetes manifests ship parse, listen where the probes look, keep
    /// the consumer name the pod's own, and stop within the pod's grace period.
    #[test]
    fn the_kubernetes_manifests_configs_parse_and_fit_the_pod() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
        let deployment =
            std::fs::read_to_string(root.join("base/deployment.yaml")).expect("the deployment");
        let grace: u64 = deployment
            .lines()
            .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("the deployment sets terminationGracePeriodSeconds");
        assert!(deployment.contains("containerPort: 9187"), "{deployment}");
        for config in ["base/sluice.toml", "overlays/example/sluice.toml"] {
            let text = std::fs::read_to_string(root.join(config)).expect(config);
            assert!(
                text.contains("component = \"/components/"),
                "{config}: {text}"
            );
            // The pod's secrets, where a test can make them (private, as the pod mounts them).
            let secrets = tempfile::tempdir().unwrap();
            let mut text = text.replace("/components/bank_payments.wasm", "COMPONENT");
            for secret in [
                "/etc/sluice/secrets/redis/password",
                "/etc/sluice/secrets/admin/token",
                "/etc/sluice/secrets/redis/ca.crt",
            ] {
                // A CA only where the overlay talks TLS.
                if secret.ends_with("ca.crt") && !text.contains(secret) {
                    continue;
                }
                assert!(text.contains(secret), "{config}: {secret}");
                let file = secrets.path().join(secret.rsplit('/').next().unwrap());
                std::fs::write(&file, "not-a-real-secret").unwrap();
                std::fs::set_permissions(
                    &file,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
                .unwrap();
                text = text.replace(secret, &file.display().to_string());
            }
            let file = parse(&text).unwrap_or_else(|e| panic!("{config}: {e}"));
            let globals = &file.globals;
            assert_eq!(
                globals.admin,
                Some(Some("0.0.0.0:9187".parse().unwrap())),
                "{config}"
            );
            assert!(
                file.subscriptions
                    .iter()
                    .all(|s| s.overrides.consumer.is_none()),
                "{config}: a fixed consumer name"
            );
            let shutdown = globals.shutdown_timeout.expect("shutdown_timeout");
            assert!(
                shutdown + Duration::from_secs(10) <= Duration::from_secs(grace),
                "{config}: shutdown_timeout {shutdown:?} leaves no room in the {grace} s grace period"
            );
            // Below the emptyDir's mount, which Kubernetes makes 0777: the host makes this
            // directory 0700 itself.
            assert_eq!(
                globals.cache_dir.as_deref(),
                Some(Path::new("/var/cache/sluice/compiled")),
                "{config}"
            );
        }
    }
}
