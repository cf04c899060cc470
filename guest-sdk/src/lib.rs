//! Write Sluice handlers: functions that handle Redis Streams entries,
//! compiled to WebAssembly components (`wasm32-wasip2`) and run by the Sluice host.
//!
//! A handler is either a function under the [`subscriber`] attribute, which names the
//! subscription with a [`RedisStream`] descriptor:
//!
//! ```ignore
//! use sluice_guest::prelude::*;
//!
//! #[subscriber(
//!     RedisStream::new("bank-payments")
//!         .group("billing")
//!         .delayed_retry(DelayedRetry::DurableZset {
//!             key: "bank-payments.delayed".to_owned(),
//!             ttl: None,
//!         })
//! )]
//! async fn charge_bank(payment: &Payment, State(gateway): State<PaymentGateway>) -> HandlerOutcome {
//!     match gateway.charge(payment).await {
//!         Ok(()) => HandlerOutcome::ack(),
//!         Err(_) => HandlerOutcome::retry_after(Duration::from_secs(30)),
//!     }
//! }
//! ```
//!
//! or a type implementing [`Handle`], registered with [`export!`] together with a function that
//! returns its descriptor. The attribute is sugar over the trait.
//!
//! How a delivery flows through a guest:
//! - [`delivery`]: the entry as the host hands it over, and how its payload is decoded (JSON in
//!   the `payload` field by default; an entry whose payload does not decode is dead-lettered with
//!   a reason naming the field and the serde error, never acked silently);
//! - [`handler`]: the [`Handle`] trait, its [`Context`], per-instance [`State`] and [`export!`];
//! - [`outcome`]: what the handler answers: ack, retry after a delay, or dead-letter;
//! - [`config`], logging and [`http`]: the only things a handler can reach in the host.
//!   `tracing` events emitted by the handler go into the host's logs, inside the delivery's
//!   span; HTTP requests reach only the hosts the subscription's `allowed_outbound_hosts` grants.
//! - [`time`]: waiting without spinning.
//! - `testing` (natively, for `cargo test`): a made-up delivery run through a handler without a
//!   host or Redis.
//!
//! An `async` handler runs on a real reactor (`wstd`'s, over `wasi:io/poll`): `.await` on a
//! timer or a response suspends the instance in the host until it is ready, and futures joined
//! together (`futures::join!`, `futures_lite::future::zip`) wait at the same time, so two
//! 300 ms requests joined take ~300 ms.

#![deny(missing_docs)]

pub mod config;
pub mod delivery;
pub mod handler;
pub mod http;
mod log;
pub mod outcome;
#[doc(hidden)]
pub mod rt;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod time;
pub mod trace;

pub use delivery::{DecodeError, Delivery};
pub use handler::{Context, FromConfig, Handle, State};
pub use outcome::HandlerOutcome;
pub use sluice_descriptor::{
    Backoff, Dedupe, DelayedRetry, Effects, OnDeadLetter, OrderKey, OrderedBy, RedisStream,
};
pub use sluice_guest_macros::subscriber;

/// Everything a handler file usually needs, in one `use`.
pub mod prelude {
    pub use crate::{
        Backoff, Context, Dedupe, DelayedRetry, Delivery, Effects, FromConfig, Handle,
        HandlerOutcome, OrderedBy, RedisStream, State, subscriber,
    };
    pub use std::time::Duration;
}

/// Bindings generated from `wit/sluice.wit`; an implementation detail of [`export!`].
#[doc(hidden)]
#[allow(missing_docs, unsafe_code, clippy::all)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "handler-ordered",
        pub_export_macro: true,
        export_macro_name: "__export_world",
        default_bindings_module: "sluice_guest::__bindings",
    });
}

/// Export a [`Handle`] implementation and its subscription descriptor as this component's
/// handler. Use it once per component:
///
/// ```ignore
/// sluice_guest::export!(ChargeBank, bank_payments);
/// ```
///
/// The first argument is a value of the handler type, the second a function returning the
/// [`RedisStream`] descriptor.
#[macro_export]
macro_rules! export {
    ($handler:expr, $descriptor:path $(,)?) => {
        const _: () = {
            struct __SluiceComponent;

            impl $crate::__bindings::Guest for __SluiceComponent {
                fn handle(
                    delivery: $crate::__bindings::sluice::handler::types::Delivery,
                ) -> $crate::__bindings::sluice::handler::types::Outcome {
                    $crate::rt::handle(&$handler, delivery)
                }

                fn subscription() -> $crate::__bindings::sluice::handler::types::Subscription {
                    $crate::rt::subscription($descriptor())
                }
            }

            impl $crate::__bindings::exports::sluice::handler::ordering::Guest for __SluiceComponent {
                fn ordering() -> Option<
                    $crate::__bindings::exports::sluice::handler::ordering::OrderedBy,
                > {
                    $crate::rt::ordered_by($descriptor())
                }
            }

            impl $crate::__bindings::exports::sluice::handler::effects::Guest for __SluiceComponent {
                fn effects() -> $crate::__bindings::exports::sluice::handler::effects::Mode {
                    $crate::rt::effects($descriptor())
                }
            }

            impl $crate::__bindings::exports::sluice::handler::dedupe::Guest for __SluiceComponent {
                fn dedupe() -> Option<$crate::__bindings::exports::sluice::handler::dedupe::DedupeBy> {
                    $crate::rt::dedupe($descriptor())
                }
            }

    $crate::__bindings::__export_world!(__SluiceComponent with_types_in $crate::__bindings);
        };
    };
}
