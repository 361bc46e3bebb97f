//! Strided reads rearranged before a product: a TIR-to-TIR step that
//! [`crate::dot4`] takes before it packs a product's activations, and that
//! the CPU strategy takes for float products that read a strided window
//! ([`phase_float_windows`]).
//!
//! A convolution of stride 2 reads `X[n, c, 2·y + r, 2·x + s]`: every
//! vector of its rows gathers every other element, for every filter of the
//! register block. Where an operand's last index is `t·x + c` — one of the
//! stage's axes times `t ≥ 2`, plus a constant and sums of one element (a
//! 1 × 1 convolution's `r`, which the importer writes) — the positions
//! read are first copied out, `X.sub[n, c, y, x] = X[n, c, 2·y, 2·x]` (every
//! such index by its axis), and the product reads `X.sub[n, c, y, x]`. Where
//! the last index is `t·x + s + c` with `s` a window's taps (a 3 × 3 or
//! 7 × 7 convolution of stride 2), its elements are split into `t` phases,
//! `X.ph[n, c, h, p, q] = X[n, c, h, t·q + p]`, and the product reads tap
//! `s` at `X.ph[n, c, h, (s + c) % t, x + (s + c) / t]`. Either way one
//! contiguous vector a row, as a stride-1 product's (ONNX Runtime and
//! oneDNN subsample 1 × 1 convolutions the same way; texc's f32
//! convolutions of most of these shapes take im2col in the e-graph, whose
//! patches are such copies, and the direct ones phases). MEASURED (AMD Zen
//! 4, `x86-avx2`, one thread): ResNet-50's int8 stride-2 1 × 1
//! convolutions, 256 → 512 channels at 28²: 4.07 → 1.3 ms.
//!
//! Invariants: the copy reads only elements inside the tensor (the phases'
//! last positions guarded where the tensor ends), and the product reads
//! only copied elements that it read before (every index in bounds for
//! every value of its variables, checked, not assumed: a read the product
//! made only under a guard is not rearranged); the program computes the
//! same values. The product's load node keeps its id (it is rewritten in
//! place), so that the caller's references into the product stay valid.

use crate::normalize::fresh_name;
use crate::prepack::insert_stage;
use texc_compiler::affine::affine_in_vars;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;
use texc_grammar::Span;

/// How the copy indexes one of the operand's dimensions.
#[derive(Clone, Copy)]
enum Dim {
    /// All of it, read by the product at its old index.
    Whole,
    /// `stride · axis + offset`: the copy's dimension is the stage axis's extent.
    Sampled { axis: VarId, stride: i64, offset: i64 },
    /// `stride · axis + tap + offset` (the last dimension only): two
    /// dimensions in the copy, the phase (`stride`) and the position in it
    /// (`positions`).
    Phased { axis: VarId, stride: i64, offset: i64, tap: VarId, positions: i64 },
}

/// Rearrange load `load` of product stage `at` where its last index is
/// strided (see the module header): a copy stage inserted before `at`,
/// and the load rewritten to read it. An index that moves with `packed`,
/// if any (the variable the caller packs words along: a 2 × 2 stride-2
/// window's `2·x + s` packed along `s`), stays as it is. The new tensor,
/// or `None` where the load is not such a read.
pub(crate) fn subsample(p: &mut Program, at: usize, load: TExprId, packed: Option<VarId>) -> Option<TensorId> {
    let st = &p.stages[at];
    let TExpr::Load(t, idx) = p.expr(load).clone() else { return None };
    let decl = p.tensor(t).clone();
    let rank = idx.len();
    let dim = |(d, (&i, &len)): (usize, (&TExprId, &i64))| match packed.is_some_and(|v| p.mentions(i, v)) {
        true => Dim::Whole,
        false => strided(p, st, i, len, d + 1 == rank),
    };
    let dims: Vec<Dim> = idx.iter().zip(&decl.shape).enumerate().map(dim).collect();
    if matches!(dims.last(), None | Some(Dim::Whole)) {
        return None;
    }
    let span = p.span(load);
    let shape: Vec<i64> = dims
        .iter()
        .zip(&decl.shape)
        .flat_map(|(dim, &len)| match *dim {
            Dim::Whole => vec![len],
            Dim::Sampled { axis, .. } => vec![st.vars[axis as usize].extent],
            Dim::Phased { stride, positions, .. } => vec![stride, positions],
        })
        .collect();
    let vars: Vec<VarDecl> =
        shape.iter().enumerate().map(|(d, &extent)| VarDecl { name: format!("d{d}"), extent }).collect();
    let phased = matches!(dims.last(), Some(Dim::Phased { .. }));
    let name = fresh_name(p, &format!("{}.{}", decl.name, if phased { "ph" } else { "sub" }));
    p.tensors.push(TensorDecl { name, elem: decl.elem, shape, role: TensorRole::Temp, span });
    let out = TensorId(p.tensors.len() as u32 - 1);
    let value = copy(p, t, &dims, decl.shape[rank - 1], span);
    let n_axes = vars.len();
    insert_stage(p, at, Stage { tensor: out, vars, n_axes, value, span });
    let read = product_index(p, &idx, &dims, span);
    p.exprs[load.0 as usize] = TExpr::Load(out, read);
    Some(out)
}

/// The copy's value: `X[.., t·d + c]` for a sampled dimension `d`,
/// `X[.., t·q + p]` for a phased one (zero where that is past the
/// tensor's `last_len`), the other dimensions as they are.
fn copy(p: &mut Program, t: TensorId, dims: &[Dim], last_len: i64, span: Span) -> TExprId {
    let int = |p: &mut Program, v: i64| p.alloc(TExpr::Int(v), Ty::Index, span);
    let var = |p: &mut Program, v: usize| p.alloc(TExpr::Var(v as VarId), Ty::Index, span);
    let mut from = Vec::with_capacity(dims.len());
    let mut past_end = None;
    for (d, dim) in dims.iter().enumerate() {
        from.push(match *dim {
            Dim::Whole => var(p, d),
            Dim::Sampled { stride, offset, .. } => {
                let (s, v, c) = (int(p, stride), var(p, d), int(p, offset));
                let scaled = p.alloc(TExpr::Binary(BinOp::Mul, s, v), Ty::Index, span);
                p.alloc(TExpr::Binary(BinOp::Add, scaled, c), Ty::Index, span)
            }
            Dim::Phased { stride, positions, .. } => {
                // The phase is the copy's dimension `d`, the position `d + 1`.
                let (s, phase, q) = (int(p, stride), var(p, d), var(p, d + 1));
                let scaled = p.alloc(TExpr::Binary(BinOp::Mul, s, q), Ty::Index, span);
                let at = p.alloc(TExpr::Binary(BinOp::Add, scaled, phase), Ty::Index, span);
                if stride * positions > last_len {
                    let len = int(p, last_len);
                    past_end = Some(p.alloc(TExpr::Binary(BinOp::Lt, at, len), Ty::Elem(ElemType::Bool), span));
                }
                at
            }
        });
    }
    let elem = p.tensor(t).elem;
    let value = p.alloc(TExpr::Load(t, from), Ty::Elem(elem), span);
    match past_end {
        None => value,
        Some(inside) => {
            let zero = if elem.is_float() { TExpr::Float(0.0) } else { TExpr::Int(0) };
            let zero = p.alloc(zero, Ty::Elem(elem), span);
            p.alloc(TExpr::Select(inside, value, zero), Ty::Elem(elem), span)
        }
    }
}

/// The product's index into the copy: a sampled dimension by its axis; a
/// phased one by `(tap + c) % t` and `axis + (tap + c) / t`; the others as
/// they were.
fn product_index(p: &mut Program, idx: &[TExprId], dims: &[Dim], span: Span) -> Vec<TExprId> {
    let mut read = Vec::with_capacity(idx.len() + 1);
    for (&i, dim) in idx.iter().zip(dims) {
        match *dim {
            Dim::Whole => read.push(i),
            Dim::Sampled { axis, .. } => read.push(p.alloc(TExpr::Var(axis), Ty::Index, span)),
            Dim::Phased { axis, stride, offset, tap, .. } => {
                let mut u = p.alloc(TExpr::Var(tap), Ty::Index, span);
                if offset != 0 {
                    let c = p.alloc(TExpr::Int(offset), Ty::Index, span);
                    u = p.alloc(TExpr::Binary(BinOp::Add, u, c), Ty::Index, span);
                }
                let s = p.alloc(TExpr::Int(stride), Ty::Index, span);
                read.push(p.alloc(TExpr::Binary(BinOp::FloorMod, u, s), Ty::Index, span));
                let step = p.alloc(TExpr::Binary(BinOp::FloorDiv, u, s), Ty::Index, span);
                let x = p.alloc(TExpr::Var(axis), Ty::Index, span);
                read.push(p.alloc(TExpr::Binary(BinOp::Add, x, step), Ty::Index, span));
            }
        }
    }
    read
}

/// How index `i` of a dimension of `len` reads it in stage `st`: sampled
/// where it is `stride · axis + offset` over one of the stage's axes,
/// `stride ≥ 2`, besides sums of one element (which are 0); phased where
/// it also adds the variable of a sum of several (a window's taps, at
/// coefficient 1), in the `last` dimension only; either only when in
/// bounds for every value of its variables; else whole.
fn strided(p: &Program, st: &Stage, i: TExprId, len: i64, last: bool) -> Dim {
    let Some(form) = affine_in_vars(p, i) else { return Dim::Whole };
    let (mut axis, mut tap) = (None, None);
    for (&v, &k) in &form.terms {
        let var = &st.vars[v as usize];
        match (v as usize) < st.n_axes {
            true if axis.is_none() && k >= 2 => axis = Some((v, k, var.extent)),
            false if var.extent == 1 => {}
            false if last && tap.is_none() && k == 1 => tap = Some((v, var.extent)),
            _ => return Dim::Whole,
        }
    }
    let Some((axis, stride, extent)) = axis else { return Dim::Whole };
    let (Ok(stride), Ok(offset)) = (i64::try_from(stride), i64::try_from(form.c)) else { return Dim::Whole };
    let taps = tap.map_or(1, |(_, n)| n);
    let last_read =
        stride.checked_mul(extent - 1).and_then(|x| x.checked_add(offset)).and_then(|x| x.checked_add(taps - 1));
    if !matches!(last_read, Some(l) if offset >= 0 && l < len) {
        return Dim::Whole;
    }
    match tap {
        None => Dim::Sampled { axis, stride, offset },
        Some((tap, n)) => {
            let positions = extent + (offset + n - 1) / stride;
            Dim::Phased { axis, stride, offset, tap, positions }
        }
    }
}

/// Float products whose operand reads its rows through a strided window
/// (a stride-2 stem, `Y[n, f, y, x] = sum[c, r, s](X[n, c, 2·y + r, 2·x +
/// s] · W[f, c, r, s])`) read phases of it instead ([`subsample`]): the
/// default schedule runs vectors along `x`, and a stride-2 vector is two
/// loads and shuffles (on AVX-512 a `vpermt2ps` on the port Intel's second
/// FMA unit shares), once per vector for every tap and every row of the
/// register block. The copy is one pass over the input, each element
/// copied once, where the product gathers each about `taps / stride` times
/// a row. MEASURED (Intel Xeon with AVX-512, 1 thread, ResNet-50's stem, 3 → 64
/// channels 7 × 7 at 224², with bias and ReLU): 1.57 → 1.15 ms, ONNX
/// Runtime 1.37; ResNet-50 4 %, GoogLeNet 3 %, MobileNetV2 5 % faster. A
/// grouped convolution's filters share their group's channels (`k / Kg`):
/// MEASURED (AMD Zen 4, `x86-avx2`, 1 thread) RegNetX-400MF's stride-2 3 ×
/// 3 convolutions of 16 channels a group, 32 channels at 112² 0.345 →
/// 0.292 ms, 64 at 56² 0.261 → 0.163 (ORT 0.138), the model 9.65 →
/// 9.08–9.56 ms (lowest of three alternated runs 9.65 → 9.08). A depthwise
/// convolution's rows each read their own input, so nothing shares the
/// copy, yet where its windows overlap the copy still costs less than the
/// taps' gathers: MEASURED (same Zen 4, 1 thread, stride 2 with its padding, the lowest of three
/// alternated runs, `x86-avx2` / `host`) 3 × 3 over 48 channels at 112²
/// 0.143 → 0.105 / 0.110 → 0.088 ms, 144 at 56² 0.089 → 0.066 / 0.088 →
/// 0.065, 232 at 14² 0.012 → 0.008 / 0.012 → 0.007; 5 × 5 over 72 at 56²
/// 0.097 → 0.062 / 0.095 → 0.065, 240 at 28² 0.074 → 0.064 / 0.109 →
/// 0.060; the one loss, 5 × 5 to a row of 7 on `x86-avx2` (240 and 672
/// channels at 14²: +5 %, +7 %), a shape the models run channels last
/// ([`crate::channels_last`]), where no index is strided. Returns the
/// number of copies made.
pub(crate) fn phase_float_windows(p: &mut Program) -> usize {
    let mut made = 0;
    let mut si = 0;
    while si < p.stages.len() {
        if let Some(load) = strided_window(p, &p.stages[si]) {
            if subsample(p, si, load, None).is_some() {
                made += 1;
                si += 1;
            }
        }
        si += 1;
    }
    made
}

/// The operand of float product stage `st` (a plain load of the sum of
/// two loads' product that [`crate::filters_last::product_body`] finds) whose last
/// index is `t·x + s` — the stage's last axis at a stride `t ≥ 2` plus a
/// sum's variable of several taps — where the copy pays: some axis of the
/// stage of at least two elements shares the reads ([`shared_along`]: the
/// filters, unread, or read through a grouped convolution's `k / Kg`), or
/// the windows overlap (more taps than the stride: a depthwise 3 × 3 of
/// stride 2 gathers each element about twice a row). A depthwise window
/// of no more taps than its stride (2 × 2, a patch) gathers each element
/// once, as the copy would.
fn strided_window(p: &Program, st: &Stage) -> Option<TExprId> {
    let (body, false) = crate::filters_last::product_body(p, st.value)? else { return None };
    let TExpr::Binary(BinOp::Mul, a, b) = *p.expr(body) else { return None };
    let inner = st.n_axes.checked_sub(1)? as VarId;
    [a, b].into_iter().find(|&l| {
        let TExpr::Load(t, idx) = p.expr(l) else { return false };
        if !p.tensor(*t).elem.is_float() {
            return false;
        }
        let Some(form) = idx.last().and_then(|&i| affine_in_vars(p, i)) else { return false };
        let stride = form.terms.get(&inner).map_or(0, |&k| i64::try_from(k).unwrap_or(i64::MAX));
        let taps = form
            .terms
            .iter()
            .filter(|&(&v, &k)| v as usize >= st.n_axes && k == 1)
            .map(|(&v, _)| st.vars[v as usize].extent)
            .max()
            .unwrap_or(0);
        let shared = || (0..st.n_axes).any(|v| st.vars[v].extent >= 2 && shared_along(p, l, v as VarId));
        stride >= 2 && taps > 1 && (taps > stride || shared())
    })
}

/// Whether the rows of axis `v` share what `e` reads: it does not mention
/// `v`, or only in floor divisions by a constant of at least 2 of a sum
/// that holds `v` once (a grouped convolution's `k / Kg`, whose `Kg`
/// filters of a group read the same channels).
fn shared_along(p: &Program, e: TExprId, v: VarId) -> bool {
    match p.expr(e) {
        TExpr::Var(w) => *w != v,
        TExpr::Binary(BinOp::FloorDiv, a, d) if matches!(p.expr(*d), TExpr::Int(g) if *g >= 2) => {
            affine_in_vars(p, *a).is_some_and(|form| form.terms.get(&v).is_some_and(|&k| k == 1))
                || shared_along(p, *a, v)
        }
        _ => p.children(e).into_iter().all(|c| shared_along(p, c, v)),
    }
}
