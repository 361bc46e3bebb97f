//! Resolution and typing: the shape-agnostic half of semantic analysis.
//!
//! For every kernel of every module this pass resolves names (index
//! variables, scalars, constants, shape symbols, tensors), types every
//! expression (LANGUAGE.md §5, with adaptable literals), resolves calls
//! (built-ins, casts, kernel overloads), and turns statements into a list of
//! [`Op`]s. Results live in [`KernelInfo`] and in per-module side tables
//! ([`Facts`]) keyed by AST [`ExprId`], so later passes never re-derive them.
//!
//! Guarantees: every expression reachable from an op has a type in
//! `Facts::ty`; every `Name` has an entry in `Facts::names`; index
//! expressions use only integer arithmetic of variables, symbols, constants
//! and literals; each tensor is defined once, before use; the call graph is
//! acyclic. Concrete sizes, ranges and bounds are checked later, by
//! `specialize`, when shapes are known.

pub use crate::kernel::*;
use crate::nn::NnOp;
use crate::ops::{MathFn, ReduceOp};
use crate::session::Session;
use crate::types::{ElemType, RTy};
use std::collections::HashMap;
use texc_grammar::ast::{self, Arg, BinOp, Binder, Dim, Expr, ExprId, Ident, ParamKind, Stmt, UnOp};
use texc_grammar::{Ast, Diagnostic, Diagnostics, Span};

/// The built-in function a call names, if any: a math function or `select`.
fn builtin_call(name: &str) -> Option<CallRes> {
    if name == "select" {
        return Some(CallRes::Select);
    }
    MathFn::from_name(name).map(CallRes::Math)
}

/// Every built-in function name, for suggestions.
fn builtin_names() -> impl Iterator<Item = &'static str> {
    MathFn::ALL.into_iter().map(MathFn::name).chain(["select"])
}

/// Resolve every module of the session that has not been resolved yet.
pub fn resolve_session(s: &mut Session) -> Result<(), Diagnostics> {
    let mut diags = Vec::new();
    // Phase 1: signatures of all kernels (calls need callee signatures).
    for m in 0..s.modules.len() {
        if !s.modules[m].kernels.is_empty() || s.modules[m].ast.kernels().next().is_none() {
            continue;
        }
        let mut facts = std::mem::take(&mut s.modules[m].facts);
        let ast = &s.modules[m].ast;
        let mut kernels = Vec::new();
        let mut failed = false;
        for k in ast.kernels() {
            match signature(ast, &mut facts, k) {
                Ok(info) => kernels.push(info),
                Err(d) => {
                    diags.push(d);
                    failed = true;
                    kernels.push(placeholder(k));
                }
            }
        }
        if !failed {
            check_duplicate_signatures(&kernels, &mut diags);
        }
        s.modules[m].facts = facts;
        s.modules[m].kernels = kernels;
    }
    if !diags.is_empty() {
        return Err(diags);
    }
    // Phase 2: bodies.
    for m in 0..s.modules.len() {
        let kernel_asts: Vec<ast::Kernel> = s.modules[m].ast.kernels().cloned().collect();
        for (i, k) in kernel_asts.iter().enumerate() {
            if !s.modules[m].kernels[i].ops.is_empty() {
                continue;
            }
            let mut facts = std::mem::take(&mut s.modules[m].facts);
            let mut info = s.modules[m].kernels[i].clone();
            let r = Body::new(s, m, &mut facts, &mut info).run(k);
            s.modules[m].facts = facts;
            match r {
                Ok(()) => s.modules[m].kernels[i] = info,
                Err(d) => diags.push(d),
            }
        }
    }
    if !diags.is_empty() {
        return Err(diags);
    }
    check_schedules(s, &mut diags);
    check_call_cycles(s, &mut diags);
    if diags.is_empty() {
        Ok(())
    } else {
        Err(diags)
    }
}

fn placeholder(k: &ast::Kernel) -> KernelInfo {
    KernelInfo {
        name: k.name.name.clone(),
        name_span: k.name.span,
        span: k.span,
        params: vec![],
        outputs: vec![],
        tensors: vec![],
        symbols: vec![],
        vars: vec![],
        ops: vec![],
    }
}

fn sig_key(k: &KernelInfo) -> (String, Vec<String>) {
    let s = k
        .params
        .iter()
        .filter_map(|p| match &p.info {
            ParamInfo::Tensor(t) => {
                let t = &k.tensors[*t as usize];
                Some(format!("{}{}", t.elem, t.rank))
            }
            _ => None,
        })
        .collect();
    (k.name.clone(), s)
}

fn check_duplicate_signatures(kernels: &[KernelInfo], diags: &mut Diagnostics) {
    let mut first: HashMap<(String, Vec<String>), usize> = HashMap::new();
    for (i, a) in kernels.iter().enumerate() {
        let j = *first.entry(sig_key(a)).or_insert(i);
        if j != i {
            let b = &kernels[j];
            diags.push(
                Diagnostic::at(
                    a.name_span,
                    format!("kernel `{}` is defined twice with the same tensor parameters", a.name),
                )
                .with_secondary(b.name_span, "first defined here")
                .with_note(
                    "overloads of one name must differ in the element types or ranks of their tensor parameters",
                ),
            );
        }
    }
}

/// Schedules are applied by the scheduling layer; here we check what can be
/// checked without it: the kernel exists and the target is known.
fn check_schedules(s: &Session, diags: &mut Diagnostics) {
    for m in &s.modules {
        let names: std::collections::HashSet<&str> = m.ast.kernels().map(|k| k.name.name.as_str()).collect();
        for sch in m.ast.schedules() {
            if !names.contains(sch.kernel.name.as_str()) {
                diags.push(Diagnostic::at(
                    sch.kernel.span,
                    format!("schedule for unknown kernel `{}`", sch.kernel.name),
                ));
            }
            if crate::target::lookup(&sch.target.name).is_err() {
                diags.push(
                    Diagnostic::at(sch.target.span, format!("unknown target `{}`", sch.target.name))
                        .with_note(format!("targets: {}", crate::target::names())),
                );
            }
            if let Some(first) = m
                .ast
                .schedules()
                .take_while(|x| !std::ptr::eq(*x, sch))
                .find(|x| x.kernel.name == sch.kernel.name && x.target.name == sch.target.name)
            {
                diags.push(
                    Diagnostic::at(
                        sch.target.span,
                        format!("a second schedule of `{}` for `{}`", sch.kernel.name, sch.target.name),
                    )
                    .with_secondary(first.target.span, "the first is here")
                    .with_note("a kernel has at most one schedule per target; merge the two blocks"),
                );
            }
            check_tunables(sch, diags);
        }
    }
}

/// Every `tune t in [...]` names a tunable `?t` of its block, once.
fn check_tunables(sch: &ast::Schedule, diags: &mut Diagnostics) {
    let ast::ScheduleBody::Primitives(prims) = &sch.body else { return };
    let mut used: Vec<&str> = Vec::new();
    for p in prims {
        let factors: Vec<&ast::Factor> = match &p.kind {
            ast::PrimKind::Split { factor, .. } => vec![factor],
            ast::PrimKind::Tile { factors, .. } => factors.iter().collect(),
            _ => vec![],
        };
        used.extend(factors.into_iter().filter_map(|f| match f {
            ast::Factor::Tunable(n) => Some(n.name.as_str()),
            ast::Factor::Const(..) => None,
        }));
    }
    let mut tuned: Vec<&Ident> = Vec::new();
    for p in prims {
        let ast::PrimKind::Tune { name, .. } = &p.kind else { continue };
        if let Some(first) = tuned.iter().find(|t| t.name == name.name) {
            diags.push(
                Diagnostic::at(name.span, format!("`tune {}` is given twice", name.name))
                    .with_secondary(first.span, "first given here"),
            );
        } else if !used.contains(&name.name.as_str()) {
            let mut d = Diagnostic::at(
                name.span,
                format!("`tune {}`: no factor of this schedule is `?{}`", name.name, name.name),
            );
            d = d.with_note(if used.is_empty() {
                "the schedule has no tunable factors; write one as `split S.a by ?t -> (o, i);`".to_string()
            } else {
                format!("its tunables: {}", used.iter().map(|u| format!("?{u}")).collect::<Vec<_>>().join(", "))
            });
            diags.push(d);
        }
        tuned.push(name);
    }
}

fn check_call_cycles(s: &Session, diags: &mut Diagnostics) {
    // Iterative DFS with colours: 0 new, 1 on stack, 2 done.
    let mut colour: HashMap<KernelRef, u8> = HashMap::new();
    for (mi, m) in s.modules.iter().enumerate() {
        for ki in 0..m.kernels.len() {
            let root = KernelRef { module: mi as u32, index: ki as u32 };
            if colour.get(&root).copied().unwrap_or(0) != 0 {
                continue;
            }
            // Each frame keeps its kernel's calls: listing them again per
            // step was quadratic in a model kernel's thousands of calls.
            let calls_of = |k: KernelRef| -> Vec<(KernelRef, Span)> {
                s.kernel(k)
                    .ops
                    .iter()
                    .filter_map(|o| match o {
                        Op::Call { callee, span, .. } => Some((*callee, *span)),
                        _ => None,
                    })
                    .collect()
            };
            let mut stack: Vec<(KernelRef, Vec<(KernelRef, Span)>, usize)> = vec![(root, calls_of(root), 0)];
            colour.insert(root, 1);
            while let Some((k, calls, next)) = stack.last_mut() {
                if *next >= calls.len() {
                    colour.insert(*k, 2);
                    stack.pop();
                    continue;
                }
                let (callee, span) = calls[*next];
                *next += 1;
                match colour.get(&callee).copied().unwrap_or(0) {
                    0 => {
                        colour.insert(callee, 1);
                        stack.push((callee, calls_of(callee), 0));
                    }
                    1 => {
                        diags.push(
                            Diagnostic::at(
                                span,
                                format!(
                                    "recursive call: `{}` calls itself (directly or through other kernels)",
                                    s.kernel(callee).name
                                ),
                            )
                            .with_note("kernels are inlined at compile time, so they cannot recurse"),
                        );
                        return;
                    }
                    _ => {}
                }
            }
        }
    }
}

// ------------------------------------------------------------------ signatures

fn elem_type(id: &Ident) -> Result<ElemType, Diagnostic> {
    ElemType::from_name(&id.name).ok_or_else(|| {
        let mut d = Diagnostic::at(id.span, format!("unknown element type `{}`", texc_grammar::truncate(&id.name, 40)))
            .with_note("element types: f16 bf16 f32 f64 i8 u8 i32 i64 bool");
        if id.name == "int" {
            d = d.with_note("a compile-time integer parameter is written `const n: int`");
        }
        d
    })
}

struct SigBuilder<'a> {
    ast: &'a Ast,
    facts: &'a mut Facts,
    info: KernelInfo,
    const_names: Vec<(String, u32)>,
}

fn signature(ast: &Ast, facts: &mut Facts, k: &ast::Kernel) -> Result<KernelInfo, Diagnostic> {
    // Kernels may share a name with a built-in function (std.nn's `tanh`): a
    // whole-tensor call is the kernel, a call inside an element expression the
    // function. Casts keep their names.
    if ElemType::from_name(&k.name.name).is_some() {
        return Err(Diagnostic::at(
            k.name.span,
            format!("`{}` is an element type and cannot name a kernel", k.name.name),
        ));
    }
    let mut b = SigBuilder { ast, facts, info: placeholder(k), const_names: Vec::new() };
    // Constants may appear in shapes of parameters declared before them.
    for (i, p) in k.params.iter().enumerate() {
        if let ParamKind::Const { .. } = p.kind {
            b.const_names.push((p.name.name.clone(), i as u32));
        }
    }
    // The first parameter of each name (a model's thousands of weights:
    // not a scan of the earlier ones per parameter).
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, p) in k.params.iter().enumerate() {
        let seen = *first.entry(p.name.name.as_str()).or_insert(i);
        if let Some(prev) = (seen < i).then(|| &k.params[seen]) {
            return Err(Diagnostic::at(p.name.span, format!("parameter `{}` is declared twice", p.name.name))
                .with_secondary(prev.name.span, "first declared here"));
        }
        let info = match &p.kind {
            ParamKind::Tensor { elem, dims } => {
                let elem = elem_type(elem)?;
                b.dims(dims)?;
                b.info.tensors.push(TensorInfo {
                    name: p.name.name.clone(),
                    elem,
                    rank: dims.len(),
                    kind: TensorKind::Input(i as u32),
                    span: p.name.span,
                    dims: dims.clone(),
                });
                ParamInfo::Tensor(b.info.tensors.len() as u32 - 1)
            }
            ParamKind::Scalar { elem, default } => {
                let elem = elem_type(elem)?;
                if let Some(d) = default {
                    b.literal_default(*d, RTy::Elem(elem))?;
                }
                ParamInfo::Scalar { elem, default: *default }
            }
            ParamKind::Const { ty, default } => {
                if ty.name != "int" {
                    return Err(Diagnostic::at(
                        ty.span,
                        format!("a `const` parameter has type `int`, not `{}`", texc_grammar::truncate(&ty.name, 40)),
                    ));
                }
                if let Some(d) = default {
                    b.size_expr(*d, false)?;
                }
                ParamInfo::Const { default: *default }
            }
        };
        b.info.params.push(Param { name: p.name.name.clone(), span: p.name.span, info });
    }
    for (i, o) in k.outputs.iter().enumerate() {
        if let Some(p) = k.params.iter().find(|p| p.name.name == o.name.name) {
            return Err(Diagnostic::at(o.name.span, format!("output `{}` has the name of a parameter", o.name.name))
                .with_secondary(p.name.span, "parameter declared here"));
        }
        if let Some(prev) = k.outputs[..i].iter().find(|q| q.name.name == o.name.name) {
            return Err(Diagnostic::at(o.name.span, format!("output `{}` is declared twice", o.name.name))
                .with_secondary(prev.name.span, "first declared here"));
        }
        let elem = elem_type(&o.elem)?;
        b.dims(&o.dims)?;
        b.info.tensors.push(TensorInfo {
            name: o.name.name.clone(),
            elem,
            rank: o.dims.len(),
            kind: TensorKind::Output(i as u32),
            span: o.name.span,
            dims: o.dims.clone(),
        });
        b.info.outputs.push(b.info.tensors.len() as u32 - 1);
    }
    for s in &b.info.symbols {
        if let Some(p) = k.params.iter().find(|p| p.name.name == s.name) {
            return Err(Diagnostic::at(
                s.span,
                format!("`{}` is used as a shape symbol but is also a parameter", s.name),
            )
            .with_secondary(p.name.span, "parameter declared here")
            .with_note("a size that comes from the command line is written `const n: int`"));
        }
    }
    Ok(b.info)
}

impl SigBuilder<'_> {
    fn dims(&mut self, dims: &[Dim]) -> Result<(), Diagnostic> {
        for d in dims {
            self.size_expr(d.expr, true)?;
            if let Some(def) = d.default {
                let Some(&NameRes::Symbol(sym)) = self.facts.names.get(&d.expr) else {
                    return Err(Diagnostic::at(
                        self.ast.span(d.expr),
                        "only a shape symbol can have a default size here",
                    )
                    .with_note("constants take defaults in their declaration: `const n: int = 4`"));
                };
                let sym = sym as usize;
                let n = &self.info.symbols[sym];
                if let Some(prev) = self.info.symbols[sym].default {
                    return Err(Diagnostic::at(
                        self.ast.span(def),
                        format!("shape symbol `{}` has two defaults", n.name),
                    )
                    .with_secondary(self.ast.span(prev), "first default here"));
                }
                self.size_expr(def, false)?;
                self.info.symbols[sym].default = Some(def);
            }
        }
        Ok(())
    }

    /// A size expression: integer arithmetic of literals, constants and (if
    /// `symbols`) shape symbols, which it declares on first use.
    fn size_expr(&mut self, e: ExprId, symbols: bool) -> Result<(), Diagnostic> {
        let span = self.ast.span(e);
        match self.ast.expr(e) {
            Expr::Int(_) => {}
            Expr::Name(n) => {
                let res = if let Some((_, i)) = self.const_names.iter().find(|(c, _)| *c == n.name) {
                    NameRes::Const(*i)
                } else if symbols {
                    let i = match self.info.symbol_index(&n.name) {
                        Some(i) => i,
                        None => {
                            self.info.symbols.push(SymbolInfo { name: n.name.clone(), span: n.span, default: None });
                            self.info.symbols.len() - 1
                        }
                    };
                    NameRes::Symbol(i as u32)
                } else {
                    return Err(Diagnostic::at(
                        span,
                        format!("`{}` is not a constant here", texc_grammar::truncate(&n.name, 40)),
                    )
                    .with_note(
                        "defaults of sizes and constants are integer expressions of literals and `const` parameters",
                    ));
                };
                self.facts.names.insert(e, res);
            }
            Expr::Unary { op: UnOp::Neg, arg } => self.size_expr(*arg, symbols)?,
            Expr::Binary { op: BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem, lhs, rhs } => {
                let (l, r) = (*lhs, *rhs);
                self.size_expr(l, symbols)?;
                self.size_expr(r, symbols)?;
            }
            _ => {
                return Err(Diagnostic::at(
                    span,
                    "a size must be integer arithmetic (`+ - * / %`) of shape symbols, constants and integers",
                ));
            }
        }
        self.facts.ty.insert(e, RTy::IntLike);
        Ok(())
    }

    /// Scalar defaults are numeric literals (optionally negated).
    fn literal_default(&mut self, e: ExprId, want: RTy) -> Result<(), Diagnostic> {
        let ty = match self.ast.expr(e) {
            Expr::Int(_) => RTy::IntLike,
            Expr::Float(_) => RTy::FloatLike,
            Expr::Name(n) if n.name == "inf" => RTy::FloatLike,
            Expr::Unary { op: UnOp::Neg, arg } => {
                let a = *arg;
                self.literal_default(a, want)?;
                self.facts.ty[&a]
            }
            _ => return Err(Diagnostic::at(self.ast.span(e), "a scalar default must be a number")),
        };
        if RTy::unify(ty, want).is_none() {
            return Err(Diagnostic::at(self.ast.span(e), format!("default {ty} does not fit type {want}")));
        }
        self.facts.ty.insert(e, ty);
        Ok(())
    }
}

// ------------------------------------------------------------------ bodies

/// Argument kinds, computed without side effects, for overload resolution.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ArgClass {
    Tensor { elem: ElemType, rank: usize },
    Value,
}

struct Body<'a> {
    s: &'a Session,
    module: usize,
    ast: &'a Ast,
    facts: &'a mut Facts,
    info: &'a mut KernelInfo,
    /// Tensors defined so far (inputs are defined from the start).
    defined: Vec<bool>,
    /// Index variables in scope, innermost last.
    scope: Vec<VarSlot>,
    anon: usize,
    /// Classes of call expressions already classified: overload resolution
    /// asks again for every enclosing call, which would be exponential in the
    /// nesting depth (`relu(sigmoid(tanh(...)))`).
    classes: std::cell::RefCell<HashMap<ExprId, ArgClass>>,
    /// Each tensor's slot and each parameter's index by name (the first of
    /// a name): looked up for every name a statement uses, so a scan of
    /// the kernel's tensors made resolving an imported model quadratic in
    /// its layers.
    slots: HashMap<String, TensorSlot>,
    params: HashMap<String, usize>,
}

/// Names of the kernels `std.nn` defines (parsed once from the embedded source).
fn std_nn_names() -> &'static [String] {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let ast = texc_grammar::parse(texc_grammar::FileId(0), crate::session::STD_NN).unwrap_or_default();
        let mut names: Vec<String> = ast.kernels().map(|k| k.name.name.clone()).collect();
        names.dedup();
        names
    })
}

/// What users of other frameworks call operators that `std.nn` has under another name.
const STD_ALIASES: [(&str, NnOp, &str); 4] = [
    ("swish", NnOp::Silu, "PyTorch's name for swish"),
    ("gelu_new", NnOp::GeluTanh, "Hugging Face's name for the tanh approximation"),
    ("gelu_erf", NnOp::Gelu, "the exact form, with erf"),
    ("linear", NnOp::Dense, "torch.nn.functional.linear"),
];

/// The name among `candidates` nearest `name`, for unknown functions: within
/// an edit distance of a third of the name (at least 2), or one name a
/// prefix of the other (`gelu_erf`, `gelu`).
fn nearest_function<'n>(name: &str, candidates: impl Iterator<Item = &'n str>) -> Option<&'n str> {
    let limit = (name.chars().count() / 3).max(2);
    candidates
        .filter_map(|c| {
            let d = levenshtein(name, c);
            let prefix = c.len() >= 3 && name.len() >= 3 && (name.starts_with(c) || c.starts_with(name));
            (d <= limit && d < c.len().max(2) || prefix).then_some((d, c))
        })
        .min()
        .map(|(_, c)| c)
}

/// Edit distance without [`edit_distance`]'s cut-off (names are at most 64 bytes here).
fn levenshtein(a: &str, b: &str) -> usize {
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn closest<'n>(name: &str, candidates: impl Iterator<Item = &'n str>) -> Option<&'n str> {
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= 2 && *d < c.len().max(2))
        .min()
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    if a.len().abs_diff(b.len()) > 2 || a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

impl<'a> Body<'a> {
    fn new(s: &'a Session, module: usize, facts: &'a mut Facts, info: &'a mut KernelInfo) -> Body<'a> {
        let defined = info.tensors.iter().map(|t| matches!(t.kind, TensorKind::Input(_))).collect();
        let mut slots = HashMap::new();
        for (i, t) in info.tensors.iter().enumerate() {
            slots.entry(t.name.clone()).or_insert(i as TensorSlot);
        }
        let mut params = HashMap::new();
        for (i, p) in info.params.iter().enumerate() {
            params.entry(p.name.clone()).or_insert(i);
        }
        Body {
            s,
            module,
            ast: &s.modules[module].ast,
            facts,
            info,
            defined,
            scope: Vec::new(),
            anon: 0,
            classes: Default::default(),
            slots,
            params,
        }
    }

    fn run(mut self, k: &ast::Kernel) -> Result<(), Diagnostic> {
        for stmt in &k.body {
            match stmt {
                Stmt::Def { tensor, axes, value, span } => self.def(tensor, axes, *value, *span)?,
                Stmt::Assign { targets, value, span } => self.assign(targets, *value, *span)?,
            }
        }
        for &o in &self.info.outputs {
            if !self.defined[o as usize] {
                let t = &self.info.tensors[o as usize];
                return Err(Diagnostic::at(t.span, format!("output `{}` is never defined", t.name))
                    .with_primary(t.span, "declared here"));
            }
        }
        Ok(())
    }

    fn tensor_slot(&self, name: &str) -> Option<TensorSlot> {
        self.slots.get(name).copied()
    }

    fn param_index(&self, name: &str) -> Option<usize> {
        self.params.get(name).copied()
    }

    /// A new tensor of the kernel, found by name from now on.
    fn push_tensor(&mut self, t: TensorInfo) -> TensorSlot {
        let slot = self.info.tensors.len() as TensorSlot;
        self.slots.entry(t.name.clone()).or_insert(slot);
        self.info.tensors.push(t);
        slot
    }

    /// The slot a statement defines: an output, or a new local.
    fn target(&mut self, id: &Ident, elem: ElemType, rank: usize, what: &str) -> Result<TensorSlot, Diagnostic> {
        if let Some(t) = self.tensor_slot(&id.name) {
            let info = &self.info.tensors[t as usize];
            match info.kind {
                TensorKind::Input(_) => {
                    return Err(Diagnostic::at(id.span, format!("`{}` is an input and cannot be defined", id.name))
                        .with_secondary(info.span, "declared as a parameter here"))
                }
                _ if self.defined[t as usize] => {
                    return Err(Diagnostic::at(id.span, format!("`{}` is defined twice", id.name))
                        .with_note("each tensor is defined by exactly one statement"))
                }
                _ => {}
            }
            if info.rank != rank {
                return Err(Diagnostic::at(
                    id.span,
                    format!("output `{}` has {} dimensions, but {what} gives {rank}", id.name, info.rank),
                )
                .with_secondary(info.span, "declared here"));
            }
            if info.elem != elem {
                return Err(Diagnostic::at(
                    id.span,
                    format!("output `{}` is declared {}, but {what} has type {elem}", id.name, info.elem),
                )
                .with_secondary(info.span, "declared here")
                .with_note(format!("convert explicitly, e.g. `{}(...)`", info.elem)));
            }
            return Ok(t);
        }
        self.check_fresh_name(id)?;
        let slot = self.push_tensor(TensorInfo {
            name: id.name.clone(),
            elem,
            rank,
            kind: TensorKind::Local,
            span: id.span,
            dims: vec![],
        });
        self.defined.push(false);
        Ok(slot)
    }

    fn check_fresh_name(&self, id: &Ident) -> Result<(), Diagnostic> {
        let clash = if self.param_index(&id.name).is_some() {
            Some("a parameter")
        } else if self.info.symbol_index(&id.name).is_some() {
            Some("a shape symbol")
        } else if self.tensor_slot(&id.name).is_some() {
            Some("a tensor")
        } else if id.name == "inf" {
            Some("a built-in constant")
        } else {
            None
        };
        match clash {
            Some(what) => Err(Diagnostic::at(
                id.span,
                format!("`{}` is already {what} in this kernel", texc_grammar::truncate(&id.name, 40)),
            )),
            None => Ok(()),
        }
    }

    fn def(&mut self, tensor: &Ident, axes: &[Binder], value: ExprId, span: Span) -> Result<(), Diagnostic> {
        let existing = self.tensor_slot(&tensor.name);
        let is_output = existing.is_some_and(|t| matches!(self.info.tensors[t as usize].kind, TensorKind::Output(_)));
        let mut vars = Vec::new();
        for (i, b) in axes.iter().enumerate() {
            if axes[..i].iter().any(|p| p.var.name == b.var.name) {
                return Err(Diagnostic::at(b.var.span, format!("axis `{}` appears twice on the left", b.var.name)));
            }
            self.check_fresh_name(&b.var)?;
            if let Some((lo, hi)) = b.range {
                if is_output {
                    return Err(Diagnostic::at(
                        b.var.span,
                        "an output's axes range over its declared shape; remove the `in` range",
                    ));
                }
                self.index_expr(lo)?;
                self.index_expr(hi)?;
            }
            vars.push(self.new_var(b));
        }
        self.scope = vars.clone();
        let ty = self.expr(value)?;
        self.scope.clear();
        let elem = match existing.map(|t| &self.info.tensors[t as usize]) {
            Some(t) if matches!(t.kind, TensorKind::Output(_)) && RTy::unify(ty, RTy::Elem(t.elem)).is_some() => t.elem,
            _ => ty.default_elem(),
        };
        let slot = self.target(tensor, elem, axes.len(), "its definition")?;
        self.info.ops.push(Op::Def { tensor: slot, axes: vars, value, span });
        self.defined[slot as usize] = true;
        Ok(())
    }

    fn new_var(&mut self, b: &Binder) -> VarSlot {
        self.info.vars.push(VarInfo { name: b.var.name.clone(), span: b.var.span, range: b.range });
        self.info.vars.len() as u32 - 1
    }

    fn kernel_candidates(&self, name: &str) -> Option<&'a Vec<KernelRef>> {
        self.s.modules[self.module].scope.get(name)
    }

    /// A whole-tensor call of a kernel (as opposed to a built-in or a cast).
    fn is_kernel_call(&self, e: ExprId) -> bool {
        let Expr::Call { func, args } = self.ast.expr(e) else { return false };
        if ElemType::from_name(&func.name).is_some() || self.kernel_candidates(&func.name).is_none() {
            return false;
        }
        // `sigmoid(t)` on a 0-d value is the built-in; on a tensor, the kernel.
        builtin_call(&func.name).is_none()
            || args
                .first()
                .is_some_and(|a| matches!(self.classify(a.value), Ok(ArgClass::Tensor { rank, .. }) if rank > 0))
    }

    fn assign(&mut self, targets: &[Ident], value: ExprId, span: Span) -> Result<(), Diagnostic> {
        for (i, t) in targets.iter().enumerate() {
            if targets[..i].iter().any(|p| p.name == t.name) {
                return Err(Diagnostic::at(t.span, format!("`{}` appears twice on the left", t.name)));
            }
        }
        if self.is_kernel_call(value) {
            let (callee, args) = self.call(value)?;
            let outs = self.s.kernel(callee).outputs.clone();
            if outs.len() != targets.len() {
                return Err(Diagnostic::at(
                    span,
                    format!(
                        "`{}` returns {} tensor{}, but {} name{} given",
                        self.s.kernel(callee).name,
                        outs.len(),
                        if outs.len() == 1 { "" } else { "s" },
                        targets.len(),
                        if targets.len() == 1 { " is" } else { "s are" }
                    ),
                ));
            }
            let mut results = Vec::new();
            for (t, o) in targets.iter().zip(&outs) {
                let ot = &self.s.kernel(callee).tensors[*o as usize];
                let slot = self.target(t, ot.elem, ot.rank, "the call's result")?;
                self.defined[slot as usize] = true;
                results.push(slot);
            }
            self.info.ops.push(Op::Call { callee, args, results, span });
            return Ok(());
        }
        if targets.len() != 1 {
            return Err(Diagnostic::at(span, "only a kernel call can define several tensors at once"));
        }
        if let Expr::Name(n) = self.ast.expr(value) {
            if let Some(src) = self.tensor_slot(&n.name) {
                let t = &self.info.tensors[src as usize];
                if t.rank > 0 {
                    self.require_defined(src, n.span)?;
                    let (elem, rank) = (t.elem, t.rank);
                    let dst = self.target(&targets[0], elem, rank, "the copied tensor")?;
                    self.defined[dst as usize] = true;
                    self.info.ops.push(Op::Copy { dst, src, span });
                    return Ok(());
                }
            }
        }
        self.def(&targets[0], &[], value, span)
    }

    fn require_defined(&self, t: TensorSlot, span: Span) -> Result<(), Diagnostic> {
        if self.defined[t as usize] {
            return Ok(());
        }
        let info = &self.info.tensors[t as usize];
        Err(Diagnostic::at(span, format!("`{}` is used before it is defined", info.name))
            .with_note("statements run in order: define a tensor before reading it (and not in its own definition)"))
    }

    // ---------------------------------------------------------- calls

    fn classify(&self, e: ExprId) -> Result<ArgClass, Diagnostic> {
        match self.ast.expr(e) {
            Expr::Name(n) if self.scope.is_empty() => match self.tensor_slot(&n.name) {
                Some(t) if self.info.tensors[t as usize].rank > 0 || self.param_index(&n.name).is_some() => {
                    let t = &self.info.tensors[t as usize];
                    Ok(ArgClass::Tensor { elem: t.elem, rank: t.rank })
                }
                _ => Ok(ArgClass::Value),
            },
            _ if self.classes.borrow().contains_key(&e) => Ok(self.classes.borrow()[&e]),
            _ if self.is_kernel_call(e) => {
                let (k, _) = self.select_overload(e)?;
                let info = self.s.kernel(k);
                if info.outputs.len() != 1 {
                    return Err(Diagnostic::at(
                        self.ast.span(e),
                        format!(
                            "`{}` returns {} tensors; call it in a statement of its own: `(A, B) = {}(...);`",
                            info.name,
                            info.outputs.len(),
                            info.name
                        ),
                    ));
                }
                let t = &info.tensors[info.outputs[0] as usize];
                let class = ArgClass::Tensor { elem: t.elem, rank: t.rank };
                self.classes.borrow_mut().insert(e, class);
                Ok(class)
            }
            _ => Ok(ArgClass::Value),
        }
    }

    /// Pick the overload of a kernel call; returns it and, per callee
    /// parameter, the argument that binds it (or `None` for a default).
    fn select_overload(&self, e: ExprId) -> Result<(KernelRef, Vec<Option<ExprId>>), Diagnostic> {
        let Expr::Call { func, args } = self.ast.expr(e) else { unreachable!() };
        let classes: Vec<ArgClass> = args.iter().map(|a| self.classify(a.value)).collect::<Result<_, _>>()?;
        let cands = self.kernel_candidates(&func.name).expect("is_kernel_call checked");
        let mut ok = Vec::new();
        let mut reasons = Vec::new();
        for &c in cands {
            match match_call(self.s.kernel(c), args, &classes) {
                Ok(b) => ok.push((c, b)),
                Err(r) => reasons.push((c, r)),
            }
        }
        match ok.len() {
            1 => Ok(ok.pop().expect("one")),
            0 if reasons.len() == 1 => {
                let (c, (span, why)) = reasons.pop().expect("one");
                let span = span.unwrap_or(self.ast.span(e));
                Err(Diagnostic::at(span, why).with_note(format!("`{}` is {}", func.name, self.s.kernel(c).signature())))
            }
            0 => {
                let mut d =
                    Diagnostic::at(self.ast.span(e), format!("no overload of `{}` takes these arguments", func.name));
                for (c, (_, why)) in reasons {
                    d = d.with_note(format!("{}: {why}", self.s.kernel(c).signature()));
                }
                Err(d)
            }
            _ => Err(Diagnostic::at(
                self.ast.span(e),
                format!("call to `{}` is ambiguous: {} overloads match", func.name, ok.len()),
            )),
        }
    }

    /// Resolve a kernel call expression, emitting ops for nested calls first.
    fn call(&mut self, e: ExprId) -> Result<(KernelRef, Vec<ArgBinding>), Diagnostic> {
        let (callee, chosen) = self.select_overload(e)?;
        let params = self.s.kernel(callee).params.clone();
        let mut bindings = Vec::new();
        for (p, arg) in params.iter().zip(chosen) {
            let b = match (&p.info, arg) {
                (ParamInfo::Tensor(_), Some(a)) => ArgBinding::Tensor(self.tensor_arg(a)?),
                (ParamInfo::Tensor(_), None) => {
                    unreachable!("match_call requires tensor arguments")
                }
                (ParamInfo::Scalar { elem, .. }, a) => {
                    if let Some(a) = a {
                        let ty = self.expr(a)?;
                        if RTy::unify(ty, RTy::Elem(*elem)) != Some(RTy::Elem(*elem)) {
                            return Err(Diagnostic::at(
                                self.ast.span(a),
                                format!("`{}` is a {elem} scalar, but this argument has type {ty}", p.name),
                            ));
                        }
                    }
                    ArgBinding::Scalar(a)
                }
                (ParamInfo::Const { .. }, a) => {
                    if let Some(a) = a {
                        self.const_expr(a, &p.name)?;
                    }
                    ArgBinding::Const(a)
                }
            };
            bindings.push(b);
        }
        Ok((callee, bindings))
    }

    fn tensor_arg(&mut self, a: ExprId) -> Result<TensorSlot, Diagnostic> {
        if let Expr::Name(n) = self.ast.expr(a) {
            let t = self.tensor_slot(&n.name).expect("classified as a tensor");
            self.require_defined(t, n.span)?;
            self.facts.names.insert(a, NameRes::Tensor(t));
            return Ok(t);
        }
        // A nested call: its single result is an anonymous local tensor.
        let (callee, args) = self.call(a)?;
        let k = self.s.kernel(callee);
        let out = &k.tensors[k.outputs[0] as usize];
        let name = format!("_{}{}", k.name, self.anon);
        self.anon += 1;
        let info = TensorInfo {
            name,
            elem: out.elem,
            rank: out.rank,
            kind: TensorKind::Local,
            span: self.ast.span(a),
            dims: vec![],
        };
        let slot = self.push_tensor(info);
        self.defined.push(true);
        self.info.ops.push(Op::Call { callee, args, results: vec![slot], span: self.ast.span(a) });
        Ok(slot)
    }

    /// A compile-time integer argument: arithmetic of literals, constants and symbols.
    fn const_expr(&mut self, e: ExprId, param: &str) -> Result<(), Diagnostic> {
        self.index_expr(e).map_err(|d| {
            d.with_note(format!("`{param}` is a `const` parameter: pass an integer known at compile time"))
        })
    }

    // ---------------------------------------------------------- expressions

    /// Index expressions (and sizes inside bodies): integer arithmetic of
    /// index variables, symbols, constants and literals.
    /// An unknown name used as an index is almost always an index variable
    /// that only the right side uses (`C[i, j] = A[i, k] * B[k, j];`): say
    /// so, suggesting only index variables in scope (not tensors).
    fn unbound_index(&self, n: &Ident, d: Diagnostic) -> Diagnostic {
        if !d.message.starts_with("unknown name") {
            return d;
        }
        let shown = texc_grammar::truncate(&n.name, 40);
        let mut out = Diagnostic::at(n.span, format!("index `{shown}` is not bound: did you forget `sum[{shown}](...)`?"))
            .with_note("an index variable that appears only on the right of `=` must be bound by a reduction (`sum`, `max`, `min`, `prod`)");
        // One-letter names are all one edit apart: suggest only for longer ones.
        let vars = self.scope.iter().map(|&v| self.info.vars[v as usize].name.as_str());
        if let Some(c) = closest(&n.name, vars).filter(|_| n.name.len() > 2) {
            out = out.with_note(format!("or did you mean the index `{c}`?"));
        }
        out
    }

    /// `unknown function`, with the likeliest fix: the `import std.nn;` that
    /// defines it, the std.nn name of an alias, or the nearest name.
    fn unknown_function(&self, func: &Ident) -> Diagnostic {
        let shown = texc_grammar::truncate(&func.name, 40);
        let scope = &self.s.modules[self.module].scope;
        let imported = scope.values().flatten().any(|&k| self.s.is_std(k));
        let std = std_nn_names();
        if !imported && std.iter().any(|n| *n == func.name) {
            return Diagnostic::at(func.span, format!("`{shown}` is defined in std.nn: add `import std.nn;`"))
                .with_note("std.nn's operators are kernels written in .tex; a file sees them once it imports them");
        }
        let mut d = Diagnostic::at(func.span, format!("unknown function `{shown}`"));
        let hint = |n: &str| {
            if !imported && std.iter().any(|s| s == n) && !scope.contains_key(n) {
                format!("`{n}` (in std.nn: add `import std.nn;`)")
            } else {
                format!("`{n}`")
            }
        };
        if let Some((_, to, why)) = STD_ALIASES.iter().find(|(from, ..)| *from == func.name) {
            return d.with_note(format!("did you mean {}? ({why})", hint(to.name())));
        }
        let mut names: Vec<&str> = builtin_names().collect();
        names.extend(scope.keys().map(String::as_str));
        names.extend(std.iter().map(String::as_str));
        names.sort_unstable();
        names.dedup();
        if let Some(c) = nearest_function(&func.name, names.into_iter()) {
            d = d.with_note(format!("did you mean {}?", hint(c)));
        }
        d
    }

    fn index_expr(&mut self, e: ExprId) -> Result<(), Diagnostic> {
        let span = self.ast.span(e);
        match self.ast.expr(e) {
            Expr::Int(_) => {}
            Expr::Name(n) => {
                let res = self.lookup(n).map_err(|d| self.unbound_index(n, d))?;
                if matches!(res, NameRes::Scalar(_) | NameRes::Tensor(_) | NameRes::Inf) {
                    return Err(Diagnostic::at(span, format!(
                        "`{}` cannot be used in an index: indices are integer arithmetic of index variables, shape symbols and constants",
                        n.name
                    )));
                }
                self.facts.names.insert(e, res);
            }
            Expr::Unary { op: UnOp::Neg, arg } => self.index_expr(*arg)?,
            Expr::Binary { op: BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem, lhs, rhs } => {
                let (l, r) = (*lhs, *rhs);
                self.index_expr(l)?;
                self.index_expr(r)?;
            }
            _ => {
                return Err(Diagnostic::at(span, "an index must be integer arithmetic (`+ - * / %`) of index variables, shape symbols, constants and integers"));
            }
        }
        self.facts.ty.insert(e, RTy::IntLike);
        Ok(())
    }

    fn lookup(&self, n: &Ident) -> Result<NameRes, Diagnostic> {
        if let Some(&v) = self.scope.iter().rev().find(|&&v| self.info.vars[v as usize].name == n.name) {
            return Ok(NameRes::Var(v));
        }
        if let Some(i) = self.param_index(&n.name) {
            match self.info.params[i].info {
                ParamInfo::Scalar { .. } => return Ok(NameRes::Scalar(i as u32)),
                ParamInfo::Const { .. } => return Ok(NameRes::Const(i as u32)),
                ParamInfo::Tensor(_) => {}
            }
        }
        if let Some(i) = self.info.symbol_index(&n.name) {
            return Ok(NameRes::Symbol(i as u32));
        }
        if let Some(t) = self.tensor_slot(&n.name) {
            let info = &self.info.tensors[t as usize];
            if info.rank > 0 {
                return Err(Diagnostic::at(
                    n.span,
                    format!("`{}` is a tensor with {} dimensions; index it like `{}[...]`", n.name, info.rank, n.name),
                ));
            }
            self.require_defined(t, n.span)?;
            return Ok(NameRes::Tensor(t));
        }
        if n.name == "inf" {
            return Ok(NameRes::Inf);
        }
        let mut d = Diagnostic::at(n.span, format!("unknown name `{}`", texc_grammar::truncate(&n.name, 40)));
        let names = self
            .scope
            .iter()
            .map(|&v| self.info.vars[v as usize].name.as_str())
            .chain(self.info.params.iter().map(|p| p.name.as_str()))
            .chain(self.info.symbols.iter().map(|s| s.name.as_str()))
            .chain(self.info.tensors.iter().map(|t| t.name.as_str()));
        if let Some(c) = closest(&n.name, names) {
            d = d.with_note(format!("did you mean `{c}`?"));
        } else if n.name.len() <= 2 && n.name.chars().all(|c| c.is_ascii_lowercase()) {
            d = d.with_note(format!(
                "an index variable that appears only on the right must be bound by a reduction, e.g. `sum[{}](...)`",
                n.name
            ));
        }
        Err(d)
    }

    fn expr(&mut self, e: ExprId) -> Result<RTy, Diagnostic> {
        let span = self.ast.span(e);
        let ty = match self.ast.expr(e).clone() {
            Expr::Int(_) => RTy::IntLike,
            Expr::Float(_) => RTy::FloatLike,
            Expr::Name(n) => {
                let res = self.lookup(&n)?;
                self.facts.names.insert(e, res);
                match res {
                    NameRes::Var(_) | NameRes::Const(_) | NameRes::Symbol(_) => RTy::IntLike,
                    NameRes::Scalar(i) => match self.info.params[i as usize].info {
                        ParamInfo::Scalar { elem, .. } => RTy::Elem(elem),
                        _ => unreachable!(),
                    },
                    NameRes::Tensor(t) => RTy::Elem(self.info.tensors[t as usize].elem),
                    NameRes::Inf => RTy::FloatLike,
                }
            }
            Expr::Access { tensor, indices } => {
                let Some(t) = self.tensor_slot(&tensor.name) else {
                    let mut d = Diagnostic::at(
                        tensor.span,
                        format!("unknown tensor `{}`", texc_grammar::truncate(&tensor.name, 40)),
                    );
                    if let Some(c) = closest(&tensor.name, self.info.tensors.iter().map(|t| t.name.as_str())) {
                        d = d.with_note(format!("did you mean `{c}`?"));
                    }
                    return Err(d);
                };
                self.require_defined(t, tensor.span)?;
                self.facts.accesses.insert(e, t);
                let info = &self.info.tensors[t as usize];
                if info.rank != indices.len() {
                    return Err(Diagnostic::at(
                        span,
                        format!(
                            "`{}` has {} dimension{}, but {} ind{} given",
                            tensor.name,
                            info.rank,
                            if info.rank == 1 { "" } else { "s" },
                            indices.len(),
                            if indices.len() == 1 { "ex is" } else { "ices are" }
                        ),
                    )
                    .with_secondary(info.span, "declared here"));
                }
                let elem = info.elem;
                for i in indices {
                    self.index_expr(i)?;
                }
                RTy::Elem(elem)
            }
            Expr::Call { func, args } => self.call_expr(e, &func, &args)?,
            Expr::Reduce { op, binders, body } => {
                let Some(rop) = ReduceOp::from_name(&op.name) else {
                    return Err(Diagnostic::at(
                        op.span,
                        format!("unknown reduction `{}`", texc_grammar::truncate(&op.name, 40)),
                    )
                    .with_note("reductions: sum, max, min, prod"));
                };
                let mut vars = Vec::new();
                for (i, b) in binders.iter().enumerate() {
                    if binders[..i].iter().any(|p| p.var.name == b.var.name)
                        || self.scope.iter().any(|&v| self.info.vars[v as usize].name == b.var.name)
                    {
                        return Err(Diagnostic::at(b.var.span, format!("`{}` is already bound here", b.var.name)));
                    }
                    self.check_fresh_name(&b.var)?;
                    if let Some((lo, hi)) = b.range {
                        self.index_expr(lo)?;
                        self.index_expr(hi)?;
                    }
                    vars.push(self.new_var(b));
                }
                let depth = self.scope.len();
                self.scope.extend(&vars);
                let ty = self.expr(body);
                self.scope.truncate(depth);
                let ty = ty?;
                if ty.is_bool() {
                    return Err(Diagnostic::at(
                        span,
                        format!("`{}` over booleans; convert with `i32(...)` first", op.name),
                    ));
                }
                self.facts.reduces.insert(e, (rop, vars));
                ty
            }
            Expr::Unary { op, arg } => {
                let t = self.expr(arg)?;
                match op {
                    UnOp::Neg if t.is_bool() => return Err(Diagnostic::at(span, "cannot negate a bool; use `!`")),
                    UnOp::Not if !t.is_bool() => {
                        return Err(Diagnostic::at(span, format!("`!` needs a bool, found {t}")))
                    }
                    _ => t,
                }
            }
            Expr::Binary { op, lhs, rhs } => {
                let a = self.expr(lhs)?;
                let b = self.expr(rhs)?;
                self.binary_type(op, a, b, span)?
            }
        };
        self.facts.ty.insert(e, ty);
        Ok(ty)
    }

    fn binary_type(&self, op: BinOp, a: RTy, b: RTy, span: Span) -> Result<RTy, Diagnostic> {
        if op.is_logic() {
            if !a.is_bool() || !b.is_bool() {
                return Err(Diagnostic::at(span, format!("`{}` needs bool operands, found {a} and {b}", op.symbol())));
            }
            return Ok(a);
        }
        let Some(t) = RTy::unify(a, b) else {
            return Err(Diagnostic::at(
                span,
                format!("operands of `{}` have different types: {a} and {b}", op.symbol()),
            )
            .with_note("convert one side explicitly, e.g. `f32(x)`"));
        };
        if op.is_comparison() {
            if t.is_bool() && !matches!(op, BinOp::Eq | BinOp::Ne) {
                return Err(Diagnostic::at(span, format!("`{}` does not order bools", op.symbol())));
            }
            return Ok(RTy::Elem(ElemType::Bool));
        }
        if t.is_bool() {
            return Err(Diagnostic::at(
                span,
                format!("arithmetic `{}` on bools; convert with `i32(...)` first", op.symbol()),
            ));
        }
        if op == BinOp::Rem && t.is_float() {
            return Err(Diagnostic::at(span, "`%` needs integer operands"));
        }
        Ok(t)
    }

    fn call_expr(&mut self, e: ExprId, func: &Ident, args: &[Arg]) -> Result<RTy, Diagnostic> {
        let span = self.ast.span(e);
        if let Some(a) = args.iter().find_map(|a| a.name.as_ref()) {
            return Err(Diagnostic::at(a.span, format!("`{}` takes no named arguments", func.name)));
        }
        let arity_err = |n: usize| {
            Diagnostic::at(
                span,
                format!("`{}` takes {n} argument{}, found {}", func.name, if n == 1 { "" } else { "s" }, args.len()),
            )
        };
        if let Some(elem) = ElemType::from_name(&func.name) {
            if args.len() != 1 {
                return Err(arity_err(1));
            }
            self.expr(args[0].value)?;
            self.facts.calls.insert(e, CallRes::Cast(elem));
            return Ok(RTy::Elem(elem));
        }
        let Some(b) = builtin_call(&func.name) else {
            if self.kernel_candidates(&func.name).is_some() {
                return Err(Diagnostic::at(
                    span,
                    format!(
                        "kernel `{}` can only be called as a whole statement, like `T = {}(...);`",
                        func.name, func.name
                    ),
                ));
            }
            return Err(self.unknown_function(func));
        };
        let arity = match b {
            CallRes::Math(f) => f.arity(),
            _ => 3,
        };
        if args.len() != arity {
            return Err(arity_err(arity));
        }
        let tys: Vec<RTy> = args.iter().map(|a| self.expr(a.value)).collect::<Result<_, _>>()?;
        let ty = if b == CallRes::Select {
            if !tys[0].is_bool() {
                return Err(Diagnostic::at(
                    self.ast.span(args[0].value),
                    format!("the condition of `select` must be a bool, found {}", tys[0]),
                ));
            }
            RTy::unify(tys[1], tys[2]).ok_or_else(|| {
                Diagnostic::at(
                    span,
                    format!("the branches of `select` have different types: {} and {}", tys[1], tys[2]),
                )
            })?
        } else {
            let mut t = tys[0];
            for &u in &tys[1..] {
                t = RTy::unify(t, u).ok_or_else(|| {
                    Diagnostic::at(span, format!("arguments of `{}` have different types: {t} and {u}", func.name))
                })?;
            }
            if t.is_bool() {
                return Err(Diagnostic::at(span, format!("`{}` is not defined on bools", func.name)));
            }
            if matches!(b, CallRes::Math(f) if f.float_only()) {
                match t {
                    RTy::IntLike => t = RTy::FloatLike,
                    RTy::Elem(x) if !x.is_float() => {
                        return Err(Diagnostic::at(span, format!("`{}` needs a float argument, found {x}", func.name))
                            .with_note(format!("convert first, e.g. `{}(f32(x))`", func.name)))
                    }
                    _ => {}
                }
            }
            t
        };
        self.facts.calls.insert(e, b);
        Ok(ty)
    }
}

/// Try to bind call arguments to a kernel's parameters. On failure returns
/// the span of the offending argument (if any) and the reason.
fn match_call(
    k: &KernelInfo,
    args: &[Arg],
    classes: &[ArgClass],
) -> Result<Vec<Option<ExprId>>, (Option<Span>, String)> {
    let mut bound: Vec<Option<ExprId>> = vec![None; k.params.len()];
    let mut positional = 0usize;
    for (a, class) in args.iter().zip(classes) {
        let i = match &a.name {
            Some(n) => k
                .param_index(&n.name)
                .ok_or_else(|| (Some(n.span), format!("`{}` has no parameter `{}`", k.name, n.name)))?,
            None => {
                let i = positional;
                positional += 1;
                if i >= k.params.len() {
                    return Err((
                        None,
                        format!("`{}` takes at most {} arguments, found {}", k.name, k.params.len(), args.len()),
                    ));
                }
                i
            }
        };
        if bound[i].is_some() {
            return Err((a.name.as_ref().map(|n| n.span), format!("parameter `{}` is given twice", k.params[i].name)));
        }
        let p = &k.params[i];
        match (&p.info, class) {
            (ParamInfo::Tensor(t), ArgClass::Tensor { elem, rank }) => {
                let t = &k.tensors[*t as usize];
                if t.elem != *elem || t.rank != *rank {
                    return Err((
                        None,
                        format!(
                            "`{}` must be a {}[{}] tensor, found {elem}[{}]",
                            p.name,
                            t.elem,
                            dims_text(t.rank),
                            dims_text(*rank)
                        ),
                    ));
                }
            }
            (ParamInfo::Tensor(_), ArgClass::Value) => return Err((None, format!("`{}` must be a tensor", p.name))),
            (_, ArgClass::Tensor { .. }) => {
                return Err((None, format!("`{}` is a scalar, but a tensor was given", p.name)))
            }
            _ => {}
        }
        bound[i] = Some(a.value);
    }
    for (p, b) in k.params.iter().zip(&bound) {
        let has_default = match &p.info {
            ParamInfo::Tensor(_) => false,
            ParamInfo::Scalar { default, .. } => default.is_some(),
            ParamInfo::Const { default } => default.is_some(),
        };
        if b.is_none() && !has_default {
            return Err((None, format!("missing argument `{}`", p.name)));
        }
    }
    Ok(bound)
}
