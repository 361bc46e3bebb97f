//! *keep-rolled*: marks the loops whose step LLVM's unroller must not copy
//! ([`LoopFunc::rolled`]): serial loops, and parallel ones (each task's
//! loop over its share). A CPU loop-IR pass for targets compiled
//! by LLVM, run last (after *legalize* and *prefetch*), so that it sees
//! the loops the backend emits.
//!
//! The schedule's unrolling is LLVM's to extend, except around one kind of
//! register block: eight rows or more of one vector each (a 1 × 1
//! convolution's filter rows over one vector of a small map). Its
//! accumulators alone hide the FMA's latency (two FMAs a cycle, four
//! cycles each, on Zen 3 and Haswell), so a copy of its step adds nothing
//! to overlap, and on a 16-register file it does harm: LLVM's `znver3`
//! model gives the partial unroller a 512-µop loop buffer, it copied such
//! a step, the scheduler hoisted both copies' broadcasts beside the
//! accumulators and spilled one (MEASURED, Zen 3, 1 thread: Inception-v3's
//! 1 × 1 convolutions over 8 × 8 maps 1.7–3.4 ms on `host` against 0.8–1.7
//! for the same loops built for `haswell`, whose model leaves them
//! rolled). Blocks of fewer rows, or of rows of several vectors (the BLIS
//! micro-kernels: rolled everywhere, ResNet-50's loop nests went from 100
//! to 115 ms), keep LLVM's copies: no gain from rolling them was measured.
//! Nor were rows of more than eight lanes (AVX-512's full vectors, beside
//! 32 registers that hold both copies' broadcasts): they keep LLVM's
//! copies too, while AVX-512 blocks of rows of eight lanes are kept rolled
//! as on AVX2. (Until 2026-12-07 the LLVM backend applied this rule to
//! every loop it emitted as a counted loop; this pass leaves out what it
//! also caught there, none of it measured: an `unrolled` loop of more than
//! 64 iterations (which the backend emits as a counted loop), and the loops of
//! GPU kernels run on the CPU by `--emulate-gpu`.)
//!
//! Invariants: only the variables of serial and parallel loops are added
//! to `rolled`; no statement changes, so the marks change how the backend
//! copies code, never what the nest computes.

use crate::ir::{ForKind, LoopFunc, Stmt};
use std::collections::BTreeSet;
use texc_compiler::target::Target;
use texc_compiler::tir::VarId;

/// Rows of one vector each, at least, whose block is kept rolled: enough
/// accumulators to hide the FMA's latency (2 a cycle × 4 cycles).
const MIN_ROLLED_ROWS: i64 = 8;

/// The most lanes of a row of a block kept rolled: an AVX2 register of
/// `f32`, where the spill was measured.
const MAX_ROW_LANES: i64 = 8;

/// Marks `f`'s serial and parallel loops around a register block of
/// [`MIN_ROLLED_ROWS`] rows or more of one vector each, of at most
/// [`MAX_ROW_LANES`] lanes, on a CPU target `t`; marks no loop binds any
/// more (a `.loops` file's, on a loop an earlier pass removed) go.
pub fn keep_rolled(f: &mut LoopFunc, t: &Target) {
    if t.gpu.is_some() {
        return;
    }
    let mut marked = Vec::new();
    let mut bound = BTreeSet::new();
    walk(&f.body, &mut marked, &mut bound);
    f.rolled.retain(|v| bound.contains(v));
    f.rolled.extend(marked);
}

fn walk(body: &[Stmt], marked: &mut Vec<VarId>, bound: &mut BTreeSet<VarId>) {
    for s in body {
        if let Stmt::For { var, kind, body, .. } = s {
            bound.insert(*var);
            if matches!(kind, ForKind::Serial | ForKind::Parallel) && body.iter().any(one_vector_rows) {
                marked.push(*var);
            }
        }
        walk(s.body(), marked, bound);
    }
}

/// Whether `s` is a register block of [`MIN_ROLLED_ROWS`] or more unrolled
/// rows, each one vectorized loop of at most [`MAX_ROW_LANES`] lanes
/// (through serial loops of one iteration).
fn one_vector_rows(s: &Stmt) -> bool {
    fn one_vector(s: &Stmt) -> bool {
        match s {
            Stmt::For { kind: ForKind::Vectorized, extent, .. } => *extent <= MAX_ROW_LANES,
            Stmt::For { kind: ForKind::Serial, extent: 1, body, .. } => matches!(&body[..], [b] if one_vector(b)),
            _ => false,
        }
    }
    matches!(s, Stmt::For { kind: ForKind::Unrolled, extent, body, .. }
        if *extent >= MIN_ROLLED_ROWS && matches!(&body[..], [b] if one_vector(b)))
}
