//! The host's wall clock: the one place the process reads it, so a test can move it.
//!
//! Whatever hosts must agree on (when a retry is due, how late it came back) is measured on
//! Redis's clock, never on this one; this clock only stamps what people read (the page, the
//! journal, spans, pause records). The tests prove that by running hosts whose clocks are hours
//! apart. libfaketime cannot move the clock of a static binary (the image's, which the tests
//! run), so the move is read here, once, from [`SKEW_VAR`] (`+2h`, `-90s`), and clippy's
//! `disallowed-methods` (host/clippy.toml) keeps `SystemTime::now` out of the rest of the crate.
//! Unset, it costs one load of an initialised cell per read.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable that moves this process's wall clock (a test seam: `+2h`, `-30m`).
pub const SKEW_VAR: &str = "SLUICE_CLOCK_SKEW";

/// How far the clock is moved: ahead (`true`) or behind, by how much.
type Skew = Option<(bool, Duration)>;

fn skew() -> Skew {
    static SKEW: OnceLock<Skew> = OnceLock::new();
    *SKEW.get_or_init(|| std::env::var(SKEW_VAR).ok().and_then(|v| parse_skew(&v)))
}

/// `+2h` / `-90s` (humantime durations with a sign); anything else moves nothing.
fn parse_skew(value: &str) -> Skew {
    let (ahead, rest) = match value.trim().split_at_checked(1)? {
        ("+", rest) => (true, rest),
        ("-", rest) => (false, rest),
        _ => return None,
    };
    humantime::parse_duration(rest.trim())
        .ok()
        .map(|d| (ahead, d))
}

/// What the clock is moved by, as set, for the start-up log (`None`: not moved).
pub fn skew_note() -> Option<String> {
    skew().map(|(ahead, by)| {
        format!(
            "{}{}",
            if ahead { "+" } else { "-" },
            humantime::format_duration(by)
        )
    })
}

/// Now, on this host's wall clock.
#[allow(clippy::disallowed_methods)] // the one read the lint points everything else to
pub fn now() -> SystemTime {
    let now = SystemTime::now();
    match skew() {
        None => now,
        Some((true, by)) => now.checked_add(by).unwrap_or(now),
        Some((false, by)) => now.checked_sub(by).unwrap_or(UNIX_EPOCH),
    }
}

/// Now, to stamp or age a file: the kernel's clock, never moved, since it stamps the files
/// such a time is compared with (the compile caches' last use).
#[allow(clippy::disallowed_methods)] // file times are the kernel's, not the host's wall clock
pub fn file_now() -> SystemTime {
    SystemTime::now()
}

/// Now, in milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> u64 {
    now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skew_has_a_sign_and_a_duration() {
        assert_eq!(parse_skew("+2h"), Some((true, Duration::from_secs(7200))));
        assert_eq!(parse_skew(" -90s "), Some((false, Duration::from_secs(90))));
        for bad in ["2h", "+", "", "+two hours", "*1h"] {
            assert_eq!(parse_skew(bad), None, "{bad:?}");
        }
    }
}
