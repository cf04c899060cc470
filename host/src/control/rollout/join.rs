//! Joining a canary: this host fetches the candidate from Redis, checks it as a swap would and
//! starts it on trial beside the version serving, holding the deliveries the candidate would
//! take meanwhile. A host that cannot run the candidate ends the canary for every host (it runs
//! on every host or on none).

use std::path::PathBuf;
use std::sync::Arc;

use super::RolloutError;
use super::canary::{self, Record};
use super::follow::{Follower, Installed};
use crate::handler::{Joining, Trial};

impl Follower<'_> {
    /// This host cannot run the candidate of `record`: the canary ends for every host (it runs
    /// on every host or on none: the entries this host would run on the incumbent are the
    /// candidate's on the others). The deliveries the candidate would take stay held until it
    /// has ended.
    pub(super) async fn could_not_join(&mut self, record: &Record, err: &RolloutError) {
        let (stream, group) = self.labels();
        let explained = err.explain();
        tracing::error!(
            stream,
            group,
            candidate = %crate::support::digest::short(&record.candidate),
            err = %explained,
            "cannot join the canary: ending it for every host of the group"
        );
        let mut conn = self.rollout.conn.clone();
        let ended = match self.key() {
            Some(key) => {
                canary::refuse(
                    &mut conn,
                    key,
                    record,
                    (&self.rollout.consumer, &explained),
                    &self.forged,
                )
                .await
            }
            None => Ok(false),
        };
        match ended {
            Ok(_) => {
                self.rollout.control.slot().joined();
                self.failed = None;
                self.keep_verdict(record).await;
            }
            Err(e) => {
                let (stream, group) = self.labels();
                tracing::error!(
                    stream,
                    group,
                    err = %e,
                    "cannot end the canary this host cannot join; its share of deliveries stays held (trying again in 5 s)"
                );
                self.failed = Some((record.id.clone(), tokio::time::Instant::now()));
            }
        }
    }

    /// The verdict that ended `record` (this host's or another writer's, an operator's abort
    /// say), kept among the canaries seen decided: if it goes from Redis before the flow
    /// watcher reads it, it is written back instead of the record looking undecided. Unread
    /// (Redis away), the next look converges again.
    async fn keep_verdict(&mut self, record: &Record) {
        let mut conn = self.rollout.conn.clone();
        let (stream, group) = (record.stream.clone(), record.group.clone());
        let read = canary::read(&mut conn, self.key(), &stream, &group).await;
        match read.ok().and_then(|state| state.verdict) {
            Some(verdict) if verdict.id == record.id => self.remember(&verdict),
            _ => self.forget_seen(),
        }
    }

    /// Fetch, check and start the canary's candidate, holding the deliveries it would take
    /// meanwhile. On success they go on; on failure they stay held for the caller to end the
    /// canary first.
    pub(super) async fn join(&self, record: &Record) -> Result<Installed, RolloutError> {
        let slot = self.rollout.control.slot();
        slot.joining(Joining::new(&record.id, record.share_bp, record.from_ms()));
        let joined = self.fetch_and_start(record).await;
        if joined.is_ok() {
            slot.joined();
        }
        joined
    }

    /// The candidate of `record` fetched, checked and put on trial in the handler slot.
    async fn fetch_and_start(&self, record: &Record) -> Result<Installed, RolloutError> {
        let mut conn = self.rollout.conn.clone();
        let bytes = canary::fetch_component(
            &mut conn,
            &record.stream,
            &record.candidate,
            self.rollout.max_component,
        )
        .await?;
        let origin = PathBuf::from(format!(
            "canary candidate {}",
            crate::support::digest::short(&record.candidate)
        ));
        let candidate = self.rollout.control.prepare(origin, bytes).await?;
        let slot = self.rollout.control.slot();
        let serving = slot.current();
        if serving.digest.as_str() != record.incumbent {
            tracing::warn!(
                stream = %record.stream,
                group = %record.group,
                serving = serving.digest.short(),
                incumbent = %crate::support::digest::short(&record.incumbent),
                "this host serves another version than the canary's incumbent; its deliveries count as the incumbent's"
            );
        }
        let trial = Arc::new(Trial::new(
            record.id.clone(),
            candidate,
            (record.share_bp, record.from_ms()),
            &self.rollout.metrics,
            slot.labels(),
        ));
        slot.start_trial(trial.clone());
        self.rollout.show_share(record.share_bp);
        Ok(Installed {
            record: record.clone(),
            trial,
            joined: tokio::time::Instant::now(),
        })
    }
}
