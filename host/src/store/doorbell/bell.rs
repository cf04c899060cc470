//! [`Bell`]: one reader's (or one delayed set's) side of the doorbell. A reader marks what it
//! has seen before it reads, says after the read whether it is idle (an idle reader wants its
//! keys rung, a busy one lets go of them), and then waits for a ring; a [`Mark`] taken before
//! a look at Redis later tells whether anything was written since.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Doorbell, Key, Kind, OUT, POLLED_QUIET, QUIET, QUIET_WAIT, RANG};

impl Doorbell {
    /// A bell for the streams `keys` (a partition's stream and lane, an earlier release's
    /// dead-letter stream).
    pub fn bell(self: &Arc<Self>, keys: &[&str]) -> Bell {
        self.bell_of(keys, Kind::Stream)
    }

    /// A bell for the delayed set `key`.
    pub fn set_bell(self: &Arc<Self>, key: &str) -> Bell {
        self.bell_of(&[key], Kind::Set)
    }

    fn bell_of(self: &Arc<Self>, keys: &[&str], kind: Kind) -> Bell {
        let mut map = self.lock();
        let mut rings = Vec::with_capacity(keys.len());
        let mut names = Vec::with_capacity(keys.len());
        let mut awaiting = Vec::with_capacity(keys.len());
        for key in keys {
            let name: Arc<str> = Arc::from(*key);
            let entry = map.entry(name.clone()).or_insert_with(|| Key::new(kind));
            rings.push(entry.rings.subscribe());
            awaiting.push(entry.awaiting.clone());
            names.push(name);
        }
        Bell {
            doorbell: self.clone(),
            keys: names,
            awaiting,
            rings: Mutex::new(rings),
            live: self.live.subscribe(),
            wanting: AtomicBool::new(false),
        }
    }

    /// Polling: `keys` were read by an idle reader after they rang; read them again.
    fn rejoin(&self, keys: Vec<Arc<str>>) {
        if keys.is_empty() {
            return;
        }
        self.rejoined
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(keys);
        self.changed.notify_one();
    }

    /// One more bell wants `keys` (`yes`), or one fewer: a key newly wanted wakes the doorbell
    /// to subscribe it.
    fn want(&self, keys: &[Arc<str>], yes: bool) {
        let mut map = self.lock();
        let mut changed = false;
        for name in keys {
            let Some(key) = map.get_mut(name) else {
                continue;
            };
            if yes {
                key.wanted += 1;
                key.unwanted_since = None;
                changed |= !key.subscribed;
            } else {
                key.wanted = key.wanted.saturating_sub(1);
                if key.wanted == 0 {
                    key.unwanted_since = Some(Instant::now());
                }
            }
        }
        drop(map);
        if changed {
            self.changed.notify_one();
        }
    }

    /// Whether every one of `keys` is subscribed (or polled) now.
    fn subscribed(&self, keys: &[Arc<str>]) -> bool {
        let map = self.lock();
        keys.iter()
            .all(|name| map.get(name).is_some_and(|k| k.subscribed))
    }
}

/// One reader's bell: rings when one of its keys is written (see the module doc).
pub struct Bell {
    doorbell: Arc<Doorbell>,
    keys: Vec<Arc<str>>,
    /// Each key's state between rings and reads (polling).
    awaiting: Vec<Arc<AtomicU8>>,
    /// What the reader has seen of each key's rings.
    rings: Mutex<Vec<watch::Receiver<u64>>>,
    live: watch::Receiver<bool>,
    /// Whether it holds its keys wanted now.
    wanting: AtomicBool,
}

impl Bell {
    fn rings(&self) -> MutexGuard<'_, Vec<watch::Receiver<u64>>> {
        self.rings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mark every ring so far as seen: called before a read, so that a write after it rings.
    pub fn seen(&self) {
        for rx in self.rings().iter_mut() {
            rx.mark_unchanged();
        }
        if self.wanting.load(Ordering::Acquire) {
            self.rejoin();
        } else {
            // A busy reader takes the ring, but a key left out stays out: it reads anyway.
            for awaiting in &self.awaiting {
                let _ = awaiting.compare_exchange(RANG, QUIET, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// Polling: this idle reader is about to read its keys: those that rang are quiet again,
    /// and those left out are read again.
    fn rejoin(&self) {
        let rejoined: Vec<Arc<str>> = self
            .keys
            .iter()
            .zip(&self.awaiting)
            .filter(|(_, awaiting)| awaiting.swap(QUIET, Ordering::AcqRel) == OUT)
            .map(|(name, _)| name.clone())
            .collect();
        self.doorbell.rejoin(rejoined);
    }

    /// The read found nothing (`idle`) or something: an idle reader wants its keys
    /// subscribed, a busy one lets go of them.
    pub fn set_idle(&self, idle: bool) {
        if self.wanting.swap(idle, Ordering::AcqRel) != idle {
            self.doorbell.want(&self.keys, idle);
            if idle {
                self.rejoin();
            }
        }
    }

    /// Whether its doorbell polls now (no keyspace events): its rings then see entries added,
    /// not the other writes (see [`super::poll`]).
    pub fn polls(&self) -> bool {
        self.doorbell.polling.load(Ordering::Acquire)
    }

    /// Whether the rings can be trusted now: the doorbell is up and every key subscribed.
    fn trusted(&self) -> bool {
        *self.live.borrow() && self.doorbell.subscribed(&self.keys)
    }

    /// The rings so far, if they can be trusted now: taken before a look at Redis, so that
    /// [`Bell::unrung_since`] can later say nothing was written to the keys since.
    pub fn mark(&self) -> Option<Mark> {
        self.trusted().then(|| Mark {
            rings: self.rings().iter().map(|rx| *rx.borrow()).collect(),
            at: Instant::now(),
        })
    }

    /// Whether no key was written since `mark` was taken and the rings can still be trusted.
    /// Every gap in what the doorbell saw (it went down, a key was unsubscribed for a while)
    /// rings when it ends, so an unchanged count means no write was missed. A polling
    /// doorbell's rings see every entry added but not every other write (see [`super::poll`]): they
    /// vouch for [`POLLED_QUIET`] at most.
    pub fn unrung_since(&self, mark: &Mark) -> bool {
        self.trusted()
            && (!self.polls() || mark.at.elapsed() < POLLED_QUIET)
            && self
                .rings()
                .iter()
                .map(|rx| *rx.borrow())
                .eq(mark.rings.iter().copied())
    }

    /// Wait for a ring: `true` when the waiter should look now (a ring; or the doorbell
    /// cannot vouch for its rings and `block` passed; or it polls and [`POLLED_QUIET`] passed
    /// without a ring), `false` when nothing rang until `until` (or for [`QUIET_WAIT`]
    /// without one; at least `block` in either case) and nothing could have been missed.
    pub async fn wait(&self, block: Duration, until: Option<Instant>) -> bool {
        let mut rings: Vec<watch::Receiver<u64>> = self.rings().clone();
        if rings.is_empty() {
            tokio::time::sleep(block).await;
            return true;
        }
        if rings.iter().any(|rx| rx.has_changed().unwrap_or(true)) {
            return true;
        }
        // Going down rings every key; coming back rings the keys it subscribes.
        let trusted = self.trusted();
        let polling = self.polls();
        let any_ring = futures::future::select_all(
            rings
                .iter_mut()
                .map(|rx| Box::pin(async move { rx.changed().await.is_ok() })),
        );
        // A polling doorbell sees entries added, not every other write (see `poll`): after
        // a longer quiet wait the waiter looks anyway.
        let most = if polling { POLLED_QUIET } else { QUIET_WAIT };
        let wait = if trusted {
            let quiet = until.map_or(most, |at| {
                at.saturating_duration_since(Instant::now()).min(most)
            });
            block.max(quiet)
        } else {
            block
        };
        tokio::select! {
            _ = any_ring => true,
            () = tokio::time::sleep(wait) => !trusted || (polling && wait >= most),
        }
    }
}

/// A bell's rings at one moment (see [`Bell::mark`]).
#[derive(Debug, Clone)]
pub struct Mark {
    rings: Vec<u64>,
    at: Instant,
}

impl Drop for Bell {
    fn drop(&mut self) {
        if self.wanting.load(Ordering::Acquire) {
            self.doorbell.want(&self.keys, false);
        }
    }
}
