//! What exporting traces costs: the `wasm` and `retry` scenarios with traces off, sampled at
//! 1 % and at 100 %, alternated in one run (numbers move ±30 % between runs, so only numbers
//! of one run compare). Spans go over OTLP/HTTP to a sink in this process that takes and
//! drops them, as a collector on the same machine would.

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

impl Bench {
    /// `wasm` (`n` messages) and `retry` (`retries` entries, 1 s delay) with traces off, at
    /// 1 % and at 100 %, [`ROUNDS`] times, alternating; then the medians, and the median of each
    /// round's ratio to off (the machine's speed drifts between rounds; within one it does less).
    pub async fn traces(&self, n: usize, retries: usize) -> Result<Vec<Report>> {
        let (endpoint, bytes) = sink().await?;
        let mut reports = Vec::new();
        for round in 0..ROUNDS {
            for (label, per_million) in [
                ("off", None),
                ("1%", Some(10_000)),
                ("100%", Some(1_000_000)),
            ] {
                for scenario in ["wasm", "retry"] {
                    let exporting = match per_million {
                        None => None,
                        Some(sampling_per_million) => {
                            sluice_host::telemetry::start(Some(&Telemetry {
                                endpoint: Some(endpoint.clone()),
                                protocol: Protocol::HttpProtobuf,
                                headers: Vec::new(),
                                service_name: "sluice-bench".to_owned(),
                                sampling_per_million,
                                resource: Vec::new(),
                                trace_url: None,
                            }))?
                        }
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
            let median = |label: &str, of: fn(&Report) -> f64| {
                let mut values: Vec<f64> = reports
                    .iter()
                    .filter(|r| {
                        r.scenario
                            .starts_with(&format!("{scenario} traces {label} #"))
                    })
                    .map(of)
                    .collect();
                values.sort_by(f64::total_cmp);
                values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
            };
            let rate = |r: &Report| r.msgs_per_s;
            let p99 = |r: &Report| r.lateness_p99_ms.unwrap_or(f64::NAN);
            let off = median("off", rate);
            for label in ["off", "1%", "100%"] {
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
        Ok(reports)
    }
}

/// Rounds of each setting (each round runs off, 1 % and 100 % back to back, so a round's ratios
/// compare like with like); the medians are what BENCHMARKS.md quotes.
const ROUNDS: usize = 9;
