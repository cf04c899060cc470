//! What a canary costs: the `wasm` path while a canary runs (half the entries on the
//! candidate, both versions counted and reported to Redis twice a second), against the same
//! path without one, alternated in one run: once with the v2 fixture as the candidate (two
//! components' code and instance pools in turn), once with the same code as the candidate
//! (only the canary's own work: picking by hash, counting, reporting).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio_util::sync::CancellationToken;

use super::throughput::path_toml;
use super::{Bench, Report};

/// Rounds of each setting, alternated.
const ROUNDS: usize = 7;

impl Bench {
    /// Plain and canary runs alternated [`ROUNDS`] times on `n` messages each; then each one's
    /// median, the canary's as a share of plain's.
    pub async fn canary(&self, n: usize) -> Result<Vec<Report>> {
        let settings: [(&str, Option<&std::path::Path>); 3] = [
            ("wasm plain", None),
            ("wasm canary 50% v2", Some(&self.fixture_v2)),
            ("wasm canary 50% same code", Some(&self.fixture)),
        ];
        let mut rates: Vec<Vec<f64>> = settings.iter().map(|_| Vec::new()).collect();
        let mut cpu: Vec<Vec<f64>> = settings.iter().map(|_| Vec::new()).collect();
        for round in 0..ROUNDS {
            for (i, (name, candidate)) in settings.iter().enumerate() {
                let (rate, us) = self
                    .prefilled_path(&format!("{round}-{i}"), n, *candidate)
                    .await?;
                eprintln!(
                    "  {name} #{}: {rate:.0} msgs/s, host {us:.2} us CPU per msg",
                    round + 1
                );
                rates[i].push(rate);
                cpu[i].push(us);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let medians: Vec<f64> = rates.iter_mut().map(median).collect();
        Ok(settings
            .iter()
            .zip(&medians)
            .map(|((name, _), rate)| {
                let mut report = Report::new(&format!("{name} median"), n, Duration::ZERO);
                report.msgs_per_s = *rate;
                report
                    .extra
                    .push(("x_plain_pct", 100.0 * rate / medians[0]));
                report
            })
            .collect())
    }

    /// One run: `n` entries on a fresh stream, a canary of `candidate` on half of them when
    /// given (started before the host, which joins it before its first read), then the host;
    /// msgs/s from its first delivery's end to the group settled (what the host does once it
    /// reads: a canary host joins first, fetching and checking the candidate). The entries
    /// carry ids a few seconds ahead of the server's clock (Redis takes any id above the last),
    /// so that they count as added after the canary started and are split between the versions.
    async fn prefilled_path(
        &self,
        run: &str,
        n: usize,
        candidate: Option<&std::path::Path>,
    ) -> Result<(f64, f64)> {
        let stream = format!("bench-canary-{run}");
        let mut conn = self.conn().await?;
        let from = match candidate {
            Some(candidate) => {
                let v1 = std::fs::read(&self.fixture)?;
                let v2 = std::fs::read(candidate)?;
                sluice_host::rollout::canary::start(
                    &mut conn,
                    sluice_host::rollout::canary::Start {
                        stream: &stream,
                        group: "g",
                        bytes: &v2,
                        // The same code gets the same digest: a second handler of it all the same.
                        candidate: sluice_host::digest::Digest::of(&v2).as_str(),
                        incumbent: sluice_host::digest::Digest::of(&v1).as_str(),
                        share_bp: 5_000,
                        window: Duration::from_secs(3600),
                        thresholds: (&sluice_host::config::Canary::default()).into(),
                        by: "the benchmark",
                    },
                )
                .await
                .context("cannot start the canary")?
                .from_ms()
            }
            None => sluice_host::rollout::canary::server_ms(&mut conn).await? + 2_000,
        };
        let first = from + 1_000;
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                pipe.cmd("XADD")
                    .arg(&stream)
                    .arg(format!("{first}-{}", i + 1))
                    .arg("payload")
                    .arg(Self::payment(i))
                    .ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        }
        let service = self
            .service(&path_toml(&self.fixture, &stream, "reuse", ""))
            .await?;
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let task = tokio::spawn(service.run(None, stop.clone()));
        events
            .recv()
            .await
            .context("the host ended before its first delivery")?;
        let started = Instant::now();
        let cpu_before = super::throughput::process_cpu_seconds();
        self.settled(&stream, n, None).await?;
        let rate = (n - 1) as f64 / started.elapsed().as_secs_f64();
        let us = (super::throughput::process_cpu_seconds() - cpu_before) * 1e6 / (n - 1) as f64;
        stop.cancel();
        task.await?.context("the host failed")?;
        if candidate.is_some() {
            let state = sluice_host::rollout::canary::read(&mut conn, &stream, "g").await?;
            if !state.running() || state.candidate.attempts == 0 {
                bail!(
                    "the canary did not run through the measurement: {:?}",
                    state.verdict
                );
            }
        }
        Ok((rate, us))
    }
}
