//! The doorbell: one connection per Redis that tells idle subscriptions when their keys are
//! written, so that an idle subscription holds no connection and sends no command, and a new
//! entry is still read within milliseconds.
//!
//! It listens to keyspace notifications when the server publishes them for streams and sorted
//! sets (`notify-keyspace-events` with `K` and `t` and `z`, or `K` and `A`), which the doorbell
//! checks with `CONFIG GET` before it starts and every few seconds after. Without them (the
//! server's default, or without the right to ask) it polls instead (see [`poll`]): a blocking
//! `XREAD` over up to 500 idle streams per connection and a look at the delayed sets' earliest
//! due times every 5 s (100 sets a second at most), and the log says how to turn keyspace events on. On a cluster there
//! is no doorbell: each partition keeps its blocking read.
//!
//! How a subscription uses it (see [`Bell`]):
//! - after a read that found nothing, it asks for its keys (stream and retry lane): the
//!   doorbell SUBSCRIBEs to their keyspace channels and, once Redis confirms, rings them once
//!   (an entry added before the subscription took effect is then read);
//! - it then waits for a ring instead of reading: every write to a key (an XADD by a producer,
//!   a sweep's move into the lane) rings its bell, and the subscription reads once;
//! - after a read that found entries it lets go of its keys: a busy subscription reads back
//!   to back and needs no ring, and the doorbell UNSUBSCRIBEs a key nobody has wanted for
//!   [`UNSUBSCRIBE_AFTER`], so a busy stream costs no notifications either.
//!
//! A bell's "something may have changed" is a counter: a subscription marks what it has seen
//! before it reads, so a write between its read and its wait still wakes it.
//!
//! When the doorbell cannot vouch for its rings (its connection failed or did not answer a
//! PING within [`PING_TIMEOUT`], the server stopped publishing, Sentinel moved the master),
//! it says it is down: subscriptions then read every `block` without waiting for a ring, until
//! the doorbell is back and rings every key once. Pub/sub is at most once, and these are the
//! ways a ring can be lost. What it cannot see (events off and on again between two checks
//! of the setting, writes that publish only generic events) it finds by looking: an entry
//! added without a ring is read within about [`unseen::EVERY`] (see [`unseen`]).
//!
//! Anyone who may PUBLISH on the server can ring a bell (the channel name is no secret): that
//! costs one read per ring at most (rings that come while a read is in flight count once),
//! never an entry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::RedisResult;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::redis_conn::{ReconnectBackoff, RedisHandle};

pub mod poll;
pub mod unseen;

/// How long a key nobody waits on stays subscribed: a subscription that finds entries now and
/// then does not subscribe and unsubscribe at every read.
pub const UNSUBSCRIBE_AFTER: Duration = Duration::from_secs(5);
/// The longest a waiter whose keys' rings can be trusted waits before it looks around anyway,
/// when nothing of its own is due sooner (a reader's next look for gone consumers): waking
/// every `block` instead cost 5 % of a core for 1,000 idle subscriptions, and every 5 s still
/// 1 % for 5,000.
pub const QUIET_WAIT: Duration = Duration::from_secs(60);
/// How long a polling doorbell's rings vouch that nothing changed: they see every entry added
/// to a stream and every change of a delayed set's earliest due time, but not the writes that
/// add no entry (`XGROUP SETID`, a claim, a consumer made). After this a waiter looks anyway:
/// at 5,000 idle subscriptions, a look each a minute was 400 commands a second.
pub const POLLED_QUIET: Duration = Duration::from_secs(300);
/// How often the doorbell checks its connection (PING) and, every few PINGs, that the server
/// still publishes what it needs.
const PING_EVERY: Duration = Duration::from_secs(2);
/// How long a PING may take before the doorbell counts as down.
const PING_TIMEOUT: Duration = Duration::from_secs(3);
/// Every how many PINGs the server's `notify-keyspace-events` and the master's address are
/// checked again.
const CHECK_EVERY_PINGS: u32 = 5;
/// How long the doorbell gathers wanted keys before it subscribes them.
const GATHER: Duration = Duration::from_millis(2);
/// The most channels one SUBSCRIBE or UNSUBSCRIBE names.
const CHANNELS_PER_COMMAND: usize = 512;

/// One doorbell per Redis (see the module doc).
pub struct Doorbell {
    conn: RedisHandle,
    prefix: String,
    keys: Mutex<HashMap<Arc<str>, Key>>,
    /// Whether it polls now (no keyspace events): its rings then cannot vouch that nothing
    /// changed (see [`poll`]).
    polling: AtomicBool,
    /// Whether it may poll at all (`doorbell` and the number of subscriptions say); if not,
    /// without keyspace events it is down and subscriptions read every `block`.
    may_poll: bool,
    /// A key was wanted or let go of.
    changed: Notify,
    /// Polling: keys an idle reader read after they rang, to be read again.
    rejoined: Mutex<Vec<Arc<str>>>,
    /// Whether rings can be trusted now.
    live: watch::Sender<bool>,
}

/// A polled key's state between its rings and its reader's reads (see `Key::awaiting`).
const QUIET: u8 = 0;
const RANG: u8 = 1;
const OUT: u8 = 2;

/// What a key is, for the polling doorbell: a stream is read, a delayed set looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stream,
    Set,
}

struct Key {
    kind: Kind,
    /// Polling: the last entry id seen (a stream) or the earliest score (a set); keyspace
    /// events: the stream's last id when it was subscribed or last looked at (see [`unseen`]).
    last: Option<String>,
    /// Polling: which of the doorbell's reads names this stream.
    chunk: Option<usize>,
    /// Polling: [`QUIET`], [`RANG`] (no reader has read since), or [`OUT`] (it rang again
    /// before a reader read it: left out of the reads until an idle reader has, so that a
    /// paused reader, or a busy one that lets go of it, does not make every write cost a read
    /// and a script).
    awaiting: Arc<AtomicU8>,
    /// Polling: it is not a stream now (another type under its name): left out of the reads,
    /// looked at again by the slow check.
    bad: bool,
    rings: watch::Sender<u64>,
    /// Bells waiting on it now.
    wanted: usize,
    subscribed: bool,
    /// When the last bell let go of it.
    unwanted_since: Option<Instant>,
}

impl Key {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            last: None,
            chunk: None,
            awaiting: Arc::default(),
            bad: false,
            rings: watch::Sender::new(0),
            wanted: 0,
            subscribed: false,
            unwanted_since: None,
        }
    }

    fn ring(&self) {
        self.rings.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Whether `flags` (the server's `notify-keyspace-events`) publish what the doorbell needs:
/// keyspace events (`K`) for streams (`t`) and sorted sets (`z`), `A` standing for every class.
pub fn flags_suffice(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('A') || (flags.contains('t') && flags.contains('z')))
}

impl Doorbell {
    /// A doorbell for the Redis `conn` talks to; `None` on a cluster (each node publishes only
    /// its own keys' events and serves only its own keys' reads, and partitions keep their
    /// blocking reads there).
    pub fn new(conn: RedisHandle, may_poll: bool) -> Option<Self> {
        use redis::aio::ConnectionLike as _;
        if conn.is_cluster() {
            return None;
        }
        let prefix = format!("__keyspace@{}__:", conn.get_db());
        Some(Self {
            conn,
            prefix,
            keys: Mutex::new(HashMap::new()),
            polling: AtomicBool::new(false),
            may_poll,
            changed: Notify::new(),
            rejoined: Mutex::default(),
            live: watch::Sender::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Key>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A bell for the streams `keys` (a partition's stream and lane, an earlier release's
    /// dead-letter stream).
    pub fn bell(self: &Arc<Self>, keys: &[&str]) -> Bell {
        self.bell_of(keys, Kind::Stream)
    }

    /// A bell for the delayed set `key`.
    pub fn set_bell(self: &Arc<Self>, key: &str) -> Bell {
        self.bell_of(&[key], Kind::Set)
    }

    fn bell_of(self: &Arc<Self>, keys: &[&str], kind: Kind) -> Bell {
        let mut map = self.lock();
        let mut rings = Vec::with_capacity(keys.len());
        let mut names = Vec::with_capacity(keys.len());
        let mut awaiting = Vec::with_capacity(keys.len());
        for key in keys {
            let name: Arc<str> = Arc::from(*key);
            let entry = map.entry(name.clone()).or_insert_with(|| Key::new(kind));
            rings.push(entry.rings.subscribe());
            awaiting.push(entry.awaiting.clone());
            names.push(name);
        }
        Bell {
            doorbell: self.clone(),
            keys: names,
            awaiting,
            rings: Mutex::new(rings),
            live: self.live.subscribe(),
            wanting: AtomicBool::new(false),
        }
    }

    /// Polling: `keys` were read by an idle reader after they rang; read them again.
    fn rejoin(&self, keys: Vec<Arc<str>>) {
        if keys.is_empty() {
            return;
        }
        self.rejoined
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(keys);
        self.changed.notify_one();
    }

    fn ring_all(&self) {
        for key in self.lock().values() {
            key.ring();
        }
    }

    /// Whether the server publishes what the doorbell needs: `Ok(None)` when it does,
    /// `Ok(Some(why))` when it does not, `Err` when it cannot be asked.
    async fn check_server(&self) -> RedisResult<Option<String>> {
        let reply: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("notify-keyspace-events")
            .query_async(&mut self.conn.clone())
            .await?;
        let flags = reply.get(1).cloned().unwrap_or_default();
        Ok((!flags_suffice(&flags)).then(|| {
            format!(
                "the server's notify-keyspace-events is {flags:?}, without keyspace events for streams and sorted sets; the doorbell polls: one blocking XREAD per 500 idle streams and a look at the delayed sets every 5 s, 100 a second at most (set it to include \"Ktz\", e.g. CONFIG SET notify-keyspace-events Ktz, for keyspace events instead: no read per idle stream at all)"
            )
        }))
    }

    /// The doorbell for the Redis `conn` talks to, as `mode` says for a host with
    /// `subscriptions` of one partition on it: on keyspace events while the server
    /// publishes them; polling without them when it may; `None` when each subscription keeps
    /// its blocking read instead (`off`, a cluster, or no events and no polling: the log says
    /// why, once, and how to turn the events on).
    pub async fn open(
        conn: RedisHandle,
        mode: crate::config::DoorbellMode,
        subscriptions: usize,
    ) -> Option<Arc<Self>> {
        use crate::config::DoorbellMode;
        let may_poll = match mode {
            DoorbellMode::Off => return None,
            DoorbellMode::Poll => true,
            DoorbellMode::Auto => subscriptions > crate::config::POLL_ABOVE,
        };
        let doorbell = Self::new(conn, may_poll)?;
        if !may_poll && let Some(why) = doorbell.why_polling().await {
            tracing::info!(redis = %doorbell.conn.name(), "doorbell off: {why}; each idle subscription keeps a blocking read on a connection of its own (with more than {} subscriptions on this Redis, or doorbell = \"poll\", the doorbell would poll instead)", crate::config::POLL_ABOVE);
            return None;
        }
        Some(Arc::new(doorbell))
    }

    /// Why the doorbell cannot listen to keyspace events now (`None`: it can).
    async fn why_polling(&self) -> Option<String> {
        match self.check_server().await {
            Ok(None) => None,
            Ok(Some(why)) => Some(why),
            Err(err) if err.code() == Some("NOPERM") => Some(format!(
                "this Redis user may not run CONFIG GET notify-keyspace-events ({err}), so the doorbell cannot tell whether the server publishes keyspace events"
            )),
            Err(err) => Some(format!("CONFIG GET notify-keyspace-events failed ({err})")),
        }
    }

    /// Keep the doorbell up until `stop`: on keyspace events while the server publishes them,
    /// polling while it does not.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut backoff = ReconnectBackoff::default();
        let mut was: Option<bool> = None;
        loop {
            let why_polling = self.why_polling().await;
            let polling = why_polling.is_some();
            self.polling.store(polling, Ordering::Release);
            if was != Some(polling) {
                match &why_polling {
                    Some(why) => {
                        tracing::info!(redis = %self.conn.name(), "doorbell polls: {why}");
                    }
                    None => {
                        tracing::info!(redis = %self.conn.name(), "doorbell listens to keyspace events");
                    }
                }
                was = Some(polling);
            }
            let ended = if polling && !self.may_poll {
                // Events turned off, and no polling here: down, and subscriptions read every
                // `block`, until they are back.
                Err(Down::Off(why_polling.clone().unwrap_or_default()))
            } else if polling {
                self.poll_session(&stop, &mut backoff).await
            } else {
                self.session(&stop, &mut backoff).await
            };
            let (why, pause) = match ended {
                Ok(()) => return,
                // Keyspace events turned on or off: the other way, at once; without polling,
                // the setting is looked at again at the events session's pace.
                Err(Down::Off(why)) if self.may_poll => (why, Duration::ZERO),
                Err(Down::Off(why)) => (why, CHECK_EVERY_PINGS * PING_EVERY),
                Err(Down::Failed(why)) => (why, backoff.next_delay()),
            };
            if self.live.send_replace(false) {
                tracing::warn!(redis = %self.conn.name(), "doorbell down, subscriptions read every `block` until it is back: {why}");
            }
            // Whoever waits for a ring reads now, and every `block` until the doorbell is back.
            self.ring_all();
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One connection's life: subscribe what is wanted, ring on every message, check the
    /// connection and the server; `Ok` only when stopped.
    async fn session(
        &self,
        stop: &CancellationToken,
        backoff: &mut ReconnectBackoff,
    ) -> Result<(), Down> {
        let Some(client) = self.conn.node_client() else {
            return Err(Down::Off("a cluster".to_owned()));
        };
        let address = client.get_connection_info().addr().to_string();
        let pubsub = tokio::time::timeout(
            crate::store::redis_conn::CONNECT_TIMEOUT,
            client.get_async_pubsub(),
        )
        .await
        .map_err(|_| Down::Failed(format!("no connection to {address} within the timeout")))?
        .map_err(|err| Down::Failed(format!("cannot connect to {address}: {err}")))?;
        let (mut sink, mut messages) = pubsub.split();
        for key in self.lock().values_mut() {
            key.subscribed = false;
        }
        self.reconcile(&mut sink).await?;
        self.live.send_replace(true);
        backoff.reset();
        tracing::info!(redis = %self.conn.name(), %address, "doorbell up: idle subscriptions wait for keyspace events");
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pings = 0u32;
        let mut look = tokio::time::interval(unseen::EVERY);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = look.tick() => self.look_for_unseen().await?,
                message = messages.next() => {
                    let Some(message) = message else {
                        return Err(Down::Failed("the subscriber connection closed".to_owned()));
                    };
                    let channel = message.get_channel_name();
                    if let Some(key) = channel.strip_prefix(self.prefix.as_str())
                        && let Some(entry) = self.lock().get(key)
                    {
                        entry.ring();
                    }
                }
                () = self.changed.notified() => {
                    // Readers going idle together (thousands at start) are subscribed in a few
                    // commands, not one scan of every key each.
                    tokio::time::sleep(GATHER).await;
                    self.reconcile(&mut sink).await?;
                }
                _ = ping.tick() => {
                    match tokio::time::timeout(PING_TIMEOUT, sink.ping::<redis::Value>()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(err)) => return Err(Down::Failed(format!("PING: {err}"))),
                        Err(_) => return Err(Down::Failed(format!("PING not answered within {PING_TIMEOUT:?}"))),
                    }
                    // Keys let go of long enough are unsubscribed here.
                    self.reconcile(&mut sink).await?;
                    pings = pings.wrapping_add(1);
                    if pings.is_multiple_of(CHECK_EVERY_PINGS) {
                        match self.check_server().await {
                            Ok(None) => {}
                            Ok(Some(why)) => return Err(Down::Off(why)),
                            Err(err) => return Err(Down::Failed(format!("CONFIG GET: {err}"))),
                        }
                        if self.conn.node_client().map(|c| c.get_connection_info().addr().to_string()) != Some(address.clone()) {
                            return Err(Down::Failed("the master moved".to_owned()));
                        }
                    }
                }
            }
        }
    }

    /// SUBSCRIBE what is wanted and not subscribed (ringing each once Redis confirms), and
    /// UNSUBSCRIBE what nobody has wanted for [`UNSUBSCRIBE_AFTER`].
    async fn reconcile(&self, sink: &mut redis::aio::PubSubSink) -> Result<(), Down> {
        let (add, drop): (Vec<Arc<str>>, Vec<Arc<str>>) = {
            let keys = self.lock();
            let now = Instant::now();
            let add = keys
                .iter()
                .filter(|(_, k)| k.wanted > 0 && !k.subscribed)
                .map(|(name, _)| name.clone())
                .collect();
            let drop = keys
                .iter()
                .filter(|(_, k)| {
                    k.wanted == 0
                        && k.subscribed
                        && k.unwanted_since
                            .is_some_and(|since| now.duration_since(since) >= UNSUBSCRIBE_AFTER)
                })
                .map(|(name, _)| name.clone())
                .collect();
            (add, drop)
        };
        for chunk in add.chunks(CHANNELS_PER_COMMAND) {
            // Where each stream stands before it is subscribed: what comes after is heard or
            // found by the look for unheard entries.
            self.take_tips(chunk).await?;
            let channels: Vec<String> = chunk.iter().map(|k| self.channel(k)).collect();
            self.timed(sink.subscribe(&channels), "SUBSCRIBE").await?;
            let mut keys = self.lock();
            for name in chunk {
                if let Some(key) = keys.get_mut(name) {
                    key.subscribed = true;
                    // From here on every write rings it; one may have come before.
                    key.ring();
                }
            }
        }
        for chunk in drop.chunks(CHANNELS_PER_COMMAND) {
            let channels: Vec<String> = chunk.iter().map(|k| self.channel(k)).collect();
            self.timed(sink.unsubscribe(&channels), "UNSUBSCRIBE")
                .await?;
            let mut keys = self.lock();
            for name in chunk {
                if let Some(key) = keys.get_mut(name) {
                    key.subscribed = false;
                }
            }
        }
        Ok(())
    }

    async fn timed(
        &self,
        call: impl std::future::Future<Output = RedisResult<()>>,
        what: &str,
    ) -> Result<(), Down> {
        match tokio::time::timeout(PING_TIMEOUT, call).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(Down::Failed(format!("{what}: {err}"))),
            Err(_) => Err(Down::Failed(format!(
                "{what} not answered within {PING_TIMEOUT:?}"
            ))),
        }
    }

    fn channel(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn want(&self, keys: &[Arc<str>], yes: bool) {
        let mut map = self.lock();
        let mut changed = false;
        for name in keys {
            let Some(key) = map.get_mut(name) else {
                continue;
            };
            if yes {
                key.wanted += 1;
                key.unwanted_since = None;
                changed |= !key.subscribed;
            } else {
                key.wanted = key.wanted.saturating_sub(1);
                if key.wanted == 0 {
                    key.unwanted_since = Some(Instant::now());
                }
            }
        }
        drop(map);
        if changed {
            self.changed.notify_one();
        }
    }

    fn subscribed(&self, keys: &[Arc<str>]) -> bool {
        let map = self.lock();
        keys.iter()
            .all(|name| map.get(name).is_some_and(|k| k.subscribed))
    }
}

/// Why a doorbell session ended.
enum Down {
    /// The server does not publish what is needed, or may not be asked.
    Off(String),
    /// The connection failed.
    Failed(String),
}

/// One reader's bell: rings when one of its keys is written (see the module doc).
pub struct Bell {
    doorbell: Arc<Doorbell>,
    keys: Vec<Arc<str>>,
    /// Each key's state between rings and reads (polling).
    awaiting: Vec<Arc<AtomicU8>>,
    /// What the reader has seen of each key's rings.
    rings: Mutex<Vec<watch::Receiver<u64>>>,
    live: watch::Receiver<bool>,
    /// Whether it holds its keys wanted now.
    wanting: AtomicBool,
}

impl Bell {
    fn rings(&self) -> MutexGuard<'_, Vec<watch::Receiver<u64>>> {
        self.rings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mark every ring so far as seen: called before a read, so that a write after it rings.
    pub fn seen(&self) {
        for rx in self.rings().iter_mut() {
            rx.mark_unchanged();
        }
        if self.wanting.load(Ordering::Acquire) {
            self.rejoin();
        } else {
            // A busy reader takes the ring, but a key left out stays out: it reads anyway.
            for awaiting in &self.awaiting {
                let _ = awaiting.compare_exchange(RANG, QUIET, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// Polling: this idle reader is about to read its keys: those that rang are quiet again,
    /// and those left out are read again.
    fn rejoin(&self) {
        let rejoined: Vec<Arc<str>> = self
            .keys
            .iter()
            .zip(&self.awaiting)
            .filter(|(_, awaiting)| awaiting.swap(QUIET, Ordering::AcqRel) == OUT)
            .map(|(name, _)| name.clone())
            .collect();
        self.doorbell.rejoin(rejoined);
    }

    /// The read found nothing (`idle`) or something: an idle reader wants its keys
    /// subscribed, a busy one lets go of them.
    pub fn set_idle(&self, idle: bool) {
        if self.wanting.swap(idle, Ordering::AcqRel) != idle {
            self.doorbell.want(&self.keys, idle);
            if idle {
                self.rejoin();
            }
        }
    }

    /// Whether its doorbell polls now (no keyspace events): its rings then see entries added,
    /// not the other writes (see [`poll`]).
    pub fn polls(&self) -> bool {
        self.doorbell.polling.load(Ordering::Acquire)
    }

    /// Whether the rings can be trusted now: the doorbell is up and every key subscribed.
    fn trusted(&self) -> bool {
        *self.live.borrow() && self.doorbell.subscribed(&self.keys)
    }

    /// The rings so far, if they can be trusted now: taken before a look at Redis, so that
    /// [`Bell::unrung_since`] can later say nothing was written to the keys since.
    pub fn mark(&self) -> Option<Mark> {
        self.trusted().then(|| Mark {
            rings: self.rings().iter().map(|rx| *rx.borrow()).collect(),
            at: Instant::now(),
        })
    }

    /// Whether no key was written since `mark` was taken and the rings can still be trusted.
    /// Every gap in what the doorbell saw (it went down, a key was unsubscribed for a while)
    /// rings when it ends, so an unchanged count means no write was missed. A polling
    /// doorbell's rings see every entry added but not every other write (see [`poll`]): they
    /// vouch for [`POLLED_QUIET`] at most.
    pub fn unrung_since(&self, mark: &Mark) -> bool {
        self.trusted()
            && (!self.polls() || mark.at.elapsed() < POLLED_QUIET)
            && self
                .rings()
                .iter()
                .map(|rx| *rx.borrow())
                .eq(mark.rings.iter().copied())
    }

    /// Wait for a ring: `true` when the waiter should look now (a ring; or the doorbell
    /// cannot vouch for its rings and `block` passed; or it polls and [`POLLED_QUIET`] passed
    /// without a ring), `false` when nothing rang until `until` (or for [`QUIET_WAIT`]
    /// without one; at least `block` in either case) and nothing could have been missed.
    pub async fn wait(&self, block: Duration, until: Option<Instant>) -> bool {
        let mut rings: Vec<watch::Receiver<u64>> = self.rings().clone();
        if rings.is_empty() {
            tokio::time::sleep(block).await;
            return true;
        }
        if rings.iter().any(|rx| rx.has_changed().unwrap_or(true)) {
            return true;
        }
        // Going down rings every key; coming back rings the keys it subscribes.
        let trusted = self.trusted();
        let polling = self.polls();
        let any_ring = futures::future::select_all(
            rings
                .iter_mut()
                .map(|rx| Box::pin(async move { rx.changed().await.is_ok() })),
        );
        // A polling doorbell sees entries added, not every other write (see `poll`): after
        // a longer quiet wait the waiter looks anyway.
        let most = if polling { POLLED_QUIET } else { QUIET_WAIT };
        let wait = if trusted {
            let quiet = until.map_or(most, |at| {
                at.saturating_duration_since(Instant::now()).min(most)
            });
            block.max(quiet)
        } else {
            block
        };
        tokio::select! {
            _ = any_ring => true,
            () = tokio::time::sleep(wait) => !trusted || (polling && wait >= most),
        }
    }
}

/// A bell's rings at one moment (see [`Bell::mark`]).
#[derive(Debug, Clone)]
pub struct Mark {
    rings: Vec<u64>,
    at: Instant,
}

impl Drop for Bell {
    fn drop(&mut self) {
        if self.wanting.load(Ordering::Acquire) {
            self.doorbell.want(&self.keys, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::flags_suffice;

    #[test]
    fn flags_need_keyspace_events_for_streams_and_sorted_sets() {
        assert!(flags_suffice("Ktz"));
        assert!(flags_suffice("KA"));
        assert!(flags_suffice("AKE"));
        assert!(!flags_suffice(""));
        assert!(!flags_suffice("Et"));
        assert!(!flags_suffice("Kt"));
        assert!(!flags_suffice("Ez"));
    }
}
