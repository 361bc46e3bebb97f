//! `cargo fuzz run front_end`: any bytes through parsing, resolution and
//! specialization at default sizes must give diagnostics, never a panic.
//! (The front-end passes are called directly, not through `texc-pipeline`,
//! so that the fuzzer does not link LLVM.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use texc_compiler::{Bindings, KernelRef, Session};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut s = Session::new();
    let Ok(m) = s.parse_text("fuzz.tex", text, None) else { return };
    if texc_compiler::resolve::resolve_session(&mut s).is_err() {
        return;
    }
    for i in 0..s.module(m).kernels.len() {
        let k = KernelRef { module: m as u32, index: i as u32 };
        if let Ok(p) = texc_compiler::specialize::specialize(&s, k, &Bindings::default()) {
            texc_compiler::verify::verify(&p).expect("specialized programs verify");
        }
    }
});
