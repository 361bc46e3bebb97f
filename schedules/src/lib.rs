//! texc scheduling: from the tensor IR to loop nests.
//!
//! Pipeline: a specialized [`Program`] → the kernel's `schedule` block for
//! the target ([`apply`]) or the target's default schedule ([`default`]),
//! both via the TIR passes of [`normalize`] → the boxes of attached stages
//! ([`attach`]) → [`lower`] to the loop IR ([`ir`], with [`index`]
//! simplifying the indices of attached buffers) → [`verify`] (debug builds,
//! or `TEXC_VERIFY=1`). `TEXC_DUMP_IR=1` prints the loop IR. [`eval`] runs loop IR directly, for tests.

pub mod apply;
pub mod attach;
pub mod default;
pub mod eval;
pub mod index;
pub mod ir;
pub mod lower;
pub mod normalize;
pub mod schedule;
pub mod verify;

pub use ir::LoopFunc;

use texc_compiler::{KernelRef, Program, Session};
use texc_grammar::ast::{Ast, Schedule};
use texc_grammar::Diagnostic;

/// A `schedule` block with the file it was written in (its layouts are expressions of that file).
#[derive(Clone, Copy)]
pub struct ScheduleSrc<'s> {
    pub ast: &'s Ast,
    pub block: &'s Schedule,
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The `schedule` block of kernel `k` for `target`, if the source has one.
pub fn find_schedule<'s>(s: &'s Session, k: KernelRef, target: &str) -> Option<ScheduleSrc<'s>> {
    let name = &s.kernel(k).name;
    let ast = &s.module(k.module as usize).ast;
    let block = ast.schedules().find(|sc| sc.kernel.name == *name && sc.target.name == target)?;
    Some(ScheduleSrc { ast, block })
}

/// Schedule and lower a program for a CPU target.
pub fn schedule_and_lower(mut p: Program, target: &str, sched: Option<ScheduleSrc>) -> Result<LoopFunc, Diagnostic> {
    let mut schedules = match sched {
        Some(sc) => apply::apply(&mut p, sc)?,
        None => default::default_schedule(&mut p, target),
    };
    let regions = attach::infer(&p, &mut schedules)?;
    let f = lower::lower(p, &schedules, &regions);
    if env_flag("TEXC_DUMP_IR") {
        eprintln!("// ---- after lower (loops)\n{}", ir::print(&f));
    }
    if cfg!(debug_assertions) || env_flag("TEXC_VERIFY") {
        verify::verify(&f)
            .map_err(|m| Diagnostic::error(format!("internal error: loop IR verifier failed after lower: {m}")))?;
    }
    Ok(f)
}
