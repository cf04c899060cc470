//! `DelayedRetry::DurableZset`: retries that wait in a Redis sorted set, so they survive any
//! crash of the service and fire at their due time.
//!
//! - **Park** (`lua/park.lua`): a `retry-after(d)` adds the entry to the set with ZADD, scored
//!   by its due time (server `TIME` + `d`, in epoch milliseconds), with its retry count raised
//!   by one, refreshes the set's ttl, and acknowledges the original with XACK, all in one
//!   script. The member (see [`crate::entry::member`]) carries the entry's fields whatever their number, its
//!   bookkeeping, and the stream and group it belongs to.
//! - **Sweep** (`lua/sweep.lua`): moves due members to where only the subscription's group reads
//!   them, its retry lane (`<set>.lane`), each as the member itself, its due time and a seal
//!   over both, the stream and the group (keyed with the stream's secret), and removes them, at
//!   most [`SWEEP_BATCH`] per pass, in one script; it also answers the earliest remaining due
//!   time. A member that cannot go back (not written by the park script, parked by another
//!   subscription, refused by Redis) is moved, raw, to the dead-letter stream with the reason
//!   rather than left to block every later sweep, or delivered to the wrong handler.
//! - **The stream's tail** (`retry_lane = false`, the seed's design): the sweep appends due
//!   retries to the stream itself instead, behind everything unread, where every group of the
//!   stream reads them; while another group reads the stream a pass holds them in the set (and
//!   says so through [`crate::observe::health`]) unless the operator accepted it.
//! - **ttl**: the set expires `ttl` after its latest due time, a deadline every park and every
//!   sweep moves; so a parked retry is never dropped before it is due, and a set goes only
//!   when no host swept it for `ttl` after its last retry was due.
//! - **When sweeps run**: all passes run on one task per set ([`DelayedSet::run_waker`]): every
//!   read of the subscription asks for one, without waiting for it, so the `block` interval
//!   bounds how late a due entry comes back even when another host parked it; a local timer
//!   set to the earliest due time this host knows of (from its own parks and from every pass)
//!   runs one then (its last milliseconds on the process's one precise timer, [`timer`]), so
//!   a retry normally comes back within milliseconds of its due time; and
//!   while a pass leaves more already due, the next runs at once. The sweep's XADD wakes every
//!   reader blocked on the stream, here and on other hosts.
//! - **Retry lane**: a stream in the set's hash slot that the subscription reads before the
//!   stream (see [`crate::pipeline::read`]): a due retry is handled at the next read, even behind a
//!   backlog. The move is one atomic script, a lane entry is pending in the lane until it is
//!   acknowledged, parked again or dead-lettered there, and a crash leaves it pending for the
//!   same recovery as the stream's (own pending re-read, gone-consumer take-over, XAUTOCLAIM).
//!   Each pass that adds to the lane first trims what every group of the lane has acknowledged,
//!   comparing ids exactly.
//! - **Clocks**: "now" is always the Redis server's clock, read inside the scripts; a host only
//!   turns "due in N ms by the server's clock" into a local timer, so hosts whose clocks drift
//!   cannot disagree about what is due.
//!
//! Nothing about a delay lives in the service: a restart or a crash loses no retry.
//!
//! Longer than the house's ~600 lines on purpose: park, sweep and the set's timer task share
//! one `DelayedSet` and its due-time bookkeeping (the sweep's reply sets the timer the park
//! wakes); `timer.rs` already holds the precise sleep.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use redis::{RedisResult, Script, ScriptInvocation};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub mod timer;

use crate::entry::delivery::Delivery;
use crate::store::keys::{self, Secret, SubscriptionKeys};
use crate::store::options::ScriptOptions;

/// This host's wall clock, epoch milliseconds.
fn local_now_ms() -> i64 {
    crate::support::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The most entries one sweep pass moves.
pub const SWEEP_BATCH: usize = 128;

/// `lua/park.lua`, behind the pending check and the history record it shares with the
/// dead-letter script.
static PARK: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/delayed/lua/park")));

/// `lua/sweep.lua`, behind the exact stream-id comparisons it shares with retention, the seal it
/// shares with the operations on dead letters, and the member reader it shares with them.
static SWEEP: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("pipeline/delayed/lua/sweep")));

/// The sweep script's SHA-1, as Redis names it in `EVALSHA`, `SLOWLOG` and `MONITOR`: how an
/// operator (or a fault test's proxy) tells a sweep pass from the host's other calls.
pub fn sweep_script_sha() -> &'static str {
    SWEEP.get_hash()
}

/// Where a park left the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// In the set, due at this server time (epoch ms).
    Due {
        /// Due time, server clock, epoch milliseconds.
        due_ms: i64,
        /// False when the consumer group was gone (deleted): the entry was parked anyway, and
        /// there was nothing to acknowledge.
        acked: bool,
    },
    /// The entry was no longer pending: someone else settled it; nothing was written.
    NotPending,
}

/// When the sweep timer fires next, and how many parks told it a due time.
#[derive(Debug, Default)]
struct Wake {
    /// The earliest local instant at which something this host knows of is due.
    at: Option<Instant>,
    /// Due times parks registered: a sweep pass that saw this number change while it was on
    /// its way keeps their wake instead of replacing it.
    parks: u64,
}

/// What one sweep pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Entries moved back onto the stream.
    pub moved: usize,
    /// Members moved to the dead-letter stream instead (unreadable, too many fields, or
    /// refused by Redis).
    pub dead_lettered: usize,
    /// Members that could not be moved anywhere (even the dead-letter write failed); they stay.
    pub stuck: usize,
    /// How long until the earliest entry left is due (server clock), if any is left.
    pub next_due_in: Option<Duration>,
    /// Another group of the stream the pass saw while its retries go to the stream's tail:
    /// with `held` the pass moved nothing (that group would read every retry as new).
    pub other_group: Option<String>,
    /// The pass held due retries back because of `other_group`.
    pub held: bool,
}

/// One subscription's delayed-retry set.
pub struct DelayedSet {
    stream: Arc<str>,
    /// The retry lane due entries go to instead of the stream, if the subscription has one.
    lane: Option<Arc<str>>,
    group: Arc<str>,
    key: Arc<str>,
    ttl: Option<Duration>,
    dead_letter: Arc<str>,
    dead_letter_maxlen: u64,
    secret: Arc<Secret>,
    conn: crate::store::redis_conn::RedisHandle,
    sweep_moved: Histogram,
    sweep_duration: Histogram,
    over_ttl: Counter,
    /// The earliest local instant at which something this host knows of is due.
    next_wake: Mutex<Wake>,
    wake_changed: Notify,
    /// A reader asked for a pass (see [`DelayedSet::sweep_soon`]).
    sweep_asked: AtomicBool,
    /// Signalled when a sweep of this host moved entries into the retry lane: the reader then
    /// reads as soon as one delivery can start, instead of waiting for half a batch.
    lane_filled: Notify,
    /// The Redis server's clock minus this host's wall clock, in ms, from the last script
    /// reply; what turns "now" on this host into the server's time for the lateness metric.
    clock_offset_ms: AtomicI64,
    has_offset: AtomicBool,
    /// With retries to the stream's tail: move them even while other groups read the stream.
    other_groups_see_retries: bool,
    /// Due retries go to the stream's tail (`retry_lane = false`), even when the subscription
    /// still reads a lane (to drain what an earlier configuration left there).
    to_tail: bool,
    /// Where a pass that holds retries back says why (the subscription's readiness).
    health: Option<Arc<crate::observe::health::ReadHealth>>,
    /// The other group the last warning named, so a pass that sees it again says nothing.
    warned_group: Mutex<Option<String>>,
    /// Rings when the set is written (another host parked or swept), with how long to wait
    /// for a ring while the doorbell cannot vouch for its rings: then the reader no longer
    /// asks for a pass at every read, and this bell does (see
    /// [`crate::store::doorbell`]).
    bell: Option<(crate::store::doorbell::Bell, Duration)>,
    /// The sweep script's options, encoded at the first pass: every one of them is fixed once
    /// the set is built, so a pass does not encode them again.
    sweep_options: std::sync::OnceLock<Vec<u8>>,
}

/// The least time between two passes a ring of the set's bell asks for: under a retry storm
/// every park rings, and a pass every ring would double the commands.
const BELL_PASS_EVERY: Duration = Duration::from_millis(100);

/// How long the timer waits before it tries again a pass that held retries back because
/// another group reads the stream (the retries are safe in the set meanwhile).
const HELD_RETRY: Duration = Duration::from_secs(5);

impl DelayedSet {
    /// The delayed set of the subscription with `keys` (`None` if it has none), expiring
    /// `ttl` after its latest due time, its members marked with the stream's `secret`, used
    /// through `conn`.
    pub fn new(
        keys: &SubscriptionKeys,
        ttl: Option<Duration>,
        secret: Arc<Secret>,
        conn: crate::store::redis_conn::RedisHandle,
        metrics: &crate::observe::metrics::Metrics,
    ) -> Option<Self> {
        let labels = crate::observe::metrics::Metrics::labels(&keys.stream, &keys.group);
        Some(Self {
            sweep_moved: metrics
                .sweep_moved
                .get_or_create(&metrics.series(&labels))
                .clone(),
            sweep_duration: metrics
                .sweep_duration
                .get_or_create(&metrics.series(&labels))
                .clone(),
            over_ttl: metrics
                .retry_over_ttl
                .get_or_create(&metrics.series(&labels))
                .clone(),
            stream: keys.stream.clone(),
            lane: keys.lane.clone(),
            group: keys.group.clone(),
            key: keys.delayed.clone()?,
            ttl,
            dead_letter: keys.dead_letter.clone(),
            dead_letter_maxlen: keys.maxlen_arg(),
            sweep_options: std::sync::OnceLock::new(),
            secret,
            conn,
            next_wake: Mutex::new(Wake::default()),
            wake_changed: Notify::new(),
            sweep_asked: AtomicBool::new(false),
            lane_filled: Notify::new(),
            clock_offset_ms: AtomicI64::new(0),
            has_offset: AtomicBool::new(false),
            other_groups_see_retries: false,
            to_tail: false,
            health: None,
            warned_group: Mutex::new(None),
            bell: None,
        })
    }

    /// The same set, moving retries to the stream's tail even while other groups read the
    /// stream (`other_groups_see_retries`; without a lane only).
    pub fn with_other_groups_see_retries(mut self, allowed: bool) -> Self {
        self.other_groups_see_retries = allowed;
        self
    }

    /// The same set, moving due retries to the stream's tail instead of the lane.
    pub fn sweeping_to_tail(mut self, to_tail: bool) -> Self {
        self.to_tail = to_tail;
        self
    }

    /// Where due retries go: the lane, or the stream's tail.
    fn target(&self) -> &str {
        match &self.lane {
            Some(lane) if !self.to_tail => lane,
            _ => &self.stream,
        }
    }

    /// The same set, saying in `health` when it holds retries back.
    pub fn with_health(mut self, health: Arc<crate::observe::health::ReadHealth>) -> Self {
        self.health = Some(health);
        self
    }

    /// Ask for a pass when `bell` rings (or every `poll` while the doorbell is down).
    pub fn with_bell(mut self, bell: crate::store::doorbell::Bell, poll: Duration) -> Self {
        bell.set_idle(true);
        self.bell = Some((bell, poll));
        self
    }

    /// The set's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The Redis server's current time as this host best knows it (epoch ms): its own wall
    /// clock corrected by the offset seen in the last script reply. `None` before any reply.
    pub fn server_now_ms(&self) -> Option<i64> {
        self.has_offset
            .load(Ordering::Relaxed)
            .then(|| local_now_ms() + self.clock_offset_ms.load(Ordering::Relaxed))
    }

    fn saw_server_time(&self, server_now_ms: i64) {
        self.clock_offset_ms
            .store(server_now_ms - local_now_ms(), Ordering::Relaxed);
        self.has_offset.store(true, Ordering::Relaxed);
    }

    /// Park `delivery` for `delay` and acknowledge the original, atomically, whatever its
    /// number of fields. The caller keeps `delay` at or below [`crate::entry::outcome::MAX_REPRESENTABLE_DELAY`].
    pub async fn park(&self, delivery: &Delivery, delay: Duration) -> RedisResult<Parked> {
        self.park_noting(delivery, delay, "", Duration::ZERO).await
    }

    /// [`Self::park`], adding `record` (the settler's history record, a JSON object left open;
    /// empty for none) to the entry's history in the same script, kept `keep` past the due
    /// time.
    pub async fn park_noting(
        &self,
        delivery: &Delivery,
        delay: Duration,
        record: &str,
        keep: Duration,
    ) -> RedisResult<Parked> {
        let delay = delay.min(crate::entry::outcome::MAX_REPRESENTABLE_DELAY);
        if let Some(ttl) = self.ttl
            && delay > ttl
        {
            self.over_ttl.inc();
            tracing::warn!(
                key = %self.key,
                delay_ms = delay.as_millis() as u64,
                ttl_ms = ttl.as_millis() as u64,
                "retry delay is longer than the delayed set's ttl; the set's expiry is kept past this entry's due time, but the ttl no longer says how long an unswept set lives"
            );
        }
        let delay_ms = delay.as_millis() as u64;
        let mut invocation = PARK.key(delivery.source.key(&self.stream, self.lane.as_deref()));
        invocation
            .key(&*self.key)
            .key(keys::history_key(&self.stream, &self.group))
            .key(keys::history_index_key(&self.stream, &self.group))
            .arg(&*self.group)
            .arg(&delivery.entry.id)
            .arg(delay_ms)
            .arg(self.ttl_ms())
            .arg(delivery.retry_count.saturating_add(1))
            .arg(&delivery.origin_id)
            .arg(&*self.stream)
            .arg(record)
            .arg(keep.as_millis() as u64);
        for (name, value) in delivery.user_fields() {
            invocation.arg(name.as_slice()).arg(value.as_slice());
        }
        let mut conn = self.conn.clone();
        let reply: Option<(i64, i64, i64, i64)> = invocation.invoke_async(&mut conn).await?;
        Ok(match reply {
            Some((due_ms, now_ms, acked, wait_us)) => {
                self.saw_server_time(now_ms);
                self.wake_in(Duration::from_micros(wait_us.max(0) as u64));
                Parked::Due {
                    due_ms,
                    acked: acked == 1,
                }
            }
            None => Parked::NotPending,
        })
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.map_or(0, |t| t.as_millis().max(1) as u64)
    }

    /// The sweep script's invocation for this set.
    fn sweep_invocation(&self) -> ScriptInvocation<'static> {
        let mut invocation = SWEEP.key(self.target());
        invocation.key(&*self.key).key(&*self.dead_letter).arg(
            self.sweep_options
                .get_or_init(|| self.encode_sweep_options())
                .as_slice(),
        );
        invocation
    }

    /// The sweep script's options (see the header of `lua/sweep.lua`).
    fn encode_sweep_options(&self) -> Vec<u8> {
        use keys::Seal;
        ScriptOptions::default()
            .with("batch", SWEEP_BATCH as u64)
            .with("secret", self.secret.value())
            .with("ttl_ms", self.ttl_ms())
            .with("max_fields", keys::SCRIPT_MAX_FIELDS as u64)
            .names(
                "fields",
                &[
                    ("retry_count", keys::RETRY_COUNT),
                    ("origin_id", keys::ORIGIN_ID),
                    ("due_ms", keys::DUE_MS),
                    ("mark", keys::MARK),
                    ("member", keys::MEMBER),
                    ("reason", keys::REASON),
                    ("origin_key", keys::ORIGIN_KEY),
                    ("origin_stream", keys::ORIGIN_STREAM),
                    ("origin_group", keys::ORIGIN_GROUP),
                    ("packed_fields", keys::PACKED_FIELDS),
                    ("parked", keys::PARKED),
                ],
            )
            .with("dead_letter_maxlen", self.dead_letter_maxlen.to_string())
            .with("stream", &*self.stream)
            .with("group", &*self.group)
            .with("past_other_groups", self.other_groups_see_retries)
            .names(
                "seals",
                &[
                    ("lane", Seal::Lane.name()),
                    ("tail", Seal::Tail.name()),
                    ("member", Seal::Member.name()),
                    ("tail_packed", Seal::TailPacked.name()),
                ],
            )
            .encode()
    }

    /// Move what is due (at most [`SWEEP_BATCH`] entries) back onto the stream.
    pub async fn sweep(&self) -> RedisResult<Swept> {
        let started = std::time::Instant::now();
        let parks_before = self.next_wake.lock().map_or(0, |w| w.parks);
        let mut conn = self.conn.clone();
        let reply = self.sweep_invocation().invoke_async(&mut conn).await?;
        Ok(self.swept(reply, started, parks_before))
    }

    /// Record what one sweep pass answered: `(moved, microseconds from the pass's end to the
    /// next due time or -1, server now, dead-lettered, stuck, another group seen or '')`.
    fn swept(
        &self,
        (moved, wait_us, now, dead_lettered, stuck, other): (usize, i64, i64, usize, usize, String),
        started: std::time::Instant,
        parks_before: u64,
    ) -> Swept {
        let other_group = (!other.is_empty()).then_some(other);
        let held = other_group.is_some() && !self.other_groups_see_retries;
        self.report_other_group(other_group.as_deref(), held);
        self.saw_server_time(now);
        self.sweep_duration.observe(started.elapsed().as_secs_f64());
        self.sweep_moved.observe(moved as f64);
        let next_due_in = (wait_us >= 0).then(|| Duration::from_micros(wait_us as u64));
        if dead_lettered > 0 {
            tracing::error!(
                key = %self.key,
                dead_letter = %self.dead_letter,
                dead_lettered,
                "delayed set held members that cannot go back onto the stream; moved them, raw, to the dead-letter stream with the reason"
            );
        }
        if stuck > 0 {
            tracing::error!(
                key = %self.key,
                dead_letter = %self.dead_letter,
                stuck,
                "delayed-set members can go neither back onto the stream nor to the dead-letter stream; they stay in the set"
            );
        }
        if moved > 0 && self.lane.is_some() && !self.to_tail {
            self.lane_filled.notify_one();
        }
        if moved > 0 {
            tracing::debug!(key = %self.key, moved, "swept due retries back onto the stream");
        }
        // What this pass saw replaces what this host knew (anything earlier has been moved),
        // unless a park of this host registered its due time while the pass was on its way:
        // that park may have run in Redis after the pass, unseen by it, so its wake stays.
        // A due time from Redis is bounded before it meets the clock (a broken reply must not
        // overflow it).
        let at = next_due_in.map(|d| Instant::now() + d.min(sluice_descriptor::MAX_DURATION));
        if let Ok(mut wake) = self.next_wake.lock() {
            wake.at = if wake.parks == parks_before {
                at
            } else {
                [wake.at, at].into_iter().flatten().min()
            };
        }
        self.wake_changed.notify_one();
        Swept {
            moved,
            dead_lettered,
            stuck,
            next_due_in,
            other_group,
            held,
        }
    }

    /// Say once per group seen that another group reads the stream the retries go back to:
    /// an error while retries are held back (and in readiness), a warning while they move past
    /// it (`other_groups_see_retries`).
    fn report_other_group(&self, other: Option<&str>, held: bool) {
        if let Some(health) = &self.health {
            health.retries_held(held.then(|| {
                format!(
                    "due retries of `{}` are held in `{}`: consumer group `{}` also reads the stream and would read each retry as a new entry; remove retry_lane = false (retries then wait in the group's own lane) or set other_groups_see_retries = true",
                    self.stream,
                    self.key,
                    other.unwrap_or_default()
                )
            }));
        }
        let Some(other) = other else {
            return;
        };
        let Ok(mut warned) = self.warned_group.lock() else {
            return;
        };
        if warned.as_deref() == Some(other) {
            return;
        }
        *warned = Some(other.to_owned());
        if held {
            tracing::error!(
                stream = %self.stream,
                group = %self.group,
                other_group = other,
                key = %self.key,
                "another consumer group reads the stream that due retries go back to (retry_lane = false): it would read every retry as a new entry, so they are held in the delayed set; remove retry_lane = false or set other_groups_see_retries = true"
            );
        } else {
            tracing::warn!(
                stream = %self.stream,
                group = %self.group,
                other_group = other,
                "due retries go back to the stream's tail, where consumer group `{other}` reads each as a new entry (other_groups_see_retries = true)"
            );
        }
    }

    /// Whether the set has a bell of its own (see [`DelayedSet::with_bell`]): then other
    /// hosts' parks ring it, and readers need not ask for passes.
    pub fn has_bell(&self) -> bool {
        self.bell.is_some()
    }

    /// Have the timer task run a pass as soon as it can, without waiting for it. Asked before
    /// every read: entries other hosts parked are due without this host's timer knowing, and
    /// this bounds how late they come back by the read's block time. Asks while a pass runs
    /// make one more pass after it, never a pile of concurrent ones.
    pub fn sweep_soon(&self) {
        if !self.sweep_asked.swap(true, Ordering::AcqRel) {
            self.wake_changed.notify_one();
        }
    }

    /// Wait until a sweep of this host moves entries into the retry lane (never, without a
    /// lane); a sweep since the last call counts.
    pub async fn lane_filled(&self) {
        if self.lane.is_some() {
            self.lane_filled.notified().await;
        } else {
            std::future::pending().await
        }
    }

    /// Wake the timer at `delay` from now unless it wakes earlier already; a park's due time
    /// (counted, see [`Wake::parks`]).
    fn wake_in(&self, delay: Duration) {
        let at = Instant::now() + delay.min(sluice_descriptor::MAX_DURATION);
        if let Ok(mut wake) = self.next_wake.lock() {
            wake.parks += 1;
            if wake.at.is_none_or(|current| at < current) {
                wake.at = Some(at);
                self.wake_changed.notify_one();
            }
        }
    }

    /// Sweep whenever the earliest known due time arrives, until `stop`.
    pub async fn run_waker(self: Arc<Self>, stop: CancellationToken) {
        let mut waker = Waker::default();
        loop {
            // A reader's ask runs a pass at once, except while a failed pass's backoff lasts.
            let asked = self.sweep_asked.swap(false, Ordering::AcqRel)
                && waker
                    .backoff_until
                    .is_none_or(|until| Instant::now() >= until);
            if waker.more_due || asked {
                if stop.is_cancelled() {
                    return;
                }
            } else {
                match self.wait_for_pass(&mut waker, &stop).await {
                    Some(true) => {}
                    Some(false) => continue,
                    None => return,
                }
            }
            if let Some((bell, _)) = &self.bell {
                // Before the pass: a write during it rings again.
                bell.seen();
            }
            let swept = self.sweep().await;
            self.after_pass(&mut waker, swept);
        }
    }

    /// Wait for the next pass: the earliest due time, a ring of the set's bell (another
    /// host's park or sweep, at most every [`BELL_PASS_EVERY`]), or a change of the due time.
    /// `Some(true)`: pass now; `Some(false)`: the due time changed, look again; `None`: stop.
    async fn wait_for_pass(&self, waker: &mut Waker, stop: &CancellationToken) -> Option<bool> {
        let next = self.next_wake.lock().ok().and_then(|w| w.at);
        if waker.timer.as_ref().map(|(at, _)| *at) != next {
            waker.timer = next.map(|at| (at, timer::sleep_until_precisely(at).boxed()));
        }
        let sleep = async {
            match waker.timer.as_mut() {
                Some((_, sleep)) => sleep.as_mut().await,
                None => std::future::pending().await,
            }
        };
        let last_bell_pass = waker.last_bell_pass;
        let rung = async {
            match &self.bell {
                Some((bell, poll)) => {
                    if let Some(last) = last_bell_pass {
                        tokio::time::sleep_until(last + BELL_PASS_EVERY).await;
                    }
                    while !bell.wait(*poll, None).await {}
                }
                None => std::future::pending().await,
            }
        };
        // A change already signalled is taken before the sleep is polled.
        tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            () = self.wake_changed.notified() => return Some(false),
            () = sleep => {}
            () = rung => {
                waker.last_bell_pass = Some(Instant::now());
            }
        }
        waker.timer = None;
        Some(true)
    }

    /// After a pass: what is due again at once, and how long a held or failed pass waits.
    fn after_pass(&self, waker: &mut Waker, swept: RedisResult<Swept>) {
        match swept {
            Ok(swept) if swept.held => {
                // What is due stays due: wait instead of asking again at once.
                waker.more_due = false;
                waker.backoff_until = Some(Instant::now() + HELD_RETRY);
                if let Ok(mut wake) = self.next_wake.lock() {
                    wake.at = waker.backoff_until;
                }
            }
            Ok(swept) => {
                waker.failures.reset();
                waker.backoff_until = None;
                waker.more_due = swept.next_due_in.is_some_and(|d| d.is_zero());
            }
            Err(err) => {
                waker.more_due = false;
                let pause = waker.failures.next_delay();
                tracing::warn!(key = %self.key, %err, retry_in_ms = pause.as_millis() as u64, "timed sweep failed");
                // The next pass waits for the backoff, even for what is already due.
                waker.backoff_until = Some(Instant::now() + pause);
                if let Ok(mut wake) = self.next_wake.lock() {
                    wake.at = waker.backoff_until;
                }
            }
        }
    }
}

/// What the timer task of a set carries from one pass to the next.
#[derive(Default)]
struct Waker {
    failures: crate::store::redis_conn::ReconnectBackoff,
    /// Whether the last pass left something due already: then the next pass runs at once (a
    /// timer set to "now" would wait for the timer's next millisecond tick).
    more_due: bool,
    backoff_until: Option<Instant>,
    /// The sleep towards the earliest due time, kept across wake-ups that leave that time as
    /// it was (every pass signals one), so its precise part is started once per target.
    timer: Option<(Instant, BoxFuture<'static, ()>)>,
    last_bell_pass: Option<Instant>,
}
