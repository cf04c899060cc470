//! What `sluice status` reads: each subscription partition's row, from its Redis. Every Redis
//! is asked at once, the rows a few dozen at a time, all under the command's deadline; what
//! does not answer in time is named, not waited for.

use anyhow::{Context as _, Result};
use sluice_descriptor::ResolvedStream;

use crate::cli::redis_url_for;
use crate::service::plan::SubscriptionPlan;
use crate::store::inspect;
use crate::store::redis_conn::RedisHandle;

/// One subscription's state, as `sluice status` reports it.
#[derive(Debug, serde::Serialize)]
pub(super) struct SubscriptionStatus {
    pub(super) stream: String,
    /// Set on a partitioned subscription: which partition of which stream this row is.
    pub(super) partition: Option<Partition>,
    pub(super) group: String,
    pub(super) handler_digest: crate::support::digest::Digest,
    pub(super) group_exists: bool,
    pub(super) pending: u64,
    pub(super) lag: Option<u64>,
    pub(super) last_delivered_id: Option<String>,
    pub(super) consumers: Vec<ConsumerStatus>,
    pub(super) delayed_key: Option<String>,
    /// The retry lane (`retry_lane = true`): its key, and the group's pending and unread
    /// entries there.
    pub(super) lane: Option<LaneStatus>,
    pub(super) parked: Option<u64>,
    pub(super) next_due_ms: Option<i64>,
    pub(super) next_due_in_ms: Option<i64>,
    pub(super) dead_letter: String,
    pub(super) dead_letter_length: u64,
    /// The stream's length, memory and oldest entry.
    pub(super) size: inspect::StreamSize,
    /// The age of the oldest entry, by the server's clock.
    pub(super) oldest_age_ms: Option<i64>,
    /// What retention's last run did (`None`: it never ran).
    pub(super) retention: Option<std::collections::HashMap<String, String>>,
    /// Who paused the subscription, when and why (`None`: it reads).
    pub(super) paused: Option<crate::pipeline::admit::Paused>,
    /// The circuit breaker, when open or half-open: one line.
    pub(super) breaker: Option<String>,
    /// Its cron schedules (on a subscription's first partition).
    pub(super) schedules: Vec<crate::control::schedules::ScheduleView>,
}

/// A group's retry lane.
#[derive(Debug, serde::Serialize)]
pub(super) struct LaneStatus {
    pub(super) key: String,
    pub(super) pending: u64,
    pub(super) lag: Option<u64>,
}

/// Which partition of which stream a row is.
#[derive(Debug, serde::Serialize)]
pub(super) struct Partition {
    pub(super) of: String,
    pub(super) index: u32,
    pub(super) count: u32,
}

/// One consumer of the group.
#[derive(Debug, serde::Serialize)]
pub(super) struct ConsumerStatus {
    pub(super) name: String,
    pub(super) pending: u64,
    pub(super) idle_ms: u64,
    /// Holds pending entries and has been idle long enough that a live host takes them over.
    pub(super) gone: bool,
}

/// Rows asked for at once: their commands share each Redis's connection, pipelined.
const AT_ONCE: usize = 32;

/// One Redis the configuration names, and the connection to it (or why there is none).
pub(super) struct Connection {
    url: String,
    access: crate::config::RedisAccess,
    handle: Result<RedisHandle, String>,
}

/// A connection to each Redis of `config` (`redis` replacing every URL), all at once, each
/// given at most half of `timeout` (the rows get the rest); an error only when none answers.
pub(super) async fn connect_all(
    config: &crate::config::Config,
    redis: Option<&str>,
    timeout: std::time::Duration,
) -> Result<Vec<Connection>> {
    let connect_by = tokio::time::Instant::now() + timeout / 2;
    let mut targets: Vec<(String, crate::config::RedisAccess)> = Vec::new();
    for sub in &config.subscriptions {
        let url = redis_url_for(redis.or(sub.redis.as_deref()))?;
        if !targets
            .iter()
            .any(|(u, a)| *u == url && *a == sub.redis_access)
        {
            targets.push((url, sub.redis_access.clone()));
        }
    }
    let connections: Vec<Connection> =
        futures::future::join_all(targets.into_iter().map(|(url, access)| async move {
            let handle = match tokio::time::timeout_at(
                connect_by,
                RedisHandle::connect(&url, &access),
            )
            .await
            {
                Ok(Ok(handle)) => Ok(handle),
                Ok(Err(err)) => Err(format!("{:#}", anyhow::Error::from(err))),
                Err(_) => Err(format!(
                    "no answer from Redis at {} within {:?}",
                    crate::store::redis_conn::redact(&url),
                    timeout / 2
                )),
            };
            Connection {
                url,
                access,
                handle,
            }
        }))
        .await;
    if let Some(Connection {
        handle: Err(first), ..
    }) = connections.first()
        && connections.iter().all(|c| c.handle.is_err())
    {
        anyhow::bail!("{first}");
    }
    Ok(connections)
}

/// A row to read: its connection, its subscription, the partition's stream, and which
/// partition it is.
pub(super) type Ask<'a> = (
    RedisHandle,
    &'a SubscriptionPlan,
    ResolvedStream,
    Option<Partition>,
);

/// The rows of `plan` that `stream` (a part of a name, if given) selects, each with its
/// connection; a row whose Redis did not answer is already a NOT READ row.
pub(super) fn rows_to_ask<'a>(
    plan: &'a crate::service::plan::Plan,
    connections: &[Connection],
    stream: Option<&str>,
) -> Result<(Vec<Ask<'a>>, Vec<Row>)> {
    let mut asks = Vec::new();
    let mut unreachable: Vec<Row> = Vec::new();
    let wanted = |s: &ResolvedStream| stream.is_none_or(|want| s.stream.contains(want));
    for sub in &plan.subscriptions {
        let parts = sub.stream.partitioned();
        if !parts.iter().any(wanted) {
            continue;
        }
        let url = redis_url_for(sub.redis.as_deref())?;
        let conn = connections
            .iter()
            .find(|c| c.url == url && c.access == sub.redis_access)
            .map(|c| &c.handle);
        for (index, part) in parts.iter().enumerate() {
            if !wanted(part) {
                continue;
            }
            let who = (part.stream.clone(), part.group.clone());
            let conn = match conn {
                Some(Ok(conn)) => conn.clone(),
                Some(Err(why)) => {
                    unreachable.push(Err((who, why.clone())));
                    continue;
                }
                None => {
                    let why = format!(
                        "no connection to {}",
                        crate::store::redis_conn::redact(&url)
                    );
                    unreachable.push(Err((who, why)));
                    continue;
                }
            };
            let partition = (sub.stream.partitions > 1).then(|| Partition {
                of: sub.stream.stream.clone(),
                index: index as u32,
                count: sub.stream.partitions,
            });
            asks.push((conn, sub, part.clone(), partition));
        }
    }
    Ok((asks, unreachable))
}

/// Read every row, [`AT_ONCE`] at a time, until `deadline`: the rows read (or failed), in
/// order, and those not answered by then, named by what they would have read.
pub(super) async fn ask_all(
    asks: Vec<Ask<'_>>,
    deadline: tokio::time::Instant,
) -> (Vec<Row>, Vec<(String, String)>) {
    use futures::StreamExt;
    let names: Vec<(String, String)> = asks
        .iter()
        .map(|(_, _, part, _)| (part.stream.clone(), part.group.clone()))
        .collect();
    let mut answers: Vec<Option<Row>> = (0..asks.len()).map(|_| None).collect();
    let mut answering = futures::stream::iter(asks.into_iter().enumerate())
        .map(|(i, (mut conn, sub, part, partition))| async move {
            (i, partition_status(&mut conn, sub, &part, partition).await)
        })
        .buffer_unordered(AT_ONCE);
    while let Ok(Some((i, row))) = tokio::time::timeout_at(deadline, answering.next()).await {
        answers[i] = Some(row.map_err(|err| (names[i].clone(), format!("{err:#}"))));
    }
    drop(answering);
    let mut rows = Vec::new();
    let mut unanswered = Vec::new();
    for (answer, name) in answers.into_iter().zip(names) {
        match answer {
            Some(row) => rows.push(row),
            None => unanswered.push(name),
        }
    }
    (rows, unanswered)
}

/// A row, or what it would have read and why it could not.
pub(super) type Row = Result<SubscriptionStatus, ((String, String), String)>;

/// One partition's row (the subscription's, when it has one partition).
async fn partition_status(
    conn: &mut RedisHandle,
    sub: &SubscriptionPlan,
    s: &ResolvedStream,
    partition: Option<Partition>,
) -> Result<SubscriptionStatus> {
    let delayed_key = s.delayed_retry.as_ref().map(|d| d.key().to_owned());
    let lane_key = delayed_key
        .as_deref()
        .filter(|_| sub.retry_lane)
        .map(crate::store::keys::lane_key);
    let snapshot = inspect::snapshot(
        conn,
        &s.stream,
        &s.group,
        &s.dead_letter,
        delayed_key.as_deref(),
        lane_key.as_deref(),
    )
    .await
    .with_context(|| format!("cannot read the state of stream `{}`", s.stream))?;
    let group = snapshot.group;
    let consumers = if group.is_some() {
        inspect::consumers(conn, &s.stream, &s.group)
            .await
            .with_context(|| format!("XINFO CONSUMERS {} {}", s.stream, s.group))?
    } else {
        Vec::new()
    };
    // Gone: idle past the time after which a live host takes its entries over.
    let gone_after = sub.consumer_gone_after.or(s.claim_min_idle);
    let now_ms = inspect::server_now_ms(conn).await?;
    let size = inspect::stream_size(conn, &s.stream).await?;
    let retention = inspect::retention_record(conn, &s.stream).await?;
    let flow = crate::pipeline::admit::read(conn, &sub.stream.stream, &sub.stream.group)
        .await
        .with_context(|| format!("cannot read whether stream `{}` is paused", s.stream))?;
    let paused = flow.paused;
    let breaker = flow.breaker.map(|b| b.describe());
    let mut schedules = Vec::new();
    if let Some(target) = crate::control::schedules::target_of(&sub.stream, s) {
        for schedule in &sub.schedules {
            schedules.push(
                crate::control::schedules::view(conn, &target, schedule, now_ms)
                    .await
                    .with_context(|| format!("cannot read schedule `{}`", schedule.name))?,
            );
        }
    }
    let next_due_ms = snapshot.delayed.and_then(|d| d.next_due_ms);
    let lane = lane_key.map(|key| LaneStatus {
        pending: snapshot.lane.as_ref().map_or(0, |g| g.pending as u64),
        lag: snapshot.lane.as_ref().and_then(|g| g.lag).map(|l| l as u64),
        key,
    });
    Ok(SubscriptionStatus {
        stream: s.stream.clone(),
        partition,
        group: s.group.clone(),
        handler_digest: sub.component.digest().clone(),
        group_exists: group.is_some(),
        pending: group.as_ref().map_or(0, |g| g.pending as u64),
        lag: group.as_ref().and_then(|g| g.lag).map(|l| l as u64),
        last_delivered_id: group.as_ref().map(|g| g.last_delivered_id.clone()),
        consumers: consumers
            .into_iter()
            .map(|c| ConsumerStatus {
                gone: c.pending > 0 && gone_after.is_some_and(|g| c.idle as u128 >= g.as_millis()),
                name: c.name,
                pending: c.pending as u64,
                idle_ms: c.idle as u64,
            })
            .collect(),
        delayed_key,
        lane,
        parked: snapshot.delayed.map(|d| d.parked),
        next_due_ms,
        next_due_in_ms: next_due_ms.map(|due| due - now_ms),
        dead_letter: s.dead_letter.clone(),
        dead_letter_length: snapshot.dead_letters,
        oldest_age_ms: size.oldest_ms.map(|oldest| now_ms - oldest),
        size,
        retention,
        paused,
        breaker,
        schedules,
    })
}
