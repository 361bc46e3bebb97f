//! The *cross-thread reduction* step of lowering (GPU targets): a stage
//! whose reduction loop is bound to `thread.x` (`bind S.ri to thread.x`)
//! has its reduction computed by a block's threads together.
//!
//! Each thread accumulates its part of the reduction into its own element
//! of a buffer (the bound loop becomes the outermost of the reduction
//! loops — the reduction is reassociated, as `rfactor` does on CPUs, which
//! changes float rounding only). The parts then meet:
//!
//! - **in warp shuffles** where the elements are 4 or 8 bytes and the
//!   launch's threads are along x only: the parts are in registers (a
//!   `registers` buffer), a [`WarpReduce`] combines each warp's; with
//!   several warps, lane 0 of each stores its warp's total to shared
//!   memory and, after one barrier, the first lanes of warp 0 reduce those
//!   the same way. A thread loop that is not whole warps is widened to
//!   them (or to a power of two below 32), its extra threads holding the
//!   identity:
//!
//! ```text
//! for n in 0..N block.x:
//!   registers S.part: f32[128]:
//!     barrier
//!     for ri in 0..128 thread.x:
//!       S.part[ri] = 0.0f32
//!       if ri < 100:
//!         S.part[ri] = S.part[ri] + X[n, ri]
//!     warp_reduce sum S.part by 32
//!     shared S.warps: f32[4]:
//!       for S.w in 0..128 thread.x:
//!         if S.w % 32 == 0:
//!           S.warps[S.w / 32] = S.part[S.w]
//!       barrier
//!       for S.l in 0..4 thread.x:
//!         S.part[S.l] = S.warps[S.l]
//!       warp_reduce sum S.part by 4
//!       for S.one in 0..1 thread.x:
//!         S[n] = S[n] + S.part[S.one]
//! ```
//!
//! - **else in a tree in shared memory**, halving the parts at each step
//!   with a barrier after each, then one thread combines what is left:
//!
//! ```text
//! for n in 0..N block.x:              for n in 0..N block.x:
//!   for ro in 0..4:                     shared S.part: f32[256]:
//!     for ri in 0..256 thread.x:  =>      barrier
//!       S[n] = S[n] + X[n, ro*256+ri]     for ri in 0..256 thread.x:
//!                                           S.part[ri] = 0.0f32
//!                                           for ro in 0..4:
//!                                             S.part[ri] = S.part[ri] + X[n, ro*256+ri]
//!                                         barrier
//!                                         for S.one in 0..1 thread.x:
//!                                           for S.u in 0..256:
//!                                             S[n] = S[n] + S.part[S.u]
//! ```
//!
//! Requirements (errors otherwise, at the `bind`): the loops outside the
//! reduction loops are not bound to threads (one block per element), and
//! the reduction loops hold nothing but themselves, guards and the update.
//!
//! [`warp_reductions_as_loops`] turns warp reductions into loops for the
//! CPU emulation of GPU code, whose threads run one after another.

use crate::ir::{ForKind, GpuDim, LoopFunc, Stmt, WarpReduce};
use crate::schedule::Schedules;
use texc_compiler::ops::{BinOp, MathFn, ReduceOp};
use texc_compiler::tir::{TExpr, TExprId, TensorDecl, TensorId, TensorRole, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_grammar::{Diagnostic, Span};

pub fn lower_cross_thread(f: &mut LoopFunc, s: &Schedules) -> Result<(), Diagnostic> {
    for (si, ss) in s.stages.iter().enumerate() {
        let bound =
            ss.leaves.iter().copied().find(|&l| ss.ivs[l].reduce && ss.ivs[l].kind == ForKind::Thread(GpuDim::X));
        let Some(leaf) = bound else { continue };
        let span = ss.annotated_at.iter().rev().find(|(iv, _)| *iv == leaf).map_or(Span::default(), |(_, s)| *s);
        let tensor = f.p.stages[si].tensor;
        // Lowering names an attached stage's loops after the stage (`m.d`).
        let loop_name = |iv: usize| match s.attach[si] {
            Some(_) => format!("{}.{}", name(f, tensor), ss.ivs[iv].name),
            None => ss.ivs[iv].name.clone(),
        };
        let job = Job {
            tensor,
            thread: loop_name(leaf),
            reductions: ss.leaves.iter().filter(|&&l| ss.ivs[l].reduce).map(|&l| loop_name(l)).collect(),
            warps: false,
        };
        let mut body = std::mem::take(&mut f.body);
        let mut r = Ok(false);
        for launch in body.iter_mut() {
            let job = Job { warps: !has_thread_loop_of(launch, &[GpuDim::Y, GpuDim::Z]), ..job.clone() };
            r = match (r, rewrite(f, std::slice::from_mut(launch), &job, false)) {
                (Ok(a), Ok(b)) => Ok(a || b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        f.body = body;
        match r {
            Ok(true) => {}
            Ok(false) => {
                return Err(Diagnostic::at(
                    span,
                    format!("no loop nest of `{}` has `{}`", name(f, job.tensor), job.thread),
                ))
            }
            Err(why) => return Err(Diagnostic::at(span, why)),
        }
    }
    one_thread_stores(f);
    Ok(())
}

#[derive(Clone)]
struct Job {
    tensor: TensorId,
    /// The reduction loop bound to `thread.x`.
    thread: String,
    /// Every reduction loop of the stage.
    reductions: Vec<String>,
    /// The launch's threads are along x only, so its warps are groups of
    /// 32 consecutive `thread.x` (shuffles can combine their parts).
    warps: bool,
}

fn name(f: &LoopFunc, t: TensorId) -> String {
    f.p.tensor(t).name.clone()
}

fn var_name(f: &LoopFunc, v: VarId) -> &str {
    &f.vars[v as usize].name
}

/// Rewrite every reduction nest of the job's stage in `body` (loop
/// partitioning makes several copies); whether there was one.
fn rewrite(f: &mut LoopFunc, body: &mut [Stmt], job: &Job, in_threads: bool) -> Result<bool, String> {
    let mut any = false;
    for s in body.iter_mut() {
        let root = match &*s {
            Stmt::For { var, .. } => job.reductions.iter().any(|r| r == var_name(f, *var)),
            _ => false,
        };
        if root && stores_to(s, job.tensor) {
            if in_threads {
                return Err(format!(
                    "`{}` is a reduction bound to thread.x, so `{}`'s other loops are not bound to threads: each \
                     block computes one element",
                    job.thread,
                    name(f, job.tensor)
                ));
            }
            *s = cross_thread(f, s, job)?;
            any = true;
            continue;
        }
        any |= match s {
            Stmt::For { kind, body, .. } => {
                let threads = in_threads || matches!(kind, ForKind::Thread(_));
                rewrite(f, body, job, threads)?
            }
            Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => rewrite(f, body, job, in_threads)?,
            Stmt::Store { .. }
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => false,
        };
    }
    Ok(any)
}

fn stores_to(s: &Stmt, t: TensorId) -> bool {
    match s {
        Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
            body.iter().any(|s| stores_to(s, t))
        }
        Stmt::Store { tensor, .. } => *tensor == t,
        Stmt::Barrier
        | Stmt::Async(_)
        | Stmt::Mma { .. }
        | Stmt::Wgmma(_)
        | Stmt::TileDot(_)
        | Stmt::WarpReduce(_)
        | Stmt::Prefetch { .. } => false,
    }
}

/// The update of the stage: `S[idx] = combine(S[idx], term)`, and the
/// guards around it that do not involve the reduction's loops (the tails
/// of the stage's own splits): they guard the store of the total too.
struct Update {
    indices: Vec<TExprId>,
    value: TExprId,
    guards: Vec<TExprId>,
}

impl Update {
    /// `store` under the update's guards that do not involve the reduction.
    fn guarded(&self, f: &mut LoopFunc, store: Stmt) -> Stmt {
        let Some((&first, rest)) = self.guards.split_first() else { return store };
        let bool_ty = Ty::Elem(ElemType::Bool);
        let cond = rest
            .iter()
            .fold(first, |acc, &g| f.p.alloc(TExpr::Binary(BinOp::And, acc, g), bool_ty, Default::default()));
        Stmt::If { cond, then: vec![store] }
    }
}

fn cross_thread(f: &mut LoopFunc, root: &Stmt, job: &Job) -> Result<Stmt, String> {
    // The bound loop, and the reduction nest without it.
    let mut found: Option<(VarId, i64, i64)> = None;
    let mut update: Option<Update> = None;
    let inner = strip(f, root, job, &mut Path::default(), &mut found, &mut update)?;
    let (t, lo, extent) =
        found.ok_or_else(|| format!("`{}` is not inside `{}`'s reduction loops", job.thread, name(f, job.tensor)))?;
    let up = update.expect("the nest stores to the stage");
    let decl = f.p.tensor(job.tensor).clone();
    let ty = Ty::Elem(decl.elem);
    let op = reduce_op(f, up.value)?;
    if job.warps && by_warps(decl.elem, lo, extent) {
        return Ok(warp_reduction(f, inner, t, extent, job.tensor, up, op));
    }
    // The shared buffer of partial results, one per thread.
    let part = new_buffer(f, &decl, ".part", extent);
    f.shared.insert(part);
    let var_expr = |f: &mut LoopFunc, v: VarId| f.p.alloc(TExpr::Var(v), Ty::Index, Default::default());
    let tv = var_expr(f, t);
    let slot = if lo == 0 {
        tv
    } else {
        let l = f.p.alloc(TExpr::Int(lo), Ty::Index, Default::default());
        f.p.alloc(TExpr::Binary(BinOp::Sub, tv, l), Ty::Index, Default::default())
    };
    let identity = f.p.alloc(TExpr::reduce_identity(op, ty), ty, Default::default());
    // Each thread: its part.
    let mut thread_body = vec![Stmt::Store { tensor: part, indices: vec![slot], value: identity }];
    let mut inner = inner;
    retarget(f, &mut inner, job.tensor, part, slot);
    thread_body.extend(inner);
    // One thread: the parts into the element.
    let one = f.new_var(&format!("{}.one", decl.name), 1);
    let zero = f.p.alloc(TExpr::Int(0), Ty::Index, Default::default());
    let part_u = f.p.alloc(TExpr::Load(part, vec![zero]), ty, Default::default());
    let acc = f.p.alloc(TExpr::Load(job.tensor, up.indices.clone()), ty, Default::default());
    let combined = combine_like(f, up.value, acc, part_u);
    let total = Stmt::Store { tensor: job.tensor, indices: up.indices.clone(), value: combined };
    let total = up.guarded(f, total);
    let threads = Stmt::For { var: t, lo, extent, kind: ForKind::Thread(GpuDim::X), body: thread_body };
    let mut body = vec![Stmt::Barrier, threads, Stmt::Barrier];
    body.extend(tree(f, part, &decl.name, extent, up.value));
    body.push(Stmt::For { var: one, lo: 0, extent: 1, kind: ForKind::Thread(GpuDim::X), body: vec![total] });
    Ok(Stmt::Alloc { tensor: part, body })
}

/// A buffer of `n` elements of `like`'s type, named after it.
fn new_buffer(f: &mut LoopFunc, like: &TensorDecl, suffix: &str, n: i64) -> TensorId {
    let t = TensorId(f.p.tensors.len() as u32);
    f.p.tensors.push(TensorDecl {
        name: format!("{}{suffix}", like.name),
        elem: like.elem,
        shape: vec![n],
        role: TensorRole::Temp,
        ..like.clone()
    });
    t
}

/// Whether the parts of a reduction over `thread.x` loop `lo..lo + n` can
/// be combined by warp shuffles: 4- or 8-byte elements (a shuffle moves 32
/// bits) of at least two threads.
fn by_warps(elem: ElemType, lo: i64, n: i64) -> bool {
    lo == 0 && n >= 2 && matches!(elem.size(), 4 | 8) && elem != ElemType::Bool
}

/// The threads a warp reduction of `n` parts runs on: whole warps, or a
/// power of two of the first lanes of one (the extra threads hold the
/// identity).
fn warp_width(n: i64) -> i64 {
    if n < WARP {
        (n as u64).next_power_of_two() as i64
    } else {
        (n + WARP - 1) / WARP * WARP
    }
}

const WARP: i64 = 32;

/// The reduction's parts combined by warp shuffles: each thread's part in
/// its registers, a warp reduction, and where there are several warps,
/// one part per warp through shared memory into a second warp reduction.
/// One barrier (two with several warps) instead of a tree's ⌈log₂ n⌉.
fn warp_reduction(
    f: &mut LoopFunc,
    mut inner: Vec<Stmt>,
    t: VarId,
    n: i64,
    stage: TensorId,
    up: Update,
    op: ReduceOp,
) -> Stmt {
    let decl = f.p.tensor(stage).clone();
    let ty = Ty::Elem(decl.elem);
    let idx = |f: &mut LoopFunc, e: TExpr| f.p.alloc(e, Ty::Index, Default::default());
    let identity = f.p.alloc(TExpr::reduce_identity(op, ty), ty, Default::default());
    let parts = n;
    let n = warp_width(parts);
    let part = new_buffer(f, &decl, ".part", n);
    f.registers.insert(part);
    let tv = idx(f, TExpr::Var(t));
    let mut thread_body = vec![Stmt::Store { tensor: part, indices: vec![tv], value: identity }];
    retarget(f, &mut inner, stage, part, tv);
    if n > parts {
        let k = idx(f, TExpr::Int(parts));
        let cond = f.p.alloc(TExpr::Binary(BinOp::Lt, tv, k), Ty::Elem(ElemType::Bool), Default::default());
        thread_body.push(Stmt::If { cond, then: inner });
    } else {
        thread_body.extend(inner);
    }
    let mut body = vec![
        Stmt::Barrier,
        Stmt::For { var: t, lo: 0, extent: n, kind: ForKind::Thread(GpuDim::X), body: thread_body },
        Stmt::WarpReduce(WarpReduce { tensor: part, lanes: n.min(WARP), op }),
    ];
    let warps = n / WARP;
    let mut last = &mut body;
    if warps > 1 {
        // Lane 0 of each warp: the warp's total into shared memory; then
        // the first lanes of warp 0 (a power of two of them) reduce those.
        let totals = new_buffer(f, &decl, ".warps", warps);
        f.shared.insert(totals);
        let lane = f.new_var(format!("{}.w", decl.name), n);
        let lv = idx(f, TExpr::Var(lane));
        let w = idx(f, TExpr::Int(WARP));
        let zero = idx(f, TExpr::Int(0));
        let rem = idx(f, TExpr::Binary(BinOp::FloorMod, lv, w));
        let first = f.p.alloc(TExpr::Binary(BinOp::Eq, rem, zero), Ty::Elem(ElemType::Bool), Default::default());
        let which = idx(f, TExpr::Binary(BinOp::FloorDiv, lv, w));
        let mine = f.p.alloc(TExpr::Load(part, vec![lv]), ty, Default::default());
        let publish =
            Stmt::If { cond: first, then: vec![Stmt::Store { tensor: totals, indices: vec![which], value: mine }] };
        let lanes = (warps as u64).next_power_of_two() as i64;
        let l = f.new_var(format!("{}.l", decl.name), lanes);
        let lv = idx(f, TExpr::Var(l));
        let total = f.p.alloc(TExpr::Load(totals, vec![lv]), ty, Default::default());
        let gather = if lanes == warps {
            vec![Stmt::Store { tensor: part, indices: vec![lv], value: total }]
        } else {
            let k = idx(f, TExpr::Int(warps));
            let inside = f.p.alloc(TExpr::Binary(BinOp::Lt, lv, k), Ty::Elem(ElemType::Bool), Default::default());
            vec![
                Stmt::Store { tensor: part, indices: vec![lv], value: identity },
                Stmt::If { cond: inside, then: vec![Stmt::Store { tensor: part, indices: vec![lv], value: total }] },
            ]
        };
        let inner = vec![
            Stmt::For { var: lane, lo: 0, extent: n, kind: ForKind::Thread(GpuDim::X), body: vec![publish] },
            Stmt::Barrier,
            Stmt::For { var: l, lo: 0, extent: lanes, kind: ForKind::Thread(GpuDim::X), body: gather },
            Stmt::WarpReduce(WarpReduce { tensor: part, lanes, op }),
        ];
        body.push(Stmt::Alloc { tensor: totals, body: inner });
        let Some(Stmt::Alloc { body: b, .. }) = body.last_mut() else { unreachable!("pushed above") };
        last = b;
    }
    // Thread 0: its element of the parts, now the total, into the stage's element.
    let one = f.new_var(format!("{}.one", decl.name), 1);
    let ov = idx(f, TExpr::Var(one));
    let acc = f.p.alloc(TExpr::Load(stage, up.indices.clone()), ty, Default::default());
    let sum = f.p.alloc(TExpr::Load(part, vec![ov]), ty, Default::default());
    let value = combine_like(f, up.value, acc, sum);
    let store = Stmt::Store { tensor: stage, indices: up.indices.clone(), value };
    let store = up.guarded(f, store);
    last.push(Stmt::For { var: one, lo: 0, extent: 1, kind: ForKind::Thread(GpuDim::X), body: vec![store] });
    Stmt::Alloc { tensor: part, body }
}

/// The parts combined pairwise, halving their number at each step (a
/// barrier after each), so that `part[0]` holds them all: ⌈log₂ n⌉ steps
/// rather than one thread folding `n` parts while the others wait.
fn tree(f: &mut LoopFunc, part: TensorId, name: &str, mut n: i64, update: TExprId) -> Vec<Stmt> {
    let ty = f.p.ty(update);
    let mut out = Vec::new();
    while n > 1 {
        let h = (n + 1) / 2;
        let t = f.new_var(&format!("{name}.h{h}"), n - h);
        let tv = f.p.alloc(TExpr::Var(t), Ty::Index, Default::default());
        let k = f.p.alloc(TExpr::Int(h), Ty::Index, Default::default());
        let other = f.p.alloc(TExpr::Binary(BinOp::Add, tv, k), Ty::Index, Default::default());
        let mine = f.p.alloc(TExpr::Load(part, vec![tv]), ty, Default::default());
        let theirs = f.p.alloc(TExpr::Load(part, vec![other]), ty, Default::default());
        let value = combine_like(f, update, mine, theirs);
        let store = Stmt::Store { tensor: part, indices: vec![tv], value };
        out.push(Stmt::For { var: t, lo: 0, extent: n - h, kind: ForKind::Thread(GpuDim::X), body: vec![store] });
        out.push(Stmt::Barrier);
        n = h;
    }
    out
}

/// In a launch whose statements run on threads, a store outside every
/// thread loop (the initial value of a stage attached at the block level)
/// is made once per block, by its first thread.
fn one_thread_stores(f: &mut LoopFunc) {
    let mut body = std::mem::take(&mut f.body);
    for launch in &mut body {
        if has_thread_loop(launch) {
            wrap_stores(f, std::slice::from_mut(launch));
        }
    }
    f.body = body;
}

fn has_thread_loop(s: &Stmt) -> bool {
    has_thread_loop_of(s, &GpuDim::ALL)
}

fn has_thread_loop_of(s: &Stmt, dims: &[GpuDim]) -> bool {
    match s {
        Stmt::For { kind: ForKind::Thread(d), .. } if dims.contains(d) => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
            body.iter().any(|s| has_thread_loop_of(s, dims))
        }
        Stmt::Store { .. }
        | Stmt::Barrier
        | Stmt::Async(_)
        | Stmt::Mma { .. }
        | Stmt::Wgmma(_)
        | Stmt::TileDot(_)
        | Stmt::WarpReduce(_)
        | Stmt::Prefetch { .. } => false,
    }
}

fn wrap_stores(f: &mut LoopFunc, body: &mut [Stmt]) {
    for s in body {
        match s {
            Stmt::For { kind: ForKind::Thread(_), .. } => {}
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => wrap_stores(f, body),
            Stmt::Store { tensor, .. } => {
                let one = f.new_var(&format!("{}.one", name(f, *tensor)), 1);
                let store = std::mem::replace(s, Stmt::Barrier);
                *s = Stmt::For { var: one, lo: 0, extent: 1, kind: ForKind::Thread(GpuDim::X), body: vec![store] };
            }
            Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => {}
        }
    }
}

/// The reduction nest without the bound loop (its body spliced in place).
/// The reduction loops and guards around the statement [`strip`] is at.
#[derive(Clone, Default)]
struct Path {
    loops: Vec<VarId>,
    guards: Vec<TExprId>,
}

fn strip(
    f: &LoopFunc,
    s: &Stmt,
    job: &Job,
    path: &mut Path,
    found: &mut Option<(VarId, i64, i64)>,
    update: &mut Option<Update>,
) -> Result<Vec<Stmt>, String> {
    let what = || format!("`{}`'s reduction loops hold more than its update and guards", name(f, job.tensor));
    match s {
        Stmt::For { var, lo, extent, kind, body } => {
            let n = var_name(f, *var);
            if !job.reductions.iter().any(|r| r == n) {
                return Err(what());
            }
            let mut inner = Vec::new();
            path.loops.push(*var);
            for b in body {
                inner.extend(strip(f, b, job, path, found, update)?);
            }
            path.loops.pop();
            if n == job.thread {
                *found = Some((*var, *lo, *extent));
                Ok(inner)
            } else {
                Ok(vec![Stmt::For { var: *var, lo: *lo, extent: *extent, kind: *kind, body: inner }])
            }
        }
        Stmt::If { cond, then } => {
            let mut inner = Vec::new();
            path.guards.push(*cond);
            for b in then {
                inner.extend(strip(f, b, job, path, found, update)?);
            }
            path.guards.pop();
            Ok(vec![Stmt::If { cond: *cond, then: inner }])
        }
        Stmt::Store { tensor, indices, value } if *tensor == job.tensor => {
            let mut conjuncts = Vec::new();
            path.guards.iter().for_each(|&g| conjuncts_of(f, g, &mut conjuncts));
            conjuncts.retain(|&g| !path.loops.iter().any(|&v| f.p.mentions(g, v)));
            *update = Some(Update { indices: indices.clone(), value: *value, guards: conjuncts });
            Ok(vec![s.clone()])
        }
        _ => Err(what()),
    }
}

/// The conjuncts of `g` (`a && b` is both of `a`'s and `b`'s).
fn conjuncts_of(f: &LoopFunc, g: TExprId, out: &mut Vec<TExprId>) {
    match f.p.expr(g) {
        TExpr::Binary(BinOp::And, a, b) => {
            conjuncts_of(f, *a, out);
            conjuncts_of(f, *b, out);
        }
        _ => out.push(g),
    }
}

/// Stores to the stage become accumulations into the thread's part.
fn retarget(f: &mut LoopFunc, body: &mut [Stmt], stage: TensorId, part: TensorId, slot: TExprId) {
    for s in body {
        match s {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
                retarget(f, body, stage, part, slot)
            }
            Stmt::Store { tensor, indices, value } if *tensor == stage => {
                let ty = f.p.ty(*value);
                let acc = f.p.alloc(TExpr::Load(part, vec![slot]), ty, Default::default());
                let term = term_of(f, *value);
                *value = combine_like(f, *value, acc, term);
                *tensor = part;
                *indices = vec![slot];
            }
            _ => {}
        }
    }
}

/// The new term of `combine(acc, term)` (how lowering writes updates).
fn term_of(f: &LoopFunc, update: TExprId) -> TExprId {
    match f.p.expr(update) {
        TExpr::Binary(_, _, term) => *term,
        TExpr::Math(_, args) => args[1],
        _ => unreachable!("checked by reduce_op"),
    }
}

/// `update`'s operation applied to `acc` and `term`.
fn combine_like(f: &mut LoopFunc, update: TExprId, acc: TExprId, term: TExprId) -> TExprId {
    let ty = f.p.ty(update);
    let e = match f.p.expr(update) {
        TExpr::Binary(op, _, _) => TExpr::Binary(*op, acc, term),
        TExpr::Math(m, _) => TExpr::Math(*m, vec![acc, term]),
        _ => unreachable!("checked by reduce_op"),
    };
    f.p.alloc(e, ty, Default::default())
}

fn reduce_op(f: &LoopFunc, update: TExprId) -> Result<ReduceOp, String> {
    match f.p.expr(update) {
        TExpr::Binary(BinOp::Add, ..) => Ok(ReduceOp::Sum),
        TExpr::Binary(BinOp::Mul, ..) => Ok(ReduceOp::Prod),
        TExpr::Math(MathFn::Max, a) if a.len() == 2 => Ok(ReduceOp::Max),
        TExpr::Math(MathFn::Min, a) if a.len() == 2 => Ok(ReduceOp::Min),
        _ => Err("the reduction's update is not one texc knows how to split".into()),
    }
}

/// For a CPU that runs a block's threads one after another (the loop-IR
/// emulation of GPU code): every warp reduction as loops over the pairs
/// of each butterfly step, `part[i]` and `part[i + d]` both set to their
/// combination, as the two lanes compute it. The launch rules are checked
/// before: the buffers are now stored outside thread loops.
pub fn warp_reductions_as_loops(f: &mut LoopFunc) {
    let mut body = std::mem::take(&mut f.body);
    expand_warp_reductions(f, &mut body);
    f.body = body;
}

fn expand_warp_reductions(f: &mut LoopFunc, body: &mut Vec<Stmt>) {
    let mut out = Vec::with_capacity(body.len());
    for mut s in body.drain(..) {
        match &mut s {
            Stmt::WarpReduce(w) => {
                let w = *w;
                out.extend(w.steps().map(|d| butterfly_step(f, w, d)).collect::<Vec<_>>());
                continue;
            }
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
                expand_warp_reductions(f, body)
            }
            Stmt::Store { .. }
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::Prefetch { .. } => {}
        }
        out.push(s);
    }
    *body = out;
}

/// `for g in 0..n/2d: for r in 0..d: i = g*2d + r; part[i] = op(part[i], part[i + d]); part[i + d] = part[i]`
/// (legalized code: no division).
fn butterfly_step(f: &mut LoopFunc, w: WarpReduce, d: i64) -> Stmt {
    let decl = f.p.tensor(w.tensor).clone();
    let ty = Ty::Elem(decl.elem);
    let groups = decl.len() / (2 * d);
    let g = f.new_var(format!("{}.g{d}", decl.name), groups);
    let r = f.new_var(format!("{}.r{d}", decl.name), d);
    let idx = |f: &mut LoopFunc, e: TExpr| f.p.alloc(e, Ty::Index, Default::default());
    let (gv, rv) = (idx(f, TExpr::Var(g)), idx(f, TExpr::Var(r)));
    let dv = idx(f, TExpr::Int(d));
    let d2 = idx(f, TExpr::Int(2 * d));
    let base = idx(f, TExpr::Binary(BinOp::Mul, gv, d2));
    let i = idx(f, TExpr::Binary(BinOp::Add, base, rv));
    let j = idx(f, TExpr::Binary(BinOp::Add, i, dv));
    let a = f.p.alloc(TExpr::Load(w.tensor, vec![i]), ty, Default::default());
    let b = f.p.alloc(TExpr::Load(w.tensor, vec![j]), ty, Default::default());
    let combined = match w.op {
        ReduceOp::Sum => TExpr::Binary(BinOp::Add, a, b),
        ReduceOp::Prod => TExpr::Binary(BinOp::Mul, a, b),
        ReduceOp::Max => TExpr::Math(MathFn::Max, vec![a, b]),
        ReduceOp::Min => TExpr::Math(MathFn::Min, vec![a, b]),
    };
    let combined = f.p.alloc(combined, ty, Default::default());
    let again = f.p.alloc(TExpr::Load(w.tensor, vec![i]), ty, Default::default());
    let body = vec![
        Stmt::Store { tensor: w.tensor, indices: vec![i], value: combined },
        Stmt::Store { tensor: w.tensor, indices: vec![j], value: again },
    ];
    let inner = Stmt::For { var: r, lo: 0, extent: d, kind: ForKind::Serial, body };
    Stmt::For { var: g, lo: 0, extent: groups, kind: ForKind::Serial, body: vec![inner] }
}
