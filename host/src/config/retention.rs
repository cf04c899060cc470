//! What a subscription keeps in Redis, and for how long: the stream's `retention` (what every
//! group has acknowledged), the dead letters' `dead_letter_retention` and `dead_letter_maxlen`,
//! and how many entries' histories (`history_entries`).

use std::time::Duration;

use super::check::Validator;
use super::raw::{RawDeadLetterRetention, RawRetention};
use super::{ConfigError, DEFAULT_KEEP_ACKED, DEFAULT_RETENTION_EVERY, Retention};

/// The most entries' histories a subscription may keep: about 5 GiB of Redis at the most.
const MAX_HISTORY_ENTRIES: u64 = 1_000_000;

/// `retention = { keep_acked, max_len, every }`: a cap of at least 1 when set, a run interval
/// longer than zero.
pub(super) fn retention(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    r: &RawRetention,
) -> Result<Retention, ConfigError> {
    Ok(Retention {
        keep_acked: v
            .opt_duration(&key("retention.keep_acked"), &r.keep_acked)?
            .unwrap_or(DEFAULT_KEEP_ACKED),
        max_len: match r.max_len {
            Some(0) => {
                return Err(v.invalid(
                    &key("retention.max_len"),
                    "0",
                    "must be at least 1 (leave it out for no cap)",
                ));
            }
            other => other,
        },
        every: match &r.every {
            Some(text) => v.positive(&key("retention.every"), text, "(leave it out for 10s)")?,
            None => DEFAULT_RETENTION_EVERY,
        },
    })
}

/// `dead_letter_retention = { keep }`: how long dead letters stay, longer than zero.
pub(super) fn dead_letter_keep(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    r: &RawDeadLetterRetention,
) -> Result<Duration, ConfigError> {
    v.positive(
        &key("dead_letter_retention.keep"),
        &r.keep,
        "(leave dead_letter_retention out to keep dead letters for ever)",
    )
}

/// `dead_letter_maxlen`: at least 1 when set.
pub(super) fn dead_letter_maxlen(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    maxlen: Option<u64>,
) -> Result<Option<u64>, ConfigError> {
    match maxlen {
        Some(0) => Err(v.invalid(
            &key("dead_letter_maxlen"),
            "0",
            "must be at least 1 (leave it out to never trim)",
        )),
        other => Ok(other),
    }
}

/// `history_entries`: at most [`MAX_HISTORY_ENTRIES`] (0 turns the history off).
pub(super) fn history_entries(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    entries: Option<u64>,
) -> Result<Option<u32>, ConfigError> {
    match entries {
        Some(n) if n > MAX_HISTORY_ENTRIES => Err(v.invalid(
            &key("history_entries"),
            &n.to_string(),
            &format!("must be at most {MAX_HISTORY_ENTRIES} (0 turns the history off)"),
        )),
        other => Ok(other.map(|n| n as u32)),
    }
}
