//! Which Redis a subscription reads and how it logs in: the `redis` URL (or a cluster's seed
//! nodes), the ACL user, and the password and TLS files, each secret in a file of its own.
//! A file's top-level keys are what its subscriptions inherit; a subscription's own keys win.

use std::path::{Path, PathBuf};

use super::ConfigError;
use super::RedisAccess;
use super::check::Validator;
use super::raw::{RawConfig, RawRedis, RawSubscription};

impl RawRedis {
    /// The value as the rest of the host carries it: seed URLs separated by a space (a URL
    /// cannot hold one unescaped), which `redis_conn::Target::parse` splits again.
    pub(super) fn resolve(&self, v: &Validator<'_>, key: &str) -> Result<String, ConfigError> {
        let urls = match self {
            Self::One(url) => return Ok(url.clone()),
            Self::Seeds(urls) => urls,
        };
        let shown = || format!("[{} URLs]", urls.len());
        if urls.is_empty() {
            return Err(v.invalid(key, "[]", "name at least one cluster node"));
        }
        if urls
            .iter()
            .any(|u| u.trim().is_empty() || u.contains(char::is_whitespace))
        {
            return Err(v.invalid(
                key,
                &shown(),
                "each cluster node is one URL, without spaces (e.g. \"redis://10.0.0.1:7000\")",
            ));
        }
        if urls.iter().any(|u| u.starts_with("redis+sentinel://")) {
            return Err(v.invalid(
                key,
                &shown(),
                "a list names cluster nodes; give a Sentinel URL as one string",
            ));
        }
        Ok(urls.join(" "))
    }
}

/// The `redis_*` keys of one table, as written.
struct RawAccess<'a> {
    username: &'a Option<String>,
    password_file: &'a Option<PathBuf>,
    ca_file: &'a Option<PathBuf>,
    cert_file: &'a Option<PathBuf>,
    key_file: &'a Option<PathBuf>,
}

/// A file's top-level `redis` and `redis_*` keys: what its subscriptions inherit.
pub(super) fn file_redis(
    v: &Validator<'_>,
    base: &Path,
    raw: &RawConfig,
) -> Result<(Option<String>, RedisAccess), ConfigError> {
    let redis = raw
        .redis
        .as_ref()
        .map(|r| r.resolve(v, "redis"))
        .transpose()?;
    let access = redis_access(
        v,
        base,
        "",
        RawAccess {
            username: &raw.redis_username,
            password_file: &raw.redis_password_file,
            ca_file: &raw.redis_ca_file,
            cert_file: &raw.redis_cert_file,
            key_file: &raw.redis_key_file,
        },
        &RedisAccess::default(),
    )?;
    Ok((redis, access))
}

/// A subscription's `redis` and `redis_*` keys over what its file gives (`inherited_*`);
/// `key` names a key of the subscription (`key("")` is its prefix). TLS files are refused
/// behind Sentinel.
pub(super) fn subscription_redis(
    v: &Validator<'_>,
    base: &Path,
    key: &dyn Fn(&str) -> String,
    sub: &RawSubscription,
    (inherited_redis, inherited_access): (Option<&String>, &RedisAccess),
) -> Result<(Option<String>, RedisAccess), ConfigError> {
    let redis = match &sub.redis {
        Some(redis) => Some(redis.resolve(v, &key("redis"))?),
        None => inherited_redis.cloned(),
    };
    let access = redis_access(
        v,
        base,
        &key(""),
        RawAccess {
            username: &sub.redis_username,
            password_file: &sub.redis_password_file,
            ca_file: &sub.redis_ca_file,
            cert_file: &sub.redis_cert_file,
            key_file: &sub.redis_key_file,
        },
        inherited_access,
    )?;
    if let Some(url) = &redis
        && url.starts_with("redis+sentinel://")
        && access.has_tls_files()
    {
        // Sentinel connections here do not carry TLS: better no start than a password sent
        // in clear text to whichever master the sentinels name.
        return Err(v.invalid(
            &key("redis"),
            "redis+sentinel://…",
            "TLS files (redis_ca_file, redis_cert_file) are not supported behind Sentinel: connect to the master with rediss:// or drop the TLS files",
        ));
    }
    Ok((redis, access))
}

/// The `redis_*` keys over `inherited` (a subscription's over its file's): files resolved
/// against the config's folder and required to exist, a certificate only with its key.
/// `prefix` is `subscription[i].` for a subscription's keys, empty at the top level.
fn redis_access(
    v: &Validator<'_>,
    base: &Path,
    prefix: &str,
    raw: RawAccess<'_>,
    inherited: &RedisAccess,
) -> Result<RedisAccess, ConfigError> {
    let file = |name: &str, path: &Option<PathBuf>| -> Result<Option<PathBuf>, ConfigError> {
        let Some(path) = path else {
            return Ok(None);
        };
        let path = base.join(path);
        if !path.is_file() {
            return Err(v.invalid(
                &format!("{prefix}{name}"),
                &path.display().to_string(),
                "no such file",
            ));
        }
        Ok(Some(path))
    };
    let client_cert = match (
        file("redis_cert_file", raw.cert_file)?,
        file("redis_key_file", raw.key_file)?,
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => inherited.client_cert.clone(),
        (Some(cert), None) | (None, Some(cert)) => {
            return Err(v.invalid(
                &format!("{prefix}redis_cert_file"),
                &cert.display().to_string(),
                "a client certificate needs both redis_cert_file and redis_key_file",
            ));
        }
    };
    Ok(RedisAccess {
        username: raw.username.clone().or_else(|| inherited.username.clone()),
        password_file: file("redis_password_file", raw.password_file)?
            .or_else(|| inherited.password_file.clone()),
        ca_file: file("redis_ca_file", raw.ca_file)?.or_else(|| inherited.ca_file.clone()),
        client_cert,
    })
}
