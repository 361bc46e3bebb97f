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

use crate::ir::LoopFunc;
use texc_compiler::affine::{affine_of, Affine};
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

fn involves(p: &Program, e: TExprId, var: VarId) -> bool {
    matches!(p.expr(e), TExpr::Var(v) if *v == var) || p.children(e).into_iter().any(|c| involves(p, c, var))
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

/// The access pattern of `t[idx]` in a loop vectorized over `var`.
pub fn access(f: &LoopFunc, t: TensorId, idx: &[TExprId], var: VarId) -> Access {
    let shape = &f.p.tensor(t).shape;
    let mut stride = 1i64;
    let mut total = Some(0i64);
    for d in (0..idx.len()).rev() {
        total = (|| total?.checked_add(coefficient(&f.p, idx[d], var)?.checked_mul(stride)?))();
        stride = stride.saturating_mul(shape[d]);
    }
    match total {
        Some(0) => Access::Uniform,
        Some(1) => Access::Contiguous,
        Some(k) => Access::Strided(k),
        None => Access::Gather,
    }
}
