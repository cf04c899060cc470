//! `sluice requeue`: dead letters back onto their stream, one atomic script each.

use crate::control::audit;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, Result};

use super::args::config_and_ids;
use super::{Target, interrupted, plan_after_redis, progress, targets};
use crate::control::operate::BATCH;
use crate::control::operate::dead_letters::{self, DeadLetter, Requeued};
use crate::store::keys::SubscriptionKeys;

/// `sluice requeue`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The subscription's `.toml` config or `.wasm` component (default: ./sluice.toml),
    /// then the dead-letter ids to requeue.
    #[arg(
        value_name = "[CONFIG] DEAD_LETTER_ID",
        required_unless_present = "all"
    )]
    args: Vec<String>,
    /// Requeue every dead letter (of `--stream`, whose reason contains `--reason`).
    #[arg(long)]
    all: bool,
    /// With --all: only those whose reason contains this text (case-insensitive).
    #[arg(long, requires = "all")]
    reason: Option<String>,
    /// Say what would be requeued; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Give the requeued entries' outbound calls new idempotency keys (by default a requeued
    /// entry's calls keep the keys they had, so a service that saw them dedupes).
    #[arg(long)]
    new_idempotency_keys: bool,
    /// Only the subscription to this stream (or this one partition).
    #[arg(long)]
    stream: Option<String>,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice requeue`: what was requeued goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let (path, ids) = config_and_ids(args.args, args.all)?;
    let done = requeue(RequeueRequest {
        paths: vec![path],
        redis: args.redis,
        stream: args.stream,
        ids,
        all: args.all,
        reason: args.reason,
        dry_run: args.dry_run,
        new_idempotency_keys: args.new_idempotency_keys,
    })
    .await?;
    print!("{done}");
    Ok(())
}

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
    /// New idempotency keys for the requeued entries' outbound calls.
    pub new_idempotency_keys: bool,
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
    let mut tally = Tally::default();
    'targets: for mut target in targets(&plan, request.stream.as_deref()).await? {
        let mut cursor: Option<String> = None;
        let before = tally.done;
        loop {
            for letter in next_letters(&mut target, &request, &mut cursor).await? {
                if stop.load(Ordering::Acquire) {
                    let _ = writeln!(tally.out, "interrupted: stopped after the entry before");
                    break 'targets;
                }
                tally.found.insert(letter.id.clone());
                if request.dry_run {
                    tally.would(&target.keys, &letter);
                } else {
                    let fresh = request.new_idempotency_keys;
                    tally.requeue(&mut target, &letter, fresh, &bar).await?;
                }
            }
            if !request.all || cursor.is_none() {
                break;
            }
        }
        let n = tally.done - before;
        if n > 0 && !request.dry_run {
            let said = format!("requeued {n} dead letters");
            let who = (&*target.keys.stream, &*target.keys.group);
            audit::cli_action(&mut target.conn, "requeue", who, Some(n as u64), &said).await;
        }
    }
    bar.finish_and_clear();
    Ok(tally.report(&request))
}

/// The next dead letters to requeue from `target`: with `--all` the next page (`cursor` moves
/// on), else those named that are there.
async fn next_letters(
    target: &mut Target,
    request: &RequeueRequest,
    cursor: &mut Option<String>,
) -> Result<Vec<DeadLetter>> {
    let keys = &target.keys;
    if request.all {
        let page = dead_letters::list(
            &mut target.conn,
            keys,
            cursor.as_deref(),
            BATCH,
            request.reason.as_deref(),
            1,
        )
        .await
        .with_context(|| format!("cannot read `{}`", keys.dead_letter))?;
        *cursor = page.next;
        return Ok(page.items);
    }
    let mut letters = Vec::new();
    for id in &request.ids {
        if let Some(letter) = dead_letters::get(&mut target.conn, keys, id).await? {
            letters.push(letter);
        }
    }
    Ok(letters)
}

/// What a requeue did so far: each dead letter's line, and the counts of the last line.
#[derive(Default)]
struct Tally {
    /// The report, a line per dead letter.
    out: String,
    /// Requeued (or, in a dry run, would be).
    done: usize,
    /// Gone meanwhile.
    gone: usize,
    /// Not requeueable.
    refused: usize,
    /// The ids seen, so those named and not found are reported.
    found: std::collections::HashSet<String>,
}

impl Tally {
    /// A dry run: what a requeue of `letter` would do.
    fn would(&mut self, keys: &SubscriptionKeys, letter: &DeadLetter) {
        match &letter.not_requeueable {
            None => {
                self.done += 1;
                let _ = writeln!(
                    self.out,
                    "would requeue {} onto `{}` (reason: {})",
                    letter.id,
                    keys.stream,
                    letter.reason.as_deref().unwrap_or("-")
                );
            }
            Some(why) => {
                self.refused += 1;
                let _ = writeln!(self.out, "would skip {}: {why}", letter.id);
            }
        }
    }

    /// Requeue `letter` in one atomic step; an error other than "not requeueable" stops all.
    async fn requeue(
        &mut self,
        target: &mut Target,
        letter: &DeadLetter,
        new_idempotency_keys: bool,
        bar: &indicatif::ProgressBar,
    ) -> Result<()> {
        let keys = &target.keys;
        match dead_letters::requeue(&mut target.conn, keys, letter, new_idempotency_keys).await {
            Ok(Requeued::To(id)) => {
                self.done += 1;
                bar.inc(1);
                let into = keys.lane.as_deref().unwrap_or(&keys.stream);
                let _ = writeln!(self.out, "requeued {} into `{into}` as {id}", letter.id);
            }
            Ok(Requeued::Gone) => {
                self.gone += 1;
                let _ = writeln!(
                    self.out,
                    "{} was already gone (requeued or deleted meanwhile)",
                    letter.id
                );
            }
            Err(crate::control::operate::OperateError::NotRequeueable { id, why }) => {
                self.refused += 1;
                let _ = writeln!(self.out, "skipped {id}: {why}");
            }
            Err(err) => {
                return Err(err).with_context(|| format!("cannot requeue {}", letter.id));
            }
        }
        Ok(())
    }

    /// The report: every line, the ids named and not found, and the counts.
    fn report(mut self, request: &RequeueRequest) -> String {
        for id in &request.ids {
            if !self.found.contains(id) {
                let _ = writeln!(self.out, "{id}: no such dead letter");
            }
        }
        let verb = if request.dry_run {
            "would requeue"
        } else {
            "requeued"
        };
        let (done, refused, gone) = (self.done, self.refused, self.gone);
        let _ = writeln!(
            self.out,
            "{verb} {done}, skipped {refused}, already gone {gone}"
        );
        self.out
    }
}
