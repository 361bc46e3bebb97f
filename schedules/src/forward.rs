//! *forward*: a copy's producer stores what the copy would have, where
//! the copy would have put it. A CPU loop-IR pass, run after lowering.
//!
//! An inverted residual block computes its expansion (a 1 × 1
//! convolution, stored channels last, `T[0, h · W + w, c]`), then a
//! padding copy that applies the activation (`Xp[0, y, x, c] = select(y <
//! H + 1, silu(T[0, (y - 1) · W + x - 1, c]), 0)` in its interior, zeros
//! on its frame), then the depthwise convolution over `Xp`. The copy is a
//! pass over two tensors of the map's size that goes through the L3 or
//! memory at large maps (EfficientNet-B3's 112² × 144: 7 MB each way, 7 %
//! of the model at one thread, and it scales worst at two). Here the
//! producer's stores `T[q] = v` become `Xp[F(q)] = g(v)` — the copy's
//! value `g` of the element at the copy's place `F(q)` for it — and the
//! copy keeps only the stores that do not read `T` (the frame), so `T`
//! is never written nor read.
//!
//! `F` is read off the copy's one store that reads, `X[J] = g(T[I])` (or
//! `select(c, g(T[I]), z)`, `z` reading nothing): each dimension of `I`
//! is affine in the copy's loop variables — or in a fused loop's quotient
//! and remainder (`n.y.x / 32`, `n.y.x % 32`) — each in one dimension, as
//! digits of a mixed radix (`112 · y + x` with `x` of 112 values), so each
//! is a quotient and remainder of that dimension's index (`y = (q - k) /
//! 112 + y₀`); `F` is `J` over those (a dimension of `J` equal to one of
//! `I`'s up to a constant is that dimension of `q` plus the constant).
//!
//! Taken only where it is exact (MEASURED costs in [`pays`]): `T` and `X`
//! are temporaries; `T` stored by statements before the copy that do not
//! read it (`P`: one, or the pieces of one parallel loop, or any such
//! statements, each forwarded in place) and read by the copy alone; the copy (one top-level statement, with the pieces of its
//! cut loop before it that store constants) stores `X` only, reads
//! neither `X` nor, outside that store's value, `T`, and nothing else
//! it reads is stored from `P` on; nothing from `P` up to the copy
//! touches `X`. The reading store is the copy's only one; its loops'
//! ranges, narrowed by its guards and the `select`'s condition, take as
//! many points as `T` has elements, at which `I`'s digits are distinct
//! (each element of `T` read once) and so are `J`'s (each element of `X`
//! stored once); the copy's other stores store constants in a box apart
//! from those elements (so that they may run before or after `P`'s); `g`
//! reads no loop variable outside an index; and each of `P`'s vector
//! stores stays a store of consecutive elements (the vectorized variable
//! moves `F(q)` by as many elements as it moved `q`).
//!
//! Invariants: every element `X` held after the copy holds the same value
//! after the pass (stored by `P` where the copy read `T`, by the copy
//! elsewhere, each once); no other tensor's stores and no loop of `P`
//! change; a loop or guard of the copy left with no statement goes.

use crate::analysis::{flat_coefficient, loads_in, same_value};
use crate::guards::comparisons;
use crate::ir::{ForKind, LoopFunc, Stmt};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use texc_compiler::affine::{affine_of, Affine};
use texc_compiler::ops::{BinOp, UnOp};
use texc_compiler::target::Target;
use texc_compiler::tir::{TExpr, TExprId, TensorId, TensorRole, Ty, VarId};

/// Forward every copy of `f` the module's conditions allow, and that pays
/// on target `target` ([`pays`]); returns the copies' tensors (`X`) whose
/// producers now store them.
pub fn forward_copies(f: &mut LoopFunc, target: &Target) -> Vec<TensorId> {
    let l2 = target.cpu_caches().l2;
    let mut touch = Touches::of(f);
    let mut done = Vec::new();
    let mut gone = vec![false; f.body.len()];
    for ci in 0..f.body.len() {
        let Some((t, x)) = copy_of(f, &touch, ci) else { continue };
        // The statements storing `T` (one, or the pieces of one parallel
        // loop), each forwarded in place.
        let ps = touch.stores[&t].clone();
        // The copy's pieces before this one (a loop cut where its guards
        // are decided: the first rows, all frame) store constants in `X`.
        let mut c0 = ci;
        while c0 > 0 && stores_constants_in(f, &f.body[c0 - 1], x) {
            c0 -= 1;
        }
        // Nothing from `P` up to the copy touches `X`.
        let clear = [&touch.stores, &touch.loads]
            .iter()
            .all(|m| m.get(&x).is_none_or(|v| v.iter().all(|&i| i < ps[0] || i >= c0)));
        if !clear || ps.iter().any(|&pi| pi >= c0) {
            continue;
        }
        let Some(map) = copy_map(f, c0, ci, t, x) else { continue };
        if !pays(f, &map, l2) {
            continue;
        }
        let Some(stores) = ps.iter().map(|&pi| forwarded_stores(f, pi, &map)).collect::<Option<Vec<_>>>() else {
            continue;
        };
        // What stays of the copy reads no `T` (a guard's condition, an index).
        let rest = without_reading_store(f, f.body[ci].clone(), &map);
        if rest.as_ref().is_some_and(|r| tensors(f, r).1.contains(&t)) {
            continue;
        }
        for (&pi, stores) in ps.iter().zip(stores) {
            replace_stores(&mut f.body[pi], t, &mut stores.into_iter());
        }
        // A copy left with nothing is an empty statement until the end (a
        // later copy of `X` takes `X`'s stores from the statements listed).
        match rest {
            Some(rest) => f.body[ci] = rest,
            None => {
                f.body[ci] = Stmt::If { cond: never(f), then: Vec::new() };
                gone[ci] = true;
            }
        }
        touch.stores.remove(&t);
        touch.loads.remove(&t);
        let xs = touch.stores.entry(x).or_default();
        xs.extend(ps);
        xs.sort_unstable();
        done.push(x);
    }
    let mut i = 0;
    f.body.retain(|_| {
        i += 1;
        !gone[i - 1]
    });
    done
}

/// Whether forwarding pays: always where the copy's value is cheap (a
/// padding, a bias, a clamp); where it computes a transcendental function
/// (a SiLU's sigmoid, a GELU's erf), only where `T` is larger than an L2
/// of `l2` bytes. The copy's pass then reads `T` from the L3 or memory and
/// writes `X` there, which forwarding saves; below, the pass costs little
/// more than the function, which the producer's write-back then computes
/// instead, beside its block of accumulators (MEASURED, AMD Zen 4, `host`,
/// 1 thread, EfficientNet-B3: the expansion and SiLU of 112² × 144
/// channels 1.79 → 1.52 ms, those of 7² × 2304 channels 0.88 → 0.90;
/// above the L2 but not far, ConvNeXt-S's GELU of 28² × 768, 2.4 MB, 2.29
/// → 2.34 ms: the line is where the gain starts, not where it is large).
fn pays(f: &LoopFunc, m: &CopyMap, l2: i64) -> bool {
    let t = f.p.tensor(m.t);
    !costly(f, m.g) || t.len() * t.elem.size() as i64 > l2
}

/// Whether `e` computes a transcendental function.
fn costly(f: &LoopFunc, e: TExprId) -> bool {
    matches!(f.p.expr(e), TExpr::Math(fun, _) if fun.is_costly()) || f.p.children(e).into_iter().any(|c| costly(f, c))
}

/// Which top-level statements store and load each tensor.
#[derive(Default)]
struct Touches {
    stores: HashMap<TensorId, Vec<usize>>,
    loads: HashMap<TensorId, Vec<usize>>,
}

impl Touches {
    fn of(f: &LoopFunc) -> Touches {
        let mut out = Touches::default();
        for (i, s) in f.body.iter().enumerate() {
            let (st, ld) = tensors(f, s);
            for t in st {
                out.stores.entry(t).or_default().push(i);
            }
            for t in ld {
                out.loads.entry(t).or_default().push(i);
            }
        }
        out
    }
}

/// The tensors `s` stores and those it loads (or prefetches, or uses in
/// any other statement: those count as both, so no copy involves them).
fn tensors(f: &LoopFunc, s: &Stmt) -> (HashSet<TensorId>, HashSet<TensorId>) {
    fn walk(f: &LoopFunc, s: &Stmt, st: &mut HashSet<TensorId>, ld: &mut HashSet<TensorId>) {
        let read = |e: TExprId, ld: &mut HashSet<TensorId>| {
            let mut loads = Vec::new();
            loads_in(&f.p, e, &mut loads);
            ld.extend(loads.iter().filter_map(|&l| match f.p.expr(l) {
                TExpr::Load(t, _) => Some(*t),
                _ => None,
            }));
        };
        match s {
            Stmt::For { body, .. } => body.iter().for_each(|s| walk(f, s, st, ld)),
            Stmt::If { cond, then } => {
                read(*cond, ld);
                then.iter().for_each(|s| walk(f, s, st, ld));
            }
            Stmt::Alloc { tensor, body } => {
                st.insert(*tensor);
                ld.insert(*tensor);
                body.iter().for_each(|s| walk(f, s, st, ld));
            }
            Stmt::Store { tensor, indices, value } => {
                st.insert(*tensor);
                indices.iter().for_each(|&i| read(i, ld));
                read(*value, ld);
            }
            Stmt::Prefetch { tensor, .. } => {
                ld.insert(*tensor);
            }
            // A tile product reads and writes its tiles' tensors.
            Stmt::TileDot(d) => {
                for tile in [&d.c, &d.a, &d.b] {
                    st.insert(tile.tensor);
                    ld.insert(tile.tensor);
                }
                st.insert(TensorId(u32::MAX));
            }
            // GPU statements: not in the nests this pass takes.
            _ => {
                st.insert(TensorId(u32::MAX));
            }
        }
    }
    let (mut st, mut ld) = (HashSet::new(), HashSet::new());
    walk(f, s, &mut st, &mut ld);
    (st, ld)
}

/// Whether statement `s` stores `X` only, values that read nothing.
fn stores_constants_in(f: &LoopFunc, s: &Stmt, x: TensorId) -> bool {
    let (st, ld) = tensors(f, s);
    st.len() == 1 && st.contains(&x) && ld.is_empty()
}

/// `(T, X)` where top-level statement `ci` stores one temporary `X` only
/// and reads one temporary `T` that earlier statements store and no other
/// reads; what else it reads no statement from `T`'s first producer up
/// to it stores.
fn copy_of(f: &LoopFunc, touch: &Touches, ci: usize) -> Option<(TensorId, TensorId)> {
    let (st, ld) = tensors(f, &f.body[ci]);
    let st: Vec<_> = st.into_iter().collect();
    let [x] = st[..] else { return None };
    let temp = |t: TensorId| t.0 != u32::MAX && f.p.tensor(t).role == TensorRole::Temp;
    let produced = |t: &TensorId| {
        temp(*t)
            && touch.loads.get(t).map(Vec::as_slice) == Some(&[ci])
            && touch.stores.get(t).is_some_and(|ps| ps.iter().all(|&pi| pi < ci))
    };
    let ts: Vec<TensorId> = ld.iter().copied().filter(produced).collect();
    let [t] = ts[..] else { return None };
    let first = touch.stores[&t][0];
    let stable = |u: &TensorId| *u == t || touch.stores.get(u).is_none_or(|v| v.iter().all(|&i| i < first || i > ci));
    (t != x && temp(x) && !ld.contains(&x) && ld.iter().all(stable)).then_some((t, x))
}

/// What an index reads of the loops: a variable, or a quotient or
/// remainder of one by a constant (the two digits of a fused loop,
/// `n.y.x / 32` and `n.y.x % 32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Atom {
    Var(VarId),
    Div(VarId, i64),
    Mod(VarId, i64),
}

impl Atom {
    fn var(self) -> VarId {
        match self {
            Atom::Var(v) | Atom::Div(v, _) | Atom::Mod(v, _) => v,
        }
    }
}

/// `e` as an affine form over [`Atom`]s.
fn atom_form(f: &LoopFunc, e: TExprId) -> Option<Affine<Atom>> {
    affine_of(&f.p, e, &mut |x| {
        let atom = match f.p.expr(x) {
            TExpr::Var(v) => Atom::Var(*v),
            TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) => {
                let (TExpr::Var(v), TExpr::Int(k)) = (f.p.expr(*a), f.p.expr(*b)) else { return None };
                if *k <= 0 {
                    return None;
                }
                if *op == BinOp::FloorDiv {
                    Atom::Div(*v, *k)
                } else {
                    Atom::Mod(*v, *k)
                }
            }
            _ => return None,
        };
        Some(Affine::atom(atom))
    })
}

/// Atoms' smallest and largest values.
type Ranges = BTreeMap<Atom, (i64, i64)>;

/// A loop around a store: its variable, first value and extent.
type Around = (VarId, i64, i64);

/// The copy's store that reads `T`, and what forwarding needs of it.
struct CopyMap {
    t: TensorId,
    x: TensorId,
    /// The copy's index of `X` and of `T` there.
    j: Vec<TExprId>,
    i: Vec<TExprId>,
    /// Its value with `T[I]` in it (the `select`'s operand, if any); what
    /// else it reads, at indices affine in the copy's atoms.
    g: TExprId,
    /// Where the value is a `select`: its condition, whether `g` is taken
    /// where it holds, and the other operand (which reads nothing).
    arm: Option<(TExprId, bool, TExprId)>,
    /// The atoms of the loops around the store, with their ranges where `T` is read.
    ranges: Ranges,
    /// The variables of those loops.
    vars: Vec<VarId>,
}

/// The copy's store that reads (statement `ci`, its pieces from `c0`), if
/// it reads `T` at one index only, taking each element of `T` once, and
/// stores each element of `X` once; where the copy's other stores (and
/// its pieces') store constants at elements it does not store.
fn copy_map(f: &LoopFunc, c0: usize, ci: usize, t: TensorId, x: TensorId) -> Option<CopyMap> {
    let mut sites = Vec::new();
    for s in &f.body[c0..=ci] {
        stores_under(f, s, &mut Vec::new(), &mut Vec::new(), &mut sites)?;
    }
    let reading: Vec<usize> = (0..sites.len()).filter(|&n| reads(f, sites[n].1)).collect();
    let [r] = reading[..] else { return None };
    let (j, value, loops, conds) = &sites[r];
    let mut conds = conds.clone();
    let (g, arm) = match f.p.expr(*value) {
        TExpr::Select(c, a, b) if !reads(f, *c) && !reads(f, *b) => {
            conds.push((*c, true));
            (*a, Some((*c, true, *b)))
        }
        TExpr::Select(c, a, b) if !reads(f, *c) && !reads(f, *a) => {
            conds.push((*c, false));
            (*b, Some((*c, false, *a)))
        }
        _ => (*value, None),
    };
    let mut loads = Vec::new();
    loads_in(&f.p, g, &mut loads);
    loads.retain(|&l| matches!(f.p.expr(l), TExpr::Load(lt, _) if *lt == t));
    let TExpr::Load(_, i) = f.p.expr(*loads.first()?).clone() else { return None };
    let same = |&l: &TExprId| match f.p.expr(l) {
        TExpr::Load(_, li) => li.len() == i.len() && li.iter().zip(&i).all(|(&a, &b)| same_value(&f.p, a, b)),
        _ => false,
    };
    if !loads.iter().all(same) {
        return None;
    }
    let ranges = atom_ranges(f, &i, loops, &conds)?;
    let points: i128 = ranges.values().map(|&(lo, hi)| (hi - lo + 1).max(0) as i128).product();
    if points != f.p.tensor(t).len() as i128 || !distinct(f, j, &ranges) {
        return None;
    }
    // The select's constant, stored where its condition fails, stays: it
    // must land on other elements than `g` does (each stored once over the
    // guards' points, not only over the condition's).
    if arm.is_some() && !distinct(f, j, &atom_ranges(f, &i, loops, &sites[r].3)?) {
        return None;
    }
    // What the copy's other stores store stays theirs: they may run before
    // the reading store, which now runs in `P`, before them.
    let image = bounds(f, j, &ranges)?;
    let others_apart = sites
        .iter()
        .enumerate()
        .filter(|&(n, _)| n != r)
        .all(|(_, site)| stored_box(f, site).is_some_and(|b| apart(&b, &image)));
    let vars = loops.iter().map(|l| l.0).collect();
    others_apart.then(|| CopyMap { t, x, j: j.clone(), i, g, arm, ranges, vars })
}

/// Whether index `j` takes a different value at each point of `ranges`:
/// every atom of more than one value in one dimension, with a coefficient
/// of either sign, as the digits of a mixed radix.
fn distinct(f: &LoopFunc, j: &[TExprId], ranges: &Ranges) -> bool {
    let mut seen = HashSet::new();
    for &e in j {
        let Some(form) = atom_form(f, e) else { return false };
        let mut digits: Vec<(i128, i128)> = Vec::new();
        for (a, &k) in &form.terms {
            let Some(&(lo, hi)) = ranges.get(a) else { return false };
            if hi > lo {
                if !seen.insert(*a) {
                    return false;
                }
                digits.push((k.abs(), (hi - lo) as i128));
            }
        }
        digits.sort_by_key(|&(k, _)| -k);
        for n in 0..digits.len() {
            let below: i128 = digits[n + 1..].iter().map(|&(k, span)| k * span).sum();
            if below >= digits[n].0 {
                return false;
            }
        }
    }
    ranges.iter().all(|(a, &(lo, hi))| lo == hi || seen.contains(a))
}

/// The ranges of the atoms `I` reads the loops `loops` by, narrowed by
/// conditions `conds` (each holding, or failing, where `T` is read). Each
/// loop is read whole, or as the quotient and remainder by one constant
/// that divides its bounds (so that they take every pair of values), or
/// not at all where it has one value.
fn atom_ranges(f: &LoopFunc, i: &[TExprId], loops: &[Around], conds: &[(TExprId, bool)]) -> Option<Ranges> {
    let mut used = BTreeSet::new();
    for &e in i {
        used.extend(atom_form(f, e)?.terms.keys().copied());
    }
    let mut ranges = Ranges::new();
    for &(v, lo, extent) in loops {
        let of_v: Vec<Atom> = used.iter().copied().filter(|a| a.var() == v).collect();
        match of_v[..] {
            [] if extent == 1 => {}
            [Atom::Var(_)] => {
                ranges.insert(Atom::Var(v), (lo, lo + extent - 1));
            }
            [Atom::Div(_, k), Atom::Mod(_, k2)] if k == k2 && lo % k == 0 && (lo + extent) % k == 0 => {
                ranges.insert(Atom::Div(v, k), (lo / k, (lo + extent) / k - 1));
                ranges.insert(Atom::Mod(v, k), (0, k - 1));
            }
            _ => return None,
        }
    }
    if used.iter().any(|a| !ranges.contains_key(a)) {
        return None;
    }
    for &(c, holds) in conds {
        narrow(f, c, holds, &mut ranges)?;
    }
    Some(ranges)
}

/// Whether `e` loads anything.
fn reads(f: &LoopFunc, e: TExprId) -> bool {
    let mut loads = Vec::new();
    loads_in(&f.p, e, &mut loads);
    !loads.is_empty()
}

/// A store's index, value, loops around it and guards (each holding).
type StoreSite = (Vec<TExprId>, TExprId, Vec<Around>, Vec<(TExprId, bool)>);

/// The stores under `s`, with the loops and guards around them. `None` at
/// a statement other than a CPU loop, a guard or a store.
fn stores_under(
    f: &LoopFunc,
    s: &Stmt,
    loops: &mut Vec<Around>,
    conds: &mut Vec<(TExprId, bool)>,
    out: &mut Vec<StoreSite>,
) -> Option<()> {
    match s {
        Stmt::For { var, lo, extent, kind, body } if !kind.is_gpu() && *kind != ForKind::Async => {
            loops.push((*var, *lo, *extent));
            for b in body {
                stores_under(f, b, loops, conds, out)?;
            }
            loops.pop();
        }
        Stmt::If { cond, then } => {
            conds.push((*cond, true));
            for b in then {
                stores_under(f, b, loops, conds, out)?;
            }
            conds.pop();
        }
        Stmt::Store { indices, value, .. } => out.push((indices.clone(), *value, loops.clone(), conds.clone())),
        _ => return None,
    }
    Some(())
}

/// Each dimension's smallest and largest value of index `idx` where its
/// atoms take `ranges`; `None` where a dimension is not affine in them.
fn bounds(f: &LoopFunc, idx: &[TExprId], ranges: &Ranges) -> Option<Vec<(i128, i128)>> {
    idx.iter()
        .map(|&e| {
            let form = atom_form(f, e)?;
            let (mut lo, mut hi) = (form.c, form.c);
            for (a, &k) in &form.terms {
                let &(l, h) = ranges.get(a)?;
                let (x, y) = (k * l as i128, k * h as i128);
                lo += x.min(y);
                hi += x.max(y);
            }
            Some((lo, hi))
        })
        .collect()
}

/// The bounds of the index of a store at `site` (a box holding every
/// element it stores): its atoms' ranges from its loops, narrowed by the
/// guards that compare one (the others only narrow it further).
fn stored_box(f: &LoopFunc, site: &StoreSite) -> Option<Vec<(i128, i128)>> {
    let (idx, _, loops, conds) = site;
    let mut ranges = Ranges::new();
    for &e in idx {
        for a in atom_form(f, e)?.terms.keys() {
            let &(_, lo, extent) = loops.iter().find(|l| l.0 == a.var())?;
            let hi = lo + extent - 1;
            let range = match *a {
                Atom::Var(_) => (lo, hi),
                Atom::Div(_, k) => (lo.div_euclid(k), hi.div_euclid(k)),
                Atom::Mod(_, k) if hi - lo + 1 < k && lo.rem_euclid(k) <= hi.rem_euclid(k) => {
                    (lo.rem_euclid(k), hi.rem_euclid(k))
                }
                Atom::Mod(_, k) => (0, k - 1),
            };
            ranges.insert(*a, range);
        }
    }
    for &(c, holds) in conds {
        // A guard the ranges cannot read (or that fails to narrow them) only
        // makes the box larger than what the store stores.
        let mut narrowed = ranges.clone();
        if narrow(f, c, holds, &mut narrowed).is_some() {
            ranges = narrowed;
        }
    }
    bounds(f, idx, &ranges)
}

/// Whether two boxes share no element.
fn apart(a: &[(i128, i128)], b: &[(i128, i128)]) -> bool {
    a.iter().zip(b).any(|(x, y)| x.1 < y.0 || y.1 < x.0)
}

/// Narrow `ranges` to where `cond` holds (`holds`) or fails: `cond` a
/// conjunction of comparisons of an atom (plus a constant) with a
/// constant (one comparison, where it fails). `None` where it is not,
/// or compares an atom the ranges do not have.
fn narrow(f: &LoopFunc, cond: TExprId, holds: bool, ranges: &mut Ranges) -> Option<()> {
    let cs = comparisons(f, cond);
    if !holds && cs.len() != 1 {
        return None;
    }
    for c in cs {
        let TExpr::Binary(op, a, b) = f.p.expr(c) else { return None };
        let (form, TExpr::Int(k)) = (atom_form(f, *a)?, f.p.expr(*b)) else { return None };
        let [(atom, 1)] = form.terms.iter().map(|(a, k)| (*a, *k)).collect::<Vec<_>>()[..] else { return None };
        let k = i64::try_from(*k as i128 - form.c).ok()?;
        let r = ranges.get_mut(&atom)?;
        match (op, holds) {
            (BinOp::Lt, true) | (BinOp::Ge, false) => r.1 = r.1.min(k - 1),
            (BinOp::Ge, true) | (BinOp::Lt, false) => r.0 = r.0.max(k),
            _ => return None,
        }
    }
    Some(())
}

/// The new stores of `X` for `P`'s (`pi`) stores of `T`, in the order a
/// walk of `P` meets them; `None` where a store's index is not one `F`
/// can map, or a vector store would no longer store consecutive elements.
fn forwarded_stores(f: &mut LoopFunc, pi: usize, m: &CopyMap) -> Option<Vec<Stmt>> {
    let mut sites = Vec::new();
    stores_of(&f.body[pi], m.t, &mut Vec::new(), &mut sites);
    let digits = Digits::of(f, m)?;
    let mut out = Vec::with_capacity(sites.len());
    for (q, v, vector) in sites {
        let mut atoms = HashMap::new();
        let idx = m.j.iter().map(|&je| digits.at(f, m, je, &q, &mut atoms)).collect::<Option<Vec<_>>>()?;
        if let Some(vv) = vector {
            let before = flat_coefficient(&f.p, m.t, &q, vv);
            if before.is_none() || flat_coefficient(&f.p, m.x, &idx, vv) != before {
                return None;
            }
        }
        let value = digits.value(f, m, m.g, &q, v, &mut atoms)?;
        if m.vars.iter().any(|&cv| f.p.mentions(value, cv)) {
            return None;
        }
        out.push(Stmt::Store { tensor: m.x, indices: idx, value });
    }
    Some(out)
}

/// `T`'s stores under `body` (index, value, and the vectorized loop
/// around it, if any), in walk order.
fn stores_of(s: &Stmt, t: TensorId, vectors: &mut Vec<VarId>, out: &mut Vec<(Vec<TExprId>, TExprId, Option<VarId>)>) {
    match s {
        Stmt::Store { tensor, indices, value } if *tensor == t => {
            out.push((indices.clone(), *value, vectors.last().copied()));
        }
        Stmt::For { var, kind: ForKind::Vectorized, body, .. } => {
            vectors.push(*var);
            body.iter().for_each(|b| stores_of(b, t, vectors, out));
            vectors.pop();
        }
        s => s.body().iter().for_each(|b| stores_of(b, t, vectors, out)),
    }
}

/// Replace `T`'s stores under `s`, in walk order, by `new`'s.
fn replace_stores(s: &mut Stmt, t: TensorId, new: &mut impl Iterator<Item = Stmt>) {
    match s {
        Stmt::Store { tensor, .. } if *tensor == t => *s = new.next().expect("one new store per store of T"),
        s => s.body_mut().iter_mut().for_each(|b| replace_stores(b, t, new)),
    }
}

/// How the copy's index `I` decodes into its atoms: per dimension, the
/// affine form's constant at the atoms' smallest values and its atoms
/// (with coefficient and smallest value) by falling coefficient.
struct Digits {
    dims: Vec<(i128, Vec<(Atom, i128, i64)>)>,
    /// `I`'s dimensions as affine forms over the atoms (read once).
    forms: Vec<Affine<Atom>>,
}

impl Digits {
    fn of(f: &LoopFunc, m: &CopyMap) -> Option<Digits> {
        let mut dims = Vec::with_capacity(m.i.len());
        let mut seen = HashSet::new();
        let forms = m.i.iter().map(|&e| atom_form(f, e)).collect::<Option<Vec<_>>>()?;
        for form in &forms {
            let mut atoms = Vec::new();
            let mut base = form.c;
            for (&a, &k) in &form.terms {
                let &(lo, hi) = m.ranges.get(&a)?;
                if k <= 0 || !seen.insert(a) {
                    return None;
                }
                base += k * lo as i128;
                // An atom of one value is a constant: no digit.
                if hi > lo {
                    atoms.push((a, k, lo));
                }
            }
            atoms.sort_by_key(|&(_, k, _)| -k);
            // Mixed radix: what the smaller digits add stays below each one's weight.
            for n in 0..atoms.len() {
                let below: i128 = atoms[n + 1..].iter().map(|&(a, k, lo)| k * (m.ranges[&a].1 - lo) as i128).sum();
                if below >= atoms[n].1 {
                    return None;
                }
            }
            dims.push((base, atoms));
        }
        // Every atom of the loops is a digit of `I` or of one value.
        m.ranges.iter().all(|(a, &(lo, hi))| seen.contains(a) || lo == hi).then_some(Digits { dims, forms })
    }

    /// Index `e` of the copy (affine in its atoms) at the point where it
    /// read `T[q]`: `q[d]` plus a constant where `e` is `I[d]` plus one,
    /// else `e` over the atoms decoded from `q` (kept in `atoms`).
    fn at(
        &self,
        f: &mut LoopFunc,
        m: &CopyMap,
        e: TExprId,
        q: &[TExprId],
        atoms: &mut HashMap<Atom, TExprId>,
    ) -> Option<TExprId> {
        let form = atom_form(f, e)?;
        let shifted = self.forms.iter().enumerate().find_map(|(d, other)| {
            (other.terms == form.terms && !form.terms.is_empty()).then_some((d, form.c - other.c))
        });
        Some(match shifted {
            Some((d, 0)) => q[d],
            Some((d, c)) => bin_k(f, BinOp::Add, q[d], c),
            None => {
                self.decode_all(f, m, q, atoms);
                let mut sum: Option<TExprId> = None;
                for (a, &k) in &form.terms {
                    let x = *atoms.get(a)?;
                    let term = if k == 1 { x } else { bin_k(f, BinOp::Mul, x, k) };
                    sum = Some(match sum {
                        Some(s) => f.p.alloc(TExpr::Binary(BinOp::Add, s, term), Ty::Index, Default::default()),
                        None => term,
                    });
                }
                match sum {
                    Some(s) if form.c != 0 => bin_k(f, BinOp::Add, s, form.c),
                    Some(s) => s,
                    None => int(f, form.c),
                }
            }
        })
    }

    /// The copy's value `g` for the element `P` stores as `v` at `T[q]`:
    /// `T`'s loads replaced by `v`, other loads' indices taken [`Self::at`]
    /// `q`; `None` where `g` reads a loop variable outside a load's index.
    fn value(
        &self,
        f: &mut LoopFunc,
        m: &CopyMap,
        g: TExprId,
        q: &[TExprId],
        v: TExprId,
        atoms: &mut HashMap<Atom, TExprId>,
    ) -> Option<TExprId> {
        let node = match f.p.expr(g).clone() {
            TExpr::Load(t, _) if t == m.t => return Some(v),
            TExpr::Load(t, idx) => {
                TExpr::Load(t, idx.iter().map(|&e| self.at(f, m, e, q, atoms)).collect::<Option<Vec<_>>>()?)
            }
            TExpr::Var(_) | TExpr::Reduce(..) => return None,
            TExpr::Unary(op, a) => TExpr::Unary(op, self.value(f, m, a, q, v, atoms)?),
            TExpr::Binary(op, a, b) => {
                let a = self.value(f, m, a, q, v, atoms)?;
                TExpr::Binary(op, a, self.value(f, m, b, q, v, atoms)?)
            }
            TExpr::Select(c, a, b) => {
                let (c, a) = (self.value(f, m, c, q, v, atoms)?, self.value(f, m, a, q, v, atoms)?);
                TExpr::Select(c, a, self.value(f, m, b, q, v, atoms)?)
            }
            TExpr::Math(fun, args) => {
                TExpr::Math(fun, args.iter().map(|&a| self.value(f, m, a, q, v, atoms)).collect::<Option<Vec<_>>>()?)
            }
            TExpr::Intrinsic(i, args) => {
                TExpr::Intrinsic(i, args.iter().map(|&a| self.value(f, m, a, q, v, atoms)).collect::<Option<Vec<_>>>()?)
            }
            TExpr::Cast(a) => TExpr::Cast(self.value(f, m, a, q, v, atoms)?),
            TExpr::Int(_) | TExpr::Float(_) | TExpr::Scalar(_) => return Some(g),
        };
        let (ty, span) = (f.p.ty(g), f.p.span(g));
        Some(f.p.alloc(node, ty, span))
    }

    /// Each atom as an expression of `q` (its smallest value where it has one).
    fn decode_all(&self, f: &mut LoopFunc, m: &CopyMap, q: &[TExprId], atoms: &mut HashMap<Atom, TExprId>) {
        if !atoms.is_empty() {
            return;
        }
        for (a, &(lo, hi)) in &m.ranges {
            if lo == hi {
                let k = int(f, lo as i128);
                atoms.insert(*a, k);
            }
        }
        for (d, (base, digits)) in self.dims.iter().enumerate() {
            let rest = if *base == 0 { q[d] } else { bin_k(f, BinOp::Sub, q[d], *base) };
            // Each digit from what the larger ones leave of the index.
            let mut within = rest;
            for (n, &(a, k, lo)) in digits.iter().enumerate() {
                if n > 0 {
                    within = bin_k(f, BinOp::FloorMod, within, digits[n - 1].1);
                }
                let digit = if k == 1 { within } else { bin_k(f, BinOp::FloorDiv, within, k) };
                let value = if lo == 0 { digit } else { bin_k(f, BinOp::Add, digit, lo as i128) };
                atoms.insert(a, value);
            }
        }
    }
}

fn int(f: &mut LoopFunc, k: i128) -> TExprId {
    f.p.alloc(TExpr::Int(k as i64), Ty::Index, Default::default())
}

/// A condition that never holds (the guard of an emptied statement).
fn never(f: &mut LoopFunc) -> TExprId {
    let zero = int(f, 0);
    f.p.alloc(TExpr::Binary(BinOp::Lt, zero, zero), Ty::Elem(texc_compiler::types::ElemType::Bool), Default::default())
}

/// `a op k` of indices.
fn bin_k(f: &mut LoopFunc, op: BinOp, a: TExprId, k: i128) -> TExprId {
    let k = int(f, k);
    f.p.alloc(TExpr::Binary(op, a, k), Ty::Index, Default::default())
}

/// The copy without its store that reads `T`: gone where it stored `g`,
/// guarded where it stored `select(c, g, z)` (stores `z` where `c` fails,
/// or holds, for `select(c, z, g)`); loops and guards left empty go, and a
/// guard of a loop variable's comparison comes out of the loops it does
/// not mention. `None` where nothing is left.
fn without_reading_store(f: &mut LoopFunc, s: Stmt, m: &CopyMap) -> Option<Stmt> {
    match s {
        Stmt::Store { tensor, indices, value } if tensor == m.x && reads(f, value) => {
            let (c, g_where_holds, z) = m.arm?;
            let cond = if g_where_holds { negated(f, c) } else { c };
            Some(Stmt::If { cond, then: vec![Stmt::Store { tensor, indices, value: z }] })
        }
        Stmt::For { var, lo, extent, kind, body } => {
            let mut body: Vec<Stmt> = body.into_iter().filter_map(|b| without_reading_store(f, b, m)).collect();
            if body.is_empty() {
                return None;
            }
            // A guard that does not mention the loop's variable goes around the loop.
            let hoists = matches!(&body[..], [Stmt::If { cond, .. }] if !f.p.mentions(*cond, var));
            if hoists && kind != ForKind::Parallel {
                let Some(Stmt::If { cond, then }) = body.pop() else { unreachable!("one guard") };
                return Some(Stmt::If { cond, then: vec![Stmt::For { var, lo, extent, kind, body: then }] });
            }
            Some(Stmt::For { var, lo, extent, kind, body })
        }
        Stmt::If { cond, then } => {
            let then: Vec<Stmt> = then.into_iter().filter_map(|b| without_reading_store(f, b, m)).collect();
            (!then.is_empty()).then_some(Stmt::If { cond, then })
        }
        s => Some(s),
    }
}

/// `!c`, a comparison's opposite where `c` is one.
fn negated(f: &mut LoopFunc, c: TExprId) -> TExprId {
    let (ty, span) = (f.p.ty(c), f.p.span(c));
    let node = match *f.p.expr(c) {
        TExpr::Binary(BinOp::Lt, a, b) => TExpr::Binary(BinOp::Ge, a, b),
        TExpr::Binary(BinOp::Ge, a, b) => TExpr::Binary(BinOp::Lt, a, b),
        _ => TExpr::Unary(UnOp::Not, c),
    };
    f.p.alloc(node, ty, span)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::tensor;

    fn parse_loops(src: &str) -> LoopFunc {
        crate::testing::parse_loops("k.loops", src)
    }

    /// A product of `X` stored by positions of a 3 × 5 map (`T[0, p, c]`),
    /// a copy padding it by one on each side with a bias and a ReLU (its
    /// loop `copy`, over `P`'s 5 × 7 points), and a reader of the padding.
    fn block(copy: &str) -> String {
        format!(
            "func k []\n  input X: f32[15, 8]\n  input W: f32[8, 32]\n  input b: f32[32]\n  \
             temp T: f32[1, 15, 32]\n  temp P: f32[1, 5, 7, 32]\n  output Y: f32[1, 3, 5, 32]\n  \
             for p in 0..15 parallel:\n    for c.o in 0..2:\n      for c.v in 0..16 vectorized:\n        \
             T[0, p, c.o * 16 + c.v] = X[p, 0] * W[0, c.o * 16 + c.v] + X[p, 7] * W[7, c.o * 16 + c.v]\n\
             {copy}  \
             for y in 0..3 parallel:\n    for x in 0..5:\n      for c in 0..32 vectorized:\n        \
             Y[0, y, x, c] = P[0, y, x, c] + P[0, y + 1, x + 1, c] * 2.0f32 + P[0, y + 2, x + 2, c]\n"
        )
    }

    /// The copy's value at `P[0, y, x, c]`, its row and column `y` and `x`.
    fn padded(y: &str, x: &str) -> String {
        format!("select({y} >= 1 && {y} < 4 && {x} >= 1 && {x} < 6, max(T[0, ({y} - 1) * 5 + ({x} - 1), c] + b[c], 0.0f32), 0.0f32)")
    }

    /// The copy over rows, columns and channels.
    fn rows_copy() -> String {
        let v = padded("y", "x");
        format!("  for y in 0..5 parallel:\n    for x in 0..7:\n      for c in 0..32 vectorized:\n        P[0, y, x, c] = {v}\n")
    }

    /// The copy over one loop of rows and columns, and channels.
    fn fused_copy() -> String {
        let v = padded("y.x / 7", "y.x % 7");
        format!("  for y.x in 0..35 parallel:\n    for c in 0..32 vectorized:\n      P[0, y.x / 7, y.x % 7, c] = {v}\n")
    }

    /// `Y` of `f` on fixed arguments.
    fn run(f: &LoopFunc) -> Vec<f32> {
        let args = vec![tensor(&[15, 8], 1), tensor(&[8, 32], 2), tensor(&[32], 3)];
        match &crate::eval::run(f, args).expect("runs")[0].data {
            texc_runtime::Data::F32(v) => v.clone(),
            d => panic!("f32 output, not {d:?}"),
        }
    }

    /// Equal but for the rounding of a product summed in one expression
    /// rather than from a stored value (a multiply-add).
    fn assert_close(what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{what}: element {i}: {g} against {w}");
        }
    }

    fn target() -> &'static Target {
        texc_compiler::target::lookup("x86-avx2").expect("target")
    }

    #[test]
    fn the_producer_stores_the_padded_copy() {
        for (name, copy, interior) in [
            ("rows", rows_copy(), "P[0, p / 5 + 1, p % 5 + 1, c.o * 16 + c.v]"),
            ("fused", fused_copy(), "P[0, p / 5 + 1, p % 5 + 1, c.o * 16 + c.v]"),
        ] {
            let f = parse_loops(&block(&copy));
            let mut g = f.clone();
            let done = forward_copies(&mut g, target());
            assert_eq!(done.iter().map(|&t| g.p.tensor(t).name.as_str()).collect::<Vec<_>>(), ["P"], "{name}");
            let text = crate::ir::print(&g);
            assert!(!text.contains("T["), "{name}: T is neither stored nor read:\n{text}");
            let store = format!("{interior} = max(");
            assert!(text.contains(&store), "{name}: `{store}`:\n{text}");
            // The copy stores the frame only: its interior points fail its guard.
            assert_eq!(text.matches("= 0.0f32").count(), 1, "{name}:\n{text}");
            assert_close(name, &run(&g), &run(&f));
            crate::verify::verify_lowered(&g).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        }
    }

    #[test]
    fn copies_that_do_not_read_all_of_t_once_stay() {
        let f = parse_loops(&block(&rows_copy()));
        let kept = |src: String, why: &str| {
            let mut g = parse_loops(&src);
            assert!(forward_copies(&mut g, target()).is_empty(), "{why}:\n{}", crate::ir::print(&g));
        };
        // Rows 1..3 of the map only: a crop, its last row never read.
        kept(block(&rows_copy()).replace("y < 4 &&", "y < 3 &&"), "a crop of T");
        // An index not affine in the copy's loops (a quotient of a sum).
        kept(block(&rows_copy()).replace("(y - 1) * 5 + (x - 1)", "(y - 1) * 5 + (x - 1) / 2"), "x read by halves");
        // T read by the reader too.
        kept(block(&rows_copy()).replace("* 2.0f32 +", "* T[0, 0, c] +"), "T read twice");
        // The copy's value reads a loop variable outside an index.
        kept(block(&rows_copy()).replace("+ b[c], 0.0f32)", "+ f32(x), 0.0f32)"), "x in the value");
        // Vectors along the map's positions: stored padded, they would no
        // longer be consecutive.
        let along_map = block(&rows_copy()).replace(
            "for p in 0..15 parallel:\n    for c.o in 0..2:\n      for c.v in 0..16 vectorized:\n        \
             T[0, p, c.o * 16 + c.v] = X[p, 0] * W[0, c.o * 16 + c.v] + X[p, 7] * W[7, c.o * 16 + c.v]",
            "for c in 0..32 parallel:\n    for p in 0..15 vectorized:\n      T[0, p, c] = X[p, 0] * W[0, c]",
        );
        assert!(along_map.contains("for p in 0..15 vectorized"), "{along_map}");
        kept(along_map, "vectors along the map");
        // And the plain one moves.
        assert_eq!(forward_copies(&mut f.clone(), target()).len(), 1);
    }

    #[test]
    fn a_costly_copy_moves_only_where_its_input_leaves_the_l2() {
        let sig = block(&rows_copy())
            .replace("max(T[0, (y - 1) * 5 + (x - 1), c] + b[c], 0.0f32)", "sigmoid(T[0, (y - 1) * 5 + (x - 1), c])");
        let mut g = parse_loops(&sig);
        assert!(forward_copies(&mut g, target()).is_empty(), "15 × 32 floats fit any L2");
        let small = texc_compiler::target::with_caches(
            target(),
            texc_compiler::target::CpuCaches { l2: 1024, ..target().cpu_caches() },
        );
        let mut g = parse_loops(&sig);
        assert_eq!(forward_copies(&mut g, small).len(), 1, "1920 bytes leave a 1 KiB L2");
    }

    /// `T[i, c]` made by a loop over rows, copied transposed into `X` by
    /// `copy` (lines after the producer's), and read back by `Y`.
    fn transposed(x: &str, copy: &str, read: &str) -> String {
        format!(
            "func k []\n  input A: f32[4, 16]\n  temp T: f32[4, 16]\n  temp X: {x}\n  output Y: f32[16, 4]\n  \
             for i in 0..4 parallel:\n    for c in 0..16:\n      T[i, c] = A[i, c] * 2.0f32 - 1.0f32\n\
             {copy}  for c in 0..16 parallel:\n    for i in 0..4:\n      Y[c, i] = {read} + 1.0f32\n"
        )
    }

    /// `Y` of a [`transposed`] nest.
    fn run_transposed(f: &LoopFunc) -> Vec<f32> {
        match &crate::eval::run(f, vec![tensor(&[4, 16], 5)]).expect("runs")[0].data {
            texc_runtime::Data::F32(v) => v.clone(),
            d => panic!("f32 output, not {d:?}"),
        }
    }

    #[test]
    fn a_select_of_two_reads_moves_whole() {
        let copy = "  for c in 0..16 parallel:\n    for i in 0..4:\n      \
                    X[c, i] = select(T[i, c] >= 0.0f32, T[i, c], T[i, c] * 0.1f32)\n";
        let f = parse_loops(&transposed("f32[16, 4]", copy, "X[c, i]"));
        let mut g = f.clone();
        assert_eq!(forward_copies(&mut g, target()).len(), 1);
        let text = crate::ir::print(&g);
        assert!(!text.contains("T[") && text.contains("X[c, i] = select("), "{text}");
        assert_close("leaky", &run_transposed(&g), &run_transposed(&f));
    }

    #[test]
    fn constants_stored_before_the_copy_must_miss_what_it_reads_into() {
        let copy = "  for c in 0..16 parallel:\n    for i in 0..4:\n      X[c, i + 1] = T[i, c]\n";
        let read = "X[c, i] + X[c, i + 1] * 2.0f32 + X[c, i + 2]";
        // A zero nest over all of `X` (what *zero* puts before a copy that
        // leaves elements unstored): after the move it would clear `P`'s stores.
        let zero = format!("  for c in 0..16 parallel:\n    for i in 0..6:\n      X[c, i] = 0.0f32\n{copy}");
        let mut g = parse_loops(&transposed("f32[16, 6]", &zero, read));
        assert!(forward_copies(&mut g, target()).is_empty(), "{}", crate::ir::print(&g));
        // The frame alone, in pieces before and after: apart from the copy's elements.
        let frame = format!(
            "  for c in 0..16 parallel:\n    X[c, 0] = 0.0f32\n{copy}  for c in 0..16 parallel:\n    X[c, 5] = 0.0f32\n"
        );
        let f = parse_loops(&transposed("f32[16, 6]", &frame, read));
        let mut g = f.clone();
        assert_eq!(forward_copies(&mut g, target()).len(), 1, "{}", crate::ir::print(&g));
        assert_close("framed", &run_transposed(&g), &run_transposed(&f));
        // Every element of `T` stored to one element of `X`: not forwarded.
        let onto_one = "  for c in 0..16 parallel:\n    for i in 0..4:\n      X[c, 0] = T[i, c]\n";
        let mut g = parse_loops(&transposed("f32[16, 1]", onto_one, "X[c, 0]"));
        assert!(forward_copies(&mut g, target()).is_empty(), "{}", crate::ir::print(&g));
    }

    #[test]
    fn a_copy_cut_into_pieces_moves_with_its_frame() {
        // The fused copy cut where its rows' guards are decided: the first
        // and last rows (frame only) and the rows between, from 7 to 28.
        let v = padded("y.x / 7", "y.x % 7");
        let store = "P[0, y.x / 7, y.x % 7, c]";
        let copy = format!(
            "  for y.x in 0..7:\n    for c in 0..32 vectorized:\n      {store} = 0.0f32\n  \
             for y.x in 7..28 parallel:\n    for c in 0..32 vectorized:\n      {store} = {v}\n  \
             for y.x in 28..35:\n    for c in 0..32 vectorized:\n      {store} = 0.0f32\n"
        );
        let f = parse_loops(&block(&copy));
        let mut g = f.clone();
        assert_eq!(forward_copies(&mut g, target()).len(), 1, "{}", crate::ir::print(&g));
        let text = crate::ir::print(&g);
        assert!(!text.contains("T["), "{text}");
        assert_close("pieces", &run(&g), &run(&f));
    }

    #[test]
    fn a_select_reading_its_input_in_its_condition_moves_whole() {
        // A ReLU written as a select: the condition reads `T`, so no arm is a constant's.
        let copy = "  for c in 0..16 parallel:\n    for i in 0..4:\n      \
                    X[c, i] = select(T[i, c] >= 0.0f32, T[i, c], 0.0f32)\n";
        let f = parse_loops(&transposed("f32[16, 4]", copy, "X[c, i]"));
        let mut g = f.clone();
        assert_eq!(forward_copies(&mut g, target()).len(), 1);
        assert!(!crate::ir::print(&g).contains("T["), "{}", crate::ir::print(&g));
        assert_close("relu", &run_transposed(&g), &run_transposed(&f));
    }

    #[test]
    fn stores_of_the_copy_that_may_meet_the_moved_ones_keep_it() {
        let kept = |x: &str, copy: &str, read: &str| {
            let mut g = parse_loops(&transposed(x, copy, read));
            assert!(forward_copies(&mut g, target()).is_empty(), "{}", crate::ir::print(&g));
        };
        // The select's constant stored, at other points of the same loops,
        // on elements `g` is stored on: it ran before some of them.
        kept(
            "f32[68]",
            "  for y in 0..8:\n    for c in 0..16:\n      X[c * 4 + y] = select(y >= 4, T[y - 4, c], 0.0f32)\n",
            "X[c * 4 + i + 4]",
        );
        // Another store of the copy, before the reading one, on the same element.
        kept(
            "f32[16, 4]",
            "  for c in 0..16 parallel:\n    for i in 0..4:\n      X[c, i] = 0.0f32\n      X[c, i] = T[i, c]\n",
            "X[c, i]",
        );
    }

    #[test]
    fn an_index_of_three_digits_decodes_into_three_loops() {
        // `T` read at `16 · a + 4 · b + d`, stored to `X[b, a, d]`.
        let src = "func k []\n  input A: f32[32]\n  temp T: f32[32]\n  temp X: f32[4, 2, 4]\n  output Y: f32[4, 2, 4]\n  \
                   for p in 0..32 parallel:\n    T[p] = A[p] * 3.0f32\n  \
                   for b in 0..4 parallel:\n    for a in 0..2:\n      for d in 0..4:\n        X[b, a, d] = T[a * 16 + b * 4 + d] + 1.0f32\n  \
                   for b in 0..4 parallel:\n    for a in 0..2:\n      for d in 0..4:\n        Y[b, a, d] = X[b, a, d] * 2.0f32\n";
        let f = parse_loops(src);
        let mut g = f.clone();
        assert_eq!(forward_copies(&mut g, target()).len(), 1);
        let text = crate::ir::print(&g);
        assert!(text.contains("X[p % 16 / 4, p / 16, p % 16 % 4] = A[p] * 3.0f32 + 1.0f32"), "{text}");
        let run = |f: &LoopFunc| match &crate::eval::run(f, vec![tensor(&[32], 7)]).expect("runs")[0].data {
            texc_runtime::Data::F32(v) => v.clone(),
            d => panic!("f32 output, not {d:?}"),
        };
        assert_close("three digits", &run(&g), &run(&f));
    }
}
