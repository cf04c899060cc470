//! The scenarios, the private Redis they share, and their reports: one file per scenario
//! family (`throughput`: ceiling, native, wasm, wasm-isolated; `retry`: retry and drain;
//! `swap`; `sandbox`; `cluster`; `ui`; `footprint`: an idle host by subscription count), the
//! shared harness here.

mod canary;
mod cluster;
mod dedupe;
mod effects;
mod flow;
mod footprint;
mod languages;
mod ordered;
mod retry;
mod sandbox;
mod scheduled;
mod swap;
mod throughput;
mod traces;
mod ui;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};
use redis::aio::MultiplexedConnection;
use sluice_host::runtime::Runtime;
use sluice_host::store::devredis::{DevRedis, DevRedisOptions};
use sluice_host::{Config, Plan, Service};

/// A member parked by group `g` of `stream` for entry `n` (its own origin), retry count 1, as
/// the park script writes it: what the scenarios that fill a set by hand put there.
fn parked_member(stream: &str, n: usize, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let id = format!("{n}-0");
    sluice_host::entry::member::NewMember {
        entry_id: &id,
        retry_count: 1,
        fields,
        origin_id: &id,
        stream,
        group: "g",
    }
    .encode()
}

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

    /// Note how far over its budget (see [`crate::budget`]) the host's µs per message are,
    /// when more than 10 % over.
    pub fn mark_budget(&mut self) {
        let host_us = self
            .extra
            .iter()
            .find(|(name, _)| *name == "x_host_us_per_msg")
            .map(|(_, us)| *us);
        if let Some(over) = host_us.and_then(|us| crate::budget::over(&self.scenario, us)) {
            self.extra.push(("OVER_BUDGET_PCT", over * 100.0));
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
            let extra: Vec<String> = r
                .extra
                .iter()
                .map(|(n, v)| {
                    if v.abs() < 100.0 {
                        format!("{n}={v:.1}")
                    } else {
                        format!("{n}={v:.0}")
                    }
                })
                .collect();
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

/// Each command's calls so far, from an `INFO commandstats` reply: `(command, calls)`, the
/// command as Redis names it (`xack`, `xreadgroup`, ...).
fn command_calls(info: &str) -> impl Iterator<Item = (&str, u64)> {
    info.lines().filter_map(|line| {
        let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
        let calls = stats
            .strip_prefix("calls=")?
            .split(',')
            .next()?
            .parse()
            .ok()?;
        Some((name, calls))
    })
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
            password: false,
            die_with_host: false,
            extra_args: Vec::new(),
        };
        let redis = DevRedis::start(dir.path(), &options)?;
        let pool = sluice_host::runtime::PoolSizing {
            // Room for a canary's two versions (see `PoolSizing::for_config`).
            instances: 600,
            max_memory: 64 << 20,
        };
        let options = sluice_host::runtime::RuntimeOptions {
            pool: Some(pool),
            fuel: false,
            no_epoch: false,
            cache_max_size: None,
            quick_compile: false,
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

    /// The private Redis's URL.
    fn redis_url(&self) -> String {
        self.redis.url()
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
        let group = sluice_host::store::inspect::group(conn, stream, "g").await?;
        Ok(group.and_then(|g| g.lag.map(|lag| (g.pending as i64, lag as i64))))
    }

    /// Wait until the group has read and settled everything (with a delayed set `extra_key`:
    /// nothing parked, nothing unread or pending in its retry lane), printing progress to stderr.
    async fn settled(&self, stream: &str, total: usize, extra_key: Option<&str>) -> Result<()> {
        let mut conn = self.conn().await?;
        let started = Instant::now();
        let mut last_progress = Instant::now();
        loop {
            let parked: i64 = match extra_key {
                Some(key) => {
                    sluice_host::store::inspect::delayed(&mut conn, key)
                        .await?
                        .parked as i64
                }
                None => 0,
            };
            // A lane without a group (retries to the stream's tail) holds nothing.
            let lane_idle = match extra_key {
                Some(key) => {
                    let lane = sluice_host::store::keys::lane_key(key);
                    Self::group_state(&mut conn, &lane)
                        .await?
                        .is_none_or(|(pending, lag)| pending == 0 && lag == 0)
                }
                None => true,
            };
            if let Some((pending, lag)) = Self::group_state(&mut conn, stream).await?
                && pending == 0
                && lag == 0
                && parked == 0
                && lane_idle
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

    /// Run `service` until its `n` entries of `stream` (and its delayed set
    /// `<stream>.delayed`) settled, then stop it: how long that took.
    async fn run_until_settled(
        &self,
        service: Service,
        stream: &str,
        n: usize,
    ) -> Result<Duration> {
        let stop = tokio_util::sync::CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        self.settled(stream, n, Some(&format!("{stream}.delayed")))
            .await?;
        let elapsed = started.elapsed();
        stop.cancel();
        task.await??;
        Ok(elapsed)
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
}
