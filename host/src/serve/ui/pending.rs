//! The page of entries in flight: per source (the stream, and its retry lane), the group's
//! consumers with their pending counts and idle times, and for the consumer asked for, its
//! oldest pending entries.

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};

use super::chrome::{entry_link, layout, segment, sub_link};
use super::{AdminState, PAGE, Viewer, subscription, unavailable};
use crate::control::operate::OperateError;
use crate::store::keys::SubscriptionKeys;

/// The pending page's query: whose entries to list.
#[derive(serde::Deserialize)]
pub(super) struct PendingQuery {
    consumer: Option<String>,
}

/// What the pending page shows.
struct PendingPage {
    keys: SubscriptionKeys,
    /// This host's consumer name in the group.
    this_host: String,
    /// The consumer whose entries are listed.
    asked: Option<String>,
    /// The stream's and its retry lane's.
    tables: Vec<PendingTable>,
}

/// One source's consumers and, for the consumer asked for, its pending entries.
struct PendingTable {
    key: String,
    consumers: Vec<redis::streams::StreamInfoConsumer>,
    entries: Vec<crate::store::inspect::PendingEntry>,
}

/// `GET /ui/s/{stream}/{group}/pending?consumer=`: entries in flight per consumer: the group's
/// consumers on the stream and on its retry lane (pending count, idle time), and for the one
/// asked for, its oldest pending entries.
pub(super) async fn pending_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<PendingQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let mut conn = sub.conn.clone();
    let mut sources = vec![keys.stream.to_string()];
    if let Some(lane) = &sub.lane {
        sources.push(lane.clone());
    }
    let listing = async {
        let mut tables = Vec::new();
        for key in &sources {
            let consumers = crate::store::inspect::consumers(&mut conn, key, &keys.group)
                .await
                .unwrap_or_default();
            let entries = match &q.consumer {
                Some(c) => {
                    crate::store::inspect::pending_of(&mut conn, key, &keys.group, c, PAGE).await?
                }
                None => Vec::new(),
            };
            tables.push(PendingTable {
                key: key.clone(),
                consumers,
                entries,
            });
        }
        Ok::<_, OperateError>(tables)
    }
    .await;
    match listing {
        Ok(tables) => {
            let shown = PendingPage {
                keys,
                this_host: sub.consumer.clone(),
                asked: q.consumer,
                tables,
            };
            Html(render(&viewer, &shown).into_string()).into_response()
        }
        Err(err) => unavailable(err),
    }
}

/// Entries in flight per consumer.
fn render(viewer: &Viewer, shown: &PendingPage) -> Markup {
    let keys = &shown.keys;
    layout(
        "In flight",
        Some(viewer),
        html! {
            h1 { "In flight on " code { (keys.stream) } ", group " code { (keys.group) } }
            @for t in &shown.tables { (table(shown, t)) }
        },
    )
}

/// One source's card: its consumers, and the entries pending to the one asked for.
fn table(shown: &PendingPage, t: &PendingTable) -> Markup {
    let keys = &shown.keys;
    let link = |consumer: &str| {
        format!(
            "{}?consumer={}",
            sub_link(keys, "pending"),
            segment(consumer)
        )
    };
    html! {
        div.card {
            h2 { "Consumers of " code { (t.key) } }
            p.muted { "A consumer is a host (its `consumer` name, by default sluice-<hostname>). Entries pending to one are being handled by it, or wait there for a retry; a consumer idle past consumer_gone_after has its entries taken over by a live host." }
            table {
                tr { th { "consumer" } th { "pending" } th { "idle" } }
                @for c in &t.consumers {
                    tr {
                        td {
                            a href=(link(&c.name)) { code { (c.name) } }
                            @if c.name == shown.this_host { " " span.badge.ok { "this host" } }
                        }
                        td { (c.pending) }
                        td { (format!("{:.1}s", c.idle as f64 / 1000.0)) }
                    }
                }
            }
            @if t.consumers.is_empty() { p.muted { "No consumer has read it yet." } }
            @if let Some(consumer) = &shown.asked {
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
}
