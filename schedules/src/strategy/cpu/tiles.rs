//! Integer matrix products on AMX tiles (CPU targets with AMX-INT8): a
//! stage `C[.., i, j] = sum[k4](@dot4(0, A.q4[.., i, k4], W.q4[k4, j]))`,
//! as `crate::dot4` packs products for tiles, is computed by blocks of
//! 32 × 32 accumulators (four 16 × 16 tiles of `i32`), each one AMX tile
//! product over the whole sum ([`crate::ir::TileDot`]), in a local block
//! that the write-back (and a folded epilogue) stores from.
//!
//! The blocks run along the columns outside the rows: a block of the
//! signed operand (the sum's 64-byte rows of 32 columns: 128 bytes per
//! packed row) stays in L2 while the row blocks walk it; the column blocks
//! (else the row blocks) run on the thread pool.
//!
//! Invariants: the three tensorized loops are the stage's innermost, each
//! at most a block long along the rows and columns, the sum whole (a
//! multiple of 16 packed elements: `crate::dot4` pads it).

use super::Machine;
use crate::ir::{ForKind, TensorOp, TileDot};
use crate::normalize::fresh_name;
use crate::schedule::{StageSchedule, Tensorize};
use texc_compiler::tir::{Program, Stage};
use texc_grammar::Span;

/// Whether stage `st` is a product that AMX tiles compute (see the
/// header): its value is the sum alone, over its last variable.
pub(super) fn tile_product(p: &Program, st: &Stage) -> bool {
    st.vars.len() == st.n_axes + 1 && crate::dot4::tile_sum(p, st, st.value)
}

/// The tile schedule of product stage `st` (see the header).
pub(super) fn schedule_tiles(ss: &mut StageSchedule, p: &Program, st: &Stage, m: Machine) {
    let span = Span::default();
    let (row, col) = (st.n_axes - 2, st.n_axes - 1);
    let k = ss.leaves[st.n_axes];
    // Split even where one block covers the axis: the accumulators' block
    // lives inside the loop over blocks of rows.
    let block = |ss: &mut StageSchedule, axis: usize, size: i64| -> (usize, usize) {
        let name = ss.ivs[axis].name.clone();
        ss.split(axis, size, (&format!("{name}.t"), span), (&format!("{name}.i"), span), span).expect("a fresh axis")
    };
    let (row_o, row_i) = block(ss, row, TileDot::MAX_ROWS);
    let (col_o, col_i) = block(ss, col, TileDot::MAX_COLS);
    let mut order: Vec<usize> = ss.leaves[..row].to_vec();
    order.extend([col_o, row_o, k, row_i, col_i]);
    ss.reorder(&order, span).expect("a permutation of the leaves");
    ss.tensorize = Some(Tensorize { op: TensorOp::TileDot, leaves: [row_i, col_i, k], span });
    // The accumulators of one block, inside the loops that choose it.
    ss.cache_write = Some((row_o, fresh_name(p, &format!("{}.acc", p.tensor(st.tensor).name))));
    let work: i64 = st.vars.iter().map(|v| v.extent).product();
    let par = [col_o, row_o].into_iter().find(|&l| ss.ivs[l].extent >= 2);
    if let Some(l) = par.filter(|_| m.worth_threads(work)) {
        ss.annotate(l, ForKind::Parallel, span).expect("a spatial loop");
    }
}
