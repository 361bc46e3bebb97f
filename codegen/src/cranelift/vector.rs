//! Vectorized loops on Cranelift's 128-bit SIMD.
//!
//! A vectorized loop of `L` iterations runs its body once; each value of the
//! body is one of
//! - [`VVal::Uniform`]: the same scalar in every lane (it does not involve
//!   the loop variable, e.g. the broadcast `A[i, k]` of a matmul);
//! - [`VVal::Simd`]: native vectors (`f32x4`, `f64x2`, `i32x4`, or the masks
//!   their comparisons give), ⌈L / width⌉ of them, the last one partial;
//! - [`VVal::Lanes`]: one scalar per lane, for everything else.
//!
//! Contiguous f32/f64/i32 accesses (per `texc_schedules::analysis::access`)
//! and arithmetic, comparisons, selects, FMA, `sqrt`, `abs`, `floor`,
//! `ceil`, `round`, `max`, `min` on them are SIMD; any other operation runs
//! lane by lane on scalars. What must be lazy — a `select` or `&&`/`||` whose
//! other side reads memory, under a condition that differs between lanes —
//! and guards that differ between lanes run lane by lane as scalar code,
//! with branches, so no lane ever reads out of bounds.

use super::func::{flags, is_float, FnGen};
use super::R;
use crate::CodegenError;
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, BlockArg, InstBuilder, MemFlagsData, Type, Value};
use cranelift_module::Module;
use texc_compiler::ops::{BinOp, Intrinsic, MathFn, UnOp};
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_schedules::analysis::{self, involves, Access};
use texc_schedules::ir::Stmt;

/// A loop being vectorized: its variable takes `base..base + lanes`.
#[derive(Clone, Copy)]
pub(super) struct VecMode {
    pub var: VarId,
    pub base: i64,
    pub lanes: u32,
}

impl VecMode {
    /// Whether a body can run in vector mode (loops and buffers inside a
    /// vectorized loop cannot; such a loop runs serially instead).
    pub fn handles(body: &[Stmt]) -> bool {
        body.iter().all(|s| match s {
            Stmt::Store { .. } => true,
            Stmt::If { then, .. } => VecMode::handles(then),
            Stmt::For { .. }
            | Stmt::Alloc { .. }
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => false,
        })
    }
}

#[derive(Clone)]
pub(super) enum VVal {
    Uniform(Value),
    Lanes(Vec<Value>),
    /// Chunks of `ty` (a 128-bit vector type).
    Simd {
        chunks: Vec<Value>,
        ty: Type,
    },
}

/// The 128-bit vector type for values of an IR type, where SIMD is used.
fn simd_ty(t: Ty) -> Option<Type> {
    match t {
        Ty::Elem(ElemType::F32) => Some(types::F32X4),
        Ty::Elem(ElemType::F64) => Some(types::F64X2),
        Ty::Elem(ElemType::I32) => Some(types::I32X4),
        _ => None,
    }
}

/// The mask type of a comparison of vectors of `ty`.
fn mask_ty(ty: Type) -> Type {
    match ty.lane_bits() {
        64 => types::I64X2,
        _ => types::I32X4,
    }
}

fn vflags() -> MemFlagsData {
    // Vector accesses are element-aligned, not 16-byte aligned.
    MemFlagsData::new().with_notrap()
}

impl<M: Module> FnGen<'_, '_, M> {
    /// Run `then` with the loop variable bound to lane `l`'s value.
    fn at_lane<T>(&mut self, vm: VecMode, l: u32, then: impl FnOnce(&mut Self) -> R<T>) -> R<T> {
        let v = self.iconst(types::I64, vm.base + l as i64);
        let saved = self.vars.insert(vm.var, v);
        let r = then(self);
        match saved {
            Some(s) => self.vars.insert(vm.var, s),
            None => self.vars.remove(&vm.var),
        };
        r
    }

    pub fn vector_stmts(&mut self, body: &[Stmt], vm: VecMode) -> R<()> {
        for s in body {
            match s {
                Stmt::Store { tensor, indices, value } => self.vector_store(*tensor, indices, *value, vm)?,
                Stmt::If { cond, then } if analysis::lane_uniform(self.cx.f, *cond, vm.var) => {
                    let c = self.expr(*cond)?;
                    self.guarded(c, |g| g.vector_stmts(then, vm))?;
                }
                // A guard that differs between lanes: the statement, lane by lane.
                Stmt::If { .. } => {
                    for l in 0..vm.lanes {
                        self.at_lane(vm, l, |g| g.stmts(std::slice::from_ref(s)))?;
                    }
                }
                Stmt::For { .. }
                | Stmt::Alloc { .. }
                | Stmt::Barrier
                | Stmt::Async(_)
                | Stmt::Mma { .. }
                | Stmt::Wgmma(_)
                | Stmt::TileDot(_)
                | Stmt::WarpReduce(_)
                | Stmt::Prefetch { .. } => {
                    return Err(CodegenError::Backend("a loop, buffer or barrier inside a vectorized loop".into()))
                }
            }
        }
        Ok(())
    }

    fn vector_store(&mut self, t: TensorId, idx: &[TExprId], value: TExprId, vm: VecMode) -> R<()> {
        let v = self.vexpr(value, vm)?;
        let ty = self.cx.f.p.ty(value);
        match analysis::access(self.cx.f, t, idx, vm.var) {
            Access::Contiguous => {
                let addr = self.at_lane(vm, 0, |g| g.address(t, idx))?;
                let size = self.cx.f.p.tensor(t).elem.size() as i32;
                match simd_ty(ty) {
                    Some(vt) => {
                        let chunks = self.chunks_of(v, ty, vt, vm)?;
                        self.store_chunks(&chunks, vt, addr, size, vm.lanes)
                    }
                    None => {
                        let lanes = self.lanes_of(v, ty, vm);
                        for (l, x) in lanes.into_iter().enumerate() {
                            let a = self.b.ins().iadd_imm_s(addr, l as i64 * size as i64);
                            self.store_value(t, x, a)?;
                        }
                        Ok(())
                    }
                }
            }
            // Every lane writes the same element: the last lane's write is the one that stays.
            Access::Uniform => {
                let last = self.lanes_of(v, ty, vm).pop().expect("at least one lane");
                let addr = self.at_lane(vm, vm.lanes - 1, |g| g.address(t, idx))?;
                self.store_value(t, last, addr)
            }
            Access::Strided(_) | Access::Gather => {
                let lanes = self.lanes_of(v, ty, vm);
                for (l, x) in lanes.into_iter().enumerate() {
                    let addr = self.at_lane(vm, l as u32, |g| g.address(t, idx))?;
                    self.store_value(t, x, addr)?;
                }
                Ok(())
            }
        }
    }

    /// Store chunks of `vt` at `addr`: whole vectors, then the lanes of a partial last one.
    fn store_chunks(&mut self, chunks: &[Value], vt: Type, addr: Value, size: i32, lanes: u32) -> R<()> {
        let w = vt.lane_count();
        for (c, &chunk) in chunks.iter().enumerate() {
            let first = c as u32 * w;
            if first + w <= lanes {
                self.b.ins().store(vflags(), chunk, addr, first as i32 * size);
            } else {
                for k in 0..lanes - first {
                    let x = self.b.ins().extractlane(chunk, k as u8);
                    self.b.ins().store(flags(), x, addr, (first + k) as i32 * size);
                }
            }
        }
        Ok(())
    }

    /// Load chunks of `vt` from `addr` (a partial last chunk lane by lane).
    fn load_chunks(&mut self, vt: Type, addr: Value, size: i32, lanes: u32) -> Vec<Value> {
        let w = vt.lane_count();
        let n = lanes.div_ceil(w);
        (0..n)
            .map(|c| {
                let first = c * w;
                if first + w <= lanes {
                    self.b.ins().load(vt, vflags(), addr, first as i32 * size)
                } else {
                    let zero = self.zero_vector(vt);
                    (0..lanes - first).fold(zero, |v, k| {
                        let x = self.b.ins().load(vt.lane_type(), flags(), addr, (first + k) as i32 * size);
                        self.b.ins().insertlane(v, x, k as u8)
                    })
                }
            })
            .collect()
    }

    fn zero_vector(&mut self, vt: Type) -> Value {
        let z = match vt.lane_type() {
            types::F32 => self.b.ins().f32const(0.0),
            types::F64 => self.b.ins().f64const(0.0),
            lt => self.b.ins().iconst(lt, 0),
        };
        self.b.ins().splat(vt, z)
    }

    /// Every lane's scalar.
    pub fn lanes_of(&mut self, v: VVal, ty: Ty, vm: VecMode) -> Vec<Value> {
        match v {
            VVal::Uniform(x) => vec![x; vm.lanes as usize],
            VVal::Lanes(xs) => xs,
            VVal::Simd { chunks, ty: vt } => {
                let w = vt.lane_count();
                (0..vm.lanes)
                    .map(|l| {
                        let x = self.b.ins().extractlane(chunks[(l / w) as usize], (l % w) as u8);
                        if ty == Ty::Elem(ElemType::Bool) {
                            self.b.ins().icmp_imm_s(cranelift_codegen::ir::condcodes::IntCC::NotEqual, x, 0)
                        } else {
                            x
                        }
                    })
                    .collect()
            }
        }
    }

    /// Chunks of `vt` holding the lanes of a non-bool value.
    fn chunks_of(&mut self, v: VVal, ty: Ty, vt: Type, vm: VecMode) -> R<Vec<Value>> {
        let n = vm.lanes.div_ceil(vt.lane_count()) as usize;
        Ok(match v {
            VVal::Simd { chunks, ty: t } if t == vt => chunks,
            VVal::Uniform(x) => vec![self.b.ins().splat(vt, x); n],
            other => {
                let lanes = self.lanes_of(other, ty, vm);
                let w = vt.lane_count() as usize;
                lanes
                    .chunks(w)
                    .map(|part| {
                        let v = self.b.ins().splat(vt, part[0]);
                        part.iter().enumerate().skip(1).fold(v, |v, (k, &x)| self.b.ins().insertlane(v, x, k as u8))
                    })
                    .collect()
            }
        })
    }

    /// A vector expression (see the module documentation).
    pub fn vexpr(&mut self, e: TExprId, vm: VecMode) -> R<VVal> {
        let p = &self.cx.f.p;
        let ty = p.ty(e);
        if !involves(p, e, vm.var) {
            return Ok(VVal::Uniform(self.expr(e)?));
        }
        let node = p.expr(e).clone();
        match node {
            TExpr::Var(_) => {
                Ok(VVal::Lanes((0..vm.lanes).map(|l| self.iconst(types::I64, vm.base + l as i64)).collect()))
            }
            TExpr::Load(t, idx) => {
                let elem = self.cx.f.p.tensor(t).elem;
                match (analysis::access(self.cx.f, t, &idx, vm.var), simd_ty(ty)) {
                    (Access::Uniform, _) => {
                        let addr = self.at_lane(vm, 0, |g| g.address(t, &idx))?;
                        Ok(VVal::Uniform(self.load_value(t, addr)?))
                    }
                    (Access::Contiguous, Some(vt)) => {
                        let addr = self.at_lane(vm, 0, |g| g.address(t, &idx))?;
                        Ok(VVal::Simd { chunks: self.load_chunks(vt, addr, elem.size() as i32, vm.lanes), ty: vt })
                    }
                    _ => self.lane_by_lane(e, vm),
                }
            }
            TExpr::Unary(op, a) => {
                let x = self.vexpr(a, vm)?;
                match (op, x) {
                    (UnOp::Neg, VVal::Simd { chunks, ty: vt }) if is_float(ty) => {
                        Ok(VVal::Simd { chunks: chunks.into_iter().map(|c| self.b.ins().fneg(c)).collect(), ty: vt })
                    }
                    (UnOp::Not, VVal::Simd { chunks, ty: vt }) => {
                        Ok(VVal::Simd { chunks: chunks.into_iter().map(|c| self.b.ins().bnot(c)).collect(), ty: vt })
                    }
                    (op, x) => {
                        let lanes = self.lanes_of(x, self.cx.f.p.ty(a), vm);
                        Ok(VVal::Lanes(lanes.into_iter().map(|v| self.unary_v(op, ty, v)).collect()))
                    }
                }
            }
            TExpr::Binary(BinOp::And | BinOp::Or, _, b) if analysis::reads_memory(&self.cx.f.p, b) => {
                self.lane_by_lane(e, vm)
            }
            TExpr::Binary(op, a, b) => {
                let operand = self.cx.f.p.ty(a);
                let (x, y) = (self.vexpr(a, vm)?, self.vexpr(b, vm)?);
                self.vector_binary(op, ty, operand, x, y, vm)
            }
            TExpr::Select(c, a, b) => {
                let lazy = analysis::reads_memory(&self.cx.f.p, a) || analysis::reads_memory(&self.cx.f.p, b);
                if lazy && analysis::lane_uniform(self.cx.f, c, vm.var) {
                    return self.uniform_branch(c, a, b, ty, vm);
                }
                if lazy {
                    return self.lane_by_lane(e, vm);
                }
                let cond_ty = self.cx.f.p.ty(c);
                let (cv, x, y) = (self.vexpr(c, vm)?, self.vexpr(a, vm)?, self.vexpr(b, vm)?);
                self.vector_select(cv, cond_ty, x, y, ty, vm)
            }
            TExpr::Math(f, args) => {
                let vals = args.iter().map(|&x| self.vexpr(x, vm)).collect::<R<Vec<_>>>()?;
                self.vector_math(f, ty, vals, vm)
            }
            TExpr::Intrinsic(Intrinsic::Fma, args) => {
                let vals = args.iter().map(|&x| self.vexpr(x, vm)).collect::<R<Vec<_>>>()?;
                match simd_ty(ty).filter(|_| is_float(ty) && vals.iter().all(|v| !matches!(v, VVal::Lanes(_)))) {
                    Some(vt) => {
                        let mut cs = Vec::new();
                        for v in vals {
                            cs.push(self.chunks_of(v, ty, vt, vm)?);
                        }
                        let chunks = (0..cs[0].len()).map(|k| self.b.ins().fma(cs[0][k], cs[1][k], cs[2][k])).collect();
                        Ok(VVal::Simd { chunks, ty: vt })
                    }
                    None => self.per_lane(vals, ty, vm, |g, v| g.intrinsic_v(Intrinsic::Fma, ty, v)),
                }
            }
            TExpr::Intrinsic(i @ (Intrinsic::Dot4 | Intrinsic::Dot2 | Intrinsic::Dot4Sat), _) => {
                self.intrinsic_v(i, ty, &[]).map(|v| VVal::Lanes(vec![v]))
            }
            TExpr::Cast(a) => {
                let from = self.cx.f.p.ty(a);
                let x = self.vexpr(a, vm)?;
                if from == ty {
                    // A rounding point for the interpreter; values of the type already.
                    return Ok(x);
                }
                let lanes = self.lanes_of(x, from, vm);
                let out = lanes.into_iter().map(|v| self.cast_v(v, from, ty)).collect::<R<Vec<_>>>()?;
                Ok(VVal::Lanes(out))
            }
            TExpr::Int(_) | TExpr::Float(_) | TExpr::Scalar(_) | TExpr::Reduce(..) => self.lane_by_lane(e, vm),
        }
    }

    /// `select(c, a, b)` with a condition the same in every lane: one branch
    /// around vector code for each side (SIMD chunks, or lanes, as block parameters).
    fn uniform_branch(&mut self, c: TExprId, a: TExprId, b: TExprId, ty: Ty, vm: VecMode) -> R<VVal> {
        let cv = self.expr(c)?;
        let (then_b, else_b, merge) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
        let (param_ty, n) = match simd_ty(ty) {
            Some(vt) => (vt, vm.lanes.div_ceil(vt.lane_count())),
            None => (super::func::reg_ty(ty), vm.lanes),
        };
        for _ in 0..n {
            self.b.append_block_param(merge, param_ty);
        }
        self.b.ins().brif(cv, then_b, &[], else_b, &[]);
        for (block, side) in [(then_b, a), (else_b, b)] {
            self.b.switch_to_block(block);
            let v = self.vexpr(side, vm)?;
            let vals = match simd_ty(ty) {
                Some(vt) => self.chunks_of(v, ty, vt, vm)?,
                None => self.lanes_of(v, ty, vm),
            };
            let args: Vec<BlockArg> = vals.into_iter().map(BlockArg::Value).collect();
            self.b.ins().jump(merge, &args);
        }
        self.b.switch_to_block(merge);
        let params = self.b.block_params(merge).to_vec();
        Ok(match simd_ty(ty) {
            Some(vt) => VVal::Simd { chunks: params, ty: vt },
            None => VVal::Lanes(params),
        })
    }

    /// `e` evaluated as scalar code once per lane (lazy constructs keep their branches).
    fn lane_by_lane(&mut self, e: TExprId, vm: VecMode) -> R<VVal> {
        let mut out = Vec::with_capacity(vm.lanes as usize);
        for l in 0..vm.lanes {
            out.push(self.at_lane(vm, l, |g| g.expr(e))?);
        }
        Ok(VVal::Lanes(out))
    }

    /// A scalar operation applied lane by lane to already computed operands.
    fn per_lane(
        &mut self,
        vals: Vec<VVal>,
        ty: Ty,
        vm: VecMode,
        op: impl Fn(&mut Self, &[Value]) -> R<Value>,
    ) -> R<VVal> {
        let lanes: Vec<Vec<Value>> = vals.into_iter().map(|v| self.lanes_of(v, ty, vm)).collect();
        let out = (0..vm.lanes as usize)
            .map(|l| {
                let args: Vec<Value> = lanes.iter().map(|x| x[l]).collect();
                op(self, &args)
            })
            .collect::<R<Vec<_>>>()?;
        Ok(VVal::Lanes(out))
    }

    fn vector_binary(&mut self, op: BinOp, ty: Ty, operand: Ty, x: VVal, y: VVal, vm: VecMode) -> R<VVal> {
        let simd_ok = !matches!(x, VVal::Lanes(_)) && !matches!(y, VVal::Lanes(_));
        let vt = simd_ty(operand).filter(|_| simd_ok);
        // SIMD arithmetic: + - * on f32/f64/i32, / on floats (integer division is scalar).
        let simd_arith = match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul => true,
            BinOp::Div => is_float(ty),
            _ => false,
        };
        match vt {
            Some(vt) if op.is_comparison() => {
                let (a, b) = (self.chunks_of(x, operand, vt, vm)?, self.chunks_of(y, operand, vt, vm)?);
                let chunks = a
                    .iter()
                    .zip(&b)
                    .map(|(&a, &b)| {
                        if is_float(operand) {
                            let cc = match op {
                                BinOp::Lt => FloatCC::LessThan,
                                BinOp::Le => FloatCC::LessThanOrEqual,
                                BinOp::Gt => FloatCC::GreaterThan,
                                BinOp::Ge => FloatCC::GreaterThanOrEqual,
                                BinOp::Eq => FloatCC::Equal,
                                _ => FloatCC::NotEqual,
                            };
                            self.b.ins().fcmp(cc, a, b)
                        } else {
                            self.b.ins().icmp(super::func::int_cc(op, false), a, b)
                        }
                    })
                    .collect();
                Ok(VVal::Simd { chunks, ty: mask_ty(vt) })
            }
            Some(vt) if simd_arith => {
                let (a, b) = (self.chunks_of(x, operand, vt, vm)?, self.chunks_of(y, operand, vt, vm)?);
                let float = is_float(ty);
                let chunks = a
                    .iter()
                    .zip(&b)
                    .map(|(&a, &b)| {
                        let i = self.b.ins();
                        match (op, float) {
                            (BinOp::Add, true) => i.fadd(a, b),
                            (BinOp::Sub, true) => i.fsub(a, b),
                            (BinOp::Mul, true) => i.fmul(a, b),
                            (BinOp::Div, true) => i.fdiv(a, b),
                            (BinOp::Add, false) => i.iadd(a, b),
                            (BinOp::Sub, false) => i.isub(a, b),
                            _ => i.imul(a, b),
                        }
                    })
                    .collect();
                Ok(VVal::Simd { chunks, ty: vt })
            }
            _ => {
                // Masks of the same shape combine as vectors; all else lane by lane.
                if let (true, VVal::Simd { chunks: a, ty: ta }, VVal::Simd { chunks: b, ty: tb }) =
                    (op.is_logic(), &x, &y)
                {
                    if ta == tb {
                        let chunks = a
                            .iter()
                            .zip(b)
                            .map(
                                |(&a, &b)| {
                                    if op == BinOp::And {
                                        self.b.ins().band(a, b)
                                    } else {
                                        self.b.ins().bor(a, b)
                                    }
                                },
                            )
                            .collect();
                        return Ok(VVal::Simd { chunks, ty: *ta });
                    }
                }
                let (a, b) = (self.lanes_of(x, operand, vm), self.lanes_of(y, operand, vm));
                let out =
                    a.into_iter().zip(b).map(|(a, b)| self.binary_v(op, ty, operand, a, b)).collect::<R<Vec<_>>>()?;
                Ok(VVal::Lanes(out))
            }
        }
    }

    fn vector_select(&mut self, c: VVal, cond_ty: Ty, x: VVal, y: VVal, ty: Ty, vm: VecMode) -> R<VVal> {
        match (simd_ty(ty), &c) {
            (Some(vt), VVal::Uniform(cv)) if !matches!(x, VVal::Lanes(_)) && !matches!(y, VVal::Lanes(_)) => {
                let cv = *cv;
                let (a, b) = (self.chunks_of(x, ty, vt, vm)?, self.chunks_of(y, ty, vt, vm)?);
                let chunks = a.iter().zip(&b).map(|(&a, &b)| self.b.ins().select(cv, a, b)).collect();
                Ok(VVal::Simd { chunks, ty: vt })
            }
            (Some(vt), VVal::Simd { chunks: masks, ty: mt })
                if *mt == mask_ty(vt) && vt.lane_count() == mt.lane_count() =>
            {
                let masks = masks.clone();
                let (a, b) = (self.chunks_of(x, ty, vt, vm)?, self.chunks_of(y, ty, vt, vm)?);
                let le = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
                let chunks = masks
                    .iter()
                    .zip(a.iter().zip(&b))
                    .map(|(&m, (&a, &b))| {
                        let m = if mt == &vt { m } else { self.b.ins().bitcast(vt, le, m) };
                        self.b.ins().bitselect(m, a, b)
                    })
                    .collect();
                Ok(VVal::Simd { chunks, ty: vt })
            }
            _ => {
                let cs = self.lanes_of(c, cond_ty, vm);
                let (a, b) = (self.lanes_of(x, ty, vm), self.lanes_of(y, ty, vm));
                let out = (0..vm.lanes as usize).map(|l| self.b.ins().select(cs[l], a[l], b[l])).collect();
                Ok(VVal::Lanes(out))
            }
        }
    }

    fn vector_math(&mut self, f: MathFn, ty: Ty, vals: Vec<VVal>, vm: VecMode) -> R<VVal> {
        let simd_fn = matches!(
            f,
            MathFn::Sqrt
                | MathFn::Abs
                | MathFn::Floor
                | MathFn::Ceil
                | MathFn::Round
                | MathFn::Max
                | MathFn::Min
                | MathFn::Clamp
        );
        let all_simd = vals.iter().all(|v| !matches!(v, VVal::Lanes(_)));
        match simd_ty(ty).filter(|_| simd_fn && all_simd && is_float(ty)) {
            Some(vt) => {
                let mut cs = Vec::new();
                for v in vals {
                    cs.push(self.chunks_of(v, ty, vt, vm)?);
                }
                let chunks = (0..cs[0].len())
                    .map(|k| {
                        let i = self.b.ins();
                        match f {
                            MathFn::Sqrt => i.sqrt(cs[0][k]),
                            MathFn::Abs => i.fabs(cs[0][k]),
                            MathFn::Floor => i.floor(cs[0][k]),
                            MathFn::Ceil => i.ceil(cs[0][k]),
                            MathFn::Round => i.nearest(cs[0][k]),
                            MathFn::Max => i.fmax(cs[0][k], cs[1][k]),
                            MathFn::Min => i.fmin(cs[0][k], cs[1][k]),
                            _ => {
                                let lo = i.fmax(cs[0][k], cs[1][k]);
                                self.b.ins().fmin(lo, cs[2][k])
                            }
                        }
                    })
                    .collect();
                Ok(VVal::Simd { chunks, ty: vt })
            }
            None => self.per_lane(vals, ty, vm, |g, v| g.math_v(f, ty, v)),
        }
    }
}
