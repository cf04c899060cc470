//! `sluice build`: one project in, one component out (`target/<name>.wasm`), with each
//! language's own toolchain: cargo for Rust, componentize-py for Python (against the
//! `handler-http` world, so it may import `wasi:http`), componentize-js for JavaScript (against
//! `handler`; its `fetch` brings `wasi:http` itself). The toolchain's own messages go straight
//! to the terminal.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Lang, Project, ProjectError, assets, io};

/// A finished build.
#[derive(Debug, Clone)]
pub struct Built {
    /// The component.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// How long the build took.
    pub took: Duration,
}

/// The toolchain programs a build runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    /// cargo (`CARGO`, else `cargo` on PATH).
    pub cargo: PathBuf,
    /// componentize-py (`SLUICE_COMPONENTIZE_PY`, else on PATH).
    pub componentize_py: PathBuf,
    /// componentize-js (`SLUICE_COMPONENTIZE_JS`, else on PATH).
    pub componentize_js: PathBuf,
}

impl Tools {
    /// From the environment variables, else PATH.
    pub fn from_env() -> Self {
        let program = |var: &str, tool: &str| {
            std::env::var_os(var).map_or_else(|| PathBuf::from(tool), PathBuf::from)
        };
        Self {
            cargo: program("CARGO", "cargo"),
            componentize_py: program("SLUICE_COMPONENTIZE_PY", "componentize-py"),
            componentize_js: program("SLUICE_COMPONENTIZE_JS", "componentize-js"),
        }
    }

    /// Python's and JavaScript's tools from the first of `dirs` that has them (a local
    /// install, such as the one `scripts/setup` makes), else as [`Tools::from_env`].
    pub fn preferring(dirs: &[PathBuf]) -> Self {
        let mut tools = Self::from_env();
        let find = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        if let Some(py) = find("componentize-py") {
            tools.componentize_py = py;
        }
        if let Some(js) = find("componentize-js") {
            tools.componentize_js = js;
        }
        tools
    }
}

/// Run `command`, naming `tool` and how to install it if it is missing.
fn run(mut command: Command, tool: &Path, hint: &str) -> Result<(), ProjectError> {
    // Everything the tool says goes to stderr: stdout carries only the component's path.
    let status = command
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|err| missing(err, tool, hint))?;
    if !status.success() {
        return Err(ProjectError::BuildFailed {
            tool: tool.display().to_string(),
            status,
        });
    }
    Ok(())
}

fn missing(err: std::io::Error, tool: &Path, hint: &str) -> ProjectError {
    if err.kind() == std::io::ErrorKind::NotFound {
        ProjectError::ToolMissing {
            tool: tool.display().to_string(),
            hint: hint.to_owned(),
        }
    } else {
        ProjectError::Io {
            path: tool.to_owned(),
            source: err,
        }
    }
}

/// Build `project` into `target/<name>.wasm` with the tools the environment names.
pub fn build(project: &Project) -> Result<Built, ProjectError> {
    build_with(project, &Tools::from_env())
}

/// Build `project` into `target/<name>.wasm` with `tools`.
pub fn build_with(project: &Project, tools: &Tools) -> Result<Built, ProjectError> {
    let started = Instant::now();
    let target = project.dir.join("target");
    std::fs::create_dir_all(&target).map_err(io(&target))?;
    let output = project.output();
    let partial = target.join(format!(".{}.wasm.partial", project.name()));
    match project.lang {
        Lang::Rust => rust(project, &tools.cargo, &partial)?,
        Lang::Python => python(project, &tools.componentize_py, &partial)?,
        Lang::Js => js(project, &tools.componentize_js, &partial)?,
    }
    std::fs::rename(&partial, &output).map_err(io(&output))?;
    let size = std::fs::metadata(&output).map_err(io(&output))?.len();
    Ok(Built {
        path: output,
        size,
        took: started.elapsed(),
    })
}

/// The build's scratch directory, emptied first.
fn scratch(project: &Project, name: &str) -> Result<PathBuf, ProjectError> {
    let dir = project.dir.join("target/sluice").join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    Ok(dir)
}

fn wit(project: &Project) -> Result<PathBuf, ProjectError> {
    let dir = scratch(project, "wit")?;
    assets::write_all(&dir, assets::WIT)?;
    Ok(dir)
}

fn rust(project: &Project, cargo: &Path, out: &Path) -> Result<(), ProjectError> {
    let manifest = project.dir.join("Cargo.toml");
    let mut child = Command::new(cargo)
        .current_dir(&project.dir)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(&manifest)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| missing(e, cargo, "install Rust with rustup"))?;
    let mut wasm = None;
    if let Some(stdout) = child.stdout.take() {
        let own = manifest.canonicalize().map_err(io(&manifest))?;
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.map_err(io(&manifest))?;
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if msg["reason"] != "compiler-artifact"
                || msg["manifest_path"].as_str().map(Path::new) != Some(own.as_path())
            {
                continue;
            }
            if let Some(file) = msg["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(".wasm"))
            {
                wasm = Some(PathBuf::from(file));
            }
        }
    }
    let status = child.wait().map_err(io(&manifest))?;
    if !status.success() {
        return Err(ProjectError::BuildFailed {
            tool: "cargo".into(),
            status,
        });
    }
    let wasm = wasm.ok_or(ProjectError::NoArtifact { manifest })?;
    std::fs::copy(&wasm, out).map_err(io(&wasm))?;
    Ok(())
}

fn python(project: &Project, tool: &Path, out: &Path) -> Result<(), ProjectError> {
    let wit = wit(project)?;
    let sdk = scratch(project, "python")?;
    assets::write_all(&sdk, assets::PYTHON_SDK)?;
    // The app module registers its handler on import; the SDK's WitWorld is the export.
    let entry = sdk.join("sluice_entry.py");
    std::fs::write(
        &entry,
        "import app  # noqa: F401  (registers the @subscriber handler)\nfrom sluice_guest._world import WitWorld  # noqa: F401\n",
    )
    .map_err(io(&entry))?;
    let mut command = Command::new(tool);
    command
        .current_dir(&project.dir)
        .arg("-d")
        .arg(&wit)
        .args(["-w", "handler-http", "componentize", "sluice_entry", "-p"])
        .arg(&sdk)
        .arg("-p")
        .arg(&project.dir)
        .arg("-o")
        .arg(out);
    run(command, tool, "pip install componentize-py==0.25.1")
}

fn js(project: &Project, tool: &Path, out: &Path) -> Result<(), ProjectError> {
    let wit = wit(project)?;
    let src = scratch(project, "js")?;
    copy_tree(&project.dir.join("src"), &src)?;
    let sdk = src.join("sluice_guest.js");
    std::fs::write(&sdk, assets::JS_SDK).map_err(io(&sdk))?;
    let mut command = Command::new(tool);
    command
        .current_dir(&project.dir)
        .arg(src.join("app.js"))
        .arg("--wit")
        .arg(&wit)
        .args(["--world-name", "handler", "-o"])
        .arg(out);
    run(
        command,
        tool,
        "npm install -g @bytecodealliance/componentize-js (or @bytecodealliance/jco, which brings it)",
    )
}

/// Copy the JavaScript sources (not `node_modules`; a linked directory is not followed, so a
/// link loop cannot make the copy endless).
fn copy_tree(from: &Path, to: &Path) -> Result<(), ProjectError> {
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        let path = entry.path();
        let dest = to.join(entry.file_name());
        let kind = entry.file_type().map_err(io(&path))?;
        if kind.is_symlink() && path.is_dir() {
            continue;
        }
        if kind.is_dir() {
            if entry.file_name() == "node_modules" {
                continue;
            }
            std::fs::create_dir_all(&dest).map_err(io(&dest))?;
            copy_tree(&path, &dest)?;
        } else {
            std::fs::copy(&path, &dest).map_err(io(&path))?;
        }
    }
    Ok(())
}
