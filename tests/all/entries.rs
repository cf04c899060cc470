//! What careless producers put on a stream: payloads that do not decode, field names that are
//! not UTF-8, entries too big to dead-letter as they are, and `sluice-*` fields a producer
//! wrote itself. Each is handled, parked or dead-lettered, never lost, and never wedges the
//! subscription.

use std::time::Duration;

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_payloads_are_dead_lettered_with_the_reason() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        TestConfig::of(
            Sub::new("{bank}", "payments")
                .unset("consumer")
                .set("delayed_retry", "none"),
        ),
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
    let dead = dead_lettered(&mut conn, "payments").await;
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
async fn a_field_name_that_is_not_utf8_is_dead_lettered_and_nothing_wedges() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let toml = TestConfig::of(Sub::fixture("bytes").set("max_retries", 0)).to_string();
    let host = TestHost::start(&redis, &toml).await;
    let a = add(&mut conn, "bytes", &Control::Ack).await;
    let b: String = redis::cmd("XADD")
        .arg("bytes")
        .arg("*")
        .arg(&b"\xff\xfe"[..])
        .arg(&b"\x00\x01"[..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let c = add(&mut conn, "bytes", &Control::Ack).await;
    let dead = wait_dead_letters(&conn, "bytes", 1).await;
    let reason = field(&dead[0].1, "sluice-reason").unwrap();
    assert!(
        reason.contains("not valid UTF-8") && reason.contains("fffe"),
        "{reason}"
    );
    assert_eq!(field(&dead[0].1, "sluice-origin-id"), Some(b.as_str()));
    // The raw name and value are kept, byte for byte.
    let raw: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(dead_letter_key("bytes"))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(raw[0].1[0], (b"\xff\xfe".to_vec(), b"\x00\x01".to_vec()));
    wait_acked(&conn, "bytes", "g", &c).await;
    let _ = a;
    // After a restart the consumer still reads.
    host.stop().await.unwrap();
    let mut host = TestHost::start(&redis, &toml).await;
    let d = add(&mut conn, "bytes", &Control::Ack).await;
    host.event(T, "an entry after the restart", |e| e.id == d)
        .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_that_cannot_be_written_keeps_the_entry_pending_and_huge_entries_are_kept_whole()
 {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // The dead-letter key holds a string: every dead letter fails until the operator fixes it.
    let _: () = cmd(
        &mut conn,
        &["SET", &dead_letter_key("wrong"), "not a stream"],
    )
    .await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("wrong").set("max_retries", 0).set(
            "failure_backoff",
            Raw(r#"{ initial = "100ms", max = "200ms" }"#),
        ),
    )
    .await;
    let id = add(
        &mut conn,
        "wrong",
        &Control::Dead {
            reason: "poison".into(),
        },
    )
    .await;
    let admin = host.admin().await;
    wait_for(T, "the settle error to be counted", || async move {
        let (_, metrics) = http_get(admin, "/metrics").await;
        metrics
            .lines()
            .any(|l| {
                l.starts_with("sluice_settle_errors_total{stream=\"wrong\"") && !l.ends_with(" 0")
            })
            .then_some(())
    })
    .await;
    assert_eq!(
        pending(&mut conn, "wrong", "g").await,
        1,
        "the entry stays pending"
    );
    let _: () = cmd(&mut conn, &["DEL", &dead_letter_key("wrong")]).await;
    let dead = wait_dead_letters(&conn, "wrong", 1).await;
    assert_eq!(field(&dead[0].1, "sluice-origin-id"), Some(id.as_str()));
    assert_eq!(field(&dead[0].1, "sluice-reason"), Some("poison"));
    wait_for(T, "nothing pending", || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, "wrong", "g").await == 0).then_some(()) }
    })
    .await;
    // 5,000 fields: more than a script can hand to one XADD; recorded whole, packed.
    let mut xadd = redis::cmd("XADD");
    xadd.arg("wrong").arg("*").arg("payload").arg(
        Control::Dead {
            reason: "big".into(),
        }
        .to_string(),
    );
    for i in 0..5000 {
        xadd.arg(format!("f{i}")).arg(i);
    }
    let _: String = xadd.query_async(&mut conn).await.unwrap();
    let dead = wait_dead_letters(&conn, "wrong", 2).await;
    let packed = field(&dead[1].1, "sluice-packed-fields").expect("packed fields");
    assert!(packed.len() > 5000 * 4, "{}", packed.len());
    assert_eq!(field(&dead[1].1, "sluice-reason"), Some("big"));
    let _ = &mut host;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_bookkeeping_fields_change_nothing() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("spoof")
            .set("max_retries", 0)
            .set("max_retries", 3)
            .set(
                "failure_backoff",
                Raw(r#"{ initial = "50ms", max = "100ms" }"#),
            )
            .delayed("spoof.delayed"),
    )
    .await;
    let id: String = redis::cmd("XADD")
        .arg("spoof")
        .arg("*")
        .arg("payload")
        .arg(Control::TrapThenAck { times: 1 }.to_string())
        .arg("sluice-retry-count")
        .arg("4294967295")
        .arg("sluice-origin-id")
        .arg("1-1")
        .arg("sluice-due-ms")
        .arg("0")
        .arg("sluice-mark")
        .arg("0000")
        .query_async(&mut conn)
        .await
        .unwrap();
    let first = host.event(T, "the first attempt", |e| e.id == id).await;
    assert_eq!(first.retry_count, 0, "the producer's count is not trusted");
    assert!(
        matches!(first.kind, sluice_host::EventKind::Parked { .. }),
        "{first:?}"
    );
    let back = host
        .event(T, "the retry", |e| e.kind == sluice_host::EventKind::Acked)
        .await;
    assert_eq!(back.retry_count, 1);
    assert_eq!(dead_lettered(&mut conn, "spoof").await.len(), 0);
    // The producer's own sluice-* fields are its data: kept through the park, and handed
    // back with the entry (the host's own bookkeeping travels in the lane copy's member).
    let copy = wait_lane_copy(&conn, "spoof.delayed", &id).await;
    assert_eq!(copy.id, back.id);
    let names: Vec<&str> = copy.fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "payload",
            "sluice-retry-count",
            "sluice-origin-id",
            "sluice-due-ms",
            "sluice-mark"
        ],
        "the producer's fields, all of them, nothing more"
    );
    assert_eq!(field(&copy.fields, "sluice-origin-id"), Some("1-1"));
    assert_eq!(copy.origin_id, id, "the host's own origin");
    host.stop().await.unwrap();
}

/// An entry of 200,000 tiny fields (2.6 MB of names and values, but each field costs the host
/// and the guest far more than its bytes) is over `max_entry_bytes` as it counts fields (64
/// bytes each more): the read stops keeping its fields once it passes the limit, and it is
/// dead-lettered unhandled, saying so; the subscription goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_of_very_many_fields_counts_them_and_is_dead_lettered_unhandled() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("wide-many")).await;
    let mut xadd = redis::cmd("XADD");
    xadd.arg("wide-many")
        .arg("*")
        .arg("payload")
        .arg(serde_json::to_string(&sluice_fixture_control::Control::Ack).unwrap());
    for i in 0..200_000u32 {
        xadd.arg(format!("f{i}")).arg("x");
    }
    let wide: String = xadd.query_async(&mut conn).await.unwrap();
    let after = add(
        &mut conn,
        "wide-many",
        &sluice_fixture_control::Control::Ack,
    )
    .await;
    let dead = wait_dead_letters(&conn, "wide-many", 1).await;
    let reason = reason_of_origin(&dead, &wide);
    assert!(
        reason.contains("over max_entry_bytes") && reason.contains("fields were not read"),
        "{reason}"
    );
    host.event(T, "the entry after it", |e| {
        e.id == after && e.kind == EventKind::Acked
    })
    .await;
    host.stop().await.unwrap();
}

/// A producer's own `sluice-*` fields on an entry that is dead-lettered do not pass for the
/// host's: in the dead letter they go in under `producer:<name>`, so a reader that keeps the
/// first `sluice-reason` or `sluice-origin-id` reads the host's (before, the producer's came
/// first and won); the API gives the producer its fields back as it wrote them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_reserved_fields_do_not_pass_for_the_hosts_in_a_dead_letter() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, Sub::fixture("forge")).await;
    let admin = host.admin().await;
    let id: String = redis::cmd("XADD")
        .arg("forge")
        .arg("*")
        .arg("payload")
        .arg(
            serde_json::to_string(&sluice_fixture_control::Control::Dead {
                reason: "declined".into(),
            })
            .unwrap(),
        )
        .arg("sluice-reason")
        .arg("all good")
        .arg("sluice-origin-id")
        .arg("1-1")
        .arg("producer:x")
        .arg("y")
        .query_async(&mut conn)
        .await
        .unwrap();
    let dead = wait_dead_letters(&conn, "forge", 1).await;
    let fields = &dead[0].1;
    assert_eq!(field(fields, "sluice-reason"), Some("declined"));
    assert_eq!(field(fields, "sluice-origin-id"), Some(id.as_str()));
    assert_eq!(field(fields, "producer:sluice-reason"), Some("all good"));
    assert_eq!(field(fields, "producer:producer:x"), Some("y"));
    let (code, body) = http_get(admin, "/v1/subscriptions/forge/g/dead-letters").await;
    assert_eq!(code, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let own = listed["items"][0]["fields"].to_string();
    for pair in [
        r#"["sluice-reason","all good"]"#,
        r#"["sluice-origin-id","1-1"]"#,
        r#"["producer:x","y"]"#,
    ] {
        assert!(own.contains(pair), "{pair} in {own}");
    }
    host.stop().await.unwrap();
}
