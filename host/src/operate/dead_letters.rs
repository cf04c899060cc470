//! The dead-letter stream: listing it newest first, decoding what the host wrote there, and
//! moving an entry back onto its stream (`lua/requeue.lua`) or deleting it.
//!
//! A dead letter is one of three shapes:
//! - from a delivery (`settle/lua/dead_letter.lua`): the entry's own fields, or one
//!   `sluice-packed-fields` holding them when there were too many, then exactly seven
//!   bookkeeping fields: reason, origin stream, origin group, origin id, entry id, retry count,
//!   delivery count;
//! - from a parked retry that could not go back (`delayed/lua/sweep.lua`) or that an operator
//!   dead-lettered raw: the set's member, a reason, the set's key and the stream;
//! - anything else (written by someone else): shown, never requeued.
//!
//! Only the trailing bookkeeping is the host's: a producer's own `sluice-*` fields in front of
//! it are the producer's data and go back with the entry.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use super::{BATCH, OperateError, Page};
use crate::keys::{self, SubscriptionKeys};

static REQUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/requeue.lua")));

/// The bookkeeping a delivery's dead letter ends with, in order.
const TAIL: [&str; 7] = [
    keys::REASON,
    keys::ORIGIN_STREAM,
    keys::ORIGIN_GROUP,
    keys::ORIGIN_ID,
    keys::ENTRY_ID,
    keys::RETRY_COUNT,
    keys::DELIVERY_COUNT,
];

/// The fields of a dead letter the sweep wrote for a member it could not move back.
const MEMBER_LAYOUT: [&str; 4] = [
    keys::MEMBER,
    keys::REASON,
    keys::ORIGIN_KEY,
    keys::ORIGIN_STREAM,
];

/// Which kind of dead letter an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// A delivery the handler or the host gave up on.
    Delivery,
    /// A parked retry kept raw (its member), readable or not.
    Member,
    /// Not written by Sluice.
    Foreign,
}

/// One dead letter, decoded.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Its id in the dead-letter stream (which also says when it was written).
    pub id: String,
    /// What kind of dead letter it is.
    pub shape: Shape,
    /// Why it was given up on.
    pub reason: Option<String>,
    /// The id of the entry the producer first added.
    pub origin_id: Option<String>,
    /// The id of the entry that was given up on (the origin or a re-added copy of it).
    pub entry_id: Option<String>,
    /// Parks it went through.
    pub retry_count: Option<u32>,
    /// Redis's delivery counter when it was given up on.
    pub delivery_count: Option<u64>,
    /// The entry's own fields, unpacked (for a member: the member's fields, when readable).
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// Why it cannot be requeued, if it cannot.
    pub not_requeueable: Option<String>,
}

impl DeadLetter {
    /// Decode the entry `id` of a dead-letter stream with `fields` as Redis returned them.
    pub fn decode(id: String, fields: Vec<(Vec<u8>, Vec<u8>)>) -> Self {
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let names_are = |part: &[(Vec<u8>, Vec<u8>)], names: &[&str]| {
            part.len() == names.len()
                && part
                    .iter()
                    .zip(names)
                    .all(|((n, _), want)| n.as_slice() == want.as_bytes())
        };
        let n = fields.len();
        if n >= TAIL.len() && names_are(&fields[n - TAIL.len()..], &TAIL) {
            let tail = &fields[n - TAIL.len()..];
            let value = |i: usize| text(&tail[i].1);
            let mut own = fields[..n - TAIL.len()].to_vec();
            let mut not_requeueable = None;
            if let [(name, packed)] = own.as_slice()
                && name.as_slice() == keys::PACKED_FIELDS.as_bytes()
            {
                match unpack(packed) {
                    Some(unpacked) => own = unpacked,
                    None => not_requeueable = Some("its packed fields do not decode".to_owned()),
                }
            }
            if not_requeueable.is_none() && own.len() > keys::SCRIPT_MAX_FIELDS {
                not_requeueable = Some(format!(
                    "it has {} fields; one script re-adds at most {}",
                    own.len(),
                    keys::SCRIPT_MAX_FIELDS
                ));
            }
            return Self {
                id,
                shape: Shape::Delivery,
                reason: Some(value(0)),
                origin_id: Some(value(3)),
                entry_id: Some(value(4)),
                retry_count: value(5).parse().ok(),
                delivery_count: value(6).parse().ok(),
                fields: own,
                not_requeueable,
            };
        }
        if names_are(&fields, &MEMBER_LAYOUT) {
            let reason = Some(text(&fields[1].1));
            return match crate::delayed::member::decode(&fields[0].1, 0) {
                Ok(parked) => Self {
                    id,
                    shape: Shape::Member,
                    reason,
                    not_requeueable: (parked.fields.len() > keys::SCRIPT_MAX_FIELDS).then(|| {
                        format!(
                            "it has {} fields; one script re-adds at most {}",
                            parked.fields.len(),
                            keys::SCRIPT_MAX_FIELDS
                        )
                    }),
                    origin_id: Some(parked.origin_id),
                    entry_id: Some(parked.entry_id),
                    retry_count: Some(parked.retry_count),
                    delivery_count: None,
                    fields: parked.fields,
                },
                Err(err) => Self {
                    id,
                    shape: Shape::Member,
                    reason,
                    origin_id: None,
                    entry_id: None,
                    retry_count: None,
                    delivery_count: None,
                    fields,
                    not_requeueable: Some(err.to_string()),
                },
            };
        }
        Self {
            id,
            shape: Shape::Foreign,
            reason: None,
            origin_id: None,
            entry_id: None,
            retry_count: None,
            delivery_count: None,
            fields,
            not_requeueable: Some("it was not written by Sluice".to_owned()),
        }
    }

    /// When it was written (epoch ms, from its id).
    pub fn written_ms(&self) -> Option<i64> {
        self.id.split('-').next()?.parse().ok()
    }

    /// The dead letter as one JSON object (CLI `--json`, admin API), naming the `stream` it
    /// belongs to.
    pub fn to_json(&self, stream: &str) -> serde_json::Value {
        serde_json::json!({
            "stream": stream,
            "id": self.id,
            "written": self.written_ms().map(super::format_ms),
            "shape": self.shape,
            "reason": self.reason,
            "origin_id": self.origin_id,
            "entry_id": self.entry_id,
            "retry_count": self.retry_count,
            "delivery_count": self.delivery_count,
            "requeueable": self.not_requeueable.is_none(),
            "not_requeueable": self.not_requeueable,
            "fields": super::fields_json(&self.fields),
        })
    }

    /// Whether its reason contains `text` (case-insensitive).
    pub fn reason_contains(&self, text: &str) -> bool {
        self.reason
            .as_deref()
            .is_some_and(|r| r.to_lowercase().contains(&text.to_lowercase()))
    }
}

/// The fields packed into `sluice-packed-fields` (MessagePack `[name, value, ...]`).
fn unpack(packed: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let rmpv::Value::Array(items) = rmpv::decode::read_value(&mut &packed[..]).ok()? else {
        return None;
    };
    let bytes = |v: &rmpv::Value| match v {
        rmpv::Value::Binary(b) => Some(b.clone()),
        rmpv::Value::String(s) => Some(s.as_bytes().to_vec()),
        _ => None,
    };
    items
        .chunks(2)
        .map(|pair| match pair {
            [name, value] => Some((bytes(name)?, bytes(value)?)),
            _ => None,
        })
        .collect()
}

type RawEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// Dead letters newest first, starting after `cursor` (an id this listing returned), up to
/// `limit`; with `reason`, only those whose reason contains it. A filtered listing reads at most
/// `scan_pages` pages of [`BATCH`] and then returns what it found with a cursor to go on.
pub async fn list<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    cursor: Option<&str>,
    limit: usize,
    reason: Option<&str>,
    scan_pages: usize,
) -> Result<Page<DeadLetter>, OperateError> {
    if let Some(c) = cursor
        && !is_entry_id(c)
    {
        return Err(OperateError::Cursor(c.to_owned()));
    }
    let limit = limit.max(1);
    let mut from = cursor.map_or("+".to_owned(), |c| format!("({c}"));
    let mut items = Vec::new();
    for _ in 0..scan_pages.max(1) {
        let want = if reason.is_some() {
            BATCH
        } else {
            (limit - items.len()).min(BATCH)
        };
        let page: Vec<RawEntry> = redis::cmd("XREVRANGE")
            .arg(&*keys.dead_letter)
            .arg(&from)
            .arg("-")
            .arg("COUNT")
            .arg(want)
            .query_async(conn)
            .await?;
        let exhausted = page.len() < want;
        for (id, fields) in page {
            from = format!("({id}");
            let letter = DeadLetter::decode(id, fields);
            if reason.is_none_or(|r| letter.reason_contains(r)) {
                items.push(letter);
                if items.len() == limit {
                    let next = items.last().map(|l| l.id.clone());
                    return Ok(Page { items, next });
                }
            }
        }
        if exhausted {
            return Ok(Page { items, next: None });
        }
    }
    let next = Some(from.trim_start_matches('(').to_owned());
    Ok(Page { items, next })
}

/// Up to `max` dead letters that can be requeued (whose reason contains `reason`, if given),
/// newest first, and whether more remain: what one bounded "requeue all" call works on.
pub async fn requeueable<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    reason: Option<&str>,
    max: usize,
) -> Result<(Vec<DeadLetter>, bool), OperateError> {
    let mut letters = Vec::new();
    let mut cursor: Option<String> = None;
    while letters.len() < max {
        let page = list(conn, keys, cursor.as_deref(), BATCH, reason, 1).await?;
        letters.extend(
            page.items
                .into_iter()
                .filter(|l| l.not_requeueable.is_none()),
        );
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    let more = cursor.is_some() || letters.len() > max;
    letters.truncate(max);
    Ok((letters, more))
}

/// The dead letter `id`, if it is there.
pub async fn get<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    id: &str,
) -> RedisResult<Option<DeadLetter>> {
    if !is_entry_id(id) {
        return Ok(None);
    }
    let found: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(&*keys.dead_letter)
        .arg(id)
        .arg(id)
        .query_async(conn)
        .await?;
    Ok(found
        .into_iter()
        .next()
        .map(|(id, fields)| DeadLetter::decode(id, fields)))
}

/// What a requeue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeued {
    /// Back on the stream under this id.
    To(String),
    /// It was no longer in the dead-letter stream (requeued or deleted meanwhile).
    Gone,
}

/// Put `letter` back onto the subscription's stream: its own fields, a `sluice-requeued-from`
/// field naming the dead letter, and (when the stream has a secret) the origin id with a fresh
/// attempt count; the dead letter is removed in the same script.
pub async fn requeue<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    letter: &DeadLetter,
) -> Result<Requeued, OperateError> {
    if let Some(why) = &letter.not_requeueable {
        return Err(OperateError::NotRequeueable {
            id: letter.id.clone(),
            why: why.clone(),
        });
    }
    let mut invocation = REQUEUE.key(&*keys.stream);
    invocation
        .key(&*keys.dead_letter)
        .key(keys.secret())
        .arg(&letter.id)
        .arg(letter.origin_id.as_deref().unwrap_or(""))
        .arg(keys::RETRY_COUNT)
        .arg(keys::ORIGIN_ID)
        .arg(keys::DUE_MS)
        .arg(keys::MARK);
    for (name, value) in &letter.fields {
        invocation.arg(name.as_slice()).arg(value.as_slice());
    }
    invocation.arg(keys::REQUEUED_FROM).arg(&letter.id);
    let id: Option<String> = invocation.invoke_async(conn).await?;
    Ok(id.map_or(Requeued::Gone, Requeued::To))
}

/// Delete the dead letters `ids` (at most [`BATCH`] per command); returns how many were there.
pub async fn delete<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    ids: &[String],
) -> RedisResult<usize> {
    let mut deleted = 0;
    for chunk in ids.chunks(BATCH) {
        let valid: Vec<&String> = chunk.iter().filter(|id| is_entry_id(id)).collect();
        if valid.is_empty() {
            continue;
        }
        let n: usize = redis::cmd("XDEL")
            .arg(&*keys.dead_letter)
            .arg(valid)
            .query_async(conn)
            .await?;
        deleted += n;
    }
    Ok(deleted)
}

/// Whether `id` has the shape of a stream entry id (`<ms>-<seq>`), so it can be passed to a
/// range command without changing its meaning.
pub fn is_entry_id(id: &str) -> bool {
    let mut parts = id.split('-');
    let number =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    number(parts.next()) && number(parts.next()) && parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        items
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn a_deliverys_dead_letter_keeps_the_producers_own_sluice_fields() {
        let letter = DeadLetter::decode(
            "5-0".into(),
            pairs(&[
                ("payload", "{}"),
                (keys::REASON, "the producer's own"),
                (keys::REASON, "declined"),
                (keys::ORIGIN_STREAM, "s"),
                (keys::ORIGIN_GROUP, "g"),
                (keys::ORIGIN_ID, "1-0"),
                (keys::ENTRY_ID, "4-0"),
                (keys::RETRY_COUNT, "2"),
                (keys::DELIVERY_COUNT, "3"),
            ]),
        );
        assert_eq!(letter.shape, Shape::Delivery);
        assert_eq!(letter.reason.as_deref(), Some("declined"));
        assert_eq!(letter.origin_id.as_deref(), Some("1-0"));
        assert_eq!(letter.retry_count, Some(2));
        assert_eq!(
            letter.fields,
            pairs(&[("payload", "{}"), (keys::REASON, "the producer's own")])
        );
        assert!(letter.not_requeueable.is_none());
        assert!(letter.reason_contains("DECLINED"));
        assert_eq!(letter.written_ms(), Some(5));
    }

    #[test]
    fn foreign_entries_are_shown_but_not_requeued() {
        let letter = DeadLetter::decode("1-0".into(), pairs(&[("x", "y")]));
        assert_eq!(letter.shape, Shape::Foreign);
        assert!(letter.not_requeueable.is_some());
    }

    #[test]
    fn entry_ids_are_checked_before_reaching_a_range_command() {
        assert!(is_entry_id("1700000000000-12"));
        for bad in ["+", "-", "(1-0", "1", "1-0-0", "a-1", ""] {
            assert!(!is_entry_id(bad), "{bad}");
        }
    }
}
