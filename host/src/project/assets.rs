//! What a non-Rust build needs from this binary: the WIT package (with the WASI interfaces it
//! names) and the Python and JavaScript SDKs, compiled in so that a project always builds
//! against the contract of the `sluice` that runs it.

use std::path::Path;

use super::{ProjectError, io};

/// The WIT directory: `sluice.wit` and `deps/*.wit`.
pub const WIT: &[(&str, &str)] = &[
    (
        "sluice.wit",
        include_str!("../../../guest-sdk/wit/sluice.wit"),
    ),
    (
        "deps/cli.wit",
        include_str!("../../../guest-sdk/wit/deps/cli.wit"),
    ),
    (
        "deps/clocks.wit",
        include_str!("../../../guest-sdk/wit/deps/clocks.wit"),
    ),
    (
        "deps/filesystem.wit",
        include_str!("../../../guest-sdk/wit/deps/filesystem.wit"),
    ),
    (
        "deps/http.wit",
        include_str!("../../../guest-sdk/wit/deps/http.wit"),
    ),
    (
        "deps/io.wit",
        include_str!("../../../guest-sdk/wit/deps/io.wit"),
    ),
    (
        "deps/random.wit",
        include_str!("../../../guest-sdk/wit/deps/random.wit"),
    ),
    (
        "deps/sockets.wit",
        include_str!("../../../guest-sdk/wit/deps/sockets.wit"),
    ),
];

/// The Python package `sluice_guest`.
pub const PYTHON_SDK: &[(&str, &str)] = &[
    (
        "sluice_guest/__init__.py",
        include_str!("../../../guest-sdk/python/sluice_guest/__init__.py"),
    ),
    (
        "sluice_guest/config.py",
        include_str!("../../../guest-sdk/python/sluice_guest/config.py"),
    ),
    (
        "sluice_guest/http.py",
        include_str!("../../../guest-sdk/python/sluice_guest/http.py"),
    ),
    (
        "sluice_guest/trace.py",
        include_str!("../../../guest-sdk/python/sluice_guest/trace.py"),
    ),
    (
        "sluice_guest/_log.py",
        include_str!("../../../guest-sdk/python/sluice_guest/_log.py"),
    ),
    (
        "sluice_guest/_world.py",
        include_str!("../../../guest-sdk/python/sluice_guest/_world.py"),
    ),
];

/// The Rust SDK's crates (`guest/`, `macros/`, `descriptor/`), with manifests that stand
/// alone; `sluice new` writes them into a Rust project's `sluice-sdk/` (see `build.rs`).
pub const RUST_SDK: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/sdk_files.rs"));

/// The JavaScript module `sluice_guest.js`.
pub const JS_SDK: &str = include_str!("../../../guest-sdk/js/sluice_guest.js");

/// Write `files` under `dir`, replacing what an earlier build wrote.
pub fn write_all(dir: &Path, files: &[(&str, &str)]) -> Result<(), ProjectError> {
    for (name, text) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    Ok(())
}
