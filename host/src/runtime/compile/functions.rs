//! Cranelift's incremental cache on disk (`FunctionStore`): compiled functions kept between
//! compiles, each signed with the cache's key, so a rebuild recompiles only what changed.

use std::path::PathBuf;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::support::private_file::write_private;

/// The most a cache's compiled functions take ([`FunctionStore`]), in bytes.
pub const FUNCTIONS_MAX_SIZE: u64 = 1 << 30;

/// Cranelift's incremental cache on disk: one file per compiled function, named by a hash of
/// its key (the function's code and the compiler's settings), holding the compiled bytes and a
/// keyed hash (HMAC-SHA256 with the cache's key) over the key and the bytes. A file that does
/// not verify is not used: compiled code from the cache runs as the host, so only code this
/// host's compiler wrote is taken. A rebuild of an interpreter component changes a few of its
/// thousands of functions; the rest come from here.
#[derive(Debug)]
pub(super) struct FunctionStore {
    pub(super) dir: PathBuf,
    pub(super) key: [u8; 32],
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
