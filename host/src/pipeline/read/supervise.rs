//! Keeping a partition's read loop running: a loop that ends or panics before the stop is
//! started again with backoff, logged, counted and shown by readiness until it runs again.

use std::sync::Arc;
use std::time::Duration;

use super::Subscription;

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The first wait before a read loop that ended is started again; it doubles up to
/// [`SUPERVISE_BACKOFF_MAX`].
const SUPERVISE_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait before a read loop is started again.
const SUPERVISE_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl Subscription {
    /// Create the group, then read until stopped.
    /// Run the read loop until the stop, restarting it (with backoff) whenever it ends or
    /// panics before then: a loop that died silently would leave the subscription unread
    /// while the host looked ready. Each restart is logged, counted
    /// (`sluice_read_loop_restarts_total`) and shown by readiness until the loop runs again.
    pub async fn supervise(
        self: Arc<Self>,
        restarts: prometheus_client::metrics::counter::Counter,
    ) {
        let mut backoff = SUPERVISE_BACKOFF_MIN;
        let mut restarted = false;
        loop {
            let started = tokio::time::Instant::now();
            let task = tokio::spawn(self.clone().run(restarted));
            // Aborting the supervisor (a stop past its grace) aborts the loop it runs.
            let _abort = AbortOnDrop(task.abort_handle());
            let ended = task.await;
            restarted = true;
            if self.stop.is_cancelled() {
                return;
            }
            let why = match ended {
                Ok(()) => "the read loop ended unexpectedly".to_owned(),
                Err(err) if err.is_panic() => {
                    let payload = err.into_panic();
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".to_owned());
                    let (message, _) = crate::entry::outcome::bounded_text(&message, 1024);
                    format!("the read loop panicked: {message}")
                }
                Err(err) => format!("the read loop was cancelled: {err}"),
            };
            if started.elapsed() > SUPERVISE_BACKOFF_MAX * 4 {
                backoff = SUPERVISE_BACKOFF_MIN;
            }
            restarts.inc();
            tracing::error!(
                stream = %self.plan.stream,
                group = %self.plan.group,
                restart_in_ms = backoff.as_millis() as u64,
                "{why}; restarting it"
            );
            self.health.loop_down(Some(format!("{why}; restarting")));
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.stop.cancelled() => return,
            }
            self.health.loop_down(None);
            backoff = (backoff * 2).min(SUPERVISE_BACKOFF_MAX);
        }
    }
}
