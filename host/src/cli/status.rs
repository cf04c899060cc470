//! `sluice status`: what each subscription has in Redis right now.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::redis_url_for;
use crate::store::inspect;

/// One subscription's state, as `sluice status` reports it.
#[derive(Debug, serde::Serialize)]
struct SubscriptionStatus {
    stream: String,
    /// Set on a partitioned subscription: which partition of which stream this row is.
    partition: Option<Partition>,
    group: String,
    handler_digest: crate::support::digest::Digest,
    group_exists: bool,
    pending: u64,
    lag: Option<u64>,
    last_delivered_id: Option<String>,
    consumers: Vec<ConsumerStatus>,
    delayed_key: Option<String>,
    /// The retry lane (`retry_lane = true`): its key, and the group's pending and unread
    /// entries there.
    lane: Option<LaneStatus>,
    parked: Option<u64>,
    next_due_ms: Option<i64>,
    next_due_in_ms: Option<i64>,
    dead_letter: String,
    dead_letter_length: u64,
    /// The stream's length, memory and oldest entry.
    size: inspect::StreamSize,
    /// The age of the oldest entry, by the server's clock.
    oldest_age_ms: Option<i64>,
    /// What retention's last run did (`None`: it never ran).
    retention: Option<std::collections::HashMap<String, String>>,
    /// Who paused the subscription, when and why (`None`: it reads).
    paused: Option<crate::pipeline::admit::Paused>,
    /// The circuit breaker, when open or half-open: one line.
    breaker: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct LaneStatus {
    key: String,
    pending: u64,
    lag: Option<u64>,
}

#[derive(Debug, serde::Serialize)]
struct Partition {
    of: String,
    index: u32,
    count: u32,
}

#[derive(Debug, serde::Serialize)]
struct ConsumerStatus {
    name: String,
    pending: u64,
    idle_ms: u64,
    /// Holds pending entries and has been idle long enough that a live host takes them over.
    gone: bool,
}

/// What `sluice status` shows and how long it may take.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// One JSON object per subscription, one per line (every row, whatever `all` says).
    pub json: bool,
    /// Every subscription, even with more than [`SHOW_ALL_UP_TO`] and nothing to see.
    pub all: bool,
    /// Only streams whose name contains this.
    pub stream: Option<String>,
    /// The longest the whole report may take; what has not answered by then is named.
    pub timeout: std::time::Duration,
}

/// Up to this many rows, the text shows every one; above, the summary and the rows with
/// something to see (unless `--all`).
pub const SHOW_ALL_UP_TO: usize = 20;
/// Rows asked for at once: their commands share each Redis's connection, pipelined.
const AT_ONCE: usize = 32;

/// What `sluice status` came to: the report, and how many rows Redis did not answer (the
/// command fails then, after printing what it has).
#[derive(Debug)]
pub struct StatusReport {
    /// The text (or JSON lines) to print.
    pub text: String,
    /// Rows that could not be read, each named in the text.
    pub failed: usize,
}

/// `sluice status`: for each subscription, the group's consumers and pending counts, parked
/// entries and the next due time, the dead-letter stream's length and the handler's digest;
/// with many, a summary first and the ones with something to see.
pub async fn status(
    paths: &[PathBuf],
    redis: Option<&str>,
    options: &StatusOptions,
) -> Result<StatusReport> {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + options.timeout;
    // Each Redis is asked first, once, under the deadline (and before anything is compiled):
    // one that does not answer has its rows named NOT READ, and the others are shown.
    let config = super::load(paths)?;
    // All at once, each for at most half the deadline: the rows get the rest.
    let connect_by = tokio::time::Instant::now() + options.timeout / 2;
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
    let handles: Vec<(
        String,
        crate::config::RedisAccess,
        Result<crate::store::redis_conn::RedisHandle, String>,
    )> = futures::future::join_all(targets.into_iter().map(|(url, access)| async move {
        let connected = match tokio::time::timeout_at(
            connect_by,
            crate::store::redis_conn::RedisHandle::connect(&url, &access),
        )
        .await
        {
            Ok(Ok(handle)) => Ok(handle),
            Ok(Err(err)) => Err(format!("{:#}", anyhow::Error::from(err))),
            Err(_) => Err(format!(
                "no answer from Redis at {} within {:?}",
                crate::store::redis_conn::redact(&url),
                options.timeout / 2
            )),
        };
        (url, access, connected)
    }))
    .await;
    if let Some((_, _, Err(first))) = handles.first()
        && handles.iter().all(|(_, _, h)| h.is_err())
    {
        anyhow::bail!("{first}");
    }
    let plan = super::plan_of(&config, redis, true).await?;
    let mut asks = Vec::new();
    let mut names = Vec::new();
    let mut unreachable: Vec<Row> = Vec::new();
    for sub in &plan.subscriptions {
        let parts = sub.stream.partitioned();
        let wanted = |s: &sluice_descriptor::ResolvedStream| {
            options
                .stream
                .as_deref()
                .is_none_or(|want| s.stream.contains(want))
        };
        if !parts.iter().any(wanted) {
            continue;
        }
        let url = redis_url_for(sub.redis.as_deref())?;
        let conn = handles
            .iter()
            .find(|(u, a, _)| *u == url && *a == sub.redis_access)
            .map(|(_, _, h)| h.clone());
        for (index, part) in parts.iter().enumerate() {
            if !wanted(part) {
                continue;
            }
            let conn = match &conn {
                Some(Ok(conn)) => conn.clone(),
                Some(Err(why)) => {
                    unreachable.push(Err((
                        (part.stream.clone(), part.group.clone()),
                        why.clone(),
                    )));
                    continue;
                }
                None => {
                    unreachable.push(Err((
                        (part.stream.clone(), part.group.clone()),
                        format!(
                            "no connection to {}",
                            crate::store::redis_conn::redact(&url)
                        ),
                    )));
                    continue;
                }
            };
            let partition = (sub.stream.partitions > 1).then(|| Partition {
                of: sub.stream.stream.clone(),
                index: index as u32,
                count: sub.stream.partitions,
            });
            names.push((part.stream.clone(), part.group.clone()));
            asks.push((conn, sub, part.clone(), partition));
        }
    }
    let asked = asks.len() + unreachable.len();
    let mut answers: Vec<Option<Row>> = (0..asks.len()).map(|_| None).collect();
    let mut answering = futures::stream::iter(asks.into_iter().enumerate())
        .map(|(i, (mut conn, sub, part, partition))| async move {
            let who = (part.stream.clone(), part.group.clone());
            let row = partition_status(&mut conn, sub, &part, partition).await;
            (i, who, row)
        })
        .buffer_unordered(AT_ONCE);
    while let Ok(Some((i, who, row))) = tokio::time::timeout_at(deadline, answering.next()).await {
        answers[i] = Some(row.map_err(|err| (who, format!("{err:#}"))));
    }
    drop(answering);
    // Rows not reached before the deadline, named by what they would have read.
    let mut rows = unreachable;
    let mut unanswered = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        match answer {
            Some(row) => rows.push(row),
            None => unanswered.push(names[i].clone()),
        }
    }
    render(&rows, &unanswered, asked, options)
}

/// A row, or what it would have read and why it could not.
type Row = Result<SubscriptionStatus, ((String, String), String)>;

/// One partition's row (the subscription's, when it has one partition).
async fn partition_status(
    conn: &mut crate::store::redis_conn::RedisHandle,
    sub: &crate::service::plan::SubscriptionPlan,
    s: &sluice_descriptor::ResolvedStream,
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
    })
}

/// Whether a row has something an operator should look at, beyond the work it is doing
/// (pending and unread entries, parked retries not yet due).
fn needs_look(r: &SubscriptionStatus) -> bool {
    /// A retry overdue by more than this is not just waiting for its sweep.
    const OVERDUE_MS: i64 = 60_000;
    !r.group_exists
        || r.paused.is_some()
        || r.breaker.is_some()
        || r.dead_letter_length > 0
        || r.consumers.iter().any(|c| c.gone)
        || r.next_due_in_ms.is_some_and(|ms| ms < -OVERDUE_MS)
}

/// The rows as `sluice status` prints them: one JSON object per line, or text (with many, a
/// summary first and only the rows with something to see, unless `--all`).
fn render(
    rows: &[Row],
    unanswered: &[(String, String)],
    asked: usize,
    options: &StatusOptions,
) -> Result<StatusReport> {
    use std::fmt::Write as _;
    let failed = rows.iter().filter(|r| r.is_err()).count() + unanswered.len();
    let mut out = String::new();
    let cannot = |out: &mut String, (stream, group): &(String, String), why: &str| {
        let _ = writeln!(out, "stream `{stream}`, group `{group}`: NOT READ: {why}");
    };
    let late = format!("no answer within {:?}", options.timeout);
    if options.json {
        for row in rows {
            match row {
                Ok(row) => out.push_str(&serde_json::to_string(row)?),
                Err(((stream, group), why)) => out.push_str(&serde_json::to_string(
                    &serde_json::json!({"stream": stream, "group": group, "error": why}),
                )?),
            }
            out.push('\n');
        }
        for (stream, group) in unanswered {
            out.push_str(&serde_json::to_string(
                &serde_json::json!({"stream": stream, "group": group, "error": late}),
            )?);
            out.push('\n');
        }
        return Ok(StatusReport { text: out, failed });
    }
    let read: Vec<&SubscriptionStatus> = rows.iter().filter_map(|r| r.as_ref().ok()).collect();
    let every = options.all || asked <= SHOW_ALL_UP_TO;
    if asked > 1 {
        let count = |f: &dyn Fn(&SubscriptionStatus) -> bool| read.iter().filter(|r| f(r)).count();
        let looks = count(&needs_look);
        let _ = writeln!(
            out,
            "{asked} subscription rows{}: {} with pending entries, {} with unread entries, {} with parked retries, {} with dead letters, {} with gone consumers, {} paused, {} with the circuit breaker open, {} groups not created yet{}",
            options
                .stream
                .as_deref()
                .map_or(String::new(), |s| format!(" (streams containing `{s}`)")),
            count(&|r| r.pending > 0),
            count(&|r| r.lag.is_some_and(|l| l > 0)),
            count(&|r| r.parked.is_some_and(|p| p > 0)),
            count(&|r| r.dead_letter_length > 0),
            count(&|r| r.consumers.iter().any(|c| c.gone)),
            count(&|r| r.paused.is_some()),
            count(&|r| r.breaker.is_some()),
            count(&|r| !r.group_exists),
            if failed > 0 {
                format!("; {failed} NOT READ")
            } else {
                String::new()
            },
        );
        if !every {
            let _ = writeln!(
                out,
                "showing the {} with something to see (dead letters, gone consumers, a pause, an open breaker, overdue retries, no group) and those not read; --all shows every one",
                looks
            );
        }
        let _ = writeln!(out);
    }
    for row in rows {
        if let Err((who, why)) = row {
            cannot(&mut out, who, why);
        }
    }
    for who in unanswered {
        cannot(&mut out, who, &late);
    }
    let rows: Vec<&SubscriptionStatus> = read
        .into_iter()
        .filter(|r| every || needs_look(r))
        .collect();
    for r in rows {
        let part = r.partition.as_ref().map_or(String::new(), |p| {
            format!(" (partition {} of {} of `{}`)", p.index, p.count, p.of)
        });
        let _ = writeln!(
            out,
            "stream `{}`{part}, group `{}` (handler sha256 {})",
            r.stream,
            r.group,
            r.handler_digest.short()
        );
        if let Some(paused) = &r.paused {
            let _ = writeln!(
                out,
                "  PAUSED: {}; no host reads it until `sluice resume`",
                paused.describe()
            );
        }
        if let Some(breaker) = &r.breaker {
            let _ = writeln!(out, "  CIRCUIT BREAKER {breaker}");
        }
        if !r.group_exists {
            let _ = writeln!(
                out,
                "  group does not exist yet (created when a host starts)"
            );
        }
        let lag = r.lag.map_or("unknown".to_owned(), |l| l.to_string());
        let _ = writeln!(
            out,
            "  pending {}, unread {lag}, last delivered {}",
            r.pending,
            r.last_delivered_id.as_deref().unwrap_or("-")
        );
        for c in &r.consumers {
            let _ = writeln!(
                out,
                "  consumer {:<28} pending {:>6}  idle {:.1}s{}",
                c.name,
                c.pending,
                c.idle_ms as f64 / 1000.0,
                if c.gone {
                    "  GONE: holds pending entries; a running host takes them over"
                } else {
                    ""
                }
            );
        }
        match (&r.delayed_key, r.parked) {
            (Some(key), Some(parked)) => {
                let next = r.next_due_in_ms.map_or("none".to_owned(), |ms| {
                    if ms <= 0 {
                        "due now".to_owned()
                    } else {
                        format!("in {:.1}s", ms as f64 / 1000.0)
                    }
                });
                let _ = writeln!(out, "  parked {parked} in `{key}`, next due {next}");
                if let Some(lane) = &r.lane {
                    let unread = lane.lag.map_or("?".to_owned(), |l| l.to_string());
                    let _ = writeln!(
                        out,
                        "  retry lane `{}`: {} pending, {unread} due retries not yet read",
                        lane.key, lane.pending
                    );
                }
            }
            _ => {
                let _ = writeln!(out, "  no delayed-retry set");
            }
        }
        let _ = writeln!(
            out,
            "  dead letters {} in `{}`",
            r.dead_letter_length, r.dead_letter
        );
        let _ = writeln!(
            out,
            "  stream {} entries, {} bytes, oldest {}",
            r.size.length,
            r.size.bytes,
            r.oldest_age_ms.map_or("-".to_owned(), |ms| format!(
                "{:.0}s old",
                ms as f64 / 1000.0
            ))
        );
        if let Some(last) = &r.retention {
            let get = |k: &str| last.get(k).map_or("?", String::as_str);
            let _ = writeln!(
                out,
                "  retention last ran at {} ({}): trimmed {} below {}{}",
                get("at_ms")
                    .parse::<i64>()
                    .map(super::format_ms)
                    .unwrap_or_default(),
                get("holder"),
                get("trimmed"),
                get("threshold"),
                if get("blocked") == "1" {
                    "; over max_len, but groups still need the rest"
                } else {
                    ""
                }
            );
        }
    }
    Ok(StatusReport { text: out, failed })
}
