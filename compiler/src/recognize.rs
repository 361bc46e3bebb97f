//! Recognition of hand-written operators.
//!
//! A definition in a user kernel that computes exactly a `std.nn` matrix
//! product, batched matrix product or convolution becomes that operator in
//! the operator graph, so that the graph rewrites (Winograd, 1×1 as matmul,
//! distributivity, ...) apply to it as to a call. The match is structural
//! and exact — same element types (f32), same index pattern, same output
//! shape as the operator's definition — so the operator computes the same
//! values; anything else stays an opaque compute node.
//!
//! Patterns, with `·` any order of the two factors:
//! - `C[i, j] = sum[k](A[i, k] · B[k, j])` → `matmul(A, B)`
//! - `C[b, i, j] = sum[k](A[b, i, k] · B[b, k, j])` → `batch_matmul(A, B)`
//! - `Y[n, k, h, w] = sum[c, r, s](X[n, c, s·h + d·r, s·w + d·s'] · W[k, c, r, s'])`
//!   → `conv2d(X, W, pad = 0, stride = s, dilation = d)`; when `X` is a
//!   definition `Xp[n, c, y, x] = select(y >= p && y < H + p && x >= p &&
//!   x < W + p, X0[n, c, y - p, x - p], 0.0)`, → `conv2d(X0, W, pad = p, ...)`.

use crate::nn::{Epilogue, NnOp};
use crate::ops::{BinOp, ReduceOp};
use crate::tir::*;
use crate::types::ElemType;

/// The operator that op `i` of `p` computes, with its arguments in the
/// operator's parameter order, if it is one of the patterns.
pub fn recognize(p: &Program, i: usize) -> Option<(NnOp, Vec<OpArg>)> {
    let op = &p.ops[i];
    if op.op != "compute" || op.stages.len() != 1 || op.outputs.len() != 1 {
        return None;
    }
    let st = &p.stages[op.stages.start];
    if p.tensor(st.tensor).elem != ElemType::F32 {
        return None;
    }
    let TExpr::Reduce(ReduceOp::Sum, _, body) = p.expr(st.value) else { return None };
    let TExpr::Binary(BinOp::Mul, x, y) = p.expr(*body) else { return None };
    let (TExpr::Load(a, ia), TExpr::Load(b, ib)) = (p.expr(*x), p.expr(*y)) else { return None };
    if p.tensor(*a).elem != ElemType::F32 || p.tensor(*b).elem != ElemType::F32 {
        return None;
    }
    let orders = [((*a, ia), (*b, ib)), ((*b, ib), (*a, ia))];
    orders
        .iter()
        .find_map(|&(l, r)| matmul(p, st, l, r).or_else(|| batch_matmul(p, st, l, r)).or_else(|| conv2d(p, st, l, r)))
}

type Access<'a> = (TensorId, &'a Vec<TExprId>);

fn is_var(p: &Program, e: TExprId, v: VarId) -> bool {
    matches!(p.expr(e), TExpr::Var(x) if *x == v)
}

fn vars_are(p: &Program, idx: &[TExprId], vars: &[VarId]) -> bool {
    idx.len() == vars.len() && idx.iter().zip(vars).all(|(&e, &v)| is_var(p, e, v))
}

fn matmul(p: &Program, st: &Stage, (a, ia): Access, (b, ib): Access) -> Option<(NnOp, Vec<OpArg>)> {
    (st.n_axes == 2 && st.vars.len() == 3 && vars_are(p, ia, &[0, 2]) && vars_are(p, ib, &[2, 1]))
        .then(|| (NnOp::Matmul, vec![OpArg::Tensor(a), OpArg::Tensor(b)]))
}

fn batch_matmul(p: &Program, st: &Stage, (a, ia): Access, (b, ib): Access) -> Option<(NnOp, Vec<OpArg>)> {
    (st.n_axes == 3 && st.vars.len() == 4 && vars_are(p, ia, &[0, 1, 3]) && vars_are(p, ib, &[0, 3, 2]))
        .then(|| (NnOp::BatchMatmul, vec![OpArg::Tensor(a), OpArg::Tensor(b)]))
}

/// `k·u + m·v` with constant `k`, `m`: returns (k, m).
fn two_terms(p: &Program, e: TExprId, u: VarId, v: VarId) -> Option<(i64, i64)> {
    let scaled = |e: TExprId, var: VarId| -> Option<i64> {
        match p.expr(e) {
            TExpr::Var(x) if *x == var => Some(1),
            TExpr::Binary(BinOp::Mul, l, r) => match (p.expr(*l), p.expr(*r)) {
                (TExpr::Var(x), TExpr::Int(k)) | (TExpr::Int(k), TExpr::Var(x)) if *x == var => Some(*k),
                _ => None,
            },
            _ => None,
        }
    };
    let TExpr::Binary(BinOp::Add, l, r) = p.expr(e) else { return None };
    Some((scaled(*l, u)?, scaled(*r, v)?))
}

fn conv2d(p: &Program, st: &Stage, (x, ix): Access, (w, iw): Access) -> Option<(NnOp, Vec<OpArg>)> {
    // Y[n, k, h, w] = sum[c, r, s](X[n, c, st·h + d·r, st·w + d·s] · W[k, c, r, s])
    if st.n_axes != 4 || st.vars.len() != 7 || ix.len() != 4 || !vars_are(p, iw, &[1, 4, 5, 6]) {
        return None;
    }
    if !is_var(p, ix[0], 0) || !is_var(p, ix[1], 4) {
        return None;
    }
    let (sh, dh) = two_terms(p, ix[2], 2, 5)?;
    let (sw, dw) = two_terms(p, ix[3], 3, 6)?;
    if sh != sw || dh != dw || sh < 1 || dh < 1 {
        return None;
    }
    let (input, pad) = unpadded(p, x).unwrap_or((x, 0));
    // The output shape must be the operator's for these arguments.
    let (xs, ws) = (&p.tensor(input).shape, &p.tensor(w).shape);
    let out = |size: i64, r: i64| (size + 2 * pad - dh * (r - 1) - 1).div_euclid(sh) + 1;
    let want = [xs[0], ws[0], out(xs[2], ws[2]), out(xs[3], ws[3])];
    if p.tensor(st.tensor).shape != want || xs[1] != ws[1] || xs.len() != 4 {
        return None;
    }
    let args = vec![
        OpArg::Tensor(input),
        OpArg::Tensor(w),
        OpArg::Const(pad),
        OpArg::Const(sh),
        OpArg::Const(dh),
        OpArg::Const(1),
    ];
    Some((NnOp::Conv2d(Epilogue::None), args))
}

/// If `t` is defined by a zero-padding definition of another tensor, that
/// tensor and the padding.
fn unpadded(p: &Program, t: TensorId) -> Option<(TensorId, i64)> {
    let op = p.ops.iter().find(|o| o.outputs == [t] && o.op == "compute" && o.stages.len() == 1)?;
    let st = &p.stages[op.stages.start];
    if st.n_axes != 4 || st.vars.len() != 4 {
        return None;
    }
    let TExpr::Select(cond, inside, outside) = p.expr(st.value) else { return None };
    if !matches!(p.expr(*outside), TExpr::Float(z) if *z == 0.0) {
        return None;
    }
    let TExpr::Load(x, idx) = p.expr(*inside) else { return None };
    let offset = |e: TExprId, v: VarId| -> Option<i64> {
        match p.expr(e) {
            TExpr::Var(x) if *x == v => Some(0),
            TExpr::Binary(BinOp::Sub, a, b) if is_var(p, *a, v) => match p.expr(*b) {
                TExpr::Int(k) => Some(*k),
                _ => None,
            },
            _ => None,
        }
    };
    if idx.len() != 4 || !is_var(p, idx[0], 0) || !is_var(p, idx[1], 1) {
        return None;
    }
    let pad = offset(idx[2], 2)?;
    if offset(idx[3], 3)? != pad || pad < 1 {
        return None;
    }
    let xs = &p.tensor(*x).shape;
    let ps = &p.tensor(t).shape;
    if ps[..] != [xs[0], xs[1], xs[2] + 2 * pad, xs[3] + 2 * pad] {
        return None;
    }
    // The condition must be exactly the four bounds, in any order and nesting of `&&`.
    let mut facts = Vec::new();
    conjuncts(p, *cond, &mut facts)?;
    let mut want =
        vec![(BinOp::Ge, 2, pad), (BinOp::Lt, 2, xs[2] + pad), (BinOp::Ge, 3, pad), (BinOp::Lt, 3, xs[3] + pad)];
    facts.sort_by_key(|f| (f.1, f.0 == BinOp::Lt));
    want.sort_by_key(|f| (f.1, f.0 == BinOp::Lt));
    (facts == want).then_some((*x, pad))
}

fn conjuncts(p: &Program, e: TExprId, out: &mut Vec<(BinOp, VarId, i64)>) -> Option<()> {
    match p.expr(e) {
        TExpr::Binary(BinOp::And, a, b) => {
            conjuncts(p, *a, out)?;
            conjuncts(p, *b, out)
        }
        TExpr::Binary(op @ (BinOp::Ge | BinOp::Lt), a, b) => match (p.expr(*a), p.expr(*b)) {
            (TExpr::Var(v), TExpr::Int(k)) => {
                out.push((*op, *v, *k));
                Some(())
            }
            _ => None,
        },
        _ => None,
    }
}
