//! `GET /v1/scaling?lead=&list=&stream=&group=`: the scaling signal of
//! [`crate::store::scaling`], for KEDA's `metrics-api` scaler (`valueLocation: wake`), on a
//! host's admin server and on `sluice scaler`'s (see [`scaler`]); and its two Prometheus
//! series, set at scrape time.

pub(crate) mod scaler;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;

use crate::observe::metrics::{Metrics, SubLabels};
use crate::store::scaling::{Board, Reading, Target, reply};

/// The longest lead a caller may ask for: a deployment woken a day early is a mistake.
const MAX_LEAD: Duration = Duration::from_secs(86_400);

/// The query of `GET /v1/scaling`.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct ScalingQuery {
    /// Wake this long before the next parked entry is due ("60s"; 0 by default).
    lead: Option<String>,
    /// List each subscription (true by default).
    list: Option<bool>,
    /// Only this stream.
    stream: Option<String>,
    /// Only this group.
    group: Option<String>,
}

/// The signal of `board`, as the query asks.
pub(crate) async fn answer(
    board: &Board,
    q: &ScalingQuery,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    let lead = match q.lead.as_deref() {
        None | Some("0") => Duration::ZERO,
        Some(text) => humantime::parse_duration(text)
            .ok()
            .filter(|d| *d <= MAX_LEAD)
            .ok_or_else(|| {
                (
                    StatusCode::BAD_REQUEST,
                    format!("lead `{text}` is not a duration of at most a day (write e.g. 60s)\n"),
                )
            })?,
    };
    let readings = board.readings().await;
    Ok(axum::Json(reply(
        board.targets(),
        &readings,
        lead,
        q.list.unwrap_or(true),
        (q.stream.as_deref(), q.group.as_deref()),
    )))
}

/// The host's route.
pub(super) async fn scaling_handler(
    State(state): State<super::AdminState>,
    Query(q): Query<ScalingQuery>,
) -> Result<axum::Json<serde_json::Value>, (StatusCode, String)> {
    answer(&state.scaling, &q).await
}

/// The board of a host's subscriptions (each partition its own).
pub(super) fn board_of(subscriptions: &[super::AdminSubscription]) -> Arc<Board> {
    Arc::new(Board::new(
        subscriptions
            .iter()
            .map(|s| Target {
                stream: s.labels.stream.clone(),
                group: s.labels.group.clone(),
                delayed: s.delayed_key.clone(),
                lane: s.lane.clone(),
                conn: s.conn.clone(),
            })
            .collect(),
    ))
}

/// Set the two series from `readings`: per subscription, or their sums under the host's
/// labels (`labels_of` gives each target's labels).
pub(crate) fn publish(metrics: &Metrics, labels: &[SubLabels], readings: &[Option<Reading>]) {
    let one = |labels: &SubLabels, needs: u64, next: Option<f64>| {
        metrics
            .scaling_needs_host_now
            .get_or_create(labels)
            .set(i64::try_from(needs).unwrap_or(i64::MAX));
        match next {
            Some(next) => {
                metrics.scaling_next_due.get_or_create(labels).set(next);
            }
            None => {
                metrics.scaling_next_due.remove(labels);
            }
        }
    };
    if metrics.per_subscription() {
        for (labels, reading) in labels.iter().zip(readings) {
            if let Some(r) = reading {
                one(labels, r.needs_host_now(), r.next_due_seconds());
            }
        }
        return;
    }
    let (needs, next) = crate::store::scaling::totals(readings.iter().flatten());
    one(&metrics.series(&Metrics::labels("", "")), needs, next);
}
