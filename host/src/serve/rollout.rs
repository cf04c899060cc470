//! The admin API over a subscription's rollouts (see [`crate::control::rollout`]), the same calls as
//! `sluice swap --canary` and `sluice replay`. `{stream}` and `{group}` name the subscription;
//! a canary runs on every host of the group, whichever host was asked.
//!
//! - `PUT /v1/subscriptions/{stream}/{group}/canary?percent=10&for=5m&by=NAME` with the
//!   candidate component as the body: checks it as a swap would and starts the canary; the
//!   record. 409 while another runs, 422 for a refused candidate or a bad share or window.
//! - `GET /v1/subscriptions/{stream}/{group}/canary`: the canary as Redis holds it (record,
//!   verdict, both versions' totals for the group).
//! - `POST /v1/subscriptions/{stream}/{group}/canary/abort` with an optional `{"by": "..."}`:
//!   rolls the running canary back on every host.
//! - `POST /v1/subscriptions/{stream}/{group}/replay?reason=R&limit=N&allow_http=h1,h2&requeue_acked=true`
//!   with the candidate as the body: runs it on dead letters in a dry run (see
//!   [`crate::control::rollout::replay`]); `requeue_acked` only when the candidate is what serves.
//!
//! All sit behind the `/v1` guard (token, no cross-site browser requests); uploads are bounded
//! by `admin_max_upload` and one at a time.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{post, put};

use super::AdminState;
use crate::control::rollout::{Rollout, RolloutError};

type Answer = Result<axum::Json<serde_json::Value>, (StatusCode, String)>;

/// The rollout calls, their uploads bounded by `max_upload`.
pub(super) fn routes(max_upload: usize) -> Router<AdminState> {
    let base = "/v1/subscriptions/{stream}/{group}";
    Router::new()
        .route(
            &format!("{base}/canary"),
            put(start)
                .get(state_of)
                .layer(axum::extract::DefaultBodyLimit::max(max_upload)),
        )
        .route(&format!("{base}/canary/abort"), post(abort))
        .route(
            &format!("{base}/replay"),
            post(replay).layer(axum::extract::DefaultBodyLimit::max(max_upload)),
        )
}

/// The rollout of the subscription to `stream` with `group`, or a 404.
pub(super) fn find<'a>(
    state: &'a AdminState,
    stream: &str,
    group: &str,
) -> Result<&'a std::sync::Arc<Rollout>, (StatusCode, String)> {
    state
        .rollouts
        .iter()
        .find(|r| {
            let labels = r.control().slot().labels();
            labels.stream == stream && labels.group == group
        })
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("no subscription to stream `{stream}` with group `{group}` on this host\n"),
            )
        })
}

fn refused(err: &RolloutError) -> (StatusCode, String) {
    let status = match err {
        RolloutError::Canary(crate::control::rollout::canary::CanaryError::Running { .. }) => {
            StatusCode::CONFLICT
        }
        RolloutError::Canary(crate::control::rollout::canary::CanaryError::NotRunning {
            ..
        }) => StatusCode::CONFLICT,
        RolloutError::Canary(_) | RolloutError::Operate(_) => StatusCode::SERVICE_UNAVAILABLE,
        RolloutError::NotServing { .. } => StatusCode::CONFLICT,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    (status, format!("{}\n", err.explain()))
}

/// Who a call is recorded as.
fn who(by: Option<&str>) -> String {
    match by.map(str::trim) {
        Some(by) if !by.is_empty() => format!("{by} (through the admin API)"),
        _ => "the admin API".to_owned(),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StartQuery {
    percent: String,
    #[serde(rename = "for")]
    window: Option<String>,
    by: Option<String>,
}

/// A share as `10`, `10%` or `12.5%` (one `%` at most: `10%%` is a typo, not a share).
pub(crate) fn percent(text: &str) -> Option<f64> {
    let text = text.trim();
    let number = text.strip_suffix('%').unwrap_or(text).trim_end();
    number.parse().ok()
}

async fn start(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    Query(query): Query<StartQuery>,
    body: axum::body::Bytes,
) -> Answer {
    let rollout = find(&state, &stream, &group)?;
    let share = percent(&query.percent).ok_or_else(|| {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("`{}` is not a share (e.g. 10%)\n", query.percent),
        )
    })?;
    let window = match &query.window {
        None => None,
        Some(text) => Some(humantime::parse_duration(text).map_err(|err| {
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("`{text}` is not a duration (e.g. 5m): {err}\n"),
            )
        })?),
    };
    let by = who(query.by.as_deref());
    let record = rollout
        .start(body.to_vec(), share, window, &by)
        .await
        .map_err(|err| refused(&err))?;
    tracing::warn!(
        stream,
        group,
        candidate = %crate::support::digest::short(&record.candidate),
        percent = record.percent(),
        "canary started ({by})"
    );
    Ok(axum::Json(record.to_json()))
}

async fn state_of(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
) -> Answer {
    let rollout = find(&state, &stream, &group)?;
    let canary = rollout.state().await.map_err(|err| refused(&err))?;
    Ok(axum::Json(canary.to_json()))
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AbortBody {
    by: Option<String>,
}

async fn abort(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Answer {
    let body: AbortBody = if body.iter().all(u8::is_ascii_whitespace) {
        AbortBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|err| {
            (
                StatusCode::BAD_REQUEST,
                format!("the body is not {{\"by\": \"...\"}}: {err}\n"),
            )
        })?
    };
    let rollout = find(&state, &stream, &group)?;
    let by = who(body.by.as_deref());
    let record = rollout.abort(&by).await.map_err(|err| refused(&err))?;
    tracing::warn!(stream, group, "canary aborted ({by})");
    Ok(axum::Json(record.to_json()))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayQuery {
    reason: Option<String>,
    limit: Option<usize>,
    allow_http: Option<String>,
    #[serde(default)]
    requeue_acked: bool,
}

/// The most dead letters one API replay runs on (a request has [`super::REQUEST_TIMEOUT`]).
const MAX_API_REPLAY: usize = 1000;

async fn replay(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    Query(query): Query<ReplayQuery>,
    body: axum::body::Bytes,
) -> Answer {
    let rollout = find(&state, &stream, &group)?;
    let allowed = query
        .allow_http
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| {
            h.parse::<crate::config::allow::AllowedHost>()
                .map_err(|err| {
                    (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!("allow_http `{h}`: {err}\n"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let labels = rollout.control().slot().labels().clone();
    let keys: Vec<_> = state
        .subscriptions
        .iter()
        .filter(|s| s.of == labels)
        .map(super::AdminSubscription::keys)
        .collect();
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_API_REPLAY);
    let outcomes = rollout
        .replay(
            &body,
            &keys,
            allowed,
            (query.reason.as_deref(), limit),
            query.requeue_acked,
        )
        .await
        .map_err(|err| refused(&err))?;
    let items: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            let mut value = o.report.to_json();
            value["dead_letters"] = o.dead_letters.clone().into();
            if let Some(r) = &o.requeued {
                value["requeued"] = serde_json::json!(r.requeued);
                value["gone"] = serde_json::json!(r.gone);
            }
            value
        })
        .collect();
    if query.requeue_acked {
        tracing::warn!(
            stream,
            group,
            "dead letters the serving version acknowledged in a replay requeued (admin API)"
        );
    }
    Ok(axum::Json(serde_json::json!({ "replays": items })))
}

#[cfg(test)]
mod tests {
    use super::percent;

    #[test]
    fn a_share_is_a_number_with_one_percent_sign_at_most() {
        assert_eq!(percent("10"), Some(10.0));
        assert_eq!(percent(" 12.5 % "), Some(12.5));
        assert_eq!(percent("10%"), Some(10.0));
        for typo in ["10%%", "%", "", "ten", "10 %%", "%10"] {
            assert_eq!(percent(typo), None, "{typo:?}");
        }
    }
}
