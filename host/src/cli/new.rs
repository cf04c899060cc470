//! `sluice new`: scaffold a handler project.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::project::scaffold::{SdkCrates, SdkSource, new_project};
use crate::project::{Lang, Template};

/// `sluice new`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The project's name: its directory, package and stream.
    #[arg(required_unless_present = "list")]
    name: Option<String>,
    /// List the languages and templates, and make nothing.
    #[arg(long, conflicts_with_all = ["lang", "template", "sdk_path"])]
    list: bool,
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
    let Some(name) = args.name.filter(|_| !args.list) else {
        print!("{}", list());
        return Ok(());
    };
    new(&name, args.lang, args.template, args.sdk_path.as_deref())
}

/// What `sluice new --list` prints: each language and template, with what it gives.
fn list() -> String {
    use clap::ValueEnum as _;
    let mut out = String::from("languages (--lang):\n");
    let rows = |out: &mut String, values: Vec<clap::builder::PossibleValue>, default: &str| {
        for value in values {
            let name = value.get_name();
            let help = value.get_help().map(|h| h.to_string()).unwrap_or_default();
            let marker = if name == default { " (default)" } else { "" };
            out.push_str(&format!("  {:<8}{help}{marker}\n", name));
        }
    };
    let langs = Lang::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value());
    rows(&mut out, langs.collect(), "rust");
    out.push_str("templates (--template):\n");
    let templates = Template::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value());
    rows(&mut out, templates.collect(), "ack");
    out.push_str("for example: sluice new orders --lang python --template http\n");
    out
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
