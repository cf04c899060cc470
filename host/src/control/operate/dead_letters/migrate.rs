//! The earlier release's dead letters: it wrote every group's into one dead-letter stream per
//! stream (`keys.legacy_dead_letter`); this release gives each subscription its own. A pass
//! moves this subscription's letters into its own stream (`lua/move_dead_letter.lua`, one per
//! letter), sealing those whose origin the earlier release could vouch for, so a host of this
//! release lists and requeues them.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use super::decode::{LEGACY_MEMBER_LAYOUT, LEGACY_TAIL, is_packed};
use super::letter::{DeadLetter, Owner, Shape};
use super::{RawEntry, secret_of};
use crate::control::operate::{BATCH, OperateError};
use crate::store::keys::{self, Seal, SubscriptionKeys};

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
    let secret = secret_of(conn, keys).await?;
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
            let moved = move_letter(conn, &keys.dead_letter, &owner, (id, fields)).await?;
            done.moved += usize::from(moved);
        }
        if last {
            return Ok(done);
        }
        page = legacy_page(conn, legacy, done.cursor.as_deref()).await?;
    }
}

/// Move the entry `(id, fields)` of the earlier stream (`owner.key`) into the subscription's own
/// dead-letter stream `to`, resealed, when it is one of `owner`'s dead letters; whether it
/// moved (not: another's, not Sluice's, or gone meanwhile).
async fn move_letter<C: ConnectionLike>(
    conn: &mut C,
    to: &str,
    owner: &Owner<'_>,
    (id, fields): RawEntry,
) -> Result<bool, OperateError> {
    let letter = DeadLetter::decode(id.clone(), fields.clone(), owner);
    if !letter.ours || letter.shape == Shape::Foreign {
        return Ok(false);
    }
    let fields = resealed(fields, &letter, owner);
    let mut invocation = MOVE.key(owner.key);
    invocation.key(to).arg(&id);
    for (name, value) in &fields {
        invocation.arg(name.as_slice()).arg(value.as_slice());
    }
    let moved: Option<String> = invocation.invoke_async(conn).await?;
    Ok(moved.is_some())
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
            let use_ = if is_packed(written) {
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
