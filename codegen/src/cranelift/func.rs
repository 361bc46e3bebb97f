//! One Cranelift function of a kernel (its entry, or a parallel task):
//! statements and scalar expressions. Vector code is in `vector`.
//!
//! Registers hold f16 values as f32 (rounded to f16 after every operation,
//! as LLVM's promotion does) and bools as `i8` 0/1. Memory holds f16 as its
//! bits and bools as bytes.

use super::module::ModuleCx;
use super::vector::VecMode;
use super::R;
use crate::CodegenError;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, BlockArg, FuncRef, Function, InstBuilder, MemFlagsData, Signature, StackSlotData, StackSlotKind,
    Type, UserFuncName, Value,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Module};
use std::collections::HashMap;
use texc_compiler::ops::{BinOp, Intrinsic, MathFn, UnOp};
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_schedules::analysis;
use texc_schedules::ir::{ForKind, Stmt};

/// The register type of an IR type.
pub(super) fn reg_ty(t: Ty) -> Type {
    match t {
        Ty::Index => types::I64,
        Ty::Elem(e) => match e {
            ElemType::F16 | ElemType::BF16 | ElemType::F32 => types::F32,
            ElemType::F64 => types::F64,
            ElemType::I8 | ElemType::U8 | ElemType::Bool => types::I8,
            ElemType::I32 => types::I32,
            ElemType::I64 => types::I64,
        },
    }
}

/// The memory type of an element type.
pub(super) fn mem_ty(e: ElemType) -> Type {
    match e {
        ElemType::F16 | ElemType::BF16 => types::I16,
        _ => reg_ty(Ty::Elem(e)),
    }
}

pub(super) fn is_float(t: Ty) -> bool {
    matches!(t, Ty::Elem(e) if e.is_float())
}

pub(super) fn is_unsigned(t: Ty) -> bool {
    matches!(t, Ty::Elem(ElemType::U8 | ElemType::Bool))
}

pub(super) fn is_f16(t: Ty) -> bool {
    t == Ty::Elem(ElemType::F16)
}

/// Scalars: plain; vectors: chunks of 128 bits (see `vector`).
pub(super) fn flags() -> MemFlagsData {
    MemFlagsData::trusted()
}

pub(super) struct FnGen<'a, 'm, M: Module> {
    pub cx: &'a mut ModuleCx<'m, M>,
    pub b: FunctionBuilder<'a>,
    pub tensors: HashMap<TensorId, Value>,
    pub scalars: Vec<Value>,
    pub vars: HashMap<VarId, Value>,
    frefs: HashMap<FuncId, FuncRef>,
    /// The function's stack slot for each local buffer on the stack, made
    /// on first use (unrolled copies of a body share it).
    slots: HashMap<TensorId, cranelift_codegen::ir::StackSlot>,
}

impl<'a, 'm, M: Module> FnGen<'a, 'm, M> {
    pub fn new(cx: &'a mut ModuleCx<'m, M>, func: &'a mut Function, fbc: &'a mut FunctionBuilderContext) -> Self {
        FnGen {
            cx,
            b: FunctionBuilder::new(func, fbc),
            tensors: HashMap::new(),
            scalars: Vec::new(),
            vars: HashMap::new(),
            frefs: HashMap::new(),
            slots: HashMap::new(),
        }
    }

    pub fn ptr(&self) -> Type {
        self.cx.ptr
    }

    /// A function of the module, callable from this one.
    pub fn fref(&mut self, id: FuncId) -> FuncRef {
        if let Some(&r) = self.frefs.get(&id) {
            return r;
        }
        let r = self.cx.module.declare_func_in_func(id, self.b.func);
        self.frefs.insert(id, r);
        r
    }

    /// Call an imported function by name (declared on first use).
    pub fn call_import(
        &mut self,
        name: &'static str,
        params: &[Type],
        ret: Option<Type>,
        args: &[Value],
    ) -> R<Option<Value>> {
        let id = self.cx.import(name, params, ret)?;
        let fr = self.fref(id);
        let inst = self.b.ins().call(fr, args);
        Ok(self.b.inst_results(inst).first().copied())
    }

    fn call1(&mut self, name: &'static str, ty: Type, x: Value) -> R<Value> {
        Ok(self.call_import(name, &[ty], Some(ty), &[x])?.expect("a result"))
    }

    // ------------------------------------------------------------ constants

    pub fn iconst(&mut self, ty: Type, v: i64) -> Value {
        self.b.ins().iconst(ty, v)
    }

    pub fn constant(&mut self, ty: Ty, int: i64, float: f64) -> Value {
        match reg_ty(ty) {
            types::F32 => {
                let v = if is_f16(ty) { half::f16::from_f64(float).to_f32() } else { float as f32 };
                self.b.ins().f32const(v)
            }
            types::F64 => self.b.ins().f64const(float),
            t if ty == Ty::Elem(ElemType::Bool) => self.b.ins().iconst(t, (int != 0) as i64),
            t => self.b.ins().iconst(t, int),
        }
    }

    // ------------------------------------------------------------ statements

    pub fn stmts(&mut self, body: &[Stmt]) -> R<()> {
        for s in body {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> R<()> {
        match s {
            Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::WarpReduce(_) => {
                Err(CodegenError::Unsupported(
                    "barriers, asynchronous copies, warp reductions and tensor-core operations are for GPU targets"
                        .into(),
                ))
            }
            Stmt::TileDot(_) => Err(CodegenError::Unsupported(
                "AMX tile products are compiled through LLVM (`x86-avx512-amx`), not Cranelift".into(),
            )),
            Stmt::Prefetch { .. } => Err(CodegenError::Unsupported(
                "software prefetches are compiled by LLVM's CPU targets; Cranelift has no prefetch instruction".into(),
            )),
            Stmt::For { var, lo, extent, kind, body } => match kind {
                ForKind::Vectorized if *extent > 1 && VecMode::handles(body) => {
                    self.vector_stmts(body, VecMode { var: *var, base: *lo, lanes: *extent as u32 })
                }
                ForKind::Unrolled if *extent <= 64 => {
                    for k in *lo..*lo + *extent {
                        let v = self.iconst(types::I64, k);
                        self.vars.insert(*var, v);
                        self.stmts(body)?;
                    }
                    self.vars.remove(var);
                    Ok(())
                }
                ForKind::Parallel if *extent > 1 => self.parallel(*var, *lo, *extent, body),
                _ => {
                    let (lo_v, hi_v) = (self.iconst(types::I64, *lo), self.iconst(types::I64, *lo + *extent));
                    self.serial_loop(*var, lo_v, hi_v, body)
                }
            },
            Stmt::If { cond, then } => {
                let c = self.expr(*cond)?;
                self.guarded(c, |g| g.stmts(then))
            }
            Stmt::Store { tensor, indices, value } => {
                let v = self.expr(*value)?;
                let addr = self.address(*tensor, indices)?;
                self.store_value(*tensor, v, addr)
            }
            Stmt::Alloc { tensor, body } if self.cx.heap.contains(tensor) => {
                // Over the stack's share: from the heap around the body.
                let (alloc, free) = self.cx.local_memory()?;
                let n = self.iconst(types::I64, self.local_bytes(*tensor) as i64);
                let fr = self.fref(alloc);
                let inst = self.b.ins().call(fr, &[n]);
                let p = self.b.inst_results(inst)[0];
                self.tensors.insert(*tensor, p);
                let r = self.stmts(body);
                self.tensors.remove(tensor);
                r?;
                let fr = self.fref(free);
                self.b.ins().call(fr, &[p]);
                Ok(())
            }
            Stmt::Alloc { tensor, body } => {
                let slot = match self.slots.get(tensor) {
                    Some(&slot) => slot,
                    None => {
                        // At most `attach::MAX_STACK_BYTES`: larger ones are on the heap.
                        let bytes = self.local_bytes(*tensor) as u32;
                        let data = StackSlotData::new(StackSlotKind::ExplicitSlot, bytes, 6);
                        let slot = self.b.create_sized_stack_slot(data);
                        self.slots.insert(*tensor, slot);
                        slot
                    }
                };
                let p = self.b.ins().stack_addr(self.cx.ptr, slot, 0);
                self.tensors.insert(*tensor, p);
                let r = self.stmts(body);
                self.tensors.remove(tensor);
                r
            }
        }
    }

    fn local_bytes(&self, t: TensorId) -> u64 {
        let d = self.cx.f.p.tensor(t);
        (d.len().max(1) as u64) * d.elem.size() as u64
    }

    /// `if c { then }` as a branch.
    pub fn guarded(&mut self, c: Value, then: impl FnOnce(&mut Self) -> R<()>) -> R<()> {
        let (then_b, merge) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(c, then_b, &[], merge, &[]);
        self.b.switch_to_block(then_b);
        then(self)?;
        self.b.ins().jump(merge, &[]);
        self.b.switch_to_block(merge);
        Ok(())
    }

    pub fn serial_loop(&mut self, var: VarId, lo: Value, hi: Value, body: &[Stmt]) -> R<()> {
        let (header, body_b, exit) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
        self.b.append_block_param(header, types::I64);
        self.b.ins().jump(header, &[BlockArg::Value(lo)]);
        self.b.switch_to_block(header);
        let i = self.b.block_params(header)[0];
        let c = self.b.ins().icmp(IntCC::SignedLessThan, i, hi);
        self.b.ins().brif(c, body_b, &[], exit, &[]);
        self.b.switch_to_block(body_b);
        self.vars.insert(var, i);
        self.stmts(body)?;
        let next = self.b.ins().iadd_imm_s(i, 1);
        self.b.ins().jump(header, &[BlockArg::Value(next)]);
        self.b.switch_to_block(exit);
        self.vars.remove(&var);
        Ok(())
    }

    /// `for var in base..base + n parallel: body`: a task function that the
    /// runtime's pool runs over chunks; captured values travel in 8-byte slots.
    fn parallel(&mut self, var: VarId, base: i64, n: i64, body: &[Stmt]) -> R<()> {
        let mut captured: Vec<VarId> = self.vars.keys().copied().collect();
        captured.sort_unstable();
        let used = self.cx.used.clone();
        let mut locals: Vec<TensorId> = self.tensors.keys().copied().filter(|t| !used.contains(t)).collect();
        locals.sort_unstable();
        let mut values: Vec<Value> = used.iter().map(|t| self.tensors[t]).collect();
        values.extend(self.scalars.iter().copied());
        values.extend(captured.iter().map(|v| self.vars[v]));
        values.extend(locals.iter().map(|t| self.tensors[t]));
        let tys: Vec<Type> = values.iter().map(|&v| self.b.func.dfg.value_type(v)).collect();
        let task = self.cx.task_id()?;
        {
            let ptr = self.ptr();
            let mut sig = Signature::new(self.cx.call_conv);
            sig.params.extend([AbiParam::new(ptr), AbiParam::new(types::I64), AbiParam::new(types::I64)]);
            let mut func = Function::with_name_signature(UserFuncName::user(0, task.as_u32()), sig);
            let mut fbc = FunctionBuilderContext::new();
            let mut g = FnGen::new(&mut *self.cx, &mut func, &mut fbc);
            let entry = g.b.create_block();
            g.b.append_block_params_for_function_params(entry);
            g.b.switch_to_block(entry);
            let [ctx, lo, hi] = [0, 1, 2].map(|k| g.b.block_params(entry)[k]);
            let loaded: Vec<Value> =
                tys.iter().enumerate().map(|(k, &t)| g.b.ins().load(t, flags(), ctx, 8 * k as i32)).collect();
            let mut it = loaded.into_iter();
            g.tensors = used.iter().map(|&t| (t, it.next().expect("slot"))).collect();
            g.scalars = (0..self.scalars.len()).map(|_| it.next().expect("slot")).collect();
            g.vars = captured.iter().map(|&v| (v, it.next().expect("slot"))).collect();
            g.tensors.extend(locals.iter().map(|&t| (t, it.next().expect("slot"))));
            let lo = g.b.ins().iadd_imm_s(lo, base);
            let hi = g.b.ins().iadd_imm_s(hi, base);
            g.serial_loop(var, lo, hi, body)?;
            g.b.ins().return_(&[]);
            g.finish();
            self.cx.define(task, func)?;
        }
        let slots = u32::try_from(8 * values.len().max(1)).expect("few captures");
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, slots, 3));
        for (k, &v) in values.iter().enumerate() {
            self.b.ins().stack_store(self.cx.ptr, v, slot, 8 * k as i32);
        }
        let ctx = self.b.ins().stack_addr(self.cx.ptr, slot, 0);
        let fr = self.fref(task);
        let task_addr = self.b.ins().func_addr(self.cx.ptr, fr);
        let n = self.iconst(types::I64, n);
        let pool = self.cx.parallel_for()?;
        let pf = self.fref(pool);
        self.b.ins().call(pf, &[task_addr, ctx, n]);
        Ok(())
    }

    /// Seal and finalize the function.
    pub fn finish(mut self) {
        self.b.seal_all_blocks();
        let config = self.cx.module.target_config();
        self.b.finalize(config);
    }

    // ------------------------------------------------------------ memory

    /// The address of `t[idx]`.
    pub fn address(&mut self, t: TensorId, idx: &[TExprId]) -> R<Value> {
        let shape = self.cx.f.p.tensor(t).shape.clone();
        let size = self.cx.f.p.tensor(t).elem.size() as i64;
        let mut offset: Option<Value> = None;
        let mut stride = 1i64;
        for d in (0..idx.len()).rev() {
            let i = self.expr(idx[d])?;
            let term = if stride == 1 { i } else { self.b.ins().imul_imm_s(i, stride) };
            offset = Some(match offset {
                Some(o) => self.b.ins().iadd(o, term),
                None => term,
            });
            stride *= shape[d];
        }
        let base =
            *self.tensors.get(&t).ok_or_else(|| CodegenError::Backend(format!("no buffer for tensor {}", t.0)))?;
        Ok(match offset {
            Some(o) => {
                let bytes = self.b.ins().imul_imm_s(o, size);
                self.b.ins().iadd(base, bytes)
            }
            None => base,
        })
    }

    pub fn load_value(&mut self, t: TensorId, addr: Value) -> R<Value> {
        let elem = self.cx.f.p.tensor(t).elem;
        let raw = self.b.ins().load(mem_ty(elem), flags(), addr, 0);
        Ok(match elem {
            ElemType::F16 => {
                self.call_import("texc_f16_to_f32", &[types::I16], Some(types::F32), &[raw])?.expect("result")
            }
            ElemType::Bool => self.b.ins().icmp_imm_s(IntCC::NotEqual, raw, 0),
            _ => raw,
        })
    }

    pub fn store_value(&mut self, t: TensorId, v: Value, addr: Value) -> R<()> {
        let elem = self.cx.f.p.tensor(t).elem;
        let v = match elem {
            ElemType::F16 => {
                self.call_import("texc_f32_to_f16", &[types::F32], Some(types::I16), &[v])?.expect("result")
            }
            _ => v,
        };
        self.b.ins().store(flags(), v, addr, 0);
        Ok(())
    }

    // ------------------------------------------------------------ expressions

    /// A scalar expression. `select`, `&&` and `||` whose lazy side reads
    /// memory become branches, so guarded reads never run out of bounds.
    pub fn expr(&mut self, e: TExprId) -> R<Value> {
        let p = &self.cx.f.p;
        let ty = p.ty(e);
        let node = p.expr(e).clone();
        match node {
            TExpr::Int(v) => Ok(self.constant(ty, v, v as f64)),
            TExpr::Float(v) => Ok(self.constant(ty, v as i64, v)),
            TExpr::Var(v) => {
                self.vars.get(&v).copied().ok_or_else(|| CodegenError::Backend(format!("unbound loop variable {v}")))
            }
            TExpr::Scalar(s) => Ok(self.scalars[s as usize]),
            TExpr::Load(t, idx) => {
                let addr = self.address(t, &idx)?;
                self.load_value(t, addr)
            }
            TExpr::Unary(op, a) => {
                let x = self.expr(a)?;
                Ok(self.unary_v(op, ty, x))
            }
            TExpr::Binary(op @ (BinOp::And | BinOp::Or), a, b) if analysis::reads_memory(&self.cx.f.p, b) => {
                let x = self.expr(a)?;
                // `a && b`: b only when a; `a || b`: b only when !a.
                let (eval_b, short) = (self.b.create_block(), self.b.create_block());
                let merge = self.b.create_block();
                self.b.append_block_param(merge, types::I8);
                if op == BinOp::And {
                    self.b.ins().brif(x, eval_b, &[], short, &[]);
                } else {
                    self.b.ins().brif(x, short, &[], eval_b, &[]);
                }
                self.b.switch_to_block(short);
                self.b.ins().jump(merge, &[BlockArg::Value(x)]);
                self.b.switch_to_block(eval_b);
                let y = self.expr(b)?;
                self.b.ins().jump(merge, &[BlockArg::Value(y)]);
                self.b.switch_to_block(merge);
                Ok(self.b.block_params(merge)[0])
            }
            TExpr::Binary(op, a, b) => {
                let operand = self.cx.f.p.ty(a);
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                self.binary_v(op, ty, operand, x, y)
            }
            TExpr::Select(c, a, b) => {
                let cv = self.expr(c)?;
                if analysis::reads_memory(&self.cx.f.p, a) || analysis::reads_memory(&self.cx.f.p, b) {
                    return self.branch(cv, a, b, reg_ty(ty));
                }
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                Ok(self.b.ins().select(cv, x, y))
            }
            TExpr::Math(f, args) => {
                let vals = args.iter().map(|&x| self.expr(x)).collect::<R<Vec<_>>>()?;
                self.math_v(f, ty, &vals)
            }
            TExpr::Intrinsic(i, args) => {
                let vals = args.iter().map(|&x| self.expr(x)).collect::<R<Vec<_>>>()?;
                self.intrinsic_v(i, ty, &vals)
            }
            TExpr::Cast(a) => {
                let from = self.cx.f.p.ty(a);
                let x = self.expr(a)?;
                self.cast_v(x, from, ty)
            }
            TExpr::Reduce(..) => Err(CodegenError::Backend("a reduction reached code generation".into())),
        }
    }

    /// `if c { a } else { b }`, evaluating one side.
    fn branch(&mut self, c: Value, a: TExprId, b: TExprId, ty: Type) -> R<Value> {
        let (then_b, else_b, merge) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
        self.b.append_block_param(merge, ty);
        self.b.ins().brif(c, then_b, &[], else_b, &[]);
        self.b.switch_to_block(then_b);
        let x = self.expr(a)?;
        self.b.ins().jump(merge, &[BlockArg::Value(x)]);
        self.b.switch_to_block(else_b);
        let y = self.expr(b)?;
        self.b.ins().jump(merge, &[BlockArg::Value(y)]);
        self.b.switch_to_block(merge);
        Ok(self.b.block_params(merge)[0])
    }

    /// Round an f32 register to f16 precision when the IR type is f16.
    fn rounded(&mut self, ty: Ty, v: Value) -> R<Value> {
        if is_f16(ty) {
            self.call1("texc_round_f16", types::F32, v)
        } else {
            Ok(v)
        }
    }

    pub fn unary_v(&mut self, op: UnOp, ty: Ty, x: Value) -> Value {
        match op {
            UnOp::Not => self.b.ins().bxor_imm_s(x, 1),
            UnOp::Neg if is_float(ty) => self.b.ins().fneg(x),
            UnOp::Neg => self.b.ins().ineg(x),
        }
    }

    /// An eager binary operation on two scalars (`ty` the result's type,
    /// `operand` the operands').
    pub fn binary_v(&mut self, op: BinOp, ty: Ty, operand: Ty, x: Value, y: Value) -> R<Value> {
        let i = self.b.ins();
        if op.is_comparison() {
            return Ok(if is_float(operand) {
                let cc = match op {
                    BinOp::Lt => FloatCC::LessThan,
                    BinOp::Le => FloatCC::LessThanOrEqual,
                    BinOp::Gt => FloatCC::GreaterThan,
                    BinOp::Ge => FloatCC::GreaterThanOrEqual,
                    BinOp::Eq => FloatCC::Equal,
                    _ => FloatCC::NotEqual,
                };
                i.fcmp(cc, x, y)
            } else {
                i.icmp(int_cc(op, is_unsigned(operand)), x, y)
            });
        }
        let float = is_float(ty);
        let v = match op {
            BinOp::And => i.band(x, y),
            BinOp::Or => i.bor(x, y),
            BinOp::Add if float => i.fadd(x, y),
            BinOp::Sub if float => i.fsub(x, y),
            BinOp::Mul if float => i.fmul(x, y),
            BinOp::Div if float => i.fdiv(x, y),
            BinOp::Add => i.iadd(x, y),
            BinOp::Sub => i.isub(x, y),
            BinOp::Mul => i.imul(x, y),
            // Legalization guarantees the divisor is neither 0 nor -1.
            BinOp::TruncDiv if is_unsigned(ty) => i.udiv(x, y),
            BinOp::TruncRem if is_unsigned(ty) => i.urem(x, y),
            BinOp::TruncDiv => i.sdiv(x, y),
            BinOp::UDiv => i.udiv(x, y),
            BinOp::URem => i.urem(x, y),
            BinOp::TruncRem => i.srem(x, y),
            _ => return Err(CodegenError::Backend(format!("`{op:?}` is not an operation of legalized code"))),
        };
        if float {
            self.rounded(ty, v)
        } else {
            Ok(v)
        }
    }

    pub fn math_v(&mut self, f: MathFn, ty: Ty, a: &[Value]) -> R<Value> {
        let rt = reg_ty(ty);
        if !is_float(ty) {
            let u = is_unsigned(ty);
            let i = self.b.ins();
            return Ok(match f {
                MathFn::Abs => i.iabs(a[0]),
                MathFn::Max if u => i.umax(a[0], a[1]),
                MathFn::Min if u => i.umin(a[0], a[1]),
                MathFn::Max => i.smax(a[0], a[1]),
                MathFn::Min => i.smin(a[0], a[1]),
                MathFn::Clamp => {
                    let lo = if u { i.umax(a[0], a[1]) } else { i.smax(a[0], a[1]) };
                    let i = self.b.ins();
                    if u {
                        i.umin(lo, a[2])
                    } else {
                        i.smin(lo, a[2])
                    }
                }
                _ => return Err(CodegenError::Backend(format!("`{}` on integers", f.name()))),
            });
        }
        let f64_ = rt == types::F64;
        let libm = |n32: &'static str, n64: &'static str| if f64_ { n64 } else { n32 };
        let v = match f {
            MathFn::Exp => self.call1(libm("expf", "exp"), rt, a[0])?,
            MathFn::Log => self.call1(libm("logf", "log"), rt, a[0])?,
            MathFn::Tanh => self.call1(libm("tanhf", "tanh"), rt, a[0])?,
            MathFn::Erf => self.call1(libm("erff", "erf"), rt, a[0])?,
            MathFn::Erfc => self.call1(libm("erfcf", "erfc"), rt, a[0])?,
            MathFn::Pow => self.call_import(libm("powf", "pow"), &[rt, rt], Some(rt), &[a[0], a[1]])?.expect("result"),
            // As the LLVM backend: e^−|x|, which never overflows.
            MathFn::Sigmoid => {
                let abs = self.b.ins().fabs(a[0]);
                let neg = self.b.ins().fneg(abs);
                let e = self.call1(libm("expf", "exp"), rt, neg)?;
                let one = self.constant(ty, 1, 1.0);
                let d = self.b.ins().fadd(one, e);
                let t = self.b.ins().fdiv(one, d);
                let below = self.b.ins().fmul(e, t);
                let zero = self.constant(ty, 0, 0.0);
                let nonnegative = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, a[0], zero);
                self.b.ins().select(nonnegative, t, below)
            }
            MathFn::Sqrt => self.b.ins().sqrt(a[0]),
            MathFn::Rsqrt => {
                let s = self.b.ins().sqrt(a[0]);
                let one = self.constant(ty, 1, 1.0);
                self.b.ins().fdiv(one, s)
            }
            MathFn::Abs => self.b.ins().fabs(a[0]),
            MathFn::Floor => self.b.ins().floor(a[0]),
            MathFn::Ceil => self.b.ins().ceil(a[0]),
            MathFn::Round => self.b.ins().nearest(a[0]),
            MathFn::Max => self.b.ins().fmax(a[0], a[1]),
            MathFn::Min => self.b.ins().fmin(a[0], a[1]),
            MathFn::Clamp => {
                let lo = self.b.ins().fmax(a[0], a[1]);
                self.b.ins().fmin(lo, a[2])
            }
        };
        self.rounded(ty, v)
    }

    pub fn intrinsic_v(&mut self, i: Intrinsic, ty: Ty, a: &[Value]) -> R<Value> {
        match i {
            Intrinsic::Fma => {
                let v = self.b.ins().fma(a[0], a[1], a[2]);
                self.rounded(ty, v)
            }
            // The Cranelift target does not list it, so verification refuses it before this.
            Intrinsic::Dot4 | Intrinsic::Dot2 | Intrinsic::Dot4Sat => {
                Err(CodegenError::Unsupported(format!("Cranelift has no `{i}` (its integer products run as written)")))
            }
        }
    }

    /// Conversions with the interpreter's semantics: saturating float to
    /// integer (NaN to 0), wrapping integer to integer, anything to bool `!= 0`.
    pub fn cast_v(&mut self, x: Value, from: Ty, to: Ty) -> R<Value> {
        if from == to {
            return Ok(x);
        }
        let (ft, tt) = (reg_ty(from), reg_ty(to));
        if to == Ty::Elem(ElemType::Bool) {
            return Ok(if is_float(from) {
                let zero = self.constant(from, 0, 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            } else {
                self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0)
            });
        }
        Ok(match (is_float(from), is_float(to)) {
            (true, true) => {
                let v = if ft == tt {
                    x
                } else if tt == types::F64 {
                    self.b.ins().fpromote(types::F64, x)
                } else if is_f16(to) {
                    return self
                        .call_import("texc_f64_to_f16", &[types::F64], Some(types::F32), &[x])
                        .map(|v| v.expect("result"));
                } else {
                    self.b.ins().fdemote(types::F32, x)
                };
                self.rounded(to, v)?
            }
            (true, false) => self.float_to_int(x, to),
            (false, true) => {
                let wide = if ft.bits() < 32 {
                    if is_unsigned(from) {
                        self.b.ins().uextend(types::I32, x)
                    } else {
                        self.b.ins().sextend(types::I32, x)
                    }
                } else {
                    x
                };
                let v = if is_unsigned(from) {
                    self.b.ins().fcvt_from_uint(tt, wide)
                } else {
                    self.b.ins().fcvt_from_sint(tt, wide)
                };
                self.rounded(to, v)?
            }
            (false, false) => {
                if tt.bits() < ft.bits() {
                    self.b.ins().ireduce(tt, x)
                } else if tt.bits() == ft.bits() {
                    x
                } else if is_unsigned(from) {
                    self.b.ins().uextend(tt, x)
                } else {
                    self.b.ins().sextend(tt, x)
                }
            }
        })
    }

    /// Saturating float-to-integer conversion; narrow types saturate through i32.
    fn float_to_int(&mut self, x: Value, to: Ty) -> Value {
        let tt = reg_ty(to);
        if tt.bits() >= 32 {
            return if is_unsigned(to) {
                self.b.ins().fcvt_to_uint_sat(tt, x)
            } else {
                self.b.ins().fcvt_to_sint_sat(tt, x)
            };
        }
        let (lo, hi) = if is_unsigned(to) { (0, 255) } else { (-128, 127) };
        let w = self.b.ins().fcvt_to_sint_sat(types::I32, x);
        let lo = self.iconst(types::I32, lo);
        let hi = self.iconst(types::I32, hi);
        let w = self.b.ins().smax(w, lo);
        let w = self.b.ins().smin(w, hi);
        self.b.ins().ireduce(tt, w)
    }
}

pub(super) fn int_cc(op: BinOp, unsigned: bool) -> IntCC {
    match (op, unsigned) {
        (BinOp::Lt, false) => IntCC::SignedLessThan,
        (BinOp::Le, false) => IntCC::SignedLessThanOrEqual,
        (BinOp::Gt, false) => IntCC::SignedGreaterThan,
        (BinOp::Ge, false) => IntCC::SignedGreaterThanOrEqual,
        (BinOp::Lt, true) => IntCC::UnsignedLessThan,
        (BinOp::Le, true) => IntCC::UnsignedLessThanOrEqual,
        (BinOp::Gt, true) => IntCC::UnsignedGreaterThan,
        (BinOp::Ge, true) => IntCC::UnsignedGreaterThanOrEqual,
        (BinOp::Eq, _) => IntCC::Equal,
        _ => IntCC::NotEqual,
    }
}
