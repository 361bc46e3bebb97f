//! What the CPU schedule decides across stages, once each is scheduled:
//!
//! - a register block's accumulators in a local buffer, registers after
//!   LLVM's SROA ([`local_accumulators`]);
//! - an element-wise stage that alone reads such a block becomes its
//!   epilogue, stored from the accumulators ([`fold_epilogues`]);
//! - temporaries of which each iteration of their reader's outermost loop
//!   needs its own part (a row's statistics, a softmax's exponentials) are
//!   computed inside that loop (`compute_at`), so that the part stays in
//!   L1 (or L2) ([`attach_producers`]).
//!
//! Invariants: epilogues are folded before producers are attached, and
//! attaching never moves an epilogue, a stage with one, or anything an
//! epilogue reads; an attachment is kept only where `attach::infer`
//! accepts it, it recomputes little, and it cuts no operand's reuse.

use super::Machine;
use crate::analysis::loads_in;
use crate::ir::{ForKind, TensorOp};
use crate::normalize::contains_reduce;
use crate::schedule::{Attach, Schedules, StageSchedule};
use crate::strategy::{reads_at_own_point, Reads};
use std::collections::{BTreeSet, HashMap, HashSet};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, TensorRole};
use texc_grammar::Span;

/// A register block's accumulators (the spatial loops inside its reduction
/// loops: unrolled rows, vectors of a row) in a local buffer at the loop
/// just outside the reductions (`cache_write`), registers after LLVM's
/// SROA: the block is initialised there and stored once, instead of an init
/// nest writing the whole output first and the update reading it back. A
/// block of more than twice the accumulator registers (a long product's
/// column block, whose reduction is sliced and packed outside it) stays in
/// memory.
///
/// A reduction cut into slices by loops outside the block (an unpacked
/// long product: a 1×1 convolution from more than 256 channels whose rows
/// are the image's `h, w` fused) keeps the block inside the innermost
/// slice loop in a local too, resumed from the output's sums of the slices
/// before (`cache_write_resumes`). In memory, LLVM kept the block in
/// registers only where it could prove the accesses contiguous: a row's
/// masked tail loaded and stored the block on every step (SqueezeNet's
/// 512 → 1000 classifier at 13² alone, 1 thread: 2.4 ms; resumed 1.5,
/// unsliced 1.3).
pub(super) fn local_accumulators(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) {
    let is_reduce = |l: &usize| ss.ivs[*l].reduce;
    let Some(first) = ss.leaves.iter().position(is_reduce) else { return };
    let last = ss.leaves.iter().rposition(is_reduce).expect("a reduction leaf exists");
    let innermost = ss.leaves[..=last].iter().rposition(|l| !is_reduce(l)).map_or(0, |i| i + 1);
    // The block inside all the reductions; else the one inside the innermost
    // run of them, whose slices outside it resume the output's sums.
    let (i, resumes) = match (fits_registers(ss, first, m), innermost > first) {
        (true, _) => (first, false),
        (false, true) if fits_registers(ss, innermost, m) => (innermost, true),
        _ => return,
    };
    ss.cache_write = Some((ss.leaves[i - 1], p.fresh_tensor_name(&format!("{}.acc", p.tensor(st.tensor).name))));
    ss.cache_write_resumes = resumes;
}

/// Whether the spatial loops inside leaf position `at` (a reduction loop,
/// with a loop outside it) are a register block: unrolled rows, of at most
/// twice the accumulator registers.
fn fits_registers(ss: &StageSchedule, at: usize, m: Machine) -> bool {
    if at == 0 {
        return false;
    }
    let inner: Vec<usize> = ss.leaves[at..].iter().copied().filter(|&l| !ss.ivs[l].reduce).collect();
    let blocked = inner.iter().any(|&l| ss.ivs[l].kind == ForKind::Unrolled);
    let elements: i64 = inner.iter().map(|&l| ss.ivs[l].extent).product();
    blocked && elements <= 2 * m.accumulators * m.lanes
}

/// An element-wise stage that alone reads a reduction with local
/// accumulators, at its own points (`y[n, k, h, w] = clip(y.r0[n, k, h, w] +
/// b[k], 0, 6)` after `inline_epilogues`), becomes that reduction's
/// epilogue: its write-back stores `y` from the accumulators, and `y.r0` is
/// never written (1×1 convolutions of MobileNetV2: one pass over the output
/// instead of three). Both stages at the root, nothing computed inside the
/// epilogue's loops, and what the epilogue reads is written neither between
/// them nor inside some stage's loops. It runs before [`attach_producers`]
/// (only the schedule's packing stages are attached yet), which keeps these
/// true: it attaches neither an epilogue, nor a stage with one, nor anything
/// into an epilogue or that one reads.
pub(super) fn fold_epilogues(p: &Program, s: &mut Schedules) {
    let reads = Reads::of(p);
    // Indexed once (each a walk of every stage per stage made the pass
    // quadratic in a model's stages): the writers of each tensor, the
    // stages others are attached to, and the epilogues, kept as they fold.
    let mut writers: HashMap<TensorId, Vec<usize>> = HashMap::new();
    for (ci, c) in p.stages.iter().enumerate() {
        writers.entry(c.tensor).or_default().push(ci);
    }
    let owners: HashSet<usize> = s.attach.iter().flatten().map(|x| x.owner).collect();
    let mut epilogues = s.epilogues();
    for ai in 0..p.stages.len() {
        // A resumed block holds one slice's sums, not the output's.
        let ss = &s.stages[ai];
        if ss.cache_write.is_none() || ss.cache_write_resumes || s.attach[ai].is_some() || epilogues.contains(&ai) {
            continue;
        }
        let a = &p.stages[ai];
        let t = a.tensor;
        let readers: Vec<usize> = reads.readers(t).collect();
        let [bi] = readers[..] else { continue };
        if s.stages[bi].flash.is_some() {
            continue;
        }
        let b = &p.stages[bi];
        let mut reads = Vec::new();
        loads_in(p, b.value, &mut reads);
        // Stages between them have not run at the write-back; attached ones
        // exist only inside their owner's loops (perhaps not around it).
        let written_between = |l: &TExprId| match p.expr(*l) {
            TExpr::Load(x, _) => {
                writers.get(x).is_some_and(|w| w.iter().any(|&ci| (ai + 1..bi).contains(&ci) || s.attach[ci].is_some()))
            }
            _ => false,
        };
        let foldable = bi > ai
            && p.tensor(t).role == TensorRole::Temp
            && !contains_reduce(p, b.value)
            && b.vars.len() == b.n_axes
            && b.n_axes == a.n_axes
            && p.tensor(b.tensor).shape == p.tensor(t).shape
            && reads_at_own_point(p, b, t)
            && !reads.iter().any(written_between)
            && s.attach[bi].is_none()
            && !owners.contains(&bi);
        if foldable {
            s.stages[ai].epilogue = Some(bi);
            epilogues.insert(bi);
        }
    }
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
/// reader costs one over its part. Nor is a producer of costly math
/// functions attached where its part cuts its rows to half a vector of
/// `lanes` or less ([`narrows_math`]), nor a transposing stage where its
/// part cuts the lines it reads and the stage computed `whole` would not
/// read them more cheaply ([`cuts_lines`]).
pub(super) fn attach_producers(p: &Program, s: &mut Schedules, lanes: i64, whole: WholeTransposes) {
    let readers_of = readers_of(p);
    let producers_of = producers_of(&readers_of);
    let loads = crate::attach::Loads::of(p);
    // The stages attached to each owner, kept as attachments are made: a
    // trial's boxes are those inside its owner (`Attached::inside`).
    let mut attached = Attached::of(s);
    let epilogues = s.epilogues();
    for o in (0..p.stages.len()).rev() {
        let Some(&a) = s.stages[o].leaves.first() else { continue };
        if s.attach[o].is_some() || s.stages[o].ivs[a].reduce || epilogues.contains(&o) || s.stages[o].flash.is_some() {
            continue;
        }
        let trips = s.stages[o].ivs[a].extent;
        // A tile product's outer loop is over groups of column blocks sized
        // for half of L2 (`tiles::ColumnGroups`): the group's pack of the
        // signed operand may be made inside it, by the core that reads it.
        let tiles = s.stages[o].tensorize.as_ref().is_some_and(|t| t.op == TensorOp::TileDot);
        let signed = tiles.then(|| crate::dot4::tile_signed_operand(p, &p.stages[o])).flatten();
        // Only a producer of the owner or of a stage attached to it can
        // have all its readers inside (each has one, at a later index):
        // those, latest first, rather than every earlier stage (a walk
        // quadratic in the stages: a fifth of compiling a model of 100
        // inverted residual blocks).
        let mut candidates: BTreeSet<usize> = producers_of[o].iter().copied().collect();
        while let Some(pi) = candidates.pop_last() {
            let t = p.stages[pi].tensor;
            if p.tensor(t).role != TensorRole::Temp
                || s.attach[pi].is_some()
                || epilogues.contains(&pi)
                || s.stages[pi].epilogue.is_some()
                || s.stages[pi].flash.is_some()
                // A tile product's nest is its own: its loops keep their names for `tensorize`.
                || s.stages[pi].tensorize.is_some()
            {
                continue;
            }
            let mut readers = readers_of[pi].iter().copied().peekable();
            let inside = |q: usize| q == o || matches!(&s.attach[q], Some(x) if x.owner == o && x.leaf == a);
            if readers.peek().is_none() || !readers.all(inside) {
                continue;
            }
            // A producer worth threads keeps them: inside an owner's loop
            // that runs on one thread (a classifier's batch of one, whose
            // threads are its columns, inside), it would run on one (the
            // 2048→192 convolution before Inception-v3's pooling: 0.6 ms on
            // one thread of two).
            let was_parallel = s.stages[pi].ivs.iter().any(|v| v.kind == ForKind::Parallel);
            let owner = &s.stages[o];
            let owner_threaded = owner.ivs.iter().any(|v| v.kind == ForKind::Parallel);
            let outer_runs_threads = match owner.ivs[a].kind {
                ForKind::Parallel => true,
                ForKind::Serial => !owner_threaded && owner.ivs[a].extent >= 2,
                _ => false,
            };
            if was_parallel && !outer_runs_threads {
                continue;
            }
            // The trial is made on `s` itself and undone if it does not pay
            // (a copy of every stage's schedule per trial was most of a
            // model's scheduling); `infer` rebases a copy.
            let undo = (s.stages[pi].ivs.clone(), s.attach[pi].take());
            for v in &mut s.stages[pi].ivs {
                if v.kind == ForKind::Parallel {
                    v.kind = ForKind::Serial;
                }
            }
            s.attach[pi] = Some(Attach { owner: o, leaf: a, layout: None, shared: false, span: Span::default() });
            let inside = attached.inside(o, pi);
            let pays = match infer_and_restore(p, s, &loads, &inside) {
                Ok(regions) => {
                    let r = &regions[&pi];
                    let bytes = r.local_shape.iter().product::<i64>() * p.tensor(t).elem.size() as i64;
                    // Boxes may overrun the tensor at the end (those points are not computed) or overlap a little.
                    let computed = r.ext.iter().product::<i64>() * trips;
                    !cuts_reuse(p, &p.stages[pi], &r.ext)
                        && !cuts_lines(p, &p.stages[pi], &r.ext, whole)
                        && !narrows_math(p, &p.stages[pi], &r.ext, lanes)
                        && bytes <= if signed == Some(t) { ATTACH_BYTES.max(whole.l2 / 2) } else { ATTACH_BYTES }
                        && 4 * computed <= 5 * p.tensor(t).len()
                }
                Err(_) => false,
            };
            if !pays {
                (s.stages[pi].ivs, s.attach[pi]) = undo;
                continue;
            }
            attached.to.entry(o).or_default().push(pi);
            // The producer's threads become the owner's: a reader too small to
            // be worth threads on its own (a convolution's bias epilogue over
            // 7×7×512 outputs) now carries the producer's work. (A serial
            // outer loop here is one that may run threads: checked above.)
            let owner = &mut s.stages[o];
            if was_parallel && owner.ivs[a].kind == ForKind::Serial {
                owner.annotate(a, ForKind::Parallel, Span::default()).expect("a spatial leaf");
            }
            candidates.extend(producers_of[pi].iter().copied());
        }
    }
}

/// Each stage's producers: the earlier stages whose tensors it loads (the
/// inverse of [`readers_of`]).
fn producers_of(readers_of: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut producers_of: Vec<Vec<usize>> = vec![Vec::new(); readers_of.len()];
    for (pi, readers) in readers_of.iter().enumerate() {
        for &q in readers {
            producers_of[q].push(pi);
        }
    }
    producers_of
}

/// Each stage's readers: the later stages that load its tensor, in
/// program order (found once, not once per pair of stages).
fn readers_of(p: &Program) -> Vec<Vec<usize>> {
    let mut readers_of: Vec<Vec<usize>> = vec![Vec::new(); p.stages.len()];
    let mut stages_of: std::collections::HashMap<TensorId, Vec<usize>> = Default::default();
    for (i, st) in p.stages.iter().enumerate() {
        stages_of.entry(st.tensor).or_default().push(i);
    }
    for (q, st) in p.stages.iter().enumerate() {
        let mut read = Vec::new();
        loads_in(p, st.value, &mut read);
        let mut tensors: Vec<TensorId> =
            read.iter().filter_map(|&l| if let TExpr::Load(t, _) = p.expr(l) { Some(*t) } else { None }).collect();
        tensors.sort();
        tensors.dedup();
        for t in tensors {
            for &pi in stages_of.get(&t).into_iter().flatten().filter(|&&pi| pi < q) {
                readers_of[pi].push(q);
            }
        }
    }
    readers_of
}

/// Whether a part with extents `ext` of stage `st` (by its tensor's
/// dimensions) cuts its rows, the vectorized last dimension, to at most
/// half a vector of `lanes`, where it computes costly math functions:
/// those then run in vectors of a few lanes. (A GELU between a quantized
/// encoder's products, attached to the next product's pack of two or four
/// elements a word, ran in vectors of two or four: BERT-base's layer on
/// one thread 27.8 → 23.0 ms on AVX2, 11.5 → 8.4 with AVX-512 VNNI. A
/// depthwise convolution's padded 15-wide plane is a masked 16-lane
/// vector, and stays attached.)
fn narrows_math(p: &Program, st: &Stage, ext: &[i64], lanes: i64) -> bool {
    let (Some(&part), Some(&row)) = (ext.last(), p.tensor(st.tensor).shape.last()) else { return false };
    part < row && 2 * part <= lanes && !crate::strategy::preparation::cheap(p, st.value)
}

/// The stages attached to each owner.
struct Attached {
    to: HashMap<usize, Vec<usize>>,
}

impl Attached {
    fn of(s: &Schedules) -> Attached {
        let mut to: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, a) in s.attach.iter().enumerate() {
            if let Some(a) = a {
                to.entry(a.owner).or_default().push(i);
            }
        }
        Attached { to }
    }

    /// The stages attached inside `owner` — at one of its loops, or inside
    /// a stage attached there, and so on — with `trial` attached to it,
    /// latest first: all whose boxes one more attachment to `owner` changes
    /// (a stage attached elsewhere is bounded by its own owner's loops).
    fn inside(&self, owner: usize, trial: usize) -> Vec<usize> {
        let mut out = vec![trial];
        let mut todo = vec![owner, trial];
        while let Some(o) = todo.pop() {
            for &q in self.to.get(&o).into_iter().flatten() {
                if !out.contains(&q) {
                    out.push(q);
                    todo.push(q);
                }
            }
        }
        out.sort_unstable_by(|a, b| b.cmp(a));
        out
    }
}

/// The boxes of the attached stages `inside` an owner ([`Attached::inside`])
/// on `s` as it is, `s` left as it was: the inference rebases those
/// stages' schedules only, so only those are copied and put back (a copy
/// of every stage's schedule per trial was a large part of a model's
/// scheduling).
fn infer_and_restore(
    p: &Program,
    s: &mut Schedules,
    loads: &crate::attach::Loads,
    inside: &[usize],
) -> Result<HashMap<usize, crate::attach::Region>, texc_grammar::Diagnostic> {
    let saved: Vec<StageSchedule> = inside.iter().map(|&i| s.stages[i].clone()).collect();
    let regions = crate::attach::infer_listed(p, s, loads, inside);
    for (&i, st) in inside.iter().zip(saved) {
        s.stages[i] = st;
    }
    regions
}

/// What a transposing stage computed whole does with its reads: the
/// caches it is measured against, and whether its code transposes blocks in
/// registers (LLVM's code does, `transposing_order` arranging the blocks;
/// Cranelift's gathers).
#[derive(Clone, Copy)]
pub(super) struct WholeTransposes {
    pub l1: i64,
    pub l2: i64,
    pub in_registers: bool,
}

impl WholeTransposes {
    /// Whether a pass reading a source of `bytes` in elements of `size`
    /// bytes would shuffle blocks in registers rather than gather: words
    /// only, and sources beyond L1 (`transposing_order` leaves the others
    /// in the axes' order).
    fn shuffles(self, bytes: i64, size: i64) -> bool {
        self.in_registers && size == 4 && bytes > self.l1
    }
}

/// Whether a box with extents `ext` of a transposing stage (its vectors
/// read across lines: [`crate::strategy::gathered_lines`]) cuts the lines it
/// reads: the axis that walks a source's line is cut to less than a line,
/// so that every box gathers a part of each line, lane by lane, and the
/// boxes together read each line many times. Computed whole, the stage is
/// a pass that reads each line once and, where it shuffles
/// ([`WholeTransposes::shuffles`]), transposes blocks in registers; there
/// the gathers cost, not the reads, and a source that fits in L2 is no
/// reason to gather it in parts (ResNet-50's Winograd products on 14 × 14,
/// filters-last, read back a filter at a time inside the output
/// transform, AVX-512, 1 thread: 0.25 ms a layer, a copy of its own 0.03
/// and the transform 0.03, its source 800 KiB). Where the whole pass would
/// gather too, a source in L2 is read again from there, and only one
/// beyond it is cut (Inception-v3's copy back inside the max pool after
/// it, its source 3.9 MB: 2.6 ms against 0.3).
fn cuts_lines(p: &Program, st: &Stage, ext: &[i64], whole: WholeTransposes) -> bool {
    use crate::strategy::LINE;
    if crate::strategy::gathered_lines(p, st) == 0 {
        return false;
    }
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    loads.iter().any(|&l| {
        let TExpr::Load(t, idx) = p.expr(l) else { return false };
        let size = p.tensor(*t).elem.size() as i64;
        let bytes = p.tensor(*t).len().saturating_mul(size);
        let rereads_cheaply = bytes <= whole.l2 && !whole.shuffles(bytes, size);
        !rereads_cheaply
            && (0..st.n_axes).any(|a| {
                let along = crate::analysis::flat_coefficient(p, *t, idx, a as texc_compiler::tir::VarId);
                along == Some(1) && ext[a] < st.vars[a].extent && ext[a] * size < LINE
            })
    })
}

/// Whether a box with extents `ext` cuts a reduction stage along an axis
/// that one of its operands does not depend on: the operand would then be
/// reloaded for every box instead of being reused across that axis (the
/// rows of a matrix product computed one at a time). An operand read
/// through groups of the axis (`X[n, k / g · Cg + c, ..]`, a grouped
/// convolution computed filters-last) is reused across a group: a box of
/// less than whole groups cuts it (and the vectors along the filters with
/// it: one filter a box, its vectors one lane wide; boxes of 28 filters in
/// groups of 24, vectors across groups).
fn cuts_reuse(p: &Program, st: &Stage, ext: &[i64]) -> bool {
    if st.vars.len() == st.n_axes {
        return false;
    }
    let mut all = Vec::new();
    loads_in(p, st.value, &mut all);
    let cut = |l: TExprId, a: usize| {
        let whole = st.vars[a].extent;
        match super::blocking::through_group(p, &[l], a as u32) {
            Some(None) => ext[a] < whole,
            Some(Some(g)) => ext[a] < whole && (ext[a] < g || ext[a] % g != 0),
            None => false,
        }
    };
    (0..st.n_axes).any(|a| all.iter().any(|&l| cut(l, a)))
}
