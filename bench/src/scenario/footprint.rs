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
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, toml)?;
        let mut conn = self.conn().await?;
        let clients_before = clients(&mut conn).await?;
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
        let pid = host.0.id();
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
        let ready = started.elapsed();
        tokio::time::sleep(SETTLE).await;
        let before = stats(&mut conn).await?;
        let window = Instant::now();
        tokio::time::sleep(WINDOW).await;
        let after = stats(&mut conn).await?;
        let seconds = window.elapsed().as_secs_f64();
        // This scenario's own two INFO calls are in the difference.
        let total: u64 = after.iter().map(|(_, c)| c).sum::<u64>()
            - before.iter().map(|(_, c)| c).sum::<u64>()
            - 2;
        let per_s = total as f64 / seconds;
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
        let top: Vec<String> = by_command
            .iter()
            .take(5)
            .map(|(name, rate)| format!("{name} {rate:.1}/s"))
            .collect();
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
