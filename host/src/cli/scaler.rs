//! `sluice scaler`: serve the scaling signal (`GET /v1/scaling`) from Redis alone, so an
//! autoscaler can wake a deployment that runs no host (see [`crate::serve::scaling::scaler`]).
//! It reads the same config as the hosts: their subscriptions, and the tokens that may read.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use crate::serve::scaling::scaler::{self, ScalerTokens};
use crate::store::scaling::{Board, Target};

/// `sluice scaler`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Where to listen (beyond loopback, the config must name a token).
    #[arg(long, default_value = "127.0.0.1:9188")]
    listen: SocketAddr,
    /// Redis URL (default: each subscription's own).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
    /// `.toml` configs and/or `.wasm` components: the hosts' own.
    #[arg(default_value = "sluice.toml")]
    paths: Vec<PathBuf>,
}

/// Serve until interrupted.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let stop = CancellationToken::new();
    let bound = start(
        &args.paths,
        args.redis.as_deref(),
        args.listen,
        stop.clone(),
    )
    .await?;
    eprintln!("sluice scaler: serving http://{bound}/v1/scaling (Ctrl-C to stop)");
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for Ctrl-C")?;
    stop.cancel();
    Ok(())
}

/// Load the config, connect to each Redis, and serve on `listen` until `stop`.
pub async fn start(
    paths: &[PathBuf],
    redis: Option<&str>,
    listen: SocketAddr,
    stop: CancellationToken,
) -> Result<SocketAddr> {
    let config = super::load(paths)?;
    // The read-only token when there is one (the scaler only looks, and need not hold the
    // operator's), else the operator's.
    let mut tokens = Vec::new();
    if let Some(source) = config
        .admin_read_token
        .as_ref()
        .or(config.admin_token.as_ref())
    {
        tokens.push(
            source
                .read()
                .with_context(|| format!("cannot read the token of {source}"))?,
        );
    }
    let plan = super::plan_of(&config, redis, true).await?;
    let mut targets = Vec::new();
    let mut connections: Vec<(
        String,
        crate::config::RedisAccess,
        crate::store::redis_conn::RedisHandle,
    )> = Vec::new();
    for sub in &plan.subscriptions {
        let url = super::redis_url_for(sub.redis.as_deref())?;
        let known = connections
            .iter()
            .find(|(u, a, _)| *u == url && *a == sub.redis_access)
            .map(|(_, _, c)| c.clone());
        let conn = match known {
            Some(conn) => conn,
            None => {
                let conn = crate::store::redis_conn::RedisHandle::connect(&url, &sub.redis_access)
                    .await
                    .with_context(|| {
                        format!(
                            "cannot connect to Redis at {}",
                            crate::store::redis_conn::redact(&url)
                        )
                    })?;
                connections.push((url, sub.redis_access.clone(), conn.clone()));
                conn
            }
        };
        for part in sub.stream.partitioned() {
            let delayed = part.delayed_retry.as_ref().map(|d| d.key().to_owned());
            let lane = delayed
                .as_deref()
                .filter(|_| sub.retry_lane)
                .map(crate::store::keys::lane_key);
            targets.push(Target {
                stream: part.stream.clone(),
                group: part.group.clone(),
                delayed,
                lane,
                conn: conn.clone(),
            });
        }
    }
    let board = std::sync::Arc::new(Board::new(targets));
    scaler::serve(listen, board, ScalerTokens(tokens), stop)
        .await
        .context("cannot start sluice scaler")
}
