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
    host.event(T, "A's head parked", |e| {
        e.origin_id == a1 && matches!(e.kind, EventKind::Parked { .. })
    })
    .await;
    wait_for(T, "A2 and A3 queued behind the parked head", || {
        let mut conn = conn.clone();
        async move { (waiting(&mut conn, stream, "A").await == 2).then_some(()) }
    })
    .await;
    let events = events_until(&mut host, |seen| {
        seen.iter()
            .filter(|e| matches!(e.kind, EventKind::Acked))
            .count()
            == 4
    })
    .await;
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
