//! One `[[subscription]]` table, checked into a [`SubscriptionConfig`]: its component must
//! exist, its keys must agree among themselves (the retry lane's), and each part is checked by
//! its own step (limits, Redis, overrides, retention, admission, canary). What its file's top
//! level says is inherited unless the table says otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::admission::{breaker, rate_limit};
use super::canary::canary;
use super::check::Validator;
use super::limits::limits;
use super::overrides::overrides;
use super::raw::RawSubscription;
use super::redis_access::subscription_redis;
use super::retention::{dead_letter_keep, dead_letter_maxlen, history_entries, retention};
use super::{Canary, ConfigError, DEFAULT_MIN_DELAY, RedisAccess, SubscriptionConfig};

/// What a file's top level gives each of its subscriptions unless they say otherwise.
pub(super) struct Shared<'a> {
    /// `redis`, resolved.
    pub(super) redis: Option<String>,
    /// The `redis_*` keys, checked.
    pub(super) redis_access: RedisAccess,
    /// `consumer`.
    pub(super) consumer: Option<&'a str>,
}

/// The `i`th subscription of the file `v` reads, whose folder is `base`: every key checked in
/// turn, the first error returned.
pub(super) fn subscription(
    v: &Validator<'_>,
    base: &Path,
    i: usize,
    sub: RawSubscription,
    shared: &Shared<'_>,
) -> Result<SubscriptionConfig, ConfigError> {
    let key = |name: &str| format!("subscription[{i}].{name}");
    let component = component(v, base, &sub.component)?;
    let limits = limits(v, &key, &sub)?;
    retry_lane(v, &key, &sub, limits.max_in_flight)?;
    let min_delay = min_delay(v, &key, sub.min_delay.as_deref())?;
    let consumer_gone_after = consumer_gone_after(v, &key, sub.consumer_gone_after.as_deref())?;
    let inherited = (shared.redis.as_ref(), &shared.redis_access);
    let (redis, redis_access) = subscription_redis(v, base, &key, &sub, inherited)?;
    let overrides = overrides(v, &key, &sub, shared.consumer)?;
    let values = values(v, &key, sub.config)?;
    let retention = sub
        .retention
        .as_ref()
        .map(|r| retention(v, &key, r))
        .transpose()?;
    let dead_letter_keep = sub
        .dead_letter_retention
        .as_ref()
        .map(|r| dead_letter_keep(v, &key, r))
        .transpose()?;
    let rate_limit = sub
        .rate_limit
        .as_ref()
        .map(|r| rate_limit(v, &key, r))
        .transpose()?;
    let circuit_breaker = sub
        .circuit_breaker
        .as_ref()
        .map(|b| breaker(v, &key, b))
        .transpose()?;
    let canary = match &sub.canary {
        None => Canary::default(),
        Some(c) => canary(v, &key, c)?,
    };
    Ok(SubscriptionConfig {
        component,
        redis,
        redis_access,
        overrides,
        limits,
        values,
        consumer_gone_after,
        retention,
        dead_letter_keep,
        rate_limit,
        circuit_breaker,
        canary,
        retry_lane: sub.retry_lane,
        retry_lane_slots: sub.retry_lane_slots,
        other_groups_see_retries: sub.other_groups_see_retries.unwrap_or(false),
        min_delay,
        dead_letter_maxlen: dead_letter_maxlen(v, &key, sub.dead_letter_maxlen)?,
        history_entries: history_entries(v, &key, sub.history_entries)?,
        schedules: super::schedule::schedules(v, &key, sub.schedule.as_deref())?,
        origin: v.path.to_owned(),
    })
}

/// `component`, against the file's folder: it must exist.
fn component(v: &Validator<'_>, base: &Path, component: &Path) -> Result<PathBuf, ConfigError> {
    let component = base.join(component);
    if !component.is_file() {
        return Err(ConfigError::MissingComponent {
            origin: v.path.to_owned(),
            component,
        });
    }
    Ok(component)
}

/// `retry_lane`, `retry_lane_slots` and `other_groups_see_retries` among themselves: slots
/// only with a lane, and fewer than `max_in_flight`; other groups only see retries without one.
fn retry_lane(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    sub: &RawSubscription,
    max_in_flight: usize,
) -> Result<(), ConfigError> {
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
        && n >= max_in_flight
    {
        return Err(v.invalid(
            &key("retry_lane_slots"),
            &n.to_string(),
            &format!(
                "must be less than max_in_flight ({max_in_flight}): new stream entries need at least one slot"
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
    Ok(())
}

/// `min_delay`: at least [`DEFAULT_MIN_DELAY`], which it is when not set.
fn min_delay(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    text: Option<&str>,
) -> Result<Duration, ConfigError> {
    let Some(text) = text else {
        return Ok(DEFAULT_MIN_DELAY);
    };
    let d = v.duration(&key("min_delay"), text)?;
    if d < DEFAULT_MIN_DELAY {
        return Err(v.invalid(
            &key("min_delay"),
            text,
            "must be at least 1ms: a retry that comes back at once, for ever, keeps a core and Redis busy",
        ));
    }
    Ok(d)
}

/// `consumer_gone_after`: a duration, or `"off"` (`Some(None)`).
fn consumer_gone_after(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    text: Option<&str>,
) -> Result<Option<Option<Duration>>, ConfigError> {
    Ok(match text {
        None => None,
        Some("off") => Some(None),
        Some(text) => Some(Some(v.duration(&key("consumer_gone_after"), text)?)),
    })
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
