//! The bank-payments demo's producer: puts payments on the `bank-payments` stream, then waits
//! until the billing group has settled them and says what happened.
//!
//! Run with: `cargo run -p sluice-producer -- add` (then `wait --until parked|settled`)
//!
//! Without `--redis` it uses the private dev redis-server a running `sluice run` started in
//! this directory (its URL is in `.sluice/dev-redis/url`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use redis::aio::MultiplexedConnection;

#[derive(Parser)]
#[command(about = "Put demo payments on the bank-payments stream and watch them settle")]
struct Cli {
    /// Redis URL (default: the dev server of a running `sluice run` in this directory).
    #[arg(long, env = "SLUICE_REDIS_URL", global = true)]
    redis: Option<String>,
    /// The stream.
    #[arg(long, default_value = "bank-payments", global = true)]
    stream: String,
    /// How many partitions the subscription reads (its `partitions`): each payment goes to
    /// partition crc32(account) % N, so one account's payments stay in order.
    #[arg(long, default_value_t = 1, global = true)]
    partitions: u32,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Add three payments: two small ones and one large one that the gateway times out on.
    Add,
    /// Wait until the payments are parked, or all settled.
    Wait {
        #[arg(long, value_enum)]
        until: Until,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// The consumer group.
        #[arg(long, default_value = "billing")]
        group: String,
        /// The delayed-retry set.
        #[arg(long, default_value = "bank-payments.delayed")]
        delayed: String,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Until {
    /// Something waits in the delayed set.
    Parked,
    /// Nothing is pending, unread or parked.
    Settled,
}

async fn connect(url: Option<String>) -> Result<MultiplexedConnection> {
    if let Some(url) = url {
        return open(&url).await;
    }
    // The dev server's URL file may be left over from an earlier run that was killed: keep
    // reading it until the URL in it answers (a starting `sluice run` rewrites it).
    let file = std::path::Path::new(".sluice/dev-redis/url");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = match std::fs::read_to_string(file) {
            Ok(url) => open(url.trim()).await,
            Err(_) => Err(anyhow::anyhow!(
                "no dev redis-server is running here (no {}); start `sluice run` first or pass --redis",
                file.display()
            )),
        };
        match attempt {
            Ok(conn) => return Ok(conn),
            Err(err) if Instant::now() > deadline => return Err(err),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn open(url: &str) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(url).with_context(|| format!("invalid Redis URL {url}"))?;
    client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("cannot connect to Redis at {url}"))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn add(conn: &mut MultiplexedConnection, stream: &str, partitions: u32) -> Result<()> {
    let batch = now_ms();
    let payments = [
        ("acct-7", 1_250, "coffee beans"),
        ("acct-9", 4_000, "train ticket"),
        ("acct-3", 250_000, "invoice 2026-118"),
    ];
    for (i, (account, amount_cents, memo)) in payments.into_iter().enumerate() {
        let payment = serde_json::json!({
            "id": format!("p-{batch}-{}", i + 1),
            "account": account,
            "amount_cents": amount_cents,
            "currency": "EUR",
            "created_at_ms": now_ms(),
        });
        // The documented rule, from the crate the host uses too.
        let target = sluice_descriptor::partition_stream(stream, partitions, account.as_bytes());
        let id: String = redis::cmd("XADD")
            .arg(&target)
            .arg("*")
            .arg("payload")
            .arg(payment.to_string())
            .arg("memo")
            .arg(memo)
            .query_async(conn)
            .await
            .context("XADD failed")?;
        println!("added {id} to {target}: {payment}");
    }
    Ok(())
}

/// (pending, lag) of the group, from XINFO GROUPS.
async fn group_state(
    conn: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> Result<Option<(i64, i64)>> {
    let groups: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await
        .unwrap_or_default();
    for g in groups {
        let redis::Value::Array(items) = g else {
            continue;
        };
        let mut name = None;
        let (mut pending, mut lag) = (0, 0);
        for pair in items.chunks(2) {
            if let [redis::Value::BulkString(k), v] = pair {
                match (k.as_slice(), v) {
                    (b"name", redis::Value::BulkString(n)) => {
                        name = Some(String::from_utf8_lossy(n).into_owned())
                    }
                    (b"pending", redis::Value::Int(n)) => pending = *n,
                    (b"lag", redis::Value::Int(n)) => lag = *n,
                    _ => {}
                }
            }
        }
        if name.as_deref() == Some(group) {
            return Ok(Some((pending, lag)));
        }
    }
    Ok(None)
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut conn = connect(cli.redis).await?;
    match cli.command {
        Cmd::Add => add(&mut conn, &cli.stream, cli.partitions).await,
        Cmd::Wait {
            until,
            timeout,
            group,
            delayed,
        } => {
            let deadline = Instant::now() + Duration::from_secs(timeout);
            let mut last = String::new();
            let dead_letter = format!("{}.dead-letter", cli.stream);
            // Each partition's keys (the subscription's own when there is one).
            let key = |name: &str, p: u32| {
                if cli.partitions > 1 {
                    sluice_descriptor::partition_key(name, &cli.stream, p)
                } else {
                    name.to_owned()
                }
            };
            loop {
                let (mut parked, mut dead) = (0i64, 0i64);
                let mut state: Option<(i64, i64)> = None;
                for p in 0..cli.partitions.max(1) {
                    let n: i64 = redis::cmd("ZCARD")
                        .arg(key(&delayed, p))
                        .query_async(&mut conn)
                        .await?;
                    parked += n;
                    let n: i64 = redis::cmd("XLEN")
                        .arg(key(&dead_letter, p))
                        .query_async(&mut conn)
                        .await?;
                    dead += n;
                    if let Some((pending, lag)) =
                        group_state(&mut conn, &key(&cli.stream, p), &group).await?
                    {
                        let (p0, l0) = state.unwrap_or((0, 0));
                        state = Some((p0 + pending, l0 + lag));
                    }
                }
                let line = match state {
                    Some((pending, lag)) => format!(
                        "{pending} pending, {lag} unread, {parked} parked in {delayed}, {dead} dead-lettered"
                    ),
                    None => format!("group {group} does not exist yet"),
                };
                if line != last {
                    println!("{line}");
                    last = line;
                }
                let done = match (until, state) {
                    (Until::Parked, _) => parked > 0,
                    (Until::Settled, Some((0, 0))) => parked == 0,
                    _ => false,
                };
                if done {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    bail!("gave up after {timeout}s: {last}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
