//! The doorbell without keyspace events: the same rings, from a few reads the doorbell makes
//! itself, for a server whose `notify-keyspace-events` is off (the default) or that this user
//! may not ask about.
//!
//! - **Streams** (idle subscriptions' streams and retry lanes): one `XREAD BLOCK` over up to
//!   [`KEYS_PER_READ`] of them, each from the last entry id the doorbell saw there, on a
//!   connection of its own per [`KEYS_PER_READ`] keys. It answers as soon as one of them gets
//!   an entry; the doorbell then moves those keys' ids to their last entry (a script that
//!   returns ids, not entries) and rings them. Rung after the move, a reader reads whatever
//!   came before it; whatever comes after is answered by the next read. A key that rings
//!   again before its reader read it is left out of the reads until an idle reader has: a
//!   paused reader, or a busy one, does not make every write cost a read and a script. While nothing happens, each read is
//!   renewed every [`BLOCK`]: one command a second per 500 idle keys. A key that holds
//!   another type (a producer's mistake) is left out too, so it cannot fail its chunk's
//!   reads; every [`TIPS_EVERY`] each stream's last id is looked at again, for a stream made again
//!   with lower ids or a key that holds a stream again.
//! - **Delayed sets**: the earliest score of up to [`KEYS_PER_READ`] sets per script call,
//!   every [`SETS_EVERY`] (with more than 500 sets, [`SET_LOOKS_PER_S`] at most: every set
//!   within [`SETS_AT_MOST`]); a set whose earliest due time changed (another host parked or
//!   swept) rings. A host's own parks need no ring: its timer knows them.
//! - A key newly wanted is read from its last entry (looked up, then rung once, as a
//!   subscription to keyspace events rings once confirmed); a key wanted again after a
//!   while keeps the id it had, so nothing written meanwhile is missed.
//!
//! What it cannot see, it says: writes that add no entry (`XGROUP SETID`, a claim to another
//! consumer, a consumer made, a stream deleted and made again with lower ids) ring nothing,
//! so a bell on a polling doorbell vouches that nothing changed for [`super::POLLED_QUIET`] at
//! most ([`super::Bell::unrung_since`]), and a waiter looks anyway after that without a ring.
//! What the waiters wait for is what it sees: a reader, new entries; a delayed set's timer,
//! a new earliest due time; the dead-letter migration, new entries.

use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use redis::Script;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::{Doorbell, Down, GATHER, OUT, PING_TIMEOUT};
use crate::store::redis_conn::lean::DEFER_OVER;
use crate::store::redis_conn::{COMMAND_TIMEOUT, Reader, ReconnectBackoff};

/// The most keys one read (or one script call) names.
pub const KEYS_PER_READ: usize = 500;
/// How long one read of streams blocks before it is renewed.
pub const BLOCK: Duration = Duration::from_secs(1);
/// How often the delayed sets' earliest due times are looked at, with up to
/// [`SET_LOOKS_PER_S`] × 5 sets: a retry another host parked (and did not live to fire) or an
/// operator made due is seen within this. With more sets, each is looked at less often (see
/// [`sets_every`]).
pub const SETS_EVERY: Duration = Duration::from_secs(5);
/// The most delayed sets looked at per second, so that thousands of idle sets cost Redis a
/// bounded load (5,000 sets every 5 s were 1,000 commands a second).
pub const SET_LOOKS_PER_S: u32 = 100;
/// The longest time between two looks at a delayed set, however many there are.
pub const SETS_AT_MOST: Duration = Duration::from_secs(60);
/// How often every polled stream's last id is looked at again (a stream made again with
/// lower ids, a key that holds a stream again): rare mistakes, and the look costs two
/// commands per key.
const TIPS_EVERY: Duration = Duration::from_secs(600);
/// How often the server's `notify-keyspace-events` is looked at again (keyspace events on:
/// the doorbell switches to them).
const CHECK_EVERY: Duration = Duration::from_secs(10);
/// The least time between two reads of the same keys after one answered with entries at
/// once (it did not wait): a stream written without pause would make its read answer at
/// once, every time.
const MIN_GAP: Duration = Duration::from_millis(2);

/// `lua/tips.lua`: each stream's last id (empty for none, `!` for a key of another type).
pub(super) static TIPS: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("store/doorbell/lua/tips")));
/// `lua/earliest.lua`: each delayed set's earliest due time.
pub(super) static EARLIEST: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("store/doorbell/lua/earliest")));

/// A read connection of the doorbell's and its client id (to unblock it when its keys
/// change; `None` when this user may not ask).
struct PollReader {
    conn: Box<Reader>,
    id: Option<i64>,
}

/// What one read came to: its place, its connection, and the streams that got entries.
type ReadDone = (
    usize,
    PollReader,
    Instant,
    redis::RedisResult<Vec<Arc<str>>>,
);

/// The reads of one polling session: the polled streams in chunks of up to
/// [`KEYS_PER_READ`], one read each, and the connections they run on.
#[derive(Default)]
struct Polls {
    chunks: Vec<Vec<Arc<str>>>,
    /// The client id of the read in flight for each chunk.
    running: Vec<Option<Option<i64>>>,
    /// Connections with no read on them now.
    spare: Vec<PollReader>,
    reads: FuturesUnordered<BoxFuture<'static, ReadDone>>,
}

/// A timer that ticks every `every`, its first tick after `every` when `later` (else at
/// once), and late ticks delayed rather than bunched.
fn every(every: Duration, later: bool) -> Interval {
    let mut timer = tokio::time::interval(every);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if later {
        timer.reset();
    }
    timer
}

impl Doorbell {
    /// One polling session: read, ring, renew, until `stop` (`Ok`), a failure, or keyspace
    /// events turned on (`Down::Off`, to switch to them).
    pub(super) async fn poll_session(
        &self,
        stop: &CancellationToken,
        backoff: &mut ReconnectBackoff,
    ) -> Result<(), Down> {
        for key in self.lock().values_mut() {
            key.subscribed = false;
            key.chunk = None;
        }
        let master = self.master();
        self.poll_reconcile().await?;
        let mut polls = Polls::default();
        self.place(&mut polls.chunks);
        self.start_reads(&mut polls).await?;
        self.live.send_replace(true);
        tracing::info!(redis = %self.conn.name(), "doorbell up, polling: idle subscriptions wait for their streams' reads");
        let mut sets_at = Instant::now() + sets_every(self.sets_wanted());
        let mut tidy = every(SETS_EVERY, false);
        let mut check = every(CHECK_EVERY, true);
        let mut tips = every(TIPS_EVERY, true);
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                done = polls.reads.next(), if !polls.reads.is_empty() => {
                    let Some(done) = done else { continue };
                    self.read_done(&mut polls, done, backoff).await?;
                }
                () = self.changed.notified() => self.keys_changed(&mut polls).await?,
                () = tokio::time::sleep_until(sets_at) => {
                    self.poll_sets(false).await?;
                    sets_at = Instant::now() + sets_every(self.sets_wanted());
                }
                _ = tidy.tick() => {
                    // Keys let go of long enough leave the reads here.
                    if self.drop_unwanted() {
                        self.changed.notify_one();
                    }
                }
                _ = tips.tick() => self.tips_again(&mut polls).await?,
                _ = check.tick() => self.still_polling(master.as_deref()).await?,
            }
        }
    }

    /// A read answered (`done`): move and ring the streams that got entries (or leave out a
    /// key that is not a stream now), then read that chunk again.
    async fn read_done(
        &self,
        polls: &mut Polls,
        (i, reader, started, result): ReadDone,
        backoff: &mut ReconnectBackoff,
    ) -> Result<(), Down> {
        let gap = match result {
            Ok(mut rung) => {
                // Only a read that answered counts as the doorbell being up.
                backoff.reset();
                rung.dedup();
                if rung.is_empty() {
                    None
                } else {
                    self.advance(&rung).await?;
                    // Answered at once: written without pause, so not again at once.
                    (started.elapsed() < MIN_GAP).then(|| Instant::now() + MIN_GAP)
                }
            }
            // Another type under a key's name (a producer's mistake): find it and
            // leave it out, instead of failing every read of its chunk.
            Err(err) if err.code() == Some("WRONGTYPE") => {
                let keys = polls.chunks.get(i).cloned().unwrap_or_default();
                self.recheck(&keys).await?;
                None
            }
            Err(err) => return Err(Down::Failed(format!("XREAD: {err}"))),
        };
        let keys = polls.chunks.get(i).map_or(&[][..], Vec::as_slice);
        match self.read(i, reader, keys, gap) {
            Ok(read) => polls.reads.push(read),
            Err(reader) => {
                if let Some(slot) = polls.running.get_mut(i) {
                    *slot = None;
                }
                polls.spare.push(reader);
            }
        }
        Ok(())
    }

    /// Keys were wanted or let go of: take them in, and cut short the reads whose keys
    /// changed, to start again with the new ones.
    async fn keys_changed(&self, polls: &mut Polls) -> Result<(), Down> {
        tokio::time::sleep(GATHER).await;
        self.poll_reconcile().await?;
        let mut cut = self.place(&mut polls.chunks);
        cut.extend(self.take_rejoined());
        cut.sort_unstable();
        cut.dedup();
        self.restart(polls, cut).await
    }

    /// Every stream's last id looked at again: a stream made again with lower ids (or whose
    /// ids an operator set back) would answer nothing from the id last seen; a key that holds
    /// a stream again is read again.
    async fn tips_again(&self, polls: &mut Polls) -> Result<(), Down> {
        let keys: Vec<Arc<str>> = polls.chunks.iter().flatten().cloned().collect();
        let cut = self.recheck(&keys).await?;
        self.restart(polls, cut).await
    }

    /// Cut short the reads in flight of the chunks `cut`, and start a read for every chunk
    /// that has none.
    async fn restart(&self, polls: &mut Polls, cut: Vec<usize>) -> Result<(), Down> {
        for i in cut {
            if let Some(Some(Some(id))) = polls.running.get(i) {
                self.unblock(*id).await;
            }
        }
        self.start_reads(polls).await
    }

    /// Whether polling is still the way, on the same master: keyspace events turned on end
    /// the session (to switch to them), and so does a master that moved.
    async fn still_polling(&self, master: Option<&str>) -> Result<(), Down> {
        if let Ok(None) = self.check_server().await {
            return Err(Down::Off(
                "the server publishes keyspace events now".to_owned(),
            ));
        }
        if self.master().as_deref() != master {
            return Err(Down::Failed("the master moved".to_owned()));
        }
        Ok(())
    }

    /// Start a read for every chunk that has none in flight and something to read (on a
    /// spare connection, or a new one).
    async fn start_reads(&self, polls: &mut Polls) -> Result<(), Down> {
        let Polls {
            chunks,
            running,
            spare,
            reads,
        } = polls;
        running.resize(running.len().max(chunks.len()), None);
        for (i, keys) in chunks.iter().enumerate() {
            if running[i].is_some() || self.readable(keys).is_empty() {
                continue;
            }
            let reader = match spare.pop() {
                Some(reader) => reader,
                None => self.connect_reader().await?,
            };
            let id = reader.id;
            match self.read(i, reader, keys, None) {
                Ok(read) => {
                    running[i] = Some(id);
                    reads.push(read);
                }
                Err(reader) => spare.push(reader),
            }
        }
        Ok(())
    }

    /// The keys of a chunk that are read now, each with the id it is read from: not those
    /// that rang and await their reader, nor those that are not streams now.
    fn readable(&self, keys: &[Arc<str>]) -> Vec<(Arc<str>, String)> {
        let map = self.lock();
        keys.iter()
            .filter_map(|name| {
                let key = map.get(name)?;
                if key.bad || key.awaiting.load(Ordering::Acquire) == OUT {
                    return None;
                }
                Some((
                    name.clone(),
                    key.last.clone().unwrap_or_else(|| "$".to_owned()),
                ))
            })
            .collect()
    }

    async fn connect_reader(&self) -> Result<PollReader, Down> {
        let mut conn = self
            .conn
            // One node only (the doorbell is off on a cluster): no key chooses it.
            .reader(BLOCK, "")
            .await
            .map_err(|err| Down::Failed(format!("cannot open a read connection: {err}")))?;
        let id = redis::cmd("CLIENT")
            .arg("ID")
            .query_async::<i64>(&mut conn)
            .await
            .ok();
        Ok(PollReader {
            conn: Box::new(conn),
            id,
        })
    }

    /// Cut the read on connection `id` short (it answers as if its block ran out); when this
    /// user may not, the read takes the new keys when it is renewed, within [`BLOCK`].
    async fn unblock(&self, id: i64) {
        let unblocked = tokio::time::timeout(
            PING_TIMEOUT,
            redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .query_async::<redis::Value>(&mut self.conn.clone()),
        )
        .await;
        if !matches!(unblocked, Ok(Ok(_))) {
            tracing::debug!(redis = %self.conn.name(), "doorbell: CLIENT UNBLOCK failed; the read takes its new keys within {BLOCK:?}");
        }
    }

    /// Read the readable ones of `keys` on `reader`, each from the last id seen on it,
    /// after `after` if given; the reader back when none is readable.
    fn read(
        &self,
        i: usize,
        mut reader: PollReader,
        keys: &[Arc<str>],
        after: Option<Instant>,
    ) -> Result<BoxFuture<'static, ReadDone>, PollReader> {
        let readable = self.readable(keys);
        if readable.is_empty() {
            return Err(reader);
        }
        Ok(Box::pin(async move {
            if let Some(at) = after {
                tokio::time::sleep_until(at).await;
            }
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(BLOCK.as_millis() as u64)
                .arg("STREAMS");
            for (key, _) in &readable {
                cmd.arg(&**key);
            }
            for (_, id) in &readable {
                cmd.arg(id);
            }
            let started = Instant::now();
            // Only which streams answered matters: no value over a few KiB is held (a read
            // of up to 500 streams at once may meet an entry of any size in each).
            let cut = (DEFER_OVER, 0);
            let result = reader
                .conn
                .read_entries(&cmd, cut, |stream, _, _, _| {
                    Arc::from(String::from_utf8_lossy(stream).as_ref())
                })
                .await;
            (i, reader, started, result)
        }))
    }

    /// The address commands go to now (the master behind Sentinel).
    fn master(&self) -> Option<String> {
        self.conn
            .node_client()
            .map(|c| c.get_connection_info().addr().to_string())
    }

    /// Run `script` over `keys`: one string per key.
    pub(super) async fn script(
        &self,
        script: &Script,
        keys: &[Arc<str>],
        what: &str,
    ) -> Result<Vec<String>, Down> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(&**key);
        }
        let answer = tokio::time::timeout(
            COMMAND_TIMEOUT,
            invocation.invoke_async::<Vec<String>>(&mut self.conn.clone()),
        )
        .await;
        match answer {
            Ok(Ok(values)) if values.len() == keys.len() => Ok(values),
            Ok(Ok(values)) => Err(Down::Failed(format!(
                "{what}: {} answers for {} keys",
                values.len(),
                keys.len()
            ))),
            Ok(Err(err)) => Err(Down::Failed(format!("{what}: {err}"))),
            Err(_) => Err(Down::Failed(format!(
                "{what}: no answer within the timeout"
            ))),
        }
    }
}

/// How long between two looks at `sets` delayed sets: [`SETS_EVERY`], or as long as
/// [`SET_LOOKS_PER_S`] needs for them all, up to [`SETS_AT_MOST`].
pub fn sets_every(sets: usize) -> Duration {
    Duration::from_secs_f64(sets as f64 / f64::from(SET_LOOKS_PER_S))
        .clamp(SETS_EVERY, SETS_AT_MOST)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{SETS_AT_MOST, SETS_EVERY, sets_every};

    #[test]
    fn set_looks_are_bounded_per_second_and_in_time() {
        assert_eq!(sets_every(0), SETS_EVERY);
        assert_eq!(sets_every(500), SETS_EVERY);
        assert_eq!(sets_every(1_000), Duration::from_secs(10));
        assert_eq!(sets_every(5_000), Duration::from_secs(50));
        assert_eq!(sets_every(100_000), SETS_AT_MOST);
    }
}
