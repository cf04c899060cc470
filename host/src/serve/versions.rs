//! The handler API over each subscription's handler version:
//!
//! - `GET /v1/subscriptions`: a page of subscriptions, each with its handler's digest, since
//!   when it serves, the previous digest, swap counts, delivery counts and flow state (see
//!   [`super::listing`] for the query);
//! - `PUT /v1/subscriptions/{stream}/{group}/handler`: check and swap in a new handler (the
//!   same [`crate::control::swap`] as `sluice swap`);
//! - `POST /v1/subscriptions/{stream}/{group}/rollback`: put the previous handler back.
//!
//! They sit behind the `/v1` guard (see [`super::middleware`]).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::listing::{self, ListQuery};
use super::{AdminState, flow, rfc3339};
use crate::control::swap::{SwapControl, SwapError};

/// A JSON answer, or the status and text of a refusal.
type Answer = Result<axum::Json<serde_json::Value>, (StatusCode, String)>;

/// `GET /v1/subscriptions`: the page the query asks for, with the counts in the headers.
pub(super) async fn list_handler(
    State(state): State<AdminState>,
    Query(query): Query<ListQuery>,
) -> Response {
    if let Err(refusal) = query.check() {
        return refusal.into_response();
    }
    let page = listing::page(&state.swaps, &query, listing::MAX_LIMIT, None);
    let rows: Vec<serde_json::Value> = page
        .shown
        .iter()
        .map(|control| {
            let slot = control.slot();
            let current = slot.current();
            let (swaps, refusals) = slot.counts();
            let labels = slot.labels();
            let deliveries = state.metrics.handler_results(labels);
            let flow_state = state
                .index
                .first(&state.subscriptions, labels)
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
    (
        [
            ("x-total-count", page.matched.to_string()),
            ("x-offset", page.offset.to_string()),
            ("x-subscriptions", page.total.to_string()),
        ],
        axum::Json(rows),
    )
        .into_response()
}

/// The swap control of the subscription to `stream` with `group`, or a 404.
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

/// A swap's query: `force=true` accepts a descriptor naming another stream or group.
#[derive(serde::Deserialize)]
pub(super) struct SwapQuery {
    #[serde(default)]
    force: bool,
}

/// `PUT .../handler`: the body is the component; 409 when the handler changed meanwhile, 422
/// when the component is refused.
pub(super) async fn swap_handler(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    Query(query): Query<SwapQuery>,
    body: axum::body::Bytes,
) -> Answer {
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

/// `POST .../rollback`: the previous handler back; 409 when there is none.
pub(super) async fn rollback_handler(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
) -> Answer {
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
