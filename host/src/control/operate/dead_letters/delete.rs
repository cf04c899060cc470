//! Deleting dead letters by id: only this subscription's among them (each read and decoded
//! first, at most [`BATCH`] per command); another subscription's are left alone.

use redis::aio::ConnectionLike;

use super::letter::{DeadLetter, Owner};
use super::{RawEntry, is_entry_id, secret_of};
use crate::control::operate::{BATCH, OperateError};
use crate::store::keys::SubscriptionKeys;

/// Delete this subscription's dead letters among `ids` (at most [`BATCH`] per command); returns
/// how many were there. Another subscription's are left alone.
pub async fn delete<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    ids: &[String],
) -> Result<usize, OperateError> {
    let secret = secret_of(conn, keys).await?;
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
