//! Channel-wise integer products on short rows, stored channels last: a
//! TIR-to-TIR pass for CPU targets, run by the pipeline before
//! [`crate::dot4`] packs products (and before constants fold).
//!
//! A depthwise convolution `D[n, c, y, x] = Σ[r, s] i32(P[n, c, y + r,
//! x + s]) · i32(W[c, 0, r, s])` reads its activations along the channel
//! `c` it writes, so [`crate::filters_last`] cannot put `c` last (its
//! filters would be the activations). On a 7 × 7 map its rows are 7 lanes
//! of 16, and the 1 × 1 product after it, on AMX tiles, gathers its
//! output into tile rows (`D.q4[n, y, x, c4]`) by a transposing pack, four
//! bytes 49 apart per lane (MEASURED, AMX Xeon, MobileNetV2 int8's 960
//! channels at 7 × 7, 1 thread: the depthwise 0.033 ms and the pack 0.034
//! ms per block). Where the row fills less than [`MIN_FILL`] of the
//! vectors, the channels fill them well, and every reader of the output
//! packs it into AMX tile rows, the pass
//! stores the depthwise's output, its activations, and the stages that make
//! them, channels last: each such temporary's channel dimension moved last
//! (`D[n, y, x, c]`), its writer's axes in the same order (so its vectors
//! run along the channels), and every read of it indexed alike. The chain
//! of writers goes up through stages that read their input channel by
//! channel (the padding copy) to the product that makes the channels (the
//! 1 × 1 expansion): that product is returned, for [`crate::filters_last`]
//! to compute filters-last and its reader to read as it is stored — not
//! where AMX tiles would compute it, whose write-back keeps the rows last.
//! No activation is copied: the program computes the same values in the
//! same order per element, stored at other addresses. MEASURED (same
//! machine and block): the depthwise 0.033 → 0.016 ms (its padding 0.002),
//! the pack 0.034 → 0.002, the expansion, now filters-last, 0.045 → 0.025;
//! MobileNetV2's four blocks at 7 × 7 0.52 → 0.30 ms (docs/quantization.md).
//!
//! The depthwise's filters `W[c, 0, r, s]`, constant, are read from a copy
//! with `c` last (`W.f[r, s, c]`), made by a stage that folds with the
//! constants (`read_constants_along_last`); the expansion's filters are
//! moved so by [`crate::filters_last`]. A chain is taken only whole: every temporary in it read by nothing but
//! the next stage of the chain, every tensor read along the channels a
//! constant or read with the channels last, and the depthwise's output read
//! only by products that sum over its channels (so packed along them,
//! now contiguous).
//!
//! Float depthwise convolutions take a region rather than a chain
//! (`float_region`): on every CPU target, where the depthwise's row idles
//! an eighth of its lanes or more ([`crate::filters_last::FLOAT_FILL`]:
//! maps of 7, 14, 27 and 28 on AVX2 and AVX-512, and 56 on AVX-512) and
//! its channels fill them. The layout is then chosen across the layers of an inverted
//! residual block, as oneDNN's and ONNX Runtime's blocked layouts are: the
//! depthwise convolution, the elementwise stages that make its input (the
//! padding, the activation, the bias; a SiLU's sigmoid and product read
//! the same temporary, so the region is a graph, not a chain) and those
//! that read its output and keep the channels (the activation, a
//! squeeze-and-excite's pooling and scaling) are stored channels last;
//! the products at the region's edges — the expansion that makes the
//! channels, the projection that sums over them — are returned, for
//! [`crate::filters_last`] to compute filters-last whatever their row and
//! depth (the expansion's copy back inlined into the region, which reads
//! it as stored). Vectors then run
//! along the channels in every stage of the region, and no row is a
//! vector and a masked part of one. MEASURED in `float_region`'s comment
//! and in docs/onnx.md. A grouped convolution whose groups are whole
//! vectors (RegNet's groups of 16 and 24) starts a region alike: its input
//! is read through the group (`P[n, y + r, x + s, k / Kg · Cg + q]` once
//! stored channels last), one element per vector of a group's filters, a
//! broadcast as in the filters-last product it replaces, whose copy back
//! and channels-first padding (a transposing pass each) the region saves;
//! its sum runs over its taps before its channels
//! (`group_channels_innermost`).
//!
//! A region goes on across blocks where it can (`across`): through each
//! projection whose readers keep the channels (the residual sum) to the
//! next block — its expansion an edge that both reads and makes channels
//! last, its depthwise or grouped convolution another seed — so that a
//! stage of blocks keeps its channels last from its first shortcut to the
//! pooling after it, each product reading and writing them as stored (no
//! copy back: ONNX Runtime's NCHWc kept from layer to layer, with the
//! whole channel dimension as the block). Where that walk does not close
//! (a reader across the channels, a model output, a product that is not
//! computed filters-last), the block's own region is taken as before.
//!
//! Invariants: the program computes the same values (the same expression
//! per output element, each written once, stored at a permuted address and
//! read from it; a grouped convolution's sum reassociated, its taps
//! outermost, which the interpreter, summing in f64, computes to the same
//! bits); the only stages added are the constants'
//! copies, inserted before the stages that read them (operator records'
//! stage ranges move with them); inputs and outputs keep their layouts.

use crate::analysis::{involves, loads_in};
use crate::filters_last::{alone_at, fill, product_body, read_moved, MIN_FILL};
use crate::normalize::{contains_reduce, replace_node, subst};
use crate::strategy::Reads;
use std::collections::{HashMap, HashSet};
use texc_compiler::ops::{BinOp, Intrinsic};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

/// A temporary to store channels last: its tensor and channel dimension.
type Move = (TensorId, usize);

/// Store every short-row channel-wise integer product of `p`, and the chain
/// that makes its activations, channels last, and every short-row float
/// depthwise convolution with the region around it; the products
/// [`crate::filters_last`] is to compute filters-last: the top of each
/// chain, the edges (expansions and projections) of each region.
/// `constant` marks tensors known when compiling (folded, so a transposed
/// copy of one costs nothing per run).
pub fn channels_last(p: &mut Program, target: &Target, constant: &dyn Fn(TensorId) -> bool) -> Vec<TensorId> {
    if target.kind != TargetKind::Cpu {
        return Vec::new();
    }
    let packs = [Intrinsic::Dot4, Intrinsic::Dot2].iter().any(|&i| target.has_intrinsic(i));
    // Indexes kept up to date as the pass goes: a model's hundred blocks
    // each asking "who reads t" of every stage made the pass quadratic.
    let mut ix = Index { reads: Reads::of(p), loads: LoadsOf::default() };
    let mut tops = Vec::new();
    let mut moved: HashSet<TensorId> = HashSet::new();
    let mut si = 0;
    while si < p.stages.len() {
        if moved.contains(&p.stages[si].tensor) {
            si += 1;
            continue;
        }
        if let Some((moves, top)) = packs.then(|| plan(p, &ix.reads, si, target, constant)).flatten() {
            drop_unit_sums(p, si);
            for &(t, d) in &moves {
                store_last(p, &mut ix, t, d);
            }
            si = read_constants_along_last(p, &mut ix.reads, si, constant);
            tops.push(top);
        } else if let Some(region) = float_region(p, &ix.reads, si, target, constant, true)
            .or_else(|| float_region(p, &ix.reads, si, target, constant, false))
        {
            let start = p.stages[si].tensor;
            let seeds: Vec<TensorId> = region.seeds.iter().map(|s| p.stages[s.stage].tensor).collect();
            let grouped: Vec<TensorId> =
                region.seeds.iter().filter(|s| s.grouped).map(|s| p.stages[s.stage].tensor).collect();
            for t in seeds {
                let s = ix.reads.sole_writer(p, t).expect("a seed writes its tensor");
                drop_unit_sums(p, s);
                ix.reads.refresh(p, s);
            }
            for &(t, d) in &region.moves {
                store_last(p, &mut ix, t, d);
            }
            for &t in &grouped {
                let s = ix.reads.sole_writer(p, t).expect("a seed writes its tensor");
                group_channels_innermost(p, s);
            }
            for &(t, _) in &region.moves {
                let w = ix.reads.sole_writer(p, t).expect("a moved temporary has one writer");
                read_constants_along_last(p, &mut ix.reads, w, constant);
                moved.insert(t);
            }
            tops.extend(region.tops.into_iter().chain(region.bottoms));
            si = ix.reads.sole_writer(p, start).expect("the depthwise convolution's writer");
        }
        si += 1;
    }
    debug_assert!(ix.reads == Reads::of(p), "channels-last kept its index of reads up to date");
    tops
}

/// Stage `si`'s constant operands that move with its last axis in another
/// dimension (a depthwise convolution's filters `W[c, 0, r, s]`) read from
/// copies with that dimension last ([`crate::filters_last::read_moved`],
/// folded with the constants); the stage's index afterwards, `reads`
/// kept up to date.
fn read_constants_along_last(
    p: &mut Program,
    reads: &mut Reads,
    mut si: usize,
    constant: &dyn Fn(TensorId) -> bool,
) -> usize {
    let st = p.stages[si].clone();
    let c = (st.n_axes - 1) as VarId;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let mut value = st.value;
    let mut made = Vec::new();
    for l in loads {
        let TExpr::Load(t, _) = p.expr(l) else { continue };
        let (t, dims) = (*t, p.tensor(*t).shape.clone());
        let Some(d) = channel_at(p, &st, l, c).filter(|&d| !effectively_last(&dims, d)) else { continue };
        if !constant(t) {
            continue;
        }
        let (read, inserted) = read_moved(p, si, l, d, &mut made);
        if inserted {
            reads.inserted(p, si, si + 1);
            si += 1;
        }
        value = replace_node(p, value, l, read);
    }
    p.stages[si].value = value;
    reads.refresh(p, si);
    si
}

/// The temporaries to store channels last for product stage `si`, its own
/// output first, and the product at the top of its chain, if the stage is
/// a short-row channel-wise product whose chain can move whole.
fn plan(
    p: &Program,
    reads: &Reads,
    si: usize,
    target: &Target,
    constant: &dyn Fn(TensorId) -> bool,
) -> Option<(Vec<Move>, TensorId)> {
    let st = &p.stages[si];
    let x = st.n_axes.checked_sub(1)?;
    let (body, false) = product_body(p, st.value)? else { return None };
    if x < 2 || !matches!(p.ty(body), Ty::Elem(e) if e.is_int()) || reads.sole_writer(p, st.tensor) != Some(si) {
        return None;
    }
    let lanes = target.lanes(ElemType::I32) as i64;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let (c, (a, d)) = (0..x).rev().find_map(|c| {
        let ext = st.vars[c].extent;
        let fills = ext >= lanes && fill(ext, lanes) >= MIN_FILL;
        fills.then(|| activations(p, st, &loads, c as VarId)).flatten().map(|a| (c, a))
    })?;
    // (After the cheap test above: most products are not channel-wise.)
    if fill(crate::strategy::default_row(p, target, si), lanes) >= MIN_FILL {
        return None;
    }
    let cv = c as VarId;
    let others = loads.iter().filter(|&&l| l != a && involves(p, l, cv));
    if !others.into_iter().all(|&l| read_along(p, st, l, cv, constant)) {
        return None;
    }
    let tiled = |r: usize| crate::dot4::packs_for_tiles(p, r, target);
    if !read_by_products_along(p, reads, st.tensor, c) || !reads.readers(st.tensor).all(tiled) {
        return None;
    }
    let mut moves = vec![(st.tensor, c)];
    let TExpr::Load(t, _) = p.expr(a) else { return None };
    let top = chain(p, reads, si, (*t, d), target, constant, &mut moves)?;
    Some((moves, top))
}

/// What [`float_region`] stores channels last: the temporaries, the
/// depthwise convolution's output first, and the products at the
/// region's edges, to compute filters-last.
struct Region {
    moves: Vec<Move>,
    tops: Vec<TensorId>,
    bottoms: Vec<TensorId>,
    /// The channel-wise and grouped convolutions in the region, whose
    /// activations are read along their channels.
    seeds: Vec<Seed>,
    /// Whether the region goes on through its bottoms to their readers
    /// ([`float_region`]'s `across`), and the bottoms (with their filter
    /// axes) whose readers are yet to walk.
    across: bool,
    crossed: Vec<Move>,
}

/// A stage that can start a region ([`seed_axis`]): its channel axis, its
/// activations (the load and the dimension it reads the channels in), and
/// whether it reads them through its group.
#[derive(Clone, Copy)]
struct Seed {
    stage: usize,
    axis: usize,
    activations: (TExprId, usize),
    grouped: bool,
}

/// The most temporaries one region moves (a block's depthwise
/// convolution, its activations, padding and squeeze-and-excite take
/// about ten; a region across blocks about six a block): the walk stays
/// bounded on any program.
const MAX_REGION: usize = 32;
const MAX_REGION_ACROSS: usize = 192;

/// The region to store channels last around float stage `si`, if it is a
/// channel-wise (depthwise) product, or a grouped one whose groups are
/// whole vectors ([`grouped_activations`]), whose default row idles lanes
/// ([`crate::filters_last::FLOAT_FILL`]) while its channels fill them, and
/// the region closes: up from its activations through elementwise stages
/// (the padding copy, the activation, the bias) to the products that make
/// the channels (the expansion), down through every reader that keeps the
/// channels (the activation, a squeeze-and-excite's pooling and scaling)
/// to the products that sum over them (the projection; the pooled
/// `s[n, c, 1, 1]` is laid out alike either way, so its readers are not
/// the region's). Each edge product must be computed filters-last by
/// [`crate::filters_last`] when wanted, a projection summing at least
/// [`crate::filters_last::MIN_FLOAT_DEPTH`] products (its copy back is a
/// pass over its output: ShuffleNetV2's projections of 58 and 116
/// channels, so moved, ran the model 3.45–3.85 → 3.94–4.05 ms on
/// `x86-avx2`), every temporary moved (but those whose channels are last
/// already but for dimensions of one element: their readers read the same
/// addresses) is read by the region or by those products only, and
/// every other operand read along the channels is a constant or has its
/// channels last already (a bias `b[c]`, a scale `s[0, c, 0, 0]`).
/// MEASURED (`x86-avx2` / `host`, 1 thread, the depthwise 5 × 5 with its
/// padding and two SiLUs, 672 channels at 14², as `.tex` kernels in each
/// layout): 0.235 → 0.175 ms / 0.217 → 0.128; 1152 channels at 7²: 0.175 →
/// 0.082 / 0.171 → 0.061; 144 channels at 56²: 0.656 → 0.651 / 0.521 →
/// 0.427 (taken on AVX-512, whose row of 56 is 56 of 64 lanes; AVX2's row
/// of 56 fills its vectors).
///
/// `across`: the walk goes on from each projection (a bottom) to its
/// readers, as from a temporary of the region — the residual sum joins it,
/// and through it the next block, whose depthwise or grouped convolution
/// reading the region joins as a seed ([`seed_reading`]) — so that the
/// projections and expansions between blocks are tops too, their copies
/// back inlined; bounded by [`MAX_REGION_ACROSS`] temporaries.
fn float_region(
    p: &Program,
    reads: &Reads,
    si: usize,
    target: &Target,
    constant: &dyn Fn(TensorId) -> bool,
    across: bool,
) -> Option<Region> {
    let seed = seed_axis(p, reads, si, target)?;
    let mut region = Region {
        moves: vec![(p.stages[si].tensor, seed.axis)],
        tops: Vec::new(),
        bottoms: Vec::new(),
        seeds: vec![seed],
        across,
        crossed: Vec::new(),
    };
    let most = if across { MAX_REGION_ACROSS } else { MAX_REGION };
    let (mut i, mut j) = (0, 0);
    loop {
        if let Some(&(t, d)) = region.moves.get(i) {
            let w = reads.sole_writer(p, t)?;
            up(p, reads, (w, d), target, constant, &mut region)?;
            down(p, reads, t, d, target, constant, &mut region)?;
            i += 1;
        } else if let Some(&(t, f)) = region.crossed.get(j) {
            down(p, reads, t, f, target, constant, &mut region)?;
            j += 1;
        } else {
            break;
        }
        if region.moves.len() > most {
            return None;
        }
    }
    // A top's copy back is inlined into its readers only where all of
    // them read it along their channels.
    let tops_read_by_region = region.tops.iter().all(|&u| {
        reads.every_read(p, u, |st, l| {
            let at = region.moves.iter().find(|m| m.0 == st.tensor).map(|m| m.1 as VarId);
            at.is_some_and(|v| crate::filters_last::alone_at(p, l, v).is_some())
        })
    });
    tops_read_by_region.then_some(region)
}

/// Float stage `si` as a [`Seed`], if it can start a region: a
/// channel-wise (depthwise) product, or a grouped one whose groups are
/// whole vectors, whose channels fill the vectors and whose default row
/// idles an eighth of them or more.
fn seed_axis(p: &Program, reads: &Reads, si: usize, target: &Target) -> Option<Seed> {
    let st = &p.stages[si];
    let x = st.n_axes.checked_sub(1)?;
    let (body, false) = product_body(p, st.value)? else { return None };
    let Ty::Elem(elem) = p.ty(body) else { return None };
    if x < 2 || !elem.is_float() || reads.sole_writer(p, st.tensor) != Some(si) {
        return None;
    }
    let lanes = target.lanes(elem) as i64;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    // Channel-wise: both factors move with the channel (a spatial axis
    // moves the activations only, a 1 × 1 convolution's filters only).
    let mut factors = Vec::new();
    loads_in(p, body, &mut factors);
    let seed = (0..x).rev().find_map(|c| {
        let (ext, cv) = (st.vars[c].extent, c as VarId);
        let channel_wise = factors.iter().all(|&l| involves(p, l, cv));
        if ext < lanes || fill(ext, lanes) < MIN_FILL || !channel_wise {
            return None;
        }
        let seed = |activations, grouped| Seed { stage: si, axis: c, activations, grouped };
        match activations(p, st, &loads, cv) {
            Some(a) => Some(seed(a, false)),
            None => grouped_activations(p, st, &loads, cv, lanes).map(|a| seed(a, true)),
        }
    })?;
    let idles = fill(crate::strategy::default_row(p, target, si), lanes) <= crate::filters_last::FLOAT_FILL;
    idles.then_some(seed)
}

/// The operands stage `w` (writing a temporary of the region, channels
/// along its axis `d`) reads
/// along the channels: the temporaries made elementwise join the region,
/// the products that make them are its tops (wanted filters-last along
/// the channels); `None` where another operand would be read across its
/// channels.
fn up(
    p: &Program,
    reads: &Reads,
    (w, d): (usize, usize),
    target: &Target,
    constant: &dyn Fn(TensorId) -> bool,
    region: &mut Region,
) -> Option<()> {
    let st = &p.stages[w];
    let cv = d as VarId;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    // A grouped convolution of the region reads its activations through
    // its filters' group (`P[n, k / Kg · Cg + c, ..]`).
    let seed = region.seeds.iter().find(|s| s.stage == w).copied();
    let grouped = seed.filter(|s| s.grouped).map(|s| s.activations);
    for l in loads.into_iter().filter(|&l| involves(p, l, cv)) {
        let TExpr::Load(u, _) = p.expr(l) else { return None };
        let e = channel_at(p, st, l, cv).or_else(|| grouped.filter(|g| g.0 == l).map(|g| g.1))?;
        let dims = &p.tensor(*u).shape;
        if effectively_last(dims, e) || (seed.is_some() && constant(*u)) {
            continue;
        }
        if let Some(m) = region.moves.iter().find(|m| m.0 == *u) {
            (m.1 == e).then_some(())?;
            continue;
        }
        if region.tops.contains(u) {
            continue;
        }
        let wu = reads.sole_writer(p, *u)?;
        if product_body(p, p.stages[wu].value).is_some() {
            let movable = |t| constant(t);
            (crate::filters_last::wanted_axis(p, reads, wu, target, &movable) == Some(e)).then_some(())?;
            region.tops.push(*u);
        } else if contains_reduce(p, p.stages[wu].value) {
            return None;
        } else {
            region.moves.push((*u, e));
        }
    }
    Some(())
}

/// The readers of temporary `t` of the region (channels in dimension
/// `d`): stages that keep the channels join the region (their own output
/// moved, along the axis that reads them), products that sum over them
/// are its bottoms (wanted filters-last); `None` for any other reader.
fn down(
    p: &Program,
    reads: &Reads,
    t: TensorId,
    d: usize,
    target: &Target,
    constant: &dyn Fn(TensorId) -> bool,
    region: &mut Region,
) -> Option<()> {
    // Stored with its channels last already but for dimensions of one
    // element (a pooled `s[n, c, 1, 1]`): moved, its readers read the
    // same addresses.
    if effectively_last(&p.tensor(t).shape, d) {
        return Some(());
    }
    for r in reads.readers(t) {
        let st = &p.stages[r];
        if region.moves.iter().any(|m| m.0 == st.tensor) || region.bottoms.contains(&st.tensor) {
            continue;
        }
        // Across blocks: the next block's depthwise or grouped convolution,
        // its activations this temporary, joins as the first one did.
        if let Some(seed) = region.across.then(|| seed_reading(p, reads, r, t, d, target)).flatten() {
            region.moves.push((st.tensor, seed.axis));
            region.seeds.push(seed);
            continue;
        }
        let mut loads = Vec::new();
        loads_in(p, st.value, &mut loads);
        loads.retain(|&l| matches!(p.expr(l), TExpr::Load(u, _) if *u == t));
        let TExpr::Load(_, idx) = p.expr(loads[0]) else { return None };
        let TExpr::Var(v) = *p.expr(idx[d]) else { return None };
        let same = |&l: &TExprId| crate::filters_last::alone_at(p, l, v) == Some(d);
        if !loads.iter().all(same) {
            return None;
        }
        let summed = (v as usize) >= st.n_axes;
        if summed && product_body(p, st.value).is_some() {
            // Its copy back is a pass over its output, as for any float
            // product computed filters-last: paid for by a deep sum only.
            let depth: i64 = st.vars[st.n_axes..].iter().map(|v| v.extent).product();
            let movable = |t| constant(t);
            if depth < crate::filters_last::MIN_FLOAT_DEPTH {
                return None;
            }
            let f = crate::filters_last::wanted_axis(p, reads, r, target, &movable)?;
            region.bottoms.push(st.tensor);
            if region.across {
                region.crossed.push((st.tensor, f));
            }
        } else if !summed && reads.sole_writer(p, st.tensor) == Some(r) {
            region.moves.push((st.tensor, v as usize));
        } else {
            return None;
        }
    }
    Some(())
}

/// Stage `r` as a [`Seed`], if it can start a region and its activations
/// are temporary `t`, read along its dimension `d`.
fn seed_reading(p: &Program, reads: &Reads, r: usize, t: TensorId, d: usize, target: &Target) -> Option<Seed> {
    let seed = seed_axis(p, reads, r, target)?;
    let (a, e) = seed.activations;
    (matches!(p.expr(a), TExpr::Load(u, _) if *u == t) && e == d).then_some(seed)
}

/// Grouped convolution stage `si`, stored channels last, summing over its
/// group's input channels innermost (`sum[r, s, q]`, not `sum[q, r, s]`):
/// its input, `P[n, y + r, x + s, k / Kg · Cg + q]`, then gives each tap's
/// broadcasts from one line, read once. With the channels outside the
/// taps, every step of `q` reads the window's lines again — a block's
/// positions and rows, whose lines are `C` channels apart and fall into
/// few sets of L1 where `C` is a power of two (ResNeXt-50's 512 channels
/// at 14²: 21 lines in 2 sets of 8 ways).
fn group_channels_innermost(p: &mut Program, si: usize) {
    let st = p.stages[si].clone();
    let Some(k) = st.n_axes.checked_sub(1).map(|k| k as VarId) else { return };
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let Some(last) = loads.iter().find_map(|&l| match p.expr(l) {
        TExpr::Load(_, idx)
            if crate::strategy::cpu::blocking::through_group(p, &[l], k).is_some_and(|g| g.is_some()) =>
        {
            idx.last().copied()
        }
        _ => None,
    }) else {
        return;
    };
    let sums = st.n_axes..st.vars.len();
    let (inner, outer): (Vec<usize>, Vec<usize>) = sums.partition(|&v| involves(p, last, v as VarId));
    let order: Vec<usize> = outer.into_iter().chain(inner).collect();
    let rename: HashMap<VarId, VarId> =
        order.iter().enumerate().map(|(i, &o)| (o as VarId, (st.n_axes + i) as VarId)).collect();
    let mut vars = st.vars[..st.n_axes].to_vec();
    vars.extend(order.iter().map(|&o| st.vars[o].clone()));
    let value = subst(p, st.value, &HashMap::new(), &rename);
    sort_reduce_vars(p, value);
    p.stages[si].vars = vars;
    p.stages[si].value = value;
}

/// The variables of every reduction in `e` (nodes `e` owns: fresh from
/// [`subst`]) listed in order.
fn sort_reduce_vars(p: &mut Program, e: TExprId) {
    if let TExpr::Reduce(_, rv, _) = &mut p.exprs[e.0 as usize] {
        rv.sort_unstable();
    }
    for c in p.children(e) {
        sort_reduce_vars(p, c);
    }
}

/// Whether every dimension of a tensor of `dims` after `d` has one
/// element: dimension `d` is contiguous, as if last.
fn effectively_last(dims: &[i64], d: usize) -> bool {
    dims[d + 1..].iter().all(|&n| n == 1)
}

/// The load of stage `st` (among `loads`) that moves with both channel
/// `c` and the row, the activations, and its channel dimension: the only
/// such load, of a temporary, `c` (or `c + r` with `r` a sum of one)
/// alone in a dimension that is not its last.
fn activations(p: &Program, st: &Stage, loads: &[TExprId], c: VarId) -> Option<(TExprId, usize)> {
    let x = (st.n_axes - 1) as VarId;
    let mut both = loads.iter().copied().filter(|&l| involves(p, l, c) && involves(p, l, x));
    let (a, None) = (both.next()?, both.next()) else { return None };
    let TExpr::Load(t, idx) = p.expr(a) else { return None };
    let d = channel_at(p, st, a, c)?;
    (p.tensor(*t).role == TensorRole::Temp && d + 1 < idx.len()).then_some((a, d))
}

/// The activations of a grouped convolution `st` whose filters `c` come
/// in groups of whole vectors of `lanes` (RegNet's groups of 16 and 24):
/// the only load of a temporary that moves with both `c` and the row, `c`
/// read only through its group (`P[n, c / Kg · Cg + q, ..]`,
/// [`crate::filters_last::per_group`]: a vector of filters, all of one
/// group, reads one element of it), in a dimension that is not its last;
/// the load and that dimension.
fn grouped_activations(p: &Program, st: &Stage, loads: &[TExprId], c: VarId, lanes: i64) -> Option<(TExprId, usize)> {
    let x = (st.n_axes - 1) as VarId;
    let mut both = loads.iter().copied().filter(|&l| involves(p, l, c) && involves(p, l, x));
    let (a, None) = (both.next()?, both.next()) else { return None };
    let TExpr::Load(t, idx) = p.expr(a) else { return None };
    if !crate::filters_last::per_group(p, a, c, st.vars[c as usize].extent, lanes) {
        return None;
    }
    let mut at = idx.iter().enumerate().filter(|&(_, &i)| involves(p, i, c)).map(|(d, _)| d);
    let (d, None) = (at.next()?, at.next()) else { return None };
    (p.tensor(*t).role == TensorRole::Temp && d + 1 < idx.len()).then_some((a, d))
}

/// Whether load `l` of stage `st`, which moves with channel `c`, reads
/// along it as the channels-last stage will: `c` alone in its last
/// dimension already, or a constant (transposed once when folded).
fn read_along(p: &Program, st: &Stage, l: TExprId, c: VarId, constant: &dyn Fn(TensorId) -> bool) -> bool {
    let TExpr::Load(t, idx) = p.expr(l) else { return false };
    match channel_at(p, st, l, c) {
        Some(d) => d + 1 == idx.len() || constant(*t),
        None => false,
    }
}

/// The dimension of load `l` that stage `st`'s variable `c` indexes alone —
/// `c`, or `c + r` with `r` a variable of the sum over one element (a
/// depthwise convolution's `c + r0` of its one input channel per group),
/// which [`drop_unit_sums`] makes `c` — and no other dimension involves.
fn channel_at(p: &Program, st: &Stage, l: TExprId, c: VarId) -> Option<usize> {
    let TExpr::Load(_, idx) = p.expr(l) else { return None };
    let unit = |v: VarId| (v as usize) >= st.n_axes && st.vars[v as usize].extent == 1;
    let is_c = |i: TExprId| match *p.expr(i) {
        TExpr::Var(v) => v == c,
        TExpr::Binary(BinOp::Add, a, b) => match (p.expr(a), p.expr(b)) {
            (TExpr::Var(u), TExpr::Var(v)) => (*u == c && unit(*v)) || (*v == c && unit(*u)),
            _ => false,
        },
        _ => false,
    };
    let d = idx.iter().position(|&i| is_c(i))?;
    idx.iter().enumerate().all(|(k, &i)| k == d || !involves(p, i, c)).then_some(d)
}

/// Whether temporary `t`'s every reader is a product summing over its
/// dimension `d` (a variable of the sum alone there), so packing it along
/// `d` reads it contiguously once `d` is last. (Only packing into AMX tile
/// rows does; `plan` asks for those: a `vpdpbusd` product packs its
/// activations along its row, which channels last would gather —
/// MEASURED on `x86-avx512-vnni`, MobileNetV2's 7 × 7 projection packs
/// 0.001 → 0.055 ms, the model 2.52 → 2.63–2.66 ms.)
fn read_by_products_along(p: &Program, reads: &Reads, t: TensorId, d: usize) -> bool {
    let summed_at_d = |st: &Stage, l: TExprId| {
        let TExpr::Load(_, idx) = p.expr(l) else { return false };
        let summed = |v: VarId| (v as usize) >= st.n_axes && st.vars[v as usize].extent > 1;
        let alone = matches!(*p.expr(idx[d]), TExpr::Var(v) if summed(v) && alone_at(p, l, v) == Some(d));
        alone && product_body(p, st.value).is_some()
    };
    p.tensor(t).role == TensorRole::Temp && reads.every_read(p, t, summed_at_d)
}

/// Follow the chain of writers up from temporary `t` (read along its
/// channel dimension by stage `reader`), adding each to `moves`: each the
/// only reader's source, read channel by channel, up to a product that
/// makes the channels, whose tensor is returned; `None` where the chain
/// cannot move whole.
fn chain(
    p: &Program,
    reads: &Reads,
    reader: usize,
    (t, d): Move,
    target: &Target,
    constant: &dyn Fn(TensorId) -> bool,
    moves: &mut Vec<Move>,
) -> Option<TensorId> {
    let (mut reader, mut t, mut d) = (reader, t, d);
    loop {
        let w = reads.sole_writer(p, t)?;
        if !reads.readers(t).eq([reader]) || moves.iter().any(|m| m.0 == t) {
            return None;
        }
        let st = &p.stages[w];
        let cv = d as VarId;
        let mut loads = Vec::new();
        loads_in(p, st.value, &mut loads);
        let along: Vec<TExprId> = loads.iter().copied().filter(|&l| involves(p, l, cv)).collect();
        if let Some((body, _)) = product_body(p, st.value) {
            // The top: an integer product whose channels are its filters,
            // which no temporary moves with. It stays as it is stored here:
            // [`crate::filters_last`] computes it filters-last for its reader.
            let temp = |l: &TExprId| matches!(p.expr(*l), TExpr::Load(u, _) if p.tensor(*u).role == TensorRole::Temp);
            let int = matches!(p.ty(body), Ty::Elem(e) if e.is_int());
            let filters = along.iter().all(|&l| !temp(&l) && read_along(p, st, l, cv, constant));
            return (int && filters && !crate::dot4::packs_for_tiles(p, w, target)).then_some(t);
        }
        moves.push((t, d));
        let (up, rest): (Vec<TExprId>, Vec<TExprId>) = along.into_iter().partition(|&l| {
            matches!(p.expr(l), TExpr::Load(u, idx) if p.tensor(*u).role == TensorRole::Temp
                && channel_at(p, st, l, cv).is_some_and(|k| k + 1 < idx.len()))
        });
        // Anything else read along the channels must be read so already
        // (a per-channel vector): an elementwise stage has no sum whose
        // operands a transposed constant would serve.
        let last =
            |l: &TExprId| matches!(p.expr(*l), TExpr::Load(_, idx) if channel_at(p, st, *l, cv) == Some(idx.len() - 1));
        let [a] = up[..] else { return None };
        if !rest.iter().all(last) || contains_reduce(p, st.value) {
            return None;
        }
        let TExpr::Load(u, _) = p.expr(a) else { return None };
        (reader, t, d) = (w, *u, channel_at(p, st, a, cv)?);
    }
}

/// What the pass keeps indexed as it rewrites the program.
struct Index {
    reads: Reads,
    loads: LoadsOf,
}

/// Every load node in the expression arena, by the tensor it reads,
/// indexed up to `upto` (nodes are only added, and [`store_last`] keeps a
/// load of `t` a load of `t`): each move rewrites its tensor's loads
/// without walking the whole arena.
#[derive(Default)]
struct LoadsOf {
    upto: usize,
    of: HashMap<TensorId, Vec<usize>>,
}

impl LoadsOf {
    /// The arena slots that load `t`, after indexing the nodes added since.
    fn of(&mut self, p: &Program, t: TensorId) -> Vec<usize> {
        for e in self.upto..p.exprs.len() {
            if let TExpr::Load(u, _) = &p.exprs[e] {
                self.of.entry(*u).or_default().push(e);
            }
        }
        self.upto = p.exprs.len();
        self.of.get(&t).cloned().unwrap_or_default()
    }
}

/// Stage `si`'s sum variables over one element read as `0`, and added to
/// nothing where an index adds them (so that a depthwise convolution's
/// channel `c + r0` is `c` alone, as the packing passes look for it).
fn drop_unit_sums(p: &mut Program, si: usize) {
    let st = &p.stages[si];
    let unit: Vec<VarId> = (st.n_axes..st.vars.len()).filter(|&v| st.vars[v].extent == 1).map(|v| v as VarId).collect();
    if !unit.is_empty() {
        let value = without(p, p.stages[si].value, &unit);
        p.stages[si].value = value;
    }
}

/// `e` with the variables `unit` (each over one element) read as `0`.
fn without(p: &mut Program, e: TExprId, unit: &[VarId]) -> TExprId {
    let is_unit = |p: &Program, e: TExprId| matches!(p.expr(e), TExpr::Var(v) if unit.contains(v));
    match *p.expr(e) {
        TExpr::Binary(BinOp::Add, a, b) if p.ty(e) == Ty::Index && is_unit(p, b) => without(p, a, unit),
        TExpr::Binary(BinOp::Add, a, b) if p.ty(e) == Ty::Index && is_unit(p, a) => without(p, b, unit),
        TExpr::Var(v) if unit.contains(&v) => p.alloc(TExpr::Int(0), Ty::Index, p.span(e)),
        _ => {
            let children = p.children(e);
            let new: Vec<TExprId> = children.iter().map(|&c| without(p, c, unit)).collect();
            if new == children {
                return e;
            }
            crate::normalize::with_children(p, e, new)
        }
    }
}

/// Temporary `t` stored with its dimension `d` last: its writer's axes
/// reordered alike (so the stage still writes its axes in order) and every
/// read of it, anywhere, indexed in the new order.
fn store_last(p: &mut Program, ix: &mut Index, t: TensorId, d: usize) {
    let rank = p.tensor(t).shape.len();
    let order: Vec<usize> = (0..rank).filter(|&k| k != d).chain([d]).collect();
    let w = ix.reads.sole_writer(p, t).expect("a chain's temporary has one writer");
    let st = p.stages[w].clone();
    // Old axis `order[k]` is new axis `k`; reduction variables stay.
    let rename: HashMap<VarId, VarId> = order.iter().enumerate().map(|(k, &o)| (o as VarId, k as VarId)).collect();
    let mut vars: Vec<VarDecl> = order.iter().map(|&o| st.vars[o].clone()).collect();
    vars.extend(st.vars[st.n_axes..].iter().cloned());
    let value = subst(p, st.value, &HashMap::new(), &rename);
    p.stages[w].vars = vars;
    p.stages[w].value = value;
    let decl = &mut p.tensors[t.0 as usize];
    decl.shape = order.iter().map(|&o| decl.shape[o]).collect();
    // Every read of `t` in the arena names the same element by its new
    // index: rewritten in place, so stages sharing the node follow.
    for e in ix.loads.of(p, t) {
        let TExpr::Load(_, idx) = &p.exprs[e] else { unreachable!("indexed as a load") };
        let idx = order.iter().map(|&o| idx[o]).collect();
        p.exprs[e] = TExpr::Load(t, idx);
    }
}
