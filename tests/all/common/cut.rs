//! A TCP proxy in front of a test Redis that loses one reply on purpose: the first command
//! whose request holds a marker (e.g. `XCLAIM`) reaches Redis and runs there, then the
//! connection is closed before its reply gets back. This is the failure a host cannot tell
//! from a lost network: Redis did the work, the host never heard. Or one that garbles a
//! reply: the first reply that holds a marker reaches the host as bytes no Redis sends. Or one
//! that holds a reply back: the first command holding a marker runs in Redis, and its reply
//! reaches the host only when the test releases it (a slow network, at a chosen moment).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; it stops accepting when dropped.
pub struct CutProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    release: Arc<tokio::sync::Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

/// What the proxy does to the reply it picks.
#[derive(Clone, Copy)]
enum Mode {
    Cut,
    Garble,
    Hold,
}

impl CutProxy {
    /// Proxy to the Redis on `upstream` (host:port), cutting the reply to the first request
    /// that contains `marker`.
    pub async fn start(upstream: String, marker: &'static [u8]) -> Self {
        Self::with(upstream, marker, Mode::Cut).await
    }

    /// Proxy to the Redis on `upstream`, replacing the first reply chunk that contains
    /// `marker` with an empty header line and an absurd count (the connection stays open).
    pub async fn garbling(upstream: String, marker: &'static [u8]) -> Self {
        Self::with(upstream, marker, Mode::Garble).await
    }

    /// Proxy to the Redis on `upstream`, holding back the reply to the first request that
    /// contains `marker` until [`Self::release`] (`has_cut` says it is held).
    pub async fn holding(upstream: String, marker: &'static [u8]) -> Self {
        Self::with(upstream, marker, Mode::Hold).await
    }

    /// Let a held reply go on to the host.
    pub fn release(&self) {
        self.release.add_permits(1);
    }

    async fn with(upstream: String, marker: &'static [u8], mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let done = cut.clone();
        let gate = release.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                match mode {
                    Mode::Cut => {
                        tokio::spawn(relay(client, server, marker, done.clone()));
                    }
                    Mode::Garble => {
                        tokio::spawn(relay_garbling(client, server, marker, done.clone()));
                    }
                    Mode::Hold => {
                        tokio::spawn(relay_holding(
                            client,
                            server,
                            marker,
                            done.clone(),
                            gate.clone(),
                        ));
                    }
                }
            }
        });
        Self {
            port,
            cut,
            release,
            task,
        }
    }

    /// The URL to give the host instead of the Redis's own.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether a reply has been cut.
    pub fn has_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relay one connection both ways. When a request holds `marker` (and no reply was cut yet),
/// the request goes through, and the first reply bytes after it end the connection unsent.
async fn relay(client: TcpStream, server: TcpStream, marker: &[u8], done: Arc<AtomicBool>) {
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    let cutting = AtomicBool::new(false);
    let requests = pump(client_rx, server_tx, |chunk| {
        if chunk.windows(marker.len()).any(|w| w == marker) && !done.swap(true, Ordering::AcqRel) {
            cutting.store(true, Ordering::Release);
        }
        true
    });
    // Once armed, Redis has run the command: its reply is lost with the connection.
    let replies = pump(server_rx, client_tx, |_| !cutting.load(Ordering::Acquire));
    // Whichever side ends first ends the other: both halves of both sockets are dropped.
    tokio::select! {
        () = requests => {}
        () = replies => {}
    }
}

/// Relay one connection both ways. When a request holds `marker` (and no reply was held yet),
/// the request goes through and the reply bytes after it wait for `release`.
async fn relay_holding(
    client: TcpStream,
    server: TcpStream,
    marker: &[u8],
    done: Arc<AtomicBool>,
    release: Arc<tokio::sync::Semaphore>,
) {
    let (client_rx, mut client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    let holding = AtomicBool::new(false);
    let requests = pump(client_rx, server_tx, |chunk| {
        if chunk.windows(marker.len()).any(|w| w == marker) && !done.swap(true, Ordering::AcqRel) {
            holding.store(true, Ordering::Release);
        }
        true
    });
    let replies = async {
        let mut server_rx = server_rx;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if holding.swap(false, Ordering::AcqRel) {
                let Ok(permit) = release.acquire().await else {
                    return;
                };
                permit.forget();
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = requests => {}
        () = replies => {}
    }
}

/// Relay one connection both ways, garbling the first reply chunk that holds `marker`.
async fn relay_garbling(
    client: TcpStream,
    server: TcpStream,
    marker: &[u8],
    done: Arc<AtomicBool>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let requests = tokio::io::copy(&mut client_rx, &mut server_tx);
    let replies = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let garbled: &[u8] = if chunk.windows(marker.len()).any(|w| w == marker)
                && !done.swap(true, Ordering::AcqRel)
            {
                b"*1\r\n\r\n*9223372036854775807\r\n"
            } else {
                chunk
            };
            if client_tx.write_all(garbled).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        () = replies => {}
    }
}

/// Copy from `from` to `to` chunk by chunk while `pass` lets each chunk through; return when
/// either side closes or `pass` refuses one.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut pass: impl FnMut(&[u8]) -> bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !pass(&buf[..n]) || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
