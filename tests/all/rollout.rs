//! Safe rollout: a canary that every host of the group runs and judges through Redis (a bad
//! candidate rolled back within its window with nothing lost or doubled, a good one promoted,
//! two hosts agreeing, a restarted host resuming it, a forged record ignored), and dead letters
//! replayed against a candidate without writing anything.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use sluice_fixture_control::Control;

const T: Duration = Duration::from_secs(60);

fn by_version(v1: Control, v2: Control) -> Control {
    Control::ByVersion {
        v1: Box::new(v1),
        v2: Box::new(v2),
    }
}

async fn put_canary(admin: std::net::SocketAddr, stream: &str, query: &str) -> (u16, String) {
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    http_request(
        admin,
        "PUT",
        &format!("/v1/subscriptions/{stream}/g/canary?{query}"),
        &[],
        &v2,
    )
    .await
}

async fn canary_state(admin: std::net::SocketAddr, stream: &str) -> serde_json::Value {
    let (status, body) = http_get(admin, &format!("/v1/subscriptions/{stream}/g/canary")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The verdict of the canary on `stream`, once there is one.
async fn verdict(admin: std::net::SocketAddr, stream: &str, within: Duration) -> serde_json::Value {
    wait_for(within, "the canary's verdict", || async move {
        let state = canary_state(admin, stream).await;
        (!state["verdict"].is_null()).then_some(state)
    })
    .await
}

/// A producer adding an entry the handler acknowledges every 5 ms to `stream` until `stop`.
async fn acks_until(
    redis: &Redis,
    stream: &'static str,
    stop: &tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut conn = redis.conn().await;
    let stop = stop.clone();
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            add(&mut conn, stream, &Control::Ack).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

async fn serving(admin: std::net::SocketAddr) -> String {
    let (_, listing) = http_get(admin, "/v1/subscriptions").await;
    let list: serde_json::Value = serde_json::from_str(&listing).unwrap();
    list[0]["digest"].as_str().unwrap().to_owned()
}

/// A candidate that traps on every entry, under load: rolled back long before its window
/// ends, on the evidence of its own attempts; the incumbent handles everything after; every
/// entry is acknowledged exactly once (none lost, none doubled); the log of the flow, the API
/// and the metrics say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_traps_is_rolled_back_and_nothing_is_lost_or_doubled() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("cb").set(
            "failure_backoff",
            Raw("{ initial = \"200ms\", max = \"200ms\" }"),
        ),
    )
    .await;
    let admin = host.admin().await;
    let v1 = serving(admin).await;
    let total = 3000;
    let mut events = host.events.resubscribe();
    let incumbent = v1.clone();
    let collector = tokio::spawn(async move {
        let v1 = incumbent;
        let mut acked: HashMap<String, u32> = HashMap::new();
        let mut on_candidate_failed = 0u32;
        let mut on_candidate_acked = 0u32;
        while acked.len() < total {
            let event = match tokio::time::timeout(T, events.recv()).await {
                Ok(Ok(event)) => event,
                other => panic!("event stream ended: {other:?}"),
            };
            let candidate = event.digest.as_str() != v1;
            match event.kind {
                sluice_host::EventKind::Acked => {
                    *acked.entry(event.origin_id).or_default() += 1;
                    if candidate {
                        on_candidate_acked += 1;
                    }
                }
                sluice_host::EventKind::RetryPending { .. } if candidate => {
                    on_candidate_failed += 1;
                }
                _ => {}
            }
        }
        (acked, on_candidate_failed, on_candidate_acked)
    });
    // Load before, during and after the canary.
    let producer = {
        let mut conn = redis.conn().await;
        tokio::spawn(async move {
            for i in 0..total {
                add(&mut conn, "cb", &by_version(Control::Ack, Control::Trap)).await;
                if i % 20 == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        })
    };
    let (status, body) = put_canary(admin, "cb", "percent=20&for=5m&by=ops").await;
    assert_eq!(status, 200, "{body}");
    let started: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(started["share_percent"], 20.0);
    // A second canary while this one runs is refused, through the API and `sluice swap`.
    let (status, body) = put_canary(admin, "cb", "percent=5").await;
    assert_eq!(status, 409, "{body}");
    let swap = |extra: &[&str]| {
        let mut args = vec![
            "swap".to_owned(),
            "cb".to_owned(),
            "--admin".to_owned(),
            format!("http://{admin}"),
            "--token".to_owned(),
            TEST_TOKEN.to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_sluice(&args, Path::new("."))
        })
    };
    let v2 = guests().fixture_v2.display().to_string();
    let (ok, _, err) = swap(&[&v2, "--canary", "5%", "--for", "1m"]).await.unwrap();
    assert!(!ok && err.contains("a canary of"), "{err}");
    let state = verdict(admin, "cb", T).await;
    assert_eq!(state["verdict"]["verdict"], "rolled-back", "{state}");
    let why = state["verdict"]["why"].as_str().unwrap();
    assert!(why.contains("failure rate"), "{why}");
    assert!(
        state["candidate"]["failures"].as_u64().unwrap() > 0,
        "{state}"
    );
    assert!(
        state["incumbent"]["attempts"].as_u64().unwrap() > 0,
        "{state}"
    );
    // Judged on its attempts, long before the window's end.
    let decided = humantime::parse_rfc3339(state["verdict"]["at"].as_str().unwrap()).unwrap();
    let began = humantime::parse_rfc3339(started["started"].as_str().unwrap()).unwrap();
    assert!(
        decided.duration_since(began).unwrap() < Duration::from_secs(30),
        "{state}"
    );
    producer.await.unwrap();
    let (acked, failed, candidate_acked) = collector.await.unwrap();
    assert!(failed > 0, "the candidate ran and trapped");
    assert_eq!(candidate_acked, 0, "the candidate acknowledged nothing");
    assert_eq!(acked.len(), total, "every entry acknowledged");
    assert!(
        acked.values().all(|n| *n == 1),
        "an entry was acknowledged twice"
    );
    assert_eq!(pending(&mut conn, "cb", "g").await, 0, "none lost");
    assert_eq!(dead_lettered(&mut conn, "cb").await.len(), 0);
    assert_eq!(serving(admin).await, v1, "the incumbent serves");
    let (ok, _, err) = swap(&["--abort-canary"]).await.unwrap();
    assert!(!ok && err.contains("no canary runs"), "{err}");
    // Why, in the flow journal and the metrics.
    let (_, journal) = http_get(admin, "/v1/subscriptions/cb/g/journal").await;
    assert!(journal.contains("canary rolled back"), "{journal}");
    assert!(journal.contains("canary started"), "{journal}");
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert!(
        metrics.contains(
            "sluice_canary_verdicts_total{stream=\"cb\",group=\"g\",verdict=\"rolled_back\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_canary_deliveries_total{stream=\"cb\",group=\"g\",version=\"candidate\",result=\"failure\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("sluice_canary_share_basis_points{stream=\"cb\",group=\"g\"} 0"));
    host.stop().await.unwrap();
}

/// A good candidate on two hosts of one group, one of them restarted mid-canary: every
/// delivery ran the version the entry's origin id picks (on either host, across the restart),
/// the restarted host joined the running canary, and when the window passed both hosts
/// promoted the candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_candidate_is_promoted_by_every_host_and_a_restarted_host_resumes_it() {
    let redis = Redis::start();
    // What is tested is the promotion on every host, not the candidate's speed: a loaded
    // machine (both cores building) once made the freshly compiled candidate's first
    // deliveries 11.6 ms at p99 against the warm incumbent's 0.7, past the default slack.
    let sub = |consumer: &str| {
        Sub::fixture("cg")
            .set("consumer", consumer)
            .set("canary", Raw("{ min_deliveries = 20, p99_slack = \"1s\" }"))
    };
    let mut a = start_fixture(&redis, sub("a")).await;
    let mut b = start_fixture(&redis, sub("b")).await;
    let admin_a = a.admin().await;
    let admin_b = b.admin().await;
    let v1 = serving(admin_a).await;
    let stop_producing = tokio_util::sync::CancellationToken::new();
    let producer = acks_until(&redis, "cg", &stop_producing).await;
    let (status, body) = put_canary(admin_a, "cg", "percent=50&for=30s").await;
    assert_eq!(status, 200, "{body}");
    let record: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = record["id"].as_str().unwrap().to_owned();
    let from = record["eligible_from_ms"].as_u64().unwrap();
    let v2 = record["candidate"].as_str().unwrap().to_owned();
    let ends = humantime::parse_rfc3339(record["ends"].as_str().unwrap()).unwrap();
    // Both hosts run it: each reports a share.
    for admin in [admin_a, admin_b] {
        wait_for(T, "the host joins the canary", || async move {
            let (_, metrics) = http_get(admin, "/metrics").await;
            metrics
                .contains("sluice_canary_share_basis_points{stream=\"cg\",group=\"g\"} 5000")
                .then_some(())
        })
        .await;
    }
    // Restart host b mid-canary: the new one joins what runs.
    b.stop().await.unwrap();
    let mut b = start_fixture(&redis, sub("b")).await;
    let admin_b = b.admin().await;
    wait_for(T, "the restarted host joins the canary", || async move {
        let (_, metrics) = http_get(admin_b, "/metrics").await;
        metrics
            .contains("sluice_canary_share_basis_points{stream=\"cg\",group=\"g\"} 5000")
            .then_some(())
    })
    .await;
    assert!(
        std::time::SystemTime::now() < ends,
        "the restart happened within the window"
    );
    // Every delivery during the canary ran the version its origin id picks, on both hosts:
    // those added before `eligible_from` the incumbent, the others by the hash.
    let mut on_candidate = 0;
    for host in [&mut a, &mut b] {
        let mut eligible = 0;
        while eligible < 40 {
            let event = host.event(T, "a delivery", |_| true).await;
            assert!(
                event.started.is_some_and(|s| s < ends),
                "deliveries checked within the window"
            );
            let picked = sluice_host::handler::takes(&id, 5000, from, &event.origin_id);
            let ran = event.digest.as_str() == v2;
            assert!(ran || event.digest.as_str() == v1);
            assert_eq!(
                picked, ran,
                "entry {} ran the other version",
                event.origin_id
            );
            let added: u64 = event.origin_id.split('-').next().unwrap().parse().unwrap();
            if added >= from {
                eligible += 1;
                on_candidate += u32::from(ran);
            }
        }
    }
    assert!(on_candidate > 0, "the candidate ran");
    let state = verdict(admin_b, "cg", T).await;
    assert_eq!(state["verdict"]["verdict"], "promoted", "{state}");
    for admin in [admin_a, admin_b] {
        let v2 = &v2;
        wait_for(T, "the host serves the candidate", || async move {
            (serving(admin).await == *v2).then_some(())
        })
        .await;
    }
    // Promoted: every new delivery runs the candidate.
    let after = a
        .event(T, "a delivery after the promotion", |e| {
            e.started.is_some_and(|s| s > std::time::SystemTime::now()) || e.digest.as_str() == v2
        })
        .await;
    assert_eq!(after.digest.as_str(), v2);
    stop_producing.cancel();
    producer.await.unwrap();
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// A host of the group that cannot run the candidate (here its `admin_max_upload` is below the
/// candidate's size: a config rolling out) ends the canary for every host, with why, before
/// it runs any entry the candidate would take: a canary runs on every host or on none, so no
/// entry picked for the candidate runs the incumbent on one host while the others run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_cannot_join_ends_the_canary_for_every_host() {
    let redis = Redis::start();
    let sub = |consumer: &str| {
        Sub::fixture("cj")
            .set("consumer", consumer)
            .set("canary", Raw("{ min_deliveries = 20 }"))
    };
    let candidate_kib = std::fs::metadata(&guests().fixture_v2).unwrap().len() / 1024;
    let mut a = start_fixture(&redis, sub("a")).await;
    let mut b = start_fixture(
        &redis,
        TestConfig::of(sub("b")).set("admin_max_upload", format!("{}KiB", candidate_kib / 2)),
    )
    .await;
    let admin_a = a.admin().await;
    let admin_b = b.admin().await;
    let v1 = serving(admin_a).await;
    let stop_producing = tokio_util::sync::CancellationToken::new();
    let producer = acks_until(&redis, "cj", &stop_producing).await;
    let (status, body) = put_canary(admin_a, "cj", "percent=50&for=5m").await;
    assert_eq!(status, 200, "{body}");
    let record: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = record["id"].as_str().unwrap().to_owned();
    let from = record["eligible_from_ms"].as_u64().unwrap();
    let state = verdict(admin_a, "cj", T).await;
    let why = state["verdict"]["why"].as_str().unwrap();
    assert_eq!(state["verdict"]["verdict"], "rolled-back", "{state}");
    assert!(
        why.contains("b could not join") && why.contains("admin_max_upload"),
        "{why}"
    );
    let ended = humantime::parse_rfc3339(state["verdict"]["at"].as_str().unwrap()).unwrap();
    // On host b, the first entry the candidate would have taken ran after the canary ended,
    // on the incumbent: held until then, never run while host a ran others on the candidate.
    let first = b
        .event(T, "an entry picked for the candidate, on host b", |e| {
            sluice_host::handler::takes(&id, 5000, from, &e.origin_id)
        })
        .await;
    assert_eq!(first.digest.as_str(), v1);
    assert!(
        first.started.is_some_and(|s| s >= ended),
        "entry {} ran on host b at {:?}, before the canary ended at {ended:?}",
        first.origin_id,
        first.started
    );
    // Both hosts serve the incumbent, and every entry is handled.
    for admin in [admin_a, admin_b] {
        assert_eq!(serving(admin).await, v1);
    }
    stop_producing.cancel();
    producer.await.unwrap();
    let mut conn = redis.conn().await;
    wait_for(T, "every entry acknowledged", || {
        let mut conn = conn.clone();
        async move {
            let group = sluice_host::store::inspect::group(&mut conn, "cj", "g")
                .await
                .unwrap()?;
            (group.pending == 0 && group.lag == Some(0)).then_some(())
        }
    })
    .await;
    assert!(dead_lettered(&mut conn, "cj").await.is_empty());
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// A client that can read and write Redis, and holds nothing else, cannot make the hosts run
/// a component of its own: it reads the stream's secret there and seals a record with it as
/// the earlier release did (100 % to its component, a verdict "promoted" beside it), and the
/// host serves the current version and says why. A host without a rollout key refuses to start
/// a canary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_writer_cannot_make_the_hosts_run_its_component() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // A delayed set gives the stream its secret in Redis.
    let mut host = start_fixture(&redis, Sub::fixture("cf").delayed("cf-parked")).await;
    let admin = host.admin().await;
    let v1 = serving(admin).await;
    let secret: String = redis::cmd("GET")
        .arg(sluice_host::store::keys::secret_key("cf"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let digest = sluice_host::support::digest::Digest::of(&v2).to_string();
    let _: () = redis::cmd("SET")
        .arg(sluice_host::store::keys::component_key("cf", &digest))
        .arg(&v2)
        .query_async(&mut conn)
        .await
        .unwrap();
    let id = "0123456789abcdef0123456789abcdef";
    let body = serde_json::json!({
        "id": id, "stream": "cf", "group": "g",
        "candidate": digest, "incumbent": v1, "share_bp": 10000, "started_ms": 0,
        "ends_ms": u64::MAX / 2, "by": "attacker",
        "thresholds": { "failure_rate_increase": 1.0, "dead_letter_rate_increase": 1.0,
            "retry_rate_increase": 1.0, "p99_ratio": 1000.0, "p99_slack_ms": 0, "min_deliveries": 1 }
    })
    .to_string();
    // The seal the earlier release checked: a keyed hash under the stream's secret, which any
    // Redis client computes.
    let seal: String = redis::cmd("EVAL")
        .arg("return redis.sha1hex(ARGV[1] .. redis.sha1hex(ARGV[1] .. cmsgpack.pack({'canary', ARGV[2], ARGV[3], ARGV[4]})))")
        .arg(0)
        .arg(&secret)
        .arg("cf")
        .arg("g")
        .arg(&body)
        .query_async(&mut conn)
        .await
        .unwrap();
    let forged = serde_json::json!({ "body": body, "seal": seal }).to_string();
    let promoted = serde_json::json!({ "id": id, "verdict": "promoted", "why": "", "at_ms": 1,
        "by": "attacker" })
    .to_string();
    let _: () = redis::cmd("HSET")
        .arg(sluice_host::store::keys::flow_key("cf", "g"))
        .arg("canary")
        .arg(&forged)
        .arg("canary-verdict")
        .arg(&promoted)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("INCR")
        .arg(sluice_host::store::keys::FLOW_EPOCH)
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..50 {
        add(&mut conn, "cf", &Control::Version).await;
    }
    let dead = wait_dead_letters(&conn, "cf", 50).await;
    assert!(
        dead.iter()
            .all(|(_, f)| field(f, "sluice-reason").unwrap().starts_with("v1@")),
        "only the serving version ran"
    );
    assert_eq!(serving(admin).await, v1);
    let state = canary_state(admin, "cf").await;
    assert!(state["record"].is_null(), "{state}");
    assert!(
        state["refused"].as_str().unwrap().contains("rollout key"),
        "{state}"
    );
    host.stop().await.unwrap();

    // Without a rollout key (no token, open on loopback), a canary is refused, saying why.
    let mut open = start_fixture(
        &redis,
        TestConfig::of(Sub::fixture("cn")).set("admin_open_on_loopback", Raw("true")),
    )
    .await;
    let (status, body) = put_canary(open.admin().await, "cn", "percent=10").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("rollout_key_file"), "{body}");
    open.stop().await.unwrap();
}

/// The id of the canary a start's answer describes.
fn started_id(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The flow hash's verdict field, as Redis holds it.
async fn verdict_field(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
) -> Option<String> {
    redis::cmd("HGET")
        .arg(sluice_host::store::keys::flow_key(stream, "g"))
        .arg("canary-verdict")
        .query_async(conn)
        .await
        .unwrap()
}

async fn write_verdict_field(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    value: Option<&str>,
) {
    let key = sluice_host::store::keys::flow_key(stream, "g");
    let _: () = match value {
        Some(value) => redis::cmd("HSET")
            .arg(&key)
            .arg("canary-verdict")
            .arg(value)
            .query_async(conn)
            .await
            .unwrap(),
        None => redis::cmd("HDEL")
            .arg(&key)
            .arg("canary-verdict")
            .query_async(conn)
            .await
            .unwrap(),
    };
    let _: () = redis::cmd("INCR")
        .arg(sluice_host::store::keys::FLOW_EPOCH)
        .query_async(conn)
        .await
        .unwrap();
}

/// Only a host's sealed verdict counts, and a canary's life goes one way: a "promoted" written
/// by hand beside a failing candidate is read past (the candidate is rolled back on its
/// counts, the hand-written verdict replaced); an aborted canary's verdict deleted or replaced
/// by hand is written back by the host, which never runs the candidate again; the candidate's
/// bytes leave Redis with the verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_sealed_verdict_counts_and_an_ended_canary_stays_ended() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("cv").set("canary", Raw("{ min_deliveries = 5 }")),
    )
    .await;
    let admin = host.admin().await;
    let v1 = serving(admin).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = {
        let mut conn = redis.conn().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let failing = by_version(
                Control::Ack,
                Control::Dead {
                    reason: "v2 bug".into(),
                },
            );
            while !stop.is_cancelled() {
                add(&mut conn, "cv", &failing).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let (status, body) = put_canary(admin, "cv", "percent=50&for=10m").await;
    assert_eq!(status, 200, "{body}");
    let id = started_id(&body);
    let promoted = serde_json::json!({ "id": id, "verdict": "promoted", "why": "by hand",
        "at_ms": 1, "by": "attacker" })
    .to_string();
    write_verdict_field(&mut conn, "cv", Some(&promoted)).await;
    let state = canary_state(admin, "cv").await;
    assert_eq!(state["running"], true, "{state}");
    assert!(
        state["verdict_refused"].as_str().unwrap().contains("seal"),
        "{state}"
    );
    let state = verdict(admin, "cv", T).await;
    assert_eq!(state["verdict"]["verdict"], "rolled-back", "{state}");
    assert!(
        state["verdict"]["why"]
            .as_str()
            .unwrap()
            .contains("dead-letter rate"),
        "{state}"
    );
    assert_eq!(serving(admin).await, v1);
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let digest = sluice_host::support::digest::Digest::of(&v2).to_string();
    let bytes_key = sluice_host::store::keys::component_key("cv", &digest);
    let checker = conn.clone();
    let exists = move |key: String| {
        let mut conn = checker.clone();
        async move {
            redis::cmd("EXISTS")
                .arg(key)
                .query_async::<u8>(&mut conn)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        exists(bytes_key.clone()).await,
        0,
        "the candidate's bytes went with the verdict"
    );

    // A second canary, aborted by the operator.
    let (status, body) = put_canary(admin, "cv", "percent=50&for=10m").await;
    assert_eq!(status, 200, "{body}");
    let id = started_id(&body);
    let (status, body) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/cv/g/canary/abort",
        &[],
        b"",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        verdict_field(&mut conn, "cv").await.is_some(),
        "the abort's verdict"
    );
    assert_eq!(
        exists(bytes_key).await,
        0,
        "the candidate's bytes went with the abort"
    );
    // Deleted by hand, then replaced by a hand-written "promoted": each time a host writes a
    // sealed "rolled back" back (the one that saw the abort, or one that finds it cannot join
    // a candidate whose bytes are gone), and runs nothing on the candidate.
    let promoted = serde_json::json!({ "id": id, "verdict": "promoted", "why": "by hand",
        "at_ms": 1, "by": "attacker" })
    .to_string();
    for forged in [None, Some(promoted.as_str())] {
        write_verdict_field(&mut conn, "cv", forged).await;
        let id = &id;
        wait_for(
            T,
            "a sealed rolled-back verdict written back",
            || async move {
                let state = canary_state(admin, "cv").await;
                (state["record"]["id"] == id.as_str()
                    && state["verdict"]["verdict"] == "rolled-back"
                    && state["verdict_refused"].is_null())
                .then_some(())
            },
        )
        .await;
    }
    let mut markers = Vec::new();
    for _ in 0..20 {
        markers.push(add(&mut conn, "cv", &Control::Version).await);
    }
    let dead = wait_for(T, "the markers dead-lettered", || {
        let mut conn = conn.clone();
        let markers = markers.clone();
        async move {
            let dead = dead_lettered(&mut conn, "cv").await;
            let found = markers
                .iter()
                .filter(|m| {
                    dead.iter()
                        .any(|(_, f)| field(f, "sluice-origin-id") == Some(m.as_str()))
                })
                .count();
            (found == markers.len()).then_some(dead)
        }
    })
    .await;
    for marker in &markers {
        let reason = reason_of_origin(&dead, marker);
        assert!(reason.starts_with("v1@"), "{marker}: {reason}");
    }
    assert_eq!(
        canary_state(admin, "cv").await["verdict"]["verdict"],
        "rolled-back"
    );
    stop.cancel();
    producer.await.unwrap();
    host.stop().await.unwrap();
}

/// Every key of the Redis and its `DUMP`: what a dry run must leave as it was.
async fn dump_all(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(conn).await.unwrap();
    let mut all = std::collections::BTreeMap::new();
    for key in keys {
        let dumped: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(conn)
            .await
            .unwrap();
        all.insert(key, dumped);
    }
    all
}

/// `sluice replay` over 1,000 dead letters and a few that call out over HTTP: the counts per
/// answer are right entry by entry, outbound HTTP is denied (the subscription's grant does not
/// apply), and Redis is byte for byte what it was; `--requeue-acked` is refused while the
/// candidate does not serve, and with `--swap` requeues exactly the dead letters it acked,
/// which the candidate then acknowledges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reports_what_the_candidate_would_do_and_writes_nothing() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let sub = || {
        Sub::fixture("rp")
            .delayed("rp-parked")
            .set("allowed_outbound_hosts", Raw(r#"["http://127.0.0.1:9"]"#))
            .set("max_entry_bytes", "64KiB")
    };
    let host = start_fixture(&redis, sub()).await;
    let dead = |reason: &str| Control::Dead {
        reason: reason.to_owned(),
    };
    let mut expected: HashMap<String, &str> = HashMap::new();
    for i in 0..1000 {
        let (control, kind) = match i % 10 {
            0..5 => (by_version(dead("v1 bug"), Control::Ack), "ack"),
            5 | 6 => (
                by_version(
                    dead("v1 bug"),
                    Control::Retry {
                        ms: 1500,
                        times: 99,
                    },
                ),
                "retry",
            ),
            7 | 8 => (by_version(dead("v1 bug"), dead("still bad")), "dead-letter"),
            _ => (by_version(dead("v1 bug"), Control::Trap), "fail"),
        };
        expected.insert(add(&mut conn, "rp", &control).await, kind);
    }
    // Too big to give a handler: dead-lettered unhandled, and never given to a candidate.
    let _: String = redis::cmd("XADD")
        .arg("rp")
        .arg("*")
        .arg("payload")
        .arg(serde_json::to_string(&Control::Ack).unwrap())
        .arg("pad")
        .arg("x".repeat(100_000))
        .query_async(&mut conn)
        .await
        .unwrap();
    // Dead-lettered before the entries that call out, which are then the newest dead letters.
    wait_dead_letters(&conn, "rp", 1001).await;
    let mut calls_out = Vec::new();
    for _ in 0..5 {
        let http = Control::Http {
            url: "http://127.0.0.1:9/charge".to_owned(),
            body: String::new(),
            timeout_ms: 0,
            traceparent: String::new(),
        };
        calls_out.push(add(&mut conn, "rp", &http).await);
    }
    wait_dead_letters(&conn, "rp", 1006).await;
    host.stop().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "sluice.toml",
        &TestConfig::of(sub()).to_string(),
    );
    let before = dump_all(&mut conn).await;
    assert!(
        before.contains_key("rp") && before.contains_key(&dead_letter_key("rp")),
        "{:?}",
        before.keys()
    );
    let v2 = guests().fixture_v2.display().to_string();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_sluice(&args, Path::new("."))
        })
    };
    let args = |candidate: &str, extra: &[&str]| {
        let mut all = vec![
            "replay".to_owned(),
            config.display().to_string(),
            "--candidate".to_owned(),
            candidate.to_owned(),
            "--redis".to_owned(),
            redis.url(),
        ];
        all.extend(extra.iter().map(|a| (*a).to_owned()));
        all
    };
    let (ok, out, err) = run(args(
        &v2,
        &["--limit", "1000", "--reason", "v1 bug", "--json"],
    ))
    .await
    .unwrap();
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let report = &report[0];
    assert_eq!(report["summary"]["ack"], 500, "{}", report["summary"]);
    assert_eq!(report["summary"]["retry"], 200);
    assert_eq!(report["summary"]["dead_letter"], 200);
    assert_eq!(report["summary"]["fail"], 100);
    assert_eq!(report["summary"]["skip"], 0);
    assert_eq!(report["summary"]["more"], false);
    let items = report["items"].as_array().unwrap();
    assert_eq!(items.len(), 1000);
    let mut acked = std::collections::HashSet::new();
    for item in items {
        let origin = item["origin_id"].as_str().unwrap();
        assert_eq!(item["would"], expected[origin], "{item}");
        if item["would"] == "retry" {
            assert_eq!(item["retry_after_ms"], 1500);
        }
        if item["would"] == "dead-letter" {
            assert_eq!(item["dead_letter_reason"], "still bad");
        }
        if item["would"] == "ack" {
            acked.insert(item["id"].as_str().unwrap().to_owned());
        }
    }
    // The serving version on the dead letters that call out: denied, not sent.
    let fixture = guests().fixture.display().to_string();
    let (ok, out, err) = run(args(&fixture, &["--limit", "5", "--json"]))
        .await
        .unwrap();
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report[0]["summary"]["http_denied"], 5, "{out}");
    for item in report[0]["items"].as_array().unwrap() {
        assert!(calls_out.contains(&item["origin_id"].as_str().unwrap().to_owned()));
        assert!(
            item["describe"].as_str().unwrap().contains("denied")
                || item["describe"].as_str().unwrap().contains("allowed"),
            "{item}"
        );
    }
    assert!(
        before == dump_all(&mut conn).await,
        "a replay wrote to Redis"
    );

    // Requeue what it acked: refused while v1 serves, done with --swap.
    let mut host = start_fixture(&redis, sub()).await;
    let admin = format!("http://{}", host.admin().await);
    let requeue = |swap: bool| {
        let mut extra = vec![
            "--limit",
            "1000",
            "--reason",
            "v1 bug",
            "--requeue-acked",
            "--admin",
            admin.as_str(),
            "--token",
            TEST_TOKEN,
        ];
        if swap {
            extra.push("--swap");
        }
        args(&v2, &extra)
    };
    let (ok, _, err) = run(requeue(false)).await.unwrap();
    assert!(!ok && err.contains("is not what"), "{err}");
    assert_eq!(
        dead_lettered(&mut conn, "rp").await.len(),
        1006,
        "nothing requeued"
    );
    let (ok, out, err) = run(requeue(true)).await.unwrap();
    assert!(ok, "{err}");
    assert!(
        out.contains("requeued 500 acknowledged dead letter(s)"),
        "{out}"
    );
    let left = dead_lettered(&mut conn, "rp").await;
    assert_eq!(left.len(), 506);
    assert!(
        left.iter().all(|(id, _)| !acked.contains(id)),
        "exactly the acked ones went"
    );
    // The candidate, serving now, acknowledges them.
    let mut handled = std::collections::HashSet::new();
    while handled.len() < 500 {
        let event = host
            .event(T, "a requeued entry acknowledged", |e| {
                matches!(e.kind, sluice_host::EventKind::Acked)
            })
            .await;
        assert!(expected.get(&event.origin_id) == Some(&"ack"), "{event:?}");
        handled.insert(event.origin_id);
    }
    assert_eq!(dead_lettered(&mut conn, "rp").await.len(), 506);
    host.stop().await.unwrap();
}

/// The judge (the report script, in Redis) on counts drawn at random with a fixed seed: a
/// candidate as good as the incumbent is never rolled back by chance, though it is judged at
/// every report through its window; one that fails on every attempt is rolled back within a
/// handful; counts another writer spoiled (not integers) neither stop the judging nor hide a
/// failing candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_rolls_back_a_failing_candidate_and_not_an_equal_one_by_chance() {
    use sluice_host::control::rollout::canary::{self, Outcome, Reported};
    use sluice_host::control::rollout::key::{Origin, RolloutKey};
    use sluice_host::handler::Tally;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let starter = conn.clone();
    let key = RolloutKey::derive(TEST_TOKEN, Origin::AdminToken);
    let starting_key = key.clone();
    let v1 = std::fs::read(&guests().fixture).unwrap();
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let start = |stream: String| {
        let (v1, v2) = (v1.clone(), v2.clone());
        let mut conn = starter.clone();
        let key = starting_key.clone();
        async move {
            canary::start(
                &mut conn,
                &key,
                canary::Start {
                    stream: &stream,
                    group: "g",
                    bytes: &v2,
                    candidate: sluice_host::support::digest::Digest::of(&v2).as_str(),
                    incumbent: sluice_host::support::digest::Digest::of(&v1).as_str(),
                    share_bp: 1_000,
                    window: Duration::from_secs(3600),
                    thresholds: (&sluice_host::config::Canary::default()).into(),
                    by: "the test",
                },
            )
            .await
            .unwrap()
        }
    };
    // xorshift64*: the same draws on every run.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut draw = move |n: u64, p: f64| {
        (0..n)
            .filter(|_| {
                seed ^= seed >> 12;
                seed ^= seed << 25;
                seed ^= seed >> 27;
                ((seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64) < p
            })
            .count() as u64
    };
    let tally = |attempts: u64, failures: u64| Tally {
        attempts,
        failures,
        buckets: vec![(40, attempts)],
        ..Tally::default()
    };
    // 100 canaries of an equal candidate (5 % failures on both), 100 attempts against 900
    // over 50 reports, the last one at the window's end.
    let mut rolled_back = Vec::new();
    for run in 0..100 {
        let record = start(format!("equal{run}")).await;
        for look in 0..50 {
            let mut judged = record.clone();
            if look == 49 {
                judged.ends_ms = judged.started_ms;
            }
            let (inc, can) = (tally(18, draw(18, 0.05)), tally(2, draw(2, 0.05)));
            match canary::report(&mut conn, &key, &judged, ("the test", b""), (&inc, &can))
                .await
                .unwrap()
            {
                Reported::Running => {}
                Reported::Decided { verdict, .. } => {
                    if verdict.outcome == Outcome::RolledBack {
                        rolled_back.push(verdict.why);
                    }
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(
        rolled_back.is_empty(),
        "equal candidates rolled back: {rolled_back:?}"
    );
    // A candidate that fails on every attempt, after counts were spoiled by another writer.
    // Every report adds to the incumbent's attempts: a field there that is not an integer made
    // each report fail. (A writer that sets the incumbent's failures as high as its attempts
    // hides the candidate's: the same accepted risk as a forged verdict, docs/design/rollout.md.)
    for spoil in [None, Some("abc"), Some("-5"), Some("1.5")] {
        let record = start(format!("failing-{spoil:?}")).await;
        if let Some(value) = spoil {
            let key = sluice_host::store::keys::canary_key(&record.stream, "g");
            redis::cmd("HSET")
                .arg(&key)
                .arg("id")
                .arg(&record.id)
                .arg("i:attempts")
                .arg(value)
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
        }
        let mut attempts = 0;
        let verdict = loop {
            attempts += 1;
            assert!(
                attempts <= 20,
                "{spoil:?}: still running after 20 failed attempts"
            );
            match canary::report(
                &mut conn,
                &key,
                &record,
                ("the test", b""),
                (&tally(9, 0), &tally(1, 1)),
            )
            .await
            .unwrap()
            {
                Reported::Running => {}
                Reported::Decided { verdict, .. } => break verdict,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            verdict.outcome,
            Outcome::RolledBack,
            "{spoil:?}: {}",
            verdict.why
        );
        assert!(verdict.why.contains("failure rate"), "{}", verdict.why);
        assert!(
            attempts <= 10,
            "{spoil:?}: rolled back after {attempts} failed attempts"
        );
    }
    // How few failed attempts roll a candidate back, as the book says: 1 once the incumbent
    // has 135 clean attempts, 2 once it has 64, 4 once it has 31; one clean attempt fewer and
    // the same failures do not.
    for (failed, clean) in [(1, 135), (2, 64), (4, 31)] {
        for (incumbent, expected) in [(clean - 1, None), (clean, Some(Outcome::RolledBack))] {
            let record = start(format!("trap-{failed}-{incumbent}")).await;
            let reported = canary::report(
                &mut conn,
                &key,
                &record,
                ("the test", b""),
                (&tally(incumbent, 0), &tally(failed, failed)),
            )
            .await
            .unwrap();
            let outcome = match reported {
                Reported::Running => None,
                Reported::Decided { verdict, .. } => Some(verdict.outcome),
                other => panic!("{other:?}"),
            };
            assert_eq!(
                outcome, expected,
                "{failed} failed against {incumbent} clean"
            );
        }
    }
}
