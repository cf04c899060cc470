//! Per-store state and the host side of the WIT imports.
//!
//! A guest can reach exactly this: its subscription's config values, logging into the host's
//! `tracing` (inside the delivery's span), outbound HTTP to the hosts its subscription allows
//! (see [`super::http`]), and WASI 0.2 with no preopened directories, no environment, no
//! arguments, no sockets and no stdin; stdout and stderr go nowhere. Wall and monotonic clocks
//! and random numbers are WASI's own.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::{self, sluice::handler::log::Level};
use super::http::{HttpGrant, HttpHooks};

/// The data of one store: WASI state, limits, and what the host learns during a call.
pub struct GuestState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    http_hooks: HttpHooks,
    table: ResourceTable,
    pub(crate) limiter: Limiter,
    values: Arc<[(String, String)]>,
    /// When the current delivery must have finished.
    pub(crate) deadline: Option<Instant>,
    /// Set when the epoch callback interrupted the guest for running past `deadline`.
    pub(crate) timed_out: bool,
    /// The last panic message the guest SDK reported before trapping.
    pub(crate) panic_message: Option<String>,
}

impl GuestState {
    /// A fresh state with every capability denied but outbound HTTP to what `http` grants.
    pub fn new(values: Arc<[(String, String)]>, memory_limit: u64, http: Arc<HttpGrant>) -> Self {
        Self {
            wasi: WasiCtxBuilder::new().build(),
            http: WasiHttpCtx::new(),
            http_hooks: HttpHooks { grant: http },
            table: ResourceTable::new(),
            limiter: Limiter {
                memory_limit,
                denied: None,
            },
            values,
            deadline: None,
            timed_out: false,
            panic_message: None,
        }
    }
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
            self.panic_message = Some(message.clone());
        }
        let fields = fields
            .iter()
            .filter(|(k, _)| !k.starts_with("sluice."))
            .map(|(k, v)| format!("{k}={v}"))
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
