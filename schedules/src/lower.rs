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

    /// `parent < extent` for each tail that is not handled by partitioning.
    fn guards(&mut self, f: &mut LoopFunc, tails: &[Tail]) -> Option<TExprId> {
        let span = Default::default();
        let mut cond: Option<TExprId> = None;
        for t in tails {
            let val = self.value(f, t.parent);
            let k = f.p.alloc(TExpr::Int(self.ss.ivs[t.parent].extent), Ty::Index, span);
            let c = f.p.alloc(TExpr::Binary(BinOp::Lt, val, k), Ty::Elem(ElemType::Bool), span);
            cond = Some(match cond {
                Some(prev) => f.p.alloc(TExpr::Binary(BinOp::And, prev, c), Ty::Elem(ElemType::Bool), span),
                None => c,
            });
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

/// A split whose factor does not divide its extent: its outer leaf, inner
/// leaf, number of full tiles and the size of the last one.
#[derive(Clone, Copy)]
struct Tail {
    parent: usize,
    outer: usize,
    inner: usize,
    factor: i64,
    full: i64,
    rest: i64,
}

fn tails(ss: &StageSchedule, relevant: &dyn Fn(usize) -> bool) -> Vec<Tail> {
    let mut out = Vec::new();
    for (parent, v) in ss.ivs.iter().enumerate() {
        if !relevant(parent) {
            continue;
        }
        let outer =
            ss.ivs.iter().position(|x| matches!(x.rel, Rel::Split { parent: p, outer: true, .. } if p == parent));
        let inner =
            ss.ivs.iter().position(|x| matches!(x.rel, Rel::Split { parent: p, outer: false, .. } if p == parent));
        if let (Some(o), Some(i)) = (outer, inner) {
            let f = ss.ivs[i].extent;
            if ss.ivs[o].extent * f != v.extent {
                out.push(Tail { parent, outer: o, inner: i, factor: f, full: v.extent / f, rest: v.extent % f });
            }
        }
    }
    out
}

/// Emit one loop nest over `leaves`. Tails are handled by loop
/// partitioning where the split's outer loop encloses its inner loop: the
/// full tiles run without a guard, then the last tile runs with a shorter
/// inner loop. Other tails keep a guard around the body.
fn emit_nest(
    f: &mut LoopFunc,
    ss: &StageSchedule,
    leaves: Vec<usize>,
    make: impl Fn(&mut LoopFunc, &mut Nest) -> Stmt,
    spatial_only: bool,
) {
    let relevant = |iv: usize| !spatial_only || is_spatial(ss, iv);
    let all = tails(ss, &relevant);
    let pos = |iv: usize| leaves.iter().position(|&l| l == iv);
    let (partitioned, guarded): (Vec<Tail>, Vec<Tail>) =
        all.into_iter().partition(|t| matches!((pos(t.outer), pos(t.inner)), (Some(o), Some(i)) if o < i));
    let ctx = NestCtx { ss, leaves: &leaves, partitioned: &partitioned, guarded: &guarded, make: &make };
    let body = ctx.level(f, 0, &HashMap::new(), &mut HashMap::new());
    f.body.extend(body);
}

struct NestCtx<'a> {
    ss: &'a StageSchedule,
    leaves: &'a [usize],
    partitioned: &'a [Tail],
    guarded: &'a [Tail],
    make: &'a dyn Fn(&mut LoopFunc, &mut Nest) -> Stmt,
}

impl NestCtx<'_> {
    /// Loops from leaf `depth` inward. `bounds` fixes (lo, extent) of leaves
    /// in a partition; `vars` maps leaves to their loop variables.
    fn level(
        &self,
        f: &mut LoopFunc,
        depth: usize,
        bounds: &HashMap<usize, (i64, i64)>,
        vars: &mut HashMap<usize, VarId>,
    ) -> Vec<Stmt> {
        if depth == self.leaves.len() {
            let mut nest = Nest { ss: self.ss, loop_var: vars.clone(), memo: HashMap::new() };
            let store = (self.make)(f, &mut nest);
            let guard = nest.guards(f, self.guarded);
            return vec![match guard {
                Some(cond) => Stmt::If { cond, then: vec![store] },
                None => store,
            }];
        }
        let leaf = self.leaves[depth];
        let iv = &self.ss.ivs[leaf];
        if let Some(t) = self.partitioned.iter().find(|t| t.outer == leaf) {
            // Full tiles, then the last one with a shorter inner loop.
            let mut out = Vec::new();
            for (lo, extent, inner) in [(0, t.full, t.factor), (t.full, 1, t.rest)] {
                if extent == 0 || inner == 0 {
                    continue;
                }
                let mut b = bounds.clone();
                b.insert(t.inner, (0, inner));
                out.extend(self.emit_loop(f, depth, leaf, lo, extent, &b, vars));
            }
            return out;
        }
        let (lo, extent) = bounds.get(&leaf).copied().unwrap_or((0, iv.extent));
        self.emit_loop(f, depth, leaf, lo, extent, bounds, vars)
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_loop(
        &self,
        f: &mut LoopFunc,
        depth: usize,
        leaf: usize,
        lo: i64,
        extent: i64,
        bounds: &HashMap<usize, (i64, i64)>,
        vars: &mut HashMap<usize, VarId>,
    ) -> Vec<Stmt> {
        let iv = &self.ss.ivs[leaf];
        f.vars.push(VarDecl { name: iv.name.clone(), extent: lo + extent });
        let var = f.vars.len() as VarId - 1;
        vars.insert(leaf, var);
        let body = self.level(f, depth + 1, bounds, vars);
        vars.remove(&leaf);
        vec![Stmt::For { var, lo, extent, kind: iv.kind, body }]
    }
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
