//! Loop IR to LLVM IR.
//!
//! Every kernel has a *body function* per region of code (the whole kernel,
//! and each parallel loop) whose parameters are the tensors (`noalias`
//! pointers), the scalars, and the loop variables it captures. Thin wrappers
//! load those from the entry's argument arrays or from a task's context, so
//! LLVM's inliner turns `noalias` into alias scopes everywhere.

use crate::{CodegenError, TargetSpec};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicType, BasicTypeEnum, VectorType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FunctionValue, IntValue, PointerValue, VectorValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};
use std::collections::HashMap;
use texc_compiler::resolve::Builtin;
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_grammar::ast::{BinOp, UnOp};
use texc_schedules::ir::{ForKind, LoopFunc, Stmt};

pub const ENTRY_PREFIX: &str = "texc_";

type R<T> = Result<T, CodegenError>;

/// Where the values of a region come from.
#[derive(Clone)]
struct Frame<'ctx> {
    func: FunctionValue<'ctx>,
    tensors: HashMap<TensorId, PointerValue<'ctx>>,
    scalars: Vec<BasicValueEnum<'ctx>>,
    vars: HashMap<VarId, IntValue<'ctx>>,
}

/// Scalar code, or vector code for loop `var` with `lanes` lanes under `mask`.
#[derive(Clone, Copy)]
enum Mode<'ctx> {
    Scalar,
    Vector { var: VarId, base: i64, lanes: u32, mask: Option<VectorValue<'ctx>> },
}

impl<'ctx> Mode<'ctx> {
    fn lanes(self) -> Option<u32> {
        match self {
            Mode::Scalar => None,
            Mode::Vector { lanes, .. } => Some(lanes),
        }
    }

    fn with_mask(self, m: Option<VectorValue<'ctx>>) -> Mode<'ctx> {
        match self {
            Mode::Vector { var, base, lanes, .. } => Mode::Vector { var, base, lanes, mask: m },
            Mode::Scalar => Mode::Scalar,
        }
    }

    fn mask(self) -> Option<VectorValue<'ctx>> {
        match self {
            Mode::Vector { mask, .. } => mask,
            Mode::Scalar => None,
        }
    }
}

struct Gen<'ctx, 'a> {
    cx: &'ctx Context,
    m: Module<'ctx>,
    b: Builder<'ctx>,
    f: &'a LoopFunc,
    spec: &'a TargetSpec,
    used: Vec<TensorId>,
    tasks: u32,
}

/// Build the LLVM module of a kernel. With `aot`, the module also defines a
/// serial, weak `texc_parallel_for` (a program may link a real pool over it)
/// and `int texc_<name>_run(...)`, the typed entry of the C header, which
/// allocates temporaries itself.
pub fn build_module<'ctx>(cx: &'ctx Context, f: &LoopFunc, spec: &TargetSpec, aot: bool) -> R<Module<'ctx>> {
    if let Some(t) = f.p.tensors.iter().find(|t| t.elem == ElemType::BF16) {
        return Err(CodegenError::Unsupported(format!(
            "`{}` is bf16, which the x86 backend does not support yet",
            t.name
        )));
    }
    let mut used: Vec<TensorId> =
        f.p.input_tensors().chain(f.p.outputs.iter().copied()).chain(f.live_temps()).collect();
    used.sort();
    used.dedup();
    let g = Gen { cx, m: cx.create_module(&f.p.name), b: cx.create_builder(), f, spec, used, tasks: 0 };
    g.build(aot)
}

fn bool_ty(t: Ty) -> bool {
    t == Ty::Elem(ElemType::Bool)
}

fn float_ty(t: Ty) -> bool {
    matches!(t, Ty::Elem(e) if e.is_float())
}

fn unsigned_ty(t: Ty) -> bool {
    t == Ty::Elem(ElemType::U8)
}

impl<'ctx> Gen<'ctx, '_> {
    fn build(mut self, aot: bool) -> R<Module<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        // The runtime's pool, mapped into the JIT by `jit::compile`.
        let pf = self.m.add_function(
            "texc_parallel_for",
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
        // Entry wrapper: unpack the argument arrays, call the body.
        let name = format!("{ENTRY_PREFIX}{}", self.f.p.name);
        let entry = self.m.add_function(&name, self.cx.void_type().fn_type(&[ptr.into(), ptr.into()], false), None);
        self.attrs(entry);
        let bb = self.cx.append_basic_block(entry, "entry");
        self.b.position_at_end(bb);
        let bufs = entry.get_nth_param(0).expect("param").into_pointer_value();
        let scal = entry.get_nth_param(1).expect("param").into_pointer_value();
        let mut args: Vec<BasicMetadataValueEnum> = Vec::new();
        for &t in &self.used.clone() {
            let slot = self.gep(ptr.into(), bufs, i64t.const_int(t.0 as u64, false))?;
            args.push(self.b.build_load(ptr, slot, "buf")?.into());
        }
        for (s, decl) in self.f.p.scalars.iter().enumerate() {
            let slot = self.gep(self.cx.f64_type().into(), scal, i64t.const_int(s as u64, false))?;
            let v = self.b.build_load(self.cx.f64_type(), slot, "scalar")?;
            args.push(self.convert_scalar(v, decl.elem)?.into());
        }
        self.b.build_call(body, &args, "")?;
        self.b.build_return(None)?;
        if aot {
            self.serial_pool(pf)?;
            self.typed_entry(body)?;
        }
        Ok(self.m)
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

    /// `int texc_<name>_run(inputs and scalars in order, then outputs)`:
    /// allocates the temporaries (64-byte aligned), runs, frees; returns 1
    /// if memory ran out.
    fn typed_entry(&self, body: FunctionValue<'ctx>) -> R<()> {
        use texc_compiler::tir::ProgramParam;
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let i32t = self.cx.i32_type();
        let p = &self.f.p;
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = Vec::new();
        for prm in &p.params {
            params.push(match prm {
                ProgramParam::Tensor(_) => ptr.into(),
                ProgramParam::Scalar(s) => self.c_scalar_ty(p.scalars[*s as usize].elem).into(),
            });
        }
        params.extend(p.outputs.iter().map(|_| inkwell::types::BasicMetadataTypeEnum::from(ptr)));
        let f = self.m.add_function(&format!("{ENTRY_PREFIX}{}_run", p.name), i32t.fn_type(&params, false), None);
        self.attrs(f);
        let alloc = self.m.add_function(
            "aligned_alloc",
            ptr.fn_type(&[i64t.into(), i64t.into()], false),
            Some(Linkage::External),
        );
        let free =
            self.m.add_function("free", self.cx.void_type().fn_type(&[ptr.into()], false), Some(Linkage::External));
        let bb = self.cx.append_basic_block(f, "entry");
        let oom = self.cx.append_basic_block(f, "oom");
        self.b.position_at_end(bb);
        let mut tensors: HashMap<TensorId, PointerValue> = HashMap::new();
        let mut scalars: Vec<BasicValueEnum> = vec![i64t.const_zero().into(); p.scalars.len()];
        let mut k = 0u32;
        for prm in &p.params {
            let v = f.get_nth_param(k).expect("param");
            k += 1;
            match prm {
                ProgramParam::Tensor(t) => {
                    tensors.insert(*t, v.into_pointer_value());
                }
                ProgramParam::Scalar(s) => {
                    let e = p.scalars[*s as usize].elem;
                    scalars[*s as usize] = if e == ElemType::Bool {
                        self.b
                            .build_int_compare(
                                IntPredicate::NE,
                                v.into_int_value(),
                                self.cx.i8_type().const_zero(),
                                "b",
                            )?
                            .into()
                    } else {
                        v
                    };
                }
            }
        }
        for t in &p.outputs {
            tensors.insert(*t, f.get_nth_param(k).expect("output").into_pointer_value());
            k += 1;
        }
        let temps = self.f.live_temps();
        let mut allocated = Vec::new();
        for t in &temps {
            let d = p.tensor(*t);
            let bytes = ((d.len() as u64 * d.elem.size() as u64).max(1)).div_ceil(64) * 64;
            let mem = self
                .call(alloc, &[i64t.const_int(64, false).into(), i64t.const_int(bytes, false).into()])?
                .into_pointer_value();
            let null = self.b.build_is_null(mem, "null")?;
            let next = self.cx.append_basic_block(f, "allocated");
            self.b.build_conditional_branch(null, oom, next)?;
            self.b.position_at_end(next);
            tensors.insert(*t, mem);
            allocated.push(mem);
        }
        let mut args: Vec<BasicMetadataValueEnum> = self.used.iter().map(|t| tensors[t].into()).collect();
        args.extend(scalars.iter().map(|&v| BasicMetadataValueEnum::from(v)));
        self.b.build_call(body, &args, "")?;
        for m in &allocated {
            self.b.build_call(free, &[(*m).into()], "")?;
        }
        self.b.build_return(Some(&i32t.const_zero()))?;
        // Out of memory: earlier allocations leak only if a later one fails; free them all
        // (free(NULL) is a no-op, and unallocated ones are never reached here).
        self.b.position_at_end(oom);
        self.b.build_return(Some(&i32t.const_int(1, false)))?;
        Ok(())
    }

    /// C argument type of a scalar (bool is passed as a byte).
    fn c_scalar_ty(&self, e: ElemType) -> BasicTypeEnum<'ctx> {
        if e == ElemType::Bool {
            self.cx.i8_type().into()
        } else {
            self.scalar_ty(Ty::Elem(e))
        }
    }

    fn attrs(&self, f: FunctionValue<'ctx>) {
        f.add_attribute(AttributeLoc::Function, self.cx.create_string_attribute("target-cpu", &self.spec.cpu));
        f.add_attribute(
            AttributeLoc::Function,
            self.cx.create_string_attribute("target-features", &self.spec.features),
        );
        f.add_attribute(AttributeLoc::Function, self.enum_attr("nounwind"));
    }

    fn enum_attr(&self, name: &str) -> Attribute {
        self.cx.create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0)
    }

    /// A function taking the tensors (noalias), scalars, `vars`, the buffers
    /// `locals` of enclosing attached stages, and optionally `lo, hi`.
    fn region_fn(&mut self, name: &str, vars: &[VarId], locals: &[TensorId], range: bool) -> R<FunctionValue<'ctx>> {
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

    fn frame_from_params(&self, func: FunctionValue<'ctx>, vars: &[VarId], locals: &[TensorId]) -> Frame<'ctx> {
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
        Frame { func, tensors, scalars, vars }
    }

    fn convert_scalar(&self, v: BasicValueEnum<'ctx>, e: ElemType) -> R<BasicValueEnum<'ctx>> {
        self.cast(v, Ty::Elem(ElemType::F64), Ty::Elem(e), None)
    }

    // ------------------------------------------------------------ types

    fn scalar_ty(&self, t: Ty) -> BasicTypeEnum<'ctx> {
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

    fn mem_ty(&self, e: ElemType) -> BasicTypeEnum<'ctx> {
        if e == ElemType::Bool {
            self.cx.i8_type().into()
        } else {
            self.scalar_ty(Ty::Elem(e))
        }
    }

    fn vec_ty(&self, t: BasicTypeEnum<'ctx>, lanes: u32) -> VectorType<'ctx> {
        match t {
            BasicTypeEnum::IntType(i) => i.vec_type(lanes),
            BasicTypeEnum::FloatType(f) => f.vec_type(lanes),
            BasicTypeEnum::PointerType(p) => p.vec_type(lanes),
            _ => unreachable!("only scalars are vectorized"),
        }
    }

    fn ty_in(&self, t: Ty, mode: Mode<'ctx>) -> BasicTypeEnum<'ctx> {
        let s = self.scalar_ty(t);
        match mode.lanes() {
            Some(l) => self.vec_ty(s, l).into(),
            None => s,
        }
    }

    // ------------------------------------------------------------ helpers

    fn gep(&self, elem: BasicTypeEnum<'ctx>, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        // SAFETY: indices are proven in bounds by the front end's bounds checker.
        Ok(unsafe { self.b.build_in_bounds_gep(elem, p, &[i], "addr")? })
    }

    fn intrinsic(&self, name: &str, tys: &[BasicTypeEnum<'ctx>]) -> R<FunctionValue<'ctx>> {
        Intrinsic::find(name)
            .and_then(|i| i.get_declaration(&self.m, tys))
            .ok_or_else(|| CodegenError::Llvm(format!("no intrinsic {name}")))
    }

    fn call(&self, f: FunctionValue<'ctx>, args: &[BasicValueEnum<'ctx>]) -> R<BasicValueEnum<'ctx>> {
        let a: Vec<BasicMetadataValueEnum> = args.iter().map(|&x| x.into()).collect();
        match self.b.build_call(f, &a, "call")?.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v),
            inkwell::values::ValueKind::Instruction(_) => Err(CodegenError::Llvm("call returned void".into())),
        }
    }

    fn splat(&self, v: BasicValueEnum<'ctx>, lanes: u32) -> R<VectorValue<'ctx>> {
        let vt = self.vec_ty(v.get_type(), lanes);
        let zero = self.cx.i32_type().const_zero();
        let one = self.b.build_insert_element(vt.get_poison(), v, zero, "ins")?;
        let mask = self.cx.i32_type().vec_type(lanes).const_zero();
        Ok(self.b.build_shuffle_vector(one, vt.get_poison(), mask, "splat")?)
    }

    fn const_of(&self, t: Ty, int: i64, float: f64, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let s: BasicValueEnum = match self.scalar_ty(t) {
            BasicTypeEnum::FloatType(ft) => ft.const_float(float).into(),
            BasicTypeEnum::IntType(it) => it.const_int(int as u64, true).into(),
            _ => unreachable!(),
        };
        match mode.lanes() {
            Some(l) => Ok(VectorType::const_vector(&vec![s; l as usize]).into()),
            None => Ok(s),
        }
    }

    fn true_mask(&self, lanes: u32) -> VectorValue<'ctx> {
        VectorType::const_vector(&vec![self.cx.bool_type().const_all_ones(); lanes as usize])
    }

    // ------------------------------------------------------------ statements

    fn stmts(&mut self, fr: &mut Frame<'ctx>, body: &[Stmt], mode: Mode<'ctx>) -> R<()> {
        for s in body {
            self.stmt(fr, s, mode)?;
        }
        Ok(())
    }

    fn stmt(&mut self, fr: &mut Frame<'ctx>, s: &Stmt, mode: Mode<'ctx>) -> R<()> {
        match s {
            Stmt::For { var, lo, extent, kind, body } => {
                if let Mode::Vector { .. } = mode {
                    return Err(CodegenError::Unsupported("a loop inside a vectorized loop".into()));
                }
                let int = |v: i64| self.cx.i64_type().const_int(v as u64, true);
                match kind {
                    ForKind::Vectorized if *extent > 1 => {
                        let lanes = *extent as u32;
                        self.stmts(fr, body, Mode::Vector { var: *var, base: *lo, lanes, mask: None })
                    }
                    ForKind::Unrolled if *extent <= 64 => {
                        for k in *lo..*lo + *extent {
                            fr.vars.insert(*var, int(k));
                            self.stmts(fr, body, mode)?;
                        }
                        Ok(())
                    }
                    ForKind::Parallel if *extent > 1 => self.parallel(fr, *var, *lo, *extent, body),
                    _ => self.serial_loop(fr, *var, int(*lo), int(*lo + *extent), body),
                }
            }
            Stmt::If { cond, then } => match mode {
                // A guard that is the same in every lane (it does not involve the
                // vector loop) is a branch around vector code, not a mask on it.
                Mode::Vector { var, .. }
                    if lin_coeff(&self.f.p, *cond, var) == Some(0) && !reads_memory(&self.f.p, *cond) =>
                {
                    self.guarded(fr, *cond, then, mode)
                }
                Mode::Scalar => self.guarded(fr, *cond, then, mode),
                Mode::Vector { .. } => {
                    let c = self.expr(fr, *cond, mode)?.into_vector_value();
                    let m = self.and_mask(mode.mask(), c)?;
                    self.stmts(fr, then, mode.with_mask(Some(m)))
                }
            },
            Stmt::Store { tensor, indices, value } => {
                let v = self.expr(fr, *value, mode)?;
                self.store(fr, *tensor, indices, v, mode)
            }
            Stmt::Alloc { tensor, body } => {
                // A stack array in the function's entry block: private to each
                // task, and promoted to registers by SROA when indices are constant.
                let d = self.f.p.tensor(*tensor);
                let ty = self.mem_ty(d.elem).array_type(d.len().max(1) as u32);
                let p = self.entry_alloca(fr.func, ty.into())?;
                p.as_instruction().expect("alloca").set_alignment(64).map_err(|e| CodegenError::Llvm(e.to_string()))?;
                fr.tensors.insert(*tensor, p);
                let r = self.stmts(fr, body, mode);
                fr.tensors.remove(tensor);
                r
            }
        }
    }

    /// `if cond: then` as a branch; `cond` is evaluated as a scalar.
    fn guarded(&mut self, fr: &mut Frame<'ctx>, cond: TExprId, then: &[Stmt], mode: Mode<'ctx>) -> R<()> {
        let c = self.expr(fr, cond, Mode::Scalar)?.into_int_value();
        let then_bb = self.cx.append_basic_block(fr.func, "then");
        let merge = self.cx.append_basic_block(fr.func, "endif");
        self.b.build_conditional_branch(c, then_bb, merge)?;
        self.b.position_at_end(then_bb);
        self.stmts(fr, then, mode)?;
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(merge);
        Ok(())
    }

    fn serial_loop(
        &mut self,
        fr: &mut Frame<'ctx>,
        var: VarId,
        lo: IntValue<'ctx>,
        hi: IntValue<'ctx>,
        body: &[Stmt],
    ) -> R<()> {
        let i64t = self.cx.i64_type();
        let pre = self.b.get_insert_block().expect("positioned");
        let header = self.cx.append_basic_block(fr.func, "loop");
        let body_bb = self.cx.append_basic_block(fr.func, "body");
        let exit = self.cx.append_basic_block(fr.func, "exit");
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(header);
        let phi = self.b.build_phi(i64t, &self.f.vars[var as usize].name)?;
        let i = phi.as_basic_value().into_int_value();
        let c = self.b.build_int_compare(IntPredicate::SLT, i, hi, "cond")?;
        self.b.build_conditional_branch(c, body_bb, exit)?;
        self.b.position_at_end(body_bb);
        fr.vars.insert(var, i);
        self.stmts(fr, body, Mode::Scalar)?;
        let next = self.b.build_int_add(i, i64t.const_int(1, false), "next")?;
        let end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(header)?;
        phi.add_incoming(&[(&lo, pre), (&next, end)]);
        self.b.position_at_end(exit);
        fr.vars.remove(&var);
        Ok(())
    }

    /// Outline `for var in 0..n parallel: body` into a task run by the pool.
    fn parallel(&mut self, fr: &mut Frame<'ctx>, var: VarId, base: i64, n: i64, body: &[Stmt]) -> R<()> {
        let i64t = self.cx.i64_type();
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let mut captured: Vec<VarId> = fr.vars.keys().copied().collect();
        captured.sort_unstable();
        // Buffers of attached stages computed before this loop, read inside it.
        let mut locals: Vec<TensorId> = fr.tensors.keys().copied().filter(|t| !self.used.contains(t)).collect();
        locals.sort_unstable();
        self.tasks += 1;
        let id = self.tasks;
        // The region: (tensors, scalars, captured vars, locals, lo, hi).
        let region = self.region_fn(&format!("texc_region{id}"), &captured, &locals, true)?;
        let saved = self.b.get_insert_block().expect("positioned");
        {
            let mut rf = self.frame_from_params(region, &captured, &locals);
            let k = self.used.len() + self.f.p.scalars.len() + captured.len() + locals.len();
            let lo = region.get_nth_param(k as u32).expect("lo").into_int_value();
            let hi = region.get_nth_param(k as u32 + 1).expect("hi").into_int_value();
            let bb = self.cx.append_basic_block(region, "entry");
            self.b.position_at_end(bb);
            let off = i64t.const_int(base as u64, true);
            let lo = self.b.build_int_add(lo, off, "lo")?;
            let hi = self.b.build_int_add(hi, off, "hi")?;
            self.serial_loop(&mut rf, var, lo, hi, body)?;
            self.b.build_return(None)?;
        }
        // The task: unpack the context, call the region.
        let task = self.m.add_function(
            &format!("texc_task{id}"),
            self.cx.void_type().fn_type(&[ptr.into(), i64t.into(), i64t.into()], false),
            Some(Linkage::Internal),
        );
        self.attrs(task);
        let slots = self.used.len() + self.f.p.scalars.len() + captured.len() + locals.len();
        let slot_ty = i64t.array_type(slots.max(1) as u32);
        {
            let bb = self.cx.append_basic_block(task, "entry");
            self.b.position_at_end(bb);
            let ctx = task.get_nth_param(0).expect("ctx").into_pointer_value();
            let mut args: Vec<BasicMetadataValueEnum> = Vec::new();
            let tys: Vec<BasicTypeEnum> = self.slot_types(&captured, locals.len());
            for (k, ty) in tys.iter().enumerate() {
                let slot = self.gep(i64t.into(), ctx, i64t.const_int(k as u64, false))?;
                args.push(self.b.build_load(*ty, slot, "cap")?.into());
            }
            args.push(task.get_nth_param(1).expect("lo").into());
            args.push(task.get_nth_param(2).expect("hi").into());
            self.b.build_call(region, &args, "")?;
            self.b.build_return(None)?;
        }
        // At the loop: fill a context and hand the task to the pool.
        self.b.position_at_end(saved);
        let ctx = self.entry_alloca(fr.func, slot_ty.into())?;
        let mut values: Vec<BasicValueEnum> = self.used.iter().map(|t| fr.tensors[t].as_basic_value_enum()).collect();
        values.extend(fr.scalars.iter().copied());
        values.extend(captured.iter().map(|v| fr.vars[v].as_basic_value_enum()));
        values.extend(locals.iter().map(|t| fr.tensors[t].as_basic_value_enum()));
        for (k, v) in values.iter().enumerate() {
            let slot = self.gep(i64t.into(), ctx, i64t.const_int(k as u64, false))?;
            self.b.build_store(slot, *v)?;
        }
        let pf = self.m.get_function("texc_parallel_for").expect("declared");
        let task_ptr = task.as_global_value().as_pointer_value();
        self.b.build_call(pf, &[task_ptr.into(), ctx.into(), i64t.const_int(n as u64, false).into()], "")?;
        Ok(())
    }

    fn slot_types(&self, captured: &[VarId], locals: usize) -> Vec<BasicTypeEnum<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let mut v: Vec<BasicTypeEnum> = self.used.iter().map(|_| ptr.into()).collect();
        v.extend(self.f.p.scalars.iter().map(|s| self.scalar_ty(Ty::Elem(s.elem))));
        v.extend(captured.iter().map(|_| BasicTypeEnum::from(self.cx.i64_type())));
        v.extend((0..locals).map(|_| BasicTypeEnum::from(ptr)));
        v
    }

    fn entry_alloca(&self, func: FunctionValue<'ctx>, ty: BasicTypeEnum<'ctx>) -> R<PointerValue<'ctx>> {
        let entry = func.get_first_basic_block().expect("entry block");
        let tmp = self.cx.create_builder();
        match entry.get_first_instruction() {
            Some(i) => tmp.position_before(&i),
            None => tmp.position_at_end(entry),
        }
        Ok(tmp.build_alloca(ty, "ctx")?)
    }

    // ------------------------------------------------------------ memory

    fn flat_offset(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let shape = &self.f.p.tensor(t).shape;
        let mut stride = 1i64;
        let mut acc: Option<BasicValueEnum> = None;
        for d in (0..idx.len()).rev() {
            let i = self.expr(fr, idx[d], mode)?;
            let s = self.const_of(Ty::Index, stride, 0.0, mode)?;
            let term = self.arith(BinOp::Mul, i, s, Ty::Index)?;
            acc = Some(match acc {
                Some(a) => self.arith(BinOp::Add, a, term, Ty::Index)?,
                None => term,
            });
            stride *= shape[d];
        }
        Ok(match acc {
            Some(a) => a,
            None => self.const_of(Ty::Index, 0, 0.0, mode)?,
        })
    }

    /// How a vector access moves with the vectorized variable: `Some(0)`
    /// uniform, `Some(1)` contiguous, otherwise a gather or scatter.
    fn access_stride(&self, t: TensorId, idx: &[TExprId], var: VarId) -> Option<i64> {
        let shape = &self.f.p.tensor(t).shape;
        let mut stride = 1i64;
        let mut total = 0i64;
        for d in (0..idx.len()).rev() {
            total += lin_coeff(&self.f.p, idx[d], var)? * stride;
            stride *= shape[d];
        }
        Some(total)
    }

    fn load(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let elem = self.f.p.tensor(t).elem;
        let mty = self.mem_ty(elem);
        let base = fr.tensors[&t];
        let align = elem.size() as u32;
        let v: BasicValueEnum = match mode {
            Mode::Scalar => {
                let off = self.flat_offset(fr, t, idx, mode)?.into_int_value();
                let p = self.gep(mty, base, off)?;
                self.b.build_load(mty, p, "ld")?
            }
            Mode::Vector { var, base, lanes, mask } => {
                let vt = self.vec_ty(mty, lanes);
                match self.access_stride(t, idx, var) {
                    Some(0) if mask.is_none() => {
                        let s = self.load(fr, t, idx, Mode::Scalar)?;
                        return Ok(self.splat(s, lanes)?.into());
                    }
                    Some(1) => {
                        let p = self.lane0_address(fr, t, idx, var, base, mty)?;
                        match mask {
                            None => {
                                let ld = self.b.build_load(vt, p, "vld")?;
                                ld.as_instruction_value()
                                    .expect("load")
                                    .set_alignment(align)
                                    .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                                ld
                            }
                            Some(m) => {
                                let f = self.intrinsic("llvm.masked.load", &[vt.into(), p.get_type().into()])?;
                                let al = self.cx.i32_type().const_int(align as u64, false);
                                self.call(f, &[p.into(), al.into(), m.into(), vt.const_zero().into()])?
                            }
                        }
                    }
                    // Small constant strides: one wide masked load of the span, then a
                    // shuffle that keeps every s-th element (no gather).
                    Some(stride @ 2..=4) => {
                        let p = self.lane0_address(fr, t, idx, var, base, mty)?;
                        let wide_lanes = lanes * stride as u32;
                        let wt = self.vec_ty(mty, wide_lanes);
                        let i32t = self.cx.i32_type();
                        let bool_t = self.cx.bool_type();
                        let pattern: Vec<_> = (0..wide_lanes)
                            .map(|j| if j % stride as u32 == 0 { bool_t.const_all_ones() } else { bool_t.const_zero() })
                            .collect();
                        let mut wide_mask = VectorType::const_vector(&pattern);
                        if let Some(m) = mask {
                            let spread: Vec<_> =
                                (0..wide_lanes).map(|j| i32t.const_int((j / stride as u32) as u64, false)).collect();
                            let mw = self.b.build_shuffle_vector(
                                m,
                                m.get_type().get_poison(),
                                VectorType::const_vector(&spread),
                                "mw",
                            )?;
                            wide_mask = self.b.build_and(wide_mask, mw, "mw")?;
                        }
                        let f = self.intrinsic("llvm.masked.load", &[wt.into(), p.get_type().into()])?;
                        let al = i32t.const_int(align as u64, false);
                        let wide = self
                            .call(f, &[p.into(), al.into(), wide_mask.into(), wt.const_zero().into()])?
                            .into_vector_value();
                        let pick: Vec<_> =
                            (0..lanes).map(|l| i32t.const_int((l * stride as u32) as u64, false)).collect();
                        self.b
                            .build_shuffle_vector(wide, wt.get_poison(), VectorType::const_vector(&pick), "strided")?
                            .into()
                    }
                    _ => {
                        let ptrs = self.lane_addresses(fr, t, idx, mode, elem)?;
                        let f = self.intrinsic("llvm.masked.gather", &[vt.into(), ptrs.get_type().into()])?;
                        let al = self.cx.i32_type().const_int(align as u64, false);
                        let m = mask.unwrap_or_else(|| self.true_mask(lanes));
                        self.call(f, &[ptrs.into(), al.into(), m.into(), vt.const_zero().into()])?
                    }
                }
            }
        };
        if elem == ElemType::Bool {
            let zero = self.const_of(Ty::Elem(ElemType::I8), 0, 0.0, mode)?;
            return self.compare(BinOp::Ne, v, zero, Ty::Elem(ElemType::I8));
        }
        Ok(v)
    }

    fn lane0_address(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        var: VarId,
        base: i64,
        mty: BasicTypeEnum<'ctx>,
    ) -> R<PointerValue<'ctx>> {
        let saved = fr.vars.insert(var, self.cx.i64_type().const_int(base as u64, true));
        let off = self.flat_offset(fr, t, idx, Mode::Scalar)?.into_int_value();
        match saved {
            Some(v) => fr.vars.insert(var, v),
            None => fr.vars.remove(&var),
        };
        self.gep(mty, fr.tensors[&t], off)
    }

    fn lane_addresses(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        mode: Mode<'ctx>,
        elem: ElemType,
    ) -> R<VectorValue<'ctx>> {
        let lanes = mode.lanes().expect("vector mode");
        let off = self.flat_offset(fr, t, idx, mode.with_mask(None))?;
        let size = self.const_of(Ty::Index, elem.size() as i64, 0.0, mode)?;
        let bytes = self.arith(BinOp::Mul, off, size, Ty::Index)?;
        let base = self.b.build_ptr_to_int(fr.tensors[&t], self.cx.i64_type(), "base")?;
        let base = self.splat(base.into(), lanes)?;
        let addr = self.b.build_int_add(base, bytes.into_vector_value(), "addr")?;
        let pt = self.cx.ptr_type(AddressSpace::default()).vec_type(lanes);
        Ok(self.b.build_int_to_ptr(addr, pt, "ptrs")?)
    }

    fn store(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        v: BasicValueEnum<'ctx>,
        mode: Mode<'ctx>,
    ) -> R<()> {
        let elem = self.f.p.tensor(t).elem;
        let mty = self.mem_ty(elem);
        let align = elem.size() as u32;
        let v = if elem == ElemType::Bool {
            match v {
                BasicValueEnum::VectorValue(x) => {
                    self.b.build_int_z_extend(x, self.cx.i8_type().vec_type(x.get_type().get_size()), "b8")?.into()
                }
                _ => self.b.build_int_z_extend(v.into_int_value(), self.cx.i8_type(), "b8")?.into(),
            }
        } else {
            v
        };
        match mode {
            Mode::Scalar => {
                let off = self.flat_offset(fr, t, idx, mode)?.into_int_value();
                let p = self.gep(mty, fr.tensors[&t], off)?;
                self.b.build_store(p, v)?;
            }
            Mode::Vector { var, base, lanes, mask } => {
                let vt = self.vec_ty(mty, lanes);
                let al = self.cx.i32_type().const_int(align as u64, false);
                if self.access_stride(t, idx, var) == Some(1) {
                    let p = self.lane0_address(fr, t, idx, var, base, mty)?;
                    match mask {
                        None => {
                            let st = self.b.build_store(p, v)?;
                            st.set_alignment(align).map_err(|e| CodegenError::Llvm(e.to_string()))?;
                        }
                        Some(m) => {
                            let f = self.intrinsic("llvm.masked.store", &[vt.into(), p.get_type().into()])?;
                            self.call_void(f, &[v, p.into(), al.into(), m.into()])?;
                        }
                    }
                } else {
                    let ptrs = self.lane_addresses(fr, t, idx, mode, elem)?;
                    let f = self.intrinsic("llvm.masked.scatter", &[vt.into(), ptrs.get_type().into()])?;
                    let m = mask.unwrap_or_else(|| self.true_mask(lanes));
                    self.call_void(f, &[v, ptrs.into(), al.into(), m.into()])?;
                }
            }
        }
        Ok(())
    }

    fn call_void(&self, f: FunctionValue<'ctx>, args: &[BasicValueEnum<'ctx>]) -> R<()> {
        let a: Vec<BasicMetadataValueEnum> = args.iter().map(|&x| x.into()).collect();
        self.b.build_call(f, &a, "")?;
        Ok(())
    }

    fn and_mask(&self, a: Option<VectorValue<'ctx>>, b: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        Ok(match a {
            Some(a) => self.b.build_and(a, b, "mask")?,
            None => b,
        })
    }

    // ------------------------------------------------------------ expressions

    fn expr(&mut self, fr: &mut Frame<'ctx>, e: TExprId, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let ty = self.f.p.ty(e);
        match self.f.p.expr(e).clone() {
            TExpr::Int(v) => self.const_of(ty, v, v as f64, mode),
            TExpr::Float(v) => self.const_of(ty, v as i64, v, mode),
            TExpr::Var(v) => match mode {
                Mode::Vector { var, base, lanes, .. } if var == v => {
                    let ids: Vec<IntValue> =
                        (0..lanes).map(|l| self.cx.i64_type().const_int((base + l as i64) as u64, true)).collect();
                    Ok(VectorType::const_vector(&ids).into())
                }
                _ => {
                    let x = *fr.vars.get(&v).ok_or_else(|| CodegenError::Llvm(format!("unbound variable {v}")))?;
                    self.lift(x.into(), mode)
                }
            },
            TExpr::Scalar(s) => self.lift(fr.scalars[s as usize], mode),
            TExpr::Load(t, idx) => self.load(fr, t, &idx, mode),
            TExpr::Unary(UnOp::Not, a) => {
                let x = self.expr(fr, a, mode)?;
                Ok(match x {
                    BasicValueEnum::VectorValue(v) => self.b.build_not(v, "not")?.into(),
                    _ => self.b.build_not(x.into_int_value(), "not")?.into(),
                })
            }
            TExpr::Unary(UnOp::Neg, a) => {
                let x = self.expr(fr, a, mode)?;
                let zero = self.const_of(ty, 0, 0.0, mode)?;
                if float_ty(ty) {
                    Ok(match x {
                        BasicValueEnum::VectorValue(v) => self.b.build_float_neg(v, "neg")?.into(),
                        _ => self.b.build_float_neg(x.into_float_value(), "neg")?.into(),
                    })
                } else {
                    self.arith(BinOp::Sub, zero, x, ty)
                }
            }
            TExpr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => self.logic(fr, op, a, b, mode),
            // a*b + c becomes one fused multiply-add where the target has it.
            TExpr::Binary(BinOp::Add, a, b) if float_ty(ty) && (self.is_fmul(a) || self.is_fmul(b)) => {
                let (m, c) = if self.is_fmul(a) { (a, b) } else { (b, a) };
                let TExpr::Binary(BinOp::Mul, x, y) = self.f.p.expr(m).clone() else { unreachable!() };
                let x = self.expr(fr, x, mode)?;
                let y = self.expr(fr, y, mode)?;
                let c = self.expr(fr, c, mode)?;
                let f = self.intrinsic("llvm.fmuladd", &[self.ty_in(ty, mode)])?;
                self.call(f, &[x, y, c])
            }
            TExpr::Binary(op, a, b) => {
                let oty = self.f.p.ty(a);
                let x = self.expr(fr, a, mode)?;
                let y = self.expr(fr, b, mode)?;
                if op.is_comparison() {
                    self.compare(op, x, y, oty)
                } else {
                    self.arith(op, x, y, ty)
                }
            }
            TExpr::Call(Builtin::Select, args) => self.select(fr, args[0], args[1], args[2], ty, mode),
            TExpr::Call(f, args) => {
                let mut vals = Vec::new();
                for a in args {
                    vals.push(self.expr(fr, a, mode)?);
                }
                self.builtin(f, &vals, ty, mode)
            }
            TExpr::Cast(a) => {
                let from = self.f.p.ty(a);
                let x = self.expr(fr, a, mode)?;
                self.cast(x, from, ty, mode.lanes())
            }
            TExpr::Reduce(..) => Err(CodegenError::Llvm("a reduction reached code generation".into())),
        }
    }

    fn is_fmul(&self, e: TExprId) -> bool {
        matches!(self.f.p.expr(e), TExpr::Binary(BinOp::Mul, ..)) && float_ty(self.f.p.ty(e))
    }

    fn lift(&self, v: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        match mode.lanes() {
            Some(l) => Ok(self.splat(v, l)?.into()),
            None => Ok(v),
        }
    }

    /// `a && b` / `a || b`, evaluating `b` only where needed if it reads memory.
    fn logic(
        &mut self,
        fr: &mut Frame<'ctx>,
        op: BinOp,
        a: TExprId,
        b: TExprId,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let x = self.expr(fr, a, mode)?;
        let lazy = reads_memory(&self.f.p, b);
        match (mode, lazy) {
            (Mode::Vector { .. }, _) => {
                let xv = x.into_vector_value();
                let guard = if op == BinOp::And { xv } else { self.b.build_not(xv, "not")? };
                let m = self.and_mask(mode.mask(), guard)?;
                let y = self.expr(fr, b, mode.with_mask(Some(m)))?.into_vector_value();
                Ok(if op == BinOp::And { self.b.build_and(xv, y, "and")? } else { self.b.build_or(xv, y, "or")? }
                    .into())
            }
            (Mode::Scalar, false) => {
                let y = self.expr(fr, b, mode)?.into_int_value();
                let xi = x.into_int_value();
                Ok(if op == BinOp::And { self.b.build_and(xi, y, "and")? } else { self.b.build_or(xi, y, "or")? }
                    .into())
            }
            (Mode::Scalar, true) => {
                let xi = x.into_int_value();
                let start = self.b.get_insert_block().expect("positioned");
                let rhs = self.cx.append_basic_block(fr.func, "rhs");
                let merge = self.cx.append_basic_block(fr.func, "merge");
                if op == BinOp::And {
                    self.b.build_conditional_branch(xi, rhs, merge)?;
                } else {
                    self.b.build_conditional_branch(xi, merge, rhs)?;
                }
                self.b.position_at_end(rhs);
                let y = self.expr(fr, b, mode)?;
                let rhs_end = self.b.get_insert_block().expect("positioned");
                self.b.build_unconditional_branch(merge)?;
                self.b.position_at_end(merge);
                let phi = self.b.build_phi(self.cx.bool_type(), "sc")?;
                phi.add_incoming(&[(&xi, start), (&y, rhs_end)]);
                Ok(phi.as_basic_value())
            }
        }
    }

    fn select(
        &mut self,
        fr: &mut Frame<'ctx>,
        c: TExprId,
        a: TExprId,
        b: TExprId,
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        // A condition that is the same in every lane is a branch, not a mask:
        // only the taken side runs.
        if let Mode::Vector { var, .. } = mode {
            if lin_coeff(&self.f.p, c, var) == Some(0) && !reads_memory(&self.f.p, c) {
                let cs = self.expr(fr, c, Mode::Scalar)?.into_int_value();
                return self.branch(fr, cs, a, b, self.ty_in(ty, mode), mode);
            }
        }
        let cv = self.expr(fr, c, mode)?;
        match mode {
            Mode::Vector { .. } => {
                let cm = cv.into_vector_value();
                let not_c = self.b.build_not(cm, "notc")?;
                let ma = self.and_mask(mode.mask(), cm)?;
                let mb = self.and_mask(mode.mask(), not_c)?;
                let x = self.expr(fr, a, mode.with_mask(Some(ma)))?;
                let y = self.expr(fr, b, mode.with_mask(Some(mb)))?;
                Ok(self.b.build_select(cm, x, y, "sel")?)
            }
            Mode::Scalar if !reads_memory(&self.f.p, a) && !reads_memory(&self.f.p, b) => {
                let x = self.expr(fr, a, mode)?;
                let y = self.expr(fr, b, mode)?;
                Ok(self.b.build_select(cv.into_int_value(), x, y, "sel")?)
            }
            Mode::Scalar => self.branch(fr, cv.into_int_value(), a, b, self.scalar_ty(ty), mode),
        }
    }

    /// `if c { a } else { b }` with a phi of type `ty`.
    fn branch(
        &mut self,
        fr: &mut Frame<'ctx>,
        c: IntValue<'ctx>,
        a: TExprId,
        b: TExprId,
        ty: BasicTypeEnum<'ctx>,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let then_bb = self.cx.append_basic_block(fr.func, "br.then");
        let else_bb = self.cx.append_basic_block(fr.func, "br.else");
        let merge = self.cx.append_basic_block(fr.func, "br.end");
        self.b.build_conditional_branch(c, then_bb, else_bb)?;
        self.b.position_at_end(then_bb);
        let x = self.expr(fr, a, mode)?;
        let x_end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(else_bb);
        let y = self.expr(fr, b, mode)?;
        let y_end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(merge);
        let phi = self.b.build_phi(ty, "br")?;
        phi.add_incoming(&[(&x, x_end), (&y, y_end)]);
        Ok(phi.as_basic_value())
    }

    fn compare(&self, op: BinOp, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>, oty: Ty) -> R<BasicValueEnum<'ctx>> {
        if float_ty(oty) {
            let p = match op {
                BinOp::Lt => FloatPredicate::OLT,
                BinOp::Le => FloatPredicate::OLE,
                BinOp::Gt => FloatPredicate::OGT,
                BinOp::Ge => FloatPredicate::OGE,
                BinOp::Eq => FloatPredicate::OEQ,
                _ => FloatPredicate::UNE,
            };
            return Ok(match (x, y) {
                (BasicValueEnum::VectorValue(a), BasicValueEnum::VectorValue(b)) => {
                    self.b.build_float_compare(p, a, b, "fcmp")?.into()
                }
                _ => self.b.build_float_compare(p, x.into_float_value(), y.into_float_value(), "fcmp")?.into(),
            });
        }
        let u = unsigned_ty(oty) || bool_ty(oty);
        let p = match op {
            BinOp::Lt if u => IntPredicate::ULT,
            BinOp::Le if u => IntPredicate::ULE,
            BinOp::Gt if u => IntPredicate::UGT,
            BinOp::Ge if u => IntPredicate::UGE,
            BinOp::Lt => IntPredicate::SLT,
            BinOp::Le => IntPredicate::SLE,
            BinOp::Gt => IntPredicate::SGT,
            BinOp::Ge => IntPredicate::SGE,
            BinOp::Eq => IntPredicate::EQ,
            _ => IntPredicate::NE,
        };
        Ok(match (x, y) {
            (BasicValueEnum::VectorValue(a), BasicValueEnum::VectorValue(b)) => {
                self.b.build_int_compare(p, a, b, "icmp")?.into()
            }
            _ => self.b.build_int_compare(p, x.into_int_value(), y.into_int_value(), "icmp")?.into(),
        })
    }

    fn sel(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        Ok(match c {
            BasicValueEnum::VectorValue(m) => self.b.build_select(m, a, b, "s")?,
            _ => self.b.build_select(c.into_int_value(), a, b, "s")?,
        })
    }

    /// Arithmetic with the interpreter's integer semantics: wrapping, floor
    /// division and modulo, `x / 0 == 0`, `x % 0 == x`.
    fn arith(&self, op: BinOp, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>, ty: Ty) -> R<BasicValueEnum<'ctx>> {
        macro_rules! both {
            ($int:ident, $float:ident) => {
                match (x, y) {
                    (BasicValueEnum::VectorValue(a), BasicValueEnum::VectorValue(b)) => {
                        if float_ty(ty) {
                            self.b.$float(a, b, "f")?.into()
                        } else {
                            self.b.$int(a, b, "i")?.into()
                        }
                    }
                    (BasicValueEnum::FloatValue(a), BasicValueEnum::FloatValue(b)) => self.b.$float(a, b, "f")?.into(),
                    (BasicValueEnum::IntValue(a), BasicValueEnum::IntValue(b)) => self.b.$int(a, b, "i")?.into(),
                    _ => return Err(CodegenError::Llvm("mismatched operands".into())),
                }
            };
        }
        let r: BasicValueEnum = match op {
            BinOp::Add => both!(build_int_add, build_float_add),
            BinOp::Sub => both!(build_int_sub, build_float_sub),
            BinOp::Mul => both!(build_int_mul, build_float_mul),
            BinOp::Div if float_ty(ty) => both!(build_int_add, build_float_div),
            BinOp::Div | BinOp::Rem if unsigned_ty(ty) => {
                let zero = self.zero_like(x)?;
                let one = self.one_like(x)?;
                let isz = self.compare(BinOp::Eq, y, zero, ty)?;
                let ys = self.sel(isz, one, y)?;
                let q = if op == BinOp::Div { self.udiv(x, ys)? } else { self.urem(x, ys)? };
                self.sel(isz, if op == BinOp::Div { zero } else { x }, q)?
            }
            BinOp::Div | BinOp::Rem => {
                let zero = self.zero_like(x)?;
                let one = self.one_like(x)?;
                let minus_one = self.arith(BinOp::Sub, zero, one, ty)?;
                let isz = self.compare(BinOp::Eq, y, zero, ty)?;
                let ism1 = self.compare(BinOp::Eq, y, minus_one, ty)?;
                let special = self.or(isz, ism1)?;
                let ys = self.sel(special, one, y)?;
                let q = self.sdiv(x, ys)?;
                let r = self.srem(x, ys)?;
                // Floor: when the remainder is non-zero and has the divisor's opposite sign.
                let rnz = self.compare(BinOp::Ne, r, zero, ty)?;
                let rx = self.xor(r, ys)?;
                let neg = self.compare(BinOp::Lt, rx, zero, ty)?;
                let adj = self.and(rnz, neg)?;
                if op == BinOp::Div {
                    let q1 = self.arith(BinOp::Sub, q, one, ty)?;
                    let q = self.sel(adj, q1, q)?;
                    let negx = self.arith(BinOp::Sub, zero, x, ty)?;
                    let q = self.sel(ism1, negx, q)?;
                    self.sel(isz, zero, q)?
                } else {
                    let r1 = self.arith(BinOp::Add, r, ys, ty)?;
                    let r = self.sel(adj, r1, r)?;
                    let r = self.sel(ism1, zero, r)?;
                    self.sel(isz, x, r)?
                }
            }
            _ => return Err(CodegenError::Llvm(format!("`{}` is not arithmetic", op.symbol()))),
        };
        Ok(r)
    }

    fn zero_like(&self, x: BasicValueEnum<'ctx>) -> R<BasicValueEnum<'ctx>> {
        Ok(x.get_type().const_zero())
    }

    fn one_like(&self, x: BasicValueEnum<'ctx>) -> R<BasicValueEnum<'ctx>> {
        Ok(match x {
            BasicValueEnum::IntValue(i) => i.get_type().const_int(1, false).into(),
            BasicValueEnum::VectorValue(v) => {
                let it = v.get_type().get_element_type().into_int_type();
                VectorType::const_vector(&vec![it.const_int(1, false); v.get_type().get_size() as usize]).into()
            }
            _ => return Err(CodegenError::Llvm("one of a float".into())),
        })
    }
}

macro_rules! int_op {
    ($name:ident, $build:ident) => {
        impl<'ctx> Gen<'ctx, '_> {
            fn $name(&self, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>) -> R<BasicValueEnum<'ctx>> {
                Ok(match (x, y) {
                    (BasicValueEnum::VectorValue(a), BasicValueEnum::VectorValue(b)) => {
                        self.b.$build(a, b, "o")?.into()
                    }
                    _ => self.b.$build(x.into_int_value(), y.into_int_value(), "o")?.into(),
                })
            }
        }
    };
}
int_op!(sdiv, build_int_signed_div);
int_op!(srem, build_int_signed_rem);
int_op!(udiv, build_int_unsigned_div);
int_op!(urem, build_int_unsigned_rem);
int_op!(xor, build_xor);
int_op!(and, build_and);
int_op!(or, build_or);

impl<'ctx> Gen<'ctx, '_> {
    fn builtin(&mut self, f: Builtin, a: &[BasicValueEnum<'ctx>], ty: Ty, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let t = self.ty_in(ty, mode);
        let float = float_ty(ty);
        let un = |name: &str| -> R<BasicValueEnum<'ctx>> {
            let f = self.intrinsic(name, &[t])?;
            self.call(f, &[a[0]])
        };
        match f {
            Builtin::Exp if ty == Ty::Elem(ElemType::F32) && mode.lanes().is_some() => self.vector_expf(a[0], mode),
            Builtin::Exp => un("llvm.exp"),
            Builtin::Log => un("llvm.log"),
            Builtin::Sqrt => un("llvm.sqrt"),
            Builtin::Floor => un("llvm.floor"),
            Builtin::Ceil => un("llvm.ceil"),
            Builtin::Round => un("llvm.roundeven"),
            Builtin::Abs if float => un("llvm.fabs"),
            Builtin::Abs => {
                let f = self.intrinsic("llvm.abs", &[t])?;
                self.call(f, &[a[0], self.cx.bool_type().const_zero().into()])
            }
            Builtin::Rsqrt => {
                let s = un("llvm.sqrt")?;
                let one = self.const_of(ty, 1, 1.0, mode)?;
                self.arith(BinOp::Div, one, s, ty)
            }
            Builtin::Sigmoid => {
                let zero = self.const_of(ty, 0, 0.0, mode)?;
                let neg = self.arith(BinOp::Sub, zero, a[0], ty)?;
                let e = self.call(self.intrinsic("llvm.exp", &[t])?, &[neg])?;
                let one = self.const_of(ty, 1, 1.0, mode)?;
                let d = self.arith(BinOp::Add, one, e, ty)?;
                self.arith(BinOp::Div, one, d, ty)
            }
            Builtin::Tanh => self.libm(if ty == Ty::Elem(ElemType::F64) { "tanh" } else { "tanhf" }, a[0], ty, mode),
            Builtin::Erf => self.libm(if ty == Ty::Elem(ElemType::F64) { "erf" } else { "erff" }, a[0], ty, mode),
            Builtin::Pow => {
                let f = self.intrinsic("llvm.pow", &[t])?;
                self.call(f, &[a[0], a[1]])
            }
            Builtin::Max | Builtin::Min | Builtin::Clamp => {
                let (mx, mn) = if float {
                    ("llvm.maximum", "llvm.minimum")
                } else if unsigned_ty(ty) {
                    ("llvm.umax", "llvm.umin")
                } else {
                    ("llvm.smax", "llvm.smin")
                };
                let fmax = self.intrinsic(mx, &[t])?;
                let fmin = self.intrinsic(mn, &[t])?;
                match f {
                    Builtin::Max => self.call(fmax, &[a[0], a[1]]),
                    Builtin::Min => self.call(fmin, &[a[0], a[1]]),
                    _ => {
                        let lo = self.call(fmax, &[a[0], a[1]])?;
                        self.call(fmin, &[lo, a[2]])
                    }
                }
            }
            Builtin::Select => unreachable!("handled lazily"),
        }
    }

    /// `exp` on f32 vectors without a libm call per lane (Cephes `expf`):
    /// exp(x) = 2^k · p(r), k = round(x·log2 e), r = x − k·ln 2 in two parts,
    /// p a degree-7 polynomial; about 1 ulp, denormal results included.
    fn vector_expf(&self, x: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let ty = Ty::Elem(ElemType::F32);
        let t = self.ty_in(ty, mode);
        let c = |v: f64| self.const_of(ty, 0, v, mode);
        let call2 = |name: &str, a: BasicValueEnum<'ctx>, b: BasicValueEnum<'ctx>| -> R<BasicValueEnum<'ctx>> {
            self.call(self.intrinsic(name, &[t])?, &[a, b])
        };
        let mul = |a, b| self.arith(BinOp::Mul, a, b, ty);
        let add = |a, b| self.arith(BinOp::Add, a, b, ty);
        let sub = |a, b| self.arith(BinOp::Sub, a, b, ty);
        let xc = call2("llvm.minimum", call2("llvm.maximum", x, c(-104.0)?)?, c(88.8)?)?;
        let k = self.call(self.intrinsic("llvm.roundeven", &[t])?, &[mul(xc, c(std::f64::consts::LOG2_E)?)?])?;
        let r = sub(sub(xc, mul(k, c(0.693359375)?)?)?, mul(k, c(-2.121_944_4e-4)?)?)?;
        let mut poly = c(1.987_569_15e-4)?;
        for coef in [1.398_199_950_7e-3, 8.333_451_907_3e-3, 4.166_579_589_4e-2, 1.666_666_545_9e-1, 5.000_000_120_1e-1]
        {
            poly = add(mul(poly, r)?, c(coef)?)?;
        }
        let p = add(add(mul(poly, mul(r, r)?)?, r)?, c(1.0)?)?;
        // 2^k = 2^(k>>1) · 2^(k - (k>>1)), each a biased exponent field, so
        // that k ∈ [-150, 128] (denormal results included) never overflows the field.
        let lanes = mode.lanes().expect("vector mode");
        let i32v = self.cx.i32_type().vec_type(lanes);
        // k is in [-150, 128] or NaN (then the result is NaN anyway): make it
        // a number so that the plain conversion is defined.
        let is_num = self.compare(BinOp::Eq, k, k, ty)?;
        let k = self.sel(is_num, k, c(0.0)?)?;
        let ki = self.b.build_float_to_signed_int(k.into_vector_value(), i32v, "k")?;
        let splat_i = |v: u64| VectorType::const_vector(&vec![self.cx.i32_type().const_int(v, false); lanes as usize]);
        let half = self.b.build_right_shift(ki, splat_i(1), true, "kh")?;
        let rest = self.b.build_int_sub(ki, half, "kr")?;
        let field = |e: VectorValue<'ctx>| -> R<BasicValueEnum<'ctx>> {
            let biased = self.b.build_int_add(e, splat_i(127), "e")?;
            let shifted = self.b.build_left_shift(biased, splat_i(23), "e")?;
            Ok(self.b.build_bit_cast(shifted, t, "pow2")?)
        };
        let y = mul(mul(p, field(half)?)?, field(rest)?)?;
        // Outside the clamp range: overflow to infinity, underflow to zero (NaN passes through).
        let big = self.compare(BinOp::Gt, x, c(88.722_83)?, ty)?;
        let y = self.sel(big, c(f64::INFINITY)?, y)?;
        let small = self.compare(BinOp::Lt, x, c(-104.0)?, ty)?;
        self.sel(small, c(0.0)?, y)
    }

    /// A C math library call, lane by lane in vector code; f16 goes through f32.
    fn libm(&self, name: &str, x: BasicValueEnum<'ctx>, ty: Ty, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let half = ty == Ty::Elem(ElemType::F16);
        let cty = if ty == Ty::Elem(ElemType::F64) { self.cx.f64_type() } else { self.cx.f32_type() };
        let f = self
            .m
            .get_function(name)
            .unwrap_or_else(|| self.m.add_function(name, cty.fn_type(&[cty.into()], false), Some(Linkage::External)));
        let one = |v: BasicValueEnum<'ctx>| -> R<BasicValueEnum<'ctx>> {
            let v = if half { self.b.build_float_ext(v.into_float_value(), cty, "ext")?.into() } else { v };
            let r = self.call(f, &[v])?;
            Ok(if half { self.b.build_float_trunc(r.into_float_value(), self.cx.f16_type(), "tr")?.into() } else { r })
        };
        match mode.lanes() {
            None => one(x),
            Some(l) => {
                let v = x.into_vector_value();
                let mut out = v.get_type().get_poison();
                for i in 0..l {
                    let idx = self.cx.i32_type().const_int(i as u64, false);
                    let e = self.b.build_extract_element(v, idx, "lane")?;
                    let r = one(e)?;
                    out = self.b.build_insert_element(out, r, idx, "lane")?;
                }
                Ok(out.into())
            }
        }
    }

    /// Conversions with the interpreter's semantics (saturating float to int).
    #[allow(clippy::too_many_lines)]
    fn cast(&self, x: BasicValueEnum<'ctx>, from: Ty, to: Ty, lanes: Option<u32>) -> R<BasicValueEnum<'ctx>> {
        if from == to {
            return Ok(x);
        }
        let mode = match lanes {
            Some(l) => Mode::Vector { var: u32::MAX, base: 0, lanes: l, mask: None },
            None => Mode::Scalar,
        };
        let tt = self.ty_in(to, mode);
        // Apply one conversion builder to a scalar or a vector value.
        macro_rules! conv {
            ($build:ident, $scalar:ident, $target:ident) => {
                match x {
                    BasicValueEnum::VectorValue(v) => self.b.$build(v, tt.into_vector_type(), "cv")?.into(),
                    _ => self.b.$build(x.$scalar(), tt.$target(), "cv")?.into(),
                }
            };
        }
        let zero_from = self.const_of(from, 0, 0.0, mode)?;
        Ok(match (float_ty(from), float_ty(to)) {
            (true, true) => {
                let wider = self.scalar_ty(to).into_float_type().get_bit_width()
                    > self.scalar_ty(from).into_float_type().get_bit_width();
                if wider {
                    conv!(build_float_ext, into_float_value, into_float_type)
                } else {
                    conv!(build_float_trunc, into_float_value, into_float_type)
                }
            }
            (true, false) if bool_ty(to) => self.compare(BinOp::Ne, x, zero_from, from)?,
            (true, false) => {
                let name = if unsigned_ty(to) { "llvm.fptoui.sat" } else { "llvm.fptosi.sat" };
                let f = self.intrinsic(name, &[tt, x.get_type()])?;
                self.call(f, &[x])?
            }
            (false, true) => {
                if unsigned_ty(from) || bool_ty(from) {
                    conv!(build_unsigned_int_to_float, into_int_value, into_float_type)
                } else {
                    conv!(build_signed_int_to_float, into_int_value, into_float_type)
                }
            }
            (false, false) if bool_ty(to) => self.compare(BinOp::Ne, x, zero_from, from)?,
            (false, false) => {
                let fw = self.scalar_ty(from).into_int_type().get_bit_width();
                let tw = self.scalar_ty(to).into_int_type().get_bit_width();
                let unsigned = unsigned_ty(from) || bool_ty(from);
                if tw < fw {
                    conv!(build_int_truncate, into_int_value, into_int_type)
                } else if tw == fw {
                    x
                } else if unsigned {
                    conv!(build_int_z_extend, into_int_value, into_int_type)
                } else {
                    conv!(build_int_s_extend, into_int_value, into_int_type)
                }
            }
        })
    }
}

/// Whether evaluating `e` reads a tensor.
fn reads_memory(p: &texc_compiler::Program, e: TExprId) -> bool {
    matches!(p.expr(e), TExpr::Load(..)) || p.children(e).into_iter().any(|c| reads_memory(p, c))
}

/// The constant coefficient of `var` in `e` if `e` is affine in it.
fn lin_coeff(p: &texc_compiler::Program, e: TExprId, var: VarId) -> Option<i64> {
    let konst = |x: TExprId| match p.expr(x) {
        TExpr::Int(k) => Some(*k),
        _ => None,
    };
    match p.expr(e) {
        TExpr::Int(_) | TExpr::Scalar(_) => Some(0),
        TExpr::Var(v) => Some(i64::from(*v == var)),
        TExpr::Unary(UnOp::Neg, a) => lin_coeff(p, *a, var).map(|c| -c),
        TExpr::Binary(BinOp::Add, a, b) => Some(lin_coeff(p, *a, var)? + lin_coeff(p, *b, var)?),
        TExpr::Binary(BinOp::Sub, a, b) => Some(lin_coeff(p, *a, var)? - lin_coeff(p, *b, var)?),
        TExpr::Binary(BinOp::Mul, a, b) => {
            let (ca, cb) = (lin_coeff(p, *a, var)?, lin_coeff(p, *b, var)?);
            match (ca, cb) {
                (0, 0) => Some(0),
                (c, 0) => konst(*b).map(|k| c * k),
                (0, c) => konst(*a).map(|k| c * k),
                _ => None,
            }
        }
        _ => {
            if p.children(e).into_iter().all(|c| lin_coeff(p, c, var) == Some(0)) {
                Some(0)
            } else {
                None
            }
        }
    }
}
