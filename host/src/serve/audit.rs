//! The admin server's side of the audit stream ([`crate::control::audit`]): every API call
//! that changes something and succeeded is recorded after it ran ([`audit_api`], inside the
//! token check, so a refused caller writes nothing), the page's actions by their handlers
//! ([`page_action`]), and `GET /v1/audit?limit=` reads the newest records back.

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::{AdminState, AdminSubscription, guard};
use crate::control::audit::{self, Record};

/// How many entries a call moved, put in its response's extensions by the handlers that
/// count, for the audit record.
#[derive(Debug, Clone, Copy)]
pub(super) struct Moved(pub u64);

/// What a call's answer said it did, for the audit record's `result`.
#[derive(Debug, Clone)]
pub(super) struct Said(pub String);

/// The audit routes.
pub(super) fn routes() -> Router<AdminState> {
    Router::new().route("/v1/audit", get(list))
}

#[derive(serde::Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

/// `GET /v1/audit?limit=`: the newest records (50 by default, at most 500) of every Redis
/// the host uses, newest first.
async fn list(
    State(state): State<AdminState>,
    Query(q): Query<ListQuery>,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    let items = recent(&state, q.limit.unwrap_or(50).clamp(1, 500))
        .await
        .map_err(|err| (StatusCode::SERVICE_UNAVAILABLE, format!("Redis: {err}\n")))?;
    Ok(axum::Json(serde_json::json!({ "items": items })))
}

/// The newest `count` records of every Redis this host's subscriptions use (each keeps its
/// own audit stream), merged newest first.
pub(super) async fn recent(
    state: &AdminState,
    count: usize,
) -> redis::RedisResult<Vec<audit::Recorded>> {
    let mut asked: Vec<&crate::store::redis_conn::RedisHandle> = Vec::new();
    let mut all = Vec::new();
    for sub in state.subscriptions.iter() {
        if asked.iter().any(|c| c.same_as(&sub.conn)) {
            continue;
        }
        asked.push(&sub.conn);
        let mut conn = sub.conn.clone();
        all.extend(audit::recent(&mut conn, count).await?);
    }
    all.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then_with(|| b.id.cmp(&a.id)));
    all.truncate(count);
    Ok(all)
}

/// The subscription a `/v1/subscriptions/{stream}/{group}/...` path names, if this host has it.
fn named<'a>(state: &'a AdminState, path: &str) -> Option<&'a AdminSubscription> {
    let rest = path.strip_prefix("/v1/subscriptions/")?;
    let mut parts = rest.split('/');
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let stream = decode(parts.next()?);
    let group = decode(parts.next()?);
    state
        .subscriptions
        .iter()
        .find(|s| s.labels.stream == stream && s.labels.group == group)
}

/// Who a request that passed the token check is: the operator's token, or loopback without one.
fn caller(state: &AdminState, request: &Request) -> &'static str {
    let bearer = guard::bearer(request.headers());
    match (&state.token, bearer) {
        (Some(token), Some(given)) if guard::same_secret(given, token) => "api operator",
        _ => "api loopback",
    }
}

/// Record each successful call that changes something, after it ran.
pub(super) async fn audit_api(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::GET {
        return next.run(request).await;
    }
    let what = format!("{} {}", request.method(), request.uri().path());
    let who = caller(&state, &request);
    let sub = named(&state, request.uri().path()).cloned();
    // Run apart from the request: a caller that goes away mid-call (or the request's deadline)
    // must not stop a call half-way, nor leave what it did unrecorded.
    let handled = tokio::spawn(async move {
        let response = next.run(request).await;
        if response.status().is_success() {
            let count = response.extensions().get::<Moved>().map(|m| m.0);
            let said = response
                .extensions()
                .get::<Said>()
                .map_or_else(|| response.status().to_string(), |s| s.0.clone());
            record_call(&state, sub, (who, what), count, said).await;
        }
        response
    });
    match handled.await {
        Ok(response) => response,
        Err(_) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "the call failed\n",
        )
            .into_response(),
    }
}

/// Record a call that succeeded, on its subscription's Redis (else the first one's).
async fn record_call(
    state: &AdminState,
    sub: Option<AdminSubscription>,
    (who, what): (&str, String),
    count: Option<u64>,
    said: String,
) {
    let conn = sub
        .as_ref()
        .map(|s| s.conn.clone())
        .or_else(|| state.subscriptions.first().map(|s| s.conn.clone()));
    if let Some(mut conn) = conn {
        let record = Record {
            who: who.to_owned(),
            what,
            stream: sub
                .as_ref()
                .map(|s| s.labels.stream.clone())
                .unwrap_or_default(),
            group: sub
                .as_ref()
                .map(|s| s.labels.group.clone())
                .unwrap_or_default(),
            count,
            result: said,
        };
        // Logged inside: the call has happened either way.
        let _ = audit::record(&mut conn, &record).await;
    }
}

/// Record one of the page's actions on `sub`: `who` is the session's, `done` what it came to.
pub(super) async fn page_action(
    sub: &AdminSubscription,
    who: &str,
    what: &str,
    count: Option<u64>,
    done: &str,
) {
    let mut conn = sub.conn.clone();
    let record = Record {
        who: who.to_owned(),
        what: what.to_owned(),
        stream: sub.labels.stream.clone(),
        group: sub.labels.group.clone(),
        count,
        result: done.to_owned(),
    };
    let _ = audit::record(&mut conn, &record).await;
}
