//! The pause between attempts to reach Redis again ([`ReconnectBackoff`]): capped and
//! exponential, so a Redis that is down is not hammered and one that is back is found soon.

use std::time::Duration;

/// The first and the largest pause between reconnection attempts.
pub const RECONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(5));

/// Capped exponential backoff between attempts to reach Redis again.
#[derive(Debug, Clone)]
pub struct ReconnectBackoff {
    next: Duration,
}

impl Default for ReconnectBackoff {
    fn default() -> Self {
        Self {
            next: RECONNECT_BACKOFF.0,
        }
    }
}

impl ReconnectBackoff {
    /// The pause before the next attempt; each call doubles it up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(RECONNECT_BACKOFF.1);
        delay
    }

    /// Start over after a success.
    pub fn reset(&mut self) {
        self.next = RECONNECT_BACKOFF.0;
    }
}
