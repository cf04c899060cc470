//! Hot swap through the admin API: under load every entry is handled exactly once by exactly
//! one version, the switch is clean in time, bad uploads are refused while the old version
//! keeps serving, rollback is instant, and the API guards itself.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::common::*;

const T: Duration = Duration::from_secs(60);

/// The fixture on stream `sw`, the subscription every swap test replaces the handler of.
fn sw() -> Sub {
    Sub::fixture("sw")
}

async fn put_handler(admin: std::net::SocketAddr, bytes: &[u8], query: &str) -> (u16, String) {
    http_request(
        admin,
        "PUT",
        &format!("/v1/subscriptions/sw/g/handler{query}"),
        &[],
        bytes,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_under_load_handles_every_entry_exactly_once_with_a_clean_switch() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sw()).await;
    let admin = host.admin().await;
    let v1 = std::fs::read(&guests().fixture).unwrap();
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let total = 3000;
    // Record which version handled each entry and when its delivery took that version.
    let mut events = host.events.resubscribe();
    let collector = tokio::spawn(async move {
        let mut handled = Vec::new();
        while handled.len() < total {
            match tokio::time::timeout(T, events.recv()).await {
                Ok(Ok(event)) => {
                    handled.push((event.id, event.digest.to_string(), event.started.unwrap()))
                }
                other => panic!("event stream ended: {other:?}"),
            }
        }
        handled
    });
    let producer = {
        let mut conn = redis.conn().await;
        tokio::spawn(async move {
            for i in 0..total {
                add(&mut conn, "sw", &Control::Version).await;
                if i % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    // Swap back and forth while entries flow; note when each swap was asked for and answered.
    let mut swaps: Vec<(SystemTime, SystemTime, String)> = Vec::new();
    for round in 0..10 {
        let bytes = if round % 2 == 0 { &v2 } else { &v1 };
        let asked = SystemTime::now();
        let (status, body) = put_handler(admin, bytes, "").await;
        assert_eq!(status, 200, "{body}");
        let digest = serde_json::from_str::<serde_json::Value>(&body).unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_owned();
        swaps.push((asked, SystemTime::now(), digest));
    }
    producer.await.unwrap();
    let handled = collector.await.unwrap();
    let dead = wait_for(T, "every entry dead-lettered with its version", || {
        let mut conn = conn.clone();
        async move {
            let dead = dead_lettered(&mut conn, "sw").await;
            (dead.len() >= total).then_some(dead)
        }
    })
    .await;
    assert_eq!(dead.len(), total, "no entry handled twice");
    let mut seen = HashMap::new();
    for (_, fields) in &dead {
        let origin = field(fields, "sluice-origin-id").unwrap().to_owned();
        let version = field(fields, "sluice-reason")
            .unwrap()
            .split('@')
            .next()
            .unwrap()
            .to_owned();
        assert!(
            seen.insert(origin, version).is_none(),
            "an entry was handled twice"
        );
    }
    assert_eq!(seen.len(), total);
    assert_eq!(pending(&mut conn, "sw", "g").await, 0, "none lost");
    assert!(
        seen.values().any(|v| v == "v1") && seen.values().any(|v| v == "v2"),
        "both versions ran"
    );
    // Clean in time: every delivery that took its version after a swap was answered (and
    // before the next one was asked for) ran exactly that swap's digest.
    for (i, (_, answered, digest)) in swaps.iter().enumerate() {
        let next_asked = swaps.get(i + 1).map(|s| s.0);
        for (id, used, started) in &handled {
            if started > answered && next_asked.is_none_or(|next| *started < next) {
                assert_eq!(
                    used, digest,
                    "entry {id} started after swap {i} but ran another version"
                );
            }
        }
    }
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_and_the_old_version_keeps_serving() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sw()).await;
    let admin = host.admin().await;
    let (_, listing) = http_get(admin, "/v1/subscriptions").await;
    let before: serde_json::Value = serde_json::from_str(&listing).unwrap();
    let digest = before[0]["digest"].as_str().unwrap().to_owned();

    let (status, body) = put_handler(admin, b"\0asm but not really", "").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("not a valid WebAssembly component"), "{body}");
    let other = std::fs::read(&guests().other_world).unwrap();
    let (status, body) = put_handler(admin, &other, "").await;
    assert_eq!(status, 422);
    assert!(
        body.contains("does not implement the sluice:handler/handler world"),
        "{body}"
    );
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let (status, body) = put_handler(admin, &v2[..v2.len() / 2], "").await;
    assert_eq!(status, 422, "a truncated upload is refused: {body}");

    let (_, listing) = http_get(admin, "/v1/subscriptions").await;
    let after: serde_json::Value = serde_json::from_str(&listing).unwrap();
    assert_eq!(
        after[0]["digest"],
        digest.as_str(),
        "the old version still serves"
    );
    assert_eq!(after[0]["refusals"], 3);
    assert_eq!(after[0]["swaps"], 0);
    let id = add(&mut conn, "sw", &Control::Version).await;
    let event = host
        .event(T, "an entry after the refusals", |e| e.id == id)
        .await;
    assert_eq!(event.digest.as_str(), digest.as_str());
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert!(
        metrics.contains(r#"sluice_handler_swap_refusals_total{stream="sw",group="g"} 3"#),
        "{metrics}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_restores_the_previous_digest_at_once() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sw()).await;
    let admin = host.admin().await;
    let (status, _) =
        http_request(admin, "POST", "/v1/subscriptions/sw/g/rollback", &[], b"").await;
    assert_eq!(status, 409, "nothing to roll back to yet");
    let (_, listing) = http_get(admin, "/v1/subscriptions").await;
    let v1_digest = serde_json::from_str::<serde_json::Value>(&listing).unwrap()[0]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let (status, body) = put_handler(admin, &v2, "").await;
    assert_eq!(status, 200, "{body}");
    let v2_digest = serde_json::from_str::<serde_json::Value>(&body).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(v1_digest, v2_digest);
    let id = add(&mut conn, "sw", &Control::Version).await;
    let event = host.event(T, "a v2 delivery", |e| e.id == id).await;
    assert_eq!(event.digest.as_str(), v2_digest.as_str());

    let (status, body) =
        http_request(admin, "POST", "/v1/subscriptions/sw/g/rollback", &[], b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&v1_digest), "{body}");
    let id = add(&mut conn, "sw", &Control::Version).await;
    let event = host.event(T, "a v1 delivery again", |e| e.id == id).await;
    assert_eq!(event.digest.as_str(), v1_digest.as_str());
    let (_, listing) = http_get(admin, "/v1/subscriptions").await;
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    assert_eq!(listing[0]["digest"], v1_digest.as_str());
    assert_eq!(listing[0]["previous_digest"], v2_digest.as_str());
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert!(
        metrics.contains(&format!(
            r#"sluice_handler_info{{stream="sw",group="g",digest="{v1_digest}"}} 1"#
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            r#"sluice_handler_info{{stream="sw",group="g",digest="{v2_digest}"}} 0"#
        )),
        "{metrics}"
    );
    host.stop().await.unwrap();
}

/// `component` with a custom section named `tag` appended: the same code under another digest.
fn relabelled(component: &[u8], tag: &str) -> Vec<u8> {
    assert!(tag.len() < 100);
    let mut out = component.to_vec();
    out.push(0); // a custom section
    out.push(1 + tag.len() as u8); // its size (one LEB128 byte): the name's length and the name
    out.push(tag.len() as u8);
    out.extend_from_slice(tag.as_bytes());
    out
}

async fn handler_info_series(admin: std::net::SocketAddr) -> Vec<String> {
    let (_, metrics) = http_get(admin, "/metrics").await;
    metrics
        .lines()
        .filter(|l| l.starts_with(r#"sluice_handler_info{stream="sw""#))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_keep_two_series_and_re_uploading_the_serving_component_changes_nothing() {
    let redis = Redis::start();
    let mut host = start_fixture(&redis, sw()).await;
    let admin = host.admin().await;
    let (v0, _) = current(admin).await;
    let v1 = std::fs::read(&guests().fixture_v2).unwrap();
    let (status, body) = put_handler(admin, &v1, "").await;
    assert_eq!(status, 200, "{body}");
    let (v1_digest, _) = current(admin).await;
    // Re-uploading what serves is a no-op: the rollback target stays the version before.
    let (status, body) = put_handler(admin, &v1, "").await;
    assert_eq!(status, 200, "{body}");
    let (_, listing) = http_get(admin, "/v1/subscriptions").await;
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    assert_eq!(listing[0]["digest"], v1_digest.as_str());
    assert_eq!(listing[0]["previous_digest"], v0.as_str(), "{listing}");
    assert_eq!(listing[0]["swaps"], 1, "{listing}");
    // Six more distinct uploads: only the serving and the rollback digest keep a series.
    let base = std::fs::read(&guests().fixture).unwrap();
    let mut last = String::new();
    for i in 0..6 {
        let (status, body) = put_handler(admin, &relabelled(&base, &format!("v{i}")), "").await;
        assert_eq!(status, 200, "{body}");
        last = current(admin).await.0;
    }
    let series = handler_info_series(admin).await;
    assert_eq!(series.len(), 2, "{series:?}");
    assert!(
        series
            .iter()
            .any(|l| l.contains(&last) && l.ends_with(" 1")),
        "{series:?}"
    );
    assert!(series.iter().all(|l| !l.contains(&v0)), "{series:?}");
    let (status, body) =
        http_request(admin, "POST", "/v1/subscriptions/sw/g/rollback", &[], b"").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(handler_info_series(admin).await.len(), 2);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_needs_a_token_beyond_loopback_and_caps_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let open = write_config(
        dir.path(),
        "open.toml",
        &TestConfig::of(sw())
            .set("admin", "0.0.0.0:0")
            .no_admin_token()
            .to_string(),
    );
    let (ok, _, stderr) = run_sluice(&["check", open.to_str().unwrap()], dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("beyond loopback") && stderr.contains("admin_token_file"),
        "{stderr}"
    );

    let redis = Redis::start();
    use std::os::unix::fs::PermissionsExt as _;
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-0b1f2e3d4c5a69788796a5b4c3d2e1f0\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let guarded = TestConfig::of(sw())
        .set("admin", "0.0.0.0:0")
        .set("admin_token_file", token.display().to_string())
        .set("admin_max_upload", "100KiB");
    let mut host = start_fixture(&redis, guarded).await;
    let port = host.admin().await.port();
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    assert!(v2.len() > 100 * 1024, "the fixture is bigger than the cap");
    let path = "/v1/subscriptions/sw/g/rollback";
    assert_eq!(
        http_request_bare(admin, "POST", path, &[], b"").await.0,
        401
    );
    assert_eq!(
        http_request(
            admin,
            "POST",
            path,
            &[("Authorization", "Bearer nope")],
            b""
        )
        .await
        .0,
        401
    );
    let auth = [(
        "Authorization",
        "Bearer s3cret-0b1f2e3d4c5a69788796a5b4c3d2e1f0",
    )];
    assert_eq!(
        http_request(admin, "POST", path, &auth, b"").await.0,
        409,
        "authorized, nothing to roll back"
    );
    let (status, _) =
        http_request(admin, "PUT", "/v1/subscriptions/sw/g/handler", &auth, &v2).await;
    assert_eq!(status, 413, "uploads over admin_max_upload are refused");
    assert_eq!(
        http_request_bare(admin, "GET", "/v1/subscriptions", &[], b"")
            .await
            .0,
        401,
        "with a token configured, listings need it too"
    );
    assert_eq!(
        http_request(admin, "GET", "/v1/subscriptions", &auth, b"")
            .await
            .0,
        200
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_descriptor_is_refused_unless_forced() {
    let redis = Redis::start();
    // No overrides: the subscription is the fixture's own descriptor (stream `fixture`).
    let mut host = start_fixture(&redis, Sub::as_built("{fixture}")).await;
    let admin = host.admin().await;
    let bank = std::fs::read(&guests().bank).unwrap();
    let path = "/v1/subscriptions/fixture/tests/handler";
    let (status, body) = http_request(admin, "PUT", path, &[], &bank).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("stream `bank-payments` group `billing`") && body.contains("force"),
        "{body}"
    );
    let (status, body) =
        http_request(admin, "PUT", &format!("{path}?force=true"), &[], &bank).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = http_request(
        admin,
        "PUT",
        "/v1/subscriptions/nope/tests/handler",
        &[],
        &bank,
    )
    .await;
    assert_eq!(status, 404);
    host.stop().await.unwrap();
}

/// The digest the listing reports for `sw`/`g`, and its refusal count.
async fn current(admin: std::net::SocketAddr) -> (String, u64) {
    let (_, listing) = http_get(admin, "/v1/subscriptions").await;
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    (
        listing[0]["digest"].as_str().unwrap().to_owned(),
        listing[0]["refusals"].as_u64().unwrap(),
    )
}

/// Add a `version` entry and return the version that handled it.
async fn version_of_next(
    host: &mut TestHost,
    conn: &mut redis::aio::MultiplexedConnection,
) -> String {
    let id = add(conn, "sw", &Control::Version).await;
    let event = host.event(T, "a version entry", |e| e.id == id).await;
    match event.kind {
        sluice_host::EventKind::DeadLettered { reason } => {
            reason.split('@').next().unwrap().to_owned()
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_watcher_takes_rewrites_and_renames_and_ignores_partial_writes() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("handler.wasm");
    let v1 = std::fs::read(&guests().fixture).unwrap();
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    std::fs::write(&file, &v1).unwrap();
    let mut host = start_fixture(
        &redis,
        TestConfig::of(Sub::new(&file.display().to_string(), "sw")).set("watch_interval", "100ms"),
    )
    .await;
    let admin = host.admin().await;
    let (v1_digest, _) = current(admin).await;
    assert_eq!(version_of_next(&mut host, &mut conn).await, "v1");

    // An in-place rewrite.
    std::fs::write(&file, &v2).unwrap();
    let v2_digest = wait_for(T, "the rewrite to be swapped in", || {
        let v1_digest = v1_digest.clone();
        async move {
            let (digest, _) = current(admin).await;
            (digest != v1_digest).then_some(digest)
        }
    })
    .await;
    assert_eq!(version_of_next(&mut host, &mut conn).await, "v2");

    // A partial write that stays put: checked, refused, and v2 keeps serving.
    std::fs::write(&file, &v1[..v1.len() / 3]).unwrap();
    wait_for(T, "the partial file to be refused", || async move {
        (current(admin).await.1 >= 1).then_some(())
    })
    .await;
    assert_eq!(current(admin).await.0, v2_digest);
    assert_eq!(version_of_next(&mut host, &mut conn).await, "v2");

    // An atomic rename completes the write.
    let tmp = dir.path().join("handler.wasm.tmp");
    std::fs::write(&tmp, &v1).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let v1_again = v1_digest.clone();
    wait_for(T, "the renamed file to be swapped in", || {
        let v1_digest = v1_again.clone();
        async move { (current(admin).await.0 == v1_digest).then_some(()) }
    })
    .await;
    assert_eq!(version_of_next(&mut host, &mut conn).await, "v1");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_swap_and_rollback_from_the_command_line() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sw()).await;
    let admin = format!("http://{}", host.admin().await);
    let dir = tempfile::tempdir().unwrap();
    let v2 = guests().fixture_v2.to_str().unwrap().to_owned();
    let (cwd, a) = (dir.path().to_owned(), admin.clone());
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        run_sluice(
            &["swap", "sw", &v2, "--admin", &a, "--token", TEST_TOKEN],
            &cwd,
        )
    })
    .await
    .unwrap();
    assert!(ok, "{err}");
    assert!(out.starts_with("swapped `sw`/`g` to "), "{out}");
    assert_eq!(version_of_next(&mut host, &mut conn).await, "v2");
    let (cwd, a) = (dir.path().to_owned(), admin.clone());
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        run_sluice(
            &[
                "swap",
                "--rollback",
                "sw",
                "--admin",
                &a,
                "--token",
                TEST_TOKEN,
            ],
            &cwd,
        )
    })
    .await
    .unwrap();
    assert!(ok, "{err}");
    assert!(out.starts_with("rolled `sw`/`g` back to "), "{out}");
    assert_eq!(version_of_next(&mut host, &mut conn).await, "v1");
    let (cwd, a) = (dir.path().to_owned(), admin.clone());
    let (ok, _, err) = tokio::task::spawn_blocking(move || {
        run_sluice(
            &[
                "swap", "nope", "x.wasm", "--admin", &a, "--token", TEST_TOKEN,
            ],
            &cwd,
        )
    })
    .await
    .unwrap();
    assert!(
        !ok && err.contains("no subscription to stream `nope`"),
        "{err}"
    );
    host.stop().await.unwrap();
}

/// The issue's load shape: every permit held by slow deliveries on v1 when v2 arrives. Before
/// instances waited for a pool slot, the new version's first attempts failed with the pool's
/// concurrency limit and counted as traps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_under_full_load_costs_no_attempt() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Added before the host starts, so its first read takes all four at once.
    for _ in 0..4 {
        add(&mut conn, "sw", &Control::Slow { ms: 3000 }).await;
    }
    let mut host = start_fixture(&redis, sw().set("max_in_flight", 4).set("max_retries", 0)).await;
    let admin = host.admin().await;
    wait_for(T, "four slow deliveries in flight", || async move {
        let (_, metrics) = http_get(admin, "/metrics").await;
        metrics
            .contains(r#"sluice_in_flight{stream="sw",group="g"} 4"#)
            .then_some(())
    })
    .await;
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let (status, body) = put_handler(admin, &v2, "").await;
    assert_eq!(status, 200, "{body}");
    let mut last = String::new();
    for _ in 0..12 {
        last = add(&mut conn, "sw", &Control::Ack).await;
    }
    wait_acked(&conn, "sw", "g", &last).await;
    let (_, metrics) = http_get(admin, "/metrics").await;
    for failed in ["trap", "limit", "dead_letter"] {
        assert!(
            !metrics.contains(&format!(
                r#"sluice_deliveries_total{{stream="sw",group="g",outcome="{failed}"}}"#
            )),
            "{failed}: {metrics}"
        );
    }
    assert_eq!(dead_lettered(&mut conn, "sw").await.len(), 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_export_that_waits_is_timed_out_everywhere() {
    // The hang build's subscription() sleeps an hour in WASI: a host call, where epoch
    // interruption cannot stop it. `check` must fail, the watcher must refuse it and take a
    // good file after it, and SIGTERM must end the process within shutdown_timeout.
    let hang = guests().fixture_hang.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "hang.toml",
        &TestConfig::of(Sub::new(&hang, "hang")).to_string(),
    );
    let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("subscription() export did not return within 5s"),
        "{stderr}"
    );

    let redis = Redis::start();
    let file = dir.path().join("handler.wasm");
    let v1 = std::fs::read(&guests().fixture).unwrap();
    let v2 = std::fs::read(&guests().fixture_v2).unwrap();
    let hung = std::fs::read(&guests().fixture_hang).unwrap();
    std::fs::write(&file, &v1).unwrap();
    let config = TestConfig::of(Sub::new(&file.display().to_string(), "sw"))
        .set("watch_interval", "100ms")
        .set("shutdown_timeout", "5s");
    let mut host = HostProcess::run(&redis, config);
    let admin = host.admin_addr().await;
    let (v1_digest, _) = current(admin).await;
    std::fs::write(&file, &hung).unwrap();
    wait_for(T, "the waiting component to be refused", || async move {
        (current(admin).await.1 >= 1).then_some(())
    })
    .await;
    assert_eq!(current(admin).await.0, v1_digest);
    // The refusal is counted before its log line is written: wait for the line.
    wait_for(T, "the log to say why the component was refused", || {
        let said = host.log_text().contains("did not return within 5s");
        async move { said.then_some(()) }
    })
    .await;
    // The watcher is not wedged: a good file after it is taken.
    std::fs::write(&file, &v2).unwrap();
    wait_for(T, "v2 to be swapped in", || {
        let v1_digest = v1_digest.clone();
        async move { (current(admin).await.0 != v1_digest).then_some(()) }
    })
    .await;
    // A stop while the watcher waits in the export: the process still ends.
    std::fs::write(&file, &hung).unwrap();
    wait_for(T, "the watcher to start the swap", || {
        let log = host.log_text();
        async move { (log.matches("component file changed; swapping").count() >= 3).then_some(()) }
    })
    .await;
    host.terminate();
    let status = host.wait_exit().await;
    assert!(status.success(), "{status:?}: {}", host.log_text());
    assert!(
        host.log_text()
            .contains("the swap in progress is abandoned"),
        "{}",
        host.log_text()
    );
}

/// A component whose one core function nests `loops` loops over `locals` locals: compile
/// time grows with the square of their product (300 × 300, 4.7 KB, once took 33 s).
fn compile_bomb(loops: usize, locals: usize) -> Vec<u8> {
    let mut body = String::new();
    for _ in 0..loops {
        body.push_str("(loop ");
        for l in 0..locals.min(2) {
            body.push_str(&format!(
                "(local.set {l} (i32.add (local.get {l}) (i32.const 1))) "
            ));
        }
    }
    body.push_str(&")".repeat(loops));
    let text = format!(
        "(component (core module (func (export \"f\") (local {}) {body})))",
        "i32 ".repeat(locals)
    );
    wat::parse_str(&text).expect("a valid component")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_bomb_is_refused_by_its_shape_before_it_is_compiled() {
    let redis = Redis::start();
    let mut host = start_fixture(&redis, sw()).await;
    let admin = host.admin().await;
    let (digest, refusals) = current(admin).await;
    let bomb = compile_bomb(300, 300);
    assert!(bomb.len() < 8 << 10, "a small file: {} bytes", bomb.len());
    let (status, body) = put_handler(admin, &bomb, "").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("nests loops more than 64 deep"), "{body}");
    // Shallower, with more locals: the product is what counts.
    let (status, body) = put_handler(admin, &compile_bomb(40, 3000), "").await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("nests loops 40 deep over 3000 locals"),
        "{body}"
    );
    assert_eq!(current(admin).await, (digest, refusals + 2));
    // A shape within the bounds goes on to the compiler process, and is then refused for
    // what it is (not a handler).
    let (status, body) = put_handler(admin, &compile_bomb(8, 64), "").await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("does not implement the sluice:handler/handler world"),
        "{body}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_compile_kills_the_compiler_process() {
    // A Python component compiles for seconds; the host is stopped while its compiler child
    // runs: the host exits and the child dies with it, by PID.
    let python = polyglot().python.clone();
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("handler.wasm");
    std::fs::copy(&guests().fixture, &file).unwrap();
    let config = TestConfig::of(Sub::new(&file.display().to_string(), "sw"))
        .set("watch_interval", "100ms")
        .set("cache_dir", "fresh-cache")
        .set("shutdown_timeout", "5s");
    let mut host = HostProcess::run(&redis, config);
    host.admin_addr().await;
    let tmp = dir.path().join("handler.wasm.tmp");
    std::fs::copy(&python, &tmp).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let compiler = wait_for(T, "the compiler process", || {
        let found = children_of(host.pid())
            .into_iter()
            .find(|(_, cmd)| cmd.contains("__compile"))
            .map(|(pid, _)| pid);
        async move { found }
    })
    .await;
    host.terminate();
    let status = host.wait_exit().await;
    assert!(status.success(), "{status:?}: {}", host.log_text());
    wait_for(T, "the compiler process to be gone", || async move {
        let gone = match std::fs::read_to_string(format!("/proc/{compiler}/stat")) {
            Err(_) => true,
            // A zombie waiting for its reaper is gone too.
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z')),
        };
        gone.then_some(())
    })
    .await;
}
