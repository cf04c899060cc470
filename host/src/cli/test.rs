//! `sluice test`: run a handler on made-up deliveries (fixtures, see
//! [`crate::project::fixture`]) with no Redis, in the real sandbox with its subscription's
//! grants, limits and config values, and say what each came to; with `expect`, fail on any
//! other outcome. Works the same for Rust, Python and JavaScript: it runs the built component.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result};

use crate::control::rollout::replay::Would;
use crate::handler::Handler as _;
use crate::project::fixture;
use crate::service::plan::SubscriptionPlan;

/// `sluice test`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// What to run, a config (`.toml`; default ./sluice.toml) or a component (`.wasm`, with
    /// its own descriptor and default limits), then the fixtures (`.json`).
    #[arg(value_name = "[CONFIG|COMPONENT] FIXTURE", required = true)]
    paths: Vec<PathBuf>,
    /// The stream of the subscription to run, when the config has several.
    #[arg(long)]
    stream: Option<String>,
}

/// `sluice test`: one line per case on stdout; fails when a case did not get its `expect`.
pub(crate) async fn execute(args: Args) -> Result<()> {
    let (runs, fixtures): (Vec<PathBuf>, Vec<PathBuf>) = args
        .paths
        .into_iter()
        .partition(|p| p.extension().is_some_and(|e| e == "toml" || e == "wasm"));
    if fixtures.is_empty() {
        anyhow::bail!(
            "give at least one fixture (.json): a made-up delivery to run the handler on"
        );
    }
    let runs = if runs.is_empty() {
        vec![PathBuf::from("sluice.toml")]
    } else {
        runs
    };
    let config = super::load(&runs)?;
    let plan = super::plan_of(&config, None, true).await?;
    let sub = pick(&plan.subscriptions, args.stream.as_deref(), &runs)?;
    let (mut expected, mut failed) = (0usize, 0usize);
    for path in &fixtures {
        for (label, case) in fixture::load(path)? {
            let (would, took) = run_case(sub, &case).await?;
            let line = format!("{label}: {} ({took:.1?})", would.describe());
            match case.expect {
                Some(expect) if expect.matches(&would) => {
                    expected += 1;
                    println!("ok    {line}");
                }
                Some(expect) => {
                    failed += 1;
                    println!("FAIL  {line}; expected {expect:?}");
                }
                None => println!("      {line}"),
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} case(s) did not get the outcome they expect ({expected} did)");
    }
    Ok(())
}

/// The subscription to run: the one reading `stream`, or the only one.
fn pick<'a>(
    subs: &'a [SubscriptionPlan],
    stream: Option<&str>,
    runs: &[PathBuf],
) -> Result<&'a SubscriptionPlan> {
    let names = || {
        subs.iter()
            .map(|s| s.stream.stream.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let shown = runs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ");
    match (stream, subs) {
        (Some(name), _) => subs
            .iter()
            .find(|s| s.stream.stream == name)
            .with_context(|| {
                format!(
                    "no subscription of {shown} reads `{name}` (it has: {})",
                    names()
                )
            }),
        (None, [only]) => Ok(only),
        (None, _) => anyhow::bail!(
            "{shown} has {} subscriptions: name one with --stream (one of: {})",
            subs.len(),
            names()
        ),
    }
}

/// Run one case on a fresh instance of `sub`'s component, with the case's config values.
async fn run_case(
    sub: &SubscriptionPlan,
    case: &fixture::Case,
) -> Result<(Would, std::time::Duration)> {
    let handler = crate::runtime::WasmHandler::new(
        sub.component.clone(),
        sub.limits.clone(),
        case.values(&sub.values),
        crate::handler::HandlerCounters::default(),
    );
    let s = &sub.stream;
    let delivery = case.delivery(&s.stream, &s.group, &s.payload_field);
    let started = Instant::now();
    let result = handler.handle(&delivery).await;
    Ok((Would::of(result), started.elapsed()))
}
