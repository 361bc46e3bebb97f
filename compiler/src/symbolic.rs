//! Bounds without sizes: what `texc check` can prove about a kernel's
//! accesses while its shape symbols are still unknown.
//!
//! Every index and every dimension is put in affine form over the kernel's
//! shape symbols and constants ([`Affine`]); an index variable ranges over
//! `lo..hi` with `lo`, `hi` affine too (written, the declared dimension of
//! an output axis, or the dimension it indexes on its own, as
//! specialization infers it). For each access and dimension, the two
//! conditions `min(index) ≥ 0` and `size − 1 − max(index) ≥ 0` are affine
//! inequalities `F ≥ 0` in the symbols, decided soundly and simply:
//! - *proven* when every coefficient of `F` is non-negative and `F` is
//!   non-negative at the smallest values of its symbols;
//! - *violated* for every size when every coefficient is non-positive and
//!   `F` is negative already at those values (an error);
//! - otherwise *conditional*: the access is in bounds exactly when `F ≥ 0`,
//!   which is reported as a condition on the sizes (`N ≤ K`).
//!
//! Assumptions, stated where they are used: symbols and constants are
//! non-negative; an access only runs when every range around it is
//! non-empty, so a symbol that is by itself the extent of an enclosing
//! range is at least 1. Accesses in a `select` branch or on the right of
//! `&&`/`||` are guarded: texc proves them here when it can, and otherwise
//! leaves them to the check at concrete sizes (their guard may rule the
//! out-of-bounds part out). Anything that is not affine (`/`, `%`,
//! products of variables or with constants) is likewise left to that check.
//! Calls are checked in their callee, which `texc check` visits on its own.

use crate::affine::Affine;
use crate::kernel::{KernelInfo, KernelRef, NameRes, Op, TensorKind, TensorSlot, VarSlot};
use crate::session::Session;
use std::collections::HashMap;
use texc_grammar::ast::{BinOp, Expr, ExprId};
use texc_grammar::{Ast, Diagnostic, Span};

/// A size atom: a shape symbol or a constant parameter (by index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Atom {
    Sym(u32),
    Const(u32),
}

type Size = Affine<Atom>;

/// A condition on the sizes under which some access is in bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// `F ≥ 0`, as text (`N <= K`).
    AtLeast(String),
    /// `F = 0`, as text (`N = K`).
    Equal(String),
}

impl Condition {
    pub fn text(&self) -> &str {
        match self {
            Condition::AtLeast(t) | Condition::Equal(t) => t,
        }
    }
}

/// What the symbolic check found in one kernel.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Access dimensions proven in bounds for every size.
    pub proven: usize,
    /// Access dimensions in bounds only under a condition.
    pub conditional: usize,
    /// Access dimensions left to the check at concrete sizes (guarded or not affine).
    pub undecided: usize,
    /// Distinct conditions, in the order found (an `a ≤ b` and `b ≤ a` pair is one `a = b`).
    pub conditions: Vec<Condition>,
    /// Out of bounds for every size, or ranges that never agree: errors.
    pub errors: Vec<Diagnostic>,
    /// One warning per conditional access or range, naming its condition.
    pub warnings: Vec<Diagnostic>,
}

/// A variable's range `lo..hi` (`None` where it is not affine in the sizes).
type Range = Option<(Size, Size)>;

struct Ctx<'a> {
    k: &'a KernelInfo,
    ast: &'a Ast,
    names: &'a HashMap<ExprId, NameRes>,
    reduces: &'a HashMap<ExprId, (crate::ops::ReduceOp, Vec<VarSlot>)>,
    shapes: HashMap<TensorSlot, Vec<Option<Size>>>,
    ranges: HashMap<VarSlot, Range>,
    report: Report,
    /// Conditions as affine forms (`F ≥ 0`), to merge `F ≥ 0` and `−F ≥ 0` into `F = 0`.
    raw: Vec<(Size, bool)>,
}

/// Check every access of kernel `k`'s own definitions with its sizes symbolic.
pub fn check_kernel(s: &Session, k: KernelRef) -> Report {
    let info = s.kernel(k);
    let m = s.module(k.module as usize);
    let mut cx = Ctx {
        k: info,
        ast: &m.ast,
        names: &m.facts.names,
        reduces: &m.facts.reduces,
        shapes: HashMap::new(),
        ranges: HashMap::new(),
        report: Report::default(),
        raw: Vec::new(),
    };
    for (t, ti) in info.tensors.iter().enumerate() {
        if matches!(ti.kind, TensorKind::Input(_) | TensorKind::Output(_)) {
            let dims = ti.dims.iter().map(|d| cx.size(d.expr)).collect();
            cx.shapes.insert(t as TensorSlot, dims);
        }
    }
    for op in &info.ops {
        match op {
            Op::Def { tensor, axes, value, .. } => cx.def(*tensor, axes, *value),
            Op::Copy { dst, src, .. } => {
                let sh = cx.shapes.get(src).cloned().unwrap_or_default();
                cx.shapes.entry(*dst).or_insert(sh);
            }
            // Callees are checked on their own; their results' shapes are not tracked here.
            Op::Call { .. } => {}
        }
    }
    cx.finish()
}

impl Ctx<'_> {
    /// The affine form of a size expression (symbols, constants, literals, `+ - *` by constants).
    fn size(&self, e: ExprId) -> Option<Size> {
        match self.ast.expr(e) {
            Expr::Int(v) => Some(Size::constant(*v as i128)),
            Expr::Name(_) => match self.names.get(&e)? {
                NameRes::Symbol(i) => Some(Size::atom(Atom::Sym(*i))),
                NameRes::Const(i) => Some(Size::atom(Atom::Const(*i))),
                _ => None,
            },
            Expr::Unary { op: texc_grammar::ast::UnOp::Neg, arg } => self.size(*arg)?.scale(-1),
            Expr::Binary { op: BinOp::Add, lhs, rhs } => self.size(*lhs)?.add(&self.size(*rhs)?, 1),
            Expr::Binary { op: BinOp::Sub, lhs, rhs } => self.size(*lhs)?.add(&self.size(*rhs)?, -1),
            Expr::Binary { op: BinOp::Mul, lhs, rhs } => {
                let (a, b) = (self.size(*lhs)?, self.size(*rhs)?);
                match (a.as_const(), b.as_const()) {
                    (Some(c), _) => b.scale(c),
                    (_, Some(c)) => a.scale(c),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// An index in affine form: size atoms, plus index variables (by slot).
    fn index(&self, e: ExprId) -> Option<Affine<Result<VarSlot, Atom>>> {
        type Ix = Affine<Result<VarSlot, Atom>>;
        match self.ast.expr(e) {
            Expr::Int(v) => Some(Ix::constant(*v as i128)),
            Expr::Name(_) => match self.names.get(&e)? {
                NameRes::Var(v) => Some(Ix::atom(Ok(*v))),
                NameRes::Symbol(i) => Some(Ix::atom(Err(Atom::Sym(*i)))),
                NameRes::Const(i) => Some(Ix::atom(Err(Atom::Const(*i)))),
                _ => None,
            },
            Expr::Unary { op: texc_grammar::ast::UnOp::Neg, arg } => self.index(*arg)?.scale(-1),
            Expr::Binary { op: BinOp::Add, lhs, rhs } => self.index(*lhs)?.add(&self.index(*rhs)?, 1),
            Expr::Binary { op: BinOp::Sub, lhs, rhs } => self.index(*lhs)?.add(&self.index(*rhs)?, -1),
            Expr::Binary { op: BinOp::Mul, lhs, rhs } => {
                let (a, b) = (self.index(*lhs)?, self.index(*rhs)?);
                match (a.as_const(), b.as_const()) {
                    (Some(c), _) => b.scale(c),
                    (_, Some(c)) => a.scale(c),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn name(&self, a: Atom) -> String {
        match a {
            Atom::Sym(i) => self.k.symbols[i as usize].name.clone(),
            Atom::Const(i) => self.k.params[i as usize].name.clone(),
        }
    }

    /// `a` rendered (`H + 2*pad - 1`).
    fn show(&self, a: &Size) -> String {
        let mut out = String::new();
        for (atom, &k) in &a.terms {
            let n = self.name(*atom);
            let mag = k.unsigned_abs();
            let term = if mag == 1 { n } else { format!("{mag}*{n}") };
            if out.is_empty() {
                out = if k < 0 { format!("-{term}") } else { term };
            } else {
                out += &format!(" {} {term}", if k < 0 { "-" } else { "+" });
            }
        }
        if out.is_empty() {
            return a.c.to_string();
        }
        if a.c != 0 {
            out += &format!(" {} {}", if a.c < 0 { "-" } else { "+" }, a.c.unsigned_abs());
        }
        out
    }

    /// `F ≥ 0` (or `F = 0`) as `small ≤ big`: negative terms on the left.
    fn relation(&self, f: &Size, equal: bool) -> String {
        let mut left = Size::constant(0);
        let mut right = Size::constant(0);
        for (a, &k) in &f.terms {
            if k < 0 {
                left.terms.insert(*a, -k);
            } else {
                right.terms.insert(*a, k);
            }
        }
        if f.c < 0 {
            left.c = -f.c;
        } else {
            right.c = f.c;
        }
        format!("{} {} {}", self.show(&left), if equal { "=" } else { "<=" }, self.show(&right))
    }

    /// The range of a variable, as specialization would give it: written,
    /// the output's dimension, or inferred from the accesses of `scope` that
    /// it indexes on its own (ranges that disagree are reported).
    fn range_of(&mut self, v: VarSlot, scope: ExprId, output_dim: Option<Option<Size>>) -> Range {
        let var = &self.k.vars[v as usize];
        if let Some((lo, hi)) = var.range {
            return Some((self.size(lo)?, self.size(hi)?));
        }
        if let Some(d) = output_dim {
            return d.map(|d| (Size::constant(0), d));
        }
        let mut uses = Vec::new();
        self.uses(v, scope, &mut uses);
        let (first_span, first) = uses.first().cloned()?;
        let first = first?;
        for (span, d) in &uses[1..] {
            let Some(d) = d else { continue };
            let Some(diff) = d.clone().add(&first, -1) else { continue };
            match diff.as_const() {
                Some(0) => {}
                Some(_) => self.report.errors.push(
                    Diagnostic::at(
                        *span,
                        format!(
                            "conflicting ranges for `{}` at every size: this dimension has size {}, but another has size {}",
                            var.name,
                            self.show(d),
                            self.show(&first)
                        ),
                    )
                    .with_secondary(first_span, format!("`{}` ranges over 0..{} here", var.name, self.show(&first))),
                ),
                None => {
                    let text = self.relation(&diff, true);
                    self.report.conditional += 1;
                    self.raw.push((diff.clone(), true));
                    self.report.warnings.push(
                        Diagnostic::at(*span, format!("`{}` has one range only when {text}", var.name))
                            .with_secondary(
                                first_span,
                                format!("`{}` ranges over 0..{} here", var.name, self.show(&first)),
                            )
                            .with_note(format!(
                                "this dimension has size {}; the kernel is valid only when {text}",
                                self.show(d)
                            ))
                            .into_warning(),
                    );
                }
            }
        }
        Some((Size::constant(0), first))
    }

    /// Dimensions that `v` indexes on its own in `e`.
    fn uses(&self, v: VarSlot, e: ExprId, out: &mut Vec<(Span, Option<Size>)>) {
        let ex = self.ast.expr(e);
        if let Expr::Access { tensor, indices } = ex {
            for (d, &i) in indices.iter().enumerate() {
                if self.names.get(&i) == Some(&NameRes::Var(v)) {
                    let slot = self.k.tensors.iter().position(|t| t.name == tensor.name);
                    let dim =
                        slot.and_then(|t| self.shapes.get(&(t as TensorSlot))).map(|sh| sh.get(d).cloned().flatten());
                    out.push((self.ast.span(i), dim.flatten()));
                }
            }
        }
        for c in ex.children() {
            self.uses(v, c, out);
        }
    }

    fn def(&mut self, t: TensorSlot, axes: &[VarSlot], value: ExprId) {
        let out_shape = match self.k.tensors[t as usize].kind {
            TensorKind::Output(_) => self.shapes.get(&t).cloned(),
            _ => None,
        };
        let mut shape = Vec::new();
        for (i, &v) in axes.iter().enumerate() {
            let od = out_shape.as_ref().map(|s| s.get(i).cloned().flatten());
            let r = self.range_of(v, value, od);
            shape.push(r.as_ref().and_then(|(lo, hi)| hi.clone().add(lo, -1)));
            self.ranges.insert(v, r);
        }
        self.shapes.entry(t).or_insert(shape);
        self.walk(value, axes.to_vec(), false);
    }

    /// Check the accesses of `e`; `live` are the variables whose ranges enclose it.
    fn walk(&mut self, e: ExprId, mut live: Vec<VarSlot>, guarded: bool) {
        match self.ast.expr(e).clone() {
            Expr::Access { tensor, indices } => {
                for &i in &indices {
                    self.walk(i, live.clone(), guarded);
                }
                let Some(t) = self.k.tensors.iter().position(|x| x.name == tensor.name) else { return };
                let shape = self.shapes.get(&(t as TensorSlot)).cloned().unwrap_or_default();
                for (d, &i) in indices.iter().enumerate() {
                    let dim = shape.get(d).cloned().flatten();
                    self.access(&tensor.name, d, i, dim, &live, guarded);
                }
            }
            Expr::Reduce { body, .. } => {
                if let Some((_, vars)) = self.reduces.get(&e).cloned() {
                    for v in vars {
                        let r = self.range_of(v, body, None);
                        self.ranges.insert(v, r);
                        live.push(v);
                    }
                }
                self.walk(body, live, guarded);
            }
            Expr::Call { func, args } if func.name == "select" && args.len() == 3 => {
                self.walk(args[0].value, live.clone(), guarded);
                self.walk(args[1].value, live.clone(), true);
                self.walk(args[2].value, live, true);
            }
            Expr::Binary { op: BinOp::And | BinOp::Or, lhs, rhs } => {
                self.walk(lhs, live.clone(), guarded);
                self.walk(rhs, live, true);
            }
            ex => {
                for c in ex.children() {
                    self.walk(c, live.clone(), guarded);
                }
            }
        }
    }

    /// Symbols known to be at least 1 where `live` variables run: those
    /// that are by themselves the extent of one of the ranges.
    fn at_least_one(&self, live: &[VarSlot]) -> Vec<Atom> {
        let mut out = Vec::new();
        for v in live {
            if let Some(Some((lo, hi))) = self.ranges.get(v) {
                if let Some(ext) = hi.clone().add(lo, -1) {
                    if ext.c == 0 && ext.terms.len() == 1 {
                        let (a, &k) = ext.terms.iter().next().expect("one term");
                        if k == 1 {
                            out.push(*a);
                        }
                    }
                }
            }
        }
        out
    }

    fn access(&mut self, tensor: &str, d: usize, i: ExprId, dim: Option<Size>, live: &[VarSlot], guarded: bool) {
        let span = self.ast.span(i);
        let (Some(ix), Some(dim)) = (self.index(i), dim) else {
            self.report.undecided += 1;
            return;
        };
        // min and max of the index over the ranges of its variables.
        let (mut lo, mut hi) = (Size::constant(ix.c), Size::constant(ix.c));
        let mut ranges_known = true;
        for (a, &k) in &ix.terms {
            match a {
                Err(atom) => {
                    lo = lo.add(&Size::atom(*atom), k).expect("small");
                    hi = hi.add(&Size::atom(*atom), k).expect("small");
                }
                Ok(v) => {
                    let Some(Some((rlo, rhi))) = self.ranges.get(v).cloned() else {
                        ranges_known = false;
                        break;
                    };
                    let last = rhi.clone().add(&Size::constant(1), -1).expect("small");
                    let (a, b) = if k > 0 { (rlo.clone(), last) } else { (last, rlo.clone()) };
                    match (lo.clone().add(&a, k), hi.clone().add(&b, k)) {
                        (Some(x), Some(y)) => (lo, hi) = (x, y),
                        _ => ranges_known = false,
                    }
                }
            }
        }
        if !ranges_known {
            self.report.undecided += 1;
            return;
        }
        let ones = self.at_least_one(live);
        let upper = dim.clone().add(&Size::constant(1), -1).and_then(|x| x.add(&hi, -1));
        let Some(upper) = upper else {
            self.report.undecided += 1;
            return;
        };
        let sides = [lo.clone(), upper];
        let mut worst = Verdict::Proven;
        let mut conds = Vec::new();
        for f in &sides {
            match decide(f, &ones) {
                Verdict::Proven => {}
                Verdict::Never => worst = Verdict::Never,
                Verdict::When => {
                    if worst == Verdict::Proven {
                        worst = Verdict::When;
                    }
                    conds.push(f.clone());
                }
            }
        }
        let range_text = format!("{}..={}", self.show(&lo), self.show(&hi));
        match worst {
            Verdict::Proven => self.report.proven += 1,
            _ if guarded => self.report.undecided += 1,
            Verdict::Never => {
                self.report.errors.push(
                    Diagnostic::at(
                        span,
                        format!(
                            "index out of bounds for every size: dimension {d} of `{tensor}` has size {}, but this index ranges over {range_text}",
                            self.show(&dim)
                        ),
                    )
                    .with_note("an access outside a tensor is only allowed in the true branch of a `select` whose condition rules it out (padding)"),
                );
            }
            Verdict::When => {
                self.report.conditional += 1;
                let texts: Vec<String> = conds.iter().map(|f| self.relation(f, false)).collect();
                self.raw.extend(conds.into_iter().map(|f| (f, false)));
                self.report.warnings.push(
                    Diagnostic::at(span, format!("this access is in bounds only when {}", texts.join(" and ")))
                        .with_note(format!(
                            "dimension {d} of `{tensor}` has size {}, and this index ranges over {range_text}",
                            self.show(&dim)
                        ))
                        .into_warning(),
                );
            }
        }
    }

    fn finish(mut self) -> Report {
        // Merge `F ≥ 0` with `−F ≥ 0` (and with `F = 0`) into `F = 0`.
        let raw = std::mem::take(&mut self.raw);
        let canon = |f: &Size| -> (Size, i32) {
            // The sign that makes the first coefficient positive, so `F` and `−F` meet.
            let first = f.terms.values().next().copied().unwrap_or(f.c);
            if first < 0 {
                (f.clone().scale(-1).expect("small"), -1)
            } else {
                (f.clone(), 1)
            }
        };
        let mut seen: Vec<(Size, bool, bool, bool)> = Vec::new(); // (canonical, ≥ side, ≤ side, equal)
        for (f, equal) in &raw {
            let (c, sign) = canon(f);
            let entry = match seen.iter_mut().find(|(x, ..)| *x == c) {
                Some(e) => e,
                None => {
                    seen.push((c.clone(), false, false, false));
                    seen.last_mut().expect("pushed")
                }
            };
            if *equal {
                entry.3 = true;
            } else if sign > 0 {
                entry.1 = true;
            } else {
                entry.2 = true;
            }
        }
        // Of `F + a ≥ 0` and `F + b ≥ 0` (same terms), the one with the smaller constant implies the other.
        let implied = |i: usize| {
            let (f, ge, le, eq) = &seen[i];
            !*eq && (*ge != *le)
                && seen.iter().enumerate().any(|(j, (g, ge2, le2, eq2))| {
                    j != i
                        && g.terms == f.terms
                        && (*eq2 && *ge2 == *ge && *le2 == *le
                            || *ge2 == *ge && *le2 == *le && {
                                // Oriented as `F ≥ 0`: a smaller constant is stricter.
                                let (a, b) = if *ge { (g.c, f.c) } else { (-g.c, -f.c) };
                                a < b || a == b && j < i
                            })
                })
        };
        let keep: Vec<bool> = (0..seen.len()).map(|i| !implied(i)).collect();
        for (i, (c, ge, le, eq)) in seen.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            let cond = if *eq || (*ge && *le) {
                Condition::Equal(self.relation(c, true))
            } else if *ge {
                Condition::AtLeast(self.relation(c, false))
            } else {
                Condition::AtLeast(self.relation(&c.clone().scale(-1).expect("small"), false))
            };
            self.report.conditions.push(cond);
        }
        self.report
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Proven,
    /// Negative for every size.
    Never,
    /// Depends on the sizes.
    When,
}

/// Decide `f ≥ 0` over non-negative size atoms, those in `ones` being at least 1.
fn decide(f: &Size, ones: &[Atom]) -> Verdict {
    let least = |a: &Atom| if ones.contains(a) { 1 } else { 0 };
    let at_least = f.terms.iter().fold(f.c, |acc, (a, &k)| acc.saturating_add(k.saturating_mul(least(a))));
    if f.terms.values().all(|&k| k >= 0) && at_least >= 0 {
        return Verdict::Proven;
    }
    if f.terms.values().all(|&k| k <= 0) && at_least < 0 {
        return Verdict::Never;
    }
    Verdict::When
}
