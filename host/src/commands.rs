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
    let runtime =
        Runtime::new(Some(&config.cache_dir)).context("cannot start the WebAssembly runtime")?;
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
