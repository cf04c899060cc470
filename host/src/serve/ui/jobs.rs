//! The page's filters and bulk jobs, and the audit trail:
//! - `GET /ui/s/{stream}/{group}/find?of=&field=&value=&prefix=&retries_min=&retries_max=
//!   &from=&to=&reason=`: the filter form, how many entries it matches (bounded like the API's
//!   count) and the first of them, and the form that acts on every match;
//! - `POST .../jobs`: first a confirmation that states the count and the filter, then (with
//!   `confirm=yes`) the job, run on the server ([`crate::serve::jobs`]);
//! - `GET .../job`: the last job's progress (the page refreshes itself while it runs), a button
//!   that stops it, and its result;
//! - `GET /ui/audit`: the newest records of the audit stream.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::chrome::{entry_link, flash, layout, sub_link};
use super::{AdminState, Viewer, forbidden, subscription};
use crate::control::operate::filter::FilterQuery;
use crate::control::operate::jobs::{JobAction, Of};
use crate::serve::jobs::{JobSpec, count, last_record, start};

/// The find page's query.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct FindQuery {
    of: Option<Of>,
    #[serde(flatten)]
    filter: FilterQuery,
}

/// The filter's inputs, filled with what was asked.
fn filter_inputs(q: &FilterQuery) -> Markup {
    let v = |t: &Option<String>| t.clone().unwrap_or_default();
    html! {
        label { "field " input type="text" name="field" placeholder="/customer/id" value=(v(&q.field)) size="14"; }
        " " label { "= " input type="text" name="value" value=(v(&q.value)) size="10"; }
        " " label { "or starts with " input type="text" name="prefix" value=(v(&q.prefix)) size="8"; }
        " " label { "retries " input type="number" name="retries_min" min="0" value=(v(&q.retries_min)) style="width:4em"; }
        "–" input type="number" name="retries_max" min="0" value=(v(&q.retries_max)) style="width:4em";
        " " label { "from " input type="text" name="from" placeholder="RFC 3339 or ms" value=(v(&q.from)) size="12"; }
        " " label { "to " input type="text" name="to" value=(v(&q.to)) size="12"; }
        " " label { "reason has " input type="text" name="reason" value=(v(&q.reason)) size="10"; }
    }
}

/// The filter again, as hidden fields of a form that acts on it.
fn hidden_filter(q: &FilterQuery) -> Markup {
    let pairs = [
        ("field", &q.field),
        ("value", &q.value),
        ("prefix", &q.prefix),
        ("retries_min", &q.retries_min),
        ("retries_max", &q.retries_max),
        ("from", &q.from),
        ("to", &q.to),
        ("reason", &q.reason),
    ];
    html! {
        @for (name, value) in pairs {
            @if let Some(value) = value { input type="hidden" name=(name) value=(value); }
        }
    }
}

/// `GET .../find`: the filter, its count and first matches, and the bulk form.
pub(super) async fn find_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<FindQuery>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let of = q.of.unwrap_or(Of::DeadLetters);
    let counted = match q.filter.parse() {
        Ok(filter) if q.of.is_some() => Some(
            count(&state, sub, of, &filter)
                .await
                .map(|c| (c, filter.describe())),
        ),
        Ok(_) => None,
        Err(err) => Some(Err((axum::http::StatusCode::BAD_REQUEST, err.to_string()))),
    };
    let body = html! {
        h1 { "Find in " (keys.stream) " · " (keys.group) }
        form.card method="get" action=(sub_link(&keys, "find")) data-find {
            select name="of" {
                option value="dead-letters" selected[of == Of::DeadLetters] { "dead letters" }
                @if sub.delayed_key.is_some() {
                    option value="parked" selected[of == Of::Parked] { "parked entries" }
                }
                option value="pending" selected[of == Of::Pending] { "pending entries" }
            }
            " " (filter_inputs(&q.filter)) " "
            button.primary type="submit" { "Count matches" }
        }
        @match &counted {
            None => {}
            Some(Err((_, why))) => { p.bad { (why) } }
            Some(Ok((c, described))) => {
                div.card data-matches=(c.matches) {
                    p {
                        strong { (c.matches) } " match" @if c.matches != 1 { "es" } " of " (described)
                        @if c.complete { " (all " (c.scanned) " looked at)" }
                        @else { " in the first " (c.scanned) " looked at: there may be more (a count stops after "
                            (crate::control::operate::jobs::MAX_SCAN) " entries or "
                            (crate::control::operate::jobs::SCAN_TIME.as_secs()) " s; a job walks them all)" }
                    }
                    @if !c.first.is_empty() {
                        p.muted { "First: "
                            @for id in &c.first { a href=(entry_link(&keys, id)) { (id) } " " }
                        }
                    }
                    @if viewer.can_act && c.matches > 0 && of != Of::Pending {
                        form method="post" action=(sub_link(&keys, "jobs")) data-bulk {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            input type="hidden" name="of" value=(of.param());
                            (hidden_filter(&q.filter))
                            select name="action" {
                                @if of == Of::DeadLetters { option value="requeue" { "requeue" } }
                                @else { option value="retry-now" { "retry now" } }
                                option value="delete" { "delete" }
                            }
                            " " button type="submit" { "Act on every match…" }
                        }
                    }
                }
            }
        }
    };
    Html(layout("Find", Some(&viewer), body).into_string()).into_response()
}

/// `POST .../jobs`: the confirmation (stating the count), or with `confirm=yes` the job.
pub(super) async fn jobs_post(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let field = |n: &str| form.get(n).cloned().filter(|v| !v.is_empty());
    if !super::guard::same_secret(&field("csrf").unwrap_or_default(), &viewer.csrf) {
        return forbidden("the form is stale or came from another site: reload the page");
    }
    if !viewer.can_act {
        return forbidden(if viewer.role == super::Role::Reader {
            "this session logged in with the read-only token: it may look, not act"
        } else {
            "actions need the admin token: log in again"
        });
    }
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    if field("stop").as_deref() == Some("yes") {
        let said = match crate::serve::jobs::cancel(sub).await {
            Ok(Some(id)) => format!("job {id} asked to stop after its batch"),
            Ok(None) => "no job was running".to_owned(),
            Err((code, why)) => {
                return (code, Html(super::chrome::message(&why).into_string())).into_response();
            }
        };
        crate::serve::audit::page_action(sub, &viewer.who, "cancel job", None, &said).await;
        state.sessions.set_flash(&viewer.id, said);
        return Redirect::to(&sub_link(&keys, "job")).into_response();
    }
    let filter = FilterQuery {
        field: field("field"),
        value: field("value"),
        prefix: field("prefix"),
        retries_min: field("retries_min"),
        retries_max: field("retries_max"),
        from: field("from"),
        to: field("to"),
        reason: field("reason"),
    };
    let text = |n: &str| serde_json::Value::String(field(n).unwrap_or_default());
    let (Ok(of), Ok(action)) = (
        serde_json::from_value::<Of>(text("of")),
        serde_json::from_value::<JobAction>(text("action")),
    ) else {
        return forbidden("the form names no known list or action");
    };
    let spec = JobSpec {
        of,
        action,
        filter: filter.clone(),
        expect: field("expect").and_then(|n| n.parse().ok()),
    };
    if field("confirm").as_deref() != Some("yes") {
        return confirm(&state, &viewer, sub, &keys, spec).await;
    }
    match start(sub, &spec, &viewer.who).await {
        Ok((_, said)) => {
            crate::serve::audit::page_action(sub, &viewer.who, "bulk job", spec.expect, &said)
                .await;
            state.sessions.set_flash(&viewer.id, said);
            Redirect::to(&sub_link(&keys, "job")).into_response()
        }
        Err((code, why)) => {
            (code, Html(super::chrome::message(&why).into_string())).into_response()
        }
    }
}

/// The confirmation: what the job will do, to how many, and the button that starts it.
async fn confirm(
    state: &AdminState,
    viewer: &Viewer,
    sub: &crate::serve::AdminSubscription,
    keys: &crate::store::keys::SubscriptionKeys,
    spec: JobSpec,
) -> Response {
    let counted = match spec.filter.parse() {
        Ok(filter) => count(state, sub, spec.of, &filter)
            .await
            .map(|c| (c, filter.describe())),
        Err(err) => Err((axum::http::StatusCode::BAD_REQUEST, err.to_string())),
    };
    let (c, described) = match counted {
        Ok(found) => found,
        Err((code, why)) => {
            return (code, Html(super::chrome::message(&why).into_string())).into_response();
        }
    };
    let verb = match spec.action {
        JobAction::Requeue => "requeue",
        JobAction::RetryNow => "retry now",
        JobAction::Delete => "delete for good",
    };
    let what = spec.of.name();
    let body = html! {
        div.card data-confirm=(c.matches) {
            h1 { "Confirm" }
            p { "This will " strong { (verb) " " (c.matches) @if !c.complete { " or more" } " " (what) }
                " of " (keys.stream) " · " (keys.group) " matching " (described) "." }
            form method="post" action=(sub_link(keys, "jobs")) {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="of" value=(spec.of.param());
                input type="hidden" name="action" value=(spec.action.name());
                input type="hidden" name="expect" value=(c.matches);
                input type="hidden" name="confirm" value="yes";
                (hidden_filter(&spec.filter))
                button.primary.danger type="submit" { "Yes, " (verb) " " (c.matches) " entries" }
                " " a href=(sub_link(keys, "find")) { "Cancel" }
            }
        }
    };
    Html(layout("Confirm", Some(viewer), body).into_string()).into_response()
}

/// `GET .../job`: the last job, refreshing itself while it runs.
pub(super) async fn job_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Path((stream, group)): Path<(String, String)>,
) -> Response {
    let (sub, keys) = match subscription(&state, &stream, &group) {
        Ok(found) => found,
        Err(page) => return *page,
    };
    let record = match last_record(sub).await {
        Ok(r) => r,
        Err((code, why)) => {
            return (code, Html(super::chrome::message(&why).into_string())).into_response();
        }
    };
    let text = |n: &str| match &record[n] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    let running = record["running"] == true;
    let done = state.sessions.take_flash(&viewer.id);
    let body = html! {
        (flash(done.as_deref()))
        h1 { "Bulk job on " (keys.stream) " · " (keys.group) }
        @if text("id").is_empty() { p.muted { "No job has run on this subscription." } }
        @else {
            div.card data-job-state=(text("state")) data-job-moved=(text("moved")) {
                p { strong { (text("state")) } " · " (text("what")) }
                p { "looked at " strong { (text("scanned")) } ", moved " strong { (text("moved")) }
                    ", skipped " (text("skipped")) ", already gone " (text("gone"))
                    @if !text("expect").is_empty() { " (confirmed for " (text("expect")) ")" } }
                p.muted { "by " (text("who")) ", job " (text("id")) }
                @if !text("error").is_empty() { p.bad { (text("error")) } }
                @if running {
                    p.muted data-refresh="1" { "Running: this page refreshes every few seconds." }
                    @if viewer.can_act {
                        form method="post" action=(sub_link(&keys, "jobs")) {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            input type="hidden" name="stop" value="yes";
                            button type="submit" { "Stop the job" }
                        }
                    }
                }
            }
        }
        p { a href=(sub_link(&keys, "find")) { "Find more" } " · " a href="/ui/audit" { "Audit trail" } }
    };
    Html(layout("Job", Some(&viewer), body).into_string()).into_response()
}

/// `GET /ui/audit`: who did what, newest first.
pub(super) async fn audit_page(
    State(state): State<AdminState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
) -> Response {
    let records = crate::serve::audit::recent(&state, 200).await;
    let body = html! {
        h1 { "Audit trail" }
        @match &records {
            Err(err) => { p.bad { "Redis: " (err) } }
            Ok(records) => {
                p.muted { "Every action taken through the admin API and this page; the newest "
                    (records.len()) " of at most " (crate::control::audit::KEEP) " kept." }
                table data-audit {
                    tr { th { "when" } th { "who" } th { "what" } th { "subscription" } th { "count" } th { "result" } }
                    @for r in records {
                        tr {
                            td { (crate::support::when::rfc3339_ms(r.at_ms)) }
                            td { (r.record.who) }
                            td { (r.record.what) }
                            td { (r.record.stream) " · " (r.record.group) }
                            td { @if let Some(n) = r.record.count { (n) } }
                            td { (r.record.result) }
                        }
                    }
                }
            }
        }
    };
    Html(layout("Audit", Some(&viewer), body).into_string()).into_response()
}
