//! The bank-payments handler, macro form: it charges each payment at the payment gateway over
//! HTTP; a payment the gateway timed out on waits in the `bank-payments.delayed` sorted set for
//! 30 seconds, then comes back and is charged again. A declined charge is dead-lettered.
//!
//! Build with: `cargo build --release --target wasm32-wasip2 -p bank-payments`
//! Run with:   `scripts/demo` (or `sluice run examples/bank-payments/sluice.toml`)

use bank_payments_model::{Payment, PaymentGateway, RECHECK};
use sluice_guest::prelude::*;

/// The delay waits in the `bank-payments.delayed` sorted set in Redis, and the subscription puts
/// the entry back on `bank-payments` once it is due.
#[subscriber(
    RedisStream::new("bank-payments")
        .group("billing")
        .delayed_retry(DelayedRetry::DurableZset {
            key: "bank-payments.delayed".to_owned(),
            ttl: None,
        })
)]
async fn charge_bank(payment: &Payment, State(gateway): State<PaymentGateway>) -> HandlerOutcome {
    match gateway.charge(payment).await {
        Ok(()) => {
            tracing::info!(
                payment.id,
                amount_cents = payment.amount_cents,
                "payment charged"
            );
            HandlerOutcome::ack()
        }
        Err(err) if err.is_downstream_down() => {
            tracing::warn!(payment.id, %err, "gateway down, parked for later");
            HandlerOutcome::downstream_down(err.to_string(), RECHECK)
        }
        Err(err) if err.is_retryable() => {
            tracing::warn!(payment.id, %err, "charge failed, parked for later");
            HandlerOutcome::retry_after(RECHECK)
        }
        Err(err) => HandlerOutcome::dead_letter(err.to_string()),
    }
}
