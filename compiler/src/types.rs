//! Element types and the typing lattice used by resolution.

use std::fmt;

pub use texc_runtime::DType as ElemType;

/// The type of an expression during resolution. Literals, shape symbols,
/// constants and index variables are *adaptable*: they take the type of the
/// other operand (LANGUAGE.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RTy {
    Elem(ElemType),
    /// Integer-valued and exact (computed in i64): integer literals, symbols,
    /// constants, index variables and integer arithmetic of them.
    IntLike,
    /// A float literal or arithmetic involving one, with no concrete type yet.
    FloatLike,
}

impl RTy {
    pub fn is_adaptable(self) -> bool {
        !matches!(self, RTy::Elem(_))
    }

    pub fn is_bool(self) -> bool {
        self == RTy::Elem(ElemType::Bool)
    }

    pub fn is_numeric(self) -> bool {
        !self.is_bool()
    }

    pub fn is_float(self) -> bool {
        match self {
            RTy::Elem(e) => e.is_float(),
            RTy::FloatLike => true,
            RTy::IntLike => false,
        }
    }

    /// The type both operands take, or `None` if they are incompatible.
    pub fn unify(a: RTy, b: RTy) -> Option<RTy> {
        use RTy::*;
        match (a, b) {
            (Elem(x), Elem(y)) => (x == y).then_some(a),
            (Elem(x), IntLike) | (IntLike, Elem(x)) => (x != ElemType::Bool).then_some(Elem(x)),
            (Elem(x), FloatLike) | (FloatLike, Elem(x)) => x.is_float().then_some(Elem(x)),
            (IntLike, IntLike) => Some(IntLike),
            _ => Some(FloatLike),
        }
    }

    /// The concrete type an adaptable expression gets when nothing else decides.
    pub fn default_elem(self) -> ElemType {
        match self {
            RTy::Elem(e) => e,
            RTy::IntLike => ElemType::I32,
            RTy::FloatLike => ElemType::F32,
        }
    }
}

impl fmt::Display for RTy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RTy::Elem(e) => write!(f, "{e}"),
            RTy::IntLike => f.write_str("an integer"),
            RTy::FloatLike => f.write_str("a float literal"),
        }
    }
}
