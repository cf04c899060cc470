//! `sluice build`: build the project in a directory into its component.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::project::{Project, build};

/// `sluice build`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The project's directory.
    #[arg(default_value = ".")]
    dir: PathBuf,
}

/// `sluice build`: the component's path goes to stdout.
pub(crate) fn execute(args: Args) -> Result<()> {
    build(&args.dir).map(|_| ())
}

/// Build the project in `dir`; prints the component's path on stdout.
pub fn build(dir: &Path) -> Result<PathBuf> {
    let project = Project::detect(dir)?;
    eprintln!(
        "building {} ({} handler)",
        project.dir.display(),
        project.lang
    );
    let built = build::build(&project).with_context(|| {
        format!(
            "cannot build the {} handler in {}",
            project.lang,
            dir.display()
        )
    })?;
    let how = if built.unchanged {
        "up to date with the sources"
    } else if built.reused {
        "the component of an earlier build of these same sources"
    } else {
        "built"
    };
    eprintln!(
        "{how} in {:.1}s ({:.1} MB)",
        built.took.as_secs_f64(),
        built.size as f64 / 1e6
    );
    println!("{}", built.path.display());
    Ok(built.path)
}
