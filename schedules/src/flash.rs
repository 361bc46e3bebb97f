//! Attention as one operator on CPUs, computed flash-style: the online
//! softmax over blocks of keys (Milakov & Gimelshein 2018; Dao et al. 2022),
//! so that the scores are never materialized beyond one block of keys.
//!
//! Why a construction of its own: the language has no recurrences, so the
//! online softmax — a running maximum `m`, a running sum `l` and an
//! accumulator `O` rescaled by `exp(m_old − m_new)` at every block — cannot
//! be written as statements, nor reached by schedule primitives from the
//! five statements of `std.nn`'s `scaled_dot_product_attention` (scores, row
//! maximum, exponentials, their sum, weighted sum), which a schedule can
//! only keep as five passes over an `L × S` score matrix. So the decision
//! lives here, in one place, in two halves:
//!
//! - [`fuse_attention`], the CPU strategy's first preparation pass, finds
//!   the five-stage pattern in the tensor IR (whatever wrote it: the
//!   standard library's kernel, a hand-written kernel with the same
//!   statements, or an imported model's `MatMul`, `Div`, `Where`,
//!   `Softmax`, `MatMul`: the statements the scores are computed by are
//!   taken into the scores first, and a softmax's division moves after the
//!   weighted sum, the same up to rounding) and replaces it by one stage
//!   whose value is the same computation as one expression,
//!   `Y[.., j] = sum[s](exp(sc(s) − max[t] sc(t)) · V(s, j)) / sum[u](exp(sc(u) − max[w] sc(w)))`
//!   ([`parts`] reads it back). The score `sc` is whatever the first
//!   statement computed — any scale, additive mask, causal `select` — with
//!   at most one `sum` (the `Q·Kᵀ` product) inside; `V(s, j)` any
//!   expression without reductions. The other preparation passes leave the
//!   stage alone (`normalize::hoist_reductions` and the CPU attachments ask
//!   [`is_attention`]).
//! - [`lower`] builds its loop nest, which the CPU schedule asks for with
//!   [`Flash`] on the stage ([`crate::schedule::StageSchedule::flash`]):
//!   the outer row axes and blocks of `queries` queries in parallel, and per
//!   block of queries, per block of `block` keys: the keys laid out
//!   transposed once, the block's scores into a local `queries × block`
//!   buffer (keys as vector lanes), per query the new running maximum, the
//!   rescaling of `l` and `O`, the exponentials; `O += p · V` with each row
//!   of `V` read once for the block's queries; at the end `Y = O / l`.
//!
//! Semantics are the interpreter's: a row whose scores are all `-inf` (fully
//! masked) is NaN there (`exp(-inf − -inf)`); here its running maximum stays
//! `-inf`, exponentials are taken against 0 instead (so masked keys add
//! nothing and a partly masked first block does not poison the row), and the
//! final `0 / 0` is NaN again. Only rounding differs (products of
//! exponentials instead of one), within the tolerance of `run --check`.
//!
//! Invariant: [`fuse_attention`] rewrites only temporaries that nothing else
//! reads, and its stage computes exactly what the five did.

use crate::ir::{ForKind, LoopFunc, Stmt};
use crate::normalize::{fresh_name, replace_node, subst};
use std::collections::HashMap;
use texc_compiler::ops::{BinOp, MathFn, ReduceOp};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

/// How the CPU schedule computes an attention stage ([`lower`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flash {
    /// Keys per block: the scores held at once, per row.
    pub block: i64,
    /// Vector lanes of the loops over a block's keys and over `j`.
    pub lanes: i64,
    /// Queries per block: each block of keys (laid out transposed once)
    /// and each row of `V` serve that many queries.
    pub queries: i64,
    /// Whether the rows run on the thread pool.
    pub parallel: bool,
}

/// The parts of an attention stage: the score of key `s` (an expression in
/// the row axes, `s` and the score's own reduction variables) and the
/// value `V(s, j)`.
#[derive(Clone, Copy, Debug)]
pub struct Parts {
    pub score: TExprId,
    pub value: TExprId,
    /// The key variable (the stage's variable after its axes).
    pub key: VarId,
}

/// Whether stage `si` is an attention stage [`fuse_attention`] made.
pub fn is_attention(p: &Program, si: usize) -> bool {
    parts(p, &p.stages[si]).is_some()
}

/// The parts of `st` if it is an attention stage.
pub fn parts(p: &Program, st: &Stage) -> Option<Parts> {
    let n = st.n_axes;
    if n == 0 || !matches!(p.tensor(st.tensor).elem, ElemType::F32) {
        return None;
    }
    let TExpr::Binary(BinOp::Div, num, den) = p.expr(st.value) else { return None };
    let TExpr::Reduce(ReduceOp::Sum, kv, body) = p.expr(*num) else { return None };
    let TExpr::Reduce(ReduceOp::Sum, _, den_body) = p.expr(*den) else { return None };
    let [key] = kv[..] else { return None };
    let TExpr::Binary(BinOp::Mul, w, value) = p.expr(*body) else { return None };
    let weight = |e: TExprId| -> Option<TExprId> {
        let TExpr::Math(MathFn::Exp, a) = p.expr(e) else { return None };
        let TExpr::Binary(BinOp::Sub, sc, mx) = p.expr(*a.first()?) else { return None };
        matches!(p.expr(*mx), TExpr::Reduce(ReduceOp::Max, ..)).then_some(*sc)
    };
    let score = weight(*w)?;
    weight(*den_body)?;
    (key as usize == n && !crate::normalize::contains_reduce(p, *value)).then_some(Parts { score, value: *value, key })
}

/// An attention found at a stage index: how many stages it spans, and the
/// value expression `V(s, j)` of its output's weighted sum.
struct Found {
    stages: usize,
    value: TExprId,
}

/// The attention starting at stage `si`, if there is one: `(scores, max,
/// exp, sum, output)` with `Y = sum[s](p · V) / z` (the standard library's
/// form), or `(scores, max, exp, sum, softmax, output)` with
/// `Y = sum[s]((p / z) · V)` (a softmax, then a product: the ONNX
/// importer's form). The temporaries before the output are read by no
/// other stage.
fn pattern(p: &Program, si: usize) -> Option<Found> {
    let st = p.stages.get(si..si + 5)?;
    let (a, m, e, z) = (&st[0], &st[1], &st[2], &st[3]);
    let n = a.n_axes;
    let rows: Vec<i64> = a.vars[..n.checked_sub(1)?].iter().map(|v| v.extent).collect();
    let same_rows =
        |s: &Stage, axes: usize| s.n_axes == axes && s.vars[..n - 1].iter().map(|v| v.extent).eq(rows.iter().copied());
    if !same_rows(m, n - 1) || !same_rows(e, n) || !same_rows(z, n - 1) || e.vars[n - 1].extent != a.vars[n - 1].extent
    {
        return None;
    }
    // Loads at the stage's own point (a constant 0 along an axis of one
    // element, as imported models index a batch of one), the last index
    // possibly another variable.
    let at = |x: TExprId, t: TensorId, axes: usize, last: Option<VarId>| match p.expr(x) {
        TExpr::Load(l, idx) if *l == t && idx.len() == axes + last.is_some() as usize => {
            idx.iter().enumerate().all(|(d, &i)| {
                let want = if d == axes { last.expect("one more index") } else { d as VarId };
                matches!(p.expr(i), TExpr::Var(v) if *v == want)
                    || (d < axes && p.tensor(t).shape[d] == 1 && matches!(p.expr(i), TExpr::Int(0)))
            })
        }
        _ => false,
    };
    let single = |s: &Stage, op: ReduceOp| match p.expr(s.value) {
        TExpr::Reduce(o, rv, body) if *o == op && rv[..] == [s.n_axes as VarId] => Some(*body),
        _ => None,
    };
    let mb = single(m, ReduceOp::Max)?;
    if !at(mb, a.tensor, n - 1, Some((n - 1) as VarId)) {
        return None;
    }
    let TExpr::Math(MathFn::Exp, ea) = p.expr(e.value) else { return None };
    let TExpr::Binary(BinOp::Sub, x, mx) = p.expr(*ea.first()?) else { return None };
    if !at(*x, a.tensor, n, None) || !at(*mx, m.tensor, n - 1, None) {
        return None;
    }
    if !at(single(z, ReduceOp::Sum)?, e.tensor, n - 1, Some((n - 1) as VarId)) {
        return None;
    }
    // The weighted sum `sum[s](w[.., s] · V)` of stage `y`, `w` read at the
    // row's point and key `s`: its `V`.
    let weighted = |y: &Stage, w: TensorId, num: TExprId| -> Option<TExprId> {
        let TExpr::Reduce(ReduceOp::Sum, rv, body) = p.expr(num) else { return None };
        if rv[..] != [n as VarId] || y.vars[n].extent != a.vars[n - 1].extent {
            return None;
        }
        let TExpr::Binary(BinOp::Mul, f, g) = p.expr(*body) else { return None };
        if at(*f, w, n - 1, Some(n as VarId)) {
            Some(*g)
        } else if at(*g, w, n - 1, Some(n as VarId)) {
            Some(*f)
        } else {
            None
        }
    };
    let (stages, y, value) = match p.expr(st[4].value) {
        // A softmax, then the product.
        TExpr::Binary(BinOp::Div, pe, den) if at(*pe, e.tensor, n, None) && at(*den, z.tensor, n - 1, None) => {
            let (sm, y) = (&st[4], p.stages.get(si + 5)?);
            if !same_rows(sm, n) || sm.vars[n - 1].extent != a.vars[n - 1].extent {
                return None;
            }
            let TExpr::Reduce(..) = p.expr(y.value) else { return None };
            (6, y, weighted(y, sm.tensor, y.value)?)
        }
        // The standard library's form: the sum of p · V, divided once.
        TExpr::Binary(BinOp::Div, num, den) if at(*den, z.tensor, n - 1, None) => {
            let y = &st[4];
            (5, y, weighted(y, e.tensor, *num)?)
        }
        _ => return None,
    };
    if !same_rows(y, n) || y.vars.len() != n + 1 {
        return None;
    }
    let temps: Vec<TensorId> = p.stages[si..si + stages - 1].iter().map(|s| s.tensor).collect();
    let private = temps.iter().all(|&t| {
        p.tensor(t).role == TensorRole::Temp
            && !p.outputs.contains(&t)
            && p.stages
                .iter()
                .enumerate()
                .all(|(i, s)| (si..si + stages).contains(&i) || !crate::strategy::loads(p, s.value, t))
    });
    let one_sum = reductions(p, a.value) <= 1 && !nested(p, a.value, false);
    let clean =
        !crate::normalize::contains_reduce(p, value) && temps.iter().all(|&t| !crate::strategy::loads(p, value, t));
    let f32s = [a, y].iter().all(|s| p.tensor(s.tensor).elem == ElemType::F32);
    (private && one_sum && clean && f32s && !crate::strategy::loads(p, a.value, y.tensor))
        .then_some(Found { stages, value })
}

/// `p` with what scores stage `si` reads computed in the scores' own
/// expression — element-wise statements (a scale, a mask applied by
/// `Where`) and one product (`sc = QK[..] / c`, as imported models compute
/// the scores in several statements) — and the index the scores' stage has
/// then; `None` when there is nothing to take in. Each statement taken in
/// is a temporary read once, by the scores alone.
fn with_scores_inlined(p: &Program, si: usize) -> Option<(Program, usize)> {
    let mut q = p.clone();
    let mut si = si;
    while let Some(next) = inline_one(&q, si) {
        q = next;
        si -= 1;
    }
    (q.stages.len() < p.stages.len()).then_some((q, si))
}

/// [`with_scores_inlined`]'s step: one statement taken into stage `si`.
fn inline_one(p: &Program, si: usize) -> Option<Program> {
    let a = &p.stages[si];
    let has_sum = crate::normalize::contains_reduce(p, a.value);
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, a.value, &mut loads);
    let (ti, load) = loads.iter().find_map(|&l| {
        let TExpr::Load(t, _) = p.expr(l) else { return None };
        let ti = p.stages.iter().position(|s| s.tensor == *t)?;
        let st = &p.stages[ti];
        let elementwise = !crate::normalize::contains_reduce(p, st.value);
        let product = !has_sum
            && matches!(p.expr(st.value), TExpr::Reduce(ReduceOp::Sum, _, b) if !crate::normalize::contains_reduce(p, *b));
        (ti < si && (elementwise || product)).then_some((ti, l))
    })?;
    let t = p.stages[ti].tensor;
    let once = loads.iter().filter(|&&l| matches!(p.expr(l), TExpr::Load(x, _) if *x == t)).count() == 1;
    let elsewhere = p.stages.iter().enumerate().any(|(i, s)| i != si && crate::strategy::loads(p, s.value, t));
    if !once || elsewhere || p.tensor(t).role != TensorRole::Temp || p.outputs.contains(&t) {
        return None;
    }
    let mut q = p.clone();
    let taken = q.stages[ti].clone();
    let TExpr::Load(_, idx) = q.expr(load).clone() else { unreachable!() };
    // Its axes become the load's indices, its reduction variables the scores' own.
    let base = q.stages[si].vars.len();
    let vars: HashMap<VarId, TExprId> = idx.iter().enumerate().map(|(d, &i)| (d as VarId, i)).collect();
    let rename: HashMap<VarId, VarId> =
        (taken.n_axes..taken.vars.len()).map(|v| (v as VarId, (base + v - taken.n_axes) as VarId)).collect();
    let value = subst(&mut q, taken.value, &vars, &rename);
    let scores = q.stages[si].value;
    let value = replace_node(&mut q, scores, load, value);
    q.stages[si].value = value;
    q.stages[si].vars.extend(taken.vars[taken.n_axes..].iter().cloned());
    q.stages.remove(ti);
    Some(q)
}

/// Reductions in `e`.
fn reductions(p: &Program, e: TExprId) -> usize {
    let own = matches!(p.expr(e), TExpr::Reduce(ReduceOp::Sum, ..)) as usize;
    let bad = matches!(p.expr(e), TExpr::Reduce(op, ..) if *op != ReduceOp::Sum) as usize * 2;
    own + bad + p.children(e).into_iter().map(|c| reductions(p, c)).sum::<usize>()
}

/// Whether `e` has a reduction inside a reduction.
fn nested(p: &Program, e: TExprId, inside: bool) -> bool {
    let here = matches!(p.expr(e), TExpr::Reduce(..));
    (here && inside) || p.children(e).into_iter().any(|c| nested(p, c, inside || here))
}

/// *fuse-attention*: every five-stage attention ([`pattern`]) becomes one
/// stage ([`parts`] reads it): the CPU schedule computes it flash-style.
pub fn fuse_attention(p: &mut Program) {
    let mut si = 0;
    while si + 5 <= p.stages.len() {
        if !may_start(p, si) {
            si += 1;
            continue;
        }
        // Scores computed by statements of their own: those in the fused stage too.
        if let Some((q, at)) = with_scores_inlined(p, si) {
            if let Some(found) = pattern(&q, at) {
                *p = q;
                fuse_at(p, at, found);
                si = at;
                continue;
            }
        }
        if let Some(found) = pattern(p, si) {
            fuse_at(p, si, found);
            continue;
        }
        si += 1;
    }
}

/// Whether an attention may start at stage `si` (its scores' maximum and
/// exponentials follow it): the cheap test before [`with_scores_inlined`]
/// copies the program (a model's thousand stages, each copying it, took a
/// quarter of a warm ResNet-50 compile).
fn may_start(p: &Program, si: usize) -> bool {
    let value = |i: usize| p.stages.get(i).map(|s| p.expr(s.value));
    matches!(value(si + 1), Some(TExpr::Reduce(ReduceOp::Max, ..)))
        && matches!(value(si + 2), Some(TExpr::Math(MathFn::Exp, _)))
}

/// Replace the stages of `found` at `si` by the output's stage in the
/// one-expression form (a softmax's division moves after the sum: the
/// same up to rounding).
fn fuse_at(p: &mut Program, si: usize, found: Found) {
    let Found { stages, value } = found;
    let a = p.stages[si].clone();
    let y = p.stages[si + stages - 1].clone();
    let n = y.n_axes;
    let span = y.span;
    let ty = p.ty(y.value);
    let key = a.vars[n - 1].clone();
    let k = a.vars.len() - a.n_axes;
    let mut vars = y.vars[..n].to_vec();
    for name in ["s", "t", "u", "w"] {
        vars.push(VarDecl { name: name.into(), extent: key.extent });
    }
    for copy in 0..4 {
        for v in &a.vars[a.n_axes..] {
            vars.push(VarDecl { name: format!("{}{copy}", v.name), extent: v.extent });
        }
    }
    // The score of key variable `kv`, with the `copy`-th set of reduction variables.
    let score = |p: &mut Program, kv: usize, copy: usize| -> TExprId {
        let mut map: HashMap<VarId, TExprId> = HashMap::new();
        for d in 0..n - 1 {
            map.insert(d as VarId, p.alloc(TExpr::Var(d as VarId), Ty::Index, span));
        }
        map.insert((n - 1) as VarId, p.alloc(TExpr::Var(kv as VarId), Ty::Index, span));
        let rename: HashMap<VarId, VarId> =
            (0..k).map(|r| ((a.n_axes + r) as VarId, (n + 4 + copy * k + r) as VarId)).collect();
        subst(p, a.value, &map, &rename)
    };
    let weight = |p: &mut Program, kv: usize, mv: usize, copy: usize| -> TExprId {
        let sc = score(p, kv, copy);
        let inner = score(p, mv, copy + 1);
        let mx = p.alloc(TExpr::Reduce(ReduceOp::Max, vec![mv as VarId], inner), ty, span);
        let d = p.alloc(TExpr::Binary(BinOp::Sub, sc, mx), ty, span);
        p.alloc(TExpr::Math(MathFn::Exp, vec![d]), ty, span)
    };
    let w = weight(p, n, n + 1, 0);
    let wv = p.alloc(TExpr::Binary(BinOp::Mul, w, value), ty, span);
    let num = p.alloc(TExpr::Reduce(ReduceOp::Sum, vec![n as VarId], wv), ty, span);
    let w2 = weight(p, n + 2, n + 3, 2);
    let den = p.alloc(TExpr::Reduce(ReduceOp::Sum, vec![(n + 2) as VarId], w2), ty, span);
    let out = p.alloc(TExpr::Binary(BinOp::Div, num, den), ty, span);
    let fused = Stage { tensor: y.tensor, vars, n_axes: n, value: out, span };
    p.stages.splice(si..si + stages, [fused]);
}

/// The loop nest of attention stage `st` (not attached: it stores into its
/// whole tensor), as [`Flash`] says.
pub fn lower(f: &mut LoopFunc, st: &Stage, fl: Flash) -> Vec<Stmt> {
    let parts = parts(&f.p, st).expect("the CPU schedule asks for flash only on attention stages");
    let n = st.n_axes;
    let (span, ty) = (st.span, Ty::Elem(ElemType::F32));
    let name = f.p.tensor(st.tensor).name.clone();
    // Row axes: the outer ones (batch, heads) whole, the last (the queries) in blocks.
    let (outer, queries): (Vec<i64>, i64) =
        if n >= 2 { (st.vars[..n - 2].iter().map(|v| v.extent).collect(), st.vars[n - 2].extent) } else { (vec![], 1) };
    let e_len = st.vars[n - 1].extent;
    let keys = st.vars[parts.key as usize].extent;
    let block = fl.block.clamp(1, keys.max(1));
    let qb = fl.queries.clamp(1, queries.max(1));
    let (full_q, rest_q) = (queries / qb, queries % qb);
    let nqb = full_q + (rest_q > 0) as i64;
    let mut c = Ctx { f, span, ty, lanes: fl.lanes.max(1) };
    let split = split_product(&c.f.p, parts.score, parts.key, (n >= 2).then(|| (n - 2) as VarId));
    let local = |c: &mut Ctx, what: &str, shape: Vec<i64>| {
        let nm = fresh_name(&c.f.p, &format!("{name}.{what}"));
        c.f.p.tensors.push(TensorDecl { name: nm, elem: ElemType::F32, shape, role: TensorRole::Temp, span });
        TensorId(c.f.p.tensors.len() as u32 - 1)
    };
    let row_state = [local(&mut c, "m", vec![qb]), local(&mut c, "l", vec![qb]), local(&mut c, "mn", vec![qb])];
    let ms = local(&mut c, "ms", vec![qb]);
    let acc = local(&mut c, "acc", vec![qb, e_len]);
    let sb = local(&mut c, "scores", vec![qb, block]);
    let extents: Vec<i64> = st.vars.iter().map(|v| v.extent).collect();
    let kt = split.map(|s| local(&mut c, "kt", vec![extents[s.d as usize], block]));
    let tile = kt.map(|_| local(&mut c, "tile", vec![TILE_QUERIES, TILE_VECTORS, fl.lanes.max(1)]));
    let total: i64 = outer.iter().product::<i64>() * nqb;
    let rb = c.f.new_var(format!("{name}.rb"), total.max(1));
    let r = c.var(rb);
    let (ob, lb) =
        if nqb > 1 { (c.index(BinOp::FloorDiv, r, nqb), c.index(BinOp::FloorMod, r, nqb)) } else { (r, c.int(0)) };
    let mut axis = Vec::new();
    let mut inner = outer.iter().product::<i64>().max(1);
    for &ext in &outer {
        inner /= ext.max(1);
        let q = if inner > 1 { c.index(BinOp::FloorDiv, ob, inner) } else { ob };
        axis.push(if ext > 1 { c.index(BinOp::FloorMod, q, ext) } else { c.int(0) });
    }
    let l0 = c.index(BinOp::Mul, lb, qb);
    let b = Block {
        parts,
        outer: &axis,
        l0: (n >= 2).then_some(l0),
        acc,
        sb,
        kt,
        tile,
        split,
        m: row_state[0],
        l: row_state[1],
        mn: row_state[2],
        ms,
        e_len,
        extents: &extents,
        out: st.tensor,
    };
    let mut body = if rest_q == 0 {
        b.rows(&mut c, &name, qb, keys, block)
    } else {
        let full = c.int(full_q);
        let in_full = c.f.p.alloc(TExpr::Binary(BinOp::Lt, lb, full), Ty::Elem(ElemType::Bool), span);
        let in_rest = c.f.p.alloc(TExpr::Binary(BinOp::Ge, lb, full), Ty::Elem(ElemType::Bool), span);
        let mut out = Vec::new();
        if full_q > 0 {
            let then = b.rows(&mut c, &name, qb, keys, block);
            out.push(Stmt::If { cond: in_full, then });
        }
        let then = b.rows(&mut c, &format!("{name}.last"), rest_q, keys, block);
        out.push(Stmt::If { cond: in_rest, then });
        out
    };
    for t in kt.into_iter().chain([sb, acc, ms]).chain(row_state) {
        body = vec![Stmt::Alloc { tensor: t, body }];
    }
    let kind = if fl.parallel && total >= 2 { ForKind::Parallel } else { ForKind::Serial };
    vec![Stmt::For { var: rb, lo: 0, extent: total.max(1), kind, body }]
}

/// The score's product `sum[d](q(d) · k(s, d))` with its factors apart: `q`
/// free of the key, `k` free of the query axis, so that a block of keys is
/// laid out once, transposed, for every query of a block.
#[derive(Clone, Copy, Debug)]
struct Split {
    d: VarId,
    q: TExprId,
    k: TExprId,
}

fn split_product(p: &Program, score: TExprId, key: VarId, query: Option<VarId>) -> Option<Split> {
    let sum = find_reduce(p, score)?;
    let TExpr::Reduce(ReduceOp::Sum, rv, g) = p.expr(sum) else { return None };
    let [d] = rv[..] else { return None };
    let TExpr::Binary(BinOp::Mul, a, b) = p.expr(*g) else { return None };
    let free = |e: TExprId, v: Option<VarId>| v.is_none_or(|v| !uses(p, e, v));
    if free(*a, Some(key)) && free(*b, query) {
        Some(Split { d, q: *a, k: *b })
    } else if free(*b, Some(key)) && free(*a, query) {
        Some(Split { d, q: *b, k: *a })
    } else {
        None
    }
}

/// Whether `e` reads variable `v`.
fn uses(p: &Program, e: TExprId, v: VarId) -> bool {
    matches!(p.expr(e), TExpr::Var(x) if *x == v) || p.children(e).into_iter().any(|c| uses(p, c, v))
}

/// What building the nest needs at hand.
struct Ctx<'a> {
    f: &'a mut LoopFunc,
    span: texc_grammar::Span,
    ty: Ty,
    lanes: i64,
}

impl Ctx<'_> {
    fn int(&mut self, k: i64) -> TExprId {
        self.f.p.alloc(TExpr::Int(k), Ty::Index, self.span)
    }
    fn float(&mut self, x: f64) -> TExprId {
        self.f.p.alloc(TExpr::Float(x), self.ty, self.span)
    }
    fn var(&mut self, v: VarId) -> TExprId {
        self.f.p.alloc(TExpr::Var(v), Ty::Index, self.span)
    }
    fn index(&mut self, op: BinOp, a: TExprId, k: i64) -> TExprId {
        let k = self.int(k);
        self.f.p.alloc(TExpr::Binary(op, a, k), Ty::Index, self.span)
    }
    fn add(&mut self, a: TExprId, b: TExprId) -> TExprId {
        self.f.p.alloc(TExpr::Binary(BinOp::Add, a, b), Ty::Index, self.span)
    }
    fn bin(&mut self, op: BinOp, a: TExprId, b: TExprId) -> TExprId {
        self.f.p.alloc(TExpr::Binary(op, a, b), self.ty, self.span)
    }
    fn load(&mut self, t: TensorId, idx: Vec<TExprId>) -> TExprId {
        self.f.p.alloc(TExpr::Load(t, idx), self.ty, self.span)
    }

    /// `body(i)` for `i` in `0..extent`: whole vectors, then one vector of the rest.
    fn vec_loop(
        &mut self,
        name: &str,
        extent: i64,
        body: &mut dyn FnMut(&mut Self, TExprId) -> Vec<Stmt>,
    ) -> Vec<Stmt> {
        let w = self.lanes;
        let mut out = Vec::new();
        if w <= 1 {
            return vec![self.serial(name, extent, ForKind::Serial, body)];
        }
        let whole = extent / w;
        if whole > 0 {
            let o = self.f.new_var(format!("{name}.o"), whole);
            let v = self.f.new_var(format!("{name}.v"), w);
            let (ov, vv) = (self.var(o), self.var(v));
            let base = self.index(BinOp::Mul, ov, w);
            let i = self.add(base, vv);
            let b = body(self, i);
            let inner = Stmt::For { var: v, lo: 0, extent: w, kind: ForKind::Vectorized, body: b };
            out.push(Stmt::For { var: o, lo: 0, extent: whole, kind: ForKind::Serial, body: vec![inner] });
        }
        let rest = extent % w;
        if rest > 0 {
            let v = self.f.new_var(format!("{name}.r"), rest);
            let vv = self.var(v);
            let base = self.int(whole * w);
            let i = self.add(base, vv);
            let b = body(self, i);
            out.push(Stmt::For { var: v, lo: 0, extent: rest, kind: ForKind::Vectorized, body: b });
        }
        out
    }

    fn serial(
        &mut self,
        name: &str,
        extent: i64,
        kind: ForKind,
        body: &mut dyn FnMut(&mut Self, TExprId) -> Vec<Stmt>,
    ) -> Stmt {
        let v = self.f.new_var(name, extent);
        let i = self.var(v);
        let b = body(self, i);
        Stmt::For { var: v, lo: 0, extent, kind, body: b }
    }
}

/// A block of queries: the buffers and expressions its nest works on.
struct Block<'a> {
    parts: Parts,
    /// The outer row axes (batch, heads) of the block.
    outer: &'a [TExprId],
    /// The block's first query (`None`: the stage has no query axis).
    l0: Option<TExprId>,
    acc: TensorId,
    sb: TensorId,
    kt: Option<TensorId>,
    /// The register tile of [`Block::tiled_product`] (with `kt`).
    tile: Option<TensorId>,
    split: Option<Split>,
    m: TensorId,
    l: TensorId,
    mn: TensorId,
    ms: TensorId,
    e_len: i64,
    /// Extents of the stage's variables (the score's reduction variables among them).
    extents: &'a [i64],
    out: TensorId,
}

impl Block<'_> {
    /// The map of the stage's variables for query `q` of the block (`None`:
    /// the query axis left as is), key `s` and further variables `more`.
    fn vars(
        &self,
        c: &mut Ctx,
        q: Option<TExprId>,
        s: Option<TExprId>,
        more: &[(VarId, TExprId)],
    ) -> HashMap<VarId, TExprId> {
        let mut map: HashMap<VarId, TExprId> = HashMap::new();
        for (d, &x) in self.outer.iter().enumerate() {
            map.insert(d as VarId, x);
        }
        if let (Some(l0), Some(q)) = (self.l0, q) {
            let l = c.add(l0, q);
            map.insert(self.outer.len() as VarId, l);
        }
        if let Some(s) = s {
            map.insert(self.parts.key, s);
        }
        map.extend(more.iter().copied());
        map
    }

    fn at(&self, c: &mut Ctx, e: TExprId, q: TExprId, s: Option<TExprId>, more: &[(VarId, TExprId)]) -> TExprId {
        let map = self.vars(c, Some(q), s, more);
        subst(&mut c.f.p, e, &map, &HashMap::new())
    }

    /// The nest of a block of `rows` queries over every key, in blocks of `block`.
    fn rows(&self, c: &mut Ctx, name: &str, rows: i64, keys: i64, block: i64) -> Vec<Stmt> {
        let (ty, span) = (c.ty, c.span);
        let mut out = Vec::new();
        out.push(c.serial(&format!("{name}.init"), rows, ForKind::Serial, &mut |c, q| {
            let neg_inf = c.f.p.alloc(TExpr::reduce_identity(ReduceOp::Max, ty), ty, span);
            let zero = c.float(0.0);
            let mut s = vec![
                Stmt::Store { tensor: self.m, indices: vec![q], value: neg_inf },
                Stmt::Store { tensor: self.l, indices: vec![q], value: zero },
            ];
            s.extend(c.vec_loop(&format!("{name}.init.j"), self.e_len, &mut |c, j| {
                let z = c.float(0.0);
                vec![Stmt::Store { tensor: self.acc, indices: vec![q, j], value: z }]
            }));
            s
        }));
        let (full, rest) = (keys / block, keys % block);
        if full > 0 {
            let kb = c.f.new_var(format!("{name}.kb"), full);
            let kv = c.var(kb);
            let s0 = c.index(BinOp::Mul, kv, block);
            let body = self.keys(c, name, rows, s0, block);
            out.push(Stmt::For { var: kb, lo: 0, extent: full, kind: ForKind::Serial, body });
        }
        if rest > 0 {
            let s0 = c.int(full * block);
            out.extend(self.keys(c, &format!("{name}.tail"), rows, s0, rest));
        }
        out.push(c.serial(&format!("{name}.out"), rows, ForKind::Serial, &mut |c, q| {
            c.vec_loop(&format!("{name}.out.j"), self.e_len, &mut |c, j| {
                let o = c.load(self.acc, vec![q, j]);
                let lv = c.load(self.l, vec![q]);
                let value = c.bin(BinOp::Div, o, lv);
                let mut indices: Vec<TExprId> = self.outer.to_vec();
                if let Some(l0) = self.l0 {
                    indices.push(c.add(l0, q));
                }
                indices.push(j);
                vec![Stmt::Store { tensor: self.out, indices, value }]
            })
        }));
        out
    }

    /// The statements of one block of `count` keys from `s0` for `rows` queries.
    fn keys(&self, c: &mut Ctx, name: &str, rows: i64, s0: TExprId, count: i64) -> Vec<Stmt> {
        let (ty, span) = (c.ty, c.span);
        let mut out = Vec::new();
        let key = |c: &mut Ctx, i: TExprId| c.add(s0, i);
        let score = self.parts.score;
        let reduce = find_reduce(&c.f.p, score);
        if let Some(r) = reduce {
            out.push(c.serial(&format!("{name}.z"), rows, ForKind::Serial, &mut |c, q| {
                c.vec_loop(&format!("{name}.z.k"), count, &mut |c, i| {
                    let z = c.float(0.0);
                    vec![Stmt::Store { tensor: self.sb, indices: vec![q, i], value: z }]
                })
            }));
            out.extend(match (self.split, self.kt) {
                (Some(sp), Some(kt)) => self.product_packed(c, name, rows, s0, count, sp, kt),
                _ => self.product(c, name, rows, s0, count, r),
            });
        }
        // The rest of the score's expression (scale, mask, causal select).
        if reduce != Some(score) {
            out.push(c.serial(&format!("{name}.sc"), rows, ForKind::Serial, &mut |c, q| {
                c.vec_loop(&format!("{name}.sc.k"), count, &mut |c, i| {
                    let s = key(c, i);
                    let e = match reduce {
                        Some(r) => {
                            let acc = c.load(self.sb, vec![q, i]);
                            replace_node(&mut c.f.p, score, r, acc)
                        }
                        None => score,
                    };
                    let value = self.at(c, e, q, Some(s), &[]);
                    vec![Stmt::Store { tensor: self.sb, indices: vec![q, i], value }]
                })
            }));
        }
        // Per query: the new running maximum, the rescaling, the exponentials and their sum.
        out.push(c.serial(&format!("{name}.soft"), rows, ForKind::Serial, &mut |c, q| {
            let mut s = Vec::new();
            let m_old = c.load(self.m, vec![q]);
            s.push(Stmt::Store { tensor: self.mn, indices: vec![q], value: m_old });
            s.push(c.serial(&format!("{name}.max"), count, ForKind::Serial, &mut |c, i| {
                let cur = c.load(self.mn, vec![q]);
                let x = c.load(self.sb, vec![q, i]);
                let value = c.f.p.alloc(TExpr::Math(MathFn::Max, vec![cur, x]), ty, span);
                vec![Stmt::Store { tensor: self.mn, indices: vec![q], value }]
            }));
            // Exponentials against 0 while every score so far is -inf.
            let mn = c.load(self.mn, vec![q]);
            let neg_inf = c.f.p.alloc(TExpr::reduce_identity(ReduceOp::Max, ty), ty, span);
            let none = c.f.p.alloc(TExpr::Binary(BinOp::Eq, mn, neg_inf), Ty::Elem(ElemType::Bool), span);
            let fz = c.float(0.0);
            let safe = c.f.p.alloc(TExpr::Select(none, fz, mn), ty, span);
            s.push(Stmt::Store { tensor: self.ms, indices: vec![q], value: safe });
            // alpha = exp(m_old − m_safe), into `m`, whose old value is spent.
            let (mo, msv) = (c.load(self.m, vec![q]), c.load(self.ms, vec![q]));
            let d = c.bin(BinOp::Sub, mo, msv);
            let alpha = c.f.p.alloc(TExpr::Math(MathFn::Exp, vec![d]), ty, span);
            s.push(Stmt::Store { tensor: self.m, indices: vec![q], value: alpha });
            let (lv, al) = (c.load(self.l, vec![q]), c.load(self.m, vec![q]));
            let scaled = c.bin(BinOp::Mul, lv, al);
            s.push(Stmt::Store { tensor: self.l, indices: vec![q], value: scaled });
            s.extend(c.vec_loop(&format!("{name}.a"), self.e_len, &mut |c, j| {
                let o = c.load(self.acc, vec![q, j]);
                let al = c.load(self.m, vec![q]);
                let value = c.bin(BinOp::Mul, o, al);
                vec![Stmt::Store { tensor: self.acc, indices: vec![q, j], value }]
            }));
            s.extend(c.vec_loop(&format!("{name}.p"), count, &mut |c, i| {
                let x = c.load(self.sb, vec![q, i]);
                let msv = c.load(self.ms, vec![q]);
                let d = c.bin(BinOp::Sub, x, msv);
                let value = c.f.p.alloc(TExpr::Math(MathFn::Exp, vec![d]), ty, span);
                vec![Stmt::Store { tensor: self.sb, indices: vec![q, i], value }]
            }));
            s.push(c.serial(&format!("{name}.sum"), count, ForKind::Serial, &mut |c, i| {
                let cur = c.load(self.l, vec![q]);
                let x = c.load(self.sb, vec![q, i]);
                let value = c.bin(BinOp::Add, cur, x);
                vec![Stmt::Store { tensor: self.l, indices: vec![q], value }]
            }));
            let mnv = c.load(self.mn, vec![q]);
            s.push(Stmt::Store { tensor: self.m, indices: vec![q], value: mnv });
            s
        }));
        // O += p · V: each row of V once for the block's queries.
        let value_expr = self.parts.value;
        let j_var = (self.parts.key - 1) as VarId;
        out.push(c.serial(&format!("{name}.pv"), count, ForKind::Serial, &mut |c, i| {
            let s = key(c, i);
            vec![c.serial(&format!("{name}.pv.q"), rows, ForKind::Unrolled, &mut |c, q| {
                c.vec_loop(&format!("{name}.pv.j"), self.e_len, &mut |c, j| {
                    let pv = c.load(self.sb, vec![q, i]);
                    let v = self.at(c, value_expr, q, Some(s), &[(j_var, j)]);
                    let term = c.bin(BinOp::Mul, pv, v);
                    let o = c.load(self.acc, vec![q, j]);
                    let value = c.bin(BinOp::Add, o, term);
                    vec![Stmt::Store { tensor: self.acc, indices: vec![q, j], value }]
                })
            })]
        }));
        out
    }

    /// The product's sum with the keys as vector lanes, `k(s, d)` read where it lies.
    fn product(&self, c: &mut Ctx, name: &str, rows: i64, s0: TExprId, count: i64, r: TExprId) -> Vec<Stmt> {
        let TExpr::Reduce(_, rv, g) = c.f.p.expr(r).clone() else { unreachable!("a reduction") };
        let mut dvals = Vec::new();
        let mut loop_vars = Vec::new();
        for (i, &v) in rv.iter().enumerate() {
            let ext = self.extents[v as usize];
            let lv = c.f.new_var(format!("{name}.d{i}"), ext);
            loop_vars.push((lv, ext));
            let e = c.var(lv);
            dvals.push((v, e));
        }
        let mut inner = vec![c.serial(&format!("{name}.k.q"), rows, ForKind::Serial, &mut |c, q| {
            c.vec_loop(&format!("{name}.k"), count, &mut |c, i| {
                let s = c.add(s0, i);
                let term = self.at(c, g, q, Some(s), &dvals);
                let cur = c.load(self.sb, vec![q, i]);
                let value = c.bin(BinOp::Add, cur, term);
                vec![Stmt::Store { tensor: self.sb, indices: vec![q, i], value }]
            })
        })];
        for &(lv, ext) in loop_vars.iter().rev() {
            inner = vec![Stmt::For { var: lv, lo: 0, extent: ext, kind: ForKind::Serial, body: inner }];
        }
        inner
    }

    /// The product's sum from the block's keys laid out transposed once
    /// (`kt[d, k]`), read contiguously by every query of the block.
    #[allow(clippy::too_many_arguments)]
    fn product_packed(
        &self,
        c: &mut Ctx,
        name: &str,
        rows: i64,
        s0: TExprId,
        count: i64,
        sp: Split,
        kt: TensorId,
    ) -> Vec<Stmt> {
        let dext = self.extents[sp.d as usize];
        let mut out = Vec::new();
        out.push(c.serial(&format!("{name}.pack"), count, ForKind::Serial, &mut |c, i| {
            let s = c.add(s0, i);
            vec![c.serial(&format!("{name}.pack.d"), dext, ForKind::Serial, &mut |c, d| {
                let map = self.vars(c, None, Some(s), &[(sp.d, d)]);
                let value = subst(&mut c.f.p, sp.k, &map, &HashMap::new());
                vec![Stmt::Store { tensor: kt, indices: vec![d, i], value }]
            })]
        }));
        let (w, tq, tk) = (c.lanes, TILE_QUERIES, TILE_VECTORS);
        if let Some(tile) = self.tile.filter(|_| w > 1 && rows % tq == 0 && count % (tk * w) == 0) {
            out.push(self.tiled_product(c, name, rows, count, sp, kt, tile, dext));
            return out;
        }
        out.push(c.serial(&format!("{name}.d"), dext, ForKind::Serial, &mut |c, d| {
            vec![c.serial(&format!("{name}.k.q"), rows, ForKind::Unrolled, &mut |c, q| {
                let qv = self.at(c, sp.q, q, None, &[(sp.d, d)]);
                c.vec_loop(&format!("{name}.k"), count, &mut |c, i| {
                    let kv = c.load(kt, vec![d, i]);
                    let term = c.bin(BinOp::Mul, qv, kv);
                    let cur = c.load(self.sb, vec![q, i]);
                    let value = c.bin(BinOp::Add, cur, term);
                    vec![Stmt::Store { tensor: self.sb, indices: vec![q, i], value }]
                })
            })]
        }));
        out
    }
}

impl Block<'_> {
    /// The scores of the block as register tiles of `TILE_QUERIES` queries
    /// × `TILE_VECTORS` vectors of keys, summed over `d` in a local buffer
    /// the unrolled loops index by constants (registers), then stored.
    #[allow(clippy::too_many_arguments)]
    fn tiled_product(
        &self,
        c: &mut Ctx,
        name: &str,
        rows: i64,
        count: i64,
        sp: Split,
        kt: TensorId,
        tile: TensorId,
        dext: i64,
    ) -> Stmt {
        let (w, tq, tk) = (c.lanes, TILE_QUERIES, TILE_VECTORS);
        c.serial(&format!("{name}.tq"), rows / tq, ForKind::Serial, &mut |c, qo| {
            vec![c.serial(&format!("{name}.tk"), count / (tk * w), ForKind::Serial, &mut |c, ko| {
                let q0 = c.index(BinOp::Mul, qo, tq);
                let k0 = c.index(BinOp::Mul, ko, tk * w);
                // Query `q0 + qi`, key `k0 + ki·w + v` of the block.
                let at = |c: &mut Ctx, qi: TExprId, ki: TExprId, v: TExprId| {
                    let q = c.add(q0, qi);
                    let kw = c.index(BinOp::Mul, ki, w);
                    let k = c.add(k0, kw);
                    (q, c.add(k, v))
                };
                let mut body = Vec::new();
                let each =
                    |c: &mut Ctx, what: &str, f: &mut dyn FnMut(&mut Ctx, TExprId, TExprId, TExprId) -> Vec<Stmt>| {
                        c.serial(&format!("{name}.{what}.qi"), tq, ForKind::Unrolled, &mut |c, qi| {
                            vec![c.serial(&format!("{name}.{what}.ki"), tk, ForKind::Unrolled, &mut |c, ki| {
                                vec![c.serial(&format!("{name}.{what}.v"), w, ForKind::Vectorized, &mut |c, v| {
                                    f(c, qi, ki, v)
                                })]
                            })]
                        })
                    };
                body.push(each(c, "t0", &mut |c, qi, ki, v| {
                    let z = c.float(0.0);
                    vec![Stmt::Store { tensor: tile, indices: vec![qi, ki, v], value: z }]
                }));
                body.push(c.serial(&format!("{name}.td"), dext, ForKind::Serial, &mut |c, d| {
                    vec![each(c, "t", &mut |c, qi, ki, v| {
                        let (q, k) = at(c, qi, ki, v);
                        let qv = self.at(c, sp.q, q, None, &[(sp.d, d)]);
                        let kv = c.load(kt, vec![d, k]);
                        let term = c.bin(BinOp::Mul, qv, kv);
                        let cur = c.load(tile, vec![qi, ki, v]);
                        let value = c.bin(BinOp::Add, cur, term);
                        vec![Stmt::Store { tensor: tile, indices: vec![qi, ki, v], value }]
                    })]
                }));
                body.push(each(c, "ts", &mut |c, qi, ki, v| {
                    let (q, k) = at(c, qi, ki, v);
                    let value = c.load(tile, vec![qi, ki, v]);
                    vec![Stmt::Store { tensor: self.sb, indices: vec![q, k], value }]
                }));
                vec![Stmt::Alloc { tensor: tile, body }]
            })]
        })
    }
}

/// Queries and vectors of keys of a register tile of scores: 8 vector
/// accumulators, and 2 loads of keys and 4 broadcasts per 8 FMAs.
const TILE_QUERIES: i64 = 4;
const TILE_VECTORS: i64 = 2;

/// The only reduction in `e`, if any.
fn find_reduce(p: &Program, e: TExprId) -> Option<TExprId> {
    if matches!(p.expr(e), TExpr::Reduce(..)) {
        return Some(e);
    }
    p.children(e).into_iter().find_map(|c| find_reduce(p, c))
}
