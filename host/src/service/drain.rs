//! Taking a service down in order, when told to stop: readers first (a short grace), then the
//! deliveries in flight (until `shutdown_timeout`), then the ackers flush. If the deadline
//! passes first, what is unfinished is abandoned: those entries stay pending in Redis and this
//! consumer re-reads them when it starts again.

use super::wiring::Wiring;
use super::{RunError, Service};

/// How long a stop waits for readers, watchers and sweeps to end by themselves before it
/// stops them: the rest of `shutdown_timeout` is for the deliveries in flight and their acks.
const READERS_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl Service {
    /// Stop reading, wait for the deliveries in flight, flush the acks: all within the
    /// shutdown deadline, counted from the signal.
    pub(super) async fn drain(&self, mut w: Wiring) -> Result<(), RunError> {
        let timeout = self.plan.shutdown_timeout;
        let deadline = tokio::time::Instant::now() + timeout.min(sluice_descriptor::MAX_DURATION);
        tracing::info!("stopping: no new reads");
        stop_readers(&mut w, deadline).await;
        w.deliveries.close();
        let in_flight = w.deliveries.len();
        if in_flight > 0 {
            tracing::info!(
                in_flight,
                timeout_ms = timeout.as_millis() as u64,
                "stopped reading; waiting for in-flight deliveries"
            );
        }
        let drained = tokio::time::timeout_at(deadline, w.deliveries.wait())
            .await
            .is_ok();
        if !drained {
            w.abandon.cancel();
            return Err(RunError::Abandoned(w.deliveries.len()));
        }
        flush_acks(&mut w, deadline).await?;
        tracing::info!("all deliveries settled; stopped");
        Ok(())
    }
}

/// Readers get a short grace (a read in flight ends within its block time), never the whole
/// deadline: deliveries and acks need it more. A reader cut off loses nothing: what its read
/// made pending is read again at the next start.
async fn stop_readers(w: &mut Wiring, deadline: tokio::time::Instant) {
    let readers_by = (tokio::time::Instant::now() + READERS_GRACE).min(deadline);
    let readers = &mut w.readers;
    let joined = tokio::time::timeout_at(readers_by, async {
        while readers.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    if !joined {
        tracing::info!(
            left = w.readers.len(),
            "readers and watchers still busy after {READERS_GRACE:?}; stopped"
        );
        w.readers.abort_all();
    }
}

/// Every settler is gone with its subscription; the ackers flush and end, or the deadline
/// abandons what they still hold (counted in the error).
async fn flush_acks(w: &mut Wiring, deadline: tokio::time::Instant) -> Result<(), RunError> {
    let ackers = &mut w.ackers;
    let flushed = tokio::time::timeout_at(deadline, async {
        while ackers.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    if flushed {
        return Ok(());
    }
    w.abandon.cancel();
    let mut unsent = 0;
    while let Some(left) = w.ackers.join_next().await {
        unsent += left.unwrap_or(0);
    }
    Err(RunError::Unflushed(unsent))
}
