//! Per-store state and the host side of the WIT imports.
//!
//! A guest can reach exactly this: its subscription's config values, logging into the host's
//! `tracing` (inside the delivery's span), outbound HTTP to the hosts its subscription allows
//! (see [`super::http`]), and WASI 0.2 with no preopened directories, no environment, no
//! arguments, no sockets and no stdin; stdout and stderr go nowhere. Wall and monotonic clocks
//! and random numbers are WASI's own.
//!
//! What the host holds on a guest's behalf is bounded per store by `host_memory_limit`: the
//! resource table (every WASI and HTTP handle) holds at most `host_memory_limit /
//! FIELDS_LIMIT` entries and each HTTP `fields` resource at most [`FIELDS_LIMIT`] bytes, so a
//! guest that leaks handles or builds huge headers fails its attempt with a reason naming the
//! limit instead of growing the host. Without an HTTP grant a header map holds at most
//! [`UNGRANTED_FIELDS_LIMIT`] bytes: room for the length and type an SDK puts on every request,
//! so the request reaches the host and is denied there (the handler sees "denied", and the
//! denial is counted), and no room to keep data in.
//! Logging is bounded per delivery (`log_lines`,
//! `log_bytes`): past the budget lines are dropped and counted, long lines are cut, and control
//! characters are escaped so a guest cannot forge a host log line.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::{Store, UpdateDeadline};

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::{self, sluice::handler::log::Level};
use super::http::{HttpGrant, HttpHooks};

/// The most bytes one HTTP `fields` resource (a header map) may hold in the host.
pub const FIELDS_LIMIT: usize = 32 * 1024;

/// The same for a guest without an HTTP grant: every request it makes is denied, but the
/// headers an SDK sets on each (`content-length`, `content-type`) must fit, or the attempt fails
/// on a host limit instead of the handler seeing its request denied.
pub const UNGRANTED_FIELDS_LIMIT: usize = 256;

/// The per-store limits a guest's state is built with.
#[derive(Debug, Clone)]
pub struct StoreLimits {
    /// Linear memory cap, bytes.
    pub memory: u64,
    /// What the host may hold for the guest (resources, HTTP fields), bytes.
    pub host_memory: u64,
    /// Log lines one delivery may write.
    pub log_lines: u32,
    /// Log bytes one delivery may write.
    pub log_bytes: u64,
    /// Where dropped or cut log lines are counted.
    pub log_dropped: prometheus_client::metrics::counter::Counter,
}

impl StoreLimits {
    /// Entries the resource table may hold under `host_memory`.
    pub fn resource_entries(&self) -> usize {
        usize::try_from(self.host_memory / FIELDS_LIMIT as u64)
            .unwrap_or(usize::MAX)
            .max(16)
    }
}

/// One delivery's log budget.
#[derive(Debug)]
pub(crate) struct LogBudget {
    lines: u32,
    bytes: u64,
    pub(crate) dropped: u64,
}

/// The data of one store: WASI state, limits, and what the host learns during a call.
pub struct GuestState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    /// What each HTTP header map may hold (0 without a grant).
    field_size_limit: usize,
    pub(crate) http_hooks: HttpHooks,
    table: ResourceTable,
    pub(crate) limiter: Limiter,
    values: Arc<[(String, String)]>,
    /// When the current delivery must have finished.
    pub(crate) deadline: Option<Instant>,
    /// Set when the epoch callback interrupted the guest for running past `deadline`.
    pub(crate) timed_out: bool,
    /// The last panic message the guest SDK reported before trapping (an exception's type
    /// and message, where it was raised), and its traceback, if it sent one.
    pub(crate) panic_message: Option<(String, Option<String>)>,
    limits: Arc<StoreLimits>,
    pub(crate) log: LogBudget,
    /// Why the current attempt's downstream is down, if the guest said so
    /// (`flow.downstream-down`), bounded.
    pub(crate) downstream_down: Option<String>,
}

impl GuestState {
    /// A fresh state with every capability denied but outbound HTTP to what `http` grants.
    pub fn new(
        values: Arc<[(String, String)]>,
        limits: Arc<StoreLimits>,
        http: Arc<HttpGrant>,
    ) -> Self {
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.resource_entries());
        let mut http_ctx = WasiHttpCtx::new();
        // Without a grant `wasi:http` does nothing: header maps hold next to nothing and every
        // request is denied (see `super::http`).
        let field_size_limit = if http.policy.allowed.is_empty() {
            UNGRANTED_FIELDS_LIMIT
        } else {
            FIELDS_LIMIT
        };
        http_ctx.set_field_size_limit(field_size_limit);
        Self {
            wasi: WasiCtxBuilder::new().build(),
            http: http_ctx,
            field_size_limit,
            http_hooks: HttpHooks {
                grant: http,
                spans: 0,
                trace: None,
                identity: None,
                calls: 0,
                journal: None,
            },
            table,
            limiter: Limiter {
                memory_limit: limits.memory,
                denied: None,
                peak: 0,
            },
            values,
            deadline: None,
            timed_out: false,
            panic_message: None,
            log: LogBudget {
                lines: limits.log_lines,
                bytes: limits.log_bytes,
                dropped: 0,
            },
            limits,
            downstream_down: None,
        }
    }

    /// Start a delivery's log budget afresh, in the attempt's `trace` (if exported).
    pub(crate) fn reset_log_budget(
        &mut self,
        trace: Option<crate::observe::telemetry::AttemptTrace>,
    ) {
        self.log = LogBudget {
            lines: self.limits.log_lines,
            bytes: self.limits.log_bytes,
            dropped: 0,
        };
        self.http_hooks.spans = 0;
        self.downstream_down = None;
        // The attempt's trace, for the requests' spans and `trace::traceparent`.
        self.http_hooks.trace = trace;
    }

    /// Whether the guest's resource table is three quarters full: an instance whose guest
    /// frees handles late (JavaScript's runtime frees them when it collects garbage) would
    /// fail a later attempt on the limit, so it is not reused.
    pub(crate) fn table_nearly_full(&mut self) -> bool {
        let capacity = self.table.max_capacity();
        let live = self.table.iter_mut().count();
        live.saturating_mul(4) >= capacity.saturating_mul(3)
    }

    /// Why the host refused to hold more for the guest, if `err` says the resource table is
    /// full (only full: a handle the guest dropped too early, or a parent dropped before its
    /// children, is the guest's own trap and says so).
    pub(crate) fn host_limit(&self, err: &wasmtime::Error) -> Option<String> {
        use wasmtime_wasi_http::FieldMapError;
        if err.chain().any(|e| {
            matches!(
                e.downcast_ref::<wasmtime::component::ResourceTableError>(),
                Some(wasmtime::component::ResourceTableError::Full)
            )
        }) {
            return Some(format!(
                "more than {} live resources (handles, HTTP fields and bodies) under host_memory_limit {}",
                self.limits.resource_entries(),
                bytesize::ByteSize::b(self.limits.host_memory)
            ));
        }
        let too_big = err.chain().any(|e| {
            matches!(
                e.downcast_ref::<FieldMapError>(),
                Some(FieldMapError::TotalSizeTooBig | FieldMapError::TooManyFields)
            )
        });
        too_big.then(|| {
            if self.field_size_limit == UNGRANTED_FIELDS_LIMIT {
                format!(
                    "an HTTP header map over {UNGRANTED_FIELDS_LIMIT} bytes, all a guest without an HTTP grant may hold (allowed_outbound_hosts is empty; host_memory_limit)"
                )
            } else {
                format!(
                    "an HTTP header map over {} (host_memory_limit {})",
                    bytesize::ByteSize::b(FIELDS_LIMIT as u64),
                    bytesize::ByteSize::b(self.limits.host_memory)
                )
            }
        })
    }

    /// Take `bytes` of log from the budget: `None` drops the line, `Some(n)` keeps `n` bytes.
    fn spend_log(&mut self, bytes: usize) -> Option<usize> {
        if self.log.lines == 0 || self.log.bytes == 0 {
            self.log.dropped += 1;
            self.limits.log_dropped.inc();
            if self.log.dropped == 1 {
                tracing::warn!(
                    target: "sluice::guest",
                    log_lines = self.limits.log_lines,
                    log_bytes = self.limits.log_bytes,
                    "guest log budget of this delivery is spent; further lines are dropped and counted"
                );
            }
            return None;
        }
        self.log.lines -= 1;
        let keep = (bytes as u64).min(self.log.bytes).min(MAX_LOG_LINE as u64) as usize;
        self.log.bytes -= keep as u64;
        if keep < bytes {
            self.limits.log_dropped.inc();
        }
        Some(keep)
    }
}

/// The longest guest log line kept whole; longer ones are cut.
pub const MAX_LOG_LINE: usize = 4096;

/// `text` cut to at most `max` bytes (on a character boundary) with control characters escaped
/// (`\n`, `\r`, `\u{1b}`, ...), so it stays one line of the host's log.
fn sanitize(text: &str, max: usize) -> String {
    crate::entry::outcome::bounded_text(text, max).0
}

/// The most of a traceback the host keeps (in the log and the dead letter).
pub const MAX_TRACE: usize = 16 * 1024;

/// A guest's traceback as lines: each line escaped on its own (so none can pass for a log
/// line of the host's), at most [`MAX_TRACE`] bytes in all.
fn trace_lines(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let left = MAX_TRACE.saturating_sub(out.len());
        if left == 0 {
            out.push_str("…[cut]");
            break;
        }
        let (line, cut) = crate::entry::outcome::bounded_text(line.trim_end(), left);
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&line);
        if cut {
            break;
        }
    }
    out
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for GuestState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

/// Caps linear memory and remembers a refused growth, so the trap that follows can be
/// reported as a memory-limit hit instead of a bare `unreachable`.
pub(crate) struct Limiter {
    memory_limit: u64,
    pub(crate) denied: Option<(u64, u64)>,
    /// The most linear memory the instance has grown to (its attempt span's `memory_bytes`).
    pub(crate) peak: u64,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let desired = desired as u64;
        if desired > self.memory_limit {
            self.denied = Some((self.memory_limit, desired));
            return Ok(false);
        }
        self.peak = self.peak.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// The two linkers components are instantiated with: WASI 0.2 and the Sluice imports, and the
/// same plus `wasi:http`'s outgoing handler for components that import it. Every definition in
/// a linker costs each fresh instance a little (~3 µs for `wasi:http`'s), so components that do
/// not use HTTP do not get it.
pub(crate) fn linkers(
    engine: &Engine,
) -> wasmtime::Result<(Linker<GuestState>, Linker<GuestState>)> {
    let mut plain = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut plain)?;
    bindings::Handler::add_to_linker::<GuestState, HasSelf<GuestState>>(&mut plain, |s| s)?;
    let mut with_http = plain.clone();
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut with_http)?;
    Ok((plain, with_http))
}

impl bindings::sluice::handler::types::Host for GuestState {}

impl bindings::sluice::handler::log::Host for GuestState {
    fn log(&mut self, level: Level, message: String, fields: Vec<(String, String)>) {
        if fields
            .iter()
            .any(|(k, v)| k == "sluice.panic" && v == "true")
        {
            // Kept apart from the budget: it names why the attempt failed, and the host logs
            // it once, with the failure (not here as well).
            let trace = fields
                .iter()
                .find(|(k, _)| k == "sluice.trace")
                .map(|(_, t)| trace_lines(t))
                .filter(|t| !t.trim().is_empty());
            self.panic_message = Some((sanitize(&message, MAX_LOG_LINE), trace));
            return;
        }
        let size = message.len()
            + fields
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        let Some(keep) = self.spend_log(size) else {
            return;
        };
        let message = sanitize(&message, keep);
        let mut left = keep.saturating_sub(message.len());
        let fields = fields
            .iter()
            .filter(|(k, _)| !k.starts_with(sluice_descriptor::RESERVED_CONFIG_PREFIX))
            .map(|(k, v)| {
                let pair = sanitize(&format!("{k}={v}"), left);
                left = left.saturating_sub(pair.len());
                pair
            })
            .collect::<Vec<_>>()
            .join(" ");
        match level {
            Level::Trace => tracing::trace!(target: "sluice::guest", %fields, "{message}"),
            Level::Debug => tracing::debug!(target: "sluice::guest", %fields, "{message}"),
            Level::Info => tracing::info!(target: "sluice::guest", %fields, "{message}"),
            Level::Warn => tracing::warn!(target: "sluice::guest", %fields, "{message}"),
            Level::Error => tracing::error!(target: "sluice::guest", %fields, "{message}"),
        }
    }
}

/// The most bytes of a downstream-down reason kept (called again, the last one counts).
pub const MAX_DOWNSTREAM_REASON: usize = 512;

impl bindings::sluice::handler::flow::Host for GuestState {
    fn downstream_down(&mut self, reason: String) {
        let reason = if reason.trim().is_empty() {
            "the handler gave no reason".to_owned()
        } else {
            crate::entry::outcome::bounded_text(&reason, MAX_DOWNSTREAM_REASON).0
        };
        self.downstream_down = Some(reason);
    }
}

impl bindings::sluice::handler::trace::Host for GuestState {
    fn traceparent(&mut self) -> Option<String> {
        self.http_hooks
            .trace
            .as_ref()
            .map(crate::observe::telemetry::attempt_traceparent)
    }
}

impl bindings::sluice::handler::config::Host for GuestState {
    fn get(&mut self, key: String) -> Option<String> {
        self.values
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    }

    fn get_all(&mut self) -> Vec<(String, String)> {
        self.values.to_vec()
    }
}

/// A store set up with the limits and the epoch callback that enforces deadlines.
pub(crate) fn new_store(
    runtime: &super::Runtime,
    values: Arc<[(String, String)]>,
    limits: Arc<StoreLimits>,
    http: Arc<HttpGrant>,
) -> Store<GuestState> {
    let mut store = Store::new(runtime.engine(), GuestState::new(values, limits, http));
    store.limiter(|state| &mut state.limiter);
    store.epoch_deadline_callback(|mut ctx| {
        let state = ctx.data_mut();
        match state.deadline {
            Some(deadline) if Instant::now() >= deadline => {
                state.timed_out = true;
                Ok(UpdateDeadline::Interrupt)
            }
            // Yield at every tick so a busy guest never holds an executor thread for long.
            _ => Ok(UpdateDeadline::Yield(1)),
        }
    });
    store.set_epoch_deadline(1);
    // With fuel metering on, a store starts empty; only deliveries are budgeted.
    if runtime.fuel_enabled() {
        let _ = store.set_fuel(u64::MAX);
    }
    store
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_full_table_is_a_host_limit() {
        use wasmtime::component::ResourceTableError;
        let limits = Arc::new(StoreLimits {
            memory: 64 * 1024 * 1024,
            host_memory: 8 * 1024 * 1024,
            log_lines: 10,
            log_bytes: 1000,
            log_dropped: Default::default(),
        });
        let state = GuestState::new(Arc::from([]), limits, Arc::default());
        let full = wasmtime::Error::from(ResourceTableError::Full).context("a host call");
        let said = state.host_limit(&full).unwrap();
        assert!(said.contains("more than 256 live resources"), "{said}");
        for other in [
            ResourceTableError::HasChildren,
            ResourceTableError::NotPresent,
            ResourceTableError::WrongType,
        ] {
            let err = wasmtime::Error::from(other).context("a host call");
            assert_eq!(state.host_limit(&err), None, "{err:#}");
        }
    }

    #[test]
    fn control_characters_are_escaped_and_long_lines_cut() {
        assert_eq!(
            sanitize("ok\n2026-01-01 INFO forged\r\u{1b}[31m", 100),
            "ok\\n2026-01-01 INFO forged\\r\\u{1b}[31m"
        );
        assert_eq!(sanitize("ééé", 3), "é…[cut]");
    }
}
