//! The page's HTML. maud escapes every interpolated value; nothing here writes raw HTML but
//! the static layout.

use maud::{Markup, html};

use super::chrome::{flash, layout, segment, sub_link};
use super::{AdminState, Viewer};
use crate::control::operate::dead_letters::DeadLetter;
use crate::control::operate::parked::Parked;
use crate::control::operate::{Page, format_ms, printable};
use crate::serve::Sample;
use crate::serve::listing::{self, ListQuery};
use crate::store::keys::SubscriptionKeys;

/// How many entries of a subscription's flow journal the overview shows.
const JOURNAL_SHOWN: usize = 10;

/// An epoch-ms time (from Redis) as "N s ago", by this host's clock.
fn ago_ms(ms: i64) -> String {
    let at =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    ago(at)
}

fn ago(at: std::time::SystemTime) -> String {
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

/// Every subscription: handler version and history, outcomes, and per partition what waits.
/// How many subscriptions the overview shows at once.
pub(super) const OVERVIEW_CARDS: usize = 20;

/// Whether a subscription has something to see without asking Redis: a partition that cannot
/// read, a pause, a breaker not closed, a canary. The overview shows these first.
fn needs_look(state: &AdminState, labels: &crate::observe::metrics::SubLabels) -> bool {
    let parts = state.index.parts(&state.subscriptions, labels);
    parts.iter().any(|p| p.health.problem().is_some())
        || parts.first().is_some_and(|p| {
            let flow = p.flow.borrow();
            flow.paused.is_some() || flow.breaker.is_some() || flow.canary.is_some()
        })
}

/// The overview's search box, totals and page links.
fn overview_nav(query: &ListQuery, page: &listing::Page, looks: usize) -> Markup {
    let q = query.q.clone().unwrap_or_default();
    let link = |offset: usize| {
        let mut params = form_urlencoded::Serializer::new(String::new());
        if !q.is_empty() {
            params.append_pair("q", &q);
        }
        params.append_pair("offset", &offset.to_string());
        format!("/ui/?{}", params.finish())
    };
    let end = page.offset + page.shown.len();
    html! {
        div.card {
            p {
                b { (page.total) } " subscriptions on this host"
                @if looks > 0 { ", " b.bad { (looks) } " with something to see (they come first)" }
                "."
                @if page.matched != page.total { " " (page.matched) " match." }
            }
            form method="get" action="/ui/" {
                input type="search" name="q" value=(q) placeholder="stream or group contains" maxlength=(listing::MAX_QUERY);
                " " button type="submit" { "Find" }
            }
            @if page.matched > page.shown.len() {
                p {
                    "Showing " (page.offset + usize::from(end > page.offset)) "–" (end) " of " (page.matched) ". "
                    @if page.offset > 0 {
                        a href=(link(page.offset.saturating_sub(OVERVIEW_CARDS))) { "← previous" } " "
                    }
                    @if end < page.matched {
                        a href=(link(end)) { "next →" }
                    }
                }
            }
        }
    }
}

pub(super) async fn overview(
    state: &AdminState,
    viewer: &Viewer,
    done: Option<&str>,
    query: &ListQuery,
) -> Markup {
    let look = |labels: &crate::observe::metrics::SubLabels| needs_look(state, labels);
    let page = listing::page(&state.swaps, query, OVERVIEW_CARDS, Some(&look));
    let looks = state
        .swaps
        .iter()
        .filter(|c| {
            let labels = c.slot().labels();
            query.matches(labels) && needs_look(state, labels)
        })
        .count();
    // One server clock reading for the page's countdowns.
    let now_ms = match state.subscriptions.first() {
        Some(sub) => tokio::time::timeout(
            super::super::PROBE_TIMEOUT,
            crate::store::inspect::server_now_ms(&mut sub.conn.clone()),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0),
        None => 0,
    };
    // The cards' probes at once: a Redis that does not answer costs the page one probe's
    // timeout, not one per card.
    let cards: Vec<Markup> = futures::future::join_all(
        page.shown
            .iter()
            .map(|control| overview_card(state, viewer, control, now_ms)),
    )
    .await;
    let samples = state
        .samples
        .lock()
        .map(|s| s.iter().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    layout(
        "Overview",
        Some(viewer),
        html! {
            h1 { "Overview" }
            (flash(done))
            div.card {
                h2 { "Deliveries per second, last 10 minutes" }
                (chart(&samples))
            }
            (overview_nav(query, &page, looks))
            @for card in cards { (card) }
        },
    )
}

/// One subscription's card on the overview: its Redis probes (each bounded by
/// `PROBE_TIMEOUT`) run together.
async fn overview_card(
    state: &AdminState,
    viewer: &Viewer,
    control: &std::sync::Arc<crate::serve::SwapControl>,
    now_ms: i64,
) -> Markup {
    let slot = control.slot();
    let labels = slot.labels();
    let parts = state.index.parts(&state.subscriptions, labels);
    let mut outcomes = [0u64; 5];
    for part in &parts {
        for (i, (_, n)) in state.metrics.outcomes(&part.labels).iter().enumerate() {
            outcomes[i] += n;
        }
    }
    let rows = futures::future::join_all(parts.iter().map(|part| async move {
        let mut conn = part.conn.clone();
        let snapshot = tokio::time::timeout(
            super::super::PROBE_TIMEOUT,
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
        (part, snapshot, part.health.problem())
    }))
    .await;
    let current = slot.current();
    let (swaps, refusals) = slot.counts();
    let facts = match parts.first() {
        Some(first) => tokio::time::timeout(
            super::super::PROBE_TIMEOUT,
            crate::store::inspect::redis_facts(&mut first.conn.clone()),
        )
        .await
        .ok()
        .and_then(Result::ok),
        None => None,
    };
    let (limit, breaker_config) = parts
        .first()
        .map(|p| (p.rate_limit, p.circuit_breaker))
        .unwrap_or_default();
    // The tiles count for the whole group, from Redis (they survive restarts); this host's
    // own counts only when Redis does not answer.
    let group_counts = match parts.first() {
        Some(first) => tokio::time::timeout(
            super::super::PROBE_TIMEOUT,
            crate::pipeline::admit::stats::read(
                &mut first.conn.clone(),
                &labels.stream,
                &labels.group,
            ),
        )
        .await
        .ok()
        .and_then(Result::ok),
        None => None,
    };
    let (outcomes, counted) = match &group_counts {
        Some(g) => (g.counts, Some(g.since_ms)),
        None => (outcomes, None),
    };
    let waits: u64 = parts
        .first()
        .map(|p| state.metrics.rate_limit_waits(&p.of))
        .unwrap_or(0);
    let (paused, breaker) = parts
        .first()
        .map(|p| {
            let flow = p.flow.borrow();
            (flow.paused.clone(), flow.breaker.clone())
        })
        .unwrap_or_default();
    // Pauses, resumes and the breaker's transitions, newest first.
    let journal = match parts.first() {
        Some(first) => tokio::time::timeout(
            super::super::PROBE_TIMEOUT,
            crate::pipeline::admit::journal::read(
                &mut first.conn.clone(),
                &labels.stream,
                &labels.group,
                JOURNAL_SHOWN,
            ),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default(),
        None => Vec::new(),
    };
    // The canary, when the flow hash names one (running, or the last one's verdict).
    let has_canary = parts
        .first()
        .is_some_and(|p| p.flow.borrow().canary.is_some());
    let canary = match state
        .rollouts
        .iter()
        .find(|r| r.control().slot().labels() == labels)
    {
        Some(rollout) if has_canary => {
            tokio::time::timeout(super::super::PROBE_TIMEOUT, rollout.state())
                .await
                .ok()
                .and_then(Result::ok)
        }
        _ => None,
    };
    let canary_running = canary
        .as_ref()
        .is_some_and(crate::control::rollout::canary::CanaryState::running);
    html! {
        div.card {
            h2 {
                "Stream " code { (labels.stream) } ", group " code { (labels.group) }
                @if canary_running { " " span.badge.warn { "canary" } }
                @if paused.is_some() { " " span.badge.warn { "paused" } }
                @if let Some(b) = &breaker { " " span.badge.bad { "circuit breaker " (b.name()) } }
            }
            @if let Some(b) = &breaker {
                p.paused { "Circuit breaker " (b.describe()) "." }
            }
            @if let Some(p) = &paused {
                p.paused {
                    "Paused by " b { (p.by) }
                    @if p.at_ms != 0 { " at " (p.at()) }
                    @if let Some(r) = &p.reason { ": " (r) }
                    ". No host of the group takes new entries or due retries until it is resumed; deliveries in flight finish."
                }
            }
            @if viewer.can_act && let Some(first) = parts.first() {
                @let keys = first.keys();
                div.flow {
                    @if paused.is_some() {
                        form.inline method="post" action=(sub_link(&keys, "act")) data-confirm=(format!("Resume stream {} group {} on every host?", labels.stream, labels.group)) {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            input type="hidden" name="action" value="resume";
                            button.primary type="submit" { "Resume" }
                        }
                    } @else {
                        form.inline method="post" action=(sub_link(&keys, "act")) data-confirm=(format!("Pause stream {} group {} on every host? Deliveries in flight finish; nothing new is read until it is resumed.", labels.stream, labels.group)) {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            input type="hidden" name="action" value="pause";
                            input type="text" name="reason" placeholder="why (optional)" maxlength=(crate::pipeline::admit::MAX_REASON);
                            " "
                            button.danger type="submit" { "Pause" }
                        }
                    }
                }
            }
            @if let Some(first) = parts.first() {
                @for warning in &first.warnings {
                    p.bad { "Warning: " (warning) }
                }
            }
            div.grid {
                div.stat { b { (outcomes[0]) } span { "acked" } }
                div.stat { b { (outcomes[1]) } span { "retried" } }
                div.stat { b { (outcomes[2]) } span { "dead-lettered by the handler" } }
                div.stat { b { (outcomes[3] + outcomes[4]) } span { "failed (trap or limit)" } }
                div.stat { b { code { (current.digest.short()) } } span { "handler, since " (ago(current.since)) } }
                div.stat { b { (swaps) " / " (refusals) } span { "swaps / refused" } }
            }
            @if !parts.is_empty() {
                (super::rollout::panel(canary.as_ref(), viewer, (&labels.stream, &labels.group)))
            }
            p.muted {
                @match counted {
                    Some(Some(since)) => { "Deliveries counted by every host of the group since " (format_ms(since as i64)) " (kept in Redis)." },
                    Some(None) => { "Deliveries counted by every host of the group (kept in Redis): none yet." },
                    None => { "Redis did not answer: deliveries counted by this host since it started." },
                }
            }
            p.muted.flow-facts {
                @match limit {
                    Some(l) => { "Rate limit " b { (l.per_second) "/s" } " for the group (burst " (l.burst) "; " (waits) " reads waited on this host). " },
                    None => { "No rate limit. " },
                }
                @match breaker_config {
                    Some(b) => {
                        "Circuit breaker " b { @if let Some(open) = &breaker { (open.name()) } @else { "closed" } }
                        " (opens at " (format!("{:.0}", b.failure_rate * 100.0)) "% failed of at least " (b.min_deliveries) " in " (humantime::format_duration(b.window)) "). "
                    },
                    None => { "No circuit breaker. " },
                }
                @if let Some(f) = &facts {
                    "Redis " (f.version) " (" (f.role) "), " (bytesize::ByteSize::b(f.used_memory)) " used"
                    @if f.maxmemory > 0 { " of " (bytesize::ByteSize::b(f.maxmemory)) " (" (f.maxmemory_policy) ")" }
                    ", " (f.clients) " clients."
                }
            }
            @if !journal.is_empty() {
                details.journal {
                    summary { "Flow journal: " (journal[0].what) " " (ago_ms(journal[0].at_ms)) " (" (journal.len()) " shown)" }
                    table {
                        tr { th { "when" } th { "what" } th { "by" } th { "detail" } }
                        @for j in &journal {
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
            table {
                tr { th { "stream" } th { "state" } th { "pending" } th { "unread" } th { "parked" } th { "next due" } th { "dead letters" } }
                @for (part, snapshot, problem) in &rows {
                    @let keys = part.keys();
                    tr {
                        td { code { (part.labels.stream) } }
                        td {
                            @match problem {
                                None if paused.is_some() => span.badge.warn { "paused" },
                                None if breaker.is_some() => span.badge.bad { "breaker open" },
                                None => span.badge.ok { "reading" },
                                Some(p) => span.badge.bad title=(p) { "not ready" },
                            }
                        }
                        @match snapshot {
                            Ok(Ok(s)) => {
                                // A retry lane's entries are the subscription's work too.
                                @let lane_pending = s.lane.as_ref().map_or(0, |g| g.pending);
                                @let lane_unread = s.lane.as_ref().and_then(|g| g.lag).unwrap_or(0);
                                td title=[part.lane.as_ref().map(|l| format!("{lane_pending} of them in the retry lane {l}"))] {
                                    a href=(sub_link(&keys, "pending")) { (s.group.as_ref().map_or(0, |g| g.pending) + lane_pending) }
                                }
                                td title=[part.lane.as_ref().map(|l| format!("{lane_unread} of them in the retry lane {l}"))] {
                                    (s.group.as_ref().and_then(|g| g.lag).map_or("?".to_owned(), |l| (l + lane_unread).to_string()))
                                }
                                td {
                                    @match &s.delayed {
                                        Some(d) => a href=(sub_link(&keys, "parked")) { (d.parked) },
                                        None => span.muted { "no set" },
                                    }
                                }
                                td {
                                    @match s.delayed.as_ref().and_then(|d| d.next_due_ms) {
                                        Some(due) => span data-due=(due) data-now=(now_ms) { (format_ms(due)) },
                                        None => span.muted { "-" },
                                    }
                                }
                                td { a href=(sub_link(&keys, "dead-letters")) { (s.dead_letters) } }
                            }
                            Ok(Err(err)) => td colspan="5" .bad { "Redis: " (err.to_string()) },
                            Err(_) => td colspan="5" .bad { "Redis did not answer within a second" },
                        }
                    }
                }
            }
            details {
                summary.muted { "Handler versions" }
                table {
                    tr { th { "when" } th { "what" } th { "sha256" } }
                    @for served in slot.history().iter().rev() {
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
}

/// Rates between consecutive samples as an inline SVG line chart: acked, retried, failed.
fn chart(samples: &[Sample]) -> Markup {
    const W: f64 = 1100.0;
    const H: f64 = 140.0;
    if samples.len() < 2 {
        return html! { p.muted { "Collecting: the chart fills in after a few seconds." } };
    }
    let rates: Vec<[f64; 3]> = samples
        .windows(2)
        .map(|w| {
            let secs = ((w[1].at_ms - w[0].at_ms) as f64 / 1000.0).max(0.001);
            let rate = |i: usize| w[1].counts[i].saturating_sub(w[0].counts[i]) as f64 / secs;
            [rate(0), rate(1), rate(2)]
        })
        .collect();
    let top = rates
        .iter()
        .flat_map(|r| r.iter().copied())
        .fold(1.0f64, f64::max);
    let span_ms = (samples[samples.len() - 1].at_ms - samples[0].at_ms).max(1) as f64;
    let points = |series: usize| -> Vec<(f64, f64)> {
        rates
            .iter()
            .zip(samples.iter().skip(1))
            .map(|(r, s)| {
                let x = 40.0 + (s.at_ms - samples[0].at_ms) as f64 / span_ms * (W - 50.0);
                let y = 10.0 + (1.0 - r[series] / top) * (H - 30.0);
                (x, y)
            })
            .collect()
    };
    let line = |series: usize| -> String {
        points(series)
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let colors = ["#12805c", "#b54708", "#c01048"];
    html! {
        svg viewBox=(format!("0 0 {W} {H}")) width="100%" height=(H) role="img" aria-label="deliveries per second" {
            line x1="40" y1=(H - 20.0) x2=(W - 10.0) y2=(H - 20.0) stroke="#e4e7ec" {}
            text x="0" y="16" { (format!("{top:.0}/s")) }
            text x="0" y=(H - 20.0) { "0" }
            @for (i, color) in colors.iter().enumerate() {
                polyline points=(line(i)) fill="none" stroke=(color) stroke-width="2" {}
                @if let Some((x, y)) = points(i).last() {
                    circle cx=(format!("{x:.1}")) cy=(format!("{y:.1}")) r="3" fill=(color) {}
                }
            }
        }
        div.legend {
            span { i style="background:#12805c" {} "acked" }
            span { i style="background:#b54708" {} "retried" }
            span { i style="background:#c01048" {} "dead-lettered or failed" }
        }
    }
}

/// A field's value for a page: pretty JSON when it is JSON, text when it is UTF-8, hex bytes
/// otherwise. The caller's template escapes it.
fn shown(value: &[u8]) -> String {
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(value)
        && (json.is_object() || json.is_array())
        && let Ok(pretty) = serde_json::to_string_pretty(&json)
    {
        return pretty;
    }
    printable(value)
}

/// Past this many characters or lines a value is folded: its first line shows, the rest opens.
const FOLD_CHARS: usize = 400;
const FOLD_LINES: usize = 12;

/// One value as the page shows it: whole when short, else folded under its first line with its
/// size, so a row of a 40 KB payload does not push every other row off the screen.
fn value(text: &str) -> Markup {
    let lines = text.lines().count();
    if text.chars().count() <= FOLD_CHARS && lines <= FOLD_LINES {
        return html! { pre { (text) } };
    }
    let head: String = text.lines().next().unwrap_or("").chars().take(80).collect();
    html! {
        details.value {
            summary { code { (head) } " … " span.muted { (bytesize::ByteSize::b(text.len() as u64)) ", " (lines) " lines" } }
            pre { (text) }
        }
    }
}

fn fields(fields: &[(Vec<u8>, Vec<u8>)]) -> Markup {
    html! {
        @for (name, v) in fields {
            div.field { code { (printable(name)) } (value(&shown(v))) }
        }
    }
}

/// A dead letter's reason: text that wraps (long ones folded), and its traceback, when it has
/// one, as lines in a fold under it.
fn reason_cell(reason: &str, trace: Option<&str>) -> Markup {
    html! {
        div.reason { (value(reason)) }
        @if let Some(trace) = trace {
            details.trace { summary { "traceback (" (trace.lines().count()) " lines)" } pre { (trace) } }
        }
    }
}

fn action(
    viewer: &Viewer,
    keys: &SubscriptionKeys,
    name: &str,
    hidden: &[(&str, String)],
    label: &str,
    class: &str,
    confirm: Option<&str>,
) -> Markup {
    html! {
        form.inline method="post" action=(sub_link(keys, "act")) data-confirm=[confirm] {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="action" value=(name);
            @for (k, v) in hidden { input type="hidden" name=(k) value=(v); }
            button class=(class) type="submit" { (label) }
        }
    }
}

/// An entry's trace id under its origin id, a link when `trace_url` is set; nothing when
/// traces are neither exported nor linked.
fn trace_cell(trace_id: Option<String>) -> Markup {
    let Some(id) = trace_id.filter(|_| crate::observe::telemetry::traces_shown()) else {
        return html! {};
    };
    html! {
        br;
        span.muted.trace-id {
            "trace "
            @match crate::observe::telemetry::trace_link(&id) {
                Some(link) => a href=(link) rel="noopener noreferrer" target="_blank" { code { (id) } },
                None => code { (id) },
            }
        }
    }
}

/// The parked retries of one subscription, due order.
pub(super) fn parked(
    viewer: &Viewer,
    keys: &SubscriptionKeys,
    set: &str,
    now_ms: i64,
    total: u64,
    page: &Page<Parked>,
    done: Option<&str>,
) -> Markup {
    layout(
        "Parked retries",
        Some(viewer),
        html! {
            h1 { "Parked retries of " code { (keys.stream) } }
            (flash(done))
            div.card {
                p.muted { (total) " waiting in " code { (set) } ", earliest due first. "
                    a href=(sub_link(keys, "dead-letters")) { "Dead letters" } " " (find_entry(keys)) }
                @if viewer.can_act && total > 0 {
                    div.bulk {
                        form #bulk .inline method="post" action=(sub_link(keys, "act")) data-confirm="Apply this to the {n} selected retries?" data-needs="pick" {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            select name="action" {
                                option value="retry-selected" { "Retry the selected now" }
                                option value="delete-selected" { "Delete the selected" }
                                option value="dead-letter-selected" { "Dead-letter the selected" }
                            }
                            " "
                            input type="text" name="reason" placeholder="reason (dead-letter)" size="16";
                            " " button type="submit" { "Apply to selected" }
                        }
                        " · all " (total) ", " (super::super::waiting::ALL_PER_CALL) " a press: "
                        (action(viewer, keys, "retry-all", &[], "Retry all now", "primary", Some(&format!("Make all {total} parked retries due now (up to {} a press)?", super::super::waiting::ALL_PER_CALL))))
                        " "
                        (action(viewer, keys, "delete-all", &[], "Delete all", "danger", Some(&format!("Delete all {total} parked retries for good (up to {} a press)? They are not dead-lettered.", super::super::waiting::ALL_PER_CALL))))
                        " "
                        form.inline method="post" action=(sub_link(keys, "act")) data-confirm=(format!("Dead-letter all {total} parked retries (up to {} a press)?", super::super::waiting::ALL_PER_CALL)) {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            input type="hidden" name="action" value="dead-letter-all";
                            input type="text" name="reason" placeholder="reason" size="12";
                            " " button.danger type="submit" { "Dead-letter all" }
                        }
                    }
                }
                table {
                    tr { @if viewer.can_act { th { } } th { "origin id" } th { "due" } th { "retry" } th { "fields" } @if viewer.can_act { th { "actions" } } }
                    @for p in &page.items {
                        @let e = &p.entry;
                        @let hidden = [("origin", e.origin_id.clone()), ("due_ms", e.due_ms.to_string())];
                        tr {
                            @if viewer.can_act {
                                td { input type="checkbox" form="bulk" name="pick" value=(format!("{}|{}", e.due_ms, e.origin_id)) title="select"; }
                            }
                            td { a href=(entry_link(keys, &e.origin_id)) { code { (e.origin_id) } } (trace_cell(p.trace_id())) }
                            td { span data-due=(e.due_ms) data-now=(now_ms) { } br; span.muted { (format_ms(e.due_ms)) } }
                            td { (e.retry_count) }
                            td { (fields(&e.fields)) }
                            @if viewer.can_act {
                                td.actions {
                                    (action(viewer, keys, "retry-now", &hidden, "Retry now", "primary", None))
                                    " "
                                    (action(viewer, keys, "delete-parked", &hidden, "Delete", "danger", Some("Delete this retry for good?")))
                                    form method="post" action=(sub_link(keys, "act")) {
                                        input type="hidden" name="csrf" value=(viewer.csrf);
                                        input type="hidden" name="action" value="dead-letter";
                                        @for (k, v) in &hidden { input type="hidden" name=(k) value=(v); }
                                        input type="text" name="reason" placeholder="reason" size="12";
                                        " " button.danger type="submit" { "Dead-letter" }
                                    }
                                }
                            }
                        }
                    }
                }
                @if page.items.is_empty() { p.muted { "Nothing parked." } }
                @if let Some(next) = &page.next {
                    p { a.button href=(format!("{}?cursor={}", sub_link(keys, "parked"), segment(next))) { "Next page" } }
                }
            }
        },
    )
}

/// A link to the page of the entry whose origin id is `id`.
fn entry_link(keys: &SubscriptionKeys, id: &str) -> String {
    format!("{}?id={}", sub_link(keys, "entry"), segment(id))
}

/// A form that opens an entry's page by its id.
fn find_entry(keys: &SubscriptionKeys) -> Markup {
    html! {
        form.inline method="get" action=(sub_link(keys, "entry")) {
            input type="text" name="id" placeholder="entry id" size="18" pattern="[0-9]+-[0-9]+" required;
            " " button type="submit" { "Show entry" }
        }
    }
}

/// One entry, whole: where it is now, its fields and its history.
pub(super) fn entry(
    viewer: &Viewer,
    keys: &SubscriptionKeys,
    view: &crate::control::operate::entry::EntryView,
) -> Markup {
    use crate::control::operate::entry::Whereabouts;
    use crate::entry::history::Action;
    layout(
        "Entry",
        Some(viewer),
        html! {
            h1 { "Entry " code { (view.origin_id) } " of " code { (keys.stream) } ", group " code { (keys.group) } }
            div.card #now {
                h2 { "Now" }
                @match &view.now {
                    Whereabouts::Pending { key, id, consumer, idle_ms, deliveries } => p {
                        span.badge.warn { "in flight" } " pending to "
                        a href=(format!("{}?consumer={}", sub_link(keys, "pending"), segment(consumer))) { code { (consumer) } }
                        " as " code { (id) } " of " code { (key) } ", delivered " (deliveries) " time" @if *deliveries != 1 { "s" }
                        ", last " (format!("{:.1}s", *idle_ms as f64 / 1000.0)) " ago"
                    },
                    Whereabouts::Parked { due_ms, retry_count } => p {
                        span.badge { "parked" } " due " (format_ms(*due_ms)) " (retry " (retry_count) ") in "
                        a href=(sub_link(keys, "parked")) { "the delayed set" }
                    },
                    Whereabouts::Queued { key, id } => p {
                        span.badge { "queued" } " as " code { (id) } " of " code { (key) } ", not read by the group yet"
                    },
                    Whereabouts::DeadLettered { id, reason } => p {
                        span.badge.bad { "dead-lettered" } " as " code { (id) } " in "
                        a href=(sub_link(keys, "dead-letters")) { code { (keys.dead_letter) } } ": "
                        span.reason { (value(reason)) }
                    },
                    Whereabouts::Unknown { how } => p {
                        span.badge { "not found" } " " (how)
                    },
                    Whereabouts::Done { how } => p {
                        span.badge.ok { "done" } " "
                        @if how.is_empty() { "not pending, parked or dead-lettered" } @else { (how) }
                    },
                }
            }
            div.card {
                h2 { "Fields" }
                @if view.fields.is_empty() { p.muted { "Not found: the entry is no longer in the stream, the set or the dead letters." } }
                (fields(&view.fields))
            }
            div.card #history {
                h2 { "History" }
                p.muted { "Each park for a delayed retry and each dead letter, by the Redis server's clock; the newest " (crate::entry::history::MAX_RECORDS) " are kept for " (crate::entry::history::KEEP.as_secs() / 86_400) " days after the last. Acks and retries that stay pending are not recorded." }
                @if view.history.is_empty() {
                    p.muted { "Nothing recorded: the entry was not retried or dead-lettered (or that was more than a week ago)." }
                } @else {
                    table {
                        tr { th { "when" } th { "attempt" } th { "consumer" } th { "what" } th { "why" } }
                        @for r in &view.history {
                            tr {
                                td.nowrap { (format_ms(r.at)) }
                                td { (r.n) }
                                td { code { (r.by) } }
                                td {
                                    @match r.action {
                                        Action::Retry => {
                                            "retry"
                                            @if let Some(ms) = r.ms { " in " (humantime::format_duration(std::time::Duration::from_millis(ms))) }
                                            @if let Some(due) = r.due { br; span.muted { "due " (format_ms(due)) } }
                                        }
                                        Action::DeadLetter => {
                                            "dead letter"
                                            @if let Some(dl) = &r.dl { br; span.muted { code { (dl) } } }
                                        }
                                    }
                                    br; span.muted { "as " code { (r.id) } }
                                }
                                td { div.reason { (value(&r.why)) } }
                            }
                        }
                    }
                }
            }
            p { (find_entry(keys)) }
        },
    )
}

/// One source's consumers and, for the consumer asked for, its pending entries.
pub(super) struct PendingTable {
    pub(super) key: String,
    pub(super) consumers: Vec<redis::streams::StreamInfoConsumer>,
    pub(super) entries: Vec<crate::store::inspect::PendingEntry>,
}

/// Entries in flight per consumer.
pub(super) fn pending(
    viewer: &Viewer,
    keys: &SubscriptionKeys,
    this_host: &str,
    asked: Option<&str>,
    tables: &[PendingTable],
) -> Markup {
    let link = |consumer: &str| {
        format!(
            "{}?consumer={}",
            sub_link(keys, "pending"),
            segment(consumer)
        )
    };
    layout(
        "In flight",
        Some(viewer),
        html! {
            h1 { "In flight on " code { (keys.stream) } ", group " code { (keys.group) } }
            @for t in tables {
                div.card {
                    h2 { "Consumers of " code { (t.key) } }
                    p.muted { "A consumer is a host (its `consumer` name, by default sluice-<hostname>). Entries pending to one are being handled by it, or wait there for a retry; a consumer idle past consumer_gone_after has its entries taken over by a live host." }
                    table {
                        tr { th { "consumer" } th { "pending" } th { "idle" } }
                        @for c in &t.consumers {
                            tr {
                                td {
                                    a href=(link(&c.name)) { code { (c.name) } }
                                    @if c.name == this_host { " " span.badge.ok { "this host" } }
                                }
                                td { (c.pending) }
                                td { (format!("{:.1}s", c.idle as f64 / 1000.0)) }
                            }
                        }
                    }
                    @if t.consumers.is_empty() { p.muted { "No consumer has read it yet." } }
                    @if let Some(consumer) = asked {
                        h2 { "Oldest entries pending to " code { (consumer) } }
                        table {
                            tr { th { "entry id" } th { "since delivered" } th { "deliveries" } }
                            @for e in &t.entries {
                                tr {
                                    td {
                                        @if t.key == *keys.stream { a href=(entry_link(keys, &e.id)) { code { (e.id) } } }
                                        @else { code { (e.id) } }
                                    }
                                    td { (format!("{:.1}s", e.idle_ms as f64 / 1000.0)) }
                                    td { (e.deliveries) }
                                }
                            }
                        }
                        @if t.entries.is_empty() { p.muted { "None." } }
                    }
                }
            }
        },
    )
}

/// The dead letters of one subscription, newest first.
pub(super) fn dead_letters(
    viewer: &Viewer,
    keys: &SubscriptionKeys,
    total: u64,
    page: &Page<DeadLetter>,
    reason: Option<&str>,
    done: Option<&str>,
) -> Markup {
    let next_link = page.next.as_ref().map(|next| {
        let mut link = format!(
            "{}?cursor={}",
            sub_link(keys, "dead-letters"),
            segment(next)
        );
        if let Some(r) = reason {
            link.push_str(&format!("&reason={}", segment(r)));
        }
        link
    });
    layout(
        "Dead letters",
        Some(viewer),
        html! {
            h1 { "Dead letters of " code { (keys.stream) } }
            (flash(done))
            div.card {
                p.muted { (total) " in " code { (keys.dead_letter) } ", newest first. "
                    a href=(sub_link(keys, "parked")) { "Parked retries" } }
                form method="get" action=(sub_link(keys, "dead-letters")) {
                    input type="text" name="reason" value=[reason] placeholder="reason contains";
                    " " button type="submit" { "Filter" }
                }
                @if viewer.can_act {
                    p {
                        form.inline method="post" action=(sub_link(keys, "act")) data-confirm="Requeue every dead letter shown by this filter?" {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            input type="hidden" name="action" value="requeue-all";
                            input type="hidden" name="reason" value=[reason];
                            button.primary type="submit" {
                                @if let Some(r) = reason { "Requeue all whose reason contains “" (r) "”" } @else { "Requeue all" }
                            }
                        }
                    }
                }
                table {
                    tr { th { "written" } th { "reason" } th { "origin id" } th { "retries" } th { "fields" } @if viewer.can_act { th { "actions" } } }
                    @for l in &page.items {
                        @let hidden = [("id", l.id.clone())];
                        tr {
                            td.nowrap { (l.written_ms().map(format_ms).unwrap_or_default()) br; span.muted { code { (l.id) } } }
                            td { (reason_cell(l.reason.as_deref().unwrap_or("(not written by Sluice)"), l.trace.as_deref())) }
                            td {
                                @match l.origin_id.as_deref().filter(|_| l.ours) {
                                    Some(origin) => a href=(entry_link(keys, origin)) { code { (origin) } },
                                    None => code { (l.origin_id.as_deref().unwrap_or("-")) },
                                }
                                (trace_cell(l.trace_id()))
                            }
                            td { (l.retry_count.map_or("-".to_owned(), |n| n.to_string())) }
                            td { (fields(&l.fields)) }
                            @if viewer.can_act {
                                td.actions {
                                    @match &l.not_requeueable {
                                        None => (action(viewer, keys, "requeue", &hidden, "Requeue", "primary", None)),
                                        Some(why) => span.muted title=(why) { "cannot requeue" },
                                    }
                                    " "
                                    (action(viewer, keys, "delete-dead", &hidden, "Delete", "danger", Some("Delete this dead letter for good?")))
                                }
                            }
                        }
                    }
                }
                @if page.items.is_empty() { p.muted { "No dead letters" @if reason.is_some() { " match" } "." } }
                @if let Some(link) = next_link { p { a.button href=(link) { "Next page" } } }
            }
        },
    )
}
