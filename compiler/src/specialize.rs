//! Specialization: one kernel plus concrete sizes to a [`Program`] (TIR).
//!
//! Binds constants and shape symbols (from the command line, input shapes
//! and source defaults, solving linear size expressions such as
//! `Kg * groups`), infers the range of every intermediate axis and reduction
//! variable, inlines composition calls (solving each callee's symbols from
//! its argument shapes), lowers expressions with explicit casts for adaptable
//! literals, and bounds-checks every stage as it is built.
//!
//! Assumes the session was resolved (`resolve`), so names and types are
//! known. Guarantees the invariants listed in `tir`.

use crate::bounds;
use crate::kernel::{
    ArgBinding, CallRes, KernelInfo, KernelRef, NameRes, Op, ParamInfo, TensorKind, TensorSlot, VarSlot,
};
use crate::ops::{BinOp, UnOp};
use crate::session::Session;
use crate::tir::*;
use crate::types::{ElemType, RTy};
use std::collections::HashMap;
use texc_grammar::ast::{self, Expr, ExprId};
use texc_grammar::{Ast, Diagnostic, Span};

/// Largest tensor texc will specialize (elements), and longest range of an
/// index variable.
pub const MAX_ELEMENTS: i64 = 1 << 36;
/// Most iterations one stage may take (its axes times its reductions).
pub const MAX_ITERATIONS: i64 = 1 << 40;
/// Most stages one program may have after inlining (a kernel that calls a
/// kernel that calls … twice at each level grows exponentially).
pub const MAX_STAGES: usize = 100_000;

/// Sizes given from outside the source.
#[derive(Clone, Debug, Default)]
pub struct Bindings {
    /// `--shape NAME=V`.
    pub shapes: Vec<(String, i64)>,
    /// `--const NAME=V`.
    pub consts: Vec<(String, i64)>,
    /// Shapes of input tensors given as files, by parameter name.
    pub input_shapes: HashMap<String, Vec<i64>>,
}

/// Specialize kernel `k` to the sizes in `b`.
pub fn specialize(s: &Session, k: KernelRef, b: &Bindings) -> Result<Program, Diagnostic> {
    specialize_with(s, k, b, true)
}

/// The structure of kernel `k` (its stages, their variables and
/// reductions) at sample sizes, without proving its accesses in bounds
/// there: what `texc check` validates schedules against when the real
/// sizes are not known. Extents in the result are those of the samples.
pub fn specialize_structure(s: &Session, k: KernelRef, b: &Bindings) -> Result<Program, Diagnostic> {
    specialize_with(s, k, b, false)
}

fn specialize_with(s: &Session, k: KernelRef, b: &Bindings, check_bounds: bool) -> Result<Program, Diagnostic> {
    let info = s.kernel(k);
    let module = s.module(k.module as usize);
    let source = Some(s.sources.file(module.ast.file).name.clone());
    let mut p = Program::default();
    (p.name, p.source) = (info.name.clone(), source);
    let mut inst = Inst::new(s, k, String::new());
    let sizes = SizeCtx { ast: &module.ast, facts_names: &module.facts.names };

    // Constants: command line, else defaults.
    for (name, _) in &b.consts {
        match info.param_index(name).map(|i| &info.params[i].info) {
            Some(ParamInfo::Const { .. }) => {}
            _ => {
                let consts: Vec<&str> = info
                    .params
                    .iter()
                    .filter(|p| matches!(p.info, ParamInfo::Const { .. }))
                    .map(|p| p.name.as_str())
                    .collect();
                return Err(Diagnostic::error(format!(
                    "--const: `{name}` is not a constant of kernel `{}`",
                    info.name
                ))
                .with_note(format!(
                    "its constants: {}",
                    if consts.is_empty() { "none".into() } else { consts.join(", ") }
                )));
            }
        }
    }
    for (i, prm) in info.params.iter().enumerate() {
        if let ParamInfo::Const { default } = &prm.info {
            let v = match b.consts.iter().rev().find(|(n, _)| *n == prm.name) {
                Some((_, v)) => *v,
                None => match default {
                    Some(d) => sizes.eval(*d, &inst.consts, &inst.syms)?,
                    None => {
                        return Err(Diagnostic::at(prm.span, format!("constant `{}` has no value", prm.name))
                            .with_note(format!("give it with --const {}=VALUE or a default in the source", prm.name)))
                    }
                },
            };
            inst.consts[i] = Some(v);
            p.bindings.push((prm.name.clone(), v));
        }
    }
    // Shape symbols: command line, then input files, then defaults.
    for (name, v) in &b.shapes {
        let Some(i) = info.symbol_index(name) else {
            let syms: Vec<&str> = info.symbols.iter().map(|s| s.name.as_str()).collect();
            return Err(Diagnostic::error(format!(
                "--shape: `{name}` is not a shape symbol of kernel `{}`",
                info.name
            ))
            .with_note(format!("its symbols: {}", if syms.is_empty() { "none".into() } else { syms.join(", ") })));
        };
        if *v < 0 {
            return Err(Diagnostic::error(format!("--shape: `{name}` = {v} is negative")));
        }
        inst.syms[i] = Some(*v);
    }
    let given: Vec<(TensorSlot, Vec<i64>)> = info
        .params
        .iter()
        .filter_map(|prm| match prm.info {
            ParamInfo::Tensor(t) => b.input_shapes.get(&prm.name).map(|sh| (t, sh.clone())),
            _ => None,
        })
        .collect();
    for (t, sh) in &given {
        let rank = info.tensors[*t as usize].rank;
        if sh.len() != rank {
            let tn = &info.tensors[*t as usize];
            return Err(Diagnostic::at(
                tn.span,
                format!("input `{}` has {} dimensions in its file, but {rank} here", tn.name, sh.len()),
            ));
        }
    }
    solve_symbols(&sizes, info, &given, &inst.consts, &mut inst.syms)?;
    apply_defaults(&sizes, info, &inst.consts, &mut inst.syms)?;
    for (i, sym) in info.symbols.iter().enumerate() {
        let Some(v) = inst.syms[i] else {
            return Err(Diagnostic::at(sym.span, format!("shape symbol `{}` has no value", sym.name)).with_note(
                format!("give it with --shape {}=SIZE, an input file, or a default like `{} = 64`", sym.name, sym.name),
            ));
        };
        p.bindings.push((sym.name.clone(), v));
    }
    check_given_shapes(&sizes, info, &given, &inst, "its input file")?;

    // Parameters and outputs of the entry kernel.
    for (i, prm) in info.params.iter().enumerate() {
        match &prm.info {
            ParamInfo::Tensor(t) => {
                let shape = declared_shape(&sizes, info, *t, &inst)?;
                let id = new_tensor(
                    &mut p,
                    &info.tensors[*t as usize].name,
                    info.tensors[*t as usize].elem,
                    shape,
                    TensorRole::Input,
                    prm.span,
                )?;
                inst.tensors[*t as usize] = Some(id);
                p.params.push(ProgramParam::Tensor(id));
            }
            ParamInfo::Scalar { elem, default } => {
                let default = default.map(|d| literal_value(&module.ast, d));
                p.scalars.push(ScalarDecl { name: prm.name.clone(), elem: *elem, default });
                let si = p.scalars.len() as u32 - 1;
                p.params.push(ProgramParam::Scalar(si));
                inst.scalars[i] = Some(p.alloc(TExpr::Scalar(si), Ty::Elem(*elem), prm.span));
            }
            ParamInfo::Const { .. } => {}
        }
    }
    for &o in &info.outputs {
        let shape = declared_shape(&sizes, info, o, &inst)?;
        let t = &info.tensors[o as usize];
        let id = new_tensor(&mut p, &t.name, t.elem, shape, TensorRole::Output, t.span)?;
        inst.tensors[o as usize] = Some(id);
        p.outputs.push(id);
    }
    let mut lower = Lower { s, p, attrs: Vec::new(), call_args: Vec::new(), check_bounds };
    lower.kernel(&mut inst)?;
    Ok(lower.p)
}

fn new_tensor(
    p: &mut Program,
    name: &str,
    elem: ElemType,
    shape: Vec<i64>,
    role: TensorRole,
    span: Span,
) -> Result<TensorId, Diagnostic> {
    let mut n: i64 = 1;
    for &d in &shape {
        if d < 0 {
            return Err(Diagnostic::at(span, format!("`{name}` would have a negative size {d} ({shape:?})")));
        }
        n = n
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| Diagnostic::at(span, format!("`{name}` would have more than 2^36 elements ({shape:?})")))?;
    }
    p.tensors.push(TensorDecl { name: name.to_string(), elem, shape, role, span });
    Ok(TensorId(p.tensors.len() as u32 - 1))
}

/// The value of a numeric literal default (`1e-5`, `-1`, `inf`).
fn literal_value(ast: &Ast, e: ExprId) -> f64 {
    match ast.expr(e) {
        Expr::Int(v) => *v as f64,
        Expr::Float(v) => *v,
        Expr::Unary { op: ast::UnOp::Neg, arg } => -literal_value(ast, *arg),
        _ => f64::INFINITY,
    }
}

// ------------------------------------------------------------------ sizes

struct SizeCtx<'a> {
    ast: &'a Ast,
    facts_names: &'a HashMap<ExprId, NameRes>,
}

#[derive(Debug)]
enum SizeErr {
    Unbound,
    Bad(Diagnostic),
}

use crate::semantics::{checked_floor_div as floor_div, checked_floor_mod as floor_mod};

impl SizeCtx<'_> {
    fn eval(&self, e: ExprId, consts: &[Option<i64>], syms: &[Option<i64>]) -> Result<i64, Diagnostic> {
        match self.try_eval(e, consts, syms) {
            Ok(v) => Ok(v),
            Err(SizeErr::Bad(d)) => Err(d),
            Err(SizeErr::Unbound) => {
                Err(Diagnostic::at(self.ast.span(e), "this size depends on a shape symbol that has no value yet"))
            }
        }
    }

    fn try_eval(&self, e: ExprId, consts: &[Option<i64>], syms: &[Option<i64>]) -> Result<i64, SizeErr> {
        let span = self.ast.span(e);
        let bad = |m: &str| SizeErr::Bad(Diagnostic::at(span, m.to_string()));
        match self.ast.expr(e) {
            Expr::Int(v) => Ok(*v),
            Expr::Name(_) => match self.facts_names.get(&e) {
                Some(NameRes::Const(i)) => consts[*i as usize].ok_or_else(|| bad("this constant has no value yet")),
                Some(NameRes::Symbol(i)) => syms[*i as usize].ok_or(SizeErr::Unbound),
                Some(NameRes::Var(_)) => Err(bad("a range or size may not depend on an index variable")),
                _ => Err(bad("not a size")),
            },
            Expr::Unary { op: ast::UnOp::Neg, arg } => {
                self.try_eval(*arg, consts, syms)?.checked_neg().ok_or_else(|| bad("size overflows"))
            }
            Expr::Binary { op, lhs, rhs } => {
                let a = self.try_eval(*lhs, consts, syms)?;
                let b = self.try_eval(*rhs, consts, syms)?;
                let r = match op {
                    ast::BinOp::Add => a.checked_add(b),
                    ast::BinOp::Sub => a.checked_sub(b),
                    ast::BinOp::Mul => a.checked_mul(b),
                    ast::BinOp::Div | ast::BinOp::Rem if b == 0 => return Err(bad("division by zero in a size")),
                    ast::BinOp::Div => floor_div(a, b),
                    ast::BinOp::Rem => floor_mod(a, b),
                    _ => return Err(bad("not a size")),
                };
                r.ok_or_else(|| bad("size overflows 64 bits"))
            }
            _ => Err(bad("not a size")),
        }
    }

    /// The symbols an expression mentions that have no value yet.
    fn unknowns(&self, e: ExprId, syms: &[Option<i64>], out: &mut Vec<u32>) {
        if let Some(NameRes::Symbol(i)) = self.facts_names.get(&e) {
            if syms[*i as usize].is_none() && !out.contains(i) {
                out.push(*i);
            }
        }
        for c in self.ast.expr(e).children() {
            self.unknowns(c, syms, out);
        }
    }
}

/// Bind symbols from actual shapes: a dimension with exactly one unknown
/// symbol that it depends on linearly (`S`, `2*S + 1`, `Kg * groups`) is solved.
fn solve_symbols(
    sz: &SizeCtx,
    k: &KernelInfo,
    given: &[(TensorSlot, Vec<i64>)],
    consts: &[Option<i64>],
    syms: &mut [Option<i64>],
) -> Result<(), Diagnostic> {
    loop {
        let mut progress = false;
        for (t, shape) in given {
            for (d, &actual) in k.tensors[*t as usize].dims.iter().zip(shape) {
                let mut unk = Vec::new();
                sz.unknowns(d.expr, syms, &mut unk);
                let [s] = unk[..] else { continue };
                let at = |v: i64, syms: &mut [Option<i64>]| {
                    syms[s as usize] = Some(v);
                    let r = sz.try_eval(d.expr, consts, syms).ok();
                    syms[s as usize] = None;
                    r
                };
                let (Some(v0), Some(v1), Some(v2)) = (at(0, syms), at(1, syms), at(2, syms)) else {
                    continue;
                };
                let a = v1 - v0;
                if a == 0 || v2 - v1 != a || (actual - v0) % a != 0 {
                    continue;
                }
                let x = (actual - v0) / a;
                if x >= 0 && at(x, syms) == Some(actual) {
                    syms[s as usize] = Some(x);
                    progress = true;
                }
            }
        }
        if !progress {
            return Ok(());
        }
    }
}

fn apply_defaults(
    sz: &SizeCtx,
    k: &KernelInfo,
    consts: &[Option<i64>],
    syms: &mut [Option<i64>],
) -> Result<(), Diagnostic> {
    for (i, sym) in k.symbols.iter().enumerate() {
        if syms[i].is_none() {
            if let Some(d) = sym.default {
                let v = sz.eval(d, consts, syms)?;
                if v < 0 {
                    return Err(Diagnostic::at(
                        sz.ast.span(d),
                        format!("default size of `{}` is negative ({v})", sym.name),
                    ));
                }
                syms[i] = Some(v);
            }
        }
    }
    Ok(())
}

fn declared_shape(sz: &SizeCtx, k: &KernelInfo, t: TensorSlot, inst: &Inst) -> Result<Vec<i64>, Diagnostic> {
    let info = &k.tensors[t as usize];
    info.dims.iter().map(|d| sz.eval(d.expr, &inst.consts, &inst.syms)).collect()
}

/// Every given shape must equal its declaration at the bound sizes.
fn check_given_shapes(
    sz: &SizeCtx,
    k: &KernelInfo,
    given: &[(TensorSlot, Vec<i64>)],
    inst: &Inst,
    source: &str,
) -> Result<(), Diagnostic> {
    for (t, shape) in given {
        let info = &k.tensors[*t as usize];
        for (i, (d, &actual)) in info.dims.iter().zip(shape).enumerate() {
            let want = sz.eval(d.expr, &inst.consts, &inst.syms)?;
            if want != actual {
                return Err(Diagnostic::at(
                    sz.ast.span(d.expr),
                    format!(
                        "dimension {i} of `{}` is {actual} from {source}, but its declaration here says {want}",
                        info.name
                    ),
                )
                .with_note(bound_note(k, inst)));
            }
        }
    }
    Ok(())
}

fn bound_note(k: &KernelInfo, inst: &Inst) -> String {
    let b: Vec<String> = k
        .symbols
        .iter()
        .zip(&inst.syms)
        .filter_map(|(s, v)| v.map(|v| format!("{}={v}", s.name)))
        .chain(k.params.iter().zip(&inst.consts).filter_map(|(p, v)| v.map(|v| format!("{}={v}", p.name))))
        .collect();
    format!("sizes in `{}`: {}", k.name, b.join(", "))
}

// ------------------------------------------------------------------ lowering

/// One inlined instance of a kernel.
struct Inst<'a> {
    k: &'a KernelInfo,
    ast: &'a Ast,
    facts: &'a crate::kernel::Facts,
    /// Per parameter index.
    consts: Vec<Option<i64>>,
    scalars: Vec<Option<TExprId>>,
    syms: Vec<Option<i64>>,
    tensors: Vec<Option<TensorId>>,
    /// Prefix of this instance's local tensor names.
    prefix: String,
}

impl<'a> Inst<'a> {
    fn new(s: &'a Session, k: KernelRef, prefix: String) -> Inst<'a> {
        let info = s.kernel(k);
        let m = s.module(k.module as usize);
        Inst {
            k: info,
            ast: &m.ast,
            facts: &m.facts,
            consts: vec![None; info.params.len()],
            scalars: vec![None; info.params.len()],
            syms: vec![None; info.symbols.len()],
            tensors: vec![None; info.tensors.len()],
            prefix,
        }
    }

    fn sizes(&self) -> SizeCtx<'a> {
        SizeCtx { ast: self.ast, facts_names: &self.facts.names }
    }

    fn tensor(&self, t: TensorSlot) -> TensorId {
        self.tensors[t as usize].expect("tensors are created before use")
    }
}

/// Variables of the stage being built.
struct StageVars {
    vars: Vec<VarDecl>,
    /// Kernel var slot -> (stage var, offset added to it).
    map: HashMap<VarSlot, (VarId, i64)>,
}

struct Lower<'a> {
    s: &'a Session,
    p: Program,
    /// Compile-time arguments of the call being inlined (for `OpRecord`).
    attrs: Vec<String>,
    /// Arguments of the top-level call being inlined (for `OpRecord`).
    call_args: Vec<OpArg>,
    /// Prove every stage's accesses in bounds (off only for [`specialize_structure`]).
    check_bounds: bool,
}

/// A scalar argument as text, if it is a caller scalar's name or a number.
fn scalar_text(inst: &Inst, e: ExprId) -> Option<String> {
    match inst.ast.expr(e) {
        Expr::Name(n) if matches!(inst.facts.names.get(&e), Some(NameRes::Scalar(_))) => Some(n.name.clone()),
        Expr::Int(_) | Expr::Float(_) => Some(format!("{:?}", literal_value(inst.ast, e))),
        Expr::Unary { op: ast::UnOp::Neg, arg } if matches!(inst.ast.expr(*arg), Expr::Int(_) | Expr::Float(_)) => {
            Some(format!("{:?}", literal_value(inst.ast, e)))
        }
        _ => None,
    }
}

fn collect_loads(p: &Program, e: TExprId, f: &mut impl FnMut(TensorId)) {
    if let TExpr::Load(t, _) = p.expr(e) {
        f(*t);
    }
    for c in p.children(e) {
        collect_loads(p, c, f);
    }
}

fn rty_to_ty(t: RTy) -> Ty {
    match t {
        RTy::Elem(e) => Ty::Elem(e),
        RTy::IntLike => Ty::Index,
        RTy::FloatLike => Ty::Elem(ElemType::F64),
    }
}

impl<'a> Lower<'a> {
    fn kernel(&mut self, inst: &mut Inst<'a>) -> Result<(), Diagnostic> {
        let entry = inst.prefix.is_empty();
        for op in &inst.k.ops {
            let start = self.p.stages.len();
            let attrs_before = std::mem::take(&mut self.attrs);
            match op {
                Op::Def { tensor, axes, value, span } => self.def(inst, *tensor, axes, *value, *span)?,
                Op::Copy { dst, src, span } => self.copy(inst, *dst, *src, *span)?,
                Op::Call { callee, args, results, span } => {
                    self.call(inst, *callee, args, results, *span).map_err(|d| {
                        // The call is labelled once, even when the error already points at it.
                        let labelled = d.secondary.iter().any(|(s, _)| s == span);
                        if !labelled
                            && d.primary
                                .as_ref()
                                .is_some_and(|(s, _)| s.file != span.file || !(span.start..span.end).contains(&s.start))
                        {
                            d.with_secondary(*span, "in this call")
                        } else {
                            d
                        }
                    })?
                }
            }
            let attrs = std::mem::replace(&mut self.attrs, attrs_before);
            if entry {
                self.record(inst, op, start, attrs);
            }
        }
        Ok(())
    }

    /// Record a top-level statement of the entry kernel as an operator.
    fn record(&mut self, inst: &Inst, op: &Op, start: usize, attrs: Vec<String>) {
        let call_args = std::mem::take(&mut self.call_args);
        let (name, outputs, span, args, std_callee) = match op {
            Op::Def { tensor, span, .. } => ("compute".to_string(), vec![inst.tensor(*tensor)], *span, vec![], false),
            Op::Copy { dst, span, .. } => ("copy".to_string(), vec![inst.tensor(*dst)], *span, vec![], false),
            Op::Call { callee, results, span, .. } => (
                self.s.kernel(*callee).name.clone(),
                results.iter().map(|r| inst.tensor(*r)).collect(),
                *span,
                call_args,
                self.s.is_std(*callee),
            ),
        };
        let stages = start..self.p.stages.len();
        let written: Vec<TensorId> = self.p.stages[stages.clone()].iter().map(|s| s.tensor).collect();
        let mut inputs = Vec::new();
        for st in &self.p.stages[stages.clone()] {
            collect_loads(&self.p, st.value, &mut |t| {
                if !written.contains(&t) && !inputs.contains(&t) {
                    inputs.push(t);
                }
            });
        }
        self.p.ops.push(OpRecord { op: name, attrs, inputs, outputs, stages, span, args, std_callee });
    }

    fn local_tensor(
        &mut self,
        inst: &mut Inst,
        t: TensorSlot,
        shape: Vec<i64>,
        span: Span,
    ) -> Result<TensorId, Diagnostic> {
        if let Some(id) = inst.tensors[t as usize] {
            let have = &self.p.tensor(id).shape;
            if *have != shape {
                let info = &inst.k.tensors[t as usize];
                return Err(Diagnostic::at(
                    span,
                    format!("`{}` is declared with shape {have:?}, but this statement produces {shape:?}", info.name),
                )
                .with_secondary(info.span, "declared here"));
            }
            return Ok(id);
        }
        let info = &inst.k.tensors[t as usize];
        let name = format!("{}{}", inst.prefix, info.name);
        let id = new_tensor(&mut self.p, &name, info.elem, shape, TensorRole::Temp, info.span)?;
        inst.tensors[t as usize] = Some(id);
        Ok(id)
    }

    fn def(
        &mut self,
        inst: &mut Inst<'a>,
        t: TensorSlot,
        axes: &[VarSlot],
        value: ExprId,
        span: Span,
    ) -> Result<(), Diagnostic> {
        let mut sv = StageVars { vars: Vec::new(), map: HashMap::new() };
        let is_output = matches!(inst.k.tensors[t as usize].kind, TensorKind::Output(_));
        for (i, &v) in axes.iter().enumerate() {
            let extent =
                if is_output { self.p.tensor(inst.tensor(t)).shape[i] } else { self.var_range(inst, v, value)? };
            sv.map.insert(v, (sv.vars.len() as VarId, 0));
            sv.vars.push(VarDecl { name: inst.k.vars[v as usize].name.clone(), extent });
        }
        let shape: Vec<i64> = sv.vars.iter().map(|v| v.extent).collect();
        let id = self.local_tensor(inst, t, shape, span)?;
        let raw = self.expr(inst, &mut sv, value)?;
        let elem = self.p.tensor(id).elem;
        let body = self.coerce(raw, inst.facts.ty[&value], RTy::Elem(elem));
        self.push_stage(Stage { tensor: id, n_axes: axes.len(), vars: sv.vars, value: body, span })
    }

    fn push_stage(&mut self, st: Stage) -> Result<(), Diagnostic> {
        if self.p.stages.len() >= MAX_STAGES {
            return Err(Diagnostic::at(
                st.span,
                format!("the program has more than {MAX_STAGES} stages after inlining calls"),
            )
            .with_note("a chain of kernels that each call the next several times grows exponentially"));
        }
        let iterations = st.vars.iter().try_fold(1i64, |n, v| n.checked_mul(v.extent.max(1)));
        if iterations.is_none_or(|n| n > MAX_ITERATIONS) {
            let ranges: Vec<String> = st.vars.iter().map(|v| format!("{} < {}", v.name, v.extent)).collect();
            return Err(Diagnostic::at(
                st.span,
                format!("this statement would take more than {MAX_ITERATIONS} iterations ({})", ranges.join(", ")),
            ));
        }
        self.p.stages.push(st);
        if !self.check_bounds {
            return Ok(());
        }
        bounds::check_stage(&self.p, self.p.stages.len() - 1)
    }

    fn copy(&mut self, inst: &mut Inst, dst: TensorSlot, src: TensorSlot, span: Span) -> Result<(), Diagnostic> {
        let src_id = inst.tensor(src);
        let shape = self.p.tensor(src_id).shape.clone();
        let id = self.local_tensor(inst, dst, shape.clone(), span)?;
        let vars: Vec<VarDecl> =
            shape.iter().enumerate().map(|(i, &e)| VarDecl { name: format!("i{i}"), extent: e }).collect();
        let idx: Vec<TExprId> =
            (0..shape.len()).map(|i| self.p.alloc(TExpr::Var(i as VarId), Ty::Index, span)).collect();
        let elem = self.p.tensor(src_id).elem;
        let value = self.p.alloc(TExpr::Load(src_id, idx), Ty::Elem(elem), span);
        self.push_stage(Stage { tensor: id, n_axes: shape.len(), vars, value, span })
    }

    fn call(
        &mut self,
        inst: &mut Inst<'a>,
        callee: KernelRef,
        args: &[ArgBinding],
        results: &[TensorSlot],
        span: Span,
    ) -> Result<(), Diagnostic> {
        let first = &inst.k.tensors[results[0] as usize].name;
        let prefix = format!("{}{}.", inst.prefix, first);
        let mut ci = Inst::new(self.s, callee, prefix);
        let csz = ci.sizes();
        let ck = ci.k;
        let mut given = Vec::new();
        for (i, (prm, arg)) in ck.params.iter().zip(args).enumerate() {
            match (arg, &prm.info) {
                (ArgBinding::Const(Some(e)), _) => {
                    ci.consts[i] = Some(inst.sizes().eval(*e, &inst.consts, &inst.syms)?)
                }
                (ArgBinding::Const(None), ParamInfo::Const { default: Some(d) }) => {
                    ci.consts[i] = Some(csz.eval(*d, &ci.consts, &ci.syms)?)
                }
                (ArgBinding::Scalar(a), ParamInfo::Scalar { elem, default }) => {
                    let v = match (a, default) {
                        (Some(e), _) => {
                            let mut sv = StageVars { vars: vec![], map: HashMap::new() };
                            let raw = self.expr(inst, &mut sv, *e)?;
                            self.coerce(raw, inst.facts.ty[e], RTy::Elem(*elem))
                        }
                        (None, Some(d)) => self.constant(literal_value(ci.ast, *d), *elem, prm.span),
                        (None, None) => unreachable!("resolution requires the argument"),
                    };
                    ci.scalars[i] = Some(v);
                }
                (ArgBinding::Tensor(t), ParamInfo::Tensor(ct)) => {
                    let id = inst.tensor(*t);
                    ci.tensors[*ct as usize] = Some(id);
                    given.push((*ct, self.p.tensor(id).shape.clone()));
                }
                _ => unreachable!("bindings follow the callee's parameters"),
            }
        }
        if inst.prefix.is_empty() {
            self.call_args = ck
                .params
                .iter()
                .zip(args)
                .enumerate()
                .map(|(i, (prm, a))| match (a, &prm.info) {
                    (ArgBinding::Tensor(t), _) => OpArg::Tensor(inst.tensor(*t)),
                    (ArgBinding::Const(_), _) => OpArg::Const(ci.consts[i].expect("bound above")),
                    (ArgBinding::Scalar(Some(e)), _) => OpArg::Scalar(scalar_text(inst, *e)),
                    (ArgBinding::Scalar(None), ParamInfo::Scalar { default: Some(d), .. }) => {
                        OpArg::Scalar(Some(format!("{:?}", literal_value(ci.ast, *d))))
                    }
                    _ => OpArg::Scalar(None),
                })
                .collect();
            self.attrs = ck
                .params
                .iter()
                .zip(&ci.consts)
                .filter_map(|(prm, v)| v.map(|v| format!("{}={v}", prm.name)))
                .collect();
        }
        solve_symbols(&csz, ck, &given, &ci.consts, &mut ci.syms)?;
        apply_defaults(&csz, ck, &ci.consts, &mut ci.syms)?;
        if let Some(sym) = ck.symbols.iter().zip(&ci.syms).find_map(|(sym, v)| v.is_none().then_some(sym)) {
            return Err(Diagnostic::at(
                span,
                format!("cannot determine shape symbol `{}` of `{}` from the arguments", sym.name, ck.name),
            )
            .with_secondary(sym.span, "declared here"));
        }
        check_given_shapes(&csz, ck, &given, &ci, "the argument")
            .map_err(|d| d.with_secondary(span, "in this call"))?;
        for (&o, &r) in ck.outputs.iter().zip(results) {
            let shape = declared_shape(&csz, ck, o, &ci)?;
            let id = self.local_tensor(inst, r, shape, span)?;
            ci.tensors[o as usize] = Some(id);
        }
        self.kernel(&mut ci)
    }

    fn constant(&mut self, v: f64, elem: ElemType, span: Span) -> TExprId {
        if elem.is_float() {
            self.p.alloc(TExpr::Float(texc_runtime::round_to(elem, v)), Ty::Elem(elem), span)
        } else {
            self.p.alloc(TExpr::Int(crate::interp::cast_f64_to_int(v, elem)), Ty::Elem(elem), span)
        }
    }

    /// Range of variable `v`: written (`v in lo..hi`) or inferred from the
    /// accesses in `scope_expr` that index a dimension by `v` alone.
    fn var_range(&mut self, inst: &Inst, v: VarSlot, scope_expr: ExprId) -> Result<i64, Diagnostic> {
        let var = &inst.k.vars[v as usize];
        if let Some((lo, hi)) = var.range {
            let sz = inst.sizes();
            let lo_v = sz.eval(lo, &inst.consts, &inst.syms)?;
            let hi_v = sz.eval(hi, &inst.consts, &inst.syms)?;
            let span = inst.ast.span(lo).to(inst.ast.span(hi));
            // `hi − lo` is checked first: an "empty" range whose length
            // overflows (`5..-9223372036854775807`) is an error, not 0.
            return match hi_v.checked_sub(lo_v) {
                Some(n) if n <= 0 => Ok(0),
                Some(n) if n <= MAX_ELEMENTS => Ok(n),
                Some(_) => Err(Diagnostic::at(
                    span,
                    format!("the range {lo_v}..{hi_v} of `{}` has more than {MAX_ELEMENTS} values", var.name),
                )
                .with_note("texc bounds every range like a tensor dimension")),
                None => Err(Diagnostic::at(
                    span,
                    format!("the length of the range {lo_v}..{hi_v} of `{}` overflows 64 bits", var.name),
                )
                .with_note("texc bounds every range like a tensor dimension")),
            };
        }
        let mut uses = Vec::new();
        self.collect_uses(inst, v, scope_expr, &mut uses);
        let Some(&(first_span, first_t, first_d)) = uses.first() else {
            return Err(Diagnostic::at(
                var.span,
                format!("cannot infer the range of `{}`: it never indexes a tensor dimension on its own", var.name),
            )
            .with_note(format!("write the range, e.g. `{} in 0..N`", var.name)));
        };
        let size_of = |p: &Program, t: TensorId, d: usize| p.tensor(t).shape[d];
        let ext = size_of(&self.p, first_t, first_d);
        for &(span, t, d) in &uses[1..] {
            let e2 = size_of(&self.p, t, d);
            if e2 != ext {
                let (n1, n2) = (&self.p.tensor(first_t).name, &self.p.tensor(t).name);
                return Err(Diagnostic::at(span, format!(
                    "conflicting ranges for `{}`: dimension {d} of `{n2}` has size {e2}, but dimension {first_d} of `{n1}` has size {ext}",
                    var.name
                ))
                .with_secondary(first_span, format!("`{}` ranges over 0..{ext} here", var.name)));
            }
        }
        Ok(ext)
    }

    fn collect_uses(&self, inst: &Inst, v: VarSlot, e: ExprId, out: &mut Vec<(Span, TensorId, usize)>) {
        let ex = inst.ast.expr(e);
        if let Expr::Access { indices, .. } = ex {
            for (d, &i) in indices.iter().enumerate() {
                if inst.facts.names.get(&i) == Some(&NameRes::Var(v)) {
                    if let Some(t) = self.access_tensor(inst, e) {
                        out.push((inst.ast.span(i), t, d));
                    }
                }
            }
        }
        for c in ex.children() {
            self.collect_uses(inst, v, c, out);
        }
    }

    fn access_tensor(&self, inst: &Inst, e: ExprId) -> Option<TensorId> {
        let Expr::Access { tensor, .. } = inst.ast.expr(e) else {
            return None;
        };
        let by_name = || inst.k.tensors.iter().position(|t| t.name == tensor.name);
        debug_assert!(inst.facts.accesses.get(&e).map(|&s| s as usize) == by_name(), "resolve's slot, by name");
        // Every access *resolve* accepted has its slot; the scan is a fallback.
        let slot = inst.facts.accesses.get(&e).map(|&s| s as usize).or_else(by_name)?;
        inst.tensors[slot]
    }

    /// Fold index arithmetic on constants (`2 * 3`, `0 * i`, `i + 0`, `1 * i`)
    /// so that sizes and selectors written arithmetically become plain
    /// indices. Integer semantics are the interpreter's (floor division).
    fn fold_index(&mut self, op: BinOp, a: TExprId, b: TExprId) -> Option<TExprId> {
        let konst = |p: &Program, e: TExprId| match p.expr(e) {
            TExpr::Int(v) if p.ty(e) == Ty::Index => Some(*v),
            _ => None,
        };
        let span = self.p.span(a).to(self.p.span(b));
        let (ka, kb) = (konst(&self.p, a), konst(&self.p, b));
        if let (Some(x), Some(y)) = (ka, kb) {
            let v = match op {
                BinOp::Add => x.checked_add(y)?,
                BinOp::Sub => x.checked_sub(y)?,
                BinOp::Mul => x.checked_mul(y)?,
                BinOp::FloorDiv if y != 0 => floor_div(x, y)?,
                BinOp::FloorMod if y != 0 => floor_mod(x, y)?,
                _ => return None,
            };
            return Some(self.p.alloc(TExpr::Int(v), Ty::Index, span));
        }
        match (op, ka, kb) {
            (BinOp::Mul, Some(0), _) | (BinOp::Mul, _, Some(0)) => Some(self.p.alloc(TExpr::Int(0), Ty::Index, span)),
            (BinOp::Mul, Some(1), _) | (BinOp::Add, Some(0), _) => Some(b),
            (BinOp::Mul, _, Some(1))
            | (BinOp::Add, _, Some(0))
            | (BinOp::Sub, _, Some(0))
            | (BinOp::FloorDiv, _, Some(1)) => Some(a),
            _ => None,
        }
    }

    fn coerce(&mut self, id: TExprId, from: RTy, to: RTy) -> TExprId {
        if from == to {
            return id;
        }
        let ty = rty_to_ty(to);
        if self.p.ty(id) == ty {
            return id;
        }
        let span = self.p.span(id);
        match (self.p.expr(id).clone(), ty) {
            (TExpr::Int(v), Ty::Elem(e)) if e.is_float() => {
                self.p.alloc(TExpr::Float(texc_runtime::round_to(e, v as f64)), ty, span)
            }
            (TExpr::Int(v), Ty::Elem(e)) => self.p.alloc(TExpr::Int(texc_runtime::wrap_to(e, v)), ty, span),
            (TExpr::Float(v), Ty::Elem(e)) if e.is_float() => {
                self.p.alloc(TExpr::Float(texc_runtime::round_to(e, v)), ty, span)
            }
            _ => self.p.alloc(TExpr::Cast(id), ty, span),
        }
    }

    fn expr(&mut self, inst: &Inst<'a>, sv: &mut StageVars, e: ExprId) -> Result<TExprId, Diagnostic> {
        let span = inst.ast.span(e);
        let fty = |x: ExprId| inst.facts.ty[&x];
        let node_ty = fty(e);
        let ty = rty_to_ty(node_ty);
        let out = match inst.ast.expr(e) {
            Expr::Int(v) => self.p.alloc(TExpr::Int(*v), Ty::Index, span),
            Expr::Float(v) => self.p.alloc(TExpr::Float(*v), Ty::Elem(ElemType::F64), span),
            Expr::Name(_) => match inst.facts.names[&e] {
                NameRes::Var(v) => {
                    let (sv_id, off) = sv.map[&v];
                    let var = self.p.alloc(TExpr::Var(sv_id), Ty::Index, span);
                    if off == 0 {
                        var
                    } else {
                        let c = self.p.alloc(TExpr::Int(off), Ty::Index, span);
                        self.p.alloc(TExpr::Binary(BinOp::Add, var, c), Ty::Index, span)
                    }
                }
                NameRes::Scalar(i) => inst.scalars[i as usize].expect("scalars are bound before the body"),
                NameRes::Const(i) => self.p.alloc(TExpr::Int(inst.consts[i as usize].expect("bound")), Ty::Index, span),
                NameRes::Symbol(i) => self.p.alloc(TExpr::Int(inst.syms[i as usize].expect("bound")), Ty::Index, span),
                NameRes::Tensor(t) => self.p.alloc(TExpr::Load(inst.tensor(t), vec![]), ty, span),
                NameRes::Inf => self.p.alloc(TExpr::Float(f64::INFINITY), Ty::Elem(ElemType::F64), span),
            },
            Expr::Access { indices, .. } => {
                let t = self.access_tensor(inst, e).expect("resolved tensor");
                let idx = indices.iter().map(|&i| self.expr(inst, sv, i)).collect::<Result<Vec<_>, _>>()?;
                self.p.alloc(TExpr::Load(t, idx), ty, span)
            }
            Expr::Call { args, .. } => match inst.facts.calls[&e] {
                CallRes::Cast(elem) => {
                    let a = self.expr(inst, sv, args[0].value)?;
                    let from = fty(args[0].value);
                    // An explicit cast of a computed float to its own type is
                    // a rounding point (docs/language.md: floats are rounded
                    // when stored and by explicit casts): the interpreter,
                    // which computes in f64, rounds there, as the compiled
                    // targets, which compute in the element type, do anyway.
                    // `round(f32(x / s))` then rounds the f32 quotient everywhere.
                    let computed = !matches!(
                        self.p.expr(a),
                        TExpr::Load(..) | TExpr::Float(_) | TExpr::Int(_) | TExpr::Scalar(_) | TExpr::Cast(_)
                    );
                    if elem.is_float() && self.p.ty(a) == Ty::Elem(elem) && computed {
                        return Ok(self.p.alloc(TExpr::Cast(a), Ty::Elem(elem), span));
                    }
                    self.coerce(a, from, RTy::Elem(elem))
                }
                CallRes::Select => {
                    let c = self.expr(inst, sv, args[0].value)?;
                    let mut sides = [c; 2];
                    for (k, a) in args[1..].iter().enumerate() {
                        let x = self.expr(inst, sv, a.value)?;
                        sides[k] = self.coerce(x, fty(a.value), node_ty);
                    }
                    self.p.alloc(TExpr::Select(c, sides[0], sides[1]), ty, span)
                }
                CallRes::Math(f) => {
                    let mut lowered = Vec::new();
                    for a in args {
                        let x = self.expr(inst, sv, a.value)?;
                        lowered.push(self.coerce(x, fty(a.value), node_ty));
                    }
                    self.p.alloc(TExpr::Math(f, lowered), ty, span)
                }
            },
            Expr::Reduce { body, .. } => {
                let (op, vars) = inst.facts.reduces[&e].clone();
                let mut ids = Vec::new();
                for v in vars {
                    let var = &inst.k.vars[v as usize];
                    let lo = match var.range {
                        Some((lo, _)) => inst.sizes().eval(lo, &inst.consts, &inst.syms)?,
                        None => 0,
                    };
                    let extent = self.var_range(inst, v, *body)?;
                    let id = sv.vars.len() as VarId;
                    sv.map.insert(v, (id, lo));
                    sv.vars.push(VarDecl { name: var.name.clone(), extent });
                    ids.push(id);
                }
                let b = self.expr(inst, sv, *body)?;
                if matches!(ty, Ty::Elem(ElemType::F16 | ElemType::BF16)) {
                    // Half-precision reductions accumulate in f32 (as PyTorch and
                    // cuBLAS do), then round once: a running f16 sum overflows.
                    let wide = Ty::Elem(ElemType::F32);
                    let b = self.p.alloc(TExpr::Cast(b), wide, span);
                    let r = self.p.alloc(TExpr::Reduce(op, ids, b), wide, span);
                    self.p.alloc(TExpr::Cast(r), ty, span)
                } else {
                    self.p.alloc(TExpr::Reduce(op, ids, b), ty, span)
                }
            }
            Expr::Unary { op, arg } => {
                let a = self.expr(inst, sv, *arg)?;
                let op = match op {
                    ast::UnOp::Neg => UnOp::Neg,
                    ast::UnOp::Not => UnOp::Not,
                };
                self.p.alloc(TExpr::Unary(op, a), ty, span)
            }
            Expr::Binary { op, lhs, rhs } => {
                let (l, r) = (*lhs, *rhs);
                let a = self.expr(inst, sv, l)?;
                let b = self.expr(inst, sv, r)?;
                if op.is_logic() {
                    self.p.alloc(TExpr::Binary(ir_binop(*op, false), a, b), ty, span)
                } else {
                    let t = RTy::unify(fty(l), fty(r)).expect("resolution checked operand types");
                    let a = self.coerce(a, fty(l), t);
                    let b = self.coerce(b, fty(r), t);
                    let rty = if op.is_comparison() { Ty::Elem(ElemType::Bool) } else { rty_to_ty(t) };
                    let op = ir_binop(*op, matches!(rty_to_ty(t), Ty::Elem(e) if e.is_float()));
                    match (rty, self.fold_index(op, a, b)) {
                        (Ty::Index, Some(folded)) => folded,
                        _ => self.p.alloc(TExpr::Binary(op, a, b), rty, span),
                    }
                }
            }
        };
        Ok(out)
    }
}

/// The IR operator for a source operator: `/` and `%` are floor division and
/// modulo on integers, true division on floats (`%` on floats is rejected by resolution).
fn ir_binop(op: ast::BinOp, float: bool) -> BinOp {
    match op {
        ast::BinOp::Add => BinOp::Add,
        ast::BinOp::Sub => BinOp::Sub,
        ast::BinOp::Mul => BinOp::Mul,
        ast::BinOp::Div if float => BinOp::Div,
        ast::BinOp::Div => BinOp::FloorDiv,
        ast::BinOp::Rem => BinOp::FloorMod,
        ast::BinOp::Lt => BinOp::Lt,
        ast::BinOp::Le => BinOp::Le,
        ast::BinOp::Gt => BinOp::Gt,
        ast::BinOp::Ge => BinOp::Ge,
        ast::BinOp::Eq => BinOp::Eq,
        ast::BinOp::Ne => BinOp::Ne,
        ast::BinOp::And => BinOp::And,
        ast::BinOp::Or => BinOp::Or,
    }
}
