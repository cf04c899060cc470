//! The admin HTTP server: `GET /metrics` (Prometheus text), `GET /healthz` (the process is
//! alive), `GET /readyz` (Redis answers for every subscription and every component is loaded;
//! 503 with the reason otherwise), and the handler API:
//!
//! - `GET /v1/subscriptions`: each subscription with its handler's digest, since when it serves,
//!   the previous digest, and swap counts;
//! - `PUT /v1/subscriptions/{stream}/{group}/handler` (body: the component; `?force=true`
//!   accepts a descriptor naming another stream or group): check and swap in a new handler;
//! - `POST /v1/subscriptions/{stream}/{group}/rollback`: put the previous handler back.
//!
//! It binds to loopback unless configured otherwise; beyond loopback a bearer token is required
//! (the config refuses to start without one). Mutating calls without the right token get 401
//! and a log line; uploads over `admin_max_upload` get 413.
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
use redis::aio::ConnectionManager;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, SubLabels};
use crate::swap::{SwapControl, SwapError};

/// How long a readiness or scrape probe waits for Redis.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the admin server knows about one subscription.
#[derive(Clone)]
pub struct AdminSubscription {
    /// Labels (stream, group).
    pub labels: SubLabels,
    /// A connection to its Redis.
    pub conn: ConnectionManager,
    /// Its delayed-retry set, if any.
    pub delayed_key: Option<String>,
    /// Its dead-letter stream.
    pub dead_letter: String,
    /// How its read loop is doing.
    pub health: Arc<crate::subscription::ReadHealth>,
}

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    subscriptions: Arc<Vec<AdminSubscription>>,
    swaps: Arc<Vec<Arc<SwapControl>>>,
    token: Option<Arc<str>>,
}

/// The handler API's settings.
pub struct AdminOptions {
    /// The bearer token mutating calls must carry, if any.
    pub token: Option<String>,
    /// The largest upload accepted, in bytes.
    pub max_upload: usize,
    /// One control per subscription.
    pub swaps: Vec<Arc<SwapControl>>,
}

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot start the admin server on {addr}: {source} (set `admin` in the config to another address, or \"off\")"
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
        metrics,
        subscriptions: Arc::new(subscriptions),
        swaps: Arc::new(options.swaps),
        token: options.token.map(Into::into),
    };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler))
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
        .with_state(state);
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(err) = served {
            tracing::error!(%err, "admin server failed");
        }
    });
    tracing::info!(addr = %bound, "admin server listening (/metrics, /healthz, /readyz)");
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
    if let Ok(Some(group)) =
        crate::subscription::read::group_info(&mut conn, &sub.labels.stream, &sub.labels.group)
            .await
    {
        metrics
            .pending
            .get_or_create(&sub.labels)
            .set(group.pending);
        if let Some(lag) = group.lag {
            metrics.lag.get_or_create(&sub.labels).set(lag);
        }
    }
    if let Ok(len) = redis::cmd("XLEN")
        .arg(&sub.dead_letter)
        .query_async::<i64>(&mut conn)
        .await
    {
        metrics.dead_letters.get_or_create(&sub.labels).set(len);
    }
    if let Some(key) = &sub.delayed_key
        && let Ok((parked, next_due_ms)) = crate::delayed::member::summary(&mut conn, key).await
    {
        metrics.parked.get_or_create(&sub.labels).set(parked);
        let due = next_due_ms.map_or(0, |ms| ms / 1000);
        metrics
            .parked_oldest_due
            .get_or_create(&sub.labels)
            .set(due);
    }
}

fn digest_short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

fn rfc3339(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
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
            let deliveries: u64 = crate::metrics::OUTCOMES
                .iter()
                .map(|outcome| state.metrics.outcome_count(labels, outcome))
                .sum();
            serde_json::json!({
                "stream": labels.stream,
                "group": labels.group,
                "digest": &*current.digest,
                "since": rfc3339(current.since),
                "previous_digest": slot.previous().map(|p| p.digest.to_string()),
                "swaps": swaps,
                "refusals": refusals,
                "deliveries": deliveries,
            })
        })
        .collect();
    axum::Json(rows)
}

/// Whether a mutating call may proceed; logs and answers 401 when not.
fn authorized(
    state: &AdminState,
    headers: &axum::http::HeaderMap,
    what: &str,
) -> Result<(), (StatusCode, String)> {
    let Some(token) = &state.token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(&**token) {
        return Ok(());
    }
    tracing::warn!(
        call = what,
        "admin call refused: missing or wrong bearer token"
    );
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
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    authorized(&state, &headers, "swap")?;
    let control = find(&state, &stream, &group)?;
    let origin = std::path::PathBuf::from(format!("upload for {stream}/{group}"));
    match control.swap(origin, body.to_vec(), query.force).await {
        Ok(version) => Ok(axum::Json(serde_json::json!({
            "digest": &*version.digest,
            "since": rfc3339(version.since),
        }))),
        Err(err @ SwapError::Changed { .. }) => Err((StatusCode::CONFLICT, format!("{err}\n"))),
        Err(err) => Err((StatusCode::UNPROCESSABLE_ENTITY, format!("{err}\n"))),
    }
}

async fn rollback_handler(
    State(state): State<AdminState>,
    axum::extract::Path((stream, group)): axum::extract::Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    authorized(&state, &headers, "rollback")?;
    let control = find(&state, &stream, &group)?;
    match control.rollback() {
        Ok(version) => {
            tracing::info!(
                stream,
                group,
                digest = digest_short(&version.digest),
                "rolled back"
            );
            Ok(axum::Json(
                serde_json::json!({ "digest": &*version.digest }),
            ))
        }
        Err(err) => Err((StatusCode::CONFLICT, format!("{err}\n"))),
    }
}
