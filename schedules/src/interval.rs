//! Integer intervals of loop-IR index expressions, for the proofs about
//! loop nests read from text: that accesses stay inside their tensors
//! ([`crate::text::safety`]) and that concurrent iterations touch distinct
//! elements ([`crate::independence`]).
//!
//! An interval is closed; an unknown bound is `None`. Every operation is
//! checked: arithmetic that would overflow gives an unknown bound, never a
//! wrong one, and a value computed beyond its type's range is unknown
//! (integer arithmetic wraps at its width, see [`within_type`]).
#![allow(clippy::should_implement_trait)]

use texc_compiler::ops::{BinOp, MathFn, UnOp};
use texc_compiler::tir::{Program, TExpr, TExprId, Ty, VarId};
use texc_compiler::types::ElemType;

/// A closed interval; `None` bounds are unknown (unbounded).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Iv {
    pub lo: Option<i128>,
    pub hi: Option<i128>,
}

pub const ANY: Iv = Iv { lo: None, hi: None };

pub fn exact(c: i128) -> Iv {
    Iv { lo: Some(c), hi: Some(c) }
}

/// `lo..=hi`.
pub fn range(lo: i128, hi: i128) -> Iv {
    Iv { lo: Some(lo), hi: Some(hi) }
}

fn both(a: Option<i128>, b: Option<i128>, f: impl Fn(i128, i128) -> Option<i128>) -> Option<i128> {
    f(a?, b?)
}

impl Iv {
    /// `max(x, y)`: at least the larger known lower bound, whatever the other is.
    pub fn max(self, o: Iv) -> Iv {
        let lo = match (self.lo, o.lo) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Iv { lo, hi: both(self.hi, o.hi, |a, b| Some(a.max(b))) }
    }

    /// `min(x, y)`: at most the smaller known upper bound, whatever the other is.
    pub fn min(self, o: Iv) -> Iv {
        let hi = match (self.hi, o.hi) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Iv { lo: both(self.lo, o.lo, |a, b| Some(a.min(b))), hi }
    }

    pub fn add(self, o: Iv) -> Iv {
        Iv { lo: both(self.lo, o.lo, i128::checked_add), hi: both(self.hi, o.hi, i128::checked_add) }
    }

    pub fn neg(self) -> Iv {
        Iv { lo: self.hi.and_then(i128::checked_neg), hi: self.lo.and_then(i128::checked_neg) }
    }

    pub fn mul(self, o: Iv) -> Iv {
        let (Some(a), Some(b), Some(c), Some(d)) = (self.lo, self.hi, o.lo, o.hi) else { return ANY };
        let ps = [a.checked_mul(c), a.checked_mul(d), b.checked_mul(c), b.checked_mul(d)];
        if ps.iter().any(Option::is_none) {
            return ANY;
        }
        let ps = ps.map(Option::unwrap);
        Iv { lo: ps.iter().min().copied(), hi: ps.iter().max().copied() }
    }

    /// The smallest interval holding both.
    pub fn union(self, o: Iv) -> Iv {
        Iv { lo: both(self.lo, o.lo, |a, b| Some(a.min(b))), hi: both(self.hi, o.hi, |a, b| Some(a.max(b))) }
    }

    /// Both at once: the tighter bound on each side.
    pub fn meet(self, o: Iv) -> Iv {
        let pick = |a: Option<i128>, b: Option<i128>, f: fn(i128, i128) -> i128| match (a, b) {
            (Some(x), Some(y)) => Some(f(x, y)),
            (x, None) => x,
            (None, y) => y,
        };
        Iv { lo: pick(self.lo, o.lo, i128::max), hi: pick(self.hi, o.hi, i128::min) }
    }

    /// `hi − lo`, when both are known.
    pub fn width(self) -> Option<i128> {
        self.hi?.checked_sub(self.lo?)
    }
}

pub fn is_integer(t: Ty) -> bool {
    matches!(t, Ty::Index) || matches!(t, Ty::Elem(e) if e.is_int())
}

/// `iv` if every value in it fits type `ty`, else unknown: integer
/// arithmetic wraps at its width, so a value computed beyond the range is
/// not the mathematical one. (Checked at every node, this makes each known
/// interval exact: `+`, `-` and `*` of values in range wrap to the
/// mathematical result whenever that result is in range.)
pub fn within_type(iv: Iv, ty: Ty) -> Iv {
    let (lo, hi): (i128, i128) = match ty {
        Ty::Index | Ty::Elem(ElemType::I64) => (i64::MIN as i128, i64::MAX as i128),
        Ty::Elem(ElemType::I32) => (i32::MIN as i128, i32::MAX as i128),
        Ty::Elem(ElemType::I8) => (i8::MIN as i128, i8::MAX as i128),
        Ty::Elem(ElemType::U8) => (0, u8::MAX as i128),
        _ => return ANY,
    };
    match (iv.lo, iv.hi) {
        (Some(a), Some(b)) if a >= lo && b <= hi => iv,
        _ => ANY,
    }
}

/// The interval of node `e` from the intervals of loop variables (`var`)
/// and of its children (`child`), before [`within_type`].
pub fn node(p: &Program, e: TExprId, var: &dyn Fn(VarId) -> Iv, child: &mut dyn FnMut(TExprId) -> Iv) -> Iv {
    match p.expr(e) {
        TExpr::Int(c) => exact(*c as i128),
        TExpr::Var(v) => var(*v),
        TExpr::Unary(UnOp::Neg, a) => child(*a).neg(),
        TExpr::Binary(op, a, b) => {
            let (x, y) = (child(*a), child(*b));
            match op {
                BinOp::Add => x.add(y),
                BinOp::Sub => x.add(y.neg()),
                BinOp::Mul => x.mul(y),
                BinOp::FloorDiv | BinOp::UDiv | BinOp::TruncDiv => match (y.lo, y.hi) {
                    (Some(c), Some(c2))
                        if c == c2 && c > 0 && (*op == BinOp::FloorDiv || x.lo.is_some_and(|l| l >= 0)) =>
                    {
                        Iv { lo: x.lo.map(|l| l.div_euclid(c)), hi: x.hi.map(|h| h.div_euclid(c)) }
                    }
                    _ => ANY,
                },
                BinOp::FloorMod | BinOp::URem | BinOp::TruncRem => match (y.lo, y.hi) {
                    (Some(c), Some(c2))
                        if c == c2 && c > 0 && (*op == BinOp::FloorMod || x.lo.is_some_and(|l| l >= 0)) =>
                    {
                        // Within one block of `c` the remainder is monotonic.
                        match (x.lo, x.hi) {
                            (Some(l), Some(h)) if l.div_euclid(c) == h.div_euclid(c) => {
                                range(l.rem_euclid(c), h.rem_euclid(c))
                            }
                            _ => range(0, c - 1),
                        }
                    }
                    _ => ANY,
                },
                _ => ANY,
            }
        }
        TExpr::Math(MathFn::Min, args) if args.len() == 2 => child(args[0]).min(child(args[1])),
        TExpr::Math(MathFn::Max, args) if args.len() == 2 => child(args[0]).max(child(args[1])),
        // `clamp(x, lo, hi)` is `min(max(x, lo), hi)`, in range whatever `x` is (a gather's index).
        TExpr::Math(MathFn::Clamp, args) if args.len() == 3 && is_integer(p.ty(e)) => {
            child(args[0]).max(child(args[1])).min(child(args[2]))
        }
        TExpr::Select(_, a, b) => child(*a).union(child(*b)),
        // Integer conversions keep values that fit (checked by `within_type`).
        TExpr::Cast(a) if is_integer(p.ty(e)) && is_integer(p.ty(*a)) => child(*a),
        _ => ANY,
    }
}

/// The interval of `e` when each loop variable ranges over `var(v)`.
pub fn of(p: &Program, e: TExprId, var: &dyn Fn(VarId) -> Iv) -> Iv {
    within_type(node(p, e, var, &mut |c| of(p, c, var)), p.ty(e))
}
