//! Entries sent for later (`sluice send --at/--in`, `POST .../scheduled`, a producer's own
//! ZADD): each waits in the subscription's delayed set and comes once, at its time, as a first
//! attempt; listed apart from retries, retried now or deleted like them; times out of bounds
//! are refused by name.

use std::collections::HashMap;
use std::time::Duration;

use sluice_host::EventKind;
use sluice_host::control::operate::schedule::{self, Target, When};

use crate::common::*;

const T: Duration = Duration::from_secs(30);

fn ack() -> String {
    serde_json::to_string(&Control::Ack).unwrap()
}

/// Epoch ms of a time.
fn ms_of(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_entries_sent_for_later_each_come_once_at_their_time() {
    const N: usize = 1_000;
    let seed = crate::crash::seed("SLUICE_SCHEDULE_SEED");
    let mut rng = crate::crash::Lcg(seed);
    // Keyspace events: the host's timer hears of every new due time at once.
    let redis = Redis::start_with(true, &[("notify-keyspace-events", "Ktz")]);
    let mut conn = redis.conn().await;
    let stream = "sched";
    let set = "sched.delayed";
    let mut host = start_fixture(&redis, TestConfig::of(Sub::fixture(stream).delayed(set))).await;
    let target = Target {
        stream,
        group: "g",
        set,
        ttl: None,
    };
    let fields = [(b"payload".to_vec(), ack().into_bytes())];
    let mut due: HashMap<String, i64> = HashMap::new();
    for _ in 0..N {
        let when = When::In(Duration::from_millis(1_000 + rng.next(20_000)));
        let done = schedule::schedule(&mut conn, target, when, &fields)
            .await
            .unwrap();
        due.insert(done.id, done.due_ms);
    }
    let mut late = Vec::with_capacity(N);
    let mut seen = HashMap::new();
    while late.len() < N {
        let e = host
            .event(T, "every scheduled entry handled", |e| {
                e.kind == EventKind::Acked
            })
            .await;
        let Some(&due_ms) = due.get(&e.origin_id) else {
            panic!("an entry nobody scheduled: {e:?}");
        };
        assert_eq!(e.retry_count, 0, "a first attempt: {e:?}");
        *seen.entry(e.origin_id.clone()).or_insert(0) += 1;
        late.push(ms_of(e.started.expect("listened")) - due_ms as f64);
    }
    late.sort_by(f64::total_cmp);
    let p99 = late[N * 99 / 100];
    println!(
        "scheduled: seed {seed}, {N} entries: lateness p50 {:.1} ms, p99 {p99:.1} ms, max {:.1} ms, earliest {:.1} ms",
        late[N / 2],
        late[N - 1],
        late[0]
    );
    assert!(seen.values().all(|n| *n == 1), "each once (seed {seed})");
    // The due time is a whole ms of Redis's clock: a delivery in that ms is on time.
    assert!(
        late[0] >= -1.0,
        "one came {:.1} ms early (seed {seed})",
        -late[0]
    );
    assert!(p99 <= 20.0, "p99 {p99:.1} ms late (seed {seed})");
    let left: u64 = cmd(&mut conn, &["ZCARD", set]).await;
    assert_eq!(left, 0);
    host.stop().await.unwrap();
}

#[tokio::test]
async fn send_at_from_the_cli_the_api_and_a_producer_is_listed_apart_and_acted_on_like_a_retry() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "sched-ops";
    let set = "sched-ops.delayed";
    let sub = Sub::fixture(stream).delayed(set);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "sluice.toml",
        &TestConfig::of(sub.clone()).to_string(),
    );
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    let admin = host.admin().await;
    let send = |args: &[&str]| {
        let mut all = vec!["send", stream, "{\"mode\":\"ack\"}"];
        all.extend_from_slice(args);
        let config = config.display().to_string();
        let url = redis.url();
        let all: Vec<String> = all
            .iter()
            .map(|s| (*s).to_owned())
            .chain(["--config".to_owned(), config, "--redis".to_owned(), url])
            .collect();
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        run_sluice(&args, dir.path())
    };
    // Out of bounds, by name; a time that is no time.
    let (ok, _, err) = send(&["--at", "9999-01-01T00:00:00Z"]);
    assert!(!ok && err.contains("ahead"), "{err}");
    let (ok, _, err) = send(&["--at", "2020-01-01T00:00:00Z"]);
    assert!(!ok && err.contains("in the past"), "{err}");
    let (ok, _, err) = send(&["--at", "tomorrow"]);
    assert!(!ok && err.contains("RFC 3339"), "{err}");
    // An hour from now from the CLI, and from the API.
    let (ok, out, err) = send(&["--in", "1h"]);
    assert!(ok, "{err}");
    let cli_id = out.split_whitespace().nth(1).unwrap().to_owned();
    let body = serde_json::json!({"in": "1h", "payload": Control::Ack}).to_string();
    let path = format!("/v1/subscriptions/{stream}/g/scheduled");
    let (status, answer) = http_request(
        admin,
        "POST",
        &path,
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let api_id = serde_json::from_str::<serde_json::Value>(&answer).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for (body, want) in [
        (
            serde_json::json!({"at": "9999-01-01T00:00:00Z", "payload": {}}),
            422,
        ),
        (serde_json::json!({"in": "1h"}), 400),
        (
            serde_json::json!({"in": "1h", "at_ms": 5, "payload": {}}),
            400,
        ),
        (serde_json::json!({"in": "soon", "payload": {}}), 400),
    ] {
        let (status, answer) = http_request(
            admin,
            "POST",
            &path,
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(status, want, "{body}: {answer}");
    }
    // Listed apart from retries: kind `scheduled`, retry count 0; the CLI says `sched`.
    let (status, listing) = http_get(admin, &format!("/v1/subscriptions/{stream}/g/parked")).await;
    assert_eq!(status, 200, "{listing}");
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    let items = listing["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{listing}");
    assert!(
        items
            .iter()
            .all(|i| i["kind"] == "scheduled" && i["retry_count"] == 0),
        "{listing}"
    );
    let (ok, out, err) = run_sluice(
        &[
            "parked",
            &config.display().to_string(),
            "--redis",
            &redis.url(),
        ],
        dir.path(),
    );
    assert!(
        ok && out.contains(&cli_id) && out.contains("sched"),
        "{out}{err}"
    );
    // Retried now: it comes as a first attempt under its id; deleted: it never comes.
    let body = serde_json::json!({"origin_ids": [cli_id]}).to_string();
    let (status, answer) = http_request(
        admin,
        "POST",
        &format!("/v1/subscriptions/{stream}/g/parked/retry-now"),
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let e = host
        .event(T, "the CLI's entry made due", |e| {
            e.kind == EventKind::Acked
        })
        .await;
    assert_eq!((e.origin_id.as_str(), e.retry_count), (cli_id.as_str(), 0));
    let (status, answer) = http_request(
        admin,
        "DELETE",
        &format!("/v1/subscriptions/{stream}/g/parked/{api_id}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // A producer in another language writes the member itself (docs/src/concepts/scheduled.md).
    let id = "1700000000000-1000000000000000001";
    let member = rmpv::Value::Array(vec![
        stream.into(),
        "g".into(),
        id.into(),
        0.into(),
        rmpv::Value::Array(vec!["payload".into(), ack().into()]),
        id.into(),
    ]);
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &member).unwrap();
    let now: i64 = {
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        s * 1000 + us / 1000
    };
    let _: i64 = redis::cmd("ZADD")
        .arg(set)
        .arg(now + 300)
        .arg(&bytes)
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = host
        .event(T, "the producer's entry", |e| e.kind == EventKind::Acked)
        .await;
    assert_eq!((e.origin_id.as_str(), e.retry_count), (id, 0));
    let left: u64 = cmd(&mut conn, &["ZCARD", set]).await;
    assert_eq!(left, 0, "the deleted one is gone, the others came");
    host.stop().await.unwrap();
}
