//! The admin API as an attacker on the operator's machine sees it: mutations need the token on
//! loopback too, DNS rebinding and cross-site requests are refused, oversized and concurrent
//! uploads are cut off before they are read, idle connections cannot lock out the probes, and
//! the token itself is guarded.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_admin_calls_need_a_token_even_on_loopback() {
    let redis = Redis::start();
    let mut host = start_fixture(
        &redis,
        TestConfig::of(Sub::fixture("open").set("max_retries", 0)).no_admin_token(),
    )
    .await;
    let admin = host.admin().await;
    // Without a token, the host's own session key is asked for (see the page's test).
    let (status, body) =
        http_request_bare(admin, "POST", "/v1/subscriptions/open/g/rollback", &[], b"").await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        http_request_bare(admin, "GET", "/v1/subscriptions", &[], b"")
            .await
            .0,
        200,
        "without a token the listing stays readable on loopback"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_rebinding_csrf_and_oversized_bodies_before_reading_them() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = Redis::start();
    let mut host = start_fixture(&redis, Sub::fixture("guarded").set("max_retries", 0)).await;
    let admin = host.admin().await;
    let rollback = "/v1/subscriptions/guarded/g/rollback";
    // DNS rebinding: a page on evil.example whose name now points at 127.0.0.1.
    let (status, _) = http_request(admin, "POST", rollback, &[("Host", "evil.example")], b"").await;
    assert_eq!(status, 421);
    // CSRF: a simple cross-origin form post, even with the right token.
    let (status, _) = http_request(
        admin,
        "POST",
        rollback,
        &[
            ("Origin", "https://evil.example"),
            ("Content-Type", "text/plain"),
        ],
        b"x",
    )
    .await;
    assert_eq!(status, 403);
    // A wrong token with a 60 MiB body declared but never sent, and the right token with a
    // body over admin_max_upload (64 MiB): both answered at once, before any body is read.
    let right = format!("Bearer {TEST_TOKEN}");
    for (auth, length, expected) in [
        ("Bearer nope", 60 << 20, "401"),
        (right.as_str(), 100 << 20, "413"),
    ] {
        let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
        let head = format!(
            "PUT /v1/subscriptions/guarded/g/handler HTTP/1.1\r\nHost: {admin}\r\nAuthorization: {auth}\r\nContent-Length: {length}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{expected}: not answered before the body"))
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {expected}")),
            "{answer}"
        );
    }
    host.stop().await.unwrap();
}

#[test]
fn a_world_readable_token_file_and_a_token_over_plain_http_are_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, _, err) = run_sluice(
        &[
            "swap",
            "s",
            "--rollback",
            "--token-file",
            token.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(!ok && err.contains("readable by every user"), "{err}");
    let (ok, _, err) = run_sluice(
        &[
            "swap",
            "s",
            "--rollback",
            "--token",
            "s3cret",
            "--admin",
            "http://192.0.2.1:9187",
        ],
        dir.path(),
    );
    assert!(!ok && err.contains("over plain HTTP"), "{err}");
}

/// Eight uploads that declare a large body and send part of it: one is read, the rest are
/// refused at once, so the host never buffers more than one upload.
/// 80 TCP connections that send nothing (more than the admin server serves at once) and as
/// many sending their headers a byte at a time: `/healthz`, `/readyz` and `/metrics` still
/// answer, the connections idle longest are closed for the new ones, and one that never sends
/// a request is closed after the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_cannot_lock_out_the_probes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = Redis::start();
    let mut host = start_fixture(&redis, Sub::fixture("idle")).await;
    let admin = host.admin().await;
    let mut idle = Vec::new();
    for _ in 0..80 {
        idle.push(tokio::net::TcpStream::connect(admin).await.unwrap());
    }
    let mut slow = Vec::new();
    for _ in 0..80 {
        let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHo")
            .await
            .unwrap();
        slow.push(stream);
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, body) = tokio::time::timeout(T, http_get(admin, path))
            .await
            .unwrap_or_else(|_| panic!("{path} does not answer while 160 connections are held"));
        assert_eq!(status, 200, "{path}: {body}");
    }
    // The first connections were closed for later ones: reading them ends.
    let mut first = idle.remove(0);
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(T, first.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    drop((idle, slow));
    // A lone connection that says nothing is closed after the header timeout.
    let mut lone = tokio::net::TcpStream::connect(admin).await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10) + T, lone.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_partial_uploads_are_refused_beyond_one() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = Redis::start();
    let mut host = start_fixture(&redis, Sub::fixture("uploads").set("max_retries", 0)).await;
    let admin = host.admin().await;
    let mut streams = Vec::new();
    for _ in 0..8 {
        let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
        let head = format!(
            "PUT /v1/subscriptions/uploads/g/handler HTTP/1.1\r\nHost: {admin}\r\nAuthorization: Bearer {TEST_TOKEN}\r\nContent-Length: {}\r\n\r\n",
            60 << 20
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        // A refused upload may be answered and closed before its body is sent.
        let _ = stream.write_all(&vec![0u8; 1 << 20]).await;
        streams.push(stream);
    }
    let mut refused = 0;
    for stream in &mut streams {
        let mut answer = vec![0u8; 64];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(2000), stream.read(&mut answer)).await
            && String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 429")
        {
            refused += 1;
        }
    }
    assert_eq!(refused, 7, "all but one partial upload refused at once");
    drop(streams);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_wait_their_turn_and_are_logged_sparingly() {
    let redis = Redis::start();
    let host = HostProcess::run(&redis, TestConfig::of(Sub::fixture("guess")));
    let admin = host.admin_addr().await;
    let path = "/v1/subscriptions/guess/g/rollback";
    let started = tokio::time::Instant::now();
    let guesses: Vec<_> = (0..4)
        .map(|i| {
            let auth = format!("Bearer guess-{i}");
            tokio::spawn(async move {
                http_request(
                    admin,
                    "POST",
                    path,
                    &[("Authorization", auth.as_str())],
                    b"",
                )
                .await
                .0
            })
        })
        .collect();
    for guess in guesses {
        assert_eq!(guess.await.unwrap(), 401);
    }
    // One at a time, a second each: four parallel guesses take four seconds, not one.
    assert!(
        started.elapsed() >= Duration::from_millis(3_500),
        "{:?}",
        started.elapsed()
    );
    // The right token does not wait behind them.
    let auth = format!("Bearer {TEST_TOKEN}");
    let (status, _) = http_request(
        admin,
        "POST",
        path,
        &[("Authorization", auth.as_str())],
        b"",
    )
    .await;
    assert_eq!(status, 409, "nothing to roll back to, but let in");
    let lines = host.log_text().matches("wrong or missing token").count();
    assert!((1..=2).contains(&lines), "{lines} log lines for 4 guesses");
}

#[test]
fn a_guessable_admin_token_is_refused_with_how_to_make_one() {
    use std::os::unix::fs::PermissionsExt as _;
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("weak-token");
    std::fs::write(&token, "hunter2\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let path = write_config(
        dir.path(),
        "weak.toml",
        &TestConfig::of(Sub::fixture("weak"))
            .set("admin_token_file", token.display().to_string())
            .to_string(),
    );
    let (ok, _, stderr) = run_sluice(
        &["run", path.to_str().unwrap(), "--redis", &redis.url()],
        dir.path(),
    );
    assert!(!ok);
    assert!(
        stderr.contains("bits of randomness") && stderr.contains("openssl rand -hex 32"),
        "{stderr}"
    );
    // `check` says it before anything starts, also of a repeated pattern.
    std::fs::write(&token, "a1".repeat(16)).unwrap();
    let (ok, _, stderr) = run_sluice(
        &["check", path.to_str().unwrap(), "--redis", &redis.url()],
        dir.path(),
    );
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("bits of randomness"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_cookie_less_requests_does_not_evict_the_operators_session() {
    let redis = Redis::start();
    let mut host = start_fixture(
        &redis,
        TestConfig::of(Sub::fixture("flood-ui")).set("admin_open_on_loopback", Raw("true")),
    )
    .await;
    let admin = host.admin().await;
    let (_, head, _) = http_exchange(admin, "GET", "/ui/", &[], b"").await;
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_owned();
    // The operator keeps using the page.
    let (_, head, _) = http_exchange(admin, "GET", "/ui/", &[("Cookie", &cookie)], b"").await;
    assert!(!head.to_ascii_lowercase().contains("set-cookie"), "{head}");
    for _ in 0..1_100 {
        http_exchange(admin, "GET", "/ui/", &[], b"").await;
    }
    let (_, head, _) = http_exchange(admin, "GET", "/ui/", &[("Cookie", &cookie)], b"").await;
    assert!(
        !head.to_ascii_lowercase().contains("set-cookie"),
        "the operator's session was evicted: {head}"
    );
    // A flood whose 1,100 sessions each come back twice (3,300 requests): younger than the
    // operator's, they go first.
    for _ in 0..1_100 {
        let (_, head, _) = http_exchange(admin, "GET", "/ui/", &[], b"").await;
        let theirs = header(&head, "set-cookie")
            .and_then(|c| c.split(';').next())
            .unwrap()
            .to_owned();
        for _ in 0..2 {
            http_exchange(admin, "GET", "/ui/", &[("Cookie", &theirs)], b"").await;
        }
    }
    let (_, head, _) = http_exchange(admin, "GET", "/ui/", &[("Cookie", &cookie)], b"").await;
    assert!(
        !head.to_ascii_lowercase().contains("set-cookie"),
        "the operator's session was evicted by sessions that came back: {head}"
    );
    host.stop().await.unwrap();
}
