//! Applying a user's `schedule` block (LANGUAGE.md §6) to a program.
//!
//! `inline` runs first (it removes stages), then reductions are hoisted
//! (`normalize`), then the loop primitives run in source order, each checked
//! against the [`Target`] (its loop kinds and memory scopes). Tunable
//! factors (`?t`) take their value from the knobs given (the autotuner's
//! choice, or `--knob t=16`), else the first value of `tune t in [...]`, else
//! the largest divisor of the extent that is at most 32.

use crate::ir::{ForKind, GpuDim, TensorOp};
use crate::normalize::{contains_reduce, hoist_reductions, inline_stage};
use crate::schedule::{Attach, LayoutDim, Schedules, StageSchedule, Tensorize};
use crate::ScheduleSrc;
use std::collections::{BTreeMap, HashMap};
use texc_compiler::target::{LoopKind, MemScope, Target};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorDecl, TensorId, TensorRole, Ty, VarDecl};
use texc_grammar::ast::{Ast, AxisRef, BinOp, Expr, ExprId, Factor, Ident, PrimKind, ScheduleBody};
use texc_grammar::{Diagnostic, Span};

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

/// Values of a schedule's tunables (`?t`), by name.
pub type Knobs = BTreeMap<String, i64>;

/// The value of every tunable of a schedule block: from `knobs`, else its
/// `tune` list's first value (tunables with neither are left out, and take a
/// divisor of the extent they split). Knobs that name no tunable, and values
/// outside a `tune` list, are errors.
fn tunable_values(prims: &[texc_grammar::ast::Primitive], knobs: &Knobs) -> Result<HashMap<String, i64>, Diagnostic> {
    // Per `tune` statement: its candidates and its span.
    type Candidates<'a> = (&'a [(i64, Span)], Span);
    let mut declared: BTreeMap<&str, Candidates> = BTreeMap::new();
    let mut used: Vec<&str> = Vec::new();
    for prim in prims {
        match &prim.kind {
            PrimKind::Tune { name, values } => {
                declared.insert(&name.name, (values, prim.span));
            }
            PrimKind::Split { factor: Factor::Tunable(n), .. }
            | PrimKind::Pipeline { stages: Factor::Tunable(n), .. } => used.push(&n.name),
            PrimKind::Tile { factors, .. } => used.extend(factors.iter().filter_map(|f| match f {
                Factor::Tunable(n) => Some(n.name.as_str()),
                Factor::Const(..) => None,
            })),
            _ => {}
        }
    }
    let mut all: Vec<&str> = used.iter().copied().chain(declared.keys().copied()).collect();
    all.sort_unstable();
    all.dedup();
    for (name, &value) in knobs {
        if !all.contains(&name.as_str()) {
            let known =
                if all.is_empty() { "it has none".to_string() } else { format!("its tunables: {}", all.join(", ")) };
            return Err(Diagnostic::error(format!("knob `{name}` is not a tunable of this schedule")).with_note(known));
        }
        if value < 1 {
            return Err(Diagnostic::error(format!("knob `{name}` = {value}: a factor must be at least 1")));
        }
        if let Some((values, span)) = declared.get(name.as_str()) {
            if !values.iter().any(|(v, _)| *v == value) {
                let list: Vec<String> = values.iter().map(|(v, _)| v.to_string()).collect();
                return Err(Diagnostic::at(
                    *span,
                    format!("knob `{name}` = {value} is not one of its candidates [{}]", list.join(", ")),
                ));
            }
        }
    }
    let mut tunes: HashMap<String, i64> =
        declared.iter().map(|(n, (values, _))| (n.to_string(), values[0].0)).collect();
    tunes.extend(knobs.iter().map(|(n, v)| (n.clone(), *v)));
    Ok(tunes)
}

/// Apply `sched` to `p` for `target`; returns the schedules of the remaining stages.
pub fn apply(p: &mut Program, src: ScheduleSrc, target: &Target, knobs: &Knobs) -> Result<Schedules, Diagnostic> {
    apply_with(p, src, target, knobs, true)
}

/// [`apply`]; without `sized`, `p`'s extents are samples (`texc check`
/// without sizes, [`crate::validate`]): checks that depend on extents are
/// skipped, and GPU primitives are checked for their names and axes even
/// though texc cannot lower them yet.
pub fn apply_with(
    p: &mut Program,
    src: ScheduleSrc,
    target: &Target,
    knobs: &Knobs,
    sized: bool,
) -> Result<Schedules, Diagnostic> {
    let sched = src.block;
    let ScheduleBody::Primitives(prims) = &sched.body else {
        // `= auto`: the default schedule with the autotuner's knobs (`crate::find_schedule`).
        let defaults =
            crate::knobs::DefaultKnobs::from_knobs(knobs).map_err(|m| Diagnostic::at(sched.span, m.to_string()))?;
        return Ok(crate::strategy::default_schedule_with(p, target, defaults));
    };
    let tunes = tunable_values(prims, knobs)?;
    for prim in prims {
        if let PrimKind::Inline { stage } = &prim.kind {
            inline_by_name(p, stage)?;
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
            PrimKind::Vectorize(a) => annotate(p, &mut s, a, ForKind::Vectorized, target, span, sized)?,
            PrimKind::Unroll(a) => annotate(p, &mut s, a, ForKind::Unrolled, target, span, sized)?,
            PrimKind::Parallel(a) => annotate(p, &mut s, a, ForKind::Parallel, target, span, sized)?,
            PrimKind::CacheWrite { stage, at, scope, name } => {
                let (si, sname) = stage_of(stage)?;
                if at.stage.name != stage.name {
                    return Err(Diagnostic::at(
                        at.stage.span,
                        format!("`cache_write {sname}` must name an axis of `{sname}` itself"),
                    ));
                }
                if let Some(sc) = scope {
                    check_scope(sc, target, sized, false)?;
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
            PrimKind::ComputeAt { stage, at } => {
                let (pi, pname) = stage_of(stage)?;
                if p.tensor(p.stages[pi].tensor).role != TensorRole::Temp {
                    return Err(Diagnostic::at(
                        stage.span,
                        format!("cannot compute `{pname}` inside another stage: it is an output, computed whole"),
                    ));
                }
                let (ci, cname) = stage_of(&at.stage)?;
                let leaf = s.stages[ci].leaf(&cname, &at.axis.name, at.axis.span)?;
                // The reductions hoisted out of the stage (`S.r0`, ...) are part of what the user wrote as `S`.
                let hoisted = format!("{pname}.r");
                for qi in 0..pi {
                    if p.tensor(p.stages[qi].tensor).name.starts_with(&hoisted) {
                        attach_stage(
                            &mut s,
                            qi,
                            Attach { owner: ci, leaf, layout: None, shared: false, span },
                            &pname,
                        )?;
                    }
                }
                attach_stage(&mut s, pi, Attach { owner: ci, leaf, layout: None, shared: false, span }, &pname)?;
            }
            PrimKind::CacheRead { tensor, consumer, at, scope, layout, name } => {
                let shared = match scope {
                    Some(sc) => check_scope(sc, target, sized, true)? == MemScope::Shared,
                    None => false,
                };
                let (ci, cname) = stage_of(consumer)?;
                if at.stage.name != consumer.name {
                    return Err(Diagnostic::at(
                        at.stage.span,
                        format!("`cache_read ... for {cname}` must name an axis of `{cname}` itself"),
                    ));
                }
                let leaf = s.stages[ci].leaf(&cname, &at.axis.name, at.axis.span)?;
                let (bi, ci) = cache_read_stage(p, &mut s, tensor, ci, name)?;
                let layout = match layout {
                    Some(l) => Some(parse_layout(src.ast, l, &p.stages[bi], span)?),
                    None => None,
                };
                attach_stage(&mut s, bi, Attach { owner: ci, leaf, layout, shared, span }, &name.name)?;
            }
            PrimKind::Bind { .. } | PrimKind::Pipeline { .. } if !target.supports_loop(LoopKind::GpuThread) => {
                return Err(Diagnostic::at(
                    span,
                    format!("`{}` is a GPU primitive; target `{}` is a CPU", prim_name(&prim.kind), target.name),
                ));
            }
            // Tile products are the one tensorization CPUs have (AMX).
            PrimKind::Tensorize { intrinsic, .. }
                if !target.supports_loop(LoopKind::GpuThread)
                    && TensorOp::parse_schedule_name(&intrinsic.name) != Some(TensorOp::TileDot) =>
            {
                return Err(Diagnostic::at(
                    span,
                    format!("`{}` is a GPU primitive; target `{}` is a CPU", prim_name(&prim.kind), target.name),
                ));
            }
            PrimKind::Bind { axis, unit, dim } => {
                let kind = bound_kind(unit, dim)?;
                annotate(p, &mut s, axis, kind, target, span, sized)?;
            }
            PrimKind::Tensorize { stage, axes, intrinsic } => {
                let (si, name) = stage_of(stage)?;
                tensorize(p, &mut s.stages[si], si, &name, axes, intrinsic, span, sized, target)?;
            }
            PrimKind::Pipeline { axis, stages } => {
                let (si, name) = stage_of(&axis.stage)?;
                let ss = &mut s.stages[si];
                let iv = ss.leaf(&name, &axis.axis.name, axis.axis.span)?;
                // An undeclared `?n` double-buffers.
                let n = match stages {
                    Factor::Tunable(k) if !tunes.contains_key(&k.name) => 2,
                    f => factor(f, 2, &tunes)?,
                };
                if !(2..=8).contains(&n) {
                    return Err(Diagnostic::at(factor_span(stages), format!("a pipeline has 2 to 8 stages, not {n}")));
                }
                if ss.ivs[iv].kind != ForKind::Serial {
                    return Err(Diagnostic::at(
                        span,
                        format!("`{}` is{}: only a serial loop is pipelined", ss.ivs[iv].name, ss.ivs[iv].kind.name()),
                    ));
                }
                if ss.pipeline.is_some() {
                    return Err(Diagnostic::at(span, format!("`{name}` already has a pipelined loop")));
                }
                ss.pipeline = Some((iv, n, span));
            }
        }
    }
    for (si, ss) in s.stages.iter().enumerate() {
        ss.finish(&p.tensor(p.stages[si].tensor).name, sched.span)?;
    }
    Ok(s)
}

fn attach_stage(s: &mut Schedules, si: usize, a: Attach, name: &str) -> Result<(), Diagnostic> {
    if s.attach[si].is_some() {
        return Err(Diagnostic::at(a.span, format!("`{name}` is already computed inside another stage")));
    }
    s.attach[si] = Some(a);
    Ok(())
}

fn rename_loads(p: &mut Program, e: TExprId, from: TensorId, to: TensorId) -> bool {
    let mut found = false;
    for c in p.children(e) {
        found |= rename_loads(p, c, from, to);
    }
    if let TExpr::Load(t, idx) = p.expr(e).clone() {
        if t == from {
            p.exprs[e.0 as usize] = TExpr::Load(to, idx);
            found = true;
        }
    }
    found
}

fn first_load(p: &Program, e: TExprId, t: TensorId) -> Option<Vec<TExprId>> {
    match p.expr(e) {
        TExpr::Load(x, idx) if *x == t => Some(idx.clone()),
        _ => p.children(e).into_iter().find_map(|c| first_load(p, c, t)),
    }
}

/// `cache_read B for C ... -> Bp`: checks the names, then [`insert_cache_stage`].
fn cache_read_stage(
    p: &mut Program,
    s: &mut Schedules,
    tensor: &Ident,
    ci: usize,
    name: &Ident,
) -> Result<(usize, usize), Diagnostic> {
    let cname = p.tensor(p.stages[ci].tensor).name.clone();
    let Some(b) = p.tensors.iter().position(|t| t.name == tensor.name).map(|i| TensorId(i as u32)) else {
        return Err(Diagnostic::at(tensor.span, format!("no tensor named `{}`", tensor.name)));
    };
    if first_load(p, p.stages[ci].value, b).is_none() {
        return Err(Diagnostic::at(tensor.span, format!("`{cname}` does not read `{}`", tensor.name)));
    }
    if p.tensors.iter().any(|t| t.name == name.name) {
        return Err(Diagnostic::at(name.span, format!("`{}` is already a tensor of this kernel", name.name)));
    }
    Ok(insert_cache_stage(p, s, b, ci, &name.name, name.span))
}

/// A copy stage `name` of `b`, placed before stage `ci` (which reads `b`
/// and now reads the copy instead). Its axes are named after the variables
/// with which `ci` indexes `b` (`d0`, `d1`, ... where that is not one
/// variable). Returns the new stage's index and the reader's.
pub fn insert_cache_stage(
    p: &mut Program,
    s: &mut Schedules,
    b: TensorId,
    ci: usize,
    name: &str,
    span: Span,
) -> (usize, usize) {
    let idx = first_load(p, p.stages[ci].value, b).expect("the reader reads the cached tensor");
    let consumer = &p.stages[ci];
    let mut vars: Vec<VarDecl> = Vec::new();
    for (d, (&i, &extent)) in idx.iter().zip(&p.tensor(b).shape).enumerate() {
        let named = match p.expr(i) {
            TExpr::Var(v) => Some(consumer.vars[*v as usize].name.clone()),
            _ => None,
        };
        let name = named.filter(|n| vars.iter().all(|x| x.name != *n)).unwrap_or(format!("d{d}"));
        vars.push(VarDecl { name, extent });
    }
    let decl = p.tensor(b).clone();
    p.tensors.push(TensorDecl {
        name: name.to_string(),
        elem: decl.elem,
        shape: decl.shape.clone(),
        role: TensorRole::Temp,
        span,
    });
    let bp = TensorId(p.tensors.len() as u32 - 1);
    let index: Vec<TExprId> = (0..vars.len()).map(|v| p.alloc(TExpr::Var(v as u32), Ty::Index, span)).collect();
    let value = p.alloc(TExpr::Load(b, index), Ty::Elem(decl.elem), span);
    let n_axes = vars.len();
    let stage = Stage { tensor: bp, vars, n_axes, value, span };
    let value_c = p.stages[ci].value;
    rename_loads(p, value_c, b, bp);
    s.insert(ci, StageSchedule::new(&stage));
    p.stages.insert(ci, stage);
    (ci, ci + 1)
}

/// A `layout (...)`: each entry is an axis `d` of the cache, `d / c` or
/// `d % c`; every axis must appear exactly once whole, or once as a pair
/// `d / c`, `d % c` with the same `c`.
fn parse_layout(ast: &Ast, l: &[ExprId], st: &Stage, span: Span) -> Result<Vec<LayoutDim>, Diagnostic> {
    let axis = |id: ExprId| -> Result<usize, Diagnostic> {
        let Expr::Name(n) = ast.expr(id) else {
            return Err(Diagnostic::at(ast.span(id), "expected an axis of the cache"));
        };
        st.vars.iter().position(|v| v.name == n.name).ok_or_else(|| {
            let names: Vec<&str> = st.vars.iter().map(|v| v.name.as_str()).collect();
            Diagnostic::at(n.span, format!("the cache has no axis `{}`", n.name))
                .with_note(format!("its axes: {}", names.join(", ")))
        })
    };
    let mut dims = Vec::new();
    for &e in l {
        let dim = match ast.expr(e) {
            Expr::Binary { op: op @ (BinOp::Div | BinOp::Rem), lhs, rhs } => {
                let c = match ast.expr(*rhs) {
                    Expr::Int(c) if *c >= 1 => *c,
                    _ => return Err(Diagnostic::at(ast.span(*rhs), "expected a positive integer")),
                };
                if *op == BinOp::Div {
                    LayoutDim::Div(axis(*lhs)?, c)
                } else {
                    LayoutDim::Rem(axis(*lhs)?, c)
                }
            }
            Expr::Name(_) => LayoutDim::Whole(axis(e)?),
            _ => {
                return Err(Diagnostic::at(ast.span(e), "a layout dimension is an axis `d`, `d / c` or `d % c`"));
            }
        };
        dims.push(dim);
    }
    for (a, v) in st.vars.iter().enumerate() {
        let (mut whole, mut divs, mut rems) = (0, Vec::new(), Vec::new());
        for d in &dims {
            match *d {
                LayoutDim::Whole(x) if x == a => whole += 1,
                LayoutDim::Div(x, c) if x == a => divs.push(c),
                LayoutDim::Rem(x, c) if x == a => rems.push(c),
                _ => {}
            }
        }
        let ok = (whole == 1 && divs.is_empty() && rems.is_empty())
            || (whole == 0 && divs.len() == 1 && rems.len() == 1 && divs[0] == rems[0]);
        if !ok {
            return Err(Diagnostic::at(
                span,
                format!("the layout does not cover axis `{}` of the cache exactly once", v.name),
            )
            .with_note("name every axis once as `d`, or as the pair `d / c` and `d % c`"));
        }
    }
    Ok(dims)
}

fn prim_name(k: &PrimKind) -> &'static str {
    match k {
        PrimKind::Bind { .. } => "bind",
        PrimKind::Tensorize { .. } => "tensorize",
        PrimKind::Pipeline { .. } => "pipeline",
        _ => "primitive",
    }
}

/// A memory scope the target must have (`local`, `shared`).
/// The scope a cache is asked for; `built` says whether `shared` is lowered for this primitive.
fn check_scope(sc: &Ident, target: &Target, sized: bool, built: bool) -> Result<MemScope, Diagnostic> {
    let scope = match sc.name.as_str() {
        "local" => MemScope::Local,
        "shared" => MemScope::Shared,
        "global" => MemScope::Global,
        other => return Err(Diagnostic::at(sc.span, format!("unknown memory scope `{other}`; scopes: local, shared"))),
    };
    let why = match scope {
        MemScope::Local => return Ok(scope),
        MemScope::Global => "cannot hold a cache; caches are `local`",
        _ if !target.supports_scope(scope) => "is for GPUs; on CPUs a cache is `local`",
        // Validating without sizes checks what is written, not what texc can lower yet.
        _ if !sized || built => return Ok(scope),
        _ => "is not built yet for this primitive",
    };
    Err(Diagnostic::at(sc.span, format!("memory scope `{}` {why}", sc.name)))
}

/// `tensorize S(m, n, k) with op`: the leaves of the op's m, n and k
/// extents, checked against the op's tile shape and types (whether the
/// stage's computation is the op's is checked on its loop nest, by
/// `crate::tensorize`).
#[allow(clippy::too_many_arguments)]
fn tensorize(
    p: &Program,
    ss: &mut StageSchedule,
    si: usize,
    name: &str,
    axes: &[Ident],
    intrinsic: &Ident,
    span: Span,
    sized: bool,
    target: &Target,
) -> Result<(), Diagnostic> {
    let op = TensorOp::parse_schedule_name(&intrinsic.name).ok_or_else(|| {
        Diagnostic::at(
            intrinsic.span,
            format!(
                "unknown tensor-core operation `{}`; operations: {}",
                intrinsic.name,
                TensorOp::known_names().join(", ")
            ),
        )
    })?;
    if matches!(op, TensorOp::Wgmma(_)) && target.gpu.is_none_or(|g| g.sm < 90) {
        return Err(Diagnostic::at(
            intrinsic.span,
            format!(
                "`{}` is a warpgroup operation of Hopper (sm_90a); target `{}` does not have it \
                 (`mma_m16n8k16_f16f32` runs on sm_80 and later)",
                intrinsic.name, target.name
            ),
        ));
    }
    if matches!(op, TensorOp::TileDot) && !target.has_amx_int8() {
        return Err(Diagnostic::at(
            intrinsic.span,
            format!(
                "`{}` multiplies Intel AMX tiles; target `{}` does not have AMX-INT8 (`x86-avx512-amx` does)",
                intrinsic.name, target.name
            ),
        ));
    }
    if matches!(op, TensorOp::Mma(_) | TensorOp::Wgmma(_)) && target.gpu.is_none() {
        return Err(Diagnostic::at(
            intrinsic.span,
            format!("`{}` is a GPU tensor-core operation; target `{}` is not a GPU", intrinsic.name, target.name),
        ));
    }
    let [m, n, k] = axes else {
        return Err(Diagnostic::at(span, format!("`tensorize` names three axes of `{name}`: its m, n and k loops")));
    };
    let leaves = [ss.leaf(name, &m.name, m.span)?, ss.leaf(name, &n.name, n.span)?, ss.leaf(name, &k.name, k.span)?];
    if p.stages[si].vars.len() == p.stages[si].n_axes {
        return Err(Diagnostic::at(span, format!("`{name}` has no reduction: `tensorize` maps a sum of products")));
    }
    if leaves[0] == leaves[1] || leaves[1] == leaves[2] || leaves[0] == leaves[2] {
        return Err(Diagnostic::at(span, "`tensorize` names three different loops"));
    }
    if ss.tensorize.is_some() {
        return Err(Diagnostic::at(span, format!("`{name}` is already tensorized")));
    }
    let (ab, acc) = op.types();
    let out = p.tensor(p.stages[si].tensor);
    if out.elem != acc {
        return Err(Diagnostic::at(
            span,
            format!("`{}` accumulates in {acc}, but `{name}` is {}", intrinsic.name, out.elem),
        ));
    }
    let (em, en, ek) = op.shape();
    for ((axis, &l), (want, reduce)) in axes.iter().zip(&leaves).zip([(em, false), (en, false), (ek, true)]) {
        let iv = &ss.ivs[l];
        if iv.reduce != reduce {
            let what = if reduce { "the reduction axis" } else { "a spatial axis" };
            return Err(Diagnostic::at(
                axis.span,
                format!("`{}` is not {what} that `{}` needs here", axis.name, intrinsic.name),
            ));
        }
        if iv.kind != ForKind::Serial {
            return Err(Diagnostic::at(axis.span, format!("`{}` is already marked{}", axis.name, iv.kind.name())));
        }
        if sized && op == TensorOp::TileDot {
            let fits = if reduce { iv.extent % want == 0 } else { iv.extent <= want };
            if !fits {
                let what = if reduce { format!("a multiple of {want}") } else { format!("at most {want}") };
                return Err(Diagnostic::at(
                    axis.span,
                    format!("`{}` needs {what} iterations of `{}`, which has {}", intrinsic.name, axis.name, iv.extent),
                ));
            }
        } else if sized && iv.extent != want {
            return Err(Diagnostic::at(
                axis.span,
                format!(
                    "`{}` tiles are {want} long along `{}`, which has {} iterations; split it by {want} first",
                    intrinsic.name, axis.name, iv.extent
                ),
            ));
        }
    }
    let _ = ab;
    ss.tensorize = Some(Tensorize { op, leaves, span });
    Ok(())
}

/// `block.x`, `thread.y`, ... as a loop kind.
fn bound_kind(unit: &Ident, dim: &Ident) -> Result<ForKind, Diagnostic> {
    let block = match unit.name.as_str() {
        "block" => true,
        "thread" => false,
        other => return Err(Diagnostic::at(unit.span, format!("unknown GPU unit `{other}`; units: block, thread"))),
    };
    let d = GpuDim::parse(&dim.name).ok_or_else(|| {
        Diagnostic::at(dim.span, format!("unknown GPU dimension `{}`; dimensions: x, y, z", dim.name))
    })?;
    Ok(if block { ForKind::Block(d) } else { ForKind::Thread(d) })
}

fn annotate(
    p: &Program,
    s: &mut Schedules,
    a: &AxisRef,
    kind: ForKind,
    target: &Target,
    span: texc_grammar::Span,
    sized: bool,
) -> Result<(), Diagnostic> {
    if !target.supports_loop(kind.loop_kind()) {
        return Err(Diagnostic::at(span, format!("target `{}` has no{} loops", target.name, kind.name())));
    }
    let si = stage_index(p, &a.stage)?;
    let ss: &mut StageSchedule = &mut s.stages[si];
    let iv = ss.leaf(&a.stage.name, &a.axis.name, a.axis.span)?;
    ss.annotate_with(iv, kind, span, sized)
}
