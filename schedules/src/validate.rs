//! Schedule blocks checked without sizes (`texc check` of a kernel whose
//! sizes are not all known).
//!
//! A block is applied, for the target it names, to the kernel's structure
//! at sample sizes (`specialize_structure`): the stage and axis names,
//! which axes are reductions, what each primitive may do on the target
//! (loop kinds, memory scopes, GPU units), the loop order and attachments.
//! What depends on the real extents (at most 64 vector lanes, unrolled
//! copies, the size of an attached buffer) is left to the check at
//! concrete sizes; GPU primitives are checked for their names and axes,
//! though texc cannot lower them yet.

use crate::apply::{apply_with, Knobs};
use crate::ScheduleSrc;
use texc_compiler::target::{self, Target};
use texc_compiler::tir::Program;
use texc_compiler::{KernelRef, Session};
use texc_grammar::Diagnostic;

/// Every schedule block of kernel `k`, with the target it names (blocks
/// for unknown targets are left out: resolution reports them).
pub fn blocks<'s>(s: &'s Session, k: KernelRef) -> Vec<(&'static Target, ScheduleSrc<'s>)> {
    let m = s.module(k.module as usize);
    m.schedules_of(&s.kernel(k).name)
        .filter_map(|block| {
            let t = target::lookup(&block.target.name).ok()?;
            Some((t, ScheduleSrc { ast: &m.ast, block }))
        })
        .collect()
}

/// Validate one block against `p` (the kernel's structure) for `t`.
pub fn validate(p: &Program, src: ScheduleSrc, t: &Target) -> Result<(), Diagnostic> {
    let mut q = p.clone();
    let mut s = apply_with(&mut q, src, t, &Knobs::new(), false)?;
    crate::attach::infer_with(&q, &mut s, false)?;
    Ok(())
}
