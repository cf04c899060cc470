//! A private development `redis-server`, so `sluice run` works with no set-up.
//!
//! When no Redis URL is configured, `sluice run` starts `redis-server` from `PATH` as a child
//! process, listening on a free loopback port, with its data (AOF on, so parked retries survive
//! a restart) in a local directory, `.sluice/dev-redis` by default. It writes its URL to `url`
//! in that directory so the other subcommands and the demo's producer find it, and it is
//! stopped (SIGTERM, then SIGKILL) when the host exits, and killed by the kernel if the host
//! dies without stopping it. If a dev server of the same directory still runs (another host
//! process uses it), it is reused and left running.
//!
//! Private to the user who runs it: the directory is 0700; the server wants a password made
//! at random for the directory (kept in a 0600 file there, given to the server in a 0600
//! config file, never on its command line); and a server on the recorded port is reused only
//! when it refuses a wrong password and accepts that one, so another program listening on a
//! stale port is never taken for it.
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
    /// Its password or config file could not be written or read.
    #[error("cannot keep the dev Redis password in {}", path.display())]
    Secret {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
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
    /// The password the server wants, if it wants one.
    password: Option<String>,
    die_with_host: bool,
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
    /// Require the directory's password (tests and benchmarks, on throw-away directories,
    /// go without).
    pub password: bool,
    /// Have the kernel kill the server when the thread that starts it ends (`sluice run`
    /// starts it from its main thread; tests share servers across threads).
    pub die_with_host: bool,
}

impl Default for DevRedisOptions {
    fn default() -> Self {
        Self {
            aof: true,
            reuse: true,
            extra_args: Vec::new(),
            password: true,
            die_with_host: true,
        }
    }
}

impl DevRedis {
    /// Start (or reuse) a server whose data lives in `dir`.
    pub fn start(dir: &Path, options: &DevRedisOptions) -> Result<Self, DevRedisError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir_err = |source| DevRedisError::Dir {
            dir: dir.to_owned(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(dir_err)?;
        let dir = dir.canonicalize().map_err(dir_err)?;
        // An existing directory from an earlier release may be open to others: close it.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_err)?;
        let password = if options.password {
            Some(password(&dir)?)
        } else {
            None
        };
        if options.reuse
            && let Some(port) = read_port(&dir)
            && answers_as_ours(&dir, port, password.as_deref())
        {
            tracing::info!(port, dir = %dir.display(), "reusing the dev redis-server of this directory");
            return Ok(Self {
                child: None,
                port,
                dir,
                aof: options.aof,
                password,
                die_with_host: options.die_with_host,
            });
        }
        let port = pick_port(&dir).map_err(DevRedisError::Port)?;
        let mut this = Self {
            child: None,
            port,
            dir,
            aof: options.aof,
            password,
            die_with_host: options.die_with_host,
        };
        // Another process may take the port between the check and the server's bind: then
        // try a port the kernel picks, twice at most.
        for _ in 0..2 {
            match this.spawn(&options.extra_args) {
                Err(DevRedisError::Timeout { log }) if port_was_taken(&log) => {
                    tracing::debug!(
                        port = this.port,
                        "the port was taken meanwhile; another one"
                    );
                    this.port = free_port().map_err(DevRedisError::Port)?;
                }
                other => return other.map(|()| this),
            }
        }
        this.spawn(&options.extra_args)?;
        Ok(this)
    }

    fn spawn(&mut self, extra_args: &[(String, String)]) -> Result<(), DevRedisError> {
        let log = self.dir.join("redis.log");
        let mut cmd = Command::new("redis-server");
        if let Some(password) = &self.password {
            // In a private file: a command line is readable by every user of the machine.
            let conf = self.dir.join("redis.conf");
            write_private(&conf, format!("requirepass {password}\n").as_bytes()).map_err(
                |source| DevRedisError::Secret {
                    path: conf.clone(),
                    source,
                },
            )?;
            cmd.arg(&conf);
        }
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
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.die_with_host {
            die_with_parent(&mut cmd);
        }
        let child = cmd.spawn().map_err(DevRedisError::NotInstalled)?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        if let Some(child) = &self.child {
            let _ = write_private(&self.dir.join(PID_FILE), child.id().to_string().as_bytes());
        }
        while !answers_as_ours(&self.dir, self.port, self.password.as_deref()) {
            if Instant::now() > deadline || self.exited() {
                self.stop();
                return Err(DevRedisError::Timeout { log });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = write_private(&self.dir.join("url"), self.url().as_bytes());
        // Outlives a clean stop (which removes `url`): the next start asks for it first.
        let _ = write_private(
            &self.dir.join(LAST_PORT_FILE),
            self.port.to_string().as_bytes(),
        );
        tracing::info!(url = %crate::store::redis_conn::redact(&self.url()), dir = %self.dir.display(), aof = self.aof, "started a private dev redis-server");
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

    /// The server's URL, with its password when it wants one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
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

/// The URL of the dev server `sluice run` keeps in `dir`, if it answers as that server.
pub fn running_url(dir: &Path) -> Option<String> {
    let port = read_port(dir)?;
    let password = std::fs::read_to_string(dir.join(PASSWORD_FILE)).ok();
    let password = password.as_deref().map(str::trim);
    answers_as_ours(dir, port, password).then(|| match password {
        Some(password) => format!("redis://:{password}@127.0.0.1:{port}"),
        None => format!("redis://127.0.0.1:{port}"),
    })
}

fn read_port(dir: &Path) -> Option<u16> {
    let url = std::fs::read_to_string(dir.join("url")).ok()?;
    url.trim().rsplit(':').next()?.parse().ok()
}

/// The file in a dev directory that holds the port its server last had.
const LAST_PORT_FILE: &str = "last-port";

/// The file in a dev directory that holds the server's password.
const PASSWORD_FILE: &str = "password";

/// The directory's password, made (128 bits at random, in a 0600 file) if it has none.
fn password(dir: &Path) -> Result<String, DevRedisError> {
    let path = dir.join(PASSWORD_FILE);
    let secret = |source| DevRedisError::Secret {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().len() >= 32 => return Ok(text.trim().to_owned()),
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(secret(err)),
    }
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| secret(std::io::Error::other(format!("no randomness: {e}"))))?;
    let password: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, password.as_bytes()).map_err(secret)?;
    Ok(password)
}

/// Write `bytes` to `path`, readable and writable by this user only, whole or not at all (a
/// reader of the URL never sees half of it).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::support::private_file::write_private(path, &[bytes], false)
}

/// Have the kernel kill the server when the thread that started it ends: a host killed
/// with SIGKILL leaves no server behind. Started from the host's main thread, which lives as
/// long as the host.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the child between fork and exec and only makes one
    // async-signal-safe system call (prctl).
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
}

/// The port for a new server of `dir`: the one it had last time, else one its path picks
/// (between 20000 and 29999), when free; else any free one. A project's dev Redis keeps one
/// address between runs, as far as the machine lets it.
fn pick_port(dir: &Path) -> std::io::Result<u16> {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
    let derived = 20_000 + u16::from_be_bytes([hash[0], hash[1]]) % 10_000;
    let last = std::fs::read_to_string(dir.join(LAST_PORT_FILE))
        .ok()
        .and_then(|p| p.trim().parse::<u16>().ok());
    for port in [read_port(dir), last, Some(derived)].into_iter().flatten() {
        if port >= 1024 && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    free_port()
}

/// Whether the server's log says its port was in use.
fn port_was_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("Address already in use"))
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The file in a dev directory that holds the server's process id.
const PID_FILE: &str = "pid";

/// Whether the server on `port` is this directory's: with a `password`, the process recorded
/// in the directory is ours and holds the socket listening on the port (checked in `/proc`,
/// before the password is sent anywhere: a program squatting the port never sees it), and it
/// takes the password; without one, it answers PING.
fn answers_as_ours(dir: &Path, port: u16, password: Option<&str>) -> bool {
    match password {
        None => ping(port),
        Some(password) => {
            let recorded = std::fs::read_to_string(dir.join(PID_FILE))
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok());
            if !recorded.is_some_and(|pid| listens_on(pid, port)) {
                return false;
            }
            exchange(port, b"AUTH sluice-not-the-password\r\n").is_some_and(|r| r.starts_with(b"-"))
                && exchange(port, format!("AUTH {password}\r\nPING\r\n").as_bytes())
                    .is_some_and(|r| r.starts_with(b"+OK\r\n+PONG"))
        }
    }
}

/// Whether process `pid` runs as this user and holds the socket listening on loopback `port`.
fn listens_on(pid: u32, port: u16) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata(format!("/proc/{pid}"))
        .is_ok_and(|m| m.uid() == nix::unistd::geteuid().as_raw());
    if !ours {
        return false;
    }
    // /proc/net/tcp: "sl local_address rem_address st ... inode"; 0A is LISTEN.
    let wanted = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            (cols.get(1) == Some(&wanted.as_str()) && cols.get(3) == Some(&"0A"))
                .then(|| cols.get(9).map(|i| format!("socket:[{i}]")))
                .flatten()
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
}

/// Send `request` to the server on `port` and return what it answers first.
fn exchange(port: u16, request: &[u8]) -> Option<Vec<u8>> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream.write_all(request).ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 64];
    // Both replies of a pipelined request come in one or two reads.
    while reply.len() < 12 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
        if !request.ends_with(b"PING\r\n") {
            break;
        }
    }
    (!reply.is_empty()).then_some(reply)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A project's dev server comes back on the port it had, while that port is free.
    #[test]
    fn a_restarted_dev_server_keeps_its_port() {
        let dir = tempfile::tempdir().unwrap();
        let options = DevRedisOptions {
            aof: false,
            reuse: false,
            extra_args: Vec::new(),
            password: true,
            die_with_host: false,
        };
        let mut first = DevRedis::start(dir.path(), &options).unwrap();
        let port = first.port();
        first.stop();
        assert!(
            !dir.path().join("url").exists(),
            "a clean stop forgets the URL"
        );
        let mut second = DevRedis::start(dir.path(), &options).unwrap();
        assert_eq!(second.port(), port, "but not the port");
        second.stop();
        // Taken by something else meanwhile: another free port, not a failure.
        let squatter = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let mut third = DevRedis::start(dir.path(), &options).unwrap();
        assert_ne!(third.port(), port);
        third.stop();
        drop(squatter);
    }
}
