//! The rule a canary is judged by, on the host's side: the [`Thresholds`] its record carries
//! (so every host judges by the same numbers, whatever its own configuration says) and the
//! confidence of the bounds, handed to `lua/canary_report.lua`, which applies them to the
//! group's totals (see the header of [`super`]).

use redis::ScriptInvocation;

/// The z of the bounds a canary is judged by at its window's end: one-sided 99 %.
const Z_END: f64 = 2.326;
/// The z during the window, where the counts are judged at every report (hundreds of looks):
/// one-sided 99.95 %, so that an equal candidate is not rolled back by one unlucky look.
const Z_WINDOW: f64 = 3.29;

/// How a canary is judged, as its record carries it: every host judges by the same numbers,
/// whatever its own configuration says.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Thresholds {
    /// See [`crate::config::Canary::failure_rate_increase`].
    pub failure_rate_increase: f64,
    /// See [`crate::config::Canary::dead_letter_rate_increase`].
    pub dead_letter_rate_increase: f64,
    /// See [`crate::config::Canary::retry_rate_increase`].
    pub retry_rate_increase: f64,
    /// See [`crate::config::Canary::p99_ratio`].
    pub p99_ratio: f64,
    /// See [`crate::config::Canary::p99_slack`], in milliseconds.
    pub p99_slack_ms: u64,
    /// See [`crate::config::Canary::min_deliveries`].
    pub min_deliveries: u64,
}

impl From<&crate::config::Canary> for Thresholds {
    fn from(c: &crate::config::Canary) -> Self {
        Self {
            failure_rate_increase: c.failure_rate_increase,
            dead_letter_rate_increase: c.dead_letter_rate_increase,
            retry_rate_increase: c.retry_rate_increase,
            p99_ratio: c.p99_ratio,
            p99_slack_ms: u64::try_from(c.p99_slack.as_millis()).unwrap_or(u64::MAX),
            min_deliveries: c.min_deliveries,
        }
    }
}

impl Thresholds {
    /// Add the rule to the judging script's arguments, in its order: the thresholds (the p99
    /// slack in microseconds), then the bounds' z during the window and at its end.
    pub(super) fn add_to(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg(self.failure_rate_increase)
            .arg(self.dead_letter_rate_increase)
            .arg(self.retry_rate_increase)
            .arg(self.p99_ratio)
            .arg(self.p99_slack_ms.saturating_mul(1000))
            .arg(self.min_deliveries)
            .arg(Z_WINDOW)
            .arg(Z_END);
    }
}
