//! Hot swaps under load: what a swap costs the deliveries around it.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

use super::{Bench, Report, percentile};

impl Bench {
    /// Run `n` acking entries through the fixture, swapping between two builds every `every`
    /// (never if `None`). Returns the elapsed time, each swap's (request time, digest), and
    /// each delivery's (digest, start time).
    async fn swap_run(&self, stream: &str, n: usize, every: Option<Duration>) -> Result<SwapRun> {
        let payload = sluice_fixture_control::Control::Ack.to_string();
        self.fill(stream, n, |_| payload.clone()).await?;
        let toml = format!(
            "admin = \"127.0.0.1:0\"\nadmin_open_on_loopback = true\nwatch_interval = \"off\"\n[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 128\nblock = \"100ms\"\ndelayed_retry = \"none\"\n",
            self.fixture.display().to_string()
        );
        let service = self.service(&toml).await?;
        let mut admin = service.admin_addr();
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let collector = tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                match events.recv().await {
                    Ok(event) => {
                        if let Some(started) = event.started {
                            seen.push((event.digest.to_string(), started));
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
            seen
        });
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        let addr = (*admin
            .wait_for(Option::is_some)
            .await
            .map_err(|_| anyhow::anyhow!("the host stopped before its admin server started"))?)
        .context("admin address")?;
        let mut swaps = Vec::new();
        let settled = self.settled(stream, n, None);
        tokio::pin!(settled);
        let builds = [
            std::fs::read(&self.fixture_v2)?,
            std::fs::read(&self.fixture)?,
        ];
        let mut round = 0usize;
        loop {
            let tick = async {
                match every {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                done = &mut settled => { done?; break; }
                () = tick => {
                    let bytes = builds[round % 2].clone();
                    round += 1;
                    let url = format!("http://{addr}/v1/subscriptions/{stream}/g/handler");
                    let asked = SystemTime::now();
                    let body = tokio::task::spawn_blocking(move || -> Result<String> {
                        let mut response = ureq::put(&url).send(&bytes[..])?;
                        Ok(response.body_mut().read_to_string()?)
                    })
                    .await??;
                    let answer: serde_json::Value = serde_json::from_str(&body)?;
                    swaps.push((asked, answer["digest"].as_str().unwrap_or_default().to_owned()));
                }
            }
        }
        let elapsed = started.elapsed();
        stop.cancel();
        task.await?.context("the host failed")?;
        let seen = collector.await?;
        Ok(SwapRun {
            elapsed,
            swaps,
            seen,
        })
    }

    /// Throughput with and without a hot swap every 100 ms, and how long a swap takes to reach
    /// its first delivery (cold: that build was never compiled in this process; cached: it was).
    pub async fn swap(&self, n: usize) -> Result<Report> {
        let quiet = self.swap_run("bench-swap-quiet", n, None).await?;
        let busy = self
            .swap_run("bench-swap", n, Some(Duration::from_millis(100)))
            .await?;
        let mut latencies: Vec<f64> = Vec::new();
        for (asked, digest) in &busy.swaps {
            let first = busy
                .seen
                .iter()
                .filter(|(d, started)| d == digest && started >= asked)
                .map(|(_, started)| *started)
                .min();
            if let Some(first) = first {
                latencies.push(
                    first
                        .duration_since(*asked)
                        .unwrap_or_default()
                        .as_secs_f64()
                        * 1000.0,
                );
            }
        }
        let mut report = Report::new("swap", n, busy.elapsed);
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        report.extra.push(("swaps", busy.swaps.len() as f64));
        report
            .extra
            .push(("quiet_msgs_per_s", n as f64 / quiet.elapsed.as_secs_f64()));
        report.extra.push((
            "dip_pct",
            100.0 * (1.0 - quiet.elapsed.as_secs_f64() / busy.elapsed.as_secs_f64()),
        ));
        if let Some(cold) = latencies.first() {
            report.extra.push(("swap_to_first_cold_ms", *cold));
        }
        if latencies.len() > 2 {
            let mut cached = latencies[2..].to_vec();
            cached.sort_by(f64::total_cmp);
            report
                .extra
                .push(("swap_to_first_cached_p50_ms", percentile(&cached, 50.0)));
        }
        Ok(report)
    }
}

/// What one swap run saw.
struct SwapRun {
    elapsed: Duration,
    swaps: Vec<(SystemTime, String)>,
    seen: Vec<(String, SystemTime)>,
}
