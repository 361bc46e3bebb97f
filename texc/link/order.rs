//! The symbol ordering shared by the build scripts of the `texc`
//! executable and of the Python extension module: both link LLVM's static
//! libraries, whose functions a run enters here and there (docs in
//! `texc/build.rs`).
use std::io::Read;
use std::path::{Path, PathBuf};

/// Pass `list` (gzip, one function name a line) to the linker of this
/// crate's `kind` targets (`bins`, `cdylib`) as `--symbol-ordering-file`,
/// where the linker is LLD. The crate's code and tests see whether it was
/// passed as `TEXC_FUNCTIONS_ORDERED` (`1` or `0`).
pub fn order_functions(kind: &str, list: &str) {
    println!("cargo:rerun-if-changed={list}");
    let lld = links_with_lld();
    println!("cargo:rustc-env=TEXC_FUNCTIONS_ORDERED={}", u8::from(lld));
    if !lld {
        return;
    }
    let text = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("text-order.txt");
    std::fs::write(&text, unzip(Path::new(list))).expect("OUT_DIR is writable");
    println!("cargo:rustc-link-arg-{kind}=-Wl,--symbol-ordering-file={}", text.display());
    println!("cargo:rustc-link-arg-{kind}=-Wl,--no-warn-symbol-ordering");
}

fn unzip(gz: &Path) -> Vec<u8> {
    let bytes = std::fs::read(gz).unwrap_or_else(|e| panic!("{}: {e}", gz.display()));
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut text).unwrap_or_else(|e| panic!("{}: {e}", gz.display()));
    text
}

/// Whether rustc links this target with LLD (`x86_64-unknown-linux-gnu`
/// from Rust 1.90 on), the linker that takes a symbol ordering file.
fn links_with_lld() -> bool {
    if std::env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu") {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = std::process::Command::new(rustc).arg("-vV").output() else { return false };
    let version = String::from_utf8_lossy(&out.stdout);
    let minor = version
        .lines()
        .find_map(|l| l.strip_prefix("release: "))
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 90)
}
