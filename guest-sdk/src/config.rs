//! The subscription's configuration values: a read-only string table the host passes to the
//! guest (the `config` table of the subscription in the host's TOML).
//!
//! Keys starting with `sluice.` are set by the host itself (for example `sluice.payload-field`).

#[cfg(target_arch = "wasm32")]
use crate::__bindings::sluice::handler::config as wit;

/// The value of `key`, if the subscription's configuration has it (natively, in a test: the
/// test's values, see [`crate::testing`]).
pub fn get(key: &str) -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    return wit::get(key);
    #[cfg(not(target_arch = "wasm32"))]
    return crate::testing::config_get(key);
}

/// Every key/value pair of the subscription's configuration.
pub fn all() -> Vec<(String, String)> {
    #[cfg(target_arch = "wasm32")]
    return wit::get_all();
    #[cfg(not(target_arch = "wasm32"))]
    return crate::testing::config_all();
}

/// A read-only view of the subscription's configuration, handed to [`crate::FromConfig`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Config(());

impl Config {
    pub(crate) fn new() -> Self {
        Self(())
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<String> {
        get(key)
    }

    /// The value of `key`, or an error naming the missing key.
    pub fn require(&self, key: &str) -> Result<String, String> {
        get(key).ok_or_else(|| format!("config value `{key}` is not set for this subscription"))
    }

    /// The value of `key` parsed as `T`, or `default` when unset; an error names the key and
    /// the bad value.
    pub fn parse_or<T>(&self, key: &str, default: T) -> Result<T, String>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        match get(key) {
            None => Ok(default),
            Some(raw) => raw
                .parse()
                .map_err(|e| format!("config value `{key}` = {raw:?} is invalid: {e}")),
        }
    }
}
