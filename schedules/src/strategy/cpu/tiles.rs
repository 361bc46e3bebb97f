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
//! The column blocks are grouped so that a group's panels of the signed
//! operand (its 64-byte rows of the sum for 32 columns each) fit in half of
//! L2 ([`ColumnGroups`]); a group's pack of that operand is made inside the
//! loop over groups (`attach`). Inside a group the row blocks run outside
//! its column blocks: a row block of the unsigned operand stays in L1
//! while the group's panels stream past it from L2. (MEASURED, 1 thread,
//! AMX Xeon, 2 MiB L2: with the columns outermost, each row block read
//! from L2 for every column block, int8 1024³ took 1.36 ms, 0.80 so; with
//! no groups, 197 × 3072 × 768's 2.3 MiB of weights came from L3 once per
//! row block.) The first loop of two or more iterations among the groups
//! (where the unsigned operand is the smaller) or the other blocks runs on
//! the thread pool.
//!
//! Invariants: the three tensorized loops are the stage's innermost, each
//! at most a block long along the rows and columns, the packed sum whole
//! (a multiple of 16 packed elements: `crate::dot4` pads it).

use super::{ceil_div, Machine};
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
    // lives inside the loop over a group's blocks of columns.
    let block = |ss: &mut StageSchedule, axis: usize, size: i64| -> (usize, usize) {
        let name = ss.ivs[axis].name.clone();
        ss.split(axis, size, (&format!("{name}.t"), span), (&format!("{name}.i"), span), span).expect("a fresh axis")
    };
    let (col_o, col_i) = block(ss, col, TileDot::MAX_COLS);
    let (row_o, row_i) = block(ss, row, TileDot::MAX_ROWS);
    let rows: i64 = (0..st.n_axes).filter(|&a| a != axes.col).map(|a| st.vars[a].extent).product();
    let groups = ColumnGroups::of(st, (rows, st.vars[axes.col].extent), ss.ivs[col_o].extent, m);
    let name = ss.ivs[col_o].name.clone();
    let (col_g, col_b) = ss
        .split(col_o, groups.blocks, (&format!("{name}.g"), span), (&format!("{name}.b"), span), span)
        .expect("a fresh axis");
    // The blocks' loops: the groups of column blocks (outermost, so that the
    // group's pack of the weights is attached there: `attach`), the other
    // axes, the row blocks, the column blocks of a group.
    let blocks: Vec<usize> = [col_g].into_iter().chain(others.iter().copied()).chain([row_o, col_b]).collect();
    let order: Vec<usize> = blocks.iter().chain(&sums).chain(&[k, row_i, col_i]).copied().collect();
    ss.reorder(&order, span).expect("a permutation of the leaves");
    ss.tensorize = Some(Tensorize { op: TensorOp::TileDot, leaves: [row_i, col_i, k], span });
    // The accumulators of one block, inside the loops that choose it.
    ss.cache_write = Some((col_b, fresh_name(p, &format!("{}.acc", p.tensor(st.tensor).name))));
    let work: i64 = st.vars.iter().map(|v| v.extent).product();
    let mut candidates = blocks.iter().copied().filter(|&l| l != col_b && (l == col_g) == groups.by_columns);
    let par = candidates.find(|&l| ss.ivs[l].extent >= 2);
    if let Some(l) = par.filter(|_| m.worth_threads(work)) {
        ss.annotate(l, ForKind::Parallel, span).expect("a spatial loop");
    }
}

/// How the column blocks are grouped (see the header).
struct ColumnGroups {
    /// Column blocks per group.
    blocks: i64,
    /// The groups are what the cores share out (else the row blocks, or the
    /// other axes outside them).
    by_columns: bool,
}

impl ColumnGroups {
    /// The groups of `blocks` column blocks of stage `st`, whose output has
    /// `rows × cols` points: at most as many blocks per group as keep the
    /// group's panels of the signed operand within half of L2. Where the
    /// unsigned operand is the smaller one (fewer rows than columns: a
    /// transformer's products at a short sequence), the cores take groups
    /// of columns, each reading all the rows and its own part of the larger
    /// operand ([`ColumnGroups::shared_out`]); elsewhere they take rows and
    /// share each group's panels (1024³ on AMX, two threads: 0.75 → 0.49 ms),
    /// in as few groups as fit, of equal sizes.
    fn of(st: &Stage, (rows, cols): (i64, i64), blocks: i64, m: Machine) -> ColumnGroups {
        // Each packed element of the sum is a word of four bytes.
        let sum_bytes: i64 = st.vars[st.n_axes..].iter().map(|v| v.extent).product::<i64>().saturating_mul(4);
        let panel = sum_bytes.saturating_mul(TileDot::MAX_COLS).max(1);
        let blocks = blocks.max(1);
        let fitting = ((m.caches.l2 / 2) / panel).clamp(1, blocks);
        let cores = m.caches.cores.max(1);
        let by_columns = rows < cols && cores > 1;
        let per_group = if by_columns {
            Self::shared_out(blocks, fitting, cores)
        } else {
            ceil_div(blocks, ceil_div(blocks, fitting))
        };
        ColumnGroups { blocks: per_group, by_columns }
    }

    /// Blocks per group where `cores` share out groups of at most `fitting`
    /// of `blocks`: the size whose busiest core has the fewest blocks (the
    /// full groups in turns on the cores, then a last, shorter group on
    /// one), the largest among equals, and at least half of `fitting` (a
    /// smaller group reads the rows once more for fewer columns).
    fn shared_out(blocks: i64, fitting: i64, cores: i64) -> i64 {
        let busiest = |b: i64| ceil_div(blocks / b, cores) * b + blocks % b;
        let smallest = (fitting / 2).max(1);
        (smallest..=fitting).rev().min_by_key(|&b| busiest(b)).unwrap_or(fitting)
    }
}
