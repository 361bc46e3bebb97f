//! Expressions: constants, variables, arithmetic, comparisons, short-circuit
//! logic, selects and conversions, in scalar and vector code.

use super::gen::{Frame, Gen, Mode};
use super::{llvm_err, R};
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{BasicValueEnum, IntValue, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};
use texc_compiler::ops::{BinOp, UnOp};
use texc_compiler::tir::{TExpr, TExprId, Ty};
use texc_compiler::types::ElemType;
use texc_schedules::analysis;

pub(super) fn bool_ty(t: Ty) -> bool {
    t == Ty::Elem(ElemType::Bool)
}

pub(super) fn float_ty(t: Ty) -> bool {
    matches!(t, Ty::Elem(e) if e.is_float())
}

pub(super) fn unsigned_ty(t: Ty) -> bool {
    t == Ty::Elem(ElemType::U8)
}

fn byte_ty(t: Ty) -> bool {
    matches!(t, Ty::Elem(ElemType::U8 | ElemType::I8))
}

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn expr(&mut self, fr: &mut Frame<'ctx>, e: TExprId, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
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
                    let x = *fr.vars.get(&v).ok_or_else(|| llvm_err(format!("unbound variable {v}")))?;
                    self.lift(x.into(), mode)
                }
            },
            TExpr::Scalar(s) => self.lift(fr.scalars[s as usize], mode),
            TExpr::Load(t, idx) => match fr.transposed.get(&e) {
                Some(&column) => Ok(column),
                None => self.load(fr, t, &idx, mode),
            },
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
                    self.float_neg(x)
                } else {
                    self.arith(BinOp::Sub, zero, x, ty)
                }
            }
            TExpr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => self.logic(fr, op, a, b, mode),
            TExpr::Binary(op, a, b) => {
                let oty = self.f.p.ty(a);
                if let Mode::Vector { var, base, lanes, .. } = mode {
                    if let Some(m) = self.lane_offset_compare(fr, op, (a, b), (var, base, lanes))? {
                        return Ok(m.into());
                    }
                    if op == BinOp::Add {
                        if let Some(w) = self.byte_word(fr, e, mode)? {
                            return Ok(w.into());
                        }
                    }
                }
                let x = self.expr(fr, a, mode)?;
                let y = self.expr(fr, b, mode)?;
                if op.is_comparison() {
                    self.compare(op, x, y, oty)
                } else {
                    self.arith(op, x, y, ty)
                }
            }
            TExpr::Select(c, a, b) => self.select(fr, c, a, b, ty, mode),
            TExpr::Math(f, args) => {
                let mut vals = Vec::new();
                for a in args {
                    vals.push(self.expr(fr, a, mode)?);
                }
                self.math(f, &vals, ty, mode)
            }
            TExpr::Intrinsic(i, args) => {
                let mut vals = Vec::new();
                for a in args {
                    vals.push(self.expr(fr, a, mode)?);
                }
                self.intrinsic_op(i, &vals, ty, mode)
            }
            TExpr::Cast(a) => {
                let from = self.f.p.ty(a);
                if let Some(bounds) = byte_clamp(&self.f.p, a, ty) {
                    return self.clamped_to_byte(fr, bounds, ty, mode);
                }
                let x = self.expr(fr, a, mode)?;
                self.cast(x, from, ty, mode.lanes())
            }
            TExpr::Reduce(..) => Err(llvm_err("a reduction reached code generation")),
        }
    }

    pub(super) fn lift(&self, v: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        match mode.lanes() {
            Some(l) => Ok(self.splat(v, l)?.into()),
            None => Ok(v),
        }
    }

    /// `a && b` / `a || b`, evaluating `b` only where needed if it reads memory.
    pub(super) fn logic(
        &mut self,
        fr: &mut Frame<'ctx>,
        op: BinOp,
        a: TExprId,
        b: TExprId,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let x = self.expr(fr, a, mode)?;
        let lazy = analysis::reads_memory(&self.f.p, b);
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

    pub(super) fn select(
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
            if analysis::lane_uniform(self.f, c, var) {
                let cs = self.expr(fr, c, Mode::Scalar)?.into_int_value();
                return self.branch(fr, cs, a, b, self.ty_in(ty, mode), mode);
            }
            if let Some(parts) = split_by_lanes(self.f, c, var) {
                return self.select_in_branch(fr, &parts, a, b, ty, mode);
            }
        }
        let cv = self.expr(fr, c, mode)?;
        match mode {
            Mode::Vector { .. } => self.masked_select(fr, cv.into_vector_value(), a, b, mode),
            Mode::Scalar if !analysis::reads_memory(&self.f.p, a) && !analysis::reads_memory(&self.f.p, b) => {
                let x = self.expr(fr, a, mode)?;
                let y = self.expr(fr, b, mode)?;
                Ok(self.b.build_select(cv.into_int_value(), x, y, "sel")?)
            }
            Mode::Scalar => self.branch(fr, cv.into_int_value(), a, b, self.scalar_ty(ty), mode),
        }
    }

    /// `a` where vector condition `cm` holds, else `b`: each side computed
    /// under its lanes' mask (so its loads read only those lanes).
    fn masked_select(
        &mut self,
        fr: &mut Frame<'ctx>,
        cm: VectorValue<'ctx>,
        a: TExprId,
        b: TExprId,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let not_c = self.b.build_not(cm, "notc")?;
        let ma = self.and_mask(mode.mask(), cm)?;
        let mb = self.and_mask(mode.mask(), not_c)?;
        let x = self.expr(fr, a, mode.with_mask(Some(ma)))?;
        let y = self.expr(fr, b, mode.with_mask(Some(mb)))?;
        Ok(self.b.build_select(cm, x, y, "sel")?)
    }

    /// A vector select whose condition is a conjunction (or disjunction)
    /// of parts the same in every lane and parts that are not
    /// ([`split_by_lanes`]): `if u { select(l, a, b) } else { b }` for `u
    /// && l`, `if u { a } else { select(l, a, b) }` for `u || l`. A padding
    /// copy's row condition then branches once per row, and only its
    /// columns' condition is a mask (and masks the loads), where the whole
    /// condition was computed, broadcast and combined per vector.
    fn select_in_branch(
        &mut self,
        fr: &mut Frame<'ctx>,
        parts: &LaneSplit,
        a: TExprId,
        b: TExprId,
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let and = parts.op == BinOp::And;
        // The uniform parts read no memory: all of them, in one value.
        let mut us: Option<IntValue<'ctx>> = None;
        for &u in &parts.uniform {
            let v = self.expr(fr, u, Mode::Scalar)?.into_int_value();
            us = Some(match us {
                None => v,
                Some(acc) if and => self.b.build_and(acc, v, "all")?,
                Some(acc) => self.b.build_or(acc, v, "any")?,
            });
        }
        let us = us.expect("a uniform part");
        let then_bb = self.cx.append_basic_block(fr.func, "sel.then");
        let else_bb = self.cx.append_basic_block(fr.func, "sel.else");
        let merge = self.cx.append_basic_block(fr.func, "sel.end");
        self.b.build_conditional_branch(us, then_bb, else_bb)?;
        // The side the uniform part decides alone, and the side that
        // still depends on the lanes.
        let (decided, decided_bb, open_bb) = if and { (b, else_bb, then_bb) } else { (a, then_bb, else_bb) };
        self.b.position_at_end(decided_bb);
        let d = self.expr(fr, decided, mode)?;
        let d_end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(open_bb);
        // Each lane part is read only where the parts before it leave the
        // chain undecided, as `logic` reads `b` of `a && b` (the bounds
        // checker accepts reads that the earlier parts guard).
        let mut cm: Option<VectorValue<'ctx>> = None;
        for &l in &parts.lanes {
            let guard = match cm {
                None => mode.mask(),
                Some(acc) if and => Some(self.and_mask(mode.mask(), acc)?),
                Some(acc) => Some(self.and_mask(mode.mask(), self.b.build_not(acc, "not")?)?),
            };
            let v = self.expr(fr, l, mode.with_mask(guard))?.into_vector_value();
            cm = Some(match cm {
                None => v,
                Some(acc) if and => self.b.build_and(acc, v, "all")?,
                Some(acc) => self.b.build_or(acc, v, "any")?,
            });
        }
        let o = self.masked_select(fr, cm.expect("a lane part"), a, b, mode)?;
        let o_end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(merge);
        let phi = self.b.build_phi(self.ty_in(ty, mode), "sel")?;
        phi.add_incoming(&[(&d, d_end), (&o, o_end)]);
        Ok(phi.as_basic_value())
    }

    /// `if c { a } else { b }` with a phi of type `ty`.
    pub(super) fn branch(
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

    /// An `i32` made of bytes, `Σ_t i32(x_t) · 256^t` over distinct `t < 4`
    /// (`crate::dot4`'s words of a window, read in place), where each `x_t`
    /// loads a row at a constant offset: one load of the span and one
    /// shuffle ([`Gen::byte_window`]) instead of each byte vector widened
    /// to 32 bits, shifted and added. `None` for any other sum (packed
    /// copies' words, whose parts are vectors of lanes apart, widen in
    /// place: interleaving them moved lanes across the register).
    fn byte_word(&mut self, fr: &mut Frame<'ctx>, e: TExprId, mode: Mode<'ctx>) -> R<Option<VectorValue<'ctx>>> {
        let Mode::Vector { var, base, lanes, mask } = mode else { return Ok(None) };
        let Some(parts) = byte_parts(&self.f.p, e) else { return Ok(None) };
        self.byte_window(fr, &parts, (var, base, lanes), mask)
    }

    /// A comparison of index values whose lanes `var = base + l` each move
    /// by a compile-time constant from lane 0 (a padding's `x.o * 8 + x.v
    /// >= 1`): `a[l] op b[l]` is `δ[l] op b₀ − a₀`, with `δ` the lanes'
    /// constant moves and `b₀ − a₀` computed once, as a scalar, at lane 0;
    /// compared in the narrowest integer lanes that hold `δ` (the scalar
    /// clamped to them, which no `δ` reaches, so no comparison changes).
    /// 64-bit index lanes take AVX2 two compares and the packs to bytes for
    /// 8 lanes, bytes one (MEASURED: a `u8` padding copy, 96 × 112 × 112 on
    /// AVX2, 0.41–0.46 → 0.35 ms; with the span loads of `span_load`, a
    /// stride-2 depthwise convolution reading it 1.12–1.19 → 0.58). `None`
    /// for other comparisons: not of indices, reading memory, or lanes
    /// that do not move by constants.
    fn lane_offset_compare(
        &mut self,
        fr: &mut Frame<'ctx>,
        op: BinOp,
        (a, b): (TExprId, TExprId),
        (var, base, lanes): (u32, i64, u32),
    ) -> R<Option<VectorValue<'ctx>>> {
        let p = &self.f.p;
        if !op.is_comparison() || p.ty(a) != Ty::Index || analysis::reads_memory(p, a) || analysis::reads_memory(p, b) {
            return Ok(None);
        }
        let moves = |e| analysis::lane_deltas(p, e, var, base, lanes as usize);
        let (Some(da), Some(db)) = (moves(a), moves(b)) else { return Ok(None) };
        let Some(delta) = da.iter().zip(&db).map(|(x, y)| x.checked_sub(*y)).collect::<Option<Vec<i64>>>() else {
            return Ok(None);
        };
        let reach = delta.iter().map(|d| d.unsigned_abs()).max().unwrap_or(0);
        let Some(bits) = [8u32, 16, 32].into_iter().find(|&w| reach < 1 << (w - 2)) else { return Ok(None) };
        let lane0 = self.cx.i64_type().const_int(base as u64, true);
        let outer = fr.vars.insert(var, lane0);
        let at_lane0 = |g: &mut Self, fr: &mut Frame<'ctx>| -> R<_> {
            Ok((g.expr(fr, a, Mode::Scalar)?, g.expr(fr, b, Mode::Scalar)?))
        };
        let at_lane0 = at_lane0(self, fr);
        match outer {
            Some(v) => fr.vars.insert(var, v),
            None => fr.vars.remove(&var),
        };
        let (a0, b0) = at_lane0?;
        let gap = self.b.build_int_sub(b0.into_int_value(), a0.into_int_value(), "gap")?;
        let it = gap.get_type();
        let (lo, hi) = (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1);
        let clamp = |g: &Self, x: IntValue<'ctx>, bound: i64, pred| -> R<IntValue<'ctx>> {
            let k = it.const_int(bound as u64, true);
            let keep = g.b.build_int_compare(pred, x, k, "in")?;
            Ok(g.b.build_select(keep, x, k, "clamp")?.into_int_value())
        };
        let gap = clamp(self, clamp(self, gap, hi, IntPredicate::SLT)?, lo, IntPredicate::SGT)?;
        let nt = match bits {
            8 => self.cx.i8_type(),
            16 => self.cx.i16_type(),
            _ => self.cx.i32_type(),
        };
        let gap = self.b.build_int_truncate(gap, nt, "gap")?;
        let gaps = self.splat(gap.into(), lanes)?;
        let moves: Vec<IntValue> = delta.iter().map(|&d| nt.const_int(d as u64, true)).collect();
        let m = self.compare(op, VectorType::const_vector(&moves).into(), gaps.into(), Ty::Index)?;
        Ok(Some(m.into_vector_value()))
    }

    /// `−x` of a float or float vector: a sign flip (`fneg`), not `0 − x`,
    /// which would turn −0 into +0.
    pub(super) fn float_neg(&self, x: BasicValueEnum<'ctx>) -> R<BasicValueEnum<'ctx>> {
        Ok(match x {
            BasicValueEnum::VectorValue(v) => self.b.build_float_neg(v, "neg")?.into(),
            _ => self.b.build_float_neg(x.into_float_value(), "neg")?.into(),
        })
    }

    pub(super) fn compare(
        &self,
        op: BinOp,
        x: BasicValueEnum<'ctx>,
        y: BasicValueEnum<'ctx>,
        oty: Ty,
    ) -> R<BasicValueEnum<'ctx>> {
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

    pub(super) fn sel(
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

    /// Arithmetic of legalized code: wrapping integers, IEEE floats, machine
    /// division (floor semantics were made explicit by legalization).
    pub(super) fn arith(
        &self,
        op: BinOp,
        x: BasicValueEnum<'ctx>,
        y: BasicValueEnum<'ctx>,
        ty: Ty,
    ) -> R<BasicValueEnum<'ctx>> {
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
                    _ => return Err(llvm_err("mismatched operands")),
                }
            };
        }
        let r: BasicValueEnum = match op {
            BinOp::Add => both!(build_int_add, build_float_add),
            BinOp::Sub => both!(build_int_sub, build_float_sub),
            BinOp::Mul => both!(build_int_mul, build_float_mul),
            BinOp::Div if float_ty(ty) => both!(build_int_add, build_float_div),
            // Legalization guarantees the divisor is neither 0 nor -1.
            BinOp::TruncDiv if unsigned_ty(ty) => self.udiv(x, y)?,
            BinOp::TruncRem if unsigned_ty(ty) => self.urem(x, y)?,
            BinOp::TruncDiv => self.sdiv(x, y)?,
            BinOp::UDiv => self.udiv(x, y)?,
            BinOp::URem => self.urem(x, y)?,
            BinOp::TruncRem => self.srem(x, y)?,
            _ => return Err(llvm_err(format!("`{op:?}` is not an arithmetic operation of legalized code"))),
        };
        Ok(r)
    }

    /// Conversions with the interpreter's semantics (saturating float to int).
    #[allow(clippy::too_many_lines)]
    pub(super) fn cast(
        &self,
        x: BasicValueEnum<'ctx>,
        from: Ty,
        to: Ty,
        lanes: Option<u32>,
    ) -> R<BasicValueEnum<'ctx>> {
        if from == to {
            return Ok(x);
        }
        // bf16 converts through f32, whose upper half it is.
        let (bf16, f32t) = (Ty::Elem(ElemType::BF16), Ty::Elem(ElemType::F32));
        if from == bf16 {
            let wide = self.bf16_to_f32(x, lanes)?;
            return self.cast(wide, f32t, to, lanes);
        }
        if to == bf16 {
            let wide = self.cast(x, from, f32t, lanes)?;
            return self.f32_to_bf16(wide, lanes);
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
            (true, false) if byte_ty(to) && matches!(from, Ty::Elem(ElemType::F32 | ElemType::F64)) => {
                self.float_to_byte(x, from, to, mode)?
            }
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

impl<'ctx> Gen<'ctx, '_> {
    /// f32 or f64 `x` to `u8`/`i8` as the language converts (truncating,
    /// saturating at the bounds, NaN giving 0): clamped in float, where both
    /// bounds are exact, then converted to i32 and truncated. LLVM lowers
    /// `llvm.fpto[us]i.sat` to bytes on x86 lane by lane (a compare, a
    /// conversion and an insert per lane: requantizing epilogues ran as long
    /// as their convolutions); this is a few whole-vector instructions.
    fn float_to_byte(&self, x: BasicValueEnum<'ctx>, from: Ty, to: Ty, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let (lo, hi) = if unsigned_ty(to) { (0.0, 255.0) } else { (-128.0, 127.0) };
        let c = |v: f64| self.const_of(from, 0, v, mode);
        // `a > lo ? a : lo` is x86's `max(a, lo)`, which gives `lo` for NaN:
        // 0 for u8; i8 first sends NaN to 0.
        let x = if unsigned_ty(to) { x } else { self.float_pick(FloatPredicate::ORD, x, c(0.0)?)? };
        let x = self.float_pick(FloatPredicate::OGT, x, c(lo)?)?;
        let x = self.float_pick(FloatPredicate::OLT, x, c(hi)?)?;
        self.truncate_to_byte(x, to, mode)
    }

    /// `to(clamp(x, lo, hi))`, a byte type `to`, float bounds within its
    /// range ([`byte_clamp`]; a requantization's saturation, `u8(clamp(...,
    /// 0.0, 255.0))`): `clamp` keeps NaN, and the conversion sends NaN to 0
    /// and saturates at the type's bounds, which `[lo, hi]` lies within —
    /// so it is `ord(x) ? min(max(x, lo), hi) : 0`, converted: the NaN test
    /// once, without the conversion's own clamp after the `clamp`'s (a third
    /// of an int8 layer's epilogue).
    fn clamped_to_byte(
        &mut self,
        fr: &mut Frame<'ctx>,
        (x, lo, hi): (TExprId, f64, f64),
        to: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let from = self.f.p.ty(x);
        if let Some((y, zero_point)) = self.rounded_on_x86(x, (lo, hi)) {
            return self.rounded_to_byte(fr, (y, zero_point, lo, hi), to, mode);
        }
        let x = self.expr(fr, x, mode)?;
        let c = |v: f64| self.const_of(from, 0, v, mode);
        let nan_is_lo = lo == 0.0;
        let (lo, hi, zero) = (c(lo)?, c(hi)?, c(0.0)?);
        // `a > lo ? a : lo` is x86's `max(a, lo)`: NaN gives `lo`, then 0
        // here (nothing to do where `lo` is 0: a ReLU's requantization).
        let clamped = self.float_pick(FloatPredicate::OLT, self.float_pick(FloatPredicate::OGT, x, lo)?, hi)?;
        let number = match nan_is_lo {
            true => clamped,
            false => self.float_select(FloatPredicate::ORD, (x, x), clamped, zero)?,
        };
        self.truncate_to_byte(number, to, mode)
    }

    /// `(y, z)` where `x` is `round(y) + z` (or `round(y)`, `z` 0) of an f32
    /// `y`, `z` and the bounds whole numbers, on x86: [`Gen::rounded_to_byte`].
    fn rounded_on_x86(&self, x: TExprId, (lo, hi): (f64, f64)) -> Option<(TExprId, f64)> {
        use texc_compiler::ops::MathFn;
        let p = &self.f.p;
        let x86 = self.has_feature("avx2") || self.has_feature("avx512f");
        if !x86 || p.ty(x) != Ty::Elem(ElemType::F32) || lo.fract() != 0.0 || hi.fract() != 0.0 {
            return None;
        }
        let round = |e: TExprId| match p.expr(unrounded(p, e)) {
            TExpr::Math(MathFn::Round, a) if a.len() == 1 => Some(a[0]),
            _ => None,
        };
        let (y, z) = match *p.expr(unrounded(p, x)) {
            TExpr::Binary(BinOp::Add, a, b) => match (round(a), p.expr(b)) {
                (Some(y), TExpr::Float(z)) => (y, *z),
                _ => return None,
            },
            _ => (round(x)?, 0.0),
        };
        (z.fract() == 0.0 && z.abs() <= 65536.0).then_some((y, z))
    }

    /// `to(clamp(round(y) + z, lo, hi))` with whole `z`, `lo` and `hi`
    /// ([`Gen::rounded_on_x86`]) as `to(lrint(clamp(y, lo - z, hi - z)) + z)`:
    /// whole bounds commute with rounding, the zero point is added as an
    /// integer (exact, where `y + z` in f32 is not), and `lrint` is x86's
    /// `cvtps2dq`, rounding half to even as `round` does — two instructions
    /// (`cvtps2dq`, an integer add) for three (`roundps`, an add,
    /// `cvttps2dq`), one for two without a zero point. NaN goes to
    /// `lo - z` through the clamp, so to `lo`: 0 as the conversion asks
    /// where `lo` is 0, else tested for.
    fn rounded_to_byte(
        &mut self,
        fr: &mut Frame<'ctx>,
        (y, z, lo, hi): (TExprId, f64, f64, f64),
        to: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let f32t = Ty::Elem(ElemType::F32);
        let i32t = Ty::Elem(ElemType::I32);
        let y = self.expr(fr, y, mode)?;
        let c = |v: f64| self.const_of(f32t, 0, v, mode);
        let below = self.float_pick(FloatPredicate::OGT, y, c(lo - z)?)?;
        let mut clamped = self.float_pick(FloatPredicate::OLT, below, c(hi - z)?)?;
        if lo != 0.0 {
            clamped = self.float_select(FloatPredicate::ORD, (y, y), clamped, c(-z)?)?;
        }
        let lrint = self.intrinsic("llvm.lrint", &[self.ty_in(i32t, mode), self.ty_in(f32t, mode)])?;
        let whole = self.call(lrint, &[clamped])?;
        let shifted = self.arith(BinOp::Add, whole, self.const_of(i32t, z as i64, 0.0, mode)?, i32t)?;
        self.int_truncate(shifted, to, mode)
    }

    /// Integer `x` (scalar or vector) truncated to the narrower integer type `to`.
    fn int_truncate(&self, x: BasicValueEnum<'ctx>, to: Ty, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let tt = self.ty_in(to, mode);
        Ok(match x {
            BasicValueEnum::VectorValue(v) => self.b.build_int_truncate(v, tt.into_vector_type(), "byte")?.into(),
            _ => self.b.build_int_truncate(x.into_int_value(), tt.into_int_type(), "byte")?.into(),
        })
    }

    /// `a p b ? a : b` on floats (a vector compare where they are vectors).
    fn float_pick(
        &self,
        p: FloatPredicate,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        self.float_select(p, (a, b), a, b)
    }

    /// `x p y ? a : b` on floats `x`, `y` (a vector compare where they are vectors).
    fn float_select(
        &self,
        p: FloatPredicate,
        (x, y): (BasicValueEnum<'ctx>, BasicValueEnum<'ctx>),
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        Ok(match (x, y) {
            (BasicValueEnum::VectorValue(u), BasicValueEnum::VectorValue(w)) => {
                let m = self.b.build_float_compare(p, u, w, "fcmp")?;
                self.b.build_select(m, a, b, "sat")?
            }
            _ => {
                let m = self.b.build_float_compare(p, x.into_float_value(), y.into_float_value(), "fcmp")?;
                self.b.build_select(m, a, b, "sat")?
            }
        })
    }

    /// Float `x`, already inside byte type `to`'s range, converted to it
    /// (truncating through `i32`: exact there).
    fn truncate_to_byte(&self, x: BasicValueEnum<'ctx>, to: Ty, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let i32t = self.ty_in(Ty::Elem(ElemType::I32), mode);
        let w: BasicValueEnum = match x {
            BasicValueEnum::VectorValue(v) => {
                self.b.build_float_to_signed_int(v, i32t.into_vector_type(), "cv")?.into()
            }
            _ => self.b.build_float_to_signed_int(x.into_float_value(), i32t.into_int_type(), "cv")?.into(),
        };
        self.int_truncate(w, to, mode)
    }

    /// The f32 whose upper half are bf16 bits `x` (exact).
    pub(super) fn bf16_to_f32(&self, x: BasicValueEnum<'ctx>, lanes: Option<u32>) -> R<BasicValueEnum<'ctx>> {
        let mode = lanes.map_or(Mode::Scalar, |l| Mode::Vector { var: u32::MAX, base: 0, lanes: l, mask: None });
        let (i32t, f32t) = (self.ty_in(Ty::Elem(ElemType::I32), mode), self.ty_in(Ty::Elem(ElemType::F32), mode));
        let sixteen = self.const_of(Ty::Elem(ElemType::I32), 16, 0.0, mode)?;
        Ok(match x {
            BasicValueEnum::VectorValue(v) => {
                let w = self.b.build_int_z_extend(v, i32t.into_vector_type(), "bf")?;
                let w = self.b.build_left_shift(w, sixteen.into_vector_value(), "bf")?;
                self.b.build_bit_cast(w, f32t, "bf")?
            }
            _ => {
                let w = self.b.build_int_z_extend(x.into_int_value(), i32t.into_int_type(), "bf")?;
                let w = self.b.build_left_shift(w, sixteen.into_int_value(), "bf")?;
                self.b.build_bit_cast(w, f32t, "bf")?
            }
        })
    }

    /// f32 `x` rounded to bf16 bits, to nearest even (NaN stays a quiet NaN
    /// of its sign), as the interpreter rounds.
    pub(super) fn f32_to_bf16(&self, x: BasicValueEnum<'ctx>, lanes: Option<u32>) -> R<BasicValueEnum<'ctx>> {
        let mode = lanes.map_or(Mode::Scalar, |l| Mode::Vector { var: u32::MAX, base: 0, lanes: l, mask: None });
        let i32ty = Ty::Elem(ElemType::I32);
        let k = |v: i64| self.const_of(i32ty, v, 0.0, mode);
        let bits = self.b.build_bit_cast(x, self.ty_in(i32ty, mode), "bits")?;
        let nan = self.compare(BinOp::Ne, x, x, Ty::Elem(ElemType::F32))?;
        let high = self.lshr(bits, k(16)?)?;
        let lsb = self.and(high, k(1)?)?;
        let bias = self.arith(BinOp::Add, k(0x7FFF)?, lsb, i32ty)?;
        let rounded = self.lshr(self.arith(BinOp::Add, bits, bias, i32ty)?, k(16)?)?;
        let quiet = self.or(high, k(0x40)?)?;
        let pick = self.sel(nan, quiet, rounded)?;
        let i16t = self.ty_in(Ty::Elem(ElemType::BF16), mode);
        Ok(match pick {
            BasicValueEnum::VectorValue(v) => self.b.build_int_truncate(v, i16t.into_vector_type(), "bf16")?.into(),
            _ => self.b.build_int_truncate(pick.into_int_value(), i16t.into_int_type(), "bf16")?.into(),
        })
    }
}

macro_rules! int_op {
    ($name:ident, $build:ident) => {
        impl<'ctx> Gen<'ctx, '_> {
            pub(super) fn $name(&self, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>) -> R<BasicValueEnum<'ctx>> {
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
int_op!(and, build_and);
int_op!(or, build_or);

impl<'ctx> Gen<'ctx, '_> {
    /// `x >> y`, filling with zeros.
    pub(super) fn lshr(&self, x: BasicValueEnum<'ctx>, y: BasicValueEnum<'ctx>) -> R<BasicValueEnum<'ctx>> {
        Ok(match (x, y) {
            (BasicValueEnum::VectorValue(a), BasicValueEnum::VectorValue(b)) => {
                self.b.build_right_shift(a, b, false, "shr")?.into()
            }
            _ => self.b.build_right_shift(x.into_int_value(), y.into_int_value(), false, "shr")?.into(),
        })
    }
}

/// A vector select's condition `c₁ && c₂ && …` (or `||`), split into the
/// parts the same in every lane of `var` and the others, where there are
/// both (for [`Gen::select_in_branch`]).
struct LaneSplit {
    op: BinOp,
    uniform: Vec<TExprId>,
    lanes: Vec<TExprId>,
}

/// See [`LaneSplit`]: the parts of `c`'s chain of one operator, `None`
/// where they are all lane-dependent (all uniform is a branch already).
fn split_by_lanes(f: &texc_schedules::ir::LoopFunc, c: TExprId, var: texc_compiler::tir::VarId) -> Option<LaneSplit> {
    let TExpr::Binary(op @ (BinOp::And | BinOp::Or), ..) = *f.p.expr(c) else { return None };
    let mut split = LaneSplit { op, uniform: Vec::new(), lanes: Vec::new() };
    let mut stack = vec![c];
    while let Some(e) = stack.pop() {
        match *f.p.expr(e) {
            TExpr::Binary(o, x, y) if o == op && !analysis::lane_uniform(f, e, var) => stack.extend([y, x]),
            _ if analysis::lane_uniform(f, e, var) => split.uniform.push(e),
            _ => split.lanes.push(e),
        }
    }
    (!split.uniform.is_empty() && !split.lanes.is_empty()).then_some(split)
}

/// The parts of `e` if it is an `i32` of bytes, `Σ_t i32(x_t) · 256^t`
/// (sums of the terms in any order, `x_t` of type `u8`, each `t < 4` at
/// most once, at least two of them): `(t, x_t)`.
fn byte_parts(p: &texc_compiler::tir::Program, e: TExprId) -> Option<Vec<(usize, TExprId)>> {
    let i32t = Ty::Elem(ElemType::I32);
    let byte = |x: TExprId| match *p.expr(x) {
        TExpr::Cast(b) if p.ty(x) == i32t && unsigned_ty(p.ty(b)) => Some(b),
        _ => None,
    };
    let mut parts = Vec::new();
    let mut stack = vec![e];
    while let Some(x) = stack.pop() {
        if p.ty(x) != i32t {
            return None;
        }
        let part = match *p.expr(x) {
            TExpr::Binary(BinOp::Add, a, b) => {
                stack.extend([a, b]);
                continue;
            }
            TExpr::Binary(BinOp::Mul, a, k) | TExpr::Binary(BinOp::Mul, k, a) if byte(a).is_some() => {
                match *p.expr(k) {
                    TExpr::Int(256) => (1, byte(a)?),
                    TExpr::Int(65536) => (2, byte(a)?),
                    TExpr::Int(16777216) => (3, byte(a)?),
                    _ => return None,
                }
            }
            _ => (0, byte(x)?),
        };
        if parts.iter().any(|&(t, _)| t == part.0) {
            return None;
        }
        parts.push(part);
    }
    (parts.len() >= 2).then_some(parts)
}

/// `e` without the casts to its own type around it: a float temporary
/// inlined keeps its store's rounding as one (`texc_schedules`'
/// `inline_stage`), which compiled code, computing in the element type,
/// does anyway — so the patterns below see through it.
fn unrounded(p: &texc_compiler::tir::Program, mut e: TExprId) -> TExprId {
    while let TExpr::Cast(a) = *p.expr(e) {
        if p.ty(a) != p.ty(e) {
            break;
        }
        e = a;
    }
    e
}

/// `(x, lo, hi)` if `e`, converted to byte type `to`, is `clamp(x, lo, hi)`
/// of an f32 or f64 `x` with constant bounds `lo ≤ hi` inside `to`'s range.
fn byte_clamp(p: &texc_compiler::tir::Program, e: TExprId, to: Ty) -> Option<(TExprId, f64, f64)> {
    let from = p.ty(e);
    if !byte_ty(to) || !matches!(from, Ty::Elem(ElemType::F32 | ElemType::F64)) {
        return None;
    }
    let TExpr::Math(texc_compiler::ops::MathFn::Clamp, args) = p.expr(unrounded(p, e)) else { return None };
    let [x, lo, hi] = args[..] else { return None };
    let constant = |c: TExprId| match *p.expr(c) {
        TExpr::Float(v) => Some(v),
        _ => None,
    };
    let (lo, hi) = (constant(lo)?, constant(hi)?);
    let (min, max) = if unsigned_ty(to) { (0.0, 255.0) } else { (-128.0, 127.0) };
    (min <= lo && lo <= hi && hi <= max).then_some((x, lo, hi))
}
