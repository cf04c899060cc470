//! Acting on what waits, against a real Redis and a running host: dead letters listed,
//! requeued (one, by reason, all) and deleted; parked retries made due now, deleted and
//! dead-lettered; and the races and crashes an operator's command meets: two operators and two
//! sweeping hosts at once, a requeue racing a retry-now, the CLI killed mid "requeue all".

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_host::EventKind;
use sluice_host::control::operate::{dead_letters, parked};
use sluice_host::store::keys::SubscriptionKeys;

use crate::common::*;

const T: Duration = Duration::from_secs(60);

/// The test's subscription: the fixture on `stream`, retries parked in `<stream>.delayed`.
fn sub(stream: &str) -> Sub {
    Sub::fixture(stream).delayed(&format!("{stream}.delayed"))
}

fn keys(stream: &str) -> SubscriptionKeys {
    SubscriptionKeys::new(
        stream,
        "g",
        &dead_letter_key(stream),
        Some(&format!("{stream}.delayed")),
    )
}

/// Run `sluice <args>` with the config and `--redis` appended where they belong; returns
/// stdout, panicking with stderr when it fails.
pub(crate) async fn sluice(args: &[&str], config: &Path, redis: &Redis) -> String {
    let mut all: Vec<String> = vec![args[0].to_owned(), config.display().to_string()];
    all.extend(args[1..].iter().map(|a| (*a).to_owned()));
    all.extend(["--redis".to_owned(), redis.url()]);
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        run_sluice(&args, Path::new("."))
    })
    .await
    .unwrap();
    assert!(ok, "sluice {args:?} failed: {err}");
    out
}

fn config_file(dir: &Path, sub: Sub) -> PathBuf {
    write_config(dir, "sluice.toml", &TestConfig::of(sub).to_string())
}

/// Wait until every one of `origins` was acked, in any order (events of other entries are
/// skipped).
pub(crate) async fn wait_acked_origins(host: &mut TestHost, origins: &[String]) {
    let mut left: HashSet<&str> = origins.iter().map(String::as_str).collect();
    while !left.is_empty() {
        let event = host
            .event(T, &format!("{left:?} acked"), |e| {
                e.kind == EventKind::Acked && left.contains(e.origin_id.as_str())
            })
            .await;
        left.remove(event.origin_id.as_str());
    }
}

async fn wait_acked_origin(host: &mut TestHost, origin: &str) {
    wait_acked_origins(host, &[origin.to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_requeued_and_deleted_from_the_cli() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sub("ops")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), sub("ops"));
    let fixed = |n: u32| Control::DeadUntilRequeued {
        reason: format!("gateway down ({n})"),
    };
    let mut origins = Vec::new();
    for n in 0..3 {
        origins.push(add(&mut conn, "ops", &fixed(n)).await);
    }
    let poison = add(
        &mut conn,
        "ops",
        &Control::Dead {
            reason: "poison <script>".into(),
        },
    )
    .await;
    wait_dead_letters(&conn, "ops", 4).await;

    let listing = sluice(&["dead-letters", "--json"], &config, &redis).await;
    let rows: Vec<serde_json::Value> = listing
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "{listing}");
    // Newest first (by dead-letter id; deliveries run concurrently, so not by origin).
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort_by(|a, b| sluice_host::entry::delivery::cmp_ids(b, a));
    assert_eq!(ids, sorted);
    let row_of = |origin: &str| {
        rows.iter()
            .find(|r| r["origin_id"] == origin)
            .unwrap_or_else(|| panic!("{origin} listed: {listing}"))
    };
    assert_eq!(row_of(&poison)["reason"], "poison <script>");
    // The payload as Redis holds it, byte for byte (its quotes were escaped twice: issue 53).
    let payload = row_of(&poison)["fields"]
        .as_array()
        .and_then(|f| f.iter().find(|pair| pair[0] == "payload"))
        .and_then(|pair| pair[1].as_str())
        .map(str::to_owned);
    let sent = serde_json::to_string(&Control::Dead {
        reason: "poison <script>".into(),
    })
    .unwrap();
    assert_eq!(payload.as_deref(), Some(sent.as_str()), "{listing}");
    assert_eq!(row_of(&origins[0])["retry_count"], 0);
    assert!(rows.iter().all(|r| r["requeueable"] == true));
    let one = sluice(
        &[
            "dead-letters",
            "--id",
            row_of(&poison)["id"].as_str().unwrap(),
        ],
        &config,
        &redis,
    )
    .await;
    assert!(
        one.contains("poison <script>") && one.contains("shown: 1"),
        "{one}"
    );
    let filtered = sluice(&["dead-letters", "--reason", "GATEWAY"], &config, &redis).await;
    assert!(filtered.contains("shown: 3"), "{filtered}");
    assert!(!filtered.contains("poison"), "{filtered}");

    // One, by id: back on the stream, handled (acked: the "fix" is the requeue), gone from
    // the dead letters, its origin id kept.
    let first = row_of(&origins[0])["id"].as_str().unwrap().to_owned();
    let out = sluice(&["requeue", &first], &config, &redis).await;
    assert!(out.contains("requeued 1"), "{out}");
    wait_acked_origin(&mut host, &origins[0]).await;
    let left = dead_lettered(&mut conn, "ops").await;
    assert_eq!(left.len(), 3);
    assert!(left.iter().all(|(id, _)| *id != first));
    // Back with its group: in the retry lane, not on the stream other groups read.
    let copies = lane_copies(&mut conn, "ops.delayed").await;
    let copy = copies
        .iter()
        .find(|c| field(&c.fields, "sluice-requeued-from") == Some(first.as_str()))
        .expect("the requeued copy is in the lane");
    assert_eq!(copy.origin_id, origins[0]);
    assert_eq!(copy.retry_count, 0);
    assert!(
        entries(&mut conn, "ops")
            .await
            .iter()
            .all(|(_, f)| field(f, "sluice-requeued-from").is_none()),
        "nothing requeued onto the stream"
    );

    // A dry run changes nothing; then all matching a reason.
    let dry = sluice(
        &["requeue", "--all", "--reason", "gateway", "--dry-run"],
        &config,
        &redis,
    )
    .await;
    assert!(dry.contains("would requeue 2"), "{dry}");
    assert_eq!(dead_lettered(&mut conn, "ops").await.len(), 3);
    let out = sluice(
        &["requeue", "--all", "--reason", "gateway"],
        &config,
        &redis,
    )
    .await;
    assert!(out.contains("requeued 2"), "{out}");
    wait_acked_origins(&mut host, &origins[1..]).await;
    let left = dead_lettered(&mut conn, "ops").await;
    assert_eq!(left.len(), 1);
    assert_eq!(field(&left[0].1, "sluice-origin-id"), Some(poison.as_str()));

    // Requeueing the same id again finds nothing; the poison is deleted.
    let again = sluice(&["requeue", &first], &config, &redis).await;
    assert!(again.contains("no such dead letter"), "{again}");
    let out = sluice(&["delete", "--dead-letter", &left[0].0], &config, &redis).await;
    assert!(out.contains("1 deleted"), "{out}");
    assert!(dead_lettered(&mut conn, "ops").await.is_empty());
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_retries_are_made_due_deleted_and_dead_lettered() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sub("wait")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), sub("wait"));
    // Parked for ten minutes unless an operator acts.
    let later = Control::Retry {
        ms: 600_000,
        times: 1,
    };
    let mut origins = Vec::new();
    for _ in 0..5 {
        origins.push(add(&mut conn, "wait", &later).await);
    }
    wait_for(T, "5 parked", || {
        let mut conn = conn.clone();
        async move { (parked(&mut conn, "wait.delayed").await == 5).then_some(()) }
    })
    .await;

    let out = sluice(&["retry-now", &origins[0]], &config, &redis).await;
    assert!(
        out.contains(&format!("{} in `wait.delayed` is due now", origins[0])),
        "{out}"
    );
    wait_acked_origin(&mut host, &origins[0]).await;

    let out = sluice(&["delete", "--parked", &origins[1]], &config, &redis).await;
    assert!(out.contains("1 deleted"), "{out}");

    // Dead-letter now, through the library the API and the page use.
    let k = keys("wait");
    let found = parked::find(&mut conn, "wait.delayed", &[origins[2].clone()], None)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    let members: Vec<Vec<u8>> = found.iter().map(|p| p.member.clone()).collect();
    let moved = parked::dead_letter_now(&mut conn, &k, &members, "operator: bad data")
        .await
        .unwrap();
    assert_eq!(moved, 1);
    let letters = dead_lettered(&mut conn, "wait").await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        field(&letters[0].1, "sluice-reason"),
        Some("operator: bad data")
    );
    assert_eq!(
        field(&letters[0].1, "sluice-origin-id"),
        Some(origins[2].as_str())
    );
    // ... and such a dead letter can be requeued like any other.
    let letter = dead_letters::get(&mut conn, &k, &letters[0].0)
        .await
        .unwrap()
        .unwrap();
    assert!(letter.not_requeueable.is_none(), "{letter:?}");

    let out = sluice(&["retry-now", "--all"], &config, &redis).await;
    assert!(out.contains("2 retries due now"), "{out}");
    wait_acked_origins(&mut host, &origins[3..]).await;
    assert_eq!(parked(&mut conn, "wait.delayed").await, 0);
    let out = sluice(&["retry-now", "no-such-id"], &config, &redis).await;
    assert!(out.contains("no-such-id: not parked"), "{out}");
    host.stop().await.unwrap();
}

/// Two operators requeue every dead letter at once while two hosts read and sweep: each entry
/// comes back exactly once and is acked exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_requeueing_all_at_once_move_each_entry_once() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "race";
    let mut a = start_fixture(&redis, sub(stream).set("consumer", "host-a")).await;
    let mut b = start_fixture(&redis, sub(stream).set("consumer", "host-b")).await;
    let total = 300;
    let mut origins = HashSet::new();
    for n in 0..total {
        let control = Control::DeadUntilRequeued {
            reason: format!("down {n}"),
        };
        origins.insert(add(&mut conn, stream, &control).await);
    }
    wait_dead_letters(&conn, stream, total).await;
    let k = keys(stream);
    let operator = |mut conn: redis::aio::MultiplexedConnection, k: SubscriptionKeys| async move {
        let mut moved = 0;
        let mut cursor: Option<String> = None;
        loop {
            let page = dead_letters::list(&mut conn, &k, cursor.as_deref(), 64, None, 1)
                .await
                .unwrap();
            for letter in &page.items {
                if let dead_letters::Requeued::To(_) =
                    dead_letters::requeue(&mut conn, &k, letter, false)
                        .await
                        .unwrap()
                {
                    moved += 1;
                }
            }
            cursor = page.next;
            if cursor.is_none() {
                return moved;
            }
        }
    };
    let (one, two) = tokio::join!(
        operator(redis.conn().await, k.clone()),
        operator(redis.conn().await, k.clone())
    );
    assert_eq!(
        one + two,
        total,
        "each dead letter requeued by exactly one operator"
    );
    let mut acked = std::collections::HashMap::<String, usize>::new();
    wait_for(T, "every requeued entry acked", || {
        for host in [&mut a, &mut b] {
            while let Ok(e) = host.events.try_recv() {
                if e.kind == EventKind::Acked {
                    *acked.entry(e.origin_id.clone()).or_default() += 1;
                }
            }
        }
        let done = acked.len() == total;
        async move { done.then_some(()) }
    })
    .await;
    assert!(acked.values().all(|n| *n == 1), "acked once each");
    assert!(acked.keys().all(|o| origins.contains(o)));
    assert!(dead_lettered(&mut conn, stream).await.is_empty());
    eprintln!("two operators: {one} + {two} requeued of {total}, each acked once");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// One operator makes parked retries due while another dead-letters them: each ends in exactly
/// one place (acked after its retry, or dead-lettered), none in both, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_now_racing_dead_letter_now_leaves_each_entry_in_one_place() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "fork";
    let mut host = start_fixture(&redis, sub(stream)).await;
    let total = 200;
    let later = Control::Retry {
        ms: 600_000,
        times: 1,
    };
    for _ in 0..total {
        add(&mut conn, stream, &later).await;
    }
    let set = format!("{stream}.delayed");
    wait_for(T, "all parked", || {
        let mut conn = conn.clone();
        let set = set.clone();
        async move { (parked(&mut conn, &set).await == total as u64).then_some(()) }
    })
    .await;
    let page = parked::list(&mut conn, &set, None, 128).await.unwrap();
    let mut members: Vec<Vec<u8>> = page.items.iter().map(|p| p.member.clone()).collect();
    let rest = parked::list(&mut conn, &set, page.next.as_deref(), 128)
        .await
        .unwrap();
    members.extend(rest.items.iter().map(|p| p.member.clone()));
    assert_eq!(
        members.len(),
        total,
        "paging by score cursor sees every member once"
    );
    let k = keys(stream);
    let (mut c1, mut c2) = (redis.conn().await, redis.conn().await);
    let (retried, dead) = tokio::join!(
        parked::retry_now(&mut c1, &set, &members),
        parked::dead_letter_now(&mut c2, &k, &members, "operator")
    );
    let (retried, dead) = (retried.unwrap(), dead.unwrap());
    // A member made due first can still be dead-lettered before a sweep takes it: count where
    // each entry ended, not what each call touched.
    let letters = wait_dead_letters(&conn, stream, 0).await;
    let dead_origins: HashSet<String> = letters
        .iter()
        .filter_map(|(_, f)| field(f, "sluice-origin-id").map(str::to_owned))
        .collect();
    assert_eq!(
        dead_origins.len(),
        letters.len(),
        "no entry dead-lettered twice"
    );
    let expected_acks = total - letters.len();
    let mut acked = HashSet::new();
    while acked.len() < expected_acks {
        let e = host
            .event(T, "the retried entries acked", |e| {
                e.kind == EventKind::Acked
            })
            .await;
        assert!(acked.insert(e.origin_id.clone()), "acked twice");
        assert!(
            !dead_origins.contains(&e.origin_id),
            "acked and dead-lettered"
        );
    }
    assert_eq!(parked(&mut conn, &set).await, 0);
    eprintln!(
        "race: retry-now touched {retried}, dead-letter-now {dead}; {} acked, {} dead-lettered",
        acked.len(),
        letters.len()
    );
    host.stop().await.unwrap();
}

/// SIGKILL of `sluice requeue --all` in the middle: every dead letter is either still there or
/// back with its group (in the retry lane), once; a second run finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_requeue_all_loses_and_doubles_nothing() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "killed";
    // Dead letters made directly, as the dispatcher writes them (no host reads the stream).
    let total = 20_000usize;
    for chunk in (0..total).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for n in chunk {
            let id = format!("{}-0", n + 1);
            pipe.cmd("XADD")
                .arg(dead_letter_key(stream))
                .arg("*")
                .arg("payload")
                .arg(format!("{{\"n\":{n}}}"))
                .arg("sluice-reason")
                .arg("down")
                .arg("sluice-origin-stream")
                .arg(stream)
                .arg("sluice-origin-group")
                .arg("g")
                .arg("sluice-origin-id")
                .arg(&id)
                .arg("sluice-entry-id")
                .arg(&id)
                .arg("sluice-retry-count")
                .arg("0")
                .arg("sluice-delivery-count")
                .arg("1")
                .ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), sub(stream));
    let url = redis.url();
    let args = [
        "requeue",
        config.to_str().unwrap(),
        "--all",
        "--redis",
        url.as_str(),
    ];
    let mut cli = HostProcess::spawn(&args, dir.path());
    let lane = sluice_host::store::keys::lane_key("killed.delayed");
    wait_for(T, "the requeue to be under way", || {
        let mut conn = conn.clone();
        let lane = lane.clone();
        async move {
            let n: usize = cmd(&mut conn, &["XLEN", &lane]).await;
            (n >= 200).then_some(())
        }
    })
    .await;
    cli.kill();
    let count = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let requeued = lane_copies(&mut conn, "killed.delayed").await;
            let left: usize = cmd(&mut conn, &["XLEN", &dead_letter_key("killed")]).await;
            let from: HashSet<String> = requeued
                .iter()
                .filter_map(|c| field(&c.fields, "sluice-requeued-from").map(str::to_owned))
                .collect();
            assert_eq!(from.len(), requeued.len(), "no dead letter requeued twice");
            (requeued.len(), left)
        }
    };
    let (requeued, left) = count(&mut conn).await;
    assert!(requeued < total, "killed before the end ({requeued})");
    assert_eq!(
        requeued + left,
        total,
        "nothing lost or doubled at the kill"
    );
    let out = sluice(&["requeue", "--all"], &config, &redis).await;
    assert!(out.contains(&format!("requeued {left}")), "{out}");
    let (requeued, left) = count(&mut conn).await;
    assert_eq!((requeued, left), (total, 0));
    eprintln!("killed requeue --all: the second run requeued the rest");
}

/// The same operations through the admin API: token required, JSON in and out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_lists_and_acts_on_what_waits() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sub("api")).await;
    let admin = host.admin().await;
    let json = |body: &str| -> serde_json::Value { serde_json::from_str(body).unwrap() };
    let base = "/v1/subscriptions/api/g";
    let fixed = add(
        &mut conn,
        "api",
        &Control::DeadUntilRequeued {
            reason: "down".into(),
        },
    )
    .await;
    let poison = add(
        &mut conn,
        "api",
        &Control::Dead {
            reason: "poison".into(),
        },
    )
    .await;
    let later = add(
        &mut conn,
        "api",
        &Control::Retry {
            ms: 600_000,
            times: 1,
        },
    )
    .await;
    let doomed = add(
        &mut conn,
        "api",
        &Control::Retry {
            ms: 600_000,
            times: 1,
        },
    )
    .await;
    wait_dead_letters(&conn, "api", 2).await;
    wait_for(T, "2 parked", || {
        let mut conn = conn.clone();
        async move { (parked(&mut conn, "api.delayed").await == 2).then_some(()) }
    })
    .await;

    // Without the token: refused, for reads too when a token is configured.
    let (code, _) = http_request(
        admin,
        "GET",
        &format!("{base}/dead-letters"),
        &[("Authorization", "Bearer wrong")],
        b"",
    )
    .await;
    assert_eq!(code, 401);

    let (code, body) = http_get_token(admin, &format!("{base}/dead-letters?limit=1")).await;
    assert_eq!(code, 200, "{body}");
    let page = json(&body);
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let next = page["next"].as_str().unwrap().to_owned();
    let (_, body) = http_get_token(
        admin,
        &format!("{base}/dead-letters?limit=10&cursor={next}"),
    )
    .await;
    assert_eq!(json(&body)["items"].as_array().unwrap().len(), 1);
    let (_, body) = http_get_token(admin, &format!("{base}/dead-letters?reason=down")).await;
    let items = json(&body)["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["origin_id"], fixed.as_str());
    let fixed_dl = items[0]["id"].as_str().unwrap().to_owned();

    let (code, body) = http_request(
        admin,
        "POST",
        &format!("{base}/dead-letters/requeue"),
        &[("Content-Type", "application/json")],
        format!("{{\"ids\":[\"{fixed_dl}\",\"1-1\"]}}").as_bytes(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let answer = json(&body);
    assert_eq!(answer["requeued"].as_array().unwrap().len(), 1);
    assert_eq!(answer["missing"][0], "1-1");
    wait_acked_origin(&mut host, &fixed).await;

    let (_, body) = http_get_token(admin, &format!("{base}/dead-letters")).await;
    let poison_dl = json(&body)["items"][0]["id"].as_str().unwrap().to_owned();
    let (code, _) = http_request(
        admin,
        "DELETE",
        &format!("{base}/dead-letters/{poison_dl}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 200);
    assert!(dead_lettered(&mut conn, "api").await.is_empty());
    let _ = poison;

    // Parked: listed with due times; retry one now by origin id and due time; dead-letter the
    // other with a reason.
    let (code, body) = http_get_token(admin, &format!("{base}/parked")).await;
    assert_eq!(code, 200, "{body}");
    let listing = json(&body);
    let items = listing["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert!(items[0]["due_in_ms"].as_i64().unwrap() > 500_000);
    let row = items
        .iter()
        .find(|i| i["origin_id"] == later.as_str())
        .unwrap();
    let due = row["due_ms"].as_i64().unwrap();
    let (code, body) = http_request(
        admin,
        "POST",
        &format!("{base}/parked/retry-now"),
        &[("Content-Type", "application/json")],
        format!("{{\"origin_ids\":[\"{later}\"],\"due_ms\":{due}}}").as_bytes(),
    )
    .await;
    assert_eq!(
        (code, json(&body)["due_now"].as_i64()),
        (200, Some(1)),
        "{body}"
    );
    wait_acked_origin(&mut host, &later).await;
    let (code, body) = http_request(
        admin,
        "POST",
        &format!("{base}/parked/dead-letter"),
        &[("Content-Type", "application/json")],
        format!("{{\"origin_ids\":[\"{doomed}\"]}}").as_bytes(),
    )
    .await;
    assert_eq!(code, 400, "a reason is required: {body}");
    let (code, body) = http_request(
        admin,
        "POST",
        &format!("{base}/parked/dead-letter"),
        &[("Content-Type", "application/json")],
        format!("{{\"origin_ids\":[\"{doomed}\"],\"reason\":\"operator: bad card\"}}").as_bytes(),
    )
    .await;
    assert_eq!(
        (code, json(&body)["dead_lettered"].as_i64()),
        (200, Some(1)),
        "{body}"
    );
    let letters = dead_lettered(&mut conn, "api").await;
    assert_eq!(
        field(&letters[0].1, "sluice-reason"),
        Some("operator: bad card")
    );
    assert_eq!(parked(&mut conn, "api.delayed").await, 0);
    let (code, _) = http_request(
        admin,
        "DELETE",
        &format!("{base}/parked/{doomed}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 404, "nothing parked any more");
    host.stop().await.unwrap();
}

async fn http_get_token(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, &[], b"").await
}

/// `dead_letter_maxlen` trims the dead-letter stream (approximately, as Redis's MAXLEN ~ does:
/// whole nodes of 100 entries), and `sluice check` warns that trimming drops data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_maxlen_trims_and_check_warns() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = sub("trim").set("dead_letter_maxlen", 10);
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(dir.path(), config.clone());
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        run_sluice(&["check", path.to_str().unwrap()], Path::new("."))
    })
    .await
    .unwrap();
    assert!(ok, "{err}");
    assert!(
        out.contains("dead_letter_maxlen = 10 trims `trim.g.dead-letter`"),
        "{out}"
    );
    let host = start_fixture(&redis, config).await;
    let dead = Control::Dead { reason: "x".into() };
    let mut last = String::new();
    for _ in 0..500 {
        last = add(&mut conn, "trim", &dead).await;
    }
    wait_for(T, "the last entry dead-lettered", || {
        let mut conn = conn.clone();
        let last = last.clone();
        async move {
            let letters = entries(&mut conn, &dead_letter_key("trim")).await;
            letters
                .iter()
                .any(|(_, f)| field(f, "sluice-origin-id") == Some(last.as_str()))
                .then_some(())
        }
    })
    .await;
    let len: usize = cmd(&mut conn, &["XLEN", &dead_letter_key("trim")]).await;
    assert!(len < 250, "trimmed to about 10 (+ one node of 100): {len}");
    host.stop().await.unwrap();
}

/// A requeued entry comes back under a new id and keeps its origin id, which the handler sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_entry_keeps_its_origin_id_for_the_handler() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sub("origin")).await;
    let report = Control::Report { key: "none".into() };
    let origin = add(&mut conn, "origin", &report).await;
    wait_dead_letters(&conn, "origin", 1).await;
    let k = keys("origin");
    let page = dead_letters::list(&mut conn, &k, None, 10, None, 1)
        .await
        .unwrap();
    let requeued = dead_letters::requeue(&mut conn, &k, &page.items[0], false)
        .await
        .unwrap();
    let dead_letters::Requeued::To(new_id) = requeued else {
        panic!("{requeued:?}");
    };
    assert_ne!(new_id, origin);
    let event = host
        .event(T, "the requeued copy reported", |e| e.id == new_id)
        .await;
    let EventKind::DeadLettered { reason } = event.kind else {
        panic!("{event:?}");
    };
    assert!(reason.contains(&format!("origin={origin}")), "{reason}");
    assert!(reason.contains("sluice-requeued-from"), "{reason}");
    host.stop().await.unwrap();
}

/// Dead letters an operator makes of parked retries are sealed by the script (plain and, for an
/// entry of thousands of fields, packed), so a requeue keeps their origin id and every field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_parked_retries_are_sealed_and_requeued_whole_with_their_origin() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, sub("sealnow")).await;
    let first = add(&mut conn, "sealnow", &Control::Ack).await;
    host.event(T, "the host reading", |e| e.id == first).await;
    let k = keys("sealnow").with_retry_lane(true);
    let small = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    let mut wide = small.clone();
    wide.extend((0..4000).map(|i| (format!("f{i}").into_bytes(), b"v".to_vec())));
    let mut members = Vec::new();
    for (origin, fields) in [("7-1", &small), ("8-1", &wide)] {
        let member = sluice_host::entry::member::NewMember {
            entry_id: origin,
            retry_count: 2,
            fields,
            origin_id: origin,
            stream: "sealnow",
            group: "g",
        }
        .encode();
        // Due in an hour: only the operator moves them.
        let due = sluice_host::store::inspect::server_now_ms(&mut conn)
            .await
            .unwrap()
            + 3_600_000;
        let _: i64 = redis::cmd("ZADD")
            .arg("sealnow.delayed")
            .arg(due)
            .arg(&member)
            .query_async(&mut conn)
            .await
            .unwrap();
        members.push(member);
    }
    let moved = parked::dead_letter_now(&mut conn, &k, &members, "operator")
        .await
        .unwrap();
    assert_eq!(moved, 2);
    let page = dead_letters::list(&mut conn, &k, None, 10, None, 1)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    for letter in &page.items {
        assert!(
            letter.trusted && letter.not_requeueable.is_none(),
            "{letter:?}"
        );
        let origin = letter.origin_id.clone().unwrap();
        let expected = if origin == "8-1" { 4001 } else { 1 };
        assert_eq!(letter.fields.len(), expected, "{origin}: every field");
        let dead_letters::Requeued::To(new) = dead_letters::requeue(&mut conn, &k, letter, false)
            .await
            .unwrap()
        else {
            panic!("gone")
        };
        let event = host.event(T, "the requeued retry", |e| e.id == new).await;
        assert_eq!(event.kind, EventKind::Acked);
        assert_eq!(event.origin_id, origin, "the origin id kept");
    }
    host.stop().await.unwrap();
}
