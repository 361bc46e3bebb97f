//! Bound inference for attached stages (`compute_at`, `cache_read`).
//!
//! A stage `P` attached at loop `a` of stage `C` (its *owner*) runs once per
//! iteration of `C`'s loops down to `a`, and computes there only the box of
//! `P` that its readers need during that iteration, into a buffer private
//! to it (so attached stages are safe inside parallel loops). Its readers
//! must be `C` itself or stages attached to `C` after `P`, at the same loop
//! or at a loop inside it (whose box origins then range over the loops
//! between the two).
//!
//! The box is inferred per axis of `P`: every index with which a reader
//! loads `P` must be affine in the reader's variables, or a floor
//! division or remainder of one by a constant ([`divided`]). Each reader
//! variable is `base + offset`, where the base is linear in the owner's iteration
//! variables that are fixed at `a` (and in the owner's own offsets, when it
//! is attached itself) and the offset ranges over a constant interval (the
//! loops inside `a`). All loads of one axis must share their base; the box
//! is `[base + min, base + max]`, clamped to the tensor. Where the box may
//! leave the tensor (tails of splits, padding reads), the attached stage
//! guards its stores, so it never computes outside its tensor.
//!
//! Invariants of the result: a stage's box extents are constants no larger
//! than its tensor's; its schedule is rebased onto those extents
//! ([`StageSchedule::rebase`]); stages are visited from last to first, so
//! a reader's box is known before its producer's.

use crate::ir::ForKind;
use crate::schedule::{LayoutDim, Schedules, StageSchedule};
use std::collections::{HashMap, HashSet};
use texc_compiler::affine::Affine;
use texc_compiler::ops::{BinOp, UnOp};
use texc_compiler::tir::{Program, TExpr, TExprId, TensorId};
use texc_grammar::Diagnostic;

/// The stack arrays of a function's local buffers (attached stages, `local`
/// in loop text) take at most this together; larger buffers, and those that
/// would take a function past it, live on the heap
/// ([`crate::ir::LoopFunc::heap_locals`]; CPU code asks the runtime's
/// `texc_local_alloc` for them, see `texc_codegen::abi`), at the cost of one
/// allocation per execution of the statement that holds them.
pub const MAX_STACK_BYTES: i64 = 256 * 1024;

/// The most one local buffer may take: a packed block of a matrix product
/// (2 MiB at 512 × 1024 floats) with room to spare, and few enough that a
/// schedule's mistake in one buffer is an error rather than gigabytes per
/// thread (nested buffers add up; each takes a line of the loop nest).
pub const MAX_LOCAL_BYTES: i64 = 16 * 1024 * 1024;

/// Whether a local buffer of `bytes` (or stack arrays of `bytes` in all) is over the stack's share.
pub fn on_heap(bytes: i64) -> bool {
    bytes > MAX_STACK_BYTES
}

/// A term of a box base: an iteration variable of the owner (fixed at the
/// attachment loop) or the offset of one of the owner's axes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Atom {
    Iv(usize),
    Off(usize),
}

/// A box base: linear in the owner's atoms.
pub type Lin = Affine<Atom>;

/// `base + [lo, hi]`.
#[derive(Clone, Debug)]
struct Desc {
    base: Lin,
    lo: i64,
    hi: i64,
}

impl Desc {
    fn konst(c: i64) -> Desc {
        Desc { base: Lin::constant(c as i128), lo: 0, hi: 0 }
    }

    fn range(extent: i64) -> Desc {
        Desc { base: Lin::default(), lo: 0, hi: (extent - 1).max(0) }
    }

    fn add(self, o: &Desc, sign: i64) -> Option<Desc> {
        let (lo, hi) = if sign > 0 {
            (self.lo.checked_add(o.lo)?, self.hi.checked_add(o.hi)?)
        } else {
            (self.lo.checked_sub(o.hi)?, self.hi.checked_sub(o.lo)?)
        };
        Some(Desc { base: self.base.add(&o.base, sign as i128)?, lo, hi })
    }

    fn scale(self, k: i64) -> Option<Desc> {
        let (a, b) = (self.lo.checked_mul(k)?, self.hi.checked_mul(k)?);
        Some(Desc { base: self.base.scale(k as i128)?, lo: a.min(b), hi: a.max(b) })
    }

    fn as_const(&self) -> Option<i64> {
        let c = i64::try_from(self.base.c).ok()?;
        (self.base.terms.is_empty() && self.lo == self.hi).then_some(c.checked_add(self.lo)?)
    }
}

/// The box an attached stage computes per iteration of its attachment loop.
#[derive(Clone, Debug)]
pub struct Region {
    /// Per axis: the first index of the box (linear in the owner's atoms).
    pub lo: Vec<Lin>,
    /// Per axis: the box's extent.
    pub ext: Vec<i64>,
    /// Per axis: whether the box may leave the tensor there (stores are guarded).
    pub guard: Vec<bool>,
    /// The buffer's shape (the box, laid out by the `cache_read` layout if any).
    pub local_shape: Vec<i64>,
}

/// Whether the value of `iv` is fixed once the loops `outer` are fixed.
fn fixed(ss: &StageSchedule, iv: usize, outer: &[usize]) -> bool {
    if ss.leaf_pos(iv).is_some() {
        return outer.contains(&iv);
    }
    if let Some((o, i, _)) = ss.split_children(iv) {
        return fixed(ss, o, outer) && fixed(ss, i, outer);
    }
    match ss.fused_parent(iv) {
        Some((fu, _, _)) => fixed(ss, fu, outer),
        None => false,
    }
}

fn desc(ss: &StageSchedule, iv: usize, outer: &[usize]) -> Desc {
    if fixed(ss, iv, outer) {
        return Desc { base: Lin::atom(Atom::Iv(iv)), lo: 0, hi: 0 };
    }
    if ss.leaf_pos(iv).is_none() {
        if let Some((o, i, f)) = ss.split_children(iv) {
            // Extents are bounded by MAX_ELEMENTS: this cannot overflow.
            let d = desc(ss, o, outer).scale(f).and_then(|d| d.add(&desc(ss, i, outer), 1));
            return d.expect("split values fit 64 bits");
        }
    }
    Desc::range(ss.ivs[iv].extent)
}

/// The range of values `iv` takes (tails of splits included).
fn value_range(ss: &StageSchedule, iv: usize) -> (i64, i64) {
    if ss.leaf_pos(iv).is_none() {
        if let Some((o, i, f)) = ss.split_children(iv) {
            let (a, b) = (value_range(ss, o), value_range(ss, i));
            return (a.0 * f + b.0, a.1 * f + b.1);
        }
        if let Some((fu, e, outer)) = ss.fused_parent(iv) {
            // An empty inner loop (extent 0) leaves the fused loop empty too:
            // any range will do, and dividing by 0 must not happen.
            let e = e.max(1);
            let r = value_range(ss, fu);
            return if outer { (r.0 / e, r.1 / e) } else { (0, e - 1) };
        }
    }
    (0, (ss.ivs[iv].extent - 1).max(0))
}

/// The range of a box origin for one copy of the owner's loops, where
/// `leaf_hi` gives the last value of each enclosing leaf loop; `None` if
/// the origin involves the owner's own offsets.
pub fn origin_range(ss: &StageSchedule, l: &Lin, leaf_hi: &dyn Fn(usize) -> Option<i64>) -> Option<(i64, i64)> {
    fn iv_range(ss: &StageSchedule, iv: usize, leaf_hi: &dyn Fn(usize) -> Option<i64>) -> Option<(i64, i64)> {
        if ss.leaf_pos(iv).is_some() {
            return Some((0, leaf_hi(iv)?));
        }
        if let Some((o, i, f)) = ss.split_children(iv) {
            let (a, b) = (iv_range(ss, o, leaf_hi)?, iv_range(ss, i, leaf_hi)?);
            return Some((a.0 * f + b.0, a.1 * f + b.1));
        }
        let (fu, e, outer) = ss.fused_parent(iv)?;
        let e = e.max(1); // as in `value_range`: an empty loop divides nothing
        let r = iv_range(ss, fu, leaf_hi)?;
        Some(if outer { (r.0 / e, r.1 / e) } else { (0, e - 1) })
    }
    let mut r = (i64::try_from(l.c).ok()?, i64::try_from(l.c).ok()?);
    for (a, &k) in &l.terms {
        let Atom::Iv(iv) = a else { return None };
        let k = i64::try_from(k).ok()?;
        let (x, y) = iv_range(ss, *iv, leaf_hi)?;
        let (a, b) = (k.checked_mul(x)?, k.checked_mul(y)?);
        r.0 = r.0.checked_add(a.min(b))?;
        r.1 = r.1.checked_add(a.max(b))?;
    }
    Some(r)
}

fn linearize(p: &Program, e: TExprId, vars: &[Desc]) -> Option<Desc> {
    match p.expr(e) {
        TExpr::Int(k) => Some(Desc::konst(*k)),
        TExpr::Var(v) => vars.get(*v as usize).cloned(),
        TExpr::Unary(UnOp::Neg, a) => linearize(p, *a, vars)?.scale(-1),
        TExpr::Binary(BinOp::Add, a, b) => linearize(p, *a, vars)?.add(&linearize(p, *b, vars)?, 1),
        TExpr::Binary(BinOp::Sub, a, b) => linearize(p, *a, vars)?.add(&linearize(p, *b, vars)?, -1),
        TExpr::Binary(BinOp::Mul, a, b) => {
            let (x, y) = (linearize(p, *a, vars)?, linearize(p, *b, vars)?);
            match (x.as_const(), y.as_const()) {
                (Some(k), _) => y.scale(k),
                (_, Some(k)) => x.scale(k),
                _ => None,
            }
        }
        TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), a, b) => {
            let d = linearize(p, *b, vars)?.as_const().filter(|&d| d > 0)?;
            divided(linearize(p, *a, vars)?, d, *op == BinOp::FloorMod)
        }
        _ => None,
    }
}

/// `x / d`, or `x % d` with `rem`, for a constant `d > 0` (floor
/// semantics): exact where every term of `x`'s base is a multiple of `d`
/// (the rows `4·ho + [0, 3]` of a block read at `h / 2` are `2·ho + [0,
/// 1]`), a quotient refused otherwise; a remainder is exact where, besides,
/// `x` stays within one multiple of `d`, else all of `[0, d)`.
fn divided(x: Desc, d: i64, rem: bool) -> Option<Desc> {
    let d = d as i128;
    let exact = x.base.terms.values().all(|k| k % d == 0);
    let (lo, hi) = (x.base.c.checked_add(x.lo as i128)?, x.base.c.checked_add(x.hi as i128)?);
    let (q_lo, q_hi) = (lo.div_euclid(d), hi.div_euclid(d));
    let narrow = |a: i128, b: i128| Some((i64::try_from(a).ok()?, i64::try_from(b).ok()?));
    if rem {
        let (lo, hi) = match exact && q_lo == q_hi {
            true => narrow(lo.rem_euclid(d), hi.rem_euclid(d))?,
            false => (0, i64::try_from(d - 1).ok()?),
        };
        return Some(Desc { base: Lin::default(), lo, hi });
    }
    if !exact {
        return None;
    }
    let (lo, hi) = narrow(q_lo, q_hi)?;
    let terms = x.base.terms.into_iter().map(|(a, k)| (a, k / d)).collect();
    Some(Desc { base: Lin { terms, c: 0 }, lo, hi })
}

/// The loads of attached stages' tensors, by tensor: each reading stage
/// in program order with its loads' indices in the order a walk of its
/// value meets them. (One walk of the program, not one per attached stage:
/// [`infer_with`] stays linear in a model's layers.)
fn stage_loads(p: &Program, s: &Schedules) -> Loads {
    let wanted: HashSet<TensorId> =
        (0..p.stages.len()).filter(|&i| s.attach[i].is_some()).map(|i| p.stages[i].tensor).collect();
    loads_of(p, &|t| wanted.contains(&t))
}

/// The loads of each tensor of a program, by the stage that reads it (in
/// stage order), each load's indices: what [`infer`] bounds boxes with.
pub struct Loads(HashMap<TensorId, Vec<(usize, Vec<Vec<TExprId>>)>>);

impl Loads {
    /// Every tensor's loads in `p`, for a caller that infers boxes many
    /// times over one program ([`infer_listed`]).
    pub fn of(p: &Program) -> Loads {
        loads_of(p, &|_| true)
    }

    fn get(&self, t: &TensorId) -> Option<&Vec<(usize, Vec<Vec<TExprId>>)>> {
        self.0.get(t)
    }
}

/// The loads in `p` of the tensors `wanted` accepts.
fn loads_of(p: &Program, wanted: &dyn Fn(TensorId) -> bool) -> Loads {
    fn walk(p: &Program, e: TExprId, wanted: &dyn Fn(TensorId) -> bool, out: &mut Vec<(TensorId, Vec<TExprId>)>) {
        if let TExpr::Load(x, idx) = p.expr(e) {
            if wanted(*x) {
                out.push((*x, idx.clone()));
            }
        }
        for c in p.children(e) {
            walk(p, c, wanted, out);
        }
    }
    let mut by_tensor: HashMap<TensorId, Vec<(usize, Vec<Vec<TExprId>>)>> = HashMap::new();
    for (qi, st) in p.stages.iter().enumerate() {
        let mut found = Vec::new();
        walk(p, st.value, wanted, &mut found);
        for (t, idx) in found {
            let list = by_tensor.entry(t).or_default();
            match list.last_mut() {
                Some((q, idxs)) if *q == qi => idxs.push(idx),
                _ => list.push((qi, vec![idx])),
            }
        }
    }
    Loads(by_tensor)
}

/// The loops enclosing an attachment point, innermost last, across nested attachments.
fn enclosing_loops(s: &Schedules, owner: usize, leaf: usize) -> Vec<(usize, usize)> {
    let ss = &s.stages[owner];
    let pos = ss.leaf_pos(leaf).expect("attachment loops are leaves");
    let mut out = match &s.attach[owner] {
        Some(a) => enclosing_loops(s, a.owner, a.leaf),
        None => Vec::new(),
    };
    out.extend(ss.leaves[..=pos].iter().map(|&l| (owner, l)));
    out
}

/// Whether stage `qi` runs inside leaf position `pos` of stage `owner`:
/// attached at that loop (`Some(false)`) or at a loop nested inside it
/// (`Some(true)`); `None` when it does not run there.
fn attached_inside(s: &Schedules, qi: usize, owner: usize, pos: usize) -> Option<bool> {
    let a = s.attach[qi].as_ref()?;
    if a.owner != owner {
        return None;
    }
    let qpos = s.stages[owner].leaf_pos(a.leaf)?;
    (qpos >= pos).then_some(qpos > pos)
}

/// Check every attachment, infer its box, and rebase attached stages'
/// schedules onto their boxes. Returns the box of each attached stage.
pub fn infer(p: &Program, s: &mut Schedules) -> Result<Vec<Option<Region>>, Diagnostic> {
    infer_with(p, s, true)
}

/// [`infer`]; without `sized` (sample extents, `texc check` without
/// sizes) the size of each box is not limited.
pub fn infer_with(p: &Program, s: &mut Schedules, sized: bool) -> Result<Vec<Option<Region>>, Diagnostic> {
    let readers = stage_loads(p, s);
    infer_from(p, s, sized, &readers)
}

fn infer_from(p: &Program, s: &mut Schedules, sized: bool, readers: &Loads) -> Result<Vec<Option<Region>>, Diagnostic> {
    let attached: Vec<usize> = (0..p.stages.len()).rev().filter(|&pi| s.attach[pi].is_some()).collect();
    let mut regions: Vec<Option<Region>> = vec![None; p.stages.len()];
    for (pi, r) in infer_stages(p, s, sized, readers, &attached)? {
        regions[pi] = Some(r);
    }
    Ok(regions)
}

/// [`infer`] for the attached stages `stages` only — those an attachment
/// tried changes, latest first, every reader of one inside its owner
/// among those before it — with the program's loads found once
/// ([`Loads::of`]), their boxes by stage: a caller trying attachments to
/// one owner after another checks each without inferring every other
/// owner's boxes again (for each of a model's thousand stages, that was
/// quadratic).
pub fn infer_listed(
    p: &Program,
    s: &mut Schedules,
    loads: &Loads,
    stages: &[usize],
) -> Result<HashMap<usize, Region>, Diagnostic> {
    infer_stages(p, s, true, loads, stages)
}

/// The boxes of the attached stages `stages`, latest first, each reader
/// inside a stage's owner among those before it.
fn infer_stages(
    p: &Program,
    s: &mut Schedules,
    sized: bool,
    readers: &Loads,
    stages: &[usize],
) -> Result<HashMap<usize, Region>, Diagnostic> {
    let mut regions: HashMap<usize, Region> = HashMap::new();
    for &pi in stages {
        let Some(at) = s.attach[pi].clone() else { continue };
        let st = &p.stages[pi];
        let t = st.tensor;
        let name = &p.tensor(t).name;
        let owner_name = &p.tensor(p.stages[at.owner].tensor).name;
        let err = |m: String| Diagnostic::at(at.span, m);
        let oss = &s.stages[at.owner];
        let Some(pos) = oss.leaf_pos(at.leaf) else {
            return Err(err(format!("`{}` was split or fused after this primitive named it", oss.ivs[at.leaf].name)));
        };
        if oss.ivs[at.leaf].kind == ForKind::Vectorized {
            return Err(err(format!("cannot compute `{name}` inside the vectorized loop `{}`", oss.ivs[at.leaf].name)));
        }
        let outer = &oss.leaves[..=pos];
        // Owner variables: fixed part, range inside the attachment loop, and the owner's own offsets.
        let owner_vars: Vec<Desc> = (0..p.stages[at.owner].vars.len())
            .map(|v| {
                let d = desc(oss, v, outer);
                if s.attach[at.owner].is_some() && v < p.stages[at.owner].n_axes {
                    let off = Desc { base: Lin::atom(Atom::Off(v)), lo: 0, hi: 0 };
                    d.clone().add(&off, 1).expect("adding a fresh atom cannot overflow")
                } else {
                    d
                }
            })
            .collect();
        let mut accesses: Vec<(usize, Vec<Desc>)> = Vec::new();
        let later = readers.get(&t).into_iter().flatten().filter(|(qi, _)| *qi > pi);
        for (qi, idxs) in later.map(|(qi, idxs)| (*qi, idxs.clone())) {
            let qname = &p.tensor(p.stages[qi].tensor).name;
            let vars: Vec<Desc> = if qi == at.owner {
                owner_vars.clone()
            } else if let Some(inner) = attached_inside(s, qi, at.owner, pos) {
                // The reader runs inside `a` (at `a` or a loop nested in it): its
                // box origin is fixed at its own loop; the owner loops between
                // `a` and there still vary within one iteration of `a`.
                let r = regions.get(&qi).expect("readers come later, so their boxes are known");
                let q = &p.stages[qi];
                let widen = |l: &Lin| -> Option<Desc> {
                    let mut d = Desc::konst(0);
                    d.base.c = l.c;
                    for (atom, &k) in &l.terms {
                        let one = match atom {
                            Atom::Iv(iv) if inner => desc(oss, *iv, outer),
                            a => Desc { base: Lin::atom(a.clone()), lo: 0, hi: 0 },
                        };
                        d = d.add(&one.scale(i64::try_from(k).ok()?)?, 1)?;
                    }
                    Some(d)
                };
                let mut vars = Vec::new();
                for v in 0..q.vars.len() {
                    vars.push(if v < q.n_axes {
                        let base = widen(&r.lo[v]).ok_or_else(|| {
                            err(format!("cannot bound the part of `{name}` that `{qname}` reads: its box overflows"))
                        })?;
                        Desc { hi: base.hi + r.ext[v] - 1, ..base }
                    } else {
                        Desc::range(q.vars[v].extent)
                    });
                }
                vars
            } else {
                return Err(err(format!(
                    "`{qname}` also reads `{name}`, but it does not run inside `{owner_name}.{}`",
                    oss.ivs[at.leaf].name
                ))
                .with_note(format!(
                    "an attached stage is visible only inside its loop; attach `{qname}` there too, or do not attach `{name}`"
                )));
            };
            for idx in idxs {
                let mut ds = Vec::new();
                for &i in &idx {
                    let d = linearize(p, i, &vars).ok_or_else(|| {
                        err(format!(
                            "cannot bound the part of `{name}` that `{qname}` reads: index `{}` is not affine \
                             (nor a quotient by a constant that divides its steps)",
                            texc_compiler::print::expr(p, &p.stages[qi], i)
                        ))
                    })?;
                    ds.push(d);
                }
                accesses.push((qi, ds));
            }
        }
        if accesses.is_empty() {
            return Err(err(format!(
                "`{owner_name}` does not read `{name}`, so `{name}` cannot be computed inside it"
            )));
        }
        let shape = &p.tensor(t).shape;
        let (mut lo, mut ext, mut guard) = (Vec::new(), Vec::new(), Vec::new());
        for (d, &size) in shape.iter().enumerate() {
            let first = &accesses[0].1[d];
            let mut base = first.base.clone();
            base.c = 0;
            let (mut min, mut max) = (i128::MAX, i128::MIN);
            for (qi, ds) in &accesses {
                let x = &ds[d];
                let mut b = x.base.clone();
                b.c = 0;
                if b != base {
                    return Err(err(format!(
                        "`{}` reads `{name}` along dimension {d} at positions that do not move together; \
                         texc computes one box of `{name}` per iteration",
                        p.tensor(p.stages[*qi].tensor).name
                    )));
                }
                min = min.min(x.base.c + x.lo as i128);
                max = max.max(x.base.c + x.hi as i128);
            }
            let e = max - min + 1;
            let size128 = size as i128;
            if e >= size128 || base.terms.is_empty() && min <= 0 && max >= size128 - 1 {
                lo.push(Lin::constant(0));
                ext.push(size);
                guard.push(false);
                continue;
            }
            base.c = min;
            // The box stays in the tensor if it does for every value of the owner's loops.
            let mut range = (base.c, base.c);
            let mut known = true;
            for (a, &k) in &base.terms {
                match a {
                    Atom::Iv(iv) => {
                        let (x, y) = value_range(oss, *iv);
                        let (a, b) = (k.saturating_mul(x as i128), k.saturating_mul(y as i128));
                        range.0 = range.0.saturating_add(a.min(b));
                        range.1 = range.1.saturating_add(a.max(b));
                    }
                    Atom::Off(_) => known = false,
                }
            }
            guard.push(!(known && range.0 >= 0 && range.1 + e <= size128));
            lo.push(base);
            ext.push(e as i64);
        }
        let local_shape = match &at.layout {
            None => ext.clone(),
            Some(l) => l
                .iter()
                .map(|d| match *d {
                    LayoutDim::Whole(x) => ext[x],
                    LayoutDim::Div(x, c) => (ext[x] + c - 1) / c,
                    LayoutDim::Rem(x, c) => c.min(ext[x]),
                })
                .collect(),
        };
        let bytes = local_shape.iter().product::<i64>() * p.tensor(t).elem.size() as i64;
        if sized && bytes > MAX_LOCAL_BYTES {
            return Err(err(format!(
                "the part of `{name}` computed per iteration of `{owner_name}.{}` takes {bytes} bytes; \
                 an attached buffer may take at most {MAX_LOCAL_BYTES}",
                oss.ivs[at.leaf].name
            ))
            .with_note("attach it at an inner loop, or split the loops inside the attachment point"));
        }
        if s.stages[pi].leaves.iter().any(|&l| s.stages[pi].ivs[l].kind == ForKind::Parallel)
            && enclosing_loops(s, at.owner, at.leaf).iter().any(|&(o, l)| s.stages[o].ivs[l].kind == ForKind::Parallel)
        {
            return Err(err(format!("`{name}` has a parallel loop but runs inside a parallel loop of `{owner_name}`")));
        }
        s.stages[pi].rebase(&ext);
        regions.insert(pi, Region { lo, ext, guard, local_shape });
    }
    Ok(regions)
}
