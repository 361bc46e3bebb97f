//! texc code generation: the loop IR to LLVM IR for x86-64, JIT-compiled
//! with MCJIT (inkwell 0.11, LLVM 19).
//!
//! Pipeline position: after `texc_schedules` lowers a kernel to loops.
//!
//! - Each kernel becomes `texc_<name>(ptr bufs, ptr scalars)`: `bufs[t]` is
//!   the buffer of tensor `t` (64-byte aligned), `scalars[s]` the value of
//!   scalar `s` as an f64. All buffers are distinct, so the body function
//!   takes them as `noalias` parameters.
//! - Loops marked `vectorized` are emitted as vector code, one lane per
//!   iteration: contiguous accesses become vector loads and stores, others
//!   gathers and scatters, and guards become masks.
//! - Loops marked `parallel` are outlined into a task function that the
//!   runtime's thread pool (`texc_parallel_for`) runs over chunks.
//! - Loops marked `unrolled` are emitted once per iteration.
//! - `select`, `&&` and `||` evaluate only what they need where a branch
//!   reads memory (branches in scalar code, masks in vector code), so guarded
//!   reads are never performed out of bounds.
//! - The module runs through LLVM's `default<O3>` pipeline for the target CPU.
//!
//! Semantics follow the interpreter except that float arithmetic happens in
//! the element type (f32 math for f32 tensors) rather than in f64.

mod emit;
pub mod header;
mod jit;

pub use jit::{compile, emit_asm, emit_llvm, write_object, Compiled};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CodegenError {
    #[error("{0}")]
    Unsupported(String),
    #[error("LLVM: {0}")]
    Llvm(String),
    #[error("{0}")]
    Run(String),
}

impl From<inkwell::builder::BuilderError> for CodegenError {
    fn from(e: inkwell::builder::BuilderError) -> Self {
        CodegenError::Llvm(e.to_string())
    }
}

/// A CPU target: LLVM CPU name, features, vector width for f32.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    pub name: String,
    pub cpu: String,
    pub features: String,
}

impl TargetSpec {
    pub fn get(name: &str) -> Option<TargetSpec> {
        let (cpu, features) = match name {
            "x86-avx2" => ("haswell".to_string(), "+avx2,+fma,+f16c".to_string()),
            "x86-avx512" => {
                ("skylake-avx512".to_string(), "+avx512f,+avx512vl,+avx512bw,+avx512dq,+avx2,+fma,+f16c".to_string())
            }
            "host" => {
                let cpu = inkwell::targets::TargetMachine::get_host_cpu_name().to_string();
                let features = inkwell::targets::TargetMachine::get_host_cpu_features().to_string();
                (cpu, features)
            }
            _ => return None,
        };
        Some(TargetSpec { name: name.to_string(), cpu, features })
    }
}
