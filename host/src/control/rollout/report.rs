//! This host's reports while it runs a canary: every [`super::canary::REPORT`] its counts are
//! added to the group's and judged ([`super::canary::report()`]); counts a report could not
//! deliver wait for the next. What the report found is acted on: a verdict ends the trial, a
//! forged verdict field is read past, and a canary past its window by a minute that still
//! cannot be judged is ended here.

use std::time::Duration;

use super::canary::{self, Outcome, Record, Reported};
use super::follow::Follower;
use crate::handler::{Role, Tally};

impl Follower<'_> {
    /// Add this host's counts to the group's and act on the verdict, if any.
    pub(super) async fn report(&mut self) {
        let Some(installed) = &self.installed else {
            return;
        };
        let Some(key) = self.rollout.key.clone() else {
            return;
        };
        self.pending[0].merge(installed.trial.take(Role::Incumbent));
        self.pending[1].merge(installed.trial.take(Role::Candidate));
        let mut conn = self.rollout.conn.clone();
        let result = canary::report(
            &mut conn,
            &key,
            &installed.record,
            (&self.rollout.consumer, &self.forged),
            (&self.pending[0], &self.pending[1]),
        )
        .await;
        let record = installed.record.clone();
        let overdue = installed.joined.elapsed()
            > Duration::from_millis(record.ends_ms.saturating_sub(record.started_ms))
                + canary::ABANDONED_AFTER;
        match result {
            Ok(reported) => {
                if self.report_failing {
                    tracing::info!(stream = %record.stream, group = %record.group, "canary reports reach Redis again");
                    self.report_failing = false;
                }
                self.reported(reported, &record, overdue);
            }
            Err(err) => {
                self.rollout.conn.saw_error(&err);
                if !self.report_failing {
                    tracing::warn!(stream = %record.stream, group = %record.group, %err, "cannot report the canary's counts to Redis; they wait for the next report");
                    self.report_failing = true;
                }
                if overdue && let Some(installed) = self.installed.take() {
                    self.end(
                        installed,
                        Outcome::RolledBack,
                        "its window ended a minute ago and it cannot be judged (Redis refuses the reports)",
                    );
                }
            }
        }
    }

    /// Act on what a report of `record` found.
    fn reported(&mut self, reported: Reported, record: &Record, overdue: bool) {
        // A forged verdict stopped the script before it counted: the counts wait.
        if !matches!(reported, Reported::Forged(_)) {
            self.pending = [Tally::default(), Tally::default()];
        }
        let end = |this: &mut Self, why: &str| {
            if let Some(installed) = this.installed.take() {
                this.end(installed, Outcome::RolledBack, why);
            }
        };
        match reported {
            Reported::Running if overdue => end(
                self,
                "its window ended a minute ago and Redis still judges it running (a clock far off?)",
            ),
            Reported::Running => {}
            // A verdict field another writer keeps changing must not keep a canary past its
            // window: ended here as if nobody judged it.
            Reported::Forged(_) if overdue => end(
                self,
                "its window ended a minute ago and its verdict field holds what no host wrote",
            ),
            Reported::Forged(raw) => {
                if self.forged != raw {
                    tracing::warn!(
                        stream = %record.stream,
                        group = %record.group,
                        "canary verdict ignored: its seal does not verify with this host's rollout key (not written by a host of the group); the canary goes on"
                    );
                    self.forged = raw;
                }
            }
            Reported::Gone => end(self, "its record is gone from Redis"),
            Reported::Decided { verdict, .. } => {
                self.remember(&verdict);
                if let Some(installed) = self.installed.take() {
                    self.apply(installed, &verdict);
                }
            }
        }
    }
}
