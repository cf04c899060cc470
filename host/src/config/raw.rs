//! The raw shape of a config file, as serde reads it: every table refuses unknown keys
//! (`deny_unknown_fields`), so a misspelt key is an error that names it. Values stay as
//! written (durations and sizes as text); `file` and the checking steps turn them into the
//! typed configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::Isolation;
use super::telemetry::RawTelemetry;

/// A whole file: the keys for the host and for every subscription of the file at its top, then
/// the `[[subscription]]` tables. The order of the fields is the order the parser lists them in
/// its unknown-key error (which the reference's test reads).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) redis: Option<RawRedis>,
    pub(super) redis_username: Option<String>,
    pub(super) redis_password_file: Option<PathBuf>,
    pub(super) redis_ca_file: Option<PathBuf>,
    pub(super) redis_cert_file: Option<PathBuf>,
    pub(super) redis_key_file: Option<PathBuf>,
    pub(super) consumer: Option<String>,
    pub(super) cache_dir: Option<PathBuf>,
    pub(super) shutdown_timeout: Option<String>,
    pub(super) admin: Option<String>,
    pub(super) admin_token_file: Option<PathBuf>,
    pub(super) admin_token_env: Option<String>,
    pub(super) admin_read_token_file: Option<PathBuf>,
    pub(super) admin_read_token_env: Option<String>,
    pub(super) rollout_key_file: Option<PathBuf>,
    pub(super) rollout_key_env: Option<String>,
    pub(super) admin_max_upload: Option<String>,
    pub(super) cache_max_size: Option<String>,
    pub(super) max_instances: Option<u64>,
    pub(super) metrics_per_subscription: Option<bool>,
    pub(super) doorbell: Option<String>,
    pub(super) admin_open_on_loopback: Option<bool>,
    pub(super) admin_read_only: Option<bool>,
    pub(super) watch_interval: Option<String>,
    pub(super) telemetry: Option<RawTelemetry>,
    #[serde(default, rename = "subscription")]
    pub(super) subscriptions: Vec<RawSubscription>,
}

/// `redis = "url"`, or `redis = ["url", ...]`: a cluster's seed nodes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawRedis {
    One(String),
    Seeds(Vec<String>),
}

/// One `[[subscription]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubscription {
    pub(super) component: PathBuf,
    pub(super) redis: Option<RawRedis>,
    pub(super) redis_username: Option<String>,
    pub(super) redis_password_file: Option<PathBuf>,
    pub(super) redis_ca_file: Option<PathBuf>,
    pub(super) redis_cert_file: Option<PathBuf>,
    pub(super) redis_key_file: Option<PathBuf>,
    pub(super) stream: Option<String>,
    pub(super) group: Option<String>,
    pub(super) consumer: Option<String>,
    pub(super) claim_min_idle: Option<String>,
    pub(super) consumer_gone_after: Option<String>,
    pub(super) dead_letter_maxlen: Option<u64>,
    pub(super) history_entries: Option<u64>,
    pub(super) retention: Option<RawRetention>,
    pub(super) dead_letter_retention: Option<RawDeadLetterRetention>,
    pub(super) block: Option<String>,
    pub(super) count: Option<usize>,
    pub(super) dead_letter: Option<String>,
    pub(super) max_retries: Option<u32>,
    pub(super) payload_field: Option<String>,
    pub(super) max_delay: Option<String>,
    pub(super) failure_backoff: Option<RawBackoff>,
    pub(super) partitions: Option<u32>,
    pub(super) delayed_retry: Option<RawDelayedRetry>,
    pub(super) ordered_by: Option<RawOrderedBy>,
    pub(super) dedupe: Option<RawOrderedBy>,
    pub(super) schedule: Option<Vec<super::schedule::RawSchedule>>,
    pub(super) max_in_flight_per_key: Option<u32>,
    pub(super) retry_lane: Option<bool>,
    pub(super) retry_lane_slots: Option<usize>,
    pub(super) other_groups_see_retries: Option<bool>,
    pub(super) rate_limit: Option<RawRateLimit>,
    pub(super) circuit_breaker: Option<RawBreaker>,
    pub(super) canary: Option<RawCanary>,
    pub(super) min_delay: Option<String>,
    pub(super) max_in_flight: Option<usize>,
    pub(super) isolation: Option<Isolation>,
    pub(super) recycle_after: Option<u64>,
    pub(super) handler_timeout: Option<String>,
    pub(super) memory_limit: Option<String>,
    pub(super) host_memory_limit: Option<String>,
    pub(super) log_lines: Option<u32>,
    pub(super) log_bytes: Option<String>,
    pub(super) max_entry_bytes: Option<String>,
    pub(super) fuel: Option<u64>,
    #[serde(default)]
    pub(super) allowed_outbound_hosts: Vec<String>,
    pub(super) http_timeout: Option<String>,
    pub(super) idempotency_header: Option<String>,
    pub(super) effects: Option<String>,
    #[serde(default)]
    pub(super) journal_statuses: Option<Vec<String>>,
    pub(super) journal_max_response_bytes: Option<String>,
    pub(super) journal_max_entry_bytes: Option<String>,
    pub(super) journal_max_calls: Option<u32>,
    pub(super) poison_check: Option<bool>,
    #[serde(default)]
    pub(super) config: BTreeMap<String, toml::Value>,
}

/// `rate_limit = { per_second, burst }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimit {
    pub(super) per_second: f64,
    pub(super) burst: Option<u64>,
}

/// `circuit_breaker = { failure_rate, window, min_deliveries, open_for, probes }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    pub(super) failure_rate: f64,
    pub(super) window: String,
    pub(super) min_deliveries: u64,
    pub(super) open_for: String,
    pub(super) probes: Option<u32>,
}

/// `canary = { window, ..., min_deliveries }`, each key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCanary {
    pub(super) window: Option<String>,
    pub(super) failure_rate_increase: Option<f64>,
    pub(super) dead_letter_rate_increase: Option<f64>,
    pub(super) retry_rate_increase: Option<f64>,
    pub(super) p99_ratio: Option<f64>,
    pub(super) p99_slack: Option<String>,
    pub(super) min_deliveries: Option<u64>,
}

/// `failure_backoff = { initial, max }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackoff {
    pub(super) initial: String,
    pub(super) max: String,
}

/// `retention = { keep_acked = "1h", max_len = 1000000, every = "10s" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetention {
    pub(super) keep_acked: Option<String>,
    pub(super) max_len: Option<u64>,
    pub(super) every: Option<String>,
}

/// `dead_letter_retention = { keep = "30d" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeadLetterRetention {
    pub(super) keep: String,
}

/// `delayed_retry = "none"`, or a table naming the sorted set.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawDelayedRetry {
    Keyword(String),
    Set(RawDurableZset),
}

/// `delayed_retry = { key = "...", ttl = "..." }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDurableZset {
    pub(super) key: String,
    pub(super) ttl: Option<String>,
}

/// Whether `text` has the raw shape of a config file; the parser's own message when not (the
/// reference's test reads the keys it accepts from it).
#[cfg(test)]
pub(super) fn parse_str(text: &str) -> Result<(), String> {
    toml::from_str::<RawConfig>(text)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `ordered_by = "none"`, or a table naming where the key is (checked key by key in
/// `overrides.rs`, so a misspelt key is named rather than "no variant matched").
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawOrderedBy {
    Keyword(String),
    Key(toml::Table),
}
