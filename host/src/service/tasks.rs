//! The background tasks a partition keeps besides its read loop: its claim on its keys, and
//! the move of its dead letters out of an earlier release's shared dead-letter stream.

use tokio_util::sync::CancellationToken;

use crate::store::keys::SubscriptionKeys;
use crate::store::redis_conn;

/// Claim `keys` again every [`crate::store::keys::CLAIM_RENEW`] until `stop`, so that they stay this
/// subscription's while it runs and lapse a day after its last host stopped.
pub(super) async fn renew_claims(
    conn: redis_conn::RedisHandle,
    keys: SubscriptionKeys,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(crate::store::keys::CLAIM_RENEW) => {}
        }
        if let Err(err) = crate::store::keys::claim(&mut conn.clone(), &keys).await {
            tracing::error!(
                stream = %keys.stream,
                group = %keys.group,
                err = %crate::support::chain::chain(&err),
                "cannot renew this subscription's claim on its keys"
            );
        }
    }
}

/// How often a subscription looks for dead letters an earlier release's host put in the
/// stream's shared default dead-letter stream (only hosts of that release still write there,
/// during a rolling upgrade).
const MIGRATE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Move this subscription's dead letters out of the earlier release's default dead-letter
/// stream, at start and then every [`MIGRATE_EVERY`], each pass from where the last ended;
/// with a `bell` on that stream, a pass runs only when it was written (or the bell cannot
/// vouch that it was not), so thousands of idle subscriptions send nothing for it.
pub(super) async fn migrate_dead_letters(
    keys: SubscriptionKeys,
    mut conn: redis_conn::RedisHandle,
    bell: Option<crate::store::doorbell::Bell>,
) {
    let mut cursor: Option<String> = None;
    let mut warned = false;
    loop {
        if let Some(bell) = &bell {
            // Before the pass: a write during it rings again.
            bell.seen();
        }
        match crate::control::operate::dead_letters::migrate_legacy(
            &mut conn,
            &keys,
            cursor.as_deref(),
        )
        .await
        {
            Ok(done) if !done.readers.is_empty() => {
                if !warned {
                    tracing::warn!(
                        from = keys.legacy_dead_letter.as_deref().unwrap_or_default(),
                        to = %keys.dead_letter,
                        readers = %done.readers.join(", "),
                        "an earlier release dead-lettered this group's entries to the stream's shared dead-letter stream, which consumer groups read: they stay there; this group dead-letters to its own stream now (point those readers at it, or set dead_letter to the old name)"
                    );
                    warned = true;
                }
            }
            Ok(done) => {
                if done.moved > 0 {
                    tracing::info!(
                        from = keys.legacy_dead_letter.as_deref().unwrap_or_default(),
                        to = %keys.dead_letter,
                        moved = done.moved,
                        "moved this group's dead letters from the earlier release's shared dead-letter stream to its own"
                    );
                }
                cursor = done.cursor;
            }
            Err(err) => tracing::warn!(
                from = keys.legacy_dead_letter.as_deref().unwrap_or_default(),
                %err,
                "cannot move dead letters of an earlier release yet; trying again later"
            ),
        }
        match &bell {
            Some(bell) => while !bell.wait(MIGRATE_EVERY, None).await {},
            None => tokio::time::sleep(MIGRATE_EVERY).await,
        }
    }
}
