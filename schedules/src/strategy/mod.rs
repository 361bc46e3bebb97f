//! The default schedules, one strategy per target family: what a kernel
//! without a `schedule` block (or whose block is `= auto`) is compiled with.
//! A [`Strategy`] names its family's knobs (its rows of
//! [`crate::knobs::KNOBS`]), its preparation passes (tensor IR to tensor IR,
//! which the pipeline runs one by one: [`crate::prepare`]), the schedule
//! it makes of the prepared program, and its performance model (how fast
//! those schedules run each operator, which the e-graph prices plans with). [`lookup`] finds the strategy of a
//! [`Target`], as Cranelift's `isa::lookup` finds an ISA; a new target of an
//! existing family needs no code here, only its `Target` values.
//!
//! - `cpu` (`strategy/cpu/`): register blocking, vectorization, packed
//!   panels, threads over the outer loops, producers computed inside the
//!   loops of their readers; `model.rs`, its measured efficiencies;
//! - `gpu` (`strategy/gpu/`): a grid over each stage's elements, a block per
//!   row, register tiles, tensor-core products through shared memory;
//! - `preparation`: the inlining and preparation steps the families share.
//!
//! Invariants: every machine parameter (vector width per element type,
//! register count) comes from the [`Target`], every choice a knob can
//! override from [`DefaultKnobs`]; nothing else (no environment, no
//! measurement) decides a default schedule. A strategy applies only schedule
//! primitives, so a default schedule computes what the program computes,
//! and [`Schedules::verify`] accepts it.

mod cpu;

pub(crate) use cpu::{default_row, vector_operand};
mod gpu;
mod preparation;

pub use preparation::default_inlining;

use crate::knobs::{DefaultKnobs, Family, Knob};
use crate::prepare::Step;
use crate::schedule::Schedules;
use texc_compiler::rewrite::{Model, Nominal};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, VarId};

/// The default schedule of one target family.
pub trait Strategy: Sync {
    /// The family whose targets it schedules.
    fn family(&self) -> Family;

    /// Its name in messages: `cpu`, `gpu`.
    fn name(&self) -> &'static str;

    /// The knobs it reads: its family's rows of the one table of knobs.
    fn knobs(&self) -> &'static [Knob] {
        crate::knobs::of(self.family())
    }

    /// The passes that prepare the tensor IR for [`Strategy::schedule`], in order.
    fn preparation(&self) -> &'static [Step];

    /// How fast its schedules run each operator: the efficiencies the
    /// e-graph prices operators with. A schedule change that moves an
    /// operator's speed changes its entry in the same commit.
    fn performance(&self, target: &Target) -> Model;

    /// The schedule of `p`, which [`Strategy::preparation`] has run on with
    /// the same `knobs`. It may add stages to `p` (packed operands,
    /// shared-memory copies) and remove ones it inlines.
    fn schedule(&self, p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules;
}

/// Every strategy, the CPUs' first (the order `TEXC_DUMP_IR` lists passes in).
pub static STRATEGIES: [&dyn Strategy; 2] = [&cpu::Cpu, &gpu::Gpu];

/// The strategy of `target`'s family; targets that are not GPUs (the
/// interpreter too) get the CPUs'.
pub fn lookup(target: &Target) -> &'static dyn Strategy {
    match target.kind {
        TargetKind::Gpu => &gpu::Gpu,
        TargetKind::Cpu | TargetKind::Interp => &cpu::Cpu,
    }
}

/// The default schedule of `p` for `target`; inlines and factors stages of `p` first.
pub fn default_schedule(p: &mut Program, target: &Target) -> Schedules {
    default_schedule_with(p, target, DefaultKnobs::default())
}

/// [`default_schedule`] with some of its parameters set ([`DefaultKnobs`]):
/// the target's preparation passes ([`crate::prepare`]), then
/// [`schedule_prepared`]. (The pipeline runs the passes one by one.)
pub fn default_schedule_with(p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules {
    crate::prepare::prepare(p, target, knobs);
    schedule_prepared(p, target, knobs)
}

/// The default schedule of `p`, which the target's preparation passes
/// ([`crate::prepare`]) have run on.
pub fn schedule_prepared(p: &mut Program, target: &Target, knobs: DefaultKnobs) -> Schedules {
    lookup(target).schedule(p, target, knobs)
}

/// The performance model the e-graph prices operators with for `target`:
/// its strategy's, and on the interpreter (which runs programs as written)
/// the nominal machine's.
pub fn performance_model(target: &Target) -> Model {
    match target.kind {
        TargetKind::Interp => std::sync::Arc::new(Nominal),
        _ => lookup(target).performance(target),
    }
}

/// Whether `e` loads tensor `t`.
pub(crate) fn loads(p: &Program, e: TExprId, t: TensorId) -> bool {
    matches!(p.expr(e), TExpr::Load(x, _) if *x == t) || p.children(e).into_iter().any(|c| loads(p, c, t))
}

/// The tensors each stage's value loads: "which stages read `t`" is then a
/// lookup, not a walk of every later stage's expression (for each stage of
/// a model's thousand, that walk made preparation quadratic).
pub(crate) struct Reads(Vec<std::collections::BTreeSet<TensorId>>);

impl Reads {
    pub(crate) fn of(p: &Program) -> Reads {
        Reads(p.stages.iter().map(|st| tensors_loaded(p, st.value)).collect())
    }

    /// Whether stage `si` loads `t`.
    pub(crate) fn loads(&self, si: usize, t: TensorId) -> bool {
        self.0[si].contains(&t)
    }

    /// The tensors stage `si` loads.
    pub(crate) fn tensors(&self, si: usize) -> impl Iterator<Item = TensorId> + '_ {
        self.0[si].iter().copied()
    }

    /// After a stage was inserted at `si` and stage `changed` rewritten.
    pub(crate) fn inserted(&mut self, p: &Program, si: usize, changed: usize) {
        self.0.insert(si, tensors_loaded(p, p.stages[si].value));
        self.0[changed] = tensors_loaded(p, p.stages[changed].value);
    }

    /// After [`crate::normalize::inline_stage`]`(p, si)`: stage `si` is gone
    /// and each of its readers reads what it read instead of its tensor `t`.
    pub(crate) fn inlined(&mut self, si: usize, t: TensorId) {
        let gone = self.0.remove(si);
        for reads in &mut self.0[si..] {
            if reads.remove(&t) {
                reads.extend(gone.iter().copied());
            }
        }
    }
}

/// Whether every load of `t` in stage `c` reads it at `c`'s own point
/// (`t[i0, i1, ..]` in `c[i0, i1, ..]`): `c` can be stored from a block
/// of `t`'s producer (an epilogue).
pub(crate) fn reads_at_own_point(p: &Program, c: &Stage, t: TensorId) -> bool {
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, c.value, &mut loads);
    loads.iter().all(|&l| match p.expr(l) {
        TExpr::Load(u, idx) if *u == t => {
            idx.len() == c.n_axes
                && idx.iter().enumerate().all(|(d, &i)| matches!(p.expr(i), TExpr::Var(v) if *v as usize == d))
        }
        _ => true,
    })
}

/// The tensors `e` loads.
pub(crate) fn tensors_loaded(p: &Program, e: TExprId) -> std::collections::BTreeSet<TensorId> {
    let mut found = Vec::new();
    crate::analysis::loads_in(p, e, &mut found);
    found
        .into_iter()
        .filter_map(|l| match p.expr(l) {
            TExpr::Load(t, _) => Some(*t),
            _ => None,
        })
        .collect()
}

/// Whether `e` reads variable `v`.
fn uses_var(p: &Program, e: TExprId, v: u32) -> bool {
    matches!(p.expr(e), TExpr::Var(x) if *x == v) || p.children(e).into_iter().any(|c| uses_var(p, c, v))
}

/// A cache line's bytes, what the layout decisions count reads in.
pub(crate) const LINE: i64 = 64;

/// The lines that element-wise stage `st` gathers from: of the tensors it
/// reads across cache lines along its last axis, the one its vectors run
/// along (each lane a line of its own: the copy back of a product computed
/// filters-last, `Y[n, f, y, x] = Y.t[n, y, x, f]`), the most lines one
/// holds (its elements over its last dimension's); 0 where it reads none
/// so. Such a stage walks its source's lines once only as a pass of its
/// own, in the order `transposing_order` gives it. (Reductions are not
/// asked: a sum of partial results along a row reads across lines, and is
/// not a transposing pass.)
pub(crate) fn gathered_lines(p: &Program, st: &Stage) -> i64 {
    let Some(last) = st.n_axes.checked_sub(1).filter(|_| st.vars.len() == st.n_axes) else { return 0 };
    let mut loads = Vec::new();
    crate::analysis::loads_in(p, st.value, &mut loads);
    let lines = |&l: &TExprId| {
        let TExpr::Load(t, idx) = p.expr(l) else { return None };
        let d = p.tensor(*t);
        let stride = crate::analysis::flat_coefficient(p, *t, idx, last as VarId)?;
        let across = stride.saturating_abs().saturating_mul(d.elem.size() as i64) >= LINE;
        across.then(|| d.len() / d.shape.last().copied().unwrap_or(1).max(1))
    };
    loads.iter().filter_map(lines).max().unwrap_or(0)
}
