//! The admin API over what waits: `/v1/subscriptions/{stream}/{group}/dead-letters` and
//! `/parked`, calling [`crate::control::operate`] (the same code as the CLI). `{stream}` is a
//! partition's stream on a partitioned subscription.
//!
//! - `GET .../dead-letters?cursor=&limit=&reason=`: newest first, `{items, next}`;
//!   `GET .../dead-letters/{id}`: one.
//! - `POST .../dead-letters/requeue` with `{"ids": [...]}` or `{"all": true, "reason": "..."}`
//!   (and `"new_idempotency_keys": true` for new keys on the entries' outbound calls):
//!   an `all` call requeues at most [`ALL_PER_CALL`] and answers `more: true` when some are left
//!   (call again).
//! - `DELETE .../dead-letters/{id}`.
//! - `GET .../parked?cursor=&limit=`: due order, `{items, next, now_ms}`.
//! - `POST .../parked/retry-now` with `{"origin_ids": [...], "due_ms": n}` (due_ms optional:
//!   with it the lookup is one ZRANGE) or `{"all": true}`.
//! - `POST .../parked/dead-letter` with `{"origin_ids": [...], "reason": "..."}`.
//! - `DELETE .../parked/{origin_id}?due_ms=n`.
//! - `GET .../entries/{origin_id}`: one entry, whole: its fields, where it is now, its history.
//!
//! The routes sit behind the `/v1` guard: token, no cross-site browser requests.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};

use super::audit::Moved;
use super::{AdminState, AdminSubscription};
use crate::control::operate::{BATCH, OperateError, dead_letters, parked};
use crate::store::keys::SubscriptionKeys;

/// The most dead letters one `all` requeue call moves (the rest on the next call).
pub const ALL_PER_CALL: usize = 1_000;

type Answer = Result<axum::Json<serde_json::Value>, (StatusCode, String)>;
/// An answer that says how many entries the call moved (for the audit record).
type Counted =
    Result<(axum::Extension<Moved>, axum::Json<serde_json::Value>), (StatusCode, String)>;

fn counted(n: usize, body: serde_json::Value) -> Counted {
    Ok((axum::Extension(Moved(n as u64)), axum::Json(body)))
}

/// The calls over dead letters, parked retries and entries.
pub(super) fn routes() -> Router<AdminState> {
    let base = "/v1/subscriptions/{stream}/{group}";
    Router::new()
        .route(&format!("{base}/dead-letters"), get(list_dead))
        .route(&format!("{base}/dead-letters/requeue"), post(requeue))
        .route(
            &format!("{base}/dead-letters/{{id}}"),
            get(show_dead).delete(delete_dead),
        )
        .route(&format!("{base}/parked"), get(list_parked))
        .route(&format!("{base}/parked/retry-now"), post(retry_now))
        .route(&format!("{base}/parked/dead-letter"), post(dead_letter_now))
        .route(
            &format!("{base}/parked/{{origin}}"),
            axum::routing::delete(delete_parked),
        )
        .route(&format!("{base}/entries/{{origin}}"), get(show_entry))
}

async fn show_entry(
    State(state): State<AdminState>,
    Path((stream, group, origin)): Path<(String, String, String)>,
) -> Answer {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let mut conn = sub.conn.clone();
    match crate::control::operate::entry::lookup(&mut conn, &keys, &origin)
        .await
        .map_err(failed)?
    {
        Some(view) => Ok(axum::Json(view.to_json())),
        None => Err((
            StatusCode::NOT_FOUND,
            format!("nothing is known of entry {origin} (no history, not in the stream)\n"),
        )),
    }
}

/// The subscription (partition) reading `stream` as `group`, with its keys.
pub(super) fn subscription<'a>(
    state: &'a AdminState,
    stream: &str,
    group: &str,
) -> Result<(&'a AdminSubscription, SubscriptionKeys), (StatusCode, String)> {
    let sub = state
        .subscriptions
        .iter()
        .find(|s| s.labels.stream == stream && s.labels.group == group)
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("no subscription to stream `{stream}` with group `{group}` on this host\n"),
            )
        })?;
    Ok((sub, sub.keys()))
}

fn failed(err: impl Into<OperateError>) -> (StatusCode, String) {
    match err.into() {
        err @ (OperateError::Cursor(_) | OperateError::Invalid(_)) => {
            (StatusCode::BAD_REQUEST, format!("{err}\n"))
        }
        err @ OperateError::NotRequeueable { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, format!("{err}\n"))
        }
        err => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", crate::support::chain::chain(&err)),
        ),
    }
}

#[derive(serde::Deserialize)]
struct ListQuery {
    cursor: Option<String>,
    limit: Option<usize>,
    reason: Option<String>,
}

async fn list_dead(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<ListQuery>,
) -> Answer {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let mut conn = sub.conn.clone();
    let limit = q.limit.unwrap_or(50).clamp(1, BATCH);
    let page = dead_letters::list_view(
        &mut conn,
        &keys,
        q.cursor.as_deref(),
        limit,
        q.reason.as_deref(),
        10,
    )
    .await
    .map_err(failed)?;
    let items: Vec<_> = page.items.iter().map(|l| l.to_json(&stream)).collect();
    Ok(axum::Json(
        serde_json::json!({ "items": items, "next": page.next }),
    ))
}

async fn show_dead(
    State(state): State<AdminState>,
    Path((stream, group, id)): Path<(String, String, String)>,
) -> Answer {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let mut conn = sub.conn.clone();
    match dead_letters::get_view(&mut conn, &keys, &id)
        .await
        .map_err(failed)?
    {
        Some(letter) => Ok(axum::Json(letter.to_json(&stream))),
        None => Err((StatusCode::NOT_FOUND, format!("no dead letter {id}\n"))),
    }
}

#[derive(serde::Deserialize)]
struct RequeueBody {
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    all: bool,
    reason: Option<String>,
    /// New idempotency keys for the requeued entries' outbound calls.
    #[serde(default)]
    new_idempotency_keys: bool,
}

async fn requeue(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    axum::Json(body): axum::Json<RequeueBody>,
) -> Counted {
    if body.all != body.ids.is_empty() {
        return Err((
            StatusCode::BAD_REQUEST,
            "give \"ids\" or \"all\": true (not both)\n".to_owned(),
        ));
    }
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let mut conn = sub.conn.clone();
    let mut letters = Vec::new();
    let mut missing = Vec::new();
    let mut more = false;
    if body.all {
        (letters, more) =
            dead_letters::requeueable(&mut conn, &keys, body.reason.as_deref(), ALL_PER_CALL)
                .await
                .map_err(failed)?;
    } else {
        for id in &body.ids {
            match dead_letters::get(&mut conn, &keys, id)
                .await
                .map_err(failed)?
            {
                Some(letter) => letters.push(letter),
                None => missing.push(id.clone()),
            }
        }
    }
    let mut requeued = Vec::new();
    let mut skipped = Vec::new();
    for letter in &letters {
        match dead_letters::requeue(&mut conn, &keys, letter, body.new_idempotency_keys).await {
            Ok(dead_letters::Requeued::To(new)) => {
                requeued.push(serde_json::json!({ "id": letter.id, "new_id": new }));
            }
            Ok(dead_letters::Requeued::Gone) => missing.push(letter.id.clone()),
            Err(OperateError::NotRequeueable { id, why }) => {
                skipped.push(serde_json::json!({ "id": id, "why": why }));
            }
            Err(err) => return Err(failed(err)),
        }
    }
    tracing::info!(
        stream,
        group,
        requeued = requeued.len(),
        "dead letters requeued through the admin API"
    );
    counted(
        requeued.len(),
        serde_json::json!({
            "requeued": requeued,
            "skipped": skipped,
            "missing": missing,
            "more": more,
        }),
    )
}

async fn delete_dead(
    State(state): State<AdminState>,
    Path((stream, group, id)): Path<(String, String, String)>,
) -> Answer {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let mut conn = sub.conn.clone();
    let deleted = dead_letters::delete(&mut conn, &keys, std::slice::from_ref(&id))
        .await
        .map_err(failed)?;
    if deleted == 0 {
        return Err((StatusCode::NOT_FOUND, format!("no dead letter {id}\n")));
    }
    tracing::info!(
        stream,
        group,
        id,
        "dead letter deleted through the admin API"
    );
    Ok(axum::Json(serde_json::json!({ "deleted": deleted })))
}

/// The delayed set's key, or 404 when the subscription parks nothing.
fn set_of(keys: &SubscriptionKeys) -> Result<String, (StatusCode, String)> {
    keys.delayed.as_deref().map(str::to_owned).ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            format!(
                "the subscription to `{}` has no delayed-retry set\n",
                keys.stream
            ),
        )
    })
}

async fn list_parked(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<ListQuery>,
) -> Answer {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let set = set_of(&keys)?;
    let mut conn = sub.conn.clone();
    let now_ms = crate::store::inspect::server_now_ms(&mut conn)
        .await
        .map_err(failed)?;
    let page = parked::list(&mut conn, &set, q.cursor.as_deref(), q.limit.unwrap_or(50))
        .await
        .map_err(failed)?;
    let items: Vec<_> = page.items.iter().map(|p| p.to_json(now_ms)).collect();
    Ok(axum::Json(serde_json::json!({
        "items": items,
        "next": page.next,
        "now_ms": now_ms,
    })))
}

#[derive(serde::Deserialize)]
struct ParkedBody {
    #[serde(default)]
    origin_ids: Vec<String>,
    due_ms: Option<i64>,
    #[serde(default)]
    all: bool,
    reason: Option<String>,
}

/// The members for `origin_ids` (at most [`BATCH`] ids per call).
async fn members(
    conn: &mut crate::store::redis_conn::RedisHandle,
    set: &str,
    body: &ParkedBody,
) -> Result<Vec<Vec<u8>>, (StatusCode, String)> {
    if body.origin_ids.is_empty() || body.origin_ids.len() > BATCH {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("give between 1 and {BATCH} \"origin_ids\"\n"),
        ));
    }
    let found = parked::find(conn, set, &body.origin_ids, body.due_ms)
        .await
        .map_err(failed)?;
    Ok(found.into_iter().map(|p| p.member).collect())
}

async fn retry_now(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    axum::Json(body): axum::Json<ParkedBody>,
) -> Counted {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let set = set_of(&keys)?;
    let mut conn = sub.conn.clone();
    let moved = if body.all {
        let mut moved = 0;
        // Bounded like every other call: the rest on the next call.
        for _ in 0..ALL_PER_CALL / BATCH {
            let n = parked::retry_batch_now(&mut conn, &set)
                .await
                .map_err(failed)?;
            moved += n;
            if n == 0 {
                break;
            }
        }
        moved
    } else {
        let members = members(&mut conn, &set, &body).await?;
        parked::retry_now(&mut conn, &set, &members)
            .await
            .map_err(failed)?
    };
    tracing::info!(
        stream,
        group,
        moved,
        "parked retries made due through the admin API"
    );
    counted(moved, serde_json::json!({ "due_now": moved }))
}

async fn dead_letter_now(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    axum::Json(body): axum::Json<ParkedBody>,
) -> Counted {
    let reason = body
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .ok_or((
            StatusCode::BAD_REQUEST,
            "give a \"reason\": it is recorded with the dead letter\n".to_owned(),
        ))?
        .to_owned();
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let set = set_of(&keys)?;
    let mut conn = sub.conn.clone();
    let members = members(&mut conn, &set, &body).await?;
    let moved = parked::dead_letter_now(&mut conn, &keys, &members, &reason)
        .await
        .map_err(failed)?;
    tracing::info!(
        stream,
        group,
        moved,
        reason,
        "parked retries dead-lettered through the admin API"
    );
    counted(moved, serde_json::json!({ "dead_lettered": moved }))
}

#[derive(serde::Deserialize)]
struct DueQuery {
    due_ms: Option<i64>,
}

async fn delete_parked(
    State(state): State<AdminState>,
    Path((stream, group, origin)): Path<(String, String, String)>,
    Query(q): Query<DueQuery>,
) -> Answer {
    let (sub, keys) = subscription(&state, &stream, &group)?;
    let set = set_of(&keys)?;
    let mut conn = sub.conn.clone();
    let found = parked::find(&mut conn, &set, std::slice::from_ref(&origin), q.due_ms)
        .await
        .map_err(failed)?;
    let members: Vec<Vec<u8>> = found.into_iter().map(|p| p.member).collect();
    let deleted = parked::delete(&mut conn, &set, &members)
        .await
        .map_err(failed)?;
    if deleted == 0 {
        return Err((StatusCode::NOT_FOUND, format!("{origin} is not parked\n")));
    }
    tracing::info!(
        stream,
        group,
        origin,
        "parked retry deleted through the admin API"
    );
    Ok(axum::Json(serde_json::json!({ "deleted": deleted })))
}
