//! Reads that transpose, as contiguous loads and shuffles. An unrolled loop
//! of `L` copies over `k` around a vectorized loop of `L` lanes over `v`
//! whose statements read a tensor with lanes far apart and consecutive
//! copies next to each other (`Y[k, v] = T[v, k]`: a filters-last product's
//! copy back, `Y[n, f, y, x] = Y.t[n, y, x, f]`) gathers each vector from
//! `L` cache lines, and the next copy gathers from the same lines again.
//! Here the `L × L` block those copies read is loaded once, one contiguous
//! vector along `k` per lane, and transposed in registers (log₂ `L` rounds
//! of interleaving row `j` with row `j + L/2`); copy `i` reads column `i`.
//! MEASURED (Zen 4, AVX-512, one thread; `Y[n, k, h, w] = max(T[n, h, w, k]
//! + b[k], 0)` at 64 × 55 × 55, SqueezeNet's first copy back): 0.095 ms
//! with gathers, 0.024 so; SqueezeNet 1.1 as a whole 7.32–7.43 → 7.12–7.29
//! ms; AVX2's 8 × 8 blocks, a 1024 × 512 transpose, 0.356 → 0.278 ms (with
//! two blocks of lanes inside each, which the schedule arranges:
//! `texc_schedules`' `unroll_along_lines`).
//!
//! A read in a `select`'s branch is not made by every lane (a padding
//! copy's `select(y >= 1 && …, Y.t[n, (y - 1) * 14 + x - 1, c], 0)` reads
//! nothing for its border, whose rows `y - 1 = -1` lie before the tensor):
//! where the condition does not involve `k`, each row is read whole or not
//! at all, and its offset is clamped into the tensor, so a row no lane
//! reads loads elements that are there, which the `select` then drops;
//! where it does (a concatenation's `select(c < 64, A[c], B[c - 64])`), a
//! row may start outside the tensor and end inside, and the read is left
//! to the plain loop.
//!
//! Invariants: each copy reads the values it read before — the block is
//! exactly the elements its copies' lanes read, and every row loaded lies
//! inside the buffer; taken only where the loop body is the vectorized loop (beside
//! prefetches, which change no value) of stores without guards into
//! other tensors (nothing the copies store changes the block), in one
//! vector piece of `L` lanes without a mask.

use super::gen::{Frame, Gen, Mode};
use super::R;
use inkwell::types::VectorType;
use inkwell::values::{BasicValueEnum, IntValue, VectorValue};
use std::collections::{HashMap, HashSet};
use texc_compiler::tir::{TExpr, TExprId, TensorId};
use texc_compiler::types::ElemType;
use texc_schedules::analysis::{self, Access};
use texc_schedules::ir::{ForKind, Stmt};

/// A read `e` of `t` at `idx` that the copies take from the transposed block.
struct Read {
    e: TExprId,
    t: TensorId,
    idx: Vec<TExprId>,
    /// In a `select`'s branch (or right of `&&`, `||`) whose condition does
    /// not involve the copied axis: made by whole rows only, its rows
    /// clamped to start at most this element (a row before the tensor's end).
    clamp_at: Option<i64>,
}

impl<'ctx> Gen<'ctx, '_> {
    /// Emit the unrolled loop `for k in lo..lo + extent { body }` with its
    /// transposing reads taken from a block transposed in registers; false,
    /// with nothing emitted, where the loop is not of that form.
    pub(super) fn transposed_copies(
        &mut self,
        fr: &mut Frame<'ctx>,
        k: texc_compiler::tir::VarId,
        lo: i64,
        extent: i64,
        body: &[Stmt],
    ) -> R<bool> {
        // The prefetches `texc_schedules::prefetch` puts beside the vectors
        // (of the lines the next blocks read) are issued for each copy, as
        // the plain loop would.
        let mut vectors = body.iter().filter(|s| !matches!(s, Stmt::Prefetch { .. }));
        let (Some(Stmt::For { var: v, lo: v_lo, extent: v_extent, kind: ForKind::Vectorized, body: inner }), None) =
            (vectors.next(), vectors.next())
        else {
            return Ok(false);
        };
        let lanes = extent;
        if self.on_device() || *v_extent != lanes || !(4..=16).contains(&lanes) || lanes.count_ones() != 1 {
            return Ok(false);
        }
        if self.vector_pieces(inner, *v_lo, *v_extent, ForKind::Vectorized) != [(*v_lo, lanes as u32)] {
            return Ok(false);
        }
        let reads = self.transposing_reads(inner, *v, k, lanes);
        if reads.is_empty() {
            return Ok(false);
        }
        let int = |g: &Self, x: i64| g.cx.i64_type().const_int(x as u64, true);
        let mut columns: Vec<HashMap<TExprId, BasicValueEnum<'ctx>>> = vec![HashMap::new(); lanes as usize];
        fr.vars.insert(k, int(self, lo));
        for r in &reads {
            let elem = self.f.p.tensor(r.t).elem;
            let mty = self.mem_ty(elem);
            let mut rows = Vec::with_capacity(lanes as usize);
            for j in 0..lanes {
                fr.vars.insert(*v, int(self, v_lo + j));
                let mut off = self.flat_offset(fr, r.t, &r.idx, Mode::Scalar)?.into_int_value();
                if let Some(last_row) = r.clamp_at {
                    off = self.clamped(off, last_row)?;
                }
                let p = self.gep(mty, fr.tensors[&r.t], off)?;
                rows.push(self.plain_load(p, mty, lanes as u32, elem.size() as u32)?);
            }
            fr.vars.remove(v);
            for (i, c) in self.transpose(rows)?.into_iter().enumerate() {
                columns[i].insert(r.e, c.into());
            }
        }
        for (i, column) in columns.into_iter().enumerate() {
            fr.vars.insert(k, int(self, lo + i as i64));
            fr.transposed = column;
            let r = self.stmts(fr, body, Mode::Scalar);
            fr.transposed.clear();
            r?;
        }
        Ok(true)
    }

    /// The reads of `inner` (stores only) that move by at least `lanes`
    /// elements along `v` and by one along `k`, of tensors `inner` does not
    /// store; none where `inner` is anything but stores.
    fn transposing_reads(
        &self,
        inner: &[Stmt],
        v: texc_compiler::tir::VarId,
        k: texc_compiler::tir::VarId,
        lanes: i64,
    ) -> Vec<Read> {
        let mut stored = Vec::new();
        let mut made = Reads::default();
        for s in inner {
            let Stmt::Store { tensor, value, .. } = s else { return Vec::new() };
            stored.push(*tensor);
            how_made(&self.f.p, *value, k, Made::ByEveryLane, &mut made);
        }
        // A read that every lane also makes elsewhere (a LeakyReLU's
        // `select(y >= 0, y, 0.01 * y)` of `y = Y.t[…] + b[f]`, its loads
        // copied apart) is in the tensor wherever it is made.
        let by_every_lane: Vec<TExprId> =
            made.order.iter().filter(|&&(_, h)| h == Made::ByEveryLane).map(|&(e, _)| e).collect();
        let made_by_all = |x: TExprId| by_every_lane.iter().any(|&o| analysis::same_value(&self.f.p, o, x));
        let mut reads: Vec<Read> = Vec::new();
        for &(e, how) in &made.order {
            let TExpr::Load(t, idx) = self.f.p.expr(e) else { continue };
            let apart = matches!(analysis::access(self.f, *t, idx, v), Access::Strided(s) if s.abs() >= lanes);
            let along_k = analysis::flat_coefficient(&self.f.p, *t, idx, k) == Some(1);
            let plain = self.f.p.tensor(*t).elem != ElemType::Bool && !self.swizzled.contains(t);
            let how = if how != Made::ByEveryLane && made_by_all(e) { Made::ByEveryLane } else { how };
            // A row is `lanes` elements: a conditional read's rows are
            // clamped to start at most that many before the end.
            let last_row = self.f.p.tensor(*t).shape.iter().product::<i64>() - lanes;
            if apart && along_k && plain && last_row >= 0 && how != Made::BySomeOfARow && !stored.contains(t) {
                let clamp_at = (how == Made::ByWholeRows).then_some(last_row);
                reads.push(Read { e, t: *t, idx: idx.clone(), clamp_at });
            }
        }
        reads
    }

    /// `x` clamped into `0..=hi` (signed).
    fn clamped(&mut self, x: IntValue<'ctx>, hi: i64) -> R<IntValue<'ctx>> {
        let ty = x.get_type();
        let (zero, top) = (ty.const_zero(), ty.const_int(hi as u64, true));
        let smax = self.intrinsic("llvm.smax", &[ty.into()])?;
        let smin = self.intrinsic("llvm.smin", &[ty.into()])?;
        let lo = self.call(smax, &[x.into(), zero.into()])?;
        Ok(self.call(smin, &[lo, top.into()])?.into_int_value())
    }

    /// The columns of the square matrix whose rows are `rows` (a power of
    /// two of them, each as many lanes): each round puts rows `j` and
    /// `j + n/2` lane by lane into rows `2j` (their first halves) and `2j + 1`
    /// (their second halves); after log₂ n rounds row `i` is column `i`.
    fn transpose(&mut self, mut rows: Vec<VectorValue<'ctx>>) -> R<Vec<VectorValue<'ctx>>> {
        let n = rows.len() as u64;
        let half = n / 2;
        let i32t = self.cx.i32_type();
        let pattern = |from: u64| {
            let ids: Vec<_> =
                (0..half).flat_map(|i| [from + i, from + i + n]).map(|x| i32t.const_int(x, false)).collect();
            VectorType::const_vector(&ids)
        };
        let (first, second) = (pattern(0), pattern(half));
        for _ in 0..n.trailing_zeros() {
            let mut next = Vec::with_capacity(n as usize);
            for j in 0..half as usize {
                let (a, b) = (rows[j], rows[j + half as usize]);
                next.push(self.b.build_shuffle_vector(a, b, first, "tlo")?);
                next.push(self.b.build_shuffle_vector(a, b, second, "thi")?);
            }
            rows = next;
        }
        Ok(rows)
    }
}

/// Which lanes make a read of a transposing copy: every one; whole rows
/// of the block (a `select`'s branch, or the right side of `&&` or `||`,
/// whose condition does not involve the
/// unrolled axis `k`, a padding copy's `y ≥ 1 && …`: each row is read by
/// all its copies or by none, and clamped); or some elements of a row (a
/// condition on `k`, a concatenation's `select(c < 64, A[c], B[c - 64])`:
/// the row's start may lie outside the tensor where its later elements do
/// not, and clamping it would move them — read as written).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
enum Made {
    ByEveryLane,
    ByWholeRows,
    BySomeOfARow,
}

/// The reads of a copy's values in the order first met, each with the
/// most restrictive [`Made`] of its occurrences; `walked`, the expressions
/// already walked under each `Made` (a value shares subexpressions — a
/// SiLU's `x · sigmoid(x)` — which are walked once each, not once per path).
#[derive(Default)]
struct Reads {
    order: Vec<(TExprId, Made)>,
    at: HashMap<TExprId, usize>,
    walked: HashSet<(TExprId, Made)>,
}

/// [`Made`] for each read in `e`, under `how`, into `out`.
fn how_made(p: &texc_compiler::tir::Program, e: TExprId, k: texc_compiler::tir::VarId, how: Made, out: &mut Reads) {
    if !out.walked.insert((e, how)) {
        return;
    }
    // A `select`'s branches, and the right side of `&&` and `||` (made
    // only where the left allows it: `codegen`'s `logic`), are reads some
    // lanes skip.
    let branches = match *p.expr(e) {
        TExpr::Select(c, a, b) => Some((c, [Some(a), Some(b)])),
        TExpr::Binary(op, a, b) if op.is_logic() => Some((a, [Some(b), None])),
        _ => None,
    };
    if let Some((c, branches)) = branches {
        how_made(p, c, k, how, out);
        let branch = if analysis::involves(p, c, k) { Made::BySomeOfARow } else { how.max(Made::ByWholeRows) };
        for b in branches.into_iter().flatten() {
            how_made(p, b, k, branch, out);
        }
        return;
    }
    if let TExpr::Load(..) = p.expr(e) {
        let at = *out.at.entry(e).or_insert_with(|| {
            out.order.push((e, how));
            out.order.len() - 1
        });
        out.order[at].1 = out.order[at].1.max(how);
    }
    for c in p.children(e) {
        how_made(p, c, k, how, out);
    }
}
