//! `sluice tools`: where the Python and JavaScript build tools are, and installing them.

use anyhow::{Context as _, Result};

use crate::project::tools;

/// Each tool and where it was found.
pub fn tools_list() -> String {
    tools::report()
}

/// Install the pinned tools for this user; then list them.
pub fn tools_install() -> Result<String> {
    let done = tools::install().context("cannot install the build tools")?;
    Ok(format!("{done}{}", tools::report()))
}
