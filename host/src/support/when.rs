//! Times as people read them (RFC 3339, milliseconds), for logs, the CLI, the API and the
//! page. Clamped to the last millisecond of year 9999 first: humantime cannot write later
//! years (its `Display` fails, and `to_string` would panic), and a time read from Redis may be
//! anything another writer left there.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The milliseconds a stream entry id (`<ms>-<seq>`) names, if it is one. Read by hand, not
/// with a string search and `parse`: a canary asks it on every delivery, and the search cost
/// as much as the canary's hash.
pub fn entry_ms(id: &str) -> Option<u64> {
    let mut ms: u64 = 0;
    let mut digits = 0;
    for &b in id.as_bytes() {
        match b {
            b'0'..=b'9' => {
                ms = ms.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
                digits += 1;
            }
            b'-' if digits > 0 => return Some(ms),
            _ => return None,
        }
    }
    None
}

/// The last moment humantime can write.
const LAST: Duration = Duration::from_millis(253_402_300_799_999);

/// `at` as RFC 3339.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at.min(UNIX_EPOCH + LAST)).to_string()
}

/// `ms` since the Unix epoch as RFC 3339 (before the epoch: the epoch).
pub fn rfc3339_ms(ms: i64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

/// This host's clock now, epoch ms (the faked clock in tests of time).
pub fn now_ms() -> i64 {
    crate::support::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_time_past_year_9999_is_written_not_a_panic() {
        assert!(super::rfc3339_ms(i64::MAX).starts_with("9999-12-31"));
        assert_eq!(super::rfc3339_ms(-5), "1970-01-01T00:00:00.000Z");
    }
}
