//! The sandbox's per-delivery cost without Redis.

use std::time::Instant;

use anyhow::{Result, bail};
use sluice_host::runtime::Runtime;

use super::{Bench, Report};

impl Bench {
    /// Per-delivery cost of the sandbox, without Redis: a tight handler (the fixture's `ack`)
    /// called `n` times in a row on a fresh instance each time (pooling allocator or not), and
    /// on a reused instance with and without epoch interruption.
    pub async fn sandbox(&self, n: usize) -> Result<Vec<Report>> {
        use sluice_host::config::{Isolation, Limits};
        use sluice_host::delivery::{Delivery, Entry};
        use sluice_host::handler::Handler;
        use sluice_host::runtime::{PoolSizing, RuntimeOptions, WasmHandler};
        let pool = Some(PoolSizing {
            instances: 16,
            max_memory: 64 << 20,
        });
        let cases = [
            ("isolated-pooled", Isolation::PerDelivery, pool, false),
            ("isolated-on-demand", Isolation::PerDelivery, None, false),
            ("reused-epoch", Isolation::Reuse, pool, false),
            ("reused-no-epoch", Isolation::Reuse, pool, true),
        ];
        let entry = Entry {
            id: "1-0".into(),
            fields: vec![(
                b"payload".to_vec(),
                sluice_fixture_control::Control::Ack
                    .to_string()
                    .into_bytes(),
            )],
        };
        let delivery = Delivery::new("bench", "g", entry, 1, None);
        let mut reports = Vec::new();
        for (name, isolation, pool, no_epoch) in cases {
            let options = RuntimeOptions {
                pool,
                fuel: false,
                no_epoch,
            };
            let runtime = Runtime::new(None, options)?;
            let component = runtime.load(&self.fixture)?;
            let limits = Limits {
                isolation,
                ..Limits::default()
            };
            let values = vec![("sluice.payload-field".to_owned(), "payload".to_owned())];
            let handler = WasmHandler::new(component, limits, values, Default::default());
            // Warm up: compile caches, first instance, page faults.
            for _ in 0..100 {
                let _ = handler.handle(&delivery).await;
            }
            let started = Instant::now();
            for _ in 0..n {
                let outcome = handler.handle(&delivery).await;
                if outcome.is_err() {
                    bail!("{name}: the handler failed: {outcome:?}");
                }
            }
            let mut report = Report::new(&format!("sandbox-{name}"), n, started.elapsed());
            report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
            reports.push(report);
        }
        Ok(reports)
    }
}
