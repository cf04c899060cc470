//! Network faults, Jepsen-style: two `sluice` hosts, each in a network namespace of its own,
//! share one group under a retry-heavy load (every entry traps: two delayed retries through the
//! sorted set, then a dead letter) while one host's link to Redis is cut for 10 s, slowed and
//! made lossy for 20 s, cut in the middle of a chosen Redis call (a sweep pass, a dead-letter
//! write), or while the retention lease's holder is cut. After each:
//! - every entry is dead-lettered exactly once; attempts the fault made repeat are counted and
//!   printed (delivery is at-least-once), never an outcome;
//! - nothing is left pending (stream or retry lane) or parked;
//! - the host whose link broke reads again within a bound after the link returns;
//! - `/readyz` said 503 while the link was down (and 200 on the other host), and 200 after.
//!
//! Needs root (CI is root); without it each test says why and passes without running, except
//! under `SLUICE_CI=1`, where it fails.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::common::*;

const ENTRIES: usize = 2000;
const GROUP: &str = "g";
/// How long a cut lasts.
const CUT: Duration = Duration::from_secs(10);
/// The most a host may take to read again once its link is back (its in-flight calls time out,
/// it reconnects, its loop reads). Far above what a loaded 2-core machine needs.
const READS_AGAIN_WITHIN: Duration = Duration::from_secs(45);
/// The most `/readyz` may take to see a dead link (its probe's own timeout, plus a loaded
/// machine).
const NOT_READY_WITHIN: Duration = Duration::from_secs(8);

/// What a test does to host a's link (or to the lease holder's).
enum Fault {
    /// Drop every packet both ways for [`CUT`].
    Cut,
    /// 200 ms more round trip (100 ms each way) and 5 % of packets dropped each way, for 20 s.
    SlowAndLossy,
    /// Cut the link of whichever host holds the stream's retention lease.
    LeaseHolder,
    /// Cut the link right after this script's call has reached Redis (its reply never gets
    /// back before the link does).
    MidCall { what: &'static str, sha: String },
}

/// Two hosts on one group, each behind its own link.
struct Pair {
    redis: Redis,
    conn: MultiplexedConnection,
    stream: &'static str,
    nets: Vec<Netns>,
    proxies: Vec<LinkProxy>,
    _runs: Vec<RunDir>,
    hosts: Vec<HostProcess>,
    admin: Vec<SocketAddr>,
    ids: Vec<String>,
}

fn consumer(i: usize) -> &'static str {
    ["host-a", "host-b"][i]
}

impl Pair {
    async fn start(stream: &'static str, retention: bool) -> Self {
        let redis = Redis::start_with(false, &[]);
        let conn = redis.conn().await;
        let upstream: SocketAddr = redis
            .url()
            .trim_start_matches("redis://")
            .parse()
            .expect("redis address");
        let mut nets = Vec::new();
        let mut proxies = Vec::new();
        let mut runs = Vec::new();
        let mut hosts = Vec::new();
        let mut admin = Vec::new();
        for i in 0..2 {
            let ns = Netns::new();
            let proxy = LinkProxy::start(ns.root_ip(), upstream).await;
            let mut sub = Sub::fixture(stream)
                .set("consumer", consumer(i))
                .set("max_retries", 2)
                .set(
                    "failure_backoff",
                    Raw(r#"{ initial = "200ms", max = "400ms" }"#),
                )
                // A host cut off keeps its pending entries; the other takes them after this.
                .set("claim_min_idle", "5s")
                .delayed(&format!("{stream}.delayed"));
            if retention {
                sub = sub.set(
                    "retention",
                    Raw(r#"{ keep_acked = "0s", every = "200ms" }"#),
                );
            }
            let run = RunDir::at(
                &proxy.url(),
                TestConfig::of(sub).set("shutdown_timeout", "1s"),
            );
            let host = run.spawn_in(&ns);
            admin.push(host.admin_addr().await);
            nets.push(ns);
            proxies.push(proxy);
            runs.push(run);
            hosts.push(host);
        }
        let pair = Self {
            redis,
            conn,
            stream,
            nets,
            proxies,
            _runs: runs,
            hosts,
            admin,
            ids: Vec::new(),
        };
        for i in 0..2 {
            let took = pair.wait_ready(i, 200, Duration::from_secs(60)).await;
            println!(
                "network: host {} ready in {} ms",
                consumer(i),
                took.as_millis()
            );
        }
        pair
    }

    /// Add the load: every entry traps on every attempt.
    async fn load(&mut self) {
        self.ids = trapping_load(&mut self.conn, self.stream).await;
    }

    async fn dead_letters(&self) -> usize {
        dead_letters(&self.conn, self.stream).await
    }

    /// Wait until the load is well under way (a tenth dead-lettered, retries parked).
    async fn under_way(&self) {
        wait_for(Duration::from_secs(120), "the load under way", || async {
            (self.dead_letters().await >= ENTRIES / 10).then_some(())
        })
        .await;
    }

    /// `/readyz`'s status on host `i` (asked inside its namespace), `None` if it did not answer.
    async fn readyz(&self, i: usize) -> Option<u16> {
        let ns = &self.nets[i];
        let addr = self.admin[i];
        tokio::task::block_in_place(|| ns.http_status(addr, "/readyz"))
    }

    /// Wait until host `i`'s `/readyz` says `status`; how long that took.
    async fn wait_ready(&self, i: usize, status: u16, within: Duration) -> Duration {
        let start = Instant::now();
        let what = format!("/readyz {status} on host {}", consumer(i));
        wait_for(within, &what, || async {
            (self.readyz(i).await == Some(status)).then_some(())
        })
        .await;
        start.elapsed()
    }

    /// Wait until host `i` has sent reads of its own since `since`, when its link returned;
    /// how long after `since`. Counted at its relay: Redis's idle time of a consumer is no
    /// proof (7.0 refreshes it only when a read is served, and the other host may have taken
    /// the rest of the load), and a request sent during the cut reaches the relay after it;
    /// a few reads mean the loop is alive.
    async fn reads_again(&self, i: usize, since: Instant) -> Duration {
        let proxy = &self.proxies[i];
        let base = proxy.reads();
        let what = format!("host {} reading again after its link returned", consumer(i));
        wait_for(READS_AGAIN_WITHIN, &what, || async {
            (proxy.reads() >= base + 3).then(|| since.elapsed())
        })
        .await
    }

    /// Break host `i`'s link until [`Self::heal`].
    fn cut(&self, i: usize) {
        self.nets[i].cut();
    }

    /// Mend host `i`'s link: packets first, then what the proxy held.
    fn heal(&self, i: usize) {
        self.nets[i].heal();
        self.proxies[i].set_delay(Duration::ZERO);
        self.proxies[i].release();
    }

    /// While host `i`'s link is down: `/readyz` says 503 on it (how soon) and 200 on the other.
    async fn not_ready_while_cut(&self, i: usize) -> Duration {
        let took = self.wait_ready(i, 503, NOT_READY_WITHIN).await;
        // The other host's link is fine: it says ready (waited for, as a busy machine may
        // answer one probe late).
        self.wait_ready(1 - i, 200, NOT_READY_WITHIN).await;
        took
    }

    /// Hold until `until`, checking that host `i` stays not ready while its link is down.
    async fn stay_cut(&self, i: usize, until: Instant) {
        wait_for(CUT * 2, "the end of the cut", || async {
            let status = self.readyz(i).await;
            assert_ne!(
                status,
                Some(200),
                "host {} said ready while its link was down",
                consumer(i)
            );
            (Instant::now() >= until).then_some(())
        })
        .await;
    }

    /// Cut host `i`'s link for [`CUT`], checking `/readyz` all through, run `during` while it
    /// is cut, then heal it: how soon `/readyz` said 503, what `during` gave, and how soon after
    /// the link returned the host read again.
    async fn cut_for<T>(
        &self,
        i: usize,
        during: impl Future<Output = T>,
    ) -> (Duration, T, Duration) {
        let cut_at = Instant::now();
        self.cut(i);
        let not_ready = self.not_ready_while_cut(i).await;
        let seen = during.await;
        self.stay_cut(i, cut_at + CUT).await;
        let healed = Instant::now();
        self.heal(i);
        let again = self.reads_again(i, healed).await;
        (not_ready, seen, again)
    }

    /// Wait for the end of the load and check every entry's outcome; print the figures.
    async fn finish(self, label: &str, figures: &str) {
        settled_once(&self.conn, self.stream, &self.ids, label, figures).await;
        // Both hosts are still alive and ready.
        for i in 0..2 {
            self.wait_ready(i, 200, READS_AGAIN_WITHIN).await;
        }
        drop(self.hosts);
        drop(self.redis);
    }
}

/// How many dead letters `stream`'s group has.
async fn dead_letters(conn: &MultiplexedConnection, stream: &str) -> usize {
    let mut conn = conn.clone();
    cmd(&mut conn, &["XLEN", &dead_letter_key(stream)]).await
}

/// Add `ENTRIES` entries that trap on every attempt; their ids.
async fn trapping_load(conn: &mut MultiplexedConnection, stream: &str) -> Vec<String> {
    let mut pipe = redis::pipe();
    for _ in 0..ENTRIES {
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(Control::Trap.to_string());
    }
    pipe.query_async(conn).await.unwrap()
}

/// Wait until every entry of `ids` is dead-lettered and nothing is pending or parked, then check
/// that each was dead-lettered exactly once; print the figures.
async fn settled_once(
    conn: &MultiplexedConnection,
    stream: &str,
    ids: &[String],
    label: &str,
    figures: &str,
) {
    let out = wait_all_dead_lettered(conn, stream, ids, Duration::from_secs(240)).await;
    println!(
        "network: {label}: {} entries, {} dead-lettered once, {} twice, {} lost, {} attempts repeated (at-least-once); {figures}",
        ids.len(),
        out.settled,
        out.twice,
        out.lost,
        out.repeated
    );
    assert_eq!(out.lost, 0, "{label}: entries lost");
    assert_eq!(out.twice, 0, "{label}: entries dead-lettered twice");
    assert_eq!(out.foreign, 0, "{label}: dead letters of no entry");
    assert_eq!(out.dead, ids.len(), "{label}: dead letters");
}

/// Run one fault against host a (or the lease holder) under the load, then check the outcome.
async fn scenario(stream: &'static str, fault: Fault) {
    if let Some(why) = Netns::unavailable() {
        // CI (SLUICE_CI=1) runs as root: there, a skip would hide a broken machine.
        assert!(
            std::env::var_os("SLUICE_CI").is_none(),
            "network: cannot run: {why}"
        );
        println!("network: skipped: {why}");
        return;
    }
    let retention = matches!(fault, Fault::LeaseHolder);
    let mut pair = Pair::start(stream, retention).await;
    let mut victim = 0;
    pair.load().await;
    let figures = match fault {
        Fault::Cut => {
            pair.under_way().await;
            let (not_ready, (), again) = pair.cut_for(victim, async {}).await;
            let ready = pair.wait_ready(victim, 200, READS_AGAIN_WITHIN).await;
            format!(
                "cut 10 s: /readyz 503 after {} ms; read again {} ms and ready {} ms after the link returned",
                not_ready.as_millis(),
                again.as_millis(),
                ready.as_millis()
            )
        }
        Fault::SlowAndLossy => {
            pair.under_way().await;
            let before = pair.dead_letters().await;
            let start = Instant::now();
            pair.proxies[victim].set_delay(Duration::from_millis(100));
            pair.nets[victim].lose(0.05);
            wait_for(
                Duration::from_secs(40),
                "the end of the slow spell",
                || async { (start.elapsed() >= Duration::from_secs(20)).then_some(()) },
            )
            .await;
            let during = pair.dead_letters().await - before;
            let healed = Instant::now();
            pair.heal(victim);
            let again = pair.reads_again(victim, healed).await;
            format!(
                "200 ms + 5 % loss for 20 s: {during} dead letters written meanwhile; host a read again {} ms after",
                again.as_millis()
            )
        }
        Fault::LeaseHolder => {
            pair.under_way().await;
            let lease = sluice_host::store::keys::retention_lease_key(stream);
            let mut conn = pair.conn.clone();
            let holder: String = wait_for(Duration::from_secs(60), "a lease holder", || {
                let mut conn = conn.clone();
                let lease = lease.clone();
                async move { cmd::<Option<String>>(&mut conn, &["GET", &lease]).await }
            })
            .await;
            victim = (0..2)
                .find(|i| holder.contains(consumer(*i)))
                .unwrap_or_else(|| panic!("the lease holder `{holder}` is neither host"));
            let other = consumer(1 - victim);
            let cut_at = Instant::now();
            let taken = wait_for(CUT, "the other host taking the lease", || {
                let mut conn = conn.clone();
                let lease = lease.clone();
                async move {
                    let now: Option<String> = cmd(&mut conn, &["GET", &lease]).await;
                    now.is_some_and(|h| h.contains(other))
                        .then(|| cut_at.elapsed())
                }
            });
            let (not_ready, taken, again) = pair.cut_for(victim, taken).await;
            let trimmed: u64 = cmd(&mut conn, &["XLEN", stream]).await;
            format!(
                "lease holder {} cut 10 s: /readyz 503 after {} ms; {other} held the lease {} ms after the cut; read again {} ms after the link returned; stream length {trimmed}",
                consumer(victim),
                not_ready.as_millis(),
                taken.as_millis(),
                again.as_millis()
            )
        }
        Fault::MidCall { what, sha } => {
            // Armed once the load is under way: the script is loaded by then, so the call
            // that stops the link runs in Redis (a first EVALSHA would only get NOSCRIPT).
            pair.under_way().await;
            pair.proxies[victim].arm(sha.as_bytes());
            tokio::time::timeout(Duration::from_secs(120), pair.proxies[victim].tripped())
                .await
                .unwrap_or_else(|_| panic!("host a made no {what} call"));
            let (not_ready, (), again) = pair.cut_for(victim, async {}).await;
            format!(
                "cut 10 s in the middle of a {what}: /readyz 503 after {} ms; read again {} ms after the link returned",
                not_ready.as_millis(),
                again.as_millis()
            )
        }
    };
    pair.finish(stream, &figures).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_for_ten_seconds_loses_nothing_and_the_host_reads_again() {
    scenario("net-cut", Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_lossy_link_loses_nothing() {
    scenario("net-slow", Fault::SlowAndLossy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_the_retention_lease_holder_moves_the_lease_and_loses_nothing() {
    scenario("net-lease", Fault::LeaseHolder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_in_the_middle_of_a_sweep_pass_moves_each_retry_once() {
    let sha = sluice_host::pipeline::delayed::sweep_script_sha().to_owned();
    scenario(
        "net-sweep",
        Fault::MidCall {
            what: "sweep pass",
            sha,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_in_the_middle_of_a_dead_letter_write_writes_it_once() {
    let sha = sluice_host::dead_letter_script_sha().to_owned();
    scenario(
        "net-dead",
        Fault::MidCall {
            what: "dead-letter write",
            sha,
        },
    )
    .await;
}

/// Redis at `maxmemory` (noeviction) while a host parks and dead-letters: every park and dead
/// letter is one script that also acknowledges, so Redis refuses it whole; nothing is
/// acknowledged that was not written, and everything resumes when memory frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_refuses_settles_whole_and_resumes() {
    let stream = "net-oom";
    let redis = Redis::start_with(false, &[("maxmemory-policy", "noeviction")]);
    let mut conn = redis.conn().await;
    let sub = Sub::fixture(stream)
        .set("max_retries", 2)
        .set(
            "failure_backoff",
            Raw(r#"{ initial = "200ms", max = "400ms" }"#),
        )
        .delayed(&format!("{stream}.delayed"));
    let host = HostProcess::run(&redis, TestConfig::of(sub).set("shutdown_timeout", "1s"));
    let ids = trapping_load(&mut conn, stream).await;
    wait_for(Duration::from_secs(120), "the load under way", || async {
        (dead_letters(&conn, stream).await >= ENTRIES / 10).then_some(())
    })
    .await;
    // Full: every command that may grow memory is refused from here on.
    let _: () = cmd(&mut conn, &["CONFIG", "SET", "maxmemory", "1"]).await;
    let at_limit = dead_letters(&conn, stream).await;
    let before = Instant::now();
    // The host meets the limit: its settles fail and say why.
    wait_for(
        Duration::from_secs(60),
        "the host logging Redis's OOM refusal",
        || {
            let text = host.log_text();
            async move { text.contains("OOM").then_some(()) }
        },
    )
    .await;
    // While full, no dead letter is written and what is not settled stays pending or parked.
    wait_for(
        Duration::from_secs(30),
        "five seconds at the limit",
        || async { (before.elapsed() >= Duration::from_secs(5)).then_some(()) },
    )
    .await;
    let during = dead_letters(&conn, stream).await - at_limit;
    assert_eq!(during, 0, "dead letters written while Redis was full");
    let waiting = pending(&mut conn, stream, GROUP).await
        + pending(
            &mut conn,
            &sluice_host::store::keys::lane_key(&format!("{stream}.delayed")),
            GROUP,
        )
        .await
        + parked(&mut conn, &format!("{stream}.delayed")).await;
    let unread = sluice_host::store::inspect::group(&mut conn, stream, GROUP)
        .await
        .unwrap()
        .and_then(|g| g.lag)
        .unwrap_or(0) as u64;
    assert!(
        waiting + unread > 0,
        "Redis full, yet nothing pending, parked or unread"
    );
    // Memory frees: everything resumes.
    let _: () = cmd(&mut conn, &["CONFIG", "SET", "maxmemory", "0"]).await;
    let freed = Instant::now();
    settled_once(
        &conn,
        stream,
        &ids,
        "out of memory",
        &format!(
            "at the limit for {} ms: {at_limit} dead letters before, {during} during",
            before.elapsed().as_millis(),
        ),
    )
    .await;
    println!(
        "network: out of memory: settled {} ms after memory freed",
        freed.elapsed().as_millis()
    );
    drop(host);
}

/// A host running `sub`, reaching `redis` through a [`LinkProxy`] on loopback (which the test
/// can freeze or slow).
async fn behind_a_proxy(redis: &Redis, sub: Sub) -> (LinkProxy, TestHost) {
    let upstream: SocketAddr = format!("127.0.0.1:{}", redis.server.port())
        .parse()
        .unwrap();
    let proxy = LinkProxy::start("127.0.0.1", upstream).await;
    let host = TestHost::start_at(&proxy.url(), &TestConfig::of(sub).to_string()).await;
    (proxy, host)
}

/// A connection whose peer vanished without a reset (half-open: nothing passes, nothing
/// closes) must not strand a host: the blocking read reconnects by itself, and the shared
/// connection, where acks and scripts go, is replaced once a command on it times out. Before,
/// the host read on and on while every ack waited on the dead connection (found by an attack:
/// 190 entries pending after 5 minutes, `/healthz` still 200). Needs no root: the host's link
/// is a relay in this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_is_replaced_and_nothing_is_stranded() {
    let redis = Redis::start();
    let conn = redis.conn().await;
    let (proxy, host) = behind_a_proxy(&redis, Sub::fixture("half-open")).await;
    let first = add(&mut conn.clone(), "half-open", &Control::Ack).await;
    wait_acked(&conn, "half-open", GROUP, &first).await;

    proxy.freeze_existing();
    let mut last = first;
    for _ in 0..20 {
        last = add(&mut conn.clone(), "half-open", &Control::Ack).await;
    }
    // Every entry added after the freeze.
    wait_acked_within(&conn, "half-open", GROUP, &last, Duration::from_secs(120)).await;
    host.stop().await.unwrap();
}

/// A 60 MB entry over a slow link (8 MB/s: longer than a read's block plus its 5 s command
/// timeout): the read goes on while the reply keeps coming, cuts the value as it arrives, and
/// the entry is dead-lettered unhandled; the entry behind it is handled (found by the attack
/// review of issue 52: before, each read was cut off after block + 5 s and made again, for
/// ever, the entry's delivery count climbing, nothing behind it read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_over_a_slow_link_is_read_to_its_end_and_dead_lettered() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let (proxy, host) = behind_a_proxy(&redis, Sub::fixture("slow").set("block", "1s")).await;
    let first = add(&mut conn, "slow", &Control::Ack).await;
    wait_acked(&conn, "slow", GROUP, &first).await;
    proxy.set_rate(8 << 20);
    let big: String = memory::add_blob(&mut conn, "slow", 60 << 20).await;
    let after = add(&mut conn, "slow", &Control::Ack).await;
    // The entry behind the big one.
    wait_acked_within(&conn, "slow", GROUP, &after, Duration::from_secs(90)).await;
    let letters = memory::letter_summaries(&mut conn, "slow").await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].origin, big);
    assert!(
        letters[0].reason.contains("over max_entry_bytes"),
        "{letters:?}"
    );
    host.stop().await.unwrap();
}

/// A SIGTERM while Redis does not answer yet (a pod stopped during start-up) stops the host at
/// once, exit 0: nothing was read, so nothing is in flight. Before, the host went on trying to
/// connect for about 35 s, with nothing in its log, and then failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_start_up_ends_it_at_once() {
    // Accepts connections and never answers, as a server behind a dead link does.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let _accepted = std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept() {
            held.push(stream);
        }
    });
    let run = RunDir::at(&url, TestConfig::of(Sub::fixture("start-up")));
    let mut host = run.spawn();
    wait_for(
        Duration::from_secs(60),
        "the host to say it connects",
        || {
            let said = host.log_text().contains("connecting to Redis");
            async move { said.then_some(()) }
        },
    )
    .await;
    host.terminate();
    let status = host.wait_exit().await;
    assert!(status.success(), "{status}: {}", host.log_text());
    assert!(
        host.log_text()
            .contains("stopped before every subscription had started"),
        "{}",
        host.log_text()
    );
}
