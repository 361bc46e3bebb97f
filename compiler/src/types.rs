//! Element types and the typing lattice used by resolution.

use std::fmt;

/// Element types of tensors and scalars (LANGUAGE.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemType {
    F16,
    BF16,
    F32,
    F64,
    I8,
    U8,
    I32,
    I64,
    Bool,
}

impl ElemType {
    pub const ALL: [ElemType; 9] = [
        ElemType::F16,
        ElemType::BF16,
        ElemType::F32,
        ElemType::F64,
        ElemType::I8,
        ElemType::U8,
        ElemType::I32,
        ElemType::I64,
        ElemType::Bool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ElemType::F16 => "f16",
            ElemType::BF16 => "bf16",
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
            ElemType::I8 => "i8",
            ElemType::U8 => "u8",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
            ElemType::Bool => "bool",
        }
    }

    pub fn from_name(s: &str) -> Option<ElemType> {
        ElemType::ALL.iter().copied().find(|t| t.name() == s)
    }

    pub fn is_float(self) -> bool {
        matches!(self, ElemType::F16 | ElemType::BF16 | ElemType::F32 | ElemType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, ElemType::I8 | ElemType::U8 | ElemType::I32 | ElemType::I64)
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            ElemType::I8 | ElemType::U8 | ElemType::Bool => 1,
            ElemType::F16 | ElemType::BF16 => 2,
            ElemType::F32 | ElemType::I32 => 4,
            ElemType::F64 | ElemType::I64 => 8,
        }
    }

    pub fn to_runtime(self) -> texc_runtime::DType {
        use texc_runtime::DType as D;
        match self {
            ElemType::F16 => D::F16,
            ElemType::BF16 => D::BF16,
            ElemType::F32 => D::F32,
            ElemType::F64 => D::F64,
            ElemType::I8 => D::I8,
            ElemType::U8 => D::U8,
            ElemType::I32 => D::I32,
            ElemType::I64 => D::I64,
            ElemType::Bool => D::Bool,
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
