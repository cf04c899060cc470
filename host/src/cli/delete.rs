//! `sluice delete`: dead letters or parked retries removed for good (poison).

use crate::control::audit;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::{plan_after_redis, targets};
use crate::control::operate::{dead_letters, parked};

/// `sluice delete`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Dead-letter ids to delete.
    #[arg(
        long = "dead-letter",
        value_name = "DEAD_LETTER_ID",
        required_unless_present = "parked",
        conflicts_with = "parked"
    )]
    dead_letter: Vec<String>,
    /// Origin ids of parked retries to delete.
    #[arg(long, value_name = "ORIGIN_ID", num_args = 1..)]
    parked: Vec<String>,
    /// Only the subscription to this stream (or this one partition).
    #[arg(long)]
    stream: Option<String>,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice delete`: what was deleted goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let what = if args.parked.is_empty() {
        Deletion::DeadLetters(args.dead_letter)
    } else {
        Deletion::Parked(args.parked)
    };
    let done = delete(
        &args.paths,
        args.redis.as_deref(),
        args.stream.as_deref(),
        what,
    )
    .await?;
    print!("{done}");
    Ok(())
}

/// What to delete.
pub enum Deletion {
    /// Dead letters, by id.
    DeadLetters(Vec<String>),
    /// Parked retries, by origin id.
    Parked(Vec<String>),
}

/// `sluice delete`.
pub async fn delete(
    paths: &[PathBuf],
    redis: Option<&str>,
    stream: Option<&str>,
    what: Deletion,
) -> Result<String> {
    let plan = plan_after_redis(paths, redis).await?;
    let mut out = String::new();
    let mut total = 0;
    for mut target in targets(&plan, stream).await? {
        let keys = target.keys.clone();
        match &what {
            Deletion::DeadLetters(ids) => {
                let n = dead_letters::delete(&mut target.conn, &keys, ids)
                    .await
                    .with_context(|| format!("cannot delete from `{}`", keys.dead_letter))?;
                if n > 0 {
                    let _ = writeln!(out, "deleted {n} from `{}`", keys.dead_letter);
                    let said = format!("deleted {n} dead letters");
                    let who = (&*keys.stream, &*keys.group);
                    audit::cli_action(&mut target.conn, "delete", who, Some(n as u64), &said).await;
                }
                total += n;
            }
            Deletion::Parked(origins) => {
                let Some(key) = keys.delayed.as_deref() else {
                    continue;
                };
                let found = parked::find(&mut target.conn, key, origins, None).await?;
                let members: Vec<Vec<u8>> = found.iter().map(|p| p.member.clone()).collect();
                let n = parked::delete(&mut target.conn, key, &members).await?;
                for p in &found {
                    let _ = writeln!(out, "deleted parked {} from `{key}`", p.entry.origin_id);
                }
                if n > 0 {
                    let said = format!("deleted {n} parked entries");
                    let who = (&*keys.stream, &*keys.group);
                    audit::cli_action(&mut target.conn, "delete", who, Some(n as u64), &said).await;
                }
                total += n;
            }
        }
    }
    let _ = writeln!(out, "{total} deleted");
    Ok(out)
}
