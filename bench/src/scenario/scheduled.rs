//! `scheduled`: 10,000 entries sent for later, all due in the same millisecond; each one's
//! lateness from its due time to its handler's start (the host's event time, on the same
//! machine as Redis), and how long the burst took to drain.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sluice_host::EventKind;
use sluice_host::control::operate::schedule::{self, Target, When};
use tokio_util::sync::CancellationToken;

use super::{Bench, Report, percentile};

impl Bench {
    /// `n` entries due at once, 3 s after the first is scheduled.
    pub async fn scheduled(&self, n: usize) -> Result<Vec<Report>> {
        let stream = "bench-scheduled";
        let set = format!("{stream}.delayed");
        let toml = self.keyed_toml(stream, "");
        let service = self.service(&toml).await?;
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let task = tokio::spawn(service.run(None, stop.clone()));
        let mut conn = self.conn().await?;
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let at = secs * 1000 + micros / 1000 + 3_000;
        let target = Target {
            stream,
            group: "g",
            set: &set,
            ttl: None,
        };
        let fields = [(
            b"payload".to_vec(),
            super::ordered::account_payload("a").into_bytes(),
        )];
        let mut due = HashMap::with_capacity(n);
        for _ in 0..n {
            let done = schedule::schedule(&mut conn, target, When::At(at), &fields).await?;
            due.insert(done.id, done.due_ms);
        }
        let mut late = Vec::with_capacity(n);
        let mut first: Option<Instant> = None;
        while late.len() < n {
            let event = match tokio::time::timeout(Duration::from_secs(120), events.recv()).await {
                Ok(Ok(event)) => event,
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(err)) => bail!("lost events: {err}"),
                Err(_) => bail!("scheduled stalled with {} of {n} handled", late.len()),
            };
            if event.kind != EventKind::Acked {
                continue;
            }
            let (Some(due_ms), Some(started)) = (due.get(&event.origin_id), event.started) else {
                continue;
            };
            first.get_or_insert_with(Instant::now);
            let started_ms = started.duration_since(std::time::UNIX_EPOCH)?.as_secs_f64() * 1000.0;
            late.push(started_ms - *due_ms as f64);
        }
        let drained = first.map_or(Duration::ZERO, |f| f.elapsed());
        stop.cancel();
        task.await??;
        late.sort_by(f64::total_cmp);
        let mut report = Report::new("scheduled-burst", n, drained);
        report.lateness_p50_ms = Some(percentile(&late, 50.0));
        report.lateness_p99_ms = Some(percentile(&late, 99.0));
        report.lateness_max_ms = late.last().copied();
        report.extra.push(("x_earliest_ms", late[0]));
        Ok(vec![report])
    }
}
