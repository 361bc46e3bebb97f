//! The LLVM backend: loop IR to LLVM 19 IR (inkwell), optimized with
//! `default<O3>` for the target's CPU, JIT-compiled with MCJIT or written
//! as an object file.
//!
//! - Each kernel becomes the entry of [`crate::abi`], a thin wrapper that
//!   loads buffers and scalars and calls a *body* function whose parameters
//!   are the tensors (`noalias` pointers), the scalars and the loop
//!   variables it captures; LLVM's inliner turns `noalias` into alias scopes.
//! - Loops marked `vectorized` become explicit vector code, one lane per
//!   iteration; how each access is made follows the loop-IR access analysis
//!   (`texc_schedules::analysis`): contiguous vector loads and stores,
//!   broadcasts, wide masked loads plus a shuffle for strides 2–4, gathers
//!   and scatters otherwise; lane-uniform guards are branches, others masks.
//!   A load whose last register holds 3, 5, 6 or 7 elements of 4 or 8 bytes
//!   is a masked one (one instruction, not LLVM's pieces and inserts);
//!   masked bytes on AVX2, which LLVM expands lane by lane, test the mask
//!   first and load a whole vector where every lane is on.
//! - Loops marked `parallel` are outlined into tasks that the runtime's
//!   thread pool (`texc_parallel_for`) runs over chunks.
//! - `select`, `&&` and `||` evaluate only what they need where a branch
//!   reads memory (branches in scalar code, masks in vector code).
//!
//! Module layout: [`gen`] (functions, regions, entries), [`stmt`]
//! (statements and loops), [`memory`] (loads and stores), [`expr`]
//! (arithmetic, comparisons, selects, casts), [`math`] (built-in functions).

mod amx;
mod expr;
mod gen;
pub mod gpu;
mod math;
mod memory;
mod mma;
pub mod nvptx;
mod split;
mod stmt;
mod transpose;
mod wgmma;

use crate::abi::{self, CEntry};
use crate::backend::{Artifact, Backend, Code, Entry, EntryFn};
use crate::CodegenError;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target as LlTarget, TargetMachine, TargetTriple,
};
use inkwell::OptimizationLevel;
use std::sync::Once;
use texc_compiler::target::{BackendKind, LlvmCpu, Target};
use texc_schedules::LoopFunc;

type R<T> = Result<T, CodegenError>;

impl From<inkwell::builder::BuilderError> for CodegenError {
    fn from(e: inkwell::builder::BuilderError) -> Self {
        CodegenError::Backend(format!("LLVM: {e}"))
    }
}

fn llvm_err(e: impl std::fmt::Display) -> CodegenError {
    CodegenError::Backend(format!("LLVM: {e}"))
}

/// The LLVM backend (stateless: each call uses its own context).
pub struct LlvmBackend;

/// CPU name and feature string for LLVM.
pub(crate) struct CpuSpec {
    pub cpu: String,
    pub features: String,
    /// Whether every function keeps a frame pointer and realigns its frame
    /// to what its spill slots ask (`stackrealign`, on x86: 32 bytes for a
    /// spilled AVX vector): LLVM, which otherwise gives the frame pointer
    /// to the register allocator before it knows of any spill, can then
    /// no longer realign, and spills a vector register to a slot 16 bytes
    /// aligned, which may straddle two cache lines, and its reload then
    /// waits for the store instead of taking it forwarded. MEASURED (Zen 3,
    /// 1 thread, a grouped convolution's 4 × 3 block over channels blocked
    /// by eight, whose step spills three vectors): its parallel loop's task
    /// function ran at 12.9 GFLOP/s with its spills at `-96(%rsp)` from an
    /// rsp 16 bytes off a 32-byte boundary, the same loops compiled
    /// serially (another frame size) at 74.7; with the frame realigned,
    /// 60–84.
    pub realign_stack: bool,
}

fn cpu_spec(t: &Target) -> R<CpuSpec> {
    let llvm =
        t.llvm.as_ref().ok_or_else(|| CodegenError::Unsupported(format!("target `{t}` has no LLVM description")))?;
    let realign_stack = llvm.triple.starts_with("x86_64");
    Ok(match &llvm.cpu {
        LlvmCpu::Named { cpu, features } => {
            CpuSpec { cpu: cpu.to_string(), features: features.to_string(), realign_stack }
        }
        LlvmCpu::Host => CpuSpec {
            cpu: TargetMachine::get_host_cpu_name().to_string(),
            features: without_masked(&TargetMachine::get_host_cpu_features().to_string()),
            realign_stack,
        },
    })
}

/// Host features with those the process pretends to lack turned off
/// (`texc_compiler::target::masked_features`), and with them the features
/// that build on them: without AVX-512F, every `avx512*` (and the 512-bit
/// and AVX10 encodings); without AVX2, those and AVX2's own. Code reads
/// features from this string, so none may stay on.
fn without_masked(host: &str) -> String {
    let masked = texc_compiler::target::masked_features();
    let off = |f: &str| {
        let wide = f.starts_with("avx512") || f.starts_with("avx10") || f == "evex512";
        masked.iter().any(|m| {
            m == f || (wide && (m == "avx512f" || m == "avx2")) || (m == "avx2" && matches!(f, "avx2" | "avxvnni"))
        })
    };
    host.split(',')
        .map(|entry| match entry.strip_prefix('+') {
            Some(f) if off(f) => format!("-{f}"),
            _ => entry.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Initialize LLVM's targets (once per process).
fn init_targets() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        LlTarget::initialize_x86(&InitializationConfig::default());
        LlTarget::initialize_nvptx(&InitializationConfig::default());
    });
}

fn machine(t: &Target, spec: &CpuSpec) -> R<TargetMachine> {
    init_targets();
    let triple = TargetTriple::create(t.llvm.as_ref().expect("checked by cpu_spec").triple);
    let lt = LlTarget::from_triple(&triple).map_err(llvm_err)?;
    lt.create_target_machine(
        &triple,
        &spec.cpu,
        &spec.features,
        OptimizationLevel::Aggressive,
        RelocMode::PIC,
        CodeModel::Default,
    )
    .ok_or_else(|| llvm_err(format!("no target machine for {}", spec.cpu)))
}

/// Set the module's target, verify it and optimize it.
fn optimize(m: &Module, tm: &TargetMachine) -> R<()> {
    m.set_triple(&tm.get_triple());
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    m.verify().map_err(|e| llvm_err(format!("invalid module: {e}")))?;
    m.run_passes("default<O3>", tm, PassBuilderOptions::create()).map_err(llvm_err)
}

/// Build (with `build`) and optimize a kernel's module in a fresh context,
/// then hand it (with its target machine) to `then`.
fn with_module<T>(
    t: &Target,
    build: impl for<'c> FnOnce(&'c Context, &CpuSpec) -> R<Module<'c>>,
    then: impl FnOnce(&Module, &TargetMachine) -> R<T>,
) -> R<T> {
    let spec = cpu_spec(t)?;
    let tm = machine(t, &spec)?;
    let cx = Context::create();
    let m = build(&cx, &spec)?;
    optimize(&m, &tm)?;
    then(&m, &tm)
}

/// JIT-compile the module `build` makes for CPU target `t`; its entry is
/// `crate::abi`'s for `f`.
fn jit_module(f: &LoopFunc, t: &Target, build: impl for<'c> FnOnce(&'c Context, &CpuSpec) -> R<Module<'c>>) -> R<Code> {
    let spec = cpu_spec(t)?;
    let tm = machine(t, &spec)?;
    let cx = Box::new(Context::create());
    // SAFETY: the context is boxed (stable address) and outlives the
    // engine, which `Jitted::drop` releases first.
    let cx_ref: &'static Context = unsafe { &*(cx.as_ref() as *const Context) };
    let m = build(cx_ref, &spec)?;
    optimize(&m, &tm)?;
    let engine = m.create_jit_execution_engine(OptimizationLevel::Aggressive).map_err(llvm_err)?;
    if let Some(pf) = m.get_function(abi::PARALLEL_FOR) {
        engine.add_global_mapping(&pf, abi::runtime_parallel_for() as usize);
    }
    for (name, addr) in abi::runtime_local_memory() {
        if let Some(f) = m.get_function(name) {
            engine.add_global_mapping(&f, addr as usize);
        }
    }
    let addr = engine.get_function_address(&abi::entry_name(f)).map_err(llvm_err)?;
    // SAFETY: the entry function has exactly this signature (see `gen`).
    let entry: EntryFn = unsafe { std::mem::transmute::<usize, EntryFn>(addr) };
    Ok(Code { entry: Entry::One(entry), owner: Box::new(Jitted { engine: Some(engine), _cx: cx }), nests: None })
}

/// The JIT's code: the execution engine with the context it lives in.
struct Jitted {
    // Field order matters: the engine must drop before the context.
    engine: Option<ExecutionEngine<'static>>,
    _cx: Box<Context>,
}

impl Drop for Jitted {
    fn drop(&mut self) {
        self.engine.take();
    }
}

// SAFETY: the context and engine are owned by this value alone (the module
// was moved into the engine, nothing else refers to either) and are never
// used after construction except to be dropped, so moving them to another
// thread, or calling the compiled code from several, touches no LLVM state.
unsafe impl Send for Jitted {}
unsafe impl Sync for Jitted {}
impl Artifact for Jitted {}

impl Backend for LlvmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Llvm
    }

    fn text_stages(&self) -> &'static [&'static str] {
        &["llvm", "asm"]
    }

    fn jit(&self, f: &LoopFunc, t: &Target) -> R<Code> {
        // Several nests: compiled one by one, deduplicated, cached, in parallel.
        if let Some(nests) = split::extract_all(f) {
            gen::refuse_bf16_arithmetic(f)?;
            return split::jit_nests(nests, t);
        }
        jit_module(f, t, |cx, spec| gen::build_module(cx, f, spec, None))
    }

    fn emit_text(&self, f: &LoopFunc, t: &Target, stage: &str) -> R<String> {
        with_module(
            t,
            |cx, spec| gen::build_module(cx, f, spec, None),
            |m, tm| match stage {
                "llvm" => Ok(m.print_to_string().to_string()),
                "asm" => {
                    let buf = tm.write_to_memory_buffer(m, FileType::Assembly).map_err(llvm_err)?;
                    Ok(String::from_utf8_lossy(buf.as_slice()).to_string())
                }
                other => Err(CodegenError::Unsupported(format!("the LLVM backend has no stage `{other}`"))),
            },
        )
    }

    fn emit_object(&self, f: &LoopFunc, t: &Target, c: &CEntry) -> R<Vec<u8>> {
        with_module(
            t,
            |cx, spec| gen::build_module(cx, f, spec, Some(c)),
            |m, tm| {
                let buf = tm.write_to_memory_buffer(m, FileType::Object).map_err(llvm_err)?;
                Ok(buf.as_slice().to_vec())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// texc links LLVM's static libraries (`codegen/Cargo.toml`), so a
    /// process that builds LLVM IR maps no `libLLVM` shared object. Here,
    /// not in the suite: the suite's `mlir` build links LLVM's archives
    /// through mlir-sys whatever inkwell asks for, and would pass with
    /// inkwell back on the shared library.
    #[test]
    fn llvm_is_linked_in_not_loaded() {
        init_targets();
        let cx = Context::create();
        let m = cx.create_module("probe");
        let f = m.add_function("probe", cx.void_type().fn_type(&[], false), None);
        let b = cx.create_builder();
        b.position_at_end(cx.append_basic_block(f, "entry"));
        b.build_return(None).expect("a return");
        m.verify().expect("a valid module");
        let maps = std::fs::read_to_string("/proc/self/maps").expect("Linux has /proc/self/maps");
        let shared: Vec<&str> = maps.lines().filter(|l| l.contains("libLLVM")).collect();
        assert!(shared.is_empty(), "libLLVM is mapped as a shared library:\n{}", shared.join("\n"));
    }
}
