//! One dead letter, decoded: what it says of the entry and of its bookkeeping, whose it is,
//! and how it is shown (JSON for the CLI and the admin API, its trace, when it was written).
//! Reading it from the stream's fields is [`super::decode`]'s.

use crate::store::keys::{Secret, SubscriptionKeys};

/// Whose dead letters a listing shows and a requeue trusts: a subscription's stream, group and
/// delayed set, and its stream's secret (which verifies seals).
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The subscription's stream.
    pub stream: &'a str,
    /// Its group.
    pub group: &'a str,
    /// Its delayed set, if any.
    pub set: Option<&'a str>,
    /// Its stream's secret, if one exists.
    pub secret: Option<&'a Secret>,
    /// The dead-letter stream the letters are read from.
    pub key: &'a str,
}

impl<'a> Owner<'a> {
    /// The owner `keys` describe, with `secret`.
    pub fn of(keys: &'a SubscriptionKeys, secret: Option<&'a Secret>) -> Self {
        Self {
            stream: &keys.stream,
            group: &keys.group,
            set: keys.delayed.as_deref(),
            secret,
            key: &keys.dead_letter,
        }
    }
}

/// Which kind of dead letter an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// A delivery the handler or the host gave up on.
    Delivery,
    /// A parked retry kept raw (its member), readable or not.
    Member,
    /// Not written by Sluice.
    Foreign,
}

/// One dead letter, decoded.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Its id in the dead-letter stream (which also says when it was written).
    pub id: String,
    /// What kind of dead letter it is.
    pub shape: Shape,
    /// Why it was given up on.
    pub reason: Option<String>,
    /// The id of the entry the producer first added.
    pub origin_id: Option<String>,
    /// The id of the entry that was given up on (the origin or a re-added copy of it).
    pub entry_id: Option<String>,
    /// Parks it went through.
    pub retry_count: Option<u32>,
    /// Redis's delivery counter when it was given up on.
    pub delivery_count: Option<u64>,
    /// The entry's own fields, unpacked (for a member: the member's fields, when readable).
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// Why it cannot be requeued, if it cannot.
    pub not_requeueable: Option<String>,
    /// The subscription it came from, as recorded (stream, group), when it says.
    pub origin: Option<(String, String)>,
    /// Whether it belongs to the subscription it was read for (or no subscription wrote it).
    pub ours: bool,
    /// Whether its origin id can be trusted: the host's seal verifies, or the earlier release
    /// wrote it before this one took over. A requeue keeps only a trusted origin id.
    pub trusted: bool,
    /// The traceback of the failure that dead-lettered it, when the handler gave one.
    pub trace: Option<String>,
}

impl DeadLetter {
    /// A letter `id` of `shape` with `fields` and nothing else known of it (not ours, not
    /// trusted, requeueable): what the decoders start from.
    pub(super) fn bare(id: String, shape: Shape, fields: Vec<(Vec<u8>, Vec<u8>)>) -> Self {
        Self {
            id,
            shape,
            reason: None,
            origin_id: None,
            entry_id: None,
            retry_count: None,
            delivery_count: None,
            fields,
            not_requeueable: None,
            origin: None,
            ours: false,
            trusted: false,
            trace: None,
        }
    }

    /// The trace its deliveries were in (see [`crate::observe::telemetry::context`]), when it says
    /// whose it was.
    pub fn trace_id(&self) -> Option<String> {
        let (stream, group) = self.origin.as_ref()?;
        let origin = self.origin_id.as_deref().or(self.entry_id.as_deref())?;
        Some(crate::observe::telemetry::context::trace_id_of(
            stream,
            group,
            origin,
            &self.fields,
        ))
    }

    /// When it was written (epoch ms, from its id).
    pub fn written_ms(&self) -> Option<i64> {
        self.id.split('-').next()?.parse().ok()
    }

    /// The dead letter as one JSON object (CLI `--json`, admin API), naming the `stream` it
    /// belongs to.
    pub fn to_json(&self, stream: &str) -> serde_json::Value {
        let trace_id = self.trace_id();
        serde_json::json!({
            "stream": stream,
            "id": self.id,
            "written": self.written_ms().map(super::super::format_ms),
            "shape": self.shape,
            "reason": self.reason,
            "origin_id": self.origin_id,
            "entry_id": self.entry_id,
            "retry_count": self.retry_count,
            "delivery_count": self.delivery_count,
            "requeueable": self.not_requeueable.is_none(),
            "not_requeueable": self.not_requeueable,
            "origin_trusted": self.trusted,
            "trace": self.trace,
            "trace_link": trace_id.as_deref().and_then(crate::observe::telemetry::trace_link),
            "trace_id": trace_id,
            "fields": super::super::fields_json(&self.fields),
        })
    }

    /// Whether its reason contains `text` (case-insensitive).
    pub fn reason_contains(&self, text: &str) -> bool {
        self.reason
            .as_deref()
            .is_some_and(|r| r.to_lowercase().contains(&text.to_lowercase()))
    }
}
