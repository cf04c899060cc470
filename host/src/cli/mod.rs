//! The subcommands, at the edge of the program: typed errors from the modules become
//! context-rich `anyhow` errors that say what to do. [`Cli`] is the command line `main` parses;
//! [`execute`] hands each [`Command`] to its file, which holds the command's arguments (their
//! doc comments are its help), its work, and what it prints. What several share (building the
//! plan, finding Redis) is here.
//!
//! - Handler projects: [`new`], [`build`], [`dev`] (rebuild and hot-swap on save), [`tools`]
//!   (the toolchains a language needs), [`cache`] (the compile cache).
//! - Running: [`run`], [`check`] (the plan, without starting it), [`send`] (one entry),
//!   [`test`] (the handler on made-up deliveries, without Redis).
//! - Looking: [`status`], [`parked`], [`dead_letters`], [`keys`] (ordered keys that wait; and
//!   releasing one), [`scaler`] (the scaling signal, served from Redis alone).
//! - Acting: [`pause`] (and resume), [`swap`] (and rollback, canary), [`requeue`],
//!   [`retry_now`], [`delete`], [`replay`] (dead letters against a candidate, dry run).
//! - The edge: [`args`] (what several commands' arguments share), [`logs`] (`--log-format` and
//!   the log subscriber).

mod args;
mod build;
mod cache;
mod check;
mod dead_letters;
mod delete;
mod dev;
mod keys;
mod logs;
mod new;
mod parked;
mod pause;
mod replay;
mod requeue;
mod retry_now;
mod run;
mod scaler;
mod send;
mod status;
mod swap;
mod test;
mod tools;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::config::Config;
use crate::runtime::Runtime;
use crate::service::plan::Plan;

pub use build::build;
pub use cache::cache_prune;
pub use check::check;
pub use dead_letters::{DeadLetterQuery, dead_letters};
pub use delete::{Deletion, delete};
pub use dev::dev;
pub use logs::{LogFormat, init_tracing};
pub use new::new;
pub use parked::parked;
pub use pause::{pause, resume};
pub use replay::{ReplayRequest, replay};
pub use requeue::{RequeueRequest, requeue};
pub use retry_now::retry_now;
pub use run::run;
pub use scaler::start as start_scaler;
pub use send::send;
pub use status::{SHOW_ALL_UP_TO, StatusOptions, StatusReport, status};
pub use swap::{SwapRequest, swap};
pub use tools::{tools_install, tools_list};

/// The command line: what `main` parses before anything else runs.
#[derive(clap::Parser)]
#[command(
    name = "sluice",
    version = crate::LONG_VERSION,
    about = "Run WebAssembly handlers on Redis Streams consumer groups"
)]
pub struct Cli {
    /// Log format: human-readable lines or JSON objects. The level comes from RUST_LOG.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
    /// The subcommand to run, for [`execute`].
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands, each with its own arguments; a variant's doc comment is its help.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Write a new handler project (handler, descriptor with a delayed retry, sluice.toml,
    /// README, .gitignore) in ./<name>.
    New(new::Args),
    /// Build the handler project in a directory (cargo, componentize-py or componentize-js)
    /// into target/<name>.wasm, and print that path.
    Build(build::Args),
    /// Build the project, run it (with a private dev Redis unless --redis), and rebuild and
    /// hot-swap on every change to its sources; a failed build keeps the last good handler.
    Dev(dev::Args),
    /// Run the subscriptions of config files and/or components until SIGTERM or ctrl-c.
    Run(run::Args),
    /// List what waits in each subscription's delayed-retry set: origin id, retry count, due
    /// time and time left, oldest first.
    Parked(parked::Args),
    /// What an operator looks at first: per subscription the group's consumers, pending and
    /// unread counts, parked entries and the next due time, dead letters and the handler digest.
    /// With more than 20, a summary first and only those with something to see.
    Status(status::Args),
    /// Serve the scaling signal for an autoscaler (KEDA's metrics-api): per subscription the
    /// entries that need a host now (unread, pending, parked and due) and the seconds until the
    /// next parked retry is due, at GET /v1/scaling, read from Redis alone (no host needed).
    Scaler(scaler::Args),
    /// Pause subscriptions: every host of the group stops taking new entries and due retries
    /// within a second (deliveries in flight finish), until `sluice resume`. Kept in Redis, so
    /// it holds across restarts.
    Pause(pause::Args),
    /// Resume paused subscriptions: every host of the group reads again within a second.
    Resume(pause::ResumeArgs),
    /// Replace a running host's handler for a stream (or roll it back), through its admin API.
    Swap(swap::Args),
    /// List dead letters, newest first: id, time, origin id, retries, reason and fields.
    DeadLetters(dead_letters::Args),
    /// Put dead letters back onto their stream (attempts reset; the entry records where it came
    /// from); each one moves in one atomic step.
    Requeue(requeue::Args),
    /// Run a candidate component on dead letters in a dry run: what would it do with each?
    /// Nothing is acknowledged, parked or written (unless --requeue-acked).
    Replay(replay::Args),
    /// Make parked retries due now; the next sweep of a running host moves them back.
    RetryNow(retry_now::Args),
    /// Delete dead letters or parked retries for good (poison entries).
    Delete(delete::Args),
    /// List the ordered keys whose entries wait, behind what (a turn in flight, a parked
    /// retry and its due time, a held dead letter); `--release KEY` lets a key's entries go.
    Keys(keys::Args),
    /// Add a test entry to a stream of the project: the JSON object goes into the
    /// subscription's payload field (on a partitioned stream, in the partition its `id` picks).
    Send(send::Args),
    /// The Python and JavaScript build tools: where each is found, or install the pinned
    /// versions into the per-user tools directory.
    Tools(tools::Args),
    /// The compiled-component cache.
    Cache(cache::Args),
    /// Validate configs and components and print the resolved plan, without running anything.
    Check(check::Args),
    /// Run the handler on made-up deliveries (JSON fixtures) with no Redis, in its real
    /// sandbox with its subscription's grants, and check each outcome against its `expect`.
    Test(test::Args),
}

/// Run `command` to the end, printing its report on stdout; the error says what went wrong
/// (`main` prints it and exits with a failure).
pub async fn execute(command: Command) -> Result<()> {
    match command {
        Command::New(args) => new::execute(args),
        Command::Build(args) => build::execute(args),
        Command::Dev(args) => dev::execute(args).await,
        Command::Run(args) => run::execute(args).await,
        Command::Parked(args) => parked::execute(args).await,
        Command::Status(args) => status::execute(args).await,
        Command::Scaler(args) => scaler::execute(args).await,
        Command::Pause(args) => pause::execute(args).await,
        Command::Resume(args) => pause::execute_resume(args).await,
        Command::Swap(args) => swap::execute(args).await,
        Command::DeadLetters(args) => dead_letters::execute(args).await,
        Command::Requeue(args) => requeue::execute(args).await,
        Command::Replay(args) => replay::execute(args).await,
        Command::RetryNow(args) => retry_now::execute(args).await,
        Command::Delete(args) => delete::execute(args).await,
        Command::Keys(args) => keys::execute(args).await,
        Command::Send(args) => send::execute(args).await,
        Command::Tools(args) => tools::execute(args),
        Command::Cache(args) => cache::execute(args),
        Command::Check(args) => check::execute(args).await,
        Command::Test(args) => test::execute(args).await,
    }
}

/// Where the private dev Redis keeps its data.
pub const DEV_REDIS_DIR: &str = ".sluice/dev-redis";

/// Load the configuration and every component, and resolve the subscriptions.
pub(crate) async fn plan(paths: &[PathBuf], redis: Option<&str>) -> Result<Plan> {
    plan_of(&load(paths)?, redis, false).await
}

/// [`plan`] of a loaded configuration; `quick_compile` for `sluice dev`.
pub(crate) async fn plan_of(
    config: &Config,
    redis: Option<&str>,
    quick_compile: bool,
) -> Result<Plan> {
    let options = crate::runtime::RuntimeOptions {
        quick_compile,
        ..crate::runtime::RuntimeOptions::for_config(config)
    };
    let runtime = Runtime::new(Some(&config.cache_dir), options)
        .context("cannot start the WebAssembly runtime")?;
    Plan::build(config, &runtime, redis)
        .await
        .context("cannot build the plan")
}

/// Load the configuration of `paths`; the default (./sluice.toml) missing says what to give.
pub(crate) fn load(paths: &[PathBuf]) -> Result<Config> {
    // A dev server may be running beside the config, when the command runs elsewhere.
    if let Some(dir) = paths
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "toml"))
        .and_then(|p| p.parent())
    {
        let _ = CONFIG_DEV_REDIS.set(dir.join(DEV_REDIS_DIR));
    }
    if paths.is_empty() {
        anyhow::bail!("give at least one config (.toml) or component (.wasm)");
    }
    if let [only] = paths
        && only == Path::new("sluice.toml")
        && !only.exists()
    {
        anyhow::bail!(
            "no sluice.toml in {}: run this in a project's directory (`sluice new <name>` makes one) or give configs (.toml) or components (.wasm)",
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| "this directory".to_owned())
        );
    }
    let config = Config::load(paths).context("invalid configuration")?;
    crate::observe::telemetry::set_config(config.telemetry.as_ref());
    Ok(config)
}

/// Load the configuration and reach the Redis of each subscription, before anything is
/// compiled: a command that only reads Redis says "no Redis" at once. Such a command needs
/// only the components' descriptors, so it compiles them as `sluice dev` does (quickly, and
/// into the cache entries `sluice dev` made).
pub(crate) async fn plan_after_redis(paths: &[PathBuf], redis: Option<&str>) -> Result<Plan> {
    let config = load(paths)?;
    let mut reached = std::collections::HashSet::new();
    for sub in &config.subscriptions {
        let configured = redis.or(sub.redis.as_deref());
        if !reached.insert(configured.map(str::to_owned)) {
            continue;
        }
        let url = redis_url_for(configured)?;
        let conn = crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
        drop(conn);
    }
    plan_of(&config, redis, true).await
}

/// The traces of an operator's command (a requeue, a retry-now: spans in each entry's trace),
/// exported while it runs when `[telemetry]` or the `OTEL_*` variables name a collector, and
/// flushed when dropped.
pub(crate) struct OperatorTraces(Option<crate::observe::telemetry::Exporting>);

impl OperatorTraces {
    /// Start exporting as the configuration at `paths` says.
    pub(crate) fn start(paths: &[PathBuf]) -> Result<Self> {
        let config = load(paths)?;
        let exporting = crate::observe::telemetry::start(config.telemetry.as_ref())
            .context("cannot export traces as configured")?;
        Ok(Self(exporting))
    }
}

impl Drop for OperatorTraces {
    fn drop(&mut self) {
        if let Some(exporting) = self.0.take() {
            // The flush needs the runtime (gRPC runs on it): block this worker only.
            tokio::task::block_in_place(|| exporting.stop());
        }
    }
}

/// The Redis URL for commands that only talk to Redis: `--redis`, else the subscription's own,
/// else a dev server started by an earlier `sluice run` in this directory.
pub(crate) fn redis_url_for(configured: Option<&str>) -> Result<String> {
    if let Some(url) = configured {
        return Ok(url.to_owned());
    }
    crate::store::devredis::running_url(Path::new(DEV_REDIS_DIR))
        .or_else(|| CONFIG_DEV_REDIS.get().and_then(|d| crate::store::devredis::running_url(d)))
        .context(
            "no Redis URL is configured and no dev redis-server of `sluice dev` or `sluice run` is running here or beside the config; pass --redis <url>",
        )
}

/// The dev server's directory beside the config a command loaded (see [`load`]).
static CONFIG_DEV_REDIS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

pub(crate) use crate::control::operate::format_ms;

/// One subscription partition an operation acts on, with a connection to its Redis.
pub(crate) struct Target {
    /// Its keys.
    pub keys: crate::store::keys::SubscriptionKeys,
    /// Its Redis.
    pub conn: crate::store::redis_conn::RedisHandle,
}

/// The partitions of every subscription in `plan` (only those of stream `stream`, given as
/// the subscription's stream or one partition's), each with a connection.
pub(crate) async fn targets(plan: &Plan, stream: Option<&str>) -> Result<Vec<Target>> {
    let mut targets = Vec::new();
    for sub in &plan.subscriptions {
        let parts: Vec<_> = sub
            .stream
            .partitioned()
            .into_iter()
            .filter(|p| stream.is_none_or(|name| name == p.stream || name == sub.stream.stream))
            .collect();
        if parts.is_empty() {
            continue;
        }
        let url = redis_url_for(sub.redis.as_deref())?;
        let conn = crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access).await?;
        for p in parts {
            targets.push(Target {
                keys: crate::store::keys::SubscriptionKeys::of(&p)
                    .with_dead_letter_maxlen(sub.dead_letter_maxlen)
                    .with_retry_lane(sub.retry_lane),
                conn: conn.clone(),
            });
        }
    }
    if targets.is_empty() {
        anyhow::bail!(
            "no subscription{}",
            stream
                .map(|s| format!(" reads stream `{s}`"))
                .unwrap_or_default()
        );
    }
    Ok(targets)
}

/// Set when the user pressed ctrl-c: a long batch operation stops after the entry it is on
/// (each entry moves in one atomic script, so nothing is left half done).
pub(crate) fn interrupted() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let set = flag.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            set.store(true, std::sync::atomic::Ordering::Release);
        }
    });
    flag
}

/// A progress bar on stderr for `what` (hidden when stderr is not a terminal).
pub(crate) fn progress(what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_message(what.to_owned());
    bar
}
