//! `sluice retry-now`: parked retries made due now, so the next sweep moves them back.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, Result};

use super::args::config_and_ids;
use super::{interrupted, plan_after_redis, progress, targets};
use crate::control::operate::parked;

/// `sluice retry-now`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The subscription's `.toml` config or `.wasm` component (default: ./sluice.toml),
    /// then the origin ids of the parked retries.
    #[arg(value_name = "[CONFIG] ORIGIN_ID", required_unless_present = "all")]
    args: Vec<String>,
    /// Every parked retry that is not yet due.
    #[arg(long)]
    all: bool,
    /// Only the subscription to this stream (or this one partition).
    #[arg(long)]
    stream: Option<String>,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice retry-now`: what was made due goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let (path, ids) = config_and_ids(args.args, args.all)?;
    let done = retry_now(
        &[path],
        args.redis.as_deref(),
        args.stream.as_deref(),
        &ids,
        args.all,
    )
    .await?;
    print!("{done}");
    Ok(())
}

/// `sluice retry-now`: the parked retries with these origin ids, or with `all` every one that
/// is not yet due.
pub async fn retry_now(
    paths: &[PathBuf],
    redis: Option<&str>,
    stream: Option<&str>,
    origins: &[String],
    all: bool,
) -> Result<String> {
    if all != origins.is_empty() {
        anyhow::bail!("name the parked retries by origin id, or pass --all (not both)");
    }
    let plan = plan_after_redis(paths, redis).await?;
    let _traces = super::OperatorTraces::start(paths)?;
    let stop = interrupted();
    let bar = progress("making retries due");
    let mut out = String::new();
    let mut total = 0;
    let mut found = std::collections::HashSet::new();
    for mut target in targets(&plan, stream).await? {
        let Some(key) = target.keys.delayed.clone() else {
            continue;
        };
        let before = total;
        if all {
            loop {
                if stop.load(Ordering::Acquire) {
                    let _ = writeln!(out, "interrupted: stopped after a whole batch");
                    break;
                }
                let n = parked::retry_batch_now(&mut target.conn, &key)
                    .await
                    .with_context(|| format!("cannot update `{key}`"))?;
                if n == 0 {
                    break;
                }
                total += n;
                bar.inc(n as u64);
            }
            record(&mut target, total - before).await;
            continue;
        }
        let matches = parked::find(&mut target.conn, &key, origins, None)
            .await
            .with_context(|| format!("cannot search `{key}`"))?;
        let members: Vec<Vec<u8>> = matches.iter().map(|p| p.member.clone()).collect();
        let n = parked::retry_now(&mut target.conn, &key, &members).await?;
        for p in &matches {
            found.insert(p.entry.origin_id.clone());
            let _ = writeln!(out, "{} in `{key}` is due now", p.entry.origin_id);
        }
        total += n;
        record(&mut target, n).await;
    }
    bar.finish_and_clear();
    for origin in origins {
        if !found.contains(origin) {
            let _ = writeln!(out, "{origin}: not parked");
        }
    }
    let _ = writeln!(
        out,
        "{total} retries due now; a running host moves them back onto the stream within its block time"
    );
    Ok(out)
}

/// The audit record of what `retry-now` did to one target, when it moved any.
async fn record(target: &mut super::Target, n: usize) {
    if n > 0 {
        let said = format!("{n} parked entries due now");
        let who = (&*target.keys.stream, &*target.keys.group);
        crate::control::audit::cli_action(
            &mut target.conn,
            "retry-now",
            who,
            Some(n as u64),
            &said,
        )
        .await;
    }
}
