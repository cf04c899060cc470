//! The scenarios, the private Redis they share, and their reports.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use redis::Value;
use redis::aio::MultiplexedConnection;
use sluice_host::devredis::{DevRedis, DevRedisOptions};
use sluice_host::runtime::Runtime;
use sluice_host::{Config, EventKind, Plan, Service};
use tokio_util::sync::CancellationToken;

use crate::native::NativeAck;

/// One scenario's numbers.
#[derive(Debug, Default)]
pub struct Report {
    pub scenario: String,
    pub messages: usize,
    pub seconds: f64,
    pub msgs_per_s: f64,
    pub ratio_to_ceiling: Option<f64>,
    pub us_per_delivery: Option<f64>,
    pub lateness_p50_ms: Option<f64>,
    pub lateness_p99_ms: Option<f64>,
    pub lateness_max_ms: Option<f64>,
    /// Scenario-specific rates, e.g. parks per second.
    pub extra: Vec<(&'static str, f64)>,
}

impl Report {
    fn new(scenario: &str, messages: usize, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        Self {
            scenario: scenario.to_owned(),
            messages,
            seconds,
            msgs_per_s: messages as f64 / seconds,
            ..Self::default()
        }
    }

    pub fn json(&self) -> String {
        let mut obj = serde_json::json!({
            "scenario": self.scenario,
            "messages": self.messages,
            "seconds": self.seconds,
            "msgs_per_s": self.msgs_per_s,
        });
        let fields = [
            ("ratio_to_ceiling", self.ratio_to_ceiling),
            ("us_per_delivery", self.us_per_delivery),
            ("lateness_p50_ms", self.lateness_p50_ms),
            ("lateness_p99_ms", self.lateness_p99_ms),
            ("lateness_max_ms", self.lateness_max_ms),
        ];
        for (name, value) in fields
            .into_iter()
            .chain(self.extra.iter().map(|(n, v)| (*n, Some(*v))))
        {
            if let Some(v) = value {
                obj[name] = serde_json::json!(v);
            }
        }
        obj.to_string()
    }

    pub fn table(reports: &[Report]) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<26} {:>9} {:>8} {:>11} {:>7} {:>8} {:>9} {:>9} {:>9}  other",
            "scenario",
            "messages",
            "seconds",
            "msgs/s",
            "ratio",
            "us/msg",
            "late p50",
            "late p99",
            "late max"
        );
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
        for r in reports {
            let extra: Vec<String> = r.extra.iter().map(|(n, v)| format!("{n}={v:.0}")).collect();
            let _ = writeln!(
                out,
                "{:<26} {:>9} {:>8.2} {:>11.0} {:>7} {:>8} {:>9} {:>9} {:>9}  {}",
                r.scenario,
                r.messages,
                r.seconds,
                r.msgs_per_s,
                opt(r.ratio_to_ceiling, 2),
                opt(r.us_per_delivery, 1),
                opt(r.lateness_p50_ms, 1),
                opt(r.lateness_p99_ms, 1),
                opt(r.lateness_max_ms, 1),
                extra.join(" ")
            );
        }
        out
    }
}

/// The shared set-up: one redis-server, one wasmtime runtime.
pub struct Bench {
    redis: DevRedis,
    runtime: Runtime,
    fixture: PathBuf,
    fixture_v2: PathBuf,
    dir: tempfile::TempDir,
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

impl Bench {
    pub async fn start(fixture: PathBuf, fixture_v2: PathBuf) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let options = DevRedisOptions {
            aof: false,
            reuse: false,
            extra_args: Vec::new(),
        };
        let redis = DevRedis::start(dir.path(), &options)?;
        let pool = sluice_host::runtime::PoolSizing {
            instances: 300,
            max_memory: 64 << 20,
        };
        let options = sluice_host::runtime::RuntimeOptions {
            pool: Some(pool),
            fuel: false,
            no_epoch: false,
        };
        let runtime = Runtime::new(Some(&dir.path().join("cache")), options)?;
        Ok(Self {
            redis,
            runtime,
            fixture,
            fixture_v2,
            dir,
        })
    }

    async fn conn(&self) -> Result<MultiplexedConnection> {
        let client = redis::Client::open(self.redis.url())?;
        Ok(client.get_multiplexed_async_connection().await?)
    }

    /// Put `n` payments of about 200 bytes on `stream`.
    async fn fill(&self, stream: &str, n: usize, payload: impl Fn(usize) -> String) -> Result<()> {
        let mut conn = self.conn().await?;
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                pipe.cmd("XADD")
                    .arg(stream)
                    .arg("*")
                    .arg("payload")
                    .arg(payload(i))
                    .ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        }
        Ok(())
    }

    /// A payment-sized JSON payload the fixture decodes and acks (the bank handler itself
    /// charges over HTTP, which would measure the gateway instead of the host).
    fn payment(i: usize) -> String {
        serde_json::json!({
            "mode": "ack",
            "key": format!("p-{i:08} acct-{:04}", i % 7919),
            "ms": 1_000 + (i % 50_000) as u64,
            "times": 1_790_000_000_000u64 + i as u64,
            "reason": "EUR, monthly subscription, plan S, invoice 2026-11",
        })
        .to_string()
    }

    /// The group's (pending, lag); lag is what is not yet read.
    async fn group_state(
        conn: &mut MultiplexedConnection,
        stream: &str,
    ) -> Result<Option<(i64, i64)>> {
        let group = sluice_host::inspect::group(conn, stream, "g").await?;
        Ok(group.and_then(|g| g.lag.map(|lag| (g.pending as i64, lag as i64))))
    }

    /// Wait until the group has read and settled everything, printing progress to stderr.
    async fn settled(&self, stream: &str, total: usize, extra_key: Option<&str>) -> Result<()> {
        let mut conn = self.conn().await?;
        let started = Instant::now();
        let mut last_progress = Instant::now();
        loop {
            let parked: i64 = match extra_key {
                Some(key) => sluice_host::inspect::delayed(&mut conn, key).await?.parked as i64,
                None => 0,
            };
            if let Some((pending, lag)) = Self::group_state(&mut conn, stream).await?
                && pending == 0
                && lag == 0
                && parked == 0
            {
                return Ok(());
            }
            if last_progress.elapsed() > Duration::from_secs(2) {
                let state = Self::group_state(&mut conn, stream).await?;
                eprintln!(
                    "  {stream}: {total} messages, state (pending, unread) {state:?}, parked {parked}"
                );
                last_progress = Instant::now();
            }
            if started.elapsed() > Duration::from_secs(600) {
                bail!("{stream} did not settle within 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// XREADGROUP COUNT 128 + one XACK per batch, nothing else.
    pub async fn ceiling(&self, n: usize) -> Result<Report> {
        let stream = "bench-ceiling";
        self.fill(stream, n, Self::payment).await?;
        let mut conn = self.conn().await?;
        redis::cmd("XGROUP")
            .arg(["CREATE", stream, "g", "0"].as_slice())
            .query_async::<()>(&mut conn)
            .await?;
        let started = Instant::now();
        let mut handled = 0;
        loop {
            let reply: Value = redis::cmd("XREADGROUP")
                .arg(["GROUP", "g", "c", "COUNT", "128", "STREAMS", stream, ">"].as_slice())
                .query_async(&mut conn)
                .await?;
            let ids = entry_ids(&reply);
            if ids.is_empty() {
                break;
            }
            handled += ids.len();
            redis::cmd("XACK")
                .arg(stream)
                .arg("g")
                .arg(&ids)
                .query_async::<i64>(&mut conn)
                .await?;
        }
        if handled != n {
            bail!("ceiling handled {handled} of {n}");
        }
        let mut report = Report::new("ceiling", n, started.elapsed());
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        Ok(report)
    }

    async fn service(&self, toml: &str) -> Result<Service> {
        let path = self.dir.path().join("bench.toml");
        let toml = if toml.contains("admin =") {
            toml.to_owned()
        } else {
            format!("admin = \"off\"\n{toml}")
        };
        std::fs::write(&path, toml)?;
        let config = Config::load(&[path])?;
        let plan = Plan::build(&config, &self.runtime, Some(&self.redis.url())).await?;
        Ok(Service::new(plan))
    }

    /// The host's full path: `native`, `wasm` or `wasm-isolated`.
    pub async fn host_path(&self, scenario: &str, n: usize) -> Result<Report> {
        let stream = format!("bench-{scenario}");
        self.fill(&stream, n, Self::payment).await?;
        let isolation = if scenario == "wasm-isolated" {
            "per-delivery"
        } else {
            "reuse"
        };
        let toml = format!(
            "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 128\nblock = \"100ms\"\nisolation = \"{isolation}\"\ndelayed_retry = \"none\"\n",
            self.fixture.display().to_string()
        );
        let mut service = self.service(&toml).await?;
        if scenario == "native" {
            service = service.with_handler(0, Arc::new(NativeAck::new()));
        }
        let stop = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        self.settled(&stream, n, None).await?;
        let elapsed = started.elapsed();
        stop.cancel();
        task.await?.context("the host failed")?;
        let mut report = Report::new(scenario, n, elapsed);
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        Ok(report)
    }

    /// Entries whose first attempt asks for `delay` and whose second acks: how late each retry
    /// is handled (handled time minus due time, both on this machine's clock, which is also the
    /// Redis server's).
    pub async fn retry(&self, n: usize, delay: Duration) -> Result<Report> {
        let stream = "bench-retry";
        let key = "bench-retry.delayed";
        let payload =
            serde_json::json!({"mode": "retry", "ms": delay.as_millis() as u64, "times": 1})
                .to_string();
        self.fill(stream, n, |_| payload.clone()).await?;
        let toml = format!(
            "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 128\nblock = \"1s\"\ndelayed_retry = {{ key = {key:?} }}\n",
            self.fixture.display().to_string()
        );
        let service = self.service(&toml).await?;
        let mut events = service.events().subscribe();
        let stop = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        let mut due: HashMap<String, f64> = HashMap::with_capacity(n);
        let mut handled: HashMap<String, f64> = HashMap::with_capacity(n);
        let (mut first_park, mut last_park) = (f64::MAX, 0.0f64);
        while handled.len() < n {
            let event = match tokio::time::timeout(Duration::from_secs(60), events.recv()).await {
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
                }
                EventKind::Acked if event.retry_count == 1 => {
                    handled.insert(event.id, at);
                }
                other => bail!("unexpected outcome in the retry scenario: {other:?}"),
            }
        }
        let elapsed = started.elapsed();
        stop.cancel();
        task.await?.context("the host failed")?;
        // Map each re-added entry back to the entry it was parked from.
        let mut conn = self.conn().await?;
        let all: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await?;
        let mut lateness: Vec<f64> = Vec::with_capacity(n);
        for (id, fields) in all {
            if let (Some(origin), Some(at)) = (fields.get("sluice-origin-id"), handled.get(&id))
                && let Some(due_ms) = due.get(origin)
            {
                lateness.push(at - due_ms);
            }
        }
        if lateness.len() != n {
            bail!("matched {} of {n} retries to their parks", lateness.len());
        }
        lateness.sort_by(f64::total_cmp);
        let mut report = Report::new("retry", n, elapsed);
        report.lateness_p50_ms = Some(percentile(&lateness, 50.0));
        report.lateness_p99_ms = Some(percentile(&lateness, 99.0));
        report.lateness_max_ms = lateness.last().copied();
        if last_park > first_park {
            report.extra.push((
                "parks_per_s",
                n as f64 / ((last_park - first_park) / 1000.0),
            ));
        }
        Ok(report)
    }

    /// `n` entries already due in the set: time until all are back on the stream and handled.
    pub async fn drain(&self, n: usize) -> Result<Report> {
        let stream = "bench-drain";
        let key = "bench-drain.delayed";
        let mut conn = self.conn().await?;
        let fields = vec![(b"payload".to_vec(), br#"{"mode":"ack"}"#.to_vec())];
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(key);
            for &i in chunk {
                let member = sluice_host::delayed::member::encode(&format!("{i}-0"), 1, &fields);
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
        stop.cancel();
        task.await?.context("the host failed")?;
        let mut report = Report::new("drain", n, elapsed);
        if let Some(moved) = moved_at {
            report
                .extra
                .push(("swept_per_s", n as f64 / moved.as_secs_f64()));
        }
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        Ok(report)
    }
}

impl Bench {
    /// Run `n` acking entries through the fixture, swapping between two builds every `every`
    /// (never if `None`). Returns the elapsed time, each swap's (request time, digest), and
    /// each delivery's (digest, start time).
    async fn swap_run(&self, stream: &str, n: usize, every: Option<Duration>) -> Result<SwapRun> {
        let payload = serde_json::json!({"mode": "ack"}).to_string();
        self.fill(stream, n, |_| payload.clone()).await?;
        let toml = format!(
            "admin = \"127.0.0.1:0\"\nwatch_interval = \"off\"\n[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 128\nblock = \"100ms\"\ndelayed_retry = \"none\"\n",
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

impl Bench {
    /// Per-delivery cost of the sandbox, without Redis: a tight handler (the fixture's `ack`)
    /// called `n` times in a row on a fresh instance each time (pooling allocator or not), and
    /// on a reused instance with and without epoch interruption.
    pub async fn sandbox(&self, n: usize) -> Result<Vec<Report>> {
        use sluice_host::config::{Isolation, Limits};
        use sluice_host::delivery::{Delivery, Entry};
        use sluice_host::handler::Handler;
        use sluice_host::runtime::{PoolSizing, RuntimeOptions, WasmHandler};
        let pool = Some(PoolSizing {
            instances: 16,
            max_memory: 64 << 20,
        });
        let cases = [
            ("isolated-pooled", Isolation::PerDelivery, pool, false),
            ("isolated-on-demand", Isolation::PerDelivery, None, false),
            ("reused-epoch", Isolation::Reuse, pool, false),
            ("reused-no-epoch", Isolation::Reuse, pool, true),
        ];
        let entry = Entry {
            id: "1-0".into(),
            fields: vec![(b"payload".to_vec(), br#"{"mode":"ack"}"#.to_vec())],
        };
        let delivery = Delivery::new("bench", "g", entry, 1, None);
        let mut reports = Vec::new();
        for (name, isolation, pool, no_epoch) in cases {
            let options = RuntimeOptions {
                pool,
                fuel: false,
                no_epoch,
            };
            let runtime = Runtime::new(None, options)?;
            let component = runtime.load(&self.fixture)?;
            let limits = Limits {
                isolation,
                ..Limits::default()
            };
            let values = vec![("sluice.payload-field".to_owned(), "payload".to_owned())];
            let handler = WasmHandler::new(component, limits, values, Default::default());
            // Warm up: compile caches, first instance, page faults.
            for _ in 0..100 {
                let _ = handler.handle(&delivery).await;
            }
            let started = Instant::now();
            for _ in 0..n {
                let outcome = handler.handle(&delivery).await;
                if outcome.is_err() {
                    bail!("{name}: the handler failed: {outcome:?}");
                }
            }
            let mut report = Report::new(&format!("sandbox-{name}"), n, started.elapsed());
            report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
            reports.push(report);
        }
        Ok(reports)
    }
}

/// What one swap run saw.
struct SwapRun {
    elapsed: Duration,
    swaps: Vec<(SystemTime, String)>,
    seen: Vec<(String, SystemTime)>,
}

/// The entry ids of an XREADGROUP reply.
fn entry_ids(reply: &Value) -> Vec<Vec<u8>> {
    let mut ids = Vec::new();
    if let Value::Array(streams) = reply {
        for stream in streams {
            if let Value::Array(pair) = stream
                && let Some(Value::Array(entries)) = pair.get(1)
            {
                for entry in entries {
                    if let Value::Array(parts) = entry
                        && let Some(Value::BulkString(id)) = parts.first()
                    {
                        ids.push(id.clone());
                    }
                }
            }
        }
    }
    ids
}
