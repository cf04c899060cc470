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
    result.context("the host did not stop cleanly")
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
                        "origin_id": e.origin_id,
                        "retry_count": e.retry_count,
                        "due_ms": e.due_ms,
                        "due": format_ms(e.due_ms),
                        "due_in_ms": e.due_ms - now_ms,
                        "fields": e.fields.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(String::from_utf8_lossy(v).into_owned()))).collect::<serde_json::Map<String, serde_json::Value>>(),
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
