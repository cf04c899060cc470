//! The flow watcher: one task per Redis that keeps every subscription's [`FlowState`] current
//! (pauses, breakers, canaries), polling one epoch key and reading only what the change log
//! names, with a rolling re-read that catches a writer that died before its bump.
//!
//! Quiet: on a Redis with a doorbell whose rings can be trusted, the watcher does not poll. It
//! waits for the change log's bell (every note is an XADD to it), polls when it rings, and
//! confirms the states current for readiness without asking Redis while nothing rang; it
//! looks at the epoch (a writer of an earlier release bumps it with no note) every
//! [`QUIET_POLL`], and re-reads every flow hash then too, [`super::READ_MANY_AT_ONCE`] per call
//! (the rolling re-read's work: a writer that died between its write and its note). An idle
//! host thus sends the flow controls a handful of commands every few minutes, not 40 a second.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    CONFIRM_EVERY, FULL_REFRESH, FULL_REREAD_EVERY, FlowState, MAX_REREAD_PER_POLL, POLL, breaker,
    changes, newest_change, read,
};
use crate::observe::health::FlowFreshness;
use crate::observe::metrics::Metrics;
use crate::store::doorbell::{Bell, Doorbell, Mark};
use crate::store::keys::{FLOW_CHANGES, FLOW_EPOCH, flow_key};
use crate::store::redis_conn::RedisHandle;

/// One subscription a [`FlowWatcher`] keeps up to date.
struct Watched {
    stream: String,
    group: String,
    /// Its flow hash's name, as the change log names it.
    key: Vec<u8>,
    state: watch::Sender<FlowState>,
    fresh: Arc<FlowFreshness>,
    paused_gauge: crate::observe::metrics::Share,
    breaker_gauge: crate::observe::metrics::Share,
}

/// What a subscription's read loops and readiness get from the [`FlowWatcher`].
#[derive(Debug, Clone)]
pub struct FlowWatch {
    /// The flow state, as last read.
    pub state: watch::Receiver<FlowState>,
    /// When it was last confirmed.
    pub fresh: Arc<FlowFreshness>,
}

/// Keeps the flow state of every subscription on one Redis up to date on this host.
pub struct FlowWatcher {
    conn: RedisHandle,
    watched: Vec<Watched>,
    /// The Redis's doorbell, if it has one: the watcher is quiet while it vouches.
    doorbell: Option<Arc<Doorbell>>,
    /// See [`QUIET_POLL`].
    quiet_poll: Duration,
}

/// A quiet watcher (see the module doc) looks at the epoch and re-reads every flow hash this
/// often.
pub const QUIET_POLL: Duration = Duration::from_secs(300);
/// A quiet watcher confirms the states current (without a command) this often.
const QUIET_CONFIRM: Duration = Duration::from_secs(3);

impl FlowWatcher {
    /// A watcher reading through `conn`, quiet while `doorbell` (its Redis's) vouches.
    pub fn new(conn: RedisHandle, doorbell: Option<Arc<Doorbell>>) -> Self {
        Self {
            conn,
            watched: Vec::new(),
            doorbell,
            quiet_poll: QUIET_POLL,
        }
    }

    /// Look at the epoch and re-read every state this often while quiet (tests: seconds).
    #[must_use]
    pub fn with_quiet_poll(mut self, every: Duration) -> Self {
        self.quiet_poll = every;
        self
    }

    /// Watch the subscription to `stream` with `group`: its state, what the read loops (and the
    /// admin server) look at, and when it was last confirmed, for readiness.
    pub fn watch(&mut self, stream: &str, group: &str, metrics: &Metrics) -> FlowWatch {
        if let Some(known) = self
            .watched
            .iter()
            .find(|w| w.stream == stream && w.group == group)
        {
            return FlowWatch {
                state: known.state.subscribe(),
                fresh: known.fresh.clone(),
            };
        }
        let (state, receiver) = watch::channel(FlowState::default());
        let fresh = Arc::new(FlowFreshness::default());
        self.watched.push(Watched {
            stream: stream.to_owned(),
            group: group.to_owned(),
            key: flow_key(stream, group).into_bytes(),
            state,
            fresh: fresh.clone(),
            paused_gauge: metrics.share(&metrics.paused, &Metrics::labels(stream, group)),
            breaker_gauge: metrics.share(&metrics.breaker_state, &Metrics::labels(stream, group)),
        });
        FlowWatch {
            state: receiver,
            fresh,
        }
    }

    /// Poll until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut poll = Poll::default();
        // Always wanted: the change log's bell never lets go of its key.
        let bell = self.doorbell.as_ref().map(|d| {
            let bell = d.bell(&[FLOW_CHANGES]);
            bell.set_idle(true);
            bell
        });
        loop {
            let mark = bell.as_ref().and_then(Bell::mark);
            if let Some(bell) = &bell {
                bell.seen();
            }
            poll.quiet = mark.is_some();
            let mut conn = self.conn.clone();
            // Compared as bytes (at most 64 of them): whatever another writer left there, any
            // change makes the hosts look.
            let epoch: RedisResult<Vec<u8>> = redis::cmd("GETRANGE")
                .arg(FLOW_EPOCH)
                .arg(0)
                .arg(63)
                .query_async(&mut conn)
                .await;
            match epoch {
                Ok(epoch) => {
                    let epoch = Some(epoch);
                    if poll.refreshed_at.is_none() {
                        self.first_read(&mut conn, &mut poll, epoch).await;
                    } else if epoch != poll.seen {
                        self.epoch_moved(&mut conn, &mut poll, epoch).await;
                    } else {
                        self.unchanged(&mut conn, &mut poll).await;
                    }
                    if poll.failing {
                        tracing::info!("flow controls readable again");
                        poll.failing = false;
                    }
                }
                Err(err) => self.epoch_failed(&mut conn, &mut poll, &err).await,
            }
            let go_on = match (&bell, &mark) {
                (Some(bell), Some(mark)) if !poll.failing => {
                    self.quiet_wait(bell, mark, &poll, &stop).await
                }
                _ => tokio::select! {
                    () = tokio::time::sleep(POLL) => true,
                    () = stop.cancelled() => false,
                },
            };
            if !go_on {
                return;
            }
        }
    }

    /// Wait, quiet, until the change log's bell rings, it can no longer vouch, or
    /// [`QUIET_POLL`] passed; meanwhile confirm the states current every [`QUIET_CONFIRM`]
    /// without asking Redis. `false` at `stop`.
    async fn quiet_wait(
        &self,
        bell: &Bell,
        mark: &Mark,
        poll: &Poll,
        stop: &CancellationToken,
    ) -> bool {
        let since = tokio::time::Instant::now();
        loop {
            let until = tokio::time::Instant::now() + QUIET_CONFIRM;
            let rang = tokio::select! {
                rang = bell.wait(POLL, Some(until)) => rang,
                () = stop.cancelled() => return false,
            };
            if rang || !bell.unrung_since(mark) || since.elapsed() >= self.quiet_poll {
                return true;
            }
            for (i, watched) in self.watched.iter().enumerate() {
                if !poll.unread.contains(&i) {
                    watched.fresh.confirmed();
                }
            }
        }
    }

    /// The first poll: every state read, and where the change log stands.
    async fn first_read(&self, conn: &mut RedisHandle, poll: &mut Poll, epoch: Option<Vec<u8>>) {
        poll.logged_to = newest_change(conn).await;
        poll.unread = self.refresh(conn, 0..self.watched.len()).await;
        poll.seen = epoch;
        poll.refreshed_at = Some(tokio::time::Instant::now());
    }

    /// The epoch moved: the states the change log names read again (and those whose last
    /// read failed); with nothing logged (a host of the earlier release, or another client's
    /// INCR), everything, but not often.
    async fn epoch_moved(&self, conn: &mut RedisHandle, poll: &mut Poll, epoch: Option<Vec<u8>>) {
        let (mut which, moved, more) = self.changed(conn, &mut poll.logged_to).await;
        if moved {
            which.append(&mut poll.unread);
            which.sort_unstable();
            which.dedup();
            poll.unread = self.refresh(conn, which.into_iter()).await;
            // With more logged than a poll takes, the next poll goes on.
            if !more {
                poll.seen = epoch;
            }
        } else if poll
            .full_at
            .is_none_or(|at| at.elapsed() >= FULL_REREAD_EVERY)
        {
            poll.unread = self.refresh(conn, 0..self.watched.len()).await;
            poll.seen = epoch;
            poll.full_at = Some(tokio::time::Instant::now());
            poll.refreshed_at = poll.full_at;
        }
    }

    /// Nothing changed since the last full read: every state is current but those whose read
    /// failed. A writer that died between its write and its epoch bump is caught by the rolling
    /// re-read. Readiness wants this within seconds, not at every poll: thousands of
    /// subscriptions confirmed 4 times a second were most of an idle host's CPU.
    async fn unchanged(&self, conn: &mut RedisHandle, poll: &mut Poll) {
        if poll
            .confirmed_at
            .is_none_or(|at| at.elapsed() >= CONFIRM_EVERY)
        {
            for (i, watched) in self.watched.iter().enumerate() {
                if !poll.unread.contains(&i) {
                    watched.fresh.confirmed();
                }
            }
            poll.confirmed_at = Some(tokio::time::Instant::now());
        }
        if poll.quiet {
            // Every flow hash read again every QUIET_POLL, a few calls in all; those whose
            // read failed at every wake.
            if poll
                .quiet_refresh_at
                .is_none_or(|at| at.elapsed() >= self.quiet_poll)
            {
                poll.unread = self.refresh_all(conn).await;
                poll.quiet_refresh_at = Some(tokio::time::Instant::now());
            } else if !poll.unread.is_empty() {
                let again = std::mem::take(&mut poll.unread);
                poll.unread = self.refresh(conn, again.into_iter()).await;
            }
            return;
        }
        let n = self.watched.len();
        let share = rolling_share(n);
        let again = std::mem::take(&mut poll.unread);
        let next = (poll.cursor..poll.cursor + share).map(|i| i % n.max(1));
        poll.cursor = (poll.cursor + share) % n.max(1);
        let mut which: Vec<usize> = again.into_iter().chain(next).collect();
        which.sort_unstable();
        which.dedup();
        poll.unread = self.refresh(conn, which.into_iter()).await;
    }

    /// The epoch could not be read (Redis away, a key of the wrong type): every state says so;
    /// the flow hashes may still be readable, every full refresh.
    async fn epoch_failed(&self, conn: &mut RedisHandle, poll: &mut Poll, err: &redis::RedisError) {
        self.conn.saw_error(err);
        let why = format!("cannot read {FLOW_EPOCH}: {err}");
        for watched in &self.watched {
            watched.fresh.failed(&why);
        }
        if poll
            .refreshed_at
            .is_none_or(|at| at.elapsed() >= FULL_REFRESH)
        {
            poll.unread = self.refresh(conn, 0..self.watched.len()).await;
            if poll.unread.is_empty() {
                poll.refreshed_at = Some(tokio::time::Instant::now());
            }
        }
        if !poll.failing {
            tracing::warn!(
                %err,
                "cannot read the flow controls (pauses) from Redis; keeping what was known"
            );
            poll.failing = true;
        }
    }

    /// The watched subscriptions the change log names after `logged_to` (which moves on),
    /// whether it named anything (a log that cannot be read names nothing), and whether it
    /// may name more.
    async fn changed(
        &self,
        conn: &mut RedisHandle,
        logged_to: &mut String,
    ) -> (Vec<usize>, bool, bool) {
        let Ok((keys, next, more)) = changes(conn, logged_to).await else {
            return (Vec::new(), false, false);
        };
        let moved = next != *logged_to;
        *logged_to = next;
        let which = self
            .watched
            .iter()
            .enumerate()
            .filter(|(_, w)| keys.contains(&w.key))
            .map(|(i, _)| i)
            .collect();
        (which, moved, more)
    }

    /// Take `next` as the state of the watched subscription at `i`.
    fn apply(&self, i: usize, next: FlowState) {
        let Some(watched) = self.watched.get(i) else {
            return;
        };
        watched.fresh.confirmed();
        watched.paused_gauge.set(i64::from(next.paused.is_some()));
        let breaker = next.breaker.as_ref();
        watched
            .breaker_gauge
            .set(if watched.breaker_gauge.summed() {
                i64::from(breaker.is_some())
            } else {
                breaker.map_or(0, breaker::BreakerState::gauge)
            });
        watched.state.send_if_modified(|now| {
            if *now == next {
                return false;
            }
            match (&now.paused, &next.paused) {
                (_, Some(p)) if now.paused.as_ref() != Some(p) => tracing::warn!(
                    stream = %watched.stream,
                    group = %watched.group,
                    by = %p.by,
                    "subscription {}: no new entries are read until it is resumed",
                    p.describe()
                ),
                (Some(_), None) => tracing::info!(
                    stream = %watched.stream,
                    group = %watched.group,
                    "subscription resumed: reading again"
                ),
                _ => {}
            }
            let was = now.breaker.as_ref().map(|b| b.state);
            let is = next.breaker.as_ref().map(|b| b.state);
            if was != is {
                match &next.breaker {
                    Some(b) => tracing::warn!(
                        stream = %watched.stream,
                        group = %watched.group,
                        "circuit breaker {}",
                        b.describe()
                    ),
                    None => tracing::info!(
                        stream = %watched.stream,
                        group = %watched.group,
                        "circuit breaker closed: reading again"
                    ),
                }
            }
            *now = next;
            true
        });
    }

    /// Read every watched state, [`super::READ_MANY_AT_ONCE`] per call; those that could not
    /// be read (kept as they were) are returned.
    async fn refresh_all(&self, conn: &mut RedisHandle) -> Vec<usize> {
        let keys: Vec<Vec<u8>> = self.watched.iter().map(|w| w.key.clone()).collect();
        match super::read_many(conn, &keys).await {
            Ok(states) => {
                let mut unread = Vec::new();
                for (i, state) in states.into_iter().enumerate() {
                    match state {
                        Some(state) => self.apply(i, state),
                        None => unread.push(i),
                    }
                }
                // Those of another type: read alone, to say why.
                self.refresh(conn, unread.into_iter()).await
            }
            Err(_) => self.refresh(conn, 0..self.watched.len()).await,
        }
    }

    /// Read the states of the watched subscriptions at `which`; those that could not be read
    /// (kept as they were) are returned.
    async fn refresh(
        &self,
        conn: &mut RedisHandle,
        which: impl Iterator<Item = usize>,
    ) -> Vec<usize> {
        let mut unread = Vec::new();
        for i in which {
            let Some(watched) = self.watched.get(i) else {
                continue;
            };
            match read(conn, &watched.stream, &watched.group).await {
                Ok(next) => self.apply(i, next),
                Err(err) => {
                    unread.push(i);
                    watched.fresh.failed(&format!(
                        "cannot read {}: {err}",
                        flow_key(&watched.stream, &watched.group)
                    ));
                    tracing::warn!(
                        stream = %watched.stream,
                        group = %watched.group,
                        %err,
                        "cannot read the subscription's flow controls; keeping what was known"
                    );
                }
            }
        }
        unread
    }
}

/// How many flow states one poll reads again though the epoch did not move: each at least
/// every [`FULL_REFRESH`], and at most [`MAX_REREAD_PER_POLL`] per poll, so that the re-reads
/// of thousands of idle subscriptions cost Redis a bounded load (at 5,000 subscriptions on one
/// Redis a round takes 125 s).
fn rolling_share(watched: usize) -> usize {
    let polls = (FULL_REFRESH.as_millis() / POLL.as_millis()).max(1) as usize;
    watched
        .div_ceil(polls)
        .clamp(1, MAX_REREAD_PER_POLL)
        .min(watched)
}

/// What the flow watcher carries from one poll to the next.
#[derive(Default)]
struct Poll {
    /// The epoch last acted on.
    seen: Option<Vec<u8>>,
    /// When every state was last read.
    refreshed_at: Option<tokio::time::Instant>,
    /// Whether the last poll could not read the epoch.
    failing: bool,
    /// The rolling re-read (see [`rolling_share`]): where it goes on.
    cursor: usize,
    /// The states whose last read failed, read again at every poll until one succeeds.
    unread: Vec<usize>,
    /// When readiness was last told the states are current.
    confirmed_at: Option<tokio::time::Instant>,
    /// Where this host stands in the change log.
    logged_to: String,
    /// When it last read everything because the epoch moved with nothing logged.
    full_at: Option<tokio::time::Instant>,
    /// Whether the doorbell vouched for the change log's rings at this poll.
    quiet: bool,
    /// When a quiet watcher last read every state.
    quiet_refresh_at: Option<tokio::time::Instant>,
}
