//! Ordered keys (`ordered_by`): entries of one key handled one at a time in stream order,
//! across retries, dead letters and hosts; other keys never wait for them; a hot key's burst
//! moves aside; an entry without a key (or with one too long) goes unordered and is counted.

use std::time::Duration;

use sluice_host::{Event, EventKind};

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// The fixture's `control` as a payload that also carries `account` (the key).
pub fn keyed(control: &Control, account: &str) -> String {
    let mut json = serde_json::to_value(control).unwrap();
    json["account"] = serde_json::Value::String(account.to_owned());
    json.to_string()
}

/// XADD `payload` (see [`keyed`]) to `stream`; its id.
pub async fn add_raw(conn: &mut redis::aio::MultiplexedConnection, stream: &str, payload: &str) -> String {
    cmd(conn, &["XADD", stream, "*", "payload", payload]).await
}

/// A fixture subscription to `stream` ordered by the payload's `account`.
pub fn ordered(stream: &str) -> Sub {
    Sub::fixture(stream)
        .delayed(&format!("{stream}.delayed"))
        .set("ordered_by", Raw(r#"{ payload = "/account" }"#))
}

/// Every key the ordering of `stream`'s group `g` keeps in Redis.
pub async fn order_state(conn: &mut redis::aio::MultiplexedConnection, stream: &str) -> Vec<String> {
    let prefix = sluice_host::store::keys::order_prefix(stream, "g");
    let mut keys: Vec<String> = cmd(conn, &["KEYS", &format!("{prefix}*")]).await;
    keys.sort();
    keys
}

/// How many entries of `account` wait behind its turn.
async fn waiting(conn: &mut redis::aio::MultiplexedConnection, stream: &str, account: &str) -> u64 {
    let keys = sluice_host::pipeline::order::OrderKeys::new(stream, "g");
    let digest = sluice_host::pipeline::order::digest(account.as_bytes());
    cmd(conn, &["LLEN", &keys.wait(&digest)]).await
}

/// The settle events of `host` until `done` says enough, in the order they came.
async fn events_until(host: &mut TestHost, mut done: impl FnMut(&[Event]) -> bool) -> Vec<Event> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + T;
    while !done(&seen) {
        let event = tokio::time::timeout_at(deadline, host.events.recv())
            .await
            .unwrap_or_else(|_| panic!("stalled; so far: {seen:?}"))
            .expect("events");
        seen.push(event);
    }
    seen
}

fn position(events: &[Event], origin: &str, acked: bool) -> usize {
    events
        .iter()
        .position(|e| e.origin_id == origin && (!acked || matches!(e.kind, EventKind::Acked)))
        .unwrap_or_else(|| panic!("no event of {origin} in {events:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_entries_wait_behind_its_parked_retry_while_other_keys_go() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "ord-wait";
    let a1 = add_raw(&mut conn, stream, &keyed(&Control::Retry { ms: 600, times: 1 }, "A")).await;
    let a2 = add_raw(&mut conn, stream, &keyed(&Control::Ack, "A")).await;
    let b1 = add_raw(&mut conn, stream, &keyed(&Control::Ack, "B")).await;
    let a3 = add_raw(&mut conn, stream, &keyed(&Control::Ack, "A")).await;
    let mut host = start_fixture(&redis, TestConfig::of(ordered(stream))).await;
    // While A's head is parked, its later entries wait in Redis, not in the host.
    let mut events = events_until(&mut host, |seen| {
        seen.iter()
            .any(|e| e.origin_id == a1 && matches!(e.kind, EventKind::Parked { .. }))
    })
    .await;
    wait_for(T, "A2 and A3 queued behind the parked head", || {
        let mut conn = conn.clone();
        async move { (waiting(&mut conn, stream, "A").await == 2).then_some(()) }
    })
    .await;
    let acked = |seen: &[Event]| {
        seen.iter()
            .filter(|e| matches!(e.kind, EventKind::Acked))
            .count()
    };
    let before = acked(&events);
    events.extend(events_until(&mut host, |seen| before + acked(seen) == 4).await);
    let (at_b1, at_a1) = (position(&events, &b1, true), position(&events, &a1, true));
    let (at_a2, at_a3) = (position(&events, &a2, true), position(&events, &a3, true));
    assert!(at_b1 < at_a1, "B does not wait for A's retry: {events:?}");
    assert!(at_a1 < at_a2 && at_a2 < at_a3, "A in stream order: {events:?}");
    let a2_event = &events[at_a2];
    assert_eq!(a2_event.retry_count, 0, "a let-in entry is no retry");
    // Nothing of the ordering is left once every key settled.
    wait_for(T, "the order state gone", || {
        let mut conn = conn.clone();
        async move { order_state(&mut conn, stream).await.is_empty().then_some(()) }
    })
    .await;
    assert_eq!(pending(&mut conn, stream, "g").await, 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_head_releases_its_key_or_holds_it_until_requeued_deleted_or_released() {
    use crate::operate::sluice;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let (released, held) = ("ord-release", "ord-hold");
    let hold = ordered(held).set(
        "ordered_by",
        Raw(r#"{ payload = "/account", on_dead_letter = "hold" }"#),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "sluice.toml", &TestConfig::of(hold.clone()).to_string());
    // Release (the default): the next entry of the key goes once its head is dead-lettered.
    let r1 = add_raw(&mut conn, released, &keyed(&Control::Dead { reason: "no".into() }, "A")).await;
    let r2 = add_raw(&mut conn, released, &keyed(&Control::Ack, "A")).await;
    // Hold: A's second entry waits for the dead letter to be requeued; B's for its deletion;
    // C's for an operator's release.
    let until = Control::DeadUntilRequeued { reason: "fix me".into() };
    let h1 = add_raw(&mut conn, held, &keyed(&until, "A")).await;
    let h2 = add_raw(&mut conn, held, &keyed(&Control::Ack, "A")).await;
    let dead = Control::Dead { reason: "poison".into() };
    let b1 = add_raw(&mut conn, held, &keyed(&dead, "B")).await;
    let b2 = add_raw(&mut conn, held, &keyed(&Control::Ack, "B")).await;
    let c1 = add_raw(&mut conn, held, &keyed(&dead, "C")).await;
    let c2 = add_raw(&mut conn, held, &keyed(&Control::Ack, "C")).await;
    let mut host = start_fixture(&redis, TestConfig::of(ordered(released)).and(hold)).await;
    host.event(T, "the released key's next entry acked", |e| {
        e.origin_id == r2 && e.kind == EventKind::Acked
    })
    .await;
    assert_eq!(dead_lettered(&mut conn, released).await.len(), 1, "{r1} dead-lettered");
    wait_dead_letters_in(&conn, &dead_letter_key(held), 3).await;
    for account in ["A", "B", "C"] {
        wait_for(T, &format!("{account}'s next entry held"), || {
            let mut conn = conn.clone();
            async move { (waiting(&mut conn, held, account).await == 1).then_some(()) }
        })
        .await;
    }
    let listing = sluice(&["keys"], &config, &redis).await;
    assert!(listing.contains("3 key(s) with entries waiting"), "{listing}");
    assert!(listing.contains(&format!("{h1} (dead letter, held)")), "{listing}");
    // Requeued, the head is handled again (it holds the turn still), then the next goes.
    let letters = dead_lettered(&mut conn, held).await;
    let id_of = |origin: &str| {
        letters
            .iter()
            .find(|(_, f)| field(f, "sluice-origin-id") == Some(origin))
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("no dead letter of {origin}: {letters:?}"))
    };
    sluice(&["requeue", &id_of(&h1)], &config, &redis).await;
    for origin in [&h1, &h2] {
        host.event(T, "A requeued and then its next", |e| {
            &e.origin_id == origin && e.kind == EventKind::Acked
        })
        .await;
    }
    sluice(&["delete", "--dead-letter", &id_of(&b1)], &config, &redis).await;
    host.event(T, "B's next after its dead letter was deleted", |e| {
        e.origin_id == b2 && e.kind == EventKind::Acked
    })
    .await;
    assert_eq!(waiting(&mut conn, held, "C").await, 1, "C still held: {c1}");
    let out = sluice(&["keys", "--release", "C"], &config, &redis).await;
    assert!(out.contains("1 turn(s) given back, 1 waiting entry let in"), "{out}");
    host.event(T, "C's next after the release", |e| {
        e.origin_id == c2 && e.kind == EventKind::Acked
    })
    .await;
    wait_for(T, "the order state gone", || {
        let mut conn = conn.clone();
        async move {
            let left = order_state(&mut conn, held).await;
            left.is_empty().then_some(())
        }
    })
    .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_without_a_key_or_with_one_too_long_go_unordered_and_are_counted() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "ord-unkeyed";
    let sub = ordered(stream).set(
        "ordered_by",
        Raw(r#"{ payload = "/account", max_key_bytes = 8 }"#),
    );
    // The keyed head parks for a long time: entries with no key, or a long one, never wait.
    let head = add_raw(&mut conn, stream, &keyed(&Control::Retry { ms: 60_000, times: 1 }, "k")).await;
    let none = add(&mut conn, stream, &Control::Ack).await;
    let long = add_raw(&mut conn, stream, &keyed(&Control::Ack, "a-key-longer-than-8")).await;
    let behind = add_raw(&mut conn, stream, &keyed(&Control::Ack, "k")).await;
    let mut host = start_fixture(&redis, TestConfig::of(sub)).await;
    crate::operate::wait_acked_origins(&mut host, &[none, long]).await;
    wait_for(T, "the keyed entry behind the parked head", || {
        let mut conn = conn.clone();
        async move { (waiting(&mut conn, stream, "k").await == 1).then_some(()) }
    })
    .await;
    let admin = host.admin().await;
    let (_, metrics) = http_get(admin, "/metrics").await;
    for line in [
        format!(r#"sluice_ordered_unkeyed_total{{stream="{stream}",group="g",reason="missing"}} 1"#),
        format!(r#"sluice_ordered_unkeyed_total{{stream="{stream}",group="g",reason="too_long"}} 1"#),
        format!(r#"sluice_ordered_held_total{{stream="{stream}",group="g"}} 1"#),
    ] {
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
    assert!(!host_acked_yet(&mut conn, stream, &behind).await, "{head} still holds k");
    host.stop().await.unwrap();
}

/// Whether `id` was acknowledged by `g` (it is neither pending nor unread).
async fn host_acked_yet(conn: &mut redis::aio::MultiplexedConnection, stream: &str, id: &str) -> bool {
    let pending: Vec<redis::Value> = cmd(conn, &["XPENDING", stream, "g", id, id, "1"]).await;
    let keys = sluice_host::pipeline::order::OrderKeys::new(stream, "g");
    let digest = sluice_host::pipeline::order::digest(b"k");
    let queued: Vec<Vec<u8>> = cmd(conn, &["LRANGE", &keys.wait(&digest), "0", "-1"]).await;
    pending.is_empty() && queued.is_empty()
}
