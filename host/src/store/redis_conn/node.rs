//! Reaching one Redis node: its URL parsed, the configured login and TLS files applied
//! ([`client`]), and the self-reconnecting connection for short commands ([`manager`]); and
//! [`ConnError`], why that failed, for every way of connecting.

use std::path::{Path, PathBuf};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError,
    TlsCertificates,
};

use super::backoff::RECONNECT_BACKOFF;
use super::redaction::redact;
use super::{COMMAND_TIMEOUT, CONNECT_TIMEOUT};
use crate::config::{PrivateFileError, RedisAccess, read_private};

/// Why Redis could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The URL does not parse.
    #[error("invalid Redis URL {url:?}")]
    Url {
        /// The URL as given.
        url: String,
        /// What redis-rs said.
        source: RedisError,
    },
    /// Connecting failed (refused, timed out, TLS verification, authentication).
    #[error("cannot connect to Redis at {url}")]
    Connect {
        /// The URL, without credentials.
        url: String,
        /// What failed.
        source: RedisError,
    },
    /// A credentials or TLS file could not be read.
    #[error("cannot read {what} {}", path.display())]
    File {
        /// Which setting named it.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the filesystem said.
        source: std::io::Error,
    },
    /// The password file could be read by every user of the machine.
    #[error(
        "the Redis password file {} is readable by every user; make it private (chmod 600)",
        .0.display()
    )]
    PasswordFileOpen(PathBuf),
    /// TLS files were given for a URL that does not use TLS.
    #[error(
        "redis_ca_file / redis_cert_file are set, but {0} does not use TLS: write rediss:// to connect with TLS"
    )]
    TlsWithoutRediss(String),
    /// TLS files were given for a Sentinel URL, where they would be ignored.
    #[error(
        "TLS files (redis_ca_file, redis_cert_file) are not supported behind Sentinel ({0}): connect to the master with rediss:// or drop the TLS files"
    )]
    TlsBehindSentinel(String),
}

/// A client for `url`, logging in and verifying TLS as `access` says.
pub fn client(url: &str, access: &RedisAccess) -> Result<Client, ConnError> {
    let (info, tls) = node_info(url, access)?;
    match tls {
        None => Client::open(info),
        Some(certs) => Client::build_with_tls(info, certs),
    }
    .map_err(|source| ConnError::Url {
        url: redact(url),
        source,
    })
}

/// `url` parsed, with `access`'s login applied and its TLS files read (`None`: no TLS files,
/// so a `rediss://` URL trusts the system roots).
pub(super) fn node_info(
    url: &str,
    access: &RedisAccess,
) -> Result<(ConnectionInfo, Option<TlsCertificates>), ConnError> {
    let mut info = url
        .into_connection_info()
        .map_err(|source| ConnError::Url {
            url: redact(url),
            source,
        })?;
    if access.username.is_some() || access.password_file.is_some() {
        let settings = log_in(info.redis_settings().clone(), access)?;
        info = info.set_redis_settings(settings);
    }
    if !access.has_tls_files() {
        return Ok((info, None));
    }
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return Err(ConnError::TlsWithoutRediss(redact(url)));
    }
    let read = |what: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| ConnError::File {
            what,
            path: path.to_owned(),
            source,
        })
    };
    let root_cert = match &access.ca_file {
        Some(path) => Some(read("the Redis CA file", path)?),
        None => None,
    };
    let client_tls = match &access.client_cert {
        Some((cert, key)) => Some(ClientTlsConfig {
            client_cert: read("the Redis client certificate", cert)?,
            client_key: read("the Redis client key", key)?,
        }),
        None => None,
    };
    Ok((
        info,
        Some(TlsCertificates {
            client_tls,
            root_cert,
        }),
    ))
}

/// `settings` with `access`'s user and the password from its file.
pub(super) fn log_in(
    mut settings: redis::RedisConnectionInfo,
    access: &RedisAccess,
) -> Result<redis::RedisConnectionInfo, ConnError> {
    if let Some(username) = &access.username {
        settings = settings.set_username(username);
    }
    if let Some(path) = &access.password_file {
        let password = read_private(path).map_err(|err| match err {
            PrivateFileError::Io(source) => ConnError::File {
                what: "the Redis password file",
                path: path.to_owned(),
                source,
            },
            PrivateFileError::WorldReadable => ConnError::PasswordFileOpen(path.to_owned()),
        })?;
        settings = settings.set_password(password);
    }
    Ok(settings)
}

/// A connection manager for acks, scripts and other short commands; it reconnects by itself.
pub async fn manager(client: &Client) -> Result<ConnectionManager, ConnError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(COMMAND_TIMEOUT))
        .set_min_delay(RECONNECT_BACKOFF.0)
        .set_max_delay(RECONNECT_BACKOFF.1);
    ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(|source| ConnError::Connect {
            url: client.get_connection_info().addr().to_string(),
            source,
        })
}
