//! texc semantics: from parsed files to a checked, specialized tensor IR, and
//! the reference interpreter that runs it.
//!
//! Pipeline: [`session`] loads files and imports → [`resolve`] checks names
//! and types (shape-agnostic) → [`specialize`] binds sizes, inlines calls and
//! lowers to [`tir`] (with [`bounds`] proving every access in range) →
//! [`verify`] (debug builds or `TEXC_VERIFY=1`) → [`interp`].
//! `TEXC_DUMP_IR=1` prints the IR after each pass to stderr.

pub mod bounds;
pub mod cost;
pub mod graph;
pub mod interp;
pub mod print;
pub mod resolve;
pub mod session;
pub mod specialize;
pub mod tir;
pub mod types;
pub mod verify;

pub use session::{KernelRef, Session};
pub use specialize::Bindings;
pub use tir::Program;

use texc_grammar::Diagnostic;

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Specialize a kernel and run the TIR checks (verifier, IR dump) around it.
pub fn build_program(s: &Session, k: KernelRef, b: &Bindings) -> Result<Program, Diagnostic> {
    let p = specialize::specialize(s, k, b)?;
    if env_flag("TEXC_DUMP_IR") {
        eprintln!("// ---- after specialize (tir)\n{}", print::print_program(&p));
    }
    if cfg!(debug_assertions) || env_flag("TEXC_VERIFY") {
        verify::verify(&p)
            .map_err(|m| Diagnostic::error(format!("internal error: TIR verifier failed after specialize: {m}")))?;
    }
    Ok(p)
}
