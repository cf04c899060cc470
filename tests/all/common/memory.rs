//! What a host process holds in memory, and what its dead letters hold, read without bringing
//! a big entry into the test.

use redis::aio::ConnectionLike;

/// What each dead letter of a stream holds, read inside Redis (its fields never come here):
/// its reason, its origin id, the length of its `blob` field, how many fields it has, and the
/// length of its packed fields (an entry of more fields than one XADD from a script takes).
#[derive(Debug)]
pub struct LetterSummary {
    pub reason: String,
    pub origin: String,
    pub blob: i64,
    pub fields: i64,
    pub packed: i64,
}

/// [`LetterSummary`] of each dead letter of `stream` (group `g`'s default dead-letter stream).
pub async fn letter_summaries(conn: &mut impl ConnectionLike, stream: &str) -> Vec<LetterSummary> {
    letters_in(conn, &super::dead_letter_key(stream)).await
}

/// [`LetterSummary`] of each entry of the dead-letter stream `key`.
pub async fn letters_in(conn: &mut impl ConnectionLike, key: &str) -> Vec<LetterSummary> {
    let rows: Vec<(String, String, i64, i64, i64)> = redis::cmd("EVAL")
        .arg(
            "local out = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
             local f, got = e[2], {'', '', 0, #e[2] / 2, 0} for i = 1, #f, 2 do \
             if f[i] == 'sluice-reason' then got[1] = f[i + 1] end \
             if f[i] == 'sluice-packed-fields' then got[5] = #f[i + 1] end \
             if f[i] == 'sluice-origin-id' then got[2] = f[i + 1] end \
             if f[i] == 'blob' then got[3] = #f[i + 1] end end \
             out[#out + 1] = got end return out",
        )
        .arg(1)
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    rows.into_iter()
        .map(|(reason, origin, blob, fields, packed)| LetterSummary {
            reason,
            origin,
            blob,
            fields,
            packed,
        })
        .collect()
}

/// The resident memory of process `pid`, in bytes.
pub fn resident(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:") * 1024
}

/// The most resident memory process `pid` has had, in bytes.
pub fn peak_resident(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:") * 1024
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// Add an entry to `stream` that acks (as the fixture reads it) with a `blob` of `bytes` bytes;
/// its id.
pub async fn add_blob(conn: &mut impl ConnectionLike, stream: &str, bytes: usize) -> String {
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("payload")
        .arg(super::Control::Ack.to_string())
        .arg("blob")
        .arg(vec![b'x'; bytes])
        .query_async(conn)
        .await
        .unwrap()
}

/// Make the next entry of `stream` pending to consumer `gone` of group `g`, read inside Redis
/// (its fields never come here).
pub async fn pend_to_gone(conn: &mut impl ConnectionLike, stream: &str) {
    let _: i64 = redis::cmd("EVAL")
        .arg("redis.call('XREADGROUP', 'GROUP', 'g', 'gone', 'COUNT', 1, 'STREAMS', KEYS[1], '>') return 1")
        .arg(1)
        .arg(stream)
        .query_async(conn)
        .await
        .unwrap();
}

/// Check that `host` dead-lettered the entry `origin` (a `blob` of `blob` bytes) to `letters`
/// unhandled, copied whole, as its only dead letter, without ever holding it: its peak resident
/// memory stays under 150 MiB.
pub async fn assert_dead_lettered_unread(
    conn: &mut impl ConnectionLike,
    letters: &str,
    (origin, blob): (&str, usize),
    host: &super::HostProcess,
) {
    let found = letters_in(conn, letters).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].reason.contains("over max_entry_bytes"),
        "{found:?}"
    );
    assert_eq!((&*found[0].origin, found[0].blob), (origin, blob as i64));
    let peak = peak_resident(host.pid());
    eprintln!(
        "host peak resident memory: {} MiB (the entry: {} MB)",
        peak >> 20,
        blob / 1_000_000
    );
    assert!(peak < 150 << 20, "peak resident {} MiB", peak >> 20);
    assert!(!host.log_text().contains("attempt failed"), "never handled");
}
