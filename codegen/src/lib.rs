//! texc code generation: legalized loop IR to machine code, behind one
//! interface.
//!
//! Pipeline position: after `texc_schedules` lowers and legalizes a kernel.
//!
//! - [`backend`]: the [`Backend`] trait every code generator implements
//!   (JIT code, text, objects) and [`Compiled`], the runnable kernel they
//!   all produce (argument checks, buffers, calls), written once;
//! - [`abi`]: the calling convention and the C entry of objects, and
//!   [`header`] its C header — the same for every backend;
//! - [`device`]: the [`GpuBackend`] interface GPU backends add to
//!   [`Backend`] (device code, its files, loading and launching, emulation);
//! - [`llvm`]: LLVM 19 through inkwell (x86-64 AVX2/AVX-512, MCJIT), and
//!   [`llvm::nvptx`], its NVPTX target: PTX for NVIDIA GPUs, and the CPU
//!   emulation of GPU kernels;
//! - [`cuda`]: CUDA's offline tools (`ptxas`, libdevice), found, not linked;
//! - `cranelift` (feature `cranelift`, on by default): Cranelift 0.135,
//!   128-bit SIMD, the fast-compiling target.
//!
//! [`backend_for`] maps a target's [`BackendKind`] to its backend: adding a
//! backend is one `Backend` implementation and one arm there (see
//! docs/backends.md).

pub mod abi;
pub mod backend;
pub mod cache;
#[cfg(feature = "cranelift")]
pub mod cranelift;
pub mod cuda;
pub mod device;
pub mod header;
pub mod llvm;

pub use backend::{
    ArgRef, Backend, Buffers, Compiled, DeviceArgRef, DeviceTensorRef, NestStats, Part, TensorMut, TensorRef,
    DEVICE_ALIGNMENT,
};
pub use device::{gpu_backend_for, GpuBackend};

use texc_compiler::target::{BackendKind, Target};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CodegenError {
    /// Something this backend or target cannot compile (yet).
    #[error("{0}")]
    Unsupported(String),
    /// The backend's own machinery failed (an internal error).
    #[error("{0}")]
    Backend(String),
    /// Calling the compiled kernel failed (arguments).
    #[error("{0}")]
    Run(String),
}

/// The code generator for a target.
pub fn backend_for(target: &Target) -> Result<&'static dyn Backend, CodegenError> {
    let kind = target.backend().map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    match kind {
        BackendKind::Llvm => Ok(&llvm::LlvmBackend),
        #[cfg(feature = "cranelift")]
        BackendKind::Cranelift => Ok(&cranelift::CraneliftBackend),
        #[cfg(not(feature = "cranelift"))]
        BackendKind::Cranelift => Err(CodegenError::Unsupported(
            "this texc was built without the Cranelift backend (cargo feature `cranelift`)".into(),
        )),
        BackendKind::Nvptx => Ok(&llvm::nvptx::NvptxBackend),
        BackendKind::Interp => {
            Err(CodegenError::Unsupported(format!("target `{target}` is the interpreter: it runs no compiled code")))
        }
    }
}
