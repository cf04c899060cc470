//! `POST /v1/subscriptions/{stream}/{group}/scheduled`: send an entry for later, as `sluice
//! send --at/--in` does ([`crate::control::operate::schedule`]). `{stream}` is a partition's
//! stream on a partitioned subscription. The body names when (`at`, RFC 3339; `at_ms`, epoch
//! ms; or `in`, a duration like `90s`) and what (`payload`, a JSON value written as the
//! subscription's payload field, or `fields`, a map of field names to text); the answer is the
//! entry's id and due time. Listed, retried now and deleted with the parked retries
//! (`.../parked`), where `kind` says `scheduled`.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;

use super::AdminState;
use crate::control::operate::schedule::{self, When};

/// The most fields one scheduled entry may have (the body's size is bounded too).
pub const MAX_FIELDS: usize = 1_000;

/// The call.
pub(super) fn routes() -> Router<AdminState> {
    Router::new().route(
        "/v1/subscriptions/{stream}/{group}/scheduled",
        post(schedule_one),
    )
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    at: Option<String>,
    at_ms: Option<i64>,
    #[serde(rename = "in")]
    after: Option<String>,
    payload: Option<serde_json::Value>,
    fields: Option<BTreeMap<String, String>>,
}

/// A refusal: its status and why.
type Refused = (StatusCode, String);
/// An entry's fields, names and values as bytes.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn bad(why: impl std::fmt::Display) -> Refused {
    (StatusCode::BAD_REQUEST, format!("{why}\n"))
}

impl Body {
    /// When, as exactly one of `at`, `at_ms` and `in` says.
    fn when(&self) -> Result<When, Refused> {
        match (&self.at, self.at_ms, &self.after) {
            (Some(at), None, None) => chrono::DateTime::parse_from_rfc3339(at)
                .map(|t| When::At(t.timestamp_millis()))
                .map_err(|e| {
                    bad(format!(
                        "`at` {at:?}: {e} (write RFC 3339 with its zone, like 2026-12-24T18:00:00Z)"
                    ))
                }),
            (None, Some(ms), None) if ms > 0 => Ok(When::At(ms)),
            (None, Some(ms), None) => Err(bad(format!("`at_ms` must be positive, not {ms}"))),
            (None, None, Some(after)) => {
                humantime::parse_duration(after).map(When::In).map_err(|e| {
                    bad(format!(
                        "`in` {after:?}: {e} (write a duration like 90s or 2h)"
                    ))
                })
            }
            _ => Err(bad(
                "name exactly one of `at` (RFC 3339), `at_ms` and `in` (a duration)",
            )),
        }
    }

    /// The entry's fields, as exactly one of `payload` and `fields` says.
    fn fields(self, payload_field: &str) -> Result<Fields, Refused> {
        match (self.payload, self.fields) {
            (Some(payload), None) => Ok(vec![(
                payload_field.as_bytes().to_vec(),
                payload.to_string().into_bytes(),
            )]),
            (None, Some(fields)) if fields.is_empty() => Err(bad("`fields` is empty")),
            (None, Some(fields)) if fields.len() > MAX_FIELDS => Err(bad(format!(
                "{} fields; a scheduled entry has at most {MAX_FIELDS}",
                fields.len()
            ))),
            (None, Some(fields)) => Ok(fields
                .into_iter()
                .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
                .collect()),
            _ => Err(bad(
                "name exactly one of `payload` (JSON) and `fields` (names to text)",
            )),
        }
    }
}

async fn schedule_one(
    State(state): State<AdminState>,
    Path((stream, group)): Path<(String, String)>,
    axum::Json(body): axum::Json<Body>,
) -> Result<(StatusCode, axum::Json<serde_json::Value>), Refused> {
    let (sub, _) = super::waiting::subscription(&state, &stream, &group)?;
    let Some(set) = sub.delayed_key.as_deref() else {
        return Err((
            StatusCode::CONFLICT,
            format!(
                "stream `{stream}` has no delayed-retry set: entries sent for later wait there\n"
            ),
        ));
    };
    let when = body.when()?;
    let fields = body.fields(&sub.payload_field)?;
    let target = schedule::Target {
        stream: &stream,
        group: &group,
        set,
        ttl: sub.delayed_ttl,
    };
    let mut conn = sub.conn.clone();
    let done = schedule::schedule(&mut conn, target, when, &fields)
        .await
        .map_err(|err| {
            // The script's own refusals name themselves; anything else is Redis's.
            if err.to_string().contains("schedule:") {
                (StatusCode::UNPROCESSABLE_ENTITY, format!("{err}\n"))
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "Redis: {}\n",
                        crate::store::redis_conn::ErrorClass::of(&err).describe()
                    ),
                )
            }
        })?;
    // This host's timer learns the new due time now (others from their doorbell or reads).
    if let Some(delayed) = &sub.delayed {
        delayed.sweep_soon();
    }
    tracing::info!(
        stream,
        group,
        id = %done.id,
        due_ms = done.due_ms,
        "entry scheduled through the admin API"
    );
    Ok((
        StatusCode::CREATED,
        axum::Json(serde_json::json!({
            "id": done.id,
            "due_ms": done.due_ms,
            "due": crate::support::when::rfc3339_ms(done.due_ms),
            "now_ms": done.now_ms,
        })),
    ))
}
