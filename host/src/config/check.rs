//! The checking of single values: text turned into durations and sizes within their bounds,
//! and the error that names the file, the key (`subscription[0].block`) and the value as
//! written. Every other step of reading a file checks its values through a [`Validator`].

use std::path::Path;
use std::time::Duration;

use sluice_descriptor::MAX_DURATION;

use super::ConfigError;

/// Turns text values into typed ones, naming the file and key when one is wrong.
pub(super) struct Validator<'a> {
    /// The file being read, named in every error.
    pub(super) path: &'a Path,
}

impl Validator<'_> {
    /// The error for `key` = `value`: it is not valid, for `reason`.
    pub(super) fn invalid(&self, key: &str, value: &str, reason: &str) -> ConfigError {
        ConfigError::Value {
            path: self.path.to_owned(),
            key: key.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// A size like `"64MiB"`, in bytes.
    pub(super) fn size(&self, key: &str, value: &str) -> Result<u64, ConfigError> {
        value
            .parse::<bytesize::ByteSize>()
            .map(|s| s.as_u64())
            .map_err(|e: String| self.invalid(key, value, &e))
    }

    /// A size of at least `floor` bytes; `floor_text` says it in the error.
    pub(super) fn size_at_least(
        &self,
        key: &str,
        value: &str,
        floor: u64,
        floor_text: &str,
    ) -> Result<u64, ConfigError> {
        let size = self.size(key, value)?;
        if size < floor {
            return Err(self.invalid(key, value, &format!("must be at least {floor_text}")));
        }
        Ok(size)
    }

    /// A duration of at most [`MAX_DURATION`]: every deadline computed from it fits a clock.
    pub(super) fn duration(&self, key: &str, value: &str) -> Result<Duration, ConfigError> {
        let duration = humantime::parse_duration(value).map_err(|e| {
            self.invalid(
                key,
                value,
                &format!("{e} (write durations like \"500ms\", \"30s\" or \"1h\")"),
            )
        })?;
        if duration > MAX_DURATION {
            let most = format!(
                "is longer than the most any duration may be ({} days)",
                MAX_DURATION.as_secs() / 86_400
            );
            return Err(self.invalid(key, value, &most));
        }
        Ok(duration)
    }

    /// [`Self::duration`] of a key that may be left out.
    pub(super) fn opt_duration(
        &self,
        key: &str,
        value: &Option<String>,
    ) -> Result<Option<Duration>, ConfigError> {
        value.as_deref().map(|s| self.duration(key, s)).transpose()
    }

    /// A duration that must be longer than zero; `alternative` names what else may be written.
    pub(super) fn positive(
        &self,
        key: &str,
        value: &str,
        alternative: &str,
    ) -> Result<Duration, ConfigError> {
        let duration = self.duration(key, value)?;
        if duration.is_zero() {
            let reason = format!("must be longer than 0 {alternative}");
            return Err(self.invalid(key, value, reason.trim_end()));
        }
        Ok(duration)
    }
}
