//! What a canary costs: the `wasm` path while a canary runs (a share of the entries on the
//! candidate, both versions counted and reported to Redis twice a second), against the same
//! path without one, alternated in one run: the v2 fixture as the candidate on 10 % (the
//! usual canary) and on 50 % (two components' code and instances in turn as much as it gets),
//! and the same code as the candidate on 50 % (a second handler of the same code).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio_util::sync::CancellationToken;

use super::throughput::path_toml;
use super::{Bench, Report};

/// Rounds of each setting, alternated.
const ROUNDS: usize = 11;

impl Bench {
    /// Plain and canary runs alternated [`ROUNDS`] times on `n` messages each (each round in
    /// another order); each canary run is compared with the plain run of its own round (the
    /// machine drifts between rounds more than a canary costs), and the median of those ratios
    /// is the result, with the quartiles around it.
    pub async fn canary(&self, n: usize) -> Result<Vec<Report>> {
        let settings: [(&str, Option<(&std::path::Path, u32)>); 4] = [
            ("wasm plain", None),
            ("wasm canary 10% v2", Some((&self.fixture_v2, 1_000))),
            ("wasm canary 50% v2", Some((&self.fixture_v2, 5_000))),
            ("wasm canary 50% same code", Some((&self.fixture, 5_000))),
        ];
        // (msgs/s, host CPU us per message) of each setting, by round.
        let mut runs: Vec<Vec<(f64, f64)>> = settings.iter().map(|_| Vec::new()).collect();
        for round in 0..ROUNDS {
            for k in 0..settings.len() {
                let i = (round + k) % settings.len();
                let (name, candidate) = settings[i];
                let (rate, us) = self
                    .prefilled_path(&format!("{round}-{i}"), n, candidate)
                    .await?;
                eprintln!(
                    "  {name} #{}: {rate:.0} msgs/s, host {us:.2} us CPU per msg",
                    round + 1
                );
                runs[i].push((rate, us));
            }
        }
        let quartiles = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
            (at(0.25), at(0.5), at(0.75))
        };
        Ok(settings
            .iter()
            .zip(&runs)
            .map(|((name, _), own)| {
                let pct = |f: fn(&(f64, f64)) -> f64| {
                    quartiles(
                        own.iter()
                            .zip(&runs[0])
                            .map(|(run, plain)| 100.0 * f(run) / f(plain))
                            .collect(),
                    )
                };
                let (q1, rate_pct, q3) = pct(|r| r.0);
                let (_, cpu_pct, _) = pct(|r| r.1);
                let mut report = Report::new(&format!("{name} median"), n, Duration::ZERO);
                report.msgs_per_s = quartiles(own.iter().map(|r| r.0).collect()).1;
                report.us_per_delivery = Some(quartiles(own.iter().map(|r| r.1).collect()).1);
                report.extra.push(("x_plain_pct", rate_pct));
                report.extra.push(("x_plain_pct_q1", q1));
                report.extra.push(("x_plain_pct_q3", q3));
                report.extra.push(("x_cpu_plain_pct", cpu_pct));
                report
            })
            .collect())
    }

    /// One run: `n` entries on a fresh stream, a canary of `candidate` on its share of them
    /// when given (started before the host, which joins it before its first read), then the host;
    /// msgs/s and host CPU per message from a tenth of the entries handled to the group settled.
    /// The entries
    /// carry ids a few seconds ahead of the server's clock (Redis takes any id above the last),
    /// so that they count as added after the canary started and are split between the versions.
    async fn prefilled_path(
        &self,
        run: &str,
        n: usize,
        candidate: Option<(&std::path::Path, u32)>,
    ) -> Result<(f64, f64)> {
        let stream = format!("bench-canary-{run}");
        let mut conn = self.conn().await?;
        // The rollout key the host reads from a private file, and the benchmark seals with.
        let key_file =
            std::env::temp_dir().join(format!("sluice-bench-rollout-{}", std::process::id()));
        std::fs::write(&key_file, ROLLOUT_KEY)?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
        }
        let key = sluice_host::control::rollout::key::RolloutKey::derive(
            ROLLOUT_KEY,
            sluice_host::control::rollout::key::Origin::AdminToken,
        );
        let from = match candidate {
            Some((candidate, share_bp)) => {
                let v1 = std::fs::read(&self.fixture)?;
                let v2 = std::fs::read(candidate)?;
                sluice_host::control::rollout::canary::start(
                    &mut conn,
                    &key,
                    sluice_host::control::rollout::canary::Start {
                        stream: &stream,
                        group: "g",
                        bytes: &v2,
                        // The same code gets the same digest: a second handler of it all the same.
                        candidate: sluice_host::support::digest::Digest::of(&v2).as_str(),
                        incumbent: sluice_host::support::digest::Digest::of(&v1).as_str(),
                        share_bp,
                        window: Duration::from_secs(3600),
                        thresholds: (&sluice_host::config::Canary::default()).into(),
                        by: "the benchmark",
                    },
                )
                .await
                .context("cannot start the canary")?
                .from_ms()
            }
            None => sluice_host::control::rollout::canary::server_ms(&mut conn).await? + 2_000,
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
        let toml = format!(
            "rollout_key_file = {:?}\n{}",
            key_file.display().to_string(),
            path_toml(&self.fixture, &stream, "reuse", "")
        );
        let service = self.service(&toml).await?;
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let task = tokio::spawn(service.run(None, stop.clone()));
        // The steady state: from a tenth of the entries handled on. By then a canary host has
        // joined (fetched, checked and compiled the candidate, a one-off that would otherwise
        // count against its throughput): the deliveries the candidate takes wait for the join,
        // and they fill the in-flight budget long before a tenth.
        let mut seen = 0;
        while seen < n / 10 {
            match events.recv().await {
                Ok(_) => seen += 1,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(k)) => seen += k as usize,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    bail!("the host ended after {seen} deliveries")
                }
            }
        }
        drop(events);
        let started = Instant::now();
        let cpu_before = super::throughput::process_cpu_seconds();
        let (pending, unread) = Self::group_state(&mut conn, &stream)
            .await?
            .context("the group is gone")?;
        let left = (pending + unread) as f64;
        self.settled(&stream, n, None).await?;
        let rate = left / started.elapsed().as_secs_f64();
        let us = (super::throughput::process_cpu_seconds() - cpu_before) * 1e6 / left;
        stop.cancel();
        task.await?.context("the host failed")?;
        if candidate.is_some() {
            let state =
                sluice_host::control::rollout::canary::read(&mut conn, Some(&key), &stream, "g")
                    .await?;
            if !state.running() || state.candidate.attempts == 0 {
                bail!(
                    "the canary did not run through the measurement: {:?}",
                    state.verdict
                );
            }
        }
        let _ = std::fs::remove_file(&key_file);
        // The next run finds Redis as this one did: without the 300k entries of every run before.
        redis::cmd("DEL")
            .arg(&stream)
            .query_async::<()>(&mut conn)
            .await?;
        Ok((rate, us))
    }
}

/// The rollout key of the benchmark's canaries (no secret: the benchmark's Redis is its own).
const ROLLOUT_KEY: &str = "3f9c2a7be1d04c6f8a5e9b2d7c1f0e4a9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a";
