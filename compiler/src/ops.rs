//! The operator set of texc's IRs (tensor IR and loop IR), independent of
//! the surface syntax and of any backend.
//!
//! Three tables, kept apart on purpose:
//! - [`BinOp`], [`UnOp`], [`ReduceOp`]: arithmetic, comparison, logic and
//!   reductions. Integer division is *floor* division ([`BinOp::FloorDiv`],
//!   [`BinOp::FloorMod`]) with `x / 0 == 0` and `x % 0 == x`; float division
//!   is [`BinOp::Div`]. The machine forms [`BinOp::TruncDiv`] and
//!   [`BinOp::TruncRem`] appear only after legalization, which guarantees
//!   their divisor is neither 0 nor -1, so that every backend may map them to
//!   its plain division instruction; [`BinOp::UDiv`] and [`BinOp::URem`]
//!   where it proves both operands non-negative (unsigned division).
//! - [`MathFn`]: the built-in functions users call by name (`exp`, `max`, ...).
//! - [`Intrinsic`]: target instructions that passes introduce for a target
//!   that has them (see `Target::intrinsics`). They have no surface name, so
//!   user code can never call them.
//!
//! What each operator computes is defined once, in [`crate::semantics`]; the
//! interpreter evaluates that definition and backends must agree with it.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnOp {
    /// Arithmetic negation (wrapping for integers).
    Neg,
    /// Logical not of a bool.
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// Float division (IEEE 754).
    Div,
    /// Integer floor division; `x / 0 == 0`.
    FloorDiv,
    /// Integer floor modulo (the sign of the divisor); `x % 0 == x`.
    FloorMod,
    /// Integer division rounding toward zero. Only after legalization; the
    /// divisor is never 0, and never -1 for signed types.
    TruncDiv,
    /// Remainder of [`BinOp::TruncDiv`] (the sign of the dividend). Same precondition.
    TruncRem,
    /// Division of a non-negative dividend by a positive divisor (legalization
    /// proves both), so that backends may divide unsigned: a shift for powers of two.
    UDiv,
    /// Remainder of [`BinOp::UDiv`]; same precondition (a mask for powers of two).
    URem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// Short-circuit `&&`: the right operand is evaluated only when the left is true.
    And,
    /// Short-circuit `||`: the right operand is evaluated only when the left is false.
    Or,
}

impl BinOp {
    /// Printed form: an infix symbol, or a function name for the machine forms.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div | BinOp::FloorDiv => "/",
            BinOp::FloorMod => "%",
            BinOp::TruncDiv => "@tdiv",
            BinOp::TruncRem => "@trem",
            BinOp::UDiv => "@udiv",
            BinOp::URem => "@urem",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }

    pub fn is_logic(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or)
    }

    /// Whether the op is printed as a function (`@tdiv(a, b)`) rather than infix.
    pub fn is_machine(self) -> bool {
        matches!(self, BinOp::TruncDiv | BinOp::TruncRem | BinOp::UDiv | BinOp::URem)
    }

    /// The comparison that holds exactly when `self` does not.
    pub fn negated(self) -> Option<BinOp> {
        Some(match self {
            BinOp::Lt => BinOp::Ge,
            BinOp::Le => BinOp::Gt,
            BinOp::Gt => BinOp::Le,
            BinOp::Ge => BinOp::Lt,
            BinOp::Eq => BinOp::Ne,
            BinOp::Ne => BinOp::Eq,
            _ => return None,
        })
    }
}

/// Reductions (`sum[k](...)`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Prod,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];

    pub fn from_name(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|r| r.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        }
    }
}

/// Built-in functions, callable from `.tex` by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MathFn {
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Erf,
    /// `1 - erf(x)`, accurate where `erf(x)` is close to 1.
    Erfc,
    Abs,
    Floor,
    Ceil,
    Round,
    Max,
    Min,
    Pow,
    Clamp,
}

impl MathFn {
    pub const ALL: [MathFn; 16] = [
        MathFn::Exp,
        MathFn::Log,
        MathFn::Sqrt,
        MathFn::Rsqrt,
        MathFn::Tanh,
        MathFn::Sigmoid,
        MathFn::Erf,
        MathFn::Erfc,
        MathFn::Abs,
        MathFn::Floor,
        MathFn::Ceil,
        MathFn::Round,
        MathFn::Max,
        MathFn::Min,
        MathFn::Pow,
        MathFn::Clamp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MathFn::Exp => "exp",
            MathFn::Log => "log",
            MathFn::Sqrt => "sqrt",
            MathFn::Rsqrt => "rsqrt",
            MathFn::Tanh => "tanh",
            MathFn::Sigmoid => "sigmoid",
            MathFn::Erf => "erf",
            MathFn::Erfc => "erfc",
            MathFn::Abs => "abs",
            MathFn::Floor => "floor",
            MathFn::Ceil => "ceil",
            MathFn::Round => "round",
            MathFn::Max => "max",
            MathFn::Min => "min",
            MathFn::Pow => "pow",
            MathFn::Clamp => "clamp",
        }
    }

    pub fn from_name(s: &str) -> Option<MathFn> {
        MathFn::ALL.into_iter().find(|b| b.name() == s)
    }

    pub fn arity(self) -> usize {
        match self {
            MathFn::Max | MathFn::Min | MathFn::Pow => 2,
            MathFn::Clamp => 3,
            _ => 1,
        }
    }

    /// Functions defined on floats only.
    pub fn float_only(self) -> bool {
        !matches!(self, MathFn::Abs | MathFn::Max | MathFn::Min | MathFn::Clamp)
    }

    /// Transcendental functions: expensive enough that passes avoid recomputing them.
    pub fn is_costly(self) -> bool {
        matches!(
            self,
            MathFn::Exp
                | MathFn::Log
                | MathFn::Sqrt
                | MathFn::Rsqrt
                | MathFn::Tanh
                | MathFn::Sigmoid
                | MathFn::Erf
                | MathFn::Erfc
                | MathFn::Pow
        )
    }
}

/// Target instructions that passes introduce; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Intrinsic {
    /// Fused multiply-add `a * b + c` with one rounding (x86 FMA3, Cranelift `fma`).
    Fma,
    /// `@dot4(c, a, b)` on `i32`: `c` plus the four products of `a`'s bytes,
    /// unsigned, with `b`'s, signed (byte `t` is bits `8t..8t+8`), with
    /// wrapping adds — one lane of x86 VNNI's `vpdpbusd`. Integer products
    /// of `u8` by `i8` data packed four to an `i32` use it
    /// (`schedules::dot4`).
    Dot4,
    /// `@dot2(c, a, b)` on `i32`: `c` plus the two products of `a`'s
    /// 16-bit halves with `b`'s, both signed (half `t` is bits
    /// `16t..16t+16`), with wrapping adds — one lane of x86's `vpmaddwd`
    /// plus `vpaddd`. Integer products of 8-bit data on CPUs without VNNI
    /// use it, their operands packed two to an `i32`, each byte widened to
    /// 16 bits once when packed (`schedules::dot4`).
    Dot2,
    /// `@dot4sat(c, a, b)` on `i32`: `c` plus the products of `a`'s bytes,
    /// unsigned, with `b`'s, signed, summed in pairs (bytes 0–1, 2–3) that
    /// each saturate to 16 bits, with wrapping adds — one lane of x86's
    /// `vpmaddubsw`, then `vpmaddwd` by ones and `vpaddd`. Integer products
    /// on CPUs without VNNI use it where their constant weights prove that
    /// no pair sum can saturate (`schedules::dot4`), so that it equals
    /// [`Intrinsic::Dot4`] there.
    Dot4Sat,
}

impl Intrinsic {
    pub const ALL: [Intrinsic; 4] = [Intrinsic::Fma, Intrinsic::Dot4, Intrinsic::Dot2, Intrinsic::Dot4Sat];

    /// Printed form; the leading `@` keeps it apart from every user-callable name.
    pub fn name(self) -> &'static str {
        match self {
            Intrinsic::Fma => "@fma",
            Intrinsic::Dot4 => "@dot4",
            Intrinsic::Dot2 => "@dot2",
            Intrinsic::Dot4Sat => "@dot4sat",
        }
    }

    pub fn arity(self) -> usize {
        match self {
            Intrinsic::Fma | Intrinsic::Dot4 | Intrinsic::Dot2 | Intrinsic::Dot4Sat => 3,
        }
    }
}

impl fmt::Display for Intrinsic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
