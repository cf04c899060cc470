//! `sluice`: run WebAssembly handlers on Redis Streams. Parses arguments, sets up logging, and
//! hands the command to the library's [`sluice_host::cli`], which runs it on the async runtime;
//! the error it returns becomes the message and the exit code.

use std::process::ExitCode;

use clap::Parser as _;

/// Every allocation goes through mimalloc: with glibc's (and more so musl's, the static
/// binary's) a delivery freeing on one worker what the read allocated on another waited on the
/// other's arena lock, about a sixth of the workers' context switches in `sluice-bench wasm`
/// (issue 50: with mimalloc 16 % more `wasm` messages a second, 15-30 % less host time per
/// message).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // The host's own compiling child (see `sluice_host::runtime::compile`): not a command for
    // people, so not in the help.
    sluice_host::runtime::compile::serve_compiles();
    sluice_host::support::memory::give_back_big_allocations();
    let cli = sluice_host::cli::Cli::parse();
    let _logs = sluice_host::cli::init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(sluice_host::cli::execute(cli.command));
    // Blocking work still running (a compile cut off by a deadline) must not hold the exit:
    // dropping the runtime would wait for it.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Each cause once, even where a library prints its source in its own message.
            eprintln!("error: {}", sluice_host::support::chain::join(err.chain()));
            ExitCode::FAILURE
        }
    }
}
