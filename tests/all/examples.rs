//! The bank-payments example in its four forms (Rust macro, Rust manual, Python, JavaScript)
//! behaves the same, against the demo's real payment gateway over HTTP: a small payment is charged, a large one times out at
//! the gateway, is parked for 30 s and charged on its retry, a zero one is declined and
//! dead-lettered, and an undecodable one is dead-lettered with the reason.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(20);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Run one form on its own stream, against its own demo gateway; returns what happened to the
/// (small, large, declined, bad) payments.
async fn run_form(redis: &Redis, component: &str, stream: &str) -> Vec<(String, u32, String)> {
    let mut conn = redis.conn().await;
    // The demo's gateway holds large payments for 500 ms after it first sees them; the
    // handler gives up on a charge after 1 s (room for a loaded CI machine).
    let gateway = start_gateway().await;
    let config = Sub::new(&format!("{{{component}}}"), stream)
        .unset("group")
        .unset("consumer")
        .delayed(&format!("{stream}.delayed"))
        .set(
            "allowed_outbound_hosts",
            Raw(&format!(r#"["http://{gateway}"]"#)),
        )
        .value("gateway_url", &format!("http://{gateway}"))
        .value("gateway_timeout_ms", "1000");
    let mut host = start_fixture(redis, config).await;
    let created = now_ms();
    let payment = |id: &str, cents: u64| serde_json::json!({"id": id, "account": "acct-1", "amount_cents": cents, "currency": "EUR", "created_at_ms": created});
    let small = add(&mut conn, stream, &payment("small", 1_000)).await;
    let large = add(&mut conn, stream, &payment("large", 500_000)).await;
    let declined = add(&mut conn, stream, &payment("declined", 0)).await;
    let bad = add(&mut conn, stream, &serde_json::json!({"id": "bad"})).await;
    // JSON nested deeper than any decoder recurses: undecodable, dead-lettered (not retried).
    let nested = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
    let deep: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("payload")
        .arg(&nested)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut describe = |label: &str, e: &sluice_host::Event| {
        let kind = match &e.kind {
            EventKind::Acked => "acked".to_owned(),
            EventKind::Parked { delay, .. } => format!("parked {}s", delay.as_secs()),
            EventKind::DeadLettered { reason } => format!("dead: {reason}"),
            EventKind::RetryPending { .. } => "pending".to_owned(),
            EventKind::OtherGroupsRetry { group } => format!("another group's ({group})"),
            EventKind::Duplicate { of } => format!("duplicate of {of}"),
        };
        seen.push((label.to_owned(), e.retry_count, kind));
    };
    for _ in 0..5 {
        let e = host.event(T, "the first attempts", |_| true).await;
        let label = if e.id == small {
            "small"
        } else if e.id == large {
            "large"
        } else if e.id == declined {
            "declined"
        } else if e.id == bad {
            "bad"
        } else if e.id == deep {
            "deep"
        } else {
            "?"
        };
        describe(label, &e);
    }
    // The charge timed out after 1 s, so the gateway's 500 ms hold is over: bring the 30 s
    // retry forward by moving its due time in Redis, instead of waiting 30 s.
    let members: Vec<Vec<u8>> = cmd(
        &mut conn,
        &["ZRANGE", &format!("{stream}.delayed"), "0", "-1"],
    )
    .await;
    assert_eq!(members.len(), 1, "only the large payment is parked");
    let _: i64 = redis::cmd("ZADD")
        .arg(format!("{stream}.delayed"))
        .arg("XX")
        .arg(0)
        .arg(&members[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = host.event(T, "the retry", |e| e.retry_count == 1).await;
    describe("large", &e);
    host.stop().await.unwrap();
    seen.sort();
    seen
}

/// What happened, with the reason of the undecodable payment cut to what every language says
/// alike (serde adds the position, Python and JavaScript name their own type).
fn comparable(seen: &[(String, u32, String)]) -> Vec<(String, u32, String)> {
    seen.iter()
        .map(|(label, retries, what)| {
            let what = if label == "bad" {
                assert!(
                    what.contains("undecodable payload: field `payload` is not a valid")
                        && what.contains("missing field `account`"),
                    "{what}"
                );
                "dead: undecodable, missing field `account`".to_owned()
            } else if label == "deep" {
                assert!(
                    what.starts_with("dead: undecodable payload: field `payload`"),
                    "{what}"
                );
                "dead: undecodable".to_owned()
            } else {
                what.clone()
            };
            (label.clone(), *retries, what)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_form_and_language_behaves_the_same() {
    let redis = Redis::start();
    let macro_form = run_form(&redis, "bank", "bank-macro").await;
    let manual_form = run_form(&redis, "bank_manual", "bank-manual").await;
    let python = run_form(&redis, "bank_python", "bank-python").await;
    let js = run_form(&redis, "bank_js", "bank-js").await;
    assert_eq!(macro_form, manual_form);
    assert_eq!(comparable(&macro_form), comparable(&python), "Python");
    assert_eq!(comparable(&macro_form), comparable(&js), "JavaScript");
    assert_eq!(macro_form.len(), 6);
    assert!(
        macro_form.contains(&("small".into(), 0, "acked".into())),
        "{macro_form:?}"
    );
    assert!(
        macro_form.contains(&("large".into(), 0, "parked 30s".into())),
        "{macro_form:?}"
    );
    assert!(
        macro_form.contains(&("large".into(), 1, "acked".into())),
        "{macro_form:?}"
    );
    let (_, _, declined) = macro_form.iter().find(|(l, _, _)| l == "declined").unwrap();
    assert!(
        declined.contains("declined the charge: 400") && declined.contains("must be positive"),
        "{declined}"
    );
}

#[test]
fn the_js_sdk_checks_required_fields_by_their_own_names() {
    // `in` would take inherited names (`constructor`) as present fields.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk/js/test/decode.mjs");
    let out = std::process::Command::new("node")
        .arg(&script)
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
