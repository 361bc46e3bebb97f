//! Register blocking of reductions: rows of a spatial axis whose vector
//! loads they share (or of the filters of one group, in a grouped
//! convolution) are unrolled inside the reduction loops, so that
//! independent accumulator vectors (3/4 of the target's registers) hide the
//! FMA latency. A row of one vector (a convolution's 13×13 map) blocks
//! rows of the image too, which share the filters' broadcasts
//! ([`two_axis_rows`]), or, over channels blocked by eight, a group's
//! filter blocks (any filter blocks, ungrouped), which share its input's
//! broadcasts ([`group_rows_axis`]).
//! Long GEMM rows get BLIS-style blocking: a micro-kernel of two vectors (`nvec`), its column loop outside the
//! reductions in blocks of columns (`cols`), and a long reduction cut into
//! slices (`kslice`), whose panels of the vector operand are packed per
//! slice ([`super::pack`]).
//!
//! The slices and column blocks are sized by the machine's caches and
//! cores ([`LongBlocking::of`]): a micro-kernel's rows of A for one slice
//! stay in L1 while it walks the panels of a block, the packed block of B
//! stays in L2 while the row blocks walk it, and the column blocks give
//! every core several to run. On the nominal machine (32 KiB L1d, 1 MiB
//! L2, two cores) these are the slices of 512 (256 for reductions of 512
//! or less over rows of two column blocks or more) and blocks of 128 or
//! 256 columns measured there.
//!
//! Invariants: an explicit `rows` is taken as given (a last, shorter block
//! is a copy of the loops); without it, rows are chosen so that no guard
//! lands in the innermost loop, where the accumulators live. A block's
//! unrolled rows are the innermost loop but for the vector lanes.

use super::pack::{vector_operand, PackRequest};
use super::vectorize::{vectorize_inner, MAX_SHORT_VECTORS};
use super::{ceil_div, Machine};
use crate::analysis::{coefficient, loads_in};
use crate::ir::ForKind;
use crate::schedule::StageSchedule;
use crate::strategy::uses_var;
use texc_compiler::target::CpuCaches;
use texc_compiler::tir::{Program, Stage, TExpr, TExprId};
use texc_grammar::Span;

/// Register blocking for reductions: rows of a spatial axis (see
/// [`reuse_axis`]) are unrolled inside the reduction loops, so that
/// independent accumulator vectors (3/4 of the target's registers: 12 of
/// AVX2's 16, 24 of AVX-512's 32) hide the FMA latency and share their
/// vector loads. Rows longer than 6 vectors get the structure of BLIS's
/// SGEMM: blocks of two vectors (a 6×16 micro-kernel on AVX2, 12×32 on
/// AVX-512) whose loop moves outside the reductions, in groups spanning 128
/// or 256 columns, and a single long reduction cut into slices
/// ([`LongBlocking::kslice`]; few rows read along their operand's lines:
/// [`LongBlocking::whole_rows_slice`] where [`step_outruns_l2`]); the returned
/// request asks to pack the vector operand per slice and column block (a
/// reduction of one slice: per column block, where those are outermost).
pub(super) fn register_block(
    ss: &mut StageSchedule,
    p: &Program,
    st: &Stage,
    m: Machine,
    (inner, first_row_axis): (usize, usize),
) -> Option<PackRequest> {
    let span = Span::default();
    let row = ss.ivs[inner].extent;
    let loads = ProductLoads::of(p, st);
    let vector = &loads.vector[..];
    let (mut a, mut shared) = reuse_axis(p, st, vector, first_row_axis);
    let mut image_rows = shared.then(|| image_row_axis(p, st, &loads, first_row_axis, a)).flatten();
    // Rows along a reuse axis of the stage (`a` one of its variables, every
    // other variable's axis unsplit), not among a group's filters.
    let along_reuse_axis = shared;
    if let Some((axis, g)) = group_axis(p, st, vector, first_row_axis).filter(|_| !shared) {
        // The filters of one group share their input: rows among them, and
        // with image rows where the row is one vector (a grouped
        // convolution's 7² map), as a convolution's.
        let within = split_groups(ss, axis, g);
        image_rows = image_row_axis(p, st, &loads, first_row_axis, axis);
        (a, shared) = (within, true);
    }
    // Where the rows share their vector loads (channels blocked by eight:
    // a block's positions share its filters' vector) and no image rows
    // block beside them: the filter blocks of a group (of the whole
    // product, ungrouped), which share the input's broadcasts.
    let group_rows =
        (along_reuse_axis && image_rows.is_none()).then(|| group_rows_axis(p, st, &loads, first_row_axis, a)).flatten();
    // Rows that each load their own input through a window along them (a
    // depthwise convolution's `X[n, c, y + r, x + s]`): with the window's
    // tap `r` unrolled inside the rows' block, rows and taps that meet at
    // one input row share its load.
    let tap = (!shared).then(|| window_tap(p, st, &loads.all, vector, a)).flatten();
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
    let long = long_row(row, lanes);
    let vectors = if long { within_group(p, st, &loads, lanes, m.knobs.nvec) } else { short_vectors };
    // Rows of the image too where the row is one vector: `f` rows
    // of filters broadcast their weights to every image row of the block.
    let image_block = match (image_rows, group_rows, m.knobs.rows) {
        (Some(h), _, None) if !long && vectors == 1 => {
            let taken = step_registers(p, st.value, vector, m, (row, lanes));
            Some((h, two_axis_rows(m.accumulators, taken, ss.ivs[a].extent, (ss.ivs[h].extent, false))))
        }
        (None, Some((axis, g)), None) if !long && vectors == 1 => {
            // Rows of a group's filter blocks (of every filter block,
            // ungrouped), each loading its own vector of filters and
            // sharing the input's broadcasts: the block's second axis, as
            // an image's rows are a convolution's (the group split off
            // only where its rows are blocked).
            let taken = step_registers(p, st.value, vector, m, (row, lanes));
            let rows = g.unwrap_or(ss.ivs[axis].extent);
            let (fk, fh) = two_axis_rows(m.accumulators, taken, ss.ivs[a].extent, (rows, true));
            (fh >= 2).then(|| (g.map_or(axis, |g| split_groups(ss, axis, g)), (fk, fh)))
        }
        _ => None,
    };
    let f = match (m.knobs.rows, image_block) {
        // An explicit request is taken as it is: the last block is then a
        // shorter copy of the loops (partitioned), or guarded.
        (Some(rows), _) => rows.min(ss.ivs[a].extent),
        (None, Some((_, (fk, _)))) => fk,
        (None, None) => {
            // A BLIS micro-kernel's step holds its `vectors` of the packed
            // panel and a broadcast beside the accumulators; a `@dot2` or
            // `@dot4sat` product (and ones) takes what registers are left,
            // then accumulators (AVX2, `@dot4sat`: 5 rows of 2, not 6).
            let spare = m.accumulators * 4 / 3 - m.accumulators - vectors - 1;
            let taken = if long { (product_registers(p, st, vector, vectors) - spare).max(0) } else { 0 };
            // Rows sharing a window's loads (`tap`) take a short last
            // block as a micro-kernel does, rather than blocks of 2 that
            // divide the rows (a 7 × 7 window over 14 rows on AVX2: 4 × 3 + 2).
            let accumulators = match tap {
                // Two rows at least, so that some share their loads.
                Some(_) => window_accumulators(m).max(2 * vectors),
                None if shared && !long => {
                    short_row_accumulators(m, vectors, step_registers(p, st.value, vector, m, (row, lanes)))
                }
                None => block_accumulators(m, shared),
            };
            let max = (accumulators - taken) / vectors;
            let pitches = |a: usize| broadcast_pitches(p, &loads, a);
            default_rows(
                if long { rows_within_sets(max, &root_axis(ss, a).map_or(Vec::new(), pitches), m.caches) } else { max },
                ss.ivs[a].extent,
                (long || tap.is_some()).then(|| l1_ways(m.caches)),
                vectors,
            )
        }
    };
    if f < 2 {
        if row >= 2 * m.lanes && ss.leaves.iter().any(|&l| ss.ivs[l].reduce) {
            block_columns(ss, inner, m);
        } else {
            vectorize_inner(ss, inner, m);
        }
        return None;
    }
    let (name, all_rows) = (ss.ivs[a].name.clone(), ss.ivs[a].extent);
    let (ab, r) = ss.split(a, f, (&format!("{name}.b"), span), (&format!("{name}.r"), span), span).expect("fresh");
    let image_r = image_block.filter(|&(_, (_, fh))| fh >= 2).map(|(h, (_, fh))| {
        let hname = ss.ivs[h].name.clone();
        let (_, hr) =
            ss.split(h, fh, (&format!("{hname}.b"), span), (&format!("{hname}.r"), span), span).expect("fresh");
        hr
    });
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
        // A group's rows outside the positions' (each of its filter vectors
        // loaded once, then broadcast into by every position): LLVM spills
        // half as many vectors from the 4 × 3 block (11 stores a step, not
        // 23; 77–84 GFLOP/s against 62–76, Zen 3, 1 thread).
        let unrolled: Vec<usize> = match (image_r, group_rows.is_some()) {
            (Some(g), true) => vec![g, r],
            _ => std::iter::once(r).chain(image_r).collect(),
        };
        let mut order: Vec<usize> = ss
            .leaves
            .iter()
            .copied()
            .filter(|&l| !ss.ivs[l].reduce && !unrolled.contains(&l) && !row_loops.contains(&l))
            .collect();
        let tap_leaf = tap_leaf(ss, tap);
        order.extend(reductions.iter().copied().filter(|&l| Some(l) != tap_leaf));
        order.extend(tap_leaf);
        order.extend(&unrolled);
        order.extend(row_loops);
        ss.reorder(&order, span).expect("a permutation of the leaves");
        for &u in unrolled.iter().chain(&tap_leaf) {
            ss.annotate(u, ForKind::Unrolled, span).expect("serial leaf");
        }
        unroll_reduction(ss, m.knobs.unroll);
        return None;
    }
    // The micro-kernel is two vectors wide (`nvec`); packed panels have its
    // width, and a block of panels spans 128 or 256 columns (`cols`).
    let width = vectors * lanes;
    let (o, v) =
        ss.split(inner, width, (&format!("{iname}.o"), span), (&format!("{iname}.v"), span), span).expect("fresh");
    ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
    let elem = p.tensor(st.tensor).elem.size() as i64;
    let depth: i64 = reductions.iter().map(|&l| ss.ivs[l].extent).product();
    let blocking = LongBlocking::of(m, elem);
    // Few rows in all, laid along their operand's lines (a 1×1
    // convolution's 7×7 map computed filters-last): slices whose rows all
    // stay in L1 with the panel walking past them. (Not integer products:
    // their packed operand, `A.q2[k, i]`, is packed per row block.)
    let float = p.tensor(st.tensor).elem.is_float();
    let along_lines = float && rows_along_lines(p, &loads, a);
    let few_rows = along_lines.then(|| blocking.whole_rows_slice((all_rows, f, width), depth)).flatten();
    // Rows too many for that, a line apart at each step: slices that keep
    // one register block's lines in L1.
    let row_block = (along_lines && few_rows.is_none() && steps_across_lines(p, st, &loads, a))
        .then(|| blocking.row_block_slice((all_rows, f, width), depth, ss.ivs[o].extent))
        .flatten();
    let kslice = m.knobs.kslice.or(few_rows).or(row_block).unwrap_or(blocking.kslice(depth, ss.ivs[o].extent, width));
    let sliced = matches!(reductions[..], [_] if depth > kslice);
    // A reduction of one slice packs a block's panels whole (below): they
    // and the block's accumulators share the stack's 256 KiB (a limit of
    // the threads' stacks, not of the caches).
    let one_slice_fits = |cols: i64| cols * depth * elem + f * width * elem <= crate::attach::MAX_STACK_BYTES;
    let cols = m.knobs.cols.unwrap_or_else(|| blocking.cols(row, |c| sliced || one_slice_fits(c)));
    // Where nothing outside the column blocks has iterations to share
    // (the batch loops the vector operand reads stay outside them), the
    // blocks are the parallel loop: sized so that the cores' shares match.
    let shared_outside: i64 = ss
        .leaves
        .iter()
        .filter(|&&l| !ss.ivs[l].reduce && ![o, v, r, ab].contains(&l))
        .filter(|&&l| reads_along(p, vector, &ss.ivs[l].rel))
        .map(|&l| ss.ivs[l].extent)
        .product();
    let balanced = |per_block: i64| match m.knobs.cols {
        None if shared_outside == 1 => balanced_blocks(ss.ivs[o].extent, per_block, m.caches.cores),
        _ => per_block,
    };
    let per_block = balanced((cols / width).max(1));
    // An unsliced reduction (a direct convolution's `c, r, s`) streams its
    // panels whole: a block holds about as many as half of L2 does, at
    // least one, evened out between the cores as above (a quarter more at
    // most: `balanced_blocks`), and stays the loop outside the rows, so
    // that the rows re-read it from L2, not from L3. This applies to every
    // unsliced product whose blocks are the parallel loop (direct
    // convolutions too).
    // (MobileNetV2's 960 → 320 at 7², 10 panels 960 deep, 4 in half of a
    // 1 MiB L2, two threads: blocks of 4, 4 and 2 0.157 ms, of 5 0.131.)
    let half_l2 = (m.caches.l2 / 2 / (depth * width * elem).max(1)).max(1);
    let deep = !sliced && m.knobs.cols.is_none() && half_l2 < per_block;
    let per_block = if deep { balanced(half_l2) } else { per_block };
    let panels = ((per_block > 1 || deep) && ss.ivs[o].extent >= 2 * per_block).then(|| {
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
    let outer: Vec<usize> = ss
        .leaves
        .iter()
        .copied()
        .filter(|&l| !ss.ivs[l].reduce && l != r && l != ab && !row_part.contains(&Some(l)))
        .collect();
    // With column blocks, the outer loops the vector operand does not read
    // (more rows: `h` of a product over `h, w`) go inside the block loop,
    // so that a block's panels are read once for all rows rather than once
    // per outer row; those it reads (a batch) stay outside.
    let (mut order, inside): (Vec<usize>, Vec<usize>) = match oo {
        Some(_) => outer.iter().partition(|&&l| reads_along(p, vector, &ss.ivs[l].rel)),
        None => (outer, Vec::new()),
    };
    order.extend(oo);
    order.extend(inside);
    order.extend(slices.map(|(ko, _)| ko));
    if m.knobs.order.unwrap_or(few_rows.is_some()) {
        order.extend([oi, ab]);
    } else {
        order.extend([ab, oi]);
    }
    let tap_leaf = tap_leaf(ss, tap);
    let slice = slices.map(|(ko, _)| ko);
    order.extend(ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce && Some(l) != slice && Some(l) != tap_leaf));
    order.extend(tap_leaf);
    order.push(r);
    order.push(v);
    ss.reorder(&order, span).expect("a permutation of the leaves");
    for u in std::iter::once(r).chain(tap_leaf) {
        ss.annotate(u, ForKind::Unrolled, span).expect("serial leaf");
    }
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
    // block's box is inferred as whole rows of the image: every parallel
    // block would copy the slice of the whole image (MEASURED: ResNet-50's
    // 1×1 convolutions from 512 channels at 28², AVX-512, 1 thread: 5.2 ms
    // packed, 1.5 read in place; the model 47 → 37 ms).
    if first_row_axis + 1 != st.n_axes {
        return None;
    }
    let leaf = match slices {
        Some((ko, _)) => ko,
        None => {
            // Only where the column blocks are the outermost loop, of 8 or
            // more: the loop that runs in parallel, which `schedule_stage`
            // then does not fuse with the row blocks inside it (packing once
            // per row block).
            let outermost = ss.leaves.first() == Some(&oo) && ss.ivs[oo].extent >= 8;
            if !outermost || !one_slice_fits(per_block * width) {
                return None;
            }
            oo
        }
    };
    vector_operand(p, st).map(|tensor| PackRequest { leaf, tensor, width })
}

/// A reduction without rows to block (a matrix-vector product `x · W` at
/// one row, a classifier's head): its row of vectors is cut into blocks of
/// [`UNSHARED_ACCUMULATORS`] at most, each block's loop outside the
/// reductions and its vectors unrolled inside them, so that the block's
/// accumulators stay in registers for the whole reduction (without blocks
/// every step of the reduction loads and stores the whole row) and the
/// blocks are loops to run in parallel.
fn block_columns(ss: &mut StageSchedule, inner: usize, m: Machine) {
    let span = Span::default();
    let name = ss.ivs[inner].name.clone();
    let (o, v) =
        ss.split(inner, m.lanes, (&format!("{name}.o"), span), (&format!("{name}.v"), span), span).expect("fresh");
    ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
    let per_block = block_accumulators(m, false).min(ss.ivs[o].extent);
    let (ob, oi) =
        ss.split(o, per_block, (&format!("{name}.ob"), span), (&format!("{name}.oi"), span), span).expect("fresh");
    let mut order: Vec<usize> =
        ss.leaves.iter().copied().filter(|&l| !ss.ivs[l].reduce && ![ob, oi, v].contains(&l)).collect();
    order.push(ob);
    order.extend(ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce));
    order.extend([oi, v]);
    ss.reorder(&order, span).expect("a permutation of the leaves");
    ss.annotate(oi, ForKind::Unrolled, span).expect("serial leaf");
}

/// Panels per block of `panels` in all, near `per_block` (a quarter fewer
/// to a quarter more, at least 2: the block is what its packing and cache
/// reuse were sized for), such that the cores' shares of the blocks are as
/// even as they can be: the blocks, a last, shorter one included, run as
/// one parallel loop (`crate::launches`), split into one contiguous chunk
/// of blocks per core. Ties keep the larger block; a block that shortens
/// the longest share by less than 5 % is not taken. Inception-v3's 17×17
/// convolutions have 10 panels of 32 pixels: blocks of 4 gave one core
/// 4 + 2 panels and the other 4 (two threads ran them 1.68× faster than
/// one); blocks of 5 split 5 + 5.
fn balanced_blocks(panels: i64, per_block: i64, cores: i64) -> i64 {
    if cores < 2 || per_block < 2 || panels < 2 * per_block {
        return per_block;
    }
    let span = |b: i64| longest_share(panels, b, cores);
    let (fewest, most) = (((per_block * 3 + 3) / 4).max(2), per_block + per_block / 4);
    let best = (fewest..=most).rev().min_by_key(|&b| (span(b), (b - per_block).abs())).unwrap_or(per_block);
    // Many blocks even out by themselves: only a gain of 5 % changes them.
    if span(best) * 20 <= span(per_block) * 19 {
        best
    } else {
        per_block
    }
}

/// The most of `items` one of `cores` runs where a parallel loop walks them
/// in blocks of `block`, a last, shorter block included: the pool cuts the
/// loop's iterations into one contiguous chunk per core (`crate::launches`).
fn longest_share(items: i64, block: i64, cores: i64) -> i64 {
    let block = block.max(1);
    let (full, rest) = (items / block, items % block);
    let n = full + i64::from(rest > 0);
    let chunks = cores.clamp(1, n.max(1));
    let share =
        |c: i64| (n * c / chunks..n * (c + 1) / chunks).map(|i| if i < full { block } else { rest }).sum::<i64>();
    (0..chunks).map(share).max().unwrap_or(0)
}

/// Whether the loop of `rel` may index the stage's `vector` operands
/// ([`ProductLoads::vector`]): a root axis their indices use, or any loop
/// made by splitting or fusing (not looked into).
fn reads_along(p: &Program, vector: &[TExprId], rel: &crate::schedule::Rel) -> bool {
    let crate::schedule::Rel::Root(a) = *rel else { return true };
    vector.iter().any(|&l| uses_var(p, l, a as u32))
}

/// The spatial axis whose rows a register block unrolls: one that the
/// vector operands (loads contiguous in the innermost axis) do not depend
/// on, so that every unrolled row reuses the same vector loads and only
/// adds a broadcast (the `i` of a matmul, the filter `k` of a convolution).
/// Without such an axis (a depthwise convolution's rows each load their own
/// input), the axis outside the innermost, and `false`.
fn reuse_axis(p: &Program, st: &Stage, vector_loads: &[TExprId], first_row_axis: usize) -> (usize, bool) {
    (0..first_row_axis)
        .rev()
        .find(|&a| st.vars[a].extent >= 2 && !vector_loads.iter().any(|&l| uses_var(p, l, a as u32)))
        .map_or((first_row_axis - 1, false), |a| (a, true))
}

/// The reduction variable of a window that every vector operand of a
/// float sum reads along row axis `a` (`X[n, c, y + r, x + s]` for `y`:
/// `r`), of at most [`MAX_TAPS`] taps, where no vector operand reads `a`
/// otherwise, and some other load reads with the tap (the filters, `W[c,
/// 0, r, s]`). Not a window's maximum, nor an average pool's sum (a
/// pooling's rows are memory bound: ResNet-101's 3 × 3 max pool of stride
/// 2 at 112², `host`, 0.22 → 0.41 ms so), nor an integer product (its
/// `@dot4` blocks are sized for their own registers).
fn window_tap(p: &Program, st: &Stage, all: &[TExprId], vector: &[TExprId], a: usize) -> Option<usize> {
    let sum = matches!(p.expr(st.value), TExpr::Reduce(texc_compiler::ops::ReduceOp::Sum, ..));
    if !sum || !p.tensor(st.tensor).elem.is_float() {
        return None;
    }
    let (av, reductions) = (a as u32, st.n_axes..st.vars.len());
    let tap_of = |l: TExprId| -> Option<usize> {
        let TExpr::Load(_, idx) = p.expr(l) else { return None };
        let mut found = None;
        for &i in idx.iter().filter(|&&i| uses_var(p, i, av)) {
            let form = texc_compiler::affine::affine_in_vars(p, i)?;
            let r = reductions.clone().find(|&r| form.coeff(&(r as u32)) != 0)?;
            // Windows that overlap (more taps than the rows' stride, taps
            // one element apart): a pooling's 2 × 2 of stride 2 shares nothing.
            let overlap = form.coeff(&(r as u32)) == 1 && i128::from(st.vars[r].extent) > form.coeff(&av).abs();
            if !overlap || found.replace(r).is_some() {
                return None;
            }
        }
        found
    };
    let first = tap_of(*vector.first()?)?;
    let same = vector.iter().all(|&l| tap_of(l) == Some(first));
    let weighted = all.iter().any(|&l| !vector.contains(&l) && uses_var(p, l, first as u32));
    (same && weighted && st.vars[first].extent >= 2 && st.vars[first].extent <= MAX_TAPS).then_some(first)
}

/// The reduction leaf of `tap` (a stage variable), not split.
fn tap_leaf(ss: &StageSchedule, tap: Option<usize>) -> Option<usize> {
    let v = tap?;
    ss.leaves
        .iter()
        .copied()
        .find(|&l| ss.ivs[l].reduce && matches!(ss.ivs[l].rel, crate::schedule::Rel::Root(x) if x == v))
}

/// The most taps of a window [`window_tap`] unrolls (a 7 × 7 depthwise
/// convolution's rows).
const MAX_TAPS: i64 = 7;

/// A second axis for a register block of short rows: one the vector
/// operands read through a window ([`window_index`]) and no other load
/// reads (a convolution's image row `y`: `X[n, c, y + r, x + s]` moves with
/// it, `W[k, c, r, s]` does not), so that its rows share the broadcasts of
/// the filter axis `a`'s rows. Only for unit-stride rows.
fn image_row_axis(p: &Program, st: &Stage, loads: &ProductLoads, first_row_axis: usize, a: usize) -> Option<usize> {
    let ProductLoads { all: loads, vector } = loads;
    // Strided rows (a stride-2 convolution's `2·x + s`) gather or shuffle
    // each vector: rows of filters, sharing those, stay the cheaper block.
    let unit_stride = vector.iter().all(|&l| {
        let TExpr::Load(_, idx) = p.expr(l) else { return false };
        let inner = st.n_axes as u32 - 1;
        let last = idx.last().and_then(|&i| texc_compiler::affine::affine_in_vars(p, i));
        last.is_some_and(|form| form.coeff(&inner) == 1)
    });
    if !unit_stride {
        return None;
    }
    (0..first_row_axis).rev().find(|&h| {
        let v = h as u32;
        h != a
            && st.vars[h].extent >= 2
            && vector.iter().any(|&l| window_index(p, st, l, v))
            && loads.iter().all(|&l| vector.contains(&l) || !uses_var(p, l, v))
    })
}

/// Axis `axis` (a root leaf) split into groups of `g` (`.g`) and the rows
/// within one (`.i`, returned).
fn split_groups(ss: &mut StageSchedule, axis: usize, g: i64) -> usize {
    let (span, name) = (Span::default(), ss.ivs[axis].name.clone());
    let (_, within) =
        ss.split(axis, g, (&format!("{name}.g"), span), (&format!("{name}.i"), span), span).expect("fresh");
    within
}

/// Where rows along `a` share the vector loads and no image axis blocks
/// beside them: a spatial axis that every vector load reads (a row of it
/// loads its own vector) and every other load reads only through `h / g`
/// (a grouped convolution over channels blocked by eight, `Y[n, kb, h, w,
/// ki] = Σ X[n, kb / 3 · 3 + cb, h + r, w + s, ci] · W[kb, cb, ci, r, s,
/// ki]`: the three filter blocks of a group share the input's broadcasts),
/// and `g`; or, ungrouped, not at all (`X[n, cb, h + r, w + s, ci]`: every
/// filter block shares them), where every vector load reads it as a block
/// of its own ([`filter_block`]), and `None`. Blocked within a group only,
/// whose rows the block divides (no shorter last block; see
/// [`window_index`] for why that matters); ungrouped, in blocks that
/// divide the axis alike.
/// MEASURED (Zen 3, 1 thread, RegNetX-1.6GF's 168 channels in groups of 24
/// at 28², `benches/grouped_conv_blocked.tex`, minima of three alternated
/// rounds): 7 positions × 1 filter block 0.73–0.76 ms, 4 positions × a
/// group's 3 blocks 0.68–0.71 (the hand-written schedule's 0.69–0.71).
/// Ungrouped (its 1 × 1 convolution, 168 → 168 channels at 28² blocked by
/// eight, `x86-avx2`, medians of three alternated rounds of 300): 7
/// positions × 1 block 0.58–0.63 ms, 4 positions × 3 blocks 0.50–0.54.
fn group_rows_axis(
    p: &Program,
    st: &Stage,
    loads: &ProductLoads,
    first_row_axis: usize,
    a: usize,
) -> Option<(usize, Option<i64>)> {
    let ProductLoads { all, vector } = loads;
    if vector.is_empty() {
        return None;
    }
    let broadcasts: Vec<TExprId> = all.iter().copied().filter(|l| !vector.contains(l)).collect();
    (0..first_row_axis).rev().find_map(|h| {
        let (v, ext) = (h as u32, st.vars[h].extent);
        if h == a || !vector.iter().all(|&l| uses_var(p, l, v)) {
            return None;
        }
        match through_group(p, &broadcasts, v)? {
            Some(g) => (g >= 2 && g < ext && ext % g == 0).then_some((h, Some(g))),
            None => (ext >= 2 && vector.iter().all(|&l| filter_block(p, st, l, v))).then_some((h, None)),
        }
    })
}

/// Whether load `l` reads a block of filters of its own for each row of
/// `v`, as a matrix product's rows do (`W[kb, cb, ci, r, s, ki]`, `B[kb,
/// ki]`): `v` alone in one dimension, before every dimension a variable of
/// the sum reads, the row's axis alone in the last, and no other axis of
/// the stage anywhere (so not an image: a channels-first input `X[n, c, h,
/// w]` reads its rows inside the channels it sums, its batch `n` beside
/// the image's axes; nor a strided row).
fn filter_block(p: &Program, st: &Stage, l: TExprId, v: u32) -> bool {
    let TExpr::Load(_, idx) = p.expr(l) else { return false };
    let (inner, reductions) = (st.n_axes as u32 - 1, st.n_axes as u32..st.vars.len() as u32);
    let summed = |i: TExprId| reductions.clone().any(|r| uses_var(p, i, r));
    let other_axis = |i: TExprId| (0..inner).any(|x| x != v && uses_var(p, i, x));
    let is = |i: TExprId, x: u32| matches!(p.expr(i), TExpr::Var(y) if *y == x);
    let mut at = idx.iter().enumerate().filter(|&(_, &i)| uses_var(p, i, v));
    let (Some((d, &i)), None) = (at.next(), at.next()) else { return false };
    is(i, v)
        && idx[..d].iter().all(|&j| !summed(j))
        && idx.last().is_some_and(|&j| is(j, inner))
        && idx.iter().all(|&j| !other_axis(j))
}

/// Whether load `l` reads `v` in an index that a reduction variable also
/// moves (`y + r`): the rows a window slides over. (A batch axis, read
/// alone, is not blocked so: its block's last, shorter one would leave
/// rows of an attached producer's buffer unstored, which the zero pass
/// cannot tell from rows read.)
fn window_index(p: &Program, st: &Stage, l: TExprId, v: u32) -> bool {
    let TExpr::Load(_, idx) = p.expr(l) else { return false };
    let reductions = st.n_axes as u32..st.vars.len() as u32;
    idx.iter().any(|&i| uses_var(p, i, v) && reductions.clone().any(|r| uses_var(p, i, r)))
}

/// Rows `(fk, fh)` of a register block of one vector per row over a filter
/// axis of `k` and an image axis of `h`: at most `accumulators` vectors,
/// with the image rows' loads and a broadcast in the registers left (3/4 of
/// them are the accumulators), the fewest loads per FMA over the whole image
/// axis, its last, shorter block included (per block, `fk` broadcasts and
/// `fh` vector loads feed `fk · fh` FMAs: 16 filters of one row load 17 for
/// 16, 6 filters of 4 rows 10 for 24, under the two loads a cycle that keep
/// two FMA pipes busy). `fh = 1` is the one-axis block.
///
/// `taken` registers of the step go to other values ([`step_registers`]):
/// they come out of the accumulators, and a block of several image rows
/// leaves them free besides its rows' loads and the broadcast. Where
/// `whole`, only blocks that divide `h` (a group's rows: no shorter last
/// block).
fn two_axis_rows(accumulators: i64, taken: i64, k: i64, (h, whole): (i64, bool)) -> (i64, i64) {
    let registers = accumulators * 4 / 3;
    let accumulators = (accumulators - taken).max(2);
    let per_fma = |(fk, fh): (i64, i64)| {
        let (blocks, tail) = (h / fh, h % fh);
        let loads = blocks * (fk + fh) + if tail > 0 { fk + tail } else { 0 };
        loads as f64 / (fk * h) as f64
    };
    (1..=h.min(accumulators))
        .map(|fh| (block_rows(accumulators / fh, k), fh))
        .filter(|&(fk, fh)| fh == 1 || fk * fh + fh + taken < registers && (!whole || h % fh == 0))
        .min_by(|&x, &y| per_fma(x).total_cmp(&per_fma(y)))
        .expect("fh = 1")
}

/// Vector registers a register block's step over a row of `row` elements
/// in vectors of `lanes` takes besides its accumulators, its row vectors
/// and one broadcast: the product of a `@dot2` or `@dot4sat` before it is
/// added (and `@dot4sat`'s vector of ones), and, where masks are vector
/// registers (AVX2), the lane mask of a row whose last vector holds a
/// count of elements no power of two makes (loaded masked: 7 of 8 lanes),
/// where one of its `vector` loads has elements of 4 or 8 bytes (narrower
/// ones are not loaded masked: code generation's `odd_tail`).
/// MEASURED: a 4 × 3 block of a 7 × 7 map on AVX2 spilled accumulators
/// with either.
fn step_registers(p: &Program, value: TExprId, vector: &[TExprId], m: Machine, (row, lanes): (i64, i64)) -> i64 {
    let words = |&l: &TExprId| matches!(p.expr(l), TExpr::Load(t, _) if p.tensor(*t).elem.size() >= 4);
    let masked = m.masks_in_vectors && ((row % lanes) as u64).count_ones() > 1 && vector.iter().any(words);
    step_products(p, value) + i64::from(masked)
}

/// Vector registers the products in `e` hold before they are added: a
/// `@dot2`'s (1), a `@dot4sat`'s and its vector of ones (2).
fn step_products(p: &Program, e: TExprId) -> i64 {
    use texc_compiler::ops::Intrinsic;
    let own = match p.expr(e) {
        TExpr::Intrinsic(Intrinsic::Dot2, _) => 1,
        TExpr::Intrinsic(Intrinsic::Dot4Sat, _) => 2,
        _ => 0,
    };
    p.children(e).into_iter().map(|c| step_products(p, c)).max().unwrap_or(0).max(own)
}

/// Vector registers that a register block's products take beyond the
/// accumulators, the `vectors` of the panel and the broadcast:
/// [`step_products`]; and where the panel slides over a window along the
/// vector axis (`X[.., x + s]`, `s` of two taps or more, contiguous: the
/// taps' panels overlap), whose taps LLVM unrolls and whose panels it
/// loads ahead of the products, two more panels when the products are not
/// added in their instruction. MEASURED (AVX2, `@dot2`, rows of 2 vectors): an int8 3 × 3
/// convolution 64 → 64 at 56² spilled with 6 and 5 rows, 1.70 and 1.43
/// ms, not with 4, 1.41 ms; ResNet-18's layers of that shape ran 3.7 ms
/// in the model with 5 rows, 1.4 with 4; `@dot4sat`'s 3 × 3 blocks (7-bit
/// weights) 5 → 3 rows, ResNet-18's loop nests 22.8 → 21.7 ms in all.
/// Panels gathered (a window of stride 2 that [`crate::subsample`] does
/// not split into phases: a dilated one) are dear, and more rows sharing
/// them pay for the spills (ResNet's 7 × 7 stride-2 stem, measured before
/// it was split into phases: 6 rows 2.26 ms, 4 rows 2.47).
fn product_registers(p: &Program, st: &Stage, vector: &[TExprId], vectors: i64) -> i64 {
    let products = step_products(p, st.value);
    let inner = st.n_axes as u32 - 1;
    let taps = |i: TExprId| (st.n_axes..st.vars.len()).any(|r| st.vars[r].extent > 1 && uses_var(p, i, r as u32));
    let windowed = vector.iter().any(|&l| match p.expr(l) {
        TExpr::Load(_, idx) => idx.last().is_some_and(|&i| coefficient(p, i, inner) == Some(1) && taps(i)),
        _ => false,
    });
    if products > 0 && windowed {
        products + 2 * vectors
    } else {
        products
    }
}

/// The loads of a product's value, collected once for its register block.
struct ProductLoads {
    /// Every load of the value.
    all: Vec<TExprId>,
    /// Those contiguous along the innermost axis: the block's vector operands.
    vector: Vec<TExprId>,
}

impl ProductLoads {
    fn of(p: &Program, st: &Stage) -> ProductLoads {
        let inner = st.n_axes as u32 - 1;
        let mut all = Vec::new();
        loads_in(p, st.value, &mut all);
        let vector = all
            .iter()
            .copied()
            .filter(|&l| match p.expr(l) {
                // Read through its group (`X[n, y, x, k / g · Cg + c]`, a
                // grouped convolution's input stored channels last), one
                // element for a vector of a group's filters: a broadcast.
                TExpr::Load(_, idx) => {
                    idx.last().is_some_and(|&i| uses_var(p, i, inner))
                        && !matches!(through_group(p, &[l], inner), Some(Some(_)))
                }
                _ => false,
            })
            .collect();
        ProductLoads { all, vector }
    }
}

/// Whether the loads of stage `st` that move with row axis `a`, besides
/// the `vector` operands, all have `a` in their last index (`X[n, c, p]`
/// of a filters-last 1×1 convolution, `p` its map): a register block's
/// rows then share a line per step of the reduction, and its reads of the
/// operand over a slice touch as many lines as the slice is deep, not the
/// rows' bytes (`A[i, k]`, rows along the reduction, which the slices of
/// [`LongBlocking::kslice`] are sized for).
fn rows_along_lines(p: &Program, loads: &ProductLoads, a: usize) -> bool {
    let mut rows =
        loads.all.iter().copied().filter(|l| !loads.vector.contains(l) && uses_var(p, *l, a as u32)).peekable();
    rows.peek().is_some()
        && rows.all(|l| match p.expr(l) {
            TExpr::Load(_, idx) => idx.last().is_some_and(|&i| uses_var(p, i, a as u32)),
            _ => false,
        })
}

/// Whether each step of the product's one reduction moves every load of
/// its rows (the loads along `a` that are not the vector operand's) a line
/// or more through memory: an image read channels-first by a 1×1
/// convolution computed filters-last (`X[n, c, h, w]`, rows along `h·W +
/// w`), whose register block then reads a new line of it at every step —
/// unlike rows packed for the block (`W[k.b, c, k.r]`), whose steps share
/// their lines.
fn steps_across_lines(p: &Program, st: &Stage, loads: &ProductLoads, a: usize) -> bool {
    let mut long = (st.n_axes..st.vars.len()).filter(|&v| st.vars[v].extent > 1);
    let (Some(k), None) = (long.next(), long.next()) else { return false };
    let mut rows = loads.all.iter().filter(|l| !loads.vector.contains(l) && uses_var(p, **l, a as u32)).peekable();
    rows.peek().is_some()
        && rows.all(|&l| match p.expr(l) {
            TExpr::Load(t, idx) => {
                let tensor = p.tensor(*t);
                let mut stride = Some((0i64, 1i64));
                for (&i, &dim) in idx.iter().zip(&tensor.shape).rev() {
                    stride = stride
                        .and_then(|(flat, inner)| Some((flat + coefficient(p, i, k as u32)? * inner, inner * dim)));
                }
                stride.is_some_and(|(flat, _)| flat.abs() * tensor.elem.size() as i64 >= crate::strategy::LINE)
            }
            _ => false,
        })
}

/// Without a [`reuse_axis`]: a spatial axis that the vector operands read
/// only through `a / g` (a grouped convolution's input channel `k / g * g +
/// c`, `g` filters a group), and `g`. Its `g` filters of a group share every
/// vector load, as a convolution's filters do (MEASURED: RegNet-X-400MF's
/// grouped 3×3 convolutions of 16 filters a group ran at 65 GFLOP/s, rows
/// of the image each loading their own input).
fn group_axis(p: &Program, st: &Stage, loads: &[TExprId], first_row_axis: usize) -> Option<(usize, i64)> {
    (0..first_row_axis).rev().find_map(|a| {
        let ext = st.vars[a].extent;
        let g = through_group(p, loads, a as u32)?;
        g.filter(|&g| g >= 2 && g < ext && ext % g == 0).map(|g| (a, g))
    })
}

/// Whether a row of `row` elements in vectors of `lanes` takes the BLIS
/// structure: more than [`MAX_SHORT_VECTORS`] vectors, whose micro-kernel
/// is two vectors wide.
fn long_row(row: i64, lanes: i64) -> bool {
    row >= lanes && (row + lanes - 1) / lanes > MAX_SHORT_VECTORS
}

/// The micro-kernel's vectors along the stage's row, at most `knob` (the
/// `nvec` knob; two by default):
/// where a broadcast operand reads the row through its group (a grouped
/// convolution computed filters-last, `X[n, k / g · Cg + c, ..]`), as many
/// as divide a group's `g` filters, so that each vector of filters lies in
/// one group and broadcasts one input element (vectors across groups would
/// gather it: RegNetX-400MF's 160 filters in groups of 16 at 14², two
/// vectors of 16, ran at 3 % of the peak) — a whole group where it is
/// [`MAX_GROUP_VECTORS`] vectors or fewer, so that each broadcast feeds all
/// of its vectors (groups of 24 on AVX2: blocks of 4 rows × 3 vectors, 12
/// multiply-adds per 7 loads, where 7 rows × 1 vector took 8 loads for 7
/// and left FMA latency unhidden; RegNetX-1.6GF's 408 channels at 14², Zen
/// 3, 1 thread: 0.48–0.53 → 0.40–0.45 ms a layer, 66–72 → 78–87 % of the
/// peak). An explicit knob is taken as the most, as elsewhere.
fn within_group(p: &Program, st: &Stage, loads: &ProductLoads, lanes: i64, knob: Option<i64>) -> i64 {
    let broadcasts: Vec<TExprId> = loads.all.iter().copied().filter(|l| !loads.vector.contains(l)).collect();
    let vectors = knob.unwrap_or(2);
    match through_group(p, &broadcasts, st.n_axes as u32 - 1) {
        Some(Some(g)) if g % lanes == 0 => {
            let group = g / lanes;
            if knob.is_none() && group <= MAX_GROUP_VECTORS {
                group
            } else {
                (1..=vectors).rev().find(|&v| group % v == 0).unwrap_or(1)
            }
        }
        _ => vectors,
    }
}

/// How expressions `es` read variable `v`: not at all (`Some(None)`), only
/// as `v / g` for one constant `g` (`Some(Some(g))`), or otherwise (`None`).
pub(crate) fn through_group(p: &Program, es: &[TExprId], v: u32) -> Option<Option<i64>> {
    let mut g = None;
    for &e in es {
        let here = match p.expr(e) {
            TExpr::Var(x) if *x == v => return None,
            TExpr::Binary(texc_compiler::ops::BinOp::FloorDiv, n, d) if matches!(p.expr(*n), TExpr::Var(x) if *x == v) => {
                match p.expr(*d) {
                    TExpr::Int(k) => Some(*k),
                    _ => return None,
                }
            }
            _ => through_group(p, &p.children(e), v)?,
        };
        match (g, here) {
            (Some(a), Some(b)) if a != b => return None,
            (None, h) => g = h,
            _ => {}
        }
    }
    Some(g)
}

/// The most vectors of one group's filters a micro-kernel takes whole.
const MAX_GROUP_VECTORS: i64 = 3;

/// The cache blocking of long products (BLIS's, with the operands' roles
/// as texc's loops have them: for one slice of the reduction, a register
/// block of rows of A walks the packed panels of a block of B's columns):
/// the deepest slice `kmax` and the widest column block `max_cols` the
/// caches allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LongBlocking {
    kmax: i64,
    max_cols: i64,
    cores: i64,
    l1d: i64,
    l2: i64,
    elem: i64,
}

/// A reduction `depth` deep cut into the fewest slices no deeper than
/// `deepest`, of equal depth rounded up to 8 (the last takes what is left).
fn equal_slices(depth: i64, deepest: i64) -> i64 {
    ceil_div(ceil_div(depth, ceil_div(depth, deepest)), 8) * 8
}

/// The shallowest slice [`LongBlocking::whole_rows_slice`] takes: rows too
/// many for a slice this deep beside a panel are blocked as a GEMM's.
const MIN_WHOLE_ROWS_SLICE: i64 = 64;

/// Whether a register block of `rows` rows over panels `width` wide, its
/// rows read along their operand's lines, reads more than
/// [`L2_BYTES_PER_LANE`] from L2 per lane of its FMAs in a step of an
/// unsliced reduction: a line of the rows' operand (the rows of a step lie
/// in one: up to 16 floats; wider rows read more and are undercounted) and
/// the panel's step, neither of which L1 keeps across a long
/// reduction. Such a step waits on L2, and slices that keep the rows in L1
/// ([`LongBlocking::whole_rows_slice`]) pay for their extra passes over the
/// accumulators; a block with more FMAs per step hides L2 by itself, and
/// the slices' passes (a zeroing nest, the accumulators read and written
/// once a slice, a parallel region a slice where the row blocks are the
/// parallel loop) are only cost. AVX2's blocks of 5 or 6 rows × 16 lanes
/// read 1.3–1.6 bytes a lane, AVX-512's of 6 rows or more × 32 at most 1.0.
/// MEASURED (Zen 4, 1 MiB L2, 1 thread, alternated rounds, `x86-avx2`
/// sliced → unsliced): ResNet-50's 1×1 2048 → 512 at 7² 0.98 → 1.17 ms,
/// 440 → 440 0.18 → 0.22, 960 → 160 0.14 → 0.17; on `host` (AVX-512,
/// 7 rows) 0.95 → 0.90, 0.176 → 0.173, 0.132 → 0.131 at one thread, and at
/// two 0.48 → 0.45, 0.104 → 0.098, 0.085 → 0.070; MobileNetV2's 144 → 32
/// at 28² (8 rows, the parallel loop inside the slices) 0.045 → 0.035.
fn step_outruns_l2((rows, width): (i64, i64), elem: i64) -> bool {
    crate::strategy::LINE + width * elem > L2_BYTES_PER_LANE * rows * width
}

/// See [`step_outruns_l2`]: set between the two ISAs' blocks measured.
const L2_BYTES_PER_LANE: i64 = 1;

/// Columns of the narrowest block of packed panels a default schedule takes.
const MIN_COLS: i64 = 128;

/// Column blocks each core should have: the blocks are the parallel loop,
/// and with fewer, one core's last block is another's wait (two cores: 8
/// blocks, hence 256 columns from rows of 2048 on).
const COL_BLOCKS_PER_CORE: i64 = 4;

/// A reduction no deeper than `kmax` is still cut in two slices of half
/// that where those are at least this deep and the row has panels enough
/// for two column blocks (products of 257 to 512 floats keep the slices of
/// 256 they were measured with).
const MIN_HALF_SLICE: i64 = 256;

impl LongBlocking {
    /// The blocking for elements of `elem` bytes on `m`'s caches and cores:
    ///
    /// - a slice is as deep as lets a micro-kernel's rows of A for it (sized
    ///   for [`SLICE_ROWS`], an 8-way L1's; a 12-way one's 12 rows of the
    ///   same slice fill the same half of its 48 KiB) fill half of
    ///   L1, the other half left to the panel of B streaming past them —
    ///   8 × 512 floats = 16 KiB on a 32 KiB L1. Deeper slices pay for the
    ///   accumulators of the whole output, read and written once per slice
    ///   (from L3 when the output is large), less often: on the nominal Zen 4
    ///   with AVX2, 1 thread, SGEMM 2048³ ran 168 ms with slices of 256 and
    ///   163 with 512, 1024³ 20.3 and 19.5 ms (`texc bench
    ///   benches/matmul.tex --knob kslice=256|512`);
    /// - a block of packed panels (slice × columns) fills at most half of
    ///   L2, the rest left to the rows of A and the output streaming
    ///   through: 512 × 256 floats = 512 KiB of a 1 MiB L2. Wider blocks
    ///   read each row block of A (from L3) once for more panels (SGEMM
    ///   2048³ on AVX2: 96 → 100 GFLOP/s from 128 to 256 columns). On an L2
    ///   too small for a slice of `kmax` by [`MIN_COLS`], the slice shrinks
    ///   instead (never below 64).
    pub(super) fn of(m: Machine, elem: i64) -> LongBlocking {
        let c = m.caches;
        let by_l1 = c.l1d / 2 / (SLICE_ROWS * elem);
        let by_l2 = c.l2 / 2 / (MIN_COLS * elem);
        let kmax = floor_pow2(by_l1.min(by_l2).max(64));
        let max_cols = floor_pow2((c.l2 / 2 / (kmax * elem)).max(MIN_COLS));
        LongBlocking { kmax, max_cols, cores: c.cores.max(1), l1d: c.l1d, l2: c.l2, elem }
    }

    /// Slices of a reduction `depth` deep over a row of `panels` panels
    /// `width` wide: `kmax` where it is deeper, else two of half that (at
    /// least [`MIN_HALF_SLICE`]: a reduction that deep is one slice) — but
    /// one slice where the row has fewer panels than two of the narrowest
    /// column blocks: the slices then pack no block of panels, so halves
    /// would only write and re-read the accumulators, in a zeroing nest,
    /// two parallel loops and an epilogue nest of their own (MEASURED,
    /// x86-avx2, 1 thread, RegNetX-400MF, whose last stage is 24 products
    /// 400 deep over 49 columns: its nests summed 12.8 → 11.4 ms). The
    /// packed block of 512 × 256 floats lives on the heap
    /// (`LoopFunc::heap_locals`).
    pub(super) fn kslice(self, depth: i64, panels: i64, width: i64) -> i64 {
        if depth > self.kmax || panels < 2 * (MIN_COLS / width.max(1)).max(1) {
            self.kmax
        } else {
            (self.kmax / 2).max(MIN_HALF_SLICE)
        }
    }

    /// The slice of a reduction `depth` deep over `rows` rows in all (the
    /// rows of A) and panels `width` wide, where a slice of every row fits
    /// in L1 beside one panel, at least [`MIN_WHOLE_ROWS_SLICE`] deep and
    /// shallower than the reduction: its panels then run outside its row
    /// blocks, each panel read once from L2 while A's slice stays in L1
    /// (without slices a row block's lines of A, read a reduction step
    /// apart, fill L1 by themselves: each row block reads the whole of A
    /// from L2 again). Cut into slices of equal depth, rounded up to 8.
    /// MEASURED (Zen 3, AVX2, 32 KiB L1d, 1 thread, 1×1 convolutions on a
    /// 7 × 7 map, filters-last, rows of 49 and panels of 16): 2048 → 512
    /// 1.54 ms in one slice of 512, 1.33 / 1.27 / 1.21 / 1.44 in slices of
    /// 64 / 96 / 128 / 160 (the last beyond L1); 440 → 440 0.31, 0.25–0.26
    /// from 64 to 128; ONNX Runtime 1.16 and 0.23.
    ///
    /// The whole reduction (`depth`: one slice, the panels still outside
    /// the row blocks) where a register block of `block_rows` rows does not
    /// wait on L2 ([`step_outruns_l2`]) and the rows and a panel over the
    /// whole reduction fit L2 (beyond it each panel would read the rows
    /// from L3).
    pub(super) fn whole_rows_slice(self, (rows, block_rows, width): (i64, i64, i64), depth: i64) -> Option<i64> {
        let deepest = self.whole_rows_deepest(rows, width)?;
        if depth <= deepest {
            return None;
        }
        let per_step = (rows + width) * self.elem;
        if !step_outruns_l2((block_rows, width), self.elem) && per_step * depth <= self.l2 {
            return Some(depth);
        }
        Some(equal_slices(depth, deepest))
    }

    /// The deepest slice of all `rows` rows that fits L1 beside a panel
    /// `width` wide, where it is at least [`MIN_WHOLE_ROWS_SLICE`] deep: the
    /// rows are few enough for [`Self::whole_rows_slice`].
    fn whole_rows_deepest(self, rows: i64, width: i64) -> Option<i64> {
        let deepest = self.l1d / ((rows + width) * self.elem).max(1);
        (deepest >= MIN_WHOLE_ROWS_SLICE).then_some(deepest)
    }

    /// The slice of a reduction `depth` deep whose `rows`, read along their
    /// operand's lines a line apart at each step ([`steps_across_lines`]),
    /// are too many for [`Self::whole_rows_slice`] (a 1×1 convolution's 14²
    /// or 28² map computed filters-last, the image channels-first): where a
    /// register block of `block_rows` rows waits on L2 in each step
    /// ([`step_outruns_l2`]: AVX2's blocks), a slice whose lines of the
    /// block's rows fill a quarter of L1 (128 on 32 KiB), so that they stay
    /// there while the block walks the panels of its column block, which
    /// then alone stream from L2 (a slice of 512 filled L1 with the rows'
    /// lines, and every panel read them from L2 again). Cut into slices of
    /// equal depth, rounded up to 8; `None` where the reduction is no
    /// deeper than two such slices, or the row has fewer `panels` than the
    /// narrowest column block ([`MIN_COLS`]): each slice's pass over the
    /// accumulators, and the nest zeroing them, then cost more than the
    /// reads of the rows' lines it saves.
    /// MEASURED (Zen 3, AVX2, 32 KiB L1d and 512 KiB L2, 1 thread; `.loops`
    /// copies of such products, panels of 16 in blocks of 8, five
    /// alternated rounds of 60–100, ms, the slices' depth in brackets):
    /// 1024 → 512 at 14² 2.32–2.71 [512], 2.30–2.45 [256], 2.15–2.27 [128];
    /// 512 → 512 at 14² 1.17–1.28 [512], 1.08–1.17 [128]; 512 → 256 at 28²
    /// 2.39–2.64 [512], 2.23–2.43 [128]; 512 → 512 at 28² 4.96–5.18 [512],
    /// 4.66–4.82 [128]; 1024 → 256 at 56² 24.8–26.2 [512], 20.1–22.2 [128];
    /// 768 → 128 at 17² 0.68–0.69 [768], 0.60–0.73 [128] (minima 0.66 and
    /// 0.58–0.59), 0.60–0.62 [96]; but 256 → 1024 at
    /// 14² 1.08–1.15 in one slice, 1.10–1.38 in two, and 288 → 64 at 35²
    /// (four panels) 0.47–0.52 [288], 0.49–0.57 [96].
    pub(super) fn row_block_slice(
        self,
        (rows, block_rows, width): (i64, i64, i64),
        depth: i64,
        panels: i64,
    ) -> Option<i64> {
        let few_rows = self.whole_rows_deepest(rows, width).is_some();
        let few_panels = panels * width < MIN_COLS;
        if few_rows || few_panels || !step_outruns_l2((block_rows, width), self.elem) {
            return None;
        }
        let deepest = (self.l1d / 4 / crate::strategy::LINE).max(MIN_WHOLE_ROWS_SLICE);
        (depth > 2 * deepest).then(|| equal_slices(depth, deepest))
    }

    /// Columns of a block of packed panels for rows `row` long: the widest
    /// power of two from [`MIN_COLS`] to `max_cols` that leaves every core
    /// [`COL_BLOCKS_PER_CORE`] blocks and that `fits` (a block packed whole
    /// must fit the stack).
    pub(super) fn cols(self, row: i64, fits: impl Fn(i64) -> bool) -> i64 {
        let mut cols = MIN_COLS;
        while cols * 2 <= self.max_cols && row / (cols * 2) >= COL_BLOCKS_PER_CORE * self.cores && fits(cols * 2) {
            cols *= 2;
        }
        cols
    }
}

/// The largest power of two not above `n` (1 for `n` < 2).
fn floor_pow2(n: i64) -> i64 {
    if n < 2 {
        1
    } else {
        1 << (63 - n.leading_zeros())
    }
}

/// The `unroll` knob: the innermost reduction loop of a register block
/// (just outside its unrolled rows) unrolled by `by` iterations, where it
/// has at least two such groups.
fn unroll_reduction(ss: &mut StageSchedule, by: Option<i64>) {
    let span = Span::default();
    let Some(by) = by.filter(|&u| u >= 2) else { return };
    // Past a window's tap unrolled innermost (`window_tap`): its `s`.
    let innermost = |l: &&usize| ss.ivs[**l].reduce && ss.ivs[**l].kind == ForKind::Serial;
    let Some(&k) = ss.leaves.iter().rev().find(innermost) else { return };
    if ss.ivs[k].extent < 2 * by {
        return;
    }
    let name = ss.ivs[k].name.clone();
    let (_, u) = ss.split(k, by, (&format!("{name}.uo"), span), (&format!("{name}.u"), span), span).expect("fresh");
    ss.annotate(u, ForKind::Unrolled, span).expect("serial leaf");
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

/// Accumulator vectors of a block whose rows share their loads of a short
/// row of `vectors` (up to [`super::vectorize::MAX_SHORT_VECTORS`]): a
/// step holds the row's vectors, a broadcast and the `taken` registers of
/// [`step_registers`] beside the accumulators, as the micro-kernel's does;
/// two rows at least. AVX2's rows of four vectors (25 to 32 elements: a 28²
/// map's rows) lose a row, 2 × 4 and not 3 × 4, which spilled; so do rows
/// of three whose last vector is masked (19, 21, 22 or 23 elements),
/// 3 × 3 and not 4 × 3. AVX-512's 32 registers hold 24 accumulators beside
/// any short row. MEASURED (Zen 3, 1 thread, RegNetY-1.6GF's grouped 3 × 3
/// convolution, 120 channels in groups of 24 at 28², `rows` knob, four
/// alternated rounds of 200): 3 rows 0.60–0.64 ms with accumulators spilled
/// in the unrolled taps, 2 rows 0.56–0.59.
fn short_row_accumulators(m: Machine, vectors: i64, taken: i64) -> i64 {
    m.accumulators.min(m.registers - vectors - 1 - taken).max(2 * vectors)
}

/// Accumulator vectors of a block whose rows share a window's loads
/// ([`window_tap`]): half the vector registers (16 of AVX-512's 32, 8 of
/// AVX2's 16), the rest holding the input rows the unrolled taps and rows
/// read and the taps' weights. MEASURED (Zen 4, 1 thread, rows of a block
/// set by the `rows` knob): the best blocks held 8–16 accumulators on
/// AVX-512 and 8–10 on AVX2, and 20–24 spilled (a 3 × 3 depthwise
/// convolution over 144 channels at 56², `host`: 4 rows of 4 vectors
/// 0.111 ms, 6 rows 0.147; a 7 × 7 one over 96 channels at 56², `x86-avx2`,
/// rows of two vectors: 4 rows 0.321 ms, 6 rows 0.348).
fn window_accumulators(m: Machine) -> i64 {
    m.accumulators * 2 / 3
}

/// See [`block_accumulators`]: AVX2's count (3/4 of its 16 registers).
const UNSHARED_ACCUMULATORS: i64 = 12;

/// Rows of A that a BLIS-style micro-kernel may read at once without
/// evicting one another from L1 where they fall in one set (rows a power
/// of two apart, SGEMM's; [`rows_within_sets`] counts them): a set holds
/// as many lines as L1 has ways. An x86 L1 data cache is indexed within the page (64 sets
/// of 64-byte lines: 4 KiB a way), so its ways are its size over 4 KiB: 8
/// at 32 KiB (Zen 2–4, Skylake), 12 at 48 KiB (Intel since Ice Lake, Zen 5).
fn l1_ways(c: CpuCaches) -> i64 {
    (c.l1d / L1_WAY_BYTES).max(2)
}

/// The stage's axis that index `a` of its schedule steps along one by one:
/// itself, or the axis whose split's inner part it is (a group's filters
/// split off by [`split_groups`]); `None` for an outer part or a fusion.
fn root_axis(ss: &StageSchedule, mut a: usize) -> Option<usize> {
    loop {
        match ss.ivs[a].rel {
            crate::schedule::Rel::Root(v) => return Some(v),
            crate::schedule::Rel::Split { parent, outer: false, .. } => a = parent,
            _ => return None,
        }
    }
}

/// [`broadcast_pitches`] of a product along its axis `a`.
pub(super) fn row_pitches(p: &Program, st: &Stage, a: usize) -> Vec<i64> {
    broadcast_pitches(p, &ProductLoads::of(p, st), a)
}

/// Bytes from one row `a` (an axis of the stage) to the next of each
/// operand a product broadcasts from (a load that moves with `a`, not a
/// vector operand): a GEMM's rows of A, `K` elements apart. A load whose
/// step along `a` is not a constant is left out.
fn broadcast_pitches(p: &Program, loads: &ProductLoads, a: usize) -> Vec<i64> {
    let pitch = |&l: &TExprId| {
        let TExpr::Load(t, idx) = p.expr(l) else { return None };
        let along = crate::analysis::flat_coefficient(p, *t, idx, a as texc_compiler::tir::VarId)?;
        (along != 0).then(|| along.checked_abs()?.checked_mul(p.tensor(*t).elem.size() as i64)).flatten()
    };
    loads.all.iter().filter(|l| !loads.vector.contains(l)).filter_map(pitch).collect()
}

/// The rows of a BLIS-style micro-kernel, at most `max`: as many as keep
/// the lines of its broadcast operands' rows (`pitches` bytes apart, one
/// line a row and operand at every step of the reduction) within the ways
/// of each set of L1, wherever the block starts within a line. The rows
/// may fill a set's ways: the packed panel streams through the sets, and
/// rows of A that fill them ran faster than fewer (SGEMM 1024³, rows 4 KiB
/// apart: 8 rows against 6, [`default_rows`]). AVX-512's 12 rows of two
/// vectors 12 KiB apart (ViT's 3072-deep product: 197 rows, no divisor to
/// fall back on) all fall in one set of an 8-way L1, and every broadcast
/// missed it; rows 3 KiB apart (its 768-deep products) put three in a set,
/// and keep their 12. MEASURED (Zen 4, `host`, 1 thread, `bench
/// --profile`, two alternated rounds): ViT-B/16's twelve 3072-deep
/// products 108.4–108.9 → 99.2–99.8 ms as blocks of 8 rows. (A cap at the
/// ways for every block slowed Wide ResNet-50 and ResNet-101 by 3 %: rows
/// that do not meet keep their 12.)
fn rows_within_sets(max: i64, pitches: &[i64], c: CpuCaches) -> i64 {
    let ways = l1_ways(c);
    (1..=max).rev().find(|&rows| lines_in_one_set(rows, pitches) <= ways).unwrap_or(max.min(1))
}

/// The most lines that `rows` rows of each operand, `pitches` bytes apart,
/// put in one set of an x86 L1 (indexed within a way of [`L1_WAY_BYTES`]),
/// over the block's first row at every 4-byte offset within a line (the
/// operands' rows counted together, as if their first rows shared that
/// offset's set).
fn lines_in_one_set(rows: i64, pitches: &[i64]) -> i64 {
    let (line, sets) = (crate::strategy::LINE, L1_WAY_BYTES / crate::strategy::LINE);
    let at_offset = |start: i64| {
        let mut count = std::collections::BTreeMap::<i64, i64>::new();
        for &pitch in pitches {
            let lines: std::collections::BTreeSet<i64> =
                (0..rows).filter_map(|r| Some(r.checked_mul(pitch)?.checked_add(start)? / line)).collect();
            for l in lines {
                *count.entry(l.rem_euclid(sets)).or_default() += 1;
            }
        }
        count.into_values().max().unwrap_or(0)
    };
    (0..line).step_by(4).map(at_offset).max().unwrap_or(0)
}

/// Bytes of one way of an x86 L1 data cache (see [`l1_ways`]).
const L1_WAY_BYTES: i64 = 4096;

/// Rows of A a slice of the reduction is sized for (see [`LongBlocking::of`]):
/// those of an 8-way L1. A 12-way one's 12 rows of a slice of 512 floats
/// fill half of its 48 KiB as 8 rows do of 32 KiB.
const SLICE_ROWS: i64 = 8;

/// Rows per register block when no knob sets them. A BLIS-style micro-kernel
/// (`long`: with the L1's ways) takes all `max` rows when they stay within
/// those ways (but see [`rows_without_lone_last`]): its block loop encloses
/// the reductions, so a last, shorter block is a partitioned copy of the
/// loops, not a guard. (SGEMM 1024³ on AVX2: 6 rows and a tail of 4, 106
/// GFLOP/s; 4 rows dividing 1024, 100 GFLOP/s; 32 filters of a 1 × 1
/// convolution as 6 + 2 rows 0.117 ms, as 4 + 4 0.132. On the nominal Zen
/// 4's 8-way L1 with AVX-512, 12 rows ran at 96 GFLOP/s and 8 at 107.)
/// Blocks of more than [`SHORT_LAST_FROM`] rows leave a last block of under
/// half as many, after fewer than eight full ones, to [`block_rows`].
/// MEASURED on a 12-way L1 (Intel Xeon, AVX-512, 1 thread, `host`), 12
/// rows against 8 (7 for 196): 1 × 1 convolutions 256 → 1024 at 14² 0.63
/// → 0.59 ms, 1024 → 256 0.60 → 0.55, 1024 → 512 1.21 → 1.12, 256 → 32 at
/// 27² 0.075 → 0.070; products 196 × 1024 × 512 1.03 → 0.99 ms, 1024³ 11.2
/// → 10.9; as 5 × 12 + 4 rows, 64 filters 256 → 64 at 56² 0.60 → 0.66
/// (kept at 8).
fn default_rows(max: i64, extent: i64, l1_ways: Option<i64>, vectors: i64) -> i64 {
    let short_last = max > SHORT_LAST_FROM && extent % max != 0 && 2 * (extent % max) < max && extent / max < 8;
    match l1_ways {
        Some(ways) if max <= ways && !short_last => rows_without_lone_last(max.min(extent), extent, vectors),
        _ => block_rows(max, extent),
    }
}

/// Whether a product's register blocks take fewer steps ([`block_cycles`],
/// with the rows [`default_rows`] picks either way, rows of the
/// micro-kernel's two vectors) over `h · w` rows as one axis than over `h`
/// image rows of `w` ([`crate::merge_rows`]), at most the rows
/// [`rows_within_sets`] leaves the block for its broadcast operands' rows
/// `pitches` bytes apart ([`row_pitches`]: the same merged or not). AVX2's rows of 14 (5 + 5 + 4, 17 steps)
/// against 196 (32 × 6 + 4, 229 for 238) merge; AVX-512's blocks of 7
/// divide 14 and 196 alike (224 either way), and stay.
pub(super) fn merged_rows_pay(m: Machine, (h, w): (i64, i64), pitches: &[i64]) -> bool {
    let vectors = m.knobs.nvec.unwrap_or(2).max(1);
    let max = rows_within_sets(block_accumulators(m, true) / vectors, pitches, m.caches);
    let ways = Some(l1_ways(m.caches));
    let steps = |extent: i64| block_cycles(default_rows(max, extent, ways, vectors).max(1), extent, vectors);
    steps(h * w) < h * steps(w)
}

/// FMAs in flight that keep an x86 core's two FMA pipes busy: four cycles
/// of latency on Skylake and later and on Zen 3 and 4 (Haswell, Broadwell
/// and Zen 1 and 2 take five, ten in flight: the lower bound of the two).
/// A block of fewer accumulators waits on them.
const FMAS_IN_FLIGHT: i64 = 8;

/// `rows` a block, unless that leaves a last block of one row or a few
/// whose `vectors` accumulators keep a fraction of [`FMAS_IN_FLIGHT`] busy
/// (a Winograd product's 7 rows as 6 + 1 on AVX2, a 7 × 7 map's 49 as 8 × 6
/// + 1; a 14 × 14 map's rows of 14 as 6 + 6 + 2). Then the rows whose blocks take the fewest [`block_cycles`], where
/// they save at least [`LONE_ROW_SAVING`] of the steps; on a tie the
/// larger block, so a lone row stays where no other rows are cheaper
/// (every block as latency-bound as it, or `rows` already the cheapest).
/// Among many blocks the lone row is a small share, and larger blocks load
/// fewer panels a row (SGEMM 1024³ on AVX2: 6 rows and a tail of 4 ahead
/// of 4 dividing it, above). MEASURED (Zen 4, `x86-avx2`, 1 thread, 3
/// alternated rounds): a 7 × 256 × 256 product as 4 + 3 rows 9.3 µs
/// against 10.8 as 6 + 1; a 3 × 3 convolution 256 → 256 at 14²'s Winograd
/// product 1.32–1.39 ms against 1.51–1.66. (Zen 3, `host`, the lowest
/// median of 5 alternated rounds, 1 / 2 threads: 1 × 1 convolutions on 7
/// × 7 maps computed filters-last as 9 × 5 + 4 rows against 8 × 6 + 1:
/// 160 → 1280 0.259 → 0.243 / 0.175 → 0.170 ms, 512 → 2048 with its
/// residual 1.45 → 1.38 / 0.84 → 0.76, 320 → 1280 0.498 → 0.475, 160 →
/// 960 0.192 → 0.183, 440 → 440 with its residual 0.262 → 0.253.)
/// Tails of two or three rows of two vectors (Zen 4, `x86-avx2`, 1 thread,
/// two alternated rounds): a product 14 × 14 × 384 → 1536, ConvNeXt-T's
/// over rows of 14 tokens, as 5 + 5 + 4 rows 3.02 / 2.98 ms against 3.14 /
/// 3.16 as 6 + 6 + 2; the whole model 103.2 / 104.4 → 99.5 / 101.6 ms.
fn rows_without_lone_last(rows: i64, extent: i64, vectors: i64) -> i64 {
    let tail = if rows > 0 { extent % rows } else { 0 };
    if rows < 2 || extent <= rows || tail == 0 || tail * vectors >= FMAS_IN_FLIGHT {
        return rows;
    }
    let as_given = block_cycles(rows, extent, vectors);
    let best = (2..=rows).rev().min_by_key(|&r| block_cycles(r, extent, vectors)).unwrap_or(rows);
    let saved = as_given - block_cycles(best, extent, vectors);
    if saved * LONE_ROW_SAVING >= as_given {
        best
    } else {
        rows
    }
}

/// The share of a product's steps (1 / this) that smaller blocks must save
/// to be taken over a short last block: below it, what [`block_cycles`]
/// does not count (the slices' tails, the blocks' loop overhead) outweighs
/// it. A 7 × 7 map's 49 rows as 9 × 5 + 4 save 2 steps in 61 (MEASURED
/// faster above), 55 as 11 × 5 2 in 68; AVX-512's 12 × 8 + 1 rows keep
/// their blocks (3 in 109), as 6 × 7 + 1 do (1 in 54).
const LONE_ROW_SAVING: i64 = 36;

/// Steps of `extent` rows in blocks of `r`, a block's step counted as its
/// rows or the rows that hold [`FMAS_IN_FLIGHT`] accumulators of `vectors`
/// vectors, whichever is more, plus one for loading its panel's vectors
/// (which more blocks load more often: 32 filters of a 1 × 1 convolution on
/// AVX2 ran as 6 × 5 + 2 rows in 0.117 ms, as 8 × 4 in 0.132).
fn block_cycles(r: i64, extent: i64, vectors: i64) -> i64 {
    let latency_rows = (FMAS_IN_FLIGHT + vectors - 1) / vectors.max(1);
    let tail = extent % r;
    let blocks = (extent + r - 1) / r;
    (extent / r) * r.max(latency_rows) + if tail > 0 { tail.max(latency_rows) } else { 0 } + blocks
}

/// See [`default_rows`]: AVX2's blocks (6 rows of 2 vectors) take a short
/// last block, AVX-512's of 12 not.
const SHORT_LAST_FROM: i64 = 8;

/// Rows per register block: at most `max`, preferring a divisor of the
/// extent of at least `max / 3` (a partial block would need a guard in the
/// innermost loop, where the accumulators live: 15 rows of at most 12 are
/// blocks of 5, not 12 and a tail of 3); without one, blocks as even as
/// `max` allows, so that the last is not a row or two that load the block's
/// whole panel for a few accumulators (13 rows of at most 12: 7 and 6, not
/// 12 and 1 — SqueezeNet's 3×3 convolutions on 13×13 computed filters-last,
/// 64 → 256 filters on AVX-512: 0.48 → 0.29 ms).
fn block_rows(max: i64, extent: i64) -> i64 {
    let max = max.min(extent);
    let even = if max > 0 {
        let blocks = (extent + max - 1) / max;
        (extent + blocks - 1) / blocks
    } else {
        max
    };
    ((max / 3).max(2)..=max).rev().find(|f| extent % f == 0).unwrap_or(even)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine of `lanes` lanes whose vector registers are `accumulators`
    /// and a third more (AVX2's 12 of 16, AVX-512's 24 of 32).
    fn machine(lanes: i64, accumulators: i64, caches: CpuCaches) -> Machine {
        Machine {
            lanes,
            accumulators,
            registers: accumulators * 4 / 3,
            half_lanes: None,
            caches,
            knobs: Default::default(),
            masks_in_vectors: false,
        }
    }

    fn blocking(caches: CpuCaches, elem: i64) -> LongBlocking {
        LongBlocking::of(machine(16, 24, caches), elem)
    }

    fn caches(l1d_k: i64, l2_k: i64, cores: i64) -> CpuCaches {
        CpuCaches { l1d: l1d_k << 10, l2: l2_k << 10, cores, ..CpuCaches::NOMINAL }
    }

    /// A register block's rows stay within the L1's ways (its size over
    /// 4 KiB); beyond 8 rows, not with a short last block among few.
    #[test]
    fn long_blocks_take_the_rows_the_l1_ways_hold() {
        assert_eq!(l1_ways(caches(32, 1024, 2)), 8);
        assert_eq!(l1_ways(caches(48, 2048, 2)), 12);
        assert_eq!(default_rows(12, 1024, Some(12), 2), 12);
        assert_eq!(default_rows(12, 100, Some(12), 2), 12, "8 blocks of 12 and one of 4");
        assert_eq!(default_rows(12, 1024, Some(8), 2), 8, "a divisor within 8 ways");
        assert_eq!(default_rows(12, 64, Some(12), 2), 8, "not 5 blocks of 12 and one of 4");
        assert_eq!(default_rows(12, 7, Some(12), 2), 7);
        assert_eq!(default_rows(6, 32, Some(8), 2), 6, "AVX2 keeps its last block of 2");
        assert_eq!(default_rows(6, 1024, Some(8), 2), 6, "and of 4");
        assert_eq!(default_rows(12, 1024, None, 2), 8, "not a BLIS block");
    }

    /// A micro-kernel's rows of A stay within the L1's ways where they
    /// meet in one set: 12 rows 12 KiB apart are 8 on an 8-way L1, 3 KiB
    /// apart (three a set) stay 12; rows in one line are one line.
    #[test]
    fn micro_kernel_rows_stay_within_the_ways_of_a_set() {
        assert_eq!(lines_in_one_set(12, &[12 << 10]), 12);
        assert_eq!(lines_in_one_set(12, &[3 << 10]), 3);
        assert_eq!(lines_in_one_set(12, &[4]), 1, "twelve floats: two lines at most, two sets");
        assert_eq!(lines_in_one_set(12, &[788]), 1, "197 floats apart: a set each, at any offset");
        assert_eq!(lines_in_one_set(12, &[3 << 10, 8 << 10]), 15, "the operands' lines together");
        let (eight, twelve) = (caches(32, 1024, 2), caches(48, 2048, 2));
        assert_eq!(rows_within_sets(12, &[12 << 10], eight), 8);
        assert_eq!(rows_within_sets(12, &[12 << 10], twelve), 12);
        assert_eq!(rows_within_sets(12, &[3 << 10], eight), 12);
        assert_eq!(rows_within_sets(12, &[3 << 10, 8 << 10], eight), 6, "2 + 6 lines in one set");
        assert_eq!(rows_within_sets(12, &[], eight), 12, "nothing broadcast along the rows");
        assert_eq!(rows_within_sets(6, &[4 << 10], eight), 6, "AVX2's 6 rows fit");
        // Rows 8 KiB apart on AVX-512: blocks of 8 over a 14 × 14 map merge
        // (24 × 8 + 4 rows, 221 steps, against 14 × 16), as the block takes them.
        let avx512 = machine(16, 24, eight);
        assert!(merged_rows_pay(avx512, (14, 14), &[8 << 10]) && !merged_rows_pay(avx512, (14, 14), &[]));
    }

    /// Image rows of 14 or 7 merge into one axis of rows where AVX2's
    /// blocks of 6 leave each image row a short block, not where AVX-512's
    /// of 7 divide them.
    #[test]
    fn short_image_rows_merge_where_their_blocks_end_short() {
        let (avx2, avx512) = (machine(8, 12, caches(32, 1024, 2)), machine(16, 24, caches(32, 1024, 2)));
        assert!(merged_rows_pay(avx2, (14, 14), &[]), "196 rows: 229 steps, 14 × 17");
        assert!(merged_rows_pay(avx2, (7, 7), &[]), "49 rows: 59 steps, 7 × 10");
        assert!(!merged_rows_pay(avx2, (4, 12), &[]), "rows of 12: two blocks of 6 each");
        assert!(!merged_rows_pay(avx512, (14, 14), &[]), "blocks of 7 either way");
        assert!(!merged_rows_pay(avx512, (7, 7), &[]));
    }

    /// A last block of one row among few is spread over the others.
    #[test]
    fn a_last_block_is_not_one_row() {
        assert_eq!(default_rows(6, 7, Some(8), 2), 4, "4 + 3, not 6 + 1");
        assert_eq!(default_rows(6, 13, Some(8), 2), 5, "5 + 5 + 3, not 6 + 6 + 1");
        assert_eq!(default_rows(6, 25, Some(8), 2), 5, "5 × 5, not 4 × 6 + 1");
        assert_eq!(default_rows(4, 9, Some(8), 3), 3, "three vectors: 3 × 3, not 4 + 4 + 1");
        for (max, extent, vectors) in [(6, 7, 2), (6, 13, 2), (5, 11, 2), (4, 9, 3), (6, 25, 2)] {
            let r = default_rows(max, extent, Some(8), vectors);
            assert!((2..=max).contains(&r) && extent % r != 1, "{max} {extent} {vectors}: {r}");
        }
        assert_eq!(default_rows(6, 49, Some(8), 2), 5, "a 7 × 7 map: 9 × 5 + 4, not 8 × 6 + 1");
        assert_eq!(default_rows(6, 55, Some(8), 2), 5, "11 × 5, not 9 × 6 + 1");
        assert_eq!(default_rows(6, 14, Some(8), 2), 5, "5 + 5 + 4, not 6 + 6 + 2");
        assert_eq!(default_rows(6, 15, Some(8), 2), 5, "5 × 3, not 6 + 6 + 3");
        assert_eq!(default_rows(6, 28, Some(8), 2), 6, "6 × 4 + 4: a tail of 8 accumulators");
        // Left alone: many blocks, no lone row, or no cheaper rows.
        assert_eq!(default_rows(6, 1009, Some(8), 2), 6, "a saving of 3 steps in 1012");
        assert_eq!(default_rows(6, 67, Some(8), 2), 6, "2 in 70");
        assert_eq!(default_rows(6, 43, Some(8), 2), 6, "1 in 54: 8 blocks of 5 load their panels once more");
        assert_eq!(default_rows(6, 6, Some(8), 2), 6);
        assert_eq!(default_rows(6, 1, Some(8), 2), 1);
        assert_eq!(default_rows(4, 9, Some(8), 2), 4, "blocks of 4 rows of 2 are as latency-bound as one row");
        assert_eq!(default_rows(12, 97, Some(12), 2), 12, "AVX-512's 12 rows on a 12-way L1");
        assert_eq!(block_cycles(6, 7, 2), 12);
        assert_eq!(block_cycles(4, 7, 2), 10);
    }

    /// Rows per block: a divisor of the extent where one is at least a
    /// third of the most, else blocks as even as the most allows.
    #[test]
    fn row_blocks_divide_or_even_out() {
        assert_eq!(block_rows(12, 15), 5);
        assert_eq!(block_rows(12, 55), 11);
        assert_eq!(block_rows(12, 13), 7, "7 and 6, not 12 and 1");
        assert_eq!(block_rows(12, 71), 12, "six blocks: 12 and 11");
        assert_eq!(block_rows(5, 13), 5);
        assert_eq!(block_rows(12, 7), 7);
    }

    /// On the nominal machine, the blocking measured there: slices of 512
    /// (256 up to 512 deep over rows of two column blocks or more), blocks
    /// of 256 columns from rows of 2048 on.
    /// AVX2 (12 accumulators, 16 registers), a 7-row map and 512 filters:
    /// 4 filters × 3 rows when the step takes nothing else; with a register
    /// or two taken (a `@dot2` product, AVX2's lane mask, `@dot4sat`'s
    /// ones), blocks whose accumulators, rows, broadcast and those fit in 16.
    #[test]
    fn register_blocks_leave_room_for_what_a_step_takes() {
        assert_eq!(two_axis_rows(12, 0, 512, (7, false)), (4, 3));
        for taken in 1..=3 {
            let (fk, fh) = two_axis_rows(12, taken, 512, (7, false));
            assert!(fk * fh + fh + 1 + taken <= 16, "taken {taken}: {fk} × {fh}");
            assert!(fh >= 2, "taken {taken}: {fk} × {fh} still blocks image rows");
        }
    }

    /// A group's filter blocks as the second axis (channels blocked by
    /// eight, groups of three blocks): AVX2 takes 4 positions × the whole
    /// group; a group of 5 blocks is blocked whole or one block at a time,
    /// never with a shorter last block; AVX-512 (24 accumulators) takes 7
    /// positions × 3.
    #[test]
    fn a_groups_rows_are_blocked_whole() {
        assert_eq!(two_axis_rows(12, 0, 28, (3, true)), (4, 3));
        for h in 2..=7 {
            let (fk, fh) = two_axis_rows(12, 0, 28, (h, true));
            assert_eq!(h % fh, 0, "{h} rows in blocks of {fh}");
            assert!(fk * fh + fh + 1 <= 16, "{fk} × {fh}");
        }
        assert_eq!(two_axis_rows(24, 0, 28, (3, true)), (7, 3));
    }

    /// Rows sharing their loads of a short row keep the row's vectors and a
    /// broadcast in the registers beside their accumulators: AVX2's rows of
    /// four vectors take 2 rows (8 accumulators), not 3; rows of two or
    /// three vectors, AVX-512's rows and the longest short rows (two rows
    /// at least) keep theirs.
    #[test]
    fn short_rows_leave_room_for_their_vectors() {
        let (avx2, avx512) = (machine(8, 12, caches(32, 512, 2)), machine(16, 24, caches(32, 512, 2)));
        let rows = |m, vectors| short_row_accumulators(m, vectors, 0) / vectors;
        assert_eq!([1, 2, 3, 4, 5, 6].map(|v| rows(avx2, v)), [12, 6, 4, 2, 2, 2]);
        assert_eq!([1, 2, 3, 4, 5, 6].map(|v| rows(avx512, v)), [24, 12, 8, 6, 4, 4]);
        for v in 1..=4 {
            assert!(rows(avx2, v) * v + v + 1 <= 16, "{v} vectors");
        }
        // A lane mask (AVX2, rows of 19, 21, 22, 23): 3 rows of 3 vectors.
        assert_eq!(short_row_accumulators(avx2, 3, 1) / 3, 3);
        // A widening `@dot4` takes four registers and four accumulators.
        let widening = Machine { accumulators: 8, registers: 12, ..avx2 };
        assert_eq!([2, 3, 4].map(|v| short_row_accumulators(widening, v, 0) / v), [4, 2, 2]);
    }

    #[test]
    fn the_nominal_machine_keeps_the_measured_blocking() {
        let b = blocking(CpuCaches::NOMINAL, 4);
        assert_eq!(
            [b.kslice(2048, 4, 16), b.kslice(513, 16, 16), b.kslice(512, 16, 16), b.kslice(300, 8, 32)],
            [512, 512, 256, 256]
        );
        // Fewer panels than two 128-column blocks: a reduction up to `kmax` stays whole.
        assert_eq!([b.kslice(400, 4, 16), b.kslice(512, 15, 16), b.kslice(300, 7, 32)], [512, 512, 512]);
        assert_eq!([b.cols(2048, |_| true), b.cols(2047, |_| true), b.cols(8192, |_| true)], [256, 128, 256]);
        assert_eq!(b.cols(4096, |c| c < 256), 128, "a block packed whole must fit");
        // f64: half as deep (the same bytes of L1), 256 columns still in half of L2.
        let d = blocking(CpuCaches::NOMINAL, 8);
        assert_eq!((d.kslice(1024, 256, 16), d.kslice(200, 256, 16), d.cols(4096, |_| true)), (256, 256, 256));
    }

    /// The blocking follows the caches and cores: a small L2 takes shallower
    /// slices and narrower blocks, a large L1 and L2 deeper and wider ones,
    /// one core wider blocks of shorter rows, many cores narrower ones.
    #[test]
    fn the_blocking_follows_the_caches_and_cores() {
        let small = blocking(caches(32, 256, 2), 4);
        assert_eq!((small.kslice(4096, 256, 32), small.cols(8192, |_| true)), (256, 128));
        let tiny = blocking(caches(16, 64, 2), 4);
        assert_eq!((tiny.kslice(4096, 256, 32), tiny.cols(8192, |_| true)), (64, 128));
        let large = blocking(caches(64, 4096, 2), 4);
        assert_eq!(
            (large.kslice(4096, 256, 32), large.cols(8192, |_| true), large.cols(2048, |_| true)),
            (1024, 512, 256)
        );
        let one = blocking(caches(32, 1024, 1), 4);
        assert_eq!(one.cols(1024, |_| true), 256);
        let many = blocking(caches(32, 1024, 16), 4);
        assert_eq!((many.cols(2048, |_| true), many.cols(16384, |_| true)), (128, 256));
        // This machine (Zen 5: 48 KiB L1d, 1 MiB L2) slices and blocks
        // products of many rows as the nominal one.
        let (zen5, nominal) = (blocking(caches(48, 1024, 2), 4), blocking(CpuCaches::NOMINAL, 4));
        assert_eq!((zen5.kmax, zen5.max_cols), (nominal.kmax, nominal.max_cols));
    }

    /// Few rows in all: slices of equal depth (rounded up to 8) whose rows
    /// all fit in L1 beside a panel; none where one slice already does, or
    /// where the rows leave room for fewer than 64 steps (a GEMM's rows);
    /// one of the whole sum where the register block's step does not wait
    /// on L2 and the rows and a panel over the sum fit L2.
    #[test]
    fn few_rows_take_slices_that_keep_them_in_l1() {
        let b = blocking(caches(32, 512, 2), 4);
        // 7 × 7 maps, panels of 16: 32 KiB / (65 × 4 bytes) = 126 steps.
        assert_eq!(b.whole_rows_slice((49, 5, 16), 2048), Some(128), "17 slices of 120.5");
        assert_eq!(b.whole_rows_slice((49, 5, 16), 440), Some(112), "4 slices of 110");
        assert_eq!(b.whole_rows_slice((49, 5, 16), 512), Some(104));
        assert_eq!(b.whole_rows_slice((49, 5, 16), 126), None, "one slice fits");
        assert_eq!(b.whole_rows_slice((197, 5, 16), 768), None, "a ViT's 197 rows: 38 steps");
        // A larger L1 or f64 elements scale the depth.
        assert_eq!(blocking(caches(48, 1024, 2), 4).whole_rows_slice((49, 5, 16), 2048), Some(192));
        assert_eq!(blocking(caches(32, 512, 2), 8).whole_rows_slice((49, 5, 8), 1024), Some(72));
        // AVX-512's blocks of 7 rows × 32 lanes hide L2: the whole sum,
        // while 49 rows and a panel over it fit L2 (2048 deep: 648 KiB).
        let b512 = blocking(caches(32, 1024, 2), 4);
        assert_eq!(b512.whole_rows_slice((49, 7, 32), 2048), Some(2048), "one slice");
        assert_eq!(b512.whole_rows_slice((49, 7, 32), 4096), Some(104), "1.3 MB: 41 slices of 100");
        assert_eq!(blocking(caches(32, 512, 2), 4).whole_rows_slice((49, 7, 32), 2048), Some(104), "512 KiB L2");
        assert_eq!(b512.whole_rows_slice((49, 5, 32), 2048), Some(104), "5 rows wait on L2");
        for depth in [127, 300, 1000, 4096] {
            let k = b.whole_rows_slice((49, 5, 16), depth).expect("sliced");
            assert!(k * 65 * 4 <= 34 * 1024 && (depth + k - 1) / k >= 2, "{depth}: {k}");
        }
    }

    /// Rows too many for whole-row slices, read a line apart at each step:
    /// slices of a quarter of L1's lines (128 on 32 KiB, 192 on 48) where
    /// the reduction is deeper than two of them, the row has a column
    /// block of panels, and the register block waits on L2; none otherwise.
    #[test]
    fn many_rows_along_lines_take_slices_of_a_quarter_of_l1() {
        let b = blocking(caches(32, 512, 2), 4);
        assert_eq!(b.row_block_slice((196, 6, 16), 1024, 32), Some(128), "14², 1024 → 512");
        assert_eq!(b.row_block_slice((289, 6, 16), 768, 8), Some(128), "17², 768 → 128");
        assert_eq!(b.row_block_slice((784, 6, 16), 400, 16), Some(104), "four slices of 100");
        assert_eq!(b.row_block_slice((196, 6, 16), 256, 64), None, "two slices cost what they save");
        assert_eq!(b.row_block_slice((1225, 6, 16), 288, 4), None, "four panels");
        assert_eq!(b.row_block_slice((49, 5, 16), 2048, 32), None, "few rows: whole-row slices");
        assert_eq!(b.row_block_slice((196, 7, 32), 1024, 16), None, "AVX-512's block hides L2");
        assert_eq!(
            blocking(caches(48, 1024, 2), 4).row_block_slice((196, 6, 16), 1024, 32),
            Some(176),
            "six slices of 171"
        );
        assert_eq!(blocking(caches(48, 1024, 2), 4).row_block_slice((196, 6, 16), 384, 32), None);
    }

    /// Whole-row slices where a step reads more than a byte a lane from
    /// L2: AVX2's blocks of 16 lanes, AVX-512's of 32 only below 6 rows.
    #[test]
    fn only_steps_that_wait_on_l2_take_whole_row_slices() {
        assert!(step_outruns_l2((5, 16), 4), "AVX2, 5 rows: 1.6 bytes a lane");
        assert!(step_outruns_l2((6, 16), 4), "AVX2, 6 rows: 1.33");
        assert!(!step_outruns_l2((7, 32), 4), "AVX-512, 7 rows: 0.86");
        assert!(!step_outruns_l2((12, 32), 4));
        assert!(step_outruns_l2((5, 32), 4), "AVX-512, 5 rows: 1.2");
        assert!(!step_outruns_l2((6, 32), 4), "AVX-512, 6 rows: 1.0");
        assert!(!step_outruns_l2((8, 16), 4), "AVX2, 8 rows: 1.0");
    }

    /// Column blocks as the parallel loop (the last, shorter block in the
    /// same launch, in the last core's chunk): as many panels as split them
    /// most evenly between the cores, within a quarter of those asked.
    #[test]
    fn column_blocks_even_out_between_cores() {
        assert_eq!(balanced_blocks(10, 4, 2), 5, "5 and 5, not 4 and 4 + 2");
        assert_eq!(balanced_blocks(19, 8, 2), 9, "9 and 9 + 1, not 8 and 8 + 3");
        assert_eq!(balanced_blocks(16, 4, 2), 4, "already even");
        assert_eq!(balanced_blocks(38, 4, 2), 4, "20 and 16 + 2 panels; blocks of 3 or 5 make 20 too");
        assert_eq!(balanced_blocks(38, 2, 2), 2, "no other block of 2 to 2");
        assert_eq!(balanced_blocks(10, 4, 1), 4, "one core: as asked");
        assert_eq!(balanced_blocks(132, 16, 2), 16, "13 gains less than 5 %: 67 panels a core against 68");
        assert_eq!(balanced_blocks(7, 4, 2), 4, "fewer than two blocks: as asked");
        assert_eq!(longest_share(10, 4, 2), 6, "4 and 4 + 2");
        assert_eq!(longest_share(49, 8, 2), 25, "3 blocks of 8, and 3 of 8 and the last lane");
        assert_eq!(longest_share(49, 8, 4), 16, "7 blocks on 4 cores: 1, 2, 2, 2");
        assert_eq!(longest_share(3, 8, 2), 3, "one block");
        for (panels, per_block, cores) in [(37, 4, 2), (100, 8, 3), (23, 6, 4)] {
            let b = balanced_blocks(panels, per_block, cores);
            assert!(
                ((per_block * 3 + 3) / 4..=per_block + per_block / 4).contains(&b),
                "{panels} panels, {per_block}: {b}"
            );
        }
    }
}
