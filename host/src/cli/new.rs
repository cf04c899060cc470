//! `sluice new`: scaffold a handler project.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::project::scaffold::{SdkCrates, SdkSource, new_project};
use crate::project::{Lang, Template};

/// Write a new project `name` in the current directory and say what to do next.
pub fn new(name: &str, lang: Lang, template: Template, sdk_path: Option<&Path>) -> Result<()> {
    let sdk = match sdk_path {
        Some(path) if lang == Lang::Rust => SdkSource::Checkout(SdkCrates::find(path)?),
        _ => SdkSource::Vendored,
    };
    let dir = new_project(Path::new("."), name, lang, template, &sdk)
        .with_context(|| format!("cannot create the project `{name}`"))?;
    println!("created {} ({lang} handler)", dir.display());
    println!("next:\n  cd {name}\n  sluice build\n  sluice check\n  sluice dev");
    Ok(())
}
