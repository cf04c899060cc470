//! The bank-payments example's domain, shared by its two guest forms (macro and manual):
//! a [`Payment`] as the producer writes it, and a [`PaymentGateway`] that charges it.
//!
//! The gateway is simulated so the demo needs nothing outside this machine: it times out on
//! large payments while they are fresh (younger than `gateway_slow_for`), the way a real
//! gateway times out while a bank confirms a large transfer. A retry after [`RECHECK`] finds
//! the payment old enough and the charge goes through.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sluice_guest::FromConfig;
use sluice_guest::config::Config;

/// How long a payment the gateway timed out on waits before it is charged again.
pub const RECHECK: Duration = Duration::from_secs(30);

/// A payment to charge, as JSON in the entry's `payload` field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The payment's id, unique per payment.
    pub id: String,
    /// The account to charge.
    pub account: String,
    /// The amount, in cents.
    pub amount_cents: u64,
    /// ISO 4217 currency code.
    pub currency: String,
    /// When the payment was created, in Unix epoch milliseconds.
    pub created_at_ms: u64,
}

/// Why a charge failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayError {
    /// The gateway did not confirm in time; the charge may be retried.
    Timeout {
        /// How long the gateway still needs, as far as we can tell.
        retry_in: Duration,
    },
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout { retry_in } => {
                write!(
                    f,
                    "gateway timed out (busy for about {}s more)",
                    retry_in.as_secs()
                )
            }
        }
    }
}

impl std::error::Error for GatewayError {}

/// The simulated payment gateway, built once per instance from the subscription's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentGateway {
    /// Payments at or above this amount take the slow path.
    pub slow_above_cents: u64,
    /// How long after creation a slow-path payment keeps timing out.
    pub slow_for: Duration,
}

impl FromConfig for PaymentGateway {
    fn from_config(config: &Config) -> Result<Self, String> {
        Ok(Self {
            slow_above_cents: config.parse_or("gateway_slow_above_cents", 100_000)?,
            slow_for: Duration::from_millis(config.parse_or("gateway_slow_for_ms", 10_000)?),
        })
    }
}

impl PaymentGateway {
    /// Charge a payment.
    pub async fn charge(&self, payment: &Payment) -> Result<(), GatewayError> {
        if payment.amount_cents < self.slow_above_cents {
            return Ok(());
        }
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let age = Duration::from_millis(now_ms.saturating_sub(payment.created_at_ms));
        if age < self.slow_for {
            return Err(GatewayError::Timeout {
                retry_in: self.slow_for - age,
            });
        }
        Ok(())
    }
}

/// The state of the manual example: everything its handler needs, built once per instance.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The payment gateway.
    pub gateway: PaymentGateway,
}

impl FromConfig for AppState {
    fn from_config(config: &Config) -> Result<Self, String> {
        Ok(Self {
            gateway: PaymentGateway::from_config(config)?,
        })
    }
}
