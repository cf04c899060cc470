//! `sluice tools`: where the Python and JavaScript build tools are, and installing them.

use anyhow::{Context as _, Result};

use crate::project::tools;

/// `sluice tools`'s arguments: none lists the tools.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
}

/// What `sluice tools` does besides listing.
#[derive(clap::Subcommand)]
enum Action {
    /// Install componentize-py and componentize-js (pinned versions, through pip and npm)
    /// into the per-user tools directory (`SLUICE_TOOLS_DIR`, else ~/.local/share/sluice/tools).
    Install,
}

/// `sluice tools [install]`: the report goes to stdout.
pub(crate) fn execute(args: Args) -> Result<()> {
    let report = match args.action {
        None => tools_list(),
        Some(Action::Install) => tools_install()?,
    };
    print!("{report}");
    Ok(())
}

/// Each tool and where it was found.
pub fn tools_list() -> String {
    tools::report()
}

/// Install the pinned tools for this user; then list them.
pub fn tools_install() -> Result<String> {
    let done = tools::install().context("cannot install the build tools")?;
    Ok(format!("{done}{}", tools::report()))
}
