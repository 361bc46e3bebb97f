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
//!   the outer row axes and blocks of `queries` queries in parallel (or,
//!   where there are rows enough for the threads and a row's keys fit half
//!   the L2, the rows in parallel, each laying out its keys transposed
//!   once, in rows an odd number of cache lines apart, and its blocks of
//!   queries inside), and per block of queries, per block of `block` keys:
//!   the keys laid out transposed (unless the row did), the block's scores
//!   into a local `queries × block` buffer (keys as vector lanes, register
//!   tiles), per query the new running maximum and the sum of the
//!   exponentials folded a vector at a time, the rescaling of `l` and `O`,
//!   the exponentials; `O += p · V` in register tiles of queries × the
//!   vectors of a row of `O`; at the end `Y = O / l`.
//!
//! Semantics are the interpreter's: a row whose scores are all `-inf` (fully
//! masked) is NaN there (`exp(-inf − -inf)`); here its running maximum stays
//! `-inf`, exponentials are taken against 0 instead (so masked keys add
//! nothing and a partly masked first block does not poison the row), and the
//! final `0 / 0` is NaN again. Only rounding differs (products of
//! exponentials instead of one, and the order of the sums), within the
//! tolerance of `run --check`.
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
    /// Vector accumulators a register tile may keep (the target's registers
    /// less those its loads and broadcasts take).
    pub accumulators: i64,
    /// Bytes of transposed keys a row (batch, head) may lay out at once for
    /// all its blocks of queries (0: per block of keys and queries), and
    /// the rows there must be at least for the threads to share them out.
    pub whole_keys_bytes: i64,
    pub whole_keys_rows: i64,
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
    let outer_rows: i64 = outer.iter().product::<i64>().max(1);
    // A row's keys laid out once for all its blocks of queries, where they
    // fit the budget and the rows alone keep the threads busy: laying out
    // one block of keys per block of queries took a quarter of the time
    // (L = 197 and 1024, D = 64, AVX-512, Zen 4).
    let whole = split.is_some_and(|s| {
        nqb > 1
            && outer_rows >= fl.whole_keys_rows
            && extents[s.d as usize] * odd_lines(keys) * 4 <= fl.whole_keys_bytes
    });
    let kt =
        split.map(|s| local(&mut c, "kt", vec![extents[s.d as usize], if whole { odd_lines(keys) } else { block }]));
    let tile = kt.map(|_| local(&mut c, "tile", vec![TILE_QUERIES, TILE_VECTORS, fl.lanes.max(1)]));
    // Partial maxima and sums of a query's scores, one per lane.
    let part = (fl.lanes > 1 && block >= fl.lanes).then(|| local(&mut c, "part", vec![fl.lanes]));
    // The register tile of `O += p · V`: queries × vectors of `j`.
    let pv_vectors = e_len / fl.lanes.max(1);
    let pv_queries = (fl.accumulators / pv_vectors.max(1)).min(PV_QUERIES);
    let pv_tile = (fl.lanes > 1 && e_len % fl.lanes == 0 && pv_queries >= 1)
        .then(|| (local(&mut c, "pvt", vec![pv_queries, pv_vectors, fl.lanes]), pv_queries));
    // The parallel loop runs over the rows, and over their blocks of queries
    // too unless the keys are laid out per row.
    let total: i64 = if whole { outer_rows } else { outer_rows * nqb };
    let rb = c.f.new_var(format!("{name}.rb"), total.max(1));
    let r = c.var(rb);
    let (ob, lb) = if whole {
        (r, None)
    } else if nqb > 1 {
        (c.index(BinOp::FloorDiv, r, nqb), Some(c.index(BinOp::FloorMod, r, nqb)))
    } else {
        (r, Some(c.int(0)))
    };
    let mut axis = Vec::new();
    let mut inner = outer_rows;
    for &ext in &outer {
        inner /= ext.max(1);
        let q = if inner > 1 { c.index(BinOp::FloorDiv, ob, inner) } else { ob };
        axis.push(if ext > 1 { c.index(BinOp::FloorMod, q, ext) } else { c.int(0) });
    }
    let block_at = |l0: TExprId| Block {
        parts,
        outer: &axis,
        l0: (n >= 2).then_some(l0),
        acc,
        sb,
        kt,
        kt_whole: whole,
        tile,
        part,
        pv_tile,
        split,
        m: row_state[0],
        l: row_state[1],
        mn: row_state[2],
        ms,
        e_len,
        extents: &extents,
        out: st.tensor,
    };
    let mut body = match (lb, split, kt) {
        (None, Some(sp), Some(kt)) => {
            let zero = c.int(0);
            let dext = extents[sp.d as usize];
            let mut out = vec![block_at(zero).pack_keys(&mut c, &format!("{name}.keys"), zero, keys, sp, kt, dext)];
            if full_q > 0 {
                let qv = c.f.new_var(format!("{name}.qb"), full_q);
                let q = c.var(qv);
                let l0 = c.index(BinOp::Mul, q, qb);
                let body = block_at(l0).rows(&mut c, &name, qb, keys, block);
                out.push(Stmt::For { var: qv, lo: 0, extent: full_q, kind: ForKind::Serial, body });
            }
            if rest_q > 0 {
                let l0 = c.int(full_q * qb);
                out.extend(block_at(l0).rows(&mut c, &format!("{name}.last"), rest_q, keys, block));
            }
            out
        }
        (None, ..) => unreachable!("keys are laid out per row only where the product splits"),
        (Some(lb), ..) => {
            let l0 = c.index(BinOp::Mul, lb, qb);
            let b = block_at(l0);
            if rest_q == 0 {
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
            }
        }
    };
    for t in kt.into_iter().chain(part).chain([sb, acc, ms]).chain(row_state) {
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

    /// The loops of a register tile of `rows × vectors` vectors, both
    /// unrolled (so that the tile's buffer is indexed by constants: registers),
    /// the lanes vectorized; `body(row, vector, lane)`. `axes` names the two.
    fn tile_loops(
        &mut self,
        name: &str,
        (rows, vectors): (i64, i64),
        axes: [&str; 2],
        body: &mut dyn FnMut(&mut Self, TExprId, TExprId, TExprId) -> Vec<Stmt>,
    ) -> Stmt {
        let w = self.lanes;
        self.serial(&format!("{name}.{}", axes[0]), rows, ForKind::Unrolled, &mut |c, r| {
            vec![c.serial(&format!("{name}.{}", axes[1]), vectors, ForKind::Unrolled, &mut |c, o| {
                vec![c.serial(&format!("{name}.v"), w, ForKind::Vectorized, &mut |c, v| body(c, r, o, v))]
            })]
        })
    }

    /// `tile[at] = tile[at] + a · b`.
    fn accumulate(&mut self, tile: TensorId, at: Vec<TExprId>, a: TExprId, b: TExprId) -> Stmt {
        let term = self.bin(BinOp::Mul, a, b);
        let cur = self.load(tile, at.clone());
        let value = self.bin(BinOp::Add, cur, term);
        Stmt::Store { tensor: tile, indices: at, value }
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
    /// `kt` holds the row's every key (`kt[d, s]`), laid out once before its
    /// blocks of queries, instead of one block's (`kt[d, k]`).
    kt_whole: bool,
    /// The register tile of [`Block::tiled_product`] (with `kt`).
    tile: Option<TensorId>,
    /// One partial result per lane for a query's maximum and sum.
    part: Option<TensorId>,
    /// The register tile of [`Block::tiled_values`] and its most queries
    /// (allocated where it runs: around each tile of queries).
    pv_tile: Option<(TensorId, i64)>,
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
            s.extend(self.row_reduce(c, &format!("{name}.max"), q, count, self.mn, ReduceOp::Max));
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
            s.extend(self.row_reduce(c, &format!("{name}.sum"), q, count, self.l, ReduceOp::Sum));
            let mnv = c.load(self.mn, vec![q]);
            s.push(Stmt::Store { tensor: self.m, indices: vec![q], value: mnv });
            s
        }));
        // O += p · V: each row of V once for the block's queries.
        let value_expr = self.parts.value;
        let j_var = (self.parts.key - 1) as VarId;
        if let Some((tile, most)) = self.pv_tile {
            let tq = (1..=most.min(rows)).rev().find(|t| rows % t == 0).unwrap_or(1);
            out.push(self.tiled_values(c, name, rows, s0, count, tile, tq));
            return out;
        }
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

    /// `kt[d, i] = k(s0 + i, d)` for `count` keys: the keys laid out transposed.
    #[allow(clippy::too_many_arguments)]
    fn pack_keys(&self, c: &mut Ctx, name: &str, s0: TExprId, count: i64, sp: Split, kt: TensorId, dext: i64) -> Stmt {
        c.serial(&format!("{name}.pack"), count, ForKind::Serial, &mut |c, i| {
            let s = c.add(s0, i);
            vec![c.serial(&format!("{name}.pack.d"), dext, ForKind::Serial, &mut |c, d| {
                let map = self.vars(c, None, Some(s), &[(sp.d, d)]);
                let value = subst(&mut c.f.p, sp.k, &map, &HashMap::new());
                vec![Stmt::Store { tensor: kt, indices: vec![d, i], value }]
            })]
        })
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
        let kcol0 = if self.kt_whole {
            s0
        } else {
            out.push(self.pack_keys(c, name, s0, count, sp, kt, dext));
            c.int(0)
        };
        let (w, tq, tk) = (c.lanes, TILE_QUERIES, TILE_VECTORS);
        if let Some(tile) = self.tile.filter(|_| w > 1 && rows % tq == 0 && count % (tk * w) == 0) {
            out.push(self.tiled_product(c, name, rows, count, sp, kt, kcol0, tile, dext));
            return out;
        }
        out.push(c.serial(&format!("{name}.d"), dext, ForKind::Serial, &mut |c, d| {
            vec![c.serial(&format!("{name}.k.q"), rows, ForKind::Unrolled, &mut |c, q| {
                let qv = self.at(c, sp.q, q, None, &[(sp.d, d)]);
                c.vec_loop(&format!("{name}.k"), count, &mut |c, i| {
                    let col = c.add(kcol0, i);
                    let kv = c.load(kt, vec![d, col]);
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
        kcol0: TExprId,
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
                        c.tile_loops(&format!("{name}.{what}"), (tq, tk), ["qi", "ki"], f)
                    };
                body.push(each(c, "t0", &mut |c, qi, ki, v| {
                    let z = c.float(0.0);
                    vec![Stmt::Store { tensor: tile, indices: vec![qi, ki, v], value: z }]
                }));
                body.push(c.serial(&format!("{name}.td"), dext, ForKind::Serial, &mut |c, d| {
                    vec![each(c, "t", &mut |c, qi, ki, v| {
                        let (q, k) = at(c, qi, ki, v);
                        let qv = self.at(c, sp.q, q, None, &[(sp.d, d)]);
                        let col = c.add(kcol0, k);
                        let kv = c.load(kt, vec![d, col]);
                        vec![c.accumulate(tile, vec![qi, ki, v], qv, kv)]
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

impl Block<'_> {
    /// `into[q] = op(into[q], sb[q, 0..count])`: whole vectors of scores
    /// folded into one partial result per lane, then the lanes and the
    /// scores past the last whole vector one by one (a serial fold over the
    /// keys waits on each step's latency: 64 steps a query per block).
    fn row_reduce(&self, c: &mut Ctx, name: &str, q: TExprId, count: i64, into: TensorId, op: ReduceOp) -> Vec<Stmt> {
        let (ty, span, w) = (c.ty, c.span, c.lanes);
        let combine = |c: &mut Ctx, a: TExprId, b: TExprId| match op {
            ReduceOp::Max => c.f.p.alloc(TExpr::Math(MathFn::Max, vec![a, b]), ty, span),
            _ => c.bin(BinOp::Add, a, b),
        };
        let mut out = Vec::new();
        let whole = if self.part.is_some() { count / w } else { 0 };
        if let (Some(part), true) = (self.part, whole > 0) {
            out.push(c.serial(&format!("{name}.p0"), w, ForKind::Vectorized, &mut |c, v| {
                let x = c.load(self.sb, vec![q, v]);
                vec![Stmt::Store { tensor: part, indices: vec![v], value: x }]
            }));
            if whole > 1 {
                out.push(c.serial(&format!("{name}.po"), whole - 1, ForKind::Serial, &mut |c, o| {
                    vec![c.serial(&format!("{name}.pv"), w, ForKind::Vectorized, &mut |c, v| {
                        let base = c.index(BinOp::Add, o, 1);
                        let base = c.index(BinOp::Mul, base, w);
                        let i = c.add(base, v);
                        let (cur, x) = (c.load(part, vec![v]), c.load(self.sb, vec![q, i]));
                        let value = combine(c, cur, x);
                        vec![Stmt::Store { tensor: part, indices: vec![v], value }]
                    })]
                }));
            }
            out.push(c.serial(&format!("{name}.lanes"), w, ForKind::Serial, &mut |c, r| {
                let (cur, x) = (c.load(into, vec![q]), c.load(part, vec![r]));
                let value = combine(c, cur, x);
                vec![Stmt::Store { tensor: into, indices: vec![q], value }]
            }));
        }
        let rest = count - whole * w;
        if rest > 0 {
            out.push(c.serial(name, rest, ForKind::Serial, &mut |c, r| {
                let i = c.index(BinOp::Add, r, whole * w);
                let (cur, x) = (c.load(into, vec![q]), c.load(self.sb, vec![q, i]));
                let value = combine(c, cur, x);
                vec![Stmt::Store { tensor: into, indices: vec![q], value }]
            }));
        }
        out
    }

    /// `O += p · V` as register tiles of `tq` queries × every vector of `j`:
    /// each tile's rows of `O` loaded once, the block's keys streamed through
    /// them, stored once (`O` in memory took a load and a store per FMA).
    #[allow(clippy::too_many_arguments)]
    fn tiled_values(
        &self,
        c: &mut Ctx,
        name: &str,
        rows: i64,
        s0: TExprId,
        count: i64,
        tile: TensorId,
        tq: i64,
    ) -> Stmt {
        let (w, ev) = (c.lanes, self.e_len / c.lanes);
        let value_expr = self.parts.value;
        let j_var = (self.parts.key - 1) as VarId;
        c.serial(&format!("{name}.pv.tq"), rows / tq, ForKind::Serial, &mut |c, qo| {
            let q0 = c.index(BinOp::Mul, qo, tq);
            let each =
                |c: &mut Ctx, what: &str, f: &mut dyn FnMut(&mut Ctx, TExprId, TExprId, TExprId) -> Vec<Stmt>| {
                    c.tile_loops(&format!("{name}.{what}"), (tq, ev), ["qi", "jo"], f)
                };
            // Query `q0 + qi`, column `jo·w + v`.
            let at = |c: &mut Ctx, qi: TExprId, jo: TExprId, v: TExprId| {
                let q = c.add(q0, qi);
                let jw = c.index(BinOp::Mul, jo, w);
                (q, c.add(jw, v))
            };
            let mut body = vec![each(c, "o0", &mut |c, qi, jo, v| {
                let (q, j) = at(c, qi, jo, v);
                let value = c.load(self.acc, vec![q, j]);
                vec![Stmt::Store { tensor: tile, indices: vec![qi, jo, v], value }]
            })];
            body.push(c.serial(&format!("{name}.pv"), count, ForKind::Serial, &mut |c, i| {
                let s = c.add(s0, i);
                vec![each(c, "o", &mut |c, qi, jo, v| {
                    let (q, j) = at(c, qi, jo, v);
                    let pv = c.load(self.sb, vec![q, i]);
                    let vv = self.at(c, value_expr, q, Some(s), &[(j_var, j)]);
                    vec![c.accumulate(tile, vec![qi, jo, v], pv, vv)]
                })]
            }));
            body.push(each(c, "os", &mut |c, qi, jo, v| {
                let (q, j) = at(c, qi, jo, v);
                let value = c.load(tile, vec![qi, jo, v]);
                vec![Stmt::Store { tensor: self.acc, indices: vec![q, j], value }]
            }));
            vec![Stmt::Alloc { tensor: tile, body }]
        })
    }
}

/// `n` floats rounded up to an odd number of 64-byte lines: rows of the
/// transposed keys that far apart fall in different sets of the L1 (rows
/// 4 KiB apart, 1024 keys, all fell in one and evicted each other).
fn odd_lines(n: i64) -> i64 {
    let lines = (n + 15) / 16;
    (lines | 1) * 16
}

/// Most queries of a register tile of `O += p · V` (4 × 4 vectors on AVX-512 at `E = 64`).
const PV_QUERIES: i64 = 4;

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
