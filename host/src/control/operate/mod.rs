//! Acting on what waits: the dead letters and parked retries an operator looks at after a bad
//! night, and the operations on them (requeue, retry now, delete, dead-letter now).
//!
//! One implementation behind three ways in: the CLI (`sluice dead-letters`, `requeue`,
//! `retry-now`, `delete`), the admin API (`/v1/subscriptions/{stream}/{group}/dead-letters` and
//! `/parked`) and the admin web page all call these functions.
//!
//! Every operation that moves an entry is one Lua script per entry (or per batch of at most
//! [`BATCH`]), so a crash of the caller, a concurrent host sweeping, or a second operator
//! doing the same never loses or doubles an entry: each script first checks the entry is still
//! where the operator saw it, then writes its new place, then removes the old one. Listings
//! page with id and score cursors (XREVRANGE from an id, ZRANGE from a score): nothing reads
//! a whole large key at once.
//!
//! - [`dead_letters`]: list (newest first), show one, requeue (back onto the stream with the
//!   attempt count reset and a `sluice-requeued-from` field), delete.
//! - [`parked`]: list (due order), retry now (due immediately; the next sweep moves it),
//!   delete, dead-letter now (with the operator's reason).
//! - [`entry`]: one entry, whole: its fields, where it is now and its history.
//! - [`filter`]: which entries an operator means (a payload field, retries, times);
//!   [`jobs`]: acting on every match as one server-side job, with progress.
//! - [`schedule`]: an entry sent for later waits in the delayed set as a first attempt.

pub mod dead_letters;
pub mod entry;
pub mod filter;
pub mod jobs;
pub mod parked;
pub mod schedule;

/// The most entries one listing page or one script call handles.
pub const BATCH: usize = 128;

/// What an operator's view of an entry (the admin page, the API's listings, an entry's page)
/// shows of one name or value, and of one entry in all: an entry over `max_entry_bytes` is
/// dead-lettered whole, and a page of such letters read whole took the host past 900 MB (the
/// attack review of issue 52). Requeues, replays and the CLI read entries whole.
pub const VIEW_VALUE_BYTES: usize = 256 << 10;
/// See [`VIEW_VALUE_BYTES`].
pub const VIEW_ENTRY_BYTES: usize = 1 << 20;

/// Up to `count` entries of `key` between `bounds` (XREVRANGE when `reverse`), each cut for
/// display as [`VIEW_VALUE_BYTES`] and [`VIEW_ENTRY_BYTES`] say, inside Redis.
pub async fn view_range<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    key: &str,
    reverse: bool,
    bounds: (&str, &str),
    count: usize,
) -> redis::RedisResult<Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>> {
    static VIEW: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(crate::store::lua!("control/operate/lua/view_range"))
    });
    VIEW.key(key)
        .arg(if reverse { "XREVRANGE" } else { "XRANGE" })
        .arg(bounds.0)
        .arg(bounds.1)
        .arg(count)
        .arg(VIEW_VALUE_BYTES)
        .arg(VIEW_ENTRY_BYTES)
        .invoke_async(conn)
        .await
}

/// Why an operation could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum OperateError {
    /// Redis refused or could not be reached.
    #[error("Redis: {}", crate::store::redis_conn::ErrorClass::of(.0).describe())]
    Redis(#[from] redis::RedisError),
    /// The stream's secret could not be read.
    #[error(transparent)]
    Secret(#[from] crate::store::keys::SecretError),
    /// The dead letter cannot go back onto the stream as it is.
    #[error("dead letter {id} cannot be requeued: {why}")]
    NotRequeueable {
        /// The dead letter's id.
        id: String,
        /// Why.
        why: String,
    },
    /// The request names no operation this module knows.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A cursor the caller passed is not one this module handed out.
    #[error("invalid cursor {0:?}")]
    Cursor(String),
    /// A pause or resume could not be written.
    #[error(transparent)]
    Flow(#[from] crate::pipeline::admit::FlowError),
}

/// One page of a listing, and where the next page starts (`None`: this was the last).
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// The items, in listing order.
    pub items: Vec<T>,
    /// Pass back to get the next page.
    pub next: Option<String>,
}

/// Bytes as text for a terminal, a JSON answer or a page: UTF-8 as it is (control characters
/// escaped), anything else as `0x` hex. Entries are untrusted: a page must still HTML-escape it.
pub fn printable(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.escape_debug().to_string(),
        Err(_) => format!("0x{}", hex::encode(bytes)),
    }
}

/// An epoch-milliseconds time as RFC 3339 (UTC).
pub fn format_ms(ms: i64) -> String {
    crate::support::when::rfc3339_ms(ms)
}

/// Fields as `[[name, value], ...]`: UTF-8 text as it is (JSON escapes it once; a reader gets
/// the bytes Redis holds), other bytes as `0x` and hex. Not [`printable`]: its escapes, escaped
/// again by JSON, made `{"id":1}` read back as `{\"id\":1}` (issue 53).
fn fields_json(fields: &[(Vec<u8>, Vec<u8>)]) -> serde_json::Value {
    let text = |bytes: &[u8]| match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("0x{}", hex::encode(bytes)),
    };
    fields
        .iter()
        .map(|(n, v)| serde_json::json!([text(n), text(v)]))
        .collect()
}
