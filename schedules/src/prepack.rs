//! Panels of constant operands, made once: a TIR-to-TIR pass for CPU
//! targets that runs before constants are folded.
//!
//! The default CPU schedule packs the vector operand `B` of a long matrix
//! product into panels as wide as its register block (`cache_read B ...
//! layout (j / w, k, j % w)`, `strategy/cpu/pack.rs`) for every slice of the
//! reduction and block of columns, on every call. When `B` is a constant —
//! an imported model's weights, or a stage that reads only them, like
//! im2col's filter matrix — those panels are the same on every call: this
//! pass gives the product a stage of its own that writes them,
//! `B.panels[q, .., r] = B[.., q * w + r]`, and makes the product read
//! `B.panels[j / w, .., j % w]` instead of `B[.., j]` (a batch of
//! products, read at the product's own axes first — Winograd's products per
//! tile position, `U[i, j, c, k]` — has its panels after those axes,
//! `U.panels[i, j, q, c, r]`: [`batch_axes`]). The panels' stage
//! reads only constants, so folding (`texc_compiler::constants`) moves it
//! into the prologue that runs once; the product's register block reads
//! each panel row as one contiguous vector, and the schedule no longer
//! packs (the load is not a plain one of its innermost axis). Where the
//! panels' width does not divide `B`'s columns, the last panel is padded
//! with zeros that no read reaches (RegNetX-400MF's 400 → 400 filters at
//! 7 × 7, computed filters-last in panels of 32: packed per call, the
//! weights read from L3 in the model, 0.23 ms a layer at one thread
//! against 0.16 alone; from panels made once the model ran 10.3–12.0 →
//! 9.2–9.5 ms, Zen 4, AVX-512).
//!
//! The same for a register block's broadcast operand when it is constant
//! (a 1×1 convolution's filters `W[k, c, 0, 0]`, read as the scalars of
//! `rows` filters per step of `c`): `W.rows[k / rows, c, 0, 0, k % rows]`
//! puts each block's filters in one contiguous stream, where the block read
//! `rows` strided ones — which the hardware prefetcher does not follow for a
//! whole layer's weights that are not in cache (MobileNetV2's 320 → 1280
//! layer 0.53 → 0.43 ms).
//!
//! The same, padded past the end, for a register block's vector operand
//! that the schedule does not pack, the product being too short to repay a
//! pack per call (a classifier's matrix-vector product): each step of the
//! reduction reads the block's `w` lanes of one row, the next step a row
//! further; from `B.panels[j / w, k, j % w]` the block streams one
//! contiguous panel, which the prefetcher follows where pieces a row apart,
//! each in another page, it did not (AlexNet's 4096 → 4096 layer at batch
//! 1: 3.2 → 2.2 ms). Likewise where the product is long but has too few
//! columns for the schedule's blocks of panels, the only products it packs
//! per call (a 1×1 convolution's 232 filters at 7 × 7 over a channels-last
//! input, its reduction cut into slices and the block resumed per slice,
//! the row blocks outside the panels): each row block re-reads its slice
//! of the weights, in a model from beyond the L2, a row apart per step.
//!
//! Which products pack, and how wide, is the default schedule's decision:
//! the pass runs it on a copy of the program and takes the packs it made.
//!
//! Invariants: the program computes the same values (`B.panels` holds `B`'s
//! elements, and zeros at `q * w + r` past `B`'s last extent, which no read
//! of the panels reaches;
//! `B.rows` holds `B`'s elements and zeros past the end of its split axis);
//! stages stay in an order where every tensor is written before it is read
//! (the panels' stage goes just before the first product that reads it);
//! operator records' stage ranges move with the inserted stages.

use crate::ir::ForKind;
use crate::knobs::DefaultKnobs;
use crate::normalize::{fresh_name, with_children};
use crate::schedule::{LayoutDim, Rel, StageSchedule};
use crate::strategy::default_schedule_with;
use texc_compiler::ops::BinOp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

/// A product (the stage writing `consumer`) whose operand `operand` the
/// default schedule packs into panels `width` wide — or, `streamed`, whose
/// register block reads it unpacked, `width` lanes of each row at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pack {
    pub consumer: TensorId,
    pub operand: TensorId,
    pub width: i64,
    pub streamed: bool,
}

/// A register block's broadcast operand: `operand`'s axis `dim` is the
/// product's axis `axis` (alone), which the block splits into `rows` rows;
/// the operand does not vary along the vectors. A 1×1 convolution's
/// `W[k, c, 0, 0]`, read as the scalars `W[k.b * rows + k.r, c, 0, 0]` of
/// `rows` filters at once: `rows` short strided streams per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPack {
    pub operand: TensorId,
    pub dim: usize,
    pub axis: VarId,
    pub rows: i64,
}

/// The packs the default schedule of `target` (with `knobs`) makes in `p`.
pub fn packs(p: &Program, target: &Target, knobs: DefaultKnobs) -> Vec<Pack> {
    schedule_packs(p, target, knobs).0
}

/// The default schedule's packs of vector operands, and its register
/// blocks' broadcast operands, from one run of it on a copy of `p`.
fn schedule_packs(p: &Program, target: &Target, knobs: DefaultKnobs) -> (Vec<Pack>, Vec<RowPack>) {
    let mut q = p.clone();
    let s = default_schedule_with(&mut q, target, knobs);
    // Operands the schedule made on the copy (`.r0`, `.packed`, ..) are not `p`'s.
    let rows = s
        .stages
        .iter()
        .enumerate()
        .flat_map(|(si, ss)| row_operands(&q, &q.stages[si], ss))
        .filter(|pack| (pack.operand.0 as usize) < p.tensors.len())
        .collect();
    let mut found = Vec::new();
    for (bi, at) in s.attach.iter().enumerate() {
        let Some(a) = at else { continue };
        let Some(width) = panel_width(a.layout.as_deref()) else { continue };
        let TExpr::Load(operand, _) = q.expr(q.stages[bi].value) else { continue };
        let pack = Pack { consumer: q.stages[a.owner].tensor, operand: *operand, width, streamed: false };
        if !found.contains(&pack) {
            found.push(pack);
        }
    }
    for (si, ss) in s.stages.iter().enumerate() {
        let st = &q.stages[si];
        let Some((operand, width)) = streamed_operand(&q, st, ss) else { continue };
        // The product may be a stage preparation split off (`C.r0`): `p`'s is its operand's reader.
        if (operand.0 as usize) >= p.tensors.len() || found.iter().any(|f| f.consumer == st.tensor) {
            continue;
        }
        found.push(Pack { consumer: st.tensor, operand, width, streamed: true });
    }
    (found, rows)
}

/// The vector operand that stage `st`'s register block reads unpacked, and
/// the block's width along the innermost axis: for each step of the
/// reduction, outside the block, `width` lanes of one of the operand's
/// rows, the next step a whole row further (a product too short for the
/// schedule to pack on each call: a classifier's matrix-vector product;
/// or one of too few columns for blocks of panels, which the schedule
/// packs only with them: a 1×1 convolution's 232 filters at 7 × 7).
/// Those strided pieces, each in another 4 KiB page for rows of 1024 lanes
/// or more, are what the hardware prefetcher does not follow (AlexNet's
/// 4096 → 4096 layer at batch 1: 3.2 ms, 2.2 from contiguous panels).
fn streamed_operand(q: &Program, st: &Stage, ss: &StageSchedule) -> Option<(TensorId, i64)> {
    let inner = st.n_axes.checked_sub(1)?;
    // A block resumed per slice streams its slice of the operand's rows as
    // well, once per row block where the row blocks run outside the panels:
    // in a model, from beyond the L2, each step's piece a row of the
    // operand from the last (EfficientNet-B3's 1392 → 232 at 7 × 7 over a
    // channels-last input, filters-last in 3 slices of 512, 15 panels too
    // few to block: 0.50 → 0.38 ms in the model on `x86-avx2`; extracted
    // with its neighbours, the weights then cached, 0.33 unpacked).
    ss.cache_write.as_ref()?;
    let operand = crate::strategy::vector_operand(q, st)?;
    let in_block = |l: usize| {
        let v = &ss.ivs[l];
        !v.reduce && matches!(v.kind, ForKind::Unrolled | ForKind::Vectorized) && split_root(ss, l) == Some(inner)
    };
    let first_block = ss.leaves.iter().position(|&l| in_block(l))?;
    let first_reduction = ss.leaves.iter().position(|&l| ss.ivs[l].reduce)?;
    if first_reduction > first_block || !ss.leaves.iter().any(|&l| in_block(l) && ss.ivs[l].kind == ForKind::Vectorized)
    {
        return None;
    }
    let width: i64 = ss.leaves.iter().filter(|&&l| in_block(l)).map(|&l| ss.ivs[l].extent).product();
    let row = *q.tensor(operand).shape.last()?;
    (row > width).then_some((operand, width))
}

/// The stage axis that `iv` splits (through splits only).
fn split_root(ss: &StageSchedule, iv: usize) -> Option<usize> {
    match ss.ivs[iv].rel {
        Rel::Root(a) => Some(a),
        Rel::Split { parent, .. } => split_root(ss, parent),
        Rel::Fuse { .. } => None,
    }
}

/// The broadcast operands of stage `st`'s register block, if it has one
/// (rows of an axis unrolled inside the reduction loops; their
/// accumulators in a local, resumed per slice where the reduction is cut
/// into slices — ResNet-50's 1×1 convolutions of 1024 channels read 8
/// filters' rows 4 KiB apart — or in the output).
fn row_operands(q: &Program, st: &Stage, ss: &StageSchedule) -> Vec<RowPack> {
    let Some(inner) = st.n_axes.checked_sub(1) else { return Vec::new() };
    if ss.cache_write.is_none() && !ss.leaves.iter().any(|&l| ss.ivs[l].reduce) {
        return Vec::new();
    }
    let block = ss.ivs.iter().find_map(|iv| match iv.rel {
        Rel::Split { parent, outer: false, factor } if iv.kind == ForKind::Unrolled && !iv.reduce => {
            // A split of a fused `n.k` by `rows` splits `k` when `rows` divides it.
            match ss.ivs[parent].rel {
                Rel::Root(a) => Some((a, factor)),
                Rel::Fuse { .. } => {
                    innermost_root(ss, parent).filter(|&a| st.vars[a].extent % factor == 0).map(|a| (a, factor))
                }
                Rel::Split { .. } => None,
            }
        }
        _ => None,
    });
    let Some((axis, rows)) = block.filter(|&(a, r)| a < inner && r > 1) else {
        return Vec::new();
    };
    let mut loads = Vec::new();
    crate::analysis::loads_in(q, st.value, &mut loads);
    let mut found: Vec<RowPack> = Vec::new();
    for l in loads {
        let TExpr::Load(t, idx) = q.expr(l) else { continue };
        let is = |i: TExprId, v: usize| matches!(q.expr(i), TExpr::Var(x) if *x as usize == v);
        let at: Vec<usize> = (0..idx.len()).filter(|&d| is(idx[d], axis)).collect();
        let [dim] = at[..] else { continue };
        let elsewhere = idx.iter().enumerate().any(|(d, &i)| {
            (d != dim && crate::analysis::involves(q, i, axis as VarId))
                || crate::analysis::involves(q, i, inner as VarId)
        });
        let pack = RowPack { operand: *t, dim, axis: axis as VarId, rows };
        if !elsewhere && !found.contains(&pack) {
            found.push(pack);
        }
    }
    found
}

/// The stage axis that `iv` is, or that it fuses innermost.
fn innermost_root(ss: &StageSchedule, iv: usize) -> Option<usize> {
    match ss.ivs[iv].rel {
        Rel::Root(a) => Some(a),
        Rel::Fuse { inner, .. } => innermost_root(ss, inner),
        Rel::Split { .. } => None,
    }
}

/// `w` of a layout `(d / w, .., d % w)` over the last axis `d`.
fn panel_width(layout: Option<&[LayoutDim]>) -> Option<i64> {
    match layout? {
        [LayoutDim::Div(d, w), mid @ .., LayoutDim::Rem(e, v)]
            if d == e && w == v && mid.iter().enumerate().all(|(i, l)| *l == LayoutDim::Whole(i)) =>
        {
            Some(*w)
        }
        _ => None,
    }
}

/// Give every product whose packed operand is a constant — an input
/// `constant_input` names, or what stages compute from constants and
/// scalars `known_scalar` names — a panels stage of its own (see the module
/// header); the number of panel tensors made. Only on CPU targets, whose
/// default schedule packs.
pub fn prepack_constant_operands(
    p: &mut Program,
    target: &Target,
    knobs: DefaultKnobs,
    constant_input: &dyn Fn(&str) -> bool,
    known_scalar: &dyn Fn(&str) -> bool,
) -> usize {
    if target.kind != TargetKind::Cpu || knobs.pack == Some(false) {
        return 0;
    }
    let constants = texc_compiler::constants::constant_tensors(p, constant_input, known_scalar);
    let constant = |t: TensorId| constants.get(t.0 as usize).copied().unwrap_or(false);
    // The packs are those of the program that runs once the constants are
    // folded (tensor ids unchanged): there a weight's transpose made for a
    // product (`W.t[k, m] = W[m, k]`) is an input, where in `p` preparation
    // would inline it back into the product and schedule another form.
    let folded = texc_compiler::constants::split(p, constant_input, known_scalar).map(|s| s.main);
    let (panel_packs, row_packs) = schedule_packs(folded.as_ref().unwrap_or(p), target, knobs);
    let mut made: Vec<MadePanels> = Vec::new();
    // Who reads what, kept up to date as products are rewritten: looked up
    // per pack, not found by a walk of every stage (quadratic in a model's
    // layers). The new stages go in at the end, all at once: inserted one
    // by one, each would move every later stage.
    let mut reads = crate::strategy::Reads::of(p);
    let mut pending = PendingStages::default();
    for pack in panel_packs {
        let b = p.tensor(pack.operand);
        // A last panel past the operand's end is padded with zeros: the
        // block's last, shorter copy reads none of them.
        if !constant(pack.operand) || b.shape.is_empty() {
            continue;
        }
        // A streamed operand is one product's alone: one given panels
        // already is read by them too (their stage, still to be inserted,
        // is not in `reads`).
        if pack.streamed && made.iter().any(|m| m.operand == pack.operand) {
            continue;
        }
        let Some(ci) = consumer(&reads, pack) else { continue };
        if !reads_along_innermost(p, ci, pack.operand) {
            continue;
        }
        // Panels made for another product are read in their layout.
        let (panels, lead) = match made.iter().find(|m| m.operand == pack.operand && m.width == pack.width) {
            Some(m) => (m.panels, m.lead),
            None => {
                let lead = batch_axes(p, ci, pack.operand);
                let (panels, stage) = panels_stage(p, pack.operand, pack.width, lead);
                pending.push(ci, stage);
                made.push(MadePanels { operand: pack.operand, width: pack.width, panels, lead });
                (panels, lead)
            }
        };
        let value = p.stages[ci].value;
        let inner = p.stages[ci].n_axes as VarId - 1;
        p.stages[ci].value = read_panels(p, value, pack.operand, (panels, pack.width, lead), inner);
        reads.refresh(p, ci);
    }
    let mut rows_made = 0;
    for pack in row_packs {
        // An operand given panels is read by its panels' stage, which folds.
        if !constant(pack.operand) || made.iter().any(|m| m.operand == pack.operand) {
            continue;
        }
        // One reader, which reads it as the block did: weights of one layer.
        let readers: Vec<usize> = reads.readers(pack.operand).collect();
        let [ci] = readers[..] else { continue };
        if !reads_by_rows(p, ci, pack) {
            continue;
        }
        let (rows, stage) = rows_stage(p, pack);
        pending.push(ci, stage);
        let value = p.stages[ci].value;
        p.stages[ci].value = read_rows(p, value, pack, rows);
        reads.refresh(p, ci);
        rows_made += 1;
    }
    debug_assert!(reads == crate::strategy::Reads::of(p), "prepack kept its index of reads up to date");
    pending.splice(p);
    made.len() + rows_made
}

/// Panels made of a constant operand `width` wide: their tensor, and the
/// operand's leading axes they keep before the panel index ([`batch_axes`]).
struct MadePanels {
    operand: TensorId,
    width: i64,
    panels: TensorId,
    lead: usize,
}

/// The stage of `p` that is `pack`'s product: the stage writing its
/// consumer; where the schedule found the product in a stage that
/// preparation split off it (`C.r0`, not `p`'s: a grouped convolution's sum
/// before its bias and activation), or for a streamed operand, the one
/// stage reading the operand. (RegNetX-1.6GF's 7 × 7 grouped convolutions,
/// blocked by whole groups of 24 filters on AVX2, packed their weights on
/// every call.)
fn consumer(reads: &crate::strategy::Reads, pack: Pack) -> Option<usize> {
    if let Some(ci) = reads.first_writer(pack.consumer).filter(|_| !pack.streamed) {
        return Some(ci);
    }
    let readers: Vec<usize> = reads.readers(pack.operand).collect();
    match readers[..] {
        [ci] => Some(ci),
        _ => None,
    }
}

/// Whether every load of `pack.operand` in stage `ci` indexes its axis
/// `dim` by the axis `pack.axis` alone, and no other axis by it.
fn reads_by_rows(p: &Program, ci: usize, pack: RowPack) -> bool {
    let st = &p.stages[ci];
    if pack.axis as usize >= st.n_axes {
        return false;
    }
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, st.value, &mut loads);
    loads.iter().all(|&e| match p.expr(e) {
        TExpr::Load(t, idx) if *t == pack.operand => idx.iter().enumerate().all(|(d, &i)| {
            let var = matches!(p.expr(i), TExpr::Var(v) if *v == pack.axis);
            if d == pack.dim {
                var
            } else {
                !crate::analysis::involves(p, i, pack.axis)
            }
        }),
        _ => true,
    })
}

/// The stage `B.rows[.., q, .., r] = B[.., q * rows + r, ..]` (axis `dim`
/// split, its remainder last; 0 past its end, in the last block's rows
/// that a shorter copy of the block's loops never reads): its tensor, and
/// the stage, to be inserted before the product.
fn rows_stage(p: &mut Program, pack: RowPack) -> (TensorId, Stage) {
    let decl = p.tensor(pack.operand).clone();
    let span = decl.span;
    let extent = decl.shape[pack.dim];
    let mut shape = decl.shape.clone();
    shape[pack.dim] = (extent + pack.rows - 1) / pack.rows;
    shape.push(pack.rows);
    let name = fresh_name(p, &format!("{}.rows", decl.name));
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape: shape.clone(), role: TensorRole::Temp, span });
    let rows = TensorId(p.tensors.len() as u32 - 1);
    let var = |p: &mut Program, v: usize| p.alloc(TExpr::Var(v as VarId), Ty::Index, span);
    let rank = decl.shape.len();
    let mut index: Vec<TExprId> = (0..rank).map(|v| var(p, v)).collect();
    let (r, count) = (var(p, rank), p.alloc(TExpr::Int(pack.rows), Ty::Index, span));
    let base = p.alloc(TExpr::Binary(BinOp::Mul, index[pack.dim], count), Ty::Index, span);
    let row = p.alloc(TExpr::Binary(BinOp::Add, base, r), Ty::Index, span);
    index[pack.dim] = row;
    let mut value = p.alloc(TExpr::Load(pack.operand, index), Ty::Elem(decl.elem), span);
    if extent % pack.rows != 0 {
        value = zero_past(p, value, row, extent, decl.elem);
    }
    let mut vars: Vec<VarDecl> =
        shape[..rank].iter().enumerate().map(|(d, &extent)| VarDecl { name: format!("d{d}"), extent }).collect();
    vars.push(VarDecl { name: "r".into(), extent: pack.rows });
    (rows, Stage { tensor: rows, n_axes: vars.len(), vars, value, span })
}

/// `e` with every load `b[.., k, ..]` (`k` at `pack.dim`) replaced by
/// `rows[.., k / n, .., k % n]`.
fn read_rows(p: &mut Program, e: TExprId, pack: RowPack, rows: TensorId) -> TExprId {
    if let TExpr::Load(t, idx) = p.expr(e).clone() {
        if t == pack.operand {
            let span = p.span(e);
            let n = p.alloc(TExpr::Int(pack.rows), Ty::Index, span);
            let mut index = idx.clone();
            index[pack.dim] = p.alloc(TExpr::Binary(BinOp::FloorDiv, idx[pack.dim], n), Ty::Index, span);
            index.push(p.alloc(TExpr::Binary(BinOp::FloorMod, idx[pack.dim], n), Ty::Index, span));
            let ty = p.ty(e);
            return p.alloc(TExpr::Load(rows, index), ty, span);
        }
    }
    let children = p.children(e);
    let new: Vec<TExprId> = children.into_iter().map(|c| read_rows(p, c, pack, rows)).collect();
    with_children(p, e, new)
}

/// Whether every load of `b` in stage `ci` indexes `b`'s last axis by the
/// stage's innermost axis alone (as the schedule's packed operand does).
fn reads_along_innermost(p: &Program, ci: usize, b: TensorId) -> bool {
    let st = &p.stages[ci];
    let Some(inner) = st.n_axes.checked_sub(1) else { return false };
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, st.value, &mut loads);
    let mine: Vec<_> = loads.iter().filter(|&&e| matches!(p.expr(e), TExpr::Load(t, _) if *t == b)).collect();
    !mine.is_empty()
        && mine.iter().all(|&&e| {
            let TExpr::Load(_, idx) = p.expr(e) else { return false };
            idx.last().is_some_and(|&i| matches!(p.expr(i), TExpr::Var(v) if *v as usize == inner))
        })
}

/// The stage `B.panels[d0, .., q, .., r] = B[d0, .., q * w + r]` (0 past
/// the end of `B`'s last axis where `w` does not divide it), the panel
/// index `q` after `B`'s first `lead` axes ([`batch_axes`]): the panels'
/// tensor, and the stage, to be inserted before the first product reading them.
fn panels_stage(p: &mut Program, b: TensorId, w: i64, lead: usize) -> (TensorId, Stage) {
    let decl = p.tensor(b).clone();
    let span = decl.span;
    let last = decl.shape.len() - 1;
    debug_assert!(lead <= last, "the batch axes come before the panels' columns");
    let mut shape = decl.shape[..lead].to_vec();
    shape.push((decl.shape[last] + w - 1) / w);
    shape.extend(&decl.shape[lead..last]);
    shape.push(w);
    let name = fresh_name(p, &format!("{}.panels", decl.name));
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape: shape.clone(), role: TensorRole::Temp, span });
    let panels = TensorId(p.tensors.len() as u32 - 1);
    let var = |p: &mut Program, v: usize| p.alloc(TExpr::Var(v as VarId), Ty::Index, span);
    // `B`'s axis `d` is the panels' `d` before the panel index, `d + 1` after it.
    let mut index: Vec<TExprId> = (0..last).map(|d| var(p, if d < lead { d } else { d + 1 })).collect();
    let (q, r, width) = (var(p, lead), var(p, last + 1), p.alloc(TExpr::Int(w), Ty::Index, span));
    let base = p.alloc(TExpr::Binary(BinOp::Mul, q, width), Ty::Index, span);
    let column = p.alloc(TExpr::Binary(BinOp::Add, base, r), Ty::Index, span);
    index.push(column);
    let mut value = p.alloc(TExpr::Load(b, index), Ty::Elem(decl.elem), span);
    if decl.shape[last] % w != 0 {
        value = zero_past(p, value, column, decl.shape[last], decl.elem);
    }
    let mut vars: Vec<VarDecl> = (0..lead).map(|d| VarDecl { name: format!("d{d}"), extent: decl.shape[d] }).collect();
    vars.push(VarDecl { name: "q".into(), extent: shape[lead] });
    vars.extend((lead..last).map(|d| VarDecl { name: format!("d{d}"), extent: decl.shape[d] }));
    vars.push(VarDecl { name: "r".into(), extent: w });
    let n_axes = vars.len();
    (panels, Stage { tensor: panels, vars, n_axes, value, span })
}

/// How many of `b`'s leading axes (not its last) every load of it in stage
/// `ci` indexes by one of the stage's axes alone: a batch of products, such
/// as Winograd's products per tile position, `U[i, j, c, k]` read at the
/// stage's `i, j`. Their panels go after those axes, in the order the
/// product's loops walk them (the batch axes the vector operand reads stay
/// outside its column blocks: `strategy/cpu/blocking.rs`), so that the
/// panels one parallel iteration after another reads lie one after another
/// in memory, which the prefetch pass takes runs of (`crate::prefetch`).
/// MEASURED: ResNet-101's 3 × 3 convolutions at 14², 256 channels,
/// Winograd's products in the model with their 4 MB of weights from memory,
/// ran at 80 % of the AVX-512 peak against 99 % alone.
fn batch_axes(p: &Program, ci: usize, b: TensorId) -> usize {
    let st = &p.stages[ci];
    let last = p.tensor(b).shape.len().saturating_sub(1);
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, st.value, &mut loads);
    let spatial = |i: TExprId| matches!(p.expr(i), TExpr::Var(v) if (*v as usize) < st.n_axes);
    (0..last)
        .take_while(|&d| {
            loads.iter().all(|&e| match p.expr(e) {
                TExpr::Load(t, idx) if *t == b => spatial(idx[d]),
                _ => true,
            })
        })
        .count()
}

/// Insert `st` at stage index `at`, in the operator of the stage there.
pub(crate) fn insert_stage(p: &mut Program, at: usize, st: Stage) {
    p.stages.insert(at, st);
    // The packed operand belongs to the product's operator; later ones move up one.
    for op in &mut p.ops {
        if op.stages.start > at {
            op.stages.start += 1;
            op.stages.end += 1;
        } else if op.stages.end > at {
            op.stages.end += 1;
        }
    }
}

/// Stages to insert, each before a stage of the program as it stands, put
/// in by one [`PendingStages::splice`]: a pass that inserts a stage per
/// layer one at a time moves every later stage each time (quadratic in a
/// model's layers).
#[derive(Default)]
pub(crate) struct PendingStages(Vec<(usize, Stage)>);

impl PendingStages {
    /// `st`, to go just before the stage now at index `before` (after the
    /// ones pushed before it for the same place).
    pub(crate) fn push(&mut self, before: usize, st: Stage) {
        self.0.push((before, st));
    }

    /// Insert every pending stage; each joins the operator of the stage it
    /// precedes, as [`insert_stage`] would have put it, and later operator
    /// records move with their stages.
    pub(crate) fn splice(self, p: &mut Program) {
        let mut pending = self.0;
        if pending.is_empty() {
            return;
        }
        pending.sort_by_key(|&(at, _)| at);
        let places: Vec<usize> = pending.iter().map(|&(at, _)| at).collect();
        let old = std::mem::take(&mut p.stages);
        let mut stages = Vec::with_capacity(old.len() + pending.len());
        let mut pending = pending.into_iter().peekable();
        for (si, st) in old.into_iter().enumerate() {
            while let Some((_, new)) = pending.next_if(|&(at, _)| at == si) {
                stages.push(new);
            }
            stages.push(st);
        }
        stages.extend(pending.map(|(_, st)| st));
        p.stages = stages;
        let before = |si: usize| places.partition_point(|&at| at < si);
        for op in &mut p.ops {
            op.stages.start += before(op.stages.start);
            op.stages.end += before(op.stages.end);
        }
    }
}

/// [`crate::normalize::drop_stages`], with the operator records' stage
/// ranges counting only the stages left (as removing each would have moved
/// them): for the passes that keep those records, before constants fold.
pub(crate) fn drop_stages_of_ops(p: &mut Program, dead: &[bool]) {
    crate::normalize::drop_stages(p, dead);
    // `dropped_before[i]`: how many of the stages before index `i` are dropped.
    let dropped_before: Vec<usize> = std::iter::once(0)
        .chain(dead.iter().scan(0, |n, &gone| {
            *n += gone as usize;
            Some(*n)
        }))
        .collect();
    // A record past the end (a pass that keeps no records ran before) is
    // moved by all the dropped stages, as removing each would have moved it.
    let before = |si: usize| dropped_before[si.min(dead.len())];
    for op in &mut p.ops {
        op.stages.start -= before(op.stages.start);
        op.stages.end -= before(op.stages.end);
    }
}

/// `e` with every load `b[i.., j]` replaced by `panels[i..lead, j / w, i.., j % w]`.
fn read_panels(
    p: &mut Program,
    e: TExprId,
    b: TensorId,
    (panels, w, lead): (TensorId, i64, usize),
    inner: VarId,
) -> TExprId {
    if let TExpr::Load(t, idx) = p.expr(e).clone() {
        if t == b {
            let span = p.span(e);
            let (&j, rest) = idx.split_last().expect("a loaded tensor has axes");
            debug_assert!(matches!(p.expr(j), TExpr::Var(v) if *v == inner));
            let width = p.alloc(TExpr::Int(w), Ty::Index, span);
            let mut index = rest[..lead].to_vec();
            index.push(p.alloc(TExpr::Binary(BinOp::FloorDiv, j, width), Ty::Index, span));
            index.extend(&rest[lead..]);
            index.push(p.alloc(TExpr::Binary(BinOp::FloorMod, j, width), Ty::Index, span));
            let ty = p.ty(e);
            return p.alloc(TExpr::Load(panels, index), ty, span);
        }
    }
    let children = p.children(e);
    let new: Vec<TExprId> = children.into_iter().map(|c| read_panels(p, c, b, (panels, w, lead), inner)).collect();
    with_children(p, e, new)
}

/// `select(index < end, value, 0)`: a pack's element past its source's end.
fn zero_past(p: &mut Program, value: TExprId, index: TExprId, end: i64, elem: ElemType) -> TExprId {
    let span = p.span(value);
    let end = p.alloc(TExpr::Int(end), Ty::Index, span);
    let inside = p.alloc(TExpr::Binary(BinOp::Lt, index, end), Ty::Elem(ElemType::Bool), span);
    let zero = match elem.is_float() {
        true => p.alloc(TExpr::Float(0.0), Ty::Elem(elem), span),
        false => p.alloc(TExpr::Int(0), Ty::Elem(elem), span),
    };
    p.alloc(TExpr::Select(inside, value, zero), Ty::Elem(elem), span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use texc_grammar::span::Span;

    /// A program of `n` stages (stage `i` writes tensor `i`) and operators
    /// over the ranges `cuts` makes (empty ones included).
    fn program(n: usize, cuts: &[usize]) -> Program {
        let mut p = Program::default();
        for i in 0..n {
            let st = stage(&mut p, i as u32);
            p.stages.push(st);
        }
        for w in cuts.windows(2) {
            p.ops.push(OpRecord {
                op: "compute".into(),
                attrs: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                stages: w[0]..w[1],
                span: Span::default(),
                args: Vec::new(),
                std_callee: false,
            });
        }
        p
    }

    fn stage(p: &mut Program, t: u32) -> Stage {
        let value = p.alloc(TExpr::Float(t as f64), Ty::Elem(ElemType::F32), Span::default());
        Stage { tensor: TensorId(t), vars: Vec::new(), n_axes: 0, value, span: Span::default() }
    }

    fn order(p: &Program) -> (Vec<u32>, Vec<std::ops::Range<usize>>) {
        (p.stages.iter().map(|s| s.tensor.0).collect(), p.ops.iter().map(|o| o.stages.clone()).collect())
    }

    /// Stages put in by one splice, and dropped in one pass, end where
    /// inserting and removing them one at a time put them, and the
    /// operator records with them: places at an operator's first stage, in
    /// its middle, before an empty one, at the end, several at one place.
    #[test]
    fn batched_edits_move_stages_and_operators_as_single_ones_do() {
        let cuts = [0, 2, 2, 5, 6, 9];
        let places = [0usize, 2, 2, 3, 5, 8, 9, 4, 2];
        let mut one_by_one = program(9, &cuts);
        let mut batched = program(9, &cuts);
        let mut pending = PendingStages::default();
        // One at a time, each place is an index of the program as it stands.
        let mut shift = vec![0usize; 10];
        for (k, &at) in places.iter().enumerate() {
            let new = stage(&mut batched, 100 + k as u32);
            pending.push(at, new.clone());
            let now = at + shift[at];
            insert_stage(&mut one_by_one, now, new);
            for s in shift.iter_mut().skip(at + 1) {
                *s += 1;
            }
            shift[at] += 1;
        }
        pending.splice(&mut batched);
        assert_eq!(order(&batched), order(&one_by_one));
        let dead: Vec<bool> = (0..batched.stages.len()).map(|i| i % 3 == 1 || i == 0).collect();
        for i in (0..dead.len()).rev().filter(|&i| dead[i]) {
            one_by_one.stages.remove(i);
            for op in &mut one_by_one.ops {
                if op.stages.start > i {
                    op.stages.start -= 1;
                    op.stages.end -= 1;
                } else if op.stages.end > i {
                    op.stages.end -= 1;
                }
            }
        }
        drop_stages_of_ops(&mut batched, &dead);
        assert_eq!(order(&batched), order(&one_by_one));
    }
}
