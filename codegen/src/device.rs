//! The interface of GPU code generators, beside [`Backend`]: device code for
//! several kernels in one module, the files `texc compile` writes, loading and
//! launching on this machine's device, and the CPU emulation the tests check
//! GPU schedules with.
//!
//! A GPU backend is a [`Backend`] whose [`Backend::gpu`] returns its
//! [`GpuBackend`]; the pipeline, `texc compile`, `texc run` and
//! [`crate::Compiled`] reach GPU code only through these two traits, so
//! another GPU target is one implementation of each and one `Target`.
//!
//! Invariant: every [`DeviceModule`] lists, for each function it was made
//! from, the launches of [`texc_schedules::gpu::launches`] in order and the
//! name of each launch's kernel in the module.

use crate::backend::{Backend, Code};
use crate::CodegenError;
use std::any::Any;
use std::fmt::Write;
use texc_compiler::target::Target;
use texc_compiler::tir::TensorId;
use texc_compiler::types::ElemType;
use texc_schedules::gpu::Launch;
use texc_schedules::LoopFunc;

type R<T> = Result<T, CodegenError>;

/// Device code (its text: PTX for NVPTX) for the kernels of several texc
/// functions, and how to launch them.
pub struct DeviceModule {
    pub text: String,
    /// For each function compiled, in order: its launches and their kernels.
    pub kernels: Vec<DeviceKernel>,
}

/// The launches of one texc function, and the module's kernel for each.
pub struct DeviceKernel {
    pub launches: Vec<Launch>,
    pub names: Vec<String>,
}

/// A module in one of the formats `texc compile -o` writes.
pub struct Encoded {
    pub bytes: Vec<u8>,
    /// What the device assembler reported, one line per kernel (registers,
    /// spills), where the format went through one.
    pub notes: Vec<String>,
}

/// A GPU code generator: the device half of a [`Backend`].
pub trait GpuBackend: Sync {
    /// One module with the kernels of every function of `fs` for target `t`.
    fn module(&self, fs: &[&LoopFunc], t: &Target) -> R<DeviceModule>;

    /// The extensions of the files `texc compile -o` writes for this
    /// backend; the first is the module's text as [`GpuBackend::module`] gives it.
    fn formats(&self) -> &'static [&'static str];

    /// The module text `text` as a file of `format` (one of
    /// [`GpuBackend::formats`]) for target `t`.
    fn encode(&self, text: &str, t: &Target, format: &str) -> R<Encoded>;

    /// Compile `f` and load it on this machine's device, or say why not.
    fn load(&self, f: &LoopFunc, t: &Target) -> R<Box<dyn DeviceCode>>;

    /// Compile `f`'s kernels to run on this CPU: each launch's blocks on the
    /// thread pool, each block's threads in order (results, not speed).
    fn emulate(&self, f: &LoopFunc, t: &Target) -> R<Code>;
}

/// Kernels loaded on a device, ready to launch on buffers they uploaded.
pub trait DeviceCode: Send + Sync {
    /// The tensors the kernels take, in parameter order.
    fn tensors(&self) -> &[TensorId];

    /// Copy host buffers (one per [`DeviceCode::tensors`]) to the device.
    fn upload(&self, host: &[&[u8]]) -> R<DeviceBuffers>;

    /// Run every launch in order on `bufs` and the scalars (each an 8-byte
    /// slot of [`crate::abi`] with its type), and wait for them.
    fn launch(&self, bufs: &DeviceBuffers, scalars: &[(ElemType, u64)]) -> R<()>;

    /// Copy device buffer `i` back into `out`.
    fn download(&self, bufs: &DeviceBuffers, i: usize, out: &mut [u8]) -> R<()>;

    /// Run every launch in order on memory the caller owns (one
    /// [`TensorMemory`] per [`DeviceCode::tensors`]; `None` for a temporary,
    /// which the call allocates), queued on `stream` (the device API's
    /// stream handle: a `CUstream`, 0 its default stream) without waiting;
    /// then copy tensor `from` to the caller's memory at `to` for each of
    /// `copies` (bytes).
    ///
    /// # Safety
    /// Every pointer is device memory of this device holding its `bytes`,
    /// alive until the work queued on `stream` is done; `stream` is live.
    unsafe fn launch_on(
        &self,
        tensors: &[TensorMemory],
        scalars: &[(ElemType, u64)],
        stream: u64,
        copies: &[(usize, u64, usize)],
    ) -> R<()>;
}

/// One tensor of [`DeviceCode::launch_on`]: the caller's device memory
/// (`ptr`), or a temporary (`None`); `zero` to clear it first (outputs).
pub type TensorMemory = texc_runtime::cuda::TensorMemory;

/// The device buffers of one call, opaque but to the [`DeviceCode`] that
/// uploaded them.
pub struct DeviceBuffers(Box<dyn Any + Send>);

impl DeviceBuffers {
    pub fn new<B: Any + Send>(b: B) -> DeviceBuffers {
        DeviceBuffers(Box::new(b))
    }

    /// The buffers as the device code that made them knows them.
    pub fn get<B: Any>(&self) -> R<&B> {
        self.0.downcast_ref().ok_or_else(|| CodegenError::Run("device buffers of another device".into()))
    }
}

impl DeviceModule {
    /// The launches as comments: kernel, grid, block, parameters.
    pub fn launch_comment(&self, fs: &[&LoopFunc]) -> String {
        let mut out = String::from("// texc: launch these kernels in order; the parameters are device buffers,\n");
        out.push_str("// then scalars (see the header `texc compile -o k.ptx` writes beside it)\n");
        for (f, k) in fs.iter().zip(&self.kernels) {
            let params: Vec<String> = crate::abi::used_tensors(f)
                .iter()
                .map(|&t| f.p.tensor(t).name.clone())
                .chain(f.p.scalars.iter().map(|s| s.name.clone()))
                .collect();
            for (name, l) in k.names.iter().zip(&k.launches) {
                let [gx, gy, gz] = l.grid;
                let [bx, by, bz] = l.block;
                let shared = if l.dynamic_shared > 0 { format!(", {}", l.dynamic_shared) } else { String::new() };
                let _ = writeln!(
                    out,
                    "// texc: {name}<<<({gx}, {gy}, {gz}), ({bx}, {by}, {bz}){shared}>>>({})",
                    params.join(", ")
                );
            }
        }
        out
    }
}

/// The GPU backend of `target`, or why it has none.
pub fn gpu_backend_for(target: &Target) -> R<&'static dyn GpuBackend> {
    let backend: &'static dyn Backend = crate::backend_for(target)?;
    backend
        .gpu()
        .ok_or_else(|| CodegenError::Unsupported(format!("target `{target}` is not a GPU: it has no device code")))
}
