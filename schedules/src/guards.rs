//! Guards that always hold: a split whose factor does not divide its extent
//! guards its body (`if j < 784`), and when another split partitions the
//! outer loop (784 columns as 6 blocks of 4 panels of 32, then one panel),
//! the guard stays in the full blocks too, where no iteration fails it. This
//! pass drops every comparison of a guard that the enclosing loops' ranges
//! (and the guards around it comparing a loop variable with a constant)
//! decide: `e < c` where `e`'s largest value is below `c`, `e >= c` where
//! its smallest is at least `c`. A guard all of whose comparisons go is
//! replaced by its body; a guard with a comparison that never holds goes
//! with its body. (On AVX-512 such a guard made every vector of a matrix
//! product a masked one: 128×512×784 ran 2.4× slower than on AVX2, whose
//! 16-wide panels divide 784.) A `select`'s condition is simplified the
//! same way, and a decided `select` becomes the operand it picks (a padding
//! copy's interior: a plain load instead of a masked one), and a quotient
//! or remainder whose dividend, beyond multiples of the divisor, the ranges
//! put in one block of it is taken apart (`decided_division`).
//! `crate::versioning` runs first and cuts loops so that more guards and
//! `select`s are decided. A loop all of whose statements are guards
//! bounding its variable from above stops where they all fail
//! ([`guarded_extent`]): a 32-lane panel holding one pixel is a loop of
//! one lane.
//!
//! Invariants: only comparisons decided for every iteration are dropped
//! (a `select`'s operand it never picks with them), only a loop's
//! iterations in which every statement's guard fails are cut off, a
//! quotient or remainder is replaced only by an expression equal to it at
//! every iteration,
//! and only statements that never run (and the CPU loops, guards and
//! buffers they leave empty), so the nest computes what it did; the other
//! loops, stores and their order are kept.

use crate::ir::{ForKind, LoopFunc, Stmt};
use std::collections::{HashMap, HashSet};
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};

/// Loop variables' smallest and largest values.
pub(crate) type Ranges = HashMap<VarId, (i64, i64)>;

/// Drop the comparisons of `f`'s guards that the loop ranges decide.
pub fn drop_proven_guards(f: &mut LoopFunc) {
    let body = std::mem::take(&mut f.body);
    let mut c = Concurrency::default();
    c.collect(&body);
    f.body = stmts(f, body, &mut HashMap::new(), &c);
}

fn stmts(f: &mut LoopFunc, body: Vec<Stmt>, ranges: &mut Ranges, concurrent: &Concurrency) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        match s {
            // A GPU-bound loop's variable may run past its loop (a block as wide
            // as its widest thread loop runs the shorter ones guarded): unknown.
            Stmt::For { var, lo, extent, kind, body } if kind.is_gpu() => {
                let saved = ranges.remove(&var);
                let body = stmts(f, body, ranges, concurrent);
                if let Some(r) = saved {
                    ranges.insert(var, r);
                }
                out.push(Stmt::For { var, lo, extent, kind, body });
            }
            Stmt::For { var, lo, extent, kind, body } => {
                let extent = guarded_extent(f, var, lo, extent, &body, ranges);
                if extent < 1 {
                    continue;
                }
                let saved = ranges.insert(var, (lo, lo + extent - 1));
                let body = stmts(f, body, ranges, concurrent);
                match saved {
                    Some(r) => ranges.insert(var, r),
                    None => ranges.remove(&var),
                };
                // A loop left empty by the guards it held does nothing.
                if !body.is_empty() {
                    out.push(Stmt::For { var, lo, extent, kind, body });
                }
            }
            Stmt::If { cond, then } => {
                // Divisions as the statements inside simplify them: the verifiers
                // prove an access in bounds by its guard's comparison of the same index.
                let cond = fold_decided(f, cond, ranges, concurrent, true);
                let then = stmts(f, then, &mut crate::versioning::narrowed(f, cond, ranges), concurrent);
                match simplify(f, cond, ranges) {
                    _ if then.is_empty() => {}
                    Guard::Sometimes(cond) => out.push(Stmt::If { cond, then }),
                    Guard::Always => out.extend(then),
                    Guard::Never => {}
                }
            }
            Stmt::Alloc { tensor, body } => {
                let body = stmts(f, body, ranges, concurrent);
                if !body.is_empty() {
                    out.push(Stmt::Alloc { tensor, body });
                }
            }
            Stmt::Store { tensor, indices, value } => {
                let indices = indices.into_iter().map(|i| fold_decided(f, i, ranges, concurrent, true)).collect();
                let value = fold_decided(f, value, ranges, concurrent, false);
                out.push(Stmt::Store { tensor, indices, value });
            }
            other => out.push(other),
        }
    }
    out
}

/// The iterations of loop `var` (from `lo`, `extent` of them) that its
/// body's guards let run: where every statement of the body is a guard with
/// a comparison `a·var + rest < k` (`a` > 0), the loop stops where that
/// fails for `rest`'s smallest value. The last panel of a row of 289
/// pixels in panels of 32 holds one pixel: its 32-lane vector loop, every
/// store guarded (`(oo·5 + oi)·32 + v < 289`, one value of `oo` and `oi`
/// there), becomes a loop of one lane instead of masked vectors.
fn guarded_extent(f: &LoopFunc, var: VarId, lo: i64, extent: i64, body: &[Stmt], ranges: &Ranges) -> i64 {
    // Most loops hold a statement that is not a guard: no ranges copied for them.
    let conds: Option<Vec<TExprId>> = body
        .iter()
        .map(|s| match s {
            Stmt::If { cond, .. } => Some(*cond),
            _ => None,
        })
        .collect();
    let Some(conds) = conds.filter(|c| !c.is_empty()) else { return extent };
    let (mut at_var, mut over_loop) = (ranges.clone(), ranges.clone());
    at_var.insert(var, (0, 0));
    over_loop.insert(var, (lo, lo + extent - 1));
    let bound = |cond: TExprId| -> Option<i64> {
        comparisons(f, cond)
            .into_iter()
            .filter_map(|c| {
                let TExpr::Binary(BinOp::Lt, e, k) = *f.p.expr(c) else { return None };
                let TExpr::Int(k) = *f.p.expr(k) else { return None };
                let a = crate::analysis::coefficient(&f.p, e, var).filter(|&a| a > 0)?;
                // `e` bounded over the whole loop: `a·var` does not wrap.
                range(f, e, &over_loop)?;
                let (rest_lo, _) = range(f, e, &at_var)?;
                // The iterations `var <= (k - 1 - rest_lo) / a` may pass.
                let last = k.checked_sub(1)?.checked_sub(rest_lo)?.div_euclid(a);
                Some(last.checked_sub(lo)?.checked_add(1)?.max(0))
            })
            .min()
    };
    // Each statement's last passing iteration; the loop runs to the latest.
    conds.into_iter().map(bound).try_fold(0, |most, n| n.map(|n| most.max(n))).map_or(extent, |most| extent.min(most))
}

/// `e` with each quotient and remainder the loop ranges decide taken apart
/// ([`decided_division`]), each `select` whose condition they decide replaced
/// by the operand it picks, and the comparisons they decide dropped from
/// the others' conditions.
///
/// `strict`: `e` indexes (or guards) an access to a tensor the function
/// writes, where a quotient keeps every variable of a concurrent loop (see
/// [`decided_division`]).
fn fold_decided(f: &mut LoopFunc, e: TExprId, ranges: &Ranges, concurrent: &Concurrency, strict: bool) -> TExprId {
    let strict = match f.p.expr(e) {
        TExpr::Load(t, _) => concurrent.opaque || concurrent.written.contains(t),
        _ => strict,
    };
    let children: Vec<TExprId> =
        f.p.children(e).into_iter().map(|c| fold_decided(f, c, ranges, concurrent, strict)).collect();
    let e = crate::normalize::with_children(&mut f.p, e, children);
    let keep = strict.then_some(&concurrent.vars);
    if let Some(simpler) = decided_division(f, e, ranges, keep) {
        return simpler;
    }
    let TExpr::Select(cond, a, b) = *f.p.expr(e) else { return e };
    match simplify(f, cond, ranges) {
        Guard::Always => a,
        Guard::Never => b,
        Guard::Sometimes(c) if c == cond => e,
        Guard::Sometimes(c) => f.p.alloc(TExpr::Select(c, a, b), f.p.ty(e), f.p.span(e)),
    }
}

/// `(k·X + Y) / k` as `X + q` and `(k·X + Y) % k` as `Y` (q = 0), where the
/// loop ranges put `Y` in one block `[q·k, q·k + k)`: a grouped
/// convolution's channel `(g·16 + k.i.b·6 + k.i.r) / 16` is `g` for every
/// row `k.i.r` of its register block, so the rows load one vector instead of
/// one each (MEASURED: RegNet-X's 2-group 3×3 layer at stride 2, 32 × 56 ×
/// 56 out, x86-avx2 on Zen 4, 0.84 → 0.38 ms). Terms of `X` are the dividend's
/// summands with a constant factor that `k` divides; `None` where the rest
/// is not within one block, or where a quotient would lose a variable of
/// a parallel, vectorized or GPU loop (`concurrent`): the race verifier
/// (`crate::independence`) tells concurrent iterations apart by the digits
/// `x / k` and `x % k` of their variable, both of them.
fn decided_division(
    f: &mut LoopFunc,
    e: TExprId,
    ranges: &Ranges,
    concurrent: Option<&HashSet<VarId>>,
) -> Option<TExprId> {
    let TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, k) = *f.p.expr(e) else { return None };
    let TExpr::Int(k) = *f.p.expr(k) else { return None };
    if k <= 1 || f.p.ty(e) != Ty::Index {
        return None;
    }
    let mut summands = Vec::new();
    summands_of(f, a, &mut summands);
    // Each summand as `k·x` (x, the factor over k) or the rest.
    let (mut multiples, mut rest) = (Vec::new(), Vec::new());
    for &t in &summands {
        match multiple_of(f, t, k) {
            Some(m) => multiples.push(m),
            None => rest.push(t),
        }
    }
    if op == BinOp::FloorDiv
        && concurrent.is_some_and(|vars| rest.iter().any(|&t| f.p.mentions_where(t, &|v| vars.contains(&v))))
    {
        return None;
    }
    let (mut lo, mut hi) = (0i64, 0i64);
    for &t in &rest {
        let (a, b) = range(f, t, ranges)?;
        (lo, hi) = (lo.checked_add(a)?, hi.checked_add(b)?);
    }
    let q = lo.div_euclid(k);
    // A remainder is rewritten only where it is the rest itself (q = 0): as
    // `Y − q·k` it hid a row's constant lane pattern from the byte-window
    // loads (`o % 9 * 8 + v` read as a span, `(o − 9) * 8 + v` gathered).
    if hi.div_euclid(k) != q || (op == BinOp::FloorMod && q != 0) {
        return None;
    }
    let span = f.p.span(e);
    let int = |f: &mut LoopFunc, v: i64| f.p.alloc(TExpr::Int(v), Ty::Index, span);
    let add = |f: &mut LoopFunc, x: TExprId, y: TExprId| f.p.alloc(TExpr::Binary(BinOp::Add, x, y), Ty::Index, span);
    let sum = |f: &mut LoopFunc, terms: &[TExprId], c: i64| {
        let mut acc = None;
        for &t in terms {
            acc = Some(match acc {
                None => t,
                Some(x) => add(f, x, t),
            });
        }
        match acc {
            None => int(f, c),
            Some(x) if c == 0 => x,
            Some(x) => {
                let c = int(f, c);
                add(f, x, c)
            }
        }
    };
    Some(match op {
        BinOp::FloorDiv => sum(f, &multiples, q),
        _ => sum(f, &rest, 0),
    })
}

/// What the race verifier proves things of: the variables of the
/// parallel, vectorized and GPU loops, and the tensors the function writes.
#[derive(Default)]
struct Concurrency {
    vars: HashSet<VarId>,
    written: HashSet<TensorId>,
    /// Tensors are also written by statements other than stores (GPU and
    /// tile products): every access counts as one to a written tensor.
    opaque: bool,
}

impl Concurrency {
    fn collect(&mut self, body: &[Stmt]) {
        for s in body {
            match s {
                Stmt::For { var, kind, .. }
                    if matches!(kind, ForKind::Parallel | ForKind::Vectorized) || kind.is_gpu() =>
                {
                    self.vars.insert(*var);
                }
                Stmt::Store { tensor, .. } => {
                    self.written.insert(*tensor);
                }
                Stmt::For { .. } | Stmt::If { .. } | Stmt::Alloc { .. } | Stmt::Barrier | Stmt::Prefetch { .. } => {}
                _ => self.opaque = true,
            }
            self.collect(s.body());
        }
    }
}

/// The summands of `e` through `+`.
fn summands_of(f: &LoopFunc, e: TExprId, out: &mut Vec<TExprId>) {
    match *f.p.expr(e) {
        TExpr::Binary(BinOp::Add, a, b) => {
            summands_of(f, a, out);
            summands_of(f, b, out);
        }
        _ => out.push(e),
    }
}

/// `t / k` where `t` is `x · c` or `c · x` with `k` dividing `c` (or a
/// constant multiple of `k`), built as `x · (c / k)`.
fn multiple_of(f: &mut LoopFunc, t: TExprId, k: i64) -> Option<TExprId> {
    let span = f.p.span(t);
    match *f.p.expr(t) {
        TExpr::Int(c) if c % k == 0 => Some(f.p.alloc(TExpr::Int(c / k), Ty::Index, span)),
        TExpr::Binary(BinOp::Mul, a, b) => {
            let (x, c) = match (f.p.expr(a), f.p.expr(b)) {
                (_, &TExpr::Int(c)) => (a, c),
                (&TExpr::Int(c), _) => (b, c),
                _ => return None,
            };
            if c % k != 0 || f.p.ty(x) != Ty::Index {
                return None;
            }
            Some(if c == k {
                x
            } else {
                let m = f.p.alloc(TExpr::Int(c / k), Ty::Index, span);
                f.p.alloc(TExpr::Binary(BinOp::Mul, x, m), Ty::Index, span)
            })
        }
        _ => None,
    }
}

/// The comparisons of the conditions of the `select`s in `e`.
pub(crate) fn select_comparisons(f: &LoopFunc, e: TExprId) -> Vec<TExprId> {
    let mut out = match f.p.expr(e) {
        TExpr::Select(cond, ..) => comparisons(f, *cond),
        _ => Vec::new(),
    };
    for c in f.p.children(e) {
        out.extend(select_comparisons(f, c));
    }
    out
}

/// What the loop ranges say of a guard.
enum Guard {
    Always,
    Never,
    /// The comparisons they do not decide.
    Sometimes(TExprId),
}

/// `cond` without its comparisons that always hold.
fn simplify(f: &mut LoopFunc, cond: TExprId, ranges: &Ranges) -> Guard {
    match f.p.expr(cond).clone() {
        TExpr::Binary(BinOp::And, a, b) => match (simplify(f, a, ranges), simplify(f, b, ranges)) {
            (Guard::Never, _) | (_, Guard::Never) => Guard::Never,
            (Guard::Always, rest) | (rest, Guard::Always) => rest,
            (Guard::Sometimes(x), Guard::Sometimes(y)) if (x, y) == (a, b) => Guard::Sometimes(cond),
            (Guard::Sometimes(x), Guard::Sometimes(y)) => {
                Guard::Sometimes(f.p.alloc(TExpr::Binary(BinOp::And, x, y), f.p.ty(cond), f.p.span(cond)))
            }
        },
        _ => match decided(f, cond, ranges) {
            Some(true) => Guard::Always,
            Some(false) => Guard::Never,
            None => Guard::Sometimes(cond),
        },
    }
}

/// The comparisons `cond` is the conjunction of.
pub(crate) fn comparisons(f: &LoopFunc, cond: TExprId) -> Vec<TExprId> {
    match f.p.expr(cond) {
        TExpr::Binary(BinOp::And, a, b) => {
            let mut out = comparisons(f, *a);
            out.extend(comparisons(f, *b));
            out
        }
        _ => vec![cond],
    }
}

/// Whether comparison `c` (`e < k` or `e >= k`) holds for every value of
/// the loop variables in `ranges` (`Some(true)`), for none (`Some(false)`),
/// or neither is known.
pub(crate) fn decided(f: &LoopFunc, c: TExprId, ranges: &Ranges) -> Option<bool> {
    let TExpr::Binary(op @ (BinOp::Lt | BinOp::Ge), e, k) = f.p.expr(c) else { return None };
    let (TExpr::Int(k), Some((lo, hi))) = (f.p.expr(*k), range(f, *e, ranges)) else { return None };
    let (always, never) = if *op == BinOp::Lt { (hi < *k, lo >= *k) } else { (lo >= *k, hi < *k) };
    match (always, never) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}

/// The smallest and largest value of index expression `e` over the loop
/// ranges (`crate::interval`'s, the analysis the loop-nest verifiers prove
/// accesses with, so that no comparison is dropped here that they cannot
/// decide again); `None` where a bound is unknown.
pub(crate) fn range(f: &LoopFunc, e: TExprId, ranges: &Ranges) -> Option<(i64, i64)> {
    let var = |v: VarId| match ranges.get(&v) {
        Some(&(lo, hi)) => crate::interval::range(lo as i128, hi as i128),
        None => crate::interval::ANY,
    };
    let iv = crate::interval::of(&f.p, e, &var);
    Some((i64::try_from(iv.lo?).ok()?, i64::try_from(iv.hi?).ok()?))
}
