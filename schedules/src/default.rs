//! The default schedule for kernels without a `schedule`: for CPU targets
//! as below, for GPU targets a grid over each stage's elements
//! ([`gpu_schedule`]).
//! Every machine parameter (vector width per element type, register count)
//! comes from the [`Target`].
//!
//! - Element-wise temporaries whose consumers are all element-wise (and
//!   read them at one position per point, through affine indices) are
//!   inlined (fused) into them; producers of reductions stay materialized,
//!   so that they are not recomputed for every reduction step.
//! - After reductions are hoisted, an element-wise stage read at the same
//!   points by element-wise stages only is inlined into them
//!   ([`inline_epilogues`]: a convolution's bias and activation in one pass).
//! - Index quotients and remainders the variables' ranges decide are
//!   simplified (`normalize::simplify_div_mod`); trailing reduction
//!   variables that walk every read as one dense row become one
//!   (`normalize::fuse_dense_reductions`); then float reductions along rows
//!   are factored into vector-width partial results (`normalize::rfactor`),
//!   so that they vectorize.
//! - Reductions run with their reduction loops outside the innermost
//!   spatial loop, so that the innermost loop writes contiguous memory —
//!   unless they reduce along rows (`max[d](X[n, d])`): then the reduction
//!   runs innermost over contiguous memory and the rows run in parallel.
//! - An element-wise stage's short rows (`W = 3`) are fused with the axes
//!   before them while every read walks them as one dense row
//!   ([`fuse_short_rows`]); a stage of short rows that divides per element uses 256-bit
//!   vectors on AVX-512.
//! - An element-wise stage that transposes (its vectors gather from a
//!   tensor over 32 KiB, one cache line per lane) runs a block of lanes
//!   outermost and walks the gathered lines in order inside it
//!   ([`transposing_order`]).
//! - The innermost spatial loop is split by the vector width and vectorized;
//!   rows of another spatial loop are unrolled inside the reduction loops
//!   (register blocking, 3/4 of the vector registers as accumulators), and
//!   long GEMM rows get BLIS-style blocking with packed panels (per
//!   256-deep slice of the reduction; a reduction of one slice, per block
//!   of columns where those blocks are the outermost loop).
//! - Outer spatial loops are fused until there is enough parallel work
//!   (≥ 64 iterations), and that loop runs on the thread pool — when the
//!   stage has at least 2^15 loop iterations in all; smaller stages run on
//!   one thread, faster than the pool can hand work out.
//! - Temporaries of which each iteration of their reader's outermost loop
//!   needs its own part (a row's statistics, a softmax's exponentials) are
//!   computed inside that loop (`compute_at`), so that the part stays in
//!   L1 (or L2).

use crate::analysis::{loads_in, outside_indices};
use crate::ir::{ForKind, GpuDim, MmaOp};
use crate::normalize::{contains_reduce, fresh_name, hoist_reductions, inline_stage};
use crate::schedule::{Attach, LayoutDim, Schedules, StageSchedule};
use texc_compiler::ops::{BinOp, MathFn};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, TensorRole, VarId};
use texc_grammar::Span;

/// Whether `e` loads tensor `t`.
pub(crate) fn loads(p: &Program, e: TExprId, t: TensorId) -> bool {
    matches!(p.expr(e), TExpr::Load(x, _) if *x == t) || p.children(e).into_iter().any(|c| loads(p, c, t))
}

/// Whether evaluating `e` is cheap enough to repeat: no transcendental functions.
fn cheap(p: &Program, e: TExprId) -> bool {
    let costly = matches!(p.expr(e), TExpr::Math(f, _) if f.is_costly());
    !costly && p.children(e).into_iter().all(|c| cheap(p, c))
}

fn volume(st: &Stage) -> i64 {
    st.vars.iter().map(|v| v.extent).product()
}

/// Whether stage `c` reads `t` at one position per point (the same access
/// written twice counts once), through affine indices. Inlining `t` then
/// computes each of its values once per use; reading several neighbours
/// (`Bd[.., 0, ..] - Bd[.., 2, ..]`) would recompute it per neighbour, and a
/// layout change (`Z[.., w % 4, w / 4]`) would evaluate its branches per
/// vector lane instead of once per loop iteration.
fn reads_like_elementwise(p: &Program, c: &Stage, t: TensorId) -> bool {
    let mut all = Vec::new();
    loads_in(p, c.value, &mut all);
    let mut positions: Vec<Vec<String>> = Vec::new();
    for l in all {
        let TExpr::Load(x, idx) = p.expr(l) else { continue };
        if *x != t {
            continue;
        }
        if !idx.iter().all(|&i| affine(p, i)) {
            return false;
        }
        let key: Vec<String> = idx.iter().map(|&i| texc_compiler::print::expr(p, c, i)).collect();
        if !positions.contains(&key) {
            positions.push(key);
        }
    }
    positions.len() <= 1
}

fn affine(p: &Program, e: TExprId) -> bool {
    texc_compiler::affine::affine_in_vars(p, e).is_some()
}

/// Inline element-wise temporaries into element-wise consumers (when that
/// duplicates no costly work and keeps expressions small), and cheap
/// ones into reductions that visit no more points than the temporary has
/// (`sum[d](xc[n, d] * xc[n, d])` reads each `xc` once: inlining it saves
/// a round trip to memory; a matmul operand is read `N` times: it stays).
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

pub fn default_inlining(p: &mut Program) {
    inline_elementwise(p, false)
}

/// [`default_inlining`]; on GPUs (`recompute`), where memory traffic costs
/// more than arithmetic, costly element-wise temporaries (a softmax's
/// `exp`) are inlined into reductions too, and so computed once per reader.
/// After [`hoist_reductions`]: an element-wise stage over the same points
/// as every element-wise stage that reads it is inlined into them, so that a
/// reduction's epilogue and the operators after it are one pass over the
/// output (a convolution's `y0 = y0.r0 + b[k]` hoisted out of
/// `conv2d_bias`, then `clip(y0, 0, 6)`), not one pass each. Statistics
/// read at fewer points than their readers have (`mu[n]` in `X[n, d] - mu[n]`)
/// stay as they are.
fn inline_epilogues(p: &mut Program) {
    let mut si = 0;
    while si < p.stages.len() {
        let st = &p.stages[si];
        let t = st.tensor;
        let readers: Vec<&Stage> = p.stages[si + 1..].iter().filter(|c| loads(p, c.value, t)).collect();
        let inlinable = p.tensor(t).role == TensorRole::Temp
            && !contains_reduce(p, st.value)
            && recomputing_pays(p, st, readers.len())
            && !readers.is_empty()
            && readers.iter().all(|c| {
                !contains_reduce(p, c.value)
                    && volume(c) == volume(st)
                    && reads_like_elementwise(p, c, t)
                    && inlining_stays_small(p, st, c, cheap(p, st.value))
            });
        if inlinable {
            inline_stage(p, si);
        } else {
            si += 1;
        }
    }
}

fn inline_elementwise(p: &mut Program, recompute: bool) {
    let mut si = 0;
    while si < p.stages.len() {
        let st = &p.stages[si];
        let t = st.tensor;
        let repeatable = cheap(p, st.value);
        let recomputable = repeatable || recompute;
        let consumers = p.stages[si + 1..].iter().filter(|c| loads(p, c.value, t)).count();
        let inlinable = p.tensor(t).role == TensorRole::Temp
            && !contains_reduce(p, st.value)
            && (recompute || recomputing_pays(p, st, consumers))
            && p.stages[si + 1..].iter().filter(|c| loads(p, c.value, t)).all(|c| {
                inlining_stays_small(p, st, c, repeatable)
                    && if contains_reduce(p, c.value) {
                        recomputable && volume(c) <= volume(st)
                    } else {
                        reads_like_elementwise(p, c, t)
                    }
            });
        if inlinable {
            inline_stage(p, si);
        } else {
            si += 1;
        }
    }
}

/// Parameters of the default schedule that `--knob` (and the autotuner)
/// may set for a kernel without a schedule block of its own — together the
/// space `texc tune` searches for it, generated from the kernel's structure
/// rather than a template:
/// - register blocking: `rows` (rows of a register block, taken as given:
///   a last, shorter block is a copy of the loops), `nvec` (vectors across a
///   BLIS-style micro-kernel, which is also the width of its packed panels);
/// - multi-level tiling: `kslice` (depth of the reduction slices of long
///   products), `cols` (columns of a block of packed panels);
/// - `pack` (0: no packing of the vector operand);
/// - `order` (1: a long product's column panels outside its row blocks,
///   so a packed panel stays in L1 across the rows instead of a block of
///   rows across the panels);
/// - `unroll` (the innermost reduction loop of a register block unrolled by
///   that many iterations);
/// - `par` (0: no loop runs on the thread pool), `vec` (vector width in
///   bits, at most the target's: 256 on an AVX-512 target);
/// - `attach` (0: every stage in a loop nest of its own, instead of
///   temporaries computed inside the loop of the stage that reads them);
/// - `racc` (vectors of partial results of a float row reduction: its
///   independent combining chains);
/// - `recip` (1: every float division by a value that stays the same along
///   the row, `/ sqrt(v[n] + eps)` too, is a multiplication by a reciprocal
///   computed once per row; 0: none is; by default only divisions by a
///   loaded value, a softmax's `/ s[n]`);
/// - `acc` (0: a register block accumulates into its output in memory,
///   initialised by a nest of its own, and its epilogue is a pass of its
///   own, instead of accumulators in registers written once through the
///   epilogue: [`local_accumulators`], [`fold_epilogues`]);
/// - on GPUs, `gather` (0: a convolution's
///   columns are written out, an explicit im2col, instead of gathered from
///   the image into shared memory), and for tensor-core products through
///   shared memory `gtile` (the largest block tile side tried: 128 or 64;
///   the 64×64 warp tiles stay), `gslice` (the largest slice of the
///   reduction tried: 64 or 32) and `stages` (slices in flight, 2 to 4).
///
/// Unset, each keeps its machine-derived value. [`crate::knobs`] is the
/// table of them: names, the values `--knob` accepts and `tune` tries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DefaultKnobs {
    pub rows: Option<i64>,
    pub kslice: Option<i64>,
    pub cols: Option<i64>,
    pub pack: Option<bool>,
    pub par: Option<bool>,
    pub vec: Option<i64>,
    pub nvec: Option<i64>,
    pub order: Option<bool>,
    pub unroll: Option<i64>,
    pub attach: Option<bool>,
    pub racc: Option<i64>,
    pub recip: Option<bool>,
    pub acc: Option<bool>,
    pub gather: Option<bool>,
    pub gtile: Option<i64>,
    pub gslice: Option<i64>,
    pub stages: Option<i64>,
}

/// The machine a default schedule is made for: vector width and registers.
#[derive(Clone, Copy)]
struct Machine {
    /// Lanes of the stage's compute type.
    lanes: i64,
    /// Accumulator vectors a register block keeps (about 3/4 of the registers).
    accumulators: i64,
    /// Lanes of the half-width vector, where that is still 256 bits or more
    /// (AVX-512 machines run 256-bit vectors at full rate): loops shorter than
    /// a full vector but at least this long use it instead of staying scalar.
    half_lanes: Option<i64>,
    knobs: DefaultKnobs,
}

impl Machine {
    fn of(target: &Target, st: &Stage, p: &Program, knobs: DefaultKnobs) -> Machine {
        let full_bits = target.vector_bits as i64;
        // `vec`: narrower vectors than the target's (256-bit ones on AVX-512).
        let bits = knobs.vec.map_or(full_bits, |b| b.min(full_bits)).max(1);
        let lanes = (target.compute_lanes(p.tensor(st.tensor).elem) * bits / full_bits.max(1)).max(1);
        let half_bits = bits / 2;
        let half_lanes = (half_bits >= 256 && lanes >= 2).then_some(lanes / 2);
        let accumulators = (target.vector_registers as i64 * 3 / 4).max(2);
        // Short rows (under four full vectors) that divide per element use
        // the 256-bit vector: a 512-bit vector's tail costs as much as a whole
        // 256-bit one, and division and square root run no faster per element
        // in 512-bit vectors (measured here, Zen 5: 1.5× slower). Long rows
        // keep 512 bits (`layer_norm` over 1024: 15 % faster).
        if let (Some(half), Some(inner)) = (half_lanes, st.n_axes.checked_sub(1)) {
            let short = st.vars[inner].extent < 4 * lanes;
            if short && divides_per_element(p, st.value, inner as VarId) {
                return Machine { lanes: half, accumulators, half_lanes: None, knobs };
            }
        }
        Machine { lanes, accumulators, half_lanes, knobs }
    }

    /// The vector width for an innermost loop of `extent` iterations: the
    /// full vector when the loop fills one, else the half-width vector when
    /// it fills that, else none (0).
    fn width_for(self, extent: i64) -> i64 {
        match self.half_lanes {
            _ if extent >= self.lanes => self.lanes,
            Some(half) if extent >= half => half,
            // AVX-512 masks partial vectors at full speed: a row of half a
            // 256-bit vector or more is one vector of its own length.
            Some(half) if 2 * extent >= half => extent,
            _ => 0,
        }
    }
}

/// Vectors of partial results of a row reduction: its combining chains run
/// at once. Up to 32 lanes in all (four 256-bit vectors, two 512-bit ones),
/// each chain taking at least 8 vectors of the row (`racc` sets the count,
/// as far as the row allows). A single chain waits a vector operation's
/// latency per vector: on AVX2, rows of 1024 with four chains ran
/// softmax 4.35 → 3.86 ms and layer_norm 1.63 → 1.18 ms (4096 rows, 1
/// thread); on AVX-512 two chains ran softmax 3.56 → 3.10 ms, layer_norm
/// 1.09 → 1.17 ms.
/// A row that whole vectors divide keeps to counts that divide it too (1000
/// lanes of f32 on AVX2: one vector, not four and a guard on every element).
fn partial_vectors(row: i64, lanes: i64, racc: Option<i64>) -> i64 {
    let lanes = lanes.max(1);
    let most = racc.unwrap_or((32 / lanes).clamp(1, 4)).min(row / (8 * lanes)).max(1);
    if row % lanes != 0 {
        return most;
    }
    (1..=most).rev().find(|k| row % (k * lanes) == 0).unwrap_or(1)
}

/// Whether `e` divides, or takes a square root of, a float that varies along variable `v`.
fn divides_per_element(p: &Program, e: TExprId, v: VarId) -> bool {
    let float = matches!(p.ty(e), texc_compiler::tir::Ty::Elem(t) if t.is_float());
    let here = match p.expr(e) {
        TExpr::Binary(BinOp::Div, ..) | TExpr::Math(MathFn::Sqrt | MathFn::Rsqrt, _) => float && uses_var(p, e, v),
        _ => false,
    };
    here || p.children(e).into_iter().any(|c| divides_per_element(p, c, v))
}

/// The default schedule of `p` for `target`; inlines and factors stages of `p` first.
pub fn default_schedule(p: &mut Program, target: &Target) -> Schedules {
    default_schedule_with(p, target, DefaultKnobs::default())
}

// ---------------------------------------------------- preparation passes
// What each target family's default schedule needs of the tensor IR first;
// `crate::prepare` lists them in order.

/// *one-hot-gathers*: sums of one-hot products (`sum[v](E[v, d] * (ids[i] == v))`) as loads.
pub(crate) fn one_hot_gathers(p: &mut Program, _: &Target, _: DefaultKnobs) {
    for si in 0..p.stages.len() {
        crate::normalize::one_hot_gather(p, si);
    }
}

/// *inline-elementwise*: element-wise temporaries into their readers (on
/// GPUs costly ones into reductions too: [`inline_elementwise`]).
pub(crate) fn inline_elementwise_step(p: &mut Program, t: &Target, _: DefaultKnobs) {
    inline_elementwise(p, t.kind == TargetKind::Gpu)
}

/// *hoist-reductions*: a reduction inside a larger expression becomes a stage of its own.
pub(crate) fn hoist_reductions_step(p: &mut Program, _: &Target, _: DefaultKnobs) {
    hoist_reductions(p)
}

/// *inline-epilogues*: a reduction's epilogue and the operators after it as one pass ([`inline_epilogues`]).
pub(crate) fn inline_epilogues_step(p: &mut Program, _: &Target, _: DefaultKnobs) {
    inline_epilogues(p)
}

/// *simplify-div-mod*: divisions and remainders the sizes make trivial (a
/// convolution of one group reads `X[n, k / K * C + c, ..]`: `X[n, c, ..]`).
pub(crate) fn simplify_div_mod(p: &mut Program, _: &Target, _: DefaultKnobs) {
    for si in 0..p.stages.len() {
        crate::normalize::simplify_div_mod(p, si);
    }
}

/// *im2col* (GPUs): convolutions whose tiles fit as tensor-core products.
pub(crate) fn im2col(p: &mut Program, _: &Target, _: DefaultKnobs) {
    crate::im2col::convolutions_to_gemm(p);
}

/// *reciprocals*: a divisor that varies only along outer loops is inverted
/// once per row, a stage of its own (knob `recip`).
pub(crate) fn reciprocals(p: &mut Program, _: &Target, knobs: DefaultKnobs) {
    if knobs.recip == Some(false) {
        return;
    }
    let mut si = 0;
    while si < p.stages.len() {
        if crate::normalize::reciprocal_divisors(p, si, knobs.recip == Some(true)) {
            // The reciprocals' stage, now at `si`, is prepared as any other.
            crate::normalize::simplify_div_mod(p, si);
            continue;
        }
        si += 1;
    }
}

/// *fuse-dense-reductions*: a float reduction along rows over dense loops as one loop.
pub(crate) fn fuse_dense_reductions(p: &mut Program, _: &Target, _: DefaultKnobs) {
    for si in 0..p.stages.len() {
        if p.tensor(p.stages[si].tensor).elem.is_float() && reduces_along_rows(p, &p.stages[si]) {
            crate::normalize::fuse_dense_reductions(p, si);
        }
    }
}

/// *rfactor*: row reductions of floats factored so that their partial results vectorize.
pub(crate) fn rfactor(p: &mut Program, target: &Target, knobs: DefaultKnobs) {
    let mut si = 0;
    while si < p.stages.len() {
        let float = p.tensor(p.stages[si].tensor).elem.is_float();
        let st = &p.stages[si];
        let m = Machine::of(target, st, p, knobs);
        // Partial results are combined one by one at the end of each row: a
        // row of fewer than four full vectors keeps fewer of them.
        let row = st.vars.get(st.n_axes).map_or(0, |v| v.extent);
        let lanes = match m.half_lanes {
            Some(half) if row < 4 * m.lanes => half,
            _ => m.lanes,
        };
        let lanes = lanes * partial_vectors(row, lanes, knobs.racc);
        if float && lanes > 1 && reduces_along_rows(p, st) && crate::normalize::rfactor(p, si, lanes) {
            si += 1;
        }
        si += 1;
    }
}

/// [`default_schedule`] with some of its parameters set ([`DefaultKnobs`]):
/// the target's preparation passes ([`crate::prepare`]), then
/// [`schedule_prepared`]. (The pipeline runs the passes one by one.)
pub fn default_schedule_with(p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules {
    crate::prepare::prepare(p, target, knobs);
    schedule_prepared(p, target, knobs)
}

/// The default schedule of `p`, which the target's preparation passes
/// ([`crate::prepare`]) have run on.
pub fn schedule_prepared(p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules {
    if target.kind == TargetKind::Gpu {
        return gpu_schedule(p, knobs);
    }
    let mut s = Schedules::new(p);
    let mut packs = Vec::new();
    for (si, ss) in s.stages.iter_mut().enumerate() {
        let st = &p.stages[si];
        let m = Machine::of(target, st, p, knobs);
        if reduces_along_rows(p, st) {
            schedule_row_reduction(ss);
            continue;
        }
        let pack = schedule_stage(ss, p, st, m);
        // A block whose reduction is sliced outside it stays in memory; one
        // packed per column block (its whole reduction inside) does not.
        if knobs.acc != Some(false) && pack.as_ref().is_none_or(|r| !ss.ivs[r.leaf].reduce) {
            local_accumulators(ss, p, st, m);
        }
        packs.extend(pack.map(|req| (si, req)));
    }
    // Last first: inserting a stage moves the later ones.
    for (si, req) in packs.into_iter().rev() {
        pack_operand(p, &mut s, si, req);
    }
    // Before attaching: a bias and activation applied as the accumulators are
    // stored costs nothing, one attached to the stage reading them is a pass of its own.
    fold_epilogues(p, &mut s);
    if knobs.attach != Some(false) {
        attach_producers(p, &mut s);
    }
    if knobs.par == Some(false) {
        // One thread: a small kernel's work below what handing it to the pool costs.
        for v in s.stages.iter_mut().flat_map(|ss| ss.ivs.iter_mut()) {
            if v.kind == ForKind::Parallel {
                v.kind = ForKind::Serial;
            }
        }
    }
    s
}

/// A register block's accumulators (the spatial loops inside its reduction
/// loops: unrolled rows, vectors of a row) in a local buffer at the loop
/// just outside the reductions (`cache_write`), registers after LLVM's
/// SROA: the block is initialised there and stored once, instead of an init
/// nest writing the whole output first and the update reading it back. A
/// block of more than twice the accumulator registers (a long product's
/// column block, whose reduction is sliced outside it) stays in memory.
fn local_accumulators(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) {
    let Some(first) = ss.leaves.iter().position(|&l| ss.ivs[l].reduce) else { return };
    let Some(&at) = first.checked_sub(1).map(|i| &ss.leaves[i]) else { return };
    let inner: Vec<usize> = ss.leaves[first..].iter().copied().filter(|&l| !ss.ivs[l].reduce).collect();
    let blocked = inner.iter().any(|&l| ss.ivs[l].kind == ForKind::Unrolled);
    let elements: i64 = inner.iter().map(|&l| ss.ivs[l].extent).product();
    if blocked && elements <= 2 * m.accumulators * m.lanes {
        ss.cache_write = Some((at, fresh_name(p, &format!("{}.acc", p.tensor(st.tensor).name))));
    }
}

/// An element-wise stage that alone reads a reduction with local
/// accumulators, at its own points (`y[n, k, h, w] = clip(y.r0[n, k, h, w] +
/// b[k], 0, 6)` after [`inline_epilogues`]), becomes that reduction's
/// epilogue: its write-back stores `y` from the accumulators, and `y.r0` is
/// never written (1×1 convolutions of MobileNetV2: one pass over the output
/// instead of three). Both stages at the root, nothing computed inside the
/// epilogue's loops, and what the epilogue reads is written neither between
/// them nor inside some stage's loops. It runs before [`attach_producers`]
/// (only the schedule's packing stages are attached yet), which keeps these
/// true: it attaches neither an epilogue, nor a stage with one, nor anything
/// into an epilogue or that one reads.
fn fold_epilogues(p: &Program, s: &mut Schedules) {
    for ai in 0..p.stages.len() {
        if s.stages[ai].cache_write.is_none() || s.attach[ai].is_some() || s.is_epilogue(ai) {
            continue;
        }
        let a = &p.stages[ai];
        let t = a.tensor;
        let readers: Vec<usize> = (0..p.stages.len()).filter(|&i| loads(p, p.stages[i].value, t)).collect();
        let [bi] = readers[..] else { continue };
        let b = &p.stages[bi];
        let mut reads = Vec::new();
        loads_in(p, b.value, &mut reads);
        let at_own_point = |&l: &TExprId| match p.expr(l) {
            TExpr::Load(x, idx) if *x == t => {
                idx.iter().enumerate().all(|(d, &i)| matches!(p.expr(i), TExpr::Var(v) if *v as usize == d))
            }
            _ => true,
        };
        // Stages between them have not run at the write-back; attached ones
        // exist only inside their owner's loops (perhaps not around it).
        let written_between = |l: &TExprId| match p.expr(*l) {
            TExpr::Load(x, _) => p
                .stages
                .iter()
                .enumerate()
                .any(|(ci, c)| c.tensor == *x && ((ai + 1..bi).contains(&ci) || s.attach[ci].is_some())),
            _ => false,
        };
        let foldable = bi > ai
            && p.tensor(t).role == TensorRole::Temp
            && !contains_reduce(p, b.value)
            && b.vars.len() == b.n_axes
            && b.n_axes == a.n_axes
            && p.tensor(b.tensor).shape == p.tensor(t).shape
            && reads.iter().all(at_own_point)
            && !reads.iter().any(written_between)
            && s.attach[bi].is_none()
            && !s.attach.iter().any(|x| matches!(x, Some(x) if x.owner == bi));
        if foldable {
            s.stages[ai].epilogue = Some(bi);
        }
    }
}

/// Threads per block of the default GPU schedule: a multiple of the warp
/// that leaves registers for a few blocks per multiprocessor.
const GPU_THREADS: i64 = 256;

/// The default GPU schedule: matrix products of f16 matrices on tensor
/// cores ([`tensor_core_gemm`]), few long reductions a block each
/// ([`block_per_element`]); for the other stages, the spatial loops fused into one,
/// split into blocks of [`GPU_THREADS`] threads (consecutive threads take
/// consecutive elements of the innermost axis, so their accesses coalesce),
/// and its reduction loops run by each thread for its element. A stage
/// without spatial loops runs on one thread.
fn gpu_schedule(p: &mut Program, knobs: DefaultKnobs) -> Schedules {
    let span = Span::default();
    let mut s = Schedules::new(p);
    let rows = row_groups(p);
    let mut staged = Vec::new();
    for (si, ss) in s.stages.iter_mut().enumerate() {
        if let Some(g) = rows.iter().find(|g| g.owner == si) {
            block_per_row(ss, g.rank);
            continue;
        }
        if let Some(gemm) = tensor_core_operands(p, &p.stages[si]) {
            match shared_gemm_tiles(&gemm, knobs) {
                Some(tiles) => {
                    pipelined_gemm(ss, tiles, gemm.op);
                    staged.push((si, gemm, tiles));
                }
                None => tensor_core_gemm(ss, gemm.op),
            }
            continue;
        }
        if register_tiled(p, &p.stages[si], ss) || block_per_element(ss) {
            continue;
        }
        let spatial: Vec<usize> = ss.leaves.iter().copied().filter(|&l| !ss.ivs[l].reduce).collect();
        if spatial.is_empty() {
            continue;
        }
        let lanes = gpu_vector_lanes(p, &p.stages[si], ss, &spatial);
        let mut fused = fuse_all(ss, &spatial);
        let name = ss.ivs[fused].name.clone();
        if lanes > 1 {
            let (outer, v) = ss
                .split(fused, lanes, (&format!("{name}.e"), span), (&format!("{name}.v"), span), span)
                .expect("fresh names");
            ss.annotate(v, ForKind::Vectorized, span).expect("spatial");
            fused = outer;
        }
        let threads = GPU_THREADS.min(ss.ivs[fused].extent).max(1);
        let (b, t) = ss
            .split(fused, threads, (&format!("{name}.b"), span), (&format!("{name}.t"), span), span)
            .expect("fresh names");
        ss.annotate(b, ForKind::Block(GpuDim::X), span).expect("spatial");
        ss.annotate(t, ForKind::Thread(GpuDim::X), span).expect("spatial");
    }
    // Row groups first: their stage indices are from before the operands'
    // stages are inserted (and gathers removed); attachments move with those.
    for g in &rows {
        attach_row_group(p, &mut s, g);
    }
    // Last first: inserting a stage moves the later ones.
    for (si, gemm, tiles) in staged.into_iter().rev() {
        stage_gemm_operands(p, &mut s, si, &gemm, tiles, knobs.gather != Some(false));
    }
    s
}

/// Elements per thread of the default GPU schedule's grid over an
/// element-wise stage: 16 bytes of its element (4 floats) where every
/// tensor it reads or writes is 4 bytes wide and walks the innermost axis
/// densely or not at all (its 16-byte vectors then stay aligned: the
/// stage's element count is a multiple of 4 and of a block's threads), and
/// there are at least as many vectors as a block has threads; else 1.
fn gpu_vector_lanes(p: &Program, st: &Stage, ss: &StageSchedule, spatial: &[usize]) -> i64 {
    const LANES: i64 = 4;
    let inner = st.n_axes as u32 - 1;
    let elements: i64 = spatial.iter().map(|&l| ss.ivs[l].extent).product();
    if spatial.len() != st.n_axes || st.vars.len() != st.n_axes || elements % (LANES * GPU_THREADS) != 0 {
        return 1;
    }
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let word = |t: TensorId| p.tensor(t).elem.size() == 4;
    let dense = |e: TExprId| {
        let TExpr::Load(t, idx) = p.expr(e) else { return false };
        let last = idx.len().checked_sub(1);
        let along = |i: usize| idx.iter().enumerate().all(|(d, &x)| (d == i) != !uses_var(p, x, inner));
        word(*t)
            && match last {
                Some(l) if uses_var(p, idx[l], inner) => {
                    along(l)
                        && matches!(p.expr(idx[l]), TExpr::Var(v) if *v == inner)
                        && p.tensor(*t).shape[l] == st.vars[inner as usize].extent
                }
                _ => !idx.iter().any(|&x| uses_var(p, x, inner)),
            }
    };
    let out = word(st.tensor) && ss.ivs[*spatial.last().expect("axes")].extent % LANES == 0;
    if out && loads.iter().all(|&l| dense(l)) {
        LANES
    } else {
        1
    }
}

/// Stages computed a block per row (GPU): an element-wise stage `C[r.., d..]`
/// (the owner) and the temporaries `P[r..]` of its rows (a softmax's max and
/// sum, a normalization's mean and variance) that only it and each other
/// read, each at the row being computed. They are computed where the
/// owner's block opens, into shared memory, so that a row is read from
/// memory once and the rest of the passes over it find it in the caches.
struct RowGroup {
    owner: usize,
    /// The leading axes of the owner that are the rows.
    rank: usize,
    /// In stage order, the reductions over threads first to last.
    members: Vec<usize>,
}

fn row_groups(p: &Program) -> Vec<RowGroup> {
    let mut out: Vec<RowGroup> = Vec::new();
    for (o, c) in p.stages.iter().enumerate().rev() {
        if contains_reduce(p, c.value) || out.iter().any(|g| g.members.contains(&o)) {
            continue;
        }
        // Candidates: temporaries whose rank is a proper prefix of the owner's.
        let rank_of = |t: TensorId| p.tensor(t).shape.len();
        let mut members: Vec<usize> = (0..o)
            .filter(|&q| {
                let t = p.stages[q].tensor;
                let k = rank_of(t);
                p.tensor(t).role == TensorRole::Temp
                    && k >= 1
                    && k < c.vars.len()
                    && p.tensor(t).shape[..] == c.vars[..k].iter().map(|v| v.extent).collect::<Vec<_>>()[..]
            })
            .collect();
        // Keep those every reader of which is the owner or another member,
        // reading the row it computes; repeat until nothing more drops out.
        loop {
            let before = members.len();
            let group: Vec<usize> = members.iter().copied().chain([o]).collect();
            members.retain(|&q| {
                let t = p.stages[q].tensor;
                let readers: Vec<usize> = (q + 1..p.stages.len()).filter(|&r| loads(p, p.stages[r].value, t)).collect();
                !readers.is_empty()
                    && readers.iter().all(|&r| group.contains(&r) && reads_its_row(p, &p.stages[r], t, rank_of(t)))
            });
            if members.len() == before {
                break;
            }
        }
        // Every member has the same rows, and one of them reduces a long row.
        let Some(&first) = members.first() else { continue };
        let rank = rank_of(p.stages[first].tensor);
        let long = |q: usize| {
            let st = &p.stages[q];
            contains_reduce(p, st.value) && st.vars[rank..].iter().map(|v| v.extent).product::<i64>() >= LONG_REDUCTION
        };
        if members.iter().all(|&q| rank_of(p.stages[q].tensor) == rank) && members.iter().any(|&q| long(q)) {
            out.push(RowGroup { owner: o, rank, members });
        }
    }
    out
}

/// Whether every load of `t` (of rank `k`) in stage `r` is at `r`'s first
/// `k` variables: the row `r` is computing.
fn reads_its_row(p: &Program, r: &Stage, t: TensorId, k: usize) -> bool {
    let mut all = Vec::new();
    loads_in(p, r.value, &mut all);
    all.iter().all(|&l| match p.expr(l) {
        TExpr::Load(x, idx) if *x == t => {
            idx.len() == k && idx.iter().enumerate().all(|(i, &e)| matches!(p.expr(e), TExpr::Var(v) if *v == i as u32))
        }
        _ => true,
    })
}

/// Fuse adjacent loops `leaves` (outer first, of one kind) into one.
fn fuse_all(ss: &mut StageSchedule, leaves: &[usize]) -> usize {
    let span = Span::default();
    let mut fused = leaves[0];
    for &next in &leaves[1..] {
        let name = format!("{}.{}", ss.ivs[fused].name, ss.ivs[next].name);
        fused = ss.fuse(fused, next, (&name, span), span).expect("adjacent loops of one kind");
    }
    fused
}

/// Split loop `leaf` over up to [`GPU_THREADS`] threads (whole warps),
/// `thread.x` inside: consecutive threads take consecutive iterations.
/// The outer loop and the threads' loop.
fn over_threads(ss: &mut StageSchedule, leaf: usize) -> (usize, usize) {
    let span = Span::default();
    let threads = GPU_THREADS.min((ss.ivs[leaf].extent + 31) / 32 * 32);
    let name = ss.ivs[leaf].name.clone();
    let (o, t) =
        ss.split(leaf, threads, (&format!("{name}.o"), span), (&format!("{name}.t"), span), span).expect("fresh");
    ss.annotate(t, ForKind::Thread(GpuDim::X), span).expect("a loop of threads");
    (o, t)
}

/// The owner of a row group: its row axes fused into one loop over blocks,
/// the rest fused and split over the block's threads (consecutive threads
/// take consecutive elements; each thread walks the row in strides).
fn block_per_row(ss: &mut StageSchedule, rank: usize) {
    let span = Span::default();
    let leaves = ss.leaves.clone();
    let row = fuse_all(ss, &leaves[..rank]);
    let inner = fuse_all(ss, &leaves[rank..]);
    let (o, t) = over_threads(ss, inner);
    ss.reorder(&[row, t, o], span).expect("the stage's leaves");
    ss.annotate(row, ForKind::Block(GpuDim::X), span).expect("spatial");
}

/// Attach the members of a row group at its owner's block loop; their
/// reductions are over the block's threads. Left as scheduled separately
/// when the boxes cannot be inferred.
fn attach_row_group(p: &Program, s: &mut Schedules, g: &RowGroup) {
    let span = Span::default();
    let leaf = s.stages[g.owner].leaves[0];
    let mut trial = s.clone();
    let fresh = Schedules::new(p);
    for &q in &g.members {
        trial.stages[q] = fresh.stages[q].clone();
        let ss = &mut trial.stages[q];
        let reduce: Vec<usize> = ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce).collect();
        if !reduce.is_empty() {
            let r = fuse_all(ss, &reduce);
            over_threads(ss, r);
        }
        trial.attach[q] = Some(Attach { owner: g.owner, leaf, layout: None, shared: false, span });
    }
    if crate::attach::infer(p, &mut trial.clone()).is_ok() {
        *s = trial;
    }
}

/// Elements a thread of [`register_tiled`] computes along each of its two
/// axes (4×4 accumulators in registers).
const THREAD_TILE: i64 = 4;
/// Threads along each axis of a block of [`register_tiled`] (16×16 = 256).
const TILE_THREADS: i64 = 16;

/// A contraction that tensor cores do not run (f32 products, Winograd's
/// batched products, direct convolutions): each thread computes a 4×4
/// block of two spatial axes `i` and `j` with its accumulators in registers
/// (`cache_write` at its thread loop), so that each element it reads of an
/// operand that does not depend on `i` (or `j`) serves 4 products; blocks of
/// 16×16 threads (64×64 of the result), the other spatial axes fused over
/// `block.z`. `j` is the innermost spatial axis, fused with the ones
/// before it while shorter than a block's 64 columns (an image's
/// positions; consecutive threads write consecutive elements) and an `i`
/// remains: the innermost other axis that some read does not depend on
/// while another read does not depend on `j` (an outer product: `A[i, k]`
/// and `B[k, j]`), at least 16 long, as `j` is. Whether the stage is one
/// (and is now so scheduled).
fn register_tiled(p: &Program, st: &Stage, ss: &mut StageSchedule) -> bool {
    let span = Span::default();
    let spatial: Vec<usize> = ss.leaves.iter().copied().filter(|&l| !ss.ivs[l].reduce).collect();
    let reduce: Vec<usize> = ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce).collect();
    if reduce.is_empty() || !contains_reduce(p, st.value) {
        return false;
    }
    let mut all = Vec::new();
    loads_in(p, st.value, &mut all);
    let free_of = |l: TExprId, v: usize| !uses_var(p, l, v as u32);
    // `i` for trailing axes `j_axes`: the innermost other axis of an outer product.
    let find_i = |others: &[usize], j_axes: &[usize]| {
        let free_of_j = |l: TExprId| j_axes.iter().all(|&v| free_of(l, v));
        let outer = |i: usize| {
            all.iter().any(|&a| free_of(a, i) && all.iter().any(|&b| b != a && free_of_j(b) && !free_of(b, i)))
        };
        others.iter().rev().copied().find(|&i| ss.ivs[i].extent >= TILE_THREADS && outer(i))
    };
    // As many trailing axes as make a block's 64 columns, where an `i` remains.
    let mut pick = None;
    for js in 1..spatial.len() {
        let (others, j_axes) = spatial.split_at(spatial.len() - js);
        let columns: i64 = j_axes.iter().map(|&l| ss.ivs[l].extent).product();
        if columns >= TILE_THREADS {
            if let Some(i) = find_i(others, j_axes) {
                pick = Some((js, i));
            }
        }
        if columns >= TILE_THREADS * THREAD_TILE {
            break;
        }
    }
    let Some((js, i)) = pick else { return false };
    let (others, j_axes) = spatial.split_at(spatial.len() - js);
    let batch: Vec<usize> = others.iter().copied().filter(|&l| l != i).collect();
    let blocks_z: i64 = batch.iter().map(|&l| ss.ivs[l].extent).product();
    let blocks_y = (ss.ivs[i].extent + TILE_THREADS * THREAD_TILE - 1) / (TILE_THREADS * THREAD_TILE);
    if blocks_z > 65535 || blocks_y > 65535 {
        return false;
    }
    let name = |ss: &StageSchedule, l: usize, s: &str| format!("{}.{s}", ss.ivs[l].name);
    let order: Vec<usize> =
        batch.iter().copied().chain([i]).chain(j_axes.iter().copied()).chain(reduce.iter().copied()).collect();
    ss.reorder(&order, span).expect("the stage's leaves");
    let j = fuse_all(ss, j_axes);
    let z = (!batch.is_empty()).then(|| fuse_all(ss, &batch));
    let mut tiles = Vec::new();
    for a in [i, j] {
        let (b, a2) = ss
            .split(a, TILE_THREADS * THREAD_TILE, (&name(ss, a, "b"), span), (&name(ss, a, "2"), span), span)
            .expect("fresh names");
        let (t, r) =
            ss.split(a2, THREAD_TILE, (&name(ss, a, "t"), span), (&name(ss, a, "r"), span), span).expect("fresh names");
        tiles.push((b, t, r));
    }
    let [(ib, it, ir), (jb, jt, jr)] = tiles[..] else { unreachable!("two axes") };
    let order: Vec<usize> = z.into_iter().chain([ib, jb, it, jt]).chain(reduce).chain([ir, jr]).collect();
    ss.reorder(&order, span).expect("the stage's leaves");
    if let Some(z) = z {
        ss.annotate(z, ForKind::Block(GpuDim::Z), span).expect("spatial");
    }
    for (l, kind) in [
        (ib, ForKind::Block(GpuDim::Y)),
        (jb, ForKind::Block(GpuDim::X)),
        (it, ForKind::Thread(GpuDim::Y)),
        (jt, ForKind::Thread(GpuDim::X)),
        (ir, ForKind::Unrolled),
        (jr, ForKind::Unrolled),
    ] {
        ss.annotate(l, kind, span).expect("spatial");
    }
    ss.cache_write = Some((jt, fresh_name(p, &format!("{}.acc", p.tensor(st.tensor).name))));
    true
}

/// Reductions at least this long, of stages with fewer elements than
/// [`FEW_ELEMENTS`] (too few for one thread each to fill a GPU), are
/// computed by a block per element.
const LONG_REDUCTION: i64 = 64;
const FEW_ELEMENTS: i64 = 65536;

/// A reduction stage with few, long reductions (a softmax's or a
/// normalization's rows): one block per element, whose threads each reduce
/// a strided part of it (consecutive threads read consecutive elements),
/// combined by warp shuffles (`crate::cross_thread`). Whether the
/// stage is one (and is now so scheduled).
fn block_per_element(ss: &mut StageSchedule) -> bool {
    let span = Span::default();
    let (spatial, reduce): (Vec<usize>, Vec<usize>) = ss.leaves.iter().partition(|&&l| !ss.ivs[l].reduce);
    let elements: i64 = spatial.iter().map(|&l| ss.ivs[l].extent).product();
    let length: i64 = reduce.iter().map(|&l| ss.ivs[l].extent).product();
    if reduce.is_empty() || length < LONG_REDUCTION || elements >= FEW_ELEMENTS {
        return false;
    }
    if !spatial.is_empty() {
        let e = fuse_all(ss, &spatial);
        ss.annotate(e, ForKind::Block(GpuDim::X), span).expect("spatial");
    }
    let r = fuse_all(ss, &reduce);
    over_threads(ss, r);
    true
}

/// The tensor-core operations the default GPU schedule uses, by the
/// operands' element type.
const MMAS: [MmaOp; 2] = [MmaOp::M16n8k16F16F32, MmaOp::M16n8k16Bf16F32];

/// A matrix product of f16 (or bf16) matrices into f32 that tensor cores
/// can run: `C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]))` with extents
/// the operation's tiles divide.
struct TensorCoreGemm {
    op: MmaOp,
    a: TensorId,
    b: TensorId,
    /// Extents of `i`, `j` and `k`.
    ext: [i64; 3],
}

fn tensor_core_operands(p: &Program, st: &Stage) -> Option<TensorCoreGemm> {
    MMAS.into_iter().find_map(|op| tensor_core_operands_of(p, st, op))
}

fn tensor_core_operands_of(p: &Program, st: &Stage, op: MmaOp) -> Option<TensorCoreGemm> {
    let (tm, tn, tk) = op.shape();
    let (ab, acc) = op.types();
    let var = |e: TExprId, v: u32| matches!(p.expr(e), TExpr::Var(x) if *x == v);
    let operand = |e: TExprId, rows: u32, cols: u32| match p.expr(e) {
        TExpr::Cast(l) => match p.expr(*l) {
            TExpr::Load(t, idx)
                if p.tensor(*t).elem == ab && idx.len() == 2 && var(idx[0], rows) && var(idx[1], cols) =>
            {
                Some(*t)
            }
            _ => None,
        },
        _ => None,
    };
    let TExpr::Reduce(texc_compiler::ops::ReduceOp::Sum, _, body) = p.expr(st.value) else { return None };
    let TExpr::Binary(texc_compiler::ops::BinOp::Mul, x, y) = p.expr(*body) else { return None };
    if st.n_axes != 2 || st.vars.len() != 3 || p.tensor(st.tensor).elem != acc {
        return None;
    }
    let (i, j, k) = (0, 1, 2);
    let (a, b) = match (operand(*x, i, k), operand(*y, k, j)) {
        (Some(a), Some(b)) => (a, b),
        _ => (operand(*y, i, k)?, operand(*x, k, j)?),
    };
    let ext = [st.vars[0].extent, st.vars[1].extent, st.vars[2].extent];
    (ext[0] % tm == 0 && ext[1] % tn == 0 && ext[2] % tk == 0).then_some(TensorCoreGemm { op, a, b, ext })
}

/// A tensor-core product whose operands come straight from global memory:
/// each warp computes a tile of up to 4×8 operations' tiles (64×64 of `C`,
/// whose accumulators stay in registers through the reduction: 128 per
/// lane, and 1.45× the speed of 32×64 tiles at 4096³ on an H100), up to
/// 2×2 warps per block, `k` in slices of 16. For shapes that
/// [`pipelined_gemm`] does not divide.
fn tensor_core_gemm(ss: &mut StageSchedule, op: MmaOp) {
    let (tm, tn, tk) = op.shape();
    let span = Span::default();
    let n = |s: &'static str| (s, span);
    let (io, ii) = ss.split(0, tm, n("io"), n("ii"), span).expect("fresh names");
    let (jo, ji) = ss.split(1, tn, n("jo"), n("ji"), span).expect("fresh names");
    let (ko, ki) = ss.split(2, tk, n("ko"), n("ki"), span).expect("fresh names");
    let divides = |ss: &StageSchedule, iv: usize, f: i64| ss.ivs[iv].extent % f == 0;
    let mt = [4, 2, 1].into_iter().find(|&f| divides(ss, io, f)).expect("1 divides");
    let nt = [8, 4, 2, 1].into_iter().find(|&f| divides(ss, jo, f)).expect("1 divides");
    let (iwt, mi) = ss.split(io, mt, n("iwt"), n("mi"), span).expect("fresh names");
    let (jwt, nj) = ss.split(jo, nt, n("jwt"), n("nj"), span).expect("fresh names");
    let wi = [2, 1].into_iter().find(|&f| divides(ss, iwt, f)).expect("1 divides");
    let wj = [2, 1].into_iter().find(|&f| divides(ss, jwt, f)).expect("1 divides");
    let (ib, iw) = ss.split(iwt, wi, n("ib"), n("iw"), span).expect("fresh names");
    let (jb, jw) = ss.split(jwt, wj, n("jb"), n("jw"), span).expect("fresh names");
    ss.reorder(&[ib, jb, iw, jw, ko, mi, nj, ii, ji, ki], span).expect("a permutation of the leaves");
    ss.annotate(ib, ForKind::Block(GpuDim::Y), span).expect("spatial");
    ss.annotate(jb, ForKind::Block(GpuDim::X), span).expect("spatial");
    ss.annotate(iw, ForKind::Thread(GpuDim::Z), span).expect("spatial");
    ss.annotate(jw, ForKind::Thread(GpuDim::Y), span).expect("spatial");
    ss.tensorize = Some(crate::schedule::Tensorize { op, leaves: [ii, ji, ki], span });
}

/// Rows and columns of `C` a block computes through shared memory, and the
/// slice of `k` it copies at a time.
#[derive(Clone, Copy)]
struct GemmTiles {
    block: [i64; 2],
    k_slice: i64,
    stages: i64,
}

/// Each warp of the shared-memory product computes 64×64 of `C`.
const WARP_TILE: i64 = 64;
/// Slices in flight: measured on an H100 at 4096³ (128×128 blocks, slices
/// of 32), 3 stages run at 242 TFLOP/s, 2 at 230, 4 no faster than 3.
const GEMM_STAGES: i64 = 3;

/// The block tile of a product run through shared memory: 128 or 64 rows
/// and columns (2×2 warps at most), dividing the product, and slices of
/// `k` of 64 (four `mma` steps between barriers: 252 TFLOP/s against 246
/// with slices of 32 at 4096³) or 32. `None` where none divides. Knobs
/// `gtile` and `gslice` cap the sizes tried, `stages` sets the slices in flight.
fn shared_gemm_tiles(g: &TensorCoreGemm, knobs: DefaultKnobs) -> Option<GemmTiles> {
    let most = knobs.gtile.unwrap_or(2 * WARP_TILE);
    let pick = |n: i64| [2 * WARP_TILE, WARP_TILE].into_iter().find(|&t| t <= most && n % t == 0);
    let most_k = knobs.gslice.unwrap_or(64);
    let k_slice = [64, 32].into_iter().find(|&s| s <= most_k && g.ext[2] % s == 0)?;
    let stages = knobs.stages.unwrap_or(GEMM_STAGES);
    Some(GemmTiles { block: [pick(g.ext[0])?, pick(g.ext[1])?], k_slice, stages })
}

/// A tensor-core product through shared memory (as `benches/hgemm_pipelined.tex`
/// writes it): each block copies its rows of `A` and columns of `B` a slice
/// of `k` at a time into shared memory ([`stage_gemm_operands`]),
/// [`GEMM_STAGES`] slices in flight by default (`pipeline`); its warps take their
/// fragments from there (`ldmatrix`) for 64×64 tiles of `C` whose
/// accumulators stay in registers.
fn pipelined_gemm(ss: &mut StageSchedule, t: GemmTiles, op: MmaOp) {
    let (tm, tn, tk) = op.shape();
    let span = Span::default();
    let n = |s: &'static str| (s, span);
    let split = |ss: &mut StageSchedule, iv: usize, f: i64, o: &'static str, i: &'static str| {
        ss.split(iv, f, n(o), n(i), span).expect("fresh names")
    };
    let (ib, i2) = split(ss, 0, t.block[0], "ib", "i2");
    let (jb, j2) = split(ss, 1, t.block[1], "jb", "j2");
    let (iw, i3) = split(ss, i2, WARP_TILE, "iw", "i3");
    let (jw, j3) = split(ss, j2, WARP_TILE, "jw", "j3");
    let (mi, ii) = split(ss, i3, tm, "mi", "ii");
    let (nj, ji) = split(ss, j3, tn, "nj", "ji");
    let (ko, k2) = split(ss, 2, t.k_slice, "ko", "k2");
    let (kk, ki) = split(ss, k2, tk, "kk", "ki");
    ss.reorder(&[ib, jb, ko, iw, jw, kk, mi, nj, ii, ji, ki], span).expect("a permutation of the leaves");
    ss.annotate(ib, ForKind::Block(GpuDim::Y), span).expect("spatial");
    ss.annotate(jb, ForKind::Block(GpuDim::X), span).expect("spatial");
    ss.annotate(iw, ForKind::Thread(GpuDim::Z), span).expect("spatial");
    ss.annotate(jw, ForKind::Thread(GpuDim::Y), span).expect("spatial");
    ss.tensorize = Some(crate::schedule::Tensorize { op, leaves: [ii, ji, ki], span });
    ss.pipeline = Some((ko, t.stages, span));
}

/// The shared-memory copies of [`pipelined_gemm`]'s operands: `A`'s rows
/// and `B`'s columns of the block, one slice of `k`, computed at `C.ko`
/// by the block's threads together, 16 bytes (8 halves) each at a time,
/// consecutive threads on consecutive 16 bytes of a row.
fn stage_gemm_operands(p: &mut Program, s: &mut Schedules, ci: usize, g: &TensorCoreGemm, t: GemmTiles, gather: bool) {
    let span = Span::default();
    let ko = s.stages[ci].pipeline.expect("pipelined").0;
    let warps = [t.block[0] / WARP_TILE, t.block[1] / WARP_TILE];
    let threads = 32 * warps[0] * warps[1];
    // A's copy first: it is the one inserted before the other.
    let mut ci = ci;
    for (operand, name) in [(g.b, "Bs"), (g.a, "As")] {
        let name = fresh_name(p, &format!("{}.{name}", p.tensor(p.stages[ci].tensor).name));
        let (mut bi, mut owner) = crate::apply::insert_cache_stage(p, s, operand, ci, &name, span);
        if let Some(gather) = expanding_gather(p, operand, bi).filter(|_| gather) {
            // An implicit im2col: the copy reads the image itself.
            inline_stage(p, gather);
            s.remove(gather);
            (bi, owner) = (bi - 1, owner - 1);
        }
        ci = owner;
        s.attach[bi] = Some(Attach { owner, leaf: ko, layout: None, shared: true, span });
        let ss = &mut s.stages[bi];
        let sp = |s: &str| (format!("{name}.{s}"), span);
        let (r, c) = (0, 1);
        let (cv_name, c16_name) = (sp("c"), sp("v"));
        let (chunk, v) = ss.split(c, 8, (&cv_name.0, span), (&c16_name.0, span), span).expect("fresh");
        let (f_name, o_name, t_name) = (sp("f"), sp("o"), sp("t"));
        let fused = ss.fuse(r, chunk, (&f_name.0, span), span).expect("adjacent");
        let (_, th) = ss.split(fused, threads, (&o_name.0, span), (&t_name.0, span), span).expect("fresh");
        let (yz_name, x_name) = (sp("yz"), sp("x"));
        let (yz, x) = ss.split(th, 32, (&yz_name.0, span), (&x_name.0, span), span).expect("fresh");
        let (z_name, y_name) = (sp("z"), sp("y"));
        let (z, y) = ss.split(yz, warps[1], (&z_name.0, span), (&y_name.0, span), span).expect("fresh");
        ss.annotate(z, ForKind::Thread(GpuDim::Z), span).expect("spatial");
        ss.annotate(y, ForKind::Thread(GpuDim::Y), span).expect("spatial");
        ss.annotate(x, ForKind::Thread(GpuDim::X), span).expect("spatial");
        ss.annotate(v, ForKind::Vectorized, span).expect("spatial");
    }
}

/// The stage of temporary `t`, where it only gathers elements of a smaller
/// tensor (`Y.cols[q, m] = X[..]`, `R*S` times `X`) and only stage `reader`
/// reads it: cheaper gathered where it is read than written and read back.
fn expanding_gather(p: &Program, t: TensorId, reader: usize) -> Option<usize> {
    let si = p.stages.iter().position(|st| st.tensor == t)?;
    let TExpr::Load(src, _) = p.expr(p.stages[si].value) else { return None };
    let only_reader = (0..p.stages.len()).filter(|&q| loads(p, p.stages[q].value, t)).eq([reader]);
    let expands = p.tensor(*src).len() < p.tensor(t).len();
    (p.tensor(t).role == TensorRole::Temp && only_reader && expands).then_some(si)
}

/// Whether a box with extents `ext` cuts a reduction stage along an axis
/// that one of its operands does not depend on: the operand would then be
/// reloaded for every box instead of being reused across that axis (the
/// rows of a matrix product computed one at a time).
fn cuts_reuse(p: &Program, st: &Stage, ext: &[i64]) -> bool {
    if st.vars.len() == st.n_axes {
        return false;
    }
    let mut all = Vec::new();
    loads_in(p, st.value, &mut all);
    (0..st.n_axes).any(|a| ext[a] < st.vars[a].extent && all.iter().any(|&l| !uses_var(p, l, a as u32)))
}

/// Attached boxes the default schedule keeps: small enough for L1, or for
/// L2 beside it (a stride-2 depthwise convolution's padded 114×114 plane,
/// 52 KiB, made per channel instead of in a pass over all of them:
/// MobileNetV2, 1 thread, 8.20 → 8.12 ms).
const ATTACH_BYTES: i64 = 64 * 1024;

/// Compute temporaries inside the outermost loop of the stage that reads
/// them, where each iteration of that loop needs its own part of them (the
/// statistics and rows of a normalization, a softmax's exponentials): the
/// part then goes from producer to reader through L1 instead of memory.
/// Kept only when the parts hardly overlap (little recomputation) and are
/// at most [`ATTACH_BYTES`]. Epilogues ([`fold_epilogues`], before this) and
/// the reductions they store stay where they are: storing a bias and an
/// activation from the accumulators costs nothing, a pass inside the
/// reader costs one over its part.
fn attach_producers(p: &Program, s: &mut Schedules) {
    for o in (0..p.stages.len()).rev() {
        let Some(&a) = s.stages[o].leaves.first() else { continue };
        if s.attach[o].is_some() || s.stages[o].ivs[a].reduce || s.is_epilogue(o) {
            continue;
        }
        let trips = s.stages[o].ivs[a].extent;
        for pi in (0..o).rev() {
            let t = p.stages[pi].tensor;
            if p.tensor(t).role != TensorRole::Temp
                || s.attach[pi].is_some()
                || s.is_epilogue(pi)
                || s.stages[pi].epilogue.is_some()
            {
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
            trial.attach[pi] = Some(Attach { owner: o, leaf: a, layout: None, shared: false, span: Span::default() });
            let Ok(regions) = crate::attach::infer(p, &mut trial.clone()) else { continue };
            let r = regions[pi].as_ref().expect("attached");
            if cuts_reuse(p, &p.stages[pi], &r.ext) {
                continue;
            }
            let bytes = r.local_shape.iter().product::<i64>() * p.tensor(t).elem.size() as i64;
            // Boxes may overrun the tensor at the end (those points are not computed) or overlap a little.
            let computed = r.ext.iter().product::<i64>() * trips;
            if bytes <= ATTACH_BYTES && 4 * computed <= 5 * p.tensor(t).len() {
                // The producer's threads become the owner's: a reader too small to
                // be worth threads on its own (a convolution's bias epilogue over
                // 7×7×512 outputs) now carries the producer's work.
                let was_parallel = s.stages[pi].ivs.iter().any(|v| v.kind == ForKind::Parallel);
                *s = trial;
                let owner = &mut s.stages[o];
                let threaded = owner.ivs.iter().any(|v| v.kind == ForKind::Parallel);
                if was_parallel && !threaded && owner.ivs[a].kind == ForKind::Serial && owner.ivs[a].extent >= 2 {
                    owner.annotate(a, ForKind::Parallel, Span::default()).expect("a spatial leaf");
                }
            }
        }
    }
}

fn uses_var(p: &Program, e: TExprId, v: u32) -> bool {
    matches!(p.expr(e), TExpr::Var(x) if *x == v) || p.children(e).into_iter().any(|c| uses_var(p, c, v))
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
    loads_in(p, st.value, &mut loads);
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
    if !ss.ivs[outer].reduce && ss.ivs[outer].extent >= 2 && worth_threads(ss) {
        ss.annotate(outer, ForKind::Parallel, span).expect("spatial");
    }
}

/// Loop iterations below which a stage runs on one thread: handing work to
/// the pool's threads and waiting for them costs tens of microseconds,
/// more than a small stage's whole work (a normalization of a few hundred
/// elements takes 0.3 µs on one thread and 130 µs split over two).
const MIN_PARALLEL_ITERATIONS: i64 = 1 << 15;

/// Whether stage `ss` does enough work for its loops to be shared by threads.
fn worth_threads(ss: &StageSchedule) -> bool {
    let iterations = ss.leaves.iter().fold(1i64, |n, &l| n.saturating_mul(ss.ivs[l].extent.max(1)));
    iterations >= MIN_PARALLEL_ITERATIONS
}

/// The spatial axis whose rows a register block unrolls: one that the
/// vector operands (loads contiguous in the innermost axis) do not depend
/// on, so that every unrolled row reuses the same vector loads and only
/// adds a broadcast (the `i` of a matmul, the filter `k` of a convolution).
/// Without such an axis (a depthwise convolution's rows each load their own
/// input), the axis outside the innermost, and `false`.
fn reuse_axis(p: &Program, st: &Stage, first_row_axis: usize) -> (usize, bool) {
    let inner = st.n_axes as u32 - 1;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let vector_loads: Vec<TExprId> = loads
        .into_iter()
        .filter(|&l| match p.expr(l) {
            TExpr::Load(_, idx) => idx.last().is_some_and(|&i| uses_var(p, i, inner)),
            _ => false,
        })
        .collect();
    (0..first_row_axis)
        .rev()
        .find(|&a| st.vars[a].extent >= 2 && !vector_loads.iter().any(|&l| uses_var(p, l, a as u32)))
        .map_or((first_row_axis - 1, false), |a| (a, true))
}

/// The depth of a sliced product's reduction slices: 512 where the
/// reduction is deeper than that, else 256 (products of 257 to 512 keep the
/// slices they had). Every slice reads and writes the accumulators of the
/// whole output once more, from L3 when the output is large: on this Zen 4
/// with AVX2, 1 thread, SGEMM 2048³ ran 168 ms with slices of 256 and 163
/// with 512, 1024³ 20.3 and 19.5 ms (`texc bench benches/matmul.tex
/// --knob kslice=256|512`); the packed block of 512 × 256 floats then lives
/// on the heap (`LoopFunc::heap_locals`).
fn default_kslice(depth: i64) -> i64 {
    if depth > 512 {
        512
    } else {
        256
    }
}

/// Register blocking for reductions: rows of a spatial axis (see
/// [`reuse_axis`]) are unrolled inside the reduction loops, so that
/// independent accumulator vectors (3/4 of the target's registers: 12 of
/// AVX2's 16, 24 of AVX-512's 32) hide the FMA latency and share their
/// vector loads. Rows longer than 6 vectors get the structure of BLIS's
/// SGEMM: blocks of two vectors (a 6×16 micro-kernel on AVX2, 12×32 on
/// AVX-512) whose loop moves outside the reductions, in groups spanning 128
/// or 256 columns, and a single long reduction cut into slices ([`default_kslice`]); the returned
/// request asks to pack the vector operand per slice and column block (a
/// reduction of one slice: per column block, where those are outermost).
fn register_block(
    ss: &mut StageSchedule,
    p: &Program,
    st: &Stage,
    m: Machine,
    (inner, first_row_axis): (usize, usize),
) -> Option<PackRequest> {
    let span = Span::default();
    let row = ss.ivs[inner].extent;
    let (a, shared) = reuse_axis(p, st, first_row_axis);
    // A row shorter than half a full vector uses the half-width vector
    // (AVX-512: a 7-wide row is one 256-bit vector, not 7 scalars). So does
    // a row shorter than a full vector, of a lane count LLVM must split (13:
    // 8, 4 and 1), whose block rows each load their own vectors: the pieces
    // of every load are reassembled, which rows sharing their loads (a
    // convolution's filters) amortize and rows of their own (a depthwise
    // convolution's) do not (measured: W = 9..15, 8 + tail 1.1–1.5× faster
    // on depthwise, 1.2–1.8× slower on a 16-filter convolution).
    let split_by_llvm = row.count_ones() > 1;
    let lanes = match m.half_lanes {
        Some(half) if 2 * row < m.lanes || row < m.lanes && split_by_llvm && !shared => half,
        _ => m.lanes,
    };
    // A row of at least half a vector is one (partial) vector; a shorter row
    // stays scalar, one accumulator per element. Only rows of many full
    // vectors take the BLIS structure.
    let partial = row < lanes && 2 * row >= lanes;
    let short_vectors = if row >= lanes {
        (row + lanes - 1) / lanes
    } else if partial {
        1
    } else {
        row.max(1)
    };
    let long = row >= lanes && short_vectors > 6;
    let vectors = if long { m.knobs.nvec.unwrap_or(2) } else { short_vectors };
    let f = match m.knobs.rows {
        // An explicit request is taken as it is: the last block is then a
        // shorter copy of the loops (partitioned), or guarded.
        Some(rows) => rows.min(ss.ivs[a].extent),
        None => default_rows(block_accumulators(m, shared) / vectors, ss.ivs[a].extent, long),
    };
    if f < 2 {
        vectorize_inner(ss, inner, m);
        return None;
    }
    let name = ss.ivs[a].name.clone();
    let (ab, r) = ss.split(a, f, (&format!("{name}.b"), span), (&format!("{name}.r"), span), span).expect("fresh");
    let iname = ss.ivs[inner].name.clone();
    let reductions: Vec<usize> = ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce).collect();
    if !long {
        let row_loops: Vec<usize> = if row >= lanes {
            let (o, v) = ss
                .split(inner, lanes, (&format!("{iname}.o"), span), (&format!("{iname}.v"), span), span)
                .expect("fresh");
            ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
            vec![o, v]
        } else {
            if partial {
                ss.annotate(inner, ForKind::Vectorized, span).expect("spatial innermost");
            }
            vec![inner]
        };
        let mut order: Vec<usize> =
            ss.leaves.iter().copied().filter(|&l| !ss.ivs[l].reduce && l != r && !row_loops.contains(&l)).collect();
        order.extend(reductions);
        order.push(r);
        order.extend(row_loops);
        ss.reorder(&order, span).expect("a permutation of the leaves");
        ss.annotate(r, ForKind::Unrolled, span).expect("serial leaf");
        unroll_reduction(ss, m.knobs.unroll);
        return None;
    }
    // The micro-kernel is two vectors wide (`nvec`); packed panels have its
    // width, and a block of panels spans 128 or 256 columns (`cols`).
    let width = vectors * lanes;
    let (o, v) =
        ss.split(inner, width, (&format!("{iname}.o"), span), (&format!("{iname}.v"), span), span).expect("fresh");
    ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
    // Long rows take blocks of 256 columns (a packed block of 256 KiB per
    // 256-deep slice, 512 KiB per 512-deep one: a quarter or half of L2):
    // each row block of A, streamed from L3 once per column block, then
    // serves twice as many panels (SGEMM 2048³ on AVX2: 96 → 100 GFLOP/s). Shorter ones keep 128, so that the
    // column blocks still give the threads eight loops or more.
    let elem = p.tensor(st.tensor).elem.size() as i64;
    let depth: i64 = reductions.iter().map(|&l| ss.ivs[l].extent).product();
    let kslice = m.knobs.kslice.unwrap_or(default_kslice(depth));
    let sliced = matches!(reductions[..], [_] if depth > kslice);
    // A reduction of one slice packs a block's panels whole (below): they
    // and the block's accumulators share the stack's 256 KiB.
    let one_slice_fits = |cols: i64| cols * depth * elem + f * width * elem <= crate::attach::MAX_STACK_BYTES;
    let cols = m.knobs.cols.unwrap_or(match row >= 2048 {
        true if sliced || one_slice_fits(256) => 256,
        _ => 128,
    });
    let per_block = (cols / width).max(1);
    let panels = (per_block > 1 && ss.ivs[o].extent >= 2 * per_block).then(|| {
        ss.split(o, per_block, (&format!("{iname}.oo"), span), (&format!("{iname}.oi"), span), span).expect("fresh")
    });
    let slices = match reductions[..] {
        [k] if sliced => {
            let kname = ss.ivs[k].name.clone();
            Some(
                ss.split(k, kslice, (&format!("{kname}.o"), span), (&format!("{kname}.i"), span), span).expect("fresh"),
            )
        }
        _ => None,
    };
    let (oo, oi) = match panels {
        Some((oo, oi)) => (Some(oo), oi),
        None => (None, o),
    };
    let row_part = [oo, Some(oi), Some(v)];
    let mut order: Vec<usize> = ss
        .leaves
        .iter()
        .copied()
        .filter(|&l| !ss.ivs[l].reduce && l != r && l != ab && !row_part.contains(&Some(l)))
        .collect();
    order.extend(oo);
    order.extend(slices.map(|(ko, _)| ko));
    if m.knobs.order == Some(true) {
        order.extend([oi, ab]);
    } else {
        order.extend([ab, oi]);
    }
    order.extend(ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce && Some(l) != slices.map(|(ko, _)| ko)));
    order.push(r);
    order.push(v);
    ss.reorder(&order, span).expect("a permutation of the leaves");
    ss.annotate(r, ForKind::Unrolled, span).expect("serial leaf");
    unroll_reduction(ss, m.knobs.unroll);
    let (oo, _) = panels?;
    if m.knobs.pack == Some(false) {
        return None;
    }
    // Packed per slice; without slices (a reduction no deeper than one),
    // per column block where its panels fit the stack: read in place, a
    // panel's rows lie a row of the operand apart, and with rows a multiple
    // of 4 KiB apart they fall in one set of L1 and evict each other
    // (2048×256 · 256×2048 on AVX2: NumPy 20.3 ms, texc unpacked 27.5,
    // packed 19.7). Not for a row fused from several axes (`h, w`), whose
    // block's box is inferred as whole rows of the image.
    let leaf = match slices {
        Some((ko, _)) => ko,
        None => {
            // Only where the column blocks are the outermost loop, of 8 or
            // more: the loop that runs in parallel, which `schedule_stage`
            // then does not fuse with the row blocks inside it (packing once
            // per row block).
            let outermost = ss.leaves.first() == Some(&oo) && ss.ivs[oo].extent >= 8;
            if !outermost || first_row_axis + 1 != st.n_axes || !one_slice_fits(per_block * width) {
                return None;
            }
            oo
        }
    };
    vector_operand(p, st).map(|tensor| PackRequest { leaf, tensor, width })
}

/// The `unroll` knob: the innermost reduction loop of a register block
/// (just outside its unrolled rows) unrolled by `by` iterations, where it
/// has at least two such groups.
fn unroll_reduction(ss: &mut StageSchedule, by: Option<i64>) {
    let span = Span::default();
    let Some(by) = by.filter(|&u| u >= 2) else { return };
    let Some(&k) = ss.leaves.iter().rev().find(|&&l| ss.ivs[l].reduce) else { return };
    if ss.ivs[k].extent < 2 * by || ss.ivs[k].kind != ForKind::Serial {
        return;
    }
    let name = ss.ivs[k].name.clone();
    let (_, u) = ss.split(k, by, (&format!("{name}.uo"), span), (&format!("{name}.u"), span), span).expect("fresh");
    ss.annotate(u, ForKind::Unrolled, span).expect("serial leaf");
}

/// Pack `tensor` (read by the stage) into panels `width` columns wide at reduction slice `leaf`.
struct PackRequest {
    leaf: usize,
    tensor: TensorId,
    width: i64,
}

/// The operand that a long-row reduction loads as vectors: loaded once, its
/// last index exactly the innermost axis, its other indices plain variables.
fn vector_operand(p: &Program, st: &Stage) -> Option<TensorId> {
    let inner = st.n_axes as u32 - 1;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let mut found = None;
    for l in loads {
        let TExpr::Load(t, idx) = p.expr(l) else { continue };
        if idx.last().is_some_and(|&i| matches!(p.expr(i), TExpr::Var(v) if *v == inner)) {
            let plain = idx.iter().all(|&i| matches!(p.expr(i), TExpr::Var(_)));
            if found.is_some() || !plain {
                return None;
            }
            found = Some(*t);
        }
    }
    found
}

/// Accumulator vectors of a register block whose rows share their vector
/// loads (`shared`, see [`reuse_axis`]): the machine's. Rows that each load
/// their own input (a depthwise convolution's) gain nothing from more
/// accumulators than hide the FMA latency, at most [`UNSHARED_ACCUMULATORS`]:
/// on AVX-512 (1 thread, 3×3 depthwise with bias and relu6): 56²×144 0.186
/// → 0.145 ms (4 rows of 4 vectors → 3), 112²×32 0.137 → 0.114, 28²×192
/// 0.052 → 0.047, 112²×96 at stride 2 0.35 → 0.30.
fn block_accumulators(m: Machine, shared: bool) -> i64 {
    if shared {
        m.accumulators
    } else {
        m.accumulators.min(UNSHARED_ACCUMULATORS)
    }
}

/// See [`block_accumulators`]: AVX2's count (3/4 of its 16 registers).
const UNSHARED_ACCUMULATORS: i64 = 12;

/// Rows of A that a BLIS-style micro-kernel may read at once without
/// evicting one another from L1: its rows lie a power-of-two stride apart in
/// the usual shapes, so all fall in one set of the 8-way L1.
const L1_WAYS: i64 = 8;

/// Rows per register block when no knob sets them. A BLIS-style micro-kernel
/// (`long`) takes all `max` rows when they stay within [`L1_WAYS`]; its
/// block loop encloses the reductions, so a last, shorter block is a
/// partitioned copy of the loops, not a guard. (SGEMM 1024³ on AVX2: 6 rows
/// and a tail of 4, 106 GFLOP/s; 4 rows dividing 1024, 100 GFLOP/s. On
/// AVX-512, 12 rows ran at 96 GFLOP/s and 8 at 107.)
fn default_rows(max: i64, extent: i64, long: bool) -> i64 {
    if long && max <= L1_WAYS {
        max.min(extent)
    } else {
        block_rows(max, extent)
    }
}

/// Rows per register block: at most `max`, preferring a divisor of the
/// extent of at least `max / 3` (a partial block would need a guard in the
/// innermost loop, where the accumulators live: 15 rows of at most 12 are
/// blocks of 5, not 12 and a tail of 3).
fn block_rows(max: i64, extent: i64) -> i64 {
    let max = max.min(extent);
    ((max / 3).max(2)..=max).rev().find(|f| extent % f == 0).unwrap_or(max)
}

/// An element-wise stage whose innermost axis `v` (flattened positions, an
/// im2col matrix's `p`) is read only through `v / D` and `v % D` (`Xp[..,
/// p / 28 * 2 + r, p % 28 * 2 + s]`) runs it as `D`-long pieces: vectors
/// inside a piece then read at constant offsets from each other (a strided
/// load and a shuffle) instead of gathering lane by lane across the breaks
/// (ResNet-18's stride-2 im2col at 28², 1 thread: 0.58 → 0.04 ms). A piece
/// of a length no vector width divides is one vector of that many lanes.
/// `D` divides the axis and fills at least half a vector. Returns the
/// piece's leaf.
fn split_at_row_breaks(ss: &mut StageSchedule, p: &Program, st: &Stage, row: usize, m: Machine) -> Option<usize> {
    let crate::schedule::Rel::Root(v) = ss.ivs[row].rel else { return None };
    let extent = ss.ivs[row].extent;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let mut divisors = Vec::new();
    for &l in &loads {
        let TExpr::Load(_, idx) = p.expr(l) else { continue };
        for &i in idx {
            if !row_breaks(p, i, v as VarId, &mut divisors) {
                return None;
            }
        }
    }
    let [d] = divisors[..] else { return None };
    if d >= extent || extent % d != 0 || 2 * d < m.lanes || outside_indices(p, st.value, v as VarId) {
        return None;
    }
    let span = Span::default();
    let name = ss.ivs[row].name.clone();
    let (_, inner) =
        ss.split(row, d, (&format!("{name}.row"), span), (&format!("{name}.col"), span), span).expect("fresh names");
    Some(inner)
}

/// Whether `e` uses `v` only as `v / D` or `v % D` for constants `D`
/// (collected in `divisors`), or not at all.
fn row_breaks(p: &Program, e: TExprId, v: VarId, divisors: &mut Vec<i64>) -> bool {
    match p.expr(e) {
        TExpr::Var(x) => *x != v,
        TExpr::Binary(BinOp::FloorDiv | BinOp::FloorMod, a, d) if matches!(p.expr(*a), TExpr::Var(x) if *x == v) => {
            match p.expr(*d) {
                TExpr::Int(d) if *d > 0 => {
                    if !divisors.contains(d) {
                        divisors.push(*d);
                    }
                    true
                }
                _ => false,
            }
        }
        _ => p.children(e).into_iter().all(|c| row_breaks(p, c, v, divisors)),
    }
}

/// Split the innermost loop by the vector width ([`Machine::width_for`]) and vectorize the lanes.
/// Split `inner` by the vector width and vectorize its inner part; the two
/// loops, outer first (none where the width is 0).
fn vectorize_inner(ss: &mut StageSchedule, inner: usize, m: Machine) -> Option<(usize, usize)> {
    let span = Span::default();
    let lanes = m.width_for(ss.ivs[inner].extent);
    if lanes == 0 {
        return None;
    }
    let name = ss.ivs[inner].name.clone();
    let (o, v) =
        ss.split(inner, lanes, (&format!("{name}.o"), span), (&format!("{name}.v"), span), span).expect("fresh names");
    ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
    Some((o, v))
}

/// Rows shorter than a full vector, or than a few vectors and not a
/// multiple of one (`[N, C, 5, 3]`), spend most of their time in tails;
/// when every read moves through the trailing axes as through one dense
/// axis (`X[n, c, h, w]` walks `h, w` in order, `group_norm`'s statistics
/// and `gamma[c]` stay put along them; a 1×1 convolution's filters too),
/// those axes are fused into one longer row first. Returns the fused loop
/// and the first axis fused into it.
fn fuse_short_rows(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) -> Option<(usize, usize)> {
    let n = st.n_axes;
    // Before any other primitive: the leaves are the axes, then the reduction variables.
    if n < 2 || ss.leaves.len() != st.vars.len() || ss.leaves.iter().enumerate().any(|(i, &l)| i != l) {
        return None;
    }
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let mut first = n - 1;
    let mut row = st.vars[first].extent;
    let short = |row: i64| row < m.lanes || row % m.width_for(row) != 0;
    while first > 0 && short(row) && row < 4 * m.lanes && dense_pair(p, st, &loads, first - 1) {
        first -= 1;
        row *= st.vars[first].extent;
    }
    let span = Span::default();
    let mut fused = ss.leaves[first];
    for _ in first + 1..n {
        let next = ss.leaves[first + 1];
        let name = format!("{}.{}", ss.ivs[fused].name, ss.ivs[next].name);
        fused = ss.fuse(fused, next, (&name, span), span).expect("adjacent spatial loops");
    }
    (first < n - 1).then_some((fused, first))
}

/// Whether axes `a` and `a + 1` of `st` are one dense axis to every read and
/// appear nowhere but in read indices: each flat offset moves with `a` as
/// with `extent(a + 1)` steps of `a + 1` (the store's does by construction).
fn dense_pair(p: &Program, st: &Stage, loads: &[TExprId], a: usize) -> bool {
    crate::analysis::dense_pair(p, st.value, loads, (a as VarId, a as VarId + 1), st.vars[a + 1].extent)
}

fn schedule_stage(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) -> Option<PackRequest> {
    let span = Span::default();
    let n_axes = st.n_axes;
    if n_axes == 0 {
        return None;
    }
    // The innermost spatial loop: the last axis, or the trailing axes fused.
    let (row, first_row_axis) = fuse_short_rows(ss, p, st, m).unwrap_or((n_axes - 1, n_axes - 1));
    // Reduction loops outside the innermost spatial loop.
    if ss.ivs.iter().any(|v| v.reduce) {
        let (reductions, mut order): (Vec<usize>, Vec<usize>) =
            ss.leaves.iter().copied().filter(|&l| l != row).partition(|&l| ss.ivs[l].reduce);
        order.extend(reductions);
        order.push(row);
        ss.reorder(&order, span).expect("a permutation of the leaves");
    }
    let mut pack = None;
    if ss.ivs.iter().any(|v| v.reduce) && n_axes >= 2 && first_row_axis > 0 {
        pack = register_block(ss, p, st, m, (row, first_row_axis));
    } else if !transposing_order(ss, p, st, m, (row, first_row_axis)) {
        match split_at_row_breaks(ss, p, st, row, m) {
            // A piece no vector width divides is one vector (of 28 lanes, say):
            // every lane's quotient and remainder then follow from the lane.
            Some(piece) if ss.ivs[piece].extent % m.lanes != 0 && ss.ivs[piece].extent <= 4 * m.lanes => {
                ss.annotate(piece, ForKind::Vectorized, Span::default()).expect("spatial innermost")
            }
            Some(piece) => {
                vectorize_inner(ss, piece, m);
            }
            None => {
                vectorize_inner(ss, row, m);
            }
        }
    }
    // Fuse leading spatial loops until there is enough parallel work.
    let mut outer = ss.leaves[0];
    if ss.ivs[outer].reduce || ss.leaves.len() == 1 && ss.ivs[outer].kind == ForKind::Vectorized {
        return pack;
    }
    while ss.ivs[outer].extent < 64 && ss.leaves.len() > 2 {
        // Packed per iteration of `outer`: fusing it would pack per row block.
        if pack.as_ref().is_some_and(|r: &PackRequest| r.leaf == outer) {
            break;
        }
        let next = ss.leaves[1];
        // A split with a tail under a fusion could not be partitioned: its guard would sit innermost.
        if ss.ivs[next].reduce
            || ss.ivs[next].kind != ForKind::Serial
            || ss.leaves.len() < 3
            || has_tail(ss, next)
            || has_tail(ss, outer)
        {
            break;
        }
        let name = format!("{}.{}", ss.ivs[outer].name, ss.ivs[next].name);
        outer = ss.fuse(outer, next, (&name, span), span).expect("adjacent spatial loops");
    }
    // Loops of one iteration in front do not count: the next one runs in parallel.
    let mut at = 0;
    while ss.ivs[ss.leaves[at]].extent == 1 && at + 2 < ss.leaves.len() {
        let next = ss.leaves[at + 1];
        if ss.ivs[next].reduce || ss.ivs[next].kind != ForKind::Serial {
            break;
        }
        at += 1;
    }
    let mut par = ss.leaves[at];
    if ss.ivs[par].extent < 2 {
        par = inside_slices(ss, at).unwrap_or(par);
    }
    if ss.ivs[par].extent >= 2 && worth_threads(ss) {
        ss.annotate(par, ForKind::Parallel, span).expect("spatial");
    }
    pack
}

/// A stage that transposes (`T[q, c, k] = A[k, c, q]`, a Winograd filter
/// transform writing `U[i, j, c, k]` from `Wt[k, c, r, s]`) gathers each
/// vector from as many cache lines as it has lanes. In the axes' order the
/// next vector moves along `q` to other lines, and those lines are read
/// again only a whole pass of the gathered tensor later: from memory, and
/// at power-of-two strides from lines that evict each other. So the row is
/// split by the vector width with its outer loop outermost, and the other
/// axes follow by their stride in the gathered tensor, largest first (those
/// it does not move with, innermost): within one block of lanes the loops
/// walk each lane's line in order, and consecutive vectors reuse them from
/// L1. Applies where the gathered tensor is over 32 KiB (smaller ones stay
/// in L1 in any order) and its lanes are a cache line or more apart.
fn transposing_order(
    ss: &mut StageSchedule,
    p: &Program,
    st: &Stage,
    m: Machine,
    (row, first_row_axis): (usize, usize),
) -> bool {
    const LINE: u64 = 64;
    const L1: u64 = 32 << 10;
    let last = (st.n_axes - 1) as VarId;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    // The largest gathered read whose offset is affine in every axis: the
    // axes' strides in it order the loops.
    let gathered = loads
        .iter()
        .filter_map(|&l| {
            let TExpr::Load(t, idx) = p.expr(l) else { return None };
            let d = p.tensor(*t);
            let bytes = (d.len().max(0) as u64).saturating_mul(d.elem.size() as u64);
            let stride = crate::analysis::flat_coefficient(p, *t, idx, last)?.unsigned_abs();
            if stride.saturating_mul(d.elem.size() as u64) < LINE || bytes <= L1 {
                return None;
            }
            let strides = (0..first_row_axis)
                .map(|a| {
                    Some((crate::analysis::flat_coefficient(p, *t, idx, a as VarId)?.unsigned_abs(), ss.leaves[a]))
                })
                .collect::<Option<Vec<_>>>()?;
            Some((bytes, strides))
        })
        .max_by_key(|(bytes, _)| *bytes);
    let Some((_, mut others)) = gathered else { return false };
    let lanes = m.width_for(ss.ivs[row].extent);
    // The blocks of lanes become the outer loop: with a partial block it is
    // not fused with the next, and is all the parallel work there is.
    let extent = ss.ivs[row].extent;
    let parallel_enough = extent % lanes.max(1) == 0 || extent / lanes.max(1) >= 8;
    if lanes <= 1 || others.is_empty() || !parallel_enough {
        return false;
    }
    // Stable: axes of equal stride keep their order.
    others.sort_by_key(|&(stride, _)| std::cmp::Reverse(stride));
    let span = Span::default();
    let (o, v) = vectorize_inner(ss, row, m).expect("a vector width");
    let order: Vec<usize> = std::iter::once(o).chain(others.iter().map(|&(_, l)| l)).chain([v]).collect();
    ss.reorder(&order, span).expect("a permutation of the leaves");
    // Axes the gathered tensor does not move with (the `i, j` of a filter
    // transform, in its selects) are unrolled, up to 16 copies: their
    // copies then share one gather of each element.
    let mut copies = 1;
    for &(_, l) in others.iter().rev().take_while(|&&(stride, _)| stride == 0) {
        copies *= ss.ivs[l].extent;
        if copies > 16 {
            break;
        }
        ss.annotate(l, ForKind::Unrolled, span).expect("spatial");
    }
    true
}

/// A long product without column blocks (`[1, 256, 196]` ← `[256, 1152] ×
/// [1152, 196]`, ResNet-18's stride-2 convolution at 14²) has only its
/// reduction slices outside its row blocks: the first spatial loop inside
/// the slices (from leaf position `at`, past loops of one iteration) runs
/// in parallel instead, one parallel loop per slice, rather than none.
fn inside_slices(ss: &StageSchedule, at: usize) -> Option<usize> {
    let slice = |l: usize| ss.ivs[l].reduce && matches!(ss.ivs[l].rel, crate::schedule::Rel::Split { outer: true, .. });
    let mut past_slice = false;
    for &l in &ss.leaves[at..] {
        let v = &ss.ivs[l];
        if slice(l) {
            past_slice = true;
        } else if v.reduce || v.kind != ForKind::Serial {
            return None;
        } else if v.extent >= 2 {
            return past_slice.then_some(l);
        }
    }
    None
}

/// Whether leaf `l` is the outer loop of a split whose factor does not divide its extent.
fn has_tail(ss: &StageSchedule, l: usize) -> bool {
    match ss.ivs[l].rel {
        crate::schedule::Rel::Split { parent, outer: true, factor } => ss.ivs[parent].extent % factor != 0,
        _ => false,
    }
}

/// Pack a GEMM's vector operand per reduction slice and column block
/// (`cache_read B for C at C.k.o layout (j / 16, k, j % 16)` with AVX2's
/// 16-wide micro-kernel): the micro-kernel then streams one contiguous panel
/// instead of rows far apart.
fn pack_operand(p: &mut Program, s: &mut Schedules, ci: usize, req: PackRequest) {
    let span = Span::default();
    // One operand may feed several products; each gets its own packed copy.
    let name = fresh_name(p, &format!("{}.packed", p.tensor(req.tensor).name));
    let (bi, ci) = crate::apply::insert_cache_stage(p, s, req.tensor, ci, &name, span);
    let last = p.stages[bi].n_axes - 1;
    let mut layout = vec![LayoutDim::Div(last, req.width)];
    layout.extend((0..last).map(LayoutDim::Whole));
    layout.push(LayoutDim::Rem(last, req.width));
    s.attach[bi] = Some(Attach { owner: ci, leaf: req.leaf, layout: Some(layout), shared: false, span });
    let ss = &mut s.stages[bi];
    let lname = ss.ivs[last].name.clone();
    let (_, v) =
        ss.split(last, req.width, (&format!("{lname}.o"), span), (&format!("{lname}.v"), span), span).expect("fresh");
    ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
}
