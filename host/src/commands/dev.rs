//! `sluice dev`: the inner loop. Builds the project, runs it with the host (and a private dev
//! Redis unless `--redis` names one), watches the sources, and on every save rebuilds; the host
//! swaps the new component in without a restart (its component-file watcher sees the build's
//! atomic rename). A failed build prints the toolchain's errors and changes nothing: the last
//! good handler keeps serving.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use notify::Watcher as _;

use crate::project::{Project, build};

/// How long after the last change a rebuild starts (editors write in bursts).
const SETTLE: Duration = Duration::from_millis(300);

/// Run the project in `dir` until ctrl-c.
pub async fn dev(dir: &Path, redis: Option<&str>) -> Result<()> {
    let project = Project::detect(dir)?;
    let config = dir.join("sluice.toml");
    if !config.is_file() {
        anyhow::bail!(
            "{} is missing: `sluice dev` runs the project with its sluice.toml (`sluice new` writes one)",
            config.display()
        );
    }
    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel::<PathBuf>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads (a build opening the sources) are not changes.
        if let Some(event) = event.ok().filter(|e| !e.kind.is_access()) {
            for path in event.paths {
                let _ = tx.send(path);
            }
        }
    })
    .context("cannot watch the project's files")?;
    // Each directory on its own: a recursive watch would follow links and walk into
    // environments and data. A directory made later is not watched until the next start.
    for path in project.sources() {
        watcher
            .watch(&path, notify::RecursiveMode::NonRecursive)
            .with_context(|| format!("cannot watch {}", path.display()))?;
    }
    // The host needs a component to start: build until one builds.
    while let Err(err) = rebuild(&project).await {
        eprintln!("{err:#}\nwaiting for a change to build again");
        next_change(&project, &mut changes).await;
    }
    // The host takes new builds through its component-file watcher.
    let loaded = crate::config::Config::load(std::slice::from_ref(&config))
        .context("invalid configuration")?;
    if loaded.watch_interval.is_none() {
        eprintln!(
            "warning: watch_interval is \"off\" in {}: the host will not take new builds; remove it for `sluice dev`",
            config.display()
        );
    }
    let mut host = {
        let config = config.clone();
        let redis = redis.map(str::to_owned);
        tokio::spawn(async move { super::run(&[config], redis.as_deref()).await })
    };
    eprintln!(
        "serving {}; watching {} for changes",
        project.output().display(),
        dir.display()
    );
    loop {
        tokio::select! {
            () = next_change(&project, &mut changes) => {
                match rebuild(&project).await {
                    Ok(()) => eprintln!("the host swaps the new build in"),
                    Err(err) => eprintln!("{err:#}\nthe last good handler keeps serving"),
                }
            }
            result = &mut host => return result.context("the host task failed")?,
        }
    }
}

/// Wait for a change to a source, then for the burst of writes to settle.
async fn next_change(
    project: &Project,
    changes: &mut tokio::sync::mpsc::UnboundedReceiver<PathBuf>,
) {
    loop {
        match changes.recv().await {
            Some(path) if project.is_source(&path) => {
                eprintln!("{} changed", path.display());
                break;
            }
            Some(_) => continue,
            None => std::future::pending::<()>().await,
        }
    }
    loop {
        match tokio::time::timeout(SETTLE, changes.recv()).await {
            Ok(Some(_)) => continue,
            _ => return,
        }
    }
}

async fn rebuild(project: &Project) -> Result<()> {
    let p = project.clone();
    eprintln!("building…");
    let built = tokio::task::spawn_blocking(move || build::build(&p))
        .await
        .context("the build task failed")?
        .context("the build failed")?;
    eprintln!(
        "built {} in {:.1}s",
        built.path.display(),
        built.took.as_secs_f64()
    );
    Ok(())
}
