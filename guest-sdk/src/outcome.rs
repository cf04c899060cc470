//! What a handler answers, and how it becomes the WIT `outcome` the host settles.

use std::time::Duration;

/// The handler's verdict on one delivery.
///
/// The host settles it: `ack` acknowledges the entry, `retry_after` hands it back after the
/// delay (through the subscription's delayed-retry set when it has one), and `dead_letter` moves
/// it to the dead-letter stream with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerOutcome(pub(crate) Kind);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Ack,
    RetryAfter(Duration),
    /// A retry because a downstream is down (the reason).
    DownstreamDown(Duration, String),
    DeadLetter(String),
}

impl HandlerOutcome {
    /// The entry is done: acknowledge it.
    pub fn ack() -> Self {
        Self(Kind::Ack)
    }

    /// Not now: deliver the entry again after `delay`.
    pub fn retry_after(delay: Duration) -> Self {
        Self(Kind::RetryAfter(delay))
    }

    /// Not now, because a downstream is down (a gateway that refuses or times out, a
    /// dependency that is away): deliver the entry again after `delay`, and count the attempt
    /// toward the subscription's circuit breaker, which stops taking entries while the
    /// downstream is away instead of burning their attempts. `reason` goes into the logs.
    pub fn downstream_down(reason: impl Into<String>, delay: Duration) -> Self {
        Self(Kind::DownstreamDown(delay, reason.into()))
    }

    /// Whether this outcome says a downstream is down.
    pub fn is_downstream_down(&self) -> bool {
        matches!(self.0, Kind::DownstreamDown(..))
    }

    /// Give up on the entry: move it to the dead-letter stream with `reason`.
    pub fn dead_letter(reason: impl Into<String>) -> Self {
        Self(Kind::DeadLetter(reason.into()))
    }

    /// Whether this outcome acknowledges the entry.
    pub fn is_ack(&self) -> bool {
        self.0 == Kind::Ack
    }

    /// The requested delay, if this is a retry.
    pub fn retry_delay(&self) -> Option<Duration> {
        match self.0 {
            Kind::RetryAfter(d) | Kind::DownstreamDown(d, _) => Some(d),
            _ => None,
        }
    }

    /// The reason, if this is a dead letter.
    pub fn dead_letter_reason(&self) -> Option<&str> {
        match &self.0 {
            Kind::DeadLetter(reason) => Some(reason),
            _ => None,
        }
    }
}

/// A handler's return value, turned into the `Result` form the [`crate::Handle`] trait uses.
///
/// Implemented for [`HandlerOutcome`] and `Result<(), HandlerOutcome>`, the two return types a
/// `#[subscriber]` function may have.
#[diagnostic::on_unimplemented(
    message = "a #[subscriber] function must return `HandlerOutcome` or `Result<(), HandlerOutcome>`, not `{Self}`",
    label = "this return type is not a handler outcome"
)]
pub trait IntoHandlerResult {
    /// `Ok(())` for an ack, `Err(outcome)` for anything else.
    fn into_handler_result(self) -> Result<(), HandlerOutcome>;
}

impl IntoHandlerResult for HandlerOutcome {
    fn into_handler_result(self) -> Result<(), HandlerOutcome> {
        if self.is_ack() { Ok(()) } else { Err(self) }
    }
}

impl IntoHandlerResult for Result<(), HandlerOutcome> {
    fn into_handler_result(self) -> Result<(), HandlerOutcome> {
        self
    }
}
