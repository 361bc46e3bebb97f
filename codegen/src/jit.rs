//! Target machines, the optimization pipeline, MCJIT, and calling compiled
//! kernels on runtime buffers.

use crate::emit::{build_module, ENTRY_PREFIX};
use crate::{CodegenError, TargetSpec};
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};
use inkwell::OptimizationLevel;
use std::collections::HashMap;
use std::sync::Once;
use std::time::{Duration, Instant};
use texc_compiler::interp::Arg;
use texc_compiler::tir::{ProgramParam, TensorId};
use texc_runtime::{AlignedBuf, Tensor};
use texc_schedules::LoopFunc;

fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        Target::initialize_x86(&InitializationConfig::default());
    });
}

fn spec(target: &str) -> Result<TargetSpec, CodegenError> {
    TargetSpec::get(target).ok_or_else(|| CodegenError::Unsupported(format!("`{target}` is not an x86 target")))
}

fn machine(spec: &TargetSpec) -> Result<TargetMachine, CodegenError> {
    init();
    let triple = TargetTriple::create("x86_64-unknown-linux-gnu");
    let t = Target::from_triple(&triple).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    t.create_target_machine(
        &triple,
        &spec.cpu,
        &spec.features,
        OptimizationLevel::Aggressive,
        RelocMode::PIC,
        CodeModel::Default,
    )
    .ok_or_else(|| CodegenError::Llvm(format!("no target machine for {}", spec.cpu)))
}

fn optimized<'ctx>(
    cx: &'ctx Context,
    f: &LoopFunc,
    spec: &TargetSpec,
    tm: &TargetMachine,
    aot: bool,
) -> Result<Module<'ctx>, CodegenError> {
    let m = build_module(cx, f, spec, aot)?;
    m.set_triple(&tm.get_triple());
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    m.verify().map_err(|e| CodegenError::Llvm(format!("invalid module: {e}")))?;
    m.run_passes("default<O3>", tm, PassBuilderOptions::create()).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    Ok(m)
}

/// Build and optimize a kernel's module in a fresh context, then hand it
/// (with its target machine) to `then`.
fn with_module<T>(
    f: &LoopFunc,
    target: &str,
    aot: bool,
    then: impl FnOnce(&Module, &TargetMachine) -> Result<T, CodegenError>,
) -> Result<T, CodegenError> {
    let spec = spec(target)?;
    let tm = machine(&spec)?;
    let cx = Context::create();
    let m = optimized(&cx, f, &spec, &tm, aot)?;
    then(&m, &tm)
}

/// Optimized LLVM IR of a kernel (`texc emit --stage llvm`).
pub fn emit_llvm(f: &LoopFunc, target: &str) -> Result<String, CodegenError> {
    with_module(f, target, false, |m, _| Ok(m.print_to_string().to_string()))
}

/// Assembly of a kernel (`texc emit --stage asm`).
pub fn emit_asm(f: &LoopFunc, target: &str) -> Result<String, CodegenError> {
    with_module(f, target, false, |m, tm| {
        let buf = tm.write_to_memory_buffer(m, FileType::Assembly).map_err(|e| CodegenError::Llvm(e.to_string()))?;
        Ok(String::from_utf8_lossy(buf.as_slice()).to_string())
    })
}

/// Write an object file with the kernel's `texc_<name>_run` entry (see `header`).
pub fn write_object(f: &LoopFunc, target: &str, path: &std::path::Path) -> Result<(), CodegenError> {
    with_module(f, target, true, |m, tm| {
        tm.write_to_file(m, FileType::Object, path).map_err(|e| CodegenError::Llvm(e.to_string()))
    })
}

type EntryFn = unsafe extern "C" fn(*const *mut u8, *const f64);

/// A JIT-compiled kernel. It owns its LLVM context (leaked for the life of
/// the process is avoided by keeping the engine and context together).
pub struct Compiled {
    // Field order matters: the engine must drop before the context.
    engine: Option<ExecutionEngine<'static>>,
    _cx: Box<Context>,
    entry: EntryFn,
    f: LoopFunc,
    /// Wall time spent in LLVM (building, optimizing, machine code).
    pub compile_time: Duration,
}

impl Drop for Compiled {
    fn drop(&mut self) {
        self.engine.take();
    }
}

/// JIT-compile a scheduled kernel for `target`.
pub fn compile(f: &LoopFunc, target: &str) -> Result<Compiled, CodegenError> {
    let start = Instant::now();
    let spec = spec(target)?;
    let tm = machine(&spec)?;
    let cx = Box::new(Context::create());
    // SAFETY: the context is boxed (stable address) and outlives the engine,
    // which `Compiled::drop` releases first.
    let cx_ref: &'static Context = unsafe { &*(cx.as_ref() as *const Context) };
    let m = optimized(cx_ref, f, &spec, &tm, false)?;
    let engine =
        m.create_jit_execution_engine(OptimizationLevel::Aggressive).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    if let Some(pf) = m.get_function("texc_parallel_for") {
        engine.add_global_mapping(&pf, texc_runtime::pool::texc_parallel_for as *const () as usize);
    }
    let name = format!("{ENTRY_PREFIX}{}", f.p.name);
    let addr = engine.get_function_address(&name).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    // SAFETY: the entry function has exactly this signature (see `emit`).
    let entry: EntryFn = unsafe { std::mem::transmute::<usize, EntryFn>(addr) };
    Ok(Compiled { engine: Some(engine), _cx: cx, entry, f: f.clone(), compile_time: start.elapsed() })
}

/// Buffers for one call: inputs copied in, outputs and temporaries zeroed.
pub struct Buffers {
    bufs: HashMap<TensorId, AlignedBuf>,
    ptrs: Vec<*mut u8>,
    scalars: Vec<f64>,
}

impl Compiled {
    /// Check and copy arguments (in parameter order) into aligned buffers.
    pub fn prepare(&self, args: Vec<Arg>) -> Result<Buffers, CodegenError> {
        let p = &self.f.p;
        if args.len() != p.params.len() {
            return Err(CodegenError::Run(format!("expected {} arguments, got {}", p.params.len(), args.len())));
        }
        let mut bufs = HashMap::new();
        let mut scalars = vec![0.0; p.scalars.len()];
        for (param, arg) in p.params.iter().zip(args) {
            match (param, arg) {
                (ProgramParam::Tensor(t), Arg::Tensor(x)) => {
                    texc_compiler::interp::check_tensor_arg(p.tensor(*t), &x)
                        .map_err(|e| CodegenError::Run(e.to_string()))?;
                    bufs.insert(*t, AlignedBuf::from_tensor(&x));
                }
                (ProgramParam::Scalar(s), Arg::Scalar(v)) => scalars[*s as usize] = v,
                _ => return Err(CodegenError::Run("a tensor and a scalar argument are swapped".into())),
            }
        }
        for t in p.outputs.iter().copied().chain(self.f.live_temps()) {
            let d = p.tensor(t);
            bufs.insert(t, AlignedBuf::zeroed(d.elem, d.shape.iter().map(|&s| s as usize).collect()));
        }
        let mut ptrs = vec![std::ptr::null_mut(); p.tensors.len()];
        for (t, b) in bufs.iter_mut() {
            ptrs[t.0 as usize] = b.as_mut_ptr();
        }
        Ok(Buffers { bufs, ptrs, scalars })
    }

    /// Run on prepared buffers (may be called repeatedly, e.g. by `bench`).
    pub fn call(&self, b: &mut Buffers) {
        // SAFETY: every tensor the kernel touches has a buffer of its declared
        // size (prepare), and the kernel stays inside them (bounds checking).
        unsafe { (self.entry)(b.ptrs.as_ptr(), b.scalars.as_ptr()) }
    }

    pub fn outputs(&self, b: &Buffers) -> Vec<Tensor> {
        self.f.p.outputs.iter().map(|t| b.bufs[t].to_tensor()).collect()
    }

    /// Prepare, call once, return the outputs.
    pub fn run(&self, args: Vec<Arg>) -> Result<Vec<Tensor>, CodegenError> {
        let mut b = self.prepare(args)?;
        self.call(&mut b);
        Ok(self.outputs(&b))
    }
}
