//! `ordered`: ordered keys (`ordered_by`). Throughput over 1,000 keys against the same run
//! without order; then a hot key with 100,000 entries queued while calm keys keep arriving:
//! the calm keys' p99 from XADD to handled, with the fair share (ordered) and without it (the
//! same stream unordered, where the calm entries wait behind the burst).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sluice_host::EventKind;
use tokio_util::sync::CancellationToken;

use super::{Bench, Report, percentile};

/// Keys of the throughput runs.
const KEYS: usize = 1_000;
/// Calm entries added while the hot key's burst waits, and how often.
const CALM: usize = 1_000;
const CALM_EVERY: Duration = Duration::from_millis(5);

impl Bench {
    /// The throughput runs and the hot-key runs, unordered first.
    pub async fn ordered(&self, n: usize, hot: usize) -> Result<Vec<Report>> {
        let mut plain = self.keyed_throughput("ordered-off", (n, KEYS), "").await?;
        let on = "ordered_by = { payload = \"/account\" }\n";
        let mut ordered = self.keyed_throughput("ordered-on", (n, KEYS), on).await?;
        let ratio = ordered.msgs_per_s / plain.msgs_per_s;
        ordered.extra.push(("x_of_unordered", ratio));
        plain.extra.push(("x_of_unordered", 1.0));
        let unfair = self.hot_key("hot-key-unordered", hot, false).await?;
        let fair = self.hot_key("hot-key-fair-share", hot, true).await?;
        Ok(vec![plain, ordered, unfair, fair])
    }

    fn ordered_toml(&self, stream: &str, ordered: bool) -> String {
        let order = if ordered {
            "ordered_by = { payload = \"/account\" }\n"
        } else {
            ""
        };
        self.keyed_toml(stream, order)
    }

    /// The wasm fixture on `stream` with its delayed set, and `extra` (TOML lines).
    pub(super) fn keyed_toml(&self, stream: &str, order: &str) -> String {
        format!(
            "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 256\nblock = \"100ms\"\ndelayed_retry = {{ key = \"{stream}.delayed\" }}\n{order}",
            self.fixture.display().to_string()
        )
    }

    /// `n` acks over `keys` accounts on the wasm path, with `extra` (TOML lines: ordering,
    /// dedupe, or nothing).
    pub(super) async fn keyed_throughput(
        &self,
        scenario: &str,
        (n, keys): (usize, usize),
        extra: &str,
    ) -> Result<Report> {
        let stream = format!("bench-{scenario}");
        self.fill(&stream, n, |i| {
            account_payload(&format!("acct-{}", i % keys))
        })
        .await?;
        let service = self.service(&self.keyed_toml(&stream, extra)).await?;
        let mut conn = self.conn().await?;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await?;
        let cpu_before = super::throughput::redis_cpu_seconds(&mut conn).await?;
        let host_before = super::throughput::process_cpu_seconds();
        let elapsed = self.run_until_settled(service, &stream, n).await?;
        let cpu = super::throughput::redis_cpu_seconds(&mut conn).await? - cpu_before;
        if std::env::var_os("SLUICE_BENCH_COMMANDS").is_some() {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await?;
            let mut rows: Vec<(u64, &str)> = info
                .lines()
                .filter_map(|l| {
                    let usec = l.split("usec=").nth(1)?.split(',').next()?.parse().ok()?;
                    Some((usec, l))
                })
                .collect();
            rows.sort_by_key(|r| std::cmp::Reverse(r.0));
            for (_, line) in rows.iter().take(14) {
                eprintln!("  {scenario}: {line}");
            }
        }
        let host = super::throughput::process_cpu_seconds() - host_before;
        let mut report = Report::new(scenario, n, elapsed);
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        report
            .extra
            .push(("x_redis_us_per_msg", cpu * 1e6 / n as f64));
        report
            .extra
            .push(("x_host_us_per_msg", host * 1e6 / n as f64));
        Ok(report)
    }

    /// `hot` entries of one key queued, then [`CALM`] entries of other keys, one every
    /// [`CALM_EVERY`]: each calm entry's time from its XADD (its id's time) to its ack.
    async fn hot_key(&self, scenario: &str, hot: usize, ordered: bool) -> Result<Report> {
        let stream = format!("bench-{scenario}");
        self.fill(&stream, hot, |_| account_payload("hot")).await?;
        let service = self.service(&self.ordered_toml(&stream, ordered)).await?;
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let task = tokio::spawn(service.run(None, stop.clone()));
        let mut conn = self.conn().await?;
        if ordered {
            // The burst is queued behind its key (read, moved aside) before the calm keys come.
            let read_all = Instant::now();
            while Self::group_state(&mut conn, &stream)
                .await?
                .is_none_or(|(_, lag)| lag > 0)
            {
                if read_all.elapsed() > Duration::from_secs(120) {
                    bail!("{scenario}: the burst was not read within 2 minutes");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let started = Instant::now();
        let mut latencies = Vec::with_capacity(CALM);
        let mut next_add = tokio::time::Instant::now();
        let mut added = 0;
        let mut calm = std::collections::HashSet::with_capacity(CALM);
        while latencies.len() < CALM {
            let event = tokio::select! {
                () = tokio::time::sleep_until(next_add), if added < CALM => {
                    let id: String = redis::cmd("XADD")
                        .arg(&stream)
                        .arg("*")
                        .arg("payload")
                        .arg(account_payload(&format!("calm-{added}")))
                        .query_async(&mut conn)
                        .await?;
                    calm.insert(id);
                    added += 1;
                    next_add += CALM_EVERY;
                    continue;
                }
                event = tokio::time::timeout(Duration::from_secs(300), events.recv()) => event,
            };
            let event = match event {
                Ok(Ok(event)) => event,
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(err)) => bail!("lost events: {err}"),
                Err(_) => bail!(
                    "{scenario} stalled with {} calm entries handled",
                    latencies.len()
                ),
            };
            if event.kind != EventKind::Acked || !calm.remove(&event.origin_id) {
                continue;
            }
            let added_ms: f64 = event
                .origin_id
                .split('-')
                .next()
                .and_then(|ms| ms.parse().ok())
                .unwrap_or(0.0);
            latencies.push(super::now_ms() - added_ms);
        }
        let elapsed = started.elapsed();
        let hot_left = hot_waiting(&mut conn, &stream, ordered).await?;
        stop.cancel();
        task.await??;
        latencies.sort_by(f64::total_cmp);
        let mut report = Report::new(scenario, CALM, elapsed);
        report.lateness_p50_ms = Some(percentile(&latencies, 50.0));
        report.lateness_p99_ms = Some(percentile(&latencies, 99.0));
        report.lateness_max_ms = latencies.last().copied();
        report.extra.push(("x_hot_entries", hot as f64));
        report.extra.push(("x_hot_left_at_end", hot_left as f64));
        Ok(report)
    }
}

/// A payment-like payload of the fixture (it acks) with its `account`.
pub(super) fn account_payload(account: &str) -> String {
    serde_json::json!({
        "mode": "ack",
        "account": account,
        "amount_cents": 1200,
        "reason": "EUR, monthly subscription, plan S, invoice 2026-11",
    })
    .to_string()
}

/// How many hot entries are still to be handled: queued behind the key (ordered) or unread
/// in the stream (unordered).
async fn hot_waiting(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    ordered: bool,
) -> Result<u64> {
    if ordered {
        let keys = sluice_host::pipeline::order::OrderKeys::new(stream, "g");
        let wait = keys.wait(&sluice_host::pipeline::order::digest(b"hot"));
        Ok(redis::cmd("LLEN").arg(wait).query_async(conn).await?)
    } else {
        Ok(Bench::group_state(conn, stream)
            .await?
            .map_or(0, |(_, lag)| lag.max(0) as u64))
    }
}
