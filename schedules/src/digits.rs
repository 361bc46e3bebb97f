//! Index expressions as affine forms over *digits*, for the proofs about
//! loop nests that need more than intervals: that concurrent iterations
//! touch distinct elements ([`crate::independence`]) and that a store
//! reaches every element of a buffer ([`crate::zeroing`]).
//!
//! Each *source* — an id of the parties of a concurrent region, or a loop
//! variable that is not one — ranging over `lo..lo + n` is `lo + Σ w·d`
//! for digits `d` of `0..n` in a mixed radix whose weights `w` divide one
//! another. Division and remainder by a constant `c` are exact on such
//! forms when `c` falls on a digit boundary: `(256·b + t) / 128` with `t` in
//! `0..256` splits `t` at 128 and is `2·b + t₁`, its remainder `t₀`. So a
//! fused loop's `t[f / W, f % W]` is `f`'s two digits; [`Forms::settle`]
//! finds the boundaries every access needs and applies them everywhere.
//! Pairs `α·(e / c) + β·(e % c)` with `α = c·β` merge into `β·e` first
//! (`⌊e/c⌋·c + e mod c = e` for every `e`), so divisions that fall off the
//! boundaries still add up to their dividend. Anything else (a load, a
//! remainder off the boundaries) is an opaque term, bounded by its
//! interval. The conditions of the `if`s around an access (*facts*) narrow
//! what its forms take (`if w % 32 == 0` fixes `w`'s lowest digit).

use crate::interval::{self, Iv, ANY};
use crate::ir::{LoopFunc, Stmt};
use std::collections::{BTreeMap, HashMap};
use texc_compiler::affine::{affine_of, Affine};
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, VarId};

/// How a loop variable differs between the two parties of a concurrent
/// region (or, outside one, [`Role::Common`] or [`Role::Free`] alike).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Role {
    /// `offset + id`: the variable tells the parties apart.
    Id { id: usize, offset: i64 },
    /// Any value of its range for each party, independently.
    Free,
    /// The same value for both parties.
    Common,
}

/// Where forms are read: the ids' ranges (the parties of a concurrent
/// region), and every loop variable's role and range.
#[derive(Clone, Debug)]
pub struct Env {
    /// The values each id takes (`0..=n-1` for GPU coordinates).
    pub ids: Vec<Iv>,
    /// The roles other than [`Role::Common`], by variable: a few loops'
    /// (an access's own), not one entry per variable of the function (an
    /// `Env` per buffer made the *zero* pass quadratic in a model's
    /// layers).
    pub(crate) roles: HashMap<VarId, Role>,
    /// Each loop variable's values, shared by the `Env`s of one function
    /// ([`LoopRanges`]).
    pub(crate) ranges: LoopRanges,
}

/// The values each loop variable of a function takes (its loop's range),
/// found once per function and shared: a pass that makes an [`Env`] per
/// buffer or per loop would otherwise walk the whole function each time.
#[derive(Clone, Debug)]
pub struct LoopRanges(std::sync::Arc<[Iv]>);

impl LoopRanges {
    pub fn of(f: &LoopFunc) -> LoopRanges {
        let mut ranges = vec![ANY; f.vars.len()];
        fn walk(body: &[Stmt], ranges: &mut [Iv]) {
            for s in body {
                match s {
                    Stmt::For { var, lo, extent, body, .. } => {
                        ranges[*var as usize] = interval::range(*lo as i128, (*lo + *extent - 1) as i128);
                        walk(body, ranges)
                    }
                    s => walk(s.body(), ranges),
                }
            }
        }
        walk(&f.body, &mut ranges);
        LoopRanges(ranges.into())
    }
}

impl std::ops::Index<usize> for LoopRanges {
    type Output = Iv;
    fn index(&self, v: usize) -> &Iv {
        &self.0[v]
    }
}

/// Where a value comes from: an id of the parties, or a loop variable that is not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Src {
    Id(usize),
    Var(VarId),
}

/// An atom of an index form: a digit of a source (by its weight), or an
/// opaque sub-term (by its structure).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Atom {
    Digit(Src, i128),
    Opaque(String),
}

/// A source's values `lo..lo + n` as digits of weights `weights` (1 first,
/// each dividing the next).
#[derive(Clone, Debug)]
pub(crate) struct Radix {
    pub(crate) lo: i128,
    pub(crate) n: i128,
    pub(crate) weights: Vec<i128>,
}

impl Radix {
    pub(crate) fn new(iv: Iv) -> Option<Radix> {
        let (lo, hi) = (iv.lo?, iv.hi?);
        (hi >= lo).then(|| Radix { lo, n: hi - lo + 1, weights: vec![1] })
    }

    /// The digits' weights and sizes.
    pub(crate) fn digits(&self) -> impl Iterator<Item = (i128, i128)> + '_ {
        self.weights.iter().enumerate().map(|(j, &w)| {
            let size = self.weights.get(j + 1).map_or((self.n - 1) / w + 1, |&next| next / w);
            (w, size)
        })
    }

    /// Split the digits at `b`; `false` where `b` does not fall in line with
    /// the boundaries there are.
    pub(crate) fn split(&mut self, b: i128) -> bool {
        if b <= 1 || b >= self.n || self.weights.contains(&b) {
            return true;
        }
        if self.weights.iter().any(|&w| w % b != 0 && b % w != 0) {
            return false;
        }
        self.weights.push(b);
        self.weights.sort_unstable();
        true
    }
}

/// The sources' digits, and the forms of expressions over them.
pub(crate) struct Forms<'a> {
    pub(crate) f: &'a LoopFunc,
    pub(crate) env: &'a Env,
    pub(crate) radix: BTreeMap<Src, Radix>,
    /// Boundaries some division asked for (see [`Forms::settle`]).
    wanted: Vec<(Src, i128)>,
    /// An expression of each opaque term, by its key.
    pub(crate) opaques: BTreeMap<String, TExprId>,
    /// What holds where the access being read is made (see [`Forms::facts_of`]).
    pub(crate) facts: Vec<Fact>,
    /// Forms already found without facts, once [`Forms::settle`] is done
    /// (while it runs, a form's divisions ask for boundaries, and its
    /// splits change the digits): a model's checks find the same index
    /// forms many times.
    memo: HashMap<TExprId, Option<Affine<Atom>>>,
    settling: bool,
}

/// How many rounds of splitting digits [`Forms::settle`] runs at most:
/// each round splits at the boundaries the last one's divisions needed.
pub(crate) const SETTLE_ROUNDS: usize = 6;

impl<'a> Forms<'a> {
    pub(crate) fn new(f: &'a LoopFunc, env: &'a Env) -> Forms<'a> {
        Forms {
            f,
            env,
            radix: BTreeMap::new(),
            wanted: Vec::new(),
            opaques: BTreeMap::new(),
            facts: Vec::new(),
            memo: HashMap::new(),
            settling: false,
        }
    }

    /// Split digits until every division of the accesses' indices and
    /// guards falls on boundaries (or cannot).
    pub(crate) fn settle(&mut self, sites: &[Site]) {
        self.memo.clear();
        self.settling = true;
        self.settle_rounds(sites);
        self.settling = false;
    }

    fn settle_rounds(&mut self, sites: &[Site]) {
        for _ in 0..SETTLE_ROUNDS {
            self.wanted.clear();
            for site in sites {
                self.facts = self.facts_of(site);
                for &e in site.indices {
                    let _ = self.form(e);
                }
            }
            self.facts.clear();
            let wanted = std::mem::take(&mut self.wanted);
            let mut changed = false;
            for (src, b) in wanted {
                if let Some(r) = self.radix.get_mut(&src) {
                    let before = r.weights.len();
                    changed |= r.split(b) && r.weights.len() != before;
                }
            }
            if !changed {
                return;
            }
        }
    }

    pub(crate) fn source(&self, v: VarId) -> (Src, i128) {
        match self.env.role(v) {
            Role::Id { id, offset } => (Src::Id(id), offset as i128),
            Role::Free | Role::Common => (Src::Var(v), 0),
        }
    }

    pub(crate) fn range_of(&self, src: Src) -> Iv {
        match src {
            Src::Id(i) => self.env.ids[i],
            Src::Var(v) => self.env.ranges[v as usize],
        }
    }

    pub(crate) fn radix(&mut self, src: Src) -> Option<&Radix> {
        if !self.radix.contains_key(&src) {
            let r = Radix::new(self.range_of(src))?;
            self.radix.insert(src, r);
        }
        self.radix.get(&src)
    }

    /// The form of `e` over digits and opaque terms. Divisions and
    /// remainders first stand as opaque terms, so that pairs of them merge
    /// into their dividend ([`Forms::merge_pairs`]: `f / 19 · 19 + f % 19`
    /// is `f` without splitting `f`'s digits at 19); those left are made
    /// exact on digits where they can be ([`Forms::split`]).
    pub(crate) fn form(&mut self, e: TExprId) -> Option<Affine<Atom>> {
        if self.settling || !self.facts.is_empty() {
            return self.find_form(e);
        }
        if let Some(known) = self.memo.get(&e) {
            return known.clone();
        }
        let form = self.find_form(e);
        self.memo.insert(e, form.clone());
        form
    }

    fn find_form(&mut self, e: TExprId) -> Option<Affine<Atom>> {
        let mut form = self.form_of(e)?;
        loop {
            self.merge_pairs(&mut form)?;
            let Some((atom, k, exact)) = self.exact_division(&form) else { return Some(form) };
            form.terms.remove(&atom);
            form = form.add(&exact, k)?;
        }
    }

    /// An opaque division or remainder of `form` that is exact on digits,
    /// with its coefficient and its form.
    pub(crate) fn exact_division(&mut self, form: &Affine<Atom>) -> Option<(Atom, i128, Affine<Atom>)> {
        let f = self.f;
        for (atom, &k) in &form.terms {
            let Atom::Opaque(key) = atom else { continue };
            let Some((x, c, div, floor)) = self.opaques.get(key).and_then(|&e| division(&f.p, e)) else { continue };
            let Some(dividend) = self.form(x) else { continue };
            // Truncating and unsigned forms agree with floor ones on values ≥ 0;
            // a dividend that may wrap is not its form.
            let iv = self.interval(&dividend);
            if !fits_i64(iv) || (!floor && iv.lo.is_none_or(|l| l < 0)) {
                continue;
            }
            if let Some((q, r)) = self.split(&dividend, c) {
                return Some((atom.clone(), k, if div { q } else { r }));
            }
        }
        None
    }

    pub(crate) fn form_of(&mut self, e: TExprId) -> Option<Affine<Atom>> {
        let f = self.f;
        let p = &f.p;
        affine_of(p, e, &mut |x| match p.expr(x) {
            TExpr::Var(v) => {
                let (src, offset) = self.source(*v);
                let Some(r) = self.radix(src) else { return Some(self.opaque(x)) };
                let mut form = Affine::constant(offset + r.lo);
                // A digit of one value is 0 (a loop of one iteration is its constant).
                for (w, _) in r.digits().filter(|&(_, size)| size > 1).collect::<Vec<_>>() {
                    form = form.add(&Affine::atom(Atom::Digit(src, w)), w)?;
                }
                Some(form)
            }
            _ => Some(self.opaque(x)),
        })
    }

    pub(crate) fn opaque(&mut self, e: TExprId) -> Affine<Atom> {
        let key = crate::analysis::structure(&self.f.p, e);
        self.opaques.entry(key.clone()).or_insert(e);
        Affine::atom(Atom::Opaque(key))
    }

    /// `form = c·q + r` with `r` in `0..c`, both forms over digits, where
    /// every term of `form` falls wholly in one of them; `None` otherwise
    /// (after asking for the boundaries that would make it so).
    pub(crate) fn split(&mut self, form: &Affine<Atom>, c: i128) -> Option<(Affine<Atom>, Affine<Atom>)> {
        let whole = self.interval(form);
        if whole.lo.is_some_and(|l| l >= 0) && whole.hi.is_some_and(|h| h < c) {
            return Some((Affine::constant(0), form.clone()));
        }
        let mut q = Affine::constant(form.c.div_euclid(c));
        let mut r = Affine::constant(form.c.rem_euclid(c));
        let mut needs = Vec::new();
        // What `r` would span once the digits are split.
        let mut after = interval::exact(r.c);
        for (atom, &k) in &form.terms {
            if k % c == 0 {
                q = q.add(&Affine::atom(atom.clone()), k / c)?;
                continue;
            }
            let Atom::Digit(src, w) = atom else { return None };
            let mut size = self.radix.get(src)?.digits().find(|&(dw, _)| dw == *w)?.1;
            if (k.abs() * (size - 1)) >= c {
                // The digit reaches past `c`: split it where `k·d` does.
                if c % k.abs() != 0 {
                    return None;
                }
                needs.push((*src, w * (c / k.abs())));
                size = c / k.abs();
            }
            after = after.add(interval::range(0, size - 1).mul(interval::exact(k)));
            r = r.add(&Affine::atom(atom.clone()), k)?;
        }
        // Ask for boundaries only where they would make the division exact.
        if !(after.lo.is_some_and(|l| l >= 0) && after.hi.is_some_and(|h| h < c)) {
            return None;
        }
        if !needs.is_empty() {
            self.wanted.extend(needs);
            return None;
        }
        let iv = self.interval(&r);
        (iv.lo.is_some_and(|l| l >= 0) && iv.hi.is_some_and(|h| h < c)).then_some((q, r))
    }

    /// Replace every pair `α·(e / c) + β·(e % c)` of opaque terms where
    /// `α = c·β` by `β·e` (`⌊e/c⌋·c + e mod c = e`), as often as pairs
    /// appear: the divisions the digits could not split (`(256·b + t) / 22`,
    /// a fused loop over blocks and threads) still add up to their
    /// dividend over a run of dimensions.
    pub(crate) fn merge_pairs(&mut self, form: &mut Affine<Atom>) -> Option<()> {
        let p = &self.f.p;
        'merge: loop {
            for (div, &alpha) in &form.terms {
                let Atom::Opaque(key) = div else { continue };
                let Some((e, c, true)) = self.opaques.get(key).and_then(|&x| div_or_mod(p, x)) else { continue };
                if alpha % c != 0 {
                    continue;
                }
                let beta = alpha / c;
                let inner = crate::analysis::structure(p, e);
                let pair = form.terms.iter().find(|(m, &b)| {
                    b == beta
                        && matches!(m, Atom::Opaque(k) if self.opaques.get(k).and_then(|&x| div_or_mod(p, x))
                            .is_some_and(|(e2, c2, d)| !d && c2 == c && crate::analysis::structure(p, e2) == inner))
                });
                let Some((modulo, _)) = pair else { continue };
                let (div, modulo) = (div.clone(), modulo.clone());
                form.terms.remove(&div);
                form.terms.remove(&modulo);
                let whole = self.form(e)?.scale(beta)?;
                *form = form.clone().add(&whole, 1)?;
                continue 'merge;
            }
            return Some(());
        }
    }

    /// The range of a digit, narrowed by the facts.
    pub(crate) fn digit_range(&self, atom: &Atom) -> Iv {
        let base = match atom {
            Atom::Digit(src, w) => self
                .radix
                .get(src)
                .and_then(|r| r.digits().find(|&(dw, _)| dw == *w))
                .map_or(ANY, |(_, size)| interval::range(0, size - 1)),
            Atom::Opaque(_) => ANY,
        };
        self.known(&Affine::atom(atom.clone()), base)
    }

    /// `iv`, narrowed by the facts about `form`'s terms (or their negation).
    pub(crate) fn known(&self, form: &Affine<Atom>, iv: Iv) -> Iv {
        let shift = |x: Iv| x.add(interval::exact(form.c));
        self.facts.iter().fold(iv, |iv, fact| {
            if fact.terms == form.terms {
                iv.meet(shift(fact.iv))
            } else if fact.terms.iter().all(|(a, k)| form.coeff(a) == -k) && fact.terms.len() == form.terms.len() {
                iv.meet(shift(fact.iv.neg()))
            } else {
                iv
            }
        })
    }

    /// The values of `form`, each digit in its (narrowed) range, each
    /// opaque term in its interval.
    pub(crate) fn interval(&mut self, form: &Affine<Atom>) -> Iv {
        let mut sum = interval::exact(form.c);
        for (atom, &k) in &form.terms {
            let iv = match atom {
                Atom::Digit(..) => self.digit_range(atom),
                Atom::Opaque(_) => self.opaque_interval(atom),
            };
            sum = sum.add(iv.mul(interval::exact(k)));
        }
        self.known(form, sum)
    }

    /// An opaque term's interval: a division's or remainder's from its
    /// dividend's form (narrowed by the facts), anything else's from the
    /// ranges of its variables.
    pub(crate) fn opaque_interval(&mut self, atom: &Atom) -> Iv {
        let Atom::Opaque(key) = atom else { return ANY };
        let Some(e) = self.opaque_expr(key) else { return ANY };
        let p = &self.f.p;
        let plain = interval::of(p, e, &|v| self.var_range(v));
        let Some((x, c, div, floor)) = division(p, e) else { return plain };
        let Some(dividend) = self.form(x) else { return plain };
        let iv = self.interval(&dividend);
        let (Some(lo), Some(hi)) = (iv.lo, iv.hi) else { return plain };
        if !fits_i64(iv) || (!floor && lo < 0) {
            return plain;
        }
        let narrowed = if div {
            interval::range(lo.div_euclid(c), hi.div_euclid(c))
        } else if lo >= 0 && hi < c {
            iv
        } else {
            interval::range(0, c - 1)
        };
        plain.meet(narrowed)
    }

    /// The expression an opaque key stands for.
    pub(crate) fn opaque_expr(&self, key: &str) -> Option<TExprId> {
        self.opaques.get(key).copied()
    }

    pub(crate) fn var_range(&self, v: VarId) -> Iv {
        let (src, offset) = self.source(v);
        self.range_of(src).add(interval::exact(offset))
    }

    /// What the guards of an access say about its forms, and the ranges of
    /// the ids it is made within.
    pub(crate) fn facts_of(&mut self, site: &Site) -> Vec<Fact> {
        self.facts.clear();
        let mut out = Vec::new();
        for &(id, iv) in site.within {
            let whole = self.radix.get(&Src::Id(id)).map(|r| r.digits().collect::<Vec<_>>());
            let mut id_form = Affine::constant(0);
            for (w, _) in whole.unwrap_or_default() {
                let digit = Atom::Digit(Src::Id(id), w);
                // Every digit is at most the id's bound over its weight.
                if let Some(hi) = iv.hi {
                    out.push(Fact {
                        terms: Affine::atom(digit.clone()).terms,
                        iv: interval::range(0, hi.div_euclid(w)),
                    });
                }
                id_form = id_form.add(&Affine::atom(digit), w).unwrap_or_default();
            }
            out.push(Fact { terms: id_form.terms, iv });
        }
        for &g in site.guards {
            self.conjuncts(g, &mut out);
        }
        out
    }

    /// Facts of one guard: each comparison of its conjunction, as the range
    /// of a form's terms.
    pub(crate) fn conjuncts(&mut self, g: TExprId, out: &mut Vec<Fact>) {
        let f = self.f;
        let p = &f.p;
        let TExpr::Binary(op, a, b) = p.expr(g) else { return };
        let (op, a, b) = (*op, *a, *b);
        if op == BinOp::And {
            self.conjuncts(a, out);
            self.conjuncts(b, out);
            return;
        }
        let (Some(x), Some(y)) = (self.form(a), self.form(b)) else { return };
        // The comparison is of the values as computed: sides that may wrap say nothing.
        if !fits_i64(self.interval(&x)) || !fits_i64(self.interval(&y)) {
            return;
        }
        let Some(d) = x.add(&y, -1) else { return };
        // `terms + d.c op 0`.
        let bound = -d.c;
        let iv = match op {
            BinOp::Eq => interval::exact(bound),
            BinOp::Lt => Iv { lo: None, hi: Some(bound - 1) },
            BinOp::Le => Iv { lo: None, hi: Some(bound) },
            BinOp::Gt => Iv { lo: Some(bound + 1), hi: None },
            BinOp::Ge => Iv { lo: Some(bound), hi: None },
            _ => return,
        };
        if !d.terms.is_empty() {
            out.push(Fact { terms: d.terms, iv });
        }
    }
}

/// What the guards around an access say: `terms` (an affine form without constant)
/// lies in `iv`.
#[derive(Clone, Debug)]
pub(crate) struct Fact {
    pub(crate) terms: BTreeMap<Atom, i128>,
    pub(crate) iv: Iv,
}

impl Env {
    /// `ids`, every loop variable of `f` common until given a role.
    pub fn new(f: &LoopFunc, ids: Vec<Iv>) -> Env {
        Env::with_ranges(LoopRanges::of(f), ids)
    }

    /// [`Env::new`] with `f`'s loop ranges found before.
    pub fn with_ranges(ranges: LoopRanges, ids: Vec<Iv>) -> Env {
        Env { ids, roles: HashMap::new(), ranges }
    }

    /// The same roles with other ranges of the ids (a single value: an id
    /// both parties share).
    pub fn with_ids(&self, ids: Vec<Iv>) -> Env {
        Env { ids, ..self.clone() }
    }

    pub fn set(&mut self, v: VarId, role: Role) {
        if role == Role::Common {
            self.roles.remove(&v);
        } else {
            self.roles.insert(v, role);
        }
    }

    pub fn role(&self, v: VarId) -> Role {
        self.roles.get(&v).copied().unwrap_or(Role::Common)
    }
}

/// Whether every value of `iv` is an `i64`: an index computed in it did
/// not wrap, so it is the value its form says (known bounds only).
pub(crate) fn fits_i64(iv: Iv) -> bool {
    iv.lo.is_some_and(|l| l >= i64::MIN as i128) && iv.hi.is_some_and(|h| h <= i64::MAX as i128)
}

/// `e / c` or `e % c` for a positive constant `c`, any semantics: the
/// dividend, the divisor, whether it divides, whether floor (or unsigned)
/// semantics hold for every dividend (truncation only for ones ≥ 0).
pub(crate) fn division(p: &texc_compiler::tir::Program, e: TExprId) -> Option<(TExprId, i128, bool, bool)> {
    let TExpr::Binary(op, a, b) = p.expr(e) else { return None };
    let TExpr::Int(c) = p.expr(*b) else { return None };
    let (div, floor) = match op {
        BinOp::FloorDiv => (true, true),
        BinOp::FloorMod => (false, true),
        // Unsigned (the bits as an unsigned number) and truncating division
        // agree with floor division on dividends ≥ 0 only.
        BinOp::UDiv | BinOp::TruncDiv => (true, false),
        BinOp::URem | BinOp::TruncRem => (false, false),
        _ => return None,
    };
    (*c > 0).then_some((*a, *c as i128, div, floor))
}

/// `e / c` (`Some((e, c, true))`) or `e % c` (`Some((e, c, false))`) for a
/// positive constant `c`, floor semantics (or unsigned, which wraps alike).
pub(crate) fn div_or_mod(p: &texc_compiler::tir::Program, e: TExprId) -> Option<(TExprId, i128, bool)> {
    let TExpr::Binary(op, a, b) = p.expr(e) else { return None };
    let TExpr::Int(c) = p.expr(*b) else { return None };
    let div = match op {
        BinOp::FloorDiv | BinOp::UDiv => true,
        BinOp::FloorMod | BinOp::URem => false,
        _ => return None,
    };
    (*c > 0).then_some((*a, *c as i128, div))
}

/// Where an access is made: its indices, the conditions of the `if`s
/// around it, and the ranges of the ids it is made within.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Site<'a> {
    pub indices: &'a [TExprId],
    pub guards: &'a [TExprId],
    pub within: &'a [(usize, Iv)],
}
