//! The default GPU schedule: a grid over each stage's elements, with
//!
//! - a block per row for an element-wise stage and the statistics of its
//!   rows (a softmax, a normalization), computed into shared memory where
//!   its block opens ([`rows`]);
//! - f16 and bf16 matrix products on tensor cores, through shared memory
//!   where the tiles divide them ([`tensor_cores`]);
//! - other contractions in 4×4 register tiles per thread, and few long
//!   reductions a block each ([`tiles`]);
//! - everything else fused into one loop over blocks of [`GPU_THREADS`]
//!   threads, 16-byte accesses where the reads are dense.
//!
//! Invariants: consecutive threads take consecutive elements of the
//! innermost axis (their accesses coalesce); thread loops are whole warps
//! where a reduction runs over them; stage indices of row groups are taken
//! before operands' copies are inserted, and copies are inserted last
//! first.

mod model;
mod rows;
mod tensor_cores;
mod tiles;

use super::{preparation, Strategy};
use crate::ir::{ForKind, GpuDim};
use crate::knobs::{DefaultKnobs, Family};
use crate::prepare::Step;
use crate::schedule::{Schedules, StageSchedule};
use rows::{attach_row_group, block_per_row, row_groups};
use tensor_cores::{
    pipelined_gemm, shared_gemm_tiles, stage_gemm_operands, tensor_core_gemm, tensor_core_operands, wgmma_gemm,
    wgmma_tiles,
};
use texc_compiler::rewrite::Model;
use texc_compiler::target::Target;
use texc_compiler::tir::Program;
use texc_grammar::Span;
use tiles::{block_per_element, gpu_vector_lanes, register_tiled};

/// The default schedule of GPU targets.
pub(super) struct Gpu;

impl Strategy for Gpu {
    fn family(&self) -> Family {
        Family::Gpu
    }

    fn name(&self) -> &'static str {
        "gpu"
    }

    fn preparation(&self) -> &'static [Step] {
        &PREPARATION
    }

    fn performance(&self, _: &Target) -> Model {
        std::sync::Arc::new(model::GpuModel)
    }

    fn schedule(&self, p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules {
        gpu_schedule(p, target.gpu.map_or(0, |g| g.sm), knobs)
    }
}

/// Row reductions are not factored into vector-width partial results: a
/// GPU's rows are reduced by a block's threads, not by vector lanes.
const PREPARATION: [Step; 6] = [
    Step { name: "one-hot-gathers", run: preparation::one_hot_gathers },
    Step { name: "inline-elementwise", run: preparation::inline_elementwise_step },
    Step { name: "hoist-reductions", run: preparation::hoist_reductions_step },
    Step { name: "simplify-div-mod", run: preparation::simplify_div_mod },
    Step { name: "fold-conditions", run: preparation::fold_conditions },
    Step { name: "im2col", run: im2col },
];

/// *im2col* (GPUs): convolutions whose tiles fit as tensor-core products.
fn im2col(p: &mut Program, _: &Target, _: DefaultKnobs) {
    crate::im2col::convolutions_to_gemm(p);
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
fn gpu_schedule(p: &mut Program, sm: u32, knobs: DefaultKnobs) -> Schedules {
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
            if let Some(tiles) = wgmma_tiles(&gemm, sm, knobs) {
                wgmma_gemm(ss, tiles, gemm.op);
                staged.push((si, gemm, tiles));
                continue;
            }
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
