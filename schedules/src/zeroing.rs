//! *zero*: buffers that may be read before they are stored hold zeros — a
//! local each time its `Alloc` runs, a temporary from the first statement
//! that touches it — as the loop-IR evaluator has them. Compiled code gives
//! a local an uninitialized stack array or heap block, and a temporary
//! memory an earlier one used (the memory plan), so this pass stores zeros
//! first wherever it cannot prove that every element read was stored before.
//!
//! The proof ([`covered`]): in the order statements run, every read of
//! the buffer lies inside what stores before it have written. An access's
//! indices are read as forms over digits of loops ([`crate::digits`]),
//! split into a part over the loops it shares with the other access (the
//! same iteration for both: a *fixed* part) and a part over its own loops:
//! - a store *writes a box*: each dimension's own part a sum of digits
//!   that fill an interval without gaps, different dimensions different
//!   digits, digits of one loop taking every combination (its extent a
//!   multiple of its largest weight), and its guards dropping only indices
//!   outside the buffer (a tile's, which reaches past its origin, only in
//!   views whose runs are one dimension each); boxes of stores that share
//!   their fixed parts merge where they meet (a loop's body and its split
//!   tail);
//! - a read *reads a box*, its own part's interval in each dimension,
//!   narrowed by what its guards say of the index (of each dimension too,
//!   where a run joins several: a padding copy's `y >= 1`);
//! - the read is covered where its fixed parts equal a store's and its box
//!   lies in that store's (merged) box. A store made later in the same
//!   iteration, or a read of the element a statement is about to store,
//!   does not count;
//! - except in the iteration before: a read that a guard keeps out of the
//!   first iteration of a sequential loop around it (`select(c.o > 0,
//!   Y[..], 0)`: `v > k`, `k` at least the loop's first value) is covered
//!   where stores later in that loop's body cover it as above and neither
//!   their indices and guards nor the read's indices involve the loop's
//!   variable: the iteration before stored the same elements (a product's
//!   register block resumed per slice, `crate::lower`).
//!
//! What the default schedules produce (accumulators set to the identity,
//! packs, attached stages, reductions' initial values, blocks resumed per
//! slice) is covered; the rest
//! of a hand-written nest is zeroed. A GPU block's `shared` and `registers`
//! buffers are the block's threads' together: they are not zeroed (the
//! launch rules order their stores and reads).
//!
//! Invariant after the pass: every local and temporary is [`covered`] (a
//! zeroing nest covers what it precedes).

use crate::digits::{fits_i64, Atom, Env, Forms, LoopRanges, Role, Site, Src};
use crate::interval;
use crate::ir::{ForKind, LoopFunc, Stmt};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use texc_compiler::affine::Affine;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};

/// Store zeros into every buffer that is not [`covered`] where it begins:
/// first in each `Alloc` of a local, before the first top-level statement
/// touching a temporary. Returns the buffers zeroed.
pub fn zero_uncovered(f: &mut LoopFunc, gpu: bool) -> Vec<TensorId> {
    let ranges = LoopRanges::of(f);
    let mut locals = BTreeSet::new();
    uncovered_locals(f, &ranges, &f.body, &mut locals);
    // Each temporary is checked on the top-level statements that may touch
    // it, not the whole body: linear, not quadratic, in a model's layers.
    // (The statements touching each tensor are listed once, not found by a
    // test of every statement per temporary.)
    let mut touching: HashMap<TensorId, Vec<usize>> = HashMap::new();
    for (i, s) in f.body.iter().enumerate() {
        for t in tensors_of(f, s) {
            touching.entry(t).or_default().push(i);
        }
    }
    let mut zeroed = Vec::new();
    let mut before: BTreeMap<usize, Vec<TensorId>> = BTreeMap::new();
    for t in f.live_temps() {
        let tops: &[usize] = touching.get(&t).map_or(&[], |v| v.as_slice());
        if covered_in(f, &ranges, t, tops.iter().map(|&i| &f.body[i])) {
            continue;
        }
        let at = tops.iter().copied().find(|&i| touches(f, &f.body[i], t)).unwrap_or(0);
        before.entry(at).or_default().push(t);
        zeroed.push(t);
    }
    let mut old = std::mem::take(&mut f.body);
    zero_locals(f, &mut old, &locals);
    let mut body = Vec::with_capacity(old.len() + zeroed.len());
    for (i, s) in old.into_iter().enumerate() {
        for &t in before.get(&i).into_iter().flatten() {
            body.push(if gpu { zero_launch(f, t) } else { zero_nest(f, t) });
        }
        body.push(s);
    }
    f.body = body;
    locals.into_iter().chain(zeroed).collect()
}

/// Every tensor `s` stores to or loads from (guards and indices included).
fn tensors_of(f: &LoopFunc, s: &Stmt) -> BTreeSet<TensorId> {
    fn expr(f: &LoopFunc, e: TExprId, out: &mut BTreeSet<TensorId>) {
        if let TExpr::Load(t, _) = f.p.expr(e) {
            out.insert(*t);
        }
        for c in f.p.children(e) {
            expr(f, c, out);
        }
    }
    fn walk(f: &LoopFunc, s: &Stmt, out: &mut BTreeSet<TensorId>) {
        match s {
            Stmt::For { body, .. } => body.iter().for_each(|s| walk(f, s, out)),
            Stmt::If { cond, then } => {
                expr(f, *cond, out);
                then.iter().for_each(|s| walk(f, s, out))
            }
            Stmt::Alloc { tensor, body } => {
                out.insert(*tensor);
                body.iter().for_each(|s| walk(f, s, out))
            }
            Stmt::Store { tensor, indices, value } => {
                out.insert(*tensor);
                indices.iter().chain([value]).for_each(|&e| expr(f, e, out));
            }
            Stmt::Mma { c, a, b, .. } => {
                for t in [c, a, b] {
                    out.insert(t.tensor);
                    t.origin.iter().for_each(|&e| expr(f, e, out));
                }
            }
            Stmt::Wgmma(w) => {
                out.extend([w.c.tensor, w.a.tensor, w.b.tensor]);
                w.origins().for_each(|&e| expr(f, e, out));
            }
            Stmt::TileDot(d) => {
                out.extend([d.c.tensor, d.a.tensor, d.b.tensor]);
                d.origins().for_each(|&e| expr(f, e, out));
            }
            Stmt::WarpReduce(w) => {
                out.insert(w.tensor);
            }
            Stmt::Barrier | Stmt::Async(_) | Stmt::Prefetch { .. } => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(f, s, &mut out);
    out
}

/// Locals of `body` (not a GPU block's buffers) that an `Alloc` of theirs
/// does not cover.
fn uncovered_locals(f: &LoopFunc, ranges: &LoopRanges, body: &[Stmt], out: &mut BTreeSet<TensorId>) {
    for s in body {
        match s {
            Stmt::Alloc { tensor, body } => {
                let block = f.shared.contains(tensor) || f.registers.contains(tensor);
                if !block && !covered_in(f, ranges, *tensor, body.iter()) {
                    out.insert(*tensor);
                }
                uncovered_locals(f, ranges, body, out)
            }
            s => uncovered_locals(f, ranges, s.body(), out),
        }
    }
}

fn zero_locals(f: &mut LoopFunc, body: &mut [Stmt], locals: &BTreeSet<TensorId>) {
    for s in body {
        match s {
            Stmt::Alloc { tensor, body } => {
                zero_locals(f, body, locals);
                if locals.contains(tensor) {
                    let nest = zero_nest(f, *tensor);
                    body.insert(0, nest);
                }
            }
            s => zero_locals(f, s.body_mut(), locals),
        }
    }
}

/// `t[z0, …] = 0` over every element, serial loops (code generators make
/// them a `memset` or vector stores).
fn zero_nest(f: &mut LoopFunc, t: TensorId) -> Stmt {
    let d = f.p.tensor(t).clone();
    let span = d.span;
    let zero = if d.elem.is_float() { TExpr::Float(0.0) } else { TExpr::Int(0) };
    let value = f.p.alloc(zero, Ty::Elem(d.elem), span);
    let vars: Vec<VarId> = d.shape.iter().enumerate().map(|(k, &n)| f.new_var(format!("{}.z{k}", d.name), n)).collect();
    let indices = vars.iter().map(|&v| f.p.alloc(TExpr::Var(v), Ty::Index, span)).collect();
    let mut nest = Stmt::Store { tensor: t, indices, value };
    for (&var, &extent) in vars.iter().zip(&d.shape).rev() {
        nest = Stmt::For { var, lo: 0, extent, kind: ForKind::Serial, body: vec![nest] };
    }
    nest
}

/// GPU targets: a temporary's zeros as a launch of its own, an element
/// per thread (`t[x / s₀, x / s₁ % n₁, …]` for `x = 256·b + t`).
fn zero_launch(f: &mut LoopFunc, t: TensorId) -> Stmt {
    const THREADS: i64 = 256;
    let d = f.p.tensor(t).clone();
    let span = d.span;
    let len = d.len().max(1);
    let idx = |f: &mut LoopFunc, e: TExpr| f.p.alloc(e, Ty::Index, span);
    let (b, th) = (
        f.new_var(format!("{}.z.b", d.name), (len + THREADS - 1) / THREADS),
        f.new_var(format!("{}.z.t", d.name), THREADS),
    );
    let (bv, tv, n) = (idx(f, TExpr::Var(b)), idx(f, TExpr::Var(th)), idx(f, TExpr::Int(THREADS)));
    let first = idx(f, TExpr::Binary(BinOp::Mul, bv, n));
    let x = idx(f, TExpr::Binary(BinOp::Add, first, tv));
    let mut indices = Vec::new();
    let mut stride = len;
    for (k, &extent) in d.shape.iter().enumerate() {
        stride /= extent.max(1);
        let s = idx(f, TExpr::Int(stride));
        let mut i = idx(f, TExpr::Binary(BinOp::FloorDiv, x, s));
        if k > 0 {
            let e = idx(f, TExpr::Int(extent));
            i = idx(f, TExpr::Binary(BinOp::FloorMod, i, e));
        }
        indices.push(i);
    }
    let zero = if d.elem.is_float() { TExpr::Float(0.0) } else { TExpr::Int(0) };
    let value = f.p.alloc(zero, Ty::Elem(d.elem), span);
    let end = idx(f, TExpr::Int(len));
    let inside = f.p.alloc(TExpr::Binary(BinOp::Lt, x, end), Ty::Elem(texc_compiler::types::ElemType::Bool), span);
    let store = Stmt::If { cond: inside, then: vec![Stmt::Store { tensor: t, indices, value }] };
    let threads =
        Stmt::For { var: th, lo: 0, extent: THREADS, kind: ForKind::Thread(crate::ir::GpuDim::X), body: vec![store] };
    Stmt::For {
        var: b,
        lo: 0,
        extent: (len + THREADS - 1) / THREADS,
        kind: ForKind::Block(crate::ir::GpuDim::X),
        body: vec![threads],
    }
}

/// Whether every read of `t` in `body` (in the order statements run) lies
/// in what stores before it wrote (see the module's header).
pub fn covered(f: &LoopFunc, t: TensorId, body: &[Stmt]) -> bool {
    covered_in(f, &LoopRanges::of(f), t, body.iter())
}

/// [`covered`] over statements that follow one another (those of a body
/// that may touch `t`: the others make no accesses to it).
fn covered_in<'s>(f: &LoopFunc, ranges: &LoopRanges, t: TensorId, body: impl Iterator<Item = &'s Stmt>) -> bool {
    let (mut events, mut sequential) = (Vec::new(), BTreeSet::new());
    for s in body {
        collect(f, t, std::slice::from_ref(s), (&mut Vec::new(), &mut Vec::new()), &mut sequential, &mut events);
    }
    if !events.iter().any(|e| !e.write) {
        return true;
    }
    let mut env = Env::with_ranges(ranges.clone(), Vec::new());
    for e in &events {
        e.path.iter().for_each(|&v| env.set(v, Role::Free));
    }
    let mut forms = Forms::new(f, &env);
    let sites: Vec<Site> = events.iter().map(|e| Site { indices: &e.indices, guards: &[], within: &[] }).collect();
    forms.settle(&sites);
    let check = Check { f, t, forms, written: HashMap::new(), last_view: None, ranges: ranges.clone(), sequential };
    check.all_reads_covered(&events)
}

/// An access to the buffer where it is made: its indices (a tile's origin,
/// reaching `reach` past it), the loops around it inside the scope
/// (outermost first), the guards around it.
struct Event {
    write: bool,
    indices: Vec<TExprId>,
    reach: Vec<i64>,
    path: Vec<VarId>,
    guards: Vec<TExprId>,
}

/// The accesses of `t` in `body`, in the order they are made (a store's
/// reads before its write).
/// `sequential` gathers the loops on the way whose iterations run one
/// after another, in order (serial and unrolled ones).
fn collect(
    f: &LoopFunc,
    t: TensorId,
    body: &[Stmt],
    (path, guards): (&mut Vec<VarId>, &mut Vec<TExprId>),
    sequential: &mut BTreeSet<VarId>,
    out: &mut Vec<Event>,
) {
    let reads = |e: TExprId, path: &[VarId], guards: &[TExprId], out: &mut Vec<Event>| {
        let mut loads = Vec::new();
        guarded_loads(f, e, &mut guards.to_vec(), &mut loads);
        for (idx, guards) in loads {
            if let TExpr::Load(u, idx) = f.p.expr(idx) {
                if *u == t {
                    let reach = vec![0; idx.len()];
                    out.push(Event { write: false, indices: idx.clone(), reach, path: path.to_vec(), guards });
                }
            }
        }
    };
    for s in body {
        match s {
            // A loop of no iterations runs nothing.
            Stmt::For { extent, .. } if *extent <= 0 => {}
            Stmt::For { var, kind, body, .. } => {
                // An asynchronous copy lands later: it writes nothing here.
                if *kind == ForKind::Async {
                    let mut later = Vec::new();
                    collect(f, t, body, (path, guards), sequential, &mut later);
                    out.extend(later.into_iter().filter(|e| !e.write));
                    continue;
                }
                if matches!(kind, ForKind::Serial | ForKind::Unrolled) {
                    sequential.insert(*var);
                }
                path.push(*var);
                collect(f, t, body, (path, guards), sequential, out);
                path.pop();
            }
            Stmt::Alloc { body, .. } => collect(f, t, body, (path, guards), sequential, out),
            Stmt::If { cond, then } => {
                reads(*cond, path, guards, out);
                guards.push(*cond);
                collect(f, t, then, (path, guards), sequential, out);
                guards.pop();
            }
            Stmt::Store { tensor, indices, value } => {
                for &e in indices.iter().chain([value]) {
                    reads(e, path, guards, out);
                }
                if *tensor == t {
                    let reach = vec![0; indices.len()];
                    out.push(Event {
                        write: true,
                        indices: indices.clone(),
                        reach,
                        path: path.clone(),
                        guards: guards.clone(),
                    });
                }
            }
            Stmt::Mma { op, c, a, b } => {
                let (m, n, k) = op.shape();
                for (tile, rows, cols) in [(a, m, k), (b, k, n), (c, m, n)] {
                    tile.origin.iter().for_each(|&e| reads(e, path, guards, out));
                    if tile.tensor == t {
                        let mut reach = vec![0; tile.origin.len()];
                        reach[tile.rows] += rows - 1;
                        reach[tile.cols] += cols - 1;
                        let (path, guards) = (path.clone(), guards.clone());
                        out.push(Event { write: false, indices: tile.origin.clone(), reach, path, guards });
                    }
                }
            }
            Stmt::TileDot(d) => {
                d.origins().for_each(|&e| reads(e, path, guards, out));
                // `c` read (unless the sum starts from zero), then written.
                let c = [(&d.c, d.m, d.n, true)];
                let tiles = d.tiles().map(|(x, r, c)| (x, r, c, false));
                for (tile, rows, cols, write) in tiles.into_iter().skip(usize::from(d.zero)).chain(c) {
                    if tile.tensor == t {
                        let mut reach = vec![0; tile.origin.len()];
                        reach[tile.rows] += rows - 1;
                        reach[tile.cols] += cols - 1;
                        let (path, guards) = (path.clone(), guards.clone());
                        out.push(Event { write, indices: tile.origin.clone(), reach, path, guards });
                    }
                }
            }
            Stmt::Wgmma(w) => {
                w.origins().for_each(|&e| reads(e, path, guards, out));
                let (m, n, _) = w.op.shape();
                let mut boxes: Vec<(TensorId, &[TExprId], Vec<i64>)> =
                    w.operands().iter().map(|(x, mn, k)| (x.tensor, x.origin.as_slice(), x.reach(*mn, *k))).collect();
                let mut reach = vec![0; w.c.origin.len()];
                reach[w.c.rows] += m - 1;
                reach[w.c.cols] += n - 1;
                boxes.push((w.c.tensor, &w.c.origin, reach));
                for (u, origin, reach) in boxes {
                    if u == t {
                        let (path, guards) = (path.clone(), guards.clone());
                        out.push(Event { write: false, indices: origin.to_vec(), reach, path, guards });
                    }
                }
            }
            // A warp's elements are the block's (not zeroed, see the header): read and written at once.
            Stmt::WarpReduce(w) if w.tensor == t => {
                let d = f.p.tensor(t);
                let zero = Vec::new();
                out.push(Event {
                    write: false,
                    indices: zero,
                    reach: d.shape.iter().map(|&n| n - 1).collect(),
                    path: path.clone(),
                    guards: Vec::new(),
                });
            }
            Stmt::WarpReduce(_) | Stmt::Barrier | Stmt::Async(_) | Stmt::Prefetch { .. } => {}
        }
    }
}

/// The loads `e` makes, innermost first, each with the conditions that
/// hold where it is made: `guards`, and the conditions of the `select`s
/// and `&&`s that lead to it (a `select`'s other side, and `||`, add none).
fn guarded_loads(f: &LoopFunc, e: TExprId, guards: &mut Vec<TExprId>, out: &mut Vec<(TExprId, Vec<TExprId>)>) {
    let p = &f.p;
    let (cond, first, second) = match p.expr(e) {
        TExpr::Select(c, a, b) => (*c, *a, Some(*b)),
        TExpr::Binary(BinOp::And, a, b) => (*a, *b, None),
        _ => {
            for c in p.children(e) {
                guarded_loads(f, c, guards, out);
            }
            if matches!(p.expr(e), TExpr::Load(..)) {
                out.push((e, guards.clone()));
            }
            return;
        }
    };
    guarded_loads(f, cond, guards, out);
    guards.push(cond);
    guarded_loads(f, first, guards, out);
    guards.pop();
    if let Some(other) = second {
        guarded_loads(f, other, guards, out);
    }
}

/// A box: per dimension, the interval of an access's own part, for fixed
/// parts (per dimension) that name the slice it is in.
#[derive(Clone, Debug, PartialEq)]
struct Slab {
    fixed: Vec<Affine<Atom>>,
    own: Vec<(i128, i128)>,
}

struct Check<'a> {
    f: &'a LoopFunc,
    t: TensorId,
    forms: Forms<'a>,
    /// The box each store writes, by (event, fixed loops, view; `None`: the
    /// whole buffer as one run): every read asks again of the same stores.
    written: HashMap<(usize, Vec<VarId>, Option<usize>), Option<Slab>>,
    /// The view that covered the last read covered.
    last_view: Option<usize>,
    ranges: LoopRanges,
    /// Loops whose iterations run one after another (serial, unrolled).
    sequential: BTreeSet<VarId>,
}

impl Check<'_> {
    fn all_reads_covered(mut self, events: &[Event]) -> bool {
        (0..events.len()).all(|i| {
            events[i].write || {
                let before: Vec<(usize, &Event)> = events[..i].iter().enumerate().filter(|(_, e)| e.write).collect();
                self.read_covered(&before, &events[i]) || self.covered_the_iteration_before(events, i)
            }
        })
    }

    /// Whether read `i`, made past the first iteration of a sequential loop
    /// `v` (a guard says `v > k`, `k` at least the loop's first value),
    /// reads what stores after it in `v`'s body wrote in the iteration
    /// before: with the loops they share fixed, their boxes cover the
    /// read's, and no index involves `v`, so the iteration before stored
    /// the same elements. (A product's register block, resumed per slice
    /// from the sums the slice before stored: `crate::lower`.)
    fn covered_the_iteration_before(&mut self, events: &[Event], i: usize) -> bool {
        let read = &events[i];
        let carried = read.path.iter().position(|&v| self.sequential.contains(&v) && self.past_first(read, v));
        let Some(depth) = carried else { return false };
        let v = read.path[depth];
        let writes: Vec<(usize, &Event)> = events
            .iter()
            .enumerate()
            .skip(i + 1)
            .filter(|(_, w)| w.write && shared(&w.path, &read.path) > depth)
            .collect();
        let involve_v = |xs: &[TExprId]| xs.iter().any(|&x| mentions(self.f, x, v));
        !writes.is_empty()
            && !involve_v(&read.indices)
            && !writes.iter().any(|(_, w)| involve_v(&w.indices) || involve_v(&w.guards))
            && self.read_covered(&writes, read)
    }

    /// Whether a guard of `read` says that loop `v` is past its first iteration.
    fn past_first(&self, read: &Event, v: VarId) -> bool {
        let Some(first) = self.ranges[v as usize].lo else { return false };
        let mut conjuncts = Vec::new();
        read.guards.iter().for_each(|&g| conjuncts_of(&self.f.p, g, &mut conjuncts));
        let p = &self.f.p;
        conjuncts.into_iter().any(|g| match p.expr(g) {
            TExpr::Binary(op @ (BinOp::Gt | BinOp::Ge), a, b) if p.expr(*a) == &TExpr::Var(v) => match p.expr(*b) {
                TExpr::Int(k) => *k as i128 > first || *op == BinOp::Gt && *k as i128 == first,
                _ => false,
            },
            _ => false,
        })
    }

    /// Whether the stores `writes` (each with its event's index) wrote all that `read` reads.
    fn read_covered(&mut self, writes: &[(usize, &Event)], read: &Event) -> bool {
        let mut prefixes: Vec<usize> = writes.iter().map(|(_, w)| shared(&w.path, &read.path)).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        let rank = self.f.p.tensor(self.t).shape.len();
        let views = views(rank);
        let len = extent(&self.f.p.tensor(self.t).shape, &(0..rank));
        prefixes.into_iter().any(|n| {
            let fixed: BTreeSet<VarId> = read.path[..n].iter().copied().collect();
            // A store that fills the whole buffer (a loop fused over it) covers any read.
            let whole = writes.iter().filter(|(_, w)| shared(&w.path, &read.path) == n).any(|&(j, w)| {
                self.written_box(j, w, &fixed, None, std::slice::from_ref(&(0..rank))).is_some_and(|b| {
                    b.fixed.iter().all(|x| x.terms.is_empty())
                        && b.own.first().is_some_and(|o| o.0 <= 0 && o.1 >= len - 1)
                })
            });
            // The reads of one buffer are mostly covered in the same view:
            // the one that covered the last read is tried first (which
            // view covers does not matter, only whether one does).
            let first = self.last_view.filter(|&v| v < views.len());
            let order = first.into_iter().chain((0..views.len()).filter(|&v| Some(v) != first));
            whole
                || order.map(|vi| (vi, &views[vi])).any(|(vi, view)| {
                    let Some(want) = self.slab(read, &fixed, false, view) else { return false };
                    let mut boxes: Vec<Slab> = writes
                        .iter()
                        .filter(|(_, w)| shared(&w.path, &read.path) == n)
                        .filter_map(|&(j, w)| self.written_box(j, w, &fixed, Some(vi), view))
                        .filter(|b| b.fixed == want.fixed)
                        .collect();
                    merge(&mut boxes);
                    let empty = want.own.iter().any(|r| r.0 > r.1);
                    let covered = empty
                        || boxes.iter().any(|b| b.own.iter().zip(&want.own).all(|(w, r)| w.0 <= r.0 && r.1 <= w.1));
                    if covered {
                        self.last_view = Some(vi);
                    }
                    covered
                })
        })
    }

    /// [`Check::slab`] of store `j` (`w`), remembered.
    fn written_box(
        &mut self,
        j: usize,
        w: &Event,
        fixed: &BTreeSet<VarId>,
        view_index: Option<usize>,
        view: &[Range<usize>],
    ) -> Option<Slab> {
        let key = (j, fixed.iter().copied().collect(), view_index);
        if let Some(b) = self.written.get(&key) {
            return b.clone();
        }
        let b = self.slab(w, fixed, true, view);
        self.written.insert(key, b.clone());
        b
    }

    /// The box of `e` in `view` (runs of dimensions, each one flat offset),
    /// with the loops `fixed` (and every loop outside the scope) fixed: for
    /// a store, what it writes (`None` where it leaves gaps or its guards
    /// may drop indices inside the buffer); for a read, what it may read.
    fn slab(&mut self, e: &Event, fixed: &BTreeSet<VarId>, write: bool, view: &[Range<usize>]) -> Option<Slab> {
        let shape = self.f.p.tensor(self.t).shape.clone();
        if e.indices.is_empty() && !shape.is_empty() {
            // A whole-buffer access (a warp reduction).
            let own = view.iter().map(|r| (0, extent(&shape, r) - 1)).collect();
            return (!write).then(|| Slab { fixed: Vec::new(), own });
        }
        // A read's guards narrow the intervals of its opaque terms.
        self.forms.facts = if write {
            Vec::new()
        } else {
            self.forms.facts_of(&Site { indices: &[], guards: &e.guards, within: &[] })
        };
        let slab = self.slab_under_facts(e, fixed, write, view, &shape);
        self.forms.facts.clear();
        slab
    }

    fn slab_under_facts(
        &mut self,
        e: &Event,
        fixed: &BTreeSet<VarId>,
        write: bool,
        view: &[Range<usize>],
        shape: &[i64],
    ) -> Option<Slab> {
        let own_var = |v: VarId| e.path.contains(&v) && !fixed.contains(&v);
        let mut slab = Slab { fixed: Vec::new(), own: Vec::new() };
        let mut seen: BTreeMap<Atom, usize> = BTreeMap::new();
        let mut digits_of: BTreeMap<VarId, usize> = BTreeMap::new();
        let mut forms = Vec::new();
        for (d, run) in view.iter().enumerate() {
            // A tile's rows and columns joined into one flat run are no
            // interval (an m × n tile of a row of W > n leaves gaps): a
            // store that reaches past its origin fills a box only in runs
            // of one dimension.
            if write && run.len() > 1 && run.clone().any(|k| e.reach[k] > 0) {
                return None;
            }
            let form = self.run_form(e, run.clone())?;
            let reach = run.clone().fold(0i128, |r, k| r * shape[k] as i128 + e.reach[k] as i128);
            let (mut fixed_part, mut own) = (Affine::constant(form.c), Vec::new());
            // What the own part takes (a read's opaque terms by their intervals).
            let mut values = interval::exact(0);
            let whole = self.whole_loops(&form, &own_var);
            for (atom, &k) in &form.terms {
                match atom {
                    // Every digit of a loop at `k` times its weight: `k` times the loop, every value of it.
                    Atom::Digit(Src::Var(v), w) if whole.contains_key(v) => {
                        if write && seen.insert(atom.clone(), d).is_some() {
                            return None;
                        }
                        if *w == 1 {
                            let n = whole[v];
                            own.push((k, n));
                            values = values.add(interval::range(0, n - 1).mul(interval::exact(k)));
                        }
                    }
                    Atom::Digit(Src::Var(v), w) if own_var(*v) => {
                        let size = self.forms.radix.get(&Src::Var(*v))?.digits().find(|&(dw, _)| dw == *w)?.1;
                        if write && seen.insert(atom.clone(), d).is_some() {
                            return None;
                        }
                        *digits_of.entry(*v).or_default() += 1;
                        own.push((k, size));
                        // A read's guards may fix a digit (`if f / 64 % 4 == 0`).
                        values = values.add(self.forms.digit_range(atom).mul(interval::exact(k)));
                    }
                    // A store's opaque terms of its own loops leave no box; a read's are bounded.
                    Atom::Opaque(key) if self.mentions_own(key, &own_var) => {
                        if write {
                            return None;
                        }
                        values = values.add(self.forms.opaque_interval(atom).mul(interval::exact(k)));
                    }
                    // A value read from memory another statement may change: no slice to name.
                    Atom::Opaque(key) if self.reads_changing(key) => return None,
                    _ => fixed_part = fixed_part.add(&Affine::atom(atom.clone()), k)?,
                }
            }
            // An index that may wrap is not the value its form says.
            if !fits_i64(self.forms.interval(&form)) {
                return None;
            }
            if write && !fills(&mut own) {
                return None;
            }
            let c = fixed_part.c;
            let (Some(lo), Some(hi)) = (values.lo, values.hi) else { return None };
            let (mut a, mut b) = (c + lo, c + hi + reach);
            if !write && fixed_part.terms.is_empty() {
                // What the guards say of the index narrows what may be read
                // (a guard false everywhere: nothing is).
                (a, b) = self.narrowed(&e.guards, &form, (a, b));
                // A run of several dimensions: what they say of each one
                // (a padding copy's `y >= 1` of `X[c, y - 1, x - 1]`, whose
                // flat offset `W·y + x` no guard names). Not for a tile's
                // origin, whose elements reach past it (`run_bounds` bounds
                // the origins only).
                if run.len() > 1 && reach == 0 {
                    if let Some((lo, hi)) = self.run_bounds(e, run.clone(), shape) {
                        (a, b) = (a.max(lo), b.min(hi));
                    }
                }
            }
            fixed_part.c = 0;
            slab.own.push((a, b));
            slab.fixed.push(fixed_part);
            forms.push((form, extent(shape, run)));
        }
        if write {
            // Two digits of one loop take every combination only in an exact radix.
            let exact = |v: &VarId| {
                self.forms.radix.get(&Src::Var(*v)).is_some_and(|r| r.n % r.weights.last().copied().unwrap_or(1) == 0)
            };
            if !digits_of.iter().all(|(v, &n)| n < 2 || exact(v)) {
                return None;
            }
            let runs = forms.clone();
            for (d, &i) in e.indices.iter().enumerate() {
                forms.push((self.forms.form(i)?, shape[d] as i128));
            }
            let mut conjuncts = Vec::new();
            e.guards.iter().for_each(|&g| conjuncts_of(&self.f.p, g, &mut conjuncts));
            for g in conjuncts {
                if !self.drops_only_outside(g, &forms) && !self.narrows_write(g, &runs, &own_var, &mut slab) {
                    return None;
                }
            }
        }
        Some(slab)
    }

    /// The own loops whose every digit (of more than one value) `form`
    /// has at one multiple `k` of its weight — `k` times the loop — with
    /// their numbers of values.
    fn whole_loops(&self, form: &Affine<Atom>, own_var: &dyn Fn(VarId) -> bool) -> BTreeMap<VarId, i128> {
        let mut out = BTreeMap::new();
        for r in self.forms.radix.iter().filter_map(|(src, r)| match src {
            Src::Var(v) if own_var(*v) => Some((*v, r)),
            _ => None,
        }) {
            let (v, radix) = r;
            let digits: Vec<(i128, i128)> = radix.digits().filter(|&(_, size)| size > 1).collect();
            let coeff = |w: i128| form.coeff(&Atom::Digit(Src::Var(v), w));
            let Some(&(w0, _)) = digits.first() else { continue };
            let k = coeff(w0) / w0;
            if digits.len() > 1 && k != 0 && digits.iter().all(|&(w, _)| coeff(w) == k * w) {
                out.insert(v, radix.n);
            }
        }
        out
    }

    /// The flat offset of `e` within the dimensions `run` (divisions and
    /// remainders that add up to their dividend merged, see `crate::digits`).
    fn run_form(&mut self, e: &Event, run: Range<usize>) -> Option<Affine<Atom>> {
        let shape = &self.f.p.tensor(self.t).shape;
        let mut flat = Affine::constant(0);
        let mut stride = 1i128;
        for d in run.rev() {
            flat = flat.add(&self.forms.form(e.indices[d])?.scale(stride)?, 1)?;
            stride = stride.checked_mul(shape[d] as i128)?;
        }
        self.forms.merge_pairs(&mut flat)?;
        Some(flat)
    }

    /// `(a, b)`, the values `index` may take, narrowed by what `guards` say of it.
    fn narrowed(&mut self, guards: &[TExprId], index: &Affine<Atom>, (mut a, mut b): (i128, i128)) -> (i128, i128) {
        for (op, bound) in self.bounds_of(guards, index) {
            match op {
                BinOp::Lt => b = b.min(bound - 1),
                BinOp::Le => b = b.min(bound),
                BinOp::Gt => a = a.max(bound + 1),
                BinOp::Ge => a = a.max(bound),
                _ => {}
            }
        }
        (a, b)
    }

    /// The flat offsets read `e` may make within the dimensions `run`,
    /// each dimension's index bounded by its values and by what `e`'s
    /// guards say of it: `Σ lo·stride ..= Σ hi·stride`. None where an index
    /// has no form or no bounds.
    fn run_bounds(&mut self, e: &Event, run: Range<usize>, shape: &[i64]) -> Option<(i128, i128)> {
        let (mut lo, mut hi, mut stride) = (0i128, 0i128, 1i128);
        for d in run.rev() {
            let form = self.forms.form(e.indices[d])?;
            let iv = self.forms.interval(&form);
            let (a, b) = self.narrowed(&e.guards, &form, (iv.lo?, iv.hi?));
            if a > b {
                // Never made.
                return Some((1, 0));
            }
            lo = lo.checked_add(a.checked_mul(stride)?)?;
            hi = hi.checked_add(b.checked_mul(stride)?)?;
            stride = stride.checked_mul(shape[d] as i128)?;
        }
        Some((lo, hi))
    }

    /// The comparisons `index op bound` that conjuncts of `guards` make
    /// of `index`'s value.
    fn bounds_of(&mut self, guards: &[TExprId], index: &Affine<Atom>) -> Vec<(BinOp, i128)> {
        let mut conjuncts = Vec::new();
        guards.iter().for_each(|&g| conjuncts_of(&self.f.p, g, &mut conjuncts));
        let mut out = Vec::new();
        for g in conjuncts {
            let TExpr::Binary(op, a, b) = self.f.p.expr(g) else { continue };
            let (op, a, b) = (*op, *a, *b);
            let (Some(x), Some(y)) = (self.forms.form(a), self.forms.form(b)) else { continue };
            // Sides that may wrap compare other values than their forms say.
            if !fits_i64(self.forms.interval(&x)) || !fits_i64(self.forms.interval(&y)) {
                continue;
            }
            // `x op y` as `index op bound` where `x − y = index − bound`.
            let Some(diff) = x.add(&y, -1) else { continue };
            if diff.terms.is_empty() && !holds(op, diff.c) {
                // Never made: an empty box.
                return vec![(BinOp::Lt, i128::MIN / 4), (BinOp::Gt, i128::MAX / 4)];
            }
            if diff.terms == index.terms && !index.terms.is_empty() {
                out.push((op, index.c - diff.c));
            }
        }
        out
    }

    /// Whether the opaque term `key` reads a tensor other than an input.
    fn reads_changing(&self, key: &str) -> bool {
        let Some(&e) = self.forms.opaques.get(key) else { return true };
        let mut loads = Vec::new();
        crate::analysis::loads_in(&self.f.p, e, &mut loads);
        loads.iter().any(|&l| {
            matches!(self.f.p.expr(l), TExpr::Load(t, _) if self.f.p.tensor(*t).role != texc_compiler::tir::TensorRole::Input)
        })
    }

    fn mentions_own(&self, key: &str, own_var: &dyn Fn(VarId) -> bool) -> bool {
        let Some(&e) = self.forms.opaques.get(key) else { return true };
        (0..self.f.vars.len() as VarId).any(|v| own_var(v) && self.f.p.mentions(e, v))
    }

    /// Whether guard conjunct `g` bounds one run's index (whose fixed part
    /// is a constant: `slab.own` holds its values) by terms of loops that
    /// are not the store's own (shared with the read, or around the
    /// buffer: one value for both) — `index + rest < 0` and the like, a
    /// block's last, shorter rows (`i.b * 6 + i.r < 64`) — narrowing the
    /// store's box there to what it writes for every value of `rest`.
    fn narrows_write(
        &mut self,
        g: TExprId,
        runs: &[(Affine<Atom>, i128)],
        own_var: &dyn Fn(VarId) -> bool,
        slab: &mut Slab,
    ) -> bool {
        let p = &self.f.p;
        let TExpr::Binary(op, a, b) = p.expr(g) else { return false };
        let (op, a, b) = (*op, *a, *b);
        if !matches!(op, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge) {
            return false;
        }
        let (Some(x), Some(y)) = (self.forms.form(a), self.forms.form(b)) else { return false };
        if !fits_i64(self.forms.interval(&x)) || !fits_i64(self.forms.interval(&y)) {
            return false;
        }
        let Some(diff) = x.add(&y, -1) else { return false };
        let of_fixed =
            |f: &Affine<Atom>| f.terms.keys().all(|atom| matches!(atom, Atom::Digit(Src::Var(v), _) if !own_var(*v)));
        for (d, (index, _)) in runs.iter().enumerate() {
            if !slab.fixed[d].terms.is_empty() || index.terms.is_empty() {
                continue;
            }
            // `diff = sign · index + rest`, `rest` over the fixed loops.
            for sign in [1, -1] {
                let Some(rest) = diff.clone().add(index, -sign) else { continue };
                if !of_fixed(&rest) || rest.terms.keys().any(|atom| index.coeff(atom) != 0) {
                    continue;
                }
                let iv = self.forms.interval(&rest);
                let (Some(lo), Some(hi)) = (iv.lo, iv.hi) else { continue };
                // `sign · index op -rest`, for the rest's worst value.
                let (ra, rb) = &mut slab.own[d];
                match (sign, op) {
                    (1, BinOp::Lt) => *rb = (*rb).min(-hi - 1),
                    (1, BinOp::Le) => *rb = (*rb).min(-hi),
                    (1, BinOp::Gt) => *ra = (*ra).max(-lo + 1),
                    (1, BinOp::Ge) => *ra = (*ra).max(-lo),
                    (_, BinOp::Lt) => *ra = (*ra).max(hi + 1),
                    (_, BinOp::Le) => *ra = (*ra).max(hi),
                    (_, BinOp::Gt) => *rb = (*rb).min(lo - 1),
                    (_, _) => *rb = (*rb).min(lo),
                }
                return true;
            }
        }
        false
    }

    /// Whether guard `g` holds at every index inside the buffer: each
    /// conjunct compares one index (or flat offset of a run of dimensions,
    /// `indices`: forms with their extents) with a constant beyond its ends.
    fn drops_only_outside(&mut self, g: TExprId, indices: &[(Affine<Atom>, i128)]) -> bool {
        let p = &self.f.p;
        let TExpr::Binary(op, a, b) = p.expr(g) else { return false };
        let (op, a, b) = (*op, *a, *b);
        if op == BinOp::And {
            return self.drops_only_outside(a, indices) && self.drops_only_outside(b, indices);
        }
        if !op.is_comparison() {
            return false;
        }
        let (Some(x), Some(y)) = (self.forms.form(a), self.forms.form(b)) else { return false };
        if !fits_i64(self.forms.interval(&x)) || !fits_i64(self.forms.interval(&y)) {
            return false;
        }
        let Some(diff) = x.add(&y, -1) else { return false };
        // `diff = s·(index − index.c) + diff.c` for one index.
        indices.iter().any(|(index, n)| {
            let sign = if diff.terms == index.terms {
                1
            } else if diff.terms.len() == index.terms.len() && diff.terms.iter().all(|(a, k)| index.coeff(a) == -k) {
                -1
            } else {
                return false;
            };
            let at = |x: i128| sign * (x - index.c) + diff.c;
            [0, n - 1].iter().all(|&x| holds(op, at(x)))
        })
    }
}

/// The ways to cut `rank` dimensions into runs of consecutive ones that
/// the proof tries: every way up to [`MAX_VIEW_RANK`] dimensions; beyond,
/// each dimension alone, all together, and each pair of neighbours joined.
fn views(rank: usize) -> Vec<Vec<Range<usize>>> {
    if rank == 0 {
        return vec![Vec::new()];
    }
    if rank > MAX_VIEW_RANK {
        let alone: Vec<Range<usize>> = (0..rank).map(|d| d..d + 1).collect();
        let mut out = vec![alone.clone(), vec![0..rank]];
        for d in 0..rank - 1 {
            let mut pair: Vec<Range<usize>> = (0..d).map(|k| k..k + 1).collect();
            pair.push(d..d + 2);
            pair.extend((d + 2..rank).map(|k| k..k + 1));
            out.push(pair);
        }
        return out;
    }
    (0..1u32 << (rank - 1))
        .map(|cuts| {
            let mut runs = Vec::new();
            let mut start = 0;
            for d in 1..rank {
                if cuts & (1 << (d - 1)) != 0 {
                    runs.push(start..d);
                    start = d;
                }
            }
            runs.push(start..rank);
            runs
        })
        .collect()
}

/// Ranks up to which [`views`] tries every cut (2^(rank−1) of them).
const MAX_VIEW_RANK: usize = 6;

/// Elements in the run `r` of dimensions of `shape`.
fn extent(shape: &[i64], r: &Range<usize>) -> i128 {
    shape[r.clone()].iter().map(|&n| n as i128).product()
}

/// How many loops two paths share, outermost first.
fn shared(a: &[VarId], b: &[VarId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Whether expression `e` reads loop variable `v`.
fn mentions(f: &LoopFunc, e: TExprId, v: VarId) -> bool {
    f.p.expr(e) == &TExpr::Var(v) || f.p.children(e).into_iter().any(|c| mentions(f, c, v))
}

/// Merge boxes that agree on every dimension but one, where they meet or
/// overlap in that one, until none do.
fn merge(boxes: &mut Vec<Slab>) {
    'again: loop {
        for i in 0..boxes.len() {
            for j in i + 1..boxes.len() {
                if let Some(m) = joined(&boxes[i], &boxes[j]) {
                    boxes[i] = m;
                    boxes.remove(j);
                    continue 'again;
                }
            }
        }
        return;
    }
}

fn joined(a: &Slab, b: &Slab) -> Option<Slab> {
    let differ: Vec<usize> = (0..a.own.len()).filter(|&d| a.own[d] != b.own[d]).collect();
    match differ[..] {
        [] => Some(a.clone()),
        [d] => {
            let (x, y) = (a.own[d], b.own[d]);
            (x.0 <= y.1 + 1 && y.0 <= x.1 + 1).then(|| {
                let mut m = a.clone();
                m.own[d] = (x.0.min(y.0), x.1.max(y.1));
                m
            })
        }
        _ => None,
    }
}

/// The conjuncts of `g` (`a && b` is both of `a`'s and `b`'s).
fn conjuncts_of(p: &texc_compiler::tir::Program, g: TExprId, out: &mut Vec<TExprId>) {
    match p.expr(g) {
        TExpr::Binary(BinOp::And, a, b) => {
            conjuncts_of(p, *a, out);
            conjuncts_of(p, *b, out);
        }
        _ => out.push(g),
    }
}

/// Whether `value op 0`.
fn holds(op: BinOp, value: i128) -> bool {
    match op {
        BinOp::Lt => value < 0,
        BinOp::Le => value <= 0,
        BinOp::Gt => value > 0,
        BinOp::Ge => value >= 0,
        BinOp::Eq => value == 0,
        // `!=` is not convex: holding at both ends says nothing between them.
        _ => false,
    }
}

/// Whether terms `k·d` (`d` in `0..size`) sum to every value of an
/// interval, without gaps.
fn fills(terms: &mut [(i128, i128)]) -> bool {
    terms.sort_unstable_by_key(|&(k, _)| k.abs());
    let mut span = 0i128;
    for &(k, size) in terms.iter().filter(|&&(_, size)| size > 1) {
        if k.abs() > span + 1 {
            return false;
        }
        span += k.abs() * (size - 1);
    }
    true
}

/// Whether `s` reads or writes `t`.
fn touches(f: &LoopFunc, s: &Stmt, t: TensorId) -> bool {
    let mut events = Vec::new();
    collect(f, t, std::slice::from_ref(s), (&mut Vec::new(), &mut Vec::new()), &mut BTreeSet::new(), &mut events);
    !events.is_empty()
}
