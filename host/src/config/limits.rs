//! A subscription's limits and grants: deliveries at once, instance reuse, time, memory, log
//! and fuel budgets, the largest entry, and the outbound-HTTP allow-list with its timeout. Each
//! is checked against its floor; a request may not outlive its delivery.

use super::allow::{AllowedHost, EntryError, JournalPolicy, OutboundHttp, parse_status};
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
    limits.outbound_http.journal = journal(v, key, sub)?;
    if sub.poison_check == Some(true) {
        let http = &limits.outbound_http;
        // Unset effects is the component's to say: the plan checks what it resolves to.
        if !http.allowed.is_empty() && sub.effects.as_deref() == Some("none") {
            return Err(v.invalid(
                &key("poison_check"),
                "true",
                "needs effects = \"journal\" on a subscription that may call out: the second run makes no call over the network, it answers from the journal",
            ));
        }
        limits.poison_check = true;
    }
    Ok(limits)
}

/// The most one call's recorded response may be set to.
const MAX_JOURNAL_RESPONSE: u64 = 16 * 1024 * 1024;
/// The most one entry's journal may be set to hold.
const MAX_JOURNAL_ENTRY: u64 = 64 * 1024 * 1024;
/// The most calls one entry's journal may be set to hold.
const MAX_JOURNAL_CALLS: u32 = 10_000;

/// `effects = "journal"` and its `journal_*` bounds (each capped: no configuration makes an
/// entry's journal unbounded). With `effects` unset the bounds are kept for a component that
/// asks for the journal (the plan refuses them when none does); `"none"` refuses them.
fn journal(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    sub: &RawSubscription,
) -> Result<Option<JournalPolicy>, ConfigError> {
    match sub.effects.as_deref() {
        None if stray_journal_key(sub).is_none() => return Ok(None),
        None | Some("journal") => {}
        Some("none") => {
            return match stray_journal_key(sub) {
                Some((name, value)) => Err(v.invalid(
                    &key(name),
                    &value,
                    "means nothing with effects = \"none\" (set effects = \"journal\")",
                )),
                None => Ok(None),
            };
        }
        Some(other) => {
            return Err(v.invalid(&key("effects"), other, "must be \"journal\" or \"none\""));
        }
    }
    let mut policy = JournalPolicy::default();
    if let Some(statuses) = &sub.journal_statuses {
        policy.statuses = journal_statuses(v, key, statuses)?;
    }
    let capped = |name: &str, text: &Option<String>, default: u64, most: u64| {
        let Some(text) = text else {
            return Ok(default);
        };
        let n = v.size_at_least(&key(name), text, 1, "1 byte")?;
        if n > most {
            return Err(v.invalid(
                &key(name),
                text,
                &format!("must be at most {}", bytesize::ByteSize(most)),
            ));
        }
        Ok(n)
    };
    policy.max_response_bytes = capped(
        "journal_max_response_bytes",
        &sub.journal_max_response_bytes,
        policy.max_response_bytes,
        MAX_JOURNAL_RESPONSE,
    )?;
    policy.max_entry_bytes = capped(
        "journal_max_entry_bytes",
        &sub.journal_max_entry_bytes,
        policy.max_entry_bytes,
        MAX_JOURNAL_ENTRY,
    )?;
    if let Some(n) = sub.journal_max_calls {
        if n == 0 || n > MAX_JOURNAL_CALLS {
            return Err(v.invalid(
                &key("journal_max_calls"),
                &n.to_string(),
                &format!("must be 1 to {MAX_JOURNAL_CALLS}"),
            ));
        }
        policy.max_calls = n;
    }
    Ok(Some(policy))
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
        http.idempotency_header = idempotency_header(v, &key("idempotency_header"), name)?;
    }
    Ok(())
}

/// Headers that say how a request travels, whom it is from, which trace it is in, or on what
/// condition and in which form it asks: a key put there would break the request or change
/// what it means.
const NOT_AN_IDEMPOTENCY_HEADER: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "authorization",
    "proxy-authorization",
    "proxy-connection",
    "cookie",
    "traceparent",
    "tracestate",
    "baggage",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "range",
    "accept",
    "accept-encoding",
    "accept-language",
    "origin",
    "date",
    "via",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// `idempotency_header`: a header name that is not one of the above, or `"none"`.
fn idempotency_header(
    v: &Validator<'_>,
    key: &str,
    name: &str,
) -> Result<Option<http::HeaderName>, ConfigError> {
    if name == "none" {
        return Ok(None);
    }
    let header = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        v.invalid(
            key,
            name,
            "must be an HTTP header name (letters, digits and `-`), or \"none\"",
        )
    })?;
    if NOT_AN_IDEMPOTENCY_HEADER.contains(&header.as_str()) {
        return Err(v.invalid(
            key,
            name,
            "is a header the request needs for something else; name one of its own (e.g. idempotency-key)",
        ));
    }
    Ok(Some(header))
}

/// A `journal_*` key set, if any, with its value as written.
fn stray_journal_key(sub: &RawSubscription) -> Option<(&'static str, String)> {
    [
        (
            "journal_statuses",
            sub.journal_statuses.as_ref().map(|s| s.join(", ")),
        ),
        (
            "journal_max_response_bytes",
            sub.journal_max_response_bytes.clone(),
        ),
        (
            "journal_max_entry_bytes",
            sub.journal_max_entry_bytes.clone(),
        ),
        (
            "journal_max_calls",
            sub.journal_max_calls.map(|n| n.to_string()),
        ),
    ]
    .into_iter()
    .find_map(|(name, value)| value.map(|value| (name, value)))
}

/// `journal_statuses`: classes (`"2xx"`) and statuses (`"409"`), at least one, none a retry
/// should ask again (a recorded answer is replayed on every later attempt, never asked again).
fn journal_statuses(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    statuses: &[String],
) -> Result<Vec<(u16, u16)>, ConfigError> {
    let ranges = statuses
        .iter()
        .map(|s| {
            parse_status(s).ok_or_else(|| {
                v.invalid(
                    &key("journal_statuses"),
                    s,
                    "must be a status class like \"2xx\" or a status like \"409\"",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let transient = |(lo, hi): &(u16, u16)| {
        *hi >= 500 || (*lo..=*hi).contains(&408) || (*lo..=*hi).contains(&429)
    };
    if ranges.is_empty() || ranges.iter().any(transient) {
        return Err(v.invalid(
            &key("journal_statuses"),
            &statuses.join(", "),
            "must name at least one status, and none a retry should ask again (5xx, 408, 429): a recorded answer is replayed on every later attempt",
        ));
    }
    Ok(ranges)
}
