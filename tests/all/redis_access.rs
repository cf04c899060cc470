//! Reaching the Redis production teams run: TLS (`rediss://`) verified against a private CA,
//! client certificates (mTLS), and a password kept in a file of its own, never in a URL and
//! never in a log line. Certificates are made by the test (rcgen); the servers are real
//! `redis-server`s on loopback, stopped by PID.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
};

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// A private CA and what it signed, written as PEM files.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        let ca = ca("Sluice test CA");
        write("ca.pem", ca.pem());
        for (who, sans) in [
            (
                "server",
                vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            ),
            ("client", vec!["sluice-host".to_owned()]),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(sans).unwrap();
            // Every certificate gets a name of its own: one whose subject equals its issuer's
            // reads as self-signed to OpenSSL.
            params.distinguished_name = name(&format!("sluice test {who}"));
            let cert = params.signed_by(&key, &ca).unwrap();
            write(&format!("{who}.pem"), cert.pem());
            write(&format!("{who}.key"), key.serialize_pem());
        }
        // A CA that signed nothing here: trusting it must fail verification.
        write("other-ca.pem", self::ca("Some other CA").pem());
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn ca(common_name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A `redis-server` that speaks only TLS, with `pki`'s server certificate; it asks clients for
/// a certificate when `mtls`.
struct TlsRedis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TlsRedis {
    async fn start(pki: &Pki, mtls: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = dir.path().join("redis.log");
        let path = |name: &str| pki.path(name).display().to_string();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--tls-port", &port.to_string()])
            .args(["--tls-cert-file", &path("server.pem")])
            .args(["--tls-key-file", &path("server.key")])
            .args(["--tls-ca-cert-file", &path("ca.pem")])
            .args(["--tls-auth-clients", if mtls { "yes" } else { "no" }])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        wait_for(T, "the TLS redis-server to accept connections", || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move { text.contains("Ready to accept connections").then_some(()) }
        })
        .await;
        server
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The test's own connection, trusting the private CA and showing the client certificate.
    async fn conn(&self, pki: &Pki) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::build_with_tls(
            self.url(),
            redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: pki.read("client.pem"),
                    client_key: pki.read("client.key"),
                }),
                root_cert: Some(pki.read("ca.pem")),
            },
        )
        .unwrap();
        // Not redis-rs's default 500 ms: a 200 MB entry over TLS takes longer to send.
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Add one acking entry and wait until the group has settled it.
async fn one_entry_is_acked(conn: &mut redis::aio::MultiplexedConnection, stream: &str) {
    let id = add(conn, stream, &Control::Ack).await;
    wait_acked(conn, stream, "g", &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_serves_and_a_wrong_ca_is_refused_naming_the_verification() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, false).await;
    let mut conn = redis.conn(&pki).await;
    let config = |ca: &str| {
        TestConfig::of(Sub::fixture("tls"))
            .set("redis", redis.url())
            .set("redis_ca_file", pki.path(ca).display().to_string())
    };

    let mut host = HostProcess::spawn_in(config("ca.pem"));
    one_entry_is_acked(&mut conn, "tls").await;
    host.terminate();
    assert!(host.wait_exit().await.success(), "{}", host.log_text());

    let mut refused = HostProcess::spawn_in(config("other-ca.pem"));
    let status = refused.wait_exit().await;
    let log = refused.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("could not start") && log.contains("UnknownIssuer"),
        "the error names the verification failure: {log}"
    );

    // TLS files with a plain redis:// URL are a mistake worth naming.
    let plain = config("ca.pem").set("redis", format!("redis://127.0.0.1:{}", redis.port));
    let mut wrong = HostProcess::spawn_in(plain);
    assert!(!wrong.wait_exit().await.success());
    assert!(
        wrong.log_text().contains("write rediss://"),
        "{}",
        wrong.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_client_certificates_takes_the_hosts() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, true).await;
    let mut conn = redis.conn(&pki).await;
    let config = TestConfig::of(Sub::fixture("mtls"))
        .set("redis", redis.url())
        .set("redis_ca_file", pki.path("ca.pem").display().to_string());

    let mut without = HostProcess::spawn_in(config.clone());
    assert!(
        !without.wait_exit().await.success(),
        "no client certificate, no connection: {}",
        without.log_text()
    );
    assert!(without.log_text().contains("could not start"));

    let with = config
        .set(
            "redis_cert_file",
            pki.path("client.pem").display().to_string(),
        )
        .set(
            "redis_key_file",
            pki.path("client.key").display().to_string(),
        );
    let mut host = HostProcess::spawn_in(with);
    one_entry_is_acked(&mut conn, "mtls").await;
    host.terminate();
    assert!(host.wait_exit().await.success(), "{}", host.log_text());
}

/// A 200 MB entry over TLS: the host's reads frame the decrypted bytes themselves and drop the
/// value as it arrives, so the entry is dead-lettered unhandled (copied whole inside Redis)
/// without the host ever holding it (before: reads over TLS went through redis-rs's
/// connection, which buffered and parsed the whole reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_over_tls_is_not_read_whole() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, true).await;
    let mut conn = redis.conn(&pki).await;
    let config = TestConfig::of(Sub::fixture("tls-big"))
        .set("redis", redis.url())
        .set("redis_ca_file", pki.path("ca.pem").display().to_string())
        .set(
            "redis_cert_file",
            pki.path("client.pem").display().to_string(),
        )
        .set(
            "redis_key_file",
            pki.path("client.key").display().to_string(),
        );
    let huge: String = memory::add_blob(&mut conn, "tls-big", 200 << 20).await;
    let host = HostProcess::spawn_in(config);
    one_entry_is_acked(&mut conn, "tls-big").await;
    memory::assert_dead_lettered_unread(
        &mut conn,
        &dead_letter_key("tls-big"),
        (&huge, 200 << 20),
        &host,
    )
    .await;
}

/// A Redis reached by a Unix socket, and one asked for RESP3: the host's read connections
/// (its own, see `redis_conn/transport.rs`) reach both, and entries are handled, a big one
/// dead-lettered unhandled as everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_and_resp3_urls_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let redis = Redis::start_with(
        false,
        &[
            ("unixsocket", socket.to_str().unwrap()),
            ("unixsocketperm", "700"),
        ],
    );
    let mut conn = redis.conn().await;
    let urls = [
        ("unix", format!("unix://{}", socket.display())),
        ("resp3", format!("{}/?protocol=resp3", redis.url())),
    ];
    for (stream, url) in urls {
        let host = HostProcess::spawn_in(TestConfig::of(Sub::fixture(stream)).set("redis", url));
        let first = add(&mut conn, stream, &Control::Ack).await;
        let deadline = std::time::Instant::now() + T;
        let mut poll = tokio::time::interval(Duration::from_millis(20));
        while !acked_through(&mut conn, stream, "g", &first).await {
            assert!(
                std::time::Instant::now() < deadline,
                "{stream}: not acked; the host's log:\n{}",
                host.log_text()
            );
            poll.tick().await;
        }
        let big: String = memory::add_blob(&mut conn, stream, 9 << 20).await;
        one_entry_is_acked(&mut conn, stream).await;
        let letters = memory::letter_summaries(&mut conn, stream).await;
        assert_eq!(letters.len(), 1, "{stream}: {letters:?}");
        assert_eq!(letters[0].origin, big, "{stream}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_from_a_private_file_logs_in_and_is_never_printed() {
    let secret = "s3cret-Passw0rd-never-logged";
    let redis = Redis::start_with(false, &[("requirepass", secret)]);
    let url = redis.url();
    let client =
        redis::Client::open(url.replace("redis://", &format!("redis://:{secret}@"))).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("redis-password");
    std::fs::write(&password, format!("{secret}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = TestConfig::of(Sub::fixture("auth"))
        .set("redis", url.clone())
        .set("redis_password_file", password.display().to_string());

    let path = write_config(dir.path(), "sluice.toml", &config.to_string());
    let (ok, stdout, stderr) = run_sluice(&["check", path.to_str().unwrap()], dir.path());
    assert!(ok, "{stderr}");
    assert!(stdout.contains("password from"), "{stdout}");
    assert!(!stdout.contains(secret) && !stderr.contains(secret));

    let mut host = HostProcess::spawn_in(config.clone());
    one_entry_is_acked(&mut conn, "auth").await;
    host.terminate();
    assert!(host.wait_exit().await.success(), "{}", host.log_text());
    assert!(!host.log_text().contains(secret), "{}", host.log_text());

    // Without the password the host cannot start, and says why.
    let mut refused =
        HostProcess::spawn_in(TestConfig::of(Sub::fixture("auth")).set("redis", url.clone()));
    assert!(!refused.wait_exit().await.success());
    assert!(
        refused.log_text().contains("NOAUTH") || refused.log_text().contains("Authentication"),
        "{}",
        refused.log_text()
    );

    // A password file every user could read is refused.
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut open = HostProcess::spawn_in(config);
    assert!(!open.wait_exit().await.success());
    assert!(
        open.log_text().contains("readable by every user"),
        "{}",
        open.log_text()
    );
}

/// An ACL user that may not run INFO (the host asks it whether the server is a cluster node)
/// still serves: the host assumes one node and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_info_is_taken_for_a_single_node() {
    let redis = Redis::start_with(false, &[]);
    let mut conn = redis.conn().await;
    let _: () = cmd(
        &mut conn,
        &[
            "ACL",
            "SETUSER",
            "narrow",
            "on",
            ">narrow-pw",
            "~*",
            "+@all",
            "-info",
        ],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("pw");
    std::fs::write(&password, "narrow-pw").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = TestConfig::of(Sub::fixture("narrow"))
        .set("redis", redis.url())
        .set("redis_username", "narrow")
        .set("redis_password_file", password.display().to_string());
    let mut host = HostProcess::spawn_in(config);
    one_entry_is_acked(&mut conn, "narrow").await;
    host.terminate();
    assert!(host.wait_exit().await.success(), "{}", host.log_text());
    assert!(
        host.log_text()
            .contains("INFO is not allowed for this user"),
        "{}",
        host.log_text()
    );
}

/// A master, its replica and three sentinels watching it as `mymaster`, all on loopback.
struct SentinelSet {
    master: Redis,
    replica: Redis,
    sentinels: Vec<(Child, u16)>,
    _dir: tempfile::TempDir,
}

impl SentinelSet {
    async fn start() -> Self {
        let master = Redis::start_with(false, &[]);
        let replica = Redis::start_with(false, &[]);
        let master_port = port_of(&master.url());
        let mut conn = replica.conn().await;
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master_port)
            .query_async(&mut conn)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     logfile {dir}/sentinel-{i}.log\n\
                     sentinel monitor mymaster 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds mymaster 1000\n\
                     sentinel failover-timeout mymaster 4000\n",
                    dir = dir.path().display()
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel starts");
            sentinels.push((child, port));
        }
        let set = Self {
            master,
            replica,
            sentinels,
            _dir: dir,
        };
        // A failover needs the sentinels to know the replica and each other.
        wait_for(
            Duration::from_secs(60),
            "the sentinels to see the replica and each other",
            || {
                let port = set.sentinels[0].1;
                async move {
                    let mut conn = sentinel_conn(port).await?;
                    let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg("mymaster")
                        .query_async(&mut conn)
                        .await
                        .ok()?;
                    let peers: Vec<redis::Value> = redis::cmd("SENTINEL")
                        .arg("SENTINELS")
                        .arg("mymaster")
                        .query_async(&mut conn)
                        .await
                        .ok()?;
                    (replicas.len() == 1 && peers.len() == 2).then_some(())
                }
            },
        )
        .await;
        set
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(_, port)| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/mymaster", hosts.join(","))
    }

    /// The port of the master the sentinels name now.
    async fn master_port(&self) -> Option<u16> {
        let mut conn = sentinel_conn(self.sentinels[0].1).await?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg("mymaster")
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(port)
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for (child, _) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn sentinel_conn(port: u16) -> Option<redis::aio::MultiplexedConnection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .ok()?
        .get_multiplexed_async_connection()
        .await
        .ok()
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// Entries acked before a Sentinel failover, retries parked across it, entries added after
/// it: the host follows the sentinels to the new master and every entry ends acked there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_follows_a_sentinel_failover_and_nothing_is_lost() {
    let set = SentinelSet::start().await;
    let mut old = set.master.conn().await;
    let host = HostProcess::spawn_in(
        TestConfig::of(Sub::fixture("ha").delayed("ha.delayed")).set("redis", set.url()),
    );
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(add(&mut old, "ha", &Control::Ack).await);
    }
    wait_acked(&old, "ha", "g", ids.last().unwrap()).await;
    // Retries due after the failover wait in the set on the old master.
    for _ in 0..5 {
        ids.push(add(&mut old, "ha", &Control::Retry { ms: 3000, times: 1 }).await);
    }
    wait_for(T, "the retries to be parked", || {
        let mut conn = old.clone();
        async move { (parked(&mut conn, "ha.delayed").await == 5).then_some(()) }
    })
    .await;
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut old)
        .await
        .unwrap();
    let replica_port = port_of(&set.replica.url());
    let mut sentinel = sentinel_conn(set.sentinels[0].1).await.unwrap();
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg("mymaster")
        .query_async(&mut sentinel)
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(60),
        "the sentinels to name the replica master",
        || {
            let set = &set;
            async move { (set.master_port().await == Some(replica_port)).then_some(()) }
        },
    )
    .await;
    let mut new = set.replica.conn().await;
    for _ in 0..5 {
        ids.push(add(&mut new, "ha", &Control::Ack).await);
    }
    wait_for(
        Duration::from_secs(60),
        "every entry acked on the new master",
        || {
            let mut conn = new.clone();
            let last = ids.last().unwrap().clone();
            async move {
                (acked_through(&mut conn, "ha", "g", &last).await
                    && parked(&mut conn, "ha.delayed").await == 0
                    && pending(&mut conn, "ha", "g").await == 0)
                    .then_some(())
            }
        },
    )
    .await;
    assert!(dead_lettered(&mut new, "ha").await.is_empty());
    let log = host.log_text();
    assert!(log.contains("the master moved"), "{log}");
}
