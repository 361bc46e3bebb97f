//! The default CPU schedule. Per stage:
//!
//! - Reductions run with their reduction loops outside the innermost
//!   spatial loop, so that the innermost loop writes contiguous memory —
//!   unless they reduce along rows (`max[d](X[n, d])`): then the reduction
//!   runs innermost over contiguous memory and the rows run in parallel
//!   ([`row_reductions`]).
//! - The innermost spatial loop is split by the vector width and vectorized,
//!   short rows fused first, transposes walked by cache line
//!   ([`vectorize`]); in a reduction, rows of another spatial loop are
//!   unrolled inside the reduction loops ([`blocking`]), long GEMM rows with
//!   packed panels ([`pack`]).
//! - Outer spatial loops are fused until there is enough parallel work
//!   (32 iterations per core: 64 on two), and that loop runs on the thread
//!   pool — when the machine has several cores and the stage has at least
//!   2^15 loop iterations in all; smaller stages run on one thread, faster
//!   than the pool can hand work out.
//!
//! Then across stages ([`attach`]): a register block's accumulators in
//! registers, epilogues stored from them, and temporaries computed inside
//! the loops of their readers.
//!
//! Before all that, the preparation passes ([`PREPARATION`]): besides the
//! shared ones, index quotients and remainders the variables' ranges
//! decide are simplified (`normalize::simplify_div_mod`), a max pool's
//! window is a maximum over its rows and then one over its columns
//! ([`crate::separable`]), divisors constant along a row are inverted once
//! per row, trailing reduction variables that walk every read as one
//! dense row become one, and float reductions along rows are factored
//! into vector-width partial results, so that they vectorize
//! ([`row_reductions`]).
//!
//! The sizes of blocks and the parallel work follow from the target's
//! caches and cores (`Target::caches`: read from the machine for `host`,
//! nominal for the named targets), each choice with its reasoning where it
//! is made ([`blocking`]); on the nominal machine they are the choices
//! measured there.
//!
//! Invariants: a stage is scheduled from its fresh loops (the axes, then
//! the reduction variables), and only from what [`Machine`] says of the
//! target and the knobs; stages are inserted into the program (packed
//! operands) last first, after every stage is scheduled, so that the
//! indices of the others stay valid.

mod attach;
pub(crate) mod blocking;
mod model;
mod pack;
pub(crate) use pack::vector_operand;
mod row_reductions;
mod threads;
mod tiles;
mod vectorize;

use super::{preparation, uses_var, Strategy};
use crate::analysis;
use crate::ir::ForKind;
use crate::knobs::{DefaultKnobs, Family};
use crate::prepare::Step;
use crate::schedule::{Schedules, StageSchedule};
use attach::{attach_producers, fold_epilogues, local_accumulators};
use blocking::register_block;
use pack::{pack_operand, PackRequest};
use row_reductions::{reduces_along_rows, schedule_row_reduction};
use texc_compiler::ops::{BinOp, MathFn};
use texc_compiler::rewrite::Model;
use texc_compiler::target::{CpuCaches, Target};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_grammar::Span;
use vectorize::{fuse_short_rows, scattering_order, split_at_row_breaks, transposing_order, vectorize_inner};

/// The default schedule of CPU targets.
pub(super) struct Cpu;

impl Strategy for Cpu {
    fn family(&self) -> Family {
        Family::Cpu
    }

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn preparation(&self) -> &'static [Step] {
        &PREPARATION
    }

    fn performance(&self, target: &Target) -> Model {
        std::sync::Arc::new(model::CpuModel::of(target))
    }

    fn schedule(&self, p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules {
        schedule(p, target, knobs)
    }
}

/// Integer products on dot-product instructions, attention and transposed
/// operands first, while their statements are as written; epilogues
/// are inlined once reductions are hoisted out of them, and a row
/// reduction's dense loops are fused before it is factored into
/// vector-width partial results.
const PREPARATION: [Step; 16] = [
    Step { name: "dot4-products", run: dot4_products },
    Step { name: "filters-last", run: filters_last },
    Step { name: "merge-product-rows", run: merge_product_rows },
    Step { name: "phase-strided-windows", run: phase_strided_windows },
    Step { name: "fuse-attention", run: fuse_attention },
    Step { name: "transpose-operands", run: transpose_operands },
    Step { name: "one-hot-gathers", run: preparation::one_hot_gathers },
    Step { name: "inline-elementwise", run: preparation::inline_elementwise_step },
    Step { name: "hoist-reductions", run: preparation::hoist_reductions_step },
    Step { name: "inline-epilogues", run: preparation::inline_epilogues_step },
    Step { name: "simplify-div-mod", run: preparation::simplify_div_mod },
    Step { name: "fold-conditions", run: preparation::fold_conditions },
    Step { name: "separate-window-maxima", run: separate_window_maxima },
    Step { name: "reciprocals", run: reciprocals },
    Step { name: "fuse-dense-reductions", run: row_reductions::fuse_dense_reductions },
    Step { name: "rfactor", run: row_reductions::rfactor },
];

/// *separate-window-maxima*: a max pool's window as a maximum over rows,
/// then one over columns ([`crate::separable`]).
fn separate_window_maxima(p: &mut Program, _: &Target, _: DefaultKnobs) {
    crate::separable::separate_window_maxima(p);
}

/// *dot4-products*: sums of `u8 × i8` products on the target's `@dot4`
/// ([`crate::dot4`]; the pipeline made those of constant operands before folding).
fn dot4_products(p: &mut Program, t: &Target, _: DefaultKnobs) {
    crate::dot4::pack_products(p, t, &crate::dot4::nothing_known);
}

/// *filters-last*: products over rows too short for the vectors computed
/// with their long axis last ([`crate::filters_last`]; the pipeline did
/// those before folding, moving constant filters once; here only `@dot4`'s
/// packed operands move).
fn filters_last(p: &mut Program, t: &Target, _: DefaultKnobs) {
    crate::filters_last::filters_last(p, t, &|_| false, &|_| false);
}

/// *merge-product-rows*: products over short image rows computed over the
/// whole map as one axis of rows ([`crate::merge_rows`]).
fn merge_product_rows(p: &mut Program, t: &Target, knobs: DefaultKnobs) {
    let pays = |p: &Program, si: usize, (y, x): (usize, usize)| {
        let st = &p.stages[si];
        let (rows, pitches) = ((st.vars[y].extent, st.vars[x].extent), blocking::row_pitches(p, st, x));
        blocking::merged_rows_pay(Machine::of(t, st, p, knobs), rows, &pitches)
    };
    crate::merge_rows::merge_product_rows(p, t, &pays);
}

/// *phase-strided-windows*: a float product's operand read through a
/// strided window (a stride-2 stem, a stride-2 depthwise convolution) read
/// from copies of its phases instead ([`crate::subsample::phase_float_windows`]).
fn phase_strided_windows(p: &mut Program, _: &Target, _: DefaultKnobs) {
    crate::subsample::phase_float_windows(p);
}

/// *transpose-operands*: a product's vector operand read across its rows
/// (`W[j, k]`) transposed once ([`crate::transpose`]; the pipeline made those
/// of constant operands before folding).
fn transpose_operands(p: &mut Program, _: &Target, _: DefaultKnobs) {
    crate::transpose::transpose_operands(p, None, crate::transpose::MIN_ROWS);
}

/// *fuse-attention*: an attention's five statements as one operator,
/// computed flash-style ([`crate::flash`]).
fn fuse_attention(p: &mut Program, _: &Target, knobs: DefaultKnobs) {
    if knobs.flash != Some(false) {
        crate::flash::fuse_attention(p)
    }
}

/// *reciprocals*: a divisor that varies only along outer loops is inverted
/// once per row, a stage of its own (knob `recip`).
fn reciprocals(p: &mut Program, _: &Target, knobs: DefaultKnobs) {
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

/// The machine a default schedule is made for: vector width and registers,
/// caches and cores.
#[derive(Clone, Copy)]
struct Machine {
    /// Lanes of the stage's compute type.
    lanes: i64,
    /// Accumulator vectors a register block keeps (about 3/4 of the registers).
    accumulators: i64,
    /// Vector registers a register block's step may hold: the target's,
    /// less the four a widening `@dot4` takes.
    registers: i64,
    /// Lanes of the half-width vector, where that is still 256 bits or more
    /// (AVX-512 machines run 256-bit vectors at full rate): loops shorter than
    /// a full vector but at least this long use it instead of staying scalar.
    half_lanes: Option<i64>,
    /// The target's caches and cores (the nominal ones for a target without).
    caches: CpuCaches,
    knobs: DefaultKnobs,
    /// A masked access's lane mask takes a vector register (AVX2's
    /// `vpmaskmovd`), not a mask register (AVX-512's `k`).
    masks_in_vectors: bool,
}

impl Machine {
    fn of(target: &Target, st: &Stage, p: &Program, knobs: DefaultKnobs) -> Machine {
        let full_bits = target.vector_bits as i64;
        // `vec`: narrower vectors than the target's (256-bit ones on AVX-512).
        let bits = knobs.vec.map_or(full_bits, |b| b.min(full_bits)).max(1);
        let elem = p.tensor(st.tensor).elem;
        let bytes = matches!(elem, ElemType::U8 | ElemType::I8) && computes_only_bytes(p, st.value);
        let computed =
            if bytes && reads_rows_densely(p, st) { target.lanes(elem) as i64 } else { target.compute_lanes(elem) };
        let lanes = (computed * bits / full_bits.max(1)).max(1);
        let half_bits = bits / 2;
        let half_lanes = (half_bits >= 256 && lanes >= 2).then_some(lanes / 2);
        // `@dot4` without VNNI widens both operands to 16 bits first: four
        // more registers per step (AVX2: 8 accumulators, not 12).
        let widening = !target.has_vnni() && uses_dot4(p, st.value);
        let accumulators = (target.vector_registers as i64 * 3 / 4 - if widening { 4 } else { 0 }).max(2);
        let registers = target.vector_registers as i64 - if widening { 4 } else { 0 };
        let caches = target.cpu_caches();
        let masks_in_vectors = !target.requires.contains(&"avx512f");
        // Short rows (under four full vectors) that divide per element use
        // the 256-bit vector: a 512-bit vector's tail costs as much as a whole
        // 256-bit one, and division and square root run no faster per element
        // in 512-bit vectors (measured here, Zen 5: 1.5× slower). Long rows
        // keep 512 bits (`layer_norm` over 1024: 15 % faster).
        if let (Some(half), Some(inner)) = (half_lanes, st.n_axes.checked_sub(1)) {
            let short = st.vars[inner].extent < 4 * lanes;
            if short && divides_per_element(p, st.value, inner as VarId) {
                return Machine {
                    lanes: half,
                    accumulators,
                    registers,
                    half_lanes: None,
                    caches,
                    knobs,
                    masks_in_vectors,
                };
            }
        }
        Machine { lanes, accumulators, registers, half_lanes, caches, knobs, masks_in_vectors }
    }

    /// Iterations a parallel loop should have: [`CHUNKS_PER_CORE`] per core.
    fn parallel_iterations(self) -> i64 {
        CHUNKS_PER_CORE * self.caches.cores
    }

    /// Whether a stage of `iterations` loop iterations in all is worth
    /// sharing between threads: there are several cores, and the work is
    /// more than handing it out costs ([`MIN_PARALLEL_ITERATIONS`]).
    fn worth_threads(self, iterations: i64) -> bool {
        self.caches.cores >= 2 && iterations >= MIN_PARALLEL_ITERATIONS
    }

    /// Whether `items` units of parallel work (full blocks, slabs) give
    /// every core two: fewer leave one core's last unit another's wait.
    fn two_per_core(self, items: i64) -> bool {
        items >= 2 * self.caches.cores.max(1)
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

/// The length of the row the default schedule vectorizes in stage `si`:
/// its last axis, with the axes before it that every read walks densely
/// fused while it is short ([`vectorize::fused_row`]).
pub(crate) fn default_row(p: &Program, target: &Target, si: usize) -> i64 {
    let st = &p.stages[si];
    vectorize::fused_row(p, st, Machine::of(target, st, p, DefaultKnobs::default())).1
}

/// Whether every value `e` computes is a byte (indices and conditions
/// aside): a padding copy or a max pool of bytes, which moves and compares
/// bytes and widens nothing, so fills a register with byte lanes (32 on
/// AVX2, not the f32 width's 8).
fn computes_only_bytes(p: &Program, e: TExprId) -> bool {
    let byte = match p.ty(e) {
        Ty::Index => true,
        Ty::Elem(t) => t.size() == 1,
    };
    byte && p.children(e).into_iter().all(|c| computes_only_bytes(p, c))
}

/// Whether every read of `st` moves by one element or none along its last
/// axis. A byte row read at stride 2 in 32 lanes is a 63-byte span the
/// vector is picked from across AVX2's 128-bit halves (MEASURED: a `u8`
/// 3 × 3 max pool of stride 2, 64 × 112 × 112, 0.24 ms in 16 lanes, 0.78
/// in 32).
fn reads_rows_densely(p: &Program, st: &Stage) -> bool {
    let Some(inner) = st.n_axes.checked_sub(1) else { return true };
    let mut loads = Vec::new();
    analysis::loads_in(p, st.value, &mut loads);
    loads.iter().all(|&l| match p.expr(l) {
        TExpr::Load(t, idx) => {
            matches!(analysis::flat_coefficient(p, *t, idx, inner as VarId), Some(0 | 1))
        }
        _ => false,
    })
}

/// Whether `e` computes a [`texc_compiler::ops::Intrinsic::Dot4`].
fn uses_dot4(p: &Program, e: TExprId) -> bool {
    matches!(p.expr(e), TExpr::Intrinsic(texc_compiler::ops::Intrinsic::Dot4, _))
        || p.children(e).into_iter().any(|c| uses_dot4(p, c))
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

/// The CPU schedule of a prepared program: each stage on its own
/// ([`schedule_stage`], or a row reduction), then what concerns several
/// stages: packed operands, epilogues, attachments, and the `par` knob.
fn schedule(p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules {
    let mut s = Schedules::new(p);
    let mut packs = Vec::new();
    let mut split = threads::SplitAxes::new();
    for (si, ss) in s.stages.iter_mut().enumerate() {
        let st = &p.stages[si];
        let m = Machine::of(target, st, p, knobs);
        if crate::flash::is_attention(p, si) {
            ss.flash = Some(flash_schedule(st, m, knobs));
            continue;
        }
        // Before row reductions: a convolution's packed input reads the
        // sum's channels contiguously, but tiles run it.
        if let Some(axes) = tiles::tile_product(p, st).filter(|_| target.has_amx_int8()) {
            tiles::schedule_tiles(ss, p, st, axes, m);
            split.extend(threads::split_axis(ss).map(|a| (st.tensor, a)));
            continue;
        }
        if reduces_along_rows(p, st) {
            schedule_row_reduction(ss, m);
            split.extend(threads::split_axis(ss).map(|a| (st.tensor, a)));
            continue;
        }
        // (One thread: no threads' shares to follow.)
        let follow = match (knobs.follow, knobs.par) {
            (Some(false), _) | (_, Some(false)) => None,
            _ => threads::followed_axis(p, st, &split),
        };
        let pack = schedule_stage(ss, p, st, m, follow);
        split.extend(threads::owned_axis(ss, follow, knobs.attach != Some(false)).map(|a| (st.tensor, a)));
        // A block whose reduction is sliced outside it and packed per slice
        // stays in memory; one packed per column block (its whole reduction
        // inside), or sliced without a pack (resumed), does not.
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
        let caches = target.cpu_caches();
        let in_registers = matches!(target.backend(), Ok(texc_compiler::target::BackendKind::Llvm));
        let whole = attach::WholeTransposes { l1: caches.l1d, l2: caches.l2, in_registers };
        attach_producers(p, &mut s, target.compute_lanes(texc_compiler::types::ElemType::F32), whole);
    }
    if knobs.par == Some(false) {
        // One thread: a small kernel's work below what handing it to the pool costs.
        for v in s.stages.iter_mut().flat_map(|ss| ss.ivs.iter_mut()) {
            if v.kind == ForKind::Parallel {
                v.kind = ForKind::Serial;
            }
        }
        for fl in s.stages.iter_mut().filter_map(|ss| ss.flash.as_mut()) {
            fl.parallel = false;
        }
    }
    s
}

/// Keys per block of a flash-style attention: a block of K and of V rows
/// (64 × 64 floats each at D = 64, 32 KiB together) stays in L1 while the
/// row's scores, exponentials and products run over it.
const FLASH_BLOCK: i64 = 64;

/// Queries per block of a flash-style attention: a row of `V` and a column
/// of the transposed keys are read once for that many queries, and laying
/// out a block of keys is paid once for them (B = 1, H = 12, D = 64 on Zen 5,
/// 1 thread, GFLOP/s for 4 / 8 / 16 queries: L = 197 AVX-512 27 / 53 / 57,
/// AVX2 31 / 40 / 51; L = 1024 AVX-512 28 / 43 / 42–45). Once the
/// softmax's reductions ran on vectors and `O += p · V` in register tiles,
/// the transposed keys' layout was the larger cost left: 32 queries on a
/// Zen 4, 1 thread, 16 / 32: L = 197 AVX-512 48.5 / 58.9, AVX2 53.3 / 60.0;
/// L = 1024 AVX-512 50.6 / 63.3.
const FLASH_QUERIES: i64 = 32;

/// The flash schedule of attention stage `st`: rows on the thread pool when
/// there are enough of them and enough work.
fn flash_schedule(st: &Stage, m: Machine, knobs: DefaultKnobs) -> crate::flash::Flash {
    let rows: i64 = st.vars[..st.n_axes - 1].iter().map(|v| v.extent).product();
    let work: i64 = st.vars.iter().take(st.n_axes + 1).map(|v| v.extent).product();
    crate::flash::Flash {
        block: knobs.fkeys.unwrap_or(FLASH_BLOCK),
        queries: knobs.fqueries.unwrap_or(FLASH_QUERIES),
        lanes: m.lanes,
        parallel: rows >= 2 && m.worth_threads(work),
        accumulators: m.accumulators,
        // Half a core's L2, beside the blocks of V and of scores; rows at
        // least twice the cores, so that one row per thread is no straggler.
        whole_keys_bytes: m.caches.l2 / 2,
        whole_keys_rows: 2 * m.caches.cores,
    }
}

/// `follow`: the axis the threads of the stage's producer shared out, read
/// along an axis of this stage ([`threads`]).
fn schedule_stage(
    ss: &mut StageSchedule,
    p: &Program,
    st: &Stage,
    m: Machine,
    follow: Option<VarId>,
) -> Option<PackRequest> {
    let span = Span::default();
    let n_axes = st.n_axes;
    if n_axes == 0 {
        return None;
    }
    // Vectors along the row (or scattered along another axis).
    let pack = match scattering_order(ss, p, st, m) {
        true => None,
        false => vectorize_rows(ss, p, st, m),
    };
    if let (Some(v), None) = (follow, &pack) {
        threads::follow(ss, v, m);
    }
    // Fuse leading spatial loops until there is enough parallel work.
    let mut outer = ss.leaves[0];
    if ss.ivs[outer].reduce || ss.leaves.len() == 1 && ss.ivs[outer].kind == ForKind::Vectorized {
        return pack;
    }
    while ss.ivs[outer].extent < m.parallel_iterations() && ss.leaves.len() > 2 {
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
    if ss.ivs[par].extent >= 2 && m.worth_threads(iterations(ss)) {
        ss.annotate(par, ForKind::Parallel, span).expect("spatial");
    }
    pack
}

/// The innermost spatial loop of `st` (its last axis, or its trailing axes
/// fused) vectorized, with the reductions outside it; a reduction's
/// register block, and the panel it packs, if any.
fn vectorize_rows(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) -> Option<PackRequest> {
    let span = Span::default();
    let n_axes = st.n_axes;
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
    pack
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

/// Whether leaf `l` is the outer loop of a split whose factor does not
/// divide its extent, or a part of such a loop split again (the column
/// blocks and panels of a row of 289 pixels in panels of 32): the tail's
/// guard reads it, and decides only where it stays a loop of its own.
fn has_tail(ss: &StageSchedule, l: usize) -> bool {
    match ss.ivs[l].rel {
        crate::schedule::Rel::Split { parent, outer, factor } => {
            outer && ss.ivs[parent].extent % factor != 0 || has_tail(ss, parent)
        }
        _ => false,
    }
}

/// Loop iterations below which a stage runs on one thread: handing work to
/// the pool's threads and waiting for them costs tens of microseconds,
/// more than a small stage's whole work (a normalization of a few hundred
/// elements takes 0.3 µs on one thread and 130 µs split over two).
const MIN_PARALLEL_ITERATIONS: i64 = 1 << 15;

/// Iterations of a parallel loop per core: enough that cores finishing
/// their share at different times (a partial last block, a core busy
/// elsewhere) wait little for one another — 64 iterations on the nominal
/// two cores, as measured there.
const CHUNKS_PER_CORE: i64 = 32;

/// The loop iterations of stage `ss`, all loops together.
fn iterations(ss: &StageSchedule) -> i64 {
    ss.leaves.iter().fold(1i64, |n, &l| n.saturating_mul(ss.ivs[l].extent.max(1)))
}

/// `a / b` rounded up, for `a ≥ 0` and `b ≥ 1` (signed `div_ceil` is unstable).
fn ceil_div(a: i64, b: i64) -> i64 {
    a / b + i64::from(a % b != 0)
}
