//! A retry that stays pending in the stream (no delayed set): a local timer takes the entry
//! back when its delay is over.
//!
//! The entry is re-claimed by this consumer with XCLAIM, which also bumps Redis's delivery
//! counter, and handed to dispatch like a newly read one. The timer lives only in this
//! process: after a crash the entry is still in this consumer's pending list, and the read
//! loop's first step (re-reading its own pending entries) brings it back instead. On a
//! claiming subscription no timer is needed: XAUTOCLAIM takes the entry once it has been
//! idle for `min_idle`.

use std::sync::Arc;
use std::time::Duration;

use super::{Subscription, read};
use crate::delivery::Source;
use crate::redis_conn::{ErrorClass, ReconnectBackoff};

impl Subscription {
    /// Bring a pending entry back after `delay` (not needed on a claiming subscription).
    pub(super) fn retry_later(
        self: &Arc<Self>,
        id: String,
        source: Source,
        delivery_count: u64,
        delay: Duration,
    ) {
        if let Some(min_idle) = self.plan.claim_min_idle {
            tracing::debug!(
                id,
                min_idle_ms = min_idle.as_millis() as u64,
                "retry stays pending until XAUTOCLAIM finds it idle"
            );
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                // Still pending: re-read from this consumer's pending list on restart.
                () = this.stop.cancelled() => return,
            }
            // Paused: the retry waits for the resume (still pending, so a restart meanwhile
            // re-reads it as before).
            if !this.flow.borrow().open() && !this.wait_open().await {
                return;
            }
            // A retry is a delivery: it takes its token from the group's budget.
            if let Some(rate) = &this.rate
                && rate.take(1, &this.stop).await.is_none()
            {
                return;
            }
            // Paused while waiting for the token: wait for the resume again.
            if !this.flow.borrow().open() && !this.wait_open().await {
                return;
            }
            let mut backoff = ReconnectBackoff::default();
            let entry = loop {
                let mut conn = this.conn.clone();
                match read::claim_one(&mut conn, &this.plan, source, &id).await {
                    Ok(entry) => break entry,
                    Err(err) if ErrorClass::of(&err) == ErrorClass::NoGroup => {
                        tracing::warn!(
                            id,
                            "retry is pending nowhere: the consumer group was deleted"
                        );
                        return;
                    }
                    Err(err) => {
                        let message = format!(
                            "cannot take back retry {id}: {}: {err}",
                            ErrorClass::of(&err).describe()
                        );
                        if !this.pause_after_error(&message, &mut backoff).await {
                            return;
                        }
                    }
                }
            };
            let Some(entry) = entry else {
                tracing::info!(
                    id,
                    "retry is no longer pending (settled elsewhere or deleted)"
                );
                return;
            };
            let permit = tokio::select! {
                permit = this.slots.one() => match permit {
                    Some(permit) => permit,
                    None => return,
                },
                () = this.stop.cancelled() => return,
            };
            this.spawn_delivery(entry, source, delivery_count + 1, permit);
        });
    }
}
