//! The admin API over an ordered subscription's keys (see [`crate::pipeline::order`]), the
//! same reads and release as `sluice keys`:
//!
//! - `GET .../keys?limit=`: `{waiting_keys, turns_held, keys: [{key, digest, waiting,
//!   waiting_since_ms, holders: [{origin_id, since_ms, dead_letter}], holders_complete}]}`, the
//!   keys that waited longest first (at most 200 per call); `holders_complete` is false when
//!   the turns were more than one listing scans (`inspect::MAX_TURNS_SCANNED`).
//! - `POST .../keys/release` with `{"key": "..."}` (or `{"digest": "..."}` for a key that is
//!   no text): every turn of the key given back, its waiting entries let in; `{turns, let_in}`.
//!
//! Behind the `/v1` guard like every call; 404 on a subscription that is not ordered.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};

use super::AdminState;
use super::waiting::subscription;
use crate::pipeline::order::{self, OrderKeys, inspect};

type Answer = Result<axum::Json<serde_json::Value>, (StatusCode, String)>;

/// The most keys one listing returns.
const MAX_KEYS: usize = 200;

/// The calls over ordered keys.
pub(super) fn routes() -> Router<AdminState> {
    let base = "/v1/subscriptions/{stream}/{group}";
    Router::new()
        .route(&format!("{base}/keys"), get(list))
        .route(&format!("{base}/keys/release"), post(release))
}

#[derive(serde::Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

fn not_ordered(stream: &str) -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        format!("the subscription to `{stream}` is not ordered (no ordered_by)\n"),
    )
}

fn unavailable(err: redis::RedisError) -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n"))
}

async fn list(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<ListQuery>,
) -> Answer {
    let (sub, _) = subscription(&state, &stream, &group)?;
    if sub.ordered.is_none() {
        return Err(not_ordered(&stream));
    }
    let mut conn = sub.conn.clone();
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_KEYS);
    let overview = inspect::overview(&mut conn, &OrderKeys::new(&stream, &group), limit)
        .await
        .map_err(unavailable)?;
    Ok(axum::Json(
        serde_json::to_value(overview).unwrap_or_default(),
    ))
}

/// The key to release: its text, or its digest (a key that is no text, as the listing names
/// it).
#[derive(serde::Deserialize)]
struct Release {
    key: Option<String>,
    digest: Option<String>,
}

async fn release(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    axum::Json(body): axum::Json<Release>,
) -> Answer {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let (Some((spec, ttl_ms)), Some(set)) = (&sub.ordered, keys.delayed.as_deref()) else {
        return Err(not_ordered(&stream));
    };
    let digest = match (&body.key, &body.digest) {
        (Some(key), None) if key.len() > spec.max_key_bytes => {
            return Err((
                StatusCode::BAD_REQUEST,
                format!(
                    "a key of {} bytes is longer than max_key_bytes ({}): such keys are never ordered\n",
                    key.len(),
                    spec.max_key_bytes
                ),
            ));
        }
        (Some(key), None) => order::digest(key.as_bytes()),
        (None, Some(digest))
            if digest.len() == 40 && digest.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            digest.to_ascii_lowercase()
        }
        _ => {
            return Err((
                StatusCode::BAD_REQUEST,
                "give the key (`key`) or its digest (`digest`, 40 hex digits), one of them\n"
                    .into(),
            ));
        }
    };
    let mut conn = sub.conn.clone();
    let (turns, let_in) = order::release(
        &mut conn,
        &OrderKeys::new(&stream, &group),
        set,
        &digest,
        spec.max_in_flight_per_key,
        *ttl_ms,
    )
    .await
    .map_err(unavailable)?;
    tracing::info!(
        stream,
        group,
        turns,
        let_in,
        "ordered key released by the admin API"
    );
    Ok(axum::Json(
        serde_json::json!({ "turns": turns, "let_in": let_in }),
    ))
}
