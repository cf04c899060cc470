//! What an idle host costs, by how many subscriptions it carries: the `sluice` binary (next to
//! this executable: `cargo build --release -p sluice-host`) run with N subscriptions, one stream
//! each, all on the fixture component, with nothing to read. Once `/readyz` says ready and the
//! host has settled for a few seconds: its resident memory (now and peak), threads, connections
//! to Redis, and the Redis commands it sends per second, in all and per subscription (which
//! commands, too); and how long it took to become ready. This is the sizing chapter's data.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Bench, Report, command_calls};

/// How long the host idles before it is measured (start-up work done), and how long the
/// command count is taken over.
const SETTLE: Duration = Duration::from_secs(5);
const WINDOW: Duration = Duration::from_secs(10);
/// How long the density scenario's host idles before it is measured: past each
/// subscription's first look for gone consumers (half `consumer_gone_after`, 30 s by default,
/// after start), after which an idle subscription with a bell looks again only when its keys
/// are written.
const DENSITY_SETTLE: Duration = Duration::from_secs(40);
/// The density scenario's window: a whole period of the slowest periodic command (the
/// rolling re-read of flow states, at most 40 a second: 125 s a round at 5,000) is not
/// needed, its rate being constant.
const DENSITY_WINDOW: Duration = Duration::from_secs(30);

/// The `sluice` binary run by this scenario; killed when dropped.
struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sluice_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("sluice");
    if !bin.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p sluice-host`",
            bin.display()
        );
    }
    Ok(bin)
}

/// A line of `/proc/<pid>/status` in kB (or a count), e.g. `VmRSS`, `VmHWM`, `Threads`.
fn status(pid: u32, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

impl Bench {
    /// One host per count in `counts`, measured idle. A host that cannot carry its count is
    /// reported (its error printed, `failed=1`), and the next count still runs.
    pub async fn footprint(&self, counts: &[usize]) -> Result<Vec<Report>> {
        let bin = sluice_bin()?;
        let mut out = Vec::new();
        for &n in counts {
            match self.footprint_of(&bin, n).await {
                Ok(report) => out.push(report),
                Err(err) => {
                    eprintln!("  {n} subscriptions: FAILED: {err:#}");
                    let mut report = Report::new(&format!("footprint {n} subs"), 0, Duration::ZERO);
                    report.msgs_per_s = 0.0;
                    report.extra = vec![("failed", 1.0)];
                    out.push(report);
                    let mut conn = self.conn().await?;
                    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
                }
            }
        }
        Ok(out)
    }

    async fn footprint_of(&self, bin: &PathBuf, n: usize) -> Result<Report> {
        let admin = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut toml = format!("admin = \"{admin}\"\nshutdown_timeout = \"1s\"\n");
        for i in 0..n {
            toml.push_str(&format!(
                "\n[[subscription]]\ncomponent = \"{}\"\nstream = \"fp{n}-{i}\"\ngroup = \"g\"\nconsumer = \"c\"\n",
                self.fixture.display()
            ));
        }
        let mut conn = self.conn().await?;
        let clients_before = clients(&mut conn).await?;
        let (host, _dir, ready) = self.start_idle(bin, &toml, n, &admin).await?;
        let pid = host.0.id();
        tokio::time::sleep(SETTLE).await;
        let before = stats(&mut conn).await?;
        let window = Instant::now();
        tokio::time::sleep(WINDOW).await;
        let after = stats(&mut conn).await?;
        let seconds = window.elapsed().as_secs_f64();
        let (per_s, top) = rates(&before, &after, seconds, 5);
        let connections = clients(&mut conn).await?.saturating_sub(clients_before);
        let rss = status(pid, "VmRSS")? as f64 / 1024.0;
        let peak = status(pid, "VmHWM")? as f64 / 1024.0;
        let threads = status(pid, "Threads")? as f64;
        eprintln!(
            "  {n} subscriptions: ready in {:.1} s, RSS {rss:.0} MiB (peak {peak:.0}), {connections} connections, {per_s:.0} commands/s ({}); {}",
            ready.as_secs_f64(),
            per_s / n as f64,
            top.join(", ")
        );
        let mut report = Report::new(&format!("footprint {n} subs"), 0, Duration::ZERO);
        report.msgs_per_s = 0.0;
        report.extra = vec![
            ("ready_s", ready.as_secs_f64()),
            ("rss_mib", rss),
            ("peak_mib", peak),
            ("threads", threads),
            ("connections", connections as f64),
            ("cmds_per_s", per_s),
            ("cmds_per_s_per_sub", per_s / n as f64),
        ];
        drop(host);
        // Leave Redis as it was: the streams and groups the host made.
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
        Ok(report)
    }
}

impl Bench {
    /// Run the `sluice` binary on `toml` (N subscriptions, admin on `admin`) against the
    /// bench's Redis, and wait until `/readyz` says ready: the host, its directory, and how
    /// long it took.
    async fn start_idle(
        &self,
        bin: &PathBuf,
        toml: &str,
        n: usize,
        admin: &std::net::SocketAddr,
    ) -> Result<(Host, tempfile::TempDir, Duration)> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, toml)?;
        let started = Instant::now();
        let child = Command::new(bin)
            .arg("run")
            .arg(&path)
            .arg("--redis")
            .arg(self.redis_url())
            .current_dir(dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let mut host = Host(child);
        let ready_url = format!("http://{admin}/readyz");
        loop {
            if let Some(status) = host.0.try_wait()? {
                bail!("the host with {n} subscriptions exited: {status}");
            }
            let url = ready_url.clone();
            let ok = tokio::task::spawn_blocking(move || {
                ureq::get(&url)
                    .call()
                    .is_ok_and(|r| r.status().as_u16() == 200)
            })
            .await?;
            if ok {
                break;
            }
            if started.elapsed() > Duration::from_secs(600) {
                bail!("the host with {n} subscriptions was not ready within 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok((host, dir, started.elapsed()))
    }
}

/// Commands per second between two snapshots taken `seconds` apart (less this scenario's own
/// two INFO calls), and the `top` busiest commands, e.g. "xreadgroup 10.0/s".
fn rates(
    before: &[(String, u64)],
    after: &[(String, u64)],
    seconds: f64,
    top: usize,
) -> (f64, Vec<String>) {
    let total: u64 =
        after.iter().map(|(_, c)| c).sum::<u64>() - before.iter().map(|(_, c)| c).sum::<u64>() - 2;
    let mut by_command: Vec<(String, f64)> = after
        .iter()
        .map(|(name, calls)| {
            let was = before
                .iter()
                .find(|(b, _)| b == name)
                .map_or(0, |(_, c)| *c);
            (name.clone(), (calls - was) as f64 / seconds)
        })
        .filter(|(name, rate)| *rate > 0.0 && name != "info")
        .collect();
    by_command.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top = by_command
        .iter()
        .take(top)
        .map(|(name, rate)| format!("{name} {rate:.1}/s"))
        .collect();
    (total as f64 / seconds, top)
}

/// Each command's calls so far.
async fn stats(conn: &mut redis::aio::MultiplexedConnection) -> Result<Vec<(String, u64)>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(command_calls(&info)
        .map(|(name, calls)| (name.to_owned(), calls))
        .collect())
}

/// Clients connected to Redis now.
async fn clients(conn: &mut redis::aio::MultiplexedConnection) -> Result<usize> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(conn).await?;
    Ok(list.lines().count())
}

/// The `density` scenario's figures for one host.
struct Density {
    ready: Duration,
    rss_mib: f64,
    vsz_gib: f64,
    connections: usize,
    cmds_per_s: f64,
    cpu_percent: f64,
    p50_ms: f64,
    p99_ms: f64,
    top: Vec<String>,
    /// `/metrics`: series, bytes, and how long the first scrape took (it samples Redis).
    series: usize,
    metrics_kib: f64,
    scrape_ms: f64,
    /// `GET /v1/subscriptions` (its first page of 500).
    list_ms: f64,
}

/// GET `url`: the body and how long it took.
async fn timed_get(url: String) -> Result<(String, f64)> {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut response = ureq::get(&url)
            .call()
            .with_context(|| format!("GET {url}"))?;
        let body = response
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()?;
        Ok((body, started.elapsed().as_secs_f64() * 1000.0))
    })
    .await?
}

/// Clock ticks a process has run (user + system) by `/proc/<pid>/stat`.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command name (in parentheses, which may hold spaces): fields 3.. ; utime and
    // stime are the 14th and 15th fields.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("a /proc stat line")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("utime")?.parse()?;
    let stime: u64 = fields.get(12).context("stime")?.parse()?;
    Ok(utime + stime)
}

impl Bench {
    /// Many subscriptions on one host, as a density platform is used: N streams, each its own
    /// group, delayed set and dead-letter stream, the server publishing keyspace events for the
    /// doorbell (or not, with `polling`: the doorbell then polls). Idle: start time, RSS, virtual size, connections, commands/s and host CPU
    /// over 30 s once past their first looks; then the time from XADD on a random idle stream to its outcome in Redis,
    /// over `samples` entries one at a time.
    pub async fn density(
        &self,
        counts: &[usize],
        samples: usize,
        polling: bool,
    ) -> Result<Vec<Report>> {
        let bin = sluice_bin()?;
        let mut conn = self.conn().await?;
        let before: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("notify-keyspace-events")
            .query_async(&mut conn)
            .await?;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(if polling { "" } else { "Ktz" })
            .query_async(&mut conn)
            .await?;
        let mut out = Vec::new();
        for &n in counts {
            let name = if polling {
                format!("density polling {n} subs")
            } else {
                format!("density {n} subs")
            };
            match self.density_of(&bin, n, samples, polling).await {
                Ok(d) => {
                    eprintln!(
                        "  {n} subscriptions: ready in {:.1} s, RSS {:.0} MiB, VSZ {:.0} GiB, {} connections, {:.0} commands/s ({}), CPU {:.1} %, XADD to outcome p50 {:.2} ms p99 {:.2} ms; /metrics {} series ({:.0} KiB, first scrape {:.0} ms), list {:.0} ms",
                        d.ready.as_secs_f64(),
                        d.rss_mib,
                        d.vsz_gib,
                        d.connections,
                        d.cmds_per_s,
                        d.top.join(", "),
                        d.cpu_percent,
                        d.p50_ms,
                        d.p99_ms,
                        d.series,
                        d.metrics_kib,
                        d.scrape_ms,
                        d.list_ms
                    );
                    let mut report = Report::new(&name, 0, Duration::ZERO);
                    report.msgs_per_s = 0.0;
                    report.extra = vec![
                        ("ready_s", d.ready.as_secs_f64()),
                        ("rss_mib", d.rss_mib),
                        ("vsz_gib", d.vsz_gib),
                        ("connections", d.connections as f64),
                        ("cmds_per_s", d.cmds_per_s),
                        ("cpu_percent", d.cpu_percent),
                        ("p50_ms", d.p50_ms),
                        ("p99_ms", d.p99_ms),
                        ("series", d.series as f64),
                        ("scrape_ms", d.scrape_ms),
                        ("list_ms", d.list_ms),
                    ];
                    out.push(report);
                }
                Err(err) => {
                    eprintln!("  {n} subscriptions: FAILED: {err:#}");
                    let mut report = Report::new(&name, 0, Duration::ZERO);
                    report.msgs_per_s = 0.0;
                    report.extra = vec![("failed", 1.0)];
                    out.push(report);
                }
            }
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
        }
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(before.get(1).map_or("", String::as_str))
            .query_async(&mut conn)
            .await?;
        Ok(out)
    }

    async fn density_of(
        &self,
        bin: &PathBuf,
        n: usize,
        samples: usize,
        polling: bool,
    ) -> Result<Density> {
        let admin = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut toml = format!("admin = \"{admin}\"\nshutdown_timeout = \"1s\"\n");
        if polling {
            toml.push_str("doorbell = \"poll\"\n");
        }
        for i in 0..n {
            toml.push_str(&format!(
                "\n[[subscription]]\ncomponent = \"{}\"\nstream = \"dn{n}-{i}\"\ngroup = \"g{i}\"\nconsumer = \"c\"\ndelayed_retry = {{ key = \"dn{n}-{i}:delayed\" }}\n",
                self.fixture.display()
            ));
        }
        let mut conn = self.conn().await?;
        let clients_before = clients(&mut conn).await?;
        let (host, dir, ready) = self.start_idle(bin, &toml, n, &admin).await?;
        let pid = host.0.id();
        tokio::time::sleep(DENSITY_SETTLE).await;
        let before = stats(&mut conn).await?;
        let ticks_before = cpu_ticks(pid)?;
        let window = Instant::now();
        tokio::time::sleep(DENSITY_WINDOW).await;
        let after = stats(&mut conn).await?;
        let ticks_after = cpu_ticks(pid)?;
        let seconds = window.elapsed().as_secs_f64();
        let (cmds_per_s, top) = rates(&before, &after, seconds, 6);
        // Linux counts CPU time in ticks of 1/100 s (USER_HZ).
        let cpu_percent = (ticks_after - ticks_before) as f64 / seconds;
        let connections = clients(&mut conn).await?.saturating_sub(clients_before);
        let rss_mib = status(pid, "VmRSS")? as f64 / 1024.0;
        let vsz_gib = status(pid, "VmSize")? as f64 / (1024.0 * 1024.0);
        // From XADD to the outcome in Redis: each entry asks to be dead-lettered, and the
        // dead letter (written with the ack, in one script) is waited for with a blocking
        // XREAD from the dead-letter stream's last id.
        let mut reader = self.conn().await?;
        let mut latencies = Vec::with_capacity(samples);
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let payload = r#"{"mode":"dead","reason":"density"}"#;
        for _ in 0..samples {
            // xorshift: a spread of streams without a dependency.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let i = (rng % n as u64) as usize;
            let stream = format!("dn{n}-{i}");
            let dead = sluice_descriptor::default_dead_letter(&stream, &format!("g{i}"));
            let last: Vec<(String, redis::Value)> = redis::cmd("XREVRANGE")
                .arg(&dead)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut conn)
                .await?;
            let after_id = last.first().map_or("0-0".to_owned(), |(id, _)| id.clone());
            let sent = Instant::now();
            let _: String = redis::cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .query_async(&mut conn)
                .await?;
            let got: redis::Value = redis::cmd("XREAD")
                .arg("BLOCK")
                .arg(10_000)
                .arg("COUNT")
                .arg(1)
                .arg("STREAMS")
                .arg(&dead)
                .arg(&after_id)
                .query_async(&mut reader)
                .await?;
            if matches!(got, redis::Value::Nil) {
                bail!("no outcome for an entry on {stream} within 10 s");
            }
            latencies.push(sent.elapsed());
        }
        latencies.sort();
        let at = |q: f64| {
            latencies
                .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        let (metrics, scrape_ms) = timed_get(format!("http://{admin}/metrics")).await?;
        let series = metrics
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
        let (_, list_ms) = timed_get(format!("http://{admin}/v1/subscriptions")).await?;
        drop(host);
        drop(dir);
        Ok(Density {
            series,
            metrics_kib: metrics.len() as f64 / 1024.0,
            scrape_ms,
            list_ms,
            ready,
            rss_mib,
            vsz_gib,
            connections,
            cmds_per_s,
            cpu_percent,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            top,
        })
    }
}
