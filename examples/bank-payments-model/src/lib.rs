//! The bank-payments example's domain, shared by its two guest forms (macro and manual):
//! a [`Payment`] as the producer writes it, and a [`PaymentGateway`] client that charges it
//! over HTTP.
//!
//! The demo's gateway (`bank-gateway`, in `examples/bank-gateway`) runs on this machine. It holds
//! large payments for a while after it first sees them, the way a real gateway times out while
//! a bank confirms a large transfer: the charge request times out, the handler parks the
//! payment for [`RECHECK`], and the retry finds it confirmed. Charges carry the payment id as
//! an idempotency key, so a retry after a timeout never charges twice.
//!
//! The subscription must grant the gateway in `allowed_outbound_hosts`; without it every
//! charge fails as denied (and is retried, so fixing the config and swapping nothing in is
//! enough).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_guest::FromConfig;
use sluice_guest::config::Config;
use sluice_guest::http::Request;

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
    /// The gateway did not answer in time; the charge may have gone through or not, and is
    /// safe to retry (it is idempotent).
    Timeout,
    /// The gateway could not be reached or answered with a server error; retry later.
    Unavailable(String),
    /// The gateway refused the charge; retrying will not help.
    Declined(String),
}

impl GatewayError {
    /// Whether a later retry may succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::Declined(_))
    }

    /// Whether the gateway itself is away (not this payment's trouble): a subscription's
    /// circuit breaker counts such failures and stops reading while the gateway is down.
    pub fn is_downstream_down(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout => f.write_str("the payment gateway timed out"),
            Self::Unavailable(why) => write!(f, "the payment gateway is unavailable: {why}"),
            Self::Declined(why) => write!(f, "the payment gateway declined the charge: {why}"),
        }
    }
}

impl std::error::Error for GatewayError {}

/// The payment gateway client, built once per instance from the subscription's config
/// (`gateway_url`, `gateway_timeout_ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentGateway {
    /// Base URL of the gateway, e.g. `http://127.0.0.1:7878`.
    pub url: String,
    /// How long one charge request may take.
    pub timeout: Duration,
}

impl FromConfig for PaymentGateway {
    fn from_config(config: &Config) -> Result<Self, String> {
        Ok(Self {
            url: config
                .get("gateway_url")
                .unwrap_or_else(|| "http://127.0.0.1:7878".to_owned())
                .trim_end_matches('/')
                .to_owned(),
            timeout: Duration::from_millis(config.parse_or("gateway_timeout_ms", 2_000)?),
        })
    }
}

impl PaymentGateway {
    /// Charge a payment.
    pub async fn charge(&self, payment: &Payment) -> Result<(), GatewayError> {
        let response = Request::post(format!("{}/charge", self.url))
            .header("idempotency-key", &payment.id)
            .json(payment)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|err| {
                if err.is_timeout() {
                    GatewayError::Timeout
                } else {
                    GatewayError::Unavailable(err.to_string())
                }
            })?;
        match response.status() {
            200..=299 => Ok(()),
            504 => Err(GatewayError::Timeout),
            status @ 400..=499 => Err(GatewayError::Declined(format!(
                "{status} {}",
                response.text()
            ))),
            status => Err(GatewayError::Unavailable(format!(
                "{status} {}",
                response.text()
            ))),
        }
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
