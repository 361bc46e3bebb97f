//! Whole-file writes that readers never see half done: the bytes go to a
//! temporary file beside the target, are synced, and the temporary is
//! renamed over the target (an atomic replacement on POSIX file systems).
//! Several writers of one path leave exactly one writer's complete file.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh temporary path in the directory of `path`.
pub fn temporary_beside(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "out".into());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// Write `path` through `write`, atomically (see the module documentation).
pub fn write_with(path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    let tmp = temporary_beside(path);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        write(&mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Write `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_with(path, |f| io::Write::write_all(f, bytes))
}

/// Move a finished file (written elsewhere, e.g. by a linker) over `path` atomically.
pub fn replace(from: &Path, path: &Path) -> io::Result<()> {
    File::open(from)?.sync_all()?;
    std::fs::rename(from, path)
}
