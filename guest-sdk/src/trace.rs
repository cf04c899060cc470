//! The trace the current attempt runs in: its id for a handler's own logs, its `traceparent`
//! for a call the handler makes by other means than the SDK's HTTP client (whose requests the
//! host puts in the trace by itself).
//!
//! Both are `None` while the host exports no traces.

/// The attempt span's W3C `traceparent`: `00-<trace id>-<span id>-<flags>` (natively, in a
/// test, none).
pub fn traceparent() -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    return crate::__bindings::sluice::handler::trace::traceparent();
    #[cfg(not(target_arch = "wasm32"))]
    return None;
}

/// The trace id (32 lowercase hex digits): the same for every attempt of the entry, its
/// parked waits and an operator's requeue.
pub fn trace_id() -> Option<String> {
    traceparent().and_then(|tp| tp.split('-').nth(1).map(str::to_owned))
}
