//! The functions of a kernel's Cranelift module — the entry of
//! `crate::abi`, parallel tasks, and for objects the C entry and a weak
//! serial `texc_parallel_for` — for any `cranelift_module::Module` (the JIT's
//! or an object file's).

use super::func::{reg_ty, FnGen};
use super::runtime::HALF_HELPERS;
use super::R;
use crate::abi::{self, CEntry, CParam, CScalar};
use crate::CodegenError;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    types, AbiParam, Function, InstBuilder, Signature, StackSlotData, StackSlotKind, Type, UserFuncName, Value,
};
use cranelift_codegen::isa::CallConv;
use cranelift_codegen::Context;
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{FuncId, Linkage, Module};
use std::collections::HashMap;
use texc_compiler::tir::{TensorId, Ty};
use texc_compiler::types::ElemType;
use texc_schedules::LoopFunc;

/// What text to keep of each function defined.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Capture {
    Nothing,
    /// Cranelift IR as built.
    Clif,
    /// The machine code (Cranelift's VCode listing).
    Asm,
}

pub(super) struct ModuleCx<'m, M: Module> {
    pub module: &'m mut M,
    pub f: &'m LoopFunc,
    pub ptr: Type,
    pub call_conv: CallConv,
    /// Tensors the entry receives.
    pub used: Vec<TensorId>,
    /// Local buffers taken from the heap (`LoopFunc::heap_locals`).
    pub heap: std::collections::BTreeSet<TensorId>,
    /// Objects define `texc_parallel_for` themselves (weakly); the JIT imports the runtime's.
    object: bool,
    imports: HashMap<&'static str, FuncId>,
    tasks: u32,
    capture: Capture,
    pub texts: Vec<String>,
}

impl<'m, M: Module> ModuleCx<'m, M> {
    fn signature(&self, params: &[Type], ret: Option<Type>) -> Signature {
        let mut sig = Signature::new(self.call_conv);
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.extend(ret.map(AbiParam::new));
        sig
    }

    /// A function defined elsewhere (libm, the runtime), declared once.
    pub fn import(&mut self, name: &'static str, params: &[Type], ret: Option<Type>) -> R<FuncId> {
        if let Some(&id) = self.imports.get(name) {
            return Ok(id);
        }
        let sig = self.signature(params, ret);
        let id = self.module.declare_function(name, Linkage::Import, &sig).map_err(module_err)?;
        self.imports.insert(name, id);
        Ok(id)
    }

    /// `texc_parallel_for(task, ctx, n)`.
    pub fn parallel_for(&mut self) -> R<FuncId> {
        if let Some(&id) = self.imports.get(abi::PARALLEL_FOR) {
            return Ok(id);
        }
        let sig = self.signature(&[self.ptr, self.ptr, types::I64], None);
        let linkage = if self.object { Linkage::Preemptible } else { Linkage::Import };
        let id = self.module.declare_function(abi::PARALLEL_FOR, linkage, &sig).map_err(module_err)?;
        self.imports.insert(abi::PARALLEL_FOR, id);
        Ok(id)
    }

    /// `abi::LOCAL_ALLOC` and `abi::LOCAL_FREE`: the runtime's in the JIT,
    /// defined weakly in objects ([`define_weak_local_memory`]).
    pub fn local_memory(&mut self) -> R<(FuncId, FuncId)> {
        let linkage = if self.object { Linkage::Preemptible } else { Linkage::Import };
        let declare = |cx: &mut Self, name: &'static str, params: &[Type], ret: Option<Type>| -> R<FuncId> {
            if let Some(&id) = cx.imports.get(name) {
                return Ok(id);
            }
            let sig = cx.signature(params, ret);
            let id = cx.module.declare_function(name, linkage, &sig).map_err(module_err)?;
            cx.imports.insert(name, id);
            Ok(id)
        };
        let alloc = declare(self, abi::LOCAL_ALLOC, &[types::I64], Some(self.ptr))?;
        let free = declare(self, abi::LOCAL_FREE, &[self.ptr], None)?;
        Ok((alloc, free))
    }

    /// A fresh parallel task `(ctx, lo, hi)`.
    pub fn task_id(&mut self) -> R<FuncId> {
        self.tasks += 1;
        let sig = self.signature(&[self.ptr, types::I64, types::I64], None);
        let name = format!("texc_{}_task{}", self.f.p.name, self.tasks);
        self.module.declare_function(&name, Linkage::Local, &sig).map_err(module_err)
    }

    /// Compile and define a function, keeping its text if asked.
    pub fn define(&mut self, id: FuncId, func: Function) -> R<()> {
        let name = self.module.declarations().get_function_decl(id).linkage_name(id).to_string();
        if self.capture == Capture::Clif {
            self.texts.push(format!("; {name}\n{}", func.display()));
        }
        let mut ctx = Context::for_function(func);
        ctx.set_disasm(self.capture == Capture::Asm);
        self.module
            .define_function(id, &mut ctx)
            .map_err(|e| CodegenError::Backend(format!("Cranelift: {name}: {}", describe(&e))))?;
        if self.capture == Capture::Asm {
            let code = ctx.compiled_code().and_then(|c| c.vcode.clone()).unwrap_or_default();
            self.texts.push(format!("; {name}\n{code}"));
        }
        Ok(())
    }
}

fn module_err(e: cranelift_module::ModuleError) -> CodegenError {
    CodegenError::Backend(format!("Cranelift: {}", describe(&e)))
}

fn describe(e: &cranelift_module::ModuleError) -> String {
    match e {
        cranelift_module::ModuleError::Compilation(c) => format!("{c:?}"),
        other => other.to_string(),
    }
}

/// Define every function of kernel `f` in `module`; with `c`, also the C
/// entry and the weak pool (objects). Returns the entry and captured texts.
pub(super) fn build<M: Module>(
    module: &mut M,
    f: &LoopFunc,
    c: Option<&CEntry>,
    capture: Capture,
) -> R<(FuncId, Vec<String>)> {
    if let Some(t) = f.p.tensors.iter().find(|t| t.elem == ElemType::BF16) {
        return Err(CodegenError::Unsupported(format!(
            "`{}` is bf16, which the Cranelift backend does not support yet",
            t.name
        )));
    }
    let half =
        f.p.tensors.iter().any(|t| t.elem == ElemType::F16) || f.p.scalars.iter().any(|s| s.elem == ElemType::F16);
    if c.is_some() && half {
        return Err(CodegenError::Unsupported(format!(
            "f16 in Cranelift objects: they would call texc's own conversion helpers ({}); compile with an LLVM target",
            HALF_HELPERS.join(", ")
        )));
    }
    let ptr = module.target_config().pointer_type();
    let call_conv = module.isa().default_call_conv();
    let mut cx = ModuleCx {
        module,
        f,
        ptr,
        call_conv,
        used: abi::used_tensors(f),
        heap: f.heap_locals(),
        object: c.is_some(),
        imports: HashMap::new(),
        tasks: 0,
        capture,
        texts: Vec::new(),
    };
    let entry = define_entry(&mut cx)?;
    if let Some(c) = c {
        define_serial_pool(&mut cx)?;
        if cx.imports.contains_key(abi::LOCAL_ALLOC) {
            define_weak_local_memory(&mut cx)?;
        }
        define_c_entry(&mut cx, c, entry)?;
    }
    Ok((entry, cx.texts))
}

/// `texc_<k>(bufs, slots)`: load buffers and scalars, run the body.
fn define_entry<M: Module>(cx: &mut ModuleCx<M>) -> R<FuncId> {
    let sig = cx.signature(&[cx.ptr, cx.ptr], None);
    let id = cx.module.declare_function(&abi::entry_name(cx.f), Linkage::Export, &sig).map_err(module_err)?;
    let mut func = Function::with_name_signature(UserFuncName::user(0, id.as_u32()), sig);
    let mut fbc = FunctionBuilderContext::new();
    {
        let f = cx.f;
        let mut g = FnGen::new(cx, &mut func, &mut fbc);
        let block = g.b.create_block();
        g.b.append_block_params_for_function_params(block);
        g.b.switch_to_block(block);
        let (bufs, slots) = (g.b.block_params(block)[0], g.b.block_params(block)[1]);
        let ptr = g.ptr();
        for t in g.cx.used.clone() {
            let p = g.b.ins().load(ptr, super::func::flags(), bufs, 8 * t.0 as i32);
            g.tensors.insert(t, p);
        }
        for (s, decl) in f.p.scalars.iter().enumerate() {
            let from = if abi::float_slot(decl.elem) { ElemType::F64 } else { ElemType::I64 };
            let raw = g.b.ins().load(reg_ty(Ty::Elem(from)), super::func::flags(), slots, 8 * s as i32);
            let v = g.cast_v(raw, Ty::Elem(from), Ty::Elem(decl.elem))?;
            g.scalars.push(v);
        }
        g.stmts(&f.body)?;
        g.b.ins().return_(&[]);
        g.finish();
    }
    cx.define(id, func)?;
    Ok(id)
}

/// Define function `id` (signature `sig`): `body` fills its one block from
/// the block's parameters and returns.
fn define_simple<M: Module>(
    cx: &mut ModuleCx<M>,
    id: FuncId,
    sig: Signature,
    body: impl FnOnce(&mut FnGen<'_, '_, M>, &[Value]),
) -> R<()> {
    let mut func = Function::with_name_signature(UserFuncName::user(0, id.as_u32()), sig);
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut g = FnGen::new(cx, &mut func, &mut fbc);
        let block = g.b.create_block();
        g.b.append_block_params_for_function_params(block);
        g.b.switch_to_block(block);
        let params = g.b.block_params(block).to_vec();
        body(&mut g, &params);
        g.finish();
    }
    cx.define(id, func)
}

/// `texc_parallel_for(task, ctx, n)` as `task(ctx, 0, n)`, preemptible (weak).
fn define_serial_pool<M: Module>(cx: &mut ModuleCx<M>) -> R<()> {
    let id = cx.parallel_for()?;
    let sig = cx.signature(&[cx.ptr, cx.ptr, types::I64], None);
    let task_sig = cx.signature(&[cx.ptr, types::I64, types::I64], None);
    define_simple(cx, id, sig, |g, params| {
        let [task, ctx, n] = [params[0], params[1], params[2]];
        let sr = g.b.import_signature(task_sig);
        let zero = g.iconst(types::I64, 0);
        g.b.ins().call_indirect(sr, task, &[ctx, zero, n]);
        g.b.ins().return_(&[]);
    })
}

/// `texc_local_alloc(n)` as `aligned_alloc(64, n rounded up to 64)`,
/// calling `abort` when that fails, and `texc_local_free(p)` as `free(p)`;
/// preemptible (weak), like the serial pool.
fn define_weak_local_memory<M: Module>(cx: &mut ModuleCx<M>) -> R<()> {
    let (alloc_id, free_id) = cx.local_memory()?;
    let aligned_alloc = cx.import("aligned_alloc", &[types::I64, types::I64], Some(cx.ptr))?;
    let free = cx.import("free", &[cx.ptr], None)?;
    let abort = cx.import("abort", &[], None)?;
    let sig = cx.signature(&[types::I64], Some(cx.ptr));
    define_simple(cx, alloc_id, sig, |g, params| {
        let up = g.b.ins().iadd_imm_u(params[0], 63);
        let size = g.b.ins().band_imm_s(up, -64);
        let align = g.iconst(types::I64, 64);
        let fr = g.fref(aligned_alloc);
        let inst = g.b.ins().call(fr, &[align, size]);
        let p = g.b.inst_results(inst)[0];
        let (failed, done) = (g.b.create_block(), g.b.create_block());
        g.b.ins().brif(p, done, &[], failed, &[]);
        g.b.switch_to_block(failed);
        let fr = g.fref(abort);
        g.b.ins().call(fr, &[]);
        g.b.ins().trap(cranelift_codegen::ir::TrapCode::unwrap_user(1));
        g.b.switch_to_block(done);
        g.b.ins().return_(&[p]);
    })?;
    let sig = cx.signature(&[cx.ptr], None);
    define_simple(cx, free_id, sig, |g, params| {
        let fr = g.fref(free);
        g.b.ins().call(fr, &[params[0]]);
        g.b.ins().return_(&[]);
    })
}

/// The typed C entry of `abi::CEntry`.
fn define_c_entry<M: Module>(cx: &mut ModuleCx<M>, c: &CEntry, entry: FuncId) -> R<()> {
    let params: Vec<Type> = c
        .params
        .iter()
        .map(|p| match p {
            CParam::Tensor { .. } => cx.ptr,
            CParam::Scalar { ty, .. } => c_scalar(*ty),
        })
        .collect();
    let sig = cx.signature(&params, Some(types::I32));
    let id = cx.module.declare_function(&c.name, Linkage::Export, &sig).map_err(module_err)?;
    let alloc = cx.import("aligned_alloc", &[types::I64, types::I64], Some(cx.ptr))?;
    let free = cx.import("free", &[cx.ptr], None)?;
    let mut func = Function::with_name_signature(UserFuncName::user(0, id.as_u32()), sig);
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut g = FnGen::new(cx, &mut func, &mut fbc);
        let block = g.b.create_block();
        g.b.append_block_params_for_function_params(block);
        g.b.switch_to_block(block);
        let args: Vec<_> = g.b.block_params(block).to_vec();
        let ret = |g: &mut FnGen<M>, code: i32| {
            let v = g.iconst(types::I32, code as i64);
            g.b.ins().return_(&[v]);
        };
        // NULL pointers: status 2.
        let mut any_null = g.iconst(types::I8, 0);
        for (p, &v) in c.params.iter().zip(&args) {
            if let CParam::Tensor { .. } = p {
                let null = g.b.ins().icmp_imm_s(IntCC::Equal, v, 0);
                any_null = g.b.ins().bor(any_null, null);
            }
        }
        let (null_b, fill) = (g.b.create_block(), g.b.create_block());
        g.b.ins().brif(any_null, null_b, &[], fill, &[]);
        g.b.switch_to_block(null_b);
        ret(&mut g, abi::STATUS_NULL);
        g.b.switch_to_block(fill);
        let ptr = g.ptr();
        let bufs = g.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            8 * c.n_tensors.max(1) as u32,
            3,
        ));
        let slots = g.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            8 * c.n_scalars.max(1) as u32,
            3,
        ));
        for (p, &v) in c.params.iter().zip(&args) {
            match p {
                CParam::Tensor { t, .. } => {
                    g.b.ins().stack_store(ptr, v, bufs, 8 * t.0 as i32);
                }
                CParam::Scalar { s, ty } => {
                    let slot = match ty {
                        CScalar::F32 => g.b.ins().fpromote(types::F64, v),
                        CScalar::F64 | CScalar::I64 => v,
                        _ if ty.is_signed() => g.b.ins().sextend(types::I64, v),
                        _ => g.b.ins().uextend(types::I64, v),
                    };
                    g.b.ins().stack_store(ptr, slot, slots, 8 * *s as i32);
                }
            }
        }
        // One arena for every temporary, at the offsets of the memory plan.
        let alloc_ref = g.fref(alloc);
        let free_ref = g.fref(free);
        let mut arena = None;
        let mut failed = g.iconst(types::I8, 0);
        if !c.temps.is_empty() {
            let align = g.iconst(types::I64, 64);
            let size = g.iconst(types::I64, c.arena_bytes as i64);
            let call = g.b.ins().call(alloc_ref, &[align, size]);
            let mem = g.b.inst_results(call)[0];
            failed = g.b.ins().icmp_imm_s(IntCC::Equal, mem, 0);
            for &(t, offset) in &c.temps {
                let p = g.b.ins().iadd_imm_s(mem, offset as i64);
                g.b.ins().stack_store(ptr, p, bufs, 8 * t.0 as i32);
            }
            arena = Some(mem);
        }
        let (oom, run) = (g.b.create_block(), g.b.create_block());
        g.b.ins().brif(failed, oom, &[], run, &[]);
        g.b.switch_to_block(oom);
        ret(&mut g, abi::STATUS_NO_MEMORY);
        g.b.switch_to_block(run);
        let bufs_addr = g.b.ins().stack_addr(ptr, bufs, 0);
        let slots_addr = g.b.ins().stack_addr(ptr, slots, 0);
        let entry_ref = g.fref(entry);
        g.b.ins().call(entry_ref, &[bufs_addr, slots_addr]);
        if let Some(m) = arena {
            g.b.ins().call(free_ref, &[m]);
        }
        ret(&mut g, abi::STATUS_OK);
        g.finish();
    }
    cx.define(id, func)
}

fn c_scalar(t: CScalar) -> Type {
    match t {
        CScalar::F32 => types::F32,
        CScalar::F64 => types::F64,
        CScalar::I8 | CScalar::U8 => types::I8,
        CScalar::I32 => types::I32,
        CScalar::I64 => types::I64,
    }
}
