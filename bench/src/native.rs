//! The `wasm` scenario's work as a native Rust handler, to isolate what WebAssembly costs:
//! decode the same payment-sized JSON payload the fixture component decodes, and ack.

use futures::future::BoxFuture;
use sluice_fixture_control::Control;
use sluice_host::entry::delivery::Delivery;
use sluice_host::entry::outcome::{Failure, Outcome};
use sluice_host::handler::Handler;
use sluice_host::support::digest::Digest;

/// The native handler.
pub struct NativeAck {
    digest: Digest,
}

impl NativeAck {
    pub fn new() -> Self {
        Self {
            digest: Digest::named("native-ack"),
        }
    }
}

impl Handler for NativeAck {
    fn digest(&self) -> &Digest {
        &self.digest
    }

    fn handle<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<Outcome, Failure>> {
        Box::pin(async move {
            let Some(raw) = delivery.entry.field("payload") else {
                return Ok(Outcome::DeadLetter("no payload field".into()));
            };
            Ok(match serde_json::from_slice::<Control>(raw) {
                Ok(Control::Ack) => Outcome::Ack,
                Ok(control) => Outcome::DeadLetter(format!("unexpected control {control}")),
                Err(err) => Outcome::DeadLetter(format!("undecodable payload: {err}")),
            })
        })
    }
}
