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
use crate::{cuda, CodegenError};
use inkwell::context::Context;
use inkwell::module::{FlagBehavior, Linkage, Module};
use inkwell::targets::FileType;
use std::fmt::Write;
use texc_compiler::target::{BackendKind, Target};
use texc_schedules::gpu::{self, Launch};
use texc_schedules::LoopFunc;

/// The NVPTX backend (stateless).
pub struct NvptxBackend;

/// A PTX module and how to launch its kernels.
pub struct Ptx {
    pub text: String,
    /// For each texc kernel compiled: its launches, and the kernel of each.
    pub kernels: Vec<PtxKernel>,
}

pub struct PtxKernel {
    pub launches: Vec<Launch>,
    pub names: Vec<String>,
}

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
    pub fn ptx(&self, fs: &[&LoopFunc], t: &Target) -> R<Ptx> {
        let launches = fs.iter().map(|f| launches_of(f, t)).collect::<R<Vec<_>>>()?;
        let text = with_module(
            t,
            |cx, spec| ptx_module(cx, fs, spec, &launches),
            |m, tm| {
                let buf = tm.write_to_memory_buffer(m, FileType::Assembly).map_err(llvm_err)?;
                Ok(String::from_utf8_lossy(buf.as_slice()).to_string())
            },
        )?;
        let kernels = fs
            .iter()
            .zip(launches)
            .map(|(f, launches)| {
                let names = (0..launches.len()).map(|i| super::gpu::kernel_name(f, i)).collect();
                PtxKernel { launches, names }
            })
            .collect();
        Ok(Ptx { text, kernels })
    }
}

impl Ptx {
    /// The launches as PTX comments: kernel, grid, block, parameters.
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

impl Backend for NvptxBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nvptx
    }

    fn text_stages(&self) -> &'static [&'static str] {
        &["llvm", "ptx"]
    }

    /// GPU kernels do not run in this process: see [`load`] (and [`emulate`]).
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

/// Run `f`'s GPU kernels on this CPU: each launch's blocks on the thread
/// pool, each block's threads in order (see [`super::gpu`]).
pub fn emulate(f: &LoopFunc, t: &Target) -> R<Code> {
    let launches = launches_of(f, t)?;
    let host = texc_compiler::target::lookup("host").map_err(|e| CodegenError::Backend(e.to_string()))?;
    super::gen::refuse_bf16_arithmetic(f)?;
    // The block's threads run one after another: a warp's lanes meet in loops.
    let mut f = f.clone();
    texc_schedules::cross_thread::warp_reductions_as_loops(&mut f);
    let f = &f;
    jit_module(f, host, |cx, spec| Gen::new(cx, f, spec).build_emulation(&launches))
}

/// Compile `f` to PTX and load it on this machine's GPU (see `texc_runtime::cuda`).
pub fn load(f: &LoopFunc, t: &Target) -> R<crate::backend::GpuCode> {
    let device = texc_runtime::cuda::device().map_err(CodegenError::Unsupported)?;
    let want = t.gpu.map_or(0, |g| g.sm);
    if device.sm < want {
        return Err(CodegenError::Unsupported(format!(
            "this GPU ({}) is sm_{}, older than target `{t}` (sm_{want})",
            device.name, device.sm
        )));
    }
    let ptx = NvptxBackend.ptx(&[f], t)?;
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
    Ok(crate::backend::GpuCode { device, module, tensors: crate::abi::used_tensors(f) })
}
