//! Deduplication: an entry whose key was handled within a window is acknowledged without
//! calling the handler.
//!
//! The key is where an ordering key would be (a stream field, or a JSON pointer into the
//! payload). The host records each key's first entry in Redis, shared by every host of the
//! group (each group has its own record), and forgets it `window` after that first entry was
//! judged; at most `max_keys` new keys are taken per window-long period (past it new
//! keys are not remembered, so about twice that many records live at most).

use std::time::Duration;

use crate::OrderKey;

/// The window when the descriptor says none: a day, as Inngest's event ids.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The shortest window: below a second a key is forgotten before its duplicates are read.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// The longest window: the record is memory, and a key is remembered this long at most.
pub const MAX_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);
/// How many keys a group remembers when the descriptor does not say.
pub const DEFAULT_MAX_KEYS: u64 = 1_000_000;
/// The most keys a group may be told to remember per window (about 180 bytes of Redis memory
/// each).
pub const MAX_KEYS: u64 = 100_000_000;

/// Where an entry's dedupe key is, and how long and how many keys are remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dedupe {
    /// Where the key is.
    pub key: OrderKey,
    /// How long after its first entry was read a key's duplicates are skipped.
    pub window: Duration,
    /// A longer key is no key: the entry is handled and counted (`sluice_dedupe_unkeyed`).
    pub max_key_bytes: usize,
    /// The most new keys taken per window-long period; past it new keys are not
    /// remembered (their entries run, counted `over_max_keys`), known keys still skip their
    /// duplicates.
    pub max_keys: u64,
}

impl Dedupe {
    /// Dedupe on the value of the stream field `name`.
    pub fn field(name: impl Into<String>) -> Self {
        Self::by(OrderKey::Field(name.into()))
    }

    /// Dedupe on the value at the JSON `pointer` (e.g. `/id`) in the payload.
    pub fn payload(pointer: impl Into<String>) -> Self {
        Self::by(OrderKey::Payload(pointer.into()))
    }

    fn by(key: OrderKey) -> Self {
        Self {
            key,
            window: DEFAULT_WINDOW,
            max_key_bytes: crate::order::DEFAULT_MAX_KEY_BYTES,
            max_keys: DEFAULT_MAX_KEYS,
        }
    }

    /// Skip duplicates for this long after a key's first entry.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Take keys up to this many bytes (longer: no key).
    pub fn max_key_bytes(mut self, bytes: usize) -> Self {
        self.max_key_bytes = bytes;
        self
    }

    /// Judge at most this many keyed entries per window-long period (see [`Dedupe::max_keys`]).
    pub fn max_keys(mut self, keys: u64) -> Self {
        self.max_keys = keys;
        self
    }

    /// Refuse settings out of bounds, naming the setting.
    pub fn check(&self, stream: &str) -> Result<(), crate::DescriptorError> {
        let bad = |problem: String| crate::DescriptorError::Dedupe {
            stream: stream.to_owned(),
            problem,
        };
        if let Some(problem) = self.key.problem("dedupe")? {
            return Err(bad(problem));
        }
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&self.window) {
            return Err(bad(format!(
                "the dedupe window must be between 1s and 30 days, not {:?}",
                self.window
            )));
        }
        if self.window.subsec_nanos() != 0 {
            return Err(bad(format!(
                "the dedupe window must be whole seconds, not {:?}",
                self.window
            )));
        }
        if !(1..=crate::order::MAX_KEY_BYTES).contains(&self.max_key_bytes) {
            return Err(bad(format!(
                "dedupe max_key_bytes must be between 1 and {}, not {}",
                crate::order::MAX_KEY_BYTES,
                self.max_key_bytes
            )));
        }
        if !(1..=MAX_KEYS).contains(&self.max_keys) {
            return Err(bad(format!(
                "dedupe max_keys must be between 1 and {MAX_KEYS}, not {}",
                self.max_keys
            )));
        }
        Ok(())
    }

    /// How `sluice check` and the logs say it.
    pub fn describe(&self) -> String {
        format!(
            "{}, window {}s, keys up to {} bytes, at most {} keys",
            self.key.describe(),
            self.window.as_secs(),
            self.max_key_bytes,
            self.max_keys
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_bounds_are_refused_by_name() {
        assert!(Dedupe::field("id").check("s").is_ok());
        let err = |d: Dedupe| d.check("s").unwrap_err().to_string();
        assert!(err(Dedupe::payload("id")).contains("must start with `/`"));
        assert!(err(Dedupe::field("id").window(Duration::from_millis(500))).contains("window"));
        assert!(
            err(Dedupe::field("id").window(Duration::from_millis(1500))).contains("whole seconds")
        );
        assert!(err(Dedupe::field("id").window(MAX_WINDOW * 2)).contains("30 days"));
        assert!(err(Dedupe::field("id").max_keys(0)).contains("max_keys"));
        assert!(err(Dedupe::field("id").max_key_bytes(0)).contains("max_key_bytes"));
        assert!(err(Dedupe::field("sluice-x")).contains("bookkeeping"));
    }
}
