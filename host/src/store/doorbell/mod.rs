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
//!
//! - This file: the [`Doorbell`] and its keys, and its life ([`Doorbell::run`]): on keyspace
//!   events or polling, down and up again.
//! - [`bell`]: a reader's [`Bell`]: what it has seen, whether it wants its keys, its wait.
//! - [`events`]: the session on keyspace events (SUBSCRIBE, rings, PINGs).
//! - [`poll`]: the session without them (reads of the streams, looks at the sets), and
//!   [`poll_keys`], where each polled key stands.
//! - [`unseen`]: the look for entries no event told of.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::RedisResult;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::redis_conn::{ReconnectBackoff, RedisHandle};

mod bell;
mod events;
pub mod poll;
mod poll_keys;
pub mod unseen;

pub use bell::{Bell, Mark};

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

    /// The keys (a holder that panicked left them whole: each change is one step).
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Key>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ring every key: whoever waits reads now.
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
}

/// Why a doorbell session ended.
enum Down {
    /// The server does not publish what is needed, or may not be asked.
    Off(String),
    /// The connection failed.
    Failed(String),
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
