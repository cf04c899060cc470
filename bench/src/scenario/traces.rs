//! What exporting traces costs: the `wasm` and `retry` scenarios with traces off, on but
//! sampling nothing (0 %: the work every entry pays), sampled at 1 % and at 100 %, alternated in
//! one run (numbers move ±30 % between runs, so only numbers of one run compare). Spans go over
//! OTLP/HTTP to a sink in this process that takes and drops them, as a collector on the same
//! machine would.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use sluice_host::config::telemetry::{Protocol, Telemetry};

use super::{Bench, Report};

/// An OTLP/HTTP endpoint that accepts every export and counts the bytes.
async fn sink() -> Result<(String, Arc<AtomicU64>)> {
    let bytes = Arc::new(AtomicU64::new(0));
    let counted = bytes.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            counted.fetch_add(body.len() as u64, Ordering::Relaxed);
            async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind the span sink")?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}"), bytes))
}

/// Traces to the sink at `endpoint`, sampling `per_million` entries.
fn exporting_to(endpoint: &str, per_million: u32) -> Telemetry {
    Telemetry {
        endpoint: Some(endpoint.to_owned()),
        protocol: Protocol::HttpProtobuf,
        headers: Vec::new(),
        service_name: "sluice-bench".to_owned(),
        sampling_per_million: per_million,
        resource: Vec::new(),
        trace_url: None,
    }
}

impl Bench {
    /// `wasm` (`n` messages) and `retry` (`retries` entries, 1 s delay) at each of [`SETTINGS`],
    /// [`ROUNDS`] times, alternating; then per setting the median, the mean against off's, and
    /// the median of each round's ratio to off (the machine's speed drifts between rounds, and
    /// one `wasm` run in three or so lands ~20 % slow whatever the setting, so one number alone
    /// says little).
    pub async fn traces(&self, n: usize, retries: usize) -> Result<Vec<Report>> {
        let (endpoint, bytes) = sink().await?;
        let mut reports = Vec::new();
        for round in 0..ROUNDS {
            // Each round starts at another setting, so none always runs right after the
            // previous round's 100 % (and its flush).
            let mut settings = SETTINGS.to_vec();
            settings.rotate_left(round % SETTINGS.len());
            for (label, per_million) in settings {
                for scenario in ["wasm", "retry"] {
                    let exporting = match per_million {
                        None => None,
                        Some(sampling_per_million) => sluice_host::observe::telemetry::start(
                            Some(&exporting_to(&endpoint, sampling_per_million)),
                        )?,
                    };
                    let before = bytes.load(Ordering::Relaxed);
                    let mut report = match scenario {
                        "wasm" => self.host_path("wasm", n).await?,
                        _ => self.retry(retries, Duration::from_secs(1)).await?,
                    };
                    let dropped = exporting.as_ref().map_or(0, |e| e.dropped());
                    if let Some(exporting) = exporting {
                        tokio::task::spawn_blocking(move || exporting.stop()).await?;
                    }
                    report.scenario = format!("{scenario} traces {label} #{}", round + 1);
                    report.extra.push(("spans dropped", dropped as f64));
                    report.extra.push((
                        "KiB exported",
                        (bytes.load(Ordering::Relaxed) - before) as f64 / 1024.0,
                    ));
                    reports.push(report);
                }
            }
        }
        let mut medians = Vec::new();
        for scenario in ["wasm", "retry"] {
            // Each round's value of `of` at setting `label`.
            let values = |label: &str, of: fn(&Report) -> f64| -> Vec<f64> {
                reports
                    .iter()
                    .filter(|r| {
                        r.scenario
                            .starts_with(&format!("{scenario} traces {label} #"))
                    })
                    .map(of)
                    .collect()
            };
            let median = |label: &str, of: fn(&Report) -> f64| {
                let mut values = values(label, of);
                values.sort_by(f64::total_cmp);
                values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
            };
            let rate = |r: &Report| r.msgs_per_s;
            let p99 = |r: &Report| r.lateness_p99_ms.unwrap_or(f64::NAN);
            let mean = |label: &str| {
                let values = values(label, rate);
                values.iter().sum::<f64>() / values.len() as f64
            };
            let off = median("off", rate);
            for (label, _) in SETTINGS {
                let mut report = Report {
                    scenario: format!("{scenario} traces {label} median"),
                    msgs_per_s: median(label, rate),
                    ..Report::default()
                };
                if scenario == "retry" {
                    report.lateness_p99_ms = Some(median(label, p99));
                }
                report
                    .extra
                    .push(("vs off %", (report.msgs_per_s / off - 1.0) * 100.0));
                report
                    .extra
                    .push(("means vs off %", (mean(label) / mean("off") - 1.0) * 100.0));
                // Each round's own ratio, then their median.
                let mut ratios: Vec<f64> = (1..=ROUNDS)
                    .filter_map(|round| {
                        let of = |l: &str| {
                            reports
                                .iter()
                                .find(|r| r.scenario == format!("{scenario} traces {l} #{round}"))
                                .map(|r| r.msgs_per_s)
                        };
                        Some((of(label)? / of("off")? - 1.0) * 100.0)
                    })
                    .collect();
                ratios.sort_by(f64::total_cmp);
                if let Some(mid) = ratios.get(ratios.len() / 2) {
                    report.extra.push(("paired vs off %", *mid));
                }
                medians.push(report);
            }
        }
        reports.extend(medians);
        reports.extend(self.interleaved(&endpoint).await?);
        Ok(reports)
    }

    /// `wasm` with the setting switched every [`WINDOW`] within one run, between off, 0 % and
    /// 1 % (one exporter, [`sluice_host::observe::telemetry::Exporting::set_sampling`]), [`MIXED_RUNS`]
    /// runs of [`MIXED_MESSAGES`]: whatever state a run falls into, the three settings share it,
    /// so the ratio of each cycle's windows is what tracing costs. A sampled window ends with
    /// a flush, counted in its time, so the export its spans caused is not charged to the next.
    async fn interleaved(&self, endpoint: &str) -> Result<Vec<Report>> {
        let exporting = sluice_host::observe::telemetry::start(Some(&exporting_to(endpoint, 0)))?
            .context("the exporter did not start")?;
        let exporting = Arc::new(exporting);
        let mixed: [(&str, Option<u32>); 3] = [SETTINGS[0], SETTINGS[1], SETTINGS[2]];
        // Per setting, each cycle's rate.
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); mixed.len()];
        for run in 0..MIXED_RUNS {
            exporting.set_sampling(None);
            let stream = format!("bench-traces-mixed-{run}");
            self.fill(&stream, MIXED_MESSAGES, Self::payment).await?;
            let service = self
                .service(&super::throughput::path_toml(
                    &self.fixture,
                    &stream,
                    "reuse",
                    "",
                ))
                .await?;
            let mut conn = self.conn().await?;
            let stop = tokio_util::sync::CancellationToken::new();
            let task = tokio::spawn(service.run(None, stop.clone()));
            let acked = |state: Option<(i64, i64)>| {
                state.map(|(pending, lag)| MIXED_MESSAGES as i64 - pending - lag)
            };
            // The first cycle warms up (instances, connections); cycles stop before the tail.
            let mut cycle = 0;
            'cycles: loop {
                let mut order: Vec<usize> = (0..mixed.len()).collect();
                order.rotate_left(cycle % mixed.len());
                let mut this = vec![f64::NAN; mixed.len()];
                for at in order {
                    exporting.set_sampling(mixed[at].1);
                    let Some(before) = acked(Self::group_state(&mut conn, &stream).await?) else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue 'cycles;
                    };
                    let started = std::time::Instant::now();
                    tokio::time::sleep(WINDOW).await;
                    if mixed[at].1.is_some_and(|p| p > 0) {
                        let flushing = exporting.clone();
                        tokio::task::spawn_blocking(move || flushing.flush()).await?;
                    }
                    let state = Self::group_state(&mut conn, &stream).await?;
                    let after = acked(state).unwrap_or(before);
                    if state.is_some_and(|(_, lag)| lag == 0) {
                        // The stream ran dry within the window: not a full one.
                        break 'cycles;
                    }
                    this[at] = (after - before) as f64 / started.elapsed().as_secs_f64();
                }
                if cycle > 0 {
                    for (at, rate) in this.into_iter().enumerate() {
                        rates[at].push(rate);
                    }
                }
                cycle += 1;
            }
            exporting.set_sampling(None);
            self.settled(&stream, MIXED_MESSAGES, None).await?;
            stop.cancel();
            task.await?.context("the host failed")?;
            redis::cmd("DEL")
                .arg(&stream)
                .query_async::<()>(&mut conn)
                .await?;
        }
        if let Ok(exporting) = Arc::try_unwrap(exporting) {
            tokio::task::spawn_blocking(move || exporting.stop()).await?;
        }
        let mut reports = Vec::new();
        for (at, (label, _)) in mixed.iter().enumerate() {
            let mut paired: Vec<f64> = rates[at]
                .iter()
                .zip(&rates[0])
                .map(|(rate, off)| (rate / off - 1.0) * 100.0)
                .collect();
            paired.sort_by(f64::total_cmp);
            let mean = |of: &[f64]| of.iter().sum::<f64>() / of.len() as f64;
            let mut report = Report {
                scenario: format!("wasm traces {label} interleaved"),
                msgs_per_s: mean(&rates[at]),
                ..Report::default()
            };
            report.extra.push(("cycles", paired.len() as f64));
            report.extra.push((
                "means vs off %",
                (mean(&rates[at]) / mean(&rates[0]) - 1.0) * 100.0,
            ));
            if let Some(mid) = paired.get(paired.len() / 2) {
                report.extra.push(("paired vs off %", *mid));
            }
            reports.push(report);
        }
        Ok(reports)
    }
}

/// How long each setting runs before the next, in the interleaved measurement.
const WINDOW: Duration = Duration::from_millis(500);
/// Runs of the interleaved measurement.
const MIXED_RUNS: usize = 4;
/// Messages each of its runs has.
const MIXED_MESSAGES: usize = 1_000_000;

/// The settings compared: off, on but sampling nothing (what every entry pays), 1 % and 100 %.
const SETTINGS: [(&str, Option<u32>); 4] = [
    ("off", None),
    ("0%", Some(0)),
    ("1%", Some(10_000)),
    ("100%", Some(1_000_000)),
];

/// Rounds of each setting (each round runs every setting back to back, so a round's ratios
/// compare like with like; a multiple of the settings, so each starts a round as often).
const ROUNDS: usize = 12;
