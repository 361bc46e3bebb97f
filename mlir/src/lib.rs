//! texc's MLIR export (`texc emit --stage mlir|mlir-linalg`), built through
//! melior on MLIR 19's C API.
//!
//! - [`export_loops`]: the scheduled, legalized loop IR as one `func.func`
//!   of `scf.for`/`scf.parallel`/`scf.if`, `memref` buffers, `arith`,
//!   `math` and, for vectorized loops, `vector` operations.
//! - [`export_linalg`]: the tensor IR before scheduling as `linalg.generic`
//!   operations on tensors, one per stage, so that other MLIR compilers can
//!   schedule it themselves.
//!
//! Both spell out texc's semantics with operations whose result is defined
//! for every input (docs/mlir.md): integer division only after
//! legalization (its divisor is never 0 or -1), float-to-integer conversion
//! saturating with NaN to 0, lazy `select`/`&&`/`||` as `scf.if` or masks
//! where a side reads memory. Every module passes MLIR's verifier before it
//! is printed; printing is deterministic.
//!
//! Calling convention of the exported function: the kernel's parameters in
//! declaration order (tensors as `memref`s of their static shape, scalars
//! by value), then its outputs (`export_loops`) — or, for `export_linalg`,
//! the parameters with tensors as `tensor`s, returning the outputs.

mod emit;
mod linalg;
mod loops;

use melior::dialect::DialectRegistry;
use melior::ir::{Location, Module};
use melior::utility::register_all_dialects;
use melior::Context;
use texc_compiler::tir::Program;
use texc_schedules::LoopFunc;

#[derive(Debug, thiserror::Error)]
pub enum MlirError {
    /// Something texc has no MLIR spelling for (yet).
    #[error("MLIR export: {0}")]
    Unsupported(String),
    /// The built module failed MLIR's verifier: a bug in the export.
    #[error("MLIR export: the module fails MLIR's verifier (a bug in texc):\n{0}")]
    Verifier(String),
}

type R<T> = Result<T, MlirError>;

/// A context with every upstream dialect loaded.
fn context() -> Context {
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let cx = Context::new();
    cx.append_dialect_registry(&registry);
    cx.load_all_available_dialects();
    cx
}

/// Verify and print a module.
fn finish(m: &Module) -> R<String> {
    if !m.as_operation().verify() {
        return Err(MlirError::Verifier(m.as_operation().to_string()));
    }
    Ok(m.as_operation().to_string())
}

/// The loop IR `f` (lowered and legalized for its target) as MLIR text.
pub fn export_loops(f: &LoopFunc) -> R<String> {
    let cx = context();
    let m = Module::new(Location::unknown(&cx));
    loops::build(&cx, &m, f)?;
    finish(&m)
}

/// The tensor IR `p` (specialized, before scheduling) as `linalg.generic`
/// operations on tensors.
pub fn export_linalg(p: &Program) -> R<String> {
    let cx = context();
    let m = Module::new(Location::unknown(&cx));
    linalg::build(&cx, &m, p)?;
    finish(&m)
}
