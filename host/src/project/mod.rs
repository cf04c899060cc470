//! A handler project on disk, in Rust, Python or JavaScript: what `sluice new` writes
//! ([`scaffold`]), how `sluice build` turns it into a component ([`build`]), and the files
//! `sluice dev` watches ([`Project::sources`]), the language toolchains a build needs
//! ([`tools`]), and the made-up deliveries `sluice test` runs a handler on ([`fixture`]).
//!
//! Every language builds against the same `sluice:handler` WIT. The WIT and the Python and
//! JavaScript SDKs travel inside this binary ([`assets`]) and are written into the project's
//! `target/sluice/` at build time, so a project builds against the contract of the host that
//! runs it. Rust projects get the SDK from cargo (`sluice-guest`).
//!
//! Every build ends in `target/<name>.wasm`, written atomically (a temporary file, then a
//! rename): a running host watching that file never sees half of it, and a failed build leaves
//! the last good component in place.

pub mod assets;
pub mod build;
pub mod fixture;
pub mod scaffold;
pub mod tools;

use std::fmt;
use std::path::{Path, PathBuf};

/// A handler's language: picks the template and the toolchain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// cargo and the `sluice-guest` crate.
    Rust,
    /// componentize-py and the `sluice_guest` Python package.
    Python,
    /// componentize-js and `sluice_guest.js`.
    Js,
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
        })
    }
}

/// What a new project's handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Template {
    /// Acks each entry; an entry that asks for it is retried once, durably, after 5 s.
    Ack,
    /// Calls an HTTP API for each entry; a failed call parks a durable retry (stub_api.py
    /// stands in for the API on your machine).
    Http,
}

/// Why a project could not be made or built. Each names the file or tool to look at.
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    /// The directory holds none of the files that mark a project.
    #[error(
        "{} is not a handler project: expected Cargo.toml (Rust), app.py (Python) or src/app.js (JavaScript); `sluice new <name>` makes one",
        dir.display()
    )]
    NotAProject {
        /// The directory.
        dir: PathBuf,
    },
    /// `sluice new` would overwrite something.
    #[error("{} already exists; pick another name or remove it", path.display())]
    Exists {
        /// What is there.
        path: PathBuf,
    },
    /// The name cannot be a package, module and stream name.
    #[error(
        "`{name}` cannot name a project: use letters, digits, `-` and `_`, starting with a letter"
    )]
    BadName {
        /// The name given.
        name: String,
    },
    /// A build tool is not installed.
    #[error("{tool} was not found: {hint}")]
    ToolMissing {
        /// The program.
        tool: String,
        /// How to get it.
        hint: String,
    },
    /// A build tool ran and failed; its own output (already shown) says why.
    #[error("{tool} failed ({status}); the errors are above")]
    BuildFailed {
        /// The program.
        tool: String,
        /// How it exited.
        status: std::process::ExitStatus,
    },
    /// A JavaScript source does not parse.
    #[error(
        "syntax error: {message}\n  --> {}:{line}:{column}\n   |\n   | {text}\n   | {:>width$}",
        file.display(),
        "^",
        width = *column as usize
    )]
    JsSyntax {
        /// The file, relative to the project.
        file: PathBuf,
        /// Its line (from 1).
        line: u32,
        /// Its column (from 1).
        column: u32,
        /// What is wrong.
        message: String,
        /// The line's text.
        text: String,
    },
    /// cargo built no component.
    #[error(
        "cargo built no .wasm for {}: set `crate-type = [\"cdylib\"]` in its [lib] section",
        manifest.display()
    )]
    NoArtifact {
        /// The crate's manifest.
        manifest: PathBuf,
    },
    /// The SDK named with `--sdk-path` is not there.
    #[error(
        "{} holds no sluice-guest, sluice-guest-macros and sluice-descriptor crates (give the repository's guest-sdk directory)",
        dir.display()
    )]
    NoSdk {
        /// The directory given.
        dir: PathBuf,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ProjectError + '_ {
    move |source| ProjectError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A project directory and its language.
#[derive(Debug, Clone)]
pub struct Project {
    /// The project's root.
    pub dir: PathBuf,
    /// Its language.
    pub lang: Lang,
}

impl Project {
    /// The project in `dir`, its language told by the files that mark one.
    pub fn detect(dir: &Path) -> Result<Self, ProjectError> {
        // Absolute, so the watcher's paths (always absolute) compare with it.
        let dir = &dir.canonicalize().map_err(io(dir))?;
        let lang = if dir.join("Cargo.toml").is_file() {
            Lang::Rust
        } else if dir.join("app.py").is_file() {
            Lang::Python
        } else if dir.join("src/app.js").is_file() {
            Lang::Js
        } else {
            return Err(ProjectError::NotAProject {
                dir: dir.to_owned(),
            });
        };
        Ok(Self {
            dir: dir.to_owned(),
            lang,
        })
    }

    /// The component's file name without `.wasm`: the directory's name, as an identifier
    /// (for Rust, cargo's artifact name, which is the same rule on the package name).
    pub fn name(&self) -> String {
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "handler".to_owned());
        identifier(&name)
    }

    /// Where `sluice build` puts the component: the one the project's `sluice.toml` names
    /// (its first subscription's `component` inside this project), so a copied or renamed
    /// project builds what its config runs; else `target/<name>.wasm`.
    pub fn output(&self) -> PathBuf {
        self.configured_output().unwrap_or_else(|| {
            self.dir
                .join("target")
                .join(format!("{}.wasm", self.name()))
        })
    }

    /// The first `component` of `sluice.toml`'s subscriptions that is a `.wasm` file inside
    /// this project (one elsewhere is another project's build, not this one's).
    fn configured_output(&self) -> Option<PathBuf> {
        let text = std::fs::read_to_string(self.dir.join("sluice.toml")).ok()?;
        let config: toml::Table = text.parse().ok()?;
        let subscriptions = match config.get("subscription")? {
            toml::Value::Array(all) => all.iter().collect::<Vec<_>>(),
            one => vec![one],
        };
        subscriptions.into_iter().find_map(|sub| {
            let named = Path::new(sub.get("component")?.as_str()?);
            let path = self.dir.join(named);
            let inside = path
                .components()
                .all(|c| c != std::path::Component::ParentDir)
                && path.starts_with(&self.dir);
            (inside && path.extension().is_some_and(|e| e == "wasm")).then_some(path)
        })
    }

    /// What `sluice dev` watches: the directories (each on its own, none recursively) and
    /// files a build reads, never `target/`, caches, virtual environments, directories
    /// without sources (data), or anything behind a link (a link to `/` would watch the
    /// machine).
    pub fn sources(&self) -> Vec<PathBuf> {
        let mut paths = match self.lang {
            Lang::Rust => {
                let mut paths = vec![self.dir.join("Cargo.toml")];
                self.source_dirs(&self.dir.join("src"), 0, &mut paths);
                paths
            }
            Lang::Js => {
                let mut paths = Vec::new();
                self.source_dirs(&self.dir.join("src"), 0, &mut paths);
                paths
            }
            Lang::Python => {
                let mut paths = vec![self.dir.clone()];
                for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                    if self.is_source_dir(&entry) {
                        self.source_dirs(&entry.path(), 1, &mut paths);
                    }
                }
                paths
            }
        };
        paths.retain(|p| p.exists());
        paths
    }

    /// `dir` and the directories under it that may hold sources, at most
    /// [`MAX_WATCHED_DIRS`] in all and [`MAX_WATCH_DEPTH`] deep.
    fn source_dirs(&self, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        if depth > MAX_WATCH_DEPTH || out.len() >= MAX_WATCHED_DIRS || !dir.is_dir() {
            return;
        }
        out.push(dir.to_owned());
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if self.is_source_dir(&entry) {
                self.source_dirs(&entry.path(), depth + 1, out);
            }
        }
    }

    /// Whether a directory entry is a real directory a build may read sources from.
    fn is_source_dir(&self, entry: &std::fs::DirEntry) -> bool {
        // `file_type` does not follow links: a linked directory is not one.
        let real_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let path = entry.path();
        if !real_dir || self.is_ignored_dir(&path) || path.join("pyvenv.cfg").exists() {
            return false;
        }
        match self.lang {
            // A package (or a namespace of modules): it holds Python files.
            Lang::Python => std::fs::read_dir(&path)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    e.path().extension().is_some_and(|x| x == "py")
                        || e.path().join("__init__.py").is_file()
                }),
            Lang::Rust | Lang::Js => true,
        }
    }

    fn is_ignored_dir(&self, dir: &Path) -> bool {
        dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with('.')
                || matches!(
                    n,
                    "target" | "__pycache__" | "node_modules" | "venv" | "env" | "site-packages"
                )
        })
    }

    /// Whether `dir`, a directory made while `sluice dev` runs, may come to hold sources: a
    /// real directory (not a link) where [`Self::sources`] looks, with no ignored name or
    /// environment (`pyvenv.cfg`) on its way from the project's root. A Python package is
    /// empty when it appears, so this does not ask for sources in it yet.
    pub fn may_hold_sources(&self, dir: &Path) -> bool {
        let Ok(rel) = dir.strip_prefix(&self.dir) else {
            return false;
        };
        let real_dir = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
        if !real_dir
            || rel.as_os_str().is_empty()
            || rel.components().count() > MAX_WATCH_DEPTH + 1
            || (matches!(self.lang, Lang::Rust | Lang::Js) && !rel.starts_with("src"))
        {
            return false;
        }
        let mut at = self.dir.clone();
        rel.components().all(|part| {
            at.push(part);
            !self.is_ignored_dir(&at) && !at.join("pyvenv.cfg").exists()
        })
    }

    /// Whether a changed file is one a build reads.
    pub fn is_source(&self, path: &Path) -> bool {
        let Ok(rel) = path.strip_prefix(&self.dir) else {
            return false;
        };
        if rel.starts_with("target") || rel.components().any(|c| c.as_os_str() == "__pycache__") {
            return false;
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match self.lang {
            Lang::Rust => ext == "rs" || rel == Path::new("Cargo.toml"),
            Lang::Python => ext == "py",
            Lang::Js => matches!(ext, "js" | "mjs" | "json"),
        }
    }
}

/// The most directories `sluice dev` watches.
pub const MAX_WATCHED_DIRS: usize = 1000;
/// How deep under a source root `sluice dev` watches.
pub const MAX_WATCH_DEPTH: usize = 8;

/// `name` as a Rust/Python identifier: `-` and other punctuation become `_`.
pub fn identifier(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_is_the_component_the_config_names() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("copy-of-orders");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/app.js"), "").unwrap();
        let project = Project::detect(&root).unwrap();
        assert_eq!(
            project.output(),
            project.dir.join("target/copy_of_orders.wasm"),
            "no sluice.toml: the directory's name"
        );
        let config = |component: &str| {
            let text = format!("[[subscription]]\ncomponent = \"{component}\"\n");
            std::fs::write(root.join("sluice.toml"), text).unwrap();
        };
        config("target/orders.wasm");
        assert_eq!(project.output(), project.dir.join("target/orders.wasm"));
        for elsewhere in [
            "../orders/target/orders.wasm",
            "/tmp/x.wasm",
            "target/x.txt",
        ] {
            config(elsewhere);
            assert_eq!(
                project.output(),
                project.dir.join("target/copy_of_orders.wasm"),
                "{elsewhere} is not this project's build"
            );
        }
    }

    #[test]
    fn names_become_identifiers() {
        assert_eq!(identifier("bank-payments-python"), "bank_payments_python");
        assert_eq!(identifier("orders"), "orders");
    }

    #[test]
    fn only_sources_trigger_a_rebuild() {
        let p = Project {
            dir: PathBuf::from("/p"),
            lang: Lang::Python,
        };
        assert!(p.is_source(Path::new("/p/app.py")));
        assert!(!p.is_source(Path::new("/p/target/sluice/python/x.py")));
        assert!(!p.is_source(Path::new("/p/__pycache__/app.cpython-311.pyc")));
        assert!(!p.is_source(Path::new("/elsewhere/app.py")));
        let r = Project {
            dir: PathBuf::from("/r"),
            lang: Lang::Rust,
        };
        assert!(r.is_source(Path::new("/r/src/lib.rs")));
        assert!(r.is_source(Path::new("/r/Cargo.toml")));
        assert!(!r.is_source(Path::new("/r/target/debug/x.rs")));
    }

    #[test]
    fn dev_watches_sources_not_environments_data_or_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("app");
        let mk = |p: &str| std::fs::create_dir_all(root.join(p)).unwrap();
        let touch = |p: &str| std::fs::write(root.join(p), b"").unwrap();
        for d in [
            "pkg/sub",
            "venv/lib",
            ".venv",
            "data/2026",
            "target/sluice",
            "src/deep",
        ] {
            mk(d);
        }
        touch("app.py");
        touch("pkg/__init__.py");
        touch("pkg/sub/m.py");
        touch("venv/pyvenv.cfg");
        touch("venv/lib/x.py");
        touch("data/2026/readings.csv");
        std::os::unix::fs::symlink("/", root.join("linked")).unwrap();
        std::os::unix::fs::symlink("/", root.join("src/linked")).unwrap();
        let python = Project {
            dir: root.clone(),
            lang: Lang::Python,
        };
        let mut watched = python.sources();
        watched.sort();
        assert_eq!(
            watched,
            vec![root.clone(), root.join("pkg"), root.join("pkg/sub")],
            "{watched:?}"
        );
        touch("Cargo.toml");
        let rust = Project {
            dir: root.clone(),
            lang: Lang::Rust,
        };
        let mut watched = rust.sources();
        watched.sort();
        assert_eq!(
            watched,
            vec![
                root.join("Cargo.toml"),
                root.join("src"),
                root.join("src/deep")
            ],
            "{watched:?}"
        );
        // Directories made later: watched where sources may go, never behind a link or in an
        // environment, data only for Python (whose packages are empty when they appear).
        for (project, dir, expected) in [
            (&python, "data/2026", true),
            (&python, "venv/lib", false),
            (&python, ".venv", false),
            (&python, "linked", false),
            (&python, "target/sluice", false),
            (&python, "", false),
            (&rust, "src/deep", true),
            (&rust, "src/linked", false),
            (&rust, "data/2026", false),
        ] {
            assert_eq!(
                project.may_hold_sources(&root.join(dir)),
                expected,
                "{dir} ({:?})",
                project.lang
            );
        }
    }
}
