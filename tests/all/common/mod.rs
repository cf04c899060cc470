//! Fixtures shared by every integration test: real `redis-server`s on free ports, the guest
//! components compiled once per test run, the host run in-process or as the `sluice` binary,
//! and waiting for conditions with deadlines (never sleeping and hoping).

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
mod config;
mod cut;
pub mod memory;
mod netns;

pub use config::{Raw, Sub, TestConfig};
pub use cut::CutProxy;
pub use netns::{LinkProxy, Netns};
pub use sluice_fixture_control::Control;
use sluice_host::store::devredis::{DevRedis, DevRedisOptions};
use sluice_host::{Config, Event, Plan, Service};
use tokio_util::sync::CancellationToken;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// Where cargo builds: `CARGO_TARGET_DIR`, or the workspace's `target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// The compiled guest components, built once per test run.
pub struct Guests {
    pub fixture: PathBuf,
    pub fixture_v2: PathBuf,
    /// The fixture whose `subscription()` waits for an hour in a WASI sleep.
    pub fixture_hang: PathBuf,
    /// The fixture whose descriptor orders by the payload's `account`, two per key.
    pub fixture_ordered: PathBuf,
    /// The fixture whose descriptor asks for the journal of outbound calls.
    pub fixture_journaled: PathBuf,
    pub bank: PathBuf,
    pub bank_manual: PathBuf,
    pub other_world: PathBuf,
}

pub fn guests() -> &'static Guests {
    static GUESTS: OnceLock<Guests> = OnceLock::new();
    GUESTS.get_or_init(|| {
        once_per_run("guests", || {
            let status = Command::new(cargo())
                .current_dir(root())
                .args(["build", "--release", "--target", "wasm32-wasip2"])
                .args(["-p", "sluice-fixture", "-p", "bank-payments"])
                .args(["-p", "bank-payments-manual", "-p", "sluice-other-world"])
                .args(["-p", "sluice-fixture-v2", "-p", "sluice-fixture-hang"])
                .args([
                    "-p",
                    "sluice-fixture-ordered",
                    "-p",
                    "sluice-fixture-journaled",
                ])
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building the guest components failed");
            String::new()
        });
        let dir = target_dir().join("wasm32-wasip2/release");
        Guests {
            fixture: dir.join("sluice_fixture.wasm"),
            fixture_v2: dir.join("sluice_fixture_v2.wasm"),
            fixture_hang: dir.join("sluice_fixture_hang.wasm"),
            fixture_ordered: dir.join("sluice_fixture_ordered.wasm"),
            fixture_journaled: dir.join("sluice_fixture_journaled.wasm"),
            bank: dir.join("bank_payments.wasm"),
            bank_manual: dir.join("bank_payments_manual.wasm"),
            other_world: dir.join("sluice_other_world.wasm"),
        }
    })
}

/// What `make` gives, made once per test run however many test processes ask for it: nextest
/// runs each test in a process of its own, so a `OnceLock` alone would build the guests and
/// the Python and JavaScript examples once per test. The first process to ask makes it under
/// a file lock and writes the run's id (nextest's, else this process's) and the result beside
/// it; the others wait on the lock and read the result.
pub fn once_per_run(name: &str, make: impl FnOnce() -> String) -> String {
    let run = std::env::var("NEXTEST_RUN_ID")
        .unwrap_or_else(|_| format!("process-{}", std::process::id()));
    let dir = target_dir().join("sluice-test-once");
    std::fs::create_dir_all(&dir).expect("create target/sluice-test-once");
    let lock = std::fs::File::create(dir.join(format!("{name}.lock"))).expect("lock file");
    lock.lock().expect("lock target/sluice-test-once");
    let stamp = dir.join(format!("{name}.done"));
    if let Some(result) = std::fs::read_to_string(&stamp)
        .ok()
        .and_then(|text| text.strip_prefix(&format!("{run}\n")).map(str::to_owned))
    {
        return result;
    }
    let result = make();
    std::fs::write(&stamp, format!("{run}\n{result}")).expect("write the stamp");
    result
}

/// The `sluice` binary cargo built for these tests.
pub fn sluice_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_sluice"))
}

/// Log what the host does when RUST_LOG asks for it.
pub fn init_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
    });
}

/// A real redis-server on a free loopback port, in its own temporary directory; stopped (by
/// its PID) when dropped.
pub struct Redis {
    pub server: DevRedis,
    _dir: tempfile::TempDir,
}

impl Redis {
    pub fn start() -> Self {
        Self::start_with(true, &[])
    }

    pub fn start_with(aof: bool, extra: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = DevRedisOptions {
            aof,
            reuse: false,
            password: false,
            die_with_host: false,
            extra_args: extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        let server = DevRedis::start(dir.path(), &options).expect("redis-server starts");
        Self { server, _dir: dir }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The test's own connection. redis-rs times replies out after 500 ms by default; on a
    /// loaded 2-core machine (guests spinning, a component compiling) the test's XADD can wait
    /// longer than that, and the test asserts behaviour, not latency.
    pub async fn conn(&self) -> MultiplexedConnection {
        let client = redis::Client::open(self.url()).expect("url");
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(30)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect to test redis")
    }
}

/// Wait until `check` returns `Some`, polling every 10 ms, or panic with `what` at `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    // Poll the condition every 10 ms until it holds or the deadline passes.
    let mut poll = tokio::time::interval(Duration::from_millis(10));
    loop {
        poll.tick().await;
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
    }
}

/// The Python and JavaScript bank-payments examples, built once per test run with `sluice
/// build` (componentize-py and componentize-js, as `scripts/setup` installs them).
pub struct Polyglot {
    pub python: PathBuf,
    pub js: PathBuf,
}

/// `PATH` with the build tools `scripts/setup` installs under `target/tools` first.
pub fn tools_path() -> String {
    let tools = root().join("target/tools");
    let mut dirs = vec![tools.join("py/bin"), tools.join("js/node_modules/.bin")];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs)
        .expect("PATH entries")
        .to_string_lossy()
        .into_owned()
}

/// `sluice build` in `dir`; the component's path.
pub fn sluice_build(dir: &Path) -> PathBuf {
    let (ok, path, err) = run_sluice_with(&["build"], dir, &[]);
    assert!(ok, "sluice build in {} failed:\n{err}", dir.display());
    dir.join(path.trim())
}

/// The hostile Python guest (`tests/guests/probe-python`), built once per test run.
pub fn probe_python() -> &'static Path {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE.get_or_init(|| built_once(&root().join("tests/guests/probe-python")))
}

/// [`sluice_build`] of `dir`, once per test run (see [`once_per_run`]).
fn built_once(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .expect("a project directory")
        .to_string_lossy();
    PathBuf::from(once_per_run(&format!("build-{name}"), || {
        sluice_build(dir).display().to_string()
    }))
}

pub fn polyglot() -> &'static Polyglot {
    static POLYGLOT: OnceLock<Polyglot> = OnceLock::new();
    POLYGLOT.get_or_init(|| {
        let (python, js) = std::thread::scope(|s| {
            let python = s.spawn(|| built_once(&root().join("examples/bank-payments-python")));
            let js = built_once(&root().join("examples/bank-payments-js"));
            (python.join().expect("python build"), js)
        });
        Polyglot { python, js }
    })
}

/// Write `toml` (with `{fixture}`, `{fixture_v2}`, `{bank}`, `{bank_manual}`, `{bank_python}`, `{bank_js}` and
/// `{other_world}` replaced by component paths) to a file in `dir`.
pub fn write_config(dir: &Path, name: &str, toml: &str) -> PathBuf {
    let g = guests();
    // Tests run in parallel: every host's admin server takes a free port.
    let mut toml = if toml.contains("admin =") {
        toml.to_owned()
    } else {
        format!("admin = \"127.0.0.1:0\"\n{toml}")
    };
    // Hosts share one compile cache (as the in-process ones do), so a `sluice run` does not
    // compile the fixture again on each start; a test of the cache names its own.
    if !toml.contains("cache_dir") {
        let cache = target_dir().join("sluice-test-cache");
        toml = format!("cache_dir = \"{}\"\n{toml}", cache.display());
    }
    // Mutating admin calls need a token, on loopback too: tests use `TEST_TOKEN` (a config
    // that says `# no admin token` gets none).
    if !toml.contains("admin_token")
        && !toml.contains("admin_open_on_loopback")
        && !toml.contains("# no admin token")
    {
        use std::os::unix::fs::PermissionsExt as _;
        let token = dir.join("admin-token");
        std::fs::write(&token, TEST_TOKEN).expect("write token");
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        toml = format!("admin_token_file = \"{}\"\n{toml}", token.display());
    }
    let text = toml
        .replace("{fixture_v2}", &g.fixture_v2.display().to_string())
        .replace(
            "{fixture_ordered}",
            &g.fixture_ordered.display().to_string(),
        )
        .replace(
            "{fixture_journaled}",
            &g.fixture_journaled.display().to_string(),
        )
        .replace("{fixture}", &g.fixture.display().to_string())
        .replace("{bank_manual}", &g.bank_manual.display().to_string())
        .replace("{bank}", &g.bank.display().to_string())
        .replace("{other_world}", &g.other_world.display().to_string());
    let text = if text.contains("{bank_python}") || text.contains("{bank_js}") {
        let p = polyglot();
        text.replace("{bank_python}", &p.python.display().to_string())
            .replace("{bank_js}", &p.js.display().to_string())
    } else {
        text
    };
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

/// Start an in-process host with `config` (a [`Sub`] or a [`TestConfig`]).
pub async fn start_fixture(redis: &Redis, config: impl Into<TestConfig>) -> TestHost {
    TestHost::start(redis, &config.into().to_string()).await
}

/// The host, run in-process against a test Redis.
pub struct TestHost {
    stop: CancellationToken,
    admin: tokio::sync::watch::Receiver<Option<std::net::SocketAddr>>,
    task: tokio::task::JoinHandle<Result<(), sluice_host::RunError>>,
    pub events: sluice_host::Listener,
    _dir: tempfile::TempDir,
}

impl TestHost {
    /// Start a host for the subscriptions in `toml` (see [`write_config`]).
    pub async fn start(redis: &Redis, toml: &str) -> Self {
        Self::start_at(&redis.url(), toml).await
    }

    /// Start a host for the subscriptions in `toml` against the Redis `url` names (a cluster's
    /// seed URLs separated by spaces, as the configuration carries them).
    pub async fn start_at(url: &str, toml: &str) -> Self {
        init_logs();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_config(dir.path(), "sluice.toml", toml);
        let config = Config::load(&[path]).expect("valid test config");
        let runtime = sluice_host::runtime::Runtime::new(
            Some(&target_dir().join("sluice-test-cache")),
            sluice_host::runtime::RuntimeOptions::for_config(&config),
        )
        .expect("runtime");
        let plan = Plan::build(&config, &runtime, Some(url))
            .await
            .expect("valid plan");
        let service = Service::new(plan);
        let events = service.events().subscribe();
        let admin = service.admin_addr();
        let stop = CancellationToken::new();
        let task = tokio::spawn(service.run(None, stop.clone()));
        Self {
            stop,
            admin,
            task,
            events,
            _dir: dir,
        }
    }

    /// The next event matching `pred`, skipping others, within `timeout`.
    pub async fn event(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> Event {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Ok(event)) if pred(&event) => return event,
                Ok(Ok(_)) => continue,
                Ok(Err(err)) => {
                    // The host ended: say how.
                    let ended = if self.task.is_finished() {
                        format!("{:?}", (&mut self.task).await)
                    } else {
                        "still running".to_owned()
                    };
                    panic!("event stream failed while waiting for {what}: {err} (host: {ended})")
                }
                Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }

    /// The admin server's address, once it listens.
    pub async fn admin(&mut self) -> std::net::SocketAddr {
        let addr = tokio::time::timeout(
            Duration::from_secs(10),
            self.admin.wait_for(Option::is_some),
        )
        .await
        .expect("the admin server starts")
        .expect("the host is running");
        addr.expect("checked")
    }

    /// Stop gracefully and return how the run ended.
    pub async fn stop(self) -> Result<(), sluice_host::RunError> {
        self.stop.cancel();
        self.task.await.expect("host task did not panic")
    }
}

/// A config written to a directory of its own, for `sluice run` to be started on it (again
/// and again, when a test kills it).
pub struct RunDir {
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl RunDir {
    /// `config` against `redis`, written to a fresh directory.
    pub fn new(redis: &Redis, config: impl Into<TestConfig>) -> Self {
        Self::with(config.into(), Some(redis))
    }

    /// `config` against the Redis at `url` (a proxy, an address across a link).
    pub fn at(url: &str, config: impl Into<TestConfig>) -> Self {
        Self::with_url(config.into(), Some(url.to_owned()))
    }

    /// `config`, run with `--redis` when `redis` is given (else its `redis` key decides).
    fn with(config: TestConfig, redis: Option<&Redis>) -> Self {
        Self::with_url(config, redis.map(Redis::url))
    }

    fn with_url(config: TestConfig, url: Option<String>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_config(dir.path(), "sluice.toml", &config.to_string());
        let mut args = vec!["run".to_owned(), path.display().to_string()];
        if let Some(url) = url {
            args.extend(["--redis".to_owned(), url]);
        }
        Self { dir, args }
    }

    /// Start `sluice run` here, inside the network namespace `ns`.
    pub fn spawn_in(&self, ns: &Netns) -> HostProcess {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        HostProcess::spawn_wrapped(&ns.wrap(), &args, self.dir.path(), &[])
    }

    /// Start `sluice run` here.
    pub fn spawn(&self) -> HostProcess {
        self.spawn_env(&[])
    }

    /// Start `sluice run` here with `env` added.
    pub fn spawn_env(&self, env: &[(&str, &str)]) -> HostProcess {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        HostProcess::spawn_with(&args, self.dir.path(), env)
    }

    /// The directory (its `sluice.toml` is the config).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Start `sluice run` once; the process keeps the directory.
    fn into_host(self) -> HostProcess {
        let mut host = self.spawn();
        host._dir = Some(self.dir);
        host
    }
}

/// The `sluice` binary run as a child process; killed by its PID when dropped.
pub struct HostProcess {
    pub child: Child,
    pub log: PathBuf,
    /// The directory it runs in, when the process owns it (see [`HostProcess::run`]).
    _dir: Option<tempfile::TempDir>,
}

impl HostProcess {
    /// `sluice run` on `config` against `redis`, in a directory of its own.
    pub fn run(redis: &Redis, config: impl Into<TestConfig>) -> Self {
        RunDir::new(redis, config).into_host()
    }

    /// `sluice run` on `config` alone (its `redis` key says where Redis is), in a directory
    /// of its own.
    pub fn spawn_in(config: TestConfig) -> Self {
        RunDir::with(config, None).into_host()
    }

    /// `sluice` with `args`, in `dir`.
    pub fn spawn(args: &[&str], dir: &Path) -> Self {
        Self::spawn_with(args, dir, &[])
    }

    /// `sluice` with `args`, in `dir`, with `env` added (e.g. a faked wall clock). Each
    /// process logs to a file of its own in `dir`.
    pub fn spawn_with(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::spawn_wrapped(&[], args, dir, env)
    }

    /// `sluice` with `args`, run by `wrapper` (a program that execs the rest of its command
    /// line, as `ip netns exec <ns>` does, so the PID is still the host's).
    pub fn spawn_wrapped(
        wrapper: &[String],
        args: &[&str],
        dir: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        static SPAWNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SPAWNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("sluice-{}-{n}.log", std::process::id()));
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(sluice_bin());
                command
            }
            None => Command::new(sluice_bin()),
        };
        let child = command
            .args(args)
            .current_dir(dir)
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("SLUICE_TEST_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("sluice starts");
        Self {
            child,
            log,
            _dir: None,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The admin server's address, from the host's log line.
    pub async fn admin_addr(&self) -> std::net::SocketAddr {
        wait_for(
            Duration::from_secs(20),
            "the admin server's log line",
            || {
                let text = self.log_text();
                async move {
                    text.lines()
                        .find(|l| l.contains("admin server listening"))
                        .and_then(|l| l.split("addr=").nth(1))
                        .and_then(|rest| rest.split_whitespace().next())
                        .and_then(|addr| addr.parse().ok())
                }
            },
        )
        .await
    }

    /// Wait for the process to exit by itself.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        wait_for(Duration::from_secs(30), "the host to exit", || {
            let status = self.child.try_wait().expect("try_wait");
            async move { status }
        })
        .await
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The host's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn terminate(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Run `sluice` to completion; returns (success, stdout, stderr).
pub fn run_sluice(args: &[&str], dir: &Path) -> (bool, String, String) {
    run_sluice_with(args, dir, &[])
}

/// `sluice` with `args` in `dir`, `env` added and the guest toolchains first on PATH:
/// (success, stdout, stderr).
pub fn run_sluice_with(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(sluice_bin())
        .args(args)
        .current_dir(dir)
        .env_remove("SLUICE_REDIS_URL")
        .env("PATH", tools_path())
        .envs(env.iter().copied())
        .output()
        .expect("sluice runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A loopback port nothing listened on a moment ago (for a server a test starts, or for one
/// that must not be there).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// XADD an entry whose `payload` field is `payload` as JSON (a [`Control`] for the fixture);
/// returns its id.
pub async fn add(
    conn: &mut impl ConnectionLike,
    stream: &str,
    payload: &impl serde::Serialize,
) -> String {
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("payload")
        .arg(serde_json::to_string(payload).expect("a payload serialises"))
        .query_async(conn)
        .await
        .expect("XADD")
}

/// How many entries are pending for `group` on `stream` (0 while the group does not exist).
pub async fn pending(conn: &mut impl ConnectionLike, stream: &str, group: &str) -> u64 {
    let reply: redis::RedisResult<redis::Value> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(conn)
        .await;
    match reply {
        Ok(redis::Value::Array(parts)) => match parts.first() {
            Some(redis::Value::Int(n)) => *n as u64,
            _ => 0,
        },
        Ok(_) => 0,
        Err(err) if err.code() == Some("NOGROUP") => 0,
        Err(err) => panic!("XPENDING {stream} {group}: {err}"),
    }
}

/// Whether `group` has read entry `id` of `stream` and none of its entries is pending: with
/// nothing parked or dead-lettered, `id` was acked.
pub async fn acked_through(
    conn: &mut impl ConnectionLike,
    stream: &str,
    group: &str,
    id: &str,
) -> bool {
    use sluice_host::entry::delivery::cmp_ids;
    match sluice_host::store::inspect::group(conn, stream, group)
        .await
        .expect("XINFO GROUPS")
    {
        Some(info) => info.pending == 0 && cmp_ids(&info.last_delivered_id, id).is_ge(),
        None => false,
    }
}

/// A stream entry as Redis sends it: id, then fields as bytes.
pub type RawEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// Wait until `group` has acked `stream` through entry `id` (see [`acked_through`]).
pub async fn wait_acked(conn: &(impl ConnectionLike + Clone), stream: &str, group: &str, id: &str) {
    wait_acked_within(conn, stream, group, id, Duration::from_secs(30)).await;
}

/// [`wait_acked`] for at most `within` (a slow link, big entries).
pub async fn wait_acked_within(
    conn: &(impl ConnectionLike + Clone),
    stream: &str,
    group: &str,
    id: &str,
    within: Duration,
) {
    wait_for(within, &format!("{stream} acked through {id}"), || {
        let mut conn = conn.clone();
        async move {
            acked_through(&mut conn, stream, group, id)
                .await
                .then_some(())
        }
    })
    .await;
}

/// The default dead-letter stream of group `g` (every test subscription's) on `stream`.
pub fn dead_letter_key(stream: &str) -> String {
    sluice_descriptor::default_dead_letter(stream, "g")
}

/// The dead letters of `stream` (in group `g`'s default dead-letter stream) once there are at
/// least `n`.
pub async fn wait_dead_letters(
    conn: &(impl ConnectionLike + Clone),
    stream: &str,
    n: usize,
) -> Vec<(String, Vec<(String, String)>)> {
    wait_dead_letters_in(conn, &dead_letter_key(stream), n).await
}

/// The entries of the dead-letter stream `key` once there are at least `n`.
pub async fn wait_dead_letters_in(
    conn: &(impl ConnectionLike + Clone),
    key: &str,
    n: usize,
) -> Vec<(String, Vec<(String, String)>)> {
    let key = key.to_owned();
    wait_for(
        Duration::from_secs(60),
        &format!("{n} dead letters in {key}"),
        || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move {
                let dead = entries(&mut conn, &key).await;
                (dead.len() >= n).then_some(dead)
            }
        },
    )
    .await
}

/// All entries of a stream as Redis sends them.
pub async fn raw_entries(conn: &mut impl ConnectionLike, stream: &str) -> Vec<RawEntry> {
    redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE")
}

/// All entries of a stream as (id, fields).
pub async fn entries(
    conn: &mut impl ConnectionLike,
    stream: &str,
) -> Vec<(String, Vec<(String, String)>)> {
    // Fields are bytes; tests compare text, so bytes that are not UTF-8 are shown lossily.
    let reply = raw_entries(conn, stream).await;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    reply
        .into_iter()
        .map(|(id, fields)| {
            let fields = fields.iter().map(|(n, v)| (text(n), text(v))).collect();
            (id, fields)
        })
        .collect()
}

/// The entries of group `g`'s default dead-letter stream on `stream`.
pub async fn dead_lettered(
    conn: &mut impl ConnectionLike,
    stream: &str,
) -> Vec<(String, Vec<(String, String)>)> {
    entries(conn, &dead_letter_key(stream)).await
}

/// The `sluice-reason` of the dead letter in `dead` whose origin is `origin`.
pub fn reason_of_origin(dead: &[(String, Vec<(String, String)>)], origin: &str) -> String {
    dead.iter()
        .find(|(_, f)| field(f, "sluice-origin-id") == Some(origin))
        .and_then(|(_, f)| field(f, "sluice-reason"))
        .unwrap_or_else(|| panic!("no dead letter for {origin}: {dead:?}"))
        .to_owned()
}

/// How many retries wait in the delayed set `key`.
pub async fn parked(conn: &mut impl ConnectionLike, key: &str) -> u64 {
    cmd(conn, &["ZCARD", key]).await
}

/// The value of `field` in an entry's fields.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Create `group` on `stream` (made if missing), reading after `from` (`0`: every entry, `$`:
/// only entries added from now on).
pub async fn create_group(conn: &mut impl ConnectionLike, stream: &str, group: &str, from: &str) {
    let _: () = cmd(conn, &["XGROUP", "CREATE", stream, group, from, "MKSTREAM"]).await;
}

/// Read from `stream` as `consumer` of group `g` (a consumer the test plays, e.g. a pod that
/// then dies), after `from` (`>`: new entries; an id: its own pending ones), all it gets.
pub async fn read_as(conn: &mut impl ConnectionLike, consumer: &str, stream: &str, from: &str) {
    let _: redis::Value = cmd(
        conn,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            consumer,
            "STREAMS",
            stream,
            from,
        ],
    )
    .await;
}

/// Read up to `count` new entries of `stream` as `consumer` of `group` (a consumer the test
/// plays), and acknowledge the first `ack` of them; their ids.
pub async fn read_and_ack(
    conn: &mut impl ConnectionLike,
    stream: &str,
    group: &str,
    count: usize,
    ack: usize,
) -> Vec<String> {
    let reply: redis::Value = cmd(
        conn,
        &[
            "XREADGROUP",
            "GROUP",
            group,
            "tester",
            "COUNT",
            &count.to_string(),
            "STREAMS",
            stream,
            ">",
        ],
    )
    .await;
    let read: redis::streams::StreamReadReply =
        redis::FromRedisValue::from_redis_value(reply).unwrap_or_default();
    let ids: Vec<String> = read
        .keys
        .into_iter()
        .flat_map(|k| k.ids)
        .map(|e| e.id)
        .collect();
    if ack > 0 {
        let mut words = vec!["XACK", stream, group];
        words.extend(ids.iter().take(ack).map(String::as_str));
        let _: u64 = cmd(conn, &words).await;
    }
    ids
}

/// Run one Redis command given as words.
pub async fn cmd<T: redis::FromRedisValue>(conn: &mut impl ConnectionLike, words: &[&str]) -> T {
    let mut c = redis::cmd(words[0]);
    for w in &words[1..] {
        c.arg(*w);
    }
    c.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{words:?} failed: {e}"))
}

/// A plain HTTP GET: (status, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, &[], b"").await
}

/// The admin token of every test host (see [`write_config`]).
pub const TEST_TOKEN: &str = "test-admin-token-5f2c9a1e7b3d4c6f8a0b";

/// An HTTP request to a test host's admin API, with [`TEST_TOKEN`] unless `headers` carry an
/// `Authorization` of their own: (status, body).
pub async fn http_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let auth = format!("Bearer {TEST_TOKEN}");
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    {
        all.push(("Authorization", &auth));
    }
    http_request_bare(addr, method, path, &all, body).await
}

/// An HTTP request with exactly `headers` (and `Host`, `Content-Length`): (status, body).
pub async fn http_request_bare(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let (status, _, body) = http_exchange(addr, method, path, headers, body).await;
    (status, body)
}

/// The value of header `name` in a response head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A logged-in page session: the cookie and the key the page's script sends with it.
pub struct PageSession {
    /// The `Cookie` header's value.
    pub cookie: String,
    /// The `x-sluice-key` header's value.
    pub key: String,
}

impl PageSession {
    /// The headers the page's own requests carry.
    pub fn headers(&self) -> Vec<(&str, &str)> {
        vec![("Cookie", &self.cookie), ("x-sluice-key", &self.key)]
    }
}

/// Log in with the test token, as the login form does.
pub async fn log_in(admin: std::net::SocketAddr) -> PageSession {
    log_in_with(admin, TEST_TOKEN).await
}

/// Log in with `token` (the operator's or the read-only one), as the login form does.
pub async fn log_in_with(admin: std::net::SocketAddr, token: &str) -> PageSession {
    let (code, head, body) = http_exchange(
        admin,
        "POST",
        "/ui/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("token={token}").as_bytes(),
    )
    .await;
    assert_eq!(code, 200, "{head}");
    let cookie = header(&head, "set-cookie").expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(token) && !body.contains(token),
        "the token is never the cookie or the key"
    );
    let at = body.find("data-key=\"").expect("the session's key") + 10;
    let key = body[at..].split('"').next().unwrap().to_owned();
    assert_eq!(key.len(), 64, "{body}");
    assert!(!cookie.contains(&key), "the key is not in the cookie");
    PageSession {
        cookie: cookie.split(';').next().unwrap().to_owned(),
        key,
    }
}

/// One HTTP/1.1 exchange as it went over the wire: (status, response head, body).
pub async fn http_exchange(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("admin server reachable");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    // The server may answer (413, 401) before reading the whole body.
    let _ = stream.write_all(body).await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .map(|(h, b)| (h.to_owned(), b.to_owned()))
        .unwrap_or_default();
    (status, head, body)
}

/// The delayed set of `keys`, with no ttl and [`test_secret`], as a host would run it: for tests
/// that park and sweep directly.
pub async fn delayed_set(
    redis: &Redis,
    keys: &sluice_host::store::keys::SubscriptionKeys,
) -> sluice_host::pipeline::delayed::DelayedSet {
    let conn =
        sluice_host::store::redis_conn::RedisHandle::connect(&redis.url(), &Default::default())
            .await
            .expect("connect");
    sluice_host::pipeline::delayed::DelayedSet::new(
        keys,
        None,
        test_secret(),
        conn,
        &Default::default(),
    )
    .expect("the keys name a delayed set")
}

/// Put a retry copy of `control` into the retry lane of group `g` of `stream` (delayed set
/// `set`), exactly as the sweep writes one (sealed with the stream's secret, made if missing):
/// for tests that need lane entries a host did not move itself. Its id.
pub async fn sealed_lane_copy(
    conn: &mut impl ConnectionLike,
    stream: &str,
    set: &str,
    control: &Control,
) -> String {
    use sluice_host::store::keys::{Seal, Secret};
    let secret = Secret::load_or_create(conn, stream, &[])
        .await
        .expect("secret");
    let fields = vec![(b"payload".to_vec(), control.to_string().into_bytes())];
    let member = sluice_host::entry::member::NewMember {
        entry_id: "1-1",
        retry_count: 1,
        fields: &fields,
        origin_id: "1-1",
        stream,
        group: "g",
    }
    .encode();
    let due = "1";
    let mark = secret.seal(
        Seal::Lane,
        &[stream.as_bytes(), b"g", &member, due.as_bytes()],
    );
    redis::cmd("XADD")
        .arg(sluice_host::store::keys::lane_key(set))
        .arg("*")
        .arg("sluice-parked")
        .arg(member)
        .arg("sluice-due-ms")
        .arg(due)
        .arg("sluice-mark")
        .arg(mark)
        .query_async(conn)
        .await
        .expect("XADD")
}

/// A stream secret for sets and deliveries a test builds by hand.
pub fn test_secret() -> std::sync::Arc<sluice_host::store::keys::Secret> {
    std::sync::Arc::new(sluice_host::store::keys::Secret::from_value("test-secret"))
}

/// A retry copy in a retry lane, decoded from the member it carries.
#[derive(Debug, Clone)]
pub struct LaneCopy {
    /// Its id in the lane.
    pub id: String,
    /// The origin id it brings back.
    pub origin_id: String,
    /// The retry count it brings back.
    pub retry_count: u32,
    /// When it was due (`sluice-due-ms`).
    pub due_ms: i64,
    /// The entry's fields, as text.
    pub fields: Vec<(String, String)>,
    /// Whether it carries the host's seal.
    pub sealed: bool,
}

/// The retry copies in the lane of delayed set `set`.
pub async fn lane_copies(conn: &mut impl ConnectionLike, set: &str) -> Vec<LaneCopy> {
    let reply = raw_entries(conn, &sluice_host::store::keys::lane_key(set)).await;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    reply
        .into_iter()
        .filter_map(|(id, fields)| {
            let value = |name: &str| {
                fields
                    .iter()
                    .find(|(n, _)| n == name.as_bytes())
                    .map(|(_, v)| v.clone())
            };
            let due_ms = text(&value("sluice-due-ms")?).parse::<f64>().ok()? as i64;
            let parked =
                sluice_host::entry::member::decode(&value("sluice-parked")?, due_ms).ok()?;
            Some(LaneCopy {
                id,
                origin_id: parked.origin_id,
                retry_count: parked.retry_count,
                due_ms,
                fields: parked
                    .fields
                    .iter()
                    .map(|(n, v)| (text(n), text(v)))
                    .collect(),
                sealed: value("sluice-mark").is_some(),
            })
        })
        .collect()
}

/// The lane copy bringing back `origin`, once there is one.
pub async fn wait_lane_copy(
    conn: &(impl ConnectionLike + Clone),
    set: &str,
    origin: &str,
) -> LaneCopy {
    wait_for(
        Duration::from_secs(30),
        &format!("a copy of {origin} in the lane of {set}"),
        || {
            let mut conn = conn.clone();
            async move {
                lane_copies(&mut conn, set)
                    .await
                    .into_iter()
                    .find(|c| c.origin_id == origin)
            }
        },
    )
    .await
}

/// The processes whose parent is `pid`, with their command lines.
pub fn children_of(pid: u32) -> Vec<(u32, String)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .filter_map(|child| {
            let cmd = std::fs::read(format!("/proc/{child}/cmdline")).ok()?;
            Some((child, String::from_utf8_lossy(&cmd).replace('\0', " ")))
        })
        .collect()
}

/// Whether process `pid` has ended (a zombie waiting for its reaper counts).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z')),
    }
}

/// How a load whose every entry ends dead-lettered came out.
#[derive(Debug)]
pub struct DeadLettered {
    /// Entries with a dead letter.
    pub settled: usize,
    /// Entries with more than one.
    pub twice: usize,
    /// Entries with none.
    pub lost: usize,
    /// Dead letters whose origin is no entry of the load.
    pub foreign: usize,
    /// Attempts run again (a dead letter's delivery count above 1): at-least-once delivery.
    pub repeated: u64,
    /// Dead letters in all.
    pub dead: usize,
}

/// Wait (up to `within`) until every entry of `ids` on `stream` is dead-lettered for group `g`
/// and nothing is pending (on the stream or the retry lane of `<stream>.delayed`) or parked
/// there; then count how the entries came out. Every dead letter must carry a reason.
pub async fn wait_all_dead_lettered(
    conn: &MultiplexedConnection,
    stream: &str,
    ids: &[String],
    within: Duration,
) -> DeadLettered {
    let delayed = format!("{stream}.delayed");
    let lane = sluice_host::store::keys::lane_key(&delayed);
    let dead = wait_for(
        within,
        "every entry dead-lettered, nothing pending or parked",
        || {
            let mut conn = conn.clone();
            let (lane, delayed) = (lane.clone(), delayed.clone());
            async move {
                let len: usize = cmd(&mut conn, &["XLEN", &dead_letter_key(stream)]).await;
                if len < ids.len() {
                    return None;
                }
                let idle = pending(&mut conn, stream, "g").await == 0
                    && pending(&mut conn, &lane, "g").await == 0
                    && parked(&mut conn, &delayed).await == 0;
                if !idle {
                    return None;
                }
                Some(dead_lettered(&mut conn, stream).await)
            }
        },
    )
    .await;
    let mut outcomes: std::collections::HashMap<String, usize> = Default::default();
    let mut repeated = 0u64;
    for (_, fields) in &dead {
        let origin = field(fields, "sluice-origin-id")
            .expect("origin")
            .to_owned();
        *outcomes.entry(origin).or_default() += 1;
        let count: u64 = field(fields, "sluice-delivery-count")
            .and_then(|c| c.parse().ok())
            .expect("delivery count");
        repeated += count - 1;
        assert!(field(fields, "sluice-reason").is_some_and(|r| !r.is_empty()));
    }
    DeadLettered {
        settled: outcomes.len(),
        twice: outcomes.values().filter(|n| **n > 1).count(),
        lost: ids.iter().filter(|id| !outcomes.contains_key(*id)).count(),
        foreign: outcomes.keys().filter(|o| !ids.contains(o)).count(),
        repeated,
        dead: dead.len(),
    }
}

/// Every command Redis has served so far, by name as `INFO commandstats` names it (lower
/// case): `(command, calls)`.
pub async fn all_calls(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let info: String = cmd(conn, &["INFO", "commandstats"]).await;
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

/// Calls of `command` (lower case, as INFO commandstats names it) Redis has served so far.
pub async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The demo's payment gateway on a free loopback port, for this test's life: it holds a large
/// payment for 500 ms after it first sees it (a handler that waits 1 s gives up on it).
pub async fn start_gateway() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let gateway = listener.local_addr().expect("its address");
    let settings = bank_gateway::Settings {
        slow_above_cents: 100_000,
        slow_for: Duration::from_millis(500),
        hold: Duration::from_secs(30),
    };
    tokio::spawn(bank_gateway::serve(listener, settings));
    gateway
}
