//! What happened to each delivery, broadcast to whoever listens (tests, and later metrics).
//! An event is sent once its effect is in Redis: an ack after XACK returned, a dead letter
//! after the script ran, a retry once it was scheduled.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::broadcast;

/// One settled delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The stream.
    pub stream: Arc<str>,
    /// The group.
    pub group: Arc<str>,
    /// The entry id.
    pub id: String,
    /// The id of the entry the producer added (differs from `id` on a re-added retry).
    pub origin_id: String,
    /// Park-and-re-add count of the delivery.
    pub retry_count: u32,
    /// Redis's delivery counter of the delivery.
    pub delivery_count: u64,
    /// The digest of the handler that handled it.
    pub digest: crate::support::digest::Digest,
    /// When the delivery took that handler version (`None` if nobody listened to the events
    /// then: the clock is read only for a listener).
    pub started: Option<std::time::SystemTime>,
    /// What was done.
    pub kind: EventKind,
}

/// What was done with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// Acknowledged.
    Acked,
    /// Moved to the dead-letter stream.
    DeadLettered {
        /// The reason recorded with it.
        reason: String,
    },
    /// Parked in the delayed-retry set and acknowledged.
    Parked {
        /// The delay asked for.
        delay: Duration,
        /// Its due time, epoch milliseconds by the Redis server's clock.
        due_ms: i64,
        /// Why.
        cause: String,
    },
    /// Acknowledged without being handled: a retry copy that another group of the stream
    /// parked at the stream's tail (its retry, not this group's).
    OtherGroupsRetry {
        /// The group that parked it.
        group: String,
    },
    /// Acknowledged without being handled: its dedupe key's first entry was read within the
    /// window.
    Duplicate {
        /// The id of the key's first entry.
        of: String,
    },
    /// Left pending, to be delivered again after the delay.
    RetryPending {
        /// The delay.
        delay: Duration,
        /// Why.
        cause: String,
    },
}

/// The broadcast channel of events.
#[derive(Debug, Clone)]
pub struct Events {
    sender: broadcast::Sender<Event>,
    /// Listeners alive: with none, a delivery builds no event at all (issue 50: an ack's
    /// event cost two string copies and the channel's lock on every delivery, for nobody).
    listeners: Arc<AtomicUsize>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            sender: broadcast::channel(65_536).0,
            listeners: Arc::default(),
        }
    }
}

impl Events {
    /// Listen to every event from now on.
    pub fn subscribe(&self) -> Listener {
        // Counted before it can receive. An ack is given its event when it is made: one made
        // while nobody listened reports nothing, even if Redis takes it after this returns.
        self.listeners.fetch_add(1, Ordering::SeqCst);
        Listener {
            receiver: self.sender.subscribe(),
            listeners: self.listeners.clone(),
        }
    }

    /// Whether anyone listens: events are only worth making then.
    pub fn listened(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    pub(crate) fn send(&self, event: Event) {
        // No listener is fine.
        let _ = self.sender.send(event);
    }
}

/// A listener to [`Events`]: a broadcast receiver (it derefs to one) that is counted while it
/// lives.
#[derive(Debug)]
pub struct Listener {
    receiver: broadcast::Receiver<Event>,
    listeners: Arc<AtomicUsize>,
}

impl Listener {
    /// Another listener from now on, counted like this one (shadows the receiver's own
    /// `resubscribe`, whose receiver the count would not see).
    pub fn resubscribe(&self) -> Listener {
        self.listeners.fetch_add(1, Ordering::SeqCst);
        Listener {
            receiver: self.receiver.resubscribe(),
            listeners: self.listeners.clone(),
        }
    }
}

impl std::ops::Deref for Listener {
    type Target = broadcast::Receiver<Event>;

    fn deref(&self) -> &Self::Target {
        &self.receiver
    }
}

impl std::ops::DerefMut for Listener {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.receiver
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.listeners.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::Events;

    #[test]
    fn events_are_made_only_while_a_listener_lives() {
        let events = Events::default();
        assert!(!events.listened(), "nobody listens yet");
        let first = events.subscribe();
        assert!(events.listened());
        let second = first.resubscribe();
        drop(first);
        assert!(events.listened(), "the resubscribed listener is counted");
        drop(second);
        assert!(!events.listened(), "every listener gone");
    }
}
