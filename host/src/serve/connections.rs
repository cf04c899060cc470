//! The admin server's connections: how many are served, for how long one may say nothing, and
//! who goes when they run out, so that no client (another pod, a local user) can keep
//! `/healthz`, `/readyz` and `/metrics` from answering by holding connections open.
//!
//! - A connection must send a whole request's headers within [`HEADER_TIMEOUT`] of being
//!   accepted or of its last response (hyper's header read timeout): an idle or slow one is
//!   closed. A request's body and answer are bounded by the guard's request timeout.
//! - At most [`MAX_CONNECTIONS`] are served for everything. When a new one comes and they are
//!   all taken, the one idle longest (no request in flight) is closed for it.
//! - When every one of them has a request in flight, up to [`HEALTH_RESERVE`] more are served
//!   for the probes alone (`/healthz`, `/readyz`; anything else is 503): health stays
//!   answerable whatever the others do. Beyond that, a new connection is closed at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// Connections served for everything at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections served for the probes alone when every other one is busy.
pub const HEALTH_RESERVE: usize = 16;
/// How long a connection may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a closed connection's request in flight gets to finish.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// One connection as the registry sees it.
struct Conn {
    /// Requests in flight.
    in_flight: usize,
    /// Since when it has had none (it is idle when `in_flight` is 0).
    idle_since: Instant,
    /// Served for the probes alone.
    reserve: bool,
    /// Closes it.
    close: CancellationToken,
}

/// Every connection being served.
#[derive(Default)]
struct Registry {
    next: u64,
    conns: HashMap<u64, Conn>,
}

/// What a new connection gets.
enum Admit {
    /// Served for everything.
    Full(u64),
    /// Served for the probes alone.
    Reserve(u64),
    /// Closed at once.
    Refuse,
}

impl Registry {
    fn admit(&mut self) -> Admit {
        let full = self.conns.values().filter(|c| !c.reserve).count();
        let reserve = self.conns.len() - full;
        if full >= MAX_CONNECTIONS || reserve >= HEALTH_RESERVE {
            self.evict_idlest();
        }
        let full = self.conns.values().filter(|c| !c.reserve).count();
        let reserve = self.conns.len() - full;
        let is_reserve = if full < MAX_CONNECTIONS {
            false
        } else if reserve < HEALTH_RESERVE {
            true
        } else {
            return Admit::Refuse;
        };
        let id = self.next;
        self.next += 1;
        self.conns.insert(
            id,
            Conn {
                in_flight: 0,
                idle_since: Instant::now(),
                reserve: is_reserve,
                close: CancellationToken::new(),
            },
        );
        if is_reserve {
            Admit::Reserve(id)
        } else {
            Admit::Full(id)
        }
    }

    /// Close the connection idle longest, if one is idle: it leaves the registry now.
    fn evict_idlest(&mut self) {
        let idlest = self
            .conns
            .iter()
            .filter(|(_, c)| c.in_flight == 0)
            .min_by_key(|(_, c)| c.idle_since)
            .map(|(id, _)| *id);
        if let Some(conn) = idlest.and_then(|id| self.conns.remove(&id)) {
            conn.close.cancel();
        }
    }
}

/// A request in flight on connection `id`, counted until dropped.
struct InFlight {
    registry: Arc<Mutex<Registry>>,
    id: u64,
}

impl InFlight {
    fn start(registry: &Arc<Mutex<Registry>>, id: u64) -> Self {
        if let Ok(mut r) = registry.lock()
            && let Some(conn) = r.conns.get_mut(&id)
        {
            conn.in_flight += 1;
        }
        Self {
            registry: registry.clone(),
            id,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut r) = self.registry.lock()
            && let Some(conn) = r.conns.get_mut(&self.id)
        {
            conn.in_flight = conn.in_flight.saturating_sub(1);
            if conn.in_flight == 0 {
                conn.idle_since = Instant::now();
            }
        }
    }
}

/// Serve `app` on `listener` until `stop`, `probes` on connections beyond the limit.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    probes: Router,
    stop: CancellationToken,
) {
    let registry = Arc::new(Mutex::new(Registry::default()));
    let mut refused_logged: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors, say: wait a moment rather than spin.
                tracing::warn!(%err, "the admin server cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admit = match registry.lock() {
            Ok(mut r) => r.admit(),
            Err(_) => Admit::Refuse,
        };
        let (id, router) = match admit {
            Admit::Full(id) => (id, app.clone()),
            Admit::Reserve(id) => (id, probes.clone()),
            Admit::Refuse => {
                if refused_logged.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(%peer, "the admin server refuses connections: every one it serves has a request in flight");
                    refused_logged = Some(Instant::now());
                }
                drop(stream);
                continue;
            }
        };
        let close = registry
            .lock()
            .ok()
            .and_then(|r| r.conns.get(&id).map(|c| c.close.clone()))
            .unwrap_or_default();
        tokio::spawn(connection(
            stream,
            router,
            (registry.clone(), id),
            close,
            stop.clone(),
        ));
    }
}

/// Serve one connection until it ends, is closed for another, or the server stops.
async fn connection(
    stream: tokio::net::TcpStream,
    router: Router,
    (registry, id): (Arc<Mutex<Registry>>, u64),
    close: CancellationToken,
    stop: CancellationToken,
) {
    let counted = registry.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
        let in_flight = InFlight::start(&counted, id);
        let request = request.map(Body::new);
        let router = router.clone();
        async move {
            let response = router.oneshot(request).await;
            drop(in_flight);
            response
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        served = conn.as_mut() => Some(served),
        () = close.cancelled() => None,
        () = stop.cancelled() => None,
    };
    if ended.is_none() {
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(CLOSE_GRACE, conn.as_mut()).await;
    }
    if let Ok(mut r) = registry.lock() {
        r.conns.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idlest_goes_first_and_busy_ones_stay() {
        let mut r = Registry::default();
        let mut ids = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            match r.admit() {
                Admit::Full(id) => ids.push(id),
                _ => panic!("room for {MAX_CONNECTIONS}"),
            }
        }
        // All busy but the third: a new one takes its place.
        for id in &ids {
            if *id != ids[2] {
                r.conns.get_mut(id).unwrap().in_flight = 1;
            }
        }
        let third = r.conns[&ids[2]].close.clone();
        assert!(matches!(r.admit(), Admit::Full(_)));
        assert!(third.is_cancelled());
        // All busy now: the probes' reserve, then nothing.
        for conn in r.conns.values_mut() {
            conn.in_flight = 1;
        }
        // Each probe connection busy as it comes (an idle one would be closed for the next).
        for _ in 0..HEALTH_RESERVE {
            let Admit::Reserve(id) = r.admit() else {
                panic!("room for the probes");
            };
            r.conns.get_mut(&id).unwrap().in_flight = 1;
        }
        assert!(matches!(r.admit(), Admit::Refuse));
        // One idle again: closed for the next.
        let some = *r.conns.keys().next().unwrap();
        r.conns.get_mut(&some).unwrap().in_flight = 0;
        assert!(!matches!(r.admit(), Admit::Refuse));
        assert!(!r.conns.contains_key(&some));
    }
}
