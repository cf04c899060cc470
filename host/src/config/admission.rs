//! What may hold a subscription's reads back, shared by every host of its group through Redis:
//! the `rate_limit` token bucket and the `circuit_breaker`, each checked within the bounds that
//! keep the shared state meaningful (see `crate::pipeline::admit`).

use std::time::Duration;

use super::check::Validator;
use super::raw::{RawBreaker, RawRateLimit};
use super::{CircuitBreaker, ConfigError, DEFAULT_PROBES, MAX_RATE_PER_SECOND, RateLimit};

/// `circuit_breaker = { failure_rate, window, min_deliveries, open_for, probes }`: a rate in
/// (0, 1], a window and an open time of a second to a day, at least one delivery, 1 to 100
/// probes (default 3).
pub(super) fn breaker(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawBreaker,
) -> Result<CircuitBreaker, ConfigError> {
    let rate = raw.failure_rate;
    if !rate.is_finite() || rate <= 0.0 || rate > 1.0 {
        return Err(v.invalid(
            &key("circuit_breaker.failure_rate"),
            &rate.to_string(),
            "must be above 0 and at most 1 (the share of failed deliveries that opens it)",
        ));
    }
    let span = |name: &str, text: &str| -> Result<Duration, ConfigError> {
        let d = v.duration(&key(name), text)?;
        if d < Duration::from_secs(1) || d > Duration::from_secs(86_400) {
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
    let probes = raw.probes.unwrap_or(DEFAULT_PROBES);
    if !(1..=100).contains(&probes) {
        return Err(v.invalid(
            &key("circuit_breaker.probes"),
            &probes.to_string(),
            "must be between 1 and 100",
        ));
    }
    Ok(CircuitBreaker {
        failure_rate: rate,
        window,
        min_deliveries: raw.min_deliveries,
        open_for,
        probes,
    })
}

/// `rate_limit = { per_second, burst }`: a rate above 0 and at most
/// [`MAX_RATE_PER_SECOND`], a burst of at least 1 (default: a tenth of a second's worth,
/// at least 1) and at most that maximum too.
pub(super) fn rate_limit(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: &RawRateLimit,
) -> Result<RateLimit, ConfigError> {
    let max = MAX_RATE_PER_SECOND;
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
    Ok(RateLimit {
        per_second: rate,
        burst,
    })
}
