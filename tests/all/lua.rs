//! Every Lua script the host runs (`host/src/**/lua/*.lua`), alone against a throwaway
//! `redis-server`, with crafted keys: the normal case, and what another writer, a crash or a
//! stranger may leave at its keys (a key of another type, a missing group or stream, a member
//! of another subscription, stream ids above 2^53, an unreadable options map). Each script is
//! loaded as the host loads it: the text the build script wrote to `$OUT_DIR/lua/`, its
//! `-- @include lib/NAME` lines expanded.
//!
//! The helpers of `store/lua/lib/` run inside the scripts that include them: `ids` (exact id
//! comparison) in trim and sweep, `seal` in sweep, requeue, dead_letter_now and
//! dead_letter_in_place (each seal checked against the host's own `Secret::verify`), `member`
//! in sweep and dead_letter_now, `pending`, `history` and `dead_letter_write` in park,
//! dead_letter and dead_letter_in_place, `journal` in the three breaker scripts, `order` in
//! the ordered keys' read, take, hold, ack, forget, release and unorder scripts (and
//! dead_letter), `entry_key` in the ordered keys' read.
//!
//! What a script does wrong on a hostile input is asserted as it is today, where that is safe
//! (nothing lost, nothing doubled), and marked "Finding:".

use std::sync::LazyLock;

use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, RedisResult, Script, Value};
use rmpv::Value as Mp;
use sluice_host::entry::member::{self, NewMember};
use sluice_host::store::keys::{self, Seal, Secret};

use crate::common::*;

/// A script as the host loads it (`crate::store::lua!` in the host): the build script's
/// expanded text.
macro_rules! lua {
    ($path:literal) => {
        LazyLock::new(|| Script::new(include_str!(concat!(env!("OUT_DIR"), "/lua/", $path))))
    };
}

static OLDEST: LazyLock<Script> = lua!("store/lua/oldest.lua");
static TIPS: LazyLock<Script> = lua!("store/doorbell/lua/tips.lua");
static EARLIEST: LazyLock<Script> = lua!("store/doorbell/lua/earliest.lua");
static UNSEEN: LazyLock<Script> = lua!("store/doorbell/lua/unseen.lua");
static CLAIM: LazyLock<Script> = lua!("store/keys/lua/claim.lua");
static SECRET: LazyLock<Script> = lua!("store/keys/lua/secret.lua");
static READ_FIELDS: LazyLock<Script> = lua!("pipeline/admit/lua/read_fields.lua");
static READ_MANY: LazyLock<Script> = lua!("pipeline/admit/lua/read_many.lua");
static LEASE: LazyLock<Script> = lua!("control/operate/lua/lease.lua");
static READ_JOURNAL: LazyLock<Script> = lua!("pipeline/admit/lua/read_journal.lua");
static READ_HISTORY: LazyLock<Script> = lua!("entry/lua/read_history.lua");
static BUMP: LazyLock<Script> = lua!("pipeline/admit/lua/bump.lua");
static TAKE_TOKENS: LazyLock<Script> = lua!("pipeline/admit/lua/take_tokens.lua");
static BREAKER_RECORD: LazyLock<Script> = lua!("pipeline/admit/lua/breaker_record.lua");
static BREAKER_PROBE: LazyLock<Script> = lua!("pipeline/admit/lua/breaker_probe.lua");
static BREAKER_RESULT: LazyLock<Script> = lua!("pipeline/admit/lua/breaker_result.lua");
static CANARY_START: LazyLock<Script> = lua!("control/rollout/lua/canary_start.lua");
static CANARY_REPORT: LazyLock<Script> = lua!("control/rollout/lua/canary_report.lua");
static CANARY_VERDICT: LazyLock<Script> = lua!("control/rollout/lua/canary_verdict.lua");
static VIEW_RANGE: LazyLock<Script> = lua!("control/operate/lua/view_range.lua");
static RETRY_NOW: LazyLock<Script> = lua!("control/operate/lua/retry_now.lua");
static DEDUPE_DUPLICATES: LazyLock<Script> = lua!("pipeline/dedupe/lua/duplicates.lua");
static SCHEDULE: LazyLock<Script> = lua!("control/operate/lua/schedule.lua");
static FIRE: LazyLock<Script> = lua!("control/schedules/lua/fire.lua");
static MOVE_DEAD_LETTER: LazyLock<Script> = lua!("control/operate/lua/move_dead_letter.lua");
static REQUEUE: LazyLock<Script> = lua!("control/operate/lua/requeue.lua");
static DEAD_LETTER_NOW: LazyLock<Script> = lua!("control/operate/lua/dead_letter_now.lua");
static TRIM: LazyLock<Script> = lua!("control/retention/lua/trim.lua");
static FORGET_GONE: LazyLock<Script> = lua!("pipeline/read/lua/forget_gone.lua");
static PARK: LazyLock<Script> = lua!("pipeline/delayed/lua/park.lua");
static SWEEP: LazyLock<Script> = lua!("pipeline/delayed/lua/sweep.lua");
static ORDER_READ: LazyLock<Script> = lua!("pipeline/order/lua/read.lua");
static ORDER_TAKE: LazyLock<Script> = lua!("pipeline/order/lua/take.lua");
static ORDER_HOLD: LazyLock<Script> = lua!("pipeline/order/lua/hold.lua");
static ORDER_ACK: LazyLock<Script> = lua!("pipeline/order/lua/ack.lua");
static ORDER_FORGET: LazyLock<Script> = lua!("pipeline/order/lua/forget.lua");
static ORDER_RELEASE: LazyLock<Script> = lua!("pipeline/order/lua/release.lua");
static ORDER_UNORDER: LazyLock<Script> = lua!("pipeline/order/lua/unorder.lua");
static DEAD_LETTER: LazyLock<Script> = lua!("pipeline/settle/lua/dead_letter.lua");
static DEAD_LETTER_IN_PLACE: LazyLock<Script> =
    lua!("pipeline/settle/lua/dead_letter_in_place.lua");

/// Stream ids past what a Lua number (a double) holds exactly: 2^53 + 1, and the largest
/// millisecond part there is.
const ABOVE_2_53: &str = "9007199254740993-5";
const LARGEST_MS: &str = "18446744073709551615-0";
/// The last id a stream can have: there is none after it.
const LAST_ID: &str = "18446744073709551615-18446744073709551615";

/// The secret the scripts seal with here, as the host holds it.
const SECRET_VALUE: &str = "lua-test-secret";

fn secret() -> Secret {
    Secret::from_value(SECRET_VALUE)
}

/// One argument of a script, as bytes.
trait Arg {
    fn bytes(&self) -> Vec<u8>;
}

impl Arg for &str {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl Arg for String {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl Arg for Vec<u8> {
    fn bytes(&self) -> Vec<u8> {
        self.clone()
    }
}

impl Arg for i64 {
    fn bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl Arg for i32 {
    fn bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl Arg for f64 {
    fn bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

/// Run `script` with `keys` and `args`, as the host's `Script::key(..).arg(..)` calls do.
async fn eval<T: FromRedisValue>(
    conn: &mut MultiplexedConnection,
    script: &Script,
    keys: &[&str],
    args: &[&dyn Arg],
) -> RedisResult<T> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    for arg in args {
        invocation.arg(arg.bytes());
    }
    invocation.invoke_async(conn).await
}

/// The error a script answered, as text (panics when it answered without one).
fn error_of<T: std::fmt::Debug>(reply: RedisResult<T>) -> String {
    match reply {
        Ok(value) => panic!("expected an error reply, got {value:?}"),
        Err(err) => err.to_string(),
    }
}

/// A throwaway `redis-server`, one entry per stream node so that `XTRIM ... ~` trims exactly.
async fn redis() -> (Redis, MultiplexedConnection) {
    let redis = Redis::start_with(false, &[("stream-node-max-entries", "1")]);
    let conn = redis.conn().await;
    (redis, conn)
}

/// The server's clock, epoch ms.
async fn server_ms(conn: &mut MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = cmd(conn, &["TIME"]).await;
    s * 1000 + us / 1000
}

/// Send a command whose arguments may be bytes.
async fn raw<T: FromRedisValue>(conn: &mut MultiplexedConnection, words: &[&dyn Arg]) -> T {
    let mut c = redis::cmd(std::str::from_utf8(&words[0].bytes()).unwrap());
    for w in &words[1..] {
        c.arg(w.bytes());
    }
    c.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("command failed: {e}"))
}

/// A stream `stream` with entries at `ids` (field `payload`), read whole by consumer `c` of
/// group `g`: every entry pending.
async fn pending_entries(conn: &mut MultiplexedConnection, stream: &str, ids: &[&str]) {
    for id in ids {
        let _: String = cmd(conn, &["XADD", stream, id, "payload", &format!("p{id}")]).await;
    }
    create_group(conn, stream, "g", "0").await;
    read_as(conn, "c", stream, ">").await;
}

/// Fields as the host holds them.
fn fields(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// A member `park.lua` writes for stream `stream`, group `group`.
fn member_of(stream: &str, group: &str, id: &str, retry: u32) -> Vec<u8> {
    NewMember {
        entry_id: id,
        retry_count: retry,
        fields: &fields(&[("payload", "x")]),
        origin_id: id,
        stream,
        group,
    }
    .encode()
}

/// A member that reads as this subscription's (six items, its stream and group first) but
/// whose fields hold an array where a value should be: what no park writes.
fn member_with_nested_field(stream: &str, group: &str, id: &str) -> Vec<u8> {
    let value = Mp::Array(vec![
        Mp::from(stream),
        Mp::from(group),
        Mp::from(id),
        Mp::from(1),
        Mp::Array(vec![Mp::from("payload"), Mp::Array(vec![Mp::from("deep")])]),
        Mp::from(id),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    out
}

/// A MessagePack map of named options, as the host's `ScriptOptions` writes one.
fn options(items: Vec<(&str, Mp)>) -> Vec<u8> {
    let map = items.into_iter().map(|(k, v)| (Mp::from(k), v)).collect();
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &Mp::Map(map)).unwrap();
    out
}

/// A map of names (a script's field names or seal uses).
fn names(pairs: &[(&str, &str)]) -> Mp {
    Mp::Map(
        pairs
            .iter()
            .map(|(k, v)| (Mp::from(*k), Mp::from(*v)))
            .collect(),
    )
}

/// The sweep's options for stream `s`, group `g`, as `sweep_options` in
/// pipeline/delayed/mod.rs writes them.
fn sweep_options(past_other_groups: bool, ttl_ms: u64) -> Vec<u8> {
    options(vec![
        ("batch", Mp::from(128)),
        ("secret", Mp::from(SECRET_VALUE)),
        ("ttl_ms", Mp::from(ttl_ms)),
        ("max_fields", Mp::from(keys::SCRIPT_MAX_FIELDS as u64)),
        (
            "fields",
            names(&[
                ("retry_count", keys::RETRY_COUNT),
                ("origin_id", keys::ORIGIN_ID),
                ("due_ms", keys::DUE_MS),
                ("mark", keys::MARK),
                ("member", keys::MEMBER),
                ("reason", keys::REASON),
                ("origin_key", keys::ORIGIN_KEY),
                ("origin_stream", keys::ORIGIN_STREAM),
                ("origin_group", keys::ORIGIN_GROUP),
                ("packed_fields", keys::PACKED_FIELDS),
                ("parked", keys::PARKED),
            ]),
        ),
        // Decimal text, as the host sends it: 0 never trims.
        ("dead_letter_maxlen", Mp::from("0")),
        ("stream", Mp::from("s")),
        ("group", Mp::from("g")),
        ("past_other_groups", Mp::from(past_other_groups)),
        (
            "seals",
            names(&[
                ("lane", Seal::Lane.name()),
                ("tail", Seal::Tail.name()),
                ("member", Seal::Member.name()),
                ("tail_packed", Seal::TailPacked.name()),
            ]),
        ),
    ])
}

/// The value of field `name` in raw fields.
fn raw_field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

/// The text of a reply value.
fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Nil => "<nil>".to_owned(),
        other => format!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Reads only.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn oldest_answers_the_first_id_exactly_and_never_fields() {
    let (_redis, mut conn) = redis().await;
    let _: String = cmd(&mut conn, &["XADD", "s", ABOVE_2_53, "f", "v"]).await;
    let _: String = cmd(&mut conn, &["XADD", "s", LARGEST_MS, "f", "v"]).await;
    let oldest: Option<String> = eval(&mut conn, &OLDEST, &["s"], &[]).await.unwrap();
    assert_eq!(oldest.as_deref(), Some(ABOVE_2_53));

    let missing: Option<String> = eval(&mut conn, &OLDEST, &["none"], &[]).await.unwrap();
    assert_eq!(missing, None);
    let _: String = cmd(&mut conn, &["XADD", "emptied", "1-1", "f", "v"]).await;
    let _: i64 = cmd(&mut conn, &["XDEL", "emptied", "1-1"]).await;
    let empty: Option<String> = eval(&mut conn, &OLDEST, &["emptied"], &[]).await.unwrap();
    assert_eq!(empty, None);

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(eval::<Option<String>>(&mut conn, &OLDEST, &["text"], &[]).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

#[tokio::test]
async fn tips_answer_each_streams_last_id_and_mark_other_types() {
    let (_redis, mut conn) = redis().await;
    let _: String = cmd(&mut conn, &["XADD", "s", ABOVE_2_53, "f", "v"]).await;
    let _: String = cmd(&mut conn, &["XADD", "s", LARGEST_MS, "f", "v"]).await;
    let _: String = cmd(&mut conn, &["XADD", "emptied", "1-1", "f", "v"]).await;
    let _: i64 = cmd(&mut conn, &["XDEL", "emptied", "1-1"]).await;
    let _: i64 = cmd(&mut conn, &["HSET", "hash", "f", "v"]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let tips: Vec<String> = eval(
        &mut conn,
        &TIPS,
        &["s", "none", "emptied", "hash", "text"],
        &[],
    )
    .await
    .unwrap();
    assert_eq!(tips, [LARGEST_MS, "", "", "!", "!"]);
}

#[tokio::test]
async fn earliest_answers_each_sets_first_score() {
    let (_redis, mut conn) = redis().await;
    let _: i64 = cmd(&mut conn, &["ZADD", "set", "5", "a", "3", "b"]).await;
    let _: i64 = cmd(&mut conn, &["ZADD", "big", "1e300", "m"]).await;
    let earliest: Vec<String> = eval(&mut conn, &EARLIEST, &["set", "none", "big"], &[])
        .await
        .unwrap();
    let big: String = cmd(&mut conn, &["ZSCORE", "big", "m"]).await;
    assert_eq!(earliest, ["3".to_owned(), String::new(), big]);

    // Finding: one key of another type fails the whole call (tips.lua answers '!' for it),
    // and with it the polling doorbell's look at every delayed set it polls.
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(eval::<Vec<String>>(&mut conn, &EARLIEST, &["set", "text"], &[]).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

#[tokio::test]
async fn unseen_answers_the_last_id_of_streams_written_since() {
    let (_redis, mut conn) = redis().await;
    let _: String = cmd(&mut conn, &["XADD", "s", ABOVE_2_53, "f", "v"]).await;
    let _: String = cmd(&mut conn, &["XADD", "s", LARGEST_MS, "f", "v"]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let unseen: Vec<String> = eval(
        &mut conn,
        &UNSEEN,
        &["s", "s", "s", "none", "text", "s"],
        &[
            &"9007199254740993-4",
            &ABOVE_2_53,
            &LARGEST_MS,
            &"0-0",
            &"0-0",
            &"not-an-id",
        ],
    )
    .await
    .unwrap();
    // Seen one below an id above 2^53: that entry and the last came after; seen at the last
    // id: nothing did; a missing key, another type, an id that is none: ''.
    assert_eq!(unseen, [LARGEST_MS, LARGEST_MS, "", "", "", ""]);
}

#[tokio::test]
async fn read_fields_cuts_each_value() {
    let (_redis, mut conn) = redis().await;
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "a", "0123456789", "b", "xy"]).await;
    let values: Vec<Option<String>> =
        eval(&mut conn, &READ_FIELDS, &["flow"], &[&4, &"a", &"b", &"c"])
            .await
            .unwrap();
    assert_eq!(
        values,
        [Some("0123".to_owned()), Some("xy".to_owned()), None]
    );
    let missing: Vec<Option<String>> = eval(&mut conn, &READ_FIELDS, &["none"], &[&4, &"a"])
        .await
        .unwrap();
    assert_eq!(missing, [None]);

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(
        eval::<Vec<Option<String>>>(&mut conn, &READ_FIELDS, &["text"], &[&4, &"a"]).await,
    );
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

#[tokio::test]
async fn a_jobs_lease_is_renewed_or_let_go_only_by_its_holder() {
    let (_redis, mut conn) = redis().await;
    let _: () = cmd(&mut conn, &["SET", "lease", "job-b", "PX", "60000"]).await;
    let renew = |who: &'static str| (who, "renew", 120_000);
    for (who, mode, ms) in [renew("job-a"), ("job-a", "release", 0)] {
        let held: i64 = eval(&mut conn, &LEASE, &["lease"], &[&who, &mode, &ms])
            .await
            .unwrap();
        assert_eq!(held, 0, "{who} does not hold it ({mode})");
    }
    let ttl: i64 = cmd(&mut conn, &["PTTL", "lease"]).await;
    assert!(ttl <= 60_000, "not extended by another: {ttl}");
    let held: i64 = eval(
        &mut conn,
        &LEASE,
        &["lease"],
        &[&"job-b", &"renew", &120_000],
    )
    .await
    .unwrap();
    assert_eq!(held, 1);
    let ttl: i64 = cmd(&mut conn, &["PTTL", "lease"]).await;
    assert!(ttl > 60_000, "{ttl}");
    let held: i64 = eval(&mut conn, &LEASE, &["lease"], &[&"job-b", &"release", &0])
        .await
        .unwrap();
    assert_eq!(held, 1);
    let gone: i64 = cmd(&mut conn, &["EXISTS", "lease"]).await;
    assert_eq!(gone, 0);
}

#[tokio::test]
async fn read_many_reads_every_hash_cut_and_marks_one_of_another_type() {
    let (_redis, mut conn) = redis().await;
    let _: i64 = cmd(&mut conn, &["HSET", "f1", "a", "0123456789"]).await;
    let _: i64 = cmd(&mut conn, &["HSET", "f2", "b", "xy"]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let values: Vec<Option<Vec<Option<String>>>> = eval(
        &mut conn,
        &READ_MANY,
        &["f1", "text", "none", "f2"],
        &[&4, &"a", &"b"],
    )
    .await
    .unwrap();
    assert_eq!(
        values,
        [
            Some(vec![Some("0123".to_owned()), None]),
            None,
            Some(vec![None, None]),
            Some(vec![None, Some("xy".to_owned())]),
        ]
    );
}

#[tokio::test]
async fn read_journal_answers_the_newest_entries_bounded() {
    let (_redis, mut conn) = redis().await;
    for i in 0..5 {
        let what = format!("w{i}");
        let detail = "d".repeat(50);
        let _: String = cmd(
            &mut conn,
            &[
                "XADD", "journal", "*", "what", &what, "by", "me", "detail", &detail,
            ],
        )
        .await;
    }
    let entries: Vec<(String, Vec<String>)> =
        eval(&mut conn, &READ_JOURNAL, &["journal"], &[&2, &8])
            .await
            .unwrap();
    let fields: Vec<Vec<String>> = entries.into_iter().map(|(_, f)| f).collect();
    assert_eq!(
        fields,
        [
            ["what", "w4", "by", "me", "detail", "dddddddd"],
            ["what", "w3", "by", "me", "detail", "dddddddd"],
        ]
    );

    // Another program's entry of 20 fields: 8 of them come back.
    let mut wide = vec!["XADD".to_owned(), "wide".to_owned(), "*".to_owned()];
    for i in 0..20 {
        wide.push(format!("f{i}"));
        wide.push("v".to_owned());
    }
    let wide: Vec<&str> = wide.iter().map(String::as_str).collect();
    let _: String = cmd(&mut conn, &wide).await;
    let entries: Vec<(String, Vec<String>)> = eval(&mut conn, &READ_JOURNAL, &["wide"], &[&1, &8])
        .await
        .unwrap();
    assert_eq!(entries[0].1.len(), 16);

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    for key in ["text", "none"] {
        let none: Vec<(String, Vec<String>)> = eval(&mut conn, &READ_JOURNAL, &[key], &[&2, &8])
            .await
            .unwrap();
        assert!(none.is_empty(), "{key}: {none:?}");
    }
}

#[tokio::test]
async fn read_history_answers_the_newest_records_bounded() {
    let (_redis, mut conn) = redis().await;
    let _: i64 = cmd(
        &mut conn,
        &[
            "HSET",
            "histories",
            ABOVE_2_53,
            "{\"n\":1}\n{\"n\":2}\n{\"n\":3}",
        ],
    )
    .await;
    let records: Vec<String> = eval(
        &mut conn,
        &READ_HISTORY,
        &["histories", "legacy"],
        &[&ABOVE_2_53, &2, &64],
    )
    .await
    .unwrap();
    assert_eq!(records, ["{\"n\":2}", "{\"n\":3}"]);

    // The earlier release's list, read when the hash has none for the entry.
    let _: i64 = cmd(&mut conn, &["RPUSH", "legacy", "r1", "r2", "r3"]).await;
    let listed: Vec<String> = eval(
        &mut conn,
        &READ_HISTORY,
        &["histories", "legacy"],
        &[&LARGEST_MS, &2, &64],
    )
    .await
    .unwrap();
    assert_eq!(listed, ["r2", "r3"]);

    // Records longer than the cut: only the value's tail is looked at, so the older record
    // comes back as the end of one (no JSON: the reader drops it), the newest as its start.
    let _: i64 = cmd(
        &mut conn,
        &[
            "HSET",
            "histories",
            "1-1",
            "{\"a\":1}\n{\"b\":22222222}\n{\"c\":3}",
        ],
    )
    .await;
    let cut: Vec<String> = eval(
        &mut conn,
        &READ_HISTORY,
        &["histories", "legacy"],
        &[&"1-1", &2, &5],
    )
    .await
    .unwrap();
    assert_eq!(cut, ["222}", "{\"c\":"]);

    // Another program's huge value: bounded.
    let huge = "a".repeat(1_000_000);
    let _: i64 = cmd(&mut conn, &["HSET", "histories", "2-2", &huge]).await;
    let bounded: Vec<String> = eval(
        &mut conn,
        &READ_HISTORY,
        &["histories", "legacy"],
        &[&"2-2", &2, &5],
    )
    .await
    .unwrap();
    assert_eq!(bounded, ["aaaaa"]);

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let none: Vec<String> = eval(
        &mut conn,
        &READ_HISTORY,
        &["text", "text"],
        &[&"1-1", &2, &5],
    )
    .await
    .unwrap();
    assert!(none.is_empty(), "{none:?}");
}

#[tokio::test]
async fn view_range_cuts_values_and_counts_what_it_leaves_out() {
    let (_redis, mut conn) = redis().await;
    let long = "x".repeat(50);
    let _: String = cmd(
        &mut conn,
        &["XADD", "s", ABOVE_2_53, "a", &long, "sluice-reason", "why"],
    )
    .await;
    let mut wide = vec!["XADD".to_owned(), "s".to_owned(), LARGEST_MS.to_owned()];
    for i in 0..10 {
        wide.push(format!("f{i}"));
        wide.push("v".repeat(10));
    }
    wide.push("sluice-reason".to_owned());
    wide.push("kept".to_owned());
    let wide: Vec<&str> = wide.iter().map(String::as_str).collect();
    let _: String = cmd(&mut conn, &wide).await;

    let rows: Vec<(String, Vec<String>)> = eval(
        &mut conn,
        &VIEW_RANGE,
        &["s"],
        &[&"XRANGE", &"-", &"+", &10, &8, &100],
    )
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].0, ABOVE_2_53);
    assert_eq!(
        rows[0].1,
        [
            "a",
            "xxxxxxxx... [50 bytes in all, cut to 8 for display]",
            "sluice-r... [13 bytes in all, cut to 8 for display]",
            "why",
        ]
    );
    // Two fields fit in 100 bytes (each counts 8 + 8 + 64); the host's own field is shown
    // past the bound; the rest are counted.
    let cut = "vvvvvvvv... [10 bytes in all, cut to 8 for display]";
    assert_eq!(
        rows[1].1,
        [
            "f0",
            cut,
            "f1",
            cut,
            "sluice-r... [13 bytes in all, cut to 8 for display]",
            "kept",
            "(not shown)",
            "8 more fields, 96 bytes",
        ]
    );

    let newest: Vec<(String, Vec<String>)> = eval(
        &mut conn,
        &VIEW_RANGE,
        &["s"],
        &[&"XREVRANGE", &"+", &"-", &1, &8, &100],
    )
    .await
    .unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0].0, LARGEST_MS);
    let one: Vec<(String, Vec<String>)> = eval(
        &mut conn,
        &VIEW_RANGE,
        &["s"],
        &[&"XRANGE", &ABOVE_2_53, &ABOVE_2_53, &1, &8, &100],
    )
    .await
    .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].0, ABOVE_2_53);

    let missing: Vec<(String, Vec<String>)> = eval(
        &mut conn,
        &VIEW_RANGE,
        &["none"],
        &[&"XRANGE", &"-", &"+", &10, &8, &100],
    )
    .await
    .unwrap();
    assert!(missing.is_empty());
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(
        eval::<Vec<(String, Vec<String>)>>(
            &mut conn,
            &VIEW_RANGE,
            &["text"],
            &[&"XRANGE", &"-", &"+", &10, &8, &100],
        )
        .await,
    );
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

// ---------------------------------------------------------------------------------------------
// Keys, claims and the secret.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn claim_records_keys_for_one_subscription_and_names_the_other_owner() {
    let (_redis, mut conn) = redis().await;
    let ours = r#"{"group":"g","stream":"s"}"#;
    let theirs = r#"{"group":"h","stream":"s"}"#;
    let stream_owner = r#"{"stream":"s"}"#;
    let c = conn.clone();
    let claim = move |keys: Vec<&'static str>, owners: Vec<(&str, &str)>, readable: &str| {
        let mut args: Vec<Vec<u8>> = Vec::new();
        for (owner, role) in owners {
            args.push(owner.as_bytes().to_vec());
            args.push(role.as_bytes().to_vec());
        }
        for arg in ["dead-letter stream", "stream", "86400000", readable] {
            args.push(arg.as_bytes().to_vec());
        }
        let mut conn = c.clone();
        async move {
            let args: Vec<&dyn Arg> = args.iter().map(|a| a as &dyn Arg).collect();
            eval::<Vec<Value>>(&mut conn, &CLAIM, &keys, &args).await
        }
    };

    let first = claim(
        vec!["sluice-claim:set", "sluice-claim:s"],
        vec![(ours, "delayed-retry set"), (stream_owner, "stream")],
        "",
    )
    .await
    .unwrap();
    assert!(first.is_empty(), "{first:?}");
    let record: Vec<String> = cmd(&mut conn, &["HGETALL", "sluice-claim:set"]).await;
    assert_eq!(record, ["owner", ours, "role", "delayed-retry set"]);
    let ttl: i64 = cmd(&mut conn, &["PTTL", "sluice-claim:set"]).await;
    assert!(ttl > 86_000_000, "{ttl}");

    // The same owner again: its own.
    let again = claim(
        vec!["sluice-claim:set"],
        vec![(ours, "delayed-retry set")],
        "",
    )
    .await
    .unwrap();
    assert!(again.is_empty(), "{again:?}");

    // Another subscription: the first key it does not hold, counting from 1.
    let conflict = claim(
        vec!["sluice-claim:s", "sluice-claim:set"],
        vec![(stream_owner, "stream"), (theirs, "delayed-retry set")],
        "",
    )
    .await
    .unwrap();
    let conflict: Vec<String> = conflict.iter().map(text).collect();
    assert_eq!(conflict, ["2", ours, "delayed-retry set"]);

    // A dead-letter stream is read as a stream only when the caller says so.
    let dl = claim(
        vec!["sluice-claim:dl"],
        vec![(ours, "dead-letter stream")],
        "",
    )
    .await
    .unwrap();
    assert!(dl.is_empty());
    let refused = claim(vec!["sluice-claim:dl"], vec![(stream_owner, "stream")], "")
        .await
        .unwrap();
    assert_eq!(refused.len(), 3);
    let allowed = claim(
        vec!["sluice-claim:dl"],
        vec![(stream_owner, "stream")],
        ",1,",
    )
    .await
    .unwrap();
    assert!(allowed.is_empty(), "{allowed:?}");

    // Half a record (another writer's): the missing role is filled in.
    let _: i64 = cmd(&mut conn, &["HSET", "sluice-claim:half", "owner", ours]).await;
    let half = claim(vec!["sluice-claim:half"], vec![(ours, "retry lane")], "")
        .await
        .unwrap();
    assert!(half.is_empty());

    let _: () = cmd(&mut conn, &["SET", "sluice-claim:text", "x"]).await;
    let wrong = error_of(
        claim(
            vec!["sluice-claim:text"],
            vec![(ours, "delayed-retry set")],
            "",
        )
        .await,
    );
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

#[tokio::test]
async fn secret_is_made_once_and_records_exact_cutoffs() {
    let (_redis, mut conn) = redis().await;
    let _: String = cmd(&mut conn, &["XADD", "s", ABOVE_2_53, "f", "v"]).await;
    let _: String = cmd(&mut conn, &["XADD", "lane", LARGEST_MS, "f", "v"]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;

    // Only reading, with no secret: nothing recorded.
    let read: Vec<Option<String>> = eval(
        &mut conn,
        &SECRET,
        &["secret", "legacy", "s", "lane"],
        &[&"first", &"0"],
    )
    .await
    .unwrap();
    assert_eq!(read, [None, Some("0-0".into()), Some("0-0".into())]);
    let recorded: i64 = cmd(&mut conn, &["EXISTS", "legacy"]).await;
    assert_eq!(recorded, 0);

    let made: Vec<String> = eval(
        &mut conn,
        &SECRET,
        &["secret", "legacy", "s", "lane", "none", "text"],
        &[&"first", &"1"],
    )
    .await
    .unwrap();
    assert_eq!(made, ["first", ABOVE_2_53, LARGEST_MS, "0-0", "0-0"]);

    // Another host, later, with its own random value: the same secret and cutoffs.
    let _: String = cmd(&mut conn, &["XADD", "s", "9007199254740994-0", "f", "v"]).await;
    let again: Vec<String> = eval(
        &mut conn,
        &SECRET,
        &["secret", "legacy", "s", "lane"],
        &[&"second", &"1"],
    )
    .await
    .unwrap();
    assert_eq!(again, ["first", ABOVE_2_53, LARGEST_MS]);

    let _: i64 = cmd(&mut conn, &["HSET", "hash", "f", "v"]).await;
    for (secret_key, legacy) in [("hash", "legacy2"), ("secret2", "text")] {
        let wrong = error_of(
            eval::<Vec<Option<String>>>(
                &mut conn,
                &SECRET,
                &[secret_key, legacy, "s"],
                &[&"third", &"1"],
            )
            .await,
        );
        assert!(
            wrong.contains("WRONGTYPE"),
            "{secret_key} {legacy}: {wrong}"
        );
    }
}

#[tokio::test]
async fn forget_gone_deletes_only_an_idle_consumer_holding_nothing() {
    let (_redis, mut conn) = redis().await;
    pending_entries(&mut conn, "s", &[ABOVE_2_53]).await;
    let _: i64 = cmd(&mut conn, &["XGROUP", "CREATECONSUMER", "s", "g", "empty"]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let c = conn.clone();
    let forget = move |key: &'static str, group: &'static str, name: &'static str, idle: i64| {
        let mut conn = c.clone();
        async move {
            eval::<i64>(&mut conn, &FORGET_GONE, &[key], &[&group, &name, &idle])
                .await
                .unwrap()
        }
    };
    assert_eq!(forget("s", "g", "c", 0).await, 0, "holds an entry");
    assert_eq!(
        forget("s", "g", "empty", 3_600_000).await,
        0,
        "idle for less"
    );
    assert_eq!(forget("s", "g", "nobody", 0).await, 0, "not there");
    assert_eq!(forget("s", "nogroup", "c", 0).await, 0, "no such group");
    assert_eq!(forget("none", "g", "c", 0).await, 0, "no such stream");
    assert_eq!(forget("text", "g", "c", 0).await, 0, "another type");
    assert_eq!(forget("s", "g", "empty", 0).await, 1);
    let consumers = sluice_host::store::inspect::consumers(&mut conn, "s", "g")
        .await
        .unwrap();
    let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["c"]);
    assert_eq!(pending(&mut conn, "s", "g").await, 1);
}

// ---------------------------------------------------------------------------------------------
// Flow control: the epoch, the token bucket, the circuit breaker.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn bump_logs_the_change_then_raises_the_epoch() {
    let (_redis, mut conn) = redis().await;
    let (log, epoch) = ("{e}:changes", "{e}");
    let c = conn.clone();
    let bump = move || {
        let mut conn = c.clone();
        async move { eval::<i64>(&mut conn, &BUMP, &[log, epoch], &[&"flow-key", &10]).await }
    };
    assert_eq!(bump().await.unwrap(), 1);
    assert_eq!(bump().await.unwrap(), 1);
    let value: String = cmd(&mut conn, &["GET", epoch]).await;
    assert_eq!(value, "2");
    let notes = entries(&mut conn, log).await;
    assert_eq!(notes.len(), 2);
    assert_eq!(field(&notes[1].1, "k"), Some("flow-key"));

    // An epoch another writer left that is no number, or at its maximum: reset to a new value.
    for stale in ["not-a-number", "9223372036854775807"] {
        let _: () = cmd(&mut conn, &["SET", epoch, stale]).await;
        bump().await.unwrap();
        let value: String = cmd(&mut conn, &["GET", epoch]).await;
        assert!(value.starts_with("reset-"), "{stale}: {value}");
    }
    // One of another type is replaced by such a value too.
    let _: i64 = cmd(&mut conn, &["DEL", epoch]).await;
    let _: i64 = cmd(&mut conn, &["HSET", epoch, "f", "v"]).await;
    bump().await.unwrap();
    let kind: String = cmd(&mut conn, &["TYPE", epoch]).await;
    assert_eq!(kind, "string");

    // A log of another type: an error, and the epoch stays as it was.
    let _: i64 = cmd(&mut conn, &["DEL", log]).await;
    let _: () = cmd(&mut conn, &["SET", log, "x"]).await;
    let before: String = cmd(&mut conn, &["GET", epoch]).await;
    let wrong = error_of(bump().await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    let after: String = cmd(&mut conn, &["GET", epoch]).await;
    assert_eq!(before, after);
}

#[tokio::test]
async fn take_tokens_grants_from_a_bounded_bucket() {
    let (_redis, mut conn) = redis().await;
    // One token every 100 s: nothing refills between two calls of this test.
    let c = conn.clone();
    let take = move |key: &'static str, want: i32, batch: i32| {
        let mut conn = c.clone();
        async move {
            eval::<(i64, i64)>(
                &mut conn,
                &TAKE_TOKENS,
                &[key],
                &[&0.01, &50, &want, &batch],
            )
            .await
        }
    };
    assert_eq!(take("bucket", 10, 1).await.unwrap(), (10, 0));
    let left: String = cmd(&mut conn, &["HGET", "bucket", "t"]).await;
    assert_eq!(left, "40");
    let ttl: i64 = cmd(&mut conn, &["PTTL", "bucket"]).await;
    assert!((5_000_000..=5_060_000).contains(&ttl), "{ttl}");
    assert_eq!(take("bucket", 100, 1).await.unwrap(), (40, 0));
    let (granted, wait) = take("bucket", 10, 5).await.unwrap();
    assert_eq!(granted, 0);
    assert!((499_000..=500_000).contains(&wait), "{wait}");

    // What another writer may leave: no numbers make a full bucket; negative tokens count as
    // none and a time in the future as now; an infinite count as the burst.
    let _: i64 = cmd(&mut conn, &["HSET", "bucket", "t", "nan", "at", "x"]).await;
    assert_eq!(take("bucket", 100, 1).await.unwrap(), (50, 0));
    let _: i64 = cmd(
        &mut conn,
        &["HSET", "bucket", "t", "-5", "at", "99999999999999999"],
    )
    .await;
    let (granted, wait) = take("bucket", 100, 1).await.unwrap();
    assert_eq!(granted, 0);
    assert!((99_000..=100_000).contains(&wait), "{wait}");
    let at: f64 = cmd::<String>(&mut conn, &["HGET", "bucket", "at"])
        .await
        .parse()
        .unwrap();
    assert!(at <= server_ms(&mut conn).await as f64 + 1.0, "{at}");
    let _: i64 = cmd(&mut conn, &["HSET", "bucket", "t", "inf", "at", "0"]).await;
    assert_eq!(take("bucket", 100, 1).await.unwrap(), (50, 0));

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(take("text", 1, 1).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

/// A breaker record as JSON.
fn breaker(json: serde_json::Value) -> String {
    json.to_string()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn breaker_record_opens_when_the_window_fails_enough() {
    let (_redis, mut conn) = redis().await;
    let c = conn.clone();
    let record =
        move |window: &'static str, flow: &'static str, journal: &'static str, d: i32, f: i32| {
            let mut conn = c.clone();
            async move {
                eval::<(String, String)>(
                    &mut conn,
                    &BREAKER_RECORD,
                    &[window, flow, journal],
                    &[&d, &f, &30_000, &5, &0.5, &1_000, &"host-a"],
                )
                .await
            }
        };
    assert_eq!(
        record("window", "flow", "journal", 10, 1).await.unwrap(),
        ("closed".to_owned(), String::new())
    );
    let (what, state) = record("window", "flow", "journal", 10, 10).await.unwrap();
    assert_eq!(what, "opened");
    let state = json(&state);
    assert_eq!(state["state"], "open");
    assert_eq!(
        (state["failed"].as_i64(), state["of"].as_i64()),
        (Some(11), Some(20))
    );
    assert_eq!(state["by"], "host-a");
    let stored: String = cmd(&mut conn, &["HGET", "flow", "breaker"]).await;
    assert_eq!(json(&stored), state);
    let window: i64 = cmd(&mut conn, &["EXISTS", "window"]).await;
    assert_eq!(window, 0, "opening deletes the window");
    let journal = entries(&mut conn, "journal").await;
    assert_eq!(field(&journal[0].1, "what"), Some("breaker-opened"));
    assert_eq!(
        record("window", "flow", "journal", 10, 10).await.unwrap().0,
        "not-closed"
    );

    // Another writer's values in the window count as nothing.
    let _: i64 = cmd(
        &mut conn,
        &[
            "HSET", "window2", "t0", "x", "d0", "-5", "f0", "abc", "junk", "1",
        ],
    )
    .await;
    assert_eq!(
        record("window2", "flow2", "journal2", 1, 0)
            .await
            .unwrap()
            .0,
        "closed"
    );
    // Finding (minor): a count that is no integer in the slot of the current second fails the
    // call (HINCRBY) instead of counting as 0, until the second passes; that flush's counts are
    // lost. Both this second's slot and the next one's are spoiled, whichever the call lands in.
    let second = server_ms(&mut conn).await / 1_000;
    for bucket in [second, second + 1] {
        let slot = bucket % 30;
        let (t, d) = (format!("t{slot}"), format!("d{slot}"));
        let _: i64 = cmd(
            &mut conn,
            &["HSET", "window6", &t, &bucket.to_string(), &d, "abc"],
        )
        .await;
    }
    let spoiled = error_of(record("window6", "flow6", "journal6", 1, 0).await);
    assert!(spoiled.contains("not an integer"), "{spoiled}");
    // A journal of another type is skipped: the breaker opens all the same.
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    assert_eq!(
        record("window3", "flow3", "text", 10, 10).await.unwrap().0,
        "opened"
    );
    for (window, flow) in [("text", "flow4"), ("window5", "text")] {
        let wrong = error_of(record(window, flow, "journal5", 10, 10).await);
        assert!(wrong.contains("WRONGTYPE"), "{window} {flow}: {wrong}");
    }
}

#[tokio::test]
async fn breaker_probe_hands_out_a_rounds_permits() {
    let (_redis, mut conn) = redis().await;
    let c = conn.clone();
    let probe = move |flow: &'static str| {
        let mut conn = c.clone();
        async move {
            eval::<(String, i64, String)>(
                &mut conn,
                &BREAKER_PROBE,
                &[flow, "journal"],
                &[&2, &1_000, &"host-a"],
            )
            .await
        }
    };
    assert_eq!(
        probe("flow").await.unwrap(),
        ("closed".to_owned(), 0, String::new())
    );

    let now = server_ms(&mut conn).await;
    let open =
        breaker(serde_json::json!({"state": "open", "since_ms": now, "until_ms": now + 3_600_000}));
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "breaker", &open]).await;
    let (what, wait, record) = probe("flow").await.unwrap();
    assert_eq!((what.as_str(), record.as_str()), ("wait", open.as_str()));
    assert!((3_590_000..=3_600_000).contains(&wait), "{wait}");

    // Open long enough: the first ask moves it to half-open and takes a permit.
    let open = breaker(serde_json::json!({"state": "open", "since_ms": 0, "until_ms": 0}));
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "breaker", &open]).await;
    let (what, _, record) = probe("flow").await.unwrap();
    assert_eq!(what, "probe");
    let record = json(&record);
    assert_eq!(record["state"], "half-open");
    assert_eq!(
        (record["moved"].as_i64(), record["probes_left"].as_i64()),
        (Some(1), Some(1))
    );
    let journal = entries(&mut conn, "journal").await;
    assert_eq!(field(&journal[0].1, "what"), Some("breaker-half-open"));
    let (what, _, record) = probe("flow").await.unwrap();
    assert_eq!(what, "probe");
    assert_eq!(json(&record)["moved"].as_i64(), Some(0));
    let (what, wait, _) = probe("flow").await.unwrap();
    assert_eq!(what, "wait");
    assert!((1..=250).contains(&wait), "{wait}");

    // A probe time more than two days ahead is taken as now.
    let far = breaker(serde_json::json!({"state": "open", "until_ms": 99_999_999_999_999i64}));
    let _: i64 = cmd(&mut conn, &["HSET", "flow2", "breaker", &far]).await;
    assert_eq!(probe("flow2").await.unwrap().0, "probe");

    // Finding: a record that is not Sluice's counts as open from now at every call and is
    // never written over: the group waits `open for` again and again, never probing, until
    // someone removes it.
    let _: i64 = cmd(&mut conn, &["HSET", "flow3", "breaker", "garbage"]).await;
    for _ in 0..2 {
        assert_eq!(
            probe("flow3").await.unwrap(),
            ("wait".to_owned(), 1_000, "garbage".to_owned())
        );
    }

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(probe("text").await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

#[tokio::test]
async fn breaker_result_closes_or_opens_a_half_open_breaker() {
    let (_redis, mut conn) = redis().await;
    let c = conn.clone();
    let answer = move |success: &'static str| {
        let mut conn = c.clone();
        async move {
            eval::<(String, String)>(
                &mut conn,
                &BREAKER_RESULT,
                &["flow", "window", "journal"],
                &[&success, &1_000, &"boom", &"host-a"],
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(answer("1").await, ("ignored".to_owned(), String::new()));

    let half_open = breaker(serde_json::json!({"state": "half-open"}));
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "breaker", &half_open]).await;
    let (what, state) = answer("0").await;
    assert_eq!(what, "reopened");
    let state = json(&state);
    assert_eq!(
        (&state["state"], &state["why"]),
        (&"open".into(), &"boom".into())
    );
    // Open, not half-open: another probe answered first.
    assert_eq!(answer("1").await.0, "ignored");

    let _: i64 = cmd(&mut conn, &["HSET", "flow", "breaker", &half_open]).await;
    let _: i64 = cmd(&mut conn, &["HSET", "window", "t0", "1"]).await;
    assert_eq!(answer("1").await, ("closed".to_owned(), String::new()));
    let left: (i64, i64) = (
        cmd(&mut conn, &["HEXISTS", "flow", "breaker"]).await,
        cmd(&mut conn, &["EXISTS", "window"]).await,
    );
    assert_eq!(left, (0, 0));
    let journal: Vec<String> = entries(&mut conn, "journal")
        .await
        .iter()
        .filter_map(|(_, f)| field(f, "what").map(str::to_owned))
        .collect();
    assert_eq!(journal, ["breaker-reopened", "breaker-closed"]);

    let _: i64 = cmd(&mut conn, &["HSET", "flow", "breaker", "[1,2"]).await;
    assert_eq!(answer("1").await.0, "ignored");
    let kept: String = cmd(&mut conn, &["HGET", "flow", "breaker"]).await;
    assert_eq!(kept, "[1,2");
}

// ---------------------------------------------------------------------------------------------
// Canary rollouts.
// ---------------------------------------------------------------------------------------------

/// A canary record as the host writes one: a sealed envelope whose `body` is JSON.
fn canary_record(id: &str, ends_ms: i64) -> String {
    let body = serde_json::json!({"id": id, "ends_ms": ends_ms}).to_string();
    serde_json::json!({"body": body, "mark": "m"}).to_string()
}

/// A verdict as the host writes one.
fn canary_verdict(id: &str) -> String {
    let body = serde_json::json!({"id": id, "outcome": "promoted"}).to_string();
    serde_json::json!({"body": body, "mark": "m"}).to_string()
}

#[tokio::test]
async fn canary_start_keeps_a_running_canary_and_replaces_anything_else() {
    let (_redis, mut conn) = redis().await;
    let now = server_ms(&mut conn).await;
    let c = conn.clone();
    let start = move |flow: &'static str,
                      counts: &'static str,
                      id: &'static str,
                      ends: i64,
                      seen: String| {
        let mut conn = c.clone();
        async move {
            eval::<(i64, String)>(
                &mut conn,
                &CANARY_START,
                &[flow, counts],
                &[&canary_record(id, ends), &id, &60_000, &seen],
            )
            .await
        }
    };
    assert_eq!(
        start("flow", "counts", "c1", now + 60_000, String::new())
            .await
            .unwrap(),
        (1, String::new())
    );
    let counts: Vec<String> = cmd(&mut conn, &["HGETALL", "counts"]).await;
    assert_eq!(counts, ["id", "c1"]);
    // Running: kept, and named in the answer.
    assert_eq!(
        start("flow", "counts", "c2", now + 60_000, String::new())
            .await
            .unwrap(),
        (0, canary_record("c1", now + 60_000))
    );
    // The caller could not verify it: another writer's, replaced.
    let (started, _) = start(
        "flow",
        "counts",
        "c2",
        now + 60_000,
        canary_record("c1", now + 60_000),
    )
    .await
    .unwrap();
    assert_eq!(started, 1);
    // Not Sluice's, decided, or abandoned (its end plus ARGV[3] passed): replaced.
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "canary", "garbage"]).await;
    assert_eq!(
        start("flow", "counts", "c3", now + 60_000, String::new())
            .await
            .unwrap()
            .0,
        1
    );
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "canary-verdict", "{\"c3\"}"]).await;
    assert_eq!(
        start("flow", "counts", "c4", now + 60_000, String::new())
            .await
            .unwrap()
            .0,
        1
    );
    let verdict: i64 = cmd(&mut conn, &["HEXISTS", "flow", "canary-verdict"]).await;
    assert_eq!(verdict, 0);
    let _: i64 = cmd(
        &mut conn,
        &[
            "HSET",
            "flow",
            "canary",
            &canary_record("c5", now - 120_000),
        ],
    )
    .await;
    assert_eq!(
        start("flow", "counts", "c6", now + 60_000, String::new())
            .await
            .unwrap()
            .0,
        1
    );
    let counts: Vec<String> = cmd(&mut conn, &["HGETALL", "counts"]).await;
    assert_eq!(counts, ["id", "c6"]);

    // Counts of another type are replaced; a flow hash of another type is an error.
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    assert_eq!(
        start("flow2", "text", "c7", now + 60_000, String::new())
            .await
            .unwrap()
            .0,
        1
    );
    let kind: String = cmd(&mut conn, &["TYPE", "text"]).await;
    assert_eq!(kind, "hash");
    let _: () = cmd(&mut conn, &["SET", "text2", "x"]).await;
    let wrong = error_of(start("text2", "counts3", "c8", now + 60_000, String::new()).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

/// One version's tally as the report takes it: attempts, failures, dead letters, retries,
/// (bucket, count) pairs.
type Tally = (i64, i64, i64, i64, Vec<(String, i64)>);

#[tokio::test]
async fn canary_report_counts_and_judges() {
    let (_redis, mut conn) = redis().await;
    let now = server_ms(&mut conn).await;
    let _: i64 = cmd(
        &mut conn,
        &["HSET", "flow", "canary", &canary_record("c1", now + 60_000)],
    )
    .await;
    let c = conn.clone();
    let report =
        move |id: &'static str, ends: i64, forged: &'static str, inc: Tally, can: Tally| {
            let mut conn = c.clone();
            async move {
                let mut args: Vec<String> = vec![id.to_owned(), ends.to_string()];
                for a in [
                    "0.05", "0.05", "0.05", "2", "1000", "100", "3.29", "1.96", "60000", forged,
                ] {
                    args.push(a.to_owned());
                }
                for (attempts, failures, dead, retries, buckets) in [inc, can] {
                    for n in [attempts, failures, dead, retries, buckets.len() as i64] {
                        args.push(n.to_string());
                    }
                    for (b, n) in buckets {
                        args.push(b);
                        args.push(n.to_string());
                    }
                }
                let args: Vec<&dyn Arg> = args.iter().map(|a| a as &dyn Arg).collect();
                let reply: Vec<String> =
                    eval(&mut conn, &CANARY_REPORT, &["flow", "counts"], &args).await?;
                Ok::<_, redis::RedisError>(reply)
            }
        };
    let quiet = |n: i64| (n, 0, 0, 0, Vec::new());

    let running = report(
        "c1",
        now + 60_000,
        "",
        (100, 1, 0, 0, vec![("40".into(), 100)]),
        (100, 2, 0, 0, vec![("40".into(), 100)]),
    )
    .await
    .unwrap();
    assert_eq!(running, ["running"]);
    let counts: Vec<String> = cmd(
        &mut conn,
        &[
            "HMGET",
            "counts",
            "id",
            "i:attempts",
            "c:failures",
            "c:h:40",
        ],
    )
    .await;
    assert_eq!(counts, ["c1", "100", "2", "100"]);

    // Far worse during the window: rolled back at once.
    let judged = report(
        "c1",
        now + 60_000,
        "",
        quiet(1000),
        (1000, 900, 0, 0, Vec::new()),
    )
    .await
    .unwrap();
    assert_eq!(judged[..2], ["judged", "rolled-back"]);
    assert!(judged[2].contains("failure rate"), "{judged:?}");

    // The window over, as good as the incumbent, enough attempts: promoted.
    let _: i64 = cmd(&mut conn, &["DEL", "counts"]).await;
    let judged = report(
        "c1",
        now - 1,
        "",
        (1000, 10, 0, 0, Vec::new()),
        (1000, 10, 0, 0, Vec::new()),
    )
    .await
    .unwrap();
    assert_eq!(judged[..2], ["judged", "promoted"]);
    // Too few attempts on the candidate at the end: rolled back, saying so.
    let _: i64 = cmd(&mut conn, &["DEL", "counts"]).await;
    let judged = report("c1", now - 1, "", quiet(0), quiet(5)).await.unwrap();
    assert_eq!(judged[..2], ["judged", "rolled-back"]);
    assert!(
        judged[2].contains("fewer than the 100 needed"),
        "{judged:?}"
    );

    assert_eq!(
        report("other", now, "", quiet(1), quiet(1)).await.unwrap(),
        ["gone"]
    );

    // Counts another writer left: a count that is no integer starts again, buckets outside
    // 0..119 are left out; counts of another canary are dropped.
    let _: i64 = cmd(&mut conn, &["DEL", "counts"]).await;
    let _: i64 = cmd(
        &mut conn,
        &["HSET", "counts", "id", "c1", "c:attempts", "abc"],
    )
    .await;
    let buckets = vec![("999".into(), 5), ("-1".into(), 3), ("x".into(), 1)];
    let running = report("c1", now + 60_000, "", quiet(1), (1, 0, 0, 0, buckets))
        .await
        .unwrap();
    assert_eq!(running, ["running"]);
    let counts: Vec<String> = cmd(&mut conn, &["HGETALL", "counts"]).await;
    let mut counts: Vec<(String, String)> = counts
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    counts.sort();
    let expected = [("c:attempts", "1"), ("i:attempts", "1"), ("id", "c1")];
    assert_eq!(counts, expected.map(|(a, b)| (a.to_owned(), b.to_owned())));
    let _: i64 = cmd(
        &mut conn,
        &["HSET", "counts", "id", "c0", "i:attempts", "7"],
    )
    .await;
    report("c1", now + 60_000, "", quiet(1), quiet(0))
        .await
        .unwrap();
    let attempts: String = cmd(&mut conn, &["HGET", "counts", "i:attempts"]).await;
    assert_eq!(attempts, "1");

    // A verdict for it: answered, nothing counted; read past when the caller found it forged.
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "canary-verdict", "forged c1"]).await;
    assert_eq!(
        report("c1", now + 60_000, "", quiet(5), quiet(5))
            .await
            .unwrap(),
        ["verdict", "forged c1"]
    );
    assert_eq!(
        report("c1", now + 60_000, "forged c1", quiet(5), quiet(5))
            .await
            .unwrap(),
        ["running"]
    );
    let attempts: String = cmd(&mut conn, &["HGET", "counts", "i:attempts"]).await;
    assert_eq!(attempts, "6");

    let _: i64 = cmd(&mut conn, &["DEL", "counts"]).await;
    let _: () = cmd(&mut conn, &["SET", "counts", "x"]).await;
    let wrong = error_of(report("c1", now + 60_000, "forged c1", quiet(1), quiet(1)).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

#[tokio::test]
async fn canary_verdict_is_written_once_while_its_record_is_the_canary() {
    let (_redis, mut conn) = redis().await;
    let _: i64 = cmd(
        &mut conn,
        &["HSET", "flow", "canary", &canary_record("c1", 0)],
    )
    .await;
    let _: () = cmd(&mut conn, &["SET", "candidate", "bytes"]).await;
    let c = conn.clone();
    let decide = move |verdict: String, id: &'static str, seen: String| {
        let mut conn = c.clone();
        async move {
            eval::<i64>(
                &mut conn,
                &CANARY_VERDICT,
                &["flow", "candidate"],
                &[&verdict, &id, &seen],
            )
            .await
            .unwrap()
        }
    };
    let first = canary_verdict("c1");
    assert_eq!(decide(first.clone(), "c1", String::new()).await, 1);
    let candidate: i64 = cmd(&mut conn, &["EXISTS", "candidate"]).await;
    assert_eq!(candidate, 0, "the candidate's bytes go with the verdict");
    // Another verdict for the same record comes second: refused.
    let second = format!("{first} ");
    assert_eq!(decide(second.clone(), "c1", String::new()).await, 0);
    // Unless the caller found the one there not to verify.
    assert_eq!(decide(second.clone(), "c1", first.clone()).await, 1);
    let stored: String = cmd(&mut conn, &["HGET", "flow", "canary-verdict"]).await;
    assert_eq!(stored, second);
    // Not the canary's record: nothing written.
    assert_eq!(decide(canary_verdict("c9"), "c9", String::new()).await, 0);
    // A malformed value names no record: written over.
    let _: i64 = cmd(&mut conn, &["HSET", "flow", "canary-verdict", "garbage c1"]).await;
    assert_eq!(decide(first, "c1", String::new()).await, 1);

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(
        eval::<i64>(
            &mut conn,
            &CANARY_VERDICT,
            &["text", "candidate"],
            &[&"v", &"c1", &""],
        )
        .await,
    );
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

// ---------------------------------------------------------------------------------------------
// Retention.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn trim_drops_only_what_every_group_acknowledged_comparing_ids_exactly() {
    let (_redis, mut conn) = redis().await;
    let c = conn.clone();
    let trim = move |stream: &'static str,
                     host: &'static str,
                     keep_acked: i64,
                     max_len: i32,
                     keep_dead: i64,
                     streams: &'static str| {
        let mut conn = c.clone();
        async move {
            eval::<(i64, i64, i64, i64, String, i64)>(
                &mut conn,
                &TRIM,
                &[stream, "lease", "record", "dl", "dl-lease"],
                &[
                    &host,
                    &60_000,
                    &keep_acked,
                    &max_len,
                    &keep_dead,
                    &100,
                    &streams,
                ],
            )
            .await
        }
    };
    // Groups at 2^53 + 1 and just below: as doubles both are 2^53, compared exactly the lower
    // one holds the threshold.
    for id in [
        "9007199254740992-1",
        "9007199254740992-9",
        ABOVE_2_53,
        LARGEST_MS,
    ] {
        let _: String = cmd(&mut conn, &["XADD", "s", id, "f", "v"]).await;
    }
    create_group(&mut conn, "s", "g", ABOVE_2_53).await;
    create_group(&mut conn, "s", "h", "9007199254740992-9").await;
    create_group(&mut conn, "s", "i", LARGEST_MS).await;
    // Young entries (ids in the future), so only max_len lets them go.
    let reply = trim("s", "host-a", 0, 1, 0, "1").await.unwrap();
    assert_eq!(reply, (1, 1, 3, 1, "9007199254740992-9".to_owned(), 0));
    let left: Vec<String> = entries(&mut conn, "s")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(left, ["9007199254740992-9", ABOVE_2_53, LARGEST_MS]);
    let recorded: Vec<String> = cmd(
        &mut conn,
        &["HMGET", "record", "threshold", "blocked", "holder"],
    )
    .await;
    assert_eq!(recorded, ["9007199254740992-9", "1", "host-a"]);

    // Another host holds the lease: nothing.
    assert_eq!(
        trim("s", "host-b", 0, 1, 0, "1").await.unwrap(),
        (0, 0, 0, 0, String::new(), 0)
    );

    // Old entries: below the oldest pending id and older than keep_acked go.
    let _: i64 = cmd(&mut conn, &["DEL", "lease"]).await;
    pending_entries(&mut conn, "old", &["1-1", "2-1", "3-1"]).await;
    let _: i64 = cmd(&mut conn, &["XACK", "old", "g", "1-1", "3-1"]).await;
    assert_eq!(
        trim("old", "host-a", 1_000, 0, 0, "1").await.unwrap(),
        (1, 1, 2, 0, "2-1".to_owned(), 0)
    );
    // Kept for longer than the entries have been there: nothing goes.
    assert_eq!(
        trim("old", "host-a", i64::MAX / 2, 0, 0, "1")
            .await
            .unwrap()
            .1,
        0
    );
    // No group: never trimmed; ARGV[7] 0: the stream is not looked at.
    let _: String = cmd(&mut conn, &["XADD", "nogroups", "1-1", "f", "v"]).await;
    assert_eq!(
        trim("nogroups", "host-a", 0, 0, 0, "1").await.unwrap(),
        (1, 0, 1, 0, String::new(), 0)
    );
    assert_eq!(
        trim("old", "host-a", 0, 0, 0, "0").await.unwrap(),
        (1, 0, 2, 0, String::new(), 0)
    );

    // Dead letters older than their keep.
    for id in ["1-1", "2-1", "*"] {
        let _: String = cmd(&mut conn, &["XADD", "dl", id, "f", "v"]).await;
    }
    assert_eq!(
        trim("old", "host-a", 0, 0, 3_600_000, "0").await.unwrap().5,
        2
    );
    assert_eq!(entries(&mut conn, "dl").await.len(), 1);

    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(trim("text", "host-a", 0, 0, 0, "1").await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

// ---------------------------------------------------------------------------------------------
// An operator's actions on parked retries and dead letters.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn retry_now_makes_parked_retries_due_by_the_servers_clock() {
    let (_redis, mut conn) = redis().await;
    let before = server_ms(&mut conn).await;
    let (later, latest, due) = (before + 100_000, before + 200_000, before - 5);
    let _: i64 = cmd(
        &mut conn,
        &[
            "ZADD",
            "set",
            &later.to_string(),
            "a",
            &latest.to_string(),
            "b",
            &due.to_string(),
            "c",
        ],
    )
    .await;
    // Named members; one no longer there is skipped.
    let made: i64 = eval(&mut conn, &RETRY_NOW, &["set"], &[&0, &"a", &"gone"])
        .await
        .unwrap();
    assert_eq!(made, 1);
    let after = server_ms(&mut conn).await;
    let score: i64 = cmd(&mut conn, &["ZSCORE", "set", "a"]).await;
    assert!(
        (before..=after).contains(&score),
        "{before} {score} {after}"
    );
    // Up to n not yet due: `c` was due already and keeps its time.
    let made: i64 = eval(&mut conn, &RETRY_NOW, &["set"], &[&10]).await.unwrap();
    assert_eq!(made, 1);
    let scores: Vec<(String, i64)> =
        cmd(&mut conn, &["ZRANGE", "set", "0", "-1", "WITHSCORES"]).await;
    assert_eq!(scores[0], ("c".to_owned(), due));
    let b = scores.iter().find(|(m, _)| m == "b").unwrap().1;
    assert!(b < latest, "{b}");

    let missing: i64 = eval(&mut conn, &RETRY_NOW, &["none"], &[&0, &"a"])
        .await
        .unwrap();
    assert_eq!(missing, 0);
    let made: i64 = cmd(&mut conn, &["EXISTS", "none"]).await;
    assert_eq!(made, 0, "a missing set is not made");
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(eval::<i64>(&mut conn, &RETRY_NOW, &["text"], &[&0, &"a"]).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

#[tokio::test]
async fn move_dead_letter_leaves_it_in_exactly_one_stream() {
    let (_redis, mut conn) = redis().await;
    let _: String = cmd(&mut conn, &["XADD", "old", ABOVE_2_53, "a", "1"]).await;
    let _: String = cmd(&mut conn, &["XADD", "old", LARGEST_MS, "a", "1"]).await;
    let new_id: Option<String> = eval(
        &mut conn,
        &MOVE_DEAD_LETTER,
        &["old", "new"],
        &[&ABOVE_2_53, &"a", &"1", &"b", &"2"],
    )
    .await
    .unwrap();
    let moved = entries(&mut conn, "new").await;
    assert_eq!(moved.len(), 1);
    assert_eq!(Some(moved[0].0.clone()), new_id);
    assert_eq!(moved[0].1, fields_text(&[("a", "1"), ("b", "2")]));
    let left: Vec<String> = entries(&mut conn, "old")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(left, [LARGEST_MS]);
    // Moved already (another host came first): nothing.
    let again: Option<String> = eval(
        &mut conn,
        &MOVE_DEAD_LETTER,
        &["old", "new"],
        &[&ABOVE_2_53, &"a", &"1"],
    )
    .await
    .unwrap();
    assert_eq!(again, None);
    assert_eq!(entries(&mut conn, "new").await.len(), 1);

    // Redis refuses the write: the dead letter stays where it was.
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(
        eval::<Option<String>>(
            &mut conn,
            &MOVE_DEAD_LETTER,
            &["old", "text"],
            &[&LARGEST_MS, &"a", &"1"],
        )
        .await,
    );
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    let no_fields = error_of(
        eval::<Option<String>>(
            &mut conn,
            &MOVE_DEAD_LETTER,
            &["old", "new"],
            &[&LARGEST_MS],
        )
        .await,
    );
    assert!(no_fields.contains("Wrong number of args"), "{no_fields}");
    assert_eq!(entries(&mut conn, "old").await.len(), 1);
}

fn fields_text(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

/// The requeue's options, as `requeue_options` in control/operate/dead_letters.rs writes them.
fn requeue_options(id: &str, origin: &str, mode: &str) -> Vec<u8> {
    options(vec![
        ("id", Mp::from(id)),
        ("origin", Mp::from(origin)),
        ("stream", Mp::from("s")),
        ("group", Mp::from("g")),
        ("mode", Mp::from(mode)),
        (
            "fields",
            names(&[
                ("retry_count", keys::RETRY_COUNT),
                ("origin_id", keys::ORIGIN_ID),
                ("due_ms", keys::DUE_MS),
                ("origin_group", keys::ORIGIN_GROUP),
                ("mark", keys::MARK),
                ("parked", keys::PARKED),
                ("packed_fields", keys::PACKED_FIELDS),
            ]),
        ),
        (
            "seals",
            names(&[
                ("lane", Seal::Lane.name()),
                ("tail", Seal::Tail.name()),
                ("tail_packed", Seal::TailPacked.name()),
            ]),
        ),
        ("max_fields", Mp::from(keys::SCRIPT_MAX_FIELDS as u64)),
    ])
}

#[tokio::test]
async fn requeue_moves_a_dead_letter_back_to_its_group_sealed() {
    let (_redis, mut conn) = redis().await;
    let c = conn.clone();
    let requeue = move |target: &'static str, dl: &'static str, options: Vec<u8>| {
        let mut conn = c.clone();
        async move {
            eval::<Option<String>>(
                &mut conn,
                &REQUEUE,
                &[target, dl, "secret"],
                &[
                    &options,
                    &"payload",
                    &"p",
                    &keys::REQUEUED_FROM,
                    &"the-dead-letter",
                ],
            )
            .await
        }
    };

    // Onto the stream without a secret: a plain new entry.
    let _: String = cmd(&mut conn, &["XADD", "dl", ABOVE_2_53, "payload", "p"]).await;
    let id = requeue("s", "dl", requeue_options(ABOVE_2_53, "1-1", "tail"))
        .await
        .unwrap();
    let copy = entries(&mut conn, "s").await;
    assert_eq!(Some(copy[0].0.clone()), id);
    assert_eq!(
        copy[0].1,
        fields_text(&[("payload", "p"), (keys::REQUEUED_FROM, "the-dead-letter")])
    );
    assert!(entries(&mut conn, "dl").await.is_empty());
    // Gone meanwhile: nothing written.
    assert_eq!(
        requeue("s", "dl", requeue_options(ABOVE_2_53, "1-1", "tail"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(entries(&mut conn, "s").await.len(), 1);

    // Into the lane: needs the secret, and the dead letter stays until there is one.
    let _: String = cmd(&mut conn, &["XADD", "dl", LARGEST_MS, "payload", "p"]).await;
    let refused = error_of(requeue("lane", "dl", requeue_options(LARGEST_MS, "", "lane")).await);
    assert!(refused.contains("NOSECRET"), "{refused}");
    assert_eq!(entries(&mut conn, "dl").await.len(), 1);
    let _: () = cmd(&mut conn, &["SET", "secret", SECRET_VALUE]).await;
    requeue("lane", "dl", requeue_options(LARGEST_MS, "", "lane"))
        .await
        .unwrap()
        .unwrap();
    assert!(entries(&mut conn, "dl").await.is_empty());
    let lane = raw_entries(&mut conn, "lane").await;
    let (member, due, mark) = (
        raw_field(&lane[0].1, keys::PARKED).unwrap(),
        raw_field(&lane[0].1, keys::DUE_MS).unwrap(),
        raw_field(&lane[0].1, keys::MARK).unwrap(),
    );
    assert!(secret().verify(Seal::Lane, &[b"s", b"g", member, due], mark));
    let due_ms: i64 = std::str::from_utf8(due).unwrap().parse().unwrap();
    let parked = member::decode(member, due_ms).unwrap();
    assert_eq!(parked.owner, Some(("s".to_owned(), "g".to_owned())));
    assert_eq!(
        (parked.entry_id.as_str(), parked.retry_count),
        (LARGEST_MS, 0)
    );
    assert_eq!(
        parked.fields,
        fields(&[("payload", "p"), (keys::REQUEUED_FROM, "the-dead-letter")])
    );

    // Onto the stream with a secret: the tail bookkeeping, sealed.
    let dead: String = cmd(&mut conn, &["XADD", "dl", "*", "payload", "p"]).await;
    requeue("s", "dl", requeue_options(&dead, "1-1", "tail"))
        .await
        .unwrap()
        .unwrap();
    let copy = raw_entries(&mut conn, "s").await.pop().unwrap().1;
    let own = fields(&[("payload", "p"), (keys::REQUEUED_FROM, "the-dead-letter")]);
    assert_eq!(copy[..2], own[..]);
    assert_eq!(raw_field(&copy, keys::RETRY_COUNT), Some(&b"0"[..]));
    assert_eq!(raw_field(&copy, keys::ORIGIN_ID), Some(&b"1-1"[..]));
    assert_eq!(raw_field(&copy, keys::ORIGIN_GROUP), Some(&b"g"[..]));
    let due = raw_field(&copy, keys::DUE_MS).unwrap();
    let digest = keys::fields_digest(&own);
    let mark = raw_field(&copy, keys::MARK).unwrap();
    assert!(secret().verify(
        Seal::Tail,
        &[b"s", b"g", b"1-1", b"0", due, digest.as_bytes()],
        mark
    ));

    // Redis refuses the write: the dead letter stays.
    let dead: String = cmd(&mut conn, &["XADD", "dl", "*", "payload", "p"]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(requeue("text", "dl", requeue_options(&dead, "1-1", "tail")).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    assert_eq!(entries(&mut conn, "dl").await.len(), 1);
    // An unreadable options map, a dead-letter stream of another type: errors, nothing moved.
    let unreadable = error_of(requeue("s", "dl", b"\xc1 not msgpack".to_vec()).await);
    assert!(
        unreadable.contains("requeue") && unreadable.contains("ARGV[1] is not the options map"),
        "{unreadable}"
    );
    let wrong = error_of(requeue("s", "text", requeue_options(&dead, "1-1", "tail")).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    assert_eq!(entries(&mut conn, "dl").await.len(), 1);
}

/// The dead-letter-now options, as `dead_letter_now_options` in control/operate/parked.rs
/// writes them.
fn dead_letter_now_options() -> Vec<u8> {
    options(vec![
        ("reason", Mp::from("the operator says so")),
        ("stream", Mp::from("s")),
        ("group", Mp::from("g")),
        ("max_fields", Mp::from(keys::SCRIPT_MAX_FIELDS as u64)),
        (
            "fields",
            names(&[
                ("reason", keys::REASON),
                ("origin_stream", keys::ORIGIN_STREAM),
                ("origin_group", keys::ORIGIN_GROUP),
                ("origin_id", keys::ORIGIN_ID),
                ("entry_id", keys::ENTRY_ID),
                ("retry_count", keys::RETRY_COUNT),
                ("delivery_count", keys::DELIVERY_COUNT),
                ("member", keys::MEMBER),
                ("origin_key", keys::ORIGIN_KEY),
                ("mark", keys::MARK),
                ("packed_fields", keys::PACKED_FIELDS),
            ]),
        ),
        // Decimal text, as the host sends it: a cap as large as 10^14 reaches XADD whole
        // (as a Lua number it printed as "1e+14", which XADD refused: found by the review).
        ("dead_letter_maxlen", Mp::from("100000000000000")),
        (
            "seals",
            names(&[
                ("dead_letter", Seal::DeadLetter.name()),
                ("member", Seal::Member.name()),
                ("dead_letter_packed", Seal::DeadLetterPacked.name()),
            ]),
        ),
    ])
}

#[tokio::test]
async fn dead_letter_now_moves_each_member_once() {
    let (_redis, mut conn) = redis().await;
    let _: () = cmd(&mut conn, &["SET", "secret", SECRET_VALUE]).await;
    let ours = member_of("s", "g", ABOVE_2_53, 3);
    let legacy = member::encode_legacy(LARGEST_MS, 2, &fields(&[("payload", "y")]));
    let theirs = member_of("t", "h", "3-3", 1);
    let junk = b"junk".to_vec();
    for (score, m) in [(1, &ours), (2, &legacy), (3, &theirs), (4, &junk)] {
        let _: i64 = raw(&mut conn, &[&"ZADD", &"set", &score, m]).await;
    }
    let c = conn.clone();
    let now = move |options: Vec<u8>, members: Vec<Vec<u8>>| {
        let mut conn = c.clone();
        async move {
            let mut args: Vec<&dyn Arg> = vec![&options];
            args.extend(members.iter().map(|m| m as &dyn Arg));
            eval::<i64>(&mut conn, &DEAD_LETTER_NOW, &["set", "dl", "secret"], &args).await
        }
    };
    let moved = now(
        dead_letter_now_options(),
        vec![
            ours.clone(),
            legacy.clone(),
            theirs.clone(),
            junk.clone(),
            b"not-there".to_vec(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(moved, 4);
    assert_eq!(parked(&mut conn, "set").await, 0);
    let dead = raw_entries(&mut conn, "dl").await;
    assert_eq!(dead.len(), 4);

    // Ours: its fields, the bookkeeping, the dead letter's seal.
    let letter = &dead[0].1;
    assert_eq!(letter[0], (b"payload".to_vec(), b"x".to_vec()));
    assert_eq!(
        raw_field(letter, keys::ORIGIN_ID),
        Some(ABOVE_2_53.as_bytes())
    );
    assert_eq!(raw_field(letter, keys::RETRY_COUNT), Some(&b"3"[..]));
    assert_eq!(
        raw_field(letter, keys::REASON),
        Some(&b"the operator says so"[..])
    );
    let digest = keys::fields_digest(&fields(&[("payload", "x")]));
    let parts: [&[u8]; 4] = [b"s", b"g", ABOVE_2_53.as_bytes(), digest.as_bytes()];
    assert!(secret().verify(
        Seal::DeadLetter,
        &parts,
        raw_field(letter, keys::MARK).unwrap()
    ));
    // An earlier release's member names no owner: taken as this set's.
    assert_eq!(
        raw_field(&dead[1].1, keys::ORIGIN_ID),
        Some(LARGEST_MS.as_bytes())
    );
    // Another subscription's, and one no park wrote: raw, sealed over the set and the member.
    for (letter, member) in [(&dead[2].1, &theirs), (&dead[3].1, &junk)] {
        assert_eq!(raw_field(letter, keys::MEMBER), Some(member.as_slice()));
        assert_eq!(raw_field(letter, keys::ORIGIN_KEY), Some(&b"set"[..]));
        let parts: [&[u8]; 4] = [b"set", b"s", b"g", member];
        assert!(secret().verify(Seal::Member, &parts, raw_field(letter, keys::MARK).unwrap()));
    }
    // Called again (a lost reply): nothing is there to move twice.
    assert_eq!(
        now(dead_letter_now_options(), vec![ours.clone()])
            .await
            .unwrap(),
        0
    );

    let unreadable = error_of(now(b"garbage".to_vec(), vec![ours.clone()]).await);
    assert!(
        unreadable.contains("dead_letter_now")
            && unreadable.contains("ARGV[1] is not the options map"),
        "{unreadable}"
    );

    // Finding: a member that reads as this subscription's but carries a field that is no
    // string fails the script at its XADD. The members before it are dead letters already (each
    // in one place), it and those after it stay parked, and every call naming it fails alike;
    // the sweep dead-letters such a member raw instead.
    let nested = member_with_nested_field("s", "g", "5-5");
    let after = member_of("s", "g", "6-6", 1);
    for (score, m) in [(1, &ours), (2, &nested), (3, &after)] {
        let _: i64 = raw(&mut conn, &[&"ZADD", &"set", &score, m]).await;
    }
    let failed = error_of(
        now(
            dead_letter_now_options(),
            vec![ours, nested.clone(), after.clone()],
        )
        .await,
    );
    assert!(failed.contains("must be strings or integers"), "{failed}");
    assert_eq!(parked(&mut conn, "set").await, 2);
    assert_eq!(raw_entries(&mut conn, "dl").await.len(), 5);
}

// ---------------------------------------------------------------------------------------------
// Settling: park, sweep, dead-letter.
// ---------------------------------------------------------------------------------------------

/// A history note as the settler writes one: origin, cap, the record without its brace.
fn note(origin: &str) -> String {
    format!("{origin} 10 {{\"do\":\"retry\"")
}

#[tokio::test]
async fn park_parks_and_acknowledges_a_pending_entry_once() {
    let (_redis, mut conn) = redis().await;
    pending_entries(&mut conn, "s", &[ABOVE_2_53]).await;
    let c = conn.clone();
    let park = move |stream: &'static str,
                     set: &'static str,
                     history: &'static str,
                     group: &'static str,
                     id: &'static str,
                     ttl: i64,
                     note: String| {
        let mut conn = c.clone();
        async move {
            eval::<Option<(i64, i64, i64, i64)>>(
                &mut conn,
                &PARK,
                &[stream, set, history, "history-index"],
                &[
                    &group, &id, &1_000, &ttl, &2, &id, &"s", &note, &5_000, &"payload", &"x",
                ],
            )
            .await
        }
    };
    let (due, now, acked, wait_us) = park(
        "s",
        "set",
        "histories",
        "g",
        ABOVE_2_53,
        0,
        note(ABOVE_2_53),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!((due - now, acked), (1_000, 1));
    assert!((999_000..=1_000_000).contains(&wait_us), "{wait_us}");
    assert_eq!(pending(&mut conn, "s", "g").await, 0);
    // The member, byte for byte as the host's encoder writes one, at its due time.
    let expected = NewMember {
        entry_id: ABOVE_2_53,
        retry_count: 2,
        fields: &fields(&[("payload", "x")]),
        origin_id: ABOVE_2_53,
        stream: "s",
        group: "g",
    }
    .encode();
    let members: Vec<(Vec<u8>, i64)> =
        raw(&mut conn, &[&"ZRANGE", &"set", &0, &-1, &"WITHSCORES"]).await;
    assert_eq!(members, [(expected, due)]);
    let ttl: i64 = cmd(&mut conn, &["PTTL", "set"]).await;
    assert_eq!(ttl, -1, "no ttl asked for");
    let history: String = cmd(&mut conn, &["HGET", "histories", ABOVE_2_53]).await;
    assert_eq!(
        history,
        format!("{{\"do\":\"retry\",\"at\":{now},\"due\":{due}}}")
    );

    // Settled already (or a call made again after a lost reply): nothing written.
    assert_eq!(
        park("s", "set", "histories", "g", ABOVE_2_53, 0, String::new())
            .await
            .unwrap(),
        None
    );
    assert_eq!(parked(&mut conn, "set").await, 1);

    // No such group, no such stream: parked anyway, nothing acknowledged; a ttl moves the
    // set's expiry past its latest due time.
    let (due, _, acked, _) = park(
        "s",
        "set",
        "histories",
        "gone",
        "1-1",
        60_000,
        String::new(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(acked, 0);
    let expires: i64 = cmd(&mut conn, &["PEXPIRETIME", "set"]).await;
    assert_eq!(expires, due + 60_000);
    assert_eq!(
        park("none", "set", "histories", "g", "1-2", 0, String::new())
            .await
            .unwrap()
            .unwrap()
            .2,
        0
    );
    assert_eq!(parked(&mut conn, "set").await, 3);

    // A set of another type: an error, and the entry stays pending. A history of another
    // type is skipped.
    pending_entries(&mut conn, "s2", &[LARGEST_MS]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong = error_of(park("s2", "text", "histories", "g", LARGEST_MS, 0, String::new()).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    assert_eq!(pending(&mut conn, "s2", "g").await, 1);
    let wrong = error_of(
        park(
            "text",
            "set",
            "histories",
            "g",
            LARGEST_MS,
            0,
            String::new(),
        )
        .await,
    );
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    assert_eq!(
        park("s2", "set2", "text", "g", LARGEST_MS, 0, note(LARGEST_MS))
            .await
            .unwrap()
            .unwrap()
            .2,
        1
    );
    assert_eq!(pending(&mut conn, "s2", "g").await, 0);
}

#[tokio::test]
async fn sweep_moves_its_own_due_members_to_the_lane_sealed() {
    let (_redis, mut conn) = redis().await;
    let now = server_ms(&mut conn).await;
    let ours = member_of("s", "g", ABOVE_2_53, 1);
    let legacy = member::encode_legacy(LARGEST_MS, 2, &fields(&[("payload", "y")]));
    let theirs = member_of("t", "h", "3-3", 1);
    let later = member_of("s", "g", "4-4", 1);
    let later_due = now + 3_600_000;
    for (score, m) in [(1, &ours), (2, &legacy), (3, &theirs), (later_due, &later)] {
        let _: i64 = raw(&mut conn, &[&"ZADD", &"set", &score, m]).await;
    }
    // The lane's group acknowledged 1-1 and holds 1-2: 1-1 goes before the copies come.
    pending_entries(&mut conn, "lane", &["1-1", "1-2"]).await;
    let _: i64 = cmd(&mut conn, &["XACK", "lane", "g", "1-1"]).await;
    let (moved, wait_us, _, dead, stuck, held): (i64, i64, i64, i64, i64, String) = eval(
        &mut conn,
        &SWEEP,
        &["lane", "set", "dl"],
        &[&sweep_options(false, 0)],
    )
    .await
    .unwrap();
    assert_eq!((moved, dead, stuck, held.as_str()), (2, 1, 0, ""));
    assert!(
        (3_590_000_000..=3_600_000_000).contains(&wait_us),
        "{wait_us}"
    );
    let left: Vec<Vec<u8>> = raw(&mut conn, &[&"ZRANGE", &"set", &0, &-1]).await;
    assert_eq!(left, [later]);

    let lane = raw_entries(&mut conn, "lane").await;
    assert_eq!(lane[0].0, "1-2");
    for ((_, copy), (member, due)) in lane[1..].iter().zip([(&ours, "1"), (&legacy, "2")]) {
        assert_eq!(raw_field(copy, keys::PARKED), Some(member.as_slice()));
        assert_eq!(raw_field(copy, keys::DUE_MS), Some(due.as_bytes()));
        let parts: [&[u8]; 4] = [b"s", b"g", member, due.as_bytes()];
        assert!(secret().verify(Seal::Lane, &parts, raw_field(copy, keys::MARK).unwrap()));
    }
    // Another subscription's member: dead-lettered raw, never delivered here.
    let dead = raw_entries(&mut conn, "dl").await;
    let letter = &dead[0].1;
    assert_eq!(raw_field(letter, keys::MEMBER), Some(theirs.as_slice()));
    let reason = String::from_utf8_lossy(raw_field(letter, keys::REASON).unwrap()).into_owned();
    assert!(
        reason.contains("parked by stream `t` group `h`"),
        "{reason}"
    );
    let parts: [&[u8]; 4] = [b"set", b"s", b"g", &theirs];
    assert!(secret().verify(Seal::Member, &parts, raw_field(letter, keys::MARK).unwrap()));

    // A lane whose group read up to the largest millisecond: the next id there is still one.
    let _: String = cmd(&mut conn, &["XADD", "lane2", LARGEST_MS, "f", "v"]).await;
    create_group(&mut conn, "lane2", "g", "0").await;
    read_as(&mut conn, "c", "lane2", ">").await;
    let _: i64 = cmd(&mut conn, &["XACK", "lane2", "g", LARGEST_MS]).await;
    let _: i64 = raw(&mut conn, &[&"ZADD", &"set2", &1, &ours]).await;
    let reply: (i64, i64, i64, i64, i64, String) = eval(
        &mut conn,
        &SWEEP,
        &["lane2", "set2", "dl"],
        &[&sweep_options(false, 0)],
    )
    .await
    .unwrap();
    assert_eq!((reply.0, reply.1), (1, -1));
    let lane2: Vec<String> = entries(&mut conn, "lane2")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(lane2, ["18446744073709551615-1"]);

    // Finding: a lane whose group read the last id there is (nothing pending) makes every pass
    // fail in the lane's trim (no id comes after it: XTRIM is given 18446744073709551616-0),
    // before anything moves; the member stays parked, nothing is lost.
    let _: String = cmd(&mut conn, &["XADD", "lane3", LAST_ID, "f", "v"]).await;
    create_group(&mut conn, "lane3", "g", "0").await;
    read_as(&mut conn, "c", "lane3", ">").await;
    let _: i64 = cmd(&mut conn, &["XACK", "lane3", "g", LAST_ID]).await;
    let _: i64 = raw(&mut conn, &[&"ZADD", &"set3", &1, &ours]).await;
    let failed = error_of(
        eval::<Value>(
            &mut conn,
            &SWEEP,
            &["lane3", "set3", "dl"],
            &[&sweep_options(false, 0)],
        )
        .await,
    );
    assert!(failed.contains("Invalid stream ID"), "{failed}");
    assert_eq!(parked(&mut conn, "set3").await, 1);
}

#[tokio::test]
async fn sweep_to_the_tail_holds_for_other_groups_unless_told() {
    let (_redis, mut conn) = redis().await;
    let ours = member_of("s", "g", ABOVE_2_53, 1);
    let _: i64 = raw(&mut conn, &[&"ZADD", &"set", &7, &ours]).await;
    create_group(&mut conn, "s", "g", "$").await;
    create_group(&mut conn, "s", "other", "$").await;
    let sweep = |conn: &mut MultiplexedConnection,
                 target: &'static str,
                 set: &'static str,
                 dl: &'static str,
                 options: Vec<u8>| {
        let mut conn = conn.clone();
        async move {
            eval::<(i64, i64, i64, i64, i64, String)>(
                &mut conn,
                &SWEEP,
                &[target, set, dl],
                &[&options],
            )
            .await
        }
    };
    let held = sweep(&mut conn, "s", "set", "dl", sweep_options(false, 0))
        .await
        .unwrap();
    assert_eq!((held.0, held.1, held.5.as_str()), (0, 0, "other"));
    assert_eq!(parked(&mut conn, "set").await, 1);

    let now = server_ms(&mut conn).await;
    let past = sweep(&mut conn, "s", "set", "dl", sweep_options(true, 60_000))
        .await
        .unwrap();
    assert_eq!((past.0, past.1, past.5.as_str()), (1, -1, "other"));
    let copy = raw_entries(&mut conn, "s").await.pop().unwrap().1;
    let own = fields(&[("payload", "x")]);
    assert_eq!(copy[..1], own[..]);
    assert_eq!(
        raw_field(&copy, keys::ORIGIN_ID),
        Some(ABOVE_2_53.as_bytes())
    );
    assert_eq!(raw_field(&copy, keys::RETRY_COUNT), Some(&b"1"[..]));
    let digest = keys::fields_digest(&own);
    let parts: [&[u8]; 6] = [
        b"s",
        b"g",
        ABOVE_2_53.as_bytes(),
        b"1",
        b"7",
        digest.as_bytes(),
    ];
    assert!(secret().verify(Seal::Tail, &parts, raw_field(&copy, keys::MARK).unwrap()));

    // A ttl: the set's expiry moves to ttl after its latest due time (or now).
    let later = member_of("s", "g", "8-8", 1);
    let later_due = now + 3_600_000;
    let _: i64 = raw(&mut conn, &[&"ZADD", &"set", &later_due, &later]).await;
    sweep(&mut conn, "s", "set", "dl", sweep_options(true, 60_000))
        .await
        .unwrap();
    let expires: i64 = cmd(&mut conn, &["PEXPIRETIME", "set"]).await;
    assert_eq!(expires, later_due + 60_000);

    // A member whose field Redis will not take: dead-lettered raw with Redis's reason.
    let nested = member_with_nested_field("s", "g", "9-9");
    let _: i64 = raw(&mut conn, &[&"ZADD", &"set", &1, &nested]).await;
    let reply = sweep(&mut conn, "s", "set", "dl", sweep_options(true, 0))
        .await
        .unwrap();
    assert_eq!((reply.0, reply.3), (0, 1));
    let dead = raw_entries(&mut conn, "dl").await;
    let reason = String::from_utf8_lossy(raw_field(&dead[0].1, keys::REASON).unwrap()).into_owned();
    assert!(reason.starts_with("cannot re-add the retry"), "{reason}");

    // A target of another type: dead-lettered; a dead-letter stream of another type too:
    // stuck in the set, and due now.
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let _: i64 = raw(&mut conn, &[&"ZADD", &"set4", &1, &ours]).await;
    let reply = sweep(&mut conn, "text", "set4", "dl", sweep_options(false, 0))
        .await
        .unwrap();
    assert_eq!((reply.0, reply.3, reply.4), (0, 1, 0));
    let _: i64 = raw(&mut conn, &[&"ZADD", &"set4", &1, &ours]).await;
    let reply = sweep(&mut conn, "text", "set4", "text", sweep_options(false, 0))
        .await
        .unwrap();
    assert_eq!((reply.0, reply.1, reply.3, reply.4), (0, 0, 0, 1));
    assert_eq!(parked(&mut conn, "set4").await, 1);

    let unreadable = error_of(sweep(&mut conn, "s", "set", "dl", b"garbage".to_vec()).await);
    assert!(
        unreadable.contains("sweep") && unreadable.contains("ARGV[1] is not the options map"),
        "{unreadable}"
    );
    let wrong = error_of(sweep(&mut conn, "lane", "text", "dl", sweep_options(false, 0)).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
}

/// The dead-letter script's arguments after the group and the entry id: no trim, a history
/// note, the history's keep, then `fields`.
async fn dead_letter(
    conn: &mut MultiplexedConnection,
    keys: [&str; 4],
    group: &str,
    id: &str,
    note: &str,
) -> RedisResult<Option<(String, i64)>> {
    eval(
        conn,
        &DEAD_LETTER,
        &keys,
        &[
            &group,
            &id,
            &0,
            &note,
            &5_000,
            &"payload",
            &"p",
            &keys::REASON,
            &"why",
        ],
    )
    .await
}

#[tokio::test]
async fn dead_letter_writes_first_and_acknowledges_last() {
    let (_redis, mut conn) = redis().await;
    pending_entries(&mut conn, "s", &[LARGEST_MS]).await;
    let all = ["s", "dl", "histories", "history-index"];
    let record = format!("{LARGEST_MS} 10 {{\"do\":\"dead-letter\"");
    let (id, acked) = dead_letter(&mut conn, all, "g", LARGEST_MS, &record)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(acked, 1);
    assert_eq!(pending(&mut conn, "s", "g").await, 0);
    let dead = entries(&mut conn, "dl").await;
    assert_eq!(
        dead,
        [(
            id.clone(),
            fields_text(&[("payload", "p"), (keys::REASON, "why")])
        )]
    );
    let history: String = cmd(&mut conn, &["HGET", "histories", LARGEST_MS]).await;
    assert!(
        history.ends_with(&format!(",\"dl\":\"{id}\"}}")),
        "{history}"
    );
    // Settled already (or a call made again after a lost reply): no second dead letter.
    assert_eq!(
        dead_letter(&mut conn, all, "g", LARGEST_MS, "")
            .await
            .unwrap(),
        None
    );
    assert_eq!(entries(&mut conn, "dl").await.len(), 1);

    // A dead-letter stream of another type: an error, and the entry stays pending.
    pending_entries(&mut conn, "s2", &[ABOVE_2_53]).await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong =
        error_of(dead_letter(&mut conn, ["s2", "text", "h", "hi"], "g", ABOVE_2_53, "").await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    assert_eq!(pending(&mut conn, "s2", "g").await, 1);
    // A history of another type is skipped.
    let (_, acked) = dead_letter(
        &mut conn,
        ["s2", "dl", "text", "text"],
        "g",
        ABOVE_2_53,
        &record,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(acked, 1);
    // The group or the stream gone: written all the same (the only copy), nothing acked.
    for (stream, group) in [("s2", "gone"), ("none", "g")] {
        let (_, acked) = dead_letter(&mut conn, [stream, "dl", "h", "hi"], group, "1-1", "")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(acked, 0, "{stream} {group}");
    }
    assert_eq!(entries(&mut conn, "dl").await.len(), 4);
    // A stream of another type: the pending check's error, nothing written.
    let wrong = error_of(dead_letter(&mut conn, ["text", "dl", "h", "hi"], "g", "1-1", "").await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    assert_eq!(entries(&mut conn, "dl").await.len(), 4);
}

/// Run the in-place dead-letter script for entry `id` of `stream`, sealed when `secret` is
/// not empty, packing past `max_fields` fields.
async fn dead_letter_in_place(
    conn: &mut MultiplexedConnection,
    (stream, dl, group): (&str, &str, &str),
    id: &str,
    secret: &str,
    max_fields: i32,
) -> RedisResult<Option<(String, i64)>> {
    eval(
        conn,
        &DEAD_LETTER_IN_PLACE,
        &[stream, dl, "histories", "history-index"],
        &[
            &group,
            &id,
            &0,
            &"",
            &5_000,
            &max_fields,
            &keys::PACKED_FIELDS,
            &secret,
            &Seal::DeadLetter.name(),
            &Seal::DeadLetterPacked.name(),
            &"s",
            &id,
            &keys::MARK,
            &keys::PRODUCER_PREFIX,
            &keys::REASON,
            &"too big",
        ],
    )
    .await
}

#[tokio::test]
async fn dead_letter_in_place_copies_the_fields_inside_redis() {
    let (_redis, mut conn) = redis().await;
    let _: String = cmd(
        &mut conn,
        &[
            "XADD",
            "s",
            ABOVE_2_53,
            "payload",
            "big",
            "sluice-reason",
            "forged",
            "producer:x",
            "y",
        ],
    )
    .await;
    create_group(&mut conn, "s", "g", "0").await;
    read_as(&mut conn, "c", "s", ">").await;
    let (_, acked) =
        dead_letter_in_place(&mut conn, ("s", "dl", "g"), ABOVE_2_53, SECRET_VALUE, 3_000)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(acked, 1);
    assert_eq!(pending(&mut conn, "s", "g").await, 0);
    let letter = raw_entries(&mut conn, "dl").await.pop().unwrap().1;
    // A producer's field named like the host's own goes in under another name.
    let written = fields(&[
        ("payload", "big"),
        ("producer:sluice-reason", "forged"),
        ("producer:producer:x", "y"),
    ]);
    assert_eq!(letter[..3], written[..]);
    assert_eq!(raw_field(&letter, keys::REASON), Some(&b"too big"[..]));
    let digest = keys::fields_digest(&written);
    let parts: [&[u8]; 4] = [b"s", b"g", ABOVE_2_53.as_bytes(), digest.as_bytes()];
    assert!(secret().verify(
        Seal::DeadLetter,
        &parts,
        raw_field(&letter, keys::MARK).unwrap()
    ));
    assert_eq!(
        dead_letter_in_place(&mut conn, ("s", "dl", "g"), ABOVE_2_53, "", 3_000)
            .await
            .unwrap(),
        None
    );

    // Past the most fields one XADD carries: packed into one, under its own seal's use.
    pending_entries(&mut conn, "s2", &[LARGEST_MS]).await;
    let _: String = cmd(
        &mut conn,
        &["XADD", "s3", "1-1", "a", "1", "b", "2", "c", "3"],
    )
    .await;
    create_group(&mut conn, "s3", "g", "0").await;
    read_as(&mut conn, "c", "s3", ">").await;
    dead_letter_in_place(&mut conn, ("s3", "dl", "g"), "1-1", SECRET_VALUE, 2)
        .await
        .unwrap()
        .unwrap();
    let letter = raw_entries(&mut conn, "dl").await.pop().unwrap().1;
    let packed = raw_field(&letter, keys::PACKED_FIELDS).unwrap().to_vec();
    let unpacked = rmpv::decode::read_value(&mut &packed[..]).unwrap();
    assert_eq!(unpacked.as_array().map(Vec::len), Some(6));
    let digest = keys::fields_digest(&[(keys::PACKED_FIELDS.as_bytes().to_vec(), packed)]);
    let parts: [&[u8]; 4] = [b"s", b"g", b"1-1", digest.as_bytes()];
    assert!(secret().verify(
        Seal::DeadLetterPacked,
        &parts,
        raw_field(&letter, keys::MARK).unwrap()
    ));

    // Deleted while pending: nothing to copy; acknowledged, nothing written.
    let before = raw_entries(&mut conn, "dl").await.len();
    let _: i64 = cmd(&mut conn, &["XDEL", "s2", LARGEST_MS]).await;
    assert_eq!(
        dead_letter_in_place(&mut conn, ("s2", "dl", "g"), LARGEST_MS, "", 3_000)
            .await
            .unwrap(),
        None
    );
    assert_eq!(pending(&mut conn, "s2", "g").await, 0);
    assert_eq!(raw_entries(&mut conn, "dl").await.len(), before);

    // A dead-letter stream of another type: an error, the entry stays pending; the group
    // gone: written all the same, nothing acknowledged.
    let _: String = cmd(&mut conn, &["XADD", "s3", "2-2", "a", "1"]).await;
    read_as(&mut conn, "c", "s3", ">").await;
    let _: () = cmd(&mut conn, &["SET", "text", "x"]).await;
    let wrong =
        error_of(dead_letter_in_place(&mut conn, ("s3", "text", "g"), "2-2", "", 3_000).await);
    assert!(wrong.contains("WRONGTYPE"), "{wrong}");
    assert_eq!(pending(&mut conn, "s3", "g").await, 1);
    let (_, acked) = dead_letter_in_place(&mut conn, ("s3", "dl", "gone"), "2-2", "", 3_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(acked, 0);
    assert_eq!(raw_entries(&mut conn, "dl").await.len(), before + 1);
}

/// The ordered keys' scripts (`pipeline/order/lua/`), key by key field `k`.
mod order {
    use super::*;
    use sluice_host::pipeline::order::{OrderKeys, digest};

    const STREAM: &str = "ord";

    fn keys() -> OrderKeys {
        OrderKeys::new(STREAM, "g")
    }

    /// The six keys every order script but release takes first.
    fn six(script: &Script) -> redis::ScriptInvocation<'_> {
        let k = keys();
        let mut inv = script.key(&k.names);
        inv.key(&k.waiting)
            .key(STREAM)
            .key("ord.delayed.lane")
            .key("ord.delayed")
            .key(&k.turns);
        inv
    }

    fn options(consumer: &str, count: u64, max_entry_bytes: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let pairs: Vec<(&str, Mp)> = vec![
            ("group", "g".into()),
            ("consumer", consumer.into()),
            ("count", count.into()),
            ("max_in_flight", 1u64.into()),
            (
                "prefix",
                sluice_host::store::keys::order_prefix(STREAM, "g").into(),
            ),
            ("field", "k".into()),
            ("pointer", "".into()),
            ("max_key_bytes", 4u64.into()),
            ("max_entry_bytes", max_entry_bytes.into()),
            ("field_overhead", 0u64.into()),
        ];
        let map = Mp::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect());
        rmpv::encode::write_value(&mut out, &map).unwrap();
        out
    }

    /// ack.lua acknowledging entry `1-0` of the stream, whose origin it is.
    fn ack_first() -> redis::ScriptInvocation<'static> {
        let mut inv = six(&ORDER_ACK);
        inv.arg("g")
            .arg(1)
            .arg(0)
            .arg(sluice_host::store::keys::order_prefix(STREAM, "g"))
            .arg("1-0")
            .arg(1)
            .arg("1-0");
        inv
    }

    /// Read as `consumer`: (ids that run with their digests, missing, too long, queued).
    async fn read(
        conn: &mut MultiplexedConnection,
        consumer: &str,
        count: u64,
    ) -> (Vec<(String, String)>, i64, i64, i64) {
        let reply: Value = six(&ORDER_READ)
            .arg(options(consumer, count, 1000))
            .invoke_async(conn)
            .await
            .unwrap();
        let Value::Array(parts) = reply else {
            panic!("{reply:?}")
        };
        let n = |v: &Value| match v {
            Value::Int(i) => *i,
            other => panic!("{other:?}"),
        };
        let run = parts[4..]
            .iter()
            .map(|row| {
                let (id, _, digest, _, _): (String, Vec<Vec<u8>>, String, u64, u64) =
                    FromRedisValue::from_redis_value(row.clone()).unwrap();
                (id, digest)
            })
            .collect();
        (run, n(&parts[1]), n(&parts[2]), n(&parts[3]))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_orders_a_keys_entries_by_id_whichever_consumer_reads_them() {
        let redis = Redis::start();
        let mut conn = redis.conn().await;
        for (id, key) in [
            ("1-0", "a"),
            ("2-0", "a"),
            ("3-0", "b"),
            ("4-0", "a"),
            ("5-0", ""),
        ] {
            let mut c = redis::cmd("XADD");
            c.arg(STREAM).arg(id).arg("payload").arg("x");
            if !key.is_empty() {
                c.arg("k").arg(key);
            }
            let _: String = c.query_async(&mut conn).await.unwrap();
        }
        let _: String = cmd(&mut conn, &["XADD", STREAM, "6-0", "k", "toolong"]).await;
        create_group(&mut conn, STREAM, "g", "0").await;
        // Consumer c1 reads 1 and 2, c2 the rest: a's 1 takes the turn, 2 and 4 wait in id order.
        let (run, missing, long, queued) = read(&mut conn, "c1", 2).await;
        assert_eq!(run, vec![("1-0".to_owned(), digest(b"a"))]);
        assert_eq!((missing, long, queued), (0, 0, 1));
        let (run, missing, long, queued) = read(&mut conn, "c2", 10).await;
        let ids: Vec<&str> = run.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["3-0", "5-0", "6-0"], "b, and the unkeyed ones, run");
        assert_eq!((missing, long, queued), (1, 1, 1));
        let wait: Vec<Vec<u8>> = cmd(
            &mut conn,
            &["LRANGE", &keys().wait(&digest(b"a")), "0", "-1"],
        )
        .await;
        let waiting: Vec<String> = wait
            .iter()
            .map(|m| member::decode(m, 0).unwrap().entry_id)
            .collect();
        assert_eq!(waiting, ["2-0", "4-0"], "queued in id order");
        // Queued entries are acknowledged; those that run are pending.
        assert_eq!(pending(&mut conn, STREAM, "g").await, 4);
        // Nothing more: the ids a blocking wait starts from.
        let reply: Value = six(&ORDER_READ)
            .arg(options("c1", 10, 1000))
            .invoke_async(&mut conn)
            .await
            .unwrap();
        let Value::Array(parts) = reply else { panic!() };
        let ids: Vec<String> = FromRedisValue::from_redis_value(parts[0].clone()).unwrap();
        assert_eq!(
            ids,
            ["6-0", ""],
            "the stream's last delivered; the lane has no group"
        );

        // ack.lua: acknowledging 1 gives a's turn to 2 (due now in the set), not to 4.
        let before = server_ms(&mut conn).await;
        let (acked, went): (i64, i64) = ack_first().invoke_async(&mut conn).await.unwrap();
        assert_eq!((acked, went), (1, 1));
        let due: Vec<(Vec<u8>, f64)> = cmd(
            &mut conn,
            &["ZRANGE", "ord.delayed", "0", "-1", "WITHSCORES"],
        )
        .await;
        assert_eq!(due.len(), 1);
        assert_eq!(member::decode(&due[0].0, 0).unwrap().entry_id, "2-0");
        assert!(due[0].1 as i64 >= before, "due now by the server's clock");
        // Acked again (a lost reply): no second release.
        let (acked, went): (i64, i64) = ack_first().invoke_async(&mut conn).await.unwrap();
        assert_eq!((acked, went), (0, 0));

        // take.lua: 2 (let in, read back as pending 3-0 here) holds the turn whatever key the
        // host makes of it; a newcomer of a waits; one no longer pending (1-0) takes nothing.
        let prefix = sluice_host::store::keys::order_prefix(STREAM, "g");
        let taken: Vec<i64> = six(&ORDER_TAKE)
            .arg("g")
            .arg(1)
            .arg(&prefix)
            .arg(digest(b"zz"))
            .arg("2-0")
            .arg(1)
            .arg("3-0")
            .arg(digest(b"a"))
            .arg("9-0")
            .arg(1)
            .arg("5-0")
            .arg(digest(b"c"))
            .arg("1-0")
            .arg(1)
            .arg("1-0")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(taken, [1, 0, -1]);
        let c: Option<String> = cmd(&mut conn, &["HGET", &keys().load, &digest(b"c")]).await;
        assert_eq!(c, None, "no turn for an entry someone else settled");

        // hold.lua: an entry no longer pending is left alone (-1).
        let held: Vec<i64> = six(&ORDER_HOLD)
            .arg("g")
            .arg(1)
            .arg(&prefix)
            .arg(digest(b"a"))
            .arg("9-0")
            .arg("a")
            .arg(1)
            .arg("9-0")
            .arg("member")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(held, [-1]);

        // forget.lua: 2 is gone (deleted while it held the turn): 4 goes in.
        let went: i64 = six(&ORDER_FORGET)
            .arg(sluice_host::store::keys::order_prefix(STREAM, "g"))
            .arg(1)
            .arg(0)
            .arg("2-0")
            .arg("never-held")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(went, 1);
        // release.lua: the operator gives 4's turn back; a has nothing left.
        let (turns, went) = sluice_host::pipeline::order::release(
            &mut conn,
            &keys(),
            "ord.delayed",
            &digest(b"a"),
            1,
            0,
        )
        .await
        .unwrap();
        assert_eq!((turns, went), (1, 0));
        // b still holds its turn (3 in flight); a's state is gone, names with it (only keys
        // with entries waiting have one).
        let names: Vec<String> = cmd(&mut conn, &["HKEYS", &keys().names]).await;
        assert!(names.is_empty(), "{names:?}");
        let turns: Vec<String> = cmd(&mut conn, &["HKEYS", &keys().turns]).await;
        assert_eq!(turns, ["3-0"]);
        let load: Vec<String> = cmd(&mut conn, &["HGETALL", &keys().load]).await;
        assert_eq!(
            load,
            [digest(b"b"), "1".to_owned()],
            "only b holds or waits"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_with_a_stale_listing_gives_back_only_what_still_holds() {
        let redis = Redis::start();
        let mut conn = redis.conn().await;
        for id in ["1-0", "2-0", "3-0"] {
            let _: String = cmd(&mut conn, &["XADD", STREAM, id, "k", "a"]).await;
        }
        create_group(&mut conn, STREAM, "g", "0").await;
        let (run, _, _, queued) = read(&mut conn, "c", 10).await;
        assert_eq!((run.len(), queued), (1, 2));
        let base = conn.clone();
        let load = || {
            let mut conn = base.clone();
            async move {
                let n: Option<String> =
                    cmd(&mut conn, &["HGET", &keys().load, &digest(b"a")]).await;
                n
            }
        };
        assert_eq!(load().await.as_deref(), Some("3"), "one holds, two wait");
        // The operator's listing saw 1-0 holding; 1-0 settles and lets 2-0 in first.
        let (_, went): (i64, i64) = ack_first().invoke_async(&mut conn).await.unwrap();
        assert_eq!(went, 1);
        let release = |origins: &'static [&'static str]| {
            let mut conn = base.clone();
            async move {
                let mut inv = ORDER_RELEASE.key(&keys().names);
                inv.key(&keys().waiting)
                    .key("ord.delayed")
                    .key(&keys().load)
                    .key(keys().wait(&digest(b"a")))
                    .key(&keys().turns)
                    .arg(digest(b"a"))
                    .arg(1)
                    .arg(0)
                    .arg(sluice_host::store::keys::order_prefix(STREAM, "g"));
                for origin in origins {
                    inv.arg(*origin);
                }
                let given: (i64, i64) = inv.invoke_async(&mut conn).await.unwrap();
                given
            }
        };
        assert_eq!(
            release(&["1-0"]).await,
            (0, 0),
            "nothing of the listing holds"
        );
        assert_eq!(load().await.as_deref(), Some("2"), "2-0 holds, 3-0 waits");
        assert_eq!(release(&["2-0"]).await, (1, 1), "2-0's turn back, 3-0 in");
        assert_eq!(load().await.as_deref(), Some("1"));
        let turns: Vec<String> = cmd(&mut conn, &["HKEYS", &keys().turns]).await;
        assert_eq!(turns, ["3-0"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_entry_delivered_again_after_the_group_is_set_back_runs_on_its_own_turn() {
        let redis = Redis::start();
        let mut conn = redis.conn().await;
        let _: String = cmd(&mut conn, &["XADD", STREAM, "1-0", "k", "a"]).await;
        create_group(&mut conn, STREAM, "g", "0").await;
        let (run, _, _, _) = read(&mut conn, "c", 10).await;
        assert_eq!(run.len(), 1);
        let _: () = cmd(&mut conn, &["XGROUP", "SETID", STREAM, "g", "0"]).await;
        let (run, _, _, queued) = read(&mut conn, "c", 10).await;
        assert_eq!((run.len(), queued), (1, 0), "not queued behind itself");
        let load: String = cmd(&mut conn, &["HGET", &keys().load, &digest(b"a")]).await;
        assert_eq!(load, "1", "counted once");
        let (acked, _): (i64, i64) = ack_first().invoke_async(&mut conn).await.unwrap();
        assert_eq!(acked, 1);
        let left: u64 = cmd(&mut conn, &["HLEN", &keys().load]).await;
        assert_eq!(left, 0, "its turn given back, the key free");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_strangers_key_at_a_wait_list_fails_the_read_before_it_writes() {
        let redis = Redis::start();
        let mut conn = redis.conn().await;
        for (id, key) in [("1-0", "a"), ("2-0", "a"), ("3-0", "b")] {
            let _: String = cmd(&mut conn, &["XADD", STREAM, id, "k", key]).await;
        }
        create_group(&mut conn, STREAM, "g", "0").await;
        let _: () = cmd(&mut conn, &["SET", &keys().wait(&digest(b"a")), "x"]).await;
        let failed: RedisResult<Value> = six(&ORDER_READ)
            .arg(options("c", 10, 1000))
            .invoke_async(&mut conn)
            .await;
        let err = failed.unwrap_err().to_string();
        assert!(
            err.contains("ordered keys") && err.contains("is a string"),
            "{err}"
        );
        let turns: u64 = cmd(&mut conn, &["HLEN", &keys().turns]).await;
        let load: u64 = cmd(&mut conn, &["HLEN", &keys().load]).await;
        assert_eq!((turns, load), (0, 0), "nothing written");
        assert_eq!(pending(&mut conn, STREAM, "g").await, 3, "read again later");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unorder_moves_every_queued_entry_to_the_set_and_forgets_the_turns() {
        let redis = Redis::start();
        let mut conn = redis.conn().await;
        for id in ["1-0", "2-0", "3-0", "4-0"] {
            let _: String = cmd(&mut conn, &["XADD", STREAM, id, "k", "a"]).await;
        }
        let _: String = cmd(&mut conn, &["XADD", STREAM, "5-0", "k", "b"]).await;
        let _: String = cmd(&mut conn, &["XADD", STREAM, "6-0", "k", "b"]).await;
        create_group(&mut conn, STREAM, "g", "0").await;
        let (run, _, _, queued) = read(&mut conn, "c", 10).await;
        assert_eq!((run.len(), queued), (2, 4));
        let prefix = sluice_host::store::keys::order_prefix(STREAM, "g");
        let base = conn.clone();
        let unorder = |keys_per_call: i64| {
            let (mut conn, prefix) = (base.clone(), prefix.clone());
            async move {
                let reply: (i64, i64) = ORDER_UNORDER
                    .key(&keys().names)
                    .key(&keys().waiting)
                    .key("ord.delayed")
                    .key(&keys().turns)
                    .arg(&prefix)
                    .arg(0)
                    .arg(keys_per_call)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                reply
            }
        };
        // One key a call: a's three go, b is left; what a still counts is its holder (were
        // the ordering back now, a would not stall on entries no longer there).
        assert_eq!(unorder(1).await, (3, 1));
        let a: String = cmd(&mut conn, &["HGET", &keys().load, &digest(b"a")]).await;
        assert_eq!(a, "1");
        assert_eq!(unorder(1).await, (1, 0));
        let set: u64 = cmd(&mut conn, &["ZCARD", "ord.delayed"]).await;
        assert_eq!(set, 4);
        let left: Vec<String> = cmd(&mut conn, &["KEYS", &format!("{prefix}*")]).await;
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_sends_an_entry_over_the_limit_back_without_its_fields_and_unordered() {
        let redis = Redis::start();
        let mut conn = redis.conn().await;
        let big = "x".repeat(2000);
        let _: String = cmd(
            &mut conn,
            &["XADD", STREAM, "1-0", "k", "a", "payload", &big],
        )
        .await;
        create_group(&mut conn, STREAM, "g", "0").await;
        let reply: Value = six(&ORDER_READ)
            .arg(options("c", 10, 1000))
            .invoke_async(&mut conn)
            .await
            .unwrap();
        let Value::Array(parts) = reply else { panic!() };
        let (id, fields, digest, over, n): (String, Vec<Vec<u8>>, String, u64, u64) =
            FromRedisValue::from_redis_value(parts[4].clone()).unwrap();
        assert_eq!(
            (id.as_str(), fields.len(), digest.as_str(), n),
            ("1-0", 0, "", 2)
        );
        assert!(over > 2000);
        // A stranger's string at the key's turns: the script fails, the entry stays pending.
        let _: String = cmd(&mut conn, &["XADD", STREAM, "2-0", "k", "a"]).await;
        let _: () = cmd(&mut conn, &["SET", &keys().load, "not a hash"]).await;
        let failed: RedisResult<Value> = six(&ORDER_READ)
            .arg(options("c", 10, 1000))
            .invoke_async(&mut conn)
            .await;
        assert!(failed.is_err());
        assert_eq!(
            pending(&mut conn, STREAM, "g").await,
            2,
            "delivered, pending, read again"
        );
        let bad: RedisResult<Value> = six(&ORDER_READ)
            .arg("not msgpack")
            .invoke_async(&mut conn)
            .await;
        assert!(bad.unwrap_err().to_string().contains("not the options map"));
    }
}

/// The dedupe duplicates script's options for group `g`, consumer `c` (as `acknowledge` in
/// pipeline/dedupe/mod.rs writes them).
fn dedupe_options() -> Vec<u8> {
    options(vec![
        ("group", Mp::from("g")),
        ("consumer", Mp::from("c")),
        ("history_cap", Mp::from(10)),
        ("history_keep_ms", Mp::from(60_000)),
    ])
}

const DEDUPE_KEYS: [&str; 4] = ["s", "counts", "histories", "index"];

#[tokio::test]
async fn duplicates_acks_each_pending_duplicate_once_and_names_its_first_entry() {
    let (_redis, mut conn) = redis().await;
    let _: () = cmd(&mut conn, &["XGROUP", "CREATE", "s", "g", "0", "MKSTREAM"]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id: String = cmd(&mut conn, &["XADD", "s", "*", "f", "v"]).await;
        ids.push(id);
    }
    let _: Value = cmd(
        &mut conn,
        &["XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"],
    )
    .await;
    let opts = dedupe_options();
    let args: [&dyn Arg; 5] = [&opts, &ids[1], &ids[0], &ids[2], &ids[0]];
    let acked: i64 = eval(&mut conn, &DEDUPE_DUPLICATES, &DEDUPE_KEYS, &args)
        .await
        .unwrap();
    assert_eq!(acked, 2);
    // Run again (a host that lost the reply): nothing is pending, nothing counted twice.
    let again: i64 = eval(&mut conn, &DEDUPE_DUPLICATES, &DEDUPE_KEYS, &args)
        .await
        .unwrap();
    assert_eq!(again, 0);
    let pending: Value = cmd(&mut conn, &["XPENDING", "s", "g"]).await;
    let pending: Vec<Value> = FromRedisValue::from_redis_value(pending).unwrap();
    assert_eq!(text(&pending[0]), "1", "the first entry stays pending");
    let counted: String = cmd(&mut conn, &["HGET", "counts", "duplicates"]).await;
    assert_eq!(counted, "2");
    let history: String = cmd(&mut conn, &["HGET", "histories", &ids[1]]).await;
    let record: serde_json::Value = serde_json::from_str(&history).unwrap();
    assert_eq!(
        (record["do"].as_str(), record["of"].as_str()),
        (Some("duplicate"), Some(ids[0].as_str()))
    );
    assert!(record["at"].as_i64().unwrap() > 0);
    // A key of another type at the counts: refused before anything is acknowledged.
    let id: String = cmd(&mut conn, &["XADD", "s", "*", "f", "v"]).await;
    let _: Value = cmd(
        &mut conn,
        &["XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"],
    )
    .await;
    let _: () = cmd(&mut conn, &["DEL", "counts"]).await;
    let _: () = cmd(&mut conn, &["SET", "counts", "x"]).await;
    let refused = eval::<Value>(
        &mut conn,
        &DEDUPE_DUPLICATES,
        &DEDUPE_KEYS,
        &[&opts, &id, &ids[0]],
    )
    .await;
    let refused = error_of(refused);
    assert!(refused.contains("counts is a string"), "{refused}");
    let pending: Value = cmd(&mut conn, &["XPENDING", "s", "g"]).await;
    let pending: Vec<Value> = FromRedisValue::from_redis_value(pending).unwrap();
    assert_eq!(text(&pending[0]), "2");
    // Odd arguments: refused.
    let odd = eval::<Value>(&mut conn, &DEDUPE_DUPLICATES, &DEDUPE_KEYS, &[&opts, &id]).await;
    assert!(error_of(odd).contains("pairs"));
}

/// The schedule script's options for stream `s`, group `g` (as `schedule` in
/// control/operate/schedule.rs writes them).
fn schedule_options(at_ms: i64, in_ms: u64, ttl_ms: u64) -> Vec<u8> {
    options(vec![
        ("stream", Mp::from("s")),
        ("group", Mp::from("g")),
        ("seq", Mp::from("1234567890123456789")),
        ("at_ms", Mp::from(at_ms)),
        ("in_ms", Mp::from(in_ms)),
        ("max_ahead_ms", Mp::from(3_600_000)),
        ("max_past_ms", Mp::from(60_000)),
        ("ttl_ms", Mp::from(ttl_ms)),
    ])
}

#[tokio::test]
async fn schedule_adds_a_first_attempt_member_due_by_the_servers_clock_within_bounds() {
    let (_redis, mut conn) = redis().await;
    let now = server_ms(&mut conn).await;
    let (id, due, at): (String, i64, i64) = eval(
        &mut conn,
        &SCHEDULE,
        &["set"],
        &[&schedule_options(0, 5_000, 0), &"payload", &"{}"],
    )
    .await
    .unwrap();
    assert!(
        (due - at - 5_000).abs() <= 1 && at >= now,
        "{due} {at} {now}"
    );
    assert_eq!(id, format!("{at}-1234567890123456789"));
    let members: Vec<(Vec<u8>, f64)> =
        cmd(&mut conn, &["ZRANGE", "set", "0", "-1", "WITHSCORES"]).await;
    let parked = member::decode(&members[0].0, members[0].1 as i64).unwrap();
    assert!(parked.is_scheduled());
    assert_eq!(
        (parked.origin_id.as_str(), parked.entry_id.as_str()),
        (id.as_str(), id.as_str())
    );
    assert_eq!(parked.owner, Some(("s".into(), "g".into())));
    assert_eq!(parked.fields, fields(&[("payload", "{}")]));
    // A time a little in the past is due now; too far back or ahead is refused by name.
    let (_, due, at): (String, i64, i64) = eval(
        &mut conn,
        &SCHEDULE,
        &["set"],
        &[&schedule_options(now - 10_000, 0, 0), &"f", &"v"],
    )
    .await
    .unwrap();
    assert_eq!(due, at);
    let past = eval::<Value>(
        &mut conn,
        &SCHEDULE,
        &["set"],
        &[&schedule_options(now - 120_000, 0, 0), &"f", &"v"],
    )
    .await;
    assert!(error_of(past).contains("in the past"));
    let ahead = eval::<Value>(
        &mut conn,
        &SCHEDULE,
        &["set"],
        &[&schedule_options(0, 7_200_000, 0), &"f", &"v"],
    )
    .await;
    assert!(error_of(ahead).contains("ahead"));
    // With a ttl the set outlives its latest due time by the ttl. (Other fields: the test's
    // fixed sequence number would make the member equal to one written in the same ms.)
    let _: (String, i64, i64) = eval(
        &mut conn,
        &SCHEDULE,
        &["set"],
        &[&schedule_options(0, 3_000_000, 10_000), &"f", &"w"],
    )
    .await
    .unwrap();
    let ttl: i64 = cmd(&mut conn, &["PTTL", "set"]).await;
    assert!(ttl > 3_000_000 && ttl <= 3_010_000, "{ttl}");
    // Another program's key at the set: refused, nothing written.
    let _: () = cmd(&mut conn, &["SET", "other", "x"]).await;
    let wrong = eval::<Value>(
        &mut conn,
        &SCHEDULE,
        &["other"],
        &[&schedule_options(0, 1_000, 0), &"f", &"v"],
    )
    .await;
    assert!(error_of(wrong).contains("not the delayed-retry set"));
}

/// The fire script's options for tick `tick_ms` of stream `s`, group `g` (as `fire` in
/// control/schedules/mod.rs writes them).
fn fire_options(tick_ms: i64, ttl_ms: u64) -> Vec<u8> {
    options(vec![
        ("tick_ms", Mp::from(tick_ms)),
        ("stream", Mp::from("s")),
        ("group", Mp::from("g")),
        ("id", Mp::from(format!("{tick_ms}-1000000000000000007"))),
        ("lead_ms", Mp::from(2_000)),
        ("ttl_ms", Mp::from(ttl_ms)),
        ("keep_ms", Mp::from(60_000)),
    ])
}

#[tokio::test]
async fn fire_writes_each_tick_once_forward_only_and_not_far_ahead() {
    let (_redis, mut conn) = redis().await;
    let now = server_ms(&mut conn).await;
    let tick = now - now % 1000 + 1000;
    let shared = conn.clone();
    let fire = |tick: i64, ttl: u64| {
        let mut conn = shared.clone();
        async move {
            let (fired, _now, last): (i64, i64, i64) = eval(
                &mut conn,
                &FIRE,
                &["record", "set"],
                &[&fire_options(tick, ttl), &"payload", &"{}"],
            )
            .await
            .unwrap();
            (fired, last)
        }
    };
    assert_eq!(fire(tick, 0).await, (1, 0));
    // Every other host's try of the same tick, or of an earlier one, writes nothing.
    assert_eq!(fire(tick, 0).await, (0, tick));
    assert_eq!(fire(tick - 1000, 0).await, (0, tick));
    let members: Vec<(Vec<u8>, f64)> =
        cmd(&mut conn, &["ZRANGE", "set", "0", "-1", "WITHSCORES"]).await;
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].1 as i64, tick, "due at the tick");
    let parked = member::decode(&members[0].0, tick).unwrap();
    assert!(parked.is_scheduled());
    assert_eq!(parked.origin_id, format!("{tick}-1000000000000000007"));
    // A tick far ahead of Redis's clock (a host whose clock is off) is refused.
    assert_eq!(fire(now + 60_000, 0).await, (0, tick));
    // A tick already past (a missed one, fired once) is due now; with a ttl the set lives on.
    let (s, _): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let _: () = cmd(&mut conn, &["SET", "record", "1000"]).await;
    assert_eq!(fire(tick - 5000, 10_000).await, (1, 1000));
    let ttl: i64 = cmd(&mut conn, &["PTTL", "set"]).await;
    assert!(ttl > 9_000, "{ttl} (now {s})");
    // Another program's key at the record: refused.
    let _: () = cmd(&mut conn, &["DEL", "record"]).await;
    let _: () = cmd(&mut conn, &["HSET", "record", "a", "b"]).await;
    let wrong = eval::<Value>(
        &mut conn,
        &FIRE,
        &["record", "set"],
        &[&fire_options(tick + 1000, 0), &"f", &"v"],
    )
    .await;
    assert!(error_of(wrong).contains("not the string"));
}
