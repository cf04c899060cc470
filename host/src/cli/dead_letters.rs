//! `sluice dead-letters`: what was given up on, newest first, with why.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::{Target, format_ms, plan_after_redis, targets};
use crate::control::operate::dead_letters::{self, DeadLetter};
use crate::control::operate::{Page, printable};

/// `sluice dead-letters`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// Only the subscription to this stream (or this one partition).
    #[arg(long)]
    stream: Option<String>,
    /// Only dead letters whose reason contains this text (case-insensitive).
    #[arg(long)]
    reason: Option<String>,
    /// At most this many per dead-letter stream.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Show these dead letters (by id) whole, fields untruncated.
    #[arg(long = "id", value_name = "DEAD_LETTER_ID")]
    ids: Vec<String>,
    /// One JSON object per dead letter, one per line.
    #[arg(long)]
    json: bool,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice dead-letters`: the listing goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let listing = dead_letters(DeadLetterQuery {
        paths: args.paths,
        redis: args.redis,
        stream: args.stream,
        reason: args.reason,
        limit: args.limit,
        ids: args.ids,
        json: args.json,
    })
    .await?;
    print!("{listing}");
    Ok(())
}

/// What to list.
pub struct DeadLetterQuery {
    /// Configs and/or components.
    pub paths: Vec<PathBuf>,
    /// `--redis`.
    pub redis: Option<String>,
    /// Only this stream (the subscription's or one partition's).
    pub stream: Option<String>,
    /// Only dead letters whose reason contains this (case-insensitive).
    pub reason: Option<String>,
    /// At most this many per dead-letter stream.
    pub limit: usize,
    /// Only these dead letters (by id), shown whole.
    pub ids: Vec<String>,
    /// One JSON object per dead letter.
    pub json: bool,
}

/// `sluice dead-letters`.
pub async fn dead_letters(query: DeadLetterQuery) -> Result<String> {
    let plan = plan_after_redis(&query.paths, query.redis.as_deref()).await?;
    let mut out = String::new();
    for mut target in targets(&plan, query.stream.as_deref()).await? {
        let page = read_page(&mut target, &query).await?;
        let keys = &target.keys;
        if query.json {
            for letter in &page.items {
                let _ = writeln!(out, "{}", letter.to_json(&keys.stream));
            }
            continue;
        }
        let _ = writeln!(
            out,
            "{} (stream `{}`, group `{}`)",
            keys.dead_letter, keys.stream, keys.group
        );
        for letter in &page.items {
            write_letter(&mut out, letter, !query.ids.is_empty());
        }
        let more = if page.next.is_some() {
            " (more: raise --limit)"
        } else {
            ""
        };
        let _ = writeln!(out, "  shown: {}{more}", page.items.len());
    }
    Ok(out)
}

/// The dead letters of `target` the query asks for: those named, or the newest (whose reason
/// matches).
async fn read_page(target: &mut Target, query: &DeadLetterQuery) -> Result<Page<DeadLetter>> {
    let keys = &target.keys;
    if !query.ids.is_empty() {
        let mut items = Vec::new();
        for id in &query.ids {
            items.extend(dead_letters::get(&mut target.conn, keys, id).await?);
        }
        return Ok(Page { items, next: None });
    }
    // A filtered listing may read through the whole stream for `limit` matches.
    dead_letters::list(
        &mut target.conn,
        keys,
        None,
        query.limit,
        query.reason.as_deref(),
        usize::MAX,
    )
    .await
    .with_context(|| format!("cannot read the dead-letter stream `{}`", keys.dead_letter))
}

/// One dead letter as text: its line, its trace, its fields (cut short unless `whole`) and
/// its traceback (only `whole`, else a hint).
fn write_letter(out: &mut String, letter: &DeadLetter, whole: bool) {
    let _ = writeln!(
        out,
        "  {}  {}  origin {}  retries {}  reason: {}",
        letter.id,
        letter.written_ms().map(format_ms).unwrap_or_default(),
        letter.origin_id.as_deref().unwrap_or("-"),
        letter.retry_count.map_or("-".to_owned(), |n| n.to_string()),
        letter
            .reason
            .as_deref()
            .unwrap_or("(not written by Sluice)")
    );
    if let Some(trace_id) = letter
        .trace_id()
        .filter(|_| crate::observe::telemetry::traces_shown())
    {
        match crate::observe::telemetry::trace_link(&trace_id) {
            Some(link) => {
                let _ = writeln!(out, "      trace {trace_id}  {link}");
            }
            None => {
                let _ = writeln!(out, "      trace {trace_id}");
            }
        }
    }
    for (name, value) in &letter.fields {
        let mut value = printable(value);
        if !whole && value.chars().count() > 120 {
            value = value.chars().take(117).collect::<String>() + "...";
        }
        let _ = writeln!(out, "      {} = {value}", printable(name));
    }
    match (&letter.trace, whole) {
        (Some(trace), true) => {
            let _ = writeln!(out, "      traceback:");
            for line in trace.lines() {
                let _ = writeln!(out, "        {}", printable(line.as_bytes()));
            }
        }
        (Some(_), false) => {
            let _ = writeln!(out, "      (a traceback: --id {} shows it)", letter.id);
        }
        (None, _) => {}
    }
}
