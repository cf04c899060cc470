//! One blocking read for every partition of a subscription, so that Redis connections do not
//! grow with partitions (1,024 partitions, each blocking on a connection of its own, once
//! opened 1,030 connections and kept Redis at 5-7k commands a second while idle).
//!
//! A partition reads on the host's shared connection, without blocking, while it finds
//! entries. When it finds none it waits here: one task holds one connection and one
//! XREADGROUP `>` BLOCK over the keys (stream and retry lane) of every waiting partition, and
//! hands each partition the entries read from its own keys. A partition whose block time passes
//! without entries gets an empty answer, as its own blocking read would have (together with
//! every other waiter whose block time is at least half over, so that idle partitions come
//! back to wait together).
//!
//! A partition that starts or stops waiting while the read is blocked changes the keys the read
//! must cover: the task cuts its read short with CLIENT UNBLOCK ... TIMEOUT, sent on the shared
//! connection (Redis answers the cut read as a timeout, having taken nothing), and reads again
//! over the new keys. A cut that comes after Redis answered cuts nothing, and it is sent again
//! until the read ends, since it may also arrive before the read blocks. Entries read for a
//! partition that stopped waiting (its loop was stopped or restarted) stay pending to this
//! consumer: a restarted loop first waits until no read covering its keys is in flight
//! ([`SharedRead::settled`]), then re-reads its pending entries from after its last read.
//!
//! Cutting needs `CLIENT ID` and `CLIENT UNBLOCK` (`@dangerous`) in the Redis user's ACL;
//! without them reads block at most 100 ms, so a partition waits that long at most to be taken
//! in, and the log says so once. A partition whose group is gone (NOGROUP ends the whole read)
//! gets the error alone; the others wait on. One read serves at most 64 partitions (see
//! `service.rs`): its cost grows with its keys each time it is made again.
//!
//! Only on one Redis node (or the master behind Sentinel): on a cluster every partition has a
//! slot of its own and a command's keys must share one, so there each partition keeps its own
//! blocking read.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{RedisError, RedisResult};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ReadPlan;
use super::commands::{self, ReadEntry};
use crate::entry::delivery::Source;
use crate::store::redis_conn::{ErrorClass, Reader, RedisHandle};

/// How long a cut waits for more partitions to come back to wait.
const CUT_GATHER: Duration = Duration::from_millis(1);
/// The longest a read blocks when this Redis user may not cut it short.
const UNCUT_BLOCK: Duration = Duration::from_millis(100);
/// The longest wait between two cuts of a read that must end (see the module doc).
const CUT_AGAIN_MAX: Duration = Duration::from_millis(100);

/// The shared wait of one subscription's partitions.
pub struct SharedRead {
    conn: RedisHandle,
    group: Arc<str>,
    consumer: Arc<str>,
    /// The partitions' block time: the longest a read waits, and the reader's reply deadline.
    block: Duration,
    /// A field's name or value over this many bytes is not kept (`max_entry_bytes`).
    cut_over: usize,
    state: Mutex<State>,
    /// A partition started or stopped waiting.
    changed: Notify,
    /// Counts the reads that ended, so a restarted partition can wait out the one in flight.
    reads_ended: watch::Sender<u64>,
    /// Whether the log said that reads cannot be cut short.
    warned: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct State {
    /// Bumped whenever a partition starts or stops waiting.
    generation: u64,
    next_ticket: u64,
    waiting: Vec<Waiter>,
    /// The streams (of partitions) the read in flight covers.
    reading: HashSet<Arc<str>>,
}

struct Waiter {
    ticket: u64,
    plan: ReadPlan,
    count: usize,
    deadline: Instant,
    answer: oneshot::Sender<RedisResult<Vec<ReadEntry>>>,
}

/// What one read covers.
struct Snapshot {
    generation: u64,
    keys: Vec<(Arc<str>, Source)>,
    /// The waiter (by ticket) each key belongs to, in the order of `keys`.
    owners: Vec<u64>,
    count: usize,
    block: Duration,
}

/// Takes a partition's wait back out of the read when the wait is dropped unanswered.
struct Leave<'a> {
    shared: &'a SharedRead,
    ticket: u64,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let before = state.waiting.len();
        state.waiting.retain(|w| w.ticket != self.ticket);
        if state.waiting.len() != before {
            state.generation += 1;
            drop(state);
            self.shared.changed.notify_one();
        }
    }
}

impl SharedRead {
    /// The shared wait for partitions read as `consumer` of `group` through `conn`, each
    /// blocking up to `block`; a field's name or value over `cut_over` bytes is not kept.
    pub fn new(
        conn: RedisHandle,
        (group, consumer): (Arc<str>, Arc<str>),
        block: Duration,
        cut_over: usize,
    ) -> Self {
        Self {
            conn,
            group,
            consumer,
            block,
            cut_over,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            reads_ended: watch::Sender::new(0),
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait for new entries of `plan`'s partition (its lane and stream), up to `count` from
    /// each, for up to its block time: what a blocking XREADGROUP `>` of its own would answer.
    pub async fn wait(&self, plan: &ReadPlan, count: usize) -> RedisResult<Vec<ReadEntry>> {
        let (answer, answered) = oneshot::channel();
        let ticket = {
            let mut state = self.lock();
            state.generation += 1;
            state.next_ticket += 1;
            let ticket = state.next_ticket;
            state.waiting.push(Waiter {
                ticket,
                plan: plan.clone(),
                count,
                deadline: Instant::now() + plan.block,
                answer,
            });
            ticket
        };
        self.changed.notify_one();
        let _leave = Leave {
            shared: self,
            ticket,
        };
        answered.await.unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::other(
                "the shared read of the subscription's partitions stopped",
            )))
        })
    }

    /// Return once no read in flight covers `plan`'s partition: a loop restarted while its
    /// last run was waiting re-reads its pending entries only after this, so that it also finds
    /// what that wait's read took for it.
    pub async fn settled(&self, plan: &ReadPlan) {
        let mut ended = self.reads_ended.subscribe();
        loop {
            if !self.lock().reading.contains(&plan.stream) {
                return;
            }
            if ended.changed().await.is_err() {
                return;
            }
        }
    }

    /// Serve the waiting partitions until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut reader: Option<(Reader, Option<i64>)> = None;
        loop {
            let snapshot = loop {
                if let Some(snapshot) = self.snapshot() {
                    break snapshot;
                }
                tokio::select! {
                    () = self.changed.notified() => {}
                    () = stop.cancelled() => return,
                }
            };
            let (conn, id) = match &mut reader {
                Some(reader) => reader,
                None => match self.connect().await {
                    Ok(connected) => reader.insert(connected),
                    Err(err) => {
                        self.end_read(&snapshot, Err(err));
                        continue;
                    }
                },
            };
            let block = if id.is_some() {
                snapshot.block
            } else {
                snapshot.block.min(UNCUT_BLOCK)
            };
            let read = commands::read_new_from(
                conn,
                &self.group,
                &self.consumer,
                snapshot.count,
                (block, self.cut_over),
                &snapshot.keys,
            );
            let id = *id;
            let cut = async {
                match id {
                    Some(id) => match self.cut_when_changed(snapshot.generation, id).await {},
                    None => std::future::pending::<()>().await,
                }
            };
            let result = tokio::select! {
                result = read => result,
                () = cut => continue,
                () = stop.cancelled() => return,
            };
            if let Err(err) = &result
                && ErrorClass::of(err) == ErrorClass::NoGroup
            {
                // One partition's group (or stream) is gone: that partition makes it again;
                // the others wait on.
                let gone = self.groups_gone(&snapshot).await;
                if !gone.is_empty() {
                    self.end_read_for(&gone, err);
                    continue;
                }
            }
            if let Err(err) = &result {
                self.conn.saw_error(err);
                if ErrorClass::of(err) != ErrorClass::NoGroup {
                    reader = None;
                    tracing::warn!(
                        group = %self.group,
                        %err,
                        "the shared read of the partitions failed: {}; reconnecting",
                        ErrorClass::of(err).describe()
                    );
                }
            }
            self.end_read(&snapshot, result);
        }
    }

    /// A connection of its own for the blocking read, and its client id (what CLIENT UNBLOCK
    /// names) when this Redis user may cut reads short: without `CLIENT ID` and `CLIENT
    /// UNBLOCK` in its ACL, reads block at most [`UNCUT_BLOCK`], and the log says why once.
    async fn connect(&self) -> RedisResult<(Reader, Option<i64>)> {
        // One node only (see the module doc): no key chooses it.
        let mut reader = self.conn.reader(self.block, "").await.map_err(|err| {
            RedisError::from(std::io::Error::other(
                crate::support::chain::chain(&err).to_string(),
            ))
        })?;
        let id: RedisResult<i64> = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut reader)
            .await;
        let may_cut = match id {
            // Not blocked yet: a permitted cut answers 0.
            Ok(id) => redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .arg("TIMEOUT")
                .query_async::<i64>(&mut self.conn.clone())
                .await
                .map(|_| id),
            Err(err) => Err(err),
        };
        match may_cut {
            Ok(id) => Ok((reader, Some(id))),
            Err(err) if err.code() == Some("NOPERM") => {
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        group = %self.group,
                        %err,
                        "this Redis user may not run CLIENT ID or CLIENT UNBLOCK, which the partitions' shared read needs to take in a partition at once: reads block at most {} ms instead, so an entry may wait that long (grant `+client|id +client|unblock`)",
                        UNCUT_BLOCK.as_millis()
                    );
                }
                Ok((reader, None))
            }
            Err(err) => Err(err),
        }
    }

    /// What the next read covers (marked as in flight), or `None` while no partition waits.
    fn snapshot(&self) -> Option<Snapshot> {
        let mut state = self.lock();
        if state.waiting.is_empty() {
            return None;
        }
        let now = Instant::now();
        let mut snapshot = Snapshot {
            generation: state.generation,
            keys: Vec::new(),
            owners: Vec::new(),
            count: usize::MAX,
            block: self.block,
        };
        let mut reading = HashSet::new();
        for w in &state.waiting {
            for source in w.plan.sources() {
                snapshot.keys.push((w.plan.key(source).into(), source));
                snapshot.owners.push(w.ticket);
            }
            reading.insert(w.plan.stream.clone());
            // COUNT applies to each key alike: the smallest room any waiter has.
            snapshot.count = snapshot.count.min(commands::budgeted(&w.plan, w.count));
            snapshot.block = snapshot
                .block
                .min(w.deadline.saturating_duration_since(now));
        }
        snapshot.block = snapshot.block.max(Duration::from_millis(1));
        state.reading = reading;
        Some(snapshot)
    }

    /// Cut the read in flight short once the waiting partitions are no longer those it covers;
    /// it never returns: the caller drops it when the read ends.
    async fn cut_when_changed(&self, generation: u64, id: i64) -> std::convert::Infallible {
        loop {
            self.changed.notified().await;
            if self.lock().generation != generation {
                break;
            }
        }
        // Partitions come back to wait in bursts (those answered by one read): one cut for a
        // burst, not one each.
        tokio::time::sleep(CUT_GATHER).await;
        let mut again = Duration::from_millis(1);
        loop {
            let cut: RedisResult<i64> = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .arg("TIMEOUT")
                .query_async(&mut self.conn.clone())
                .await;
            if let Err(err) = cut {
                tracing::debug!(group = %self.group, %err, "cannot cut the shared read short");
            }
            tokio::time::sleep(again).await;
            again = (again * 2).min(CUT_AGAIN_MAX);
        }
    }

    /// The waiters (by ticket) of `snapshot` with a key that lacks the group; none when that
    /// cannot be told (then every waiter gets the error).
    async fn groups_gone(&self, snapshot: &Snapshot) -> HashSet<u64> {
        let mut gone = HashSet::new();
        let mut conn = self.conn.clone();
        for ((key, _), owner) in snapshot.keys.iter().zip(&snapshot.owners) {
            match crate::store::inspect::group(&mut conn, key, &self.group).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    gone.insert(*owner);
                }
                Err(_) => return HashSet::new(),
            }
        }
        gone
    }

    /// End the read for the waiters in `gone` only, with `err`; the others wait on.
    fn end_read_for(&self, gone: &HashSet<u64>, err: &RedisError) {
        self.hand_out(|w| {
            if !gone.contains(&w.ticket) {
                return Some(w);
            }
            let _ = w.answer.send(Err(err.clone()));
            None
        });
    }

    /// End the read in flight: each waiter is answered by `answer` (which gives back those
    /// that wait on), and a restarted partition waiting for it to end is told.
    fn hand_out(&self, mut answer: impl FnMut(Waiter) -> Option<Waiter>) {
        let mut state = self.lock();
        state.reading.clear();
        let waiting = std::mem::take(&mut state.waiting);
        state.waiting = waiting.into_iter().filter_map(&mut answer).collect();
        drop(state);
        self.reads_ended.send_modify(|n| *n += 1);
    }

    /// Hand out what a read brought: each waiter its own entries, an empty answer to those
    /// whose block time is over, the error to every waiter if it failed.
    fn end_read(&self, snapshot: &Snapshot, result: RedisResult<Vec<(usize, ReadEntry)>>) {
        let entries = match result {
            Ok(entries) => entries,
            Err(err) => {
                self.hand_out(|w| {
                    let _ = w.answer.send(Err(err.clone()));
                    None
                });
                return;
            }
        };
        let mut by_owner: HashMap<u64, Vec<ReadEntry>> = HashMap::new();
        for (key, entry) in entries {
            if let Some(owner) = snapshot.owners.get(key) {
                by_owner.entry(*owner).or_default().push(entry);
            }
        }
        // Waiters whose block time is at least half over end with those whose time is up: an
        // idle subscription's partitions then come back to wait together, not each on its own
        // schedule, each time cutting the read of all the others.
        let half_over = Instant::now() + self.block / 2;
        self.hand_out(|w| {
            if let Some(entries) = by_owner.remove(&w.ticket) {
                commands::note_sizes(&w.plan, &entries);
                let _ = w.answer.send(Ok(entries));
            } else if half_over >= w.deadline || w.answer.is_closed() {
                let _ = w.answer.send(Ok(Vec::new()));
            } else {
                return Some(w);
            }
            None
        });
        for (_, entries) in by_owner {
            // Its partition stopped waiting while the read was answered: the entries are
            // pending to this consumer; a restarted loop re-reads them.
            tracing::info!(
                group = %self.group,
                count = entries.len(),
                "entries read for a partition that stopped waiting stay pending to this consumer"
            );
        }
    }
}
