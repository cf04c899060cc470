//! The subcommands, at the edge of the program: typed errors from the modules become
//! context-rich `anyhow` errors that say what to do.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::devredis::{DevRedis, DevRedisOptions};
use crate::plan::Plan;
use crate::runtime::Runtime;
use crate::service::Service;

/// Where the private dev Redis keeps its data.
pub const DEV_REDIS_DIR: &str = ".sluice/dev-redis";

async fn plan(paths: &[PathBuf], redis: Option<&str>) -> Result<Plan> {
    if paths.is_empty() {
        anyhow::bail!("give at least one config (.toml) or component (.wasm)");
    }
    let config = Config::load(paths).context("invalid configuration")?;
    let runtime = Runtime::new(
        Some(&config.cache_dir),
        crate::runtime::RuntimeOptions::for_config(&config),
    )
    .context("cannot start the WebAssembly runtime")?;
    Plan::build(&config, &runtime, redis)
        .await
        .context("cannot build the plan")
}

/// `sluice check`: validate everything and print the resolved plan.
pub async fn check(paths: &[PathBuf], redis: Option<&str>) -> Result<String> {
    let plan = plan(paths, redis).await?;
    Ok(plan.render())
}

/// `sluice run`: run every subscription until a signal, then drain and stop.
pub async fn run(paths: &[PathBuf], redis: Option<&str>) -> Result<()> {
    let plan = plan(paths, redis).await?;
    let mut dev = if plan.needs_dev_redis() {
        let dev = DevRedis::start(Path::new(DEV_REDIS_DIR), &DevRedisOptions::default())
            .context("cannot start the private dev Redis")?;
        Some(dev)
    } else {
        None
    };
    let dev_url = dev.as_ref().map(DevRedis::url);
    let service = Service::new(plan);
    let stop = CancellationToken::new();
    let dev_pid = dev.as_ref().and_then(DevRedis::pid);
    crate::shutdown::on_signals(stop.clone(), move || {
        if let Some(pid) = dev_pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        std::process::exit(130);
    });
    let result = service.run(dev_url, stop).await;
    if let Some(dev) = dev.as_mut() {
        dev.stop();
    }
    match result {
        Ok(()) => Ok(()),
        Err(err @ crate::service::RunError::Abandoned(_)) => {
            Err(err).context("the host did not stop cleanly")
        }
        Err(err) => Err(err).context("the host could not start"),
    }
}

/// The Redis URL for commands that only talk to Redis: `--redis`, else the subscription's own,
/// else a dev server started by an earlier `sluice run` in this directory.
fn redis_url_for(configured: Option<&str>) -> Result<String> {
    if let Some(url) = configured {
        return Ok(url.to_owned());
    }
    crate::devredis::running_url(Path::new(DEV_REDIS_DIR)).context(
        "no Redis URL is configured and no dev redis-server from `sluice run` is running here; pass --redis <url>",
    )
}

/// `sluice parked`: what waits in each delayed-retry set, oldest first.
pub async fn parked(
    paths: &[PathBuf],
    redis: Option<&str>,
    stream: Option<&str>,
    json: bool,
) -> Result<String> {
    use sluice_descriptor::DelayedRetry;
    let plan = plan(paths, redis).await?;
    let mut out = String::new();
    let mut seen = 0;
    for sub in &plan.subscriptions {
        let s = &sub.stream;
        if stream.is_some_and(|name| name != s.stream) {
            continue;
        }
        let Some(DelayedRetry::DurableZset { key, .. }) = &s.delayed_retry else {
            continue;
        };
        seen += 1;
        let url = redis_url_for(sub.redis.as_deref())?;
        let client = crate::redis_conn::client(&url)?;
        let mut conn = crate::redis_conn::manager(&client).await?;
        let (entries, now_ms) = crate::delayed::member::list(&mut conn, key)
            .await
            .with_context(|| format!("cannot read the delayed set `{key}`"))?;
        if json {
            let rows: Vec<serde_json::Value> = entries
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "entry_id": e.entry_id,
                        "retry_count": e.retry_count,
                        "due_ms": e.due_ms,
                        "due": format_ms(e.due_ms),
                        "due_in_ms": e.due_ms - now_ms,
                        "origin_id": e.origin_id,
                        "fields": e.fields.iter().map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), serde_json::Value::String(String::from_utf8_lossy(v).into_owned()))).collect::<serde_json::Map<String, serde_json::Value>>(),
                    })
                })
                .collect();
            let line = serde_json::json!({
                "stream": s.stream,
                "group": s.group,
                "key": key,
                "total": entries.len(),
                "entries": rows,
            });
            out.push_str(&line.to_string());
            out.push('\n');
        } else {
            use std::fmt::Write as _;
            let _ = writeln!(out, "{key} (stream `{}`, group `{}`)", s.stream, s.group);
            if !entries.is_empty() {
                let _ = writeln!(
                    out,
                    "  {:<24} {:>5}  {:<26} {:>10}",
                    "ORIGIN ID", "RETRY", "DUE (UTC)", "DUE IN"
                );
            }
            for e in &entries {
                let left = e.due_ms - now_ms;
                let due_in = if left <= 0 {
                    "due now".to_owned()
                } else {
                    format!("{:.1}s", left as f64 / 1000.0)
                };
                let _ = writeln!(
                    out,
                    "  {:<24} {:>5}  {:<26} {:>10}",
                    e.origin_id,
                    e.retry_count,
                    format_ms(e.due_ms),
                    due_in
                );
            }
            let _ = writeln!(out, "  total: {}", entries.len());
        }
    }
    if seen == 0 {
        anyhow::bail!(
            "no subscription{} has a delayed-retry set",
            stream.map(|s| format!(" to `{s}`")).unwrap_or_default()
        );
    }
    Ok(out)
}

fn format_ms(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

/// One subscription's state, as `sluice status` reports it.
#[derive(Debug, serde::Serialize)]
struct SubscriptionStatus {
    stream: String,
    group: String,
    handler_digest: String,
    group_exists: bool,
    pending: i64,
    lag: Option<i64>,
    last_delivered_id: Option<String>,
    consumers: Vec<ConsumerStatus>,
    delayed_key: Option<String>,
    parked: Option<i64>,
    next_due_ms: Option<i64>,
    next_due_in_ms: Option<i64>,
    dead_letter: String,
    dead_letter_length: i64,
}

#[derive(Debug, serde::Serialize)]
struct ConsumerStatus {
    name: String,
    pending: i64,
    idle_ms: i64,
    /// Holds pending entries and has been idle long enough that a live host takes them over.
    gone: bool,
}

/// `sluice status`: for each subscription, the group's consumers and pending counts, parked
/// entries and the next due time, the dead-letter stream's length and the handler's digest.
pub async fn status(paths: &[PathBuf], redis: Option<&str>, json: bool) -> Result<String> {
    let plan = plan(paths, redis).await?;
    let mut rows = Vec::new();
    for sub in &plan.subscriptions {
        let s = &sub.stream;
        let url = redis_url_for(sub.redis.as_deref())?;
        let client = crate::redis_conn::client(&url)?;
        let mut conn = crate::redis_conn::manager(&client).await?;
        let group = crate::subscription::read::group_info(&mut conn, &s.stream, &s.group)
            .await
            .with_context(|| format!("XINFO GROUPS {}", s.stream))?;
        let consumers = if group.is_some() {
            crate::subscription::read::consumers(&mut conn, &s.stream, &s.group)
                .await
                .with_context(|| format!("XINFO CONSUMERS {} {}", s.stream, s.group))?
        } else {
            Vec::new()
        };
        // Gone: idle past the time after which a live host takes its entries over.
        let gone_after = sub.consumer_gone_after.or(s.claim_min_idle);
        let now_ms = crate::delayed::member::server_now_ms(&mut conn).await?;
        let delayed_key = s.delayed_retry.as_ref().map(|d| d.key().to_owned());
        let (parked, next_due_ms) = match &delayed_key {
            Some(key) => {
                let (parked, next_due_ms) = crate::delayed::member::summary(&mut conn, key).await?;
                (Some(parked), next_due_ms)
            }
            None => (None, None),
        };
        let dead_letter_length: i64 = redis::cmd("XLEN")
            .arg(&s.dead_letter)
            .query_async(&mut conn)
            .await?;
        rows.push(SubscriptionStatus {
            stream: s.stream.clone(),
            group: s.group.clone(),
            handler_digest: sub.component.digest().to_owned(),
            group_exists: group.is_some(),
            pending: group.as_ref().map_or(0, |g| g.pending),
            lag: group.as_ref().and_then(|g| g.lag),
            last_delivered_id: group.as_ref().and_then(|g| g.last_delivered_id.clone()),
            consumers: consumers
                .into_iter()
                .map(|c| ConsumerStatus {
                    gone: c.pending > 0
                        && gone_after.is_some_and(|g| c.idle_ms as u128 >= g.as_millis()),
                    name: c.name,
                    pending: c.pending,
                    idle_ms: c.idle_ms,
                })
                .collect(),
            delayed_key,
            parked,
            next_due_ms,
            next_due_in_ms: next_due_ms.map(|due| due - now_ms),
            dead_letter: s.dead_letter.clone(),
            dead_letter_length,
        });
    }
    if json {
        let mut out = String::new();
        for row in &rows {
            out.push_str(&serde_json::to_string(row)?);
            out.push('\n');
        }
        return Ok(out);
    }
    use std::fmt::Write as _;
    let mut out = String::new();
    for r in &rows {
        let _ = writeln!(
            out,
            "stream `{}`, group `{}` (handler sha256 {})",
            r.stream,
            r.group,
            &r.handler_digest[..12]
        );
        if !r.group_exists {
            let _ = writeln!(
                out,
                "  group does not exist yet (created when a host starts)"
            );
        }
        let lag = r.lag.map_or("unknown".to_owned(), |l| l.to_string());
        let _ = writeln!(
            out,
            "  pending {}, unread {lag}, last delivered {}",
            r.pending,
            r.last_delivered_id.as_deref().unwrap_or("-")
        );
        for c in &r.consumers {
            let _ = writeln!(
                out,
                "  consumer {:<28} pending {:>6}  idle {:.1}s{}",
                c.name,
                c.pending,
                c.idle_ms as f64 / 1000.0,
                if c.gone {
                    "  GONE: holds pending entries; a running host takes them over"
                } else {
                    ""
                }
            );
        }
        match (&r.delayed_key, r.parked) {
            (Some(key), Some(parked)) => {
                let next = r.next_due_in_ms.map_or("none".to_owned(), |ms| {
                    if ms <= 0 {
                        "due now".to_owned()
                    } else {
                        format!("in {:.1}s", ms as f64 / 1000.0)
                    }
                });
                let _ = writeln!(out, "  parked {parked} in `{key}`, next due {next}");
            }
            _ => {
                let _ = writeln!(out, "  no delayed-retry set");
            }
        }
        let _ = writeln!(
            out,
            "  dead letters {} in `{}`",
            r.dead_letter_length, r.dead_letter
        );
    }
    Ok(out)
}

/// What `sluice swap` asks a host's admin API to do.
#[derive(Debug, Clone)]
pub struct SwapRequest {
    /// The admin API's base URL, e.g. `http://127.0.0.1:9187`.
    pub admin: String,
    /// The subscription's stream.
    pub stream: String,
    /// Its group; found from the host's list when there is only one for the stream.
    pub group: Option<String>,
    /// The new component, or `None` to roll back.
    pub component: Option<PathBuf>,
    /// Accept a descriptor naming another stream or group.
    pub force: bool,
    /// The bearer token, if the host wants one.
    pub token: Option<String>,
}

/// `sluice swap`: send a new component (or a rollback) to a running host's admin API.
pub async fn swap(request: SwapRequest) -> Result<String> {
    tokio::task::spawn_blocking(move || swap_blocking(&request))
        .await
        .context("the swap request was interrupted")?
}

/// Refuse to send a token in the clear beyond this machine: over plain HTTP only to loopback.
fn token_may_travel(admin: &str) -> Result<()> {
    let uri: axum::http::Uri = admin
        .parse()
        .with_context(|| format!("`{admin}` is not a URL"))?;
    if uri.scheme_str() == Some("https") {
        return Ok(());
    }
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(());
    }
    anyhow::bail!(
        "refusing to send the admin token over plain HTTP to {host}: use https:// for a host beyond this machine (or an SSH tunnel to its loopback)"
    )
}

fn swap_blocking(request: &SwapRequest) -> Result<String> {
    if request.token.is_some() {
        token_may_travel(&request.admin)?;
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let base = request.admin.trim_end_matches('/');
    let group = match &request.group {
        Some(group) => group.clone(),
        None => {
            let mut get = agent.get(format!("{base}/v1/subscriptions"));
            if let Some(token) = &request.token {
                get = get.header("Authorization", &format!("Bearer {token}"));
            }
            let mut response = get
                .call()
                .with_context(|| format!("cannot reach the admin API at {base}"))?;
            let text = response
                .body_mut()
                .read_to_string()
                .context("unexpected answer from the admin API")?;
            let list: serde_json::Value =
                serde_json::from_str(&text).context("unexpected answer from the admin API")?;
            let groups: Vec<String> = list
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["stream"] == request.stream.as_str())
                .filter_map(|s| s["group"].as_str().map(str::to_owned))
                .collect();
            match groups.as_slice() {
                [group] => group.clone(),
                [] => anyhow::bail!(
                    "the host at {base} has no subscription to stream `{}`",
                    request.stream
                ),
                _ => anyhow::bail!(
                    "the host at {base} reads stream `{}` with several groups ({}); pass --group",
                    request.stream,
                    groups.join(", ")
                ),
            }
        }
    };
    let encode = |s: &str| {
        s.replace('%', "%25")
            .replace('/', "%2F")
            .replace('{', "%7B")
            .replace('}', "%7D")
    };
    let path = format!(
        "{base}/v1/subscriptions/{}/{}",
        encode(&request.stream),
        encode(&group)
    );
    let auth = request.token.as_ref().map(|t| format!("Bearer {t}"));
    let response = match &request.component {
        Some(component) => {
            let bytes = std::fs::read(component)
                .with_context(|| format!("cannot read {}", component.display()))?;
            let mut put = agent.put(format!(
                "{path}/handler{}",
                if request.force { "?force=true" } else { "" }
            ));
            if let Some(auth) = &auth {
                put = put.header("Authorization", auth);
            }
            put.send(&bytes[..])
        }
        None => {
            let mut post = agent.post(format!("{path}/rollback"));
            if let Some(auth) = &auth {
                post = post.header("Authorization", auth);
            }
            post.send_empty()
        }
    };
    let mut response = response.with_context(|| format!("cannot reach the admin API at {base}"))?;
    let status = response.status();
    let body = response.body_mut().read_to_string().unwrap_or_default();
    if !status.is_success() {
        anyhow::bail!("the host refused ({status}): {}", body.trim());
    }
    let answer: serde_json::Value =
        serde_json::from_str(&body).context("unexpected answer from the admin API")?;
    let digest = answer["digest"].as_str().unwrap_or("?");
    Ok(match &request.component {
        Some(_) => format!("swapped `{}`/`{group}` to {digest}\n", request.stream),
        None => format!("rolled `{}`/`{group}` back to {digest}\n", request.stream),
    })
}
