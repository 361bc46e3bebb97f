//! The *software pipeline* step of lowering (GPU targets): `pipeline C.ko
//! by n` overlaps the copies into the shared buffers computed at `C.ko`
//! (`cache_read ... at C.ko in shared`) with the work that reads them.
//!
//! Each buffer gets `n` slots (a new first dimension). Its copies become
//! asynchronous (`cp.async`, [`ForKind::Async`]) where both ends are
//! provably aligned to the copy's size, else stay synchronous copies of
//! the slice ahead (a gathered operand, `X[.., w + s]`): before the loop, the
//! block starts the copies of the first `n - 1` slices, one group each;
//! iteration `ko` waits for slice `ko` (at most `n - 2` groups still in
//! flight), and after one barrier starts the copy of slice `ko + n - 1`
//! into the slot that slice `ko - 1` used, then computes from slot
//! `ko % n`. The barrier both shows slice `ko` to every thread and
//! guarantees that no thread still reads the slot about to be refilled.
//!
//! ```text
//! for ko in 0..K:                 shared As: f16[n, 128, 32]:
//!   shared As: f16[128, 32]:        (copies of slice s into As[s], async; commit) for s < n - 1
//!     barrier                       for ko in 0..K:
//!     (copies into As)                async wait n - 2
//!     barrier                         barrier
//!     (reads of As)          =>       if ko + n - 1 < K:
//!                                       (copies of slice ko + n - 1 into As[(ko + n - 1) % n], async)
//!                                     async commit
//!                                     (reads of As[ko % n])
//! ```
//!
//! Requirements (errors at the `pipeline` otherwise): the loop holds
//! shared buffers, then their copies (barriers between them are dropped),
//! then statements that only read them; each copy is one store of a global
//! tensor's element of the same type, in a vectorized loop of 4, 8 or 16
//! bytes (the sizes of `cp.async`).

use crate::ir::{AsyncStep, ForKind, LoopFunc, Stmt, Tile};
use crate::lower::{index_bin as bin, index_int as int};
use crate::normalize::subst;
use crate::schedule::Schedules;
use std::collections::{HashMap, HashSet};
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_grammar::Diagnostic;

pub fn pipeline(f: &mut LoopFunc, s: &Schedules) -> Result<(), Diagnostic> {
    let mut staged = HashSet::new();
    for (si, ss) in s.stages.iter().enumerate() {
        let Some((leaf, stages, span)) = ss.pipeline else { continue };
        let tensor = f.p.stages[si].tensor;
        // Lowering names an attached stage's loops after the stage (`m.d`).
        let name = match s.attach[si] {
            Some(_) => format!("{}.{}", f.p.tensor(tensor).name, ss.ivs[leaf].name),
            None => ss.ivs[leaf].name.clone(),
        };
        let mut body = std::mem::take(&mut f.body);
        let r = rewrite(f, &mut body, &name, stages, &mut staged);
        f.body = body;
        match r {
            Ok(0) => return Err(Diagnostic::at(span, format!("no loop nest has `{name}` to pipeline"))),
            Ok(_) => {}
            Err(why) => return Err(Diagnostic::at(span, format!("cannot pipeline `{name}`: {why}"))),
        }
    }
    Ok(())
}

/// Pipelines every serial loop named `name` in `body`; returns how many.
fn rewrite(
    f: &mut LoopFunc,
    body: &mut [Stmt],
    name: &str,
    stages: i64,
    staged: &mut HashSet<TensorId>,
) -> Result<usize, String> {
    let mut n = 0;
    for st in body.iter_mut() {
        match st {
            Stmt::For { var, kind: ForKind::Serial, .. } if f.vars[*var as usize].name == name => {
                let old = std::mem::replace(st, Stmt::Barrier);
                *st = pipelined(f, old, stages, staged)?;
                n += 1;
            }
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
                n += rewrite(f, body, name, stages, staged)?
            }
            Stmt::Store { .. }
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::Prefetch { .. } => {}
        }
    }
    Ok(n)
}

fn pipelined(f: &mut LoopFunc, old: Stmt, n: i64, staged: &mut HashSet<TensorId>) -> Result<Stmt, String> {
    let Stmt::For { var: v, lo, extent, body, .. } = old else { unreachable!("a loop") };
    // The shared buffers opened at the loop's top.
    let mut buffers = Vec::new();
    let mut inner = body;
    while let [Stmt::Alloc { tensor, .. }] = inner.as_slice() {
        if !f.shared.contains(tensor) {
            break;
        }
        buffers.push(*tensor);
        let Some(Stmt::Alloc { body, .. }) = inner.pop() else { unreachable!("an allocation") };
        inner = body;
    }
    if buffers.is_empty() {
        return Err("no shared buffer is computed at it (`cache_read ... at it in shared`)".into());
    }
    let mut copies = Vec::new();
    let mut rest = Vec::new();
    for st in inner {
        match st {
            Stmt::Barrier if rest.is_empty() => {}
            st if rest.is_empty() && writes_only(&st, &buffers) => copies.push(st),
            st => rest.push(st),
        }
    }
    if let Some(t) = buffers.iter().find(|&&t| rest.iter().any(|s| writes(s, t))) {
        return Err(format!("`{}` is written after its copy; only its copy may write it", f.p.tensor(*t).name));
    }
    if let Some(t) = buffers.iter().find(|&&t| !copies.iter().any(|s| writes(s, t))) {
        return Err(format!("`{}` has no copy at the loop's top", f.p.tensor(*t).name));
    }
    for c in &mut copies {
        make_async(f, c, &buffers)?;
    }
    for &t in &buffers {
        if staged.insert(t) {
            f.p.tensors[t.0 as usize].shape.insert(0, n);
        }
    }
    let slot = |f: &mut LoopFunc, ahead: i64| {
        let x = var(f, v);
        let k = int(f, ahead - lo);
        let x = bin(f, BinOp::Add, x, k);
        let n = int(f, n);
        let m = bin(f, BinOp::FloorMod, x, n);
        crate::index::simplify(f, m)
    };
    // Before the loop: slices 0 .. n - 2, a group each (empty ones past the end).
    let mut out = Vec::new();
    for s in 0..n - 1 {
        if s < extent {
            let at = int(f, lo + s);
            let k = int(f, s);
            out.extend(copies.iter().map(|c| copy_of(f, c, v, at, k, &buffers)));
        }
        out.push(Stmt::Async(AsyncStep::Commit));
    }
    // Each iteration: wait for its slice, then start slice + n - 1.
    let mut each = vec![Stmt::Async(AsyncStep::Wait(n - 2)), Stmt::Barrier];
    let ahead = {
        let x = var(f, v);
        let k = int(f, n - 1);
        bin(f, BinOp::Add, x, k)
    };
    let (next, at) = (slot(f, n - 1), slot(f, 0));
    let refill: Vec<Stmt> = copies.iter().map(|c| copy_of(f, c, v, ahead, next, &buffers)).collect();
    let end = int(f, lo + extent);
    let more = bin(f, BinOp::Lt, ahead, end);
    each.push(Stmt::If { cond: more, then: refill });
    each.push(Stmt::Async(AsyncStep::Commit));
    let mut done = HashSet::new();
    for st in &mut rest {
        add_slot(f, st, &buffers, at, &mut done);
    }
    each.extend(rest);
    out.push(Stmt::For { var: v, lo, extent, kind: ForKind::Serial, body: each });
    for &t in buffers.iter().rev() {
        out = vec![Stmt::Alloc { tensor: t, body: out }];
    }
    Ok(out.pop().expect("the outermost buffer"))
}

/// Whether `st` stores, and only to `buffers`.
fn writes_only(st: &Stmt, buffers: &[TensorId]) -> bool {
    let mut stores = Vec::new();
    stored(st, &mut stores);
    !stores.is_empty() && stores.iter().all(|t| buffers.contains(t))
}

fn writes(st: &Stmt, t: TensorId) -> bool {
    let mut stores = Vec::new();
    stored(st, &mut stores);
    stores.contains(&t)
}

fn stored(st: &Stmt, out: &mut Vec<TensorId>) {
    match st {
        Stmt::Store { tensor, .. } | Stmt::Mma { c: Tile { tensor, .. }, .. } => out.push(*tensor),
        Stmt::Wgmma(w) => out.push(w.c.tensor),
        s => s.body().iter().for_each(|s| stored(s, out)),
    }
}

/// Turns the vectorized loops of a copy into asynchronous copies where
/// both ends are provably aligned to the copy's size (`cp.async` needs
/// it); others stay synchronous copies of the slice ahead (an implicit
/// im2col's columns, `X[.., w + s]`).
fn make_async(f: &LoopFunc, st: &mut Stmt, buffers: &[TensorId]) -> Result<(), String> {
    match st {
        Stmt::For { var, lo, kind: kind @ ForKind::Vectorized, extent, body } => {
            let [Stmt::Store { tensor, indices, value }] = body.as_slice() else {
                return Err("a copy's vectorized loop holds more than one store".into());
            };
            check_copy(f, *tensor, *value, *extent, buffers)?;
            let TExpr::Load(src, src_idx) = f.p.expr(*value) else { unreachable!("checked by check_copy") };
            let bytes = (*extent * f.p.tensor(*tensor).elem.size() as i64) as u32;
            // `cp.async` moves one contiguous, aligned run of elements on each side.
            let aligned = |t: TensorId, idx: &[TExprId]| {
                crate::analysis::access(f, t, idx, *var) == crate::analysis::Access::Contiguous
                    && crate::analysis::vector_alignment(&f.p, t, idx, *var, *lo, *extent as u32) == bytes
            };
            if aligned(*tensor, indices) && aligned(*src, src_idx) {
                *kind = ForKind::Async;
            }
            Ok(())
        }
        Stmt::For { body, .. } | Stmt::If { then: body, .. } => {
            body.iter_mut().try_for_each(|s| make_async(f, s, buffers))
        }
        Stmt::Store { tensor, value, .. } => check_copy(f, *tensor, *value, 1, buffers),
        Stmt::Alloc { .. } | Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::TileDot(_) => {
            Err("a copy holds more than stores".into())
        }
        Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => Ok(()),
    }
}

fn check_copy(f: &LoopFunc, t: TensorId, value: TExprId, lanes: i64, buffers: &[TensorId]) -> Result<(), String> {
    let d = f.p.tensor(t);
    let name = &d.name;
    let TExpr::Load(src, _) = f.p.expr(value) else {
        return Err(format!("`{name}`'s copy computes its values; an asynchronous copy only moves them"));
    };
    if buffers.contains(src) || f.shared.contains(src) || f.p.tensor(*src).elem != d.elem {
        return Err(format!("`{name}`'s copy must load a global tensor of its own element type"));
    }
    let bytes = lanes * d.elem.size() as i64;
    if !matches!(bytes, 4 | 8 | 16) {
        let per16 = 16 / d.elem.size() as i64;
        return Err(format!(
            "each thread copies {bytes} bytes of `{name}` at a time and `cp.async` copies 4, 8 or 16: \
             vectorize the innermost loop of `{name}` ({per16} elements of {} make 16 bytes)",
            d.elem
        ));
    }
    Ok(())
}

/// A copy of statement `c` for the slice where `v` is `at`, into slot `slot`.
fn copy_of(f: &mut LoopFunc, c: &Stmt, v: VarId, at: TExprId, slot: TExprId, buffers: &[TensorId]) -> Stmt {
    let mut map = HashMap::from([(v, at)]);
    let mut st = clone_stmt(f, c, &mut map);
    add_slot(f, &mut st, buffers, slot, &mut HashSet::new());
    st
}

/// Deep copy of `st` with variables replaced by `map`; its loops get new variables.
fn clone_stmt(f: &mut LoopFunc, st: &Stmt, map: &mut HashMap<VarId, TExprId>) -> Stmt {
    let e = |f: &mut LoopFunc, x: TExprId, map: &HashMap<VarId, TExprId>| {
        let r = subst(&mut f.p, x, map, &HashMap::new());
        crate::index::simplify(f, r)
    };
    match st {
        Stmt::For { var: old, lo, extent, kind, body } => {
            let d = f.vars[*old as usize].clone();
            let nv = f.new_var(d.name, d.extent);
            let x = var(f, nv);
            map.insert(*old, x);
            let body = body.iter().map(|s| clone_stmt(f, s, map)).collect();
            Stmt::For { var: nv, lo: *lo, extent: *extent, kind: *kind, body }
        }
        Stmt::If { cond, then } => {
            let cond = e(f, *cond, map);
            Stmt::If { cond, then: then.iter().map(|s| clone_stmt(f, s, map)).collect() }
        }
        Stmt::Store { tensor, indices, value } => {
            let indices = indices.iter().map(|&i| e(f, i, map)).collect();
            Stmt::Store { tensor: *tensor, indices, value: e(f, *value, map) }
        }
        Stmt::Alloc { .. }
        | Stmt::Mma { .. }
        | Stmt::Wgmma(_)
        | Stmt::TileDot(_)
        | Stmt::Barrier
        | Stmt::Async(_)
        | Stmt::WarpReduce(_) => st.clone(),
        Stmt::Prefetch { tensor, offset } => Stmt::Prefetch { tensor: *tensor, offset: e(f, *offset, map) },
    }
}

/// Prefixes every access to `buffers` in `st` with the slot index `slot`.
fn add_slot(f: &mut LoopFunc, st: &mut Stmt, buffers: &[TensorId], slot: TExprId, done: &mut HashSet<TExprId>) {
    match st {
        Stmt::For { body, .. } | Stmt::Alloc { body, .. } => {
            body.iter_mut().for_each(|s| add_slot(f, s, buffers, slot, done))
        }
        Stmt::If { cond, then } => {
            slot_loads(f, *cond, buffers, slot, done);
            then.iter_mut().for_each(|s| add_slot(f, s, buffers, slot, done))
        }
        Stmt::Store { tensor, indices, value } => {
            for &e in indices.iter().chain([&*value]) {
                slot_loads(f, e, buffers, slot, done);
            }
            if buffers.contains(tensor) {
                indices.insert(0, slot);
            }
        }
        Stmt::Mma { c, a, b, .. } => {
            for t in [c, a, b] {
                if buffers.contains(&t.tensor) {
                    t.origin.insert(0, slot);
                    t.rows += 1;
                    t.cols += 1;
                }
            }
        }
        // CPU only: no GPU pipeline stages.
        Stmt::TileDot(_) => {}
        Stmt::Wgmma(w) => {
            if buffers.contains(&w.c.tensor) {
                w.c.origin.insert(0, slot);
                w.c.rows += 1;
                w.c.cols += 1;
            }
            for m in [&mut w.a, &mut w.b] {
                if buffers.contains(&m.tensor) {
                    m.origin.insert(0, slot);
                }
            }
        }
        Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => {}
    }
}

/// Gives the loads of `buffers` in `e` the slot index first. The loads are
/// changed in place: the buffers are the loop's own, so no expression
/// outside it holds them; `done` keeps a node shared by two statements
/// from getting two slots.
fn slot_loads(f: &mut LoopFunc, e: TExprId, buffers: &[TensorId], slot: TExprId, done: &mut HashSet<TExprId>) {
    if !done.insert(e) {
        return;
    }
    for c in f.p.children(e) {
        slot_loads(f, c, buffers, slot, done);
    }
    if let TExpr::Load(t, idx) = f.p.expr(e).clone() {
        if buffers.contains(&t) {
            let idx = std::iter::once(slot).chain(idx).collect();
            f.p.exprs[e.0 as usize] = TExpr::Load(t, idx);
        }
    }
}

/// Pads the rows of shared f16 (and 8-bit) buffers that tensor-core operations read
/// (by `ldmatrix`, eight rows of 16 bytes per step) by 16 bytes where
/// their length in 16-byte units is even: then the eight rows fall on
/// eight different groups of banks instead of sharing two or one (a row of
/// 64 bytes conflicts 4-way, one of 256 bytes 8-way). Indices are
/// unchanged; the padding is never read. Skipped where the padded buffers
/// would not fit in `limit` bytes of shared memory.
pub fn pad_ldmatrix_rows(f: &mut LoopFunc, limit: i64) {
    let mut operands = Vec::new();
    mma_operands(&f.body, &mut operands);
    operands.sort();
    operands.dedup();
    let padded: Vec<(TensorId, i64)> = operands
        .into_iter()
        .filter(|t| f.shared.contains(t))
        .filter_map(|t| {
            let d = f.p.tensor(t);
            let (elem, last) = (d.elem.size() as i64, *d.shape.last()?);
            let units = last * elem / 16;
            (matches!(d.elem, ElemType::F16 | ElemType::BF16 | ElemType::I8 | ElemType::U8)
                && d.shape.len() >= 2
                && last * elem % 16 == 0
                && units % 2 == 0)
                .then_some((t, 16 / elem))
        })
        .collect();
    let bytes = |f: &LoopFunc, extra: &dyn Fn(TensorId) -> i64| -> i64 {
        f.shared
            .iter()
            .map(|&t| {
                let d = f.p.tensor(t);
                let rows = d.len() / d.shape.last().copied().unwrap_or(1).max(1);
                (d.len() + rows * extra(t)) * d.elem.size() as i64
            })
            .sum()
    };
    let extra = |t: TensorId| padded.iter().find(|(p, _)| *p == t).map_or(0, |(_, e)| *e);
    if padded.is_empty() || bytes(f, &extra) > limit {
        return;
    }
    for (t, e) in padded {
        *f.p.tensors[t.0 as usize].shape.last_mut().expect("rows") += e;
    }
}

fn mma_operands(body: &[Stmt], out: &mut Vec<TensorId>) {
    for s in body {
        match s {
            Stmt::Mma { a, b, .. } => out.extend([a.tensor, b.tensor]),
            // A wgmma's operands are laid out as its descriptors say: not padded.
            s => mma_operands(s.body(), out),
        }
    }
}

fn var(f: &mut LoopFunc, v: VarId) -> TExprId {
    f.p.alloc(TExpr::Var(v), Ty::Index, Default::default())
}
