//! The plan: each subscription's component loaded and checked, its descriptor read and
//! overlaid with the operator's configuration, every default resolved. `sluice check` prints
//! it (the text is the command's own); `sluice run` runs it. Building the plan is where a bad descriptor, a component of the
//! wrong world or two subscriptions that would collide are refused, before anything starts.

use std::path::PathBuf;
use std::time::Duration;

use sluice_descriptor::{DelayedRetry, DescriptorError, ResolvedStream};

use crate::config::{
    Config, Isolation, Limits, MAX_COMPONENT_PARTITIONS, MAX_COMPONENT_RETRIES, SubscriptionConfig,
    check_component_partitions,
};
use crate::runtime::{LoadedComponent, Runtime, RuntimeError};

/// Why a plan could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The component could not be loaded or does not implement the world.
    #[error(transparent)]
    Component(#[from] RuntimeError),
    /// The resolved descriptor is invalid.
    #[error("{} (component {}): {problem}", origin.display(), component.display())]
    Descriptor {
        /// Where the subscription was configured.
        origin: PathBuf,
        /// The component.
        component: PathBuf,
        /// What is wrong (in the message itself, not repeated as a source).
        problem: DescriptorError,
    },
    /// The component asks for more partitions than a component may.
    #[error(
        "{} (component {}): the component asks for {asked} partitions; a component may ask for at most {MAX_COMPONENT_PARTITIONS} (set partitions in the config to allow up to {})",
        origin.display(), component.display(), sluice_descriptor::MAX_PARTITIONS
    )]
    ComponentPartitions {
        /// Where the subscription was configured.
        origin: PathBuf,
        /// The component.
        component: PathBuf,
        /// What it asked for.
        asked: u32,
    },
    /// Two subscriptions would read as the same consumer of the same group.
    #[error(
        "two subscriptions read stream `{stream}` as consumer `{consumer}` of group `{group}`; give one a different group or consumer"
    )]
    Duplicate {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The consumer.
        consumer: String,
    },
    /// `retry_lane` or `retry_lane_slots` ask for a lane for retries the subscription has no
    /// delayed set for.
    #[error(
        "{} (component {}): {key} needs a delayed-retry set: the lane carries retries the set holds; give the subscription `delayed_retry = {{ key = \"...\" }}` or drop {key}",
        origin.display(), component.display()
    )]
    LaneWithoutSet {
        /// Where the subscription was configured.
        origin: PathBuf,
        /// The component.
        component: PathBuf,
        /// The key that asks for a lane.
        key: &'static str,
    },
    /// One key would serve two subscriptions (or two roles): each would take or trim the
    /// other's retries or dead letters.
    #[error(transparent)]
    SharedKey(Box<SharedKey>),
    /// A subscription sends retries to the tail of a stream another subscription of the plan
    /// reads as another group.
    #[error(
        "stream `{stream}` is read by groups `{group}` and `{other_group}`, and retry_lane = false sends group `{group}`'s due retries to the stream's tail, where `{other_group}` would read each as a new entry: remove retry_lane = false (retries then wait in the group's own lane), or set other_groups_see_retries = true to accept it"
    )]
    TailWithOtherGroup {
        /// The stream.
        stream: String,
        /// The group whose retries go to the tail.
        group: String,
        /// The other group.
        other_group: String,
    },
    /// The operator's floor for retry delays is above the longest delay.
    #[error(
        "{} (component {}): min_delay ({}) is longer than max_delay ({}): no retry delay satisfies both",
        origin.display(), component.display(), human(*min_delay), human(*max_delay)
    )]
    MinDelayAboveMax {
        /// Where the subscription was configured.
        origin: PathBuf,
        /// The component.
        component: PathBuf,
        /// The floor.
        min_delay: Duration,
        /// The ceiling.
        max_delay: Duration,
    },
    /// The subscription's schedules lack what they need.
    #[error("{} (component {}): {problem}", origin.display(), component.display())]
    Schedule {
        /// Where the subscription was configured.
        origin: PathBuf,
        /// The component.
        component: PathBuf,
        /// What is missing.
        problem: &'static str,
    },
    /// The journal's keys and what the configuration and the component say of effects do not
    /// agree.
    #[error("{} (component {}): {problem}", origin.display(), component.display())]
    Effects {
        /// Where the subscription was configured.
        origin: PathBuf,
        /// The component.
        component: PathBuf,
        /// What does not agree.
        problem: &'static str,
    },
}

/// A key two subscriptions of one plan would both use as their own.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{key}` would be the {role} of stream `{stream}` group `{group}` and the {other_role} of stream `{other_stream}` group `{other_group}`; give each subscription keys of its own (e.g. delayed_retry = {{ key = \"{stream}.{group}.delayed\" }}, dead_letter = \"{stream}.{group}.dead-letter\")"
)]
pub struct SharedKey {
    /// The key.
    pub key: String,
    /// What it is for the later subscription.
    pub role: &'static str,
    /// The later subscription's stream.
    pub stream: String,
    /// The later subscription's group.
    pub group: String,
    /// What it is for the earlier one.
    pub other_role: &'static str,
    /// The earlier subscription's stream.
    pub other_stream: String,
    /// The earlier subscription's group.
    pub other_group: String,
}

/// One subscription, ready to run.
#[derive(Debug, Clone)]
pub struct SubscriptionPlan {
    /// The handler component.
    pub component: LoadedComponent,
    /// The resolved descriptor.
    pub stream: ResolvedStream,
    /// The consumer name.
    pub consumer: String,
    /// The Redis URL; `None` means the private dev server.
    pub redis: Option<String>,
    /// Credentials and TLS files for it.
    pub redis_access: crate::config::RedisAccess,
    /// Limits and instance policy.
    pub limits: Limits,
    /// Config values passed to the guest (including the host's `sluice.*` ones).
    pub values: Vec<(String, String)>,
    /// The operator's overrides, laid over a swapped-in component's descriptor too.
    pub overrides: sluice_descriptor::Overrides,
    /// Things that work but probably are not what the operator wants.
    pub warnings: Vec<String>,
    /// On a non-claiming subscription: how long another consumer must have been idle, holding
    /// pending entries, before this one takes them over (`None`: never).
    pub consumer_gone_after: Option<Duration>,
    /// Trim the dead-letter stream to about this many entries (`None`: never).
    pub dead_letter_maxlen: Option<u64>,
    /// How many entries' histories the subscription keeps in Redis (0: none).
    pub history_entries: u32,
    /// Entries it gives itself on cron schedules (into its delayed set).
    pub schedules: Vec<crate::config::schedule::Schedule>,
    /// Due retries go to the group's retry lane, which the reader serves first (true whenever
    /// there is a delayed set, unless the operator asked for the stream's tail).
    pub retry_lane: bool,
    /// Handler slots kept for due retries, which new stream entries never take (0 without a
    /// lane).
    pub retry_lane_slots: usize,
    /// With retries at the stream's tail: run although other groups read the stream.
    pub other_groups_see_retries: bool,
    /// The group's shared rate limit, if any.
    pub rate_limit: Option<crate::config::RateLimit>,
    /// The group's circuit breaker, if any.
    pub circuit_breaker: Option<crate::config::CircuitBreaker>,
    /// How a canary of this subscription is judged.
    pub canary: crate::config::Canary,
    /// The shortest wait of any retry.
    pub min_delay: Duration,
    /// Trim what every group has acknowledged (`None`: off).
    pub retention: Option<crate::config::Retention>,
    /// Trim dead letters older than this (`None`: never).
    pub dead_letter_keep: Option<Duration>,
}

/// Every subscription of one invocation.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The subscriptions, in configuration order.
    pub subscriptions: Vec<SubscriptionPlan>,
    /// How long a shutdown waits for in-flight deliveries.
    pub shutdown_timeout: Duration,
    /// Where the admin server listens, if anywhere.
    pub admin: Option<std::net::SocketAddr>,
    /// Where the admin API's token comes from.
    pub admin_token: Option<crate::config::TokenSource>,
    /// Where the admin API's read-only token comes from.
    pub admin_read_token: Option<crate::config::TokenSource>,
    /// Where the key that seals canaries comes from (else the admin token's).
    pub rollout_key: Option<crate::config::TokenSource>,
    /// With no admin token (and no `admin_open_on_loopback`), the key the admin API and page
    /// take instead, made for this process (`sluice dev` prints it in its banner; `None`: the
    /// host makes one at start and writes it to standard error).
    pub admin_session_key: Option<String>,
    /// Without a key, make one for this process (`sluice dev` on its private Redis).
    pub rollout_key_ephemeral: bool,
    /// The largest upload the admin API accepts.
    pub admin_max_upload: u64,
    /// Mutating admin calls need no token (loopback only).
    pub admin_open_on_loopback: bool,
    /// Every mutating admin call is refused.
    pub admin_read_only: bool,
    /// How often component files are checked for a new version.
    pub watch_interval: Option<Duration>,
    /// Whether metrics are labelled by subscription (see [`crate::observe::metrics::Metrics::new`]).
    pub metrics_per_subscription: bool,
    /// How idle subscriptions learn that their streams were written.
    pub doorbell: crate::config::DoorbellMode,
    /// One log line per delivery (its outcome, time and trace): `sluice dev`'s, where a
    /// working handler must be visible; off in production, where it would be a line per entry.
    pub log_each_delivery: bool,
}

/// The default consumer name: stable across restarts of the same machine, so a restarted host
/// finds its own pending entries.
pub fn default_consumer() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("sluice-{host}")
}

/// How long a consumer must be idle, holding pending entries, to count as gone: longer than a
/// live host can go without reading (all its deliveries busy for `handler_timeout`, then a
/// blocked read), with room to spare, and at least a minute.
pub fn default_gone_after(handler_timeout: Duration, block: Duration) -> Duration {
    (handler_timeout * 2 + block).max(Duration::from_secs(60))
}

impl Plan {
    /// Load every component and resolve every subscription. `redis_override` (from `--redis`
    /// or `SLUICE_REDIS_URL`) replaces every configured URL.
    pub async fn build(
        config: &Config,
        runtime: &Runtime,
        redis_override: Option<&str>,
    ) -> Result<Self, PlanError> {
        let mut subscriptions: Vec<SubscriptionPlan> = Vec::new();
        // Each file is read, hashed and asked for its descriptor once, however many
        // subscriptions run it: thousands of subscriptions of one component spent most of
        // their start doing it again for each.
        let mut loaded: std::collections::HashMap<PathBuf, (LoadedComponent, _)> =
            std::collections::HashMap::new();
        for sub in &config.subscriptions {
            let (component, descriptor) = match loaded.get(&sub.component) {
                Some(known) => known.clone(),
                None => {
                    let component = runtime.load(&sub.component).await?;
                    let descriptor = component.descriptor().await?;
                    loaded.insert(
                        sub.component.clone(),
                        (component.clone(), descriptor.clone()),
                    );
                    (component, descriptor)
                }
            };
            let resolved = resolved(sub, descriptor, &subscriptions)?;
            let plan = subscription_plan(sub, component, resolved, redis_override)?;
            subscriptions.push(plan);
        }
        check_keys(&subscriptions)?;
        check_tail_readers(&subscriptions)?;
        Ok(Self {
            subscriptions,
            shutdown_timeout: config.shutdown_timeout,
            admin: config.admin,
            admin_token: config.admin_token.clone(),
            admin_read_token: config.admin_read_token.clone(),
            rollout_key: config.rollout_key.clone(),
            admin_session_key: None,
            rollout_key_ephemeral: false,
            admin_max_upload: config.admin_max_upload,
            admin_open_on_loopback: config.admin_open_on_loopback,
            admin_read_only: config.admin_read_only,
            watch_interval: config.watch_interval,
            metrics_per_subscription: config.metrics_per_subscription,
            log_each_delivery: false,
            doorbell: config.doorbell,
        })
    }

    /// Whether some subscription has no Redis URL and needs the private dev server.
    pub fn needs_dev_redis(&self) -> bool {
        self.subscriptions.iter().any(|s| s.redis.is_none())
    }
}

/// Refuse a subscription whose retries go to its stream's tail (`retry_lane = false`, without
/// `other_groups_see_retries`) when another subscription of the plan reads that stream as
/// another group; other hosts' groups are checked in Redis at start and at every sweep.
fn check_tail_readers(subscriptions: &[SubscriptionPlan]) -> Result<(), PlanError> {
    for sub in subscriptions {
        let to_tail =
            sub.stream.delayed_retry.is_some() && !sub.retry_lane && !sub.other_groups_see_retries;
        if !to_tail {
            continue;
        }
        if let Some(other) = subscriptions
            .iter()
            .find(|o| o.stream.stream == sub.stream.stream && o.stream.group != sub.stream.group)
        {
            return Err(PlanError::TailWithOtherGroup {
                stream: sub.stream.stream.clone(),
                group: sub.stream.group.clone(),
                other_group: other.stream.group.clone(),
            });
        }
    }
    Ok(())
}

/// What one key is for one subscription.
#[derive(Clone, Copy)]
struct Use<'a> {
    role: &'static str,
    stream: &'a str,
    group: &'a str,
}

/// Refuse a key that two subscriptions of the plan would both use as their own (a delayed set,
/// a retry lane, a dead-letter stream), or that one uses as its own and another reads as its
/// stream. Subscriptions to one stream share the stream; those of one group (on one stream)
/// share everything.
fn check_keys(subscriptions: &[SubscriptionPlan]) -> Result<(), PlanError> {
    let mut seen: std::collections::HashMap<String, Use<'_>> = std::collections::HashMap::new();
    for sub in subscriptions {
        for part in sub.stream.partitioned() {
            let lane = part
                .delayed_retry
                .as_ref()
                .filter(|_| sub.retry_lane)
                .map(|d| crate::store::keys::lane_key(d.key()));
            let mut keys = vec![(part.stream.clone(), "stream")];
            keys.push((part.dead_letter.clone(), "dead-letter stream"));
            keys.extend(
                part.delayed_retry
                    .as_ref()
                    .map(|d| (d.key().to_owned(), "delayed-retry set")),
            );
            keys.extend(lane.map(|l| (l, "retry lane")));
            for (key, role) in keys {
                let (stream, group) = (sub.stream.stream.as_str(), sub.stream.group.as_str());
                let this = Use {
                    role,
                    stream,
                    group,
                };
                let Some(other) = seen.get(&key).copied() else {
                    seen.insert(key, this);
                    continue;
                };
                let same_role = other.role == role;
                let shared_stream = same_role && role == "stream";
                let same_owner = same_role && other.stream == stream && other.group == group;
                if !shared_stream && !same_owner {
                    return Err(PlanError::SharedKey(Box::new(SharedKey {
                        key,
                        role,
                        stream: stream.to_owned(),
                        group: group.to_owned(),
                        other_role: other.role,
                        other_stream: other.stream.to_owned(),
                        other_group: other.group.to_owned(),
                    })));
                }
            }
        }
    }
    Ok(())
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The component's descriptor with the subscription's overrides laid over it, resolved, and
/// the consumer name; two subscriptions may not read as the same consumer of the same group.
fn resolved(
    sub: &SubscriptionConfig,
    descriptor: sluice_descriptor::RedisStream,
    planned: &[SubscriptionPlan],
) -> Result<(ResolvedStream, String), PlanError> {
    let descriptor = descriptor.overlay(&sub.overrides);
    let stream = descriptor
        .resolve()
        .map_err(|problem| PlanError::Descriptor {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            problem,
        })?;
    let consumer = stream.consumer.clone().unwrap_or_else(default_consumer);
    if let Some(other) = planned.iter().find(|p| {
        p.stream.stream == stream.stream && p.stream.group == stream.group && p.consumer == consumer
    }) {
        return Err(PlanError::Duplicate {
            stream: other.stream.stream.clone(),
            group: other.stream.group.clone(),
            consumer,
        });
    }
    Ok((stream, consumer))
}

/// One subscription's plan from its configuration and its resolved stream: checked, with its
/// warnings, and every default filled in.
fn subscription_plan(
    sub: &SubscriptionConfig,
    component: LoadedComponent,
    (mut stream, consumer): (ResolvedStream, String),
    redis_override: Option<&str>,
) -> Result<SubscriptionPlan, PlanError> {
    let retry_lane = checked(sub, &stream)?;
    let limits = effects_limits(sub, &stream)?;
    let warnings = warnings(sub, &mut stream, retry_lane);
    let mut values: Vec<(String, String)> = sub
        .values
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    values.push((
        sluice_descriptor::PAYLOAD_FIELD_CONFIG_KEY.to_owned(),
        stream.payload_field.clone(),
    ));
    let consumer_gone_after = match sub.consumer_gone_after {
        Some(choice) => choice,
        None => Some(default_gone_after(sub.limits.handler_timeout, stream.block)),
    }
    .filter(|_| stream.claim_min_idle.is_none());
    if !sub.schedules.is_empty() && stream.delayed_retry.is_none() {
        return Err(PlanError::Schedule {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            problem: "[[subscription.schedule]] needs a delayed-retry set: each tick's entry waits there until its time; add `delayed_retry = { key = \"...\" }`",
        });
    }
    Ok(SubscriptionPlan {
        schedules: sub.schedules.clone(),
        consumer_gone_after,
        dead_letter_maxlen: sub.dead_letter_maxlen,
        history_entries: sub
            .history_entries
            .unwrap_or(crate::store::keys::DEFAULT_HISTORY_ENTRIES),
        retry_lane,
        retry_lane_slots: if retry_lane {
            sub.retry_lane_slots
                .unwrap_or_else(|| crate::config::default_lane_slots(sub.limits.max_in_flight))
        } else {
            0
        },
        other_groups_see_retries: sub.other_groups_see_retries,
        rate_limit: sub.rate_limit,
        circuit_breaker: sub.circuit_breaker,
        canary: sub.canary,
        min_delay: sub.min_delay,
        retention: sub.retention,
        dead_letter_keep: sub.dead_letter_keep,
        component,
        consumer,
        stream,
        redis: redis_override
            .map(str::to_owned)
            .or_else(|| sub.redis.clone()),
        redis_access: sub.redis_access.clone(),
        limits,
        values,
        overrides: sub.overrides.clone(),
        warnings,
    })
}

/// The subscription's limits with the journal the resolved stream asks for: the config's
/// `effects` wins over the component's (the overlay did that), its `journal_*` bounds apply
/// to either, and they may not be set for a subscription nobody journals.
fn effects_limits(
    sub: &SubscriptionConfig,
    stream: &ResolvedStream,
) -> Result<crate::config::Limits, PlanError> {
    let mut limits = sub.limits.clone();
    let http = &mut limits.outbound_http;
    let problem = match stream.effects {
        // Without a grant no call is made: nothing to journal, nothing to pay for it.
        sluice_descriptor::Effects::Journal if http.allowed.is_empty() => {
            http.journal = None;
            None
        }
        sluice_descriptor::Effects::Journal => {
            http.journal.get_or_insert_with(Default::default);
            None
        }
        sluice_descriptor::Effects::Live if http.journal.is_some() => Some(
            "journal_* keys are set, but neither the config (effects = \"journal\") nor the component (.effects(Effects::Journal)) journals this subscription's calls",
        ),
        sluice_descriptor::Effects::Live => None,
    };
    let problem = problem.or_else(|| {
        (limits.poison_check && !http.allowed.is_empty() && http.journal.is_none()).then_some(
            "poison_check needs effects = \"journal\" (in the config or the component) on a subscription that may call out: the second run makes no call over the network, it answers from the journal",
        )
    });
    match problem {
        Some(problem) => Err(PlanError::Effects {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            problem,
        }),
        None => Ok(limits),
    }
}

/// What the configuration and the resolved stream may not say together; whether the
/// subscription has a retry lane.
fn checked(sub: &SubscriptionConfig, stream: &ResolvedStream) -> Result<bool, PlanError> {
    let has_set = stream.delayed_retry.is_some();
    let lane_without_set = match (sub.retry_lane, sub.retry_lane_slots) {
        (Some(true), _) => Some("retry_lane = true"),
        (_, Some(_)) => Some("retry_lane_slots"),
        _ => None,
    };
    if let Some(key) = lane_without_set.filter(|_| !has_set) {
        return Err(PlanError::LaneWithoutSet {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            key,
        });
    }
    if let Some(max_delay) = stream.max_delay
        && max_delay < sub.min_delay
    {
        return Err(PlanError::MinDelayAboveMax {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            min_delay: sub.min_delay,
            max_delay,
        });
    }
    if stream.ordered_by.is_some() && sub.retry_lane == Some(false) {
        return Err(PlanError::Descriptor {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            problem: DescriptorError::Ordering {
                stream: stream.stream.clone(),
                problem: "ordered_by needs the retry lane (retry_lane = false sends retries to the stream's tail, where a retry would be read as a new entry of its key)".into(),
            },
        });
    }
    if sub.overrides.max_in_flight_per_key.is_some() && stream.ordered_by.is_none() {
        return Err(PlanError::Descriptor {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            problem: DescriptorError::Ordering {
                stream: stream.stream.clone(),
                problem: "max_in_flight_per_key only means something with ordered_by (neither the config nor the component orders this subscription by a key)".into(),
            },
        });
    }
    check_component_partitions(&sub.overrides, stream.partitions).map_err(|asked| {
        PlanError::ComponentPartitions {
            origin: sub.origin.clone(),
            component: sub.component.clone(),
            asked,
        }
    })?;
    Ok(has_set && sub.retry_lane != Some(false))
}

/// What the operator is warned of at start (and by `sluice check`); a component's own
/// `max_retries` over the cap is capped here.
fn warnings(
    sub: &SubscriptionConfig,
    stream: &mut ResolvedStream,
    retry_lane: bool,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let has_set = stream.delayed_retry.is_some();
    if sub.overrides.max_retries.is_none() && stream.max_retries > MAX_COMPONENT_RETRIES {
        warnings.push(format!(
            "the component asks for max_retries {}; a component's own value is capped at {MAX_COMPONENT_RETRIES} (set max_retries in the config to allow more)",
            stream.max_retries
        ));
        stream.max_retries = MAX_COMPONENT_RETRIES;
    }
    if has_set && !retry_lane && sub.other_groups_see_retries {
        warnings.push(format!(
            "retry_lane = false with other_groups_see_retries: due retries go back to the tail of `{}`, where every other consumer group of the stream reads each one as a new entry (Sluice groups skip each other's; other services do not)",
            stream.stream
        ));
    }
    // With poison_check a failing attempt may run twice, each within handler_timeout.
    let longest = sub.limits.handler_timeout * if sub.limits.poison_check { 2 } else { 1 };
    if let Some(min_idle) = stream.claim_min_idle
        && min_idle <= longest
    {
        warnings.push(format!(
            "claim_min_idle ({min_idle:?}) is not longer than the longest an attempt may run ({longest:?}: handler_timeout, twice with poison_check): another consumer may claim an entry that is still being handled"
        ));
    }
    if let Some(DelayedRetry::DurableZset {
        key,
        ttl: Some(ttl),
    }) = &stream.delayed_retry
    {
        warnings.push(format!(
            "delayed set `{key}` has a ttl of {}: if no host sweeps it for that long after its latest due retry (every host down, or none running this subscription), Redis deletes the set and every retry in it; without a ttl it never expires",
            human(*ttl)
        ));
    }
    let size = std::fs::metadata(&sub.component).map_or(0, |m| m.len());
    if sub.limits.isolation == Isolation::PerDelivery && size >= 4 << 20 {
        warnings.push(format!(
            "isolation = \"per-delivery\" with a {:.1} MiB component (an interpreter snapshot, as Python and JavaScript components are): every delivery instantiates it anew, which costs milliseconds (hundreds of deliveries per second, see docs/src/benchmarks-journal.md); reused instances cost tens of microseconds",
            size as f64 / (1024.0 * 1024.0)
        ));
    }
    if let Some(maxlen) = sub.dead_letter_maxlen {
        warnings.push(format!(
            "dead_letter_maxlen = {maxlen} trims `{}` on every write: once it holds about {maxlen} entries, the oldest dead letters are deleted for good, unseen",
            stream.dead_letter
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_asks_for_at_most_64_partitions_unless_the_operator_sets_them() {
        let none = sluice_descriptor::Overrides::default();
        assert_eq!(check_component_partitions(&none, 64), Ok(()));
        assert_eq!(check_component_partitions(&none, 1024), Err(1024));
        let operator = sluice_descriptor::Overrides {
            partitions: Some(1024),
            ..Default::default()
        };
        assert_eq!(check_component_partitions(&operator, 1024), Ok(()));
    }
}
