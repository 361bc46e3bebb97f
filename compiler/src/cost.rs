//! Work and traffic of a specialized program, for `texc bench` and the
//! roofline.
//!
//! FLOPs count float arithmetic and math functions of element values (index
//! arithmetic is free); a reduction costs its body plus one combining
//! operation per term, so a matmul is the usual 2·M·N·K; a one-hot sum
//! (a gather, [`Stage::one_hot`]) costs its one term, as compiled code
//! computes it. Integer operations on element values (not indices) are
//! counted apart, the same way (`@dot4`: four products and four sums), so
//! that integer kernels report operations per second too. Bytes are the
//! compulsory traffic: every input read once, every output written once.

use crate::tir::*;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    pub flops: f64,
    /// Integer operations on element values.
    pub int_ops: f64,
    pub bytes: f64,
}

impl Counts {
    /// FLOPs per byte.
    pub fn intensity(&self) -> f64 {
        if self.bytes > 0.0 {
            self.flops / self.bytes
        } else {
            f64::INFINITY
        }
    }
}

fn is_float(t: Ty) -> bool {
    matches!(t, Ty::Elem(e) if e.is_float())
}

/// What one operation costs: `(flops, integer ops)`.
fn own_work(p: &Program, e: TExprId) -> (f64, f64) {
    let ty = p.ty(e);
    let n = match p.expr(e) {
        TExpr::Binary(op, _, _) if !op.is_comparison() && !op.is_logic() => 1.0,
        TExpr::Math(..) => 1.0,
        TExpr::Intrinsic(crate::ops::Intrinsic::Fma, _) => 2.0,
        TExpr::Intrinsic(crate::ops::Intrinsic::Dot4 | crate::ops::Intrinsic::Dot4Sat, _) => 8.0,
        TExpr::Intrinsic(crate::ops::Intrinsic::Dot2, _) => 4.0,
        _ => 0.0,
    };
    match ty {
        _ if is_float(ty) => (n, 0.0),
        Ty::Elem(e) if e != crate::types::ElemType::Bool => (0.0, n),
        _ => (0.0, 0.0),
    }
}

fn work(p: &Program, st: &Stage, e: TExprId) -> (f64, f64) {
    if let TExpr::Reduce(_, vars, body) = p.expr(e) {
        let n: f64 = vars.iter().map(|&v| st.vars[v as usize].extent as f64).product();
        let (f, i) = work(p, st, *body);
        let (cf, ci) = match p.ty(e) {
            t if is_float(t) => (1.0, 0.0),
            Ty::Elem(el) if el != crate::types::ElemType::Bool => (0.0, 1.0),
            _ => (0.0, 0.0),
        };
        return (n * (f + cf), n * (i + ci));
    }
    let (mut f, mut i) = own_work(p, e);
    for c in p.children(e) {
        let (cf, ci) = work(p, st, c);
        f += cf;
        i += ci;
    }
    (f, i)
}

/// FLOPs and integer operations of one evaluation of `e`, an expression
/// without reductions (a statement of loop IR, where reductions are loops):
/// the operations [`count`] credits, each occurrence in the expression
/// (a subexpression used twice is counted twice, as there).
pub fn expression_work(p: &Program, e: TExprId) -> (f64, f64) {
    let (mut f, mut i) = own_work(p, e);
    for c in p.children(e) {
        let (cf, ci) = expression_work(p, c);
        f += cf;
        i += ci;
    }
    (f, i)
}

/// FLOPs and integer operations of a range of stages.
pub fn work_of_stages(p: &Program, stages: std::ops::Range<usize>) -> (f64, f64) {
    p.stages[stages].iter().fold((0.0, 0.0), |(f, i), st| {
        let (ef, ei) = match st.one_hot(p) {
            Some(g) => work(p, st, g.hit),
            None => work(p, st, st.value),
        };
        let n = p.tensor(st.tensor).len() as f64;
        (f + n * ef, i + n * ei)
    })
}

/// FLOPs of a range of stages.
pub fn cost_of_stages(p: &Program, stages: std::ops::Range<usize>) -> f64 {
    work_of_stages(p, stages).0
}

pub fn count(p: &Program) -> Counts {
    let (flops, int_ops) = work_of_stages(p, 0..p.stages.len());
    let bytes =
        p.tensors.iter().filter(|t| t.role != TensorRole::Temp).map(|t| t.len() as f64 * t.elem.size() as f64).sum();
    Counts { flops, int_ops, bytes }
}
