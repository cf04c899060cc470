//! The admin web page, served at `/` and `/ui/...` by the admin server: an overview of every
//! subscription, its parked retries and its dead letters, with the actions of
//! [`crate::control::operate`] (the same code as the CLI and the API).
//!
//! Server-rendered HTML (maud, which escapes every value: entries are untrusted input, a
//! payload with `<script>` renders as text), one small stylesheet and one small script, both
//! compiled into the binary: no build step, no CDN, it works on an air-gapped host.
//!
//! Who may do what:
//! - With an admin token, every page needs a session: the login form takes the token and sets
//!   an HttpOnly, SameSite=Strict cookie naming a random session (the token itself is never in
//!   the cookie). Without a token, a visitor gets a session at once; actions are allowed only
//!   with `admin_open_on_loopback`, as for the API.
//! - A logged-in session is the cookie **and** a key: browsers send a host name's cookies to
//!   every port of it, so another web server on the operator's machine gets the cookie. The
//!   key is handed to the page once, at login, kept in the browser's storage for this origin
//!   (scheme, host and port: no other server can read it), and sent by the page's script as
//!   the `x-sluice-key` header on every request. A navigation (which cannot carry a header)
//!   gets a page with no data whose script fetches the real one with the key; a request with
//!   the cookie but a wrong key is refused and throttled like a wrong token, one without a key
//!   gets no data and no action.
//! - No page may be framed (`frame-ancestors 'none'`), cached (`no-store`), or run a script
//!   but the page's own (`script-src 'self'`).
//! - `admin_read_only` hides every action and refuses it.
//! - Every action is a POST carrying the session's CSRF token, and the admin server's
//!   cross-site and DNS-rebinding checks apply to it as to the API.

mod chrome;
mod pages;
mod rollout;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::{AdminState, guard};
use crate::control::operate::{OperateError, dead_letters, parked};

/// How long a session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at once; the oldest go first.
const MAX_SESSIONS: usize = 1024;
/// The session cookie's name.
const COOKIE: &str = "sluice_session";
/// The header the page's script sends the session's key in.
const KEY_HEADER: &str = "x-sluice-key";
/// Rows per page.
const PAGE: usize = 50;

/// The live sessions of the page.
#[derive(Default)]
pub(super) struct Sessions {
    inner: Mutex<HashMap<String, Session>>,
}

#[derive(Clone)]
struct Session {
    /// What the page sends besides the cookie (see the module doc).
    key: String,
    csrf: String,
    created: Instant,
    can_act: bool,
    /// When it was last presented.
    last_used: Instant,
    /// Requests that presented it after the one that made it.
    returns: u64,
    /// What the viewer's last action came to, shown once on the next page.
    flash: Option<String>,
}

/// Who is looking at a page: their CSRF token and whether actions are shown.
#[derive(Clone)]
pub(super) struct Viewer {
    csrf: String,
    can_act: bool,
    /// Whether they logged in with the token (show "log out").
    logged_in: bool,
    /// The session's id, where the result of an action is kept for the next page.
    id: String,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    // Without randomness there are no sessions worth having: fail closed with an empty id,
    // which `Sessions::get` never matches.
    if getrandom::fill(&mut bytes).is_err() {
        return String::new();
    }
    hex::encode(bytes)
}

impl Sessions {
    fn create(&self, can_act: bool) -> (String, Session) {
        let id = random_hex();
        let now = Instant::now();
        let session = Session {
            key: random_hex(),
            csrf: random_hex(),
            created: now,
            can_act,
            last_used: now,
            returns: 0,
            flash: None,
        };
        if let Ok(mut all) = self.inner.lock() {
            all.retain(|_, s| s.created.elapsed() < SESSION_TTL);
            // Full: the least recently used of the sessions nobody came back with goes first
            // (a flood of cookie-less requests makes only those), then the youngest of those
            // that came back: a flood whose sessions come back too is younger than the
            // operator's session, which stays however often the flood's come back.
            if all.len() >= MAX_SESSIONS
                && let Some(evicted) = all
                    .iter()
                    .min_by_key(|(_, s)| {
                        let young = std::cmp::Reverse(s.created);
                        (
                            s.returns > 0,
                            if s.returns > 0 {
                                None
                            } else {
                                Some(s.last_used)
                            },
                            young,
                        )
                    })
                    .map(|(k, _)| k.clone())
            {
                all.remove(&evicted);
            }
            if !id.is_empty() {
                all.insert(id.clone(), session.clone());
            }
        }
        (id, session)
    }

    fn get(&self, id: &str) -> Option<Session> {
        let mut all = self.inner.lock().ok()?;
        let session = all.get_mut(id)?;
        if session.created.elapsed() >= SESSION_TTL {
            return None;
        }
        session.last_used = Instant::now();
        session.returns += 1;
        Some(session.clone())
    }

    /// Keep `message` for the session's next page.
    fn set_flash(&self, id: &str, message: String) {
        if let Ok(mut all) = self.inner.lock()
            && let Some(session) = all.get_mut(id)
        {
            session.flash = Some(message);
        }
    }

    /// The message kept for the session's next page, once.
    fn take_flash(&self, id: &str) -> Option<String> {
        self.inner.lock().ok()?.get_mut(id)?.flash.take()
    }

    fn remove(&self, id: &str) {
        if let Ok(mut all) = self.inner.lock() {
            all.remove(id);
        }
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    )
}

pub(super) fn routes(max_upload: usize) -> Router<AdminState> {
    let sub = "/ui/s/{stream}/{group}";
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/login", get(login_page).post(log_in))
        .route("/ui/logout", post(log_out))
        .route("/ui/style.css", get(style))
        .route("/ui/script.js", get(script))
        .route("/ui/", get(overview))
        .route(&format!("{sub}/parked"), get(parked_page))
        .route(&format!("{sub}/dead-letters"), get(dead_letters_page))
        .route(&format!("{sub}/pending"), get(pending_page))
        .route(&format!("{sub}/entry"), get(entry_page))
        .route(&format!("{sub}/act"), post(act))
        .route(
            &format!("{sub}/rollout"),
            post(rollout::act).layer(axum::extract::DefaultBodyLimit::max(max_upload)),
        )
}

/// Every `/ui` request: find or make the viewer's session; send strangers to the login form.
async fn guard_ui(
    State(state): State<AdminState>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path().to_owned();
    if !path.starts_with("/ui") {
        return next.run(request).await;
    }
    if request.method() != axum::http::Method::GET
        && let Err(refusal) = guard::not_cross_site(request.headers(), state.bound)
    {
        return refusal.into_response();
    }
    if matches!(
        path.as_str(),
        "/ui/login" | "/ui/style.css" | "/ui/script.js"
    ) {
        return next.run(request).await;
    }
    let existing =
        session_cookie(request.headers()).and_then(|id| state.sessions.get(&id).map(|s| (id, s)));
    let (id, session, new_cookie, logged_in) = match existing {
        Some((id, session)) if state.token.is_some() => {
            let given = request.headers().get(KEY_HEADER).cloned();
            let navigation = request.method() == axum::http::Method::GET;
            if let Err(refusal) = keyed(&state, given, navigation, &session).await {
                return *refusal;
            }
            (id, session, false, true)
        }
        Some((id, session)) => (id, session, false, false),
        None if state.token.is_some() => return Redirect::to("/ui/login").into_response(),
        None => {
            let (id, session) = state
                .sessions
                .create(state.open_on_loopback && !state.read_only);
            (id, session, true, false)
        }
    };
    request.extensions_mut().insert(Viewer {
        csrf: session.csrf,
        can_act: session.can_act && !state.read_only,
        logged_in,
        id: id.clone(),
    });
    let mut response = next.run(request).await;
    if new_cookie && let Ok(value) = set_cookie(&id).parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// A logged-in session's request carries its key; a navigation, which cannot, gets the page
/// that fetches it with the key; anything else is refused.
async fn keyed(
    state: &AdminState,
    given: Option<header::HeaderValue>,
    navigation: bool,
    session: &Session,
) -> Result<(), Box<Response>> {
    match given {
        Some(given) if guard::same_secret(given.to_str().unwrap_or(""), &session.key) => Ok(()),
        Some(_) => {
            state.throttle.refused("admin page session key").await;
            Err(Box::new(
                (
                    StatusCode::UNAUTHORIZED,
                    [("x-sluice-login", "1")],
                    Html(
                        chrome::message("This page's session key is wrong: log in again.")
                            .into_string(),
                    ),
                )
                    .into_response(),
            ))
        }
        None if navigation => Err(Box::new(
            Html(chrome::loader().into_string()).into_response(),
        )),
        None => Err(Box::new(forbidden(
            "this request carries the session cookie but not the page's key: only the page itself may act; reload it",
        ))),
    }
}

/// What every `/ui` response says to the browser: never framed, never cached, no script but
/// the page's own, no referrer to other sites (`no-referrer` would make the browser send
/// `Origin: null` with the page's own forms, which the cross-site check refuses).
fn harden(response: &mut Response) {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "frame-ancestors 'none'; script-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        headers.insert(name, header::HeaderValue::from_static(value));
    }
}

/// [`guard_ui`] with [`harden`] on every answer.
pub(super) async fn guard_ui_hardened(
    state: State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let under_ui = request.uri().path().starts_with("/ui");
    let mut response = guard_ui(state, request, next).await;
    if under_ui {
        harden(&mut response);
    }
    response
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("style.css"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("script.js"),
    )
}

async fn login_page(State(state): State<AdminState>) -> Response {
    if state.token.is_none() {
        return Redirect::to("/ui/").into_response();
    }
    Html(chrome::login(None).into_string()).into_response()
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn log_in(
    State(state): State<AdminState>,
    axum::Form(form): axum::Form<LoginForm>,
) -> Response {
    let Some(token) = &state.token else {
        return Redirect::to("/ui/").into_response();
    };
    if !guard::same_secret(form.token.trim(), token) {
        state.throttle.refused("admin page login").await;
        return (
            StatusCode::UNAUTHORIZED,
            Html(chrome::login(Some("That is not the admin token.")).into_string()),
        )
            .into_response();
    }
    let (id, session) = state.sessions.create(!state.read_only);
    tracing::info!("admin page login");
    // The key goes to this page once; its script keeps it in this origin's storage.
    let mut response = Html(chrome::welcome(&session.key).into_string()).into_response();
    if let Ok(value) = set_cookie(&id).parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

#[derive(serde::Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn log_out(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    if !guard::same_secret(&form.csrf, &viewer.csrf) {
        return forbidden("the form is stale or came from another site: reload the page");
    }
    if let Some(id) = session_cookie(&headers) {
        state.sessions.remove(&id);
    }
    let mut response = Redirect::to("/ui/login").into_response();
    if let Ok(value) = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0").parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// The subscription (partition) the page is about, or the page saying there is none.
fn subscription<'a>(
    state: &'a AdminState,
    stream: &str,
    group: &str,
) -> Result<
    (
        &'a super::AdminSubscription,
        crate::store::keys::SubscriptionKeys,
    ),
    Box<Response>,
> {
    super::waiting::subscription(state, stream, group).map_err(|(code, why)| {
        Box::new((code, Html(chrome::message(&why).into_string())).into_response())
    })
}

fn forbidden(why: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        Html(chrome::message(why).into_string()),
    )
        .into_response()
}

fn unavailable(err: impl Into<OperateError>) -> Response {
    let err = err.into();
    let status = match err {
        OperateError::Cursor(_) | OperateError::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (
        status,
        Html(chrome::message(&crate::support::chain::chain(&err)).into_string()),
    )
        .into_response()
}

async fn overview(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Query(query): Query<super::listing::ListQuery>,
) -> Response {
    if let Err((code, why)) = query.check() {
        return (code, Html(chrome::message(&why).into_string())).into_response();
    }
    let done = state.sessions.take_flash(&viewer.id);
    Html(
        pages::overview(&state, &viewer, done.as_deref(), &query)
            .await
            .into_string(),
    )
    .into_response()
}

#[derive(serde::Deserialize)]
struct PageQuery {
    cursor: Option<String>,
    reason: Option<String>,
}

async fn parked_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let Some(set) = keys.delayed.clone() else {
        return Html(chrome::message("This subscription has no delayed-retry set: its retries stay pending in the stream.").into_string()).into_response();
    };
    let mut conn = sub.conn.clone();
    let listing = async {
        let now_ms = crate::store::inspect::server_now_ms(&mut conn).await?;
        let total: u64 = redis::cmd("ZCARD")
            .arg(&*set)
            .query_async(&mut conn)
            .await?;
        let page = parked::list(&mut conn, &set, q.cursor.as_deref(), PAGE).await?;
        Ok::<_, OperateError>((now_ms, total, page))
    }
    .await;
    match listing {
        Ok((now_ms, total, page)) => Html(
            pages::parked(
                &viewer,
                &keys,
                &set,
                now_ms,
                total,
                &page,
                state.sessions.take_flash(&viewer.id).as_deref(),
            )
            .into_string(),
        )
        .into_response(),
        Err(err) => unavailable(err),
    }
}

async fn dead_letters_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let mut conn = sub.conn.clone();
    let reason = q.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
    let listing = async {
        let total: u64 = redis::cmd("XLEN")
            .arg(&*keys.dead_letter)
            .query_async(&mut conn)
            .await?;
        let page = dead_letters::list_view(&mut conn, &keys, q.cursor.as_deref(), PAGE, reason, 20)
            .await?;
        Ok::<_, OperateError>((total, page))
    }
    .await;
    match listing {
        Ok((total, page)) => Html(
            pages::dead_letters(
                &viewer,
                &keys,
                total,
                &page,
                reason,
                state.sessions.take_flash(&viewer.id).as_deref(),
            )
            .into_string(),
        )
        .into_response(),
        Err(err) => unavailable(err),
    }
}

#[derive(serde::Deserialize)]
struct PendingQuery {
    consumer: Option<String>,
}

/// Entries in flight per consumer: the group's consumers on the stream and on its retry lane
/// (pending count, idle time), and for the one asked for, its oldest pending entries.
async fn pending_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<PendingQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let mut conn = sub.conn.clone();
    let mut sources = vec![keys.stream.to_string()];
    if let Some(lane) = &sub.lane {
        sources.push(lane.clone());
    }
    let listing = async {
        let mut tables = Vec::new();
        for key in &sources {
            let consumers = crate::store::inspect::consumers(&mut conn, key, &keys.group)
                .await
                .unwrap_or_default();
            let entries = match &q.consumer {
                Some(c) => {
                    crate::store::inspect::pending_of(&mut conn, key, &keys.group, c, PAGE).await?
                }
                None => Vec::new(),
            };
            tables.push(pages::PendingTable {
                key: key.clone(),
                consumers,
                entries,
            });
        }
        Ok::<_, OperateError>(tables)
    }
    .await;
    match listing {
        Ok(tables) => Html(
            pages::pending(
                &viewer,
                &keys,
                &sub.consumer,
                q.consumer.as_deref(),
                &tables,
            )
            .into_string(),
        )
        .into_response(),
        Err(err) => unavailable(err),
    }
}

#[derive(serde::Deserialize)]
struct EntryQuery {
    id: String,
}

async fn entry_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<EntryQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let mut conn = sub.conn.clone();
    let id = q.id.trim();
    match crate::control::operate::entry::lookup(&mut conn, &keys, id).await {
        Ok(Some(view)) => Html(pages::entry(&viewer, &keys, &view).into_string()).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Html(
                chrome::message(&format!(
                    "Nothing is known of entry {id} of {}: no history, and not in the stream.",
                    keys.stream
                ))
                .into_string(),
            ),
        )
            .into_response(),
        Err(err) => unavailable(err),
    }
}

/// One action form: which, on what.
#[derive(Default)]
struct ActForm {
    csrf: String,
    action: String,
    id: Option<String>,
    origin: Option<String>,
    due_ms: Option<i64>,
    reason: Option<String>,
    /// The ticked entries of a bulk form: `<due_ms>|<origin id>` each.
    picks: Vec<String>,
}

impl ActForm {
    /// The form's fields from its urlencoded body; a field given twice keeps its last value,
    /// but every `pick`. Unknown fields are ignored, as a browser may add some.
    fn parse(body: &[u8]) -> Self {
        let mut form = Self::default();
        for (name, value) in form_urlencoded::parse(body) {
            let value = value.into_owned();
            match &*name {
                "csrf" => form.csrf = value,
                "action" => form.action = value,
                "id" => form.id = Some(value),
                "origin" => form.origin = Some(value),
                "due_ms" => form.due_ms = value.parse().ok(),
                "reason" => form.reason = Some(value),
                "pick" => form.picks.push(value),
                _ => {}
            }
        }
        form
    }

    /// The operator's reason, trimmed, if they gave one.
    fn reason(&self) -> Option<&str> {
        self.reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
    }
}

/// The parked retries of a bulk form's ticks, looked up by due time and origin id: at most
/// [`crate::control::operate::BATCH`] a request, as the API allows.
async fn picked(
    conn: &mut crate::store::redis_conn::RedisHandle,
    set: &str,
    picks: &[String],
) -> Result<Vec<Vec<u8>>, OperateError> {
    if picks.len() > crate::control::operate::BATCH {
        return Err(OperateError::Invalid(format!(
            "at most {} entries a request: tick fewer",
            crate::control::operate::BATCH
        )));
    }
    let mut members = Vec::new();
    // The same tick twice is one entry.
    let picks: std::collections::BTreeSet<&String> = picks.iter().collect();
    for pick in picks {
        let Some((due, origin)) = pick.split_once('|') else {
            return Err(OperateError::Invalid(format!(
                "not a ticked entry: {pick:?}"
            )));
        };
        let due = due
            .parse::<i64>()
            .map_err(|_| OperateError::Invalid(format!("not a ticked entry: {pick:?}")))?;
        let found = parked::find(conn, set, &[origin.to_owned()], Some(due)).await?;
        members.extend(found.into_iter().map(|p| p.member));
    }
    Ok(members)
}

/// The first [`crate::control::operate::BATCH`] members of `set`, earliest due first.
async fn first_parked(
    conn: &mut crate::store::redis_conn::RedisHandle,
    set: &str,
) -> Result<Vec<Vec<u8>>, OperateError> {
    Ok(redis::cmd("ZRANGE")
        .arg(set)
        .arg(0)
        .arg(crate::control::operate::BATCH - 1)
        .query_async(conn)
        .await?)
}

async fn act(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let form = ActForm::parse(&body);
    if !guard::same_secret(&form.csrf, &viewer.csrf) {
        tracing::warn!(stream, group, "admin page action refused: bad CSRF token");
        return forbidden("the form is stale or came from another site: reload the page");
    }
    if !viewer.can_act {
        return forbidden(if state.read_only {
            "the admin server is read-only (admin_read_only = true)"
        } else if state.token.is_some() {
            "actions need the admin token: log in again"
        } else {
            "actions need an admin token (admin_token_file or admin_token_env) to log in with, or admin_open_on_loopback = true"
        });
    }
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let mut conn = sub.conn.clone();
    // The result is kept in the session for the next page, never put in a link: a link
    // anyone can make would put any text in the banner.
    let back = |page: &str, done: &str| {
        state.sessions.set_flash(&viewer.id, done.to_owned());
        let to = if page.is_empty() {
            "/ui/".to_owned()
        } else {
            format!(
                "/ui/s/{}/{}/{page}",
                chrome::segment(&stream),
                chrome::segment(&group),
            )
        };
        Redirect::to(&to).into_response()
    };
    let set = keys.delayed.clone().unwrap_or_default();
    let origins: Vec<String> = form.origin.iter().cloned().collect();
    let outcome: Result<(&str, String), OperateError> = async {
        match form.action.as_str() {
            "requeue" => {
                let id = form.id.clone().unwrap_or_default();
                let Some(letter) = dead_letters::get(&mut conn, &keys, &id).await? else {
                    return Ok(("dead-letters", format!("{id} was already gone")));
                };
                Ok(
                    match dead_letters::requeue(&mut conn, &keys, &letter).await? {
                        dead_letters::Requeued::To(new) => (
                            "dead-letters",
                            format!("requeued {id} onto the stream as {new}"),
                        ),
                        dead_letters::Requeued::Gone => {
                            ("dead-letters", format!("{id} was already gone"))
                        }
                    },
                )
            }
            "requeue-all" => {
                let reason = form
                    .reason
                    .as_deref()
                    .map(str::trim)
                    .filter(|r| !r.is_empty());
                let (letters, more) = dead_letters::requeueable(
                    &mut conn,
                    &keys,
                    reason,
                    super::waiting::ALL_PER_CALL,
                )
                .await?;
                let mut moved = 0usize;
                for letter in &letters {
                    if let dead_letters::Requeued::To(_) =
                        dead_letters::requeue(&mut conn, &keys, letter).await?
                    {
                        moved += 1;
                    }
                }
                let rest = if more {
                    "; more remain: requeue all again"
                } else {
                    ""
                };
                Ok((
                    "dead-letters",
                    format!("requeued {moved} dead letters{rest}"),
                ))
            }
            "delete-dead" => {
                let id = form.id.clone().unwrap_or_default();
                let n = dead_letters::delete(&mut conn, &keys, std::slice::from_ref(&id)).await?;
                Ok(("dead-letters", format!("deleted {n} dead letter ({id})")))
            }
            "retry-now" | "delete-parked" | "dead-letter" => {
                let found = parked::find(&mut conn, &set, &origins, form.due_ms).await?;
                let members: Vec<Vec<u8>> = found.into_iter().map(|p| p.member).collect();
                let origin = origins.first().cloned().unwrap_or_default();
                let done = match form.action.as_str() {
                    "retry-now" => {
                        let n = parked::retry_now(&mut conn, &set, &members).await?;
                        format!("{origin}: {n} made due now; a sweep moves it back within a second")
                    }
                    "delete-parked" => {
                        let n = parked::delete(&mut conn, &set, &members).await?;
                        format!("{origin}: {n} deleted")
                    }
                    _ => {
                        let reason = form
                            .reason
                            .as_deref()
                            .map(str::trim)
                            .filter(|r| !r.is_empty())
                            .unwrap_or("dead-lettered by an operator");
                        let n = parked::dead_letter_now(&mut conn, &keys, &members, reason).await?;
                        format!("{origin}: {n} dead-lettered")
                    }
                };
                Ok(("parked", done))
            }
            "pause" => {
                // The subscription's, not the partition's: a pause holds every partition.
                let (of_stream, of_group) = (&sub.of.stream, &sub.of.group);
                let asked = crate::pipeline::admit::Paused::now("the admin page", form.reason.as_deref());
                let done = crate::pipeline::admit::pause(&mut conn, of_stream, of_group, asked)
                    .await?;
                Ok(("", match done {
                    crate::pipeline::admit::PauseResult::Paused(p) => format!(
                        "stream {of_stream} group {of_group}: {}; every host stops reading within a second",
                        p.describe()
                    ),
                    crate::pipeline::admit::PauseResult::Already(p) => {
                        format!("stream {of_stream} group {of_group}: already {}", p.describe())
                    }
                }))
            }
            "resume" => {
                let (of_stream, of_group) = (&sub.of.stream, &sub.of.group);
                let was = crate::pipeline::admit::resume(&mut conn, of_stream, of_group, "the admin page")
                    .await?;
                Ok(("", match was {
                    Some(_) => format!("stream {of_stream} group {of_group}: resumed; every host reads again within a second"),
                    None => format!("stream {of_stream} group {of_group} was not paused"),
                }))
            }
            "retry-selected" | "delete-selected" | "dead-letter-selected" => {
                let members = picked(&mut conn, &set, &form.picks).await?;
                let asked = form
                    .picks
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len();
                let done = match form.action.as_str() {
                    "retry-selected" => {
                        let n = parked::retry_now(&mut conn, &set, &members).await?;
                        format!("{n} of {asked} selected made due now; a sweep moves them back within a second")
                    }
                    "delete-selected" => {
                        let n = parked::delete(&mut conn, &set, &members).await?;
                        format!("{n} of {asked} selected deleted")
                    }
                    _ => {
                        let reason = form.reason().unwrap_or("dead-lettered by an operator");
                        let n = parked::dead_letter_now(&mut conn, &keys, &members, reason).await?;
                        format!("{n} of {asked} selected dead-lettered")
                    }
                };
                Ok(("parked", done))
            }
            "retry-all" | "delete-all" | "dead-letter-all" => {
                let reason = form.reason().unwrap_or("dead-lettered by an operator");
                let mut moved = 0usize;
                let mut more = false;
                // Bounded like the API's `all` calls: the rest on the next press.
                for round in 0..super::waiting::ALL_PER_CALL / crate::control::operate::BATCH {
                    let n = match form.action.as_str() {
                        "retry-all" => parked::retry_batch_now(&mut conn, &set).await?,
                        "delete-all" => {
                            let members = first_parked(&mut conn, &set).await?;
                            parked::delete(&mut conn, &set, &members).await?
                        }
                        _ => {
                            let members = first_parked(&mut conn, &set).await?;
                            parked::dead_letter_now(&mut conn, &keys, &members, reason).await?
                        }
                    };
                    moved += n;
                    if n == 0 {
                        break;
                    }
                    more = round + 1 == super::waiting::ALL_PER_CALL / crate::control::operate::BATCH;
                }
                let what = match form.action.as_str() {
                    "retry-all" => "made due now",
                    "delete-all" => "deleted",
                    _ => "dead-lettered",
                };
                let rest = if more { "; more remain: press again" } else { "" };
                Ok(("parked", format!("{moved} parked retries {what}{rest}")))
            }
            other => Err(OperateError::Invalid(format!("unknown action {other:?}"))),
        }
    }
    .await;
    match outcome {
        Ok((page, done)) => {
            tracing::info!(stream, group, action = form.action, "{done} (admin page)");
            back(page, &done)
        }
        Err(err) => unavailable(err),
    }
}
