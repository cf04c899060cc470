//! Waiting inside a handler without burning its time budget.
//!
//! [`sleep`] suspends the handler on a `wasi:clocks` timer through the reactor that drives it:
//! the instance blocks in the host's `poll` and uses no CPU or fuel until the timer fires.
//! A busy loop or `std::thread::sleep` would instead spin (the latter blocks the whole
//! handler, so nothing joined with it runs meanwhile).

use std::time::Duration;

/// Wait `duration`, letting any future joined with this one run meanwhile.
pub async fn sleep(duration: Duration) {
    #[cfg(target_arch = "wasm32")]
    wstd::task::sleep(duration.into()).await;
    // Natively (a unit test, see `crate::testing`) there is no reactor: the test's thread waits.
    #[cfg(not(target_arch = "wasm32"))]
    std::thread::sleep(duration);
}
