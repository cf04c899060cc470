//! The on-disk cache of compiled components ([`ArtifactCache`]): a private directory, a key
//! private to this host, and each artifact vouched for by its keyed hash (compiled code is
//! native code the host will run); and eviction of the least recently used files
//! ([`evict`], [`evict_files`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::runtime::RuntimeError;
use crate::support::digest::Digest;
use crate::support::private_file::{create_private, write_private};

/// Where compiled components wait for the next start, each vouched for by a keyed hash.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    pub(super) dir: PathBuf,
    pub(super) key: Arc<[u8; 32]>,
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
        let unusable = |source: std::io::Error| RuntimeError::CacheDir {
            path: dir.to_owned(),
            source,
        };
        let dir = private_dir(dir, &unusable)?;
        let Some(key) = cache_key(&dir, &unusable)? else {
            // Another host wrote the key first: read theirs.
            return Self::open(&dir, engine_tag);
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

/// `dir`, created 0700 if missing, canonical; refused when others may write it or another
/// user owns it (its artifacts run as the host).
fn private_dir(
    dir: &Path,
    unusable: &impl Fn(std::io::Error) -> RuntimeError,
) -> Result<PathBuf, RuntimeError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
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
    Ok(dir)
}

/// The cache's key, read from its file in `dir` or made and written there; `None` when
/// another host wrote one first (between our look and our write).
fn cache_key(
    dir: &Path,
    unusable: &impl Fn(std::io::Error) -> RuntimeError,
) -> Result<Option<[u8; 32]>, RuntimeError> {
    let key_path = dir.join(KEY_FILE);
    match std::fs::read(&key_path) {
        Ok(bytes) => read_key(&key_path, &bytes, unusable).map(Some),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => new_key(&key_path, unusable),
        Err(err) => Err(unusable(err)),
    }
}

/// The key in `bytes`, read from `key_path`: refused when others may read the file or
/// another user owns it.
fn read_key(
    key_path: &Path,
    bytes: &[u8],
    unusable: &impl Fn(std::io::Error) -> RuntimeError,
) -> Result<[u8; 32], RuntimeError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(key_path).map_err(unusable)?;
    let uid = nix::unistd::geteuid().as_raw();
    if meta.permissions().mode() & 0o077 != 0 || meta.uid() != uid {
        return Err(RuntimeError::CacheDirOpen {
            path: key_path.to_owned(),
            mode: meta.permissions().mode() & 0o777,
        });
    }
    <[u8; 32]>::try_from(bytes).map_err(|_| {
        unusable(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is not a 32-byte key; delete it to make a new one",
                key_path.display()
            ),
        ))
    })
}

/// A new random key, written 0600 to `key_path`; `None` when another host's key got there
/// first (written whole and linked into place: a host starting at the same moment never reads
/// half a key; see [`create_private`]).
fn new_key(
    key_path: &Path,
    unusable: &impl Fn(std::io::Error) -> RuntimeError,
) -> Result<Option<[u8; 32]>, RuntimeError> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| {
        unusable(std::io::Error::other(format!(
            "no randomness for the cache key: {e}"
        )))
    })?;
    let created = create_private(key_path, &[&key]).map_err(unusable)?;
    Ok(created.then_some(key))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Hosts (here threads) that open one new cache at the same moment all get one key, and
    /// none reads a key half written.
    #[test]
    fn hosts_opening_a_new_cache_at_once_share_one_whole_key() {
        for _ in 0..40 {
            let root = tempfile::tempdir().expect("temporary directory");
            let dir = root.path().join("cache");
            let barrier = Arc::new(std::sync::Barrier::new(8));
            let opened: Vec<_> = (0..8)
                .map(|_| {
                    let (dir, barrier) = (dir.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        ArtifactCache::open(&dir, "tag".into()).map(|c| *c.key)
                    })
                })
                .collect();
            let keys: Vec<[u8; 32]> = opened
                .into_iter()
                .map(|t| {
                    t.join()
                        .expect("thread")
                        .expect("every host opens the cache")
                })
                .collect();
            assert!(keys.iter().all(|k| *k == keys[0]), "one key for all");
            let stray: Vec<_> = std::fs::read_dir(&dir)
                .expect("cache dir")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .filter(|n| n != KEY_FILE)
                .collect();
            assert!(stray.is_empty(), "no temporary key left: {stray:?}");
        }
    }
}
