//! The memory plan of a loop function: where each temporary lives in one
//! arena, so that temporaries whose lifetimes do not overlap share memory
//! (a model's layers reuse the buffers of layers that are done).
//!
//! A temporary is live from the first top-level statement that touches it
//! (stores to it or loads from it) to the last one; top-level statements run
//! one after another (a parallel loop joins before the next statement).
//! Placement is greedy by size, as TensorFlow Lite's arena planner does:
//! largest first, each at the lowest offset where it overlaps no placed
//! temporary whose lifetime meets its own.
//!
//! Invariants: offsets are multiples of 64 ([`ALIGN`]); every temporary lies
//! inside `arena_bytes`; two temporaries whose lifetimes meet occupy disjoint
//! bytes. A temporary's bytes hold whatever an earlier temporary left there,
//! which is sound because compiled code stores every element of a temporary
//! before it loads it (as it must with the unzeroed `aligned_alloc` of the C
//! entry, which has always been the case).

use crate::ir::{LoopFunc, Stmt, Tile};
use std::collections::HashSet;
use texc_compiler::tir::{Program, TExpr, TExprId, TensorId};

/// Alignment of every temporary in the arena (a cache line; AVX-512 loads).
pub const ALIGN: u64 = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub tensor: TensorId,
    pub offset: u64,
    /// Size in bytes, a multiple of [`ALIGN`] (at least one).
    pub bytes: u64,
    /// First and last top-level statement that touch it.
    pub first: usize,
    pub last: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// In the order of [`LoopFunc::live_temps`].
    pub slots: Vec<Slot>,
    pub arena_bytes: u64,
    /// What one buffer per temporary would take.
    pub sum_bytes: u64,
}

impl MemoryPlan {
    pub fn offset(&self, t: TensorId) -> Option<u64> {
        self.slots.iter().find(|s| s.tensor == t).map(|s| s.offset)
    }
}

/// Bytes of temporary `t` in the arena.
pub fn temp_bytes(p: &Program, t: TensorId) -> u64 {
    let d = p.tensor(t);
    let bytes = (d.len().max(0) as u64).saturating_mul(d.elem.size() as u64).max(1);
    bytes.div_ceil(ALIGN).saturating_mul(ALIGN)
}

pub fn plan(f: &LoopFunc) -> MemoryPlan {
    let temps = f.live_temps();
    let mut first = vec![usize::MAX; f.p.tensors.len()];
    let mut last = vec![0; f.p.tensors.len()];
    for (i, s) in f.body.iter().enumerate() {
        let mut touched = Vec::new();
        stmt_tensors(&f.p, s, &mut HashSet::new(), &mut touched);
        for t in touched {
            let k = t.0 as usize;
            first[k] = first[k].min(i);
            last[k] = last[k].max(i);
        }
    }
    let mut slots: Vec<Slot> = temps
        .iter()
        .map(|&t| {
            let k = t.0 as usize;
            // A temporary no statement touches (impossible for live temps) gets a lifetime of its own.
            let (a, b) = if first[k] == usize::MAX { (0, f.body.len()) } else { (first[k], last[k]) };
            Slot { tensor: t, offset: 0, bytes: temp_bytes(&f.p, t), first: a, last: b }
        })
        .collect();
    let mut order: Vec<usize> = (0..slots.len()).collect();
    // Largest first; ties by first use, then id, so that the plan is deterministic.
    order.sort_by_key(|&i| (std::cmp::Reverse(slots[i].bytes), slots[i].first, slots[i].tensor.0));
    let mut placed: Vec<usize> = Vec::new();
    for &i in &order {
        let mut conflicts: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| slots[j].first <= slots[i].last && slots[i].first <= slots[j].last)
            .map(|&j| (slots[j].offset, slots[j].offset.saturating_add(slots[j].bytes)))
            .collect();
        conflicts.sort_unstable();
        let mut offset = 0u64;
        for (lo, hi) in conflicts {
            if offset.saturating_add(slots[i].bytes) <= lo {
                break;
            }
            offset = offset.max(hi);
        }
        slots[i].offset = offset;
        placed.push(i);
    }
    let arena_bytes = slots.iter().map(|s| s.offset.saturating_add(s.bytes)).max().unwrap_or(0);
    let sum_bytes = slots.iter().fold(0u64, |n, s| n.saturating_add(s.bytes));
    MemoryPlan { slots, arena_bytes, sum_bytes }
}

/// Tensors a statement stores to or loads from (`seen`: expressions
/// already visited, which may be shared).
fn stmt_tensors(p: &Program, s: &Stmt, seen: &mut HashSet<TExprId>, out: &mut Vec<TensorId>) {
    match s {
        Stmt::For { body, .. } | Stmt::Alloc { body, .. } => body.iter().for_each(|s| stmt_tensors(p, s, seen, out)),
        Stmt::If { cond, then } => {
            expr_tensors(p, *cond, seen, out);
            then.iter().for_each(|s| stmt_tensors(p, s, seen, out));
        }
        Stmt::Store { tensor, indices, value } => {
            out.push(*tensor);
            indices.iter().chain(std::iter::once(value)).for_each(|&e| expr_tensors(p, e, seen, out));
        }
        Stmt::Mma { c, a, b, .. } => {
            for Tile { tensor, .. } in [c, a, b] {
                out.push(*tensor);
            }
        }
        Stmt::Wgmma(w) => out.extend([w.c.tensor, w.a.tensor, w.b.tensor]),
        Stmt::TileDot(d) => out.extend([d.c.tensor, d.a.tensor, d.b.tensor]),
        Stmt::WarpReduce(w) => out.push(w.tensor),
        // A hint, but its address is the tensor's: kept live while it is taken.
        Stmt::Prefetch { tensor, offset } => {
            out.push(*tensor);
            expr_tensors(p, *offset, seen, out);
        }
        Stmt::Barrier | Stmt::Async(_) => {}
    }
}

fn expr_tensors(p: &Program, e: TExprId, seen: &mut HashSet<TExprId>, out: &mut Vec<TensorId>) {
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        if !seen.insert(e) {
            continue;
        }
        if let TExpr::Load(t, _) = p.expr(e) {
            out.push(*t);
        }
        stack.extend(p.children(e));
    }
}
