//! Products over short rows computed with their filters innermost: a
//! TIR-to-TIR pass for CPU targets, after [`crate::dot4`].
//!
//! The default schedule runs a product's vectors along its row: its last
//! axis, a convolution's output row `x` of `Y[n, f, y, x]`, with the axes
//! before it fused where every read walks them densely (a 1×1
//! convolution's `h, w`). On a 7×7 map a 3×3 convolution's row is 7 lanes of
//! a 16-lane `vpdpbusd` (MEASURED: ResNet-18's last stage in int8 ran at
//! 385 GOP/s, against 960 for the same layer at 56×56, a third of the
//! model's time); a 17-wide row is 16 lanes and 1 (Inception-v3's 1×7
//! convolutions at 17×17). Where the row fills less than [`MIN_FILL`] of
//! its vectors and another axis `f` fills them well, and the product's
//! operands that move along the row do not move along `f` (the input, which
//! the filters then share), the stage computes `Y.t[n, y, x, f]` — its
//! value unchanged, its axes reordered so that `f` is last — and the
//! original stage becomes a copy, `Y[n, f, y, x] = Y.t[n, y, x, f]`. The
//! operands that move along `f` (the filters `W[f, c, r, s]`, or the packed
//! `W.q4`) are read from a copy with that dimension last (`W.f[c, r, s, f]`),
//! made by a stage of its own: only constants (folded, so moved once) and
//! `@dot4`'s and `@dot2`'s packed operands (made on every call anyway) are moved; the
//! copy drops dimensions of one element (a 1×1 convolution's `W.f[c, f]`).
//! The register block then runs vectors along `f`, rows along `x`, and
//! packs the filters into panels, as for a matrix product. A grouped
//! convolution's input reads `f` only through its group (`X[n, k / Kg ·
//! Cg + c, ..]`): where a group is whole vectors of filters
//! ([`per_group`]), a vector of a group's filters reads one element of
//! it, a broadcast too
//! (RegNetX-400MF's groups of 16 at 7², 7 of AVX-512's 16 lanes as
//! written: 0.11–0.13 → 0.064–0.072 ms each, Zen 4, 1 thread). Where every
//! operand reads the row's two axes `y, x` as one (a 1×1 convolution's
//! input `X[n, c, y, x]`), they merge: `Y.t[n, y * W + x, f]`, whose
//! block's rows run over the whole map, so each panel of filters is read
//! once per block of rows, not once per image row (MEASURED, 2048 → 512
//! filters on a 7×7 map: 1.35 ms per image row, 0.68 over the map).
//!
//! The copy back is a pass over the output: a float product is computed so
//! only where each output sums at least [`MIN_FLOAT_DEPTH`] products and
//! the row idles an eighth of its lanes or more ([`FLOAT_FILL`]), or the
//! row is a whole map whose channels' rows are not whole cache lines (a
//! 1 × 1 convolution at 14 × 14: [`map_bytes_split_lines`]); an
//! integer product where the row fills less than [`MIN_FILL`]. The copy
//! stays a pass of its own, walking its
//! source's lines once, where its source has more lines than L1 holds and
//! its reader walks another tensor along its rows (not inlined:
//! `strategy::preparation`), and is not computed in parts inside its
//! reader where each part would gather a part of every line
//! (`strategy::cpu::attach`).
//! Integer products have no other plan (the importer writes them
//! as one statement; f32 convolutions also have the e-graph's
//! `conv2d_im2col_t`), and are moved whatever their depth. An integer
//! product the caller names as `wanted` — the top of a chain
//! [`crate::channels_last`] stored channels last, whose reader walks the
//! filters innermost — is computed filters-last whatever its row, and
//! where every read of it walks `f` so, the copy back is inlined into its
//! readers, which then read `Y.t` as it is stored. A float product named
//! `wanted` — an edge of a float region `channels_last` stored channels
//! last: the expansion that makes its channels, the projection that sums
//! over them — is computed filters-last whatever its row and depth (the
//! expansion's copy back inlined so; the projection's, if any, is a pass
//! `channels_last` weighed), and its rows merge where its operand stores
//! them as two adjacent dimensions anywhere (`X[n, y, x, c]`).
//!
//! Invariants: the program computes the same values (the same expression
//! per output element, each written once; the copies move values only);
//! stages stay in an order where every tensor is written before it is read;
//! operator records' stage ranges move with the inserted stages.

use crate::analysis::involves;
use crate::normalize::{fresh_name, replace_node, subst};
use crate::prepack::insert_stage;
use crate::strategy::Reads;
use std::collections::HashMap;
use texc_compiler::ops::{BinOp, Intrinsic, ReduceOp};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

/// The share of its vectors' lanes below which an integer product's row
/// is short (7 of 16: 0.44), and above which an axis fills them well
/// (float products: [`FLOAT_FILL`]). A map shorter still (3×3: 9 of 16)
/// merges into one axis of the filters-last product ([`merged_rows`]).
pub const MIN_FILL: f64 = 0.75;

/// The fill up to which a float product's row is computed filters-last:
/// an eighth of the lanes idle, or more. Its filters' panel
/// is read once per block of positions and the block's rows are
/// broadcasts, so the row's length no longer sets the lanes; what it costs
/// is the copy back, a pass over the output. MEASURED (AVX-512, 1 thread,
/// SqueezeNet's 3×3 convolutions, from 16 → 64 filters at 55×55 to 64 →
/// 256 at 13×13, rows of 0.81–0.86): 0.39–0.46 → 0.29 ms each, ONNX
/// Runtime's 0.31, the copy 0.03–0.06; Inception-v3's 80 → 192 at 71×71
/// (rows of 0.89): 11.5 → 13.2 ms, hence the bound. Rows of exactly 7/8
/// (56 of 64, 28 of 32, 14 of 16, AVX2's 7 of 8) are taken since
/// DenseNet-121's 128 → 32 at 56² stopped being Winograd on a 2 MiB L2
/// (`strategy::cpu::model`): alone 1.75 → 1.32 ms (1 thread); DenseNet-121
/// on `host` 51.4 → 47.7 ms at 1 thread, 30.3 → 27.7 at 2, `x86-avx512`
/// 52.2 → 49.5, `x86-avx2` 77.4 → 75.2 (its 7 × 7 layers); GoogLeNet's
/// 16 → 32 at 28² 0.061 → 0.045–0.050 ms with the copy back, 16 → 48 at
/// 14² 0.027 → 0.018; Inception-v3 on `x86-avx2` (5 × 5 convolutions 48 →
/// 64 at 35², rows of 35 in 40 lanes) 144.7 → 141.2 ms. On AVX2's 7 × 7
/// maps with constant filters (single layers, bias and ReLU): 128 → 32
/// 0.081 → 0.058 ms, 512 → 128 1.21 → 0.89, 256 → 256 0.84 → 0.86; on
/// `cranelift`'s 4-lane vectors 1.16 → 0.21 ms (64 → 48), 17.2 → 7.7 (256
/// → 256). Against: filters that are arguments, not constants, on AVX2's
/// 7 × 7 (a `.tex` kernel): 64 → 48 0.037 → 0.050, 256 → 256 2.05 → 2.30.
///
/// A 1×1 convolution's 7 × 7 map, its two axes one row of 49 (AVX2: 49 of
/// 56 lanes; AVX-512: 49 of 64), is computed so too, its rows over the
/// whole map: with slices of the sum that keep all 49 rows in L1 where a
/// register block's step would otherwise wait on L2 (AVX2's; AVX-512's
/// longer steps do not: `strategy::cpu::blocking`,
/// `LongBlocking::whole_rows_slice`, `step_outruns_l2`) and the
/// copy back walking the transposed lines in order
/// (`strategy::cpu::vectorize::transposing_order`). MEASURED (Zen 3, AVX2,
/// 1 thread, one layer with bias, ReLU and, where marked, a residual add;
/// as written → filters-last, ONNX Runtime beside): 2048 → 512 1.54 →
/// 1.18 ms (1.17), 512 → 2048 + residual 1.56 → 1.35 (1.22), 440 → 440 +
/// residual 0.28 → 0.25 (0.24), 1152 → 320 0.54 → 0.41 (0.42), 320 → 1280
/// 0.61 → 0.47 (0.47), 960 → 160 0.22 → 0.17 (0.18), 160 → 960 0.20 →
/// 0.18 (0.19). On AVX-512 (Zen 4, 1 thread, the same layers, ONNX
/// Runtime's AVX-512 code beside): 0.94–1.14× ORT, the product of 512 →
/// 2048 at 105 GFLOP/s of the core's 117, once its copy back walks blocks
/// of 16 filters outermost (3 blocks of 16 positions and one of 1 do not
/// share out between two cores): 0.264 → 0.022 ms, the layer 0.76× →
/// 0.95× ORT. (Before the slices and the ordered copy, AVX-512 measured
/// the other way — 512 → 2048 1.16 ms filters-last against 0.90 as
/// written.)
pub const FLOAT_FILL: f64 = 0.875;

/// Products per output from which a float product is computed
/// filters-last: the copy back is a pass over the output (SqueezeNet's
/// 16 → 64 filters sums 144).
pub const MIN_FLOAT_DEPTH: i64 = 128;

/// Compute every short-row product of `p` filters-last; the number of
/// stages changed. `movable` says which operands may be copied with a
/// dimension moved last: those a copy costs nothing per run (constants,
/// folded), or `@dot4`'s packed operands (made on every call anyway);
/// `wanted`, which products' readers want them filters-last.
pub fn filters_last(
    p: &mut Program,
    target: &Target,
    movable: &dyn Fn(TensorId) -> bool,
    wanted: &dyn Fn(TensorId) -> bool,
) -> usize {
    if target.kind != TargetKind::Cpu {
        return 0;
    }
    let mut made: Vec<(TensorId, usize, TensorId)> = Vec::new();
    let mut changed = 0;
    // Who reads what, kept up to date: a wanted product's readers are
    // looked up, not found by a walk of every stage (quadratic in a
    // model's blocks).
    let mut reads = Reads::of(p);
    let mut dead = vec![false; p.stages.len()];
    let mut si = 0;
    while si < p.stages.len() {
        // A convolution of one group reads channel `k / K * Cg + c`, which
        // involves the filter `k` until simplified to `c`.
        if product_body(p, p.stages[si].value).is_some() {
            crate::normalize::simplify_div_mod(p, si);
            reads.refresh(p, si);
        }
        // AMX tiles need no vectors along the rows: their layout stays.
        let tiled = target.has_amx_int8() && crate::dot4::reads_tiles(p, si);
        let wants = wanted(p.stages[si].tensor);
        if let Some((f, merged, read_so)) = long_axis(p, &reads, si, target, movable, wants).filter(|_| !tiled) {
            let (at, before) = (si, p.stages.len());
            si = rewrite(p, si, f, merged, Some(&mut made));
            let inserted = p.stages.len() - before;
            reads.inserted_run(p, at, inserted);
            dead.splice(at..at, std::iter::repeat_n(false, inserted));
            reads.refresh(p, si);
            if read_so {
                // Its readers walk the filters innermost: they read `Y.t` as
                // it is stored. The copy back is dropped with the others at
                // the end (removed here, it would move every later stage).
                let t = p.stages[si].tensor;
                let readers: Vec<usize> = reads.readers_after(si, t).collect();
                crate::normalize::inline_stage_in_place(p, si, &readers);
                reads.inlined_in_place(si, t);
                dead[si] = true;
            }
            changed += 1;
        }
        si += 1;
    }
    crate::prepack::drop_stages_of_ops(p, &dead);
    debug_assert!(reads.dropped(&dead) == Reads::of(p), "filters-last kept its index of reads up to date");
    changed
}

/// Whether a float row of `row` elements leaves enough of its vectors'
/// `lanes` idle to be computed filters-last: an eighth or more
/// ([`FLOAT_FILL`]).
fn idles_lanes(row: i64, lanes: i64) -> bool {
    fill(row, lanes) <= FLOAT_FILL
}

/// Whether a product over a map of `H × W` positions (its last two axes)
/// reads its operand's rows at offsets that are not whole cache lines: a
/// 1 × 1 convolution's input `X[n, c, y, x]` has a row of `H·W` elements
/// per channel, and where that is not a multiple of a line (14 × 14 floats:
/// 784 bytes), most vectors of the register block's in-place panel (two
/// vectors along the map, read across the channels) straddle two lines.
/// Computed filters-last instead, the filters are packed into panels and
/// the map's positions are broadcasts, with no lanes left over either
/// (14 × 14: 196 positions in 13 vectors of 16, the last of 4). Taken for
/// whole maps only: where the rows merge ([`merged_rows`]), or where the
/// default row is the map already, a window along its columns only over an
/// input without padding along its rows (a 7 × 1 convolution's `Xp[n, c, h
/// + r, w]`, its positions then the image's rows of `w`, not merged); a 3 ×
/// 3 convolution's padded rows are another case (Inception-v3's 80 → 192
/// at 71 × 71, rows of 0.89, ran slower filters-last; see [`FLOAT_FILL`]).
/// MEASURED (1 thread, Zen 4, one layer with bias and ReLU, as written →
/// filters-last; `x86-avx2` / `host` with AVX-512): 512 → 1024 at 14²
/// 2.17 → 1.95 / 2.08 → 1.86 ms (ONNX Runtime 1.84), 1024 → 256 at 14²
/// 1.09 → 0.97 / 1.04 → 0.89, 256 → 1024 at 14² 1.03 → 0.97 / 1.03 →
/// 0.91, 768 → 192 at 17² 0.95 → 0.84 / 0.93 → 0.75, 288 → 64 at 35²
/// 0.48 → 0.43 / 0.42 → 0.40, 512 → 64 at 13² 0.120 → 0.099 / 0.139 →
/// 0.097. Maps of whole lines stay as written: 256 → 64 at 56² 1.06 →
/// 1.14 / 0.91 → 0.91 and 128 → 512 at 28² 0.99 → 1.02 / 0.94 → 0.95
/// filters-last. The 7 × 1 windows, MEASURED (Zen 3, `host`, 1 thread,
/// per-nest minima of three profiles, both orders): Inception-v3's
/// thirteen 7 × 1 convolutions at 17² (128 to 192 channels, fused rows of
/// 289 at 74–85 % of the peak) 17.7 → 16.0–16.5 ms (192 → 192: 1.76–1.83
/// → 1.60–1.69), the copies that then read them transposed (padding,
/// concatenation) 0.04–0.3 ms more; at two threads 1.08–1.10 → 0.92–0.96
/// ms each.
///
/// A vector of `B` bytes (at most a line) straddles lines somewhere along
/// such rows exactly where a row's bytes are not a multiple of `B`: the
/// rows of the operand read along the map (its elements' size, not the
/// product's) are taken, at the target's `lanes`. (`cranelift`'s 16-byte
/// vectors never straddle 784-byte rows.) `loads`: the loads of the
/// product's body.
fn map_bytes_split_lines(p: &Program, st: &Stage, loads: &[TExprId], lanes: i64) -> bool {
    let Some(y) = st.n_axes.checked_sub(2) else { return false };
    let map = st.vars[y].extent * st.vars[y + 1].extent;
    loads.iter().any(|&l| match p.expr(l) {
        TExpr::Load(t, _) if involves(p, l, y as VarId) => {
            let elem = p.tensor(*t).elem.size() as i64;
            (map * elem) % vector_bytes(lanes, elem) != 0
        }
        _ => false,
    })
}

/// Whether the operands a product reads through its fused map (its last
/// two axes `y, x`, its default row), unit-stride along `x`, have rows or
/// channels that are not whole vectors: a 7 × 1 window's `Xp[n, c, h + r,
/// w]` over 23 × 17 floats, 68 bytes a tap and 1564 a channel apart, its
/// register block's vectors straddling lines at most steps. (`x` read at a
/// stride, `2 · x + s`, is left as written: unmeasured.)
fn window_lines_split(p: &Program, st: &Stage, loads: &[TExprId], lanes: i64) -> bool {
    let Some(y) = st.n_axes.checked_sub(2) else { return false };
    let (yv, xv) = (y as VarId, (y + 1) as VarId);
    let mut along = loads.iter().copied().filter(|&l| involves(p, l, yv) || involves(p, l, xv)).peekable();
    along.peek().is_some()
        && along.all(|l| {
            let TExpr::Load(t, idx) = p.expr(l) else { return false };
            let shape = &p.tensor(*t).shape;
            let elem = p.tensor(*t).elem.size() as i64;
            let unit = idx
                .last()
                .and_then(|&i| texc_compiler::affine::affine_in_vars(p, i))
                .is_some_and(|f| f.coeff(&xv) == 1);
            let vector = vector_bytes(lanes, elem);
            let row = shape.last().copied().unwrap_or(1) * elem;
            let plane = shape.iter().rev().take(2).product::<i64>() * elem;
            unit && shape.len() >= 2 && (row % vector != 0 || plane % vector != 0)
        })
}

/// The bytes of a vector of `lanes` elements of `elem` bytes, at most a
/// cache line (the span a load may straddle lines within).
fn vector_bytes(lanes: i64, elem: i64) -> i64 {
    (lanes * elem).min(crate::strategy::LINE)
}

/// How many of `vectors` of `lanes` a row of `extent` fills.
pub(crate) fn fill(extent: i64, lanes: i64) -> f64 {
    extent as f64 / ((extent + lanes - 1) / lanes * lanes) as f64
}

/// The row's axes `(y, x)` that merge into one, if they do ([`merged_rows`]).
type Rows = Option<(usize, usize)>;

/// The axis `f` to put last in stage `si`, if the stage is a short-row
/// product (see the module header), the row's axes that merge, and whether
/// the product is `wants`ed and every reader walks `f` innermost (its copy
/// back then inlined).
fn long_axis(
    p: &Program,
    reads: &Reads,
    si: usize,
    target: &Target,
    movable: &dyn Fn(TensorId) -> bool,
    wants: bool,
) -> Option<(usize, Rows, bool)> {
    let st = &p.stages[si];
    let last = st.n_axes.checked_sub(1)?;
    let (body, dot4) = product_body(p, st.value)?;
    // The copy back is a pass over the output: a float product pays for it
    // only where each output sums many products. (Checked before the row,
    // whose default schedule costs more to find.)
    // A product `wants`ed (its operand or its readers stored channels
    // last) is computed filters-last whatever its depth and row.
    let depth: i64 = st.vars[st.n_axes..].iter().map(|v| v.extent).product();
    if last == 0 || (!dot4 && !wants && depth < MIN_FLOAT_DEPTH) {
        return None;
    }
    let elem = if dot4 { ElemType::I32 } else { p.tensor(st.tensor).elem };
    let lanes = target.lanes(elem) as i64;
    let row = crate::strategy::default_row(p, target, si);
    let row_fill = fill(row, lanes);
    // A reader stored channels last wants the filters last whatever the row.
    let wanted = wants.then(|| (0..last).find(|&f| read_along_f(p, reads, st.tensor, f))).flatten();
    // A float product is wanted for its region's layout; an integer one
    // for a reader that walks its filters (its copy back then inlined).
    let forced = if dot4 { wanted.is_some() } else { wants };
    let idles = idles_lanes(row, lanes);
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, body, &mut loads);
    // A float product whose map's lines split (checked below, once the
    // rows are known to merge or the default row is the whole map) is
    // taken whatever its fill.
    let may_split = !dot4 && map_bytes_split_lines(p, st, &loads, lanes);
    if !idles && !forced && !may_split {
        return None;
    }
    let x = last as VarId;
    let f = (0..last).rev().find(|&f| {
        let (fv, ext) = (f as VarId, st.vars[f].extent);
        // A grouped convolution's input reads the filter only as its group
        // (`X[n, k / Kg · Cg + c, ..]`): one value across a vector of
        // filters within a group, a broadcast like an ungrouped input's.
        let by_group = |l: TExprId| !dot4 && per_group(p, l, fv, ext, lanes);
        let along_f: Vec<TExprId> = loads.iter().copied().filter(|&l| involves(p, l, fv) && !by_group(l)).collect();
        ext >= lanes
            && fill(ext, lanes) >= MIN_FILL
            && !along_f.is_empty()
            && loads.iter().all(|&l| !(involves(p, l, x) && involves(p, l, fv)) || by_group(l))
            && along_f.iter().all(|&l| alone_at(p, l, fv).is_some())
            && along_f.iter().all(|&l| {
                // Read with `f` last already, or copied so: constants (and
                // `@dot4`'s packed operands) only.
                let TExpr::Load(t, idx) = p.expr(l) else { return false };
                alone_at(p, l, fv) == Some(idx.len() - 1) || dot4 || movable(*t)
            })
    })?;
    // A float product idles an eighth of its lanes or more (checked above),
    // or is a whole map's product whose lines split: its rows merge, or its
    // default row is the whole map already (a 7 × 1 convolution's `Xp[n, c,
    // h + r, w]`, its rows fused where its input has no padding along them).
    let merged = merged_rows(p, st, f, !dot4);
    let map = last.checked_sub(1).map_or(0, |y| st.vars[y].extent * st.vars[last].extent);
    let fused_map = map > st.vars[last].extent && row == map && window_lines_split(p, st, &loads, lanes);
    if !dot4 && !idles && !forced && merged.is_none() && !(may_split && fused_map) {
        return None;
    }
    let takes = !dot4 || row_fill < MIN_FILL || wanted == Some(f);
    takes.then_some((f, merged, wanted == Some(f)))
}

/// Whether load `l` reads the filter axis `f` (of `ext` filters) only
/// through its group, `f / g`, with groups of whole vectors of `lanes`:
/// each vector of filters then lies in one group and reads one element of
/// it, `(8·o + v) / 24` simplified to `o / 3` (`index::exact_div_mod`), and
/// a long row's micro-kernel takes as many vectors as divide a group
/// (`blocking::within_group`).
pub(crate) fn per_group(p: &Program, l: TExprId, f: VarId, ext: i64, lanes: i64) -> bool {
    let group = crate::strategy::cpu::blocking::through_group(p, &[l], f);
    matches!(group, Some(Some(g)) if g < ext && ext % g == 0 && g % lanes == 0)
}

/// The axis along which stage `si`, a product, would be computed
/// filters-last if [`crate::channels_last`] stored its readers or its
/// operand channels last (it is then `wanted`), if it would be.
pub(crate) fn wanted_axis(
    p: &Program,
    reads: &Reads,
    si: usize,
    target: &Target,
    movable: &dyn Fn(TensorId) -> bool,
) -> Option<usize> {
    long_axis(p, reads, si, target, movable, true).map(|(f, _, _)| f)
}

/// Whether temporary `t` is read, and every read of it indexes its
/// dimension `f` by the reader's innermost axis alone: readers stored
/// channels last ([`crate::channels_last`]), which read a product computed
/// filters-last contiguously, and its copy back across its rows. (Asked
/// only of the products that pass returns.)
fn read_along_f(p: &Program, reads: &Reads, t: TensorId, f: usize) -> bool {
    let innermost_at_f = |st: &Stage, l: TExprId| {
        let inner = st.n_axes.checked_sub(1).map(|v| v as VarId);
        inner.and_then(|v| alone_at(p, l, v)) == Some(f)
    };
    p.tensor(t).role == TensorRole::Temp && reads.every_read(p, t, innermost_at_f)
}

/// The body of the stage's sum of products — of `@dot4`s or `@dot2`s (`true`), or of
/// two loads multiplied, each possibly converted (`false`).
pub(crate) fn product_body(p: &Program, e: TExprId) -> Option<(TExprId, bool)> {
    let strip = |e: TExprId| match p.expr(e) {
        TExpr::Cast(a) => *a,
        _ => e,
    };
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        if let TExpr::Reduce(ReduceOp::Sum, _, body) = p.expr(e) {
            let mut inner = vec![*body];
            while let Some(b) = inner.pop() {
                if matches!(p.expr(b), TExpr::Intrinsic(Intrinsic::Dot4 | Intrinsic::Dot2, _)) {
                    return Some((*body, true));
                }
                inner.extend(p.children(b));
            }
            if let TExpr::Binary(BinOp::Mul, a, b) = *p.expr(*body) {
                let loads = [a, b].map(|x| matches!(p.expr(strip(x)), TExpr::Load(..)));
                if loads == [true, true] {
                    return Some((*body, false));
                }
            }
        }
        stack.extend(p.children(e));
    }
    None
}

/// The dimension of load `l` indexed by `Var(v)` alone, where `v` is in no
/// other index.
pub(crate) fn alone_at(p: &Program, l: TExprId, v: VarId) -> Option<usize> {
    let TExpr::Load(_, idx) = p.expr(l) else { return None };
    let plain = |i: TExprId| matches!(p.expr(i), TExpr::Var(x) if *x == v);
    let d = idx.iter().position(|&i| plain(i))?;
    idx.iter().enumerate().all(|(k, &i)| k == d || !involves(p, i, v)).then_some(d)
}

/// Stage `si` computed filters-last along axis `f`, the row's axes
/// `merged` one, its product's operands read along `f` from copies with
/// that dimension last (cached in `made`), or as they are where `made` is
/// `None` (a caller that packs them itself); the index of its copy stage
/// (the original tensor's writer), after any inserted stages.
pub(crate) fn rewrite(
    p: &mut Program,
    si: usize,
    f: usize,
    merged: Rows,
    mut made: Option<&mut Vec<(TensorId, usize, TensorId)>>,
) -> usize {
    let st = p.stages[si].clone();
    let order: Vec<usize> = (0..st.n_axes).filter(|&d| d != f).chain([f]).collect();
    // Old axis `order[k]` is new axis `k` (the row's two axes one, `p`, where
    // merged); reduction variables follow the axes.
    let n_axes = st.n_axes - merged.is_some() as usize;
    let mut rename: HashMap<VarId, VarId> = HashMap::new();
    let mut exprs: HashMap<VarId, TExprId> = HashMap::new();
    let mut vars: Vec<VarDecl> = Vec::new();
    for &d in &order {
        match merged {
            Some((y, x)) if d == y || d == x => {
                if d == x {
                    continue;
                }
                let (span, pv) = (st.span, vars.len() as VarId);
                let width = st.vars[x].extent;
                let (pe, w) = (p.alloc(TExpr::Var(pv), Ty::Index, span), p.alloc(TExpr::Int(width), Ty::Index, span));
                exprs.insert(y as VarId, p.alloc(TExpr::Binary(BinOp::FloorDiv, pe, w), Ty::Index, span));
                exprs.insert(x as VarId, p.alloc(TExpr::Binary(BinOp::FloorMod, pe, w), Ty::Index, span));
                let name = format!("{}.{}", st.vars[y].name, st.vars[x].name);
                vars.push(VarDecl { name, extent: st.vars[y].extent * width });
            }
            _ => {
                rename.insert(d as VarId, vars.len() as VarId);
                vars.push(st.vars[d].clone());
            }
        }
    }
    for (r, v) in st.vars.iter().enumerate().skip(st.n_axes) {
        rename.insert(r as VarId, vars.len() as VarId);
        vars.push(v.clone());
    }
    let mut value = subst(p, st.value, &exprs, &rename);
    let fv = (n_axes - 1) as VarId;
    let mut si = si;
    if let (Some((body, _)), Some(made)) = (product_body(p, value), made.as_deref_mut()) {
        let mut loads = Vec::new();
        crate::analysis::loads_in(p, body, &mut loads);
        loads.retain(|&l| involves(p, l, fv));
        for l in loads {
            let TExpr::Load(_, idx) = p.expr(l) else { continue };
            let Some(d) = alone_at(p, l, fv).filter(|&d| d + 1 < idx.len()) else { continue };
            let (read, inserted) = read_moved(p, si, l, d, made);
            si += inserted as usize;
            value = replace_node(p, value, l, read);
        }
    }
    let decl = p.tensor(st.tensor).clone();
    let name = fresh_name(p, &format!("{}.t", decl.name));
    let shape: Vec<i64> = vars[..n_axes].iter().map(|v| v.extent).collect();
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape, role: TensorRole::Temp, span: decl.span });
    let t = TensorId(p.tensors.len() as u32 - 1);
    insert_stage(p, si, Stage { tensor: t, vars, n_axes, value, span: st.span });
    si += 1;
    // The original stage copies the result back: `Y[.., f, .., y, x] =
    // Y.t[.., y, x, f]` (`Y.t[.., y * W + x, f]` where the row merged).
    let span = st.span;
    let mut idx: Vec<TExprId> = Vec::new();
    for &d in &order {
        let var = p.alloc(TExpr::Var(d as VarId), Ty::Index, span);
        match merged {
            Some((y, x)) if d == y => {
                let w = p.alloc(TExpr::Int(st.vars[x].extent), Ty::Index, span);
                let row = p.alloc(TExpr::Binary(BinOp::Mul, var, w), Ty::Index, span);
                let xv = p.alloc(TExpr::Var(x as VarId), Ty::Index, span);
                idx.push(p.alloc(TExpr::Binary(BinOp::Add, row, xv), Ty::Index, span));
            }
            Some((_, x)) if d == x => {}
            _ => idx.push(var),
        }
    }
    let copy = p.alloc(TExpr::Load(t, idx), Ty::Elem(decl.elem), span);
    let stage = &mut p.stages[si];
    stage.value = copy;
    stage.vars.truncate(st.n_axes);
    si
}

/// A stage before `at` writing `W.f[.., d_last, d] = W[.., d, .., d_last]`:
/// `w` with dimension `d` moved last, and its other dimensions of one
/// element dropped (a 1×1 convolution's `W.f[c, f]`): a matrix, whose rows
/// the schedule packs into panels as a product's.
/// Load `l` (of a tensor whose dimension `d` moves) read from a copy of
/// its tensor with `d` last: the copy cached in `made`, else made by a
/// stage inserted at `at`; the new load, and whether a stage was inserted.
pub(crate) fn read_moved(
    p: &mut Program,
    at: usize,
    l: TExprId,
    d: usize,
    made: &mut Vec<(TensorId, usize, TensorId)>,
) -> (TExprId, bool) {
    let TExpr::Load(t, idx) = p.expr(l).clone() else { unreachable!("a load") };
    let cached = made.iter().find(|&&(w, dim, _)| w == t && dim == d).map(|m| m.2);
    let moved = cached.unwrap_or_else(|| {
        let m = insert_dim_last(p, at, t, d);
        made.push((t, d, m));
        m
    });
    let index: Vec<TExprId> = kept_dims(&p.tensor(t).shape, d).into_iter().map(|k| idx[k]).collect();
    (p.alloc(TExpr::Load(moved, index), p.ty(l), p.span(l)), cached.is_none())
}

fn insert_dim_last(p: &mut Program, at: usize, w: TensorId, d: usize) -> TensorId {
    let kept = kept_dims(&p.tensor(w).shape, d);
    crate::transpose::insert_permuted(p, at, w, &kept, "f")
}

/// The dimensions of a tensor of `shape` that its copy with `d` moved last
/// keeps, in their order there: all but `d` of more than one element, then `d`.
fn kept_dims(shape: &[i64], d: usize) -> Vec<usize> {
    (0..shape.len()).filter(|&k| k != d && shape[k] != 1).chain([d]).collect()
}

/// The axes `(y, x)` of the row (the stage's last two, neither `f`) that
/// every read walks as one: each load that involves them indexes two
/// adjacent dimensions by exactly `y, x` — its last two unless `anywhere`
/// (float products) — of the stage's extents, and nothing else by them (a
/// 1×1 convolution's input `X[n, c, y, x]`, or `X[n, y, x, c]` stored
/// channels last by [`crate::channels_last`]). Computed
/// filters-last, they are one axis `p = y * W + x` of `Y.t[n, p, f]`: the
/// register block's rows run over the whole map rather than one image row
/// at a time (a 7×7 map: the filters' panels are read once per block of
/// rows of all 49 positions, not once per image row).
fn merged_rows(p: &Program, st: &Stage, f: usize, anywhere: bool) -> Option<(usize, usize)> {
    let x = st.n_axes.checked_sub(1)?;
    let y = x.checked_sub(1)?;
    if f == x || f == y {
        return None;
    }
    let (xv, yv) = (x as VarId, y as VarId);
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, st.value, &mut loads);
    let is = |i: TExprId, v: VarId| matches!(p.expr(i), TExpr::Var(u) if *u == v);
    let walks = |l: TExprId| {
        let TExpr::Load(t, idx) = p.expr(l) else { return false };
        let shape = &p.tensor(*t).shape;
        if !idx.iter().any(|&i| involves(p, i, xv) || involves(p, i, yv)) {
            return true;
        }
        let Some(n) = idx.iter().position(|&i| is(i, yv)) else { return false };
        (anywhere || n + 2 == idx.len())
            && n + 1 < idx.len()
            && is(idx[n + 1], xv)
            && shape[n] == st.vars[y].extent
            && shape[n + 1] == st.vars[x].extent
            && idx
                .iter()
                .enumerate()
                .all(|(k, &i)| k == n || k == n + 1 || (!involves(p, i, xv) && !involves(p, i, yv)))
    };
    loads.iter().all(|&l| walks(l)).then_some((y, x))
}
