//! Ordered keys: entries with one key are handled one (or `max_in_flight_per_key`) at a time,
//! in stream order, across every host of the group and across retries; entries of other keys
//! never wait for them.
//!
//! The step sits between [`crate::pipeline::read`] and [`crate::pipeline::dispatch`]. Its state
//! is in Redis, in the stream's hash slot (`lib/order.lua` describes it), never in a host:
//!
//! - **Take** (`lua/take.lua`, once per read): an entry whose key has a free turn and nothing
//!   waiting takes the turn and runs; one that holds a turn already (a retry coming back, an
//!   entry rescued from a dead host, one let in) runs.
//! - **Hold** (`lua/hold.lua`, for the others): the entry is copied into its key's waiting list
//!   as a delayed-set member and acknowledged, atomically; so a hot key's burst moves aside at
//!   read time and never stands between the reader and other keys' entries (the fair share).
//! - **Give back** (`lua/ack.lua` with the acks, and the dead-letter script): the turn is given
//!   back in the same script that settles the entry, and the key's next waiting entries go to
//!   the delayed set due now, from where the sweep returns them to the group's retry lane.
//!   A parked retry keeps its turn: the entries behind it wait, in Redis, until it settles.
//! - **Release** (`lua/release.lua`): an operator gives every turn of a key back.
//!
//! A turn belongs to the entry's origin id, which stays the same through parks, the lane and
//! requeues, so a host killed while it holds one loses nothing: the entry is pending, another
//! host claims it once idle, finds it holds the turn, and handles it. An entry without the key,
//! or with a key longer than `max_key_bytes`, is handled unordered and counted
//! (`sluice_ordered_unkeyed`), never stuck. Keys reach Redis only as their digest in key names
//! and, bounded, as a hash value the operator's listing shows.

pub mod inspect;
mod read;

pub use read::{NewEntries, OrderedEntry};

use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::counter::Counter;
use redis::{RedisResult, Script, ScriptInvocation};
use sha1::{Digest as _, Sha1};
use sluice_descriptor::{OnDeadLetter, OrderKey, OrderedBy};

use crate::entry::delivery::{Delivery, Source};
use crate::entry::member::NewMember;
use crate::pipeline::delayed::DelayedSet;
use crate::store::keys::{self, SubscriptionKeys};
use crate::store::redis_conn::RedisHandle;

static TAKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/order/lua/take")));
static HOLD: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/order/lua/hold")));
static ACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/order/lua/ack")));
static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/order/lua/forget")));
static UNORDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/order/lua/unorder")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/order/lua/release")));

/// Where an entry's key is, once looked for.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyOf {
    /// The key's bytes.
    Keyed(Vec<u8>),
    /// The entry has no key (the field or the pointer is missing, the payload is no JSON).
    Missing,
    /// The key is longer than `max_key_bytes`.
    TooLong,
}

/// The Redis keys of one subscription's ordering (see [`keys::order_prefix`]).
#[derive(Debug, Clone)]
pub struct OrderKeys {
    prefix: String,
    /// Key digest -> the key's text, while the key has state.
    pub names: String,
    /// Key digest -> when its entries started waiting.
    pub waiting: String,
    /// Origin id -> `<digest>:<ms>` (or `<digest>:dead:<ms>`), for every turn held: finds a
    /// turn from its entry alone.
    pub turns: String,
    /// Key digest -> the entries of the key that hold a turn or wait for one.
    pub load: String,
}

impl OrderKeys {
    /// The keys of `stream`'s `group`.
    pub fn new(stream: &str, group: &str) -> Self {
        let prefix = keys::order_prefix(stream, group);
        Self {
            names: format!("{prefix}:names"),
            waiting: format!("{prefix}:waiting"),
            turns: format!("{prefix}:turns"),
            load: format!("{prefix}:load"),
            prefix,
        }
    }

    /// The list of the key's waiting entries.
    pub fn wait(&self, digest: &str) -> String {
        format!("{}:wait:{digest}", self.prefix)
    }
}

/// The digest that names a key in Redis: its SHA-1 in hex, as the read script makes it
/// (`redis.sha1hex`). Not a secret: it only keeps a key's bytes out of key names.
pub fn digest(key: &[u8]) -> String {
    hex::encode(Sha1::digest(key))
}

/// Where `delivery`'s key is (`key` in its fields, or in the JSON of `payload_field`), as the
/// read script finds it (`lib/entry_key.lua`), and whether it is within `max_key_bytes`.
pub fn key_in(
    delivery: &Delivery,
    key: &OrderKey,
    payload_field: &str,
    max_key_bytes: usize,
) -> KeyOf {
    let key = match key {
        OrderKey::Field(name) => delivery
            .user_fields()
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| v.clone()),
        OrderKey::Payload(pointer) => delivery
            .user_fields()
            .iter()
            .find(|(n, _)| n == payload_field.as_bytes())
            .and_then(|(_, v)| serde_json::from_slice::<serde_json::Value>(v).ok())
            .and_then(|json| match json.pointer(pointer)? {
                serde_json::Value::String(s) => Some(s.clone().into_bytes()),
                serde_json::Value::Bool(b) => Some(b.to_string().into_bytes()),
                serde_json::Value::Number(n) => n
                    .as_i64()
                    .filter(|i| i.unsigned_abs() < 1 << 53)
                    .map(|i| i.to_string().into_bytes()),
                // null, objects, arrays: no key (as the read script says).
                _ => None,
            }),
    };
    match key {
        None => KeyOf::Missing,
        Some(key) if key.len() > max_key_bytes => KeyOf::TooLong,
        Some(key) => KeyOf::Keyed(key),
    }
}

/// One ordered subscription's turns.
pub struct Order {
    spec: OrderedBy,
    payload_field: Arc<str>,
    stream: Arc<str>,
    lane: Option<Arc<str>>,
    group: Arc<str>,
    keys: OrderKeys,
    set: Arc<DelayedSet>,
    ttl_ms: u64,
    conn: RedisHandle,
    missing: Counter,
    too_long: Counter,
    held: Counter,
    let_in: Counter,
}

/// What a read's deliveries came to.
pub struct Admitted {
    /// Those that run now, each with its turn (none if unkeyed), in the read's order.
    pub run: Vec<Delivery>,
    /// How many were queued behind their key.
    pub held: usize,
}

impl Order {
    /// The ordering of the subscription with `keys`, whose delayed set is `set` (ordering
    /// needs one: the entries let in go back through it).
    pub fn new(
        spec: OrderedBy,
        payload_field: &str,
        keys: &SubscriptionKeys,
        set: Arc<DelayedSet>,
        ttl: Option<std::time::Duration>,
        conn: RedisHandle,
        metrics: &crate::observe::metrics::Metrics,
    ) -> Self {
        let labels = metrics.series(&crate::observe::metrics::Metrics::labels(
            &keys.stream,
            &keys.group,
        ));
        let reason = |reason| {
            crate::observe::metrics::Metrics::reason_counter(
                &metrics.ordered_unkeyed,
                &labels,
                reason,
            )
        };
        Self {
            missing: reason("missing"),
            too_long: reason("too_long"),
            held: metrics.ordered_held.get_or_create(&labels).clone(),
            let_in: metrics.ordered_let_in.get_or_create(&labels).clone(),
            spec,
            payload_field: payload_field.into(),
            stream: keys.stream.clone(),
            lane: keys.lane.clone(),
            group: keys.group.clone(),
            keys: OrderKeys::new(&keys.stream, &keys.group),
            set,
            ttl_ms: ttl.map_or(0, |t| t.as_millis().max(1) as u64),
            conn,
        }
    }

    /// Where `delivery`'s key is, and whether it is one the ordering takes.
    pub fn key_of(&self, delivery: &Delivery) -> KeyOf {
        key_in(
            delivery,
            &self.spec.key,
            &self.payload_field,
            self.spec.max_key_bytes,
        )
    }

    /// The six keys every order script but the operator's takes first.
    fn invocation<'a>(&self, script: &'a Script) -> ScriptInvocation<'a> {
        let mut invocation = script.key(&self.keys.names);
        invocation
            .key(&self.keys.waiting)
            .key(&*self.stream)
            .key(self.lane.as_deref().unwrap_or(&self.stream))
            .key(self.set.key())
            .key(&self.keys.turns);
        invocation
    }

    /// Which of a read's deliveries run now: each keyed one takes its key's turn or is queued
    /// behind it in Redis (and acknowledged); unkeyed ones run unordered. Entries another
    /// consumer settled meanwhile are left out.
    /// On a failure every delivery comes back with the error: both scripts are safe to run
    /// again (a turn taken is held, an entry queued is no longer pending).
    pub async fn admit(
        &self,
        deliveries: Vec<Delivery>,
    ) -> Result<Admitted, (redis::RedisError, Vec<Delivery>)> {
        let mut keyed = Vec::with_capacity(deliveries.len());
        let mut any = false;
        for delivery in deliveries {
            let key = if delivery.stray || delivery.other_group.is_some() || delivery.cut.fields > 0
            {
                // Never handled (dead-lettered or acknowledged as they are): no turn.
                KeyOf::Missing
            } else {
                self.key_of(&delivery)
            };
            match key {
                KeyOf::Keyed(key) => {
                    any = true;
                    keyed.push((delivery, Some((digest(&key), key))));
                }
                KeyOf::Missing => {
                    if !delivery.stray && delivery.other_group.is_none() {
                        self.missing.inc();
                    }
                    keyed.push((delivery, None));
                }
                KeyOf::TooLong => {
                    self.too_long.inc();
                    keyed.push((delivery, None));
                }
            }
        }
        if !any {
            let run = keyed.into_iter().map(|(d, _)| d).collect();
            return Ok(Admitted { run, held: 0 });
        }
        let mut take = self.invocation(&TAKE);
        take.arg(&*self.group)
            .arg(self.spec.max_in_flight_per_key)
            .arg(&self.keys.prefix);
        for (delivery, key) in &keyed {
            if let Some((digest, _)) = key {
                take.arg(digest)
                    .arg(&delivery.origin_id)
                    .arg(source_arg(delivery.source))
                    .arg(&delivery.entry.id);
            }
        }
        let mut conn = self.conn.clone();
        let taken: Vec<i64> = match take.invoke_async(&mut conn).await {
            Ok(taken) => taken,
            Err(err) => return Err((err, keyed.into_iter().map(|(d, _)| d).collect())),
        };
        let mut taken = taken.into_iter();
        let mut run = Vec::with_capacity(keyed.len());
        let mut wait = Vec::new();
        for (delivery, key) in keyed {
            match key {
                None => run.push(delivery),
                Some((digest, key)) => match taken.next() {
                    Some(1) => run.push(delivery),
                    Some(-1) => tracing::debug!(
                        id = %delivery.entry.id,
                        "entry was no longer pending when it took its key's turn (another consumer settled it)"
                    ),
                    _ => wait.push((delivery, digest, key)),
                },
            }
        }
        match self.hold(wait, &mut run).await {
            Ok(held) => Ok(Admitted { run, held }),
            Err((err, wait)) => {
                run.extend(wait);
                Err((err, run))
            }
        }
    }

    /// Queue the deliveries that must wait (hold.lua); those whose turn came meanwhile join
    /// `run`. Returns how many were queued.
    async fn hold(
        &self,
        wait: Vec<(Delivery, String, Vec<u8>)>,
        run: &mut Vec<Delivery>,
    ) -> Result<usize, (redis::RedisError, Vec<Delivery>)> {
        if wait.is_empty() {
            return Ok(0);
        }
        let mut hold = self.invocation(&HOLD);
        hold.arg(&*self.group)
            .arg(self.spec.max_in_flight_per_key)
            .arg(&self.keys.prefix);
        for (delivery, digest, key) in &wait {
            let member = NewMember {
                entry_id: &delivery.entry.id,
                retry_count: delivery.retry_count,
                fields: delivery.user_fields(),
                origin_id: &delivery.origin_id,
                stream: &self.stream,
                group: &self.group,
            }
            .encode();
            hold.arg(digest)
                .arg(&delivery.origin_id)
                .arg(key.as_slice())
                .arg(source_arg(delivery.source))
                .arg(&delivery.entry.id)
                .arg(member);
        }
        let mut conn = self.conn.clone();
        let answers: Vec<i64> = match hold.invoke_async(&mut conn).await {
            Ok(answers) => answers,
            Err(err) => return Err((err, wait.into_iter().map(|(d, ..)| d).collect())),
        };
        let mut held = 0;
        for ((delivery, ..), answer) in wait.into_iter().zip(answers) {
            match answer {
                1 => run.push(delivery),
                0 => held += 1,
                _ => tracing::debug!(
                    id = %delivery.entry.id,
                    "entry was no longer pending when queued behind its key (another consumer settled it)"
                ),
            }
        }
        self.held.inc_by(held as u64);
        Ok(held)
    }

    /// The call that acknowledges `acks` (source, id, origin id) and gives back the turns
    /// their origins hold.
    pub fn ack_invocation<'a>(
        &self,
        acks: impl Iterator<Item = (Source, &'a str, &'a str)>,
    ) -> ScriptInvocation<'static> {
        let mut ack = self.invocation(&ACK);
        ack.arg(&*self.group)
            .arg(self.spec.max_in_flight_per_key)
            .arg(self.ttl_ms)
            .arg(&self.keys.prefix);
        for (source, id, origin) in acks {
            ack.arg(origin).arg(source_arg(source)).arg(id);
        }
        ack
    }

    /// Entries this host let in: count them, and sweep them back to the group now.
    pub fn let_in(&self, went: u64) {
        if went > 0 {
            self.let_in.inc_by(went);
            self.set.sweep_soon();
        }
    }

    /// What the dead-letter script adds for an entry of an ordered subscription, whose
    /// origin id is `origin` (see its header): four keys, and its last five arguments (after
    /// every other).
    pub fn dead_letter_turn(&self, invocation: &mut ScriptInvocation<'_>, origin: &str) {
        invocation
            .key(&self.keys.names)
            .key(&self.keys.waiting)
            .key(self.set.key())
            .key(&self.keys.turns)
            .arg(origin)
            .arg(&self.keys.prefix)
            .arg(self.spec.max_in_flight_per_key)
            .arg(self.ttl_ms)
            .arg(match self.spec.on_dead_letter {
                OnDeadLetter::Release => "release",
                OnDeadLetter::Hold => "hold",
            });
    }

    /// Give back the turns of entries that are gone (deleted while pending): their keys'
    /// next entries go in.
    pub async fn forget(&self, origins: &[&str]) -> RedisResult<u64> {
        let mut conn = self.conn.clone();
        let went = forget(
            &mut conn,
            (&self.stream, &self.group, self.set.key()),
            origins,
            (self.spec.max_in_flight_per_key, self.ttl_ms),
        )
        .await?;
        self.let_in(went);
        Ok(went)
    }

    /// After a dead letter that may have let entries in.
    pub fn after_dead_letter(&self) {
        if self.spec.on_dead_letter == OnDeadLetter::Release {
            self.set.sweep_soon();
        }
    }
}

/// Give every turn of the key with `digest` back and let its waiting entries in (the
/// operator's release). The holders are found by a bounded scan of the turns
/// ([`inspect::holders`]); the key's load is set to what waits, so a count that drifted is
/// healed too. Returns (turns given back, entries let in).
pub async fn release<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    keys: &OrderKeys,
    set: &str,
    digest: &str,
    max_in_flight_per_key: u32,
    ttl_ms: u64,
) -> RedisResult<(u64, u64)> {
    let holders = inspect::holders(conn, keys, &[digest]).await?;
    let mut release = RELEASE.key(&keys.names);
    release
        .key(&keys.waiting)
        .key(set)
        .key(&keys.load)
        .key(keys.wait(digest))
        .key(&keys.turns)
        .arg(digest)
        .arg(max_in_flight_per_key)
        .arg(ttl_ms)
        .arg(&keys.prefix);
    for holder in holders.by_key.get(digest).into_iter().flatten() {
        release.arg(&holder.origin_id);
    }
    release.invoke_async(conn).await
}

/// Give back the turns the entries with `origins` hold on the subscription (`stream`, `group`)
/// whose delayed set is `set`, and let the keys' next entries in, at most `max` in flight per
/// key (an operator's deletion, which knows no configuration, lets one in: the entry let in
/// lets the rest in as it settles). A set with an expiry keeps at least `ttl_ms` to live.
/// Origins that hold no turn (an unordered subscription's) change nothing.
pub async fn forget<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    (stream, group, set): (&str, &str, &str),
    origins: &[&str],
    (max, ttl_ms): (u32, u64),
) -> RedisResult<u64> {
    if origins.is_empty() {
        return Ok(0);
    }
    let keys = OrderKeys::new(stream, group);
    let mut forget = FORGET.key(&keys.names);
    forget
        .key(&keys.waiting)
        .key(stream)
        .key(stream)
        .key(set)
        .key(&keys.turns)
        .arg(&keys.prefix)
        .arg(max)
        .arg(ttl_ms);
    for origin in origins {
        forget.arg(*origin);
    }
    forget.invoke_async(conn).await
}

/// When a subscription is not (or no longer) ordered: let go of what an ordering of
/// (`stream`, `group`) left in Redis (`lua/unorder.lua`), every queued entry to the delayed set
/// `set`, due now, so none is stranded behind a key. One `EXISTS` when nothing was left (every
/// start of an unordered subscription with a delayed set). Returns the entries moved.
pub async fn let_go_of_leftovers<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    (stream, group, set): (&str, &str, &str),
) -> RedisResult<u64> {
    let keys = OrderKeys::new(stream, group);
    let (waiting, turns): (bool, bool) = redis::pipe()
        .exists(&keys.waiting)
        .exists(&keys.turns)
        .query_async(conn)
        .await?;
    if !waiting && !turns {
        return Ok(0);
    }
    let mut moved = 0;
    loop {
        let (went, left): (u64, u64) = UNORDER
            .key(&keys.names)
            .key(&keys.waiting)
            .key(set)
            .key(&keys.turns)
            .arg(&keys.prefix)
            .arg(0)
            .arg(100)
            .invoke_async(conn)
            .await?;
        moved += went;
        if left == 0 {
            return Ok(moved);
        }
    }
}

/// What an operator's deletion lets in per key, and the least time to live it keeps for a set
/// with an expiry (see [`forget`]).
pub const OPERATOR_LET_IN: (u32, u64) = (1, 3_600_000);

/// Where an entry was read, as the scripts number it.
fn source_arg(source: Source) -> u8 {
    match source {
        Source::Stream => 1,
        Source::Lane => 2,
    }
}
