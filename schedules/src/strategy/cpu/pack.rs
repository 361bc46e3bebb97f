//! Packed panels of a long product's vector operand: per reduction slice and
//! column block, the micro-kernel streams one contiguous panel instead of
//! rows of the operand a row apart (which, a multiple of 4 KiB apart, fall
//! in one set of L1 and evict each other).
//!
//! Invariants: a pack is requested only for an operand loaded once, through
//! plain variables, its last index the innermost axis ([`vector_operand`]);
//! the packed copy is a stage of its own attached at the requested loop,
//! inserted after every stage is scheduled.

use crate::analysis::loads_in;
use crate::ir::ForKind;
use crate::normalize::fresh_name;
use crate::schedule::{Attach, LayoutDim, Schedules};
use texc_compiler::tir::{Program, Stage, TExpr, TensorId};
use texc_grammar::Span;

/// Pack `tensor` (read by the stage) into panels `width` columns wide at reduction slice `leaf`.
pub(super) struct PackRequest {
    pub(super) leaf: usize,
    pub(super) tensor: TensorId,
    pub(super) width: i64,
}

/// The operand that a long-row reduction loads as vectors: loaded once, its
/// last index exactly the innermost axis, its other indices plain variables.
pub(crate) fn vector_operand(p: &Program, st: &Stage) -> Option<TensorId> {
    let inner = st.n_axes as u32 - 1;
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    let mut found = None;
    for l in loads {
        let TExpr::Load(t, idx) = p.expr(l) else { continue };
        if idx.last().is_some_and(|&i| matches!(p.expr(i), TExpr::Var(v) if *v == inner)) {
            let plain = idx.iter().all(|&i| matches!(p.expr(i), TExpr::Var(_)));
            if found.is_some() || !plain {
                return None;
            }
            found = Some(*t);
        }
    }
    found
}

/// Pack a GEMM's vector operand per reduction slice and column block
/// (`cache_read B for C at C.k.o layout (j / 16, k, j % 16)` with AVX2's
/// 16-wide micro-kernel): the micro-kernel then streams one contiguous panel
/// instead of rows far apart.
pub(super) fn pack_operand(p: &mut Program, s: &mut Schedules, ci: usize, req: PackRequest) {
    let span = Span::default();
    // One operand may feed several products; each gets its own packed copy.
    let name = fresh_name(p, &format!("{}.packed", p.tensor(req.tensor).name));
    let (bi, ci) = crate::apply::insert_cache_stage(p, s, req.tensor, ci, &name, span);
    let last = p.stages[bi].n_axes - 1;
    let mut layout = vec![LayoutDim::Div(last, req.width)];
    layout.extend((0..last).map(LayoutDim::Whole));
    layout.push(LayoutDim::Rem(last, req.width));
    s.attach[bi] = Some(Attach { owner: ci, leaf: req.leaf, layout: Some(layout), shared: false, span });
    let ss = &mut s.stages[bi];
    let lname = ss.ivs[last].name.clone();
    let (_, v) =
        ss.split(last, req.width, (&format!("{lname}.o"), span), (&format!("{lname}.v"), span), span).expect("fresh");
    ss.annotate(v, ForKind::Vectorized, span).expect("spatial innermost");
}
