//! `sluice swap`: a new component (or a rollback, or a canary) sent to a running host's admin
//! API.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

/// `sluice swap`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The subscription's stream.
    stream: String,
    /// The new component (omit with --rollback or --abort-canary).
    #[arg(required_unless_present_any = ["rollback", "abort_canary"])]
    component: Option<PathBuf>,
    /// Put the previous handler back instead.
    #[arg(long, conflicts_with = "component")]
    // Parsed for its help and its conflicts; never read: no component already means a rollback.
    #[allow(dead_code)]
    rollback: bool,
    /// Try the component on this share of deliveries first (e.g. 10%), on every host of
    /// the group; the hosts promote it or roll it back by themselves.
    #[arg(
        long,
        value_name = "PERCENT",
        requires = "component",
        conflicts_with = "force"
    )]
    canary: Option<String>,
    /// How long the canary runs (e.g. 5m; default: the subscription's `canary.window`).
    #[arg(long = "for", value_name = "DURATION", requires = "canary")]
    window: Option<String>,
    /// End the running canary: every host serves the current version again.
    #[arg(long, conflicts_with_all = ["component", "rollback", "canary"])]
    abort_canary: bool,
    /// The subscription's group (needed when the host reads the stream with several).
    #[arg(long)]
    group: Option<String>,
    /// Accept a component whose descriptor names another stream or group.
    #[arg(long)]
    force: bool,
    /// The host's admin API.
    #[arg(long, env = "SLUICE_ADMIN", default_value = "http://127.0.0.1:9187")]
    admin: String,
    /// Bearer token for the admin API.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Read the bearer token from this file.
    #[arg(long, conflicts_with = "token")]
    token_file: Option<PathBuf>,
}

/// `sluice swap`: what the host did goes to stdout.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let token = match args.token_file {
        Some(file) => Some(
            crate::config::TokenSource::File(file)
                .read()
                .map_err(anyhow::Error::msg)?,
        ),
        None => args.token,
    };
    let done = swap(SwapRequest {
        admin: args.admin,
        stream: args.stream,
        group: args.group,
        component: args.component,
        force: args.force,
        canary: args.canary,
        window: args.window,
        abort_canary: args.abort_canary,
        token,
    })
    .await?;
    print!("{done}");
    Ok(())
}

/// What `sluice swap` asks a host's admin API to do.
#[derive(Debug, Clone)]
pub struct SwapRequest {
    /// The admin API's base URL, e.g. `http://127.0.0.1:9187`.
    pub admin: String,
    /// The subscription's stream.
    pub stream: String,
    /// Its group; found from the host's list when there is only one for the stream.
    pub group: Option<String>,
    /// The new component, or `None` to roll back.
    pub component: Option<PathBuf>,
    /// Accept a descriptor naming another stream or group.
    pub force: bool,
    /// Try the component as a canary on this share (e.g. `10%`) instead of swapping.
    pub canary: Option<String>,
    /// The canary's window (e.g. `5m`); the subscription's configured one when `None`.
    pub window: Option<String>,
    /// End the running canary (rolled back on every host) instead.
    pub abort_canary: bool,
    /// The bearer token, if the host wants one.
    pub token: Option<String>,
}

/// `sluice swap`: send a new component (or a rollback) to a running host's admin API.
pub async fn swap(request: SwapRequest) -> Result<String> {
    tokio::task::spawn_blocking(move || swap_blocking(&request))
        .await
        .context("the swap request was interrupted")?
}

/// Refuse to send a token in the clear beyond this machine: over plain HTTP only to loopback.
fn token_may_travel(admin: &str) -> Result<()> {
    let uri: axum::http::Uri = admin
        .parse()
        .with_context(|| format!("`{admin}` is not a URL"))?;
    if uri.scheme_str() == Some("https") {
        return Ok(());
    }
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(());
    }
    anyhow::bail!(
        "refusing to send the admin token over plain HTTP to {host}: use https:// for a host beyond this machine (or an SSH tunnel to its loopback)"
    )
}

/// `GET /v1/subscriptions?stream=..[&group=..]` of the admin API at `base`: the host's
/// subscriptions to `stream` (a host of thousands answers them a page at a time, and a
/// stream has few groups).
fn subscriptions(
    agent: &ureq::Agent,
    base: &str,
    token: Option<&str>,
    stream: &str,
    group: Option<&str>,
) -> Result<serde_json::Value> {
    let mut get = agent
        .get(format!("{base}/v1/subscriptions"))
        .query("stream", stream);
    if let Some(group) = group {
        get = get.query("group", group);
    }
    if let Some(token) = token {
        get = get.header("Authorization", &format!("Bearer {token}"));
    }
    let mut response = get
        .call()
        .with_context(|| format!("cannot reach the admin API at {base}"))?;
    let text = response
        .body_mut()
        .read_to_string()
        .context("unexpected answer from the admin API")?;
    serde_json::from_str(&text).context("unexpected answer from the admin API")
}

/// The digest the host at `admin` serves for the subscription to `stream` with `group`.
pub(crate) async fn serving_digest(
    admin: &str,
    token: Option<&str>,
    stream: &str,
    group: &str,
) -> Result<String> {
    let (admin, token) = (admin.to_owned(), token.map(str::to_owned));
    let (stream, group) = (stream.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || {
        if token.is_some() {
            token_may_travel(&admin)?;
        }
        let agent = agent();
        let base = admin.trim_end_matches('/');
        let list = subscriptions(&agent, base, token.as_deref(), &stream, Some(&group))?;
        list.as_array()
            .into_iter()
            .flatten()
            .find(|s| s["stream"] == stream.as_str() && s["group"] == group.as_str())
            .and_then(|s| s["digest"].as_str().map(str::to_owned))
            .with_context(|| {
                format!("the host at {base} has no subscription to stream `{stream}` with group `{group}`")
            })
    })
    .await
    .context("the request was interrupted")?
}

/// An HTTP client that returns the admin API's refusals as answers, so their text is shown.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// [`swap`], on a thread that may block.
fn swap_blocking(request: &SwapRequest) -> Result<String> {
    if request.token.is_some() {
        token_may_travel(&request.admin)?;
    }
    let agent = agent();
    let base = request.admin.trim_end_matches('/');
    let group = match &request.group {
        Some(group) => group.clone(),
        None => only_group(&agent, base, request)?,
    };
    let encode = |s: &str| {
        s.replace('%', "%25")
            .replace('/', "%2F")
            .replace('{', "%7B")
            .replace('}', "%7D")
    };
    let path = format!(
        "{base}/v1/subscriptions/{}/{}",
        encode(&request.stream),
        encode(&group)
    );
    let mut response = send(&agent, base, &path, request)?;
    let status = response.status();
    let body = response.body_mut().read_to_string().unwrap_or_default();
    if !status.is_success() {
        anyhow::bail!("the host refused ({status}): {}", body.trim());
    }
    let answer: serde_json::Value =
        serde_json::from_str(&body).context("unexpected answer from the admin API")?;
    Ok(done(request, &group, &answer))
}

/// The group of the host's only subscription to the request's stream (no `--group` given).
fn only_group(agent: &ureq::Agent, base: &str, request: &SwapRequest) -> Result<String> {
    let list = subscriptions(agent, base, request.token.as_deref(), &request.stream, None)?;
    let groups: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["stream"] == request.stream.as_str())
        .filter_map(|s| s["group"].as_str().map(str::to_owned))
        .collect();
    match groups.as_slice() {
        [group] => Ok(group.clone()),
        [] => anyhow::bail!(
            "the host at {base} has no subscription to stream `{}`",
            request.stream
        ),
        _ => anyhow::bail!(
            "the host at {base} reads stream `{}` with several groups ({}); pass --group",
            request.stream,
            groups.join(", ")
        ),
    }
}

/// Ask the subscription's resource at `path` (of the admin API at `base`) for what the request
/// wants: end the canary, start one, swap, or roll back.
fn send(
    agent: &ureq::Agent,
    base: &str,
    path: &str,
    request: &SwapRequest,
) -> Result<ureq::http::Response<ureq::Body>> {
    let auth = request.token.as_ref().map(|t| format!("Bearer {t}"));
    let query = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                )
            })
            .collect::<Vec<_>>()
            .join("&")
    };
    let read = |component: &PathBuf| {
        std::fs::read(component).with_context(|| format!("cannot read {}", component.display()))
    };
    let response = match (&request.component, &request.canary) {
        _ if request.abort_canary => {
            let mut post = agent.post(format!("{path}/canary/abort"));
            if let Some(auth) = &auth {
                post = post.header("Authorization", auth);
            }
            post.send_empty()
        }
        (Some(component), Some(share)) => {
            let bytes = read(component)?;
            let mut pairs = vec![("percent", share.as_str())];
            if let Some(window) = &request.window {
                pairs.push(("for", window.as_str()));
            }
            let mut put = agent.put(format!("{path}/canary?{}", query(&pairs)));
            if let Some(auth) = &auth {
                put = put.header("Authorization", auth);
            }
            put.send(&bytes[..])
        }
        (Some(component), None) => {
            let bytes = read(component)?;
            let mut put = agent.put(format!(
                "{path}/handler{}",
                if request.force { "?force=true" } else { "" }
            ));
            if let Some(auth) = &auth {
                put = put.header("Authorization", auth);
            }
            put.send(&bytes[..])
        }
        (None, _) => {
            let mut post = agent.post(format!("{path}/rollback"));
            if let Some(auth) = &auth {
                post = post.header("Authorization", auth);
            }
            post.send_empty()
        }
    };
    response.with_context(|| format!("cannot reach the admin API at {base}"))
}

/// What `sluice swap` says the host did, from its answer.
fn done(request: &SwapRequest, group: &str, answer: &serde_json::Value) -> String {
    let digest = answer["digest"].as_str().unwrap_or("?");
    let short = |key: &str| {
        answer[key]
            .as_str()
            .unwrap_or("?")
            .chars()
            .take(12)
            .collect::<String>()
    };
    if request.abort_canary {
        format!(
            "aborted the canary of {} on `{}`/`{group}`: every host serves {} again\n",
            short("candidate"),
            request.stream,
            short("incumbent")
        )
    } else if request.canary.is_some() {
        format!(
            "canary started on `{}`/`{group}`: {}% of deliveries run {} until {}; the hosts promote or roll it back by themselves (`sluice swap {} --abort-canary` to stop it)\n",
            request.stream,
            answer["share_percent"],
            short("candidate"),
            answer["ends"].as_str().unwrap_or("?"),
            request.stream,
        )
    } else if request.component.is_some() {
        format!("swapped `{}`/`{group}` to {digest}\n", request.stream)
    } else {
        format!("rolled `{}`/`{group}` back to {digest}\n", request.stream)
    }
}
