//! Matrix products of f16 (or bf16) matrices into f32, and of 8-bit
//! integer matrices into i32 (`mma.sync` m16n8k32, the second operand
//! `B[k, j]` or a weight `W[j, k]`), on tensor cores:
//! through shared memory, a software pipeline of `cp.async` copies, where
//! the block tiles divide the product ([`pipelined_gemm`]; on sm_90,
//! Hopper's warpgroup operations [`wgmma_gemm`]), else straight from global
//! memory ([`tensor_core_gemm`]). A convolution made a product by the
//! `im2col` step gathers its columns from the image into shared memory
//! instead of writing them out ([`expanding_gather`], knob `gather`).
//!
//! Invariants: a product is taken only where the operation's tiles divide
//! all three extents; each warp's 64×64 tile (each warpgroup's 64 × block
//! columns) keeps its accumulators in registers through the whole
//! reduction.

use crate::ir::{ForKind, GpuDim, MmaOp, TensorOp, WgmmaOp};
use crate::knobs::DefaultKnobs;
use crate::normalize::{fresh_name, inline_stage};
use crate::schedule::{Attach, Schedules, StageSchedule};
use crate::strategy::loads;
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, TensorRole};
use texc_grammar::Span;

/// The tensor-core operations the default GPU schedule uses, by the
/// operands' element types.
const MMAS: [MmaOp; 5] = [
    MmaOp::M16n8k16F16F32,
    MmaOp::M16n8k16Bf16F32,
    MmaOp::M16n8k32S8S32,
    MmaOp::M16n8k32U8S8S32,
    MmaOp::M16n8k32S8U8S32,
];

/// A matrix product of f16 (or bf16) matrices into f32 that tensor cores
/// can run: `C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]))` with extents
/// the operation's tiles divide.
pub(super) struct TensorCoreGemm {
    pub(super) op: MmaOp,
    a: TensorId,
    b: TensorId,
    /// Extents of `i`, `j` and `k`.
    ext: [i64; 3],
}

pub(super) fn tensor_core_operands(p: &Program, st: &Stage) -> Option<TensorCoreGemm> {
    MMAS.into_iter().find_map(|op| tensor_core_operands_of(p, st, op))
}

fn tensor_core_operands_of(p: &Program, st: &Stage, op: MmaOp) -> Option<TensorCoreGemm> {
    let (tm, tn, tk) = op.shape();
    let (ab, acc) = op.types();
    let var = |e: TExprId, v: u32| matches!(p.expr(e), TExpr::Var(x) if *x == v);
    // `A[i, k]` of type `elem`; with `either`, `W[k, i]` too (8-bit
    // fragments take 4 consecutive `k` per register, so a weight stored
    // `W[j, k]` is read as it is).
    let operand = |e: TExprId, rows: u32, cols: u32, elem, either: bool| match p.expr(e) {
        TExpr::Cast(l) => match p.expr(*l) {
            TExpr::Load(t, idx) if p.tensor(*t).elem == elem && idx.len() == 2 => {
                let straight = var(idx[0], rows) && var(idx[1], cols);
                let crossed = either && var(idx[0], cols) && var(idx[1], rows);
                (straight || crossed).then_some(*t)
            }
            _ => None,
        },
        _ => None,
    };
    let either = op.is_integer();
    let b_elem = op.b_type();
    let TExpr::Reduce(texc_compiler::ops::ReduceOp::Sum, _, body) = p.expr(st.value) else { return None };
    let TExpr::Binary(texc_compiler::ops::BinOp::Mul, x, y) = p.expr(*body) else { return None };
    if st.n_axes != 2 || st.vars.len() != 3 || p.tensor(st.tensor).elem != acc {
        return None;
    }
    let (i, j, k) = (0, 1, 2);
    let (a, b) = match (operand(*x, i, k, ab, false), operand(*y, k, j, b_elem, either)) {
        (Some(a), Some(b)) => (a, b),
        _ => (operand(*y, i, k, ab, false)?, operand(*x, k, j, b_elem, either)?),
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
pub(super) fn tensor_core_gemm(ss: &mut StageSchedule, op: MmaOp) {
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
    ss.tensorize = Some(crate::schedule::Tensorize { op: crate::ir::TensorOp::Mma(op), leaves: [ii, ji, ki], span });
}

/// Rows and columns of `C` a block computes through shared memory, the
/// slice of `k` it copies at a time, and the slices in flight; with
/// `wgmma`, the block's warpgroups run Hopper's warpgroup operations.
#[derive(Clone, Copy)]
pub(super) struct GemmTiles {
    block: [i64; 2],
    k_slice: i64,
    stages: i64,
    wgmma: bool,
}

impl GemmTiles {
    /// Threads per block, and the threads along `x` (the rest along `y`,
    /// then `z`): 2×2 warps at most for `mma`, a warpgroup per 64 rows
    /// for `wgmma`.
    fn threads(self) -> (i64, i64) {
        if self.wgmma {
            (WgmmaOp::LANES * self.block[0] / WgmmaOp::M, WgmmaOp::LANES)
        } else {
            (32 * (self.block[0] / WARP_TILE) * (self.block[1] / WARP_TILE), 32)
        }
    }
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
pub(super) fn shared_gemm_tiles(g: &TensorCoreGemm, knobs: DefaultKnobs) -> Option<GemmTiles> {
    let most = knobs.gtile.unwrap_or(2 * WARP_TILE);
    let pick = |n: i64| [2 * WARP_TILE, WARP_TILE].into_iter().find(|&t| t <= most && n % t == 0);
    // Slices of 128 bytes of each row at most: 128 of 8-bit `k`, else 64.
    let (_, _, tk) = g.op.shape();
    let most_k = knobs.gslice.unwrap_or(4 * tk);
    let k_slice = [4 * tk, 2 * tk].into_iter().find(|&s| s <= most_k && g.ext[2] % s == 0)?;
    let stages = knobs.stages.unwrap_or(GEMM_STAGES);
    Some(GemmTiles { block: [pick(g.ext[0])?, pick(g.ext[1])?], k_slice, stages, wgmma: false })
}

/// The tiles of a product on Hopper's warpgroup operations (sm_90 and
/// later, unless knob `wgmma` is 0): as [`shared_gemm_tiles`], each 64
/// rows of the block a warpgroup's (one `wgmma.m64nNk16` per 16 of `k`, N
/// the block's columns), the operands in swizzled rows of 128 bytes where
/// the slice is 64 (`crate::tensorize`).
///
/// Measured on an H200 (2026-11-30, `benches/gpu.py`): the f16 product at
/// 4096³ in 0.365 ms against 0.547 on `mma.sync` (8192³: 2.56 against
/// 3.98 ms; bf16 alike), ResNet-50's 3×3 convolutions at batch 32 1.3× as
/// fast. Without the swizzle it was half as fast as `mma.sync`: no
/// `cp.async` of a warp coalesced (one 32-byte L2 request each).
pub(super) fn wgmma_tiles(g: &TensorCoreGemm, sm: u32, knobs: DefaultKnobs) -> Option<GemmTiles> {
    // 8-bit products stay on `mma.sync` (wgmma's m64nNk32 is not built).
    if sm < 90 || knobs.wgmma == Some(false) || g.op.is_integer() {
        return None;
    }
    shared_gemm_tiles(g, knobs).map(|t| GemmTiles { wgmma: true, ..t })
}

/// A tensor-core product through shared memory (as `benches/hgemm_pipelined.tex`
/// writes it): each block copies its rows of `A` and columns of `B` a slice
/// of `k` at a time into shared memory ([`stage_gemm_operands`]),
/// [`GEMM_STAGES`] slices in flight by default (`pipeline`); its warps take their
/// fragments from there (`ldmatrix`) for 64×64 tiles of `C` whose
/// accumulators stay in registers.
pub(super) fn pipelined_gemm(ss: &mut StageSchedule, t: GemmTiles, op: MmaOp) {
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
    ss.tensorize = Some(crate::schedule::Tensorize { op: crate::ir::TensorOp::Mma(op), leaves: [ii, ji, ki], span });
    ss.pipeline = Some((ko, t.stages, span));
}

/// A product on Hopper's warpgroup tensor cores (as `benches/hgemm_wgmma.tex`
/// writes it): the block's rows in warpgroups of 64 along `thread.y`, each
/// one `wgmma` of 64 × the block's columns × 16 per step of `k`, its
/// operands read from shared memory (copied as for [`pipelined_gemm`],
/// [`stage_gemm_operands`]) through matrix descriptors, its accumulators in
/// registers through the reduction.
pub(super) fn wgmma_gemm(ss: &mut StageSchedule, t: GemmTiles, op: MmaOp) {
    let span = Span::default();
    let n = |s: &'static str| (s, span);
    let split = |ss: &mut StageSchedule, iv: usize, f: i64, o: &'static str, i: &'static str| {
        ss.split(iv, f, n(o), n(i), span).expect("fresh names")
    };
    let (ib, i2) = split(ss, 0, t.block[0], "ib", "i2");
    let (jb, ji) = split(ss, 1, t.block[1], "jb", "ji");
    let (iw, ii) = split(ss, i2, WgmmaOp::M, "iw", "ii");
    let (ko, k2) = split(ss, 2, t.k_slice, "ko", "k2");
    let (kk, ki) = split(ss, k2, WgmmaOp::K, "kk", "ki");
    ss.reorder(&[ib, jb, ko, iw, kk, ii, ji, ki], span).expect("a permutation of the leaves");
    ss.annotate(ib, ForKind::Block(GpuDim::Y), span).expect("spatial");
    ss.annotate(jb, ForKind::Block(GpuDim::X), span).expect("spatial");
    ss.annotate(iw, ForKind::Thread(GpuDim::Y), span).expect("spatial");
    let wg = WgmmaOp { n: t.block[1], ab: op.types().0 };
    ss.tensorize = Some(crate::schedule::Tensorize { op: TensorOp::Wgmma(wg), leaves: [ii, ji, ki], span });
    ss.pipeline = Some((ko, t.stages, span));
}

/// The shared-memory copies of [`pipelined_gemm`]'s operands: `A`'s rows
/// and `B`'s columns of the block, one slice of `k`, computed at `C.ko`
/// by the block's threads together, 16 bytes (8 halves, 16 bytes of 8-bit
/// operands) each at a time, consecutive threads on consecutive 16 bytes
/// of a row.
pub(super) fn stage_gemm_operands(
    p: &mut Program,
    s: &mut Schedules,
    ci: usize,
    g: &TensorCoreGemm,
    t: GemmTiles,
    gather: bool,
) {
    let span = Span::default();
    let ko = s.stages[ci].pipeline.expect("pipelined").0;
    let (threads, along_x) = t.threads();
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
        let lanes = 16 / p.tensor(operand).elem.size() as i64;
        let (chunk, v) = ss.split(c, lanes, (&cv_name.0, span), (&c16_name.0, span), span).expect("fresh");
        // Consecutive threads on consecutive 16 bytes of a row: a warp's
        // copies coalesce, into a padded row or (for `wgmma`) a swizzled one.
        let f_name = sp("f");
        let fused = ss.fuse(r, chunk, (&f_name.0, span), span).expect("adjacent");
        let (o_name, t_name) = (sp("o"), sp("t"));
        let (_, th) = ss.split(fused, threads, (&o_name.0, span), (&t_name.0, span), span).expect("fresh");
        let (yz_name, x_name) = (sp("yz"), sp("x"));
        let (yz, x) = ss.split(th, along_x, (&yz_name.0, span), (&x_name.0, span), span).expect("fresh");
        if t.wgmma {
            // The warpgroups along `y` only, as the product's.
            ss.annotate(yz, ForKind::Thread(GpuDim::Y), span).expect("spatial");
        } else {
            let (z_name, y_name) = (sp("z"), sp("y"));
            let warps_y = t.block[1] / WARP_TILE;
            let (z, y) = ss.split(yz, warps_y, (&z_name.0, span), (&y_name.0, span), span).expect("fresh");
            ss.annotate(z, ForKind::Thread(GpuDim::Z), span).expect("spatial");
            ss.annotate(y, ForKind::Thread(GpuDim::Y), span).expect("spatial");
        }
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
