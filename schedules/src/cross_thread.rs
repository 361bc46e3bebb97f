//! The *cross-thread reduction* step of lowering (GPU targets): a stage
//! whose reduction loop is bound to `thread.x` (`bind S.ri to thread.x`)
//! has its reduction computed by a block's threads together.
//!
//! Each thread accumulates its part of the reduction into its own element
//! of a shared buffer (the bound loop becomes the outermost of the
//! reduction loops — the reduction is reassociated, as `rfactor` does on
//! CPUs, which changes float rounding only); after a barrier, one thread
//! combines the parts into the stage's element:
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

use crate::ir::{ForKind, GpuDim, LoopFunc, Stmt};
use crate::schedule::Schedules;
use texc_compiler::ops::{BinOp, MathFn};
use texc_compiler::tir::{TExpr, TExprId, TensorDecl, TensorId, TensorRole, Ty, VarId};
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
        };
        let mut body = std::mem::take(&mut f.body);
        let r = rewrite(f, &mut body, &job, false);
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

struct Job {
    tensor: TensorId,
    /// The reduction loop bound to `thread.x`.
    thread: String,
    /// Every reduction loop of the stage.
    reductions: Vec<String>,
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
            Stmt::Store { .. } | Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } => false,
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
        Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } => false,
    }
}

/// The update of the stage: `S[idx] = combine(S[idx], term)`.
struct Update {
    indices: Vec<TExprId>,
    value: TExprId,
}

fn cross_thread(f: &mut LoopFunc, root: &Stmt, job: &Job) -> Result<Stmt, String> {
    // The bound loop, and the reduction nest without it.
    let mut found: Option<(VarId, i64, i64)> = None;
    let mut update: Option<Update> = None;
    let inner = strip(f, root, job, &mut found, &mut update)?;
    let (t, lo, extent) =
        found.ok_or_else(|| format!("`{}` is not inside `{}`'s reduction loops", job.thread, name(f, job.tensor)))?;
    let up = update.expect("the nest stores to the stage");
    let decl = f.p.tensor(job.tensor).clone();
    let ty = Ty::Elem(decl.elem);
    // The shared buffer of partial results, one per thread.
    let part = f.p.tensors.len() as u32;
    f.p.tensors.push(TensorDecl {
        name: format!("{}.part", decl.name),
        elem: decl.elem,
        shape: vec![extent],
        role: TensorRole::Temp,
        ..decl.clone()
    });
    let part = TensorId(part);
    f.shared.insert(part);
    let var_expr = |f: &mut LoopFunc, v: VarId| f.p.alloc(TExpr::Var(v), Ty::Index, Default::default());
    let tv = var_expr(f, t);
    let slot = if lo == 0 {
        tv
    } else {
        let l = f.p.alloc(TExpr::Int(lo), Ty::Index, Default::default());
        f.p.alloc(TExpr::Binary(BinOp::Sub, tv, l), Ty::Index, Default::default())
    };
    let op = reduce_op(f, up.value)?;
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
    let total = Stmt::Store { tensor: job.tensor, indices: up.indices, value: combined };
    let threads = Stmt::For { var: t, lo, extent, kind: ForKind::Thread(GpuDim::X), body: thread_body };
    let mut body = vec![Stmt::Barrier, threads, Stmt::Barrier];
    body.extend(tree(f, part, &decl.name, extent, up.value));
    body.push(Stmt::For { var: one, lo: 0, extent: 1, kind: ForKind::Thread(GpuDim::X), body: vec![total] });
    Ok(Stmt::Alloc { tensor: part, body })
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
    match s {
        Stmt::For { kind: ForKind::Thread(_), .. } => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
            body.iter().any(has_thread_loop)
        }
        Stmt::Store { .. } | Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } => false,
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
            Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } => {}
        }
    }
}

/// The reduction nest without the bound loop (its body spliced in place).
fn strip(
    f: &LoopFunc,
    s: &Stmt,
    job: &Job,
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
            for b in body {
                inner.extend(strip(f, b, job, found, update)?);
            }
            if n == job.thread {
                *found = Some((*var, *lo, *extent));
                Ok(inner)
            } else {
                Ok(vec![Stmt::For { var: *var, lo: *lo, extent: *extent, kind: *kind, body: inner }])
            }
        }
        Stmt::If { cond, then } => {
            let mut inner = Vec::new();
            for b in then {
                inner.extend(strip(f, b, job, found, update)?);
            }
            Ok(vec![Stmt::If { cond: *cond, then: inner }])
        }
        Stmt::Store { tensor, indices, value } if *tensor == job.tensor => {
            *update = Some(Update { indices: indices.clone(), value: *value });
            Ok(vec![s.clone()])
        }
        _ => Err(what()),
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

fn reduce_op(f: &LoopFunc, update: TExprId) -> Result<texc_compiler::ops::ReduceOp, String> {
    use texc_compiler::ops::ReduceOp;
    match f.p.expr(update) {
        TExpr::Binary(BinOp::Add, ..) => Ok(ReduceOp::Sum),
        TExpr::Binary(BinOp::Mul, ..) => Ok(ReduceOp::Prod),
        TExpr::Math(MathFn::Max, a) if a.len() == 2 => Ok(ReduceOp::Max),
        TExpr::Math(MathFn::Min, a) if a.len() == 2 => Ok(ReduceOp::Min),
        _ => Err("the reduction's update is not one texc knows how to split".into()),
    }
}
