//! Which subscriptions a listing shows, a page at a time: `GET /v1/subscriptions` and the
//! web page's overview, so that a host of thousands answers a page, not every subscription.
//!
//! The query: `q` (a substring of the stream or the group, at most [`MAX_QUERY`] bytes),
//! `stream` and `group` (exact), `offset`, and `limit` (at most [`MAX_LIMIT`]). A
//! subscription's flow state and partitions are found through an index made once, so a
//! listing costs time in proportion to the subscriptions it looks at, never their square.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::StatusCode;

use super::AdminSubscription;
use crate::control::swap::SwapControl;
use crate::observe::metrics::SubLabels;

/// The most subscriptions one listing answers.
pub const MAX_LIMIT: usize = 500;
/// The longest `q`, `stream` or `group` accepted, in bytes.
pub const MAX_QUERY: usize = 1024;

/// What a listing asks for.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct ListQuery {
    /// A substring of the stream or the group.
    pub q: Option<String>,
    /// Only this stream.
    pub stream: Option<String>,
    /// Only this group.
    pub group: Option<String>,
    /// Skip this many of those that match.
    pub offset: Option<usize>,
    /// Answer at most this many ([`MAX_LIMIT`] when absent or larger).
    pub limit: Option<usize>,
}

impl ListQuery {
    /// Refuse a query longer than [`MAX_QUERY`]: nothing a subscription is named needs more.
    pub fn check(&self) -> Result<(), (StatusCode, String)> {
        for (name, value) in [
            ("q", &self.q),
            ("stream", &self.stream),
            ("group", &self.group),
        ] {
            if value.as_ref().is_some_and(|v| v.len() > MAX_QUERY) {
                return Err((
                    StatusCode::BAD_REQUEST,
                    format!("`{name}` is longer than {MAX_QUERY} bytes\n"),
                ));
            }
        }
        Ok(())
    }

    /// Whether a subscription is one the query asks for.
    pub(super) fn matches(&self, labels: &SubLabels) -> bool {
        let exact = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        exact(&self.stream, &labels.stream)
            && exact(&self.group, &labels.group)
            && self.q.as_deref().is_none_or(|q| {
                q.is_empty() || labels.stream.contains(q) || labels.group.contains(q)
            })
    }

    /// The page's size: `limit`, at most [`MAX_LIMIT`] and at most `cap`.
    pub fn limit(&self, cap: usize) -> usize {
        self.limit.unwrap_or(cap).min(cap).min(MAX_LIMIT)
    }
}

/// A page of a listing.
pub(super) struct Page {
    /// The subscriptions shown, in order.
    pub shown: Vec<Arc<SwapControl>>,
    /// How many match the query.
    pub matched: usize,
    /// How many the host has.
    pub total: usize,
    /// Where the page starts among those that match.
    pub offset: usize,
}

/// Each subscription's partitions (or itself), by its labels: made once when the server
/// starts.
#[derive(Default)]
pub(super) struct Index {
    parts: HashMap<SubLabels, Vec<usize>>,
}

impl Index {
    /// Index `subscriptions` by the subscription each belongs to.
    pub fn new(subscriptions: &[AdminSubscription]) -> Self {
        let mut parts: HashMap<SubLabels, Vec<usize>> = HashMap::new();
        for (i, sub) in subscriptions.iter().enumerate() {
            parts.entry(sub.of.clone()).or_default().push(i);
        }
        Self { parts }
    }

    /// The partitions of the subscription `labels` (one, itself, when not partitioned).
    pub fn parts<'a>(
        &self,
        subscriptions: &'a [AdminSubscription],
        labels: &SubLabels,
    ) -> Vec<&'a AdminSubscription> {
        self.parts
            .get(labels)
            .map(|parts| parts.iter().filter_map(|&i| subscriptions.get(i)).collect())
            .unwrap_or_default()
    }

    /// The first partition of the subscription `labels` (where its flow state and
    /// connection are).
    pub fn first<'a>(
        &self,
        subscriptions: &'a [AdminSubscription],
        labels: &SubLabels,
    ) -> Option<&'a AdminSubscription> {
        self.parts
            .get(labels)
            .and_then(|parts| parts.first())
            .and_then(|&i| subscriptions.get(i))
    }
}

/// The page of `controls` that `query` asks for, `cap` at most; with `needs_look`, those it
/// says yes to come first (each side in the configured order).
pub(super) fn page(
    controls: &[Arc<SwapControl>],
    query: &ListQuery,
    cap: usize,
    needs_look: Option<&dyn Fn(&SubLabels) -> bool>,
) -> Page {
    let matching = controls.iter().filter(|c| query.matches(c.slot().labels()));
    let ordered: Vec<&Arc<SwapControl>> = match needs_look {
        Some(look) => {
            let (first, rest): (Vec<_>, Vec<_>) = matching.partition(|c| look(c.slot().labels()));
            first.into_iter().chain(rest).collect()
        }
        None => matching.collect(),
    };
    let matched = ordered.len();
    let offset = query.offset.unwrap_or(0).min(matched);
    let shown = ordered
        .into_iter()
        .skip(offset)
        .take(query.limit(cap))
        .cloned()
        .collect();
    Page {
        shown,
        matched,
        total: controls.len(),
        offset,
    }
}
