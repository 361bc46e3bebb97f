//! The default schedule for CPU targets, for kernels without a `schedule`.
//!
//! - Element-wise temporaries whose consumers are all element-wise are
//!   inlined (fused) into them; producers of reductions stay materialized,
//!   so that they are not recomputed for every reduction step.
//! - Float reductions along rows are factored into vector-width partial
//!   results first (`normalize::rfactor`), so that they vectorize.
//! - Reductions run with their reduction loops outside the innermost
//!   spatial loop, so that the innermost loop writes contiguous memory —
//!   unless they reduce along rows (`max[d](X[n, d])`): then the reduction
//!   runs innermost over contiguous memory and the rows run in parallel.
//! - The innermost spatial loop is split by the vector width and vectorized;
//!   when that row is short, rows of the next spatial loop are unrolled
//!   inside the reduction loops (register blocking, ~12 accumulators).
//! - Outer spatial loops are fused until there is enough parallel work
//!   (≥ 64 iterations), and that loop runs on the thread pool.
//! - Temporaries of which each iteration of their reader's outermost loop
//!   needs its own part (a row's statistics, a softmax's exponentials) are
//!   computed inside that loop (`compute_at`), so that the part stays in L1.
//!
//! Cache tiling and register blocking are not chosen by default yet; the
//! example schedules in `examples/` show them.

use crate::ir::ForKind;
use crate::normalize::{contains_reduce, hoist_reductions, inline_stage};
use crate::schedule::{Attach, Schedules, StageSchedule};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, TensorRole};
use texc_grammar::Span;

fn loads(p: &Program, e: TExprId, t: TensorId) -> bool {
    matches!(p.expr(e), TExpr::Load(x, _) if *x == t) || p.children(e).into_iter().any(|c| loads(p, c, t))
}

/// Whether evaluating `e` is cheap enough to repeat: no transcendental functions.
fn cheap(p: &Program, e: TExprId) -> bool {
    use texc_compiler::resolve::Builtin::*;
    let costly = matches!(p.expr(e), TExpr::Call(Exp | Log | Sqrt | Rsqrt | Tanh | Sigmoid | Erf | Pow, _));
    !costly && p.children(e).into_iter().all(|c| cheap(p, c))
}

fn volume(st: &Stage) -> i64 {
    st.vars.iter().map(|v| v.extent).product()
}

/// Inline element-wise temporaries into element-wise consumers, and cheap
/// ones into reductions that visit no more points than the temporary has
/// (`sum[d](xc[n, d] * xc[n, d])` reads each `xc` once: inlining it saves
/// a round trip to memory; a matmul operand is read `N` times: it stays).
pub fn default_inlining(p: &mut Program) {
    let mut si = 0;
    while si < p.stages.len() {
        let st = &p.stages[si];
        let t = st.tensor;
        let repeatable = cheap(p, st.value);
        let inlinable = p.tensor(t).role == TensorRole::Temp
            && !contains_reduce(p, st.value)
            && p.stages[si + 1..]
                .iter()
                .filter(|c| loads(p, c.value, t))
                .all(|c| !contains_reduce(p, c.value) || repeatable && volume(c) <= volume(st));
        if inlinable {
            inline_stage(p, si);
        } else {
            si += 1;
        }
    }
}

/// Vector width in f32 lanes for a target.
pub fn vector_lanes(target: &str) -> i64 {
    if target == "x86-avx512" {
        16
    } else {
        8
    }
}

pub fn default_schedule(p: &mut Program, target: &str) -> Schedules {
    default_inlining(p);
    hoist_reductions(p);
    let lanes = vector_lanes(target);
    // Row reductions of floats are factored so that their partial results vectorize.
    let mut si = 0;
    while si < p.stages.len() {
        let float = p.tensor(p.stages[si].tensor).elem.is_float();
        if float && reduces_along_rows(p, &p.stages[si]) && crate::normalize::rfactor(p, si, lanes) {
            si += 1;
        }
        si += 1;
    }
    let mut s = Schedules::new(p);
    for (si, ss) in s.stages.iter_mut().enumerate() {
        let st = &p.stages[si];
        if reduces_along_rows(p, st) {
            schedule_row_reduction(ss);
        } else {
            schedule_stage(ss, st.n_axes, lanes);
        }
    }
    attach_producers(p, &mut s);
    s
}

/// Attached boxes the default schedule keeps: small enough for L1.
const ATTACH_BYTES: i64 = 32 * 1024;

/// Compute temporaries inside the outermost loop of the stage that reads
/// them, where each iteration of that loop needs its own part of them (the
/// statistics and rows of a normalization, a softmax's exponentials): the
/// part then goes from producer to reader through L1 instead of memory.
/// Kept only when the parts hardly overlap (little recomputation) and fit in L1.
fn attach_producers(p: &Program, s: &mut Schedules) {
    for o in (0..p.stages.len()).rev() {
        let Some(&a) = s.stages[o].leaves.first() else { continue };
        if s.attach[o].is_some() || s.stages[o].ivs[a].reduce {
            continue;
        }
        let trips = s.stages[o].ivs[a].extent;
        for pi in (0..o).rev() {
            let t = p.stages[pi].tensor;
            if p.tensor(t).role != TensorRole::Temp || s.attach[pi].is_some() {
                continue;
            }
            let mut readers = (pi + 1..p.stages.len()).filter(|&q| loads(p, p.stages[q].value, t)).peekable();
            let inside = |q: usize| q == o || matches!(&s.attach[q], Some(x) if x.owner == o && x.leaf == a);
            if readers.peek().is_none() || !readers.all(inside) {
                continue;
            }
            let mut trial = s.clone();
            for v in &mut trial.stages[pi].ivs {
                if v.kind == ForKind::Parallel {
                    v.kind = ForKind::Serial;
                }
            }
            trial.attach[pi] = Some(Attach { owner: o, leaf: a, layout: None, span: Span::default() });
            let Ok(regions) = crate::attach::infer(p, &mut trial.clone()) else { continue };
            let r = regions[pi].as_ref().expect("attached");
            let bytes = r.local_shape.iter().product::<i64>() * p.tensor(t).elem.size() as i64;
            // Boxes may overrun the tensor at the end (those points are not computed) or overlap a little.
            let computed = r.ext.iter().product::<i64>() * trips;
            if bytes <= ATTACH_BYTES && 4 * computed <= 5 * p.tensor(t).len() {
                *s = trial;
            }
        }
    }
}

fn uses_var(p: &Program, e: TExprId, v: u32) -> bool {
    matches!(p.expr(e), TExpr::Var(x) if *x == v) || p.children(e).into_iter().any(|c| uses_var(p, c, v))
}

fn loads_of(p: &Program, e: TExprId, out: &mut Vec<TExprId>) {
    if let TExpr::Load(..) = p.expr(e) {
        out.push(e);
    }
    for c in p.children(e) {
        loads_of(p, c, out);
    }
}

/// A reduction whose reads run along their contiguous dimension with the
/// reduction variable (`max[d](X[n, d])`) while no read is contiguous in
/// the innermost spatial axis: vectorizing that spatial axis would turn
/// every read into a strided gather.
fn reduces_along_rows(p: &Program, st: &texc_compiler::tir::Stage) -> bool {
    if st.vars.len() == st.n_axes || st.n_axes == 0 {
        return false;
    }
    let inner = st.n_axes as u32 - 1;
    let mut loads = Vec::new();
    loads_of(p, st.value, &mut loads);
    let last_index = |l: &TExprId| match p.expr(*l) {
        TExpr::Load(_, idx) => idx.last().copied(),
        _ => None,
    };
    let reduction = st.n_axes as u32..st.vars.len() as u32;
    // Loads that do not move with the reduction stay in registers; only the others decide.
    let streamed: Vec<TExprId> = loads.into_iter().filter(|&l| reduction.clone().any(|r| uses_var(p, l, r))).collect();
    let spatial_contiguous = streamed.iter().filter_map(last_index).any(|i| uses_var(p, i, inner));
    let reduce_contiguous =
        streamed.iter().filter_map(last_index).any(|i| reduction.clone().any(|r| uses_var(p, i, r)));
    reduce_contiguous && !spatial_contiguous
}

/// Reductions along rows: spatial loops outside, in parallel; the reduction
/// runs innermost over contiguous memory, accumulating in a register.
fn schedule_row_reduction(ss: &mut StageSchedule) {
    let span = Span::default();
    let mut outer = ss.leaves[0];
    while ss.ivs[outer].extent < 64 && ss.leaves.len() > 1 {
        let next = ss.leaves[1];
        if ss.ivs[next].reduce {
            break;
        }
        let name = format!("{}.{}", ss.ivs[outer].name, ss.ivs[next].name);
        outer = ss.fuse(outer, next, (&name, span), span).expect("adjacent spatial loops");
    }
    if !ss.ivs[outer].reduce && ss.ivs[outer].extent >= 2 {
        ss.annotate(outer, ForKind::Parallel, span).expect("spatial");
    }
}

/// Accumulators a reduction keeps in registers: about 12 of 16 ymm registers.
const ACCUMULATORS: i64 = 12;

/// Register blocking for reductions whose innermost row is short: rows of
/// the next spatial axis are unrolled inside the reduction loops, so that
/// ~12 independent accumulator vectors hide the FMA latency.
fn register_block(ss: &mut StageSchedule, n_axes: usize, lanes: i64) {
    let span = Span::default();
    if !ss.ivs.iter().any(|v| v.reduce) || n_axes < 2 {
        return;
    }
    let row = ss.ivs[n_axes - 1].extent;
    let vectors = if row >= lanes { (row + lanes - 1) / lanes } else { row.max(1) };
    let a = n_axes - 2;
    let f = (ACCUMULATORS / vectors).min(ss.ivs[a].extent);
    if vectors > 6 || f < 2 {
        return;
    }
    let name = ss.ivs[a].name.clone();
    let (_, r) = ss.split(a, f, (&format!("{name}.b"), span), (&format!("{name}.r"), span), span).expect("fresh names");
    // Move the unrolled rows inside the reduction loops: `reorder` keeps the
    // positions of the loops it lists, so listing the reductions first puts
    // the rows right after them.
    let moved: Vec<usize> = ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce).chain([r]).collect();
    ss.reorder(&moved, span).expect("distinct leaves");
    ss.annotate(r, ForKind::Unrolled, span).expect("serial leaf");
}

fn schedule_stage(ss: &mut StageSchedule, n_axes: usize, lanes: i64) {
    let span = Span::default();
    if n_axes == 0 {
        return;
    }
    let inner = n_axes - 1;
    // Reduction loops outside the innermost spatial loop.
    if ss.ivs.len() > n_axes {
        let mut order: Vec<usize> = (0..inner).collect();
        order.extend(n_axes..ss.ivs.len());
        order.push(inner);
        ss.reorder(&order, span).expect("a permutation of the leaves");
    }
    if ss.ivs[inner].extent >= lanes {
        let name = ss.ivs[inner].name.clone();
        let (_, v) = ss
            .split(inner, lanes, (&format!("{name}.o"), span), (&format!("{name}.v"), span), span)
            .expect("fresh names");
        ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
    }
    register_block(ss, n_axes, lanes);
    // Fuse leading spatial loops until there is enough parallel work.
    let mut outer = ss.leaves[0];
    if ss.ivs[outer].reduce || ss.leaves.len() == 1 && ss.ivs[outer].kind == ForKind::Vectorized {
        return;
    }
    while ss.ivs[outer].extent < 64 && ss.leaves.len() > 2 {
        let next = ss.leaves[1];
        if ss.ivs[next].reduce || ss.ivs[next].kind != ForKind::Serial || ss.leaves.len() < 3 {
            break;
        }
        let name = format!("{}.{}", ss.ivs[outer].name, ss.ivs[next].name);
        outer = ss.fuse(outer, next, (&name, span), span).expect("adjacent spatial loops");
    }
    if ss.ivs[outer].extent >= 2 {
        ss.annotate(outer, ForKind::Parallel, span).expect("spatial");
    }
}
