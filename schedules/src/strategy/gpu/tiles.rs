//! Stages that neither tensor cores nor a block per row take: contractions
//! in register tiles of 4×4 per thread ([`register_tiled`]), few long
//! reductions a block each ([`block_per_element`]), and the width of the
//! element-wise grid's accesses ([`gpu_vector_lanes`]).
//!
//! Invariants: a grid dimension stays within 65535 blocks along `y` and
//! `z`; a 16-byte access is used only where every tensor the stage reads
//! or writes keeps it aligned.

use super::{fuse_all, over_threads, GPU_THREADS};
use crate::analysis::loads_in;
use crate::ir::{ForKind, GpuDim};
use crate::normalize::{contains_reduce, fresh_name};
use crate::schedule::StageSchedule;
use crate::strategy::uses_var;
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId};
use texc_grammar::Span;

/// Elements per thread of the default GPU schedule's grid over an
/// element-wise stage: 16 bytes of its element (4 floats) where every
/// tensor it reads or writes is 4 bytes wide and walks the innermost axis
/// densely or not at all (its 16-byte vectors then stay aligned: the
/// stage's element count is a multiple of 4 and of a block's threads), and
/// there are at least as many vectors as a block has threads; else 1.
pub(super) fn gpu_vector_lanes(p: &Program, st: &Stage, ss: &StageSchedule, spatial: &[usize]) -> i64 {
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
pub(super) fn register_tiled(p: &Program, st: &Stage, ss: &mut StageSchedule) -> bool {
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
pub(super) const LONG_REDUCTION: i64 = 64;

const FEW_ELEMENTS: i64 = 65536;

/// A reduction stage with few, long reductions (a softmax's or a
/// normalization's rows): one block per element, whose threads each reduce
/// a strided part of it (consecutive threads read consecutive elements),
/// combined by warp shuffles (`crate::cross_thread`). Whether the
/// stage is one (and is now so scheduled).
pub(super) fn block_per_element(ss: &mut StageSchedule) -> bool {
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
