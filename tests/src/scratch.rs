//! Scratch directories of test processes: `texc-{prefix}-{pid}` under the
//! system's temporary directory, one per test binary and prefix (its tests
//! run in parallel and share it, so none can remove it when done). Those of
//! processes that have exited are removed when the next one asks for its
//! own, so runs do not pile them up. Shared by the CLI's tests
//! (`texc/tests`, through `#[path]`) and the suite (`texc_tests::scratch`).

use std::path::{Path, PathBuf};

/// This process's scratch directory for `prefix`, created; the directories
/// and files `texc-{prefix}-{pid}…` of exited processes removed first
/// (where `/proc` says which processes live).
pub fn scratch(prefix: &str) -> PathBuf {
    let tmp = std::env::temp_dir();
    let me = std::process::id();
    reap(&tmp, prefix, me);
    let d = tmp.join(format!("texc-{prefix}-{me}"));
    std::fs::create_dir_all(&d).expect("a scratch directory");
    d
}

fn reap(tmp: &Path, prefix: &str, me: u32) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    let start = format!("texc-{prefix}-");
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&start) else { continue };
        // `texc-cli-123` and `texc-cli-123-x.tex`, not `texc-cli-extra-123`.
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<u32>() else { continue };
        if pid == me || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = e.path();
        let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
    }
}
