//! Several services on one stream: each consumer group's retries stay with it (no copies for the
//! others), keys are never shared between subscriptions, the host's bookkeeping cannot be
//! replayed onto other entries, and no entry can grow Redis by retrying. See docs/src/security-model.md.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sluice_host::EventKind;
use sluice_host::entry::member;
use sluice_host::store::keys::Secret;

use crate::common::*;

const T: Duration = Duration::from_secs(60);

/// Retry twice after 50 ms, then dead-letter: the probe handler.
fn twice_then_dead() -> Control {
    Control::Attempts {
        each: vec![
            Control::Retry { ms: 50, times: 9 },
            Control::Retry { ms: 50, times: 9 },
            Control::Dead {
                reason: "gave up".into(),
            },
        ],
    }
}

/// A subscription to `stream` as `group`, with a delayed set of its own.
fn member_of(stream: &str, group: &str) -> Sub {
    Sub::fixture(stream)
        .set("group", group)
        .set("consumer", format!("{group}-1"))
        .delayed(&format!("{stream}.{group}.delayed"))
}

/// Read everything a plain consumer group (another service) gets from `stream`: the ids.
async fn read_plain(conn: &mut redis::aio::MultiplexedConnection, stream: &str) -> Vec<String> {
    read_and_ack(conn, stream, "plain", 1_000_000, 0).await
}

/// Origin ids of the dead letters in `key`, with how many times each appears.
async fn dead_origins(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (_, fields) in entries(conn, key).await {
        let origin = field(&fields, "sluice-origin-id")
            .unwrap_or_default()
            .to_owned();
        *counts.entry(origin).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sluice_groups_and_a_plain_group_each_see_each_entry_once() {
    const N: usize = 200;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "fan";
    // Another service's group, made before anything is added.
    create_group(&mut conn, stream, "plain", "0").await;
    let config = TestConfig::of(member_of(stream, "probe")).and(member_of(stream, "audit"));
    let host = start_fixture(&redis, config).await;
    let mut added = HashSet::new();
    for _ in 0..N {
        added.insert(add(&mut conn, stream, &twice_then_dead()).await);
    }
    for group in ["probe", "audit"] {
        let key = sluice_descriptor::default_dead_letter(stream, group);
        wait_dead_letters_in(&conn, &key, N).await;
    }
    // Every group's final outcome once per entry, in its own dead-letter stream.
    for group in ["probe", "audit"] {
        let key = sluice_descriptor::default_dead_letter(stream, group);
        let origins = dead_origins(&mut conn, &key).await;
        assert_eq!(origins.len(), N, "{group}: one dead letter per entry");
        assert!(origins.values().all(|&n| n == 1), "{group}: {origins:?}");
        assert_eq!(
            origins.keys().cloned().collect::<HashSet<_>>(),
            added,
            "{group}: the producer's entries"
        );
        for (_, fields) in entries(&mut conn, &key).await {
            assert_eq!(field(&fields, "sluice-origin-group"), Some(group));
            assert_eq!(field(&fields, "sluice-retry-count"), Some("2"));
        }
        assert_eq!(pending(&mut conn, stream, group).await, 0);
        assert_eq!(
            parked(&mut conn, &format!("{stream}.{group}.delayed")).await,
            0
        );
    }
    // The other service read exactly what the producer wrote: no retry copy reached it.
    let plain: HashSet<String> = read_plain(&mut conn, stream).await.into_iter().collect();
    assert_eq!(
        plain, added,
        "the plain group reads the producer's entries only"
    );
    let length: usize = cmd(&mut conn, &["XLEN", stream]).await;
    assert_eq!(length, N, "no copy was ever added to the stream");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_tail_is_not_trusted() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // Two subscriptions: one sends retries to the stream's tail, one to its lane.
    let tail = member_of("replay-tail", "g").set("retry_lane", false);
    let lane = member_of("replay-lane", "g");
    let mut host = start_fixture(&redis, TestConfig::of(tail).and(lane)).await;
    let mut copies = HashMap::new();
    for stream in ["replay-tail", "replay-lane"] {
        let real = add(&mut conn, stream, &Control::Retry { ms: 50, times: 1 }).await;
        let back = host
            .event(T, "the real retry's ack", |e| {
                e.origin_id == real && e.kind == EventKind::Acked
            })
            .await;
        assert_eq!(back.retry_count, 1);
        let source = if stream == "replay-tail" {
            stream.to_owned()
        } else {
            format!("{stream}.g.delayed.lane")
        };
        let (_, copy) = entries(&mut conn, &source)
            .await
            .into_iter()
            .find(|(id, _)| *id == back.id)
            .expect("the copy");
        copies.insert(stream, (real, copy));
    }
    // A producer appends the tail copy's bookkeeping to an entry of its own: other fields, so
    // the seal over the fields does not verify, and the entry is its own.
    let (victim, copy) = &copies["replay-tail"];
    let tail_names = [
        "sluice-retry-count",
        "sluice-origin-id",
        "sluice-due-ms",
        "sluice-origin-group",
        "sluice-mark",
    ];
    let mut forged = redis::cmd("XADD");
    forged
        .arg("replay-tail")
        .arg("*")
        .arg("payload")
        .arg(Control::Ack.to_string())
        .arg("note")
        .arg("someone else's entry");
    for name in tail_names {
        forged.arg(name).arg(field(copy, name).expect(name));
    }
    let forged: String = forged.query_async(&mut conn).await.unwrap();
    let event = host.event(T, "the forged entry", |e| e.id == forged).await;
    assert_eq!(event.kind, EventKind::Acked);
    assert_eq!(
        event.retry_count, 0,
        "the copied retry count is not trusted"
    );
    assert_eq!(
        &event.origin_id, &forged,
        "nor the victim's origin id {victim}"
    );

    // A lane copy (the whole member, sealed) appended to the stream by a producer: a lane copy
    // is trusted only in the lane, so this is the producer's own entry (which the handler
    // cannot decode: it has no payload field).
    let (victim, copy) = &copies["replay-lane"];
    let mut onto_stream = redis::cmd("XADD");
    onto_stream.arg("replay-lane").arg("*");
    for (name, value) in copy {
        onto_stream.arg(name).arg(value);
    }
    let replayed: String = onto_stream.query_async(&mut conn).await.unwrap();
    let event = host
        .event(T, "the replayed lane copy", |e| e.id == replayed)
        .await;
    assert!(
        matches!(event.kind, EventKind::DeadLettered { .. }),
        "{event:?}"
    );
    assert_eq!(
        &event.origin_id, &replayed,
        "not the victim's origin {victim}"
    );
    assert_eq!(event.retry_count, 0);

    // The earlier release's mark (stream, origin, count and due time only) appended to a new
    // entry: trusted only on entries that were in the stream before this release first used
    // it (none here), even with an explicit id below everything.
    let secret = Secret::load(&mut conn, "replay-tail", &["replay-tail"])
        .await
        .unwrap()
        .unwrap();
    let legacy = secret.legacy_mark("replay-tail", victim, "5", "1000");
    let mut old_form = redis::cmd("XADD");
    old_form
        .arg("replay-tail")
        .arg("*")
        .arg("payload")
        .arg(Control::Ack.to_string())
        .arg("sluice-retry-count")
        .arg("5")
        .arg("sluice-origin-id")
        .arg(victim)
        .arg("sluice-due-ms")
        .arg("1000")
        .arg("sluice-mark")
        .arg(&legacy);
    let old: String = old_form.query_async(&mut conn).await.unwrap();
    let event = host
        .event(T, "the entry with an old mark", |e| e.id == old)
        .await;
    assert_eq!(event.kind, EventKind::Acked);
    assert_eq!(
        event.retry_count, 0,
        "an old mark on a new entry is not trusted"
    );
    assert_eq!(event.origin_id, old);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_retries_are_refused_while_another_group_reads_the_stream() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    create_group(&mut conn, "shared-tail", "plain", "0").await;
    let tail = || member_of("shared-tail", "g").set("retry_lane", false);
    // Refused at start, naming the other group and both ways out.
    let mut refused = HostProcess::run(&redis, tail());
    let status = refused.wait_exit().await;
    assert!(!status.success());
    let log = refused.log_text();
    assert!(
        log.contains("stream `shared-tail` is read by other consumer groups (plain) besides `g`")
            && log.contains("other_groups_see_retries = true"),
        "{log}"
    );
    // Refused at load when the config itself has another group on the stream.
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(tail())
        .and(member_of("shared-tail", "audit"))
        .to_string();
    write_config(dir.path(), "sluice.toml", &config);
    let (ok, _, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(!ok, "check passed");
    assert!(
        stderr.contains("stream `shared-tail` is read by groups `g` and `audit`"),
        "{stderr}"
    );
    // `sluice check` says where retries go.
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(tail().set("other_groups_see_retries", true)).to_string();
    write_config(dir.path(), "sluice.toml", &config);
    let (ok, stdout, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("go back to the stream's tail, where other groups read them too"),
        "{stdout}"
    );
    assert!(stdout.contains("warning"), "{stdout}");
    // With the flag it runs and says what it costs; the plain group reads the copy.
    let mut host = start_fixture(&redis, tail().set("other_groups_see_retries", true)).await;
    let id = add(
        &mut conn,
        "shared-tail",
        &Control::Retry { ms: 50, times: 1 },
    )
    .await;
    host.event(T, "the retry acked", |e| {
        e.origin_id == id && e.kind == EventKind::Acked
    })
    .await;
    let plain = read_plain(&mut conn, "shared-tail").await;
    assert_eq!(plain.len(), 2, "the entry and its retry copy: {plain:?}");
    // The page says it too.
    let admin = host.admin().await;
    let session = log_in(admin).await;
    let (code, _, page) = http_exchange(admin, "GET", "/ui/", &session.headers(), b"").await;
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("Warning: retry_lane = false with other_groups_see_retries"),
        "{page}"
    );
    host.stop().await.unwrap();

    // A group that appears while the host runs: due retries are held in the set (not lost, not
    // copied), readiness says why; once it is gone they come back.
    let mut host = start_fixture(&redis, member_of("later", "g").set("retry_lane", false)).await;
    let id = add(&mut conn, "later", &Control::Retry { ms: 300, times: 1 }).await;
    host.event(T, "the retry parked", |e| {
        e.origin_id == id && matches!(e.kind, EventKind::Parked { .. })
    })
    .await;
    create_group(&mut conn, "later", "newcomer", "$").await;
    let admin = host.admin().await;
    let why = wait_for(T, "readiness to name the held retries", || async move {
        let (code, body) = http_get(admin, "/readyz").await;
        (code == 503 && body.contains("held")).then_some(body)
    })
    .await;
    assert!(why.contains("`newcomer`"), "{why}");
    assert_eq!(
        parked(&mut conn, "later.g.delayed").await,
        1,
        "held, not lost"
    );
    let length: usize = cmd(&mut conn, &["XLEN", "later"]).await;
    assert_eq!(length, 1, "nothing copied to the stream");
    let _: u64 = cmd(&mut conn, &["XGROUP", "DESTROY", "later", "newcomer"]).await;
    let back = host
        .event(T, "the held retry, once the other group is gone", |e| {
            e.origin_id == id && e.kind == EventKind::Acked
        })
        .await;
    assert_eq!(back.retry_count, 1);
    wait_for(T, "readiness back", || async move {
        (http_get(admin, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_flag_each_group_skips_the_others_copies() {
    const N: usize = 50;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let stream = "skip";
    let sub = |group: &str| {
        member_of(stream, group)
            .set("retry_lane", false)
            .set("other_groups_see_retries", true)
    };
    let mut host = start_fixture(&redis, TestConfig::of(sub("a")).and(sub("b"))).await;
    let mut added = HashSet::new();
    for _ in 0..N {
        added.insert(add(&mut conn, stream, &Control::Retry { ms: 50, times: 1 }).await);
    }
    // Each group acks each entry once, after its own retry; each skips the other's copy.
    let mut acked: HashMap<(String, String), u32> = HashMap::new();
    let mut skipped = 0;
    while acked.len() < 2 * N || skipped < 2 * N {
        let event = host.event(T, "every ack and skip", |_| true).await;
        match &event.kind {
            EventKind::Acked => {
                assert_eq!(event.retry_count, 1, "{event:?}");
                *acked
                    .entry((event.group.to_string(), event.origin_id.clone()))
                    .or_default() += 1;
            }
            EventKind::OtherGroupsRetry { group } => {
                assert_ne!(group.as_str(), &*event.group);
                skipped += 1;
            }
            EventKind::Parked { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(acked.values().all(|&n| n == 1), "{acked:?}");
    for group in ["a", "b"] {
        let origins: HashSet<String> = acked
            .keys()
            .filter(|(g, _)| g == group)
            .map(|(_, o)| o.clone())
            .collect();
        assert_eq!(origins, added, "{group}");
    }
    assert_eq!(skipped, 2 * N, "each copy skipped once, by the other group");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_set_key_is_refused_in_a_config_and_across_hosts() {
    let redis = Redis::start();
    // In one config: two groups of one stream naming one delayed set.
    let dir = tempfile::tempdir().unwrap();
    let shared = |group: &str| member_of("keys", group).delayed("keys.delayed");
    let config = TestConfig::of(shared("a")).and(shared("b")).to_string();
    write_config(dir.path(), "sluice.toml", &config);
    let (ok, _, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(!ok, "check passed");
    assert!(
        stderr.contains(
            "`keys.delayed` would be the delayed-retry set of stream `keys` group `b` and the delayed-retry set of stream `keys` group `a`"
        ),
        "{stderr}"
    );
    // A dead-letter stream shared by two streams' subscriptions, likewise.
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(Sub::fixture("one").set("dead_letter", "all.dead"))
        .and(Sub::fixture("two").set("dead_letter", "all.dead"))
        .to_string();
    write_config(dir.path(), "sluice.toml", &config);
    let (ok, _, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(!ok, "check passed");
    assert!(
        stderr.contains("`all.dead` would be the dead-letter stream"),
        "{stderr}"
    );
    // Across hosts: the first claims the key in Redis, the second is refused at start naming
    // both, and the first keeps running.
    let first = start_fixture(&redis, shared("a")).await;
    let mut second = HostProcess::run(&redis, shared("b"));
    let status = second.wait_exit().await;
    assert!(!status.success());
    let log = second.log_text();
    assert!(
        log.contains(
            "`keys.delayed` is the delayed-retry set of stream `keys` group `a`, and this subscription (stream `keys` group `b`) would use it as its delayed-retry set"
        ) && log.contains("DEL sluice-claim:keys.delayed"),
        "{log}"
    );
    // A stream is claimed too: no subscription may dead-letter into a stream others read...
    let mut into_stream =
        HostProcess::run(&redis, Sub::fixture("elsewhere").set("dead_letter", "keys"));
    assert!(!into_stream.wait_exit().await.success());
    let log = into_stream.log_text();
    assert!(
        log.contains("`keys` is the stream of the subscriptions to stream `keys`"),
        "{log}"
    );
    // ... nor read another's set or lane as its stream; reading another's dead letters as a
    // stream is fine (a subscription that handles dead letters).
    let mut reads_lane = HostProcess::run(
        &redis,
        Sub::fixture("keys.delayed.lane").set("group", "spy"),
    );
    assert!(!reads_lane.wait_exit().await.success());
    assert!(
        reads_lane
            .log_text()
            .contains("`keys.delayed.lane` is the retry lane of stream `keys` group `a`"),
        "{}",
        reads_lane.log_text()
    );
    let dead_letter_reader = start_fixture(
        &redis,
        Sub::fixture(&sluice_descriptor::default_dead_letter("keys", "a")).set("group", "dlq"),
    )
    .await;
    dead_letter_reader.stop().await.unwrap();
    // Another host of the first subscription shares its keys.
    let mut conn = redis.conn().await;
    let same = start_fixture(&redis, shared("a").set("consumer", "a-2")).await;
    let id = add(&mut conn, "keys", &Control::Retry { ms: 50, times: 1 }).await;
    let _ = id;
    same.stop().await.unwrap();
    first.stop().await.unwrap();
    // A claim is a lease: a day after its subscription's last claim (renewed every hour while
    // it runs) it lapses, and the key is free; here it is made to lapse at once.
    let claim = "sluice-claim:keys.delayed";
    let ttl: i64 = cmd(&mut conn, &["PTTL", claim]).await;
    assert!(
        ttl > 0 && ttl <= 86_400_000,
        "the claim has a lease of at most a day: {ttl}"
    );
    let _: i64 = cmd(&mut conn, &["PEXPIRE", claim, "1"]).await;
    wait_for(T, "the claim lapsed", || {
        let mut conn = conn.clone();
        async move { (cmd::<i64>(&mut conn, &["EXISTS", claim]).await == 0).then_some(()) }
    })
    .await;
    let taker = start_fixture(&redis, Sub::fixture("keys.delayed").set("group", "spy")).await;
    taker.stop().await.unwrap();
}

/// A subscription that names another's stream as its dead-letter stream, started first, does
/// not make that stream a feed of its dead letters: the stream's own subscription is refused,
/// naming it (before, reading a dead-letter stream as a stream was let through whatever its
/// name, so a tenant could inject entries into another's stream). Under its owner's default
/// name a dead-letter stream is still read as a stream (see the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_stream_named_after_another_stream_feeds_nothing() {
    let redis = Redis::start();
    let squatter = start_fixture(&redis, Sub::fixture("inj").set("dead_letter", "victim")).await;
    let mut victim = HostProcess::run(&redis, Sub::fixture("victim"));
    assert!(!victim.wait_exit().await.success());
    let log = victim.log_text();
    assert!(
        log.contains("`victim` is the dead-letter stream of stream `inj` group `g`"),
        "{log}"
    );
    squatter.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_member_is_dead_lettered_not_delivered() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, member_of("owned", "g")).await;
    // A member another subscription parked, put into this one's set (by hand, or by a set an
    // earlier release let two subscriptions share).
    let fields = vec![(b"payload".to_vec(), Control::Ack.to_string().into_bytes())];
    let foreign = member::NewMember {
        entry_id: "5-0",
        retry_count: 1,
        fields: &fields,
        origin_id: "5-0",
        stream: "elsewhere",
        group: "other",
    }
    .encode();
    let _: i64 = redis::cmd("ZADD")
        .arg("owned.g.delayed")
        .arg(0)
        .arg(&foreign)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A real retry makes a sweep pass run.
    let id = add(&mut conn, "owned", &Control::Retry { ms: 20, times: 1 }).await;
    host.event(T, "the real retry", |e| {
        e.origin_id == id && e.kind == EventKind::Acked
    })
    .await;
    let dead = wait_dead_letters(&conn, "owned", 1).await;
    let (_, letter) = &dead[0];
    let reason = field(letter, "sluice-reason").unwrap();
    assert!(
        reason.contains("parked by stream `elsewhere` group `other`")
            && reason.contains("stream `owned` group `g`"),
        "{reason}"
    );
    assert_eq!(parked(&mut conn, "owned.g.delayed").await, 0);
    // Shown to the operator; requeueable, as an entry of its own (its origin is not vouched
    // for).
    let keys = sluice_host::store::keys::SubscriptionKeys::new(
        "owned",
        "g",
        &dead_letter_key("owned"),
        Some("owned.g.delayed"),
    );
    let page =
        sluice_host::control::operate::dead_letters::list(&mut conn, &keys, None, 10, None, 1)
            .await
            .unwrap();
    assert_eq!(page.items.len(), 1);
    let letter = &page.items[0];
    assert!(
        letter.not_requeueable.is_none() && !letter.trusted,
        "{letter:?}"
    );
    // Nothing but the real entry reached the handler.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), host.events.recv())
            .await
            .is_err(),
        "no other delivery"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_dead_letter_is_not_requeued_with_its_origin() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let mut host = start_fixture(&redis, member_of("sealed", "g")).await;
    // A real dead letter, sealed by the host.
    let report = Control::Report { key: "none".into() };
    let real = add(&mut conn, "sealed", &report).await;
    let dead = wait_dead_letters(&conn, "sealed", 1).await;
    assert!(field(&dead[0].1, "sluice-mark").is_some(), "{dead:?}");
    // Forged ones naming this subscription and the real entry's origin id (the idempotency
    // key): with a made-up seal, and in the earlier release's unsealed form (trusted only on
    // entries that were there before this release first used the stream: none here).
    let forge = |stream: &str, id: &str, mark: Option<String>| {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(dead_letter_key(stream)).arg(id);
        for (name, value) in [
            ("payload", report.to_string()),
            ("sluice-reason", "forged".to_owned()),
            ("sluice-origin-stream", stream.to_owned()),
            ("sluice-origin-group", "g".to_owned()),
            ("sluice-origin-id", real.clone()),
            ("sluice-entry-id", real.clone()),
            ("sluice-retry-count", "0".to_owned()),
            ("sluice-delivery-count", "1".to_owned()),
        ] {
            xadd.arg(name).arg(value);
        }
        if let Some(mark) = mark {
            xadd.arg("sluice-mark").arg(mark);
        }
        xadd
    };
    let made_up: String = forge("sealed", "*", Some("0".repeat(40)))
        .query_async(&mut conn)
        .await
        .unwrap();
    let unsealed: String = forge("sealed", "*", None)
        .query_async(&mut conn)
        .await
        .unwrap();
    let keys = sluice_host::store::keys::SubscriptionKeys::new(
        "sealed",
        "g",
        &dead_letter_key("sealed"),
        Some("sealed.g.delayed"),
    )
    .with_retry_lane(true);
    use sluice_host::control::operate::dead_letters;
    for (id, trusted) in [(&dead[0].0, true), (&made_up, false), (&unsealed, false)] {
        let letter = dead_letters::get(&mut conn, &keys, id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(letter.trusted, trusted, "{letter:?}");
        let dead_letters::Requeued::To(new) =
            dead_letters::requeue(&mut conn, &keys, &letter, false)
                .await
                .unwrap()
        else {
            panic!("gone");
        };
        // The requeued copy is handled again (Report dead-letters with what it saw).
        let event = host.event(T, "the requeued copy", |e| e.id == new).await;
        let origin = if trusted { real.as_str() } else { new.as_str() };
        assert_eq!(event.origin_id, origin, "trusted: {trusted}");
        assert_eq!(event.retry_count, 0);
    }
    host.stop().await.unwrap();
    // A dead-letter stream that did not exist when this release first used it: an unsealed
    // dead letter written there with an explicit id below everything is not trusted either.
    let other = member_of("virgin", "g");
    let mut host = start_fixture(&redis, other).await;
    let first = add(&mut conn, "virgin", &Control::Ack).await;
    host.event(T, "the host reading", |e| e.id == first).await;
    let old_id: String = forge("virgin", "1-1", None)
        .query_async(&mut conn)
        .await
        .unwrap();
    let keys = sluice_host::store::keys::SubscriptionKeys::new(
        "virgin",
        "g",
        &dead_letter_key("virgin"),
        Some("virgin.g.delayed"),
    );
    let letter = dead_letters::get(&mut conn, &keys, &old_id)
        .await
        .unwrap()
        .unwrap();
    assert!(letter.ours && !letter.trusted, "{letter:?}");
    host.stop().await.unwrap();
}

/// Redis's `used_memory`.
async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let info: String = cmd(conn, &["INFO", "memory"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_retrying_at_once_for_ever_keeps_redis_memory_flat() {
    // No AOF: a thousand parks of 100 KB a second would write gigabytes to disk.
    let redis = Redis::start_with(false, &[]);
    let mut conn = redis.conn().await;
    // The operator allows a million attempts; the handler asks to retry at once every time.
    let sub = member_of("spin", "g").set("max_retries", 1_000_000u32);
    let mut host = start_fixture(&redis, sub).await;
    let pad = "x".repeat(100 * 1024);
    let retry = Control::Retry {
        ms: 0,
        times: u64::MAX,
    };
    let id: String = redis::cmd("XADD")
        .arg("spin")
        .arg("*")
        .arg("payload")
        .arg(retry.to_string())
        .arg("pad")
        .arg(&pad)
        .query_async(&mut conn)
        .await
        .unwrap();
    let parks_after = |n: u32| {
        let id = id.clone();
        move |e: &sluice_host::Event| {
            e.origin_id == id && matches!(e.kind, EventKind::Parked { .. }) && e.retry_count >= n
        }
    };
    let first = host.event(T, "the first parks", parks_after(20)).await;
    let baseline = used_memory(&mut conn).await;
    let mut highest = baseline;
    let started = std::time::Instant::now();
    let mut last = first.retry_count;
    while started.elapsed() < Duration::from_secs(10) {
        let event = host.event(T, "more parks", parks_after(last + 1)).await;
        last = event.retry_count;
        highest = highest.max(used_memory(&mut conn).await);
    }
    let lane_length: usize = cmd(&mut conn, &["XLEN", "spin.g.delayed.lane"]).await;
    let stream_length: usize = cmd(&mut conn, &["XLEN", "spin"]).await;
    println!(
        "{} attempts in 10 s; used_memory {baseline} -> at most {highest}; lane {lane_length}",
        last - first.retry_count
    );
    assert!(last - first.retry_count > 100, "the entry kept retrying");
    assert!(
        highest - baseline < 4 * 1024 * 1024,
        "Redis grew by {} bytes",
        highest - baseline
    );
    assert!(
        lane_length <= 3,
        "acknowledged copies are trimmed: {lane_length}"
    );
    assert_eq!(stream_length, 1, "no copy on the stream");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_components_max_retries_is_capped_unless_the_config_sets_it() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // The v2 build asks for max_retries(u32::MAX).
    let capped = Sub::new("{fixture_v2}", "capped").delayed("capped.delayed");
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        "sluice.toml",
        &TestConfig::of(capped.clone()).to_string(),
    );
    let (ok, stdout, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("max 100; each waits at least 1ms")
            && stdout.contains("the component asks for max_retries 4294967295; a component's own value is capped at 100"),
        "{stdout}"
    );
    let mut host = start_fixture(&redis, capped).await;
    let id = add(
        &mut conn,
        "capped",
        &Control::Retry {
            ms: 0,
            times: u64::MAX,
        },
    )
    .await;
    let event = host
        .event(T, "the dead letter", |e| {
            e.origin_id == id && matches!(e.kind, EventKind::DeadLettered { .. })
        })
        .await;
    let EventKind::DeadLettered { reason } = &event.kind else {
        unreachable!()
    };
    assert!(
        reason.contains("max_retries (100) exhausted after 101 attempts"),
        "{reason}"
    );
    host.stop().await.unwrap();
    // The operator's own value is not capped.
    let dir = tempfile::tempdir().unwrap();
    let config = TestConfig::of(
        Sub::new("{fixture_v2}", "capped")
            .delayed("capped.delayed")
            .set("max_retries", 5000u32),
    );
    write_config(dir.path(), "sluice.toml", &config.to_string());
    let (ok, stdout, stderr) = run_sluice(&["check", "sluice.toml"], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("max 5000;") && !stdout.contains("capped at 100"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_entries_park_and_come_back_with_retry_count_one() {
    const FIELDS: usize = 5_000;
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let tail = member_of("wide-tail", "g").set("retry_lane", false);
    let mut host = start_fixture(&redis, TestConfig::of(member_of("wide", "g")).and(tail)).await;
    let control = Control::Attempts {
        each: vec![
            Control::Retry { ms: 50, times: 9 },
            Control::Report { key: "none".into() },
        ],
    };
    for stream in ["wide", "wide-tail"] {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(stream)
            .arg("*")
            .arg("payload")
            .arg(control.to_string());
        for i in 0..FIELDS {
            xadd.arg(format!("f{i}")).arg(i.to_string());
        }
        let id: String = xadd.query_async(&mut conn).await.unwrap();
        let event = host
            .event(T, "the wide entry's report", |e| {
                e.origin_id == id && matches!(e.kind, EventKind::DeadLettered { .. })
            })
            .await;
        let EventKind::DeadLettered { reason } = &event.kind else {
            unreachable!()
        };
        assert_eq!(
            event.retry_count, 1,
            "{stream}: parked once, the delay kept"
        );
        assert!(
            reason.contains("retry_count=1 delivery_count=1"),
            "{stream}: {reason}"
        );
        // The reason is cut at 4 KiB; the count and the last name say the whole came back.
        assert!(
            reason.contains(&format!("field_count={} last_field=f4999 ", FIELDS + 1)),
            "{stream}: every field came back: {reason:.300}"
        );
    }
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_field_named_like_packed_fields_stays_the_producers() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    // The producer's only field is called `sluice-packed-fields`, as the tail copy of a wide
    // entry calls its packed fields: it must come back as it is, with its bookkeeping trusted.
    let sub = member_of("named", "g")
        .set("retry_lane", false)
        .set("payload_field", "sluice-packed-fields");
    let mut host = start_fixture(&redis, sub).await;
    let control = Control::Attempts {
        each: vec![
            Control::Retry { ms: 50, times: 9 },
            Control::Report { key: "none".into() },
        ],
    };
    let id: String = cmd(
        &mut conn,
        &[
            "XADD",
            "named",
            "*",
            "sluice-packed-fields",
            &control.to_string(),
        ],
    )
    .await;
    let event = host
        .event(T, "the report", |e| {
            e.origin_id == id && matches!(e.kind, EventKind::DeadLettered { .. })
        })
        .await;
    let EventKind::DeadLettered { reason } = &event.kind else {
        unreachable!()
    };
    assert_eq!(event.retry_count, 1, "{reason}");
    assert!(reason.ends_with("fields=sluice-packed-fields"), "{reason}");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_legacy_record_is_named_and_the_secret_never_printed() {
    let redis = Redis::start();
    let mut conn = redis.conn().await;
    let _: () = cmd(
        &mut conn,
        &["SET", "sluice-secret:{broken}", "do-not-print-me"],
    )
    .await;
    let record = sluice_host::store::keys::legacy_marks_key("broken");
    let _: () = cmd(&mut conn, &["SET", &record, "not a hash"]).await;
    let mut host = HostProcess::run(&redis, member_of("broken", "g"));
    assert!(!host.wait_exit().await.success());
    let log = host.log_text();
    assert!(
        log.contains(
            "cannot read or create the secret of stream `broken` (`sluice-secret:{broken}`)"
        ),
        "{log}"
    );
    assert!(!log.contains("do-not-print-me"), "{log}");
}
