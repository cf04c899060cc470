//! How a subscription's reads are going, for readiness: when the last read succeeded and what
//! the last failure was; and whether its due retries are held back (see
//! [`ReadHealth::retries_held`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The read loop's record, shared with the admin server.
#[derive(Debug)]
pub struct ReadHealth {
    /// How long reads may fail before the subscription counts as not ready: its block time
    /// (a healthy read returns within it) plus a grace for a reconnect.
    tolerance: Duration,
    state: Mutex<State>,
    /// Why due retries are held in the delayed set, if they are.
    held: Mutex<Option<String>>,
    /// Why the read loop is down (it ended or panicked and waits to be restarted), if it is.
    down: Mutex<Option<String>>,
}

#[derive(Debug)]
struct State {
    last_ok: Instant,
    failing_since: Option<Instant>,
    last_error: Option<String>,
}

impl ReadHealth {
    /// A record for a subscription whose reads block for up to `block`; it starts healthy (the
    /// first read is being made).
    pub fn new(block: Duration) -> Self {
        Self {
            tolerance: block + Duration::from_secs(1),
            state: Mutex::new(State {
                last_ok: Instant::now(),
                failing_since: None,
                last_error: None,
            }),
            held: Mutex::new(None),
            down: Mutex::new(None),
        }
    }

    /// The read loop ended without being asked to, for `why` (`None`: it runs again). Not
    /// ready at once: nothing reads the subscription until it is back.
    pub fn loop_down(&self, why: Option<String>) {
        if let Ok(mut down) = self.down.lock() {
            *down = why;
        }
    }

    /// The delayed set's sweep holds due retries back, for `why` (`None`: it moves them
    /// again). Retries are safe in the set meanwhile, but they do not come back, which is
    /// something to fix: readiness says so.
    pub fn retries_held(&self, why: Option<String>) {
        if let Ok(mut held) = self.held.lock() {
            *held = why;
        }
    }

    /// A read succeeded.
    pub fn read_ok(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.last_ok = Instant::now();
            state.failing_since = None;
            state.last_error = None;
        }
    }

    /// A read (or the connection for it) failed with `message`.
    pub fn failed(&self, message: &str) {
        if let Ok(mut state) = self.state.lock() {
            state.failing_since.get_or_insert_with(Instant::now);
            state.last_error = Some(message.to_owned());
        }
    }

    /// Why the subscription is not ready: reads have failed for longer than the tolerance, or
    /// its due retries are held back.
    pub fn problem(&self) -> Option<String> {
        if let Some(why) = self.down.lock().ok().and_then(|d| d.clone()) {
            return Some(why);
        }
        if let Some(why) = self.held.lock().ok().and_then(|h| h.clone()) {
            return Some(why);
        }
        let state = self.state.lock().ok()?;
        // Failing since after the last success, so this also bounds the time since it.
        (state.failing_since?.elapsed() > self.tolerance).then(|| {
            format!(
                "no successful read for {:.1}s: {}",
                state.last_ok.elapsed().as_secs_f64(),
                state.last_error.as_deref().unwrap_or("unknown error")
            )
        })
    }
}
