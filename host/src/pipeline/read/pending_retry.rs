//! A retry that stays pending in the stream (no delayed set): a local timer takes the entry
//! back when its delay is over. And an entry a read left for later (past the reply's budget):
//! read again alone ([`Subscription::read_alone`]).
//!
//! The entry is re-claimed by this consumer with XCLAIM, which also bumps Redis's delivery
//! counter, and handed to dispatch like a newly read one. The timer lives only in this
//! process: after a crash the entry is still in this consumer's pending list, and the read
//! loop's first step (re-reading its own pending entries) brings it back instead. On a
//! claiming subscription no timer is needed: XAUTOCLAIM takes the entry once it has been
//! idle for `min_idle`.

use std::sync::Arc;
use std::time::Duration;

use super::{Subscription, commands};
use crate::entry::delivery::Source;
use crate::store::redis_conn::{ErrorClass, ReconnectBackoff};

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
                match commands::claim_one(&mut conn, &this.plan, source, &id).await {
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

    /// Read the pending entry `id` again alone, by id (XRANGE: not an attempt, Redis's
    /// delivery counter stays), once a slot is free, and hand it to dispatch: a read left it
    /// past its reply's budget (see `commands::cutting`). Gone meanwhile: nothing to do; Redis
    /// away: tried again with backoff, and it stays pending for a restart's re-read.
    pub(super) fn read_alone(self: &Arc<Self>, id: String, source: Source, delivery_count: u64) {
        let this = self.clone();
        tokio::spawn(async move {
            let permit = tokio::select! {
                permit = this.slots.one() => match permit {
                    Some(permit) => permit,
                    None => return,
                },
                () = this.stop.cancelled() => return,
            };
            let mut backoff = ReconnectBackoff::default();
            let found = loop {
                let mut conn = this.conn.clone();
                let read: redis::RedisResult<Vec<commands::RawEntry>> = redis::cmd("XRANGE")
                    .arg(this.plan.key(source))
                    .arg(&id)
                    .arg(&id)
                    .query_async(&mut conn)
                    .await;
                match read {
                    Ok(found) => break found,
                    Err(err) => {
                        let message = format!(
                            "cannot read entry {id} again: {}: {err}",
                            ErrorClass::of(&err).describe()
                        );
                        if !this.pause_after_error(&message, &mut backoff).await {
                            return;
                        }
                    }
                }
            };
            match found.into_iter().next() {
                Some((id, fields)) => {
                    let entry = crate::entry::delivery::Entry { id, fields };
                    this.spawn_delivery(entry, source, delivery_count, permit);
                }
                None => this.drop_deleted(source, &id).await,
            }
        });
    }
}
