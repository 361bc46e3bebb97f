//! Memory safety of a loop nest read from text: every load and store is
//! proven inside its tensor before any of it reaches a backend (compiled
//! code does not check indices).
//!
//! The proof is interval arithmetic over the loop ranges, sharpened by
//! facts: the conditions of enclosing `if`s, and of a `select` for the side
//! it chooses (texc evaluates only that side), read as bounds on affine
//! forms of the loop variables (`x.o * 16 + x.v < 56`). An index whose affine
//! form equals a fact's up to a constant takes the fact's bound; a fact on
//! one variable narrows that variable's range. This is what the lowering
//! itself produces (split tails, padding selects, attached boxes), so every
//! printed nest passes; an access that it cannot prove is an error, even if
//! it happens to be safe.

use crate::interval::{exact, within_type, Iv, ANY};
use crate::ir::{LoopFunc, Stmt, Tile, TileDot};
use texc_compiler::affine::{affine_of, Affine};
use texc_compiler::ops::{BinOp, UnOp};
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_grammar::diagnostic::Diagnostic;

/// A term of an affine form: a loop variable, or a sub-expression that is
/// not affine (`x % 22`), known by its structure so that the same term in a
/// condition and in an index match.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Atom {
    Var(VarId),
    Term(String),
}

/// `form ∈ [lo, hi]` for an affine form without constant.
#[derive(Clone)]
struct Fact {
    form: Affine<Atom>,
    iv: Iv,
}

/// The structure of `e` as a string (variables by id).
fn key(p: &texc_compiler::tir::Program, e: TExprId) -> String {
    let kids: Vec<String> = p.children(e).into_iter().map(|c| key(p, c)).collect();
    let head = match p.expr(e) {
        TExpr::Var(v) => format!("v{v}"),
        TExpr::Int(c) => format!("{c}"),
        TExpr::Load(t, _) => format!("load{}", t.0),
        other => format!("{:?}", std::mem::discriminant(other)) + &op_key(other),
    };
    // The type is part of the term: `i8(x)` and `i32(x)` differ.
    format!("({head}:{} {})", p.ty(e), kids.join(" "))
}

fn op_key(e: &TExpr) -> String {
    match e {
        TExpr::Binary(op, ..) => format!("{op:?}"),
        TExpr::Unary(op, ..) => format!("{op:?}"),
        TExpr::Math(f, _) => format!("{f:?}"),
        TExpr::Scalar(s) => format!("s{s}"),
        TExpr::Float(x) => format!("{x:?}"),
        _ => String::new(),
    }
}

/// The affine form of `e` over loop variables and opaque integer terms.
fn form_of(p: &texc_compiler::tir::Program, e: TExprId) -> Option<Affine<Atom>> {
    form_with_terms(p, e, &mut Vec::new())
}

/// [`form_of`], also listing each opaque term's expression.
fn form_with_terms(
    p: &texc_compiler::tir::Program,
    e: TExprId,
    terms: &mut Vec<(String, TExprId)>,
) -> Option<Affine<Atom>> {
    affine_of(p, e, &mut |x| match p.expr(x) {
        TExpr::Var(v) => Some(Affine::atom(Atom::Var(*v))),
        _ if p.ty(x) == Ty::Index || matches!(p.ty(x), Ty::Elem(t) if t.is_int()) => {
            let k = key(p, x);
            terms.push((k.clone(), x));
            Some(Affine::atom(Atom::Term(k)))
        }
        _ => None,
    })
}

struct Checker<'a> {
    f: &'a LoopFunc,
    /// Range of each loop variable in scope.
    vars: Vec<Option<Iv>>,
    facts: Vec<Fact>,
    /// Temporaries and locals written so far, in the order statements are written.
    written: Vec<bool>,
}

/// Prove every access of `f` in bounds, and that no temporary or local is
/// read before a statement written above the read stores to it (a local is
/// an uninitialized stack array; an unwritten temporary has no buffer).
pub fn check(f: &LoopFunc) -> Result<(), Diagnostic> {
    let mut c =
        Checker { f, vars: vec![None; f.vars.len()], facts: Vec::new(), written: vec![false; f.p.tensors.len()] };
    c.stmts(&f.body)
}

impl Checker<'_> {
    fn stmts(&mut self, body: &[Stmt]) -> Result<(), Diagnostic> {
        for s in body {
            match s {
                Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) => {}
                Stmt::Prefetch { tensor, offset } => self.prefetch(*tensor, *offset)?,
                Stmt::For { var, lo, extent, body, .. } => {
                    if *extent == 0 {
                        continue;
                    }
                    let saved = self.vars[*var as usize];
                    self.vars[*var as usize] =
                        Some(Iv { lo: Some(*lo as i128), hi: Some((*lo + *extent - 1) as i128) });
                    self.stmts(body)?;
                    self.vars[*var as usize] = saved;
                }
                Stmt::If { cond, then } => {
                    self.expr(*cond)?;
                    let (n_facts, saved) = (self.facts.len(), self.vars.clone());
                    self.assume(*cond, true);
                    self.stmts(then)?;
                    self.facts.truncate(n_facts);
                    self.vars = saved;
                }
                Stmt::Alloc { tensor, body } => {
                    self.written[tensor.0 as usize] = false;
                    self.stmts(body)?
                }
                Stmt::Store { tensor, indices, value } => {
                    self.access(*tensor, indices, None)?;
                    self.expr(*value)?;
                    self.written[tensor.0 as usize] = true;
                }
                Stmt::Mma { op, c, a, b } => {
                    let (m, n, k) = op.shape();
                    for (t, rows, cols) in [(c, m, n), (a, m, k), (b, k, n)] {
                        self.tile(t, rows, cols)?;
                    }
                    self.written[c.tensor.0 as usize] = true;
                }
                Stmt::TileDot(d) => {
                    // `c` is read too, unless the sum starts from zero.
                    if d.zero {
                        self.written[d.c.tensor.0 as usize] = true;
                    }
                    for (t, rows, cols) in d.tiles() {
                        self.boxed(t.tensor, &t.origin, &tile_reach(t, rows, cols), TileDot::SCHEDULE_NAME)?;
                    }
                    self.written[d.c.tensor.0 as usize] = true;
                }
                Stmt::Wgmma(w) => {
                    let (m, n, _) = w.op.shape();
                    self.tile(&w.c, m, n)?;
                    for (x, mn, k) in w.operands() {
                        if x.origin.len() != self.f.p.tensor(x.tensor).shape.len() {
                            let at = x.origin.first().map_or_else(Default::default, |&i| self.f.p.span(i));
                            return Err(Diagnostic::at(at, "a `wgmma` operand has one index per dimension"));
                        }
                        self.boxed(x.tensor, &x.origin, &x.reach(mn, k), "wgmma")?;
                    }
                    self.written[w.c.tensor.0 as usize] = true;
                }
            }
        }
        Ok(())
    }

    /// Check the accesses inside `e`.
    fn expr(&mut self, e: TExprId) -> Result<(), Diagnostic> {
        let p = &self.f.p;
        match p.expr(e) {
            TExpr::Load(t, idx) => self.access(*t, idx, Some(e)),
            TExpr::Select(c, a, b) => {
                let (c, a, b) = (*c, *a, *b);
                self.expr(c)?;
                for (side, value) in [(a, true), (b, false)] {
                    let (n_facts, saved) = (self.facts.len(), self.vars.clone());
                    self.assume(c, value);
                    let r = self.expr(side);
                    self.facts.truncate(n_facts);
                    self.vars = saved;
                    r?;
                }
                Ok(())
            }
            TExpr::Binary(BinOp::And | BinOp::Or, a, b) => {
                // The right operand runs only when the left allows it.
                let (a, b, and) = (*a, *b, matches!(p.expr(e), TExpr::Binary(BinOp::And, ..)));
                self.expr(a)?;
                let (n_facts, saved) = (self.facts.len(), self.vars.clone());
                self.assume(a, and);
                let r = self.expr(b);
                self.facts.truncate(n_facts);
                self.vars = saved;
                r
            }
            _ => {
                for c in p.children(e) {
                    self.expr(c)?;
                }
                Ok(())
            }
        }
    }

    fn access(&mut self, t: TensorId, idx: &[TExprId], load: Option<TExprId>) -> Result<(), Diagnostic> {
        let d = self.f.p.tensor(t);
        if let Some(l) = load {
            if d.role == texc_compiler::tir::TensorRole::Temp && !self.written[t.0 as usize] {
                return Err(Diagnostic::at(
                    self.f.p.span(l),
                    format!("`{}` is read before any statement above stores to it", d.name),
                ));
            }
        }
        for (k, &i) in idx.iter().enumerate() {
            self.expr(i)?;
            let iv = self.interval(i);
            let size = d.shape[k] as i128;
            let inside = matches!((iv.lo, iv.hi), (Some(lo), Some(hi)) if lo >= 0 && hi < size);
            if !inside {
                let show = |b: Option<i128>| b.map_or("?".to_string(), |v| v.to_string());
                let span = self.f.p.span(i);
                let what = if load.is_some() { "read" } else { "write" };
                return Err(Diagnostic::at(
                    span,
                    format!(
                        "cannot prove this {what} of `{}` in bounds: index {k} ranges over {}..={}, but the dimension has size {size}",
                        d.name,
                        show(iv.lo),
                        show(iv.hi)
                    ),
                )
                .with_note(
                    "a loop nest read from text must keep every access inside its tensor; guard it with `if` or `select`",
                ));
            }
        }
        Ok(())
    }

    /// A prefetch's element stays within its tensor's elements (it reads no
    /// value, so an unwritten temporary is no error).
    fn prefetch(&mut self, t: TensorId, offset: TExprId) -> Result<(), Diagnostic> {
        self.expr(offset)?;
        let d = self.f.p.tensor(t);
        let iv = self.interval(offset);
        if matches!((iv.lo, iv.hi), (Some(lo), Some(hi)) if lo >= 0 && hi < d.len() as i128) {
            return Ok(());
        }
        let show = |b: Option<i128>| b.map_or("?".to_string(), |v| v.to_string());
        Err(Diagnostic::at(
            self.f.p.span(offset),
            format!(
                "cannot prove this prefetch of `{}` in bounds: its element ranges over {}..={}, but the tensor has {} elements",
                d.name,
                show(iv.lo),
                show(iv.hi),
                d.len()
            ),
        ))
    }

    /// A tile of `rows` × `cols` elements at `t.origin`: read before any
    /// statement above writes it (a temporary), or leaving its tensor.
    fn tile(&mut self, t: &Tile, rows: i64, cols: i64) -> Result<(), Diagnostic> {
        self.boxed(t.tensor, &t.origin, &tile_reach(t, rows, cols), "mma")
    }

    /// The elements from `origin` to `origin + reach` of `tensor`, which
    /// operation `what` touches, in bounds (and written before, if a temporary).
    fn boxed(&mut self, tensor: TensorId, origin: &[TExprId], reach: &[i64], what: &str) -> Result<(), Diagnostic> {
        let d = self.f.p.tensor(tensor);
        let at = origin.first().map_or_else(Default::default, |&i| self.f.p.span(i));
        if d.role == texc_compiler::tir::TensorRole::Temp && !self.written[tensor.0 as usize] {
            return Err(Diagnostic::at(at, format!("`{}` is read before any statement above stores to it", d.name)));
        }
        for (k, &i) in origin.iter().enumerate() {
            self.expr(i)?;
            let iv = self.interval(i);
            let ext = reach.get(k).copied().unwrap_or(0) as i128;
            let size = d.shape[k] as i128;
            if !matches!((iv.lo, iv.hi), (Some(lo), Some(hi)) if lo >= 0 && hi + ext < size) {
                return Err(Diagnostic::at(
                    self.f.p.span(i),
                    format!(
                        "cannot prove the `{what}` tile of `{}` in bounds along dimension {k} (size {size})",
                        d.name
                    ),
                ));
            }
        }
        Ok(())
    }

    fn interval(&self, e: TExprId) -> Iv {
        let p = &self.f.p;
        let var = |v: VarId| self.vars[v as usize].unwrap_or(ANY);
        let iv = within_type(crate::interval::node(p, e, &var, &mut |c| self.interval(c)), p.ty(e));
        self.sharpen(e, iv)
    }

    /// Narrow `iv` by the facts whose form is `e`'s up to a constant, and by
    /// the interval of `e`'s affine form (where equal terms have cancelled:
    /// `i + j - j`).
    fn sharpen(&self, e: TExprId, mut iv: Iv) -> Iv {
        let mut terms = Vec::new();
        if let Some(form) = form_with_terms(&self.f.p, e, &mut terms) {
            let mut sum = exact(form.c);
            for (atom, k) in &form.terms {
                let part = match atom {
                    Atom::Var(v) => self.vars[*v as usize].unwrap_or(ANY),
                    // An opaque term is never `e` itself unless `e` is not affine at all.
                    Atom::Term(key) => match terms.iter().find(|(t, _)| t == key) {
                        Some(&(_, x)) if x != e => self.interval(x),
                        _ => ANY,
                    },
                };
                sum = sum.add(part.mul(exact(*k)));
            }
            iv = iv.meet(within_type(sum, self.f.p.ty(e)));
        }
        let Some(form) = form_of(&self.f.p, e) else { return iv };
        let c = form.c;
        let terms = Affine { terms: form.terms.clone(), c: 0 };
        for fact in &self.facts {
            if fact.form == terms {
                iv = iv.meet(fact.iv.add(exact(c)));
            } else if fact.form.clone().scale(-1).is_some_and(|n| n == terms) {
                iv = iv.meet(fact.iv.neg().add(exact(c)));
            }
        }
        iv
    }

    /// Record what `cond == value` says about affine forms of the loop variables.
    fn assume(&mut self, cond: TExprId, value: bool) {
        let p = &self.f.p;
        match (p.expr(cond), value) {
            (TExpr::Binary(BinOp::And, a, b), true) | (TExpr::Binary(BinOp::Or, a, b), false) => {
                let (a, b) = (*a, *b);
                self.assume(a, value);
                self.assume(b, value);
            }
            (TExpr::Unary(UnOp::Not, a), v) => {
                let a = *a;
                self.assume(a, !v)
            }
            (TExpr::Binary(op, a, b), v) if op.is_comparison() => {
                // A side whose value may have wrapped is not its affine form.
                let bounded = |x: TExprId| {
                    let iv = self.interval(x);
                    iv.lo.is_some() && iv.hi.is_some()
                };
                if !bounded(*a) || !bounded(*b) {
                    return;
                }
                let (Some(x), Some(y)) = (form_of(p, *a), form_of(p, *b)) else { return };
                let Some(diff) = x.add(&y, -1) else { return };
                // diff = terms + c; the comparison bounds `diff` against 0.
                let op = if v { *op } else { op.negated().expect("a comparison") };
                let iv = match op {
                    BinOp::Lt => Iv { lo: None, hi: Some(-1) },
                    BinOp::Le => Iv { lo: None, hi: Some(0) },
                    BinOp::Gt => Iv { lo: Some(1), hi: None },
                    BinOp::Ge => Iv { lo: Some(0), hi: None },
                    BinOp::Eq => exact(0),
                    _ => return,
                };
                let c = diff.c;
                let form = Affine { terms: diff.terms, c: 0 };
                let iv = iv.add(exact(-c));
                if let [(Atom::Var(v), 1)] = form.terms.iter().map(|(a, k)| (a.clone(), *k)).collect::<Vec<_>>()[..] {
                    if let Some(r) = self.vars[v as usize] {
                        self.vars[v as usize] = Some(r.meet(iv));
                    }
                }
                self.facts.push(Fact { form, iv });
            }
            _ => {}
        }
    }
}

/// How far past its origin a tile of `rows` × `cols` reaches in each dimension.
fn tile_reach(t: &Tile, rows: i64, cols: i64) -> Vec<i64> {
    let mut reach = vec![0; t.origin.len()];
    reach[t.rows] += rows - 1;
    reach[t.cols] += cols - 1;
    reach
}
