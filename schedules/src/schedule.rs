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

#[derive(Clone, Debug)]
pub struct StageSchedule {
    pub ivs: Vec<IterVar>,
    /// Loop order, outermost first.
    pub leaves: Vec<usize>,
    /// `cache_write S at S.a -> L`: the leaf `a`, the local's name, and the primitive's span.
    pub cache_write: Option<(usize, String)>,
    pub cache_write_span: Span,
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
        StageSchedule { ivs, leaves, cache_write: None, cache_write_span: Span::default() }
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.ivs.iter().rposition(|v| v.name == name)
    }

    fn leaf_pos(&self, iv: usize) -> Option<usize> {
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
        let v = &self.ivs[iv];
        let what = match kind {
            ForKind::Vectorized => "vectorize",
            ForKind::Parallel => "parallelize",
            ForKind::Unrolled => "unroll",
            ForKind::Serial => "",
        };
        if v.reduce && matches!(kind, ForKind::Vectorized | ForKind::Parallel) {
            return Err(Diagnostic::at(span, format!("cannot {what} `{}`: it is a reduction axis", v.name)).with_note(
                "iterations of a reduction depend on each other; split it and reorder a spatial axis inward instead",
            ));
        }
        if v.kind != ForKind::Serial && v.kind != kind {
            return Err(Diagnostic::at(span, format!("`{}` is already marked{}", v.name, v.kind.name())));
        }
        if kind == ForKind::Vectorized && v.extent > 64 {
            return Err(Diagnostic::at(
                span,
                format!("`{}` has {} iterations; vectorized loops have at most 64 (split it first)", v.name, v.extent),
            ));
        }
        self.ivs[iv].kind = kind;
        Ok(())
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
            if let Some(&r) = self.leaves[..=p].iter().find(|&&l| self.ivs[l].reduce) {
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
        if let Some(&last) = self.leaves.last() {
            for &l in &self.leaves {
                if self.ivs[l].kind == ForKind::Vectorized && l != last {
                    return Err(Diagnostic::at(
                        span,
                        format!("in `{stage}`, vectorized `{}` is not the innermost loop", self.ivs[l].name),
                    )
                    .with_note("only the innermost loop can be vectorized; reorder it to the end"));
                }
            }
        }
        Ok(())
    }
}

/// The schedule of every stage of a program, by stage index.
#[derive(Clone, Debug)]
pub struct Schedules {
    pub stages: Vec<StageSchedule>,
}

impl Schedules {
    pub fn new(p: &Program) -> Schedules {
        Schedules { stages: p.stages.iter().map(StageSchedule::new).collect() }
    }
}
