//! Filters and bulk jobs over 100,000 dead letters: the count of a payload filter, a job that
//! requeues every match with its progress, a second job refused while the first runs, and a
//! host SIGKILLed half-way: every dead letter is either requeued once or still a dead letter,
//! the job reads as interrupted, and a new job finishes the rest.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(120);
const N: usize = 100_000;

/// XADD `n` entries whose payloads alternate two reasons, pipelined.
async fn produce(conn: &mut redis::aio::MultiplexedConnection, stream: &str, n: usize) {
    for chunk in 0..n.div_ceil(5_000) {
        let mut pipe = redis::pipe();
        for i in chunk * 5_000..((chunk + 1) * 5_000).min(n) {
            let reason = if i % 2 == 0 { "r-even" } else { "r-odd" };
            let payload = serde_json::to_string(&Control::DeadUntilRequeued {
                reason: reason.into(),
            })
            .unwrap();
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .ignore();
        }
        let _: () = pipe.query_async(conn).await.unwrap();
    }
}

/// The ids of every entry of `stream` carrying `sluice-requeued-from`, and what they name.
async fn requeued_from(conn: &mut redis::aio::MultiplexedConnection, stream: &str) -> Vec<String> {
    let mut from = "-".to_owned();
    let mut named = Vec::new();
    loop {
        let page: Vec<(String, Vec<(String, String)>)> =
            cmd(conn, &["XRANGE", stream, &from, "+", "COUNT", "10000"]).await;
        let Some((last, _)) = page.last() else { break };
        from = format!("({last}");
        for (_, fields) in &page {
            if let Some(v) = field(fields, "sluice-requeued-from") {
                named.push(v.to_owned());
            }
        }
    }
    named
}

async fn job(admin: std::net::SocketAddr) -> serde_json::Value {
    let (code, body) = http_request(admin, "GET", "/v1/subscriptions/bulk/g/jobs", &[], b"").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// POST the requeue job of [`SPEC`]: (status, body).
async fn start_job(admin: std::net::SocketAddr) -> (u16, String) {
    let json = [("Content-Type", "application/json")];
    http_request(
        admin,
        "POST",
        "/v1/subscriptions/bulk/g/jobs",
        &json,
        SPEC.as_bytes(),
    )
    .await
}

const SPEC: &str = r#"{"of":"dead-letters","action":"requeue","filter":{"field":"/reason","value":"r-even"},"expect":50000}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_requeue_of_fifty_thousand_survives_a_sigkill_half_way() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = TestConfig::of(Sub::fixture("bulk").set("max_in_flight", 64u64));
    let dir = RunDir::new(&redis, config);
    let mut host = dir.spawn();
    let admin = host.admin_addr().await;
    produce(&mut conn, "bulk", N).await;
    let dl = dead_letter_key("bulk");
    wait_for(T, "100,000 dead letters", || {
        let mut conn = conn.clone();
        let dl = dl.clone();
        async move {
            let n: usize = cmd(&mut conn, &["XLEN", &dl]).await;
            (n >= N).then_some(())
        }
    })
    .await;
    // The count, bounded per request; complete here (100,000 is the bound).
    let (code, body) = http_request(
        admin,
        "GET",
        "/v1/subscriptions/bulk/g/matches?of=dead-letters&field=/reason&value=r-even",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let count: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(count["matches"].as_u64().unwrap() <= 50_000, "{count}");
    if count["complete"] == true {
        assert_eq!(count["matches"], 50_000, "{count}");
    }
    let (code, body) = start_job(admin).await;
    assert_eq!(code, 202, "{body}");
    // Started twice: refused while the first runs.
    let (code, body) = start_job(admin).await;
    assert_eq!(code, 409, "{body}");
    // Half-way (progress moves), the host dies.
    wait_for(T, "the job's progress past 10,000", || async {
        let j = job(admin).await;
        (j["moved"].as_u64().unwrap_or(0) >= 10_000).then_some(())
    })
    .await;
    host.kill();
    let _ = host.wait_exit().await;
    // Every dead letter is in one place: requeued once, or still a dead letter.
    let letters: Vec<(String, Vec<(String, String)>)> = dead_lettered(&mut conn, "bulk").await;
    let left: HashSet<String> = letters.iter().map(|(id, _)| id.clone()).collect();
    let named = requeued_from(&mut conn, "bulk").await;
    let unique: HashSet<&String> = named.iter().collect();
    assert_eq!(unique.len(), named.len(), "no dead letter requeued twice");
    assert!(
        named.iter().all(|id| !left.contains(id)),
        "a requeued letter is gone from the dead letters"
    );
    assert_eq!(left.len() + named.len(), N, "nothing lost, nothing doubled");
    assert!(
        named.len() >= 10_000 && named.len() < 50_000,
        "{} requeued",
        named.len()
    );
    // A new host: the job reads as interrupted once its lease lapses, and a new one finishes it.
    let mut again = dir.spawn();
    let admin = again.admin_addr().await;
    wait_for(T, "the job read as interrupted", || async {
        (job(admin).await["state"] == "interrupted").then_some(())
    })
    .await;
    let (code, body) = start_job(admin).await;
    assert_eq!(code, 202, "{body}");
    let done = wait_for(T, "the second job done", || async {
        let j = job(admin).await;
        (j["state"] == "done").then_some(j)
    })
    .await;
    let named = requeued_from(&mut conn, "bulk").await;
    assert_eq!(named.len(), 50_000, "every match requeued once: {done}");
    assert_eq!(named.iter().collect::<HashSet<_>>().len(), 50_000);
    let letters = dead_lettered(&mut conn, "bulk").await;
    assert_eq!(letters.len(), 50_000, "the others stay");
    let (code, body) = http_request(admin, "GET", "/v1/audit?limit=10", &[], b"").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("job: requeue dead letters matching /reason"),
        "{body}"
    );
    again.terminate();
    let _ = again.wait_exit().await;
}

/// Pending entries are filtered and counted by their payload too (a consumer that died holds
/// them); no job acts on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_entries_are_counted_by_payload_and_not_acted_on() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "pend", "g", "$").await;
    for n in 0..6 {
        let payload = format!(r#"{{"mode":"ack","customer":"c{}"}}"#, n % 2);
        let _: String = cmd(&mut conn, &["XADD", "pend", "*", "payload", &payload]).await;
    }
    read_as(&mut conn, "gone-pod", "pend", ">").await;
    let mut host = start_fixture(&redis, Sub::fixture("pend")).await;
    let admin = host.admin().await;
    let (code, body) = http_request(
        admin,
        "GET",
        "/v1/subscriptions/pend/g/matches?of=pending&field=/customer&value=c1",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let count: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(count["matches"], 3, "{count}");
    assert_eq!(count["complete"], true);
    let (code, body) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/pend/g/jobs",
        &[("Content-Type", "application/json")],
        br#"{"of":"pending","action":"delete"}"#,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    host.stop().await.unwrap();
}

/// Schedule `n` entries for later on `stream`'s delayed set `set`: all due at one time when
/// `same`, else each at its own.
async fn park_many(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    set: &str,
    n: u64,
    same: bool,
) {
    use sluice_host::control::operate::schedule::{self, Target, When};
    let target = Target {
        stream,
        group: "g",
        set,
        ttl: None,
    };
    let fields = [(b"payload".to_vec(), br#"{"mode":"ack","k":"x"}"#.to_vec())];
    for i in 0..n {
        let ahead = if same { 3_600_000 } else { 3_600_000 + i * 7 };
        schedule::schedule(
            conn,
            target,
            When::In(Duration::from_millis(ahead)),
            &fields,
        )
        .await
        .unwrap();
    }
}

async fn job_of(admin: std::net::SocketAddr, stream: &str) -> serde_json::Value {
    let path = format!("/v1/subscriptions/{stream}/g/jobs");
    let (code, body) = http_request(admin, "GET", &path, &[], b"").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn run_job(admin: std::net::SocketAddr, stream: &str, spec: &str) -> serde_json::Value {
    let path = format!("/v1/subscriptions/{stream}/g/jobs");
    let json = [("Content-Type", "application/json")];
    let (code, body) = http_request(admin, "POST", &path, &json, spec.as_bytes()).await;
    assert_eq!(code, 202, "{body}");
    wait_for(T, "the job ended", || async {
        let j = job_of(admin, stream).await;
        (j["running"] == false && j["state"] != "running").then_some(j)
    })
    .await
}

/// A job on parked entries leaves none behind, whether they share one due time or each has
/// its own (the listing's cursor counts positions, and the job removes what it passed: before
/// the fix, 128 of 300 alike and 7 of 1,000 were left, the job saying "done"); a requeue job
/// ends even when every requeued entry fails again (it walks the dead letters there were when
/// it began); and a job can be stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_leave_no_match_behind_end_on_their_own_and_can_be_stopped() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = TestConfig::of(Sub::fixture("alike").delayed("alike.delayed"))
        .and(
            Sub::fixture("apart")
                .set("group", "g")
                .delayed("apart.delayed"),
        )
        .and(Sub::fixture("again").set("group", "g"));
    let mut host = start_fixture(&redis, config).await;
    let admin = host.admin().await;
    park_many(&mut conn, "alike", "alike.delayed", 300, true).await;
    park_many(&mut conn, "apart", "apart.delayed", 1_000, false).await;
    let delete = r#"{"of":"parked","action":"delete"}"#;
    let done = run_job(admin, "alike", delete).await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["moved"], 300, "{done}");
    assert_eq!(parked(&mut conn, "alike.delayed").await, 0);
    let done = run_job(admin, "apart", delete).await;
    assert_eq!(done["moved"], 1_000, "{done}");
    assert_eq!(parked(&mut conn, "apart.delayed").await, 0);
    // Dead letters that fail again when requeued: the job requeues each once and ends.
    for _ in 0..300 {
        add(
            &mut conn,
            "again",
            &Control::Dead {
                reason: "still broken".into(),
            },
        )
        .await;
    }
    wait_dead_letters(&conn, "again", 300).await;
    let done = run_job(
        admin,
        "again",
        r#"{"of":"dead-letters","action":"requeue"}"#,
    )
    .await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["moved"], 300, "{done}");
    // Stopped: a delete of 20,000 parked entries asked to stop at once.
    park_many(&mut conn, "apart", "apart.delayed", 20_000, false).await;
    let json = [("Content-Type", "application/json")];
    let (code, body) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/apart/g/jobs",
        &json,
        delete.as_bytes(),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let (code, body) =
        http_request(admin, "DELETE", "/v1/subscriptions/apart/g/jobs", &[], b"").await;
    assert!(code == 200 || code == 404, "{code} {body}");
    let ended = wait_for(T, "the job ended", || async {
        let j = job_of(admin, "apart").await;
        (j["running"] == false).then_some(j)
    })
    .await;
    if code == 200 {
        assert_eq!(ended["state"], "cancelled", "{ended}");
        assert!(
            parked(&mut conn, "apart.delayed").await > 0,
            "stopped before the end"
        );
    }
    host.stop().await.unwrap();
}
