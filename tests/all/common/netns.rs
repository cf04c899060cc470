//! A network link between a host and the test's Redis that a test can break: the host runs in a
//! network namespace of its own, joined to the root namespace (where Redis listens) by a veth
//! pair. Faults are what a real network does to packets, made with iptables on the root side
//! of the pair: a cut silently drops every packet both ways (no reset: connections hang as
//! behind a dead switch), loss drops a random share. This kernel has no `netem` qdisc
//! (`CONFIG_NET_SCH_NETEM` unset), so latency comes from [`LinkProxy`], a relay on the link
//! that holds each chunk of bytes for a set time in each direction; it also stops the link at
//! the exact moment a chosen Redis call goes out.
//!
//! Needs root, `ip` and `iptables`: [`Netns::unavailable`] says what is missing, and tests skip
//! with that reason (CI runs as root). Namespaces left by a killed earlier run are removed when
//! the first one of this run is made.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream as AsyncTcpStream};

const PREFIX: &str = "slt";

/// The command a host's read loop sends.
const READ: &[u8] = b"XREADGROUP";

/// One host's namespace and its link to the root namespace; deleted (with its rules) when
/// dropped.
pub struct Netns {
    name: String,
    root_if: String,
    root_ip: String,
    rules: Mutex<Vec<Vec<String>>>,
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|err| format!("{program}: {err}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) {
    if let Err(err) = run(program, args) {
        panic!("{err}");
    }
}

/// Whether `name` (a namespace, interface or rule's) is of an earlier test run whose process
/// is gone.
fn stale(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| {
            pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        })
}

/// Remove what earlier test runs whose process is gone (killed mid-test) left: namespaces
/// (their veths go with them) and iptables rules, which would otherwise cut a later run's link
/// from its start when it gets the same PID.
fn sweep_stale() {
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if stale(name) {
                let _ = run("ip", &["netns", "del", name]);
            }
        }
    }
    if let Ok(out) = Command::new("iptables").arg("-S").output() {
        for rule in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(spec) = rule.strip_prefix("-A ") else {
                continue;
            };
            let words: Vec<&str> = spec.split_whitespace().collect();
            if words.iter().any(|w| stale(w)) {
                let mut args = vec!["-D"];
                args.extend(words);
                let _ = run("iptables", &args);
            }
        }
    }
}

/// The second byte of this process's addresses (10.x.*.*): one no other live test process
/// holds. Each test is a process of its own under nextest, several at once, so the byte is
/// claimed with a lock file held until the process ends (a killed process lets go of it), and
/// one that addresses on this machine already use is passed over.
fn second_byte() -> u32 {
    static BYTE: std::sync::OnceLock<(u32, File)> = std::sync::OnceLock::new();
    let (byte, _held) = BYTE.get_or_init(|| {
        let taken = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        let pid = std::process::id();
        (0..100)
            .map(|k| 100 + (pid + k) % 100)
            .filter(|byte| !taken.contains(&format!(" 10.{byte}.")))
            .find_map(|byte| {
                let path = std::env::temp_dir().join(format!("sluice-test-net-10.{byte}.lock"));
                let file = File::create(path).ok()?;
                file.try_lock().ok()?;
                Some((byte, file))
            })
            .expect("a free 10.x.0.0/16 for this test process's namespaces")
    });
    *byte
}

impl Netns {
    /// Why these tests cannot run here, if they cannot.
    pub fn unavailable() -> Option<String> {
        if !nix::unistd::Uid::effective().is_root() {
            return Some("not root (network namespaces and iptables need it; CI is root)".into());
        }
        for tool in [["ip", "-V"], ["iptables", "--version"]] {
            if let Err(err) = run(tool[0], &tool[1..]) {
                return Some(format!("`{}` does not run: {err}", tool[0]));
            }
        }
        None
    }

    /// A new namespace with its link up: the host side is 10.a.b.2, the root side 10.a.b.1.
    pub fn new() -> Self {
        static SWEEP: Once = Once::new();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        SWEEP.call_once(sweep_stale);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 64, "at most 64 namespaces per test run");
        let pid = std::process::id();
        let name = format!("{PREFIX}{pid}x{n}");
        let root_if = format!("{PREFIX}{pid}r{n}");
        let host_if = format!("{PREFIX}{pid}h{n}");
        let net = format!("10.{}.{}", second_byte(), n * 4);
        let root_ip = format!("{net}.1");
        let host_ip = format!("{net}.2");
        must("ip", &["netns", "add", &name]);
        let this = Self {
            name,
            root_if,
            root_ip,
            rules: Mutex::new(Vec::new()),
        };
        must(
            "ip",
            &[
                "link",
                "add",
                &this.root_if,
                "type",
                "veth",
                "peer",
                "name",
                &host_if,
                "netns",
                &this.name,
            ],
        );
        must(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/30", this.root_ip),
                "dev",
                &this.root_if,
            ],
        );
        must("ip", &["link", "set", &this.root_if, "up"]);
        let ns = this.name.as_str();
        must(
            "ip",
            &[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{host_ip}/30"),
                "dev",
                &host_if,
            ],
        );
        must("ip", &["-n", ns, "link", "set", &host_if, "up"]);
        must("ip", &["-n", ns, "link", "set", "lo", "up"]);
        this
    }

    /// The root side's address: where the host reaches Redis (and proxies) from inside.
    pub fn root_ip(&self) -> &str {
        &self.root_ip
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn wrap(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }

    fn add_rule(&self, rule: &[&str]) {
        let mut args = vec!["-w", "-I"];
        args.extend_from_slice(rule);
        must("iptables", &args);
        self.rules
            .lock()
            .unwrap()
            .push(rule.iter().map(|s| (*s).to_owned()).collect());
    }

    /// Drop every packet on the link, both ways, until [`Self::heal`].
    pub fn cut(&self) {
        self.add_rule(&["INPUT", "-i", &self.root_if, "-j", "DROP"]);
        self.add_rule(&["OUTPUT", "-o", &self.root_if, "-j", "DROP"]);
    }

    /// Drop a random `share` of the packets on the link, each way, until [`Self::heal`].
    pub fn lose(&self, share: f64) {
        let p = format!("{share}");
        for (chain, dir) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            self.add_rule(&[
                chain,
                dir,
                &self.root_if,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &p,
                "-j",
                "DROP",
            ]);
        }
    }

    /// Remove every fault.
    pub fn heal(&self) {
        let rules = std::mem::take(&mut *self.rules.lock().unwrap());
        for rule in rules {
            let mut args = vec!["-w", "-D"];
            args.extend(rule.iter().map(String::as_str));
            if let Err(err) = run("iptables", &args) {
                eprintln!("netns: {err}");
            }
        }
    }

    /// `GET path` on `addr` from inside the namespace (a host's admin server listens on its
    /// own loopback, reachable whatever happens to the link): the status code, or `None` when
    /// nothing answers within 5 s.
    pub fn http_status(&self, addr: SocketAddr, path: &str) -> Option<u16> {
        let ns = format!("/run/netns/{}", self.name);
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        // A thread of its own enters the namespace: a pooled thread would stay in it.
        std::thread::spawn(move || {
            let file = File::open(&ns).ok()?;
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            stream.write_all(request.as_bytes()).ok()?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).ok()?;
            std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
        })
        .join()
        .ok()
        .flatten()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.heal();
        // The veth pair goes with the namespace.
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// A relay on a host's link to Redis: it passes bytes on, holds each chunk for the current
/// delay in each direction (latency), and can stop the link at an exact moment: armed with a
/// marker, it sends the first request that holds it on to Redis and from then on holds every
/// byte both ways (the request ran; its reply, like everything else, is stuck in a cut link)
/// until [`Self::release`]. Together with [`Netns::cut`] this is a cut in the middle of one
/// chosen Redis call.
pub struct LinkProxy {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    /// Bytes a second each direction passes at most (0: as fast as it can).
    rate: Arc<AtomicU64>,
    held: Arc<tokio::sync::watch::Sender<bool>>,
    marker: Arc<Mutex<Option<Vec<u8>>>>,
    tripped: Arc<tokio::sync::Notify>,
    reads: Arc<AtomicU64>,
    /// Connections numbered below this are frozen (see [`Self::freeze_existing`]).
    frozen_below: Arc<AtomicU64>,
    /// Connections opened so far.
    opened: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LinkProxy {
    /// Listen on `listen_ip` (a free port) and relay to `upstream`.
    pub async fn start(listen_ip: &str, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((listen_ip, 0)).await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let rate = Arc::new(AtomicU64::new(0));
        let (held, _) = tokio::sync::watch::channel(false);
        let held = Arc::new(held);
        let marker: Arc<Mutex<Option<Vec<u8>>>> = Arc::new(Mutex::new(None));
        let tripped = Arc::new(tokio::sync::Notify::new());
        let reads = Arc::new(AtomicU64::new(0));
        let frozen_below = Arc::new(AtomicU64::new(0));
        let link = Link {
            delay_ms: delay_ms.clone(),
            rate: rate.clone(),
            held: held.clone(),
            marker: marker.clone(),
            tripped: tripped.clone(),
            reads: reads.clone(),
            frozen_below: frozen_below.clone(),
            number: 0,
        };
        let opened = Arc::new(AtomicU64::new(0));
        let counted = opened.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = AsyncTcpStream::connect(upstream).await else {
                    continue;
                };
                let number = counted.fetch_add(1, Ordering::AcqRel) + 1;
                let link = Link {
                    number,
                    ..link.clone()
                };
                let (client_rx, client_tx) = client.into_split();
                let (server_rx, server_tx) = server.into_split();
                tokio::spawn(link.clone().relay(client_rx, server_tx, true));
                tokio::spawn(link.relay(server_rx, client_tx, false));
            }
        });
        Self {
            addr,
            delay_ms,
            rate,
            held,
            marker,
            tripped,
            reads,
            frozen_below,
            opened,
            task,
        }
    }

    /// Freeze every connection open now, for good: nothing more passes either way, and
    /// nothing closes (no FIN, no reset), as when the peer's machine vanished; connections
    /// opened from now on pass as before.
    pub fn freeze_existing(&self) {
        let opened = self.opened.load(Ordering::Acquire);
        self.frozen_below.store(opened + 1, Ordering::Release);
    }

    /// How many `XREADGROUP` requests the host has sent into the link so far (counted as the
    /// relay receives them: a host whose loop is wedged sends none).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Acquire)
    }

    /// The URL to give a host instead of Redis's own.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Hold each chunk this long in each direction from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Release);
    }

    /// Pass at most `bytes_per_s` each way from now on (a slow link).
    pub fn set_rate(&self, bytes_per_s: u64) {
        self.rate.store(bytes_per_s, Ordering::Release);
    }

    /// Stop the link right after the first request that holds `marker` reaches Redis.
    pub fn arm(&self, marker: &[u8]) {
        *self.marker.lock().unwrap() = Some(marker.to_vec());
    }

    /// Wait until an armed marker has stopped the link.
    pub async fn tripped(&self) {
        self.tripped.notified().await;
    }

    /// Let the held bytes go on, in order, and pass new ones again.
    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What every relay of one proxy shares.
#[derive(Clone)]
struct Link {
    delay_ms: Arc<AtomicU64>,
    rate: Arc<AtomicU64>,
    held: Arc<tokio::sync::watch::Sender<bool>>,
    marker: Arc<Mutex<Option<Vec<u8>>>>,
    tripped: Arc<tokio::sync::Notify>,
    reads: Arc<AtomicU64>,
    frozen_below: Arc<AtomicU64>,
    /// This connection's number, from 1 in the order they were opened.
    number: u64,
}

impl Link {
    /// Copy `from` to `to` in order, each chunk sent its delay after it arrived and only while
    /// the link is not held. A request (`to_server`) holding the armed marker goes on to Redis
    /// and holds the link.
    async fn relay(
        self,
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        to_server: bool,
    ) {
        type Chunk = (tokio::time::Instant, Vec<u8>, bool);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Chunk>();
        let mut held = self.held.subscribe();
        let (frozen_below, number) = (self.frozen_below.clone(), self.number);
        let rate = self.rate.clone();
        let writer = tokio::spawn(async move {
            while let Some((due, chunk, trips)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if !trips && held.wait_for(|h| !*h).await.is_err() {
                    return;
                }
                if number < frozen_below.load(Ordering::Acquire) {
                    // Frozen: keep the socket open and send nothing, ever.
                    std::future::pending::<()>().await;
                }
                if to.write_all(&chunk).await.is_err() {
                    return;
                }
                let rate = rate.load(Ordering::Acquire);
                if rate > 0 {
                    // The time the chunk takes on a link of that rate.
                    let secs = chunk.len() as f64 / rate as f64;
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                }
            }
            let _ = to.shutdown().await;
        });
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = buf[..n].to_vec();
                    if to_server {
                        let reads = chunk
                            .windows(READ.len())
                            .filter(|w| w.eq_ignore_ascii_case(READ))
                            .count();
                        self.reads.fetch_add(reads as u64, Ordering::AcqRel);
                    }
                    let trips = to_server && {
                        let mut marker = self.marker.lock().unwrap();
                        let hit = marker
                            .as_ref()
                            .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m.as_slice()));
                        if hit {
                            *marker = None;
                        }
                        hit
                    };
                    if trips {
                        // Held before the request is even sent: its reply cannot slip through.
                        self.held.send_replace(true);
                        self.tripped.notify_one();
                    }
                    let due = tokio::time::Instant::now()
                        + Duration::from_millis(self.delay_ms.load(Ordering::Acquire));
                    if tx.send((due, chunk, trips)).is_err() {
                        break;
                    }
                }
            }
        }
        drop(tx);
        let _ = writer.await;
    }
}
