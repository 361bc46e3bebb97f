//! Index arithmetic on loop IR expressions.
//!
//! Attached buffers are indexed relative to their box (`i - lo`) and, with a
//! `cache_read` layout, through `/` and `%` by constants. Written naively,
//! those indices hide that an access is contiguous in the vectorized loop
//! (the code generator then gathers). Here indices are put in linear form
//! over loop variables (anything else is an opaque term, keyed by its
//! structure so that equal terms cancel), differences are simplified, and
//! `t / c`, `t % c` become `X`, `Y` when `t = c·X + Y` with `Y` provably in
//! `[0, c)`. Loop variables range over `[0, extent)`: every loop starts at 0
//! or later.

use crate::ir::LoopFunc;
use std::collections::BTreeMap;
use texc_compiler::tir::{TExpr, TExprId, Ty};
use texc_grammar::ast::{BinOp, UnOp};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Var(u32),
    Opaque(String),
}

#[derive(Clone, Debug, Default)]
struct Lin {
    terms: BTreeMap<Key, (i64, TExprId)>,
    c: i64,
}

impl Lin {
    fn add(mut self, o: &Lin, sign: i64) -> Lin {
        for (k, (coef, e)) in &o.terms {
            self.terms.entry(k.clone()).or_insert((0, *e)).0 += sign * coef;
        }
        self.terms.retain(|_, (c, _)| *c != 0);
        self.c += sign * o.c;
        self
    }

    fn scale(mut self, k: i64) -> Lin {
        self.terms.values_mut().for_each(|(c, _)| *c *= k);
        self.terms.retain(|_, (c, _)| *c != 0);
        self.c *= k;
        self
    }

    fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.c)
    }
}

fn key(f: &LoopFunc, e: TExprId) -> String {
    let kids: Vec<String> = f.p.children(e).into_iter().map(|c| key(f, c)).collect();
    let head = match f.p.expr(e) {
        TExpr::Int(k) => format!("{k}"),
        TExpr::Var(v) => format!("v{v}"),
        TExpr::Scalar(s) => format!("s{s}"),
        TExpr::Load(t, _) => format!("L{}", t.0),
        TExpr::Unary(op, _) => format!("{op:?}"),
        TExpr::Binary(op, ..) => format!("{op:?}"),
        TExpr::Call(b, _) => format!("{b:?}"),
        other => format!("{other:?}"),
    };
    format!("{head}({})", kids.join(","))
}

fn lin(f: &LoopFunc, e: TExprId) -> Lin {
    let opaque = || Lin { terms: BTreeMap::from([(Key::Opaque(key(f, e)), (1, e))]), c: 0 };
    match f.p.expr(e) {
        TExpr::Int(k) => Lin { c: *k, ..Lin::default() },
        TExpr::Var(v) => Lin { terms: BTreeMap::from([(Key::Var(*v), (1, e))]), c: 0 },
        TExpr::Unary(UnOp::Neg, a) => lin(f, *a).scale(-1),
        TExpr::Binary(BinOp::Add, a, b) => lin(f, *a).add(&lin(f, *b), 1),
        TExpr::Binary(BinOp::Sub, a, b) => lin(f, *a).add(&lin(f, *b), -1),
        TExpr::Binary(BinOp::Mul, a, b) => {
            let (x, y) = (lin(f, *a), lin(f, *b));
            match (x.as_const(), y.as_const()) {
                (Some(k), _) => y.scale(k),
                (_, Some(k)) => x.scale(k),
                _ => opaque(),
            }
        }
        _ => opaque(),
    }
}

/// The range of a linear form, if every term is a loop variable.
fn range(f: &LoopFunc, l: &Lin) -> Option<(i64, i64)> {
    let mut r = (l.c, l.c);
    for (k, (coef, _)) in &l.terms {
        let Key::Var(v) = k else { return None };
        let hi = (f.vars[*v as usize].extent - 1).max(0);
        r.0 += (coef * hi).min(0);
        r.1 += (coef * hi).max(0);
    }
    Some(r)
}

fn int(f: &mut LoopFunc, k: i64) -> TExprId {
    f.p.alloc(TExpr::Int(k), Ty::Index, Default::default())
}

fn bin(f: &mut LoopFunc, op: BinOp, a: TExprId, b: TExprId) -> TExprId {
    f.p.alloc(TExpr::Binary(op, a, b), Ty::Index, Default::default())
}

fn build(f: &mut LoopFunc, l: &Lin) -> TExprId {
    let mut acc: Option<TExprId> = None;
    for (coef, e) in l.terms.values() {
        let term = if *coef == 1 {
            *e
        } else {
            let k = int(f, *coef);
            bin(f, BinOp::Mul, *e, k)
        };
        acc = Some(match acc {
            Some(a) => bin(f, BinOp::Add, a, term),
            None => term,
        });
    }
    match acc {
        None => int(f, l.c),
        Some(a) if l.c == 0 => a,
        Some(a) => {
            let k = int(f, l.c);
            bin(f, BinOp::Add, a, k)
        }
    }
}

/// `a - b`, simplified.
pub fn sub(f: &mut LoopFunc, a: TExprId, b: TExprId) -> TExprId {
    let l = lin(f, a).add(&lin(f, b), -1);
    build(f, &l)
}

/// `e`, simplified.
pub fn simplify(f: &mut LoopFunc, e: TExprId) -> TExprId {
    let l = lin(f, e);
    build(f, &l)
}

/// `(t / c, t % c)` for `t ≥ 0` and `c ≥ 1`, free of `/` and `%` where `t`
/// splits into `c·X + Y` with `Y` in `[0, c)`.
pub fn div_mod(f: &mut LoopFunc, t: TExprId, c: i64) -> (TExprId, TExprId) {
    let l = lin(f, t);
    let (mut x, mut y) = (Lin::default(), Lin::default());
    for (k, (coef, e)) in &l.terms {
        let (part, coef) = if coef % c == 0 { (&mut x, coef / c) } else { (&mut y, *coef) };
        part.terms.insert(k.clone(), (coef, *e));
    }
    x.c = l.c.div_euclid(c);
    y.c = l.c.rem_euclid(c);
    match range(f, &y) {
        Some((lo, hi)) if lo >= 0 && hi < c => (build(f, &x), build(f, &y)),
        _ => {
            let k = int(f, c);
            (bin(f, BinOp::Div, t, k), bin(f, BinOp::Rem, t, k))
        }
    }
}
