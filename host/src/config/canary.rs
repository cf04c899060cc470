//! How a canary of a subscription is judged (`canary = { ... }`): its window, how much more
//! of the candidate's attempts than the incumbent's may fail, dead-letter or retry, and how much
//! slower its p99 may be. Every key is optional and bounded; the rest keep [`Canary`]'s
//! defaults.

use std::time::Duration;

use super::check::Validator;
use super::raw::RawCanary;
use super::{Canary, ConfigError};

/// `canary = { window, failure_rate_increase, dead_letter_rate_increase, retry_rate_increase,
/// p99_ratio, p99_slack, min_deliveries }`, each optional: a window of 10 s to a day, increases
/// in [0, 1], a ratio of at least 1, a slack up to a minute, 1 to a million attempts.
pub(super) fn canary(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawCanary,
) -> Result<Canary, ConfigError> {
    let mut c = Canary::default();
    if let Some(text) = &raw.window {
        c.window = v.duration(&key("canary.window"), text)?;
        if c.window < Duration::from_secs(10) || c.window > Duration::from_secs(86_400) {
            return Err(v.invalid(&key("canary.window"), text, "must be between 10s and 1 day"));
        }
    }
    increases(v, key, raw, &mut c)?;
    p99(v, key, raw, &mut c)?;
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

/// The three `*_rate_increase` keys, each in [0, 1].
fn increases(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawCanary,
    c: &mut Canary,
) -> Result<(), ConfigError> {
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
    Ok(())
}

/// `p99_ratio` (1 to 1000) and `p99_slack` (at most a minute).
fn p99(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawCanary,
    c: &mut Canary,
) -> Result<(), ConfigError> {
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
        if c.p99_slack > Duration::from_secs(60) {
            return Err(v.invalid(&key("canary.p99_slack"), text, "must be at most 1m"));
        }
    }
    Ok(())
}
