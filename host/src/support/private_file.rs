//! Files only this user may read, written whole or not at all: the dev Redis's password and
//! address, the compile cache's artifacts and compiled functions. A reader never sees half of
//! one, and a crash leaves the old file or the new one.

use std::io::Write as _;
use std::path::Path;

/// Write `parts` to `path`, mode 0600, through a temporary file renamed into place; `sync`
/// first when the file must survive a crash of the machine.
pub fn write_private(path: &Path, parts: &[&[u8]], sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // Unique to this process and this call: two threads may write one path at once.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{call}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            // A leftover temporary file keeps its mode: make it private whatever it was.
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            for part in parts {
                f.write_all(part)?;
            }
            if sync { f.sync_all() } else { Ok(()) }
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
