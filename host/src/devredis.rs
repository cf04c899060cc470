//! A private development `redis-server`, so `sluice run` works with no set-up.
//!
//! When no Redis URL is configured, `sluice run` starts `redis-server` from `PATH` as a child
//! process, listening on a free loopback port, with its data (AOF on, so parked retries survive
//! a restart) in a local directory, `.sluice/dev-redis` by default. It writes its URL to `url`
//! in that directory so the other subcommands and the demo's producer find it, and it is
//! stopped (SIGTERM, then SIGKILL) when the host exits. If a dev server from an earlier run in
//! the same directory still answers, it is reused and left running.
//!
//! The tests use the same type to start their own servers.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a new server has to start accepting connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the development server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DevRedisError {
    /// `redis-server` is not installed.
    #[error(
        "no Redis URL is configured and `redis-server` could not be started ({0}); install it (e.g. `apt-get install redis-server`) or pass --redis <url>"
    )]
    NotInstalled(std::io::Error),
    /// Its data directory could not be created.
    #[error("cannot create the dev Redis directory {}", dir.display())]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No free port was found.
    #[error("cannot find a free loopback port: {0}")]
    Port(std::io::Error),
    /// It started but did not answer in time.
    #[error("redis-server did not accept connections within {START_TIMEOUT:?}; see {}", log.display())]
    Timeout {
        /// Its log file.
        log: PathBuf,
    },
}

/// A `redis-server` child process, stopped when dropped (unless reused from an earlier run).
#[derive(Debug)]
pub struct DevRedis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    aof: bool,
}

/// Options for [`DevRedis::start`].
#[derive(Debug, Clone)]
pub struct DevRedisOptions {
    /// Append-only-file persistence (what makes parked retries survive a restart).
    pub aof: bool,
    /// Reuse a server from an earlier run in the same directory if it still answers.
    pub reuse: bool,
    /// Extra `--name value` arguments for redis-server.
    pub extra_args: Vec<(String, String)>,
}

impl Default for DevRedisOptions {
    fn default() -> Self {
        Self {
            aof: true,
            reuse: true,
            extra_args: Vec::new(),
        }
    }
}

impl DevRedis {
    /// Start (or reuse) a server whose data lives in `dir`.
    pub fn start(dir: &Path, options: &DevRedisOptions) -> Result<Self, DevRedisError> {
        std::fs::create_dir_all(dir).map_err(|source| DevRedisError::Dir {
            dir: dir.to_owned(),
            source,
        })?;
        let dir = dir.canonicalize().map_err(|source| DevRedisError::Dir {
            dir: dir.to_owned(),
            source,
        })?;
        if options.reuse
            && let Some(port) = read_port(&dir)
            && ping(port)
        {
            tracing::info!(port, dir = %dir.display(), "reusing the dev redis-server from an earlier run");
            return Ok(Self {
                child: None,
                port,
                dir,
                aof: options.aof,
            });
        }
        let port = free_port().map_err(DevRedisError::Port)?;
        let mut this = Self {
            child: None,
            port,
            dir,
            aof: options.aof,
        };
        this.spawn(&options.extra_args)?;
        Ok(this)
    }

    fn spawn(&mut self, extra_args: &[(String, String)]) -> Result<(), DevRedisError> {
        let log = self.dir.join("redis.log");
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .arg("--appendonly")
            .arg(if self.aof { "yes" } else { "no" });
        for (name, value) in extra_args {
            cmd.arg(format!("--{name}")).arg(value);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(DevRedisError::NotInstalled)?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while !ping(self.port) {
            if Instant::now() > deadline || self.exited() {
                self.stop();
                return Err(DevRedisError::Timeout { log });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::write(self.dir.join("url"), self.url());
        tracing::info!(url = %self.url(), dir = %self.dir.display(), aof = self.aof, "started a private dev redis-server");
        Ok(())
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Start the server again on the same port and directory (after [`DevRedis::stop`] or
    /// [`DevRedis::kill`]); with AOF on, its data comes back.
    pub fn restart(&mut self) -> Result<(), DevRedisError> {
        self.stop();
        self.spawn(&[])
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The child's process id, if this process started it.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stop the server gracefully (SIGTERM; it flushes its AOF), SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                let _ = std::fs::remove_file(self.dir.join("url"));
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(self.dir.join("url"));
    }

    /// Kill the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for DevRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The URL of a dev server that an earlier `sluice run` left in `dir`, if it answers.
pub fn running_url(dir: &Path) -> Option<String> {
    let port = read_port(dir)?;
    ping(port).then(|| format!("redis://127.0.0.1:{port}"))
}

fn read_port(dir: &Path) -> Option<u16> {
    let url = std::fs::read_to_string(dir.join("url")).ok()?;
    url.trim().rsplit(':').next()?.parse().ok()
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether a Redis server answers PING on the port (with PONG, or NOAUTH when it wants a
/// password).
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    // A server with a password answers -NOAUTH: it is up all the same.
    let mut buf = [0u8; 7];
    matches!(stream.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
}
