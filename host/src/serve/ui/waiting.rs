//! The pages of what waits: a subscription's parked retries (due order, with the bulk form)
//! and its dead letters (newest first, filtered by reason). Each handler gathers its page into
//! a plain struct ([`ParkedPage`], [`DeadLettersPage`]); a renderer writes it.

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};

use super::act::{Action, ParkedOp, Reach};
use super::chrome::{entry_link, find_entry, flash, layout, message, segment, sub_link};
use super::fields::{fields, reason_cell, trace_cell};
use super::{AdminState, PAGE, Viewer, subscription, unavailable};
use crate::control::operate::dead_letters::{self, DeadLetter};
use crate::control::operate::parked::{self, Parked};
use crate::control::operate::{OperateError, Page, format_ms};
use crate::serve::waiting::ALL_PER_CALL;
use crate::store::keys::SubscriptionKeys;

/// How many pages of the dead-letter stream one filtered listing scans for matches.
const SCAN_PAGES: usize = 20;

/// A waiting page's query: where the page starts, and (dead letters) the reason filter.
#[derive(serde::Deserialize)]
pub(super) struct PageQuery {
    cursor: Option<String>,
    reason: Option<String>,
}

/// What the parked page shows.
struct ParkedPage {
    keys: SubscriptionKeys,
    /// The delayed-retry set.
    set: String,
    /// The Redis server's clock, for the countdowns.
    now_ms: i64,
    /// Retries in the set.
    total: u64,
    page: Page<Parked>,
    /// The result of the viewer's last action.
    done: Option<String>,
}

/// `GET /ui/s/{stream}/{group}/parked`: the parked retries, earliest due first.
pub(super) async fn parked_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let Some(set) = keys.delayed.clone() else {
        return Html(message("This subscription has no delayed-retry set: its retries stay pending in the stream.").into_string()).into_response();
    };
    let mut conn = sub.conn.clone();
    let listing = async {
        let now_ms = crate::store::inspect::server_now_ms(&mut conn).await?;
        let total: u64 = redis::cmd("ZCARD")
            .arg(&*set)
            .query_async(&mut conn)
            .await?;
        let page = parked::list(&mut conn, &set, q.cursor.as_deref(), PAGE).await?;
        Ok::<_, OperateError>((now_ms, total, page))
    }
    .await;
    match listing {
        Ok((now_ms, total, page)) => {
            let shown = ParkedPage {
                keys,
                set: set.to_string(),
                now_ms,
                total,
                page,
                done: state.sessions.take_flash(&viewer.id),
            };
            Html(render_parked(&viewer, &shown).into_string()).into_response()
        }
        Err(err) => unavailable(err),
    }
}

/// The parked retries of one subscription, due order.
fn render_parked(viewer: &Viewer, shown: &ParkedPage) -> Markup {
    let ParkedPage {
        keys,
        set,
        total,
        page,
        ..
    } = shown;
    layout(
        "Parked retries",
        Some(viewer),
        html! {
            h1 { "Parked retries of " code { (keys.stream) } }
            (flash(shown.done.as_deref()))
            div.card {
                p.muted { (total) " waiting in " code { (set) } ", earliest due first. "
                    a href=(sub_link(keys, "dead-letters")) { "Dead letters" } " " (find_entry(keys)) }
                @if viewer.can_act && *total > 0 {
                    (bulk(viewer, keys, *total))
                }
                @let (scheduled, retries): (Vec<&Parked>, Vec<&Parked>) =
                    page.items.iter().partition(|p| p.entry.is_scheduled());
                @if !scheduled.is_empty() {
                    h2 { "Scheduled entries" }
                    p.muted { "Sent for later (" code { "sluice send --at" } ", the API, a producer): each comes as a first attempt at its time." }
                    (parked_table(viewer, keys, &scheduled, shown.now_ms))
                }
                @if !retries.is_empty() {
                    @if !scheduled.is_empty() { h2 { "Retries" } }
                    (parked_table(viewer, keys, &retries, shown.now_ms))
                }
                @if page.items.is_empty() { p.muted { "Nothing parked." } }
                @if let Some(next) = &page.next {
                    p { a.button href=(format!("{}?cursor={}", sub_link(keys, "parked"), segment(next))) { "Next page" } }
                }
            }
        },
    )
}

/// A table of parked retries or scheduled entries, due order.
fn parked_table(
    viewer: &Viewer,
    keys: &SubscriptionKeys,
    items: &[&Parked],
    now_ms: i64,
) -> Markup {
    html! {
        table {
            tr { @if viewer.can_act { th { } } th { "origin id" } th { "due" } th { "retry" } th { "fields" } @if viewer.can_act { th { "actions" } } }
            @for p in items { (parked_row(viewer, keys, p, now_ms)) }
        }
    }
}

/// The forms over many parked retries: the ticked ones, or all of them.
fn bulk(viewer: &Viewer, keys: &SubscriptionKeys, total: u64) -> Markup {
    let all = |op| Action::Parked(op, Reach::All);
    let selected = |op| Action::Parked(op, Reach::Selected);
    let dead_letter_all = all(ParkedOp::DeadLetter);
    html! {
        div.bulk {
            form #bulk .inline method="post" action=(sub_link(keys, "act")) data-confirm=[selected(ParkedOp::Retry).confirm(&keys.stream, &keys.group, total)] data-needs="pick" {
                input type="hidden" name="csrf" value=(viewer.csrf);
                select name="action" {
                    option value=(selected(ParkedOp::Retry).name()) { "Retry the selected now" }
                    option value=(selected(ParkedOp::Delete).name()) { "Delete the selected" }
                    option value=(selected(ParkedOp::DeadLetter).name()) { "Dead-letter the selected" }
                }
                " "
                input type="text" name="reason" placeholder="reason (dead-letter)" size="16";
                " " button type="submit" { "Apply to selected" }
            }
            " · all " (total) ", " (ALL_PER_CALL) " a press: "
            (action(viewer, keys, all(ParkedOp::Retry), &[], "Retry all now", "primary", total))
            " "
            (action(viewer, keys, all(ParkedOp::Delete), &[], "Delete all", "danger", total))
            " "
            form.inline method="post" action=(sub_link(keys, "act")) data-confirm=[dead_letter_all.confirm(&keys.stream, &keys.group, total)] {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="action" value=(dead_letter_all.name());
                input type="text" name="reason" placeholder="reason" size="12";
                " " button.danger type="submit" { "Dead-letter all" }
            }
        }
    }
}

/// One parked retry's row: its tick box, origin id, due time, fields and actions.
fn parked_row(viewer: &Viewer, keys: &SubscriptionKeys, p: &Parked, now_ms: i64) -> Markup {
    let e = &p.entry;
    let hidden = [
        ("origin", e.origin_id.clone()),
        ("due_ms", e.due_ms.to_string()),
    ];
    let one = |op| Action::Parked(op, Reach::One);
    html! {
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
                    (action(viewer, keys, one(ParkedOp::Retry), &hidden, "Retry now", "primary", 0))
                    " "
                    (action(viewer, keys, one(ParkedOp::Delete), &hidden, "Delete", "danger", 0))
                    form method="post" action=(sub_link(keys, "act")) data-confirm=[one(ParkedOp::DeadLetter).confirm(&keys.stream, &keys.group, 0)] {
                        input type="hidden" name="csrf" value=(viewer.csrf);
                        input type="hidden" name="action" value=(one(ParkedOp::DeadLetter).name());
                        @for (k, v) in &hidden { input type="hidden" name=(k) value=(v); }
                        input type="text" name="reason" placeholder="reason" size="12";
                        " " button.danger type="submit" { "Dead-letter" }
                    }
                }
            }
        }
    }
}

/// What the dead letters page shows.
struct DeadLettersPage {
    keys: SubscriptionKeys,
    /// Entries in the dead-letter stream.
    total: u64,
    page: Page<DeadLetter>,
    /// The filter: a substring of the reason.
    reason: Option<String>,
    /// The result of the viewer's last action.
    done: Option<String>,
}

/// `GET /ui/s/{stream}/{group}/dead-letters`: the dead letters, newest first.
pub(super) async fn dead_letters_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let mut conn = sub.conn.clone();
    let reason = q.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
    let listing = async {
        let total: u64 = redis::cmd("XLEN")
            .arg(&*keys.dead_letter)
            .query_async(&mut conn)
            .await?;
        let page = dead_letters::list_view(
            &mut conn,
            &keys,
            q.cursor.as_deref(),
            PAGE,
            reason,
            SCAN_PAGES,
        )
        .await?;
        Ok::<_, OperateError>((total, page))
    }
    .await;
    match listing {
        Ok((total, page)) => {
            let shown = DeadLettersPage {
                reason: reason.map(str::to_owned),
                keys,
                total,
                page,
                done: state.sessions.take_flash(&viewer.id),
            };
            Html(render_dead_letters(&viewer, &shown).into_string()).into_response()
        }
        Err(err) => unavailable(err),
    }
}

/// The dead letters of one subscription, newest first.
fn render_dead_letters(viewer: &Viewer, shown: &DeadLettersPage) -> Markup {
    let DeadLettersPage {
        keys, total, page, ..
    } = shown;
    let reason = shown.reason.as_deref();
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
    let requeue_all = Action::RequeueAll;
    layout(
        "Dead letters",
        Some(viewer),
        html! {
            h1 { "Dead letters of " code { (keys.stream) } }
            (flash(shown.done.as_deref()))
            div.card {
                p.muted { (total) " in " code { (keys.dead_letter) } ", newest first. "
                    a href=(sub_link(keys, "parked")) { "Parked retries" } }
                form method="get" action=(sub_link(keys, "dead-letters")) {
                    input type="text" name="reason" value=[reason] placeholder="reason contains";
                    " " button type="submit" { "Filter" }
                }
                @if viewer.can_act {
                    p {
                        form.inline method="post" action=(sub_link(keys, "act")) data-confirm=[requeue_all.confirm(&keys.stream, &keys.group, 0)] {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            input type="hidden" name="action" value=(requeue_all.name());
                            input type="hidden" name="reason" value=[reason];
                            button.primary type="submit" {
                                @if let Some(r) = reason { "Requeue all whose reason contains “" (r) "”" } @else { "Requeue all" }
                            }
                        }
                    }
                }
                table {
                    tr { th { "written" } th { "reason" } th { "origin id" } th { "retries" } th { "fields" } @if viewer.can_act { th { "actions" } } }
                    @for l in &page.items { (dead_letter_row(viewer, keys, l)) }
                }
                @if page.items.is_empty() { p.muted { "No dead letters" @if reason.is_some() { " match" } "." } }
                @if let Some(link) = next_link { p { a.button href=(link) { "Next page" } } }
            }
        },
    )
}

/// One dead letter's row: when it was written, why, its origin, fields and actions.
fn dead_letter_row(viewer: &Viewer, keys: &SubscriptionKeys, l: &DeadLetter) -> Markup {
    let hidden = [("id", l.id.clone())];
    html! {
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
                        None => (action(viewer, keys, Action::Requeue, &hidden, "Requeue", "primary", 0)),
                        Some(why) => span.muted title=(why) { "cannot requeue" },
                    }
                    " "
                    (action(viewer, keys, Action::DeleteDead, &hidden, "Delete", "danger", 0))
                }
            }
        }
    }
}

/// A form of one button that carries out `act` on the entries named by `hidden` (all of them
/// when empty), asking the action's question first (about `parked` retries, see
/// [`Action::confirm`]).
pub(super) fn action(
    viewer: &Viewer,
    keys: &SubscriptionKeys,
    act: Action,
    hidden: &[(&str, String)],
    label: &str,
    class: &str,
    parked: u64,
) -> Markup {
    html! {
        form.inline method="post" action=(sub_link(keys, "act")) data-confirm=[act.confirm(&keys.stream, &keys.group, parked)] {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="action" value=(act.name());
            @for (k, v) in hidden { input type="hidden" name=(k) value=(v); }
            button class=(class) type="submit" { (label) }
        }
    }
}
