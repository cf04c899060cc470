//! The page of an ordered subscription's keys that wait (see [`crate::pipeline::order`]): how
//! many entries wait behind each key, since when, and what holds its turn (an entry in flight,
//! a parked retry and when it is due, a held dead letter), with a release button per key.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};

use super::act::Action;
use super::chrome::{flash, layout, message, sub_link};
use super::waiting::action;
use super::{AdminState, PAGE, Viewer, subscription, unavailable};
use crate::control::operate::{OperateError, format_ms, parked};
use crate::pipeline::order::{OrderKeys, inspect};
use crate::store::keys::SubscriptionKeys;

/// What the page shows.
struct KeysPage {
    keys: SubscriptionKeys,
    overview: inspect::Overview,
    /// Due times of the holders that are parked retries, by origin id.
    due: std::collections::HashMap<String, i64>,
    done: Option<String>,
}

/// `GET /ui/s/{stream}/{group}/keys`: the keys that waited longest.
pub(super) async fn keys_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let (Some(_), Some(set)) = (&sub.ordered, keys.delayed.clone()) else {
        return Html(
            message("This subscription is not ordered (no ordered_by): its entries are handled concurrently whatever their key.")
                .into_string(),
        )
        .into_response();
    };
    let mut conn = sub.conn.clone();
    let listing = async {
        let overview = inspect::overview(&mut conn, &OrderKeys::new(&stream, &group), PAGE).await?;
        let page = parked::list(&mut conn, &set, None, 1000).await?;
        Ok::<_, OperateError>((overview, page))
    }
    .await;
    match listing {
        Ok((overview, page)) => {
            let shown = KeysPage {
                keys,
                overview,
                due: page
                    .items
                    .into_iter()
                    .map(|p| (p.entry.origin_id, p.entry.due_ms))
                    .collect(),
                done: state.sessions.take_flash(&viewer.id),
            };
            Html(render(&viewer, &shown).into_string()).into_response()
        }
        Err(err) => unavailable(err),
    }
}

fn render(viewer: &Viewer, shown: &KeysPage) -> Markup {
    let KeysPage { keys, overview, .. } = shown;
    layout(
        "Ordered keys",
        Some(viewer),
        html! {
            h1 { "Ordered keys of " code { (keys.stream) } }
            (flash(shown.done.as_deref()))
            div.card {
                p.muted { (overview.waiting_keys) " key(s) with entries waiting, "
                    (overview.turns_held) " turn(s) held; longest waiting first. "
                    a href=(sub_link(keys, "parked")) { "Parked retries" } }
                table {
                    tr { th { "key" } th { "waiting" } th { "since" } th { "behind" } @if viewer.can_act { th { "actions" } } }
                    @for k in &overview.keys {
                        tr {
                            td { code { (k.key) } }
                            td { (k.waiting) }
                            td { (k.waiting_since_ms.map(format_ms).unwrap_or_default()) }
                            td { (behind(k, &shown.due)) }
                            @if viewer.can_act {
                                td { (action(viewer, keys, Action::ReleaseKey, &[("id", k.key.clone())], "Release", "danger", 0)) }
                            }
                        }
                    }
                }
                @if overview.keys.is_empty() { p.muted { "No key has entries waiting." } }
            }
        },
    )
}

/// What holds a key's turns, in words.
fn behind(k: &inspect::KeyState, due: &std::collections::HashMap<String, i64>) -> Markup {
    html! {
        @if k.holders.is_empty() && k.holders_complete { span.muted { "nothing (let in next)" } }
        @if !k.holders_complete { span.muted { "(more turns than one listing scans: holders may be missing)" } }
        @for h in &k.holders {
            div {
                code { (h.origin_id) } " "
                @if h.dead_letter { "(dead letter, held)" }
                @else if let Some(at) = due.get(&h.origin_id) { "(parked, due " (format_ms(*at)) ")" }
                @else { "(in flight or coming back)" }
            }
        }
    }
}
