//! Links the `texc` executable at a fixed address (`-no-pie`).
//!
//! Why: the executable carries LLVM's static libraries, whose tables of
//! pointers (vtables, option registries) a position-independent
//! executable must relocate at every start: 131 000 relocations, 2 MB of
//! `.data.rel.ro` made private and 3 MB of relocation records read before
//! `main`. At a fixed address the linker resolves them once. MEASURED
//! (Zen 4, `/usr/bin/time -f %M texc run MODEL.onnx --input inputs.npz
//! --target host --no-cache`, two runs each): peak resident ResNet-50 187
//! → 180–182 MB, MobileNetV2 87 → 82–83, BERT 65–66 → 60; `texc
//! --version` 5.7–5.9 → 4.2–4.7 ms. Generated code is unaffected: the JIT
//! and the AOT objects choose their own relocation model.
fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}
