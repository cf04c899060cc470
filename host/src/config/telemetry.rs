//! The `[telemetry]` table: where traces go (OTLP over HTTP/protobuf or gRPC), with which
//! credentials, sampled how, and the link template the page and the CLI turn a trace id into.
//! Everything is checked here, with the bounds that keep a config from making the exporter
//! (or the page) do something unbounded or unsafe.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, PrivateFileError, read_private};

/// The most headers the headers file may hold (API keys, tenant ids).
pub const MAX_HEADERS: usize = 32;
/// The most resource attributes.
pub const MAX_RESOURCE: usize = 64;
/// The longest resource attribute value, and header value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;

/// `[telemetry]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    endpoint: Option<String>,
    protocol: Option<String>,
    headers_file: Option<PathBuf>,
    service_name: Option<String>,
    sampling_ratio: Option<f64>,
    #[serde(default)]
    resource: BTreeMap<String, String>,
    trace_url: Option<String>,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`/v1/traces`).
    HttpProtobuf,
    /// OTLP/gRPC.
    Grpc,
    /// One line per span on standard error: a look at traces on a developer's machine with no
    /// collector (`sluice dev --traces`).
    Console,
}

/// The checked `[telemetry]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Telemetry {
    /// The collector; `None` leaves it to `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`.
    pub endpoint: Option<String>,
    /// How to reach it.
    pub protocol: Protocol,
    /// Headers sent with every export (from a private file: they are credentials).
    pub headers: Vec<(String, String)>,
    /// `service.name`.
    pub service_name: String,
    /// The share of new traces recorded, in millionths (a producer's sampled flag is
    /// followed).
    pub sampling_per_million: u32,
    /// Further resource attributes.
    pub resource: Vec<(String, String)>,
    /// A link template with `{trace_id}`, for the page and the CLI.
    pub trace_url: Option<String>,
}

impl Telemetry {
    /// Every span of every entry on standard error, and nothing sent anywhere: what
    /// `sluice dev --traces` uses when the config names no collector.
    pub fn console() -> Self {
        Self {
            endpoint: None,
            protocol: Protocol::Console,
            headers: Vec::new(),
            service_name: "sluice".to_owned(),
            sampling_per_million: 1_000_000,
            resource: Vec::new(),
            trace_url: None,
        }
    }
}

/// The table's keys, for the configuration reference.
pub const KEYS: &[&str] = &[
    "endpoint",
    "protocol",
    "headers_file",
    "service_name",
    "sampling_ratio",
    "resource",
    "trace_url",
];

impl RawTelemetry {
    /// Check every value; `base` is the config file's directory (for `headers_file`).
    pub(super) fn check(&self, path: &Path, base: &Path) -> Result<Telemetry, ConfigError> {
        let invalid = |key: &str, value: &str, reason: &str| invalid(path, key, value, reason);
        self.check_endpoint(&invalid)?;
        let protocol = self.protocol(&invalid)?;
        let headers = self.headers(base, &invalid)?;
        let sampling_ratio = self.sampling_ratio(&invalid)?;
        self.check_resource(&invalid)?;
        self.check_trace_url(&invalid)?;
        let service_name = self.service_name(&invalid)?;
        Ok(Telemetry {
            endpoint: self.endpoint.clone(),
            protocol,
            headers,
            service_name,
            sampling_per_million: (sampling_ratio * 1e6).round() as u32,
            resource: self
                .resource
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            trace_url: self.trace_url.clone(),
        })
    }

    /// `endpoint`: an http:// or https:// URL with a host.
    fn check_endpoint(&self, invalid: &Invalid<'_>) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            let uri: http::Uri = endpoint
                .parse()
                .map_err(|e| invalid("endpoint", endpoint, &format!("not a URL: {e}")))?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                return Err(invalid(
                    "endpoint",
                    endpoint,
                    "write an http:// or https:// URL with a host",
                ));
            }
        }
        Ok(())
    }

    /// `protocol`: `http/protobuf` (the default) or `grpc`.
    fn protocol(&self, invalid: &Invalid<'_>) -> Result<Protocol, ConfigError> {
        match self.protocol.as_deref() {
            None | Some("http/protobuf") => Ok(Protocol::HttpProtobuf),
            Some("grpc") => Ok(Protocol::Grpc),
            Some("console") if self.endpoint.is_some() => Err(invalid(
                "protocol",
                "console",
                "the console writes spans to standard error: remove `endpoint`, or pick \"http/protobuf\" or \"grpc\" to send them there",
            )),
            Some("console") => Ok(Protocol::Console),
            Some(other) => Err(invalid(
                "protocol",
                other,
                "write \"http/protobuf\", \"grpc\" or \"console\"",
            )),
        }
    }

    /// `headers_file`: a private file (its headers are credentials) of `name=value` lines.
    fn headers(
        &self,
        base: &Path,
        invalid: &Invalid<'_>,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        let Some(file) = &self.headers_file else {
            return Ok(Vec::new());
        };
        let file = base.join(file);
        let shown = file.display().to_string();
        let text = read_private(&file).map_err(|e| {
            let why = match e {
                PrivateFileError::Io(err) => err.to_string(),
                PrivateFileError::WorldReadable => {
                    "every user of the machine can read it: chmod 600 it".to_owned()
                }
            };
            invalid("headers_file", &shown, &why)
        })?;
        parse_headers(&text).map_err(|why| invalid("headers_file", &shown, &why))
    }

    /// `sampling_ratio`: from 0 to 1 (the default).
    fn sampling_ratio(&self, invalid: &Invalid<'_>) -> Result<f64, ConfigError> {
        let sampling_ratio = self.sampling_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sampling_ratio) {
            return Err(invalid(
                "sampling_ratio",
                &sampling_ratio.to_string(),
                "write a number from 0 to 1",
            ));
        }
        Ok(sampling_ratio)
    }

    /// `resource`: at most [`MAX_RESOURCE`] attributes, each key and value bounded.
    fn check_resource(&self, invalid: &Invalid<'_>) -> Result<(), ConfigError> {
        if self.resource.len() > MAX_RESOURCE {
            return Err(invalid(
                "resource",
                &format!("{} attributes", self.resource.len()),
                &format!("at most {MAX_RESOURCE}"),
            ));
        }
        for (key, value) in &self.resource {
            if key.is_empty() || key.len() > 255 || value.len() > MAX_VALUE_BYTES {
                return Err(invalid(
                    "resource",
                    key,
                    &format!("a key of 1 to 255 bytes, a value of at most {MAX_VALUE_BYTES}"),
                ));
            }
        }
        Ok(())
    }

    /// `trace_url`: an http(s) URL with `{trace_id}` in it (the page links to it).
    fn check_trace_url(&self, invalid: &Invalid<'_>) -> Result<(), ConfigError> {
        if let Some(template) = &self.trace_url {
            let web = template.starts_with("https://") || template.starts_with("http://");
            if !web || !template.contains("{trace_id}") {
                return Err(invalid(
                    "trace_url",
                    template,
                    "write an http(s) URL with {trace_id} where the trace id goes",
                ));
            }
        }
        Ok(())
    }

    /// `service_name`: 1 to 255 bytes, `sluice` when not set.
    fn service_name(&self, invalid: &Invalid<'_>) -> Result<String, ConfigError> {
        let service_name = self
            .service_name
            .clone()
            .unwrap_or_else(|| "sluice".to_owned());
        if service_name.is_empty() || service_name.len() > 255 {
            return Err(invalid("service_name", &service_name, "1 to 255 bytes"));
        }
        Ok(service_name)
    }
}

/// What each step calls to refuse a value: [`invalid`] with the file's path already given.
type Invalid<'a> = dyn Fn(&str, &str, &str) -> ConfigError + 'a;

/// The error for `telemetry.<key>` = `value` in the file at `path`: the value is cut to 200
/// characters, since it may be a long line of a headers file.
fn invalid(path: &Path, key: &str, value: &str, reason: &str) -> ConfigError {
    ConfigError::Value {
        path: path.to_owned(),
        key: format!("telemetry.{key}"),
        value: value.chars().take(200).collect(),
        reason: reason.to_owned(),
    }
}

/// `name=value` lines (blank lines and `#` comments skipped); names as HTTP allows them.
fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {}: write name=value", n + 1));
        };
        let (name, value) = (name.trim(), value.trim());
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_str(value).is_err()
            || value.len() > MAX_VALUE_BYTES
        {
            return Err(format!(
                "line {}: not a valid header (a name, and a value of at most {MAX_VALUE_BYTES} visible bytes)",
                n + 1
            ));
        }
        headers.push((name.to_ascii_lowercase(), value.to_owned()));
        if headers.len() > MAX_HEADERS {
            return Err(format!("more than {MAX_HEADERS} headers"));
        }
    }
    Ok(headers)
}

impl Telemetry {
    /// The share of new traces recorded, from 0 to 1.
    pub fn sampling_ratio(&self) -> f64 {
        f64::from(self.sampling_per_million) / 1e6
    }

    /// The link for `trace_id`, when a template is set and the id is a trace id (32 lowercase
    /// hex digits, not all zero): nothing else ever enters the URL.
    pub fn link(&self, trace_id: &str) -> Option<String> {
        let valid = trace_id.len() == 32
            && trace_id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && trace_id.bytes().any(|b| b != b'0');
        self.trace_url
            .as_ref()
            .filter(|_| valid)
            .map(|t| t.replace("{trace_id}", trace_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: RawTelemetry) -> Result<Telemetry, ConfigError> {
        raw.check(Path::new("sluice.toml"), Path::new("."))
    }

    #[test]
    fn values_are_checked_and_bounded() {
        let ok = check(RawTelemetry {
            endpoint: Some("http://127.0.0.1:4318".into()),
            trace_url: Some("https://traces.example/t/{trace_id}".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ok.protocol, Protocol::HttpProtobuf);
        assert_eq!(ok.service_name, "sluice");
        assert_eq!(ok.sampling_ratio(), 1.0);
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            ok.link(id).as_deref(),
            Some("https://traces.example/t/4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "javascript:alert(1)",
            "\"><script>",
            &"0".repeat(32),
            "ABCD",
        ] {
            assert_eq!(ok.link(bad), None, "{bad}");
        }
        for raw in [
            RawTelemetry {
                endpoint: Some("file:///etc/passwd".into()),
                ..Default::default()
            },
            RawTelemetry {
                protocol: Some("udp".into()),
                ..Default::default()
            },
            RawTelemetry {
                sampling_ratio: Some(1.5),
                ..Default::default()
            },
            RawTelemetry {
                trace_url: Some("javascript:{trace_id}".into()),
                ..Default::default()
            },
        ] {
            assert!(check(raw).is_err());
        }
        assert!(parse_headers("authorization=Bearer x\n# comment\n\nx-tenant = 7\n").is_ok());
        assert!(parse_headers("bad header=1").is_err());
        assert!(parse_headers("x=a\u{7}b").is_err());
        assert!(parse_headers(&"x=1\n".repeat(MAX_HEADERS + 1)).is_err());
    }
}
