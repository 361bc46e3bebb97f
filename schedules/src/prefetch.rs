//! Software prefetch of the slices of an input that a parallel loop reads
//! again and again (CPU targets compiled by LLVM).
//!
//! A loop nest whose parallel loop `f` reads an input tensor `W` one slice
//! per run of `Q` consecutive iterations (run `r` reads within elements
//! `[b + r·S, b + (r + 1)·S)`), and reads each slice several times — a
//! direct convolution's panel of filters, read by each row of the output it
//! makes, the rows either the run's iterations or a loop inside them — reads
//! the slice from memory in its first pass, as fast as the arithmetic
//! consumes it, which is faster than memory delivers it; the later passes
//! find it in the L2. In a model the weights come from memory every time
//! (each layer's are read once per inference, and the other layers' evict
//! them), so every first pass waits. This pass spreads the next slice's
//! reads over the whole run: at every step of a serial loop inside `f` (the
//! *spread loop*, `T` steps per iteration of `f`) the iteration prefetches
//! into the L2 its share of the next slice — step `t` of the run's `Q · T`
//! the lines from element `b + (r + 1)·S + t·S / (Q · T)` on. MEASURED
//! (ResNet-50's last 3×3 convolutions, 512 filters at 7×7, 9.4 MB of
//! weights, one thread, in the model): 1.90 → 1.46 ms each.
//!
//! Where the parallel loop's iterations each read a slice that the spread
//! loop's steps cannot take whole (a group of five 113 KB panels, more than
//! half the L2 with the next group, over a block of rows' 35 steps: 8 of a
//! step's 253 lines), the serial loops just inside it walk the runs with
//! it, as one loop: the group's panels one after another, each prefetched
//! while the rows read the one before, if such a plan takes every line
//! (its runs within one iteration of the parallel loop: a run that spans
//! two may span two threads). MEASURED (RegNetY-1.6GF's 888 → 888
//! convolutions at 7 × 7, 3.2 MB of weights, `host`, one thread, in the
//! model): 0.85 → 0.70 ms each.
//!
//! What it takes: `W` an input of the function (temporaries were written
//! by an earlier nest and are likely still cached); its offset, with every
//! other variable at the start of its range, falling in such runs at every
//! iteration of `f` (or of the walked loops, `f` outermost: the smallest
//! run length dividing their iterations that gives two runs or more); a
//! slice larger than a page (a smaller one is the hardware prefetcher's,
//! whose streams stop at page boundaries; a
//! slice the L1 holds is no exception: RegNetX-400MF's panels of 6 filters
//! × 400 channels, 9.6 KB, read four times each by 1 × 1 convolutions over
//! 7² positions on `x86-avx2`, ran 0.13–0.15 → 0.08–0.09 ms per layer
//! prefetched, Zen 4, 1 thread); a run short enough that reading its slice
//! from memory would take a tenth of its arithmetic's time or more (at the
//! target's ridge point: a longer run hides the wait anyway, and the
//! prefetches only cost it issue slots — ConvNeXt-S's 192 → 768 products at
//! 56×56, prefetched, ran 2 threads 6.7 % slower); and a slice read at least
//! twice per run. A
//! slice read once is a stream, which the hardware prefetcher follows: a
//! fully connected layer's weights prefetched a slice ahead ran 10–40 %
//! slower (MEASURED, ResNet-50's 2048 → 1000). The spread loop is the
//! deepest serial or unrolled loop between `f` and the read whose step still
//! covers a cache line (coarser ones would leave a step's lines to arrive
//! at once; finer ones would prefetch a line several times), unless its
//! step's share (where no loop's step covers a line: an iteration's of the
//! run) is more than [`MAX_LINES_PER_STEP`] lines: then the loop below it
//! takes the prefetches, one line a step, each line prefetched by several
//! steps, where a step still covers [`MIN_STEP_BYTES`] and the slice and
//! the next fit half of the L2 together (the panels above: three passes of
//! 400 channels, 8 bytes a step; prefetching only 8 of the 50 lines a
//! pass's step would have to took nothing off). Without such a loop (a
//! step of 7 bytes) the step prefetches its whole share where that is a
//! burst the core keeps in flight ([`MAX_BURST_LINES`]) and it has the
//! arithmetic to hide it ([`OPS_PER_LINE`]). The reads that make a
//! slice's later passes include the spread loop's own steps (a block of
//! panels read by each block of rows in turn) where one step's part of the
//! slice fits half of the L2.
//!
//! Invariants: the pass adds `Stmt::Prefetch` statements only, which
//! change no value; each one's offset is clamped into its tensor. It runs
//! after legalization, on the loops code generation receives, and only
//! where the target takes prefetches (`Target::prefetches`); `--knob
//! prefetch=0` turns it off.

use crate::index::{bin, int};
use crate::interval;
use crate::ir::{ForKind, LoopFunc, Stmt};
use texc_compiler::ops::{BinOp, MathFn};
use texc_compiler::target::{CpuCaches, Target};
use texc_compiler::tir::{TExpr, TExprId, TensorId, TensorRole, Ty, VarId};

/// A cache line (x86).
const LINE_BYTES: i64 = 64;
/// Lines a step's share may have before a finer loop takes them, a line a
/// step; where none can and the share is no burst ([`MAX_BURST_LINES`]),
/// the most a step prefetches: more would crowd the loop's loads.
const MAX_LINES_PER_STEP: i64 = 8;
/// Where no finer loop can take a step's share, the step prefetches all of
/// it if that is at most [`MAX_BURST_LINES`] and a line per this many of
/// its operations (16 cycles of two AVX2 FMA pipes, 8 of AVX-512's on cores
/// that run them at full width); cut short, the lines not prefetched wait
/// on memory in the next slice's first pass (MEASURED, Zen 4, `x86-avx2`,
/// 1 thread: forty 1 × 1 convolutions 192 ↔ 1152 at 7 × 7, 35 MB of
/// weights: the 192 → 1152 ones' 11 lines a step, 8 prefetched: 0.285 ms a
/// layer, all 11: 0.227; ONNX Runtime 0.23).
const OPS_PER_LINE: f64 = 512.0;
/// The most lines a step prefetches to take its whole share: about the
/// misses a core keeps in flight (12 to 16 L1 fill buffers on recent Intel
/// cores, more on Zen 4). A larger share keeps [`MAX_LINES_PER_STEP`]: 16
/// of Swin-T's 220 lines a step on `host` (AVX-512) ran the model 0.6 %
/// slower than 8, the coverage no better.
const MAX_BURST_LINES: i64 = 16;
/// The finest step that prefetches: a line is then prefetched by at most 8 steps.
const MIN_STEP_BYTES: i64 = LINE_BYTES / 8;
/// Slices within a page are left to the hardware prefetcher.
const PAGE_BYTES: i64 = 4096;
/// The pass prefetches where the first read of a slice would wait on
/// memory for a tenth of its run's time or more.
const MIN_WAIT_SHARE_INVERSE: f64 = 10.0;
/// Iterations of a parallel loop (with the serial loops it walks, together)
/// the pass examines one by one (compile time stays linear).
const MAX_ITERATIONS: i64 = 1 << 16;

/// One spread prefetch: where, of what, how.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The spread loop: prefetches go first in its body.
    pub at: VarId,
    pub tensor: TensorId,
    /// The loops whose iterations, taken together in this order (the
    /// parallel loop, then serial ones inside it), walk the runs; the run
    /// length `Q` in those iterations.
    pub walked: Loops,
    pub run: i64,
    /// Elements from one slice to the next (`S`) and the current slice's start at the first iteration.
    pub slice: i64,
    pub base: i64,
    /// The loops from the walked loops' body to the spread loop, outermost first.
    pub path: Loops,
    /// Cache lines each step prefetches.
    pub lines: i64,
}

/// Add spread prefetches to `f`'s parallel loops where they read an input in
/// runs, again and again ([module docs](self)); returns the plans made.
pub fn prefetch(f: &mut LoopFunc, target: &Target) -> Vec<Plan> {
    if !target.is_compiled() || !target.prefetches() {
        return Vec::new();
    }
    let plans = plans(f, &target.cpu_caches(), target.nominal.peak_gflops / target.nominal.bandwidth_gbs);
    for plan in &plans {
        let stmts = statements(f, plan);
        insert_first(&mut f.body, plan.at, &stmts);
    }
    plans
}

/// The plans for every parallel loop of `f` (its nests' outermost ones) on
/// a machine of these caches whose arithmetic does `ridge` operations in
/// the time its memory delivers a byte.
pub fn plans(f: &LoopFunc, caches: &CpuCaches, ridge: f64) -> Vec<Plan> {
    let mut out = Vec::new();
    let mut outside = Vec::new();
    let m = Machine { caches, ridge };
    find_parallel(f, &f.body, &mut outside, &m, &mut out);
    out
}

/// What the plans depend on of the machine.
struct Machine<'a> {
    caches: &'a CpuCaches,
    ridge: f64,
}

/// A loop enclosing a statement: `(var, lo, extent, kind)`.
type EnclosingLoop = (VarId, i64, i64, ForKind);
/// Loops enclosing a statement, outermost first.
type Enclosing = Vec<EnclosingLoop>;

/// Loops as `(var, lo, extent)`, outermost first.
pub type Loops = Vec<(VarId, i64, i64)>;

fn find_parallel(f: &LoopFunc, body: &[Stmt], outside: &mut Enclosing, m: &Machine, out: &mut Vec<Plan>) {
    for s in body {
        match s {
            Stmt::For { var, lo, extent, kind: ForKind::Parallel, body } => {
                let mut reads = Vec::new();
                collect_reads(f, body, &mut Vec::new(), &mut reads);
                let mut done: Vec<TensorId> = Vec::new();
                for (tensor, idx, path) in reads {
                    if done.contains(&tensor) {
                        continue;
                    }
                    if let Some(plan) = plan_for(f, m, outside, (*var, *lo, *extent), tensor, &idx, &path) {
                        done.push(tensor);
                        out.push(plan);
                    }
                }
            }
            Stmt::For { var, lo, extent, kind, body } => {
                outside.push((*var, *lo, *extent, *kind));
                find_parallel(f, body, outside, m, out);
                outside.pop();
            }
            s => find_parallel(f, s.body(), outside, m, out),
        }
    }
}

/// Every load of an input inside `body`, with the loops between.
fn collect_reads(
    f: &LoopFunc,
    body: &[Stmt],
    path: &mut Enclosing,
    out: &mut Vec<(TensorId, Vec<TExprId>, Enclosing)>,
) {
    for s in body {
        if let Stmt::For { var, lo, extent, kind, body } = s {
            path.push((*var, *lo, *extent, *kind));
            collect_reads(f, body, path, out);
            path.pop();
            continue;
        }
        if let Stmt::Store { value, .. } = s {
            let mut loads = Vec::new();
            crate::analysis::loads_in(&f.p, *value, &mut loads);
            for l in loads {
                if let TExpr::Load(t, idx) = f.p.expr(l) {
                    if f.p.tensor(*t).role == TensorRole::Input {
                        out.push((*t, idx.clone(), path.clone()));
                    }
                }
            }
        }
        collect_reads(f, s.body(), path, out);
    }
}

/// The plan for one read of `tensor` at `idx` inside parallel loop `par`,
/// if it reads in runs: runs of the parallel loop's iterations; where the
/// spread loop's steps could not take their whole shares of such a run's
/// slice, the runs of the iterations of the parallel loop and the serial
/// loops just inside it, taken together, whose slices are smaller, if one
/// such plan takes them all.
fn plan_for(
    f: &LoopFunc,
    m: &Machine,
    outside: &Enclosing,
    par: (VarId, i64, i64),
    tensor: TensorId,
    idx: &[TExprId],
    path: &[EnclosingLoop],
) -> Option<Plan> {
    let (first, covers) = plan_walking(f, m, outside, par, (tensor, idx), path, 0)?;
    if covers {
        return Some(first);
    }
    let serial = path.iter().take_while(|p| p.3 == ForKind::Serial).count();
    let mut iterations = par.2;
    for walk in 1..=serial.min(path.len().saturating_sub(1)) {
        // Deeper walks only have more iterations to examine.
        iterations = iterations.saturating_mul(path[walk - 1].2.max(1));
        if iterations > MAX_ITERATIONS {
            break;
        }
        match plan_walking(f, m, outside, par, (tensor, idx), path, walk) {
            Some((plan, true)) if plan.slice < first.slice => return Some(plan),
            _ => {}
        }
    }
    Some(first)
}

/// The plan for one read of `tensor` at `idx` whose slices are walked by
/// the iterations of parallel loop `par` and of the first `walk` loops of
/// `path` (serial ones), as one loop, `par` outermost; and whether its
/// steps take every line of their shares of the next slice.
fn plan_walking(
    f: &LoopFunc,
    m: &Machine,
    outside: &Enclosing,
    (par, lo, extent): (VarId, i64, i64),
    (tensor, idx): (TensorId, &[TExprId]),
    path: &[EnclosingLoop],
    walk: usize,
) -> Option<(Plan, bool)> {
    let walked: Loops =
        std::iter::once((par, lo, extent)).chain(path[..walk].iter().map(|p| (p.0, p.1, p.2))).collect();
    let path = &path[walk..];
    let total = walked.iter().try_fold(1i64, |n, w| n.checked_mul(w.2.max(1)))?;
    if !(2..=MAX_ITERATIONS).contains(&total) || !idx.iter().any(|&i| f.p.mentions(i, par)) {
        return None;
    }
    // The offsets are taken with loops outside `par` at their start: a read
    // that moves with them would have every one of their iterations
    // prefetch the first one's slices.
    if outside.iter().any(|&(v, ..)| idx.iter().any(|&i| f.p.mentions(i, v))) {
        return None;
    }
    let d = f.p.tensor(tensor);
    let elem_bytes = d.elem.size() as i64;
    // The offset at each iteration of the walked loops, every other loop at its start.
    let mut env = vec![0i64; f.vars.len()];
    for &(v, vlo, _, _) in outside.iter().chain(path) {
        env[v as usize] = vlo;
    }
    let mut offsets = Vec::with_capacity(total as usize);
    for i in 0..total {
        let mut rest = i;
        for &(v, vlo, e) in walked.iter().rev() {
            env[v as usize] = vlo + rest % e.max(1);
            rest /= e.max(1);
        }
        offsets.push(flat_offset(f, tensor, idx, &env)?);
    }
    // Runs within one iteration of the parallel loop where serial loops walk
    // with it: a run spanning two would be two threads' (the pool gives each
    // a contiguous chunk of the parallel loop).
    let inside = total / extent.max(1);
    let run = (1..=total / 2)
        .filter(|q| total % q == 0 && (walk == 0 || inside % q == 0))
        .find(|&q| in_runs(&offsets, q as usize))?;
    let (base, slice) = (offsets[0], offsets[run as usize] - offsets[0]);
    // Every term of a prefetch's offset is at least `base` (see
    // `statements`), so `base ≥ 0` keeps it inside the tensor from below;
    // a read below the start (a padded window behind a guard) is left alone.
    let slice_bytes = slice * elem_bytes;
    if base < 0 || slice_bytes <= PAGE_BYTES {
        return None;
    }
    // The slice's first read waits on memory for a share of the run's time
    // of about `ridge / (run's operations per slice byte)`; below a tenth
    // there is little to win (a transformer's 192 → 768 product, 4 panels of
    // 96 KB reused by 28 rows: 392 operations a byte, 4 %, against 25 and
    // 58 % for ResNet-50's 3×3 convolutions at 7×7).
    let run_ops = 2.0 * run as f64 * path.iter().map(|p| p.2.max(1) as f64).product::<f64>();
    if run_ops > MIN_WAIT_SHARE_INVERSE * m.ridge * slice_bytes as f64 {
        return None;
    }
    let (spread, lines) = spread_loop(path, run, slice_bytes, m.caches.l2, run_ops)?;
    let at = spread.last()?.0;
    // A slice read once is a stream, which the hardware prefetcher follows
    // (MEASURED: prefetching the next one slowed a fully connected layer's
    // 8 MB of weights by 10–40 %). The spread loop's own steps walking
    // what the first step read again (a panel read by each block of rows in
    // turn) count where a step's reads fit half of the L2: the later steps
    // find them there.
    let fixed: Vec<(VarId, i64)> = walked.iter().map(|w| (w.0, w.1)).collect();
    let above: Vec<VarId> = spread[..spread.len() - 1].iter().map(|p| p.0).collect();
    let mut reads = traversals(f, &fixed, (tensor, idx), path, &above, run, slice);
    if reads < 2 && step_part_fits_half_l2(f, &fixed, (tensor, idx), path, &spread, m.caches.l2) {
        let with_spread: Vec<VarId> = spread.iter().map(|p| p.0).collect();
        reads = traversals(f, &fixed, (tensor, idx), path, &with_spread, run, slice);
    }
    if reads < 2 {
        return None;
    }
    let steps = spread.iter().fold(run, |n, p| n.saturating_mul(p.2.max(1)));
    let covers = steps.saturating_mul(lines).saturating_mul(LINE_BYTES) >= slice_bytes;
    Some((Plan { at, tensor, walked, run, slice, base, path: spread, lines }, covers))
}

/// How many times a run reads its slice: the run's iterations' footprints
/// (their offsets' range, every loop of `path` over its range) over the
/// slice, times the loops of `above` (those above the spread loop, or down to
/// it) that the read does not move along (they walk the same elements again).
fn traversals(
    f: &LoopFunc,
    fixed: &[(VarId, i64)],
    (tensor, idx): (TensorId, &[TExprId]),
    path: &[EnclosingLoop],
    above: &[VarId],
    run: i64,
    slice: i64,
) -> i64 {
    let Some(footprint) = footprint(f, fixed, tensor, idx, path, &|_| true) else { return 0 };
    let footprint = footprint.clamp(1, slice);
    let again: i64 = path
        .iter()
        .filter(|p| above.contains(&p.0) && !idx.iter().any(|&i| f.p.mentions(i, p.0)))
        .map(|p| p.2.max(1))
        .product();
    run.saturating_mul(footprint).saturating_mul(again) / slice
}

/// Whether what one step of the spread loop (the last of `spread`) reads of
/// `tensor` at `idx`, the loops below it over their ranges, fits half an L2
/// of `l2` bytes: the spread loop's next steps then find it there.
fn step_part_fits_half_l2(
    f: &LoopFunc,
    fixed: &[(VarId, i64)],
    (tensor, idx): (TensorId, &[TExprId]),
    path: &[EnclosingLoop],
    spread: &Loops,
    l2: i64,
) -> bool {
    let below = |v: VarId| !spread.iter().any(|p| p.0 == v);
    let elem_bytes = f.p.tensor(tensor).elem.size() as i64;
    footprint(f, fixed, tensor, idx, path, &below)
        .is_some_and(|part| part.saturating_mul(elem_bytes).saturating_mul(2) <= l2)
}

/// The elements between the first and the last that the read at `idx`
/// reaches over the loops of `path` that are `ranging` (the others at their
/// start) at the walked loops' first iteration (`fixed`), where known.
fn footprint(
    f: &LoopFunc,
    fixed: &[(VarId, i64)],
    tensor: TensorId,
    idx: &[TExprId],
    path: &[EnclosingLoop],
    ranging: &dyn Fn(VarId) -> bool,
) -> Option<i64> {
    let mut ranges = vec![interval::exact(0); f.vars.len()];
    for &(v, vlo, extent, _) in path {
        let hi = if ranging(v) { vlo + extent.max(1) - 1 } else { vlo };
        ranges[v as usize] = interval::range(vlo as i128, hi as i128);
    }
    for &(v, lo) in fixed {
        ranges[v as usize] = interval::exact(lo as i128);
    }
    let (first, last) = flat_range(f, tensor, idx, &|v| ranges[v as usize])?;
    Some(i64::try_from(last - first + 1).unwrap_or(i64::MAX))
}

/// Whether `offsets` fall in runs of `q` iterations, run `r` within
/// `[o₀ + r·S, o₀ + (r + 1)·S)` for `S = o_q − o₀ > 0`: a slice per run,
/// the slices in order (the iterations inside a run may visit their slice's
/// parts in any order: a fused loop over a group of panels and the rows that
/// reuse them).
fn in_runs(offsets: &[i64], q: usize) -> bool {
    let slice = offsets[q] - offsets[0];
    slice > 0
        && offsets.iter().enumerate().all(|(i, &o)| {
            let start = offsets[0] + (i / q) as i64 * slice;
            (start..start + slice).contains(&o)
        })
}

/// The deepest serial or unrolled loop of `path` whose step still covers a
/// line of the slice, or the one below it where that step's share is more
/// than [`MAX_LINES_PER_STEP`] lines (or no step covers a line), this one's
/// covers [`MIN_STEP_BYTES`], and the slice and the next fit half of the L2
/// (`l2` bytes) together; the loops down to it, and the lines a step takes.
/// (A larger slice is not spread finer: prefetched whole, the next slice
/// would evict the current one, which its later passes read from the L2.)
/// Without such a loop, a step takes its whole share where that is at most
/// [`MAX_BURST_LINES`] and it has the operations for it ([`OPS_PER_LINE`]
/// of the run's `run_ops`), else [`MAX_LINES_PER_STEP`] of it. (The loop
/// below, where there is one, spreads better: RegNetX-400MF's 15 lines a
/// step at once ran the model 3–5 % slower than a line a step below.)
fn spread_loop(path: &[EnclosingLoop], run: i64, slice_bytes: i64, l2: i64, run_ops: f64) -> Option<(Loops, i64)> {
    let lines_of = |step_bytes: i64| (step_bytes + LINE_BYTES - 1) / LINE_BYTES;
    // The run's iterations are the steps above the first loop.
    let (mut best, mut finer) = (None, None);
    let mut steps = run;
    for (depth, &(_, _, extent, kind)) in path.iter().enumerate() {
        if !matches!(kind, ForKind::Serial | ForKind::Unrolled) {
            break;
        }
        steps = steps.checked_mul(extent.max(1))?;
        let step_bytes = slice_bytes / steps;
        if step_bytes < LINE_BYTES {
            finer = (step_bytes >= MIN_STEP_BYTES && fits_with_next(slice_bytes, l2)).then_some(depth);
            break;
        }
        best = Some((depth, step_bytes, steps));
    }
    let coarse_share = best.map_or(slice_bytes / run, |(_, step_bytes, _)| step_bytes);
    let (depth, lines) = match (best, finer) {
        (_, Some(depth)) if lines_of(coarse_share) > MAX_LINES_PER_STEP => (depth, 1),
        (Some((depth, step_bytes, steps)), _) if burst(lines_of(step_bytes), run_ops / steps as f64) => {
            (depth, lines_of(step_bytes))
        }
        (Some((depth, step_bytes, _)), _) => (depth, lines_of(step_bytes).min(MAX_LINES_PER_STEP)),
        (None, _) => return None,
    };
    Some((path[..=depth].iter().map(|&(v, lo, e, _)| (v, lo, e)).collect(), lines))
}

/// Whether a step's `share` of lines is a burst it may prefetch whole: at
/// most [`MAX_BURST_LINES`], with [`OPS_PER_LINE`] of its operations each.
fn burst(share: i64, ops_per_step: f64) -> bool {
    share <= MAX_BURST_LINES && share as f64 * OPS_PER_LINE <= ops_per_step
}

/// Whether a slice and the next fit half of an L2 of `l2` bytes together.
fn fits_with_next(slice_bytes: i64, l2: i64) -> bool {
    slice_bytes.saturating_mul(4) <= l2
}

/// The row-major offset of `tensor[idx]` with loop variables at `env`.
fn flat_offset(f: &LoopFunc, tensor: TensorId, idx: &[TExprId], env: &[i64]) -> Option<i64> {
    let (lo, hi) = flat_range(f, tensor, idx, &|v| interval::exact(env[v as usize] as i128))?;
    (lo == hi).then(|| i64::try_from(lo).ok()).flatten()
}

/// The row-major offsets of `tensor[idx]`'s first and last index (each
/// axis at the ends of its range) with loop variables ranging over `ranges`.
fn flat_range(
    f: &LoopFunc,
    tensor: TensorId,
    idx: &[TExprId],
    ranges: &dyn Fn(VarId) -> interval::Iv,
) -> Option<(i128, i128)> {
    let shape = &f.p.tensor(tensor).shape;
    let (mut first, mut last) = (0i128, 0i128);
    for (k, &i) in idx.iter().enumerate() {
        let iv = interval::of(&f.p, i, ranges);
        let (a, b) = (iv.lo?, iv.hi?);
        first = first.checked_mul(shape[k] as i128)?.checked_add(a)?;
        last = last.checked_mul(shape[k] as i128)?.checked_add(b)?;
    }
    Some((first, last))
}

/// The plan's prefetches: `lines` of them, a line apart, from
/// `min(base + (r + 1)·S + t·S/(Q·T) + line, last)` where `r` is the
/// iteration's run and `t` its step in the run.
fn statements(f: &mut LoopFunc, plan: &Plan) -> Vec<Stmt> {
    let steps: i64 = plan.run * plan.path.iter().map(|p| p.2.max(1)).product::<i64>();
    // i = the walked loops' iteration, counted as one loop's.
    let mut i = var_from(f, plan.walked[0].0, plan.walked[0].1);
    for &(v, vlo, extent) in plan.walked[1..].iter().filter(|p| p.2 > 1) {
        let e = int(f, extent);
        let scaled = bin(f, BinOp::Mul, i, e);
        let x = var_from(f, v, vlo);
        i = bin(f, BinOp::Add, scaled, x);
    }
    let q = int(f, plan.run);
    let run_index = bin(f, BinOp::UDiv, i, q);
    // t = (i % Q) · T₀ + Σ (v − lo)·(steps below v)
    let mut t = bin(f, BinOp::URem, i, q);
    // A loop of one iteration adds nothing to the step.
    for &(v, vlo, extent) in plan.path.iter().filter(|p| p.2 > 1) {
        let e = int(f, extent);
        let scaled = bin(f, BinOp::Mul, t, e);
        let x = var_from(f, v, vlo);
        t = bin(f, BinOp::Add, scaled, x);
    }
    let s = int(f, plan.slice);
    let next = bin(f, BinOp::Mul, run_index, s);
    let step = {
        let ts = bin(f, BinOp::Mul, t, s);
        let n = int(f, steps);
        bin(f, BinOp::UDiv, ts, n)
    };
    let start = int(f, plan.base + plan.slice);
    let at = bin(f, BinOp::Add, next, step);
    let at = bin(f, BinOp::Add, at, start);
    let len = f.p.tensor(plan.tensor).len();
    let per_line = (LINE_BYTES / f.p.tensor(plan.tensor).elem.size() as i64).max(1);
    let last = int(f, len - 1);
    (0..plan.lines)
        .map(|l| {
            let e = match l {
                0 => at,
                _ => {
                    let d = int(f, l * per_line);
                    bin(f, BinOp::Add, at, d)
                }
            };
            let offset = f.p.alloc(TExpr::Math(MathFn::Min, vec![e, last]), Ty::Index, Default::default());
            Stmt::Prefetch { tensor: plan.tensor, offset }
        })
        .collect()
}

/// `v − lo` (or `v`).
fn var_from(f: &mut LoopFunc, v: VarId, lo: i64) -> TExprId {
    let x = f.p.alloc(TExpr::Var(v), Ty::Index, Default::default());
    if lo == 0 {
        return x;
    }
    let l = int(f, lo);
    bin(f, BinOp::Sub, x, l)
}

/// Put `stmts` first in the body of loop `var`.
fn insert_first(body: &mut [Stmt], var: VarId, stmts: &[Stmt]) -> bool {
    for s in body {
        if let Stmt::For { var: v, body, .. } = s {
            if *v == var {
                body.splice(0..0, stmts.iter().cloned());
                return true;
            }
        }
        let inner: &mut [Stmt] = match s {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => body,
            _ => continue,
        };
        if insert_first(inner, var, stmts) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{parse_loops, tensor};
    use texc_compiler::target::CacheSource;

    const CACHES: CpuCaches =
        CpuCaches { l1d: 32 << 10, l2: 1 << 20, l3: 32 << 20, l3_cores: 2, cores: 2, source: CacheSource::Nominal };

    /// A panel of filters `W[p]` (`C × 32`), read by each of `rows` output
    /// rows in turn: the parallel loop runs over `(panel, row)`.
    fn panels(w: &str, rows: i64, c: i64) -> LoopFunc {
        let n = 4 * rows;
        let src = format!(
            "func k []\n  input {w}\n  input X: f32[{c}, {rows}]\n  output Y: f32[4, {rows}, 32]\n  \
             for p.h in 0..{n} parallel:\n    for c in 0..{c}:\n      for v in 0..32 vectorized:\n        \
             Y[p.h / {rows}, p.h % {rows}, v] = Y[p.h / {rows}, p.h % {rows}, v] + W[p.h / {rows}, c, v] * X[c, p.h % {rows}]\n"
        );
        parse_loops("k.loops", &src)
    }

    #[test]
    fn slices_read_in_runs_are_prefetched_a_share_per_step() {
        // 4 panels of 512 × 32 floats (64 KiB each, above the 32 KiB L1), 2 rows each.
        let f = panels("W: f32[4, 512, 32]", 2, 512);
        let plans = plans(&f, &CACHES, 14.3);
        assert_eq!(plans.len(), 1, "{plans:?}");
        let p = &plans[0];
        assert_eq!((p.run, p.slice, p.base, p.lines), (2, 512 * 32, 0, 1), "{p:?}");
        assert_eq!(f.vars[p.at as usize].name, "c");
        // 64 KiB over 2 rows × 512 steps: 64 bytes a step, one line.
        let mut g = f.clone();
        let t = texc_compiler::target::lookup("x86-avx512").expect("target");
        assert_eq!(prefetch(&mut g, t).len(), 1);
        let text = crate::ir::print(&g);
        assert!(text.contains("      prefetch W at min("), "{text}");
        crate::verify::verify(&g).expect("verifies");
    }

    #[test]
    fn slices_the_l1_holds_are_prefetched_too() {
        // A slice of 16 KiB over 2 rows: 64 bytes a step of `c`, one line.
        let plans = plans(&panels("W: f32[4, 128, 32]", 2, 128), &CACHES, 14.3);
        assert_eq!(plans.iter().map(|p| (p.slice, p.lines)).collect::<Vec<_>>(), vec![(128 * 32, 1)]);
    }

    /// The finest step that still covers a line would have more lines to
    /// prefetch than it may: the loop below takes them, a line a step.
    #[test]
    fn a_step_with_too_many_lines_hands_its_share_to_the_loop_below() {
        // Panels of 6 filters × 400 channels (9.6 KB), read by three blocks
        // of 16 positions: a block's step is 50 lines, a channel's 8 bytes.
        let src = "func k []\n  input W: f32[66, 400]\n  input X: f32[400, 48]\n  output Y: f32[66, 48]\n  \
                   for k.b in 0..11 parallel:\n    for o in 0..3:\n      for c in 0..400:\n        \
                   for k.r in 0..6 unrolled:\n          for v in 0..16 vectorized:\n            \
                   Y[k.b * 6 + k.r, o * 16 + v] = Y[k.b * 6 + k.r, o * 16 + v] + W[k.b * 6 + k.r, c] * X[c, o * 16 + v]\n";
        let f = parse_loops("blocks.loops", src);
        let plans = plans(&f, &CACHES, 14.3);
        assert_eq!(plans.len(), 1, "{plans:?}");
        let p = &plans[0];
        assert_eq!((p.run, p.slice, p.lines), (1, 2400, 1), "{p:?}");
        assert_eq!(p.path.iter().map(|l| f.vars[l.0 as usize].name.as_str()).collect::<Vec<_>>(), ["o", "c"]);
        // Panels of 960 KB: with the next, more than half the L2, so the
        // channels' loop takes no prefetches (and the blocks' loop, as the
        // spread loop, reads the panel once per step: its own repeats count
        // as second reads only where the L2 would keep the panel).
        let big = src.replace("400", "40000");
        let g = parse_loops("big.loops", &big);
        assert!(super::plans(&g, &CACHES, 14.3).is_empty());
        // Eight rows of a 64 KiB panel: no loop's step covers a line, and
        // an iteration's share (8 KiB) is more than a step may take.
        let plans = super::plans(&panels("W: f32[4, 512, 32]", 8, 512), &CACHES, 14.3);
        assert_eq!(plans.iter().map(|p| (p.run, p.lines)).collect::<Vec<_>>(), vec![(8, 1)]);
        // Both compute what they did, their prefetches inside W (the loop evaluator checks).
        let mut g = f.clone();
        let t = texc_compiler::target::lookup("x86-avx2").expect("target");
        assert_eq!(prefetch(&mut g, t).len(), 1);
        let args = || vec![tensor(&[66, 400], 3), tensor(&[400, 48], 4)];
        let want = crate::eval::run(&f, args()).expect("runs");
        let got = crate::eval::run(&g, args()).expect("runs prefetched");
        assert_eq!(format!("{:?}", got[0].data), format!("{:?}", want[0].data));
    }

    /// A 1 × 1 convolution 192 → 1152 over a 7 × 7 map computed
    /// filters-last on AVX2 (its 9 full blocks of 5 rows; the tail block of
    /// 4 left out): each of 8 parallel blocks of 9 panels (110 KB) in two
    /// slices of 96 channels, each panel's slice read by the 9 blocks of
    /// rows in turn. Only the rows' loop, the spread loop, reads it again.
    #[test]
    fn panels_read_by_each_block_of_rows_in_turn_are_prefetched_whole() {
        let src = "func k []\n  input W: f32[72, 192, 16]\n  input X: f32[192, 49]\n  output Y: f32[49, 1152]\n  \
                   for k.oo in 0..8 parallel:\n    for c.o in 0..2:\n      for k.oi in 0..9:\n        \
                   for h.b in 0..9:\n          for c.i in 0..96:\n            for h.r in 0..5 unrolled:\n              \
                   for v in 0..16 vectorized:\n                \
                   Y[h.b * 5 + h.r, (k.oo * 9 + k.oi) * 16 + v] = Y[h.b * 5 + h.r, (k.oo * 9 + k.oi) * 16 + v] + \
                   W[k.oo * 9 + k.oi, c.o * 96 + c.i, v] * X[c.o * 96 + c.i, h.b * 5 + h.r]\n";
        let f = parse_loops("rows.loops", src);
        // The ridge: 4.9 operations a byte, this Zen 4's measured one.
        let plans = plans(&f, &CACHES, 4.9);
        assert_eq!(plans.len(), 1, "{plans:?}");
        let p = &plans[0];
        // 162 steps of the rows' loop share 110 KB: 682 bytes, 11 lines
        // each, 15 360 operations a step to hide them.
        assert_eq!((p.run, p.slice, p.lines), (1, 9 * 192 * 16, 11), "{p:?}");
        assert_eq!(f.vars[p.at as usize].name, "h.b");
        // With an L2 of 8 KiB a step's 6 KB of panel would not stay there
        // for the next block of rows: nothing to win.
        let small = CpuCaches { l2: 8 << 10, ..CACHES };
        assert!(super::plans(&f, &small, 4.9).is_empty());
        // One row a block: 3072 operations a step, too few for 11 lines at
        // once; 384 channels: 22 lines a step, more than a burst. Both
        // prefetch 8 lines a step.
        let lines = |src: &str| {
            let g = parse_loops("variant.loops", src);
            super::plans(&g, &CACHES, 4.9).iter().map(|p| p.lines).collect::<Vec<_>>()
        };
        assert_eq!(lines(&src.replace("h.r in 0..5", "h.r in 0..1")), [8]);
        let wide = src.replace("f32[72, 192, 16]", "f32[72, 384, 16]").replace("f32[192, 49]", "f32[384, 49]");
        assert_eq!(lines(&wide.replace("c.o * 96", "c.o * 192").replace("c.i in 0..96", "c.i in 0..192")), [8]);
        // Its prefetches stay inside W and change no value.
        let mut g = f.clone();
        let t = texc_compiler::target::lookup("x86-avx2").expect("target");
        assert_eq!(prefetch(&mut g, t).len(), 1);
        let args = || vec![tensor(&[72, 192, 16], 5), tensor(&[192, 49], 6)];
        let want = crate::eval::run(&f, args()).expect("runs");
        let got = crate::eval::run(&g, args()).expect("runs prefetched");
        assert_eq!(format!("{:?}", got[0].data), format!("{:?}", want[0].data));
    }

    /// A 1 × 1 convolution of 512 channels over 21 positions computed
    /// filters-last on AVX-512 (like RegNetY-1.6GF's last stage, 888
    /// channels at 7 × 7): 2 parallel groups of 5 panels (320 KB a group,
    /// with the next more than half the L2), each panel (64 KB) read by the
    /// 3 blocks of rows in turn. A group's slice, spread over the rows' 15
    /// steps, would take 8 of a step's 342 lines; the panels, walked by the
    /// groups and the panels' loop together, are prefetched whole, the next
    /// panel a line per channel step while the rows read this one.
    #[test]
    fn serial_loops_inside_the_parallel_one_walk_smaller_slices() {
        let src = "func k []\n  input W: f32[10, 512, 32]\n  input X: f32[512, 21]\n  output Y: f32[21, 320]\n  \
                   for k.oo in 0..2 parallel:\n    for k.oi in 0..5:\n      for h.b in 0..3:\n        \
                   for c in 0..512:\n          for h.r in 0..7 unrolled:\n            for v in 0..32 vectorized:\n              \
                   Y[h.b * 7 + h.r, (k.oo * 5 + k.oi) * 32 + v] = Y[h.b * 7 + h.r, (k.oo * 5 + k.oi) * 32 + v] + \
                   W[k.oo * 5 + k.oi, c, v] * X[c, h.b * 7 + h.r]\n";
        let f = parse_loops("groups.loops", src);
        let plans = plans(&f, &CACHES, 4.9);
        assert_eq!(plans.len(), 1, "{plans:?}");
        let p = &plans[0];
        let names = |loops: &Loops| loops.iter().map(|l| f.vars[l.0 as usize].name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&p.walked), ["k.oo", "k.oi"], "{p:?}");
        assert_eq!((p.run, p.slice, p.lines), (1, 512 * 32, 1), "{p:?}");
        assert_eq!(names(&p.path), ["h.b", "c"], "{p:?}");
        // Groups of one panel: the parallel loop walks the panels alone, as before.
        let one = src.replace("k.oo in 0..2", "k.oo in 0..10").replace("k.oi in 0..5", "k.oi in 0..1");
        let g = parse_loops("panels.loops", &one.replace("k.oo * 5", "k.oo * 1"));
        let plans = super::plans(&g, &CACHES, 4.9);
        assert_eq!(plans.iter().map(|p| (p.walked.len(), p.slice, p.lines)).collect::<Vec<_>>(), [(1, 512 * 32, 1)]);
        // The prefetches stay inside W and change no value.
        let mut g = f.clone();
        let t = texc_compiler::target::lookup("x86-avx512").expect("target");
        assert_eq!(prefetch(&mut g, t).len(), 1);
        // In the channels' loop: the next panel of the walked iteration `k.oo * 5 + k.oi`, 16 384 elements on.
        let text = crate::ir::print(&g);
        let next = "          prefetch W at min(@udiv(k.oo * 5 + k.oi, 1) * 16384 + @udiv(((@urem(k.oo * 5 + k.oi, 1) * 3 + h.b) \
                    * 512 + c) * 16384, 1536) + 16384, 163839)";
        assert!(text.contains(next), "{text}");
        let args = || vec![tensor(&[10, 512, 32], 7), tensor(&[512, 21], 8)];
        let want = crate::eval::run(&f, args()).expect("runs");
        let got = crate::eval::run(&g, args()).expect("runs prefetched");
        assert_eq!(format!("{:?}", got[0].data), format!("{:?}", want[0].data));
    }

    #[test]
    fn prefetched_nests_compute_the_same_and_prefetch_inside_their_tensors() {
        // The loop evaluator checks each prefetch's offset against its tensor.
        for (rows, c) in [(2, 512), (2, 700)] {
            let w = format!("W: f32[4, {c}, 32]");
            let f = panels(&w, rows, c);
            let mut g = f.clone();
            let t = texc_compiler::target::lookup("x86-avx512").expect("target");
            assert_eq!(prefetch(&mut g, t).len(), 1, "rows {rows}, c {c}");
            let args = || vec![tensor(&[4, c, 32], 1), tensor(&[c, rows], 2)];
            let want = crate::eval::run(&f, args()).expect("runs");
            let got = crate::eval::run(&g, args()).unwrap_or_else(|e| panic!("rows {rows}, c {c}: {e}"));
            assert_eq!(format!("{:?}", got[0].data), format!("{:?}", want[0].data));
        }
    }

    #[test]
    fn reads_below_the_start_or_moving_with_outer_loops_are_left_alone() {
        // A padded window: row `c − 1` of each panel, read behind a guard,
        // starts one row before the tensor at the loops' start.
        let src = "func k []\n  input W: f32[4, 512, 32]\n  output Y: f32[8, 32]\n  \
                   for p.h in 0..8 parallel:\n    for c in 0..512:\n      if c >= 1:\n        \
                   for v in 0..32 vectorized:\n          Y[p.h, v] = Y[p.h, v] + W[p.h / 2, c - 1, v]\n";
        let f = parse_loops("pad.loops", src);
        assert!(plans(&f, &CACHES, 14.3).is_empty());
        // Panels that move with a loop outside the parallel one.
        let src = "func k []\n  input W: f32[3, 4, 512, 32]\n  output Y: f32[3, 8, 32]\n  \
                   for g in 0..3:\n    for p.h in 0..8 parallel:\n      for c in 0..512:\n        \
                   for v in 0..32 vectorized:\n          Y[g, p.h, v] = Y[g, p.h, v] + W[g, p.h / 2, c, v]\n";
        let f = parse_loops("outer.loops", src);
        assert!(plans(&f, &CACHES, 14.3).is_empty());
        // Without the outer loop the same panels are prefetched.
        let src = src.replace("for g in 0..3:\n    ", "").replace("g, ", "0, ").replace("\n      ", "\n    ");
        let f = parse_loops("inner.loops", &src);
        assert_eq!(plans(&f, &CACHES, 14.3).len(), 1, "{src}");
    }

    #[test]
    fn reads_within_a_page_or_moving_every_iteration_are_left_alone() {
        // A slice of 4 KiB: one page, the hardware prefetcher's.
        assert!(plans(&panels("W: f32[4, 32, 32]", 2, 32), &CACHES, 14.3).is_empty());
        // One row per panel: each slice read once, a stream.
        assert!(plans(&panels("W: f32[4, 512, 32]", 1, 512), &CACHES, 14.3).is_empty());
        // 64 rows: 2 bytes a step, a line's prefetch repeated by 32 steps.
        assert!(plans(&panels("W: f32[4, 512, 32]", 64, 512), &CACHES, 14.3).is_empty());
        // Memory that keeps up with the arithmetic (a byte per 0.05 operations): nothing to wait for.
        assert!(plans(&panels("W: f32[4, 512, 32]", 2, 512), &CACHES, 0.05).is_empty());
        // Cranelift takes no prefetches.
        let mut f = panels("W: f32[4, 512, 32]", 2, 512);
        let t = texc_compiler::target::lookup("cranelift").expect("target");
        assert!(prefetch(&mut f, t).is_empty());
    }
}
