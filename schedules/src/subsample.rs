//! Strided reads subsampled before a product: a TIR-to-TIR step that
//! [`crate::dot4`] takes before it packs a product's activations.
//!
//! A 1 × 1 convolution of stride 2 reads `X[n, c, 2·y, 2·x]` (the importer
//! writes `2·y + r` with `r` a sum of one): every vector of its rows
//! gathers every other element, for every filter of the register block.
//! Where an operand's last index is `s·x + c` — one of the stage's axes
//! times `s ≥ 2`, plus a constant and sums of one element — the positions
//! read are first copied out, `X.sub[n, c, y, x] = X[n, c, 2·y, 2·x]` (each
//! such index by its axis), and the product reads `X.sub[n, c, y, x]`: one
//! contiguous vector a row, as a stride-1 product's (ONNX Runtime and
//! oneDNN subsample the same way; texc's f32 convolutions of this shape
//! take im2col in the e-graph, whose patches are that copy). MEASURED
//! (AMD Zen 4, `x86-avx2`, one thread): ResNet-50's int8 stride-2 1 × 1
//! convolutions, 256 → 512 channels at 28²: 4.07 → 1.3 ms.
//!
//! Invariants: the copy reads only where the product did (every index in
//! bounds for every value of its variables, checked, not assumed: a read
//! the product made only under a guard is not subsampled), and the program
//! computes the same values; the product's load node keeps its id (it is
//! rewritten in place), so that the caller's references into the product
//! stay valid.

use crate::normalize::fresh_name;
use crate::prepack::insert_stage;
use texc_compiler::affine::affine_in_vars;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::*;

/// How the copy indexes one of the operand's dimensions.
#[derive(Clone, Copy)]
enum Dim {
    /// All of it, read by the product at its old index.
    Whole,
    /// `stride · axis + offset`: the copy's dimension is the stage axis's extent.
    Sampled { axis: VarId, stride: i64, offset: i64 },
}

/// Subsample load `load` of product stage `at` where its last index is
/// strided (see the module header): a copy stage inserted before `at`,
/// and the load rewritten to read it. The new tensor, or `None` where the
/// load is not such a read.
pub(crate) fn subsample(p: &mut Program, at: usize, load: TExprId) -> Option<TensorId> {
    let st = &p.stages[at];
    let TExpr::Load(t, idx) = p.expr(load).clone() else { return None };
    let decl = p.tensor(t).clone();
    let dims: Vec<Dim> = idx.iter().zip(&decl.shape).map(|(&i, &len)| sampled(p, st, i, len)).collect();
    if !matches!(dims.last(), Some(Dim::Sampled { .. })) {
        return None;
    }
    let span = p.span(load);
    let extent = |d: usize| match dims[d] {
        Dim::Whole => decl.shape[d],
        Dim::Sampled { axis, .. } => st.vars[axis as usize].extent,
    };
    let shape: Vec<i64> = (0..dims.len()).map(extent).collect();
    let vars: Vec<VarDecl> =
        shape.iter().enumerate().map(|(d, &extent)| VarDecl { name: format!("d{d}"), extent }).collect();
    let name = fresh_name(p, &format!("{}.sub", decl.name));
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape, role: TensorRole::Temp, span });
    let sub = TensorId(p.tensors.len() as u32 - 1);
    let int = |p: &mut Program, v: i64| p.alloc(TExpr::Int(v), Ty::Index, span);
    // The copy: `X.sub[d..] = X[s·d + c ..]`.
    let mut from = Vec::with_capacity(dims.len());
    for (d, dim) in dims.iter().enumerate() {
        let v = p.alloc(TExpr::Var(d as VarId), Ty::Index, span);
        from.push(match *dim {
            Dim::Whole => v,
            Dim::Sampled { stride, offset, .. } => {
                let s = int(p, stride);
                let scaled = p.alloc(TExpr::Binary(BinOp::Mul, s, v), Ty::Index, span);
                let c = int(p, offset);
                p.alloc(TExpr::Binary(BinOp::Add, scaled, c), Ty::Index, span)
            }
        });
    }
    let value = p.alloc(TExpr::Load(t, from), Ty::Elem(decl.elem), span);
    let n_axes = vars.len();
    insert_stage(p, at, Stage { tensor: sub, vars, n_axes, value, span });
    // The product's read, in place: `X.sub[.., y, x]`.
    let read: Vec<TExprId> = idx
        .iter()
        .zip(&dims)
        .map(|(&i, dim)| match *dim {
            Dim::Whole => i,
            Dim::Sampled { axis, .. } => p.alloc(TExpr::Var(axis), Ty::Index, span),
        })
        .collect();
    p.exprs[load.0 as usize] = TExpr::Load(sub, read);
    Some(sub)
}

/// How index `i` of a dimension of `len` reads it in stage `st`: sampled
/// where it is `stride · axis + offset` over one of the stage's axes,
/// `stride ≥ 2`, besides sums of one element (which are 0), and in bounds
/// for every value of the axis; else whole.
fn sampled(p: &Program, st: &Stage, i: TExprId, len: i64) -> Dim {
    let Some(form) = affine_in_vars(p, i) else { return Dim::Whole };
    let mut axis = None;
    for (&v, &k) in &form.terms {
        let var = &st.vars[v as usize];
        match (v as usize) < st.n_axes {
            true if axis.is_none() && k >= 2 => axis = Some((v, k, var.extent)),
            false if var.extent == 1 => {}
            _ => return Dim::Whole,
        }
    }
    let Some((axis, stride, extent)) = axis else { return Dim::Whole };
    let (Ok(stride), Ok(offset)) = (i64::try_from(stride), i64::try_from(form.c)) else { return Dim::Whole };
    let last = stride.checked_mul(extent - 1).and_then(|x| x.checked_add(offset));
    match last {
        Some(last) if offset >= 0 && last < len => Dim::Sampled { axis, stride, offset },
        _ => Dim::Whole,
    }
}
