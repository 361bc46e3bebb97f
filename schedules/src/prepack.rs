//! Panels of constant operands, made once: a TIR-to-TIR pass for CPU
//! targets that runs before constants are folded.
//!
//! The default CPU schedule packs the vector operand `B` of a long matrix
//! product into panels as wide as its register block (`cache_read B ...
//! layout (j / w, k, j % w)`, [`crate::default`]) for every slice of the
//! reduction and block of columns, on every call. When `B` is a constant —
//! an imported model's weights, or a stage that reads only them, like
//! im2col's filter matrix — those panels are the same on every call: this
//! pass gives the product a stage of its own that writes them,
//! `B.panels[q, .., r] = B[.., q * w + r]`, and makes the product read
//! `B.panels[j / w, .., j % w]` instead of `B[.., j]`. The panels' stage
//! reads only constants, so folding (`texc_compiler::constants`) moves it
//! into the prologue that runs once; the product's register block reads
//! each panel row as one contiguous vector, and the schedule no longer
//! packs (the load is not a plain one of its innermost axis).
//!
//! Which products pack, and how wide, is the default schedule's decision:
//! the pass runs it on a copy of the program and takes the packs it made.
//!
//! Invariants: the program computes the same values (`B.panels` holds `B`'s
//! elements only, `q * w + r` below `B`'s last extent, which `w` divides);
//! stages stay in an order where every tensor is written before it is read
//! (the panels' stage goes just before the first product that reads it);
//! operator records' stage ranges move with the inserted stages.

use crate::default::{default_schedule_with, DefaultKnobs};
use crate::normalize::{fresh_name, with_children};
use crate::schedule::LayoutDim;
use texc_compiler::ops::BinOp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::*;

/// A product (the stage writing `consumer`) whose operand `operand` the
/// default schedule packs into panels `width` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pack {
    pub consumer: TensorId,
    pub operand: TensorId,
    pub width: i64,
}

/// The packs the default schedule of `target` (with `knobs`) makes in `p`.
pub fn packs(p: &Program, target: &Target, knobs: DefaultKnobs) -> Vec<Pack> {
    let mut q = p.clone();
    let s = default_schedule_with(&mut q, target, knobs);
    let mut found = Vec::new();
    for (bi, at) in s.attach.iter().enumerate() {
        let Some(a) = at else { continue };
        let Some(width) = panel_width(a.layout.as_deref()) else { continue };
        let TExpr::Load(operand, _) = q.expr(q.stages[bi].value) else { continue };
        let pack = Pack { consumer: q.stages[a.owner].tensor, operand: *operand, width };
        if !found.contains(&pack) {
            found.push(pack);
        }
    }
    found
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

/// Give every product whose packed operand `constant` holds a panels stage
/// of its own (see the module header); the number of panel tensors made.
/// Only on CPU targets, whose default schedule packs.
pub fn prepack_constant_operands(
    p: &mut Program,
    target: &Target,
    knobs: DefaultKnobs,
    constant: &dyn Fn(TensorId) -> bool,
) -> usize {
    if target.kind != TargetKind::Cpu || knobs.pack == Some(false) {
        return 0;
    }
    let mut made: Vec<(TensorId, i64, TensorId)> = Vec::new();
    for pack in packs(p, target, knobs) {
        let b = p.tensor(pack.operand);
        let last = b.shape.len().saturating_sub(1);
        if !constant(pack.operand) || b.shape.is_empty() || b.shape[last] % pack.width != 0 {
            continue;
        }
        let Some(ci) = p.stages.iter().position(|st| st.tensor == pack.consumer) else { continue };
        if !reads_along_innermost(p, ci, pack.operand) {
            continue;
        }
        let panels = match made.iter().find(|(t, w, _)| *t == pack.operand && *w == pack.width) {
            Some(&(_, _, panels)) => panels,
            None => {
                let panels = insert_panels(p, ci, pack.operand, pack.width);
                made.push((pack.operand, pack.width, panels));
                panels
            }
        };
        // The panels' stage may have gone in just before the product.
        let ci = p.stages.iter().position(|st| st.tensor == pack.consumer).expect("the product");
        let value = p.stages[ci].value;
        let inner = p.stages[ci].n_axes as VarId - 1;
        p.stages[ci].value = read_panels(p, value, pack.operand, panels, pack.width, inner);
    }
    made.len()
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

/// The stage `B.panels[q, d0, .., r] = B[d0, .., q * w + r]`, inserted at
/// stage index `at`; the panels' tensor.
fn insert_panels(p: &mut Program, at: usize, b: TensorId, w: i64) -> TensorId {
    let decl = p.tensor(b).clone();
    let span = decl.span;
    let last = decl.shape.len() - 1;
    let mut shape = vec![decl.shape[last] / w];
    shape.extend(&decl.shape[..last]);
    shape.push(w);
    let name = fresh_name(p, &format!("{}.panels", decl.name));
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape: shape.clone(), role: TensorRole::Temp, span });
    let panels = TensorId(p.tensors.len() as u32 - 1);
    let var = |p: &mut Program, v: usize| p.alloc(TExpr::Var(v as VarId), Ty::Index, span);
    let mut index: Vec<TExprId> = (1..=last).map(|v| var(p, v)).collect();
    let (q, r, width) = (var(p, 0), var(p, last + 1), p.alloc(TExpr::Int(w), Ty::Index, span));
    let base = p.alloc(TExpr::Binary(BinOp::Mul, q, width), Ty::Index, span);
    index.push(p.alloc(TExpr::Binary(BinOp::Add, base, r), Ty::Index, span));
    let value = p.alloc(TExpr::Load(b, index), Ty::Elem(decl.elem), span);
    let mut vars = vec![VarDecl { name: "q".into(), extent: shape[0] }];
    vars.extend((0..last).map(|d| VarDecl { name: format!("d{d}"), extent: decl.shape[d] }));
    vars.push(VarDecl { name: "r".into(), extent: w });
    let n_axes = vars.len();
    p.stages.insert(at, Stage { tensor: panels, vars, n_axes, value, span });
    // The panels belong to the product's operator; later ones move up one.
    for op in &mut p.ops {
        if op.stages.start > at {
            op.stages.start += 1;
            op.stages.end += 1;
        } else if op.stages.end > at {
            op.stages.end += 1;
        }
    }
    panels
}

/// `e` with every load `b[i.., j]` replaced by `panels[j / w, i.., j % w]`.
fn read_panels(p: &mut Program, e: TExprId, b: TensorId, panels: TensorId, w: i64, inner: VarId) -> TExprId {
    if let TExpr::Load(t, idx) = p.expr(e).clone() {
        if t == b {
            let span = p.span(e);
            let (&j, rest) = idx.split_last().expect("a loaded tensor has axes");
            debug_assert!(matches!(p.expr(j), TExpr::Var(v) if *v == inner));
            let width = p.alloc(TExpr::Int(w), Ty::Index, span);
            let mut index = vec![p.alloc(TExpr::Binary(BinOp::FloorDiv, j, width), Ty::Index, span)];
            index.extend(rest);
            index.push(p.alloc(TExpr::Binary(BinOp::FloorMod, j, width), Ty::Index, span));
            let ty = p.ty(e);
            return p.alloc(TExpr::Load(panels, index), ty, span);
        }
    }
    let children = p.children(e);
    let new: Vec<TExprId> = children.into_iter().map(|c| read_panels(p, c, b, panels, w, inner)).collect();
    with_children(p, e, new)
}
