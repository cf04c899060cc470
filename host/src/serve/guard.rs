//! The admin server's defences, apart from the routes they guard: which `Host` it answers to,
//! what a browser may not send it, how large a declared body may be, and token comparison
//! (how many connections, and for how long, is `connections.rs`).

use std::net::SocketAddr;

use axum::http::{HeaderMap, StatusCode, header};

type Refusal = (StatusCode, String);

/// The host part of a `Host` header or an origin's authority, lower case, brackets kept for
/// IPv6, port removed.
fn host_part(authority: &str) -> String {
    let authority = authority.trim().to_ascii_lowercase();
    if authority.starts_with('[') {
        return authority
            .split_once(']')
            .map_or(authority.clone(), |(h, _)| format!("{h}]"));
    }
    authority
        .rsplit_once(':')
        .map_or(authority.clone(), |(h, _)| h.to_owned())
}

/// Whether `authority` names this server: the bound address, or a loopback name when it binds
/// loopback or every interface.
fn names_this_server(authority: &str, bound: SocketAddr) -> bool {
    let host = host_part(authority);
    let bound_ip = bound.ip();
    let ip_host = match bound_ip {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    };
    if host == ip_host {
        return true;
    }
    let loopback_name = matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]");
    if loopback_name && (bound_ip.is_loopback() || bound_ip.is_unspecified()) {
        return true;
    }
    // Bound to every interface: any address literal reaches it, but no DNS name does (a
    // name an attacker controls could point anywhere).
    bound_ip.is_unspecified()
        && (host.parse::<std::net::Ipv4Addr>().is_ok()
            || host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok()))
}

/// Refuse a request whose `Host` is not this server (a DNS-rebinding page).
pub(super) fn host_allowed(headers: &HeaderMap, bound: SocketAddr) -> Result<(), Refusal> {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if names_this_server(host, bound) {
        return Ok(());
    }
    tracing::warn!(host, "admin request refused: Host is not this server");
    Err((
        StatusCode::MISDIRECTED_REQUEST,
        format!("Host `{host}` is not this admin server ({bound})\n"),
    ))
}

/// The port of an origin's authority: written, or its scheme's default.
fn origin_port(scheme: &str, authority: &str) -> Option<u16> {
    let after_host = match authority.rfind(']') {
        Some(end) => &authority[end + 1..],
        None => authority,
    };
    match after_host.rsplit_once(':') {
        Some((_, port)) => port.parse().ok(),
        None => match scheme {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        },
    }
}

/// How long a wrong token or login waits before it is answered; wrong ones wait one after
/// another, so guesses go at about one a second however many connections make them.
pub(super) const FAILURE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
/// At most one log line per this long about refused tokens, with how many there were.
const FAILURE_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Wrong tokens and logins, answered slowly and logged sparingly.
#[derive(Default)]
pub(super) struct Throttle {
    turn: tokio::sync::Mutex<()>,
    log: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl Throttle {
    /// A wrong token for `what`: wait this refusal's turn, then log (at most every
    /// [`FAILURE_LOG_EVERY`], counting the rest).
    pub(super) async fn refused(&self, what: &str) {
        let turn = self.turn.lock().await;
        tokio::time::sleep(FAILURE_DELAY).await;
        drop(turn);
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        log.1 += 1;
        let due = log.0.is_none_or(|at| at.elapsed() >= FAILURE_LOG_EVERY);
        if due {
            tracing::warn!(
                what,
                refused = log.1,
                "admin: wrong or missing token (refusals since the last such line)"
            );
            *log = (Some(std::time::Instant::now()), 0);
        }
    }
}

/// Refuse what a browser marks as coming from another site (CSRF).
pub(super) fn not_cross_site(headers: &HeaderMap, bound: SocketAddr) -> Result<(), Refusal> {
    let fetch_site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none");
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let foreign_origin = origin.is_some_and(|origin| {
        let (scheme, authority) = origin.split_once("://").unwrap_or(("", origin));
        let authority = authority.trim_end_matches('/');
        // Another server on the same host name is another site: the port must be ours.
        origin == "null"
            || !names_this_server(authority, bound)
            || origin_port(scheme, authority) != Some(bound.port())
    });
    if foreign_origin || matches!(fetch_site, "cross-site" | "same-site") {
        tracing::warn!(
            origin = origin.unwrap_or("-"),
            fetch_site,
            "admin request refused: cross-site browser request"
        );
        return Err((
            StatusCode::FORBIDDEN,
            "cross-site requests to the admin API are refused\n".to_owned(),
        ));
    }
    Ok(())
}

/// Refuse a declared body over `max` before any of it is read.
pub(super) fn declared_size(headers: &HeaderMap, max: usize) -> Result<(), Refusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(len) if len > max as u64 => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body declares {len} bytes; admin_max_upload is {max}\n"),
        )),
        _ => Ok(()),
    }
}

/// Compare a presented token with the configured one without leaking, through timing, how
/// much of it matched.
pub(super) fn same_secret(given: &str, token: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    given.as_bytes().ct_eq(token.as_bytes()).into()
}

/// The bearer token a request carries, if any.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn host_must_name_this_server() {
        let bound: SocketAddr = "127.0.0.1:9187".parse().unwrap();
        for ok in [
            "127.0.0.1:9187",
            "localhost:9187",
            "[::1]:9187",
            "LOCALHOST",
        ] {
            assert!(
                host_allowed(&headers(&[("host", ok)]), bound).is_ok(),
                "{ok}"
            );
        }
        for bad in ["evil.example:9187", "attacker.com", "10.0.0.1:9187", ""] {
            assert!(
                host_allowed(&headers(&[("host", bad)]), bound).is_err(),
                "{bad}"
            );
        }
        let everywhere: SocketAddr = "0.0.0.0:9187".parse().unwrap();
        assert!(host_allowed(&headers(&[("host", "10.0.0.1:9187")]), everywhere).is_ok());
        assert!(host_allowed(&headers(&[("host", "rebind.evil:9187")]), everywhere).is_err());
    }

    #[test]
    fn cross_site_browser_requests_are_refused() {
        let bound: SocketAddr = "127.0.0.1:9187".parse().unwrap();
        assert!(not_cross_site(&headers(&[]), bound).is_ok());
        assert!(not_cross_site(&headers(&[("origin", "http://127.0.0.1:9187")]), bound).is_ok());
        assert!(not_cross_site(&headers(&[("origin", "https://evil.example")]), bound).is_err());
        assert!(not_cross_site(&headers(&[("origin", "null")]), bound).is_err());
        assert!(not_cross_site(&headers(&[("sec-fetch-site", "cross-site")]), bound).is_err());
    }

    #[test]
    fn declared_sizes_over_the_cap_are_refused() {
        assert!(declared_size(&headers(&[("content-length", "100")]), 100).is_ok());
        assert_eq!(
            declared_size(&headers(&[("content-length", "62914560")]), 100)
                .unwrap_err()
                .0,
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("ab", "abc"));
        assert!(!same_secret("abd", "abc"));
    }
}
