//! Faults inside a guest cost the host nothing and never cost an entry: a looping, memory-hungry
//! or endlessly recursing guest is stopped, the attempt fails with a reason that names the limit,
//! and the host keeps serving the same and other subscriptions. Capabilities a guest was not
//! granted stay denied even though its WASI imports are linked; whatever its grant, a guest
//! never reaches the host's admin API, and what it holds on the host (resources, log lines) is
//! bounded.

use std::time::Duration;

use crate::common::memory::{LetterSummary, letter_summaries, peak_resident, resident};
use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// Two subscriptions on the fixture: `stream` (the one under test, `max_retries = 0`, with
/// `extra` keys) and its bystander.
fn two_subscriptions(stream: Sub) -> TestConfig {
    let bystander = format!("{}-bystander", stream.stream());
    TestConfig::of(stream.set("max_retries", 0)).and(Sub::fixture(&bystander))
}

/// Run the `sluice` binary on `stream` and its bystander; put a faulting entry on `stream` and
/// healthy ones on both. The healthy ones are acked while the fault runs its course, the fault is
/// dead-lettered (`max_retries = 0`), and the host keeps serving. Returns the dead letter's
/// reason and the host's log line for the failed attempt.
async fn fault(sub: Sub, mode: Control) -> (String, String) {
    misbehave(sub, mode, "attempt failed").await
}

/// [`fault`] for any entry that ends dead-lettered; `marker` picks its log line.
async fn misbehave(sub: Sub, mode: Control, marker: &str) -> (String, String) {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = &sub.stream().to_owned();
    let host = HostProcess::run(&redis, two_subscriptions(sub));
    let bystander = format!("{stream}-bystander");
    let bad = add(&mut conn, stream, &mode).await;
    let same = add(&mut conn, stream, &Control::Ack).await;
    let other = add(&mut conn, &bystander, &Control::Ack).await;
    let dead = wait_dead_letters(&conn, stream, 1).await;
    assert_eq!(dead.len(), 1, "only the fault is dead-lettered: {dead:?}");
    let fields = &dead[0].1;
    assert_eq!(field(fields, "sluice-origin-id"), Some(bad.as_str()));
    let reason = field(fields, "sluice-reason").unwrap().to_owned();
    wait_for(T, "the healthy entries on both subscriptions", || {
        let mut conn = conn.clone();
        let (same, other, bystander) = (same.clone(), other.clone(), bystander.clone());
        async move {
            (acked_through(&mut conn, stream, "g", &same).await
                && acked_through(&mut conn, &bystander, "g", &other).await)
                .then_some(())
        }
    })
    .await;
    // The host is still up and serving.
    let after = add(&mut conn, stream, &Control::Ack).await;
    wait_acked(&conn, stream, "g", &after).await;
    let line = wait_for(T, "the entry's line in the host's log", || {
        let text = host.log_text();
        let bad = bad.clone();
        async move {
            text.lines()
                .find(|l| l.contains(marker) && l.contains(&bad))
                .map(str::to_owned)
        }
    })
    .await;
    assert!(
        line.contains(&format!("stream={stream}")) && line.contains("digest="),
        "the log line names the stream, the entry and the digest: {line}"
    );
    (reason, line)
}

/// Both the dead letter's reason and the host's log line say `what`.
fn both_say(fault: &(String, String), what: &str) {
    let (reason, line) = fault;
    assert!(reason.contains(what), "reason: {reason}");
    assert!(line.contains(what), "log line: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_is_interrupted_at_its_deadline() {
    let fault = fault(
        Sub::fixture("looping").set("handler_timeout", "300ms"),
        Control::Loop,
    )
    .await;
    both_say(&fault, "handler exceeded its time limit of 300ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_blocked_in_a_host_call_is_stopped_at_its_deadline() {
    // Sleeping waits in WASI's poll, outside wasm code, where epoch interruption cannot reach.
    let fault = fault(
        Sub::fixture("sleeping").set("handler_timeout", "300ms"),
        Control::Sleep { ms: 60_000 },
    )
    .await;
    both_say(&fault, "handler exceeded its time limit of 300ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fuel_budget_stops_a_loop_deterministically() {
    let fault = fault(Sub::fixture("metered").set("fuel", 5000000), Control::Loop).await;
    both_say(&fault, "ran out of fuel (budget 5000000 per delivery)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocating_past_the_memory_limit_fails_the_attempt() {
    let fault = fault(
        Sub::fixture("hungry").set("memory_limit", "16MiB"),
        Control::Alloc,
    )
    .await;
    both_say(&fault, "memory limit of 16777216 bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_recursion_traps_cleanly() {
    let fault = fault(Sub::fixture("deep"), Control::Recurse).await;
    both_say(&fault, "guest trapped");
    let reason = &fault.0;
    // Rust keeps its stack in linear memory: running off its end is an out-of-bounds access
    // (a frame-less recursion would instead exhaust wasmtime's call-stack limit). Either way
    // the guest traps and the host says so.
    assert!(
        reason.contains("guest trapped")
            && (reason.contains("out of bounds memory access")
                || reason.contains("call stack exhausted")),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_reported_with_its_message() {
    let fault = fault(Sub::fixture("panics"), Control::Trap).await;
    both_say(&fault, "handler panicked at");
    both_say(&fault, "fixture trap on attempt 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_environment_and_sockets_are_denied() {
    // A real listener the guest would reach if sockets were allowed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();
    // The guest was built with std's WASI imports for all three; it dead-letters with what
    // each attempt got.
    let probe = misbehave(
        Sub::fixture("caps"),
        Control::Probe {
            target: target.to_string(),
        },
        "dead-lettering",
    )
    .await;
    both_say(&probe, "file=denied");
    both_say(&probe, "env=denied");
    both_say(&probe, "socket=denied");
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "nothing connected to the listener"
    );
}

/// A local HTTP server that counts its requests: `POST /echo` answers `echo:<body>`,
/// `POST /slow` answers only after 30 s.
struct Upstream {
    addr: std::net::SocketAddr,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Upstream {
    async fn start() -> Self {
        use axum::routing::post;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let app = axum::Router::new()
            .route(
                "/echo",
                post(|body: String| async move { format!("echo:{body}") }),
            )
            .route(
                "/slow",
                post(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "too late"
                }),
            )
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    next.run(req)
                },
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_http_reaches_granted_hosts_only_and_is_time_bounded() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let granted = Upstream::start().await;
    let other = Upstream::start().await;
    let grant = format!(r#"["http://{}", "https://*.example.com"]"#, granted.addr);
    let host = HostProcess::run(
        &redis,
        two_subscriptions(
            Sub::fixture("web")
                .set("allowed_outbound_hosts", Raw(&grant))
                .set("http_timeout", "1s"),
        ),
    );
    let http = |url: String| Control::Http {
        url: url.to_string(),
        body: "hello".into(),
        timeout_ms: 0,
        traceparent: String::new(),
    };
    let allowed = add(
        &mut conn,
        "web",
        &http(format!("http://{}/echo", granted.addr)),
    )
    .await;
    let denied = add(
        &mut conn,
        "web",
        &http(format!("http://{}/echo", other.addr)),
    )
    .await;
    let slow = add(
        &mut conn,
        "web",
        &http(format!("http://{}/slow", granted.addr)),
    )
    .await;
    let same = add(&mut conn, "web", &Control::Ack).await;
    let bystander = add(&mut conn, "web-bystander", &Control::Ack).await;

    let dead = wait_for(T, "three dead letters", || {
        let mut conn = conn.clone();
        async move {
            let dead = dead_lettered(&mut conn, "web").await;
            (dead.len() == 3).then_some(dead)
        }
    })
    .await;
    let reason = |id: &str| reason_of_origin(&dead, id);
    assert_eq!(reason(&allowed), "status=200 body=echo:hello");
    let denial = reason(&denied);
    assert!(
        denial.contains("denied by the host") && denial.contains(&other.addr.to_string()),
        "{denial}"
    );
    assert!(reason(&slow).contains("timed out"), "{}", reason(&slow));
    assert_eq!(other.hits(), 0, "the denied host was never contacted");
    assert_eq!(granted.hits(), 2, "the granted host got /echo and /slow");
    // The healthy entries on the same and the other subscription were served.
    wait_for(T, "the healthy entries acked", || {
        let mut conn = conn.clone();
        let (same, bystander) = (same.clone(), bystander.clone());
        async move {
            (acked_through(&mut conn, "web", "g", &same).await
                && acked_through(&mut conn, "web-bystander", "g", &bystander).await)
                .then_some(())
        }
    })
    .await;
    // The host logged the denial inside the delivery's span.
    let log = wait_for(T, "the denial in the host's log", || {
        let text = host.log_text();
        async move { text.contains("outbound HTTP denied").then_some(text) }
    })
    .await;
    let line = log
        .lines()
        .find(|l| l.contains("outbound HTTP denied"))
        .unwrap();
    // And counted, per subscription.
    let (_, metrics) = http_get(host.admin_addr().await, "/metrics").await;
    assert!(
        metrics.contains(r#"sluice_http_denied_total{stream="web",group="g"} 1"#)
            && metrics.contains(r#"sluice_http_denied_total{stream="web-bystander",group="g"} 0"#),
        "{metrics}"
    );
    assert!(
        line.contains(&format!("http://{}", other.addr))
            && line.contains("allowed_outbound_hosts")
            && line.contains("web")
            && line.contains(&denied),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_components_that_import_wasi_http_are_linked_with_it() {
    // The fixture's v1 build sends HTTP, its v2 build does not: the host links `wasi:http` for
    // the first only (each definition costs fresh instances time), and both run (swap tests).
    let runtime = sluice_host::runtime::Runtime::new(None, Default::default()).unwrap();
    assert!(
        runtime
            .load(&guests().fixture)
            .await
            .unwrap()
            .imports_wasi_http()
    );
    assert!(
        !runtime
            .load(&guests().fixture_v2)
            .await
            .unwrap()
            .imports_wasi_http()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_never_reaches_the_admin_api_whatever_its_grant() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(
        &redis,
        Sub::fixture("nosy").set("max_retries", 0).set(
            "allowed_outbound_hosts",
            Raw(r#"["http://*:*", "http://127.0.0.1:*"]"#),
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
                traceparent: String::new(),
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
    let mut host = start_fixture(
        &redis,
        TestConfig::of(
            Sub::fixture("leak")
                .set("max_retries", 0)
                .set("memory_limit", "8MiB"),
        )
        .and(
            Sub::fixture("leak-granted")
                .set("max_retries", 0)
                .set("allowed_outbound_hosts", Raw(r#"["https://example.com"]"#)),
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
    let host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("flood").set("max_retries", 0)),
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
async fn a_huge_dead_letter_reason_is_cut_counted_and_logged_cut() {
    // Five small entries whose handler answers a 40 MiB reason each: before the bound, Redis
    // grew by 250 MB and the log by 210 MB.
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("amp").set("memory_limit", "256MiB")),
    );
    let forged = "2026-01-01T00:00:00.000000Z  INFO sluice_host: forged";
    for _ in 0..5 {
        add(
            &mut conn,
            "amp",
            &Control::DeadLong {
                prefix: forged.to_owned(),
                bytes: 40 << 20,
            },
        )
        .await;
    }
    let dead = wait_dead_letters(&conn, "amp", 5).await;
    for (_, fields) in &dead {
        let reason = field(fields, "sluice-reason").unwrap();
        assert!(
            reason.len() <= 4096 + 16,
            "a reason of {} bytes",
            reason.len()
        );
        assert!(
            reason.starts_with(forged) && reason.ends_with("…[cut]"),
            "{reason:.200}"
        );
        assert!(!reason.contains('\n'), "the newline is escaped");
    }
    let (_, metrics) = http_get(host.admin_addr().await, "/metrics").await;
    let cut: u64 = metrics
        .lines()
        .find(|l| l.starts_with("sluice_reasons_cut_total{stream=\"amp\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert_eq!(cut, 5, "{metrics}");
    let used: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    assert!(used < 64 << 20, "Redis holds {used} bytes");
    let log = host.log_text();
    assert!(
        log.len() < 1 << 20,
        "the host log grew by {} bytes",
        log.len()
    );
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01T00:00:00")),
        "a guest forged a host log line"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_guest_is_held_to_the_same_sandbox() {
    // Python brings a whole interpreter, with `open`, `os.environ`, `socket`: none of it
    // reaches the host, HTTP reaches only the grant, and memory and time are bounded.
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let granted = Upstream::start().await;
    let other = Upstream::start().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let component = probe_python().display().to_string();
    let grant = format!(r#"["http://{}"]"#, granted.addr);
    let _host = HostProcess::run(
        &redis,
        TestConfig::of(
            Sub::new(&component, "probe-python")
                .set("max_retries", 0)
                .set("allowed_outbound_hosts", Raw(&grant))
                .set("handler_timeout", "2s"),
        ),
    );
    // Six deliveries holding an instance each at once first: the instance pool has room for
    // as many Python instances as `max_in_flight` allows (each instantiates ~14 core modules).
    let hold = ("hold", serde_json::json!({"attack": "hold"}));
    let attacks = [
        hold.clone(),
        hold.clone(),
        hold.clone(),
        hold.clone(),
        hold.clone(),
        hold,
        ("file", serde_json::json!({"attack": "file"})),
        ("env", serde_json::json!({"attack": "env"})),
        (
            "socket",
            serde_json::json!({"attack": "socket", "port": port}),
        ),
        (
            "http",
            serde_json::json!({"attack": "http", "url": format!("http://{}/echo", other.addr)}),
        ),
        ("alloc", serde_json::json!({"attack": "alloc"})),
        ("loop", serde_json::json!({"attack": "loop"})),
        (
            "raise",
            serde_json::json!({"attack": "raise", "account": "acct-7"}),
        ),
    ];
    // The interpreter component compiles before the host reads (seconds alone, much more on a
    // loaded machine): the deliveries' deadline starts once it serves.
    wait_for(Duration::from_secs(240), "the host to serve", || {
        let log = _host.log_text();
        async move { log.contains("admin server listening").then_some(()) }
    })
    .await;
    let mut ids = Vec::new();
    for (name, payload) in &attacks {
        ids.push((*name, add(&mut conn, "probe-python", payload).await));
    }
    let dead = wait_dead_letters(&conn, "probe-python", attacks.len()).await;
    let reason = |id: &str| reason_of_origin(&dead, id);
    for (name, id) in &ids {
        let why = reason(id);
        match *name {
            "hold" => assert_eq!(why, "held"),
            "alloc" => assert!(why.contains("memory limit"), "{name}: {why}"),
            "loop" => assert!(why.contains("time limit"), "{name}: {why}"),
            "http" => assert!(
                why.starts_with("denied") && why.contains("denied by the host"),
                "{name}: {why}"
            ),
            // The short form: the exception, where it was raised; the traceback apart.
            "raise" => {
                assert!(
                    why.contains(
                        "last attempt: handler raised ValueError: no account acct-7\\n2026-01-01T00:00:00Z  INFO forged (app.py:"
                    ) && why.ends_with("in charge)"),
                    "{name}: {why}"
                );
                let letter = dead
                    .iter()
                    .find(|(_, f)| field(f, "sluice-origin-id") == Some(id.as_str()))
                    .map(|(_, f)| f)
                    .unwrap();
                let trace = field(letter, "sluice-trace").unwrap_or_default();
                assert!(
                    trace.starts_with("Traceback (most recent call last):")
                        && trace.contains("File \"app.py\", line")
                        && trace.contains("in charge")
                        && trace.lines().count() >= 4,
                    "the traceback, as lines, in its own field: {trace}"
                );
            }
            _ => assert!(why.starts_with("denied"), "{name}: {why}"),
        }
    }
    // The exception is logged once, with its traceback as lines under it; no line of it can
    // pass for one of the host's.
    let log = _host.log_text();
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("handler raised ValueError: no account acct-7"))
        .collect();
    assert_eq!(failures.len(), 1, "logged once per attempt: {failures:?}");
    assert!(
        failures[0].contains("attempt failed; dead-lettering"),
        "{}",
        failures[0]
    );
    assert!(
        log.contains("    | Traceback (most recent call last):"),
        "the traceback under it"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01T00:00:00Z")),
        "a guest forged a host log line"
    );
    assert_eq!(
        other.hits(),
        0,
        "the host outside the grant was never contacted"
    );
    assert!(
        listener.accept().is_err(),
        "nothing connected to the socket"
    );
}

/// A memory cgroup (v1) holding one process to a limit, removed when dropped; `None` where
/// the machine has none to make (not root): CI (`SLUICE_CI=1`) runs as root and must.
struct MemoryLimit(std::path::PathBuf);

impl MemoryLimit {
    fn hold(pid: u32, bytes: u64) -> Option<Self> {
        let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory/sluice-test-{pid}"));
        let made = std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string()))
            .and_then(|()| std::fs::write(dir.join("cgroup.procs"), pid.to_string()));
        match made {
            Ok(()) => Some(Self(dir)),
            Err(err) => {
                let _ = std::fs::remove_dir(&dir);
                assert!(
                    std::env::var_os("SLUICE_CI").is_none(),
                    "no memory cgroup for the test under SLUICE_CI: {err}"
                );
                eprintln!("no memory cgroup ({err}): the limit is not applied");
                None
            }
        }
    }

    /// Whether the kernel killed anything in it for memory.
    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.oom_control"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        // Its process back to the root group, so that the group can go.
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/memory/cgroup.procs", pid);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Four 100 MB entries added at once, to a host held to 700 MB by a memory cgroup: it holds
/// none of them whole (a value over `max_entry_bytes` is dropped as it arrives), dead-letters
/// each unhandled with its fields copied whole inside Redis, and lives on (before: the first
/// read after a start took all of them and more, 873 MB for four 100 MB entries and 4.4 GB for
/// three of 400 MB, and a limit killed it again at every restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_100_mb_entries_under_a_700_mb_limit_are_dead_lettered_and_the_host_lives() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let host = HostProcess::run(&redis, TestConfig::of(Sub::fixture("huge")));
    host.admin_addr().await;
    let first = add(&mut conn, "huge", &Control::Ack).await;
    wait_acked(&conn, "huge", "g", &first).await;
    let limit = MemoryLimit::hold(host.pid(), 700 << 20);
    let blob = vec![b'x'; 100 << 20];
    let mut huge = Vec::new();
    for _ in 0..4 {
        let id: String = redis::cmd("XADD")
            .arg("huge")
            .arg("*")
            .arg("payload")
            .arg(Control::Ack.to_string())
            .arg("blob")
            .arg(&blob)
            .query_async(&mut conn)
            .await
            .unwrap();
        huge.push(id);
    }
    drop(blob);
    let small = add(&mut conn, "huge", &Control::Ack).await;
    wait_acked(&conn, "huge", "g", &small).await;
    let letters = letter_summaries(&mut conn, "huge").await;
    assert_eq!(letters.len(), 4, "{letters:?}");
    for LetterSummary {
        reason,
        origin,
        blob,
        ..
    } in &letters
    {
        assert!(
            reason.contains("over max_entry_bytes") && reason.contains("without being handled"),
            "{reason}"
        );
        assert!(huge.contains(origin), "{origin}");
        assert_eq!(*blob, 100 << 20, "copied whole");
    }
    let peak = peak_resident(host.pid());
    eprintln!("host peak resident memory: {} MiB", peak >> 20);
    assert!(peak < 700 << 20, "peak resident {} MiB", peak >> 20);
    if let Some(limit) = &limit {
        assert_eq!(limit.oom_kills(), 0, "the host was killed for memory");
    }
    assert!(
        std::path::Path::new(&format!("/proc/{}", host.pid())).exists(),
        "the host lives"
    );
    assert!(!host.log_text().contains("attempt failed"), "never handled");
    drop(host);
    drop(limit);
}

/// Sixty 7 MiB entries (each under `max_entry_bytes`) added at once: a read keeps at most
/// 64 MiB of them and leaves the rest to be read again alone, so the host never holds the
/// 420 MB a read of them all would (before: the first read after a start took `count` entries
/// of any size); every one is handled, none dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_holds_at_most_its_budget_and_handles_the_rest_alone() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let host = HostProcess::run(&redis, TestConfig::of(Sub::fixture("wide")));
    host.admin_addr().await;
    let first = add(&mut conn, "wide", &Control::Ack).await;
    wait_acked(&conn, "wide", "g", &first).await;
    let blob = vec![b'x'; 7 << 20];
    let mut last = String::new();
    for _ in 0..60 {
        last = redis::cmd("XADD")
            .arg("wide")
            .arg("*")
            .arg("payload")
            .arg(Control::Ack.to_string())
            .arg("blob")
            .arg(&blob)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    drop(blob);
    // Every wide entry.
    wait_acked_within(&conn, "wide", "g", &last, Duration::from_secs(120)).await;
    assert!(dead_lettered(&mut conn, "wide").await.is_empty());
    let peak = peak_resident(host.pid());
    eprintln!("host peak resident memory: {} MiB", peak >> 20);
    assert!(peak < 400 << 20, "peak resident {} MiB", peak >> 20);
}

/// An entry over `max_entry_bytes` only as a whole: 150 fields of 1,000 KiB each, under a
/// 1 MiB limit (found by an attack: the per-value cut let it through, and the read held all
/// 146 MiB of it). The read keeps its budget of it, sees the whole is over the limit, and
/// dead-letters it from Redis, copied whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_over_the_limit_only_as_a_whole_is_not_read_whole() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("fields").set("max_entry_bytes", "1MiB")),
    );
    host.admin_addr().await;
    let first = add(&mut conn, "fields", &Control::Ack).await;
    wait_acked(&conn, "fields", "g", &first).await;
    let value = vec![b'x'; 1000 << 10];
    let mut xadd = redis::cmd("XADD");
    xadd.arg("fields")
        .arg("*")
        .arg("payload")
        .arg(Control::Ack.to_string());
    for i in 0..150 {
        xadd.arg(format!("f{i}")).arg(&value);
    }
    let wide: String = xadd.query_async(&mut conn).await.unwrap();
    drop((xadd, value));
    let after = add(&mut conn, "fields", &Control::Ack).await;
    wait_acked(&conn, "fields", "g", &after).await;
    let letter = letter_summaries(&mut conn, "fields").await.remove(0);
    let (reason, fields) = (letter.reason, letter.fields);
    assert!(reason.contains("over max_entry_bytes"), "{reason}");
    assert!(fields > 150, "copied whole: {fields} fields");
    let peak = peak_resident(host.pid());
    eprintln!(
        "host peak resident memory: {} MiB (the entry: 146 MiB)",
        peak >> 20
    );
    assert!(peak < 250 << 20, "peak resident {} MiB", peak >> 20);
    let _ = wide;
}

/// A 200 MB entry another consumer left pending, taken over by a claiming subscription
/// (XAUTOCLAIM): claimed by id and read alone through the lean reader, it is never held
/// (before: the claim's reply carried it whole, twice over in the host's memory), and is
/// dead-lettered unhandled, copied whole in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_taken_over_from_another_consumer_is_not_read_whole() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "claimed", "g", "$").await;
    let huge: String = memory::add_blob(&mut conn, "claimed", 200 << 20).await;
    // Pending to a consumer that is gone, read inside Redis (nothing comes back here).
    memory::pend_to_gone(&mut conn, "claimed").await;
    let host = HostProcess::run(
        &redis,
        TestConfig::of(Sub::fixture("claimed").set("claim_min_idle", "100ms")),
    );
    host.admin_addr().await;
    let (reason, blob) = wait_for(Duration::from_secs(60), "the dead letter", || {
        let mut conn = conn.clone();
        async move {
            letter_summaries(&mut conn, "claimed")
                .await
                .pop()
                .map(|l| (l.reason, l.blob))
        }
    })
    .await;
    assert!(reason.contains("over max_entry_bytes"), "{reason}");
    assert_eq!(blob, 200 << 20, "copied whole");
    let peak = peak_resident(host.pid());
    eprintln!(
        "host peak resident memory: {} MiB (the entry: 200 MB)",
        peak >> 20
    );
    assert!(peak < 200 << 20, "peak resident {} MiB", peak >> 20);
    let _ = huge;
}

/// A 200 MB entry left pending by a consumer that is gone, whose take-over's reply is lost
/// (the connection dies right after XCLAIM ran): the host finds the entry pending to itself and
/// reads it alone through the lean reader, cut as any read is, and dead-letters it unhandled
/// (before: that re-read was an XRANGE through redis-rs's parser: 1.28 GB peak, found by the
/// attack review of issue 52).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_a_lost_take_over_made_ours_is_not_read_whole() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "stranded", "g", "0").await;
    let huge: String = memory::add_blob(&mut conn, "stranded", 200 << 20).await;
    // Pending to a consumer that is gone, read inside Redis (nothing comes back here).
    memory::pend_to_gone(&mut conn, "stranded").await;
    let small = add(&mut conn, "stranded", &Control::Ack).await;
    let proxy = CutProxy::start(format!("127.0.0.1:{}", redis.server.port()), b"XCLAIM").await;
    let config = TestConfig::of(
        Sub::fixture("stranded")
            .set("consumer", "new-pod")
            .set("consumer_gone_after", "1s"),
    )
    .set("redis", proxy.url());
    let host = HostProcess::spawn_in(config);
    wait_acked(&conn, "stranded", "g", &small).await;
    let found = wait_for(Duration::from_secs(60), "the dead letter", || {
        let mut conn = conn.clone();
        async move {
            let found = memory::letter_summaries(&mut conn, "stranded").await;
            (!found.is_empty()).then_some(found)
        }
    })
    .await;
    assert!(proxy.has_cut(), "the take-over's reply was never cut");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].reason.contains("over max_entry_bytes"),
        "{found:?}"
    );
    assert_eq!((&*found[0].origin, found[0].blob), (&*huge, 200 << 20));
    assert!(
        host.log_text().contains("a take-over's reply was lost"),
        "{}",
        host.log_text()
    );
    let peak = peak_resident(host.pid());
    eprintln!(
        "host peak resident memory: {} MiB (the entry: 200 MB)",
        peak >> 20
    );
    assert!(peak < 150 << 20, "peak resident {} MiB", peak >> 20);
}

/// A 200 MB entry in a partition, there before the host starts: the partition's own first
/// read takes it (not the shared blocking read), on the node's pooled lean connections, which
/// drop the value as it arrives (before: that read went through the shared redis-rs
/// connection, which buffered and parsed the whole reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_in_a_partition_is_not_read_whole() {
    let part = sluice_descriptor::partition_key("parts", "parts", 0);
    let letters = sluice_descriptor::partition_key(
        &sluice_descriptor::default_dead_letter("parts", "g"),
        "parts",
        0,
    );
    let config = TestConfig::of(Sub::fixture("parts").set("partitions", 4));
    one_big_entry_is_not_read_whole(config, (&part, &letters), Big::OneValue, false).await;
}

/// A 200 MB entry written to an idle stream the doorbell polls: the doorbell's own read
/// (`XREAD COUNT 1 BLOCK` over the idle streams) only learns that the stream got an entry,
/// never holding its value (before: that read buffered and parsed the whole entry), and the
/// subscription's read dead-letters it unhandled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_is_not_read_whole_by_the_doorbell() {
    let letters = dead_letter_key("rung");
    let config = TestConfig::of(Sub::fixture("rung")).set("doorbell", "poll");
    one_big_entry_is_not_read_whole(config, ("rung", &letters), Big::SmallFields, true).await;
}

/// A 200 MB entry of 50,000 fields of 4 KiB (none over `max_entry_bytes`, the whole far
/// over): the read drops its fields once the entry passes the limit, and the entry is
/// dead-lettered unhandled. Then what an operator does after the alert: `/metrics` is scraped,
/// the dead letters are listed and the entry's page is opened through the API, while the
/// entry stays in the stream and its copy in the dead letters: none of it reads the entry
/// whole (found by the attack review of issue 52: 1.52 GB for the read, an OOM kill at every
/// start under 700 MiB; 466 MB for one scrape of /metrics, 933 MB for the listing, 1.14 GB for
/// the entry's page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_of_small_fields_is_not_read_whole_nor_by_the_operators_views() {
    let letters = dead_letter_key("wide");
    let config = TestConfig::of(Sub::fixture("wide"));
    let (_redis, host, huge) =
        one_big_entry_is_not_read_whole(config, ("wide", &letters), Big::SmallFields, true).await;
    let admin = host.admin_addr().await;
    let (status, metrics) = http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("sluice_"),
        "{}",
        &metrics[..metrics.len().min(300)]
    );
    let (status, listing) = http_request(
        admin,
        "GET",
        "/v1/subscriptions/wide/g/dead-letters",
        &[],
        b"",
    )
    .await;
    assert_eq!(status, 200, "{}", &listing[..listing.len().min(300)]);
    // The copy holds the fields packed in one value (binary, shown in hex): cut for display,
    // its size said.
    let said: String = " bytes in all, cut to "
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        listing.contains(&said),
        "{}",
        &listing[..listing.len().min(600)]
    );
    assert!(listing.len() < 4 << 20, "{} bytes", listing.len());
    let (status, page) = http_request(
        admin,
        "GET",
        &format!("/v1/subscriptions/wide/g/entries/{huge}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(status, 200, "{}", &page[..page.len().min(300)]);
    assert!(
        page.contains("more fields"),
        "{}",
        &page[..page.len().min(300)]
    );
    let peak = peak_resident(host.pid());
    eprintln!(
        "host peak resident memory after the operator's looks: {} MiB",
        peak >> 20
    );
    assert!(peak < 150 << 20, "peak resident {} MiB", peak >> 20);
}

/// How the 200 MB of a big entry are made.
#[derive(Clone, Copy)]
enum Big {
    /// One value.
    OneValue,
    /// 50,000 fields of 4 KiB.
    SmallFields,
}

/// Add a 200 MB entry (made as `big` says) and a small one to `stream` (after one entry was
/// handled when `started`, else before the host starts) and check that the host dead-letters
/// the big one to `letters` unhandled, handles the small one, and never holds the big one's
/// value; the Redis, the host and the big entry's id back.
async fn one_big_entry_is_not_read_whole(
    config: TestConfig,
    (stream, letters): (&str, &str),
    big: Big,
    started: bool,
) -> (Redis, HostProcess, String) {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let add_big = async |conn: &mut redis::aio::MultiplexedConnection| -> String {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(stream)
            .arg("*")
            .arg("payload")
            .arg(Control::Ack.to_string());
        match big {
            Big::OneValue => {
                xadd.arg("blob").arg(vec![b'x'; 200 << 20]);
            }
            Big::SmallFields => {
                let value = vec![b'x'; 4096];
                for i in 0..50_000 {
                    xadd.arg(format!("f{i}")).arg(&value);
                }
            }
        }
        xadd.query_async(conn).await.unwrap()
    };
    let mut huge = None;
    if !started {
        huge = Some(add_big(&mut conn).await);
    }
    let host = HostProcess::run(&redis, config);
    host.admin_addr().await;
    if started {
        let first = add(&mut conn, stream, &Control::Ack).await;
        wait_acked(&conn, stream, "g", &first).await;
        huge = Some(add_big(&mut conn).await);
    }
    let small = add(&mut conn, stream, &Control::Ack).await;
    wait_acked(&conn, stream, "g", &small).await;
    let found = memory::letters_in(&mut conn, letters).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].reason.contains("over max_entry_bytes"),
        "{found:?}"
    );
    assert_eq!(Some(&found[0].origin), huge.as_ref());
    match big {
        Big::OneValue => assert_eq!(found[0].blob, 200 << 20, "copied whole"),
        // Packed into one value: more fields than one XADD from a script takes.
        Big::SmallFields => assert!(found[0].packed > 50_000 * 4096, "copied whole: {found:?}"),
    }
    let peak = peak_resident(host.pid());
    eprintln!(
        "host peak resident memory: {} MiB (the entry: 200 MB)",
        peak >> 20
    );
    assert!(peak < 150 << 20, "peak resident {} MiB", peak >> 20);
    assert!(!host.log_text().contains("attempt failed"), "never handled");
    (redis, host, huge.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_over_max_entry_bytes_are_dead_lettered_unhandled_and_their_memory_given_back() {
    big_entries_given_back(false).await;
}

/// The same for a subscription that reads through the doorbell (as every subscription of a
/// host of thousands does): its reads take the node's pooled lean connections, which give a
/// big reply's buffer back too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_doorbell_read_path_too_big_entries_memory_is_given_back() {
    big_entries_given_back(true).await;
}

async fn big_entries_given_back(doorbell: bool) {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut config = TestConfig::of(Sub::fixture("big"));
    if doorbell {
        config = config.set("doorbell", "poll");
    }
    let host = HostProcess::run(&redis, config);
    host.admin_addr().await;
    let first = add(&mut conn, "big", &Control::Ack).await;
    wait_acked(&conn, "big", "g", &first).await;
    let before = resident(host.pid());
    // Five 20 MB entries in one read (count 64), each over the 8 MiB default.
    let mut big = Vec::new();
    for _ in 0..5 {
        let id: String = memory::add_blob(&mut conn, "big", 20 << 20).await;
        big.push(id);
    }
    let small = add(&mut conn, "big", &Control::Ack).await;
    wait_acked(&conn, "big", "g", &small).await;
    let dead = wait_dead_letters(&conn, "big", 5).await;
    for (_, fields) in &dead {
        let reason = field(fields, "sluice-reason").unwrap();
        assert!(
            reason.contains("over max_entry_bytes (8388608)")
                && reason.contains("dead-lettered without being handled"),
            "{reason}"
        );
        let origin = field(fields, "sluice-origin-id").unwrap();
        assert!(big.iter().any(|id| id == origin), "{origin}");
        assert_eq!(
            field(fields, "blob").map(str::len),
            Some(20 << 20),
            "kept whole"
        );
    }
    assert!(
        !host.log_text().contains("attempt failed"),
        "the handler never got them"
    );
    // The 100 MB reply's buffer is given back.
    let after = resident(host.pid());
    assert!(
        after < before + (60 << 20),
        "resident {before} before, {after} after"
    );
}
