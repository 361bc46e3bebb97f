//! Reductions along rows (`max[d](X[n, d])`, a softmax's sums, a
//! normalization's statistics): their reads run along their contiguous
//! dimension with the reduction variable, so the reduction runs innermost
//! and the rows in parallel. Before scheduling, trailing reduction
//! variables that walk every read as one dense row become one
//! ([`fuse_dense_reductions`]) and float reductions along rows are factored
//! into vector-width partial results ([`rfactor`]), so that they vectorize.
//!
//! Invariants: only float reductions are fused or factored, as their sums
//! may be reassociated (the preparation passes compute the same outputs up
//! to that); both steps and the schedule pick their stages with
//! [`reduces_along_rows`].

use super::{iterations, Machine};
use crate::analysis::loads_in;
use crate::ir::ForKind;
use crate::knobs::DefaultKnobs;
use crate::schedule::StageSchedule;
use crate::strategy::uses_var;
use texc_compiler::target::Target;
use texc_compiler::tir::{Program, TExpr, TExprId};
use texc_grammar::Span;

/// *fuse-dense-reductions*: a float reduction along rows over dense loops as one loop.
pub(super) fn fuse_dense_reductions(p: &mut Program, _: &Target, _: DefaultKnobs) {
    for si in 0..p.stages.len() {
        if p.tensor(p.stages[si].tensor).elem.is_float() && reduces_along_rows(p, &p.stages[si]) {
            crate::normalize::fuse_dense_reductions(p, si);
        }
    }
}

/// *rfactor*: row reductions of floats factored so that their partial results vectorize.
pub(super) fn rfactor(p: &mut Program, target: &Target, knobs: DefaultKnobs) {
    let mut si = 0;
    while si < p.stages.len() {
        let float = p.tensor(p.stages[si].tensor).elem.is_float();
        let st = &p.stages[si];
        let m = Machine::of(target, st, p, knobs);
        // Partial results are combined one by one at the end of each row: a
        // row of fewer than four full vectors keeps fewer of them.
        let row = st.vars.get(st.n_axes).map_or(0, |v| v.extent);
        // Combined for many outputs in one loop, and rows short enough that
        // the combining costs as much as the row (see [`combines_many`]).
        let many = combines_many(p, st) && row < 64 * m.lanes;
        let lanes = match m.half_lanes {
            Some(half) if row < 4 * m.lanes || many => half,
            _ => m.lanes,
        };
        let lanes = if many && knobs.racc.is_none() { lanes } else { lanes * partial_vectors(row, lanes, knobs.racc) };
        if float && lanes > 1 && reduces_along_rows(p, st) && crate::normalize::rfactor(p, si, lanes) {
            si += 1;
        }
        si += 1;
    }
}

/// Whether a row reduction's partial results are combined for many
/// outputs in one loop: where a streamed operand does not move with the
/// innermost axis (`S[b, l, s] = sum[d](Q[b, l, d] · K[b, s, d])`: `Q`
/// stays as `s` moves), rows of that axis share its loads and are blocked
/// together, and their partial results are combined in a loop over `s`.
/// LLVM vectorizes that loop across outputs, reading each output's partial
/// results as an interleaved group: in 8×8 blocks transposed in registers
/// where there are at most 8 of them, with one gather per partial result
/// where there are more. So such a reduction keeps 8 partial results, one
/// 256-bit vector on AVX-512 (unfused attention, L = 197, D = 64,
/// x86-avx512, 1 thread: the combining nest 10.4 → 0.33 ms with 16 partial
/// results → 8, the whole kernel 12.5 → 1.9 ms; 32 partial results took
/// 35 ms). A reduction of one operand along its rows (`max[s](S[b, l, s])`)
/// combines each row's alone. Only rows shorter than 64 vectors take 8:
/// in longer ones the combining is a small part of the work, and the
/// partial results' independent chains count (a 4096² matrix-vector
/// product on AVX-512, 1 thread: 25 GFLOP/s with 32 partial results, 16
/// with 8; at 1000² about the same, 44–47 and 46–58).
fn combines_many(p: &Program, st: &texc_compiler::tir::Stage) -> bool {
    let Some(inner) = st.n_axes.checked_sub(1) else { return false };
    if st.vars[inner].extent < 2 {
        return false;
    }
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let reduction = st.n_axes as u32..st.vars.len() as u32;
    loads.iter().any(|&l| reduction.clone().any(|r| uses_var(p, l, r)) && !uses_var(p, l, inner as u32))
}

/// Vectors of partial results of a row reduction: its combining chains run
/// at once. Up to 32 lanes in all (four 256-bit vectors, two 512-bit ones),
/// each chain taking at least 8 vectors of the row (`racc` sets the count,
/// as far as the row allows). A single chain waits a vector operation's
/// latency per vector: on AVX2, rows of 1024 with four chains ran
/// softmax 4.35 → 3.86 ms and layer_norm 1.63 → 1.18 ms (4096 rows, 1
/// thread); on AVX-512 two chains ran softmax 3.56 → 3.10 ms, layer_norm
/// 1.09 → 1.17 ms.
/// A row that whole vectors divide keeps to counts that divide it too (1000
/// lanes of f32 on AVX2: one vector, not four and a guard on every element).
fn partial_vectors(row: i64, lanes: i64, racc: Option<i64>) -> i64 {
    let lanes = lanes.max(1);
    let most = racc.unwrap_or((32 / lanes).clamp(1, 4)).min(row / (8 * lanes)).max(1);
    if row % lanes != 0 {
        return most;
    }
    (1..=most).rev().find(|k| row % (k * lanes) == 0).unwrap_or(1)
}

/// A reduction whose reads run along their contiguous dimension with the
/// reduction variable (`max[d](X[n, d])`) while no read is contiguous in
/// the innermost spatial axis: vectorizing that spatial axis would turn
/// every read into a strided gather.
pub(super) fn reduces_along_rows(p: &Program, st: &texc_compiler::tir::Stage) -> bool {
    if st.vars.len() == st.n_axes || st.n_axes == 0 {
        return false;
    }
    let inner = st.n_axes as u32 - 1;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let last_index = |l: &TExprId| match p.expr(*l) {
        TExpr::Load(_, idx) => idx.last().copied(),
        _ => None,
    };
    let reduction = st.n_axes as u32..st.vars.len() as u32;
    // Loads that do not move with the reduction stay in registers; only the others decide.
    let streamed: Vec<TExprId> = loads.into_iter().filter(|&l| reduction.clone().any(|r| uses_var(p, l, r))).collect();
    let spatial_contiguous = streamed.iter().filter_map(last_index).any(|i| uses_var(p, i, inner));
    let reduce_contiguous =
        streamed.iter().filter_map(last_index).any(|i| reduction.clone().any(|r| uses_var(p, i, r)));
    reduce_contiguous && !spatial_contiguous
}

/// Reductions along rows: spatial loops outside, in parallel; the reduction
/// runs innermost over contiguous memory, accumulating in a register.
pub(super) fn schedule_row_reduction(ss: &mut StageSchedule, m: Machine) {
    let span = Span::default();
    let mut outer = ss.leaves[0];
    while ss.ivs[outer].extent < m.parallel_iterations() && ss.leaves.len() > 1 {
        let next = ss.leaves[1];
        if ss.ivs[next].reduce {
            break;
        }
        let name = format!("{}.{}", ss.ivs[outer].name, ss.ivs[next].name);
        outer = ss.fuse(outer, next, (&name, span), span).expect("adjacent spatial loops");
    }
    if !ss.ivs[outer].reduce && ss.ivs[outer].extent >= 2 && m.worth_threads(iterations(ss)) {
        ss.annotate(outer, ForKind::Parallel, span).expect("spatial");
    }
}
