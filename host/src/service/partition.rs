//! One partition set up (the subscription itself when it has one): its keys claimed, its
//! secret, its delayed set, its settler and acker, its dispatcher and its read loop, ready to
//! run. What every partition of a subscription shares comes in as [`Common`].

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{RunError, Service};
use crate::entry::outcome::Policy;
use crate::handler::HandlerSlot;
use crate::observe::health::ReadHealth;
use crate::observe::metrics::{Metrics, SubLabels};
use crate::pipeline::admit::FlowWatch;
use crate::pipeline::admit::breaker::Breaker;
use crate::pipeline::admit::rate::RateLimiter;
use crate::pipeline::delayed::DelayedSet;
use crate::pipeline::dispatch::Dispatcher;
use crate::pipeline::read::{ReadPlan, SharedRead, Subscription, SubscriptionParts};
use crate::pipeline::settle::Settler;
use crate::service::plan::SubscriptionPlan;
use crate::store::doorbell::Doorbell;
use crate::store::keys::{Secret, SubscriptionKeys};
use crate::store::redis_conn::{self, RedisHandle};
use sluice_descriptor::{DelayedRetry, ResolvedStream};

/// What every partition of one subscription shares.
pub(super) struct Common<'a> {
    pub(super) sub: &'a SubscriptionPlan,
    pub(super) conn: &'a RedisHandle,
    pub(super) slot: Arc<HandlerSlot>,
    pub(super) flow: FlowWatch,
    pub(super) rate: Option<Arc<RateLimiter>>,
    pub(super) breaker: Option<Arc<Breaker>>,
    pub(super) doorbell: Option<Arc<Doorbell>>,
}

/// One partition, set up and ready to run.
pub(super) struct StartedPartition {
    pub(super) subscription: Arc<Subscription>,
    /// Its retention, when configured.
    pub(super) trimmer: Option<crate::control::retention::Trimmer>,
    /// Moves its dead letters out of an earlier release's shared default stream, when its
    /// dead-letter stream is the default one.
    pub(super) migration: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    /// Sends the partition's acks; ends with how many it could not send.
    pub(super) acker: std::pin::Pin<Box<dyn std::future::Future<Output = usize> + Send>>,
    pub(super) delayed: Option<Arc<DelayedSet>>,
    pub(super) admin: crate::serve::AdminSubscription,
    /// Its cron schedules' tickers (on a subscription's first partition only).
    pub(super) tickers: Vec<crate::control::schedules::Ticker>,
}

impl Service {
    /// Set up one partition `s` of `c.sub`, its deliveries counted by `deliveries` and its
    /// settler told by `abandon` when the drain gives up.
    pub(super) async fn start_partition(
        &self,
        (deliveries, abandon): (&TaskTracker, &CancellationToken),
        c: &Common<'_>,
        s: &ResolvedStream,
        shared: Option<Arc<SharedRead>>,
        stop: &CancellationToken,
    ) -> Result<StartedPartition, RunError> {
        let (keys, secret) = self.partition_keys(c, s, stop).await?;
        let health = partition_health(c, s);
        let delayed = self.delayed_set(c, s, &keys, secret.as_ref(), &health);
        let order = order(c, s, &keys, delayed.as_ref(), &self.metrics);
        if order.is_none() {
            let_go_of_leftovers(c, s).await;
        }
        let (settler, acker) = Settler::new(
            &keys,
            &c.sub.consumer,
            c.conn.clone(),
            (delayed.clone(), order.clone()),
            secret.clone(),
            self.events.clone(),
            abandon.clone(),
        );
        let labels = Metrics::labels(&s.stream, &s.group);
        let admin = admin_subscription(c, s, (&keys, delayed.as_ref()), &labels, &health);
        let dispatcher = Arc::new(
            Dispatcher::new(
                c.slot.clone(),
                policy(c.sub, s),
                Arc::new(settler),
                &self.metrics,
                &labels,
            )
            .with_breaker(c.breaker.clone())
            .with_effects(
                journal(c, s, &self.metrics),
                secret
                    .as_deref()
                    .filter(|_| sends_keys(c.sub))
                    .and_then(crate::runtime::effects::call_key),
            )
            .logging_each(self.plan.log_each_delivery),
        );
        let read_plan = read_plan(c.sub, s, &keys);
        // Idle, it waits on the host's doorbell rather than on a connection of its own; not
        // when it waits with its other partitions, nor when it claims (XAUTOCLAIM must run at
        // every read, idle or not).
        let bell = c
            .doorbell
            .as_ref()
            .filter(|_| shared.is_none() && read_plan.claim_min_idle.is_none())
            .map(|doorbell| {
                let keys: Vec<&str> = read_plan.sources().map(|s| read_plan.key(s)).collect();
                doorbell.bell(&keys)
            });
        let parts = SubscriptionParts {
            tracker: deliveries.clone(),
            stop: stop.clone(),
            secret,
            health,
            shared,
            bell,
            flow: c.flow.state.clone(),
            rate: c.rate.clone(),
            breaker: c.breaker.clone(),
            order,
            dedupe: self.deduper(s, &keys),
        };
        let subscription = Subscription::new(
            read_plan,
            c.conn.clone(),
            dispatcher,
            delayed.clone(),
            parts,
            &self.metrics,
        );
        Ok(StartedPartition {
            trimmer: self.trimmer(c.sub, &keys, c.conn),
            migration: migration(&keys, c.conn, c.doorbell.as_ref()),
            subscription,
            acker: Box::pin(acker),
            delayed,
            admin,
            tickers: tickers(c, s),
        })
    }

    /// The partition's keys, claimed for this subscription (and kept claimed while it runs),
    /// and its stream's secret (made with the subscription's set; it also records which
    /// entries of its streams were there before this release first used them: only those may
    /// carry the earlier release's unsealed bookkeeping).
    async fn partition_keys(
        &self,
        c: &Common<'_>,
        s: &ResolvedStream,
        stop: &CancellationToken,
    ) -> Result<(SubscriptionKeys, Option<Arc<Secret>>), RunError> {
        let (sub, conn) = (c.sub, c.conn);
        let mut keys = SubscriptionKeys::of(s)
            .with_dead_letter_maxlen(sub.dead_letter_maxlen)
            .with_history_entries(sub.history_entries)
            .with_retry_lane(sub.retry_lane);
        // Retries to the tail, but a lane left with work from when they went there: read it
        // until it is empty, so nothing stays stranded in it.
        if s.delayed_retry.is_some()
            && !sub.retry_lane
            && let Some(work) = lane_work(conn, &keys.with_retry_lane_clone()).await
        {
            tracing::warn!(
                stream = %s.stream,
                group = %s.group,
                lane = %work.0,
                entries = work.1,
                "retry_lane = false, but the retry lane still holds retries of this group (written while it was on): reading them too"
            );
            keys = keys.with_retry_lane(true);
        }
        crate::store::keys::check_same_slot(&mut conn.clone(), &keys).await?;
        crate::store::keys::claim(&mut conn.clone(), &keys).await?;
        tokio::spawn(super::tasks::renew_claims(
            conn.clone(),
            keys.clone(),
            stop.clone(),
        ));
        let own_keys = keys.own_streams();
        let own_keys: Vec<&str> = own_keys.iter().map(String::as_str).collect();
        // Made with a set, and where calls carry idempotency keys (which it keys).
        let secret = Secret::load_with(
            &mut conn.clone(),
            &s.stream,
            &own_keys,
            s.delayed_retry.is_some() || sends_keys(sub),
        )
        .await?
        .map(Arc::new);
        if s.delayed_retry.is_some() && !sub.retry_lane {
            self.check_tail_readers(sub, s, conn).await?;
        }
        Ok((keys, secret))
    }

    /// The partition's delayed-retry set, when it has one (with its bell on the doorbell).
    fn delayed_set(
        &self,
        c: &Common<'_>,
        s: &ResolvedStream,
        keys: &SubscriptionKeys,
        secret: Option<&Arc<Secret>>,
        health: &Arc<ReadHealth>,
    ) -> Option<Arc<DelayedSet>> {
        // A set always has a secret: it was created with it.
        let (Some(DelayedRetry::DurableZset { ttl, .. }), Some(secret)) =
            (&s.delayed_retry, secret)
        else {
            return None;
        };
        let set = DelayedSet::new(keys, *ttl, secret.clone(), c.conn.clone(), &self.metrics)?;
        let set = match &c.doorbell {
            Some(doorbell) => {
                let bell = doorbell.set_bell(set.key());
                set.with_bell(bell, s.block)
            }
            None => set,
        };
        Some(Arc::new(
            set.with_other_groups_see_retries(c.sub.other_groups_see_retries)
                .sweeping_to_tail(!c.sub.retry_lane)
                .with_health(health.clone()),
        ))
    }

    /// The partition's retention, when configured.
    fn trimmer(
        &self,
        sub: &SubscriptionPlan,
        keys: &SubscriptionKeys,
        conn: &RedisHandle,
    ) -> Option<crate::control::retention::Trimmer> {
        (sub.retention.is_some() || sub.dead_letter_keep.is_some()).then(|| {
            crate::control::retention::Trimmer::new(
                keys.clone(),
                sub.retention,
                sub.dead_letter_keep,
                &sub.consumer,
                conn.clone(),
                &self.metrics,
            )
        })
    }

    /// With retries to the stream's tail (`retry_lane = false`): refuse to start while other
    /// groups read the stream, unless the operator accepted it (then warn).
    async fn check_tail_readers(
        &self,
        sub: &crate::service::plan::SubscriptionPlan,
        s: &ResolvedStream,
        conn: &redis_conn::RedisHandle,
    ) -> Result<(), RunError> {
        let groups = crate::store::inspect::groups(&mut conn.clone(), &s.stream)
            .await
            .map_err(|error| RunError::Groups {
                stream: s.stream.clone(),
                error,
            })?;
        let others: Vec<String> = groups.into_iter().filter(|g| *g != s.group).collect();
        if others.is_empty() {
            return Ok(());
        }
        if !sub.other_groups_see_retries {
            return Err(RunError::TailWithOtherGroups {
                stream: s.stream.clone(),
                group: s.group.clone(),
                others,
            });
        }
        tracing::warn!(
            stream = %s.stream,
            group = %s.group,
            others = %others.join(", "),
            "due retries go back to the stream's tail, where the other consumer groups read each as a new entry (other_groups_see_retries = true)"
        );
        Ok(())
    }
}

/// How the partition's reads are doing, for readiness (its flow state's freshness and its
/// rate limit's trouble included).
fn partition_health(c: &Common<'_>, s: &ResolvedStream) -> Arc<ReadHealth> {
    let mut health = ReadHealth::new(s.block).with_flow(c.flow.fresh.clone());
    if let Some(rate) = &c.rate {
        health = health.with_trouble(rate.trouble());
    }
    Arc::new(health)
}

/// What the outcome decision needs of the subscription.
fn policy(sub: &SubscriptionPlan, s: &ResolvedStream) -> Policy {
    Policy {
        max_retries: s.max_retries,
        failure_backoff: s.failure_backoff,
        max_delay: s.max_delay,
        min_delay: sub.min_delay,
        max_entry_bytes: sub.limits.max_entry_bytes,
        poison_check: sub.limits.poison_check,
    }
}

/// What the read loop needs of the subscription and its keys.
fn read_plan(sub: &SubscriptionPlan, s: &ResolvedStream, keys: &SubscriptionKeys) -> ReadPlan {
    ReadPlan {
        stream: s.stream.as_str().into(),
        lane: keys.lane.clone(),
        group: s.group.as_str().into(),
        consumer: sub.consumer.as_str().into(),
        count: s.count,
        block: s.block,
        claim_min_idle: s.claim_min_idle,
        gone_after: sub.consumer_gone_after,
        max_in_flight: sub.limits.max_in_flight,
        lane_slots: sub.retry_lane_slots,
        largest_entry: Arc::default(),
        max_entry_bytes: usize::try_from(sub.limits.max_entry_bytes).unwrap_or(usize::MAX),
    }
}

/// What the admin server shows and acts on for this partition.
fn admin_subscription(
    c: &Common<'_>,
    s: &ResolvedStream,
    (keys, delayed): (&SubscriptionKeys, Option<&Arc<DelayedSet>>),
    labels: &SubLabels,
    health: &Arc<ReadHealth>,
) -> crate::serve::AdminSubscription {
    let sub = c.sub;
    crate::serve::AdminSubscription {
        labels: labels.clone(),
        of: c.slot.labels().clone(),
        dead_letter_maxlen: sub.dead_letter_maxlen,
        conn: c.conn.clone(),
        delayed_key: s.delayed_retry.as_ref().map(|d| d.key().to_owned()),
        lane: keys.lane.as_deref().map(str::to_owned),
        dead_letter: s.dead_letter.clone(),
        health: health.clone(),
        warnings: sub.warnings.clone(),
        flow: c.flow.state.clone(),
        rate_limit: sub.rate_limit,
        circuit_breaker: sub.circuit_breaker,
        consumer: sub.consumer.clone(),
        ordered: s.ordered_by.clone().map(|o| {
            let ttl = match &s.delayed_retry {
                Some(DelayedRetry::DurableZset { ttl: Some(ttl), .. }) => {
                    ttl.as_millis().max(1) as u64
                }
                _ => 0,
            };
            (o, ttl)
        }),
        delayed: delayed.cloned(),
        delayed_ttl: match &s.delayed_retry {
            Some(DelayedRetry::DurableZset { ttl, .. }) => *ttl,
            None => None,
        },
        payload_field: s.payload_field.clone(),
        schedule_target: crate::control::schedules::target_of(&c.sub.stream, s)
            .filter(|_| !c.sub.schedules.is_empty()),
        schedules: c.sub.schedules.clone(),
        dedupe: s.dedupe.clone(),
    }
}

/// Moving this partition's dead letters out of an earlier release's default dead-letter
/// stream, when its dead-letter stream is the default one; with the doorbell, a pass runs
/// only when the earlier stream was written.
fn migration(
    keys: &SubscriptionKeys,
    conn: &RedisHandle,
    doorbell: Option<&Arc<Doorbell>>,
) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
    let legacy = keys.legacy_dead_letter.as_deref()?;
    let bell = doorbell.map(|doorbell| {
        let bell = doorbell.bell(&[legacy]);
        bell.set_idle(true);
        bell
    });
    Some(Box::pin(super::tasks::migrate_dead_letters(
        keys.clone(),
        conn.clone(),
        bell,
    )))
}

/// The lane of `keys` and how many entries of its group it holds (pending or unread), when it
/// holds any.
async fn lane_work(
    conn: &redis_conn::RedisHandle,
    keys: &SubscriptionKeys,
) -> Option<(String, u64)> {
    let lane = keys.lane.as_deref()?;
    let group = crate::store::inspect::group(&mut conn.clone(), lane, &keys.group)
        .await
        .ok()
        .flatten()?;
    // An unknown lag (Redis cannot tell after deletions) may hide unread entries: read it.
    let unread = group.lag.unwrap_or(1);
    let work = group.pending as u64 + unread as u64;
    (work > 0).then(|| (lane.to_owned(), work))
}

/// The partition's keys' turns, when the subscription is ordered (it then has a delayed set:
/// the descriptor's checks refuse ordering without one).
fn order(
    c: &Common<'_>,
    s: &ResolvedStream,
    keys: &SubscriptionKeys,
    delayed: Option<&Arc<DelayedSet>>,
    metrics: &Metrics,
) -> Option<Arc<crate::pipeline::order::Order>> {
    let spec = s.ordered_by.clone()?;
    let set = delayed?.clone();
    let ttl = match &s.delayed_retry {
        Some(DelayedRetry::DurableZset { ttl, .. }) => *ttl,
        None => None,
    };
    Some(Arc::new(crate::pipeline::order::Order::new(
        spec,
        &s.payload_field,
        keys,
        set,
        ttl,
        c.conn.clone(),
        metrics,
    )))
}

impl Service {
    /// The partition's dedupe record, when the subscription deduplicates.
    fn deduper(
        &self,
        s: &ResolvedStream,
        keys: &SubscriptionKeys,
    ) -> Option<Arc<crate::pipeline::dedupe::Deduper>> {
        let spec = s.dedupe.clone()?;
        Some(Arc::new(crate::pipeline::dedupe::Deduper::new(
            spec,
            &s.payload_field,
            keys,
            self.events.clone(),
            &self.metrics,
        )))
    }
}

/// The tickers of the subscription's cron schedules, on its first partition (the plan refuses
/// schedules without a delayed set); none on the others.
fn tickers(c: &Common<'_>, s: &ResolvedStream) -> Vec<crate::control::schedules::Ticker> {
    let Some(target) = crate::control::schedules::target_of(&c.sub.stream, s) else {
        return Vec::new();
    };
    c.sub
        .schedules
        .iter()
        .map(|schedule| {
            crate::control::schedules::Ticker::new(schedule.clone(), target.clone(), c.conn.clone())
        })
        .collect()
}

/// Whether the subscription's outbound calls carry idempotency keys (a grant and a header).
fn sends_keys(sub: &SubscriptionPlan) -> bool {
    let http = &sub.limits.outbound_http;
    !http.allowed.is_empty() && http.idempotency_header.is_some()
}

/// Where the partition's journals of outbound calls go, with `effects = "journal"`: living as
/// long as its delayed set's ttl (or the default).
fn journal(
    c: &Common<'_>,
    s: &ResolvedStream,
    metrics: &Metrics,
) -> Option<Arc<crate::store::effects::JournalStore>> {
    c.sub.limits.outbound_http.journal.as_ref()?;
    let labels = metrics.series(&Metrics::labels(&s.stream, &s.group));
    let reason = |reason| {
        metrics
            .journal_calls
            .get_or_create(&crate::observe::metrics::ReasonLabels {
                stream: labels.stream.clone(),
                group: labels.group.clone(),
                reason,
            })
            .clone()
    };
    let counters = crate::store::effects::JournalCounters {
        replayed: reason("replayed"),
        recorded: reason("recorded"),
        diverged: reason("diverged"),
        too_big: reason("too_big"),
        journal_full: reason("journal_full"),
        unreadable: reason("unreadable"),
        write_failed: reason("write_failed"),
        // Only an offline replay counts calls the journal does not hold.
        ..Default::default()
    };
    let ttl = match &s.delayed_retry {
        Some(DelayedRetry::DurableZset { ttl, .. }) => *ttl,
        None => None,
    };
    Some(Arc::new(crate::store::effects::JournalStore::new(
        c.conn.clone(),
        ttl,
        counters,
    )))
}

/// On a subscription that is not ordered, what an earlier ordering of it left waiting in Redis
/// goes back to the group (see [`crate::pipeline::order::let_go_of_leftovers`]), said in the log.
async fn let_go_of_leftovers(c: &Common<'_>, s: &ResolvedStream) {
    let Some(DelayedRetry::DurableZset { key: set, .. }) = &s.delayed_retry else {
        return;
    };
    let mut conn = c.conn.clone();
    match crate::pipeline::order::let_go_of_leftovers(&mut conn, (&s.stream, &s.group, set)).await {
        Ok(0) => {}
        Ok(moved) => tracing::warn!(
            stream = %s.stream,
            group = %s.group,
            moved,
            "the subscription is no longer ordered (no ordered_by): the entries that waited behind their keys go back to the group through the delayed set"
        ),
        Err(err) => tracing::warn!(
            stream = %s.stream,
            group = %s.group,
            %err,
            "could not let go of what an earlier ordering left waiting; `sluice keys` lists it once ordered_by is back"
        ),
    }
}
