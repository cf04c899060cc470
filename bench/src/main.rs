//! Sluice's benchmark harness: every scenario against one private `redis-server` (persistence
//! off), in one process run, so ratios compare like with like.
//!
//! Run with: `scripts/guests && cargo run --release -p sluice-bench -- [SCENARIO...] [--json]`
//!
//! Scenarios: `ceiling` (XREADGROUP COUNT 128 + one XACK per batch, no handler), `ceiling-server`
//! (the same on 4 connections at once, with Redis's own CPU time), `ceiling-lean` (the same loop on
//! the host's lean read connection instead of redis-rs), `native` (the host's full path with a
//! native Rust handler), `wasm` (the same work in a component, reused instances),
//! `native-doorbell` and `wasm-doorbell` (the same through the polling doorbell's read path), `wasm-isolated`
//! (a fresh instance per delivery), `retry` (retry lateness through the durable set and the retry
//! lane), `retry-backlog` (the same while a 5,000-entry backlog is being handled, retries at the
//! stream's tail: `retry_lane = false`), `retry-backlog-lane` (the same through the lane), `drain`
//! (entries already due in the set), `fan-out` (two Sluice groups and a plain group on one stream,
//! with retries: per-group throughput and retry lateness, what the plain group read), `swap`
//! (throughput while the handler is hot-swapped every 100 ms, and time from a swap to its first
//! delivery), `sandbox` (per-delivery instantiation with and without the pooling allocator, and
//! what epoch interruption costs a tight handler, without Redis), `cluster` (the wasm workload on
//! one partition vs 8 over a 3-master Redis Cluster, with each node's commands/s), `ui` (each admin
//! page's time with 1,000,000 parked retries and 100,000 dead letters), `retention` (the wasm path
//! with stream retention on vs off), `languages` (the same ack handler in Rust, Python and
//! JavaScript: size, compile time cold and cached, msgs/s, µs per fresh instance), `traces`,
//! `flow`, `canary` (the wasm path while a canary sends half the entries to another version,
//! against the same without one), `ordered` (ordered keys: throughput over 1,000 keys against
//! the same unordered, and the calm keys' p99 while one key has 100,000 entries queued, with
//! and without the fair share), `effects` (idempotency keys and the journal of outbound calls:
//! entries without calls with and without `effects = "journal"`, and one call each, recorded or
//! not). See BENCHMARKS.md.

mod budget;
mod native;
mod scenario;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use scenario::{Bench, Report};

/// The scenarios whose throughput is reported as a ratio to the ceiling of the same run.
const RATIO_TO_CEILING: [&str; 6] = [
    "native",
    "wasm",
    "native-doorbell",
    "wasm-doorbell",
    "wasm-isolated",
    "ceiling-lean",
];

const ALL: &[&str] = &[
    "ceiling",
    "ceiling-server",
    "ceiling-lean",
    "native",
    "wasm",
    "native-doorbell",
    "wasm-doorbell",
    "wasm-isolated",
    "retry",
    "retry-backlog",
    "retry-backlog-lane",
    "drain",
    "fan-out",
    "swap",
    "sandbox",
    "cluster",
    "ui",
    "retention",
    "languages",
    "traces",
    "flow",
    "canary",
    "ordered",
    "effects",
    "dedupe",
    "scheduled",
    "footprint",
    "density",
];

#[derive(Parser)]
#[command(about = "Benchmark Sluice against this machine's Redis ceiling")]
struct Args {
    /// Scenarios to run (default: all but footprint and density): ceiling, ceiling-server,
    /// ceiling-lean, native, wasm, native-doorbell, wasm-doorbell, wasm-isolated, retry, retry-backlog, retry-backlog-lane,
    /// drain, fan-out, swap, sandbox, cluster, ui, retention, languages, traces, flow, canary,
    /// ordered, effects, footprint, density.
    scenarios: Vec<String>,
    /// Print one JSON object per scenario per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Messages per throughput scenario.
    #[arg(long, default_value_t = 100_000)]
    messages: usize,
    /// Entries in the retry scenario.
    #[arg(long, default_value_t = 5_000)]
    retries: usize,
    /// Entries in the drain scenario.
    #[arg(long, default_value_t = 100_000)]
    drain: usize,
    /// Subscription counts of the footprint and density scenarios, one idle host each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    subscriptions: Vec<usize>,
    /// Entries the density scenario times from XADD to outcome, each on a random stream.
    #[arg(long, default_value_t = 1_000)]
    density_samples: usize,
    /// Run the density scenario with the server's keyspace events off (the default of a
    /// Redis server): the doorbell polls instead of listening.
    #[arg(long)]
    density_polling: bool,
    /// Do not add the ceilings before the scenarios asked for (no ratios then): to profile
    /// one scenario alone, e.g. under `perf record`.
    #[arg(long)]
    no_ceilings: bool,
    /// Parked retries behind the admin page in the ui scenario.
    #[arg(long, default_value_t = 1_000_000)]
    ui_parked: usize,
    /// Dead letters behind the admin page in the ui scenario.
    #[arg(long, default_value_t = 100_000)]
    ui_dead: usize,
}

fn guest(name: &str) -> Result<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let path = target.join("wasm32-wasip2/release").join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build the guests first with scripts/guests",
            path.display()
        );
    }
    Ok(path)
}

#[tokio::main]
async fn main() -> Result<()> {
    // Components are compiled in child processes of this executable.
    sluice_host::runtime::compile::serve_compiles();
    sluice_host::support::memory::give_back_big_allocations();
    let args = Args::parse();
    {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        // The traces scenario turns the OpenTelemetry layer on; the others leave it off.
        // Spans are info level: the filter lets them through (to the OpenTelemetry layer, which
        // is off unless a scenario starts it), the printed log stays at warn.
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        tracing_subscriber::registry()
            .with(sluice_host::observe::telemetry::layer())
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
            .init();
    }
    let mut wanted: Vec<&str> = if args.scenarios.is_empty() {
        // `footprint` and `density` run the `sluice` binary, which `cargo run -p sluice-bench`
        // does not build: they run when asked for.
        ALL.iter()
            .copied()
            .filter(|s| !["footprint", "density"].contains(s))
            .collect()
    } else {
        args.scenarios.iter().map(String::as_str).collect()
    };
    if let Some(unknown) = wanted.iter().find(|s| !ALL.contains(s)) {
        bail!(
            "unknown scenario `{unknown}`; choose from {}",
            ALL.join(", ")
        );
    }
    // Every ratio is to the ceilings measured in the same run: redis-rs's and the lean
    // reader's (the host's own read client, what the hot path's goals are set against).
    if !args.no_ceilings && wanted.iter().any(|s| RATIO_TO_CEILING.contains(s)) {
        for ceiling in ["ceiling-lean", "ceiling"] {
            if !wanted.contains(&ceiling) {
                wanted.insert(0, ceiling);
            }
        }
    }
    let bench = Bench::start(
        guest("sluice_fixture.wasm")?,
        guest("sluice_fixture_v2.wasm")?,
    )
    .await
    .context("cannot start the benchmark's redis-server")?;
    let mut ceiling: Option<f64> = None;
    let mut lean: Option<f64> = None;
    let mut reports: Vec<Report> = Vec::new();
    for name in wanted {
        eprintln!("running {name}...");
        if [
            "sandbox",
            "cluster",
            "retention",
            "languages",
            "traces",
            "flow",
            "canary",
            "ordered",
            "effects",
            "dedupe",
            "scheduled",
            "footprint",
            "density",
        ]
        .contains(&name)
        {
            let reports_of = match name {
                "traces" => bench.traces(args.messages, args.retries).await?,
                "flow" => bench.flow(args.messages).await?,
                "canary" => bench.canary(args.messages).await?,
                "ordered" => bench.ordered(args.messages, args.messages).await?,
                "effects" => bench.effects(args.messages).await?,
                "dedupe" => bench.dedupe(args.messages).await?,
                "scheduled" => bench.scheduled(10_000).await?,
                "footprint" => bench.footprint(&args.subscriptions).await?,
                "density" => {
                    bench
                        .density(
                            &args.subscriptions,
                            args.density_samples,
                            args.density_polling,
                        )
                        .await?
                }
                "sandbox" => bench.sandbox(20_000).await?,
                "cluster" => bench.cluster(args.messages).await?,
                "languages" => bench.languages(args.messages / 5, 200).await?,
                _ => bench.retention(args.messages).await?,
            };
            for report in reports_of {
                if args.json {
                    println!("{}", report.json());
                }
                reports.push(report);
            }
            continue;
        }
        let mut report = match name {
            "ceiling" => bench.ceiling(args.messages).await?,
            "ceiling-server" => bench.ceiling_server(args.messages * 3, 4).await?,
            "ceiling-lean" => bench.ceiling_lean(args.messages).await?,
            "native" => bench.host_path("native", args.messages).await?,
            "wasm" => bench.host_path("wasm", args.messages).await?,
            "native-doorbell" | "wasm-doorbell" => bench.host_path(name, args.messages).await?,
            "wasm-isolated" => bench.host_path("wasm-isolated", args.messages).await?,
            "retry" => bench.retry(args.retries, Duration::from_secs(1)).await?,
            "retry-backlog" => {
                bench
                    .retry_backlog(args.retries / 10, Duration::from_secs(1), 5_000, false)
                    .await?
            }
            "retry-backlog-lane" => {
                bench
                    .retry_backlog(args.retries / 10, Duration::from_secs(1), 5_000, true)
                    .await?
            }
            "drain" => bench.drain(args.drain).await?,
            "fan-out" => bench.fan_out(args.retries, Duration::from_secs(1)).await?,
            "swap" => bench.swap(args.messages).await?,
            "ui" => bench.ui(args.ui_parked, args.ui_dead).await?,
            _ => unreachable!("checked above"),
        };
        if name == "ceiling" {
            ceiling = Some(report.msgs_per_s);
        } else if RATIO_TO_CEILING.contains(&name) {
            report.ratio_to_ceiling = ceiling.map(|c| report.msgs_per_s / c);
        }
        if name == "ceiling-lean" {
            lean = Some(report.msgs_per_s);
        } else if let Some(lean) = lean.filter(|_| RATIO_TO_CEILING.contains(&name)) {
            report.extra.push(("x_to_lean", report.msgs_per_s / lean));
        }
        report.mark_budget();
        if args.json {
            println!("{}", report.json());
        }
        reports.push(report);
    }
    if !args.json {
        print!("{}", Report::table(&reports));
    }
    Ok(())
}

/// The host's allocator (see the `sluice` binary's), so the bench measures what ships.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
