//! The preparation passes of the default schedules: what each target
//! family's default schedule needs of the tensor IR before it schedules
//! it, in order. The pipeline runs them one by one as passes of their own
//! (each dumped, verified and timed: `--time-passes`, `TEXC_DUMP_IR=rfactor`);
//! [`prepare`] runs them all (the default schedule on a copy, for packs).
//! A kernel's own `schedule` block runs none of them.
//!
//! Invariants: each pass takes a verified tensor-IR program to a verified
//! one computing the same outputs (up to reassociation of float sums).

use crate::default::{self, DefaultKnobs};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::Program;

/// One preparation pass.
#[derive(Clone, Copy)]
pub struct Step {
    /// The name passes are dumped and timed by.
    pub name: &'static str,
    pub run: fn(&mut Program, &Target, DefaultKnobs),
}

const CPU: [Step; 8] = [
    Step { name: "one-hot-gathers", run: default::one_hot_gathers },
    Step { name: "inline-elementwise", run: default::inline_elementwise_step },
    Step { name: "hoist-reductions", run: default::hoist_reductions_step },
    Step { name: "inline-epilogues", run: default::inline_epilogues_step },
    Step { name: "simplify-div-mod", run: default::simplify_div_mod },
    Step { name: "reciprocals", run: default::reciprocals },
    Step { name: "fuse-dense-reductions", run: default::fuse_dense_reductions },
    Step { name: "rfactor", run: default::rfactor },
];

const GPU: [Step; 5] = [
    Step { name: "one-hot-gathers", run: default::one_hot_gathers },
    Step { name: "inline-elementwise", run: default::inline_elementwise_step },
    Step { name: "hoist-reductions", run: default::hoist_reductions_step },
    Step { name: "simplify-div-mod", run: default::simplify_div_mod },
    Step { name: "im2col", run: default::im2col },
];

/// The preparation passes of `target`'s default schedule, in order.
pub fn steps(target: &Target) -> &'static [Step] {
    match target.kind {
        TargetKind::Gpu => &GPU,
        _ => &CPU,
    }
}

/// Every pass's name, once each (for `TEXC_DUMP_IR`).
pub fn names() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for s in CPU.iter().chain(&GPU) {
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
