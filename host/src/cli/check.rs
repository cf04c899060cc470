//! `sluice check`: everything `run` would load and resolve, checked and printed, without
//! starting anything. The plan's text is written here, from the [`Plan`] the service runs.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use sluice_descriptor::DelayedRetry;

use super::plan;
use crate::config::Isolation;
use crate::service::plan::{Plan, SubscriptionPlan};

/// `sluice check`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Redis URL for every subscription (overrides the configs).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice check`: the plan goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let plan = check(&args.paths, args.redis.as_deref()).await?;
    print!("{plan}");
    Ok(())
}

/// `sluice check`: validate everything and print the resolved plan.
pub async fn check(paths: &[PathBuf], redis: Option<&str>) -> Result<String> {
    let plan = plan(paths, redis).await?;
    // What `run` refuses at start, `check` refuses too: an unreadable or guessable token.
    if let Some(token) = &plan.admin_token {
        token.read().context("the admin token")?;
    }
    if let Some(key) = &plan.rollout_key {
        key.read().context("the rollout key")?;
    }
    Ok(render(&plan))
}

/// The plan as `sluice check` prints it: each subscription's rows, in configuration order.
fn render(plan: &Plan) -> String {
    let mut out = String::new();
    for (i, sub) in plan.subscriptions.iter().enumerate() {
        let s = &sub.stream;
        let _ = writeln!(
            out,
            "subscription {}: stream `{}`, group `{}`",
            i + 1,
            s.stream,
            s.group
        );
        write_reading(&mut out, sub);
        write_gates(&mut out, sub);
        write_retries(&mut out, sub);
        write_keys(&mut out, sub);
        write_handler(&mut out, sub);
        if i == 0 {
            row(
                &mut out,
                "admin",
                plan.admin.map_or("off".to_owned(), |a| {
                    format!("http://{a} (/metrics, /healthz, /readyz)")
                }),
            );
        }
        for warning in &sub.warnings {
            row(&mut out, "warning", warning.clone());
        }
    }
    out
}

/// One row: its name in a column, then its value.
fn row(out: &mut String, name: &str, value: String) {
    let _ = writeln!(out, "  {name:<12} {value}");
}

/// A duration as the rows write it (`1m 30s`).
fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// What is read, from where and as whom: the component, Redis (and its login), the consumer,
/// the read, and claiming.
fn write_reading(out: &mut String, sub: &SubscriptionPlan) {
    let s = &sub.stream;
    row(
        out,
        "component",
        format!(
            "{} (sha256 {})",
            sub.component.path().display(),
            sub.component.digest().short()
        ),
    );
    row(
        out,
        "redis",
        sub.redis
            .as_deref()
            .map(crate::store::redis_conn::redact)
            .unwrap_or_else(|| "private dev redis-server (.sluice/dev-redis)".to_owned()),
    );
    if let Some(access) = render_access(&sub.redis_access) {
        row(out, "redis login", access);
    }
    row(out, "consumer", sub.consumer.clone());
    row(
        out,
        "read",
        format!(
            "own pending entries first, then XREADGROUP COUNT {} BLOCK {}",
            s.count,
            human(s.block)
        ),
    );
    row(
        out,
        "claiming",
        match (s.claim_min_idle, sub.consumer_gone_after) {
            (Some(d), _) => format!("XAUTOCLAIM entries idle for at least {}", human(d)),
            (None, Some(gone)) => format!(
                "no; takes over the pending entries of consumers idle for {}",
                human(gone)
            ),
            (None, None) => "no".to_owned(),
        },
    );
}

/// What the credentials and TLS files are (file names only, never a secret); `None` when
/// there are none.
fn render_access(access: &crate::config::RedisAccess) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(user) = &access.username {
        parts.push(format!("user {user}"));
    }
    if let Some(path) = &access.password_file {
        parts.push(format!("password from {}", path.display()));
    }
    if let Some(path) = &access.ca_file {
        parts.push(format!("TLS trusting {}", path.display()));
    }
    if let Some((cert, _)) = &access.client_cert {
        parts.push(format!("client certificate {}", cert.display()));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// What holds deliveries back for the whole group: the rate limit and the circuit breaker.
fn write_gates(out: &mut String, sub: &SubscriptionPlan) {
    let s = &sub.stream;
    if let Some(limit) = &sub.rate_limit {
        row(
            out,
            "rate limit",
            format!(
                "{} deliveries a second for the whole group, every host together (burst {}; bucket `{}`)",
                limit.per_second,
                limit.burst,
                crate::store::keys::rate_key(&s.stream, &s.group)
            ),
        );
    }
    if let Some(b) = &sub.circuit_breaker {
        row(
            out,
            "circuit breaker",
            format!(
                "opens when {}% of at least {} deliveries in {} failed (traps, limits, downstream down); stays open {}, then {} probes",
                b.failure_rate * 100.0,
                b.min_deliveries,
                human(b.window),
                human(b.open_for),
                b.probes
            ),
        );
    }
}

/// How retries wait and come back, and the backoff after failures.
fn write_retries(out: &mut String, sub: &SubscriptionPlan) {
    let s = &sub.stream;
    let retries = match &s.delayed_retry {
        Some(DelayedRetry::DurableZset { key, ttl }) => format!(
            "wait in sorted set `{key}` (ttl {}), then {}",
            ttl.map(human).unwrap_or_else(|| "none".to_owned()),
            if sub.retry_lane {
                format!(
                    "go to the group's own retry lane `{}`, read before the stream ({} of {} handler slots kept for them)",
                    crate::store::keys::lane_key(key),
                    sub.retry_lane_slots,
                    sub.limits.max_in_flight
                )
            } else if sub.other_groups_see_retries {
                "go back to the stream's tail, where other groups read them too (other_groups_see_retries)".to_owned()
            } else {
                "go back to the stream's tail (refused while another group reads the stream)"
                    .to_owned()
            }
        ),
        None if s.claim_min_idle.is_some() => {
            "stay pending; XAUTOCLAIM brings them back (delay rounded up to min_idle)".to_owned()
        }
        None => "stay pending; a local timer brings them back after the delay".to_owned(),
    };
    row(
        out,
        "retries",
        format!(
            "max {}; each waits at least {}; retries {retries}",
            s.max_retries,
            human(sub.min_delay)
        ),
    );
    row(
        out,
        "failures",
        format!(
            "backoff {} doubling up to {}",
            human(s.failure_backoff.initial),
            human(s.failure_backoff.max)
        ),
    );
}

/// Where what is given up on goes, how the stream is trimmed, its partitions and its payload.
fn write_keys(out: &mut String, sub: &SubscriptionPlan) {
    let s = &sub.stream;
    row(
        out,
        "dead letter",
        match &s.legacy_dead_letter {
            Some(legacy) => format!(
                "`{}` (this group's own; what an earlier release left for it in `{legacy}` is moved here)",
                s.dead_letter
            ),
            None => format!("`{}`", s.dead_letter),
        },
    );
    row(
        out,
        "retention",
        match &sub.retention {
            Some(r) => format!(
                "acknowledged by every group and older than {} trimmed every {}{}; never what a group has pending or unread",
                human(r.keep_acked),
                human(r.every),
                r.max_len
                    .map(|n| format!(", sooner while longer than {n}"))
                    .unwrap_or_default()
            ),
            None => "off: the stream grows until something else trims it".to_owned(),
        },
    );
    if let Some(keep) = sub.dead_letter_keep {
        row(
            out,
            "dead letters",
            format!("kept for {}, then trimmed", human(keep)),
        );
    }
    if s.partitions > 1 {
        let parts = s.partitioned();
        row(
            out,
            "partitions",
            format!(
                "{}: streams `{}` .. `{}` (keys `<name>:{{{}:<n>}}`); producers pick one with crc32(key) % {}",
                s.partitions,
                parts[0].stream,
                parts[parts.len() - 1].stream,
                s.stream,
                s.partitions
            ),
        );
    }
    row(
        out,
        "payload",
        format!("JSON in field `{}`", s.payload_field),
    );
    row(
        out,
        "ordered by",
        match &s.ordered_by {
            Some(o) => format!(
                "{}; entries of one key wait in Redis behind the one in its turn, retries included",
                o.describe()
            ),
            None => "nothing: entries are handled concurrently whatever their key".to_owned(),
        },
    );
    row(
        out,
        "dedupe",
        match &s.dedupe {
            Some(d) => format!(
                "{}; an entry whose key's first entry was read within the window is acknowledged unhandled (every host of group `{}`)",
                d.describe(),
                s.group
            ),
            None => "none: every entry is handled".to_owned(),
        },
    );
}

/// How the handler runs: instances and limits, the network it may reach, its config values.
fn write_handler(out: &mut String, sub: &SubscriptionPlan) {
    let l = &sub.limits;
    row(
        out,
        "handler",
        format!(
            "{}, {} in flight, {} time limit, {} MiB memory",
            match l.isolation {
                Isolation::Reuse => format!("reuse instances (recycle after {})", l.recycle_after),
                Isolation::PerDelivery => "fresh instance per delivery".to_owned(),
            },
            l.max_in_flight,
            human(l.handler_timeout),
            l.memory_limit / (1024 * 1024)
        ),
    );
    let http = &l.outbound_http;
    row(
        out,
        "network",
        if http.allowed.is_empty() {
            "none (no allowed_outbound_hosts)".to_owned()
        } else {
            let hosts: Vec<String> = http.allowed.iter().map(|h| h.to_string()).collect();
            format!(
                "HTTP to {} ({} per request)",
                hosts.join(", "),
                human(http.timeout)
            )
        },
    );
    if !http.allowed.is_empty() {
        row(out, "effects", effects(sub));
    }
    let config: Vec<String> = sub
        .values
        .iter()
        .filter(|(k, _)| !k.starts_with(sluice_descriptor::RESERVED_CONFIG_PREFIX))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !config.is_empty() {
        row(out, "config", config.join(", "));
    }
}

/// The `effects` row: the idempotency header, the journal (and who asked for it: the config
/// or the component) with its bounds, and the poison check.
fn effects(sub: &SubscriptionPlan) -> String {
    let http = &sub.limits.outbound_http;
    let keys = match &http.idempotency_header {
        Some(h) => format!("each call carries `{h}`"),
        None => "calls carry no idempotency key".to_owned(),
    };
    let asked = if sub.overrides.effects.is_some() {
        "the config"
    } else {
        "the component"
    };
    let journal = match &http.journal {
        Some(j) => format!(
            "; journaled (asked by {asked}): up to {} calls and {} an entry, {} a response",
            j.max_calls,
            bytesize::ByteSize(j.max_entry_bytes),
            bytesize::ByteSize(j.max_response_bytes)
        ),
        None => "; not journaled".to_owned(),
    };
    let poison = if sub.limits.poison_check {
        "; a failure is run again offline and dead-lettered if it repeats"
    } else {
        ""
    };
    format!("{keys}{journal}{poison}")
}
