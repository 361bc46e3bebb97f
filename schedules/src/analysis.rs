//! Loop-IR analyses that every backend reads, so that none re-derives them.
//!
//! Inside a vectorized loop over `var`, each lane is one iteration:
//! - [`access`] classifies a load or store by how its flat offset moves with
//!   `var`: the same element in every lane ([`Access::Uniform`]: one scalar
//!   load, broadcast), consecutive elements ([`Access::Contiguous`]: one
//!   vector load/store), a constant stride ([`Access::Strided`]), or anything
//!   else ([`Access::Gather`]). How a backend realizes each is its own choice.
//! - [`lane_uniform`] tells whether a condition has the same value in every
//!   lane and can be evaluated once, as a branch around vector code, instead
//!   of as a per-lane mask.
//!
//! Both rest on [`coefficient`], the constant coefficient of `var` in an
//! expression that is affine in it (sub-terms that do not involve `var` are
//! constants of the lane, whatever they are).
//! - [`flat_coefficient`] reads an index list as one flat offset, so that the
//!   div/mod pairs of fused loops (`t[f / W, f % W]`) are the offset `f`.
//! - [`lane_offsets`] refines a gather: when every lane's offset from lane 0
//!   is a compile-time constant (`Y[(16·wo + wv) / 4]`: lanes 0–3 read one
//!   element, lanes 4–7 the next), a backend can load the span once and
//!   shuffle instead of gathering. Floor division and modulo by a constant
//!   `c` keep offsets constant only when the lane-independent part of the
//!   dividend is known modulo `c`, so the walk tracks that residue.

use crate::ir::LoopFunc;
use std::collections::BTreeMap;
use texc_compiler::affine::{affine_of, Affine};
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{Program, TExpr, TExprId, TensorId, VarId};

/// How a vector access moves with the vectorized variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The same element in every lane.
    Uniform,
    /// Lane `l` accesses element `base + l`.
    Contiguous,
    /// Lane `l` accesses element `base + k·l` for this constant `k` (not 0 or 1).
    Strided(i64),
    /// Anything else: one address per lane.
    Gather,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Atom {
    Lane,
    /// A sub-term that does not involve the vectorized variable.
    Fixed(TExprId),
}

/// Whether `e` mentions loop variable `var`.
pub fn involves(p: &Program, e: TExprId, var: VarId) -> bool {
    p.mentions(e, var)
}

/// Whether `a` and `b` compute the same value by the same expression (the
/// same nodes, or equal ones built apart: a schedule's substitution copies
/// an index once per load).
pub fn same_value(p: &Program, a: TExprId, b: TExprId) -> bool {
    if a == b {
        return true;
    }
    let (ca, cb) = (p.children(a), p.children(b));
    let children = ca.len() == cb.len() && ca.iter().zip(&cb).all(|(&x, &y)| same_value(p, x, y));
    if p.ty(a) != p.ty(b) || !children {
        return false;
    }
    match (p.expr(a), p.expr(b)) {
        (TExpr::Binary(x, ..), TExpr::Binary(y, ..)) => x == y,
        (TExpr::Unary(x, _), TExpr::Unary(y, _)) => x == y,
        (TExpr::Load(x, _), TExpr::Load(y, _)) => x == y,
        (TExpr::Cast(_), TExpr::Cast(_)) | (TExpr::Select(..), TExpr::Select(..)) => true,
        (x, y) if ca.is_empty() => x == y,
        _ => false,
    }
}

/// The coefficient of `var` in `e`, if `e` is affine in `var`.
pub fn coefficient(p: &Program, e: TExprId, var: VarId) -> Option<i64> {
    let form = affine_of(p, e, &mut |x| match p.expr(x) {
        TExpr::Var(v) if *v == var => Some(Affine::atom(Atom::Lane)),
        _ if !involves(p, x, var) => Some(Affine::atom(Atom::Fixed(x))),
        _ => None,
    })?;
    i64::try_from(form.coeff(&Atom::Lane)).ok()
}

/// Whether evaluating `e` reads a tensor.
pub fn reads_memory(p: &Program, e: TExprId) -> bool {
    matches!(p.expr(e), TExpr::Load(..)) || p.children(e).into_iter().any(|c| reads_memory(p, c))
}

/// Whether `e` has the same value in every lane of a loop vectorized over
/// `var` and reads no memory (so it may be evaluated once, outside any mask).
pub fn lane_uniform(f: &LoopFunc, e: TExprId, var: VarId) -> bool {
    !involves(&f.p, e, var) && !reads_memory(&f.p, e)
}

/// An atom of a flat offset: a variable, or a non-affine sub-term keyed by
/// its structure (so that the `e` of `e / c` and of `e % c` match however
/// often it was written).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Term {
    Var(VarId),
    Opaque(String),
}

/// A key of `e`'s structure: equal for equal expressions however often
/// they were written (index simplification and [`flat_coefficient`] match
/// sub-terms by it).
pub(crate) fn structure(p: &Program, e: TExprId) -> String {
    let mut out = String::new();
    write_structure(p, e, &mut out);
    out
}

/// [`structure`] written into one buffer: `head(child,child,…)`, in time
/// linear in the tree (not one string per node joined at every level).
fn write_structure(p: &Program, e: TExprId, out: &mut String) {
    use std::fmt::Write;
    // Writing into a String cannot fail.
    let _ = match p.expr(e) {
        TExpr::Int(k) => write!(out, "{k}"),
        TExpr::Var(v) => write!(out, "v{v}"),
        TExpr::Scalar(s) => write!(out, "s{s}"),
        TExpr::Load(t, _) => write!(out, "L{}", t.0),
        TExpr::Unary(op, _) => write!(out, "{op:?}"),
        TExpr::Binary(op, ..) => write!(out, "{op:?}"),
        TExpr::Math(b, _) => write!(out, "{b:?}"),
        // By what it computes, never by its children's ids (which equal trees do not share).
        TExpr::Cast(_) => write!(out, "Cast:{}", p.ty(e)),
        TExpr::Select(..) => write!(out, "Select"),
        TExpr::Float(x) => write!(out, "F{x:?}:{}", p.ty(e)),
        TExpr::Intrinsic(i, _) => write!(out, "{i:?}"),
        other => write!(out, "{other:?}"),
    };
    out.push('(');
    for (i, c) in p.children(e).into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_structure(p, c, out);
    }
    out.push(')');
}

/// `e / c` (`Some((e, c, true))`) or `e % c` (`Some((e, c, false))`) for a
/// positive constant `c`, floor semantics.
fn div_or_mod(p: &Program, e: TExprId) -> Option<(TExprId, i64, bool)> {
    let TExpr::Binary(op, a, b) = p.expr(e) else { return None };
    let TExpr::Int(c) = p.expr(*b) else { return None };
    let div = match op {
        BinOp::FloorDiv | BinOp::UDiv => true,
        BinOp::FloorMod | BinOp::URem => false,
        _ => return None,
    };
    (*c > 0).then_some((*a, *c, div))
}

/// The linear form of `e` over variables and opaque sub-terms; `exprs`
/// remembers an expression of each opaque term.
fn term_form(p: &Program, e: TExprId, exprs: &mut BTreeMap<Term, TExprId>) -> Option<Affine<Term>> {
    affine_of(p, e, &mut |x| {
        let t = match p.expr(x) {
            TExpr::Var(v) => Term::Var(*v),
            _ => Term::Opaque(structure(p, x)),
        };
        exprs.entry(t.clone()).or_insert(x);
        Some(Affine::atom(t))
    })
}

/// The flat offset of `t[idx]` as a linear form, with every pair
/// `α·(e / c) + β·(e % c)` where `α = c·β` replaced by `β·e`: `⌊e/c⌋·c +
/// e mod c = e` for every integer `e`. A fused loop's `t[f / W, f % W]`
/// over a dimension of `W` is then `t`'s flat `f`, which moves with the
/// lanes although neither index is affine.
fn flat_form(p: &Program, t: TensorId, idx: &[TExprId]) -> Option<(Affine<Term>, BTreeMap<Term, TExprId>)> {
    let shape = &p.tensor(t).shape;
    let mut exprs = BTreeMap::new();
    let mut form = Affine::constant(0);
    let mut stride = 1i128;
    for d in (0..idx.len()).rev() {
        form = form.add(&term_form(p, idx[d], &mut exprs)?.scale(stride)?, 1)?;
        stride = stride.checked_mul(i128::from(shape[d]))?;
    }
    'merge: loop {
        for (div_term, &alpha) in &form.terms {
            let Term::Opaque(_) = div_term else { continue };
            let Some((e, c, true)) = div_or_mod(p, exprs[div_term]) else { continue };
            if alpha % i128::from(c) != 0 {
                continue;
            }
            let beta = alpha / i128::from(c);
            let key = structure(p, e);
            let matching = form.terms.iter().find(|(m, &b)| {
                b == beta
                    && matches!(div_or_mod(p, exprs[*m]), Some((e2, c2, false)) if c2 == c && structure(p, e2) == key)
            });
            let Some((mod_term, _)) = matching else { continue };
            let (div_term, mod_term) = (div_term.clone(), mod_term.clone());
            form.terms.remove(&div_term);
            form.terms.remove(&mod_term);
            form = form.add(&term_form(p, e, &mut exprs)?.scale(beta)?, 1)?;
            continue 'merge;
        }
        return Some((form, exprs));
    }
}

/// The coefficient of `var` in the flat offset of `t[idx]` (see [`flat_form`]),
/// if that offset is affine in `var`.
pub fn flat_coefficient(p: &Program, t: TensorId, idx: &[TExprId], var: VarId) -> Option<i64> {
    let (form, exprs) = flat_form(p, t, idx)?;
    let opaque_moves = form.terms.keys().any(|k| matches!(k, Term::Opaque(_)) && involves(p, exprs[k], var));
    if opaque_moves {
        return None;
    }
    i64::try_from(form.coeff(&Term::Var(var))).ok()
}

/// Every read in `e`, outermost first.
pub fn loads_in(p: &Program, e: TExprId, out: &mut Vec<TExprId>) {
    if let TExpr::Load(..) = p.expr(e) {
        out.push(e);
    }
    for c in p.children(e) {
        loads_in(p, c, out);
    }
}

/// Whether variable `v` occurs in `e` other than inside the indices of a read.
pub fn outside_indices(p: &Program, e: TExprId, v: VarId) -> bool {
    match p.expr(e) {
        TExpr::Var(x) => *x == v,
        TExpr::Load(..) => false,
        _ => p.children(e).into_iter().any(|c| outside_indices(p, c, v)),
    }
}

/// Whether variables `(a, b)` of `value`, `b` running over `b_extent`, walk
/// every read in `loads` as one dense variable `a·b_extent + b` would: each
/// flat offset moves with `a` as with `b_extent` steps of `b`, and neither
/// variable occurs outside read indices. Fusing them into one loop (or one
/// reduction variable) then keeps every access as regular as it was.
pub fn dense_pair(p: &Program, value: TExprId, loads: &[TExprId], (a, b): (VarId, VarId), b_extent: i64) -> bool {
    let indices_only = !outside_indices(p, value, a) && !outside_indices(p, value, b);
    indices_only
        && loads.iter().all(|&l| {
            let TExpr::Load(t, idx) = p.expr(l) else { return false };
            let coeff = |v| flat_coefficient(p, *t, idx, v);
            matches!((coeff(a), coeff(b)), (Some(ca), Some(cb)) if cb.checked_mul(b_extent) == Some(ca))
        })
}

/// The access pattern of `t[idx]` in a loop vectorized over `var`.
pub fn access(f: &LoopFunc, t: TensorId, idx: &[TExprId], var: VarId) -> Access {
    match flat_coefficient(&f.p, t, idx, var) {
        Some(0) => Access::Uniform,
        Some(1) => Access::Contiguous,
        Some(k) => Access::Strided(k),
        None => Access::Gather,
    }
}

/// The lane-independent part `F` of an index value, known only modulo `g`:
/// `F ≡ r (mod g)`; `g == 0` means `F == r` exactly.
#[derive(Clone, Copy)]
struct Residue {
    g: i64,
    r: i64,
}

impl Residue {
    const UNKNOWN: Residue = Residue { g: 1, r: 0 };

    fn normalized(g: i64, r: i64) -> Residue {
        let g = g.abs();
        Residue { g, r: if g == 0 { r } else { r.rem_euclid(g) } }
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

/// An index value in lane `l`: `F + table[l]`, with `F` as [`Residue`] says.
struct LaneValue {
    table: Vec<i64>,
    fixed: Residue,
}

/// `e` for lanes `var = base + l`, `l < lanes`, or `None` when some lane's
/// value is not a constant offset from the others' common part.
fn lane_value(p: &Program, e: TExprId, var: VarId, base: i64, lanes: usize) -> Option<LaneValue> {
    let flat = |fixed| Some(LaneValue { table: vec![0; lanes], fixed });
    match p.expr(e) {
        TExpr::Int(c) => flat(Residue { g: 0, r: *c }),
        TExpr::Var(v) if *v == var => Some(LaneValue {
            table: (0..lanes as i64).map(|l| base.checked_add(l)).collect::<Option<_>>()?,
            fixed: Residue { g: 0, r: 0 },
        }),
        // Sums and products keep what is known of their terms' divisibility
        // (`16·wo` is a multiple of 4), lane-independent or not.
        TExpr::Binary(..) => match lane_value_binary(p, e, var, base, lanes) {
            None if !involves(p, e, var) => flat(Residue::UNKNOWN),
            v => v,
        },
        _ if !involves(p, e, var) => flat(Residue::UNKNOWN),
        _ => None,
    }
}

fn lane_value_binary(p: &Program, e: TExprId, var: VarId, base: i64, lanes: usize) -> Option<LaneValue> {
    let TExpr::Binary(op, a, b) = p.expr(e) else { return None };
    let (a, b) = (lane_value(p, *a, var, base, lanes)?, lane_value(p, *b, var, base, lanes)?);
    let zip = |f: fn(i64, i64) -> Option<i64>| -> Option<Vec<i64>> {
        a.table.iter().zip(&b.table).map(|(&x, &y)| f(x, y)).collect()
    };
    let exact = |v: &LaneValue| (v.fixed.g == 0 && v.table.iter().all(|&t| t == 0)).then_some(v.fixed.r);
    match op {
        BinOp::Add | BinOp::Sub => {
            let sign = if *op == BinOp::Add { 1 } else { -1 };
            let table = if sign == 1 { zip(i64::checked_add)? } else { zip(i64::checked_sub)? };
            let r = a.fixed.r.checked_add(b.fixed.r.checked_mul(sign)?)?;
            Some(LaneValue { table, fixed: Residue::normalized(gcd(a.fixed.g, b.fixed.g), r) })
        }
        BinOp::Mul => {
            let (k, v) = match (exact(&a), exact(&b)) {
                (Some(k), _) => (k, &b),
                (_, Some(k)) => (k, &a),
                // A product of two lane-independent unknowns: nothing is known of its residue.
                _ if a.table.iter().chain(&b.table).all(|&t| t == 0) => {
                    return Some(LaneValue { table: vec![0; lanes], fixed: Residue::UNKNOWN })
                }
                _ => return None,
            };
            let table = v.table.iter().map(|&t| t.checked_mul(k)).collect::<Option<_>>()?;
            Some(LaneValue { table, fixed: Residue::normalized(v.fixed.g.checked_mul(k)?, v.fixed.r.checked_mul(k)?) })
        }
        // Floor division and modulo by a positive constant (UDiv/URem: legalization
        // proved the dividend non-negative, where they agree with floor).
        BinOp::FloorDiv | BinOp::FloorMod | BinOp::UDiv | BinOp::URem => {
            let c = exact(&b).filter(|&c| c > 0)?;
            let div = matches!(op, BinOp::FloorDiv | BinOp::UDiv);
            // F = r + g·k with c | g: (F + t) / c = g·k / c + (r + t) / c.
            if a.fixed.g % c != 0 {
                return within_one_period(&a, c, div);
            }
            let shifted = |t: i64| a.fixed.r.checked_add(t);
            let table = a
                .table
                .iter()
                .map(|&t| shifted(t).map(|x| if div { x.div_euclid(c) } else { x.rem_euclid(c) }))
                .collect::<Option<_>>()?;
            let fixed = if div { Residue::normalized(a.fixed.g / c, 0) } else { Residue { g: 0, r: 0 } };
            Some(LaneValue { table, fixed })
        }
        _ => None,
    }
}

/// `(F + t) / c` or `(F + t) % c` when `F = r + g·k` with `g | c` and every
/// lane's `r + t` lies in `0..g` (16 lanes of `p % 112` with `p = 16·po + pv`):
/// `g·k mod c` is a multiple of `g` at most `c − g`, so no lane crosses a
/// multiple of `c`: the quotient is the same in every lane and the remainder
/// moves with `t`. `None` otherwise.
fn within_one_period(a: &LaneValue, c: i64, div: bool) -> Option<LaneValue> {
    let Residue { g, r } = a.fixed;
    if g == 0 || c % g != 0 || !a.table.iter().all(|&t| r.checked_add(t).is_some_and(|x| (0..g).contains(&x))) {
        return None;
    }
    Some(if div {
        LaneValue { table: vec![0; a.table.len()], fixed: Residue::UNKNOWN }
    } else {
        LaneValue { table: a.table.iter().map(|&t| r + t).collect(), fixed: Residue::normalized(g, 0) }
    })
}

/// How far index expression `e` moves from lane 0's value in each lane
/// `var = base + l`, `l < lanes`, when every move is a compile-time
/// constant (`x.o * 8 + x.v - 1`: `0, 1, .., 7`); `None` otherwise.
pub fn lane_deltas(p: &Program, e: TExprId, var: VarId, base: i64, lanes: usize) -> Option<Vec<i64>> {
    let v = lane_value(p, e, var, base, lanes)?;
    v.table.iter().map(|&t| t.checked_sub(v.table[0])).collect()
}

/// The flat offset of each lane of `t[idx]` from lane 0's, for lanes
/// `var = base + l`, `l < lanes`, when these are compile-time constants
/// (see the module header); `None` otherwise.
pub fn lane_offsets(
    f: &LoopFunc,
    t: TensorId,
    idx: &[TExprId],
    var: VarId,
    base: i64,
    lanes: usize,
) -> Option<Vec<i64>> {
    let shape = &f.p.tensor(t).shape;
    let mut offsets = vec![0i64; lanes];
    let mut stride = 1i64;
    for d in (0..idx.len()).rev() {
        let v = lane_value(&f.p, idx[d], var, base, lanes)?;
        for (o, &x) in offsets.iter_mut().zip(&v.table) {
            *o = o.checked_add(x.checked_sub(v.table[0])?.checked_mul(stride)?)?;
        }
        stride = stride.checked_mul(shape[d])?;
    }
    Some(offsets)
}

/// The alignment of a contiguous vector access of `lanes` elements to `t`
/// at `idx` whose lane 0 is at `var = base`, on a GPU (device buffers and
/// shared arrays are 16-byte aligned; a vector access wider than its
/// alignment is split into element accesses): the vector's size, at most
/// 16 bytes (the widest access), when its offset provably allows it; else
/// an element's.
pub fn vector_alignment(p: &Program, t: TensorId, idx: &[TExprId], var: VarId, base: i64, lanes: u32) -> u32 {
    let d = p.tensor(t);
    let elem = d.elem.size() as u32;
    let bytes = (elem * lanes).min(16);
    if !lanes.is_power_of_two() || d.elem == texc_compiler::types::ElemType::Bool || bytes <= elem {
        return elem;
    }
    // Aligned to `bytes`: the first lane's offset a multiple of this many elements.
    let l = (bytes / elem) as i64;
    let mut stride = 1i64;
    let mut aligned = true;
    for (k, &e) in idx.iter().enumerate().rev() {
        aligned &= stride % l == 0 || multiple_of(p, e, l, Some((var, base)));
        stride *= d.shape.get(k).copied().unwrap_or(1);
    }
    if aligned {
        bytes
    } else {
        elem
    }
}

/// Whether `e` is a multiple of `m` for every value of its variables, `var`
/// taking the value `base` (the first lane of a vector) where `lane0` names it.
pub fn multiple_of(p: &Program, e: TExprId, m: i64, lane0: Option<(VarId, i64)>) -> bool {
    if m == 1 {
        return true;
    }
    match p.expr(e) {
        TExpr::Int(k) => k % m == 0,
        TExpr::Var(v) => lane0.is_some_and(|(var, base)| *v == var && base % m == 0),
        TExpr::Binary(BinOp::Mul, a, b) => {
            let factor = |x: TExprId, y: TExprId| match p.expr(x) {
                TExpr::Int(k) if *k != 0 && m % k == 0 => multiple_of(p, y, m / k, lane0),
                _ => false,
            };
            multiple_of(p, *a, m, lane0) || multiple_of(p, *b, m, lane0) || factor(*a, *b) || factor(*b, *a)
        }
        TExpr::Binary(BinOp::Add | BinOp::Sub, a, b) => multiple_of(p, *a, m, lane0) && multiple_of(p, *b, m, lane0),
        // `a % k` with `m` dividing `k` keeps `a`'s multiples of `m` (legalized as `URem` or `TruncRem`).
        TExpr::Binary(BinOp::FloorMod | BinOp::URem | BinOp::TruncRem, a, b) => {
            matches!(p.expr(*b), TExpr::Int(k) if *k != 0 && k % m == 0) && multiple_of(p, *a, m, lane0)
        }
        _ => false,
    }
}
