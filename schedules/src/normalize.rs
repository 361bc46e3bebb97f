//! TIR-to-TIR passes that run before loop lowering.
//!
//! [`hoist_reductions`]: afterwards every stage is either *pure* (no
//! reduction) or its value *is* one reduction. A reduction nested inside an
//! expression (`sum[d](x[n, d]) / D`) moves into a stage of its own, whose
//! axes are those of the stage's axes and of the enclosing reductions'
//! variables that it reads (all of them if it reads none).
//!
//! [`inline_stage`]: replaces every load of a pure temporary by its defining
//! expression (with its axes substituted by the load's indices) and removes
//! its stage. A float temporary's value is rounded to its type where it was
//! stored (docs/language.md: float arithmetic is exact until stored or
//! cast), so the inlined expression is cast to that type: the interpreter
//! then rounds it there as the store did, and code generators do not
//! contract its last product with the reader's addition.

use std::collections::HashMap;
use texc_compiler::affine::Affine;
use texc_compiler::ops::{BinOp, MathFn, UnOp};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

/// Deep-copy `e`, replacing `Var(v)` by `vars[v]` where present and renaming
/// reduction variables by `rename`.
pub fn subst(p: &mut Program, e: TExprId, vars: &HashMap<VarId, TExprId>, rename: &HashMap<VarId, VarId>) -> TExprId {
    let (ty, span) = (p.ty(e), p.span(e));
    let node = match p.expr(e).clone() {
        TExpr::Var(v) => {
            if let Some(&r) = vars.get(&v) {
                return r;
            }
            TExpr::Var(rename.get(&v).copied().unwrap_or(v))
        }
        n @ (TExpr::Int(_) | TExpr::Float(_) | TExpr::Scalar(_)) => n,
        TExpr::Load(t, idx) => TExpr::Load(t, idx.iter().map(|&i| subst(p, i, vars, rename)).collect()),
        TExpr::Unary(op, a) => TExpr::Unary(op, subst(p, a, vars, rename)),
        TExpr::Binary(op, a, b) => {
            let a = subst(p, a, vars, rename);
            TExpr::Binary(op, a, subst(p, b, vars, rename))
        }
        TExpr::Select(c, a, b) => {
            let (c, a) = (subst(p, c, vars, rename), subst(p, a, vars, rename));
            TExpr::Select(c, a, subst(p, b, vars, rename))
        }
        TExpr::Math(f, args) => TExpr::Math(f, args.iter().map(|&a| subst(p, a, vars, rename)).collect()),
        TExpr::Intrinsic(i, args) => TExpr::Intrinsic(i, args.iter().map(|&a| subst(p, a, vars, rename)).collect()),
        TExpr::Cast(a) => TExpr::Cast(subst(p, a, vars, rename)),
        TExpr::Reduce(op, rv, body) => {
            let rv = rv.iter().map(|v| rename.get(v).copied().unwrap_or(*v)).collect();
            TExpr::Reduce(op, rv, subst(p, body, vars, rename))
        }
    };
    p.alloc(node, ty, span)
}

pub fn contains_reduce(p: &Program, e: TExprId) -> bool {
    matches!(p.expr(e), TExpr::Reduce(..)) || p.children(e).into_iter().any(|c| contains_reduce(p, c))
}

/// The variables of the reductions in `e` (nested ones included), in order of appearance.
fn reduce_vars(p: &Program, e: TExprId) -> Vec<VarId> {
    fn walk(p: &Program, e: TExprId, out: &mut Vec<VarId>) {
        if let TExpr::Reduce(_, vars, _) = p.expr(e) {
            out.extend(vars.iter().filter(|v| !out.contains(v)).copied().collect::<Vec<_>>());
        }
        for c in p.children(e) {
            walk(p, c, out);
        }
    }
    let mut out = Vec::new();
    walk(p, e, &mut out);
    out
}

/// Find a reduction that is not the stage's whole value; returns it with the
/// variables of the reductions enclosing it.
fn find_nested(p: &Program, e: TExprId, top: bool, enclosing: &mut Vec<VarId>) -> Option<(TExprId, Vec<VarId>)> {
    if let TExpr::Reduce(_, vars, body) = p.expr(e) {
        if !top {
            return Some((e, enclosing.clone()));
        }
        let n = enclosing.len();
        enclosing.extend(vars);
        let r = find_nested(p, *body, false, enclosing);
        enclosing.truncate(n);
        return r;
    }
    p.children(e).into_iter().find_map(|c| find_nested(p, c, false, enclosing))
}

pub fn hoist_reductions(p: &mut Program) {
    // The stages go back one at a time, each hoisting out of it just before
    // it, among the last few: inserted in the whole program, each hoisted
    // stage moved every later one (quadratic in a model's layers). Nothing
    // here reads a stage after the one being worked on.
    let mut rest = std::mem::take(&mut p.stages).into_iter();
    let mut si = 0;
    loop {
        if si == p.stages.len() {
            let Some(next) = rest.next() else { break };
            p.stages.push(next);
        }
        let st = p.stages[si].clone();
        // An attention stage is one operator (`crate::flash`), computed by a nest of its own.
        if crate::flash::is_attention(p, si) {
            si += 1;
            continue;
        }
        let Some((r, enclosing)) = find_nested(p, st.value, true, &mut Vec::new()) else {
            si += 1;
            continue;
        };
        // New stage variables: axes, enclosing reduction variables, then the
        // variables of the reductions in `r` (not those of other reductions
        // of the stage: every variable past the axes is a loop of the stage).
        // Only the axes and enclosing variables the reduction reads index it:
        // a zero point's `sum[k](W[j, k])` inside a product's `C[i, j]` is
        // one sum per `j`, not one per `(i, j)` (all of them if it reads none,
        // so that the new tensor has a dimension).
        let outer: Vec<VarId> = (0..st.n_axes as VarId).chain(enclosing.iter().copied()).collect();
        let used: Vec<VarId> = outer.iter().copied().filter(|&v| crate::analysis::involves(p, r, v)).collect();
        let indexed = if used.is_empty() { outer } else { used };
        let mut order: Vec<VarId> = indexed.clone();
        order.extend(reduce_vars(p, r).into_iter().filter(|v| !enclosing.contains(v)));
        let rename: HashMap<VarId, VarId> = order.iter().enumerate().map(|(new, &old)| (old, new as VarId)).collect();
        let vars: Vec<VarDecl> = order.iter().map(|&v| st.vars[v as usize].clone()).collect();
        let n_axes = indexed.len();
        let value = subst(p, r, &HashMap::new(), &rename);
        let elem = match p.ty(r) {
            Ty::Elem(e) => e,
            Ty::Index => ElemType::I64,
        };
        let shape: Vec<i64> = vars[..n_axes].iter().map(|v| v.extent).collect();
        let prefix = format!("{}.r", p.tensor(st.tensor).name);
        let k = p.count_tensor_names_starting_with(&prefix);
        let name = format!("{}.r{k}", p.tensor(st.tensor).name);
        let span = p.span(r);
        p.tensors.push(TensorDecl { name, elem, shape, role: TensorRole::Temp, span });
        let t = TensorId(p.tensors.len() as u32 - 1);
        // An exact-integer (`Index`) reduction becomes an i64 reduction of i64
        // terms: the new stage's value must *be* the reduction (a cast around
        // it would leave it nested, and hoisting would never end).
        let value = match p.expr(value).clone() {
            TExpr::Reduce(op, rv, body) if p.ty(value) == Ty::Index => {
                let body = p.alloc(TExpr::Cast(body), Ty::Elem(elem), span);
                p.alloc(TExpr::Reduce(op, rv, body), Ty::Elem(elem), span)
            }
            _ => value,
        };
        // The old stage reads the new tensor where the reduction was.
        let idx: Vec<TExprId> = indexed.iter().map(|&v| p.alloc(TExpr::Var(v), Ty::Index, span)).collect();
        let load = p.alloc(TExpr::Load(t, idx), Ty::Elem(elem), span);
        let replacement = if p.ty(r) == Ty::Elem(elem) { load } else { p.alloc(TExpr::Cast(load), p.ty(r), span) };
        p.exprs[r.0 as usize] = p.exprs[replacement.0 as usize].clone();
        p.tys[r.0 as usize] = p.tys[replacement.0 as usize];
        // The old stage keeps the variables of the reductions it still has.
        let kept: Vec<VarId> = (0..st.n_axes as VarId).chain(reduce_vars(p, st.value)).collect();
        if kept.len() < st.vars.len() {
            let rename: HashMap<VarId, VarId> =
                kept.iter().enumerate().map(|(new, &old)| (old, new as VarId)).collect();
            let value = subst(p, st.value, &HashMap::new(), &rename);
            let old = &mut p.stages[si];
            old.vars = kept.iter().map(|&v| st.vars[v as usize].clone()).collect();
            old.value = value;
        }
        let at = cheaper_first(p, si, value, &vars, st.tensor);
        p.stages.insert(at, Stage { tensor: t, vars, n_axes, value, span: st.span });
        // Re-examine the new stage (it may hold further nested reductions), then the old one.
        si = si.min(at);
    }
}

/// Where a reduction hoisted out of the stage at `si` (value `value` over
/// `vars`) goes: just before that stage, or before the reductions hoisted
/// out of it earlier that do more work and that it does not read, so that
/// the costliest one is last. Its epilogue (the old stage) then follows
/// the product it belongs to: a quantized product's `sum[k](A·W) −
/// za · sum[k](W)` computes the weights' sums first, and the product's
/// register block stores the result.
fn cheaper_first(p: &Program, si: usize, value: TExprId, vars: &[VarDecl], owner: TensorId) -> usize {
    // Work as iterations: the terms of a sum are alike here (products, or loads).
    let work = |vars: &[VarDecl]| -> f64 { vars.iter().map(|v| v.extent as f64).product() };
    let sibling = |st: &Stage| {
        let prefix = format!("{}.r", p.tensor(owner).name);
        p.tensor(st.tensor).name.strip_prefix(&prefix).is_some_and(|k| k.parse::<u32>().is_ok())
    };
    let mut at = si;
    while at > 0 {
        let prev = &p.stages[at - 1];
        let reads_prev = crate::strategy::loads(p, value, prev.tensor);
        if !sibling(prev) || reads_prev || work(&prev.vars) <= work(vars) {
            break;
        }
        at -= 1;
    }
    at
}

/// `e` with node `old` replaced by `new` (the nodes on the way rebuilt,
/// the rest shared).
pub(crate) fn replace_node(p: &mut Program, e: TExprId, old: TExprId, new: TExprId) -> TExprId {
    if e == old {
        return new;
    }
    let children = p.children(e);
    let replaced: Vec<TExprId> = children.iter().map(|&c| replace_node(p, c, old, new)).collect();
    if replaced == children {
        return e;
    }
    with_children(p, e, replaced)
}

/// Inline stage `si` (pure, a temporary) into all later stages.
pub fn inline_stage(p: &mut Program, si: usize) {
    let later: Vec<usize> = (si + 1..p.stages.len()).collect();
    inline_stage_into(p, si, &later)
}

/// [`inline_stage`] walking only the later stages `readers` (by their
/// index before the removal): the readers of stage `si`'s tensor, by an
/// index the caller keeps (`strategy::Reads`). Walking every later stage
/// for each inlined one made inlining quadratic in a model's stages.
pub fn inline_stage_into(p: &mut Program, si: usize, readers: &[usize]) {
    inline_stage_in_place(p, si, readers);
    p.stages.remove(si);
}

/// [`inline_stage_into`] leaving stage `si` where it is, for the caller to
/// drop with the others it inlines ([`drop_stages`]): a pass that removed
/// each stage as it inlined it moved every later stage each time (6 400
/// of 16 000 stages inlined at 800 blocks of `benches/compile_scaling.py`).
pub fn inline_stage_in_place(p: &mut Program, si: usize, readers: &[usize]) {
    let st = p.stages[si].clone();
    for &ci in readers {
        debug_assert!(ci > si, "a reader comes after the stage inlined into it");
        let value = p.stages[ci].value;
        replace_loads(p, value, &st);
    }
}

/// `p` without the stages `dead` marks (by index), in one pass.
pub fn drop_stages(p: &mut Program, dead: &[bool]) {
    debug_assert_eq!(dead.len(), p.stages.len());
    let stages = std::mem::take(&mut p.stages);
    p.stages = stages.into_iter().zip(dead).filter(|(_, &gone)| !gone).map(|(st, _)| st).collect();
}

fn replace_loads(p: &mut Program, e: TExprId, st: &Stage) {
    for c in p.children(e) {
        replace_loads(p, c, st);
    }
    if let TExpr::Load(t, idx) = p.expr(e).clone() {
        if t == st.tensor {
            let vars: HashMap<VarId, TExprId> = idx.iter().enumerate().map(|(a, &i)| (a as VarId, i)).collect();
            let copy = subst(p, st.value, &vars, &HashMap::new());
            let copy = rounded_as_stored(p, copy, p.tensor(st.tensor).elem);
            p.exprs[e.0 as usize] = p.exprs[copy.0 as usize].clone();
        }
    }
}

/// `e`, the value of a temporary of element type `elem`, as the temporary
/// held it: cast to `elem` where that is a float type and `e` may hold more
/// than it ([`holds_its_type`]). An `f32` temporary `T = a · s1 + b · s2`
/// read by `round(f32(T / s3))` (ONNX's dequantized residual sum,
/// requantized) gave outputs a step off the interpreter's when inlined
/// uncast: the interpreter computed the sum in f64, the code in f32 with a
/// fused multiply-add.
fn rounded_as_stored(p: &mut Program, e: TExprId, elem: ElemType) -> TExprId {
    // The interpreter computes f64 in f64: nothing to round.
    if !elem.is_float() || elem == ElemType::F64 || holds_its_type(p, e) {
        return e;
    }
    let span = p.span(e);
    p.alloc(TExpr::Cast(e), Ty::Elem(elem), span)
}

/// Whether `e`'s value is one of its type's values without rounding: a
/// load, a cast, a literal, a run-time scalar, or a choice among such
/// values (a select, `max`, `min`, `clamp`, a negation, `abs`: a padded
/// read, a ReLU).
fn holds_its_type(p: &Program, e: TExprId) -> bool {
    let all = |args: &[TExprId]| args.iter().all(|&a| holds_its_type(p, a));
    match p.expr(e) {
        TExpr::Load(..) | TExpr::Cast(_) | TExpr::Float(_) | TExpr::Int(_) | TExpr::Scalar(_) => true,
        TExpr::Select(_, a, b) => all(&[*a, *b]),
        TExpr::Math(MathFn::Max | MathFn::Min | MathFn::Clamp | MathFn::Abs, args) => all(args),
        TExpr::Unary(UnOp::Neg, a) => all(&[*a]),
        _ => false,
    }
}

/// Replace `e / k` and `e % k` in stage `si` by `X` and `Y` where
/// `e = k·X + Y` with `Y` provably in `[0, k)` over the variables' extents:
/// `group_norm`'s statistics read as `mu[n, (g·Cg + c) / Cg]` inside a sum
/// over `c < Cg` are `mu[n, g]`, the same in every term. Where no such split
/// exists but one by a divisor `g` of `k` does (`e = g·X + Y`, `0 ≤ Y < g`),
/// `e / k` is `X / (k/g)` and `e % k` is `(X % (k/g))·g + Y`: a channel
/// shuffle's `(784·c + 28·y + x) / 1568` is `c / 2`, one value per row
/// instead of a division per lane. Inner divisions are simplified first, so
/// `((784·c + 28·y + x) / 28) % 28` becomes `y`. Floor semantics, so the
/// rewrites hold for every value, negative ones included.
pub fn simplify_div_mod(p: &mut Program, si: usize) {
    rewrite_value(p, si, simplify_div_mod_in)
}

/// Stage `si`'s value rewritten by `f`, which is given its variables' extents.
fn rewrite_value(p: &mut Program, si: usize, f: fn(&mut Program, TExprId, &[i64]) -> TExprId) {
    let extents: Vec<i64> = p.stages[si].vars.iter().map(|v| v.extent).collect();
    let value = p.stages[si].value;
    let value = f(p, value, &extents);
    p.stages[si].value = value;
}

fn simplify_div_mod_in(p: &mut Program, e: TExprId, extents: &[i64]) -> TExprId {
    let children = p.children(e);
    let new: Vec<TExprId> = children.iter().map(|&c| simplify_div_mod_in(p, c, extents)).collect();
    let e = with_children(p, e, new);
    if let TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) = p.expr(e).clone() {
        if let (&TExpr::Int(k), Ty::Index) = (p.expr(b), p.ty(e)) {
            if let Some(split) = split_by(p, a, k, extents) {
                return div_mod_of_split(p, op, &split, extents, p.span(e));
            }
        }
    }
    e
}

/// Replace the index comparisons of stage `si` that its variables' extents
/// decide by `true` or `false`, and fold the `&&`, `||`, `!` and `select`s
/// over them: a max pool without padding bounds its window as a padded one
/// would (`h·2 + r < 111` for `h < 55`, `r < 3`), a guard per lane that
/// also keeps its strided loads from running as plain loads.
pub fn fold_decided_conditions(p: &mut Program, si: usize) {
    rewrite_value(p, si, fold_conditions_in)
}

fn fold_conditions_in(p: &mut Program, e: TExprId, extents: &[i64]) -> TExprId {
    let children = p.children(e);
    let new: Vec<TExprId> = children.iter().map(|&c| fold_conditions_in(p, c, extents)).collect();
    let e = with_children(p, e, new);
    let known = |p: &Program, c: TExprId| match p.expr(c) {
        TExpr::Int(k) if p.ty(c) == Ty::Elem(ElemType::Bool) => Some(*k != 0),
        _ => None,
    };
    let decided = match *p.expr(e) {
        TExpr::Binary(op, a, b) if op.is_comparison() && p.ty(a) == Ty::Index => {
            decide_comparison(p, op, a, b, extents)
        }
        TExpr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
            // `x && true` is `x`, `x && false` is `false` (and dually for `||`).
            let absorbing = op == BinOp::Or;
            match (known(p, a), known(p, b)) {
                (Some(x), _) | (_, Some(x)) if x == absorbing => Some(absorbing),
                (Some(_), _) => return b,
                (_, Some(_)) => return a,
                _ => None,
            }
        }
        TExpr::Unary(UnOp::Not, a) => known(p, a).map(|x| !x),
        TExpr::Select(c, a, b) => match known(p, c) {
            Some(x) => return if x { a } else { b },
            None => None,
        },
        _ => None,
    };
    match decided {
        Some(x) => p.alloc(TExpr::Int(x as i64), Ty::Elem(ElemType::Bool), p.span(e)),
        None => e,
    }
}

/// Whether `a op b` holds at every point, fails at every point, or either.
fn decide_comparison(p: &Program, op: BinOp, a: TExprId, b: TExprId, extents: &[i64]) -> Option<bool> {
    let var = |v: VarId| match extents.get(v as usize) {
        Some(&n) if n > 0 => crate::interval::range(0, n as i128 - 1),
        _ => crate::interval::ANY,
    };
    let d = crate::interval::of(p, a, &var).add(crate::interval::of(p, b, &var).neg());
    let (lo, hi) = (d.lo?, d.hi?);
    let always = match op {
        BinOp::Lt => hi < 0,
        BinOp::Le => hi <= 0,
        BinOp::Gt => lo > 0,
        BinOp::Ge => lo >= 0,
        BinOp::Eq => lo == 0 && hi == 0,
        BinOp::Ne => lo > 0 || hi < 0,
        _ => false,
    };
    let never = match op {
        BinOp::Lt => lo >= 0,
        BinOp::Le => lo > 0,
        BinOp::Gt => hi <= 0,
        BinOp::Ge => hi < 0,
        BinOp::Eq => lo > 0 || hi < 0,
        BinOp::Ne => lo == 0 && hi == 0,
        _ => false,
    };
    (always || never).then_some(always)
}

/// `e / k` (`op` = FloorDiv) or `e % k` of `e = g·high + low`, `k = g·m`.
fn div_mod_of_split(p: &mut Program, op: BinOp, s: &Split, extents: &[i64], span: texc_grammar::Span) -> TExprId {
    let high = build_affine(p, &s.high, span);
    if s.m == 1 {
        return if op == BinOp::FloorDiv { high } else { build_affine(p, &s.low, span) };
    }
    // `high` is smaller than `e` by a factor of `g`: the recursion ends.
    let m = p.alloc(TExpr::Int(s.m), Ty::Index, span);
    let inner = p.alloc(TExpr::Binary(op, high, m), Ty::Index, span);
    let inner = simplify_div_mod_in(p, inner, extents);
    if op == BinOp::FloorDiv {
        return inner;
    }
    let g = p.alloc(TExpr::Int(s.g), Ty::Index, span);
    let scaled = p.alloc(TExpr::Binary(BinOp::Mul, inner, g), Ty::Index, span);
    if s.low.terms.is_empty() && s.low.c == 0 {
        return scaled;
    }
    let low = build_affine(p, &s.low, span);
    p.alloc(TExpr::Binary(BinOp::Add, scaled, low), Ty::Index, span)
}

/// `e` with its children replaced by `new` (`e` itself when they are the same).
pub(crate) fn with_children(p: &mut Program, e: TExprId, new: Vec<TExprId>) -> TExprId {
    if new == p.children(e) {
        return e;
    }
    let node = match p.expr(e).clone() {
        TExpr::Load(t, _) => TExpr::Load(t, new),
        TExpr::Unary(op, _) => TExpr::Unary(op, new[0]),
        TExpr::Binary(op, ..) => TExpr::Binary(op, new[0], new[1]),
        TExpr::Select(..) => TExpr::Select(new[0], new[1], new[2]),
        TExpr::Math(f, _) => TExpr::Math(f, new),
        TExpr::Intrinsic(i, _) => TExpr::Intrinsic(i, new),
        TExpr::Cast(_) => TExpr::Cast(new[0]),
        TExpr::Reduce(op, rv, _) => TExpr::Reduce(op, rv, new[0]),
        leaf => leaf,
    };
    let (ty, span) = (p.ty(e), p.span(e));
    p.alloc(node, ty, span)
}

/// A float division whose divisor is a loaded value that does not vary
/// along the stage's innermost axis (a softmax's `e[n, d] / s[n]`; with
/// `any`, every such divisor, a normalization's `/ sqrt(v[n] + eps)` too)
/// becomes a multiplication by the divisor's reciprocal, computed by a stage
/// of its own over the other axes (`Y.inv[n] = 1 / s[n]`, which the default
/// schedule computes inside the row's loop): one division per row instead
/// of a vector division per element (softmax 4096×1024, 1 thread: AVX2
/// 3.88 → 3.64 ms, AVX-512 3.13 → 2.99 ms; layer_norm's square roots gained
/// nothing, so `any` is the tuner's to try). The result is rounded twice
/// instead of once (within about an ulp), as FMA contraction and [`rfactor`]
/// change rounding. Pure f32/f64 stages of two or more axes; constant
/// divisors stay as written. Returns whether it inserted a stage before `si`
/// (the stage itself is then at `si + 1`).
pub fn reciprocal_divisors(p: &mut Program, si: usize, any: bool) -> bool {
    let st = p.stages[si].clone();
    let float_out = matches!(p.tensor(st.tensor).elem, ElemType::F32 | ElemType::F64);
    if st.n_axes < 2 || !float_out || contains_reduce(p, st.value) {
        return false;
    }
    // A stage of reciprocals (this pass's own) stays one.
    if let TExpr::Binary(BinOp::Div, one, _) = *p.expr(st.value) {
        if matches!(p.expr(one), TExpr::Float(x) if *x == 1.0) {
            return false;
        }
    }
    let inner = st.n_axes as VarId - 1;
    let Some((div, b)) = row_invariant_division(p, st.value, inner) else { return false };
    if !any && !matches!(p.expr(b), TExpr::Load(..)) {
        return false;
    }
    let (ty, span) = (p.ty(div), p.span(div));
    let Ty::Elem(elem) = ty else { return false };
    let name = fresh_name(p, &format!("{}.inv", p.tensor(st.tensor).name));
    let shape: Vec<i64> = st.vars[..st.n_axes - 1].iter().map(|v| v.extent).collect();
    p.tensors.push(TensorDecl { name, elem, shape, role: TensorRole::Temp, span });
    let t = TensorId(p.tensors.len() as u32 - 1);
    let one = p.alloc(TExpr::Float(1.0), ty, span);
    let b = subst(p, b, &HashMap::new(), &HashMap::new());
    let reciprocal = p.alloc(TExpr::Binary(BinOp::Div, one, b), ty, span);
    let idx: Vec<TExprId> = (0..inner).map(|v| p.alloc(TExpr::Var(v), Ty::Index, span)).collect();
    let load = p.alloc(TExpr::Load(t, idx), ty, span);
    let value = replace_division(p, st.value, div, load);
    p.stages[si].value = value;
    let vars = st.vars[..st.n_axes - 1].to_vec();
    p.stages.insert(si, Stage { tensor: t, n_axes: vars.len(), vars, value: reciprocal, span });
    true
}

/// `base`, or `base` with the first number that makes it a name no tensor of `p` has.
pub fn fresh_name(p: &Program, base: &str) -> String {
    p.fresh_tensor_name(base)
}

/// The first float division in `e` (and its divisor) whose divisor does not
/// vary along `inner` and is not a constant. Only through float arithmetic
/// that is evaluated at every point and whose result moves continuously
/// with its operands: not into the branches of a `select` (a guarded read
/// would be read unguarded in the reciprocals' stage), comparisons, casts,
/// indices or rounding (an ulp there can flip a result).
fn row_invariant_division(p: &Program, e: TExprId, inner: VarId) -> Option<(TExprId, TExprId)> {
    if !matches!(p.ty(e), Ty::Elem(ElemType::F32 | ElemType::F64)) {
        return None;
    }
    let operands = match p.expr(e) {
        TExpr::Binary(BinOp::Div, a, b) => {
            if !varies_along(p, *b, inner) && !is_constant(p, *b) {
                return Some((e, *b));
            }
            vec![*a, *b]
        }
        TExpr::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul, a, b) => vec![*a, *b],
        TExpr::Unary(UnOp::Neg, a) => vec![*a],
        TExpr::Math(f, args) if !matches!(f, MathFn::Floor | MathFn::Ceil | MathFn::Round) => args.clone(),
        _ => return None,
    };
    operands.into_iter().find_map(|c| row_invariant_division(p, c, inner))
}

/// `e` with the division `div` (`a / b`) replaced by `a * reciprocal`.
fn replace_division(p: &mut Program, e: TExprId, div: TExprId, reciprocal: TExprId) -> TExprId {
    if e == div {
        let TExpr::Binary(BinOp::Div, a, _) = *p.expr(e) else { unreachable!("a division") };
        let (ty, span) = (p.ty(e), p.span(e));
        return p.alloc(TExpr::Binary(BinOp::Mul, a, reciprocal), ty, span);
    }
    let new: Vec<TExprId> = p.children(e).iter().map(|&c| replace_division(p, c, div, reciprocal)).collect();
    with_children(p, e, new)
}

fn varies_along(p: &Program, e: TExprId, v: VarId) -> bool {
    matches!(p.expr(e), TExpr::Var(x) if *x == v) || p.children(e).into_iter().any(|c| varies_along(p, c, v))
}

fn is_constant(p: &Program, e: TExprId) -> bool {
    match p.expr(e) {
        TExpr::Int(_) | TExpr::Float(_) => true,
        TExpr::Var(_) | TExpr::Scalar(_) | TExpr::Load(..) | TExpr::Reduce(..) => false,
        _ => p.children(e).into_iter().all(|c| is_constant(p, c)),
    }
}

/// `e = g·high + low` with `0 ≤ low < g` and `g·m = k` (`g > 1` unless `k = 1`).
struct Split {
    g: i64,
    m: i64,
    high: Affine<VarId>,
    low: Affine<VarId>,
}

/// A split of `e` (affine in the stage's variables) by `k` itself when one
/// exists, else by the largest divisor `g` of `k` that the terms with the
/// largest coefficients share while the others stay below it.
fn split_by(p: &Program, e: TExprId, k: i64, extents: &[i64]) -> Option<Split> {
    if k <= 0 {
        return None;
    }
    let form = texc_compiler::affine::affine_in_vars(p, e)?;
    let candidates = crate::index::divisor_candidates(k as i128, form.terms.values().copied());
    candidates.into_iter().find_map(|g| split_exactly(&form, g, extents)).map(|(g, high, low)| {
        let g = g as i64;
        Split { g, m: k / g, high, low }
    })
}

/// `(g, X, Y)` with `form = g·X + Y` and `0 ≤ Y < g` over the variables' extents.
fn split_exactly(form: &Affine<VarId>, g: i128, extents: &[i64]) -> Option<(i128, Affine<VarId>, Affine<VarId>)> {
    let (mut x, mut y) = (Affine::constant(form.c.div_euclid(g)), Affine::constant(form.c.rem_euclid(g)));
    let mut y_max = y.c;
    for (&v, &coeff) in &form.terms {
        let (q, r) = (coeff.div_euclid(g), coeff.rem_euclid(g));
        x = x.add(&Affine::atom(v).scale(q)?, 1)?;
        y = y.add(&Affine::atom(v).scale(r)?, 1)?;
        y_max = y_max.checked_add(r.checked_mul(i128::from(*extents.get(v as usize)?).checked_sub(1)?)?)?;
    }
    (y_max < g).then_some((g, x, y))
}

fn build_affine(p: &mut Program, a: &Affine<VarId>, span: texc_grammar::Span) -> TExprId {
    let mut acc = (a.c != 0 || a.terms.is_empty()).then(|| p.alloc(TExpr::Int(a.c as i64), Ty::Index, span));
    for (&v, &coeff) in &a.terms {
        let var = p.alloc(TExpr::Var(v), Ty::Index, span);
        let term = if coeff == 1 {
            var
        } else {
            let k = p.alloc(TExpr::Int(coeff as i64), Ty::Index, span);
            p.alloc(TExpr::Binary(BinOp::Mul, k, var), Ty::Index, span)
        };
        acc = Some(match acc {
            Some(s) => p.alloc(TExpr::Binary(BinOp::Add, s, term), Ty::Index, span),
            None => term,
        });
    }
    acc.expect("a constant or a term")
}

/// Fuse the innermost reduction variables of stage `si` while they walk
/// every read as one dense variable (see [`crate::analysis::dense_pair`]):
/// `sum[h, w](X[n, c, h, w])` becomes `sum[hw < H·W](X[n, c, hw / W, hw % W])`,
/// one long row that [`rfactor`] can vectorize where `w` alone is too short.
/// The order of the terms does not change. Returns whether it fused.
pub fn fuse_dense_reductions(p: &mut Program, si: usize) -> bool {
    let mut fused = false;
    loop {
        let st = p.stages[si].clone();
        let TExpr::Reduce(op, rvars, body) = p.expr(st.value).clone() else { return fused };
        let [.., a, b] = rvars[..] else { return fused };
        // Only the stage's last two variables: no other variable is renumbered.
        let n = st.vars.len() as VarId;
        if (a, b) != (n - 2, n - 1) || (a as usize) < st.n_axes {
            return fused;
        }
        let mut loads = Vec::new();
        crate::analysis::loads_in(p, body, &mut loads);
        let wb = st.vars[b as usize].extent;
        if !crate::analysis::dense_pair(p, body, &loads, (a, b), wb) {
            return fused;
        }
        let span = st.span;
        let av = p.alloc(TExpr::Var(a), Ty::Index, span);
        let w = p.alloc(TExpr::Int(wb), Ty::Index, span);
        let hi = p.alloc(TExpr::Binary(BinOp::FloorDiv, av, w), Ty::Index, span);
        let lo = p.alloc(TExpr::Binary(BinOp::FloorMod, av, w), Ty::Index, span);
        let body = subst(p, body, &HashMap::from([(a, hi), (b, lo)]), &HashMap::new());
        let value =
            p.alloc(TExpr::Reduce(op, rvars[..rvars.len() - 1].to_vec(), body), p.ty(st.value), p.span(st.value));
        let stage = &mut p.stages[si];
        stage.vars.pop();
        let fused_var = &mut stage.vars[a as usize];
        fused_var.name = format!("{}.{}", fused_var.name, st.vars[b as usize].name);
        fused_var.extent *= wb;
        stage.value = value;
        fused = true;
    }
}

/// Factor a row reduction so that it vectorizes (TVM's `rfactor`):
///
/// ```text
/// T[s] = op[r < E](body(r))
///   ⇒  T.rf[s, l < L] = op[q < ⌈E/L⌉](select(q·L + l < E, body(q·L + l), identity))
///      T[s]          = op[l < L](T.rf[s, l])
/// ```
///
/// The `L` partial results are independent, so the first stage runs with
/// `l` as a vector of lanes; reassociating the reduction changes float
/// rounding only. Applies to stages whose value is one reduction over one
/// variable; returns whether it did.
pub fn rfactor(p: &mut Program, si: usize, lanes: i64) -> bool {
    let st = p.stages[si].clone();
    let TExpr::Reduce(op, rvars, body) = p.expr(st.value).clone() else { return false };
    let [r] = rvars[..] else { return false };
    let elem = p.tensor(st.tensor).elem;
    let Ty::Elem(_) = p.ty(st.value) else { return false };
    let extent = st.vars[r as usize].extent;
    if extent < 2 * lanes || st.vars.len() != st.n_axes + 1 {
        return false;
    }
    let span = st.span;
    let n = st.n_axes as VarId;
    let (l, q) = (n, n + 1);
    let outer = (extent + lanes - 1) / lanes;
    // r = q·L + l
    let qv = p.alloc(TExpr::Var(q), Ty::Index, span);
    let lk = p.alloc(TExpr::Int(lanes), Ty::Index, span);
    let lv = p.alloc(TExpr::Var(l), Ty::Index, span);
    let ql = p.alloc(TExpr::Binary(BinOp::Mul, qv, lk), Ty::Index, span);
    let rexpr = p.alloc(TExpr::Binary(BinOp::Add, ql, lv), Ty::Index, span);
    let term = subst(p, body, &HashMap::from([(r, rexpr)]), &HashMap::new());
    let term = if extent % lanes == 0 {
        term
    } else {
        let e = p.alloc(TExpr::Int(extent), Ty::Index, span);
        let cond = p.alloc(TExpr::Binary(BinOp::Lt, rexpr, e), Ty::Elem(ElemType::Bool), span);
        let id = p.alloc(TExpr::reduce_identity(op, Ty::Elem(elem)), p.ty(st.value), span);
        p.alloc(TExpr::Select(cond, term, id), p.ty(st.value), span)
    };
    let partial = p.alloc(TExpr::Reduce(op, vec![q], term), p.ty(st.value), span);
    let mut shape: Vec<i64> = st.vars[..st.n_axes].iter().map(|v| v.extent).collect();
    shape.push(lanes);
    let name = format!("{}.rf", p.tensor(st.tensor).name);
    p.tensors.push(TensorDecl { name, elem, shape, role: TensorRole::Temp, span });
    let t = TensorId(p.tensors.len() as u32 - 1);
    let mut vars: Vec<VarDecl> = st.vars[..st.n_axes].to_vec();
    vars.push(VarDecl { name: format!("{}.l", st.vars[r as usize].name), extent: lanes });
    vars.push(VarDecl { name: format!("{}.q", st.vars[r as usize].name), extent: outer });
    // The final reduction over the lanes.
    let idx: Vec<TExprId> = (0..=n).map(|v| p.alloc(TExpr::Var(v), Ty::Index, span)).collect();
    let load = p.alloc(TExpr::Load(t, idx), Ty::Elem(elem), span);
    let total = p.alloc(TExpr::Reduce(op, vec![n], load), p.ty(st.value), span);
    let mut final_vars: Vec<VarDecl> = st.vars[..st.n_axes].to_vec();
    final_vars.push(VarDecl { name: format!("{}.l", st.vars[r as usize].name), extent: lanes });
    p.stages[si] = Stage { tensor: st.tensor, vars: final_vars, n_axes: st.n_axes, value: total, span };
    p.stages.insert(si, Stage { tensor: t, vars, n_axes: st.n_axes + 1, value: partial, span });
    true
}

/// A one-hot sum ([`Stage::one_hot`], how `.tex` writes `embedding`,
/// whose index is data) is a gather:
///
/// ```text
/// Y[a..] = sum[v < V](select(e == T(v), body(v), 0))   (e does not involve v)
///   ⇒ Y[a..] = select(0 <= e && e < V, body(clamp(e, 0, V - 1)), 0)
/// ```
///
/// Exactly one term of the sum is the body where `e` is in range, none
/// otherwise, so the result is the same (up to the sign of a zero); O(1)
/// per element instead of O(V). Returns whether stage `si` was rewritten.
pub fn one_hot_gather(p: &mut Program, si: usize) -> bool {
    let st = p.stages[si].clone();
    let Some(OneHot { var, extent, index: e, hit, miss }) = st.one_hot(p) else { return false };
    let (span, ety) = (st.span, p.ty(e));
    let bool_ty = Ty::Elem(ElemType::Bool);
    let lo = p.alloc(TExpr::Int(0), ety, span);
    let hi = p.alloc(TExpr::Int(extent), ety, span);
    let last = p.alloc(TExpr::Int(extent - 1), ety, span);
    let above = p.alloc(TExpr::Binary(BinOp::Ge, e, lo), bool_ty, span);
    let below = p.alloc(TExpr::Binary(BinOp::Lt, e, hi), bool_ty, span);
    let inside = p.alloc(TExpr::Binary(BinOp::And, above, below), bool_ty, span);
    let clamped = p.alloc(TExpr::Math(MathFn::Clamp, vec![e, lo, last]), ety, span);
    let index = p.alloc(TExpr::Cast(clamped), Ty::Index, span);
    let picked = subst(p, hit, &HashMap::from([(var, index)]), &HashMap::new());
    let value = p.alloc(TExpr::Select(inside, picked, miss), p.ty(st.value), p.span(st.value));
    let stage = &mut p.stages[si];
    stage.vars.pop();
    stage.value = value;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(p: &mut Program, name: &str) {
        let span = Default::default();
        p.tensors.push(TensorDecl {
            name: name.into(),
            elem: ElemType::F32,
            shape: vec![1],
            role: TensorRole::Temp,
            span,
        });
    }

    /// The index of names answers as a scan of every tensor's name would,
    /// names borne twice and tensors appended after a query included.
    #[test]
    fn names_answer_as_a_scan_would() {
        let mut p = Program::default();
        for n in ["C", "C.r0", "C.r0", "C.rows", "Cr", "D.acc", "B.r1"] {
            push(&mut p, n);
        }
        assert_eq!(p.count_tensor_names_starting_with("C.r"), 3);
        assert_eq!(p.count_tensor_names_starting_with("C"), 5);
        assert_eq!(p.count_tensor_names_starting_with("E"), 0);
        assert_eq!(fresh_name(&p, "D.acc"), "D.acc1");
        assert_eq!(fresh_name(&p, "C.acc"), "C.acc");
        push(&mut p, "C.r1");
        push(&mut p, "D.acc1");
        assert_eq!(p.count_tensor_names_starting_with("C.r"), 4);
        assert_eq!(fresh_name(&p, "D.acc"), "D.acc2");
        let q = p.clone();
        push(&mut p, "D.acc2");
        assert_eq!(fresh_name(&p, "D.acc"), "D.acc3");
        assert_eq!(fresh_name(&q, "D.acc"), "D.acc2", "a clone has its own index");
        for (base, fresh) in [("C", "C1"), ("C.r0", "C.r01"), ("Z", "Z")] {
            assert_eq!(fresh_name(&p, base), fresh);
        }
    }
}
