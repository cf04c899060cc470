//! Outbound HTTP for guests: the `wasi:http/outgoing-handler` hooks that apply a
//! subscription's grant to every request.
//!
//! A guest can send HTTP requests only to the hosts its subscription lists in
//! `allowed_outbound_hosts` (the grammar and the match are `config::allow`); every other
//! request fails before a connection is attempted, with `error-code::http-request-denied` for
//! the guest and a warning in the host's log (inside the delivery's span, so it names the
//! stream, entry and digest).
//!
//! Every request is also bounded in time: connecting, waiting for the first byte of the
//! response, and waiting between body chunks each get at most the subscription's
//! `http_timeout`; a guest may ask for less through `request-options`, never for more.
//!
//! Whatever the grant, a guest never reaches the host's own admin listener: before a request
//! is sent its host name is resolved, and if any address it resolves to is that listener
//! (any loopback spelling, `0.0.0.0`, an IPv4-mapped IPv6 address, or, when the admin server
//! binds every interface, any address on its port) the request is denied like any other.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::uri::Scheme;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::config::allow::{Denied, OutboundHttp, default_port};

/// Why a request was refused before it was sent.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The allow-list does not grant it.
    #[error(transparent)]
    Denied(#[from] Denied),
    /// Its host name does not resolve.
    #[error("cannot resolve {host}: {source}")]
    Unresolvable {
        /// The host name.
        host: String,
        /// What the resolver said.
        source: std::io::Error,
    },
    /// It would reach the host's own admin listener.
    #[error("{uri} resolves to {addr}, the host's own admin listener ({own}); no grant reaches it")]
    OwnListener {
        /// The request's URL.
        uri: http::Uri,
        /// The address it resolved to.
        addr: SocketAddr,
        /// The listener.
        own: SocketAddr,
    },
}

/// The guest's request options, each timeout capped at the grant's `timeout`.
fn cap(policy: &OutboundHttp, options: Option<RequestOptions>) -> RequestOptions {
    let options = options.unwrap_or_default();
    let cap = |t: Option<Duration>| Some(t.map_or(policy.timeout, |t| t.min(policy.timeout)));
    RequestOptions {
        connect_timeout: cap(options.connect_timeout),
        first_byte_timeout: cap(options.first_byte_timeout),
        between_bytes_timeout: cap(options.between_bytes_timeout),
    }
}

/// A subscription's grant as its handler uses it: the policy, where denials are counted
/// (`sluice_http_denied_total`), and the host's own listeners no grant reaches.
#[derive(Debug, Default)]
pub struct HttpGrant {
    /// What may be reached, and how long a request may take.
    pub policy: OutboundHttp,
    /// Requests refused.
    pub denied: prometheus_client::metrics::counter::Counter,
    /// The host's own listeners (the admin server).
    pub protected: Protected,
}

/// The addresses of the host's own listeners, filled in once they are bound; shared by every
/// handler of a runtime.
#[derive(Debug, Clone, Default)]
pub struct Protected(Arc<std::sync::RwLock<Vec<SocketAddr>>>);

impl Protected {
    /// Never let a guest reach `addr`.
    pub fn add(&self, addr: SocketAddr) {
        if let Ok(mut list) = self.0.write() {
            list.push(addr);
        }
    }

    /// Forget `addr` (its listener stopped).
    pub fn remove(&self, addr: SocketAddr) {
        if let Ok(mut list) = self.0.write() {
            list.retain(|a| *a != addr);
        }
    }

    /// The protected listener `target` would reach, if any.
    pub fn hit(&self, target: SocketAddr) -> Option<SocketAddr> {
        let ip = target.ip().to_canonical();
        let local = ip.is_loopback() || ip.is_unspecified();
        let list = self.0.read().ok()?;
        list.iter().copied().find(|own| {
            own.port() == target.port()
                && (own.ip().is_unspecified()
                    || ip == own.ip().to_canonical()
                    || (local && own.ip().is_loopback()))
        })
    }
}

/// Resolve the request's host and refuse it when an address is one of the host's own
/// listeners.
async fn check_not_own(protected: &Protected, uri: &http::Uri) -> Result<(), Refused> {
    let https = uri.scheme() == Some(&Scheme::HTTPS);
    let host = uri.host().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = uri.port_u16().unwrap_or(default_port(https));
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| Refused::Unresolvable {
            host: host.to_owned(),
            source,
        })?;
    for addr in addrs {
        if let Some(own) = protected.hit(addr) {
            return Err(Refused::OwnListener {
                uri: uri.clone(),
                addr,
                own,
            });
        }
    }
    Ok(())
}

/// The most outbound requests of one attempt that get a span of their own; later ones go out
/// in the attempt's trace (their `traceparent` names the attempt) without one, counted as
/// dropped spans.
pub const MAX_REQUEST_SPANS: u32 = 64;

/// The `wasi:http` hooks of one store: the allow-list check and the capped timeouts in front
/// of wasmtime-wasi-http's own client, and each request's span and `traceparent` header.
pub(crate) struct HttpHooks {
    pub(crate) grant: Arc<HttpGrant>,
    /// Requests of the current attempt that got a span.
    pub(crate) spans: u32,
    /// The current attempt's trace, while traces are exported (taken when the call starts: a
    /// hook may run inside spans of the HTTP crates).
    pub(crate) trace: Option<crate::observe::telemetry::AttemptTrace>,
    /// What names the current attempt's calls, when they carry idempotency keys.
    pub(crate) identity: Option<super::effects::CallIdentity>,
    /// Requests the current attempt has sent (or tried to): the next one's position.
    pub(crate) calls: u32,
    /// The journal of the current attempt's calls, with `effects = "journal"`.
    pub(crate) journal: Option<Arc<super::journal::AttemptJournal>>,
}

impl HttpHooks {
    /// A new attempt starts: its calls are counted from 0, named by `identity`, and go
    /// through `journal` when it has one.
    pub(crate) fn begin(
        &mut self,
        identity: Option<super::effects::CallIdentity>,
        journal: Option<Arc<super::journal::AttemptJournal>>,
    ) {
        self.identity = identity;
        self.journal = journal;
        self.calls = 0;
    }

    /// Whether the attempt's calls get idempotency keys: a grant to call anything, and a
    /// header to put them in.
    pub(crate) fn keys_calls(&self) -> bool {
        self.grant.policy.idempotency_header.is_some() && !self.grant.policy.allowed.is_empty()
    }

    /// Put the attempt's key for request number `call` in `headers`, unless the handler set
    /// one there itself.
    fn add_idempotency_key(&self, call: u32, headers: &mut http::HeaderMap) {
        let (Some(name), Some(identity)) = (&self.grant.policy.idempotency_header, &self.identity)
        else {
            return;
        };
        if headers.contains_key(name) {
            return;
        }
        if let Ok(value) = http::HeaderValue::from_str(&identity.key(call)) {
            headers.insert(name.clone(), value);
        }
    }
}

/// With traces exported: a span for the request (a child of the attempt's, while the attempt
/// has some left) and the request's `traceparent` and `tracestate` set to it, whatever the
/// guest put there.
fn trace_request(
    spans: &mut u32,
    trace: Option<&crate::observe::telemetry::AttemptTrace>,
    request: &mut http::Request<WasiBody>,
) -> Option<tracing::Span> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    let trace = trace?;
    let headers = request.headers_mut();
    headers.remove(crate::observe::telemetry::context::TRACEPARENT);
    headers.remove(crate::observe::telemetry::context::TRACESTATE);
    let Some(attempt) = &trace.span else {
        // Not sampled: the request still goes out in the entry's trace, marked unsampled.
        set_context(request.headers_mut(), &trace.parent);
        return None;
    };
    let span = if *spans < MAX_REQUEST_SPANS {
        *spans += 1;
        let method = request.method().as_str();
        let span = tracing::info_span!(
            parent: attempt,
            "http request",
            "otel.kind" = "client",
            "otel.name" = method,
            "http.request.method" = method,
            "server.address" = request.uri().host().unwrap_or_default(),
            "url.full" = crate::observe::telemetry::bounded(&request.uri().to_string()).as_str(),
            "http.response.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        );
        Some(span)
    } else {
        crate::observe::telemetry::count_dropped();
        None
    };
    let cx = span.as_ref().unwrap_or(attempt).context();
    let sc = cx.span().span_context().clone();
    set_context(
        request.headers_mut(),
        if sc.is_valid() { &sc } else { &trace.parent },
    );
    span
}

/// Set a request's `traceparent` (and `tracestate`) to `sc`.
fn set_context(headers: &mut http::HeaderMap, sc: &opentelemetry::trace::SpanContext) {
    if let Ok(value) =
        http::HeaderValue::from_str(&crate::observe::telemetry::context::traceparent(sc))
    {
        headers.insert(crate::observe::telemetry::context::TRACEPARENT, value);
    }
    let state = sc.trace_state().header();
    if !state.is_empty()
        && let Ok(value) = http::HeaderValue::from_str(&state)
    {
        headers.insert(crate::observe::telemetry::context::TRACESTATE, value);
    }
}

/// The most of a request body a request that was not sent reads and drops.
const MAX_DRAINED: usize = 64 * 1024 * 1024;

/// A request body that, dropped before its end (the request was denied, refused or failed),
/// keeps reading what the guest writes and drops it, for at most the grant's timeout and
/// [`MAX_DRAINED`] bytes. A guest that writes its body after sending (JavaScript's `fetch`)
/// traps on a closed body stream, where it must see the request's own error: a refused
/// connection rejects its promise, not the whole attempt.
struct DrainOnDrop {
    body: Option<WasiBody>,
    within: Duration,
}

impl DrainOnDrop {
    fn new(body: WasiBody, within: Duration) -> Self {
        Self {
            body: Some(body),
            within,
        }
    }
}

impl http_body::Body for DrainOnDrop {
    type Data = bytes::Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let polled = std::pin::Pin::new(body).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) {
            // Read to its end: nothing left to drain.
            self.body = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.as_ref().map_or_else(
            || http_body::SizeHint::with_exact(0),
            http_body::Body::size_hint,
        )
    }
}

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        let Some(mut body) = self.body.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let within = self.within;
        runtime.spawn(async move {
            use http_body_util::BodyExt as _;
            let _ = tokio::time::timeout(within, async {
                let mut read = 0;
                while let Some(Ok(frame)) = body.frame().await {
                    read += frame.data_ref().map_or(0, bytes::Bytes::len);
                    if read > MAX_DRAINED {
                        break;
                    }
                }
            })
            .await;
        });
    }
}

type ResponseFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> ResponseFuture {
        let grant = self.grant.clone();
        let call = self.calls;
        self.calls = self.calls.saturating_add(1);
        use http_body_util::BodyExt as _;
        // A request that is not sent (denied, refused, failed) still takes its body.
        let within = self.grant.policy.timeout;
        let mut request = request.map(|body| DrainOnDrop::new(body, within).boxed_unsync());
        let denied = move |request: &http::Request<WasiBody>, why: &Refused| {
            grant.denied.inc();
            tracing::warn!(
                target: "sluice::http",
                method = %request.method(),
                url = %request.uri(),
                "outbound HTTP denied: {why}"
            );
            Err(HttpError::HttpRequestDenied)
        };
        if let Err(why) = self.grant.policy.check(request.uri()) {
            // Logged now, inside the delivery's span (the future runs on another task).
            let refused = denied(&request, &why.into());
            return Box::new(async move { refused });
        }
        tracing::debug!(
            target: "sluice::http",
            method = %request.method(),
            url = %request.uri(),
            "outbound HTTP request"
        );
        self.add_idempotency_key(call, request.headers_mut());
        let options = cap(&self.grant.policy, options);
        let protected = self.grant.protected.clone();
        let span = tracing::Span::current();
        let request_span = trace_request(&mut self.spans, self.trace.as_ref(), &mut request);
        let live = move |request: http::Request<WasiBody>| async move {
            use http_body_util::BodyExt;
            if let Err(why) = check_not_own(&protected, request.uri()).await {
                if let Some(s) = &request_span {
                    s.record("error.type", "denied");
                }
                return span.in_scope(|| denied(&request, &why));
            }
            let sent = wasmtime_wasi_http::default_send_request(request, Some(options)).await;
            if let Some(s) = &request_span {
                match &sent {
                    Ok((response, _)) => {
                        s.record(
                            "http.response.status_code",
                            i64::from(response.status().as_u16()),
                        );
                    }
                    Err(err) => {
                        s.record(
                            "error.type",
                            crate::observe::telemetry::bounded(&err.to_string()).as_str(),
                        );
                        s.record("otel.status_code", "error");
                    }
                }
            }
            drop(request_span);
            let (response, io) = sent?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = Result<(), HttpError>> + Send>,
            ))
        };
        match self.journal.clone() {
            Some(journal) => Box::new(journal.send(call, request, live)),
            None => Box::new(live(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_listeners_are_recognised_in_every_spelling() {
        let protected = Protected::default();
        protected.add("127.0.0.1:9187".parse().unwrap());
        for target in [
            "127.0.0.1:9187",
            "127.0.0.2:9187",
            "0.0.0.0:9187",
            "[::1]:9187",
            "[::ffff:127.0.0.1]:9187",
            "[::]:9187",
        ] {
            assert!(protected.hit(target.parse().unwrap()).is_some(), "{target}");
        }
        assert!(protected.hit("127.0.0.1:9188".parse().unwrap()).is_none());
        assert!(protected.hit("10.1.2.3:9187".parse().unwrap()).is_none());
        let everywhere = Protected::default();
        everywhere.add("0.0.0.0:9000".parse().unwrap());
        assert!(everywhere.hit("10.1.2.3:9000".parse().unwrap()).is_some());
        everywhere.remove("0.0.0.0:9000".parse().unwrap());
        assert!(everywhere.hit("10.1.2.3:9000".parse().unwrap()).is_none());
    }

    #[test]
    fn guest_timeouts_are_capped() {
        let g = OutboundHttp {
            allowed: vec!["http://a.com".parse().unwrap()],
            timeout: Duration::from_secs(1),
            ..OutboundHttp::default()
        };
        let capped = cap(
            &g,
            Some(RequestOptions {
                connect_timeout: Some(Duration::from_millis(100)),
                first_byte_timeout: Some(Duration::from_secs(60)),
                between_bytes_timeout: None,
            }),
        );
        assert_eq!(capped.connect_timeout, Some(Duration::from_millis(100)));
        assert_eq!(capped.first_byte_timeout, Some(Duration::from_secs(1)));
        assert_eq!(capped.between_bytes_timeout, Some(Duration::from_secs(1)));
    }
}
