//! `sluice new`: scaffold a handler project.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::project::Lang;
use crate::project::scaffold::{SdkCrates, new_project};

/// Write a new project `name` in the current directory and say what to do next.
pub fn new(name: &str, lang: Lang, sdk_path: Option<&Path>) -> Result<()> {
    let sdk = match (lang, sdk_path) {
        (Lang::Rust, Some(path)) => Some(SdkCrates::find(path)?),
        (Lang::Rust, None) => SdkCrates::of_this_checkout(),
        _ => None,
    };
    let dir = new_project(Path::new("."), name, lang, sdk.as_ref())
        .with_context(|| format!("cannot create the project `{name}`"))?;
    println!("created {} ({lang} handler)", dir.display());
    if lang == Lang::Rust && sdk.is_none() {
        println!(
            "note: sluice-guest is not on crates.io yet; point [patch.crates-io] in Cargo.toml at a checkout (see the comment there)"
        );
    }
    println!("next:\n  cd {name}\n  sluice build\n  sluice check sluice.toml\n  sluice dev");
    Ok(())
}
