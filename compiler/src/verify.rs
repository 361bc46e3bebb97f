//! TIR verifier: checks the invariants documented in `tir`. Runs after
//! specialization in debug builds, and whenever `TEXC_VERIFY=1`.
//! A failure is a compiler bug, reported as an internal error.

use crate::ops::BinOp;
use crate::tir::*;
use crate::types::ElemType;

/// A broken invariant of a tensor-IR program.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TirError {
    #[error("stage {stage} writes input `{tensor}`")]
    WritesInput { stage: usize, tensor: String },
    #[error("stage {stage}: axes do not match the shape of `{tensor}`")]
    Axes { stage: usize, tensor: String },
    #[error("stage {stage}: value has type {found} but `{tensor}` is {elem}")]
    ValueType { stage: usize, tensor: String, found: String, elem: String },
    #[error("stage {stage} (`{tensor}`), node {node}: {fault}")]
    Expr { stage: usize, tensor: String, node: u32, fault: ExprFault },
    #[error("output `{0}` is never written")]
    Unwritten(String),
}

/// What is wrong with one expression node.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ExprFault {
    #[error("variable {0} out of range")]
    Var(u32),
    #[error("reads `{0}` before it is written")]
    ReadBeforeWrite(String),
    #[error("malformed load of `{0}`")]
    Load(String),
    #[error("operands of `{op}` have types {a} and {b}")]
    Operands { op: &'static str, a: String, b: String },
    #[error("`{0}` is not bool")]
    NotBool(&'static str),
    #[error("operands of `{0}` are not bool")]
    LogicOperands(&'static str),
    #[error("`{op}` on {ty}")]
    Arithmetic { op: String, ty: String },
    #[error("ill-typed select")]
    Select,
    #[error("ill-typed call of `{0}`")]
    Call(String),
    #[error("ill-typed intrinsic `{0}`")]
    Intrinsic(String),
    #[error("malformed reduction")]
    Reduction,
}

pub fn verify(p: &Program) -> Result<(), TirError> {
    let mut written = vec![false; p.tensors.len()];
    for t in p.input_tensors() {
        written[t.0 as usize] = true;
    }
    for (si, st) in p.stages.iter().enumerate() {
        let decl = p.tensor(st.tensor);
        if decl.role == TensorRole::Input {
            return Err(TirError::WritesInput { stage: si, tensor: decl.name.clone() });
        }
        if st.n_axes != decl.shape.len() || st.vars[..st.n_axes].iter().zip(&decl.shape).any(|(v, &d)| v.extent != d) {
            return Err(TirError::Axes { stage: si, tensor: decl.name.clone() });
        }
        if p.ty(st.value) != Ty::Elem(decl.elem) {
            let (found, elem) = (p.ty(st.value).to_string(), decl.elem.to_string());
            return Err(TirError::ValueType { stage: si, tensor: decl.name.clone(), found, elem });
        }
        expr(p, st, st.value, &written).map_err(|(node, fault)| TirError::Expr {
            stage: si,
            tensor: decl.name.clone(),
            node: node.0,
            fault,
        })?;
        written[st.tensor.0 as usize] = true;
    }
    for &o in &p.outputs {
        if !written[o.0 as usize] {
            return Err(TirError::Unwritten(p.tensor(o).name.clone()));
        }
    }
    Ok(())
}

fn expr(p: &Program, st: &Stage, e: TExprId, written: &[bool]) -> Result<(), (TExprId, ExprFault)> {
    let ty = p.ty(e);
    let bool_ty = Ty::Elem(ElemType::Bool);
    let fault = |f: ExprFault| Err((e, f));
    match p.expr(e) {
        TExpr::Var(v) if *v as usize >= st.vars.len() => return fault(ExprFault::Var(*v)),
        TExpr::Load(t, idx) => {
            if !written[t.0 as usize] {
                return fault(ExprFault::ReadBeforeWrite(p.tensor(*t).name.clone()));
            }
            if idx.len() != p.tensor(*t).shape.len() || idx.iter().any(|i| p.ty(*i) != Ty::Index) {
                return fault(ExprFault::Load(p.tensor(*t).name.clone()));
            }
        }
        TExpr::Binary(op, a, b) => {
            if p.ty(*a) != p.ty(*b) {
                let (a, b) = (p.ty(*a).to_string(), p.ty(*b).to_string());
                return fault(ExprFault::Operands { op: op.symbol(), a, b });
            }
            if (op.is_comparison() || op.is_logic()) && ty != bool_ty {
                return fault(ExprFault::NotBool(op.symbol()));
            }
            if op.is_logic() && p.ty(*a) != bool_ty {
                return fault(ExprFault::LogicOperands(op.symbol()));
            }
            let float = matches!(ty, Ty::Elem(e) if e.is_float());
            let int_only = matches!(
                op,
                BinOp::FloorDiv | BinOp::FloorMod | BinOp::TruncDiv | BinOp::TruncRem | BinOp::UDiv | BinOp::URem
            );
            if (int_only && float) || (*op == BinOp::Div && !float) {
                return fault(ExprFault::Arithmetic { op: format!("{op:?}"), ty: ty.to_string() });
            }
        }
        TExpr::Select(c, a, b) if p.ty(*c) != bool_ty || p.ty(*a) != ty || p.ty(*b) != ty => {
            return fault(ExprFault::Select);
        }
        TExpr::Math(f, args) if args.len() != f.arity() || args.iter().any(|a| p.ty(*a) != ty) => {
            return fault(ExprFault::Call(f.name().to_string()));
        }
        TExpr::Intrinsic(i, args) if args.len() != i.arity() || args.iter().any(|a| p.ty(*a) != ty) => {
            return fault(ExprFault::Intrinsic(i.to_string()));
        }
        TExpr::Reduce(_, vars, body)
            if vars.iter().any(|&v| (v as usize) < st.n_axes || v as usize >= st.vars.len()) || p.ty(*body) != ty =>
        {
            return fault(ExprFault::Reduction);
        }
        _ => {}
    }
    for c in p.children(e) {
        expr(p, st, c, written)?;
    }
    Ok(())
}
