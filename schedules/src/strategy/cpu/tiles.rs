//! Integer products on AMX tiles (CPU targets with AMX-INT8): a stage
//! whose value is a sum of packed byte products as `crate::dot4` packs
//! them for tiles — `C[.., i, j] = sum[k4](@dot4(0, A.q4[.., i, k4],
//! W.q4[k4, j]))`, or a convolution of stride 1, `Y[n, f, y, x] =
//! sum[c4, r, s](@dot4(0, X.q4[n, y + r, x + s, c4], W.q4[r, s, c4, f]))`
//! ([`crate::dot4::tile_sum`]: rows along `i` or `x`, columns along `j` or
//! `f`) — is computed by blocks of 32 × 32 accumulators (four 16 × 16
//! tiles of `i32`), each one AMX tile product over the packed sum
//! ([`crate::ir::TileDot`]) inside the loops over the other sums (a
//! filter's rows and columns; the code generator keeps the accumulators in
//! tiles across them), in a local block that the write-back (and a folded
//! epilogue) stores from, along the output's last axis.
//!
//! The blocks run along the columns outside the rows (and outside the
//! other axes but the first: a convolution's image rows): a block of the
//! signed operand (the sum's 64-byte rows of 32 columns) stays in L2
//! while the row blocks walk it; the first loop of two or more iterations
//! among them runs on the thread pool.
//!
//! Invariants: the three tensorized loops are the stage's innermost, each
//! at most a block long along the rows and columns, the packed sum whole
//! (a multiple of 16 packed elements: `crate::dot4` pads it).

use super::Machine;
use crate::dot4::TileAxes;
use crate::ir::{ForKind, TensorOp, TileDot};
use crate::normalize::fresh_name;
use crate::schedule::{StageSchedule, Tensorize};
use texc_compiler::tir::{Program, Stage};
use texc_grammar::Span;

/// The axes of stage `st` if it is a product that AMX tiles compute (see
/// the header): its value is the sum alone.
pub(super) fn tile_product(p: &Program, st: &Stage) -> Option<TileAxes> {
    crate::dot4::tile_sum(p, st, st.value)
}

/// The tile schedule of product stage `st` (see the header).
pub(super) fn schedule_tiles(ss: &mut StageSchedule, p: &Program, st: &Stage, axes: TileAxes, m: Machine) {
    let span = Span::default();
    let (row, col) = (ss.leaves[axes.row], ss.leaves[axes.col]);
    let k = ss.leaves[axes.sum as usize];
    let others: Vec<usize> = (0..st.n_axes).filter(|&a| a != axes.row && a != axes.col).map(|a| ss.leaves[a]).collect();
    let sums: Vec<usize> =
        (st.n_axes..st.vars.len()).filter(|&v| v != axes.sum as usize).map(|v| ss.leaves[v]).collect();
    // Split even where one block covers the axis: the accumulators' block
    // lives inside the loop over blocks of rows.
    let block = |ss: &mut StageSchedule, axis: usize, size: i64| -> (usize, usize) {
        let name = ss.ivs[axis].name.clone();
        ss.split(axis, size, (&format!("{name}.t"), span), (&format!("{name}.i"), span), span).expect("a fresh axis")
    };
    let (col_o, col_i) = block(ss, col, TileDot::MAX_COLS);
    let (row_o, row_i) = block(ss, row, TileDot::MAX_ROWS);
    // The blocks' loops: the first other axis, the column blocks, the rest, the row blocks.
    let blocks: Vec<usize> =
        others.iter().take(1).chain([&col_o]).chain(others.iter().skip(1)).chain([&row_o]).copied().collect();
    let order: Vec<usize> = blocks.iter().chain(&sums).chain(&[k, row_i, col_i]).copied().collect();
    ss.reorder(&order, span).expect("a permutation of the leaves");
    ss.tensorize = Some(Tensorize { op: TensorOp::TileDot, leaves: [row_i, col_i, k], span });
    // The accumulators of one block, inside the loops that choose it.
    ss.cache_write = Some((row_o, fresh_name(p, &format!("{}.acc", p.tensor(st.tensor).name))));
    let work: i64 = st.vars.iter().map(|v| v.extent).product();
    let par = blocks.into_iter().find(|&l| ss.ivs[l].extent >= 2);
    if let Some(l) = par.filter(|_| m.worth_threads(work)) {
        ss.annotate(l, ForKind::Parallel, span).expect("a spatial loop");
    }
}
