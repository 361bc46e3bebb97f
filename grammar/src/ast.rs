//! The abstract syntax tree of one `.tex` file.
//!
//! Expressions live in a flat arena ([`Ast::exprs`]) addressed by [`ExprId`];
//! their spans live in a parallel side table ([`Ast::expr_spans`]). Children
//! are always allocated before their parents, so `ExprId` order is a
//! post-order of every expression tree: passes can compute per-expression
//! facts with a forward loop instead of recursion.
//!
//! Items, statements and schedule primitives are few and small; they carry
//! their spans inline. Names are [`Ident`]s, which carry their own span.

use crate::span::{FileId, Span};
use std::fmt;

/// Index of an expression in [`Ast::exprs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExprId(pub u32);

impl ExprId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ExprId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// A name as written, with where it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
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
}

/// A variable binder: `k` or `k in lo..hi`.
#[derive(Clone, Debug, PartialEq)]
pub struct Binder {
    pub var: Ident,
    pub range: Option<(ExprId, ExprId)>,
}

/// A call argument: positional `e` or named `name = e`.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: ExprId,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Int(i64),
    Float(f64),
    /// A bare identifier: index variable, scalar, constant, shape symbol or tensor.
    Name(Ident),
    /// `T[e, ...]`.
    Access {
        tensor: Ident,
        indices: Vec<ExprId>,
    },
    /// `f(args)`: a built-in function, a cast, or a kernel (composition).
    Call {
        func: Ident,
        args: Vec<Arg>,
    },
    /// `sum[k, r in 0..R](body)` and friends.
    Reduce {
        op: Ident,
        binders: Vec<Binder>,
        body: ExprId,
    },
    Unary {
        op: UnOp,
        arg: ExprId,
    },
    Binary {
        op: BinOp,
        lhs: ExprId,
        rhs: ExprId,
    },
}

impl Expr {
    /// Direct sub-expressions, in source order.
    pub fn children(&self) -> Vec<ExprId> {
        match self {
            Expr::Int(_) | Expr::Float(_) | Expr::Name(_) => vec![],
            Expr::Access { indices, .. } => indices.clone(),
            Expr::Call { args, .. } => args.iter().map(|a| a.value).collect(),
            Expr::Reduce { binders, body, .. } => {
                let mut v: Vec<ExprId> = binders.iter().flat_map(|b| b.range.map(|(l, h)| [l, h])).flatten().collect();
                v.push(*body);
                v
            }
            Expr::Unary { arg, .. } => vec![*arg],
            Expr::Binary { lhs, rhs, .. } => vec![*lhs, *rhs],
        }
    }
}

/// One dimension of a declared shape: an expression, or `M = 64`
/// (a shape symbol with a default size).
#[derive(Clone, Debug, PartialEq)]
pub struct Dim {
    pub expr: ExprId,
    pub default: Option<ExprId>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ParamKind {
    /// `X: f32[N, C]` (`f32[]` is a 0-d tensor).
    Tensor { elem: Ident, dims: Vec<Dim> },
    /// `eps: f32 = 1e-5`: a run-time scalar.
    Scalar { elem: Ident, default: Option<ExprId> },
    /// `const pad: int = 1`: a compile-time integer.
    Const { ty: Ident, default: Option<ExprId> },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: Ident,
    pub kind: ParamKind,
    pub span: Span,
}

/// `Y: f32[N, M]`; an output written without brackets is 0-d.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub name: Ident,
    pub elem: Ident,
    pub dims: Vec<Dim>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `T[i, j in 0..N] = e;`
    Def { tensor: Ident, axes: Vec<Binder>, value: ExprId, span: Span },
    /// `T = e;` or `(A, B) = e;`: a composition call, a copy, or a 0-d definition.
    Assign { targets: Vec<Ident>, value: ExprId, span: Span },
}

impl Stmt {
    pub fn span(&self) -> Span {
        match self {
            Stmt::Def { span, .. } | Stmt::Assign { span, .. } => *span,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: Ident,
    pub params: Vec<Param>,
    pub outputs: Vec<Output>,
    pub body: Vec<Stmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ImportPath {
    /// `import std.nn;`
    Module(Vec<Ident>),
    /// `import "other.tex";`
    File { path: String, span: Span },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Import {
    pub path: ImportPath,
    pub span: Span,
}

/// `C.ji`
#[derive(Clone, Debug, PartialEq)]
pub struct AxisRef {
    pub stage: Ident,
    pub axis: Ident,
}

/// A split factor: a number or a tunable `?name`.
#[derive(Clone, Debug, PartialEq)]
pub enum Factor {
    Const(i64, Span),
    Tunable(Ident),
}

#[derive(Clone, Debug, PartialEq)]
pub enum PrimKind {
    /// `pipeline S.a by n`: the shared buffers computed at `S.a` are
    /// refilled `n - 1` slices ahead with asynchronous copies.
    Pipeline {
        axis: AxisRef,
        stages: Factor,
    },
    Split {
        axis: AxisRef,
        factor: Factor,
        outer: Ident,
        inner: Ident,
    },
    Tile {
        stage: Ident,
        axes: Vec<Ident>,
        factors: Vec<Factor>,
        new_axes: Vec<Ident>,
    },
    Fuse {
        stage: Ident,
        axes: Vec<Ident>,
        fused: Ident,
    },
    Reorder {
        stage: Ident,
        axes: Vec<Ident>,
    },
    Vectorize(AxisRef),
    Unroll(AxisRef),
    Parallel(AxisRef),
    Inline {
        stage: Ident,
    },
    ComputeAt {
        stage: Ident,
        at: AxisRef,
    },
    CacheRead {
        tensor: Ident,
        consumer: Ident,
        at: AxisRef,
        scope: Option<Ident>,
        layout: Option<Vec<ExprId>>,
        name: Ident,
    },
    CacheWrite {
        stage: Ident,
        at: AxisRef,
        scope: Option<Ident>,
        name: Ident,
    },
    Bind {
        axis: AxisRef,
        unit: Ident,
        dim: Ident,
    },
    Tensorize {
        stage: Ident,
        axes: Vec<Ident>,
        intrinsic: Ident,
    },
    Tune {
        name: Ident,
        values: Vec<(i64, Span)>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Primitive {
    pub kind: PrimKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleBody {
    /// `= auto;`
    Auto,
    Primitives(Vec<Primitive>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub kernel: Ident,
    /// Target name as written, e.g. `x86-avx2`.
    pub target: Ident,
    pub body: ScheduleBody,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Import(Import),
    Kernel(Kernel),
    Schedule(Schedule),
}

/// One parsed file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ast {
    pub file: FileId,
    pub exprs: Vec<Expr>,
    pub expr_spans: Vec<Span>,
    pub items: Vec<Item>,
}

impl Ast {
    pub fn expr(&self, id: ExprId) -> &Expr {
        &self.exprs[id.index()]
    }

    pub fn span(&self, id: ExprId) -> Span {
        self.expr_spans[id.index()]
    }

    pub fn alloc(&mut self, expr: Expr, span: Span) -> ExprId {
        self.exprs.push(expr);
        self.expr_spans.push(span);
        ExprId(self.exprs.len() as u32 - 1)
    }

    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        self.items.iter().filter_map(|i| match i {
            Item::Kernel(k) => Some(k),
            _ => None,
        })
    }

    pub fn schedules(&self) -> impl Iterator<Item = &Schedule> {
        self.items.iter().filter_map(|i| match i {
            Item::Schedule(s) => Some(s),
            _ => None,
        })
    }

    pub fn imports(&self) -> impl Iterator<Item = &Import> {
        self.items.iter().filter_map(|i| match i {
            Item::Import(s) => Some(s),
            _ => None,
        })
    }
}
