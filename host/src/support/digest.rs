//! What names one version of a handler: the SHA-256 of its component, printed one way
//! everywhere (in full in the API and metrics, its first 12 hex digits in logs and tables).

use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

/// How many hex digits a shortened digest keeps: enough to tell versions apart by eye.
pub const SHORT_LEN: usize = 12;

/// A handler version's identity; cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Digest(Arc<str>);

impl Digest {
    /// The digest of a component's bytes (SHA-256, lower-case hex).
    pub fn of(bytes: &[u8]) -> Self {
        Self(hex::encode(Sha256::digest(bytes)).into())
    }

    /// A name for a handler that is not a component (a native handler in tests and benches).
    pub fn named(label: &str) -> Self {
        Self(label.into())
    }

    /// The whole digest.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first [`SHORT_LEN`] digits, for logs and tables.
    pub fn short(&self) -> &str {
        short(&self.0)
    }
}

/// The first [`SHORT_LEN`] digits of a digest held as text (a canary's record names its
/// versions so), as [`Digest::short`] prints them.
pub fn short(digest: &str) -> &str {
    let end = digest
        .char_indices()
        .nth(SHORT_LEN)
        .map_or(digest.len(), |(at, _)| at);
    &digest[..end]
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_sha256_hex_and_shortens_to_twelve_digits() {
        let d = Digest::of(b"abc");
        assert_eq!(
            d.as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.short(), "ba7816bf8f01");
        assert_eq!(Digest::named("native").short(), "native");
    }
}
