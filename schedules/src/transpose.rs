//! Products whose vector operand is read across its rows, transposed once:
//! a TIR-to-TIR pass for CPU targets.
//!
//! `C[i, j] = sum[k](A[i, k] * W[j, k])` — a PyTorch `Linear`, `x · Wᵀ` —
//! reads `W` along `k`, its contiguous axis, while the register block's
//! vectors run along `j`, the output's: each vector lane would be a
//! different row of `W`. The default schedule then reduces along rows
//! instead, one dot product per output element (8 GFLOP/s at 512³ on
//! AVX-512, against 240 for `W[k, j]`). Where the rows are many, `W` is
//! transposed into `W.t[k, .., j, ..]` (its last dimension first) by a
//! stage of its own, and the product reads that: the `A[i, k] · B[k, j]`
//! form, which the register blocks and packed panels are made for. A
//! constant `W` (a model's weights) is transposed once, when constants are
//! folded: the pipeline runs this pass on constant operands before
//! folding, and again as a CPU preparation step (after attention is fused)
//! for kernels whose weights are arguments.
//!
//! Which products: a sum whose body multiplies two loads (each possibly
//! converted), one of which (`W`) has the stage's innermost axis `j`, alone,
//! as one of its indices but not its last, and a variable of the sum,
//! alone, as its last; the other does not involve `j`. A `W` computed at
//! run time only when the output has at least [`MIN_ROWS`] rows besides `j`
//! (a matrix-vector product reads `W` once, so transposing it first would
//! double its traffic); a constant `W` at any row count, as its transpose
//! costs nothing per run and the `A[i, k] · B[k, j]` form needs no
//! horizontal sums of the dot products' lanes (an LSTM's recurrent product
//! at one row, its input projection at the sequence length).
//!
//! Invariants: the program computes the same values (the product's terms
//! are the same products in the same order); stages stay in an order
//! where every tensor is written before it is read; operator records'
//! stage ranges move with the inserted stages.

use crate::analysis::involves;
use crate::normalize::{fresh_name, replace_node};
use crate::prepack::insert_stage;
use texc_compiler::ops::{BinOp, ReduceOp};
use texc_compiler::tir::*;

/// Output rows (the product of the extents of the axes besides `j`) from
/// which transposing a `W` computed at run time (one pass over it) pays for itself.
pub const MIN_ROWS: i64 = 16;

/// Transpose the vector operand of every product that reads it across its
/// rows (only those `only` accepts, where given) and has at least
/// `min_rows` output rows; the number of products changed. Attention
/// stages (`crate::flash`) are left to their own nest.
pub fn transpose_operands(p: &mut Program, only: Option<&dyn Fn(TensorId) -> bool>, min_rows: i64) -> usize {
    let mut made: Vec<(TensorId, TensorId)> = Vec::new();
    let mut changed = 0;
    let mut si = 0;
    while si < p.stages.len() {
        match find(p, si, min_rows).filter(|&(_, w)| only.is_none_or(|f| f(w))) {
            Some((load, w)) => {
                let t = match made.iter().find(|(m, _)| *m == w) {
                    Some(&(_, t)) => t,
                    None => {
                        let t = insert_transposed(p, si, w);
                        si += 1;
                        made.push((w, t));
                        t
                    }
                };
                let value = p.stages[si].value;
                p.stages[si].value = read_transposed(p, value, load, t);
                changed += 1;
            }
            None => si += 1,
        }
    }
    changed
}

/// The first load of stage `si` to transpose, and its tensor.
fn find(p: &Program, si: usize, min_rows: i64) -> Option<(TExprId, TensorId)> {
    let st = &p.stages[si];
    if crate::flash::is_attention(p, si) {
        return None;
    }
    let j = st.n_axes.checked_sub(1)? as VarId;
    let rows: i64 = st.vars[..st.n_axes - 1].iter().map(|v| v.extent).product();
    if rows < min_rows {
        return None;
    }
    let mut stack = vec![st.value];
    while let Some(e) = stack.pop() {
        if let TExpr::Reduce(ReduceOp::Sum, vars, body) = p.expr(e) {
            if let TExpr::Binary(BinOp::Mul, x, y) = *p.expr(*body) {
                let (x, y) = (strip_cast(p, x), strip_cast(p, y));
                for (w, other) in [(x, y), (y, x)] {
                    if let Some(t) = across_rows(p, w, j, vars) {
                        if !involves(p, other, j) && matches!(p.expr(other), TExpr::Load(..)) {
                            return Some((w, t));
                        }
                    }
                }
            }
        }
        stack.extend(p.children(e));
    }
    None
}

fn strip_cast(p: &Program, e: TExprId) -> TExprId {
    match p.expr(e) {
        TExpr::Cast(a) => *a,
        _ => e,
    }
}

/// `load`'s tensor if it is `W[.., j, .., k]`: `j` alone at a dimension
/// before the last and nowhere else, a variable `k` of the sum alone last.
fn across_rows(p: &Program, load: TExprId, j: VarId, sum_vars: &[VarId]) -> Option<TensorId> {
    let TExpr::Load(t, idx) = p.expr(load) else { return None };
    let (&last, rest) = idx.split_last()?;
    let is_var = |i: TExprId, v: VarId| matches!(p.expr(i), TExpr::Var(x) if *x == v);
    let k = match p.expr(last) {
        TExpr::Var(k) if sum_vars.contains(k) => *k,
        _ => return None,
    };
    let at_j = rest.iter().filter(|&&i| is_var(i, j)).count();
    let j_elsewhere = rest.iter().any(|&i| !is_var(i, j) && involves(p, i, j));
    let k_elsewhere = rest.iter().any(|&i| involves(p, i, k));
    (at_j == 1 && !j_elsewhere && !k_elsewhere).then_some(*t)
}

/// A stage before `at` writing `W.t[d_last, d0, ..] = W[d0, .., d_last]`.
fn insert_transposed(p: &mut Program, at: usize, w: TensorId) -> TensorId {
    let order = transposed_order(p.tensor(w).shape.len());
    insert_permuted(p, at, w, &order, "t")
}

/// A stage before `at` writing `w`'s elements to a new tensor named
/// `w.suffix` whose dimension `k` is `w`'s `order[k]`; `w`'s dimensions
/// that `order` leaves out, all of one element, are dropped.
pub(crate) fn insert_permuted(p: &mut Program, at: usize, w: TensorId, order: &[usize], suffix: &str) -> TensorId {
    let decl = p.tensor(w).clone();
    let span = decl.span;
    let rank = decl.shape.len();
    let shape: Vec<i64> = order.iter().map(|&d| decl.shape[d]).collect();
    let name = fresh_name(p, &format!("{}.{suffix}", decl.name));
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape: shape.clone(), role: TensorRole::Temp, span });
    let t = TensorId(p.tensors.len() as u32 - 1);
    let idx: Vec<TExprId> = (0..rank)
        .map(|d| match order.iter().position(|&o| o == d) {
            Some(v) => p.alloc(TExpr::Var(v as VarId), Ty::Index, span),
            None => {
                debug_assert_eq!(decl.shape[d], 1, "only dimensions of one element are dropped");
                p.alloc(TExpr::Int(0), Ty::Index, span)
            }
        })
        .collect();
    let value = p.alloc(TExpr::Load(w, idx), Ty::Elem(decl.elem), span);
    let vars: Vec<VarDecl> =
        order.iter().zip(&shape).map(|(&d, &extent)| VarDecl { name: format!("d{d}"), extent }).collect();
    let n_axes = vars.len();
    insert_stage(p, at, Stage { tensor: t, vars, n_axes, value, span });
    t
}

/// The original dimensions in the transposed tensor's order: the last first.
fn transposed_order(rank: usize) -> Vec<usize> {
    std::iter::once(rank - 1).chain(0..rank - 1).collect()
}

/// `e` with the load `load` reading the transposed tensor `t` instead.
fn read_transposed(p: &mut Program, e: TExprId, load: TExprId, t: TensorId) -> TExprId {
    let TExpr::Load(_, idx) = p.expr(load).clone() else { unreachable!("a load") };
    let idx = transposed_order(idx.len()).into_iter().map(|d| idx[d]).collect();
    let (ty, span) = (p.ty(load), p.span(load));
    let transposed = p.alloc(TExpr::Load(t, idx), ty, span);
    replace_node(p, e, load, transposed)
}
