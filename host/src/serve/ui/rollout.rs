//! The page's rollout parts: a running canary shown with both versions side by side, the form
//! that starts one, its abort button, and "try a candidate on these dead letters" with its
//! result (see [`crate::control::rollout`]; the same code as `sluice swap --canary` and `sluice
//! replay`).
//!
//! The forms that send a component are posted by the page's script with the file as the
//! body and the other fields (CSRF token included) in the query (`data-upload`); the abort is
//! an ordinary form. Every one needs the session's CSRF token and the right to act, and an
//! upload is bounded by `admin_max_upload` and one at a time, like the API's.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::chrome::{layout, message, segment};
use super::{AdminState, Viewer, forbidden};
use crate::control::rollout::canary::{CanaryState, Outcome, Totals};
use crate::control::rollout::{ReplayOutcome, Rollout};
use crate::support::digest::short;

/// Who the page's canaries and aborts are recorded as.
const BY: &str = "the admin page";

/// What a rollout form asks for: its `action` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RolloutAction {
    /// Roll the running canary back.
    AbortCanary,
    /// Start a canary of the uploaded component.
    Canary,
    /// Replay dead letters on the uploaded component.
    Replay,
}

impl RolloutAction {
    /// Its name in a form's `action` field.
    fn name(self) -> &'static str {
        match self {
            Self::AbortCanary => "abort-canary",
            Self::Canary => "canary",
            Self::Replay => "replay",
        }
    }

    /// The action a form's field names, if it is one of these.
    fn parse(name: &str) -> Option<Self> {
        [Self::AbortCanary, Self::Canary, Self::Replay]
            .into_iter()
            .find(|a| a.name() == name)
    }
}

/// The canary part of a subscription's card: the running canary (or the last verdict), and
/// the forms.
pub(super) fn panel(
    canary: Option<&CanaryState>,
    viewer: &Viewer,
    (stream, group): (&str, &str),
) -> Markup {
    let running = canary.is_some_and(CanaryState::running);
    let action = format!("/ui/s/{}/{}/rollout", segment(stream), segment(group));
    html! {
        div.canary {
            @if let Some(c) = canary {
                @if let Some(record) = &c.record {
                    @if running {
                        h3 { "Canary " span.badge.warn { "running" } }
                        p {
                            (record.percent()) "% of deliveries (entries added from "
                            (crate::support::when::rfc3339_ms(i64::try_from(record.from_ms()).unwrap_or(i64::MAX)))
                            ") run " code { (short(&record.candidate)) } " on every host, until "
                            (crate::support::when::rfc3339_ms(i64::try_from(record.ends_ms).unwrap_or(i64::MAX)))
                            "; started by " (record.by) "."
                        }
                        (side_by_side(&record.incumbent, &record.candidate, c))
                        @if viewer.can_act {
                            form.inline method="post" action=(action) data-confirm="Roll the candidate back on every host?" {
                                input type="hidden" name="csrf" value=(viewer.csrf);
                                input type="hidden" name="action" value=(RolloutAction::AbortCanary.name());
                                button.danger type="submit" { "Abort the canary" }
                            }
                        }
                    } @else if let Some(v) = &c.verdict {
                        h3 { "Last canary" }
                        p {
                            code { (short(&record.candidate)) } " "
                            @match v.outcome {
                                Outcome::Promoted => span.badge { "promoted" },
                                Outcome::RolledBack => span.badge.bad { "rolled back" },
                            }
                            " at " (crate::support::when::rfc3339_ms(i64::try_from(v.at_ms).unwrap_or(i64::MAX)))
                            " by " (v.by) ": " (v.why)
                        }
                        (side_by_side(&record.incumbent, &record.candidate, c))
                    }
                } @else if let Some(why) = &c.refused {
                    p.bad { "A canary record in Redis is ignored: " (why) }
                }
            }
            @if viewer.can_act && !running {
                form.inline.start-canary method="post" action=(action) data-upload="" {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input type="hidden" name="action" value=(RolloutAction::Canary.name());
                    "Try a candidate on "
                    input type="number" name="percent" value="10" min="0.01" max="99.99" step="0.01" aria-label="share in percent";
                    "% of deliveries for "
                    input type="text" name="for" value="5m" size="5" aria-label="window";
                    " "
                    input type="file" name="component" accept=".wasm" aria-label="candidate component";
                    " "
                    button.primary type="submit" { "Start a canary" }
                }
            }
            @if viewer.can_act {
                form.inline.replay method="post" action=(action) data-upload="" {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input type="hidden" name="action" value=(RolloutAction::Replay.name());
                    "Try a candidate on the dead letters whose reason contains "
                    input type="text" name="reason" placeholder="(any)" aria-label="reason contains";
                    " (at most "
                    input type="number" name="limit" value="100" min="1" max="1000" aria-label="how many";
                    ") "
                    input type="file" name="component" accept=".wasm" aria-label="candidate component";
                    " "
                    label { input type="checkbox" name="requeue_acked" value="true"; " then requeue those it acks (only when it serves)" }
                    " "
                    button type="submit" { "Replay (dry run)" }
                }
            }
        }
    }
}

/// The canary's totals for the group, incumbent and candidate side by side.
fn side_by_side(incumbent: &str, candidate: &str, c: &CanaryState) -> Markup {
    let pct = |t: &Totals, n: u64| {
        if t.attempts == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}% ({n})", 100.0 * n as f64 / t.attempts as f64)
        }
    };
    let p99 = |t: &Totals| {
        t.p99_ms
            .map_or("-".to_owned(), |ms| format!("≤ {ms:.1} ms"))
    };
    let row = |name: &str, f: &dyn Fn(&Totals) -> String| {
        html! { tr { td { b { (name) } } td { (f(&c.incumbent)) } td { (f(&c.candidate)) } } }
    };
    html! {
        table.canary-table {
            thead { tr { th { "For the whole group" } th { "Incumbent " code { (short(incumbent)) } } th { "Candidate " code { (short(candidate)) } } } }
            tbody {
                (row("Attempts", &|t| t.attempts.to_string()))
                (row("Failed (trap, limit)", &|t| pct(t, t.failures)))
                (row("Dead-lettered", &|t| pct(t, t.dead_letters)))
                (row("Retried", &|t| pct(t, t.retries)))
                (row("Handler time p99", &p99))
            }
        }
    }
}

/// `POST /ui/s/{stream}/{group}/rollout`: start a canary, abort it, or replay dead letters.
pub(super) async fn act(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(mut params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    if form_body {
        params.extend(form_urlencoded::parse(&body).into_owned());
    }
    let given = params.get("csrf").map(String::as_str).unwrap_or_default();
    if !super::guard::same_secret(given, &viewer.csrf) {
        tracing::warn!(stream, group, "admin page action refused: bad CSRF token");
        return forbidden("the form is stale or came from another site: reload the page");
    }
    if !viewer.can_act {
        return forbidden("actions need the admin token: log in again");
    }
    let Ok(rollout) = super::super::rollout::find(&state, &stream, &group) else {
        return forbidden("no such subscription on this host");
    };
    let back = |done: String| {
        state.sessions.set_flash(&viewer.id, done);
        Redirect::to("/ui/").into_response()
    };
    let name = params.get("action").map(String::as_str).unwrap_or_default();
    let action = RolloutAction::parse(name);
    let sub = super::super::waiting::subscription(&state, &stream, &group)
        .ok()
        .map(|(sub, _)| sub);
    if action == Some(RolloutAction::AbortCanary) {
        let done = abort_canary(rollout).await;
        if let Some(sub) = sub {
            crate::serve::audit::page_action(sub, &viewer.who, "abort-canary", None, &done).await;
        }
        return back(done);
    }
    if form_body || body.is_empty() {
        return back("choose a component (.wasm) to send".to_owned());
    }
    let Ok(_permit) = state.uploads.clone().try_acquire_owned() else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            Html(message("another upload is in progress; try again when it is done").into_string()),
        )
            .into_response();
    };
    match action {
        Some(RolloutAction::Canary) => {
            let done = start_canary(rollout, &params, body.to_vec()).await;
            if let Some(sub) = sub {
                crate::serve::audit::page_action(sub, &viewer.who, "canary", None, &done).await;
            }
            back(done)
        }
        Some(RolloutAction::Replay) => replay(&state, rollout, &viewer, &params, &body).await,
        _ => back(format!("unknown action `{name}`")),
    }
}

/// Abort the running canary; what came of it, for the banner.
async fn abort_canary(rollout: &Rollout) -> String {
    match rollout.abort(BY).await {
        Ok(record) => format!(
            "canary of {} aborted: every host serves {} again",
            short(&record.candidate),
            short(&record.incumbent)
        ),
        Err(err) => format!("cannot abort the canary: {}", err.explain()),
    }
}

/// Start a canary of `component` with the form's share (`percent`) and window (`for`); what
/// came of it, for the banner.
async fn start_canary(
    rollout: &Rollout,
    params: &HashMap<String, String>,
    component: Vec<u8>,
) -> String {
    let percent = params
        .get("percent")
        .and_then(|p| super::super::rollout::percent(p))
        .unwrap_or(f64::NAN);
    let window = match params
        .get("for")
        .map(|w| w.trim())
        .filter(|w| !w.is_empty())
    {
        None => None,
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) => Some(d),
            Err(err) => return format!("`{text}` is not a duration (e.g. 5m): {err}"),
        },
    };
    match rollout.start(component, percent, window, BY).await {
        Ok(record) => format!(
            "canary started: {}% of deliveries run {} on every host until {}; the hosts promote it or roll it back by themselves",
            record.percent(),
            short(&record.candidate),
            crate::support::when::rfc3339_ms(i64::try_from(record.ends_ms).unwrap_or(i64::MAX))
        ),
        Err(err) => format!("the canary was not started: {}", err.explain()),
    }
}

/// Replay the dead letters the form picks on the uploaded candidate: the result's page.
async fn replay(
    state: &AdminState,
    rollout: &Rollout,
    viewer: &Viewer,
    params: &HashMap<String, String>,
    body: &[u8],
) -> Response {
    let labels = rollout.control().slot().labels().clone();
    let keys: Vec<_> = state
        .subscriptions
        .iter()
        .filter(|s| s.of == labels)
        .map(super::super::AdminSubscription::keys)
        .collect();
    let reason = params
        .get("reason")
        .map(|r| r.trim())
        .filter(|r| !r.is_empty());
    let limit = params
        .get("limit")
        .and_then(|l| l.trim().parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, 1000);
    let requeue = params.get("requeue_acked").is_some_and(|v| v == "true");
    let outcomes = rollout
        .replay(body, &keys, Vec::new(), (reason, limit), requeue)
        .await;
    let page = match outcomes {
        Ok(outcomes) => result(&labels.stream, &labels.group, &outcomes, requeue),
        Err(err) => {
            html! { div.card { p.bad { "The replay did not run: " (err.explain()) } p { a href="/ui/" { "Back to the overview" } } } }
        }
    };
    Html(layout("Replay", Some(viewer), page).into_string()).into_response()
}

/// A replay's page: per dead-letter stream, what the candidate would have done with each.
fn result(stream: &str, group: &str, outcomes: &[ReplayOutcome], requeued: bool) -> Markup {
    html! {
        h1 { "Replay on stream " code { (stream) } ", group " code { (group) } }
        @for o in outcomes {
            div.card {
                h2 { "Dead letters in " code { (o.dead_letters) } }
                p { (o.report.summary()) ". A dry run: nothing was acknowledged, parked or written; outbound HTTP was denied (" (o.report.http_denied) " request(s))." }
                @if let Some(r) = &o.requeued {
                    p.flash { "Requeued " (r.requeued.len()) " dead letter(s) the candidate acknowledged; " (r.gone.len()) " were already gone." }
                } @else if requeued {
                    p { "Nothing was requeued." }
                }
                table {
                    thead { tr { th { "Dead letter" } th { "Origin" } th { "Was dead-lettered for" } th { "The candidate would" } } }
                    tbody {
                        @for item in &o.report.items {
                            tr {
                                td { code { (item.id) } }
                                td { code { (item.origin_id.as_deref().unwrap_or("?")) } }
                                td { (item.reason.as_deref().unwrap_or("-")) }
                                td { (item.would.describe()) }
                            }
                        }
                    }
                }
            }
        }
        p { a href="/ui/" { "Back to the overview" } }
    }
}
