//! Upgrading from the earlier release: the state its hosts left in Redis (parked members without
//! an owner, lane and stream copies with its marks, dead letters in the stream's shared default
//! dead-letter stream) is written here in its formats, byte for byte, and a host of this release
//! brings each entry back once, with its origin id and retry count, and lists and requeues the
//! dead letters.

use std::collections::HashMap;
use std::time::Duration;

use sluice_host::EventKind;
use sluice_host::control::operate::dead_letters;
use sluice_host::entry::member;
use sluice_host::store::keys::Secret;

use crate::common::*;

const T: Duration = Duration::from_secs(60);

/// A member of the earlier release that kept the origin: `[entry id, retry count, fields,
/// origin id]`, strings as MessagePack str (as Lua's cmsgpack writes them).
fn member_with_origin(
    entry: &str,
    retry: u32,
    fields: &[(Vec<u8>, Vec<u8>)],
    origin: &str,
) -> Vec<u8> {
    let mut out = Vec::new();
    let str = |out: &mut Vec<u8>, b: &[u8]| {
        rmp::encode::write_str_len(out, b.len() as u32).unwrap();
        out.extend_from_slice(b);
    };
    rmp::encode::write_array_len(&mut out, 4).unwrap();
    str(&mut out, entry.as_bytes());
    rmp::encode::write_uint(&mut out, u64::from(retry)).unwrap();
    rmp::encode::write_array_len(&mut out, (fields.len() * 2) as u32).unwrap();
    for (name, value) in fields {
        str(&mut out, name);
        str(&mut out, value);
    }
    str(&mut out, origin.as_bytes());
    out
}

/// `payload` and the earlier release's four bookkeeping fields with its mark.
fn old_copy(secret: &Secret, stream: &str, origin: &str, retry: &str) -> Vec<(String, String)> {
    let due = "1700000000000";
    vec![
        ("payload".into(), Control::Ack.to_string()),
        ("sluice-retry-count".into(), retry.into()),
        ("sluice-origin-id".into(), origin.into()),
        ("sluice-due-ms".into(), due.into()),
        (
            "sluice-mark".into(),
            secret.legacy_mark(stream, origin, retry, due),
        ),
    ]
}

async fn xadd(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    fields: &[(String, String)],
) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(key).arg("*");
    for (n, v) in fields {
        cmd.arg(n).arg(v);
    }
    cmd.query_async(conn).await.unwrap()
}

/// An earlier release's dead letter of a delivery on `old` (seven bookkeeping fields, no seal).
fn old_dead_letter(group: &str, origin: &str) -> Vec<(String, String)> {
    old_dead_letter_of("old", group, origin)
}

/// An earlier release's dead letter of a delivery on `stream`.
fn old_dead_letter_of(stream: &str, group: &str, origin: &str) -> Vec<(String, String)> {
    [
        ("payload", Control::Ack.to_string()),
        ("sluice-reason", "gateway down".to_owned()),
        ("sluice-origin-stream", stream.to_owned()),
        ("sluice-origin-group", group.to_owned()),
        ("sluice-origin-id", origin.to_owned()),
        ("sluice-entry-id", origin.to_owned()),
        ("sluice-retry-count", "3".to_owned()),
        ("sluice-delivery-count", "1".to_owned()),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_state_comes_back_once() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let (stream, set, lane) = ("old", "old.delayed", "old.delayed.lane");
    // The stream's secret, as an earlier host made it.
    let _: () = cmd(&mut conn, &["SET", "sluice-secret:{old}", "earlier-secret"]).await;
    let secret = Secret::from_value("earlier-secret");
    let ack = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    // Parked: a first-release member (no origin: the entry is its own) due already, and one
    // with an origin due shortly.
    let _: i64 = redis::cmd("ZADD")
        .arg(set)
        .arg(1)
        .arg(member::encode_legacy("1-1", 1, &ack))
        .arg(1)
        .arg(member_with_origin("2-2", 2, &ack, "2-1"))
        .query_async(&mut conn)
        .await
        .unwrap();
    // A lane copy (`retry_lane = true` then) and a stream copy, marked the earlier way, unread.
    create_group(&mut conn, lane, "g", "0").await;
    create_group(&mut conn, stream, "g", "0").await;
    let on_lane = xadd(&mut conn, lane, &old_copy(&secret, stream, "3-1", "1")).await;
    let on_stream = xadd(&mut conn, stream, &old_copy(&secret, stream, "5-1", "4")).await;
    // Dead letters in the stream's shared default dead-letter stream: this group's, another
    // group's, and a raw member the sweep gave up on.
    let legacy = "old.dead-letter";
    let mine = xadd(&mut conn, legacy, &old_dead_letter("g", "6-1")).await;
    let theirs = xadd(&mut conn, legacy, &old_dead_letter("other", "7-1")).await;
    let member_letter: String = redis::cmd("XADD")
        .arg(legacy)
        .arg("*")
        .arg("sluice-member")
        .arg(member_with_origin("8-2", 1, &ack, "8-1"))
        .arg("sluice-reason")
        .arg("cannot re-add")
        .arg("sluice-origin-key")
        .arg(set)
        .arg("sluice-origin-stream")
        .arg(stream)
        .query_async(&mut conn)
        .await
        .unwrap();

    // A host of this release, with the defaults (lane, per-group dead letters).
    let mut host = start_fixture(&redis, Sub::fixture(stream).delayed(set)).await;
    let mut acked: HashMap<String, (u32, usize)> = HashMap::new();
    let expected = [("1-1", 1), ("2-1", 2), ("3-1", 1), ("5-1", 4)];
    while acked.values().map(|(_, n)| n).sum::<usize>() < expected.len() {
        let event = host
            .event(T, "the earlier release's retries", |e| {
                e.kind == EventKind::Acked
            })
            .await;
        let seen = acked
            .entry(event.origin_id.clone())
            .or_insert((event.retry_count, 0));
        seen.1 += 1;
    }
    for (origin, retry) in expected {
        assert_eq!(acked.get(origin), Some(&(retry, 1)), "{origin}: {acked:?}");
    }
    let _ = (on_lane, on_stream);
    assert_eq!(parked(&mut conn, set).await, 0);
    wait_for(T, "nothing pending", || {
        let mut conn = conn.clone();
        async move {
            (pending(&mut conn, stream, "g").await == 0 && pending(&mut conn, lane, "g").await == 0)
                .then_some(())
        }
    })
    .await;

    // The group's dead letters moved to its own dead-letter stream; the other group's stayed.
    let own = dead_letter_key(stream);
    wait_dead_letters_in(&conn, &own, 2).await;
    let left: Vec<String> = entries(&mut conn, legacy)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(left, [theirs], "{mine} and {member_letter} moved");
    let keys = sluice_host::store::keys::SubscriptionKeys::new(stream, "g", &own, Some(set))
        .with_retry_lane(true);
    let page = dead_letters::list(&mut conn, &keys, None, 10, None, 1)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2, "{:?}", page.items);
    // Both were written before the upgrade: their origins are trusted, and a requeue keeps them.
    for letter in page.items {
        assert!(letter.trusted, "{letter:?}");
        let origin = letter.origin_id.clone().unwrap();
        let dead_letters::Requeued::To(new) =
            dead_letters::requeue(&mut conn, &keys, &letter, false)
                .await
                .unwrap()
        else {
            panic!("gone")
        };
        let event = host
            .event(T, "the requeued dead letter", |e| e.id == new)
            .await;
        assert_eq!(event.kind, EventKind::Acked);
        assert_eq!(event.origin_id, origin);
        assert_eq!(event.retry_count, 0);
    }
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_dead_letter_stream_that_others_read_is_left_to_them() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // An earlier release's shared dead-letter stream, read by another service's group.
    let legacy = "read.dead-letter";
    let mine = xadd(&mut conn, legacy, &old_dead_letter_of("read", "g", "1-1")).await;
    create_group(&mut conn, legacy, "dlq", "0").await;
    let host = HostProcess::run(&redis, Sub::fixture("read").delayed("read.delayed"));
    wait_for(T, "the host to say it leaves them", || {
        let log = host.log_text();
        async move { log.contains("which consumer groups read").then_some(()) }
    })
    .await;
    let left: Vec<String> = entries(&mut conn, legacy)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(left, [mine], "not moved from under its readers");
    assert!(
        entries(&mut conn, &dead_letter_key("read"))
            .await
            .is_empty()
    );
}

/// A pass of the dead-letter migration that finds nothing new after its cursor sends one
/// XRANGE: not the secret's script and the stream's groups as well (thousands of idle
/// subscriptions on a polling doorbell sent 14 commands each a minute for it). One that finds
/// a letter still moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_pass_with_nothing_new_costs_one_command() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let own = dead_letter_key("old");
    let mut keys =
        sluice_host::store::keys::SubscriptionKeys::new("old", "g", &own, Some("old.delayed"));
    keys.legacy_dead_letter = Some("old.dead-letter".into());
    let first = xadd(&mut conn, "old.dead-letter", &old_dead_letter("g", "6-1")).await;
    let done = dead_letters::migrate_legacy(&mut conn, &keys, None)
        .await
        .unwrap();
    assert_eq!(done.moved, 1);
    assert_eq!(done.cursor.as_deref(), Some(first.as_str()));
    let (xrange, evalsha, groups) = (
        calls(&mut conn, "xrange").await,
        calls(&mut conn, "evalsha").await + calls(&mut conn, "eval").await,
        calls(&mut conn, "xinfo|groups").await,
    );
    let again = dead_letters::migrate_legacy(&mut conn, &keys, done.cursor.as_deref())
        .await
        .unwrap();
    assert_eq!(
        (again.moved, again.cursor.as_deref()),
        (0, Some(first.as_str()))
    );
    assert_eq!(calls(&mut conn, "xrange").await - xrange, 1);
    assert_eq!(
        calls(&mut conn, "evalsha").await + calls(&mut conn, "eval").await,
        evalsha,
        "no script for a pass with nothing new"
    );
    assert_eq!(calls(&mut conn, "xinfo|groups").await, groups);
    // A letter written since (a host of the earlier release, mid-upgrade) is moved.
    let second = xadd(&mut conn, "old.dead-letter", &old_dead_letter("g", "7-1")).await;
    let later = dead_letters::migrate_legacy(&mut conn, &keys, again.cursor.as_deref())
        .await
        .unwrap();
    assert_eq!((later.moved, later.cursor), (1, Some(second)));
    assert_eq!(entries(&mut conn, &own).await.len(), 2);
}

/// On a polling doorbell (no keyspace events), a dead letter an earlier release's host writes
/// while this host runs is moved when the doorbell's read sees it, not at a slow backstop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_polling_doorbell_a_dead_letter_written_mid_upgrade_is_moved_at_once() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let config = TestConfig::of(Sub::fixture("old").delayed("old.delayed")).set("doorbell", "poll");
    let host = start_fixture(&redis, config).await;
    let own = dead_letter_key("old");
    // Idle, its first migration pass long done: the letter's XADD is what it reacts to.
    wait_for(T, "the host to read its streams", || {
        let mut conn = conn.clone();
        async move { (calls(&mut conn, "xread").await > 0).then_some(()) }
    })
    .await;
    let letter = xadd(&mut conn, "old.dead-letter", &old_dead_letter("g", "9-1")).await;
    // Well within the backstop (5 minutes), even on a loaded machine.
    wait_for(Duration::from_secs(30), "the letter moved", || {
        let mut conn = conn.clone();
        let own = own.clone();
        async move { (entries(&mut conn, &own).await.len() == 1).then_some(()) }
    })
    .await;
    assert!(
        entries(&mut conn, "old.dead-letter").await.is_empty(),
        "{letter} moved"
    );
    drop(host);
}
