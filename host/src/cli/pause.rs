//! `sluice pause` and `sluice resume`: hold a subscription on every host of its group, and
//! let it go again (see [`crate::pipeline::admit`]).

use crate::control::audit;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::{plan_after_redis, redis_url_for};
use crate::pipeline::admit::{self, PauseResult, Paused};

/// `sluice pause`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Only the subscription to this stream.
    #[arg(long)]
    stream: Option<String>,
    /// Why (shown by `sluice status`, the page and the hosts' logs).
    #[arg(long)]
    reason: Option<String>,
    /// Who pauses (default: user@machine).
    #[arg(long)]
    by: Option<String>,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice resume`'s arguments.
#[derive(clap::Args)]
pub struct ResumeArgs {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Only the subscription to this stream.
    #[arg(long)]
    stream: Option<String>,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice pause`: what was paused goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let done = pause(
        &args.paths,
        args.redis.as_deref(),
        args.stream.as_deref(),
        args.by.as_deref(),
        args.reason.as_deref(),
    )
    .await?;
    print!("{done}");
    Ok(())
}

/// `sluice resume`: what was resumed goes to stdout.
pub(crate) async fn execute_resume(args: ResumeArgs) -> Result<()> {
    let done = resume(&args.paths, args.redis.as_deref(), args.stream.as_deref()).await?;
    print!("{done}");
    Ok(())
}

/// Who a pause from the command line is recorded as, unless `--by` says: the user and the
/// machine.
fn operator() -> String {
    format!("{} (sluice pause)", audit::user_at_host())
}

/// The subscriptions of the config at `paths` (only the one to `stream`, if given), each with
/// a connection to its Redis.
async fn subscriptions(
    paths: &[PathBuf],
    redis: Option<&str>,
    stream: Option<&str>,
) -> Result<Vec<(String, String, crate::store::redis_conn::RedisHandle)>> {
    let plan = plan_after_redis(paths, redis).await?;
    let mut found = Vec::new();
    for sub in &plan.subscriptions {
        let (name, group) = (&sub.stream.stream, &sub.stream.group);
        if stream.is_some_and(|s| s != name) {
            continue;
        }
        let url = redis_url_for(sub.redis.as_deref())?;
        let conn = crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
        found.push((name.clone(), group.clone(), conn));
    }
    if found.is_empty() {
        anyhow::bail!(
            "no subscription{} in the configuration",
            stream
                .map(|s| format!(" reads stream `{s}`"))
                .unwrap_or_default()
        );
    }
    Ok(found)
}

/// `sluice pause`: every host of each subscription's group stops taking entries within about
/// a second; deliveries in flight finish.
pub async fn pause(
    paths: &[PathBuf],
    redis: Option<&str>,
    stream: Option<&str>,
    by: Option<&str>,
    reason: Option<&str>,
) -> Result<String> {
    let by = by.map_or_else(operator, str::to_owned);
    let mut out = String::new();
    for (stream, group, mut conn) in subscriptions(paths, redis, stream).await? {
        let asked = Paused::now(&by, reason);
        let done = admit::pause(&mut conn, &stream, &group, asked)
            .await
            .with_context(|| format!("cannot pause stream `{stream}` group `{group}`"))?;
        if let PauseResult::Paused(p) = &done {
            let said = p.describe();
            audit::cli_action(&mut conn, "pause", (&stream, &group), None, &said).await;
        }
        let _ = match done {
            PauseResult::Paused(p) => writeln!(
                out,
                "stream `{stream}` group `{group}`: {}; running hosts stop reading within a second (`sluice resume` to go on)",
                p.describe()
            ),
            PauseResult::Already(p) => writeln!(
                out,
                "stream `{stream}` group `{group}`: already {}",
                p.describe()
            ),
        };
    }
    Ok(out)
}

/// `sluice resume`: every host of each subscription's group reads again.
pub async fn resume(
    paths: &[PathBuf],
    redis: Option<&str>,
    stream: Option<&str>,
) -> Result<String> {
    let mut out = String::new();
    for (stream, group, mut conn) in subscriptions(paths, redis, stream).await? {
        let was = admit::resume(&mut conn, &stream, &group, &operator())
            .await
            .with_context(|| format!("cannot resume stream `{stream}` group `{group}`"))?;
        if let Some(was) = &was {
            let said = format!("resumed (it was {})", was.describe());
            audit::cli_action(&mut conn, "resume", (&stream, &group), None, &said).await;
        }
        let _ = match was {
            Some(was) => writeln!(
                out,
                "stream `{stream}` group `{group}`: resumed (it was {}); running hosts read again within a second",
                was.describe()
            ),
            None => writeln!(out, "stream `{stream}` group `{group}`: was not paused"),
        };
    }
    Ok(out)
}
