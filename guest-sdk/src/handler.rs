//! The [`Handle`] trait, the per-delivery [`Context`], and the per-instance [`State`].
//!
//! The host reuses a component instance for many deliveries (unless the subscription asks for
//! `isolation = "per-delivery"`), so the state is built once per instance with [`FromConfig`]
//! and shared by every delivery that instance handles.

use std::future::Future;

use crate::{Delivery, HandlerOutcome, config::Config};

/// A handler for entries whose payload decodes into `In`.
///
/// The type parameters, in order: the payload type `In`; `Outs`, the per-delivery outputs the
/// handler is given (`()` for none); `Output`, the success value (`()`, settled as an ack);
/// `Meta`, an extension carried in the [`Context`] (`()` for none); and `S`, the per-instance
/// state built with [`FromConfig`].
///
/// Return `Ok(())` to acknowledge the entry, or `Err(outcome)` to retry it later or
/// dead-letter it.
pub trait Handle<In, Outs = (), Output = (), Meta = (), S = ()> {
    /// Handle one delivery.
    fn handle(
        &self,
        input: &In,
        outs: &Outs,
        ctx: &mut Context<'_, Meta, S>,
    ) -> impl Future<Output = Result<Output, HandlerOutcome>>;
}

/// What a handler can see besides its payload: the delivery itself, the instance's state and
/// the subscription's configuration.
pub struct Context<'a, Meta = (), S = ()> {
    delivery: &'a Delivery,
    state: &'a S,
    meta: Meta,
}

impl<'a, Meta, S> Context<'a, Meta, S> {
    pub(crate) fn new(delivery: &'a Delivery, state: &'a S, meta: Meta) -> Self {
        Self {
            delivery,
            state,
            meta,
        }
    }

    /// The entry being handled, with all its fields.
    pub fn delivery(&self) -> &Delivery {
        self.delivery
    }

    /// How many times this entry was parked and re-added before: 0 on first delivery.
    pub fn retry_count(&self) -> u32 {
        self.delivery.retry_count
    }

    /// The state built once for this instance.
    pub fn state(&self) -> &S {
        self.state
    }

    /// The context's extension value.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The context's extension value, mutably.
    pub fn meta_mut(&mut self) -> &mut Meta {
        &mut self.meta
    }

    /// The subscription's configuration.
    pub fn config(&self) -> Config {
        Config::new()
    }
}

/// The per-instance state, as a `#[subscriber]` function receives it: `State(gateway):
/// State<PaymentGateway>`. The value is cloned for each delivery, so keep large state behind an
/// `Arc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct State<S>(pub S);

/// How per-instance state is built from the subscription's configuration. It runs once per
/// instance, before its first delivery; an error fails that delivery (it is retried with the
/// subscription's failure backoff) and is logged with the message.
pub trait FromConfig: Sized {
    /// Build the state.
    fn from_config(config: &Config) -> Result<Self, String>;
}

impl FromConfig for () {
    fn from_config(_: &Config) -> Result<Self, String> {
        Ok(())
    }
}

/// The success value of a handler; only `()` (an ack) is supported today. Sealed: the host's
/// world has no other success value, so no other type can stand here.
pub trait HandlerOutput: sealed::Sealed {}
impl HandlerOutput for () {}

mod sealed {
    /// Keeps [`super::HandlerOutput`] to the types this crate lists.
    pub trait Sealed {}
    impl Sealed for () {}
}
