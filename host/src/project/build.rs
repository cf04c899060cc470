//! `sluice build`: one project in, one component out (`target/<name>.wasm`), with each
//! language's own toolchain: cargo for Rust, componentize-py for Python (against the
//! `handler-http` world, so it may import `wasi:http`), componentize-js for JavaScript (against
//! `handler`; its `fetch` brings `wasi:http` itself). The toolchain's own messages go straight
//! to the terminal.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::{self, Tool};
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
    /// The component of an earlier build of the same sources was given again.
    pub reused: bool,
    /// The component in place was already this one (it was not written again).
    pub unchanged: bool,
}

/// The toolchain programs a build runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    /// cargo (`CARGO`, else `cargo` on PATH).
    pub cargo: PathBuf,
    /// componentize-py (see [`tools`] for where it is looked for).
    pub componentize_py: PathBuf,
    /// componentize-js (see [`tools`]).
    pub componentize_js: PathBuf,
}

impl Tools {
    /// `CARGO` (else `cargo` on PATH), and the Python and JavaScript tools where
    /// [`tools::find`] finds them.
    pub fn from_env() -> Self {
        Self {
            cargo: std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from),
            componentize_py: tools::find(Tool::ComponentizePy).program(Tool::ComponentizePy),
            componentize_js: tools::find(Tool::ComponentizeJs).program(Tool::ComponentizeJs),
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
///
/// componentize-py and componentize-js seed the interpreter snapshot they take with random
/// numbers (hash seeds), so two runs over the same sources never give the same bytes. Their
/// components are therefore kept by the hash of what the build read ([`Inputs`]): the same
/// sources give the same component again, its digest is the same, and the host's compile
/// cache hits. Rust builds are reproducible by themselves (cargo decides what to rebuild).
/// A component equal to the one in place is not written again.
pub fn build_with(project: &Project, tools: &Tools) -> Result<Built, ProjectError> {
    let started = Instant::now();
    let target = project.dir.join("target");
    std::fs::create_dir_all(&target).map_err(io(&target))?;
    let output = project.output();
    // The config may name a directory of its own (`dist/handler.wasm`): made, not a failure
    // after the whole build.
    if let Some(parent) = output.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let partial = target.join(format!(".{}.wasm.partial", project.name()));
    let inputs = match project.lang {
        Lang::Rust => None,
        Lang::Python => Inputs::of(project, &tools.componentize_py),
        Lang::Js => Inputs::of(project, &tools.componentize_js),
    };
    let kept = inputs.as_ref().and_then(Inputs::kept);
    let reused = kept.is_some();
    match (&kept, project.lang) {
        (Some(kept), _) => {
            std::fs::copy(kept, &partial).map_err(io(kept))?;
        }
        (None, Lang::Rust) => rust(project, &tools.cargo, &partial)?,
        (None, Lang::Python) => python(project, &tools.componentize_py, &partial)?,
        (None, Lang::Js) => js(project, &tools.componentize_js, &partial)?,
    }
    if let Some(inputs) = inputs.as_ref().filter(|_| !reused) {
        inputs.keep(&partial);
    }
    let unchanged = same_file_contents(&partial, &output);
    if unchanged {
        std::fs::remove_file(&partial).map_err(io(&partial))?;
    } else {
        std::fs::rename(&partial, &output).map_err(io(&output))?;
    }
    let size = std::fs::metadata(&output).map_err(io(&output))?.len();
    Ok(Built {
        path: output,
        size,
        took: started.elapsed(),
        reused,
        unchanged,
    })
}

fn same_file_contents(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) if ma.len() == mb.len() => {
            matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
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
    run(command, tool, tools::INSTALL_HINT)
}

fn js(project: &Project, tool: &Path, out: &Path) -> Result<(), ProjectError> {
    check_js_syntax(project)?;
    let wit = wit(project)?;
    // The copy is `src/` under the scratch directory, and componentize-js runs there: it names
    // the sources relative to where it runs, so a stack says `src/app.js:12:5`, the user's
    // own path.
    let scratch = scratch(project, "js")?;
    let src = scratch.join("src");
    std::fs::create_dir_all(&src).map_err(io(&src))?;
    copy_tree(&project.dir.join("src"), &src)?;
    let sdk = src.join("sluice_guest.js");
    std::fs::write(&sdk, assets::JS_SDK).map_err(io(&sdk))?;
    let mut command = Command::new(tool);
    command
        .current_dir(&scratch)
        .arg("src/app.js")
        .arg("--wit")
        .arg(&wit)
        .args(["--world-name", "handler", "-o"])
        .arg(out);
    run(command, tool, tools::INSTALL_HINT)
}

/// Check each JavaScript source's syntax with Node (which componentize-js runs on) before
/// componentize-js, whose parser says only how many errors it found: the first error, with
/// its file, line, column and message, as cargo shows one. Without a Node that can check an
/// ES module, nothing is checked here.
fn check_js_syntax(project: &Project) -> Result<(), ProjectError> {
    let mut files = Vec::new();
    js_sources(&project.dir.join("src"), 0, &mut files);
    files.sort();
    for file in files {
        let Ok(output) = Command::new("node")
            .arg("--experimental-default-type=module")
            .arg("--check")
            .arg(&file)
            .stdin(Stdio::null())
            .output()
        else {
            return Ok(());
        };
        if output.status.success() {
            continue;
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        if let Some(error) = parse_node_syntax_error(&stderr, &file, &project.dir) {
            return Err(error);
        }
        // Not a syntax error it could report (an old Node without the flag): leave it to
        // componentize-js.
        return Ok(());
    }
    Ok(())
}

fn js_sources(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > crate::project::MAX_WATCH_DEPTH || out.len() > 1000 {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && entry.file_name() != "node_modules" {
            js_sources(&path, depth + 1, out);
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "js" || e == "mjs") {
            out.push(path);
        }
    }
}

/// Node's report of a syntax error (`<file>:<line>`, the line, a caret under the column, a
/// blank line, `SyntaxError: <message>`) as a [`ProjectError::JsSyntax`].
fn parse_node_syntax_error(stderr: &str, file: &Path, root: &Path) -> Option<ProjectError> {
    let lines: Vec<&str> = stderr.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(&*file.to_string_lossy()))?;
    let line_no: u32 = lines[at].rsplit(':').next()?.trim().parse().ok()?;
    let source = lines.get(at + 1).copied().unwrap_or_default();
    let column = lines
        .get(at + 2)
        .and_then(|caret| caret.find('^'))
        .map_or(1, |c| c + 1);
    let message = lines
        .iter()
        .find(|l| l.starts_with("SyntaxError:"))?
        .trim_start_matches("SyntaxError:")
        .trim()
        .to_owned();
    // The project's own text, shown on a terminal: no control characters from it.
    let shown = |text: &str, max: usize| -> String {
        text.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(max)
            .collect()
    };
    let file = file.strip_prefix(root).unwrap_or(file);
    Some(ProjectError::JsSyntax {
        file: PathBuf::from(shown(&file.to_string_lossy(), 300)),
        line: line_no,
        column: column as u32,
        message: shown(&message, 500),
        text: shown(source, 200),
    })
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

/// What a build read: a hash over every file of the project (all but `target/`, `.sluice/`,
/// `.git/`, `__pycache__/` and `node_modules/`, which no build reads: componentize-js gets a
/// copy of `src/` without `node_modules`), the toolchain program, this `sluice`'s version and
/// the SDKs and WIT it writes into every build. A Python build under an active virtual
/// environment (`VIRTUAL_ENV`, whose packages componentize-py also reads) is not kept.
#[derive(Debug, Clone)]
pub struct Inputs {
    project: Project,
    hash: String,
}

/// Past this many files or bytes the inputs are not hashed (the build always runs).
const MAX_INPUT_FILES: usize = 10_000;
const MAX_INPUT_BYTES: u64 = 256 << 20;
/// How many earlier components a project keeps (`.sluice/builds/`).
const KEPT_BUILDS: usize = 8;

impl Inputs {
    /// The project's inputs now, for a build with `tool`; `None` when there are too many to
    /// hash.
    pub fn of(project: &Project, tool: &Path) -> Option<Self> {
        use sha2::Digest as _;
        if project.lang == Lang::Python && std::env::var_os("VIRTUAL_ENV").is_some() {
            return None;
        }
        let mut files = Vec::new();
        collect_inputs(&project.dir, 0, &mut files)?;
        files.sort();
        let mut hasher = sha2::Sha256::new();
        hasher.update(crate::LONG_VERSION.as_bytes());
        // What this binary writes into the build (a binary built from uncommitted changes has
        // the version of its last commit).
        for (name, text) in assets::WIT.iter().chain(assets::PYTHON_SDK) {
            hasher.update(name.as_bytes());
            hasher.update(text.as_bytes());
        }
        hasher.update(assets::JS_SDK.as_bytes());
        hasher.update(project.lang.to_string().as_bytes());
        // The toolchain: which program, and which build of it.
        hasher.update(tool.as_os_str().as_encoded_bytes());
        if let Ok(meta) = std::fs::metadata(tool) {
            hasher.update(meta.len().to_le_bytes());
            if let Ok(modified) = meta.modified() {
                hasher.update(format!("{modified:?}").as_bytes());
            }
        }
        let mut bytes = 0u64;
        for file in files {
            // A link may name a device or a huge file: only regular files, read within the
            // bound.
            let meta = std::fs::metadata(&file).ok()?;
            bytes += meta.len();
            if !meta.is_file() || bytes > MAX_INPUT_BYTES {
                return None;
            }
            let mut text = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(std::fs::File::open(&file).ok()?, meta.len()),
                &mut text,
            )
            .ok()?;
            let rel = file.strip_prefix(&project.dir).ok()?;
            hasher.update(rel.as_os_str().as_encoded_bytes());
            hasher.update([0]);
            hasher.update((text.len() as u64).to_le_bytes());
            hasher.update(&text);
        }
        Some(Self {
            project: project.clone(),
            hash: hex::encode(hasher.finalize()),
        })
    }

    fn dir(&self) -> PathBuf {
        self.project.dir.join(".sluice/builds")
    }

    fn path(&self) -> PathBuf {
        self.dir().join(format!("{}.wasm", self.hash))
    }

    /// The component an earlier build of these inputs made, if it is kept (marked used).
    pub fn kept(&self) -> Option<PathBuf> {
        let path = self.path();
        let file = std::fs::File::options().write(true).open(&path).ok()?;
        let _ = file.set_modified(crate::support::clock::file_now());
        Some(path)
    }

    /// Keep `component` as what these inputs build, and at most [`KEPT_BUILDS`] in all.
    pub fn keep(&self, component: &Path) {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.dir();
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir);
        let tmp = dir.join(format!(".{}.partial", self.hash));
        if std::fs::copy(component, &tmp).is_err() || std::fs::rename(&tmp, self.path()).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        crate::runtime::compile::evict_files(&dir, "wasm", KEPT_BUILDS, u64::MAX, None);
    }
}

/// The files under `dir` a build may read; `None` past [`MAX_INPUT_FILES`] or too deep.
fn collect_inputs(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Option<()> {
    if depth > 16 {
        return None;
    }
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let path = entry.path();
        let kind = entry.file_type().ok()?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if kind.is_dir() {
            // Only what no build reads: a package may be named `env` or `venv`, and a
            // directory anywhere (but these) may hold a module.
            let top = depth == 0;
            let skip = matches!(name.as_ref(), ".git" | "__pycache__" | "node_modules")
                || (top && matches!(name.as_ref(), "target" | ".sluice"));
            if !skip {
                collect_inputs(&path, depth + 1, out)?;
            }
        } else if kind.is_file() || kind.is_symlink() {
            out.push(path);
            if out.len() > MAX_INPUT_FILES {
                return None;
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The component goes where sluice.toml says, in a directory made for it if need be.
    #[test]
    fn the_configured_component_directory_is_made() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/app.js"), "export const x = 1;\n").unwrap();
        std::fs::write(
            root.join("sluice.toml"),
            "[[subscription]]\ncomponent = \"dist/handler.wasm\"\n",
        )
        .unwrap();
        // A stand-in for componentize-js: writes its `-o` file.
        let tool = root.join("fake-componentize-js");
        std::fs::write(
            &tool,
            "#!/bin/sh\nwhile [ $# -gt 1 ]; do [ \"$1\" = -o ] && printf built > \"$2\"; shift; done\n",
        )
        .unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let project = Project::detect(&root).unwrap();
        let tools = Tools {
            cargo: "cargo".into(),
            componentize_py: "componentize-py".into(),
            componentize_js: tool,
        };
        let built = build_with(&project, &tools).unwrap();
        assert_eq!(built.path, root.join("dist/handler.wasm"));
        assert_eq!(std::fs::read(&built.path).unwrap(), b"built");
    }

    /// Every file a build may read is an input, whatever its directory is called (a package
    /// named `env`); what no build reads (`target/`, `.sluice/`, `__pycache__/`) is not.
    #[test]
    fn inputs_cover_what_a_build_reads() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("src/env")).unwrap();
        std::fs::create_dir_all(root.join("src/__pycache__")).unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        std::fs::create_dir_all(root.join(".sluice")).unwrap();
        std::fs::write(root.join("src/app.js"), "import { V } from './env/v.js';\n").unwrap();
        std::fs::write(root.join("src/env/v.js"), "export const V = 'A';\n").unwrap();
        let project = Project::detect(&root).unwrap();
        let tool = Path::new("componentize-js");
        let hash = || Inputs::of(&project, tool).unwrap().hash;
        let first = hash();
        std::fs::write(root.join("target/x.wasm"), "built").unwrap();
        std::fs::write(root.join(".sluice/last"), "state").unwrap();
        std::fs::write(root.join("src/__pycache__/x.pyc"), "cache").unwrap();
        assert_eq!(hash(), first, "outputs and caches are not inputs");
        std::fs::write(root.join("src/env/v.js"), "export const V = 'B';\n").unwrap();
        assert_ne!(hash(), first, "a module in a directory named env is");
        // A link to a device is not read: the build is not kept, rather than hang.
        std::os::unix::fs::symlink("/dev/zero", root.join("src/zero.js")).unwrap();
        assert!(Inputs::of(&project, tool).is_none());
    }
}
