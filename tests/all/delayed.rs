//! `DelayedRetry::DurableZset`, one or more tests per sentence of its specification
//! (`shared/seed/DelayedRetry.txt`), and what a hostile handler or a corrupted set can do to
//! it (a delay past `max_delay`, a member too big to put back).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sluice_host::EventKind;
use sluice_host::entry::delivery::{Delivery, Entry};
use sluice_host::entry::member;
use sluice_host::pipeline::delayed::{DelayedSet, SWEEP_BATCH};
use sluice_host::store::keys::SubscriptionKeys;

use crate::common::*;

const T: Duration = Duration::from_secs(20);

/// How late a timer-driven retry may come back in these tests. Typically it is a few
/// milliseconds; the slack absorbs a loaded CI machine. The tests that use it read with
/// BLOCK 5 s, so anything under it proves the timer, not a read, brought the retry back.
const TIMER_SLACK_MS: i64 = 400;

/// The server's clock, epoch ms.
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = cmd(conn, &["TIME"]).await;
    s * 1000 + us / 1000
}

/// The millisecond part of a stream id: the server time at which it was added.
fn id_ms(id: &str) -> i64 {
    id.split('-').next().unwrap().parse().unwrap()
}

async fn add_with_memo(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    payload: &Control,
) -> String {
    cmd(
        conn,
        &[
            "XADD",
            stream,
            "*",
            "payload",
            &payload.to_string(),
            "memo",
            "caf\u{e9}",
        ],
    )
    .await
}

async fn manager(redis: &Redis) -> sluice_host::store::redis_conn::RedisHandle {
    sluice_host::store::redis_conn::RedisHandle::connect(&redis.url(), &Default::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_parks_with_zadd_scored_by_due_time_raises_the_count_and_acks() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("park")
            .set("block", "5s")
            .delayed("park.delayed"),
    )
    .await;
    let before = server_ms(&mut conn).await;
    let id = add_with_memo(
        &mut conn,
        "park",
        &Control::Retry {
            ms: 60000,
            times: 1,
        },
    )
    .await;
    let event = host.event(T, "the park", |e| e.id == id).await;
    let after = server_ms(&mut conn).await;
    let EventKind::Parked { delay, due_ms, .. } = event.kind else {
        panic!("{event:?}");
    };
    assert_eq!(delay, Duration::from_secs(60));
    assert!(
        (before + 60_000..=after + 60_000).contains(&due_ms),
        "score is server time + delay"
    );
    assert_eq!(
        pending(&mut conn, "park", "g").await,
        0,
        "the original is acknowledged"
    );
    let (parked, _) = member::list(&mut conn, "park.delayed").await.unwrap();
    assert_eq!(parked.len(), 1);
    let p = &parked[0];
    assert_eq!(p.origin_id, id);
    assert_eq!(p.retry_count, 1, "raised by one");
    assert_eq!(p.due_ms, due_ms);
    assert_eq!(
        p.fields,
        vec![
            (
                b"payload".to_vec(),
                Control::Retry {
                    ms: 60000,
                    times: 1
                }
                .to_string()
                .into_bytes()
            ),
            (b"memo".to_vec(), "caf\u{e9}".as_bytes().to_vec()),
        ],
        "the member keeps every field to rebuild the entry"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_entries_come_back_under_new_ids_with_the_count_and_on_time() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // BLOCK 5s: only the host's own timer can bring the retry back within milliseconds.
    let mut host = start_fixture(
        &redis,
        Sub::fixture("back")
            .set("block", "5s")
            .delayed("back.delayed"),
    )
    .await;
    let id = add_with_memo(&mut conn, "back", &Control::Retry { ms: 700, times: 2 }).await;
    let first = host.event(T, "the first park", |e| e.id == id).await;
    let EventKind::Parked { due_ms, .. } = first.kind else {
        panic!("{first:?}")
    };
    let second = host.event(T, "the second delivery", |e| e.id != id).await;
    assert_eq!(second.retry_count, 1, "the handler sees retry count 1");
    assert!(
        matches!(second.kind, EventKind::Parked { .. }),
        "{second:?}"
    );
    let lateness = id_ms(&second.id) - due_ms;
    assert!(
        (0..TIMER_SLACK_MS).contains(&lateness),
        "came back {lateness} ms after its due time"
    );
    // The copy waits in the group's lane (until a later sweep trims it, acknowledged).
    let copies = lane_copies(&mut conn, "back.delayed").await;
    let again = copies
        .iter()
        .find(|c| c.id == second.id)
        .expect("the re-added entry in the lane");
    assert_eq!(again.retry_count, 1);
    assert_eq!(again.origin_id, id);
    assert_eq!(field(&again.fields, "memo"), Some("caf\u{e9}"));
    assert!(again.sealed, "bookkeeping is sealed");
    let third = host
        .event(T, "the third delivery", |e| e.id != id && e.id != second.id)
        .await;
    assert_eq!(third.retry_count, 2);
    assert_eq!(third.kind, EventKind::Acked);
    let last = lane_copies(&mut conn, "back.delayed").await;
    let last = last.iter().find(|c| c.id == third.id).unwrap();
    assert_eq!(
        last.origin_id, id,
        "the producer's entry is named through every park"
    );
    assert_eq!(last.retry_count, 2);
    let on_stream = entries(&mut conn, "back").await;
    assert_eq!(on_stream.len(), 1, "nothing was added to the stream");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_payloads_parked_together_stay_two_retries() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("twins")
            .set("block", "5s")
            .delayed("twins.delayed"),
    )
    .await;
    let payload = Control::Retry {
        ms: 60000,
        times: 1,
    };
    let a = add(&mut conn, "twins", &payload).await;
    let b = add(&mut conn, "twins", &payload).await;
    host.event(T, "park a", |e| e.id == a || e.id == b).await;
    host.event(T, "park b", |e| e.id == a || e.id == b).await;
    let card = parked(&mut conn, "twins.delayed").await;
    assert_eq!(card, 2);
    host.stop().await.unwrap();
}

/// Put `n` entries on `stream`, read them as `consumer` and park each with `delay`.
async fn park_directly(redis: &Redis, stream: &str, n: usize, delay: Duration) -> DelayedSet {
    let mut conn = redis.conn().await;
    let keys = SubscriptionKeys::new(
        stream,
        "g",
        &dead_letter_key(stream),
        Some(&format!("{stream}.delayed")),
    );
    let set = delayed_set(redis, &keys).await;
    create_group(&mut conn, stream, "g", "$").await;
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(format!("{{\"n\":{i}}}"));
    }
    let ids: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
    let _: redis::Value = cmd(
        &mut conn,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c",
            "COUNT",
            &n.to_string(),
            "STREAMS",
            stream,
            ">",
        ],
    )
    .await;
    for id in ids {
        let entry = Entry {
            id,
            fields: vec![(b"payload".to_vec(), b"{}".to_vec())],
        };
        let delivery = Delivery::new(stream, "g", (Default::default(), stream), entry, 1, None);
        set.park(&delivery, delay).await.unwrap();
    }
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sweep_pass_moves_at_most_128_entries() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let set = park_directly(&redis, "passes", 300, Duration::ZERO).await;
    let mut moved = Vec::new();
    loop {
        let swept = set.sweep().await.unwrap();
        if swept.moved == 0 {
            break;
        }
        moved.push(swept.moved);
        let len: usize = cmd(&mut conn, &["XLEN", "passes"]).await;
        assert_eq!(len, 300 + moved.iter().sum::<usize>());
    }
    assert_eq!(SWEEP_BATCH, 128);
    assert_eq!(moved, vec![128, 128, 44]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_sweeping_one_set_move_each_entry_exactly_once() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let n = 3000;
    let _first = park_directly(&redis, "race", n, Duration::from_millis(300)).await;
    // Four sweepers on their own connections, as four hosts would be, racing from the due time.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let set = Arc::new(
            DelayedSet::new(
                &SubscriptionKeys::new("race", "g", "race.dead-letter", Some("race.delayed")),
                None,
                test_secret(),
                manager(&redis).await,
                &Default::default(),
            )
            .unwrap(),
        );
        tasks.push(tokio::spawn(async move {
            let mut moved = 0;
            let mut idle_passes = 0;
            while idle_passes < 50 {
                let swept = set.sweep().await.unwrap();
                moved += swept.moved;
                if swept.moved == 0 && swept.next_due_in.is_none() {
                    idle_passes += 1;
                }
            }
            moved
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    assert_eq!(total, n, "every entry moved once in all");
    let all = entries(&mut conn, "race").await;
    let origins: Vec<&str> = all
        .iter()
        .filter_map(|(_, f)| field(f, "sluice-origin-id"))
        .collect();
    let unique: HashSet<&str> = origins.iter().copied().collect();
    assert_eq!(origins.len(), n, "no entry appended twice");
    assert_eq!(unique.len(), n, "no entry lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lateness_is_bounded_by_the_block_interval_when_another_host_parked_the_entry() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let block = 1500;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("bound")
            .set("block", format!("{block}ms"))
            .delayed("bound.delayed"),
    )
    .await;
    // Let the host create its group and block in a read; then another host of the group parks
    // an entry in the set (what its park script leaves there: a member due shortly). This
    // host's timer knows nothing of it: only its sweep-per-read can bring it back.
    let id = add(&mut conn, "bound", &Control::Ack).await;
    host.event(T, "the host is reading", |e| e.id == id).await;
    let due_ms = server_ms(&mut conn).await + 150;
    let fields = vec![(b"payload".to_vec(), b"{\"mode\":\"ack\"}".to_vec())];
    let parked = member::NewMember {
        entry_id: "1-1",
        retry_count: 1,
        fields: &fields,
        origin_id: "1-1",
        stream: "bound",
        group: "g",
    }
    .encode();
    let _: i64 = redis::cmd("ZADD")
        .arg("bound.delayed")
        .arg(due_ms)
        .arg(parked)
        .query_async(&mut conn)
        .await
        .unwrap();
    let back = host
        .event(T, "the swept entry", |e| e.retry_count == 1)
        .await;
    let lateness = id_ms(&back.id) - due_ms;
    // Redis 7.0 ends a blocked read only on its hz tick (100 ms at hz 10).
    assert!(
        (0..=block + 100 + TIMER_SLACK_MS).contains(&lateness),
        "came back {lateness} ms after its due time; the bound is block ({block} ms) plus one hz tick"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_right_after_parking_still_delivers_the_retry_at_its_due_time() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let run = RunDir::new(
        &redis,
        Sub::fixture("crash")
            .set("block", "5s")
            .delayed("crash.delayed"),
    );
    let mut host = run.spawn();
    let id = add(&mut conn, "crash", &Control::Retry { ms: 3000, times: 1 }).await;
    let due_ms: i64 = wait_for(T, "the park", || {
        let mut conn = conn.clone();
        async move {
            let parked: Vec<(Vec<u8>, f64)> = cmd(
                &mut conn,
                &["ZRANGE", "crash.delayed", "0", "-1", "WITHSCORES"],
            )
            .await;
            parked.first().map(|(_, score)| *score as i64)
        }
    })
    .await;
    host.kill();
    assert_eq!(pending(&mut conn, "crash", "g").await, 0);
    let mut restarted = run.spawn();
    let back = wait_lane_copy(&conn, "crash.delayed", &id).await;
    let lateness = id_ms(&back.id) - due_ms;
    assert!(
        (0..TIMER_SLACK_MS).contains(&lateness),
        "came back {lateness} ms after its due time"
    );
    wait_for(T, "the retry to be acked", || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, "crash", "g").await == 0).then_some(()) }
    })
    .await;
    let card = parked(&mut conn, "crash.delayed").await;
    assert_eq!(card, 0);
    restarted.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_with_aof_keeps_the_parked_entries() {
    let mut redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("aof")
            .set("block", "5s")
            .delayed("aof.delayed"),
    )
    .await;
    let id = add(
        &mut conn,
        "aof",
        &Control::Retry {
            ms: 600000,
            times: 1,
        },
    )
    .await;
    host.event(T, "the park", |e| e.id == id).await;
    host.stop().await.unwrap();
    let (before, _) = member::list(&mut conn, "aof.delayed").await.unwrap();
    redis.server.restart().unwrap();
    let mut conn = redis.conn().await;
    let (after, _) = member::list(&mut conn, "aof.delayed").await.unwrap();
    assert_eq!(after, before);
    assert_eq!(after.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_never_expires_a_set_before_its_last_retry_is_due_and_a_longer_delay_is_warned_about() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let host = HostProcess::run(
        &redis,
        Sub::fixture("ttl").set("block", "5s").set(
            "delayed_retry",
            Raw(r#"{ key = "ttl.delayed", ttl = "1500ms" }"#),
        ),
    );
    add(
        &mut conn,
        "ttl",
        &Control::Retry {
            ms: 60000,
            times: 1,
        },
    )
    .await;
    let ttl: i64 = wait_for(T, "the park", || {
        let mut conn = conn.clone();
        async move {
            let ttl: i64 = cmd(&mut conn, &["PTTL", "ttl.delayed"]).await;
            (ttl > 0).then_some(ttl)
        }
    })
    .await;
    assert!(
        (60_000..=61_500).contains(&ttl),
        "the set lives until ttl after its last due time, never less: {ttl}"
    );
    let (_, metrics) = http_get(host.admin_addr().await, "/metrics").await;
    assert!(
        metrics.contains(r#"sluice_retry_over_ttl_total{stream="ttl",group="g"} 1"#),
        "{metrics}"
    );
    let log = host.log_text();
    assert!(
        log.contains("longer than the delayed set's ttl")
            && log.contains("ttl.delayed")
            && log.contains("delay_ms=60000")
            && log.contains("ttl_ms=1500"),
        "{log}"
    );
}

/// The issue's case: ttl 3 s, every host down for 4 s (longer than the ttl counted from the
/// park). The set must still be there when a host comes back, and the retry handled. The
/// retry is due 6 s after its park, so the set lives until 9 s after it: a host that starts
/// slowly on a busy machine still finds it (with a 2 s retry the margin was a second, and a
/// loaded machine missed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_retry_survives_an_outage_of_every_host_longer_than_the_ttl() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = Sub::fixture("outage").set(
        "delayed_retry",
        Raw(r#"{ key = "outage.delayed", ttl = "3s" }"#),
    );
    let mut host = start_fixture(&redis, config.clone()).await;
    let id = add(&mut conn, "outage", &Control::Retry { ms: 6000, times: 1 }).await;
    host.event(T, "the park", |e| e.id == id).await;
    host.stop().await.unwrap();
    let down = std::time::Instant::now();
    // Every host is down for 4 s: past the ttl counted from the park.
    wait_for(T, "4 s of outage", || async move {
        (down.elapsed() >= Duration::from_secs(4)).then_some(())
    })
    .await;
    let left = parked(&mut conn, "outage.delayed").await;
    assert_eq!(left, 1, "the parked retry is still in the set");
    let mut host = start_fixture(&redis, config).await;
    let back = host
        .event(T, "the retry after the outage", |e| {
            e.retry_count == 1 && e.kind == EventKind::Acked
        })
        .await;
    assert_ne!(back.id, id);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claiming_subscription_honours_a_delay_shorter_than_min_idle() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("claimer")
            .set("block", "5s")
            .delayed("claimer.delayed")
            .set("claim_min_idle", "30s"),
    )
    .await;
    let id = add(&mut conn, "claimer", &Control::Retry { ms: 300, times: 1 }).await;
    let parked = host.event(T, "the park", |e| e.id == id).await;
    let EventKind::Parked { due_ms, .. } = parked.kind else {
        panic!("{parked:?}")
    };
    let back = host.event(T, "the retry", |e| e.id != id).await;
    assert_eq!(back.kind, EventKind::Acked);
    let lateness = id_ms(&back.id) - due_ms;
    assert!(
        (0..TIMER_SLACK_MS).contains(&lateness),
        "came back {lateness} ms after a 300 ms delay, not after min_idle"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traps_and_failure_backoff_use_the_set_and_max_retries_counts_parks() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("fails")
            .set("block", "5s")
            .delayed("fails.delayed")
            .set("max_retries", 1)
            .set(
                "failure_backoff",
                Raw(r#"{ initial = "200ms", max = "1s" }"#),
            ),
    )
    .await;
    let id = add(&mut conn, "fails", &Control::Trap).await;
    let first = host.event(T, "the parked trap", |e| e.id == id).await;
    let EventKind::Parked { delay, cause, .. } = &first.kind else {
        panic!("{first:?}")
    };
    assert_eq!(*delay, Duration::from_millis(200));
    assert!(cause.contains("handler panicked at"), "{cause}");
    let second = host.event(T, "the second attempt", |e| e.id != id).await;
    assert_eq!(second.retry_count, 1);
    let EventKind::DeadLettered { reason } = &second.kind else {
        panic!("{second:?}")
    };
    assert!(
        reason.contains("max_retries (1) exhausted after 2 attempts"),
        "{reason}"
    );
    let dead = dead_lettered(&mut conn, "fails").await;
    assert_eq!(field(&dead[0].1, "sluice-retry-count"), Some("1"));
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_descriptor_no_key_is_created_and_no_sweep_runs() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("plain").set("block", "50ms")).await;
    let id = add(&mut conn, "plain", &Control::Retry { ms: 100, times: 1 }).await;
    host.event(T, "the retry", |e| e.id == id).await;
    host.event(T, "the ack", |e| e.id == id && e.kind == EventKind::Acked)
        .await;
    let mut keys: Vec<String> = cmd(&mut conn, &["KEYS", "*"]).await;
    keys.sort();
    assert_eq!(
        keys,
        [
            "plain",
            "sluice-claim:plain",
            "sluice-claim:plain.g.dead-letter"
        ]
    );
    let stats: String = cmd(&mut conn, &["INFO", "commandstats"]).await;
    assert!(stats.contains("cmdstat_xreadgroup"), "{stats}");
    // Only the start-up claim of the dead-letter stream ran a script: no park, no sweep.
    for sweep_or_park in ["cmdstat_zrangebyscore", "cmdstat_zadd", "cmdstat_zrange"] {
        assert!(
            !stats.contains(sweep_or_park),
            "a delayed-set command ran without a delayed set:\n{stats}"
        );
    }
    assert!(stats.contains("cmdstat_hsetnx"), "the claim ran:\n{stats}");
    host.stop().await.unwrap();
}

#[test]
fn a_skewed_host_clock_does_not_change_when_entries_come_due() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let redis = Redis::start();
        let mut conn = redis.conn().await;
        let dir = tempfile::tempdir().unwrap();
        let url = redis.url();
        // Two hosts on one set, their wall clocks two hours apart (monotonic clocks untouched).
        let mut hosts = Vec::new();
        for (consumer, offset) in [("ahead", "+2h"), ("behind", "-2h")] {
            let toml = TestConfig::of(
                Sub::fixture("skew")
                    .set("consumer", consumer)
                    .set("block", "5s")
                    .set("handler_timeout", "120s")
                    .delayed("skew.delayed"),
            )
            .to_string();
            let path = write_config(dir.path(), &format!("{consumer}.toml"), &toml);
            hosts.push(HostProcess::spawn_with(
                &["run", path.to_str().unwrap(), "--redis", &url],
                dir.path(),
                &[(sluice_host::support::clock::SKEW_VAR, offset)],
            ));
        }
        // The retry's second attempt waits (in the host's poll, not spinning) until the test
        // ends, so its copy stays in the lane, pending, where the test reads its bookkeeping.
        let retry_then_wait = Control::Attempts {
            each: vec![
                Control::Retry { ms: 1000, times: 9 },
                Control::Sleep { ms: 100_000 },
            ],
        };
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(add(&mut conn, "skew", &retry_then_wait).await);
        }
        for id in ids {
            let back = wait_lane_copy(&conn, "skew.delayed", &id).await;
            // The due time the sweep recorded is the server's park time + 1 s: not two hours
            // off either way, and the retry came back on it.
            let due = back.due_ms;
            let delay = due - id_ms(&id);
            assert!(
                (1000..10_000).contains(&delay),
                "due {delay} ms after it was added, for a 1 s delay"
            );
            let late = id_ms(&back.id) - due;
            assert!(
                (0..200).contains(&late),
                "came back {late} ms after its due time"
            );
        }
        // Both clocks were moved (each host says so at its start).
        for (host, offset) in hosts.iter().zip(["+2h", "-2h"]) {
            let log = host.log_text();
            assert!(
                log.contains(&format!("wall clock is moved by {offset}")),
                "{log}"
            );
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster_keys_in_different_slots_are_refused_and_hash_tags_work() {
    let redis = Redis::start_with(
        false,
        &[
            ("cluster-enabled", "yes"),
            ("cluster-config-file", "nodes.conf"),
        ],
    );
    let mut conn = redis.conn().await;
    let _: () = cmd(&mut conn, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]).await;
    wait_for(T, "the one-node cluster to be ready", || {
        let mut conn = conn.clone();
        async move {
            let info: String = cmd(&mut conn, &["CLUSTER", "INFO"]).await;
            info.contains("cluster_state:ok").then_some(())
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let untagged = write_config(
        dir.path(),
        "untagged.toml",
        &TestConfig::of(
            Sub::fixture("payments")
                .set("block", "5s")
                .delayed("payments.delayed"),
        )
        .to_string(),
    );
    let (ok, _, stderr) = run_sluice(
        &["run", untagged.to_str().unwrap(), "--redis", &redis.url()],
        dir.path(),
    );
    assert!(!ok, "keys in different slots were accepted");
    assert!(
        stderr.contains("CROSSSLOT") && stderr.contains("`{payments}.delayed`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("could not start") && !stderr.contains("did not stop cleanly"),
        "a start-up refusal says so: {stderr}"
    );

    let tagged = TestConfig::of(
        Sub::fixture("{payments}")
            .set("block", "5s")
            .delayed("{payments}.delayed"),
    )
    .to_string();
    let mut host = TestHost::start(&redis, &tagged).await;
    let id = add(
        &mut conn,
        "{payments}",
        &Control::Retry { ms: 100, times: 1 },
    )
    .await;
    host.event(T, "the park", |e| {
        e.id == id && matches!(e.kind, EventKind::Parked { .. })
    })
    .await;
    let back = host.event(T, "the retry", |e| e.id != id).await;
    assert_eq!(back.kind, EventKind::Acked);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_member_is_dead_lettered_instead_of_blocking_the_set() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("junk").delayed("junk.delayed")).await;
    let fields = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    let good = member::encode_legacy("7-0", 2, &fields);
    let _: i64 = redis::cmd("ZADD")
        .arg("junk.delayed")
        .arg(0)
        .arg("not msgpack at all")
        .arg(1)
        .arg(&good)
        .query_async(&mut conn)
        .await
        .unwrap();
    let back = host
        .event(T, "the good member's entry", |e| e.retry_count == 2)
        .await;
    assert_eq!(back.kind, EventKind::Acked);
    let dead = dead_lettered(&mut conn, "junk").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        field(&dead[0].1, "sluice-member"),
        Some("not msgpack at all")
    );
    assert_eq!(field(&dead[0].1, "sluice-origin-key"), Some("junk.delayed"));
    let card = parked(&mut conn, "junk.delayed").await;
    assert_eq!(card, 0);
    host.stop().await.unwrap();
}

/// The issue's case: a host whose wall clock is an hour ahead measures retry lateness on the
/// Redis clock, not its own (it read 3600 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lateness_is_measured_on_the_redis_clock_under_a_skewed_host_clock() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "ahead.toml",
        &TestConfig::of(Sub::fixture("late").delayed("late.delayed")).to_string(),
    );
    let host = HostProcess::spawn_with(
        &["run", path.to_str().unwrap(), "--redis", &redis.url()],
        dir.path(),
        &[(sluice_host::support::clock::SKEW_VAR, "+1h")],
    );
    add(&mut conn, "late", &Control::Retry { ms: 500, times: 1 }).await;
    let admin = host.admin_addr().await;
    // The clock is moved (the seam's warning comes before the admin server's line).
    assert!(
        host.log_text().contains("wall clock is moved by +1h"),
        "{}",
        host.log_text()
    );
    let metrics = wait_for(T, "the retry's lateness to be recorded", || async move {
        let (_, metrics) = http_get(admin, "/metrics").await;
        metrics
            .contains(r#"sluice_retry_lateness_seconds_count{stream="late",group="g"} 1"#)
            .then_some(metrics)
    })
    .await;
    let sum: f64 = metrics
        .lines()
        .find(|l| l.starts_with(r#"sluice_retry_lateness_seconds_sum{stream="late",group="g"}"#))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(sum < 5.0, "lateness {sum} s under a +1 h host clock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_delay_over_max_delay_is_clamped() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("forever")
            .set("max_retries", 0)
            .set("max_retries", 3)
            .set("max_delay", "1m")
            .delayed("forever.delayed"),
    )
    .await;
    let id = add(
        &mut conn,
        "forever",
        &Control::Retry {
            ms: u64::MAX,
            times: 1,
        },
    )
    .await;
    let event = host.event(T, "the park", |e| e.id == id).await;
    let sluice_host::EventKind::Parked { delay, due_ms, .. } = event.kind else {
        panic!("{event:?}");
    };
    assert_eq!(delay, Duration::from_secs(60));
    let (s, us): (i64, i64) = cmd(&mut conn, &["TIME"]).await;
    let left = due_ms - (s * 1000 + us / 1000);
    assert!((0..=60_000).contains(&left), "due in {left} ms");
    let (_, metrics) = http_get(host.admin().await, "/metrics").await;
    assert!(
        metrics.contains(r#"sluice_retry_delay_clamped_total{stream="forever",group="g"} 1"#),
        "{metrics}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_of_any_width_moves_back_whole() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("bulky")
            .set("max_retries", 0)
            .delayed("bulky.delayed"),
    )
    .await;
    // More fields than one XADD from a script could carry, next to a small one.
    let mut big = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    big.extend((0..5000).map(|i| (format!("f{i}").into_bytes(), b"v".to_vec())));
    let small = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    let _: i64 = redis::cmd("ZADD")
        .arg("bulky.delayed")
        .arg(0)
        .arg(sluice_host::entry::member::encode_legacy("1-1", 1, &big))
        .arg(1)
        .arg(sluice_host::entry::member::encode_legacy("1-2", 1, &small))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut back = std::collections::HashSet::new();
    while back.len() < 2 {
        let event = host
            .event(T, "both members' retries", |e| e.retry_count == 1)
            .await;
        assert_eq!(event.kind, sluice_host::EventKind::Acked);
        back.insert(event.origin_id);
    }
    assert_eq!(back, ["1-1".to_owned(), "1-2".to_owned()].into());
    assert!(dead_lettered(&mut conn, "bulky").await.is_empty());
    let left = parked(&mut conn, "bulky.delayed").await;
    assert_eq!(left, 0);
    host.stop().await.unwrap();
}
