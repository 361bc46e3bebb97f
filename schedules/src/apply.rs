//! Applying a user's `schedule` block (LANGUAGE.md §6) to a program.
//!
//! `inline` runs first (it removes stages), then reductions are hoisted
//! (`normalize`), then the loop primitives run in source order. Tunable
//! factors (`?t`) take the first value of `tune t in [...]`, or else the
//! largest divisor of the extent that is at most 32, until the autotuner
//! chooses them.

use crate::ir::ForKind;
use crate::normalize::{contains_reduce, hoist_reductions, inline_stage};
use crate::schedule::{Schedules, StageSchedule};
use std::collections::HashMap;
use texc_compiler::tir::{Program, TensorRole};
use texc_grammar::ast::{AxisRef, Factor, Ident, PrimKind, Schedule, ScheduleBody};
use texc_grammar::Diagnostic;

fn stage_index(p: &Program, name: &Ident) -> Result<usize, Diagnostic> {
    p.stages.iter().position(|s| p.tensor(s.tensor).name == name.name).ok_or_else(|| {
        let names: Vec<&str> = p.stages.iter().map(|s| p.tensor(s.tensor).name.as_str()).collect();
        Diagnostic::at(name.span, format!("no stage named `{}`", name.name))
            .with_note(format!("stages: {}", names.join(", ")))
    })
}

/// Inline a stage by name, checking that it may be inlined.
pub fn inline_by_name(p: &mut Program, name: &Ident) -> Result<(), Diagnostic> {
    let si = stage_index(p, name)?;
    let st = &p.stages[si];
    let t = p.tensor(st.tensor);
    if t.role != TensorRole::Temp {
        return Err(Diagnostic::at(name.span, format!("cannot inline `{}`: it is an output", name.name)));
    }
    if contains_reduce(p, st.value) {
        return Err(Diagnostic::at(name.span, format!("cannot inline `{}`: it contains a reduction", name.name))
            .with_note("inlining would recompute the reduction for every use"));
    }
    inline_stage(p, si);
    Ok(())
}

fn factor(f: &Factor, extent: i64, tunes: &HashMap<String, i64>) -> Result<i64, Diagnostic> {
    match f {
        Factor::Const(v, _) => Ok(*v),
        Factor::Tunable(name) => Ok(match tunes.get(&name.name) {
            Some(v) => *v,
            None => (1..=extent.clamp(1, 32)).rev().find(|d| extent % d == 0).unwrap_or(1),
        }),
    }
}

fn factor_span(f: &Factor) -> texc_grammar::Span {
    match f {
        Factor::Const(_, s) => *s,
        Factor::Tunable(i) => i.span,
    }
}

/// Apply `sched` to `p`; returns the schedules of the remaining stages.
pub fn apply(p: &mut Program, sched: &Schedule) -> Result<Schedules, Diagnostic> {
    let ScheduleBody::Primitives(prims) = &sched.body else {
        return Err(Diagnostic::at(sched.span, "`= auto` needs the autotuner, which texc does not have yet")
            .with_note("remove this schedule to get the default schedule for the target"));
    };
    let mut tunes = HashMap::new();
    for prim in prims {
        match &prim.kind {
            PrimKind::Tune { name, values } => {
                tunes.insert(name.name.clone(), values[0].0);
            }
            PrimKind::Inline { stage } => inline_by_name(p, stage)?,
            _ => {}
        }
    }
    hoist_reductions(p);
    let mut s = Schedules::new(p);
    for prim in prims {
        let span = prim.span;
        let stage_of =
            |id: &Ident| -> Result<(usize, String), Diagnostic> { Ok((stage_index(p, id)?, id.name.clone())) };
        match &prim.kind {
            PrimKind::Tune { .. } | PrimKind::Inline { .. } => {}
            PrimKind::Split { axis, factor: f, outer, inner } => {
                let (si, name) = stage_of(&axis.stage)?;
                let ss = &mut s.stages[si];
                let iv = ss.leaf(&name, &axis.axis.name, axis.axis.span)?;
                let f = factor(f, ss.ivs[iv].extent, &tunes).map_err(|d| d.with_secondary(span, ""))?;
                ss.split(iv, f, (&outer.name, outer.span), (&inner.name, inner.span), span)?;
            }
            PrimKind::Tile { stage, axes, factors, new_axes } => {
                let (si, name) = stage_of(stage)?;
                let ss = &mut s.stages[si];
                let n = axes.len();
                let mut outers = Vec::new();
                let mut inners = Vec::new();
                for (k, (a, f)) in axes.iter().zip(factors).enumerate() {
                    let iv = ss.leaf(&name, &a.name, a.span)?;
                    let fv = factor(f, ss.ivs[iv].extent, &tunes)?;
                    if fv < 1 {
                        return Err(Diagnostic::at(
                            factor_span(f),
                            format!("tile factor must be at least 1, found {fv}"),
                        ));
                    }
                    let (o, i) = ss.split(
                        iv,
                        fv,
                        (&new_axes[k].name, new_axes[k].span),
                        (&new_axes[n + k].name, new_axes[n + k].span),
                        span,
                    )?;
                    outers.push(o);
                    inners.push(i);
                }
                outers.extend(inners);
                ss.reorder(&outers, span)?;
            }
            PrimKind::Fuse { stage, axes, fused } => {
                let (si, name) = stage_of(stage)?;
                let ss = &mut s.stages[si];
                let mut cur = ss.leaf(&name, &axes[0].name, axes[0].span)?;
                if axes.len() < 2 {
                    return Err(Diagnostic::at(span, "fuse needs at least two axes"));
                }
                for (k, a) in axes.iter().enumerate().skip(1) {
                    let next = ss.leaf(&name, &a.name, a.span)?;
                    let label = if k + 1 == axes.len() { fused.name.clone() } else { format!("{}.{k}", fused.name) };
                    cur = ss.fuse(cur, next, (&label, fused.span), span)?;
                }
            }
            PrimKind::Reorder { stage, axes } => {
                let (si, name) = stage_of(stage)?;
                let ss = &mut s.stages[si];
                let ivs = axes.iter().map(|a| ss.leaf(&name, &a.name, a.span)).collect::<Result<Vec<_>, _>>()?;
                ss.reorder(&ivs, span)?;
            }
            PrimKind::Vectorize(a) => annotate(p, &mut s, a, ForKind::Vectorized, span)?,
            PrimKind::Unroll(a) => annotate(p, &mut s, a, ForKind::Unrolled, span)?,
            PrimKind::Parallel(a) => annotate(p, &mut s, a, ForKind::Parallel, span)?,
            PrimKind::CacheWrite { stage, at, scope, name } => {
                let (si, sname) = stage_of(stage)?;
                if at.stage.name != stage.name {
                    return Err(Diagnostic::at(
                        at.stage.span,
                        format!("`cache_write {sname}` must name an axis of `{sname}` itself"),
                    ));
                }
                if let Some(sc) = scope {
                    if sc.name != "local" {
                        return Err(Diagnostic::at(
                            sc.span,
                            format!("memory scope `{}` is for GPUs; on CPUs a cache is `local`", sc.name),
                        ));
                    }
                }
                if !matches!(p.expr(p.stages[si].value), texc_compiler::tir::TExpr::Reduce(..)) {
                    return Err(Diagnostic::at(
                        span,
                        format!("`cache_write {sname}` needs a reduction stage: it keeps the accumulators local"),
                    ));
                }
                if p.tensors.iter().any(|t| t.name == name.name) {
                    return Err(Diagnostic::at(
                        name.span,
                        format!("`{}` is already a tensor of this kernel", name.name),
                    ));
                }
                let ss = &mut s.stages[si];
                if ss.cache_write.is_some() {
                    return Err(Diagnostic::at(span, format!("`{sname}` already has a cache_write")));
                }
                let iv = ss.leaf(&sname, &at.axis.name, at.axis.span)?;
                ss.cache_write = Some((iv, name.name.clone()));
                ss.cache_write_span = span;
            }
            PrimKind::ComputeAt { .. } | PrimKind::CacheRead { .. } => {
                return Err(Diagnostic::at(span, "this primitive is not implemented yet in texc's CPU scheduler"));
            }
            PrimKind::Bind { .. } | PrimKind::Tensorize { .. } => {
                return Err(Diagnostic::at(
                    span,
                    format!("`{}` is a GPU primitive; target `{}` is a CPU", prim_name(&prim.kind), sched.target.name),
                ));
            }
        }
    }
    for (si, ss) in s.stages.iter().enumerate() {
        ss.finish(&p.tensor(p.stages[si].tensor).name, sched.span)?;
    }
    Ok(s)
}

fn prim_name(k: &PrimKind) -> &'static str {
    match k {
        PrimKind::Bind { .. } => "bind",
        PrimKind::Tensorize { .. } => "tensorize",
        _ => "primitive",
    }
}

fn annotate(
    p: &Program,
    s: &mut Schedules,
    a: &AxisRef,
    kind: ForKind,
    span: texc_grammar::Span,
) -> Result<(), Diagnostic> {
    let si = stage_index(p, &a.stage)?;
    let ss: &mut StageSchedule = &mut s.stages[si];
    let iv = ss.leaf(&a.stage.name, &a.axis.name, a.axis.span)?;
    ss.annotate(iv, kind, span)
}
