//! What waits in a delayed-retry set: the members `delayed/lua/park.lua` writes, decoded (for `sluice
//! parked`, the reader of the retry lane, and tests), and encoded as the script does (for tools
//! and tests that fill a set by hand).
//!
//! A member is a MessagePack array `[stream, group, entry id, retry count, [name, value, ...],
//! origin id]`: naming the subscription it belongs to first (a sweep tells its own by their
//! first bytes), unique per entry (the id), and enough to rebuild it whatever its number of
//! fields. The origin id may be empty: the entry is then its own origin. Members of earlier
//! releases are `[entry id, retry count, [name, value, ...], origin id]` (the oldest without the
//! origin id), naming no owner. `delayed/lua/member.lua` reads both forms the same way.

use redis::RedisResult;
use redis::aio::ConnectionLike;

/// One parked entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedEntry {
    /// The id of the entry the producer first added (kept through every park).
    pub origin_id: String,
    /// The id of the entry that was parked (the origin, or the sweep's last copy of it).
    pub entry_id: String,
    /// The retry count it will carry when it comes back.
    pub retry_count: u32,
    /// Its due time, epoch milliseconds (Redis server clock).
    pub due_ms: i64,
    /// Its fields (bytes, names included).
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// The stream and group whose subscription parked it (`None` for a member of an earlier
    /// release, which did not say).
    pub owner: Option<(String, String)>,
}

impl ParkedEntry {
    /// Whether it was sent for later (or by a schedule) rather than parked by a retry or let
    /// in by its key's turn: its retry count is 0 and its id's sequence number is one no
    /// stream reaches (at least 10^18, see `control::operate::schedule`).
    pub fn is_scheduled(&self) -> bool {
        self.retry_count == 0
            && self
                .entry_id
                .split_once('-')
                .is_some_and(|(_, seq)| seq.len() >= 19 && seq.bytes().all(|b| b.is_ascii_digit()))
    }
}

/// Why a member could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("delayed-set member is not a Sluice parked entry: {0}")]
pub struct MemberError(String);

/// Decode one member (see the module's documentation for its forms).
pub fn decode(member: &[u8], due_ms: i64) -> Result<ParkedEntry, MemberError> {
    let value =
        rmpv::decode::read_value(&mut &member[..]).map_err(|e| MemberError(e.to_string()))?;
    let rmpv::Value::Array(parts) = value else {
        return Err(MemberError("not an array".into()));
    };
    let bytes = |v: &rmpv::Value| -> Option<Vec<u8>> {
        match v {
            rmpv::Value::String(s) => Some(s.as_bytes().to_vec()),
            rmpv::Value::Binary(b) => Some(b.clone()),
            rmpv::Value::Integer(i) => Some(i.to_string().into_bytes()),
            _ => None,
        }
    };
    // This release's form names its owner first; an earlier one starts with the entry id and
    // the retry count (a number).
    let owned = parts.len() == 6
        && matches!(
            parts.get(1),
            Some(rmpv::Value::String(_) | rmpv::Value::Binary(_))
        );
    let (owner, rest) = if owned {
        (Some((&parts[0], &parts[1])), &parts[2..])
    } else {
        (None, &parts[..])
    };
    let (Some(id), Some(count), Some(rmpv::Value::Array(flat))) =
        (rest.first(), rest.get(1), rest.get(2))
    else {
        return Err(MemberError(
            "expected [stream, group, entry id, retry count, fields, origin id]".into(),
        ));
    };
    let text = |v: &rmpv::Value, what: &str| {
        bytes(v)
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| MemberError(format!("{what} is not text")))
    };
    let entry_id = text(id, "entry id")?;
    let origin_id = match rest.get(3) {
        Some(origin) => text(origin, "origin id")?,
        None => String::new(),
    };
    let origin_id = if origin_id.is_empty() && !owned {
        entry_id.clone()
    } else {
        origin_id
    };
    let owner = match owner {
        Some((stream, group)) => Some((text(stream, "stream")?, text(group, "group")?)),
        None => None,
    };
    let retry_count = count
        .as_u64()
        .or_else(|| count.as_f64().map(|f| f as u64))
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| MemberError("retry count is not a number".into()))?;
    let mut fields = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        let [name, value] = pair else {
            return Err(MemberError("odd number of field items".into()));
        };
        let name = bytes(name).ok_or_else(|| MemberError("field name is not bytes".into()))?;
        let value = bytes(value).ok_or_else(|| MemberError("field value is not bytes".into()))?;
        fields.push((name, value));
    }
    Ok(ParkedEntry {
        origin_id,
        entry_id,
        retry_count,
        due_ms,
        fields,
        owner,
    })
}

/// Everything in the set, earliest due first, with the server's current time (epoch ms).
pub async fn list<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
) -> RedisResult<(Vec<ParkedEntry>, i64)> {
    let now_ms = crate::store::inspect::server_now_ms(conn).await?;
    let members: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await?;
    let mut entries = Vec::with_capacity(members.len());
    for (member, score) in members {
        match decode(&member, score as i64) {
            Ok(entry) => entries.push(entry),
            Err(err) => tracing::warn!(key, %err, "skipping a member Sluice did not write"),
        }
    }
    Ok((entries, now_ms))
}

/// A member as `lua/park.lua` writes it, for tools that fill a set by hand (the benchmark's
/// drain scenario) and for tests.
#[derive(Debug, Clone)]
pub struct NewMember<'a> {
    /// The id of the entry parked.
    pub entry_id: &'a str,
    /// The retry count it comes back with.
    pub retry_count: u32,
    /// Its fields.
    pub fields: &'a [(Vec<u8>, Vec<u8>)],
    /// The id of the entry the producer added.
    pub origin_id: &'a str,
    /// The subscription's stream.
    pub stream: &'a str,
    /// The subscription's group.
    pub group: &'a str,
}

fn raw_str(out: &mut Vec<u8>, bytes: &[u8]) {
    let _ = rmp::encode::write_str_len(out, bytes.len() as u32);
    out.extend_from_slice(bytes);
}

fn fields_array(out: &mut Vec<u8>, fields: &[(Vec<u8>, Vec<u8>)]) {
    let _ = rmp::encode::write_array_len(out, (fields.len() * 2) as u32);
    for (name, value) in fields {
        raw_str(out, name);
        raw_str(out, value);
    }
}

impl NewMember<'_> {
    /// The member's bytes, exactly as the script writes them (Lua's cmsgpack writes every
    /// string, text or not, as a MessagePack str).
    pub fn encode(&self) -> Vec<u8> {
        // Writing to a Vec cannot fail.
        let mut out = Vec::new();
        let _ = rmp::encode::write_array_len(&mut out, 6);
        raw_str(&mut out, self.stream.as_bytes());
        raw_str(&mut out, self.group.as_bytes());
        raw_str(&mut out, self.entry_id.as_bytes());
        let _ = rmp::encode::write_uint(&mut out, u64::from(self.retry_count));
        fields_array(&mut out, self.fields);
        raw_str(&mut out, self.origin_id.as_bytes());
        out
    }
}

/// Encode a member as the first release's park script did (`[entry id, retry count, fields]`,
/// the entry being its own origin, no owner): what upgrade tests and the drain benchmark fill a
/// set with.
pub fn encode_legacy(entry_id: &str, retry_count: u32, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = rmp::encode::write_array_len(&mut out, 3);
    raw_str(&mut out, entry_id.as_bytes());
    let _ = rmp::encode::write_uint(&mut out, u64::from(retry_count));
    fields_array(&mut out, fields);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_and_decode_round_trip() {
        let fields = vec![(vec![0xfe, b'p'], vec![0xff, 0x00, b'x'])];
        let member = encode_legacy("1-0", 3, &fields);
        let entry = decode(&member, 42).unwrap();
        assert_eq!(entry.origin_id, "1-0");
        assert_eq!(entry.retry_count, 3);
        assert_eq!(entry.fields, fields);
        assert_eq!(entry.due_ms, 42);
        assert_eq!(entry.owner, None);
        let member = NewMember {
            entry_id: "2-0",
            retry_count: 1,
            fields: &fields,
            origin_id: "1-0",
            stream: "s",
            group: "g",
        }
        .encode();
        let entry = decode(&member, 7).unwrap();
        assert_eq!(
            (entry.entry_id.as_str(), entry.origin_id.as_str()),
            ("2-0", "1-0")
        );
        assert_eq!(entry.owner, Some(("s".into(), "g".into())));
        assert_eq!(entry.fields, fields);
    }
}
