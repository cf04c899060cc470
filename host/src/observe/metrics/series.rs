//! Every metric family the host exports, in one table: [`super::Metrics::new`] registers each
//! with its row's help text, and the book's metrics reference
//! (`docs/src/reference/metrics.md`) is written from the same rows: a test fails when a family
//! has no row, a row no family, or the page differs from the table (`SLUICE_BLESS=1` rewrites
//! the page). Every family carries `stream` and `group` (empty when summed per host, see
//! [`super`]); `labels` names the others.

/// What kind of Prometheus metric a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up; exported with a `_total` suffix.
    Counter,
    /// A value now (many are sampled when `/metrics` is scraped).
    Gauge,
    /// Observations in buckets.
    Histogram,
}

/// One metric family: its name (after the `sluice_` prefix), kind, labels besides `stream`
/// and `group`, and what it counts (the `# HELP` line and the book's row).
#[derive(Debug)]
pub struct Series {
    /// The registered name, without the `sluice_` prefix or a counter's `_total`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Labels besides `stream` and `group`, comma-separated ("" for none).
    pub labels: &'static str,
    /// What it counts.
    pub help: &'static str,
}

/// Every family, in the order `/metrics` lists them.
pub const SERIES: &[Series] = &[
    Series {
        name: "deliveries",
        kind: Kind::Counter,
        labels: "outcome",
        help: "Handler results: `ack`, `retry`, `dead_letter`, `trap`, `limit`",
    },
    Series {
        name: "handler_duration_seconds",
        kind: Kind::Histogram,
        labels: "",
        help: "Time in the handler per delivery",
    },
    Series {
        name: "in_flight",
        kind: Kind::Gauge,
        labels: "",
        help: "Deliveries being handled now",
    },
    Series {
        name: "pending_entries",
        kind: Kind::Gauge,
        labels: "",
        help: "The group's pending-entries list (scrape time), its retry lane's included",
    },
    Series {
        name: "consumer_lag",
        kind: Kind::Gauge,
        labels: "",
        help: "Entries not yet read by the group (scrape time), its retry lane's included",
    },
    Series {
        name: "parked_entries",
        kind: Kind::Gauge,
        labels: "",
        help: "Entries waiting in the delayed-retry set (scrape time)",
    },
    Series {
        name: "parked_oldest_due_seconds",
        kind: Kind::Gauge,
        labels: "",
        help: "Due time of the earliest parked entry, Unix seconds",
    },
    Series {
        name: "dead_letter_entries",
        kind: Kind::Gauge,
        labels: "",
        help: "Length of the dead-letter stream (scrape time)",
    },
    Series {
        name: "scaling_needs_host_now",
        kind: Kind::Gauge,
        labels: "",
        help: "Entries that need a host now: unread, pending, and parked entries already due (scrape time, Redis's clock; what `GET /v1/scaling` and `sluice scaler` serve)",
    },
    Series {
        name: "scaling_next_due_seconds",
        kind: Kind::Gauge,
        labels: "",
        help: "Seconds until the next parked retry or scheduled entry is due, 0 when one is; absent when none is parked",
    },
    Series {
        name: "retention_trimmed",
        kind: Kind::Counter,
        labels: "",
        help: "Stream entries trimmed by retention (acknowledged by every group)",
    },
    Series {
        name: "retention_blocked",
        kind: Kind::Counter,
        labels: "",
        help: "Retention runs that left the stream over `max_len` because groups still need the rest",
    },
    Series {
        name: "stream_length",
        kind: Kind::Gauge,
        labels: "",
        help: "Entries in the stream (scrape time)",
    },
    Series {
        name: "stream_bytes",
        kind: Kind::Gauge,
        labels: "",
        help: "The stream's memory, MEMORY USAGE sampled (scrape time)",
    },
    Series {
        name: "stream_oldest_age_seconds",
        kind: Kind::Gauge,
        labels: "",
        help: "Age of the stream's oldest entry (scrape time)",
    },
    Series {
        name: "sweep_moved",
        kind: Kind::Histogram,
        labels: "",
        help: "Entries moved back per sweep pass",
    },
    Series {
        name: "sweep_duration_seconds",
        kind: Kind::Histogram,
        labels: "",
        help: "Duration of a sweep pass",
    },
    Series {
        name: "retry_lateness_seconds",
        kind: Kind::Histogram,
        labels: "",
        help: "Handled time minus due time of a parked retry, both by the Redis server's clock",
    },
    Series {
        name: "retry_over_ttl",
        kind: Kind::Counter,
        labels: "",
        help: "Retries asked for longer than the set's ttl",
    },
    Series {
        name: "redis_reconnects",
        kind: Kind::Counter,
        labels: "",
        help: "Reads that had to reconnect to Redis",
    },
    Series {
        name: "read_loop_restarts",
        kind: Kind::Counter,
        labels: "",
        help: "Read loops that ended or panicked without a stop, and were started again",
    },
    Series {
        name: "handler_info",
        kind: Kind::Gauge,
        labels: "digest",
        help: "1 for the handler digest currently serving, 0 for earlier ones",
    },
    Series {
        name: "handler_swaps",
        kind: Kind::Counter,
        labels: "",
        help: "Hot swaps and rollbacks that took effect",
    },
    Series {
        name: "handler_swap_refusals",
        kind: Kind::Counter,
        labels: "",
        help: "Swaps refused (bad component, changed descriptor)",
    },
    Series {
        name: "http_denied",
        kind: Kind::Counter,
        labels: "",
        help: "Outbound HTTP requests refused by `allowed_outbound_hosts`",
    },
    Series {
        name: "retry_delay_clamped",
        kind: Kind::Counter,
        labels: "",
        help: "Retries asked for longer than `max_delay` (clamped to it)",
    },
    Series {
        name: "settle_errors",
        kind: Kind::Counter,
        labels: "",
        help: "Parks, dead letters refused by Redis in a way retrying cannot fix (entry kept pending)",
    },
    Series {
        name: "other_groups_retries",
        kind: Kind::Counter,
        labels: "",
        help: "Retry copies another group parked at the stream's tail (`retry_lane = false` with `other_groups_see_retries`), acknowledged by this group without handling them",
    },
    Series {
        name: "guest_log_dropped",
        kind: Kind::Counter,
        labels: "",
        help: "Guest log lines dropped or truncated by the per-delivery log budget",
    },
    Series {
        name: "reasons_cut",
        kind: Kind::Counter,
        labels: "",
        help: "Dead-letter reasons longer than 4 KiB, stored and logged cut to it",
    },
    Series {
        name: "trace_spans_dropped",
        kind: Kind::Counter,
        labels: "",
        help: "Spans dropped because the trace exporter's queue was full (or past an attempt's cap of request spans)",
    },
    Series {
        name: "trace_context_rejected",
        kind: Kind::Counter,
        labels: "",
        help: "Producers' `traceparent`/`tracestate` fields ignored as invalid (the entry got a trace of its own)",
    },
    Series {
        name: "paused",
        kind: Kind::Gauge,
        labels: "",
        help: "1 while the subscription is paused: no host of its group takes new entries or due retries",
    },
    Series {
        name: "rate_limit_calls",
        kind: Kind::Counter,
        labels: "",
        help: "Script calls that took tokens from the group's shared rate-limit bucket (about one per read)",
    },
    Series {
        name: "rate_limit_waits",
        kind: Kind::Counter,
        labels: "",
        help: "Reads that waited for the group's shared rate limit",
    },
    Series {
        name: "breaker_state",
        kind: Kind::Gauge,
        labels: "",
        help: "The group's circuit breaker: 0 closed, 1 open (nothing read), 2 half-open (probing)",
    },
    Series {
        name: "breaker_transitions",
        kind: Kind::Counter,
        labels: "to",
        help: "Circuit-breaker transitions this host made, by the state it moved to",
    },
    Series {
        name: "canary_deliveries",
        kind: Kind::Counter,
        labels: "version, result",
        help: "Attempts of a running canary on this host, by version (incumbent, candidate) and result",
    },
    Series {
        name: "canary_handler_seconds",
        kind: Kind::Histogram,
        labels: "version",
        help: "Time in the handler during a canary on this host, by version",
    },
    Series {
        name: "canary_share_basis_points",
        kind: Kind::Gauge,
        labels: "",
        help: "Of 10,000 deliveries, how many a running canary's candidate takes (0: no canary)",
    },
    Series {
        name: "canary_verdicts",
        kind: Kind::Counter,
        labels: "verdict",
        help: "Canaries that ended while this host ran them, by verdict",
    },
    Series {
        name: "ordered_unkeyed",
        kind: Kind::Counter,
        labels: "reason",
        help: "Entries of an ordered subscription handled unordered: no key (`missing`) or a key over `max_key_bytes` (`too_long`)",
    },
    Series {
        name: "ordered_held",
        kind: Kind::Counter,
        labels: "",
        help: "Entries of an ordered subscription queued in Redis behind their key's turn",
    },
    Series {
        name: "ordered_let_in",
        kind: Kind::Counter,
        labels: "",
        help: "Queued entries let in by this host when their key's turn came (they come back through the delayed set)",
    },
    Series {
        name: "journal_calls",
        kind: Kind::Counter,
        labels: "reason",
        help: "Outbound calls through the journal (`effects = \"journal\"`): `replayed` (the recorded response, no network), `recorded`, `diverged` (replay ended: the call differs from the recorded one), `too_big` (response or request over its bound), `journal_full` (the entry's journal at its bound), `unreadable` or `write_failed` (Redis refused; the call was live)",
    },
    Series {
        name: "dedupe_duplicates",
        kind: Kind::Counter,
        labels: "",
        help: "Entries acknowledged without a call: their dedupe key's first entry was read within the window",
    },
    Series {
        name: "dedupe_unkeyed",
        kind: Kind::Counter,
        labels: "reason",
        help: "Entries of a deduplicating subscription handled without being judged: no key (`missing`), a key over `max_key_bytes` (`too_long`), or a new key past the `max_keys` taken this window (`over_max_keys`: known keys still skip their duplicates)",
    },
];

/// The help text of the family `name` ("" for a name without a row, which a test refuses).
pub(super) fn help(name: &str) -> &'static str {
    SERIES
        .iter()
        .find(|s| s.name == name)
        .map_or("", |s| s.help)
}

impl Series {
    /// The name a scrape shows, with its labels besides `stream` and `group`.
    pub fn exported(&self) -> String {
        let suffix = if self.kind == Kind::Counter {
            "_total"
        } else {
            ""
        };
        let labels = if self.labels.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", self.labels.replace(' ', ""))
        };
        format!("sluice_{}{suffix}{labels}", self.name)
    }
}

/// The book's metrics reference, written from [`SERIES`].
pub fn reference_page() -> String {
    let mut page = String::from(
        "# Metrics reference\n\n<!-- generated: do not edit; the host's metric table writes this file (host/src/observe/metrics/series.rs, `SLUICE_BLESS=1 cargo test -p sluice-host metrics_reference`) -->\n\n`GET /metrics` on the admin address serves these families in the Prometheus text format. Every one carries `stream` and `group` labels (empty when `metrics_per_subscription` is off and the family is summed per host: see [The admin API](../operating/admin.md)).\n\n| metric | type | meaning |\n|---|---|---|\n",
    );
    for series in SERIES {
        let kind = match series.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        page.push_str(&format!(
            "| `{}` | {kind} | {} |\n",
            series.exported(),
            series.help.replace('|', "\\|")
        ));
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The families a fresh registry registers.
    fn announced() -> Vec<&'static str> {
        super::super::Metrics::new(true).families().to_vec()
    }

    #[test]
    fn every_family_has_one_row_and_every_row_a_family() {
        let announced = announced();
        assert!(announced.len() > 30, "too few families: {announced:?}");
        let rows: Vec<&str> = SERIES.iter().map(|s| s.name).collect();
        assert_eq!(announced, rows, "the registered families and SERIES differ");
        for series in SERIES {
            assert!(!series.help.is_empty(), "{} has no help", series.name);
        }
    }

    #[test]
    fn metrics_reference() {
        let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/src/reference/metrics.md");
        let written = reference_page();
        if std::env::var_os("SLUICE_BLESS").is_some() {
            std::fs::write(&page, &written).unwrap();
        }
        let on_disk = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            on_disk == written,
            "docs/src/reference/metrics.md differs from the metric table; run SLUICE_BLESS=1 cargo test -p sluice-host metrics_reference"
        );
    }
}
