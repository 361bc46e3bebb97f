//! Window maxima separated by axis: a stage
//! `Y[.., h, w] = max[r, s](select(R && S, X[.., f(h, r), g(w, s)], k))`
//! — a max pool, `R` the window's row conditions, `S` its column ones —
//! becomes two:
//!
//! ```text
//! Y.rows[.., h, x] = max[r](select(R, X[.., f(h, r), x], k))
//! Y[.., h, w]      = max[s](select(S, Y.rows[.., h, g(w, s)], k))
//! ```
//!
//! `Y.rows` runs along `X`'s rows (`x` over all of them), so its loads are
//! contiguous vectors, and `Y` reads `k_s` columns of it instead of
//! `k_r · k_s` of `X`: a 3 × 3 window of stride 2 loads 3 strided vectors
//! (each two loads and a shuffle) and 6 contiguous ones per output vector
//! instead of 9 strided ones; of stride 1, 6 loads instead of 9.
//!
//! Exact: a maximum does not round, and for a column `s` whose conditions
//! fail, every term of the original is `k`, as is the new one. `k` is any
//! value that depends on no variable.
//!
//! Invariants: only a stage whose value is one `max` over exactly two
//! reduction variables of two or more values each, reading one tensor at
//! one index where `r` is in one position and `s` with one axis `w` in the
//! last (which nothing else mentions, its stride at most the window's
//! width); every other stage, and every other part of the program, is
//! left as it is. The new stage is inserted just before `Y`, in `Y`'s
//! operator, so indices of earlier stages stay valid and operator records
//! cover their stages.

use crate::normalize::{fresh_name, subst};
use std::collections::HashMap;
use texc_compiler::ops::{BinOp, ReduceOp};
use texc_compiler::tir::*;
use texc_grammar::Span;

/// Separate every 2-D window maximum of `p` ([module docs](self)).
pub fn separate_window_maxima(p: &mut Program) {
    let mut si = 0;
    while si < p.stages.len() {
        si += if separate(p, si) { 2 } else { 1 };
    }
}

/// The parts of a separable window maximum.
struct Window {
    /// The reduction variables: along rows, along columns.
    r: VarId,
    s: VarId,
    /// The axis the columns' index moves with, and that index's position.
    w: VarId,
    col: usize,
    tensor: TensorId,
    idx: Vec<TExprId>,
    /// Conjuncts mentioning `r` (with those that mention neither `r`, `s`
    /// nor `w`), and those mentioning `s` or `w`.
    rows: Vec<TExprId>,
    cols: Vec<TExprId>,
    /// The value outside the window.
    outside: Option<TExprId>,
}

/// Separate stage `si` if it is a window maximum; whether it did.
fn separate(p: &mut Program, si: usize) -> bool {
    let Some(win) = window(p, si) else { return false };
    let st = p.stages[si].clone();
    let span = st.span;
    let (ty, elem) = (p.ty(st.value), p.tensor(st.tensor).elem);
    // Y.rows: Y's axes with `w` running over X's columns, then `r`.
    let mut rows_vars = st.vars[..st.n_axes].to_vec();
    rows_vars[win.w as usize].extent = p.tensor(win.tensor).shape[win.col];
    rows_vars[win.w as usize].name = "x".into();
    rows_vars.push(st.vars[win.r as usize].clone());
    let new_r = st.n_axes as VarId;
    let rename_r = HashMap::from([(win.r, new_r)]);
    let x = p.alloc(TExpr::Var(win.w), Ty::Index, span);
    let mut idx: Vec<TExprId> = win.idx.iter().map(|&i| subst(p, i, &HashMap::new(), &rename_r)).collect();
    idx[win.col] = x;
    let load = p.alloc(TExpr::Load(win.tensor, idx), ty, span);
    let rows_conds: Vec<TExprId> = win.rows.iter().map(|&c| subst(p, c, &HashMap::new(), &rename_r)).collect();
    let body = guarded(p, &rows_conds, load, win.outside, span);
    let rows_value = p.alloc(TExpr::Reduce(ReduceOp::Max, vec![new_r], body), ty, span);
    let name = fresh_name(p, &format!("{}.rows", p.tensor(st.tensor).name));
    let shape: Vec<i64> = rows_vars[..st.n_axes].iter().map(|v| v.extent).collect();
    p.tensors.push(TensorDecl { name, elem, shape, role: TensorRole::Temp, span });
    let rows_tensor = TensorId(p.tensors.len() as u32 - 1);
    let rows_stage = Stage { tensor: rows_tensor, vars: rows_vars, n_axes: st.n_axes, value: rows_value, span };

    // Y: its axes, then `s`; Y.rows read at the column index of X.
    let mut vars = st.vars[..st.n_axes].to_vec();
    vars.push(st.vars[win.s as usize].clone());
    let rename_s = HashMap::from([(win.s, new_r)]);
    let mut idx: Vec<TExprId> = (0..st.n_axes as VarId).map(|v| p.alloc(TExpr::Var(v), Ty::Index, span)).collect();
    idx[win.w as usize] = subst(p, win.idx[win.col], &HashMap::new(), &rename_s);
    let load = p.alloc(TExpr::Load(rows_tensor, idx), ty, span);
    let cols_conds: Vec<TExprId> = win.cols.iter().map(|&c| subst(p, c, &HashMap::new(), &rename_s)).collect();
    let body = guarded(p, &cols_conds, load, win.outside, span);
    let value = p.alloc(TExpr::Reduce(ReduceOp::Max, vec![new_r], body), ty, span);
    p.stages[si] = Stage { vars, value, ..st };
    // The rows' stage belongs to the pool's operator.
    crate::prepack::insert_stage(p, si, rows_stage);
    true
}

/// `select(c0 && c1 && .., value, outside)`, or `value` without conditions.
fn guarded(p: &mut Program, conds: &[TExprId], value: TExprId, outside: Option<TExprId>, span: Span) -> TExprId {
    let (Some(&first), Some(outside)) = (conds.first(), outside) else { return value };
    let bool_ty = p.ty(first);
    let cond = conds[1..].iter().fold(first, |a, &b| p.alloc(TExpr::Binary(BinOp::And, a, b), bool_ty, span));
    let ty = p.ty(value);
    p.alloc(TExpr::Select(cond, value, outside), ty, span)
}

/// Stage `si` as a separable window maximum, if it is one.
fn window(p: &Program, si: usize) -> Option<Window> {
    let st = &p.stages[si];
    let TExpr::Reduce(ReduceOp::Max, rvars, body) = p.expr(st.value) else { return None };
    let [a, b] = rvars[..] else { return None };
    let (conds, outside, load) = match *p.expr(*body) {
        TExpr::Select(c, load, outside) if !p.mentions_where(outside, &|_| true) => {
            (conjuncts(p, c), Some(outside), load)
        }
        _ => (Vec::new(), None, *body),
    };
    let TExpr::Load(tensor, idx) = p.expr(load) else { return None };
    let at = |v: VarId| -> Option<usize> {
        let mut found = idx.iter().enumerate().filter(|(_, &i)| p.mentions(i, v)).map(|(k, _)| k);
        let k = found.next()?;
        found.next().is_none().then_some(k)
    };
    let (pa, pb) = (at(a)?, at(b)?);
    // Rows are the position further out (a pool's `h * stride + r`).
    let ((r, row), (s, col)) = if pa < pb { ((a, pa), (b, pb)) } else { ((b, pb), (a, pa)) };
    if row == col || col + 1 != idx.len() {
        return None;
    }
    // The columns' index: `s` and exactly one axis `w`, which no other index mentions.
    let axes: Vec<VarId> = (0..st.n_axes as VarId).filter(|&v| p.mentions(idx[col], v)).collect();
    let [w] = axes[..] else { return None };
    if idx.iter().enumerate().any(|(k, &i)| k != col && p.mentions(i, w)) {
        return None;
    }
    // Windows of one row or column have nothing to separate; where the
    // stride is wider than the window, rows of `X` no window reads would
    // be reduced too.
    let extent = |v: VarId| st.vars[v as usize].extent;
    let stride = crate::analysis::coefficient(p, idx[col], w)?;
    if extent(r) < 2 || extent(s) < 2 || stride.unsigned_abs() > extent(s).unsigned_abs() {
        return None;
    }
    let (mut rows, mut cols) = (Vec::new(), Vec::new());
    for c in conds {
        let (by_r, by_col) = (p.mentions(c, r), p.mentions(c, s) || p.mentions(c, w));
        match (by_r, by_col) {
            (true, true) => return None,
            (_, true) => cols.push(c),
            _ => rows.push(c),
        }
    }
    Some(Window { r, s, w, col, tensor: *tensor, idx: idx.clone(), rows, cols, outside })
}

/// The operands of `&&` in `c`.
fn conjuncts(p: &Program, c: TExprId) -> Vec<TExprId> {
    match *p.expr(c) {
        TExpr::Binary(BinOp::And, a, b) => [conjuncts(p, a), conjuncts(p, b)].concat(),
        _ => vec![c],
    }
}
