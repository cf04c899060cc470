//! `sluice send`: add a test entry to a subscription's stream, so trying a handler needs no
//! redis-cli: the JSON goes into the subscription's payload field, on the partition its `id`
//! picks, in the Redis the project's config (or its running dev server) names.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::{plan_after_redis, redis_url_for};
use crate::control::operate::schedule::{self, When};

/// The largest entry `sluice send` writes: a test entry, not a bulk load.
const MAX_SEND_BYTES: usize = 1024 * 1024;

/// `sluice send`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The stream (may be left out when the config has one subscription), then the entry
    /// as a JSON object.
    #[arg(value_name = "[STREAM] JSON", num_args = 1..=2, required = true)]
    args: Vec<String>,
    /// The project's config.
    #[arg(long, default_value = "sluice.toml")]
    config: PathBuf,
    /// Redis URL (default: the subscription's, else the dev server of a running `sluice dev`).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
    /// Deliver it at this time (RFC 3339, e.g. `2026-12-24T18:00:00Z`) instead of now: it
    /// waits in the subscription's delayed set and comes as a first attempt.
    #[arg(long, value_name = "RFC3339", conflicts_with = "in_")]
    at: Option<String>,
    /// Deliver it this long from now (by the Redis server's clock), e.g. `90s` or `2h`.
    #[arg(long = "in", id = "in_", value_name = "DURATION")]
    in_: Option<String>,
}

/// `sluice send`: what was added where goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let (stream, json) = match args.args.as_slice() {
        [json] => (None, json.as_str()),
        [stream, json] => (Some(stream.as_str()), json.as_str()),
        _ => anyhow::bail!("give [STREAM] JSON"),
    };
    let when = when(args.at.as_deref(), args.in_.as_deref())?;
    let added = send(&args.config, args.redis.as_deref(), (stream, when), json).await?;
    println!("{added}");
    Ok(())
}

/// `--at` or `--in`, read (neither: now).
fn when(at: Option<&str>, after: Option<&str>) -> Result<Option<When>> {
    Ok(match (at, after) {
        (Some(at), _) => Some(When::At(
            chrono::DateTime::parse_from_rfc3339(at)
                .with_context(|| {
                    format!("--at {at}: not an RFC 3339 time with its zone (like 2026-12-24T18:00:00Z or 2026-12-24T18:00:00+01:00)")
                })?
                .timestamp_millis(),
        )),
        (None, Some(after)) => Some(When::In(
            humantime::parse_duration(after)
                .with_context(|| format!("--in {after}: not a duration (like 90s, 15m or 2h)"))?,
        )),
        (None, None) => None,
    })
}

/// The longest `sluice send` waits for a `sluice dev` to serve (a first Rust build takes
/// minutes on a small machine).
const MAX_DEV_WAIT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// When a `sluice dev` in the config's project is still on its first build (or starting its
/// host and dev Redis), wait until it serves, saying so, instead of failing on a component not
/// built yet. Returns at once when no `sluice dev` runs there; fails when its first build
/// failed (it waits for a fix, which may be long); when it stops, the caller's own error says
/// what is missing.
async fn wait_for_dev(config: &Path, redis: Option<&str>) -> Result<()> {
    use super::dev::{DevState, running_in};
    let dir = config
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Built (the config loads only once its component exists), and a Redis to send to: given,
    // the config's, the dev server once it runs, or the one the session was given (this send
    // then says which URL it lacks rather than wait for a dev server that never starts).
    let ready = |state: DevState| {
        crate::config::Config::load(&[config.to_owned()]).is_ok_and(|c| {
            redis.is_some()
                || state == DevState::Serving
                || c.subscriptions.iter().all(|s| s.redis.is_some())
                || crate::store::devredis::running_url(&dir.join(super::DEV_REDIS_DIR)).is_some()
        })
    };
    let started = std::time::Instant::now();
    let mut said = false;
    while let Some((pid, state)) = running_in(dir) {
        if ready(state) || started.elapsed() > MAX_DEV_WAIT {
            break;
        }
        if state == DevState::Failed {
            anyhow::bail!(
                "the first build of `sluice dev` (process {pid}) failed (its terminal shows why); nothing was sent: send again once it builds"
            );
        }
        if !said {
            eprintln!(
                "`sluice dev` (process {pid}) is building the handler here; waiting for it to serve, then sending (ctrl-c to stop)"
            );
            said = true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Add `json` (an object) to `stream` (or the config's only subscription's), now or `when`;
/// returns what was added where.
pub async fn send(
    config: &Path,
    redis: Option<&str>,
    (stream, when): (Option<&str>, Option<When>),
    json: &str,
) -> Result<String> {
    if json.len() > MAX_SEND_BYTES {
        anyhow::bail!(
            "the entry is {} bytes; `sluice send` writes at most {MAX_SEND_BYTES}",
            json.len()
        );
    }
    let value: serde_json::Value = serde_json::from_str(json)
        .with_context(|| format!("the entry is not valid JSON: {json}"))?;
    if !value.is_object() {
        anyhow::bail!("the entry must be a JSON object, like '{{\"id\":\"1\"}}'; got {json}");
    }
    wait_for_dev(config, redis).await?;
    // Redis first; compiled as `sluice dev` compiles (its cache then serves this too).
    let plan = plan_after_redis(&[config.to_owned()], redis).await?;
    let sub = match stream {
        Some(name) => plan
            .subscriptions
            .iter()
            .find(|s| s.stream.stream == name)
            .with_context(|| {
                let streams: Vec<_> = plan
                    .subscriptions
                    .iter()
                    .map(|s| s.stream.stream.as_str())
                    .collect();
                format!(
                    "no subscription of {} reads stream `{name}` (it has: {})",
                    config.display(),
                    streams.join(", ")
                )
            })?,
        None => match plan.subscriptions.as_slice() {
            [only] => only,
            subs => anyhow::bail!(
                "{} has {} subscriptions: name the stream, as `sluice send <stream> '<json>'` (one of: {})",
                config.display(),
                subs.len(),
                subs.iter()
                    .map(|s| s.stream.stream.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    // Partitioned: the partition a producer would pick for this entry's `id`.
    let key = match &value["id"] {
        serde_json::Value::String(id) => id.clone(),
        serde_json::Value::Null => json.to_owned(),
        other => other.to_string(),
    };
    let target = sluice_descriptor::partition_stream(
        &sub.stream.stream,
        sub.stream.partitions,
        key.as_bytes(),
    );
    let url = redis_url_for(sub.redis.as_deref().or(redis))
        .context("start `sluice dev` (or `sluice run`) in this directory first, or give --redis")?;
    let mut conn = crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
    if let Some(when) = when {
        return send_later(&mut conn, sub, &target, when, json).await;
    }
    let id: String = redis::cmd("XADD")
        .arg(&target)
        .arg("*")
        .arg(&sub.stream.payload_field)
        .arg(json)
        .query_async(&mut conn)
        .await
        .with_context(|| format!("cannot add the entry to `{target}`"))?;
    Ok(format!(
        "added {id} to {target} ({} = {json})",
        sub.stream.payload_field
    ))
}

/// Schedule `json` for the partition `target` of `sub` at `when`: into its delayed set.
async fn send_later(
    conn: &mut crate::store::redis_conn::RedisHandle,
    sub: &crate::SubscriptionPlan,
    target: &str,
    when: When,
    json: &str,
) -> Result<String> {
    let part = sub
        .stream
        .partitioned()
        .into_iter()
        .find(|p| p.stream == target)
        .context("the partition of the entry's id is not one of the subscription's")?;
    let Some(sluice_descriptor::DelayedRetry::DurableZset { key, ttl }) = &part.delayed_retry
    else {
        anyhow::bail!(
            "stream `{}` has no delayed-retry set: entries sent for later wait there (add `delayed_retry = {{ key = \"...\" }}`)",
            sub.stream.stream
        );
    };
    let fields = [(
        sub.stream.payload_field.as_bytes().to_vec(),
        json.as_bytes().to_vec(),
    )];
    let target = schedule::Target {
        stream: &part.stream,
        group: &part.group,
        set: key,
        ttl: *ttl,
    };
    let done = schedule::schedule(conn, target, when, &fields)
        .await
        .with_context(|| format!("cannot schedule the entry in `{key}`"))?;
    Ok(format!(
        "scheduled {} for {} ({} from now by Redis's clock) in {key} for group {} ({} = {json})",
        done.id,
        crate::support::when::rfc3339_ms(done.due_ms),
        humantime::format_duration(std::time::Duration::from_millis(
            u64::try_from(done.due_ms - done.now_ms).unwrap_or(0)
        )),
        part.group,
        sub.stream.payload_field
    ))
}
