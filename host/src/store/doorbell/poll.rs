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
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Doorbell, Down, Kind, UNSUBSCRIBE_AFTER};
use crate::store::redis_conn::lean::DEFER_OVER;
use crate::store::redis_conn::{Reader, ReconnectBackoff};

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

pub(super) static TIPS: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("store/doorbell/lua/tips")));
static EARLIEST: LazyLock<Script> =
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
        let mut chunks: Vec<Vec<Arc<str>>> = Vec::new();
        self.place(&mut chunks);
        let mut reads: FuturesUnordered<BoxFuture<'static, ReadDone>> = FuturesUnordered::new();
        // The client id of the read in flight for each chunk.
        let mut running: Vec<Option<Option<i64>>> = Vec::new();
        let mut spare: Vec<PollReader> = Vec::new();
        self.start_reads(&chunks, &mut running, &mut spare, &mut reads)
            .await?;
        self.live.send_replace(true);
        tracing::info!(redis = %self.conn.name(), "doorbell up, polling: idle subscriptions wait for their streams' reads");
        let mut sets_at = Instant::now() + sets_every(self.sets_wanted());
        let mut tidy = tokio::time::interval(SETS_EVERY);
        tidy.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        check.reset();
        let mut tips = tokio::time::interval(TIPS_EVERY);
        tips.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tips.reset();
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                done = reads.next(), if !reads.is_empty() => {
                    let Some((i, reader, started, result)) = done else { continue };
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
                            let keys = chunks.get(i).cloned().unwrap_or_default();
                            self.recheck(&keys).await?;
                            None
                        }
                        Err(err) => return Err(Down::Failed(format!("XREAD: {err}"))),
                    };
                    let keys = chunks.get(i).map_or(&[][..], Vec::as_slice);
                    match self.read(i, reader, keys, gap) {
                        Ok(read) => reads.push(read),
                        Err(reader) => {
                            if let Some(slot) = running.get_mut(i) {
                                *slot = None;
                            }
                            spare.push(reader);
                        }
                    }
                }
                () = self.changed.notified() => {
                    tokio::time::sleep(super::GATHER).await;
                    self.poll_reconcile().await?;
                    // Reads whose keys changed are cut short and start again with the new ones.
                    let mut cut = self.place(&mut chunks);
                    cut.extend(self.take_rejoined());
                    cut.sort_unstable();
                    cut.dedup();
                    for i in cut {
                        if let Some(Some(Some(id))) = running.get(i) {
                            self.unblock(*id).await;
                        }
                    }
                    self.start_reads(&chunks, &mut running, &mut spare, &mut reads).await?;
                }
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
                _ = tips.tick() => {
                    // A stream made again with lower ids (or whose ids an operator set back)
                    // would answer nothing from the id last seen; a key that holds a stream
                    // again is read again.
                    let keys: Vec<Arc<str>> = chunks.iter().flatten().cloned().collect();
                    for i in self.recheck(&keys).await? {
                        if let Some(Some(Some(id))) = running.get(i) {
                            self.unblock(*id).await;
                        }
                    }
                    self.start_reads(&chunks, &mut running, &mut spare, &mut reads).await?;
                }
                _ = check.tick() => {
                    if let Ok(None) = self.check_server().await {
                        return Err(Down::Off("the server publishes keyspace events now".to_owned()));
                    }
                    if self.master() != master {
                        return Err(Down::Failed("the master moved".to_owned()));
                    }
                }
            }
        }
    }

    /// Start a read for every chunk that has none in flight and something to read (on a
    /// spare connection, or a new one).
    async fn start_reads(
        &self,
        chunks: &[Vec<Arc<str>>],
        running: &mut Vec<Option<Option<i64>>>,
        spare: &mut Vec<PollReader>,
        reads: &mut FuturesUnordered<BoxFuture<'static, ReadDone>>,
    ) -> Result<(), Down> {
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
                if key.bad || key.awaiting.load(Ordering::Acquire) == super::OUT {
                    return None;
                }
                Some((
                    name.clone(),
                    key.last.clone().unwrap_or_else(|| "$".to_owned()),
                ))
            })
            .collect()
    }

    /// The chunks of keys that idle readers read after they rang (to be read again).
    fn take_rejoined(&self) -> Vec<usize> {
        let names: Vec<Arc<str>> = std::mem::take(
            &mut *self
                .rejoined
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let map = self.lock();
        names
            .iter()
            .filter_map(|name| map.get(name).and_then(|k| k.chunk))
            .collect()
    }

    /// Look at `keys`' last ids again: a key that is not a stream now leaves the reads (rung
    /// once, so that its reader's own read says what is wrong); one that is a stream again
    /// comes back; one whose last id went below what was seen is read from there. The chunks
    /// whose reads changed.
    async fn recheck(&self, keys: &[Arc<str>]) -> Result<Vec<usize>, Down> {
        let mut changed = Vec::new();
        for chunk in keys.chunks(KEYS_PER_READ) {
            let tips = self.script(&TIPS, chunk, "the streams' last ids").await?;
            let mut map = self.lock();
            for (name, tip) in chunk.iter().zip(tips) {
                let Some(key) = map.get_mut(name) else {
                    continue;
                };
                let moved = if tip == "!" {
                    !std::mem::replace(&mut key.bad, true)
                } else if key.bad {
                    key.bad = false;
                    if !tip.is_empty() {
                        key.last = Some(tip);
                    }
                    true
                } else if !tip.is_empty()
                    && key.last.as_deref().is_some_and(|last| below(&tip, last))
                {
                    key.last = Some(tip);
                    true
                } else {
                    false
                };
                if moved {
                    key.ring();
                    if let Some(i) = key.chunk {
                        changed.push(i);
                    }
                }
            }
        }
        changed.sort_unstable();
        changed.dedup();
        Ok(changed)
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
            super::PING_TIMEOUT,
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

    /// Move `keys` (streams that got entries) to their last entry, then ring them: a reader
    /// rung now reads everything up to there, and the next read answers for what comes after.
    async fn advance(&self, keys: &[Arc<str>]) -> Result<(), Down> {
        for chunk in keys.chunks(KEYS_PER_READ) {
            let tips = self.script(&TIPS, chunk, "the streams' last ids").await?;
            let mut map = self.lock();
            for (name, tip) in chunk.iter().zip(tips) {
                if let Some(key) = map.get_mut(name) {
                    if tip == "!" {
                        key.bad = true;
                    } else if !tip.is_empty() {
                        // Emptied meanwhile: what comes next has a higher id than what was
                        // seen.
                        key.last = Some(tip);
                    }
                    // Rung again before a reader read it: out of the reads until one has.
                    let _ =
                        key.awaiting
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                                Some(if state == super::QUIET {
                                    super::RANG
                                } else {
                                    super::OUT
                                })
                            });
                    key.ring();
                }
            }
        }
        Ok(())
    }

    /// Take in what is wanted and not polled yet: a stream seen before is read on from where
    /// it was; a new one from its last entry, rung once; a delayed set gets its first look,
    /// rung once.
    async fn poll_reconcile(&self) -> Result<(), Down> {
        let fresh: Vec<Arc<str>> = {
            let mut map = self.lock();
            let mut fresh = Vec::new();
            for (name, key) in map.iter_mut() {
                if key.wanted == 0 || key.subscribed || key.kind != Kind::Stream {
                    continue;
                }
                if key.last.is_some() {
                    key.subscribed = true;
                } else {
                    fresh.push(name.clone());
                }
            }
            fresh
        };
        for chunk in fresh.chunks(KEYS_PER_READ) {
            let tips = self.script(&TIPS, chunk, "the streams' last ids").await?;
            let mut map = self.lock();
            for (name, tip) in chunk.iter().zip(tips) {
                if let Some(key) = map.get_mut(name) {
                    key.last = Some(if tip.is_empty() {
                        "0-0".to_owned()
                    } else {
                        tip
                    });
                    key.subscribed = true;
                    key.ring();
                }
            }
        }
        self.poll_sets(true).await
    }

    /// Fit the polled streams into `chunks` (a key keeps its chunk while it is polled; a new
    /// one goes where there is room): the chunks that changed.
    fn place(&self, chunks: &mut Vec<Vec<Arc<str>>>) -> Vec<usize> {
        let mut map = self.lock();
        let mut changed = Vec::new();
        for (i, chunk) in chunks.iter_mut().enumerate() {
            let before = chunk.len();
            chunk.retain(|name| {
                let keep = map.get(name).is_some_and(|k| k.subscribed);
                if !keep && let Some(key) = map.get_mut(name) {
                    key.chunk = None;
                }
                keep
            });
            if chunk.len() != before {
                changed.push(i);
            }
        }
        for (name, key) in map.iter_mut() {
            if key.kind != Kind::Stream || !key.subscribed || key.chunk.is_some() {
                continue;
            }
            let i = match chunks.iter().position(|c| c.len() < KEYS_PER_READ) {
                Some(i) => i,
                None => {
                    chunks.push(Vec::new());
                    chunks.len() - 1
                }
            };
            chunks[i].push(name.clone());
            key.chunk = Some(i);
            if !changed.contains(&i) {
                changed.push(i);
            }
        }
        changed
    }

    /// Look at the wanted delayed sets' earliest due times (only those not looked at yet, with
    /// `only_new`), and ring each whose changed (or that is looked at for the first time).
    async fn poll_sets(&self, only_new: bool) -> Result<(), Down> {
        let keys: Vec<Arc<str>> = self
            .lock()
            .iter()
            .filter(|(_, k)| k.kind == Kind::Set && k.wanted > 0 && !(only_new && k.subscribed))
            .map(|(name, _)| name.clone())
            .collect();
        for chunk in keys.chunks(KEYS_PER_READ) {
            let earliest = self
                .script(&EARLIEST, chunk, "the delayed sets' due times")
                .await?;
            let mut map = self.lock();
            for (name, score) in chunk.iter().zip(earliest) {
                if let Some(key) = map.get_mut(name) {
                    if !key.subscribed || key.last.as_deref() != Some(score.as_str()) {
                        key.ring();
                    }
                    key.last = Some(score);
                    key.subscribed = true;
                }
            }
        }
        Ok(())
    }

    /// How many delayed sets are wanted now.
    fn sets_wanted(&self) -> usize {
        self.lock()
            .values()
            .filter(|k| k.kind == Kind::Set && k.wanted > 0)
            .count()
    }

    /// Stop polling what nobody has wanted for [`UNSUBSCRIBE_AFTER`]: whether a stream left.
    fn drop_unwanted(&self) -> bool {
        let now = Instant::now();
        let mut streams = false;
        for key in self.lock().values_mut() {
            if key.wanted == 0
                && key.subscribed
                && key
                    .unwanted_since
                    .is_some_and(|since| now.duration_since(since) >= UNSUBSCRIBE_AFTER)
            {
                key.subscribed = false;
                streams |= key.kind == Kind::Stream;
            }
        }
        streams
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
            crate::store::redis_conn::COMMAND_TIMEOUT,
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

/// Whether stream id `a` is below `b` (`ms-seq`, compared as numbers).
fn below(a: &str, b: &str) -> bool {
    let parse = |id: &str| {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (
            ms.parse::<u64>().unwrap_or(0),
            seq.parse::<u64>().unwrap_or(0),
        )
    };
    parse(a) < parse(b)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{SETS_AT_MOST, SETS_EVERY, below, sets_every};

    #[test]
    fn set_looks_are_bounded_per_second_and_in_time() {
        assert_eq!(sets_every(0), SETS_EVERY);
        assert_eq!(sets_every(500), SETS_EVERY);
        assert_eq!(sets_every(1_000), Duration::from_secs(10));
        assert_eq!(sets_every(5_000), Duration::from_secs(50));
        assert_eq!(sets_every(100_000), SETS_AT_MOST);
    }

    #[test]
    fn stream_ids_compare_as_numbers() {
        assert!(below("9-0", "10-0"));
        assert!(below("10-2", "10-10"));
        assert!(!below("10-0", "10-0"));
        assert!(!below("9999999999999-0", "1796371437440-0"));
    }
}
