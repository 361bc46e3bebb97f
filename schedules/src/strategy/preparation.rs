//! The preparation steps no family has to itself (only the CPUs' list
//! inlines epilogues), and the inlining they are made of:
//!
//! - Element-wise temporaries whose consumers are all element-wise (and
//!   read them at one position per point, through affine indices) are
//!   inlined (fused) into them; producers of reductions stay materialized,
//!   so that they are not recomputed for every reduction step.
//! - After reductions are hoisted, an element-wise stage read at the same
//!   points by element-wise stages only is inlined into them
//!   ([`inline_epilogues`]: a convolution's bias and activation in one pass).
//! - Neither inlines a stage that gathers from more lines than L1 holds
//!   (a filters-last product's copy back) into a reader that walks another
//!   tensor along its rows ([`gathers_beyond`]).
//!
//! Invariants: each step takes a verified tensor-IR program to a verified
//! one computing the same outputs. Inlining only removes temporaries
//! (never an input or an output), never copies a costly function into a
//! reader that reads it twice, and never builds an expression of more than
//! [`MAX_INLINED_NODES`] nodes, so that chains of statements compile in
//! linear time.

use super::{reads_at_own_point, uses_var, Reads};
use crate::analysis::loads_in;
use crate::knobs::DefaultKnobs;
use crate::normalize::{contains_reduce, drop_stages, hoist_reductions, inline_stage_in_place};
use std::collections::HashSet;
use texc_compiler::ops::BinOp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, TensorRole, VarId};

/// *one-hot-gathers*: sums of one-hot products (`sum[v](E[v, d] * (ids[i] == v))`) as loads.
pub(super) fn one_hot_gathers(p: &mut Program, _: &Target, _: DefaultKnobs) {
    for si in 0..p.stages.len() {
        crate::normalize::one_hot_gather(p, si);
    }
}

/// *inline-elementwise*: element-wise temporaries into their readers (on
/// GPUs costly ones into reductions too: [`inline_elementwise`]).
pub(super) fn inline_elementwise_step(p: &mut Program, t: &Target, _: DefaultKnobs) {
    inline_elementwise(p, t.kind == TargetKind::Gpu, l1d(t))
}

/// One core's L1 data cache on CPUs (the nominal one where the target has
/// none); no bound on GPUs, whose transposes are not CPU passes.
fn l1d(t: &Target) -> i64 {
    match t.kind {
        TargetKind::Cpu => t.cpu_caches().l1d,
        TargetKind::Gpu | TargetKind::Interp => i64::MAX,
    }
}

/// *hoist-reductions*: a reduction inside a larger expression becomes a stage of its own.
pub(super) fn hoist_reductions_step(p: &mut Program, _: &Target, _: DefaultKnobs) {
    hoist_reductions(p)
}

/// *inline-epilogues*: a reduction's epilogue and the operators after it as one pass ([`inline_epilogues`]).
pub(super) fn inline_epilogues_step(p: &mut Program, t: &Target, _: DefaultKnobs) {
    inline_epilogues(p, l1d(t))
}

/// *simplify-div-mod*: divisions and remainders the sizes make trivial (a
/// convolution of one group reads `X[n, k / K * C + c, ..]`: `X[n, c, ..]`).
pub(super) fn simplify_div_mod(p: &mut Program, _: &Target, _: DefaultKnobs) {
    for si in 0..p.stages.len() {
        crate::normalize::simplify_div_mod(p, si);
    }
}

/// *fold-conditions*: index comparisons the sizes decide (a pool without
/// padding tests its window against the image's edges) folded away.
pub(super) fn fold_conditions(p: &mut Program, _: &Target, _: DefaultKnobs) {
    for si in 0..p.stages.len() {
        crate::normalize::fold_decided_conditions(p, si);
    }
}

/// Element-wise temporaries inlined into their readers as on CPUs
/// (`inline_elementwise` without recomputation).
pub fn default_inlining(p: &mut Program) {
    inline_elementwise(p, false, i64::MAX)
}

/// Inline element-wise temporaries into element-wise consumers (when that
/// duplicates no costly work and keeps expressions small), and cheap
/// ones into reductions that visit no more points than the temporary has
/// (`sum[d](xc[n, d] * xc[n, d])` reads each `xc` once: inlining it saves
/// a round trip to memory; a matmul operand is read `N` times: it stays).
/// On GPUs (`recompute`), where memory traffic costs
/// more than arithmetic, costly element-wise temporaries (a softmax's
/// `exp`) are inlined into reductions too, and so computed once per reader.
fn inline_elementwise(p: &mut Program, recompute: bool, l1d: i64) {
    let mut reads = Reads::of(p);
    // Inlined stages stay in place until the end (see `inline_stage_in_place`).
    let mut dead = vec![false; p.stages.len()];
    let mut si = 0;
    while si < p.stages.len() {
        let st = &p.stages[si];
        let t = st.tensor;
        let repeatable = cheap(p, st.value);
        let recomputable = repeatable || recompute;
        let readers = || reads.readers_after(si, t).map(|c| &p.stages[c]);
        let consumers = readers().count();
        let inlinable = p.tensor(t).role == TensorRole::Temp
            && !contains_reduce(p, st.value)
            && (recompute || recomputing_pays(p, st, consumers))
            && !gathers_for_several(p, st, consumers, l1d)
            && readers().all(|c| {
                inlining_stays_small(p, st, c, repeatable)
                    && !(gathers_beyond(p, st, l1d) && walks_rows(p, c, t))
                    && (repeatable || recompute || !broadcast_along_lanes(p, st, c))
                    && if contains_reduce(p, c.value) {
                        recomputable && reads_at_most_once(p, st, c)
                    } else {
                        reads_like_elementwise(p, c, t) || reads_each_once(p, st, c)
                    }
            });
        if inlinable {
            let readers: Vec<usize> = reads.readers_after(si, t).collect();
            inline_stage_in_place(p, si, &readers);
            reads.inlined_in_place(si, t);
            dead[si] = true;
        }
        si += 1;
    }
    drop_stages(p, &dead);
    debug_assert!(reads.dropped(&dead) == Reads::of(p), "inline-elementwise kept its index of reads up to date");
}

/// Whether stage `st`, read by `readers` stages, gathers across lines (a
/// transposing copy) for more than one of them. Such a stage stays a pass
/// of its own: inlined, every reader would gather the lines again, and a
/// reader that also selects among other sources (a concatenation) is no
/// longer one vector loop. DenseNet's transitions pooled before their 1×1
/// convolution (`rules/conv.rs`) store a 7 × 7 product filters-last; its
/// copy back, inlined into the sixteen to thirty-two concatenations of
/// the next block, made each dense layer's batch norm a region function
/// of thousands of LLVM lines. CPUs only (a finite `l1d`, as for
/// [`gathers_beyond`]): a GPU's transposes are not passes of their own.
fn gathers_for_several(p: &Program, st: &Stage, readers: usize, l1d: i64) -> bool {
    l1d < i64::MAX && readers > 1 && super::gathered_lines(p, st) > 0
}

/// Whether reader `c` broadcasts stage `st` (reads it through not all of
/// its axes) along its innermost axis: inlined, each of `st`'s values
/// would be computed once per point of the reader, not hoisted out of the
/// vector loop (a squeeze-and-excite's `sigmoid(s[c])` scaling `X[n, y, x,
/// c]` stored channels last: 49 sigmoids per channel on a 7 × 7 map;
/// stored `X[n, c, y, x]`, the reader's rows leave it one per channel).
fn broadcast_along_lanes(p: &Program, st: &Stage, c: &Stage) -> bool {
    let Some(inner) = c.n_axes.checked_sub(1) else { return false };
    let mut loads = Vec::new();
    loads_in(p, c.value, &mut loads);
    // An axis a `select` tests picks among operands (a concatenation's),
    // each read once: not a broadcast.
    let loads: Vec<TExprId> = loads
        .into_iter()
        .filter(|&l| matches!(p.expr(l), TExpr::Load(u, _) if *u == st.tensor) && uses_var(p, l, inner as VarId))
        .collect();
    if loads.is_empty() {
        return false;
    }
    (0..c.n_axes).any(|a| {
        let v = a as VarId;
        c.vars[a].extent > 1 && loads.iter().any(|&l| !uses_var(p, l, v)) && !tested(p, c.value, v)
    })
}

/// Whether a `select` in `e` tests variable `v` in its condition.
fn tested(p: &Program, e: TExprId, v: VarId) -> bool {
    let here = matches!(p.expr(e), TExpr::Select(cond, ..) if uses_var(p, *cond, v));
    here || p.children(e).into_iter().any(|c| tested(p, c, v))
}

/// Whether stage `st` gathers from more lines ([`super::gathered_lines`])
/// than `l1d` holds. Such a stage (a filters-last product's copy back,
/// `Y[n, f, y, x] = Y.t[n, y, x, f]`) stays a pass of its own where its
/// reader walks another tensor along its rows ([`walks_rows`]): the
/// reader's loops follow that tensor's lines, one channel after another,
/// and each channel's vectors read every line of the source again, from
/// L2 once they outgrow L1 (SqueezeNet's `Concat` of a 1×1 and a
/// filters-last 3×3 convolution on 55×55, 3025 lines, AVX-512, 1 thread:
/// 0.08 → 0.22 ms with the copy inlined, the copy alone 0.06). Fewer lines
/// stay in L1 from one channel to the next, and the copy is inlined
/// (GoogLeNet's 7×7 maps on AVX2, 49 lines).
fn gathers_beyond(p: &Program, st: &Stage, l1d: i64) -> bool {
    super::gathered_lines(p, st).saturating_mul(super::LINE) > l1d
}

/// Whether reader `c` walks a tensor other than `t` densely along its last
/// axis (consecutive lanes within a line).
fn walks_rows(p: &Program, c: &Stage, t: TensorId) -> bool {
    let Some(last) = c.n_axes.checked_sub(1) else { return false };
    let mut loads = Vec::new();
    loads_in(p, c.value, &mut loads);
    loads.iter().any(|&l| {
        let TExpr::Load(u, idx) = p.expr(l) else { return false };
        let stride = crate::analysis::flat_coefficient(p, *u, idx, last as VarId).unwrap_or(0);
        *u != t && stride != 0 && stride.saturating_abs() * (p.tensor(*u).elem.size() as i64) < super::LINE
    })
}

/// After [`hoist_reductions`]: an element-wise stage over the same points
/// as every element-wise stage that reads it is inlined into them, so that a
/// reduction's epilogue and the operators after it are one pass over the
/// output (a convolution's `y0 = y0.r0 + b[k]` hoisted out of
/// `conv2d_bias`, then `clip(y0, 0, 6)`), not one pass each. Statistics
/// read at fewer points than their readers have (`mu[n]` in `X[n, d] - mu[n]`)
/// stay as they are.
fn inline_epilogues(p: &mut Program, l1d: i64) {
    let mut reads = Reads::of(p);
    let mut epilogues = NarrowingEpilogues::of(p, &reads);
    // Inlined stages stay in place until the end (see `inline_stage_in_place`).
    let mut dead = vec![false; p.stages.len()];
    let mut si = 0;
    while si < p.stages.len() {
        let st = &p.stages[si];
        let t = st.tensor;
        let readers: Vec<usize> = reads.readers_after(si, t).collect();
        let narrows = epilogues.narrowing.contains(&t);
        let inlinable = p.tensor(t).role == TensorRole::Temp
            && !contains_reduce(p, st.value)
            && recomputing_pays(p, st, readers.len())
            && !readers.is_empty()
            && !gathers_for_several(p, st, readers.len(), l1d)
            && readers.iter().all(|&ci| {
                let c = &p.stages[ci];
                !contains_reduce(p, c.value)
                    && !(gathers_beyond(p, st, l1d) && walks_rows(p, c, t))
                    && volume(c) == volume(st)
                    && reads_like_elementwise(p, c, t)
                    && inlining_stays_small(p, st, c, cheap(p, st.value))
                    && !(narrows && epilogues.keeps(p, &reads, t, ci))
            });
        if inlinable {
            inline_stage_in_place(p, si, &readers);
            reads.inlined_in_place(si, t);
            dead[si] = true;
            // The readers read what `t` read.
            for ci in readers {
                epilogues.update(p, &reads, ci);
            }
        } else {
            epilogues.passed.insert(t);
        }
        si += 1;
    }
    drop_stages(p, &dead);
    debug_assert!(reads.dropped(&dead) == Reads::of(p), "inline-epilogues kept its index of reads up to date");
}

/// [`inline_epilogues`]' view of the reductions' epilogues that narrow
/// them: stages that read the output of a reduction stage (a sum hoisted
/// by [`hoist_reductions`]) whose elements are wider than their own (an
/// integer product's requantization, `i32` to `u8`). Fused into its
/// reduction's nest, such a stage writes its narrow elements; inlined into
/// a reader that is not fused there, the reduction's wide output is stored
/// and read back instead ([`NarrowingEpilogues::keeps`]). Each check costs
/// the reads of one stage, not a pass over the stages.
struct NarrowingEpilogues {
    /// What reduction stages write (inlining never removes one).
    reduced: HashSet<TensorId>,
    /// What narrowing epilogues write.
    narrowing: HashSet<TensorId>,
    /// What the stages before the current one write (those it has passed).
    passed: HashSet<TensorId>,
}

impl NarrowingEpilogues {
    fn of(p: &Program, reads: &Reads) -> NarrowingEpilogues {
        let reduced = p.stages.iter().filter(|st| contains_reduce(p, st.value)).map(|st| st.tensor).collect();
        let mut e = NarrowingEpilogues { reduced, narrowing: HashSet::new(), passed: HashSet::new() };
        for si in 0..p.stages.len() {
            e.update(p, reads, si);
        }
        e
    }

    /// Stage `si`'s entry, after its reads changed.
    fn update(&mut self, p: &Program, reads: &Reads, si: usize) {
        let t = p.stages[si].tensor;
        let width = p.tensor(t).elem.size();
        if reads.tensors(si).any(|u| self.reduced.contains(&u) && p.tensor(u).elem.size() > width) {
            self.narrowing.insert(t);
        } else {
            self.narrowing.remove(&t);
        }
    }

    /// Whether the narrowing epilogue writing `t` stays a stage of its own,
    /// fused into its reduction's nest, rather than being inlined into
    /// reader `ci`: where the reader reads it through other axes (a
    /// filters-last product's `Y.t[n, y·W + x, f]` read as `[n, f, y, x]`:
    /// the reduction's block could not write the reader's points), or where
    /// it also reads another reduction's output, or a later narrowing
    /// epilogue (the reader joins one reduction's nest, the last one's: a
    /// residual `Add` of two requantized convolutions read the first one's
    /// `i32` sums, four bytes per element where the requantized bytes are
    /// one — ResNet-50 int8, a third of its time at two threads).
    fn keeps(&self, p: &Program, reads: &Reads, t: TensorId, ci: usize) -> bool {
        let later = |u: &TensorId| self.narrowing.contains(u) && !self.passed.contains(u);
        let other = reads.tensors(ci).filter(|&u| u != t).any(|u| self.reduced.contains(&u) || later(&u));
        other || !reads_at_own_point(p, &p.stages[ci], t)
    }
}

/// Whether evaluating `e` is cheap enough to repeat: no transcendental functions.
pub(crate) fn cheap(p: &Program, e: TExprId) -> bool {
    let costly = matches!(p.expr(e), TExpr::Math(f, _) if f.is_costly());
    !costly && p.children(e).into_iter().all(|c| cheap(p, c))
}

/// Whether reduction `c` visits no more points than `st` has, counting a
/// point once for each position it reads `st` at (a depthwise
/// convolution's window words, `crate::dot4`, read three bytes of a row
/// per point of a 3 × 1 sum: inlined, its padding was computed three
/// times per output where it had been once per input element —
/// MobileNetV2's int8 stride-2 layers 2× slower).
fn reads_at_most_once(p: &Program, st: &Stage, c: &Stage) -> bool {
    let positions = positions_read(p, c, st.tensor).unwrap_or(1).max(1) as i64;
    volume(c).saturating_mul(positions) <= volume(st)
}

/// The points stage `st` visits, saturating: a stage whose value nests
/// reductions (ViT-B/16's attention before its sums are hoisted: the
/// variables of a softmax's sums of products, 24 of them) lists every
/// sum's variables, whose product overflowed `i64` (a panic in debug
/// builds, a wrapped, perhaps negative, volume in release ones).
fn volume(st: &Stage) -> i64 {
    st.vars.iter().fold(1i64, |n, v| n.saturating_mul(v.extent))
}

/// Whether stage `c` reads `t` at one position per point (the same access
/// written twice counts once), through affine indices. Inlining `t` then
/// computes each of its values once per use; reading several neighbours
/// (`Bd[.., 0, ..] - Bd[.., 2, ..]`) would recompute it per neighbour, and a
/// layout change (`Z[.., w % 4, w / 4]`) would evaluate its branches per
/// vector lane instead of once per loop iteration.
fn reads_like_elementwise(p: &Program, c: &Stage, t: TensorId) -> bool {
    positions_read(p, c, t).is_some_and(|k| k <= 1)
}

/// The distinct positions at which stage `c` reads `t` per point (the same
/// access written twice counts once), if every index is affine.
fn positions_read(p: &Program, c: &Stage, t: TensorId) -> Option<usize> {
    let mut all = Vec::new();
    loads_in(p, c.value, &mut all);
    let mut positions: Vec<Vec<String>> = Vec::new();
    for l in all {
        let TExpr::Load(x, idx) = p.expr(l) else { continue };
        if *x != t {
            continue;
        }
        if !idx.iter().all(|&i| affine(p, i)) {
            return None;
        }
        let key: Vec<String> = idx.iter().map(|&i| texc_compiler::print::expr(p, c, i)).collect();
        if !positions.contains(&key) {
            positions.push(key);
        }
    }
    Some(positions.len())
}

/// Whether element-wise stage `c` packs stage `st`, which only moves data
/// ([`moves_data`]: a padding), reading it at a few
/// positions per point that together cover each element about once: a
/// packing of four channels to a word, `X.q4[n, c4, h, w]` from
/// `X.pad[n, 4·c4 + t, h, w]` for `t < 4`, reads each padded byte once
/// (twice at most where the channels are padded to whole tile rows).
/// Inlined, the padding's condition is computed in the pack's vectors;
/// kept, it was a small block computed inside the pack's loops (ResNet-18
/// on AMX: 0.11–0.27 ms a layer for 30 × 30 × 32 words). Arithmetic (a
/// residual's requantization) stays a stage of its own: inlined, it ran
/// in the pack's narrower vectors, once per reader.
fn reads_each_once(p: &Program, st: &Stage, c: &Stage) -> bool {
    let Some(k) = positions_read(p, c, st.tensor).map(|k| k as i64) else { return false };
    // A pack: `k` elements to one of `k` times their width.
    let packs = p.tensor(c.tensor).elem.size() as i64 >= k * p.tensor(st.tensor).elem.size() as i64;
    moves_data(p, st.value) && (2..=4).contains(&k) && packs && volume(c) * k <= 2 * volume(st)
}

/// Whether `e` only moves values: loads, conversions, constants, and
/// selects among them (on any condition).
fn moves_data(p: &Program, e: TExprId) -> bool {
    match p.expr(e) {
        TExpr::Load(..) | TExpr::Int(_) | TExpr::Float(_) => true,
        TExpr::Cast(a) => moves_data(p, *a),
        TExpr::Select(_, a, b) => moves_data(p, *a) && moves_data(p, *b),
        _ => false,
    }
}

fn affine(p: &Program, e: TExprId) -> bool {
    texc_compiler::affine::affine_in_vars(p, e).is_some()
}

/// Largest expression (in nodes) that inlining may build; past it the
/// producer is materialized, so that chains of element-wise statements
/// compile in time linear in their length.
const MAX_INLINED_NODES: usize = 512;

/// Nodes of the tree of `e` (shared sub-expressions counted per use), counting at most to `cap`.
fn tree_size(p: &Program, e: TExprId, cap: usize) -> usize {
    let mut n = 1;
    for c in p.children(e) {
        if n >= cap {
            break;
        }
        n += tree_size(p, c, cap - n);
    }
    n.min(cap)
}

/// Loads of `t` in `e`.
fn load_count(p: &Program, e: TExprId, t: TensorId) -> usize {
    usize::from(matches!(p.expr(e), TExpr::Load(x, _) if *x == t))
        + p.children(e).into_iter().map(|c| load_count(p, c, t)).sum::<usize>()
}

/// Whether inlining stage `st` into each of its `consumers` stages costs
/// no more memory traffic than storing it once and reading it back there:
/// each copy loads what `st` loads (`k·L` loads against `L + 1 + k`). A
/// Winograd output transform (18 loads, gathered) read by a residual
/// add and the next layer's padding is stored instead (ResNet-18:
/// recomputed per reader, it cost 0.4–0.5 ms per reader).
///
/// Nor is a stage that branches on a layout change along its innermost
/// axis (`Am[.., x / 4]` under `select(x % 4 == ..)`, a Winograd output
/// transform; a broadcast `mu[n, w / 8]` takes no branch):
/// inlined into a reader whose vectors run along `x`, every lane would
/// gather its own element and take its own branch; stored by its own
/// nest, the branches are per loop iteration (ResNet-18's first padded
/// layer input: 0.67 → 0.25 ms).
fn recomputing_pays(p: &Program, st: &Stage, consumers: usize) -> bool {
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let relaid = st.n_axes.checked_sub(1).is_some_and(|a| branches_per_lane(p, st.value, a as VarId));
    !relaid && (consumers <= 1 || (consumers - 1) * loads.len() <= consumers + 1)
}

/// Whether `e` has a `select` whose condition divides or takes the
/// remainder of an expression of `v`.
fn branches_per_lane(p: &Program, e: TExprId, v: VarId) -> bool {
    fn div_mod_of(p: &Program, e: TExprId, v: VarId) -> bool {
        let here = matches!(p.expr(e), TExpr::Binary(BinOp::FloorDiv | BinOp::FloorMod, a, _) if uses_var(p, *a, v));
        here || p.children(e).into_iter().any(|c| div_mod_of(p, c, v))
    }
    let here = matches!(p.expr(e), TExpr::Select(c, ..) if div_mod_of(p, *c, v));
    here || p.children(e).into_iter().any(|c| branches_per_lane(p, c, v))
}

/// Whether inlining stage `st` into consumer `c` keeps `c` within bounds:
/// a producer read more than once is copied once per read, so only cheap
/// ones are (never an `exp` twice), and never past [`MAX_INLINED_NODES`].
fn inlining_stays_small(p: &Program, st: &Stage, c: &Stage, repeatable: bool) -> bool {
    let reads = load_count(p, c.value, st.tensor);
    let producer = tree_size(p, st.value, MAX_INLINED_NODES + 1);
    let consumer = tree_size(p, c.value, MAX_INLINED_NODES + 1);
    (reads <= 1 || repeatable) && consumer + reads * producer <= MAX_INLINED_NODES
}
