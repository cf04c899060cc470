//! Effects that happen once (issue 55): every outbound call an attempt makes carries an
//! idempotency key that retries, redeliveries and requeues of the same entry repeat, unless
//! the handler set one itself or the operator asks a requeue for new ones.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_host::EventKind;

use crate::common::*;
use crate::operate::sluice;

const T: Duration = Duration::from_secs(30);

/// Every request the gateway saw: its path and the value of its key header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A payment gateway stand-in: records (path, the value of its key header) for every request;
/// `/receipt` fails its first `receipt_failures` requests, `/down` every one.
pub(crate) struct Gateway {
    addr: std::net::SocketAddr,
    seen: Seen,
}

impl Gateway {
    pub(crate) async fn start(header: &'static str, receipt_failures: usize) -> Self {
        use axum::extract::Path;
        use axum::http::{HeaderMap, StatusCode};
        use axum::routing::post;
        let seen: Seen = Arc::new(Mutex::new(Vec::new()));
        let to = seen.clone();
        let failures = Arc::new(Mutex::new(receipt_failures));
        let app = axum::Router::new().route(
            "/{path}",
            post(move |Path(path): Path<String>, headers: HeaderMap| {
                let (to, failures) = (to.clone(), failures.clone());
                async move {
                    let key = headers
                        .get(header)
                        .map(|v| v.to_str().unwrap_or("(not text)").to_owned());
                    to.lock().unwrap().push((path.clone(), key));
                    // `receipt-hang` never answers its first request (the host is killed then).
                    let first_hang = path == "receipt-hang"
                        && to
                            .lock()
                            .unwrap()
                            .iter()
                            .filter(|(p, _)| p == &path)
                            .count()
                            == 1;
                    if first_hang {
                        std::future::pending::<()>().await;
                    }
                    let mut left = failures.lock().unwrap();
                    let charged = to.lock().unwrap().len();
                    match path.as_str() {
                        "down" => (StatusCode::SERVICE_UNAVAILABLE, String::new()),
                        "receipt" if *left > 0 => {
                            *left -= 1;
                            (StatusCode::INTERNAL_SERVER_ERROR, String::new())
                        }
                        "big" => (StatusCode::OK, "b".repeat(4096)),
                        "big64k" => (StatusCode::OK, "b".repeat(64 * 1024)),
                        "mb" => (StatusCode::OK, "m".repeat(1_000_000)),
                        _ => (StatusCode::OK, format!("{{\"charge\":\"ch_{charged}\"}}")),
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, seen }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    pub(crate) fn grant(&self) -> String {
        format!(r#"["http://{}"]"#, self.addr)
    }

    /// The keys `path` was called with, in order.
    pub(crate) fn keys(&self, path: &str) -> Vec<Option<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, k)| k.clone())
            .collect()
    }
}

pub(crate) fn calls(urls: Vec<String>, headers: Vec<(String, String)>) -> Control {
    Control::Calls {
        urls,
        body: "{\"amount_cents\":1200}".into(),
        headers,
        retry_ms: 20,
        trap: false,
        times: 0,
    }
}

async fn acked(host: &mut TestHost, origin: &str) {
    host.event(T, &format!("{origin} acked"), |e| {
        e.kind == EventKind::Acked && e.origin_id == origin
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_repeats_each_calls_key_and_a_key_the_handler_set_is_kept() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 2).await;
    let sub = Sub::fixture("pay")
        .delayed("pay.delayed")
        .set("allowed_outbound_hosts", Raw(&gateway.grant()));
    let mut host = start_fixture(&redis, sub).await;

    // The charge succeeds, the receipt fails twice: three attempts, each charging again.
    let urls = vec![gateway.url("charge"), gateway.url("receipt")];
    let first = add(&mut conn, "pay", &calls(urls.clone(), Vec::new())).await;
    acked(&mut host, &first).await;
    let charges = gateway.keys("charge");
    let receipts = gateway.keys("receipt");
    assert_eq!((charges.len(), receipts.len()), (3, 3), "three attempts");
    let charge_key = charges[0].clone().expect("the charge carries a key");
    assert!(
        charge_key.starts_with("sluice-") && charge_key.len() == 39,
        "{charge_key}"
    );
    // The key is keyed with the stream's secret: the digest of what a guest knows (stream,
    // group, origin id, position) is not it.
    let secret = sluice_host::store::keys::Secret::load(&mut conn, "pay", &[])
        .await
        .unwrap()
        .expect("a stream with a delayed set has a secret");
    let derive = |key: Option<&str>| {
        use hmac::Mac as _;
        use sha2::Digest as _;
        let mut bytes = Vec::new();
        for part in ["pay", "g", first.as_str(), ""] {
            bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
        bytes.extend_from_slice(&0u64.to_be_bytes());
        let mac = |key: &[u8], data: &[u8]| {
            hmac::Hmac::<sha2::Sha256>::new_from_slice(key)
                .unwrap()
                .chain_update(data)
                .finalize()
                .into_bytes()
        };
        let hash = match key {
            Some(key) => {
                let derived = mac(
                    key.as_bytes(),
                    sluice_host::runtime::effects::IDEMPOTENCY_KEY_USE,
                );
                mac(&derived, &bytes)
            }
            None => sha2::Sha256::digest(&bytes),
        };
        format!("sluice-{}", hex::encode(&hash[..16]))
    };
    assert_ne!(charge_key, derive(None), "not the digest of public parts");
    assert_eq!(charge_key, derive(Some(secret.value())));
    assert!(
        charges.iter().all(|k| k.as_deref() == Some(&charge_key)),
        "every retry repeats the charge's key: {charges:?}"
    );
    let receipt_key = receipts[0].clone().expect("the receipt carries a key");
    assert!(receipts.iter().all(|k| k.as_ref() == Some(&receipt_key)));
    assert_ne!(
        charge_key, receipt_key,
        "the second call of the attempt has its own"
    );

    // Another entry: other keys. A key the handler set goes out as it is.
    let second = add(&mut conn, "pay", &calls(urls.clone(), Vec::new())).await;
    acked(&mut host, &second).await;
    let own = vec![("Idempotency-Key".to_owned(), "mine-1".to_owned())];
    let third = add(&mut conn, "pay", &calls(vec![gateway.url("charge")], own)).await;
    acked(&mut host, &third).await;
    let charges = gateway.keys("charge");
    assert_eq!(charges.len(), 5);
    assert_ne!(charges[3].as_deref(), Some(charge_key.as_str()));
    assert!(
        charges[3]
            .as_deref()
            .is_some_and(|k| k.starts_with("sluice-"))
    );
    assert_eq!(charges[4].as_deref(), Some("mine-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_keeps_the_keys_unless_asked_and_the_header_is_the_configs() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("x-request-key", 0).await;
    let sub = Sub::fixture("req")
        .delayed("req.delayed")
        .set("max_retries", 0)
        .set("idempotency_header", "X-Request-Key")
        .set("allowed_outbound_hosts", Raw(&gateway.grant()));
    let bare = Sub::fixture("bare")
        .set("idempotency_header", "none")
        .set("allowed_outbound_hosts", Raw(&gateway.grant()));
    // Keys without a delayed set: the stream gets a secret to key them with all the same.
    let keyed = Sub::fixture("keyed").set("allowed_outbound_hosts", Raw(&gateway.grant()));
    let config = TestConfig::of(sub.clone()).and(bare).and(keyed);
    let _host = start_fixture(&redis, config.clone()).await;
    let (_dir, path) = config_file(&config);
    wait_for(T, "the keyed stream's secret", || {
        let mut conn = conn.clone();
        async move {
            let n: u32 = cmd(
                &mut conn,
                &["EXISTS", &sluice_host::store::keys::secret_key("keyed")],
            )
            .await;
            (n == 1).then_some(())
        }
    })
    .await;
    let bare: u32 = cmd(
        &mut conn,
        &["EXISTS", &sluice_host::store::keys::secret_key("bare")],
    )
    .await;
    assert_eq!(bare, 0, "no keys, no set: no secret");

    // Charged, then the service is down: dead-lettered (no retries allowed).
    let urls = vec![gateway.url("charge"), gateway.url("down")];
    add(&mut conn, "req", &calls(urls, Vec::new())).await;
    wait_dead_letters(&conn, "req", 1).await;
    let first = gateway.keys("charge")[0].clone().expect("a key");
    let dead_letter_id = || {
        let mut conn = conn.clone();
        async move { dead_lettered(&mut conn, "req").await[0].0.clone() }
    };

    // Requeued as it is: the same keys. Requeued asking for new ones: new keys, which a
    // later plain requeue keeps.
    let id = dead_letter_id().await;
    sluice(&["requeue", &id], &path, &redis).await;
    wait_for(T, "the requeued entry's charge", || async {
        (gateway.keys("charge").len() == 2).then_some(())
    })
    .await;
    wait_dead_letters(&conn, "req", 1).await;
    let id = dead_letter_id().await;
    sluice(&["requeue", &id, "--new-idempotency-keys"], &path, &redis).await;
    wait_for(T, "the second requeue's charge", || async {
        (gateway.keys("charge").len() == 3).then_some(())
    })
    .await;
    wait_dead_letters(&conn, "req", 1).await;
    let id = dead_letter_id().await;
    sluice(&["requeue", &id], &path, &redis).await;
    wait_for(T, "the third requeue's charge", || async {
        (gateway.keys("charge").len() == 4).then_some(())
    })
    .await;
    let charges = gateway.keys("charge");
    assert_eq!(charges[1].as_deref(), Some(first.as_str()), "{charges:?}");
    let renewed = charges[2].clone().expect("a key");
    assert_ne!(renewed, first, "asked for new keys");
    assert_eq!(charges[3].as_deref(), Some(renewed.as_str()), "{charges:?}");
    let downs = gateway.keys("down");
    assert_eq!(downs[0], downs[1]);
    assert_ne!(downs[1], downs[2]);

    // `idempotency_header = "none"`: no key at all.
    let before = gateway.keys("charge").len();
    add(
        &mut conn,
        "bare",
        &calls(vec![gateway.url("charge")], Vec::new()),
    )
    .await;
    wait_for(T, "the bare subscription's charge", || async {
        (gateway.keys("charge").len() > before).then_some(())
    })
    .await;
    assert_eq!(gateway.keys("charge")[before], None);
}

/// `stream` on the fixture with a delayed set, the journal, and a grant to reach `gateway`.
fn journaled(stream: &str, gateway: &Gateway) -> Sub {
    Sub::fixture(stream)
        .delayed(&format!("{stream}.delayed"))
        .set("effects", "journal")
        .set("allowed_outbound_hosts", Raw(&gateway.grant()))
}

/// `config` written where the CLI reads it (the directory goes when dropped).
fn config_file(config: &TestConfig) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "sluice.toml", &config.to_string());
    (dir, path)
}

/// The journal key of `origin` on the test group `g` of `stream`.
fn journal_key(stream: &str, origin: &str) -> String {
    sluice_host::store::keys::effects_key(stream, "g", origin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_journal_a_retry_replays_the_charge_instead_of_charging_again() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 2).await;
    let sub = journaled("pay", &gateway).set("journal_max_response_bytes", "1KiB");
    let mut host = start_fixture(&redis, sub).await;

    // Charged once, its receipt failing twice: the two retries replay the charge.
    let urls = vec![gateway.url("charge"), gateway.url("receipt")];
    let paid = add(&mut conn, "pay", &calls(urls, Vec::new())).await;
    acked(&mut host, &paid).await;
    assert_eq!(gateway.keys("charge").len(), 1, "charged once");
    assert_eq!(gateway.keys("receipt").len(), 3);
    let left: u64 = redis::cmd("EXISTS")
        .arg(journal_key("pay", &paid))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "the journal goes with the ack");
    let (_, metrics) = http_get(host.admin().await, "/metrics").await;
    for line in [
        r#"sluice_journal_calls_total{stream="pay",group="g",reason="replayed"} 2"#,
        r#"sluice_journal_calls_total{stream="pay",group="g",reason="recorded"} 2"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }

    // A response over journal_max_response_bytes is not recorded: live on every attempt.
    let control = Control::Attempts {
        each: vec![
            calls(vec![gateway.url("big"), gateway.url("down")], Vec::new()),
            calls(vec![gateway.url("big")], Vec::new()),
        ],
    };
    let big = add(&mut conn, "pay", &control).await;
    acked(&mut host, &big).await;
    assert_eq!(gateway.keys("big").len(), 2, "called again: not recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_ends_at_the_first_call_that_differs_and_a_journal_is_bounded() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 0).await;
    let sub = journaled("div", &gateway)
        .set("journal_max_calls", 3)
        .set("max_retries", 1)
        .set("journal_max_entry_bytes", "100KiB");
    let mut host = start_fixture(&redis, sub).await;

    // Attempt 1 charges a and b, then the service is down; attempt 2 charges a, then c:
    // a replays, c differs from the recorded b (live), and what follows is live too.
    let attempt = |second: &str, last: &str| {
        calls(
            vec![
                gateway.url("charge-a"),
                gateway.url(second),
                gateway.url(last),
            ],
            Vec::new(),
        )
    };
    let control = Control::Attempts {
        each: vec![attempt("charge-b", "down"), attempt("charge-c", "receipt")],
    };
    let id = add(&mut conn, "div", &control).await;
    acked(&mut host, &id).await;
    assert_eq!(
        gateway.keys("charge-a").len(),
        1,
        "replayed on the second attempt"
    );
    assert_eq!(gateway.keys("charge-b").len(), 1);
    assert_eq!(gateway.keys("charge-c").len(), 1);
    assert_eq!(gateway.keys("receipt").len(), 1);

    // A guest that calls on and on: at most 3 calls and 100 KiB recorded for its entry (one
    // 64 KiB response fits), which stays with its dead letter until its time to live.
    let mut urls = vec![gateway.url("big64k"); 6];
    urls.push(gateway.url("down"));
    let hungry = add(&mut conn, "div", &calls(urls, Vec::new())).await;
    wait_dead_letters(&conn, "div", 1).await;
    assert_eq!(
        gateway.keys("big64k").len(),
        6 + 5,
        "the second attempt replays the one call recorded"
    );
    let key = journal_key("div", &hungry);
    let fields: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let bytes: usize = fields.iter().map(|(_, v)| v.len()).sum();
    assert!(
        !fields.is_empty() && fields.len() <= 3 && bytes <= 100 * 1024 + 1024,
        "{} calls, {bytes} bytes recorded",
        fields.len()
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0, "a journal left behind expires");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_making_ten_thousand_calls_of_a_megabyte_grows_redis_by_its_bounds_only() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 0).await;
    // Responses of 1 MB may be recorded, 4 MiB an entry (the default).
    let sub = journaled("hungry", &gateway)
        .set("journal_max_response_bytes", "2MiB")
        .set("max_retries", 0)
        .set("handler_timeout", "5m");
    let mut host = start_fixture(&redis, sub).await;
    let used = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut conn)
                .await
                .unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .expect("used_memory in INFO")
        }
    };
    let before = used(&mut conn).await;
    let control = Control::Calls {
        urls: vec![gateway.url("mb"), gateway.url("down")],
        body: String::new(),
        headers: Vec::new(),
        retry_ms: 20,
        trap: false,
        times: 10_000,
    };
    let id = add(&mut conn, "hungry", &control).await;
    host.event(
        Duration::from_secs(300),
        "the hungry entry dead-lettered",
        |e| matches!(e.kind, EventKind::DeadLettered { .. }) && e.origin_id == id,
    )
    .await;
    assert_eq!(gateway.keys("mb").len(), 10_000, "every call went out");
    let fields: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(journal_key("hungry", &id))
        .query_async(&mut conn)
        .await
        .unwrap();
    let bytes: usize = fields.iter().map(|(_, v)| v.len()).sum();
    assert!(
        (1..=4).contains(&fields.len()) && bytes <= 4 * 1024 * 1024,
        "{} calls, {bytes} bytes recorded",
        fields.len()
    );
    let grown = used(&mut conn).await.saturating_sub(before);
    assert!(grown < 6 * 1024 * 1024, "Redis grew by {grown} bytes");
    let (_, metrics) = http_get(host.admin().await, "/metrics").await;
    let full = r#"sluice_journal_calls_total{stream="hungry",group="g",reason="journal_full"}"#;
    let counted = metrics
        .lines()
        .find_map(|l| l.strip_prefix(full))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert_eq!(counted, Some(10_000 - fields.len() as u64), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_after_the_charge_and_before_the_ack_charges_once() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 0).await;
    let run = RunDir::new(
        &redis,
        TestConfig::of(
            Sub::fixture("killed")
                .delayed("killed.delayed")
                .set("effects", "journal")
                .set("handler_timeout", "60s")
                .set("allowed_outbound_hosts", Raw(&gateway.grant())),
        )
        .set("shutdown_timeout", "1s"),
    );
    let urls = vec![gateway.url("charge"), gateway.url("receipt-hang")];
    let id = add(&mut conn, "killed", &calls(urls, Vec::new())).await;
    let mut host = run.spawn();
    wait_for(
        T,
        "the receipt call, after the charge's response",
        || async { (gateway.keys("receipt-hang").len() == 1).then_some(()) },
    )
    .await;
    host.kill();
    // The same consumer again: it reads its pending entry back and tries it again.
    let _again = run.spawn();
    wait_acked(&conn, "killed", "g", &id).await;
    let charges = gateway.keys("charge");
    assert_eq!(charges.len(), 1, "the charge replayed from the journal");
    assert_eq!(gateway.keys("receipt-hang").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_one_entry_runs_with_its_journal_and_no_network() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 0).await;
    let sub = journaled("rep", &gateway).set("max_retries", 0);
    let config = TestConfig::of(sub);
    let _host = start_fixture(&redis, config.clone()).await;
    let (_dir, path) = config_file(&config);

    // Charged, then the service is down: a dead letter whose journal holds the charge.
    let urls = vec![gateway.url("charge"), gateway.url("down")];
    let origin = add(&mut conn, "rep", &calls(urls, Vec::new())).await;
    wait_dead_letters(&conn, "rep", 1).await;
    let id = dead_lettered(&mut conn, "rep").await[0].0.clone();
    let seen = gateway.seen.lock().unwrap().len();

    let out = sluice(&["replay", "--entry", &id, "--json"], &path, &redis).await;
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(report["found_as"], "dead letter", "{out}");
    assert_eq!(report["origin_id"], origin.as_str(), "{out}");
    assert_eq!(
        report["replayed_calls"], 1,
        "the charge, from the journal: {out}"
    );
    assert_eq!(report["calls_not_in_journal"], 1, "the failed call: {out}");
    assert_eq!(report["would"], "retry", "{out}");
    assert_eq!(
        gateway.seen.lock().unwrap().len(),
        seen,
        "nothing went over the network"
    );
    // A dry run of the dead letters allowed to call out sends the keys the real attempt sent
    // (a gateway that honours them does not charge again).
    let fixture = guests().fixture.display().to_string();
    let allow = format!("http://{}", gateway.addr);
    sluice(
        &["replay", "--candidate", &fixture, "--allow-http", &allow],
        &path,
        &redis,
    )
    .await;
    let charges = gateway.keys("charge");
    assert_eq!(charges.len(), 2, "the dry run called out");
    assert_eq!(charges[0], charges[1], "with the real attempt's key");
    // Neither a dead letter nor a parked origin: a clear error.
    let (ok, _, err) = tokio::task::spawn_blocking({
        let args = [
            "replay".to_owned(),
            path.display().to_string(),
            "--entry".to_owned(),
            "1-1".to_owned(),
            "--redis".to_owned(),
            redis.url(),
        ];
        move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_sluice(&args, std::path::Path::new("."))
        }
    })
    .await
    .unwrap();
    assert!(!ok && err.contains("no dead letter with id 1-1"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_that_repeats_on_the_same_input_dead_letters_at_once_and_one_that_does_not_retries()
 {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 1).await;
    let sub = Sub::fixture("poison")
        .delayed("poison.delayed")
        .set("effects", "journal")
        .set("poison_check", true)
        .set("max_retries", 8)
        .set(
            "failure_backoff",
            Raw(r#"{ initial = "20ms", max = "40ms" }"#),
        )
        .set("allowed_outbound_hosts", Raw(&gateway.grant()));
    let mut host = start_fixture(&redis, sub).await;

    // A trap on the input itself: the second run traps the same way, dead-lettered at once
    // (not after eight retries).
    let poison = add(&mut conn, "poison", &Control::Trap).await;
    wait_dead_letters(&conn, "poison", 1).await;
    let letters = dead_lettered(&mut conn, "poison").await;
    let reason = field(&letters[0].1, "sluice-reason")
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.starts_with("fails the same way on the same input: "),
        "{reason}"
    );
    assert_eq!(
        field(&letters[0].1, "sluice-origin-id"),
        Some(poison.as_str())
    );
    assert_eq!(
        field(&letters[0].1, "sluice-retry-count"),
        Some("0"),
        "no retry spent"
    );

    // A trap after a failed call (the receipt fails once): offline, the call is not in the
    // journal and fails otherwise, so the failure is taken as transient and retried; the
    // retry succeeds.
    let control = Control::Calls {
        urls: vec![gateway.url("charge"), gateway.url("receipt")],
        body: String::new(),
        headers: Vec::new(),
        retry_ms: 20,
        trap: true,
        times: 0,
    };
    let transient = add(&mut conn, "poison", &control).await;
    acked(&mut host, &transient).await;
    assert_eq!(
        gateway.keys("receipt").len(),
        2,
        "failed once, then retried"
    );
    assert_eq!(
        gateway.keys("charge").len(),
        1,
        "the retry replayed the charge"
    );
    assert_eq!(dead_lettered(&mut conn, "poison").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_hot_swap_the_new_version_replays_only_the_calls_it_makes_again() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 0).await;
    let sub = journaled("swapped", &gateway);
    let mut host = start_fixture(&redis, sub).await;
    let admin = host.admin().await;

    // Attempt 1 (the running version) charges a and b, then the service is down; it parks for
    // ten minutes, and is made due by hand once the new version serves (the upload answers
    // once it does): the new version's attempt charges a, then c.
    let attempt = |second: &str, last: &str| Control::Calls {
        urls: vec![
            gateway.url("charge-a"),
            gateway.url(second),
            gateway.url(last),
        ],
        body: String::new(),
        headers: Vec::new(),
        retry_ms: 600_000,
        trap: false,
        times: 0,
    };
    let control = Control::Attempts {
        each: vec![attempt("charge-b", "down"), attempt("charge-c", "receipt")],
    };
    let id = add(&mut conn, "swapped", &control).await;
    host.event(T, "the first attempt parked", |e| {
        matches!(e.kind, EventKind::Parked { .. }) && e.origin_id == id
    })
    .await;
    // The same code under another digest: another version.
    let mut new = std::fs::read(&guests().fixture).unwrap();
    new.extend_from_slice(&[0, 4, 3, b'n', b'e', b'w']);
    let (status, body) = http_request(
        admin,
        "PUT",
        "/v1/subscriptions/swapped/g/handler",
        &[],
        &new,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let digest = serde_json::from_str::<serde_json::Value>(&body).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let due = format!(r#"{{"origin_ids": ["{id}"]}}"#);
    let (status, body) = http_request(
        admin,
        "POST",
        "/v1/subscriptions/swapped/g/parked/retry-now",
        &[("content-type", "application/json")],
        due.as_bytes(),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, r#"{"due_now":1}"#));
    let acked = host
        .event(T, "the new version's ack", |e| {
            e.kind == EventKind::Acked && e.origin_id == id
        })
        .await;
    assert_eq!(acked.digest.as_str(), digest, "the new version acked it");
    assert_eq!(
        gateway.keys("charge-a").len(),
        1,
        "replayed across the swap"
    );
    assert_eq!(gateway.keys("charge-b").len(), 1, "not called again");
    assert_eq!(gateway.keys("charge-c").len(), 1, "another call: live");
    assert_eq!(gateway.keys("receipt").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_canary_each_entrys_journal_stays_with_the_version_that_runs_it() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 0).await;
    let mut host = start_fixture(&redis, journaled("canaried", &gateway)).await;
    let admin = host.admin().await;
    let mut new = std::fs::read(&guests().fixture).unwrap();
    new.extend_from_slice(&[0, 4, 3, b'n', b'e', b'w']);
    let path = "/v1/subscriptions/canaried/g/canary?percent=50&for=5m";
    let (status, body) = http_request(admin, "PUT", path, &[], &new).await;
    assert!(status == 200 || status == 201, "{status}: {body}");
    let record: serde_json::Value = serde_json::from_str(&body).unwrap();
    let from = record["eligible_from_ms"].as_u64().unwrap();
    // Entries added from then on are split by their origin ids (the ones before run the
    // incumbent): wait for it by Redis's clock, which gives the ids.
    wait_for(T, "the canary's split to start", || {
        let mut conn = conn.clone();
        async move {
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query_async(&mut conn).await.unwrap();
            (secs * 1000 + micros / 1000 > from).then_some(())
        }
    })
    .await;

    // Each entry charges, then finds the receipt service down and retries: the retry replays
    // its charge, on the version that made it (the origin id picks one for every attempt).
    let mut ids = Vec::new();
    for i in 0..16 {
        let charge = gateway.url(&format!("charge-{i}"));
        let attempt = |last: &str| calls(vec![charge.clone(), gateway.url(last)], Vec::new());
        let control = Control::Attempts {
            each: vec![attempt("down"), attempt("receipt")],
        };
        ids.push(add(&mut conn, "canaried", &control).await);
    }
    let mut parked_on = std::collections::HashMap::new();
    let mut acked_on = std::collections::HashMap::new();
    while acked_on.len() < ids.len() {
        let e = host
            .event(T, "every entry parked, then acked", |e| {
                ids.contains(&e.origin_id)
                    && matches!(e.kind, EventKind::Parked { .. } | EventKind::Acked)
            })
            .await;
        let seen = match e.kind {
            EventKind::Acked => &mut acked_on,
            _ => &mut parked_on,
        };
        seen.insert(e.origin_id, e.digest);
    }
    assert_eq!(
        parked_on, acked_on,
        "every entry's two attempts ran one version"
    );
    let versions: std::collections::HashSet<_> = acked_on.values().collect();
    assert_eq!(
        versions.len(),
        2,
        "both versions took entries: {versions:?}"
    );
    for i in 0..16 {
        assert_eq!(gateway.keys(&format!("charge-{i}")).len(), 1, "entry {i}");
    }
    assert_eq!(gateway.keys("receipt").len(), 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_calls_replay_each_at_its_position_and_new_keys_start_a_new_journal() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 1).await;
    let sub = journaled("joined", &gateway).set("max_retries", 0);
    let config = TestConfig::of(sub);
    let _host = start_fixture(&redis, config.clone()).await;
    let (_dir, path) = config_file(&config);

    // Two calls joined: the receipt fails once (not recorded), the charge is recorded. The
    // fixture dead-letters with what it saw; each requeue runs it again.
    let control = Control::HttpMany {
        urls: vec![gateway.url("receipt"), gateway.url("charge")],
        sequential: false,
    };
    add(&mut conn, "joined", &control).await;
    // Requeue the dead letter and wait for the next one (each run ends in one).
    let requeue = |flags: &'static [&'static str]| {
        let (conn, path, redis) = (conn.clone(), path.clone(), &redis);
        async move {
            wait_dead_letters(&conn, "joined", 1).await;
            let mut c = conn.clone();
            let id = dead_lettered(&mut c, "joined").await[0].0.clone();
            let mut args = vec!["requeue", id.as_str()];
            args.extend_from_slice(flags);
            sluice(&args, &path, redis).await;
            wait_for(T, "the requeued entry's next dead letter", || {
                let (mut c, id) = (conn.clone(), id.clone());
                async move {
                    let letters = dead_lettered(&mut c, "joined").await;
                    letters.iter().any(|(other, _)| *other != id).then_some(())
                }
            })
            .await;
        }
    };
    // Requeued: the charge replays whichever call starts first; the receipt goes out (now 200).
    requeue(&[]).await;
    assert_eq!(gateway.keys("charge").len(), 1, "the charge replayed");
    // Requeued again: both replay.
    let receipts = gateway.keys("receipt").len();
    requeue(&[]).await;
    assert_eq!(gateway.keys("charge").len(), 1);
    assert_eq!(
        gateway.keys("receipt").len(),
        receipts,
        "the receipt replayed too"
    );
    // With new keys: a journal of its own, so the calls go out again, under new keys.
    requeue(&["--new-idempotency-keys"]).await;
    let charges = gateway.keys("charge");
    assert_eq!(charges.len(), 2, "the charge went out again");
    assert_ne!(charges[0], charges[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ack_deletes_the_journal_even_when_the_last_attempt_made_no_call() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let gateway = Gateway::start("idempotency-key", 0).await;
    let sub = journaled("quiet", &gateway);
    let mut host = start_fixture(&redis, sub).await;
    let control = Control::Attempts {
        each: vec![
            calls(vec![gateway.url("charge"), gateway.url("down")], Vec::new()),
            Control::Ack,
        ],
    };
    let id = add(&mut conn, "quiet", &control).await;
    acked(&mut host, &id).await;
    let left: u64 = redis::cmd("EXISTS")
        .arg(journal_key("quiet", &id))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_asks_for_the_journal_gets_it_unless_the_config_says_otherwise() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let asked = Gateway::start("idempotency-key", 2).await;
    let overruled = Gateway::start("idempotency-key", 2).await;
    // The same component (`.effects(Effects::Journal)`) twice: the config says nothing of
    // effects on one, "none" on the other.
    let sub = |stream: &str, gateway: &Gateway| {
        Sub::new("{fixture_journaled}", stream)
            .delayed(&format!("{stream}.delayed"))
            .set("allowed_outbound_hosts", Raw(&gateway.grant()))
    };
    let config = TestConfig::of(sub("asked", &asked))
        .and(sub("overruled", &overruled).set("effects", "none"));
    let mut host = start_fixture(&redis, config.clone()).await;
    let paid = |g: &Gateway| calls(vec![g.url("charge"), g.url("receipt")], Vec::new());
    let first = add(&mut conn, "asked", &paid(&asked)).await;
    let second = add(&mut conn, "overruled", &paid(&overruled)).await;
    let mut left = vec![first, second];
    while !left.is_empty() {
        let done = host
            .event(T, "both acked", |e| {
                e.kind == EventKind::Acked && left.contains(&e.origin_id)
            })
            .await;
        left.retain(|o| *o != done.origin_id);
    }
    assert_eq!(
        asked.keys("charge").len(),
        1,
        "the component's journal replays"
    );
    assert_eq!(overruled.keys("charge").len(), 3, "the config's none wins");

    // A swap may not change the mode under a running subscription the config leaves to the
    // component; where the config decides, the component's wish does not matter.
    let admin = host.admin().await;
    let live = std::fs::read(&guests().fixture).unwrap();
    let (status, body) = http_request(
        admin,
        "PUT",
        "/v1/subscriptions/asked/g/handler",
        &[],
        &live,
    )
    .await;
    assert_ne!(status, 200, "{body}");
    assert!(body.contains("asks for effects Live"), "{body}");
    let (status, body) = http_request(
        admin,
        "PUT",
        "/v1/subscriptions/overruled/g/handler",
        &[],
        &std::fs::read(&guests().fixture_journaled).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    drop(host);

    // `sluice check` says who asked for the journal, and where the config said none.
    let (_dir, path) = config_file(&config);
    let (ok, out, err) = run_sluice(
        &["check", path.to_str().unwrap()],
        std::path::Path::new("."),
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("journaled (asked by the component): up to 64 calls")
            && out.contains("`idempotency-key`; not journaled"),
        "{out}"
    );

    // Journal bounds with nobody journaling are refused, naming the keys; the poison check
    // of a live subscription that may call out too.
    for (extra, says) in [
        ("journal_max_calls", "journal_* keys are set, but neither"),
        ("poison_check", "poison_check needs effects"),
    ] {
        let sub = Sub::fixture("plain").set("allowed_outbound_hosts", Raw(&asked.grant()));
        let sub = match extra {
            "journal_max_calls" => sub.set(extra, 5u32),
            _ => sub.set(extra, true),
        };
        let (_dir, path) = config_file(&TestConfig::of(sub));
        let (ok, _, stderr) = run_sluice(
            &["check", path.to_str().unwrap()],
            std::path::Path::new("."),
        );
        assert!(!ok && stderr.contains(says), "{extra}: {stderr}");
    }
}
