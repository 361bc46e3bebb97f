//! Deterministic printer for the tensor IR (`texc emit --stage tir`).

use crate::ops::{BinOp, UnOp};
use crate::tir::*;
use std::fmt::Write;

pub fn print_program(p: &Program) -> String {
    let mut out = String::new();
    let b: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let _ = writeln!(out, "kernel {} [{}]", p.name, b.join(", "));
    for param in &p.params {
        match param {
            ProgramParam::Tensor(t) => {
                let _ = writeln!(out, "  input {}", decl(p.tensor(*t)));
            }
            ProgramParam::Scalar(s) => {
                let s = &p.scalars[*s as usize];
                let d = s.default.map(|d| format!(" = {d:?}")).unwrap_or_default();
                let _ = writeln!(out, "  scalar {}: {}{d}", s.name, s.elem);
            }
        }
    }
    for t in &p.outputs {
        let _ = writeln!(out, "  output {}", decl(p.tensor(*t)));
    }
    for t in p.tensors.iter().filter(|t| t.role == TensorRole::Temp) {
        let _ = writeln!(out, "  temp {}", decl(t));
    }
    for s in &p.stages {
        let axes: Vec<String> = s.vars[..s.n_axes].iter().map(|v| format!("{} < {}", v.name, v.extent)).collect();
        let t = p.tensor(s.tensor);
        let _ = writeln!(out, "  stage {}[{}] = {}", t.name, axes.join(", "), expr(p, s, s.value));
    }
    out
}

fn decl(t: &TensorDecl) -> String {
    let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    format!("{}: {}[{}]", t.name, t.elem, dims.join(", "))
}

fn prec(op: BinOp) -> u8 {
    match op {
        BinOp::Or => 1,
        BinOp::And => 2,
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne => 3,
        BinOp::Add | BinOp::Sub => 4,
        BinOp::Mul | BinOp::Div | BinOp::FloorDiv | BinOp::FloorMod => 5,
        // Printed as calls: never need parentheses.
        BinOp::TruncDiv | BinOp::TruncRem | BinOp::UDiv | BinOp::URem => 7,
    }
}

/// Print an expression of stage `s` in infix form (parenthesised where needed).
pub fn expr(p: &Program, s: &Stage, e: TExprId) -> String {
    let sub = |x: TExprId, min: u8| {
        let text = expr(p, s, x);
        match p.expr(x) {
            TExpr::Binary(op, _, _) if prec(*op) < min => format!("({text})"),
            _ => text,
        }
    };
    match p.expr(e) {
        TExpr::Int(v) => match p.ty(e) {
            Ty::Index => v.to_string(),
            Ty::Elem(crate::types::ElemType::Bool) => (*v != 0).to_string(),
            Ty::Elem(t) => format!("{v}{t}"),
        },
        TExpr::Float(v) => format!("{v:?}{}", p.ty(e)),
        TExpr::Var(v) => s.vars[*v as usize].name.clone(),
        TExpr::Scalar(i) => p.scalars[*i as usize].name.clone(),
        TExpr::Load(t, idx) => {
            let i: Vec<String> = idx.iter().map(|x| expr(p, s, *x)).collect();
            if i.is_empty() {
                p.tensor(*t).name.clone()
            } else {
                format!("{}[{}]", p.tensor(*t).name, i.join(", "))
            }
        }
        TExpr::Unary(UnOp::Neg, a) => format!("-{}", sub(*a, 6)),
        TExpr::Unary(UnOp::Not, a) => format!("!{}", sub(*a, 6)),
        TExpr::Binary(op, a, b) if op.is_machine() => {
            format!("{}({}, {})", op.symbol(), expr(p, s, *a), expr(p, s, *b))
        }
        TExpr::Binary(op, a, b) => {
            let q = prec(*op);
            format!("{} {} {}", sub(*a, q), op.symbol(), sub(*b, q + 1))
        }
        TExpr::Select(c, a, b) => format!("select({}, {}, {})", expr(p, s, *c), expr(p, s, *a), expr(p, s, *b)),
        TExpr::Math(f, args) => call(p, s, f.name(), args),
        TExpr::Intrinsic(i, args) => call(p, s, i.name(), args),
        TExpr::Cast(a) => format!("{}({})", p.ty(e), expr(p, s, *a)),
        TExpr::Reduce(op, vars, body) => {
            let v: Vec<String> =
                vars.iter().map(|v| format!("{} < {}", s.vars[*v as usize].name, s.vars[*v as usize].extent)).collect();
            format!("{}[{}]({})", op.name(), v.join(", "), expr(p, s, *body))
        }
    }
}

fn call(p: &Program, s: &Stage, name: &str, args: &[TExprId]) -> String {
    let a: Vec<String> = args.iter().map(|x| expr(p, s, *x)).collect();
    format!("{name}({})", a.join(", "))
}
