//! The admin HTTP server: `GET /metrics` (Prometheus text), `GET /healthz` (the process is
//! alive), `GET /readyz` (Redis answers for every subscription and every component is loaded;
//! 503 with the reason otherwise), and the handler API:
//!
//! - `GET /v1/subscriptions`: each subscription with its handler's digest, since when it serves,
//!   the previous digest, and swap counts;
//! - `PUT /v1/subscriptions/{stream}/{group}/handler` (body: the component; `?force=true`
//!   accepts a descriptor naming another stream or group): check and swap in a new handler;
//! - `POST /v1/subscriptions/{stream}/{group}/rollback`: put the previous handler back;
//! - `.../dead-letters` and `.../parked`: list and act on what waits (see `waiting.rs`);
//! - `POST .../pause` and `.../resume`: hold or release the subscription on every host of its
//!   group (see `flow.rs`);
//! - `/` and `/ui/...`: the web page (see `ui/`).
//!
//! Who may call it:
//! - It binds to loopback unless configured otherwise; beyond loopback a bearer token is
//!   required (the config refuses to start without one).
//! - Mutating calls (swap, rollback) always need the token, on loopback too: a guest with an
//!   HTTP grant or any local process could otherwise swap a handler. Only
//!   `admin_open_on_loopback = true` (explicit, loopback only) lets them through without one.
//! - With a token configured, the `/v1` listings need it too. `/metrics`, `/healthz` and
//!   `/readyz` stay open for probes and scrapers.
//! - The token is checked (in constant time) before any body is read; a declared
//!   `Content-Length` over `admin_max_upload` is refused at once (413); one upload at a time
//!   (429 for the next); every request must finish within [`REQUEST_TIMEOUT`] (408); at most
//!   [`MAX_CONNECTIONS`] connections are served at once.
//! - Browsers: a request whose `Host` is not the bound address or a loopback name is refused
//!   (DNS rebinding), and so is any `/v1` request a browser marks as cross-site (`Origin` of
//!   another host, `Sec-Fetch-Site: cross-site`): CSRF.
//!
//! Gauges that describe Redis (pending entries, lag, parked entries, dead letters) are sampled
//! from Redis at scrape time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

mod flow;
mod guard;
mod rollout;
mod ui;
mod waiting;

use crate::metrics::{Metrics, SubLabels};
use crate::swap::{SwapControl, SwapError};

/// How long a readiness or scrape probe waits for Redis.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest one request (upload included) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 64;

/// What the admin server knows about one subscription (one partition of a partitioned one).
#[derive(Clone)]
pub struct AdminSubscription {
    /// Labels (stream, group).
    pub labels: SubLabels,
    /// The subscription's labels (differ from `labels` on a partition).
    pub of: SubLabels,
    /// A connection to its Redis.
    pub conn: crate::redis_conn::RedisHandle,
    /// Its delayed-retry set, if any.
    pub delayed_key: Option<String>,
    /// Its retry lane, if it has one.
    pub lane: Option<String>,
    /// Its dead-letter stream.
    pub dead_letter: String,
    /// Trim it to about this many entries.
    pub dead_letter_maxlen: Option<u64>,
    /// How its read loop is doing.
    pub health: Arc<crate::health::ReadHealth>,
    /// What `sluice check` warned about its configuration, shown on the page too.
    pub warnings: Vec<String>,
    /// Its flow controls, as this host knows them (the subscription's, on a partition).
    pub flow: tokio::sync::watch::Receiver<crate::flow::FlowState>,
    /// Its shared rate limit, if configured.
    pub rate_limit: Option<crate::config::RateLimit>,
    /// Its circuit breaker, if configured.
    pub circuit_breaker: Option<crate::config::CircuitBreaker>,
    /// This host's consumer name in its group.
    pub consumer: String,
}

impl AdminSubscription {
    /// Its Redis keys.
    pub fn keys(&self) -> crate::keys::SubscriptionKeys {
        crate::keys::SubscriptionKeys::new(
            &self.labels.stream,
            &self.labels.group,
            &self.dead_letter,
            self.delayed_key.as_deref(),
        )
        .with_dead_letter_maxlen(self.dead_letter_maxlen)
        .with_retry_lane(self.lane.is_some())
    }
}

/// Deliveries counted so far at one moment, for the page's chart: acked, retried, failed
/// (dead-lettered by the handler, trapped or over a limit).
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    at_ms: i64,
    counts: [u64; 3],
}

/// How often the chart's counts are sampled, and how many samples are kept (10 minutes).
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const SAMPLES: usize = 121;

#[derive(Clone)]
struct AdminState {
    sessions: Arc<ui::Sessions>,
    samples: Arc<std::sync::Mutex<std::collections::VecDeque<Sample>>>,
    metrics: Arc<Metrics>,
    subscriptions: Arc<Vec<AdminSubscription>>,
    swaps: Arc<Vec<Arc<SwapControl>>>,
    rollouts: Arc<Vec<Arc<crate::rollout::Rollout>>>,
    token: Option<Arc<str>>,
    open_on_loopback: bool,
    read_only: bool,
    max_upload: usize,
    bound: SocketAddr,
    uploads: Arc<tokio::sync::Semaphore>,
    /// Wrong tokens, for the API and the page's login alike.
    throttle: Arc<guard::Throttle>,
}

/// The handler API's settings.
pub struct AdminOptions {
    /// The bearer token mutating calls must carry, if any.
    pub token: Option<String>,
    /// Let mutating calls through without a token (loopback only; the operator's explicit
    /// choice).
    pub open_on_loopback: bool,
    /// The largest upload accepted, in bytes.
    pub max_upload: usize,
    /// Refuse (and hide) every action: the API and the page only show.
    pub read_only: bool,
    /// One control per subscription.
    pub swaps: Vec<Arc<SwapControl>>,
    /// One rollout per subscription (canaries, replays).
    pub rollouts: Vec<Arc<crate::rollout::Rollout>>,
}

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot start the admin server on {addr} (set `admin` in the config to another address, or \"off\")"
)]
pub struct AdminError {
    addr: SocketAddr,
    source: std::io::Error,
}

/// Bind `addr` and serve until `stop`; returns the bound address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    subscriptions: Vec<AdminSubscription>,
    options: AdminOptions,
    stop: CancellationToken,
) -> Result<SocketAddr, AdminError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AdminError { addr, source })?;
    let state = AdminState {
        sessions: Arc::default(),
        samples: Arc::default(),
        metrics,
        subscriptions: Arc::new(subscriptions),
        swaps: Arc::new(options.swaps),
        rollouts: Arc::new(options.rollouts),
        token: options.token.map(Into::into),
        open_on_loopback: options.open_on_loopback && bound.ip().is_loopback(),
        read_only: options.read_only,
        max_upload: options.max_upload,
        bound,
        uploads: Arc::new(tokio::sync::Semaphore::new(1)),
        throttle: Arc::default(),
    };
    let api = Router::new()
        .route("/v1/subscriptions", get(list_handler))
        .route(
            "/v1/subscriptions/{stream}/{group}/handler",
            axum::routing::put(swap_handler)
                .layer(axum::extract::DefaultBodyLimit::max(options.max_upload)),
        )
        .route(
            "/v1/subscriptions/{stream}/{group}/rollback",
            axum::routing::post(rollback_handler),
        )
        .merge(waiting::routes())
        .merge(flow::routes())
        .merge(rollout::routes(options.max_upload))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_api,
        ));
    let page = ui::routes(options.max_upload).layer(axum::middleware::from_fn_with_state(
        state.clone(),
        ui::guard_ui_hardened,
    ));
    tokio::spawn(sample_outcomes(state.clone(), stop.clone()));
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler))
        .merge(api)
        .merge(page)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_all,
        ))
        .with_state(state);
    let listener = guard::Limited::new(listener, MAX_CONNECTIONS);
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(err) = served {
            tracing::error!(%err, "admin server failed");
        }
    });
    tracing::info!(addr = %bound, "admin server listening (/ui/, /metrics, /healthz, /readyz)");
    Ok(bound)
}

async fn ready_handler(State(state): State<AdminState>) -> impl IntoResponse {
    for sub in state.subscriptions.iter() {
        if let Some(problem) = sub.health.problem() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "not ready: the subscription to stream `{}` (group `{}`) cannot read: {problem}\n",
                    sub.labels.stream, sub.labels.group
                ),
            );
        }
        let mut conn = sub.conn.clone();
        let ping = tokio::time::timeout(
            PROBE_TIMEOUT,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await;
        let problem = match ping {
            Ok(Ok(_)) => continue,
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: Redis for stream `{}` (group `{}`) is unreachable: {problem}\n",
                sub.labels.stream, sub.labels.group
            ),
        );
    }
    (StatusCode::OK, "ready\n".to_owned())
}

async fn metrics_handler(State(state): State<AdminState>) -> impl IntoResponse {
    for sub in state.subscriptions.iter() {
        if let Err(err) = tokio::time::timeout(PROBE_TIMEOUT, sample(&state.metrics, sub)).await {
            tracing::debug!(%err, stream = %sub.labels.stream, "Redis gauges not sampled");
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// Refresh the Redis-state gauges of one subscription.
async fn sample(metrics: &Metrics, sub: &AdminSubscription) {
    let mut conn = sub.conn.clone();
    let Ok(snapshot) = crate::inspect::snapshot(
        &mut conn,
        &sub.labels.stream,
        &sub.labels.group,
        &sub.dead_letter,
        sub.delayed_key.as_deref(),
        sub.lane.as_deref(),
    )
    .await
    else {
        return;
    };
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    if let Ok(size) = crate::inspect::stream_size(&mut conn, &sub.labels.stream).await {
        metrics
            .stream_length
            .get_or_create(&sub.labels)
            .set(gauge(size.length));
        metrics
            .stream_bytes
            .get_or_create(&sub.labels)
            .set(gauge(size.bytes));
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        metrics.stream_oldest_age.get_or_create(&sub.labels).set(
            size.oldest_ms
                .map_or(0, |oldest| (now_ms - oldest).max(0) / 1000),
        );
    }
    // With a retry lane, its pending and unread entries count too: they are the same
    // subscription's work.
    let lane = snapshot.lane;
    if let Some(group) = snapshot.group {
        let lane_pending = lane.as_ref().map_or(0, |l| l.pending as u64);
        metrics
            .pending
            .get_or_create(&sub.labels)
            .set(gauge(group.pending as u64 + lane_pending));
        if let Some(lag) = group.lag {
            let lane_lag = lane.as_ref().and_then(|l| l.lag).unwrap_or(0);
            metrics
                .lag
                .get_or_create(&sub.labels)
                .set(gauge((lag + lane_lag) as u64));
        }
    }
    metrics
        .dead_letters
        .get_or_create(&sub.labels)
        .set(gauge(snapshot.dead_letters));
    if let Some(delayed) = snapshot.delayed {
        metrics
            .parked
            .get_or_create(&sub.labels)
            .set(gauge(delayed.parked));
        let due = delayed.next_due_ms.map_or(0, |ms| ms / 1000);
        metrics
            .parked_oldest_due
            .get_or_create(&sub.labels)
            .set(due);
    }
}

/// Every [`SAMPLE_EVERY`], the host's delivery counts, for the page's chart.
async fn sample_outcomes(state: AdminState, stop: CancellationToken) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let mut counts = [0u64; 3];
        for sub in state.subscriptions.iter() {
            for (label, n) in state.metrics.outcomes(&sub.labels) {
                let i = match label {
                    "ack" => 0,
                    "retry" => 1,
                    _ => 2,
                };
                counts[i] += n;
            }
        }
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if let Ok(mut samples) = state.samples.lock() {
            if samples.len() == SAMPLES {
                samples.pop_front();
            }
            samples.push_back(Sample { at_ms, counts });
        }
    }
}

pub(crate) fn rfc3339(at: std::time::SystemTime) -> String {
    crate::when::rfc3339(at)
}

async fn list_handler(State(state): State<AdminState>) -> impl IntoResponse {
    let rows: Vec<serde_json::Value> = state
        .swaps
        .iter()
        .map(|control| {
            let slot = control.slot();
            let current = slot.current();
            let (swaps, refusals) = slot.counts();
            let labels = slot.labels();
            let deliveries = state.metrics.handler_results(labels);
            let flow_state = state
                .subscriptions
                .iter()
                .find(|s| s.of == *labels)
                .map(|s| s.flow.borrow().clone())
                .unwrap_or_default();
            let paused = flow_state.paused.as_ref().map(flow::paused_json);
            let breaker = flow_state.breaker.as_ref().map(flow::breaker_json);
            serde_json::json!({
                "stream": labels.stream,
                "group": labels.group,
                "digest": current.digest,
                "since": rfc3339(current.since),
                "previous_digest": slot.previous().map(|p| p.digest.clone()),
                "swaps": swaps,
                "refusals": refusals,
                "deliveries": deliveries,
                "paused": paused,
                "breaker": breaker,
            })
        })
        .collect();
    axum::Json(rows)
}

type Refusal = (StatusCode, String);

/// Every request: a `Host` this server answers to (DNS rebinding), and a deadline.
async fn guard_all(
    State(state): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Err(refusal) = guard::host_allowed(request.headers(), state.bound) {
        return refusal.into_response();
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("the request took longer than {REQUEST_TIMEOUT:?}\n"),
        )
            .into_response(),
    }
}

/// The `/v1` API: no cross-site browser requests, the token before the body, the size before
/// the body, one upload at a time.
async fn guard_api(
    State(state): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let what = format!("{} {}", request.method(), request.uri().path());
    let mutating = request.method() != axum::http::Method::GET;
    let checked = guard::not_cross_site(request.headers(), state.bound)
        .and_then(|()| authorized(&state, request.headers(), &what, mutating))
        .and_then(|()| guard::declared_size(request.headers(), state.max_upload));
    if let Err(refusal) = checked {
        if refusal.0 == StatusCode::UNAUTHORIZED {
            state.throttle.refused(&what).await;
        }
        return refusal.into_response();
    }
    let _upload = if request.method() == axum::http::Method::PUT {
        match state.uploads.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    "another upload is in progress; try again when it is done\n",
                )
                    .into_response();
            }
        }
    } else {
        None
    };
    next.run(request).await
}

/// Whether a `/v1` call may proceed; logs and answers 401/403 when not.
fn authorized(
    state: &AdminState,
    headers: &axum::http::HeaderMap,
    what: &str,
    mutating: bool,
) -> Result<(), Refusal> {
    if mutating && state.read_only {
        tracing::warn!(
            call = what,
            "admin call refused: the admin server is read-only"
        );
        return Err((
            StatusCode::FORBIDDEN,
            "the admin server is read-only (admin_read_only = true)\n".to_owned(),
        ));
    }
    let Some(token) = &state.token else {
        if !mutating || state.open_on_loopback {
            return Ok(());
        }
        tracing::warn!(
            call = what,
            "admin call refused: no admin token is configured"
        );
        return Err((
            StatusCode::FORBIDDEN,
            "this call changes the host and needs a bearer token: set admin_token_file or admin_token_env (or admin_open_on_loopback = true to allow it without one on loopback)\n".to_owned(),
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|given| guard::same_secret(given, token)) {
        return Ok(());
    }
    // Logged by the throttle, which also makes the answer wait.
    Err((
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token\n".to_owned(),
    ))
}

fn find<'a>(
    state: &'a AdminState,
    stream: &str,
    group: &str,
) -> Result<&'a Arc<SwapControl>, (StatusCode, String)> {
    state
        .swaps
        .iter()
        .find(|c| c.slot().labels().stream == stream && c.slot().labels().group == group)
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("no subscription to stream `{stream}` with group `{group}` on this host\n"),
            )
        })
}

#[derive(serde::Deserialize)]
struct SwapQuery {
    #[serde(default)]
    force: bool,
}

async fn swap_handler(
    State(state): State<AdminState>,
    axum::extract::Path((stream, group)): axum::extract::Path<(String, String)>,
    axum::extract::Query(query): axum::extract::Query<SwapQuery>,
    body: axum::body::Bytes,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    let control = find(&state, &stream, &group)?;
    let origin = std::path::PathBuf::from(format!("upload for {stream}/{group}"));
    match control.swap(origin, body.to_vec(), query.force).await {
        Ok(version) => Ok(axum::Json(serde_json::json!({
            "digest": version.digest,
            "since": rfc3339(version.since),
        }))),
        Err(err @ SwapError::Changed { .. }) => {
            Err((StatusCode::CONFLICT, format!("{}\n", err.explain())))
        }
        Err(err) => Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("{}\n", err.explain()),
        )),
    }
}

async fn rollback_handler(
    State(state): State<AdminState>,
    axum::extract::Path((stream, group)): axum::extract::Path<(String, String)>,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    let control = find(&state, &stream, &group)?;
    match control.rollback() {
        Ok(version) => {
            tracing::info!(
                stream,
                group,
                digest = version.digest.short(),
                "rolled back"
            );
            Ok(axum::Json(serde_json::json!({ "digest": version.digest })))
        }
        Err(err) => Err((StatusCode::CONFLICT, format!("{}\n", err.explain()))),
    }
}
