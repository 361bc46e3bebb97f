//! `cargo fuzz run front_end`: any bytes through parsing, resolution and
//! specialization at default sizes must give diagnostics, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use texc_compiler::{Bindings, KernelRef, Session};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut s = Session::new();
    let Ok(m) = s.load_text("fuzz.tex", text, None) else { return };
    for i in 0..s.module(m).kernels.len() {
        let k = KernelRef { module: m as u32, index: i as u32 };
        let _ = texc_compiler::build_program(&s, k, &Bindings::default());
    }
});
