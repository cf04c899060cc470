//! Cron schedules (`[[subscription.schedule]]`): each tick becomes exactly one entry for the
//! group, however many hosts run it.
//!
//! Every host runs a ticker per schedule. A second before a tick ([`LEAD`]) it runs
//! `lua/fire.lua`, which claims the tick in the schedule's record (the last tick fired) and
//! adds its entry to the subscription's delayed set, due at the tick, in one atomic step: the
//! first host's call writes it, the others' are refused, and the sweep moves it to the group at
//! its time like any entry sent for later (retry count 0). The entry's id is the same on every
//! host (`<tick ms>-<seq>`, the sequence number from the subscription and the schedule's name),
//! so even a member added twice would be one member.
//!
//! Times are Redis's: each host plans by its clock corrected by the offset Redis's `TIME`
//! showed it, so a host whose clock is off by an hour fires the same ticks at the same moments.
//!
//! A tick no host fired within [`GRACE`] of its time (every host was down: a host starting
//! finds the ticks since the last one fired; or Redis was away) is missed: `missed = "skip"`
//! drops it, `"once"` fires one entry (due at once) for the latest missed tick when a host
//! can. The record is keyed by the schedule's name, so a config that
//! edits a schedule's expression (hosts restarted one by one) fires no tick twice.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script};
use sha1::{Digest as _, Sha1};
use tokio_util::sync::CancellationToken;

use crate::config::schedule::{Missed, Schedule};
use crate::store::redis_conn::RedisHandle;

static FIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(crate::store::lua!("control/schedules/lua/fire")));

/// How long before its time a tick's entry is put in the delayed set (the sweep then moves it
/// at its time, with a retry's lateness).
pub const LEAD: Duration = Duration::from_secs(1);
/// How late a tick may still be fired; later, it is missed.
pub const GRACE: Duration = Duration::from_secs(5);
/// How long a schedule's record outlives its last tick, at least (longer for a longer gap).
const KEEP: Duration = Duration::from_secs(400 * 24 * 3600);

/// Where a schedule's entries go.
#[derive(Debug, Clone)]
pub struct Target {
    /// The stream (of the partition) the subscription reads.
    pub stream: String,
    /// Its group.
    pub group: String,
    /// Its delayed set.
    pub set: String,
    /// The set's ttl, if any.
    pub ttl: Option<Duration>,
    /// The field that carries the payload.
    pub payload_field: String,
}

/// The record of schedule `name` of `target`'s subscription: the last tick fired, in the
/// delayed set's hash slot.
pub fn record_key(target: &Target, name: &str) -> String {
    format!(
        "sluice-cron:{{{}}}:{}:{}:{}:{name}",
        crate::store::keys::hash_tag(&target.set),
        target.stream.len(),
        target.stream,
        target.group
    )
}

/// The id of the entry schedule `name` writes for `tick`: the same on every host, shaped like
/// a stream id with a sequence number (at least 10^18) no stream reaches.
pub fn tick_id(target: &Target, name: &str, tick_ms: i64) -> String {
    let mut hash = Sha1::new();
    for part in [&target.stream, &target.group, name] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let seq = 1_000_000_000_000_000_000 + u64::from_be_bytes(head) % 8_000_000_000_000_000_000;
    format!("{tick_ms}-{seq}")
}

/// What one fire call found: whether it wrote the tick's entry, Redis's now and the last
/// tick fired before it (0 for none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    /// It wrote the entry.
    pub fired: bool,
    /// Redis's clock, epoch ms.
    pub now_ms: i64,
    /// The last tick fired before this call.
    pub last_ms: i64,
}

/// Fire `tick_ms` of `schedule` for `target` (see `lua/fire.lua`).
pub async fn fire(
    conn: &mut RedisHandle,
    target: &Target,
    schedule: &Schedule,
    tick_ms: i64,
) -> RedisResult<Fired> {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    // The record outlives the gap to the next tick (a schedule of the 29th of February
    // waits years), so a missed tick is still known as one.
    let gap = schedule
        .next_after(tick_ms)
        .map_or(0, |next| u64::try_from(next - tick_ms).unwrap_or(0));
    let options = crate::store::options::ScriptOptions::default()
        .with("tick_ms", tick_ms)
        .with("stream", target.stream.as_str())
        .with("group", target.group.as_str())
        .with("id", tick_id(target, &schedule.name, tick_ms))
        .with("lead_ms", ms(LEAD) + 1_000)
        .with("ttl_ms", target.ttl.map_or(0, ms))
        .with("keep_ms", ms(KEEP).max(gap.saturating_mul(2)))
        .encode();
    let mut invocation = FIRE.key(record_key(target, &schedule.name));
    invocation.key(&target.set).arg(options);
    for (name, value) in schedule.entry.fields(&target.payload_field) {
        invocation.arg(name).arg(value);
    }
    let (fired, now_ms, last_ms): (u8, i64, i64) = invocation.invoke_async(conn).await?;
    Ok(Fired {
        fired: fired == 1,
        now_ms,
        last_ms,
    })
}

/// The last tick of schedule `name` fired by any host (epoch ms), if any.
pub async fn last_fired(
    conn: &mut RedisHandle,
    target: &Target,
    name: &str,
) -> RedisResult<Option<i64>> {
    redis::cmd("GET")
        .arg(record_key(target, name))
        .query_async(conn)
        .await
}

/// A schedule as an operator sees it (`sluice status`, the page): its next tick and the last
/// one any host fired.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleView {
    /// Its name.
    pub name: String,
    /// Its expression.
    pub cron: String,
    /// The time zone it is read in.
    pub time_zone: String,
    /// Its next tick after now (Redis's clock), epoch ms.
    pub next_ms: Option<i64>,
    /// The last tick any host fired, epoch ms.
    pub last_fired_ms: Option<i64>,
    /// What a missed tick becomes.
    pub missed: &'static str,
}

/// `schedule` of `target`'s subscription as an operator sees it at `now_ms` (Redis's clock).
pub async fn view(
    conn: &mut RedisHandle,
    target: &Target,
    schedule: &Schedule,
    now_ms: i64,
) -> RedisResult<ScheduleView> {
    Ok(ScheduleView {
        name: schedule.name.clone(),
        cron: schedule.cron.clone(),
        time_zone: schedule.time_zone.name().to_owned(),
        next_ms: schedule.next_after(now_ms),
        last_fired_ms: last_fired(conn, target, &schedule.name).await?,
        missed: match schedule.missed {
            Missed::Skip => "skip",
            Missed::Once => "once",
        },
    })
}

/// Where the schedules of the subscription to `stream` fire, on its partition `s` when that
/// is its first (schedules go to a subscription's first partition), `None` on the others or
/// without a delayed set.
pub fn target_of(
    stream: &sluice_descriptor::ResolvedStream,
    s: &sluice_descriptor::ResolvedStream,
) -> Option<Target> {
    let first = stream.partitioned().into_iter().next()?;
    let sluice_descriptor::DelayedRetry::DurableZset { key, ttl } = s.delayed_retry.as_ref()?;
    (first.stream == s.stream).then(|| Target {
        stream: s.stream.clone(),
        group: s.group.clone(),
        set: key.clone(),
        ttl: *ttl,
        payload_field: s.payload_field.clone(),
    })
}

/// One schedule's ticker on this host.
pub struct Ticker {
    schedule: Schedule,
    target: Target,
    conn: RedisHandle,
    /// Redis's clock minus this host's, ms.
    offset_ms: i64,
}

impl Ticker {
    /// A ticker firing `schedule`'s ticks into `target`.
    pub fn new(schedule: Schedule, target: Target, conn: RedisHandle) -> Self {
        Self {
            schedule,
            target,
            conn,
            offset_ms: 0,
        }
    }

    /// Redis's now, as this host last learnt it.
    fn server_now(&self) -> i64 {
        crate::support::clock::now_ms() as i64 + self.offset_ms
    }

    /// Fire ticks until `stop`: those more than [`GRACE`] late as the schedule says for missed
    /// ones (at start, those since the last tick any host fired), the others a [`LEAD`] before
    /// their time (or late, within [`GRACE`]).
    pub async fn run(mut self, stop: CancellationToken) {
        let mut backoff = crate::store::redis_conn::ReconnectBackoff::default();
        // Where this host starts: after the last tick any host fired (its missed ones then
        // follow the schedule's rule), or from now for a schedule that never fired.
        let mut cursor = loop {
            match self.start().await {
                Ok(cursor) => break cursor,
                Err(err) => {
                    self.failed(&err, None);
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                        () = stop.cancelled() => return,
                    }
                }
            }
        };
        // The ticks between the last one fired and GRACE ago passed while no host fired them;
        // the later ones are fired now, late.
        let mut live_from = self.server_now() - GRACE.as_millis() as i64;
        loop {
            if cursor < live_from {
                match self.missed(cursor, live_from).await {
                    Ok(()) => cursor = live_from,
                    Err(err) => {
                        self.failed(&err, None);
                        tokio::select! {
                            () = tokio::time::sleep(backoff.next_delay()) => {}
                            () = stop.cancelled() => return,
                        }
                        live_from = self.server_now() - GRACE.as_millis() as i64;
                        continue;
                    }
                }
            }
            let Some(tick) = self.schedule.next_after(cursor) else {
                tracing::warn!(schedule = %self.schedule.name, "the schedule fires no more");
                return;
            };
            let wait = tick - LEAD.as_millis() as i64 - self.server_now();
            if wait > 0 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(wait as u64)) => {}
                    () = stop.cancelled() => return,
                }
            }
            let result = fire(&mut self.conn.clone(), &self.target, &self.schedule, tick).await;
            // A tick more than GRACE late (Redis was away, this host stalled) is missed.
            live_from = self.server_now() - GRACE.as_millis() as i64;
            match result {
                Ok(fired) => {
                    self.learn(fired.now_ms);
                    backoff = Default::default();
                    // Refused as early (this host's idea of Redis's time was off): try again
                    // now that it knows the time.
                    if fired.fired || fired.last_ms >= tick {
                        cursor = tick;
                    }
                }
                Err(err) => {
                    self.failed(&err, Some(tick));
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                        () = stop.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Learn Redis's time and where to start: the last tick any host fired, or now.
    async fn start(&mut self) -> RedisResult<i64> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        self.learn(secs * 1000 + micros / 1000);
        let last = last_fired(&mut conn, &self.target, &self.schedule.name).await?;
        Ok(last.unwrap_or_else(|| self.server_now()))
    }

    /// The ticks after `cursor` up to `until` went by unfired (here): one entry for the latest
    /// with `missed = "once"`, none with `"skip"`.
    async fn missed(&mut self, cursor: i64, until: i64) -> RedisResult<()> {
        let Some(latest) = self
            .schedule
            .last_at_or_before(until)
            .filter(|t| *t > cursor)
        else {
            return Ok(());
        };
        let (stream, group, name) = (
            self.target.stream.clone(),
            self.target.group.clone(),
            self.schedule.name.clone(),
        );
        match self.schedule.missed {
            Missed::Skip => {
                tracing::warn!(stream, group, schedule = %name, latest_ms = latest, "ticks missed (no host could fire them in time): skipped, as `missed = \"skip\"` says");
                Ok(())
            }
            Missed::Once => {
                let fired =
                    fire(&mut self.conn.clone(), &self.target, &self.schedule, latest).await?;
                self.learn(fired.now_ms);
                if fired.fired {
                    tracing::warn!(stream, group, schedule = %name, latest_ms = latest, "ticks missed (no host could fire them in time): one entry fired now, as `missed = \"once\"` says");
                }
                Ok(())
            }
        }
    }

    fn learn(&mut self, server_now_ms: i64) {
        self.offset_ms = server_now_ms - crate::support::clock::now_ms() as i64;
    }

    fn failed(&self, err: &redis::RedisError, tick: Option<i64>) {
        tracing::warn!(
            stream = %self.target.stream,
            group = %self.target.group,
            schedule = %self.schedule.name,
            tick_ms = tick,
            err = %crate::store::redis_conn::ErrorClass::of(err).describe(),
            "cannot fire the schedule's tick; trying again"
        );
    }
}
