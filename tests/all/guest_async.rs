//! An `async` handler runs on a real reactor: `.await` on a timer or on a response suspends
//! the instance in the host's `wasi:io/poll` instead of spinning, so waiting costs neither fuel
//! nor CPU, and requests joined together are in flight at the same time.

use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// The reason of the dead letter whose origin is `id` (the fixture reports by dead-lettering).
async fn reason_of(conn: &redis::aio::MultiplexedConnection, stream: &str, id: &str) -> String {
    wait_for(T, &format!("the report for {id}"), || {
        let mut conn = conn.clone();
        async move {
            dead_lettered(&mut conn, stream)
                .await
                .into_iter()
                .find(|(_, f)| field(f, "sluice-origin-id") == Some(id))
                .and_then(|(_, f)| field(&f, "sluice-reason").map(str::to_owned))
        }
    })
    .await
}

/// The number after `name=` in `text`.
fn number(text: &str, name: &str) -> u64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {text:?}"))
}

/// User plus system CPU time of a process, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = &stat[stat.rfind(") ").expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaiting_a_timer_costs_no_fuel_and_no_cpu() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // 5M instructions: a 300 ms spin burns ~100x that, a suspended wait a few thousand.
    let host = HostProcess::run(
        &redis,
        TestConfig::of(
            Sub::fixture("waits")
                .set("fuel", 5_000_000)
                .set("max_retries", 0),
        ),
    );
    let awaited = add(&mut conn, "waits", &Control::Await { ms: 300 }).await;
    let slept = reason_of(&conn, "waits", &awaited).await;
    assert!(
        (300..1_000).contains(&number(&slept, "slept")),
        "the timer fired after its 300 ms and the budget held: {slept}"
    );
    // The same wait as a busy loop runs out of the same budget: the budget is real.
    let spun = add(&mut conn, "waits", &Control::Slow { ms: 300 }).await;
    let spun = reason_of(&conn, "waits", &spun).await;
    assert!(spun.contains("ran out of fuel"), "{spun}");

    // CPU: a 2 s await costs the host process a small fraction of 2 s.
    let pid = host.child.id();
    let before = cpu_time(pid);
    let long = add(&mut conn, "waits", &Control::Await { ms: 2_000 }).await;
    let report = reason_of(&conn, "waits", &long).await;
    let used = cpu_time(pid) - before;
    assert!(number(&report, "slept") >= 2_000, "{report}");
    assert!(
        used < Duration::from_millis(500),
        "a 2 s await used {used:?} of the host's CPU"
    );
}

/// A server whose `POST /delay/{ms}` answers after `ms` milliseconds.
async fn delaying_server() -> std::net::SocketAddr {
    use axum::extract::Path;
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/delay/{ms}",
        post(|Path(ms): Path<u64>| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            "late"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_requests_are_in_flight_together() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let server = delaying_server().await;
    let grant = format!(r#"["http://{server}"]"#);
    let _host = HostProcess::run(
        &redis,
        TestConfig::of(
            Sub::fixture("joins")
                .set("allowed_outbound_hosts", Raw(&grant))
                .set("max_retries", 0),
        ),
    );
    let urls = vec![format!("http://{server}/delay/300"); 2];
    let joined = add(
        &mut conn,
        "joins",
        &Control::HttpMany {
            urls: urls.clone(),
            sequential: false,
        },
    )
    .await;
    let sequential = add(
        &mut conn,
        "joins",
        &Control::HttpMany {
            urls,
            sequential: true,
        },
    )
    .await;
    let joined = reason_of(&conn, "joins", &joined).await;
    let sequential = reason_of(&conn, "joins", &sequential).await;
    assert!(joined.ends_with("statuses=200,200"), "{joined}");
    assert!(sequential.ends_with("statuses=200,200"), "{sequential}");
    let (joined, sequential) = (number(&joined, "elapsed"), number(&sequential, "elapsed"));
    assert!(
        (300..580).contains(&joined),
        "two joined 300 ms requests took {joined} ms"
    );
    assert!(
        sequential >= 600,
        "one after the other they take the sum: {sequential} ms"
    );
}
