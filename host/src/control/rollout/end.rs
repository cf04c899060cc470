//! The end of this host's trial: the version the verdict names serves every delivery again
//! (the candidate when promoted, the incumbent when rolled back), the share shown as none, the
//! verdict counted and logged.

use super::canary::{Outcome, Verdict};
use super::follow::{Follower, Installed};
use crate::handler::Tally;
use crate::observe::metrics::VerdictLabels;

impl Follower<'_> {
    /// End the trial `installed` as `verdict` says.
    pub(super) fn apply(&mut self, installed: Installed, verdict: &Verdict) {
        self.end(installed, verdict.outcome, &verdict.why);
    }

    /// End the trial `installed` with `outcome` (`why`, for the log): the slot serves one
    /// version again, the share is shown as none, and a trial that was still running is
    /// counted in `sluice_canary_verdicts` and logged.
    pub(super) fn end(&mut self, installed: Installed, outcome: Outcome, why: &str) {
        let slot = self.rollout.control.slot();
        let ended = slot
            .end_trial(&installed.record.id, outcome == Outcome::Promoted)
            .is_some();
        self.pending = [Tally::default(), Tally::default()];
        self.rollout.show_share(0);
        if !ended {
            return;
        }
        let series = self.rollout.metrics.series(slot.labels());
        self.rollout
            .metrics
            .canary_verdicts
            .get_or_create(&VerdictLabels {
                stream: series.stream,
                group: series.group,
                verdict: match outcome {
                    Outcome::Promoted => "promoted",
                    Outcome::RolledBack => "rolled_back",
                },
            })
            .inc();
        match outcome {
            Outcome::Promoted => tracing::info!(
                stream = %installed.record.stream,
                group = %installed.record.group,
                candidate = %crate::support::digest::short(&installed.record.candidate),
                "canary promoted: the candidate serves every delivery now ({why})"
            ),
            Outcome::RolledBack => tracing::warn!(
                stream = %installed.record.stream,
                group = %installed.record.group,
                candidate = %crate::support::digest::short(&installed.record.candidate),
                "canary rolled back: the current version serves every delivery again ({why})"
            ),
        }
    }
}
