//! The two promises under attack: a hostile guest stays inside its sandbox (never the admin
//! API, never unbounded host memory or logs), and a careless producer's entries (any bytes, any
//! number of fields, spoofed `sluice-*` fields) are handled, parked or dead-lettered, never
//! lost and never wedging the subscription.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// A fixture subscription to `stream`; `max_retries = 0` unless `extra` sets it.
fn config(stream: &str, extra: &str) -> String {
    let retries = if extra.contains("max_retries") {
        ""
    } else {
        "max_retries = 0\n"
    };
    format!(
        "[[subscription]]\ncomponent = \"{{fixture}}\"\nstream = \"{stream}\"\ngroup = \"g\"\nconsumer = \"c1\"\nblock = \"100ms\"\n{retries}{extra}\n"
    )
}

async fn dead_letters(conn: &mut redis::aio::MultiplexedConnection, stream: &str) -> usize {
    entries(conn, &format!("{stream}.dead-letter")).await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_never_reaches_the_admin_api_whatever_its_grant() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &config(
            "nosy",
            "allowed_outbound_hosts = [\"http://*:*\", \"http://127.0.0.1:*\"]",
        ),
    )
    .await;
    let port = host.admin().await.port();
    let spellings = [
        "127.0.0.1",
        "localhost",
        "[::1]",
        "127.0.0.2",
        "0.0.0.0",
        "[::ffff:127.0.0.1]",
    ];
    for spelling in spellings {
        let url = format!("http://{spelling}:{port}/v1/subscriptions/nosy/g/rollback");
        add(
            &mut conn,
            "nosy",
            &Control::Http {
                url: url.to_string(),
                body: String::new(),
                timeout_ms: 0,
            },
        )
        .await;
    }
    let dead = wait_dead_letters(&conn, "nosy", spellings.len()).await;
    for (_, fields) in &dead {
        let reason = field(fields, "sluice-reason").unwrap();
        assert!(reason.contains("denied"), "{reason}");
    }
    let (_, listing) = http_get(host.admin().await, "/v1/subscriptions").await;
    assert!(listing.contains("\"swaps\":0"), "{listing}");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_admin_calls_need_a_token_even_on_loopback() {
    let redis = Redis::start();
    let mut host =
        TestHost::start(&redis, &format!("# no admin token\n{}", config("open", ""))).await;
    let admin = host.admin().await;
    let (status, body) =
        http_request_bare(admin, "POST", "/v1/subscriptions/open/g/rollback", &[], b"").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("admin_token_file"), "{body}");
    assert_eq!(
        http_request_bare(admin, "GET", "/v1/subscriptions", &[], b"")
            .await
            .0,
        200,
        "without a token the listing stays readable on loopback"
    );
    host.stop().await.unwrap();
}

/// RSS of this process, bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_http_resources_fail_the_attempt_at_the_host_memory_limit() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &format!(
            "{}{}",
            config("leak", "memory_limit = \"8MiB\""),
            config(
                "leak-granted",
                "allowed_outbound_hosts = [\"https://example.com\"]"
            )
        ),
    )
    .await;
    let before = rss();
    // The issue's attack: 10,000 header maps of 100 kB each, leaked, with and without a grant.
    let attack = Control::LeakFields {
        maps: 10000,
        bytes: 100000,
    };
    add(&mut conn, "leak", &attack).await;
    add(&mut conn, "leak-granted", &attack).await;
    for stream in ["leak", "leak-granted"] {
        let dead = wait_dead_letters(&conn, stream, 1).await;
        let reason = field(&dead[0].1, "sluice-reason").unwrap();
        assert!(
            reason.contains("host limit") && reason.contains("host_memory_limit"),
            "{stream}: {reason}"
        );
    }
    let grown = rss().saturating_sub(before);
    assert!(grown < 128 << 20, "the host grew by {} MiB", grown >> 20);
    // The host still serves.
    let id = add(&mut conn, "leak", &Control::Ack).await;
    host.event(T, "an ack after the attack", |e| e.id == id)
        .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_is_cut_to_the_budget_and_cannot_forge_host_lines() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", &config("flood", ""));
    let url = redis.url();
    let host = HostProcess::spawn(
        &["run", path.to_str().unwrap(), "--redis", url.as_str()],
        dir.path(),
    );
    let forged = "x\n2026-01-01T00:00:00.000000Z  INFO sluice_host: forged line\r\n";
    add(
        &mut conn,
        "flood",
        &Control::LogFlood {
            lines: 1000,
            bytes: 100000,
            prefix: forged.to_string(),
        },
    )
    .await;
    let after = add(&mut conn, "flood", &Control::Ack).await;
    wait_acked(&conn, "flood", "g", &after).await;
    let (_, metrics) = http_get(host.admin_addr().await, "/metrics").await;
    let dropped: u64 = metrics
        .lines()
        .find(|l| l.starts_with("sluice_guest_log_dropped_total{stream=\"flood\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(dropped >= 900, "dropped {dropped}: {metrics}");
    let log = host.log_text();
    assert!(
        log.len() < 2 << 20,
        "the host log grew by {} bytes",
        log.len()
    );
    assert!(log.contains("guest log budget"), "{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01T00:00:00")),
        "a guest forged a host log line"
    );
    assert!(log.contains("\\n2026-01-01"), "the newline is escaped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_delay_over_max_delay_is_clamped() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &config(
            "forever",
            "max_retries = 3\nmax_delay = \"1m\"\ndelayed_retry = { key = \"forever.delayed\" }",
        ),
    )
    .await;
    let id = add(
        &mut conn,
        "forever",
        &Control::Retry {
            ms: u64::MAX,
            times: 1,
        },
    )
    .await;
    let event = host.event(T, "the park", |e| e.id == id).await;
    let sluice_host::EventKind::Parked { delay, due_ms, .. } = event.kind else {
        panic!("{event:?}");
    };
    assert_eq!(delay, Duration::from_secs(60));
    let (s, us): (i64, i64) = cmd(&mut conn, &["TIME"]).await;
    let left = due_ms - (s * 1000 + us / 1000);
    assert!((0..=60_000).contains(&left), "due in {left} ms");
    let (_, metrics) = http_get(host.admin().await, "/metrics").await;
    assert!(
        metrics.contains(r#"sluice_retry_delay_clamped_total{stream="forever",group="g"} 1"#),
        "{metrics}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_name_that_is_not_utf8_is_dead_lettered_and_nothing_wedges() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let toml = config("bytes", "");
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
        .arg("bytes.dead-letter")
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
    let _: () = cmd(&mut conn, &["SET", "wrong.dead-letter", "not a stream"]).await;
    let mut host = TestHost::start(
        &redis,
        &config(
            "wrong",
            "failure_backoff = { initial = \"100ms\", max = \"200ms\" }",
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
    let _: () = cmd(&mut conn, &["DEL", "wrong.dead-letter"]).await;
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
async fn a_member_too_big_to_re_add_is_dead_lettered_and_the_sweep_goes_on() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &config("bulky", "delayed_retry = { key = \"bulky.delayed\" }"),
    )
    .await;
    let mut big = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    big.extend((0..5000).map(|i| (format!("f{i}").into_bytes(), b"v".to_vec())));
    let small = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    let _: i64 = redis::cmd("ZADD")
        .arg("bulky.delayed")
        .arg(0)
        .arg(sluice_host::delayed::member::encode("1-1", 1, &big))
        .arg(1)
        .arg(sluice_host::delayed::member::encode("1-2", 1, &small))
        .query_async(&mut conn)
        .await
        .unwrap();
    let back = host
        .event(T, "the small member's retry", |e| e.retry_count == 1)
        .await;
    assert_eq!(back.kind, sluice_host::EventKind::Acked);
    let dead = wait_dead_letters(&conn, "bulky", 1).await;
    let reason = field(&dead[0].1, "sluice-reason").unwrap();
    assert!(reason.contains("5001 fields"), "{reason}");
    let left: i64 = cmd(&mut conn, &["ZCARD", "bulky.delayed"]).await;
    assert_eq!(left, 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_and_group_are_created_again() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(&redis, &config("gone", "")).await;
    let first = add(&mut conn, "gone", &Control::Ack).await;
    host.event(T, "the first ack", |e| e.id == first).await;
    let _: () = cmd(&mut conn, &["DEL", "gone"]).await;
    let second = add(&mut conn, "gone", &Control::Ack).await;
    host.event(T, "an entry on the new stream", |e| e.id == second)
        .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_bookkeeping_fields_change_nothing() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = TestHost::start(
        &redis,
        &config(
            "spoof",
            "max_retries = 3\nfailure_backoff = { initial = \"50ms\", max = \"100ms\" }\ndelayed_retry = { key = \"spoof.delayed\" }",
        ),
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
    assert_eq!(dead_letters(&mut conn, "spoof").await, 0);
    // The producer's own sluice-* fields are its data: kept through the park.
    let all = entries(&mut conn, "spoof").await;
    let again = all.iter().find(|(i, _)| *i == back.id).unwrap();
    assert_eq!(field(&again.1, "sluice-origin-id"), Some("1-1"));
    let origins: Vec<&str> = again
        .1
        .iter()
        .filter(|(n, _)| n == "sluice-origin-id")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        origins,
        vec!["1-1", id.as_str()],
        "the host's own origin comes last"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_rebinding_csrf_and_oversized_bodies_before_reading_them() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = Redis::start();
    let mut host = TestHost::start(&redis, &config("guarded", "")).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_a_subscription_that_cannot_read_and_recovers() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // The stream's key holds a string: the group cannot be created, nothing can be read.
    let _: () = cmd(&mut conn, &["SET", "blocked", "not a stream"]).await;
    let mut host = TestHost::start(
        &redis,
        &format!("{}{}", config("blocked", ""), config("fine", "")),
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

/// A host that comes back under a new consumer name (a new pod name on every deploy) takes over
/// what its predecessor left pending, and `sluice status` shows the predecessor as gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_entries_of_a_gone_consumer_are_taken_over() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let _: () = cmd(
        &mut conn,
        &["XGROUP", "CREATE", "pods", "g", "0", "MKSTREAM"],
    )
    .await;
    let id = add(&mut conn, "pods", &Control::Ack).await;
    // The old pod reads the entry and is never seen again.
    let _: redis::Value = cmd(
        &mut conn,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "old-pod",
            "COUNT",
            "1",
            "STREAMS",
            "pods",
            ">",
        ],
    )
    .await;
    let toml = config("pods", "consumer_gone_after = \"1s\"").replace("c1", "new-pod");
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", &toml);
    let url = redis.url();
    let status = wait_for(T, "status to call old-pod gone", || {
        let (path, url, cwd) = (path.clone(), url.clone(), dir.path().to_owned());
        async move {
            let (ok, out, err) = tokio::task::spawn_blocking(move || {
                run_sluice(
                    &["status", path.to_str().unwrap(), "--json", "--redis", &url],
                    &cwd,
                )
            })
            .await
            .unwrap();
            assert!(ok, "{err}");
            out.contains(r#""name":"old-pod","pending":1"#)
                .then_some(out)
                .filter(|out| out.contains(r#""gone":true"#))
        }
    })
    .await;
    assert!(status.contains("old-pod"), "{status}");
    let mut host = TestHost::start(&redis, &toml).await;
    let event = host.event(T, "the stranded entry", |e| e.id == id).await;
    assert_eq!(event.kind, sluice_host::EventKind::Acked);
    assert_eq!(event.delivery_count, 2, "claimed from the old pod");
    assert_eq!(pending(&mut conn, "pods", "g").await, 0);
    host.stop().await.unwrap();
}

#[test]
fn check_says_what_a_ttl_means_and_wants_a_margin_over_max_delay() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = write_config(
        d,
        "ttl.toml",
        "[[subscription]]\ncomponent = \"{fixture}\"\nmax_delay = \"1h\"\ndelayed_retry = { key = \"fixture.delayed\", ttl = \"1d\" }\n",
    );
    let (ok, out, err) = run_sluice(&["check", path.to_str().unwrap()], d);
    assert!(ok, "{err}");
    assert!(
        out.contains("warning") && out.contains("deletes the set and every retry in it"),
        "{out}"
    );
    let path = write_config(
        d,
        "tight.toml",
        "[[subscription]]\ncomponent = \"{fixture}\"\nmax_delay = \"1h\"\ndelayed_retry = { key = \"fixture.delayed\", ttl = \"1h\" }\n",
    );
    let (ok, _, err) = run_sluice(&["check", path.to_str().unwrap()], d);
    assert!(!ok && err.contains("plus a margin of 60s"), "{err}");
}

/// A read that fails the same way every time (the stream key replaced by a string) is retried
/// with growing pauses, not every 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_keeps_failing_backs_off() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", &config("spin", ""));
    let url = redis.url();
    let host = HostProcess::spawn(
        &["run", path.to_str().unwrap(), "--redis", url.as_str()],
        dir.path(),
    );
    let id = add(&mut conn, "spin", &Control::Ack).await;
    wait_acked(&conn, "spin", "g", &id).await;
    let _: () = cmd(&mut conn, &["DEL", "spin"]).await;
    let _: () = cmd(&mut conn, &["SET", "spin", "not a stream"]).await;
    let started = std::time::Instant::now();
    let failures = |log: &str| log.matches("read failed").count();
    // Wait until reads have failed for 3 s; a 50 ms loop would log ~60 lines by then.
    let log = wait_for(T, "3 s of failing reads", || {
        let text = host.log_text();
        async move { (started.elapsed() >= Duration::from_secs(3)).then_some(text) }
    })
    .await;
    let n = failures(&log);
    assert!(
        (1..=10).contains(&n),
        "{n} failed reads logged in 3 s:\n{log}"
    );
    assert!(log.contains("WRONGTYPE"), "the failure is named: {log}");
}

/// Eight uploads that declare a large body and send part of it: one is read, the rest are
/// refused at once, so the host never buffers more than one upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_partial_uploads_are_refused_beyond_one() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = Redis::start();
    let mut host = TestHost::start(&redis, &config("uploads", "")).await;
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
