//! The child side of a compile: `sluice __compile` ([`child_main`]) reads a component on
//! stdin and writes its artifact on stdout under CPU and address-space limits;
//! [`serve_compiles`] makes a binary able to be that child, and [`child_args`] is what the
//! parent passes it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::runtime::{RuntimeOptions, engine_config};

use super::functions::FunctionStore;
use super::{COMPILE_ADDRESS_SPACE, COMPILE_CPU};

/// Set by [`serve_compiles`]: this executable compiles.
static THIS_EXECUTABLE_COMPILES: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// For every binary that hosts components (`sluice` itself, a benchmark): call first in
/// `main`. In a compiling child (`<exe> __compile ...`) it compiles and exits the process;
/// otherwise it makes this executable the one whose children compile.
pub fn serve_compiles() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__compile") {
        let code = child_main(&args[2..]);
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 2 });
    }
    let _ = THIS_EXECUTABLE_COMPILES.set(());
}

/// The binary that compiles: this one when it serves compiles (see [`serve_compiles`]),
/// else a `sluice` next to it or one directory up (test binaries are built beside it), or
/// what `SLUICE_COMPILER` names.
pub(super) fn locate() -> Result<PathBuf, String> {
    if let Some(named) = std::env::var_os("SLUICE_COMPILER") {
        return Ok(PathBuf::from(named));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    if THIS_EXECUTABLE_COMPILES.get().is_some() {
        // The running image, even after the file on disk was replaced by an upgrade (whose
        // artifacts this engine could not load).
        let running = PathBuf::from("/proc/self/exe");
        return Ok(if running.exists() { running } else { exe });
    }
    let dir = exe.parent().unwrap_or(Path::new("."));
    let tried = [dir.join("sluice"), dir.join("../sluice")];
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "no `sluice` binary to compile with (tried {} and {}; set SLUICE_COMPILER)",
            tried[0].display(),
            tried[1].display()
        )
    })
}

/// `sluice __compile [--fuel] [--no-epoch]`: read a component on stdin, write the compiled
/// artifact on stdout, under the CPU and address-space limits (set first, before any input is
/// read). Exit 0 with the artifact, 2 with the reason on stderr.
pub fn child_main(args: &[String]) -> ExitCode {
    let run = || -> Result<(), ExitCode> {
        die_with_parent()?;
        limit()?;
        let options = RuntimeOptions {
            pool: None,
            fuel: args.iter().any(|a| a == "--fuel"),
            no_epoch: args.iter().any(|a| a == "--no-epoch"),
            quick_compile: args.iter().any(|a| a == "--quick-compile"),
            ..Default::default()
        };
        let mut bytes = Vec::new();
        if let Err(err) = std::io::stdin().read_to_end(&mut bytes) {
            return Err(failed(format!("cannot read the component: {err}")));
        }
        let mut config = engine_config(&options);
        incremental(args, &mut bytes, &mut config)?;
        let artifact = wasmtime::Engine::new(&config)
            .and_then(|engine| engine.precompile_component(&bytes))
            .map_err(|err| failed(format!("{err:#}")))?;
        std::io::stdout()
            .write_all(&artifact)
            .map_err(|err| failed(format!("cannot write the artifact: {err}")))
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// Say `why` on stderr: the parent reads it as the reason the compile failed.
fn failed(why: String) -> ExitCode {
    eprintln!("{why}");
    ExitCode::from(2)
}

/// Die with the host, however the host ends (a SIGKILL included): no orphan compile.
fn die_with_parent() -> Result<(), ExitCode> {
    let parent = nix::unistd::getppid();
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err()
        || nix::unistd::getppid() != parent
    {
        return Err(ExitCode::from(2));
    }
    Ok(())
}

/// The CPU-time and address-space limits, and no core dump of a compile killed at them (it
/// could be gigabytes).
fn limit() -> Result<(), ExitCode> {
    use nix::sys::resource::{Resource, setrlimit};
    let cpu = COMPILE_CPU.as_secs();
    setrlimit(Resource::RLIMIT_CORE, 0, 0)
        .and_then(|()| setrlimit(Resource::RLIMIT_CPU, cpu, cpu.saturating_add(1)))
        .and_then(|()| {
            setrlimit(
                Resource::RLIMIT_AS,
                COMPILE_ADDRESS_SPACE,
                COMPILE_ADDRESS_SPACE,
            )
        })
        .map_err(|err| failed(format!("cannot limit the compiler: {err}")))
}

/// With `--functions <dir>`: take the key off the front of `bytes` and keep compiled
/// functions in `dir` (see [`FunctionStore`]).
fn incremental(
    args: &[String],
    bytes: &mut Vec<u8>,
    config: &mut wasmtime::Config,
) -> Result<(), ExitCode> {
    let Some(at) = args.iter().position(|a| a == "--functions") else {
        return Ok(());
    };
    let (Some(dir), true) = (args.get(at + 1), bytes.len() >= 32) else {
        return Err(failed(
            "--functions needs a directory and the key first on stdin".to_owned(),
        ));
    };
    let rest = bytes.split_off(32);
    let mut key = [0u8; 32];
    key.copy_from_slice(bytes);
    *bytes = rest;
    let store = FunctionStore {
        dir: PathBuf::from(dir),
        key,
    };
    config
        .enable_incremental_compilation(Arc::new(store))
        .map(|_| ())
        .map_err(|err| failed(format!("{err:#}")))
}

/// The arguments a child needs to build an engine like `options` describes.
pub fn child_args(options: &RuntimeOptions) -> Vec<String> {
    let mut args = Vec::new();
    if options.fuel {
        args.push("--fuel".to_owned());
    }
    if options.no_epoch {
        args.push("--no-epoch".to_owned());
    }
    if options.quick_compile {
        args.push("--quick-compile".to_owned());
    }
    args
}
