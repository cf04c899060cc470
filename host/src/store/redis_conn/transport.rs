//! How a lean read connection reaches its node: plain TCP, TLS over TCP, or a Unix socket.
//!
//! The lean reader ([`super::lean`]) frames replies itself so that it can drop a value over a
//! subscription's `max_entry_bytes` as it arrives; for that it needs the byte stream, which
//! redis-rs keeps inside its connections. So every transport the host accepts is opened here:
//! TLS with rustls (the TLS stack redis-rs uses here too), trusting the configured CA
//! (`redis_ca_file`) or else the system's roots, and presenting the configured client
//! certificate (`redis_cert_file`) when there is one. Hostname verification is never turned
//! off: a `#insecure` URL is refused, as redis-rs refuses it in this build.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::{ConnectionAddr, ErrorKind, RedisError, TlsCertificates};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_util::either::Either;

/// A connected byte stream to one Redis node.
pub type Io = Either<TcpStream, Either<Box<TlsStream<TcpStream>>, UnixStream>>;

/// Where one node is, as the lean reader connects to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Plain TCP.
    Tcp(String, u16),
    /// TLS over TCP, the certificate verified for `host`.
    Tls(String, u16),
    /// A Unix socket.
    Unix(PathBuf),
}

impl Endpoint {
    /// The endpoint of a redis-rs address; an error for one this build cannot reach (an
    /// `#insecure` TLS address, or a kind added to redis-rs later).
    pub fn of(addr: &ConnectionAddr) -> Result<Self, RedisError> {
        match addr {
            ConnectionAddr::Tcp(host, port) => Ok(Self::Tcp(host.clone(), *port)),
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                ..
            } => Ok(Self::Tls(host.clone(), *port)),
            ConnectionAddr::Unix(path) => Ok(Self::Unix(path.clone())),
            other => Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "the read connections cannot reach this address (TLS without hostname verification, #insecure, is not supported)",
                other.to_string(),
            ))),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(host, port) if host.contains(':') => write!(f, "redis://[{host}]:{port}"),
            Self::Tcp(host, port) => write!(f, "redis://{host}:{port}"),
            Self::Tls(host, port) if host.contains(':') => write!(f, "rediss://[{host}]:{port}"),
            Self::Tls(host, port) => write!(f, "rediss://{host}:{port}"),
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

/// The TLS files a handle was configured with, and the rustls configuration made from them
/// at the first TLS connection (kept: the system roots are read once, not per connection).
#[derive(Default)]
pub struct Tls {
    certs: Option<TlsCertificates>,
    config: OnceLock<Arc<ClientConfig>>,
}

impl Tls {
    /// TLS as `certs` say (`None`: trust the system's roots, present no certificate).
    pub fn new(certs: Option<TlsCertificates>) -> Self {
        Self {
            certs,
            config: OnceLock::new(),
        }
    }

    fn config(&self) -> Result<Arc<ClientConfig>, RedisError> {
        if let Some(config) = self.config.get() {
            return Ok(config.clone());
        }
        let made = Arc::new(client_config(self.certs.as_ref())?);
        Ok(self.config.get_or_init(|| made).clone())
    }
}

fn tls_error(what: &str, detail: impl std::fmt::Display) -> RedisError {
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "TLS setup failed",
        format!("{what}: {detail}"),
    ))
}

/// A rustls client configuration: the CA of `certs` (else the system's roots) and its client
/// certificate, if any.
fn client_config(certs: Option<&TlsCertificates>) -> Result<ClientConfig, RedisError> {
    let mut roots = RootCertStore::empty();
    match certs.and_then(|c| c.root_cert.as_deref()) {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| tls_error("the Redis CA file", e))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_error("the Redis CA file", e))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty()
                && let Some(err) = found.errors.first()
            {
                return Err(tls_error("the system's CA certificates", err));
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    match certs.and_then(|c| c.client_tls.as_ref()) {
        Some(client) => {
            let chain = CertificateDer::pem_slice_iter(&client.client_cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls_error("the Redis client certificate", e))?;
            let key = PrivateKeyDer::from_pem_slice(&client.client_key)
                .map_err(|e| tls_error("the Redis client key", e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_error("the Redis client certificate and key", e))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

/// Connect to `endpoint` (TLS as `tls` says), all of it within `timeout`.
pub async fn connect(endpoint: &Endpoint, tls: &Tls, timeout: Duration) -> Result<Io, RedisError> {
    let open = async {
        Ok(match endpoint {
            Endpoint::Tcp(host, port) => Either::Left(tcp(host, *port).await?),
            Endpoint::Tls(host, port) => {
                let name = ServerName::try_from(host.clone())
                    .map_err(|e| tls_error(&format!("the server name {host:?}"), e))?;
                let tcp = tcp(host, *port).await?;
                let stream = tokio_rustls::TlsConnector::from(tls.config()?)
                    .connect(name, tcp)
                    .await?;
                Either::Right(Either::Left(Box::new(stream)))
            }
            Endpoint::Unix(path) => Either::Right(Either::Right(UnixStream::connect(path).await?)),
        })
    };
    tokio::time::timeout(timeout, open)
        .await
        .map_err(|_| timed_out("connecting"))?
}

async fn tcp(host: &str, port: u16) -> Result<TcpStream, RedisError> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}
