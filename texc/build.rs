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
//! longer has are ignored, so a stale list costs only its benefit. The
//! Python extension module (`python/build.rs`) takes the same list.
#[path = "link/order.rs"]
mod order;

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    order::order_functions("bins", "link/text-order.txt.gz");
}
