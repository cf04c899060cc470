//! `sluice run`: the service in the foreground, with a private dev Redis when none is
//! configured. `sluice dev` runs the same, in its dev mode (see [`Dev`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use super::{DEV_REDIS_DIR, plan_of};
use crate::service::Service;
use crate::service::plan::Plan;
use crate::store::devredis::{DevRedis, DevRedisOptions};

/// How `sluice dev` runs the host: the dev Redis in the project's own directory, page and API
/// actions allowed on a loopback admin server without a token, and a banner that says where
/// everything is.
#[derive(Debug, Clone)]
pub struct Dev {
    /// The project's directory (its `.sluice/` holds the dev Redis).
    pub project: PathBuf,
    /// Every span on standard error (`sluice dev --traces`), whatever the config says.
    pub traces: bool,
}

/// `sluice dev --traces`' telemetry: every span of every entry on standard error. The
/// config's other settings (its service name, its link template) stay; its collector and its
/// sampling do not (a `sampling_ratio` meant for a collector would hide most entries, or all,
/// from the terminal).
fn traces_here(
    config: Option<crate::config::telemetry::Telemetry>,
) -> crate::config::telemetry::Telemetry {
    let console = crate::config::telemetry::Telemetry::console();
    match config {
        Some(t) => crate::config::telemetry::Telemetry {
            endpoint: None,
            protocol: console.protocol,
            sampling_per_million: console.sampling_per_million,
            ..t
        },
        None => console,
    }
}

/// `sluice run`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components (a component alone runs its own descriptor).
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Redis URL for every subscription (overrides the configs; default: a private dev server).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice run`: until SIGTERM or ctrl-c.
pub(crate) async fn execute(args: Args) -> Result<()> {
    run(&args.paths, args.redis.as_deref()).await
}

/// How often `sluice dev`'s host looks for a new build.
const DEV_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// `sluice run`: run every subscription until a signal, then drain and stop.
pub async fn run(paths: &[PathBuf], redis: Option<&str>) -> Result<()> {
    run_with(paths, redis, None).await
}

/// [`run`], in dev mode when `dev` is given.
pub async fn run_with(paths: &[PathBuf], redis: Option<&str>, dev: Option<Dev>) -> Result<()> {
    let mut config = super::load(paths)?;
    if let Some(skew) = crate::support::clock::skew_note() {
        tracing::warn!(
            "this host's wall clock is moved by {skew} ({} is set: a test seam; due times follow Redis's clock)",
            crate::support::clock::SKEW_VAR
        );
    }
    if let Some(dev) = &dev {
        // A new build is taken a quarter of a second after it lands, not a second.
        config.watch_interval = config.watch_interval.map(|i| i.min(DEV_WATCH_INTERVAL));
        if dev.traces {
            config.telemetry = Some(traces_here(config.telemetry.take()));
        }
    }
    let mut plan = plan_of(&config, redis, dev.is_some()).await?;
    let dev_dir = dev.as_ref().map_or_else(
        || PathBuf::from(DEV_REDIS_DIR),
        |d| d.project.join(DEV_REDIS_DIR),
    );
    let mut dev_redis = if plan.needs_dev_redis() {
        let dev = DevRedis::start(&dev_dir, &DevRedisOptions::default())
            .context("cannot start the private dev Redis")?;
        Some(dev)
    } else {
        None
    };
    if dev.is_some() {
        dev_mode(&mut plan, dev_redis.is_some());
        eprint!(
            "{}",
            banner(&plan, dev_redis.as_ref(), redis, &dev_dir, paths)
        );
    }
    let dev_url = dev_redis.as_ref().map(DevRedis::url);
    let traces = crate::observe::telemetry::start(config.telemetry.as_ref())
        .context("cannot export traces as configured")?;
    let service = Service::new(plan);
    let stop = CancellationToken::new();
    let dev_pid = dev_redis.as_ref().and_then(DevRedis::pid);
    crate::service::shutdown::on_signals(stop.clone(), move || {
        if let Some(pid) = dev_pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        std::process::exit(130);
    });
    let result = service.run(dev_url, stop).await;
    if let Some(traces) = traces {
        // The flush waits on the exporter's own thread: not on the runtime's.
        let _ = tokio::task::spawn_blocking(move || traces.stop()).await;
    }
    if let Some(dev) = dev_redis.as_mut() {
        dev.stop();
    }
    match result {
        Ok(()) => Ok(()),
        Err(
            err @ (crate::service::RunError::Abandoned(_) | crate::service::RunError::Unflushed(_)),
        ) => Err(err).context("the host did not stop cleanly"),
        Err(err) => Err(err).context("the host could not start"),
    }
}

/// `sluice dev`'s plan: a free admin port when the configured one is taken, and on the private
/// dev server (`on_dev_redis`, every subscription on it) canaries sealed with a key made for
/// this process; without a token, a session key for the page and API.
fn dev_mode(plan: &mut Plan, on_dev_redis: bool) {
    if let Some(addr) = plan.admin
        && (addr.port() == 0 || std::net::TcpListener::bind(addr).is_err())
    {
        // Another dev session holds the port (or the config asks for any): take a free one,
        // so the banner can name it.
        if let Ok(free) = std::net::TcpListener::bind((addr.ip(), 0)).and_then(|l| l.local_addr()) {
            plan.admin = Some(free);
        }
    }
    // A working handler is visible: one line per delivery.
    plan.log_each_delivery = true;
    // Every subscription on the private dev server: nothing else's data is at stake.
    let private = on_dev_redis && plan.subscriptions.iter().all(|s| s.redis.is_none());
    // In dev, on the private dev server, the page's buttons work on loopback without a
    // token (the admin server takes this only on a loopback address); a configured token
    // or read-only mode still rules. On any other Redis, as `sluice run`.
    if private {
        // Canaries on this one host, sealed with a key made for this process.
        plan.rollout_key_ephemeral = true;
    }
    // No token: the page and API take a key made for this session, which the banner
    // shows to whoever started it (and nobody else on the machine).
    if plan.admin_token.is_none() && !plan.admin_open_on_loopback {
        plan.admin_session_key = Some(crate::serve::new_session_key());
    }
}

/// What `sluice dev` prints first: what it serves, where, and how to try it.
fn banner(
    plan: &Plan,
    dev_redis: Option<&DevRedis>,
    redis: Option<&str>,
    dev_dir: &Path,
    paths: &[PathBuf],
) -> String {
    let mut out = String::from("\nsluice dev\n");
    for sub in &plan.subscriptions {
        let _ = writeln!(
            out,
            "  stream     {} (group {}{})",
            sub.stream.stream,
            sub.stream.group,
            if sub.stream.partitions > 1 {
                format!(", {} partitions", sub.stream.partitions)
            } else {
                String::new()
            }
        );
    }
    write_redis(&mut out, plan, dev_redis, redis, dev_dir);
    write_admin(&mut out, plan);
    let _ = writeln!(
        out,
        "  try it     {}   (in another terminal)\n",
        try_it(plan, redis, paths)
    );
    out
}

/// The banner's Redis: the private dev server (and how to reach it with redis-cli), `--redis`,
/// or each subscription's.
fn write_redis(
    out: &mut String,
    plan: &Plan,
    dev_redis: Option<&DevRedis>,
    redis: Option<&str>,
    dev_dir: &Path,
) {
    match (dev_redis, redis) {
        (Some(dev), _) => {
            let _ = writeln!(
                out,
                "  redis      redis://127.0.0.1:{} (private dev server; password in {}/password)\n             redis-cli -p {} --askpass",
                dev.port(),
                dev_dir.display(),
                dev.port()
            );
        }
        (None, Some(url)) => {
            let _ = writeln!(
                out,
                "  redis      {}",
                crate::store::redis_conn::redact(url)
            );
        }
        (None, None) => {
            for url in plan
                .subscriptions
                .iter()
                .filter_map(|s| s.redis.as_deref())
                .collect::<std::collections::BTreeSet<_>>()
            {
                let _ = writeln!(
                    out,
                    "  redis      {}",
                    crate::store::redis_conn::redact(url)
                );
            }
        }
    }
}

/// The banner's admin page: where, how its actions are allowed, and this session's key.
fn write_admin(out: &mut String, plan: &Plan) {
    match plan.admin {
        Some(addr) => {
            let actions = if plan.admin_read_only {
                "read-only (admin_read_only = true)"
            } else if plan.admin_token.is_some() {
                "actions after logging in with the admin token"
            } else if plan.admin_open_on_loopback && addr.ip().is_loopback() {
                "open without a token on loopback: admin_open_on_loopback = true"
            } else {
                "log in with this session's key, below"
            };
            let _ = writeln!(out, "  admin page http://{addr}/ui/ ({actions})");
            if let Some(key) = &plan.admin_session_key {
                let _ = writeln!(
                    out,
                    "  admin key  {key} (made for this session: the page and API take it)"
                );
            }
        }
        None => out.push_str("  admin page off (admin = \"off\")\n"),
    }
}

/// The `sluice send` that tries the project, with only the arguments it needs.
fn try_it(plan: &Plan, redis: Option<&str>, paths: &[PathBuf]) -> String {
    let stream = match plan.subscriptions.as_slice() {
        [_] => String::new(),
        subs => format!(
            "{} ",
            subs.first()
                .map_or("<stream>", |s| s.stream.stream.as_str())
        ),
    };
    let redis_arg = redis.map(|_| "--redis <url> ").unwrap_or_default();
    let config = paths
        .first()
        // The default, ./sluice.toml, goes without saying.
        .filter(|p| {
            p.file_name().is_none_or(|n| n != "sluice.toml")
                || p.parent()
                    .is_some_and(|d| !d.as_os_str().is_empty() && d != Path::new("."))
        })
        .map(|p| format!("--config {} ", p.display()))
        .unwrap_or_default();
    format!("sluice send {config}{redis_arg}{stream}'{{\"id\":\"1\"}}'")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::telemetry::{Protocol, Telemetry};

    #[test]
    fn traces_here_show_every_entry_whatever_the_config_samples() {
        let configured = Telemetry {
            endpoint: Some("http://collector:4318".to_owned()),
            sampling_per_million: 0,
            service_name: "orders".to_owned(),
            ..Telemetry::console()
        };
        let t = traces_here(Some(configured));
        assert_eq!(t.endpoint, None);
        assert_eq!(t.protocol, Protocol::Console);
        assert_eq!(t.sampling_per_million, 1_000_000);
        assert_eq!(t.service_name, "orders");
        assert_eq!(traces_here(None).sampling_per_million, 1_000_000);
    }
}
