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

pub(crate) mod cpu;

pub(crate) use cpu::{default_row, vector_operand};
mod gpu;
mod preparation;

pub use preparation::default_inlining;

use crate::knobs::{DefaultKnobs, Family, Knob};
use crate::prepare::Step;
use crate::schedule::Schedules;
use texc_compiler::rewrite::{Model, Nominal};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorId, TensorRole, VarId};

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

/// The tensors each stage's value loads, and the stages that load each
/// tensor: "which stages read `t`" is then a lookup, not a walk of every
/// later stage's expression (for each stage of a model's thousand, that
/// walk made preparation quadratic), nor a test of every stage.
///
/// Passes insert and remove stages as they go, which moves the index of
/// every later one; so the readers are kept by *slot*, a label that keeps
/// its stage's place in the order (spaced [`SLOT_GAP`] apart, a new stage
/// taking the middle of its neighbours' gap, all relabelled where none is
/// left), and a Fenwick tree of the live slots turns a slot into the
/// stage's index in `O(log n)`. Shifting every reader's index instead, per
/// stage inlined, was itself quadratic in a model's layers.
///
/// Invariants: `slot` ascends; `by[t]` is the ascending list of the slots
/// of the stages whose set in `of` holds `t` (no empty lists); `live`
/// counts exactly the slots in `slot`.
#[derive(Debug)]
pub(crate) struct Reads {
    /// By stage index: what it loads, and its slot.
    of: Vec<std::collections::BTreeSet<TensorId>>,
    /// By stage index: the tensor it writes.
    wrote: Vec<TensorId>,
    slot: Vec<usize>,
    by: std::collections::HashMap<TensorId, Vec<usize>>,
    /// Each tensor's writers, by slot, in order.
    writers: std::collections::HashMap<TensorId, Vec<usize>>,
    live: Fenwick,
}

/// What a stage inlined in place writes until [`Reads::dropped`] drops it:
/// nothing (so that relabelling the slots in between does not count it
/// among its tensor's writers again).
const INLINED: TensorId = TensorId(u32::MAX);

/// The space between two stages' slots when labelled afresh: six stages
/// inserted at one place before everything is relabelled.
const SLOT_GAP: usize = 64;

impl PartialEq for Reads {
    /// The same loads, stage by stage (slots are labels, not contents).
    fn eq(&self, other: &Reads) -> bool {
        self.of == other.of
            && self.wrote == other.wrote
            && self.readers_by_index() == other.readers_by_index()
            && self.writers_by_index() == other.writers_by_index()
    }
}

impl Reads {
    pub(crate) fn of(p: &Program) -> Reads {
        let of = p.stages.iter().map(|st| tensors_loaded(p, st.value)).collect();
        Reads::labelled(of, p.stages.iter().map(|st| st.tensor).collect())
    }

    /// The index over stages loading `of` and writing `wrote`, slots spaced afresh.
    fn labelled(of: Vec<std::collections::BTreeSet<TensorId>>, wrote: Vec<TensorId>) -> Reads {
        debug_assert_eq!(of.len(), wrote.len());
        let slot: Vec<usize> = (1..=of.len()).map(|i| i * SLOT_GAP).collect();
        let mut live = Fenwick::new((of.len() + 2) * SLOT_GAP);
        let mut by: std::collections::HashMap<TensorId, Vec<usize>> = Default::default();
        let mut writers: std::collections::HashMap<TensorId, Vec<usize>> = Default::default();
        for ((ts, &sl), &w) in of.iter().zip(&slot).zip(&wrote) {
            live.add(sl, 1);
            for &t in ts {
                by.entry(t).or_default().push(sl);
            }
            if w != INLINED {
                writers.entry(w).or_default().push(sl);
            }
        }
        Reads { of, wrote, slot, by, writers, live }
    }

    /// Every tensor's readers by stage index (for comparing two indexes).
    fn readers_by_index(&self) -> std::collections::BTreeMap<TensorId, Vec<usize>> {
        self.by.keys().map(|&t| (t, self.readers(t).collect())).collect()
    }

    /// Every tensor's writers by stage index (for comparing two indexes).
    fn writers_by_index(&self) -> std::collections::BTreeMap<TensorId, Vec<usize>> {
        self.writers.iter().map(|(&t, slots)| (t, slots.iter().map(|&sl| self.index(sl)).collect())).collect()
    }

    /// The first stage that writes `t`, if one does.
    pub(crate) fn first_writer(&self, t: TensorId) -> Option<usize> {
        self.writers.get(&t).and_then(|slots| slots.first()).map(|&sl| self.index(sl))
    }

    /// The stage that writes temporary `t`, if exactly one does.
    pub(crate) fn sole_writer(&self, p: &Program, t: TensorId) -> Option<usize> {
        match self.writers.get(&t).map(Vec::as_slice) {
            Some(&[sl]) if p.tensor(t).role == TensorRole::Temp => Some(self.index(sl)),
            _ => None,
        }
    }

    /// The stage index of the stage at slot `sl`.
    fn index(&self, sl: usize) -> usize {
        self.live.prefix(sl) - 1
    }

    /// The tensors stage `si` loads.
    pub(crate) fn tensors(&self, si: usize) -> impl Iterator<Item = TensorId> + '_ {
        self.of[si].iter().copied()
    }

    /// The stages that load `t`, in order.
    pub(crate) fn readers(&self, t: TensorId) -> impl Iterator<Item = usize> + '_ {
        self.by.get(&t).into_iter().flatten().map(|&sl| self.index(sl))
    }

    /// The stages after `si` that load `t`, in order.
    pub(crate) fn readers_after(&self, si: usize, t: TensorId) -> impl Iterator<Item = usize> + '_ {
        let from = self.slot[si];
        self.by.get(&t).into_iter().flatten().filter(move |&&sl| sl > from).map(|&sl| self.index(sl))
    }

    /// Whether tensor `t` is read, and `ok` holds for every read of it: each
    /// load of `t` with the stage it is in (walking only the stages that load
    /// it).
    pub(crate) fn every_read(&self, p: &Program, t: TensorId, ok: impl Fn(&Stage, TExprId) -> bool) -> bool {
        let mut read = false;
        for si in self.readers(t) {
            let st = &p.stages[si];
            let mut loads = Vec::new();
            crate::analysis::loads_in(p, st.value, &mut loads);
            for l in loads.into_iter().filter(|&l| matches!(p.expr(l), TExpr::Load(u, _) if *u == t)) {
                if !ok(st, l) {
                    return false;
                }
                read = true;
            }
        }
        read
    }

    /// Stage `si`'s entries set to what it loads, `loads`.
    fn set(&mut self, si: usize, loads: std::collections::BTreeSet<TensorId>) {
        let sl = self.slot[si];
        for t in std::mem::take(&mut self.of[si]) {
            remove_slot(&mut self.by, t, sl);
        }
        for &t in &loads {
            add_slot(&mut self.by, t, sl);
        }
        self.of[si] = loads;
    }

    /// Stage `si`'s entry set to writing `t` ([`INLINED`]: nothing).
    fn set_writer(&mut self, si: usize, t: TensorId) {
        let sl = self.slot[si];
        let old = std::mem::replace(&mut self.wrote[si], t);
        remove_slot(&mut self.writers, old, sl);
        if t != INLINED {
            add_slot(&mut self.writers, t, sl);
        }
    }

    /// After a stage was inserted at `si`.
    fn insert(&mut self, p: &Program, si: usize) {
        self.insert_loading(si, p.stages[si].tensor, tensors_loaded(p, p.stages[si].value));
    }

    /// After a stage writing `writes` and loading `loads` was inserted at `si`.
    fn insert_loading(&mut self, si: usize, writes: TensorId, loads: std::collections::BTreeSet<TensorId>) {
        let lo = if si == 0 { 0 } else { self.slot[si - 1] };
        let hi = self.slot.get(si).copied().unwrap_or(self.live.len());
        if hi - lo < 2 {
            let mut of = std::mem::take(&mut self.of);
            let mut wrote = std::mem::take(&mut self.wrote);
            of.insert(si, Default::default());
            wrote.insert(si, writes);
            *self = Reads::labelled(of, wrote);
        } else {
            let sl = (lo + hi) / 2;
            self.slot.insert(si, sl);
            self.of.insert(si, Default::default());
            self.wrote.insert(si, writes);
            add_slot(&mut self.writers, writes, sl);
            self.live.add(sl, 1);
        }
        self.set(si, loads);
    }

    /// After a stage was inserted at `si` and stage `changed` rewritten.
    pub(crate) fn inserted(&mut self, p: &Program, si: usize, changed: usize) {
        self.insert(p, si);
        self.refresh(p, changed);
    }

    /// After stages were inserted at `at..at + n`.
    pub(crate) fn inserted_run(&mut self, p: &Program, at: usize, n: usize) {
        for si in at..at + n {
            self.insert(p, si);
        }
    }

    /// After stage `si`'s value (or the tensor it writes) was rewritten.
    pub(crate) fn refresh(&mut self, p: &Program, si: usize) {
        self.set(si, tensors_loaded(p, p.stages[si].value));
        if self.wrote[si] != p.stages[si].tensor {
            self.set_writer(si, p.stages[si].tensor);
        }
    }

    /// After [`crate::normalize::inline_stage_in_place`]`(p, si, ..)`: each
    /// of stage `si`'s later readers reads what it read instead of its
    /// tensor `t`, and the stage, still in place, neither reads nor writes
    /// (no index moves); [`Reads::dropped`] drops it with the others.
    pub(crate) fn inlined_in_place(&mut self, si: usize, t: TensorId) {
        let readers: Vec<usize> = self.readers_after(si, t).collect();
        for &c in &readers {
            let mut now = self.of[c].clone();
            now.remove(&t);
            now.extend(self.of[si].iter().copied());
            self.set(c, now);
        }
        self.set(si, Default::default());
        self.set_writer(si, INLINED);
    }

    /// The index once the stages `dead` marks, inlined in place, are
    /// dropped ([`crate::normalize::drop_stages`]).
    pub(crate) fn dropped(self, dead: &[bool]) -> Reads {
        let live = |i: &usize| !dead.get(*i).copied().unwrap_or(false);
        let of = self.of.into_iter().enumerate().filter(|(i, _)| live(i)).map(|(_, o)| o).collect();
        let wrote = self.wrote.into_iter().enumerate().filter(|(i, _)| live(i)).map(|(_, w)| w).collect();
        Reads::labelled(of, wrote)
    }
}

/// Slot `sl` added to `t`'s sorted list in `map`.
fn add_slot(map: &mut std::collections::HashMap<TensorId, Vec<usize>>, t: TensorId, sl: usize) {
    let list = map.entry(t).or_default();
    if let Err(k) = list.binary_search(&sl) {
        list.insert(k, sl);
    }
}

/// Slot `sl` removed from `t`'s sorted list in `map` (the list too once empty).
fn remove_slot(map: &mut std::collections::HashMap<TensorId, Vec<usize>>, t: TensorId, sl: usize) {
    if let Some(list) = map.get_mut(&t) {
        if let Ok(k) = list.binary_search(&sl) {
            list.remove(k);
        }
        if list.is_empty() {
            map.remove(&t);
        }
    }
}

/// A Fenwick (binary indexed) tree of counts over `0..len`: add at a
/// point, count up to one, each in `O(log len)`.
#[derive(Debug)]
struct Fenwick(Vec<i32>);

impl Fenwick {
    fn new(len: usize) -> Fenwick {
        Fenwick(vec![0; len + 1])
    }

    fn len(&self) -> usize {
        self.0.len() - 1
    }

    fn add(&mut self, at: usize, delta: i32) {
        let mut i = at + 1;
        while i < self.0.len() {
            self.0[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// The sum over `0..=at`.
    fn prefix(&self, at: usize) -> usize {
        let (mut i, mut sum) = (at + 1, 0i64);
        while i > 0 {
            sum += self.0[i] as i64;
            i -= i & i.wrapping_neg();
        }
        sum as usize
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

#[cfg(test)]
mod tests {
    use super::Reads;
    use std::collections::BTreeSet;
    use texc_compiler::tir::TensorId;

    fn set(ts: &[u32]) -> BTreeSet<TensorId> {
        ts.iter().map(|&t| TensorId(t)).collect()
    }

    /// Insertions at one place past the gaps (relabelling), at both ends,
    /// and inlining keep the index what a fresh one over the same loads is.
    #[test]
    fn reads_stay_what_a_fresh_index_says() {
        let mut of: Vec<BTreeSet<TensorId>> = (0..5).map(|i| set(&[i, i + 1])).collect();
        // Stage i writes tensor 1000 + i; inserted ones write 200 + k % 3 (some twice).
        let mut wrote: Vec<TensorId> = (0..5).map(|i| TensorId(1000 + i)).collect();
        let mut r = Reads::labelled(of.clone(), wrote.clone());
        for k in 0..20u32 {
            let at = [2, 0, of.len()][k as usize % 3].min(of.len());
            let loads = set(&[100 + k, k % 4]);
            of.insert(at, loads.clone());
            wrote.insert(at, TensorId(200 + k % 3));
            r.insert_loading(at, TensorId(200 + k % 3), loads);
            assert_eq!(r, Reads::labelled(of.clone(), wrote.clone()), "after inserting at {at}");
        }
        assert_eq!(
            r.readers(TensorId(2)).collect::<Vec<_>>(),
            Reads::labelled(of.clone(), wrote.clone()).readers(TensorId(2)).collect::<Vec<_>>()
        );
        let writes = |r: &Reads, t: u32| r.writers.get(&TensorId(t)).map_or(0, Vec::len);
        assert_eq!((writes(&r, 1003), writes(&r, 200)), (1, 7));
        let w1003 = r.writers_by_index()[&TensorId(1003)][0];
        assert_eq!(wrote[w1003], TensorId(1003));
        // Inline the stage at 3 (say it writes tensor 1000) into its readers.
        let t = TensorId(1000);
        for c in [5, 9] {
            of[c].insert(t);
            let loads = of[c].clone();
            r.set(c, loads);
        }
        let gone = of.remove(3);
        wrote.remove(3);
        for c in [4, 8] {
            of[c].remove(&t);
            of[c].extend(gone.iter().copied());
        }
        r.inlined_in_place(3, t);
        let mut dropped = vec![false; r.of.len()];
        dropped[3] = true;
        let r = r.dropped(&dropped);
        assert_eq!(r, Reads::labelled(of.clone(), wrote.clone()));
        assert_eq!(
            r.readers_after(0, TensorId(100)).count(),
            Reads::labelled(of.clone(), wrote.clone()).readers_after(0, TensorId(100)).count()
        );
        // In place: stage 2 (say it writes 302, read by 4 and 8) and stage 6
        // (writing 306, read by 8 and 9) inlined without moving any stage,
        // then dropped together.
        let inlines = [(2usize, [4usize, 8]), (6, [8, 9])];
        let written = |w: usize| TensorId(300 + w as u32);
        for (w, readers) in inlines {
            wrote[w] = written(w);
            for c in readers {
                of[c].insert(written(w));
            }
        }
        let mut r = Reads::labelled(of.clone(), wrote.clone());
        let mut dead = vec![false; of.len()];
        for (w, readers) in inlines {
            r.inlined_in_place(w, written(w));
            assert!(!r.writers.contains_key(&written(w)), "an inlined stage writes nothing");
            let relabelled = Reads::labelled(r.of.clone(), r.wrote.clone());
            assert!(!relabelled.writers.contains_key(&written(w)), "nor once the slots are relabelled");
            dead[w] = true;
            for c in readers {
                of[c].remove(&written(w));
                let moved = of[w].clone();
                of[c].extend(moved);
            }
        }
        let kept = |i: &usize| !dead[*i];
        let of: Vec<_> = of.into_iter().enumerate().filter(|(i, _)| kept(i)).map(|(_, o)| o).collect();
        let wrote: Vec<_> = wrote.into_iter().enumerate().filter(|(i, _)| kept(i)).map(|(_, w)| w).collect();
        assert_eq!(r.dropped(&dead), Reads::labelled(of, wrote));
    }
}
