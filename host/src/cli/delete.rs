//! `sluice delete`: dead letters or parked retries removed for good (poison).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::{plan_after_redis, targets};
use crate::control::operate::{dead_letters, parked};

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
                total += n;
            }
        }
    }
    let _ = writeln!(out, "{total} deleted");
    Ok(out)
}
