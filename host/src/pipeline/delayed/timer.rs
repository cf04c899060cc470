//! One precise timer for every delayed set of the process: the last few milliseconds before a
//! retry is due are slept on a single thread, whatever the number of sets.
//!
//! Tokio's timer wheel counts whole milliseconds and wakes on its next tick (measured here:
//! 1.2 ms late at the median, 2.2 ms at the 99th percentile, most of an idle retry's lateness).
//! A set's timer therefore waits on tokio's wheel until [`COARSE_TIMER_SLACK`] before its due
//! time and then hands over to this timer: one thread that keeps every waiting due time in a
//! heap and sleeps on a condition variable until the earliest (0.1-0.2 ms late here). Before,
//! each set slept its last milliseconds on a blocking-pool thread of its own, so 5,000 sets
//! due at once asked for 5,000 threads.
//!
//! Bounds: a waiter is in the heap for at most [`COARSE_TIMER_SLACK`] (it registers only that
//! close to its time), and one dropped before its time (a park moved the set's earliest due
//! time) leaves an entry that is removed when its time comes; so the heap holds at most what
//! was registered in the last few milliseconds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// How early before a due time tokio's timer hands over to the precise one.
pub const COARSE_TIMER_SLACK: Duration = Duration::from_millis(3);

/// Waiting due times, earliest first, each with its waiter (the sequence number keeps equal
/// times apart).
#[derive(Default)]
struct Waiting {
    heap: BinaryHeap<Reverse<(std::time::Instant, u64)>>,
    wakers: std::collections::HashMap<u64, oneshot::Sender<()>>,
    next: u64,
    started: bool,
}

struct Timer {
    waiting: Mutex<Waiting>,
    changed: Condvar,
}

static TIMER: LazyLock<Timer> = LazyLock::new(|| Timer {
    waiting: Mutex::new(Waiting::default()),
    changed: Condvar::new(),
});

impl Timer {
    /// Wake every waiter whose time has come, then sleep until the next one or a change.
    fn run(&self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = std::time::Instant::now();
            while let Some(Reverse((at, id))) = waiting.heap.peek().copied() {
                if at > now {
                    break;
                }
                waiting.heap.pop();
                if let Some(waker) = waiting.wakers.remove(&id) {
                    // A waiter that went away meanwhile is simply not there to wake.
                    let _ = waker.send(());
                }
            }
            waiting = match waiting.heap.peek().copied() {
                Some(Reverse((at, _))) => {
                    let rest = at.saturating_duration_since(std::time::Instant::now());
                    self.changed
                        .wait_timeout(waiting, rest)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(waiting)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }

    /// A waiter woken at `at`; `None` if the timer's thread cannot be started.
    fn register(&'static self, at: std::time::Instant) -> Option<oneshot::Receiver<()>> {
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if !waiting.started {
            std::thread::Builder::new()
                .name("sluice-retry-timer".into())
                .spawn(|| TIMER.run())
                .ok()?;
            waiting.started = true;
        }
        let id = waiting.next;
        waiting.next = waiting.next.wrapping_add(1);
        waiting.heap.push(Reverse((at, id)));
        waiting.wakers.insert(id, tx);
        drop(waiting);
        self.changed.notify_one();
        Some(rx)
    }
}

/// Sleep until `at` to within a fraction of a millisecond: tokio's timer up to
/// [`COARSE_TIMER_SLACK`] before it, then the process's precise timer for the rest (tokio's
/// timer alone if that timer's thread cannot be started).
pub async fn sleep_until_precisely(at: Instant) {
    if let Some(coarse) = at.checked_sub(COARSE_TIMER_SLACK)
        && coarse > Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    if at <= Instant::now() {
        return;
    }
    match TIMER.register(at.into_std()) {
        Some(woken) => {
            // The sender goes only with its wake-up (the thread never drops a waiter early).
            let _ = woken.await;
        }
        None => tokio::time::sleep_until(at).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn many_waiters_wake_in_order_on_one_thread_and_never_early() {
        let start = Instant::now();
        let mut handles = Vec::new();
        for i in 0..200u64 {
            let at = start + Duration::from_millis(5 + (i * 7) % 40);
            handles.push(tokio::spawn(async move {
                sleep_until_precisely(at).await;
                (at, Instant::now())
            }));
        }
        for handle in handles {
            let (at, woke) = handle.await.expect("waiter");
            assert!(woke >= at, "woke {:?} early", at - woke);
        }
        let waiting = TIMER.waiting.lock().expect("timer");
        assert!(waiting.heap.is_empty() && waiting.wakers.is_empty());
    }
}
