//! Work and traffic of a specialized program, for `texc bench` and the
//! roofline.
//!
//! FLOPs count float arithmetic and math functions of element values (index
//! arithmetic is free); a reduction costs its body plus one combining
//! operation per term, so a matmul is the usual 2·M·N·K; a one-hot sum
//! (a gather, [`Stage::one_hot`]) costs its one term, as compiled code
//! computes it. Bytes are the
//! compulsory traffic: every input read once, every output written once.

use crate::tir::*;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    pub flops: f64,
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

fn cost(p: &Program, st: &Stage, e: TExprId) -> f64 {
    let own = match p.expr(e) {
        TExpr::Binary(op, _, _) if !op.is_comparison() && !op.is_logic() && is_float(p.ty(e)) => 1.0,
        TExpr::Math(..) if is_float(p.ty(e)) => 1.0,
        TExpr::Intrinsic(crate::ops::Intrinsic::Fma, _) if is_float(p.ty(e)) => 2.0,
        TExpr::Reduce(_, vars, body) => {
            let n: f64 = vars.iter().map(|&v| st.vars[v as usize].extent as f64).product();
            let combine = if is_float(p.ty(e)) { 1.0 } else { 0.0 };
            return n * (cost(p, st, *body) + combine);
        }
        _ => 0.0,
    };
    own + p.children(e).into_iter().map(|c| cost(p, st, c)).sum::<f64>()
}

/// FLOPs of a range of stages.
pub fn cost_of_stages(p: &Program, stages: std::ops::Range<usize>) -> f64 {
    p.stages[stages]
        .iter()
        .map(|st| {
            let per_element = match st.one_hot(p) {
                Some(g) => cost(p, st, g.hit),
                None => cost(p, st, st.value),
            };
            p.tensor(st.tensor).len() as f64 * per_element
        })
        .sum()
}

pub fn count(p: &Program) -> Counts {
    let flops = cost_of_stages(p, 0..p.stages.len());
    let bytes =
        p.tensors.iter().filter(|t| t.role != TensorRole::Temp).map(|t| t.len() as f64 * t.elem.size() as f64).sum();
    Counts { flops, bytes }
}
