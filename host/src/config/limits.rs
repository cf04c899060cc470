//! A subscription's limits and grants: deliveries at once, instance reuse, time, memory, log
//! and fuel budgets, the largest entry, and the outbound-HTTP allow-list with its timeout. Each
//! is checked against its floor; a request may not outlive its delivery.

use super::allow::{AllowedHost, EntryError, OutboundHttp};
use super::check::Validator;
use super::raw::RawSubscription;
use super::{ConfigError, Limits};

/// The subscription's limits and grants, each checked against its floor.
pub(super) fn limits(
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
    outbound_http(
        v,
        key,
        sub,
        &mut limits.outbound_http,
        limits.handler_timeout,
    )?;
    Ok(limits)
}

/// `allowed_outbound_hosts` and `http_timeout` into `http`: each entry parsed, and a timeout
/// longer than zero and at most `handler_timeout` (which it is when not set).
fn outbound_http(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    sub: &RawSubscription,
    http: &mut OutboundHttp,
    handler_timeout: std::time::Duration,
) -> Result<(), ConfigError> {
    for (j, entry) in sub.allowed_outbound_hosts.iter().enumerate() {
        let host: AllowedHost = entry.parse().map_err(|e: EntryError| {
            v.invalid(
                &key(&format!("allowed_outbound_hosts[{j}]")),
                entry,
                &e.to_string(),
            )
        })?;
        http.allowed.push(host);
    }
    http.timeout = handler_timeout;
    if let Some(t) = v.opt_duration(&key("http_timeout"), &sub.http_timeout)? {
        if t.is_zero() || t > handler_timeout {
            return Err(v.invalid(
                &key("http_timeout"),
                sub.http_timeout.as_deref().unwrap_or_default(),
                &format!(
                    "must be longer than 0 and at most handler_timeout ({}): a request cannot outlive its delivery",
                    humantime::format_duration(handler_timeout)
                ),
            ));
        }
        http.timeout = t;
    }
    if let Some(name) = &sub.idempotency_header {
        http.idempotency_header = if name == "none" {
            None
        } else {
            Some(http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                v.invalid(
                    &key("idempotency_header"),
                    name,
                    "must be an HTTP header name (letters, digits and `-`), or \"none\"",
                )
            })?)
        };
    }
    Ok(())
}
