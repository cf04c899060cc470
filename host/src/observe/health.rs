//! How a subscription's reads are going, for readiness: when the last read succeeded and what
//! the last failure was; whether its due retries are held back (see
//! [`ReadHealth::retries_held`]); and whether this host still knows its flow controls (see
//! [`FlowFreshness`]).

use std::sync::{Arc, Mutex};
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
    /// Whether the subscription's flow controls are known, if it has a watcher.
    flow: Option<Arc<FlowFreshness>>,
    /// Other things the read loop waits on (the rate limit's budget), each failing or not.
    troubles: Vec<Arc<Trouble>>,
}

/// Something a read waits on that can fail on its own (the rate limit's budget): failing for
/// over [`FLOW_STALE_AFTER`] makes the subscription not ready, with what failed.
#[derive(Debug)]
pub struct Trouble {
    what: &'static str,
    failing: Mutex<Option<(Instant, String)>>,
}

impl Trouble {
    /// A tracker for `what`, not failing.
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            failing: Mutex::new(None),
        }
    }

    /// It worked.
    pub fn ok(&self) {
        if let Ok(mut failing) = self.failing.lock() {
            *failing = None;
        }
    }

    /// It failed with `why` (the time it started failing is kept).
    pub fn failed(&self, why: &str) {
        if let Ok(mut failing) = self.failing.lock() {
            let since = failing.as_ref().map_or_else(Instant::now, |f| f.0);
            *failing = Some((since, why.to_owned()));
        }
    }

    /// Why it counts as down: failing for over [`FLOW_STALE_AFTER`].
    pub fn problem(&self) -> Option<String> {
        let failing = self.failing.lock().ok()?;
        let (since, why) = failing.as_ref()?;
        (since.elapsed() > FLOW_STALE_AFTER).then(|| {
            format!(
                "{} has failed for {:.1}s, nothing is read meanwhile: {why}",
                self.what,
                since.elapsed().as_secs_f64()
            )
        })
    }
}

/// How long a subscription's flow controls (pause, breaker) may go unconfirmed before the host
/// counts as not ready: the watcher confirms them every quarter second.
pub const FLOW_STALE_AFTER: Duration = Duration::from_secs(10);

/// When this host last confirmed a subscription's flow controls with Redis. A host that cannot
/// read whether its subscription is paused (the flow hash of the wrong type, a watcher that
/// stopped) takes no entries if it never knew, or acts on what it last knew: either way
/// readiness must say so rather than look healthy.
#[derive(Debug)]
pub struct FlowFreshness {
    state: Mutex<(Instant, Option<String>)>,
}

impl Default for FlowFreshness {
    fn default() -> Self {
        Self {
            state: Mutex::new((Instant::now(), None)),
        }
    }
}

impl FlowFreshness {
    /// The flow controls were read (or found unchanged) just now.
    pub fn confirmed(&self) {
        if let Ok(mut state) = self.state.lock() {
            *state = (Instant::now(), None);
        }
    }

    /// Reading them failed with `why`.
    pub fn failed(&self, why: &str) {
        if let Ok(mut state) = self.state.lock() {
            state.1 = Some(why.to_owned());
        }
    }

    /// Why the flow controls count as unknown: not confirmed for over [`FLOW_STALE_AFTER`].
    pub fn problem(&self) -> Option<String> {
        let state = self.state.lock().ok()?;
        let age = state.0.elapsed();
        (age > FLOW_STALE_AFTER).then(|| {
            format!(
                "the subscription's flow controls (pause, circuit breaker) were not read from Redis for {:.1}s: {}",
                age.as_secs_f64(),
                state
                    .1
                    .as_deref()
                    .unwrap_or("the host's flow watcher is not running")
            )
        })
    }
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
            flow: None,
            troubles: Vec::new(),
        }
    }

    /// Readiness also asks whether `trouble` is failing (see [`Trouble`]).
    pub fn with_trouble(mut self, trouble: Arc<Trouble>) -> Self {
        self.troubles.push(trouble);
        self
    }

    /// Readiness also asks whether the flow controls are known (see [`FlowFreshness`]).
    pub fn with_flow(mut self, flow: Arc<FlowFreshness>) -> Self {
        self.flow = Some(flow);
        self
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

    /// The read loop reads nothing for now (the subscription is paused or its breaker is
    /// open): an earlier read failure no longer counts against it.
    pub fn not_reading(&self) {
        self.read_ok();
    }

    /// A read (or the connection for it) failed with `message`.
    pub fn failed(&self, message: &str) {
        if let Ok(mut state) = self.state.lock() {
            state.failing_since.get_or_insert_with(Instant::now);
            state.last_error = Some(message.to_owned());
        }
    }

    /// Why the subscription is not ready: reads have failed for longer than the tolerance, its
    /// due retries are held back, or its flow controls are not known.
    pub fn problem(&self) -> Option<String> {
        if let Some(why) = self.down.lock().ok().and_then(|d| d.clone()) {
            return Some(why);
        }
        if let Some(why) = self.held.lock().ok().and_then(|h| h.clone()) {
            return Some(why);
        }
        if let Some(why) = self.flow.as_ref().and_then(|f| f.problem()) {
            return Some(why);
        }
        if let Some(why) = self.troubles.iter().find_map(|t| t.problem()) {
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
