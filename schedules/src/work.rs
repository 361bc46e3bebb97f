//! The operations a loop nest executes, for `texc bench --profile`'s rate
//! of each nest: every store's float and integer operations (counted as
//! `texc_compiler::cost` counts a program's, each occurrence in the
//! expression), times the iterations that reach it.
//!
//! Unlike the whole kernel's count, which credits the program as written
//! (a Winograd plan is rated by the products it replaces), this is the
//! work the nest's code does: padding copies and transforms do none,
//! Winograd's products fewer, a masked tail only its lanes. Loops have
//! constant bounds, so the iterations that reach a statement are the
//! loops' product times the share of the points of the guards' variables
//! that pass every guard around it (`if p >= 3:` around `if p * 16 + v <
//! 49:` — together, not one share times the other), found by trying every
//! combination of those variables where there are at most
//! [`MAX_GUARD_POINTS`]. Every iteration is counted where a guard is beyond
//! that, reads anything but loop variables and integer constants (memory,
//! scalars, floats), or tests a variable no loop around it binds.
//!
//! Invariants: no statement is executed or changed; the count is a
//! function of the nest alone (the same nest, the same count).

use crate::ir::{LoopFunc, Stmt};
use texc_compiler::semantics::{self as sem, V};
use texc_compiler::tir::{Program, TExpr, TExprId, Ty, VarId};
use texc_compiler::types::ElemType;

/// Most combinations of the guards' variables tried to find their share.
pub const MAX_GUARD_POINTS: i64 = 1 << 16;

/// Float and integer operations.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    pub flops: f64,
    /// Integer operations on element values (not indices).
    pub int_ops: f64,
}

/// What `s`, a statement of `f` (a top-level loop nest), executes.
pub fn executed(f: &LoopFunc, s: &Stmt) -> Work {
    let mut w = Work::default();
    let mut at = Place { loops: Vec::new(), guards: Vec::new(), trips: 1.0, share: 1.0 };
    walk(f, s, &mut at, &mut w);
    w
}

/// A loop variable's values, `lo..lo + extent`.
#[derive(Clone, Copy)]
struct Range {
    var: VarId,
    lo: i64,
    extent: i64,
}

/// Where the walk is: the loops and guards around it, the loops' product
/// of iterations, and the share of them that passes every guard.
struct Place {
    loops: Vec<Range>,
    guards: Vec<TExprId>,
    trips: f64,
    share: f64,
}

/// Adds what `s` executes at `at` to `w`.
fn walk(f: &LoopFunc, s: &Stmt, at: &mut Place, w: &mut Work) {
    match s {
        Stmt::For { var, lo, extent, body, .. } => {
            at.loops.push(Range { var: *var, lo: *lo, extent: *extent });
            let trips = at.trips;
            at.trips *= *extent as f64;
            body.iter().for_each(|b| walk(f, b, at, w));
            at.trips = trips;
            at.loops.pop();
        }
        Stmt::If { cond, then } => {
            at.guards.push(*cond);
            let share = at.share;
            at.share = guards_share(&f.p, &at.guards, &at.loops);
            then.iter().for_each(|b| walk(f, b, at, w));
            at.share = share;
            at.guards.pop();
        }
        Stmt::Alloc { body, .. } => body.iter().for_each(|b| walk(f, b, at, w)),
        Stmt::Store { value, .. } => {
            let (fl, io) = texc_compiler::cost::expression_work(&f.p, *value);
            w.flops += at.trips * at.share * fl;
            w.int_ops += at.trips * at.share * io;
        }
        // Each of its m·n·k steps is a `@dot4` of four byte pairs, counted
        // as the cost model counts one: four products and four sums.
        Stmt::TileDot(t) => w.int_ops += at.trips * at.share * 8.0 * (t.m * t.n * t.k) as f64,
        // GPU statements: `--profile` times CPU nests only.
        Stmt::Mma { .. }
        | Stmt::Wgmma(_)
        | Stmt::Barrier
        | Stmt::Async(_)
        | Stmt::WarpReduce(_)
        | Stmt::Prefetch { .. } => {}
    }
}

/// The share of the values of the loops around the guards (`loops`) that
/// pass all of `guards`: every combination of the variables they test
/// tried, where they are loops of `loops` with at most
/// [`MAX_GUARD_POINTS`] combinations and the guards read only them; else 1.
fn guards_share(p: &Program, guards: &[TExprId], loops: &[Range]) -> f64 {
    let mut vars = Vec::new();
    if !guards.iter().all(|&g| index_vars(p, g, &mut vars)) {
        return 1.0;
    }
    vars.sort_unstable();
    vars.dedup();
    // The innermost loop of a variable is the one the guards see.
    let Some(tested) =
        vars.iter().map(|v| loops.iter().rev().find(|r| r.var == *v).copied()).collect::<Option<Vec<_>>>()
    else {
        return 1.0;
    };
    let points = tested.iter().try_fold(1i64, |n, r| n.checked_mul(r.extent.max(0)));
    let Some(points) = points.filter(|&n| (1..=MAX_GUARD_POINTS).contains(&n)) else { return 1.0 };
    let mut env = vec![0i64; vars.iter().max().map_or(0, |&v| v as usize + 1)];
    let mut passed = 0i64;
    for point in 0..points {
        let mut rest = point;
        for r in &tested {
            env[r.var as usize] = r.lo + rest % r.extent;
            rest /= r.extent;
        }
        let mut all = true;
        for &g in guards {
            match eval(p, g, &env) {
                Some(v) => all &= v.b(),
                None => return 1.0,
            }
        }
        passed += i64::from(all);
    }
    passed as f64 / points as f64
}

/// Collects the variables of `e`; false where it reads anything else
/// than variables and constants (memory, scalars).
fn index_vars(p: &Program, e: TExprId, vars: &mut Vec<VarId>) -> bool {
    match p.expr(e) {
        TExpr::Var(v) => {
            vars.push(*v);
            true
        }
        TExpr::Int(_) => true,
        TExpr::Unary(..) | TExpr::Binary(..) | TExpr::Select(..) | TExpr::Cast(_) => {
            p.children(e).into_iter().all(|c| index_vars(p, c, vars))
        }
        _ => false,
    }
}

/// `e` (variables and constants only: [`index_vars`]) at `env`, with the
/// language's semantics; `None` for what it does not evaluate.
fn eval(p: &Program, e: TExprId, env: &[i64]) -> Option<V> {
    let ty = p.ty(e);
    Some(match p.expr(e) {
        TExpr::Int(v) => match ty {
            Ty::Elem(ElemType::Bool) => V::B(*v != 0),
            _ => V::I(*v),
        },
        TExpr::Var(v) => V::I(*env.get(*v as usize)?),
        TExpr::Unary(op, a) => sem::unary(*op, ty, eval(p, *a, env)?),
        TExpr::Binary(op, a, b) => sem::binary(*op, ty, p.ty(*a), eval(p, *a, env)?, eval(p, *b, env)?),
        TExpr::Select(c, a, b) => match eval(p, *c, env)?.b() {
            true => eval(p, *a, env)?,
            false => eval(p, *b, env)?,
        },
        TExpr::Cast(a) => sem::cast(eval(p, *a, env)?, ty),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nests(src: &str) -> Vec<Work> {
        let f = crate::testing::parse_loops("k.loops", src);
        f.body.iter().map(|s| executed(&f, s)).collect()
    }

    #[test]
    fn guarded_lanes_count_only_where_they_pass() {
        // 49 of 4 × 16 lanes pass the guard: a multiply and an add each;
        // the copy executes nothing; a guard the loops cannot reach (z +
        // 9 < 8) nothing either.
        let w = nests(
            "func k [N=49]\n  input X: f32[49]\n  output Y: f32[49]\n  output Z: f32[8]\n\
             \x20 for o in 0..4:\n    for v in 0..16 vectorized:\n      if o * 16 + v < 49:\n        \
             Y[o * 16 + v] = X[o * 16 + v] * 2.0f32 + 1.0f32\n\
             \x20 for o in 0..4:\n    for v in 0..16 vectorized:\n      if o * 16 + v < 49:\n        \
             Y[o * 16 + v] = X[o * 16 + v]\n\
             \x20 for z in 0..8 vectorized:\n    if z + 9 < 8:\n      Z[z] = X[z] + 5.0f32\n",
        );
        assert_eq!(w, vec![Work { flops: 98.0, int_ops: 0.0 }, Work::default(), Work::default()]);
    }

    #[test]
    fn nested_guards_count_the_points_that_pass_both() {
        // The last of four blocks (`p >= 3`, as versioning cuts a tail off a
        // parallel loop) keeps its lane guard: 1 lane of 16 runs, not 49/64
        // of the lanes of a quarter of the blocks.
        let w = nests(
            "func k [N=49]\n  input X: f32[49]\n  output Y: f32[49]\n\
             \x20 for p in 0..4 parallel:\n    if p >= 3:\n      for v in 0..16 vectorized:\n        \
             if p * 16 + v < 49:\n          Y[p * 16 + v] = X[p * 16 + v] + 1.0f32\n",
        );
        assert_eq!(w[0].flops, 1.0);
    }

    #[test]
    fn guards_over_too_many_points_or_reading_memory_count_every_iteration() {
        // 2^17 points: beyond MAX_GUARD_POINTS, so all 2^17 iterations count.
        let w = nests(
            "func k [N=131072]\n  input X: f32[131072]\n  output Y: f32[131072]\n\
             \x20 for o in 0..8192:\n    for v in 0..16 vectorized:\n      if o * 16 + v < 100:\n        \
             Y[o * 16 + v] = X[o * 16 + v] + 1.0f32\n",
        );
        assert_eq!(w[0].flops, 131072.0);
        let w = nests(
            "func k [N=16]\n  input X: f32[16]\n  input I: i32[16]\n  output Y: f32[16]\n\
             \x20 for v in 0..16:\n    if I[v] < 3i32:\n      Y[v] = X[v] + 1.0f32\n",
        );
        assert_eq!(w[0].flops, 16.0);
    }
}
