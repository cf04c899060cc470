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
//!   of them through [`listing`]);
//! - `POST .../pause` and `.../resume`: hold or release the subscription on every host of its
//!   group (see [`flow`]);
//! - `.../canary` and the replay calls: a rollout (see [`rollout`]);
//! - `/` and `/ui/...`: the web page (see [`ui`]).
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
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

mod connections;
mod flow;
mod guard;
pub(crate) mod listing;
mod rollout;
mod ui;
mod waiting;

use crate::control::swap::{SwapControl, SwapError};
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

/// Deliveries counted so far at one moment, for the page's chart: acked, retried, failed
/// (dead-lettered by the handler, trapped or over a limit).
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    at_ms: i64,
    counts: [u64; 3],
}

/// How often the chart's counts are sampled, and how many samples are kept (10 minutes).
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const SAMPLES: usize = 121;

#[derive(Clone)]
struct AdminState {
    sessions: Arc<ui::Sessions>,
    samples: Arc<std::sync::Mutex<std::collections::VecDeque<Sample>>>,
    metrics: Arc<Metrics>,
    subscriptions: Arc<Vec<AdminSubscription>>,
    swaps: Arc<Vec<Arc<SwapControl>>>,
    rollouts: Arc<Vec<Arc<crate::control::rollout::Rollout>>>,
    token: Option<Arc<str>>,
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
    redis_samples: Arc<tokio::sync::Mutex<Samples>>,
}

/// The handler API's settings.
pub struct AdminOptions {
    /// The bearer token mutating calls must carry, if any.
    pub token: Option<String>,
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
    addr: SocketAddr,
    source: std::io::Error,
}

/// Bind `addr` and serve until `stop`; returns the bound address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    subscriptions: Vec<AdminSubscription>,
    options: AdminOptions,
    stop: CancellationToken,
) -> Result<SocketAddr, AdminError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AdminError { addr, source })?;
    let state = AdminState {
        sessions: Arc::default(),
        samples: Arc::default(),
        metrics,
        index: Arc::new(listing::Index::new(&subscriptions)),
        subscriptions: Arc::new(subscriptions),
        swaps: Arc::new(options.swaps),
        rollouts: Arc::new(options.rollouts),
        token: options.token.map(Into::into),
        session_key: options.session_key,
        open_on_loopback: options.open_on_loopback && bound.ip().is_loopback(),
        read_only: options.read_only,
        max_upload: options.max_upload,
        bound,
        uploads: Arc::new(tokio::sync::Semaphore::new(1)),
        throttle: Arc::default(),
        redis_samples: Arc::default(),
    };
    let api = Router::new()
        .route("/v1/subscriptions", get(list_handler))
        .route(
            "/v1/subscriptions/{stream}/{group}/handler",
            axum::routing::put(swap_handler)
                .layer(axum::extract::DefaultBodyLimit::max(options.max_upload)),
        )
        .route(
            "/v1/subscriptions/{stream}/{group}/rollback",
            axum::routing::post(rollback_handler),
        )
        .merge(waiting::routes())
        .merge(flow::routes())
        .merge(rollout::routes(options.max_upload))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_api,
        ));
    let page = ui::routes(options.max_upload).layer(axum::middleware::from_fn_with_state(
        state.clone(),
        ui::guard_ui_hardened,
    ));
    tokio::spawn(sample_outcomes(state.clone(), stop.clone()));
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler));
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
            guard_all,
        ))
        .with_state(state.clone());
    let app = probes
        .route("/metrics", get(metrics_handler))
        .merge(api)
        .merge(page)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_all,
        ))
        .with_state(state);
    tokio::spawn(connections::serve(listener, app, busy, stop));
    tracing::info!(addr = %bound, "admin server listening (/ui/, /metrics, /healthz, /readyz)");
    Ok(bound)
}

/// A key for the admin API and page of a process with no admin token: 256 random bits, hex.
pub fn new_session_key() -> String {
    let mut bytes = [0u8; 32];
    // Without randomness, an empty key matches nothing (`guard::same_secret` of two empty
    // strings is never asked: the login form refuses an empty token).
    let _ = getrandom::fill(&mut bytes);
    hex::encode(bytes)
}

async fn ready_handler(State(state): State<AdminState>) -> impl IntoResponse {
    // One PING per Redis, however many subscriptions share it.
    let mut pinged: Vec<&crate::store::redis_conn::RedisHandle> = Vec::new();
    for sub in state.subscriptions.iter() {
        if let Some(problem) = sub.health.problem() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "not ready: the subscription to stream `{}` (group `{}`) cannot read: {problem}\n",
                    sub.labels.stream, sub.labels.group
                ),
            );
        }
        if pinged.iter().any(|conn| conn.same_as(&sub.conn)) {
            continue;
        }
        pinged.push(&sub.conn);
        let mut conn = sub.conn.clone();
        let ping = tokio::time::timeout(
            PROBE_TIMEOUT,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await;
        let problem = match ping {
            Ok(Ok(_)) => continue,
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: Redis for stream `{}` (group `{}`) is unreachable: {problem}\n",
                sub.labels.stream, sub.labels.group
            ),
        );
    }
    (StatusCode::OK, "ready\n".to_owned())
}

async fn metrics_handler(State(state): State<AdminState>) -> impl IntoResponse {
    {
        // Held while sampling: a second scrape waits and then finds the samples fresh,
        // instead of asking Redis the same again.
        let mut samples = state.redis_samples.lock().await;
        refresh_samples(&state.subscriptions, &mut samples).await;
        let taken: Vec<RedisSample> = samples.iter().map(|(s, _)| s.clone()).collect();
        publish_samples(&state.metrics, &state.subscriptions, &taken);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// A sample younger than this is not taken again: scrapes more often than this cost Redis
/// nothing more.
const SAMPLE_FRESH: Duration = Duration::from_secs(5);
/// Subscriptions sampled at once (their commands pipelined on the shared connections).
const SAMPLE_AT_ONCE: usize = 32;
/// The longest a scrape spends sampling; subscriptions not reached keep their last sample.
const SAMPLE_BUDGET: Duration = Duration::from_secs(3);

/// Each subscription's last sample and when it was last tried (answered or not).
type Samples = Vec<(RedisSample, Option<tokio::time::Instant>)>;

/// What one subscription's Redis state was when last sampled.
#[derive(Debug, Clone, Default)]
struct RedisSample {
    taken: Option<tokio::time::Instant>,
    size: Option<crate::store::inspect::StreamSize>,
    /// Its group's pending entries and unread ones, its retry lane's included.
    pending: Option<u64>,
    lag: Option<u64>,
    dead_letters: u64,
    /// Parked entries and the earliest due time (Unix seconds, 0 when none).
    parked: Option<(u64, i64)>,
}

/// Sample the subscriptions whose sample is older than [`SAMPLE_FRESH`], oldest first,
/// [`SAMPLE_AT_ONCE`] at a time, for at most [`SAMPLE_BUDGET`].
async fn refresh_samples(subscriptions: &[AdminSubscription], samples: &mut Samples) {
    use futures::StreamExt;
    samples.resize_with(subscriptions.len(), Default::default);
    let now = tokio::time::Instant::now();
    // By when each was last tried, answered or not: a Redis that does not answer goes to
    // the back of the line instead of taking every scrape's budget.
    let mut stale: Vec<usize> = (0..subscriptions.len())
        .filter(|&i| {
            samples[i]
                .1
                .is_none_or(|at| now.duration_since(at) >= SAMPLE_FRESH)
        })
        .collect();
    stale.sort_by_key(|&i| samples[i].1);
    let mut taken = futures::stream::iter(stale)
        .map(|i| async move {
            let sample = tokio::time::timeout(PROBE_TIMEOUT, sample(&subscriptions[i])).await;
            (i, sample)
        })
        .buffer_unordered(SAMPLE_AT_ONCE);
    let deadline = now + SAMPLE_BUDGET;
    loop {
        match tokio::time::timeout_at(deadline, taken.next()).await {
            Ok(Some((i, Ok(Some(sample))))) => {
                samples[i] = (sample, Some(tokio::time::Instant::now()));
            }
            Ok(Some((i, _))) => {
                samples[i].1 = Some(tokio::time::Instant::now());
                tracing::debug!(stream = %subscriptions[i].labels.stream, "Redis gauges not sampled");
            }
            Ok(None) => break,
            Err(_) => {
                tracing::debug!(
                    "Redis gauges: sampling budget spent, the rest keep their last sample"
                );
                break;
            }
        }
    }
}

/// One subscription's Redis state, `None` when Redis did not answer.
async fn sample(sub: &AdminSubscription) -> Option<RedisSample> {
    let mut conn = sub.conn.clone();
    let snapshot = crate::store::inspect::snapshot(
        &mut conn,
        &sub.labels.stream,
        &sub.labels.group,
        &sub.dead_letter,
        sub.delayed_key.as_deref(),
        sub.lane.as_deref(),
    )
    .await
    .ok()?;
    let size = crate::store::inspect::stream_size(&mut conn, &sub.labels.stream)
        .await
        .ok();
    // With a retry lane, its pending and unread entries count too: they are the same
    // subscription's work.
    let lane = snapshot.lane;
    let (pending, lag) = match snapshot.group {
        Some(group) => {
            let lane_pending = lane.as_ref().map_or(0, |l| l.pending as u64);
            let lag = group.lag.map(|lag| {
                let lane_lag = lane.as_ref().and_then(|l| l.lag).unwrap_or(0);
                (lag + lane_lag) as u64
            });
            (Some(group.pending as u64 + lane_pending), lag)
        }
        None => (None, None),
    };
    Some(RedisSample {
        taken: Some(tokio::time::Instant::now()),
        size,
        pending,
        lag,
        dead_letters: snapshot.dead_letters,
        parked: snapshot
            .delayed
            .map(|d| (d.parked, d.next_due_ms.map_or(0, |ms| ms / 1000))),
    })
}

/// Set the Redis-state gauges from the samples: each subscription's, or their sums per host
/// (a stream read by several groups counted once).
fn publish_samples(
    metrics: &Metrics,
    subscriptions: &[AdminSubscription],
    samples: &[RedisSample],
) {
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let now_ms = crate::support::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let age = |size: &crate::store::inspect::StreamSize| {
        size.oldest_ms
            .map_or(0, |oldest| (now_ms - oldest).max(0) / 1000)
    };
    if metrics.per_subscription() {
        for (sub, s) in subscriptions.iter().zip(samples) {
            if s.taken.is_none() {
                continue;
            }
            let labels = &sub.labels;
            if let Some(size) = &s.size {
                metrics
                    .stream_length
                    .get_or_create(labels)
                    .set(gauge(size.length));
                metrics
                    .stream_bytes
                    .get_or_create(labels)
                    .set(gauge(size.bytes));
                metrics
                    .stream_oldest_age
                    .get_or_create(labels)
                    .set(age(size));
            }
            if let Some(pending) = s.pending {
                metrics.pending.get_or_create(labels).set(gauge(pending));
            }
            if let Some(lag) = s.lag {
                metrics.lag.get_or_create(labels).set(gauge(lag));
            }
            metrics
                .dead_letters
                .get_or_create(labels)
                .set(gauge(s.dead_letters));
            if let Some((parked, due)) = s.parked {
                metrics.parked.get_or_create(labels).set(gauge(parked));
                metrics.parked_oldest_due.get_or_create(labels).set(due);
            }
        }
        return;
    }
    let mut streams = std::collections::HashSet::new();
    let mut dead_letter_streams = std::collections::HashSet::new();
    let (mut length, mut bytes, mut oldest_age) = (0u64, 0u64, 0i64);
    let (mut pending, mut lag, mut dead_letters, mut parked) = (0u64, 0u64, 0u64, 0u64);
    let mut earliest_due: Option<i64> = None;
    for (sub, s) in subscriptions.iter().zip(samples) {
        if s.taken.is_none() {
            continue;
        }
        if let Some(size) = &s.size
            && streams.insert(sub.labels.stream.as_str())
        {
            length = length.saturating_add(size.length);
            bytes = bytes.saturating_add(size.bytes);
            oldest_age = oldest_age.max(age(size));
        }
        pending = pending.saturating_add(s.pending.unwrap_or(0));
        lag = lag.saturating_add(s.lag.unwrap_or(0));
        if dead_letter_streams.insert(sub.dead_letter.as_str()) {
            dead_letters = dead_letters.saturating_add(s.dead_letters);
        }
        if let Some((n, due)) = s.parked {
            parked = parked.saturating_add(n);
            if due > 0 {
                earliest_due = Some(earliest_due.map_or(due, |e| e.min(due)));
            }
        }
    }
    let host = metrics.series(&Metrics::labels("", ""));
    metrics
        .stream_length
        .get_or_create(&host)
        .set(gauge(length));
    metrics.stream_bytes.get_or_create(&host).set(gauge(bytes));
    metrics
        .stream_oldest_age
        .get_or_create(&host)
        .set(oldest_age);
    metrics.pending.get_or_create(&host).set(gauge(pending));
    metrics.lag.get_or_create(&host).set(gauge(lag));
    metrics
        .dead_letters
        .get_or_create(&host)
        .set(gauge(dead_letters));
    metrics.parked.get_or_create(&host).set(gauge(parked));
    metrics
        .parked_oldest_due
        .get_or_create(&host)
        .set(earliest_due.unwrap_or(0));
}

/// Every [`SAMPLE_EVERY`], the host's delivery counts, for the page's chart.
async fn sample_outcomes(state: AdminState, stop: CancellationToken) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let mut counts = [0u64; 3];
        for sub in state.subscriptions.iter() {
            for (label, n) in state.metrics.outcomes(&sub.labels) {
                let i = match label {
                    "ack" => 0,
                    "retry" => 1,
                    _ => 2,
                };
                counts[i] += n;
            }
        }
        let at_ms = crate::support::clock::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if let Ok(mut samples) = state.samples.lock() {
            if samples.len() == SAMPLES {
                samples.pop_front();
            }
            samples.push_back(Sample { at_ms, counts });
        }
    }
}

pub(crate) fn rfc3339(at: std::time::SystemTime) -> String {
    crate::support::when::rfc3339(at)
}

async fn list_handler(
    State(state): State<AdminState>,
    axum::extract::Query(query): axum::extract::Query<listing::ListQuery>,
) -> axum::response::Response {
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

type Refusal = (StatusCode, String);

/// Every request: a `Host` this server answers to (DNS rebinding), and a deadline.
async fn guard_all(
    State(state): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
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
async fn guard_api(
    State(state): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let what = format!("{} {}", request.method(), request.uri().path());
    let mutating = request.method() != axum::http::Method::GET;
    let checked = guard::not_cross_site(request.headers(), state.bound)
        .and_then(|()| authorized(&state, request.headers(), &what, mutating))
        .and_then(|()| guard::declared_size(request.headers(), state.max_upload));
    if let Err(refusal) = checked {
        if refusal.0 == StatusCode::UNAUTHORIZED {
            state.throttle.refused(&what).await;
        }
        return refusal.into_response();
    }
    let _upload = if request.method() == axum::http::Method::PUT {
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
    headers: &axum::http::HeaderMap,
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
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|given| guard::same_secret(given, token)) {
        return Ok(());
    }
    // Logged by the throttle, which also makes the answer wait.
    Err((
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token\n".to_owned(),
    ))
}

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

#[derive(serde::Deserialize)]
struct SwapQuery {
    #[serde(default)]
    force: bool,
}

async fn swap_handler(
    State(state): State<AdminState>,
    axum::extract::Path((stream, group)): axum::extract::Path<(String, String)>,
    axum::extract::Query(query): axum::extract::Query<SwapQuery>,
    body: axum::body::Bytes,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
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

async fn rollback_handler(
    State(state): State<AdminState>,
    axum::extract::Path((stream, group)): axum::extract::Path<(String, String)>,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
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
