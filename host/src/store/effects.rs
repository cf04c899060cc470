//! The journal of an entry's outbound calls, in Redis (`effects = "journal"`): one hash per
//! (stream, group, origin id) ([`keys::effects_key`]), call position -> the recorded call. What
//! is recorded and replayed is `runtime/journal.rs`'s; this module owns only the keys and the
//! bytes: one `HGETALL` to load an entry's journal, one pipelined write per recorded call.
//!
//! Every write renews the key's time to live (the delayed set's ttl, else
//! [`DEFAULT_JOURNAL_TTL`]): a journal left behind (a host killed before it deleted it, a dead
//! letter never requeued) goes by itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use redis::RedisResult;

use super::keys;
use super::redis_conn::RedisHandle;

/// How long a journal lives after its last write when the delayed set has no ttl: past the
/// longest a retry usually waits, so a parked entry finds its journal.
pub const DEFAULT_JOURNAL_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The request's method.
    pub method: String,
    /// The request's URL.
    pub url: String,
    /// SHA-256 of the request's body.
    pub body_sha256: [u8; 32],
    /// The response's status.
    pub status: u16,
    /// The response's headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The response's body.
    pub body: Vec<u8>,
}

impl Record {
    /// What the record costs the journal's byte budget.
    pub fn size(&self) -> u64 {
        let headers: usize = self.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        (self.method.len() + self.url.len() + 32 + 2 + headers + self.body.len()) as u64
    }

    fn encode(&self) -> Vec<u8> {
        use rmpv::Value;
        let headers = self
            .headers
            .iter()
            .map(|(n, v)| Value::Array(vec![n.as_str().into(), Value::Binary(v.clone())]))
            .collect();
        let value = Value::Array(vec![
            1.into(),
            self.method.as_str().into(),
            self.url.as_str().into(),
            Value::Binary(self.body_sha256.to_vec()),
            self.status.into(),
            Value::Array(headers),
            Value::Binary(self.body.clone()),
        ]);
        let mut out = Vec::with_capacity(self.size() as usize + 64);
        // Writing to a Vec cannot fail.
        let _ = rmpv::encode::write_value(&mut out, &value);
        out
    }

    /// A record as [`Self::encode`] wrote it; `None` for anything else (another program's
    /// value, a later format), which is then not replayed.
    fn decode(bytes: &[u8]) -> Option<Self> {
        use rmpv::Value;
        let Value::Array(parts) = rmpv::decode::read_value(&mut &bytes[..]).ok()? else {
            return None;
        };
        let [version, method, url, sha, status, headers, body] = parts.as_slice() else {
            return None;
        };
        if version.as_u64() != Some(1) {
            return None;
        }
        let headers = headers
            .as_array()?
            .iter()
            .map(|h| {
                let pair = h.as_array()?;
                Some((
                    pair.first()?.as_str()?.to_owned(),
                    match pair.get(1)? {
                        Value::Binary(b) => b.clone(),
                        _ => return None,
                    },
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        let Value::Binary(sha) = sha else { return None };
        let Value::Binary(body) = body else {
            return None;
        };
        Some(Self {
            method: method.as_str()?.to_owned(),
            url: url.as_str()?.to_owned(),
            body_sha256: sha.as_slice().try_into().ok()?,
            status: u16::try_from(status.as_u64()?).ok()?,
            headers,
            body: body.clone(),
        })
    }
}

/// A subscription partition's journals: where they are and how long they live.
pub struct JournalStore {
    conn: RedisHandle,
    ttl_ms: u64,
    /// What became of the calls (`sluice_journal_calls_total`).
    pub counters: JournalCounters,
}

/// The journal's counters, one per reason of `sluice_journal_calls_total`.
#[derive(Debug, Default, Clone)]
pub struct JournalCounters {
    /// The recorded response, no network.
    pub replayed: Counter,
    /// Recorded.
    pub recorded: Counter,
    /// Replay ended: the call differs from the recorded one.
    pub diverged: Counter,
    /// Not recorded: the response or the request over its bound.
    pub too_big: Counter,
    /// Not recorded: the entry's journal is at its bound.
    pub journal_full: Counter,
    /// The journal could not be read (every call of the attempt live).
    pub unreadable: Counter,
    /// A record could not be written.
    pub write_failed: Counter,
    /// Offline (`sluice replay --entry`): a call the journal does not hold, answered with an
    /// error instead of the network.
    pub not_in_journal: Counter,
}

impl std::fmt::Debug for JournalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalStore")
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl JournalStore {
    /// Journals on `conn`, each living `ttl` after its last write, counted in `counters`.
    pub fn new(conn: RedisHandle, ttl: Option<Duration>, counters: JournalCounters) -> Self {
        let ttl = ttl.unwrap_or(DEFAULT_JOURNAL_TTL);
        Self {
            conn,
            ttl_ms: ttl.as_millis().clamp(1, u128::from(u64::MAX)) as u64,
            counters,
        }
    }

    /// The entry's recorded calls by position, at most `max_calls` of them (a hash that holds
    /// more was not written by this journal alone: nothing of it is replayed). Records that do
    /// not decode are left out.
    pub async fn load(&self, key: &str, max_calls: u32) -> RedisResult<HashMap<u32, Record>> {
        let mut conn = self.conn.clone();
        let len: u64 = redis::cmd("HLEN").arg(key).query_async(&mut conn).await?;
        if len == 0 || len > u64::from(max_calls) {
            return Ok(HashMap::new());
        }
        let all: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        Ok(all
            .into_iter()
            .filter_map(|(n, bytes)| Some((n.parse().ok()?, Record::decode(&bytes)?)))
            .collect())
    }

    /// Record call `position` (dropping the positions in `stale` first: what an earlier attempt
    /// recorded past where this one went another way), and renew the key's time to live: one
    /// round trip.
    pub async fn record(
        &self,
        key: &str,
        position: u32,
        record: &Record,
        stale: &[u32],
    ) -> RedisResult<()> {
        let mut pipe = redis::pipe();
        if !stale.is_empty() {
            pipe.cmd("HDEL").arg(key).arg(stale).ignore();
        }
        pipe.cmd("HSET")
            .arg(key)
            .arg(position)
            .arg(record.encode())
            .ignore()
            .cmd("PEXPIRE")
            .arg(key)
            .arg(self.ttl_ms)
            .ignore();
        let mut conn = self.conn.clone();
        pipe.query_async(&mut conn).await
    }

    /// Forget the journals at `keys` (their entries settled).
    pub async fn forget(&self, keys: &[String]) -> RedisResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        redis::cmd("DEL").arg(keys).query_async(&mut conn).await
    }
}

/// One delivery's use of the journal: the store, and whether an attempt found or wrote a
/// journal (then its ack deletes it).
#[derive(Debug)]
pub struct DeliveryJournal {
    /// Where the journals are.
    pub store: Arc<JournalStore>,
    used: AtomicBool,
    /// Replay only: a call the journal does not hold fails instead of going out, and nothing
    /// is written.
    pub offline: bool,
    /// Offline: a call the journal did not hold was made.
    missed: AtomicBool,
}

impl DeliveryJournal {
    /// A delivery's journal in `store`, not used yet.
    pub fn new(store: Arc<JournalStore>) -> Self {
        Self {
            store,
            used: AtomicBool::new(false),
            offline: false,
            missed: AtomicBool::new(false),
        }
    }

    /// Offline: a call the journal did not hold was made (and failed).
    pub fn note_missed(&self) {
        self.missed.store(true, Ordering::Relaxed);
    }

    /// Whether a call the journal did not hold was made.
    pub fn missed(&self) -> bool {
        self.missed.load(Ordering::Relaxed)
    }

    /// A delivery's journal in `store` for a replay without the network (`sluice replay
    /// --entry`): recorded calls are answered from it, any other fails.
    pub fn offline(store: Arc<JournalStore>) -> Self {
        Self {
            offline: true,
            ..Self::new(store)
        }
    }

    /// An attempt found or wrote the journal.
    pub fn mark_used(&self) {
        self.used.store(true, Ordering::Relaxed);
    }

    /// Whether an attempt found or wrote it.
    pub fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }
}

/// The journal key of an entry; a requeue that asked for new idempotency keys (`epoch`) starts
/// a journal of its own, so the calls it renamed are not answered from the old one.
pub fn key(stream: &str, group: &str, origin_id: &str, epoch: Option<&[u8]>) -> String {
    let base = keys::effects_key(stream, group, origin_id);
    match epoch {
        None => base,
        Some(epoch) => {
            use sha2::Digest as _;
            let digest = sha2::Sha256::digest(epoch);
            format!("{base}:epoch:{}", hex::encode(&digest[..8]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_comes_back_as_written_and_garbage_does_not() {
        let record = Record {
            method: "POST".into(),
            url: "https://pay.example/charge".into(),
            body_sha256: [7; 32],
            status: 201,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: b"{\"ok\":true}".to_vec(),
        };
        assert_eq!(Record::decode(&record.encode()), Some(record));
        assert_eq!(Record::decode(b"not msgpack"), None);
        assert_eq!(Record::decode(&[0x93, 1, 2, 3]), None);
    }
}
