//! Stream retention against a real Redis: acknowledged history goes, and nothing a group still
//! needs ever does: not what a slow group (not run by Sluice) has pending or unread, not parked
//! retries; a cap that cannot be kept is reported, and one host at a time trims.

use std::collections::HashMap;
use std::time::Duration;

use sluice_host::EventKind;

use crate::common::*;

const T: Duration = Duration::from_secs(60);

fn retention(sub: Sub, keep_acked: &str, max_len: Option<u64>) -> Sub {
    let cap = max_len
        .map(|n| format!(", max_len = {n}"))
        .unwrap_or_default();
    let table = format!("{{ keep_acked = \"{keep_acked}\", every = \"100ms\"{cap} }}");
    sub.set("retention", Raw(&table))
}

/// The last retention run's record, once there is one with `at_ms` after `after`.
async fn next_run(
    conn: &redis::aio::MultiplexedConnection,
    stream: &str,
    after: i64,
) -> HashMap<String, String> {
    let key = sluice_host::store::keys::retention_record_key(stream);
    wait_for(T, "a retention run", || {
        let mut conn = conn.clone();
        let key = key.clone();
        async move {
            let record: HashMap<String, String> = cmd(&mut conn, &["HGETALL", &key]).await;
            let at: i64 = record.get("at_ms")?.parse().ok()?;
            (at > after).then_some(record)
        }
    })
    .await
}

async fn ids(conn: &mut redis::aio::MultiplexedConnection, stream: &str) -> Vec<String> {
    entries(conn, stream)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_group_keeps_what_it_has_not_acked_while_acked_history_goes() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "kept";
    // A group Sluice does not run, created before anything is added.
    create_group(&mut conn, stream, "slow", "0").await;
    let mut added = Vec::new();
    for _ in 0..400 {
        added.push(add(&mut conn, stream, &Control::Ack).await);
    }
    // The slow group reads 200 and acknowledges the first 100: it needs added[100..].
    read_and_ack(&mut conn, stream, "slow", 200, 100).await;

    let host = start_fixture(&redis, retention(Sub::fixture(stream), "0s", None)).await;
    wait_acked(&conn, stream, "g", added.last().unwrap()).await;
    wait_for(T, "acknowledged history trimmed", || {
        let mut conn = conn.clone();
        async move {
            let n: usize = cmd(&mut conn, &["XLEN", stream]).await;
            (n < 400).then_some(())
        }
    })
    .await;
    // Let a few more runs happen; what the slow group needs is all still there.
    let record = next_run(&conn, stream, 0).await;
    let at: i64 = record["at_ms"].parse().unwrap();
    next_run(&conn, stream, at).await;
    let left = ids(&mut conn, stream).await;
    assert!(left.len() < 400, "something was trimmed");
    assert!(
        left.len() >= 300,
        "nothing past what the slow group acked: {}",
        left.len()
    );
    assert_eq!(
        &left[left.len() - 300..],
        &added[100..],
        "every entry the slow group needs"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_acked_keeps_young_history_and_parked_retries_survive_trimming() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Young history is kept: a run happens and trims nothing.
    let host = start_fixture(&redis, retention(Sub::fixture("young"), "1h", None)).await;
    let mut last = String::new();
    for _ in 0..300 {
        last = add(&mut conn, "young", &Control::Ack).await;
    }
    wait_acked(&conn, "young", "g", &last).await;
    let record = next_run(&conn, "young", 0).await;
    let at: i64 = record["at_ms"].parse().unwrap();
    let record = next_run(&conn, "young", at).await;
    assert_eq!(record["trimmed"], "0", "{record:?}");
    let n: usize = cmd(&mut conn, &["XLEN", "young"]).await;
    assert_eq!(n, 300);
    host.stop().await.unwrap();

    // Everything acknowledged goes at once; retries parked meanwhile come back after their
    // originals were trimmed and are handled normally.
    let sub = retention(Sub::fixture("again").delayed("again.delayed"), "0s", None);
    let mut host = start_fixture(&redis, sub).await;
    let mut retried = Vec::new();
    for _ in 0..20 {
        retried.push(add(&mut conn, "again", &Control::Retry { ms: 1500, times: 1 }).await);
    }
    for _ in 0..300 {
        add(&mut conn, "again", &Control::Ack).await;
    }
    wait_for(T, "the originals of the retries trimmed", || {
        let mut conn = conn.clone();
        let first = retried[0].clone();
        async move {
            let still: Vec<RawEntry> = cmd(&mut conn, &["XRANGE", "again", &first, &first]).await;
            still.is_empty().then_some(())
        }
    })
    .await;
    let mut acked = std::collections::HashSet::new();
    while acked.len() < retried.len() {
        let e = host
            .event(T, "the retries acked", |e| {
                e.kind == EventKind::Acked && e.retry_count == 1
            })
            .await;
        acked.insert(e.origin_id);
    }
    assert!(retried.iter().all(|id| acked.contains(id)));
    assert!(dead_lettered(&mut conn, "again").await.is_empty());
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_that_groups_still_need_is_reported_and_kept() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "capped";
    // A slow group that has read nothing: every entry is still needed.
    create_group(&mut conn, stream, "slow", "0").await;
    for _ in 0..200 {
        add(&mut conn, stream, &Control::Ack).await;
    }
    let mut host = start_fixture(&redis, retention(Sub::fixture(stream), "0s", Some(50))).await;
    let record = next_run(&conn, stream, 0).await;
    let at: i64 = record["at_ms"].parse().unwrap();
    let record = next_run(&conn, stream, at).await;
    assert_eq!(record["blocked"], "1", "{record:?}");
    let n: usize = cmd(&mut conn, &["XLEN", stream]).await;
    assert_eq!(n, 200, "every entry kept");
    let (_, metrics) = http_get(host.admin().await, "/metrics").await;
    let blocked = metrics
        .lines()
        .find(|l| {
            l.starts_with("sluice_retention_blocked_total{") && l.contains("stream=\"capped\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(!blocked.ends_with(" 0"), "{blocked}");
    assert!(
        metrics.contains("sluice_stream_length{stream=\"capped\",group=\"g\"} 200"),
        "{metrics}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_trim_one_at_a_time() {
    let redis = Redis::start();
    let conn = redis.conn().await;
    let stream = "shared";
    let sub =
        |consumer: &str| retention(Sub::fixture(stream), "0s", None).set("consumer", consumer);
    let a = start_fixture(&redis, sub("host-a")).await;
    let b = start_fixture(&redis, sub("host-b")).await;
    let mut holders = std::collections::HashSet::new();
    let mut at = 0;
    for _ in 0..6 {
        let record = next_run(&conn, stream, at).await;
        at = record["at_ms"].parse().unwrap();
        holders.insert(record["holder"].clone());
    }
    assert_eq!(holders.len(), 1, "one host holds the lease: {holders:?}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// 2^62: ids this large are exact for Redis (64-bit parts) but not for a Lua number, which
/// rounds them to a multiple of 1024.
const HUGE: u64 = 1 << 62;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_above_2_pow_53_keep_what_a_group_needs() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "huge-ids";
    // A producer with explicit ids above 2^53 in both parts: 500 entries whose ids all round to
    // one Lua number.
    create_group(&mut conn, stream, "slow", "0").await;
    let mut added = Vec::new();
    for i in 0..500u64 {
        let id = format!("{}-{HUGE}", HUGE + i);
        let payload = Control::Ack.to_string();
        let _: String = cmd(&mut conn, &["XADD", stream, &id, "payload", &payload]).await;
        added.push(id);
    }
    // The slow group reads and acknowledges 200: it still needs every entry after those.
    read_and_ack(&mut conn, stream, "slow", 200, 200).await;
    // The host's group acks everything; max_len 1 lets retention trim all that is acknowledged.
    let host = start_fixture(&redis, retention(Sub::fixture(stream), "0s", Some(1))).await;
    wait_acked(&conn, stream, "g", added.last().unwrap()).await;
    let record = next_run(&conn, stream, 0).await;
    let at: i64 = record["at_ms"].parse().unwrap();
    let record = next_run(&conn, stream, at).await;
    assert_eq!(record["threshold"], added[199], "{record:?}");
    let left = ids(&mut conn, stream).await;
    assert!(left.len() < 500, "acknowledged history was trimmed");
    assert_eq!(
        &left[left.len() - 300..],
        &added[200..],
        "every entry the slow group has not read"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_share_a_hash_tag_are_each_trimmed() {
    let redis = Redis::start();
    let conn = redis.conn().await;
    let (one, two) = ("{orders}.eu", "{orders}.us");
    // Two subscriptions whose hosts have different names: each must hold its own stream's
    // lease, not one lease for the tag.
    let config = TestConfig::of(retention(Sub::fixture(one), "0s", None).set("consumer", "h1"))
        .and(retention(Sub::fixture(two), "0s", None).set("consumer", "h2"));
    let host = start_fixture(&redis, config).await;
    let mut records = Vec::new();
    for stream in [one, two] {
        let record = next_run(&conn, stream, 0).await;
        records.push(record["holder"].clone());
    }
    assert_eq!(
        records,
        ["h1", "h2"],
        "each stream trimmed by its own holder"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_groups_dead_letters_are_trimmed_under_their_own_lease() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "dl-keep";
    // Two groups of one stream, in two hosts, each with its own dead-letter stream holding 300
    // dead letters from long ago (explicit old ids: Redis trims them by id).
    for group in ["a", "b"] {
        let key = sluice_descriptor::default_dead_letter(stream, group);
        for i in 1..=300 {
            let id = format!("{i}-1");
            let _: String = cmd(&mut conn, &["XADD", &key, &id, "f", "v"]).await;
        }
    }
    let sub = |group: &str| {
        Sub::fixture(stream)
            .set("group", group)
            .set("consumer", format!("host-{group}"))
            .set("dead_letter_retention", Raw(r#"{ keep = "1s" }"#))
            .set(
                "retention",
                Raw(r#"{ keep_acked = "1h", every = "100ms" }"#),
            )
    };
    let a = start_fixture(&redis, sub("a")).await;
    let b = start_fixture(&redis, sub("b")).await;
    for group in ["a", "b"] {
        let key = sluice_descriptor::default_dead_letter(stream, group);
        wait_for(T, &format!("{key} trimmed"), || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move {
                let n: usize = cmd(&mut conn, &["XLEN", &key]).await;
                (n < 300).then_some(())
            }
        })
        .await;
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Entries' histories stay within their bound whatever the number of entries that retried or
/// were dead-lettered: 3,000 dead letters with `dead_letter_maxlen = 100` and
/// `history_entries = 500` leave two history keys holding 500 entries' histories (the earlier
/// release left a key per entry: 3,000 of them, for 7 days), and a handful of keys in all;
/// `history_entries = 0` writes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_histories_are_bounded_and_can_be_turned_off() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let dead = serde_json::to_string(&sluice_fixture_control::Control::Dead {
        reason: "declined".into(),
    })
    .unwrap();
    let host = start_fixture(
        &redis,
        TestConfig::of(
            Sub::fixture("hb")
                .set("dead_letter_maxlen", 100)
                .set("history_entries", 500),
        )
        .and(Sub::fixture("hz").set("history_entries", 0)),
    )
    .await;
    for (stream, n) in [("hb", 3_000), ("hz", 200)] {
        let mut pipe = redis::pipe();
        for _ in 0..n {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(&dead);
        }
        let ids: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
        wait_acked(&conn, stream, "g", ids.last().unwrap()).await;
    }
    let histories = sluice_host::store::keys::history_key("hb", "g");
    let index = sluice_host::store::keys::history_index_key("hb", "g");
    let entries: u64 = cmd(&mut conn, &["HLEN", &histories]).await;
    let indexed: u64 = cmd(&mut conn, &["ZCARD", &index]).await;
    assert_eq!((entries, indexed), (500, 500));
    let keys: Vec<String> = cmd(&mut conn, &["KEYS", "*"]).await;
    assert!(keys.len() < 30, "{} keys: {keys:?}", keys.len());
    assert!(
        !keys
            .iter()
            .any(|k| k.contains("hz") && k.contains("histor")),
        "history_entries = 0 writes no history: {keys:?}"
    );
    host.stop().await.unwrap();
}
