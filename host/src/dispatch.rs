//! One delivery, start to end: run the handler inside the delivery's span, decide with
//! [`crate::outcome::decide`], and settle the decision.
//!
//! Dispatch is generic over [`Handler`]: the WASM runtime is one implementation; tests and
//! benchmarks can plug in a native one to isolate what WebAssembly costs.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use tracing::Instrument;

use crate::delivery::Delivery;
use crate::keys;
use crate::metrics::{DeliveryMetrics, Metrics, SubLabels};
use crate::outcome::{self, Action, Failure, Outcome, Policy};
use crate::settle::Settler;
use crate::swap::{HandlerSlot, Version};

/// Something that handles deliveries: a WASM component, or native code in tests and benches.
pub trait Handler: Send + Sync + 'static {
    /// Which version of the handler this is (a content digest for components).
    fn digest(&self) -> &str;

    /// Handle one delivery.
    fn handle<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<Outcome, Failure>>;
}

/// How a dispatch ended, for the subscription to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Acked, parked or dead-lettered: nothing more to do here.
    Done,
    /// The entry stays pending and must come back after the delay.
    RetryPending(std::time::Duration),
}

/// Runs deliveries of one subscription.
pub struct Dispatcher {
    slot: Arc<HandlerSlot>,
    policy: Policy,
    settler: Arc<Settler>,
    metrics: DeliveryMetrics,
}

impl Dispatcher {
    /// A dispatcher running whatever handler `slot` holds, under `policy`.
    pub fn new(
        slot: Arc<HandlerSlot>,
        policy: Policy,
        settler: Arc<Settler>,
        metrics: &Metrics,
        labels: &SubLabels,
    ) -> Self {
        Self {
            slot,
            policy,
            settler,
            metrics: metrics.for_deliveries(labels),
        }
    }

    /// Handle and settle one delivery.
    pub async fn dispatch(&self, mut delivery: Delivery) -> Settled {
        // The version is taken once: a swap during this delivery does not change its handler.
        let version = self.slot.current();
        delivery.started = Some(std::time::SystemTime::now());
        let span = tracing::info_span!(
            "delivery",
            stream = %delivery.stream,
            group = %delivery.group,
            id = %delivery.entry.id,
            retry_count = delivery.retry_count,
            delivery_count = delivery.delivery_count,
            digest = &version.digest[..version.digest.len().min(12)],
        );
        self.run(delivery, &version).instrument(span).await
    }

    /// A retry put back by the sweep carries its due time (Redis server clock); its lateness
    /// is the time it starts being handled (this host's clock) minus that. Hosts' clocks only
    /// matter for this metric, never for when a retry is due.
    fn record_lateness(&self, delivery: &Delivery) {
        let Some(due) = delivery
            .entry
            .field(keys::DUE_MS)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<f64>().ok())
        else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        self.metrics
            .lateness
            .observe(((now - due) / 1000.0).max(0.0));
    }

    async fn run(&self, delivery: Delivery, version: &Version) -> Settled {
        let digest = &version.digest;
        self.record_lateness(&delivery);
        let m = &self.metrics;
        m.in_flight.inc();
        let started = Instant::now();
        let result = version.handler.handle(&delivery).await;
        let elapsed = started.elapsed();
        m.in_flight.dec();
        m.duration.observe(elapsed.as_secs_f64());
        // Indexes into `metrics::OUTCOMES`.
        m.count(match &result {
            Ok(Outcome::Ack) => 0,
            Ok(Outcome::RetryAfter(_)) => 1,
            Ok(Outcome::DeadLetter(_)) => 2,
            Err(Failure::Trap(_) | Failure::Instantiate(_)) => 3,
            Err(Failure::Timeout(_) | Failure::MemoryLimit { .. } | Failure::FuelExhausted(_)) => 4,
        });
        let elapsed_us = elapsed.as_micros() as u64;
        if let Err(failure) = &result {
            tracing::warn!(%failure, elapsed_us, "attempt failed");
        }
        let action = outcome::decide(&result, delivery.previous_attempts(), &self.policy);
        match action {
            Action::Ack => {
                tracing::debug!(elapsed_us, "ack");
                self.settler.ack(&delivery, digest);
                Settled::Done
            }
            Action::DeadLetter { reason } => {
                tracing::warn!(%reason, elapsed_us, "dead-lettering");
                self.settler.dead_letter(&delivery, digest, &reason).await;
                Settled::Done
            }
            Action::Retry { delay, cause } if self.settler.has_delayed_set() => {
                tracing::info!(delay_ms = delay.as_millis() as u64, %cause, "parking for a delayed retry");
                self.settler.park(&delivery, digest, delay, cause).await;
                Settled::Done
            }
            Action::Retry { delay, cause } => {
                tracing::info!(delay_ms = delay.as_millis() as u64, %cause, "retry stays pending");
                self.settler.retry_pending(&delivery, digest, delay, cause);
                Settled::RetryPending(delay)
            }
        }
    }
}
