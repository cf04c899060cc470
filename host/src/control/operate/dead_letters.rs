//! The dead-letter stream: listing this subscription's dead letters newest first, decoding what
//! the host wrote there, and moving one back to its group (`lua/requeue.lua`) or deleting it.
//!
//! A dead letter is one of three shapes:
//! - from a delivery (`settle/lua/dead_letter.lua`): the entry's own fields, or one
//!   `sluice-packed-fields` holding them when there were too many, then the bookkeeping: reason,
//!   origin stream, origin group, origin id, entry id, retry count, delivery count, and the
//!   host's seal over the stream, group, origin id and fields (dead letters of the earlier
//!   release have no seal);
//! - from a parked retry that could not go back (`delayed/lua/sweep.lua`) or that an operator
//!   dead-lettered raw: the set's member, a reason, the set's key, the stream, the group and a
//!   seal (the earlier release wrote the first four only);
//! - anything else (written by someone else): shown, never requeued.
//!
//! A dead-letter stream belongs to one subscription (the plan refuses two that share one, and
//! Redis records its owner), but one written by hand, or shared under an earlier release, may
//! hold others' dead letters: listings show only this subscription's (and entries no Sluice
//! subscription wrote), and a requeue or delete touches only this subscription's.
//!
//! A requeue goes back to the subscription's group only (its retry lane, or with `retry_lane =
//! false` its stream), with the attempt count reset and the origin id kept, the idempotency
//! key, but only when the dead letter's origin can be trusted: it carries a seal that
//! verifies, or it is a dead letter the earlier release wrote before this one took over. Any
//! other goes back as a new entry of its own (its origin is its new id).
//!
//! Only the trailing bookkeeping is the host's: a producer's own `sluice-*` fields in front of
//! it are the producer's data and go back with the entry.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use super::{BATCH, OperateError, Page};
use crate::store::keys::{self, Seal, Secret, SubscriptionKeys};
use crate::store::options::ScriptOptions;

/// `lua/requeue.lua`, behind the seal it shares with the sweep.
static REQUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/operate/lua/requeue")));

/// The bookkeeping a delivery's dead letter ends with, in order.
pub const TAIL: [&str; 8] = [
    keys::REASON,
    keys::ORIGIN_STREAM,
    keys::ORIGIN_GROUP,
    keys::ORIGIN_ID,
    keys::ENTRY_ID,
    keys::RETRY_COUNT,
    keys::DELIVERY_COUNT,
    keys::MARK,
];

/// The same, as the earlier release wrote it: without the seal.
const LEGACY_TAIL: &[&str] = TAIL.split_at(7).0;

/// The fields of a dead letter the sweep (or an operator) wrote for a parked member.
const MEMBER_LAYOUT: [&str; 6] = [
    keys::MEMBER,
    keys::REASON,
    keys::ORIGIN_KEY,
    keys::ORIGIN_STREAM,
    keys::ORIGIN_GROUP,
    keys::MARK,
];

/// The same, as the earlier release wrote it: no group, no seal.
const LEGACY_MEMBER_LAYOUT: &[&str] = MEMBER_LAYOUT.split_at(4).0;

/// Whose dead letters a listing shows and a requeue trusts: a subscription's stream, group and
/// delayed set, and its stream's secret (which verifies seals).
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The subscription's stream.
    pub stream: &'a str,
    /// Its group.
    pub group: &'a str,
    /// Its delayed set, if any.
    pub set: Option<&'a str>,
    /// Its stream's secret, if one exists.
    pub secret: Option<&'a Secret>,
    /// The dead-letter stream the letters are read from.
    pub key: &'a str,
}

impl<'a> Owner<'a> {
    /// The owner `keys` describe, with `secret`.
    pub fn of(keys: &'a SubscriptionKeys, secret: Option<&'a Secret>) -> Self {
        Self {
            stream: &keys.stream,
            group: &keys.group,
            set: keys.delayed.as_deref(),
            secret,
            key: &keys.dead_letter,
        }
    }
}

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
    /// The subscription it came from, as recorded (stream, group), when it says.
    pub origin: Option<(String, String)>,
    /// Whether it belongs to the subscription it was read for (or no subscription wrote it).
    pub ours: bool,
    /// Whether its origin id can be trusted: the host's seal verifies, or the earlier release
    /// wrote it before this one took over. A requeue keeps only a trusted origin id.
    pub trusted: bool,
    /// The traceback of the failure that dead-lettered it, when the handler gave one.
    pub trace: Option<String>,
}

impl DeadLetter {
    /// Decode the entry `id` of a dead-letter stream with `fields` as Redis returned them, for
    /// the subscription `owner`.
    pub fn decode(id: String, mut fields: Vec<(Vec<u8>, Vec<u8>)>, owner: &Owner<'_>) -> Self {
        // A traceback comes last, after the bookkeeping.
        if let Some((name, value)) = fields.last()
            && name.as_slice() == keys::TRACE.as_bytes()
        {
            let trace = String::from_utf8_lossy(value).into_owned();
            let pair = fields.pop();
            let mut letter = Self::decode_layout(id.clone(), fields.clone(), owner);
            if letter.shape == Shape::Delivery {
                letter.trace = Some(trace);
                return letter;
            }
            // Not Sluice's layout with a traceback after it: the field is one of the entry's.
            fields.extend(pair);
            return Self::decode_layout(id, fields, owner);
        }
        Self::decode_layout(id, fields, owner)
    }

    fn decode_layout(id: String, fields: Vec<(Vec<u8>, Vec<u8>)>, owner: &Owner<'_>) -> Self {
        let names_are = |part: &[(Vec<u8>, Vec<u8>)], names: &[&str]| {
            part.len() == names.len()
                && part
                    .iter()
                    .zip(names)
                    .all(|((n, _), want)| n.as_slice() == want.as_bytes())
        };
        let n = fields.len();
        for (tail, sealed) in [(&TAIL[..], true), (LEGACY_TAIL, false)] {
            if n >= tail.len() && names_are(&fields[n - tail.len()..], tail) {
                return Self::from_delivery(id, fields, tail.len(), sealed, owner);
            }
        }
        if names_are(&fields, &MEMBER_LAYOUT) || names_are(&fields, LEGACY_MEMBER_LAYOUT) {
            return Self::from_member(id, fields, owner);
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
            origin: None,
            ours: true,
            trusted: false,
            trace: None,
        }
    }

    /// A delivery's dead letter: its fields, then `tail_len` fields of bookkeeping (sealed, or
    /// the earlier release's).
    fn from_delivery(
        id: String,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        tail_len: usize,
        sealed: bool,
        owner: &Owner<'_>,
    ) -> Self {
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let n = fields.len();
        let tail = &fields[n - tail_len..];
        let value = |i: usize| text(&tail[i].1);
        let written = &fields[..n - tail_len];
        let (stream, group, origin_id) = (value(1), value(2), value(3));
        let ours = stream == owner.stream && group == owner.group;
        let packed_form =
            matches!(written, [(name, _)] if name.as_slice() == keys::PACKED_FIELDS.as_bytes());
        // Which seal verifies says whether the fields are packed; without one (an earlier
        // release's dead letter), a lone `sluice-packed-fields` field is taken as packed.
        let sealed_as = if sealed && ours {
            owner.secret.and_then(|secret| {
                let digest = keys::fields_digest(written);
                let parts: [&[u8]; 4] = [
                    stream.as_bytes(),
                    group.as_bytes(),
                    origin_id.as_bytes(),
                    digest.as_bytes(),
                ];
                [Seal::DeadLetter, Seal::DeadLetterPacked]
                    .into_iter()
                    .find(|use_| secret.verify(*use_, &parts, &tail[7].1))
            })
        } else {
            None
        };
        let trusted = ours
            && match sealed_as {
                Some(_) => true,
                None => {
                    !sealed
                        && owner
                            .secret
                            .is_some_and(|s| s.trusts_legacy(owner.key, &id))
                }
            };
        let unpack = match sealed_as {
            Some(use_) => use_ == Seal::DeadLetterPacked,
            None => packed_form,
        };
        let mut own = written.to_vec();
        let mut not_requeueable = None;
        if unpack && let [(_, packed)] = written {
            match crate::entry::delivery::unpack_fields(packed) {
                Some(unpacked) => own = unpacked,
                None => not_requeueable = Some("its packed fields do not decode".to_owned()),
            }
        }
        if !ours {
            not_requeueable = Some(format!(
                "it belongs to stream `{stream}` group `{group}`, not to this subscription"
            ));
        }
        // The producer's names, as it wrote them (see `keys::escaped_name`).
        for (name, _) in &mut own {
            if name.starts_with(keys::PRODUCER_PREFIX.as_bytes()) {
                *name = keys::producer_name(name).to_vec();
            }
        }
        Self {
            id,
            shape: Shape::Delivery,
            reason: Some(value(0)),
            origin_id: Some(origin_id),
            entry_id: Some(value(4)),
            retry_count: value(5).parse().ok(),
            delivery_count: value(6).parse().ok(),
            fields: own,
            not_requeueable,
            origin: Some((stream, group)),
            ours,
            trusted,
            trace: None,
        }
    }

    /// A parked member dead-lettered raw.
    fn from_member(id: String, fields: Vec<(Vec<u8>, Vec<u8>)>, owner: &Owner<'_>) -> Self {
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let reason = Some(text(&fields[1].1));
        let (set, stream) = (text(&fields[2].1), text(&fields[3].1));
        let group = fields.get(4).map(|(_, g)| text(g));
        let ours = stream == owner.stream
            && group.as_deref().is_none_or(|g| g == owner.group)
            && owner.set == Some(set.as_str());
        let sealed = fields.get(5).is_some_and(|(_, mark)| {
            owner.secret.is_some_and(|secret| {
                let parts: [&[u8]; 4] = [
                    set.as_bytes(),
                    stream.as_bytes(),
                    group.as_deref().unwrap_or_default().as_bytes(),
                    &fields[0].1,
                ];
                secret.verify(Seal::Member, &parts, mark)
            })
        });
        let legacy = fields.len() == LEGACY_MEMBER_LAYOUT.len()
            && owner
                .secret
                .is_some_and(|secret| secret.trusts_legacy(owner.key, &id));
        let origin = Some((stream.clone(), group.clone().unwrap_or_default()));
        match crate::entry::member::decode(&fields[0].1, 0) {
            Ok(parked) => {
                let belongs = parked
                    .owner
                    .as_ref()
                    .is_none_or(|(s, g)| *s == stream && group.as_deref().is_none_or(|o| o == g));
                // Another subscription's member that reached this set (a set shared under an
                // earlier release, or a subscription renamed): requeueable here, as an entry of
                // its own (its origin is not this subscription's to vouch for).
                let not_requeueable = (!ours).then(|| {
                    format!(
                        "it came from delayed set `{set}` of stream `{stream}`, not from this subscription's"
                    )
                });
                Self {
                    id,
                    shape: Shape::Member,
                    reason,
                    not_requeueable,
                    origin_id: Some(parked.origin_id),
                    entry_id: Some(parked.entry_id),
                    retry_count: Some(parked.retry_count),
                    delivery_count: None,
                    fields: parked.fields,
                    origin,
                    ours,
                    trusted: ours && belongs && (sealed || legacy),
                    trace: None,
                }
            }
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
                origin,
                ours,
                trusted: false,
                trace: None,
            },
        }
    }

    /// The trace its deliveries were in (see [`crate::observe::telemetry::context`]), when it says
    /// whose it was.
    pub fn trace_id(&self) -> Option<String> {
        let (stream, group) = self.origin.as_ref()?;
        let origin = self.origin_id.as_deref().or(self.entry_id.as_deref())?;
        Some(crate::observe::telemetry::context::trace_id_of(
            stream,
            group,
            origin,
            &self.fields,
        ))
    }

    /// When it was written (epoch ms, from its id).
    pub fn written_ms(&self) -> Option<i64> {
        self.id.split('-').next()?.parse().ok()
    }

    /// The dead letter as one JSON object (CLI `--json`, admin API), naming the `stream` it
    /// belongs to.
    pub fn to_json(&self, stream: &str) -> serde_json::Value {
        let trace_id = self.trace_id();
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
            "origin_trusted": self.trusted,
            "trace": self.trace,
            "trace_link": trace_id.as_deref().and_then(crate::observe::telemetry::trace_link),
            "trace_id": trace_id,
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

type RawEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// This subscription's dead letters newest first (and entries no subscription wrote), starting
/// after `cursor` (an id this listing returned), up to `limit`; with `reason`, only those whose
/// reason contains it. A filtered listing reads at most
/// `scan_pages` pages of [`BATCH`] and then returns what it found with a cursor to go on.
pub async fn list<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    cursor: Option<&str>,
    limit: usize,
    reason: Option<&str>,
    scan_pages: usize,
) -> Result<Page<DeadLetter>, OperateError> {
    let listing = Listing {
        cursor,
        limit,
        reason,
        scan_pages,
        view: false,
    };
    list_loaded(conn, keys, listing).await
}

/// [`list`], each letter cut for display (see [`crate::control::operate::VIEW_VALUE_BYTES`]): what the
/// admin page and the API's listing show.
pub async fn list_view<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    cursor: Option<&str>,
    limit: usize,
    reason: Option<&str>,
    scan_pages: usize,
) -> Result<Page<DeadLetter>, OperateError> {
    let listing = Listing {
        cursor,
        limit,
        reason,
        scan_pages,
        view: true,
    };
    list_loaded(conn, keys, listing).await
}

/// `listing`, with the stream's secret read first.
async fn list_loaded<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    listing: Listing<'_>,
) -> Result<Page<DeadLetter>, OperateError> {
    let secret = load_secret(conn, keys).await?;
    list_read(conn, keys, secret.as_ref(), listing).await
}

/// [`list`] with the stream's secret given: a caller that must not write (a replay) reads the
/// secret without recording anything.
pub async fn list_with<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    secret: Option<&Secret>,
    cursor: Option<&str>,
    limit: usize,
    reason: Option<&str>,
    scan_pages: usize,
) -> Result<Page<DeadLetter>, OperateError> {
    let listing = Listing {
        cursor,
        limit,
        reason,
        scan_pages,
        view: false,
    };
    list_read(conn, keys, secret, listing).await
}

/// What one listing asks for (see [`list`]); `view`: each letter cut for display.
struct Listing<'a> {
    cursor: Option<&'a str>,
    limit: usize,
    reason: Option<&'a str>,
    scan_pages: usize,
    view: bool,
}

async fn list_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    secret: Option<&Secret>,
    listing: Listing<'_>,
) -> Result<Page<DeadLetter>, OperateError> {
    let Listing {
        cursor,
        limit,
        reason,
        scan_pages,
        view,
    } = listing;
    if let Some(c) = cursor
        && !is_entry_id(c)
    {
        return Err(OperateError::Cursor(c.to_owned()));
    }
    let limit = limit.max(1);
    let owner = Owner::of(keys, secret);
    let mut from = cursor.map_or("+".to_owned(), |c| format!("({c}"));
    let mut items = Vec::new();
    for _ in 0..scan_pages.max(1) {
        let want = if reason.is_some() {
            BATCH
        } else {
            (limit - items.len()).min(BATCH)
        };
        let page: Vec<RawEntry> = if view {
            super::view_range(conn, &keys.dead_letter, true, (&from, "-"), want).await?
        } else {
            redis::cmd("XREVRANGE")
                .arg(&*keys.dead_letter)
                .arg(&from)
                .arg("-")
                .arg("COUNT")
                .arg(want)
                .query_async(conn)
                .await?
        };
        let exhausted = page.len() < want;
        for (id, fields) in page {
            from = format!("({id}");
            let letter = DeadLetter::decode(id, fields, &owner);
            if letter.ours && reason.is_none_or(|r| letter.reason_contains(r)) {
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

/// The stream's secret, with the legacy cutoffs of the subscription's streams (what verifies
/// the host's bookkeeping on copies and dead letters).
pub(super) async fn secret_of<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
) -> Result<Option<Secret>, OperateError> {
    load_secret(conn, keys).await
}

/// The stream's secret, with the legacy cutoffs of the subscription's streams.
async fn load_secret<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
) -> Result<Option<Secret>, OperateError> {
    let own = keys.own_streams();
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    Ok(Secret::load(conn, &keys.stream, &own).await?)
}

/// The dead letter `id`, if it is there (another subscription's too, marked as not
/// requeueable and not [`DeadLetter::ours`]).
pub async fn get<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    id: &str,
) -> Result<Option<DeadLetter>, OperateError> {
    get_read(conn, keys, id, false).await
}

/// [`get`], cut for display (see [`crate::control::operate::VIEW_VALUE_BYTES`]).
pub async fn get_view<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    id: &str,
) -> Result<Option<DeadLetter>, OperateError> {
    get_read(conn, keys, id, true).await
}

async fn get_read<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    id: &str,
    view: bool,
) -> Result<Option<DeadLetter>, OperateError> {
    if !is_entry_id(id) {
        return Ok(None);
    }
    let found: Vec<RawEntry> = if view {
        super::view_range(conn, &keys.dead_letter, false, (id, id), 1).await?
    } else {
        redis::cmd("XRANGE")
            .arg(&*keys.dead_letter)
            .arg(id)
            .arg(id)
            .query_async(conn)
            .await?
    };
    let Some((id, fields)) = found.into_iter().next() else {
        return Ok(None);
    };
    let secret = load_secret(conn, keys).await?;
    Ok(Some(DeadLetter::decode(
        id,
        fields,
        &Owner::of(keys, secret.as_ref()),
    )))
}

/// What a requeue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeued {
    /// Back with the group under this id (in its retry lane, or its stream).
    To(String),
    /// It was no longer in the dead-letter stream (requeued or deleted meanwhile).
    Gone,
}

/// The requeue script's options (see the header of `lua/requeue.lua`).
fn requeue_options(
    keys: &SubscriptionKeys,
    letter: &DeadLetter,
    origin: &str,
    mode: &str,
) -> Vec<u8> {
    ScriptOptions::default()
        .with("id", letter.id.as_str())
        .with("origin", origin)
        .with("stream", &*keys.stream)
        .with("group", &*keys.group)
        .with("mode", mode)
        .names(
            "fields",
            &[
                ("retry_count", keys::RETRY_COUNT),
                ("origin_id", keys::ORIGIN_ID),
                ("due_ms", keys::DUE_MS),
                ("origin_group", keys::ORIGIN_GROUP),
                ("mark", keys::MARK),
                ("parked", keys::PARKED),
                ("packed_fields", keys::PACKED_FIELDS),
            ],
        )
        .names(
            "seals",
            &[
                ("lane", Seal::Lane.name()),
                ("tail", Seal::Tail.name()),
                ("tail_packed", Seal::TailPacked.name()),
            ],
        )
        .with("max_fields", keys::SCRIPT_MAX_FIELDS as u64)
        .encode()
}

/// Put `letter` back to this subscription's group: into its retry lane (as the sweep puts a
/// due retry there), or with `retry_lane = false` onto its stream, with its own fields and a
/// `sluice-requeued-from` field naming the dead letter; with a trusted origin (see
/// [`DeadLetter::trusted`]) the origin id is kept and the attempt count starts again. The dead
/// letter is removed in the same script.
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
    let (target, mode) = match keys.lane.as_deref() {
        Some(lane) => (lane, "lane"),
        None => (&*keys.stream, "tail"),
    };
    let origin = letter
        .origin_id
        .as_deref()
        .filter(|_| letter.trusted)
        .unwrap_or("");
    let started = crate::support::clock::now();
    let mut invocation = REQUEUE.key(target);
    invocation
        .key(&*keys.dead_letter)
        .key(keys.secret())
        .arg(requeue_options(keys, letter, origin, mode));
    for (name, value) in &letter.fields {
        invocation.arg(name.as_slice()).arg(value.as_slice());
    }
    invocation.arg(keys::REQUEUED_FROM).arg(&letter.id);
    let id: Option<String> = match invocation.invoke_async(conn).await {
        // No host of the subscription has run yet to make the stream's secret, which seals
        // the lane copy: make it as a host would, and try once more.
        Err(err) if err.code() == Some(NO_SECRET) => {
            Secret::load_or_create(conn, &keys.stream, &[]).await?;
            invocation.invoke_async(conn).await?
        }
        other => other?,
    };
    if let Some(new_id) = &id {
        let origin = letter.origin_id.as_deref().unwrap_or(&letter.id);
        crate::observe::telemetry::operator_span(
            "requeue",
            (&keys.stream, &keys.group, origin),
            &letter.fields,
            started,
            vec![
                opentelemetry::KeyValue::new("dead_letter_id", letter.id.clone()),
                opentelemetry::KeyValue::new("new_id", new_id.clone()),
                opentelemetry::KeyValue::new("to", target.to_owned()),
            ],
        );
    }
    Ok(id.map_or(Requeued::Gone, Requeued::To))
}

/// The error code of `lua/requeue.lua` when the stream has no secret to seal a lane copy with.
const NO_SECRET: &str = "NOSECRET";

/// Delete this subscription's dead letters among `ids` (at most [`BATCH`] per command); returns
/// how many were there. Another subscription's are left alone.
pub async fn delete<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    ids: &[String],
) -> Result<usize, OperateError> {
    let secret = load_secret(conn, keys).await?;
    let owner = Owner::of(keys, secret.as_ref());
    let mut deleted = 0;
    for chunk in ids.chunks(BATCH) {
        let mut read = redis::pipe();
        for id in chunk.iter().filter(|id| is_entry_id(id)) {
            read.cmd("XRANGE").arg(&*keys.dead_letter).arg(id).arg(id);
        }
        let found: Vec<Vec<RawEntry>> = read.query_async(conn).await?;
        let ours: Vec<String> = found
            .into_iter()
            .flatten()
            .map(|(id, fields)| DeadLetter::decode(id, fields, &owner))
            .filter(|letter| letter.ours)
            .map(|letter| letter.id)
            .collect();
        if ours.is_empty() {
            continue;
        }
        let n: usize = redis::cmd("XDEL")
            .arg(&*keys.dead_letter)
            .arg(ours)
            .query_async(conn)
            .await?;
        deleted += n;
    }
    Ok(deleted)
}

/// `lua/move_dead_letter.lua`.
static MOVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/operate/lua/move_dead_letter")));

/// What one pass over the earlier release's default dead-letter stream did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Dead letters of this subscription moved to its own dead-letter stream.
    pub moved: usize,
    /// Where the next pass starts (the last id looked at).
    pub cursor: Option<String>,
    /// Consumer groups that read the earlier stream (a service that handles dead letters):
    /// then nothing is moved from under them.
    pub readers: Vec<String>,
}

/// Move this subscription's dead letters from the stream's default dead-letter stream of an
/// earlier release (`keys.legacy_dead_letter`, shared by every group of the stream) into its
/// own, after `cursor`, at most [`BATCH`] at a time until none is left: so a host of this
/// release lists and requeues them. Those whose origin the earlier release could vouch for
/// (written before this release took over) are sealed on the way; the others keep their
/// fields and are requeued as new entries. Other groups' dead letters, and entries no
/// subscription wrote, stay where they are; and nothing moves while a consumer group reads the
/// earlier stream (another service handling dead letters would lose them).
pub async fn migrate_legacy<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    cursor: Option<&str>,
) -> Result<Migrated, OperateError> {
    let Some(legacy) = keys.legacy_dead_letter.as_deref() else {
        return Ok(Migrated::default());
    };
    let mut done = Migrated {
        cursor: cursor.map(str::to_owned),
        ..Migrated::default()
    };
    // Nothing new (the usual case, once an upgrade is done): one command, not the secret's
    // script and the stream's groups as well.
    let mut page = legacy_page(conn, legacy, cursor).await?;
    if page.is_empty() {
        return Ok(done);
    }
    let secret = load_secret(conn, keys).await?;
    let owner = Owner {
        key: legacy,
        ..Owner::of(keys, secret.as_ref())
    };
    done.readers = crate::store::inspect::groups(conn, legacy).await?;
    if !done.readers.is_empty() {
        return Ok(done);
    }
    loop {
        let last = page.len() < BATCH;
        for (id, fields) in page {
            done.cursor = Some(id.clone());
            let letter = DeadLetter::decode(id.clone(), fields.clone(), &owner);
            if !letter.ours || letter.shape == Shape::Foreign {
                continue;
            }
            let fields = resealed(fields, &letter, &owner);
            let mut invocation = MOVE.key(legacy);
            invocation.key(&*keys.dead_letter).arg(&id);
            for (name, value) in &fields {
                invocation.arg(name.as_slice()).arg(value.as_slice());
            }
            let moved: Option<String> = invocation.invoke_async(conn).await?;
            done.moved += usize::from(moved.is_some());
        }
        if last {
            return Ok(done);
        }
        page = legacy_page(conn, legacy, done.cursor.as_deref()).await?;
    }
}

/// Up to [`BATCH`] entries of the earlier release's dead-letter stream after `cursor` (from
/// its start without one).
async fn legacy_page<C: ConnectionLike>(
    conn: &mut C,
    legacy: &str,
    cursor: Option<&str>,
) -> Result<Vec<RawEntry>, OperateError> {
    let from = cursor.map_or("-".to_owned(), |c| format!("({c}"));
    Ok(redis::cmd("XRANGE")
        .arg(legacy)
        .arg(&from)
        .arg("+")
        .arg("COUNT")
        .arg(BATCH)
        .query_async(conn)
        .await?)
}

/// The fields of a dead letter of the earlier release as this release writes them, sealed when
/// its origin is trusted; as they were otherwise.
fn resealed(
    mut fields: Vec<(Vec<u8>, Vec<u8>)>,
    letter: &DeadLetter,
    owner: &Owner<'_>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Some(secret) = owner.secret.filter(|_| letter.trusted) else {
        return fields;
    };
    let field = |name: &str, value: &[u8]| (name.as_bytes().to_vec(), value.to_vec());
    match letter.shape {
        Shape::Delivery if fields.len() >= LEGACY_TAIL.len() => {
            let written = &fields[..fields.len() - LEGACY_TAIL.len()];
            let digest = keys::fields_digest(written);
            let origin = letter.origin_id.as_deref().unwrap_or_default();
            let parts: [&[u8]; 4] = [
                owner.stream.as_bytes(),
                owner.group.as_bytes(),
                origin.as_bytes(),
                digest.as_bytes(),
            ];
            let packed =
                matches!(written, [(name, _)] if name.as_slice() == keys::PACKED_FIELDS.as_bytes());
            let use_ = if packed {
                Seal::DeadLetterPacked
            } else {
                Seal::DeadLetter
            };
            let mark = secret.seal(use_, &parts);
            fields.push(field(keys::MARK, mark.as_bytes()));
            fields
        }
        Shape::Member if fields.len() == LEGACY_MEMBER_LAYOUT.len() => {
            let member = fields[0].1.clone();
            let set = owner.set.unwrap_or_default();
            let parts: [&[u8]; 4] = [
                set.as_bytes(),
                owner.stream.as_bytes(),
                owner.group.as_bytes(),
                &member,
            ];
            let mark = secret.seal(Seal::Member, &parts);
            fields.push(field(keys::ORIGIN_GROUP, owner.group.as_bytes()));
            fields.push(field(keys::MARK, mark.as_bytes()));
            fields
        }
        _ => fields,
    }
}

/// Whether `id` has the shape of a stream entry id (`<ms>-<seq>`), so it can be passed to a
/// range command without changing its meaning.
pub fn is_entry_id(id: &str) -> bool {
    crate::store::keys::is_stream_id(id)
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

    const OWNER: Owner<'static> = Owner {
        stream: "s",
        group: "g",
        set: Some("s.delayed"),
        secret: None,
        key: "s.g.dead-letter",
    };

    /// A delivery's dead letter of the earlier release (no seal) written for `group`.
    fn legacy_letter(group: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs(&[
            ("payload", "{}"),
            (keys::REASON, "the producer's own"),
            (keys::REASON, "declined"),
            (keys::ORIGIN_STREAM, "s"),
            (keys::ORIGIN_GROUP, group),
            (keys::ORIGIN_ID, "1-0"),
            (keys::ENTRY_ID, "4-0"),
            (keys::RETRY_COUNT, "2"),
            (keys::DELIVERY_COUNT, "3"),
        ])
    }

    #[test]
    fn a_deliverys_dead_letter_keeps_the_producers_own_sluice_fields() {
        let letter = DeadLetter::decode("5-0".into(), legacy_letter("g"), &OWNER);
        assert_eq!(letter.shape, Shape::Delivery);
        assert_eq!(letter.reason.as_deref(), Some("declined"));
        assert_eq!(letter.origin_id.as_deref(), Some("1-0"));
        assert_eq!(letter.retry_count, Some(2));
        assert_eq!(
            letter.fields,
            pairs(&[("payload", "{}"), (keys::REASON, "the producer's own")])
        );
        assert!(letter.not_requeueable.is_none());
        assert!(letter.ours);
        assert!(!letter.trusted, "no secret, no trust");
        assert!(letter.reason_contains("DECLINED"));
        assert_eq!(letter.written_ms(), Some(5));
    }

    /// A traceback after the bookkeeping is the letter's, not one of the entry's fields (a
    /// requeue leaves it); on an entry Sluice did not write, the same field stays the entry's.
    #[test]
    fn a_traceback_is_kept_apart_only_after_sluices_bookkeeping() {
        let mut fields = legacy_letter("g");
        fields.extend(pairs(&[(keys::TRACE, "Traceback\n  File \"app.py\"")]));
        let letter = DeadLetter::decode("5-0".into(), fields, &OWNER);
        assert_eq!(letter.shape, Shape::Delivery);
        assert_eq!(
            letter.trace.as_deref(),
            Some("Traceback\n  File \"app.py\"")
        );
        assert_eq!(
            letter.fields,
            pairs(&[("payload", "{}"), (keys::REASON, "the producer's own")])
        );
        let foreign = pairs(&[("payload", "{}"), (keys::TRACE, "mine")]);
        let letter = DeadLetter::decode("6-0".into(), foreign.clone(), &OWNER);
        assert_eq!(letter.shape, Shape::Foreign);
        assert_eq!(letter.trace, None);
        assert_eq!(letter.fields, foreign);
    }

    #[test]
    fn another_groups_dead_letter_is_not_ours() {
        let letter = DeadLetter::decode("5-0".into(), legacy_letter("other"), &OWNER);
        assert!(!letter.ours);
        assert!(
            letter
                .not_requeueable
                .as_deref()
                .is_some_and(|why| why.contains("group `other`")),
            "{letter:?}"
        );
    }

    #[test]
    fn only_a_sealed_or_old_enough_dead_letter_has_a_trusted_origin() {
        // The dead-letter stream's last id when this release first used it: 99-0.
        let secret = Secret::from_value("k").with_legacy_cutoff("s.g.dead-letter", "99-0");
        let owner = Owner {
            secret: Some(&secret),
            ..OWNER
        };
        // The earlier release's form: trusted only on entries that were there before.
        assert!(DeadLetter::decode("99-0".into(), legacy_letter("g"), &owner).trusted);
        assert!(!DeadLetter::decode("99-1".into(), legacy_letter("g"), &owner).trusted);
        let elsewhere = Owner {
            key: "other.dead-letter",
            ..owner
        };
        assert!(!DeadLetter::decode("1-0".into(), legacy_letter("g"), &elsewhere).trusted);
        // This release's: the seal over stream, group, origin and the fields before it.
        let own = pairs(&[("payload", "{}")]);
        let digest = keys::fields_digest(&own);
        let seal = |origin: &str| {
            secret.seal(
                Seal::DeadLetter,
                &[b"s", b"g", origin.as_bytes(), digest.as_bytes()],
            )
        };
        let sealed = |origin: &str, mark: &str| {
            let mut fields = own.clone();
            fields.extend(pairs(&[
                (keys::REASON, "declined"),
                (keys::ORIGIN_STREAM, "s"),
                (keys::ORIGIN_GROUP, "g"),
                (keys::ORIGIN_ID, origin),
                (keys::ENTRY_ID, "4-0"),
                (keys::RETRY_COUNT, "2"),
                (keys::DELIVERY_COUNT, "3"),
                (keys::MARK, mark),
            ]));
            fields
        };
        let good = DeadLetter::decode("500-0".into(), sealed("1-0", &seal("1-0")), &owner);
        assert!(good.trusted && good.ours, "{good:?}");
        // A forged origin under a real seal, or a made-up seal: not trusted, still requeueable
        // (as a new entry of its own).
        let forged = DeadLetter::decode("500-0".into(), sealed("7-0", &seal("1-0")), &owner);
        assert!(!forged.trusted);
        assert!(forged.not_requeueable.is_none());
        let made_up = DeadLetter::decode("500-0".into(), sealed("1-0", &"0".repeat(40)), &owner);
        assert!(!made_up.trusted);
    }

    #[test]
    fn foreign_entries_are_shown_but_not_requeued() {
        let letter = DeadLetter::decode("1-0".into(), pairs(&[("x", "y")]), &OWNER);
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
