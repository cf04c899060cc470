use serde::Deserialize;
use sluice_guest::config::Config;
use sluice_guest::prelude::*;

#[derive(Deserialize)]
struct Payment {
    id: String,
}

#[derive(Clone)]
struct PaymentGateway;

impl FromConfig for PaymentGateway {
    fn from_config(_: &Config) -> Result<Self, String> {
        Ok(PaymentGateway)
    }
}

impl PaymentGateway {
    async fn charge(&self, _payment: &Payment) -> Result<(), String> {
        Ok(())
    }
}

const RECHECK: Duration = Duration::from_secs(30);

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
        Ok(()) => HandlerOutcome::ack(),
        Err(err) => {
            tracing::warn!(payment.id, %err, "charge failed, parked for later");
            HandlerOutcome::retry_after(RECHECK)
        }
    }
}

fn main() {}
