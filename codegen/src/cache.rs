//! The persistent compile cache: machine code of loop nests, kept between
//! runs so that compiling a model a second time takes little more than
//! reading its files.
//!
//! - **Where:** `$TEXC_CACHE_DIR`, else `$XDG_CACHE_HOME/texc/code`, else
//!   `~/.cache/texc/code`. `TEXC_NO_CACHE=1` (or the CLI's `--no-cache`,
//!   [`disable`]) turns it off.
//! - **Key:** SHA3-256 of the nest in canonical form (`texc_schedules::nest`),
//!   the target with its CPU name and features, texc's version and the
//!   identity of the binary that holds this code (path, size, modification
//!   time: a rebuilt texc never reads what an older one wrote).
//! - **Entries:** one file per key, `<key>.o`: a magic line, the SHA3-256
//!   of the payload and its length, then the payload (an ELF object). An
//!   entry whose checksum or length does not match is a miss and is
//!   rewritten: a corrupt or truncated file never runs.
//! - **Writes** go through `texc_runtime::atomic::write` (a temporary file
//!   renamed over the entry), so concurrent texc processes see a whole
//!   entry or none; two writing one key write the same bytes.
//! - **Size:** at most `$TEXC_CACHE_MAX_MB` MiB (default 1024); after a
//!   compile that wrote entries, the least recently used (by modification
//!   time, which a hit refreshes) are removed until the rest fit.

use sha3::{Digest, Sha3_256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

const MAGIC: &[u8; 8] = b"TEXCOBJ1";
const HEADER: usize = 8 + 32 + 8;
const DEFAULT_MAX_MB: u64 = 1024;

static DISABLED: AtomicBool = AtomicBool::new(false);

/// Turn the cache off for this process (the CLI's `--no-cache`).
pub fn disable() {
    DISABLED.store(true, Ordering::Relaxed);
}

/// A cache directory.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
    max_bytes: u64,
}

/// What a lookup found.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry that fails its checksum or is cut short (it will be rewritten).
    Corrupt,
}

impl Cache {
    /// The cache the environment asks for, or `None` where it is off (or
    /// no directory can be named).
    pub fn from_env() -> Option<Cache> {
        if DISABLED.load(Ordering::Relaxed)
            || std::env::var_os("TEXC_NO_CACHE").is_some_and(|v| v != "0" && !v.is_empty())
        {
            return None;
        }
        let dir = match std::env::var_os("TEXC_CACHE_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => {
                let base = std::env::var_os("XDG_CACHE_HOME")
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
                base.join("texc").join("code")
            }
        };
        let mb = std::env::var("TEXC_CACHE_MAX_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_MAX_MB);
        Some(Cache::at(dir, mb.saturating_mul(1 << 20)))
    }

    /// A cache in `dir` of at most `max_bytes`.
    pub fn at(dir: PathBuf, max_bytes: u64) -> Cache {
        Cache { dir, max_bytes }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.o"))
    }

    /// The entry of `key`, checked.
    pub fn get(&self, key: &str) -> Lookup {
        let path = self.path(key);
        let Ok(bytes) = std::fs::read(&path) else { return Lookup::Miss };
        match unwrap_entry(&bytes) {
            Some(payload) => {
                // Refresh the entry's age for eviction (best effort).
                if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                    let _ = f.set_modified(std::time::SystemTime::now());
                }
                Lookup::Hit(payload.to_vec())
            }
            None => Lookup::Corrupt,
        }
    }

    /// Store `payload` under `key` (errors are ignored: the cache is an
    /// optimisation, never a reason to fail a compile).
    pub fn put(&self, key: &str, payload: &[u8]) {
        if std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        let _ = texc_runtime::atomic::write(&self.path(key), &wrap_entry(payload));
    }

    /// Remove the least recently used entries until the cache fits its bound.
    pub fn evict(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "o"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

fn wrap_entry(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&Sha3_256::digest(payload));
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn unwrap_entry(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[40..48].try_into().ok()?);
    let payload = &bytes[HEADER..];
    (payload.len() as u64 == len && Sha3_256::digest(payload).as_slice() == &bytes[8..40]).then_some(payload)
}

/// The key of code made from `parts` (the nest's canonical text, the
/// target's description) by this texc: hex SHA3-256.
pub fn key(parts: &[&str]) -> String {
    let mut h = Sha3_256::new();
    h.update(b"texc-code-cache-1\0");
    h.update(build_identity().as_bytes());
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// texc's version and the identity of the file this code was loaded from
/// (the `texc` binary, or the Python extension): path, size and
/// modification time, which change whenever texc is rebuilt.
pub fn build_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let file = own_file().unwrap_or_default();
        let stamp = std::fs::metadata(&file)
            .map(|m| {
                let t = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                format!("{}:{}", m.len(), t.map_or(0, |d| d.as_nanos()))
            })
            .unwrap_or_default();
        format!("{} {} {}", env!("CARGO_PKG_VERSION"), file.display(), stamp)
    })
}

/// The file (executable or shared library) that holds this function's code.
fn own_file() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills `info`.
    let found = unsafe { libc::dladdr(own_file as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return std::env::current_exe().ok();
    }
    // SAFETY: dladdr set a NUL-terminated name that lives as long as the module.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let path = PathBuf::from(name);
    // The main program's name may be relative (or empty): its own path is surer.
    if path.is_absolute() {
        Some(path)
    } else {
        std::env::current_exe().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_cache(name: &str, max: u64) -> Cache {
        let dir = std::env::temp_dir().join(format!("texc-cache-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Cache::at(dir, max)
    }

    #[test]
    fn entries_round_trip_and_corruption_is_a_miss() {
        let c = temp_cache("roundtrip", 1 << 20);
        let k = key(&["nest", "target"]);
        assert_eq!(c.get(&k), Lookup::Miss);
        c.put(&k, b"object bytes");
        assert_eq!(c.get(&k), Lookup::Hit(b"object bytes".to_vec()));
        // A flipped byte in the payload.
        let path = c.path(&k);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(c.get(&k), Lookup::Corrupt);
        // Cut short.
        std::fs::write(&path, &bytes[..HEADER + 3]).unwrap();
        assert_eq!(c.get(&k), Lookup::Corrupt);
        std::fs::write(&path, b"TEX").unwrap();
        assert_eq!(c.get(&k), Lookup::Corrupt);
        c.put(&k, b"object bytes");
        assert_eq!(c.get(&k), Lookup::Hit(b"object bytes".to_vec()));
        let _ = std::fs::remove_dir_all(c.dir());
    }

    #[test]
    fn keys_differ_with_every_part() {
        let a = key(&["nest", "x86-avx2 znver3 +avx2"]);
        assert_ne!(a, key(&["nest2", "x86-avx2 znver3 +avx2"]));
        assert_ne!(a, key(&["nest", "x86-avx512 znver4 +avx512f"]));
        // Parts are length-prefixed: moving a boundary changes the key.
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
        assert_eq!(a, key(&["nest", "x86-avx2 znver3 +avx2"]));
    }

    #[test]
    fn eviction_removes_the_oldest_until_the_rest_fit() {
        let c = temp_cache("evict", 2 * (HEADER as u64 + 100));
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            c.put(k, &[i as u8; 100]);
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            std::fs::File::options().append(true).open(c.path(k)).unwrap().set_modified(t).unwrap();
        }
        c.evict();
        assert_eq!(c.get("a"), Lookup::Miss);
        assert!(matches!(c.get("b"), Lookup::Hit(_)));
        assert!(matches!(c.get("c"), Lookup::Hit(_)));
        let _ = std::fs::remove_dir_all(c.dir());
    }
}
