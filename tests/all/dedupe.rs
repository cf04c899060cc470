//! Deduplication (`dedupe`): an entry whose key's first entry was read within the window is
//! acknowledged without a call, counted, and its history names the first entry; the first
//! entry's own retries and its requeue are never its duplicates; each group keeps its own
//! record; across hosts killed at random, every key is handled by one entry only.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// XADD the fixture's `control` to `stream` with the dedupe key `key` in field `dedupe-id`.
async fn add_keyed(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    control: &Control,
    key: &str,
) -> String {
    let payload = serde_json::to_string(control).unwrap();
    cmd(
        conn,
        &["XADD", stream, "*", "dedupe-id", key, "payload", &payload],
    )
    .await
}

/// A fixture subscription to `stream` deduplicating on the field `dedupe-id`.
fn deduped(stream: &str) -> Sub {
    Sub::fixture(stream)
        .delayed(&format!("{stream}.delayed"))
        .set("dedupe", Raw(r#"{ field = "dedupe-id", window = "1h" }"#))
}

/// The group-wide count of duplicates of `stream`'s `group`.
async fn duplicates(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    group: &str,
) -> u64 {
    let counts = format!(
        "{}:counts",
        sluice_host::store::keys::dedupe_prefix(stream, group)
    );
    let n: Option<u64> = cmd(conn, &["HGET", &counts, "duplicates"]).await;
    n.unwrap_or(0)
}

#[tokio::test]
async fn a_duplicate_of_a_parked_or_dead_lettered_first_entry_is_skipped_and_a_requeue_runs_again()
{
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "dd";
    let sub = deduped(stream);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "sluice.toml",
        &TestConfig::of(sub.clone()).to_string(),
    );
    // The first entry of `p` parks a retry; its duplicate comes meanwhile.
    let retry = Control::Retry { ms: 1500, times: 1 };
    let p1 = add_keyed(&mut conn, stream, &retry, "p").await;
    let p2 = add_keyed(&mut conn, stream, &Control::Ack, "p").await;
    // The first entry of `d` is dead-lettered until requeued; its duplicate comes meanwhile.
    let until = Control::DeadUntilRequeued {
        reason: "fix me".into(),
    };
    let d1 = add_keyed(&mut conn, stream, &until, "d").await;
    let d2 = add_keyed(&mut conn, stream, &Control::Ack, "d").await;
    // Another program's hash where the record of key `w` goes: its entries run, undeduplicated.
    let record = format!(
        "{}:key:{}",
        sluice_host::store::keys::dedupe_prefix(stream, "g"),
        sluice_host::pipeline::dedupe::digest(b"w")
    );
    let _: () = cmd(&mut conn, &["HSET", &record, "not", "a record"]).await;
    let w1 = add_keyed(&mut conn, stream, &Control::Ack, "w").await;
    let w2 = add_keyed(&mut conn, stream, &Control::Ack, "w").await;
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    let mut seen: HashMap<String, Vec<EventKind>> = HashMap::new();
    let mut record = |e: &sluice_host::Event| {
        seen.entry(e.origin_id.clone())
            .or_default()
            .push(e.kind.clone());
    };
    for (id, of) in [(&p2, &p1), (&d2, &d1)] {
        let e = host
            .event(T, "a duplicate skipped", |e| {
                &e.id == id && matches!(e.kind, EventKind::Duplicate { .. })
            })
            .await;
        assert_eq!(e.kind, EventKind::Duplicate { of: of.clone() });
    }
    for w in [&w1, &w2] {
        host.event(T, "an entry whose record's name is taken runs", |e| {
            &e.id == w && e.kind == EventKind::Acked
        })
        .await;
    }
    // The parked first entry comes back: its retry is no duplicate of itself.
    let e = host
        .event(T, "p's first entry retried and acked", |e| {
            e.origin_id == p1 && e.kind == EventKind::Acked
        })
        .await;
    record(&e);
    assert_eq!(e.retry_count, 1, "the retry ran");
    // The dead letter requeued runs again (it names its origin); a later duplicate does not.
    let letters = dead_lettered(&mut conn, stream).await;
    let letter = letters
        .iter()
        .find(|(_, f)| field(f, "sluice-origin-id") == Some(d1.as_str()))
        .map(|(id, _)| id.clone())
        .expect("d's first entry dead-lettered");
    crate::operate::sluice(&["requeue", &letter], &config, &redis).await;
    host.event(T, "d's first entry requeued and acked", |e| {
        e.origin_id == d1 && e.kind == EventKind::Acked
    })
    .await;
    let d3 = add_keyed(&mut conn, stream, &Control::Ack, "d").await;
    let e = host
        .event(T, "a duplicate after the requeue", |e| e.id == d3)
        .await;
    assert_eq!(e.kind, EventKind::Duplicate { of: d1.clone() });
    assert_eq!(duplicates(&mut conn, stream, "g").await, 3);
    // Each duplicate's history names the key's first entry.
    let history = sluice_host::store::keys::history_key(stream, "g");
    let text: String = cmd(&mut conn, &["HGET", &history, &p2]).await;
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (json["do"].as_str(), json["of"].as_str()),
        (Some("duplicate"), Some(p1.as_str()))
    );
    let admin = host.admin().await;
    let (status, body) =
        http_get(admin, &format!("/v1/subscriptions/{stream}/g/entries/{p2}")).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["history"][0]["action"], "duplicate", "{v}");
    assert_eq!(v["history"][0]["duplicate_of"], p1.as_str(), "{v}");
    // The page counts the group's duplicates.
    let session = log_in(admin).await;
    let (_, _, page) = http_exchange(admin, "GET", "/ui/", &session.headers(), b"").await;
    assert!(
        page.contains("<b>3</b> duplicates skipped by the group"),
        "{page}"
    );
    assert!(
        !seen.contains_key(&p2) && !seen.contains_key(&d2),
        "{seen:?}"
    );
    host.stop().await.unwrap();
}

#[tokio::test]
async fn each_group_has_its_own_record_and_the_components_dedupe_yields_to_the_config() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Two groups of one stream: each handles the key's first entry once.
    let stream = "dd-groups";
    let one = deduped(stream);
    let two = deduped(stream)
        .set("group", "g2")
        .delayed(&format!("{stream}.g2.delayed"));
    // The component's own `.dedupe(..)` (field `dedupe-id`), and the same with "none".
    let asked = Sub::new("{fixture_journaled}", "dd-asked").delayed("dd-asked.delayed");
    let overruled = Sub::new("{fixture_journaled}", "dd-none")
        .delayed("dd-none.delayed")
        .set("dedupe", "none");
    let config = TestConfig::of(one).and(two).and(asked).and(overruled);
    let mut ids = HashMap::new();
    for s in [stream, "dd-asked", "dd-none"] {
        let first = add_keyed(&mut conn, s, &Control::Ack, "k").await;
        let second = add_keyed(&mut conn, s, &Control::Ack, "k").await;
        ids.insert(s, (first, second));
    }
    let mut host = start_fixture(&redis, config).await;
    let mut want: HashSet<(String, String, &str)> = HashSet::new();
    for group in ["g", "g2"] {
        want.insert((group.into(), ids[stream].0.clone(), "acked"));
        want.insert((group.into(), ids[stream].1.clone(), "duplicate"));
    }
    want.insert(("g".into(), ids["dd-asked"].0.clone(), "acked"));
    want.insert(("g".into(), ids["dd-asked"].1.clone(), "duplicate"));
    want.insert(("g".into(), ids["dd-none"].0.clone(), "acked"));
    want.insert(("g".into(), ids["dd-none"].1.clone(), "acked"));
    let mut got = HashSet::new();
    while got.len() < want.len() {
        let e = host.event(T, "every entry settled", |_| true).await;
        let kind = match e.kind {
            EventKind::Acked => "acked",
            EventKind::Duplicate { .. } => "duplicate",
            _ => "other",
        };
        got.insert((e.group.to_string(), e.origin_id.clone(), kind));
    }
    assert_eq!(got, want);
    host.stop().await.unwrap();
    // `sluice check` says what each deduplicates on, the component's or the config's.
    let dir = tempfile::tempdir().unwrap();
    let check = |sub: Sub| {
        let config = write_config(dir.path(), "sluice.toml", &TestConfig::of(sub).to_string());
        let (ok, out, err) = run_sluice(&["check", &config.display().to_string()], dir.path());
        assert!(ok, "{err}");
        out
    };
    let own = check(Sub::new("{fixture_journaled}", "dd-asked").delayed("dd-asked.delayed"));
    assert!(
        own.contains("field `dedupe-id`, window 3600s, keys up to 256 bytes, at most 1000000 keys"),
        "{own}"
    );
    let none = check(
        Sub::new("{fixture_journaled}", "dd-none")
            .delayed("dd-none.delayed")
            .set("dedupe", "none"),
    );
    assert!(none.contains("none: every entry is handled"), "{none}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_entries_with_duplicates_on_three_hosts_with_sigkills_are_handled_once_per_key()
 {
    const ENTRIES: usize = 10_000;
    const KILLS: usize = 4;
    let seed = crate::crash::seed("SLUICE_DEDUPE_SEED");
    let mut rng = crate::crash::Lcg(seed);
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "dd-hosts";
    let (server, record) = crate::ordered::recorder().await;
    let url = format!("http://{server}/");
    // 30 % of the entries repeat an earlier entry's key.
    let mut keys: Vec<u64> = Vec::with_capacity(ENTRIES);
    let mut distinct = 0u64;
    let mut pipe = redis::pipe();
    for n in 0..ENTRIES {
        let key = if n > 0 && rng.next(100) < 30 {
            keys[rng.next(n as u64) as usize]
        } else {
            distinct += 1;
            distinct
        };
        keys.push(key);
        let control = Control::Record {
            url: url.clone(),
            tag: format!("{key}:{n}"),
            then: Box::new(Control::Ack),
        };
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("dedupe-id")
            .arg(key.to_string())
            .arg("payload")
            .arg(serde_json::to_string(&control).unwrap());
    }
    let ids: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
    let dups = (ENTRIES as u64) - distinct;
    let grant = format!(r#"["http://{server}"]"#);
    let runs: Vec<RunDir> = (0..3)
        .map(|n| {
            let sub = deduped(stream)
                .set("consumer", format!("host-{n}"))
                .set("claim_min_idle", "2s")
                .set("allowed_outbound_hosts", Raw(&grant));
            RunDir::new(&redis, TestConfig::of(sub).set("shutdown_timeout", "1s"))
        })
        .collect();
    let mut hosts: Vec<HostProcess> = runs.iter().map(RunDir::spawn).collect();
    for kill in 0..KILLS {
        let after = Duration::from_millis(400 + rng.next(800));
        let started = std::time::Instant::now();
        wait_for(Duration::from_secs(10), "the kill moment", || async move {
            (started.elapsed() >= after).then_some(())
        })
        .await;
        let victim = rng.next(3) as usize;
        hosts[victim].kill();
        println!("dedupe: kill {} of host-{victim}", kill + 1);
        hosts[victim] = runs[victim].spawn();
    }
    let last = ids.last().unwrap().clone();
    wait_for(Duration::from_secs(240), "every entry settled", || {
        let mut conn = conn.clone();
        let last = last.clone();
        async move { (acked_through(&mut conn, stream, "g", &last).await).then_some(()) }
    })
    .await;
    // Every key handled to its end, and only ever by one of its entries (a kill between the
    // handler and the ack runs that same entry again: at least once, never another entry).
    let record = record.lock().unwrap().clone();
    let mut ends: HashMap<u64, HashSet<usize>> = HashMap::new();
    let mut again = 0;
    for line in &record {
        let mut words = line.split(' ');
        let (Some("end"), Some(tag)) = (words.next(), words.next()) else {
            continue;
        };
        let (key, n) = tag.split_once(':').unwrap();
        let (key, n): (u64, usize) = (key.parse().unwrap(), n.parse().unwrap());
        if !ends.entry(key).or_default().insert(n) {
            again += 1;
        }
    }
    // Which of two entries of one key read at once by two hosts is the first is the one judged
    // first: one entry per key, not necessarily the earliest.
    let wrong: Vec<String> = (1..=distinct)
        .filter_map(|key| {
            let handled = ends.get(&key).cloned().unwrap_or_default();
            (handled.len() != 1).then(|| format!("key {key}: handled by entries {handled:?}"))
        })
        .collect();
    let counted = duplicates(&mut conn, stream, "g").await;
    println!(
        "dedupe: seed {seed}, {ENTRIES} entries, {distinct} keys, {dups} duplicates ({counted} counted), {KILLS} kills, {again} entries handled again after a kill"
    );
    assert!(
        wrong.is_empty(),
        "seed {seed}: {:?}",
        &wrong[..wrong.len().min(20)]
    );
    assert_eq!(counted, dups, "each duplicate counted once (seed {seed})");
    for mut host in hosts {
        host.terminate();
        host.wait_exit().await;
    }
}

/// What became of the entry `id`.
async fn handled_as(host: &mut TestHost, id: String) -> EventKind {
    host.event(T, "the entry settled", |e| e.id == id)
        .await
        .kind
}

#[tokio::test]
async fn past_max_keys_new_keys_run_unremembered_and_known_keys_still_skip_their_duplicates() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "dd-cap";
    let sub = Sub::fixture(stream)
        .delayed(&format!("{stream}.delayed"))
        .set(
            "dedupe",
            Raw(r#"{ field = "dedupe-id", window = "1h", max_keys = 2 }"#),
        );
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    // Duplicates do not use up max_keys (found by the attack review): only new keys count.
    let a = add_keyed(&mut conn, stream, &Control::Ack, "a").await;
    assert_eq!(handled_as(&mut host, a.clone()).await, EventKind::Acked);
    for _ in 0..3 {
        let dup = add_keyed(&mut conn, stream, &Control::Ack, "a").await;
        assert_eq!(
            handled_as(&mut host, dup).await,
            EventKind::Duplicate { of: a.clone() }
        );
    }
    let k1 = add_keyed(&mut conn, stream, &Control::Ack, "k1").await;
    assert_eq!(handled_as(&mut host, k1.clone()).await, EventKind::Acked);
    // Two new keys taken this window: a new key runs without being remembered...
    for _ in 0..2 {
        let k3 = add_keyed(&mut conn, stream, &Control::Ack, "k3").await;
        assert_eq!(handled_as(&mut host, k3).await, EventKind::Acked);
    }
    // ... while a known key still skips its duplicates.
    let again = add_keyed(&mut conn, stream, &Control::Ack, "k1").await;
    assert_eq!(
        handled_as(&mut host, again).await,
        EventKind::Duplicate { of: k1 }
    );
    let admin = host.admin().await;
    let (_, metrics) = http_get(admin, "/metrics").await;
    let over = metrics
        .lines()
        .find(|l| l.starts_with("sluice_dedupe_unkeyed_total") && l.contains("over_max_keys"))
        .unwrap_or_default()
        .to_owned();
    assert!(over.ends_with(" 2"), "{over}");
    host.stop().await.unwrap();
}

#[tokio::test]
async fn entries_read_again_alone_past_a_reads_byte_budget_are_judged_too() {
    // 14 entries of 6 MB: past the read's 64 MB budget the rest are read again one by one
    // (found by the attack review: those ran unjudged).
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "dd-big";
    let pad = "x".repeat(6 << 20);
    let ack = serde_json::to_string(&Control::Ack).unwrap();
    let mut ids = HashSet::new();
    for _ in 0..14 {
        let id: String = cmd(
            &mut conn,
            &[
                "XADD",
                stream,
                "*",
                "dedupe-id",
                "same",
                "payload",
                &ack,
                "pad",
                &pad,
            ],
        )
        .await;
        ids.insert(id);
    }
    let mut host = start_fixture(&redis, TestConfig::of(deduped(stream))).await;
    let (mut acked, mut skipped) = (0, 0);
    while acked + skipped < ids.len() {
        let e = host
            .event(T, "every big entry settled", |e| ids.contains(&e.id))
            .await;
        match e.kind {
            EventKind::Acked => acked += 1,
            EventKind::Duplicate { .. } => skipped += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((acked, skipped), (1, 13));
    assert_eq!(duplicates(&mut conn, stream, "g").await, 13);
    host.stop().await.unwrap();
}
