//! `sluice`: run WebAssembly handlers on Redis Streams. Parses arguments, sets up logging, and
//! hands over to the library's commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Every allocation goes through mimalloc: with glibc's (and more so musl's, the static
/// binary's) a delivery freeing on one worker what the read allocated on another waited on the
/// other's arena lock, about a sixth of the workers' context switches in `sluice-bench wasm`
/// (issue 50: with mimalloc 16 % more `wasm` messages a second, 15-30 % less host time per
/// message).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sluice",
    version = sluice_host::LONG_VERSION,
    about = "Run WebAssembly handlers on Redis Streams consumer groups"
)]
struct Cli {
    /// Log format: human-readable lines or JSON objects. The level comes from RUST_LOG.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Write a new handler project (handler, descriptor with a delayed retry, sluice.toml,
    /// README, .gitignore) in ./<name>.
    New {
        /// The project's name: its directory, package and stream.
        name: String,
        /// The handler's language.
        #[arg(long, value_enum, default_value_t = sluice_host::project::Lang::Rust)]
        lang: sluice_host::project::Lang,
        /// Rust: take sluice-guest from this directory (a checkout's guest-sdk, for work on the
        /// SDK), written as a path relative to the project. Default: a copy of the SDK in the
        /// project's own sluice-sdk/, from this sluice.
        #[arg(long, env = "SLUICE_SDK_PATH")]
        sdk_path: Option<PathBuf>,
        /// What the handler does: `ack` acks (and retries once on request); `http` calls an
        /// HTTP API and parks a durable retry when the call fails.
        #[arg(long, value_enum, default_value_t = sluice_host::project::Template::Ack)]
        template: sluice_host::project::Template,
    },
    /// Build the handler project in a directory (cargo, componentize-py or componentize-js)
    /// into target/<name>.wasm, and print that path.
    Build {
        /// The project's directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Build the project, run it (with a private dev Redis unless --redis), and rebuild and
    /// hot-swap on every change to its sources; a failed build keeps the last good handler.
    Dev {
        /// The project's directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Redis URL (default: the project's sluice.toml, else a private dev server).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Run the subscriptions of config files and/or components until SIGTERM or ctrl-c.
    Run {
        /// `.toml` configs and/or `.wasm` components (a component alone runs its own descriptor).
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// Redis URL for every subscription (overrides the configs; default: a private dev server).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// List what waits in each subscription's delayed-retry set: origin id, retry count, due
    /// time and time left, oldest first.
    Parked {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// Only the subscription to this stream.
        #[arg(long)]
        stream: Option<String>,
        /// One JSON object per set, one per line.
        #[arg(long)]
        json: bool,
        /// At most this many per set, earliest due first.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// What an operator looks at first: per subscription the group's consumers, pending and
    /// unread counts, parked entries and the next due time, dead letters and the handler digest.
    /// With more than 20, a summary first and only those with something to see.
    Status {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// One JSON object per subscription, one per line (every one).
        #[arg(long)]
        json: bool,
        /// Every subscription, not only those with something to see (with more than 20).
        #[arg(long)]
        all: bool,
        /// Only streams whose name contains this.
        #[arg(long)]
        stream: Option<String>,
        /// The longest the whole report may take; what has not answered by then is named.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: std::time::Duration,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Pause subscriptions: every host of the group stops taking new entries and due retries
    /// within a second (deliveries in flight finish), until `sluice resume`. Kept in Redis, so
    /// it holds across restarts.
    Pause {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// Only the subscription to this stream.
        #[arg(long)]
        stream: Option<String>,
        /// Why (shown by `sluice status`, the page and the hosts' logs).
        #[arg(long)]
        reason: Option<String>,
        /// Who pauses (default: user@machine).
        #[arg(long)]
        by: Option<String>,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Resume paused subscriptions: every host of the group reads again within a second.
    Resume {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// Only the subscription to this stream.
        #[arg(long)]
        stream: Option<String>,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Replace a running host's handler for a stream (or roll it back), through its admin API.
    Swap {
        /// The subscription's stream.
        stream: String,
        /// The new component (omit with --rollback or --abort-canary).
        #[arg(required_unless_present_any = ["rollback", "abort_canary"])]
        component: Option<PathBuf>,
        /// Put the previous handler back instead.
        #[arg(long, conflicts_with = "component")]
        rollback: bool,
        /// Try the component on this share of deliveries first (e.g. 10%), on every host of
        /// the group; the hosts promote it or roll it back by themselves.
        #[arg(
            long,
            value_name = "PERCENT",
            requires = "component",
            conflicts_with = "force"
        )]
        canary: Option<String>,
        /// How long the canary runs (e.g. 5m; default: the subscription's `canary.window`).
        #[arg(long = "for", value_name = "DURATION", requires = "canary")]
        window: Option<String>,
        /// End the running canary: every host serves the current version again.
        #[arg(long, conflicts_with_all = ["component", "rollback", "canary"])]
        abort_canary: bool,
        /// The subscription's group (needed when the host reads the stream with several).
        #[arg(long)]
        group: Option<String>,
        /// Accept a component whose descriptor names another stream or group.
        #[arg(long)]
        force: bool,
        /// The host's admin API.
        #[arg(long, env = "SLUICE_ADMIN", default_value = "http://127.0.0.1:9187")]
        admin: String,
        /// Bearer token for the admin API.
        #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Read the bearer token from this file.
        #[arg(long, conflicts_with = "token")]
        token_file: Option<PathBuf>,
    },
    /// List dead letters, newest first: id, time, origin id, retries, reason and fields.
    DeadLetters {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// Only the subscription to this stream (or this one partition).
        #[arg(long)]
        stream: Option<String>,
        /// Only dead letters whose reason contains this text (case-insensitive).
        #[arg(long)]
        reason: Option<String>,
        /// At most this many per dead-letter stream.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Show these dead letters (by id) whole, fields untruncated.
        #[arg(long = "id", value_name = "DEAD_LETTER_ID")]
        ids: Vec<String>,
        /// One JSON object per dead letter, one per line.
        #[arg(long)]
        json: bool,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Put dead letters back onto their stream (attempts reset; the entry records where it came
    /// from); each one moves in one atomic step.
    Requeue {
        /// The subscription's `.toml` config or `.wasm` component (default: ./sluice.toml),
        /// then the dead-letter ids to requeue.
        #[arg(
            value_name = "[CONFIG] DEAD_LETTER_ID",
            required_unless_present = "all"
        )]
        args: Vec<String>,
        /// Requeue every dead letter (of `--stream`, whose reason contains `--reason`).
        #[arg(long)]
        all: bool,
        /// With --all: only those whose reason contains this text (case-insensitive).
        #[arg(long, requires = "all")]
        reason: Option<String>,
        /// Say what would be requeued; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only the subscription to this stream (or this one partition).
        #[arg(long)]
        stream: Option<String>,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Run a candidate component on dead letters in a dry run: what would it do with each?
    /// Nothing is acknowledged, parked or written (unless --requeue-acked).
    Replay {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// The candidate component.
        #[arg(long)]
        candidate: PathBuf,
        /// Only the subscription to this stream (or this one partition).
        #[arg(long)]
        stream: Option<String>,
        /// Only dead letters whose reason contains this text (case-insensitive).
        #[arg(long)]
        reason: Option<String>,
        /// At most this many dead letters per dead-letter stream, newest first.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Let the candidate reach these hosts over HTTP during the replay (comma-separated
        /// `allowed_outbound_hosts` entries, e.g. https://api.example.com); none by default.
        #[arg(long, value_name = "HOSTS")]
        allow_http: Vec<String>,
        /// Then requeue exactly the dead letters the candidate acknowledged; the candidate must
        /// be what the group serves (asked of --admin), or be swapped in with --swap.
        #[arg(long)]
        requeue_acked: bool,
        /// With --requeue-acked: swap the candidate in first (through --admin).
        #[arg(long, requires = "requeue_acked")]
        swap: bool,
        /// The host's admin API (for --requeue-acked).
        #[arg(long, env = "SLUICE_ADMIN", default_value = "http://127.0.0.1:9187")]
        admin: String,
        /// Bearer token for the admin API.
        #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Make parked retries due now; the next sweep of a running host moves them back.
    RetryNow {
        /// The subscription's `.toml` config or `.wasm` component (default: ./sluice.toml),
        /// then the origin ids of the parked retries.
        #[arg(value_name = "[CONFIG] ORIGIN_ID", required_unless_present = "all")]
        args: Vec<String>,
        /// Every parked retry that is not yet due.
        #[arg(long)]
        all: bool,
        /// Only the subscription to this stream (or this one partition).
        #[arg(long)]
        stream: Option<String>,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Delete dead letters or parked retries for good (poison entries).
    Delete {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// Dead-letter ids to delete.
        #[arg(
            long = "dead-letter",
            value_name = "DEAD_LETTER_ID",
            required_unless_present = "parked",
            conflicts_with = "parked"
        )]
        dead_letter: Vec<String>,
        /// Origin ids of parked retries to delete.
        #[arg(long, value_name = "ORIGIN_ID", num_args = 1..)]
        parked: Vec<String>,
        /// Only the subscription to this stream (or this one partition).
        #[arg(long)]
        stream: Option<String>,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice run`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// Add a test entry to a stream of the project: the JSON object goes into the
    /// subscription's payload field (on a partitioned stream, in the partition its `id` picks).
    Send {
        /// The stream (may be left out when the config has one subscription), then the entry
        /// as a JSON object.
        #[arg(value_name = "[STREAM] JSON", num_args = 1..=2, required = true)]
        args: Vec<String>,
        /// The project's config.
        #[arg(long, default_value = "sluice.toml")]
        config: PathBuf,
        /// Redis URL (default: the subscription's, else the dev server of a running `sluice dev`).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
    /// The Python and JavaScript build tools: where each is found, or install the pinned
    /// versions into the per-user tools directory.
    Tools {
        #[command(subcommand)]
        action: Option<ToolsAction>,
    },
    /// The compiled-component cache.
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Validate configs and components and print the resolved plan, without running anything.
    Check {
        /// `.toml` configs and/or `.wasm` components.
        #[arg(default_value = "sluice.toml")]
        paths: Vec<PathBuf>,
        /// Redis URL for every subscription (overrides the configs).
        #[arg(long, env = "SLUICE_REDIS_URL")]
        redis: Option<String>,
    },
}

#[derive(Subcommand)]
enum ToolsAction {
    /// Install componentize-py and componentize-js (pinned versions, through pip and npm)
    /// into the per-user tools directory (`SLUICE_TOOLS_DIR`, else ~/.local/share/sluice/tools).
    Install,
}

#[derive(Subcommand)]
enum CacheAction {
    /// Remove compiled components not used for a while.
    Prune {
        /// The cache directory (default: the config's `cache_dir`, else .sluice/cache).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Remove what was not used for this long (`0s`: everything).
        #[arg(long, default_value = "7d")]
        older_than: String,
    },
}

/// `[CONFIG] ID...`: the first argument is the config when it names a `.toml` or `.wasm`
/// file, else every argument is an id and the config is ./sluice.toml.
fn config_and_ids(mut args: Vec<String>, all: bool) -> anyhow::Result<(PathBuf, Vec<String>)> {
    let is_config = args
        .first()
        .is_some_and(|a| a.ends_with(".toml") || a.ends_with(".wasm"));
    let config = if is_config {
        PathBuf::from(args.remove(0))
    } else {
        PathBuf::from("sluice.toml")
    };
    if all && !args.is_empty() {
        anyhow::bail!("give ids or --all, not both");
    }
    if !all && args.is_empty() {
        anyhow::bail!("give at least one id, or --all");
    }
    Ok((config, args))
}

/// Log to stderr through a writer thread, so a slow terminal or pipe never blocks the async
/// workers (lines are dropped, not waited for, if it falls far behind). The guard flushes what
/// is queued when `main` returns.
fn init_tracing(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
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
    ] {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .finish(std::io::stderr());
    // Traces: off until the config says where they go (see `sluice_host::observe::telemetry`).
    let otel = sluice_host::observe::telemetry::layer();
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    // The filter is the log's: traces take the spans they need whatever RUST_LOG says.
    use tracing_subscriber::Layer as _;
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

fn main() -> ExitCode {
    // The host's own compiling child (see `sluice_host::runtime::compile`): not a command for
    // people, so not in the help.
    sluice_host::runtime::compile::serve_compiles();
    sluice_host::support::memory::give_back_big_allocations();
    let cli = Cli::parse();
    let _logs = init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::New {
                name,
                lang,
                sdk_path,
                template,
            } => sluice_host::cli::new(&name, lang, template, sdk_path.as_deref()),
            Command::Send {
                args,
                config,
                redis,
            } => {
                let (stream, json) = match args.as_slice() {
                    [json] => (None, json.clone()),
                    [stream, json] => (Some(stream.clone()), json.clone()),
                    _ => anyhow::bail!("give [STREAM] JSON"),
                };
                let added =
                    sluice_host::cli::send(&config, redis.as_deref(), stream.as_deref(), &json)
                        .await?;
                println!("{added}");
                Ok(())
            }
            Command::Tools { action } => {
                let report = match action {
                    None => sluice_host::cli::tools_list(),
                    Some(ToolsAction::Install) => sluice_host::cli::tools_install()?,
                };
                print!("{report}");
                Ok(())
            }
            Command::Cache {
                action: CacheAction::Prune { dir, older_than },
            } => {
                let done = sluice_host::cli::cache_prune(dir.as_deref(), &older_than)?;
                print!("{done}");
                Ok(())
            }
            Command::Build { dir } => sluice_host::cli::build(&dir).map(|_| ()),
            Command::Dev { dir, redis } => sluice_host::cli::dev(&dir, redis.as_deref()).await,
            Command::Run { paths, redis } => sluice_host::cli::run(&paths, redis.as_deref()).await,
            Command::Parked {
                paths,
                stream,
                json,
                limit,
                redis,
            } => {
                let listing = sluice_host::cli::parked(
                    &paths,
                    redis.as_deref(),
                    stream.as_deref(),
                    json,
                    limit,
                )
                .await?;
                print!("{listing}");
                Ok(())
            }
            Command::Status {
                paths,
                json,
                all,
                stream,
                timeout,
                redis,
            } => {
                let options = sluice_host::cli::StatusOptions {
                    json,
                    all,
                    stream,
                    timeout,
                };
                let report = sluice_host::cli::status(&paths, redis.as_deref(), &options).await?;
                print!("{}", report.text);
                if report.failed > 0 {
                    anyhow::bail!(
                        "{} subscription rows could not be read (named above)",
                        report.failed
                    );
                }
                Ok(())
            }
            Command::Pause {
                paths,
                stream,
                reason,
                by,
                redis,
            } => {
                let done = sluice_host::cli::pause(
                    &paths,
                    redis.as_deref(),
                    stream.as_deref(),
                    by.as_deref(),
                    reason.as_deref(),
                )
                .await?;
                print!("{done}");
                Ok(())
            }
            Command::Resume {
                paths,
                stream,
                redis,
            } => {
                let done =
                    sluice_host::cli::resume(&paths, redis.as_deref(), stream.as_deref()).await?;
                print!("{done}");
                Ok(())
            }
            Command::Swap {
                stream,
                component,
                rollback: _,
                canary,
                window,
                abort_canary,
                group,
                force,
                admin,
                token,
                token_file,
            } => {
                let token = match token_file {
                    Some(file) => Some(
                        sluice_host::config::TokenSource::File(file)
                            .read()
                            .map_err(anyhow::Error::msg)?,
                    ),
                    None => token,
                };
                let request = sluice_host::cli::SwapRequest {
                    admin,
                    stream,
                    group,
                    component,
                    force,
                    canary,
                    window,
                    abort_canary,
                    token,
                };
                let done = sluice_host::cli::swap(request).await?;
                print!("{done}");
                Ok(())
            }
            Command::DeadLetters {
                paths,
                stream,
                reason,
                limit,
                ids,
                json,
                redis,
            } => {
                let listing = sluice_host::cli::dead_letters(sluice_host::cli::DeadLetterQuery {
                    paths,
                    redis,
                    stream,
                    reason,
                    limit,
                    ids,
                    json,
                })
                .await?;
                print!("{listing}");
                Ok(())
            }
            Command::Requeue {
                args,
                all,
                reason,
                dry_run,
                stream,
                redis,
            } => {
                let (path, ids) = config_and_ids(args, all)?;
                let done = sluice_host::cli::requeue(sluice_host::cli::RequeueRequest {
                    paths: vec![path],
                    redis,
                    stream,
                    ids,
                    all,
                    reason,
                    dry_run,
                })
                .await?;
                print!("{done}");
                Ok(())
            }
            Command::Replay {
                paths,
                candidate,
                stream,
                reason,
                limit,
                allow_http,
                requeue_acked,
                swap,
                admin,
                token,
                json,
                redis,
            } => {
                let done = sluice_host::cli::replay(sluice_host::cli::ReplayRequest {
                    paths,
                    redis,
                    stream,
                    candidate,
                    reason,
                    limit,
                    allow_http,
                    requeue_acked,
                    swap,
                    admin,
                    token,
                    json,
                })
                .await?;
                print!("{done}");
                Ok(())
            }
            Command::RetryNow {
                args,
                all,
                stream,
                redis,
            } => {
                let (path, ids) = config_and_ids(args, all)?;
                let done = sluice_host::cli::retry_now(
                    &[path],
                    redis.as_deref(),
                    stream.as_deref(),
                    &ids,
                    all,
                )
                .await?;
                print!("{done}");
                Ok(())
            }
            Command::Delete {
                paths,
                dead_letter,
                parked,
                stream,
                redis,
            } => {
                let what = if parked.is_empty() {
                    sluice_host::cli::Deletion::DeadLetters(dead_letter)
                } else {
                    sluice_host::cli::Deletion::Parked(parked)
                };
                let done =
                    sluice_host::cli::delete(&paths, redis.as_deref(), stream.as_deref(), what)
                        .await?;
                print!("{done}");
                Ok(())
            }
            Command::Check { paths, redis } => {
                let plan = sluice_host::cli::check(&paths, redis.as_deref()).await?;
                print!("{plan}");
                Ok(())
            }
        }
    });
    // Blocking work still running (a compile cut off by a deadline) must not hold the exit:
    // dropping the runtime would wait for it.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Each cause once, even where a library prints its source in its own message.
            eprintln!("error: {}", sluice_host::support::chain::join(err.chain()));
            ExitCode::FAILURE
        }
    }
}

/// A command-line duration ("500ms", "30s", "2m"), at most a day: a deadline, not a schedule.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like \"500ms\", \"30s\" or \"2m\")"))?;
    if duration.is_zero() || duration > std::time::Duration::from_secs(86_400) {
        return Err("give a duration above 0 and at most 1 day".to_owned());
    }
    Ok(duration)
}
