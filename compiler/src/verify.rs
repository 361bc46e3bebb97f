//! TIR verifier: checks the invariants documented in `tir`. Runs after
//! specialization in debug builds, and whenever `TEXC_VERIFY=1`.
//! A failure is a compiler bug, reported as an internal error.

use crate::ops::BinOp;
use crate::tir::*;
use crate::types::ElemType;

pub fn verify(p: &Program) -> Result<(), String> {
    let mut written = vec![false; p.tensors.len()];
    for t in p.input_tensors() {
        written[t.0 as usize] = true;
    }
    for (si, st) in p.stages.iter().enumerate() {
        let decl = p.tensor(st.tensor);
        if decl.role == TensorRole::Input {
            return Err(format!("stage {si} writes input `{}`", decl.name));
        }
        if st.n_axes != decl.shape.len() || st.vars[..st.n_axes].iter().zip(&decl.shape).any(|(v, &d)| v.extent != d) {
            return Err(format!("stage {si}: axes do not match the shape of `{}`", decl.name));
        }
        if p.ty(st.value) != Ty::Elem(decl.elem) {
            return Err(format!("stage {si}: value has type {} but `{}` is {}", p.ty(st.value), decl.name, decl.elem));
        }
        expr(p, st, st.value, &written).map_err(|m| format!("stage {si} (`{}`): {m}", decl.name))?;
        written[st.tensor.0 as usize] = true;
    }
    for &o in &p.outputs {
        if !written[o.0 as usize] {
            return Err(format!("output `{}` is never written", p.tensor(o).name));
        }
    }
    Ok(())
}

fn expr(p: &Program, st: &Stage, e: TExprId, written: &[bool]) -> Result<(), String> {
    let ty = p.ty(e);
    let bool_ty = Ty::Elem(ElemType::Bool);
    match p.expr(e) {
        TExpr::Var(v) if *v as usize >= st.vars.len() => return Err(format!("variable {v} out of range")),
        TExpr::Load(t, idx) => {
            if !written[t.0 as usize] {
                return Err(format!("reads `{}` before it is written", p.tensor(*t).name));
            }
            if idx.len() != p.tensor(*t).shape.len() || idx.iter().any(|i| p.ty(*i) != Ty::Index) {
                return Err(format!("malformed load of `{}`", p.tensor(*t).name));
            }
        }
        TExpr::Binary(op, a, b) => {
            if p.ty(*a) != p.ty(*b) {
                return Err(format!("operands of `{}` have types {} and {}", op.symbol(), p.ty(*a), p.ty(*b)));
            }
            if (op.is_comparison() || op.is_logic()) && ty != bool_ty {
                return Err(format!("`{}` is not bool", op.symbol()));
            }
            if op.is_logic() && p.ty(*a) != bool_ty {
                return Err(format!("operands of `{}` are not bool", op.symbol()));
            }
            let float = matches!(ty, Ty::Elem(e) if e.is_float());
            let int_only = matches!(
                op,
                BinOp::FloorDiv | BinOp::FloorMod | BinOp::TruncDiv | BinOp::TruncRem | BinOp::UDiv | BinOp::URem
            );
            if (int_only && float) || (*op == BinOp::Div && !float) {
                return Err(format!("`{:?}` on {ty}", op));
            }
        }
        TExpr::Select(c, a, b) if p.ty(*c) != bool_ty || p.ty(*a) != ty || p.ty(*b) != ty => {
            return Err("ill-typed select".into());
        }
        TExpr::Math(f, args) if args.len() != f.arity() || args.iter().any(|a| p.ty(*a) != ty) => {
            return Err(format!("ill-typed call of `{}`", f.name()));
        }
        TExpr::Intrinsic(i, args) if args.len() != i.arity() || args.iter().any(|a| p.ty(*a) != ty) => {
            return Err(format!("ill-typed intrinsic `{i}`"));
        }
        TExpr::Reduce(_, vars, body)
            if vars.iter().any(|&v| (v as usize) < st.n_axes || v as usize >= st.vars.len()) || p.ty(*body) != ty =>
        {
            return Err("malformed reduction".into());
        }
        _ => {}
    }
    for c in p.children(e) {
        expr(p, st, c, written)?;
    }
    Ok(())
}
