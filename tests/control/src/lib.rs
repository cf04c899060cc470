//! What a test entry tells the fixture guest (`tests/guests/fixture`) to do.
//!
//! The fixture is one component that can walk every path of the host; each entry's payload
//! picks the path. The tests and the benchmark write payloads with this type and the fixture
//! reads them with it, so the three cannot drift apart. On the wire it is JSON tagged by
//! `mode`, e.g. `{"mode":"retry","ms":500,"times":1}`; fields it does not know are ignored,
//! so a payment-shaped payload with `"mode":"ack"` decodes as [`Control::Ack`].

use serde::{Deserialize, Serialize};

/// One entry's instruction to the fixture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum Control {
    /// Ack.
    Ack,
    /// Ask to retry after `ms` while fewer than `times` attempts came before, then ack.
    Retry {
        /// The delay asked for.
        ms: u64,
        /// How many attempts retry before one acks.
        times: u64,
    },
    /// Dead-letter with `reason`.
    Dead {
        /// The handler's reason.
        reason: String,
    },
    /// Dead-letter with `reason` unless an operator requeued the entry (it carries
    /// `sluice-requeued-from`), then ack: a failure an operator fixed.
    DeadUntilRequeued {
        /// The handler's reason.
        reason: String,
    },
    /// Panic on every attempt.
    Trap,
    /// Panic while fewer than `times` attempts came before, then ack.
    TrapThenAck {
        /// How many attempts panic.
        times: u64,
    },
    /// Dead-letter with a reason describing the delivery (stream, group, counts, the config
    /// value `key`, the field names).
    Report {
        /// The config value to report.
        key: String,
    },
    /// Log `line` at warn level, then ack.
    Log {
        /// What to log.
        line: String,
    },
    /// Never return.
    Loop,
    /// Dead-letter with `<version>@<wall-clock ms>` (`v1`, or `v2` in the v2 build).
    Version,
    /// Work (spin) for `ms` milliseconds, then ack.
    Slow {
        /// How long.
        ms: u64,
    },
    /// Sleep `ms` milliseconds waiting in WASI's poll, then ack.
    Sleep {
        /// How long.
        ms: u64,
    },
    /// `.await` the SDK's timer for `ms` milliseconds (suspended in the host's poll, not
    /// spinning), then dead-letter with `slept=<measured ms>`.
    Await {
        /// How long.
        ms: u64,
    },
    /// POST to every url in `urls`, all at once (joined futures) or one after another, then
    /// dead-letter with `elapsed=<ms> statuses=<s1,s2,..>` (an error's text for a failed one).
    /// Not in the v2 build.
    HttpMany {
        /// Where to send them.
        urls: Vec<String>,
        /// One after another instead of joined.
        #[serde(default)]
        sequential: bool,
    },
    /// POST `body` to every url in `urls`, one after another (with `headers` on each); the
    /// first that fails or answers other than 2xx ends the attempt with a retry in `retry_ms`;
    /// when all succeed, ack (a payment's charge, then its receipt). Not in the v2 build.
    Calls {
        /// Where to send them, in order.
        urls: Vec<String>,
        /// What each carries.
        #[serde(default)]
        body: String,
        /// Headers the guest sets itself on every request.
        #[serde(default)]
        headers: Vec<(String, String)>,
        /// The retry a failed call asks for.
        retry_ms: u64,
        /// A failed call traps instead (the panic names the status or the error).
        #[serde(default)]
        trap: bool,
        /// Send each URL this many times in a row (0 is once): a guest that calls on and on.
        #[serde(default)]
        times: u32,
    },
    /// Allocate 1 MiB blocks until allocation fails.
    Alloc,
    /// Recurse without end.
    Recurse,
    /// Try to read a file, an environment variable and open a socket to `target`
    /// (`host:port`), and dead-letter with what happened.
    Probe {
        /// Where to connect.
        target: String,
    },
    /// POST `body` to `url` (with a timeout if `timeout_ms` is set) and dead-letter with
    /// `status=.. body=..` or the error. Not in the v2 build, which imports no `wasi:http`.
    Http {
        /// Where to send it.
        url: String,
        /// What to send.
        #[serde(default)]
        body: String,
        /// The request's own timeout; 0 leaves it to the host.
        #[serde(default)]
        timeout_ms: u64,
        /// A `traceparent` header the guest sets itself (empty: none).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        traceparent: String,
    },
    /// Dead-letter with `traceparent=<the SDK's trace::traceparent()> trace_id=<trace::trace_id()>`
    /// (`none` for either when the host exports no traces).
    Traceparent,
    /// Do what `v1` says in the v1 build and what `v2` says in the v2 build: a candidate that
    /// breaks (or fixes) what the serving version does.
    ByVersion {
        /// What v1 does.
        v1: Box<Control>,
        /// What v2 does.
        v2: Box<Control>,
    },
    /// Attempt `n` (counting from 0: how many attempts came before) does what `each[n]` says,
    /// the last one for every later attempt, e.g. retry once, then spin, then ack.
    Attempts {
        /// What each attempt does (not `attempts` itself).
        each: Vec<Control>,
    },
    /// Create `maps` `wasi:http` header maps with a `bytes`-byte value each and leak them, then
    /// ack.
    LeakFields {
        /// How many maps.
        maps: u64,
        /// The size of each map's value.
        bytes: u64,
    },
    /// Dead-letter with a reason of `bytes` bytes made in the guest, starting with `prefix`
    /// and holding a newline (a small entry, a huge reason).
    DeadLong {
        /// What the reason starts with.
        prefix: String,
        /// The filler after the prefix.
        bytes: u64,
    },
    /// POST `start <tag> <origin id> <attempts before>` to `url`, do what `then` says, then
    /// POST `end <tag> <origin id> <attempts before>`: how a test sees when each attempt ran,
    /// across hosts. A failed POST is ignored. Not in the v2 build.
    Record {
        /// Where to POST.
        url: String,
        /// What names the entry in the record (e.g. `key:seq`).
        tag: String,
        /// What the attempt does between the two POSTs.
        then: Box<Control>,
    },
    /// Log `lines` lines of `bytes` bytes, each starting with `prefix`, then ack.
    LogFlood {
        /// How many lines.
        lines: u64,
        /// The filler after the prefix.
        bytes: u64,
        /// What each line starts with.
        prefix: String,
    },
}

/// The payload as it goes into the entry's `payload` field: its JSON.
impl std::fmt::Display for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let json = serde_json::to_string(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_form_is_tagged_by_mode_and_ignores_unknown_fields() {
        let retry = Control::Retry { ms: 500, times: 1 };
        assert_eq!(retry.to_string(), r#"{"mode":"retry","ms":500,"times":1}"#);
        let back: Control = serde_json::from_str(&retry.to_string()).unwrap();
        assert_eq!(back, retry);
        let payment: Control =
            serde_json::from_str(r#"{"mode":"ack","amount":1200,"currency":"EUR"}"#).unwrap();
        assert_eq!(payment, Control::Ack);
        let huge = Control::Retry {
            ms: u64::MAX,
            times: 1,
        };
        assert_eq!(
            serde_json::from_str::<Control>(&huge.to_string()).unwrap(),
            huge
        );
    }
}
