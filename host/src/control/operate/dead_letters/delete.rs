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
        let letters: Vec<DeadLetter> = found
            .into_iter()
            .flatten()
            .map(|(id, fields)| DeadLetter::decode(id, fields, &owner))
            .filter(|letter| letter.ours)
            .collect();
        if letters.is_empty() {
            continue;
        }
        let ours: Vec<&str> = letters.iter().map(|l| l.id.as_str()).collect();
        let n: usize = redis::cmd("XDEL")
            .arg(&*keys.dead_letter)
            .arg(ours)
            .query_async(conn)
            .await?;
        deleted += n;
        // A dead letter that held its ordered key (`on_dead_letter = "hold"`) lets it go.
        if let Some(set) = keys.delayed.as_deref() {
            let origins: Vec<&str> = letters
                .iter()
                .filter_map(|l| l.origin_id.as_deref())
                .collect();
            crate::pipeline::order::forget(
                conn,
                (&keys.stream, &keys.group, set),
                &origins,
                crate::pipeline::order::OPERATOR_LET_IN,
            )
            .await?;
        }
    }
    Ok(deleted)
}
