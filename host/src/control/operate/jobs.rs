//! Acting on every waiting entry a [`Filter`] matches, as one job on the server: requeue or
//! delete dead letters, retry now or delete parked entries. A job walks the whole key in
//! batches of [`BATCH`], each entry moved by the same one-script-per-entry operations as the
//! single actions (so a job killed half-way leaves every entry in one place, moved or not), and
//! writes its progress after each batch to `<prefix>:last`, a hash any host reads.
//!
//! Attacks (docs/design/operator-page.md): a job started twice, by two operators or two hosts,
//! is refused while the first holds `<prefix>:lease` (taken with `SET NX PX`, renewed each
//! batch); should two run anyway (a lease lost to a pause longer than [`LEASE`]), each entry
//! still moves once, since each script first checks the entry is where it was seen. A count
//! ([`count`]) scans at most [`MAX_SCAN`] entries for at most [`SCAN_TIME`]: a filter cannot make
//! one request read a million entries.

use std::collections::HashSet;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::dead_letters::{self, DeadLetter, Owner};
use super::filter::{Candidate, Filter};
use super::parked::{self, Parked};
use super::{BATCH, OperateError};
use crate::store::keys::{Secret, SubscriptionKeys};

/// The most entries one count scans.
pub const MAX_SCAN: usize = 100_000;
/// The longest one count scans.
pub const SCAN_TIME: Duration = Duration::from_secs(3);
/// How long a job's lease lasts unless renewed (each batch renews it).
pub const LEASE: Duration = Duration::from_secs(15);

/// Which waiting entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Of {
    /// The dead-letter stream.
    DeadLetters,
    /// The delayed set (parked retries and scheduled entries).
    Parked,
    /// The group's entries in flight (pending to a consumer): counted and listed, not acted on
    /// (a host is handling them, or takes them over from a consumer that is gone).
    Pending,
}

impl Of {
    /// Its name in words ("dead letters").
    pub fn name(self) -> &'static str {
        match self {
            Self::DeadLetters => "dead letters",
            Self::Parked => "parked entries",
            Self::Pending => "pending entries",
        }
    }

    /// Its name in a query or a form (`of=dead-letters`).
    pub fn param(self) -> &'static str {
        match self {
            Self::DeadLetters => "dead-letters",
            Self::Parked => "parked",
            Self::Pending => "pending",
        }
    }
}

/// What a job does to each match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobAction {
    /// Dead letters back onto the stream.
    Requeue,
    /// Parked entries due now.
    RetryNow,
    /// Remove for good.
    Delete,
}

impl JobAction {
    /// Whether it applies to `of`.
    pub fn applies_to(self, of: Of) -> bool {
        matches!(
            (self, of),
            (Self::Requeue | Self::Delete, Of::DeadLetters)
                | (Self::RetryNow | Self::Delete, Of::Parked)
        )
    }

    /// Its name, as forms and records say it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Requeue => "requeue",
            Self::RetryNow => "retry-now",
            Self::Delete => "delete",
        }
    }
}

/// Where a walk over a key stands.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Dead letters: the last id seen; parked: the listing's cursor (`<score>:<skip>`).
    cursor: Option<String>,
    /// Dead letters: the newest id when the walk began; letters written after it (requeued
    /// ones that failed again) are not this job's.
    until: Option<String>,
    /// Parked entries matched so far, by origin id: each is acted on once per job, whether
    /// it moved meanwhile (made due) or came back as a new retry of the same entry.
    seen: HashSet<String>,
    /// Entries looked at.
    pub scanned: u64,
    /// Whether the whole key was walked.
    pub done: bool,
}

impl Walk {
    /// A walk over `of` from its start: for dead letters, up to the newest now.
    pub async fn begin<C: ConnectionLike>(
        conn: &mut C,
        scope: &Scope<'_>,
        of: Of,
    ) -> Result<Self, OperateError> {
        let mut walk = Self::default();
        if of == Of::DeadLetters {
            let newest: Vec<RawEntry> = redis::cmd("XREVRANGE")
                .arg(&*scope.keys.dead_letter)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(conn)
                .await?;
            match newest.into_iter().next() {
                Some((id, _)) => walk.until = Some(id),
                None => walk.done = true,
            }
        }
        Ok(walk)
    }

    /// Walk the key again from its start (a parked job's next pass), keeping what was seen.
    pub fn again(&mut self) {
        self.cursor = None;
        self.done = false;
    }

    /// Parked: `gone` of the entries the last page showed at the cursor's due time were
    /// removed or moved since (by this job): the cursor counts positions, so it counts them
    /// no more (else as many unhandled entries would be skipped).
    fn moved_at_cursor(&mut self, gone: usize) {
        let Some((score, skip)) = self.cursor.as_deref().and_then(|c| c.split_once(':')) else {
            return;
        };
        let skip = skip.parse::<usize>().unwrap_or(0).saturating_sub(gone);
        self.cursor = Some(format!("{score}:{skip}"));
    }

    /// The cursor's due time (parked).
    fn cursor_score(&self) -> Option<i64> {
        self.cursor.as_deref()?.split_once(':')?.0.parse().ok()
    }
}

/// One matching entry.
pub enum Item {
    /// A dead letter.
    Dead(Box<DeadLetter>),
    /// A parked entry.
    Parked(Parked),
    /// A pending entry: its id.
    Pending(String),
}

/// What a job or a count is about: a subscription's keys, its payload field and its secret.
pub struct Scope<'a> {
    /// Its keys.
    pub keys: &'a SubscriptionKeys,
    /// The field carrying the JSON payload.
    pub payload_field: &'a str,
    /// The stream's secret (dead letters' seals).
    pub secret: Option<Secret>,
}

impl<'a> Scope<'a> {
    /// The scope of `keys`, its secret read.
    pub async fn load<C: ConnectionLike>(
        conn: &mut C,
        keys: &'a SubscriptionKeys,
        payload_field: &'a str,
    ) -> Result<Self, OperateError> {
        let secret = dead_letters::secret_of(conn, keys).await?;
        Ok(Self {
            keys,
            payload_field,
            secret,
        })
    }
}

/// A stream entry as read: its id and fields.
type RawEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// The next batch of `of` that `filter` matches, walking on from `walk`.
pub async fn next_batch<C: ConnectionLike>(
    conn: &mut C,
    scope: &Scope<'_>,
    of: Of,
    filter: &Filter,
    walk: &mut Walk,
) -> Result<Vec<Item>, OperateError> {
    let mut items = Vec::new();
    match of {
        Of::DeadLetters => {
            let Some(until) = walk.until.clone() else {
                walk.done = true;
                return Ok(items);
            };
            let from = walk
                .cursor
                .as_ref()
                .map_or("-".to_owned(), |c| format!("({c}"));
            let page: Vec<RawEntry> = redis::cmd("XRANGE")
                .arg(&*scope.keys.dead_letter)
                .arg(from)
                .arg(until)
                .arg("COUNT")
                .arg(BATCH)
                .query_async(conn)
                .await?;
            walk.done = page.len() < BATCH;
            let owner = Owner::of(scope.keys, scope.secret.as_ref());
            for (id, fields) in page {
                walk.cursor = Some(id.clone());
                walk.scanned += 1;
                let letter = DeadLetter::decode(id, fields, &owner);
                let candidate = Candidate {
                    fields: &letter.fields,
                    payload_field: scope.payload_field,
                    retries: letter.retry_count,
                    at_ms: letter.written_ms(),
                    reason: letter.reason.as_deref(),
                };
                if letter.ours && filter.matches(&candidate) {
                    items.push(Item::Dead(Box::new(letter)));
                }
            }
        }
        Of::Pending => pending_batch(conn, scope, filter, walk, &mut items).await?,
        Of::Parked => {
            let Some(set) = scope.keys.delayed.as_deref() else {
                walk.done = true;
                return Ok(items);
            };
            let page = parked::list(conn, set, walk.cursor.as_deref(), BATCH).await?;
            walk.done = page.next.is_none();
            walk.cursor = page.next;
            for p in page.items {
                walk.scanned += 1;
                let e = &p.entry;
                let candidate = Candidate {
                    fields: &e.fields,
                    payload_field: scope.payload_field,
                    retries: Some(e.retry_count),
                    at_ms: Some(e.due_ms),
                    reason: None,
                };
                let origin = if e.origin_id.is_empty() {
                    &e.entry_id
                } else {
                    &e.origin_id
                };
                if filter.matches(&candidate) && walk.seen.insert(origin.clone()) {
                    items.push(Item::Parked(p));
                }
            }
        }
    }
    Ok(items)
}

/// The next page of the group's pending entries (XPENDING from the cursor), each read to be
/// matched (its delivery count as its retries, its id's time as its time).
async fn pending_batch<C: ConnectionLike>(
    conn: &mut C,
    scope: &Scope<'_>,
    filter: &Filter,
    walk: &mut Walk,
    items: &mut Vec<Item>,
) -> Result<(), OperateError> {
    let from = walk
        .cursor
        .as_ref()
        .map_or("-".to_owned(), |c| format!("({c}"));
    let page: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(&*scope.keys.stream)
        .arg(&*scope.keys.group)
        .arg(from)
        .arg("+")
        .arg(BATCH)
        .query_async(conn)
        .await?;
    walk.done = page.len() < BATCH;
    // The entries, one pipeline for the page.
    let mut pipe = redis::pipe();
    for (id, ..) in &page {
        pipe.cmd("XRANGE").arg(&*scope.keys.stream).arg(id).arg(id);
    }
    let entries: Vec<Vec<RawEntry>> = if page.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(conn).await?
    };
    for ((id, _, _, deliveries), entry) in page.into_iter().zip(entries) {
        walk.cursor = Some(id.clone());
        walk.scanned += 1;
        let Some((_, fields)) = entry.first() else {
            continue;
        };
        let candidate = Candidate {
            fields,
            payload_field: scope.payload_field,
            retries: Some(u32::try_from(deliveries.saturating_sub(1)).unwrap_or(u32::MAX)),
            at_ms: crate::support::when::entry_ms(&id).and_then(|ms| i64::try_from(ms).ok()),
            reason: None,
        };
        if filter.matches(&candidate) {
            items.push(Item::Pending(id));
        }
    }
    Ok(())
}

/// How many entries a filter matches, as far as a count looked.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Count {
    /// Matches found.
    pub matches: u64,
    /// Entries looked at.
    pub scanned: u64,
    /// Whether every entry was looked at (else `matches` is a lower bound).
    pub complete: bool,
    /// The first matches' ids (dead letters) or origin ids (parked), up to 50.
    pub first: Vec<String>,
}

/// Count what `filter` matches in `of`, bounded by [`MAX_SCAN`] and [`SCAN_TIME`].
pub async fn count<C: ConnectionLike>(
    conn: &mut C,
    scope: &Scope<'_>,
    of: Of,
    filter: &Filter,
) -> Result<Count, OperateError> {
    let deadline = tokio::time::Instant::now() + SCAN_TIME;
    let mut walk = Walk::begin(conn, scope, of).await?;
    let mut count = Count::default();
    while !walk.done && (walk.scanned as usize) < MAX_SCAN && tokio::time::Instant::now() < deadline
    {
        for item in next_batch(conn, scope, of, filter, &mut walk).await? {
            count.matches += 1;
            if count.first.len() < 50 {
                count.first.push(match item {
                    Item::Dead(l) => l.id,
                    Item::Parked(p) => p.entry.origin_id,
                    Item::Pending(id) => id,
                });
            }
        }
    }
    count.scanned = walk.scanned;
    count.complete = walk.done;
    Ok(count)
}

/// What one batch of a job came to.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq, Eq)]
pub struct Tally {
    /// Entries moved (requeued, made due, deleted).
    pub moved: u64,
    /// Matches that could not be moved (a dead letter that cannot be requeued as it is).
    pub skipped: u64,
    /// Matches already gone when their turn came (another operator, a sweep).
    pub gone: u64,
}

/// Do `action` to `items`.
pub async fn act<C: ConnectionLike>(
    conn: &mut C,
    scope: &Scope<'_>,
    action: JobAction,
    items: Vec<Item>,
    walk: &mut Walk,
) -> Result<Tally, OperateError> {
    let mut tally = Tally::default();
    let at_cursor = walk.cursor_score();
    let gone_at_cursor = items
        .iter()
        .filter(|i| matches!(i, Item::Parked(p) if Some(p.entry.due_ms) == at_cursor))
        .count();
    let mut members = Vec::new();
    let mut dead_ids = Vec::new();
    for item in items {
        match (item, action) {
            (Item::Dead(letter), JobAction::Requeue) => {
                match dead_letters::requeue(conn, scope.keys, &letter, false).await {
                    Ok(dead_letters::Requeued::To(_)) => tally.moved += 1,
                    Ok(dead_letters::Requeued::Gone) => tally.gone += 1,
                    Err(OperateError::NotRequeueable { .. }) => tally.skipped += 1,
                    Err(err) => return Err(err),
                }
            }
            (Item::Dead(letter), _) => dead_ids.push(letter.id),
            (Item::Parked(p), _) => members.push(p.member),
            // No job acts on pending entries (`applies_to`).
            (Item::Pending(_), _) => tally.skipped += 1,
        }
    }
    if !dead_ids.is_empty() {
        let n = dead_letters::delete(conn, scope.keys, &dead_ids).await? as u64;
        tally.moved += n;
        tally.gone += dead_ids.len() as u64 - n.min(dead_ids.len() as u64);
    }
    if let Some(set) = scope.keys.delayed.as_deref()
        && !members.is_empty()
    {
        let n = match action {
            JobAction::RetryNow => parked::retry_now(conn, set, &members).await?,
            _ => parked::delete(conn, set, &members).await?,
        } as u64;
        tally.moved += n;
        tally.gone += members.len() as u64 - n.min(members.len() as u64);
        walk.moved_at_cursor(gone_at_cursor);
    }
    Ok(tally)
}

/// Take the subscription's job lease for `id`; `false` when another job holds it.
pub async fn take_lease<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
    id: &str,
) -> redis::RedisResult<bool> {
    let taken: Option<String> = redis::cmd("SET")
        .arg(format!("{prefix}:lease"))
        .arg(id)
        .arg("NX")
        .arg("PX")
        .arg(LEASE.as_millis() as u64)
        .query_async(conn)
        .await?;
    Ok(taken.is_some())
}

/// `lua/lease.lua`: the lease kept or let go only by its holder.
static LEASE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(crate::store::lua!("control/operate/lua/lease"))
});

/// Renew the lease while `id` holds it; `false` when it was lost.
pub async fn renew_lease<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
    id: &str,
) -> redis::RedisResult<bool> {
    let held: i64 = LEASE_SCRIPT
        .key(format!("{prefix}:lease"))
        .arg(id)
        .arg("renew")
        .arg(LEASE.as_millis() as u64)
        .invoke_async(conn)
        .await?;
    Ok(held == 1)
}

/// Let the lease go, if `id` holds it.
pub async fn release_lease<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
    id: &str,
) -> redis::RedisResult<()> {
    let _: i64 = LEASE_SCRIPT
        .key(format!("{prefix}:lease"))
        .arg(id)
        .arg("release")
        .arg(0)
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// Whether a job holds the subscription's lease now (its id).
pub async fn holder<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET")
        .arg(format!("{prefix}:lease"))
        .query_async(conn)
        .await
}

/// How long a job's record is kept after its last write.
pub const RECORD_TTL: Duration = Duration::from_secs(7 * 86_400);

/// Write job `id`'s record (`fields` replace those named), and, with `last`, make it the
/// subscription's last job. Each job writes only its own record: one that lost its lease
/// cannot overwrite the next job's.
pub async fn write_record<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
    id: &str,
    fields: &[(&str, String)],
    last: bool,
) -> redis::RedisResult<()> {
    let key = format!("{prefix}:job:{id}");
    let ttl = RECORD_TTL.as_millis() as u64;
    let mut pipe = redis::pipe();
    let hset = pipe.cmd("HSET").arg(&key);
    for (name, value) in fields {
        hset.arg(*name).arg(value);
    }
    pipe.ignore();
    pipe.cmd("PEXPIRE").arg(&key).arg(ttl).ignore();
    if last {
        pipe.cmd("SET")
            .arg(format!("{prefix}:last"))
            .arg(id)
            .arg("PX")
            .arg(ttl)
            .ignore();
    }
    pipe.query_async(conn).await
}

/// The subscription's last job's record, empty when none ran (or it was forgotten).
pub async fn read_record<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
) -> redis::RedisResult<std::collections::BTreeMap<String, String>> {
    let last: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}:last"))
        .query_async(conn)
        .await?;
    let Some(id) = last else {
        return Ok(Default::default());
    };
    redis::cmd("HGETALL")
        .arg(format!("{prefix}:job:{id}"))
        .query_async(conn)
        .await
}

/// Whether job `id` was asked to stop.
pub async fn cancelled<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
    id: &str,
) -> redis::RedisResult<bool> {
    let flag: Option<String> = redis::cmd("HGET")
        .arg(format!("{prefix}:job:{id}"))
        .arg("cancel")
        .query_async(conn)
        .await?;
    Ok(flag.is_some())
}
