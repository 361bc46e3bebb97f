//! The Cranelift backend: the same legalized loop IR as LLVM, compiled by
//! Cranelift (0.135) for the CPU texc runs on — the quick-iteration target:
//! compiles are many times faster than LLVM's `-O3`, code is slower.
//!
//! - Functions: the entry of `crate::abi`, one task per parallel loop (run
//!   by the runtime's pool), and in objects the C entry and a weak serial
//!   pool — [`module`]. Statements and scalar code — [`func`].
//! - Vectorized loops use 128-bit SIMD where types and operations allow,
//!   and exact lane-by-lane scalar code elsewhere — [`vector`].
//! - Math functions Cranelift has no instruction for call the C library
//!   (`expf`, `tanhf`, ...); the JIT links texc's own — [`runtime`].
//! - In debug builds Cranelift's verifier checks every function.

mod func;
mod module;
mod runtime;
mod vector;

use crate::abi::{self, CEntry};
use crate::backend::{Artifact, Backend, Code, EntryFn};
use crate::CodegenError;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::default_libcall_names;
use cranelift_object::{ObjectBuilder, ObjectModule};
use module::Capture;
use texc_compiler::target::{BackendKind, Target};
use texc_schedules::LoopFunc;

type R<T> = Result<T, CodegenError>;

/// The Cranelift backend (stateless: each call builds its own module).
pub struct CraneliftBackend;

/// The host ISA with texc's settings; `pic` for objects.
fn isa(pic: bool) -> R<OwnedTargetIsa> {
    let err = |e: &dyn std::fmt::Display| CodegenError::Backend(format!("Cranelift: {e}"));
    let mut flags = settings::builder();
    let verify = if cfg!(debug_assertions) { "true" } else { "false" };
    for (k, v) in [
        ("opt_level", "speed"),
        ("is_pic", if pic { "true" } else { "false" }),
        ("use_colocated_libcalls", "false"),
        ("enable_verifier", verify),
    ] {
        flags.set(k, v).map_err(|e| err(&e))?;
    }
    let builder = cranelift_native::builder().map_err(|e| err(&e))?;
    builder.finish(settings::Flags::new(flags)).map_err(|e| err(&e))
}

fn jit_module() -> R<JITModule> {
    let mut b = JITBuilder::with_isa(isa(false)?, default_libcall_names());
    for s in runtime::symbols() {
        b.symbol(s.name, s.addr);
    }
    Ok(JITModule::new(b))
}

/// The JIT's code: the module owns the memory it lives in.
struct Jitted(Option<JITModule>);

impl Drop for Jitted {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            // SAFETY: the entry pointer dies with this value (`Code` owns both),
            // so no code of this module runs after it is freed.
            unsafe { m.free_memory() };
        }
    }
}

// SAFETY: the module is owned by this value alone and never touched after
// finalization except to free it; the finalized code is immutable, so it may
// be called from any thread and the value moved between threads.
unsafe impl Send for Jitted {}
unsafe impl Sync for Jitted {}
impl Artifact for Jitted {}

impl Backend for CraneliftBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cranelift
    }

    fn text_stages(&self) -> &'static [&'static str] {
        &["clif", "asm"]
    }

    fn jit(&self, f: &LoopFunc, _t: &Target) -> R<Code> {
        let mut m = jit_module()?;
        let (entry, _) = module::build(&mut m, f, None, Capture::Nothing)?;
        m.finalize_definitions().map_err(|e| CodegenError::Backend(format!("Cranelift: {e}")))?;
        let addr = m.get_finalized_function(entry);
        // SAFETY: the entry has exactly the signature of `abi` (see `module`).
        let entry: EntryFn = unsafe { std::mem::transmute::<*const u8, EntryFn>(addr) };
        Ok(Code { entry: crate::backend::Entry::One(entry), owner: Box::new(Jitted(Some(m))), nests: None })
    }

    fn emit_text(&self, f: &LoopFunc, _t: &Target, stage: &str) -> R<String> {
        let capture = match stage {
            "clif" => Capture::Clif,
            "asm" => Capture::Asm,
            other => return Err(CodegenError::Unsupported(format!("the Cranelift backend has no stage `{other}`"))),
        };
        let mut m = jit_module()?;
        let (_, texts) = module::build(&mut m, f, None, capture)?;
        // SAFETY: nothing of this module was finalized or run.
        unsafe { m.free_memory() };
        Ok(texts.join("\n"))
    }

    fn emit_object(&self, f: &LoopFunc, _t: &Target, c: &CEntry) -> R<Vec<u8>> {
        let builder = ObjectBuilder::new(isa(true)?, abi::entry_name(f), default_libcall_names())
            .map_err(|e| CodegenError::Backend(format!("Cranelift: {e}")))?;
        let mut m = ObjectModule::new(builder);
        module::build(&mut m, f, Some(c), Capture::Nothing)?;
        m.finish().emit().map_err(|e| CodegenError::Backend(format!("Cranelift: {e}")))
    }
}
