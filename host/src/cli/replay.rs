//! `sluice replay`: a candidate component run on a subscription's dead letters in a dry run
//! (see [`crate::control::rollout::replay`]); with `--requeue-acked`, the ones it acknowledged go back
//! to the group, once the candidate serves.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::{plan_after_redis, redis_url_for};
use crate::control::rollout::replay::{self, Report};

/// What to replay, against what.
pub struct ReplayRequest {
    /// Configs and/or components.
    pub paths: Vec<PathBuf>,
    /// `--redis`.
    pub redis: Option<String>,
    /// Only the subscription to this stream (or this one partition).
    pub stream: Option<String>,
    /// The candidate component.
    pub candidate: PathBuf,
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
    let bytes = std::fs::read(&request.candidate)
        .with_context(|| format!("cannot read {}", request.candidate.display()))?;
    let digest = crate::support::digest::Digest::of(&bytes);
    let plan = plan_after_redis(&request.paths, request.redis.as_deref()).await?;
    let mut out = String::new();
    let mut json = Vec::new();
    let mut found = false;
    for sub in &plan.subscriptions {
        let parts: Vec<_> = sub
            .stream
            .partitioned()
            .into_iter()
            .filter(|p| {
                request
                    .stream
                    .as_deref()
                    .is_none_or(|name| name == p.stream || name == sub.stream.stream)
            })
            .collect();
        if parts.is_empty() {
            continue;
        }
        found = true;
        let component = sub
            .component
            .runtime()
            .load_bytes(&request.candidate, &bytes)
            .await
            .with_context(|| format!("the candidate {} is refused", request.candidate.display()))?;
        let mut limits = sub.limits.clone();
        limits.outbound_http.allowed = allowed.clone();
        let counters = crate::handler::HandlerCounters::default();
        let candidate = crate::runtime::WasmHandler::new(
            component,
            limits,
            sub.values.clone(),
            counters.clone(),
        );
        let url = redis_url_for(request.redis.as_deref().or(sub.redis.as_deref()))?;
        let mut conn =
            crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
        for part in parts {
            let keys = crate::store::keys::SubscriptionKeys::of(&part)
                .with_dead_letter_maxlen(sub.dead_letter_maxlen)
                .with_retry_lane(sub.retry_lane);
            let report = replay::replay(
                &mut conn,
                &keys,
                &candidate,
                (request.reason.as_deref(), request.limit),
                sub.limits.max_entry_bytes,
            )
            .await
            .with_context(|| format!("cannot replay the dead letters of `{}`", keys.dead_letter))?;
            let mut requeued = None;
            if request.requeue_acked && report.count("ack") > 0 {
                if request.swap {
                    super::swap(super::SwapRequest {
                        admin: request.admin.clone(),
                        stream: sub.stream.stream.clone(),
                        group: Some(sub.stream.group.clone()),
                        component: Some(request.candidate.clone()),
                        force: false,
                        canary: None,
                        window: None,
                        abort_canary: false,
                        token: request.token.clone(),
                    })
                    .await
                    .context("cannot swap the candidate in before requeueing")?;
                }
                let serving = super::swap::serving_digest(
                    &request.admin,
                    request.token.as_deref(),
                    &sub.stream.stream,
                    &sub.stream.group,
                )
                .await?;
                if serving != digest.as_str() {
                    anyhow::bail!(
                        "--requeue-acked: the candidate ({}) is not what `{}`/`{}` serves ({}): requeued entries would run the serving version; swap it in first (add --swap) or replay the serving version",
                        digest.short(),
                        sub.stream.stream,
                        sub.stream.group,
                        serving.chars().take(12).collect::<String>()
                    );
                }
                requeued = Some(
                    replay::requeue_acked(&mut conn, &keys, &report)
                        .await
                        .context("cannot requeue the acknowledged dead letters")?,
                );
            }
            let denied = counters.http_denied.get();
            let mut report = report;
            report.http_denied = denied;
            if request.json {
                let mut value = report.to_json();
                value["dead_letters"] = (&*keys.dead_letter).into();
                if let Some(r) = &requeued {
                    value["requeued"] = serde_json::json!(r.requeued);
                    value["gone"] = serde_json::json!(r.gone);
                }
                json.push(value);
            } else {
                write_report(&mut out, &keys.dead_letter, &report, denied);
                if let Some(r) = &requeued {
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

fn write_report(out: &mut String, key: &str, report: &Report, http_denied: u64) {
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
    if http_denied > 0 {
        let _ = writeln!(
            out,
            "{http_denied} outbound HTTP request(s) denied (name hosts with --allow-http)"
        );
    }
}
