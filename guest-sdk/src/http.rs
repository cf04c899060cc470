//! Outbound HTTP from a handler, through the host's `wasi:http` outgoing handler.
//!
//! A handler can only reach the hosts its subscription grants with `allowed_outbound_hosts`
//! in the operator's config; any other request fails with [`ErrorKind::Denied`] before a
//! connection is attempted. Every request is bounded in time by the subscription's
//! `http_timeout`; [`Request::timeout`] can ask for less.
//!
//! ```ignore
//! use sluice_guest::http::Request;
//!
//! let response = Request::post("https://gateway.example.com/charge")
//!     .json(&payment)
//!     .timeout(Duration::from_secs(2))
//!     .send()
//!     .await?;
//! if response.status() == 200 { /* charged */ }
//! ```
//!
//! `send` is a real future: every wait for the other side (the response, its body bytes) is a
//! `wasi:io` pollable handed to `wstd`'s reactor, so while a request waits the handler is suspended in
//! the host's `poll`, not spinning, and requests joined together (`futures::join!`,
//! `futures_lite::future::zip`) are in flight at the same time. The requests themselves are
//! `wasi:http` calls through the `wasip2` bindings, which keeps the host's error codes (denied,
//! timeouts, connect) typed all the way to [`ErrorKind`]. The request body is handed to the host
//! before the wait starts (the host buffers it; a body of megabytes holds the handler meanwhile).

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::streams::{InputStream, StreamError};
use wstd::runtime::AsyncPollable;

/// Largest chunk `blocking-write-and-flush` accepts.
const WRITE_CHUNK: usize = 4096;
/// How much to ask for per read of the response body.
const READ_CHUNK: u64 = 64 * 1024;

/// An HTTP request, built up and then [sent](Request::send).
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    timeout: Option<Duration>,
    /// A body that failed to serialize: reported by `send`, so building stays chainable.
    body_error: Option<String>,
}

impl Request {
    /// A request with any method (`"GET"`, `"PATCH"`, ...).
    pub fn new(method: &str, url: impl Into<String>) -> Self {
        Self {
            method: method.to_ascii_uppercase(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
            body_error: None,
        }
    }

    /// A GET request.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new("GET", url)
    }

    /// A POST request.
    pub fn post(url: impl Into<String>) -> Self {
        Self::new("POST", url)
    }

    /// A PUT request.
    pub fn put(url: impl Into<String>) -> Self {
        Self::new("PUT", url)
    }

    /// A DELETE request.
    pub fn delete(url: impl Into<String>) -> Self {
        Self::new("DELETE", url)
    }

    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Set a JSON body and its `content-type`.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => self.body = body,
            Err(err) => self.body_error = Some(err.to_string()),
        }
        self.header("content-type", "application/json")
    }

    /// Wait at most this long to connect, for the response to start, and between body chunks
    /// (the host caps it at the subscription's `http_timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Send the request and read the whole response. The handler is suspended while it
    /// waits, so other futures it joined with this one make progress meanwhile.
    pub async fn send(self) -> Result<Response, Error> {
        let fail = |kind: ErrorKind| Error {
            method: self.method.clone(),
            url: self.url.clone(),
            kind,
        };
        if let Some(err) = &self.body_error {
            return Err(fail(ErrorKind::InvalidRequest(format!(
                "the JSON body does not serialize: {err}"
            ))));
        }
        #[cfg(not(target_arch = "wasm32"))]
        return Err(fail(ErrorKind::Other(
            "no HTTP in a native unit test (there is no host): `sluice test` runs the component with its grants".into(),
        )));
        #[cfg_attr(not(target_arch = "wasm32"), allow(unreachable_code))]
        let request = self
            .build()
            .map_err(|e| fail(ErrorKind::InvalidRequest(e)))?;
        let body = request
            .body()
            .map_err(|()| fail(ErrorKind::InvalidRequest("the body was taken twice".into())))?;
        let options = self.timeout.map(|t| {
            let nanos = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
            let options = RequestOptions::new();
            // The host refuses none of these; a refusal would only keep the host's default.
            let _ = options.set_connect_timeout(Some(nanos));
            let _ = options.set_first_byte_timeout(Some(nanos));
            let _ = options.set_between_bytes_timeout(Some(nanos));
            options
        });
        let pending = outgoing_handler::handle(request, options).map_err(|e| fail(e.into()))?;
        // A failed write usually means the request itself failed (denied, refused, timed
        // out) or the server answered early: the response says which, so it wins.
        let written = write_body(body, &self.body);
        let response = loop {
            match pending.get() {
                Some(result) => break result,
                None => AsyncPollable::new(pending.subscribe()).wait_for().await,
            }
        };
        let response = response
            .map_err(|()| fail(ErrorKind::Other("the response was taken twice".into())))?
            .map_err(|e| fail(e.into()))?;
        if let Err(err) = written
            && !(400..600).contains(&response.status())
        {
            return Err(fail(err));
        }
        let status = response.status();
        let headers = response.headers().entries();
        let body = response
            .consume()
            .map_err(|()| fail(ErrorKind::Other("the body was taken twice".into())))?;
        let body = read_body(body).await.map_err(fail)?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    fn build(&self) -> Result<OutgoingRequest, String> {
        let uri: ::http::Uri = self
            .url
            .parse()
            .map_err(|e| format!("not a valid URL: {e}"))?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            Some(other) => return Err(format!("unsupported scheme `{other}`")),
            None => return Err("the URL has no scheme (http:// or https://)".into()),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| "the URL has no host".to_owned())?;
        let mut headers = self.headers.clone();
        // The body is known whole: say its length, so it is not sent chunked (simple servers,
        // Python's http.server among them, read a chunked body as empty).
        let has_length = headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
        if !has_length && (!self.body.is_empty() || !matches!(self.method.as_str(), "GET" | "HEAD"))
        {
            headers.push((
                "content-length".into(),
                self.body.len().to_string().into_bytes(),
            ));
        }
        let headers =
            Fields::from_list(&headers).map_err(|e| format!("bad or forbidden header: {e:?}"))?;
        let request = OutgoingRequest::new(headers);
        let method = match self.method.as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_owned()),
        };
        request
            .set_method(&method)
            .map_err(|()| format!("invalid method {}", self.method))?;
        request
            .set_scheme(Some(&scheme))
            .map_err(|()| "invalid scheme".to_owned())?;
        request
            .set_authority(Some(authority.as_str()))
            .map_err(|()| format!("invalid host `{authority}`"))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        request
            .set_path_with_query(Some(path))
            .map_err(|()| format!("invalid path `{path}`"))?;
        Ok(request)
    }
}

fn write_body(body: OutgoingBody, bytes: &[u8]) -> Result<(), ErrorKind> {
    let stream = body
        .write()
        .map_err(|()| ErrorKind::Other("the body stream was taken twice".into()))?;
    for chunk in bytes.chunks(WRITE_CHUNK) {
        stream
            .blocking_write_and_flush(chunk)
            .map_err(stream_error)?;
    }
    drop(stream);
    OutgoingBody::finish(body, None).map_err(ErrorKind::from)
}

async fn read_body(body: IncomingBody) -> Result<Vec<u8>, ErrorKind> {
    let stream = body
        .stream()
        .map_err(|()| ErrorKind::Other("the body stream was taken twice".into()))?;
    let bytes = read_all(&stream).await?;
    drop(stream);
    let _trailers = IncomingBody::finish(body);
    Ok(bytes)
}

/// Read a stream to its end, suspending (not blocking) while no bytes are ready.
async fn read_all(stream: &InputStream) -> Result<Vec<u8>, ErrorKind> {
    let mut bytes = Vec::new();
    let mut ready: Option<AsyncPollable> = None;
    loop {
        match stream.read(READ_CHUNK) {
            Ok(chunk) if chunk.is_empty() => {
                ready
                    .get_or_insert_with(|| AsyncPollable::new(stream.subscribe()))
                    .wait_for()
                    .await
            }
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => return Ok(bytes),
            Err(err) => return Err(stream_error(err)),
        }
    }
}

fn stream_error(err: StreamError) -> ErrorKind {
    match err {
        StreamError::Closed => ErrorKind::Other("the connection closed early".into()),
        StreamError::LastOperationFailed(io) => match wasip2::http::types::http_error_code(&io) {
            Some(code) => code.into(),
            None => ErrorKind::Other(io.to_debug_string()),
        },
    }
}

/// A whole HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl Response {
    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of a header (names compare case-insensitively), if it is UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body decoded from JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// Why a request failed, with the request it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The method.
    pub method: String,
    /// The URL.
    pub url: String,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl Error {
    /// Whether the host refused the request: its target is not on the subscription's
    /// `allowed_outbound_hosts`. Retrying will not help.
    pub fn is_denied(&self) -> bool {
        self.kind == ErrorKind::Denied
    }

    /// Whether a timeout cut the request short: connecting, waiting for the response, or
    /// reading it. The other side may still have acted on it.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }
}

/// What went wrong with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The host refused it: not on `allowed_outbound_hosts`.
    Denied,
    /// A timeout.
    Timeout,
    /// No connection could be made (refused, unreachable, DNS).
    Connect(String),
    /// The request could not be built (bad URL, header or body).
    InvalidRequest(String),
    /// Anything else the host reported.
    Other(String),
}

/// An error code in words, as a log line or a dead letter's reason reads it: `connection
/// refused`, not `ErrorCode::ConnectionRefused` (details, when the code has any, follow).
fn plain(code: &ErrorCode) -> String {
    let debug = format!("{code:?}");
    let debug = debug.trim_start_matches("ErrorCode::");
    let name_len = debug
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(debug.len());
    let (name, details) = debug.split_at(name_len);
    let mut words = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_lowercase());
    }
    words + details
}

impl From<ErrorCode> for ErrorKind {
    fn from(code: ErrorCode) -> Self {
        match code {
            ErrorCode::HttpRequestDenied => Self::Denied,
            ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout
            | ErrorCode::DnsTimeout => Self::Timeout,
            ErrorCode::ConnectionRefused
            | ErrorCode::DestinationNotFound
            | ErrorCode::DestinationUnavailable
            | ErrorCode::DestinationIpProhibited
            | ErrorCode::DestinationIpUnroutable
            | ErrorCode::DnsError(_) => Self::Connect(plain(&code)),
            ErrorCode::HttpRequestUriInvalid | ErrorCode::HttpRequestMethodInvalid => {
                Self::InvalidRequest(plain(&code))
            }
            other => Self::Other(plain(&other)),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {} {}: ", self.method, self.url)?;
        match &self.kind {
            ErrorKind::Denied => f.write_str(
                "denied by the host: the target is not on this subscription's allowed_outbound_hosts",
            ),
            ErrorKind::Timeout => f.write_str("timed out"),
            ErrorKind::Connect(why) => write!(f, "cannot connect ({why})"),
            ErrorKind::InvalidRequest(why) => write!(f, "invalid request: {why}"),
            ErrorKind::Other(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}
