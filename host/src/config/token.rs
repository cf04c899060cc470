//! Where the admin API's bearer token comes from: a private file or an environment variable,
//! never the config file itself. [`read_private`] reads any such secret file (the Redis
//! password too).

use std::path::{Path, PathBuf};

/// Why a secret file could not be used.
#[derive(Debug)]
pub enum PrivateFileError {
    /// It could not be read.
    Io(std::io::Error),
    /// Every user of the machine could read it.
    WorldReadable,
}

/// The secret in `path`, trimmed; refused when every user of the machine could read it.
pub fn read_private(path: &Path) -> Result<String, PrivateFileError> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).map_err(PrivateFileError::Io)?;
    if meta.permissions().mode() & 0o004 != 0 {
        return Err(PrivateFileError::WorldReadable);
    }
    let text = std::fs::read_to_string(path).map_err(PrivateFileError::Io)?;
    Ok(text.trim().to_owned())
}

/// Why a secret (the admin token, the rollout key) could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the secret file {}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What the filesystem said.
        source: std::io::Error,
    },
    /// Every user of the machine could read the token.
    #[error(
        "the secret file {} is readable by every user; make it private (chmod 600)",
        .0.display()
    )]
    WorldReadable(PathBuf),
    /// The token is too short to withstand guessing.
    #[error(
        "the secret in {from} holds at most {bits} bits of randomness; it needs {min}: make one with `openssl rand -hex 32 > secret-file && chmod 600 secret-file`",
        min = MIN_TOKEN_BITS as u32
    )]
    Weak {
        /// Where it was read.
        from: TokenSource,
        /// Its estimated strength.
        bits: u32,
    },
    /// The variable is unset or not UTF-8.
    #[error("cannot read the secret from ${name}")]
    Env {
        /// The variable.
        name: String,
        /// Why.
        source: std::env::VarError,
    },
    /// The token is blank.
    #[error("the secret from {0} is empty")]
    Empty(TokenSource),
}

/// Where a secret is read from, so it never sits in the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// A file holding the token; it must not be readable by every user.
    File(PathBuf),
    /// An environment variable holding the token.
    Env(String),
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Env(name) => write!(f, "${name}"),
        }
    }
}

impl TokenSource {
    /// Read the token, trimmed.
    pub fn read(&self) -> Result<String, TokenError> {
        let token = match self {
            Self::File(path) => read_private(path).map_err(|err| match err {
                PrivateFileError::Io(source) => TokenError::File {
                    path: path.clone(),
                    source,
                },
                PrivateFileError::WorldReadable => TokenError::WorldReadable(path.clone()),
            })?,
            Self::Env(name) => std::env::var(name).map_err(|source| TokenError::Env {
                name: name.clone(),
                source,
            })?,
        };
        let token = token.trim().to_owned();
        if token.is_empty() {
            return Err(TokenError::Empty(self.clone()));
        }
        let bits = estimated_bits(&token);
        if bits < MIN_TOKEN_BITS {
            return Err(TokenError::Weak {
                from: self.clone(),
                bits: bits as u32,
            });
        }
        Ok(token)
    }
}

/// The least randomness an admin token must have: with guesses at one a second a token of
/// 128 random bits is never found; `hunter2` is.
pub const MIN_TOKEN_BITS: f64 = 128.0;

/// What a token could hold at most: the smaller of its length times the bits of the smallest
/// alphabet of its characters (lower case, upper case, digits, other printable), and twice the
/// Shannon entropy of its characters' frequencies (so `"a"` × 28 or `"a1"` × 16, whose
/// alphabets look rich enough, hold next to nothing). An estimate that errs high: a token
/// refused is surely too weak; a short pattern repeated can still pass.
pub fn estimated_bits(token: &str) -> f64 {
    let mut alphabet = 0u32;
    if token.chars().any(|c| c.is_ascii_lowercase()) {
        alphabet += 26;
    }
    if token.chars().any(|c| c.is_ascii_uppercase()) {
        alphabet += 26;
    }
    if token.chars().any(|c| c.is_ascii_digit()) {
        alphabet += 10;
    }
    if token.chars().any(|c| !c.is_ascii_alphanumeric()) {
        alphabet += 33;
    }
    let length = token.chars().count() as f64;
    let by_alphabet = length * f64::from(alphabet.max(2)).log2();
    let mut counts = std::collections::HashMap::new();
    for c in token.chars() {
        *counts.entry(c).or_insert(0u32) += 1;
    }
    // A random token's measured entropy falls short of its true one (32 hex digits measure
    // about 117 of their 128 bits, 22 base64 characters about 92): hence twice.
    let by_frequency = 2.0
        * counts
            .values()
            .map(|&n| {
                let p = f64::from(n) / length;
                -f64::from(n) * p.log2()
            })
            .sum::<f64>();
    by_alphabet.min(by_frequency)
}

#[cfg(test)]
mod strength_tests {
    use super::*;

    #[test]
    fn weak_tokens_are_told_apart_from_random_ones() {
        assert!(estimated_bits("hunter2") < MIN_TOKEN_BITS);
        assert!(estimated_bits("s3cret") < MIN_TOKEN_BITS);
        assert!(estimated_bits(&"a1".repeat(16)) < MIN_TOKEN_BITS);
        assert!(estimated_bits(&"a".repeat(28)) < MIN_TOKEN_BITS);
        // `openssl rand -hex 16` and `-base64 16`: 128 bits, accepted.
        assert!(estimated_bits("3f9c2a7be1d04c6f8a5e9b2d7c1f0e4a") >= MIN_TOKEN_BITS);
        assert!(estimated_bits("q7Lk2ZpX9vRt4mNc8bWy3A==") >= MIN_TOKEN_BITS);
        assert!(
            estimated_bits("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
                >= MIN_TOKEN_BITS
        );
    }
}
