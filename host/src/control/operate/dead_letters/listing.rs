//! Reading the dead-letter stream: this subscription's letters newest first (filtered by
//! reason, paged by id), one letter by its id, and the requeueable ones a bounded "requeue
//! all" works on. Each letter is decoded ([`super::decode`]) with the stream's secret, so a
//! listing shows whose it is and whether its origin is trusted.

use redis::aio::ConnectionLike;

use super::letter::{DeadLetter, Owner};
use super::{RawEntry, is_entry_id, secret_of};
use crate::control::operate::{BATCH, OperateError, Page, view_range};
use crate::store::keys::{Secret, SubscriptionKeys};

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
    let secret = secret_of(conn, keys).await?;
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

/// `listing` of the letters in `keys`' dead-letter stream, decoded with `secret`: pages of
/// [`BATCH`] back from the cursor until `limit` letters matched or `scan_pages` were read.
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
        let page = page_back(conn, &keys.dead_letter, &from, want, view).await?;
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

/// Up to `count` entries of the dead-letter stream `key` from `from` back (XREVRANGE), each cut
/// for display when `view`.
async fn page_back<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    from: &str,
    count: usize,
    view: bool,
) -> Result<Vec<RawEntry>, OperateError> {
    if view {
        return Ok(view_range(conn, key, true, (from, "-"), count).await?);
    }
    Ok(redis::cmd("XREVRANGE")
        .arg(key)
        .arg(from)
        .arg("-")
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?)
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

/// [`get`], cut for display when `view`.
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
        view_range(conn, &keys.dead_letter, false, (id, id), 1).await?
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
    let secret = secret_of(conn, keys).await?;
    Ok(Some(DeadLetter::decode(
        id,
        fields,
        &Owner::of(keys, secret.as_ref()),
    )))
}
