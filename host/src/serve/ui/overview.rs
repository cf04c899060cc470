//! The overview, `GET /ui/`: the host's delivery chart, the search box with the totals and
//! page links, and a card per subscription (see [`super::card`]), those with something to see
//! first. [`Overview::gather`] fetches the page into a plain struct; [`render`] writes it.

use axum::extract::{Query, State};
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};

use super::card::{self, OverviewCard, within};
use super::chrome::{flash, layout, message};
use super::{AdminState, Viewer};
use crate::observe::metrics::SubLabels;
use crate::serve::listing::{self, ListQuery};
use crate::serve::samples::{MinuteSample, Sample};

/// How many subscriptions the overview shows at once.
const OVERVIEW_CARDS: usize = 20;

/// What the overview shows, fetched.
struct Overview {
    /// The result of the viewer's last action.
    done: Option<String>,
    /// The chart's delivery counts.
    samples: Vec<Sample>,
    /// The last hour's minutes.
    minutes: Vec<MinuteSample>,
    nav: Nav,
    /// The Redis server's clock when the page was made, for the cards' countdowns.
    now_ms: i64,
    cards: Vec<OverviewCard>,
}

/// The overview's search box, totals and page links: what they say.
struct Nav {
    /// The search text.
    q: String,
    /// Subscriptions on this host.
    total: usize,
    /// Those that match the search.
    matched: usize,
    /// Where the page starts among those.
    offset: usize,
    /// Cards on this page.
    shown: usize,
    /// Matching subscriptions with something to see.
    looks: usize,
}

/// `GET /ui/`: the overview, with the result of the viewer's last action.
pub(super) async fn overview(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Query(query): Query<ListQuery>,
) -> Response {
    if let Err((code, why)) = query.check() {
        return (code, Html(message(&why).into_string())).into_response();
    }
    let done = state.sessions.take_flash(&viewer.id);
    let page = Overview::gather(&state, done, &query).await;
    Html(render(&viewer, &page).into_string()).into_response()
}

/// Whether a subscription has something to see without asking Redis: a partition that cannot
/// read, a pause, a breaker not closed, a canary. The overview shows these first.
fn needs_look(state: &AdminState, labels: &SubLabels) -> bool {
    let parts = state.index.parts(&state.subscriptions, labels);
    parts.iter().any(|p| p.health.problem().is_some())
        || parts.first().is_some_and(|p| {
            let flow = p.flow.borrow();
            flow.paused.is_some() || flow.breaker.is_some() || flow.canary.is_some()
        })
}

impl Overview {
    /// The page `query` asks for: its subscriptions' cards probed at once, so a Redis that
    /// does not answer costs the page one probe's timeout, not one per card.
    async fn gather(state: &AdminState, done: Option<String>, query: &ListQuery) -> Self {
        let look = |labels: &SubLabels| needs_look(state, labels);
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
            Some(sub) => within(crate::store::inspect::server_now_ms(&mut sub.conn.clone()))
                .await
                .unwrap_or(0),
            None => 0,
        };
        let cards = futures::future::join_all(
            page.shown
                .iter()
                .map(|control| OverviewCard::gather(state, control)),
        )
        .await;
        state.samples.viewed();
        let samples = state
            .samples
            .seconds
            .lock()
            .map(|s| s.iter().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        let minutes = state
            .samples
            .minutes
            .lock()
            .map(|s| s.iter().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        let nav = Nav {
            q: query.q.clone().unwrap_or_default(),
            total: page.total,
            matched: page.matched,
            offset: page.offset,
            shown: page.shown.len(),
            looks,
        };
        Self {
            done,
            samples,
            minutes,
            nav,
            now_ms,
            cards,
        }
    }
}

/// Every subscription: handler version and history, outcomes, and per partition what waits.
fn render(viewer: &Viewer, page: &Overview) -> Markup {
    layout(
        "Overview",
        Some(viewer),
        html! {
            h1 { "Overview" }
            (flash(page.done.as_deref()))
            div.card {
                h2 { "Deliveries per second, last 10 minutes" }
                (super::charts::per_second(&page.samples))
            }
            (super::charts::last_hour(&page.minutes))
            (nav(&page.nav))
            @for c in &page.cards { (card::render(viewer, c, page.now_ms)) }
        },
    )
}

/// The overview's search box, totals and page links.
fn nav(nav: &Nav) -> Markup {
    let q = &nav.q;
    let link = |offset: usize| {
        let mut params = form_urlencoded::Serializer::new(String::new());
        if !q.is_empty() {
            params.append_pair("q", q);
        }
        params.append_pair("offset", &offset.to_string());
        format!("/ui/?{}", params.finish())
    };
    let end = nav.offset + nav.shown;
    html! {
        div.card {
            p {
                b { (nav.total) } " subscriptions on this host"
                @if nav.looks > 0 { ", " b.bad { (nav.looks) } " with something to see (they come first)" }
                "."
                @if nav.matched != nav.total { " " (nav.matched) " match." }
            }
            form method="get" action="/ui/" {
                input type="search" name="q" value=(q) placeholder="stream or group contains" maxlength=(listing::MAX_QUERY);
                " " button type="submit" { "Find" }
            }
            @if nav.matched > nav.shown {
                p {
                    "Showing " (nav.offset + usize::from(end > nav.offset)) "–" (end) " of " (nav.matched) ". "
                    @if nav.offset > 0 {
                        a href=(link(nav.offset.saturating_sub(OVERVIEW_CARDS))) { "← previous" } " "
                    }
                    @if end < nav.matched {
                        a href=(link(end)) { "next →" }
                    }
                }
            }
        }
    }
}
