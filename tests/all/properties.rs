//! A property test against the running host: whatever a producer puts on the stream (binary
//! field names and values, 1 to 10,000 fields, values up to 16 MiB, random `sluice-*` fields)
//! and whatever the handler answers (ack, dead letter, retries, traps), every entry ends as
//! exactly one of acked by the handler or dead-lettered with a reason; nothing stays pending or
//! parked; and a healthy entry added afterwards is handled.
//!
//! It runs 12 cases by default (a few seconds) so CI stays fast. Run it long with, for example:
//! `PROPTEST_CASES=500 cargo test -p sluice-host --test all -- properties --nocapture`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice_host::EventKind;

use crate::common::*;

const STREAM: &str = "prop";
const T: Duration = Duration::from_secs(120);

/// What one produced entry looks like.
#[derive(Debug, Clone)]
struct Produced {
    /// The `payload` field (first, so it wins over a random field of the same name): a control
    /// for the fixture, or bytes that are not one, or none at all.
    payload: Option<Vec<u8>>,
    /// Random fields after it.
    fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// That many more fields `f0`, `f1`, ... (for entries with thousands of fields).
    bulk: usize,
    /// One more field with a value this large.
    big: Option<usize>,
}

fn control() -> impl Strategy<Value = Control> {
    prop_oneof![
        Just(Control::Ack),
        "[a-z ]{0,20}".prop_map(|r| Control::Dead {
            reason: r.to_string()
        }),
        (10u64..200, 1u64..3).prop_map(|(ms, times)| Control::Retry { ms, times }),
        (1u64..3).prop_map(|times| Control::TrapThenAck { times }),
        Just(Control::Trap),
    ]
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        12 => "[a-z]{1,8}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
        1 => prop_oneof![
            Just(b"sluice-retry-count".to_vec()),
            Just(b"sluice-origin-id".to_vec()),
            Just(b"sluice-due-ms".to_vec()),
            Just(b"sluice-mark".to_vec()),
            Just(b"sluice-reason".to_vec()),
        ],
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..32),
        1 => prop_oneof![
            Just(b"4294967295".to_vec()),
            Just(b"0".to_vec()),
            Just(b"1-1".to_vec()),
        ],
    ]
}

fn produced() -> impl Strategy<Value = Produced> {
    (
        prop_oneof![
            8 => control().prop_map(|c| Some(c.to_string().into_bytes())),
            1 => proptest::collection::vec(any::<u8>(), 0..16).prop_map(Some),
            1 => Just(None),
        ],
        proptest::collection::vec((name(), value()), 0..8),
        prop_oneof![12 => Just(0usize), 1 => 2_000usize..10_000],
        prop_oneof![30 => Just(None), 1 => (1usize << 20..16 << 20).prop_map(Some)],
    )
        .prop_map(|(payload, fields, bulk, big)| Produced {
            payload,
            fields,
            bulk,
            big,
        })
}

async fn xadd(conn: &mut redis::aio::MultiplexedConnection, p: &Produced) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(STREAM).arg("*");
    let mut any = false;
    if let Some(payload) = &p.payload {
        cmd.arg("payload").arg(payload.as_slice());
        any = true;
    }
    for (n, v) in &p.fields {
        cmd.arg(n.as_slice()).arg(v.as_slice());
        any = true;
    }
    for i in 0..p.bulk {
        cmd.arg(format!("f{i}")).arg(i);
        any = true;
    }
    if let Some(size) = p.big {
        cmd.arg("big").arg(vec![b'b'; size]);
        any = true;
    }
    if !any {
        // XADD needs one field: an entry with only an empty name and value.
        cmd.arg("").arg("");
    }
    cmd.query_async(conn).await.expect("XADD")
}

/// Final outcomes by origin id, as the host reported them (once each is in Redis).
type Outcomes = Arc<Mutex<HashMap<String, Vec<&'static str>>>>;

/// Dead letters written after `after` (exclusive), by origin id (the last `sluice-origin-id`:
/// the host's, after any the producer wrote itself), each with its reason.
async fn dead_letters_since(
    conn: &mut redis::aio::MultiplexedConnection,
    after: &str,
) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let raw: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(dead_letter_key(STREAM))
        .arg(format!("({after}"))
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE of the dead letters");
    for (_, fields) in raw {
        let last = |name: &str| {
            fields
                .iter()
                .rev()
                .find(|(n, _)| n == name.as_bytes())
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        if let Some(origin) = last("sluice-origin-id") {
            out.entry(origin)
                .or_default()
                .push(last("sluice-reason").unwrap_or_default());
        }
    }
    out
}

#[test]
fn every_entry_ends_acked_or_dead_lettered_exactly_once() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = Redis::start();
    let config = Sub::fixture(STREAM)
        .set("max_retries", 2)
        .set(
            "failure_backoff",
            Raw(r#"{ initial = "10ms", max = "50ms" }"#),
        )
        .delayed(&format!("{STREAM}.delayed"));
    let host = rt.block_on(start_fixture(&redis, config));
    let outcomes: Outcomes = Arc::default();
    let mut events = host.events.resubscribe();
    let sink = outcomes.clone();
    rt.spawn(async move {
        while let Ok(event) = events.recv().await {
            let kind = match event.kind {
                EventKind::Acked => "acked",
                EventKind::DeadLettered { .. } => "dead",
                _ => continue,
            };
            sink.lock()
                .unwrap()
                .entry(event.origin_id)
                .or_default()
                .push(kind);
        }
    });
    let conn = rt.block_on(redis.conn());
    // Dead letters can hold values of many MiB: read them on a connection with time to spare.
    let bulk = rt.block_on(async {
        redis::Client::open(redis.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_response_timeout(Some(Duration::from_secs(60))),
            )
            .await
            .unwrap()
    });
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: 32,
        ..Config::default()
    });
    // (entries, acked, dead-lettered), across cases.
    let totals = Mutex::new((0usize, 0usize, 0usize));
    runner
        .run(&proptest::collection::vec(produced(), 1..12), |batch| {
            let (acks, deads) = rt.block_on(async {
                let mut conn = conn.clone();
                // Dead letters of this case have ids after this one (server clock, a second back).
                let (secs, _): (u64, u64) = cmd(&mut conn, &["TIME"]).await;
                let start = format!("{}000-0", secs - 1);
                let mut ids = Vec::new();
                for p in &batch {
                    ids.push(xadd(&mut conn, p).await);
                }
                // Wait until the host reported a final outcome for every entry of the batch and
                // nothing is pending or parked.
                let reported = wait_for(T, "every entry of the batch settled", || {
                    let mut conn = conn.clone();
                    let (ids, outcomes) = (ids.clone(), outcomes.clone());
                    async move {
                        let outcomes = outcomes.lock().unwrap().clone();
                        if !ids.iter().all(|id| outcomes.contains_key(id)) {
                            return None;
                        }
                        let parked = parked(&mut conn, &format!("{STREAM}.delayed")).await;
                        (pending(&mut conn, STREAM, "g").await == 0 && parked == 0)
                            .then_some(outcomes)
                    }
                })
                .await;
                // Checked in Redis: each dead letter once, with a reason; each entry has exactly
                // one final outcome.
                let dead = dead_letters_since(&mut bulk.clone(), &start).await;
                let mut acks = 0;
                let mut deads = 0;
                for id in &ids {
                    let kinds = &reported[id];
                    let in_redis = dead.get(id).map_or(0, Vec::len);
                    let dead_events = kinds.iter().filter(|k| **k == "dead").count();
                    assert_eq!(kinds.len(), 1, "{id}: final outcomes {kinds:?}");
                    assert_eq!(
                        in_redis, dead_events,
                        "{id}: {in_redis} dead letters in Redis"
                    );
                    if let Some(reasons) = dead.get(id) {
                        assert!(
                            !reasons[0].is_empty(),
                            "{id}: a dead letter without a reason"
                        );
                        deads += 1;
                    } else {
                        acks += 1;
                    }
                }
                // A healthy entry added last is handled.
                let last = add(&mut conn, STREAM, &Control::Ack).await;
                wait_acked(&conn, STREAM, "g", &last).await;
                (acks, deads)
            });
            let mut totals = totals.lock().unwrap();
            totals.0 += batch.len();
            totals.1 += acks;
            totals.2 += deads;
            Ok(())
        })
        .unwrap_or_else(|err| panic!("{err}"));
    let (entries, acked, dead) = *totals.lock().unwrap();
    println!(
        "property: {cases} cases, {entries} entries: {acked} acked, {dead} dead-lettered, 0 lost, 0 twice"
    );
    rt.block_on(host.stop()).unwrap();
}
