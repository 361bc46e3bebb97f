//! The NVPTX backend: GPU loop nests to PTX through LLVM's NVPTX target
//! (one kernel per launch, see [`super::gpu`]), and their CPU emulation.
//!
//! Math built-ins LLVM cannot lower for NVPTX (`exp`, `log`, `pow`, `tanh`,
//! `erf`, `erfc`) call CUDA's libdevice, which is linked into the module
//! (and internalized, so only what a kernel calls is kept) before `O3`;
//! NVVM reflection is told that denormals are kept (`nvvm-reflect-ftz` 0).

use super::gen::Gen;
use super::{jit_module, llvm_err, with_module, CpuSpec, R};
use crate::abi::CEntry;
use crate::backend::{Backend, Code};
use crate::device::{DeviceBuffers, DeviceCode, DeviceKernel, DeviceModule, Encoded, GpuBackend, TensorMemory};
use crate::{cuda, CodegenError};
use inkwell::context::Context;
use inkwell::module::{FlagBehavior, Linkage, Module};
use inkwell::targets::FileType;
use texc_compiler::target::{BackendKind, Target};
use texc_compiler::tir::TensorId;
use texc_compiler::types::ElemType;
use texc_runtime::cuda::ScalarArg;
use texc_schedules::gpu::{self, Launch};
use texc_schedules::LoopFunc;

/// The NVPTX backend (stateless).
pub struct NvptxBackend;

fn launches_of(f: &LoopFunc, t: &Target) -> R<Vec<Launch>> {
    gpu::launches(f, t).map_err(|e| CodegenError::Backend(format!("GPU launches of `{}`: {e}", f.p.name)))
}

/// One PTX module with the kernels of every function of `fs`, libdevice
/// linked and internalized.
fn ptx_module<'c>(cx: &'c Context, fs: &[&LoopFunc], spec: &CpuSpec, launches: &[Vec<Launch>]) -> R<Module<'c>> {
    for f in fs {
        super::gen::refuse_bf16_arithmetic(f)?;
    }
    let mut modules = fs.iter().zip(launches).map(|(f, l)| Gen::new(cx, f, spec).build_ptx(l));
    let m = modules.next().ok_or_else(|| CodegenError::Backend("no kernel to compile".into()))??;
    for other in modules {
        m.link_in_module(other?).map_err(llvm_err)?;
    }
    let i32t = cx.i32_type();
    m.add_basic_value_flag("nvvm-reflect-ftz", FlagBehavior::Override, i32t.const_zero());
    link_libdevice(cx, &m)?;
    Ok(m)
}

fn link_libdevice<'c>(cx: &'c Context, m: &Module<'c>) -> R<()> {
    let needed: Vec<String> = m
        .get_functions()
        .filter(|f| f.count_basic_blocks() == 0)
        .map(|f| f.get_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("__nv_"))
        .collect();
    if needed.is_empty() {
        return Ok(());
    }
    let path = cuda::libdevice().ok_or_else(|| {
        CodegenError::Unsupported(format!(
            "{} on a GPU needs CUDA's libdevice (libdevice.10.bc), which was not found: {}",
            needed.join(", ").replace("__nv_", ""),
            cuda::searched()
        ))
    })?;
    let lib = Module::parse_bitcode_from_path(&path, cx).map_err(llvm_err)?;
    lib.set_triple(&m.get_triple());
    lib.set_data_layout(&m.get_data_layout());
    m.link_in_module(lib).map_err(llvm_err)?;
    // Only the kernels are entry points: the rest may be inlined and dropped.
    for f in m.get_functions() {
        let kernel = f.get_linkage() == Linkage::External && !f.get_name().to_bytes().starts_with(b"__nv_");
        if f.count_basic_blocks() > 0 && !kernel {
            f.set_linkage(Linkage::Internal);
        }
    }
    Ok(())
}

impl NvptxBackend {
    /// One PTX module for the functions `fs` on GPU target `t`, with their launches.
    fn ptx(&self, fs: &[&LoopFunc], t: &Target) -> R<DeviceModule> {
        let launches = fs.iter().map(|f| launches_of(f, t)).collect::<R<Vec<_>>>()?;
        let text = with_module(
            t,
            |cx, spec| ptx_module(cx, fs, spec, &launches),
            |m, tm| {
                let buf = tm.write_to_memory_buffer(m, FileType::Assembly).map_err(llvm_err)?;
                Ok(String::from_utf8_lossy(buf.as_slice()).to_string())
            },
        )?;
        let text = if fs.iter().any(|f| texc_schedules::ir::has_wgmma(f)) { sm90a(&text, t)? } else { text };
        let kernels = fs
            .iter()
            .zip(launches)
            .map(|(f, launches)| {
                let names = (0..launches.len()).map(|i| super::gpu::kernel_name(f, i)).collect();
                DeviceKernel { launches, names }
            })
            .collect();
        Ok(DeviceModule { text, kernels })
    }
}

impl Backend for NvptxBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nvptx
    }

    fn text_stages(&self) -> &'static [&'static str] {
        &["llvm", "ptx"]
    }

    fn gpu(&self) -> Option<&dyn GpuBackend> {
        Some(self)
    }

    /// GPU kernels do not run in this process: see [`GpuBackend::load`]
    /// (and [`GpuBackend::emulate`]).
    fn jit(&self, _f: &LoopFunc, t: &Target) -> R<Code> {
        Err(CodegenError::Unsupported(format!("`{t}` kernels run on a GPU, not in this process")))
    }

    fn emit_text(&self, f: &LoopFunc, t: &Target, stage: &str) -> R<String> {
        match stage {
            "llvm" => {
                let launches = [launches_of(f, t)?];
                with_module(
                    t,
                    |cx, spec| ptx_module(cx, &[f], spec, &launches),
                    |m, _| Ok(m.print_to_string().to_string()),
                )
            }
            "ptx" => {
                let ptx = self.ptx(&[f], t)?;
                Ok(format!("{}{}", ptx.launch_comment(&[f]), ptx.text))
            }
            other => Err(CodegenError::Unsupported(format!("the NVPTX backend has no stage `{other}`"))),
        }
    }

    fn emit_object(&self, _f: &LoopFunc, t: &Target, _c: &CEntry) -> R<Vec<u8>> {
        Err(CodegenError::Unsupported(format!(
            "`{t}` code is PTX, not a CPU object: write `-o kernel.ptx` (or `-o kernel.cubin`)"
        )))
    }
}

impl GpuBackend for NvptxBackend {
    fn module(&self, fs: &[&LoopFunc], t: &Target) -> R<DeviceModule> {
        self.ptx(fs, t)
    }

    fn formats(&self) -> &'static [&'static str] {
        &["ptx", "cubin"]
    }

    /// PTX as it is; a cubin through `ptxas` for the target's `sm_NN`.
    fn encode(&self, text: &str, t: &Target, format: &str) -> R<Encoded> {
        match format {
            "ptx" => Ok(Encoded { bytes: text.as_bytes().to_vec(), notes: Vec::new() }),
            "cubin" => {
                // Kernels with `wgmma` are for sm_90a (see `sm90a`).
                let arch = if text.contains(".target sm_90a") { "a" } else { "" };
                let sm = format!("sm_{}{arch}", gpu_spec(t)?.sm);
                let (bytes, resources) = cuda::assemble(text, &sm).map_err(CodegenError::Unsupported)?;
                let notes = resources
                    .iter()
                    .flat_map(|r| {
                        let used = format!(
                            "{}: {} registers, {} bytes spill stores, {} bytes spill loads ({sm})",
                            r.kernel, r.registers, r.spill_stores, r.spill_loads
                        );
                        std::iter::once(used).chain(r.warnings.iter().map(|w| format!("{}: ptxas: {w}", r.kernel)))
                    })
                    .collect();
                Ok(Encoded { bytes, notes })
            }
            other => Err(CodegenError::Unsupported(format!("the NVPTX backend writes .ptx or .cubin, not .{other}"))),
        }
    }

    fn load(&self, f: &LoopFunc, t: &Target) -> R<Box<dyn DeviceCode>> {
        let device = texc_runtime::cuda::device().map_err(CodegenError::Unsupported)?;
        let want = gpu_spec(t)?.sm;
        if device.sm < want {
            return Err(CodegenError::Unsupported(format!(
                "this GPU ({}) is sm_{}, older than target `{t}` (sm_{want})",
                device.name, device.sm
            )));
        }
        let ptx = self.ptx(&[f], t)?;
        let k = &ptx.kernels[0];
        let dims = |d: [i64; 3]| d.map(|n| n as u32);
        let launches: Vec<texc_runtime::cuda::Launch> = k
            .names
            .iter()
            .zip(&k.launches)
            .map(|(name, l)| texc_runtime::cuda::Launch {
                kernel: name.clone(),
                grid: dims(l.grid),
                block: dims(l.block),
                dynamic_shared: l.dynamic_shared as u32,
            })
            .collect();
        let module = device.load(&ptx.text, &launches).map_err(CodegenError::Run)?;
        Ok(Box::new(CudaCode { device, module, tensors: crate::abi::used_tensors(f) }))
    }

    /// The block's threads run one after another: a warp's lanes meet in loops.
    fn emulate(&self, f: &LoopFunc, t: &Target) -> R<Code> {
        let launches = launches_of(f, t)?;
        let host = texc_compiler::target::lookup("host").map_err(|e| CodegenError::Backend(e.to_string()))?;
        super::gen::refuse_bf16_arithmetic(f)?;
        let mut f = f.clone();
        texc_schedules::cross_thread::warp_reductions_as_loops(&mut f);
        let f = &f;
        jit_module(f, host, |cx, spec| Gen::new(cx, f, spec).build_emulation(&launches))
    }
}

/// PTX whose kernels use `wgmma` (inline PTX: LLVM 19 has no intrinsic
/// for it) declares what that needs: PTX ISA 8.0 and the architecture-
/// specific `sm_90a` (wgmma is not in sm_90's forward-compatible set). The
/// rest of the module LLVM wrote for sm_90 is valid there unchanged.
fn sm90a(text: &str, t: &Target) -> R<String> {
    let (version, target) = (".version 7.8\n", ".target sm_90\n");
    if gpu_spec(t)?.sm != 90 || !text.contains(version) || !text.contains(target) {
        return Err(CodegenError::Unsupported(format!(
            "`wgmma` needs sm_90a (PTX ISA 8.0); target `{t}` writes another PTX header"
        )));
    }
    Ok(text.replacen(version, ".version 8.0\n", 1).replacen(target, ".target sm_90a\n", 1))
}

fn gpu_spec(t: &Target) -> R<texc_compiler::target::GpuSpec> {
    t.gpu.ok_or_else(|| CodegenError::Unsupported(format!("target `{t}` is not a GPU")))
}

/// NVPTX kernels loaded through the CUDA driver (`texc_runtime::cuda`).
struct CudaCode {
    device: &'static texc_runtime::cuda::Device,
    module: texc_runtime::cuda::Module,
    tensors: Vec<TensorId>,
}

impl DeviceCode for CudaCode {
    fn tensors(&self) -> &[TensorId] {
        &self.tensors
    }

    fn upload(&self, host: &[&[u8]]) -> R<DeviceBuffers> {
        self.device.upload(host).map(DeviceBuffers::new).map_err(CodegenError::Run)
    }

    fn launch(&self, bufs: &DeviceBuffers, scalars: &[(ElemType, u64)]) -> R<()> {
        let scalars: Vec<ScalarArg> = scalars.iter().map(|&(e, slot)| scalar_arg(e, slot)).collect();
        self.device.run(&self.module, bufs.get()?, &scalars).map_err(CodegenError::Run)
    }

    fn download(&self, bufs: &DeviceBuffers, i: usize, out: &mut [u8]) -> R<()> {
        self.device.download(bufs.get()?, i, out).map_err(CodegenError::Run)
    }

    unsafe fn launch_on(
        &self,
        tensors: &[TensorMemory],
        scalars: &[(ElemType, u64)],
        stream: u64,
        copies: &[(usize, u64, usize)],
    ) -> R<()> {
        let scalars: Vec<ScalarArg> = scalars.iter().map(|&(e, slot)| scalar_arg(e, slot)).collect();
        // SAFETY: the caller's promise (see the trait), passed on.
        unsafe { self.device.launch_on(&self.module, tensors, &scalars, stream, copies) }.map_err(CodegenError::Run)
    }
}

/// A scalar's 8-byte slot (see `abi`) as the kernel parameter of its type.
fn scalar_arg(e: ElemType, slot: u64) -> ScalarArg {
    let f = f64::from_bits(slot);
    match e {
        ElemType::F64 => ScalarArg::F64(f),
        ElemType::F32 => ScalarArg::F32(f as f32),
        ElemType::F16 => ScalarArg::B16(half::f16::from_f64(f).to_bits()),
        ElemType::BF16 => ScalarArg::B16(half::bf16::from_f64(f).to_bits()),
        ElemType::I64 => ScalarArg::I64(slot as i64),
        ElemType::I32 => ScalarArg::I32(slot as i64 as i32),
        ElemType::I8 | ElemType::U8 | ElemType::Bool => ScalarArg::B8(slot as i64 as u8),
    }
}
