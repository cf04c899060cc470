//! The API over filters and bulk jobs ([`crate::control::operate::jobs`]):
//!
//! - `GET .../matches?of=dead-letters|parked|pending&field=&value=&prefix=&retries_min=&retries_max=
//!   &from=&to=&reason=`: how many entries the filter matches (`matches`, `scanned`, `complete`,
//!   the `first` ids), bounded per request; two counts at a time per host (429 beyond).
//! - `POST .../jobs` with `{"of", "action", "filter": {...}, "expect": n}`: start a job on every
//!   match (202 with its `id`; 409 while another job of the subscription runs, on any host).
//! - `GET .../jobs`: the last job's record (its progress while it runs), and whether it runs;
//!   `DELETE .../jobs`: ask the running job to stop after its batch.
//!
//! The job runs on this host, apart from the request; it records its start and its end in the
//! audit stream, and its progress in Redis after each batch.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;

use super::audit::{Moved, Said};
use super::{AdminState, AdminSubscription};
use crate::control::audit::{self, Record};
use crate::control::operate::OperateError;
use crate::control::operate::filter::{Filter, FilterQuery};
use crate::control::operate::jobs::{self, JobAction, Of, Scope, Walk};
use crate::store::keys::jobs_prefix;

type Refusal = (StatusCode, String);

/// The routes.
pub(super) fn routes() -> Router<AdminState> {
    let base = "/v1/subscriptions/{stream}/{group}";
    Router::new()
        .route(&format!("{base}/matches"), get(matches))
        .route(
            &format!("{base}/jobs"),
            get(last).post(start_call).delete(cancel_call),
        )
}

#[derive(serde::Deserialize)]
struct MatchQuery {
    of: Of,
    #[serde(flatten)]
    filter: FilterQuery,
}

fn invalid(err: OperateError) -> Refusal {
    match err {
        OperateError::Invalid(_) | OperateError::Cursor(_) => {
            (StatusCode::BAD_REQUEST, format!("{err}\n"))
        }
        err => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", crate::support::chain::chain(&err)),
        ),
    }
}

/// Count what a filter matches, two counts at a time per host.
pub(super) async fn count(
    state: &AdminState,
    sub: &AdminSubscription,
    of: Of,
    filter: &Filter,
) -> Result<jobs::Count, Refusal> {
    let Ok(_turn) = state.scans.clone().try_acquire_owned() else {
        return Err((
            StatusCode::TOO_MANY_REQUESTS,
            "two counts are running on this host; try again when they are done\n".into(),
        ));
    };
    let keys = sub.keys();
    let mut conn = sub.conn.clone();
    let scope = Scope::load(&mut conn, &keys, &sub.payload_field)
        .await
        .map_err(invalid)?;
    jobs::count(&mut conn, &scope, of, filter)
        .await
        .map_err(invalid)
}

async fn matches(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    Query(q): Query<MatchQuery>,
) -> Result<axum::Json<jobs::Count>, Refusal> {
    let (sub, _) = super::waiting::subscription(&state, &stream, &group)?;
    let filter = q.filter.parse().map_err(invalid)?;
    Ok(axum::Json(count(&state, sub, q.of, &filter).await?))
}

/// What a job is asked to do.
#[derive(Debug, Clone, serde::Deserialize)]
pub(super) struct JobSpec {
    pub(super) of: Of,
    pub(super) action: JobAction,
    #[serde(default)]
    pub(super) filter: FilterQuery,
    /// The count the operator confirmed, recorded with the job.
    pub(super) expect: Option<u64>,
}

async fn start_call(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    axum::Json(spec): axum::Json<JobSpec>,
) -> Result<
    (
        StatusCode,
        axum::Extension<Said>,
        axum::Json<serde_json::Value>,
    ),
    Refusal,
> {
    let (sub, _) = super::waiting::subscription(&state, &stream, &group)?;
    let (id, said) = start(sub, &spec, "api operator").await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Extension(Said(said)),
        axum::Json(serde_json::json!({ "id": id })),
    ))
}

/// Whether `spec` may run on `sub`: its filter, parsed.
fn checked(sub: &AdminSubscription, spec: &JobSpec) -> Result<Filter, Refusal> {
    if !spec.action.applies_to(spec.of) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "{} does not apply to {}: dead letters are requeued or deleted, parked entries retried now or deleted, pending entries only counted\n",
                spec.action.name(),
                spec.of.name()
            ),
        ));
    }
    if spec.of == Of::Parked && sub.delayed_key.is_none() {
        return Err((
            StatusCode::BAD_REQUEST,
            "this subscription has no delayed set\n".into(),
        ));
    }
    spec.filter.parse().map_err(invalid)
}

/// A new job's record: running, nothing done yet.
fn first_record(
    id: &str,
    what: &str,
    who: &str,
    expect: Option<u64>,
) -> Vec<(&'static str, String)> {
    let now = crate::support::when::now_ms().to_string();
    let mut fields: Vec<(&'static str, String)> = vec![
        ("id", id.to_owned()),
        ("state", "running".into()),
        ("what", what.to_owned()),
        ("who", who.to_owned()),
        ("expect", expect.map_or(String::new(), |n| n.to_string())),
        ("started_ms", now.clone()),
        ("updated_ms", now),
    ];
    for zero in ["scanned", "moved", "skipped", "gone"] {
        fields.push((zero, "0".into()));
    }
    fields.push(("error", String::new()));
    fields.push(("finished_ms", String::new()));
    fields
}

/// Start `spec` on `sub` for `who`: its id and what it is, in words.
pub(super) async fn start(
    sub: &AdminSubscription,
    spec: &JobSpec,
    who: &str,
) -> Result<(String, String), Refusal> {
    let filter = checked(sub, spec)?;
    let prefix = jobs_prefix(&sub.labels.stream, &sub.labels.group);
    let id = super::new_session_key()[..16].to_owned();
    let mut conn = sub.conn.clone();
    let redis = |e: redis::RedisError| (StatusCode::SERVICE_UNAVAILABLE, format!("Redis: {e}\n"));
    if !jobs::take_lease(&mut conn, &prefix, &id)
        .await
        .map_err(redis)?
    {
        let holder = jobs::holder(&mut conn, &prefix).await.map_err(redis)?;
        return Err((
            StatusCode::CONFLICT,
            format!(
                "job {} of this subscription is running; wait for it to end (GET .../jobs)\n",
                holder.unwrap_or_default()
            ),
        ));
    }
    let what = format!(
        "{} {} matching {}",
        spec.action.name(),
        spec.of.name(),
        filter.describe()
    );
    let record = first_record(&id, &what, who, spec.expect);
    jobs::write_record(&mut conn, &prefix, &id, &record, true)
        .await
        .map_err(redis)?;
    let job = Job {
        sub: sub.clone(),
        prefix,
        id: id.clone(),
        of: spec.of,
        action: spec.action,
        filter,
        who: who.to_owned(),
        what: what.clone(),
    };
    tokio::spawn(Arc::new(job).run());
    tracing::info!(stream = %sub.labels.stream, group = %sub.labels.group, job = %id, %what, who, "bulk job started");
    Ok((id, format!("job started: {what}")))
}

/// A job under way on this host.
struct Job {
    sub: AdminSubscription,
    prefix: String,
    id: String,
    of: Of,
    action: JobAction,
    filter: Filter,
    who: String,
    what: String,
}

impl Job {
    async fn run(self: Arc<Self>) {
        let mut conn = self.sub.conn.clone();
        let (state, error, tally) = match self.walk(&mut conn).await {
            Ok((tally, false)) => ("done", String::new(), tally),
            Ok((tally, true)) => ("cancelled", String::new(), tally),
            Err((tally, why)) => ("failed", why, tally),
        };
        let now = crate::support::when::now_ms();
        let _ = jobs::write_record(
            &mut conn,
            &self.prefix,
            &self.id,
            &[
                ("state", state.into()),
                ("error", error.clone()),
                ("finished_ms", now.to_string()),
                ("updated_ms", now.to_string()),
            ],
            false,
        )
        .await;
        let _ = jobs::release_lease(&mut conn, &self.prefix, &self.id).await;
        let result = format!(
            "job {} {state}: {} moved, {} skipped, {} already gone{}",
            self.id,
            tally.moved,
            tally.skipped,
            tally.gone,
            if error.is_empty() {
                String::new()
            } else {
                format!(" ({error})")
            }
        );
        tracing::info!(job = %self.id, "{result}");
        let _ = audit::record(
            &mut conn,
            &Record {
                who: self.who.clone(),
                what: format!("job: {}", self.what),
                stream: self.sub.labels.stream.clone(),
                group: self.sub.labels.group.clone(),
                count: Some(tally.moved),
                result,
            },
        )
        .await;
    }

    /// Walk the whole key, acting batch by batch and recording progress: what it moved and
    /// whether it was cancelled, or why it stopped early. A parked job walks the set again
    /// while a pass acted on something (a sweep or a made-due entry moves the others'
    /// positions), at most [`PASSES`] times; each entry is acted on once.
    async fn walk(
        &self,
        conn: &mut crate::store::redis_conn::RedisHandle,
    ) -> Result<(jobs::Tally, bool), (jobs::Tally, String)> {
        let keys = self.sub.keys();
        let mut total = jobs::Tally::default();
        let failed = |total: jobs::Tally| move |e: OperateError| (total, e.to_string());
        let scope = Scope::load(conn, &keys, &self.sub.payload_field)
            .await
            .map_err(failed(total))?;
        let mut walk = Walk::begin(conn, &scope, self.of)
            .await
            .map_err(failed(total))?;
        for pass in 1..=PASSES {
            let before = total;
            while !walk.done {
                if self.stopped(conn).await.map_err(|why| (total, why))? {
                    return Ok((total, true));
                }
                let items = jobs::next_batch(conn, &scope, self.of, &self.filter, &mut walk)
                    .await
                    .map_err(failed(total))?;
                let tally = jobs::act(conn, &scope, self.action, items, &mut walk)
                    .await
                    .map_err(failed(total))?;
                total.moved += tally.moved;
                total.skipped += tally.skipped;
                total.gone += tally.gone;
                self.progress(conn, &walk, &total).await;
            }
            if self.of != Of::Parked || total == before || pass == PASSES {
                break;
            }
            walk.again();
        }
        Ok((total, false))
    }

    /// Whether to stop now: `Ok(true)` when an operator cancelled it, `Err` when its lease
    /// was lost (another job may run).
    async fn stopped(
        &self,
        conn: &mut crate::store::redis_conn::RedisHandle,
    ) -> Result<bool, String> {
        match jobs::renew_lease(conn, &self.prefix, &self.id).await {
            Ok(true) => {}
            Ok(false) => return Err("its lease was lost".into()),
            Err(e) => return Err(format!("Redis: {e}")),
        }
        jobs::cancelled(conn, &self.prefix, &self.id)
            .await
            .map_err(|e| format!("Redis: {e}"))
    }

    /// Write where the walk stands to the job's record.
    async fn progress(
        &self,
        conn: &mut crate::store::redis_conn::RedisHandle,
        walk: &Walk,
        total: &jobs::Tally,
    ) {
        let _ = jobs::write_record(
            conn,
            &self.prefix,
            &self.id,
            &[
                ("scanned", walk.scanned.to_string()),
                ("moved", total.moved.to_string()),
                ("skipped", total.skipped.to_string()),
                ("gone", total.gone.to_string()),
                ("updated_ms", crate::support::when::now_ms().to_string()),
            ],
            false,
        )
        .await;
    }
}

/// The most passes of a parked job over its set.
const PASSES: usize = 3;

/// The last job's record, with `running` (its lease is held) and, for one that says it runs
/// but whose lease lapsed, `state: interrupted`.
pub(super) async fn last_record(sub: &AdminSubscription) -> Result<serde_json::Value, Refusal> {
    let prefix = jobs_prefix(&sub.labels.stream, &sub.labels.group);
    let mut conn = sub.conn.clone();
    let redis = |e: redis::RedisError| (StatusCode::SERVICE_UNAVAILABLE, format!("Redis: {e}\n"));
    let mut record = jobs::read_record(&mut conn, &prefix).await.map_err(redis)?;
    let holder = jobs::holder(&mut conn, &prefix).await.map_err(redis)?;
    let running = holder.is_some() && holder.as_ref() == record.get("id");
    if !running && record.get("state").is_some_and(|s| s == "running") {
        record.insert("state".into(), "interrupted".into());
    }
    let mut json = serde_json::to_value(&record).unwrap_or_default();
    json["running"] = serde_json::Value::Bool(running);
    for n in ["scanned", "moved", "skipped", "gone", "expect"] {
        if let Some(v) = record.get(n).and_then(|v| v.parse::<u64>().ok()) {
            json[n] = v.into();
        }
    }
    Ok(json)
}

async fn last(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<(axum::Extension<Moved>, axum::Json<serde_json::Value>), Refusal> {
    let (sub, _) = super::waiting::subscription(&state, &stream, &group)?;
    Ok((
        axum::Extension(Moved(0)),
        axum::Json(last_record(sub).await?),
    ))
}

/// Ask the subscription's running job to stop after its current batch: whether one ran.
pub(super) async fn cancel(sub: &AdminSubscription) -> Result<Option<String>, Refusal> {
    let prefix = jobs_prefix(&sub.labels.stream, &sub.labels.group);
    let mut conn = sub.conn.clone();
    let redis = |e: redis::RedisError| (StatusCode::SERVICE_UNAVAILABLE, format!("Redis: {e}\n"));
    let Some(id) = jobs::holder(&mut conn, &prefix).await.map_err(redis)? else {
        return Ok(None);
    };
    jobs::write_record(&mut conn, &prefix, &id, &[("cancel", "1".into())], false)
        .await
        .map_err(redis)?;
    Ok(Some(id))
}

async fn cancel_call(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<(axum::Extension<Said>, axum::Json<serde_json::Value>), Refusal> {
    let (sub, _) = super::waiting::subscription(&state, &stream, &group)?;
    match cancel(sub).await? {
        Some(id) => Ok((
            axum::Extension(Said(format!("job {id} asked to stop"))),
            axum::Json(serde_json::json!({ "cancelled": id })),
        )),
        None => Err((
            StatusCode::NOT_FOUND,
            "no job of this subscription runs\n".into(),
        )),
    }
}
