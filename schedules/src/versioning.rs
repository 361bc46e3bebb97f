//! Tail versioning: a loop whose guards hold (or fail) on a prefix or a
//! suffix of its range is cut there, so the part where the guard is decided
//! runs without it. A split that does not divide its extent leaves a guard
//! on every iteration of the loops around the tail (1000 columns as 8
//! blocks of 4 panels of 32: `(j.oo * 4 + j.oi) * 32 + j.v < 1000` stays on
//! every vector of every block), and a guarded vector is a masked one whose
//! accumulators LLVM cannot keep in registers: SGEMM at 1000³ ran 6× slower
//! than at 1024³.
//!
//! For each loop (outermost first) the first comparison `e < c` or `e >= c`
//! of a guard inside it, or of the condition of a `select` a statement
//! inside it computes (a padding copy's `select(x >= 1 && x < 57, X[x - 1],
//! 0)`, a concatenation's `select(c < 64, A[c], B[c - 64])`), that mentions
//! its variable is decided, over the ranges of the loops around and
//! inside, on the longest prefix (or suffix)
//! of the loop's range (binary search: a comparison decided on a range is
//! decided on its sub-ranges). Then:
//! - a serial loop becomes two loops, `lo..cut` and `cut..hi` (the second a
//!   copy with fresh variables);
//! - a parallel loop keeps its one launch and its body is versioned:
//!   `if x < cut: body'` and `if x >= cut: body` (`body'` a copy).
//!
//! Each piece is considered again with its narrower range; `crate::guards`
//! then drops the comparisons each piece decides (and the statements whose
//! guard fails everywhere), and a decided `select` becomes the operand it
//! picks: a padding copy's interior loads and stores whole vectors with no
//! lane mask (MEASURED on AVX2, Zen 4: EfficientNet-B0's first stride-2
//! depthwise block, SiLU in its padding copy, 1.29 → 0.90 ms).
//! Vectorized, unrolled and GPU-bound loops are not cut (their iterations
//! are lanes, copies or threads), nor loops holding GPU statements. Work
//! is bounded: at most [`MAX_CUTS`] cuts per top-level nest, and a body is
//! copied only while it has at most [`MAX_COPIED`] statements, so code
//! grows at most linearly in a model's nests.
//!
//! Invariants: every iteration of every loop runs once, in the original
//! order (a serial loop's pieces follow each other; a parallel loop's
//! iterations each take one of two exclusive branches); only guards and
//! `select` conditions change.

use crate::guards::{comparisons, decided, Ranges};
use crate::ir::{ForKind, LoopFunc, Stmt};
use crate::normalize::subst;
use std::collections::HashMap;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, Ty, VarId};
use texc_compiler::types::ElemType;

/// Cuts per top-level loop nest (a model has hundreds): each copies a loop body once.
pub const MAX_CUTS: usize = 32;
/// Statements (counted recursively) a copied body may have.
pub const MAX_COPIED: usize = 400;

/// Cut `f`'s loops where their guards are decided (see the module header).
pub fn version_tails(f: &mut LoopFunc) {
    let body = std::mem::take(&mut f.body);
    let mut out = Vec::with_capacity(body.len());
    for nest in body {
        out.extend(Versioner { cuts: 0 }.stmts(f, vec![nest], &mut Ranges::new()));
    }
    f.body = out;
}

struct Versioner {
    cuts: usize,
}

impl Versioner {
    fn stmts(&mut self, f: &mut LoopFunc, body: Vec<Stmt>, ranges: &mut Ranges) -> Vec<Stmt> {
        let mut out = Vec::with_capacity(body.len());
        for s in body {
            match s {
                Stmt::For { var, lo, extent, kind, body } if cuttable(kind) && extent > 1 => {
                    out.extend(self.cut_loop(f, var, lo, extent, kind, body, ranges));
                }
                Stmt::For { var, lo, extent, kind, body } => {
                    let body = within(ranges, var, lo, extent, kind, |r| self.stmts(f, body, r));
                    out.push(Stmt::For { var, lo, extent, kind, body });
                }
                Stmt::If { cond, then } => {
                    let then = self.stmts(f, then, &mut narrowed(f, cond, ranges));
                    out.push(Stmt::If { cond, then });
                }
                Stmt::Alloc { tensor, body } => out.push(Stmt::Alloc { tensor, body: self.stmts(f, body, ranges) }),
                other => out.push(other),
            }
        }
        out
    }

    /// Loop `var in lo..lo + extent`, cut where a guard inside it is decided.
    #[allow(clippy::too_many_arguments)]
    fn cut_loop(
        &mut self,
        f: &mut LoopFunc,
        var: VarId,
        lo: i64,
        extent: i64,
        kind: ForKind,
        body: Vec<Stmt>,
        ranges: &mut Ranges,
    ) -> Vec<Stmt> {
        let cut = if self.cuts < MAX_CUTS && size(&body) <= MAX_COPIED && !has_gpu_statements(&body) {
            find_cut(f, var, lo, lo + extent, kind, &body, ranges)
        } else {
            None
        };
        let Some(cut) = cut else {
            let body = within(ranges, var, lo, extent, kind, |r| self.stmts(f, body, r));
            return vec![Stmt::For { var, lo, extent, kind, body }];
        };
        self.cuts += 1;
        match kind {
            ForKind::Parallel => {
                let copy = copy_stmts(f, &body);
                let (below, rest) = (compare(f, var, BinOp::Lt, cut), compare(f, var, BinOp::Ge, cut));
                let body = vec![Stmt::If { cond: below, then: copy }, Stmt::If { cond: rest, then: body }];
                let body = within(ranges, var, lo, extent, kind, |r| self.stmts(f, body, r));
                vec![Stmt::For { var, lo, extent, kind, body }]
            }
            _ => {
                let (second, second_body) = copy_loop(f, var, &body);
                let mut out = self.cut_loop(f, var, lo, cut - lo, kind, body, ranges);
                out.extend(self.cut_loop(f, second, cut, lo + extent - cut, kind, second_body, ranges));
                out
            }
        }
    }
}

/// Loops whose range may be cut: their iterations are sequential code.
fn cuttable(kind: ForKind) -> bool {
    matches!(kind, ForKind::Serial | ForKind::Parallel)
}

/// `run` with `var`'s range known inside the loop (unknown for a GPU-bound
/// loop, whose variable may run past it).
fn within<T>(
    ranges: &mut Ranges,
    var: VarId,
    lo: i64,
    extent: i64,
    kind: ForKind,
    run: impl FnOnce(&mut Ranges) -> T,
) -> T {
    let saved = if kind.is_gpu() { ranges.remove(&var) } else { ranges.insert(var, (lo, lo + extent - 1)) };
    let out = run(ranges);
    match saved {
        Some(r) => ranges.insert(var, r),
        None => ranges.remove(&var),
    };
    out
}

/// `ranges` narrowed by guard `cond`'s comparisons of a loop variable with
/// a constant (`x < c`, `x >= c`): the ranges inside the guard.
pub(crate) fn narrowed(f: &LoopFunc, cond: TExprId, ranges: &Ranges) -> Ranges {
    let mut inside = ranges.clone();
    for c in comparisons(f, cond) {
        let TExpr::Binary(op, a, b) = f.p.expr(c) else { continue };
        let (TExpr::Var(v), TExpr::Int(k)) = (f.p.expr(*a), f.p.expr(*b)) else { continue };
        if let Some(r) = inside.get_mut(v) {
            match op {
                BinOp::Lt => r.1 = r.1.min(k - 1),
                BinOp::Ge => r.0 = r.0.max(*k),
                _ => {}
            }
        }
    }
    inside
}

/// Where to cut `var in lo..hi`: the end of the longest prefix, or the start
/// of the longest suffix, on which a comparison of a guard inside `body`
/// that mentions `var` is decided (not on the whole range: that needs no cut).
///
/// A parallel loop is cut only where a comparison reads its variable
/// affinely: the race verifier (`crate::independence`) reads `kh / 11` and
/// `kh % 11` as digits of `kh`, and cannot tell apart the two versions of
/// a body cut inside the range of the high digit.
#[allow(clippy::too_many_arguments)]
fn find_cut(f: &LoopFunc, var: VarId, lo: i64, hi: i64, kind: ForKind, body: &[Stmt], ranges: &Ranges) -> Option<i64> {
    let mut found = None;
    guards_in(f, body, &mut ranges.clone(), &mut |f, c, inner| {
        if found.is_some() || !f.p.mentions(c, var) || (kind == ForKind::Parallel && divides(f, c, var)) {
            return;
        }
        let on = |a: i64, b: i64| {
            let mut r = inner.clone();
            r.insert(var, (a, b - 1));
            decided(f, c, &r).is_some()
        };
        if on(lo, hi)
            || periodic(f, c, &{
                let mut r = inner.clone();
                r.insert(var, (lo, hi - 1));
                r
            })
        {
            return;
        }
        // The longest decided prefix lo..m, then the longest decided suffix m..hi.
        let prefix = partition_point(lo + 1, hi, |m| on(lo, m));
        if prefix > lo {
            found = Some(prefix);
            return;
        }
        let suffix = partition_point(lo + 1, hi, |m| !on(m, hi)) + 1;
        if suffix < hi {
            found = Some(suffix);
        }
    });
    found
}

/// Whether `e` takes a remainder whose dividend runs over more than one
/// block of the divisor on `ranges` (a fused loop's `n.c.y % 22` over 16
/// channels): its comparisons are decided again in every block, and cutting
/// there would copy the body once a block.
fn periodic(f: &LoopFunc, e: TExprId, ranges: &Ranges) -> bool {
    if let TExpr::Binary(BinOp::FloorMod | BinOp::URem, a, k) = f.p.expr(e) {
        if let (TExpr::Int(k), Some((lo, hi))) = (f.p.expr(*k), crate::guards::range(f, *a, ranges)) {
            if *k > 1 && lo.div_euclid(*k) != hi.div_euclid(*k) {
                return true;
            }
        }
    }
    f.p.children(e).into_iter().any(|c| periodic(f, c, ranges))
}

/// The largest `m` in `from..to` with `holds(m)` plus one, for a `holds`
/// true up to some point and false after it (`from - 1` when none holds).
fn partition_point(from: i64, to: i64, holds: impl Fn(i64) -> bool) -> i64 {
    let (mut a, mut b) = (from, to);
    while a < b {
        let m = a + (b - a) / 2;
        if holds(m) {
            a = m + 1;
        } else {
            b = m;
        }
    }
    a - 1
}

/// Calls `visit` with each comparison of each guard in `body` and the ranges
/// of the loops around it.
fn guards_in(f: &LoopFunc, body: &[Stmt], ranges: &mut Ranges, visit: &mut dyn FnMut(&LoopFunc, TExprId, &Ranges)) {
    for s in body {
        match s {
            Stmt::For { var, lo, extent, kind, body } => {
                within(ranges, *var, *lo, *extent, *kind, |r| guards_in(f, body, r, visit))
            }
            Stmt::If { cond, then } => {
                for c in comparisons(f, *cond) {
                    visit(f, c, ranges);
                }
                guards_in(f, then, &mut narrowed(f, *cond, ranges), visit);
            }
            Stmt::Alloc { body, .. } => guards_in(f, body, ranges, visit),
            Stmt::Store { indices, value, .. } => {
                for &e in indices.iter().chain([value]) {
                    for c in crate::guards::select_comparisons(f, e) {
                        visit(f, c, ranges);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether `e` divides, or takes a remainder of, an expression of `var`.
fn divides(f: &LoopFunc, e: TExprId, var: VarId) -> bool {
    let division = matches!(
        f.p.expr(e),
        TExpr::Binary(
            BinOp::FloorDiv | BinOp::FloorMod | BinOp::UDiv | BinOp::URem | BinOp::TruncDiv | BinOp::TruncRem,
            ..
        )
    );
    (division && f.p.mentions(e, var)) || f.p.children(e).into_iter().any(|c| divides(f, c, var))
}

/// `var op k` as a guard.
pub(crate) fn compare(f: &mut LoopFunc, var: VarId, op: BinOp, k: i64) -> TExprId {
    let x = f.p.alloc(TExpr::Var(var), Ty::Index, Default::default());
    let k = f.p.alloc(TExpr::Int(k), Ty::Index, Default::default());
    f.p.alloc(TExpr::Binary(op, x, k), Ty::Elem(ElemType::Bool), Default::default())
}

/// Statements in `body`, counted recursively.
fn size(body: &[Stmt]) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => 1 + size(body),
            _ => 1,
        })
        .sum()
}

pub(crate) fn has_gpu_statements(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::For { kind, body, .. } => kind.is_gpu() || *kind == ForKind::Async || has_gpu_statements(body),
        Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => has_gpu_statements(body),
        Stmt::Store { .. } | Stmt::Prefetch { .. } => false,
        Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::TileDot(_) | Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) => {
            true
        }
    })
}

/// A fresh variable for a copy of loop `var`, and a copy of its body using it.
fn copy_loop(f: &mut LoopFunc, var: VarId, body: &[Stmt]) -> (VarId, Vec<Stmt>) {
    let d = f.vars[var as usize].clone();
    let fresh = f.new_var(d.name, d.extent);
    let mut rename = HashMap::from([(var, fresh)]);
    let body = body.iter().map(|s| copy(f, s, &mut rename, true)).collect();
    (fresh, body)
}

/// A copy of `body` whose loops have fresh variables.
fn copy_stmts(f: &mut LoopFunc, body: &[Stmt]) -> Vec<Stmt> {
    let mut rename = HashMap::new();
    body.iter().map(|s| copy(f, s, &mut rename, true)).collect()
}

/// Deep copy of CPU statement `s` (no GPU statements: see
/// `has_gpu_statements`), its expressions' variables renamed by `rename`;
/// with `fresh`, each loop gets a new variable (added to `rename`), else
/// loops keep theirs.
pub(crate) fn copy(f: &mut LoopFunc, s: &Stmt, rename: &mut HashMap<VarId, VarId>, fresh: bool) -> Stmt {
    let e = |f: &mut LoopFunc, x: TExprId, rename: &HashMap<VarId, VarId>| subst(&mut f.p, x, &HashMap::new(), rename);
    match s {
        Stmt::For { var, lo, extent, kind, body } => {
            let var = if fresh {
                let d = f.vars[*var as usize].clone();
                let new = f.new_var(d.name, d.extent);
                rename.insert(*var, new);
                new
            } else {
                *var
            };
            let body = body.iter().map(|s| copy(f, s, rename, fresh)).collect();
            Stmt::For { var, lo: *lo, extent: *extent, kind: *kind, body }
        }
        Stmt::If { cond, then } => {
            let cond = e(f, *cond, rename);
            Stmt::If { cond, then: then.iter().map(|s| copy(f, s, rename, fresh)).collect() }
        }
        Stmt::Alloc { tensor, body } => {
            Stmt::Alloc { tensor: *tensor, body: body.iter().map(|s| copy(f, s, rename, fresh)).collect() }
        }
        Stmt::Store { tensor, indices, value } => {
            let indices = indices.iter().map(|&i| e(f, i, rename)).collect();
            Stmt::Store { tensor: *tensor, indices, value: e(f, *value, rename) }
        }
        Stmt::Prefetch { tensor, offset } => Stmt::Prefetch { tensor: *tensor, offset: e(f, *offset, rename) },
        Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::TileDot(_) | Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) => {
            unreachable!("bodies with GPU statements or tile products are not copied")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars_of(p: &texc_compiler::tir::Program, e: TExprId) -> Vec<VarId> {
        let mut out = match p.expr(e) {
            TExpr::Var(v) => vec![*v],
            _ => Vec::new(),
        };
        for c in p.children(e) {
            out.extend(vars_of(p, c).into_iter().filter(|v| !out.contains(v)).collect::<Vec<_>>());
        }
        out
    }

    fn parse(src: &str) -> LoopFunc {
        let mut sm = texc_grammar::span::SourceMap::new();
        let id = sm.add("k.loops", src.to_string());
        crate::text::parse(src, id).unwrap_or_else(|d| panic!("{}\n{src}", d.render(&sm))).func
    }

    /// A prefetch in a cut loop is copied with the loop's fresh variable:
    /// each piece prefetches at its own iterations, inside the tensor.
    #[test]
    fn a_cut_loop_keeps_its_prefetches_renamed() {
        let src = "func k []\n  input X: f32[67]\n  output Y: f32[67]\n  for i in 0..67:\n    \
                   prefetch X at min(i + 16, 66)\n    if i < 60:\n      Y[i] = X[i] * 2.0f32\n    \
                   if i >= 60:\n      Y[i] = X[i]\n";
        let f = parse(src);
        let mut g = f.clone();
        version_tails(&mut g);
        crate::verify::verify(&g).expect("verifies");
        let text = crate::ir::print(&g);
        assert_eq!(text.matches("prefetch X at").count(), 2, "{text}");
        assert!(text.contains("0..60:") && text.contains("60..67:"), "the loop is cut at 60:\n{text}");
        // The copy's prefetch reads the copy's variable (printed as the
        // original's name): every loop variable a prefetch mentions is one
        // of the loops around it.
        let Some(Stmt::For { var: first, .. }) = g.body.first() else { panic!("{text}") };
        let Some(Stmt::For { var: second, .. }) = g.body.get(1) else { panic!("{text}") };
        assert_ne!(first, second, "{text}");
        for (piece, var) in g.body.iter().zip([first, second]) {
            let Stmt::For { body, .. } = piece else { unreachable!() };
            let Some(Stmt::Prefetch { offset, .. }) = body.first() else { panic!("{text}") };
            assert_eq!(vars_of(&g.p, *offset), vec![*var], "{text}");
        }
        let x: Vec<f32> = (0..67).map(|i| i as f32 - 30.0).collect();
        let arg = || {
            vec![texc_compiler::interp::Arg::Tensor(texc_runtime::Tensor {
                shape: vec![67],
                data: texc_runtime::Data::F32(x.clone()),
            })]
        };
        let want = crate::eval::run(&f, arg()).expect("runs");
        let got = crate::eval::run(&g, arg()).expect("runs with its prefetches checked");
        assert_eq!(format!("{:?}", got[0].data), format!("{:?}", want[0].data));
    }
}
