//! Handler unit tests without a host or Redis: a made-up delivery run through a handler
//! natively (`cargo test`), the way the host would run it: the payload decoded as the host
//! hands it over (a payload that does not decode is dead-lettered, as in production), the
//! handler's state built from the config values the test gives, and its outcome returned.
//!
//! ```ignore
//! #[cfg(test)]
//! mod tests {
//!     use super::*;
//!     use sluice_guest::testing::{handler, TestDelivery};
//!
//!     #[test]
//!     fn a_first_attempt_is_acked() {
//!         let outcome = TestDelivery::json(r#"{"id": "1"}"#).run(&handler!(handle));
//!         assert!(outcome.is_ack(), "{outcome:?}");
//!     }
//! }
//! ```
//!
//! `handler!(name)` names the handler a `#[subscriber]` function `name` defines; a type that
//! implements [`Handle`] is passed as it is. Natively there is no host: config values come
//! from [`TestDelivery::config`], [`crate::time::sleep`] sleeps the test's thread, and
//! [`crate::http`] requests fail with a message that says so. To run the real component in
//! its sandbox, with its grants, HTTP included, use `sluice test` and a JSON fixture.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};

use serde::de::DeserializeOwned;
use sluice_descriptor::{DEFAULT_PAYLOAD_FIELD, PAYLOAD_FIELD_CONFIG_KEY};

use crate::config::Config;
use crate::handler::HandlerOutput;
use crate::{Context, Delivery, FromConfig, Handle, HandlerOutcome};

pub use sluice_guest_macros::handler;

thread_local! {
    /// The config values of the test running on this thread (natively, the host's table).
    static CONFIG: RefCell<Vec<(String, String)>> = const { RefCell::new(Vec::new()) };
}

/// The value of `key` in the running test's config (natively; see [`crate::config::get`]).
pub(crate) fn config_get(key: &str) -> Option<String> {
    CONFIG.with(|c| {
        c.borrow()
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    })
}

/// Every value of the running test's config.
pub(crate) fn config_all() -> Vec<(String, String)> {
    CONFIG.with(|c| c.borrow().clone())
}

/// A made-up delivery: the payload, other fields, which attempt it is, and the config values
/// the handler reads.
#[derive(Debug, Clone)]
pub struct TestDelivery {
    delivery: Delivery,
    config: Vec<(String, String)>,
}

impl TestDelivery {
    /// A first delivery of an entry whose payload field holds `json` (any text: an invalid
    /// one tries the dead-letter path).
    pub fn json(json: &str) -> Self {
        Self::payload(json.as_bytes())
    }

    /// A first delivery of an entry whose payload field holds `bytes`.
    pub fn payload(bytes: &[u8]) -> Self {
        Self {
            delivery: Delivery {
                stream: "test".to_owned(),
                group: "test".to_owned(),
                id: "1-0".to_owned(),
                fields: vec![(DEFAULT_PAYLOAD_FIELD.to_owned(), bytes.to_vec())],
                retry_count: 0,
                delivery_count: 1,
                origin_id: "1-0".to_owned(),
            },
            config: Vec::new(),
        }
    }

    /// Add a field after the payload.
    pub fn field(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let value = value.as_ref().to_vec();
        self.delivery.fields.push((name.to_owned(), value));
        self
    }

    /// How many times the entry was parked and came back.
    pub fn retry_count(mut self, n: u32) -> Self {
        self.delivery.retry_count = n;
        self
    }

    /// How many times Redis delivered this entry id (from 1).
    pub fn delivery_count(mut self, n: u64) -> Self {
        self.delivery.delivery_count = n.max(1);
        self
    }

    /// The stream and group it was read from.
    pub fn from(mut self, stream: &str, group: &str) -> Self {
        self.delivery.stream = stream.to_owned();
        self.delivery.group = group.to_owned();
        self
    }

    /// A config value the handler reads (as the subscription's `config` table would give it).
    pub fn config(mut self, key: &str, value: &str) -> Self {
        self.config.retain(|(k, _)| k != key);
        self.config.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The delivery as the handler sees it.
    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    /// Run `handler` on it as the host would (decode, state, handle) and return its answer.
    pub fn run<H, In, Outs, Output, Meta, S>(&self, handler: &H) -> HandlerOutcome
    where
        H: Handle<In, Outs, Output, Meta, S>,
        In: DeserializeOwned,
        Outs: Default,
        Output: HandlerOutput,
        Meta: Default,
        S: FromConfig,
    {
        let _config = TestConfig::set(self.config.clone());
        let field = config_get(PAYLOAD_FIELD_CONFIG_KEY);
        let field = field.as_deref().unwrap_or(DEFAULT_PAYLOAD_FIELD);
        let input: In = match self.delivery.decode_field(field) {
            Ok(input) => input,
            Err(err) => return HandlerOutcome::dead_letter(err.to_string()),
        };
        let state = match S::from_config(&Config::new()) {
            Ok(state) => state,
            Err(err) => panic!(
                "handler state {} could not be built from the test's config: {err}",
                std::any::type_name::<S>()
            ),
        };
        let outs = Outs::default();
        let mut ctx = Context::new(&self.delivery, &state, Meta::default());
        match block_on(handler.handle(&input, &outs, &mut ctx)) {
            Ok(_) => HandlerOutcome::ack(),
            Err(outcome) => outcome,
        }
    }
}

/// A test's config values on this thread while it runs; the ones before are back after, a
/// panic included.
struct TestConfig(Vec<(String, String)>);

impl TestConfig {
    fn set(values: Vec<(String, String)>) -> Self {
        Self(CONFIG.with(|c| c.replace(values)))
    }
}

impl Drop for TestConfig {
    fn drop(&mut self) {
        let before = std::mem::take(&mut self.0);
        CONFIG.with(|c| c.replace(before));
    }
}

/// Wakes the test's thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Drive `future` to its end on this thread (natively there is no reactor: a handler's
/// futures are ready or wake this thread themselves).
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = TaskContext::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
