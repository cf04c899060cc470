//! The admin HTTP server: `GET /metrics` (Prometheus text), `GET /healthz` (the process is
//! alive), `GET /readyz` (Redis answers for every subscription and every component is loaded;
//! 503 with the reason otherwise), and the handler API:
//!
//! - `GET /v1/subscriptions`: each subscription with its handler's digest, since when it serves,
//!   the previous digest, and swap counts; a page of at most 500 (`?offset=&limit=`, `q` a
//!   substring of stream or group, `stream=` and `group=` exact), with `X-Total-Count` (how
//!   many match) and `X-Subscriptions` (how many the host has) in the reply's headers;
//! - `PUT /v1/subscriptions/{stream}/{group}/handler` (body: the component; `?force=true`
//!   accepts a descriptor naming another stream or group): check and swap in a new handler;
//! - `POST /v1/subscriptions/{stream}/{group}/rollback`: put the previous handler back;
//! - `.../dead-letters` and `.../parked`: list and act on what waits (see [`waiting`]; pages
//!   of them through [`listing`]); `.../scheduled`: send an entry for later ([`scheduled`]);
//! - `.../keys` and `.../keys/release`: an ordered subscription's keys that wait, and
//!   releasing one (see [`keys`]);
//! - `POST .../pause` and `.../resume`: hold or release the subscription on every host of its
//!   group (see [`flow`]);
//! - `.../canary` and the replay calls: a rollout (see [`rollout`]);
//! - `GET /v1/scaling`: the scaling signal (see [`scaling`], which also serves `sluice
//!   scaler`); `GET /v1/audit`: the audit trail (see [`audit`]); `.../matches` and `.../jobs`:
//!   filters and bulk jobs (see [`jobs`]);
//! - `/` and `/ui/...`: the web page (see [`ui`]).
//!
//! The files: this one holds the server's state and its router; [`probes`] the probes and the
//! scrape; [`versions`] the handler API (listing, swap, rollback); [`waiting`], [`keys`],
//! [`flow`] and [`rollout`] the API over what waits, ordered keys, the flow controls and
//! rollouts; [`listing`] which
//! subscriptions a listing shows; [`middleware`] the layers every request passes, with the
//! checks of [`guard`]; [`connections`] how many connections, and for how long; [`samples`]
//! what the page's charts are drawn from; [`ui`] the page.
//!
//! Who may call it:
//! - It binds to loopback unless configured otherwise; beyond loopback a bearer token is
//!   required (the config refuses to start without one).
//! - Mutating calls (swap, rollback) always need the token, on loopback too: a guest with an
//!   HTTP grant or any local process could otherwise swap a handler. Only
//!   `admin_open_on_loopback = true` (explicit, loopback only) lets them through without one.
//! - With a token configured, the `/v1` listings need it too. `/metrics`, `/healthz` and
//!   `/readyz` stay open for probes and scrapers.
//! - The token is checked (in constant time) before any body is read; a declared
//!   `Content-Length` over `admin_max_upload` is refused at once (413); one upload at a time
//!   (429 for the next); every request must finish within [`REQUEST_TIMEOUT`] (408); a
//!   connection that sends no request is closed, and the probes answer however many
//!   connections others hold (see [`connections`]).
//! - Browsers ([`guard`]): a request whose `Host` is not the bound address or a loopback name is refused
//!   (DNS rebinding), and so is any `/v1` request a browser marks as cross-site (`Origin` of
//!   another host, `Sec-Fetch-Site: cross-site`): CSRF.
//!
//! Gauges that describe Redis (pending entries, lag, parked entries, dead letters) are sampled
//! from Redis at scrape time: a subscription's sample is taken again only when it is 5 s
//! old, 32 subscriptions at a time, for at most 3 s a scrape (the rest keep their last
//! sample), so neither a frequent scraper nor thousands of subscriptions make a scrape ask
//! Redis without bound.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

pub(crate) mod audit;
pub(crate) mod connections;
mod flow;
pub(crate) mod guard;
mod jobs;
mod keys;
pub(crate) mod listing;
mod middleware;
mod probes;
mod rollout;
mod samples;
pub(crate) mod scaling;
mod scheduled;
mod ui;
mod versions;
mod waiting;

use crate::control::swap::SwapControl;
use crate::observe::metrics::{Metrics, SubLabels};

/// How long a readiness or scrape probe waits for Redis.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest one request (upload included) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What the admin server knows about one subscription (one partition of a partitioned one).
#[derive(Clone)]
pub struct AdminSubscription {
    /// Labels (stream, group).
    pub labels: SubLabels,
    /// The subscription's labels (differ from `labels` on a partition).
    pub of: SubLabels,
    /// A connection to its Redis.
    pub conn: crate::store::redis_conn::RedisHandle,
    /// Its delayed-retry set, if any.
    pub delayed_key: Option<String>,
    /// Its retry lane, if it has one.
    pub lane: Option<String>,
    /// Its dead-letter stream.
    pub dead_letter: String,
    /// Trim it to about this many entries.
    pub dead_letter_maxlen: Option<u64>,
    /// How its read loop is doing.
    pub health: Arc<crate::observe::health::ReadHealth>,
    /// What `sluice check` warned about its configuration, shown on the page too.
    pub warnings: Vec<String>,
    /// Its flow controls, as this host knows them (the subscription's, on a partition).
    pub flow: tokio::sync::watch::Receiver<crate::pipeline::admit::FlowState>,
    /// Its shared rate limit, if configured.
    pub rate_limit: Option<crate::config::RateLimit>,
    /// Its circuit breaker, if configured.
    pub circuit_breaker: Option<crate::config::CircuitBreaker>,
    /// This host's consumer name in its group.
    pub consumer: String,
    /// Its ordering and its delayed set's ttl (ms, 0 for none), when it is ordered.
    pub ordered: Option<(sluice_descriptor::OrderedBy, u64)>,
    /// Its delayed set, to have this host's timer learn a scheduled entry's due time.
    pub delayed: Option<Arc<crate::pipeline::delayed::DelayedSet>>,
    /// The delayed set's ttl, if any (a scheduled entry keeps the set alive past its time).
    pub delayed_ttl: Option<std::time::Duration>,
    /// The field that carries the JSON payload.
    pub payload_field: String,
    /// Its cron schedules and where they fire (on a subscription's first partition only).
    pub schedules: Vec<crate::config::schedule::Schedule>,
    /// Where its schedules fire.
    pub schedule_target: Option<crate::control::schedules::Target>,
    /// What it deduplicates on, if it does.
    pub dedupe: Option<sluice_descriptor::Dedupe>,
}

impl AdminSubscription {
    /// Its Redis keys.
    pub fn keys(&self) -> crate::store::keys::SubscriptionKeys {
        crate::store::keys::SubscriptionKeys::new(
            &self.labels.stream,
            &self.labels.group,
            &self.dead_letter,
            self.delayed_key.as_deref(),
        )
        .with_dead_letter_maxlen(self.dead_letter_maxlen)
        .with_retry_lane(self.lane.is_some())
    }
}

#[derive(Clone)]
struct AdminState {
    sessions: Arc<ui::Sessions>,
    samples: Arc<samples::Samples>,
    metrics: Arc<Metrics>,
    subscriptions: Arc<Vec<AdminSubscription>>,
    swaps: Arc<Vec<Arc<SwapControl>>>,
    rollouts: Arc<Vec<Arc<crate::control::rollout::Rollout>>>,
    token: Option<Arc<str>>,
    /// See [`AdminOptions::read_token`].
    read_token: Option<Arc<str>>,
    /// See [`AdminOptions::session_key`].
    session_key: bool,
    open_on_loopback: bool,
    read_only: bool,
    max_upload: usize,
    bound: SocketAddr,
    uploads: Arc<tokio::sync::Semaphore>,
    /// Wrong tokens, for the API and the page's login alike.
    throttle: Arc<guard::Throttle>,
    /// Each subscription's partitions, by its labels.
    index: Arc<listing::Index>,
    /// Each subscription's Redis state when last sampled for `/metrics`, by index.
    redis_samples: Arc<tokio::sync::Mutex<probes::Samples>>,
    /// The scaling signal, read on demand (`/v1/scaling`, `/metrics`).
    scaling: Arc<crate::store::scaling::Board>,
    /// Filter counts running at once (each scans up to `jobs::MAX_SCAN` entries).
    scans: Arc<tokio::sync::Semaphore>,
}

/// The handler API's settings.
pub struct AdminOptions {
    /// The bearer token mutating calls must carry, if any.
    pub token: Option<String>,
    /// A token that may look wherever `token` may and is refused every action (403): for
    /// dashboards, autoscalers and on-call readers.
    pub read_token: Option<String>,
    /// The token is this process's session key (no admin token is configured): the listing of
    /// subscriptions stays open, everything with entries' data and every action needs it.
    pub session_key: bool,
    /// Let mutating calls through without a token (loopback only; the operator's explicit
    /// choice).
    pub open_on_loopback: bool,
    /// The largest upload accepted, in bytes.
    pub max_upload: usize,
    /// Refuse (and hide) every action: the API and the page only show.
    pub read_only: bool,
    /// One control per subscription.
    pub swaps: Vec<Arc<SwapControl>>,
    /// One rollout per subscription (canaries, replays).
    pub rollouts: Vec<Arc<crate::control::rollout::Rollout>>,
}

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot start the admin server on {addr} (set `admin` in the config to another address, or \"off\")"
)]
pub struct AdminError {
    pub(crate) addr: SocketAddr,
    pub(crate) source: std::io::Error,
}

/// Bind `addr` and serve until `stop`; returns the bound address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    subscriptions: Vec<AdminSubscription>,
    options: AdminOptions,
    stop: CancellationToken,
) -> Result<SocketAddr, AdminError> {
    let (listener, bound) = bind(addr).await?;
    let state = AdminState::new(metrics, subscriptions, options, bound);
    tokio::spawn(samples::run(state.clone(), stop.clone()));
    let (app, busy) = routers(state);
    tokio::spawn(connections::serve(listener, app, busy, stop));
    tracing::info!(addr = %bound, "admin server listening (/ui/, /metrics, /healthz, /readyz)");
    Ok(bound)
}

/// Bind `addr`: the listener and the address it got (useful with port 0).
pub(crate) async fn bind(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), AdminError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AdminError { addr, source })?;
    Ok((listener, bound))
}

impl AdminState {
    /// The state of a server bound to `bound`: loopback-only settings hold only there.
    fn new(
        metrics: Arc<Metrics>,
        subscriptions: Vec<AdminSubscription>,
        options: AdminOptions,
        bound: SocketAddr,
    ) -> Self {
        Self {
            sessions: Arc::default(),
            samples: Arc::default(),
            metrics,
            index: Arc::new(listing::Index::new(&subscriptions)),
            scaling: scaling::board_of(&subscriptions),
            scans: Arc::new(tokio::sync::Semaphore::new(2)),
            subscriptions: Arc::new(subscriptions),
            swaps: Arc::new(options.swaps),
            rollouts: Arc::new(options.rollouts),
            token: options.token.map(Into::into),
            read_token: options.read_token.map(Into::into),
            session_key: options.session_key,
            open_on_loopback: options.open_on_loopback && bound.ip().is_loopback(),
            read_only: options.read_only,
            max_upload: options.max_upload,
            bound,
            uploads: Arc::new(tokio::sync::Semaphore::new(1)),
            throttle: Arc::default(),
            redis_samples: Arc::default(),
        }
    }
}

/// The app (every route behind its guards), and what a connection gets while every other
/// one has a request in flight: the probes, and "busy" for the rest.
fn routers(state: AdminState) -> (Router, Router) {
    let page = ui::routes(state.max_upload).layer(axum::middleware::from_fn_with_state(
        state.clone(),
        ui::guard_ui_hardened,
    ));
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(probes::ready_handler));
    let busy = probes
        .clone()
        .fallback(|| async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the admin server is busy: every connection has a request in flight; only /healthz and /readyz are served on this one\n",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::guard_all,
        ))
        .with_state(state.clone());
    let app = probes
        .route("/metrics", get(probes::metrics_handler))
        .merge(api(&state))
        .merge(page)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::guard_all,
        ))
        .with_state(state);
    (app, busy)
}

/// The `/v1` API behind its guard.
fn api(state: &AdminState) -> Router<AdminState> {
    Router::new()
        .route("/v1/subscriptions", get(versions::list_handler))
        .route("/v1/scaling", get(scaling::scaling_handler))
        .route(
            "/v1/subscriptions/{stream}/{group}/handler",
            axum::routing::put(versions::swap_handler)
                .layer(axum::extract::DefaultBodyLimit::max(state.max_upload)),
        )
        .route(
            "/v1/subscriptions/{stream}/{group}/rollback",
            axum::routing::post(versions::rollback_handler),
        )
        .merge(waiting::routes())
        .merge(scheduled::routes())
        .merge(keys::routes())
        .merge(flow::routes())
        .merge(rollout::routes(state.max_upload))
        .merge(audit::routes())
        .merge(jobs::routes())
        // Inside the guard: only calls that passed the token check are recorded.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            audit::audit_api,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::guard_api,
        ))
}

/// A key for the admin API and page of a process with no admin token: 256 random bits, hex.
pub fn new_session_key() -> String {
    let mut bytes = [0u8; 32];
    // Without randomness, an empty key matches nothing (`guard::same_secret` of two empty
    // strings is never asked: the login form refuses an empty token).
    let _ = getrandom::fill(&mut bytes);
    hex::encode(bytes)
}

/// A time as the API and the page show it (RFC 3339, UTC).
pub(crate) fn rfc3339(at: std::time::SystemTime) -> String {
    crate::support::when::rfc3339(at)
}
