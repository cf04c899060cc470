//! A requeue: one dead letter back to this subscription's group, into its retry lane (or its
//! stream), with its own fields and a `sluice-requeued-from` field, removed from the
//! dead-letter stream in the same script (`lua/requeue.lua`, behind the seal it shares with the
//! sweep). Only a trusted origin id is kept ([`DeadLetter::trusted`]).

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use super::letter::DeadLetter;
use crate::control::operate::OperateError;
use crate::store::keys::{self, Seal, Secret, SubscriptionKeys};
use crate::store::options::ScriptOptions;

/// `lua/requeue.lua`, behind the seal it shares with the sweep.
static REQUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/operate/lua/requeue")));

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
/// letter is removed in the same script. With `new_idempotency_keys` the entry's outbound calls
/// get keys no earlier attempt had (a new `sluice-effects-epoch` field); without, the keys
/// its calls had before.
pub async fn requeue<C: ConnectionLike>(
    conn: &mut C,
    keys: &SubscriptionKeys,
    letter: &DeadLetter,
    new_idempotency_keys: bool,
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
        if new_idempotency_keys && name == keys::EFFECTS_EPOCH.as_bytes() {
            continue;
        }
        invocation.arg(name.as_slice()).arg(value.as_slice());
    }
    if new_idempotency_keys {
        invocation.arg(keys::EFFECTS_EPOCH).arg(&letter.id);
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
