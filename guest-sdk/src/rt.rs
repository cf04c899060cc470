//! The glue between the generated WIT exports and a [`Handle`] implementation. Called only by
//! code that [`crate::export!`] and [`crate::subscriber`] generate.

use std::any::Any;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::__bindings::sluice::handler::types as wit;
use crate::config::Config;
use crate::handler::HandlerOutput;
use crate::outcome::{IntoHandlerResult, Kind};
use crate::{Context, Delivery, FromConfig, Handle, HandlerOutcome, RedisStream};

/// Handle one WIT delivery with `handler`: decode, build state, run, convert the outcome.
pub fn handle<H, In, Outs, Output, Meta, S>(handler: &H, delivery: wit::Delivery) -> wit::Outcome
where
    H: Handle<In, Outs, Output, Meta, S>,
    In: DeserializeOwned,
    Outs: Default,
    Output: HandlerOutput,
    Meta: Default,
    S: FromConfig + Send + Sync + 'static,
{
    crate::log::install();
    let delivery = Delivery::from_wit(delivery);
    let state = state::<S>();
    let input: In = match delivery.decode() {
        Ok(input) => input,
        Err(err) => return to_wit(HandlerOutcome::dead_letter(err.to_string())),
    };
    let outs = Outs::default();
    let mut ctx = Context::new(&delivery, state, Meta::default());
    let outcome = match block_on(handler.handle(&input, &outs, &mut ctx)) {
        Ok(_) => HandlerOutcome::ack(),
        Err(outcome) => outcome,
    };
    to_wit(outcome)
}

/// Turn a `#[subscriber]` function's return value into the trait's `Result`.
pub fn into_result<R: IntoHandlerResult>(value: R) -> Result<(), HandlerOutcome> {
    value.into_handler_result()
}

/// This instance's state, built on first use.
fn state<S: FromConfig + Send + Sync + 'static>() -> &'static S {
    static STATE: OnceLock<Box<dyn Any + Send + Sync>> = OnceLock::new();
    if STATE.get().is_none() {
        match S::from_config(&Config::new()) {
            Ok(state) => {
                let _ = STATE.set(Box::new(state));
            }
            // Trapping fails this attempt; the host logs the message and retries with backoff.
            Err(err) => panic!(
                "handler state {} could not be built: {err}",
                std::any::type_name::<S>()
            ),
        }
    }
    match STATE.get().and_then(|s| s.downcast_ref::<S>()) {
        Some(state) => state,
        None => panic!(
            "handler state is not a {}: export! was used twice in one component",
            std::any::type_name::<S>()
        ),
    }
}

/// Drive a handler's future to completion on `wstd`'s reactor: a future waiting on a timer or
/// a response is parked in `wasi:io/poll` (the instance sleeps in the host) until something
/// it waits for is ready, instead of being polled in a loop.
pub fn block_on<F: Future>(future: F) -> F::Output {
    wstd::runtime::block_on(future)
}

fn millis(d: Duration) -> u64 {
    // Round up so a sub-millisecond delay is still a delay.
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

fn to_wit(outcome: HandlerOutcome) -> wit::Outcome {
    match outcome.0 {
        Kind::Ack => wit::Outcome::Ack,
        Kind::RetryAfter(d) => wit::Outcome::RetryAfter(millis(d)),
        Kind::DownstreamDown(d, reason) => {
            crate::__bindings::sluice::handler::flow::downstream_down(&reason);
            wit::Outcome::RetryAfter(millis(d))
        }
        Kind::DeadLetter(reason) => wit::Outcome::DeadLetter(reason),
    }
}

/// The descriptor's ordering in its WIT form (none: the component is unordered).
pub fn ordered_by(
    d: RedisStream,
) -> Option<crate::__bindings::exports::sluice::handler::ordering::OrderedBy> {
    use crate::__bindings::exports::sluice::handler::ordering as o;
    let ordered = d.ordered_by?;
    Some(o::OrderedBy {
        key: match ordered.key {
            sluice_descriptor::OrderKey::Field(name) => o::OrderKey::Field(name),
            sluice_descriptor::OrderKey::Payload(pointer) => o::OrderKey::Payload(pointer),
        },
        max_in_flight_per_key: ordered.max_in_flight_per_key,
        on_dead_letter: match ordered.on_dead_letter {
            sluice_descriptor::OnDeadLetter::Release => o::OnDeadLetter::Release,
            sluice_descriptor::OnDeadLetter::Hold => o::OnDeadLetter::Hold,
        },
        max_key_bytes: u32::try_from(ordered.max_key_bytes).unwrap_or(u32::MAX),
    })
}

/// The descriptor's effects mode in its WIT form (live when it says nothing).
pub fn effects(d: RedisStream) -> crate::__bindings::exports::sluice::handler::effects::Mode {
    use crate::__bindings::exports::sluice::handler::effects::Mode;
    match d.effects.unwrap_or_default() {
        sluice_descriptor::Effects::Live => Mode::Live,
        sluice_descriptor::Effects::Journal => Mode::Journal,
    }
}

/// The component's descriptor in its WIT form.
pub fn subscription(d: RedisStream) -> wit::Subscription {
    wit::Subscription {
        stream: d.stream,
        group: d.group,
        consumer: d.consumer,
        claim_min_idle_ms: d.claim_min_idle.map(millis),
        block_ms: d.block.map(millis),
        count: d.count.map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
        dead_letter: d.dead_letter,
        max_retries: d.max_retries,
        delayed_retry: d.delayed_retry.map(|r| match r {
            crate::DelayedRetry::DurableZset { key, ttl } => {
                wit::DelayedRetry::DurableZset(wit::DurableZset {
                    key,
                    ttl_ms: ttl.map(millis),
                })
            }
        }),
        payload_field: d.payload_field,
        max_delay_ms: d.max_delay.map(millis),
        failure_backoff: d.failure_backoff.map(|b| wit::Backoff {
            initial_ms: millis(b.initial),
            max_ms: millis(b.max),
        }),
        partitions: d.partitions,
    }
}

/// The descriptor's dedupe in its WIT form (none: the component does not deduplicate).
pub fn dedupe(
    d: RedisStream,
) -> Option<crate::__bindings::exports::sluice::handler::dedupe::DedupeBy> {
    use crate::__bindings::exports::sluice::handler::dedupe as w;
    let dedupe = d.dedupe?;
    Some(w::DedupeBy {
        key: match dedupe.key {
            sluice_descriptor::OrderKey::Field(name) => w::DedupeKey::Field(name),
            sluice_descriptor::OrderKey::Payload(pointer) => w::DedupeKey::Payload(pointer),
        },
        window_s: dedupe.window.as_secs(),
        max_key_bytes: u32::try_from(dedupe.max_key_bytes).unwrap_or(u32::MAX),
        max_keys: dedupe.max_keys,
    })
}
