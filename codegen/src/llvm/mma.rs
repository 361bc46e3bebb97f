//! Tensor-core operations (`Stmt::Mma`): on the GPU, one `mma.sync` per
//! warp, each lane loading its fragment elements where PTX's ISA guide puts
//! them (`MmaOp::fragments`: lane `l` is in group `g = l / 4` at position
//! `t = l % 4`); in the CPU emulation, the tile product as three loops
//! (TF32 inputs rounded as `cvt.rna.tf32.f32` rounds them).

use super::gen::{Frame, Gen, Mode};
use super::gpu::GpuKernel;
use super::R;
use crate::CodegenError;
use inkwell::types::VectorType;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue};
use texc_schedules::ir::{Coord, ForKind, MmaOp, Stmt, Tile};

/// Most tensor-core operations whose accumulators a loop keeps in
/// registers (four f32 registers per lane each).
const MAX_RESIDENT: usize = 32;

/// The tensor-core operations of `body`, once per value of the loops around
/// them (serial or unrolled, of known extent): whether `body` is only such
/// loops and operations.
fn mma_instances<'s>(
    body: &'s [Stmt],
    binds: &mut Vec<(texc_compiler::tir::VarId, i64)>,
    out: &mut Vec<(Vec<(texc_compiler::tir::VarId, i64)>, &'s Stmt)>,
) -> bool {
    for s in body {
        match s {
            Stmt::Mma { .. } => out.push((binds.clone(), s)),
            Stmt::For { var, lo, extent, kind: ForKind::Serial | ForKind::Unrolled, body } => {
                for k in *lo..*lo + *extent {
                    if out.len() > MAX_RESIDENT {
                        return false;
                    }
                    binds.push((*var, k));
                    let ok = mma_instances(body, binds, out);
                    binds.pop();
                    if !ok {
                        return false;
                    }
                }
            }
            _ => return false,
        }
    }
    true
}

/// A tile in memory: the tensor's base, the tile's origin, the tensor's strides.
#[derive(Clone)]
struct Placed<'ctx> {
    base: PointerValue<'ctx>,
    origin: Vec<IntValue<'ctx>>,
    strides: Vec<i64>,
    rows: usize,
    cols: usize,
    elem: texc_compiler::types::ElemType,
    /// Whether each origin index is provably even.
    even: Vec<bool>,
}

/// Whether `e` is even for every value of its variables.
fn even(p: &texc_compiler::tir::Program, e: texc_compiler::tir::TExprId) -> bool {
    use texc_compiler::ops::BinOp;
    use texc_compiler::tir::TExpr;
    match p.expr(e) {
        TExpr::Int(k) => k % 2 == 0,
        TExpr::Binary(BinOp::Mul, a, b) => even(p, *a) || even(p, *b),
        TExpr::Binary(BinOp::Add | BinOp::Sub, a, b) => even(p, *a) && even(p, *b),
        _ => false,
    }
}

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn mma(&mut self, fr: &mut Frame<'ctx>, op: MmaOp, c: &Tile, a: &Tile, b: &Tile) -> R<()> {
        let [c, a, b] = [c, a, b].map(|t| self.place(fr, t));
        let (c, a, b) = (c?, a?, b?);
        match self.gpu {
            Some(GpuKernel { thread_idx: Some(tid), .. }) => self.mma_warp(op, tid[0], &c, &a, &b),
            Some(_) => self.mma_loops(fr, op, &c, &a, &b),
            None => Err(CodegenError::Unsupported("a tensor-core operation outside a GPU kernel".into())),
        }
    }

    fn place(&mut self, fr: &mut Frame<'ctx>, t: &Tile) -> R<Placed<'ctx>> {
        let d = self.f.p.tensor(t.tensor);
        let mut strides = vec![1i64; d.shape.len()];
        for k in (0..d.shape.len().saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * d.shape[k + 1];
        }
        let (elem, rows, cols) = (d.elem, t.rows, t.cols);
        let mut origin = Vec::new();
        for &i in &t.origin {
            origin.push(self.expr(fr, i, Mode::Scalar)?.into_int_value());
        }
        let even = t.origin.iter().map(|&i| even(&self.f.p, i)).collect();
        Ok(Placed { base: fr.tensors[&t.tensor], origin, strides, rows, cols, elem, even })
    }

    /// The address of element (r, c) of tile `t`.
    fn element(&self, t: &Placed<'ctx>, r: IntValue<'ctx>, c: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let i64t = self.cx.i64_type();
        let mut off = i64t.const_zero();
        for (d, (&o, &s)) in t.origin.iter().zip(&t.strides).enumerate() {
            let mut i = o;
            if d == t.rows {
                i = self.b.build_int_add(i, r, "r")?;
            }
            if d == t.cols {
                i = self.b.build_int_add(i, c, "c")?;
            }
            let term = self.b.build_int_mul(i, i64t.const_int(s as u64, true), "term")?;
            off = self.b.build_int_add(off, term, "off")?;
        }
        self.gep(self.mem_ty(t.elem), t.base, off)
    }

    fn load_at(&self, t: &Placed<'ctx>, r: IntValue<'ctx>, c: IntValue<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let p = self.element(t, r, c)?;
        Ok(self.b.build_load(self.mem_ty(t.elem), p, "el")?)
    }

    /// One `mma.sync` by the warp whose lane is `lane`: each lane loads the
    /// fragment elements [`MmaOp::fragments`] assigns it, and stores its part of the result.
    fn mma_warp(
        &mut self,
        op: MmaOp,
        lane: IntValue<'ctx>,
        c: &Placed<'ctx>,
        a: &Placed<'ctx>,
        b: &Placed<'ctx>,
    ) -> R<()> {
        let places = self.c_places(op, lane)?;
        let mut acc = Vec::new();
        for &(r, col) in &places {
            acc.push(self.load_at(c, r, col)?);
        }
        let d = self.mma_call(op, lane, a, b, acc)?;
        for (v, &(r, col)) in d.into_iter().zip(&places) {
            let p = self.element(c, r, col)?;
            self.b.build_store(p, v)?;
        }
        Ok(())
    }

    /// Where lane `lane`'s accumulator elements lie in the tile (row, column).
    fn c_places(&self, op: MmaOp, lane: IntValue<'ctx>) -> R<Vec<(IntValue<'ctx>, IntValue<'ctx>)>> {
        op.fragments().c.iter().map(|&x| self.coord(lane, x)).collect()
    }

    /// Fragment coordinate `x` of lane `lane`: (row, column) in its tile.
    fn coord(&self, lane: IntValue<'ctx>, x: Coord) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let i64t = self.cx.i64_type();
        let k = |v: i64| i64t.const_int(v as u64, true);
        let g = self.b.build_right_shift(lane, k(2), false, "group")?;
        let t = self.b.build_and(lane, k(3), "pos")?;
        let lin = |c0: i64, cg: i64, ct: i64| -> R<IntValue<'ctx>> {
            let v = self.b.build_int_mul(g, k(cg), "g")?;
            let v = self.b.build_int_add(v, self.b.build_int_mul(t, k(ct), "t")?, "gt")?;
            Ok(self.b.build_int_add(v, k(c0), "at")?)
        };
        Ok((lin(x.r0, x.rg, x.rt)?, lin(x.c0, x.cg, x.ct)?))
    }

    /// The `mma.sync` of the warp on `a` and `b` (each lane loading its
    /// fragments) and the lane's accumulators `acc`: the lane's results.
    fn mma_call(
        &mut self,
        op: MmaOp,
        lane: IntValue<'ctx>,
        a: &Placed<'ctx>,
        b: &Placed<'ctx>,
        acc: Vec<BasicValueEnum<'ctx>>,
    ) -> R<Vec<BasicValueEnum<'ctx>>> {
        let frag = op.fragments();
        let mut args: Vec<BasicValueEnum<'ctx>> = Vec::new();
        for (tile, coords) in [(a, frag.a), (b, frag.b)] {
            if op.rounds_to_tf32() {
                // One TF32 value (`cvt.rna.tf32.f32`) per register.
                for &x in coords {
                    let (r, col) = self.coord(lane, x)?;
                    let e = self.load_at(tile, r, col)?;
                    args.push(self.call(self.intrinsic("llvm.nvvm.f2tf32.rna", &[])?, &[e])?);
                }
                continue;
            }
            // Halves go in pairs, in register order: one 32-bit load where
            // the pair is adjacent in memory and provably 4-byte aligned.
            for pair in coords.chunks(2) {
                if let Some(v) = self.pair_load(tile, lane, pair)? {
                    args.push(v);
                    continue;
                }
                let mut v = VectorType::const_vector(&[self.cx.f16_type().const_zero(); 2]);
                for (i, &x) in pair.iter().enumerate() {
                    let (r, col) = self.coord(lane, x)?;
                    let e = self.load_at(tile, r, col)?;
                    v = self.b.build_insert_element(v, e, self.cx.i32_type().const_int(i as u64, false), "h")?;
                }
                args.push(v.into());
            }
        }
        let n = acc.len();
        args.extend(acc);
        let name = match op {
            MmaOp::M16n8k16F16F32 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
            MmaOp::M16n8k8Tf32F32 => "llvm.nvvm.mma.m16n8k8.row.col.tf32",
        };
        let f = self.intrinsic(name, &[])?;
        let d = self.call(f, &args)?.into_struct_value();
        (0..n).map(|i| Ok(self.b.build_extract_value(d, i as u32, "d")?)).collect()
    }

    /// The two halves at `pair` as one aligned `<2 x half>` load, when they
    /// are neighbours along the tile's contiguous columns and every term of
    /// the first one's offset is even (device buffers and shared arrays are
    /// at least 16-byte aligned, so an even offset in halves is 4-byte aligned).
    fn pair_load(&self, t: &Placed<'ctx>, lane: IntValue<'ctx>, pair: &[Coord]) -> R<Option<BasicValueEnum<'ctx>>> {
        let [x, y] = pair else { return Ok(None) };
        let next = Coord { c0: x.c0 + 1, ..*x };
        let contiguous = *y == next && t.strides[t.cols] == 1;
        let aligned = (0..t.strides.len()).all(|d| {
            let stride_even = t.strides[d] % 2 == 0;
            if d == t.rows {
                stride_even
            } else if d == t.cols {
                t.even[d] && [x.c0, x.cg, x.ct].iter().all(|k| k % 2 == 0)
            } else {
                stride_even || t.even[d]
            }
        });
        if !contiguous || !aligned || t.elem != texc_compiler::types::ElemType::F16 {
            return Ok(None);
        }
        let (r, c) = self.coord(lane, *x)?;
        let p = self.element(t, r, c)?;
        let ty = self.cx.f16_type().vec_type(2);
        let v = self.b.build_load(ty, p, "pair")?;
        v.as_instruction_value().expect("a load").set_alignment(4).map_err(super::llvm_err)?;
        Ok(Some(v))
    }

    /// A serial loop on the GPU whose body is only tensor-core operations
    /// (in loops of known, small extents) accumulating into tiles that do
    /// not move with it — the reduction loop of a warp's tiles: each
    /// accumulator tile is loaded into registers before the loop, stays
    /// there through it, and is stored after it, instead of a round trip
    /// to memory per operation (which LLVM does not remove on its own).
    /// Whether the loop was of that form (and so emitted).
    pub(super) fn resident_accumulators(
        &mut self,
        fr: &mut Frame<'ctx>,
        var: texc_compiler::tir::VarId,
        lo: i64,
        extent: i64,
        body: &[Stmt],
    ) -> R<bool> {
        let Some(GpuKernel { thread_idx: Some(tid), .. }) = self.gpu else { return Ok(false) };
        let lane = tid[0];
        let mut found = Vec::new();
        if extent < 2 || !mma_instances(body, &mut Vec::new(), &mut found) || found.is_empty() {
            return Ok(false);
        }
        let p = &self.f.p;
        let involves = |e, v| texc_schedules::analysis::involves(p, e, v);
        // Accumulators that do not move with the loop, in tensors the operands do not read.
        let fixed = found.iter().all(|(_, m)| {
            let Stmt::Mma { c, a, b, .. } = m else { return false };
            !c.origin.iter().any(|&e| involves(e, var)) && c.tensor != a.tensor && c.tensor != b.tensor
        });
        if !fixed || found.len() > MAX_RESIDENT {
            return Ok(false);
        }
        // Instances whose tile origin is the same expression of the same values share a slot.
        let key = |binds: &[(texc_compiler::tir::VarId, i64)], m: &Stmt| -> Vec<(texc_compiler::tir::VarId, i64)> {
            let Stmt::Mma { c, .. } = m else { unreachable!("mma instances") };
            binds.iter().copied().filter(|&(v, _)| c.origin.iter().any(|&e| involves(e, v))).collect()
        };
        let keys: Vec<_> = found.iter().map(|(binds, m)| (key(binds, m), std::ptr::from_ref(*m))).collect();
        let mut slots: Vec<(Vec<(texc_compiler::tir::VarId, i64)>, usize)> = Vec::new();
        let mut slot_of = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let j = match slots.iter().position(|(sk, first)| keys[*first].1 == k.1 && *sk == k.0) {
                Some(j) => j,
                None => {
                    slots.push((k.0.clone(), i));
                    slots.len() - 1
                }
            };
            slot_of.push(j);
        }
        let f32t = self.cx.f32_type();
        let i64t = self.cx.i64_type();
        let int = move |v: i64| i64t.const_int(v as u64, true);
        let bind = move |fr: &mut Frame<'ctx>, binds: &[(texc_compiler::tir::VarId, i64)]| {
            for &(v, x) in binds {
                fr.vars.insert(v, int(x));
            }
        };
        let unbind = |fr: &mut Frame<'ctx>, binds: &[(texc_compiler::tir::VarId, i64)]| {
            for &(v, _) in binds {
                fr.vars.remove(&v);
            }
        };
        // Before the loop: every accumulator tile into registers.
        let mut regs = Vec::new();
        for &(_, first) in &slots {
            let (binds, m) = &found[first];
            let Stmt::Mma { op, c, .. } = m else { unreachable!("mma instances") };
            bind(fr, binds);
            let c = self.place(fr, c)?;
            let places = self.c_places(*op, lane)?;
            let mut r = Vec::new();
            for &(row, col) in &places {
                let slot = self.entry_alloca(fr.func, f32t.into())?;
                let v = self.load_at(&c, row, col)?;
                self.b.build_store(slot, v)?;
                r.push(slot);
            }
            unbind(fr, binds);
            regs.push(r);
        }
        let name = self.f.vars[var as usize].name.clone();
        self.count(fr.func, &name, int(lo), int(lo + extent), &mut |g, i| {
            fr.vars.insert(var, i);
            for ((binds, m), &slot) in found.iter().zip(&slot_of) {
                let Stmt::Mma { op, a, b, .. } = m else { unreachable!("mma instances") };
                bind(fr, binds);
                let (a, b) = (g.place(fr, a)?, g.place(fr, b)?);
                let mut acc = Vec::new();
                for &r in &regs[slot] {
                    acc.push(g.b.build_load(f32t, r, "acc")?);
                }
                let d = g.mma_call(*op, lane, &a, &b, acc)?;
                for (v, &r) in d.into_iter().zip(&regs[slot]) {
                    g.b.build_store(r, v)?;
                }
                unbind(fr, binds);
            }
            Ok(())
        })?;
        fr.vars.remove(&var);
        // After it: the tiles back to memory.
        for (&(_, first), r) in slots.iter().zip(&regs) {
            let (binds, m) = &found[first];
            let Stmt::Mma { op, c, .. } = m else { unreachable!("mma instances") };
            bind(fr, binds);
            let c = self.place(fr, c)?;
            let places = self.c_places(*op, lane)?;
            for (&slot, &(row, col)) in r.iter().zip(&places) {
                let v = self.b.build_load(f32t, slot, "acc")?;
                let ptr = self.element(&c, row, col)?;
                self.b.build_store(ptr, v)?;
            }
            unbind(fr, binds);
        }
        Ok(true)
    }

    /// `x` rounded to TF32 as `cvt.rna.tf32.f32` does: add half of the last
    /// kept bit, clear the 13 bits TF32 drops (NaN stays NaN).
    fn tf32(&self, x: inkwell::values::FloatValue<'ctx>) -> R<inkwell::values::FloatValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let bits = self.b.build_bit_cast(x, i32t, "bits")?.into_int_value();
        let up = self.b.build_int_add(bits, i32t.const_int(0x1000, false), "up")?;
        let cut = self.b.build_and(up, i32t.const_int(!0x1fffu32 as u64, false), "cut")?;
        let r = self.b.build_bit_cast(cut, self.cx.f32_type(), "tf32")?.into_float_value();
        let nan = self.b.build_float_compare(inkwell::FloatPredicate::UNO, x, x, "nan")?;
        Ok(self.b.build_select(nan, x, r, "r")?.into_float_value())
    }

    /// The tile product `c += a × b` as loops (the emulation runs a whole
    /// warp's operation at once), accumulating in f32.
    fn mma_loops(
        &mut self,
        fr: &mut Frame<'ctx>,
        op: MmaOp,
        c: &Placed<'ctx>,
        a: &Placed<'ctx>,
        b: &Placed<'ctx>,
    ) -> R<()> {
        let (m, n, kk) = op.shape();
        let i64t = self.cx.i64_type();
        let f32t = self.cx.f32_type();
        let zero = i64t.const_zero();
        let func = fr.func;
        self.count(func, "r", zero, i64t.const_int(m as u64, false), &mut |g, r| {
            g.count(func, "c", zero, i64t.const_int(n as u64, false), &mut |g, col| {
                let p = g.element(c, r, col)?;
                let acc0 = g.b.build_load(f32t, p, "acc")?.into_float_value();
                let slot = g.entry_alloca(func, f32t.into())?;
                g.b.build_store(slot, acc0)?;
                g.count(func, "k", zero, i64t.const_int(kk as u64, false), &mut |g, k| {
                    let x = g.load_at(a, r, k)?.into_float_value();
                    let y = g.load_at(b, k, col)?.into_float_value();
                    let (x, y) = if op.rounds_to_tf32() {
                        (g.tf32(x)?, g.tf32(y)?)
                    } else {
                        (g.b.build_float_ext(x, f32t, "a")?, g.b.build_float_ext(y, f32t, "b")?)
                    };
                    let prod = g.b.build_float_mul(x, y, "ab")?;
                    let acc = g.b.build_load(f32t, slot, "acc")?.into_float_value();
                    let sum = g.b.build_float_add(acc, prod, "sum")?;
                    g.b.build_store(slot, sum)?;
                    Ok(())
                })?;
                let acc = g.b.build_load(f32t, slot, "acc")?;
                g.b.build_store(p, acc)?;
                Ok(())
            })
        })
    }
}
