//! Consuming a stream as a consumer group: acks, a restarted host re-reading its own pending
//! entries, claiming idle entries, a retry that stays pending (no delayed set), failure backoff
//! and dead letters, a group or stream deleted underneath, a consumer that is gone, and a read
//! that keeps failing.

use std::time::{Duration, Instant};

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_removes_the_entry_from_the_pending_list() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("acks")).await;
    let id = add(&mut conn, "acks", &Control::Ack).await;
    let event = host.event(T, "the ack", |e| e.id == id).await;
    assert_eq!(event.kind, EventKind::Acked);
    assert_eq!((event.retry_count, event.delivery_count), (0, 1));
    assert_eq!(pending(&mut conn, "acks", "g").await, 0);
    host.stop().await.expect("clean stop");
}

/// A read's deliveries share a task when the handler is light; one that spins must still not
/// hold up the others read with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_handler_does_not_hold_up_the_entries_read_with_it() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("together")
            .set("count", 32)
            .set("max_in_flight", 32)
            .set("handler_timeout", "20s"),
    )
    .await;
    // Quick deliveries first, until the host knows its handler as light (a moving average;
    // the first calls instantiate) and runs a read's deliveries together.
    let mut last = String::new();
    for _ in 0..200 {
        last = add(&mut conn, "together", &Control::Ack).await;
    }
    wait_acked(&conn, "together", "g", &last).await;
    // Added in one transaction: the waiting read gets them all, the spinning one first.
    let mut adds = redis::pipe();
    adds.atomic();
    for control in std::iter::once(Control::Slow { ms: 5_000 }).chain(vec![Control::Ack; 20]) {
        adds.cmd("XADD")
            .arg("together")
            .arg("*")
            .arg("payload")
            .arg(control.to_string());
    }
    let ids: Vec<String> = adds.query_async(&mut conn).await.unwrap();
    let slow = ids[0].clone();
    let mut quick: std::collections::HashSet<String> = ids[1..].iter().cloned().collect();
    while !quick.is_empty() {
        let event = host
            .event(T, "the quick entries' acks", |e| {
                e.id == slow || quick.contains(&e.id)
            })
            .await;
        assert_ne!(
            event.id, slow,
            "the spinning entry ended before the quick ones"
        );
        assert_eq!(event.kind, EventKind::Acked);
        quick.remove(&event.id);
    }
    assert_eq!(
        pending(&mut conn, "together", "g").await,
        1,
        "only the spinning entry is left"
    );
    let event = host.event(T, "the spinning entry", |e| e.id == slow).await;
    assert_eq!(event.kind, EventKind::Acked);
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_pending_entries_are_re_read_after_a_restart() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = TestConfig::of(Sub::fixture("restart")).to_string();
    let mut first = TestHost::start(&redis, &config).await;
    // Retries after a minute: still pending when the host stops.
    let id = add(
        &mut conn,
        "restart",
        &Control::Retry {
            ms: 60000,
            times: 1,
        },
    )
    .await;
    let event = first.event(T, "the retry", |e| e.id == id).await;
    assert!(
        matches!(event.kind, EventKind::RetryPending { .. }),
        "{event:?}"
    );
    first.stop().await.expect("clean stop");
    assert_eq!(
        pending(&mut conn, "restart", "g").await,
        1,
        "the retry stays pending"
    );

    let mut second = TestHost::start(&redis, &config).await;
    let event = second.event(T, "the re-read", |e| e.id == id).await;
    assert_eq!(event.kind, EventKind::Acked);
    assert_eq!(event.delivery_count, 2, "Redis counted the second delivery");
    wait_for(T, "an empty pending list", || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, "restart", "g").await == 0).then_some(()) }
    })
    .await;
    second.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xautoclaim_takes_an_idle_entry_from_a_dead_consumer() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "claims", "g", "$").await;
    let id = add(&mut conn, "claims", &Control::Ack).await;
    // A consumer reads the entry and dies without settling it.
    read_as(&mut conn, "dead", "claims", ">").await;
    let started = Instant::now();
    let mut host = start_fixture(
        &redis,
        Sub::fixture("claims")
            .set("claim_min_idle", "300ms")
            .set("handler_timeout", "200ms"),
    )
    .await;
    let event = host.event(T, "the claimed entry", |e| e.id == id).await;
    assert_eq!(event.kind, EventKind::Acked);
    assert_eq!(event.delivery_count, 2);
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "claimed only once idle"
    );
    assert_eq!(pending(&mut conn, "claims", "g").await, 0);
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_without_a_set_redelivers_after_the_delay() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("pending-retry")).await;
    let id = add(
        &mut conn,
        "pending-retry",
        &Control::Retry { ms: 400, times: 1 },
    )
    .await;
    let first = host.event(T, "the retry", |e| e.id == id).await;
    let retried_at = Instant::now();
    assert_eq!(
        first.kind,
        EventKind::RetryPending {
            delay: Duration::from_millis(400),
            cause: "handler asked to retry after 400ms".into()
        }
    );
    assert_eq!(pending(&mut conn, "pending-retry", "g").await, 1);
    let second = host.event(T, "the redelivery", |e| e.id == id).await;
    assert_eq!(second.kind, EventKind::Acked);
    assert_eq!(second.delivery_count, 2);
    assert!(
        retried_at.elapsed() >= Duration::from_millis(390),
        "not before the delay"
    );
    let mut keys: Vec<String> = cmd(&mut conn, &["KEYS", "*"]).await;
    keys.sort();
    assert_eq!(
        keys,
        [
            "pending-retry",
            "sluice-claim:pending-retry",
            "sluice-claim:pending-retry.g.dead-letter"
        ],
        "no delayed set without the descriptor (only the claim of its dead-letter stream)"
    );
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_subscription_rounds_a_pending_retry_up_to_min_idle() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("claim-retry")
            .set("claim_min_idle", "1500ms")
            .set("handler_timeout", "1s"),
    )
    .await;
    let id = add(
        &mut conn,
        "claim-retry",
        &Control::Retry { ms: 100, times: 1 },
    )
    .await;
    host.event(T, "the retry", |e| e.id == id).await;
    let retried_at = Instant::now();
    let second = host.event(T, "the redelivery", |e| e.id == id).await;
    assert_eq!(second.kind, EventKind::Acked);
    assert!(
        retried_at.elapsed() >= Duration::from_millis(1400),
        "a 100ms retry came back after {:?}, before min_idle",
        retried_at.elapsed()
    );
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_guest_is_retried_with_backoff_then_dead_lettered() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("traps").set("max_retries", 2).set(
            "failure_backoff",
            Raw(r#"{ initial = "200ms", max = "1s" }"#),
        ),
    )
    .await;
    let poison = add(&mut conn, "traps", &Control::Trap).await;
    let first = host.event(T, "the first failure", |e| e.id == poison).await;
    let failed_at = Instant::now();
    let EventKind::RetryPending { delay, cause } = &first.kind else {
        panic!("{first:?}");
    };
    assert_eq!(*delay, Duration::from_millis(200));
    assert!(cause.contains("fixture trap on attempt 1"), "{cause}");
    // The host keeps serving other entries while the poison entry waits.
    let healthy = add(&mut conn, "traps", &Control::Ack).await;
    host.event(T, "the healthy entry", |e| {
        e.id == healthy && e.kind == EventKind::Acked
    })
    .await;
    let second = host
        .event(T, "the second failure", |e| e.id == poison)
        .await;
    assert!(
        matches!(&second.kind, EventKind::RetryPending { delay, .. } if *delay == Duration::from_millis(400)),
        "backoff doubles: {second:?}"
    );
    let last = host.event(T, "the dead letter", |e| e.id == poison).await;
    assert!(
        failed_at.elapsed() >= Duration::from_millis(550),
        "waited for both backoffs"
    );
    let EventKind::DeadLettered { reason } = &last.kind else {
        panic!("{last:?}");
    };
    assert!(
        reason.contains("max_retries (2) exhausted after 3 attempts"),
        "{reason}"
    );
    assert!(reason.contains("fixture trap on attempt 3"), "{reason}");
    let dead = dead_lettered(&mut conn, "traps").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(field(&dead[0].1, "sluice-delivery-count"), Some("3"));
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_retries_sends_a_retrying_entry_to_the_dead_letter_stream() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("max")
            .set("max_retries", 1)
            .set("dead_letter", "max.failed"),
    )
    .await;
    let id = add(&mut conn, "max", &Control::Retry { ms: 50, times: 99 }).await;
    let event = host
        .event(T, "the dead letter", |e| {
            e.id == id && matches!(e.kind, EventKind::DeadLettered { .. })
        })
        .await;
    let EventKind::DeadLettered { reason } = event.kind else {
        unreachable!()
    };
    assert!(reason.contains("max_retries (1)"), "{reason}");
    assert!(reason.contains("retry after 50ms"), "{reason}");
    assert_eq!(entries(&mut conn, "max.failed").await.len(), 1);
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_sees_its_config_values_and_the_delivery() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("report").value("region", "eu-west")).await;
    let id = add(
        &mut conn,
        "report",
        &Control::Report {
            key: "region".into(),
        },
    )
    .await;
    let event = host.event(T, "the report", |e| e.id == id).await;
    let EventKind::DeadLettered { reason } = event.kind else {
        panic!("{event:?}");
    };
    assert_eq!(
        reason,
        format!(
            "stream=report group=g retry_count=0 delivery_count=1 origin={id} config=eu-west field_count=1 last_field=payload fields=payload"
        )
    );
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_and_group_are_created_again() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("gone").set("max_retries", 0)).await;
    let first = add(&mut conn, "gone", &Control::Ack).await;
    host.event(T, "the first ack", |e| e.id == first).await;
    let _: () = cmd(&mut conn, &["DEL", "gone"]).await;
    let second = add(&mut conn, "gone", &Control::Ack).await;
    host.event(T, "an entry on the new stream", |e| e.id == second)
        .await;
    host.stop().await.unwrap();
}

/// A host that comes back under a new consumer name (a new pod name on every deploy) takes over
/// what its predecessor left pending, and `sluice status` shows the predecessor as gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_entries_of_a_gone_consumer_are_taken_over() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "pods", "g", "0").await;
    let id = add(&mut conn, "pods", &Control::Ack).await;
    // The old pod reads the entry and is never seen again.
    read_as(&mut conn, "old-pod", "pods", ">").await;
    let toml = TestConfig::of(
        Sub::fixture("pods")
            .set("max_retries", 0)
            .set("consumer", "new-pod")
            .set("consumer_gone_after", "1s"),
    )
    .to_string();
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", &toml);
    let url = redis.url();
    let status = wait_for(T, "status to call old-pod gone", || {
        let (path, url, cwd) = (path.clone(), url.clone(), dir.path().to_owned());
        async move {
            let (ok, out, err) = tokio::task::spawn_blocking(move || {
                run_sluice(
                    &["status", path.to_str().unwrap(), "--json", "--redis", &url],
                    &cwd,
                )
            })
            .await
            .unwrap();
            assert!(ok, "{err}");
            out.contains(r#""name":"old-pod","pending":1"#)
                .then_some(out)
                .filter(|out| out.contains(r#""gone":true"#))
        }
    })
    .await;
    assert!(status.contains("old-pod"), "{status}");
    let mut host = TestHost::start(&redis, &toml).await;
    let event = host.event(T, "the stranded entry", |e| e.id == id).await;
    assert_eq!(event.kind, sluice_host::EventKind::Acked);
    assert_eq!(event.delivery_count, 2, "claimed from the old pod");
    assert_eq!(pending(&mut conn, "pods", "g").await, 0);
    // Holding nothing now, the old pod is deleted from the group: consumers named after pods
    // would otherwise pile up with every deploy (found by an attack).
    wait_for(T, "old-pod deleted from the group", || {
        let mut conn = conn.clone();
        async move {
            let consumers = sluice_host::store::inspect::consumers(&mut conn, "pods", "g")
                .await
                .unwrap();
            (!consumers.iter().any(|c| c.name == "old-pod")).then_some(())
        }
    })
    .await;
    host.stop().await.unwrap();
}

/// The script that deletes gone consumers never deletes one that holds an entry (XGROUP
/// DELCONSUMER would drop the entry from the group) nor one idle for less than asked: both are
/// checked in the same step as the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forget_script_deletes_only_idle_consumers_that_hold_nothing() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "forget", "g", "0").await;
    add(&mut conn, "forget", &Control::Ack).await;
    read_as(&mut conn, "holder", "forget", ">").await;
    let _: i64 = redis::cmd("XGROUP")
        .arg("CREATECONSUMER")
        .arg("forget")
        .arg("g")
        .arg("empty")
        .query_async(&mut conn)
        .await
        .unwrap();
    let script = redis::Script::new(include_str!(
        "../../host/src/pipeline/read/lua/forget_gone.lua"
    ));
    let forget = |name: &'static str, idle_ms: u64| {
        let mut conn = conn.clone();
        let script = script.clone();
        async move {
            let deleted: i64 = script
                .key("forget")
                .arg("g")
                .arg(name)
                .arg(idle_ms)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            deleted
        }
    };
    assert_eq!(forget("holder", 0).await, 0, "a consumer holding an entry");
    assert_eq!(
        forget("empty", 3_600_000).await,
        0,
        "a consumer idle for less"
    );
    assert_eq!(forget("nobody", 0).await, 0, "a consumer that is not there");
    assert_eq!(forget("empty", 0).await, 1);
    let consumers = sluice_host::store::inspect::consumers(&mut conn, "forget", "g")
        .await
        .unwrap();
    let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["holder"]);
    assert_eq!(pending(&mut conn, "forget", "g").await, 1);
}

/// A take-over whose XCLAIM ran in Redis but whose reply was lost (the connection died) left the
/// gone consumer's entries pending to this host, below the newest id it had read, where the
/// re-read after a failed read does not look: the host now looks for exactly those ids after it
/// connects again, and handles each once, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_a_lost_take_over_reply_made_ours_are_handled_without_a_restart() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "lost", "g", "0").await;
    let mut stranded = std::collections::HashSet::new();
    for _ in 0..5 {
        stranded.insert(add(&mut conn, "lost", &Control::Ack).await);
    }
    read_as(&mut conn, "old-pod", "lost", ">").await;
    let mut newer = std::collections::HashSet::new();
    for _ in 0..5 {
        newer.insert(add(&mut conn, "lost", &Control::Ack).await);
    }
    let proxy = CutProxy::start(format!("127.0.0.1:{}", redis.server.port()), b"XCLAIM").await;
    let toml = TestConfig::of(
        Sub::fixture("lost")
            .set("consumer", "new-pod")
            .set("consumer_gone_after", "1s"),
    )
    .to_string();
    let mut host = TestHost::start_at(&proxy.url(), &toml).await;
    let mut acked = std::collections::HashMap::new();
    let deadline = tokio::time::Instant::now() + T;
    let record = |acked: &mut std::collections::HashMap<String, sluice_host::Event>,
                  event: sluice_host::Event| {
        assert_eq!(event.kind, EventKind::Acked, "{event:?}");
        assert!(
            acked.insert(event.id.clone(), event).is_none(),
            "an entry was acked twice"
        );
    };
    while !newer.iter().all(|id| acked.contains_key(id)) {
        let event = tokio::time::timeout_at(deadline, host.events.recv())
            .await
            .expect("the newer entries acked")
            .expect("events");
        record(&mut acked, event);
    }
    // The old pod shows signs of life now (which resets its idle time and its entries'), so
    // the take-over comes at least `consumer_gone_after` after the host read the newer ones.
    read_as(&mut conn, "old-pod", "lost", "0").await;
    while !stranded.iter().all(|id| acked.contains_key(id)) {
        let event = tokio::time::timeout_at(deadline, host.events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "stranded entries stayed pending after the lost take-over reply (cut: {})",
                    proxy.has_cut()
                )
            })
            .expect("events");
        record(&mut acked, event);
    }
    assert!(proxy.has_cut(), "the take-over's reply was never cut");
    for id in &stranded {
        assert!(acked[id].delivery_count >= 2, "{:?}", acked[id]);
    }
    assert_eq!(acked.len(), 10);
    assert_eq!(pending(&mut conn, "lost", "g").await, 0);
    host.stop().await.unwrap();
}

/// A read reply no Redis sends (an empty header line, an absurd count): a protocol error, the
/// connection dropped and made again, the entry read again from the pending list and handled.
/// It once panicked the read loop, which then never read again while the host looked ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbled_read_reply_is_an_error_the_read_loop_survives() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let proxy =
        CutProxy::garbling(format!("127.0.0.1:{}", redis.server.port()), b"POISON-7f3a").await;
    let toml = TestConfig::of(Sub::fixture("garbled")).to_string();
    let mut host = TestHost::start_at(&proxy.url(), &toml).await;
    let poisoned: String = redis::cmd("XADD")
        .arg("garbled")
        .arg("*")
        .arg("payload")
        .arg(r#"{"mode":"ack","tag":"POISON-7f3a"}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    let event = host
        .event(T, "the garbled entry, read again", |e| e.id == poisoned)
        .await;
    assert_eq!(event.kind, EventKind::Acked, "{event:?}");
    assert!(proxy.has_cut(), "the reply was never garbled");
    let next = add(&mut conn, "garbled", &Control::Ack).await;
    host.event(T, "the next entry", |e| e.id == next).await;
    assert_eq!(pending(&mut conn, "garbled", "g").await, 0);
    host.stop().await.unwrap();
}

/// A read that fails the same way every time (the stream key replaced by a string) is retried
/// with growing pauses, not every 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_keeps_failing_backs_off() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("spin").set("max_retries", 0)),
    );
    let id = add(&mut conn, "spin", &Control::Ack).await;
    wait_acked(&conn, "spin", "g", &id).await;
    let _: () = cmd(&mut conn, &["DEL", "spin"]).await;
    let _: () = cmd(&mut conn, &["SET", "spin", "not a stream"]).await;
    let started = std::time::Instant::now();
    let failures = |log: &str| log.matches("read failed").count();
    // Wait until reads have failed for 3 s; a 50 ms loop would log ~60 lines by then.
    let log = wait_for(T, "3 s of failing reads", || {
        let text = host.log_text();
        async move { (started.elapsed() >= Duration::from_secs(3)).then_some(text) }
    })
    .await;
    let n = failures(&log);
    assert!(
        (1..=10).contains(&n),
        "{n} failed reads logged in 3 s:\n{log}"
    );
    assert!(log.contains("WRONGTYPE"), "the failure is named: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_cut_off_by_killed_connections_lose_nothing() {
    const N: usize = 2000;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut ids = std::collections::HashSet::new();
    for _ in 0..N {
        ids.insert(add(&mut conn, "killed", &Control::Ack).await);
    }
    let sub = Sub::fixture("killed")
        .set("max_in_flight", 16)
        .set("count", 16);
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    // Every 150 acks, Redis drops every client connection but this test's: the host's read
    // connection mid-reply or mid-block, and its shared one.
    let mut acked = std::collections::HashSet::new();
    let (mut events, mut kills) = (0usize, 0u32);
    let deadline = tokio::time::Instant::now() + T;
    while acked.len() < N {
        let event = tokio::time::timeout_at(deadline, host.events.recv())
            .await
            .unwrap_or_else(|_| panic!("stalled with {} of {N} acked", acked.len()))
            .expect("events");
        assert_eq!(event.kind, EventKind::Acked, "{event:?}");
        assert!(ids.contains(&event.id), "an entry never added: {event:?}");
        acked.insert(event.id);
        events += 1;
        if events % 150 == 0 {
            // Once the host has a connection again (the reader's comes back first).
            wait_for(T, "the host to connect again", || {
                let mut conn = conn.clone();
                async move {
                    let clients: String =
                        cmd(&mut conn, &["CLIENT", "LIST", "TYPE", "normal"]).await;
                    (clients.lines().count() >= 2).then_some(())
                }
            })
            .await;
            let killed: u64 = cmd(
                &mut conn,
                &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
            )
            .await;
            assert!(killed > 0, "nothing to kill");
            kills += 1;
        }
    }
    wait_for(T, "an empty pending list", || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, "killed", "g").await == 0).then_some(()) }
    })
    .await;
    assert!(dead_lettered(&mut conn, "killed").await.is_empty());
    println!("{N} entries acked through {kills} kills ({events} ack events)");
    host.stop().await.unwrap();
}

/// The host's connections to the test Redis, and how many of them are blocked in a command
/// (CLIENT LIST, without the test's own connection).
async fn host_clients(conn: &mut redis::aio::MultiplexedConnection) -> (usize, usize) {
    let list: String = cmd(conn, &["CLIENT", "LIST", "TYPE", "normal"]).await;
    let me: i64 = cmd(conn, &["CLIENT", "ID"]).await;
    let others: Vec<&str> = list
        .lines()
        .filter(|l| !l.starts_with(&format!("id={me} ")))
        .collect();
    let blocked = others
        .iter()
        .filter(|l| {
            l.split(' ')
                .any(|w| w.starts_with("flags=") && w.contains('b'))
        })
        .count();
    (others.len(), blocked)
}

/// Wait until each of `entries` (stream, id: ids are unique per stream only) is acked, each
/// once.
async fn each_acked_once(
    host: &mut TestHost,
    mut entries: std::collections::HashSet<(String, String)>,
    what: &str,
) {
    while !entries.is_empty() {
        let event = host
            .event(T, what, |e| {
                entries.contains(&(e.stream.to_string(), e.id.clone()))
            })
            .await;
        assert_eq!(event.kind, EventKind::Acked, "{event:?}");
        entries.remove(&(event.stream.to_string(), event.id));
    }
}

/// Partitions on one Redis node wait for new entries in one blocking read (issue 27: 1,024
/// partitions once opened 1,030 connections). 48 partitions with a 60 s block: the host holds
/// a few connections, one of them blocked; an entry added to an idle partition is handled at
/// once, and so is the next one there (the shared read is cut and made again over the keys of
/// whoever waits, not left to its block time); a retry comes back through its partition's
/// lane; every entry is handled once, in the partition it was added to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_on_one_node_wait_in_one_blocking_read() {
    const PARTITIONS: u32 = 48;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("parts")
            .set("partitions", PARTITIONS as i64)
            .set("block", "60s")
            .delayed("parts.delayed"),
    )
    .await;
    let part = |p: u32| sluice_descriptor::partition_key("parts", "parts", p);
    // Every partition handles entries, several rounds of them.
    let mut added = std::collections::HashSet::new();
    for _ in 0..5 {
        for p in 0..PARTITIONS {
            let id = add(&mut conn, &part(p), &Control::Ack).await;
            added.insert((part(p), id));
        }
    }
    each_acked_once(&mut host, added, "the entries of every partition").await;
    // Idle now: one blocked read for all 48, and a few connections in all once the read
    // pool's connections (what the partitions' own reads took) have closed unused.
    idle_with_few_connections(&mut conn, 1, 4).await;
    // Entries one after another in idle partitions, each handled long before the 60 s block
    // would end the read that was waiting when it came.
    for p in [3, 3, 17, 3, 47] {
        let started = Instant::now();
        let id = add(&mut conn, &part(p), &Control::Ack).await;
        let event = host
            .event(T, "an entry in an idle partition", |e| e.id == id)
            .await;
        assert_eq!(
            (event.kind, &*event.stream),
            (EventKind::Acked, part(p).as_str())
        );
        println!("partition {p}: handled in {:?}", started.elapsed());
    }
    // A retry parks and comes back through its own partition's lane.
    let id = add(&mut conn, &part(9), &Control::Retry { ms: 300, times: 1 }).await;
    let event = host
        .event(T, "the retry's second attempt", |e| {
            e.origin_id == id && e.kind == EventKind::Acked
        })
        .await;
    assert_eq!(event.retry_count, 1, "{event:?}");
    assert_eq!(&*event.stream, part(9), "{event:?}");
    idle_with_few_connections(&mut conn, 1, 4).await;
    for p in 0..PARTITIONS {
        assert_eq!(pending(&mut conn, &part(p), "g").await, 0, "partition {p}");
    }
    host.stop().await.expect("clean stop");
}

/// The partitions of a subscription share one handler, and together may have more deliveries
/// in flight than its share of instance slots (`max_in_flight + 1`): those wait for an
/// instance to come back. They once waited for a slot that idle instances held, and the
/// partitions stalled for good (found by the attack review of issue 27).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_beyond_the_handlers_instances_do_not_stall() {
    const PARTITIONS: u32 = 4;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("busy")
            .set("partitions", PARTITIONS as i64)
            .set("max_in_flight", 4),
    )
    .await;
    let part = |p: u32| sluice_descriptor::partition_key("busy", "busy", p);
    let mut adds = redis::pipe();
    adds.atomic();
    for p in 0..PARTITIONS {
        for _ in 0..8 {
            adds.cmd("XADD")
                .arg(part(p))
                .arg("*")
                .arg("payload")
                .arg(Control::Sleep { ms: 200 }.to_string());
        }
    }
    let ids: Vec<String> = adds.query_async(&mut conn).await.unwrap();
    // Ids are unique per stream only.
    let left: std::collections::HashSet<(String, String)> = ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| (part(i as u32 / 8), id))
        .collect();
    assert_eq!(left.len(), 32);
    each_acked_once(&mut host, left, "every partition's waiting entries").await;
    host.stop().await.expect("clean stop");
}

/// One partition's group destroyed while the partitions wait together: that partition makes
/// it again and reads on; the others wait on, and an entry another partition is handling is
/// not handed out a second time (found by the attack review of issue 27: every partition
/// re-read its pending entries from the start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_group_is_destroyed_does_not_make_the_others_repeat_work() {
    const PARTITIONS: u32 = 4;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("gone")
            .set("partitions", PARTITIONS as i64)
            .set("block", "20s"),
    )
    .await;
    let part = |p: u32| sluice_descriptor::partition_key("gone", "gone", p);
    // Every partition is reading (and then waiting) before the slow entry comes.
    for p in 0..PARTITIONS {
        let id = add(&mut conn, &part(p), &Control::Ack).await;
        host.event(T, "a first entry in each partition", |e| e.id == id)
            .await;
    }
    let slow = add(&mut conn, &part(0), &Control::Sleep { ms: 2_000 }).await;
    wait_for(T, "the slow entry in flight", || {
        let mut conn = conn.clone();
        let key = part(0);
        async move { (pending(&mut conn, &key, "g").await == 1).then_some(()) }
    })
    .await;
    let _: () = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(part(3))
        .arg("g")
        .query_async(&mut conn)
        .await
        .unwrap();
    let event = host
        .event(T, "the slow entry", |e| {
            e.id == slow && *e.stream == part(0)
        })
        .await;
    assert_eq!(
        (event.kind.clone(), event.delivery_count),
        (EventKind::Acked, 1),
        "{event:?}"
    );
    // Partition 3 reads again, in a group made again after what it had read.
    let later = add(&mut conn, &part(3), &Control::Ack).await;
    host.event(T, "an entry in the partition whose group was gone", |e| {
        e.id == later && *e.stream == part(3)
    })
    .await;
    // Nothing else ran the slow entry: every delivery has settled once the host stopped.
    let mut rest = host.events.resubscribe();
    host.stop().await.expect("clean stop");
    while let Ok(event) = rest.try_recv() {
        assert!(
            !(event.id == slow && *event.stream == part(0)),
            "the slow entry was handled twice: {event:?}"
        );
    }
}

/// Wait until the host holds `blocked` blocked reads and `at_most` connections in all: the
/// read pool's connections close once unused for `POOL_IDLE`, within a minute even on a busy
/// machine.
async fn idle_with_few_connections(
    conn: &mut redis::aio::MultiplexedConnection,
    blocked: usize,
    at_most: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    loop {
        poll.tick().await;
        let (clients, seen) = host_clients(conn).await;
        if seen == blocked && clients <= at_most {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waiting for {blocked} blocked reads and at most {at_most} connections: {clients} connections, {seen} blocked"
        );
    }
}

/// A shared read serves at most 64 partitions (its cost grows with its keys each time it is
/// made again): 130 partitions wait in three blocked reads, and an entry in the last one is
/// handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_read_serves_at_most_64_partitions() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("many")
            .set("partitions", 130)
            .set("block", "60s"),
    )
    .await;
    idle_with_few_connections(&mut conn, 3, 6).await;
    let last = sluice_descriptor::partition_key("many", "many", 129);
    let id = add(&mut conn, &last, &Control::Ack).await;
    host.event(T, "an entry in the last partition", |e| e.id == id)
        .await;
    host.stop().await.expect("clean stop");
}

/// A Redis user whose ACL denies CLIENT UNBLOCK (it is `@dangerous`) cannot cut the shared
/// read short: reads then block at most 100 ms, so an entry in an idle partition still waits
/// that long at most, not the whole 60 s block (found by the attack review of issue 27).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_share_a_read_without_the_right_to_cut_it() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let _: () = cmd(
        &mut conn,
        &[
            "ACL",
            "SETUSER",
            "limited",
            "on",
            ">limited-pw",
            "~*",
            "&*",
            "+@all",
            "-@dangerous",
        ],
    )
    .await;
    let url = redis
        .url()
        .replacen("redis://", "redis://limited:limited-pw@", 1);
    let config =
        TestConfig::of(Sub::fixture("acl").set("partitions", 4).set("block", "60s")).to_string();
    let mut host = TestHost::start_at(&url, &config).await;
    let part = |p: u32| sluice_descriptor::partition_key("acl", "acl", p);
    for p in [1, 1, 2, 1] {
        let id = add(&mut conn, &part(p), &Control::Ack).await;
        let event = host
            .event(T, "an entry in an idle partition", |e| e.id == id)
            .await;
        assert_eq!(event.kind, EventKind::Acked);
    }
    host.stop().await.expect("clean stop");
}
