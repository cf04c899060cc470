//! What kind of failure a Redis error is ([`ErrorClass`]), by its kind and code: the read
//! loop, the settler and the doorbell decide by it whether to wait and try again, and log lines
//! say by it what happened.

use redis::RedisError;

/// What kind of failure a Redis error is: whether waiting and trying again can help, and how
/// to say what happened in a log line (never just "unavailable").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The connection failed, was refused, dropped or timed out.
    Connection,
    /// Redis answered that it cannot serve now (LOADING, BUSY, TRYAGAIN, MASTERDOWN,
    /// CLUSTERDOWN, READONLY, or UNBLOCKED: a blocked read cut off because its node turned
    /// replica).
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
            Some(
                "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "READONLY"
                | "UNBLOCKED",
            ) => {
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
                "Redis redirected the command to another cluster node (MOVED/ASK) and the redirect was not followed"
            }
            Self::NoGroup => "the stream or consumer group does not exist (NOGROUP)",
            Self::WrongType => "a key holds the wrong type of value (WRONGTYPE)",
            Self::Reply => "unexpected reply from Redis",
            Self::Refused => "Redis refused the command",
        }
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
}
