//! Index arithmetic on loop IR expressions.
//!
//! Attached buffers are indexed relative to their box (`i - lo`) and, with a
//! `cache_read` layout, through `/` and `%` by constants. Written naively,
//! those indices hide that an access is contiguous in the vectorized loop
//! (the code generator then gathers). Here indices are put in linear form
//! over loop variables (anything else is an opaque term, keyed by its
//! structure so that equal terms cancel), differences are simplified, and
//! `t / c`, `t % c` become `X`, `Y` when `t = c·X + Y` with `Y` provably in
//! `[0, c)`, or `X / (c / a)`, `a·(X % (c / a)) + Y` when `t = a·X + Y` with
//! `Y` in `[0, a)` for a divisor `a` of `c` (exact under floor division for
//! any `X`). Loop variables range over `[0, extent)`: every loop starts at 0
//! or later.

use crate::ir::LoopFunc;
use std::collections::HashMap;
use texc_compiler::affine::{affine_of, Affine};
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, Ty};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Var(u32),
    Opaque(String),
}

/// A linear form over loop variables and opaque terms, with an expression
/// for each term (to rebuild it).
struct Lin {
    form: Affine<Key>,
    exprs: HashMap<Key, TExprId>,
}

/// The linear form of `e`; `None` only if its arithmetic overflows.
fn lin(f: &LoopFunc, e: TExprId) -> Option<Lin> {
    let mut exprs = HashMap::new();
    let form = affine_of(&f.p, e, &mut |x| {
        let k = match f.p.expr(x) {
            TExpr::Var(v) => Key::Var(*v),
            _ => Key::Opaque(crate::analysis::structure(&f.p, x)),
        };
        exprs.entry(k.clone()).or_insert(x);
        Some(Affine::atom(k))
    })?;
    Some(Lin { form, exprs })
}

pub(crate) fn int(f: &mut LoopFunc, k: i64) -> TExprId {
    f.p.alloc(TExpr::Int(k), Ty::Index, Default::default())
}

pub(crate) fn bin(f: &mut LoopFunc, op: BinOp, a: TExprId, b: TExprId) -> TExprId {
    f.p.alloc(TExpr::Binary(op, a, b), Ty::Index, Default::default())
}

/// Rebuild a form; `None` if a coefficient no longer fits 64 bits.
fn build(f: &mut LoopFunc, l: &Affine<Key>, exprs: &HashMap<Key, TExprId>) -> Option<TExprId> {
    let mut acc: Option<TExprId> = None;
    for (k, coef) in &l.terms {
        let e = exprs[k];
        let term = if *coef == 1 {
            e
        } else {
            let c = int(f, i64::try_from(*coef).ok()?);
            bin(f, BinOp::Mul, e, c)
        };
        acc = Some(match acc {
            Some(a) => bin(f, BinOp::Add, a, term),
            None => term,
        });
    }
    let c = i64::try_from(l.c).ok()?;
    Some(match acc {
        None => int(f, c),
        Some(a) if c == 0 => a,
        Some(a) => {
            let k = int(f, c);
            bin(f, BinOp::Add, a, k)
        }
    })
}

/// `a - b`, simplified.
pub fn sub(f: &mut LoopFunc, a: TExprId, b: TExprId) -> TExprId {
    let simplified = (|| {
        let (x, y) = (lin(f, a)?, lin(f, b)?);
        // Equal keys are equal expressions; keep the first operand's (as written).
        let mut exprs = y.exprs;
        exprs.extend(x.exprs);
        let d = x.form.add(&y.form, -1)?;
        build(f, &d, &exprs)
    })();
    simplified.unwrap_or_else(|| bin(f, BinOp::Sub, a, b))
}

/// `e`, simplified.
pub fn simplify(f: &mut LoopFunc, e: TExprId) -> TExprId {
    lin(f, e).and_then(|l| build(f, &l.form, &l.exprs)).unwrap_or(e)
}

/// `(t / c, t % c)` for `t ≥ 0` and `c ≥ 1`, free of `/` and `%` by `c`
/// where `t` splits into `c·X + Y` with `Y` in `[0, c)`, or into `a·X + Y`
/// for a divisor `a` of `c` (as [`eliminate_div_mod`] finds it).
pub fn div_mod(f: &mut LoopFunc, t: TExprId, c: i64) -> (TExprId, TExprId) {
    exact_div_mod(f, t, c).unwrap_or_else(|| {
        let k = int(f, c);
        (bin(f, BinOp::FloorDiv, t, k), bin(f, BinOp::FloorMod, t, k))
    })
}

/// `e` with each floor division or remainder by a constant `c` of a linear
/// term `t = c·X + Y` whose `Y` provably lies in `[0, c)` replaced by `X`
/// or `Y` (inner ones first), and of `t = a·X + Y` with `Y` in `[0, a)`
/// for a divisor `a` of `c` by `X / (c / a)` or `a·(X % (c / a)) + Y`;
/// everything else as it was. The terms of `Y`
/// may be divisions and remainders of loop variables themselves, bounded
/// by their intervals: a grouped convolution's input channel `k / 24 · 24
/// + c`, with `k = t / 14 / 4 · 24 + t / 14 % 4 · 6 + r` once its filters
/// are split into groups and rows of 6 and the loops fused, is `t / 14 / 4
/// · 24 + c`, the same for the block's 6 rows, which then share each load
/// of the input where each row loaded its own (AVX2, rows of 14, 336
/// channels in groups of 24 at 14 × 14: 1.32 → 0.32 ms with its padding
/// pass).
pub fn eliminate_div_mod(f: &mut LoopFunc, e: TExprId) -> TExprId {
    let children = f.p.children(e);
    let new: Vec<TExprId> = children.iter().map(|&c| eliminate_div_mod(f, c)).collect();
    let e = if new == children { e } else { crate::normalize::with_children(&mut f.p, e, new) };
    let TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), t, c) = *f.p.expr(e) else { return e };
    let (&TExpr::Int(c), Ty::Index) = (f.p.expr(c), f.p.ty(e)) else { return e };
    match exact_div_mod(f, t, c) {
        Some((q, _)) if op == BinOp::FloorDiv => q,
        Some((_, r)) => r,
        None => e,
    }
}

/// `(X, Y)` with `t = c·X + Y` and `Y` in `[0, c)`, where `t` is linear in
/// loop variables and in terms that intervals bound.
///
/// Failing that, the same by a divisor `a` of `c` (`t = a·X + Y`, `Y` in
/// `[0, a)`): `t / c = X / (c / a)` and `t % c = a·(X % (c / a)) + Y`,
/// with `X / (c / a)` simplified in turn. A vector of 8 filters in groups
/// of 24 (`(8·o + v) / 24`, `v` its lanes) reads one group, `o / 3`, the
/// same for every lane. The divisors tried are [`divisor_candidates`].
fn exact_div_mod(f: &mut LoopFunc, t: TExprId, c: i64) -> Option<(TExprId, TExprId)> {
    if c < 1 {
        return None;
    }
    let l = lin(f, t)?;
    let c128 = c as i128;
    for a in divisor_candidates(c128, l.form.terms.values().copied()) {
        let (x, y) = split_terms(&l.form, a);
        let Some((lo, hi)) = bounds(f, &y, &l.exprs) else { continue };
        if lo < 0 || hi >= a {
            continue;
        }
        let (Some(xe), Some(ye)) = (build(f, &x, &l.exprs), build(f, &y, &l.exprs)) else { continue };
        if a == c128 {
            return Some((xe, ye));
        }
        let m = i64::try_from(c128 / a).ok()?;
        let (q, xr) = div_mod(f, xe, m);
        let a = int(f, i64::try_from(a).ok()?);
        let scaled = bin(f, BinOp::Mul, xr, a);
        let r = bin(f, BinOp::Add, scaled, ye);
        return Some((q, simplify(f, r)));
    }
    None
}

/// The divisors of `c` by which a linear form with coefficients `coefs`
/// may split as `a·X + Y`, largest first: `c` itself, then the greatest
/// common divisor of `c` and the largest coefficients, one more at a time
/// (the outer terms share the factor, the inner ones stay below it: `6·i
/// + 10·j + k` by 30 splits by 2). None is 1 but `c = 1` itself.
pub(crate) fn divisor_candidates(c: i128, coefs: impl Iterator<Item = i128>) -> Vec<i128> {
    let mut by_size: Vec<i128> = coefs.map(i128::abs).collect();
    by_size.sort_unstable_by(|a, b| b.cmp(a));
    let mut candidates = vec![c];
    let mut g = c;
    for k in by_size {
        g = crate::independence::gcd(g, k);
        candidates.push(g);
    }
    candidates.dedup();
    candidates.retain(|&a| a > 1 || a == c);
    candidates
}

/// `l` as `c·X + Y`: `X` the terms `c` divides (over `c`) and the
/// constant's quotient, `Y` the other terms and the constant's remainder.
fn split_terms(l: &Affine<Key>, c: i128) -> (Affine<Key>, Affine<Key>) {
    let (mut x, mut y) = (Affine::<Key>::default(), Affine::<Key>::default());
    for (k, coef) in &l.terms {
        if coef % c == 0 {
            x.terms.insert(k.clone(), coef / c);
        } else {
            y.terms.insert(k.clone(), *coef);
        }
    }
    x.c = l.c.div_euclid(c);
    y.c = l.c.rem_euclid(c);
    (x, y)
}

/// The range of a linear form whose terms are loop variables, each over
/// `[0, extent)`, or expressions of them that intervals bound.
fn bounds(f: &LoopFunc, l: &Affine<Key>, exprs: &HashMap<Key, TExprId>) -> Option<(i128, i128)> {
    let var = |v: texc_compiler::tir::VarId| crate::interval::range(0, (f.vars[v as usize].extent - 1).max(0) as i128);
    let mut r = (l.c, l.c);
    for (k, coef) in &l.terms {
        let iv = crate::interval::of(&f.p, exprs[k], &var);
        let (lo, hi) = (coef.checked_mul(iv.lo?)?, coef.checked_mul(iv.hi?)?);
        r.0 = r.0.checked_add(lo.min(hi))?;
        r.1 = r.1.checked_add(lo.max(hi))?;
    }
    Some(r)
}

/// An index simplified; a floor division or modulo of a non-negative
/// linear term by a constant splits as [`div_mod`] does.
fn simplify_index(f: &mut LoopFunc, e: TExprId) -> TExprId {
    if let TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), t, c) = f.p.expr(e).clone() {
        if let TExpr::Int(c) = *f.p.expr(c) {
            let non_negative = lin(f, t).and_then(|l| bounds(f, &l.form, &l.exprs)).is_some_and(|(lo, _)| lo >= 0);
            if c >= 1 && non_negative {
                let (q, r) = div_mod(f, t, c);
                return if op == BinOp::FloorDiv { q } else { r };
            }
        }
    }
    simplify(f, e)
}

/// Every index of every load and store of `f`, simplified (for nests that
/// did not come from lowering: a `.loops` file edited by hand).
pub fn simplify_indices(f: &mut LoopFunc) {
    fn stmts(f: &mut LoopFunc, body: &mut [crate::ir::Stmt]) {
        for s in body {
            match s {
                crate::ir::Stmt::Barrier | crate::ir::Stmt::Async(_) | crate::ir::Stmt::WarpReduce(_) => {}
                crate::ir::Stmt::Prefetch { offset, .. } => {
                    loads(f, *offset);
                    *offset = simplify_index(f, *offset);
                }
                crate::ir::Stmt::Mma { c, a, b, .. } => {
                    for t in [c, a, b] {
                        for i in t.origin.iter_mut() {
                            loads(f, *i);
                            *i = simplify_index(f, *i);
                        }
                    }
                }
                crate::ir::Stmt::TileDot(d) => {
                    for i in d.origins_mut() {
                        loads(f, *i);
                        *i = simplify_index(f, *i);
                    }
                }
                crate::ir::Stmt::Wgmma(w) => {
                    for i in w.origins_mut() {
                        loads(f, *i);
                        *i = simplify_index(f, *i);
                    }
                }
                crate::ir::Stmt::For { body, .. } | crate::ir::Stmt::Alloc { body, .. } => stmts(f, body),
                crate::ir::Stmt::If { cond, then } => {
                    loads(f, *cond);
                    stmts(f, then)
                }
                crate::ir::Stmt::Store { indices, value, .. } => {
                    for i in indices.iter_mut() {
                        loads(f, *i);
                        *i = simplify_index(f, *i);
                    }
                    loads(f, *value);
                }
            }
        }
    }
    fn loads(f: &mut LoopFunc, e: TExprId) {
        for c in f.p.children(e) {
            loads(f, c);
        }
        if let TExpr::Load(t, idx) = f.p.expr(e).clone() {
            let idx = idx.into_iter().map(|i| simplify_index(f, i)).collect();
            f.p.exprs[e.0 as usize] = TExpr::Load(t, idx);
        }
    }
    let mut body = std::mem::take(&mut f.body);
    stmts(f, &mut body);
    f.body = body;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval;
    use texc_compiler::tir::{Program, VarId};

    fn func(extents: &[i64]) -> LoopFunc {
        let mut f = LoopFunc {
            p: Program::default(),
            vars: Vec::new(),
            body: Vec::new(),
            shared: Default::default(),
            registers: Default::default(),
            rolled: Default::default(),
        };
        for (i, &e) in extents.iter().enumerate() {
            f.new_var(format!("v{i}"), e);
        }
        f
    }

    fn var(f: &mut LoopFunc, v: VarId) -> TExprId {
        f.p.alloc(TExpr::Var(v), Ty::Index, Default::default())
    }

    /// `e`'s value with each variable at `at[v]` (intervals of points).
    fn value(f: &LoopFunc, e: TExprId, at: &[i64]) -> i128 {
        let iv = interval::of(&f.p, e, &|v| interval::exact(at[v as usize] as i128));
        assert_eq!(iv.lo, iv.hi, "a point");
        iv.lo.expect("known")
    }

    /// The divisor of division `e`.
    fn divisor_of(f: &LoopFunc, e: TExprId) -> TExprId {
        match f.p.expr(e) {
            TExpr::Binary(BinOp::FloorDiv, _, d) => *d,
            other => panic!("not a division: {other:?}"),
        }
    }

    /// How many divisions and remainders by `c` `e` holds.
    fn by(f: &LoopFunc, e: TExprId, c: i64) -> usize {
        let here = match f.p.expr(e) {
            TExpr::Binary(BinOp::FloorDiv | BinOp::FloorMod, _, d) => f.p.expr(*d) == &TExpr::Int(c),
            _ => false,
        };
        here as usize + f.p.children(e).into_iter().map(|k| by(f, k, c)).sum::<usize>()
    }

    /// Divisions eliminated keep every value, and only exact ones go: a
    /// grouped convolution's `((t / 14 / 4) · 24 + (t / 14 % 4) · 6 + r) / 24`
    /// over `t < 112`, `r < 6` is `t / 14 / 4`; its remainder
    /// `(t / 14 % 4) · 6 + r`; a sum that reaches past the divisor keeps its
    /// division, and so does one with a term intervals do not bound.
    #[test]
    fn exact_divisions_go_and_values_stay() {
        let mut f = func(&[112, 6, 8]);
        let (t, r, x) = (var(&mut f, 0), var(&mut f, 1), var(&mut f, 2));
        let k = |f: &mut LoopFunc, c: i64| int(f, c);
        let (c14, c4, c6, c24) = (k(&mut f, 14), k(&mut f, 4), k(&mut f, 6), k(&mut f, 24));
        let rows = bin(&mut f, BinOp::FloorDiv, t, c14);
        let group = bin(&mut f, BinOp::FloorDiv, rows, c4);
        let block = bin(&mut f, BinOp::FloorMod, rows, c4);
        let g24 = bin(&mut f, BinOp::Mul, group, c24);
        let b6 = bin(&mut f, BinOp::Mul, block, c6);
        let within = bin(&mut f, BinOp::Add, b6, r);
        let filter = bin(&mut f, BinOp::Add, g24, within);
        let quotient = bin(&mut f, BinOp::FloorDiv, filter, c24);
        let remainder = bin(&mut f, BinOp::FloorMod, filter, c24);
        // x + r reaches 12: not below 6.
        let past = bin(&mut f, BinOp::Add, x, r);
        let inexact = bin(&mut f, BinOp::FloorDiv, past, c6);
        let load = f.p.alloc(TExpr::Load(texc_compiler::tir::TensorId(0), vec![x]), Ty::Index, Default::default());
        let opaque_sum = bin(&mut f, BinOp::Add, g24, load);
        let opaque = bin(&mut f, BinOp::FloorDiv, opaque_sum, c24);
        for (e, exact) in [(quotient, true), (remainder, true), (inexact, false), (opaque, false)] {
            let out = eliminate_div_mod(&mut f, e);
            if exact {
                // The division or remainder by 24 went; the fused loop's stay.
                assert_eq!((by(&f, e, 24), by(&f, out, 24)), (1, 0), "{:?}", f.p.expr(out));
                assert!(by(&f, out, 14) >= 1, "the fused loop's");
            } else {
                assert_eq!(out, e, "left as it was");
            }
            if e == opaque {
                continue;
            }
            for at in (0..112).flat_map(|t| (0..6).flat_map(move |r| (0..8).map(move |x| [t, r, x]))) {
                assert_eq!(value(&f, out, &at), value(&f, e, &at), "at {at:?}");
            }
        }
        assert_eq!(eliminate_div_mod(&mut f, quotient), group, "the group, as the fused loop gives it");
    }

    /// By a divisor of the constant: a vector of 8 filters in groups of 24,
    /// `(8·o + v) / 24` over lanes `v < 8`, is `o / 3` (no lane in it) and
    /// its remainder `8·(o % 3) + v`; rows of 7 in an image row of 14,
    /// `(7·b + r) / 14`, are `b / 2`. Where the inner terms reach the
    /// outer term's factor (`v < 9`), the division stays. Every value is
    /// kept.
    #[test]
    fn divisions_by_a_multiple_of_the_outer_step_divide_the_outer_term() {
        let mut f = func(&[9, 8, 9, 7]);
        let (o, v, w, r) = (var(&mut f, 0), var(&mut f, 1), var(&mut f, 2), var(&mut f, 3));
        let (c8, c24, c7, c14) = (int(&mut f, 8), int(&mut f, 24), int(&mut f, 7), int(&mut f, 14));
        let o8 = bin(&mut f, BinOp::Mul, o, c8);
        let lane = bin(&mut f, BinOp::Add, o8, v);
        let group = bin(&mut f, BinOp::FloorDiv, lane, c24);
        let within = bin(&mut f, BinOp::FloorMod, lane, c24);
        let o7 = bin(&mut f, BinOp::Mul, o, c7);
        let row = bin(&mut f, BinOp::Add, o7, r);
        let image_row = bin(&mut f, BinOp::FloorDiv, row, c14);
        let column = bin(&mut f, BinOp::FloorMod, row, c14);
        let past = bin(&mut f, BinOp::Add, o8, w);
        let past_group = bin(&mut f, BinOp::FloorDiv, past, c24);
        // Below zero: `(8·o + v - 16) / 24` is `(o - 2) / 3`, floored.
        let c16 = int(&mut f, 16);
        let below = bin(&mut f, BinOp::Sub, lane, c16);
        let (below_group, below_within) =
            (bin(&mut f, BinOp::FloorDiv, below, c24), bin(&mut f, BinOp::FloorMod, below, c24));
        // A second level: `(24·w + 8·(o % 3) + v) / 48` is `w / 2`.
        let (c3, c48) = (int(&mut f, 3), int(&mut f, 48));
        let w24 = bin(&mut f, BinOp::Mul, w, c24);
        let o3 = bin(&mut f, BinOp::FloorMod, o, c3);
        let o3_8 = bin(&mut f, BinOp::Mul, o3, c8);
        let inner = bin(&mut f, BinOp::Add, o3_8, v);
        let nested = bin(&mut f, BinOp::Add, w24, inner);
        let pair = bin(&mut f, BinOp::FloorDiv, nested, c48);
        let cases = [
            (group, 24, 3),
            (within, 24, 3),
            (image_row, 14, 2),
            (column, 14, 2),
            (below_group, 24, 3),
            (below_within, 24, 3),
            (pair, 48, 2),
        ];
        for (e, c, divisor) in cases {
            let out = eliminate_div_mod(&mut f, e);
            assert_eq!((by(&f, out, c), by(&f, out, divisor)), (0, 1), "{:?}", f.p.expr(out));
            let points = (0..9)
                .flat_map(|o| (0..8).flat_map(move |v| (0..9).flat_map(move |w| (0..7).map(move |r| [o, v, w, r]))));
            for at in points {
                assert_eq!(value(&f, out, &at), value(&f, e, &at), "at {at:?}");
            }
        }
        let lanes_gone = eliminate_div_mod(&mut f, group);
        let at_lane = |f: &LoopFunc, lane: i64| value(f, lanes_gone, &[5, lane, 0, 0]);
        assert!((0..8).all(|lane| at_lane(&f, lane) == 1), "the same group for every lane");
        assert_eq!(f.p.expr(lanes_gone), &TExpr::Binary(BinOp::FloorDiv, o, divisor_of(&f, lanes_gone)), "o / 3");
        assert_eq!(eliminate_div_mod(&mut f, past_group), past_group, "w reaches 8: left as it was");
    }
}
