//! The bank example's work as a native Rust handler, to isolate what WebAssembly costs: decode
//! the payment from JSON and charge it through the same simulated gateway.

use std::time::Duration;

use bank_payments_model::{Payment, PaymentGateway, RECHECK};
use futures::future::BoxFuture;
use sluice_host::delivery::Delivery;
use sluice_host::dispatch::Handler;
use sluice_host::outcome::{Failure, Outcome};

/// The native bank handler.
pub struct NativeBank {
    gateway: PaymentGateway,
}

impl NativeBank {
    pub fn new() -> Self {
        Self {
            gateway: PaymentGateway {
                slow_above_cents: 100_000,
                slow_for: Duration::from_secs(10),
            },
        }
    }
}

impl Handler for NativeBank {
    fn digest(&self) -> &str {
        "native-bank"
    }

    fn handle<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<Outcome, Failure>> {
        Box::pin(async move {
            let Some(raw) = delivery.entry.field("payload") else {
                return Ok(Outcome::DeadLetter("no payload field".into()));
            };
            let payment: Payment = match serde_json::from_slice(raw) {
                Ok(payment) => payment,
                Err(err) => return Ok(Outcome::DeadLetter(format!("undecodable payload: {err}"))),
            };
            Ok(match self.gateway.charge(&payment).await {
                Ok(()) => Outcome::Ack,
                Err(_) => Outcome::RetryAfter(RECHECK),
            })
        })
    }
}
