//! Stamps the binary with what `sluice --version` reports besides the crate version: the git
//! commit it was built from (when built from a checkout) and the WIT package its guests build
//! against. And packs the Rust guest SDK (`sluice-guest`, its macros and descriptor crates, with
//! manifests that stand alone) for `sluice new` to write into a Rust project, so the project
//! builds wherever it is moved, with the SDK of the `sluice` that made it. And expands the Lua
//! scripts' `-- @include lib/NAME` lines (see [`expand_lua`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    if let Err(err) = pack_sdk() {
        panic!("cannot pack the guest SDK: {err}");
    }
    if let Err(err) = expand_lua() {
        panic!("cannot expand the Lua scripts: {err}");
    }
    let wit = "../guest-sdk/wit/sluice.wit";
    println!("cargo:rerun-if-changed={wit}");
    let package = std::fs::read_to_string(wit)
        .ok()
        .and_then(|text| {
            text.lines().map(str::trim).find_map(|l| {
                l.strip_prefix("package ")?
                    .strip_suffix(';')
                    .map(str::to_owned)
            })
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SLUICE_WIT_PACKAGE={package}");

    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SLUICE_COMMIT={commit}");
    // A new commit or checkout changes HEAD or the branch it names.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // Only files that exist: cargo takes a missing one as changed, and would rebuild the
        // host on every build (a repository may have no packed-refs, or a packed branch).
        let mut watch = vec![format!("{dir}/HEAD"), format!("{dir}/packed-refs")];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(format!("{dir}/{branch}"));
        }
        for file in watch.iter().filter(|f| std::path::Path::new(f).exists()) {
            println!("cargo:rerun-if-changed={file}");
        }
    }
}

/// The SDK's crates: where each is in the checkout and in a project's `sluice-sdk/`.
const SDK_CRATES: &[(&str, &str, &str)] = &[
    ("sluice-guest", "../guest-sdk", "guest"),
    ("sluice-guest-macros", "../guest-sdk/macros", "macros"),
    ("sluice-descriptor", "../guest-sdk/descriptor", "descriptor"),
];

/// Writes `$OUT_DIR/sdk_files.rs`: a `&[(&str, &str)]` of each file a project's `sluice-sdk/`
/// holds (path in it, contents), with each crate's manifest made to stand alone: the
/// workspace's inherited fields and dependencies filled in, the SDK's own crates as paths
/// inside `sluice-sdk/`, no lints, tests or publishing metadata.
fn pack_sdk() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=../Cargo.toml");
    let workspace: toml::Table = std::fs::read_to_string("../Cargo.toml")?.parse()?;
    let shared = &workspace["workspace"]["package"];
    let deps = workspace["workspace"]["dependencies"]
        .as_table()
        .ok_or("no [workspace.dependencies]")?;
    let mut list = String::from("&[\n");
    for (name, dir, vendored) in SDK_CRATES {
        println!("cargo:rerun-if-changed={dir}/Cargo.toml");
        let mut manifest: toml::Table =
            std::fs::read_to_string(format!("{dir}/Cargo.toml"))?.parse()?;
        manifest.remove("lints");
        manifest.remove("dev-dependencies");
        let package = manifest
            .get_mut("package")
            .and_then(|p| p.as_table_mut())
            .ok_or("no [package]")?;
        for key in ["readme", "keywords", "categories", "publish"] {
            package.remove(key);
        }
        for (key, value) in package.iter_mut() {
            if value.get("workspace").and_then(|w| w.as_bool()) == Some(true) {
                *value = shared
                    .get(key)
                    .ok_or_else(|| format!("{name}: no workspace {key}"))?
                    .clone();
            }
        }
        package.insert("publish".into(), false.into());
        if let Some(table) = manifest
            .get_mut("dependencies")
            .and_then(|d| d.as_table_mut())
        {
            for (dep, spec) in table.iter_mut() {
                let own = SDK_CRATES.iter().find(|(n, _, _)| n == dep);
                let mut resolved = if let Some((_, _, to)) = own {
                    let mut t = toml::Table::new();
                    t.insert("path".into(), format!("../{to}").into());
                    t
                } else if spec.get("workspace").and_then(|w| w.as_bool()) == Some(true) {
                    match &deps[dep] {
                        toml::Value::String(version) => {
                            let mut t = toml::Table::new();
                            t.insert("version".into(), version.clone().into());
                            t
                        }
                        toml::Value::Table(t) => t.clone(),
                        other => return Err(format!("{dep}: unexpected {other}").into()),
                    }
                } else {
                    continue;
                };
                if let Some(extra) = spec.as_table() {
                    for (k, v) in extra {
                        if k != "workspace" {
                            resolved.insert(k.clone(), v.clone());
                        }
                    }
                }
                *spec = toml::Value::Table(resolved);
            }
        }
        let text = format!(
            "# The Sluice guest SDK, as `sluice new` wrote it (from the `sluice` that made this\n# project). Replace this directory with a newer SDK's to upgrade.\n{}",
            toml::to_string(&manifest)?
        );
        let manifest_file = out.join(format!("sdk-{vendored}.toml"));
        std::fs::write(&manifest_file, text)?;
        writeln!(
            list,
            "    ({:?}, include_str!({:?})),",
            format!("{vendored}/Cargo.toml"),
            manifest_file.display().to_string()
        )?;
        let root = Path::new(dir).canonicalize()?;
        let mut subdirs = vec!["src"];
        if *vendored == "guest" {
            subdirs.push("wit");
        }
        for sub in subdirs {
            for file in files(&root.join(sub))? {
                println!("cargo:rerun-if-changed={}", file.display());
                let rel = file.strip_prefix(&root)?;
                writeln!(
                    list,
                    "    ({:?}, include_str!({:?})),",
                    format!("{vendored}/{}", rel.display()),
                    file.display().to_string()
                )?;
            }
        }
    }
    list.push_str("]\n");
    std::fs::write(out.join("sdk_files.rs"), list)?;
    Ok(())
}

/// The files under `dir`, sorted.
fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(files(&path)?);
        } else {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// Where the Lua library's helpers are (`-- @include lib/seal` is `src/store/lua/lib/seal.lua`).
const LUA_ROOT: &str = "src/store/lua";

/// Writes every Lua script under `src/` to `$OUT_DIR/lua/<its path under src>`, each
/// `-- @include lib/NAME` line replaced by that helper's text (helpers may include helpers;
/// each is expanded once per script, where it is first named). The host loads the expanded
/// text with `store::lua!`; an include that names no helper, or helpers that include each
/// other in a circle, fail the build with the script's name.
fn expand_lua() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("lua");
    println!("cargo:rerun-if-changed=src");
    let mut scripts = Vec::new();
    lua_files(Path::new("src"), &mut scripts)?;
    for script in scripts {
        let rel = script.strip_prefix("src")?;
        if rel.starts_with("store/lua/lib") {
            continue;
        }
        let mut seen = Vec::new();
        let text = expand(&script, &mut seen, &mut Vec::new())
            .map_err(|e| format!("{}: {e}", script.display()))?;
        let target = out.join(rel);
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Unchanged scripts keep their time, so the crate is not rebuilt for them.
        if std::fs::read_to_string(&target).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(target, text)?;
        }
    }
    Ok(())
}

/// The text of `file` with its includes expanded; `seen` holds the helpers already expanded
/// into this script, `stack` those being expanded now (a helper on it again is a circle).
fn expand(file: &Path, seen: &mut Vec<String>, stack: &mut Vec<String>) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let Some(name) = line.strip_prefix("-- @include ").map(str::trim) else {
            // A misspelled or indented include would be a comment, and the script would fail
            // only when it runs (calling a helper that is not there).
            if line.contains("@include") {
                return Err(format!(
                    "`{}`: an include is written `-- @include lib/NAME` at the start of a line, before the script's code",
                    line.trim()
                ));
            }
            out.push_str(line);
            out.push('\n');
            continue;
        };
        if stack.iter().any(|n| n == name) {
            return Err(format!(
                "`{name}` includes itself through {}",
                stack.join(" -> ")
            ));
        }
        if seen.iter().any(|n| n == name) {
            let _ = writeln!(out, "-- ({name}: expanded above)");
            continue;
        }
        let helper = Path::new(LUA_ROOT).join(format!("{name}.lua"));
        if !name.starts_with("lib/") || name.contains("..") || !helper.is_file() {
            return Err(format!(
                "`-- @include {name}` names no helper (expected {})",
                helper.display()
            ));
        }
        seen.push(name.to_owned());
        stack.push(name.to_owned());
        let body = expand(&helper, seen, stack)?;
        stack.pop();
        let _ = writeln!(out, "-- >>> {name}");
        out.push_str(&body);
        let _ = writeln!(out, "-- <<< {name}");
    }
    Ok(out)
}

/// Every `.lua` file under `dir`, sorted.
fn lua_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            lua_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "lua") {
            out.push(path);
        }
    }
    Ok(())
}
