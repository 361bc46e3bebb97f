//! *one-launch*: a parallel loop that lowering cut in two — its full
//! tiles, then its partial last tile ([`crate::lower`]'s loop
//! partitioning: `for j.oo in 0..12 parallel` and `for j.oo in 12..13
//! parallel`) — runs as one launch of the thread pool, each iteration
//! taking the full tiles' body or the last tile's:
//! `for j.oo in 0..13 parallel: if j.oo < 12: … ; if j.oo >= 12: …`.
//!
//! Two launches cost twice the hand-over, and the second, of one
//! iteration, runs on one thread while the others wait; worse, the first
//! thread then owns the first tiles and the last one, so its share of the
//! tensor is not the share the next nest's first thread reads (the pool
//! cuts every loop into even contiguous chunks), and half of a 1 × 1
//! convolution's output crosses cores between layers.
//!
//! Runs after *zero* ([`crate::zeroing`]), whose proof reads the two loops'
//! stores as boxes that meet, and before *legalize*.
//!
//! Invariants: two loops are merged only where they are adjacent, both
//! `parallel`, of the same name (lowering names a leaf's loops alike), the
//! second starting where the first ends, their bodies hold no tile or GPU
//! statements, and the merged loop's iterations are proven independent
//! from the indices ([`crate::independence`]): the second loop reads
//! nothing the first writes, nor writes what it reads. Every iteration
//! runs once, with the body it had. Loops inside a parallel loop are left
//! alone: the pool runs those serially.

use crate::digits::LoopRanges;
use crate::ir::{ForKind, LoopFunc, Stmt};
use crate::versioning::{compare, copy, has_gpu_statements};
use std::collections::HashMap;
use texc_compiler::ops::BinOp;

/// Merge every such pair of loops in `f`; returns how many were merged.
///
/// The loop ranges the proofs read are computed once, before any merge:
/// a merge changes no range another proof reads, since a merged pair's
/// inner loops keep their variables and ranges, the first loop's variable
/// (whose extent grows) is bound by the merged loop itself in its proof,
/// and no merge looks inside a parallel loop, where a merged one could be.
pub fn merge_parallel_pieces(f: &mut LoopFunc) -> usize {
    let ranges = LoopRanges::of(f);
    let mut body = std::mem::take(&mut f.body);
    let merged = merge_in(f, &ranges, &mut body);
    f.body = body;
    merged
}

fn merge_in(f: &mut LoopFunc, ranges: &LoopRanges, body: &mut Vec<Stmt>) -> usize {
    let mut merged = 0;
    for s in body.iter_mut() {
        match s {
            // Nested parallel loops run serially: nothing to gain.
            Stmt::For { kind: ForKind::Parallel, .. } => {}
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
                merged += merge_in(f, ranges, body)
            }
            _ => {}
        }
    }
    let mut i = 0;
    while i + 1 < body.len() {
        match merge_pair(f, ranges, &body[i], &body[i + 1]) {
            Some(one) => {
                body[i] = one;
                body.remove(i + 1);
                merged += 1;
            }
            None => i += 1,
        }
    }
    merged
}

/// `a` and `b` as one parallel loop, where they are two pieces of one.
fn merge_pair(f: &mut LoopFunc, ranges: &LoopRanges, a: &Stmt, b: &Stmt) -> Option<Stmt> {
    let (
        Stmt::For { var: va, lo: la, extent: ea, kind: ForKind::Parallel, body: ba },
        Stmt::For { var: vb, lo: lb, extent: eb, kind: ForKind::Parallel, body: bb },
    ) = (a, b)
    else {
        return None;
    };
    let (va, cut) = (*va, *lb);
    let same_leaf = f.vars[va as usize].name == f.vars[*vb as usize].name;
    if cut != la + ea || !same_leaf || !plain(ba) || !plain(bb) {
        return None;
    }
    // The second body keeps its inner loops' variables (the loop is
    // gone; `ranges` knows them). A pair refused below leaves these
    // renamed expressions unused in the arena.
    let mut rename = HashMap::from([(*vb, va)]);
    let last: Vec<Stmt> = bb.iter().map(|s| copy(f, s, &mut rename, false)).collect();
    let body = vec![
        Stmt::If { cond: compare(f, va, BinOp::Lt, cut), then: ba.clone() },
        Stmt::If { cond: compare(f, va, BinOp::Ge, cut), then: last },
    ];
    let extent = ea + eb;
    if !crate::independence::iterations_independent(f, ranges, (va, *la, extent, ForKind::Parallel), &body) {
        return None;
    }
    f.vars[va as usize].extent = la + extent;
    // A `.loops` file may mark either piece `rolled`: the loop that holds both is.
    if f.rolled.remove(vb) {
        f.rolled.insert(va);
    }
    Some(Stmt::For { var: va, lo: *la, extent, kind: ForKind::Parallel, body })
}

/// Whether `body` holds only CPU loops, conditions, locals and stores.
fn plain(body: &[Stmt]) -> bool {
    !has_gpu_statements(body)
}
