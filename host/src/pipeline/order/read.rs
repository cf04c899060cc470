//! Reading an ordered subscription's new stream entries (`lua/read.lua`): delivery and each
//! entry's place in its key's order are one atomic step, so entries of one key are ordered by
//! their ids whichever host reads them.

use std::sync::LazyLock;

use redis::{RedisResult, Script};
use sluice_descriptor::OrderKey;

use super::Order;

static READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/order/lua/read")));

/// One new stream entry that runs now.
#[derive(Debug)]
pub struct OrderedEntry {
    /// Its id.
    pub id: String,
    /// Its fields (none when it is over `max_entry_bytes`: see `cut`).
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// What of it was not sent (over `max_entry_bytes`): it is dead-lettered from Redis.
    pub cut: crate::store::redis_conn::lean::Cut,
}

impl Order {
    /// Read up to `count` new stream entries and settle each one's place in its key's order
    /// in the same step (`lua/read.lua`): those that run come back, the
    /// others wait in Redis. When nothing was read, the ids a blocking wait starts from.
    pub async fn read_new<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
        (consumer, count, max_entry_bytes): (&str, usize, u64),
    ) -> RedisResult<NewEntries> {
        let options = crate::store::options::ScriptOptions::default()
            .with("group", &*self.group)
            .with("consumer", consumer)
            .with("count", count as u64)
            .with("max_in_flight", u64::from(self.spec.max_in_flight_per_key))
            .with("prefix", self.keys.prefix.as_str())
            .with(
                "field",
                match &self.spec.key {
                    OrderKey::Field(name) => name.as_str(),
                    OrderKey::Payload(_) => &self.payload_field,
                },
            )
            .with(
                "pointer",
                match &self.spec.key {
                    OrderKey::Field(_) => "",
                    OrderKey::Payload(pointer) => pointer.as_str(),
                },
            )
            .with("max_key_bytes", self.spec.max_key_bytes as u64)
            .with("max_entry_bytes", max_entry_bytes)
            .with("field_overhead", crate::entry::delivery::FIELD_OVERHEAD)
            .encode();
        let reply: redis::Value = self
            .invocation(&READ)
            .arg(options)
            .invoke_async(conn)
            .await?;
        let read = NewEntries::parse(reply)?;
        self.missing.inc_by(read.missing);
        self.too_long.inc_by(read.too_long);
        self.held.inc_by(read.queued);
        Ok(read)
    }
}

/// What the read script read.
#[derive(Debug, Default)]
pub struct NewEntries {
    /// The entries that run, in id order.
    pub entries: Vec<OrderedEntry>,
    /// When nothing was read: the group's last-delivered ids on the stream and the lane.
    pub idle: Option<(String, String)>,
    pub(super) missing: u64,
    pub(super) too_long: u64,
    pub(super) queued: u64,
}

impl NewEntries {
    /// The script's reply (see the header of `lua/read.lua`).
    fn parse(reply: redis::Value) -> RedisResult<Self> {
        use redis::FromRedisValue;
        let bad = || {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "order read: unexpected reply",
            ))
        };
        let redis::Value::Array(parts) = reply else {
            return Err(bad());
        };
        let mut parts = parts.into_iter();
        let (Some(ids), Some(missing), Some(too_long), Some(queued)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let ids: Vec<String> = FromRedisValue::from_redis_value(ids)?;
        let mut read = Self {
            idle: match ids.as_slice() {
                [stream, lane] => Some((stream.clone(), lane.clone())),
                _ => None,
            },
            missing: FromRedisValue::from_redis_value(missing)?,
            too_long: FromRedisValue::from_redis_value(too_long)?,
            queued: FromRedisValue::from_redis_value(queued)?,
            entries: Vec::new(),
        };
        read.entries = parse_rows(parts)?;
        Ok(read)
    }
}

/// The entry rows of the read script's reply: each
/// `{id, {name, value, ...}, key digest, bytes over, field count}`.
fn parse_rows(parts: impl Iterator<Item = redis::Value>) -> RedisResult<Vec<OrderedEntry>> {
    use redis::FromRedisValue;
    type Row = (String, Vec<Vec<u8>>, String, u64, u64);
    let mut entries = Vec::new();
    for row in parts {
        // The key's digest (third) is the script's to keep: settling finds the turn by the
        // entry's origin id.
        let (id, flat, _digest, over, fields): Row = FromRedisValue::from_redis_value(row)?;
        let cut = crate::store::redis_conn::lean::Cut {
            fields: if over > 0 { fields as usize } else { 0 },
            bytes: over,
            over: over > 0,
        };
        let mut pairs = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
            pairs.push((name, value));
        }
        entries.push(OrderedEntry {
            id,
            fields: pairs,
            cut,
        });
    }
    Ok(entries)
}
