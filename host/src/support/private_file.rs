//! Files only this user may read, written whole or not at all: the dev Redis's password and
//! address, the compile cache's artifacts and compiled functions. A reader never sees half of
//! one, and a crash leaves the old file or the new one.

use std::io::Write as _;
use std::path::Path;

/// Write `parts` to `path`, mode 0600, through a temporary file renamed into place; `sync`
/// first when the file must survive a crash of the machine.
pub fn write_private(path: &Path, parts: &[&[u8]], sync: bool) -> std::io::Result<()> {
    let tmp = temp_name(path);
    let written = write_temp(&tmp, parts, sync).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Write `parts` to `path`, mode 0600, synced, only if nothing is there yet: through a
/// temporary file linked into place (a link never replaces a file), so of writers racing the
/// first wins and no reader ever sees the file half written. False when `path` existed.
pub fn create_private(path: &Path, parts: &[&[u8]]) -> std::io::Result<bool> {
    let tmp = temp_name(path);
    let written = write_temp(&tmp, parts, true).and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(err) => Err(err),
    }
}

/// A temporary name beside `path`, unique to this process and this call: two threads may
/// write one path at once.
fn temp_name(path: &Path) -> std::path::PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    path.with_extension(format!("tmp{}-{call}", std::process::id()))
}

/// `parts` into the file `tmp`, made or truncated, mode 0600.
fn write_temp(tmp: &Path, parts: &[&[u8]], sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)?;
    // A leftover temporary file keeps its mode: make it private whatever it was.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    for part in parts {
        f.write_all(part)?;
    }
    if sync { f.sync_all() } else { Ok(()) }
}
