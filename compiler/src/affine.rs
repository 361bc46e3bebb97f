//! Affine forms `c + Σ kᵢ·aᵢ` over atoms of the caller's choosing, and the
//! one walker that reads them off an expression.
//!
//! Every pass that reasons about indices uses this type: the bounds checker
//! (atoms: variables and opaque sub-terms), bound inference of attached
//! stages (owner iteration variables and offsets), index simplification of
//! loop IR, the loop-IR access analysis (the coefficient of the vectorized
//! variable) and the default schedule (whether an index is affine at all).
//!
//! Coefficients are i128 and every operation is checked: a form whose
//! arithmetic would overflow is `None` ("not affine"), never a wrong answer.

use crate::ops::{BinOp, UnOp};
use crate::tir::{Program, TExpr, TExprId};
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Affine<A: Ord> {
    /// Non-zero coefficients by atom.
    pub terms: BTreeMap<A, i128>,
    pub c: i128,
}

impl<A: Ord> Default for Affine<A> {
    fn default() -> Self {
        Affine { terms: BTreeMap::new(), c: 0 }
    }
}

impl<A: Ord + Clone> Affine<A> {
    pub fn constant(c: i128) -> Self {
        Affine { terms: BTreeMap::new(), c }
    }

    pub fn atom(a: A) -> Self {
        Affine { terms: BTreeMap::from([(a, 1)]), c: 0 }
    }

    /// `self + sign·o`.
    pub fn add(mut self, o: &Affine<A>, sign: i128) -> Option<Self> {
        for (a, k) in &o.terms {
            let e = self.terms.entry(a.clone()).or_insert(0);
            *e = e.checked_add(sign.checked_mul(*k)?)?;
        }
        self.terms.retain(|_, k| *k != 0);
        self.c = self.c.checked_add(sign.checked_mul(o.c)?)?;
        Some(self)
    }

    /// `k·self`.
    pub fn scale(mut self, k: i128) -> Option<Self> {
        if k == 0 {
            return Some(Affine::constant(0));
        }
        for v in self.terms.values_mut() {
            *v = v.checked_mul(k)?;
        }
        self.c = self.c.checked_mul(k)?;
        Some(self)
    }

    pub fn as_const(&self) -> Option<i128> {
        self.terms.is_empty().then_some(self.c)
    }

    /// The coefficient of `a` (0 when absent).
    pub fn coeff(&self, a: &A) -> i128 {
        self.terms.get(a).copied().unwrap_or(0)
    }

    /// Rename atoms (atoms that become equal have their coefficients added).
    pub fn map_atoms<B: Ord + Clone>(&self, mut f: impl FnMut(&A) -> B) -> Option<Affine<B>> {
        let mut out = Affine::constant(self.c);
        for (a, k) in &self.terms {
            out = out.add(&Affine::atom(f(a)), *k)?;
        }
        Some(out)
    }
}

/// The affine form of `e`: integer constants, `-`, `+`, `-` and products
/// with a constant side are read through; every other node (variables
/// included) is handed to `leaf`, which returns its form or `None` when the
/// whole expression should count as not affine.
pub fn affine_of<A: Ord + Clone>(
    p: &Program,
    e: TExprId,
    leaf: &mut dyn FnMut(TExprId) -> Option<Affine<A>>,
) -> Option<Affine<A>> {
    match p.expr(e) {
        TExpr::Int(k) => Some(Affine::constant(*k as i128)),
        TExpr::Unary(UnOp::Neg, a) => affine_of(p, *a, leaf)?.scale(-1),
        TExpr::Binary(BinOp::Add, a, b) => {
            let x = affine_of(p, *a, leaf)?;
            x.add(&affine_of(p, *b, leaf)?, 1)
        }
        TExpr::Binary(BinOp::Sub, a, b) => {
            let x = affine_of(p, *a, leaf)?;
            x.add(&affine_of(p, *b, leaf)?, -1)
        }
        TExpr::Binary(BinOp::Mul, a, b) => {
            let (x, y) = (affine_of(p, *a, leaf)?, affine_of(p, *b, leaf)?);
            match (x.as_const(), y.as_const()) {
                (Some(k), _) => y.scale(k),
                (_, Some(k)) => x.scale(k),
                _ => leaf(e),
            }
        }
        _ => leaf(e),
    }
}

/// The affine form of `e` over its variables, or `None` if `e` is not affine in them.
pub fn affine_in_vars(p: &Program, e: TExprId) -> Option<Affine<crate::tir::VarId>> {
    affine_of(p, e, &mut |x| match p.expr(x) {
        TExpr::Var(v) => Some(Affine::atom(*v)),
        _ => None,
    })
}
