//! The admin web page, served at `/` and `/ui/...` by the admin server: an overview of every
//! subscription, its parked retries and its dead letters, with the actions of
//! [`crate::control::operate`] (the same code as the CLI and the API).
//!
//! Server-rendered HTML (maud, which escapes every value: entries are untrusted input, a
//! payload with `<script>` renders as text), one small stylesheet and one small script, both
//! compiled into the binary: no build step, no CDN, it works on an air-gapped host.
//!
//! This file routes `/ui` and keeps the sessions; each page is a file whose handler gathers
//! what it shows into a plain struct and renders it:
//! - [`overview`]: the overview, with a [`card`] per subscription and the [`charts`];
//! - [`waiting`]: a subscription's parked retries and dead letters; [`pending`]: its entries in
//!   flight; [`entry`]: one entry, whole; [`keys`]: an ordered subscription's keys that wait;
//! - [`jobs`]: filters with their counts, bulk jobs (confirmed by count, with progress), and
//!   the audit trail;
//! - [`act`]: the actions the pages' forms post (one [`act::Action`] each);
//! - [`rollout`]: the canary panel, its forms and the replay's result;
//! - [`chrome`]: the frame every page shares (layout, login, messages, links); [`fields`]: how
//!   an entry's data shows.
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

mod act;
mod card;
mod charts;
mod chrome;
mod entry;
mod fields;
mod jobs;
mod keys;
mod overview;
mod pending;
mod rollout;
mod waiting;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::{AdminState, guard};
use crate::control::operate::OperateError;

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

/// How a session was opened: what its actions are recorded as in the audit stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Logged in with the operator token.
    Operator,
    /// Logged in with the read-only token: sees, never acts.
    Reader,
    /// No token is configured (`admin_open_on_loopback`): whoever reaches loopback.
    Visitor,
}

impl Role {
    fn of(reader: bool) -> Self {
        if reader { Self::Reader } else { Self::Operator }
    }

    /// Its name in the audit stream and the page's header.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Reader => "reader",
            Self::Visitor => "loopback",
        }
    }
}

#[derive(Clone)]
struct Session {
    /// A random name for the audit stream: which session acted, without its secret.
    label: String,
    role: Role,
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
    /// Who acts, as the audit stream records it: role and session label.
    who: String,
    /// How the session was opened.
    role: Role,
}

impl Session {
    /// Who this session is in the audit stream: `page <role> <label>`.
    fn who(&self) -> String {
        format!("page {} {}", self.role.name(), self.label)
    }
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
    fn create(&self, can_act: bool, role: Role) -> (String, Session) {
        let id = random_hex();
        let now = Instant::now();
        let session = Session {
            label: random_hex().chars().take(8).collect(),
            role,
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

/// The page's routes: the overview, a subscription's pages and their forms (a rollout's
/// upload bounded by `max_upload`), login and logout, the stylesheet and the script.
pub(super) fn routes(max_upload: usize) -> Router<AdminState> {
    let sub = "/ui/s/{stream}/{group}";
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/login", get(login_page).post(log_in))
        .route("/ui/logout", post(log_out))
        .route("/ui/style.css", get(style))
        .route("/ui/script.js", get(script))
        .route("/ui/", get(overview::overview))
        .route(&format!("{sub}/parked"), get(waiting::parked_page))
        .route(&format!("{sub}/keys"), get(keys::keys_page))
        .route(
            &format!("{sub}/dead-letters"),
            get(waiting::dead_letters_page),
        )
        .route(&format!("{sub}/pending"), get(pending::pending_page))
        .route(&format!("{sub}/entry"), get(entry::entry_page))
        .route(&format!("{sub}/act"), post(act::act))
        .route(&format!("{sub}/find"), get(jobs::find_page))
        .route(&format!("{sub}/jobs"), post(jobs::jobs_post))
        .route(&format!("{sub}/job"), get(jobs::job_page))
        .route("/ui/audit", get(jobs::audit_page))
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
                .create(state.open_on_loopback && !state.read_only, Role::Visitor);
            (id, session, true, false)
        }
    };
    let who = session.who();
    request.extensions_mut().insert(Viewer {
        csrf: session.csrf,
        can_act: session.can_act && !state.read_only,
        logged_in,
        id: id.clone(),
        who,
        role: session.role,
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
    let given = form.token.trim();
    let reader = state
        .read_token
        .as_deref()
        .is_some_and(|read| guard::same_secret(given, read));
    if !reader && !guard::same_secret(given, token) {
        state.throttle.refused("admin page login").await;
        return (
            StatusCode::UNAUTHORIZED,
            Html(chrome::login(Some("That is not the admin token.")).into_string()),
        )
            .into_response();
    }
    let (id, session) = state
        .sessions
        .create(!state.read_only && !reader, Role::of(reader));
    tracing::info!(role = %session.who(), "admin page login");
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

/// The page refusing an action or a request (403), saying why.
fn forbidden(why: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        Html(chrome::message(why).into_string()),
    )
        .into_response()
}

/// The page for an operation that failed: 400 for the request's fault, else 503.
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
