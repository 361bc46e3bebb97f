//! Loop IR verifier: every variable is bound by an enclosing loop (once),
//! accesses have one index per dimension, no reductions remain.

use crate::ir::{LoopFunc, Stmt};
use texc_compiler::tir::{TExpr, TExprId, Ty};

pub fn verify(f: &LoopFunc) -> Result<(), String> {
    let mut bound = vec![false; f.vars.len()];
    let mut seen = vec![false; f.vars.len()];
    stmts(f, &f.body, &mut bound, &mut seen)
}

fn stmts(f: &LoopFunc, body: &[Stmt], bound: &mut Vec<bool>, seen: &mut Vec<bool>) -> Result<(), String> {
    for s in body {
        match s {
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
