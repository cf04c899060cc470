//! The same wasm workload on a 3-master Redis Cluster: one partition (every entry through one
//! master) against 8 partitions spread over the masters, with each node's commands per second
//! from INFO commandstats to show where the load went.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::cluster_async::ClusterConnection;
use sluice_host::store::devredis::{DevRedis, DevRedisOptions};
use tokio_util::sync::CancellationToken;

use super::{Bench, Report};

/// Three cluster-enabled redis-servers joined as three masters (no replicas: this measures
/// where the work goes, not failover). Each server stops with its `DevRedis`.
struct Masters {
    nodes: Vec<DevRedis>,
    _dir: tempfile::TempDir,
}

impl Masters {
    async fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut nodes = Vec::new();
        for i in 0..3 {
            let node_dir = dir.path().join(format!("node-{i}"));
            std::fs::create_dir_all(&node_dir)?;
            // The bus port is given: port + 10000 can be past 65535 for a free port.
            let bus = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let options = DevRedisOptions {
                aof: false,
                reuse: false,
                password: false,
                die_with_host: false,
                extra_args: vec![
                    ("cluster-enabled".into(), "yes".into()),
                    ("cluster-port".into(), bus.to_string()),
                ],
            };
            nodes.push(DevRedis::start(&node_dir, &options)?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .context("cannot run redis-cli --cluster create")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let masters = Self { nodes, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in &masters.nodes {
            let mut conn = redis::Client::open(node.url())?
                .get_multiplexed_async_connection()
                .await?;
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut conn)
                    .await?;
                if info.contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("the benchmark cluster did not become ready");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(masters)
    }

    fn seeds(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(DevRedis::url).collect();
        urls.join(" ")
    }

    async fn conn(&self) -> Result<ClusterConnection> {
        let urls: Vec<String> = self.nodes.iter().map(DevRedis::url).collect();
        Ok(redis::cluster::ClusterClientBuilder::new(urls)
            .response_timeout(Duration::from_secs(30))
            .build()?
            .get_async_connection()
            .await?)
    }

    /// Every node's total command calls so far (INFO commandstats).
    async fn calls(&self) -> Result<Vec<u64>> {
        let mut calls = Vec::new();
        for node in &self.nodes {
            let mut conn = redis::Client::open(node.url())?
                .get_multiplexed_async_connection()
                .await?;
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await?;
            let total = super::command_calls(&info).map(|(_, calls)| calls).sum();
            calls.push(total);
        }
        Ok(calls)
    }
}

impl Bench {
    /// `cluster`: the wasm workload on 1 partition, then on 8, over one 3-master cluster.
    pub async fn cluster(&self, n: usize) -> Result<Vec<Report>> {
        let masters = Masters::start().await?;
        let one = self.on_cluster(&masters, "{bench-cluster-1}", 1, n).await?;
        let mut eight = self.on_cluster(&masters, "bench-cluster-8", 8, n).await?;
        eight.extra.push((
            "x_1_partition_pct",
            100.0 * eight.msgs_per_s / one.msgs_per_s,
        ));
        Ok(vec![one, eight])
    }

    async fn on_cluster(
        &self,
        masters: &Masters,
        stream: &str,
        partitions: u32,
        n: usize,
    ) -> Result<Report> {
        let mut conn = masters.conn().await?;
        let streams: Vec<String> = (0..partitions.max(1))
            .map(|p| {
                if partitions > 1 {
                    sluice_descriptor::partition_key(stream, stream, p)
                } else {
                    stream.to_owned()
                }
            })
            .collect();
        // Producers' rule: partition by a key (here the payment's account).
        let mut batches: Vec<Vec<String>> = vec![Vec::new(); streams.len()];
        for i in 0..n {
            let account = format!("acct-{:04}", i % 7919);
            let p = sluice_descriptor::partition_for(account.as_bytes(), partitions) as usize;
            batches[p].push(Self::payment(i));
        }
        for (key, payloads) in streams.iter().zip(&batches) {
            for chunk in payloads.chunks(1000) {
                let mut pipe = redis::pipe();
                for payload in chunk {
                    pipe.cmd("XADD")
                        .arg(key)
                        .arg("*")
                        .arg("payload")
                        .arg(payload)
                        .ignore();
                }
                pipe.query_async::<()>(&mut conn).await?;
            }
        }
        let toml = format!(
            "admin = \"off\"\n[[subscription]]\ncomponent = {:?}\nstream = {stream:?}\ngroup = \"g\"\ncount = 128\nmax_in_flight = 128\nblock = \"100ms\"\ndelayed_retry = \"none\"\npartitions = {partitions}\n",
            self.fixture.display().to_string()
        );
        let path = self.dir.path().join("bench-cluster.toml");
        std::fs::write(&path, toml)?;
        let config = sluice_host::Config::load(&[path])?;
        let plan = sluice_host::Plan::build(&config, &self.runtime, Some(&masters.seeds())).await?;
        let service = sluice_host::Service::new(plan);
        let before = masters.calls().await?;
        let stop = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(service.run(None, stop.clone()));
        loop {
            let mut done = true;
            for key in &streams {
                let group = sluice_host::store::inspect::group(&mut conn, key, "g").await?;
                if !group.is_some_and(|g| g.pending == 0 && g.lag == Some(0)) {
                    done = false;
                    break;
                }
            }
            if done {
                break;
            }
            if started.elapsed() > Duration::from_secs(600) {
                bail!("{stream} did not settle on the cluster within 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        let after = masters.calls().await?;
        stop.cancel();
        task.await?.context("the host failed")?;
        let mut report = Report::new(&format!("cluster-{partitions}-partition"), n, elapsed);
        report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
        const NODES: [&str; 3] = ["node1_cmds_s", "node2_cmds_s", "node3_cmds_s"];
        for (name, (b, a)) in NODES.iter().zip(before.iter().zip(&after)) {
            report
                .extra
                .push((name, (a - b) as f64 / elapsed.as_secs_f64()));
        }
        Ok(report)
    }
}
