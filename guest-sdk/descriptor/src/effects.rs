//! What happens to a handler's outbound calls when an entry is attempted again.

/// How a subscription's outbound calls are kept between attempts of one entry.
///
/// Every call carries an idempotency key either way (the same for the same call of the same
/// entry on every attempt); the journal also records each answered call in Redis, so a later
/// attempt that makes the same call again gets the recorded answer without the network: a
/// charge that went through before a crash is not asked for again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Effects {
    /// Every attempt makes its calls over the network (the default).
    #[default]
    Live,
    /// Record each call's answer and replay it on later attempts of the same entry.
    Journal,
}
