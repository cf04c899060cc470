//! The layers every admin request passes before its route: [`guard_all`] (a `Host` this
//! server answers to, and a deadline) on every request, and [`guard_api`] on the `/v1` API (no
//! cross-site browser requests, the token and the declared size before the body, one upload
//! at a time). The checks themselves are [`super::guard`]'s; the page's own is
//! [`super::ui`]'s.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AdminState, REQUEST_TIMEOUT, guard};

/// A refused call: its status and why.
type Refusal = (StatusCode, String);

/// Every request: a `Host` this server answers to (DNS rebinding), and a deadline.
pub(super) async fn guard_all(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
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
pub(super) async fn guard_api(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    let what = format!("{} {}", request.method(), request.uri().path());
    let mutating = request.method() != Method::GET;
    let checked = guard::not_cross_site(request.headers(), state.bound)
        .and_then(|()| authorized(&state, request.headers(), &what, mutating))
        .and_then(|()| guard::declared_size(request.headers(), state.max_upload));
    if let Err(refusal) = checked {
        if refusal.0 == StatusCode::UNAUTHORIZED {
            state.throttle.refused(&what).await;
        }
        return refusal.into_response();
    }
    let _upload = if request.method() == Method::PUT {
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
    headers: &HeaderMap,
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
    let given = guard::bearer(headers);
    // The read-only token may look wherever the operator's may, and never act.
    if let (Some(read), Some(given)) = (&state.read_token, given)
        && guard::same_secret(given, read)
    {
        if mutating {
            tracing::warn!(call = what, "admin call refused: a read-only token");
            return Err((
                StatusCode::FORBIDDEN,
                "this token is read-only (admin_read_token): it may look, not act\n".to_owned(),
            ));
        }
        return Ok(());
    }
    // With only a session key, the list of subscriptions (names, versions, counts: no entry's
    // data) stays open, as without a token.
    if state.session_key && !mutating && what == "GET /v1/subscriptions" {
        return Ok(());
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
    if given.is_some_and(|given| guard::same_secret(given, token)) {
        return Ok(());
    }
    // Logged by the throttle, which also makes the answer wait.
    Err((
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token\n".to_owned(),
    ))
}
