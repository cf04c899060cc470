//! The acker: one task per subscription that sends queued acks in batches (one XACK per
//! source, on a connection of the node's lean pool), or, on an ordered subscription, one script
//! that acknowledges them and gives their keys' turns back; each retried while Redis is away.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Ack;
use crate::entry::delivery::Source;
use crate::observe::events::Events;
use crate::pipeline::order::Order;
use crate::store::keys::SubscriptionKeys;
use crate::store::redis_conn::{ErrorClass, ReconnectBackoff, RedisHandle};

/// When a batch of acks stops taking more queued messages: one XACK carries this many ids,
/// plus at most one read's worth.
const ACK_BATCH: usize = 1024;

/// Send queued acks in batches until the channel closes, retrying while Redis is away; on
/// `abandon`, stop at once and return how many acks were never sent. Acks of entries read from
/// the retry lane go to the lane, in a second XACK when a batch holds both.
pub(super) async fn run_acker(
    (keys, order): (SubscriptionKeys, Option<Arc<Order>>),
    conn: RedisHandle,
    mut rx: mpsc::UnboundedReceiver<Vec<Ack>>,
    events: Events,
    abandon: CancellationToken,
) -> usize {
    let (stream, group) = (&*keys.stream, &*keys.group);
    let mut batch: Vec<Ack> = Vec::with_capacity(ACK_BATCH);
    let mut backoff = ReconnectBackoff::default();
    let mut conn = AckConn {
        pooled: conn.non_blocking_reader(),
        handle: conn,
    };
    while let Some(acks) = rx.recv().await {
        batch.extend(acks);
        while batch.len() < ACK_BATCH
            && let Ok(acks) = rx.try_recv()
        {
            batch.extend(acks);
        }
        if let Some(order) = &order {
            if !ack_ordered(
                order,
                &mut batch,
                &conn.handle,
                &events,
                &mut backoff,
                &abandon,
            )
            .await
            {
                let queued: usize = std::iter::from_fn(|| rx.try_recv().ok())
                    .map(|a| a.len())
                    .sum();
                return gave_up(stream, batch.len() + queued);
            }
            continue;
        }
        for source in [Source::Lane, Source::Stream] {
            let sent = ack_one_source(
                AckTarget {
                    key: source.key(stream, keys.lane.as_deref()),
                    group,
                    source,
                },
                &mut batch,
                &mut conn,
                &events,
                &mut backoff,
                &abandon,
            )
            .await;
            if !sent {
                let queued: usize = std::iter::from_fn(|| rx.try_recv().ok())
                    .map(|a| a.len())
                    .sum();
                return gave_up(stream, batch.len() + queued);
            }
        }
    }
    0
}

/// Where one XACK goes: the key, the group, and which queued acks it carries.
/// Where the acker sends its XACKs: a connection of the node's lean pool when the node has
/// one (the acker writes and reads the reply itself, without redis-rs's connection task and
/// its reply parser between: issue 50), else the handle's shared connection (a cluster).
struct AckConn {
    handle: RedisHandle,
    pooled: Option<crate::store::redis_conn::Reader>,
}

impl AckConn {
    async fn query(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<u64> {
        match &mut self.pooled {
            Some(pooled) => {
                let reply = cmd.query_async(pooled).await;
                // The pool drops the connection; the handle follows a failover it shows (not a
                // timeout: that says nothing of the shared connection, which it would replace).
                if let Err(err) = &reply
                    && !err.is_timeout()
                {
                    self.handle.saw_error(err);
                }
                reply
            }
            None => cmd.query_async(&mut self.handle).await,
        }
    }
}

struct AckTarget<'a> {
    key: &'a str,
    group: &'a str,
    source: Source,
}

/// Acknowledge the acks in `batch` from `target.source` in one XACK (retrying while Redis is
/// away), report each, and remove them from the batch. False when `abandon` fired first.
async fn ack_one_source(
    target: AckTarget<'_>,
    batch: &mut Vec<Ack>,
    conn: &mut AckConn,
    events: &Events,
    backoff: &mut ReconnectBackoff,
    abandon: &CancellationToken,
) -> bool {
    let count = batch.iter().filter(|a| a.source == target.source).count();
    if count == 0 {
        return true;
    }
    let mut cmd = redis::cmd("XACK");
    cmd.arg(target.key).arg(target.group);
    for ack in batch.iter().filter(|a| a.source == target.source) {
        cmd.arg(&ack.id);
    }
    loop {
        let reply = tokio::select! {
            reply = conn.query(&cmd) => reply,
            () = abandon.cancelled() => return false,
        };
        match reply {
            Ok(_) => {
                backoff.reset();
                if let Some(del) =
                    forget_journals(batch.iter().filter(|a| a.source == target.source))
                {
                    let _ = conn.query(&del).await.inspect_err(journal_left);
                }
                for ack in batch.extract_if(.., |a| a.source == target.source) {
                    if let Some(event) = ack.event {
                        events.send(*event);
                    }
                }
                return true;
            }
            Err(err) if !ErrorClass::of(&err).is_transient() => {
                // Trying again cannot help; the entries stay pending (or, with the group
                // gone, are pending nowhere) and are read again like any unsettled entry.
                tracing::error!(
                    stream = %target.key,
                    group = %target.group,
                    dropped_acks = count,
                    %err,
                    "XACK refused: {}; the entries stay as Redis has them",
                    ErrorClass::of(&err).describe()
                );
                batch.retain(|a| a.source != target.source);
                return true;
            }
            Err(err) => {
                let pause = backoff.next_delay();
                tracing::warn!(
                    stream = %target.key,
                    acks_in_this_call = count,
                    %err,
                    retry_in_ms = pause.as_millis() as u64,
                    "XACK failed; entries stay pending, retrying"
                );
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = abandon.cancelled() => return false,
                }
            }
        }
    }
}

/// Acknowledge every ack in `batch` on an ordered subscription and give their turns back, in
/// one script (see `pipeline/order/lua/ack.lua`), retrying while Redis is away; report each and
/// empty the batch. False when `abandon` fired first.
async fn ack_ordered(
    order: &Order,
    batch: &mut Vec<Ack>,
    conn: &RedisHandle,
    events: &Events,
    backoff: &mut ReconnectBackoff,
    abandon: &CancellationToken,
) -> bool {
    let invocation = order.ack_invocation(batch.iter().map(|a| {
        (
            a.source,
            a.id.as_str(),
            a.origin.as_deref().unwrap_or(&a.id),
        )
    }));
    loop {
        let mut conn = conn.clone();
        let reply = tokio::select! {
            reply = invocation.invoke_async::<(u64, u64)>(&mut conn) => reply,
            () = abandon.cancelled() => return false,
        };
        match reply {
            Ok((_, went)) => {
                backoff.reset();
                order.let_in(went);
                if let Some(del) = forget_journals(batch.iter()) {
                    let _ = del
                        .query_async::<()>(&mut conn)
                        .await
                        .inspect_err(journal_left);
                }
                for ack in batch.drain(..) {
                    if let Some(event) = ack.event {
                        events.send(*event);
                    }
                }
                return true;
            }
            Err(err) if !ErrorClass::of(&err).is_transient() => {
                tracing::error!(
                    dropped_acks = batch.len(),
                    %err,
                    "acknowledging an ordered batch refused: {}; the entries stay as Redis has them (pending ones are read again)",
                    ErrorClass::of(&err).describe()
                );
                batch.clear();
                return true;
            }
            Err(err) => {
                let pause = backoff.next_delay();
                tracing::warn!(
                    acks_in_this_call = batch.len(),
                    %err,
                    retry_in_ms = pause.as_millis() as u64,
                    "acknowledging an ordered batch failed; entries stay pending, retrying"
                );
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = abandon.cancelled() => return false,
                }
            }
        }
    }
}

/// The `DEL` of the journals of `acks` that have one (see [`Ack`]), if any: sent once their
/// acks are in Redis. Not retried: a journal left goes with its time to live.
fn forget_journals<'a>(acks: impl Iterator<Item = &'a Ack>) -> Option<redis::Cmd> {
    let mut del: Option<redis::Cmd> = None;
    for key in acks.filter_map(|a| a.journal.as_deref()) {
        del.get_or_insert_with(|| redis::cmd("DEL")).arg(key);
    }
    del
}

/// A journal could not be deleted after its ack.
fn journal_left(err: &redis::RedisError) {
    tracing::debug!(%err, "could not delete the journals of acknowledged entries; they go with their time to live");
}

/// Log acks left unsent at a forced shutdown, and count them.
fn gave_up(stream: &str, unsent: usize) -> usize {
    tracing::warn!(
        stream,
        unsent,
        "giving up on acks: these entries stay pending and are re-read on restart"
    );
    unsent
}
