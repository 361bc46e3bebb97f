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

/// Tails of the splits among `leaves`: those that partitioning handles (the
/// split's outer loop encloses its inner loop) and those that keep a guard.
fn split_tails(ss: &StageSchedule, leaves: &[usize], relevant: &dyn Fn(usize) -> bool) -> (Vec<Tail>, Vec<Tail>) {
    let pos = |iv: usize| leaves.iter().position(|&l| l == iv);
    tails(ss, relevant).into_iter().partition(|t| matches!((pos(t.outer), pos(t.inner)), (Some(o), Some(i)) if o < i))
}

type Bounds = HashMap<usize, (i64, i64)>;
type Terminal<'a> = dyn Fn(&mut LoopFunc, &Bounds, &mut HashMap<usize, VarId>) -> Vec<Stmt> + 'a;

/// The innermost statement of a nest: `make`'s store, guarded by `guarded` tails.
fn store_terminal<'a>(
    ss: &'a StageSchedule,
    guarded: &'a [Tail],
    make: &'a dyn Fn(&mut LoopFunc, &mut Nest) -> Stmt,
) -> Box<Terminal<'a>> {
    Box::new(move |f, _bounds, vars| {
        let mut nest = Nest { ss, loop_var: vars.clone(), memo: HashMap::new() };
        let store = make(f, &mut nest);
        let guard = nest.guards(f, guarded);
        vec![match guard {
            Some(cond) => Stmt::If { cond, then: vec![store] },
            None => store,
        }]
    })
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
    let (partitioned, guarded) = split_tails(ss, &leaves, &relevant);
    let terminal = store_terminal(ss, &guarded, &make);
    let ctx = NestCtx { ss, leaves: &leaves, partitioned: &partitioned, terminal: &*terminal };
    let body = ctx.level(f, 0, &HashMap::new(), &mut HashMap::new());
    f.body.extend(body);
}

struct NestCtx<'a> {
    ss: &'a StageSchedule,
    leaves: &'a [usize],
    partitioned: &'a [Tail],
    terminal: &'a Terminal<'a>,
}

impl NestCtx<'_> {
    /// Loops from leaf `depth` inward. `bounds` fixes (lo, extent) of leaves
    /// in a partition; `vars` maps leaves to their loop variables.
    fn level(&self, f: &mut LoopFunc, depth: usize, bounds: &Bounds, vars: &mut HashMap<usize, VarId>) -> Vec<Stmt> {
        if depth == self.leaves.len() {
            return (self.terminal)(f, bounds, vars);
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
        bounds: &Bounds,
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
        TExpr::Reduce(op, _, body) if ss.cache_write.is_some() => {
            let (at, name) = ss.cache_write.clone().expect("checked");
            lower_cached_reduction(f, st, ss, op, body, at, &name);
        }
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
                    let value = combine(f, op, acc, term, ty, st.span);
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

/// A reduction with `cache_write S at S.a -> L`: inside loop `a`, the block of
/// `S` that the inner loops compute accumulates in a local buffer `L`
/// (private to the iteration, so registers after LLVM's SROA), which is
/// initialised first and written back to `S` at the end.
fn lower_cached_reduction(
    f: &mut LoopFunc,
    st: &Stage,
    ss: &StageSchedule,
    op: ReduceOp,
    body: TExprId,
    at: usize,
    name: &str,
) {
    let elem = f.p.tensor(st.tensor).elem;
    let p = ss.leaves.iter().position(|&l| l == at).expect("`at` is a leaf (checked by the schedule)");
    let outer: Vec<usize> = ss.leaves[..=p].to_vec();
    let inner: Vec<usize> = ss.leaves[p + 1..].to_vec();
    let s_in: Vec<usize> = inner.iter().copied().filter(|&l| is_spatial(ss, l)).collect();
    let shape: Vec<i64> = s_in.iter().map(|&l| ss.ivs[l].extent).collect();
    f.p.tensors.push(TensorDecl { name: name.to_string(), elem, shape, role: TensorRole::Temp, span: st.span });
    let local = TensorId(f.p.tensors.len() as u32 - 1);
    let (partitioned, guarded) = split_tails(ss, &ss.leaves, &|_| true);
    let guarded_spatial: Vec<Tail> = guarded.iter().copied().filter(|t| is_spatial(ss, t.parent)).collect();
    let ty = Ty::Elem(elem);
    let local_idx = |f: &mut LoopFunc, nest: &Nest| -> Vec<TExprId> {
        s_in.iter().map(|l| f.p.alloc(TExpr::Var(nest.loop_var[l]), Ty::Index, st.span)).collect()
    };
    let init = |f: &mut LoopFunc, nest: &mut Nest| {
        let indices = local_idx(f, nest);
        let value = f.p.alloc(identity(op, elem), ty, st.span);
        Stmt::Store { tensor: local, indices, value }
    };
    let update = |f: &mut LoopFunc, nest: &mut Nest| {
        let indices = local_idx(f, nest);
        let map: HashMap<VarId, TExprId> = (0..st.vars.len()).map(|v| (v as VarId, nest.value(f, v))).collect();
        let term = subst(&mut f.p, body, &map, &HashMap::new());
        let acc = f.p.alloc(TExpr::Load(local, indices.clone()), ty, st.span);
        let value = combine(f, op, acc, term, ty, st.span);
        Stmt::Store { tensor: local, indices, value }
    };
    let write_back = |f: &mut LoopFunc, nest: &mut Nest| {
        let indices: Vec<TExprId> = (0..st.n_axes).map(|a| nest.value(f, a)).collect();
        let from = local_idx(f, nest);
        let value = f.p.alloc(TExpr::Load(local, from), ty, st.span);
        Stmt::Store { tensor: st.tensor, indices, value }
    };
    let init_t = store_terminal(ss, &[], &init);
    let update_t = store_terminal(ss, &guarded, &update);
    let back_t = store_terminal(ss, &guarded_spatial, &write_back);
    let block = |f: &mut LoopFunc, bounds: &Bounds, vars: &mut HashMap<usize, VarId>| -> Vec<Stmt> {
        let mut body = Vec::new();
        for (leaves, t) in [(&s_in, &init_t), (&inner, &update_t), (&s_in, &back_t)] {
            let ctx = NestCtx { ss, leaves, partitioned: &partitioned, terminal: &**t };
            body.extend(ctx.level(f, 0, bounds, vars));
        }
        vec![Stmt::Alloc { tensor: local, body }]
    };
    let ctx = NestCtx { ss, leaves: &outer, partitioned: &partitioned, terminal: &block };
    let out = ctx.level(f, 0, &HashMap::new(), &mut HashMap::new());
    f.body.extend(out);
}

fn combine(f: &mut LoopFunc, op: ReduceOp, acc: TExprId, term: TExprId, ty: Ty, span: texc_grammar::Span) -> TExprId {
    match op {
        ReduceOp::Sum => f.p.alloc(TExpr::Binary(BinOp::Add, acc, term), ty, span),
        ReduceOp::Prod => f.p.alloc(TExpr::Binary(BinOp::Mul, acc, term), ty, span),
        ReduceOp::Max => f.p.alloc(TExpr::Call(Builtin::Max, vec![acc, term]), ty, span),
        ReduceOp::Min => f.p.alloc(TExpr::Call(Builtin::Min, vec![acc, term]), ty, span),
    }
}
