//! Bounds checking: proves that every load of a stage stays inside its tensor.
//!
//! Index expressions are put in linear form over variables and opaque
//! non-linear sub-terms (`/`, `%`, products of variables), whose ranges come
//! from interval arithmetic. Inside `select(c, a, b)`, the comparisons of `c`
//! (for `a`) or of its negation (for `b`) become linear facts `L >= 0` that
//! tighten variable ranges and bound any index `I` through `I = L + (I - L)`.
//! The right operand of `&&` (`||`) is likewise checked under its left
//! operand (its negation), matching the short-circuit evaluation that every
//! backend must preserve. This accepts the padding idiom `select(y >= pad && y < H + pad, X[y - pad], 0)`
//! and its variants. All arithmetic is in i128, so no input can overflow it.

use crate::affine::{affine_of, Affine};
use crate::ops::{BinOp, UnOp};
use crate::tir::*;
use texc_grammar::Diagnostic;

type Iv = (i128, i128);

/// A term of a linear form. Opaque terms are keyed by their structure, so
/// that the same sub-expression written twice (in a guard and in an index)
/// cancels out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Atom {
    Var(VarId),
    Opaque(String),
}

type Lin = Affine<Atom>;

fn clamp_big(x: i128) -> i128 {
    // Keep intervals far from i128 overflow: sizes are < 2^63, products of two < 2^126.
    x.clamp(-(1 << 100), 1 << 100)
}

fn floor_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

struct Checker<'a> {
    p: &'a Program,
    stage: &'a Stage,
    /// An expression for each opaque key.
    opaque: std::cell::RefCell<std::collections::HashMap<String, TExprId>>,
}

impl Checker<'_> {
    fn key(&self, e: TExprId) -> String {
        let kids: Vec<String> = self.p.children(e).into_iter().map(|c| self.key(c)).collect();
        let head = match self.p.expr(e) {
            TExpr::Int(v) => format!("{v}"),
            TExpr::Var(v) => format!("v{v}"),
            TExpr::Binary(op, _, _) => op.symbol().to_string(),
            TExpr::Unary(op, _) => format!("{op:?}"),
            other => format!("{:?}", std::mem::discriminant(other)),
        };
        format!("({head} {})", kids.join(" "))
    }

    fn opaque_atom(&self, e: TExprId) -> Lin {
        let k = self.key(e);
        self.opaque.borrow_mut().entry(k.clone()).or_insert(e);
        Lin::atom(Atom::Opaque(k))
    }

    /// The linear form of `e`; anything that is not (or overflows) is an opaque atom.
    fn lin(&self, e: TExprId) -> Lin {
        let form = affine_of(self.p, e, &mut |x| match self.p.expr(x) {
            TExpr::Var(v) => Some(Lin::atom(Atom::Var(*v))),
            _ => Some(self.opaque_atom(x)),
        });
        form.unwrap_or_else(|| self.opaque_atom(e))
    }

    fn interval(&self, l: &Lin, env: &[Iv]) -> Result<Iv, String> {
        let (mut lo, mut hi) = (l.c, l.c);
        for (a, &k) in &l.terms {
            let (alo, ahi) = match a {
                Atom::Var(v) => env[*v as usize],
                Atom::Opaque(k) => {
                    let e = self.opaque.borrow()[k];
                    self.opaque(e, env)?
                }
            };
            let (x, y) = (clamp_big(k).saturating_mul(alo), clamp_big(k).saturating_mul(ahi));
            lo = clamp_big(lo.saturating_add(x.min(y)));
            hi = clamp_big(hi.saturating_add(x.max(y)));
        }
        Ok((lo, hi))
    }

    fn opaque(&self, e: TExprId, env: &[Iv]) -> Result<Iv, String> {
        let iv = |x: TExprId| self.interval(&self.lin(x), env);
        match self.p.expr(e) {
            TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) => {
                let (alo, ahi) = iv(*a)?;
                let (blo, bhi) = iv(*b)?;
                if blo <= 0 && bhi >= 0 {
                    return Err("this index divides by a value that can be zero".into());
                }
                if *op == BinOp::FloorDiv {
                    let c = [floor_div(alo, blo), floor_div(alo, bhi), floor_div(ahi, blo), floor_div(ahi, bhi)];
                    return Ok((*c.iter().min().expect("4"), *c.iter().max().expect("4")));
                }
                if blo == bhi && floor_div(alo, blo) == floor_div(ahi, blo) {
                    let m = |x: i128| x - blo * floor_div(x, blo);
                    return Ok((m(alo), m(ahi)));
                }
                Ok(if blo > 0 { (0, bhi - 1) } else { (blo + 1, 0) })
            }
            TExpr::Binary(BinOp::Mul, a, b) => {
                let (alo, ahi) = iv(*a)?;
                let (blo, bhi) = iv(*b)?;
                let c = [
                    alo.saturating_mul(blo),
                    alo.saturating_mul(bhi),
                    ahi.saturating_mul(blo),
                    ahi.saturating_mul(bhi),
                ]
                .map(clamp_big);
                Ok((*c.iter().min().expect("4"), *c.iter().max().expect("4")))
            }
            _ => Err("this index is not integer arithmetic".into()),
        }
    }

    /// Linear facts `L >= 0` that hold when `cond` is `positive`.
    fn facts(&self, cond: TExprId, positive: bool, out: &mut Vec<Lin>) {
        match self.p.expr(cond) {
            TExpr::Unary(UnOp::Not, c) => self.facts(*c, !positive, out),
            TExpr::Binary(BinOp::And, a, b) if positive => {
                self.facts(*a, true, out);
                self.facts(*b, true, out);
            }
            TExpr::Binary(BinOp::Or, a, b) if !positive => {
                self.facts(*a, false, out);
                self.facts(*b, false, out);
            }
            TExpr::Binary(op, a, b) if op.is_comparison() && self.p.ty(*a) == Ty::Index => {
                let (la, lb) = (self.lin(*a), self.lin(*b));
                let op = if positive { *op } else { op.negated().expect("a comparison") };
                let one = Lin::constant(1);
                let facts = match op {
                    BinOp::Lt => vec![lb.add(&la, -1).and_then(|d| d.add(&one, -1))],
                    BinOp::Le => vec![lb.add(&la, -1)],
                    BinOp::Gt => vec![la.add(&lb, -1).and_then(|d| d.add(&one, -1))],
                    BinOp::Ge => vec![la.add(&lb, -1)],
                    BinOp::Eq => vec![la.clone().add(&lb, -1), lb.add(&la, -1)],
                    _ => vec![],
                };
                // A fact whose arithmetic overflows is dropped: facts only tighten ranges.
                out.extend(facts.into_iter().flatten());
            }
            _ => {}
        }
    }

    /// Narrow variable ranges with single-variable facts; `None` if empty.
    fn narrow(&self, env: &[Iv], facts: &[Lin]) -> Option<Vec<Iv>> {
        let mut env = env.to_vec();
        for f in facts {
            if let Some(k) = f.as_const() {
                if k < 0 {
                    return None;
                }
                continue;
            }
            if f.terms.len() != 1 {
                continue;
            }
            let (atom, &a) = f.terms.iter().next().expect("one term");
            let &Atom::Var(v) = atom else { continue };
            let iv = &mut env[v as usize];
            if a > 0 {
                iv.0 = iv.0.max(-floor_div(f.c, a));
            } else {
                iv.1 = iv.1.min(floor_div(f.c, -a));
            }
            if iv.0 > iv.1 {
                return None;
            }
        }
        Some(env)
    }

    fn walk(&self, e: TExprId, env: &[Iv], facts: &[Lin]) -> Result<(), Diagnostic> {
        match self.p.expr(e) {
            TExpr::Load(t, idx) => {
                for (d, &i) in idx.iter().enumerate() {
                    self.check_index(*t, d, i, env, facts)?;
                }
                Ok(())
            }
            TExpr::Select(c, a, b) => {
                self.walk(*c, env, facts)?;
                for (branch, positive) in [(*a, true), (*b, false)] {
                    let mut f = facts.to_vec();
                    self.facts(*c, positive, &mut f);
                    if let Some(env2) = self.narrow(env, &f) {
                        self.walk(branch, &env2, &f)?;
                    }
                }
                Ok(())
            }
            // `a && b` reads `b` only when `a` holds (`a || b`: when it fails).
            TExpr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
                self.walk(*a, env, facts)?;
                let mut f = facts.to_vec();
                self.facts(*a, *op == BinOp::And, &mut f);
                match self.narrow(env, &f) {
                    Some(env2) => self.walk(*b, &env2, &f),
                    None => Ok(()),
                }
            }
            TExpr::Reduce(_, vars, body) => {
                if vars.iter().any(|&v| self.stage.vars[v as usize].extent == 0) {
                    return Ok(());
                }
                self.walk(*body, env, facts)
            }
            _ => {
                for c in self.p.children(e) {
                    self.walk(c, env, facts)?;
                }
                Ok(())
            }
        }
    }

    fn check_index(&self, t: TensorId, d: usize, i: TExprId, env: &[Iv], facts: &[Lin]) -> Result<(), Diagnostic> {
        let tensor = self.p.tensor(t);
        let size = tensor.shape[d] as i128;
        let l = self.lin(i);
        let (mut lo, mut hi) = self.interval(&l, env).map_err(|m| Diagnostic::at(self.p.span(i), m))?;
        for f in facts {
            if let Some(Ok((x, _))) = l.clone().add(f, -1).map(|d| self.interval(&d, env)) {
                lo = lo.max(x);
            }
            if let Some(Ok((_, y))) = l.clone().add(f, 1).map(|d| self.interval(&d, env)) {
                hi = hi.min(y);
            }
        }
        if lo >= 0 && hi < size {
            return Ok(());
        }
        Err(Diagnostic::at(
            self.p.span(i),
            format!("index out of bounds: dimension {d} of `{}` has size {size}, but this index ranges over {lo}..={hi}", tensor.name),
        )
        .with_note("an access outside a tensor is only allowed in the true branch of a `select` whose condition rules it out (padding)"))
    }
}

/// Check every load of stage `si` (in the context of all its variables' ranges).
pub fn check_stage(p: &Program, si: usize) -> Result<(), Diagnostic> {
    let stage = &p.stages[si];
    if stage.vars[..stage.n_axes].iter().any(|v| v.extent == 0) {
        return Ok(());
    }
    let env: Vec<Iv> = stage.vars.iter().map(|v| (0, v.extent as i128 - 1)).collect();
    Checker { p, stage, opaque: Default::default() }.walk(stage.value, &env, &[])
}
