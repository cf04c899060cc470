//! What each guest language costs: the same `ack` handler in Rust (the fixture), Python
//! (componentize-py) and JavaScript (componentize-js), each built with `sluice build`'s code.
//! Per language: component size, compile time cold and from the cache, msgs/s on the host's
//! full path with reused instances and with a fresh instance per delivery, and µs per delivery
//! on a fresh instance (no Redis).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result};
use sluice_host::config::Isolation;
use sluice_host::project::{Project, build};
use sluice_host::runtime::{Runtime, RuntimeOptions};

use super::sandbox::{POOL, time_handler};
use super::{Bench, Report};

/// Build a bench guest project, with the toolchains `scripts/setup` installs if present.
fn build_guest(dir: &Path) -> Result<PathBuf> {
    let tools = dir.join("../../../target/tools");
    let tools =
        build::Tools::preferring(&[tools.join("py/bin"), tools.join("js/node_modules/.bin")]);
    let project = Project::detect(dir)?;
    let built = build::build_with(&project, &tools)
        .with_context(|| format!("cannot build {}", dir.display()))?;
    Ok(built.path)
}

impl Bench {
    /// The `languages` scenario; `n` messages on the host path, `fresh` fresh-instance calls.
    pub async fn languages(&self, n: usize, fresh: usize) -> Result<Vec<Report>> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let guests = [
            ("rust", self.fixture.clone()),
            ("python", build_guest(&root.join("guests/ack-python"))?),
            ("js", build_guest(&root.join("guests/ack-js"))?),
        ];
        let mut reports = Vec::new();
        for (lang, component) in guests {
            eprintln!("  {lang}: {}", component.display());
            let size = std::fs::metadata(&component)?.len() as f64;
            let cache = tempfile::tempdir()?;
            let options = RuntimeOptions {
                pool: POOL,
                ..RuntimeOptions::default()
            };
            let started = Instant::now();
            Runtime::new(Some(cache.path()), options)?
                .load(&component)
                .await?;
            let cold = started.elapsed();
            let started = Instant::now();
            let runtime = Runtime::new(Some(cache.path()), options)?;
            runtime.load(&component).await?;
            let cached = started.elapsed();
            let took = time_handler(&runtime, &component, Isolation::PerDelivery, fresh).await?;
            let isolated = self
                .host_path_of(
                    &format!("lang-{lang}-isolated"),
                    &component,
                    "per-delivery",
                    (n / 10).max(100),
                    "",
                )
                .await?;
            let mut report = self
                .host_path_of(&format!("lang-{lang}"), &component, "reuse", n, "")
                .await?;
            report.us_per_delivery = Some(report.seconds * 1e6 / n as f64);
            report.extra.push(("x_size_mb", size / 1e6));
            report.extra.push(("x_compile_cold_s", cold.as_secs_f64()));
            report
                .extra
                .push(("x_compile_cached_ms", cached.as_secs_f64() * 1e3));
            report
                .extra
                .push(("x_fresh_us", took.as_secs_f64() * 1e6 / fresh as f64));
            report
                .extra
                .push(("x_isolated_msgs_s", isolated.msgs_per_s));
            reports.push(report);
        }
        Ok(reports)
    }
}
