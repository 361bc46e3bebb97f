//! A block per row: an element-wise stage `C[r.., d..]` and the
//! temporaries of its rows that only it and each other read (a softmax's
//! max and sum, a normalization's mean and variance) run in one launch,
//! the temporaries computed where the owner's block opens, their
//! reductions over the block's threads.
//!
//! Invariants: every member of a group has the owner's leading axes as its
//! shape, is read only by the group at the row being computed, and one of
//! them reduces a long row; a group is attached only where
//! `attach::infer` accepts it, else its stages stay scheduled apart.

use super::tiles::LONG_REDUCTION;
use super::{fuse_all, over_threads};
use crate::analysis::loads_in;
use crate::ir::{ForKind, GpuDim};
use crate::normalize::contains_reduce;
use crate::schedule::{Attach, Schedules, StageSchedule};
use crate::strategy::loads;
use texc_compiler::tir::{Program, Stage, TExpr, TensorId, TensorRole};
use texc_grammar::Span;

/// Stages computed a block per row (GPU): an element-wise stage `C[r.., d..]`
/// (the owner) and the temporaries `P[r..]` of its rows (a softmax's max and
/// sum, a normalization's mean and variance) that only it and each other
/// read, each at the row being computed. They are computed where the
/// owner's block opens, into shared memory, so that a row is read from
/// memory once and the rest of the passes over it find it in the caches.
pub(super) struct RowGroup {
    pub(super) owner: usize,
    /// The leading axes of the owner that are the rows.
    pub(super) rank: usize,
    /// In stage order, the reductions over threads first to last.
    pub(super) members: Vec<usize>,
}

pub(super) fn row_groups(p: &Program) -> Vec<RowGroup> {
    let mut out: Vec<RowGroup> = Vec::new();
    for (o, c) in p.stages.iter().enumerate().rev() {
        if contains_reduce(p, c.value) || out.iter().any(|g| g.members.contains(&o)) {
            continue;
        }
        // Candidates: temporaries whose rank is a proper prefix of the owner's.
        let rank_of = |t: TensorId| p.tensor(t).shape.len();
        let mut members: Vec<usize> = (0..o)
            .filter(|&q| {
                let t = p.stages[q].tensor;
                let k = rank_of(t);
                p.tensor(t).role == TensorRole::Temp
                    && k >= 1
                    && k < c.vars.len()
                    && p.tensor(t).shape[..] == c.vars[..k].iter().map(|v| v.extent).collect::<Vec<_>>()[..]
            })
            .collect();
        // Keep those every reader of which is the owner or another member,
        // reading the row it computes; repeat until nothing more drops out.
        loop {
            let before = members.len();
            let group: Vec<usize> = members.iter().copied().chain([o]).collect();
            members.retain(|&q| {
                let t = p.stages[q].tensor;
                let readers: Vec<usize> = (q + 1..p.stages.len()).filter(|&r| loads(p, p.stages[r].value, t)).collect();
                !readers.is_empty()
                    && readers.iter().all(|&r| group.contains(&r) && reads_its_row(p, &p.stages[r], t, rank_of(t)))
            });
            if members.len() == before {
                break;
            }
        }
        // Every member has the same rows, and one of them reduces a long row.
        let Some(&first) = members.first() else { continue };
        let rank = rank_of(p.stages[first].tensor);
        let long = |q: usize| {
            let st = &p.stages[q];
            contains_reduce(p, st.value) && st.vars[rank..].iter().map(|v| v.extent).product::<i64>() >= LONG_REDUCTION
        };
        if members.iter().all(|&q| rank_of(p.stages[q].tensor) == rank) && members.iter().any(|&q| long(q)) {
            out.push(RowGroup { owner: o, rank, members });
        }
    }
    out
}

/// Whether every load of `t` (of rank `k`) in stage `r` is at `r`'s first
/// `k` variables: the row `r` is computing.
fn reads_its_row(p: &Program, r: &Stage, t: TensorId, k: usize) -> bool {
    let mut all = Vec::new();
    loads_in(p, r.value, &mut all);
    all.iter().all(|&l| match p.expr(l) {
        TExpr::Load(x, idx) if *x == t => {
            idx.len() == k && idx.iter().enumerate().all(|(i, &e)| matches!(p.expr(e), TExpr::Var(v) if *v == i as u32))
        }
        _ => true,
    })
}

/// The owner of a row group: its row axes fused into one loop over blocks,
/// the rest fused and split over the block's threads (consecutive threads
/// take consecutive elements; each thread walks the row in strides).
pub(super) fn block_per_row(ss: &mut StageSchedule, rank: usize) {
    let span = Span::default();
    let leaves = ss.leaves.clone();
    let row = fuse_all(ss, &leaves[..rank]);
    let inner = fuse_all(ss, &leaves[rank..]);
    let (o, t) = over_threads(ss, inner);
    ss.reorder(&[row, t, o], span).expect("the stage's leaves");
    ss.annotate(row, ForKind::Block(GpuDim::X), span).expect("spatial");
}

/// Attach the members of a row group at its owner's block loop; their
/// reductions are over the block's threads. Left as scheduled separately
/// when the boxes cannot be inferred.
pub(super) fn attach_row_group(p: &Program, s: &mut Schedules, g: &RowGroup) {
    let span = Span::default();
    let leaf = s.stages[g.owner].leaves[0];
    let mut trial = s.clone();
    let fresh = Schedules::new(p);
    for &q in &g.members {
        trial.stages[q] = fresh.stages[q].clone();
        let ss = &mut trial.stages[q];
        let reduce: Vec<usize> = ss.leaves.iter().copied().filter(|&l| ss.ivs[l].reduce).collect();
        if !reduce.is_empty() {
            let r = fuse_all(ss, &reduce);
            over_threads(ss, r);
        }
        trial.attach[q] = Some(Attach { owner: g.owner, leaf, layout: None, shared: false, span });
    }
    if crate::attach::infer(p, &mut trial.clone()).is_ok() {
        *s = trial;
    }
}
