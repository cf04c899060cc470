//! The rollout key: what a host checks before it runs code that Redis hands it.
//!
//! A canary makes every host of a group fetch a component from Redis and run it with the
//! subscription's config values and HTTP grant, and its verdict can make that component serve
//! everything. Whoever can write to Redis must not be able to do either, so the record and the
//! verdict are sealed with a key that Redis never holds: read by each host from a file or the
//! environment (`rollout_key_file` / `rollout_key_env`), or derived from the admin token when
//! only that is set. The stream's secret (kept in Redis) cannot serve here: it only stops
//! producers limited to XADD.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::{TokenError, TokenSource};

type HmacSha256 = Hmac<Sha256>;

/// What a seal is for: a record's seal never verifies as a verdict's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// A canary's record: over its stream, group and body.
    Record,
    /// A canary's verdict: over its stream, group, the record's id and the verdict's body.
    Verdict,
}

impl Use {
    fn label(self) -> &'static [u8] {
        match self {
            Use::Record => b"sluice canary record v2",
            Use::Verdict => b"sluice canary verdict v2",
        }
    }
}

/// Where this host's rollout key came from, for the log and the errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `rollout_key_file` or `rollout_key_env`.
    Configured(TokenSource),
    /// Derived from the admin token (no rollout key configured).
    AdminToken,
    /// Made at start for this process alone (`sluice dev` on its private Redis).
    Ephemeral,
}

/// A key held outside Redis that seals canary records and verdicts (HMAC-SHA256).
#[derive(Clone)]
pub struct RolloutKey {
    key: [u8; 32],
    origin: Origin,
}

impl std::fmt::Debug for RolloutKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RolloutKey(***, {:?})", self.origin)
    }
}

/// Why the rollout key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The configured file or variable could not be used.
    #[error("cannot use the rollout key ({which})")]
    Read {
        /// `rollout_key_file/rollout_key_env` or `the admin token`.
        which: &'static str,
        /// Why.
        #[source]
        source: TokenError,
    },
    /// No randomness for an ephemeral key.
    #[error("no randomness for this process's rollout key: {0}")]
    Random(String),
}

impl RolloutKey {
    /// A key derived from `material` (a configured rollout key or the admin token): a label
    /// keeps it apart from the token's other use.
    pub fn derive(material: &str, origin: Origin) -> Self {
        // HMAC takes a key of any length.
        let mut mac = HmacSha256::new_from_slice(material.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(b"sluice rollout key v2");
        Self {
            key: mac.finalize().into_bytes().into(),
            origin,
        }
    }

    /// A random key for this process alone: a canary it starts runs on this host only.
    pub fn ephemeral() -> Result<Self, KeyError> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Self {
            key,
            origin: Origin::Ephemeral,
        })
    }

    /// The key from the configured source if there is one, else from the admin token; `None`
    /// when neither is set (canaries are then refused and ignored).
    pub fn resolve(
        configured: Option<&TokenSource>,
        admin_token: Option<&TokenSource>,
    ) -> Result<Option<Self>, KeyError> {
        if let Some(source) = configured {
            let material = source.read().map_err(|source| KeyError::Read {
                which: "rollout_key_file/rollout_key_env",
                source,
            })?;
            return Ok(Some(Self::derive(
                &material,
                Origin::Configured(source.clone()),
            )));
        }
        if let Some(source) = admin_token {
            let material = source.read().map_err(|source| KeyError::Read {
                which: "derived from the admin token",
                source,
            })?;
            return Ok(Some(Self::derive(&material, Origin::AdminToken)));
        }
        Ok(None)
    }

    /// Where it came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    fn mac(&self, use_: Use, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(use_.label());
        // Every part's length goes first, so no two lists of parts read the same.
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// The seal for `use_` over `parts`, in hex.
    pub fn seal(&self, use_: Use, parts: &[&[u8]]) -> String {
        hex::encode(self.mac(use_, parts).finalize().into_bytes())
    }

    /// Whether `seal` is this key's for `use_` over `parts` (compared in constant time).
    pub fn verify(&self, use_: Use, parts: &[&[u8]], seal: &str) -> bool {
        let Ok(bytes) = hex::decode(seal) else {
            return false;
        };
        self.mac(use_, parts).verify_slice(&bytes).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_verifies_only_for_its_key_use_and_parts() {
        let key = RolloutKey::derive("k".repeat(40).as_str(), Origin::AdminToken);
        let other = RolloutKey::derive("j".repeat(40).as_str(), Origin::AdminToken);
        let seal = key.seal(Use::Record, &[b"s", b"g", b"body"]);
        assert!(key.verify(Use::Record, &[b"s", b"g", b"body"], &seal));
        assert!(!other.verify(Use::Record, &[b"s", b"g", b"body"], &seal));
        assert!(!key.verify(Use::Verdict, &[b"s", b"g", b"body"], &seal));
        assert!(!key.verify(Use::Record, &[b"sg", b"", b"body"], &seal));
        assert!(!key.verify(Use::Record, &[b"s", b"g", b"body"], "zz"));
        assert!(!format!("{key:?}").contains(&hex::encode(key.key)));
    }
}
