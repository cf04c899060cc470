//! Where `sluice build` finds the Python and JavaScript toolchains, and `sluice tools install`,
//! which puts their pinned versions in a per-user directory (as `rustup` does for Rust), so a
//! project outside this checkout builds without PATH edits.
//!
//! Each tool is looked for, in order: its environment variable (`SLUICE_COMPONENTIZE_PY`,
//! `SLUICE_COMPONENTIZE_JS`), the per-user tools directory ([`tools_dir`]), the `target/tools`
//! of the checkout this binary was built from (what `scripts/setup` installs; not when
//! `SLUICE_TOOLS_DIR` names the directory), then PATH.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{ProjectError, io};

/// The componentize-py version builds are made and tested with.
pub const COMPONENTIZE_PY: &str = "0.25.1";
/// The componentize-js version builds are made and tested with.
pub const COMPONENTIZE_JS: &str = "0.23.0";

/// What a missing tool's error tells the user to run.
pub const INSTALL_HINT: &str = "run `sluice tools install` to install the pinned componentize-py and componentize-js for this user";

/// One of the non-Rust build tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// componentize-py (Python handlers).
    ComponentizePy,
    /// componentize-js (JavaScript handlers).
    ComponentizeJs,
}

impl Tool {
    /// Both, in the order they are listed.
    pub const ALL: [Tool; 2] = [Tool::ComponentizePy, Tool::ComponentizeJs];

    /// The program's name.
    pub fn program(self) -> &'static str {
        match self {
            Tool::ComponentizePy => "componentize-py",
            Tool::ComponentizeJs => "componentize-js",
        }
    }

    fn env_var(self) -> &'static str {
        match self {
            Tool::ComponentizePy => "SLUICE_COMPONENTIZE_PY",
            Tool::ComponentizeJs => "SLUICE_COMPONENTIZE_JS",
        }
    }

    /// Where an install under `root` puts the program.
    fn under(self, root: &Path) -> PathBuf {
        match self {
            Tool::ComponentizePy => root.join("py/bin/componentize-py"),
            Tool::ComponentizeJs => root.join("js/node_modules/.bin/componentize-js"),
        }
    }
}

/// Where a tool was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Named by its environment variable.
    Env(PathBuf),
    /// In the per-user tools directory.
    UserDir(PathBuf),
    /// In the `target/tools` of the checkout `sluice` was built from.
    Checkout(PathBuf),
    /// On PATH.
    Path(PathBuf),
    /// Nowhere: the program name is still tried (its error says how to install it).
    Missing,
}

impl Found {
    /// The program to run.
    pub fn program(&self, tool: Tool) -> PathBuf {
        match self {
            Found::Env(p) | Found::UserDir(p) | Found::Checkout(p) | Found::Path(p) => p.clone(),
            Found::Missing => PathBuf::from(tool.program()),
        }
    }
}

/// The per-user tools directory: `SLUICE_TOOLS_DIR`, else `$XDG_DATA_HOME/sluice/tools`, else
/// `~/.local/share/sluice/tools`.
pub fn tools_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SLUICE_TOOLS_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(data).join("sluice/tools"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".local/share/sluice/tools"))
}

/// The `target/tools` of the checkout this binary was built from, if it is still there.
fn checkout_tools() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools");
    dir.is_dir().then_some(dir)
}

/// Where `tool` is, by the order in the module doc.
pub fn find(tool: Tool) -> Found {
    if let Some(p) = std::env::var_os(tool.env_var()).filter(|p| !p.is_empty()) {
        return Found::Env(PathBuf::from(p));
    }
    if let Some(p) = tools_dir().map(|d| tool.under(&d)).filter(|p| p.is_file()) {
        return Found::UserDir(p);
    }
    // A tools directory named outright is the only one looked in.
    let named_dir = std::env::var_os("SLUICE_TOOLS_DIR").is_some_and(|d| !d.is_empty());
    if let Some(p) = checkout_tools()
        .filter(|_| !named_dir)
        .map(|d| tool.under(&d))
        .filter(|p| p.is_file())
    {
        return Found::Checkout(p);
    }
    match on_path(tool.program()) {
        Some(p) => Found::Path(p),
        None => Found::Missing,
    }
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// `sluice tools`: each tool and where it was found.
pub fn report() -> String {
    let mut out = String::new();
    for tool in Tool::ALL {
        let line = match find(tool) {
            Found::Env(p) => format!("{} (from ${})", p.display(), tool.env_var()),
            Found::UserDir(p) => format!("{} (per-user tools directory)", p.display()),
            Found::Checkout(p) => format!("{} (this checkout's target/tools)", p.display()),
            Found::Path(p) => format!("{} (on PATH)", p.display()),
            Found::Missing => format!("not found: {INSTALL_HINT}"),
        };
        let _ = writeln!(out, "{:<16} {line}", tool.program());
    }
    match tools_dir() {
        Some(dir) => {
            let _ = writeln!(out, "tools directory: {}", dir.display());
        }
        None => out.push_str("tools directory: none (set HOME or SLUICE_TOOLS_DIR)\n"),
    }
    out
}

/// Why `sluice tools install` could not finish.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// No directory to install into.
    #[error("no tools directory: set SLUICE_TOOLS_DIR or HOME")]
    NoDir,
    /// A program the install runs is missing.
    #[error("{program} was not found: {why}")]
    Missing {
        /// The program.
        program: &'static str,
        /// What needs it and where to get it.
        why: &'static str,
    },
    /// A step ran and failed; its own output is above.
    #[error("`{step}` failed ({status}); its output is above")]
    Failed {
        /// The command line.
        step: String,
        /// How it exited.
        status: std::process::ExitStatus,
    },
    /// A step's program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// Making the directory failed.
    #[error(transparent)]
    Project(#[from] ProjectError),
}

/// Install the pinned componentize-py (a Python virtual environment under `<dir>/py`) and
/// componentize-js (npm, under `<dir>/js`) into [`tools_dir`]; returns what was done. Safe to
/// run again: a tool already at its pinned version is left alone.
pub fn install() -> Result<String, InstallError> {
    let dir = tools_dir().ok_or(InstallError::NoDir)?;
    install_into(&dir)
}

/// [`install`] into `dir`.
pub fn install_into(dir: &Path) -> Result<String, InstallError> {
    std::fs::create_dir_all(dir).map_err(|e| InstallError::from(io(dir)(e)))?;
    let mut out = String::new();
    let py = Tool::ComponentizePy.under(dir);
    if installed_version(&py).as_deref() == Some(COMPONENTIZE_PY) {
        let _ = writeln!(
            out,
            "componentize-py {COMPONENTIZE_PY}: already in {}",
            py.display()
        );
    } else {
        let venv = dir.join("py");
        step(
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
            "python3",
            "Python 3 with its venv module makes componentize-py's environment (apt-get install python3-venv)",
        )?;
        step(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(format!("componentize-py=={COMPONENTIZE_PY}")),
            "pip",
            "the virtual environment has no pip (apt-get install python3-venv)",
        )?;
        let _ = writeln!(
            out,
            "componentize-py {COMPONENTIZE_PY}: installed in {}",
            py.display()
        );
    }
    let js = Tool::ComponentizeJs.under(dir);
    let js_dir = dir.join("js");
    // Asked by running it: an install cut short (files there, a dependency missing) is made
    // again.
    let js_version = installed_version(&js);
    if js_version.as_deref() == Some(COMPONENTIZE_JS) {
        let _ = writeln!(
            out,
            "componentize-js {COMPONENTIZE_JS}: already in {}",
            js.display()
        );
    } else {
        // What a cut-short install left is not built on.
        let _ = std::fs::remove_dir_all(js_dir.join("node_modules"));
        std::fs::create_dir_all(&js_dir).map_err(|e| InstallError::from(io(&js_dir)(e)))?;
        // Its own package, and `--prefix`: npm would otherwise install into the nearest
        // directory above with a package.json or node_modules (such as the home directory).
        let manifest = js_dir.join("package.json");
        if !manifest.is_file() {
            std::fs::write(&manifest, "{\"private\": true}\n")
                .map_err(|e| InstallError::from(io(&manifest)(e)))?;
        }
        step(
            Command::new("npm")
                .current_dir(&js_dir)
                .arg("--prefix")
                .arg(&js_dir)
                .args([
                    "install",
                    "--silent",
                    "--no-audit",
                    "--no-fund",
                    "--no-save",
                ])
                .arg(format!(
                    "@bytecodealliance/componentize-js@{COMPONENTIZE_JS}"
                )),
            "npm",
            "Node.js's npm installs componentize-js (apt-get install npm)",
        )?;
        let _ = writeln!(
            out,
            "componentize-js {COMPONENTIZE_JS}: installed in {}",
            js.display()
        );
    }
    Ok(out)
}

/// The version a componentize-py or componentize-js prints (its last word), if it runs.
fn installed_version(program: &Path) -> Option<String> {
    let output = Command::new(program).arg("--version").output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    text.split_whitespace().last().map(str::to_owned)
}

fn step(
    command: &mut Command,
    program: &'static str,
    why: &'static str,
) -> Result<(), InstallError> {
    eprintln!("running {command:?}");
    let status = command.status().map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            InstallError::Missing { program, why }
        } else {
            InstallError::Spawn {
                program,
                source: err,
            }
        }
    })?;
    if !status.success() {
        return Err(InstallError::Failed {
            step: format!("{command:?}"),
            status,
        });
    }
    Ok(())
}
