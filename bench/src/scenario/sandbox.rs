//! The sandbox's per-delivery cost without Redis.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sluice_host::config::Isolation;
use sluice_host::runtime::{PoolSizing, Runtime, RuntimeOptions};

use super::{Bench, Report};

/// The pool the sandbox scenarios size their runtimes with.
pub(crate) const POOL: Option<PoolSizing> = Some(PoolSizing {
    instances: 16,
    max_memory: 64 << 20,
});

/// Call `component`'s handler `n` times in a row on the fixture's `ack` payload
/// (`{"mode":"ack"}`) (after 20
/// warm-up calls: compile caches, first instance, page faults); the time the `n` took.
pub(crate) async fn time_handler(
    runtime: &Runtime,
    component: &Path,
    isolation: Isolation,
    n: usize,
) -> Result<Duration> {
    use sluice_host::config::Limits;
    use sluice_host::entry::delivery::{Delivery, Entry};
    use sluice_host::handler::Handler;
    use sluice_host::runtime::WasmHandler;
    let entry = Entry {
        id: "1-0".into(),
        fields: vec![(
            b"payload".to_vec(),
            sluice_fixture_control::Control::Ack
                .to_string()
                .into_bytes(),
        )],
    };
    let delivery = Delivery::new("bench", "g", (Default::default(), "bench"), entry, 1, None);
    let component = runtime.load(component).await?;
    let limits = Limits {
        isolation,
        ..Limits::default()
    };
    let values = vec![("sluice.payload-field".to_owned(), "payload".to_owned())];
    let handler = WasmHandler::new(component, limits, values, Default::default());
    for _ in 0..20 {
        let _ = handler.handle(&delivery).await;
    }
    let started = Instant::now();
    for _ in 0..n {
        let outcome = handler.handle(&delivery).await;
        if outcome.is_err() {
            bail!("the handler failed: {outcome:?}");
        }
    }
    Ok(started.elapsed())
}

impl Bench {
    /// Per-delivery cost of the sandbox, without Redis: a tight handler (the fixture's `ack`)
    /// called `n` times in a row on a fresh instance each time (pooling allocator or not), and
    /// on a reused instance with and without epoch interruption.
    pub async fn sandbox(&self, n: usize) -> Result<Vec<Report>> {
        let cases = [
            ("isolated-pooled", Isolation::PerDelivery, POOL, false),
            ("isolated-on-demand", Isolation::PerDelivery, None, false),
            ("reused-epoch", Isolation::Reuse, POOL, false),
            ("reused-no-epoch", Isolation::Reuse, POOL, true),
        ];
        let mut reports = Vec::new();
        for (name, isolation, pool, no_epoch) in cases {
            let options = RuntimeOptions {
                pool,
                fuel: false,
                no_epoch,
                cache_max_size: None,
                quick_compile: false,
            };
            let runtime = Runtime::new(None, options)?;
            let took = time_handler(&runtime, &self.fixture, isolation, n).await?;
            let mut report = Report::new(&format!("sandbox-{name}"), n, took);
            report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
            reports.push(report);
        }
        Ok(reports)
    }
}
