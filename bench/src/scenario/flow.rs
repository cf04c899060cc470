//! What flow control costs: the `wasm` path with no flow control, with a shared rate limit far
//! above what the host can do (the budget always ample: every read still takes its tokens
//! through the script, fetched ahead), and with a circuit breaker that never opens (every
//! attempt counted, the window written four times a second), alternated in one run; with the
//! script calls per read and per thousand messages. (Not configured, neither is on the path:
//! a read loop checks an `Option`, and so does each attempt.)

use anyhow::Result;

use super::{Bench, Report};

/// Rounds of each setting, alternated.
const ROUNDS: usize = 5;

/// The settings: a name and the subscription lines that make it.
const SETTINGS: [(&str, &str); 3] = [
    ("wasm flow off", ""),
    (
        "wasm rate-limit ample",
        "rate_limit = { per_second = 1000000, burst = 1000000 }\n",
    ),
    (
        "wasm breaker closed",
        "circuit_breaker = { failure_rate = 1.0, window = \"30s\", min_deliveries = 1000000000, open_for = \"30s\" }\n",
    ),
];

impl Bench {
    /// [`SETTINGS`] alternated [`ROUNDS`] times on `n` messages each; then each setting's
    /// median, with its ratio to off's.
    pub async fn flow(&self, n: usize) -> Result<Vec<Report>> {
        let mut runs: Vec<Vec<Report>> = SETTINGS.iter().map(|_| Vec::new()).collect();
        for round in 0..ROUNDS {
            for (i, (name, extra)) in SETTINGS.iter().enumerate() {
                let mut conn = self.conn().await?;
                let before = evalsha_calls(&mut conn).await?;
                let mut report = self
                    .host_path_of(
                        &format!("flow-{i}-{round}"),
                        &self.fixture,
                        "reuse",
                        n,
                        extra,
                    )
                    .await?;
                let scripts = (evalsha_calls(&mut conn).await? - before) as f64;
                let reads_per_1k = report
                    .extra
                    .iter()
                    .find(|(k, _)| *k == "x_reads_per_1k")
                    .map_or(0.0, |(_, v)| *v);
                report.scenario = format!("{name} #{}", round + 1);
                report
                    .extra
                    .push(("x_scripts_per_1k", 1000.0 * scripts / n as f64));
                if reads_per_1k > 0.0 {
                    report.extra.push((
                        "x_scripts_per_read",
                        1000.0 * scripts / n as f64 / reads_per_1k,
                    ));
                }
                eprintln!("  {}: {:.0} msgs/s", report.scenario, report.msgs_per_s);
                runs[i].push(report);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut off_rates: Vec<f64> = runs[0].iter().map(|r| r.msgs_per_s).collect();
        let off = median(&mut off_rates);
        let mut out = Vec::new();
        for (i, (name, _)) in SETTINGS.iter().enumerate() {
            let mut rates: Vec<f64> = runs[i].iter().map(|r| r.msgs_per_s).collect();
            let mid = median(&mut rates);
            let mut report = Report::new(&format!("{name} median"), 0, std::time::Duration::ZERO);
            report.msgs_per_s = mid;
            report.extra.push(("vs off %", 100.0 * (mid / off - 1.0)));
            let mut scripts: Vec<f64> = runs[i]
                .iter()
                .filter_map(|r| {
                    r.extra
                        .iter()
                        .find(|(k, _)| *k == "x_scripts_per_read")
                        .map(|(_, v)| *v)
                })
                .collect();
            if !scripts.is_empty() {
                report
                    .extra
                    .push(("scripts per read", median(&mut scripts)));
            }
            out.append(&mut runs[i]);
            out.push(report);
        }
        Ok(out)
    }
}

/// EVALSHA (and EVAL) calls Redis has served so far.
async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(super::command_calls(&info)
        .filter(|(name, _)| *name == "evalsha" || *name == "eval")
        .map(|(_, calls)| calls)
        .sum())
}
