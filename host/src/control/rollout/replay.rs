//! Replay: a candidate handler run on a subscription's dead letters in a dry run, to answer
//! "would this version have handled them?" before they are requeued.
//!
//! Each dead letter that a requeue could put back is delivered to the candidate as the requeue
//! would deliver it (its own fields, a `sluice-requeued-from` field, a first attempt), and what
//! the candidate answers is reported: ack, retry after a delay, dead-letter with a reason, or
//! a failure (trap, limit). Nothing is settled: no ack, no park, no dead letter, no entry
//! history, no trace; the dead letters are read with the stream's secret read as it is (never
//! made, no legacy cutoff recorded). The caller builds the candidate with the subscription's
//! limits and, for outbound HTTP, only the hosts the operator named for the replay.
//!
//! [`requeue_acked`] is the one step that writes, and only when asked: it requeues exactly the
//! dead letters the candidate acknowledged (each read again, then moved by the usual atomic
//! requeue).

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use redis::aio::ConnectionLike;

use crate::control::operate::OperateError;
use crate::control::operate::dead_letters::{self, DeadLetter, Requeued};
use crate::entry::delivery::{Delivery, Entry, Source};
use crate::entry::outcome::{Failure, Outcome, bounded_text};
use crate::handler::Handler;
use crate::store::keys::{REQUEUED_FROM, Secret, SubscriptionKeys};

/// The most dead letters one replay runs on.
pub const MAX_LIMIT: usize = 10_000;
/// How many deliveries of a replay run at once.
const CONCURRENCY: usize = 8;
/// The longest reason or failure reported per entry, in bytes.
const MAX_TEXT: usize = 1024;

/// What the candidate would do with one dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Would {
    /// Acknowledge it.
    Ack,
    /// Ask for a retry after the delay (`downstream`: because a downstream is down).
    Retry {
        /// The delay asked for.
        after: Duration,
        /// The downstream it found down, if it said so.
        downstream: Option<String>,
    },
    /// Dead-letter it again, for this reason.
    DeadLetter(String),
    /// Fail without an answer: a trap or a limit.
    Fail(String),
    /// Not run: a requeue could not put it back (another subscription's, not Sluice's).
    Skip(String),
}

impl Would {
    /// Its kind, as the summary and the JSON name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Would::Ack => "ack",
            Would::Retry { .. } => "retry",
            Would::DeadLetter(_) => "dead-letter",
            Would::Fail(_) => "fail",
            Would::Skip(_) => "skip",
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Would::Ack => "ack".to_owned(),
            Would::Retry {
                after,
                downstream: None,
            } => format!("retry after {}", humantime::format_duration(*after)),
            Would::Retry {
                after,
                downstream: Some(why),
            } => format!(
                "retry after {} (downstream down: {why})",
                humantime::format_duration(*after)
            ),
            Would::DeadLetter(reason) => format!("dead-letter: {reason}"),
            Would::Fail(what) => format!("fail: {what}"),
            Would::Skip(why) => format!("skipped: {why}"),
        }
    }

    /// What `result`, a handler's answer, would do.
    pub fn of(result: Result<Outcome, Failure>) -> Self {
        let text = |t: &str| bounded_text(t, MAX_TEXT).0;
        match result {
            Ok(Outcome::Ack) => Would::Ack,
            Ok(Outcome::RetryAfter(after)) => Would::Retry {
                after,
                downstream: None,
            },
            Ok(Outcome::DownstreamDown(after, why)) => Would::Retry {
                after,
                downstream: Some(text(&why)),
            },
            Ok(Outcome::DeadLetter(reason)) => Would::DeadLetter(text(&reason)),
            Err(failure) => Would::Fail(text(&failure.to_string())),
        }
    }
}

/// One dead letter replayed.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Its id in the dead-letter stream.
    pub id: String,
    /// The entry it was first added as, when known.
    pub origin_id: Option<String>,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// What the candidate would do.
    pub would: Would,
    /// How long the candidate took.
    pub elapsed: Duration,
}

/// What a replay found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Per dead letter, newest first.
    pub items: Vec<Replayed>,
    /// Whether more dead letters (matching the reason) remain past the limit.
    pub more: bool,
    /// Outbound HTTP requests the candidate made and the replay denied.
    pub http_denied: u64,
}

impl Report {
    /// How many items would do `kind` (see [`Would::kind`]).
    pub fn count(&self, kind: &str) -> usize {
        self.items.iter().filter(|i| i.would.kind() == kind).count()
    }

    /// The summary line.
    pub fn summary(&self) -> String {
        let run = self.items.len() - self.count("skip");
        format!(
            "replayed {run} dead letter(s): {} ack, {} retry, {} dead-letter, {} fail; {} skipped{}",
            self.count("ack"),
            self.count("retry"),
            self.count("dead-letter"),
            self.count("fail"),
            self.count("skip"),
            if self.more {
                "; more dead letters remain past the limit"
            } else {
                ""
            }
        )
    }

    /// Its JSON for the API and `--json`.
    pub fn to_json(&self) -> serde_json::Value {
        let items: Vec<serde_json::Value> = self
            .items
            .iter()
            .map(|i| {
                let mut item = serde_json::json!({
                    "id": i.id,
                    "origin_id": i.origin_id,
                    "reason": i.reason,
                    "would": i.would.kind(),
                    "describe": i.would.describe(),
                    "elapsed_ms": i.elapsed.as_secs_f64() * 1000.0,
                });
                match &i.would {
                    Would::Retry { after, downstream } => {
                        item["retry_after_ms"] = (after.as_millis() as u64).into();
                        item["downstream"] = downstream.clone().into();
                    }
                    Would::DeadLetter(reason) => item["dead_letter_reason"] = reason.clone().into(),
                    Would::Fail(what) | Would::Skip(what) => item["why"] = what.clone().into(),
                    Would::Ack => {}
                }
                item
            })
            .collect();
        serde_json::json!({
            "summary": {
                "ack": self.count("ack"),
                "retry": self.count("retry"),
                "dead_letter": self.count("dead-letter"),
                "fail": self.count("fail"),
                "skip": self.count("skip"),
                "more": self.more,
                "http_denied": self.http_denied,
            },
            "items": items,
        })
    }
}

/// The delivery a requeue of `letter` would make, for the subscription `keys` name.
fn delivery_of(keys: &SubscriptionKeys, letter: &DeadLetter) -> Delivery {
    let mut fields = letter.fields.clone();
    fields.push((
        REQUEUED_FROM.as_bytes().to_vec(),
        letter.id.as_bytes().to_vec(),
    ));
    let mut delivery = Delivery::new(
        keys.stream.clone(),
        keys.group.clone(),
        (Source::Stream, &keys.stream),
        Entry {
            id: letter.id.clone(),
            fields,
        },
        1,
        None,
    );
    if let Some(origin) = letter.origin_id.as_ref().filter(|_| letter.trusted) {
        delivery.origin_id = origin.clone();
    }
    delivery
}

/// Run `candidate` on up to `limit` of the subscription's dead letters (newest first, those
/// whose reason contains `reason`), writing nothing. An entry of more than `max_entry_bytes`
/// is skipped, as a delivery of it would never reach the handler.
pub async fn replay<C: ConnectionLike + Clone + Send>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    candidate: &dyn Handler,
    (reason, limit): (Option<&str>, usize),
    max_entry_bytes: u64,
) -> Result<Report, OperateError> {
    let limit = limit.clamp(1, MAX_LIMIT);
    // Read as it is: never made, nothing recorded.
    let secret = Secret::load_with(conn, &keys.stream, &[], false).await?;
    let mut letters = Vec::new();
    let mut cursor: Option<String> = None;
    let mut more = false;
    while letters.len() < limit {
        let page = dead_letters::list_with(
            conn,
            keys,
            secret.as_ref(),
            cursor.as_deref(),
            (limit - letters.len()).min(crate::control::operate::BATCH),
            reason,
            1,
        )
        .await?;
        letters.extend(page.items);
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    if letters.len() >= limit && cursor.is_some() {
        // One more look says whether anything is left past the limit.
        let next =
            dead_letters::list_with(conn, keys, secret.as_ref(), cursor.as_deref(), 1, reason, 1)
                .await?;
        more = !next.items.is_empty() || next.next.is_some();
    }
    letters.truncate(limit);
    // A dry run allowed to call out sends the keys the real attempts sent.
    let call_key = secret.as_ref().and_then(crate::runtime::effects::call_key);
    let items = futures::stream::iter(letters)
        .map(|letter| async move {
            let started = Instant::now();
            let would = match &letter.not_requeueable {
                Some(why) => Would::Skip(why.clone()),
                None => {
                    let mut delivery = delivery_of(keys, &letter);
                    delivery.call_key = call_key;
                    let bytes = delivery.entry_bytes();
                    if bytes > max_entry_bytes {
                        Would::Skip(format!(
                            "the entry is {bytes} bytes, more than max_entry_bytes ({max_entry_bytes}): a delivery of it never reaches the handler"
                        ))
                    } else {
                        Would::of(candidate.handle(&delivery).await)
                    }
                }
            };
            Replayed {
                elapsed: started.elapsed(),
                id: letter.id,
                origin_id: letter.origin_id,
                reason: letter.reason,
                would,
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    Ok(Report {
        items,
        more,
        http_denied: 0,
    })
}

/// What [`requeue_acked`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequeuedAcked {
    /// Requeued: (dead letter id, new entry id).
    pub requeued: Vec<(String, String)>,
    /// Gone meanwhile (requeued or deleted by someone else).
    pub gone: Vec<String>,
}

/// Requeue exactly the dead letters `report` says the candidate acknowledged.
pub async fn requeue_acked<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    report: &Report,
) -> Result<RequeuedAcked, OperateError> {
    let mut done = RequeuedAcked::default();
    for item in report.items.iter().filter(|i| i.would == Would::Ack) {
        let Some(letter) = dead_letters::get(conn, keys, &item.id).await? else {
            done.gone.push(item.id.clone());
            continue;
        };
        match dead_letters::requeue(conn, keys, &letter, false).await? {
            Requeued::To(id) => done.requeued.push((item.id.clone(), id)),
            Requeued::Gone => done.gone.push(item.id.clone()),
        }
    }
    Ok(done)
}

/// What replaying one parked or dead-lettered entry with its journal did (`sluice replay
/// --entry`).
#[derive(Debug)]
pub struct EntryReplay {
    /// Where the entry was found: `dead letter` or `parked retry`.
    pub found_as: &'static str,
    /// Its id there (the dead letter's, or the parked copy's entry id).
    pub id: String,
    /// Its origin id, whose journal it ran with.
    pub origin_id: String,
    /// What the handler would do.
    pub would: Would,
    /// Calls answered from the journal.
    pub replayed: u64,
    /// Calls the journal did not hold (answered with an error, never sent).
    pub missing: u64,
}

/// Run `handler` on one entry of the subscription, the dead letter with id `id` or else the
/// parked retry whose origin id is `id`, with the entry's journal of outbound calls and without
/// the network: a recorded call gets its recorded response, any other an error naming it.
/// Nothing is written. `None` when neither is there.
pub async fn replay_entry(
    conn: &mut crate::store::redis_conn::RedisHandle,
    keys: &SubscriptionKeys,
    handler: &dyn Handler,
    id: &str,
) -> Result<Option<EntryReplay>, OperateError> {
    use crate::store::effects::{DeliveryJournal, JournalCounters, JournalStore};
    let (found_as, mut delivery) = match dead_letters::get(conn, keys, id).await? {
        Some(letter) => ("dead letter", delivery_of(keys, &letter)),
        None => {
            let Some(set) = keys.delayed.as_deref() else {
                return Ok(None);
            };
            let (found, _) =
                crate::control::operate::parked::scan_for(conn, set, id, usize::MAX).await?;
            let Some(parked) = found.into_iter().next() else {
                return Ok(None);
            };
            ("parked retry", delivery_of_parked(keys, parked.entry))
        }
    };
    let store = std::sync::Arc::new(JournalStore::new(
        conn.clone(),
        None,
        JournalCounters::default(),
    ));
    delivery.journal = Some(std::sync::Arc::new(DeliveryJournal::offline(store.clone())));
    let would = Would::of(handler.handle(&delivery).await);
    Ok(Some(EntryReplay {
        found_as,
        id: delivery.entry.id.clone(),
        origin_id: delivery.origin_id.clone(),
        would,
        replayed: store.counters.replayed.get(),
        missing: store.counters.not_in_journal.get(),
    }))
}

/// A parked retry as it would come back: its fields, its origin id and retry count.
fn delivery_of_parked(
    keys: &SubscriptionKeys,
    parked: crate::entry::member::ParkedEntry,
) -> Delivery {
    let mut delivery = Delivery::new(
        keys.stream.clone(),
        keys.group.clone(),
        (Source::Stream, &keys.stream),
        Entry {
            id: parked.entry_id,
            fields: parked.fields,
        },
        1,
        None,
    );
    delivery.origin_id = parked.origin_id;
    delivery.retry_count = parked.retry_count;
    delivery
}
