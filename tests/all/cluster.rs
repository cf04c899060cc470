//! The host on a real Redis Cluster: three masters and three replicas on loopback, built once
//! and shared by the scenarios below, which run one after another (a slot migration or a
//! failover in one must not land in the middle of another).
//!
//! Each scenario uses a hash tag of its own, chosen for which master owns it, and checks the
//! invariants that matter: every entry reaches its final outcome (acked or dead-lettered),
//! nothing is lost, parked retries come back; duplicates are counted and reported.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use sluice_host::EventKind;

use crate::common::*;

/// How long a scenario may take to settle everything.
const SETTLE: Duration = Duration::from_secs(90);

/// Six `redis-server --cluster-enabled yes`, joined by `redis-cli --cluster create` into three
/// masters with one replica each. Stopped (by PID) when dropped.
pub struct Cluster {
    nodes: Vec<Redis>,
}

/// One line of CLUSTER NODES.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// A replica's master.
    pub master_id: Option<String>,
    pub slots: Vec<(u16, u16)>,
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

impl Cluster {
    pub async fn start() -> Self {
        let nodes: Vec<Redis> = (0..6)
            .map(|_| {
                // The bus port is given: port + 10000 may be past 65535 for a free port.
                let bus = free_port().to_string();
                Redis::start_with(
                    false,
                    &[
                        ("cluster-enabled", "yes"),
                        ("cluster-port", &bus),
                        ("cluster-node-timeout", "2000"),
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", port_of(&n.url())))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_agreed().await;
        cluster
    }

    /// Wait until every node says the cluster is ok and sees three masters with replicas.
    async fn wait_agreed(&self) {
        let nodes = &self.nodes;
        wait_for(
            SETTLE,
            "every node to see a healthy cluster",
            || async move {
                for node in nodes {
                    let mut conn = node.conn().await;
                    let info: String = cmd(&mut conn, &["CLUSTER", "INFO"]).await;
                    if !info.contains("cluster_state:ok") {
                        return None;
                    }
                    let view = nodes_of(&mut conn).await;
                    let masters = view.iter().filter(|n| n.master && !n.slots.is_empty());
                    if masters.count() != 3 || view.iter().filter(|n| !n.master).count() != 3 {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await;
    }

    /// The seed URLs as the host's configuration carries a `redis = [..]` list.
    pub fn seeds(&self) -> String {
        format!("{} {}", self.nodes[0].url(), self.nodes[1].url())
    }

    /// A cluster connection for the test itself (it follows MOVED like the host's).
    pub async fn conn(&self) -> ClusterConnection {
        redis::cluster::ClusterClientBuilder::new(vec![self.nodes[0].url(), self.nodes[1].url()])
            .connection_timeout(Duration::from_secs(10))
            .response_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
            .get_async_connection()
            .await
            .expect("connect to the test cluster")
    }

    /// A stream name (`<prefix><n>`) whose `partitions` partitions land on every master (the
    /// tags are pseudo-random).
    pub async fn partitioned_over_every_master(&self, prefix: &str, partitions: u32) -> String {
        for i in 0.. {
            let name = format!("{prefix}{i}");
            let mut owners = std::collections::HashSet::new();
            for p in 0..partitions {
                let key = sluice_descriptor::partition_key(&name, &name, p);
                owners.insert(self.owner(&key).await.port);
            }
            if owners.len() == 3 {
                return name;
            }
        }
        unreachable!("some name spreads over three masters")
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &Redis {
        self.nodes
            .iter()
            .find(|n| port_of(&n.url()) == port)
            .expect("a node of this cluster")
    }

    /// The cluster as node 0 sees it now.
    pub async fn view(&self) -> Vec<Node> {
        nodes_of(&mut self.nodes[0].conn().await).await
    }

    /// The master that serves `key`'s slot now, as node 0 sees it (waiting while its view is
    /// in flux: a slot between owners, a node just flagged as failing).
    pub async fn owner(&self, key: &str) -> Node {
        let slot: u16 = cmd(
            &mut self.nodes[0].conn().await,
            &["CLUSTER", "KEYSLOT", key],
        )
        .await;
        wait_for(
            SETTLE,
            &format!("a master serving slot {slot}"),
            || async move {
                self.view()
                    .await
                    .into_iter()
                    .find(|n| n.master && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            },
        )
        .await
    }

    /// A hash tag starting with `prefix` whose slot a master other than node 0 (the first
    /// seed) serves.
    pub async fn tag_away_from_seed(&self, prefix: &str) -> String {
        let seed = port_of(&self.nodes[0].url());
        for i in 0.. {
            let tag = format!("{prefix}{i}");
            if self.owner(&format!("{{{tag}}}")).await.port != seed {
                return tag;
            }
        }
        unreachable!()
    }
}

/// CLUSTER NODES, parsed.
pub async fn nodes_of(conn: &mut redis::aio::MultiplexedConnection) -> Vec<Node> {
    let text: String = cmd(conn, &["CLUSTER", "NODES"]).await;
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 8 || parts[2].contains("fail") {
                return None;
            }
            let port = parts[1]
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = parts[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|one| (one, one)),
                })
                .collect();
            Some(Node {
                id: parts[0].to_owned(),
                port,
                master: parts[2].contains("master"),
                master_id: (parts[3] != "-").then(|| parts[3].to_owned()),
                slots,
            })
        })
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Each `Redis` stops its own server by PID.
        self.nodes.clear();
    }
}

/// Every entry's final outcomes (acked or dead-lettered) as the hosts' events report them, by
/// the stream the producer added it to and its id there (ids repeat across streams).
#[derive(Default)]
struct Finals {
    by_origin: HashMap<(String, String), Vec<EventKind>>,
}

impl Finals {
    fn take(&mut self, host: &mut TestHost) {
        while let Ok(event) = host.events.try_recv() {
            if matches!(
                event.kind,
                EventKind::Acked | EventKind::DeadLettered { .. }
            ) {
                self.by_origin
                    .entry((event.stream.to_string(), event.origin_id.clone()))
                    .or_default()
                    .push(event.kind.clone());
            }
        }
    }

    fn settled(&self, ids: &[(String, String)]) -> usize {
        ids.iter()
            .filter(|id| self.by_origin.contains_key(*id))
            .count()
    }

    /// The first final outcome of entry `id` of `stream`.
    fn first(&self, stream: &str, id: &str) -> &EventKind {
        &self.by_origin[&(stream.to_owned(), id.to_owned())][0]
    }

    /// Final outcomes beyond the first, over all entries.
    fn duplicates(&self) -> usize {
        self.by_origin.values().map(|v| v.len() - 1).sum()
    }
}

/// Wait until every id in `ids` has a final outcome in the events of `hosts`.
async fn wait_settled(hosts: &mut [&mut TestHost], ids: &[(String, String)], what: &str) -> Finals {
    let mut finals = Finals::default();
    let deadline = Instant::now() + SETTLE;
    let mut poll = tokio::time::interval(Duration::from_millis(20));
    loop {
        poll.tick().await;
        for host in hosts.iter_mut() {
            finals.take(host);
        }
        if finals.settled(ids) == ids.len() {
            return finals;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: only {} of {} entries reached a final outcome within {SETTLE:?}",
            finals.settled(ids),
            ids.len()
        );
    }
}

/// The stream's slot on a master other than the seed URL's; the host is given that one URL and
/// finds the cluster from it: entries acked, retries parked and swept back on time, dead
/// letters written, all in the stream's slot on the other node.
async fn a_stream_on_another_node(cluster: &Cluster) {
    let tag = cluster.tag_away_from_seed("away").await;
    let stream = format!("{{{tag}}}");
    let delayed = format!("{stream}.delayed");
    let seed_url = cluster.nodes[0].url();
    let mut host = TestHost::start_at(
        &seed_url,
        &TestConfig::of(
            Sub::fixture(&stream)
                .delayed(&delayed)
                .set("retry_lane", true),
        )
        .to_string(),
    )
    .await;
    let mut conn = cluster.conn().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(add(&mut conn, &stream, &Control::Ack).await);
    }
    let started = Instant::now();
    let mut retried = Vec::new();
    for _ in 0..5 {
        retried.push(add(&mut conn, &stream, &Control::Retry { ms: 800, times: 1 }).await);
    }
    let dead = add(
        &mut conn,
        &stream,
        &Control::Dead {
            reason: "refused".into(),
        },
    )
    .await;
    wait_for(SETTLE, "the retries to be parked", || {
        let mut conn = conn.clone();
        let delayed = delayed.clone();
        async move { (parked(&mut conn, &delayed).await == 5).then_some(()) }
    })
    .await;
    ids.extend(retried.iter().cloned());
    ids.push(dead.clone());
    let ids: Vec<(String, String)> = ids.into_iter().map(|id| (stream.clone(), id)).collect();
    let finals = wait_settled(&mut [&mut host], &ids, "a stream on another node").await;
    // Not before the delay; "on time" with room for a loaded 2-core machine.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(800), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    for id in &retried {
        assert_eq!(finals.first(&stream, id), &EventKind::Acked, "retry {id}");
    }
    let letters = dead_lettered(&mut conn, &stream).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        field(&letters[0].1, "sluice-origin-id"),
        Some(dead.as_str())
    );
    assert_eq!(parked(&mut conn, &delayed).await, 0);
    assert_eq!(pending(&mut conn, &stream, "g").await, 0);
    // The retries came back through the lane, in the stream's slot.
    let lane = format!("{delayed}.lane");
    // (A sweep trims what the group acknowledged there before it adds more.)
    let copies = lane_copies(&mut conn, &delayed).await;
    assert!((1..=5).contains(&copies.len()), "{copies:?}");
    assert!(
        copies.iter().all(|c| retried.contains(&c.origin_id)),
        "{copies:?}"
    );
    assert_eq!(pending(&mut conn, &lane, "g").await, 0);
    assert_eq!(finals.duplicates(), 0);
    assert_ne!(
        cluster.owner(&stream).await.port,
        port_of(&seed_url),
        "the stream lives on another node than the seed"
    );
    host.stop().await.unwrap();
}

/// A load of `total` entries on `stream`, one every few milliseconds: mostly acks, every third
/// a retry parked for a moment, every twentieth a dead letter. `added` counts what is in.
fn load(
    mut conn: ClusterConnection,
    stream: String,
    total: usize,
    added: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut ids = Vec::with_capacity(total);
        for i in 0..total {
            let control = match i % 20 {
                19 => Control::Dead {
                    reason: "refused".into(),
                },
                n if n % 3 == 0 => Control::Retry {
                    ms: 300 + (i as u64 % 5) * 100,
                    times: 1,
                },
                _ => Control::Ack,
            };
            ids.push(add_retrying(&mut conn, &stream, &control).await);
            added.store(i + 1, std::sync::atomic::Ordering::Release);
            tokio::time::sleep(Duration::from_millis(4)).await;
        }
        ids
    })
}

/// XADD like a producer that keeps trying while the cluster changes under it (a failover
/// leaves no node for the slot for a moment).
async fn add_retrying(conn: &mut ClusterConnection, stream: &str, control: &Control) -> String {
    let payload = serde_json::to_string(control).unwrap();
    wait_for(SETTLE, &format!("XADD to {stream}"), || {
        let mut conn = conn.clone();
        let payload = payload.clone();
        async move {
            redis::cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .query_async(&mut conn)
                .await
                .ok()
        }
    })
    .await
}

/// Wait until the load has added `n` entries.
async fn wait_added(added: &std::sync::atomic::AtomicUsize, n: usize) {
    wait_for(SETTLE, &format!("{n} entries added"), || async move {
        (added.load(std::sync::atomic::Ordering::Acquire) >= n).then_some(())
    })
    .await;
}

/// Run `change` on the cluster while a retry-heavy load runs on a stream whose master is
/// `master` (a fresh tag), then check that every entry reached its final outcome and nothing
/// was left parked or pending; returns how many final outcomes were duplicates.
async fn under_load<F, Fut>(cluster: &Cluster, prefix: &str, what: &str, change: F) -> usize
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let tag = cluster.tag_away_from_seed(prefix).await;
    let stream = format!("{{{tag}}}");
    let delayed = format!("{stream}.delayed");
    // Retries come back through the lane: it moves and fails over with the stream's slot.
    let mut host = TestHost::start_at(
        &cluster.seeds(),
        &TestConfig::of(
            Sub::fixture(&stream)
                .delayed(&delayed)
                .set("retry_lane", true),
        )
        .to_string(),
    )
    .await;
    let added = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let total = 300;
    let conn = cluster.conn().await;
    let producer = load(conn.clone(), stream.clone(), total, added.clone());
    wait_added(&added, total / 3).await;
    // Some retries wait in the set across the change.
    wait_for(SETTLE, "retries parked before the change", || {
        let mut conn = conn.clone();
        let delayed = delayed.clone();
        async move { (parked(&mut conn, &delayed).await > 0).then_some(()) }
    })
    .await;
    change(stream.clone()).await;
    let ids = producer.await.expect("the load ran");
    let ids: Vec<(String, String)> = ids.into_iter().map(|id| (stream.clone(), id)).collect();
    let finals = wait_settled(&mut [&mut host], &ids, what).await;
    let mut conn = conn;
    wait_for(SETTLE, "nothing left parked or pending", || {
        let mut conn = conn.clone();
        let (stream, delayed) = (stream.clone(), delayed.clone());
        async move {
            let lane = format!("{delayed}.lane");
            (parked(&mut conn, &delayed).await == 0
                && pending(&mut conn, &stream, "g").await == 0
                && pending(&mut conn, &lane, "g").await == 0)
                .then_some(())
        }
    })
    .await;
    let dead = dead_lettered(&mut conn, &stream).await;
    let expected_dead = (0..total).filter(|i| i % 20 == 19).count();
    assert!(dead.len() >= expected_dead, "{} dead letters", dead.len());
    for (i, (_, id)) in ids.iter().enumerate() {
        let first = finals.first(&stream, id);
        if i % 20 == 19 {
            assert!(
                matches!(first, EventKind::DeadLettered { .. }),
                "{id}: {first:?}"
            );
        } else {
            assert_eq!(first, &EventKind::Acked, "{id}");
        }
    }
    let duplicates = finals.duplicates();
    eprintln!("{what}: {total} entries, all settled, {duplicates} duplicate final outcomes");
    host.stop().await.unwrap();
    duplicates
}

/// Move `key`'s slot to the master `to` the way `redis-cli --cluster reshard` does: mark it
/// importing and migrating, MIGRATE its keys in batches, then give the slot to `to` everywhere.
async fn migrate_slot(cluster: &Cluster, key: &str, to: &Node) {
    let from = cluster.owner(key).await;
    let slot: u16 = cmd(
        &mut cluster.nodes[0].conn().await,
        &["CLUSTER", "KEYSLOT", key],
    )
    .await;
    let slot = slot.to_string();
    let mut src = cluster.node(from.port).conn().await;
    let mut dst = cluster.node(to.port).conn().await;
    let _: () = cmd(
        &mut dst,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from.id],
    )
    .await;
    let _: () = cmd(
        &mut src,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to.id],
    )
    .await;
    loop {
        let keys: Vec<String> = cmd(&mut src, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]).await;
        if keys.is_empty() {
            break;
        }
        let port = to.port.to_string();
        let mut words = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        words.extend(keys.iter().map(String::as_str));
        let _: () = cmd(&mut src, &words).await;
    }
    let _: () = cmd(&mut dst, &["CLUSTER", "SETSLOT", &slot, "NODE", &to.id]).await;
    let _: () = cmd(&mut src, &["CLUSTER", "SETSLOT", &slot, "NODE", &to.id]).await;
    for node in cluster.view().await.iter().filter(|n| n.master) {
        let mut conn = cluster.node(node.port).conn().await;
        let _: () = cmd(&mut conn, &["CLUSTER", "SETSLOT", &slot, "NODE", &to.id]).await;
    }
}

/// A slot migration of the stream's hash tag while the load runs.
async fn a_slot_migration_under_load(cluster: &Cluster) {
    under_load(cluster, "moving", "slot migration", |stream| async move {
        let from = cluster.owner(&stream).await;
        let view = cluster.view().await;
        let to = view
            .iter()
            .find(|n| n.master && n.id != from.id)
            .expect("another master")
            .clone();
        migrate_slot(cluster, &stream, &to).await;
        assert_eq!(cluster.owner(&stream).await.port, to.port);
    })
    .await;
}

/// `CLUSTER FAILOVER` on the replica of the stream's master while the load runs.
async fn a_failover_under_load(cluster: &Cluster) {
    under_load(cluster, "failing", "failover", |stream| async move {
        let old = cluster.owner(&stream).await;
        let view = cluster.view().await;
        let replica = view
            .iter()
            .find(|n| n.master_id.as_deref() == Some(old.id.as_str()))
            .expect("the master has a replica")
            .clone();
        let _: () = cmd(
            &mut cluster.node(replica.port).conn().await,
            &["CLUSTER", "FAILOVER"],
        )
        .await;
        wait_for(
            SETTLE,
            "the replica to take over the stream's slot",
            || async { (cluster.owner(&stream).await.port == replica.port).then_some(()) },
        )
        .await;
    })
    .await;
}

/// 8 partitions spread over the 3 masters, served by 2 hosts of one group: every entry is
/// handled exactly once in its final outcome, retries return to the partition they came from,
/// both hosts read every partition, and `sluice status` shows each partition.
async fn partitions_over_the_cluster_with_two_hosts(cluster: &Cluster) {
    const PARTITIONS: u32 = 8;
    let stream = cluster
        .partitioned_over_every_master("orders", PARTITIONS)
        .await;
    let delayed = format!("{stream}.delayed");
    let sub = |consumer: &str| {
        TestConfig::of(
            Sub::fixture(&stream)
                .delayed(&delayed)
                .set("partitions", PARTITIONS as i64)
                .set("consumer", consumer),
        )
        .to_string()
    };
    let mut a = TestHost::start_at(&cluster.seeds(), &sub("host-a")).await;
    let mut b = TestHost::start_at(&cluster.seeds(), &sub("host-b")).await;
    let mut conn = cluster.conn().await;
    let mut ids = Vec::new();
    for i in 0..400u32 {
        let account = format!("acct-{}", i % 53);
        let target = sluice_descriptor::partition_stream(&stream, PARTITIONS, account.as_bytes());
        let control = match i % 20 {
            19 => Control::Dead {
                reason: "refused".into(),
            },
            n if n % 4 == 0 => Control::Retry { ms: 300, times: 1 },
            _ => Control::Ack,
        };
        let id = add(&mut conn, &target, &control).await;
        ids.push((target, id));
    }
    let finals = wait_settled(&mut [&mut a, &mut b], &ids, "8 partitions, 2 hosts").await;
    let repeated: Vec<_> = finals
        .by_origin
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .take(5)
        .collect();
    assert_eq!(
        finals.duplicates(),
        0,
        "every entry handled exactly once: {repeated:?}"
    );
    // Keyed by the partition written to: an entry settled in another partition (a retry
    // re-added elsewhere) would be missing here and fail the wait above.
    assert_eq!(finals.by_origin.len(), ids.len());
    for p in 0..PARTITIONS {
        let key = sluice_descriptor::partition_key(&stream, &stream, p);
        let consumers = sluice_host::store::inspect::consumers(&mut conn, &key, "g")
            .await
            .unwrap();
        let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
        assert!(
            names.contains(&"host-a") && names.contains(&"host-b"),
            "both hosts read partition {p}: {names:?}"
        );
        assert_eq!(pending(&mut conn, &key, "g").await, 0);
        let set = sluice_descriptor::partition_key(&delayed, &stream, p);
        assert_eq!(parked(&mut conn, &set).await, 0);
    }
    // Metrics name each partition's stream.
    let (code, metrics) = http_get(a.admin().await, "/metrics").await;
    assert_eq!(code, 200);
    for p in 0..PARTITIONS {
        let key = sluice_descriptor::partition_key(&stream, &stream, p);
        let line = format!("sluice_parked_entries{{stream=\"{key}\",group=\"g\"}} 0");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    // `sluice status` over the cluster, from a config whose `redis` is the seed list.
    let dir = tempfile::tempdir().unwrap();
    let seeds: Vec<String> = cluster
        .seeds()
        .split(' ')
        .map(|u| format!("\"{u}\""))
        .collect();
    let config = TestConfig::of(
        Sub::fixture(&stream)
            .delayed(&delayed)
            .set("partitions", PARTITIONS as i64),
    )
    .set("redis", Raw(&format!("[{}]", seeds.join(", "))));
    let path = write_config(dir.path(), "sluice.toml", &config.to_string());
    let path = path.display().to_string();
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        run_sluice(&["status", "--json", &path], std::path::Path::new("."))
    })
    .await
    .unwrap();
    assert!(ok, "{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), PARTITIONS as usize, "{out}");
    let dead: u64 = rows
        .iter()
        .map(|r| r["dead_letter_length"].as_u64().unwrap())
        .sum();
    assert_eq!(dead, 20, "{out}");
    for (p, row) in rows.iter().enumerate() {
        assert_eq!(row["partition"]["index"], p, "{out}");
        assert_eq!(row["partition"]["of"], stream.as_str(), "{out}");
        assert_eq!(row["pending"], 0, "{out}");
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Two Sluice groups and a plain consumer group on one partitioned stream over the three
/// masters: each Sluice group dead-letters each entry once (after two retries through its own
/// lane, in the entry's partition), and the plain group reads exactly what the producer wrote.
async fn fan_out_over_partitions(cluster: &Cluster) {
    const PARTITIONS: u32 = 4;
    const N: u32 = 120;
    let stream = cluster
        .partitioned_over_every_master("fan", PARTITIONS)
        .await;
    let mut conn = cluster.conn().await;
    let partition = |p: u32| sluice_descriptor::partition_key(&stream, &stream, p);
    for p in 0..PARTITIONS {
        let key = partition(p);
        let _: () = cmd(
            &mut conn,
            &["XGROUP", "CREATE", &key, "plain", "0", "MKSTREAM"],
        )
        .await;
    }
    let group = |name: &str| {
        Sub::fixture(&stream)
            .set("group", name)
            .set("consumer", format!("{name}-1"))
            .set("partitions", PARTITIONS as i64)
            .delayed(&format!("{stream}.{name}.delayed"))
    };
    let config = TestConfig::of(group("probe"))
        .and(group("audit"))
        .to_string();
    let mut host = TestHost::start_at(&cluster.seeds(), &config).await;
    let twice_then_dead = Control::Attempts {
        each: vec![
            Control::Retry { ms: 50, times: 9 },
            Control::Retry { ms: 50, times: 9 },
            Control::Dead {
                reason: "gave up".into(),
            },
        ],
    };
    // Ids are unique per partition only: entries are named by (partition, id).
    let mut added = std::collections::HashSet::new();
    for i in 0..N {
        let target =
            sluice_descriptor::partition_stream(&stream, PARTITIONS, format!("k{i}").as_bytes());
        let id = add(&mut conn, &target, &twice_then_dead).await;
        added.insert((target, id));
    }
    // Each group's dead letters, one per entry, in the entry's own partition.
    let mut dead: HashMap<(String, String, String), usize> = HashMap::new();
    let deadline = Instant::now() + SETTLE;
    while dead.len() < 2 * N as usize {
        assert!(
            Instant::now() < deadline,
            "only {} dead letters",
            dead.len()
        );
        let event = tokio::time::timeout_at(deadline.into(), host.events.recv())
            .await
            .expect("dead letters in time")
            .expect("events");
        if let EventKind::DeadLettered { .. } = event.kind {
            assert_eq!(event.retry_count, 2, "{event:?}");
            let entry = (event.stream.to_string(), event.origin_id.clone());
            assert!(added.contains(&entry), "{event:?}: in its own partition");
            *dead
                .entry((event.group.to_string(), entry.0, entry.1))
                .or_default() += 1;
        }
    }
    assert!(dead.values().all(|&n| n == 1), "each entry once per group");
    for name in ["probe", "audit"] {
        let letters: usize = {
            let mut n = 0;
            for p in 0..PARTITIONS {
                let key = sluice_descriptor::partition_key(
                    &sluice_descriptor::default_dead_letter(&stream, name),
                    &stream,
                    p,
                );
                n += entries(&mut conn, &key).await.len();
            }
            n
        };
        assert_eq!(
            letters, N as usize,
            "{name}: one dead letter per entry in Redis"
        );
    }
    // The plain group reads each partition's producer entries, nothing else.
    let mut plain = 0;
    for p in 0..PARTITIONS {
        let key = partition(p);
        let reply: redis::Value = cmd(
            &mut conn,
            &[
                "XREADGROUP",
                "GROUP",
                "plain",
                "p",
                "COUNT",
                "10000",
                "STREAMS",
                &key,
                ">",
            ],
        )
        .await;
        let read: redis::streams::StreamReadReply =
            redis::FromRedisValue::from_redis_value(reply).unwrap_or_default();
        for entry in read.keys.into_iter().flat_map(|k| k.ids) {
            assert!(
                added.contains(&(key.clone(), entry.id)),
                "a producer's entry"
            );
            plain += 1;
        }
    }
    assert_eq!(
        plain, N as usize,
        "the plain group read exactly the producer's entries"
    );
    eprintln!(
        "fan-out over {PARTITIONS} partitions: {N} entries, one dead letter per group each, plain group read {plain}"
    );
    host.stop().await.unwrap();
}

/// A 200 MB entry on a stream whose slot is on another master than the seed: the host's read
/// goes to that master on a lean connection of its own, which drops the value as it arrives
/// and dead-letters the entry unhandled, copied whole inside Redis (before: reads on a cluster
/// went through redis-rs's cluster connection, which buffered and parsed the whole reply).
/// The nodes announce no endpoint (`cluster-preferred-endpoint-type unknown-endpoint`: a
/// client reaches a node as it reached the one it asked), which the read's lookup of its
/// master once could not use (found by the attack review of issue 52).
async fn a_big_entry_on_another_node_is_not_read_whole(cluster: &Cluster) {
    let endpoints = |kind: &'static str| async move {
        for node in &cluster.nodes {
            let mut conn = node.conn().await;
            let _: () = cmd(
                &mut conn,
                &["CONFIG", "SET", "cluster-preferred-endpoint-type", kind],
            )
            .await;
        }
    };
    endpoints("unknown-endpoint").await;
    let tag = cluster.tag_away_from_seed("big").await;
    let stream = format!("{{{tag}}}");
    let mut conn = cluster.conn().await;
    let huge: String = memory::add_blob(&mut conn, &stream, 200 << 20).await;
    let small = add(&mut conn, &stream, &Control::Ack).await;
    let config = TestConfig::of(Sub::fixture(&stream)).set("redis", cluster.nodes[0].url());
    let host = HostProcess::spawn_in(config);
    wait_acked(&conn, &stream, "g", &small).await;
    memory::assert_dead_lettered_unread(
        &mut conn,
        &dead_letter_key(&stream),
        (&huge, 200 << 20),
        &host,
    )
    .await;
    drop(host);
    endpoints("ip").await;
}

/// `effects = "journal"` on a stream whose slot is on another node than the seed's: the journal
/// is in the stream's slot, a retry replays the charge.
async fn a_journal_on_another_node(cluster: &Cluster) {
    use crate::effects::{Gateway, calls};
    let tag = cluster.tag_away_from_seed("journal").await;
    let stream = format!("{{{tag}}}.pay");
    let gateway = Gateway::start("idempotency-key", 2).await;
    let mut host = TestHost::start_at(
        &cluster.nodes[0].url(),
        &TestConfig::of(
            Sub::fixture(&stream)
                .delayed(&format!("{stream}.delayed"))
                .set("effects", "journal")
                .set("allowed_outbound_hosts", Raw(&gateway.grant())),
        )
        .to_string(),
    )
    .await;
    let mut conn = cluster.conn().await;
    let urls = vec![gateway.url("charge"), gateway.url("receipt")];
    let id = add(&mut conn, &stream, &calls(urls, Vec::new())).await;
    host.event(SETTLE, "the payment acked", |e| {
        e.kind == EventKind::Acked && e.origin_id == id
    })
    .await;
    assert_eq!(
        gateway.keys("charge").len(),
        1,
        "the retries replayed the charge"
    );
    assert_eq!(gateway.keys("receipt").len(), 3);
    let slot = |key: String| {
        let mut conn = conn.clone();
        async move {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            slot
        }
    };
    assert_eq!(
        slot(sluice_host::store::keys::effects_key(&stream, "g", &id)).await,
        slot(stream.clone()).await,
        "the journal lives in the stream's slot"
    );
    host.stop().await.unwrap();
}

/// One cluster for every scenario, run in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_runs_on_a_redis_cluster() {
    let cluster = Cluster::start().await;
    a_stream_on_another_node(&cluster).await;
    a_big_entry_on_another_node_is_not_read_whole(&cluster).await;
    a_journal_on_another_node(&cluster).await;
    a_slot_migration_under_load(&cluster).await;
    a_failover_under_load(&cluster).await;
    partitions_over_the_cluster_with_two_hosts(&cluster).await;
    fan_out_over_partitions(&cluster).await;
}
