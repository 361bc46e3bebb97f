//! The innermost loop of a stage that is not register blocked: split by the
//! vector width ([`super::Machine::width_for`]) and vectorized, after
//!
//! - an element-wise stage's short rows (`W = 3`) are fused with the axes
//!   before them while every read walks them as one dense row
//!   ([`fuse_short_rows`]); a stage of short rows that divides per element
//!   uses 256-bit vectors on AVX-512 (`Machine::of`);
//! - a row read only through `v / D` and `v % D` is cut into `D`-long
//!   pieces ([`split_at_row_breaks`]);
//! - an element-wise stage that transposes (its vectors gather from a
//!   tensor over 32 KiB, one cache line per lane) runs a block of lanes
//!   outermost (or, where those blocks do not share out between the
//!   cores, a block along the gathered lines) and walks the gathered
//!   lines in order inside it ([`transposing_order`]).
//!
//! Invariants: only spatial loops are fused or vectorized, and only before
//! any other primitive has touched the stage where the functions say so;
//! a width of 0 (a row shorter than half a vector) leaves the row scalar.

use super::Machine;
use crate::analysis::{loads_in, outside_indices};
use crate::ir::ForKind;
use crate::schedule::StageSchedule;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, VarId};
use texc_grammar::Span;

/// Split `inner` by the vector width ([`Machine::width_for`]) and vectorize
/// its inner part; the two loops, outer first (none where the width is 0).
pub(super) fn vectorize_inner(ss: &mut StageSchedule, inner: usize, m: Machine) -> Option<(usize, usize)> {
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
pub(super) fn fuse_short_rows(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) -> Option<(usize, usize)> {
    let n = st.n_axes;
    // Before any other primitive: the leaves are the axes, then the reduction variables.
    if n < 2 || ss.leaves.len() != st.vars.len() || ss.leaves.iter().enumerate().any(|(i, &l)| i != l) {
        return None;
    }
    let (first, _) = fused_row(p, st, m);
    let span = Span::default();
    let mut fused = ss.leaves[first];
    for _ in first + 1..n {
        let next = ss.leaves[first + 1];
        let name = format!("{}.{}", ss.ivs[fused].name, ss.ivs[next].name);
        fused = ss.fuse(fused, next, (&name, span), span).expect("adjacent spatial loops");
    }
    (first < n - 1).then_some((fused, first))
}

/// The first axis of the row [`fuse_short_rows`] makes of `st`'s trailing
/// axes, and the row's length (the last axis alone where none fuse). A row
/// of four vectors or more is long enough for an element-wise stage; a
/// reduction's is fused while it would still take a short register block
/// (at most [`MAX_SHORT_VECTORS`] vectors): that block holds few rows of
/// its other operand (a 1 × 1 convolution's rows of 35 on AVX2, five
/// vectors: two filters) and sweeps the whole image once per block of
/// them, where the fused row takes the packed micro-kernel. MEASURED
/// (`x86-avx2`, 1 thread, Zen 4, two runs of three alternated rounds): a
/// 1 × 1 convolution 288 → 64 at 35² 0.91–1.33 ms with rows of 35,
/// 0.45–0.69 fused. So is a float product's row of exactly one vector
/// (not into the outermost axis, which the block's rows need), whose
/// block is one vector a row. MEASURED (Zen 3, `host`, per-nest
/// minima of three profiles in each order, one thread): Inception-v3's
/// 1 × 1 and 3 × 1 convolutions on 8 × 8 maps, rows of 8 → fused rows of
/// 64, 11.4 → 9.5 ms for the twelve (2048 → 448 1.87–1.96 → 1.40–1.47).
/// AVX-512's rows of 8 fuse already (half a vector).
pub(super) fn fused_row(p: &Program, st: &Stage, m: Machine) -> (usize, i64) {
    let n = st.n_axes;
    let mut first = n.saturating_sub(1);
    let Some(mut row) = st.vars.get(first).map(|v| v.extent).filter(|_| n > 0) else { return (0, 1) };
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let reduces = st.vars.len() > n;
    // A float product's row of one vector takes a block of one vector a row
    // (up to twelve filters × one vector on AVX2: a load a row and one for
    // the vector, each step); fused with the axes before it, but for the
    // outermost (the block's rows), it takes the micro-kernel of two
    // vectors.
    let product = || matches!(crate::filters_last::product_body(p, st.value), Some((_, false)));
    let one_vector = |row: i64, first: usize| row == m.lanes && first >= 2 && product();
    let short = |row: i64, first: usize| row < m.lanes || row % m.width_for(row) != 0 || one_vector(row, first);
    let fusable = |row: i64| if reduces { row <= MAX_SHORT_VECTORS * m.lanes } else { row < 4 * m.lanes };
    while first > 0 && short(row, first) && fusable(row) && dense_pair(p, st, &loads, first - 1) {
        first -= 1;
        row *= st.vars[first].extent;
    }
    (first, row)
}

/// Vectors a register block's row may span and stay short: a longer one
/// takes the packed micro-kernel (`blocking::register_block`'s `long`).
pub(super) const MAX_SHORT_VECTORS: i64 = 6;

/// Whether axes `a` and `a + 1` of `st` are one dense axis to every read and
/// appear nowhere but in read indices: each flat offset moves with `a` as
/// with `extent(a + 1)` steps of `a + 1` (the store's does by construction).
fn dense_pair(p: &Program, st: &Stage, loads: &[TExprId], a: usize) -> bool {
    crate::analysis::dense_pair(p, st.value, loads, (a as VarId, a as VarId + 1), st.vars[a + 1].extent)
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
pub(super) fn split_at_row_breaks(
    ss: &mut StageSchedule,
    p: &Program,
    st: &Stage,
    row: usize,
    m: Machine,
) -> Option<usize> {
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

/// A stage that gathers several elements per result along its last axis
/// and reads each of them contiguously along another axis `a`: packing a
/// convolution's input for AMX tiles, `X.q4[n, h, w, c4]` from four
/// channels `X[n, 4·c4 + t, h, w]`, whose vectors along `c4` gathered four
/// bytes per lane from four planes (layer 1 of ResNet-18: 0.27 ms for
/// 54 K words, 25× the same pack in place). Vectors run along `a` instead:
/// each read a contiguous vector, the store one scatter. Applies to
/// integer stages that widen (a pack: each stored element wider than every
/// read one) where every read moves contiguously with `a` and
/// moves, not contiguously, with the last axis,
/// with at least two reads (one read and one store is a transpose, which
/// [`transposing_order`] orders), and `a` fills a vector.
pub(super) fn scattering_order(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) -> bool {
    let Some(last) = st.n_axes.checked_sub(1) else { return false };
    // Measured on packs of bytes only: float stages of this form (a
    // Winograd input transform's) keep their gathers until measured.
    if st.vars.len() != st.n_axes || last == 0 || p.tensor(st.tensor).elem.is_float() {
        return false;
    }
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let coefficient = |l: TExprId, v: usize| {
        let TExpr::Load(t, idx) = p.expr(l) else { return None };
        crate::analysis::flat_coefficient(p, *t, idx, v as VarId)
    };
    // A pack stores words wider than what it reads: a residual of two
    // filters-last byte tensors stored as bytes (ResNet-50 int8's last
    // stage) scattered one byte per lane, 3× its gathers' time.
    let width = p.tensor(st.tensor).elem.size();
    let widens = loads.iter().all(|&l| !matches!(p.expr(l), TExpr::Load(t, _) if p.tensor(*t).elem.size() >= width));
    let gathered =
        widens && loads.len() >= 2 && loads.iter().all(|&l| coefficient(l, last).is_some_and(|c| c.abs() > 1));
    let a =
        (0..last).rev().find(|&a| st.vars[a].extent >= m.lanes && loads.iter().all(|&l| coefficient(l, a) == Some(1)));
    let Some(a) = a.filter(|_| gathered) else { return false };
    let leaf = ss.leaves[a];
    let order: Vec<usize> = ss.leaves.iter().copied().filter(|&l| l != leaf).chain([leaf]).collect();
    ss.reorder(&order, Span::default()).expect("a permutation of the leaves");
    vectorize_inner(ss, leaf, m).is_some()
}

/// A stage that transposes (`T[q, c, k] = A[k, c, q]`, a Winograd filter
/// transform writing `U[i, j, c, k]` from `Wt[k, c, r, s]`) gathers each
/// vector from as many cache lines as it has lanes. In the axes' order the
/// next vector moves along `q` to other lines, and those lines are read
/// again only a whole pass of the gathered tensor later: from memory, and
/// at power-of-two strides from lines that evict each other. So the row is
/// split by the vector width with its outer loop outermost, and the other
/// axes follow by their stride in the gathered tensor, largest first (those
/// it does not move with innermost, or outermost where blocks along the
/// lines are made, which must sit around the vector loop): within one
/// block of lanes the loops walk each lane's line in order, and consecutive
/// vectors reuse them from
/// L1. Applies where the gathered tensor is larger than the target's L1
/// data cache (smaller ones stay in L1 in any order) and its lanes are a
/// cache line or more apart. MEASURED (Zen 4, AVX-512, 1 thread): the copy
/// back of ResNet-50's 512 → 2048 filters-last at 7 × 7, with its bias,
/// residual and ReLU, `[1, 49, 2048]` → `[1, 2048, 7, 7]`: 0.264 ms in the
/// axes' order (its 49 positions are 3 blocks of 16 lanes and one of 1,
/// too few for two cores), 0.022 with the blocks of 16 filters outermost.
pub(super) fn transposing_order(
    ss: &mut StageSchedule,
    p: &Program,
    st: &Stage,
    m: Machine,
    (row, first_row_axis): (usize, usize),
) -> bool {
    const LINE: u64 = crate::strategy::LINE as u64;
    let l1 = m.caches.l1d as u64;
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
            if stride.saturating_mul(d.elem.size() as u64) < LINE || bytes <= l1 {
                return None;
            }
            let strides = (0..first_row_axis)
                .map(|a| {
                    Some((crate::analysis::flat_coefficient(p, *t, idx, a as VarId)?.unsigned_abs(), ss.leaves[a]))
                })
                .collect::<Option<Vec<_>>>()?;
            Some((bytes, strides, d.elem.size()))
        })
        .max_by_key(|(bytes, ..)| *bytes);
    let Some((_, mut others, elem_bytes)) = gathered else { return false };
    let lanes = m.width_for(ss.ivs[row].extent);
    if lanes <= 1 || others.is_empty() {
        return false;
    }
    // Stable: axes of equal stride keep their order.
    others.sort_by_key(|&(stride, _)| std::cmp::Reverse(stride));
    // The axis the lines run along, cut into blocks of lanes transposed in
    // registers ([`unroll_along_lines`]), where its elements are words
    // and it has a block of lanes: the last the tensor moves with (an axis
    // it does not, such as a batch of one read at a literal `0`, has stride
    // 0 and sorts after it by stride, changing no line). Without such
    // blocks, those axes stay unrolled innermost (below).
    let along = others
        .iter()
        .rev()
        .find(|&&(stride, _)| stride != 0)
        .filter(|&&(stride, _)| stride == 1 && elem_bytes == 4 && (LINE as i64) % (lanes * 4) == 0)
        .filter(|&&(_, l)| ss.ivs[l].extent >= lanes)
        .map(|&(_, l)| l);
    // The blocks of lanes become the outer loop: with a partial block it is
    // not fused with the next, and is all the parallel work there is, so
    // its full blocks must give every core two. Where they do not (a
    // filters-last product's copy back over a 7 × 7 map: AVX-512's 3 blocks
    // of 16 lanes and one of 1), the blocks along the lines run outermost
    // instead, if they give every core two.
    let extent = ss.ivs[row].extent;
    let lane_blocks_share = extent % lanes == 0 || m.two_per_core(extent / lanes);
    let line_blocks_share = along.is_some_and(|a| m.two_per_core(ss.ivs[a].extent / lanes));
    if !lane_blocks_share && !line_blocks_share {
        return false;
    }
    if along.is_some() {
        // Outside the blocks, which must sit just around the vector loop;
        // stable, so the rest keep their order by stride.
        others.sort_by_key(|&(stride, _)| stride != 0);
    }
    let span = Span::default();
    let (o, v) = vectorize_inner(ss, row, m).expect("a vector width");
    let order: Vec<usize> = std::iter::once(o).chain(others.iter().map(|&(_, l)| l)).chain([v]).collect();
    ss.reorder(&order, span).expect("a permutation of the leaves");
    if let Some(along) = along {
        let blocks = unroll_along_lines(ss, (o, along, v), lanes, LINE as i64 / (lanes * 4));
        if let Some(blocks) = blocks.filter(|_| !lane_blocks_share) {
            let order: Vec<usize> =
                std::iter::once(blocks).chain(ss.leaves.iter().copied().filter(|&l| l != blocks)).collect();
            ss.reorder(&order, span).expect("a permutation of the leaves");
        }
        return true;
    }
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

/// The axis `along` the gathered tensor's lines run (its stride there is
/// one element) split by the vector width, the inner loop unrolled, just
/// outside the vector loop: each `lanes × lanes` block of the gathered
/// tensor is then read as `lanes` contiguous vectors and transposed in
/// registers (`texc_codegen`'s `transposed_copies`) instead of gathered
/// once per copy. Elements of four bytes (`f32`, `i32`). Where a vector is
/// less than a cache line (`per_line` vectors a line: AVX2's 8 lanes, 2),
/// that many blocks of lanes (`o`) run inside the block along the lines
/// (just outside the vector loop `v`),
/// so that the stores fill each line of the output before moving on.
/// MEASURED (Zen 4, one thread, `Y[i, j] = X[j, i]` of 1024 × 512 `f32`):
/// AVX-512 0.209 → 0.106 ms; AVX2 0.356 → 0.278 with pairs of blocks of 8
/// lanes, 0.391 with blocks alone (half lines stored 4 KiB apart).
/// Returns the loop over the blocks along the lines, where it split one.
fn unroll_along_lines(
    ss: &mut StageSchedule,
    (o, along, v): (usize, usize, usize),
    lanes: i64,
    per_line: i64,
) -> Option<usize> {
    if ss.ivs[along].extent < lanes {
        return None;
    }
    let span = Span::default();
    let name = ss.ivs[along].name.clone();
    let (ao, ai) =
        ss.split(along, lanes, (&format!("{name}.o"), span), (&format!("{name}.i"), span), span).expect("fresh names");
    ss.annotate(ai, ForKind::Unrolled, span).expect("spatial");
    if per_line < 2 || ss.ivs[o].extent < per_line {
        return Some(ao);
    }
    let oname = ss.ivs[o].name.clone();
    let (_, oi) =
        ss.split(o, per_line, (&format!("{oname}.o"), span), (&format!("{oname}.i"), span), span).expect("fresh");
    let inner = [ao, oi, ai];
    let order: Vec<usize> =
        ss.leaves.iter().copied().filter(|l| !inner.contains(l) && *l != v).chain(inner).chain([v]).collect();
    ss.reorder(&order, span).expect("a permutation of the leaves");
    Some(ao)
}
