//! `sluice requeue`: dead letters back onto their stream, one atomic script each.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, Result};

use super::{interrupted, plan_after_redis, progress, targets};
use crate::control::operate::BATCH;
use crate::control::operate::dead_letters::{self, Requeued};

/// What to requeue.
pub struct RequeueRequest {
    /// Configs and/or components.
    pub paths: Vec<PathBuf>,
    /// `--redis`.
    pub redis: Option<String>,
    /// Only this stream (the subscription's or one partition's).
    pub stream: Option<String>,
    /// These dead letters (ids in the dead-letter stream)...
    pub ids: Vec<String>,
    /// ...or all of them (whose reason contains `reason`, if given).
    pub all: bool,
    /// With `all`: only those whose reason contains this (case-insensitive).
    pub reason: Option<String>,
    /// Say what would be requeued, change nothing.
    pub dry_run: bool,
}

/// `sluice requeue`.
pub async fn requeue(request: RequeueRequest) -> Result<String> {
    if request.all != request.ids.is_empty() {
        anyhow::bail!("name the dead letters to requeue by id, or pass --all (not both)");
    }
    let plan = plan_after_redis(&request.paths, request.redis.as_deref()).await?;
    let _traces = super::OperatorTraces::start(&request.paths)?;
    let stop = interrupted();
    let bar = progress("requeueing");
    let mut out = String::new();
    let (mut done, mut gone, mut refused) = (0usize, 0usize, 0usize);
    let mut found = std::collections::HashSet::new();
    'targets: for mut target in targets(&plan, request.stream.as_deref()).await? {
        let keys = target.keys.clone();
        let mut cursor: Option<String> = None;
        loop {
            let letters = if request.all {
                let page = dead_letters::list(
                    &mut target.conn,
                    &keys,
                    cursor.as_deref(),
                    BATCH,
                    request.reason.as_deref(),
                    1,
                )
                .await
                .with_context(|| format!("cannot read `{}`", keys.dead_letter))?;
                cursor = page.next;
                page.items
            } else {
                let mut letters = Vec::new();
                for id in &request.ids {
                    if let Some(letter) = dead_letters::get(&mut target.conn, &keys, id).await? {
                        letters.push(letter);
                    }
                }
                letters
            };
            for letter in letters {
                if stop.load(Ordering::Acquire) {
                    let _ = writeln!(out, "interrupted: stopped after the entry before");
                    break 'targets;
                }
                found.insert(letter.id.clone());
                if request.dry_run {
                    match &letter.not_requeueable {
                        None => {
                            done += 1;
                            let _ = writeln!(
                                out,
                                "would requeue {} onto `{}` (reason: {})",
                                letter.id,
                                keys.stream,
                                letter.reason.as_deref().unwrap_or("-")
                            );
                        }
                        Some(why) => {
                            refused += 1;
                            let _ = writeln!(out, "would skip {}: {why}", letter.id);
                        }
                    }
                    continue;
                }
                match dead_letters::requeue(&mut target.conn, &keys, &letter).await {
                    Ok(Requeued::To(id)) => {
                        done += 1;
                        bar.inc(1);
                        let into = keys.lane.as_deref().unwrap_or(&keys.stream);
                        let _ = writeln!(out, "requeued {} into `{into}` as {id}", letter.id);
                    }
                    Ok(Requeued::Gone) => {
                        gone += 1;
                        let _ = writeln!(
                            out,
                            "{} was already gone (requeued or deleted meanwhile)",
                            letter.id
                        );
                    }
                    Err(crate::control::operate::OperateError::NotRequeueable { id, why }) => {
                        refused += 1;
                        let _ = writeln!(out, "skipped {id}: {why}");
                    }
                    Err(err) => {
                        return Err(err).with_context(|| format!("cannot requeue {}", letter.id));
                    }
                }
            }
            if !request.all || cursor.is_none() {
                break;
            }
        }
    }
    bar.finish_and_clear();
    for id in &request.ids {
        if !found.contains(id) {
            let _ = writeln!(out, "{id}: no such dead letter");
        }
    }
    let verb = if request.dry_run {
        "would requeue"
    } else {
        "requeued"
    };
    let _ = writeln!(out, "{verb} {done}, skipped {refused}, already gone {gone}");
    Ok(out)
}
