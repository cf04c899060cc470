//! The parent side of a compile ([`Compiler`]): one child process at a time, fed the component
//! on stdin, killed at the wall-clock deadline ([`COMPILE_WALL`]) or when the caller gives up,
//! and its death (a CPU or memory limit, a signal) told as a reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::runtime::RuntimeError;

use super::cache::{ArtifactCache, evict_files};
use super::child::locate;
use super::functions::FUNCTIONS_MAX_SIZE;
use super::shape::check_shape;
use super::{COMPILE_CPU, COMPILE_WALL};

/// Runs compiles in child processes, one at a time.
#[derive(Clone)]
pub struct Compiler {
    exe: Result<PathBuf, String>,
    args: Vec<String>,
    turn: Arc<tokio::sync::Semaphore>,
    /// Where compiled functions are kept between compiles, and the key that signs them.
    functions: Option<(PathBuf, Arc<[u8; 32]>)>,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("exe", &self.exe)
            .finish_non_exhaustive()
    }
}

impl Compiler {
    /// A compiler whose children build their engine with `args` (see
    /// [`child_main`](super::child::child_main)).
    pub fn new(args: Vec<String>) -> Self {
        Self {
            exe: locate(),
            args,
            turn: Arc::new(tokio::sync::Semaphore::new(1)),
            functions: None,
        }
    }

    /// Keep compiled functions in `cache`'s `functions/` directory, so a component that
    /// shares most of its code with one compiled before compiles in a fraction of the time
    /// (`sluice dev`). Without it (a directory that cannot be made), compiles are whole.
    pub fn with_functions(mut self, cache: &ArtifactCache) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        let dir = cache.dir.join("functions");
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir);
        if made.is_ok() {
            self.functions = Some((dir, cache.key.clone()));
        }
        self
    }

    /// Compile `bytes` (named `path` in errors) into an artifact for an engine built like
    /// this one's children.
    pub async fn compile(&self, path: &Path, bytes: &[u8]) -> Result<Vec<u8>, RuntimeError> {
        let refused = |why: String| RuntimeError::CompileRefused {
            path: path.to_owned(),
            why,
        };
        check_shape(bytes).map_err(|e| refused(e.to_string()))?;
        let exe = self.exe.clone().map_err(&refused)?;
        let _turn = self
            .turn
            .acquire()
            .await
            .map_err(|_| refused("the compiler is shutting down".to_owned()))?;
        let (mut command, input) = self.command(&exe, bytes);
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Dropped (a stop, a deadline, a request given up): the compile dies with it.
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| refused(format!("cannot start the compiler {}: {e}", exe.display())))?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| refused("no stdin".to_owned()))?;
        let feed = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(&input).await;
        });
        let output = tokio::time::timeout(COMPILE_WALL, child.wait_with_output()).await;
        feed.abort();
        if let Some((dir, _)) = &self.functions {
            evict_files(dir, "fn", usize::MAX, FUNCTIONS_MAX_SIZE, None);
        }
        let output = match output {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(refused(format!("the compiler failed: {e}"))),
            Err(_) => {
                return Err(RuntimeError::CompileInterrupted {
                    path: path.to_owned(),
                    why: format!("compiling took longer than {COMPILE_WALL:?}"),
                });
            }
        };
        if output.status.success() {
            return Ok(output.stdout);
        }
        Err(refused(failure(&output)))
    }

    /// The child's command line and what goes on its stdin: the functions' key first (never
    /// on a command line, which others can read), then `bytes`.
    fn command(&self, exe: &Path, bytes: &[u8]) -> (tokio::process::Command, Vec<u8>) {
        let mut command = tokio::process::Command::new(exe);
        command.arg("__compile").args(&self.args);
        let mut input = Vec::with_capacity(bytes.len() + 32);
        if let Some((dir, key)) = &self.functions {
            command.arg("--functions").arg(dir);
            input.extend_from_slice(key.as_slice());
        }
        input.extend_from_slice(bytes);
        (command, input)
    }
}

/// Why a child that did not succeed failed: its limits, a signal, or what it said.
fn failure(output: &std::process::Output) -> String {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (said, _) = crate::entry::outcome::bounded_text(stderr.trim(), 2048);
    match output.status.signal() {
        Some(9) | Some(24) => format!(
            "compiling used more than its CPU time ({COMPILE_CPU:?}) or was killed{}",
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        ),
        Some(signal) => format!("the compiler died with signal {signal}: {said}"),
        None if said.is_empty() => format!("the compiler exited with {}", output.status),
        None => said,
    }
}
