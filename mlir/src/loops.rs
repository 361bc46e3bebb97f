//! The loop IR as MLIR: one `func.func` per kernel.
//!
//! - Loops become `scf.for` (serial and unrolled ones; unrolling is left to
//!   MLIR) and `scf.parallel`; guards `scf.if`; temporaries `memref.alloc`
//!   (freed at the end), locals `memref.alloca` inside `memref.alloca_scope`
//!   (so a local in a loop does not grow the stack each iteration), or
//!   `memref.alloc` and `memref.dealloc` there when the CPU backends take
//!   them from the heap (`LoopFunc::heap_locals`).
//! - A vectorized loop of `L` iterations whose statements store contiguously
//!   (the last index moves by one per lane, the others not at all) becomes
//!   straight-line `vector` code on `vector<L x T>`: uniform values stay
//!   scalars and are broadcast where they meet per-lane ones; loads are
//!   `memref.load` (same element in every lane), `vector.load` (contiguous)
//!   or `vector.gather` (anything else, with linearized offsets); guards that
//!   differ between lanes become masks (`vector.maskedload`/`maskedstore`,
//!   masked gathers). Any other vectorized loop runs as a serial `scf.for`.
//! - `select`, `&&` and `||` evaluate only the side they choose: where that
//!   side reads memory, as an `scf.if` with a result (or, under a condition
//!   that differs between lanes, under the narrowed mask); elsewhere as
//!   `arith.select`/`arith.andi`/`arith.ori`.

use crate::emit::B;
use crate::{MlirError, R};
use melior::ir::operation::OperationBuilder;
use melior::ir::{Attribute, Block, BlockLike, Identifier, Module, Region, RegionLike, Type, Value, ValueLike};
use melior::Context;
use std::collections::HashMap;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{ProgramParam, TExpr, TExprId, TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_schedules::analysis::{self, involves};
use texc_schedules::ir::{ForKind, LoopFunc, Stmt};

/// A value in vector code: the same scalar in every lane, or one per lane.
#[derive(Clone, Copy)]
enum Val<'c, 'a> {
    U(Value<'c, 'a>),
    V(Value<'c, 'a>),
}

/// The vectorized loop being emitted: its variable takes `lo..lo + n`.
#[derive(Clone, Copy)]
struct Lanes {
    var: VarId,
    lo: i64,
    n: u32,
}

/// What is in scope where code is being emitted.
#[derive(Clone)]
struct Env<'c, 'a> {
    vars: HashMap<VarId, Value<'c, 'a>>,
    bufs: Vec<Option<Value<'c, 'a>>>,
    scalars: Vec<Value<'c, 'a>>,
    /// Values of expressions already emitted where they dominate.
    memo: HashMap<TExprId, Val<'c, 'a>>,
    vec: Option<Lanes>,
    /// In vector code under guards that differ between lanes: the active lanes.
    mask: Option<Value<'c, 'a>>,
}

/// A side of a lazy `select`.
#[derive(Clone, Copy)]
enum Side {
    Expr(TExprId),
    Bool(bool),
}

struct Gen<'c, 'f> {
    b: B<'c>,
    f: &'f LoopFunc,
    /// Local buffers the CPU backends take from the heap (`LoopFunc::heap_locals`).
    heap: std::collections::BTreeSet<TensorId>,
}

/// The type of a tensor's elements in memory: texc stores a `bool` as a
/// byte (a `vector<L x i1>` in memory would be a packed bit mask).
fn mem_ty(f: &LoopFunc, t: TensorId) -> Ty {
    match f.p.tensor(t).elem {
        ElemType::Bool => Ty::Elem(ElemType::U8),
        e => Ty::Elem(e),
    }
}

fn memref_name(f: &LoopFunc, t: TensorId) -> String {
    let d = f.p.tensor(t);
    let dims: String = d.shape.iter().map(|x| format!("{x}x")).collect();
    format!("memref<{dims}{}>", crate::emit::ty_name(mem_ty(f, t)))
}

/// Types of the function's arguments, with their names for the signature.
fn signature(f: &LoopFunc) -> Vec<String> {
    let mut out: Vec<String> =
        f.p.params
            .iter()
            .map(|param| match param {
                ProgramParam::Tensor(t) => memref_name(f, *t),
                ProgramParam::Scalar(s) => crate::emit::elem_name(f.p.scalars[*s as usize].elem).to_string(),
            })
            .collect();
    out.extend(f.p.outputs.iter().map(|&t| memref_name(f, t)));
    out
}

pub fn build<'c>(cx: &'c Context, m: &Module<'c>, f: &LoopFunc) -> R<()> {
    let g = Gen { b: B::new(cx), f, heap: f.heap_locals() };
    let sig = signature(f);
    let arg_tys: Vec<Type<'c>> = sig.iter().map(|s| g.b.ty(s)).collect();
    let entry = Block::new(&arg_tys.iter().map(|&t| (t, g.b.loc)).collect::<Vec<_>>());
    {
        let mut env = Env {
            vars: HashMap::new(),
            bufs: vec![None; f.p.tensors.len()],
            scalars: Vec::new(),
            memo: HashMap::new(),
            vec: None,
            mask: None,
        };
        if !f.p.scalars.is_empty() {
            env.scalars = vec![g.b.index(&entry, 0); f.p.scalars.len()];
        }
        let mut arg = 0;
        for param in &f.p.params {
            let v: Value = entry.argument(arg).expect("argument").into();
            match param {
                ProgramParam::Tensor(t) => env.bufs[t.0 as usize] = Some(v),
                ProgramParam::Scalar(s) => env.scalars[*s as usize] = v,
            }
            arg += 1;
        }
        for &t in &f.p.outputs {
            env.bufs[t.0 as usize] = Some(entry.argument(arg).expect("argument").into());
            arg += 1;
        }
        let temps = f.live_temps();
        for &t in &temps {
            let buf = g.alloc(&entry, "memref.alloc", t);
            env.bufs[t.0 as usize] = Some(buf);
        }
        g.stmts(&entry, &mut env, &f.body)?;
        for &t in &temps {
            g.b.op(&entry, "memref.dealloc", &[env.bufs[t.0 as usize].expect("allocated")], &[], &[]);
        }
        g.b.op(&entry, "func.return", &[], &[], &[]);
    }
    g.b.finish_module(m, &f.p.name, &format!("({}) -> ()", sig.join(", ")), entry);
    Ok(())
}

impl<'c> Gen<'c, '_> {
    fn alloc<'a>(&self, blk: &'a Block<'c>, op: &str, t: TensorId) -> Value<'c, 'a> {
        let ty = self.b.ty(&memref_name(self.f, t));
        let attrs = [("operandSegmentSizes", self.b.attr("array<i32: 0, 0>")), ("alignment", self.b.attr("64 : i64"))];
        self.b.op1(blk, op, &[], ty, &attrs)
    }

    /// A region of one block whose body `fill` emits; `args` are the block's arguments.
    fn region<'a>(
        &self,
        env: &Env<'c, 'a>,
        args: &[Type<'c>],
        fill: impl for<'b> FnOnce(&Self, &'b Block<'c>, &mut Env<'c, 'b>) -> R<()>,
    ) -> R<Region<'c>>
    where
        'a: 'a,
    {
        let blk = Block::new(&args.iter().map(|&t| (t, self.b.loc)).collect::<Vec<_>>());
        {
            let mut child: Env<'c, '_> = shorten(env);
            fill(self, &blk, &mut child)?;
        }
        let region = Region::new();
        region.append_block(blk);
        Ok(region)
    }

    fn stmts<'a>(&self, blk: &'a Block<'c>, env: &mut Env<'c, 'a>, body: &[Stmt]) -> R<()> {
        for s in body {
            match s {
                Stmt::For { var, lo, extent, kind, body } => {
                    self.for_loop(blk, env, *var, *lo, *extent, *kind, body)?
                }
                Stmt::If { cond, then } => self.guard(blk, env, *cond, then)?,
                Stmt::Alloc { tensor, body } => {
                    let t = *tensor;
                    let heap = self.heap.contains(&t);
                    let region = self.region(env, &[], |g, inner, child| {
                        let buf = g.alloc(inner, if heap { "memref.alloc" } else { "memref.alloca" }, t);
                        child.bufs[t.0 as usize] = Some(buf);
                        g.stmts(inner, child, body)?;
                        if heap {
                            g.b.op(inner, "memref.dealloc", &[buf], &[], &[]);
                        }
                        g.b.op(inner, "memref.alloca_scope.return", &[], &[], &[]);
                        Ok(())
                    })?;
                    let op = OperationBuilder::new("memref.alloca_scope", self.b.loc)
                        .add_regions([region])
                        .build()
                        .expect("memref.alloca_scope");
                    blk.append_operation(op);
                }
                Stmt::Store { tensor, indices, value } => self.store(blk, env, *tensor, indices, *value)?,
                Stmt::Prefetch { tensor, offset } => self.prefetch(blk, env, *tensor, *offset)?,
                Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::WarpReduce(_) => {
                    return Err(MlirError::Unsupported(
                        "a GPU barrier, asynchronous copy, warp reduction or tensor-core operation: their MLIR export \
                         (the gpu and nvgpu dialects) is not built yet"
                            .into(),
                    ))
                }
                Stmt::TileDot(_) => {
                    return Err(MlirError::Unsupported(
                        "an AMX tile product: its MLIR export (the amx dialect) is not built yet".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn for_loop<'a>(
        &self,
        blk: &'a Block<'c>,
        env: &mut Env<'c, 'a>,
        var: VarId,
        lo: i64,
        extent: i64,
        kind: ForKind,
        body: &[Stmt],
    ) -> R<()> {
        if kind == ForKind::Vectorized && env.vec.is_none() && self.vector_ok(body, var) {
            let mut child = env.clone();
            child.vec = Some(Lanes { var, lo, n: extent as u32 });
            child.mask = None;
            return self.stmts(blk, &mut child, body);
        }
        let (l, h, one) = (self.b.index(blk, lo), self.b.index(blk, lo + extent), self.b.index(blk, 1));
        let index = self.b.ty("index");
        // Loops bound to GPU blocks or threads have independent iterations (the
        // launch rules of `texc_schedules::gpu`): `scf.parallel`, from which
        // MLIR's own GPU mapping starts.
        let parallel = (kind == ForKind::Parallel || kind.is_gpu()) && env.vec.is_none();
        let region = self.region(env, &[index], |g, inner, child| {
            child.vars.insert(var, inner.argument(0).expect("induction variable").into());
            g.stmts(inner, child, body)?;
            let end = if parallel { "scf.reduce" } else { "scf.yield" };
            g.b.op(inner, end, &[], &[], &[]);
            Ok(())
        })?;
        let op = if parallel {
            OperationBuilder::new("scf.parallel", self.b.loc).add_operands(&[l, h, one]).add_attributes(&[(
                Identifier::new(self.b.cx, "operandSegmentSizes"),
                self.b.attr("array<i32: 1, 1, 1, 0>"),
            )])
        } else {
            OperationBuilder::new("scf.for", self.b.loc).add_operands(&[l, h, one])
        };
        blk.append_operation(op.add_regions([region]).build().expect("loop"));
        Ok(())
    }

    /// Whether a vectorized loop's body can be vector code: only stores
    /// contiguous in their last index, under guards.
    fn vector_ok(&self, body: &[Stmt], var: VarId) -> bool {
        body.iter().all(|s| match s {
            Stmt::Store { indices, .. } => self.contiguous(indices, var),
            Stmt::If { then, .. } => self.vector_ok(then, var),
            Stmt::For { .. }
            | Stmt::Alloc { .. }
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => false,
        })
    }

    /// The last index moves by one per lane, the others not at all.
    fn contiguous(&self, idx: &[TExprId], var: VarId) -> bool {
        let p = &self.f.p;
        match idx.split_last() {
            Some((last, rest)) => {
                analysis::coefficient(p, *last, var) == Some(1)
                    && rest.iter().all(|&i| analysis::coefficient(p, i, var) == Some(0))
            }
            None => false,
        }
    }

    fn guard<'a>(&self, blk: &'a Block<'c>, env: &mut Env<'c, 'a>, cond: TExprId, then: &[Stmt]) -> R<()> {
        if let Some(l) = env.vec {
            if !analysis::lane_uniform(self.f, cond, l.var) {
                let c = self.expr(blk, env, cond)?;
                let c = self.as_vec(blk, c, Ty::Elem(ElemType::Bool), l.n);
                let mut child = env.clone();
                child.mask = Some(self.and_mask(blk, env.mask, c));
                return self.stmts(blk, &mut child, then);
            }
        }
        let c = match self.expr(blk, env, cond)? {
            Val::U(c) => c,
            Val::V(_) => unreachable!("a lane-uniform condition is a scalar"),
        };
        let region = self.region(env, &[], |g, inner, child| {
            g.stmts(inner, child, then)?;
            g.b.op(inner, "scf.yield", &[], &[], &[]);
            Ok(())
        })?;
        let op = OperationBuilder::new("scf.if", self.b.loc)
            .add_operands(&[c])
            .add_regions([region, Region::new()])
            .build()
            .expect("scf.if");
        blk.append_operation(op);
        Ok(())
    }

    fn and_mask<'a>(&self, blk: &'a Block<'c>, mask: Option<Value<'c, 'a>>, c: Value<'c, 'a>) -> Value<'c, 'a> {
        match mask {
            Some(m) => self.b.op1(blk, "arith.andi", &[m, c], c.r#type(), &[]),
            None => c,
        }
    }

    fn as_vec<'a>(&self, blk: &'a Block<'c>, v: Val<'c, 'a>, t: Ty, n: u32) -> Value<'c, 'a> {
        match v {
            Val::U(s) => self.b.splat(blk, s, t, n),
            Val::V(v) => v,
        }
    }

    /// Index values of `idx` in lane 0 of the vectorized loop (for accesses
    /// whose other lanes follow from it).
    fn lane0<'a>(&self, blk: &'a Block<'c>, env: &Env<'c, 'a>, idx: &[TExprId]) -> R<Vec<Value<'c, 'a>>> {
        let l = env.vec.expect("vector code");
        let mut scalar = env.clone();
        scalar.vec = None;
        scalar.mask = None;
        scalar.memo.clear();
        scalar.vars.insert(l.var, self.b.index(blk, l.lo));
        idx.iter().map(|&i| self.scalar(blk, &mut scalar, i)).collect()
    }

    fn scalar<'a>(&self, blk: &'a Block<'c>, env: &mut Env<'c, 'a>, e: TExprId) -> R<Value<'c, 'a>> {
        match self.expr(blk, env, e)? {
            Val::U(v) => Ok(v),
            Val::V(_) => unreachable!("scalar code has no vectors"),
        }
    }

    fn buffer<'a>(&self, env: &Env<'c, 'a>, t: TensorId) -> R<Value<'c, 'a>> {
        env.bufs[t.0 as usize].ok_or_else(|| {
            MlirError::Unsupported(format!("`{}` is accessed where it has no buffer", self.f.p.tensor(t).name))
        })
    }

    /// `memref.prefetch` (read, locality 2, data) of the element at a flat
    /// offset: on a one-dimensional view of the buffer (`memref.collapse_shape`).
    fn prefetch<'a>(&self, blk: &'a Block<'c>, env: &mut Env<'c, 'a>, t: TensorId, offset: TExprId) -> R<()> {
        if env.vec.is_some() {
            return Err(MlirError::Unsupported("a prefetch inside a vectorized loop".into()));
        }
        let buf = self.buffer(env, t)?;
        let rank = self.f.p.tensor(t).shape.len();
        let at = self.scalar(blk, env, offset)?;
        if rank == 0 {
            self.b.op(blk, "memref.prefetch", &[buf], &[], &self.prefetch_hints());
            return Ok(());
        }
        let flat = if rank == 1 {
            buf
        } else {
            let dims: Vec<String> = (0..rank).map(|d| d.to_string()).collect();
            let reassociation = self.b.attr(&format!("[[{}]]", dims.join(", ")));
            let ty = format!("memref<{}x{}>", self.f.p.tensor(t).len(), crate::emit::ty_name(mem_ty(self.f, t)));
            self.b.op1(blk, "memref.collapse_shape", &[buf], self.b.ty(&ty), &[("reassociation", reassociation)])
        };
        self.b.op(blk, "memref.prefetch", &[flat, at], &[], &self.prefetch_hints());
        Ok(())
    }

    /// Read, locality 2 (the L2), data: what LLVM's CPU code takes.
    fn prefetch_hints(&self) -> [(&'static str, Attribute<'c>); 3] {
        [
            ("isWrite", self.b.attr("false")),
            ("localityHint", self.b.attr("2 : i32")),
            ("isDataCache", self.b.attr("true")),
        ]
    }

    fn store<'a>(
        &self,
        blk: &'a Block<'c>,
        env: &mut Env<'c, 'a>,
        t: TensorId,
        idx: &[TExprId],
        value: TExprId,
    ) -> R<()> {
        let buf = self.buffer(env, t)?;
        let v = self.expr(blk, env, value)?;
        let (vt, mt) = (self.f.p.ty(value), mem_ty(self.f, t));
        let Some(l) = env.vec else {
            let v = self.b.cast(blk, unwrap_scalar(v), vt, mt, None);
            let mut operands = vec![v, buf];
            for &i in idx {
                operands.push(self.scalar(blk, env, i)?);
            }
            self.b.op(blk, "memref.store", &operands, &[], &[]);
            return Ok(());
        };
        let v = self.as_vec(blk, v, vt, l.n);
        let v = self.b.cast(blk, v, vt, mt, Some(l.n));
        let at = self.lane0(blk, env, idx)?;
        let mut operands = vec![];
        match env.mask {
            None => {
                operands.extend([v, buf]);
                operands.extend(at);
                self.b.op(blk, "vector.store", &operands, &[], &[]);
            }
            Some(m) => {
                operands.push(buf);
                operands.extend(at);
                operands.extend([m, v]);
                self.b.op(blk, "vector.maskedstore", &operands, &[], &[]);
            }
        }
        Ok(())
    }

    fn load<'a>(
        &self,
        blk: &'a Block<'c>,
        env: &mut Env<'c, 'a>,
        e: TExprId,
        t: TensorId,
        idx: &[TExprId],
    ) -> R<Val<'c, 'a>> {
        let buf = self.buffer(env, t)?;
        let ty = self.f.p.ty(e);
        let Some(l) = env.vec else {
            let mut operands = vec![buf];
            for &i in idx {
                operands.push(self.scalar(blk, env, i)?);
            }
            return Ok(Val::U(self.b.op1(blk, "memref.load", &operands, self.b.vty(ty, None), &[])));
        };
        let p = &self.f.p;
        let uniform = idx.iter().all(|&i| analysis::coefficient(p, i, l.var) == Some(0));
        if uniform && (env.mask.is_none() || idx.is_empty()) {
            let mut operands = vec![buf];
            operands.extend(self.lane0(blk, env, idx)?);
            return Ok(Val::U(self.b.op1(blk, "memref.load", &operands, self.b.vty(ty, None), &[])));
        }
        let vty = self.b.vty(ty, Some(l.n));
        if self.contiguous(idx, l.var) {
            let mut operands = vec![buf];
            operands.extend(self.lane0(blk, env, idx)?);
            return Ok(Val::V(match env.mask {
                None => self.b.op1(blk, "vector.load", &operands, vty, &[]),
                Some(m) => {
                    let pass = self.b.constant_like(blk, ty, 0.0, Some(l.n));
                    operands.extend([m, pass]);
                    self.b.op1(blk, "vector.maskedload", &operands, vty, &[])
                }
            }));
        }
        // A gather: each lane's flat offset from element zero.
        let shape = p.tensor(t).shape.clone();
        let mut off: Option<Value<'c, 'a>> = None;
        let mut stride = 1i64;
        for d in (0..idx.len()).rev() {
            let i = self.expr(blk, env, idx[d])?;
            let i = self.as_vec(blk, i, Ty::Index, l.n);
            let s = self.b.constant_like(blk, Ty::Index, stride as f64, Some(l.n));
            let term = if stride == 1 { i } else { self.b.op1(blk, "arith.muli", &[i, s], i.r#type(), &[]) };
            off = Some(match off {
                None => term,
                Some(o) => self.b.op1(blk, "arith.addi", &[o, term], o.r#type(), &[]),
            });
            stride = stride.saturating_mul(shape[d]);
        }
        let off = off.expect("a gather has indices");
        let mask = match env.mask {
            Some(m) => m,
            None => self.b.op1(
                blk,
                "arith.constant",
                &[],
                self.b.vty(Ty::Elem(ElemType::Bool), Some(l.n)),
                &[("value", self.b.attr(&format!("dense<true> : vector<{}xi1>", l.n)))],
            ),
        };
        let pass = self.b.constant_like(blk, ty, 0.0, Some(l.n));
        let mut operands = vec![buf];
        let zero = self.b.index(blk, 0);
        operands.extend(std::iter::repeat_n(zero, idx.len()));
        operands.extend([off, mask, pass]);
        Ok(Val::V(self.b.op1(blk, "vector.gather", &operands, vty, &[])))
    }

    fn expr<'a>(&self, blk: &'a Block<'c>, env: &mut Env<'c, 'a>, e: TExprId) -> R<Val<'c, 'a>> {
        if let Some(v) = env.memo.get(&e) {
            return Ok(*v);
        }
        let v = self.expr_uncached(blk, env, e)?;
        env.memo.insert(e, v);
        Ok(v)
    }

    fn expr_uncached<'a>(&self, blk: &'a Block<'c>, env: &mut Env<'c, 'a>, e: TExprId) -> R<Val<'c, 'a>> {
        let p = &self.f.p;
        let ty = p.ty(e);
        Ok(match p.expr(e).clone() {
            TExpr::Int(k) => Val::U(self.b.int(blk, ty, k)),
            TExpr::Float(x) => Val::U(self.b.constant(blk, ty, x)),
            TExpr::Var(v) => match env.vec {
                Some(l) if l.var == v => {
                    let lanes: Vec<String> = (0..l.n as i64).map(|k| (l.lo + k).to_string()).collect();
                    let attr = self.b.attr(&format!("dense<[{}]> : vector<{}xindex>", lanes.join(", "), l.n));
                    Val::V(self.b.op1(blk, "arith.constant", &[], self.b.vty(Ty::Index, Some(l.n)), &[("value", attr)]))
                }
                _ => Val::U(*env.vars.get(&v).ok_or_else(|| {
                    MlirError::Unsupported(format!(
                        "loop variable `{}` used outside its loop",
                        self.f.vars[v as usize].name
                    ))
                })?),
            },
            TExpr::Scalar(s) => Val::U(env.scalars[s as usize]),
            TExpr::Load(t, idx) => self.load(blk, env, e, t, &idx)?,
            TExpr::Unary(op, a) => {
                let (vals, lanes) = self.operands(blk, env, &[a])?;
                self.wrap(self.b.unary(blk, op, ty, vals[0], lanes), lanes)
            }
            TExpr::Binary(op @ (BinOp::And | BinOp::Or), a, b) if analysis::reads_memory(p, b) => {
                let c = self.expr(blk, env, a)?;
                let (then, other) = if op == BinOp::And {
                    (Side::Expr(b), Side::Bool(false))
                } else {
                    (Side::Bool(true), Side::Expr(b))
                };
                self.lazy_select(blk, env, c, then, other, ty)?
            }
            TExpr::Binary(op, a, b) => {
                let operand = p.ty(a);
                let (vals, lanes) = self.operands(blk, env, &[a, b])?;
                self.wrap(self.b.binary(blk, op, operand, ty, vals[0], vals[1], lanes)?, lanes)
            }
            TExpr::Select(c, a, b) if analysis::reads_memory(p, a) || analysis::reads_memory(p, b) => {
                let c = self.expr(blk, env, c)?;
                self.lazy_select(blk, env, c, Side::Expr(a), Side::Expr(b), ty)?
            }
            TExpr::Select(c, a, b) => {
                let (vals, lanes) = self.operands(blk, env, &[c, a, b])?;
                self.wrap(self.b.select(blk, vals[0], vals[1], vals[2]), lanes)
            }
            TExpr::Math(f, args) => {
                let (vals, lanes) = self.operands(blk, env, &args)?;
                self.wrap(self.b.math(blk, f, ty, &vals, lanes), lanes)
            }
            TExpr::Intrinsic(i, args) => {
                let (vals, lanes) = self.operands(blk, env, &args)?;
                self.wrap(self.b.intrinsic(blk, i, ty, &vals, lanes), lanes)
            }
            TExpr::Cast(a) => {
                let from = p.ty(a);
                let (vals, lanes) = self.operands(blk, env, &[a])?;
                self.wrap(self.b.cast(blk, vals[0], from, ty, lanes), lanes)
            }
            TExpr::Reduce(..) => {
                return Err(MlirError::Unsupported("a reduction inside loop IR (lowering removes them)".into()))
            }
        })
    }

    fn wrap<'a>(&self, v: Value<'c, 'a>, lanes: Option<u32>) -> Val<'c, 'a> {
        if lanes.is_some() {
            Val::V(v)
        } else {
            Val::U(v)
        }
    }

    /// The operands' values, all scalars or all vectors (uniform ones broadcast).
    fn operands<'a>(
        &self,
        blk: &'a Block<'c>,
        env: &mut Env<'c, 'a>,
        es: &[TExprId],
    ) -> R<(Vec<Value<'c, 'a>>, Option<u32>)> {
        let vals: Vec<Val<'c, 'a>> = es.iter().map(|&a| self.expr(blk, env, a)).collect::<R<_>>()?;
        if vals.iter().all(|v| matches!(v, Val::U(_))) {
            return Ok((vals.iter().map(|&v| unwrap_scalar(v)).collect(), None));
        }
        let n = env.vec.expect("vector values only in vector code").n;
        let out = vals.iter().zip(es).map(|(&v, &a)| self.as_vec(blk, v, self.f.p.ty(a), n)).collect();
        Ok((out, Some(n)))
    }

    /// `c ? then : other`, evaluating only the chosen side.
    fn lazy_select<'a>(
        &self,
        blk: &'a Block<'c>,
        env: &mut Env<'c, 'a>,
        c: Val<'c, 'a>,
        then: Side,
        other: Side,
        ty: Ty,
    ) -> R<Val<'c, 'a>> {
        match c {
            Val::V(c) => {
                // Lanes differ: each side under the mask of the lanes that choose it.
                let n = env.vec.expect("vector code").n;
                let all = self.b.constant_like(blk, Ty::Elem(ElemType::Bool), 1.0, Some(n));
                let not_c = self.b.op1(blk, "arith.xori", &[c, all], c.r#type(), &[]);
                let side = |s: Side, m: Value<'c, 'a>| -> R<Value<'c, 'a>> {
                    let mut child = env.clone();
                    child.mask = Some(self.and_mask(blk, env.mask, m));
                    let v = self.side(blk, &mut child, s, ty)?;
                    Ok(self.as_vec(blk, v, ty, n))
                };
                let a = side(then, c)?;
                let b = side(other, not_c)?;
                Ok(Val::V(self.b.select(blk, c, a, b)))
            }
            Val::U(c) => {
                // Which shape the result has is known only once both sides are built.
                let lanes = env.vec.map(|l| l.n);
                // Under a mask even a uniform load is a (masked) gather.
                let vector_result = lanes.is_some()
                    && (env.mask.is_some()
                        || [then, other].iter().any(|s| matches!(s, Side::Expr(e) if !self.uniform_in(env, *e))));
                let rty = self.b.vty(ty, if vector_result { lanes } else { None });
                let branch = |s: Side| {
                    self.region(env, &[], |g, inner, child| {
                        let v = g.side(inner, child, s, ty)?;
                        let v = if vector_result {
                            g.as_vec(inner, v, ty, lanes.expect("vector code"))
                        } else {
                            unwrap_scalar(v)
                        };
                        g.b.op(inner, "scf.yield", &[v], &[], &[]);
                        Ok(())
                    })
                };
                let (ra, rb) = (branch(then)?, branch(other)?);
                let op = OperationBuilder::new("scf.if", self.b.loc)
                    .add_operands(&[c])
                    .add_results(&[rty])
                    .add_regions([ra, rb])
                    .build()
                    .expect("scf.if");
                let op = blk.append_operation(op);
                let v: Value = op.result(0).expect("result").into();
                Ok(if vector_result { Val::V(v) } else { Val::U(v) })
            }
        }
    }

    /// Whether `e` is the same in every lane of the vector code at hand.
    fn uniform_in(&self, env: &Env<'c, '_>, e: TExprId) -> bool {
        match env.vec {
            None => true,
            Some(l) => !involves(&self.f.p, e, l.var),
        }
    }

    fn side<'a>(&self, blk: &'a Block<'c>, env: &mut Env<'c, 'a>, s: Side, ty: Ty) -> R<Val<'c, 'a>> {
        match s {
            Side::Expr(e) => self.expr(blk, env, e),
            Side::Bool(b) => Ok(Val::U(self.b.int(blk, ty, b as i64))),
        }
    }
}

fn unwrap_scalar<'c, 'a>(v: Val<'c, 'a>) -> Value<'c, 'a> {
    match v {
        Val::U(v) => v,
        Val::V(v) => v,
    }
}

/// An environment for a nested block: the same values, borrowed for less long.
fn shorten<'c, 'a: 'b, 'b>(env: &Env<'c, 'a>) -> Env<'c, 'b> {
    env.clone()
}
