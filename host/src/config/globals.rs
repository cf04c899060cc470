//! The keys of a file that apply to the whole host (`cache_dir`, `shutdown_timeout`, `admin`,
//! `doorbell`, `[telemetry]`, ...): checked per file into [`Globals`], then merged across the
//! files of one invocation, where two files that both set a key must agree.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::check::Validator;
use super::raw::RawConfig;
use super::telemetry::Telemetry;
use super::{ConfigError, DoorbellMode, MAX_INSTANCES_CEILING, TokenSource, admin};

/// The settings of one file that apply to the whole host; `None` where the file is silent.
#[derive(Debug, Default)]
pub(super) struct Globals {
    pub(super) cache_dir: Option<PathBuf>,
    pub(super) shutdown_timeout: Option<Duration>,
    pub(super) admin: Option<Option<SocketAddr>>,
    pub(super) admin_token: Option<TokenSource>,
    pub(super) admin_read_token: Option<TokenSource>,
    pub(super) rollout_key: Option<TokenSource>,
    pub(super) admin_max_upload: Option<u64>,
    pub(super) cache_max_size: Option<u64>,
    pub(super) max_instances: Option<u32>,
    pub(super) metrics_per_subscription: Option<bool>,
    pub(super) doorbell: Option<DoorbellMode>,
    pub(super) admin_open_on_loopback: Option<bool>,
    pub(super) admin_read_only: Option<bool>,
    pub(super) watch_interval: Option<Option<Duration>>,
    pub(super) telemetry: Option<Telemetry>,
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
            &mut self.admin_read_token,
            other.admin_read_token,
            "admin_read_token_file/admin_read_token_env",
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

/// `value` into `slot`, unless `slot` already holds a different one.
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

/// The host-wide keys of one file, each checked; `base` is the file's folder, which relative
/// paths start from.
pub(super) fn globals(
    v: &Validator<'_>,
    base: &Path,
    raw: &RawConfig,
) -> Result<Globals, ConfigError> {
    let admin = admin::address(v, raw.admin.as_deref())?;
    let admin_token = admin::secret_source(
        v,
        base,
        "admin_token",
        (&raw.admin_token_file, &raw.admin_token_env),
    )?;
    let admin_read_token = admin::secret_source(
        v,
        base,
        "admin_read_token",
        (&raw.admin_read_token_file, &raw.admin_read_token_env),
    )?;
    let rollout_key = admin::secret_source(
        v,
        base,
        "rollout_key",
        (&raw.rollout_key_file, &raw.rollout_key_env),
    )?;
    let watch_interval = watch_interval(v, raw.watch_interval.as_deref())?;
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
        admin_read_token,
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
        max_instances: raw.max_instances.map(|n| max_instances(v, n)).transpose()?,
        metrics_per_subscription: raw.metrics_per_subscription,
        doorbell: raw
            .doorbell
            .as_deref()
            .map(|t| doorbell(v, t))
            .transpose()?,
        admin_open_on_loopback: raw.admin_open_on_loopback,
        admin_read_only: raw.admin_read_only,
        watch_interval,
        telemetry,
    })
}

/// `watch_interval`: a duration longer than zero, or `"off"` (`Some(None)`).
fn watch_interval(
    v: &Validator<'_>,
    text: Option<&str>,
) -> Result<Option<Option<Duration>>, ConfigError> {
    Ok(match text {
        None => None,
        Some("off") => Some(None),
        Some(text) => Some(Some(v.positive("watch_interval", text, "or \"off\"")?)),
    })
}

/// `doorbell`: `auto`, `poll` or `off`.
fn doorbell(v: &Validator<'_>, text: &str) -> Result<DoorbellMode, ConfigError> {
    match text {
        "auto" => Ok(DoorbellMode::Auto),
        "poll" => Ok(DoorbellMode::Poll),
        "off" => Ok(DoorbellMode::Off),
        _ => Err(v.invalid("doorbell", text, "write \"auto\", \"poll\" or \"off\"")),
    }
}

/// `max_instances`: at least one, and no more than a pool's counters can hold.
fn max_instances(v: &Validator<'_>, n: u64) -> Result<u32, ConfigError> {
    match u32::try_from(n) {
        Ok(n) if (1..=MAX_INSTANCES_CEILING).contains(&n) => Ok(n),
        _ => Err(v.invalid(
            "max_instances",
            &n.to_string(),
            &format!("must be between 1 and {MAX_INSTANCES_CEILING}"),
        )),
    }
}
