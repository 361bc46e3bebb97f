//! Schedules of stages: iteration variables, the relations between them
//! (splits and fusions), their loop order and annotations.
//!
//! A stage starts with one iteration variable per TIR variable (axes, then
//! reduction variables), in that order. Primitives replace leaves: `split`
//! a leaf into outer and inner, `fuse` two adjacent leaves into one,
//! `reorder` leaves among the positions they occupy, and annotate leaves as
//! vectorized, unrolled or parallel. Every primitive is checked here; an
//! illegal one is a [`Diagnostic`] at its span, never a wrong answer.

use crate::ir::ForKind;
use texc_compiler::tir::{Program, Stage};
use texc_grammar::{Diagnostic, Span};

#[derive(Clone, Debug, PartialEq)]
pub enum Rel {
    /// The stage's TIR variable of this index.
    Root(usize),
    /// Part of a split of `parent` by `factor`.
    Split { parent: usize, outer: bool, factor: i64 },
    /// Fusion of `outer` and `inner`.
    Fuse { outer: usize, inner: usize },
}

#[derive(Clone, Debug)]
pub struct IterVar {
    pub name: String,
    pub extent: i64,
    pub reduce: bool,
    pub rel: Rel,
    pub kind: ForKind,
}

/// Most copies of a loop body that the unrolled loops of one nest may make.
pub const MAX_UNROLLED_COPIES: i64 = 1024;

#[derive(Clone, Debug)]
pub struct StageSchedule {
    pub ivs: Vec<IterVar>,
    /// Loop order, outermost first.
    pub leaves: Vec<usize>,
    /// `cache_write S at S.a -> L`: the leaf `a`, the local's name, and the primitive's span.
    pub cache_write: Option<(usize, String)>,
    pub cache_write_span: Span,
    /// With `cache_write`: the reduction is cut into slices by loops outside
    /// the cache_write axis (a long product's slices), so the output is
    /// initialised first, as without a cache_write, and each slice's block
    /// starts from what the output holds (the sums of the slices before it)
    /// instead of the identity (default CPU schedules only:
    /// `local_accumulators` in `strategy/cpu/attach.rs`).
    pub cache_write_resumes: bool,
    /// With `cache_write`: the element-wise stage whose value the write-back
    /// stores instead of the accumulator (its reads of this stage's tensor
    /// read the accumulator), so that a reduction's epilogue — a
    /// convolution's bias and activation — is applied to the block while it
    /// is in registers; that stage has no loops of its own, and this stage's
    /// tensor is never written (default CPU schedules only: `fold_epilogues`
    /// in `strategy/cpu/attach.rs`).
    pub epilogue: Option<usize>,
    /// The span of the primitive that annotated each annotated iteration variable.
    pub annotated_at: Vec<(usize, Span)>,
    /// `tensorize S(m, n, k) with op`: the three innermost loops become one
    /// tensor-core operation per warp (`crate::tensorize`).
    pub tensorize: Option<Tensorize>,
    /// `pipeline S.a by n`: the leaf `a`, the number of slices in flight,
    /// and the primitive's span (`crate::multistage`).
    pub pipeline: Option<(usize, i64, Span)>,
    /// An attention stage computed flash-style by its own nest
    /// ([`crate::flash::lower`]; default CPU schedules only): its leaves
    /// stay as made, unused.
    pub flash: Option<crate::flash::Flash>,
}

/// A `tensorize`: the operation and the leaves of its m, n and k extents.
#[derive(Clone, Debug)]
pub struct Tensorize {
    pub op: crate::ir::TensorOp,
    pub leaves: [usize; 3],
    pub span: Span,
}

impl StageSchedule {
    pub fn new(st: &Stage) -> StageSchedule {
        let ivs: Vec<IterVar> = st
            .vars
            .iter()
            .enumerate()
            .map(|(i, v)| IterVar {
                name: v.name.clone(),
                extent: v.extent,
                reduce: i >= st.n_axes,
                rel: Rel::Root(i),
                kind: ForKind::Serial,
            })
            .collect();
        let leaves = (0..ivs.len()).collect();
        StageSchedule {
            ivs,
            leaves,
            cache_write: None,
            cache_write_span: Span::default(),
            cache_write_resumes: false,
            epilogue: None,
            annotated_at: Vec::new(),
            pipeline: None,
            tensorize: None,
            flash: None,
        }
    }

    /// The (outer, inner, factor) split of `iv`, if it was split.
    pub fn split_children(&self, iv: usize) -> Option<(usize, usize, i64)> {
        let o =
            self.ivs.iter().position(|v| matches!(v.rel, Rel::Split { parent, outer: true, .. } if parent == iv))?;
        let i =
            self.ivs.iter().position(|v| matches!(v.rel, Rel::Split { parent, outer: false, .. } if parent == iv))?;
        let Rel::Split { factor, .. } = self.ivs[o].rel else { unreachable!() };
        Some((o, i, factor))
    }

    /// The fusion `iv` is part of: (fused iv, extent of its inner part, whether `iv` is the outer part).
    pub fn fused_parent(&self, iv: usize) -> Option<(usize, i64, bool)> {
        self.ivs.iter().enumerate().find_map(|(fi, v)| match v.rel {
            Rel::Fuse { outer, inner } if outer == iv => Some((fi, self.ivs[inner].extent, true)),
            Rel::Fuse { outer: _, inner } if inner == iv => Some((fi, self.ivs[inner].extent, false)),
            _ => None,
        })
    }

    /// Recompute every extent from new extents of the stage's axes (an
    /// attached stage covers a region, not its whole tensor). Split factors
    /// larger than the new extent are clamped to it.
    pub fn rebase(&mut self, axis_extents: &[i64]) {
        for i in 0..self.ivs.len() {
            let extent = match self.ivs[i].rel {
                Rel::Root(v) => axis_extents.get(v).copied().unwrap_or(self.ivs[i].extent),
                Rel::Split { parent, outer, factor } => {
                    let pe = self.ivs[parent].extent;
                    let f = factor.min(pe.max(1));
                    self.ivs[i].rel = Rel::Split { parent, outer, factor: f };
                    if outer {
                        (pe + f - 1) / f
                    } else {
                        f
                    }
                }
                Rel::Fuse { outer, inner } => self.ivs[outer].extent * self.ivs[inner].extent,
            };
            self.ivs[i].extent = extent;
        }
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.ivs.iter().rposition(|v| v.name == name)
    }

    pub fn leaf_pos(&self, iv: usize) -> Option<usize> {
        self.leaves.iter().position(|&l| l == iv)
    }

    /// A leaf by name, or an error naming the stage's current leaves.
    pub fn leaf(&self, stage: &str, name: &str, span: Span) -> Result<usize, Diagnostic> {
        let leaves: Vec<&str> = self.leaves.iter().map(|&l| self.ivs[l].name.as_str()).collect();
        match self.find(name) {
            Some(iv) if self.leaf_pos(iv).is_some() => Ok(iv),
            Some(_) => Err(Diagnostic::at(span, format!("axis `{name}` of `{stage}` was already split or fused"))
                .with_note(format!("its loops now: {}", leaves.join(", ")))),
            None => Err(Diagnostic::at(span, format!("`{stage}` has no axis `{name}`"))
                .with_note(format!("its loops: {}", leaves.join(", ")))),
        }
    }

    fn check_new_name(&self, name: &str, span: Span) -> Result<(), Diagnostic> {
        if self.find(name).is_some() {
            return Err(Diagnostic::at(span, format!("axis name `{name}` is already used in this stage")));
        }
        Ok(())
    }

    /// Split leaf `iv` by `factor` into (outer, inner), in its place.
    pub fn split(
        &mut self,
        iv: usize,
        factor: i64,
        outer: (&str, Span),
        inner: (&str, Span),
        span: Span,
    ) -> Result<(usize, usize), Diagnostic> {
        if factor < 1 {
            return Err(Diagnostic::at(span, format!("split factor must be at least 1, found {factor}")));
        }
        self.check_new_name(outer.0, outer.1)?;
        self.check_new_name(inner.0, inner.1)?;
        if outer.0 == inner.0 {
            return Err(Diagnostic::at(inner.1, "the two new axes need different names"));
        }
        let p = &self.ivs[iv];
        let f = factor.min(p.extent.max(1));
        let outer_ext = (p.extent + f - 1) / f;
        let reduce = p.reduce;
        let o = self.ivs.len();
        self.ivs.push(IterVar {
            name: outer.0.into(),
            extent: outer_ext,
            reduce,
            rel: Rel::Split { parent: iv, outer: true, factor: f },
            kind: ForKind::Serial,
        });
        self.ivs.push(IterVar {
            name: inner.0.into(),
            extent: f,
            reduce,
            rel: Rel::Split { parent: iv, outer: false, factor: f },
            kind: ForKind::Serial,
        });
        let pos = self.leaf_pos(iv).expect("leaf");
        self.leaves.splice(pos..=pos, [o, o + 1]);
        Ok((o, o + 1))
    }

    /// Place `order` (distinct leaves) in the positions they occupy, in this order.
    pub fn reorder(&mut self, order: &[usize], span: Span) -> Result<(), Diagnostic> {
        let mut pos: Vec<usize> = order.iter().map(|&iv| self.leaf_pos(iv).expect("leaf")).collect();
        for (i, p) in pos.iter().enumerate() {
            if pos[..i].contains(p) {
                return Err(Diagnostic::at(span, format!("axis `{}` is listed twice", self.ivs[order[i]].name)));
            }
        }
        pos.sort_unstable();
        for (p, &iv) in pos.iter().zip(order) {
            self.leaves[*p] = iv;
        }
        Ok(())
    }

    /// Fuse adjacent leaves `a` (outer) and `b` (inner) into one.
    pub fn fuse(&mut self, a: usize, b: usize, name: (&str, Span), span: Span) -> Result<usize, Diagnostic> {
        let (pa, pb) = (self.leaf_pos(a).expect("leaf"), self.leaf_pos(b).expect("leaf"));
        if pb != pa + 1 {
            return Err(Diagnostic::at(
                span,
                format!(
                    "`{}` and `{}` are not adjacent loops (outer first); reorder them first",
                    self.ivs[a].name, self.ivs[b].name
                ),
            ));
        }
        if self.ivs[a].reduce != self.ivs[b].reduce {
            return Err(Diagnostic::at(span, "cannot fuse a spatial axis with a reduction axis"));
        }
        self.check_new_name(name.0, name.1)?;
        let f = self.ivs.len();
        let reduce = self.ivs[a].reduce;
        let extent = self.ivs[a].extent * self.ivs[b].extent;
        self.ivs.push(IterVar {
            name: name.0.into(),
            extent,
            reduce,
            rel: Rel::Fuse { outer: a, inner: b },
            kind: ForKind::Serial,
        });
        self.leaves.splice(pa..=pb, [f]);
        Ok(f)
    }

    /// Annotate leaf `iv`.
    pub fn annotate(&mut self, iv: usize, kind: ForKind, span: Span) -> Result<(), Diagnostic> {
        self.annotate_with(iv, kind, span, true)
    }

    /// Annotate leaf `iv`; without `sized` (extents are samples, `texc
    /// check` without sizes) the checks that depend on extents are skipped.
    pub fn annotate_with(&mut self, iv: usize, kind: ForKind, span: Span, sized: bool) -> Result<(), Diagnostic> {
        let v = &self.ivs[iv];
        let what = match kind {
            ForKind::Vectorized => "vectorize",
            ForKind::Parallel => "parallelize",
            ForKind::Unrolled => "unroll",
            ForKind::Serial => "",
            ForKind::Block(_) | ForKind::Thread(_) => "bind",
            ForKind::Async => "copy asynchronously",
        };
        // A reduction over a block's threads (`crate::cross_thread`) is bound to thread.x.
        let cross_thread = kind == ForKind::Thread(crate::ir::GpuDim::X);
        if v.reduce && ((kind.is_gpu() && !cross_thread) || matches!(kind, ForKind::Vectorized | ForKind::Parallel)) {
            return Err(Diagnostic::at(span, format!("cannot {what} `{}`: it is a reduction axis", v.name)).with_note(
                "iterations of a reduction depend on each other; split it and reorder a spatial axis inward instead",
            ));
        }
        if self.tensorize.as_ref().is_some_and(|t| t.leaves.contains(&iv)) {
            return Err(Diagnostic::at(span, format!("`{}` is tensorized: the tensor-core operation runs it", v.name)));
        }
        if v.kind != ForKind::Serial && v.kind != kind {
            return Err(Diagnostic::at(span, format!("`{}` is already marked{}", v.name, v.kind.name())));
        }
        if sized && kind == ForKind::Vectorized && v.extent > 64 {
            return Err(Diagnostic::at(
                span,
                format!("`{}` has {} iterations; vectorized loops have at most 64 (split it first)", v.name, v.extent),
            ));
        }
        if sized && kind == ForKind::Unrolled {
            self.check_unrolled_copies(iv, span)?;
        }
        self.ivs[iv].kind = kind;
        self.annotated_at.push((iv, span));
        Ok(())
    }

    /// Unrolled loops of one nest multiply: the body is copied the product of
    /// their extents times. Past [`MAX_UNROLLED_COPIES`] compile time and code
    /// size grow without a matching gain, so it is an error.
    fn check_unrolled_copies(&self, iv: usize, span: Span) -> Result<(), Diagnostic> {
        let unrolled: Vec<usize> =
            self.leaves.iter().copied().filter(|&l| l != iv && self.ivs[l].kind == ForKind::Unrolled).collect();
        let copies =
            unrolled.iter().fold(self.ivs[iv].extent.max(1), |n, &l| n.saturating_mul(self.ivs[l].extent.max(1)));
        if copies <= MAX_UNROLLED_COPIES {
            return Ok(());
        }
        let mut loops: Vec<String> =
            unrolled.iter().map(|&l| format!("`{}` ({})", self.ivs[l].name, self.ivs[l].extent)).collect();
        loops.push(format!("`{}` ({})", self.ivs[iv].name, self.ivs[iv].extent));
        Err(Diagnostic::at(
            span,
            format!(
                "unrolling `{}` would copy the loop body {copies} times, more than {MAX_UNROLLED_COPIES}",
                self.ivs[iv].name
            ),
        )
        .with_note(format!("unrolled loops: {}; split the loop and unroll a short inner part", loops.join(", "))))
    }

    /// Checks that need the final loop order.
    pub fn finish(&self, stage: &str, span: Span) -> Result<(), Diagnostic> {
        if let Some((at, local)) = &self.cache_write {
            let Some(p) = self.leaf_pos(*at) else {
                return Err(Diagnostic::at(
                    self.cache_write_span,
                    format!("`{}` was split or fused after `cache_write` named it", self.ivs[*at].name),
                ));
            };
            let outside =
                if self.cache_write_resumes { None } else { self.leaves[..=p].iter().find(|&&l| self.ivs[l].reduce) };
            if let Some(&r) = outside {
                return Err(Diagnostic::at(
                    self.cache_write_span,
                    format!(
                    "`cache_write ... -> {local}` at `{}` needs every reduction loop inside it, but `{}` is outside",
                    self.ivs[*at].name, self.ivs[r].name
                ),
                )
                .with_note("reorder the reduction loops below the cache_write axis"));
            }
        }
        self.check_gpu_order(stage, span)?;
        if let Some(t) = &self.tensorize {
            let n = self.leaves.len();
            let inner = &self.leaves[n.saturating_sub(3)..];
            if let Some(&l) = t.leaves.iter().find(|l| !inner.contains(l)) {
                let order: Vec<&str> = self.leaves.iter().map(|&x| self.ivs[x].name.as_str()).collect();
                return Err(Diagnostic::at(
                    t.span,
                    format!(
                        "`{}` is tensorized but is not one of the three innermost loops of `{stage}`",
                        self.ivs[l].name
                    ),
                )
                .with_note(format!("loop order, outermost first: {}", order.join(", "))));
            }
        }
        if let Some(&last) = self.leaves.last() {
            for &l in &self.leaves {
                if self.ivs[l].kind == ForKind::Vectorized && l != last {
                    // Point at the `vectorize` itself; the block's span only when it is not known.
                    let at = self.annotated_at.iter().rev().find(|(iv, _)| *iv == l).map_or(span, |(_, s)| *s);
                    let order: Vec<&str> = self.leaves.iter().map(|&x| self.ivs[x].name.as_str()).collect();
                    return Err(Diagnostic::at(
                        at,
                        format!(
                            "in `{stage}`, vectorized `{}` is not the innermost loop: `{}` is",
                            self.ivs[l].name, self.ivs[last].name
                        ),
                    )
                    .with_note(format!("loop order, outermost first: {}", order.join(", ")))
                    .with_note("only the innermost loop can be vectorized; reorder it to the end"));
                }
            }
        }
        Ok(())
    }
}

impl StageSchedule {
    fn annotation_span(&self, iv: usize, fallback: Span) -> Span {
        self.annotated_at.iter().rev().find(|(v, _)| *v == iv).map_or(fallback, |(_, s)| *s)
    }

    /// Block loops are the outermost loops, and each block or thread
    /// dimension is bound once per stage.
    fn check_gpu_order(&self, stage: &str, span: Span) -> Result<(), Diagnostic> {
        let mut seen: Vec<ForKind> = Vec::new();
        let mut unbound_outside: Option<usize> = None;
        for &l in &self.leaves {
            let kind = self.ivs[l].kind;
            if kind.is_gpu() && seen.contains(&kind) {
                return Err(Diagnostic::at(
                    self.annotation_span(l, span),
                    format!("in `{stage}`, `{}` is a second loop bound to{}", self.ivs[l].name, kind.name()),
                ));
            }
            seen.push(kind);
            match (kind, unbound_outside) {
                (ForKind::Block(_), Some(o)) => {
                    let order: Vec<&str> = self.leaves.iter().map(|&x| self.ivs[x].name.as_str()).collect();
                    return Err(Diagnostic::at(
                        self.annotation_span(l, span),
                        format!(
                            "in `{stage}`, `{}` is bound to a block but `{}` is outside it: block loops are the \
                             outermost loops",
                            self.ivs[l].name, self.ivs[o].name
                        ),
                    )
                    .with_note(format!("loop order, outermost first: {}", order.join(", "))));
                }
                (ForKind::Block(_), None) => {}
                _ => unbound_outside = unbound_outside.or(Some(l)),
            }
        }
        Ok(())
    }
}

/// One dimension of a `cache_read ... layout (..)` buffer, in terms of the
/// cached tensor's dimensions: `d`, `d / c` or `d % c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutDim {
    Whole(usize),
    Div(usize, i64),
    Rem(usize, i64),
}

/// `compute_at P C.a` (or the stage a `cache_read` made): stage `P` runs
/// inside loop `leaf` of stage `owner`, into a buffer private to each
/// iteration of that loop.
#[derive(Clone, Debug)]
pub struct Attach {
    pub owner: usize,
    pub leaf: usize,
    pub layout: Option<Vec<LayoutDim>>,
    /// The buffer is a GPU block's shared memory (`cache_read ... in shared`),
    /// computed by the block's threads together between two barriers.
    pub shared: bool,
    pub span: Span,
}

/// The schedule of every stage of a program, by stage index.
#[derive(Clone, Debug)]
pub struct Schedules {
    pub stages: Vec<StageSchedule>,
    pub attach: Vec<Option<Attach>>,
}

impl Schedules {
    pub fn new(p: &Program) -> Schedules {
        Schedules { stages: p.stages.iter().map(StageSchedule::new).collect(), attach: vec![None; p.stages.len()] }
    }

    /// Make room for a new stage at index `si` (schedule `ss`, not attached).
    pub fn insert(&mut self, si: usize, ss: StageSchedule) {
        for a in self.attach.iter_mut().flatten() {
            if a.owner >= si {
                a.owner += 1;
            }
        }
        self.stages.insert(si, ss);
        self.attach.insert(si, None);
    }

    /// Drop stage `si`'s schedule (the stage was inlined); no stage may be attached at it.
    pub fn remove(&mut self, si: usize) {
        debug_assert!(self.attach.iter().flatten().all(|a| a.owner != si), "a stage is attached at {si}");
        for a in self.attach.iter_mut().flatten() {
            if a.owner > si {
                a.owner -= 1;
            }
        }
        self.stages.remove(si);
        self.attach.remove(si);
    }

    /// The stages that are the epilogue of another stage's write-back (and
    /// so have no loops of their own), indexed once: asking stage by stage
    /// with a walk of every schedule was quadratic in a model's stages.
    pub fn epilogues(&self) -> std::collections::HashSet<usize> {
        self.stages.iter().filter_map(|ss| ss.epilogue).collect()
    }

    /// The stages attached at each loop `(owner, leaf)`, in program order, indexed once.
    pub fn attachment_points(&self) -> std::collections::HashMap<(usize, usize), Vec<usize>> {
        let mut at: std::collections::HashMap<(usize, usize), Vec<usize>> = Default::default();
        for (i, a) in self.attach.iter().enumerate() {
            if let Some(a) = a {
                at.entry((a.owner, a.leaf)).or_default().push(i);
            }
        }
        at
    }
}

/// A broken invariant of a schedule: the stage (by its tensor) and what.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct ScheduleError {
    pub stage: Option<String>,
    pub fault: String,
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.stage {
            Some(s) => write!(f, "stage `{s}`: {}", self.fault),
            None => f.write_str(&self.fault),
        }
    }
}

impl Schedules {
    /// Check the invariants lowering relies on: each stage's leaves are
    /// distinct and cover each of its variables exactly once, extents agree
    /// with the splits and fusions, only the innermost loop is vectorized,
    /// and attachments name leaves of earlier-lowered owners.
    pub fn verify(&self, p: &Program) -> Result<(), ScheduleError> {
        if self.stages.len() != p.stages.len() || self.attach.len() != p.stages.len() {
            return Err(ScheduleError { stage: None, fault: "one schedule per stage".into() });
        }
        for (si, ss) in self.stages.iter().enumerate() {
            let name = &p.tensor(p.stages[si].tensor).name;
            let err = |m: String| ScheduleError { stage: Some(name.clone()), fault: m };
            // Each leaf provides itself, a fused loop also its two parts; a
            // variable is available when provided or when both parts of its split are.
            let mut provided = vec![0u32; ss.ivs.len()];
            fn provide(ss: &StageSchedule, iv: usize, provided: &mut [u32]) {
                provided[iv] += 1;
                if let Rel::Fuse { outer, inner } = ss.ivs[iv].rel {
                    provide(ss, outer, provided);
                    provide(ss, inner, provided);
                }
            }
            fn available(ss: &StageSchedule, iv: usize, provided: &[u32]) -> bool {
                provided[iv] > 0
                    || ss
                        .split_children(iv)
                        .is_some_and(|(o, i, _)| available(ss, o, provided) && available(ss, i, provided))
                    // A part of a fused loop that was split further.
                    || ss.fused_parent(iv).is_some_and(|(f, _, _)| provided[f] == 0 && available(ss, f, provided))
            }
            for &l in &ss.leaves {
                provide(ss, l, &mut provided);
            }
            for (i, v) in ss.ivs.iter().enumerate() {
                let expected = match v.rel {
                    Rel::Split { parent, outer: true, factor } => (ss.ivs[parent].extent + factor - 1) / factor.max(1),
                    Rel::Split { outer: false, factor, .. } => factor,
                    Rel::Fuse { outer, inner } => ss.ivs[outer].extent * ss.ivs[inner].extent,
                    Rel::Root(_) => v.extent,
                };
                if v.extent != expected {
                    return Err(err(format!(
                        "loop `{}` has extent {} but its relation gives {expected}",
                        v.name, v.extent
                    )));
                }
                if provided[i] > 1 {
                    return Err(err(format!("loop `{}` appears twice in the loop order", v.name)));
                }
                if matches!(v.rel, Rel::Root(_)) && !available(ss, i, &provided) {
                    return Err(err(format!("variable `{}` is not covered by the loop order", v.name)));
                }
            }
            if let Some(&last) = ss.leaves.last() {
                if ss.leaves.iter().any(|&l| l != last && ss.ivs[l].kind == ForKind::Vectorized) {
                    return Err(err("a vectorized loop is not innermost".into()));
                }
            }
            if let Some(a) = &self.attach[si] {
                if a.owner <= si || a.owner >= self.stages.len() {
                    return Err(err(format!("attached to stage {} which does not run after it", a.owner)));
                }
                if self.stages[a.owner].leaf_pos(a.leaf).is_none() {
                    return Err(err("attached at a loop that is not a leaf of its owner".into()));
                }
            }
        }
        Ok(())
    }
}

/// Deterministic printer of schedules (the dump after the *schedule* pass).
pub fn print(p: &Program, s: &Schedules) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "schedules of {}", p.name);
    for (si, ss) in s.stages.iter().enumerate() {
        let name = &p.tensor(p.stages[si].tensor).name;
        let loops: Vec<String> = ss
            .leaves
            .iter()
            .map(|&l| format!("{} < {}{}", ss.ivs[l].name, ss.ivs[l].extent, ss.ivs[l].kind.name()))
            .collect();
        let _ = write!(out, "  {name}: {}", loops.join(", "));
        if let Some(a) = &s.attach[si] {
            let owner = &p.tensor(p.stages[a.owner].tensor).name;
            let _ = write!(out, "; at {owner}.{}", s.stages[a.owner].ivs[a.leaf].name);
            if let Some(layout) = &a.layout {
                let dims: Vec<String> = layout
                    .iter()
                    .map(|d| match *d {
                        LayoutDim::Whole(x) => p.stages[si].vars[x].name.clone(),
                        LayoutDim::Div(x, c) => format!("{} / {c}", p.stages[si].vars[x].name),
                        LayoutDim::Rem(x, c) => format!("{} % {c}", p.stages[si].vars[x].name),
                    })
                    .collect();
                let _ = write!(out, " layout ({})", dims.join(", "));
            }
        }
        if let Some((at, local)) = &ss.cache_write {
            let resumes = if ss.cache_write_resumes { " (resuming each slice's sums)" } else { "" };
            let _ = write!(out, "; cache_write at {} -> {local}{resumes}", ss.ivs[*at].name);
        }
        if let Some(e) = ss.epilogue {
            let _ = write!(out, "; epilogue {}", p.tensor(p.stages[e].tensor).name);
        }
        if let Some(fl) = ss.flash {
            let par = if fl.parallel { ", rows parallel" } else { "" };
            let _ = write!(
                out,
                "; flash attention: {} keys, {} queries per block, {} lanes{par}",
                fl.block, fl.queries, fl.lanes
            );
        }
        out.push('\n');
    }
    out
}
