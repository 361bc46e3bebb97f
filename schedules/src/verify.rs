//! Loop IR verifiers. [`verify`] (after *lower*): every variable is bound
//! by an enclosing loop (once), accesses have one index per dimension, no
//! reductions remain. [`verify_legal`] (after *legalize*): that, and only
//! operations backends translate one to one.

use crate::gpu::{RuleError, Site};
use crate::ir::{LoopFunc, Stmt};
use texc_compiler::ops::BinOp;
use texc_compiler::target::Target;
use texc_compiler::tir::{TExpr, TExprId, Ty};

/// [`verify`], and that the iterations of parallel and vectorized loops
/// are proven independent ([`crate::independence`]): what *lower* produces.
pub fn verify_lowered(f: &LoopFunc) -> Result<(), String> {
    verify(f)?;
    crate::independence::check_loops(f).map_err(|c| c.message(f))
}

pub fn verify(f: &LoopFunc) -> Result<(), String> {
    let mut bound = vec![false; f.vars.len()];
    let mut seen = vec![false; f.vars.len()];
    stmts(f, &f.body, &mut bound, &mut seen)
}

fn stmts(f: &LoopFunc, body: &[Stmt], bound: &mut Vec<bool>, seen: &mut Vec<bool>) -> Result<(), String> {
    for s in body {
        match s {
            Stmt::Barrier | Stmt::Async(_) => {}
            Stmt::WarpReduce(w) => {
                let d = f.p.tensor(w.tensor);
                let fits = d.shape.len() == 1 && [2, 4, 8, 16, 32].contains(&w.lanes) && d.shape[0] % w.lanes == 0;
                if !f.registers.contains(&w.tensor) || !fits {
                    return Err(format!(
                        "`warp_reduce` by {} lanes needs a one-dimensional `registers` buffer whose length they \
                         divide; `{}` is not one",
                        w.lanes, d.name
                    ));
                }
            }
            Stmt::Mma { op, c, a, b } => {
                let (ab, acc) = op.types();
                for (t, elem) in [(c, acc), (a, ab), (b, ab)] {
                    let d = f.p.tensor(t.tensor);
                    if t.origin.len() != d.shape.len() || t.rows == t.cols || t.rows.max(t.cols) >= d.shape.len() {
                        return Err(format!("the `mma` tile of `{}` does not fit its dimensions", d.name));
                    }
                    if d.elem != elem {
                        return Err(format!("`mma {}` needs `{}` to be {elem}, not {}", op.name(), d.name, d.elem));
                    }
                    for &i in &t.origin {
                        if f.p.ty(i) != Ty::Index {
                            return Err("an `mma` tile origin is not an index".into());
                        }
                        expr(f, i, bound)?;
                    }
                }
            }
            Stmt::For { var, extent, body, .. } => {
                let v = *var as usize;
                if seen[v] {
                    return Err(format!("loop variable `{}` is bound twice", f.vars[v].name));
                }
                if *extent < 0 {
                    return Err(format!("loop `{}` has a negative extent", f.vars[v].name));
                }
                seen[v] = true;
                bound[v] = true;
                stmts(f, body, bound, seen)?;
                bound[v] = false;
            }
            Stmt::Alloc { body, .. } => stmts(f, body, bound, seen)?,
            Stmt::If { cond, then } => {
                expr(f, *cond, bound)?;
                stmts(f, then, bound, seen)?;
            }
            Stmt::Store { tensor, indices, value } => {
                if indices.len() != f.p.tensor(*tensor).shape.len() {
                    return Err(format!("store to `{}` has the wrong number of indices", f.p.tensor(*tensor).name));
                }
                for &i in indices {
                    if f.p.ty(i) != Ty::Index {
                        return Err("a store index is not an index".into());
                    }
                    expr(f, i, bound)?;
                }
                if f.p.ty(*value) != Ty::Elem(f.p.tensor(*tensor).elem) {
                    return Err(format!("store to `{}` has type {}", f.p.tensor(*tensor).name, f.p.ty(*value)));
                }
                expr(f, *value, bound)?;
            }
        }
    }
    Ok(())
}

fn expr(f: &LoopFunc, e: TExprId, bound: &[bool]) -> Result<(), String> {
    match f.p.expr(e) {
        TExpr::Var(v) if !bound.get(*v as usize).copied().unwrap_or(false) => {
            return Err(format!("variable {v} is used outside its loop"));
        }
        TExpr::Reduce(..) => return Err("a reduction remains in the loop IR".into()),
        TExpr::Load(t, idx) if idx.len() != f.p.tensor(*t).shape.len() => {
            return Err(format!("load of `{}` has the wrong number of indices", f.p.tensor(*t).name));
        }
        _ => {}
    }
    for c in f.p.children(e) {
        expr(f, c, bound)?;
    }
    Ok(())
}

/// [`verify`], plus: no floor division or modulo remains, and every
/// intrinsic is one the target has.
pub fn verify_legal(f: &LoopFunc, target: &Target) -> Result<(), String> {
    verify(f)?;
    let mut seen = vec![false; f.p.exprs.len()];
    let mut bad = None;
    walk_exprs(&f.body, &mut |e| legal(f, e, target, &mut seen, &mut bad));
    bad.map_or(Ok(()), Err)
}

fn legal(f: &LoopFunc, e: TExprId, target: &Target, seen: &mut [bool], bad: &mut Option<String>) {
    if std::mem::replace(&mut seen[e.0 as usize], true) || bad.is_some() {
        return;
    }
    match f.p.expr(e) {
        TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), ..) => {
            *bad = Some(format!("`{op:?}` remains after legalization"));
        }
        TExpr::Intrinsic(i, _) if !target.has_intrinsic(*i) => {
            *bad = Some(format!("intrinsic `{i}` is not one target `{}` has", target.name));
        }
        _ => {}
    }
    for c in f.p.children(e) {
        legal(f, c, target, seen, bad);
    }
}

/// What the target can run (errors in the user's schedule or `.loops`
/// file, not in texc): every loop kind is one the target has, and on a GPU
/// the launch rules of [`crate::gpu`] hold.
pub fn check_target(f: &LoopFunc, target: &Target) -> Result<(), RuleError> {
    fn kinds(f: &LoopFunc, body: &[Stmt], target: &Target) -> Result<(), RuleError> {
        for s in body {
            match s {
                Stmt::For { var, kind, body, .. } => {
                    if !target.supports_loop(kind.loop_kind()) {
                        return Err(RuleError::at(
                            Site::Loop(*var),
                            format!(
                                "loop `{}` is{}, which target `{}` does not have",
                                f.vars[*var as usize].name,
                                kind.name(),
                                target.name
                            ),
                        ));
                    }
                    kinds(f, body, target)?
                }
                Stmt::Alloc { tensor, .. }
                    if target.gpu.is_none() && (f.shared.contains(tensor) || f.registers.contains(tensor)) =>
                {
                    let scope = if f.shared.contains(tensor) { "shared" } else { "registers" };
                    return Err(RuleError::at(
                        Site::Tensor(*tensor),
                        format!(
                            "`{}` is a {scope} buffer, which only GPU targets have; target `{}` has local ones",
                            f.p.tensor(*tensor).name,
                            target.name
                        ),
                    ));
                }
                Stmt::Barrier if target.gpu.is_none() => {
                    return Err(format!("barriers are for GPU targets; target `{}` is not one", target.name).into());
                }
                Stmt::WarpReduce(w) if target.gpu.is_none() => {
                    return Err(RuleError::at(
                        Site::Tensor(w.tensor),
                        format!("warp reductions are for GPU targets; target `{}` is not one", target.name),
                    ));
                }
                Stmt::Mma { op, .. } if target.gpu.is_none() => {
                    return Err(format!(
                        "`mma {}` is a tensor-core operation of GPU targets; target `{}` is not one",
                        op.name(),
                        target.name
                    )
                    .into());
                }
                Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => kinds(f, body, target)?,
                Stmt::Store { .. } | Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } | Stmt::WarpReduce(_) => {}
            }
        }
        Ok(())
    }
    kinds(f, &f.body, target)?;
    if target.gpu.is_some() {
        crate::gpu::launches(f, target)?;
    }
    Ok(())
}

/// Call `visit` on the root expressions of every statement.
pub fn walk_exprs(body: &[Stmt], visit: &mut dyn FnMut(TExprId)) {
    for s in body {
        match s {
            Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) => {}
            Stmt::Mma { c, a, b, .. } => [c, a, b].iter().flat_map(|t| &t.origin).for_each(|&i| visit(i)),
            Stmt::For { body, .. } | Stmt::Alloc { body, .. } => walk_exprs(body, visit),
            Stmt::If { cond, then } => {
                visit(*cond);
                walk_exprs(then, visit);
            }
            Stmt::Store { indices, value, .. } => {
                indices.iter().for_each(|&i| visit(i));
                visit(*value);
            }
        }
    }
}
