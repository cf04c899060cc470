//! Running Sluice in production: metrics that match what happened, readiness that follows
//! Redis and names the subscription that cannot read, `sluice status`, and a graceful shutdown
//! that drains in-flight deliveries and says what it could not finish.

use std::time::Duration;

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// The value of the sample line starting with `series` (name and labels).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_acks_retries_dead_letters_and_traps() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        TestConfig::of(
            Sub::fixture("m")
                .set("max_retries", 1)
                .set(
                    "failure_backoff",
                    Raw(r#"{ initial = "100ms", max = "1s" }"#),
                )
                .delayed("m.delayed"),
        ),
    )
    .await;
    let admin = host.admin().await;
    for payload in [
        Control::Ack,
        Control::Ack,
        Control::Retry { ms: 100, times: 1 },
        Control::Dead {
            reason: "no".into(),
        },
        Control::Trap,
    ] {
        add(&mut conn, "m", &payload).await;
    }
    let (mut acks, mut dead) = (0, 0);
    while acks < 3 || dead < 2 {
        let event = host.event(T, "every outcome", |_| true).await;
        match event.kind {
            EventKind::Acked => acks += 1,
            EventKind::DeadLettered { .. } => dead += 1,
            _ => {}
        }
    }
    let (status, metrics) = http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let labels = r#"stream="m",group="g""#;
    for (outcome, expected) in [
        ("ack", 3.0),
        ("retry", 1.0),
        ("dead_letter", 1.0),
        ("trap", 2.0),
    ] {
        let series = format!(r#"sluice_deliveries_total{{{labels},outcome="{outcome}"}}"#);
        assert_eq!(
            sample(&metrics, &series),
            Some(expected),
            "{series} in:\n{metrics}"
        );
    }
    assert_eq!(
        sample(
            &metrics,
            &format!("sluice_deliveries_total{{{labels},outcome=\"limit\"}}")
        ),
        None
    );
    assert_eq!(
        sample(&metrics, &format!("sluice_dead_letter_entries{{{labels}}}")),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, &format!("sluice_pending_entries{{{labels}}}")),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, &format!("sluice_consumer_lag{{{labels}}}")),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, &format!("sluice_parked_entries{{{labels}}}")),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, &format!("sluice_in_flight{{{labels}}}")),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("sluice_handler_duration_seconds_count{{{labels}}}")
        ),
        Some(7.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("sluice_retry_lateness_seconds_count{{{labels}}}")
        ),
        Some(2.0),
        "{metrics}"
    );
    assert!(
        sample(&metrics, &format!("sluice_sweep_moved_sum{{{labels}}}")) >= Some(2.0),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("sluice_handler_info{{{labels},digest=\"")),
        "{metrics}"
    );
    assert!(metrics.trim_end().ends_with("# EOF"), "OpenMetrics text");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_redis_and_the_host_reconnects_by_itself() {
    let mut redis = Redis::start();
    let mut host = start_fixture(&redis, TestConfig::of(Sub::fixture("r"))).await;
    let admin = host.admin().await;
    assert_eq!(http_get(admin, "/healthz").await.0, 200);
    assert_eq!(
        http_get(admin, "/readyz").await,
        (200, "ready\n".to_owned())
    );
    redis.server.stop();
    let body = wait_for(T, "readyz to turn 503", || async move {
        let (status, body) = http_get(admin, "/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        body.contains("stream `r`") && body.contains("unreachable"),
        "{body}"
    );
    assert_eq!(
        http_get(admin, "/healthz").await.0,
        200,
        "alive even when not ready"
    );
    redis.server.restart().unwrap();
    wait_for(T, "readyz to turn 200", || async move {
        (http_get(admin, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    let mut conn = redis.conn().await;
    let id = add(&mut conn, "r", &Control::Ack).await;
    host.event(T, "an entry after Redis came back", |e| e.id == id)
        .await;
    let (_, metrics) = http_get(admin, "/metrics").await;
    let reconnects = sample(
        &metrics,
        r#"sluice_redis_reconnects_total{stream="r",group="g"}"#,
    );
    assert!(reconnects >= Some(1.0), "reconnects counted: {metrics}");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_consumers_pending_parked_and_dead_letters() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let toml = &TestConfig::of(Sub::fixture("st").delayed("st.delayed")).to_string();
    let mut host = TestHost::start(&redis, toml).await;
    let parked = add(
        &mut conn,
        "st",
        &Control::Retry {
            ms: 60000,
            times: 1,
        },
    )
    .await;
    host.event(T, "the park", |e| e.id == parked).await;
    let dead = add(&mut conn, "st", &Control::Dead { reason: "x".into() }).await;
    host.event(T, "the dead letter", |e| e.id == dead).await;
    host.stop().await.unwrap();
    add(&mut conn, "st", &Control::Ack).await;

    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", toml);
    let url = redis.url();
    let (ok, out, stderr) = run_sluice(
        &["status", path.to_str().unwrap(), "--redis", &url, "--json"],
        dir.path(),
    );
    assert!(ok, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(status["stream"], "st");
    assert_eq!(status["group"], "g");
    assert_eq!(status["pending"], 0);
    assert_eq!(status["lag"], 1, "one entry added while no host ran");
    assert_eq!(status["parked"], 1);
    let due_in = status["next_due_in_ms"].as_i64().unwrap();
    assert!((30_000..=60_000).contains(&due_in), "{due_in}");
    assert_eq!(status["dead_letter"], "st.g.dead-letter");
    assert_eq!(status["dead_letter_length"], 1);
    assert_eq!(status["consumers"][0]["name"], "c1");
    assert_eq!(status["consumers"][0]["pending"], 0);
    assert_eq!(status["handler_digest"].as_str().map(str::len), Some(64));
    let (ok, text, _) = run_sluice(
        &["status", path.to_str().unwrap(), "--redis", &url],
        dir.path(),
    );
    assert!(ok);
    assert!(
        text.contains("parked 1 in `st.delayed`") && text.contains("dead letters 1"),
        "{text}"
    );
}

/// Run `sluice` on `config`, put `slow` entries of `ms` each on its stream, wait until all are
/// in flight, send SIGTERM and wait for the exit: (exit status, log).
async fn terminate_while_busy(
    redis: &Redis,
    config: TestConfig,
    stream: &str,
    slow: u64,
    ms: u64,
) -> (std::process::ExitStatus, String) {
    let mut conn = redis.conn().await;
    let mut host = HostProcess::run(redis, config);
    for _ in 0..slow {
        add(&mut conn, stream, &Control::Slow { ms }).await;
    }
    wait_for(T, "the deliveries to be in flight", || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, stream, "g").await == slow).then_some(()) }
    })
    .await;
    host.terminate();
    let status = host.wait_exit().await;
    (status, host.log_text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_deliveries_and_exits_zero() {
    let redis = Redis::start();
    let (status, log) = terminate_while_busy(
        &redis,
        TestConfig::of(Sub::fixture("drain").set("max_in_flight", 4)),
        "drain",
        3,
        1500,
    )
    .await;
    assert!(status.success(), "exit {status:?}:\n{log}");
    assert!(log.contains("stopping: no new reads"), "{log}");
    assert!(
        log.contains("waiting for in-flight deliveries") && log.contains("in_flight=3"),
        "{log}"
    );
    assert!(log.contains("timeout_ms=10000"), "{log}");
    let mut conn = redis.conn().await;
    assert_eq!(
        pending(&mut conn, "drain", "g").await,
        0,
        "drained deliveries were acked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_that_times_out_exits_non_zero_and_leaves_entries_pending() {
    let redis = Redis::start();
    let (status, log) = terminate_while_busy(
        &redis,
        TestConfig::of(Sub::fixture("cut")).set("shutdown_timeout", "200ms"),
        "cut",
        1,
        5000,
    )
    .await;
    assert!(
        !status.success(),
        "an abandoned delivery is not a clean exit:\n{log}"
    );
    assert!(
        log.contains("shutdown timed out with 1 deliveries still in flight"),
        "{log}"
    );
    let mut conn = redis.conn().await;
    assert_eq!(
        pending(&mut conn, "cut", "g").await,
        1,
        "the abandoned entry stays pending for a restart"
    );
}

/// The deliveries finish, but Redis refuses writes (CLIENT PAUSE) so their acks cannot land
/// before the deadline: the exit says how many acks are missing, not "0 deliveries in flight".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_whose_acks_cannot_reach_redis_names_them_and_leaves_entries_pending() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("unflushed")).set("shutdown_timeout", "3s"),
    );
    add(&mut conn, "unflushed", &Control::Slow { ms: 1000 }).await;
    wait_for(T, "the delivery to be in flight", || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, "unflushed", "g").await == 1).then_some(()) }
    })
    .await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .unwrap();
    host.terminate();
    let status = host.wait_exit().await;
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let log = host.log_text();
    assert!(
        !status.success(),
        "unsent acks are not a clean exit:\n{log}"
    );
    assert!(
        log.contains("shutdown timed out with 1 acks not yet in Redis"),
        "{log}"
    );
    assert_eq!(
        pending(&mut conn, "unflushed", "g").await,
        1,
        "the entry whose ack never landed stays pending for a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_a_subscription_that_cannot_read_and_recovers() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // The stream's key holds a string: the group cannot be created, nothing can be read.
    let _: () = cmd(&mut conn, &["SET", "blocked", "not a stream"]).await;
    let mut host = start_fixture(
        &redis,
        TestConfig::of(Sub::fixture("blocked").set("max_retries", 0))
            .and(Sub::fixture("fine").set("max_retries", 0)),
    )
    .await;
    let admin = host.admin().await;
    let body = wait_for(T, "/readyz to report the subscription", || async move {
        let (status, body) = http_get(admin, "/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        body.contains("stream `blocked`") && body.contains("WRONGTYPE"),
        "{body}"
    );
    let _: () = cmd(&mut conn, &["DEL", "blocked"]).await;
    wait_for(T, "/readyz to recover", || async move {
        (http_get(admin, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    let id = add(&mut conn, "blocked", &Control::Ack).await;
    host.event(T, "an entry once the key is fixed", |e| e.id == id)
        .await;
    host.stop().await.unwrap();
}
