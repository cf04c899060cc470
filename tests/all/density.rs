//! Density: many subscriptions in one host share one instance pool (see
//! `docs/design/density.md`). A busy subscription cannot starve another of instances, idle
//! instances give their slots to whoever needs them, and a pool that cannot be reserved says
//! which key to lower.

use std::collections::HashSet;
use std::time::Duration;

use sluice_fixture_control::Control;
use sluice_host::EventKind;

use crate::common::*;

/// Wait until every `(stream, origin id)` of `ids` is acked (a retry's by its origin), in any
/// order, within `timeout`; every other ack seen meanwhile goes to `other`.
async fn wait_events_acked(
    host: &mut TestHost,
    ids: &[(&str, String)],
    timeout: Duration,
    mut other: impl FnMut(&sluice_host::Event),
) {
    let mut left: HashSet<(String, String)> = ids
        .iter()
        .map(|(stream, id)| ((*stream).to_owned(), id.clone()))
        .collect();
    let deadline = tokio::time::Instant::now() + timeout;
    while !left.is_empty() {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let event = host
            .event(remaining, &format!("{left:?} acked"), |e| {
                e.kind == EventKind::Acked
            })
            .await;
        if !left.remove(&(event.stream.to_string(), event.origin_id.clone())) {
            other(&event);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_instances_give_their_slots_to_a_subscription_that_needs_them() {
    // One slot for the whole host: each subscription's instance, kept warm after its
    // delivery, holds the only slot until the other needs it.
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = TestConfig::of(Sub::fixture("quiet-a"))
        .and(Sub::fixture("quiet-b"))
        .set("max_instances", 1u32);
    let mut host = start_fixture(&redis, config).await;
    // Six turns, each on the other subscription. Without taking the idle instance's slot, the
    // second turn would wait for that instance's 30 s expiry; all six fit well under it.
    let mut ids = Vec::new();
    for turn in 0..6 {
        let stream = if turn % 2 == 0 { "quiet-a" } else { "quiet-b" };
        let id = add(&mut conn, stream, &Control::Ack).await;
        wait_events_acked(
            &mut host,
            &[(stream, id.clone())],
            Duration::from_secs(20),
            |_| {},
        )
        .await;
        ids.push((stream, id));
    }
    for (stream, _) in &ids {
        assert_eq!(pending(&mut conn, stream, "g").await, 0, "{stream}");
    }
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tenant_does_not_starve_another_of_instances() {
    // Four slots for the host; the busy subscription may have 16 deliveries in flight, each
    // spinning 100 ms, and a backlog of 120 (at least 3 s of both cores' time).
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = TestConfig::of(Sub::fixture("busy").set("max_in_flight", 16u32))
        .and(Sub::fixture("calm"))
        .set("max_instances", 4u32);
    let mut host = start_fixture(&redis, config).await;
    let backlog = 120;
    // In one round trip each: the test shares the host's two threads with spinning guests.
    let mut pipe = redis::pipe();
    let slow = serde_json::to_string(&Control::Slow { ms: 100 }).unwrap();
    for _ in 0..backlog {
        pipe.cmd("XADD")
            .arg("busy")
            .arg("*")
            .arg("payload")
            .arg(&slow);
    }
    let _: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
    // The busy one holds every slot and queues for more before the calm one asks.
    host.event(Duration::from_secs(30), "a busy delivery acked", |e| {
        &*e.stream == "busy" && e.kind == EventKind::Acked
    })
    .await;
    let mut pipe = redis::pipe();
    let ack = serde_json::to_string(&Control::Ack).unwrap();
    for _ in 0..10 {
        pipe.cmd("XADD")
            .arg("calm")
            .arg("*")
            .arg("payload")
            .arg(&ack);
    }
    let calm: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
    // Count the busy acks seen until every calm entry is acked.
    let mut busy_acked = 1;
    let calm: Vec<(&str, String)> = calm.into_iter().map(|id| ("calm", id)).collect();
    wait_events_acked(&mut host, &calm, Duration::from_secs(60), |e| {
        if &*e.stream == "busy" {
            busy_acked += 1;
        }
    })
    .await;
    // Slots go in order of request: the calm entries waited behind at most the busy one's
    // requests queued before them (16 in flight), not behind its whole backlog.
    assert!(
        busy_acked < backlog / 2,
        "the calm subscription waited for {busy_acked} of the busy one's {backlog} deliveries"
    );
    assert_eq!(pending(&mut conn, "calm", "g").await, 0);
    host.stop().await.unwrap();
}

/// Subscriptions with a bell read on the Redis's pool of 8 lean connections, one read at a
/// time each: 12 busy ones draining backlogs do not keep a calm one's entry waiting for them,
/// and hold no more than 8 read connections (the host's 4 command handles share one pool:
/// found by an attack, each had its own, and 21 busy subscriptions held 21).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_subscriptions_on_the_read_pool_do_not_starve_a_calm_one() {
    const BUSY: usize = 12;
    const BACKLOG: usize = 500;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut config = TestConfig::of(Sub::fixture("calm")).set("doorbell", "poll");
    for i in 0..BUSY {
        // One entry a read: many reads, at once.
        config = config.and(Sub::fixture(&format!("busy-{i}")).set("count", 1u32));
    }
    let mut host = start_fixture(&redis, config).await;
    let ack = serde_json::to_string(&Control::Ack).unwrap();
    let mut pipe = redis::pipe();
    for i in 0..BUSY {
        for _ in 0..BACKLOG {
            pipe.cmd("XADD")
                .arg(format!("busy-{i}"))
                .arg("*")
                .arg("payload")
                .arg(&ack)
                .ignore();
        }
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    // The busy ones are reading: then the calm one gets an entry.
    host.event(Duration::from_secs(30), "a busy delivery acked", |e| {
        e.stream.starts_with("busy-") && e.kind == EventKind::Acked
    })
    .await;
    let calm = add(&mut conn, "calm", &Control::Ack).await;
    let mut busy_acked = 1;
    wait_events_acked(&mut host, &[("calm", calm)], Duration::from_secs(60), |e| {
        if e.stream.starts_with("busy-") {
            busy_acked += 1;
        }
    })
    .await;
    println!("{busy_acked} busy deliveries acked before the calm one");
    // The connections that read (CLIENT LIST names each one's last command; the pool's stay
    // open 10 s after their last read).
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    let readers = list
        .lines()
        .filter(|l| l.contains(" cmd=xreadgroup "))
        .count();
    assert!(readers <= 8, "{readers} read connections: {list}");
    assert!(
        busy_acked < BUSY * BACKLOG / 2,
        "the calm subscription waited for {busy_acked} of the busy ones' {} deliveries",
        BUSY * BACKLOG
    );
    host.stop().await.unwrap();
}

#[test]
fn a_pool_too_big_to_reserve_names_max_instances() {
    // A process allowed 48 GiB of address space: the default pool of one subscription (34
    // slots of a 4 GiB memory and its guards, twice) does not fit, a pool of 2 does.
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let check = |config: TestConfig| {
        let path = write_config(dir.path(), "sluice.toml", &config.to_string());
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 50331648 && exec \"$0\" check --redis \"$1\" \"$2\"")
            .arg(sluice_bin())
            .arg(redis.url())
            .arg(&path)
            .current_dir(dir.path())
            .output()
            .expect("sluice check runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = check(TestConfig::of(Sub::fixture("big")));
    assert!(!ok, "the default pool fit in 48 GiB: {stderr}");
    assert!(
        stderr.contains("cannot reserve address space for the instance pool: 34 instances")
            && stderr.contains("lower `max_instances`")
            && stderr.contains("ulimit -v"),
        "{stderr}"
    );
    let (ok, stderr) = check(TestConfig::of(Sub::fixture("big")).set("max_instances", 2u32));
    assert!(ok, "a pool of 2 did not fit in 48 GiB: {stderr}");
}

/// Clients connected now, but for the test's own `conn`.
async fn host_clients(conn: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    list.lines().count().saturating_sub(1)
}

/// A host of `n` idle subscriptions (each its own group and delayed set) against a server
/// that publishes keyspace events.
fn many(n: usize) -> TestConfig {
    let mut config = TestConfig::of(
        Sub::fixture("many-0")
            .set("group", "g0")
            .delayed("many-0:delayed"),
    );
    for i in 1..n {
        config = config.and(
            Sub::fixture(&format!("many-{i}"))
                .set("group", format!("g{i}"))
                .delayed(&format!("many-{i}:delayed")),
        );
    }
    config
}

/// Wait until a window of `window` passes in which Redis served no XREADGROUP.
async fn wait_reads_stop(conn: &mut redis::aio::MultiplexedConnection, window: Duration) {
    wait_calls_stop(conn, "xreadgroup", window, Duration::from_secs(60)).await;
}

/// Once `host`'s `n` idle subscriptions are quiet: at most 5 connections (4 for commands, one
/// for the doorbell; the pooled read connections closed), and a new entry on any idle stream is read at once, a retry coming back
/// through its set and lane (which ring too).
async fn idle_and_still_reading(
    host: &mut TestHost,
    conn: &mut redis::aio::MultiplexedConnection,
    n: usize,
) {
    wait_reads_stop(conn, Duration::from_secs(2)).await;
    // The pooled read connections of their first reads close once unused for 10 s.
    wait_for(
        Duration::from_secs(60),
        &format!("at most 5 connections for {n} idle subscriptions (4 for commands, one for the doorbell)"),
        || {
            let mut conn = conn.clone();
            async move { (host_clients(&mut conn).await <= 5).then_some(()) }
        },
    )
    .await;
    let mut ids = Vec::new();
    for i in [3, 17, 0, 23] {
        let stream = format!("many-{i}");
        let id = add(conn, &stream, &Control::Ack).await;
        ids.push((stream, id));
    }
    let retried = add(conn, "many-9", &Control::Retry { ms: 300, times: 1 }).await;
    // Acks come in any order: each is looked for among all of them.
    let mut wanted: Vec<(&str, String)> =
        ids.iter().map(|(s, id)| (s.as_str(), id.clone())).collect();
    wanted.push(("many-9", retried));
    wait_events_acked(host, &wanted, Duration::from_secs(30), |_| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_subscriptions_wait_on_the_doorbell_and_still_read_at_once() {
    let redis = Redis::start_with(true, &[("notify-keyspace-events", "Ktz")]);
    let mut conn = redis.conn().await;
    let n = 24;
    let mut host = start_fixture(&redis, many(n)).await;
    // Every subscription reads once, finds nothing, and goes quiet: no connection of its own,
    // no read while idle (a blocking read each would be 24 connections and 240 reads a
    // second at `block = 100ms`).
    idle_and_still_reading(&mut host, &mut conn, n).await;
    for i in 0..n {
        assert_eq!(
            pending(&mut conn, &format!("many-{i}"), &format!("g{i}")).await,
            0
        );
    }
    // And quiet again.
    wait_reads_stop(&mut conn, Duration::from_secs(2)).await;
    host.stop().await.unwrap();
}

/// With keyspace events, an idle subscription's blind time is bounded: an entry added while
/// events were off for a moment (off and on again between two checks of the setting) and one
/// that came by a RENAME (a generic event, which the recommended flags do not publish) are
/// both read within seconds (before: until an unrelated reconnect, 90-276 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_the_doorbell_did_not_hear_of_are_read_within_seconds() {
    let redis = Redis::start_with(true, &[("notify-keyspace-events", "Ktz")]);
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, many(4)).await;
    wait_reads_stop(&mut conn, Duration::from_secs(2)).await;
    let payload = serde_json::to_string(&Control::Ack).unwrap();
    let (id,): (String,) = redis::pipe()
        .atomic()
        .cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("")
        .ignore()
        .cmd("XADD")
        .arg("many-1")
        .arg("*")
        .arg("payload")
        .arg(&payload)
        .cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Ktz")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    host.event(Duration::from_secs(75), "the entry added unheard", |e| {
        e.id == id && e.kind == EventKind::Acked
    })
    .await;
    let id = add(&mut conn, "many-2-next", &Control::Ack).await;
    let _: () = cmd(&mut conn, &["XGROUP", "CREATE", "many-2-next", "g2", "0"]).await;
    let _: () = cmd(&mut conn, &["RENAME", "many-2-next", "many-2"]).await;
    host.event(
        Duration::from_secs(75),
        "the entry renamed into the stream",
        |e| e.id == id && e.kind == EventKind::Acked,
    )
    .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_doorbell_loses_no_entry() {
    let redis = Redis::start_with(true, &[("notify-keyspace-events", "Ktz")]);
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, many(4)).await;
    wait_reads_stop(&mut conn, Duration::from_secs(2)).await;

    // Its connection killed: an entry added meanwhile is read once the doorbell is back (or
    // by the reads every `block` while it is down).
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    let id = add(&mut conn, "many-2", &Control::Ack).await;
    host.event(
        Duration::from_secs(30),
        "the entry added while the doorbell was lost",
        |e| e.id == id && e.kind == EventKind::Acked,
    )
    .await;

    // Another service turns keyspace events off: nothing rings any more, and the
    // subscriptions read every `block` instead.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("")
        .query_async(&mut conn)
        .await
        .unwrap();
    let id = add(&mut conn, "many-1", &Control::Ack).await;
    host.event(
        Duration::from_secs(60),
        "the entry added with events off",
        |e| e.id == id && e.kind == EventKind::Acked,
    )
    .await;
    // And back on: quiet again, and still reading at once.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Ktz")
        .query_async(&mut conn)
        .await
        .unwrap();
    wait_reads_stop(&mut conn, Duration::from_secs(2)).await;
    let id = add(&mut conn, "many-3", &Control::Ack).await;
    host.event(
        Duration::from_secs(20),
        "the entry added with events back on",
        |e| e.id == id && e.kind == EventKind::Acked,
    )
    .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keyspace_events_the_doorbell_polls_and_idle_subscriptions_still_read_at_once() {
    // The server's default publishes no keyspace events: the doorbell reads the idle streams
    // itself (one blocking XREAD per 500 keys) and looks at the delayed sets every second
    // (`poll`: without it, a host polls only above 100 subscriptions on one Redis).
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let n = 24;
    let mut host = start_fixture(&redis, many(n).set("doorbell", "poll")).await;
    idle_and_still_reading(&mut host, &mut conn, n).await;

    // A park made due by someone else (as `sluice retry-now` does, or another host's park):
    // nothing of this host's is due before it, and the set's look finds it.
    let later = add(
        &mut conn,
        "many-5",
        &Control::Retry {
            ms: 600_000,
            times: 1,
        },
    )
    .await;
    host.event(Duration::from_secs(30), "the retry parked", |e| {
        e.origin_id == later && matches!(e.kind, EventKind::Parked { .. })
    })
    .await;
    let member: Vec<Vec<u8>> = cmd(&mut conn, &["ZRANGE", "many-5:delayed", "0", "0"]).await;
    let _: i64 = redis::cmd("ZADD")
        .arg("many-5:delayed")
        .arg("XX")
        .arg(1)
        .arg(&member[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    wait_events_acked(
        &mut host,
        &[("many-5", later)],
        Duration::from_secs(20),
        |_| {},
    )
    .await;

    // The doorbell's read connection killed: it reads again from where it was, and an entry
    // added meanwhile is read.
    let list: String = cmd(&mut conn, &["CLIENT", "LIST"]).await;
    let reader = list
        .lines()
        .find(|l| l.contains("cmd=xread "))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .expect("the doorbell's XREAD")
        .to_owned();
    let _: redis::Value = cmd(&mut conn, &["CLIENT", "KILL", "ID", &reader]).await;
    let id = add(&mut conn, "many-11", &Control::Ack).await;
    wait_events_acked(
        &mut host,
        &[("many-11", id)],
        Duration::from_secs(30),
        |_| {},
    )
    .await;
    for i in 0..n {
        assert_eq!(
            pending(&mut conn, &format!("many-{i}"), &format!("g{i}")).await,
            0
        );
    }
    host.stop().await.unwrap();
}

/// Wait until a window of `window` passes in which Redis served no `command` (lower case, as
/// INFO commandstats names it).
async fn wait_calls_stop(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
    window: Duration,
    within: Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let before = calls(conn, command).await;
        tokio::time::sleep(window).await;
        let after = calls(conn, command).await;
        if after == before {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {} {command} in the last {window:?}",
            after - before
        );
    }
}

/// Wait until 4 s pass without a look for gone consumers (4 look periods at
/// `consumer_gone_after = "2s"`).
async fn wait_looks_stop(conn: &mut redis::aio::MultiplexedConnection) {
    let (window, within) = (Duration::from_secs(4), Duration::from_secs(90));
    wait_calls_stop(conn, "xinfo|consumers", window, within).await;
}

/// An idle subscription with a bell stops looking for gone consumers once a look found no
/// other consumer (thousands of idle subscriptions each looking every half
/// `consumer_gone_after` were most of an idle host's load on Redis); a write to its stream
/// makes it look again, so an entry another consumer took and left is still taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_subscription_looks_for_gone_consumers_again_only_after_a_write() {
    looks_again_only_after_a_write(false).await;
}

/// The same on a polling doorbell: its rings see every entry added, so they vouch for the
/// looks too (for 5 minutes at most). Before, it could not vouch at all, and 5,000 idle
/// subscriptions each looked every half `consumer_gone_after`: 1,300 commands a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_polling_doorbell_too_an_idle_subscription_looks_again_only_after_a_write() {
    looks_again_only_after_a_write(true).await;
}

async fn looks_again_only_after_a_write(polling: bool) {
    let redis = if polling {
        Redis::start()
    } else {
        Redis::start_with(true, &[("notify-keyspace-events", "Ktz")])
    };
    let mut conn = redis.conn().await;
    // A look every second while it may be needed.
    let mut config = TestConfig::of(
        Sub::fixture("quiet")
            .set("group", "g")
            .set("consumer", "here")
            .set("consumer_gone_after", "2s"),
    );
    if polling {
        config = config.set("doorbell", "poll");
    }
    let mut host = start_fixture(&redis, config).await;
    // Its looks find only itself: then 4 s (4 look periods) pass without one. Before, it
    // looked every second for good.
    wait_looks_stop(&mut conn).await;
    // Another consumer reads an entry and is never seen again: the XADD and that read in one
    // transaction, so this host cannot read the entry first.
    let payload = serde_json::to_string(&Control::Ack).unwrap();
    let (id,): (String,) = redis::pipe()
        .atomic()
        .cmd("XADD")
        .arg("quiet")
        .arg("*")
        .arg("payload")
        .arg(&payload)
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("elsewhere")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg("quiet")
        .arg(">")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    // The write rang: the host looks again, sees `elsewhere` holding it, and takes it over
    // once `elsewhere` has been gone for 2 s.
    let event = host
        .event(
            Duration::from_secs(60),
            "the entry left by a gone consumer",
            |e| e.id == id,
        )
        .await;
    assert_eq!(event.kind, EventKind::Acked);
    assert_eq!(event.delivery_count, 2, "taken over from the gone consumer");
    assert_eq!(pending(&mut conn, "quiet", "g").await, 0);
    // `elsewhere`, holding nothing now, is deleted; then the looks stop again.
    wait_looks_stop(&mut conn).await;
    let consumers = sluice_host::store::inspect::consumers(&mut conn, "quiet", "g")
        .await
        .unwrap();
    assert!(consumers.iter().all(|c| c.name == "here"), "{consumers:?}");
    host.stop().await.unwrap();
}

/// Two hosts of one group on a polling doorbell, idle: an entry rings both, one takes it and
/// dies holding it, and the other takes it over within seconds, however their looks and reads
/// interleaved. Found by an attack: a look that came after the ring but before the other
/// host's read saw no other consumer, and a polling bell does not ring for the consumer that
/// read made, so the survivor stayed quiet for 5 minutes (one race in three). Five rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_polling_doorbell_a_host_that_dies_holding_a_rung_entry_is_taken_over() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = |consumer: &str| {
        TestConfig::of(
            Sub::fixture("race")
                .set("group", "g")
                .set("consumer", consumer)
                .set("consumer_gone_after", "2s"),
        )
        .set("doorbell", "poll")
    };
    let mut hosts: Vec<(String, HostProcess)> = Vec::new();
    for name in ["a-0", "b-0"] {
        let host = HostProcess::run(&redis, config(name));
        host.admin_addr().await;
        hosts.push((name.to_owned(), host));
    }
    for round in 1..=5 {
        // Both idle, and done looking for gone consumers.
        wait_looks_stop(&mut conn).await;
        let id = add(&mut conn, "race", &Control::Slow { ms: 2000 }).await;
        let holder = wait_for(
            Duration::from_secs(30),
            "the entry pending to a host",
            || {
                let mut conn = conn.clone();
                let id = id.clone();
                async move {
                    let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                        .arg("race")
                        .arg("g")
                        .arg("-")
                        .arg("+")
                        .arg(10)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    pending
                        .into_iter()
                        .find(|(pending_id, ..)| *pending_id == id)
                        .map(|(_, consumer, ..)| consumer)
                }
            },
        )
        .await;
        let at = hosts
            .iter()
            .position(|(name, _)| *name == holder)
            .expect("a host of the test holds it");
        let (_, mut dead) = hosts.remove(at);
        dead.kill();
        // Taken over once the dead one has been gone 2 s: well within a minute, not 5.
        wait_for(
            Duration::from_secs(60),
            &format!("round {round}: the entry {holder} held taken over"),
            || {
                let mut conn = conn.clone();
                async move { (pending(&mut conn, "race", "g").await == 0).then_some(()) }
            },
        )
        .await;
        let name = format!("{}-{round}", &holder[..1]);
        let host = HostProcess::run(&redis, config(&name));
        host.admin_addr().await;
        hosts.push((name, host));
    }
}

/// The series of a `/metrics` text (each line that is not a comment), without their values.
fn series_names(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(name, _)| name.to_owned()))
        .collect()
}

/// The value of the series `name` (labels included) in a `/metrics` text.
fn series_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A host of `n` subscriptions with per-subscription metrics off: one entry acked on the first
/// and the last stream, one dead-lettered on the second, the third paused. Its `/metrics`.
async fn summed_metrics(n: usize) -> String {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = many(n).set("metrics_per_subscription", false);
    let mut host = start_fixture(&redis, config).await;
    let admin = host.admin().await;
    let first = add(&mut conn, "many-0", &Control::Ack).await;
    let last = add(&mut conn, &format!("many-{}", n - 1), &Control::Ack).await;
    let dead = add(
        &mut conn,
        "many-1",
        &Control::Dead {
            reason: "no such account".into(),
        },
    )
    .await;
    // Settled in any order: each event is looked for among all three.
    let mut left = HashSet::from([first, last, dead]);
    while !left.is_empty() {
        let event = host
            .event(Duration::from_secs(30), &format!("{left:?} settled"), |e| {
                matches!(e.kind, EventKind::Acked | EventKind::DeadLettered { .. })
            })
            .await;
        left.remove(&event.id);
    }
    let (status, body) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/many-2/g2/pause",
        &[],
        br#"{"by": "test"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Each subscription's own counts are still there, per subscription, in the list.
    let (status, body) = http_get(admin, "/v1/subscriptions?stream=many-0").await;
    assert_eq!(status, 200, "{body}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(rows.len(), 1, "{body}");
    assert_eq!(rows[0]["deliveries"], 1, "{body}");
    let metrics = wait_for(
        Duration::from_secs(20),
        "the pause in the summed gauge",
        || async {
            let (_, metrics) = http_get(admin, "/metrics").await;
            (series_value(&metrics, r#"sluice_paused{stream="",group=""}"#) == Some(1.0))
                .then_some(metrics)
        },
    )
    .await;
    host.stop().await.unwrap();
    metrics
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_summed_per_host_do_not_grow_with_the_subscriptions() {
    let few = summed_metrics(3).await;
    let more = summed_metrics(30).await;
    for metrics in [&few, &more] {
        assert!(
            !metrics.contains("stream=\"many"),
            "a series labelled by subscription: {metrics}"
        );
        // Counters add every subscription's; gauges too (a paused subscription counts one).
        assert_eq!(
            series_value(
                metrics,
                r#"sluice_deliveries_total{stream="",group="",outcome="ack"}"#
            ),
            Some(2.0),
            "{metrics}"
        );
        assert_eq!(
            series_value(
                metrics,
                r#"sluice_deliveries_total{stream="",group="",outcome="dead_letter"}"#
            ),
            Some(1.0),
            "{metrics}"
        );
        assert_eq!(
            series_value(metrics, r#"sluice_dead_letter_entries{stream="",group=""}"#),
            Some(1.0),
            "{metrics}"
        );
    }
    // The same series for 3 subscriptions as for 30.
    let (few, more) = (series_names(&few), series_names(&more));
    assert_eq!(
        few.symmetric_difference(&more).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "series that differ between 3 and 30 subscriptions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_and_the_page_come_a_page_at_a_time_with_what_needs_a_look_first() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, many(30)).await;
    let admin = host.admin().await;
    let list = |query: &'static str| async move {
        let (status, head, body) = http_exchange(
            admin,
            "GET",
            &format!("/v1/subscriptions{query}"),
            &[("Authorization", &format!("Bearer {TEST_TOKEN}"))],
            b"",
        )
        .await;
        assert_eq!(status, 200, "{query}: {body}");
        let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        let streams: Vec<String> = rows
            .iter()
            .map(|r| r["stream"].as_str().unwrap().to_owned())
            .collect();
        let matched: usize = header(&head, "x-total-count").unwrap().parse().unwrap();
        (streams, matched)
    };
    let (streams, matched) = list("?offset=5&limit=10").await;
    assert_eq!(matched, 30);
    assert_eq!(
        streams,
        (5..15).map(|i| format!("many-{i}")).collect::<Vec<_>>()
    );
    let (streams, matched) = list("?q=many-2").await;
    assert_eq!(matched, 11, "many-2 and many-20 to many-29: {streams:?}");
    let (streams, _) = list("?stream=many-2&group=g2").await;
    assert_eq!(streams, ["many-2"]);
    let (streams, matched) = list("?offset=1000000&limit=1000000").await;
    assert_eq!((streams.len(), matched), (0, 30));
    // A query of megabytes is refused before anything is matched against it.
    let long = format!("/v1/subscriptions?q={}", "x".repeat(4096));
    let (status, body) = http_get(admin, &long).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`q` is longer than"), "{body}");

    // The page: 20 cards at a time, a paused subscription first.
    let (status, body) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/many-29/g29/pause",
        &[],
        br#"{"by": "test"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let session = log_in(admin).await;
    let page = wait_for(Duration::from_secs(10), "the pause on the page", || {
        let headers = session.headers();
        async move {
            let (code, _, page) = http_exchange(admin, "GET", "/ui/", &headers, b"").await;
            assert_eq!(code, 200, "{page}");
            page.contains("1</b> with something to see").then_some(page)
        }
    })
    .await;
    let cards: Vec<usize> = page
        .match_indices("Stream <code>many-")
        .map(|(at, _)| at)
        .collect();
    assert_eq!(cards.len(), 20, "{page}");
    assert!(
        page[cards[0]..].starts_with("Stream <code>many-29</code>"),
        "the paused subscription first: {}",
        &page[cards[0]..cards[0] + 60]
    );
    assert!(page.contains("Showing 1–20 of 30"), "{page}");
    assert!(
        page.contains("offset=20"),
        "a link to the next page: {page}"
    );
    let headers = session.headers();
    let (code, _, page) =
        http_exchange(admin, "GET", "/ui/?q=many-1&offset=0", &headers, b"").await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(
        page.matches("Stream <code>many-1").count(),
        11,
        "many-1 and many-10 to many-19"
    );
    assert_eq!(page.matches("Stream <code>many-").count(), 11, "{page}");
    // The paused one is not among them: the count on top is of what the search found.
    assert!(!page.contains("with something to see"), "{page}");
    let _ = &mut conn;
    host.stop().await.unwrap();
}

/// A Redis that stops answering costs the page one probe's timeout, not one per card: every
/// card's probes run together, so all 20 cards say Redis did not answer (one after another,
/// the first cards' timeouts outlasted the freeze and the later cards answered; with 20
/// cards' probes of 1 s each in turn, a Redis gone for good took the page past its request
/// timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_redis_costs_the_page_one_probe_timeout_not_one_per_card() {
    let redis = Redis::start_with(true, &[("enable-debug-command", "yes")]);
    let mut host = start_fixture(&redis, many(20)).await;
    let admin = host.admin().await;
    let session = log_in(admin).await;
    let (code, _, page) = http_exchange(admin, "GET", "/ui/", &session.headers(), b"").await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(page.matches("Stream <code>many-").count(), 20, "{page}");
    // Redis frozen for 10 s (its own connection: the reply comes when it wakes). Both
    // connections are made first: a connection made during the freeze waits it out.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut frozen = client.get_multiplexed_async_connection().await.unwrap();
    let probe = redis.conn().await;
    let freeze = tokio::spawn(async move {
        let _: redis::RedisResult<()> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(10)
            .query_async(&mut frozen)
            .await;
    });
    // The freeze has begun once a PING goes unanswered.
    wait_for(Duration::from_secs(10), "Redis frozen", || {
        let mut probe = probe.clone();
        async move {
            tokio::time::timeout(Duration::from_millis(200), async {
                let _: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut probe).await;
            })
            .await
            .is_err()
            .then_some(())
        }
    })
    .await;
    let (code, _, page) = http_exchange(admin, "GET", "/ui/", &session.headers(), b"").await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(
        page.matches("Redis did not answer within a second").count(),
        20,
        "every card's probe timed out together: {page}"
    );
    freeze.await.unwrap();
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_many_sums_up_and_shows_what_needs_a_look() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = many(30);
    let mut host = start_fixture(&redis, config.clone()).await;
    let dead = add(
        &mut conn,
        "many-7",
        &Control::Dead {
            reason: "closed account".into(),
        },
    )
    .await;
    host.event(Duration::from_secs(30), "the dead letter", |e| {
        e.id == dead && matches!(e.kind, EventKind::DeadLettered { .. })
    })
    .await;
    host.stop().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", &config.to_string());
    let url = redis.url();
    let path = path.to_str().unwrap();
    let (ok, stdout, stderr) = run_sluice(&["status", path, "--redis", &url], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("30 subscription rows: ") && stdout.contains("1 with dead letters"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("\nstream `").count(), 1, "{stdout}");
    assert!(stdout.contains("stream `many-7`, group `g7`"), "{stdout}");
    let (ok, stdout, stderr) = run_sluice(&["status", path, "--redis", &url, "--all"], dir.path());
    assert!(ok, "{stderr}");
    assert_eq!(stdout.matches("\nstream `").count(), 30, "{stdout}");
    let (ok, stdout, stderr) = run_sluice(
        &["status", path, "--redis", &url, "--stream", "many-1"],
        dir.path(),
    );
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("11 subscription rows"), "{stdout}");
    assert_eq!(stdout.matches("\nstream `").count(), 11, "{stdout}");

    // A Redis that takes connections and never answers: the report ends at its deadline and
    // says what it waited for, instead of hanging.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("redis://{}", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let (ok, _, stderr) = run_sluice(
        &["status", path, "--redis", &silent_url, "--timeout", "2s"],
        dir.path(),
    );
    assert!(!ok);
    assert!(
        stderr.contains(&silent.local_addr().unwrap().to_string()),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_component_file_replaced_under_many_subscriptions_swaps_them_all() {
    // Thirty subscriptions run one watched file: replaced, it is read, checked and compiled
    // once, and every subscription serves the new version (16 swapped at a time).
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("handler.wasm");
    std::fs::write(&file, std::fs::read(&guests().fixture).unwrap()).unwrap();
    let n = 30;
    let path = file.display().to_string();
    let mut config = TestConfig::of(Sub::new(&path, "one-0").set("group", "g0"));
    for i in 1..n {
        config = config.and(Sub::new(&path, &format!("one-{i}")).set("group", format!("g{i}")));
    }
    let mut host = start_fixture(&redis, config.set("watch_interval", "100ms")).await;
    let admin = host.admin().await;
    let digests = || async move {
        let (_, body) = http_get(admin, "/v1/subscriptions").await;
        let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        rows.iter()
            .map(|r| r["digest"].as_str().unwrap().to_owned())
            .collect::<HashSet<String>>()
    };
    let before = digests().await;
    assert_eq!(before.len(), 1, "{before:?}");
    let tmp = dir.path().join("handler.wasm.tmp");
    std::fs::write(&tmp, std::fs::read(&guests().fixture_v2).unwrap()).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let after = wait_for(
        Duration::from_secs(60),
        "every subscription swapped",
        || {
            let before = before.clone();
            async move {
                let now = digests().await;
                (now.len() == 1 && now != before).then_some(now)
            }
        },
    )
    .await;
    assert_eq!(after.len(), 1);
    // Each serves the new version.
    for i in [0, 13, 29] {
        let stream = format!("one-{i}");
        let id = add(&mut conn, &stream, &Control::Version).await;
        let event = host
            .event(Duration::from_secs(30), "a version entry", |e| e.id == id)
            .await;
        match event.kind {
            EventKind::DeadLettered { reason } => {
                assert!(reason.starts_with("v2@"), "{stream}: {reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_written_without_its_epoch_bump_is_still_seen() {
    // A writer that died between its write to a flow hash and its epoch bump: no host is told,
    // but the rolling re-read reads every flow hash within max(30 s, N/40 s).
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, many(30)).await;
    let admin = host.admin().await;
    let key = sluice_host::store::keys::flow_key("many-3", "g3");
    let _: bool = cmd(
        &mut conn,
        &[
            "HSETNX",
            &key,
            "paused",
            r#"{"by":"a writer that died","at_ms":0}"#,
        ],
    )
    .await;
    wait_for(
        Duration::from_secs(60),
        "the pause seen by the rolling re-read",
        || async move {
            let (_, body) = http_get(admin, "/v1/subscriptions?stream=many-3").await;
            let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
            rows.first()
                .filter(|r| r["paused"]["by"] == "a writer that died")
                .map(|_| ())
        },
    )
    .await;
    let held = add(&mut conn, "many-3", &Control::Ack).await;
    let other = add(&mut conn, "many-4", &Control::Ack).await;
    wait_events_acked(
        &mut host,
        &[("many-4", other)],
        Duration::from_secs(20),
        |e| {
            assert_ne!(e.origin_id, held, "an entry read while paused");
        },
    )
    .await;
    host.stop().await.unwrap();
}

/// Calls of `command` Redis serves while `window` passes (the window is the measure: a rate,
/// not a wait for something to happen).
async fn calls_over(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
    window: Duration,
) -> u64 {
    let before = calls(conn, command).await;
    let until = tokio::time::Instant::now() + window;
    // Redis's own counter over a fixed window: poll it until the window has passed.
    wait_for(
        window + Duration::from_secs(5),
        "the window to pass",
        || async move { (tokio::time::Instant::now() >= until).then_some(()) },
    )
    .await;
    calls(conn, command).await - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_does_not_take_the_polling_doorbell_down() {
    // Found by an attack: one producer's SET on a stream's name failed every read of the
    // doorbell's chunk, the doorbell flapped and every idle subscription read at each flap.
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, many(24).set("doorbell", "poll")).await;
    wait_reads_stop(&mut conn, Duration::from_secs(2)).await;
    let _: i64 = cmd(&mut conn, &["DEL", "many-3"]).await;
    let _: () = cmd(&mut conn, &["SET", "many-3", "oops"]).await;
    // The bad subscription's reads fail and back off; the 23 others stay quiet.
    let reads = calls_over(&mut conn, "xreadgroup", Duration::from_secs(5)).await;
    assert!(
        reads < 60,
        "{reads} XREADGROUP in 5 s from 24 idle subscriptions"
    );
    // The others still read at once.
    let id = add(&mut conn, "many-7", &Control::Ack).await;
    wait_events_acked(
        &mut host,
        &[("many-7", id)],
        Duration::from_secs(20),
        |_| {},
    )
    .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_subscription_on_a_busy_stream_costs_the_polling_doorbell_nothing_per_write() {
    // Found by an attack: a paused reader kept its key wanted, and every write made the
    // doorbell read and run a script.
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        TestConfig::of(Sub::fixture("busy")).set("doorbell", "poll"),
    )
    .await;
    let admin = host.admin().await;
    wait_reads_stop(&mut conn, Duration::from_secs(2)).await;
    let (status, body) =
        http_request(admin, "POST", "/v1/subscriptions/busy/g/pause", &[], b"").await;
    assert_eq!(status, 200, "{body}");
    wait_for(
        Duration::from_secs(10),
        "the host to see the pause",
        || async move {
            let (_, body) = http_get(admin, "/v1/subscriptions?stream=busy").await;
            let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
            rows.first().filter(|r| !r["paused"].is_null()).map(|_| ())
        },
    )
    .await;
    let before = calls(&mut conn, "xread").await;
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(add(&mut conn, "busy", &Control::Ack).await);
    }
    let xreads = calls(&mut conn, "xread").await - before;
    assert!(
        xreads < 30,
        "{xreads} XREAD for 300 writes to a paused subscription's stream"
    );
    // Resumed, it reads them all.
    let (status, body) =
        http_request(admin, "POST", "/v1/subscriptions/busy/g/resume", &[], b"").await;
    assert_eq!(status, 200, "{body}");
    let wanted: Vec<(&str, String)> = held.iter().map(|id| ("busy", id.clone())).collect();
    wait_events_acked(&mut host, &wanted, Duration::from_secs(30), |_| {}).await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_a_redis_that_does_not_answer_and_shows_the_others() {
    // Found by an attack: one silent Redis hid every row, and its connection took 40 s
    // whatever --timeout said.
    let redis = Redis::start();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = TestConfig::of(Sub::fixture("good").set("redis", redis.url()))
        .and(Sub::fixture("bad").set("redis", format!("redis://{}", silent.local_addr().unwrap())));
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", &config.to_string());
    let started = std::time::Instant::now();
    let (ok, stdout, stderr) = run_sluice(
        &["status", path.to_str().unwrap(), "--timeout", "3s"],
        dir.path(),
    );
    assert!(!ok, "{stdout}");
    assert!(
        stdout.contains("stream `good`, group `g`"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("stream `bad`, group `g`: NOT READ: no answer from Redis at"),
        "{stdout}"
    );
    assert!(
        stderr.contains("1 subscription rows could not be read"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// Issue 57: a host whose subscriptions are all idle, on keyspace events, sends Redis nothing
/// but its doorbell's: over 8 s, no read, no flow-state poll or re-read (the flow watcher
/// waits for the change log's ring), at most the doorbell's PINGs, one CONFIG GET and one
/// look for unheard entries. Before, the flow watcher alone sent 4 `GETRANGE` and up to 40
/// scripts a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_on_keyspace_events_sends_only_its_doorbells_commands() {
    let redis = Redis::start_with(true, &[("notify-keyspace-events", "Ktz")]);
    let mut conn = redis.conn().await;
    let mut config = TestConfig::of(
        Sub::fixture("idle-0")
            .set("consumer_gone_after", "2s")
            .delayed("idle-0:delayed"),
    );
    for i in 1..20 {
        config = config.and(
            Sub::fixture(&format!("idle-{i}"))
                .set("group", format!("g{i}"))
                .set("consumer_gone_after", "2s")
                .delayed(&format!("idle-{i}:delayed")),
        );
    }
    let mut host = start_fixture(&redis, config).await;
    host.admin().await;
    wait_looks_stop(&mut conn).await;
    let before = all_calls(&mut conn).await;
    let window = Duration::from_secs(8);
    let started = tokio::time::Instant::now();
    // The measurement's window: nothing is waited for, the host is watched.
    tokio::time::sleep(window).await;
    let after = all_calls(&mut conn).await;
    let seconds = started.elapsed().as_secs_f64();
    let sent: Vec<(String, u64)> = after
        .into_iter()
        .filter_map(|(name, n)| {
            let was = before
                .iter()
                .find(|(b, _)| *b == name)
                .map_or(0, |(_, b)| *b);
            (n > was && name != "info").then_some((name, n - was))
        })
        .collect();
    let of = |name: &str| sent.iter().find(|(n, _)| n == name).map_or(0, |(_, n)| *n);
    println!("idle host, 20 subscriptions, {seconds:.1} s: {sent:?}");
    for polled in [
        "xreadgroup",
        "getrange",
        "hmget",
        "xinfo|consumers",
        "xautoclaim",
        "zrange",
    ] {
        assert_eq!(of(polled), 0, "{polled} while idle: {sent:?}");
    }
    // The doorbell's: a PING every 2 s, a CONFIG GET every 10 s, a look every 30 s.
    assert!(of("ping") <= 6, "{sent:?}");
    assert!(of("evalsha") <= 2, "{sent:?}");
    host.stop().await.unwrap();
}
