//! A handler project on disk, in Rust, Python or JavaScript: what `sluice new` writes
//! ([`scaffold`]), how `sluice build` turns it into a component ([`build`]), and the files
//! `sluice dev` watches ([`Project::sources`]).
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
pub mod scaffold;

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
    #[error("{tool} was not found ({hint})")]
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

    /// Where `sluice build` puts the component.
    pub fn output(&self) -> PathBuf {
        self.dir
            .join("target")
            .join(format!("{}.wasm", self.name()))
    }

    /// What `sluice dev` watches, and whether recursively: the sources a build reads, never
    /// `target/` (builds write there) or caches.
    pub fn sources(&self) -> Vec<(PathBuf, bool)> {
        let mut paths = match self.lang {
            Lang::Rust => vec![
                (self.dir.join("src"), true),
                (self.dir.join("Cargo.toml"), false),
            ],
            Lang::Js => vec![(self.dir.join("src"), true)],
            Lang::Python => {
                let mut paths = vec![(self.dir.clone(), false)];
                if let Ok(entries) = std::fs::read_dir(&self.dir) {
                    paths.extend(
                        entries
                            .flatten()
                            .map(|e| e.path())
                            .filter(|p| p.is_dir() && !self.is_ignored_dir(p))
                            .map(|p| (p, true)),
                    );
                }
                paths
            }
        };
        paths.retain(|(p, _)| p.exists());
        paths
    }

    fn is_ignored_dir(&self, dir: &Path) -> bool {
        dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with('.') || matches!(n, "target" | "__pycache__" | "node_modules")
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
}
