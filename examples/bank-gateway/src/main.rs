//! `bank-gateway`: the pretend payment gateway of the bank-payments demo (see the library docs).
//!
//! Run with: `cargo run -p bank-gateway -- --listen 127.0.0.1:7878`

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;

#[derive(Parser)]
#[command(about = "A pretend payment gateway that times out on large fresh charges")]
struct Cli {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: String,
    /// Payments at or above this amount (in cents) are held by the bank first.
    #[arg(long, default_value_t = 100_000)]
    slow_above_cents: u64,
    /// How long a large payment stays held after its first charge request.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    slow_for: Duration,
    /// How long a request for a held payment waits before the gateway answers 504.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    hold: Duration,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let listener = tokio::net::TcpListener::bind(&cli.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (is another gateway running?)",
                cli.listen
            )
        })?;
    tracing::info!(addr = %cli.listen, "payment gateway listening");
    bank_gateway::serve(
        listener,
        bank_gateway::Settings {
            slow_above_cents: cli.slow_above_cents,
            slow_for: cli.slow_for,
            hold: cli.hold,
        },
    )
    .await
    .context("the gateway stopped")
}
