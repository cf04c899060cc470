//! The admin API over a subscription's flow controls (see [`crate::pipeline::admit`]), the same calls as
//! `sluice pause` and `sluice resume`. `{stream}` and `{group}` name the subscription (not
//! one of its partitions): a pause holds every partition on every host of the group.
//!
//! - `POST /v1/subscriptions/{stream}/{group}/pause` with an optional
//!   `{"by": "...", "reason": "..."}`: `{paused, already, by, at, reason}`; a second pause keeps
//!   the first one's record (`already: true`).
//! - `POST /v1/subscriptions/{stream}/{group}/resume`: `{resumed, was}` (`was`: the pause that
//!   ended, `null` when it was not paused).
//! - `GET /v1/subscriptions/{stream}/{group}/journal`: `{items}`, the pauses, resumes and
//!   circuit-breaker transitions, newest first (see [`crate::pipeline::admit::journal`]).
//!
//! All sit behind the `/v1` guard (token, no cross-site browser requests) and the body is
//! bounded like every other call's.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;

use super::AdminState;
use crate::pipeline::admit::{self, PauseResult, Paused};

type Answer = Result<axum::Json<serde_json::Value>, (StatusCode, String)>;

/// Who a call without a `by` is recorded as.
const ANONYMOUS: &str = "the admin API";

/// The pause, resume and journal calls.
pub(super) fn routes() -> Router<AdminState> {
    let base = "/v1/subscriptions/{stream}/{group}";
    Router::new()
        .route(&format!("{base}/pause"), post(pause))
        .route(&format!("{base}/resume"), post(resume))
        .route(&format!("{base}/journal"), axum::routing::get(journal))
}

/// A pause's JSON, as the API and the page show it.
pub(super) fn paused_json(paused: &Paused) -> serde_json::Value {
    serde_json::json!({
        "by": paused.by,
        "at": paused.at(),
        "at_ms": paused.at_ms,
        "reason": paused.reason,
    })
}

/// An open or half-open breaker's JSON, as the API shows it.
pub(super) fn breaker_json(b: &crate::pipeline::admit::breaker::BreakerState) -> serde_json::Value {
    let at = |ms: u64| {
        (ms != 0).then(|| {
            crate::serve::rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        })
    };
    serde_json::json!({
        "state": b.name(),
        "since": at(b.since_ms),
        "until": at(b.until_ms),
        "failed": b.failed.map(|(f, _)| f),
        "of": b.failed.map(|(_, of)| of),
        "why": b.why,
        "by": b.by,
        "describe": b.describe(),
    })
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    by: Option<String>,
    reason: Option<String>,
}

/// A connection to the Redis of the subscription named `stream` and `group` on this host.
fn redis_of(
    state: &AdminState,
    stream: &str,
    group: &str,
) -> Result<crate::store::redis_conn::RedisHandle, (StatusCode, String)> {
    state
        .subscriptions
        .iter()
        .find(|s| s.of.stream == stream && s.of.group == group)
        .map(|s| s.conn.clone())
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("no subscription to stream `{stream}` with group `{group}` on this host\n"),
            )
        })
}

fn failed(err: &admit::FlowError) -> (StatusCode, String) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{}\n", crate::support::chain::chain(err)),
    )
}

async fn pause(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Answer {
    let body: PauseBody = if body.iter().all(u8::is_ascii_whitespace) {
        PauseBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|err| {
            (
                StatusCode::BAD_REQUEST,
                format!("the body is not {{\"by\": \"...\", \"reason\": \"...\"}}: {err}\n"),
            )
        })?
    };
    let mut conn = redis_of(&state, &stream, &group)?;
    let by = match body.by.as_deref().map(str::trim) {
        Some(by) if !by.is_empty() => format!("{by} (through the admin API)"),
        _ => ANONYMOUS.to_owned(),
    };
    let asked = Paused::now(&by, body.reason.as_deref());
    let result = admit::pause(&mut conn, &stream, &group, asked)
        .await
        .map_err(|err| failed(&err))?;
    let (paused, already) = match result {
        PauseResult::Paused(p) => (p, false),
        PauseResult::Already(p) => (p, true),
    };
    if !already {
        tracing::warn!(stream, group, "{} (admin API)", paused.describe());
    }
    let mut answer = paused_json(&paused);
    answer["paused"] = true.into();
    answer["already"] = already.into();
    Ok(axum::Json(answer))
}

async fn resume(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
) -> Answer {
    let mut conn = redis_of(&state, &stream, &group)?;
    let was = admit::resume(&mut conn, &stream, &group, "the admin API")
        .await
        .map_err(|err| failed(&err))?;
    if let Some(was) = &was {
        tracing::info!(
            stream,
            group,
            "resumed (admin API); it was {}",
            was.describe()
        );
    }
    Ok(axum::Json(serde_json::json!({
        "resumed": was.is_some(),
        "was": was.as_ref().map(paused_json),
    })))
}

/// `GET .../journal`: the subscription's pauses, resumes and breaker transitions, newest first.
async fn journal(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
) -> Answer {
    let mut conn = redis_of(&state, &stream, &group)?;
    let entries = admit::journal::read(&mut conn, &stream, &group, admit::journal::MAX_ENTRIES)
        .await
        .map_err(|err| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "cannot read the flow journal: {}\n",
                    crate::support::chain::chain(&err)
                ),
            )
        })?;
    let items: Vec<_> = entries
        .iter()
        .map(|j| {
            serde_json::json!({
                "at_ms": j.at_ms,
                "at": crate::support::when::rfc3339_ms(j.at_ms),
                "what": j.what,
                "by": j.by,
                "detail": j.detail,
            })
        })
        .collect();
    Ok(axum::Json(serde_json::json!({ "items": items })))
}
