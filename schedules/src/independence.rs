//! Independence of concurrent iterations: the proof that two iterations of
//! a `parallel` or `vectorized` loop, or two threads or blocks of a GPU
//! launch, never touch one element where one of them writes it. Code
//! generators run such iterations at once (tasks of the thread pool, the
//! lanes of a vector, a GPU's threads); the loop-IR evaluator runs them one
//! after another. The two agree when this proof holds.
//!
//! **Parties and ids.** The two *parties* are distinct values of one or
//! more *ids*: the parallel loop's variable; a GPU thread's and block's
//! coordinates. Every loop variable has a role: an id plus a constant
//! offset (a GPU thread loop `for t in 4..68 thread.x` is `t = 4 + τx`);
//! *free*, when each party may be at any value of its range at the moment
//! the other accesses memory (a loop inside the concurrent one); or
//! *common*, the same value for both (a loop around it).
//!
//! **Forms.** Indices are read as affine forms over the digits of ids
//! and loop variables, as [`crate::digits`] reads them: so a fused loop's
//! `t[f / W, f % W]` is `f`'s two digits, and a guard `if w % 32 == 0`
//! fixes `w`'s lowest digit.
//!
//! **The proof** separates the ids' digits one at a time: a digit `v` is
//! *separated* when, for every pair of parties that agree on the digits
//! separated before it and differ in `v`, the accesses of one and of the
//! other touch distinct elements. Parties that differ at all then differ
//! first in some digit, which separates them. A digit is separated by a
//! *window*: one dimension of the tensor, or the flat offset within a run
//! of dimensions, read in every access as `c·v + K + F + M·B`, where
//! - `c`, the coefficient of `v`, is the same non-zero constant everywhere
//!   (an access that only one value of `v` makes may take any `c`);
//! - `K`, the terms over common digits and separated ones, is the same form
//!   everywhere (equal for the two parties, so it cancels);
//! - `F`, the rest but `M·B`, bounded by the ranges of its digits and
//!   terms, spans less than `|c|` over all accesses together (with the
//!   elements a tensor-core tile reaches past its origin);
//! - `M·B`, terms whose coefficients are multiples of `M` (none, or `M`
//!   more than the span of `c·v + F` over all accesses).
//!
//! Equal offsets then give `c·(v − v') + F − F' ≡ 0 (mod M)`, with
//! `|c·v + F − c·v' − F'| < M`, so `c·(v − v') = F' − F`, less than `|c|`
//! in magnitude: `v = v'`. Guards only remove accesses beyond what the
//! facts say, so the proof ignores them otherwise. An index it cannot read
//! (a gather through loaded data) separates nothing.

use crate::digits::{div_or_mod, Atom, Fact, Forms, Site, Src};
pub use crate::digits::{Env as Parties, LoopRanges, Role};
use crate::interval::{self, Iv};
use crate::ir::{ForKind, LoopFunc, Stmt, Tile};
use std::collections::{BTreeMap, BTreeSet};
use texc_compiler::affine::Affine;
use texc_compiler::tir::{TExpr, TExprId, TensorId, VarId};

/// One access to memory: a load or store at `indices`, or a tensor-core
/// tile whose elements reach `reach[d]` past its origin along dimension
/// `d`; made only where every condition of `guards` holds, and (for each
/// listed id) only by parties whose id lies in the range given.
#[derive(Clone, Debug)]
pub struct Access {
    pub tensor: TensorId,
    pub indices: Vec<TExprId>,
    pub reach: Vec<i64>,
    pub write: bool,
    pub guards: Vec<TExprId>,
    pub within: Vec<(usize, Iv)>,
}

impl Access {
    fn site(&self) -> Site<'_> {
        Site { indices: &self.indices, guards: &self.guards, within: &self.within }
    }

    pub fn element(tensor: TensorId, indices: &[TExprId], write: bool) -> Access {
        let reach = vec![0; indices.len()];
        Access { tensor, indices: indices.to_vec(), reach, write, guards: Vec::new(), within: Vec::new() }
    }

    pub fn tile(t: &Tile, rows: i64, cols: i64, write: bool) -> Access {
        let mut a = Access::element(t.tensor, &t.origin, write);
        a.reach[t.rows] += rows - 1;
        a.reach[t.cols] += cols - 1;
        a
    }
}

/// One access's form over a window, for one digit `v`: `c·v + common +
/// free + constant`.
struct Window {
    /// `None`: the access is made at one value of `v` only (folded into the constant).
    c: Option<i128>,
    /// The range of `v` in this access.
    v: Iv,
    /// The atom of `v`.
    target: Atom,
    common: BTreeMap<Atom, i128>,
    /// The other terms with their ranges; `None` stands for the elements a
    /// tile reaches past its origin.
    free: Vec<(Option<Atom>, i128, Iv)>,
    constant: i128,
    /// The window is the dividend of a padded pair of this shape ([`Parties::decode`]).
    code: Option<Code>,
    /// What holds where the access is made (sums of terms in a range).
    facts: Vec<Fact>,
}

/// The shape of a padded pair `α·(e / c) + β·(e % c) + constant`, with
/// the values its quotient `q` and remainder `r` take in the access.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Code {
    alpha: i128,
    beta: i128,
    c: i128,
    constant: i128,
    q: Iv,
    r: Iv,
}

impl Code {
    /// Whether this pair and `o` have one shape and `(q, r) ↦ α·q + β·r`
    /// is one to one over the values both take: one coefficient more than
    /// the other's span (rows of `α` padded, or columns of `β` transposed).
    fn one_to_one(&self, o: &Code) -> bool {
        let shape = |x: &Code| (x.alpha, x.beta, x.c, x.constant);
        let (q, r) = (self.q.union(o.q).width(), self.r.union(o.r).width());
        let (a, b) = (self.alpha.abs(), self.beta.abs());
        shape(self) == shape(o) && (r.is_some_and(|r| a > b * r) || q.is_some_and(|q| b > a * q))
    }
}

/// One side of `X = X'`: `Σ k·t + constant`, where the term `is_v` is the
/// digit to separate, each term in its range.
#[derive(Clone)]
struct Side<'w> {
    terms: Vec<Term<'w>>,
    constant: i128,
    facts: &'w [Fact],
}

#[derive(Clone)]
struct Term<'w> {
    atom: Option<&'w Atom>,
    k: i128,
    iv: Iv,
    is_v: bool,
}

impl Side<'_> {
    /// The values of `terms` plus `constant`, narrowed by a fact about
    /// exactly those terms.
    fn values(&self, terms: &[Term], constant: i128) -> Iv {
        let sum = terms.iter().fold(interval::exact(constant), |s, t| s.add(t.iv.mul(interval::exact(t.k))));
        let keyed: Option<BTreeMap<&Atom, i128>> = terms.iter().map(|t| Some((t.atom?, t.k))).collect();
        let Some(keyed) = keyed.filter(|m| !m.is_empty()) else { return sum };
        self.facts.iter().fold(sum, |iv, fact| {
            let same = fact.terms.len() == keyed.len() && fact.terms.iter().all(|(a, k)| keyed.get(a) == Some(k));
            if same {
                iv.meet(fact.iv.add(interval::exact(constant)))
            } else {
                iv
            }
        })
    }
}

impl Parties {
    /// The first id that the accesses, all to one tensor, do not separate;
    /// `None` when two parties never touch one element where either writes
    /// (or when nothing writes).
    pub fn unseparated(&self, f: &LoopFunc, accesses: &[&Access]) -> Option<usize> {
        if !accesses.iter().any(|a| a.write) {
            return None;
        }
        let mut forms = Forms::new(f, self);
        for id in 0..self.ids.len() {
            if forms.radix(Src::Id(id)).is_none() {
                // An id of unknown range: nothing separates it.
                return Some(id);
            }
        }
        let sites: Vec<Site> = accesses.iter().map(|a| a.site()).collect();
        forms.settle(&sites);
        let facts: Vec<Vec<Fact>> = sites.iter().map(|s| forms.facts_of(s)).collect();
        let mut digits = Vec::new();
        for id in 0..self.ids.len() {
            let ds: Vec<(i128, i128)> = forms.radix.get(&Src::Id(id)).map(|r| r.digits().collect()).unwrap_or_default();
            digits.extend(ds.into_iter().filter(|&(_, size)| size > 1).map(|(w, _)| (id, w)));
        }
        let mut done: BTreeSet<(usize, i128)> = BTreeSet::new();
        loop {
            let left: Vec<(usize, i128)> = digits.iter().filter(|d| !done.contains(*d)).copied().collect();
            let first = *left.first()?;
            let found = left.into_iter().find(|&d| self.separates(&mut forms, accesses, &facts, d, &done));
            match found {
                Some(d) => done.insert(d),
                None => return Some(first.0),
            };
        }
    }

    /// Whether digit `v` is separated once the digits `done` are: every
    /// two accesses that two such parties may make, one of them a write,
    /// have a window that keeps them apart. (Accesses made only where a
    /// separated digit takes different values are never made by two
    /// parties that agree on it.)
    fn separates(
        &self,
        forms: &mut Forms,
        accesses: &[&Access],
        facts: &[Vec<Fact>],
        v: (usize, i128),
        done: &BTreeSet<(usize, i128)>,
    ) -> bool {
        let rank = forms.f.p.tensor(accesses[0].tensor).shape.len();
        // Runs of dimensions, and the empty run (a rank-0 tensor; accesses at one value of `v`).
        let windows: Vec<Vec<Option<Window>>> = (0..rank)
            .flat_map(|a| (a + 1..=rank).map(move |b| a..b))
            .chain(std::iter::once(0..0))
            .map(|dims| {
                accesses.iter().zip(facts).map(|(a, fa)| self.window(forms, a, fa, dims.clone(), v, done)).collect()
            })
            .collect();
        let ranges: Vec<Vec<Iv>> = facts
            .iter()
            .map(|fa| {
                forms.facts = fa.clone();
                done.iter().map(|&(id, w)| forms.digit_range(&Atom::Digit(Src::Id(id), w))).collect()
            })
            .collect();
        let meet = |i: usize, j: usize| {
            ranges[i].iter().zip(&ranges[j]).all(|(x, y)| {
                let m = x.meet(*y);
                !matches!((m.lo, m.hi), (Some(lo), Some(hi)) if lo > hi)
            })
        };
        let n = accesses.len();
        (0..n).all(|i| {
            (i..n)
                .filter(|&j| (accesses[i].write || accesses[j].write) && meet(i, j))
                .all(|j| windows.iter().any(|ws| matches!((&ws[i], &ws[j]), (Some(a), Some(b)) if disjoint(a, b))))
        })
    }

    /// The form of access `a` over the dimensions `dims`, split for digit `v`.
    fn window(
        &self,
        forms: &mut Forms,
        a: &Access,
        facts: &[Fact],
        dims: std::ops::Range<usize>,
        v: (usize, i128),
        done: &BTreeSet<(usize, i128)>,
    ) -> Option<Window> {
        let shape = &forms.f.p.tensor(a.tensor).shape;
        let target = Atom::Digit(Src::Id(v.0), v.1);
        forms.facts = facts.to_vec();
        let mut flat: Affine<Atom> = Affine::constant(0);
        let mut reach = 0i128;
        let mut stride = 1i128;
        for d in dims.rev() {
            flat = flat.add(&forms.form(a.indices[d])?, stride)?;
            reach = reach.checked_add(stride.checked_mul(a.reach[d] as i128)?)?;
            stride = stride.checked_mul(shape[d] as i128)?;
        }
        forms.merge_pairs(&mut flat)?;
        let code = if reach == 0 { self.decode(forms, &mut flat, done) } else { None };
        let range = forms.digit_range(&target);
        // Terms of one value are constants, in the facts as in the form.
        let facts = facts
            .iter()
            .map(|fact| {
                let mut fact = fact.clone();
                for (atom, k) in std::mem::take(&mut fact.terms) {
                    match forms.digit_range(&atom) {
                        Iv { lo: Some(lo), hi: Some(hi) } if lo == hi && matches!(atom, Atom::Digit(..)) => {
                            fact.iv = fact.iv.add(interval::exact(-k * lo))
                        }
                        _ => drop(fact.terms.insert(atom, k)),
                    }
                }
                fact
            })
            .collect();
        let mut w = Window {
            c: Some(0),
            v: range,
            target: target.clone(),
            common: BTreeMap::new(),
            free: Vec::new(),
            constant: flat.c,
            code,
            facts,
        };
        if reach > 0 {
            w.free.push((None, 1, interval::range(0, reach)));
        }
        for (atom, &k) in &flat.terms {
            if *atom == target {
                w.c = Some(k);
            } else if self.is_common(forms, atom, done) {
                w.common.insert(atom.clone(), k);
            } else {
                let iv = match atom {
                    Atom::Digit(..) => forms.digit_range(atom),
                    Atom::Opaque(_) => forms.opaque_interval(atom),
                };
                match (iv.lo, iv.hi) {
                    // A term of one value is a constant.
                    (Some(lo), Some(hi)) if lo == hi => w.constant = w.constant.checked_add(k.checked_mul(lo)?)?,
                    _ => w.free.push((Some(atom.clone()), k, iv)),
                }
            }
        }
        // Made at one value of `v` only: `c·v` is a constant, any `c` will do.
        if let (Some(lo), Some(hi)) = (range.lo, range.hi) {
            if lo == hi {
                w.constant = w.constant.checked_add(w.c.unwrap_or(0).checked_mul(lo)?)?;
                w.c = None;
            }
        }
        Some(w)
    }

    /// A padded pair: `α·(e / c) + β·(e % c) + K + k` where one of the
    /// quotient and the remainder moves the value less than a step of the
    /// other (a fused loop over rows padded to `c`, `Y[x / 30, x % 30]` for
    /// `x % 30 < 21`; a transposed one, `Y[x % 6, x / 6]`) and the rest is
    /// common. Equal values then mean equal `e`: `flat` becomes `e + K`, and
    /// the pair's shape is returned, for comparing with accesses of the
    /// same shape only.
    fn decode(&self, forms: &mut Forms, flat: &mut Affine<Atom>, done: &BTreeSet<(usize, i128)>) -> Option<Code> {
        let p = &forms.f.p;
        let opaque = |forms: &Forms, a: &Atom| match a {
            Atom::Opaque(k) => forms.opaques.get(k).and_then(|&x| div_or_mod(p, x)),
            Atom::Digit(..) => None,
        };
        let (div, alpha, (e, c)) = flat.terms.iter().find_map(|(a, &k)| match opaque(forms, a) {
            Some((e, c, true)) => Some((a.clone(), k, (e, c))),
            _ => None,
        })?;
        let inner = crate::analysis::structure(p, e);
        let (modulo, beta) = flat.terms.iter().find_map(|(a, &k)| match opaque(forms, a) {
            Some((e2, c2, false)) if c2 == c && crate::analysis::structure(p, e2) == inner => Some((a.clone(), k)),
            _ => None,
        })?;
        // `(q, r) ↦ α·q + β·r` is one to one where one coefficient is more
        // than the other's span (rows of `α` padded, or columns of `β` transposed).
        let values = |forms: &mut Forms, a: &Atom| forms.interval(&Affine::atom(a.clone()));
        let (q, r) = (values(forms, &div), values(forms, &modulo));
        let code = Code { alpha, beta, c, constant: 0, q, r };
        let fits = code.one_to_one(&code);
        let mut rest = flat.clone();
        rest.terms.remove(&div);
        rest.terms.remove(&modulo);
        if !fits || !rest.terms.keys().all(|a| self.is_common(forms, a, done)) {
            return None;
        }
        let code = Code { constant: rest.c, ..code };
        rest.c = 0;
        *flat = rest.add(&forms.form(e)?, 1)?;
        Some(code)
    }

    /// Whether `atom` has the same value for both parties, given that they
    /// agree on the digits `done`.
    fn is_common(&self, forms: &Forms, atom: &Atom, done: &BTreeSet<(usize, i128)>) -> bool {
        match atom {
            Atom::Digit(Src::Id(id), w) => done.contains(&(*id, *w)),
            Atom::Digit(Src::Var(x), _) => self.role(*x) == Role::Common,
            Atom::Opaque(key) => forms.opaque_expr(key).is_some_and(|e| !self.differs(forms, e, done)),
        }
    }

    /// Whether `e` may have different values for the two parties.
    fn differs(&self, forms: &Forms, e: TExprId, done: &BTreeSet<(usize, i128)>) -> bool {
        let p = &forms.f.p;
        match p.expr(e) {
            TExpr::Var(x) => match self.role(*x) {
                Role::Id { id, .. } => {
                    let all = forms.radix.get(&Src::Id(id)).map(|r| r.digits().collect::<Vec<_>>());
                    !all.is_some_and(|ds| ds.iter().all(|&(w, size)| size == 1 || done.contains(&(id, w))))
                }
                Role::Free => true,
                Role::Common => false,
            },
            // Other buffers may hold different values for the two parties
            // (a local of each, a block's shared one) or change meanwhile.
            TExpr::Load(t, _) if p.tensor(*t).role != texc_compiler::tir::TensorRole::Input => true,
            _ => p.children(e).into_iter().any(|c| self.differs(forms, c, done)),
        }
    }
}

/// Whether accesses `a` and `b`, made by two parties that differ in `v`
/// (and agree on the digits separated before it), touch distinct elements:
/// equal common parts, and the test of the module's header ([`decodes`]).
/// An access made at one value `r` of `v` only is `c·v + (G − c·r)` for its
/// other terms `G`, whatever `c`; where both are, parties with different
/// values of `v` make different accesses, and the values those reach apart
/// from `K` must not meet.
fn disjoint(a: &Window, b: &Window) -> bool {
    let codes = match (a.code, b.code) {
        (None, None) => true,
        (Some(x), Some(y)) => x.one_to_one(&y),
        _ => false,
    };
    if a.common != b.common || !codes {
        return false;
    }
    let c = match (a.c, b.c) {
        (None, None) => {
            let (x, y) = (side(a, 0), side(b, 0));
            let (x, y) = (x.values(&x.terms, x.constant), y.values(&y.terms, y.constant));
            let apart =
                matches!((x.hi, y.lo, y.hi, x.lo), (Some(xh), Some(yl), Some(yh), Some(xl)) if xh < yl || yh < xl);
            return a.v == b.v || apart;
        }
        (Some(k), None) | (None, Some(k)) => k,
        (Some(k), Some(l)) if k == l => k,
        _ => return false,
    };
    c != 0 && decodes([side(a, c), side(b, c)])
}

/// Window `w` as a side of an equation, `v` with coefficient `c` (an access
/// made at one value `r` of `v` only takes `c·v − c·r`).
fn side(w: &Window, c: i128) -> Side<'_> {
    let mut terms: Vec<Term> =
        w.free.iter().map(|(atom, k, iv)| Term { atom: atom.as_ref(), k: *k, iv: *iv, is_v: false }).collect();
    let mut constant = w.constant;
    if c != 0 {
        if w.c.is_none() {
            constant -= c * w.v.lo.unwrap_or(0);
        }
        terms.push(Term { atom: Some(&w.target), k: c, iv: w.v, is_v: true });
    }
    Side { terms, constant, facts: &w.facts }
}

/// Whether `X = X'` for the two sides means the same `v`: as a mixed radix,
/// read from a cut of the terms by the size of their coefficients. The
/// terms at or above the cut are multiples of `M`; where the rest stays
/// within `M` values on both sides (after the constants' multiples of `M`
/// move up), the equation holds for the rest and for the terms above over
/// `M` separately — so the side of the cut that has `v` decides, until `v`
/// stands alone: `c·v + k = c·v' + k'` with `|k − k'| < |c|` means `v = v'`.
fn decodes(sides: [Side; 2]) -> bool {
    let alone = |s: &Side| s.terms.iter().all(|t| t.is_v);
    if sides.iter().all(alone) {
        let c = |s: &Side| s.terms.iter().find(|t| t.is_v).map_or(0, |t| t.k);
        let (c0, c1) = (c(&sides[0]), c(&sides[1]));
        return c0 != 0 && c0 == c1 && (sides[0].constant - sides[1].constant).abs() < c0.abs();
    }
    let mut cuts: Vec<i128> = sides.iter().flat_map(|s| s.terms.iter().map(|t| t.k.abs())).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts.into_iter().any(|cut| decodes_at(&sides, cut))
}

/// [`decodes`] for the cut at coefficients of size `cut`.
fn decodes_at(sides: &[Side; 2], cut: i128) -> bool {
    let m = sides.iter().flat_map(|s| s.part(cut, true)).fold(0i128, |g, t| gcd(g, t.k));
    if m == 0 {
        return false;
    }
    let rem = |s: &Side| s.constant.rem_euclid(m);
    if sides.iter().all(|s| s.part(cut, false).is_empty()) {
        // `M·A + k = M·A' + k'` has no solution unless `k ≡ k'`.
        if rem(&sides[0]) != rem(&sides[1]) {
            return true;
        }
    } else {
        let below = sides.iter().map(|s| s.values(&s.part(cut, false), rem(s))).reduce(Iv::union);
        if below.and_then(Iv::width).is_none_or(|w| w >= m) {
            return false;
        }
    }
    let v_below = sides.iter().any(|s| s.part(cut, false).iter().any(|t| t.is_v));
    let [a, b] = [0, 1].map(|i| sides[i].next(cut, m, v_below));
    let shrank = a.terms.len() + b.terms.len() < sides[0].terms.len() + sides[1].terms.len();
    (shrank || m > 1) && decodes([a, b])
}

impl<'w> Side<'w> {
    /// The terms at or above the cut (`up`), or below it.
    fn part(&self, cut: i128, up: bool) -> Vec<Term<'w>> {
        self.terms.iter().filter(|t| (t.k.abs() >= cut) == up).cloned().collect()
    }

    /// The side of the cut that has `v`: the rest below it, or the terms
    /// above it over `m`.
    fn next(&self, cut: i128, m: i128, v_below: bool) -> Side<'w> {
        if v_below {
            Side { terms: self.part(cut, false), constant: self.constant.rem_euclid(m), facts: self.facts }
        } else {
            let terms = self.part(cut, true).into_iter().map(|t| Term { k: t.k / m, ..t }).collect();
            Side { terms, constant: self.constant.div_euclid(m), facts: &[] }
        }
    }
}

pub(crate) fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Every access of `body` (a load of a tensor, a store, a tile), with the
/// conditions of the `if`s around it inside `body`.
pub fn accesses(f: &LoopFunc, body: &[Stmt], guards: &mut Vec<TExprId>, out: &mut Vec<Access>) {
    let loads = |e: TExprId, guards: &[TExprId], out: &mut Vec<Access>| {
        let mut found = Vec::new();
        crate::analysis::loads_in(&f.p, e, &mut found);
        for l in found {
            if let TExpr::Load(t, idx) = f.p.expr(l) {
                out.push(Access { guards: guards.to_vec(), ..Access::element(*t, idx, false) });
            }
        }
    };
    for s in body {
        match s {
            Stmt::For { body, .. } | Stmt::Alloc { body, .. } => accesses(f, body, guards, out),
            Stmt::If { cond, then } => {
                loads(*cond, guards, out);
                guards.push(*cond);
                accesses(f, then, guards, out);
                guards.pop();
            }
            Stmt::Store { tensor, indices, value } => {
                indices.iter().chain([value]).for_each(|&e| loads(e, guards, out));
                out.push(Access { guards: guards.clone(), ..Access::element(*tensor, indices, true) });
            }
            Stmt::Mma { op, c, a, b } => {
                let (m, n, k) = op.shape();
                for t in [c, a, b] {
                    t.origin.iter().for_each(|&e| loads(e, guards, out));
                }
                for (t, rows, cols, write) in [(a, m, k, false), (b, k, n, false), (c, m, n, false), (c, m, n, true)] {
                    out.push(Access { guards: guards.clone(), ..Access::tile(t, rows, cols, write) });
                }
            }
            Stmt::TileDot(d) => {
                d.origins().for_each(|&e| loads(e, guards, out));
                for (t, rows, cols) in d.tiles() {
                    out.push(Access { guards: guards.clone(), ..Access::tile(t, rows, cols, false) });
                }
                out.push(Access { guards: guards.clone(), ..Access::tile(&d.c, d.m, d.n, true) });
            }
            Stmt::Wgmma(w) => {
                w.origins().for_each(|&e| loads(e, guards, out));
                for (m, mn, k) in w.operands() {
                    let mut a = Access::element(m.tensor, &m.origin, false);
                    a.reach = m.reach(mn, k);
                    out.push(Access { guards: guards.clone(), ..a });
                }
                let (m, n, _) = w.op.shape();
                for write in [false, true] {
                    out.push(Access { guards: guards.clone(), ..Access::tile(&w.c, m, n, write) });
                }
            }
            // A warp's lanes exchange their elements in step (`shfl.sync`).
            Stmt::WarpReduce(_) | Stmt::Barrier | Stmt::Async(_) | Stmt::Prefetch { .. } => {}
        }
    }
}

/// Buffers `Alloc`ated in `body`: private to each iteration around it.
pub fn allocated(body: &[Stmt], out: &mut BTreeSet<TensorId>) {
    for s in body {
        match s {
            Stmt::Alloc { tensor, body } => {
                out.insert(*tensor);
                allocated(body, out)
            }
            s => allocated(s.body(), out),
        }
    }
}

/// Give every loop inside `body` the role [`Role::Free`].
pub fn free_loops(body: &[Stmt], parties: &mut Parties) {
    for s in body {
        match s {
            Stmt::For { var, body, .. } => {
                parties.set(*var, Role::Free);
                free_loops(body, parties)
            }
            s => free_loops(s.body(), parties),
        }
    }
}

/// Two iterations of a `parallel` or `vectorized` loop that may touch one
/// element, one of them writing it.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    pub var: VarId,
    pub kind: ForKind,
    pub tensor: TensorId,
}

impl Conflict {
    pub fn message(&self, f: &LoopFunc) -> String {
        let (what, how) = match self.kind {
            ForKind::Vectorized => ("lanes", "at once"),
            _ => ("iterations", "on different threads"),
        };
        format!(
            "the {what} of {} loop `{}` may touch one element of `{}` where one of them writes it: no index of its \
             accesses tells them apart, and they run {how}",
            self.kind.name().trim(),
            f.vars[self.var as usize].name,
            f.p.tensor(self.tensor).name
        )
    }
}

/// How many expression nodes a loop nest may evaluate, and how many
/// elements its tensors may hold, for [`runs_without_races`] to run it:
/// enough for the sizes of tests and hand-written nests, a fraction of a
/// second and some megabytes on the evaluator.
pub const ENUMERATION_BUDGET: u64 = 1 << 22;
pub const ENUMERATION_ELEMENTS: i64 = 1 << 22;

/// Where the proof from the indices fails: whether running `f` on the
/// loop-IR evaluator, with its race detector, finds no two concurrent
/// iterations touching one element where either writes. That is a proof
/// too, for these sizes, where which elements are touched cannot depend
/// on the data: no index, guard, `select` or `&&`/`||` condition reads
/// memory or a scalar (so every run touches what this one does), and `f`
/// is small ([`ENUMERATION_BUDGET`], [`ENUMERATION_ELEMENTS`]).
pub fn runs_without_races(f: &LoopFunc) -> bool {
    let elements = f.p.tensors.iter().map(|t| t.len().max(0)).fold(0i64, i64::saturating_add);
    if elements > ENUMERATION_ELEMENTS || nodes_run(f, &f.body) > ENUMERATION_BUDGET || addresses_read_data(f, &f.body)
    {
        return false;
    }
    let Ok(args) = texc_compiler::interp::bind_args(&f.p, Default::default(), &[], 0) else { return false };
    crate::eval::run(f, args).is_ok()
}

/// How many expression nodes `body` evaluates (saturating).
fn nodes_run(f: &LoopFunc, body: &[Stmt]) -> u64 {
    let size = |e: TExprId| tree_size(f, e);
    body.iter()
        .map(|s| match s {
            Stmt::For { extent, body, .. } => ((*extent).max(0) as u64).saturating_mul(nodes_run(f, body).max(1)),
            Stmt::If { cond, then } => size(*cond).saturating_add(nodes_run(f, then)),
            Stmt::Alloc { tensor, body } => {
                (f.p.tensor(*tensor).len().max(1) as u64).saturating_add(nodes_run(f, body))
            }
            Stmt::Store { indices, value, .. } => {
                indices.iter().map(|&i| size(i)).fold(size(*value), u64::saturating_add)
            }
            Stmt::Mma { op, .. } => {
                let (m, n, k) = op.shape();
                (m * n * k) as u64
            }
            Stmt::Wgmma(w) => {
                let (m, n, k) = w.op.shape();
                (m * n * k) as u64
            }
            Stmt::TileDot(d) => (d.m * d.n * d.k) as u64,
            Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => 1,
        })
        .fold(0u64, u64::saturating_add)
}

fn tree_size(f: &LoopFunc, e: TExprId) -> u64 {
    1 + f.p.children(e).into_iter().map(|c| tree_size(f, c)).fold(0u64, u64::saturating_add)
}

/// Whether which elements `body` touches may depend on the data: an
/// index, a guard, or a condition deciding which operands are evaluated
/// reads memory or a scalar.
fn addresses_read_data(f: &LoopFunc, body: &[Stmt]) -> bool {
    let p = &f.p;
    let data = |e: TExprId| reads_data(p, e);
    body.iter().any(|s| match s {
        Stmt::For { body, .. } | Stmt::Alloc { body, .. } => addresses_read_data(f, body),
        Stmt::If { cond, then } => data(*cond) || addresses_read_data(f, then),
        Stmt::Store { indices, value, .. } => indices.iter().any(|&i| data(i)) || controls_read_data(p, *value),
        Stmt::Mma { c, a, b, .. } => [c, a, b].iter().flat_map(|t| &t.origin).any(|&i| data(i)),
        Stmt::Wgmma(w) => w.origins().any(|&i| data(i)),
        Stmt::TileDot(d) => d.origins().any(|&i| data(i)),
        Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => false,
    })
}

/// Whether `e` reads memory or a scalar.
fn reads_data(p: &texc_compiler::tir::Program, e: TExprId) -> bool {
    matches!(p.expr(e), TExpr::Load(..) | TExpr::Scalar(_)) || p.children(e).into_iter().any(|c| reads_data(p, c))
}

/// Whether, inside `e`, a load's index or a condition that decides what
/// is evaluated (`select`, the left side of `&&` and `||`) reads data.
fn controls_read_data(p: &texc_compiler::tir::Program, e: TExprId) -> bool {
    let control = match p.expr(e) {
        TExpr::Load(_, idx) => idx.iter().any(|&i| reads_data(p, i)),
        TExpr::Select(c, ..) | TExpr::Binary(texc_compiler::ops::BinOp::And | texc_compiler::ops::BinOp::Or, c, _) => {
            reads_data(p, *c)
        }
        _ => false,
    };
    control || p.children(e).into_iter().any(|c| controls_read_data(p, c))
}

/// The first `parallel` or `vectorized` loop of `f` (outermost first)
/// whose iterations are not proven independent: from the indices, or
/// where they cannot tell, by [`runs_without_races`].
pub fn check_loops(f: &LoopFunc) -> Result<(), Conflict> {
    match from_indices(f) {
        Err(_) if runs_without_races(f) => Ok(()),
        r => r,
    }
}

/// [`check_loops`] from the indices alone.
pub fn from_indices(f: &LoopFunc) -> Result<(), Conflict> {
    fn walk(f: &LoopFunc, ranges: &LoopRanges, body: &[Stmt]) -> Result<(), Conflict> {
        for s in body {
            match s {
                Stmt::For { var, lo, extent, kind, body } => {
                    if matches!(kind, ForKind::Parallel | ForKind::Vectorized) && *extent > 1 {
                        check_loop(f, ranges, (*var, *lo, *extent, *kind), body)?;
                    }
                    walk(f, ranges, body)?
                }
                s => walk(f, ranges, s.body())?,
            }
        }
        Ok(())
    }
    walk(f, &LoopRanges::of(f), &f.body)
}

/// Whether the iterations of a loop `(var, lo, extent, kind)` over `body`
/// (not yet in `f`; `ranges` those of `f`'s other loops) are proven
/// independent from the indices.
pub fn iterations_independent(
    f: &LoopFunc,
    ranges: &LoopRanges,
    the_loop: (VarId, i64, i64, ForKind),
    body: &[Stmt],
) -> bool {
    check_loop(f, ranges, the_loop, body).is_ok()
}

fn check_loop(
    f: &LoopFunc,
    ranges: &LoopRanges,
    (var, lo, extent, kind): (VarId, i64, i64, ForKind),
    body: &[Stmt],
) -> Result<(), Conflict> {
    let mut parties =
        Parties::with_ranges(ranges.clone(), vec![interval::range(lo as i128, (lo + extent - 1) as i128)]);
    parties.set(var, Role::Id { id: 0, offset: 0 });
    free_loops(body, &mut parties);
    let mut private = BTreeSet::new();
    allocated(body, &mut private);
    let mut all = Vec::new();
    accesses(f, body, &mut Vec::new(), &mut all);
    let written: BTreeSet<TensorId> =
        all.iter().filter(|a| a.write && !private.contains(&a.tensor)).map(|a| a.tensor).collect();
    for t in written {
        let of_t: Vec<&Access> = all.iter().filter(|a| a.tensor == t).collect();
        if parties.unseparated(f, &of_t).is_some() {
            return Err(Conflict { var, kind, tensor: t });
        }
    }
    Ok(())
}
