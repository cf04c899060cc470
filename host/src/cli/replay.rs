//! `sluice replay`: a candidate component run on a subscription's dead letters in a dry run
//! (see [`crate::control::rollout::replay`]); with `--requeue-acked`, the ones it acknowledged go back
//! to the group, once the candidate serves. With `--entry`, the candidate (or the configured
//! component) runs on one parked or dead-lettered entry with the journal of its outbound calls
//! and without the network, to reproduce a production failure.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use sluice_descriptor::ResolvedStream;

use super::{plan_after_redis, redis_url_for};
use crate::control::rollout::replay::{self, Report, RequeuedAcked};
use crate::service::plan::SubscriptionPlan;
use crate::store::keys::SubscriptionKeys;
use crate::store::redis_conn::RedisHandle;

/// `sluice replay`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// `.toml` configs and/or `.wasm` components.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
    /// The candidate component (with --entry: the configured component when not given).
    #[arg(long, required_unless_present = "entry")]
    candidate: Option<PathBuf>,
    /// Replay only this entry: a dead letter's id, or a parked retry's origin id. It runs with
    /// the journal of its outbound calls (`effects = "journal"`) and without the network: a
    /// recorded call gets its recorded response, any other an error.
    #[arg(long, value_name = "ID", conflicts_with_all = ["requeue_acked", "reason"])]
    entry: Option<String>,
    /// Only the subscription to this stream (or this one partition).
    #[arg(long)]
    stream: Option<String>,
    /// Only dead letters whose reason contains this text (case-insensitive).
    #[arg(long)]
    reason: Option<String>,
    /// At most this many dead letters per dead-letter stream, newest first.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Let the candidate reach these hosts over HTTP during the replay (comma-separated
    /// `allowed_outbound_hosts` entries, e.g. https://api.example.com); none by default.
    #[arg(long, value_name = "HOSTS")]
    allow_http: Vec<String>,
    /// Then requeue exactly the dead letters the candidate acknowledged; the candidate must
    /// be what the group serves (asked of --admin), or be swapped in with --swap.
    #[arg(long)]
    requeue_acked: bool,
    /// With --requeue-acked: swap the candidate in first (through --admin).
    #[arg(long, requires = "requeue_acked")]
    swap: bool,
    /// The host's admin API (for --requeue-acked).
    #[arg(long, env = "SLUICE_ADMIN", default_value = "http://127.0.0.1:9187")]
    admin: String,
    /// Bearer token for the admin API.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
}

/// `sluice replay`: the report goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let done = replay(ReplayRequest {
        paths: args.paths,
        redis: args.redis,
        stream: args.stream,
        candidate: args.candidate,
        entry: args.entry,
        reason: args.reason,
        limit: args.limit,
        allow_http: args.allow_http,
        requeue_acked: args.requeue_acked,
        swap: args.swap,
        admin: args.admin,
        token: args.token,
        json: args.json,
    })
    .await?;
    print!("{done}");
    Ok(())
}

/// What to replay, against what.
pub struct ReplayRequest {
    /// Configs and/or components.
    pub paths: Vec<PathBuf>,
    /// `--redis`.
    pub redis: Option<String>,
    /// Only the subscription to this stream (or this one partition).
    pub stream: Option<String>,
    /// The candidate component (`None` with `entry`: the configured one).
    pub candidate: Option<PathBuf>,
    /// Replay only this entry, with its journal and without the network.
    pub entry: Option<String>,
    /// Only dead letters whose reason contains this (case-insensitive).
    pub reason: Option<String>,
    /// At most this many dead letters per dead-letter stream.
    pub limit: usize,
    /// Hosts the candidate may reach over HTTP during the replay (`allowed_outbound_hosts`
    /// entries); none by default.
    pub allow_http: Vec<String>,
    /// Requeue the dead letters the candidate acknowledged (the candidate must serve).
    pub requeue_acked: bool,
    /// With `requeue_acked`: swap the candidate in first, through the admin API.
    pub swap: bool,
    /// The admin API that says (or is told) what serves.
    pub admin: String,
    /// Its bearer token.
    pub token: Option<String>,
    /// Print JSON.
    pub json: bool,
}

/// `sluice replay`.
pub async fn replay(request: ReplayRequest) -> Result<String> {
    if request.swap && !request.requeue_acked {
        anyhow::bail!("--swap goes with --requeue-acked (a replay alone changes nothing)");
    }
    if let Some(id) = &request.entry {
        return replay_entry(&request, id).await;
    }
    let candidate = Candidate::read(&request)?;
    let plan = plan_after_redis(&request.paths, request.redis.as_deref()).await?;
    let mut out = String::new();
    let mut json = Vec::new();
    let mut found = false;
    for sub in &plan.subscriptions {
        let parts = parts_of(sub, request.stream.as_deref());
        if parts.is_empty() {
            continue;
        }
        found = true;
        let (handler, counters) = candidate.handler_for(sub).await?;
        let url = redis_url_for(request.redis.as_deref().or(sub.redis.as_deref()))?;
        let mut conn = RedisHandle::connect(&url, &sub.redis_access).await?;
        for part in parts {
            let keys = SubscriptionKeys::of(&part)
                .with_dead_letter_maxlen(sub.dead_letter_maxlen)
                .with_retry_lane(sub.retry_lane);
            let (mut report, requeued) = candidate.run_on(sub, &mut conn, &keys, &handler).await?;
            report.http_denied = counters.http_denied.get();
            if request.json {
                json.push(json_of(&keys, &report, requeued.as_ref()));
            } else {
                write_text(&mut out, &keys.dead_letter, &report, requeued.as_ref());
            }
        }
    }
    if !found {
        anyhow::bail!(
            "no subscription{}",
            request
                .stream
                .map(|s| format!(" reads stream `{s}`"))
                .unwrap_or_default()
        );
    }
    if request.json {
        return Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&json).unwrap_or_default()
        ));
    }
    Ok(out)
}

/// `sluice replay --entry`: the entry found in the first subscription (or partition) that has
/// it, run with its journal and without the network.
async fn replay_entry(request: &ReplayRequest, id: &str) -> Result<String> {
    let plan = plan_after_redis(&request.paths, request.redis.as_deref()).await?;
    for sub in &plan.subscriptions {
        let parts = parts_of(sub, request.stream.as_deref());
        if parts.is_empty() {
            continue;
        }
        let url = redis_url_for(request.redis.as_deref().or(sub.redis.as_deref()))?;
        let mut conn = RedisHandle::connect(&url, &sub.redis_access).await?;
        let handler = entry_handler(sub, request.candidate.as_deref()).await?;
        for part in parts {
            let keys = SubscriptionKeys::of(&part).with_retry_lane(sub.retry_lane);
            let Some(done) = replay::replay_entry(&mut conn, &keys, &handler, id)
                .await
                .with_context(|| format!("cannot replay entry {id} of `{}`", part.stream))?
            else {
                continue;
            };
            if request.json {
                let json = serde_json::json!({
                    "stream": part.stream,
                    "group": part.group,
                    "found_as": done.found_as,
                    "id": done.id,
                    "origin_id": done.origin_id,
                    "would": done.would.kind(),
                    "detail": done.would.describe(),
                    "replayed_calls": done.replayed,
                    "calls_not_in_journal": done.missing,
                });
                return Ok(format!("{json}\n"));
            }
            return Ok(format!(
                "{} {} (origin {}) of `{}`/`{}`, with its journal and no network: {}\n{} call(s) answered from the journal, {} not in it (answered with an error)\n",
                done.found_as,
                done.id,
                done.origin_id,
                part.stream,
                part.group,
                done.would.describe(),
                done.replayed,
                done.missing
            ));
        }
    }
    anyhow::bail!(
        "no dead letter with id {id}, and no parked retry with origin id {id}, in the subscriptions given"
    )
}

/// The handler `--entry` runs: the candidate, or the subscription's configured component, with
/// the subscription's limits and grant (its calls never leave the host: the journal answers).
async fn entry_handler(
    sub: &SubscriptionPlan,
    candidate: Option<&std::path::Path>,
) -> Result<crate::runtime::WasmHandler> {
    let component = match candidate {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            sub.component
                .runtime()
                .load_bytes(path, &bytes)
                .await
                .with_context(|| format!("the candidate {} is refused", path.display()))?
        }
        None => sub.component.clone(),
    };
    let mut limits = sub.limits.clone();
    if limits.outbound_http.journal.is_none() {
        limits.outbound_http.journal = Some(crate::config::allow::JournalPolicy::default());
    }
    Ok(crate::runtime::WasmHandler::new(
        component,
        limits,
        sub.values.clone(),
        crate::handler::HandlerCounters::default(),
    ))
}

/// The partitions of `sub` that `stream` (the subscription's stream or one partition's, if
/// given) names.
fn parts_of(sub: &SubscriptionPlan, stream: Option<&str>) -> Vec<ResolvedStream> {
    sub.stream
        .partitioned()
        .into_iter()
        .filter(|p| stream.is_none_or(|name| name == p.stream || name == sub.stream.stream))
        .collect()
}

/// The candidate of one replay, read once for every subscription it runs on.
struct Candidate<'a> {
    /// What to replay, and how.
    request: &'a ReplayRequest,
    /// The component file.
    path: PathBuf,
    /// The component file's bytes.
    bytes: Vec<u8>,
    /// Their digest: what the group must serve before `--requeue-acked` requeues.
    digest: crate::support::digest::Digest,
    /// The hosts `--allow-http` lets it reach.
    allowed: Vec<crate::config::allow::AllowedHost>,
}

impl<'a> Candidate<'a> {
    /// Read the candidate and the hosts it may reach.
    fn read(request: &'a ReplayRequest) -> Result<Self> {
        let allowed = request
            .allow_http
            .iter()
            .flat_map(|list| list.split(','))
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| {
                h.parse::<crate::config::allow::AllowedHost>()
                    .with_context(|| format!("--allow-http `{h}`"))
            })
            .collect::<Result<Vec<_>>>()?;
        let path = request
            .candidate
            .clone()
            .context("--candidate names the component to replay")?;
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        Ok(Self {
            request,
            digest: crate::support::digest::Digest::of(&bytes),
            path,
            bytes,
            allowed,
        })
    }

    /// The candidate as `sub`'s handler (its limits and config, the allowed hosts), and the
    /// counters it reports to.
    async fn handler_for(
        &self,
        sub: &SubscriptionPlan,
    ) -> Result<(crate::runtime::WasmHandler, crate::handler::HandlerCounters)> {
        let path = &self.path;
        let component = sub
            .component
            .runtime()
            .load_bytes(path, &self.bytes)
            .await
            .with_context(|| format!("the candidate {} is refused", path.display()))?;
        let mut limits = sub.limits.clone();
        limits.outbound_http.allowed = self.allowed.clone();
        let counters = crate::handler::HandlerCounters::default();
        let handler = crate::runtime::WasmHandler::new(
            component,
            limits,
            sub.values.clone(),
            counters.clone(),
        );
        Ok((handler, counters))
    }

    /// Replay one partition's dead letters; with `--requeue-acked`, requeue those acknowledged.
    async fn run_on(
        &self,
        sub: &SubscriptionPlan,
        conn: &mut RedisHandle,
        keys: &SubscriptionKeys,
        handler: &crate::runtime::WasmHandler,
    ) -> Result<(Report, Option<RequeuedAcked>)> {
        let request = self.request;
        let report = replay::replay(
            conn,
            keys,
            handler,
            (request.reason.as_deref(), request.limit),
            sub.limits.max_entry_bytes,
        )
        .await
        .with_context(|| format!("cannot replay the dead letters of `{}`", keys.dead_letter))?;
        let requeued = if request.requeue_acked && report.count("ack") > 0 {
            Some(self.requeue_when_serving(sub, conn, keys, &report).await?)
        } else {
            None
        };
        Ok((report, requeued))
    }

    /// Requeue what the candidate acknowledged, once it is what the group serves (swapped in
    /// first with `--swap`): a requeued entry runs the serving version.
    async fn requeue_when_serving(
        &self,
        sub: &SubscriptionPlan,
        conn: &mut RedisHandle,
        keys: &SubscriptionKeys,
        report: &Report,
    ) -> Result<RequeuedAcked> {
        let request = self.request;
        let (stream, group) = (&sub.stream.stream, &sub.stream.group);
        if request.swap {
            super::swap(super::SwapRequest {
                admin: request.admin.clone(),
                stream: stream.clone(),
                group: Some(group.clone()),
                component: Some(self.path.clone()),
                force: false,
                canary: None,
                window: None,
                abort_canary: false,
                token: request.token.clone(),
            })
            .await
            .context("cannot swap the candidate in before requeueing")?;
        }
        let serving =
            super::swap::serving_digest(&request.admin, request.token.as_deref(), stream, group)
                .await?;
        if serving != self.digest.as_str() {
            anyhow::bail!(
                "--requeue-acked: the candidate ({}) is not what `{stream}`/`{group}` serves ({}): requeued entries would run the serving version; swap it in first (add --swap) or replay the serving version",
                self.digest.short(),
                serving.chars().take(12).collect::<String>()
            );
        }
        replay::requeue_acked(conn, keys, report)
            .await
            .context("cannot requeue the acknowledged dead letters")
    }
}

/// One partition's report as JSON, with its dead-letter stream and what was requeued.
fn json_of(
    keys: &SubscriptionKeys,
    report: &Report,
    requeued: Option<&RequeuedAcked>,
) -> serde_json::Value {
    let mut value = report.to_json();
    value["dead_letters"] = (&*keys.dead_letter).into();
    if let Some(r) = requeued {
        value["requeued"] = serde_json::json!(r.requeued);
        value["gone"] = serde_json::json!(r.gone);
    }
    value
}

/// One partition's report as text, then what was requeued.
fn write_text(out: &mut String, key: &str, report: &Report, requeued: Option<&RequeuedAcked>) {
    let _ = writeln!(out, "dead letters in `{key}` (dry run: nothing written):");
    for item in &report.items {
        let _ = writeln!(
            out,
            "  {} (origin {}): {}",
            item.id,
            item.origin_id.as_deref().unwrap_or("?"),
            item.would.describe()
        );
    }
    let _ = writeln!(out, "{}", report.summary());
    if report.http_denied > 0 {
        let _ = writeln!(
            out,
            "{} outbound HTTP request(s) denied (name hosts with --allow-http)",
            report.http_denied
        );
    }
    let Some(r) = requeued else {
        return;
    };
    for (from, to) in &r.requeued {
        let _ = writeln!(out, "requeued {from} as {to}");
    }
    for id in &r.gone {
        let _ = writeln!(out, "{id} was already gone");
    }
    let _ = writeln!(
        out,
        "requeued {} acknowledged dead letter(s), {} already gone",
        r.requeued.len(),
        r.gone.len()
    );
}
