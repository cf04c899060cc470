//! The consumer group under a partition's keys: made at start (MKSTREAM, from the start of the
//! stream), and made again when it vanished, after the last entry this host read.

use super::Subscription;
use super::commands;
use crate::store::redis_conn::{ErrorClass, ReconnectBackoff};

impl Subscription {
    pub(super) async fn create_group(&self) -> bool {
        let mut backoff = ReconnectBackoff::default();
        loop {
            let mut conn = self.conn.clone();
            let mut created = Ok(());
            for source in self.plan.sources() {
                created =
                    commands::create_group(&mut conn, self.plan.key(source), &self.plan.group)
                        .await;
                if created.is_err() {
                    break;
                }
            }
            match created {
                Ok(()) => return true,
                Err(err) => {
                    let message = format!(
                        "cannot create consumer group: {}: {err}",
                        ErrorClass::of(&err).describe()
                    );
                    self.health.failed(&message);
                    if !self.pause_after_error(&message, &mut backoff).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Create the group again after it vanished (on the stream, the lane, or both), after the
    /// last entry this host read from each (or from the start), and say so.
    pub(super) async fn recreate_group(&self) {
        for source in self.plan.sources() {
            let key = self.plan.key(source);
            let from = self
                .last_read
                .lock()
                .ok()
                .and_then(|last| last.get(&source).cloned())
                .unwrap_or_else(|| "0".to_owned());
            let mut conn = self.conn.clone();
            // An existing group is left as it is: only a vanished one is made again.
            let exists = crate::store::inspect::group(&mut conn, key, &self.plan.group).await;
            if matches!(exists, Ok(Some(_))) {
                continue;
            }
            match commands::create_group_at(&mut conn, key, &self.plan.group, &from).await {
                Ok(()) => tracing::warn!(
                    stream = %key,
                    group = %self.plan.group,
                    from = %from,
                    "consumer group was gone (the stream or the group was deleted); created it again, reading entries after id {from}"
                ),
                Err(err) => tracing::warn!(
                    stream = %key,
                    group = %self.plan.group,
                    %err,
                    "consumer group is gone and could not be created again: {}",
                    ErrorClass::of(&err).describe()
                ),
            }
        }
    }
}
