//! The outbound-HTTP allow-list: what `allowed_outbound_hosts` may say, and whether a URL is
//! on it.
//!
//! This is the operator's grammar, so it lives with the configuration; the wasmtime hooks that
//! apply it to each request are in `runtime::http`.
//!
//! An entry is `scheme://host[:port]`:
//! - scheme: `http`, `https`, or `*` for either;
//! - host: a name or IP address (IPv6 in brackets), `*` for any host, or `*.example.com` for
//!   any subdomain of `example.com` (not `example.com` itself);
//! - port: a number or `*`; left out, it is the scheme's default (80 for http, 443 for https).
//!
//! An empty list, the default, grants nothing. A URL with user information
//! (`http://user@host/`) is refused whatever the list says.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::uri::Scheme;

const EXAMPLE: &str = "write scheme://host[:port], e.g. \"https://api.example.com\", \
                       \"http://127.0.0.1:8080\" or \"https://*.example.com:*\"";

/// Why an `allowed_outbound_hosts` entry does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// No `scheme://`.
    #[error("no scheme; {EXAMPLE}")]
    NoScheme,
    /// A scheme other than http, https or `*`.
    #[error("unsupported scheme `{0}` (http, https or *)")]
    Scheme(String),
    /// A path, query, fragment or user part.
    #[error(
        "`{0}` is not allowed: an entry names a scheme, host and port, not a path, query or user; {EXAMPLE}"
    )]
    NotHostPort(char),
    /// `[::1` without `]`.
    #[error("an IPv6 address needs its closing `]`")]
    Ipv6Unclosed,
    /// Something other than `:port` after `]`.
    #[error("unexpected `{0}` after the IPv6 address")]
    AfterIpv6(String),
    /// A `*` anywhere but alone or as the leading label.
    #[error("`{0}`: a wildcard is `*` (any host) or a leading `*.` (any subdomain)")]
    Wildcard(String),
    /// Nothing between `://` and the port.
    #[error("no host; {EXAMPLE}")]
    NoHost,
    /// A port that is not a number or `*`.
    #[error("port `{0}` is not a number from 0 to 65535 or `*`")]
    Port(String),
}

/// Why a request was refused by the allow-list (written to the host's log, counted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// `user@host` in the URL.
    #[error("{0}: user information in a URL (`user@host`) is not allowed")]
    UserInfo(String),
    /// The list is empty.
    #[error("{0}: this subscription grants no outbound HTTP (allowed_outbound_hosts is empty)")]
    NoGrant(String),
    /// The target matches no entry.
    #[error("{target} is not on this subscription's allowed_outbound_hosts [{allowed}]")]
    NotListed {
        /// `scheme://host:port` of the request.
        target: String,
        /// The list, comma-separated.
        allowed: String,
    },
}

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
    type Err = EntryError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (scheme, rest) = text.split_once("://").ok_or(EntryError::NoScheme)?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => SchemePattern::Http,
            "https" => SchemePattern::Https,
            "*" => SchemePattern::Any,
            other => return Err(EntryError::Scheme(other.to_owned())),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if let Some(c) = rest.chars().find(|c| matches!(c, '/' | '?' | '#' | '@')) {
            return Err(EntryError::NotHostPort(c));
        }
        let (host, port) = split_host_port(rest)?;
        Ok(Self {
            scheme,
            host: host_pattern(host)?,
            port: port.map(port_pattern).transpose()?,
            text: text.to_owned(),
        })
    }
}

/// `host[:port]` or `[v6][:port]`, the host in lower case (IPv6 kept in brackets).
fn split_host_port(rest: &str) -> Result<(String, Option<&str>), EntryError> {
    if let Some(v6) = rest.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or(EntryError::Ipv6Unclosed)?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| EntryError::AfterIpv6(p.to_owned()))?,
            ),
        };
        return Ok((format!("[{}]", addr.to_ascii_lowercase()), port));
    }
    Ok(match rest.rsplit_once(':') {
        Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
        None => (rest.to_ascii_lowercase(), None),
    })
}

fn host_pattern(host: String) -> Result<HostPattern, EntryError> {
    if host == "*" {
        return Ok(HostPattern::Any);
    }
    if let Some(domain) = host.strip_prefix("*.") {
        if domain.is_empty() || domain.contains('*') {
            return Err(EntryError::Wildcard(host));
        }
        return Ok(HostPattern::Subdomains(format!(".{domain}")));
    }
    if host.is_empty() {
        return Err(EntryError::NoHost);
    }
    if host.contains('*') {
        return Err(EntryError::Wildcard(host));
    }
    Ok(HostPattern::Exact(host))
}

fn port_pattern(port: &str) -> Result<PortPattern, EntryError> {
    match port {
        "*" => Ok(PortPattern::Any),
        p => p
            .parse()
            .map(PortPattern::Exact)
            .map_err(|_| EntryError::Port(p.to_owned())),
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

/// The port a URL without one goes to.
pub fn default_port(https: bool) -> u16 {
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
    /// The header each request carries its idempotency key in (see `runtime/effects.rs`);
    /// `None` sends none.
    pub idempotency_header: Option<http::HeaderName>,
    /// `effects = "journal"`: what is recorded of the calls (see `runtime/journal.rs`).
    pub journal: Option<JournalPolicy>,
}

/// What the journal of outbound calls records, and the bounds on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalPolicy {
    /// The response statuses that are recorded (a call that got another stays live on the
    /// next attempt), as inclusive ranges.
    pub statuses: Vec<(u16, u16)>,
    /// The largest response (body and headers) one call records.
    pub max_response_bytes: u64,
    /// The most one entry's journal holds, in bytes.
    pub max_entry_bytes: u64,
    /// The most calls one entry's journal holds.
    pub max_calls: u32,
}

impl Default for JournalPolicy {
    fn default() -> Self {
        Self {
            statuses: vec![(200, 299)],
            max_response_bytes: 256 * 1024,
            max_entry_bytes: 4 * 1024 * 1024,
            max_calls: 64,
        }
    }
}

impl JournalPolicy {
    /// Whether a response with `status` is recorded.
    pub fn records(&self, status: u16) -> bool {
        self.statuses
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&status))
    }
}

/// One `journal_statuses` entry: `"2xx"` (a class) or `"409"` (one status).
pub fn parse_status(text: &str) -> Option<(u16, u16)> {
    if let Some(class) = text.strip_suffix("xx") {
        let class: u16 = class.parse().ok().filter(|c| (1..=5).contains(c))?;
        return Some((class * 100, class * 100 + 99));
    }
    let status: u16 = text.parse().ok().filter(|s| (100..=599).contains(s))?;
    Some((status, status))
}

/// The header idempotency keys go in unless configured otherwise: the name the IETF draft and
/// most payment APIs use.
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "idempotency-key";

impl Default for OutboundHttp {
    fn default() -> Self {
        Self {
            allowed: Vec::new(),
            timeout: super::DEFAULT_HANDLER_TIMEOUT,
            idempotency_header: Some(http::HeaderName::from_static(DEFAULT_IDEMPOTENCY_HEADER)),
            journal: None,
        }
    }
}

impl OutboundHttp {
    /// Whether `uri` may be requested; on refusal, why (for the log line).
    pub fn check(&self, uri: &http::Uri) -> Result<(), Denied> {
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(Denied::UserInfo(uri.to_string()));
        }
        let scheme = uri.scheme().cloned().unwrap_or(Scheme::HTTPS);
        let https = scheme == Scheme::HTTPS;
        let host = uri.host().unwrap_or_default().to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(default_port(https));
        let target = format!("{scheme}://{host}:{port}");
        if self.allowed.is_empty() {
            return Err(Denied::NoGrant(target));
        }
        if self.allowed.iter().any(|a| a.allows(&scheme, &host, port)) {
            return Ok(());
        }
        let allowed: Vec<&str> = self.allowed.iter().map(|a| a.text.as_str()).collect();
        Err(Denied::NotListed {
            target,
            allowed: allowed.join(", "),
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
            ..OutboundHttp::default()
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
        assert!(err.to_string().contains("grants no outbound HTTP"), "{err}");
    }

    #[test]
    fn a_refusal_names_the_target_and_the_list() {
        let err = grant(&["https://a.com"])
            .check(&"http://b.com:81/x".parse().unwrap())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
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
            assert!(err.to_string().contains(says), "{entry}: {err}");
        }
    }

    #[test]
    fn user_information_is_refused() {
        let err = grant(&["http://127.0.0.1:7878"])
            .check(&"http://a@127.0.0.1:7878/".parse().unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("user information"), "{err}");
    }
}
