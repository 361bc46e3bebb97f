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
//! copy's interior: a plain load instead of a masked one).
//! `crate::versioning` runs first and cuts loops so that more guards and
//! `select`s are decided.
//!
//! Invariants: only comparisons decided for every iteration are dropped
//! (a `select`'s operand it never picks with them),
//! and only statements that never run (and the CPU loops, guards and
//! buffers they leave empty), so the nest computes what it did; the other
//! loops, stores and their order are kept.

use crate::ir::{LoopFunc, Stmt};
use std::collections::HashMap;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, VarId};

/// Loop variables' smallest and largest values.
pub(crate) type Ranges = HashMap<VarId, (i64, i64)>;

/// Drop the comparisons of `f`'s guards that the loop ranges decide.
pub fn drop_proven_guards(f: &mut LoopFunc) {
    let body = std::mem::take(&mut f.body);
    f.body = stmts(f, body, &mut HashMap::new());
}

fn stmts(f: &mut LoopFunc, body: Vec<Stmt>, ranges: &mut Ranges) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        match s {
            // A GPU-bound loop's variable may run past its loop (a block as wide
            // as its widest thread loop runs the shorter ones guarded): unknown.
            Stmt::For { var, lo, extent, kind, body } if kind.is_gpu() => {
                let saved = ranges.remove(&var);
                let body = stmts(f, body, ranges);
                if let Some(r) = saved {
                    ranges.insert(var, r);
                }
                out.push(Stmt::For { var, lo, extent, kind, body });
            }
            Stmt::For { var, lo, extent, kind, body } => {
                let saved = ranges.insert(var, (lo, lo + extent - 1));
                let body = stmts(f, body, ranges);
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
                let then = stmts(f, then, &mut crate::versioning::narrowed(f, cond, ranges));
                match simplify(f, cond, ranges) {
                    _ if then.is_empty() => {}
                    Guard::Sometimes(cond) => out.push(Stmt::If { cond, then }),
                    Guard::Always => out.extend(then),
                    Guard::Never => {}
                }
            }
            Stmt::Alloc { tensor, body } => {
                let body = stmts(f, body, ranges);
                if !body.is_empty() {
                    out.push(Stmt::Alloc { tensor, body });
                }
            }
            Stmt::Store { tensor, indices, value } => {
                let indices = indices.into_iter().map(|i| fold_selects(f, i, ranges)).collect();
                let value = fold_selects(f, value, ranges);
                out.push(Stmt::Store { tensor, indices, value });
            }
            other => out.push(other),
        }
    }
    out
}

/// `e` with each `select` whose condition the loop ranges decide replaced
/// by the operand it picks, and the comparisons they decide dropped from
/// the others' conditions.
fn fold_selects(f: &mut LoopFunc, e: TExprId, ranges: &Ranges) -> TExprId {
    let children: Vec<TExprId> = f.p.children(e).into_iter().map(|c| fold_selects(f, c, ranges)).collect();
    let e = crate::normalize::with_children(&mut f.p, e, children);
    let TExpr::Select(cond, a, b) = *f.p.expr(e) else { return e };
    match simplify(f, cond, ranges) {
        Guard::Always => a,
        Guard::Never => b,
        Guard::Sometimes(c) if c == cond => e,
        Guard::Sometimes(c) => f.p.alloc(TExpr::Select(c, a, b), f.p.ty(e), f.p.span(e)),
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
