//! How fast entries go through: Redis alone (`ceiling`), the host with a native handler, and
//! with the WASM fixture reused or fresh per delivery.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use redis::Value;
use tokio_util::sync::CancellationToken;

use super::{Bench, Report};
use crate::native::NativeAck;

impl Bench {
    /// `stream` filled with `n` payments and a group `g` at its start; a connection to read it.
    async fn filled_with_group(
        &self,
        stream: &str,
        n: usize,
    ) -> Result<redis::aio::MultiplexedConnection> {
        self.fill(stream, n, Self::payment).await?;
        let mut conn = self.conn().await?;
        redis::cmd("XGROUP")
            .arg(["CREATE", stream, "g", "0"].as_slice())
            .query_async::<()>(&mut conn)
            .await?;
        Ok(conn)
    }

    /// XREADGROUP COUNT 128 + one XACK per batch, nothing else.
    pub async fn ceiling(&self, n: usize) -> Result<Report> {
        let stream = "bench-ceiling";
        let mut conn = self.filled_with_group(stream, n).await?;
        let started = Instant::now();
        let handled = read_and_ack(&mut conn, stream, "c").await?;
        if handled != n {
            bail!("ceiling handled {handled} of {n}");
        }
        let mut report = Report::new("ceiling", n, started.elapsed());
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        Ok(report)
    }

    /// `ceiling-lean`: the `ceiling` loop through the host's lean read connection
    /// (`sluice_host::store::redis_conn::lean`), which parses XREADGROUP replies straight into entries
    /// with owned fields: what the client side gains without redis-rs's reply tree and
    /// connection task.
    pub async fn ceiling_lean(&self, n: usize) -> Result<Report> {
        use redis::IntoConnectionInfo as _;
        use sluice_host::store::redis_conn::lean::LeanConn;
        use sluice_host::store::redis_conn::transport::{Endpoint, Tls};
        let stream = "bench-ceiling-lean";
        self.filled_with_group(stream, n).await?;
        let info = self.redis_url().into_connection_info()?;
        let timeout = std::time::Duration::from_secs(5);
        let endpoint = Endpoint::of(info.addr())?;
        let settings = info.redis_settings();
        let mut lean =
            LeanConn::connect(&endpoint, &Tls::default(), settings, (timeout, timeout)).await?;
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(128)
            .arg("STREAMS")
            .arg(stream)
            .arg(">");
        let started = Instant::now();
        let mut handled = 0;
        loop {
            let ids = lean
                .read_entries(&read, (usize::MAX, usize::MAX), |_, id, _fields, _| id)
                .await?;
            if ids.is_empty() {
                break;
            }
            handled += ids.len();
            let _: i64 = redis::cmd("XACK")
                .arg(stream)
                .arg("g")
                .arg(&ids)
                .query_async(&mut lean)
                .await?;
        }
        if handled != n {
            bail!("ceiling-lean handled {handled} of {n}");
        }
        let mut report = Report::new("ceiling-lean", n, started.elapsed());
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        Ok(report)
    }

    /// `ceiling-server`: the `ceiling` loop on `connections` connections at once, each its own
    /// consumer of the group, with Redis's own CPU time (INFO CPU) over the run: how much of
    /// the server one such pattern uses, so the client side's distance from it shows.
    pub async fn ceiling_server(&self, n: usize, connections: usize) -> Result<Report> {
        let stream = "bench-ceiling-server";
        let mut conn = self.filled_with_group(stream, n).await?;
        let cpu_before = redis_cpu_seconds(&mut conn).await?;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..connections {
            let mut conn = self.conn().await?;
            tasks.push(tokio::spawn(async move {
                read_and_ack(&mut conn, stream, &format!("c{c}")).await
            }));
        }
        let mut handled = 0;
        for task in tasks {
            handled += task.await??;
        }
        let elapsed = started.elapsed();
        let cpu = redis_cpu_seconds(&mut conn).await? - cpu_before;
        if handled != n {
            bail!("ceiling-server handled {handled} of {n}");
        }
        let mut report = Report::new("ceiling-server", n, elapsed);
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        report.extra.push(("x_connections", connections as f64));
        report
            .extra
            .push(("x_redis_cpu_pct", 100.0 * cpu / elapsed.as_secs_f64()));
        report
            .extra
            .push(("x_redis_us_per_msg", cpu * 1e6 / n as f64));
        Ok(report)
    }

    /// The host's full path: `native`, `wasm` or `wasm-isolated`; `native-doorbell` and
    /// `wasm-doorbell` with the polling doorbell.
    pub async fn host_path(&self, scenario: &str, n: usize) -> Result<Report> {
        self.host_path_with(scenario, n, "").await
    }

    /// `retention`: the `wasm` path with retention trimming the stream every second behind the
    /// readers, against the same path without it, back to back.
    pub async fn retention(&self, n: usize) -> Result<Vec<Report>> {
        let off = self.host_path_with("wasm-retention-off", n, "").await?;
        let mut on = self
            .host_path_with(
                "wasm-retention-on",
                n,
                "retention = { keep_acked = \"0s\", every = \"1s\" }\n",
            )
            .await?;
        on.extra
            .push(("x_off_pct", 100.0 * on.msgs_per_s / off.msgs_per_s));
        Ok(vec![off, on])
    }

    async fn host_path_with(&self, scenario: &str, n: usize, extra: &str) -> Result<Report> {
        let isolation = if scenario == "wasm-isolated" {
            "per-delivery"
        } else {
            "reuse"
        };
        self.host_path_of(scenario, &self.fixture, isolation, n, extra)
            .await
    }

    /// The host's full path on `component` with `isolation` (`reuse` or `per-delivery`).
    pub(crate) async fn host_path_of(
        &self,
        scenario: &str,
        component: &std::path::Path,
        isolation: &str,
        n: usize,
        extra: &str,
    ) -> Result<Report> {
        let stream = format!("bench-{scenario}");
        self.fill(&stream, n, Self::payment).await?;
        let mut toml = path_toml(component, &stream, isolation, extra);
        if scenario.ends_with("-doorbell") {
            // Reads through the doorbell's path (a bell, the shared connections), as a
            // subscription of a host of thousands reads.
            toml.insert_str(0, "doorbell = \"poll\"\n");
        }
        let mut service = self.service(&toml).await?;
        if scenario.starts_with("native") {
            service = service.with_handler(0, Arc::new(NativeAck::new()));
        }
        let mut conn = self.conn().await?;
        let calls_before = command_calls(&mut conn).await?;
        let cpu_before = redis_cpu_seconds(&mut conn).await?;
        let host_cpu_before = process_cpu_seconds();
        let stop = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        self.settled(&stream, n, None).await?;
        let elapsed = started.elapsed();
        stop.cancel();
        task.await?.context("the host failed")?;
        let cpu = redis_cpu_seconds(&mut conn).await? - cpu_before;
        let host_cpu = process_cpu_seconds() - host_cpu_before;
        let calls = command_calls(&mut conn).await?;
        let mut report = Report::new(scenario, n, elapsed);
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        // How the host's path talks to Redis: reads and acks per message (the batching), and
        // what Redis and this process spent per message (both include the harness's 2 ms
        // polling).
        report.extra.push((
            "x_reads_per_1k",
            1000.0 * (calls.0 - calls_before.0) as f64 / n as f64,
        ));
        report.extra.push((
            "x_xacks_per_1k",
            1000.0 * (calls.1 - calls_before.1) as f64 / n as f64,
        ));
        report
            .extra
            .push(("x_redis_us_per_msg", cpu * 1e6 / n as f64));
        report
            .extra
            .push(("x_host_us_per_msg", host_cpu * 1e6 / n as f64));
        Ok(report)
    }
}

/// The configuration of the host's path: one subscription of `component` on `stream` (group
/// `g`), acking, with `extra` lines.
pub(crate) fn path_toml(
    component: &std::path::Path,
    stream: &str,
    isolation: &str,
    extra: &str,
) -> String {
    format!(
        "[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 256\nblock = \"100ms\"\nisolation = \"{isolation}\"\ndelayed_retry = \"none\"\n{extra}",
        component.display().to_string()
    )
}

/// XREADGROUP COUNT 128 as `consumer` and XACK each batch until the stream has nothing new;
/// how many entries that was.
async fn read_and_ack(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    consumer: &str,
) -> redis::RedisResult<usize> {
    let mut handled = 0;
    loop {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg(
                [
                    "GROUP", "g", consumer, "COUNT", "128", "STREAMS", stream, ">",
                ]
                .as_slice(),
            )
            .query_async(conn)
            .await?;
        let ids = entry_ids(&reply);
        if ids.is_empty() {
            return Ok(handled);
        }
        handled += ids.len();
        redis::cmd("XACK")
            .arg(stream)
            .arg("g")
            .arg(&ids)
            .query_async::<i64>(conn)
            .await?;
    }
}

/// How many XREADGROUP and XACK calls Redis has served so far (INFO commandstats).
pub(super) async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<(u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let calls = |wanted: &str| {
        super::command_calls(&info)
            .find(|(name, _)| *name == wanted)
            .map_or(0, |(_, calls)| calls)
    };
    Ok((calls("xreadgroup"), calls("xack")))
}

/// Redis's own CPU time so far (user + system, INFO CPU), in seconds.
pub(super) async fn redis_cpu_seconds(conn: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_user") + field("used_cpu_sys"))
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

/// CPU time (user + system) this process has used so far, seconds, from /proc (clock ticks of
/// 1/100 s, Linux's USER_HZ); 0 where /proc is not there.
pub(super) fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at its closing parenthesis.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are the 14th and 15th fields of the line, 12th and 13th after the name.
    (ticks(11) + ticks(12)) / 100.0
}
