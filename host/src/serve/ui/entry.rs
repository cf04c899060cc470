//! One entry's page, whole: where it is now (in flight, parked, queued, dead-lettered or done),
//! its fields and its history (see [`crate::control::operate::entry`], the same lookup as the
//! CLI and the API).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};

use super::chrome::{find_entry, layout, message, segment, sub_link};
use super::fields::{fields, value};
use super::{AdminState, Viewer, subscription, unavailable};
use crate::control::operate::entry::{EntryView, Whereabouts};
use crate::control::operate::format_ms;
use crate::entry::history::Action;
use crate::store::keys::SubscriptionKeys;

/// The entry page's query: which entry.
#[derive(serde::Deserialize)]
pub(super) struct EntryQuery {
    id: String,
}

/// `GET /ui/s/{stream}/{group}/entry?id=`: one entry, or a 404 page when nothing is known of
/// it.
pub(super) async fn entry_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<EntryQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let mut conn = sub.conn.clone();
    let id = q.id.trim();
    match crate::control::operate::entry::lookup(&mut conn, &keys, id).await {
        Ok(Some(view)) => Html(render(&viewer, &keys, &view).into_string()).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Html(
                message(&format!(
                    "Nothing is known of entry {id} of {}: no history, and not in the stream.",
                    keys.stream
                ))
                .into_string(),
            ),
        )
            .into_response(),
        Err(err) => unavailable(err),
    }
}

/// One entry, whole: where it is now, its fields and its history.
fn render(viewer: &Viewer, keys: &SubscriptionKeys, view: &EntryView) -> Markup {
    layout(
        "Entry",
        Some(viewer),
        html! {
            h1 { "Entry " code { (view.origin_id) } " of " code { (keys.stream) } ", group " code { (keys.group) } }
            div.card #now {
                h2 { "Now" }
                (now(keys, &view.now))
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
                    (history(view))
                }
            }
            p { (find_entry(keys)) }
        },
    )
}

/// Where the entry is now, with links to the page that shows it there.
fn now(keys: &SubscriptionKeys, now: &Whereabouts) -> Markup {
    html! {
        @match now {
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
}

/// The entry's parks and dead letters, as recorded.
fn history(view: &EntryView) -> Markup {
    html! {
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
                            Action::Duplicate => {
                                "duplicate, not handled"
                                @if let Some(of) = &r.of { br; span.muted { "of " code { (of) } } }
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
