//! Every Redis key name and bookkeeping field the host writes, in one place.
//!
//! Bookkeeping fields start with `sluice-`; they are stripped from what a handler sees and
//! kept on what the dead-letter stream records.

/// The prefix of every field the host adds to an entry.
pub const FIELD_PREFIX: &str = "sluice-";
/// How many times the entry was parked and re-added (absent means 0).
pub const RETRY_COUNT: &str = "sluice-retry-count";
/// The id of the entry this one was re-added from, or dead-lettered from.
pub const ORIGIN_ID: &str = "sluice-origin-id";
/// When a parked retry was due (server clock, epoch ms), set by the sweep; it measures how
/// late the retry came back.
pub const DUE_MS: &str = "sluice-due-ms";
/// The stream a dead-lettered entry came from.
pub const ORIGIN_STREAM: &str = "sluice-origin-stream";
/// The consumer group that gave up on a dead-lettered entry.
pub const ORIGIN_GROUP: &str = "sluice-origin-group";
/// Why an entry was dead-lettered.
pub const REASON: &str = "sluice-reason";
/// How many times Redis had delivered the entry when it was dead-lettered.
pub const DELIVERY_COUNT: &str = "sluice-delivery-count";

/// The config value through which the host tells the guest which field holds the payload.
pub const CONFIG_PAYLOAD_FIELD: &str = "sluice.payload-field";

/// Whether `field` is one of the host's bookkeeping fields.
pub fn is_bookkeeping(field: &str) -> bool {
    field.starts_with(FIELD_PREFIX)
}

/// A subscription's keys that Redis Cluster would put on different slots.
#[derive(Debug, thiserror::Error)]
#[error(
    "Redis is a cluster and the keys of the subscription to `{stream}` hash to different slots ({slots}); the park, sweep and dead-letter scripts touch them together and would fail with CROSSSLOT. Give them one hash tag, e.g. stream `{{{tag}}}`, delayed set `{{{tag}}}.delayed`, dead letter `{{{tag}}}.dead-letter`"
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
    #[error("cannot check whether Redis is a cluster: {0}")]
    Redis(#[from] redis::RedisError),
}

/// On a Redis Cluster, check that `stream` and the `others` keys scripts touch with it share one
/// slot; on a plain server, do nothing.
pub async fn check_same_slot<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    stream: &str,
    others: &[&str],
) -> Result<(), SlotError> {
    let info: String = redis::cmd("INFO").arg("cluster").query_async(conn).await?;
    if !info.lines().any(|l| l.trim() == "cluster_enabled:1") {
        return Ok(());
    }
    let mut slots = Vec::with_capacity(others.len() + 1);
    for key in std::iter::once(&stream).chain(others) {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(*key)
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
