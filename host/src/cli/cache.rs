//! `sluice cache prune`: empty the compiled-component cache of what was not used lately.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::runtime::compile;

/// `sluice cache`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

/// What `sluice cache` does.
#[derive(clap::Subcommand)]
enum Action {
    /// Remove compiled components not used for a while.
    Prune {
        /// The cache directory (default: the config's `cache_dir`, else .sluice/cache).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Remove what was not used for this long (`0s`: everything).
        #[arg(long, default_value = "7d")]
        older_than: String,
    },
}

/// `sluice cache prune`: what was removed goes to stdout.
pub(crate) fn execute(args: Args) -> Result<()> {
    let Action::Prune { dir, older_than } = args.action;
    let done = cache_prune(dir.as_deref(), &older_than)?;
    print!("{done}");
    Ok(())
}

/// Remove artifacts in `dir` (default: ./sluice.toml's `cache_dir`, else `.sluice/cache`) not
/// used for `older_than` (`0s`: all).
pub fn cache_prune(dir: Option<&Path>, older_than: &str) -> Result<String> {
    let age = humantime::parse_duration(older_than)
        .with_context(|| format!("--older-than {older_than}: write a duration like 7d or 12h"))?;
    let dir = match dir {
        Some(dir) => dir.to_owned(),
        None if Path::new("sluice.toml").is_file() => {
            crate::config::Config::load(&[PathBuf::from("sluice.toml")])
                .context("invalid configuration")?
                .cache_dir
        }
        None => PathBuf::from(".sluice/cache"),
    };
    if !dir.is_dir() {
        return Ok(format!(
            "{}: no cache here, nothing to prune\n",
            dir.display()
        ));
    }
    let since = crate::support::clock::file_now()
        .checked_sub(age)
        .unwrap_or(std::time::UNIX_EPOCH);
    let (removed, freed) = compile::evict(&dir, usize::MAX, u64::MAX, Some(since));
    // And `sluice dev`'s compiled functions.
    let (functions, functions_freed) = compile::evict_files(
        &dir.join("functions"),
        "fn",
        usize::MAX,
        u64::MAX,
        Some(since),
    );
    Ok(format!(
        "{}: removed {removed} compiled component{} and {functions} compiled function{} ({:.1} MB) not used for {older_than}\n",
        dir.display(),
        if removed == 1 { "" } else { "s" },
        if functions == 1 { "" } else { "s" },
        (freed + functions_freed) as f64 / 1e6
    ))
}
