//! Signals: the first SIGTERM or ctrl-c starts a graceful shutdown (stop reading, drain,
//! flush); a second one ends the process at once, leaving unfinished entries pending in Redis.

use tokio_util::sync::CancellationToken;

/// Cancel `stop` on the first signal; on a second, run `force` (which should exit).
pub fn on_signals(stop: CancellationToken, force: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(
            "shutdown requested: stopping reads and draining in-flight deliveries (signal again to exit at once)"
        );
        stop.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting now; unfinished entries stay pending in Redis");
        force();
    });
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM; only ctrl-c stops the host");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
