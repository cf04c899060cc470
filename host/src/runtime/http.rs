//! Outbound HTTP for guests: `wasi:http/outgoing-handler`, granted per subscription.
//!
//! A guest can send HTTP requests only to the hosts its subscription lists in
//! `allowed_outbound_hosts`; every other request fails before a connection is attempted, with
//! `error-code::http-request-denied` for the guest and a warning in the host's log (inside the
//! delivery's span, so it names the stream, entry and digest). An empty list, the default,
//! grants nothing.
//!
//! An entry is `scheme://host[:port]`:
//! - scheme: `http`, `https`, or `*` for either;
//! - host: a name or IP address (IPv6 in brackets), `*` for any host, or `*.example.com` for
//!   any subdomain of `example.com` (not `example.com` itself);
//! - port: a number or `*`; left out, it is the scheme's default (80 for http, 443 for https).
//!
//! Every request is also bounded in time: connecting, waiting for the first byte of the
//! response, and waiting between body chunks each get at most the subscription's
//! `http_timeout`; a guest may ask for less through `request-options`, never for more.
//!
//! Whatever the grant, a guest never reaches the host's own admin listener: before a request
//! is sent its host name is resolved, and if any address it resolves to is that listener
//! (any loopback spelling, `0.0.0.0`, an IPv4-mapped IPv6 address, or, when the admin server
//! binds every interface, any address on its port) the request is denied like any other. A URL
//! with user information (`http://user@host/`) is refused outright.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::uri::Scheme;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// One entry of `allowed_outbound_hosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    scheme: SchemePattern,
    host: HostPattern,
    port: Option<PortPattern>,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SchemePattern {
    Http,
    Https,
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    /// `*.example.com`, stored as `.example.com`.
    Subdomains(String),
    Exact(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPattern {
    Any,
    Exact(u16),
}

impl FromStr for AllowedHost {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let example = "write scheme://host[:port], e.g. \"https://api.example.com\", \
                       \"http://127.0.0.1:8080\" or \"https://*.example.com:*\"";
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| format!("no scheme; {example}"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => SchemePattern::Http,
            "https" => SchemePattern::Https,
            "*" => SchemePattern::Any,
            other => return Err(format!("unsupported scheme `{other}` (http, https or *)")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if let Some(c) = rest.chars().find(|c| matches!(c, '/' | '?' | '#' | '@')) {
            return Err(format!(
                "`{c}` is not allowed: an entry names a scheme, host and port, not a path, query or user; {example}"
            ));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (addr, after) = v6
                .split_once(']')
                .ok_or_else(|| "an IPv6 address needs its closing `]`".to_owned())?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("unexpected `{p}` after the IPv6 address"))?,
                ),
            };
            (format!("[{}]", addr.to_ascii_lowercase()), port)
        } else {
            match rest.rsplit_once(':') {
                Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
                None => (rest.to_ascii_lowercase(), None),
            }
        };
        let host = if host == "*" {
            HostPattern::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            if domain.is_empty() || domain.contains('*') {
                return Err(format!("`{host}`: a wildcard is `*` or `*.domain`"));
            }
            HostPattern::Subdomains(format!(".{domain}"))
        } else if host.is_empty() {
            return Err(format!("no host; {example}"));
        } else if host.contains('*') {
            return Err(format!(
                "`{host}`: a wildcard is `*` (any host) or a leading `*.` (any subdomain)"
            ));
        } else {
            HostPattern::Exact(host)
        };
        let port = match port {
            None => None,
            Some("*") => Some(PortPattern::Any),
            Some(p) => Some(PortPattern::Exact(p.parse().map_err(|_| {
                format!("port `{p}` is not a number from 0 to 65535 or `*`")
            })?)),
        };
        Ok(Self {
            scheme,
            host,
            port,
            text: text.to_owned(),
        })
    }
}

impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl AllowedHost {
    /// Whether a request to `scheme://host:port` matches this entry; `host` is lower case,
    /// IPv6 addresses in brackets.
    fn allows(&self, scheme: &Scheme, host: &str, port: u16) -> bool {
        let https = *scheme == Scheme::HTTPS;
        let scheme_ok = match self.scheme {
            SchemePattern::Http => *scheme == Scheme::HTTP,
            SchemePattern::Https => https,
            SchemePattern::Any => true,
        };
        let host_ok = match &self.host {
            HostPattern::Any => true,
            HostPattern::Subdomains(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
            HostPattern::Exact(exact) => host == exact,
        };
        let port_ok = match self.port {
            Some(PortPattern::Any) => true,
            Some(PortPattern::Exact(p)) => port == p,
            None => port == default_port(https),
        };
        scheme_ok && host_ok && port_ok
    }
}

fn default_port(https: bool) -> u16 {
    if https { 443 } else { 80 }
}

/// What a subscription's guests may reach over HTTP, and how long a request may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundHttp {
    /// `allowed_outbound_hosts`; empty grants nothing.
    pub allowed: Vec<AllowedHost>,
    /// The longest a request may wait to connect, for its first response byte, or between
    /// response body chunks.
    pub timeout: Duration,
}

impl Default for OutboundHttp {
    fn default() -> Self {
        Self {
            allowed: Vec::new(),
            timeout: crate::config::DEFAULT_HANDLER_TIMEOUT,
        }
    }
}

impl OutboundHttp {
    /// Whether `uri` may be requested; on refusal, why (for the log line).
    pub fn check(&self, uri: &http::Uri) -> Result<(), String> {
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(format!(
                "{uri}: user information in a URL (`user@host`) is not allowed"
            ));
        }
        let scheme = uri.scheme().cloned().unwrap_or(Scheme::HTTPS);
        let https = scheme == Scheme::HTTPS;
        let host = uri.host().unwrap_or_default().to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(default_port(https));
        if self.allowed.is_empty() {
            return Err(format!(
                "{scheme}://{host}:{port}: this subscription grants no outbound HTTP (allowed_outbound_hosts is empty)"
            ));
        }
        if self.allowed.iter().any(|a| a.allows(&scheme, &host, port)) {
            return Ok(());
        }
        let allowed: Vec<&str> = self.allowed.iter().map(|a| a.text.as_str()).collect();
        Err(format!(
            "{scheme}://{host}:{port} is not on this subscription's allowed_outbound_hosts [{}]",
            allowed.join(", ")
        ))
    }

    /// The guest's request options, each timeout capped at `self.timeout`.
    fn cap(&self, options: Option<RequestOptions>) -> RequestOptions {
        let options = options.unwrap_or_default();
        let cap = |t: Option<Duration>| Some(t.map_or(self.timeout, |t| t.min(self.timeout)));
        RequestOptions {
            connect_timeout: cap(options.connect_timeout),
            first_byte_timeout: cap(options.first_byte_timeout),
            between_bytes_timeout: cap(options.between_bytes_timeout),
        }
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
pub struct Protected(Arc<std::sync::RwLock<Vec<std::net::SocketAddr>>>);

impl Protected {
    /// Never let a guest reach `addr`.
    pub fn add(&self, addr: std::net::SocketAddr) {
        if let Ok(mut list) = self.0.write() {
            list.push(addr);
        }
    }

    /// Forget `addr` (its listener stopped).
    pub fn remove(&self, addr: std::net::SocketAddr) {
        if let Ok(mut list) = self.0.write() {
            list.retain(|a| *a != addr);
        }
    }

    /// The protected listener `target` would reach, if any.
    pub fn hit(&self, target: std::net::SocketAddr) -> Option<std::net::SocketAddr> {
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
async fn check_not_own(protected: &Protected, uri: &http::Uri) -> Result<(), String> {
    let https = uri.scheme() == Some(&Scheme::HTTPS);
    let host = uri.host().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = uri.port_u16().unwrap_or(default_port(https));
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?;
    for addr in addrs {
        if let Some(own) = protected.hit(addr) {
            return Err(format!(
                "{uri} resolves to {addr}, the host's own admin listener ({own}); no grant reaches it"
            ));
        }
    }
    Ok(())
}

/// The `wasi:http` hooks of one store: the allow-list check and the capped timeouts in front
/// of wasmtime-wasi-http's own client.
pub(crate) struct HttpHooks {
    pub(crate) grant: Arc<HttpGrant>,
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
        let denied = move |request: &http::Request<WasiBody>, why: &str| {
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
            let refused = denied(&request, &why);
            return Box::new(async move { refused });
        }
        tracing::debug!(
            target: "sluice::http",
            method = %request.method(),
            url = %request.uri(),
            "outbound HTTP request"
        );
        let options = self.grant.policy.cap(options);
        let protected = self.grant.protected.clone();
        let span = tracing::Span::current();
        Box::new(async move {
            use http_body_util::BodyExt;
            if let Err(why) = check_not_own(&protected, request.uri()).await {
                return span.in_scope(|| denied(&request, &why));
            }
            let (response, io) =
                wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = Result<(), HttpError>> + Send>,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(entries: &[&str]) -> OutboundHttp {
        OutboundHttp {
            allowed: entries.iter().map(|e| e.parse().unwrap()).collect(),
            timeout: Duration::from_secs(1),
        }
    }

    fn allowed(entries: &[&str], url: &str) -> bool {
        grant(entries).check(&url.parse().unwrap()).is_ok()
    }

    #[test]
    fn exact_entries_match_scheme_host_and_default_port() {
        let list = ["https://api.example.com"];
        assert!(allowed(&list, "https://api.example.com/charge"));
        assert!(allowed(&list, "https://API.example.com:443/"));
        assert!(!allowed(&list, "http://api.example.com/"));
        assert!(!allowed(&list, "https://api.example.com:8443/"));
        assert!(!allowed(&list, "https://evil.com/"));
        assert!(!allowed(&list, "https://api.example.com.evil.com/"));
    }

    #[test]
    fn wildcards_for_scheme_subdomains_and_port() {
        assert!(allowed(&["*://example.com"], "http://example.com/"));
        assert!(allowed(&["*://example.com"], "https://example.com/"));
        assert!(!allowed(&["*://example.com"], "https://example.com:8080/"));
        let subs = ["https://*.example.com"];
        assert!(allowed(&subs, "https://a.example.com/"));
        assert!(allowed(&subs, "https://a.b.example.com/"));
        assert!(!allowed(&subs, "https://example.com/"));
        assert!(!allowed(&subs, "https://badexample.com/"));
        let ports = ["http://127.0.0.1:*"];
        assert!(allowed(&ports, "http://127.0.0.1:1/"));
        assert!(allowed(&ports, "http://127.0.0.1:65535/x?y"));
        assert!(!allowed(&ports, "http://127.0.0.2:80/"));
        assert!(allowed(&["http://*:8080"], "http://anything.io:8080/"));
        assert!(allowed(&["http://[::1]:*"], "http://[::1]:9000/"));
    }

    #[test]
    fn nothing_is_allowed_by_default() {
        let err = OutboundHttp::default()
            .check(&"http://127.0.0.1:80/".parse().unwrap())
            .unwrap_err();
        assert!(err.contains("grants no outbound HTTP"), "{err}");
    }

    #[test]
    fn a_refusal_names_the_target_and_the_list() {
        let err = grant(&["https://a.com"])
            .check(&"http://b.com:81/x".parse().unwrap())
            .unwrap_err();
        assert_eq!(
            err,
            "http://b.com:81 is not on this subscription's allowed_outbound_hosts [https://a.com]"
        );
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        for (entry, says) in [
            ("api.example.com", "no scheme"),
            ("ftp://example.com", "unsupported scheme"),
            ("https://example.com/path", "not a path"),
            ("https://ex*ample.com", "wildcard"),
            ("https://*.", "wildcard"),
            ("https://example.com:http", "not a number"),
            ("https://", "no host"),
            ("http://[::1", "closing"),
        ] {
            let err = entry.parse::<AllowedHost>().unwrap_err();
            assert!(err.contains(says), "{entry}: {err}");
        }
    }

    #[test]
    fn user_information_is_refused() {
        let err = grant(&["http://127.0.0.1:7878"])
            .check(&"http://a@127.0.0.1:7878/".parse().unwrap())
            .unwrap_err();
        assert!(err.contains("user information"), "{err}");
    }

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
        let g = grant(&["http://a.com"]);
        let capped = g.cap(Some(RequestOptions {
            connect_timeout: Some(Duration::from_millis(100)),
            first_byte_timeout: Some(Duration::from_secs(60)),
            between_bytes_timeout: None,
        }));
        assert_eq!(capped.connect_timeout, Some(Duration::from_millis(100)));
        assert_eq!(capped.first_byte_timeout, Some(Duration::from_secs(1)));
        assert_eq!(capped.between_bytes_timeout, Some(Duration::from_secs(1)));
    }
}
