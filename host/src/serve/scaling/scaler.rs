//! `sluice scaler`'s server: the scaling signal from Redis alone, for an autoscaler that must
//! wake a deployment at zero (no host runs to ask). It serves `GET /v1/scaling` and `GET
//! /metrics` (the two scaling series), both behind the token when one is configured (the
//! read-only one if there is one, else the operator's), and `GET /healthz`; nothing that
//! changes anything.
//!
//! The same defences as the host's admin server: a `Host` it answers to (DNS rebinding), no
//! cross-site browser requests, tokens compared in constant time with wrong ones answered
//! slowly, a deadline per request, bounded connections; beyond loopback a token is required.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use super::{ScalingQuery, answer, publish};
use crate::observe::metrics::Metrics;
use crate::serve::{AdminError, REQUEST_TIMEOUT, guard};
use crate::store::scaling::Board;

/// Who may read the signal: any of these tokens (none: anyone who reaches the address, which
/// must then be loopback).
#[derive(Clone, Default)]
pub struct ScalerTokens(pub Vec<String>);

#[derive(Clone)]
struct ScalerState {
    board: Arc<Board>,
    metrics: Arc<Metrics>,
    tokens: Arc<Vec<String>>,
    bound: SocketAddr,
    throttle: Arc<guard::Throttle>,
}

/// Why the scaler will not start.
#[derive(Debug, thiserror::Error)]
pub enum ScalerError {
    /// It would answer anyone beyond loopback.
    #[error(
        "sluice scaler would listen on {0}, beyond loopback, with no token: set admin_read_token_file (or admin_token_file) in the config"
    )]
    NoToken(SocketAddr),
    /// The address could not be bound.
    #[error(transparent)]
    Bind(#[from] AdminError),
}

/// Bind `addr` and serve `board` until `stop`; the bound address.
pub async fn serve(
    addr: SocketAddr,
    board: Arc<Board>,
    tokens: ScalerTokens,
    stop: CancellationToken,
) -> Result<SocketAddr, ScalerError> {
    if tokens.0.is_empty() && !addr.ip().is_loopback() {
        return Err(ScalerError::NoToken(addr));
    }
    let (listener, bound) = crate::serve::bind(addr).await?;
    let state = ScalerState {
        board,
        metrics: Arc::new(Metrics::new(true)),
        tokens: Arc::new(tokens.0),
        bound,
        throttle: Arc::default(),
    };
    let probes = Router::new().route("/healthz", get(|| async { "ok\n" }));
    let busy = probes
        .clone()
        .fallback(|| async { (StatusCode::SERVICE_UNAVAILABLE, "busy\n") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), guarded))
        .with_state(state.clone());
    // The series name every stream and group: behind the token too.
    let signal = Router::new()
        .route("/v1/scaling", get(scaling))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn_with_state(state.clone(), tokened));
    let app = probes
        .merge(signal)
        .layer(axum::middleware::from_fn_with_state(state.clone(), guarded))
        .with_state(state);
    tokio::spawn(crate::serve::connections::serve(listener, app, busy, stop));
    tracing::info!(addr = %bound, "sluice scaler listening (/v1/scaling, /metrics, /healthz)");
    Ok(bound)
}

/// Every request: a `Host` this server answers to, no cross-site browser request, a deadline.
async fn guarded(State(state): State<ScalerState>, request: Request, next: Next) -> Response {
    if let Err(refusal) = guard::host_allowed(request.headers(), state.bound)
        .and_then(|()| guard::not_cross_site(request.headers(), state.bound))
    {
        return refusal.into_response();
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::REQUEST_TIMEOUT, "the request took too long\n").into_response(),
    }
}

/// The signal's route: one of the tokens, when any is configured.
async fn tokened(State(state): State<ScalerState>, request: Request, next: Next) -> Response {
    if state.tokens.is_empty() {
        return next.run(request).await;
    }
    let given = guard::bearer(request.headers());
    if given.is_some_and(|given| state.tokens.iter().any(|t| guard::same_secret(given, t))) {
        return next.run(request).await;
    }
    state.throttle.refused("GET /v1/scaling").await;
    (StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n").into_response()
}

async fn scaling(
    State(state): State<ScalerState>,
    Query(q): Query<ScalingQuery>,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    answer(&state.board, &q).await
}

/// The two scaling series, per subscription.
async fn metrics(State(state): State<ScalerState>) -> impl IntoResponse {
    let readings = state.board.readings().await;
    let labels: Vec<_> = state
        .board
        .targets()
        .iter()
        .map(|t| Metrics::labels(&t.stream, &t.group))
        .collect();
    publish(&state.metrics, &labels, &readings);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
