//! `sluice run`: the service in the foreground, with a private dev Redis when none is
//! configured.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use super::{DEV_REDIS_DIR, plan};
use crate::devredis::{DevRedis, DevRedisOptions};
use crate::service::Service;

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
        Err(
            err @ (crate::service::RunError::Abandoned(_) | crate::service::RunError::Unflushed(_)),
        ) => Err(err).context("the host did not stop cleanly"),
        Err(err) => Err(err).context("the host could not start"),
    }
}
