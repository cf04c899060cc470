//! The binary's log output: the `--log-format` choice and the subscriber that writes every
//! `tracing` event to stderr (and hands spans to the trace exporter), set up once by `main`.

/// How log lines look: chosen with `--log-format`; the level comes from `RUST_LOG`.
#[derive(Clone, Copy, clap::ValueEnum)]
// A doc comment on a value would be its help, and change `--help`'s list of values.
#[allow(missing_docs)]
pub enum LogFormat {
    Human,
    Json,
}

/// Log to stderr through a writer thread, so a slow terminal or pipe never blocks the async
/// workers (lines are dropped, not waited for, if it falls far behind). The guard flushes what
/// is queued when `main` returns.
pub fn init_tracing(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = filter();
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .finish(std::io::stderr());
    // Traces: off until the config says where they go (see `crate::observe::telemetry`).
    let otel = crate::observe::telemetry::layer();
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    // The filter is the log's: traces take the spans they need whatever RUST_LOG says.
    let registry = tracing_subscriber::registry().with(otel);
    match format {
        LogFormat::Human => registry.with(fmt.with_filter(filter)).init(),
        LogFormat::Json => registry
            .with(
                fmt.json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_filter(filter),
            )
            .init(),
    }
    guard
}

/// `RUST_LOG` (default `info`), with the chatty dependencies held at warnings (or errors).
fn filter() -> tracing_subscriber::EnvFilter {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // notify reports watches it could not remove (a build deleted the directory) at info; the
    // trace exporter's own HTTP and gRPC crates would log each export.
    for directive in [
        "notify=warn",
        "h2=warn",
        "hyper=warn",
        "hyper_util=warn",
        "tonic=warn",
        "tower=warn",
        "reqwest=warn",
        "opentelemetry=warn",
        "opentelemetry_sdk=warn",
        "opentelemetry_otlp=warn",
        // wasmtime's HTTP client logs each failed outbound request as Rust debug output; the
        // handler gets the error and the delivery's line says what came of it.
        "wasmtime_wasi_http=error",
    ] {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}
