//! The *legalize* pass: every expression of the loop nest rewritten by
//! [`texc_compiler::legalize`] for the target — floor division and modulo
//! expanded into machine division, multiply-adds contracted into the
//! target's FMA intrinsic — so that backends translate operations one to
//! one and never re-derive texc's integer semantics.
//!
//! Guarantees (checked by [`crate::verify::verify_legal`]): no
//! `FloorDiv`/`FloorMod` remains, and every intrinsic is one the target has.

use crate::ir::{LoopFunc, Stmt};
use texc_compiler::legalize::Legalizer;
use texc_compiler::target::Target;
use texc_compiler::tir::Program;

pub fn legalize(f: &mut LoopFunc, target: &Target) {
    let mut lz = Legalizer::new(target);
    let mut body = std::mem::take(&mut f.body);
    stmts(&mut body, &mut lz, &mut f.p);
    f.body = body;
}

fn stmts(body: &mut [Stmt], lz: &mut Legalizer, p: &mut Program) {
    for s in body {
        match s {
            Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => {}
            Stmt::Mma { c, a, b, .. } => {
                for t in [c, a, b] {
                    for i in t.origin.iter_mut() {
                        *i = lz.expr(p, *i);
                    }
                }
            }
            Stmt::Wgmma(w) => {
                for i in w.origins_mut() {
                    *i = lz.expr(p, *i);
                }
            }
            Stmt::TileDot(d) => {
                for i in d.origins_mut() {
                    *i = lz.expr(p, *i);
                }
            }
            Stmt::For { body, .. } | Stmt::Alloc { body, .. } => stmts(body, lz, p),
            Stmt::If { cond, then } => {
                *cond = lz.expr(p, *cond);
                stmts(then, lz, p);
            }
            Stmt::Store { indices, value, .. } => {
                for i in indices.iter_mut() {
                    *i = lz.expr(p, *i);
                }
                *value = lz.expr(p, *value);
            }
        }
    }
}
