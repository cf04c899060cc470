//! The scaling signal (`GET /v1/scaling`, `sluice scaler`, the two Prometheus series): entries
//! in every state against a real Redis, a parked retry the signal sees 5 s ahead and then as
//! one entry due, the lead that wakes a deployment before it, with no host running; and who may
//! read it.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(30);
const READ_TOKEN: &str = "read-only-token-0c8e2f6a4d1b9e7c3a5f";

/// `sluice scaler`'s address, from its log line.
async fn scaler_addr(p: &HostProcess) -> SocketAddr {
    wait_for(T, "sluice scaler's log line", || {
        let text = p.log_text();
        async move {
            text.lines()
                .find(|l| l.contains("sluice scaler listening"))
                .and_then(|l| l.split("addr=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|a| a.parse().ok())
        }
    })
    .await
}

/// The signal, read with `token`.
async fn signal(addr: SocketAddr, query: &str, token: &str) -> serde_json::Value {
    let auth = format!("Bearer {token}");
    let (code, body) = http_request(
        addr,
        "GET",
        &format!("/v1/scaling?{query}"),
        &[("Authorization", &auth)],
        b"",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// A private file holding `secret`, for a config's `..._file` key.
pub fn secret_file(dir: &std::path::Path, name: &str, secret: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, secret).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signal_sees_a_parked_retry_coming_and_then_due_with_no_host_running() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "scale";
    let secrets = tempfile::tempdir().unwrap();
    let read = secret_file(secrets.path(), "read-token", READ_TOKEN);
    let config = TestConfig::of(Sub::fixture(stream).delayed("scale.delayed"))
        .set("admin_read_token_file", read.as_str());
    // The scaler first: it reads Redis alone, whatever runs.
    let dir = RunDir::new(&redis, config.clone());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = redis.url();
    let scaler = HostProcess::spawn(
        &[
            "scaler",
            "--listen",
            &listen,
            "--redis",
            &url,
            "sluice.toml",
        ],
        dir.path(),
    );
    let addr = scaler_addr(&scaler).await;
    // A host parks one retry due in 5 s and stops: nothing runs from here on.
    let mut host = start_fixture(&redis, config).await;
    let parked = add(
        &mut conn,
        stream,
        &Control::Retry {
            ms: 5_000,
            times: 1,
        },
    )
    .await;
    host.event(T, "the park", |e| e.id == parked).await;
    let admin = host.admin().await;
    let on_host = signal(admin, "lead=10s", TEST_TOKEN).await;
    host.stop().await.unwrap();
    // Two entries pending to a consumer that died, three nobody read.
    for _ in 0..2 {
        add(&mut conn, stream, &Control::Ack).await;
    }
    read_as(&mut conn, "dead-pod", stream, ">").await;
    for _ in 0..3 {
        add(&mut conn, stream, &Control::Ack).await;
    }
    let first = signal(addr, "lead=10s", READ_TOKEN).await;
    let row = &first["subscriptions"][0];
    assert_eq!(row["stream"], stream);
    assert_eq!(row["group"], "g");
    assert_eq!(row["unread"], 3, "{first}");
    assert_eq!(row["pending"], 2, "{first}");
    assert_eq!(row["due"], 0, "{first}");
    assert_eq!(first["needs_host_now"], 5, "{first}");
    let next = first["next_due_seconds"]
        .as_f64()
        .expect("a retry is parked");
    assert!(next > 0.0 && next <= 5.0, "about 5 s ahead: {first}");
    assert_eq!(first["wake"], 6, "due within the lead: one more: {first}");
    // The host's own endpoint said the same of the parked retry.
    let host_next = on_host["next_due_seconds"].as_f64().expect("parked");
    assert!(host_next > next - 0.5 && host_next <= 5.0, "{on_host}");
    // A lead shorter than the time left wakes nothing more.
    let short = signal(addr, "lead=100ms&list=false", READ_TOKEN).await;
    if short["next_due_seconds"].as_f64().unwrap() > 0.1 {
        assert_eq!(short["wake"], 5, "{short}");
    }
    assert!(short.get("subscriptions").is_none(), "list=false: {short}");
    // Once due, with nobody to sweep it: one entry due, needing a host.
    let due = wait_for(T, "the parked retry due", || async {
        let now = signal(addr, "", READ_TOKEN).await;
        (now["needs_host_now"] == 6).then_some(now)
    })
    .await;
    assert_eq!(due["subscriptions"][0]["due"], 1, "{due}");
    assert_eq!(due["next_due_seconds"], 0.0, "{due}");
    // The Prometheus series say the same.
    let (code, _) = http_request_bare(addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(code, 401, "the series name every stream: behind the token");
    let auth = format!("Bearer {READ_TOKEN}");
    let (code, metrics) =
        http_request(addr, "GET", "/metrics", &[("Authorization", &auth)], b"").await;
    assert_eq!(code, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_scaling_needs_host_now{")
                && l.contains("stream=\"scale\"")
                && l.ends_with(" 6")),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_scaling_next_due_seconds{"),
        "{metrics}"
    );
    // Without a token, or with a wrong one, nothing.
    let (code, _) = http_request_bare(addr, "GET", "/v1/scaling", &[], b"").await;
    assert_eq!(code, 401);
    let (code, _) = http_request(
        addr,
        "GET",
        "/v1/scaling",
        &[("Authorization", "Bearer nope")],
        b"",
    )
    .await;
    assert_eq!(code, 401);
    let (code, body) = http_request(
        addr,
        "GET",
        "/v1/scaling?lead=2d",
        &[("Authorization", &format!("Bearer {READ_TOKEN}"))],
        b"",
    )
    .await;
    assert_eq!(code, 400, "a lead over a day: {body}");
    drop(scaler);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_refuses_to_listen_beyond_loopback_without_a_token() {
    let redis = Redis::start();
    let dir = RunDir::new(
        &redis,
        TestConfig::of(Sub::fixture("open")).no_admin_token(),
    );
    let url = redis.url();
    let (ok, _, err) = run_sluice(
        &[
            "scaler",
            "--listen",
            "0.0.0.0:0",
            "--redis",
            &url,
            "sluice.toml",
        ],
        dir.path(),
    );
    assert!(!ok);
    assert!(
        err.contains("beyond loopback") && err.contains("admin_read_token_file"),
        "{err}"
    );
}

/// A Redis that stops answering makes its subscriptions count as unanswered within seconds
/// (each one wakes the deployment), not as the last reading: an autoscaler must not take a
/// deployment to zero on what Redis said before it went away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_stops_answering_wakes_rather_than_reads_as_idle() {
    let redis = Redis::start();
    let mut host = start_fixture(&redis, Sub::fixture("frozen").delayed("frozen.delayed")).await;
    let admin = host.admin().await;
    let quiet = signal(admin, "list=false", TEST_TOKEN).await;
    assert_eq!(quiet["wake"], 0, "{quiet}");
    let pid = redis.server.pid().expect("the test's redis-server") as i32;
    // SIGSTOP the redis-server this test started (by its PID), and SIGCONT it after.
    let _ = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status();
    let woke = wait_for(T, "the frozen Redis counted", || async {
        let now = signal(admin, "list=false", TEST_TOKEN).await;
        (now["unanswered"] == 1 && now["wake"] == 1).then_some(now)
    })
    .await;
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status();
    assert_eq!(woke["needs_host_now"], 0, "{woke}");
    host.stop().await.unwrap();
}
