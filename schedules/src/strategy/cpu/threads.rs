//! Which axis a stage's threads share out: the one its producer's threads
//! shared, where the stage can follow it.
//!
//! The pool cuts every parallel loop into even contiguous chunks, one per
//! thread, so a nest's threads each own a slab of what it writes along the
//! axis its parallel loop walks. A nest whose threads walk another axis of
//! what it reads reads most of it from the other cores' caches: a 1 × 1
//! convolution whose threads own rows of the image, then a depthwise
//! convolution whose threads own channels, then another 1 × 1 convolution
//! over rows — half of each tensor crossing cores twice per block
//! (MobileNetV2, 2 threads: its nests, each run right after itself rather
//! than after its producer, took 0.4–1.0 ms less in all).
//!
//! So a float stage that sums over a small window only (a depthwise
//! convolution), reading an operand along the axis that operand's
//! writer's threads shared out (the largest such operand), walks that
//! axis outermost, cut into one part per core and fused with its
//! channels, where the parts are exact: the chunks of the two nests are
//! then the same rows, and a
//! padding copy attached to it is made per part and channel. A copy or
//! element-wise stage between them (the padding) passes the axis on
//! rather than moving its own loops ([`owned_axis`]). Knob `follow=0`
//! turns it off.
//!
//! Invariants: only the order of spatial loops outside every reduction
//! changes, and a loop is split exactly; products with register blocks
//! over rows or packed panels, integer stages and stages without a
//! reduction keep the loops their own schedule chose.

use super::Machine;
use crate::analysis;
use crate::ir::ForKind;
use crate::schedule::{Rel, StageSchedule};
use std::collections::HashMap;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, VarId};
use texc_grammar::Span;

/// The axis of its tensor that each scheduled stage's threads share out.
pub(super) type SplitAxes = HashMap<TensorId, usize>;

/// The axis of `ss`'s tensor its parallel loop walks (the outer one of a
/// fusion, past axes of one element), if it has a parallel loop.
pub(super) fn split_axis(ss: &StageSchedule) -> Option<usize> {
    let par = ss.leaves.iter().copied().find(|&l| ss.ivs[l].kind == ForKind::Parallel)?;
    root_axis(ss, par)
}

/// The axis whose threads own `ss`'s tensor for its readers: a copy or
/// element-wise stage that would follow axis `follow` is mostly attached to
/// its reader (where `attached` stages are: knob `attach`), computed by
/// the reader's threads, so its readers follow that axis too ([`follow`]
/// leaves its loops as they are); else the axis its own threads share out.
pub(super) fn owned_axis(ss: &StageSchedule, follow: Option<VarId>, attached: bool) -> Option<usize> {
    match follow {
        Some(v) if attached && !has_reduction(ss) => Some(v as usize),
        _ => split_axis(ss),
    }
}

fn has_reduction(ss: &StageSchedule) -> bool {
    ss.ivs.iter().any(|x| x.reduce)
}

/// The stage axis leaf `l` derives from: through splits, and through a
/// fusion its outer part (its inner one where the outer has one value).
fn root_axis(ss: &StageSchedule, l: usize) -> Option<usize> {
    match ss.ivs[l].rel {
        Rel::Root(v) => (!ss.ivs[l].reduce).then_some(v),
        Rel::Split { parent, .. } => root_axis(ss, parent),
        Rel::Fuse { outer, inner } if ss.ivs[outer].extent == 1 => root_axis(ss, inner),
        Rel::Fuse { outer, .. } => root_axis(ss, outer),
    }
}

/// The axis of `st` its threads should share out to read what an
/// operand's writer shared out: the one axis variable of `st` in that
/// operand's index along the split axis (`Xp[n, c, 2 * y + r, …]` → `y`),
/// of the largest operand that has one. A stage without a reduction gets
/// one too (a padding copy's `y` of `X[n, c, y - 1, …]`): it passes it on
/// ([`owned_axis`]).
pub(super) fn followed_axis(p: &Program, st: &Stage, split: &SplitAxes) -> Option<VarId> {
    // Nothing to follow where no producer's threads split an axis.
    // Integer stages keep their own: their products run on tiles in groups
    // of column blocks, and short rows are stored channels last
    // (`crate::channels_last`); MobileNetV2 quantized, 2 threads, measured
    // no faster following (1.64 → 1.65 ms).
    if split.is_empty() || !p.tensor(st.tensor).elem.is_float() {
        return None;
    }
    let mut loads = Vec::new();
    analysis::loads_in(p, st.value, &mut loads);
    let mut best: Option<(i64, VarId)> = None;
    for l in loads {
        let TExpr::Load(t, idx) = p.expr(l) else { continue };
        let Some(&a) = split.get(t) else { continue };
        let Some(&i) = idx.get(a) else { continue };
        // The same axis of a tensor of the same rank (a padding copy's `y`
        // of `X[n, c, y - 1, …]`, a window's `y` of `Xp[n, c, 2 * y + r, …]`),
        // not a transform's tile of another layout.
        if p.tensor(*t).shape.len() != st.n_axes {
            continue;
        }
        let axes: Vec<VarId> = (0..st.n_axes as VarId).filter(|&v| super::uses_var(p, i, v)).collect();
        let len = p.tensor(*t).len();
        if let [v] = axes[..] {
            if v as usize != a || !sums_windows_only(p, st, idx) {
                continue;
            }
            if best.is_none_or(|(n, _)| len > n) {
                best = Some((len, v));
            }
        }
    }
    best.map(|(_, v)| v)
}

/// Whether `st` sums over a window only: every reduction variable (of
/// more than one value) appears in index `idx` only beside an axis
/// variable that is not divided (`y + r`, `2 * y + r`), and the window is
/// small ([`MAX_WINDOW`]), as a depthwise convolution's is — not a grouped
/// convolution's sum over its group's channels (`c` beside `k` in
/// `X[k / 16 * 16 + c, …]`), whose register blocks of rows are what its
/// threads share.
fn sums_windows_only(p: &Program, st: &Stage, idx: &[TExprId]) -> bool {
    let beside_axis = |i| (0..st.n_axes as VarId).any(|v| super::uses_var(p, i, v)) && !divides_axis(p, st, i);
    let window: i64 = st.vars[st.n_axes..].iter().map(|v| v.extent.max(1)).product();
    window <= MAX_WINDOW
        && (st.n_axes..st.vars.len()).filter(|&r| st.vars[r].extent > 1).all(|r| {
            let r = r as VarId;
            idx.iter().all(|&i| !super::uses_var(p, i, r) || beside_axis(i))
        })
}

/// Whether `e` divides, or takes a remainder of, an expression of an axis of `st`.
fn divides_axis(p: &Program, st: &Stage, e: TExprId) -> bool {
    let here = match p.expr(e) {
        TExpr::Binary(
            BinOp::Div
            | BinOp::FloorDiv
            | BinOp::FloorMod
            | BinOp::TruncDiv
            | BinOp::TruncRem
            | BinOp::UDiv
            | BinOp::URem,
            a,
            _,
        ) => (0..st.n_axes as VarId).any(|v| super::uses_var(p, *a, v)),
        _ => false,
    };
    here || p.children(e).into_iter().any(|c| divides_axis(p, st, c))
}

/// The largest window [`sums_windows_only`] takes: 7 × 7.
const MAX_WINDOW: i64 = 49;

/// Make a loop of axis `v` the outermost, to run in parallel, cut into
/// one part per core (the parts then fuse with the loops inside). Nothing
/// for a stage without a reduction, nor where `v`'s loop is not a serial
/// loop outside the reductions, is already outermost, or does not divide
/// evenly among the cores.
pub(super) fn follow(ss: &mut StageSchedule, v: VarId, m: Machine) {
    let span = Span::default();
    // A copy or element-wise stage keeps its loops: it is mostly attached
    // to its reader (a padding copy to its depthwise convolution), whose
    // box its own cut would only split ([`owned_axis`] passes the axis on).
    if !has_reduction(ss) {
        return;
    }
    let first_reduction = ss.leaves.iter().position(|&l| ss.ivs[l].reduce).unwrap_or(ss.leaves.len());
    let outside = &ss.leaves[..first_reduction];
    let Some(&l) = outside.iter().find(|&&l| root_axis(ss, l) == Some(v as usize) && ss.ivs[l].kind == ForKind::Serial)
    else {
        return;
    };
    // Already the loop the threads share (past loops of one iteration).
    let first = ss.leaves.iter().copied().find(|&x| ss.ivs[x].extent > 1);
    if first == Some(l) {
        return;
    }
    // Cut into one part per core, exactly, the parts fused with the loops
    // inside: each iteration a slab of one channel, for which an attached
    // padding copy is made. Moved whole, the loop would make every
    // iteration walk all channels, and the padding copy, of all channels
    // at once, would no longer be attached (a pass of its own).
    let (n, cores) = (ss.ivs[l].extent, m.caches.cores);
    if cores < 2 || !m.two_per_core(n) || n % cores != 0 || super::has_tail(ss, l) {
        return;
    }
    let name = ss.ivs[l].name.clone();
    let (outer, _) = ss
        .split(l, n / cores, (&format!("{name}.t"), span), (&format!("{name}.i"), span), span)
        .expect("a spatial leaf");
    let mut order = vec![outer];
    order.extend(ss.leaves.iter().copied().filter(|&x| x != outer));
    ss.reorder(&order, span).expect("a permutation of the leaves");
}
