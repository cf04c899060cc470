//! On a Redis Cluster, the keys of a subscription must share the stream's slot, as its
//! scripts touch them together: [`check_same_slot`] says so at start ([`CrossSlot`]), instead
//! of every script failing with CROSSSLOT later.

use super::subscription::SubscriptionKeys;
use crate::store::redis_conn::RedisHandle;

/// A subscription's keys that Redis Cluster would put on different slots.
#[derive(Debug, thiserror::Error)]
#[error(
    "Redis is a cluster and the keys of the subscription to `{stream}` hash to different slots ({slots}); the park, sweep and dead-letter scripts touch them together and would fail with CROSSSLOT. Give them one hash tag, e.g. stream `{{{tag}}}`, delayed set `{{{tag}}}.delayed`, dead letter `{{{tag}}}.<group>.dead-letter`"
)]
pub struct CrossSlot {
    /// The subscription's stream.
    pub stream: String,
    /// Each key with its slot.
    pub slots: String,
    /// A suggested hash tag.
    pub tag: String,
}

/// Why the cluster check could not be made or failed.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The keys hash to different slots.
    #[error(transparent)]
    CrossSlot(#[from] CrossSlot),
    /// Redis could not be asked.
    #[error("cannot check whether Redis is a cluster")]
    Redis(#[from] redis::RedisError),
}

/// On a Redis Cluster, check that every key of the subscription shares the stream's slot; on a
/// plain server, do nothing.
pub async fn check_same_slot(
    conn: &mut RedisHandle,
    keys: &SubscriptionKeys,
) -> Result<(), SlotError> {
    let stream = &*keys.stream;
    let others = keys.with_stream();
    if !conn.is_cluster() {
        return Ok(());
    }
    let mut slots = Vec::with_capacity(others.len() + 1);
    for key in std::iter::once(stream).chain(others.iter().map(String::as_str)) {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(conn)
            .await?;
        slots.push((key.to_string(), slot));
    }
    if slots.iter().all(|(_, s)| *s == slots[0].1) {
        return Ok(());
    }
    let tag = match (stream.find('{'), stream.find('}')) {
        (Some(open), Some(close)) if close > open + 1 => stream[open + 1..close].to_owned(),
        _ => stream.to_owned(),
    };
    Err(CrossSlot {
        stream: stream.to_owned(),
        slots: slots
            .iter()
            .map(|(k, s)| format!("`{k}` -> {s}"))
            .collect::<Vec<_>>()
            .join(", "),
        tag,
    }
    .into())
}
