//! Connections to Redis: a managed, self-reconnecting connection for acks and scripts, and a
//! dedicated connection per subscription for its blocking reads (a blocked XREADGROUP would
//! otherwise hold up every other command on a shared connection).

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, RedisError,
    TlsCertificates,
};

use crate::config::RedisAccess;

/// How long a non-blocking command may take before it counts as failed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The first and the largest pause between reconnection attempts.
pub const RECONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(5));

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
}

/// A client for `url`, logging in and verifying TLS as `access` says.
pub fn client(url: &str, access: &RedisAccess) -> Result<Client, ConnError> {
    let invalid = |source| ConnError::Url {
        url: redact(url),
        source,
    };
    let mut info = url.into_connection_info().map_err(invalid)?;
    if access.username.is_some() || access.password_file.is_some() {
        let mut settings = info.redis_settings().clone();
        if let Some(username) = &access.username {
            settings = settings.set_username(username);
        }
        if let Some(path) = &access.password_file {
            settings = settings.set_password(read_password(path)?);
        }
        info = info.set_redis_settings(settings);
    }
    if !access.has_tls_files() {
        return Client::open(info).map_err(invalid);
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
    Client::build_with_tls(
        info,
        TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(invalid)
}

/// The password in `path`, trimmed; refused when every user of the machine could read it.
fn read_password(path: &Path) -> Result<String, ConnError> {
    use std::os::unix::fs::PermissionsExt as _;
    let unreadable = |source| ConnError::File {
        what: "the Redis password file",
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if meta.permissions().mode() & 0o004 != 0 {
        return Err(ConnError::PasswordFileOpen(path.to_owned()));
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    Ok(text.trim().to_owned())
}

/// The URL with any password replaced, for logs and errors.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
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

/// A dedicated connection for blocking reads of up to `block`.
pub async fn blocking(
    client: &Client,
    block: Duration,
) -> Result<MultiplexedConnection, ConnError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(block + COMMAND_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|source| ConnError::Connect {
            url: client.get_connection_info().addr().to_string(),
            source,
        })
}

/// What kind of failure a Redis error is: whether waiting and trying again can help, and how
/// to say what happened in a log line (never just "unavailable").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The connection failed, was refused, dropped or timed out.
    Connection,
    /// Redis answered that it cannot serve now (LOADING, BUSY, TRYAGAIN, MASTERDOWN,
    /// CLUSTERDOWN, READONLY).
    Busy,
    /// A cluster redirect (MOVED/ASK): the key lives on another node.
    Redirect,
    /// NOGROUP: the stream or the consumer group does not exist (any more).
    NoGroup,
    /// WRONGTYPE: a key holds another type than the command needs.
    WrongType,
    /// The reply could not be understood.
    Reply,
    /// Redis refused the command (a script error, a bad argument, missing permission).
    Refused,
}

impl ErrorClass {
    /// Classify `err` by its kind and code, never by its text.
    pub fn of(err: &RedisError) -> Self {
        use redis::ErrorKind;
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
        {
            return Self::Connection;
        }
        match err.code() {
            Some("MOVED" | "ASK") => return Self::Redirect,
            Some("NOGROUP") => return Self::NoGroup,
            Some("WRONGTYPE") => return Self::WrongType,
            Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "READONLY") => {
                return Self::Busy;
            }
            _ => {}
        }
        match err.kind() {
            ErrorKind::UnexpectedReturnType | ErrorKind::Parse => Self::Reply,
            ErrorKind::AuthenticationFailed | ErrorKind::ClusterConnectionNotFound => {
                Self::Connection
            }
            _ => Self::Refused,
        }
    }

    /// Whether trying the same command again later can succeed without anyone changing
    /// anything (a connection back, a server done loading).
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Connection | Self::Busy)
    }

    /// What happened, for log lines.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Connection => "Redis unreachable (connection failed, dropped or timed out)",
            Self::Busy => "Redis cannot serve now",
            Self::Redirect => {
                "Redis redirected the command to another cluster node (MOVED/ASK); this host talks to one node only"
            }
            Self::NoGroup => "the stream or consumer group does not exist (NOGROUP)",
            Self::WrongType => "a key holds the wrong type of value (WRONGTYPE)",
            Self::Reply => "unexpected reply from Redis",
            Self::Refused => "Redis refused the command",
        }
    }
}

/// Capped exponential backoff between attempts to reach Redis again.
#[derive(Debug, Clone)]
pub struct ReconnectBackoff {
    next: Duration,
}

impl Default for ReconnectBackoff {
    fn default() -> Self {
        Self {
            next: RECONNECT_BACKOFF.0,
        }
    }
}

impl ReconnectBackoff {
    /// The pause before the next attempt; each call doubles it up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(RECONNECT_BACKOFF.1);
        delay
    }

    /// Start over after a success.
    pub fn reset(&mut self) {
        self.next = RECONNECT_BACKOFF.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_kind_and_code() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(ErrorClass::of(&io), ErrorClass::Connection);
        assert!(ErrorClass::of(&io).is_transient());
        let reply = RedisError::from((redis::ErrorKind::UnexpectedReturnType, "x"));
        assert_eq!(ErrorClass::of(&reply), ErrorClass::Reply);
        assert!(!ErrorClass::of(&reply).is_transient());
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact("redis://:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }
}
