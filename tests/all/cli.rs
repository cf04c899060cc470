//! The `sluice` binary as an operator uses it: a private dev Redis when none is configured,
//! graceful shutdown, `sluice parked`, the compile cache, riding out a Redis restart, and
//! `sluice check` refusing bad configurations with errors that name the problem.

use std::time::Duration;

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// `sluice run` in `dir` on the fixture's `dev` stream without a Redis URL: the host, its
/// config, and the URL of the private server it started.
async fn run_on_dev_redis(dir: &std::path::Path) -> (HostProcess, std::path::PathBuf, String) {
    let path = write_config(
        dir,
        "sluice.toml",
        &TestConfig::of(Sub::fixture("dev")).to_string(),
    );
    let host = HostProcess::spawn(&["run", path.to_str().unwrap()], dir);
    let url_file = dir.join(".sluice/dev-redis/url");
    let url = wait_for(T, "the dev redis url", || {
        let url_file = url_file.clone();
        async move { std::fs::read_to_string(&url_file).ok() }
    })
    .await;
    (host, path, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_without_a_url_starts_a_private_redis_and_stops_it_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (mut host, _, url) = run_on_dev_redis(dir.path()).await;
    let url_file = dir.path().join(".sluice/dev-redis/url");
    let client = redis::Client::open(url.trim()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let aof: Vec<String> = cmd(&mut conn, &["CONFIG", "GET", "appendonly"]).await;
    assert_eq!(
        aof,
        vec!["appendonly", "yes"],
        "the dev server keeps parked retries across restarts"
    );
    add(&mut conn, "dev", &Control::Ack).await;
    wait_for(T, "the entry to be acked", || {
        let mut conn = conn.clone();
        async move {
            let groups: redis::RedisResult<Vec<std::collections::HashMap<String, redis::Value>>> =
                redis::cmd("XINFO")
                    .arg("GROUPS")
                    .arg("dev")
                    .query_async(&mut conn)
                    .await;
            let group = groups.ok()?.into_iter().next()?;
            let settled = group.get("pending") == Some(&redis::Value::Int(0))
                && group.get("lag") == Some(&redis::Value::Int(0));
            settled.then_some(())
        }
    })
    .await;
    host.terminate();
    let status = host.wait_exit().await;
    assert!(
        status.success(),
        "graceful shutdown exits 0: {}",
        host.log_text()
    );
    assert!(
        !url_file.exists(),
        "the dev server is stopped and its url removed"
    );
    assert!(
        client.get_multiplexed_async_connection().await.is_err(),
        "the dev server is gone"
    );
    let log = host.log_text();
    assert!(log.contains("started a private dev redis-server"), "{log}");
    assert!(log.contains("all deliveries settled; stopped"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_lists_what_waits_oldest_first_in_text_and_json() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let toml = &TestConfig::of(Sub::fixture("waits").delayed("waits.delayed")).to_string();
    let path = write_config(dir.path(), "sluice.toml", toml);
    let mut host = TestHost::start(&redis, toml).await;
    let late = add(
        &mut conn,
        "waits",
        &Control::Retry {
            ms: 120000,
            times: 1,
        },
    )
    .await;
    host.event(T, "the first park", |e| e.id == late).await;
    let soon = add(
        &mut conn,
        "waits",
        &Control::Retry {
            ms: 60000,
            times: 1,
        },
    )
    .await;
    host.event(T, "the second park", |e| e.id == soon).await;
    host.stop().await.unwrap();

    let url = redis.url();
    let (ok, text, stderr) = run_sluice(
        &["parked", path.to_str().unwrap(), "--redis", &url],
        dir.path(),
    );
    assert!(ok, "{stderr}");
    let soon_at = text.find(&soon).expect("soon listed");
    let late_at = text.find(&late).expect("late listed");
    assert!(soon_at < late_at, "oldest due first:\n{text}");
    assert!(
        text.contains("waits.delayed") && text.contains("total: 2"),
        "{text}"
    );

    let (ok, json_text, stderr) = run_sluice(
        &[
            "parked",
            path.to_str().unwrap(),
            "--redis",
            &url,
            "--json",
            "--stream",
            "waits",
        ],
        dir.path(),
    );
    assert!(ok, "{stderr}");
    let listing: serde_json::Value = serde_json::from_str(json_text.trim()).unwrap();
    assert_eq!(listing["total"], 2);
    assert_eq!(listing["key"], "waits.delayed");
    let first = &listing["entries"][0];
    assert_eq!(first["origin_id"], soon.as_str());
    assert_eq!(first["retry_count"], 1);
    let (due_ms, due_in) = (
        first["due_ms"].as_i64().unwrap(),
        first["due_in_ms"].as_i64().unwrap(),
    );
    let (s, us): (i64, i64) = cmd(&mut conn, &["TIME"]).await;
    let now = s * 1000 + us / 1000;
    assert!(
        (0..5_000).contains(&(now - (due_ms - due_in))),
        "due_in_ms is due time minus the server's now"
    );
    assert_eq!(
        first["fields"]["payload"],
        Control::Retry {
            ms: 60000,
            times: 1
        }
        .to_string()
    );

    let (ok, _, stderr) = run_sluice(
        &[
            "parked",
            path.to_str().unwrap(),
            "--redis",
            &url,
            "--stream",
            "nope",
        ],
        dir.path(),
    );
    assert!(
        !ok && stderr.contains("no subscription to `nope` has a delayed-retry set"),
        "{stderr}"
    );
}

#[test]
fn compiled_components_are_cached_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_with_cache(dir.path());
    // Compiled artifacts with their inodes (a rewrite is a new file, renamed into place) and
    // sizes; the key beside them is not one. A use marks the time, which eviction goes by.
    let artifacts = |d: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        let mut found: Vec<_> = walk(d)
            .into_iter()
            .filter(|p| p.file_name().unwrap() != "cache-key")
            .map(|p| {
                let meta = std::fs::metadata(&p).unwrap();
                (p, meta.ino(), meta.len())
            })
            .collect();
        found.sort();
        found
    };
    let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(ok, "{stderr}");
    let cache = dir.path().join("cache");
    let first = artifacts(&cache);
    assert_eq!(
        first.len(),
        1,
        "the compiled component is written to the cache"
    );
    let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(ok, "{stderr}");
    assert_eq!(
        artifacts(&cache),
        first,
        "the second run reuses it: no new or rewritten artifact"
    );
    // Private: the directory 0700, its key 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700);
    assert_eq!(mode(&cache.join("cache-key")), 0o600);
    // A changed artifact (its code overwritten with breakpoints) is not run: it fails its
    // keyed hash, is removed and compiled again.
    let artifact = &first[0].0;
    let mut bytes = std::fs::read(artifact).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle - 2048..middle + 2048].fill(0xCC);
    std::fs::write(artifact, &bytes).unwrap();
    let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("does not carry this host's keyed hash"),
        "{stderr}"
    );
    assert_ne!(std::fs::read(artifact).unwrap(), bytes, "compiled anew");
    // A cache others may write is refused.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("is open to other users (mode 777)"),
        "{stderr}"
    );
}

/// `sluice cache prune` removes what was not used for the given time, and leaves the rest.
#[test]
fn cache_prune_removes_what_was_not_used_lately() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_with_cache(dir.path());
    let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(ok, "{stderr}");
    let cache = dir.path().join("cache");
    let compiled = || {
        walk(&cache)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
            .count()
    };
    assert_eq!(compiled(), 1);
    // Used just now: a week's prune keeps it; the config in the directory names the cache.
    let (ok, out, err) = run_sluice(&["cache", "prune"], dir.path());
    assert!(
        ok && out.contains("removed 0 compiled components and"),
        "{out}{err}"
    );
    assert_eq!(compiled(), 1);
    let (ok, out, err) = run_sluice(&["cache", "prune", "--older-than", "0s"], dir.path());
    assert!(
        ok && out.contains("removed 1 compiled component and"),
        "{out}{err}"
    );
    assert_eq!(compiled(), 0);
    assert!(cache.join("cache-key").is_file(), "the key stays");
    let (ok, _, err) = run_sluice(&["cache", "prune", "--older-than", "soon"], dir.path());
    assert!(!ok && err.contains("--older-than soon"), "{err}");
}

/// `sluice status` asks Redis first: with no Redis there, it says so at once, before it
/// compiles anything (a Python component takes seconds).
#[test]
fn status_asks_redis_before_compiling() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = free_port();
    let path = write_config(
        dir.path(),
        "sluice.toml",
        &format!(
            "cache_dir = \"cache\"\nredis = \"redis://127.0.0.1:{port}\"\n{}",
            TestConfig::of(Sub::as_built("{fixture}"))
        ),
    );
    let (ok, _, err) = run_sluice(&["status", path.to_str().unwrap()], dir.path());
    assert!(!ok && err.contains(&format!("127.0.0.1:{port}")), "{err}");
    let compiled = walk(&dir.path().join("cache"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .count();
    assert_eq!(compiled, 0, "nothing was compiled");
}

/// A config in `dir` for the fixture, with its compile cache in `dir/cache`.
fn fixture_with_cache(dir: &std::path::Path) -> std::path::PathBuf {
    write_config(
        dir,
        "sluice.toml",
        &TestConfig::of(Sub::as_built("{fixture}"))
            .set("cache_dir", "cache")
            .to_string(),
    )
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_rides_out_a_redis_restart() {
    let mut redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, TestConfig::of(Sub::fixture("bumpy"))).await;
    let before = add(&mut conn, "bumpy", &Control::Ack).await;
    host.event(T, "the first ack", |e| e.id == before).await;
    redis.server.restart().unwrap();
    let mut conn = redis.conn().await;
    let after = add(&mut conn, "bumpy", &Control::Ack).await;
    let event = host
        .event(T, "an ack after the restart", |e| e.id == after)
        .await;
    assert_eq!(event.kind, EventKind::Acked);
    wait_for(T, "an empty pending list", || {
        let mut conn = conn.clone();
        async move { (pending(&mut conn, "bumpy", "g").await == 0).then_some(()) }
    })
    .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_logs_land_in_the_host_log_inside_the_delivery_span_as_json() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "sluice.toml",
        &TestConfig::of(Sub::fixture("logs")).to_string(),
    );
    let url = redis.url();
    let host = HostProcess::spawn(
        &[
            "--log-format",
            "json",
            "run",
            path.to_str().unwrap(),
            "--redis",
            url.as_str(),
        ],
        dir.path(),
    );
    let id = add(
        &mut conn,
        "logs",
        &Control::Log {
            line: "hello from the guest".into(),
        },
    )
    .await;
    let line = wait_for(T, "the guest's log line", || {
        let text = host.log_text();
        async move {
            text.lines()
                .find(|l| l.contains("fixture log line"))
                .map(str::to_owned)
        }
    })
    .await;
    let event: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(event["level"], "WARN");
    assert_eq!(event["target"], "sluice::guest");
    assert_eq!(event["fields"]["message"], "fixture log line");
    assert_eq!(event["fields"]["fields"], "detail=hello from the guest");
    let span = &event["span"];
    assert_eq!(span["name"], "delivery");
    assert_eq!(span["stream"], "logs");
    assert_eq!(span["group"], "g");
    assert_eq!(span["id"], id.as_str());
    assert_eq!(span["retry_count"], 0);
    assert_eq!(span["digest"].as_str().map(str::len), Some(12));
    for line in host.log_text().lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
}

#[test]
fn bad_configurations_are_refused_with_errors_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases = [
        (
            "unknown.toml",
            &TestConfig::of(Sub::as_built("{fixture}").set("blok", "1s")).to_string(),
            "unknown field `blok`",
        ),
        (
            "duration.toml",
            &TestConfig::of(Sub::as_built("{fixture}").set("block", "soonish")).to_string(),
            "subscription[0].block",
        ),
        (
            "missing.toml",
            &TestConfig::of(Sub::as_built("nope.wasm")).to_string(),
            "nope.wasm does not exist",
        ),
        (
            "world.toml",
            &TestConfig::of(Sub::as_built("{other_world}")).to_string(),
            "does not implement the sluice:handler/handler world",
        ),
        (
            "group.toml",
            &TestConfig::of(Sub::as_built("{fixture}").set("group", "")).to_string(),
            "`group` is empty",
        ),
        (
            "ttl.toml",
            &TestConfig::of(Sub::as_built("{fixture}").set("max_delay", "2h").set(
                "delayed_retry",
                Raw(r#"{ key = "fixture.delayed", ttl = "1h" }"#),
            ))
            .to_string(),
            "ttl 3600s is shorter than the longest delay 7200s",
        ),
    ];
    let huge = "300000000000y";
    let long = "s".repeat(4 << 20);
    let bounded = [
        (
            "handler_timeout.toml",
            TestConfig::of(Sub::as_built("{fixture}").set("handler_timeout", huge)).to_string(),
            "subscription[0].handler_timeout",
        ),
        (
            "gone.toml",
            TestConfig::of(Sub::as_built("{fixture}").set("consumer_gone_after", huge)).to_string(),
            "subscription[0].consumer_gone_after",
        ),
        (
            "shutdown.toml",
            format!(
                "shutdown_timeout = \"{huge}\"\n{}",
                TestConfig::of(Sub::as_built("{fixture}"))
            ),
            "shutdown_timeout",
        ),
        (
            "stream.toml",
            TestConfig::of(Sub::as_built("{fixture}").set("stream", long.as_str())).to_string(),
            "stream is 4194304 bytes long",
        ),
        (
            "newline.toml",
            TestConfig::of(Sub::as_built("{fixture}").set("group", "g\nINFO forged")).to_string(),
            "control character",
        ),
    ];
    let bounded = bounded
        .iter()
        .map(|(name, toml, expected)| (*name, toml, *expected));
    for (name, toml, expected) in cases.into_iter().chain(bounded) {
        let path = write_config(d, name, toml);
        let (ok, _, stderr) = run_sluice(&["check", path.to_str().unwrap()], d);
        assert!(!ok, "{name} was accepted");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        assert!(
            stderr.len() < 4096,
            "{name}: {} bytes of error",
            stderr.len()
        );
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
    // A cause is printed once, after the error it caused (not pasted into it as well).
    let (ok, _, stderr) = run_sluice(&["check", "absent.toml"], d);
    assert!(!ok);
    assert!(stderr.contains("cannot read absent.toml: "), "{stderr}");
    assert_eq!(stderr.matches("os error 2").count(), 1, "{stderr}");
}

#[test]
fn check_prints_the_resolved_plan() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "plan.toml",
        &TestConfig::of(
            Sub::as_built("{bank}")
                .set("count", 10)
                .set("claim_min_idle", "1m")
                .set(
                    "allowed_outbound_hosts",
                    Raw(r#"["https://*.example.com"]"#),
                )
                .set("http_timeout", "3s")
                .value("gateway_url", "https://pay.example.com"),
        )
        .set("redis", "redis://:secret@127.0.0.1:1")
        .to_string(),
    );
    let (ok, stdout, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(ok, "{stderr}");
    for expected in [
        "subscription 1: stream `bank-payments`, group `billing`",
        "redis://***@127.0.0.1:1",
        "XREADGROUP COUNT 10 BLOCK 1s",
        "XAUTOCLAIM entries idle for at least 1m",
        "retries wait in sorted set `bank-payments.delayed` (ttl none)",
        "dead letter  `bank-payments.billing.dead-letter` (this group's own; what an earlier release left for it in `bank-payments.dead-letter` is moved here)",
        "network      HTTP to https://*.example.com (3s per request)",
        "gateway_url=https://pay.example.com",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
fn check_says_what_a_ttl_means_and_wants_a_margin_over_max_delay() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = write_config(
        d,
        "ttl.toml",
        &TestConfig::of(Sub::as_built("{fixture}").set("max_delay", "1h").set(
            "delayed_retry",
            Raw(r#"{ key = "fixture.delayed", ttl = "1d" }"#),
        ))
        .to_string(),
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
        &TestConfig::of(Sub::as_built("{fixture}").set("max_delay", "1h").set(
            "delayed_retry",
            Raw(r#"{ key = "fixture.delayed", ttl = "1h" }"#),
        ))
        .to_string(),
    );
    let (ok, _, err) = run_sluice(&["check", path.to_str().unwrap()], d);
    assert!(!ok && err.contains("plus a margin of 60s"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_redis_is_private_dies_with_its_host_and_is_not_taken_from_a_stranger() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (mut host, path, url) = run_on_dev_redis(dir.path()).await;
    let dev = dir.path().join(".sluice/dev-redis");
    let url_file = dev.join("url");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dev), 0o700);
    for file in ["password", "url", "redis.conf"] {
        assert_eq!(mode(&dev.join(file)), 0o600, "{file}");
    }
    let password = std::fs::read_to_string(dev.join("password")).unwrap();
    assert!(password.trim().len() >= 32 && url.contains(password.trim()));
    // Without the password, nothing.
    let port: u16 = url.trim().rsplit(':').next().unwrap().parse().unwrap();
    let bare = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut bare = bare.get_multiplexed_async_connection().await.unwrap();
    let refused: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut bare).await;
    assert!(
        refused.unwrap_err().to_string().contains("NOAUTH"),
        "a password is required"
    );
    // Not on the server's command line, which every user can read.
    let server = wait_for(T, "the redis-server child", || {
        let found = children_of(host.pid())
            .into_iter()
            .find(|(_, cmd)| cmd.contains("redis-server"));
        async move { found }
    })
    .await;
    assert!(!server.1.contains(password.trim()), "{}", server.1);
    assert!(
        !host.log_text().contains(password.trim()),
        "the log holds the password"
    );
    // A host killed outright takes its server with it.
    host.kill();
    wait_for(T, "the dev server to die with its host", || {
        let pid = server.0;
        async move { gone(pid).then_some(()) }
    })
    .await;
    // A stranger on the stale port that says yes to anything is not taken for the server.
    // (A background child the server forked, an AOF rewrite, may hold the port a moment.)
    let stranger = wait_for(T, "the stale port to be free", || async move {
        tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let seen = heard.clone();
    let fake = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = stranger.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    seen.lock().unwrap().extend_from_slice(&buf[..n]);
                    if n == 0 || socket.write_all(b"+OK\r\n+PONG\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut again = HostProcess::spawn(&["run", path.to_str().unwrap()], dir.path());
    let url = wait_for(T, "a new dev redis url", || {
        let url_file = url_file.clone();
        async move {
            std::fs::read_to_string(&url_file)
                .ok()
                .filter(|u| !u.trim().ends_with(&format!(":{port}")))
        }
    })
    .await;
    let heard = String::from_utf8_lossy(&heard.lock().unwrap()).into_owned();
    assert!(
        !heard.contains(password.trim()),
        "the password was sent to the stranger: {heard}"
    );
    let client = redis::Client::open(url.trim()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let id = add(&mut conn, "dev", &Control::Ack).await;
    wait_acked(&conn, "dev", "g", &id).await;
    again.terminate();
    assert!(again.wait_exit().await.success(), "{}", again.log_text());
    fake.abort();
}

/// The Kubernetes manifests' `cache_dir` on what Kubernetes gives it: an emptyDir is made
/// writable by everyone (0777, 2777 with `fsGroup`), which the host refuses for a cache that
/// holds compiled code; the manifests point below it, at a directory the host makes 0700
/// itself. (An attack found the first manifests crash-looping on this.)
#[test]
fn the_kubernetes_cache_dir_works_on_a_directory_open_to_everyone() {
    use std::os::unix::fs::PermissionsExt;
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let empty_dir = dir.path().join("var-cache-sluice");
    std::fs::create_dir(&empty_dir).unwrap();
    std::fs::set_permissions(&empty_dir, std::fs::Permissions::from_mode(0o2777)).unwrap();
    let base = std::fs::read_to_string(root().join("deploy/kubernetes/base/sluice.toml")).unwrap();
    let cache_dir = base
        .lines()
        .find_map(|l| l.strip_prefix("cache_dir = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("the base config sets cache_dir");
    let below = cache_dir
        .strip_prefix("/var/cache/sluice/")
        .expect("the base config's cache_dir is below the emptyDir's mount");
    let check = |cache: &std::path::Path| {
        let config =
            TestConfig::of(Sub::fixture("k8s-cache")).set("cache_dir", cache.to_str().unwrap());
        let path = write_config(dir.path(), "sluice.toml", &config.to_string());
        run_sluice(
            &["check", path.to_str().unwrap(), "--redis", &redis.url()],
            dir.path(),
        )
    };
    let (ok, _, stderr) = check(&empty_dir);
    assert!(!ok && stderr.contains("is open to other users"), "{stderr}");
    let (ok, _, stderr) = check(&empty_dir.join(below));
    assert!(ok, "{stderr}");
    let mode = std::fs::metadata(empty_dir.join(below))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o700,
        "the host made its cache directory {mode:o}"
    );
}

/// `sluice new --list` shows each language and template with what it gives, and makes nothing.
#[test]
fn new_lists_its_languages_and_templates() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = run_sluice(&["new", "--list"], dir.path());
    assert!(ok, "{stderr}");
    for name in ["rust", "python", "js", "ack", "http"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(name)),
            "{name}: {stdout}"
        );
    }
    assert!(stdout.contains("stub_api.py"), "{stdout}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let (ok, _, stderr) = run_sluice(&["new"], dir.path());
    assert!(!ok && stderr.contains("<NAME>"), "{stderr}");
}
