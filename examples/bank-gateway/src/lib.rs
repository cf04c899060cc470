//! A pretend payment gateway, so the bank-payments demo exercises real outbound HTTP, real
//! timeouts and real retries without leaving the machine.
//!
//! `POST /charge` takes a payment as JSON (`id`, `amount_cents`, ...):
//! - a payment below `slow_above_cents` is charged at once: `200 {"status": "charged"}`;
//! - a large one is "held by the bank" for `slow_for` after the gateway first sees its id:
//!   requests in that window get no answer for `hold` (the caller's timeout fires first, the
//!   way a real gateway times out while a bank confirms a large transfer), then a `504`;
//!   after the window it is charged;
//! - charging is idempotent by payment id: a repeat gets `200 {"status": "already-charged"}`,
//!   so a retry after a timeout never charges twice;
//! - a body that is not a payment, or a payment of zero, gets `400` with the reason (the
//!   handler dead-letters it: retrying will not help);
//! - a charge without a `Content-Length` (a body sent chunked) gets `411`, as from many real
//!   gateways and simple servers, which read such a body as empty: a client that knows its
//!   body whole must say its length.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};

/// How the gateway behaves.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Payments at or above this amount are held by the bank first.
    pub slow_above_cents: u64,
    /// How long after the first request a held payment stays held.
    pub slow_for: Duration,
    /// How long a request for a held payment waits before the gateway gives up (`504`).
    pub hold: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            slow_above_cents: 100_000,
            slow_for: Duration::from_secs(10),
            hold: Duration::from_secs(60),
        }
    }
}

#[derive(Default)]
struct Ledger {
    first_seen: HashMap<String, Instant>,
    charged: HashSet<String>,
}

#[derive(Clone)]
struct Gateway {
    settings: Settings,
    ledger: Arc<Mutex<Ledger>>,
}

#[derive(Deserialize)]
struct Charge {
    id: String,
    amount_cents: u64,
}

/// The gateway's routes.
pub fn router(settings: Settings) -> axum::Router {
    let gateway = Gateway {
        settings,
        ledger: Arc::default(),
    };
    axum::Router::new()
        .route("/charge", post(charge))
        .with_state(gateway)
}

/// Serve the gateway on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, settings: Settings) -> std::io::Result<()> {
    axum::serve(listener, router(settings)).await
}

enum Decision {
    Charged,
    AlreadyCharged,
    Held,
}

async fn charge(
    State(gateway): State<Gateway>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, Json<Value>) {
    if !headers.contains_key(axum::http::header::CONTENT_LENGTH) {
        tracing::warn!("refused a charge without a Content-Length (sent chunked)");
        return (
            StatusCode::LENGTH_REQUIRED,
            Json(json!({"error": "a charge needs a Content-Length: its body was sent chunked"})),
        );
    }
    let charge: Charge = match serde_json::from_slice(&body) {
        Ok(charge) => charge,
        Err(err) => {
            tracing::warn!(%err, "refused a request that is not a payment");
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": format!("not a payment: {err}")})),
            );
        }
    };
    if charge.amount_cents == 0 {
        tracing::warn!(payment = %charge.id, "declined: nothing to charge");
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "the amount must be positive"})),
        );
    }
    let decision = {
        let Ok(mut ledger) = gateway.ledger.lock() else {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "ledger poisoned"})),
            );
        };
        let first_seen = *ledger
            .first_seen
            .entry(charge.id.clone())
            .or_insert_with(Instant::now);
        if ledger.charged.contains(&charge.id) {
            Decision::AlreadyCharged
        } else if charge.amount_cents >= gateway.settings.slow_above_cents
            && first_seen.elapsed() < gateway.settings.slow_for
        {
            Decision::Held
        } else {
            ledger.charged.insert(charge.id.clone());
            Decision::Charged
        }
    };
    match decision {
        Decision::Charged => {
            tracing::info!(payment = %charge.id, amount_cents = charge.amount_cents, "charged");
            (
                StatusCode::OK,
                Json(json!({"status": "charged", "payment": charge.id})),
            )
        }
        Decision::AlreadyCharged => {
            tracing::info!(payment = %charge.id, "already charged: nothing to do");
            (
                StatusCode::OK,
                Json(json!({"status": "already-charged", "payment": charge.id})),
            )
        }
        Decision::Held => {
            tracing::info!(
                payment = %charge.id,
                amount_cents = charge.amount_cents,
                "large payment: the bank is confirming it, not answering yet"
            );
            tokio::time::sleep(gateway.settings.hold).await;
            (
                StatusCode::GATEWAY_TIMEOUT,
                Json(json!({"error": "the bank did not confirm in time"})),
            )
        }
    }
}
