//! One entry: its fields (cut for display past [`super::VIEW_VALUE_BYTES`]), where it is now, and its history ([`crate::entry::history`]). What
//! the page per entry and `GET /v1/subscriptions/{stream}/{group}/entries/{origin id}` show.
//!
//! "Where it is now" is found from the entry's last history record, so every lookup is a
//! handful of bounded commands whatever the size of the keys: the stream entry itself (XRANGE
//! of one id) and whether it is pending (XPENDING of one id); a parked retry by its due time
//! (ZRANGEBYSCORE at one score); a retry the sweep moved back by the copies written since its
//! due time, where the group's unread entries begin and at the end ([`LANE_SCAN`] each at
//! most, verified with the stream's secret; not found there, it says so); a dead letter
//! by its id. Only an entry with no history that the group read and no longer holds costs more:
//! a look through the delayed set for it, [`SET_SCAN`] members at most.

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};

use super::{OperateError, parked};
use crate::entry::delivery::{Entry, Fields, Source, Trust};
use crate::entry::history::{Action, Record};
use crate::store::keys::{SubscriptionKeys, cmp_ids};

/// An entry's fields as Redis answers them.
type FieldPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The most copies after a retry's due time read to find where the sweep put it.
pub const LANE_SCAN: usize = 256;
/// The most parked retries looked at for an entry with no history.
pub const SET_SCAN: usize = 10_000;

/// Where an entry is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whereabouts {
    /// Pending to a consumer of the group: being handled, or waiting for a retry that stays
    /// pending (`key` is the stream or the retry lane, `id` the copy).
    Pending {
        /// The stream or lane it is pending in.
        key: String,
        /// The id there.
        id: String,
        /// The consumer holding it.
        consumer: String,
        /// Since it was last delivered, ms.
        idle_ms: u64,
        /// Redis's delivery counter.
        deliveries: u64,
    },
    /// Parked in the delayed set until its due time.
    Parked {
        /// Due, epoch ms (server clock).
        due_ms: i64,
        /// The retry count it comes back with.
        retry_count: u32,
    },
    /// Back in the stream or the retry lane (as `id`), not read by the group yet.
    Queued {
        /// The stream or lane.
        key: String,
        /// The id there.
        id: String,
    },
    /// In the dead-letter stream.
    DeadLettered {
        /// Its id there.
        id: String,
        /// Why.
        reason: String,
    },
    /// Not pending, parked, queued or dead-lettered: handled (acknowledged), or requeued,
    /// deleted or trimmed since its last record.
    Done {
        /// What the host can say about how it ended.
        how: String,
    },
    /// Not found within the bounded looks (a copy far inside a long stream or lane): the
    /// page says so rather than guess.
    Unknown {
        /// Where it was looked for.
        how: String,
    },
}

/// One entry as the operator sees it.
#[derive(Debug, Clone)]
pub struct EntryView {
    /// The id asked for (the entry the producer added).
    pub origin_id: String,
    /// Its fields, from wherever it was found (empty when nowhere).
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// Where it is now.
    pub now: Whereabouts,
    /// What was done with it, oldest first.
    pub history: Vec<Record>,
}

impl EntryView {
    /// The entry for the admin API.
    pub fn to_json(&self) -> serde_json::Value {
        let now = match &self.now {
            Whereabouts::Pending {
                key,
                id,
                consumer,
                idle_ms,
                deliveries,
            } => serde_json::json!({
                "state": "pending", "key": key, "id": id, "consumer": consumer,
                "idle_ms": idle_ms, "deliveries": deliveries,
            }),
            Whereabouts::Parked {
                due_ms,
                retry_count,
            } => serde_json::json!({
                "state": "parked", "due_ms": due_ms, "due": super::format_ms(*due_ms),
                "retry_count": retry_count,
            }),
            Whereabouts::Queued { key, id } => {
                serde_json::json!({ "state": "queued", "key": key, "id": id })
            }
            Whereabouts::DeadLettered { id, reason } => {
                serde_json::json!({ "state": "dead-lettered", "id": id, "reason": reason })
            }
            Whereabouts::Done { how } => serde_json::json!({ "state": "done", "how": how }),
            Whereabouts::Unknown { how } => {
                serde_json::json!({ "state": "unknown", "how": how })
            }
        };
        serde_json::json!({
            "origin_id": self.origin_id,
            "fields": super::fields_json(&self.fields),
            "now": now,
            "history": self.history.iter().map(Record::to_json).collect::<Vec<_>>(),
        })
    }
}

/// The entry whose origin id is `origin_id` in the subscription with `keys`; `None` when
/// nothing is known of it (no history, not in the stream).
pub async fn lookup<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    origin_id: &str,
) -> Result<Option<EntryView>, OperateError> {
    if !crate::entry::history::is_stream_id(origin_id) {
        return Err(OperateError::Invalid(format!(
            "{origin_id:?} is not a stream entry id"
        )));
    }
    let history = crate::entry::history::read(conn, &keys.stream, &keys.group, origin_id).await?;
    let original = one_entry(conn, &keys.stream, origin_id).await?;
    let mut view = EntryView {
        origin_id: origin_id.to_owned(),
        fields: original
            .as_ref()
            .map(|e| e.fields.clone())
            .unwrap_or_default(),
        now: Whereabouts::Done { how: String::new() },
        history,
    };
    // The last record says where to look; without one, the entry itself.
    let last = view.history.last().cloned();
    let now = match &last {
        Some(record) if record.action == Action::DeadLetter => {
            dead_lettered(conn, keys, record, &mut view.fields).await?
        }
        Some(record) => retried(conn, keys, record, origin_id, &mut view.fields).await?,
        None => match &original {
            None => return Ok(None),
            Some(entry) => first_delivery(conn, keys, &entry.id).await?,
        },
    };
    view.now = now;
    Ok(Some(view))
}

/// After a dead letter: still there, or gone since.
async fn dead_lettered<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    record: &Record,
    fields: &mut Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<Whereabouts, OperateError> {
    let Some(dl) = &record.dl else {
        return Ok(Whereabouts::Done {
            how: "dead-lettered".to_owned(),
        });
    };
    Ok(match super::dead_letters::get_view(conn, keys, dl).await? {
        Some(letter) => {
            if fields.is_empty() {
                fields.clone_from(&letter.fields);
            }
            Whereabouts::DeadLettered {
                id: dl.clone(),
                reason: letter.reason.unwrap_or_default(),
            }
        }
        None => Whereabouts::Done {
            how: format!(
                "dead-lettered as {dl}, which is no longer there (requeued, deleted or trimmed)"
            ),
        },
    })
}

/// After a park: in the set still, or where the sweep put it (and whether read since).
async fn retried<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    record: &Record,
    origin_id: &str,
    fields: &mut Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<Whereabouts, OperateError> {
    let (Some(set), Some(due)) = (&keys.delayed, record.due) else {
        return Ok(Whereabouts::Done {
            how: "retried".to_owned(),
        });
    };
    let wanted = [origin_id.to_owned()];
    if let Some(p) = parked::find(conn, set, &wanted, Some(due))
        .await?
        .into_iter()
        .next()
    {
        if fields.is_empty() {
            fields.clone_from(&p.entry.fields);
        }
        return Ok(Whereabouts::Parked {
            due_ms: p.entry.due_ms,
            retry_count: p.entry.retry_count,
        });
    }
    swept(conn, keys, (origin_id, due), fields).await
}

/// A retry of `origin_id` due at `due` that is no longer parked: swept back as a copy in the
/// lane (or at the stream's tail) written at or after its due time, found by the stream's
/// secret among a few bounded looks.
async fn swept<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    (origin_id, due): (&str, i64),
    fields: &mut Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<Whereabouts, OperateError> {
    let secret = super::dead_letters::secret_of(conn, keys).await?;
    let (source, key) = match &keys.lane {
        Some(lane) => (Source::Lane, lane.to_string()),
        None => (Source::Stream, keys.stream.to_string()),
    };
    let Some(secret) = secret else {
        return Ok(Whereabouts::Unknown {
            how: format!(
                "swept back into {key} after its due time; the stream has no secret to tell its copy by"
            ),
        });
    };
    let (copies, reached_end) = copies_since(conn, keys, &key, due).await?;
    for copy in copies {
        if cmp_ids(&copy.id, &format!("{due}-0")).is_lt() {
            continue;
        }
        if let Trust::Own(bookkeeping, own) = crate::entry::delivery::trust(
            &keys.stream,
            &keys.group,
            (source, &key),
            &copy,
            Some(&secret),
        ) && bookkeeping.origin_id == origin_id
        {
            if fields.is_empty() {
                *fields = match own {
                    Fields::Unpacked(f) => f,
                    Fields::Leading(n) => copy.fields[..n.min(copy.fields.len())].to_vec(),
                };
            }
            return where_in(conn, keys, &key, &copy.id).await;
        }
    }
    Ok(if reached_end {
        Whereabouts::Done {
            how: format!(
                "retried; its copy is no longer in {key} (handled and trimmed, or deleted)"
            ),
        }
    } else {
        Whereabouts::Unknown {
            how: format!(
                "swept back into {key} after its due time; its copy is not among the {LANE_SCAN} entries after that time, the first {LANE_SCAN} unread or the newest {LANE_SCAN}: it may be queued further in, in flight, or handled"
            ),
        }
    })
}

/// The copies in `key` (the lane or the stream) a sweep may have written at or after `due`,
/// and whether they reach its end. Three bounded looks: just after its due time, where the
/// group's unread entries begin, and the newest (a sweep after an outage puts it behind
/// everything added meanwhile).
async fn copies_since<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    key: &str,
    due: i64,
) -> Result<(Vec<Entry>, bool), OperateError> {
    let after_due = range(conn, key, &format!("{due}-0"), LANE_SCAN).await?;
    let reached_end = after_due.len() < LANE_SCAN;
    let mut copies = after_due;
    if !reached_end {
        if let Some(group) = crate::store::inspect::group(conn, key, &keys.group).await? {
            copies.extend(
                range(
                    conn,
                    key,
                    &format!("({}", group.last_delivered_id),
                    LANE_SCAN,
                )
                .await?,
            );
        }
        copies.extend(newest(conn, key, LANE_SCAN).await?);
    }
    Ok((copies, reached_end))
}

/// An entry with no history: pending, waiting to be read, parked without a record (by an
/// earlier release, or its history key taken by another program), or handled.
async fn first_delivery<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    id: &str,
) -> Result<Whereabouts, OperateError> {
    let found = where_in(conn, keys, &keys.stream, id).await?;
    let (Whereabouts::Done { .. }, Some(set)) = (&found, &keys.delayed) else {
        return Ok(found);
    };
    // Read by the group and not pending: handled, unless it waits in the set unrecorded. A
    // bounded look ([`SET_SCAN`] members at most), filtered by Redis.
    let (found_parked, whole) = parked::scan_for(conn, set, id, SET_SCAN).await?;
    Ok(match found_parked.first() {
        Some(p) => Whereabouts::Parked {
            due_ms: p.entry.due_ms,
            retry_count: p.entry.retry_count,
        },
        None if whole => found,
        None => Whereabouts::Unknown {
            how: format!(
                "read by the group and not pending; no history recorded, and not among the first {SET_SCAN} parked retries looked at"
            ),
        },
    })
}

/// Where copy `id` of `key` is for the group: pending to a consumer, not read yet, or handled.
async fn where_in<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    key: &str,
    id: &str,
) -> Result<Whereabouts, OperateError> {
    let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(key)
        .arg(&*keys.group)
        .arg(id)
        .arg(id)
        .arg(1)
        .query_async(conn)
        .await?;
    if let Some((id, consumer, idle_ms, deliveries)) = pending.into_iter().next() {
        return Ok(Whereabouts::Pending {
            key: key.to_owned(),
            id,
            consumer,
            idle_ms,
            deliveries,
        });
    }
    let group = crate::store::inspect::group(conn, key, &keys.group).await?;
    Ok(match group {
        Some(g) if cmp_ids(id, &g.last_delivered_id).is_gt() => Whereabouts::Queued {
            key: key.to_owned(),
            id: id.to_owned(),
        },
        _ => Whereabouts::Done {
            how: format!("handled: read by the group as {id} of {key} and acknowledged"),
        },
    })
}

/// Entry `id` of `key`, if it is there, cut for display (see
/// [`crate::control::operate::VIEW_VALUE_BYTES`]: an entry over `max_entry_bytes` stays in its stream).
async fn one_entry<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    id: &str,
) -> RedisResult<Option<Entry>> {
    Ok(super::view_range(conn, key, false, (id, id), 1)
        .await?
        .into_iter()
        .map(|(id, fields)| Entry { id, fields })
        .find(|e| e.id == id))
}

/// The newest `count` entries of `key`, oldest first.
async fn newest<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    count: usize,
) -> RedisResult<Vec<Entry>> {
    let mut entries = span(conn, "XREVRANGE", key, ("+", "-"), count).await?;
    entries.reverse();
    Ok(entries)
}

/// Up to `count` entries of `key` from `start` on.
async fn range<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    start: &str,
    count: usize,
) -> RedisResult<Vec<Entry>> {
    span(conn, "XRANGE", key, (start, "+"), count).await
}

/// Up to `count` entries of `key` between `bounds`, read with `command` (XRANGE or
/// XREVRANGE), in its order.
async fn span<C: ConnectionLike>(
    conn: &mut C,
    command: &str,
    key: &str,
    bounds: (&str, &str),
    count: usize,
) -> RedisResult<Vec<Entry>> {
    let reply: Value = redis::cmd(command)
        .arg(key)
        .arg(bounds.0)
        .arg(bounds.1)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    let rows: Vec<(String, FieldPairs)> = redis::from_redis_value(reply)?;
    Ok(rows
        .into_iter()
        .map(|(id, fields)| Entry { id, fields })
        .collect())
}
