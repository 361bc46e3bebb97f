//! Whole-file writes that readers never see half done, and that never
//! replace what is not a file. Every output texc writes (`.npy`/`.npz`
//! outputs, compiled objects and headers, imported kernels, tuning
//! databases, plots) goes through [`write_with`] or [`replace`], which
//! decide by what the path names now ([`destination`]):
//!
//! - nothing, or a regular file: the bytes go to a temporary file beside
//!   it, are synced, and the temporary is renamed over it (an atomic
//!   replacement on POSIX file systems; several writers of one path leave
//!   exactly one writer's complete file);
//! - a symbolic link: the rule applies to what it points to. A link to a
//!   regular file replaces that file (the link stays a link); a link to a
//!   device or FIFO is written through (`/dev/stdout` is a link to
//!   `/proc/self/fd/1`); a link that points nowhere is refused, as `cp`
//!   refuses it, rather than creating a file somewhere it names;
//! - a FIFO or a character device (`/dev/null`, a terminal, a pipe): it is
//!   opened for writing and written through, without truncating or
//!   replacing it. Renaming a file over it would turn the device into a
//!   regular file (as root, `--output y=/dev/stdout` replaced the system's
//!   `/dev/stdout`);
//! - a directory, a socket or a block device: refused, with a message that
//!   names the path and what it is.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where and how a path is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// Written to a temporary file beside `at` and renamed over it: `at`
    /// does not exist or is a regular file (the link's target, for a link).
    Replace { at: PathBuf },
    /// Opened and written in place: `at` is a FIFO or a character device.
    Through { at: PathBuf, kind: &'static str },
}

/// What a file type is, in words, for messages.
fn kind_of(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_file() {
        return "a regular file";
    }
    if t.is_dir() {
        return "a directory";
    }
    if t.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

/// FIFOs and character devices take a stream of bytes: they are written through.
fn writes_through(m: &Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = m.file_type();
        t.is_fifo() || t.is_char_device()
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        false
    }
}

fn refused(path: &Path, why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{} {why}", path.display()))
}

/// How `path` is written (see the module documentation); an error, naming
/// the path and what it is, for what is never written.
pub fn destination(path: &Path) -> io::Result<Destination> {
    let own = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        // A new path; [`check_writable`] and the write itself say what is
        // wrong with its directory, if anything.
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
            return Ok(Destination::Replace { at: path.to_path_buf() })
        }
        Err(e) => return Err(e),
    };
    if own.file_type().is_symlink() {
        return through_link(path);
    }
    classify(path, &own, path.to_path_buf())
}

/// A symbolic link: the rule applied to what it points to.
fn through_link(path: &Path) -> io::Result<Destination> {
    let target = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let to = std::fs::read_link(path).map_or_else(|_| "nothing".into(), |p| format!("`{}`", p.display()));
            return Err(refused(path, format!("is a symbolic link to {to}, which does not exist: not followed")));
        }
        Err(e) => return Err(e),
    };
    if target.file_type().is_file() {
        // Replaced where it is, so that the link stays a link. A link that
        // cannot be resolved to a path (a `/proc/PID/fd` link to a deleted
        // file) is written through.
        return Ok(match std::fs::canonicalize(path) {
            Ok(at) => Destination::Replace { at },
            Err(_) => Destination::Through { at: path.to_path_buf(), kind: "a link to an unnamed file" },
        });
    }
    // `/dev/stdout` of a process whose output is a pipe links to `pipe:[N]`,
    // which has no path: the link itself is opened.
    classify(path, &target, path.to_path_buf())
}

fn classify(path: &Path, m: &Metadata, at: PathBuf) -> io::Result<Destination> {
    if m.file_type().is_file() {
        return Ok(Destination::Replace { at });
    }
    if writes_through(m) {
        return Ok(Destination::Through { at, kind: kind_of(m) });
    }
    Err(refused(path, format!("is {}: not written", kind_of(m))))
}

/// A fresh temporary path in the directory of `path` (of the file it links
/// to, for a link to a regular file: the rename must stay on its file system).
pub fn temporary_beside(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let at = match destination(path) {
        Ok(Destination::Replace { at }) => at,
        _ => path.to_path_buf(),
    };
    let name = at.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "out".into());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    at.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// What [`write_with`] hands its writer: a file, or a buffer in memory for
/// a destination written through (a FIFO cannot seek, and a `.npz` archive
/// is written with seeks).
pub trait Sink: Write + Seek {}
impl<T: Write + Seek> Sink for T {}

/// Write `path` through `write`, atomically where the path is a file (see
/// the module documentation).
pub fn write_with(path: &Path, write: impl FnOnce(&mut dyn Sink) -> io::Result<()>) -> io::Result<()> {
    match destination(path)? {
        Destination::Replace { at } => replace_with(&at, write),
        Destination::Through { at, .. } => {
            let mut buffer = io::Cursor::new(Vec::new());
            write(&mut buffer)?;
            write_through(&at, buffer.get_ref())
        }
    }
}

fn replace_with(at: &Path, write: impl FnOnce(&mut dyn Sink) -> io::Result<()>) -> io::Result<()> {
    let tmp = temporary_beside(at);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        write(&mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, at)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Open a FIFO or device for writing (no truncation, no creation: it
/// exists and stays what it is) and write `bytes` to it. A FIFO's open
/// waits for a reader, as a shell's `>` does.
fn write_through(at: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(at)?;
    f.write_all(bytes)?;
    f.flush()
}

/// Write `bytes` to `path` ([`write_with`]).
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_with(path, |f| f.write_all(bytes))
}

/// Move a finished file (written elsewhere, e.g. by a linker, beside
/// `path`: [`temporary_beside`]) to `path`: renamed over it where it is a
/// file, else copied through and removed.
pub fn replace(from: &Path, path: &Path) -> io::Result<()> {
    let result = match destination(path) {
        Ok(Destination::Replace { at }) => File::open(from).and_then(|f| f.sync_all()).and_then(|()| {
            std::fs::rename(from, &at).or_else(|e| {
                // `from` was put beside `path`, not beside the file it links to.
                if e.raw_os_error() == Some(libc::EXDEV) {
                    std::fs::read(from).and_then(|bytes| replace_with(&at, |f| f.write_all(&bytes)))
                } else {
                    Err(e)
                }
            })
        }),
        Ok(Destination::Through { at, .. }) => std::fs::read(from).and_then(|bytes| write_through(&at, &bytes)),
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(from);
    result
}

/// Whether `path` can be written, checked before long work starts: what
/// [`write_with`] would do is allowed, and for a replacement a file can be
/// created beside it. A FIFO or device is not opened (a FIFO's open waits
/// for a reader).
pub fn check_writable(path: &Path) -> io::Result<()> {
    let Destination::Replace { at } = destination(path)? else { return Ok(()) };
    let dir = match at.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        let why = if dir.exists() { "is not a directory" } else { "does not exist" };
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} {why}", dir.display())));
    }
    let probe = temporary_beside(&at);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write in {}: {e}", dir.display())))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Read;

    /// A test's own directory, removed when the test ends (pass or fail).
    struct Dir(PathBuf);

    impl std::ops::Deref for Dir {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for Dir {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("texc-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("tmp");
        Dir(d)
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
    }

    fn is_fifo(p: &Path) -> bool {
        use std::os::unix::fs::FileTypeExt;
        std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_fifo())
    }

    /// A reader of `p` on a thread: what it read once the writer closed.
    /// [`Reader::read`] fails after a few seconds instead of waiting
    /// forever, so that a writer that does not write through (a regression)
    /// fails the test rather than hanging it.
    struct Reader(std::sync::mpsc::Receiver<Vec<u8>>);

    impl Reader {
        fn new(p: &Path) -> Reader {
            let p = p.to_path_buf();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                File::open(&p).expect("open the FIFO").read_to_end(&mut v).expect("read");
                let _ = tx.send(v);
            });
            Reader(rx)
        }

        fn read(self) -> Vec<u8> {
            self.0.recv_timeout(std::time::Duration::from_secs(10)).expect("the FIFO's reader got the bytes")
        }
    }

    #[test]
    fn files_and_new_paths_are_replaced_atomically() {
        let d = dir("files");
        let p = d.join("a.bin");
        write(&p, b"one").expect("new");
        write(&p, b"two").expect("over a file");
        assert_eq!(std::fs::read(&p).expect("read"), b"two");
        let left: Vec<_> = std::fs::read_dir(&d).expect("dir").collect();
        assert_eq!(left.len(), 1, "no temporary left");
    }

    #[test]
    fn a_fifo_is_written_through_and_stays_a_fifo() {
        let d = dir("fifo");
        let p = d.join("out.npy");
        mkfifo(&p);
        let r = Reader::new(&p);
        write_with(&p, |f| {
            // Seeks work: an `.npz` archive is written with them.
            f.write_all(b"xxxx")?;
            f.seek(io::SeekFrom::Start(0))?;
            f.write_all(b"bytes")
        })
        .expect("written through");
        assert_eq!(r.read(), b"bytes");
        assert!(is_fifo(&p), "still a FIFO");
        // A link to it is written through too; the link stays a link.
        let link = d.join("link.npy");
        std::os::unix::fs::symlink(&p, &link).expect("symlink");
        let r = Reader::new(&p);
        write(&link, b"via link").expect("through the link");
        assert_eq!(r.read(), b"via link");
        assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
        assert!(is_fifo(&p));
        assert_eq!(check_writable(&p).ok(), Some(()), "checked without opening it");
    }

    #[test]
    fn a_link_to_a_file_replaces_the_file_and_stays_a_link() {
        let d = dir("link");
        std::fs::create_dir_all(d.join("elsewhere")).expect("dir");
        let target = d.join("elsewhere/real.npy");
        std::fs::write(&target, b"old").expect("write");
        let link = d.join("link.npy");
        std::os::unix::fs::symlink("elsewhere/real.npy", &link).expect("symlink");
        write(&link, b"new").expect("write");
        assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
        assert_eq!(std::fs::read(&target).expect("read"), b"new");
        // A finished file moved over the link lands in the file too.
        let linked = temporary_beside(&link);
        assert_eq!(linked.parent(), target.canonicalize().expect("canonical").parent(), "beside the file");
        std::fs::write(&linked, b"linked").expect("write");
        replace(&linked, &link).expect("replace");
        assert_eq!(std::fs::read(&target).expect("read"), b"linked");
        assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
        // A link to nothing is refused, and nothing is created.
        let dangling = d.join("dangling.npy");
        std::os::unix::fs::symlink("nowhere/x.npy", &dangling).expect("symlink");
        let e = write(&dangling, b"x").expect_err("refused").to_string();
        assert!(e.contains("dangling.npy is a symbolic link to `nowhere/x.npy`, which does not exist"), "{e}");
        assert!(!d.join("nowhere").exists());
    }

    #[test]
    fn directories_and_sockets_are_refused_by_name() {
        let d = dir("refused");
        let e = write(&d, b"x").expect_err("a directory").to_string();
        assert!(e.ends_with("is a directory: not written"), "{e}");
        let sock = d.join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let e = write(&sock, b"x").expect_err("a socket").to_string();
        assert!(e.contains("s.sock is a socket"), "{e}");
        assert!(check_writable(&sock).is_err());
    }

    /// A character device is written through and stays a device. As root a
    /// null device is made in a temporary directory (a regression would
    /// then replace that node, not the system's `/dev/null`); otherwise
    /// `/dev/null` itself, which an unprivileged regression cannot replace.
    #[test]
    fn a_character_device_is_written_through() {
        use std::os::unix::fs::FileTypeExt;
        let d = dir("chardev");
        // SAFETY: geteuid has no preconditions.
        let null = if unsafe { libc::geteuid() } == 0 {
            let p = d.join("null");
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: `c` is a NUL-terminated path; 1:3 is the null device.
            let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
            if made != 0 {
                eprintln!("skipped: cannot make a device node here");
                return;
            }
            p
        } else {
            PathBuf::from("/dev/null")
        };
        write(&null, b"discarded").expect("written through");
        assert!(std::fs::symlink_metadata(&null).expect("node").file_type().is_char_device());
        assert_eq!(destination(&null).expect("through"), Destination::Through { at: null, kind: "a character device" });
    }
}
