//! One subscription's card on the overview. [`OverviewCard::gather`] asks Redis and this
//! host what the card shows (each probe bounded by [`PROBE_TIMEOUT`], the partitions' at once)
//! into a plain struct; [`render`] writes it: the pause and breaker state with the pause
//! form, the delivery tiles, the canary panel, the flow facts and journal, a row per partition
//! and the handler's versions.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use maud::{Markup, html};
use tokio::time::error::Elapsed;

use super::act::Action;
use super::chrome::sub_link;
use super::fields::value;
use super::{AdminState, Viewer};
use crate::config::{CircuitBreaker, RateLimit};
use crate::control::operate::format_ms;
use crate::control::rollout::canary::CanaryState;
use crate::control::swap::SwapControl;
use crate::handler::Served;
use crate::observe::metrics::SubLabels;
use crate::pipeline::admit::Paused;
use crate::pipeline::admit::breaker::BreakerState;
use crate::pipeline::admit::journal::JournalEntry;
use crate::serve::{AdminSubscription, PROBE_TIMEOUT};
use crate::store::inspect::{RedisFacts, Snapshot};
use crate::store::keys::SubscriptionKeys;
use crate::support::digest::Digest;

/// How many entries of a subscription's flow journal the overview shows.
const JOURNAL_SHOWN: usize = 10;

/// `probe`'s answer within [`PROBE_TIMEOUT`]; `None` when it fails or is late.
pub(super) async fn within<T, E>(probe: impl Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .ok()
        .and_then(Result::ok)
}

/// An epoch-ms time (from Redis) as "N s ago", by this host's clock.
fn ago_ms(ms: i64) -> String {
    let at =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    ago(at)
}

/// How long ago `at` was, in its largest whole unit.
fn ago(at: SystemTime) -> String {
    let secs = crate::support::clock::now()
        .duration_since(at)
        .map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

/// What one subscription's card shows, fetched: its flow state, counts, handler and
/// partitions.
pub(super) struct OverviewCard {
    labels: SubLabels,
    /// The first partition's keys (where the flow forms post); `None` without partitions.
    keys: Option<SubscriptionKeys>,
    /// What `sluice check` warned about its configuration.
    warnings: Vec<String>,
    paused: Option<Paused>,
    /// The circuit breaker, when open or half-open.
    breaker: Option<BreakerState>,
    /// The canary, when the flow hash names one (running, or the last one's verdict).
    canary: Option<CanaryState>,
    /// Deliveries per outcome: acked, retried, dead-lettered, trapped, over a limit.
    outcomes: [u64; 5],
    /// `Some` when `outcomes` are the group's, from Redis (with since when they count);
    /// `None` when they are this host's own.
    counted: Option<Option<u64>>,
    /// The handler version served, since when, and its swaps and refusals.
    digest: Digest,
    since: SystemTime,
    swaps: u64,
    refusals: u64,
    history: Vec<Served>,
    limit: Option<RateLimit>,
    /// Reads of this host that waited on the rate limit.
    waits: u64,
    breaker_config: Option<CircuitBreaker>,
    facts: Option<RedisFacts>,
    /// Pauses, resumes and the breaker's transitions, newest first.
    journal: Vec<JournalEntry>,
    rows: Vec<PartRow>,
    /// Its cron schedules, with their next tick and the last fired (`None`: Redis did not
    /// answer in time).
    schedules: Option<Vec<crate::control::schedules::ScheduleView>>,
    /// What it deduplicates on, and how many duplicates the group skipped (`None`: Redis did
    /// not answer in time).
    dedupe: Option<(sluice_descriptor::Dedupe, Option<u64>)>,
}

/// One partition's row.
struct PartRow {
    keys: SubscriptionKeys,
    stream: String,
    lane: Option<String>,
    /// Its snapshot: `Err(None)` when Redis did not answer in time.
    snapshot: Result<Snapshot, Option<String>>,
    /// Why its read loop cannot read, if it cannot.
    problem: Option<String>,
    /// It orders its entries by a key (its keys page is linked).
    ordered: bool,
}

impl OverviewCard {
    /// Everything the card of `control`'s subscription shows.
    pub(super) async fn gather(state: &AdminState, control: &Arc<SwapControl>) -> Self {
        let slot = control.slot();
        let labels = slot.labels();
        let parts = state.index.parts(&state.subscriptions, labels);
        let own = own_outcomes(state, &parts);
        let rows = futures::future::join_all(parts.iter().copied().map(row)).await;
        let current = slot.current();
        let (swaps, refusals) = slot.counts();
        let first = parts.first().copied();
        let facts = match first {
            Some(first) => {
                within(crate::store::inspect::redis_facts(&mut first.conn.clone())).await
            }
            None => None,
        };
        // The tiles count for the whole group, from Redis (they survive restarts); this host's
        // own counts only when Redis does not answer.
        let group_counts = match first {
            Some(first) => {
                let mut conn = first.conn.clone();
                let read =
                    crate::pipeline::admit::stats::read(&mut conn, &labels.stream, &labels.group);
                within(read).await
            }
            None => None,
        };
        let (outcomes, counted) = match &group_counts {
            Some(g) => (g.counts, Some(g.since_ms)),
            None => (own, None),
        };
        let waits = first.map_or(0, |p| state.metrics.rate_limit_waits(&p.of));
        let (paused, breaker) = first
            .map(|p| {
                let flow = p.flow.borrow();
                (flow.paused.clone(), flow.breaker.clone())
            })
            .unwrap_or_default();
        let journal = journal(first, labels).await;
        let canary = canary(state, first, labels).await;
        let schedules = match first {
            Some(first) => schedules(first).await,
            None => Some(Vec::new()),
        };
        let dedupe = match first {
            Some(first) if first.dedupe.is_some() => dedupe(&parts).await,
            _ => None,
        };
        Self {
            labels: labels.clone(),
            keys: first.map(|p| p.keys()),
            warnings: first.map(|p| p.warnings.clone()).unwrap_or_default(),
            paused,
            breaker,
            canary,
            outcomes,
            counted,
            digest: current.digest.clone(),
            since: current.since,
            swaps,
            refusals,
            history: slot.history(),
            limit: first.and_then(|p| p.rate_limit),
            waits,
            breaker_config: first.and_then(|p| p.circuit_breaker),
            facts,
            journal,
            rows,
            schedules,
            dedupe,
        }
    }
}

/// What the subscription deduplicates on, and the duplicates its group skipped over every
/// partition (`None` in the count when Redis did not answer in time).
async fn dedupe(parts: &[&AdminSubscription]) -> Option<(sluice_descriptor::Dedupe, Option<u64>)> {
    let spec = parts.first()?.dedupe.clone()?;
    let read = async {
        let mut total = 0;
        for part in parts {
            let mut conn = part.conn.clone();
            total += crate::pipeline::dedupe::duplicates_skipped(
                &mut conn,
                &part.labels.stream,
                &part.labels.group,
            )
            .await?;
        }
        Ok::<_, redis::RedisError>(total)
    };
    Some((spec, within(read).await))
}

/// The subscription's schedules as seen now (Redis's clock), within the card's time.
async fn schedules(
    first: &AdminSubscription,
) -> Option<Vec<crate::control::schedules::ScheduleView>> {
    let Some(target) = &first.schedule_target else {
        return Some(Vec::new());
    };
    let mut conn = first.conn.clone();
    let read = async {
        let now = crate::store::inspect::server_now_ms(&mut conn).await?;
        let mut views = Vec::with_capacity(first.schedules.len());
        for schedule in &first.schedules {
            views.push(crate::control::schedules::view(&mut conn, target, schedule, now).await?);
        }
        Ok::<_, redis::RedisError>(views)
    };
    within(read).await
}

/// The deliveries this host counted for the partitions, per outcome.
fn own_outcomes(state: &AdminState, parts: &[&AdminSubscription]) -> [u64; 5] {
    let mut outcomes = [0u64; 5];
    for part in parts {
        for (i, (_, n)) in state.metrics.outcomes(&part.labels).iter().enumerate() {
            outcomes[i] += n;
        }
    }
    outcomes
}

/// One partition's row: its Redis snapshot and its read loop's health.
async fn row(part: &AdminSubscription) -> PartRow {
    let mut conn = part.conn.clone();
    let snapshot = tokio::time::timeout(
        PROBE_TIMEOUT,
        crate::store::inspect::snapshot(
            &mut conn,
            &part.labels.stream,
            &part.labels.group,
            &part.dead_letter,
            part.delayed_key.as_deref(),
            part.lane.as_deref(),
        ),
    )
    .await;
    PartRow {
        ordered: part.ordered.is_some(),
        keys: part.keys(),
        stream: part.labels.stream.clone(),
        lane: part.lane.clone(),
        snapshot: answer(snapshot),
        problem: part.health.problem(),
    }
}

/// A probe's answer, its error, or `Err(None)` when it was late.
fn answer(
    probed: Result<redis::RedisResult<Snapshot>, Elapsed>,
) -> Result<Snapshot, Option<String>> {
    match probed {
        Ok(Ok(snapshot)) => Ok(snapshot),
        Ok(Err(err)) => Err(Some(err.to_string())),
        Err(_) => Err(None),
    }
}

/// The newest [`JOURNAL_SHOWN`] entries of the subscription's flow journal.
async fn journal(first: Option<&AdminSubscription>, labels: &SubLabels) -> Vec<JournalEntry> {
    let Some(first) = first else {
        return Vec::new();
    };
    let mut conn = first.conn.clone();
    within(crate::pipeline::admit::journal::read(
        &mut conn,
        &labels.stream,
        &labels.group,
        JOURNAL_SHOWN,
    ))
    .await
    .unwrap_or_default()
}

/// The canary, when the flow hash names one.
async fn canary(
    state: &AdminState,
    first: Option<&AdminSubscription>,
    labels: &SubLabels,
) -> Option<CanaryState> {
    let has_canary = first.is_some_and(|p| p.flow.borrow().canary.is_some());
    match state
        .rollouts
        .iter()
        .find(|r| r.control().slot().labels() == labels)
    {
        Some(rollout) if has_canary => within(rollout.state()).await,
        _ => None,
    }
}

/// The card: `now_ms` is the Redis server's clock, for the countdowns.
pub(super) fn render(viewer: &Viewer, card: &OverviewCard, now_ms: i64) -> Markup {
    let labels = &card.labels;
    html! {
        div.card {
            (heading(card))
            @if viewer.can_act && let Some(keys) = &card.keys {
                (flow_form(viewer, card, keys))
            }
            @for warning in &card.warnings {
                p.bad { "Warning: " (warning) }
            }
            (tiles(card))
            @if !card.rows.is_empty() {
                (super::rollout::panel(card.canary.as_ref(), viewer, (&labels.stream, &labels.group)))
            }
            (facts(card))
            @if !card.journal.is_empty() {
                (journal_table(&card.journal))
            }
            (parts_table(card, now_ms))
            @if let Some((spec, skipped)) = &card.dedupe {
                p { "Dedupe on " (spec.describe()) ": "
                    @match skipped { Some(n) => { b { (n) } " duplicates skipped by the group" }, None => { "Redis did not answer in time" } }
                    "." }
            }
            (schedules_table(card.schedules.as_deref()))
            (versions(&card.history))
        }
    }
}

/// The subscription's cron schedules: each one's expression, next tick and last fired.
fn schedules_table(views: Option<&[crate::control::schedules::ScheduleView]>) -> Markup {
    let fmt = |ms: Option<i64>| ms.map_or("never".to_owned(), crate::support::when::rfc3339_ms);
    html! {
        @match views {
            None => p.muted { "Schedules: Redis did not answer in time." },
            Some([]) => {},
            Some(views) => {
                h3 { "Schedules" }
                table {
                    tr { th { "name" } th { "cron" } th { "time zone" } th { "next tick" } th { "last fired" } th { "missed" } }
                    @for s in views {
                        tr {
                            td { code { (s.name) } }
                            td { code { (s.cron) } }
                            td { (s.time_zone) }
                            td.nowrap { (fmt(s.next_ms)) }
                            td.nowrap { (fmt(s.last_fired_ms)) }
                            td { (s.missed) }
                        }
                    }
                }
            }
        }
    }
}

/// The card's title with its badges, and what holds it (breaker, pause).
fn heading(card: &OverviewCard) -> Markup {
    let labels = &card.labels;
    let canary_running = card.canary.as_ref().is_some_and(CanaryState::running);
    html! {
        h2 {
            "Stream " code { (labels.stream) } ", group " code { (labels.group) }
            @if canary_running { " " span.badge.warn { "canary" } }
            @if card.paused.is_some() { " " span.badge.warn { "paused" } }
            @if let Some(b) = &card.breaker { " " span.badge.bad { "circuit breaker " (b.name()) } }
        }
        @if let Some(b) = &card.breaker {
            p.paused { "Circuit breaker " (b.describe()) "." }
        }
        @if let Some(p) = &card.paused {
            p.paused {
                "Paused by " b { (p.by) }
                @if p.at_ms != 0 { " at " (p.at()) }
                @if let Some(r) = &p.reason { ": " (r) }
                ". No host of the group takes new entries or due retries until it is resumed; deliveries in flight finish."
            }
        }
    }
}

/// The resume form of a paused subscription, else the pause form.
fn flow_form(viewer: &Viewer, card: &OverviewCard, keys: &SubscriptionKeys) -> Markup {
    let labels = &card.labels;
    let (resume, pause) = (Action::Resume, Action::Pause);
    html! {
        div.flow {
            @if card.paused.is_some() {
                form.inline method="post" action=(sub_link(keys, "act")) data-confirm=[resume.confirm(&labels.stream, &labels.group, 0)] {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input type="hidden" name="action" value=(resume.name());
                    button.primary type="submit" { "Resume" }
                }
            } @else {
                form.inline method="post" action=(sub_link(keys, "act")) data-confirm=[pause.confirm(&labels.stream, &labels.group, 0)] {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input type="hidden" name="action" value=(pause.name());
                    input type="text" name="reason" placeholder="why (optional)" maxlength=(crate::pipeline::admit::MAX_REASON);
                    " "
                    button.danger type="submit" { "Pause" }
                }
            }
        }
    }
}

/// The delivery counts and the handler served.
fn tiles(card: &OverviewCard) -> Markup {
    let outcomes = &card.outcomes;
    html! {
        div.grid {
            div.stat { b { (outcomes[0]) } span { "acked" } }
            div.stat { b { (outcomes[1]) } span { "retried" } }
            div.stat { b { (outcomes[2]) } span { "dead-lettered by the handler" } }
            div.stat { b { (outcomes[3] + outcomes[4]) } span { "failed (trap or limit)" } }
            div.stat { b { code { (card.digest.short()) } } span { "handler, since " (ago(card.since)) } }
            div.stat { b { (card.swaps) " / " (card.refusals) } span { "swaps / refused" } }
        }
    }
}

/// Where the counts come from, the rate limit, the breaker's settings and the Redis.
fn facts(card: &OverviewCard) -> Markup {
    html! {
        p.muted {
            @match card.counted {
                Some(Some(since)) => { "Deliveries counted by every host of the group since " (format_ms(since as i64)) " (kept in Redis)." },
                Some(None) => { "Deliveries counted by every host of the group (kept in Redis): none yet." },
                None => { "Redis did not answer: deliveries counted by this host since it started." },
            }
        }
        p.muted.flow-facts {
            @match card.limit {
                Some(l) => { "Rate limit " b { (l.per_second) "/s" } " for the group (burst " (l.burst) "; " (card.waits) " reads waited on this host). " },
                None => { "No rate limit. " },
            }
            @match card.breaker_config {
                Some(b) => {
                    "Circuit breaker " b { @if let Some(open) = &card.breaker { (open.name()) } @else { "closed" } }
                    " (opens at " (format!("{:.0}", b.failure_rate * 100.0)) "% failed of at least " (b.min_deliveries) " in " (humantime::format_duration(b.window)) "). "
                },
                None => { "No circuit breaker. " },
            }
            @if let Some(f) = &card.facts {
                "Redis " (f.version) " (" (f.role) "), " (bytesize::ByteSize::b(f.used_memory)) " used"
                @if f.maxmemory > 0 { " of " (bytesize::ByteSize::b(f.maxmemory)) " (" (f.maxmemory_policy) ")" }
                ", " (f.clients) " clients."
            }
        }
    }
}

/// The flow journal, folded under its newest entry.
fn journal_table(journal: &[JournalEntry]) -> Markup {
    html! {
        details.journal {
            summary { "Flow journal: " (journal[0].what) " " (ago_ms(journal[0].at_ms)) " (" (journal.len()) " shown)" }
            table {
                tr { th { "when" } th { "what" } th { "by" } th { "detail" } }
                @for j in journal {
                    tr {
                        td.nowrap { (format_ms(j.at_ms)) }
                        td { (j.what) }
                        td { code { (j.by) } }
                        td { (value(&j.detail)) }
                    }
                }
            }
        }
    }
}

/// A row per partition: its state and what waits in it.
fn parts_table(card: &OverviewCard, now_ms: i64) -> Markup {
    html! {
        table {
            tr { th { "stream" } th { "state" } th { "pending" } th { "unread" } th { "parked" } th { "next due" } th { "dead letters" } }
            @for part in &card.rows {
                tr {
                    td { code { (part.stream) } }
                    td {
                        @match &part.problem {
                            None if card.paused.is_some() => span.badge.warn { "paused" },
                            None if card.breaker.is_some() => span.badge.bad { "breaker open" },
                            None => span.badge.ok { "reading" },
                            Some(p) => span.badge.bad title=(p) { "not ready" },
                        }
                    }
                    @match &part.snapshot {
                        Ok(s) => (snapshot_cells(part, s, now_ms)),
                        Err(Some(err)) => td colspan="5" .bad { "Redis: " (err) },
                        Err(None) => td colspan="5" .bad { "Redis did not answer within a second" },
                    }
                }
            }
        }
    }
}

/// A partition's pending, unread, parked, next due and dead letters cells.
fn snapshot_cells(part: &PartRow, s: &Snapshot, now_ms: i64) -> Markup {
    let keys = &part.keys;
    // A retry lane's entries are the subscription's work too.
    let lane_pending = s.lane.as_ref().map_or(0, |g| g.pending);
    let lane_unread = s.lane.as_ref().and_then(|g| g.lag).unwrap_or(0);
    html! {
        td title=[part.lane.as_ref().map(|l| format!("{lane_pending} of them in the retry lane {l}"))] {
            a href=(sub_link(keys, "pending")) { (s.group.as_ref().map_or(0, |g| g.pending) + lane_pending) }
        }
        td title=[part.lane.as_ref().map(|l| format!("{lane_unread} of them in the retry lane {l}"))] {
            (s.group.as_ref().and_then(|g| g.lag).map_or("?".to_owned(), |l| (l + lane_unread).to_string()))
        }
        td {
            @match &s.delayed {
                Some(d) => {
                    a href=(sub_link(keys, "parked")) { (d.parked) }
                    @if part.ordered { " · " a href=(sub_link(keys, "keys")) title="ordered keys that wait" { "keys" } }
                },
                None => span.muted { "no set" },
            }
        }
        td {
            @match s.delayed.as_ref().and_then(|d| d.next_due_ms) {
                Some(due) => span data-due=(due) data-now=(now_ms) { (format_ms(due)) },
                None => span.muted { "-" },
            }
        }
        td { a href=(sub_link(keys, "dead-letters")) { (s.dead_letters) } }
    }
}

/// The handler's versions, newest first, folded.
fn versions(history: &[Served]) -> Markup {
    html! {
        details {
            summary.muted { "Handler versions" }
            table {
                tr { th { "when" } th { "what" } th { "sha256" } }
                @for served in history.iter().rev() {
                    tr {
                        td { (crate::serve::rfc3339(served.at)) }
                        td { (served.how) }
                        td { code { (served.digest.to_string()) } }
                    }
                }
            }
        }
    }
}
