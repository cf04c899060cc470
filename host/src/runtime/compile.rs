//! Compiling a component the host cannot trust: a tenant wrote it, and compile time grows with
//! its shape (300 nested loops × 300 locals, 4.7 KB, took 33 s and 159 MB; 8 KB took 128 s).
//!
//! - A structural check first ([`check_shape`]): function size, locals, and how deep loops
//!   nest, read with wasmparser in one linear pass, so the known blow-ups are refused in
//!   milliseconds with a message naming the function.
//! - Then the compile runs in a child process (`sluice __compile`, [`child_main`]) under a
//!   CPU-time and an address-space limit, with a wall-clock deadline; the child is killed when
//!   the deadline passes or the caller gives up (a stop, a request deadline), and one compile
//!   runs at a time on every path (start-up, uploads, the file watcher).
//! - Compiled code is native code the host will run: a cached artifact is loaded only when its
//!   keyed hash (HMAC-SHA256 with a key private to this host, stored beside the cache) matches,
//!   the cache directory must not be writable by others (it is created 0700), and only
//!   components that passed every check are cached.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::RuntimeError;
use crate::support::digest::Digest;
use crate::support::private_file::write_private;

/// CPU time one compile may use (every compiler thread counted).
pub const COMPILE_CPU: Duration = Duration::from_secs(120);
/// Wall-clock time one compile may take, waiting for its turn not included.
pub const COMPILE_WALL: Duration = Duration::from_secs(180);
/// Address space the compiling process may map.
pub const COMPILE_ADDRESS_SPACE: u64 = 8 << 30;
/// The largest function body a component may hold, in bytes.
pub const MAX_FUNCTION_BYTES: usize = 4 << 20;
/// The most locals one function may declare.
pub const MAX_LOCALS: u64 = 50_000;
/// How deep loops may nest in one function. Compile time grows with loop depth times the
/// locals live across it; real code nests a few loops (a CPython or SpiderMonkey component
/// stays under 20).
pub const MAX_LOOP_DEPTH: u32 = 64;
/// The most a function's loop depth times its locals may be (the bomb above: 300 × 300).
/// Measured on real components: CPython 6 × 271, SpiderMonkey 6 × 118, a Rust handler 3 × 35.
pub const MAX_LOOP_LOCALS: u64 = 16_384;

/// The shape of a component's code, measured by [`check_shape`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Core functions.
    pub functions: u64,
    /// The largest body, in bytes.
    pub largest_body: usize,
    /// The most locals of one function.
    pub most_locals: u64,
    /// The deepest loop nesting of one function.
    pub deepest_loops: u32,
}

/// Why a component's shape was refused.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// The bytes do not parse.
    #[error("it is not a valid WebAssembly component: {0}")]
    Parse(#[from] wasmparser::BinaryReaderError),
    /// A bound was passed.
    #[error("function {function} of a core module {what}")]
    Bound {
        /// The function's index in its code section.
        function: u64,
        /// Which bound, and by how much.
        what: String,
    },
}

/// Measure `bytes` and refuse them when a function passes a bound, without compiling.
pub fn check_shape(bytes: &[u8]) -> Result<Shape, ShapeError> {
    use wasmparser::{Operator, Parser, Payload};
    let mut shape = Shape::default();
    let mut index = 0u64;
    // Of the core module being read: each type's parameter count (0 for types that are not
    // functions), and each defined function's type. Parameters are locals too.
    let mut type_params: Vec<u64> = Vec::new();
    let mut function_types: Vec<u32> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        let body = match payload? {
            Payload::Version {
                encoding: wasmparser::Encoding::Module,
                ..
            } => {
                type_params.clear();
                function_types.clear();
                continue;
            }
            Payload::TypeSection(types) => {
                for group in types {
                    for ty in group?.into_types() {
                        type_params.push(match &ty.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => f.params().len() as u64,
                            _ => 0,
                        });
                    }
                }
                continue;
            }
            Payload::FunctionSection(functions) => {
                for ty in functions {
                    function_types.push(ty?);
                }
                continue;
            }
            Payload::CodeSectionStart { .. } => {
                index = 0;
                continue;
            }
            Payload::CodeSectionEntry(body) => body,
            _ => continue,
        };
        let function = index;
        index += 1;
        let params = usize::try_from(function)
            .ok()
            .and_then(|i| function_types.get(i))
            .and_then(|&ty| type_params.get(ty as usize))
            .copied()
            .unwrap_or(0);
        shape.functions += 1;
        let size = body.range().len();
        shape.largest_body = shape.largest_body.max(size);
        if size > MAX_FUNCTION_BYTES {
            return Err(ShapeError::Bound {
                function,
                what: format!("is {size} bytes long (at most {MAX_FUNCTION_BYTES})"),
            });
        }
        let mut locals = params;
        for group in body.get_locals_reader()? {
            locals = locals.saturating_add(u64::from(group?.0));
        }
        shape.most_locals = shape.most_locals.max(locals);
        if locals > MAX_LOCALS {
            return Err(ShapeError::Bound {
                function,
                what: format!("has {locals} locals, parameters included (at most {MAX_LOCALS})"),
            });
        }
        let mut deepest = 0u32;
        // Each open block remembers whether it is a loop.
        let mut open: Vec<bool> = Vec::new();
        let mut loops = 0u32;
        let mut ops = body.get_operators_reader()?;
        while !ops.eof() {
            match ops.read()? {
                Operator::Loop { .. } => {
                    open.push(true);
                    loops += 1;
                    deepest = deepest.max(loops);
                    shape.deepest_loops = shape.deepest_loops.max(loops);
                    if loops > MAX_LOOP_DEPTH {
                        return Err(ShapeError::Bound {
                            function,
                            what: format!("nests loops more than {MAX_LOOP_DEPTH} deep"),
                        });
                    }
                }
                Operator::Block { .. } | Operator::If { .. } | Operator::TryTable { .. } => {
                    open.push(false);
                }
                Operator::End if open.pop() == Some(true) => loops -= 1,
                _ => {}
            }
        }
        if u64::from(deepest) * locals > MAX_LOOP_LOCALS {
            return Err(ShapeError::Bound {
                function,
                what: format!(
                    "nests loops {deepest} deep over {locals} locals (their product at most {MAX_LOOP_LOCALS}: compile time grows with its square)"
                ),
            });
        }
    }
    Ok(shape)
}

/// Where compiled components wait for the next start, each vouched for by a keyed hash.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    key: Arc<[u8; 32]>,
    /// Names the engine's settings and this build: an artifact of another is never tried.
    engine_tag: String,
    /// The most its artifacts may take, in bytes.
    max_size: u64,
}

/// The most compiled components a cache keeps.
pub const MAX_CACHED: usize = 32;

pub use crate::config::DEFAULT_CACHE_MAX_SIZE;

/// The file in a cache directory that holds its key.
const KEY_FILE: &str = "cache-key";

impl ArtifactCache {
    /// The cache in `dir`, created 0700 if missing; refused when others may write it (or read
    /// its key). `engine_tag` names the engine settings its artifacts are for.
    pub fn open(dir: &Path, engine_tag: String) -> Result<Self, RuntimeError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
        let unusable = |source| RuntimeError::CacheDir {
            path: dir.to_owned(),
            source,
        };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(unusable)?;
        }
        let dir = dir.canonicalize().map_err(unusable)?;
        let meta = std::fs::metadata(&dir).map_err(unusable)?;
        let uid = nix::unistd::geteuid().as_raw();
        if meta.mode() & 0o022 != 0 || meta.uid() != uid {
            return Err(RuntimeError::CacheDirOpen {
                path: dir,
                mode: meta.mode() & 0o777,
            });
        }
        let key_path = dir.join(KEY_FILE);
        let key = match std::fs::read(&key_path) {
            Ok(bytes) => {
                let meta = std::fs::metadata(&key_path).map_err(unusable)?;
                if meta.permissions().mode() & 0o077 != 0 || meta.uid() != uid {
                    return Err(RuntimeError::CacheDirOpen {
                        path: key_path,
                        mode: meta.permissions().mode() & 0o777,
                    });
                }
                <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                    unusable(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{} is not a 32-byte key; delete it to make a new one",
                            key_path.display()
                        ),
                    ))
                })?
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(|e| {
                    unusable(std::io::Error::other(format!(
                        "no randomness for the cache key: {e}"
                    )))
                })?;
                // create_new: two hosts starting at once must not overwrite each other's key.
                let written = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&key_path)
                    .and_then(|mut f| f.write_all(&key));
                match written {
                    Ok(()) => key,
                    Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                        return Self::open(&dir, engine_tag);
                    }
                    Err(err) => return Err(unusable(err)),
                }
            }
            Err(err) => return Err(unusable(err)),
        };
        Ok(Self {
            dir,
            key: Arc::new(key),
            engine_tag,
            max_size: DEFAULT_CACHE_MAX_SIZE,
        })
    }

    /// Hold at most `bytes` of artifacts (at least the one just written).
    pub fn with_max_size(mut self, bytes: u64) -> Self {
        self.max_size = bytes;
        self
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_tag))
    }

    /// The keyed hash of `artifact` (HMAC takes a key of any length; `None` never happens).
    fn keyed(&self, artifact: &[u8]) -> Option<Hmac<Sha256>> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.key.as_slice()).ok()?;
        mac.update(artifact);
        Some(mac)
    }

    /// The artifact cached for `digest`, if there is one and its keyed hash matches. A
    /// mismatch (a changed or foreign file) is logged and the file removed.
    pub fn get(&self, digest: &Digest) -> Option<Vec<u8>> {
        let path = self.path(digest);
        let stored = std::fs::read(&path).ok()?;
        let (artifact, tag) = stored.split_at(stored.len().checked_sub(32)?);
        if self.keyed(artifact)?.verify_slice(tag).is_err() {
            tracing::warn!(
                path = %path.display(),
                "a cached compiled component does not carry this host's keyed hash (changed or written by someone else); removed, compiling again"
            );
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // Used now: eviction and `sluice cache prune` go by the last use.
        let _ = std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(crate::support::clock::file_now()));
        Some(artifact.to_vec())
    }

    /// Keep `artifact` for `digest`, with its keyed hash appended (written whole or not at all).
    pub fn put(&self, digest: &Digest, artifact: &[u8]) {
        let path = self.path(digest);
        let Some(mac) = self.keyed(artifact) else {
            return;
        };
        let tag = mac.finalize().into_bytes();
        if let Err(err) = write_private(&path, &[artifact, &tag], true) {
            tracing::warn!(path = %path.display(), %err, "cannot cache the compiled component; the next start compiles it again");
        }
        self.evict();
    }

    /// Keep at most [`MAX_CACHED`] artifacts and [`Self::with_max_size`] bytes, the most
    /// recently used: uploads and rebuilds would otherwise fill the disk.
    fn evict(&self) {
        evict(&self.dir, MAX_CACHED, self.max_size, None);
    }
}

/// Remove the least recently used artifacts in `dir` until at most `count` and `bytes` are
/// left, and every one not used since `unused_since`; returns how many and how many bytes
/// went. The most recently used one stays whatever its size (it was just written).
pub fn evict(
    dir: &Path,
    count: usize,
    bytes: u64,
    unused_since: Option<std::time::SystemTime>,
) -> (usize, u64) {
    evict_files(dir, "cwasm", count, bytes, unused_since)
}

/// [`evict`] for the files of `dir` with extension `ext`.
pub fn evict_files(
    dir: &Path,
    ext: &str,
    count: usize,
    bytes: u64,
    unused_since: Option<std::time::SystemTime>,
) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let mut artifacts: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == ext))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    // Newest first: keep from the front.
    artifacts.sort_by_key(|a| std::cmp::Reverse(a.0));
    let (mut kept_count, mut kept_bytes) = (0usize, 0u64);
    let (mut removed, mut freed) = (0usize, 0u64);
    for (used, size, path) in artifacts {
        let stale = unused_since.is_some_and(|since| used < since);
        let fits = kept_count < count && (kept_count == 0 || kept_bytes + size <= bytes);
        if fits && !stale {
            kept_count += 1;
            kept_bytes += size;
        } else if std::fs::remove_file(&path).is_ok() {
            removed += 1;
            freed += size;
        }
    }
    (removed, freed)
}

/// Runs compiles in child processes, one at a time.
#[derive(Clone)]
pub struct Compiler {
    exe: Result<PathBuf, String>,
    args: Vec<String>,
    turn: Arc<tokio::sync::Semaphore>,
    /// Where compiled functions are kept between compiles, and the key that signs them.
    functions: Option<(PathBuf, Arc<[u8; 32]>)>,
}

/// The most a cache's compiled functions take ([`FunctionStore`]), in bytes.
pub const FUNCTIONS_MAX_SIZE: u64 = 1 << 30;

/// Cranelift's incremental cache on disk: one file per compiled function, named by a hash of
/// its key (the function's code and the compiler's settings), holding the compiled bytes and a
/// keyed hash (HMAC-SHA256 with the cache's key) over the key and the bytes. A file that does
/// not verify is not used: compiled code from the cache runs as the host, so only code this
/// host's compiler wrote is taken. A rebuild of an interpreter component changes a few of its
/// thousands of functions; the rest come from here.
#[derive(Debug)]
struct FunctionStore {
    dir: PathBuf,
    key: [u8; 32],
}

impl FunctionStore {
    fn path(&self, key: &[u8]) -> PathBuf {
        use sha2::Digest as _;
        self.dir
            .join(format!("{}.fn", hex::encode(Sha256::digest(key))))
    }

    fn tag(&self, key: &[u8], value: &[u8]) -> Option<Hmac<Sha256>> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).ok()?;
        mac.update(&(key.len() as u64).to_le_bytes());
        mac.update(key);
        mac.update(value);
        Some(mac)
    }
}

impl wasmtime::CacheStore for FunctionStore {
    fn get(&self, key: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
        let path = self.path(key);
        let mut stored = std::fs::read(&path).ok()?;
        let at = stored.len().checked_sub(32)?;
        let tag = stored.split_off(at);
        self.tag(key, &stored)?.verify_slice(&tag).ok()?;
        // Used now: eviction goes by the last use.
        let _ = std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(crate::support::clock::file_now()));
        Some(std::borrow::Cow::Owned(stored))
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let Some(tag) = self.tag(key, &value) else {
            return false;
        };
        let tag = tag.finalize().into_bytes();
        write_private(&self.path(key), &[&value, &tag], false).is_ok()
    }
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("exe", &self.exe)
            .finish_non_exhaustive()
    }
}

impl Compiler {
    /// A compiler whose children build their engine with `args` (see [`child_main`]).
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
        let mut command = tokio::process::Command::new(&exe);
        command.arg("__compile").args(&self.args);
        let mut input = Vec::with_capacity(bytes.len() + 32);
        if let Some((dir, key)) = &self.functions {
            // The key goes first on stdin: never on a command line, which others can read.
            command.arg("--functions").arg(dir);
            input.extend_from_slice(key.as_slice());
        }
        input.extend_from_slice(bytes);
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
        use std::os::unix::process::ExitStatusExt;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let (said, _) = crate::entry::outcome::bounded_text(stderr.trim(), 2048);
        let why = match output.status.signal() {
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
        };
        Err(refused(why))
    }
}

/// Set by [`serve_compiles`]: this executable compiles.
static THIS_EXECUTABLE_COMPILES: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// For every binary that hosts components (`sluice` itself, a benchmark): call first in
/// `main`. In a compiling child (`<exe> __compile ...`) it compiles and exits the process;
/// otherwise it makes this executable the one whose children compile.
pub fn serve_compiles() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__compile") {
        let code = child_main(&args[2..]);
        std::process::exit(if code == std::process::ExitCode::SUCCESS {
            0
        } else {
            2
        });
    }
    let _ = THIS_EXECUTABLE_COMPILES.set(());
}

/// The binary that compiles: this one when it serves compiles (see [`serve_compiles`]),
/// else a `sluice` next to it or one directory up (test binaries are built beside it), or
/// what `SLUICE_COMPILER` names.
fn locate() -> Result<PathBuf, String> {
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
pub fn child_main(args: &[String]) -> std::process::ExitCode {
    use nix::sys::resource::{Resource, setrlimit};
    // Dies with the host, however the host ends (a SIGKILL included): no orphan compile.
    let parent = nix::unistd::getppid();
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err()
        || nix::unistd::getppid() != parent
    {
        return std::process::ExitCode::from(2);
    }
    let cpu = COMPILE_CPU.as_secs();
    // No core dump of a compile killed at its limits (it could be gigabytes).
    if let Err(err) = setrlimit(Resource::RLIMIT_CORE, 0, 0)
        .and_then(|()| setrlimit(Resource::RLIMIT_CPU, cpu, cpu.saturating_add(1)))
        .and_then(|()| {
            setrlimit(
                Resource::RLIMIT_AS,
                COMPILE_ADDRESS_SPACE,
                COMPILE_ADDRESS_SPACE,
            )
        })
    {
        eprintln!("cannot limit the compiler: {err}");
        return std::process::ExitCode::from(2);
    }
    let options = super::RuntimeOptions {
        pool: None,
        fuel: args.iter().any(|a| a == "--fuel"),
        no_epoch: args.iter().any(|a| a == "--no-epoch"),
        quick_compile: args.iter().any(|a| a == "--quick-compile"),
        ..Default::default()
    };
    let mut bytes = Vec::new();
    if let Err(err) = std::io::stdin().read_to_end(&mut bytes) {
        eprintln!("cannot read the component: {err}");
        return std::process::ExitCode::from(2);
    }
    let mut config = super::engine_config(&options);
    if let Some(at) = args.iter().position(|a| a == "--functions") {
        let (Some(dir), true) = (args.get(at + 1), bytes.len() >= 32) else {
            eprintln!("--functions needs a directory and the key first on stdin");
            return std::process::ExitCode::from(2);
        };
        let rest = bytes.split_off(32);
        let mut key = [0u8; 32];
        key.copy_from_slice(&bytes);
        bytes = rest;
        let store = FunctionStore {
            dir: PathBuf::from(dir),
            key,
        };
        if let Err(err) = config.enable_incremental_compilation(Arc::new(store)) {
            eprintln!("{err:#}");
            return std::process::ExitCode::from(2);
        }
    }
    let compiled =
        wasmtime::Engine::new(&config).and_then(|engine| engine.precompile_component(&bytes));
    match compiled {
        Ok(artifact) => match std::io::stdout().write_all(&artifact) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("cannot write the artifact: {err}");
                std::process::ExitCode::from(2)
            }
        },
        Err(err) => {
            eprintln!("{err:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The arguments a child needs to build an engine like `options` describes.
pub fn child_args(options: &super::RuntimeOptions) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module in a component: one function with `params` i32 parameters and `locals`
    /// locals, its body `loops` nested loops.
    fn component(params: usize, locals: usize, loops: usize) -> Vec<u8> {
        let body = format!("{}{}", "(loop ".repeat(loops), ")".repeat(loops));
        let text = format!(
            "(component (core module (func (param {}) (local {}) {body})))",
            "i32 ".repeat(params),
            "i32 ".repeat(locals)
        );
        wat::parse_str(&text).expect("a valid component")
    }

    /// Parameters are locals to the compiler: a function with 1,000 of them (the most wasm
    /// allows) and no declared locals under 40 loops is the same bomb as 1,000 locals.
    #[test]
    fn parameters_count_as_locals() {
        let shape = check_shape(&component(1000, 0, 8)).expect("within the bounds");
        assert_eq!(shape.most_locals, 1000);
        let err = check_shape(&component(1000, 0, 40)).unwrap_err();
        assert!(
            err.to_string()
                .contains("nests loops 40 deep over 1000 locals"),
            "{err}"
        );
        assert!(check_shape(&component(0, 0, 40)).is_ok());
    }
}
