//! The decision: what happens to an entry given what its handler answered, how many attempts
//! came before, and the subscription's policy. A pure function, so every rule is unit-tested.
//!
//! | handler result              | attempts left? | decision                                  |
//! |-----------------------------|----------------|-------------------------------------------|
//! | `ack`                       | -              | [`Action::Ack`]                           |
//! | `dead-letter(reason)`       | -              | [`Action::DeadLetter`] with the reason    |
//! | `retry-after(d)`            | yes            | [`Action::Retry`] after `d`, within `min_delay..=max_delay` |
//! | `retry-after(d)`, downstream down | yes      | the same (the circuit breaker counts it)  |
//! | a failure (trap, limit)     | yes            | [`Action::Retry`] after the backoff (at least `min_delay`) |
//! | `retry-after` or a failure  | no             | [`Action::DeadLetter`], reason says why   |
//!
//! A `retry-after` longer than the subscription's `max_delay` is **clamped** to `max_delay`
//! (and reported), not dead-lettered: a handler that asks to wait too long still gets its
//! retry, sooner than it asked. Without a `max_delay` the ceiling is
//! [`MAX_REPRESENTABLE_DELAY`] (~285 years), the longest delay whose due time a
//! sorted-set score holds exactly. A shorter one than `min_delay` (the operator's floor, 1 ms
//! by default) is raised to it: a handler that answers `retry-after(0)` for ever must not turn
//! one entry into a loop that holds a core and Redis busy.

use std::time::Duration;

use sluice_descriptor::Backoff;

/// The longest delay a park accepts: due times must stay integers a sorted-set score (a double)
/// holds exactly, and far enough from 2^53 that adding it to "now" cannot overflow. About 285
/// years; the subscription's `max_delay` is normally much shorter.
pub const MAX_REPRESENTABLE_DELAY: Duration = Duration::from_millis((1 << 53) - (1 << 52));

/// The longest reason or failure cause kept, in bytes. A reason is the guest's own text and
/// goes to Redis, the log and the page with every dead letter: five small entries answered with
/// a 40 MiB reason each once took Redis from 1.3 to 253 MB and the host to 1.28 GB.
pub const MAX_REASON_BYTES: usize = 4096;

/// `text` in at most `max` bytes, with control characters escaped (a guest's text cannot
/// start a forged log line) and cut on a character boundary with a `…[cut]` marker; and
/// whether anything was cut.
pub fn bounded_text(text: &str, max: usize) -> (String, bool) {
    let mut out = String::with_capacity(max.min(text.len()) + 8);
    for c in text.chars() {
        let before = out.len();
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > max {
            out.truncate(before);
            out.push_str("…[cut]");
            return (out, true);
        }
    }
    (out, false)
}

/// What a handler answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done.
    Ack,
    /// Try again after the delay.
    RetryAfter(Duration),
    /// Try again after the delay: a downstream is down (the handler said so through
    /// `flow.downstream-down`), which the circuit breaker counts as a failure.
    DownstreamDown(Duration, String),
    /// Give up, for this reason.
    DeadLetter(String),
}

/// Why an attempt failed without an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The guest trapped (a panic, an out-of-bounds access, an abort).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The handler failed with an error it reported first (a Rust panic, a Python or
    /// JavaScript exception): `error` says what and where in one line, `trace` is the
    /// traceback, when the language has one.
    #[error("handler {error}")]
    Raised {
        /// The short form: "raised ValueError: boom (app.py:12 in handle)".
        error: String,
        /// The traceback, one line per frame, bounded.
        trace: Option<String>,
    },
    /// The delivery ran past its time limit.
    #[error("handler exceeded its time limit of {0:?}")]
    Timeout(Duration),
    /// The guest asked for more memory than its limit.
    #[error("guest hit its memory limit of {limit} bytes (asked for {requested})")]
    MemoryLimit {
        /// The configured cap.
        limit: u64,
        /// What the guest tried to grow to.
        requested: u64,
    },
    /// The delivery burned its whole fuel budget.
    #[error("handler ran out of fuel (budget {0} per delivery)")]
    FuelExhausted(u64),
    /// The guest made the host hold more on its behalf than the subscription allows (resources,
    /// HTTP fields); the message names the limit.
    #[error("guest hit a host limit: {0}")]
    HostLimit(String),
    /// No instance could be created for the delivery.
    #[error("could not instantiate the handler: {0}")]
    Instantiate(String),
}

/// The policy `decide` applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Failed attempts tolerated before dead-lettering.
    pub max_retries: u32,
    /// The delay after a failure.
    pub failure_backoff: Backoff,
    /// The longest delay a retry waits; longer requests are clamped to it.
    pub max_delay: Option<Duration>,
    /// The shortest delay a retry waits; shorter requests (and backoffs) are raised to it.
    pub min_delay: Duration,
    /// The largest entry handed to the handler; larger ones are dead-lettered unhandled.
    pub max_entry_bytes: u64,
    /// A trapping or raising attempt runs once more, offline; the same failure dead-letters.
    pub poison_check: bool,
}

/// A guest's traceback for the log: each line indented under the failure, so none starts where
/// a line of the host's would.
pub fn indented(trace: &str) -> String {
    trace
        .lines()
        .map(|line| format!("    | {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Failure {
    /// The traceback the guest gave with its error, if any.
    pub fn trace(&self) -> Option<&str> {
        match self {
            Failure::Raised { trace, .. } => trace.as_deref(),
            _ => None,
        }
    }
}

impl Policy {
    /// The longest delay a retry may wait under this policy.
    pub fn delay_ceiling(&self) -> Duration {
        self.max_delay
            .unwrap_or(MAX_REPRESENTABLE_DELAY)
            .min(MAX_REPRESENTABLE_DELAY)
    }
}

/// What the host does with the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Acknowledge it.
    Ack,
    /// Hand it back after `delay`; `cause` says why, for the logs.
    Retry {
        /// How long until it comes back.
        delay: Duration,
        /// What caused the retry.
        cause: String,
        /// The delay the handler asked for, when it was longer than the ceiling.
        clamped_from: Option<Duration>,
    },
    /// Move it to the dead-letter stream with the reason, and acknowledge it.
    DeadLetter {
        /// Recorded with the entry: at most [`MAX_REASON_BYTES`], control characters escaped.
        reason: String,
        /// The reason was longer and was cut.
        cut: bool,
    },
}

/// Decide what happens after an attempt, given the attempts that came before it.
pub fn decide(
    result: &Result<Outcome, Failure>,
    previous_attempts: u64,
    policy: &Policy,
) -> Action {
    let (delay, cause) = match result {
        Ok(Outcome::Ack) => return Action::Ack,
        Ok(Outcome::DeadLetter(reason)) => {
            // A dead letter always says why, even when the handler did not.
            if reason.trim().is_empty() {
                return Action::DeadLetter {
                    reason: "the handler dead-lettered the entry without giving a reason"
                        .to_owned(),
                    cut: false,
                };
            }
            let (reason, cut) = bounded_text(reason, MAX_REASON_BYTES);
            return Action::DeadLetter { reason, cut };
        }
        Ok(Outcome::RetryAfter(delay)) => (
            *delay,
            format!("handler asked to retry after {}ms", delay.as_millis()),
        ),
        Ok(Outcome::DownstreamDown(delay, why)) => (
            *delay,
            bounded_text(
                &format!(
                    "downstream down ({why}); handler asked to retry after {}ms",
                    delay.as_millis()
                ),
                MAX_REASON_BYTES,
            )
            .0,
        ),
        Err(failure) => {
            let exponent = u32::try_from(previous_attempts).unwrap_or(u32::MAX);
            let (cause, _) = bounded_text(&failure.to_string(), MAX_REASON_BYTES);
            (policy.failure_backoff.delay(exponent), cause)
        }
    };
    if previous_attempts >= u64::from(policy.max_retries) {
        return Action::DeadLetter {
            reason: format!(
                "max_retries ({}) exhausted after {} attempts; last attempt: {cause}",
                policy.max_retries,
                previous_attempts + 1
            ),
            cut: false,
        };
    }
    let ceiling = policy.delay_ceiling();
    let clamped_from = (delay > ceiling).then_some(delay);
    Action::Retry {
        delay: delay.max(policy.min_delay).min(ceiling),
        cause,
        clamped_from,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        max_retries: 2,
        failure_backoff: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        },
        max_delay: None,
        min_delay: Duration::from_millis(1),
        max_entry_bytes: u64::MAX,
        poison_check: false,
    };

    #[test]
    fn ack_and_dead_letter_pass_through() {
        assert_eq!(decide(&Ok(Outcome::Ack), 9, &POLICY), Action::Ack);
        assert_eq!(
            decide(&Ok(Outcome::DeadLetter("bad".into())), 0, &POLICY),
            Action::DeadLetter {
                reason: "bad".into(),
                cut: false,
            }
        );
    }

    #[test]
    fn a_reason_is_bounded_and_cannot_forge_log_lines() {
        let huge = "x".repeat(40 << 20);
        let Action::DeadLetter { reason, cut } = decide(&Ok(Outcome::DeadLetter(huge)), 0, &POLICY)
        else {
            panic!("expected a dead letter");
        };
        assert!(cut);
        assert!(
            reason.len() <= MAX_REASON_BYTES + "…[cut]".len(),
            "{}",
            reason.len()
        );
        assert!(reason.ends_with("…[cut]"));
        // Escapes count towards the bound: a reason of control characters is cut too.
        let (escaped, cut) = bounded_text(&"\u{1b}".repeat(4096), MAX_REASON_BYTES);
        assert!(cut && escaped.len() <= MAX_REASON_BYTES + "…[cut]".len());
        assert_eq!(bounded_text("a\nb", 100), ("a\\nb".to_owned(), false));
        assert_eq!(bounded_text("ééé", 3), ("é…[cut]".to_owned(), true));
        assert_eq!(bounded_text("ééé", 6), ("ééé".to_owned(), false));
        let failure = Err(Failure::Trap("y".repeat(1 << 20)));
        let Action::Retry { cause, .. } = decide(&failure, 0, &POLICY) else {
            panic!("expected a retry");
        };
        assert!(cause.len() <= MAX_REASON_BYTES + "…[cut]".len());
    }

    #[test]
    fn a_dead_letter_without_a_reason_gets_one() {
        let Action::DeadLetter { reason, .. } =
            decide(&Ok(Outcome::DeadLetter(" ".into())), 0, &POLICY)
        else {
            panic!("expected a dead letter");
        };
        assert!(reason.contains("without giving a reason"), "{reason}");
    }

    #[test]
    fn retry_keeps_the_requested_delay_until_retries_run_out() {
        let retry = Ok(Outcome::RetryAfter(Duration::from_secs(30)));
        assert!(matches!(
            decide(&retry, 1, &POLICY),
            Action::Retry { delay, .. } if delay == Duration::from_secs(30)
        ));
        let Action::DeadLetter { reason, .. } = decide(&retry, 2, &POLICY) else {
            panic!("expected a dead letter");
        };
        assert!(reason.contains("max_retries (2)"), "{reason}");
        assert!(reason.contains("3 attempts"), "{reason}");
    }

    #[test]
    fn delays_over_the_ceiling_are_clamped() {
        let capped = Policy {
            max_delay: Some(Duration::from_secs(60)),
            ..POLICY
        };
        let huge = Ok(Outcome::RetryAfter(Duration::from_millis(u64::MAX)));
        assert_eq!(
            decide(&huge, 0, &capped),
            Action::Retry {
                delay: Duration::from_secs(60),
                cause: format!("handler asked to retry after {}ms", u64::MAX),
                clamped_from: Some(Duration::from_millis(u64::MAX)),
            }
        );
        let Action::Retry {
            delay,
            clamped_from,
            ..
        } = decide(&huge, 0, &POLICY)
        else {
            panic!("expected a retry");
        };
        assert_eq!(delay, MAX_REPRESENTABLE_DELAY);
        assert!(clamped_from.is_some());
        // A due time this far out is still an integer a double holds exactly.
        let due = 1_800_000_000_000u64 + delay.as_millis() as u64;
        assert_eq!(due as f64 as u64, due);
        let short = Ok(Outcome::RetryAfter(Duration::from_secs(1)));
        assert!(matches!(
            decide(&short, 0, &capped),
            Action::Retry { clamped_from: None, delay, .. } if delay == Duration::from_secs(1)
        ));
    }

    #[test]
    fn a_retry_at_once_waits_at_least_the_floor() {
        let now = Ok(Outcome::RetryAfter(Duration::ZERO));
        assert!(matches!(
            decide(&now, 0, &POLICY),
            Action::Retry { delay, clamped_from: None, .. } if delay == Duration::from_millis(1)
        ));
        let floor = Policy {
            min_delay: Duration::from_millis(250),
            failure_backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(10),
            },
            ..POLICY
        };
        let trap = Err(Failure::Trap("x".into()));
        assert!(matches!(
            decide(&trap, 0, &floor),
            Action::Retry { delay, .. } if delay == Duration::from_millis(250)
        ));
    }

    #[test]
    fn failures_back_off_exponentially() {
        let trap = Err(Failure::Trap("unreachable".into()));
        assert!(matches!(
            decide(&trap, 0, &POLICY),
            Action::Retry { delay, .. } if delay == Duration::from_millis(100)
        ));
        assert!(matches!(
            decide(&trap, 1, &POLICY),
            Action::Retry { delay, .. } if delay == Duration::from_millis(200)
        ));
        let Action::DeadLetter { reason, .. } = decide(&trap, 2, &POLICY) else {
            panic!("expected a dead letter");
        };
        assert!(reason.contains("guest trapped: unreachable"), "{reason}");
    }
}
