//! A subscription's shared rate limit: one token bucket in Redis (`keys::rate_key`, in the
//! stream's hash slot) that every host of the group draws from, so three hosts under a
//! `per_second = 100` limit start 100 deliveries a second together.
//!
//! Each read first takes its tokens (one for each entry it may start), so no more entries are
//! read than the budget allows. Tokens come from a local lease that one script call fills
//! (`lua/take_tokens.lua`: the bucket refilled by the server's clock, then up to what the read
//! wants taken at once): one call per read, never one per entry. While the budget is ample
//! (the last call granted all it asked), the next read's lease is fetched in the background as
//! soon as this one is used, so the read itself does not wait for a round trip. Tokens a read
//! did not use (it found fewer entries) go back to the lease, which still expires
//! [`LEASE_TTL`] after Redis granted them: a token is never used more than that after it left
//! the bucket. A host whose last read found nothing takes only a batch (below) for its next
//! read and fetches nothing ahead, so idle hosts blocked on an empty stream do not sit on a
//! read's worth of tokens each while the bucket fills up again. Over any time `t`, the group
//! starts at most `burst + per_second × t` deliveries, plus what the hosts leased in the second
//! before (one batch each when they were idle). A lease dropped unused only leaves the group a
//! little under the limit.
//!
//! When the bucket is short, a host waits for the time the script names until a batch (a
//! twentieth of a second's worth, at least one) is there, so hosts waiting on a tight budget
//! read in batches rather than an entry at a time. Each waits that time plus a random part of
//! up to a quarter of it: hosts that wake together would otherwise reach the bucket in the same
//! order every time, and the host that took the last batch (it asked again first, so its wait
//! ends exactly at the refill) would take every batch after it while the others starve. If the script fails (Redis away, a hostile
//! value of the wrong type in the key), the host takes nothing and tries again with backoff:
//! an unreadable budget never means an unlimited one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use redis::Script;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::RateLimit;
use crate::store::redis_conn::{ErrorClass, ReconnectBackoff, RedisHandle};

/// `wait` plus a random part of up to a quarter of it (see the module doc: no host wins every
/// refill by the order of its wake-ups).
fn jittered(wait: Duration) -> Duration {
    let quarter = u64::try_from(wait.as_micros() / 4).unwrap_or(u64::MAX);
    let random = getrandom::u64().unwrap_or(0);
    wait + Duration::from_micros(random % quarter.saturating_add(1))
}

/// How long tokens taken from Redis may wait unused in a host's lease.
pub const LEASE_TTL: Duration = Duration::from_secs(1);

/// Tokens taken from the bucket and not used yet.
#[derive(Debug)]
struct Lease {
    tokens: usize,
    until: Instant,
}

/// The shared budget of one subscription, as this host draws from it.
pub struct RateLimiter {
    key: String,
    limit: RateLimit,
    conn: RedisHandle,
    lease: Mutex<Lease>,
    /// The last call granted all it asked: fetch the next lease ahead.
    ample: AtomicBool,
    /// A background fetch is running.
    fetching: AtomicBool,
    /// The last read found nothing: the next one asks for a batch only.
    idle: AtomicBool,
    calls: Counter,
    waits: crate::observe::metrics::Count,
    /// Whether the budget can be read, for readiness: a host that cannot take tokens reads
    /// nothing.
    trouble: Arc<crate::observe::health::Trouble>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("key", &self.key)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// The budget of the subscription to `stream` with `group`, drawn through `conn`.
    pub fn new(
        stream: &str,
        group: &str,
        limit: RateLimit,
        conn: RedisHandle,
        metrics: &crate::observe::metrics::Metrics,
    ) -> Self {
        let labels = crate::observe::metrics::Metrics::labels(stream, group);
        Self {
            key: crate::store::keys::rate_key(stream, group),
            limit,
            conn,
            lease: Mutex::new(Lease {
                tokens: 0,
                until: Instant::now(),
            }),
            ample: AtomicBool::new(false),
            fetching: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            calls: metrics
                .rate_limit_calls
                .get_or_create(&metrics.series(&labels))
                .clone(),
            waits: metrics.count(&metrics.rate_limit_waits, &labels, "rate_limit_waits"),
            trouble: Arc::new(crate::observe::health::Trouble::new(
                "the rate limit's budget",
            )),
        }
    }

    /// Whether the budget can be read, for the subscription's readiness.
    pub fn trouble(&self) -> Arc<crate::observe::health::Trouble> {
        self.trouble.clone()
    }

    /// The fewest tokens worth a read when the budget is short: a twentieth of a second's
    /// worth, at least one, at most the burst and what the read wants.
    fn batch(&self, want: usize) -> usize {
        let twentieth = (self.limit.per_second / 20.0).floor() as usize;
        twentieth
            .max(1)
            .min(usize::try_from(self.limit.burst).unwrap_or(usize::MAX))
            .min(want.max(1))
    }

    /// Take up to `want` tokens from the lease, if it holds any.
    fn take_leased(&self, want: usize) -> Option<usize> {
        let mut lease = self.lease.lock().ok()?;
        if lease.until <= Instant::now() {
            lease.tokens = 0;
        }
        let n = lease.tokens.min(want);
        lease.tokens -= n;
        (n > 0).then_some(n)
    }

    /// Tokens Redis just granted: a fresh lease lives [`LEASE_TTL`] from now; added to tokens
    /// still leased, they expire with those (never a token kept longer than its grant allows,
    /// at worst a fresh one dropped early).
    fn add_to_lease(&self, n: usize) {
        if let Ok(mut lease) = self.lease.lock() {
            let now = Instant::now();
            if lease.until <= now || lease.tokens == 0 {
                lease.tokens = 0;
                lease.until = now + LEASE_TTL;
            }
            lease.tokens += n;
        }
    }

    /// Tokens a read took and did not use: back to the lease, which keeps the expiry of its
    /// grant (giving back never makes a token live longer). `found_nothing` marks this host
    /// idle until a read finds something.
    pub fn give_back(&self, n: usize, found_nothing: bool) {
        self.idle.store(found_nothing, Ordering::Relaxed);
        if n == 0 {
            return;
        }
        if let Ok(mut lease) = self.lease.lock()
            && lease.until > Instant::now()
        {
            lease.tokens += n;
        }
    }

    /// One script call: up to `want` tokens granted, or how long to wait for a batch.
    async fn fetch(&self, want: usize) -> redis::RedisResult<(usize, Duration)> {
        static TAKE: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
            Script::new(crate::store::lua!("pipeline/admit/lua/take_tokens"))
        });
        self.calls.inc();
        let mut conn = self.conn.clone();
        let (granted, wait_ms): (u64, u64) = TAKE
            .key(&self.key)
            .arg(self.limit.per_second)
            .arg(self.limit.burst)
            .arg(want)
            .arg(self.batch(want))
            .invoke_async(&mut conn)
            .await?;
        let granted = usize::try_from(granted).unwrap_or(0).min(want);
        self.ample.store(granted == want, Ordering::Relaxed);
        // A reply beyond a minute is not the script's: wait a second and ask again.
        let wait = Duration::from_millis(wait_ms.clamp(1, 60_000));
        Ok((
            granted,
            if wait_ms > 60_000 {
                Duration::from_secs(1)
            } else {
                wait
            },
        ))
    }

    /// Wait for between 1 and `want` tokens; `None` if stopped first.
    pub async fn take(self: &Arc<Self>, want: usize, stop: &CancellationToken) -> Option<usize> {
        let idle = self.idle.load(Ordering::Relaxed);
        let want = if idle { self.batch(want) } else { want.max(1) };
        let mut backoff = ReconnectBackoff::default();
        let mut waited = false;
        loop {
            if let Some(n) = self.take_leased(want) {
                if !idle {
                    self.fetch_ahead(want);
                }
                return Some(n);
            }
            let fetched = self.fetch(want).await;
            match &fetched {
                Ok(_) => self.trouble.ok(),
                Err(err) => self.trouble.failed(&format!(
                    "cannot take from {}: {}: {err}",
                    self.key,
                    ErrorClass::of(err).describe()
                )),
            }
            let pause = match fetched {
                Ok((granted, _)) if granted > 0 => {
                    backoff.reset();
                    self.add_to_lease(granted);
                    continue;
                }
                Ok((_, wait)) => {
                    backoff.reset();
                    if !waited {
                        self.waits.inc();
                        waited = true;
                    }
                    jittered(wait)
                }
                Err(err) => {
                    self.conn.saw_error(&err);
                    let pause = backoff.next_delay();
                    tracing::warn!(
                        key = %self.key,
                        retry_in_ms = pause.as_millis() as u64,
                        "cannot take from the rate limit's budget: {}: {err}; reading nothing until it can",
                        ErrorClass::of(&err).describe()
                    );
                    pause
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled() => return None,
            }
        }
    }

    /// While the budget is ample, fill the lease for the next read in the background once this
    /// one emptied it.
    fn fetch_ahead(self: &Arc<Self>, want: usize) {
        let empty = self.lease.lock().is_ok_and(|l| l.tokens == 0);
        if !empty
            || !self.ample.load(Ordering::Relaxed)
            || self.fetching.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Ok((granted, _)) = this.fetch(want).await
                && granted > 0
            {
                this.add_to_lease(granted);
            }
            this.fetching.store(false, Ordering::Release);
        });
    }
}
