//! Carrying a decision out in Redis: acks (batched), dead letters (one atomic script), and
//! retries that stay pending.
//!
//! - An ack goes to the subscription's acker task, which sends one XACK for everything that is
//!   waiting, retries it with backoff while Redis is away, and reports each ack once it is in.
//! - A dead letter runs `lua/dead_letter.lua`: if the entry is still pending, XADD to the
//!   dead-letter stream with the entry's fields, the reason, the origin stream, group and id
//!   (the entry the producer added), the id dead-lettered, the retry count, the delivery
//!   count and, when the stream has a secret, the host's seal over the stream, group, origin id
//!   and fields (what lets a requeue trust the origin id), and only then XACK. An entry with more fields than one XADD from a script can carry
//!   has them packed into one `sluice-packed-fields` value (MessagePack), so it is recorded
//!   whole.
//!
//! Failures: while Redis is unreachable or busy, a settle is tried again with capped backoff
//! (the entry stays pending meanwhile). A failure that trying again cannot fix (a key of the
//! wrong type, a script error) is a [`SettleError`]: the entry stays pending, and dispatch
//! brings it back later through the pending-retry path.
//! - A retry with a delayed-retry set parks the entry there ([`crate::pipeline::delayed`]).
//! - A retry without a delayed-retry set leaves the entry pending; the subscription brings it
//!   back after the delay (or, on a claiming subscription, XAUTOCLAIM does after `min_idle`).
//!
//! The acker task (batched XACKs, or on an ordered subscription the script that gives the keys'
//! turns back with them) is in [`acker`].

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::entry::delivery::{Delivery, Source};
use crate::observe::events::{Event, EventKind, Events};
use crate::pipeline::delayed::{DelayedSet, Parked};
use crate::pipeline::order::Order;
use acker::run_acker;

mod acker;
use crate::store::keys::{self, SubscriptionKeys};
use crate::store::redis_conn::{ErrorClass, ReconnectBackoff, RedisHandle};
use crate::support::digest::Digest;

/// A settle Redis refused in a way that trying the same command again cannot fix. The entry
/// stays pending.
#[derive(Debug, thiserror::Error)]
#[error("{what} failed: {}: {error}", class.describe())]
pub struct SettleError {
    /// What was being done.
    pub what: &'static str,
    /// What kind of failure it was.
    pub class: ErrorClass,
    /// What Redis said.
    pub error: redis::RedisError,
}

/// `lua/dead_letter.lua`, behind the pending check and the history record it shares with the
/// park script.
static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/settle/lua/dead_letter")));

/// `lua/dead_letter_in_place.lua`, behind the pending check, the history record and the seal.
static IN_PLACE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(crate::store::lua!(
        "pipeline/settle/lua/dead_letter_in_place"
    ))
});

/// The dead-letter script's SHA-1, as Redis names it in `EVALSHA`, `SLOWLOG` and `MONITOR`: how
/// an operator (or a fault test's proxy) tells a dead-letter write from the host's other calls.
pub fn dead_letter_script_sha() -> &'static str {
    DEAD_LETTER.get_hash()
}

/// An entry to acknowledge, and the event that reports it once Redis has the XACK.
#[derive(Debug)]
pub struct Ack {
    source: Source,
    id: String,
    /// Its origin id, on an ordered subscription: the ack gives back the turn it holds.
    origin: Option<Box<str>>,
    /// The journal of its outbound calls, when an attempt found or wrote one: deleted once
    /// the ack is in Redis (else it goes with its time to live).
    journal: Option<Box<str>>,
    /// Made only while someone listens to the events.
    event: Option<Box<Event>>,
}

/// Settles one subscription's deliveries.
pub struct Settler {
    stream: Arc<str>,
    /// The retry lane, if the subscription has one: entries read from it are settled there.
    lane: Option<Arc<str>>,
    group: Arc<str>,
    /// This host's consumer name, which the entry's history records.
    consumer: Arc<str>,
    dead_letter: Arc<str>,
    dead_letter_maxlen: u64,
    /// How many entries' histories the subscription keeps (0: none).
    history_entries: u32,
    conn: RedisHandle,
    delayed: Option<Arc<DelayedSet>>,
    /// The keys' turns, on an ordered subscription: acks and dead letters give them back.
    order: Option<Arc<Order>>,
    /// The stream's secret, which seals dead letters (none: they go unsealed).
    secret: Option<Arc<keys::Secret>>,
    acks: mpsc::UnboundedSender<Vec<Ack>>,
    events: Events,
    /// Cancelled when the host must give up on Redis (a forced shutdown).
    abandon: CancellationToken,
}

impl Settler {
    /// A settler, and the acker task that must be spawned for it. The acker ends once every
    /// clone of the settler is dropped and the acks it holds are in Redis, or when `abandon`
    /// fires; it returns how many acks it had to leave unsent.
    pub fn new(
        keys: &SubscriptionKeys,
        consumer: &str,
        conn: RedisHandle,
        (delayed, order): (Option<Arc<DelayedSet>>, Option<Arc<Order>>),
        secret: Option<Arc<keys::Secret>>,
        events: Events,
        abandon: CancellationToken,
    ) -> (
        Self,
        impl std::future::Future<Output = usize> + Send + 'static,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let acker = run_acker(
            (keys.clone(), order.clone()),
            conn.clone(),
            rx,
            events.clone(),
            abandon.clone(),
        );
        (
            Self {
                stream: keys.stream.clone(),
                lane: keys.lane.clone(),
                group: keys.group.clone(),
                consumer: consumer.into(),
                dead_letter: keys.dead_letter.clone(),
                dead_letter_maxlen: keys.maxlen_arg(),
                history_entries: keys.history_entries,
                conn,
                delayed,
                order,
                secret,
                acks: tx,
                events,
                abandon,
            },
            acker,
        )
    }

    /// The event describing `delivery` settled as `kind`.
    pub fn event(&self, delivery: &Delivery, digest: &Digest, kind: EventKind) -> Event {
        Event {
            stream: self.stream.clone(),
            group: self.group.clone(),
            id: delivery.entry.id.clone(),
            origin_id: delivery.origin_id.clone(),
            retry_count: delivery.retry_count,
            delivery_count: delivery.delivery_count,
            digest: digest.clone(),
            started: delivery.started,
            kind,
        }
    }

    /// Whether anyone listens to the events (only then are they made).
    pub fn events_listened(&self) -> bool {
        self.events.listened()
    }

    /// The ack of `delivery`, to be queued with [`Self::ack_all`].
    pub fn ack_of(&self, delivery: &Delivery, digest: &Digest) -> Ack {
        self.ack_as(delivery, digest, EventKind::Acked)
    }

    /// The ack of `delivery`, reported as `kind` once it is in Redis.
    pub fn ack_as(&self, delivery: &Delivery, digest: &Digest, kind: EventKind) -> Ack {
        Ack {
            source: delivery.source,
            id: delivery.entry.id.clone(),
            origin: self
                .order
                .as_ref()
                .map(|_| delivery.origin_id.as_str().into()),
            journal: delivery.journal.as_ref().filter(|j| j.used()).map(|_| {
                crate::store::effects::key(
                    &delivery.stream,
                    &delivery.group,
                    &delivery.origin_id,
                    delivery.effects_epoch(),
                )
                .into()
            }),
            event: self
                .events
                .listened()
                .then(|| Box::new(self.event(delivery, digest, kind))),
        }
    }

    /// Queue acks; the acker sends them with others and reports each once Redis has it.
    pub fn ack_all(&self, acks: Vec<Ack>) {
        if acks.is_empty() {
            return;
        }
        if let Err(unsent) = self.acks.send(acks) {
            // Only after a forced shutdown: the entries stay pending and are re-read on restart.
            for ack in unsent.0 {
                tracing::warn!(id = %ack.id, "acker is gone; entry stays pending");
            }
        }
    }

    /// The Redis server's current time as this host best knows it, if its delayed set has
    /// seen the server's clock (see [`DelayedSet::server_now_ms`]).
    pub fn server_now_ms(&self) -> Option<i64> {
        self.delayed.as_ref().and_then(|d| d.server_now_ms())
    }

    /// Whether retries go to a delayed-retry set.
    pub fn has_delayed_set(&self) -> bool {
        self.delayed.is_some()
    }

    /// Park the entry in the delayed-retry set (acknowledging it), retrying while Redis is
    /// away. `Ok(false)` when there is no set, the entry was no longer pending, or the host gave
    /// up on Redis (the entry then stays pending).
    pub async fn park(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        delay: Duration,
        cause: String,
    ) -> Result<bool, SettleError> {
        let Some(set) = &self.delayed else {
            return Ok(false);
        };
        let record = crate::entry::history::Record::of(
            delivery,
            &self.consumer,
            crate::entry::history::Action::Retry,
            (&cause, Some(delay)),
            self.history_entries,
        );
        let parked = self
            .until_done(delivery, "parking", || {
                set.park_noting(delivery, delay, &record, crate::entry::history::KEEP)
            })
            .await?;
        match parked {
            Some(Parked::Due { due_ms, acked }) => {
                if !acked {
                    group_gone(delivery, "parked");
                }
                let kind = EventKind::Parked {
                    delay,
                    due_ms,
                    cause,
                };
                self.events.send(self.event(delivery, digest, kind));
                Ok(true)
            }
            Some(Parked::NotPending) => {
                not_pending(delivery, "parking");
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// Report a retry that stays pending.
    pub fn retry_pending(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        delay: Duration,
        cause: String,
    ) {
        self.events
            .send(self.event(delivery, digest, EventKind::RetryPending { delay, cause }));
    }

    /// Dead-letter the entry and ack it, retrying while Redis is away. `Ok(false)` when the
    /// entry was no longer pending (already settled elsewhere) or the host gave up on Redis.
    pub async fn dead_letter(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        reason: &str,
        trace: Option<&str>,
    ) -> Result<bool, SettleError> {
        let mut invocation = self.dead_letter_invocation(&DEAD_LETTER, delivery, reason);
        // A producer's fields named like the host's own go in under another name (undone when
        // the dead letter is read), so that the host's bookkeeping is the only `sluice-*`.
        let fields: Vec<(Vec<u8>, Vec<u8>)> = delivery
            .user_fields()
            .iter()
            .map(|(name, value)| (keys::escaped_name(name).into_owned(), value.clone()))
            .collect();
        let fields = fields.as_slice();
        let packed;
        let written: &[(Vec<u8>, Vec<u8>)] = if fields.len() > keys::SCRIPT_MAX_FIELDS {
            packed = [(keys::PACKED_FIELDS.as_bytes().to_vec(), pack_fields(fields))];
            &packed
        } else {
            fields
        };
        for (name, value) in written {
            invocation.arg(name.as_slice()).arg(value.as_slice());
        }
        self.bookkeeping(&mut invocation, delivery, reason);
        if let Some(secret) = &self.secret {
            let digest = keys::fields_digest(written);
            let parts: [&[u8]; 4] = [
                self.stream.as_bytes(),
                self.group.as_bytes(),
                delivery.origin_id.as_bytes(),
                digest.as_bytes(),
            ];
            let use_ = if written.len() == fields.len() {
                keys::Seal::DeadLetter
            } else {
                keys::Seal::DeadLetterPacked
            };
            invocation.arg(keys::MARK).arg(secret.seal(use_, &parts));
        }
        // After the bookkeeping (and outside the seal): the traceback, when there is one.
        if let Some(trace) = trace {
            invocation.arg(keys::TRACE).arg(trace);
        }
        // Last: the key's turn the entry gives back (or holds), on an ordered subscription.
        if let Some(order) = &self.order {
            order.dead_letter_turn(&mut invocation, &delivery.origin_id);
        }
        let written = self
            .write_dead_letter(delivery, (digest, reason), &invocation)
            .await;
        if let (Ok(true), Some(order)) = (&written, &self.order) {
            order.after_dead_letter();
        }
        written
    }

    /// A dead-letter script's call for `delivery`, with what both forms take first: the
    /// entry's stream, the dead-letter stream and the histories; the group, the entry, the
    /// trim, the history note and how long it is kept.
    fn dead_letter_invocation<'a>(
        &self,
        script: &'a Script,
        delivery: &Delivery,
        reason: &str,
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.key(delivery.source.key(&self.stream, self.lane.as_deref()));
        invocation
            .key(&*self.dead_letter)
            .key(keys::history_key(&self.stream, &self.group))
            .key(keys::history_index_key(&self.stream, &self.group))
            .arg(&*self.group)
            .arg(&delivery.entry.id)
            .arg(self.dead_letter_maxlen)
            .arg(crate::entry::history::Record::of(
                delivery,
                &self.consumer,
                crate::entry::history::Action::DeadLetter,
                (reason, None),
                self.history_entries,
            ))
            .arg(crate::entry::history::KEEP.as_millis() as u64);
        invocation
    }

    /// Run a dead-letter script's call until Redis answers, and report what it came to.
    async fn write_dead_letter(
        &self,
        delivery: &Delivery,
        (digest, reason): (&Digest, &str),
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<bool, SettleError> {
        let written = self
            .until_done(delivery, "dead-lettering", || {
                let mut conn = self.conn.clone();
                async move {
                    invocation
                        .invoke_async::<Option<(String, i64)>>(&mut conn)
                        .await
                }
            })
            .await?;
        Ok(self.dead_lettered(delivery, digest, reason, written))
    }

    /// The bookkeeping a delivery's dead letter ends with (see `operate::dead_letters::TAIL`,
    /// before the seal): why, where from, which entry, how many attempts.
    fn bookkeeping(
        &self,
        invocation: &mut redis::ScriptInvocation<'_>,
        delivery: &Delivery,
        reason: &str,
    ) {
        invocation
            .arg(keys::REASON)
            .arg(reason)
            .arg(keys::ORIGIN_STREAM)
            .arg(&*self.stream)
            .arg(keys::ORIGIN_GROUP)
            .arg(&*self.group)
            .arg(keys::ORIGIN_ID)
            .arg(&delivery.origin_id)
            .arg(keys::ENTRY_ID)
            .arg(&delivery.entry.id)
            .arg(keys::RETRY_COUNT)
            .arg(delivery.retry_count.to_string())
            .arg(keys::DELIVERY_COUNT)
            .arg(delivery.delivery_count.to_string());
    }

    /// Report what a dead-letter script came to: whether the entry went.
    fn dead_lettered(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        reason: &str,
        written: Option<Option<(String, i64)>>,
    ) -> bool {
        match written {
            Some(Some((_, acked))) => {
                if acked == 0 {
                    group_gone(delivery, "dead-lettered");
                }
                let kind = EventKind::DeadLettered {
                    reason: reason.to_owned(),
                };
                self.events.send(self.event(delivery, digest, kind));
                true
            }
            Some(None) => {
                not_pending(delivery, "dead-lettering");
                false
            }
            None => false,
        }
    }

    /// Dead-letter an entry the read did not keep whole (a field over `max_entry_bytes`),
    /// copying its fields inside Redis (`lua/dead_letter_in_place.lua`), and ack it, retrying
    /// while Redis is away: the host never holds them. As [`Self::dead_letter`] otherwise.
    pub async fn dead_letter_in_place(
        &self,
        delivery: &Delivery,
        digest: &Digest,
        reason: &str,
    ) -> Result<bool, SettleError> {
        let mut invocation = self.dead_letter_invocation(&IN_PLACE, delivery, reason);
        invocation
            .arg(keys::SCRIPT_MAX_FIELDS)
            .arg(keys::PACKED_FIELDS)
            .arg(self.secret.as_ref().map_or("", |s| s.value()))
            .arg(keys::Seal::DeadLetter.name())
            .arg(keys::Seal::DeadLetterPacked.name())
            .arg(&*self.stream)
            .arg(&delivery.origin_id)
            .arg(keys::MARK)
            .arg(keys::PRODUCER_PREFIX);
        self.bookkeeping(&mut invocation, delivery, reason);
        self.write_dead_letter(delivery, (digest, reason), &invocation)
            .await
    }

    /// Run `attempt` until Redis answers, pausing with capped backoff while it is unreachable
    /// or busy; the entry stays pending meanwhile. `Ok(None)` if the host gave up on Redis
    /// (forced shutdown); an error Redis will repeat is returned at once.
    async fn until_done<T, F, Fut>(
        &self,
        delivery: &Delivery,
        what: &'static str,
        mut attempt: F,
    ) -> Result<Option<T>, SettleError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let mut backoff = ReconnectBackoff::default();
        loop {
            match attempt().await {
                Ok(value) => return Ok(Some(value)),
                Err(err) => {
                    let class = ErrorClass::of(&err);
                    if !class.is_transient() {
                        return Err(SettleError {
                            what,
                            class,
                            error: err,
                        });
                    }
                    let pause = backoff.next_delay();
                    tracing::warn!(
                        id = %delivery.entry.id,
                        %err,
                        retry_in_ms = pause.as_millis() as u64,
                        "{what} failed: {}; entry stays pending, retrying",
                        class.describe()
                    );
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = self.abandon.cancelled() => return Ok(None),
                    }
                }
            }
        }
    }
}

fn group_gone(delivery: &Delivery, what: &str) {
    tracing::warn!(
        id = %delivery.entry.id,
        "the consumer group no longer exists (stream or group deleted); the entry was {what} anyway and there was nothing to acknowledge"
    );
}

/// Fields packed into one MessagePack array `[name, value, ...]` of byte strings.
fn pack_fields(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_array_len(&mut out, (fields.len() * 2) as u32);
    for (name, value) in fields {
        for part in [name, value] {
            let _ = rmp::encode::write_bin_len(&mut out, part.len() as u32);
            out.extend_from_slice(part);
        }
    }
    out
}

fn not_pending(delivery: &Delivery, what: &str) {
    tracing::warn!(
        id = %delivery.entry.id,
        "entry was no longer pending when {what} (another consumer settled it); left as it is"
    );
}
