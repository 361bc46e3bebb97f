//! How the `texc` executable is linked: at a fixed address, and with the
//! functions its common work runs laid out first and together.
//!
//! *At a fixed address* (`-no-pie`): the executable carries LLVM's static
//! libraries, whose tables of pointers (vtables, option registries) a
//! position-independent executable must relocate at every start: 131 000
//! relocations, 2 MB of `.data.rel.ro` made private and 3 MB of relocation
//! records read before `main`. At a fixed address the linker resolves them
//! once. MEASURED (Zen 4, `/usr/bin/time -f %M texc run MODEL.onnx --input
//! inputs.npz --target host --no-cache`, two runs each): peak resident
//! ResNet-50 187 → 180–182 MB, MobileNetV2 87 → 82–83, BERT 65–66 → 60;
//! `texc --version` 5.7–5.9 → 4.2–4.7 ms. Generated code is unaffected:
//! the JIT and the AOT objects choose their own relocation model.
//!
//! *Functions in the order they are used* (`--symbol-ordering-file`, from
//! `link/text-order.txt.gz`, which `scripts/text-order.py` writes from
//! profiles): a run touches LLVM's code here and there (its static
//! constructors before `main`, then the code generator), and each page
//! fault maps the 64 KiB around it; laid out together, those functions
//! take about their own size. Rust's linker on this target is LLD since
//! 1.90; with another toolchain the list is not passed. Names the build no
//! longer has are ignored, so a stale list costs only its benefit.
use std::io::Read;
use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
    println!("cargo:rerun-if-changed=link/text-order.txt.gz");
    if links_with_lld() {
        let list = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("text-order.txt");
        std::fs::write(&list, text_order()).expect("OUT_DIR is writable");
        println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}", list.display());
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

/// The list of function names, one a line.
fn text_order() -> Vec<u8> {
    let gz = std::fs::read("link/text-order.txt.gz").expect("texc/link/text-order.txt.gz is in the source tree");
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut text).expect("texc/link/text-order.txt.gz is gzip");
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
