//! This host's part in the subscription's canary: [`Rollout::follow`] watches the flow state
//! the way a pause is watched, and a [`Follower`] makes this host's part match what Redis says:
//! it opens the record (only when it changed), joins a running canary ([`super::join`]),
//! reports its counts and acts on the verdict ([`super::report`]), and ends its trial
//! ([`super::end`]). A verdict it saw is remembered, so a record whose verdict goes from Redis
//! is written back as ended and never joined again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Rollout;
use super::canary::{self, Outcome, Record, Verdict};
use super::key::RolloutKey;
use crate::handler::{Tally, Trial};
use crate::pipeline::admit::FlowState;

impl Rollout {
    /// Follow the subscription's canary, as `flow` shows it, until `stop`: join a running one,
    /// report this host's counts, apply the verdict.
    pub async fn follow(
        self: Arc<Self>,
        mut flow: watch::Receiver<FlowState>,
        stop: CancellationToken,
    ) {
        let mut follower = Follower::new(&self);
        let mut tick = tokio::time::interval(canary::REPORT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut first = true;
        loop {
            // Only a canary this host runs (or could not join) needs the clock: with none,
            // the follower waits for the flow state to change, and an idle host's thousands
            // of subscriptions cost no wake-up here.
            let ticking = first || follower.installed.is_some() || follower.failed.is_some();
            first = false;
            tokio::select! {
                changed = flow.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tick.tick(), if ticking => {}
                () = stop.cancelled() => return,
            }
            let state = flow.borrow_and_update().clone();
            follower.look(&state).await;
            follower.report().await;
        }
    }
}

/// A trial this host runs, with the record it follows.
pub(super) struct Installed {
    pub(super) record: Record,
    pub(super) trial: Arc<Trial>,
    /// When this host joined: a canary nobody judges is ended here after its window.
    pub(super) joined: tokio::time::Instant,
}

/// What this host knows of the subscription's canary between two looks at the flow state.
pub(super) struct Follower<'a> {
    pub(super) rollout: &'a Rollout,
    /// A verdict field for the current record that does not verify (another writer's): read
    /// past by reports, replaced by a verdict.
    pub(super) forged: Vec<u8>,
    /// The last canaries this host saw decided, with their verdicts: a record's life is one
    /// way, so a verdict that goes from Redis is written back and the record not joined again.
    ended: VecDeque<Verdict>,
    pub(super) installed: Option<Installed>,
    /// Counts not yet added to the group's (a report failed).
    pub(super) pending: [Tally; 2],
    /// A canary this host could not join, and when it may try again.
    pub(super) failed: Option<(String, tokio::time::Instant)>,
    /// The last record refused, not to log it on every look.
    refused: Option<Vec<u8>>,
    /// Whether the last report failed (logged once, and once when they reach Redis again).
    pub(super) report_failing: bool,
    /// The record and verdict last converged on.
    seen: Option<Seen>,
}

/// A canary record and its verdict, as stored.
type Seen = (Option<Vec<u8>>, Option<Vec<u8>>);

/// How long a host waits before trying again to join a canary it could not.
const JOIN_RETRY: Duration = Duration::from_secs(5);
/// How many decided canaries a host remembers (see [`Follower::ended`]).
const REMEMBERED: usize = 16;

impl<'a> Follower<'a> {
    /// A follower of `rollout`'s canary that knows of none yet.
    fn new(rollout: &'a Rollout) -> Self {
        Self {
            rollout,
            forged: Vec::new(),
            ended: VecDeque::new(),
            installed: None,
            pending: [Tally::default(), Tally::default()],
            failed: None,
            refused: None,
            report_failing: false,
            seen: None,
        }
    }
}

impl Follower<'_> {
    /// The subscription's stream and group, as logs name them.
    pub(super) fn labels(&self) -> (&str, &str) {
        (self.rollout.stream(), self.rollout.group())
    }

    /// The rollout key, when this host holds one.
    pub(super) fn key(&self) -> Option<&RolloutKey> {
        self.rollout.key.as_deref()
    }

    /// A look at the flow `state`: the record is opened (parsed, its seal checked) only when
    /// it changed, or to try joining again after a failure.
    async fn look(&mut self, state: &FlowState) {
        let seen = (state.canary.clone(), state.canary_verdict.clone());
        let changed = self.seen.as_ref() != Some(&seen);
        if state.known && (changed || self.failed.is_some()) {
            self.seen = Some(seen);
            self.converge(state).await;
            // Known now whether a canary runs: deliveries held since the start go on
            // (unless this host could neither join a canary nor end it: its share waits).
            if self.failed.is_none() {
                self.rollout.control.slot().joined();
            }
        }
    }

    /// Look at the next flow state afresh, even if it equals the last one.
    pub(super) fn forget_seen(&mut self) {
        self.seen = None;
    }

    /// Keep `verdict` among the last canaries seen decided.
    pub(super) fn remember(&mut self, verdict: &Verdict) {
        if self.ended.iter().any(|v| v.id == verdict.id) {
            return;
        }
        if self.ended.len() == REMEMBERED {
            self.ended.pop_front();
        }
        self.ended.push_back(verdict.clone());
    }

    /// The record in `state`, if its seal verifies (a refused one is logged once).
    fn record(&mut self, state: &FlowState) -> Option<Record> {
        let raw = state.canary.as_ref()?;
        let (stream, group) = self.labels();
        match Record::open(raw, self.key(), stream, group) {
            Ok(record) => {
                self.refused = None;
                Some(record)
            }
            Err(why) => {
                if self.refused.as_deref() != Some(raw.as_slice()) {
                    tracing::warn!(stream, group, "canary record ignored: {why}");
                    self.refused = Some(raw.clone());
                }
                None
            }
        }
    }

    /// The verdict for `record` in `state`, if one is there and its seal verifies; one that
    /// does not is kept in `forged` and logged.
    fn verdict(&mut self, state: &FlowState, record: &Record) -> Option<Verdict> {
        let raw = state.canary_verdict.as_deref().unwrap_or_default();
        if !canary::contains(raw, record.id.as_bytes()) {
            self.forged.clear();
            return None;
        }
        let (stream, group) = self.labels();
        match Verdict::open(raw, self.key(), (stream, group), &record.id) {
            Ok(verdict) => {
                self.forged.clear();
                Some(verdict)
            }
            Err(why) => {
                if self.forged != raw {
                    tracing::warn!(stream, group, "canary verdict ignored: {why}");
                    self.forged = raw.to_vec();
                }
                None
            }
        }
    }

    /// A canary this host saw decided whose verdict is gone or replaced: its verdict is
    /// written back, and the record stays ended.
    async fn restore(&mut self, record: &Record, state: &FlowState) -> bool {
        let Some(verdict) = self.ended.iter().find(|v| v.id == record.id).cloned() else {
            return false;
        };
        let Some(key) = self.key() else {
            return true;
        };
        let (stream, group) = self.labels();
        let sealed = verdict.sealed(key, stream, group);
        let seen = state.canary_verdict.clone().unwrap_or_default();
        let mut conn = self.rollout.conn.clone();
        match canary::write_verdict(&mut conn, record, &sealed, &seen).await {
            Ok(true) => {
                tracing::warn!(
                    stream,
                    group,
                    candidate = %crate::support::digest::short(&record.candidate),
                    "the verdict of a canary this host saw {} was gone from Redis or not sealed: written back, and the canary stays ended",
                    verdict.outcome.name()
                );
                let _ = crate::pipeline::admit::bump(&mut conn, stream, group).await;
            }
            // The field changed since `state` was read: the next look sees it.
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(stream, group, %err, "cannot write the canary's verdict back")
            }
        }
        true
    }

    /// Whether the record's window is over by the server's clock (a minute's grace): a record
    /// past it is not joined (written back by another writer, say).
    async fn past_window(&self, record: &Record) -> bool {
        let mut conn = self.rollout.conn.clone();
        let now = canary::server_ms(&mut conn).await.unwrap_or(0);
        now > record
            .ends_ms
            .saturating_add(u64::try_from(canary::ABANDONED_AFTER.as_millis()).unwrap_or(0))
    }

    /// Make this host's part match what Redis says.
    async fn converge(&mut self, state: &FlowState) {
        let record = self.record(state);
        let Some(record) = record else {
            self.failed = None;
            self.forged.clear();
            if let Some(installed) = self.installed.take() {
                self.end(
                    installed,
                    Outcome::RolledBack,
                    "its record is gone from Redis",
                );
            }
            return;
        };
        let decided = self.verdict(state, &record);
        if let Some(verdict) = decided {
            self.failed = None;
            self.remember(&verdict);
            if let Some(installed) = self.installed.take() {
                if installed.record.id == record.id {
                    self.apply(installed, &verdict);
                } else {
                    self.end(installed, Outcome::RolledBack, "another canary replaced it");
                }
            }
            return;
        }
        if self.restore(&record, state).await {
            return;
        }
        if let Some(installed) = &self.installed {
            if installed.record.id == record.id {
                return;
            }
            if let Some(installed) = self.installed.take() {
                self.end(installed, Outcome::RolledBack, "another canary replaced it");
            }
        }
        if let Some((id, at)) = &self.failed
            && *id == record.id
            && at.elapsed() < JOIN_RETRY
        {
            return;
        }
        if self.past_window(&record).await {
            let (stream, group) = self.labels();
            tracing::warn!(
                stream,
                group,
                candidate = %crate::support::digest::short(&record.candidate),
                "canary record not joined: its window ended more than a minute ago"
            );
            return;
        }
        match self.join(&record).await {
            Ok(installed) => {
                self.failed = None;
                self.installed = Some(installed);
            }
            Err(err) => {
                self.could_not_join(&record, &err).await;
                // Ended by another writer meanwhile (an abort that took the candidate's
                // bytes): its verdict, kept, is written back if it went before this look.
                self.restore(&record, state).await;
            }
        }
    }
}
