//! The bank-payments handler, manual form: the same behaviour as the macro form, written with
//! the `Handle` trait and registered with `export!`.
//!
//! Build with: `cargo build --release --target wasm32-wasip2 -p bank-payments-manual`
//! Run with:   `sluice run examples/bank-payments-manual/sluice.toml`

use bank_payments_model::{AppState, Payment, RECHECK};
use sluice_guest::prelude::*;

/// The delay waits in the `bank-payments.delayed` sorted set in Redis, and the subscription puts
/// the entry back on `bank-payments` once it is due.
struct ChargeBank;

impl Handle<Payment, (), (), (), AppState> for ChargeBank {
    async fn handle(
        &self,
        payment: &Payment,
        _outs: &(),
        ctx: &mut Context<'_, (), AppState>,
    ) -> Result<(), HandlerOutcome> {
        match ctx.state().gateway.charge(payment).await {
            Ok(()) => {}
            Err(err) if err.is_downstream_down() => {
                tracing::warn!(payment.id, %err, "gateway down, parked for later");
                return Err(HandlerOutcome::downstream_down(err.to_string(), RECHECK));
            }
            Err(err) if err.is_retryable() => {
                tracing::warn!(payment.id, %err, "charge failed, parked for later");
                return Err(HandlerOutcome::retry_after(RECHECK));
            }
            Err(err) => return Err(HandlerOutcome::dead_letter(err.to_string())),
        }
        tracing::info!(
            payment.id,
            amount_cents = payment.amount_cents,
            "payment charged"
        );
        Ok(())
    }
}

fn bank_payments() -> RedisStream {
    RedisStream::new("bank-payments")
        .group("billing")
        .delayed_retry(DelayedRetry::DurableZset {
            key: "bank-payments.delayed".to_owned(),
            ttl: None,
        })
}

sluice_guest::export!(ChargeBank, bank_payments);
