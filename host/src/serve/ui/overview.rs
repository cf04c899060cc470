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
use crate::serve::Sample;
use crate::serve::listing::{self, ListQuery};

/// How many subscriptions the overview shows at once.
const OVERVIEW_CARDS: usize = 20;

/// What the overview shows, fetched.
struct Overview {
    /// The result of the viewer's last action.
    done: Option<String>,
    /// The chart's delivery counts.
    samples: Vec<Sample>,
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
        let samples = state
            .samples
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
                (chart(&page.samples))
            }
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
