//! What every operator of [`crate::ops`] computes: the one definition that
//! the interpreter evaluates and that every backend must reproduce
//! (docs/language.md, "Semantics").
//!
//! - Floats are computed in f64 and rounded to the element type when stored;
//!   backends compute in the element type, so results agree to rounding.
//! - Integers are exact and wrap at the width of their type (two's
//!   complement); `Index` arithmetic is 64-bit.
//! - Integer `/` and `%` are floor division and modulo with `x / 0 == 0` and
//!   `x % 0 == x`; `TruncDiv`/`TruncRem` round toward zero (their divisor is
//!   never 0 or -1 after legalization; here they are total anyway).
//! - `max`, `min`, `clamp` and the `max`/`min` reductions propagate NaN;
//!   `round` rounds half to even.
//! - Float-to-integer conversions truncate toward zero, saturate, and map
//!   NaN to 0; integer-to-integer conversions wrap; anything to bool is `!= 0`.

use crate::ops::{BinOp, Intrinsic, MathFn, ReduceOp, UnOp};
use crate::tir::Ty;
use crate::types::ElemType;
use texc_runtime::{round_to, wrap_to};

/// A value during evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum V {
    F(f64),
    I(i64),
    B(bool),
}

impl V {
    pub fn f(self) -> f64 {
        match self {
            V::F(x) => x,
            V::I(x) => x as f64,
            V::B(b) => b as u8 as f64,
        }
    }

    pub fn i(self) -> i64 {
        match self {
            V::I(x) => x,
            V::F(x) => x as i64,
            V::B(b) => b as i64,
        }
    }

    pub fn b(self) -> bool {
        match self {
            V::B(b) => b,
            V::I(x) => x != 0,
            V::F(x) => x != 0.0,
        }
    }
}

fn is_float(t: Ty) -> bool {
    matches!(t, Ty::Elem(e) if e.is_float())
}

/// Float to integer: truncate, saturate, NaN to 0 (Rust's `as`).
pub fn cast_f64_to_int(v: f64, t: ElemType) -> i64 {
    match t {
        ElemType::I8 => v as i8 as i64,
        ElemType::U8 => v as u8 as i64,
        ElemType::I32 => v as i32 as i64,
        ElemType::Bool => (v != 0.0) as i64,
        _ => v as i64,
    }
}

pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        // ±0: +0 is the larger (IEEE 754-2019 `maximum`, as LLVM and AVX-512's `vrange`).
        if a.is_sign_positive() {
            a
        } else {
            b
        }
    } else {
        a.max(b)
    }
}

pub fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        if a.is_sign_negative() {
            a
        } else {
            b
        }
    } else {
        a.min(b)
    }
}

/// Floor division with `a / 0 == 0` (wrapping: `MIN / -1 == MIN`).
pub fn floor_div(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if (a.wrapping_rem(b) != 0) && ((a < 0) != (b < 0)) {
        q.wrapping_sub(1)
    } else {
        q
    }
}

/// Floor modulo with `a % 0 == a`.
pub fn floor_mod(a: i64, b: i64) -> i64 {
    if b == 0 {
        return a;
    }
    a.wrapping_sub(b.wrapping_mul(floor_div(a, b)))
}

/// Floor division for compile-time sizes: `None` on division by zero or overflow.
pub fn checked_floor_div(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    let q = a.checked_div(b)?;
    Some(if (a % b != 0) && ((a < 0) != (b < 0)) { q - 1 } else { q })
}

/// Floor modulo for compile-time sizes: `None` on division by zero or overflow.
pub fn checked_floor_mod(a: i64, b: i64) -> Option<i64> {
    a.checked_sub(b.checked_mul(checked_floor_div(a, b)?)?)
}

/// The smallest and largest value of an integer type.
pub fn int_bounds(ty: Ty) -> (i64, i64) {
    match ty {
        Ty::Elem(ElemType::I8) => (i8::MIN as i64, i8::MAX as i64),
        Ty::Elem(ElemType::U8) => (0, u8::MAX as i64),
        Ty::Elem(ElemType::I32) => (i32::MIN as i64, i32::MAX as i64),
        Ty::Elem(ElemType::Bool) => (0, 1),
        _ => (i64::MIN, i64::MAX),
    }
}

/// Wrap an integer to its type.
pub fn wrap(ty: Ty, v: i64) -> i64 {
    match ty {
        Ty::Elem(e) => wrap_to(e, v),
        Ty::Index => v,
    }
}

/// `op` on values. `ty` is the result type, `operand_ty` the operands' type.
/// `And`/`Or` here see both operands; evaluators short-circuit before calling.
pub fn binary(op: BinOp, ty: Ty, operand_ty: Ty, x: V, y: V) -> V {
    let float = is_float(operand_ty);
    if op.is_comparison() {
        return V::B(if float { compare(op, x.f(), y.f()) } else { compare(op, x.i(), y.i()) });
    }
    match op {
        BinOp::And => return V::B(x.b() && y.b()),
        BinOp::Or => return V::B(x.b() || y.b()),
        _ => {}
    }
    if float {
        return V::F(arith_f64(op, x.f(), y.f()));
    }
    V::I(arith_i64(op, ty, x.i(), y.i()))
}

/// Float arithmetic `op` (not a comparison, `&&` or `||`), in f64.
#[inline]
pub fn arith_f64(op: BinOp, a: f64, b: f64) -> f64 {
    match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        _ => a / b,
    }
}

/// Integer arithmetic `op` (not a comparison, `&&` or `||`) with result
/// type `ty`: exact, then wrapped to `ty`.
#[inline]
pub fn arith_i64(op: BinOp, ty: Ty, a: i64, b: i64) -> i64 {
    let r = match op {
        BinOp::Add => a.wrapping_add(b),
        BinOp::Sub => a.wrapping_sub(b),
        BinOp::Mul => a.wrapping_mul(b),
        BinOp::FloorDiv | BinOp::Div => floor_div(a, b),
        BinOp::FloorMod => floor_mod(a, b),
        BinOp::TruncDiv if b != 0 => a.wrapping_div(b),
        BinOp::TruncRem if b != 0 => a.wrapping_rem(b),
        BinOp::TruncDiv => 0,
        // As code generators divide: the operands' bits as unsigned numbers of the type's width.
        BinOp::UDiv | BinOp::URem if b != 0 => {
            let (x, y) = (unsigned(ty, a), unsigned(ty, b));
            (if op == BinOp::UDiv { x / y } else { x % y }) as i64
        }
        BinOp::UDiv => 0,
        _ => a,
    };
    wrap(ty, r)
}

/// `v`'s bits, at the width of `ty`, as an unsigned number.
fn unsigned(ty: Ty, v: i64) -> u64 {
    let bits = match ty {
        Ty::Elem(e) if e.is_int() && e.size() < 8 => 8 * e.size() as u32,
        _ => 64,
    };
    if bits == 64 {
        v as u64
    } else {
        (v as u64) & ((1u64 << bits) - 1)
    }
}

/// A comparison `op` (the operands' type decides whether they are compared as floats or integers).
#[inline]
pub fn compare<T: PartialOrd>(op: BinOp, a: T, b: T) -> bool {
    match op {
        BinOp::Lt => a < b,
        BinOp::Le => a <= b,
        BinOp::Gt => a > b,
        BinOp::Ge => a >= b,
        BinOp::Eq => a == b,
        _ => a != b,
    }
}

pub fn unary(op: UnOp, ty: Ty, x: V) -> V {
    match (op, x) {
        (UnOp::Not, x) => V::B(!x.b()),
        (UnOp::Neg, V::F(x)) => V::F(-x),
        (UnOp::Neg, V::I(x)) => V::I(wrap(ty, x.wrapping_neg())),
        (UnOp::Neg, V::B(b)) => V::B(b),
    }
}

/// A math function of result type `ty`.
pub fn math(f: MathFn, ty: Ty, a: &[V]) -> V {
    if !is_float(ty) {
        let x: Vec<i64> = a.iter().map(|v| v.i()).collect();
        return V::I(math_i64(f, ty, &x));
    }
    let x: Vec<f64> = a.iter().map(|v| v.f()).collect();
    V::F(math_f64(f, &x))
}

/// A math function on integers of type `ty` (wrapped to it).
pub fn math_i64(f: MathFn, ty: Ty, x: &[i64]) -> i64 {
    wrap(
        ty,
        match f {
            MathFn::Abs => x[0].wrapping_abs(),
            MathFn::Max => x[0].max(x[1]),
            MathFn::Min => x[0].min(x[1]),
            MathFn::Clamp => x[0].max(x[1]).min(x[2]),
            // Resolution restricts the others to floats.
            _ => x[0],
        },
    )
}

/// A math function on floats, in f64.
#[inline]
pub fn math_f64(f: MathFn, x: &[f64]) -> f64 {
    match f {
        MathFn::Exp => x[0].exp(),
        MathFn::Log => x[0].ln(),
        MathFn::Sqrt => x[0].sqrt(),
        MathFn::Rsqrt => 1.0 / x[0].sqrt(),
        MathFn::Tanh => x[0].tanh(),
        MathFn::Sigmoid => 1.0 / (1.0 + (-x[0]).exp()),
        MathFn::Erf => libm::erf(x[0]),
        MathFn::Erfc => libm::erfc(x[0]),
        MathFn::Abs => x[0].abs(),
        MathFn::Floor => x[0].floor(),
        MathFn::Ceil => x[0].ceil(),
        MathFn::Round => x[0].round_ties_even(),
        MathFn::Max => nan_max(x[0], x[1]),
        MathFn::Min => nan_min(x[0], x[1]),
        MathFn::Pow => x[0].powf(x[1]),
        MathFn::Clamp => nan_min(nan_max(x[0], x[1]), x[2]),
    }
}

/// A target intrinsic (exact in f64, like the rest of the oracle).
pub fn intrinsic(i: Intrinsic, ty: Ty, a: &[V]) -> V {
    match i {
        Intrinsic::Fma if is_float(ty) => V::F(a[0].f() * a[1].f() + a[2].f()),
        Intrinsic::Fma => V::I(wrap(ty, a[0].i().wrapping_mul(a[1].i()).wrapping_add(a[2].i()))),
        Intrinsic::Dot4 => V::I(wrap(ty, a[0].i().wrapping_add(dot4(a[1].i(), a[2].i())))),
        Intrinsic::Dot2 => V::I(wrap(ty, a[0].i().wrapping_add(dot2(a[1].i(), a[2].i())))),
        Intrinsic::Dot4Sat => V::I(wrap(ty, a[0].i().wrapping_add(dot4sat(a[1].i(), a[2].i())))),
    }
}

/// The products of `a`'s bytes (unsigned) by `b`'s (signed), each pair
/// (bytes 0–1, 2–3) summed and saturated to `i16`, the two summed:
/// [`Intrinsic::Dot4Sat`] without its accumulator.
pub fn dot4sat(a: i64, b: i64) -> i64 {
    let product = |t: i64| i64::from((a >> (8 * t)) as u8) * i64::from((b >> (8 * t)) as i8);
    [0, 2].iter().map(|&t| (product(t) + product(t + 1)).clamp(i16::MIN.into(), i16::MAX.into())).sum()
}

/// The two products of `a`'s 16-bit halves by `b`'s, both signed, summed:
/// [`Intrinsic::Dot2`] without its accumulator (the caller wraps it to
/// `i32`, as `vpmaddwd` does the one sum that overflows, `2 · (-2¹⁵)²`).
pub fn dot2(a: i64, b: i64) -> i64 {
    (0..2).map(|t| i64::from((a >> (16 * t)) as i16) * i64::from((b >> (16 * t)) as i16)).sum()
}

/// The four products of `a`'s bytes (unsigned) by `b`'s (signed), summed:
/// [`Intrinsic::Dot4`] without its accumulator.
pub fn dot4(a: i64, b: i64) -> i64 {
    (0..4).map(|t| i64::from((a >> (8 * t)) as u8) * i64::from((b >> (8 * t)) as i8)).sum()
}

/// Convert a value to `ty`.
pub fn cast(v: V, ty: Ty) -> V {
    match ty {
        Ty::Index => V::I(v.i()),
        Ty::Elem(ElemType::Bool) => V::B(v.b()),
        Ty::Elem(e) if e.is_float() => V::F(round_to(e, v.f())),
        Ty::Elem(e) => match v {
            V::F(x) => V::I(cast_f64_to_int(x, e)),
            V::I(x) => V::I(wrap_to(e, x)),
            V::B(b) => V::I(b as i64),
        },
    }
}

/// The identity of a reduction over values of type `ty`.
pub fn reduce_identity(op: ReduceOp, ty: Ty) -> V {
    let (lo, hi) = int_bounds(ty);
    match (op, is_float(ty)) {
        (ReduceOp::Sum, true) => V::F(0.0),
        (ReduceOp::Sum, false) => V::I(0),
        (ReduceOp::Prod, true) => V::F(1.0),
        (ReduceOp::Prod, false) => V::I(1),
        (ReduceOp::Max, true) => V::F(f64::NEG_INFINITY),
        (ReduceOp::Min, true) => V::F(f64::INFINITY),
        (ReduceOp::Max, false) => V::I(lo),
        (ReduceOp::Min, false) => V::I(hi),
    }
}

/// One step of a reduction: `acc ⊕ x`, unwrapped (the caller wraps the total).
pub fn reduce_step(op: ReduceOp, ty: Ty, acc: V, x: V) -> V {
    if is_float(ty) {
        return V::F(reduce_step_f64(op, acc.f(), x.f()));
    }
    V::I(reduce_step_i64(op, acc.i(), x.i()))
}

/// One step of a float reduction, in f64.
#[inline]
pub fn reduce_step_f64(op: ReduceOp, a: f64, b: f64) -> f64 {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Max => nan_max(a, b),
        ReduceOp::Min => nan_min(a, b),
    }
}

/// One step of an integer reduction, unwrapped (the caller wraps the total).
#[inline]
pub fn reduce_step_i64(op: ReduceOp, a: i64, b: i64) -> i64 {
    match op {
        ReduceOp::Sum => a.wrapping_add(b),
        ReduceOp::Prod => a.wrapping_mul(b),
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
    }
}
