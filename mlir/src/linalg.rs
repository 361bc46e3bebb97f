//! The tensor IR as `linalg.generic` on tensors, for MLIR compilers that
//! schedule it themselves.
//!
//! One `linalg.generic` per stage over the stage's axes (identity map to its
//! tensor); each reduction in the stage's expression becomes a
//! `linalg.generic` of its own with reduction iterators, over the stage's
//! axes and the reduction's variables, into a tensor filled with the
//! reduction's identity, which the stage then reads elementwise.
//!
//! A load becomes an input with an affine indexing map when its indices are
//! affine in the loop dimensions (sums of multiples of variables, floor
//! division and modulo by positive constants) and it is evaluated
//! unconditionally. A load that a `select`, `&&` or `||` may skip (padding:
//! `select(h < H, X[h], 0)`) or that is not affine becomes `tensor.extract`
//! inside the body, under an `scf.if` where it may be skipped, so no
//! out-of-bounds element is ever read. Expressions are legalized first
//! (texc's integer division spelled out; no FMA contraction).

use crate::emit::B;
use crate::{MlirError, R};
use melior::ir::operation::OperationBuilder;
use melior::ir::{Block, BlockLike, Identifier, Module, Region, RegionLike, Type, Value};
use melior::Context;
use std::collections::HashMap;
use texc_compiler::ops::{BinOp, ReduceOp};
use texc_compiler::semantics::{reduce_identity, V};
use texc_compiler::tir::{Program, ProgramParam, Stage, TExpr, TExprId, TensorId, Ty, VarId};

fn tensor_name(p: &Program, t: TensorId) -> String {
    let d = p.tensor(t);
    let dims: String = d.shape.iter().map(|x| format!("{x}x")).collect();
    format!("tensor<{dims}{}>", crate::emit::elem_name(d.elem))
}

fn dims_name(n: usize) -> String {
    (0..n).map(|d| format!("d{d}")).collect::<Vec<_>>().join(", ")
}

/// `e` as an affine expression of loop dimensions (`dim` maps variables).
fn affine(p: &Program, e: TExprId, dim: &HashMap<VarId, usize>) -> Option<String> {
    let konst = |x: TExprId| match p.expr(x) {
        TExpr::Int(k) => Some(*k),
        _ => None,
    };
    Some(match p.expr(e) {
        TExpr::Int(k) => k.to_string(),
        TExpr::Var(v) => format!("d{}", dim.get(v)?),
        TExpr::Binary(op @ (BinOp::Add | BinOp::Sub), a, b) => {
            format!("({} {} {})", affine(p, *a, dim)?, op.symbol(), affine(p, *b, dim)?)
        }
        TExpr::Binary(BinOp::Mul, a, b) => match (konst(*a), konst(*b)) {
            (Some(k), _) => format!("({} * {k})", affine(p, *b, dim)?),
            (_, Some(k)) => format!("({} * {k})", affine(p, *a, dim)?),
            _ => return None,
        },
        TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::Div | BinOp::FloorMod), a, b) if p.ty(e) == Ty::Index => {
            let k = konst(*b).filter(|&k| k > 0)?;
            let word = if *op == BinOp::FloorMod { "mod" } else { "floordiv" };
            format!("({} {word} {k})", affine(p, *a, dim)?)
        }
        _ => return None,
    })
}

/// A load read through the generic's operands: its tensor and indexing map.
struct Input {
    load: TExprId,
    tensor: TensorId,
    map: Vec<String>,
}

struct Gen<'c, 'p> {
    b: B<'c>,
    p: &'p Program,
}

pub fn build<'c>(cx: &'c Context, m: &Module<'c>, p: &Program) -> R<()> {
    let mut q = p.clone();
    let interp = texc_compiler::target::lookup("interp").expect("the interpreter target");
    let mut legal = texc_compiler::legalize::Legalizer::new(interp);
    for i in 0..q.stages.len() {
        let v = q.stages[i].value;
        q.stages[i].value = legal.expr(&mut q, v);
    }
    let g = Gen { b: B::new(cx), p: &q };
    let mut sig = Vec::new();
    for param in &q.params {
        sig.push(match param {
            ProgramParam::Tensor(t) => tensor_name(&q, *t),
            ProgramParam::Scalar(s) => crate::emit::elem_name(q.scalars[*s as usize].elem).to_string(),
        });
    }
    let results: Vec<String> = q.outputs.iter().map(|&t| tensor_name(&q, t)).collect();
    let arg_tys: Vec<Type<'c>> = sig.iter().map(|s| g.b.ty(s)).collect();
    let entry = Block::new(&arg_tys.iter().map(|&t| (t, g.b.loc)).collect::<Vec<_>>());
    {
        let mut tensors: Vec<Option<Value>> = vec![None; q.tensors.len()];
        let mut scalars: Vec<Option<Value>> = vec![None; q.scalars.len()];
        for (i, param) in q.params.iter().enumerate() {
            let v: Value = entry.argument(i).expect("argument").into();
            match param {
                ProgramParam::Tensor(t) => tensors[t.0 as usize] = Some(v),
                ProgramParam::Scalar(s) => scalars[*s as usize] = Some(v),
            }
        }
        let scalars: Vec<Value> = scalars.into_iter().map(|s| s.expect("every scalar is a parameter")).collect();
        for st in &q.stages {
            let v = g.stage(&entry, st, &tensors, &scalars)?;
            tensors[st.tensor.0 as usize] = Some(v);
        }
        let outs: Vec<Value> = q
            .outputs
            .iter()
            .map(|&t| {
                tensors[t.0 as usize]
                    .ok_or_else(|| MlirError::Unsupported(format!("output `{}` is never defined", q.tensor(t).name)))
            })
            .collect::<R<_>>()?;
        g.b.op(&entry, "func.return", &outs, &[], &[]);
    }
    let ty = format!("({}) -> ({})", sig.join(", "), results.join(", "));
    g.b.finish_module(m, &q.name, &ty, entry);
    Ok(())
}

impl<'c> Gen<'c, '_> {
    fn stage<'a>(
        &self,
        blk: &'a Block<'c>,
        st: &Stage,
        tensors: &[Option<Value<'c, 'a>>],
        scalars: &[Value<'c, 'a>],
    ) -> R<Value<'c, 'a>> {
        let d = self.p.tensor(st.tensor);
        let extents: Vec<i64> = st.vars[..st.n_axes].iter().map(|v| v.extent).collect();
        if extents != d.shape {
            return Err(MlirError::Unsupported(format!(
                "stage of `{}` iterates {extents:?}, not its shape {:?}",
                d.name, d.shape
            )));
        }
        let axes: HashMap<VarId, usize> = (0..st.n_axes).map(|a| (a as VarId, a)).collect();
        // Each reduction first, into a tensor over the stage's axes.
        let mut reduced: HashMap<TExprId, Value<'c, 'a>> = HashMap::new();
        for r in self.reductions(st.value) {
            let v = self.reduction(blk, st, r, tensors, scalars, &reduced)?;
            reduced.insert(r, v);
        }
        // A stage that is one reduction of its tensor's type is that reduction's generic.
        if let Some(v) = reduced.get(&st.value) {
            if self.p.ty(st.value) == Ty::Elem(d.elem) {
                return Ok(*v);
            }
        }
        let out_ty = self.b.ty(&tensor_name(self.p, st.tensor));
        let init = self.b.op1(blk, "tensor.empty", &[], out_ty, &[]);
        let iters = vec!["parallel"; st.n_axes];
        self.generic(blk, st, &axes, &iters, st.value, init, None, tensors, scalars, &reduced)
    }

    /// Reductions in `e`, innermost first.
    fn reductions(&self, e: TExprId) -> Vec<TExprId> {
        let mut out = Vec::new();
        for c in self.p.children(e) {
            out.extend(self.reductions(c));
        }
        if matches!(self.p.expr(e), TExpr::Reduce(..)) && !out.contains(&e) {
            out.push(e);
        }
        out
    }

    fn reduction<'a>(
        &self,
        blk: &'a Block<'c>,
        st: &Stage,
        r: TExprId,
        tensors: &[Option<Value<'c, 'a>>],
        scalars: &[Value<'c, 'a>],
        reduced: &HashMap<TExprId, Value<'c, 'a>>,
    ) -> R<Value<'c, 'a>> {
        let TExpr::Reduce(op, vars, body) = self.p.expr(r).clone() else { unreachable!("a reduction") };
        if !self.reductions(body).is_empty() {
            return Err(MlirError::Unsupported("a reduction inside a reduction's body".into()));
        }
        let ty = self.p.ty(r);
        let shape: String = st.vars[..st.n_axes].iter().map(|v| format!("{}x", v.extent)).collect();
        let rty = self.b.ty(&format!("tensor<{shape}{}>", crate::emit::ty_name(ty)));
        let mut dim: HashMap<VarId, usize> = (0..st.n_axes).map(|a| (a as VarId, a)).collect();
        for (k, &v) in vars.iter().enumerate() {
            dim.insert(v, st.n_axes + k);
        }
        let init = self.b.op1(blk, "tensor.empty", &[], rty, &[]);
        // Filled with the identity by a generic of its own (linalg.fill's region
        // is built only by its C++ builder).
        let identity = match reduce_identity(op, ty) {
            V::F(x) => x,
            V::I(k) => k as f64,
            V::B(b) => b as u8 as f64,
        };
        let fill = self.fill(blk, st.n_axes, ty, identity, init);
        let mut iters = vec!["parallel"; st.n_axes];
        iters.extend(std::iter::repeat_n("reduction", vars.len()));
        self.generic(blk, st, &dim, &iters, body, fill, Some(op), tensors, scalars, reduced)
    }

    fn fill<'a>(&self, blk: &'a Block<'c>, n: usize, ty: Ty, v: f64, init: Value<'c, 'a>) -> Value<'c, 'a> {
        let map = format!("affine_map<({d}) -> ({d})>", d = dims_name(n));
        let body = Block::new(&[(self.b.vty(ty, None), self.b.loc)]);
        {
            let c = if crate::emit::class(ty) == crate::emit::Class::Float {
                self.b.constant(&body, ty, v)
            } else {
                self.b.int(&body, ty, v as i64)
            };
            self.b.op(&body, "linalg.yield", &[c], &[], &[]);
        }
        let region = Region::new();
        region.append_block(body);
        self.generic_op(blk, &[], init, &[map], &vec!["parallel"; n], region)
    }

    fn generic_op<'a>(
        &self,
        blk: &'a Block<'c>,
        ins: &[Value<'c, 'a>],
        out: Value<'c, 'a>,
        maps: &[String],
        iters: &[&str],
        region: Region<'c>,
    ) -> Value<'c, 'a> {
        use melior::ir::ValueLike;
        let iters: Vec<String> = iters.iter().map(|i| format!("#linalg.iterator_type<{i}>")).collect();
        let mut operands = ins.to_vec();
        operands.push(out);
        let attrs = [
            (Identifier::new(self.b.cx, "indexing_maps"), self.b.attr(&format!("[{}]", maps.join(", ")))),
            (Identifier::new(self.b.cx, "iterator_types"), self.b.attr(&format!("[{}]", iters.join(", ")))),
            (Identifier::new(self.b.cx, "operandSegmentSizes"), self.b.attr(&format!("array<i32: {}, 1>", ins.len()))),
        ];
        let op = OperationBuilder::new("linalg.generic", self.b.loc)
            .add_operands(&operands)
            .add_results(&[out.r#type()])
            .add_attributes(&attrs)
            .add_regions([region])
            .build()
            .expect("linalg.generic");
        blk.append_operation(op).result(0).expect("result").into()
    }

    /// A `linalg.generic` over dimensions `dim` computing `value` into
    /// `out` (folding into it with `combine` for a reduction).
    #[allow(clippy::too_many_arguments)]
    fn generic<'a>(
        &self,
        blk: &'a Block<'c>,
        st: &Stage,
        dim: &HashMap<VarId, usize>,
        iters: &[&str],
        value: TExprId,
        out: Value<'c, 'a>,
        combine: Option<ReduceOp>,
        tensors: &[Option<Value<'c, 'a>>],
        scalars: &[Value<'c, 'a>],
        reduced: &HashMap<TExprId, Value<'c, 'a>>,
    ) -> R<Value<'c, 'a>> {
        let n = iters.len();
        let d = dims_name(n);
        let axes = dims_name(st.n_axes);
        // Operands: unconditional affine loads, then the reductions read here.
        let mut inputs: Vec<Input> = Vec::new();
        self.affine_loads(value, dim, &mut inputs);
        let direct: Vec<TExprId> = self.direct_reductions(value);
        let mut ins = Vec::new();
        let mut maps = Vec::new();
        let mut arg_tys = Vec::new();
        for i in &inputs {
            ins.push(tensors[i.tensor.0 as usize].ok_or_else(|| self.undefined(i.tensor))?);
            maps.push(format!("affine_map<({d}) -> ({})>", i.map.join(", ")));
            arg_tys.push(self.b.vty(self.p.ty(i.load), None));
        }
        for r in &direct {
            ins.push(reduced[r]);
            maps.push(format!("affine_map<({d}) -> ({axes})>"));
            arg_tys.push(self.b.vty(self.p.ty(*r), None));
        }
        // A reduction's accumulator has the reduction's type (its body's).
        let acc_ty = match combine {
            Some(_) => self.p.ty(value),
            None => Ty::Elem(self.p.tensor(st.tensor).elem),
        };
        // linalg infers each loop's extent from an operand that it indexes
        // alone; a reduction variable seen only in sums (`X[2·g + c]`) gets
        // an operand of its extent that the body ignores (like the window
        // operand of linalg's pooling operations).
        let shape_only: Vec<usize> =
            (st.n_axes..n).filter(|&k| !inputs.iter().any(|i| i.map.contains(&format!("d{k}")))).collect();
        for &k in &shape_only {
            let extent = match dim.iter().find(|(_, &dk)| dk == k) {
                Some((v, _)) => st.vars[*v as usize].extent,
                None => unreachable!("every dimension is a variable"),
            };
            ins.push(self.b.op1(blk, "tensor.empty", &[], self.b.ty(&format!("tensor<{extent}xi8>")), &[]));
            maps.push(format!("affine_map<({d}) -> (d{k})>"));
            arg_tys.push(self.b.ty("i8"));
        }
        maps.push(format!("affine_map<({d}) -> ({axes})>"));
        arg_tys.push(self.b.vty(acc_ty, None));
        let body = Block::new(&arg_tys.iter().map(|&t| (t, self.b.loc)).collect::<Vec<_>>());
        {
            let mut env = Body { memo: HashMap::new(), index: vec![None; n], top: &body };
            for (k, i) in inputs.iter().enumerate() {
                env.memo.insert(i.load, body.argument(k).expect("argument").into());
            }
            for (k, r) in direct.iter().enumerate() {
                env.memo.insert(*r, body.argument(inputs.len() + k).expect("argument").into());
            }
            let bcx = BodyCx { dim, tensors, scalars };
            let mut v = self.expr(&body, &mut env, &bcx, value)?;
            if let Some(op) = combine {
                let acc: Value = body.argument(arg_tys.len() - 1).expect("accumulator").into();
                v = self.combine(&body, op, acc_ty, acc, v)?;
            } else if self.p.ty(value) != acc_ty {
                v = self.b.cast(&body, v, self.p.ty(value), acc_ty, None);
            }
            self.b.op(&body, "linalg.yield", &[v], &[], &[]);
        }
        let region = Region::new();
        region.append_block(body);
        Ok(self.generic_op(blk, &ins, out, &maps, iters, region))
    }

    fn undefined(&self, t: TensorId) -> MlirError {
        MlirError::Unsupported(format!("`{}` is read before it is defined", self.p.tensor(t).name))
    }

    fn combine<'a>(
        &self,
        blk: &'a Block<'c>,
        op: ReduceOp,
        ty: Ty,
        acc: Value<'c, 'a>,
        x: Value<'c, 'a>,
    ) -> R<Value<'c, 'a>> {
        use texc_compiler::ops::MathFn;
        Ok(match op {
            ReduceOp::Sum => self.b.binary(blk, BinOp::Add, ty, ty, acc, x, None)?,
            ReduceOp::Prod => self.b.binary(blk, BinOp::Mul, ty, ty, acc, x, None)?,
            ReduceOp::Max => self.b.math(blk, MathFn::Max, ty, &[acc, x], None),
            ReduceOp::Min => self.b.math(blk, MathFn::Min, ty, &[acc, x], None),
        })
    }

    /// Reductions read directly by `e` (not inside another reduction).
    fn direct_reductions(&self, e: TExprId) -> Vec<TExprId> {
        let mut out = Vec::new();
        let mut stack = vec![e];
        while let Some(x) = stack.pop() {
            if matches!(self.p.expr(x), TExpr::Reduce(..)) {
                if !out.contains(&x) {
                    out.push(x);
                }
                continue;
            }
            stack.extend(self.p.children(x));
        }
        out.sort();
        out
    }

    /// Loads evaluated whatever the data (outside `select` sides and the
    /// right of `&&`/`||`) whose indices are affine: inputs of the generic.
    fn affine_loads(&self, e: TExprId, dim: &HashMap<VarId, usize>, out: &mut Vec<Input>) {
        match self.p.expr(e) {
            TExpr::Load(t, idx) => {
                let map: Option<Vec<String>> = idx.iter().map(|&i| affine(self.p, i, dim)).collect();
                if let Some(map) = map {
                    if !out.iter().any(|i| i.load == e) {
                        out.push(Input { load: e, tensor: *t, map });
                    }
                }
            }
            TExpr::Select(c, ..) => self.affine_loads(*c, dim, out),
            TExpr::Binary(BinOp::And | BinOp::Or, a, _) => self.affine_loads(*a, dim, out),
            // A reduction nested here is computed by its own generic.
            TExpr::Reduce(..) => {}
            _ => {
                for c in self.p.children(e) {
                    self.affine_loads(c, dim, out);
                }
            }
        }
    }
}

/// Values in a generic's body.
struct Body<'c, 'a> {
    memo: HashMap<TExprId, Value<'c, 'a>>,
    /// `linalg.index` of each dimension, once asked for.
    index: Vec<Option<Value<'c, 'a>>>,
    /// The generic's body block: `linalg.index` must be emitted there, not in an `scf.if`.
    top: &'a Block<'c>,
}

struct BodyCx<'x, 'c, 'a> {
    dim: &'x HashMap<VarId, usize>,
    tensors: &'x [Option<Value<'c, 'a>>],
    scalars: &'x [Value<'c, 'a>],
}

impl<'c> Gen<'c, '_> {
    fn expr<'a>(
        &self,
        blk: &'a Block<'c>,
        env: &mut Body<'c, 'a>,
        cx: &BodyCx<'_, 'c, 'a>,
        e: TExprId,
    ) -> R<Value<'c, 'a>> {
        if let Some(v) = env.memo.get(&e) {
            return Ok(*v);
        }
        let p = self.p;
        let ty = p.ty(e);
        let v = match p.expr(e).clone() {
            TExpr::Int(k) => self.b.int(blk, ty, k),
            TExpr::Float(x) => self.b.constant(blk, ty, x),
            TExpr::Var(v) => {
                let d = *cx.dim.get(&v).ok_or_else(|| MlirError::Unsupported("a variable outside its loop".into()))?;
                match env.index[d] {
                    Some(i) => i,
                    None => {
                        let i = self.b.op1(
                            env.top,
                            "linalg.index",
                            &[],
                            self.b.ty("index"),
                            &[("dim", self.b.attr(&format!("{d} : i64")))],
                        );
                        env.index[d] = Some(i);
                        i
                    }
                }
            }
            TExpr::Scalar(s) => cx.scalars[s as usize],
            TExpr::Load(t, idx) => {
                let buf = cx.tensors[t.0 as usize].ok_or_else(|| self.undefined(t))?;
                let mut operands = vec![buf];
                for i in idx {
                    operands.push(self.expr(blk, env, cx, i)?);
                }
                self.b.op1(blk, "tensor.extract", &operands, self.b.vty(ty, None), &[])
            }
            TExpr::Unary(op, a) => {
                let a = self.expr(blk, env, cx, a)?;
                self.b.unary(blk, op, ty, a, None)
            }
            TExpr::Binary(op @ (BinOp::And | BinOp::Or), a, b) if texc_schedules::analysis::reads_memory(p, b) => {
                let c = self.expr(blk, env, cx, a)?;
                let (then, other) = if op == BinOp::And { (Ok(b), Err(false)) } else { (Err(true), Ok(b)) };
                self.lazy(blk, env, cx, c, then, other, ty)?
            }
            TExpr::Binary(op, a, b) => {
                let operand = p.ty(a);
                let (a, b) = (self.expr(blk, env, cx, a)?, self.expr(blk, env, cx, b)?);
                self.b.binary(blk, op, operand, ty, a, b, None)?
            }
            TExpr::Select(c, a, b)
                if texc_schedules::analysis::reads_memory(p, a) || texc_schedules::analysis::reads_memory(p, b) =>
            {
                let c = self.expr(blk, env, cx, c)?;
                self.lazy(blk, env, cx, c, Ok(a), Ok(b), ty)?
            }
            TExpr::Select(c, a, b) => {
                let (c, a, b) = (self.expr(blk, env, cx, c)?, self.expr(blk, env, cx, a)?, self.expr(blk, env, cx, b)?);
                self.b.select(blk, c, a, b)
            }
            TExpr::Math(f, args) => {
                let vals: Vec<Value> = args.iter().map(|&a| self.expr(blk, env, cx, a)).collect::<R<_>>()?;
                self.b.math(blk, f, ty, &vals, None)
            }
            TExpr::Intrinsic(i, args) => {
                let vals: Vec<Value> = args.iter().map(|&a| self.expr(blk, env, cx, a)).collect::<R<_>>()?;
                self.b.intrinsic(blk, i, ty, &vals, None)
            }
            TExpr::Cast(a) => {
                let from = p.ty(a);
                let v = self.expr(blk, env, cx, a)?;
                self.b.cast(blk, v, from, ty, None)
            }
            TExpr::Reduce(..) => {
                return Err(MlirError::Unsupported("a reduction not computed before its stage".into()))
            }
        };
        env.memo.insert(e, v);
        Ok(v)
    }

    /// `c ? then : other` as an `scf.if` (only the chosen side is evaluated);
    /// a side is an expression or a constant bool.
    #[allow(clippy::too_many_arguments)]
    fn lazy<'a>(
        &self,
        blk: &'a Block<'c>,
        env: &mut Body<'c, 'a>,
        cx: &BodyCx<'_, 'c, 'a>,
        c: Value<'c, 'a>,
        then: Result<TExprId, bool>,
        other: Result<TExprId, bool>,
        ty: Ty,
    ) -> R<Value<'c, 'a>> {
        let branch = |side: Result<TExprId, bool>, env: &Body<'c, 'a>| -> R<Region<'c>> {
            let inner = Block::new(&[]);
            {
                let mut child = Body { memo: env.memo.clone(), index: env.index.clone(), top: env.top };
                let v = match side {
                    Ok(e) => self.expr(&inner, &mut child, cx, e)?,
                    Err(b) => self.b.int(&inner, ty, b as i64),
                };
                self.b.op(&inner, "scf.yield", &[v], &[], &[]);
            }
            let r = Region::new();
            r.append_block(inner);
            Ok(r)
        };
        let (ra, rb) = (branch(then, env)?, branch(other, env)?);
        let op = OperationBuilder::new("scf.if", self.b.loc)
            .add_operands(&[c])
            .add_results(&[self.b.vty(ty, None)])
            .add_regions([ra, rb])
            .build()
            .expect("scf.if");
        Ok(blk.append_operation(op).result(0).expect("result").into())
    }
}
