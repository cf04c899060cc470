//! The handler slot: the current version (swapped lock-free), the versions before it, and the
//! trial beside it, if any.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::observe::metrics::{HandlerLabels, Metrics, SubLabels};
use crate::support::digest::Digest;

use super::trial::{Joining, Role, Trial};
use super::{Handler, HandlerCounters, NoPrevious, Version};

/// Which version a delivery runs, or that it must wait for a join first.
pub enum Picked {
    /// Run this version (with the trial and role to count the attempt in, during a canary).
    Run(Arc<Version>, Option<(Arc<Trial>, Role)>),
    /// Wait until this says the join ended, then pick again.
    Wait(tokio::sync::watch::Receiver<bool>),
}

/// The current handler of one subscription, and the one before it.
pub struct HandlerSlot {
    /// A candidate on trial, if a canary runs.
    trial: arc_swap::ArcSwapOption<Trial>,
    /// A canary being joined, if any.
    joining: arc_swap::ArcSwapOption<Joining>,
    /// Neither a trial nor a join is set: what every delivery asks first, one relaxed load
    /// instead of two swaps' (issue 50). Written under `changing`, after the swaps it sums up.
    plain: std::sync::atomic::AtomicBool,
    changing: Mutex<()>,
    /// The latest versions made current, newest last (at most [`HISTORY`]).
    history: Mutex<std::collections::VecDeque<Served>>,
    current: ArcSwap<Version>,
    previous: Mutex<Option<Arc<Version>>>,
    metrics: Arc<Metrics>,
    labels: SubLabels,
    swaps: crate::observe::metrics::Count,
    refusals: crate::observe::metrics::Count,
    /// The digests this slot counts in `sluice_handler_info` when it is summed per host.
    serving: Mutex<std::collections::HashSet<String>>,
    /// Where the handler versions of this subscription count what they refuse.
    counters: HandlerCounters,
}

/// How many version changes a slot remembers for the admin page.
pub const HISTORY: usize = 20;

/// One change of the version a subscription serves.
#[derive(Debug, Clone)]
pub struct Served {
    /// When.
    pub at: std::time::SystemTime,
    /// The version made current.
    pub digest: Digest,
    /// How: "started", "swapped in" or "rolled back to".
    pub how: &'static str,
}

impl HandlerSlot {
    /// A slot serving `handler`.
    pub fn new(handler: Arc<dyn Handler>, metrics: Arc<Metrics>, labels: SubLabels) -> Self {
        let version = Arc::new(Version::new(handler));
        let swaps = metrics.count(&metrics.swaps, &labels, "swaps");
        let refusals = metrics.count(&metrics.swap_refusals, &labels, "swap_refusals");
        let series = metrics.series(&labels);
        let counters = HandlerCounters {
            http_denied: metrics.http_denied.get_or_create(&series).clone(),
            log_dropped: metrics.guest_log_dropped.get_or_create(&series).clone(),
        };
        let slot = Self {
            history: Mutex::new(std::collections::VecDeque::from([Served {
                at: crate::support::clock::now(),
                digest: version.digest.clone(),
                how: "started",
            }])),
            counters,
            trial: arc_swap::ArcSwapOption::empty(),
            joining: arc_swap::ArcSwapOption::empty(),
            plain: std::sync::atomic::AtomicBool::new(true),
            changing: Mutex::default(),
            swaps,
            refusals,
            serving: Mutex::default(),
            current: ArcSwap::new(version.clone()),
            previous: Mutex::new(None),
            metrics,
            labels,
        };
        slot.mark_serving(&version.digest, true);
        slot
    }

    /// The version new deliveries run.
    pub fn current(&self) -> Arc<Version> {
        self.current.load_full()
    }

    /// The version a delivery of the entry first added as `origin_id` runs: the candidate of a
    /// trial when the trial takes it, the current version otherwise; with the trial and the
    /// role, for the delivery to count its attempt.
    pub fn pick(&self, origin_id: &str) -> Picked {
        if self.plain.load(std::sync::atomic::Ordering::Acquire) {
            return Picked::Run(self.current(), None);
        }
        if let Some(joining) = &*self.joining.load()
            && joining.holds(origin_id)
        {
            let wait = joining.done.subscribe();
            if !*wait.borrow() {
                return Picked::Wait(wait);
            }
        }
        let Some(trial) = self.trial.load_full() else {
            return Picked::Run(self.current(), None);
        };
        if trial.takes(origin_id) {
            Picked::Run(trial.candidate.clone(), Some((trial, Role::Candidate)))
        } else {
            Picked::Run(self.current(), Some((trial, Role::Incumbent)))
        }
    }

    /// Run `change` (a swap of the trial or the join) and say again whether either is set.
    fn changed<T>(&self, change: impl FnOnce() -> T) -> T {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        // Not plain before the change is seen, so no delivery misses a join for long.
        self.plain.store(false, std::sync::atomic::Ordering::SeqCst);
        let out = change();
        let plain = self.trial.load().is_none() && self.joining.load().is_none();
        self.plain.store(plain, std::sync::atomic::Ordering::SeqCst);
        out
    }

    /// The version a delivery of `origin_id` runs (see [`Self::pick`]), once no join holds it.
    pub async fn pick_when_ready(
        &self,
        origin_id: &str,
    ) -> (Arc<Version>, Option<(Arc<Trial>, Role)>) {
        loop {
            match self.pick(origin_id) {
                Picked::Run(version, trial) => return (version, trial),
                Picked::Wait(mut done) => {
                    // A sender dropped (replaced by another join) ends the wait as well.
                    let _ = done.wait_for(|done| *done).await;
                }
            }
        }
    }

    /// Hold the deliveries `joining` would take until [`Self::joined`].
    pub fn joining(&self, joining: Joining) {
        let old = self.changed(|| self.joining.swap(Some(Arc::new(joining))));
        if let Some(old) = old {
            old.done.send_replace(true);
        }
    }

    /// The join ended (with a trial started, or not): held deliveries go on.
    pub fn joined(&self) {
        if let Some(old) = self.changed(|| self.joining.swap(None)) {
            old.done.send_replace(true);
        }
    }

    /// The trial running, if any.
    pub fn trial(&self) -> Option<Arc<Trial>> {
        self.trial.load_full()
    }

    /// Start `trial` (replacing any other): from now on its share of deliveries runs its
    /// candidate.
    pub fn start_trial(&self, trial: Arc<Trial>) {
        trial.candidate.handler.activate();
        self.remember(&trial.candidate.digest, "on trial (canary)");
        self.mark_serving(&trial.candidate.digest, true);
        tracing::info!(
            stream = %self.labels.stream,
            group = %self.labels.group,
            candidate = trial.candidate.digest.short(),
            share_percent = f64::from(trial.share_bp()) / 100.0,
            "canary started: a share of deliveries runs the candidate"
        );
        if let Some(old) = self.changed(|| self.trial.swap(Some(trial))) {
            old.candidate.handler.retire();
        }
    }

    /// End the trial `id` (no other): with `promote`, its candidate becomes the current
    /// version (the one it replaces is the rollback target); otherwise every delivery that
    /// starts from now runs the current version again. Deliveries that started on the
    /// candidate finish on it. The trial, if it was running.
    pub fn end_trial(&self, id: &str, promote: bool) -> Option<Arc<Trial>> {
        let running = self.trial.load_full()?;
        if running.id != id {
            return None;
        }
        let ended = self.changed(|| self.trial.swap(None))?;
        if promote {
            self.publish_as(ended.candidate.clone(), "promoted (canary)");
        } else {
            ended.candidate.handler.retire();
            self.remember(&ended.candidate.digest, "rolled back (canary)");
            if ended.candidate.digest != self.current().digest {
                self.mark_serving(&ended.candidate.digest, false);
            }
        }
        Some(ended)
    }

    /// The version a rollback would restore.
    pub fn previous(&self) -> Option<Arc<Version>> {
        self.previous.lock().ok().and_then(|p| p.clone())
    }

    /// The subscription's labels.
    pub fn labels(&self) -> &SubLabels {
        &self.labels
    }

    /// Swaps and refusals so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.swaps.get(), self.refusals.get())
    }

    fn info_labels(&self, digest: &Digest) -> HandlerLabels {
        HandlerLabels {
            stream: self.labels.stream.clone(),
            group: self.labels.group.clone(),
            digest: digest.to_string(),
        }
    }

    fn mark_serving(&self, digest: &Digest, serving: bool) {
        if self.metrics.per_subscription() {
            self.metrics
                .handler_info
                .get_or_create(&self.info_labels(digest))
                .set(i64::from(serving));
            return;
        }
        let changed = self.serving.lock().is_ok_and(|mut digests| {
            if serving {
                digests.insert(digest.to_string())
            } else {
                digests.remove(&digest.to_string())
            }
        });
        if changed {
            self.metrics
                .serve_digest(&digest.to_string(), if serving { 1 } else { -1 });
        }
    }

    /// The latest version changes, oldest first.
    pub fn history(&self) -> Vec<Served> {
        self.history
            .lock()
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn remember(&self, digest: &Digest, how: &'static str) {
        if let Ok(mut history) = self.history.lock() {
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(Served {
                at: crate::support::clock::now(),
                digest: digest.clone(),
                how,
            });
        }
    }

    /// Make `version` current; the one it replaces becomes the rollback target.
    pub fn publish(&self, version: Arc<Version>) -> Arc<Version> {
        self.publish_as(version, "swapped in")
    }

    fn publish_as(&self, version: Arc<Version>, how: &'static str) -> Arc<Version> {
        self.remember(&version.digest, how);
        version.handler.activate();
        let old = self.current.swap(version.clone());
        old.handler.retire();
        let dropped = self
            .previous
            .lock()
            .ok()
            .and_then(|mut previous| previous.replace(old.clone()));
        self.mark_serving(&old.digest, false);
        self.mark_serving(&version.digest, true);
        // Only the serving and the rollback digest keep a series: one per upload would grow
        // `/metrics` without end.
        if let Some(dropped) = dropped
            && self.metrics.per_subscription()
            && dropped.digest != version.digest
            && dropped.digest != old.digest
        {
            self.metrics
                .handler_info
                .remove(&self.info_labels(&dropped.digest));
        }
        self.swaps.inc();
        tracing::info!(
            stream = %self.labels.stream,
            group = %self.labels.group,
            from = old.digest.short(),
            to = version.digest.short(),
            "handler swapped"
        );
        old
    }

    /// Put the previous version back.
    pub fn rollback(&self) -> Result<Arc<Version>, NoPrevious> {
        let previous = self.previous().ok_or(NoPrevious)?;
        self.publish_as(previous.clone(), "rolled back to");
        Ok(previous)
    }

    /// Count a refused swap (the caller logs why).
    pub fn count_refusal(&self) {
        self.refusals.inc();
    }

    /// Where the handler versions of this subscription count what they refuse.
    pub fn counters(&self) -> &HandlerCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {

    use crate::handler::{Split, TIME_BUCKETS, bucket_floor_us, time_bucket};

    #[test]
    fn time_buckets_are_quarter_doublings_of_microseconds() {
        let mut us = 1u64;
        while us < 1 << 40 {
            for probe in [us, us + 1, us * 5 / 4, us * 3 / 2, us * 7 / 4] {
                let expected =
                    (((probe as f64).log2() * 4.0).floor() as usize).min(TIME_BUCKETS - 1);
                let got = time_bucket(std::time::Duration::from_micros(probe));
                assert_eq!(got, expected, "{probe} us");
                assert!(
                    bucket_floor_us(got) <= probe as f64 * (1.0 + 1e-12),
                    "{probe} us"
                );
            }
            us *= 2;
        }
        assert_eq!(time_bucket(std::time::Duration::ZERO), 0);
        assert_eq!(time_bucket(std::time::Duration::MAX), TIME_BUCKETS - 1);
    }

    #[test]
    fn a_split_takes_its_share_of_entries_after_its_start_and_only_them() {
        let ids: Vec<String> = (0..20_000)
            .map(|i| format!("{}-{}", 1_000 + i / 7, i % 7))
            .collect();
        let half = Split::new("canary-a", 5_000, 1_000);
        let taken: Vec<bool> = ids.iter().map(|id| half.takes(id)).collect();
        let share = taken.iter().filter(|t| **t).count();
        assert!((9_400..=10_600).contains(&share), "{share} of 20,000 taken");
        // Another canary's key splits the same entries differently.
        let other = Split::new("canary-b", 5_000, 1_000);
        let both = ids
            .iter()
            .zip(&taken)
            .filter(|(id, t)| **t && other.takes(id))
            .count();
        assert!((4_500..=5_500).contains(&both), "{both} taken by both");
        // The same on every call (every attempt, every host).
        assert!(ids.iter().zip(&taken).all(|(id, t)| half.takes(id) == *t));
        let all = Split::new("canary-a", 10_000, 1_000);
        assert!(ids.iter().all(|id| all.takes(id)));
        let none = Split::new("canary-a", 0, 1_000);
        assert!(!ids.iter().any(|id| none.takes(id)));
        // Entries added before the start, and ids that are not entry ids, never.
        assert!(!all.takes("999-0"));
        assert!(!all.takes("not-an-id") && !all.takes("") && !all.takes("5000"));
        assert!(!all.takes("-1") && !all.takes("99999999999999999999999-0"));
        assert_eq!(
            crate::support::when::entry_ms("1700000000000-3"),
            Some(1_700_000_000_000)
        );
    }
}
