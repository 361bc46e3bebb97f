//! Tensor-core operations (`Stmt::Mma`): on the GPU, one `mma.sync` per
//! warp, each lane loading its fragment elements where PTX's ISA guide puts
//! them (`MmaOp::fragments`: lane `l` is in group `g = l / 4` at position
//! `t = l % 4`); in the CPU emulation, the tile product as three loops
//! (TF32 inputs rounded as `cvt.rna.tf32.f32` rounds them; 8-bit inputs
//! widened to `i32`, sums wrapping as the hardware's do).

use super::gen::{Frame, Gen, Mode};
use super::gpu::GpuKernel;
use super::R;
use crate::CodegenError;
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue};
use inkwell::AddressSpace;
use std::collections::{HashMap, HashSet};
use texc_compiler::tir::{TensorId, VarId};
use texc_compiler::types::ElemType;
use texc_schedules::ir::{Coord, ForKind, MmaOp, Stmt, Tile};

/// Most tensor-core tiles whose accumulators a loop keeps in registers
/// (four f32 registers per lane each).
const MAX_RESIDENT: usize = 32;

/// Most copies of an operation that unrolling the loops around it makes.
const MAX_UNROLLED: i64 = 128;

/// A loop around a tensor-core operation, inside the loop being emitted.
#[derive(Clone, Copy)]
struct Around {
    var: VarId,
    lo: i64,
    extent: i64,
    kind: ForKind,
}

/// The tensor-core operations of `body` with the loops around each:
/// whether none is under an `if` (their warps would diverge).
fn mma_sites<'s>(body: &'s [Stmt], around: &mut Vec<Around>, out: &mut Vec<(Vec<Around>, &'s Stmt)>) -> bool {
    for s in body {
        let ok = match s {
            Stmt::Mma { .. } | Stmt::Wgmma(_) => {
                out.push((around.clone(), s));
                true
            }
            Stmt::For { var, lo, extent, kind, body } => {
                around.push(Around { var: *var, lo: *lo, extent: *extent, kind: *kind });
                let ok = mma_sites(body, around, out);
                around.pop();
                ok
            }
            Stmt::Alloc { body, .. } => mma_sites(body, around, out),
            Stmt::If { then, .. } => {
                let mut inner = Vec::new();
                mma_sites(then, &mut Vec::new(), &mut inner) && inner.is_empty()
            }
            Stmt::Store { .. }
            | Stmt::TileDot(_)
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => true,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// The accumulator tile of a tensor-core statement.
fn accumulators(s: &Stmt) -> &Tile {
    match s {
        Stmt::Mma { c, .. } => c,
        Stmt::Wgmma(w) => &w.c,
        _ => unreachable!("tensor-core sites"),
    }
}

/// Where a lane holds the accumulators of a tensor-core statement.
fn coords(s: &Stmt) -> Vec<Coord> {
    match s {
        Stmt::Mma { op, .. } => op.fragments().c.to_vec(),
        Stmt::Wgmma(w) => w.op.d_fragment(),
        _ => unreachable!("tensor-core sites"),
    }
}

/// The tensors a tensor-core statement multiplies.
fn operands(s: &Stmt) -> [TensorId; 2] {
    match s {
        Stmt::Mma { a, b, .. } => [a.tensor, b.tensor],
        Stmt::Wgmma(w) => [w.a.tensor, w.b.tensor],
        _ => unreachable!("tensor-core sites"),
    }
}

/// The variables of `e`.
fn vars_of(p: &texc_compiler::tir::Program, e: texc_compiler::tir::TExprId) -> Vec<VarId> {
    let mut out = Vec::new();
    if let texc_compiler::tir::TExpr::Var(v) = p.expr(e) {
        out.push(*v);
    }
    for c in p.children(e) {
        out.extend(vars_of(p, c));
    }
    out
}

/// Whether a statement of `body` other than a tensor-core operation stores
/// to or loads `t`.
fn touches(p: &texc_compiler::tir::Program, body: &[Stmt], t: TensorId) -> bool {
    let loads = |e| loads_tensor(p, e, t);
    body.iter().any(|s| match s {
        Stmt::For { body, .. } | Stmt::Alloc { body, .. } => touches(p, body, t),
        Stmt::If { cond, then } => loads(*cond) || touches(p, then, t),
        Stmt::Store { tensor, indices, value } => *tensor == t || loads(*value) || indices.iter().any(|&i| loads(i)),
        Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::Prefetch { .. } => false,
        Stmt::TileDot(d) => [&d.c, &d.a, &d.b].iter().any(|x| x.tensor == t),
        Stmt::WarpReduce(w) => w.tensor == t,
    })
}

fn loads_tensor(p: &texc_compiler::tir::Program, e: texc_compiler::tir::TExprId, t: TensorId) -> bool {
    matches!(p.expr(e), texc_compiler::tir::TExpr::Load(x, _) if *x == t)
        || p.children(e).into_iter().any(|c| loads_tensor(p, c, t))
}

/// A tile in memory: the tensor's base, the tile's origin, the tensor's strides.
impl Placed<'_> {
    /// Elements from one row of the tile to the next.
    pub(super) fn row_stride(&self) -> i64 {
        self.strides[self.rows]
    }
}

#[derive(Clone)]
pub(super) struct Placed<'ctx> {
    base: PointerValue<'ctx>,
    origin: Vec<IntValue<'ctx>>,
    strides: Vec<i64>,
    rows: usize,
    cols: usize,
    elem: texc_compiler::types::ElemType,
    /// Whether each origin index is provably even, a multiple of 4, of 8, of 16.
    even: Vec<bool>,
    four: Vec<bool>,
    eight: Vec<bool>,
    sixteen: Vec<bool>,
    tensor: TensorId,
    /// A shared-memory array of the block (the GPU, not the emulation).
    shared: bool,
}

/// A reduction loop's tensor-core accumulators in registers: the tile of
/// tensor `tensor` that each value of the unrolled `loops` involved in its
/// origin names, as the lane's four registers (stack slots that SROA
/// promotes).
#[derive(Clone)]
pub(super) struct Resident<'ctx> {
    pub tensor: TensorId,
    pub loops: HashSet<VarId>,
    slots: HashMap<Vec<(VarId, u64)>, Vec<PointerValue<'ctx>>>,
}

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn mma(&mut self, fr: &mut Frame<'ctx>, op: MmaOp, c: &Tile, a: &Tile, b: &Tile) -> R<()> {
        let c_tile = c;
        let [c, a, b] = [c, a, b].map(|t| self.place(fr, t));
        let (c, a, b) = (c?, a?, b?);
        match self.gpu {
            Some(GpuKernel { thread_idx: Some(tid), .. })
                if fr.resident.as_ref().is_some_and(|r| r.tensor == c.tensor) =>
            {
                self.mma_resident(fr, op, tid[0], c_tile, &a, &b)
            }
            Some(GpuKernel { thread_idx: Some(tid), .. }) => self.mma_warp(op, tid[0], &c, &a, &b),
            Some(_) => self.mma_loops(fr, op, &c, &a, &b),
            None => Err(CodegenError::Unsupported("a tensor-core operation outside a GPU kernel".into())),
        }
    }

    pub(super) fn place(&mut self, fr: &mut Frame<'ctx>, t: &Tile) -> R<Placed<'ctx>> {
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
        let multiple = |n: i64| -> Vec<bool> {
            t.origin.iter().map(|&i| texc_schedules::analysis::multiple_of(&self.f.p, i, n, None)).collect()
        };
        let (even, four, eight, sixteen) = (multiple(2), multiple(4), multiple(8), multiple(16));
        let shared = self.on_device() && self.f.shared.contains(&t.tensor);
        Ok(Placed {
            base: fr.tensors[&t.tensor],
            origin,
            strides,
            rows,
            cols,
            elem,
            even,
            four,
            eight,
            sixteen,
            tensor: t.tensor,
            shared,
        })
    }

    /// The address of element (r, c) of tile `t`.
    pub(super) fn element(&self, t: &Placed<'ctx>, r: IntValue<'ctx>, c: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
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

    pub(super) fn load_at(&self, t: &Placed<'ctx>, r: IntValue<'ctx>, c: IntValue<'ctx>) -> R<BasicValueEnum<'ctx>> {
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
        self.places(op.fragments().c, lane)
    }

    /// Where lane `lane`'s elements of fragment `coords` lie in their tile.
    pub(super) fn places(&self, coords: &[Coord], lane: IntValue<'ctx>) -> R<Vec<(IntValue<'ctx>, IntValue<'ctx>)>> {
        coords.iter().map(|&x| self.coord(lane, x)).collect()
    }

    /// Fragment coordinate `x` of lane `lane`: (row, column) in its tile.
    pub(super) fn coord(&self, lane: IntValue<'ctx>, x: Coord) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let i64t = self.cx.i64_type();
        let k = |v: i64| i64t.const_int(v as u64, true);
        // Group and position within the warp; the warp within a warpgroup.
        let g = self.b.build_and(self.b.build_right_shift(lane, k(2), false, "group")?, k(7), "group")?;
        let t = self.b.build_and(lane, k(3), "pos")?;
        let w = self.b.build_right_shift(lane, k(5), false, "warp")?;
        let lin = |c0: i64, cg: i64, ct: i64, cw: i64| -> R<IntValue<'ctx>> {
            let v = self.b.build_int_mul(g, k(cg), "g")?;
            let v = self.b.build_int_add(v, self.b.build_int_mul(t, k(ct), "t")?, "gt")?;
            let v = if cw == 0 { v } else { self.b.build_int_add(v, self.b.build_int_mul(w, k(cw), "w")?, "gtw")? };
            Ok(self.b.build_int_add(v, k(c0), "at")?)
        };
        Ok((lin(x.r0, x.rg, x.rt, x.rw)?, lin(x.c0, x.cg, x.ct, 0)?))
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
        for (tile, coords, is_a) in [(a, frag.a, true), (b, frag.b, false)] {
            if op.is_integer() {
                // 8-bit operands: registers of 4 consecutive `k`.
                match self.ldmatrix_bytes(tile, lane, is_a)? {
                    Some(regs) => args.extend(regs),
                    None => {
                        for quad in coords.chunks(4) {
                            args.push(self.byte_quad(tile, lane, quad)?.into());
                        }
                    }
                }
                continue;
            }
            if matches!(op, MmaOp::M16n8k16F16F32 | MmaOp::M16n8k16Bf16F32) {
                if let Some(regs) = self.ldmatrix(tile, lane, is_a)? {
                    args.extend(regs);
                    continue;
                }
            }
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
                if tile.elem == ElemType::BF16 {
                    // Two bf16 in one 32-bit register, the first in the low half.
                    let i32t = self.cx.i32_type();
                    let mut v = i32t.const_zero();
                    for (i, &x) in pair.iter().enumerate() {
                        let (r, col) = self.coord(lane, x)?;
                        let e = self.load_at(tile, r, col)?.into_int_value();
                        let w = self.b.build_int_z_extend(e, i32t, "bf")?;
                        let w = self.b.build_left_shift(w, i32t.const_int(16 * i as u64, false), "bf")?;
                        v = self.b.build_or(v, w, "bfs")?;
                    }
                    args.push(v.into());
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
            MmaOp::M16n8k16Bf16F32 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            MmaOp::M16n8k8Tf32F32 => "llvm.nvvm.mma.m16n8k8.row.col.tf32",
            MmaOp::M16n8k32S8S32 => "llvm.nvvm.mma.m16n8k32.row.col.s8",
            MmaOp::M16n8k32U8S8S32 => "llvm.nvvm.mma.m16n8k32.row.col.u8.s8",
            MmaOp::M16n8k32S8U8S32 => "llvm.nvvm.mma.m16n8k32.row.col.s8.u8",
        };
        let f = self.intrinsic(name, &[])?;
        let d = self.call(f, &args)?.into_struct_value();
        (0..n).map(|i| Ok(self.b.build_extract_value(d, i as u32, "d")?)).collect()
    }

    /// The fragment of an m16n8k16 operand in shared memory by `ldmatrix`:
    /// `A` (16×16, rows along `m`) as four 8×8 matrices, each lane giving
    /// the address of one of their rows (lanes 8q..8q+7 the rows of matrix
    /// q: rows 0–7 and 8–15 of columns 0–7, then of columns 8–15); `B`
    /// (16×8, rows along `k`) as two, transposed on the way (`.trans`), so
    /// that each lane receives the column pairs the operation takes. The
    /// rows must be 16-byte aligned and contiguous: the tile's columns are
    /// its tensor's last axis, its row stride a multiple of 8 halves, and
    /// every other term of its origin a multiple of 8.
    fn ldmatrix(&self, t: &Placed<'ctx>, lane: IntValue<'ctx>, is_a: bool) -> R<Option<Vec<BasicValueEnum<'ctx>>>> {
        let aligned = (0..t.strides.len()).all(|d| {
            if d == t.rows {
                t.strides[d] % 8 == 0
            } else if d == t.cols {
                t.strides[d] == 1 && t.eight[d]
            } else {
                t.strides[d] % 8 == 0 || t.eight[d]
            }
        });
        if !t.shared || !aligned || !matches!(t.elem, ElemType::F16 | ElemType::BF16) {
            return Ok(None);
        }
        let i64t = self.cx.i64_type();
        let k = |v: u64| i64t.const_int(v, false);
        let (row, col, name, n) = if is_a {
            let low = self.b.build_and(lane, k(7), "r")?;
            let half = self.b.build_and(self.b.build_right_shift(lane, k(3), false, "q")?, k(1), "h")?;
            let row = self.b.build_int_add(low, self.b.build_int_mul(half, k(8), "h8")?, "row")?;
            let col = self.b.build_int_mul(self.b.build_right_shift(lane, k(4), false, "q2")?, k(8), "col")?;
            (row, col, "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16", 4)
        } else {
            (self.b.build_and(lane, k(15), "row")?, k(0), "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x2.trans.b16", 2)
        };
        let p = self.element(t, row, col)?;
        let shared = self.b.build_address_space_cast(p, self.cx.ptr_type(AddressSpace::from(3u16)), "smem")?;
        // Overloaded on the pointer's address space (`.p3`).
        let f = self.intrinsic(name, &[self.cx.ptr_type(AddressSpace::from(3u16)).into()])?;
        let d = self.call(f, &[shared.into()])?.into_struct_value();
        // f16 pairs as `<2 x half>`; bf16 pairs stay 32-bit registers.
        let ty = self.cx.f16_type().vec_type(2);
        let bf16 = t.elem == ElemType::BF16;
        (0..n)
            .map(|i| {
                let r = self.b.build_extract_value(d, i, "m")?;
                Ok(if bf16 { r } else { self.b.build_bit_cast(r, ty, "halves")? })
            })
            .collect::<R<Vec<_>>>()
            .map(Some)
    }

    /// The fragment of an 8-bit `m16n8k32` operand in shared memory by
    /// `ldmatrix` (its rows of 16 bytes are those of f16's 8 × 8 matrices,
    /// and each 32-bit register the lane receives holds the 4 consecutive
    /// `k` the operation takes): `A` (16 × 32, its columns `k` contiguous)
    /// as four 8 × 16-byte matrices — rows 0–7 and 8–15 of `k` 0–15, then
    /// of `k` 16–31; `B` (32 × 8) as two, where its rows `k` are the
    /// contiguous ones (a weight `W[n, k]`): `n` 0–7 of `k` 0–15, then of
    /// 16–31, untransposed. Each row 16-byte aligned, as for f16.
    fn ldmatrix_bytes(
        &self,
        t: &Placed<'ctx>,
        lane: IntValue<'ctx>,
        is_a: bool,
    ) -> R<Option<Vec<BasicValueEnum<'ctx>>>> {
        // The tile's dimension along `k`, which must be the contiguous one.
        let (k_dim, other) = if is_a { (t.cols, t.rows) } else { (t.rows, t.cols) };
        let aligned = (0..t.strides.len()).all(|d| {
            if d == k_dim {
                t.strides[d] == 1 && t.sixteen[d]
            } else if d == other {
                t.strides[d] % 16 == 0
            } else {
                t.strides[d] % 16 == 0 || t.sixteen[d]
            }
        });
        if !t.shared || !aligned || t.elem.size() != 1 {
            return Ok(None);
        }
        let i64t = self.cx.i64_type();
        let k = |v: u64| i64t.const_int(v, false);
        let low = self.b.build_and(lane, k(7), "r")?;
        let (row, col, name, n) = if is_a {
            let half = self.b.build_and(self.b.build_right_shift(lane, k(3), false, "q")?, k(1), "h")?;
            let m = self.b.build_int_add(low, self.b.build_int_mul(half, k(8), "h8")?, "m")?;
            let kk = self.b.build_int_mul(self.b.build_right_shift(lane, k(4), false, "q2")?, k(16), "k")?;
            (m, kk, "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16", 4)
        } else {
            let half = self.b.build_and(self.b.build_right_shift(lane, k(3), false, "q")?, k(1), "h")?;
            let kk = self.b.build_int_mul(half, k(16), "k")?;
            // The element at (row k, column n) of the tile.
            (kk, low, "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x2.b16", 2)
        };
        let p = self.element(t, row, col)?;
        let shared = self.b.build_address_space_cast(p, self.cx.ptr_type(AddressSpace::from(3u16)), "smem")?;
        let f = self.intrinsic(name, &[self.cx.ptr_type(AddressSpace::from(3u16)).into()])?;
        let d = self.call(f, &[shared.into()])?.into_struct_value();
        (0..n).map(|i| Ok(self.b.build_extract_value(d, i, "m")?)).collect::<R<Vec<_>>>().map(Some)
    }

    /// Four bytes of an 8-bit operand's fragment (`quad`, in register order:
    /// consecutive `k`) as one 32-bit register, the first in the low byte:
    /// one aligned load where they are adjacent in memory and every term of
    /// the first one's offset a multiple of 4, else four loads.
    fn byte_quad(&self, t: &Placed<'ctx>, lane: IntValue<'ctx>, quad: &[Coord]) -> R<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let x = quad[0];
        // Consecutive along the tile's columns (`a`) or rows (`b`).
        let along_cols = quad.iter().enumerate().all(|(i, y)| *y == Coord { c0: x.c0 + i as i64, ..x });
        let along_rows = quad.iter().enumerate().all(|(i, y)| *y == Coord { r0: x.r0 + i as i64, ..x });
        let dim = if along_cols { Some(t.cols) } else { along_rows.then_some(t.rows) };
        // The tile's other dimension moves by lanes (`g`, `g + 8`): its
        // stride, not only its origin, must keep 4-byte alignment.
        let across = if along_cols { t.rows } else { t.cols };
        let aligned = dim.is_some_and(|dim| {
            let steps = if along_cols { [x.c0, x.cg, x.ct] } else { [x.r0, x.rg, x.rt] };
            quad.len() == 4
                && t.strides[dim] == 1
                && (0..t.strides.len()).all(|d| {
                    if d == dim {
                        t.four[d] && steps.iter().all(|s| s % 4 == 0)
                    } else if d == across {
                        t.strides[d] % 4 == 0
                    } else {
                        t.strides[d] % 4 == 0 || t.four[d]
                    }
                })
        });
        if aligned {
            let (r, c) = self.coord(lane, x)?;
            let p = self.element(t, r, c)?;
            let v = self.b.build_load(i32t, p, "quad")?;
            v.as_instruction_value().expect("a load").set_alignment(4).map_err(super::llvm_err)?;
            return Ok(v.into_int_value());
        }
        let mut v = i32t.const_zero();
        for (i, &y) in quad.iter().enumerate() {
            let (r, c) = self.coord(lane, y)?;
            let e = self.load_at(t, r, c)?.into_int_value();
            let w = self.b.build_int_z_extend(e, i32t, "byte")?;
            let w = self.b.build_left_shift(w, i32t.const_int(8 * i as u64, false), "byte")?;
            v = self.b.build_or(v, w, "bytes")?;
        }
        Ok(v)
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
        if !contiguous || !aligned || !matches!(t.elem, ElemType::F16 | ElemType::BF16) {
            return Ok(None);
        }
        let (r, c) = self.coord(lane, *x)?;
        let p = self.element(t, r, c)?;
        let ty: BasicTypeEnum =
            if t.elem == ElemType::BF16 { self.cx.i32_type().into() } else { self.cx.f16_type().vec_type(2).into() };
        let v = self.b.build_load(ty, p, "pair")?;
        v.as_instruction_value().expect("a load").set_alignment(4).map_err(super::llvm_err)?;
        Ok(Some(v))
    }

    /// A serial loop on the GPU around tensor-core operations that
    /// accumulate into tiles that do not move with it — the reduction loop
    /// of a warp's tiles, with or without the block's loads of the operands
    /// into shared memory and its barriers: each accumulator tile is loaded
    /// into registers before the loop, stays there through it, and is
    /// stored after it, instead of a round trip to memory per operation
    /// (which LLVM does not remove on its own). The loops between it and the
    /// operations are unrolled (of known extent: at most [`MAX_RESIDENT`]
    /// tiles); the thread loops among them must span their block dimension.
    /// Whether the loop was of that form (and so emitted).
    pub(super) fn resident_accumulators(
        &mut self,
        fr: &mut Frame<'ctx>,
        var: VarId,
        lo: i64,
        extent: i64,
        body: &[Stmt],
    ) -> R<bool> {
        let Some(GpuKernel { thread_idx: Some(tid), block, .. }) = self.gpu else { return Ok(false) };
        if extent < 2 || fr.resident.is_some() {
            return Ok(false);
        }
        let mut sites = Vec::new();
        if !mma_sites(body, &mut Vec::new(), &mut sites) || sites.is_empty() {
            return Ok(false);
        }
        let p = &self.f.p;
        let tensor = accumulators(sites[0].1).tensor;
        let loops: HashSet<VarId> = sites
            .iter()
            .flat_map(|(around, _)| around.iter().filter(|l| !matches!(l.kind, ForKind::Thread(_))).map(|l| l.var))
            .collect();
        let fits = sites.iter().all(|(around, m)| {
            let c = accumulators(m);
            let known = |v: VarId| v != var && (fr.vars.contains_key(&v) || around.iter().any(|l| l.var == v));
            c.tensor == tensor
                && operands(m).iter().all(|&t| t != tensor)
                && c.origin.iter().all(|&e| vars_of(p, e).into_iter().all(known))
                && around.iter().all(|l| match l.kind {
                    ForKind::Thread(d) => l.lo == 0 && l.extent == block[d.index()],
                    ForKind::Serial | ForKind::Unrolled => true,
                    _ => false,
                })
        });
        // The loops around each operation are unrolled: a bounded number of copies.
        let copies = |around: &[Around]| -> i64 {
            around.iter().filter(|l| !matches!(l.kind, ForKind::Thread(_))).map(|l| l.extent.max(1)).product()
        };
        if !fits || touches(p, body, tensor) || sites.iter().any(|(around, _)| copies(around) > MAX_UNROLLED) {
            return Ok(false);
        }
        // One slot per tile: the values of the unrolled loops its origin involves.
        let mut keys: Vec<(usize, Vec<(VarId, u64)>)> = Vec::new();
        for (si, (around, m)) in sites.iter().enumerate() {
            let c = accumulators(m);
            let named: Vec<&Around> = around
                .iter()
                .filter(|l| !matches!(l.kind, ForKind::Thread(_)))
                .filter(|l| c.origin.iter().any(|&e| texc_schedules::analysis::involves(p, e, l.var)))
                .collect();
            let mut combos: Vec<Vec<(VarId, u64)>> = vec![Vec::new()];
            for l in named {
                combos = combos
                    .into_iter()
                    .flat_map(|k| (l.lo..l.lo + l.extent).map(move |x| [k.clone(), vec![(l.var, x as u64)]].concat()))
                    .collect();
                if combos.len() > MAX_RESIDENT {
                    return Ok(false);
                }
            }
            for k in combos {
                if !keys.iter().any(|(_, have)| *have == k) {
                    keys.push((si, k));
                }
            }
        }
        let registers: usize = keys.iter().map(|(si, _)| coords(sites[*si].1).len()).sum();
        if keys.len() > MAX_RESIDENT || registers > 4 * MAX_RESIDENT {
            return Ok(false);
        }
        let lane = tid[0];
        let i64t = self.cx.i64_type();
        // Bind a site's thread loops to the thread and its unrolled loops to `key`.
        let bind = |fr: &mut Frame<'ctx>, around: &[Around], key: &[(VarId, u64)]| {
            for l in around {
                if let ForKind::Thread(d) = l.kind {
                    fr.vars.insert(l.var, tid[d.index()]);
                }
            }
            for &(v, x) in key {
                fr.vars.insert(v, i64t.const_int(x, false));
            }
        };
        let unbind = |fr: &mut Frame<'ctx>, around: &[Around], key: &[(VarId, u64)]| {
            around.iter().for_each(|l| {
                fr.vars.remove(&l.var);
            });
            key.iter().for_each(|(v, _)| {
                fr.vars.remove(v);
            });
        };
        let mut slots = HashMap::new();
        for (si, key) in &keys {
            let (around, m) = &sites[*si];
            bind(fr, around, key);
            let c = self.place(fr, accumulators(m))?;
            let acc_ty = self.mem_ty(c.elem);
            let mut regs = Vec::new();
            for (row, col) in self.places(&coords(m), lane)? {
                let slot = self.entry_alloca(fr.func, acc_ty)?;
                self.b.build_store(slot, self.load_at(&c, row, col)?)?;
                regs.push(slot);
            }
            unbind(fr, around, key);
            // Keyed by the sorted values, as `mma_resident` looks them up.
            let mut sorted = key.clone();
            sorted.sort_unstable();
            slots.insert(sorted, regs);
        }
        fr.resident = Some(Resident { tensor, loops, slots });
        let r = self.serial_loop(
            fr,
            var,
            i64t.const_int(lo as u64, true),
            i64t.const_int((lo + extent) as u64, true),
            body,
        );
        let resident = fr.resident.take().expect("set above");
        r?;
        for (si, key) in &keys {
            let (around, m) = &sites[*si];
            bind(fr, around, key);
            let c = self.place(fr, accumulators(m))?;
            let mut sorted = key.clone();
            sorted.sort_unstable();
            let acc_ty = self.mem_ty(c.elem);
            for (&slot, (row, col)) in resident.slots[&sorted].iter().zip(self.places(&coords(m), lane)?) {
                let v = self.b.build_load(acc_ty, slot, "acc")?;
                let ptr = self.element(&c, row, col)?;
                self.b.build_store(ptr, v)?;
            }
            unbind(fr, around, key);
        }
        Ok(true)
    }

    /// One operation inside a [`Resident`] loop: its accumulators from and
    /// back to the registers of its tile.
    fn mma_resident(
        &mut self,
        fr: &mut Frame<'ctx>,
        op: MmaOp,
        lane: IntValue<'ctx>,
        c: &Tile,
        a: &Placed<'ctx>,
        b: &Placed<'ctx>,
    ) -> R<()> {
        let slots = self.resident_slots(fr, c)?;
        let acc_ty = self.mem_ty(op.types().1);
        let mut acc = Vec::new();
        for &s in &slots {
            acc.push(self.b.build_load(acc_ty, s, "acc")?);
        }
        let d = self.mma_call(op, lane, a, b, acc)?;
        for (v, &s) in d.into_iter().zip(&slots) {
            self.b.build_store(s, v)?;
        }
        Ok(())
    }

    /// The registers of accumulator tile `c` inside a [`Resident`] loop.
    pub(super) fn resident_slots(&self, fr: &Frame<'ctx>, c: &Tile) -> R<Vec<PointerValue<'ctx>>> {
        let r = fr.resident.as_ref().expect("a resident loop");
        let p = &self.f.p;
        let mut key = Vec::new();
        for &v in &r.loops {
            if c.origin.iter().any(|&e| texc_schedules::analysis::involves(p, e, v)) {
                let x = fr.vars[&v].get_zero_extended_constant().expect("unrolled loops are constants");
                key.push((v, x));
            }
        }
        key.sort_unstable();
        r.slots
            .get(&key)
            .cloned()
            .ok_or_else(|| CodegenError::Unsupported("a tensor-core tile without registers".into()))
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
    /// warp's operation at once), accumulating in `c`'s type: f32, or
    /// `i32` for 8-bit operands, whose products and sums wrap as the
    /// tensor cores' do.
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
        let acc_ty = self.mem_ty(op.types().1);
        let zero = i64t.const_zero();
        let func = fr.func;
        self.count(func, "r", zero, i64t.const_int(m as u64, false), &mut |g, r| {
            g.count(func, "c", zero, i64t.const_int(n as u64, false), &mut |g, col| {
                let p = g.element(c, r, col)?;
                let slot = g.entry_alloca(func, acc_ty)?;
                g.b.build_store(slot, g.b.build_load(acc_ty, p, "acc")?)?;
                g.count(func, "k", zero, i64t.const_int(kk as u64, false), &mut |g, k| {
                    let x = g.mma_input(op, g.load_at(a, r, k)?, op.types().0)?;
                    let y = g.mma_input(op, g.load_at(b, k, col)?, op.b_type())?;
                    let acc = g.b.build_load(acc_ty, slot, "acc")?;
                    let sum: BasicValueEnum<'ctx> = if op.is_integer() {
                        let prod = g.b.build_int_mul(x.into_int_value(), y.into_int_value(), "ab")?;
                        g.b.build_int_add(acc.into_int_value(), prod, "sum")?.into()
                    } else {
                        let prod = g.b.build_float_mul(x.into_float_value(), y.into_float_value(), "ab")?;
                        g.b.build_float_add(acc.into_float_value(), prod, "sum")?.into()
                    };
                    g.b.build_store(slot, sum)?;
                    Ok(())
                })?;
                g.b.build_store(p, g.b.build_load(acc_ty, slot, "acc")?)?;
                Ok(())
            })
        })
    }

    /// An operand element `v` of type `elem` as the operation multiplies
    /// it: f16 and bf16 widened to f32, f32 rounded to TF32 where the
    /// operation does, 8-bit values widened to `i32` (signed or not).
    fn mma_input(&self, op: MmaOp, v: BasicValueEnum<'ctx>, elem: ElemType) -> R<BasicValueEnum<'ctx>> {
        let i32t = self.cx.i32_type();
        Ok(match elem {
            ElemType::I8 => self.b.build_int_s_extend(v.into_int_value(), i32t, "s")?.into(),
            ElemType::U8 => self.b.build_int_z_extend(v.into_int_value(), i32t, "u")?.into(),
            ElemType::BF16 => self.bf16_to_f32(v, None)?,
            ElemType::F16 => self.b.build_float_ext(v.into_float_value(), self.cx.f32_type(), "h")?.into(),
            _ if op.rounds_to_tf32() => self.tf32(v.into_float_value())?.into(),
            _ => v,
        })
    }
}
