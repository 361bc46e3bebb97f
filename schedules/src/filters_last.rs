//! Products over short rows computed with their filters innermost: a
//! TIR-to-TIR pass for CPU targets, after [`crate::dot4`].
//!
//! The default schedule runs a product's vectors along its row: its last
//! axis, a convolution's output row `x` of `Y[n, f, y, x]`, with the axes
//! before it fused where every read walks them densely (a 1×1
//! convolution's `h, w`). On a 7×7 map a 3×3 convolution's row is 7 lanes of
//! a 16-lane `vpdpbusd` (MEASURED: ResNet-18's last stage in int8 ran at
//! 385 GOP/s, against 960 for the same layer at 56×56, a third of the
//! model's time); a 17-wide row is 16 lanes and 1 (Inception-v3's 1×7
//! convolutions at 17×17). Where the row fills less than [`MIN_FILL`] of
//! its vectors and another axis `f` fills them well, and the product's
//! operands that move along the row do not move along `f` (the input, which
//! the filters then share), the stage computes `Y.t[n, y, x, f]` — its
//! value unchanged, its axes reordered so that `f` is last — and the
//! original stage becomes a copy, `Y[n, f, y, x] = Y.t[n, y, x, f]`. The
//! operands that move along `f` (the filters `W[f, c, r, s]`, or the packed
//! `W.q4`) are read from a copy with that dimension last (`W.f[c, r, s, f]`),
//! made by a stage of its own: only constants (folded, so moved once) and
//! `@dot4`'s packed operands (made on every call anyway) are moved. The
//! register block then runs vectors along `f`, rows along `x`, and packs
//! the filters into panels, as for a matrix product.
//!
//! The copy back is a pass over the output: a float product is computed so
//! only where each output sums at least [`MIN_FLOAT_DEPTH`] products, the
//! copy a small share of its work (a conservative bound, not tuned; of the
//! zoo's float models, those that change — Inception-v3 1.14× faster,
//! MobileNetV3-Large, EfficientNet-B0, DenseNet-121 — run within noise or
//! faster). Integer products have no other plan (the importer writes them
//! as one statement; f32 convolutions also have the e-graph's
//! `conv2d_im2col_t`), and are moved whatever their depth.
//!
//! Invariants: the program computes the same values (the same expression
//! per output element, each written once; the copies move values only);
//! stages stay in an order where every tensor is written before it is read;
//! operator records' stage ranges move with the inserted stages.

use crate::analysis::involves;
use crate::normalize::{fresh_name, replace_node, subst};
use crate::prepack::insert_stage;
use std::collections::HashMap;
use texc_compiler::ops::{BinOp, Intrinsic, ReduceOp};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

/// The share of its vectors' lanes below which a row is short (7 of 16: 0.44;
/// 14 of 16 and 28 of 32 are kept), and above which an axis fills them well.
pub const MIN_FILL: f64 = 0.75;

/// Products per output from which a float product is computed filters-last.
pub const MIN_FLOAT_DEPTH: i64 = 512;

/// Compute every short-row product of `p` filters-last; the number of
/// stages changed. `movable` says which operands may be copied with a
/// dimension moved last: those a copy costs nothing per run (constants,
/// folded), or `@dot4`'s packed operands (made on every call anyway).
pub fn filters_last(p: &mut Program, target: &Target, movable: &dyn Fn(TensorId) -> bool) -> usize {
    if target.kind != TargetKind::Cpu {
        return 0;
    }
    let mut made: Vec<(TensorId, usize, TensorId)> = Vec::new();
    let mut changed = 0;
    let mut si = 0;
    while si < p.stages.len() {
        // A convolution of one group reads channel `k / K * Cg + c`, which
        // involves the filter `k` until simplified to `c`.
        if product_body(p, p.stages[si].value).is_some() {
            crate::normalize::simplify_div_mod(p, si);
        }
        if let Some(f) = long_axis(p, si, target, movable) {
            si = rewrite(p, si, f, &mut made);
            changed += 1;
        }
        si += 1;
    }
    changed
}

/// How many of `vectors` of `lanes` a row of `extent` fills.
fn fill(extent: i64, lanes: i64) -> f64 {
    extent as f64 / ((extent + lanes - 1) / lanes * lanes) as f64
}

/// The axis `f` to put last in stage `si`, if the stage is a short-row
/// product (see the module header).
fn long_axis(p: &Program, si: usize, target: &Target, movable: &dyn Fn(TensorId) -> bool) -> Option<usize> {
    let st = &p.stages[si];
    let last = st.n_axes.checked_sub(1)?;
    let (body, dot4) = product_body(p, st.value)?;
    let elem = if dot4 { ElemType::I32 } else { p.tensor(st.tensor).elem };
    let lanes = target.lanes(elem) as i64;
    if last == 0 || fill(crate::strategy::default_row(p, target, si), lanes) >= MIN_FILL {
        return None;
    }
    // The copy back is a pass over the output: a float product pays for it
    // only where each output sums many products.
    let depth: i64 = st.vars[st.n_axes..].iter().map(|v| v.extent).product();
    if !dot4 && depth < MIN_FLOAT_DEPTH {
        return None;
    }
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, body, &mut loads);
    let x = last as VarId;
    (0..last).rev().find(|&f| {
        let (fv, ext) = (f as VarId, st.vars[f].extent);
        let along_f: Vec<TExprId> = loads.iter().copied().filter(|&l| involves(p, l, fv)).collect();
        ext >= lanes
            && fill(ext, lanes) >= MIN_FILL
            && !along_f.is_empty()
            && loads.iter().all(|&l| !(involves(p, l, x) && involves(p, l, fv)))
            && along_f.iter().all(|&l| alone_at(p, l, fv).is_some())
            && along_f.iter().all(|&l| {
                // Read with `f` last already, or copied so: constants (and
                // `@dot4`'s packed operands) only.
                let TExpr::Load(t, idx) = p.expr(l) else { return false };
                alone_at(p, l, fv) == Some(idx.len() - 1) || dot4 || movable(*t)
            })
    })
}

/// The body of the stage's sum of products — of `@dot4`s (`true`), or of
/// two loads multiplied, each possibly converted (`false`).
fn product_body(p: &Program, e: TExprId) -> Option<(TExprId, bool)> {
    let strip = |e: TExprId| match p.expr(e) {
        TExpr::Cast(a) => *a,
        _ => e,
    };
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        if let TExpr::Reduce(ReduceOp::Sum, _, body) = p.expr(e) {
            let mut inner = vec![*body];
            while let Some(b) = inner.pop() {
                if matches!(p.expr(b), TExpr::Intrinsic(Intrinsic::Dot4, _)) {
                    return Some((*body, true));
                }
                inner.extend(p.children(b));
            }
            if let TExpr::Binary(BinOp::Mul, a, b) = *p.expr(*body) {
                let loads = [a, b].map(|x| matches!(p.expr(strip(x)), TExpr::Load(..)));
                if loads == [true, true] {
                    return Some((*body, false));
                }
            }
        }
        stack.extend(p.children(e));
    }
    None
}

/// The dimension of load `l` indexed by `Var(v)` alone, where `v` is in no
/// other index.
fn alone_at(p: &Program, l: TExprId, v: VarId) -> Option<usize> {
    let TExpr::Load(_, idx) = p.expr(l) else { return None };
    let plain = |i: TExprId| matches!(p.expr(i), TExpr::Var(x) if *x == v);
    let d = idx.iter().position(|&i| plain(i))?;
    idx.iter().enumerate().all(|(k, &i)| k == d || !involves(p, i, v)).then_some(d)
}

/// Stage `si` computed filters-last along axis `f`; the index of its copy
/// stage (the original tensor's writer), after any inserted stages.
fn rewrite(p: &mut Program, si: usize, f: usize, made: &mut Vec<(TensorId, usize, TensorId)>) -> usize {
    let st = p.stages[si].clone();
    let order: Vec<usize> = (0..st.n_axes).filter(|&d| d != f).chain([f]).collect();
    // Old axis `order[k]` is new axis `k`; reduction variables keep their ids.
    let rename: HashMap<VarId, VarId> = order.iter().enumerate().map(|(k, &d)| (d as VarId, k as VarId)).collect();
    let mut value = subst(p, st.value, &HashMap::new(), &rename);
    let fv = (st.n_axes - 1) as VarId;
    let mut si = si;
    if let Some((body, _)) = product_body(p, value) {
        let mut loads = Vec::new();
        crate::analysis::loads_in(p, body, &mut loads);
        loads.retain(|&l| involves(p, l, fv));
        for l in loads {
            let TExpr::Load(t, idx) = p.expr(l).clone() else { continue };
            let Some(d) = alone_at(p, l, fv).filter(|&d| d + 1 < idx.len()) else { continue };
            let moved = match made.iter().find(|&&(w, dim, _)| w == t && dim == d) {
                Some(&(_, _, m)) => m,
                None => {
                    let m = insert_dim_last(p, si, t, d);
                    si += 1;
                    made.push((t, d, m));
                    m
                }
            };
            let new_idx: Vec<TExprId> = (0..idx.len()).filter(|&k| k != d).chain([d]).map(|k| idx[k]).collect();
            let (ty, span) = (p.ty(l), p.span(l));
            let read = p.alloc(TExpr::Load(moved, new_idx), ty, span);
            value = replace_node(p, value, l, read);
        }
    }
    let decl = p.tensor(st.tensor).clone();
    let name = fresh_name(p, &format!("{}.t", decl.name));
    let shape: Vec<i64> = order.iter().map(|&d| decl.shape[d]).collect();
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape, role: TensorRole::Temp, span: decl.span });
    let t = TensorId(p.tensors.len() as u32 - 1);
    let mut vars: Vec<VarDecl> = order.iter().map(|&d| st.vars[d].clone()).collect();
    vars.extend(st.vars[st.n_axes..].iter().cloned());
    insert_stage(p, si, Stage { tensor: t, vars, n_axes: st.n_axes, value, span: st.span });
    si += 1;
    // The original stage copies the result back: `Y[.., f, .., x] = Y.t[.., x, f]`.
    let span = st.span;
    let idx: Vec<TExprId> = order.iter().map(|&d| p.alloc(TExpr::Var(d as VarId), Ty::Index, span)).collect();
    let copy = p.alloc(TExpr::Load(t, idx), Ty::Elem(decl.elem), span);
    let stage = &mut p.stages[si];
    stage.value = copy;
    stage.vars.truncate(st.n_axes);
    si
}

/// A stage before `at` writing `W.f[.., d_last, d] = W[.., d, .., d_last]`:
/// `w` with dimension `d` moved last.
fn insert_dim_last(p: &mut Program, at: usize, w: TensorId, d: usize) -> TensorId {
    let rank = p.tensor(w).shape.len();
    let order: Vec<usize> = (0..rank).filter(|&k| k != d).chain([d]).collect();
    crate::transpose::insert_permuted(p, at, w, &order, "f")
}
