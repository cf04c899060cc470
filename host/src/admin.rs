//! The admin HTTP server: `GET /metrics` (Prometheus text), `GET /healthz` (the process is
//! alive) and `GET /readyz` (Redis answers for every subscription and every component is
//! loaded; 503 with the reason otherwise). It binds to loopback unless configured otherwise.
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
}

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    subscriptions: Arc<Vec<AdminSubscription>>,
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
    };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler))
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
    let groups: redis::RedisResult<Vec<std::collections::HashMap<String, redis::Value>>> =
        redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&sub.labels.stream)
            .query_async(&mut conn)
            .await;
    if let Ok(groups) = groups {
        let name = redis::Value::BulkString(sub.labels.group.as_bytes().to_vec());
        if let Some(group) = groups.iter().find(|g| g.get("name") == Some(&name)) {
            if let Some(redis::Value::Int(n)) = group.get("pending") {
                metrics.pending.get_or_create(&sub.labels).set(*n);
            }
            if let Some(redis::Value::Int(n)) = group.get("lag") {
                metrics.lag.get_or_create(&sub.labels).set(*n);
            }
        }
    }
    if let Ok(len) = redis::cmd("XLEN")
        .arg(&sub.dead_letter)
        .query_async::<i64>(&mut conn)
        .await
    {
        metrics.dead_letters.get_or_create(&sub.labels).set(len);
    }
    if let Some(key) = &sub.delayed_key {
        if let Ok(card) = redis::cmd("ZCARD")
            .arg(key)
            .query_async::<i64>(&mut conn)
            .await
        {
            metrics.parked.get_or_create(&sub.labels).set(card);
        }
        let first: redis::RedisResult<Vec<(Vec<u8>, f64)>> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await;
        if let Ok(first) = first {
            let due = first
                .first()
                .map_or(0, |(_, score)| (*score / 1000.0) as i64);
            metrics
                .parked_oldest_due
                .get_or_create(&sub.labels)
                .set(due);
        }
    }
}
