//! The seal that makes the host's bookkeeping trusted: [`Secret`], a random value per stream
//! kept in Redis, keys a [`Seal`] over a copy's bookkeeping, its own fields, its stream and its
//! group ([`super::MARK`]); a producer's own `sluice-*` fields are its data like any other. The
//! earlier release's unsealed marks are trusted only on entries older than its legacy cutoffs.

use super::ids::{cmp_ids, is_stream_id};
use super::names::{legacy_marks_key, secret_key};

/// A list of byte strings as MessagePack: an array of str, each with the shortest header, as
/// Lua's `cmsgpack.pack` writes a table of strings (so Rust and the scripts hash the same bytes;
/// every part's length is in it, so no two lists read the same).
fn packed_strs<'a>(parts: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_array_len(&mut out, parts.len() as u32);
    for part in parts {
        let _ = rmp::encode::write_str_len(&mut out, part.len() as u32);
        out.extend_from_slice(part);
    }
    out
}

/// The digest of a list of fields that a seal covers instead of the fields themselves: SHA-1
/// (hex) of every name and value in order, packed as `keys/lua/seal.lua` packs them.
pub fn fields_digest(fields: &[(Vec<u8>, Vec<u8>)]) -> String {
    use sha1::Digest as _;
    let flat = fields
        .iter()
        .flat_map(|(name, value)| [name.as_slice(), value.as_slice()]);
    let flat: Vec<&[u8]> = flat.collect();
    hex::encode(sha1::Sha1::digest(packed_strs(flat.into_iter())))
}

/// What a seal is for: the first part of every seal, so a seal made for one use never verifies
/// for another (a lane copy's seal on a dead letter, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    /// A retry copy in the retry lane: over the stream, group, member and due time.
    Lane,
    /// A retry copy at the stream's tail: over the stream, the group that parked it, origin id,
    /// retry count, due time and the digest of the copy's fields.
    Tail,
    /// The same, when the copy carries the fields packed into one (too many for one XADD): a
    /// use of its own, so a producer's field that happens to be called `sluice-packed-fields`
    /// is never unpacked.
    TailPacked,
    /// A dead letter: over the stream, group, origin id and the digest of its fields.
    DeadLetter,
    /// The same, with the fields packed into one.
    DeadLetterPacked,
    /// A parked member the host dead-lettered raw: over its set, stream, group and the member.
    Member,
}

impl Seal {
    /// The name the scripts are given for it.
    pub fn name(self) -> &'static str {
        match self {
            Seal::Lane => "lane",
            Seal::Tail => "tail",
            Seal::TailPacked => "tail-packed",
            Seal::DeadLetter => "dead-letter",
            Seal::DeadLetterPacked => "dead-letter-packed",
            Seal::Member => "member",
        }
    }
}

/// A random value shared by every host of a stream (kept in Redis under [`secret_key`]) that
/// keys the host's seals ([`super::MARK`]). A producer that writes `sluice-retry-count` itself cannot
/// make a matching seal, so its fields change nothing about how attempts are counted; and since
/// a seal covers the fields it sits with, a seal copied onto other fields verifies for none.
///
/// A seal is `sha1(secret ‖ sha1(secret ‖ message))` in hex, the message being the use and the
/// parts it covers packed as MessagePack (an array of str): a keyed hash Redis's Lua can compute
/// (`redis.sha1hex`, `cmsgpack.pack`), with the outer round against length extension.
///
/// With the secret come the legacy cutoffs (see [`legacy_marks_key`]): which entries, per key,
/// may carry the earlier release's unsealed bookkeeping.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Key name -> the last id it had when this release first used it.
    legacy: std::collections::HashMap<String, String>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `lua/secret.lua`: the stream's secret and the legacy cutoffs of a subscription's keys.
static LOAD: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(crate::store::lua!("store/keys/lua/secret")));

/// Why the stream's secret could not be read or made. Never says the secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Redis refused or could not be reached.
    #[error("cannot read or create the secret of stream `{stream}` (`{key}`)")]
    Redis {
        /// The stream.
        stream: String,
        /// The secret's key.
        key: String,
        /// What Redis said.
        #[source]
        error: redis::RedisError,
    },
    /// The secret's key or the legacy record holds something else than this release writes.
    #[error(
        "the secret of stream `{stream}` or its legacy record (`{key}`, `{record}`) holds a value Sluice did not write; delete both for the host to make them anew (the bookkeeping of retries on their way and the origin of dead letters will not be trusted)"
    )]
    Malformed {
        /// The stream.
        stream: String,
        /// The secret's key.
        key: String,
        /// The legacy record's key.
        record: String,
    },
}

impl Secret {
    /// The stream's secret, created (SET NX) by whichever host comes first when `create`; and
    /// the legacy cutoffs of `keys` (the subscription's stream, lane and dead-letter streams),
    /// recorded the first time a host of this release uses each. `None` when there is no secret
    /// and `create` is false (a subscription without a set never creates one).
    pub async fn load_with<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
        keys: &[&str],
        create: bool,
    ) -> Result<Option<Self>, SecretError> {
        let mut bytes = [0u8; 20];
        getrandom::fill(&mut bytes).map_err(|e| SecretError::Redis {
            stream: stream.to_owned(),
            key: secret_key(stream),
            error: redis::RedisError::from((
                redis::ErrorKind::Client,
                "no randomness for the stream secret",
                e.to_string(),
            )),
        })?;
        let mut invocation = LOAD.key(secret_key(stream));
        invocation
            .key(legacy_marks_key(stream))
            .arg(hex::encode(bytes))
            .arg(u8::from(create));
        for key in keys {
            invocation.key(*key);
        }
        let reply: redis::Value =
            invocation
                .invoke_async(conn)
                .await
                .map_err(|error| SecretError::Redis {
                    stream: stream.to_owned(),
                    key: secret_key(stream),
                    error,
                })?;
        // Parsed by hand: a conversion error would print the value, and this one is the secret.
        let malformed = || SecretError::Malformed {
            stream: stream.to_owned(),
            key: secret_key(stream),
            record: legacy_marks_key(stream),
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let redis::Value::Array(items) = reply else {
            return Err(malformed());
        };
        let Some((first, cutoffs)) = items.split_first() else {
            return Err(malformed());
        };
        let value = match first {
            redis::Value::Nil | redis::Value::Boolean(false) => return Ok(None),
            v => text(v).ok_or_else(malformed)?,
        };
        let mut legacy = std::collections::HashMap::new();
        for (key, cutoff) in keys.iter().zip(cutoffs) {
            let cutoff = text(cutoff)
                .filter(|c| is_stream_id(c))
                .ok_or_else(malformed)?;
            legacy.insert((*key).to_owned(), cutoff);
        }
        Ok(Some(Self { value, legacy }))
    }

    /// The stream's secret, created by whichever host comes first, with the legacy cutoffs of
    /// `keys` (see [`Self::load_with`]).
    pub async fn load_or_create<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
        keys: &[&str],
    ) -> Result<Self, SecretError> {
        Self::load_with(conn, stream, keys, true)
            .await?
            .ok_or_else(|| SecretError::Malformed {
                stream: stream.to_owned(),
                key: secret_key(stream),
                record: legacy_marks_key(stream),
            })
    }

    /// The stream's secret if some host with a delayed-retry set made one, with the legacy
    /// cutoffs of `keys`; a subscription without a set never creates the key (a set, and what
    /// it costs, is opt-in).
    pub async fn load<C: redis::aio::ConnectionLike>(
        conn: &mut C,
        stream: &str,
        keys: &[&str],
    ) -> Result<Option<Self>, SecretError> {
        Self::load_with(conn, stream, keys, false).await
    }

    /// A secret with a known value (tests), trusting no bookkeeping of the earlier release.
    pub fn from_value(value: &str) -> Self {
        Self {
            value: value.to_owned(),
            legacy: std::collections::HashMap::new(),
        }
    }

    /// The same secret, trusting the earlier release's bookkeeping on the entries of `key` up to
    /// id `cutoff` (tests).
    pub fn with_legacy_cutoff(mut self, key: &str, cutoff: &str) -> Self {
        self.legacy.insert(key.to_owned(), cutoff.to_owned());
        self
    }

    /// The value, to hand to the scripts.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The seal for `use_` over `parts`.
    pub fn seal(&self, use_: Seal, parts: &[&[u8]]) -> String {
        use sha1::Digest as _;
        let all = std::iter::once(use_.name().as_bytes()).chain(parts.iter().copied());
        let all: Vec<&[u8]> = all.collect();
        let inner = sha1::Sha1::new()
            .chain_update(self.value.as_bytes())
            .chain_update(packed_strs(all.into_iter()))
            .finalize();
        let outer = sha1::Sha1::new()
            .chain_update(self.value.as_bytes())
            .chain_update(hex::encode(inner).as_bytes())
            .finalize();
        hex::encode(outer)
    }

    /// Whether `mark` is the seal for `use_` over `parts` (compared in constant time).
    pub fn verify(&self, use_: Seal, parts: &[&[u8]], mark: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        self.seal(use_, parts).as_bytes().ct_eq(mark).into()
    }

    /// The earlier release's mark over a re-added retry's bookkeeping (stream, origin, retry
    /// count and due time; not the fields, nor the group): what hosts of that release wrote.
    pub fn legacy_mark(&self, stream: &str, origin: &str, retry: &str, due: &str) -> String {
        use sha1::Digest as _;
        let message = format!("{}:{stream}:{origin}:{retry}:{due}", stream.len());
        let inner = hex::encode(sha1::Sha1::digest(format!("{}{message}", self.value)));
        hex::encode(sha1::Sha1::digest(format!("{}{inner}", self.value)))
    }

    /// Whether entry `entry_id` of `key` was there before this release first used the key, so
    /// it may carry the earlier release's unsealed bookkeeping.
    pub fn trusts_legacy(&self, key: &str, entry_id: &str) -> bool {
        self.legacy
            .get(key)
            .is_some_and(|cutoff| cutoff != "0-0" && cmp_ids(entry_id, cutoff).is_le())
    }

    /// Whether `mark` is the earlier release's mark over this bookkeeping, on entry `entry_id` of
    /// `key`, old enough to carry one.
    pub fn verify_legacy(
        &self,
        key: &str,
        entry_id: &str,
        [stream, origin, retry, due]: [&str; 4],
        mark: &str,
    ) -> bool {
        use subtle::ConstantTimeEq as _;
        if !self.trusts_legacy(key, entry_id) {
            return false;
        }
        let expected = self.legacy_mark(stream, origin, retry, due);
        expected.as_bytes().ct_eq(mark.as_bytes()).into()
    }
}
