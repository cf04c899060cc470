//! The retry lane (the default with a delayed set): due retries overtake a backlog instead of
//! waiting behind it at the stream's tail (`retry_lane = false`), with every guarantee kept
//! (each message settled once, a lane entry recoverable after a crash, the lane trimmed).

use std::collections::HashMap;
use std::time::Duration;

use sluice_host::entry::member;
use sluice_host::{Event, EventKind};

use crate::common::*;

const T: Duration = Duration::from_secs(30);
/// Entries of spinning work queued right behind the retry.
const BACKLOG: usize = 300;

/// `stream` with its delayed set `<stream>.delayed` (and so its retry lane).
fn with_lane(stream: &str) -> Sub {
    Sub::fixture(stream).delayed(&format!("{stream}.delayed"))
}

/// Wait until `n` entries are pending for group `g` on `lane`.
async fn wait_lane_pending(conn: &redis::aio::MultiplexedConnection, lane: &str, n: u64) {
    wait_for(T, &format!("{n} pending in {lane}"), || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, lane, "g").await == n).then_some(()) }
    })
    .await;
}

/// The event of `forged`, a lane entry the host did not write: dead-lettered unhandled,
/// with neither its claimed retry count nor its claimed origin trusted.
async fn dead_lettered_as_unwritten(host: &mut TestHost, forged: &str) -> Event {
    let event = host.event(T, "the forged entry", |e| e.id == forged).await;
    assert!(
        matches!(&event.kind, EventKind::DeadLettered { reason } if reason.contains("Sluice did not write")),
        "{event:?}"
    );
    assert_eq!(event.retry_count, 0, "the forged count is not trusted");
    assert_eq!(event.origin_id, forged, "nor the real origin");
    event
}

/// The next `n` acks of `host`, in the order they came; a park is allowed only of
/// `parked` (an origin id), any other outcome fails the test.
async fn acks_in_order(host: &mut TestHost, n: usize, parked: Option<&str>) -> Vec<Event> {
    let mut acked = Vec::new();
    let deadline = tokio::time::Instant::now() + T;
    while acked.len() < n {
        let event = tokio::time::timeout_at(deadline, host.events.recv())
            .await
            .unwrap_or_else(|_| panic!("stalled; acked so far: {acked:?}"))
            .expect("events");
        match &event.kind {
            EventKind::Acked => acked.push(event),
            EventKind::Parked { .. } if parked.is_some() => {
                assert_eq!(Some(event.origin_id.as_str()), parked)
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    acked
}

/// One subscription with a retry that comes due while `BACKLOG` entries of 5 ms work (two at a
/// time: at least 750 ms) are being handled.
fn backlogged(stream: &str, lane: bool) -> Sub {
    let sub = if lane {
        with_lane(stream)
    } else {
        with_lane(stream).set("retry_lane", false)
    };
    sub.set("max_in_flight", 2)
        .set("count", 2)
        .set("block", "5s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_retries_overtake_a_backlog_in_the_lane_and_wait_behind_it_at_the_tail() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Two retries each (the second parks from the lane, back into the set), then an ack.
    let retry = Control::Retry { ms: 200, times: 2 };
    let slow = Control::Slow { ms: 5 };
    let mut firsts = HashMap::new();
    for stream in ["lane", "tail"] {
        firsts.insert(stream, add(&mut conn, stream, &retry).await);
        for _ in 0..BACKLOG {
            add(&mut conn, stream, &slow).await;
        }
    }
    let mut host = start_fixture(
        &redis,
        TestConfig::of(backlogged("lane", true)).and(backlogged("tail", false)),
    )
    .await;
    // Per stream: backlog entries acked before the retry's final ack, and every ack's origin.
    let mut before: HashMap<&str, Option<usize>> = HashMap::new();
    let mut acked: HashMap<&str, usize> = HashMap::new();
    let mut acks_of: HashMap<(&str, String), u32> = HashMap::new();
    let deadline = tokio::time::Instant::now() + T;
    while acked.values().sum::<usize>() < 2 * BACKLOG || before.len() < 2 {
        let event = tokio::time::timeout_at(deadline, host.events.recv())
            .await
            .unwrap_or_else(|_| panic!("stalled: acked {acked:?}, retries done {before:?}"))
            .expect("events");
        let stream: &str = if &*event.stream == "lane" {
            "lane"
        } else {
            "tail"
        };
        match event.kind {
            EventKind::Acked if event.origin_id == firsts[stream] => {
                assert_eq!(event.retry_count, 2, "acked after its two retries");
                before.insert(stream, Some(acked.get(stream).copied().unwrap_or(0)));
                *acks_of
                    .entry((stream, event.origin_id.clone()))
                    .or_default() += 1;
            }
            EventKind::Acked => {
                *acked.entry(stream).or_default() += 1;
                *acks_of
                    .entry((stream, event.origin_id.clone()))
                    .or_default() += 1;
            }
            EventKind::Parked { .. } => assert_eq!(event.origin_id, firsts[stream]),
            other => panic!("unexpected outcome {other:?} on {stream}"),
        }
    }
    let lane_before = before["lane"].unwrap();
    let tail_before = before["tail"].unwrap();
    println!("lane: retry acked after {lane_before} of {BACKLOG}; tail: after {tail_before}");
    assert!(
        lane_before < BACKLOG / 2,
        "with the lane both retries came back ahead of the backlog (acked after {lane_before} of {BACKLOG})"
    );
    assert!(
        tail_before >= BACKLOG - 4,
        "at the stream's tail a due retry waits behind what is unread (acked after {tail_before} of {BACKLOG})"
    );
    assert_eq!(acks_of.len(), 2 * (BACKLOG + 1), "every message acked");
    assert!(
        acks_of.values().all(|&n| n == 1),
        "each message acked exactly once"
    );
    // Nothing left anywhere; the lane kept only what its sweep had not yet trimmed.
    for stream in ["lane", "tail"] {
        assert_eq!(pending(&mut conn, stream, "g").await, 0);
        assert_eq!(parked(&mut conn, &format!("{stream}.delayed")).await, 0);
        assert!(dead_lettered(&mut conn, stream).await.is_empty());
    }
    assert_eq!(pending(&mut conn, "lane.delayed.lane", "g").await, 0);
    let on_lane = lane_copies(&mut conn, "lane.delayed").await;
    assert_eq!(
        on_lane.len(),
        1,
        "the second sweep trimmed the first retry's acknowledged copy, the last copy waits for the next sweep: {on_lane:?}"
    );
    assert_eq!(on_lane[0].origin_id, firsts["lane"]);
    assert_eq!(on_lane[0].retry_count, 2);
    // The tail never made a lane; the lane's retries never went to its stream.
    let lane_exists: u64 = cmd(&mut conn, &["EXISTS", "tail.delayed.lane"]).await;
    assert_eq!(lane_exists, 0);
    let on_stream = entries(&mut conn, "lane").await;
    assert_eq!(
        on_stream.len(),
        BACKLOG + 1,
        "retries went to the lane only"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_entry_pending_at_a_crash_is_settled_once_after_the_restart() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let run = RunDir::new(&redis, with_lane("crashlane").set("handler_timeout", "60s"));
    let mut host = run.spawn();
    // Retry once, spin on the lane copy (the host is killed meanwhile), dead-letter after.
    let control = Control::Attempts {
        each: vec![
            Control::Retry { ms: 100, times: 1 },
            Control::Loop,
            Control::Dead {
                reason: "third attempt".into(),
            },
        ],
    };
    let id = add(&mut conn, "crashlane", &control).await;
    wait_lane_pending(&conn, "crashlane.delayed.lane", 1).await;
    // The lane's pending copy counts as the subscription's pending work, in the metrics and
    // on the admin page.
    let admin = host.admin_addr().await;
    let session = log_in(admin).await;
    let (code, _, page) = http_exchange(admin, "GET", "/ui/", &session.headers(), b"").await;
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("1 of them in the retry lane crashlane.delayed.lane"),
        "{page}"
    );
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_pending_entries{")
                && l.contains("crashlane")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    host.kill();
    assert_eq!(
        pending(&mut conn, "crashlane", "g").await,
        0,
        "the original was acked when parked"
    );
    // An operator sees the lane's pending copy.
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(with_lane("crashlane"));
    let path = write_config(dir.path(), "sluice.toml", &config.to_string());
    let url = redis.url();
    let (ok, stdout, stderr) = run_sluice(
        &["status", path.to_str().unwrap(), "--redis", &url],
        dir.path(),
    );
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("retry lane `crashlane.delayed.lane`: 1 pending"),
        "{stdout}"
    );
    let mut restarted = run.spawn();
    let dead = wait_dead_letters(&conn, "crashlane", 1).await;
    wait_lane_pending(&conn, "crashlane.delayed.lane", 0).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (_, letter) = &dead[0];
    assert_eq!(field(letter, "sluice-reason"), Some("third attempt"));
    assert_eq!(field(letter, "sluice-origin-id"), Some(id.as_str()));
    assert_eq!(field(letter, "sluice-origin-stream"), Some("crashlane"));
    assert_eq!(field(letter, "sluice-retry-count"), Some("1"));
    assert_eq!(
        field(letter, "sluice-delivery-count"),
        Some("2"),
        "the lane copy was delivered before the crash and once after it"
    );
    let lane = entries(&mut conn, "crashlane.delayed.lane").await;
    assert_eq!(field(letter, "sluice-entry-id"), Some(lane[0].0.as_str()));
    assert_eq!(parked(&mut conn, "crashlane.delayed").await, 0);
    assert_eq!(pending(&mut conn, "crashlane", "g").await, 0);
    restarted.kill();
}

/// Sleeping handlers queued behind the retry in `a_due_retry_starts_in_a_reserved_slot...`.
const SLEEPERS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_retry_starts_in_a_reserved_slot_while_the_stream_holds_all_others() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // `max_in_flight = 8` keeps one slot for due retries; `count = 1` refills every other slot
    // the moment it frees, so without the reserve the retry's slot goes to a sleeper and the
    // due retry waits 2 s for one to wake.
    let retry = add(&mut conn, "reserve", &Control::Retry { ms: 300, times: 1 }).await;
    for _ in 0..SLEEPERS {
        add(&mut conn, "reserve", &Control::Sleep { ms: 2000 }).await;
    }
    let sub = with_lane("reserve")
        .set("max_in_flight", 8)
        .set("count", 1)
        .set("block", "5s");
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    let order: Vec<String> = acks_in_order(&mut host, SLEEPERS + 1, Some(&retry))
        .await
        .into_iter()
        .map(|e| e.origin_id)
        .collect();
    assert_eq!(
        order[0], retry,
        "the due retry was acked before any sleeper woke: {order:?}"
    );
    let mut once = order.clone();
    once.sort();
    once.dedup();
    assert_eq!(
        once.len(),
        SLEEPERS + 1,
        "each message acked exactly once: {order:?}"
    );
    assert_eq!(pending(&mut conn, "reserve", "g").await, 0);
    assert_eq!(pending(&mut conn, "reserve.delayed.lane", "g").await, 0);
    assert_eq!(parked(&mut conn, "reserve.delayed").await, 0);
    host.stop().await.unwrap();
}

/// More retries come due at once than the lane has slots kept for them, while sleepers hold
/// every other slot: each is read as soon as a kept slot frees, not at the next sweep that
/// happens to move something (here: none until a sleeper wakes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_retries_beyond_the_lanes_slots_are_read_as_its_slots_free() {
    const DUE: usize = 5;
    const BUSY: usize = 3;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Four slots, one kept for due retries: the sleepers take the other three.
    let retry = add(&mut conn, "kept", &Control::Retry { ms: 300, times: 1 }).await;
    for _ in 0..BUSY {
        add(&mut conn, "kept", &Control::Sleep { ms: 4000 }).await;
    }
    let sub = with_lane("kept")
        .set("max_in_flight", BUSY + 1)
        .set("retry_lane_slots", 1)
        .set("count", BUSY + 1)
        .set("block", "5s");
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    host.event(T, "the retry parked", |e| {
        e.origin_id == retry && matches!(e.kind, EventKind::Parked { .. })
    })
    .await;
    // More retries due at once than the lane's one slot: one sweep pass moves them all.
    let fields = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    let mut zadd = redis::cmd("ZADD");
    zadd.arg("kept.delayed");
    for n in 1..DUE {
        zadd.arg(0)
            .arg(member::encode_legacy(&format!("{n}-1"), 1, &fields));
    }
    let _: i64 = zadd.query_async(&mut conn).await.unwrap();
    let order: Vec<u32> = acks_in_order(&mut host, DUE + BUSY, None)
        .await
        .into_iter()
        .map(|e| e.retry_count)
        .collect();
    assert_eq!(
        order,
        [vec![1; DUE], vec![0; BUSY]].concat(),
        "every due retry (retry count 1) was acked before any sleeper woke"
    );
    assert_eq!(pending(&mut conn, "kept.delayed.lane", "g").await, 0);
    assert_eq!(parked(&mut conn, "kept.delayed").await, 0);
    host.stop().await.unwrap();
}

#[test]
fn check_names_the_lane_and_its_slots_and_refuses_what_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(with_lane("withlane")).to_string();
    write_config(dir.path(), "sluice.toml", &config);
    let (ok, stdout, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stdout
            .contains("then go to the group's own retry lane `withlane.delayed.lane`, read before the stream (2 of 16 handler slots kept for them)"),
        "{stdout}"
    );
    // The slots kept for due retries: set, too many, or without a lane.
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(with_lane("withlane").set("retry_lane_slots", 3)).to_string();
    write_config(dir.path(), "sluice.toml", &config);
    let (ok, stdout, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("(3 of 16 handler slots kept for them)"),
        "{stdout}"
    );
    for (sub, says) in [
        (
            with_lane("withlane").set("retry_lane_slots", 16),
            "`subscription[0].retry_lane_slots` = \"16\" is not valid: must be less than max_in_flight (16)",
        ),
        (
            Sub::fixture("nolane")
                .delayed("nolane.delayed")
                .set("retry_lane", false)
                .set("retry_lane_slots", 2),
            "`subscription[0].retry_lane_slots` = \"2\" is not valid: only means something with the retry lane",
        ),
        (
            Sub::fixture("nolane").set("retry_lane_slots", 2),
            "retry_lane_slots needs a delayed-retry set",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), "sluice.toml", &TestConfig::of(sub).to_string());
        let (ok, _, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
        assert!(!ok, "check passed: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(Sub::fixture("nolane").set("retry_lane", true)).to_string();
    write_config(dir.path(), "sluice.toml", &config);
    let (ok, _, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(!ok, "check passed: {stderr}");
    assert!(
        stderr.contains("retry_lane = true needs a delayed-retry set"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lane_entries_a_gone_consumer_left_are_taken_over_and_claimed() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // On each subscription's lane, an entry an old pod read and never settled.
    let mut stranded = HashMap::new();
    for stream in ["takeover", "claiming"] {
        let lane = format!("{stream}.delayed.lane");
        create_group(&mut conn, &lane, "g", "0").await;
        let set = format!("{stream}.delayed");
        stranded.insert(
            stream,
            sealed_lane_copy(&mut conn, stream, &set, &Control::Ack).await,
        );
        read_as(&mut conn, "old-pod", &lane, ">").await;
        assert_eq!(pending(&mut conn, &lane, "g").await, 1);
    }
    let lane_sub = |stream: &str| with_lane(stream).set("consumer", "new-pod");
    let mut host = start_fixture(
        &redis,
        TestConfig::of(lane_sub("takeover").set("consumer_gone_after", "1s"))
            .and(lane_sub("claiming").set("claim_min_idle", "1s")),
    )
    .await;
    // Either may come first.
    let mut settled = HashMap::new();
    while settled.len() < 2 {
        let event = host
            .event(T, "the stranded lane entries", |e| {
                stranded.get(&*e.stream) == Some(&e.id)
            })
            .await;
        settled.insert(event.stream.to_string(), event);
    }
    for stream in ["takeover", "claiming"] {
        let event = &settled[stream];
        assert_eq!(event.kind, EventKind::Acked, "{stream}");
        assert_eq!(event.delivery_count, 2, "{stream}: taken from the old pod");
        wait_lane_pending(&conn, &format!("{stream}.delayed.lane"), 0).await;
    }
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookkeeping_written_into_the_lane_by_hand_is_not_trusted() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, TestConfig::of(with_lane("forge"))).await;
    // A real retry through the lane leaves a real, sealed copy there.
    let real = add(&mut conn, "forge", &Control::Retry { ms: 50, times: 1 }).await;
    let back = host
        .event(T, "the real retry's ack", |e| {
            e.origin_id == real && e.kind == EventKind::Acked
        })
        .await;
    assert_eq!(back.retry_count, 1);
    let lane = entries(&mut conn, "forge.delayed.lane").await;
    let (_, copy) = lane
        .iter()
        .find(|(id, _)| *id == back.id)
        .expect("the lane copy");
    let real_field = |name: &str| field(copy, name).expect(name).to_owned();
    let real_member: Vec<u8> = {
        let raw: Vec<RawEntry> = cmd(
            &mut conn,
            &["XRANGE", "forge.delayed.lane", &back.id, &back.id],
        )
        .await;
        raw[0].1[0].1.clone()
    };
    // Someone who can write to the lane: the real seal on a member that says retry count 3,
    // the real member under a made-up seal, and the earlier release's form with a made-up mark.
    let fields = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    let raised = member::NewMember {
        entry_id: &back.id,
        retry_count: 3,
        fields: &fields,
        origin_id: &real,
        stream: "forge",
        group: "g",
    }
    .encode();
    let member_forms: [(Vec<u8>, String); 2] = [
        (raised, real_field("sluice-mark")),
        (real_member, "0".repeat(40)),
    ];
    for (member, mark) in member_forms {
        let forged: String = redis::cmd("XADD")
            .arg("forge.delayed.lane")
            .arg("*")
            .arg("sluice-parked")
            .arg(member)
            .arg("sluice-due-ms")
            .arg(real_field("sluice-due-ms"))
            .arg("sluice-mark")
            .arg(&mark)
            .query_async(&mut conn)
            .await
            .unwrap();
        // Not a copy the host wrote: dead-lettered without being handled.
        let event = dead_lettered_as_unwritten(&mut host, &forged).await;
        assert_eq!(
            &*event.stream, "forge",
            "settled for the subscription's stream"
        );
    }
    let forged: String = redis::cmd("XADD")
        .arg("forge.delayed.lane")
        .arg("*")
        .arg("payload")
        .arg(Control::Ack.to_string())
        .arg("sluice-retry-count")
        .arg("4294967295")
        .arg("sluice-origin-id")
        .arg(&real)
        .arg("sluice-due-ms")
        .arg("1")
        .arg("sluice-mark")
        .arg("0".repeat(40))
        .query_async(&mut conn)
        .await
        .unwrap();
    dead_lettered_as_unwritten(&mut host, &forged).await;
    wait_lane_pending(&conn, "forge.delayed.lane", 0).await;
    assert_eq!(parked(&mut conn, "forge.delayed").await, 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lane_trimming_is_exact_above_2_pow_53() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let keys = sluice_host::store::keys::SubscriptionKeys::new(
        "exact",
        "g",
        "exact.dead-letter",
        Some("exact.delayed"),
    )
    .with_retry_lane(true);
    let lane = keys.lane.as_deref().unwrap().to_owned();
    // A lane whose ids are above 2^53 in both parts (someone wrote one such id; every later id
    // follows it): 500 entries whose sequences a Lua number would round to multiples of 1024.
    const HUGE: u64 = 1 << 62;
    create_group(&mut conn, &lane, "g", "0").await;
    let mut ids = Vec::new();
    for i in 0..500u64 {
        let id = format!("{HUGE}-{}", HUGE + 600 + i);
        let _: String = cmd(&mut conn, &["XADD", &lane, &id, "payload", "{}"]).await;
        ids.push(id);
    }
    // The group has read and acknowledged the first 200; the other 300 are unread.
    read_and_ack(&mut conn, &lane, "g", 200, 200).await;
    // A due retry makes the sweep trim the lane before it adds to it.
    let set = delayed_set(&redis, &keys).await;
    let fields = vec![(b"payload".to_vec(), b"{}".to_vec())];
    let member = member::encode_legacy("1-1", 1, &fields);
    let _: i64 = redis::cmd("ZADD")
        .arg("exact.delayed")
        .arg(0)
        .arg(member)
        .query_async(&mut conn)
        .await
        .unwrap();
    let swept = set.sweep().await.unwrap();
    assert_eq!(swept.moved, 1);
    let left: Vec<String> = entries(&mut conn, &lane)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        left.len(),
        301,
        "the 300 unread and the new copy: {}",
        left.len()
    );
    assert_eq!(
        &left[..300],
        &ids[200..],
        "only what the group acknowledged went"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_left_behind_is_drained_after_retry_lane_is_turned_off() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Retries a host of the group moved into the lane while `retry_lane` was on, unread.
    let lane = sluice_host::store::keys::lane_key("leftover.delayed");
    create_group(&mut conn, &lane, "g", "0").await;
    let mut left = std::collections::HashSet::new();
    for _ in 0..3 {
        left.insert(
            sealed_lane_copy(&mut conn, "leftover", "leftover.delayed", &Control::Ack).await,
        );
    }
    // A host with the lane turned off still reads it until nothing of the group is left there.
    let sub = with_lane("leftover").set("retry_lane", false);
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    while !left.is_empty() {
        let event = host
            .event(T, "the lane's retries", |e| left.contains(&e.id))
            .await;
        assert_eq!(event.kind, EventKind::Acked, "{event:?}");
        assert_eq!(event.retry_count, 1);
        left.remove(&event.id);
    }
    wait_lane_pending(&conn, &lane, 0).await;
    // New retries go to the stream's tail.
    let id = add(&mut conn, "leftover", &Control::Retry { ms: 50, times: 1 }).await;
    let back = host
        .event(T, "a new retry", |e| {
            e.origin_id == id && e.kind == EventKind::Acked
        })
        .await;
    let on_stream: Vec<String> = entries(&mut conn, "leftover")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(
        on_stream.contains(&back.id),
        "the retry came back at the tail"
    );
    host.stop().await.unwrap();
}
