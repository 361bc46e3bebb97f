//! Legalization of expressions for a target: every operation becomes one
//! that backends can map to an instruction without re-deriving texc's
//! semantics.
//!
//! - Integer floor division and modulo ([`BinOp::FloorDiv`],
//!   [`BinOp::FloorMod`], with `x / 0 == 0`, `x % 0 == x`) become machine
//!   division ([`BinOp::TruncDiv`], [`BinOp::TruncRem`]) whose divisor is
//!   never 0 or -1, plus compares and selects that restore floor semantics.
//!   Constant divisors get the short forms; with a non-negative dividend
//!   (loop variables) and a positive constant divisor, unsigned division
//!   ([`BinOp::UDiv`], [`BinOp::URem`]), so index arithmetic is a shift or
//!   a mask for powers of two; an index with a negative lower bound
//!   (`x - 1`) is first shifted up by a multiple of the divisor.
//! - `a * b + c` on f32/f64 becomes [`Intrinsic::Fma`] where the target has it.
//! - `x / c` on f32/f64 by a constant `c` whose reciprocal is a normal
//!   number, as the argument of a function compiled code approximates
//!   (`exp`, `sigmoid`, `tanh`, `erf`, `erfc`), becomes `x * (1 / c)`:
//!   within an ulp and a half of the quotient, inside the function's own
//!   error. WHY: a division holds the divider for 3.5–5 cycles a register
//!   (a GELU's `erf(x / √2)`, 1.3 ns an element on AVX2 with it), a product
//!   pipelines. Elsewhere a quotient stays one: a requantization's
//!   `round(x / scale)` must give the interpreter's integers.
//! - `c + @dot4(0, a, b)` becomes `@dot4(c, a, b)`, and `@dot2` alike: the
//!   accumulator goes into the instruction (`vpdpbusd` adds to its
//!   destination; `vpmaddwd`'s sums are added to it at once).
//!
//! Guarantees: the result evaluates, under [`crate::semantics`], to the same
//! value as the input for every input, but for the roundings of contracted
//! multiply-adds and of the approximated functions' arguments named above; no `FloorDiv`/`FloorMod` remains;
//! sharing of sub-expressions is kept (each node is rewritten once).

use crate::ops::{BinOp, Intrinsic, MathFn, UnOp};
use crate::target::Target;
use crate::tir::{Program, TExpr, TExprId, Ty};
use crate::types::ElemType;
use std::collections::HashMap;

/// Rewrites expressions of one arena; the memo keeps shared nodes shared.
pub struct Legalizer<'t> {
    target: &'t Target,
    memo: HashMap<TExprId, TExprId>,
}

const BOOL: Ty = Ty::Elem(ElemType::Bool);

impl<'t> Legalizer<'t> {
    pub fn new(target: &'t Target) -> Legalizer<'t> {
        Legalizer { target, memo: HashMap::new() }
    }

    /// The legal form of `e` (which may be `e` itself).
    pub fn expr(&mut self, p: &mut Program, e: TExprId) -> TExprId {
        if let Some(&done) = self.memo.get(&e) {
            return done;
        }
        let out = self.rebuild(p, e);
        self.memo.insert(e, out);
        out
    }

    fn rebuild(&mut self, p: &mut Program, e: TExprId) -> TExprId {
        let (ty, span) = (p.ty(e), p.span(e));
        let node = match p.expr(e).clone() {
            TExpr::Int(_) | TExpr::Float(_) | TExpr::Var(_) | TExpr::Scalar(_) => return e,
            TExpr::Load(t, idx) => TExpr::Load(t, idx.iter().map(|&i| self.expr(p, i)).collect()),
            TExpr::Unary(op, a) => TExpr::Unary(op, self.expr(p, a)),
            TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) => {
                let (a, b) = (self.expr(p, a), self.expr(p, b));
                return floor_division(p, op, a, b, ty);
            }
            TExpr::Binary(BinOp::Add, a, b) if self.contracts(p, ty) && (is_mul(p, a) || is_mul(p, b)) => {
                let (m, c) = if is_mul(p, a) { (a, b) } else { (b, a) };
                let TExpr::Binary(BinOp::Mul, x, y) = p.expr(m).clone() else { unreachable!("is_mul") };
                let args = vec![self.expr(p, x), self.expr(p, y), self.expr(p, c)];
                TExpr::Intrinsic(Intrinsic::Fma, args)
            }
            TExpr::Binary(BinOp::Add, a, b) if zero_based_dot(p, a).is_some() || zero_based_dot(p, b).is_some() => {
                let (d, c) = if zero_based_dot(p, b).is_some() { (b, a) } else { (a, b) };
                let (i, [x, y]) = zero_based_dot(p, d).expect("checked");
                TExpr::Intrinsic(i, vec![self.expr(p, c), self.expr(p, x), self.expr(p, y)])
            }
            TExpr::Binary(op, a, b) => TExpr::Binary(op, self.expr(p, a), self.expr(p, b)),
            TExpr::Select(c, a, b) => TExpr::Select(self.expr(p, c), self.expr(p, a), self.expr(p, b)),
            TExpr::Math(f, args) if approximate(f) => {
                TExpr::Math(f, args.iter().map(|&x| self.approximate_argument(p, x)).collect())
            }
            TExpr::Math(f, args) => TExpr::Math(f, args.iter().map(|&x| self.expr(p, x)).collect()),
            TExpr::Intrinsic(i, args) => TExpr::Intrinsic(i, args.iter().map(|&x| self.expr(p, x)).collect()),
            TExpr::Cast(a) => TExpr::Cast(self.expr(p, a)),
            TExpr::Reduce(op, vars, body) => TExpr::Reduce(op, vars, self.expr(p, body)),
        };
        if *p.expr(e) == node {
            return e;
        }
        p.alloc(node, ty, span)
    }

    /// The legal form of `e`, an argument of an approximated function,
    /// with a division by a constant (under casts to its own type) as a
    /// product by the reciprocal.
    fn approximate_argument(&mut self, p: &mut Program, e: TExprId) -> TExprId {
        let (ty, span) = (p.ty(e), p.span(e));
        match p.expr(e).clone() {
            TExpr::Cast(a) if p.ty(a) == ty => match self.approximate_argument(p, a) {
                same if same == a => e,
                a => p.alloc(TExpr::Cast(a), ty, span),
            },
            TExpr::Binary(BinOp::Div, a, b) => match reciprocal(p, b, ty) {
                Some(r) => {
                    let (a, r) = (self.expr(p, a), p.alloc(TExpr::Float(r), ty, p.span(b)));
                    p.alloc(TExpr::Binary(BinOp::Mul, a, r), ty, span)
                }
                None => self.expr(p, e),
            },
            _ => self.expr(p, e),
        }
    }

    fn contracts(&self, _p: &Program, ty: Ty) -> bool {
        matches!(ty, Ty::Elem(ElemType::F32 | ElemType::F64)) && self.target.has_intrinsic(Intrinsic::Fma)
    }
}

/// The instruction and operands `[a, b]` of `@dot4(0, a, b)`, `@dot2(0, a, b)` or `@dot4sat(0, a, b)`.
fn zero_based_dot(p: &Program, e: TExprId) -> Option<(Intrinsic, [TExprId; 2])> {
    match p.expr(e) {
        TExpr::Intrinsic(i @ (Intrinsic::Dot4 | Intrinsic::Dot2 | Intrinsic::Dot4Sat), args)
            if int_const(p, args[0]) == Some(0) =>
        {
            Some((*i, [args[1], args[2]]))
        }
        _ => None,
    }
}

/// Functions that compiled code computes to a few ulps, not correctly
/// rounded (vector polynomials, the C library): an ulp more in their
/// argument is within their own error.
fn approximate(f: MathFn) -> bool {
    matches!(f, MathFn::Exp | MathFn::Sigmoid | MathFn::Tanh | MathFn::Erf | MathFn::Erfc)
}

/// `1 / c` for a float constant `c` of type `ty` (f32 or f64) where both
/// are normal numbers, rounded to `ty`.
fn reciprocal(p: &Program, e: TExprId, ty: Ty) -> Option<f64> {
    let TExpr::Float(c) = *p.expr(e) else { return None };
    match ty {
        Ty::Elem(ElemType::F32) => {
            let (c, r) = (c as f32, 1.0 / c as f32);
            (c.is_normal() && r.is_normal()).then_some(f64::from(r))
        }
        Ty::Elem(ElemType::F64) => (c.is_normal() && (1.0 / c).is_normal()).then_some(1.0 / c),
        _ => None,
    }
}

fn is_mul(p: &Program, e: TExprId) -> bool {
    matches!(p.expr(e), TExpr::Binary(BinOp::Mul, ..))
}

fn int_const(p: &Program, e: TExprId) -> Option<i64> {
    match p.expr(e) {
        TExpr::Int(k) => Some(*k),
        _ => None,
    }
}

fn unsigned(ty: Ty) -> bool {
    matches!(ty, Ty::Elem(ElemType::U8 | ElemType::Bool))
}

/// Whether `e` is never negative: loop variables (they start at 0 or
/// later), non-negative constants, unsigned values, and sums, products and
/// divisions of those.
pub fn non_negative(p: &Program, e: TExprId) -> bool {
    if unsigned(p.ty(e)) {
        return true;
    }
    match p.expr(e) {
        TExpr::Int(k) => *k >= 0,
        TExpr::Var(_) => true,
        TExpr::Binary(
            BinOp::Add | BinOp::Mul | BinOp::TruncDiv | BinOp::TruncRem | BinOp::UDiv | BinOp::URem | BinOp::FloorDiv,
            a,
            b,
        ) => non_negative(p, *a) && non_negative(p, *b),
        TExpr::Binary(BinOp::FloorMod, _, b) => int_const(p, *b).is_some_and(|k| k > 0),
        _ => false,
    }
}

/// `(m, k·m)` with `a + k·m ≥ 0` for every value of `a`, from its lower bound
/// (kept small enough that the sum cannot overflow an index).
fn shift_up(p: &Program, a: TExprId, k: i64) -> Option<(i64, i64)> {
    let lo = lower_bound(p, a).filter(|&lo| lo >= -(1 << 31))?;
    let m = (-lo).checked_add(k - 1)? / k;
    Some((m, m.checked_mul(k)?))
}

/// A lower bound of integer expression `e` built from loop variables (≥ 0),
/// constants, sums, differences with a constant, products of non-negative
/// terms and unsigned divisions; `None` when it is not one of those.
fn lower_bound(p: &Program, e: TExprId) -> Option<i64> {
    match p.expr(e) {
        TExpr::Int(k) => Some(*k),
        TExpr::Var(_) => Some(0),
        TExpr::Binary(BinOp::Add, a, b) => lower_bound(p, *a)?.checked_add(lower_bound(p, *b)?),
        TExpr::Binary(BinOp::Sub, a, b) => lower_bound(p, *a)?.checked_sub(int_const(p, *b)?),
        TExpr::Binary(BinOp::Mul, a, b) => {
            let (x, y) = (lower_bound(p, *a)?, lower_bound(p, *b)?);
            (x >= 0 && y >= 0).then(|| x.checked_mul(y)).flatten()
        }
        _ if non_negative(p, e) => Some(0),
        _ => None,
    }
}

struct Build<'p> {
    p: &'p mut Program,
    ty: Ty,
}

impl Build<'_> {
    fn int(&mut self, k: i64) -> TExprId {
        self.p.alloc(TExpr::Int(k), self.ty, Default::default())
    }

    fn bin(&mut self, op: BinOp, a: TExprId, b: TExprId) -> TExprId {
        let ty = if op.is_comparison() || op.is_logic() { BOOL } else { self.ty };
        self.p.alloc(TExpr::Binary(op, a, b), ty, Default::default())
    }

    fn cmp_const(&mut self, op: BinOp, a: TExprId, k: i64) -> TExprId {
        let c = self.int(k);
        self.bin(op, a, c)
    }

    fn select(&mut self, c: TExprId, a: TExprId, b: TExprId) -> TExprId {
        let ty = self.p.ty(a);
        self.p.alloc(TExpr::Select(c, a, b), ty, Default::default())
    }

    fn neg(&mut self, a: TExprId) -> TExprId {
        self.p.alloc(TExpr::Unary(UnOp::Neg, a), self.ty, Default::default())
    }

    /// `select(adjust, q - 1, q)` for division, `select(adjust, r + d, r)` for modulo.
    fn adjusted(&mut self, op: BinOp, adjust: TExprId, q: TExprId, r: TExprId, d: TExprId) -> TExprId {
        if op == BinOp::FloorDiv {
            let one = self.int(1);
            let q1 = self.bin(BinOp::Sub, q, one);
            self.select(adjust, q1, q)
        } else {
            let r1 = self.bin(BinOp::Add, r, d);
            self.select(adjust, r1, r)
        }
    }
}

/// `a / b` or `a % b` (floor semantics) in machine operations.
fn floor_division(p: &mut Program, op: BinOp, a: TExprId, b: TExprId, ty: Ty) -> TExprId {
    let div = op == BinOp::FloorDiv;
    let a_nonneg = non_negative(p, a);
    let mut g = Build { p, ty };
    match int_const(g.p, b) {
        Some(0) => return if div { g.int(0) } else { a },
        Some(-1) if !unsigned(ty) => return if div { g.neg(a) } else { g.int(0) },
        Some(k) if k > 0 && (a_nonneg || unsigned(ty)) => {
            return g.bin(if div { BinOp::UDiv } else { BinOp::URem }, a, b);
        }
        // An index with a known negative lower bound (`x - 1` over a loop
        // variable: a padded index) is shifted up by a multiple of the divisor:
        // floor(a / k) = (a + k·m) / k − m and a mod k = (a + k·m) mod k with
        // a + k·m ≥ 0, so unsigned division applies, and a vectorizer sees
        // lanes at constant offsets (one load and a shuffle, not a gather).
        Some(k) if k > 0 && ty == Ty::Index && shift_up(g.p, a, k).is_some() => {
            let (m, km) = shift_up(g.p, a, k).expect("checked");
            let km = g.int(km);
            let shifted = g.bin(BinOp::Add, a, km);
            if !div {
                return g.bin(BinOp::URem, shifted, b);
            }
            let q = g.bin(BinOp::UDiv, shifted, b);
            let m = g.int(m);
            return g.bin(BinOp::Sub, q, m);
        }
        Some(k) => {
            // A constant divisor other than 0 and -1: truncating division is safe;
            // round toward -inf when the remainder has the divisor's opposite sign.
            let q = g.bin(BinOp::TruncDiv, a, b);
            let r = g.bin(BinOp::TruncRem, a, b);
            let adjust = g.cmp_const(if k > 0 { BinOp::Lt } else { BinOp::Gt }, r, 0);
            return g.adjusted(op, adjust, q, r, b);
        }
        None => {}
    }
    let one = g.int(1);
    let is_zero = g.cmp_const(BinOp::Eq, b, 0);
    if unsigned(ty) {
        let safe = g.select(is_zero, one, b);
        let qr = g.bin(if div { BinOp::TruncDiv } else { BinOp::TruncRem }, a, safe);
        let zero_case = if div { g.int(0) } else { a };
        return g.select(is_zero, zero_case, qr);
    }
    let is_minus_one = g.cmp_const(BinOp::Eq, b, -1);
    let special = g.bin(BinOp::Or, is_zero, is_minus_one);
    let safe = g.select(special, one, b);
    let q = g.bin(BinOp::TruncDiv, a, safe);
    let r = g.bin(BinOp::TruncRem, a, safe);
    let r_nonzero = g.cmp_const(BinOp::Ne, r, 0);
    let r_neg = g.cmp_const(BinOp::Lt, r, 0);
    let d_neg = g.cmp_const(BinOp::Lt, safe, 0);
    let signs_differ = g.bin(BinOp::Ne, r_neg, d_neg);
    let adjust = g.bin(BinOp::And, r_nonzero, signs_differ);
    let general = g.adjusted(op, adjust, q, r, safe);
    let minus_one_case = if div { g.neg(a) } else { g.int(0) };
    let zero_case = if div { g.int(0) } else { a };
    let not_zero = g.select(is_minus_one, minus_one_case, general);
    g.select(is_zero, zero_case, not_zero)
}
