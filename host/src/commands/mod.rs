//! The subcommands, at the edge of the program: typed errors from the modules become
//! context-rich `anyhow` errors that say what to do. One file per subcommand, as `main`
//! dispatches them; what several share (building the plan, finding Redis) is here.

mod check;
mod parked;
mod run;
mod status;
mod swap;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

pub use check::check;
pub use parked::parked;
pub use run::run;
pub use status::status;
pub use swap::{SwapRequest, swap};

use crate::config::Config;
use crate::plan::Plan;
use crate::runtime::Runtime;

/// Where the private dev Redis keeps its data.
pub const DEV_REDIS_DIR: &str = ".sluice/dev-redis";

/// Load the configuration and every component, and resolve the subscriptions.
pub(crate) async fn plan(paths: &[PathBuf], redis: Option<&str>) -> Result<Plan> {
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

/// The Redis URL for commands that only talk to Redis: `--redis`, else the subscription's own,
/// else a dev server started by an earlier `sluice run` in this directory.
pub(crate) fn redis_url_for(configured: Option<&str>) -> Result<String> {
    if let Some(url) = configured {
        return Ok(url.to_owned());
    }
    crate::devredis::running_url(Path::new(DEV_REDIS_DIR)).context(
        "no Redis URL is configured and no dev redis-server from `sluice run` is running here; pass --redis <url>",
    )
}

/// An epoch-milliseconds time as RFC 3339 (UTC).
pub(crate) fn format_ms(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}
