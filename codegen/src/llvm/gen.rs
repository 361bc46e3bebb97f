//! Functions of a kernel's module: the body and region functions, the
//! entry of `crate::abi`, the C entry of objects, and the helpers every
//! other part of the emitter uses (types, constants, intrinsics).

use super::{llvm_err, CpuSpec, R};
use crate::abi::{self, CEntry, CParam, CScalar};
use crate::CodegenError;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicTypeEnum, FunctionType, VectorType};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FunctionValue, IntValue, PointerValue, VectorValue};
use inkwell::AddressSpace;
use std::collections::HashMap;
use texc_compiler::tir::{TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_schedules::LoopFunc;

/// Where the values of a region come from.
#[derive(Clone)]
pub(super) struct Frame<'ctx> {
    pub func: FunctionValue<'ctx>,
    pub tensors: HashMap<TensorId, PointerValue<'ctx>>,
    pub scalars: Vec<BasicValueEnum<'ctx>>,
    pub vars: HashMap<VarId, IntValue<'ctx>>,
    /// Inside a reduction loop whose tensor-core accumulators are kept in
    /// registers ([`Resident`]).
    pub resident: Option<super::mma::Resident<'ctx>>,
    /// A stack slot holding the AMX tile configuration this call of the
    /// function last loaded (null: none, or unknown after a parallel loop,
    /// whose tasks may run on this thread): made by the first tile product.
    pub amx_config: Option<PointerValue<'ctx>>,
    /// Inside loops around an AMX tile product whose accumulators stay in
    /// tiles across them ([`Gen::resident_tile_dot`]): the product runs
    /// its steps alone.
    pub tiles_resident: bool,
    /// Registers that `wgmma` operations issued but not yet waited on write
    /// (`Gen::wgmma_wait`): read only by further operations until then.
    pub wgmma_pending: Vec<PointerValue<'ctx>>,
    /// Reads whose vectors an unrolled loop took as columns of a block
    /// transposed in registers ([`Gen::transposed_copies`]), for its
    /// current copy.
    pub transposed: HashMap<texc_compiler::tir::TExprId, BasicValueEnum<'ctx>>,
}

/// Scalar code, or vector code for loop `var` with `lanes` lanes under `mask`.
#[derive(Clone, Copy)]
pub(super) enum Mode<'ctx> {
    Scalar,
    Vector { var: VarId, base: i64, lanes: u32, mask: Option<VectorValue<'ctx>> },
}

impl<'ctx> Mode<'ctx> {
    pub fn lanes(self) -> Option<u32> {
        match self {
            Mode::Scalar => None,
            Mode::Vector { lanes, .. } => Some(lanes),
        }
    }

    pub fn with_mask(self, m: Option<VectorValue<'ctx>>) -> Mode<'ctx> {
        match self {
            Mode::Vector { var, base, lanes, .. } => Mode::Vector { var, base, lanes, mask: m },
            Mode::Scalar => Mode::Scalar,
        }
    }

    pub fn mask(self) -> Option<VectorValue<'ctx>> {
        match self {
            Mode::Vector { mask, .. } => mask,
            Mode::Scalar => None,
        }
    }
}

pub(super) struct Gen<'ctx, 'a> {
    pub cx: &'ctx Context,
    pub m: Module<'ctx>,
    pub b: Builder<'ctx>,
    pub f: &'a LoopFunc,
    pub spec: &'a CpuSpec,
    /// Tensors the entry receives (`abi::used_tensors`).
    pub used: Vec<TensorId>,
    /// Parallel regions outlined so far.
    pub tasks: u32,
    /// The GPU kernel being built (block and thread indices, block size).
    pub gpu: Option<super::gpu::GpuKernel<'ctx>>,
    /// The byte offsets of the kernel's shared buffers in its dynamic shared
    /// memory, when it has more than it may declare statically (else empty).
    pub dynamic_shared: std::collections::HashMap<TensorId, i64>,
    /// Math built-ins call CUDA's libdevice (code for an NVIDIA GPU).
    pub libdevice: bool,
    /// Local buffers taken from the heap (`LoopFunc::heap_locals`).
    pub heap: std::collections::BTreeSet<TensorId>,
    /// Each function's stack array for a local buffer, made once in its
    /// entry block (unrolled copies of a body share it).
    pub stack_arrays: std::collections::HashMap<(FunctionValue<'ctx>, TensorId), PointerValue<'ctx>>,
    /// The loop nests hold AMX tile products (`texc_schedules::ir::TileDot`).
    pub has_tile_dots: bool,
    /// Tensors a statement reads and stores in place
    /// (`texc_schedules::ir::updated_in_place`).
    pub updated_in_place: std::collections::BTreeSet<TensorId>,
    /// Shared buffers `wgmma` reads with the 128-byte swizzle
    /// (`texc_schedules::ir::swizzled_buffers`): every access goes through it.
    pub swizzled: std::collections::BTreeSet<TensorId>,
}

/// Build the LLVM module of a kernel. With a C entry `c` (objects), the
/// module also defines it and a weak, serial `texc_parallel_for` (a program
/// may link a real pool over it).
pub(super) fn build_module<'ctx>(
    cx: &'ctx Context,
    f: &LoopFunc,
    spec: &CpuSpec,
    c: Option<&CEntry>,
) -> R<Module<'ctx>> {
    refuse_bf16_arithmetic(f)?;
    Gen::new(cx, f, spec).build(c)
}

/// An error if `f` computes on bf16 values (every LLVM module checks this first).
pub(super) fn refuse_bf16_arithmetic(f: &LoopFunc) -> R<()> {
    match bf16_arithmetic(f) {
        Some(e) => Err(CodegenError::Unsupported(format!(
            "`{e}` computes on bf16 values: the LLVM backends do not support bf16 arithmetic yet (they load, store, \
             select and convert bf16): compute in f32 (`f32(x)`) and convert the result (`bf16(...)`)"
        ))),
        None => Ok(()),
    }
}

/// The first expression of `f` that computes on bf16 values (loads,
/// stores, selects and conversions of them are code-generated: bf16 is the
/// upper half of an f32, converted by rounding to nearest even).
fn bf16_arithmetic(f: &LoopFunc) -> Option<String> {
    use texc_compiler::tir::{TExpr, TExprId};
    use texc_schedules::ir::Stmt;
    fn expr(f: &LoopFunc, e: TExprId) -> Option<String> {
        let p = &f.p;
        let bf16 = |x: TExprId| p.ty(x) == Ty::Elem(ElemType::BF16);
        let moves = matches!(
            p.expr(e),
            TExpr::Load(..)
                | TExpr::Cast(_)
                | TExpr::Select(..)
                | TExpr::Var(_)
                | TExpr::Int(_)
                | TExpr::Float(_)
                | TExpr::Scalar(_)
        );
        if !moves && (bf16(e) || p.children(e).into_iter().any(bf16)) {
            return Some(texc_schedules::ir::expr(f, e));
        }
        p.children(e).into_iter().find_map(|c| expr(f, c))
    }
    fn stmts(f: &LoopFunc, body: &[Stmt]) -> Option<String> {
        body.iter().find_map(|s| match s {
            Stmt::For { body, .. } | Stmt::Alloc { body, .. } => stmts(f, body),
            Stmt::If { cond, then } => expr(f, *cond).or_else(|| stmts(f, then)),
            Stmt::Store { indices, value, .. } => indices.iter().chain([value]).find_map(|&e| expr(f, e)),
            Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => None,
        })
    }
    stmts(f, &f.body)
}

impl<'ctx, 'a> Gen<'ctx, 'a> {
    pub(super) fn new(cx: &'ctx Context, f: &'a LoopFunc, spec: &'a CpuSpec) -> Gen<'ctx, 'a> {
        Gen {
            cx,
            m: cx.create_module(&f.p.name),
            b: cx.create_builder(),
            f,
            spec,
            used: abi::used_tensors(f),
            tasks: 0,
            gpu: None,
            dynamic_shared: Default::default(),
            libdevice: false,
            heap: f.heap_locals(),
            stack_arrays: Default::default(),
            has_tile_dots: texc_schedules::ir::has_tile_dots(f),
            updated_in_place: texc_schedules::ir::updated_in_place(f),
            swizzled: texc_schedules::ir::swizzled_buffers(f),
        }
    }
}

impl<'ctx> Gen<'ctx, '_> {
    fn build(mut self, c: Option<&CEntry>) -> R<Module<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        // The runtime's pool, mapped into the JIT by the backend.
        let pf = self.m.add_function(
            abi::PARALLEL_FOR,
            self.cx.void_type().fn_type(&[ptr.into(), ptr.into(), i64t.into()], false),
            Some(Linkage::External),
        );
        // The body of the whole kernel: no captured loop variables.
        let body = self.region_fn("texc_body", &[], &[], false)?;
        {
            let mut fr = self.frame_from_params(body, &[], &[]);
            let entry = self.cx.append_basic_block(body, "entry");
            self.b.position_at_end(entry);
            self.stmts(&mut fr, &self.f.body.clone(), Mode::Scalar)?;
            self.b.build_return(None)?;
        }
        let entry = self.entry(body)?;
        if let Some(c) = c {
            self.serial_pool(pf)?;
            self.weak_local_memory()?;
            self.c_entry(c, entry)?;
        }
        Ok(self.m)
    }

    /// The module's function `name`, declared external with type `ty` on first use.
    pub(super) fn external(&self, name: &str, ty: FunctionType<'ctx>) -> FunctionValue<'ctx> {
        self.m.get_function(name).unwrap_or_else(|| self.m.add_function(name, ty, Some(Linkage::External)))
    }

    /// C's `aligned_alloc` and `free`.
    fn libc_memory(&self) -> (FunctionValue<'ctx>, FunctionValue<'ctx>) {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let alloc = self.external("aligned_alloc", ptr.fn_type(&[i64t.into(), i64t.into()], false));
        let free = self.external("free", self.cx.void_type().fn_type(&[ptr.into()], false));
        (alloc, free)
    }

    /// Objects whose code takes heap locals define `abi::LOCAL_ALLOC` and
    /// `abi::LOCAL_FREE` weakly: `aligned_alloc` of the size rounded up to
    /// 64 bytes (`abort` when it fails: a loop cannot go on without its
    /// buffer, and the header says how to supply an allocator of one's own)
    /// and `free`.
    fn weak_local_memory(&self) -> R<()> {
        let Some(local_alloc) = self.m.get_function(abi::LOCAL_ALLOC) else { return Ok(()) };
        let local_free = self.m.get_function(abi::LOCAL_FREE).expect("declared with texc_local_alloc");
        let (alloc, free) = self.libc_memory();
        let i64t = self.cx.i64_type();
        let abort = self.external("abort", self.cx.void_type().fn_type(&[], false));
        local_alloc.set_linkage(Linkage::WeakAny);
        let bb = self.cx.append_basic_block(local_alloc, "entry");
        let failed = self.cx.append_basic_block(local_alloc, "failed");
        let done = self.cx.append_basic_block(local_alloc, "done");
        self.b.position_at_end(bb);
        let bytes = local_alloc.get_nth_param(0).expect("bytes").into_int_value();
        let up = self.b.build_int_add(bytes, i64t.const_int(63, false), "up")?;
        let size = self.b.build_and(up, i64t.const_int(!63u64, false), "size")?;
        let p = self.call(alloc, &[i64t.const_int(64, false).into(), size.into()])?.into_pointer_value();
        let null = self.b.build_is_null(p, "null")?;
        self.b.build_conditional_branch(null, failed, done)?;
        self.b.position_at_end(failed);
        self.b.build_call(abort, &[], "")?;
        self.b.build_unreachable()?;
        self.b.position_at_end(done);
        self.b.build_return(Some(&p))?;
        local_free.set_linkage(Linkage::WeakAny);
        let bb = self.cx.append_basic_block(local_free, "entry");
        self.b.position_at_end(bb);
        let q = local_free.get_nth_param(0).expect("p");
        self.b.build_call(free, &[q.into()], "")?;
        self.b.build_return(None)?;
        Ok(())
    }

    /// The entry of `abi`: unpack the buffer and scalar arrays, call the body.
    pub(super) fn entry(&self, body: FunctionValue<'ctx>) -> R<FunctionValue<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let entry = self.m.add_function(
            &abi::entry_name(self.f),
            self.cx.void_type().fn_type(&[ptr.into(), ptr.into()], false),
            None,
        );
        self.attrs(entry);
        let bb = self.cx.append_basic_block(entry, "entry");
        self.b.position_at_end(bb);
        let bufs = entry.get_nth_param(0).expect("param").into_pointer_value();
        let scal = entry.get_nth_param(1).expect("param").into_pointer_value();
        let mut args: Vec<BasicMetadataValueEnum> = Vec::new();
        for &t in &self.used {
            let slot = self.gep(ptr.into(), bufs, i64t.const_int(t.0 as u64, false))?;
            args.push(self.b.build_load(ptr, slot, "buf")?.into());
        }
        for (s, decl) in self.f.p.scalars.iter().enumerate() {
            let slot_ty: BasicTypeEnum =
                if abi::float_slot(decl.elem) { self.cx.f64_type().into() } else { i64t.into() };
            let slot = self.gep(i64t.into(), scal, i64t.const_int(s as u64, false))?;
            let v = self.b.build_load(slot_ty, slot, "scalar")?;
            args.push(self.convert_scalar(v, decl.elem)?.into());
        }
        self.b.build_call(body, &args, "")?;
        self.b.build_return(None)?;
        Ok(entry)
    }

    /// `texc_parallel_for(task, ctx, n)` as one call `task(ctx, 0, n)`, weak.
    fn serial_pool(&self, pf: FunctionValue<'ctx>) -> R<()> {
        let i64t = self.cx.i64_type();
        let ptr = self.cx.ptr_type(AddressSpace::default());
        pf.set_linkage(Linkage::WeakAny);
        self.attrs(pf);
        let bb = self.cx.append_basic_block(pf, "entry");
        self.b.position_at_end(bb);
        let task = pf.get_nth_param(0).expect("task").into_pointer_value();
        let ctx = pf.get_nth_param(1).expect("ctx");
        let n = pf.get_nth_param(2).expect("n");
        let fty = self.cx.void_type().fn_type(&[ptr.into(), i64t.into(), i64t.into()], false);
        self.b.build_indirect_call(fty, task, &[ctx.into(), i64t.const_zero().into(), n.into()], "")?;
        self.b.build_return(None)?;
        Ok(())
    }

    fn c_scalar_ty(&self, t: CScalar) -> BasicTypeEnum<'ctx> {
        match t {
            CScalar::F32 => self.cx.f32_type().into(),
            CScalar::F64 => self.cx.f64_type().into(),
            CScalar::I8 | CScalar::U8 => self.cx.i8_type().into(),
            CScalar::I32 => self.cx.i32_type().into(),
            CScalar::I64 => self.cx.i64_type().into(),
        }
    }

    /// The C entry described by `c` (see `abi`): check pointers, allocate
    /// temporaries, fill the arrays, call the entry, free.
    fn c_entry(&self, c: &CEntry, entry: FunctionValue<'ctx>) -> R<()> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let (i32t, i64t, f64t) = (self.cx.i32_type(), self.cx.i64_type(), self.cx.f64_type());
        let params: Vec<BasicMetadataTypeEnum> = c
            .params
            .iter()
            .map(|p| match p {
                CParam::Tensor { .. } => ptr.into(),
                CParam::Scalar { ty, .. } => self.c_scalar_ty(*ty).into(),
            })
            .collect();
        let f = self.m.add_function(&c.name, i32t.fn_type(&params, false), None);
        self.attrs(f);
        let (alloc, free) = self.libc_memory();
        let start = self.cx.append_basic_block(f, "entry");
        let null_bb = self.cx.append_basic_block(f, "null_argument");
        let fill = self.cx.append_basic_block(f, "fill");
        let oom = self.cx.append_basic_block(f, "no_memory");
        let run = self.cx.append_basic_block(f, "run");
        self.b.position_at_end(start);
        let mut any_null = self.cx.bool_type().const_zero();
        for (k, p) in c.params.iter().enumerate() {
            if let CParam::Tensor { .. } = p {
                let v = f.get_nth_param(k as u32).expect("param").into_pointer_value();
                let is_null = self.b.build_is_null(v, "isnull")?;
                any_null = self.b.build_or(any_null, is_null, "anynull")?;
            }
        }
        self.b.build_conditional_branch(any_null, null_bb, fill)?;
        self.b.position_at_end(null_bb);
        self.b.build_return(Some(&i32t.const_int(abi::STATUS_NULL as u64, false)))?;
        self.b.position_at_end(fill);
        let bufs = self.b.build_alloca(ptr.array_type(c.n_tensors.max(1) as u32), "bufs")?;
        let slots = self.b.build_alloca(i64t.array_type(c.n_scalars.max(1) as u32), "scalars")?;
        for (k, p) in c.params.iter().enumerate() {
            let v = f.get_nth_param(k as u32).expect("param");
            match p {
                CParam::Tensor { t, .. } => {
                    let at = self.gep(ptr.into(), bufs, i64t.const_int(t.0 as u64, false))?;
                    self.b.build_store(at, v)?;
                }
                CParam::Scalar { s, ty } => {
                    let at = self.gep(i64t.into(), slots, i64t.const_int(*s as u64, false))?;
                    let slot: BasicValueEnum = match ty {
                        CScalar::F32 => self.b.build_float_ext(v.into_float_value(), f64t, "f64")?.into(),
                        CScalar::F64 => v,
                        _ if ty.is_signed() => {
                            self.b.build_int_s_extend_or_bit_cast(v.into_int_value(), i64t, "i64")?.into()
                        }
                        _ => self.b.build_int_z_extend_or_bit_cast(v.into_int_value(), i64t, "i64")?.into(),
                    };
                    self.b.build_store(at, slot)?;
                }
            }
        }
        // One arena for every temporary, at the offsets of the memory plan.
        let mut arena = None;
        let mut failed = self.cx.bool_type().const_zero();
        if !c.temps.is_empty() {
            let size = i64t.const_int(c.arena_bytes, false);
            let mem = self.call(alloc, &[i64t.const_int(64, false).into(), size.into()])?.into_pointer_value();
            failed = self.b.build_is_null(mem, "nomem")?;
            for &(t, offset) in &c.temps {
                let p = self.gep(self.cx.i8_type().into(), mem, i64t.const_int(offset, false))?;
                let at = self.gep(ptr.into(), bufs, i64t.const_int(t.0 as u64, false))?;
                self.b.build_store(at, p)?;
            }
            arena = Some(mem);
        }
        self.b.build_conditional_branch(failed, oom, run)?;
        self.b.position_at_end(oom);
        self.b.build_return(Some(&i32t.const_int(abi::STATUS_NO_MEMORY as u64, false)))?;
        self.b.position_at_end(run);
        self.b.build_call(entry, &[bufs.into(), slots.into()], "")?;
        if let Some(m) = arena {
            self.b.build_call(free, &[m.into()], "")?;
        }
        self.b.build_return(Some(&i32t.const_int(abi::STATUS_OK as u64, false)))?;
        Ok(())
    }

    pub(super) fn attrs(&self, f: FunctionValue<'ctx>) {
        f.add_attribute(AttributeLoc::Function, self.cx.create_string_attribute("target-cpu", &self.spec.cpu));
        f.add_attribute(
            AttributeLoc::Function,
            self.cx.create_string_attribute("target-features", &self.spec.features),
        );
        f.add_attribute(AttributeLoc::Function, self.enum_attr("nounwind"));
        if self.spec.realign_stack {
            f.add_attribute(AttributeLoc::Function, self.cx.create_string_attribute("stackrealign", ""));
        }
    }

    pub(super) fn enum_attr(&self, name: &str) -> Attribute {
        self.cx.create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0)
    }

    /// A function taking the tensors (noalias), scalars, `vars`, the buffers
    /// `locals` of enclosing attached stages, and optionally `lo, hi`.
    pub(super) fn region_fn(
        &mut self,
        name: &str,
        vars: &[VarId],
        locals: &[TensorId],
        range: bool,
    ) -> R<FunctionValue<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = self.used.iter().map(|_| ptr.into()).collect();
        for s in &self.f.p.scalars {
            params.push(self.scalar_ty(Ty::Elem(s.elem)).into());
        }
        for _ in vars {
            params.push(self.cx.i64_type().into());
        }
        for _ in locals {
            params.push(ptr.into());
        }
        if range {
            params.push(self.cx.i64_type().into());
            params.push(self.cx.i64_type().into());
        }
        let f = self.m.add_function(name, self.cx.void_type().fn_type(&params, false), Some(Linkage::Internal));
        self.attrs(f);
        for i in 0..self.used.len() {
            f.add_attribute(AttributeLoc::Param(i as u32), self.enum_attr("noalias"));
        }
        Ok(f)
    }

    pub(super) fn frame_from_params(
        &self,
        func: FunctionValue<'ctx>,
        vars: &[VarId],
        locals: &[TensorId],
    ) -> Frame<'ctx> {
        let mut k = 0;
        let mut next = || {
            k += 1;
            func.get_nth_param(k - 1).expect("param")
        };
        let mut tensors: HashMap<TensorId, PointerValue<'ctx>> =
            self.used.iter().map(|&t| (t, next().into_pointer_value())).collect();
        let scalars = self.f.p.scalars.iter().map(|_| next()).collect();
        let vars = vars.iter().map(|&v| (v, next().into_int_value())).collect();
        tensors.extend(locals.iter().map(|&t| (t, next().into_pointer_value())));
        Frame {
            func,
            tensors,
            scalars,
            vars,
            resident: None,
            amx_config: None,
            tiles_resident: false,
            wgmma_pending: Vec::new(),
            transposed: HashMap::new(),
        }
    }

    /// A scalar's slot (an f64 or an i64, see `abi`) converted to its element type.
    pub(super) fn convert_scalar(&self, v: BasicValueEnum<'ctx>, e: ElemType) -> R<BasicValueEnum<'ctx>> {
        let from = if abi::float_slot(e) { ElemType::F64 } else { ElemType::I64 };
        self.cast(v, Ty::Elem(from), Ty::Elem(e), None)
    }

    // ------------------------------------------------------------ types

    pub(super) fn scalar_ty(&self, t: Ty) -> BasicTypeEnum<'ctx> {
        match t {
            Ty::Index => self.cx.i64_type().into(),
            Ty::Elem(e) => match e {
                ElemType::F16 => self.cx.f16_type().into(),
                ElemType::BF16 => self.cx.i16_type().into(),
                ElemType::F32 => self.cx.f32_type().into(),
                ElemType::F64 => self.cx.f64_type().into(),
                ElemType::I8 | ElemType::U8 => self.cx.i8_type().into(),
                ElemType::I32 => self.cx.i32_type().into(),
                ElemType::I64 => self.cx.i64_type().into(),
                ElemType::Bool => self.cx.bool_type().into(),
            },
        }
    }

    pub(super) fn mem_ty(&self, e: ElemType) -> BasicTypeEnum<'ctx> {
        if e == ElemType::Bool {
            self.cx.i8_type().into()
        } else {
            self.scalar_ty(Ty::Elem(e))
        }
    }

    pub(super) fn vec_ty(&self, t: BasicTypeEnum<'ctx>, lanes: u32) -> VectorType<'ctx> {
        match t {
            BasicTypeEnum::IntType(i) => i.vec_type(lanes),
            BasicTypeEnum::FloatType(f) => f.vec_type(lanes),
            BasicTypeEnum::PointerType(p) => p.vec_type(lanes),
            _ => unreachable!("only scalars are vectorized"),
        }
    }

    pub(super) fn ty_in(&self, t: Ty, mode: Mode<'ctx>) -> BasicTypeEnum<'ctx> {
        let s = self.scalar_ty(t);
        match mode.lanes() {
            Some(l) => self.vec_ty(s, l).into(),
            None => s,
        }
    }

    // ------------------------------------------------------------ helpers

    pub(super) fn gep(
        &self,
        elem: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
        i: IntValue<'ctx>,
    ) -> R<PointerValue<'ctx>> {
        // SAFETY: indices are proven in bounds by the front end's bounds checker.
        Ok(unsafe { self.b.build_in_bounds_gep(elem, p, &[i], "addr")? })
    }

    pub(super) fn intrinsic(&self, name: &str, tys: &[BasicTypeEnum<'ctx>]) -> R<FunctionValue<'ctx>> {
        Intrinsic::find(name)
            .and_then(|i| i.get_declaration(&self.m, tys))
            .ok_or_else(|| llvm_err(format!("no intrinsic {name}")))
    }

    pub(super) fn call(&self, f: FunctionValue<'ctx>, args: &[BasicValueEnum<'ctx>]) -> R<BasicValueEnum<'ctx>> {
        let a: Vec<BasicMetadataValueEnum> = args.iter().map(|&x| x.into()).collect();
        match self.b.build_call(f, &a, "call")?.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v),
            inkwell::values::ValueKind::Instruction(_) => Err(llvm_err("call returned void")),
        }
    }

    pub(super) fn splat(&self, v: BasicValueEnum<'ctx>, lanes: u32) -> R<VectorValue<'ctx>> {
        let vt = self.vec_ty(v.get_type(), lanes);
        let zero = self.cx.i32_type().const_zero();
        let one = self.b.build_insert_element(vt.get_poison(), v, zero, "ins")?;
        let mask = self.cx.i32_type().vec_type(lanes).const_zero();
        Ok(self.b.build_shuffle_vector(one, vt.get_poison(), mask, "splat")?)
    }

    pub(super) fn const_of(&self, t: Ty, int: i64, float: f64, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let s: BasicValueEnum = match self.scalar_ty(t) {
            // bf16 is stored as its bits.
            BasicTypeEnum::IntType(it) if t == Ty::Elem(ElemType::BF16) => {
                it.const_int(half::bf16::from_f64(float).to_bits() as u64, false).into()
            }
            BasicTypeEnum::FloatType(ft) => ft.const_float(float).into(),
            BasicTypeEnum::IntType(it) => it.const_int(int as u64, true).into(),
            _ => unreachable!(),
        };
        match mode.lanes() {
            Some(l) => Ok(VectorType::const_vector(&vec![s; l as usize]).into()),
            None => Ok(s),
        }
    }

    pub(super) fn true_mask(&self, lanes: u32) -> VectorValue<'ctx> {
        VectorType::const_vector(&vec![self.cx.bool_type().const_all_ones(); lanes as usize])
    }
}
