//! The candidate's bytes in Redis, under [`component_key`]: stored by the host that starts a
//! canary (kept as long as its counts), fetched by every host that joins it, at most
//! `admin_max_upload` of them and only when they are the component the sealed record names.

use redis::aio::ConnectionLike;

use super::CanaryError;
use crate::store::keys::component_key;
use crate::support::digest::short;

/// Store the candidate `bytes` of `stream`'s canary under its `digest` for `keep_ms`.
pub(super) async fn store<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    digest: &str,
    (bytes, keep_ms): (&[u8], u64),
) -> redis::RedisResult<()> {
    redis::cmd("SET")
        .arg(component_key(stream, digest))
        .arg(bytes)
        .arg("PX")
        .arg(keep_ms)
        .query_async::<()>(conn)
        .await
}

/// The candidate's bytes, from Redis: at most `max` of them, and only when they are the
/// component `digest` names.
pub async fn fetch_component<C: ConnectionLike>(
    conn: &mut C,
    stream: &str,
    digest: &str,
    max: u64,
) -> Result<Vec<u8>, CanaryError> {
    let failed = |why: String| CanaryError::Fetch {
        digest: short(digest).to_owned(),
        why,
    };
    let key = component_key(stream, digest);
    let len: u64 = redis::cmd("STRLEN")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if len == 0 {
        return Err(failed(format!("`{key}` is missing or empty")));
    }
    if len > max {
        return Err(failed(format!(
            "`{key}` holds {len} bytes, more than admin_max_upload ({max})"
        )));
    }
    let bytes: Vec<u8> = redis::cmd("GETRANGE")
        .arg(&key)
        .arg(0)
        .arg(max.saturating_sub(1))
        .query_async(conn)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let found = crate::support::digest::Digest::of(&bytes);
    if found.as_str() != digest {
        return Err(failed(format!(
            "`{key}` holds a component whose digest is {}, not the one the record names",
            found.short()
        )));
    }
    Ok(bytes)
}
