//! The gates a read passes before it is sent: the flow controls (an operator's pause, an open
//! circuit breaker, see [`crate::pipeline::admit`]) let it through as an [`Admission`], and what
//! a held read had taken goes back (its rate tokens, its probe, its entries).

use std::collections::HashMap;

use super::Subscription;
use super::commands::ReadEntry;
use crate::entry::delivery::Source;
use crate::pipeline::admit::FlowState;
use crate::pipeline::admit::breaker::Gate;

/// The most delivery counts of held-back entries a read loop keeps (see `hold_back`).
const MAX_HELD_COUNTS: usize = 4096;

/// Why a read was let through the flow controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// Nothing held the subscription.
    Open,
    /// A half-open breaker's probe: one delivery.
    Probe,
    /// The breaker's script found it closed before this host's watcher did.
    BreakerClosed,
}

impl Admission {
    /// Whether the flow controls hold a read let through this way, as they stand now: an
    /// ordinary read by any hold, a probe (or a read the breaker's own script let through)
    /// only by a pause.
    pub(super) fn held_by(self, flow: &FlowState) -> bool {
        match self {
            Admission::Open => !flow.open(),
            Admission::Probe | Admission::BreakerClosed => flow.paused.is_some(),
        }
    }
}

impl Subscription {
    /// What a read did not use: `tokens` back to the rate limit's lease, and, when it started
    /// nothing (`nothing_started`), its probe permit.
    pub(super) fn unused(&self, admission: Admission, tokens: usize, nothing_started: bool) {
        if let Some(rate) = &self.rate {
            rate.give_back(tokens, nothing_started);
        }
        if admission == Admission::Probe
            && nothing_started
            && let Some(breaker) = &self.breaker
        {
            breaker.probe_unused();
        }
    }

    /// Wait while the subscription is paused (or its flow state is not known yet); false if
    /// stopped meanwhile.
    pub(super) async fn wait_open(&self) -> bool {
        let mut flow = self.flow.clone();
        let mut said = false;
        loop {
            {
                let state = flow.borrow_and_update();
                if state.open() {
                    return true;
                }
                if let Some(paused) = &state.paused
                    && !said
                {
                    tracing::info!(
                        stream = %self.plan.stream,
                        group = %self.plan.group,
                        "{}; not reading until resumed",
                        paused.describe()
                    );
                    said = true;
                }
            }
            tokio::select! {
                changed = flow.changed() => {
                    if changed.is_err() {
                        // The watcher is gone: only a stop ends it.
                        self.stop.cancelled().await;
                        return false;
                    }
                }
                () = self.stop.cancelled() => return false,
            }
        }
    }

    /// Wait until the flow controls let this read through: paused, wait for the resume;
    /// with the breaker open, ask it (after the time it names) for a probe. `None` if stopped.
    pub(super) async fn admitted(&self) -> Option<Admission> {
        let mut flow = self.flow.clone();
        let mut said = false;
        loop {
            let (open, paused, breaker) = {
                let state = flow.borrow_and_update();
                (
                    state.open(),
                    state.known.then(|| state.paused.clone()).flatten(),
                    state.known && state.breaker.is_some(),
                )
            };
            if open {
                return Some(Admission::Open);
            }
            let mut wait = None;
            if let Some(paused) = paused {
                if !said {
                    tracing::info!(
                        stream = %self.plan.stream,
                        group = %self.plan.group,
                        "{}; not reading until resumed",
                        paused.describe()
                    );
                    said = true;
                }
            } else if breaker && let Some(b) = &self.breaker {
                match b.gate().await {
                    Gate::Closed => return Some(Admission::BreakerClosed),
                    Gate::Probe => return Some(Admission::Probe),
                    Gate::Wait(after) => wait = Some(after),
                }
            }
            // A breaker another host's configuration opened, without one here: wait for it
            // to close like a pause.
            tokio::select! {
                changed = flow.changed() => {
                    if changed.is_err() {
                        self.stop.cancelled().await;
                        return None;
                    }
                }
                () = async {
                    match wait {
                        Some(after) => tokio::time::sleep(after).await,
                        None => std::future::pending().await,
                    }
                } => {}
                () = self.stop.cancelled() => return None,
            }
        }
    }

    /// After a pause: what a read held back is read again from this consumer's pending list
    /// (a claiming subscription's XAUTOCLAIM finds it instead), and no consumer counts as
    /// gone for another half `consumer_gone_after`. Every host of the group resumes at once,
    /// and each one's pending entries went idle while paused: this host takes its own back
    /// (which makes them busy again) before another one would take them over as a gone
    /// consumer's.
    pub(super) fn resumed(&self, own_pending: &mut Vec<(Source, String)>) {
        // A claiming subscription too: waiting for XAUTOCLAIM would leave a held entry for
        // `claim_min_idle` (its in-flight set keeps a re-read entry from starting twice).
        *own_pending = self.after_last_read();
        if let Some(gone_after) = self.plan.gone_after
            && let Ok(mut next) = self.next_rescue.lock()
        {
            *next = (*next).max(tokio::time::Instant::now() + gone_after / 2);
        }
    }

    /// A read that returned after the pause (or an opened breaker) came: none of its entries
    /// is handled now. All are pending to this consumer: those newer than anything it read are
    /// read again from its pending list after the resume; those at or below (a claim, a
    /// take-over, a lost reply's entries) are looked for among its pending entries by id, as
    /// a lost take-over reply's are, since no re-read from the newest id would find them.
    /// Each one's delivery count is kept in `counts`: the re-read raises Redis's counter for
    /// a delivery that never ran, which must not count as an attempt.
    pub(super) fn hold_back(
        &self,
        batch: Vec<(ReadEntry, u64)>,
        own_pending: &mut Vec<(Source, String)>,
        unanswered: &mut Vec<(Source, Vec<String>)>,
        counts: &mut HashMap<(Source, String), u64>,
    ) {
        if batch.is_empty() {
            return;
        }
        let newest = self.last_read.lock().map(|n| n.clone()).unwrap_or_default();
        let held = batch.len();
        // Bounded: ids never read again (another host took them over) are forgotten at worst
        // with an attempt counted too many.
        if counts.len() + held > MAX_HELD_COUNTS {
            counts.clear();
        }
        let mut older: Vec<(Source, Vec<String>)> = Vec::new();
        for (read, count) in batch {
            counts.insert((read.source, read.id.clone()), count);
            let at_or_below = newest
                .get(&read.source)
                .is_some_and(|last| crate::entry::delivery::cmp_ids(&read.id, last).is_le());
            if !at_or_below {
                continue;
            }
            match older.iter_mut().find(|(s, _)| *s == read.source) {
                Some((_, ids)) => ids.push(read.id),
                None => older.push((read.source, vec![read.id])),
            }
        }
        tracing::info!(
            stream = %self.plan.stream,
            group = %self.plan.group,
            held,
            "paused while a read waited: its entries stay pending until the resume"
        );
        unanswered.extend(older);
        *own_pending = self.after_last_read();
    }
}
