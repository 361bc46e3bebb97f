//! Lowering a scheduled program to the loop IR.
//!
//! Each stage becomes loop nests over its leaf iteration variables. The
//! value of every original variable is rebuilt from the leaves (`outer *
//! factor + inner` for splits, `/` and `%` for fusions); splits that do not
//! divide their extent add a guard around the body, so tails are computed
//! exactly once. A reduction stage becomes an init nest (over its spatial
//! leaves) storing the identity and an update nest folding each term in.

use crate::ir::{LoopFunc, Stmt};
use crate::normalize::subst;
use crate::schedule::{Rel, Schedules, StageSchedule};
use std::collections::HashMap;
use texc_compiler::resolve::{Builtin, ReduceOp};
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;
use texc_grammar::ast::BinOp;

pub fn lower(mut p: Program, s: &Schedules) -> LoopFunc {
    let stages = std::mem::take(&mut p.stages);
    let mut f = LoopFunc { p, vars: Vec::new(), body: Vec::new() };
    for (st, ss) in stages.iter().zip(&s.stages) {
        lower_stage(&mut f, st, ss);
    }
    f.p.stages = stages;
    f
}

struct Nest<'a> {
    ss: &'a StageSchedule,
    /// Loop variable of each leaf in this nest.
    loop_var: HashMap<usize, VarId>,
    memo: HashMap<usize, TExprId>,
}

impl Nest<'_> {
    /// The value of iteration variable `iv` in terms of this nest's loops.
    fn value(&mut self, f: &mut LoopFunc, iv: usize) -> TExprId {
        if let Some(&e) = self.memo.get(&iv) {
            return e;
        }
        let span = Default::default();
        let e = if let Some(&v) = self.loop_var.get(&iv) {
            f.p.alloc(TExpr::Var(v), Ty::Index, span)
        } else if let Some((o, i, factor)) = self.split_children(iv) {
            let (o, i) = (self.value(f, o), self.value(f, i));
            let k = f.p.alloc(TExpr::Int(factor), Ty::Index, span);
            let m = f.p.alloc(TExpr::Binary(BinOp::Mul, o, k), Ty::Index, span);
            f.p.alloc(TExpr::Binary(BinOp::Add, m, i), Ty::Index, span)
        } else if let Some((fused, inner_ext, is_outer)) = self.fused_parent(iv) {
            let fv = self.value(f, fused);
            let k = f.p.alloc(TExpr::Int(inner_ext), Ty::Index, span);
            let op = if is_outer { BinOp::Div } else { BinOp::Rem };
            f.p.alloc(TExpr::Binary(op, fv, k), Ty::Index, span)
        } else {
            // Not part of this nest (a reduction variable in an init nest).
            f.p.alloc(TExpr::Int(0), Ty::Index, span)
        };
        self.memo.insert(iv, e);
        e
    }

    fn split_children(&self, iv: usize) -> Option<(usize, usize, i64)> {
        let o =
            self.ss.ivs.iter().position(|v| matches!(v.rel, Rel::Split { parent, outer: true, .. } if parent == iv))?;
        let i = self
            .ss
            .ivs
            .iter()
            .position(|v| matches!(v.rel, Rel::Split { parent, outer: false, .. } if parent == iv))?;
        let Rel::Split { factor, .. } = self.ss.ivs[o].rel else { unreachable!() };
        Some((o, i, factor))
    }

    fn fused_parent(&self, iv: usize) -> Option<(usize, i64, bool)> {
        self.ss.ivs.iter().enumerate().find_map(|(fi, v)| match v.rel {
            Rel::Fuse { outer, inner } if outer == iv => Some((fi, self.ss.ivs[inner].extent, true)),
            Rel::Fuse { outer: _, inner } if inner == iv => Some((fi, self.ss.ivs[inner].extent, false)),
            _ => None,
        })
    }

    /// `parent < extent` for every split with a tail among `relevant` variables.
    fn guards(&mut self, f: &mut LoopFunc, relevant: impl Fn(usize) -> bool) -> Option<TExprId> {
        let span = Default::default();
        let mut cond: Option<TExprId> = None;
        for (iv, v) in self.ss.ivs.iter().enumerate() {
            if !relevant(iv) {
                continue;
            }
            if let Some((o, _, factor)) = self.split_children(iv) {
                if self.ss.ivs[o].extent * factor != v.extent {
                    let val = self.value(f, iv);
                    let k = f.p.alloc(TExpr::Int(v.extent), Ty::Index, span);
                    let c = f.p.alloc(TExpr::Binary(BinOp::Lt, val, k), Ty::Elem(ElemType::Bool), span);
                    cond = Some(match cond {
                        Some(prev) => f.p.alloc(TExpr::Binary(BinOp::And, prev, c), Ty::Elem(ElemType::Bool), span),
                        None => c,
                    });
                }
            }
        }
        cond
    }
}

fn identity(op: ReduceOp, elem: ElemType) -> TExpr {
    let float = elem.is_float();
    match (op, float) {
        (ReduceOp::Sum, true) => TExpr::Float(0.0),
        (ReduceOp::Sum, false) => TExpr::Int(0),
        (ReduceOp::Prod, true) => TExpr::Float(1.0),
        (ReduceOp::Prod, false) => TExpr::Int(1),
        (ReduceOp::Max, true) => TExpr::Float(f64::NEG_INFINITY),
        (ReduceOp::Min, true) => TExpr::Float(f64::INFINITY),
        (ReduceOp::Max, false) => TExpr::Int(int_bounds(elem).0),
        (ReduceOp::Min, false) => TExpr::Int(int_bounds(elem).1),
    }
}

fn int_bounds(e: ElemType) -> (i64, i64) {
    match e {
        ElemType::I8 => (i8::MIN as i64, i8::MAX as i64),
        ElemType::U8 => (0, u8::MAX as i64),
        ElemType::I32 => (i32::MIN as i64, i32::MAX as i64),
        ElemType::Bool => (0, 1),
        _ => (i64::MIN, i64::MAX),
    }
}

/// Whether `iv` derives only from spatial roots.
fn is_spatial(ss: &StageSchedule, iv: usize) -> bool {
    !ss.ivs[iv].reduce
}

fn emit_nest(
    f: &mut LoopFunc,
    ss: &StageSchedule,
    leaves: Vec<usize>,
    make: impl FnOnce(&mut LoopFunc, &mut Nest) -> Stmt,
    spatial_only: bool,
) {
    let mut nest = Nest { ss, loop_var: HashMap::new(), memo: HashMap::new() };
    for &l in &leaves {
        f.vars.push(VarDecl { name: ss.ivs[l].name.clone(), extent: ss.ivs[l].extent });
        nest.loop_var.insert(l, f.vars.len() as VarId - 1);
    }
    let store = make(f, &mut nest);
    let guard = nest.guards(f, |iv| !spatial_only || is_spatial(ss, iv));
    let mut body = vec![match guard {
        Some(cond) => Stmt::If { cond, then: vec![store] },
        None => store,
    }];
    for &l in leaves.iter().rev() {
        body = vec![Stmt::For { var: nest.loop_var[&l], extent: ss.ivs[l].extent, kind: ss.ivs[l].kind, body }];
    }
    f.body.extend(body);
}

fn lower_stage(f: &mut LoopFunc, st: &Stage, ss: &StageSchedule) {
    let elem = f.p.tensor(st.tensor).elem;
    let axes_of =
        |f: &mut LoopFunc, nest: &mut Nest| -> Vec<TExprId> { (0..st.n_axes).map(|a| nest.value(f, a)).collect() };
    let root_map = |f: &mut LoopFunc, nest: &mut Nest| -> HashMap<VarId, TExprId> {
        (0..st.vars.len()).map(|v| (v as VarId, nest.value(f, v))).collect()
    };
    match f.p.expr(st.value).clone() {
        TExpr::Reduce(op, _, body) => {
            let spatial: Vec<usize> = ss.leaves.iter().copied().filter(|&l| is_spatial(ss, l)).collect();
            emit_nest(
                f,
                ss,
                spatial,
                |f, nest| {
                    let indices = axes_of(f, nest);
                    let value = f.p.alloc(identity(op, elem), Ty::Elem(elem), st.span);
                    Stmt::Store { tensor: st.tensor, indices, value }
                },
                true,
            );
            emit_nest(
                f,
                ss,
                ss.leaves.clone(),
                |f, nest| {
                    let indices = axes_of(f, nest);
                    let map = root_map(f, nest);
                    let term = subst(&mut f.p, body, &map, &HashMap::new());
                    let ty = Ty::Elem(elem);
                    let acc = f.p.alloc(TExpr::Load(st.tensor, indices.clone()), ty, st.span);
                    let value = match op {
                        ReduceOp::Sum => f.p.alloc(TExpr::Binary(BinOp::Add, acc, term), ty, st.span),
                        ReduceOp::Prod => f.p.alloc(TExpr::Binary(BinOp::Mul, acc, term), ty, st.span),
                        ReduceOp::Max => f.p.alloc(TExpr::Call(Builtin::Max, vec![acc, term]), ty, st.span),
                        ReduceOp::Min => f.p.alloc(TExpr::Call(Builtin::Min, vec![acc, term]), ty, st.span),
                    };
                    Stmt::Store { tensor: st.tensor, indices, value }
                },
                false,
            );
        }
        _ => emit_nest(
            f,
            ss,
            ss.leaves.clone(),
            |f, nest| {
                let indices = axes_of(f, nest);
                let map = root_map(f, nest);
                let value = subst(&mut f.p, st.value, &map, &HashMap::new());
                Stmt::Store { tensor: st.tensor, indices, value }
            },
            false,
        ),
    }
}
