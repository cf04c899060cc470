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

/// `sluice dev`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The project's directory.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Redis URL (default: the project's sluice.toml, else a private dev server).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis: Option<String>,
    /// Write every span of every entry to this terminal, one line each (no collector needed;
    /// overrides the config's `[telemetry]`).
    #[arg(long)]
    traces: bool,
}

/// `sluice dev`: until ctrl-c.
pub(crate) async fn execute(args: Args) -> Result<()> {
    dev(&args.dir, args.redis.as_deref(), args.traces).await
}

/// How long after the last change a rebuild starts (editors write in bursts).
const SETTLE: Duration = Duration::from_millis(300);

/// Run the project in `dir` until ctrl-c.
pub async fn dev(dir: &Path, redis: Option<&str>, traces: bool) -> Result<()> {
    let project = Project::detect(dir)?;
    let config = dir.join("sluice.toml");
    if !config.is_file() {
        anyhow::bail!(
            "{} is missing: `sluice dev` runs the project with its sluice.toml (`sluice new` writes one)",
            config.display()
        );
    }
    let (mut watched, mut changes) = watch(&project)?;
    // `sluice send` in another terminal waits for this session's first build, not fails.
    let mark = Running::mark(&project.dir);
    // The host needs a component to start: build until one builds.
    while let Err(err) = rebuild(&project).await {
        eprintln!("{err:#}\nwaiting for a change to build again");
        let say = |state| mark.as_ref().map(|m| m.set(state));
        say(DevState::Failed);
        next_change(&project, &mut watched, &mut changes).await;
        say(DevState::Building);
    }
    if redis.is_some() {
        // No dev Redis will start: a `sluice send` has nothing more to wait for (one not
        // given this URL says so at once, instead of waiting for a dev server that never
        // comes).
        if let Some(m) = &mark {
            m.set(DevState::Serving);
        }
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
        let dev = super::run::Dev {
            project: project.dir.clone(),
            traces,
        };
        tokio::spawn(
            async move { super::run::run_with(&[config], redis.as_deref(), Some(dev)).await },
        )
    };
    eprintln!(
        "serving {}; watching {} for changes",
        project.output().display(),
        dir.display()
    );
    loop {
        tokio::select! {
            () = next_change(&project, &mut watched, &mut changes) => {
                match rebuild(&project).await {
                    Ok(true) => eprintln!("the host swaps the new build in"),
                    Ok(false) => {}
                    Err(err) => eprintln!("{err:#}\nthe last good handler keeps serving"),
                }
            }
            result = &mut host => return result.context("the host task failed")?,
        }
    }
}

/// The file in a project that names the `sluice dev` running there (its process id).
const RUNNING_FILE: &str = ".sluice/dev.pid";

/// This process, named in [`RUNNING_FILE`] while it runs (a crash leaves the file; readers
/// check that the process lives), with how its first build went.
struct Running(PathBuf);

/// Where a `sluice dev` is, as [`RUNNING_FILE`] says after its process id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DevState {
    /// Building (its first build, or again after a change).
    Building,
    /// Its last build failed, and no build has served yet: it waits for a change.
    Failed,
    /// Built, on a Redis it was given (no dev Redis of its own will start).
    Serving,
}

impl Running {
    fn mark(project: &Path) -> Option<Self> {
        let path = project.join(RUNNING_FILE);
        std::fs::create_dir_all(path.parent()?).ok()?;
        let running = Self(path);
        running.set(DevState::Building).then_some(running)
    }

    /// Say `state` in the file; false when it cannot be written.
    fn set(&self, state: DevState) -> bool {
        let word = match state {
            DevState::Building => "building",
            DevState::Failed => "failed",
            DevState::Serving => "serving",
        };
        let text = format!("{} {word}", std::process::id());
        crate::support::private_file::write_private(&self.0, &[text.as_bytes()], false).is_ok()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The process id of a `sluice dev` running in the project at `dir`, and its state, if one is.
pub(crate) fn running_in(dir: &Path) -> Option<(u32, DevState)> {
    let path = dir.join(RUNNING_FILE);
    let text = std::fs::read_to_string(&path).ok()?;
    let mut words = text.split_whitespace();
    let pid: u32 = words.next()?.parse().ok()?;
    let state = match words.next() {
        Some("failed") => DevState::Failed,
        Some("serving") => DevState::Serving,
        _ => DevState::Building,
    };
    // Alive, and a sluice (a stale file's number may belong to another program by now).
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let ours = std::env::current_exe().ok();
    let same_name = exe.file_name() == ours.as_deref().and_then(Path::file_name);
    // And the process that wrote the file: one that started after the file was last written
    // (a sluice that took the number of a session killed before it could remove its file)
    // is not this project's.
    let written = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
    let after_it = started_at(pid).is_some_and(|t| t > written + STARTED_SLACK);
    (same_name && !after_it).then_some((pid, state))
}

/// How far [`started_at`] may be off (boot time is counted in whole seconds, and the clock
/// may have been set since).
const STARTED_SLACK: Duration = Duration::from_secs(5);

/// When process `pid` started, as /proc says (none where it does not).
fn started_at(pid: u32) -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command's name (field 2) may hold spaces and parentheses: count after the last ')',
    // where field 3 is the first; the start time is field 22, in clock ticks since boot.
    let ticks: u64 = stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(22 - 3)?
        .parse()
        .ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let hz = u64::try_from(hz).ok().filter(|&hz| hz > 0)?;
    Some(
        std::time::UNIX_EPOCH
            + Duration::from_secs(boot)
            + Duration::from_millis(ticks.saturating_mul(1000) / hz),
    )
}

/// Watch `project`'s sources: each directory on its own (a recursive watch would follow
/// links and walk into environments and data); a directory made later is watched once it
/// appears, if it may hold sources (see [`Project::may_hold_sources`]).
fn watch(project: &Project) -> Result<(Watched, tokio::sync::mpsc::UnboundedReceiver<PathBuf>)> {
    let (tx, changes) = tokio::sync::mpsc::unbounded_channel::<PathBuf>();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads (a build opening the sources) are not changes.
        if let Some(event) = event.ok().filter(|e| !e.kind.is_access()) {
            for path in event.paths {
                let _ = tx.send(path);
            }
        }
    })
    .context("cannot watch the project's files")?;
    let mut watched = Watched {
        watcher,
        dirs: std::collections::HashSet::new(),
    };
    watched.sync(project)?;
    Ok((watched, changes))
}

/// The directories `sluice dev` watches, each on its own.
struct Watched {
    watcher: notify::RecommendedWatcher,
    dirs: std::collections::HashSet<PathBuf>,
}

impl Watched {
    /// Watch the project's source directories (at the start).
    fn sync(&mut self, project: &Project) -> Result<()> {
        for path in project.sources() {
            self.watch(path)?;
        }
        Ok(())
    }

    /// Watch `path`, a directory made since the start, and those under it that may hold
    /// sources (`mkdir -p` makes them before any watch sees them), at most
    /// [`MAX_WATCHED_DIRS`](crate::project::MAX_WATCHED_DIRS) in all. True when one of them
    /// already holds a source: written before its watch began, it is a change too.
    fn add(&mut self, project: &Project, path: &Path) -> Result<bool> {
        if self.dirs.contains(path) || !self.watch(path.to_owned())? {
            return Ok(false);
        }
        let mut found_sources = false;
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            let entry = entry.path();
            if project.is_source(&entry) {
                found_sources = true;
            } else if project.may_hold_sources(&entry) {
                found_sources |= self.add(project, &entry)?;
            }
        }
        Ok(found_sources)
    }

    /// Follow what happened at `path`: a watched directory is watched afresh (deleted, its
    /// watch died with it; made again, it needs a new one), a new one that may hold sources
    /// is watched. True when such a directory already holds a source.
    fn note(&mut self, project: &Project, path: &Path) -> bool {
        let was_watched = self.dirs.contains(path);
        if was_watched {
            // An event about a watched path itself: it was made, moved, replaced or deleted
            // (and may already be back, so its name says nothing). Watch it afresh, if it is
            // there.
            let _ = self.watcher.unwatch(path);
            self.dirs.retain(|d| !d.starts_with(path));
        }
        if path.is_file() {
            if was_watched && let Err(err) = self.watch(path.to_owned()) {
                eprintln!("{err:#}");
            }
            return false;
        }
        if !path.is_dir() || !(was_watched || project.may_hold_sources(path)) {
            return false;
        }
        self.add(project, path).unwrap_or_else(|err| {
            eprintln!("{err:#}");
            false
        })
    }

    /// Watch one directory; false when it was watched already or the bound is reached.
    fn watch(&mut self, path: PathBuf) -> Result<bool> {
        if self.dirs.contains(&path) || self.dirs.len() >= crate::project::MAX_WATCHED_DIRS {
            return Ok(false);
        }
        self.watcher
            .watch(&path, notify::RecursiveMode::NonRecursive)
            .with_context(|| format!("cannot watch {}", path.display()))?;
        self.dirs.insert(path);
        Ok(true)
    }
}

/// Wait for a change to a source, then for the burst of writes to settle. A directory that
/// appears is watched from then on.
async fn next_change(
    project: &Project,
    watched: &mut Watched,
    changes: &mut tokio::sync::mpsc::UnboundedReceiver<PathBuf>,
) {
    loop {
        match changes.recv().await {
            Some(path) if project.is_source(&path) => {
                watched.note(project, &path);
                eprintln!("{} changed", path.display());
                break;
            }
            Some(path) => {
                if watched.note(project, &path) {
                    eprintln!("{} appeared with sources in it", path.display());
                    break;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
    // Directories still come and go while the burst settles (a branch switch).
    while let Ok(Some(path)) = tokio::time::timeout(SETTLE, changes.recv()).await {
        watched.note(project, &path);
    }
}

/// Build; true when a new component is in place.
async fn rebuild(project: &Project) -> Result<bool> {
    let p = project.clone();
    eprintln!("building…");
    let built = tokio::task::spawn_blocking(move || build::build(&p))
        .await
        .context("the build task failed")?
        .context("the build failed")?;
    if built.unchanged {
        eprintln!("{} is up to date with the sources", built.path.display());
    } else if built.reused {
        eprintln!(
            "took {} from an earlier build of these same sources",
            built.path.display()
        );
    } else {
        eprintln!(
            "built {} in {:.1}s",
            built.path.display(),
            built.took.as_secs_f64()
        );
    }
    Ok(!built.unchanged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_file_says_how_the_session_is() {
        let dir = tempfile::tempdir().unwrap();
        let running = Running::mark(dir.path()).unwrap();
        let pid = std::process::id();
        assert_eq!(running_in(dir.path()), Some((pid, DevState::Building)));
        for state in [DevState::Failed, DevState::Serving, DevState::Building] {
            assert!(running.set(state));
            assert_eq!(running_in(dir.path()), Some((pid, state)));
        }
        drop(running);
        assert_eq!(
            running_in(dir.path()),
            None,
            "removed when the session ends"
        );
    }

    /// A file left by a session that died names a number a later sluice may have taken:
    /// written before that process started, it is not that process's.
    #[test]
    fn a_file_older_than_the_process_it_names_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let running = Running::mark(dir.path()).unwrap();
        let started = started_at(std::process::id()).unwrap();
        let written = std::fs::metadata(dir.path().join(RUNNING_FILE))
            .and_then(|m| m.modified())
            .unwrap();
        assert!(
            started <= written + STARTED_SLACK,
            "{started:?} {written:?}"
        );
        assert!(
            written.duration_since(started).unwrap_or_default() < Duration::from_secs(24 * 3600)
        );
        assert!(running_in(dir.path()).is_some());
        let file = std::fs::File::options()
            .write(true)
            .open(dir.path().join(RUNNING_FILE))
            .unwrap();
        file.set_modified(started - Duration::from_secs(60))
            .unwrap();
        assert_eq!(running_in(dir.path()), None);
        drop(running);
    }

    /// The next change seen by `next_change`, within a minute, while `module` is written a
    /// moment later (the directories appear before anything is in them).
    async fn change_with(
        project: &Project,
        watched: &mut Watched,
        changes: &mut tokio::sync::mpsc::UnboundedReceiver<PathBuf>,
        module: Option<PathBuf>,
        what: &str,
    ) {
        let writer = tokio::spawn(async move {
            if let Some(module) = module {
                tokio::time::sleep(Duration::from_millis(200)).await;
                std::fs::write(module, b"x = 1\n").unwrap();
            }
        });
        tokio::time::timeout(
            Duration::from_secs(60),
            next_change(project, watched, changes),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}"));
        writer.await.unwrap();
    }

    /// A package made while `sluice dev` runs (empty at first, as `mkdir` makes it) is watched
    /// from then on: a module written in it is a change; so it is after it was deleted and
    /// made again (a branch switch).
    #[tokio::test]
    async fn a_package_made_while_watching_is_watched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app.py"), b"").unwrap();
        let project = Project::detect(dir.path()).unwrap();
        let (mut watched, mut changes) = watch(&project).unwrap();
        let pkg = dir.path().canonicalize().unwrap().join("payments");
        std::fs::create_dir(&pkg).unwrap();
        std::fs::create_dir(pkg.join("deep")).unwrap();
        let module = Some(pkg.join("deep/charge.py"));
        let what = "the module in the new package is a change";
        change_with(&project, &mut watched, &mut changes, module, what).await;
        assert!(
            watched.dirs.contains(&pkg.join("deep")),
            "{:?}",
            watched.dirs
        );

        std::fs::remove_dir_all(&pkg).unwrap();
        std::fs::create_dir(&pkg).unwrap();
        let what = "the deleted module is a change";
        change_with(&project, &mut watched, &mut changes, None, what).await;
        let module = Some(pkg.join("refund.py"));
        let what = "a module in the package made again is a change";
        change_with(&project, &mut watched, &mut changes, module, what).await;
    }
}
