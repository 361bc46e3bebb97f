//! The tensor IR (TIR): one kernel specialized to concrete shapes, with every
//! composition call inlined.
//!
//! A [`Program`] is a list of [`Stage`]s in execution order. Each stage
//! defines every element of one tensor by an expression over its axes
//! (`vars[..n_axes]`) and reduction variables (the rest). Expressions live in
//! one arena with a parallel type table and span table.
//!
//! Operators are texc's own ([`crate::ops`]), with semantics defined once in
//! [`crate::semantics`].
//!
//! Invariants (checked by [`crate::verify`]): every expression has a concrete
//! type; operands of arithmetic and comparisons have equal types; index
//! expressions have type [`Ty::Index`]; a stage reads only tensors that are
//! inputs or were written by an earlier stage; loads have one index per
//! dimension and were proven in bounds (`crate::bounds`); all variables start
//! at 0 and range over `0..extent`.

use crate::ops::{BinOp, Intrinsic, MathFn, ReduceOp, UnOp};
use crate::types::ElemType;
use std::fmt;
use texc_grammar::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TExprId(pub u32);

/// Index of a variable in its stage's `vars`.
pub type VarId = u32;

/// Concrete expression types. `Index` is exact 64-bit integer arithmetic
/// (indices, sizes, and integer literals not yet converted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    Index,
    Elem(ElemType),
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Index => f.write_str("index"),
            Ty::Elem(e) => write!(f, "{e}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum TExpr {
    /// An integer constant (type `Index` or an integer/bool element type).
    Int(i64),
    /// A float constant, already rounded to its type.
    Float(f64),
    Var(VarId),
    /// A run-time scalar parameter.
    Scalar(u32),
    Load(TensorId, Vec<TExprId>),
    Unary(UnOp, TExprId),
    Binary(BinOp, TExprId, TExprId),
    /// `select(cond, a, b)`: evaluates the condition, then only the side it chooses.
    Select(TExprId, TExprId, TExprId),
    /// A built-in function; operands and result have this node's type.
    Math(MathFn, Vec<TExprId>),
    /// A target intrinsic (never written by users; see [`crate::ops::Intrinsic`]).
    Intrinsic(Intrinsic, Vec<TExprId>),
    /// Conversion to this node's type.
    Cast(TExprId),
    Reduce(ReduceOp, Vec<VarId>, TExprId),
}

impl TExpr {
    /// The constant node of a value.
    pub fn constant(v: crate::semantics::V) -> TExpr {
        match v {
            crate::semantics::V::F(x) => TExpr::Float(x),
            crate::semantics::V::I(k) => TExpr::Int(k),
            crate::semantics::V::B(b) => TExpr::Int(b as i64),
        }
    }

    /// The identity of reduction `op` over values of type `ty`, as a constant node.
    pub fn reduce_identity(op: ReduceOp, ty: Ty) -> TExpr {
        TExpr::constant(crate::semantics::reduce_identity(op, ty))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    Input,
    Output,
    Temp,
}

#[derive(Clone, Debug)]
pub struct TensorDecl {
    pub name: String,
    pub elem: ElemType,
    pub shape: Vec<i64>,
    pub role: TensorRole,
    pub span: Span,
}

impl TensorDecl {
    pub fn len(&self) -> i64 {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Debug)]
pub struct ScalarDecl {
    pub name: String,
    pub elem: ElemType,
    /// Value used when none is given.
    pub default: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct VarDecl {
    pub name: String,
    pub extent: i64,
}

#[derive(Clone, Debug)]
pub struct Stage {
    pub tensor: TensorId,
    /// Axes first (`n_axes` of them), then reduction variables.
    pub vars: Vec<VarDecl>,
    pub n_axes: usize,
    pub value: TExprId,
    pub span: Span,
}

/// A parameter of the specialized kernel, in declaration order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ProgramParam {
    Tensor(TensorId),
    Scalar(u32),
}

/// One statement of the entry kernel — a call of another kernel (an
/// operator) or a definition — and the stages it became. This is the
/// operator graph that `emit --stage graph` and `analyze` show.
#[derive(Clone, Debug)]
pub struct OpRecord {
    /// The called kernel, or `compute` for a definition, `copy` for a copy.
    pub op: String,
    /// Compile-time arguments of a call, as `name=value`.
    pub attrs: Vec<String>,
    /// Tensors its stages read that it does not write itself.
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
    pub stages: std::ops::Range<usize>,
    pub span: Span,
    /// For calls: the arguments in the callee's parameter order.
    pub args: Vec<OpArg>,
    /// For calls: whether the callee is a standard-library kernel.
    pub std_callee: bool,
}

/// An argument of a recorded call.
#[derive(Clone, Debug, PartialEq)]
pub enum OpArg {
    Tensor(TensorId),
    Const(i64),
    /// A scalar written as a caller scalar's name or a number; `None` when
    /// it is some other expression.
    Scalar(Option<String>),
}

#[derive(Clone, Debug, Default)]
pub struct Program {
    /// The entry kernel's statements as operators, in order.
    pub ops: Vec<OpRecord>,
    pub name: String,
    /// The file that defines the entry kernel, as it was named when loaded
    /// (printed with the loop IR, so that a `.loops` file names its oracle).
    pub source: Option<String>,
    /// Shape symbols and constants of the entry kernel with their values.
    pub bindings: Vec<(String, i64)>,
    pub tensors: Vec<TensorDecl>,
    pub scalars: Vec<ScalarDecl>,
    pub params: Vec<ProgramParam>,
    pub outputs: Vec<TensorId>,
    pub stages: Vec<Stage>,
    pub exprs: Vec<TExpr>,
    pub tys: Vec<Ty>,
    pub spans: Vec<Span>,
    /// The tensors' names, indexed for [`Program::fresh_tensor_name`].
    names: TensorNames,
}

/// The names of a program's tensors, sorted, each with how many tensors
/// bear it, so that a pass finds a fresh name or counts the names with a
/// prefix without comparing every tensor's (a scan per new tensor is
/// quadratic in a model's layers). A cache, not part of the program's
/// value: a clone starts empty, and each query first indexes the tensors
/// appended since the last. Passes append tensors and do not rename them
/// once a name has been asked for; debug builds check every answer
/// against a scan.
#[derive(Default)]
struct TensorNames(std::sync::Mutex<SortedNames>);

#[derive(Default)]
struct SortedNames {
    sorted: std::collections::BTreeMap<String, usize>,
    upto: usize,
}

impl Clone for TensorNames {
    fn clone(&self) -> TensorNames {
        TensorNames::default()
    }
}

impl fmt::Debug for TensorNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TensorNames")
    }
}

impl TensorNames {
    /// The index, with the tensors appended since the last query in it.
    fn synced(&self, tensors: &[TensorDecl]) -> std::sync::MutexGuard<'_, SortedNames> {
        // A panic elsewhere while it was held leaves an index that is still a cache.
        let mut names = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        names.sync(tensors);
        names
    }
}

impl SortedNames {
    fn sync(&mut self, tensors: &[TensorDecl]) {
        if self.upto > tensors.len() {
            *self = SortedNames::default();
        }
        for t in &tensors[self.upto..] {
            *self.sorted.entry(t.name.clone()).or_default() += 1;
        }
        self.upto = tensors.len();
    }
}

/// `base`, then `base1`, `base2`, …: the names [`Program::fresh_tensor_name`] tries in turn.
fn candidate_names(base: &str) -> impl Iterator<Item = String> + '_ {
    (0..).map(move |k| if k == 0 { base.to_string() } else { format!("{base}{k}") })
}

/// A stage whose value is a one-hot sum, how `.tex` writes a gather
/// (`std.nn`'s `embedding`): `sum[v](select(index == T(v), hit, 0))` with
/// `index` an integer expression that does not involve `v`, the stage's
/// last variable and the sum's only one. Exactly one term can be non-zero:
/// `hit` at `v = index`, where `index` is in `0..extent`.
#[derive(Clone, Copy, Debug)]
pub struct OneHot {
    pub var: VarId,
    pub extent: i64,
    pub index: TExprId,
    pub hit: TExprId,
    pub miss: TExprId,
}

impl Stage {
    pub fn one_hot(&self, p: &Program) -> Option<OneHot> {
        let TExpr::Reduce(ReduceOp::Sum, rvars, body) = p.expr(self.value) else { return None };
        let [v] = rvars[..] else { return None };
        if v as usize + 1 != self.vars.len() || (v as usize) < self.n_axes {
            return None;
        }
        let TExpr::Select(cond, hit, miss) = p.expr(*body) else { return None };
        let zero = matches!(p.expr(*miss), TExpr::Float(x) if *x == 0.0) || matches!(p.expr(*miss), TExpr::Int(0));
        let TExpr::Binary(BinOp::Eq, l, r) = p.expr(*cond) else { return None };
        let is_v = |x: TExprId| match p.expr(x) {
            TExpr::Cast(a) => matches!(p.expr(*a), TExpr::Var(w) if *w == v),
            TExpr::Var(w) => *w == v,
            _ => false,
        };
        let index = match (is_v(*l), is_v(*r)) {
            (true, false) => *r,
            (false, true) => *l,
            _ => return None,
        };
        // i32 or i64 indices, which hold every `v` (narrower ones would wrap,
        // and `V` itself would not fit the range check).
        let extent = self.vars[v as usize].extent;
        let int = match p.ty(index) {
            Ty::Elem(ElemType::I64) => true,
            Ty::Elem(ElemType::I32) => extent <= i32::MAX as i64,
            _ => false,
        };
        (zero && int && !p.mentions(index, v)).then_some(OneHot { var: v, extent, index, hit: *hit, miss: *miss })
    }
}

impl Program {
    /// `base`, or `base` with the first number that makes it a name no
    /// tensor has (by the index of names: no scan of the tensors).
    pub fn fresh_tensor_name(&self, base: &str) -> String {
        let names = self.names.synced(&self.tensors);
        let name = candidate_names(base).find(|n| !names.sorted.contains_key(n.as_str())).expect("a name");
        debug_assert!(
            candidate_names(base).take_while(|n| *n != name).all(|n| self.tensors.iter().any(|t| t.name == n))
                && self.tensors.iter().all(|t| t.name != name),
            "the index of names is current: {name}"
        );
        name
    }

    /// How many tensors' names start with `prefix` (by the index of names).
    pub fn count_tensor_names_starting_with(&self, prefix: &str) -> usize {
        use std::ops::Bound;
        let names = self.names.synced(&self.tensors);
        let from: (Bound<&str>, Bound<&str>) = (Bound::Included(prefix), Bound::Unbounded);
        let count = names.sorted.range::<str, _>(from).take_while(|(n, _)| n.starts_with(prefix)).map(|(_, k)| k).sum();
        debug_assert_eq!(count, self.tensors.iter().filter(|t| t.name.starts_with(prefix)).count());
        count
    }

    /// Whether `e` mentions variable `var`.
    pub fn mentions(&self, e: TExprId, var: VarId) -> bool {
        self.mentions_where(e, &|v| v == var)
    }

    /// Whether `e` mentions a variable that `pick` accepts.
    pub fn mentions_where(&self, e: TExprId, pick: &dyn Fn(VarId) -> bool) -> bool {
        matches!(self.expr(e), TExpr::Var(v) if pick(*v))
            || self.children(e).into_iter().any(|c| self.mentions_where(c, pick))
    }

    pub fn alloc(&mut self, e: TExpr, ty: Ty, span: Span) -> TExprId {
        self.exprs.push(e);
        self.tys.push(ty);
        self.spans.push(span);
        TExprId(self.exprs.len() as u32 - 1)
    }

    pub fn expr(&self, e: TExprId) -> &TExpr {
        &self.exprs[e.0 as usize]
    }

    pub fn ty(&self, e: TExprId) -> Ty {
        self.tys[e.0 as usize]
    }

    pub fn span(&self, e: TExprId) -> Span {
        self.spans[e.0 as usize]
    }

    pub fn tensor(&self, t: TensorId) -> &TensorDecl {
        &self.tensors[t.0 as usize]
    }

    /// The name of parameter `q` (a tensor's or a scalar's).
    pub fn param_name(&self, q: &ProgramParam) -> &str {
        match q {
            ProgramParam::Tensor(t) => &self.tensor(*t).name,
            ProgramParam::Scalar(s) => &self.scalars[*s as usize].name,
        }
    }

    /// The parameters' names, in order.
    pub fn param_names(&self) -> Vec<String> {
        self.params.iter().map(|q| self.param_name(q).to_string()).collect()
    }

    pub fn input_tensors(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.params.iter().filter_map(|p| match p {
            ProgramParam::Tensor(t) => Some(*t),
            ProgramParam::Scalar(_) => None,
        })
    }

    /// Direct operands of an expression.
    pub fn children(&self, e: TExprId) -> Vec<TExprId> {
        self.child_ids(e).collect()
    }

    /// [`Program::children`] without a `Vec`: for walks that visit every
    /// element they evaluate (the loop evaluator's race watch), where an
    /// allocation per node was a tenth of the time.
    pub fn child_ids(&self, e: TExprId) -> impl Iterator<Item = TExprId> + '_ {
        let (few, n, many): ([TExprId; 3], usize, &[TExprId]) = match self.expr(e) {
            TExpr::Int(_) | TExpr::Float(_) | TExpr::Var(_) | TExpr::Scalar(_) => ([e; 3], 0, &[]),
            TExpr::Load(_, idx) => ([e; 3], 0, idx),
            TExpr::Unary(_, a) | TExpr::Cast(a) | TExpr::Reduce(_, _, a) => ([*a, e, e], 1, &[]),
            TExpr::Binary(_, a, b) => ([*a, *b, e], 2, &[]),
            TExpr::Select(c, a, b) => ([*c, *a, *b], 3, &[]),
            TExpr::Math(_, args) | TExpr::Intrinsic(_, args) => ([e; 3], 0, args),
        };
        few.into_iter().take(n).chain(many.iter().copied())
    }
}
