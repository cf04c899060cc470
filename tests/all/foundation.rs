//! The foundation: reading, acking, pending re-reads, claiming, retries without a delayed set,
//! dead letters, traps, configuration errors and the two example forms.

use std::time::{Duration, Instant};

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(20);

fn fixture_config(stream: &str, extra: &str) -> String {
    format!(
        "[[subscription]]\ncomponent = \"{{fixture}}\"\nstream = \"{stream}\"\ngroup = \"g\"\nconsumer = \"c1\"\nblock = \"100ms\"\n{extra}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_removes_the_entry_from_the_pending_list() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(&redis, &fixture_config("acks", "")).await;
    let id = add(&mut conn, "acks", &Control::Ack).await;
    let event = host.event(T, "the ack", |e| e.id == id).await;
    assert_eq!(event.kind, EventKind::Acked);
    assert_eq!((event.retry_count, event.delivery_count), (0, 1));
    assert_eq!(pending(&mut conn, "acks", "g").await, 0);
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_pending_entries_are_re_read_after_a_restart() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = fixture_config("restart", "");
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
    let _: () = cmd(
        &mut conn,
        &["XGROUP", "CREATE", "claims", "g", "$", "MKSTREAM"],
    )
    .await;
    let id = add(&mut conn, "claims", &Control::Ack).await;
    // A consumer reads the entry and dies without settling it.
    let _: redis::Value = cmd(
        &mut conn,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "dead",
            "COUNT",
            "1",
            "STREAMS",
            "claims",
            ">",
        ],
    )
    .await;
    let started = Instant::now();
    let mut host = TestHost::start(
        &redis,
        &fixture_config(
            "claims",
            "claim_min_idle = \"300ms\"\nhandler_timeout = \"200ms\"",
        ),
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
    let mut host = TestHost::start(&redis, &fixture_config("pending-retry", "")).await;
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
    let keys: Vec<String> = cmd(&mut conn, &["KEYS", "*"]).await;
    assert_eq!(
        keys,
        vec!["pending-retry".to_owned()],
        "no delayed set without the descriptor"
    );
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_subscription_rounds_a_pending_retry_up_to_min_idle() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &fixture_config(
            "claim-retry",
            "claim_min_idle = \"1500ms\"\nhandler_timeout = \"1s\"",
        ),
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
async fn undecodable_payloads_are_dead_lettered_with_the_reason() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        "[[subscription]]\ncomponent = \"{bank}\"\nstream = \"payments\"\ngroup = \"g\"\nblock = \"100ms\"\ndelayed_retry = \"none\"\n",
    )
    .await;
    let bad = add(
        &mut conn,
        "payments",
        &serde_json::json!({"id": "p1", "amount": "ten"}),
    )
    .await;
    let missing: String = cmd(&mut conn, &["XADD", "payments", "*", "body", "{}"]).await;
    let mut reasons = std::collections::HashMap::new();
    while reasons.len() < 2 {
        let event = host
            .event(T, "two dead letters", |e| {
                matches!(e.kind, EventKind::DeadLettered { .. })
            })
            .await;
        if let EventKind::DeadLettered { reason } = event.kind {
            reasons.insert(event.id, reason);
        }
    }
    let reason = &reasons[&bad];
    assert!(reason.contains("field `payload`"), "{reason}");
    assert!(reason.contains("missing field `account`"), "{reason}");
    let reason = &reasons[&missing];
    assert!(
        reason.contains("the entry has no `payload` field"),
        "{reason}"
    );
    let dead = entries(&mut conn, "payments.dead-letter").await;
    assert_eq!(dead.len(), 2);
    let bad_dead = dead
        .iter()
        .find(|(_, f)| field(f, "sluice-origin-id") == Some(bad.as_str()))
        .expect("the bad payload's dead letter");
    assert_eq!(field(&bad_dead.1, "sluice-origin-stream"), Some("payments"));
    assert!(
        field(&bad_dead.1, "payload").is_some(),
        "original fields are kept"
    );
    assert_eq!(
        pending(&mut conn, "payments", "g").await,
        0,
        "dead letters are acked"
    );
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_guest_is_retried_with_backoff_then_dead_lettered() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &fixture_config(
            "traps",
            "max_retries = 2\nfailure_backoff = { initial = \"200ms\", max = \"1s\" }",
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
    let dead = entries(&mut conn, "traps.dead-letter").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(field(&dead[0].1, "sluice-delivery-count"), Some("3"));
    host.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_retries_sends_a_retrying_entry_to_the_dead_letter_stream() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &fixture_config("max", "max_retries = 1\ndead_letter = \"max.failed\""),
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
    let mut host = TestHost::start(
        &redis,
        &fixture_config("report", "[subscription.config]\nregion = \"eu-west\""),
    )
    .await;
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
        "stream=report group=g retry_count=0 delivery_count=1 config=eu-west fields=payload"
    );
    host.stop().await.expect("clean stop");
}

#[test]
fn bad_configurations_are_refused_with_errors_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases = [
        (
            "unknown.toml",
            "[[subscription]]\ncomponent = \"{fixture}\"\nblok = \"1s\"\n",
            "unknown field `blok`",
        ),
        (
            "duration.toml",
            "[[subscription]]\ncomponent = \"{fixture}\"\nblock = \"soonish\"\n",
            "subscription[0].block",
        ),
        (
            "missing.toml",
            "[[subscription]]\ncomponent = \"nope.wasm\"\n",
            "nope.wasm does not exist",
        ),
        (
            "world.toml",
            "[[subscription]]\ncomponent = \"{other_world}\"\n",
            "does not implement the sluice:handler/handler world",
        ),
        (
            "group.toml",
            "[[subscription]]\ncomponent = \"{fixture}\"\ngroup = \"\"\n",
            "`group` is empty",
        ),
        (
            "ttl.toml",
            "[[subscription]]\ncomponent = \"{fixture}\"\nmax_delay = \"2h\"\ndelayed_retry = { key = \"fixture.delayed\", ttl = \"1h\" }\n",
            "ttl 3600s is shorter than the longest delay 7200s",
        ),
    ];
    for (name, toml, expected) in cases {
        let path = write_config(d, name, toml);
        let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], d);
        assert!(!ok, "{name} was accepted");
        assert!(
            stderr.contains(expected),
            "{name}: expected {expected:?} in:\n{stderr}"
        );
        assert_eq!(
            stderr.matches(expected).count(),
            1,
            "{name}: the reason is printed once:\n{stderr}"
        );
    }
    let (ok, _, stderr) = run_sluice(&["check", guests().other_world.to_str().unwrap()], d);
    assert!(!ok);
    assert!(stderr.contains("no export `handle`"), "{stderr}");
}

#[test]
fn check_prints_the_resolved_plan() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "plan.toml",
        "redis = \"redis://:secret@127.0.0.1:1\"\n[[subscription]]\ncomponent = \"{bank}\"\ncount = 10\nclaim_min_idle = \"1m\"\nallowed_outbound_hosts = [\"https://*.example.com\"]\nhttp_timeout = \"3s\"\n[subscription.config]\ngateway_url = \"https://pay.example.com\"\n",
    );
    let (ok, stdout, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(ok, "{stderr}");
    for expected in [
        "subscription 1: stream `bank-payments`, group `billing`",
        "redis://***@127.0.0.1:1",
        "XREADGROUP COUNT 10 BLOCK 1s",
        "XAUTOCLAIM entries idle for at least 1m",
        "retries wait in sorted set `bank-payments.delayed` (ttl none)",
        "dead letter  `bank-payments.dead-letter`",
        "network      HTTP to https://*.example.com (3s per request)",
        "gateway_url=https://pay.example.com",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}
