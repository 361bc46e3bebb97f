//! The preparation passes of the default schedules: what each target
//! family's default schedule needs of the tensor IR before it schedules
//! it, in order. Each strategy lists its own
//! ([`Strategy::preparation`](crate::strategy::Strategy::preparation), in
//! `strategy/cpu/mod.rs` and `strategy/gpu/mod.rs`). The pipeline runs them
//! one by one as passes of their own (each dumped, verified and timed:
//! `--time-passes`, `TEXC_DUMP_IR=rfactor`); [`prepare`] runs them all (the
//! default schedule on a copy, for packs). A kernel's own `schedule` block
//! runs none of them.
//!
//! Invariants: each pass takes a verified tensor-IR program to a verified
//! one computing the same outputs (up to reassociation of float sums).

use crate::knobs::DefaultKnobs;
use crate::strategy::{lookup, STRATEGIES};
use texc_compiler::target::Target;
use texc_compiler::tir::Program;

/// One preparation pass.
#[derive(Clone, Copy)]
pub struct Step {
    /// The name passes are dumped and timed by.
    pub name: &'static str,
    pub run: fn(&mut Program, &Target, DefaultKnobs),
}

/// The preparation passes of `target`'s default schedule, in order.
pub fn steps(target: &Target) -> &'static [Step] {
    lookup(target).preparation()
}

/// Every pass's name, once each (for `TEXC_DUMP_IR`).
pub fn names() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for s in STRATEGIES.iter().flat_map(|s| s.preparation()) {
        if !out.contains(&s.name) {
            out.push(s.name);
        }
    }
    out
}

/// Run `target`'s preparation passes on `p`.
pub fn prepare(p: &mut Program, target: &Target, knobs: DefaultKnobs) {
    for s in steps(target) {
        (s.run)(p, target, knobs);
    }
}
