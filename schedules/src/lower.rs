//! Lowering a scheduled program to the loop IR.
//!
//! Each stage becomes loop nests over its leaf iteration variables. The
//! value of every original variable is rebuilt from the leaves (`outer *
//! factor + inner` for splits, `/` and `%` for fusions); splits that do not
//! divide their extent add a guard around the body, so tails are computed
//! exactly once. A reduction stage becomes an init nest (over its spatial
//! leaves) storing the identity and an update nest folding each term in;
//! one whose register block resumes the sums of slices outside it starts
//! the first slice from the identity in the block instead (no init nest).
//!
//! Attached stages (`compute_at`, `cache_read`) are lowered where their
//! owner's attachment loop opens: inside it, an `Alloc` of the stage's box
//! buffer holds the stage's nests (over its box, its axes offset by the
//! box origin, stores guarded where the box may leave the tensor), then the
//! rest of the owner's body. Loads of a visible attached buffer are
//! rewritten to box-relative, laid-out indices.

use crate::attach::{Atom, Lin, Region};
use crate::index;
use crate::ir::{ForKind, GpuDim, LoopFunc, Stmt};
use crate::normalize::subst;
use crate::schedule::{LayoutDim, Schedules, StageSchedule};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use texc_compiler::ops::{BinOp, MathFn, ReduceOp};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

/// Lower a scheduled program; `regions` are the boxes of attached stages
/// ([`crate::attach::infer`]).
pub fn lower(mut p: Program, s: &Schedules, regions: &[Option<Region>]) -> LoopFunc {
    let stages = std::mem::take(&mut p.stages);
    let full: Vec<Vec<i64>> = stages.iter().map(|st| p.tensor(st.tensor).shape.clone()).collect();
    let mut f = LoopFunc {
        p,
        vars: Vec::new(),
        body: Vec::new(),
        shared: Default::default(),
        registers: Default::default(),
        rolled: Default::default(),
    };
    for (st, r) in stages.iter().zip(regions) {
        if let Some(r) = r {
            f.p.tensors[st.tensor.0 as usize].shape = r.local_shape.clone();
        }
    }
    // Loops of attached stages are named after their stage: they nest inside other stages' loops.
    let mut s = s.clone();
    for (si, ss) in s.stages.iter_mut().enumerate() {
        if s.attach[si].is_some() {
            let t = &f.p.tensor(stages[si].tensor).name;
            ss.ivs.iter_mut().for_each(|v| v.name = format!("{t}.{}", v.name));
        }
    }
    let s = &s;
    let attached = s.attachment_points();
    let lw = Lowerer { stages: &stages, s, regions, full: &full, attached, scope: RefCell::new(HashMap::new()) };
    let epilogues = s.epilogues();
    for si in 0..stages.len() {
        if s.attach[si].is_none() && !epilogues.contains(&si) {
            let body = lw.stage(&mut f, si, None);
            f.body.extend(body);
        }
    }
    f.p.stages = stages;
    crate::versioning::version_tails(&mut f);
    crate::guards::drop_proven_guards(&mut f);
    f
}

/// Whether loop `leaf` of a GPU stage lies in a launch but outside its
/// thread loops: a stage attached there is computed once per block, by the
/// block's threads together, into a buffer they share (shared memory).
fn attached_at_block_level(owner: &StageSchedule, leaf: usize) -> bool {
    let pos = owner.leaves.iter().position(|&l| l == leaf).expect("an attachment loop is a leaf");
    owner.leaves.iter().any(|&l| owner.ivs[l].kind.is_gpu())
        && !owner.leaves[..=pos].iter().any(|&l| matches!(owner.ivs[l].kind, ForKind::Thread(_)))
}

/// Where an attached stage stores: its box origin per axis (an expression
/// of the enclosing loops), which axes need a guard, and the layout.
struct Placement {
    origin: Vec<TExprId>,
    guard: Vec<bool>,
    full: Vec<i64>,
    layout: Option<Vec<LayoutDim>>,
}

struct Lowerer<'a> {
    stages: &'a [Stage],
    s: &'a Schedules,
    regions: &'a [Option<Region>],
    /// Shapes of the stages' tensors before attached ones became boxes.
    full: &'a [Vec<i64>],
    /// [`Schedules::attachment_points`].
    attached: HashMap<(usize, usize), Vec<usize>>,
    /// Attached buffers visible at the point being lowered.
    scope: RefCell<HashMap<TensorId, Rc<Placement>>>,
}

struct Nest<'a> {
    ss: &'a StageSchedule,
    /// Loop variable of each leaf in this nest.
    loop_var: HashMap<usize, VarId>,
    memo: HashMap<usize, TExprId>,
}

impl Nest<'_> {
    /// The value of iteration variable `iv` in terms of this nest's loops.
    fn value(&mut self, f: &mut LoopFunc, iv: usize) -> TExprId {
        if let Some(&e) = self.memo.get(&iv) {
            return e;
        }
        let span = Default::default();
        let e = if let Some(&v) = self.loop_var.get(&iv) {
            f.p.alloc(TExpr::Var(v), Ty::Index, span)
        } else if let Some((o, i, factor)) = self.ss.split_children(iv) {
            let (o, i) = (self.value(f, o), self.value(f, i));
            let k = f.p.alloc(TExpr::Int(factor), Ty::Index, span);
            let m = f.p.alloc(TExpr::Binary(BinOp::Mul, o, k), Ty::Index, span);
            f.p.alloc(TExpr::Binary(BinOp::Add, m, i), Ty::Index, span)
        } else if let Some((fused, inner_ext, is_outer)) = self.ss.fused_parent(iv) {
            let fv = self.value(f, fused);
            let k = f.p.alloc(TExpr::Int(inner_ext), Ty::Index, span);
            let op = if is_outer { BinOp::FloorDiv } else { BinOp::FloorMod };
            let e = f.p.alloc(TExpr::Binary(op, fv, k), Ty::Index, span);
            // Every access, store and guard of the nest reads this one value.
            index::eliminate_div_mod(f, e)
        } else {
            // Not part of this nest (a reduction variable in an init nest).
            f.p.alloc(TExpr::Int(0), Ty::Index, span)
        };
        self.memo.insert(iv, e);
        e
    }

    /// `parent < extent` for each tail that is not handled by partitioning.
    fn guards(&mut self, f: &mut LoopFunc, tails: &[Tail]) -> Option<TExprId> {
        let span = Default::default();
        let mut cond: Option<TExprId> = None;
        for t in tails {
            let val = self.value(f, t.parent);
            let k = f.p.alloc(TExpr::Int(self.ss.ivs[t.parent].extent), Ty::Index, span);
            let c = f.p.alloc(TExpr::Binary(BinOp::Lt, val, k), Ty::Elem(ElemType::Bool), span);
            cond = Some(match cond {
                Some(prev) => f.p.alloc(TExpr::Binary(BinOp::And, prev, c), Ty::Elem(ElemType::Bool), span),
                None => c,
            });
        }
        cond
    }
}

/// Whether `iv` derives only from spatial roots.
fn is_spatial(ss: &StageSchedule, iv: usize) -> bool {
    !ss.ivs[iv].reduce
}

/// A split whose factor does not divide its extent: its outer leaf, inner
/// leaf, number of full tiles and the size of the last one.
#[derive(Clone, Copy)]
struct Tail {
    parent: usize,
    outer: usize,
    inner: usize,
    factor: i64,
    full: i64,
    rest: i64,
}

fn tails(ss: &StageSchedule, relevant: &dyn Fn(usize) -> bool) -> Vec<Tail> {
    let mut out = Vec::new();
    for (parent, v) in ss.ivs.iter().enumerate() {
        if !relevant(parent) {
            continue;
        }
        if let Some((o, i, _)) = ss.split_children(parent) {
            let f = ss.ivs[i].extent;
            if ss.ivs[o].extent * f != v.extent {
                out.push(Tail { parent, outer: o, inner: i, factor: f, full: v.extent / f, rest: v.extent % f });
            }
        }
    }
    out
}

/// Tails of the splits among `leaves`: those that partitioning handles (the
/// split's outer loop encloses its inner loop) and those that keep a guard.
fn split_tails(ss: &StageSchedule, leaves: &[usize], relevant: &dyn Fn(usize) -> bool) -> (Vec<Tail>, Vec<Tail>) {
    let pos = |iv: usize| leaves.iter().position(|&l| l == iv);
    // A bound loop's extent is its grid or block size: it cannot be
    // partitioned into a second, shorter loop, so its tails keep a guard.
    let bound = |iv: usize| ss.ivs[iv].kind.is_gpu();
    // Nor is a loop partitioned around a reduction over threads, which
    // `crate::cross_thread` rewrites as one loop.
    let cross_thread_inside =
        |o: usize| leaves[o..].iter().any(|&l| ss.ivs[l].reduce && ss.ivs[l].kind == ForKind::Thread(GpuDim::X));
    tails(ss, relevant).into_iter().partition(|t| {
        !bound(t.outer)
            && !bound(t.inner)
            && matches!((pos(t.outer), pos(t.inner)), (Some(o), Some(i)) if o < i && !cross_thread_inside(o))
    })
}

type Bounds = HashMap<usize, (i64, i64)>;
type Terminal<'a> = dyn Fn(&mut LoopFunc, &Bounds, &mut HashMap<usize, VarId>) -> Vec<Stmt> + 'a;
type Make<'a> = dyn Fn(&mut LoopFunc, &mut Nest) -> Stmt + 'a;
type Guard<'a> = dyn Fn(&mut LoopFunc, &mut Nest) -> Option<TExprId> + 'a;
/// Called where an attachment loop opens: (leaf, loop variables so far, the
/// rest of the body) → the statements inside that loop.
type AttachFn<'a> =
    dyn Fn(&mut LoopFunc, usize, &HashMap<usize, VarId>, &mut dyn FnMut(&mut LoopFunc) -> Vec<Stmt>) -> Vec<Stmt> + 'a;

struct Attacher<'a> {
    leaves: Vec<usize>,
    run: &'a AttachFn<'a>,
}

fn and(f: &mut LoopFunc, a: Option<TExprId>, b: TExprId) -> TExprId {
    match a {
        Some(a) => f.p.alloc(TExpr::Binary(BinOp::And, a, b), Ty::Elem(ElemType::Bool), Default::default()),
        None => b,
    }
}

/// The innermost statement of a nest: `make`'s store, guarded by `guarded`
/// tails and by `extra` (an attached stage's box leaving its tensor).
fn store_terminal<'a>(
    ss: &'a StageSchedule,
    guarded: &'a [Tail],
    make: &'a Make<'a>,
    extra: &'a Guard<'a>,
) -> Box<Terminal<'a>> {
    Box::new(move |f, _bounds, vars| {
        let mut nest = Nest { ss, loop_var: vars.clone(), memo: HashMap::new() };
        let store = make(f, &mut nest);
        let mut guard = nest.guards(f, guarded);
        if let Some(g) = extra(f, &mut nest) {
            guard = Some(and(f, guard, g));
        }
        vec![match guard {
            Some(cond) => Stmt::If { cond, then: vec![store] },
            None => store,
        }]
    })
}

/// Emit one loop nest over `leaves`. Tails are handled by loop
/// partitioning where the split's outer loop encloses its inner loop: the
/// full tiles run without a guard, then the last tile runs with a shorter
/// inner loop. Other tails keep a guard around the body.
fn emit_nest(
    f: &mut LoopFunc,
    ss: &StageSchedule,
    leaves: Vec<usize>,
    make: &Make,
    extra: &Guard,
    spatial_only: bool,
    attach: Option<&Attacher>,
) -> Vec<Stmt> {
    let relevant = |iv: usize| !spatial_only || is_spatial(ss, iv);
    let (partitioned, guarded) = split_tails(ss, &leaves, &relevant);
    let terminal = store_terminal(ss, &guarded, make, extra);
    let ctx = NestCtx { ss, leaves: &leaves, partitioned: &partitioned, terminal: &*terminal, attach };
    ctx.level(f, 0, &HashMap::new(), &mut HashMap::new())
}

struct NestCtx<'a> {
    ss: &'a StageSchedule,
    leaves: &'a [usize],
    partitioned: &'a [Tail],
    terminal: &'a Terminal<'a>,
    attach: Option<&'a Attacher<'a>>,
}

impl NestCtx<'_> {
    /// Loops from leaf `depth` inward. `bounds` fixes (lo, extent) of leaves
    /// in a partition; `vars` maps leaves to their loop variables.
    fn level(&self, f: &mut LoopFunc, depth: usize, bounds: &Bounds, vars: &mut HashMap<usize, VarId>) -> Vec<Stmt> {
        if depth == self.leaves.len() {
            return (self.terminal)(f, bounds, vars);
        }
        let leaf = self.leaves[depth];
        let iv = &self.ss.ivs[leaf];
        if let Some(t) = self.partitioned.iter().find(|t| t.outer == leaf) {
            // Full tiles, then the last one with a shorter inner loop.
            let mut out = Vec::new();
            for (lo, extent, inner) in [(0, t.full, t.factor), (t.full, 1, t.rest)] {
                if extent == 0 || inner == 0 {
                    continue;
                }
                let mut b = bounds.clone();
                b.insert(t.inner, (0, inner));
                out.extend(self.emit_loop(f, depth, leaf, lo, extent, &b, vars));
            }
            return out;
        }
        let (lo, extent) = bounds.get(&leaf).copied().unwrap_or((0, iv.extent));
        self.emit_loop(f, depth, leaf, lo, extent, bounds, vars)
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_loop(
        &self,
        f: &mut LoopFunc,
        depth: usize,
        leaf: usize,
        lo: i64,
        extent: i64,
        bounds: &Bounds,
        vars: &mut HashMap<usize, VarId>,
    ) -> Vec<Stmt> {
        let iv = &self.ss.ivs[leaf];
        let var = f.new_var(iv.name.clone(), lo + extent);
        vars.insert(leaf, var);
        let body = match self.attach {
            Some(a) if a.leaves.contains(&leaf) => {
                let outer = vars.clone();
                (a.run)(f, leaf, &outer, &mut |f| self.level(f, depth + 1, bounds, vars))
            }
            _ => self.level(f, depth + 1, bounds, vars),
        };
        vars.remove(&leaf);
        vec![Stmt::For { var, lo, extent, kind: iv.kind, body }]
    }
}

/// `a op b` on indices: an index, or a bool for comparisons and logic.
pub(crate) fn index_bin(f: &mut LoopFunc, op: BinOp, a: TExprId, b: TExprId) -> TExprId {
    let ty = if op.is_comparison() || op.is_logic() { Ty::Elem(ElemType::Bool) } else { Ty::Index };
    f.p.alloc(TExpr::Binary(op, a, b), ty, Default::default())
}

/// `T[..] = value` for every element of `T` (of shape `shape`) as a launch
/// of its own: a grid of blocks of 256 threads, consecutive threads on
/// consecutive elements. A tensorized stage starts so: its tiles belong to
/// warps, and the nest over them would give each thread a whole tile.
fn grid_fill(f: &mut LoopFunc, t: TensorId, shape: &[i64], value: TExprId) -> Stmt {
    const THREADS: i64 = 256;
    let n: i64 = shape.iter().product();
    let threads = THREADS.min(n.max(1));
    let blocks = (n + threads - 1) / threads;
    let name = f.p.tensor(t).name.clone();
    let (b, th) = (f.new_var(format!("{name}.fill.b"), blocks), f.new_var(format!("{name}.fill.t"), threads));
    let bv = f.p.alloc(TExpr::Var(b), Ty::Index, Default::default());
    let tv = f.p.alloc(TExpr::Var(th), Ty::Index, Default::default());
    let k = index_int(f, threads);
    let base = index_bin(f, BinOp::Mul, bv, k);
    let e = index_bin(f, BinOp::Add, base, tv);
    let mut indices = Vec::new();
    let mut stride = n;
    for &d in shape {
        stride /= d.max(1);
        let q = if stride > 1 {
            let s = index_int(f, stride);
            f.p.alloc(TExpr::Binary(BinOp::FloorDiv, e, s), Ty::Index, Default::default())
        } else {
            e
        };
        let dk = index_int(f, d);
        indices.push(f.p.alloc(TExpr::Binary(BinOp::FloorMod, q, dk), Ty::Index, Default::default()));
    }
    let mut store = Stmt::Store { tensor: t, indices, value };
    if blocks * threads != n {
        let nk = index_int(f, n);
        let cond = index_bin(f, BinOp::Lt, e, nk);
        store = Stmt::If { cond, then: vec![store] };
    }
    let inner = Stmt::For { var: th, lo: 0, extent: threads, kind: ForKind::Thread(GpuDim::X), body: vec![store] };
    Stmt::For { var: b, lo: 0, extent: blocks, kind: ForKind::Block(GpuDim::X), body: vec![inner] }
}

pub(crate) fn index_int(f: &mut LoopFunc, k: i64) -> TExprId {
    f.p.alloc(TExpr::Int(k), Ty::Index, Default::default())
}

/// Indices of a box buffer from box-relative coordinates `t`, through the layout.
fn laid_out(f: &mut LoopFunc, t: &[TExprId], layout: Option<&[LayoutDim]>) -> Vec<TExprId> {
    let Some(layout) = layout else {
        return t.to_vec();
    };
    layout
        .iter()
        .map(|d| match *d {
            LayoutDim::Whole(x) => t[x],
            LayoutDim::Div(x, c) => index::div_mod(f, t[x], c).0,
            LayoutDim::Rem(x, c) => index::div_mod(f, t[x], c).1,
        })
        .collect()
}

impl Lowerer<'_> {
    /// The loop nests of stage `si`; `place` says where it stores when it is attached.
    fn stage(&self, f: &mut LoopFunc, si: usize, place: Option<&Placement>) -> Vec<Stmt> {
        let st = &self.stages[si];
        let ss = &self.s.stages[si];
        if let Some(fl) = ss.flash {
            debug_assert!(place.is_none(), "an attention stage is never attached");
            return crate::flash::lower(f, st, fl);
        }
        let elem = f.p.tensor(st.tensor).elem;
        let ty = Ty::Elem(elem);
        let run = |f: &mut LoopFunc,
                   leaf: usize,
                   vars: &HashMap<usize, VarId>,
                   inner: &mut dyn FnMut(&mut LoopFunc) -> Vec<Stmt>| {
            self.attach_point(f, si, place, leaf, vars, inner)
        };
        let leaves: Vec<usize> = (0..ss.ivs.len()).filter(|&l| self.attached.contains_key(&(si, l))).collect();
        let attacher = Attacher { leaves, run: &run };
        let attach = (!attacher.leaves.is_empty()).then_some(&attacher);
        let store_idx = |f: &mut LoopFunc, nest: &mut Nest| -> Vec<TExprId> {
            let axes: Vec<TExprId> = (0..st.n_axes).map(|a| nest.value(f, a)).collect();
            match place {
                Some(pl) => laid_out(f, &axes, pl.layout.as_deref()),
                None => axes,
            }
        };
        let value_of = |f: &mut LoopFunc, nest: &mut Nest, e: TExprId| -> TExprId {
            let map: HashMap<VarId, TExprId> = (0..st.vars.len())
                .map(|v| {
                    let x = nest.value(f, v);
                    let x = match place {
                        Some(pl) if v < st.n_axes && f.p.expr(pl.origin[v]) != &TExpr::Int(0) => {
                            index_bin(f, BinOp::Add, pl.origin[v], x)
                        }
                        _ => x,
                    };
                    (v as VarId, x)
                })
                .collect();
            let e = subst(&mut f.p, e, &map, &HashMap::new());
            self.localize(f, e);
            index::eliminate_div_mod(f, e)
        };
        // An attached stage never computes outside its tensor.
        let domain = |f: &mut LoopFunc, nest: &mut Nest| -> Option<TExprId> {
            let pl = place?;
            let mut cond = None;
            for d in (0..st.n_axes).filter(|&d| pl.guard[d]) {
                let t = nest.value(f, d);
                let g = index_bin(f, BinOp::Add, pl.origin[d], t);
                let (zero, size) = (index_int(f, 0), index_int(f, pl.full[d]));
                let ge = index_bin(f, BinOp::Ge, g, zero);
                let lt = index_bin(f, BinOp::Lt, g, size);
                let both = and(f, Some(ge), lt);
                cond = Some(and(f, cond, both));
            }
            cond
        };
        match f.p.expr(st.value).clone() {
            TExpr::Reduce(op, _, body) => {
                let init = |f: &mut LoopFunc, nest: &mut Nest| {
                    let indices = store_idx(f, nest);
                    let value = f.p.alloc(TExpr::reduce_identity(op, Ty::Elem(elem)), ty, st.span);
                    Stmt::Store { tensor: st.tensor, indices, value }
                };
                let update = |f: &mut LoopFunc, nest: &mut Nest| {
                    let indices = store_idx(f, nest);
                    let term = value_of(f, nest, body);
                    let acc = f.p.alloc(TExpr::Load(st.tensor, indices.clone()), ty, st.span);
                    let value = combine(f, op, acc, term, ty, st.span);
                    Stmt::Store { tensor: st.tensor, indices, value }
                };
                let cached = ss.cache_write.as_ref().map(|(at, name)| CachedParts {
                    op,
                    body,
                    at: *at,
                    name,
                    store_idx: &store_idx,
                    value_of: &value_of,
                    attached: place.is_some(),
                });
                if let Some(parts) = cached.as_ref().filter(|_| !ss.cache_write_resumes) {
                    return self.cached_reduction(f, si, parts, &domain, attach);
                }
                // Blocks that resume the sums of slices start the first slice
                // from the identity themselves: no nest of the output's own.
                if let Some(parts) = cached.as_ref().filter(|c| first_slice_starts(ss, c.at, c.attached)) {
                    return self.cached_reduction(f, si, parts, &domain, attach);
                }
                // The output starts from the identity: a whole sum, or the
                // slices' sums that cached blocks resume.
                let spatial: Vec<usize> = ss.leaves.iter().copied().filter(|&l| is_spatial(ss, l)).collect();
                let gpu = ss.leaves.iter().any(|&l| ss.ivs[l].kind.is_gpu());
                let mut out = if ss.tensorize.is_some() && gpu && place.is_none() {
                    let identity = f.p.alloc(TExpr::reduce_identity(op, Ty::Elem(elem)), ty, st.span);
                    vec![grid_fill(f, st.tensor, &self.full[si], identity)]
                } else {
                    emit_nest(f, ss, spatial, &init, &domain, true, None)
                };
                if let Some(parts) = &cached {
                    out.extend(self.cached_reduction(f, si, parts, &domain, attach));
                    return out;
                }
                out.extend(emit_nest(f, ss, ss.leaves.clone(), &update, &domain, false, attach));
                out
            }
            _ => {
                let make = |f: &mut LoopFunc, nest: &mut Nest| {
                    let indices = store_idx(f, nest);
                    let value = value_of(f, nest, st.value);
                    Stmt::Store { tensor: st.tensor, indices, value }
                };
                emit_nest(f, ss, ss.leaves.clone(), &make, &domain, false, attach)
            }
        }
    }

    /// Where loop `leaf` of stage `owner` opens: the buffers of the stages
    /// attached there, their nests, then the rest of the owner's body.
    fn attach_point(
        &self,
        f: &mut LoopFunc,
        owner: usize,
        owner_place: Option<&Placement>,
        leaf: usize,
        vars: &HashMap<usize, VarId>,
        inner: &mut dyn FnMut(&mut LoopFunc) -> Vec<Stmt>,
    ) -> Vec<Stmt> {
        let mut nest = Nest { ss: &self.s.stages[owner], loop_var: vars.clone(), memo: HashMap::new() };
        let attached = self.attached.get(&(owner, leaf)).map_or(&[][..], Vec::as_slice);
        let mut places = Vec::new();
        // The loops of this copy of the owner's nest (loop partitioning makes
        // shorter copies), for guards that only the last tile needs.
        let oss = &self.s.stages[owner];
        let hi: HashMap<usize, i64> = vars.iter().map(|(&l, &v)| (l, f.vars[v as usize].extent - 1)).collect();
        let leaf_hi = |l: usize| hi.get(&l).copied();
        for &pi in attached {
            let r = self.regions[pi].as_ref().expect("attached stages have inferred boxes");
            let guard: Vec<bool> = (0..r.lo.len())
                .map(|d| {
                    r.guard[d]
                        && !matches!(crate::attach::origin_range(oss, &r.lo[d], &leaf_hi),
                            Some((lo, hi)) if lo >= 0 && hi + r.ext[d] <= self.full[pi][d])
                })
                .collect();
            let origin = r.lo.iter().map(|l| self.materialize(f, l, &mut nest, owner_place)).collect();
            let layout = self.s.attach[pi].as_ref().and_then(|a| a.layout.clone());
            let pl = Rc::new(Placement { origin, guard, full: self.full[pi].clone(), layout });
            self.scope.borrow_mut().insert(self.stages[pi].tensor, pl.clone());
            places.push(pl);
        }
        let mut body = Vec::new();
        // Shared buffers are computed by the block's threads together: a
        // barrier before them (every thread is done with their last contents)
        // and one after (all of them are written before anyone reads them);
        // consecutive shared buffers share their barriers.
        let mut pending = false;
        let block_level = attached_at_block_level(oss, leaf);
        for (&pi, pl) in attached.iter().zip(&places) {
            let shared = block_level || self.s.attach[pi].as_ref().is_some_and(|a| a.shared);
            // Stages computed at the block level may read the one before
            // (a variance reads the mean): a barrier between each.
            if shared && (!pending || block_level) {
                body.push(Stmt::Barrier);
            }
            if !shared && std::mem::take(&mut pending) {
                body.push(Stmt::Barrier);
            }
            if shared {
                f.shared.insert(self.stages[pi].tensor);
                pending = true;
            }
            body.extend(self.stage(f, pi, Some(pl)));
        }
        if pending {
            body.push(Stmt::Barrier);
        }
        body.extend(inner(f));
        for &pi in attached.iter().rev() {
            self.scope.borrow_mut().remove(&self.stages[pi].tensor);
            body = vec![Stmt::Alloc { tensor: self.stages[pi].tensor, body }];
        }
        body
    }

    /// A box origin as an expression of the owner's loops.
    fn materialize(&self, f: &mut LoopFunc, l: &Lin, nest: &mut Nest, owner_place: Option<&Placement>) -> TExprId {
        // Box origins and their coefficients come from in-bounds indices: they fit 64 bits.
        let fit = |x: i128| i64::try_from(x).expect("box origins fit 64 bits");
        let mut acc = index_int(f, fit(l.c));
        for (a, &k) in &l.terms {
            let v = match a {
                Atom::Iv(iv) => nest.value(f, *iv),
                Atom::Off(axis) => owner_place.expect("offsets only of attached owners").origin[*axis],
            };
            let k = index_int(f, fit(k));
            let term = index_bin(f, BinOp::Mul, v, k);
            acc = index_bin(f, BinOp::Add, acc, term);
        }
        index::simplify(f, acc)
    }

    /// Rewrite loads of visible attached buffers to box-relative, laid-out indices.
    fn localize(&self, f: &mut LoopFunc, e: TExprId) {
        for c in f.p.children(e) {
            self.localize(f, c);
        }
        if let TExpr::Load(t, idx) = f.p.expr(e).clone() {
            let Some(pl) = self.scope.borrow().get(&t).cloned() else { return };
            let rel: Vec<TExprId> = idx.iter().zip(&pl.origin).map(|(&i, &o)| index::sub(f, i, o)).collect();
            let idx = laid_out(f, &rel, pl.layout.as_deref());
            f.p.exprs[e.0 as usize] = TExpr::Load(t, idx);
        }
    }

    /// A reduction with `cache_write S at S.a -> L`: inside loop `a`, the block of
    /// `S` that the inner loops compute accumulates in a local buffer `L`
    /// (private to the iteration, so registers after LLVM's SROA), which is
    /// initialised first and written back to `S` at the end.
    fn cached_reduction(
        &self,
        f: &mut LoopFunc,
        si: usize,
        c: &CachedParts,
        domain: &Guard,
        attach: Option<&Attacher>,
    ) -> Vec<Stmt> {
        let (st, ss) = (&self.stages[si], &self.s.stages[si]);
        let (op, elem) = (c.op, f.p.tensor(st.tensor).elem);
        let p = ss.leaves.iter().position(|&l| l == c.at).expect("`at` is a leaf (checked by the schedule)");
        let outer: Vec<usize> = ss.leaves[..=p].to_vec();
        let inner: Vec<usize> = ss.leaves[p + 1..].to_vec();
        let s_in: Vec<usize> = inner.iter().copied().filter(|&l| is_spatial(ss, l)).collect();
        let shape: Vec<i64> = s_in.iter().map(|&l| ss.ivs[l].extent).collect();
        f.p.tensors.push(TensorDecl { name: c.name.to_string(), elem, shape, role: TensorRole::Temp, span: st.span });
        let local = TensorId(f.p.tensors.len() as u32 - 1);
        let (partitioned, guarded) = split_tails(ss, &ss.leaves, &|_| true);
        let guarded_spatial: Vec<Tail> = guarded.iter().copied().filter(|t| is_spatial(ss, t.parent)).collect();
        let ty = Ty::Elem(elem);
        let local_idx = |f: &mut LoopFunc, nest: &Nest| -> Vec<TExprId> {
            s_in.iter().map(|l| f.p.alloc(TExpr::Var(nest.loop_var[l]), Ty::Index, st.span)).collect()
        };
        // An integer sum that its epilogue adds a term to (a bias) starts
        // from that term instead: one addition fewer per element of the block.
        let epilogue = ss.epilogue.map(|e| &self.stages[e]);
        let eligible = guarded_spatial.is_empty() && !c.attached && ss.tensorize.is_none();
        let addend = epilogue
            .filter(|_| eligible && op == ReduceOp::Sum && elem.is_int())
            .and_then(|e| Some((e, integer_addend(&f.p, e.value, st.tensor)?)));
        let epilogue_value = match addend {
            Some((e, a)) => Some(crate::normalize::replace_node(&mut f.p, e.value, a.sum, a.load)),
            None => epilogue.map(|e| e.value),
        };
        let addend = addend.map(|(_, a)| a);
        let resumes = ss.cache_write_resumes;
        // A resumed block holds one slice's sums: no epilogue may store them
        // (`fold_epilogues` leaves such stages alone).
        debug_assert!(!resumes || epilogue.is_none(), "a resumed block has no epilogue");
        // The one reduction loop outside the block, where its first
        // iteration starts the block from the identity (and no init nest
        // stores it in the output first).
        let slice_loop = first_slice_starts(ss, c.at, c.attached)
            .then(|| ss.leaves.iter().copied().find(|&l| ss.ivs[l].reduce))
            .flatten();
        let init = |f: &mut LoopFunc, nest: &mut Nest| {
            let indices = local_idx(f, nest);
            let value = match addend {
                Some(a) => (c.value_of)(f, nest, a.term),
                None if resumes => {
                    let from = (c.store_idx)(f, nest);
                    let sums = f.p.alloc(TExpr::Load(st.tensor, from), ty, st.span);
                    match slice_loop {
                        // The sums of the slices before, past the first.
                        Some(l) => {
                            let v = f.p.alloc(TExpr::Var(nest.loop_var[&l]), Ty::Index, st.span);
                            let zero = index_int(f, 0);
                            let later = index_bin(f, BinOp::Gt, v, zero);
                            let identity = f.p.alloc(TExpr::reduce_identity(op, Ty::Elem(elem)), ty, st.span);
                            f.p.alloc(TExpr::Select(later, sums, identity), ty, st.span)
                        }
                        None => sums,
                    }
                }
                None => f.p.alloc(TExpr::reduce_identity(op, Ty::Elem(elem)), ty, st.span),
            };
            Stmt::Store { tensor: local, indices, value }
        };
        let update = |f: &mut LoopFunc, nest: &mut Nest| {
            let indices = local_idx(f, nest);
            let term = (c.value_of)(f, nest, c.body);
            let acc = f.p.alloc(TExpr::Load(local, indices.clone()), ty, st.span);
            let value = combine(f, op, acc, term, ty, st.span);
            Stmt::Store { tensor: local, indices, value }
        };
        let write_back = |f: &mut LoopFunc, nest: &mut Nest| {
            let indices = (c.store_idx)(f, nest);
            let from = local_idx(f, nest);
            match epilogue.zip(epilogue_value) {
                // The epilogue's variables are this stage's axes (it reads
                // the accumulated tensor at its own point: `fold_epilogues`
                // in `strategy/cpu/attach.rs`).
                Some((e, value)) => {
                    let value = (c.value_of)(f, nest, value);
                    let value = read_local(f, value, st.tensor, local, &from);
                    Stmt::Store { tensor: e.tensor, indices, value }
                }
                None => {
                    let value = f.p.alloc(TExpr::Load(local, from), ty, st.span);
                    Stmt::Store { tensor: st.tensor, indices, value }
                }
            }
        };
        let no_guard = |_: &mut LoopFunc, _: &mut Nest| None;
        // Resumed sums are read from the output only where it has them (the
        // block's lanes past a guarded tail keep whatever the local holds, and
        // are never written back).
        let init_t = match resumes {
            true => store_terminal(ss, &guarded_spatial, &init, domain),
            false => store_terminal(ss, &[], &init, &no_guard),
        };
        let update_t = store_terminal(ss, &guarded, &update, domain);
        let back_t = store_terminal(ss, &guarded_spatial, &write_back, domain);
        let (back, along_output) = write_back_order(ss, st, &s_in);
        let block = |f: &mut LoopFunc, bounds: &Bounds, vars: &mut HashMap<usize, VarId>| -> Vec<Stmt> {
            let mut body = Vec::new();
            for (leaves, t, at) in [(&s_in, &init_t, None), (&inner, &update_t, attach), (&back, &back_t, None)] {
                let ctx = NestCtx { ss, leaves, partitioned: &partitioned, terminal: &**t, attach: at };
                let mut nest = ctx.level(f, 0, bounds, vars);
                if let Some(l) = along_output.filter(|_| std::ptr::eq(leaves, &back)) {
                    vectorize_innermost(f, &mut nest, &ss.ivs[l].name);
                }
                body.extend(nest);
            }
            vec![Stmt::Alloc { tensor: local, body }]
        };
        let ctx = NestCtx { ss, leaves: &outer, partitioned: &partitioned, terminal: &block, attach };
        ctx.level(f, 0, &HashMap::new(), &mut HashMap::new())
    }
}

/// Whether a cached reduction whose block (at leaf `at`) resumes the sums
/// of the slices of one reduction loop outside it starts the first slice
/// from the identity in the block itself, rather than reading it from an
/// init nest that stored it in the whole output first (a pass over the
/// output, and on several threads a parallel loop of its own): on CPUs,
/// for a stage that is neither attached (whose boxes' guards the block's
/// start does not see) nor tensorized. (`crate::zeroing` proves that
/// each later slice reads what the slice before stored.)
fn first_slice_starts(ss: &StageSchedule, at: usize, attached: bool) -> bool {
    let Some(at) = ss.leaves.iter().position(|&l| l == at) else { return false };
    let outside: Vec<usize> = ss.leaves[..=at].iter().copied().filter(|&l| ss.ivs[l].reduce).collect();
    ss.cache_write_resumes
        && matches!(outside[..], [l] if matches!(ss.ivs[l].kind, ForKind::Serial | ForKind::Unrolled))
        && !attached
        && ss.tensorize.is_none()
        && !ss.leaves.iter().any(|&l| ss.ivs[l].kind.is_gpu())
}

/// The order of a cached reduction's write-back loops over `s_in`, and
/// the leaf to vectorize there: the block's own order (its vectors are
/// the schedule's), except that a block of AMX tile accumulators (rows,
/// then columns of 16 `i32`, in serial loops) is written back along the
/// output's last axis, innermost and vectorized (a convolution's `x` of
/// `Y[n, f, y, x]`: along the columns, each element went to another line
/// of the output, and the epilogue's reads of a residual too).
fn write_back_order(ss: &StageSchedule, st: &Stage, s_in: &[usize]) -> (Vec<usize>, Option<usize>) {
    let tiles = ss.tensorize.as_ref().is_some_and(|t| t.op == crate::ir::TensorOp::TileDot);
    let last = st.n_axes.checked_sub(1);
    let along_last = |l: usize| {
        matches!(ss.ivs[l].rel, crate::schedule::Rel::Split { parent, outer: false, .. }
            if Some(parent) == last && matches!(ss.ivs[parent].rel, crate::schedule::Rel::Root(_)))
    };
    match s_in.iter().copied().find(|&l| tiles && along_last(l)) {
        Some(l) => (s_in.iter().copied().filter(|&x| x != l).chain([l]).collect(), Some(l)),
        None => (s_in.to_vec(), None),
    }
}

/// The innermost loops of `nest` named `name` vectorized.
fn vectorize_innermost(f: &LoopFunc, nest: &mut [Stmt], name: &str) {
    for s in nest {
        match s {
            Stmt::For { var, kind, body, .. } => {
                let innermost = !body.iter().any(|b| matches!(b, Stmt::For { .. }));
                if innermost && f.vars[*var as usize].name == name && *kind == ForKind::Serial {
                    *kind = ForKind::Vectorized;
                } else {
                    vectorize_innermost(f, body, name);
                }
            }
            Stmt::If { then, .. } | Stmt::Alloc { body: then, .. } => vectorize_innermost(f, then, name),
            _ => {}
        }
    }
}

/// What a cached reduction needs from its stage's lowering.
struct CachedParts<'a> {
    op: ReduceOp,
    body: TExprId,
    at: usize,
    name: &'a str,
    store_idx: &'a dyn Fn(&mut LoopFunc, &mut Nest) -> Vec<TExprId>,
    value_of: &'a dyn Fn(&mut LoopFunc, &mut Nest, TExprId) -> TExprId,
    /// Whether the stage is attached (computed in boxes, whose guards the
    /// accumulator's initialization does not see).
    attached: bool,
}

/// An epilogue's `s[..] + term` ([`integer_addend`]).
#[derive(Clone, Copy)]
struct Addend {
    /// The addition, the read of the accumulated tensor, and the other term.
    sum: TExprId,
    load: TExprId,
    term: TExprId,
}

/// The addition in epilogue `e` of a term to its one read of the integer
/// sum `s` (`f32(s[..] + bias[f]) * scale[f]`): integer addition wraps, so
/// it is associative, and the sum may start from the term. The term reads
/// only the stage's axes (an epilogue is element-wise over them:
/// `fold_epilogues` in `strategy/cpu/attach.rs`), and not `s`, which is
/// read once.
fn integer_addend(p: &Program, e: TExprId, s: TensorId) -> Option<Addend> {
    let reads_s = |l: &TExprId| matches!(p.expr(*l), TExpr::Load(t, _) if *t == s);
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, e, &mut loads);
    if loads.iter().filter(|l| reads_s(l)).count() != 1 {
        return None;
    }
    let mut stack = vec![e];
    while let Some(x) = stack.pop() {
        if let TExpr::Binary(BinOp::Add, a, b) = *p.expr(x) {
            if let Some((load, term)) = [(a, b), (b, a)].into_iter().find(|(load, _)| reads_s(load)) {
                return Some(Addend { sum: x, load, term });
            }
        }
        stack.extend(p.children(x));
    }
    None
}

/// `e` with its loads of `from` (at the write-back's point) reading `local` at `idx`.
fn read_local(f: &mut LoopFunc, e: TExprId, from: TensorId, local: TensorId, idx: &[TExprId]) -> TExprId {
    if let TExpr::Load(t, _) = f.p.expr(e) {
        if *t == from {
            return f.p.alloc(TExpr::Load(local, idx.to_vec()), f.p.ty(e), f.p.span(e));
        }
    }
    let new: Vec<TExprId> = f.p.children(e).into_iter().map(|c| read_local(f, c, from, local, idx)).collect();
    crate::normalize::with_children(&mut f.p, e, new)
}

fn combine(f: &mut LoopFunc, op: ReduceOp, acc: TExprId, term: TExprId, ty: Ty, span: texc_grammar::Span) -> TExprId {
    match op {
        ReduceOp::Sum => f.p.alloc(TExpr::Binary(BinOp::Add, acc, term), ty, span),
        ReduceOp::Prod => f.p.alloc(TExpr::Binary(BinOp::Mul, acc, term), ty, span),
        ReduceOp::Max => f.p.alloc(TExpr::Math(MathFn::Max, vec![acc, term]), ty, span),
        ReduceOp::Min => f.p.alloc(TExpr::Math(MathFn::Min, vec![acc, term]), ty, span),
    }
}
