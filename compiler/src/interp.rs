//! The reference interpreter: the oracle every backend and rewrite is
//! checked against.
//!
//! It is written to be obviously right rather than fast: stages run in
//! order, each element of a stage is computed by walking its expression,
//! and every operator is evaluated by its definition in
//! [`crate::semantics`] (floats in f64, rounded to the element type when
//! stored; integers exact and wrapping; floor division with `x / 0 == 0`).

use crate::ops::{BinOp, ReduceOp};
use crate::semantics::{self as sem};
pub use crate::semantics::{cast_f64_to_int, V};
use crate::tir::*;
use crate::types::ElemType;
use texc_runtime::{round_to, wrap_to, Tensor};

/// Most memory the interpreter will allocate for tensors.
pub const MAX_BYTES: u64 = 8 << 30;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InterpError {
    #[error("the kernel's tensors need {0} bytes, more than the interpreter's limit of 8 GiB")]
    TooLarge(u64),
    #[error("expected {expected} arguments, got {got}")]
    Arity { expected: usize, got: usize },
    #[error("argument `{name}`: expected {expected}, got {got}")]
    Mismatch { name: String, expected: String, got: String },
    #[error("internal error: load outside `{0}` (the bounds checker should have rejected this)")]
    OutOfBounds(String),
}

/// An argument, in the kernel's parameter order.
#[derive(Clone, Debug)]
pub enum Arg {
    Tensor(Tensor),
    Scalar(f64),
}

enum Buf {
    F(Vec<f64>),
    I(Vec<i64>),
}

/// Memory and evaluation for a program: buffers for every tensor, scalar
/// values, and the expression evaluator. [`run`] drives it stage by stage;
/// other drivers (the loop-nest evaluator) share it.
pub struct Machine<'a> {
    p: &'a Program,
    bufs: Vec<Option<Buf>>,
    strides: Vec<Vec<i64>>,
    scalars: Vec<V>,
}

/// A tensor argument must have its parameter's shape and element type
/// exactly (every backend checks this at the call boundary).
pub fn check_tensor_arg(decl: &TensorDecl, x: &Tensor) -> Result<(), InterpError> {
    let want: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
    if x.shape != want || x.dtype() != decl.elem {
        return Err(InterpError::Mismatch {
            name: decl.name.clone(),
            expected: format!("{}{:?}", decl.elem, want),
            got: format!("{}{:?}", x.dtype(), x.shape),
        });
    }
    Ok(())
}

/// Run a program. Returns its outputs in declaration order.
pub fn run(p: &Program, args: Vec<Arg>) -> Result<Vec<Tensor>, InterpError> {
    let mut m = Machine::new(p, args)?;
    for st in &p.stages {
        m.stage(st)?;
    }
    Ok(m.outputs())
}

impl<'a> Machine<'a> {
    /// Check the arguments against the program's parameters and load them.
    pub fn new(p: &'a Program, args: Vec<Arg>) -> Result<Machine<'a>, InterpError> {
        if args.len() != p.params.len() {
            return Err(InterpError::Arity { expected: p.params.len(), got: args.len() });
        }
        let bytes: u64 = p.tensors.iter().map(|t| t.len() as u64 * 8).sum();
        if bytes > MAX_BYTES {
            return Err(InterpError::TooLarge(bytes));
        }
        let strides = p
            .tensors
            .iter()
            .map(|t| {
                let mut s = vec![1i64; t.shape.len()];
                for d in (0..t.shape.len().saturating_sub(1)).rev() {
                    s[d] = s[d + 1] * t.shape[d + 1];
                }
                s
            })
            .collect();
        let mut m = Machine {
            p,
            bufs: (0..p.tensors.len()).map(|_| None).collect(),
            strides,
            scalars: vec![V::F(0.0); p.scalars.len()],
        };
        for (param, arg) in p.params.iter().zip(args) {
            match (param, arg) {
                (ProgramParam::Tensor(t), Arg::Tensor(x)) => {
                    check_tensor_arg(p.tensor(*t), &x)?;
                    m.bufs[t.0 as usize] = Some(match x.to_i64() {
                        Some(v) => Buf::I(v),
                        None => Buf::F(x.to_f64()),
                    });
                }
                (ProgramParam::Scalar(s), Arg::Scalar(v)) => {
                    // Scalars are given as numbers and converted like a cast (backends do the same).
                    let elem = p.scalars[*s as usize].elem;
                    m.scalars[*s as usize] = sem::cast(V::F(v), Ty::Elem(elem));
                }
                (param, arg) => {
                    let name = match param {
                        ProgramParam::Tensor(t) => p.tensor(*t).name.clone(),
                        ProgramParam::Scalar(s) => p.scalars[*s as usize].name.clone(),
                    };
                    let got = if matches!(arg, Arg::Tensor(_)) { "a tensor" } else { "a scalar" };
                    let expected = if matches!(param, ProgramParam::Tensor(_)) { "a tensor" } else { "a scalar" };
                    return Err(InterpError::Mismatch { name, expected: expected.into(), got: got.into() });
                }
            }
        }
        Ok(m)
    }

    /// The outputs, in declaration order.
    pub fn outputs(&self) -> Vec<Tensor> {
        self.p.outputs.iter().map(|&t| self.to_tensor(t)).collect()
    }

    /// Store one element (rounded or wrapped to the tensor's type).
    pub fn store(&mut self, t: TensorId, idx: &[i64], v: V) -> Result<(), InterpError> {
        let decl = self.p.tensor(t);
        let mut off = 0i64;
        for (d, &x) in idx.iter().enumerate() {
            if x < 0 || x >= decl.shape[d] {
                return Err(InterpError::OutOfBounds(decl.name.clone()));
            }
            off += x * self.strides[t.0 as usize][d];
        }
        let n = decl.len() as usize;
        let elem = decl.elem;
        let buf = self.bufs[t.0 as usize].get_or_insert_with(|| {
            if elem.is_float() {
                Buf::F(vec![0.0; n])
            } else {
                Buf::I(vec![0; n])
            }
        });
        match buf {
            Buf::F(b) => b[off as usize] = round_to(elem, v.f()),
            Buf::I(b) => b[off as usize] = wrap_to(elem, v.i()),
        }
        Ok(())
    }

    fn to_tensor(&self, t: TensorId) -> Tensor {
        let decl = self.p.tensor(t);
        let shape: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
        let dt = decl.elem;
        match &self.bufs[t.0 as usize] {
            Some(Buf::F(v)) => Tensor::from_f64(dt, shape, v),
            Some(Buf::I(v)) => Tensor::from_i64(dt, shape, v),
            None => Tensor::from_f64(dt, shape.clone(), &vec![0.0; shape.iter().product()]),
        }
    }

    fn stage(&mut self, st: &Stage) -> Result<(), InterpError> {
        let decl = self.p.tensor(st.tensor);
        let n = decl.len() as usize;
        let elem = decl.elem;
        let mut env = vec![0i64; st.vars.len()];
        let mut out_f = Vec::new();
        let mut out_i = Vec::new();
        let float = elem.is_float();
        if float {
            out_f.reserve(n);
        } else {
            out_i.reserve(n);
        }
        for _ in 0..n {
            let v = self.eval(&st.vars, st.value, &mut env)?;
            if float {
                out_f.push(round_to(elem, v.f()));
            } else {
                out_i.push(wrap_to(elem, v.i()));
            }
            // Odometer over the stage's axes, last axis fastest.
            for d in (0..st.n_axes).rev() {
                env[d] += 1;
                if env[d] < st.vars[d].extent {
                    break;
                }
                env[d] = 0;
            }
        }
        self.bufs[st.tensor.0 as usize] = Some(if float { Buf::F(out_f) } else { Buf::I(out_i) });
        Ok(())
    }

    fn load(&self, st: &[VarDecl], t: TensorId, idx: &[TExprId], env: &mut Vec<i64>) -> Result<V, InterpError> {
        let mut off = 0i64;
        let shape = &self.p.tensor(t).shape;
        for (d, &i) in idx.iter().enumerate() {
            let x = self.eval(st, i, env)?.i();
            if x < 0 || x >= shape[d] {
                return Err(InterpError::OutOfBounds(self.p.tensor(t).name.clone()));
            }
            off += x * self.strides[t.0 as usize][d];
        }
        let oob = || InterpError::OutOfBounds(self.p.tensor(t).name.clone());
        Ok(match &self.bufs[t.0 as usize] {
            Some(Buf::F(v)) => V::F(*v.get(off as usize).ok_or_else(oob)?),
            Some(Buf::I(v)) => {
                let x = *v.get(off as usize).ok_or_else(oob)?;
                if self.p.tensor(t).elem == ElemType::Bool {
                    V::B(x != 0)
                } else {
                    V::I(x)
                }
            }
            None => return Err(oob()),
        })
    }

    /// Evaluate an expression; `vars` gives the extents of its variables
    /// (used by reductions) and `env` their current values.
    pub fn eval(&self, st: &[VarDecl], e: TExprId, env: &mut Vec<i64>) -> Result<V, InterpError> {
        let ty = self.p.ty(e);
        Ok(match self.p.expr(e) {
            TExpr::Int(v) => match ty {
                Ty::Elem(ElemType::Bool) => V::B(*v != 0),
                _ => V::I(*v),
            },
            TExpr::Float(v) => V::F(*v),
            TExpr::Var(v) => V::I(env[*v as usize]),
            TExpr::Scalar(s) => self.scalars[*s as usize],
            TExpr::Load(t, idx) => self.load(st, *t, idx, env)?,
            TExpr::Unary(op, a) => sem::unary(*op, ty, self.eval(st, *a, env)?),
            TExpr::Binary(op, a, b) => {
                let x = self.eval(st, *a, env)?;
                // `&&`/`||` short-circuit, like the C family.
                match (op, x) {
                    (BinOp::And, V::B(false)) => return Ok(V::B(false)),
                    (BinOp::Or, V::B(true)) => return Ok(V::B(true)),
                    _ => {}
                }
                let y = self.eval(st, *b, env)?;
                sem::binary(*op, ty, self.p.ty(*a), x, y)
            }
            TExpr::Select(c, a, b) => {
                let c = self.eval(st, *c, env)?.b();
                self.eval(st, if c { *a } else { *b }, env)?
            }
            TExpr::Math(f, args) => {
                let vals = args.iter().map(|a| self.eval(st, *a, env)).collect::<Result<Vec<_>, _>>()?;
                sem::math(*f, ty, &vals)
            }
            TExpr::Intrinsic(i, args) => {
                let vals = args.iter().map(|a| self.eval(st, *a, env)).collect::<Result<Vec<_>, _>>()?;
                sem::intrinsic(*i, ty, &vals)
            }
            TExpr::Cast(a) => sem::cast(self.eval(st, *a, env)?, ty),
            TExpr::Reduce(op, vars, body) => self.reduce(st, *op, ty, vars, *body, env)?,
        })
    }

    fn reduce(
        &self,
        st: &[VarDecl],
        op: ReduceOp,
        ty: Ty,
        vars: &[VarId],
        body: TExprId,
        env: &mut Vec<i64>,
    ) -> Result<V, InterpError> {
        let mut acc = sem::reduce_identity(op, ty);
        if vars.iter().any(|&v| st[v as usize].extent == 0) {
            return Ok(acc);
        }
        for &v in vars {
            env[v as usize] = 0;
        }
        loop {
            let x = self.eval(st, body, env)?;
            acc = sem::reduce_step(op, ty, acc, x);
            let mut done = true;
            for &v in vars.iter().rev() {
                env[v as usize] += 1;
                if env[v as usize] < st[v as usize].extent {
                    done = false;
                    break;
                }
                env[v as usize] = 0;
            }
            if done {
                break;
            }
        }
        Ok(match acc {
            V::I(x) => V::I(sem::wrap(ty, x)),
            other => other,
        })
    }
}

/// Arguments for a program in parameter order: tensors from `files` (by
/// name; a `bf16` tensor may come from an `f32` file) or seeded random data;
/// scalars from `scalars`, a 0-d file, their default, or seeded random data.
pub fn bind_args(
    p: &Program,
    mut files: std::collections::HashMap<String, Tensor>,
    scalars: &[(String, f64)],
    seed: u64,
) -> Result<Vec<Arg>, String> {
    use texc_runtime::DType;
    let mut rng = texc_runtime::SplitMix64::new(seed);
    let mut args = Vec::new();
    for param in &p.params {
        match param {
            ProgramParam::Tensor(t) => {
                let decl = p.tensor(*t);
                let shape: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
                let want = decl.elem;
                let tensor = match files.remove(&decl.name) {
                    Some(f) if f.dtype() == want => f,
                    Some(f) if want == DType::BF16 && f.dtype() == DType::F32 => {
                        Tensor::from_f64(want, f.shape.clone(), &f.to_f64())
                    }
                    Some(f) => {
                        return Err(format!(
                            "input `{}`: the file holds {} data, but `{}` is declared {}",
                            decl.name,
                            f.dtype(),
                            decl.name,
                            decl.elem
                        ))
                    }
                    None => Tensor::random(want, shape, &mut rng)
                        .map_err(|e| format!("input `{}`: random data: {e}", decl.name))?,
                };
                args.push(Arg::Tensor(tensor));
            }
            ProgramParam::Scalar(s) => {
                let decl = &p.scalars[*s as usize];
                let v = if let Some((_, v)) = scalars.iter().rev().find(|(n, _)| *n == decl.name) {
                    *v
                } else if let Some(f) = files.remove(&decl.name) {
                    if f.dtype() != decl.elem {
                        return Err(format!(
                            "input `{}`: the file holds {} data, but the scalar `{}` is declared {}",
                            decl.name,
                            f.dtype(),
                            decl.name,
                            decl.elem
                        ));
                    }
                    if !f.shape.is_empty() {
                        return Err(format!(
                            "input `{}` is a scalar; its file must hold a 0-d array, not shape {:?}",
                            decl.name, f.shape
                        ));
                    }
                    f.to_f64()[0]
                } else if let Some(d) = decl.default {
                    d
                } else if decl.elem.is_float() {
                    rng.next_f64() * 2.0 - 1.0
                } else {
                    (rng.next_u64() % 10) as f64
                };
                args.push(Arg::Scalar(v));
            }
        }
    }
    Ok(args)
}
