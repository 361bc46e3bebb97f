//! texc scheduling: from the tensor IR to loop nests.
//!
//! Passes (run in this order by `texc-pipeline`, which dumps, verifies and
//! times each):
//! - without a `schedule` block, the target's *preparation passes*
//!   ([`prepare`]: TIR → TIR steps of the target family's [`strategy`]
//!   over [`normalize`]);
//! - *schedule*: the kernel's `schedule` block for the target ([`apply`]) or
//!   the target's default schedule ([`strategy::schedule_prepared`]), then
//!   the boxes of attached stages ([`attach`]); verified by
//!   [`Schedules::verify`](schedule::Schedules::verify);
//! - *lower*: to the loop IR ([`ir`], with [`index`] simplifying the indices
//!   of attached buffers); verified by [`verify::verify_lowered`], which
//!   proves parallel and vectorized loops independent ([`independence`]);
//! - *tensorize* (GPU tensor-core operations, and AMX tile products on
//!   CPUs that have them, [`tensorize`]); on GPU targets also
//!   *cross-thread* (reductions over a block's threads, [`cross_thread`]),
//!   *multistage* and *pad-ldmatrix* (software pipelines of shared-memory
//!   copies, [`multistage`]);
//! - *zero*: zeros first where a read may reach an unwritten element
//!   ([`zeroing`]);
//! - *one-launch* (CPU targets): a parallel loop's full tiles and its
//!   last, partial one run as one launch ([`launches`]);
//! - *legalize*: integer semantics and target intrinsics made explicit
//!   ([`legalize`]); verified by [`verify::verify_legal`];
//! - *prefetch* (CPU targets compiled by LLVM: software prefetches of
//!   inputs read in runs, [`prefetch`]) and *keep-rolled* (the loops around
//!   register blocks that LLVM's unroller must not copy, [`keep_rolled`]).
//!
//! [`gpu`] describes how loop nests for GPU targets launch, and checks
//! the rules that make their bound loops independent.
//! [`analysis`] holds what backends ask of loop IR (access patterns, lane
//! uniformity); [`eval`] runs loop IR directly, for tests; [`work`] counts
//! the operations a nest executes (`texc bench --profile`); [`text`] reads
//! the printed loop IR back (`.loops` files).

pub mod analysis;
pub mod apply;
pub mod attach;
pub mod channels_last;
pub mod cross_thread;
pub mod digits;
pub mod dot4;
pub mod eval;
pub mod filters_last;
pub mod flash;
pub mod forward;
pub mod gpu;
pub mod guards;
pub mod im2col;
pub mod independence;
pub mod index;
pub mod interval;
pub mod ir;
pub mod keep_rolled;
pub mod knobs;
pub mod launches;
pub mod legalize;
pub mod lower;
pub mod memory_plan;
pub mod merge_rows;
pub mod multistage;
pub mod nest;
pub mod normalize;
pub mod prefetch;
pub mod prepack;
pub mod prepare;
pub mod schedule;
pub mod separable;
pub mod strategy;
pub mod subsample;
pub mod tensorize;
#[cfg(test)]
mod testing;
pub mod text;
pub mod transpose;
pub mod tuning;
pub mod validate;
pub mod verify;
pub mod versioning;
pub mod work;
pub mod zeroing;

pub use apply::Knobs;
pub use ir::LoopFunc;

use texc_compiler::target::Target;
use texc_compiler::{KernelRef, Session};
use texc_grammar::ast::{Ast, Schedule};

/// A `schedule` block with the file it was written in (its layouts are expressions of that file).
#[derive(Clone, Copy)]
pub struct ScheduleSrc<'s> {
    pub ast: &'s Ast,
    pub block: &'s Schedule,
}

/// The `schedule` block of kernel `k` for `target`, or else for the
/// nearest target it extends (`x86-avx512` runs an `x86-avx2` schedule), if
/// the source has one that is not `= auto`.
pub fn find_schedule<'s>(s: &'s Session, k: KernelRef, target: &Target) -> Option<ScheduleSrc<'s>> {
    let found = target.lineage().into_iter().find_map(|t| own_schedule_block(s, k, t))?;
    // `= auto` hands the kernel to the autotuner: the default schedule and its
    // knobs, set by `--knob` or the tuning database, as without a block.
    (!matches!(found.block.body, texc_grammar::ast::ScheduleBody::Auto)).then_some(found)
}

/// The `schedule` block written for exactly `target` (no fallback), for checking it.
pub fn own_schedule_block<'s>(s: &'s Session, k: KernelRef, target: &Target) -> Option<ScheduleSrc<'s>> {
    let m = s.module(k.module as usize);
    let block = m.schedules_of(&s.kernel(k).name).find(|sc| sc.target.name == target.name)?;
    Some(ScheduleSrc { ast: &m.ast, block })
}
