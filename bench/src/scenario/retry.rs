//! Retries through the durable delayed set: how late a parked retry fires (`retry`) and how
//! fast a backlog of due retries drains back onto the stream (`drain`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sluice_host::EventKind;
use tokio_util::sync::CancellationToken;

use super::{Bench, Report, now_ms, percentile};

impl Bench {
    /// Entries whose first attempt asks for `delay` and whose second acks: how late each retry
    /// is handled (handled time minus due time, both on this machine's clock, which is also the
    /// Redis server's).
    pub async fn retry(&self, n: usize, delay: Duration) -> Result<Report> {
        self.retry_behind("retry", n, delay, 0, None).await
    }

    /// `retry-backlog`: the `retry` scenario with `backlog` entries of 20 ms waiting each (a
    /// gateway call) added just before the retries come due, so they come due while the backlog
    /// is being handled. Retries re-added at the stream's tail wait for what is ahead of them; with
    /// `lane` (`retry-backlog-lane`) they go to the retry lane, which the reader serves first.
    pub async fn retry_backlog(
        &self,
        n: usize,
        delay: Duration,
        backlog: usize,
        lane: bool,
    ) -> Result<Report> {
        let name = if lane {
            "retry-backlog-lane"
        } else {
            "retry-backlog"
        };
        self.retry_behind(name, n, delay, backlog, Some(lane)).await
    }

    /// Retries behind a backlog of `backlog` entries; `lane` sets `retry_lane` (`None`: the
    /// default, the lane).
    async fn retry_behind(
        &self,
        name: &str,
        n: usize,
        delay: Duration,
        backlog: usize,
        lane: Option<bool>,
    ) -> Result<Report> {
        let stream = &format!("bench-{name}");
        let key = &format!("bench-{name}.delayed");
        let payload = sluice_fixture_control::Control::Retry {
            ms: delay.as_millis() as u64,
            times: 1,
        }
        .to_string();
        self.fill(stream, n, |_| payload.clone()).await?;
        // The backlog: handlers that wait 20 ms each (a gateway call), added 150 ms before the
        // first retry is due, so the retries come due while it is being handled.
        let slow = sluice_fixture_control::Control::Sleep { ms: 20 }.to_string();
        let mut backlog_at: Option<tokio::time::Instant> = None;
        let lane = lane.map_or(String::new(), |lane| format!("retry_lane = {lane}\n"));
        let toml = format!(
            "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 128\nblock = \"1s\"\n{lane}delayed_retry = {{ key = {key:?} }}\n",
            self.fixture.display().to_string()
        );
        let service = self.service(&toml).await?;
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        let mut due: HashMap<String, f64> = HashMap::with_capacity(n);
        // Per origin: when its retry was acked here, and when the sweep re-added it (its new
        // id's time, on the server's clock, which is this machine's).
        let mut handled: HashMap<String, (f64, f64, f64)> = HashMap::with_capacity(n);
        let (mut first_park, mut last_park) = (f64::MAX, 0.0f64);
        let mut backlog_done = 0usize;
        while handled.len() < n || backlog_done < backlog {
            let add_backlog = async {
                match backlog_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                event = tokio::time::timeout(Duration::from_secs(60), events.recv()) => event,
                () = add_backlog => {
                    backlog_at = None;
                    self.fill(stream, backlog, |_| slow.clone()).await?;
                    continue;
                }
            };
            let event = match event {
                Ok(Ok(event)) => event,
                Ok(Err(err)) => bail!("lost events: {err}"),
                Err(_) => bail!(
                    "retry scenario stalled with {} of {n} handled",
                    handled.len()
                ),
            };
            let at = now_ms();
            match event.kind {
                EventKind::Parked { due_ms, .. } => {
                    first_park = first_park.min(at);
                    last_park = last_park.max(at);
                    due.insert(event.id, due_ms as f64);
                    if backlog > 0 && due.len() == n {
                        let first = due.values().copied().fold(f64::MAX, f64::min);
                        let wait = (first - now_ms() - 150.0).max(0.0);
                        backlog_at = Some(
                            tokio::time::Instant::now() + Duration::from_secs_f64(wait / 1000.0),
                        );
                    }
                }
                EventKind::Acked if event.retry_count == 1 => {
                    let swept = event
                        .id
                        .split('-')
                        .next()
                        .and_then(|ms| ms.parse::<f64>().ok())
                        .unwrap_or(at);
                    let started = event
                        .started
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(at, |d| d.as_secs_f64() * 1000.0);
                    handled.insert(event.origin_id, (at, swept, started));
                }
                EventKind::Acked if backlog > 0 => backlog_done += 1,
                other => bail!("unexpected outcome in the retry scenario: {other:?}"),
            }
        }
        let elapsed = started.elapsed();
        stop.cancel();
        task.await?.context("the host failed")?;
        // Each retry's ack names the entry it was parked from. Per retry, minus its due time:
        // when it was handled, when the sweep re-added it, when its handler started.
        let late = |pick: fn(&(f64, f64, f64)) -> f64| -> Vec<f64> {
            let mut late: Vec<f64> = handled
                .iter()
                .filter_map(|(origin, times)| due.get(origin).map(|due_ms| pick(times) - due_ms))
                .collect();
            late.sort_by(f64::total_cmp);
            late
        };
        let lateness = late(|t| t.0);
        if lateness.len() != n {
            bail!("matched {} of {n} retries to their parks", lateness.len());
        }
        let mut report = Report::new(name, n, elapsed);
        report.lateness_p50_ms = Some(percentile(&lateness, 50.0));
        report.lateness_p99_ms = Some(percentile(&lateness, 99.0));
        report.lateness_max_ms = lateness.last().copied();
        // How much of the lateness is the sweep's (the rest is reading and handling).
        let (swept, started) = (late(|t| t.1), late(|t| t.2));
        report.extra.extend([
            ("x_swept_p50_ms", percentile(&swept, 50.0)),
            ("x_swept_p99_ms", percentile(&swept, 99.0)),
            ("x_started_p50_ms", percentile(&started, 50.0)),
            ("x_started_p99_ms", percentile(&started, 99.0)),
        ]);
        if backlog > 0 {
            report.extra.push(("x_backlog", backlog as f64));
        }
        if last_park > first_park {
            report.extra.push((
                "parks_per_s",
                n as f64 / ((last_park - first_park) / 1000.0),
            ));
        }
        Ok(report)
    }

    /// `fan-out`: one stream read by two Sluice groups (`a`, `b`, each with its own delayed set)
    /// and a plain consumer group (another service), `n` entries whose first attempt asks to
    /// retry after `delay`: per group, how fast it settled them and how late its retries came
    /// back; and what the plain group read (it should be exactly the `n` entries).
    pub async fn fan_out(&self, n: usize, delay: Duration) -> Result<Report> {
        let stream = "bench-fan-out";
        let mut conn = self.conn().await?;
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg("plain")
            .arg("0")
            .arg("MKSTREAM")
            .query_async::<()>(&mut conn)
            .await?;
        let payload = sluice_fixture_control::Control::Retry {
            ms: delay.as_millis() as u64,
            times: 1,
        }
        .to_string();
        self.fill(stream, n, |_| payload.clone()).await?;
        let sub = |group: &str| {
            format!(
                "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"{group}\"\nconsumer = \"{group}-1\"\ncount = 128\nmax_in_flight = 128\nblock = \"1s\"\ndelayed_retry = {{ key = \"{stream}.{group}.delayed\" }}\n",
                self.fixture.display().to_string()
            )
        };
        let service = self.service(&format!("{}{}", sub("a"), sub("b"))).await?;
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        // Per group and origin: the due time of its park, and when its retry was acked.
        let mut due: HashMap<(String, String), f64> = HashMap::with_capacity(2 * n);
        let mut acked: HashMap<(String, String), f64> = HashMap::with_capacity(2 * n);
        while acked.len() < 2 * n {
            let event = match tokio::time::timeout(Duration::from_secs(60), events.recv()).await {
                Ok(Ok(event)) => event,
                Ok(Err(err)) => bail!("lost events: {err}"),
                Err(_) => bail!("fan-out stalled with {} of {} acked", acked.len(), 2 * n),
            };
            let key = (event.group.to_string(), event.origin_id.clone());
            match event.kind {
                EventKind::Parked { due_ms, .. } => {
                    due.insert(key, due_ms as f64);
                }
                EventKind::Acked if event.retry_count == 1 => {
                    if acked.insert(key, now_ms()).is_some() {
                        bail!("a retry of group {} was acked twice", event.group);
                    }
                }
                other => bail!("unexpected outcome in the fan-out scenario: {other:?}"),
            }
        }
        let elapsed = started.elapsed();
        stop.cancel();
        task.await?.context("the host failed")?;
        let plain: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("plain")
            .arg("p")
            .arg("COUNT")
            .arg(2 * n + 1)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .query_async(&mut conn)
            .await?;
        let plain_read = plain.keys.iter().map(|k| k.ids.len()).sum::<usize>();
        let mut report = Report::new("fan-out", 2 * n, elapsed);
        let start_ms = now_ms() - elapsed.as_secs_f64() * 1000.0;
        for group in ["a", "b"] {
            let mut late: Vec<f64> = acked
                .iter()
                .filter(|((g, _), _)| g == group)
                .filter_map(|(key, at)| due.get(key).map(|d| at - d))
                .collect();
            late.sort_by(f64::total_cmp);
            let last = acked
                .iter()
                .filter(|((g, _), _)| g == group)
                .map(|(_, at)| *at)
                .fold(0.0, f64::max);
            let (per_s, p50, p99) = match group {
                "a" => ("a_msgs_per_s", "a_lateness_p50_ms", "a_lateness_p99_ms"),
                _ => ("b_msgs_per_s", "b_lateness_p50_ms", "b_lateness_p99_ms"),
            };
            report.extra.extend([
                (per_s, n as f64 / ((last - start_ms) / 1000.0)),
                (p50, percentile(&late, 50.0)),
                (p99, percentile(&late, 99.0)),
            ]);
        }
        report.extra.push(("plain_read", plain_read as f64));
        if plain_read != n {
            bail!("the plain group read {plain_read} entries for {n} produced");
        }
        Ok(report)
    }

    /// `n` entries already due in the set: time until all are back on the stream and handled.
    pub async fn drain(&self, n: usize) -> Result<Report> {
        let stream = "bench-drain";
        let key = "bench-drain.delayed";
        let mut conn = self.conn().await?;
        let fields = vec![(
            b"payload".to_vec(),
            sluice_fixture_control::Control::Ack
                .to_string()
                .into_bytes(),
        )];
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(key);
            for &i in chunk {
                let member = super::parked_member(stream, i, &fields);
                cmd.arg(0).arg(member);
            }
            cmd.query_async::<i64>(&mut conn).await?;
        }
        let toml = format!(
            "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 128\nblock = \"1s\"\ndelayed_retry = {{ key = {key:?} }}\n",
            self.fixture.display().to_string()
        );
        let service = self.service(&toml).await?;
        let stop = CancellationToken::new();
        let redis_cpu = super::throughput::redis_cpu_seconds(&mut conn).await?;
        let host_cpu = super::throughput::process_cpu_seconds();
        let calls_before = super::throughput::command_calls(&mut conn).await?;
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        // Moved back: the set is empty.
        let mut moved_at = None;
        loop {
            let left: i64 = redis::cmd("ZCARD").arg(key).query_async(&mut conn).await?;
            if left == 0 {
                moved_at = moved_at.or(Some(started.elapsed()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.settled(stream, n, Some(key)).await?;
        let elapsed = started.elapsed();
        let redis_cpu = super::throughput::redis_cpu_seconds(&mut conn).await? - redis_cpu;
        let host_cpu = super::throughput::process_cpu_seconds() - host_cpu;
        let calls = super::throughput::command_calls(&mut conn).await?;
        stop.cancel();
        task.await?.context("the host failed")?;
        let mut report = Report::new("drain", n, elapsed);
        let per_1k = |calls: u64| calls as f64 * 1000.0 / n as f64;
        report.extra.extend([
            ("x_reads_per_1k", per_1k(calls.0 - calls_before.0)),
            ("x_xacks_per_1k", per_1k(calls.1 - calls_before.1)),
        ]);
        // Where the time goes: Redis's CPU (the sweep's Lua is most of it) and this process's
        // (the host, and the harness polling every 2 ms), as a share of one core.
        let secs = elapsed.as_secs_f64();
        report
            .extra
            .push(("x_redis_cpu_pct", 100.0 * redis_cpu / secs));
        report
            .extra
            .push(("x_host_cpu_pct", 100.0 * host_cpu / secs));
        if let Some(moved) = moved_at {
            report
                .extra
                .push(("swept_per_s", n as f64 / moved.as_secs_f64()));
        }
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        Ok(report)
    }
}
