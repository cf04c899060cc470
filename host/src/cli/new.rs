//! `sluice new`: scaffold a handler project.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::project::scaffold::{SdkCrates, SdkSource, new_project};
use crate::project::{Lang, Template};

/// `sluice new`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The project's name: its directory, package and stream.
    name: String,
    /// The handler's language.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    lang: Lang,
    /// Rust: take sluice-guest from this directory (a checkout's guest-sdk, for work on the
    /// SDK), written as a path relative to the project. Default: a copy of the SDK in the
    /// project's own sluice-sdk/, from this sluice.
    #[arg(long, env = "SLUICE_SDK_PATH")]
    sdk_path: Option<PathBuf>,
    /// What the handler does: `ack` acks (and retries once on request); `http` calls an
    /// HTTP API and parks a durable retry when the call fails.
    #[arg(long, value_enum, default_value_t = Template::Ack)]
    template: Template,
}

/// `sluice new`: the project, and what to do next.
pub(crate) fn execute(args: Args) -> Result<()> {
    new(
        &args.name,
        args.lang,
        args.template,
        args.sdk_path.as_deref(),
    )
}

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
