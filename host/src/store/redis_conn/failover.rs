//! Following the master: what a failed command tells a [`RedisHandle`] on one node or behind
//! Sentinel. A reply that says the node is no longer the master, or a lost connection, makes
//! it ask the sentinels again and connect to the master they name; a command that timed out
//! replaces the shared connection. The command that failed is retried by its caller.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use redis::RedisError;

use super::error_class::ErrorClass;
use super::handle::RedisHandle;
use super::node::manager;
use super::route::Route;

impl RedisHandle {
    /// Tell the handle a command failed with `err`. Behind Sentinel, a failure that may mean
    /// the master moved starts a re-resolution in the background. On one node or behind
    /// Sentinel, a command that timed out replaces the shared connection: a connection whose
    /// peer vanished without a reset (a half-open TCP connection) would otherwise hold every
    /// later command until the kernel gives up on it, about 15 minutes by default, while the
    /// blocking reads, on connections of their own, reconnect and go on taking entries that
    /// can never be settled.
    pub fn saw_error(&self, err: &RedisError) {
        let Route::Node {
            sentinel,
            refreshing,
            ..
        } = &self.inner.route
        else {
            return;
        };
        let timed_out = err.is_timeout();
        let moved = sentinel.is_some()
            && (err.code() == Some("READONLY") || ErrorClass::of(err) == ErrorClass::Connection);
        if !(moved || timed_out) || refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            this.refresh(timed_out).await;
            if let Route::Node { refreshing, .. } = &this.inner.route {
                refreshing.store(false, Ordering::Release);
            }
        });
    }

    /// Connect again: to the master the sentinels name now (if it moved), or, after a
    /// command timed out, to the same node over a new connection.
    async fn refresh(&self, timed_out: bool) {
        let Route::Node {
            current, sentinel, ..
        } = &self.inner.route
        else {
            return;
        };
        let client = match sentinel {
            Some(sentinel) => match sentinel.lock().await.async_get_client().await {
                Ok(client) => client,
                Err(err) => {
                    tracing::warn!(redis = %self.inner.name, %err, "the sentinels name no master; retrying");
                    return;
                }
            },
            None => current.load().0.clone(),
        };
        let addr = client.get_connection_info().addr().to_string();
        let moved = current.load().0.get_connection_info().addr().to_string() != addr;
        if !moved && !timed_out {
            return;
        }
        match manager(&client).await {
            Ok(manager) => {
                if moved {
                    tracing::warn!(redis = %self.inner.name, master = %addr, "the master moved (failover); following it");
                } else {
                    tracing::warn!(redis = %self.inner.name, "a command timed out on the shared connection; replaced it with a new one");
                }
                current.store(Arc::new((client, manager)));
            }
            Err(err) => {
                tracing::warn!(redis = %self.inner.name, %addr, %err, "cannot connect again yet")
            }
        }
    }
}
