//! The reference interpreter: the oracle every backend and rewrite is
//! checked against.
//!
//! Its definition is the tree walk [`Machine::eval`], written to be
//! obviously right rather than fast: stages run in order, each element of a
//! stage is computed by walking its expression, and every operator is
//! evaluated by its definition in [`crate::semantics`] (floats in f64,
//! rounded to the element type when stored; integers exact and wrapping;
//! floor division with `x / 0 == 0`). [`run_reference`] runs exactly that.
//!
//! [`run`] computes the same values faster, in two ways that cannot change a
//! result:
//! - each stage's expression is compiled once into closures (`compiled`,
//!   whose header gives the argument that it evaluates exactly like the tree
//!   walk); a stage with anything that path does not handle runs on the tree
//!   walk;
//! - a stage's elements are computed on several threads, each thread a
//!   contiguous run of elements at a time. Elements are independent (a
//!   stage reads only earlier stages' tensors) and each one is computed by
//!   the same sequential code, its reductions in the same order, so the
//!   values are bit-identical to a one-thread run. When elements fail, the
//!   error reported is the first in element order, as sequentially.
//!
//! `tests/tests/interp_fast.rs` checks the two against each other bit for
//! bit on random programs.

mod compiled;

use crate::ops::{BinOp, ReduceOp};
use crate::semantics::{self as sem};
pub use crate::semantics::{cast_f64_to_int, V};
use crate::tir::*;
use crate::types::ElemType;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
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
    run_with_progress(p, args, &Progress::default())
}

/// [`run`], counting work done in `progress` as it goes (another thread may
/// watch it: the `texc` command draws a progress bar from it).
pub fn run_with_progress(p: &Program, args: Vec<Arg>, progress: &Progress) -> Result<Vec<Tensor>, InterpError> {
    let mut m = Machine::new(p, args)?;
    progress.total.store(p.stages.iter().map(|st| stage_work(p, st)).fold(0, u64::saturating_add), Ordering::Relaxed);
    for st in &p.stages {
        m.stage(st, progress)?;
    }
    Ok(m.outputs())
}

/// For each stage of a run, whether it took the compiled path (rather than
/// the tree walk); tests use it to see that the fast path is exercised.
#[doc(hidden)]
pub fn compiled_stages(p: &Program, args: Vec<Arg>) -> Result<Vec<bool>, InterpError> {
    let mut m = Machine::new(p, args)?;
    p.stages.iter().map(|st| m.stage(st, &Progress::default())).collect()
}

/// Run a program by the definition alone: the tree walk, one element after
/// another on one thread. [`run`] must agree with it bit for bit.
pub fn run_reference(p: &Program, args: Vec<Arg>) -> Result<Vec<Tensor>, InterpError> {
    let mut m = Machine::new(p, args)?;
    for st in &p.stages {
        m.stage_reference(st)?;
    }
    Ok(m.outputs())
}

/// Work done and to do in a run, in units of roughly one expression node
/// evaluated. Updated every few thousand elements; cheap to read at any time.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// The whole run's work (0 until the run has started).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// A stage's work in [`Progress`] units: elements times nodes per element,
/// each reduction's body counted once per point of its range.
fn stage_work(p: &Program, st: &Stage) -> u64 {
    fn work(p: &Program, st: &Stage, e: TExprId) -> u64 {
        let below = p.children(e).into_iter().map(|c| work(p, st, c)).fold(1, u64::saturating_add);
        match p.expr(e) {
            TExpr::Reduce(_, vars, _) => vars
                .iter()
                .map(|&v| st.vars.get(v as usize).map_or(1, |d| d.extent.max(0) as u64))
                .fold(below, u64::saturating_mul),
            _ => below,
        }
    }
    (p.tensor(st.tensor).len().max(0) as u64).saturating_mul(work(p, st, st.value))
}

/// Threads a stage's elements are spread over: `TEXC_NUM_THREADS` or the machine's parallelism.
fn threads() -> usize {
    texc_runtime::pool::threads_from_env()
        .ok()
        .flatten()
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Below this much work (in [`Progress`] units) a stage runs on the calling thread.
const PARALLEL_WORK: u64 = 1 << 16;

/// Compute elements `0..n` of a stage whose axes have extents `axes` (the
/// first `axes.len()` of `n_vars` variables), element `i` into `out[i]` by
/// `elem` then `store`, on up to [`threads`] threads. `work` is the stage's
/// [`stage_work`]. The first error in element order is returned.
#[allow(clippy::too_many_arguments)]
fn fill<T: Copy + Default + Send>(
    axes: &[i64],
    n_vars: usize,
    n: usize,
    work: u64,
    progress: &Progress,
    elem: &(dyn Fn(&mut [i64]) -> Result<V, InterpError> + Sync),
    store: &(dyn Fn(V) -> T + Sync),
) -> Result<Vec<T>, InterpError> {
    let mut out = vec![T::default(); n];
    if n == 0 {
        return Ok(out);
    }
    let threads = if work < PARALLEL_WORK { 1 } else { threads().min(n) };
    // Several chunks per thread balance uneven elements and keep progress moving.
    let chunk = n.div_ceil(threads * 16).max(1);
    let per_elem = work / n as u64;
    let chunks = Mutex::new(out.chunks_mut(chunk).enumerate());
    let first_error: Mutex<Option<(usize, InterpError)>> = Mutex::new(None);
    let worker = || {
        let mut env = vec![0i64; n_vars];
        loop {
            let next = chunks.lock().unwrap_or_else(|e| e.into_inner()).next();
            let Some((c, slice)) = next else { return };
            // The axes of the chunk's first element, last axis fastest.
            let mut rest = c * chunk;
            for d in (0..axes.len()).rev() {
                let e = axes[d] as usize;
                env[d] = (rest % e) as i64;
                rest /= e;
            }
            for v in env.iter_mut().skip(axes.len()) {
                *v = 0;
            }
            for slot in slice.iter_mut() {
                match elem(&mut env) {
                    Ok(v) => *slot = store(v),
                    Err(e) => {
                        let mut first = first_error.lock().unwrap_or_else(|e| e.into_inner());
                        if first.as_ref().is_none_or(|(f, _)| c < *f) {
                            *first = Some((c, e));
                        }
                        break;
                    }
                }
                for d in (0..axes.len()).rev() {
                    env[d] += 1;
                    if env[d] < axes[d] {
                        break;
                    }
                    env[d] = 0;
                }
            }
            progress.done.fetch_add(per_elem.saturating_mul(slice.len() as u64), Ordering::Relaxed);
        }
    };
    if threads == 1 {
        worker();
    } else {
        std::thread::scope(|s| {
            for _ in 1..threads {
                // Evaluation recurses over the expression: the stack the command's own thread has.
                let spawned = std::thread::Builder::new().stack_size(256 << 20).spawn_scoped(s, worker);
                if spawned.is_err() {
                    break; // no thread to be had: the others (this one at least) do the work
                }
            }
            worker();
        });
    }
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(out),
    }
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
                    let name = p.param_name(param).to_string();
                    let got = if matches!(arg, Arg::Tensor(_)) { "a tensor" } else { "a scalar" };
                    let expected = if matches!(param, ProgramParam::Tensor(_)) { "a tensor" } else { "a scalar" };
                    return Err(InterpError::Mismatch { name, expected: expected.into(), got: got.into() });
                }
            }
        }
        // Outputs and temporaries hold zeros until stored (what code generators give them).
        for t in 0..p.tensors.len() {
            if m.bufs[t].is_none() {
                m.clear(TensorId(t as u32));
            }
        }
        Ok(m)
    }

    /// The outputs, in declaration order.
    pub fn outputs(&self) -> Vec<Tensor> {
        self.p.outputs.iter().map(|&t| self.to_tensor(t)).collect()
    }

    /// Set every element of `t` to zero (a local buffer, allocated anew).
    pub fn clear(&mut self, t: TensorId) {
        let decl = self.p.tensor(t);
        let n = decl.len() as usize;
        match &mut self.bufs[t.0 as usize] {
            Some(Buf::F(b)) => b.fill(0.0),
            Some(Buf::I(b)) => b.fill(0),
            slot @ None if decl.elem.is_float() => *slot = Some(Buf::F(vec![0.0; n])),
            slot @ None => *slot = Some(Buf::I(vec![0; n])),
        }
    }

    /// Store one element (rounded or wrapped to the tensor's type).
    pub fn store(&mut self, t: TensorId, idx: &[i64], v: V) -> Result<(), InterpError> {
        let off = self.offset(t, idx)?;
        self.store_at(t, off, v)
    }

    /// The row-major offset of `idx` in `t`, checked against its shape.
    pub fn offset(&self, t: TensorId, idx: &[i64]) -> Result<i64, InterpError> {
        let shape = &self.p.tensor(t).shape;
        let mut off = 0i64;
        for (d, &x) in idx.iter().enumerate() {
            if x < 0 || x >= shape[d] {
                return Err(InterpError::OutOfBounds(self.p.tensor(t).name.clone()));
            }
            off += x * self.strides[t.0 as usize][d];
        }
        Ok(off)
    }

    /// [`Machine::store`] at an [`Machine::offset`] of `t`.
    pub fn store_at(&mut self, t: TensorId, off: i64, v: V) -> Result<(), InterpError> {
        let decl = self.p.tensor(t);
        let n = decl.len() as usize;
        let elem = decl.elem;
        let buf = self.bufs[t.0 as usize].get_or_insert_with(|| {
            if elem.is_float() {
                Buf::F(vec![0.0; n])
            } else {
                Buf::I(vec![0; n])
            }
        });
        let stored = match buf {
            Buf::F(b) => b.get_mut(off as usize).map(|x| *x = round_to(elem, v.f())),
            Buf::I(b) => b.get_mut(off as usize).map(|x| *x = wrap_to(elem, v.i())),
        };
        stored.ok_or_else(|| InterpError::OutOfBounds(self.p.tensor(t).name.clone()))
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

    /// Compute a stage: its expression compiled (or, failing that, the tree
    /// walk), its elements spread over threads; see the module documentation.
    /// Returns whether the expression compiled.
    fn stage(&mut self, st: &Stage, progress: &Progress) -> Result<bool, InterpError> {
        let decl = self.p.tensor(st.tensor);
        let n = decl.len() as usize;
        let elem = decl.elem;
        let axes: Vec<i64> = st.vars[..st.n_axes].iter().map(|v| v.extent).collect();
        let work = stage_work(self.p, st);
        let (buf, compiled) = {
            let code = compiled::compile(self, &st.vars, st.value);
            let eval = |env: &mut [i64]| match &code {
                Some(c) => c.eval(env).map_err(|compiled::Oob(t)| self.oob(t)),
                None => self.eval(&st.vars, st.value, env),
            };
            let buf = if elem.is_float() {
                Buf::F(fill(&axes, st.vars.len(), n, work, progress, &eval, &|v| round_to(elem, v.f()))?)
            } else {
                Buf::I(fill(&axes, st.vars.len(), n, work, progress, &eval, &|v| wrap_to(elem, v.i()))?)
            };
            (buf, code.is_some())
        };
        self.bufs[st.tensor.0 as usize] = Some(buf);
        Ok(compiled)
    }

    fn oob(&self, t: TensorId) -> InterpError {
        InterpError::OutOfBounds(self.p.tensor(t).name.clone())
    }

    /// The definition of a stage: the tree walk over its elements in order.
    fn stage_reference(&mut self, st: &Stage) -> Result<(), InterpError> {
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

    /// Load one element at concrete indices.
    pub fn load_at(&self, t: TensorId, idx: &[i64]) -> Result<V, InterpError> {
        self.element(t, self.offset(t, idx)?)
    }

    /// Element `off` (row-major) of tensor `t`.
    fn element(&self, t: TensorId, off: i64) -> Result<V, InterpError> {
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

    fn load<O: Reads>(
        &self,
        st: &[VarDecl],
        (t, idx): (TensorId, &[TExprId]),
        env: &mut [i64],
        o: &mut O,
    ) -> Result<V, O::Error> {
        let mut off = 0i64;
        let shape = &self.p.tensor(t).shape;
        for (d, &i) in idx.iter().enumerate() {
            let x = self.eval_with(st, i, env, o)?.i();
            if x < 0 || x >= shape[d] {
                return Err(InterpError::OutOfBounds(self.p.tensor(t).name.clone()).into());
            }
            off += x * self.strides[t.0 as usize][d];
        }
        o.read(t, off)?;
        Ok(self.element(t, off)?)
    }

    /// Evaluate an expression; `vars` gives the extents of its variables
    /// (used by reductions) and `env` their current values.
    pub fn eval(&self, st: &[VarDecl], e: TExprId, env: &mut [i64]) -> Result<V, InterpError> {
        self.eval_with(st, e, env, &mut NoReads)
    }

    /// [`Machine::eval`], telling `o` of every element it reads, in the
    /// order it reads them (after the element's indices' own reads; the
    /// side of a `select` taken, the operands `&&` and `||` evaluate).
    pub fn eval_with<O: Reads>(&self, st: &[VarDecl], e: TExprId, env: &mut [i64], o: &mut O) -> Result<V, O::Error> {
        let ty = self.p.ty(e);
        Ok(match self.p.expr(e) {
            TExpr::Int(v) => match ty {
                Ty::Elem(ElemType::Bool) => V::B(*v != 0),
                _ => V::I(*v),
            },
            TExpr::Float(v) => V::F(*v),
            TExpr::Var(v) => V::I(env[*v as usize]),
            TExpr::Scalar(s) => self.scalars[*s as usize],
            TExpr::Load(t, idx) => self.load(st, (*t, idx), env, o)?,
            TExpr::Unary(op, a) => sem::unary(*op, ty, self.eval_with(st, *a, env, o)?),
            TExpr::Binary(op, a, b) => {
                let x = self.eval_with(st, *a, env, o)?;
                // `&&`/`||` short-circuit, like the C family.
                match (op, x) {
                    (BinOp::And, V::B(false)) => return Ok(V::B(false)),
                    (BinOp::Or, V::B(true)) => return Ok(V::B(true)),
                    _ => {}
                }
                let y = self.eval_with(st, *b, env, o)?;
                sem::binary(*op, ty, self.p.ty(*a), x, y)
            }
            TExpr::Select(c, a, b) => {
                let c = self.eval_with(st, *c, env, o)?.b();
                self.eval_with(st, if c { *a } else { *b }, env, o)?
            }
            TExpr::Math(f, args) => {
                let vals = args.iter().map(|a| self.eval_with(st, *a, env, o)).collect::<Result<Vec<_>, _>>()?;
                sem::math(*f, ty, &vals)
            }
            TExpr::Intrinsic(i, args) => {
                let vals = args.iter().map(|a| self.eval_with(st, *a, env, o)).collect::<Result<Vec<_>, _>>()?;
                sem::intrinsic(*i, ty, &vals)
            }
            TExpr::Cast(a) => sem::cast(self.eval_with(st, *a, env, o)?, ty),
            TExpr::Reduce(op, vars, body) => self.reduce(st, (*op, ty), (vars, *body), env, o)?,
        })
    }

    fn reduce<O: Reads>(
        &self,
        st: &[VarDecl],
        (op, ty): (ReduceOp, Ty),
        (vars, body): (&[VarId], TExprId),
        env: &mut [i64],
        o: &mut O,
    ) -> Result<V, O::Error> {
        let mut acc = sem::reduce_identity(op, ty);
        if vars.iter().any(|&v| st[v as usize].extent == 0) {
            return Ok(acc);
        }
        for &v in vars {
            env[v as usize] = 0;
        }
        loop {
            let x = self.eval_with(st, body, env, o)?;
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

/// What an evaluation ([`Machine::eval_with`]) reads: told of each element,
/// by its row-major offset in its tensor, once its indices are in bounds.
/// (The loop evaluator's race watch, which records every read of a
/// concurrent region in the same walk that computes the values.)
pub trait Reads {
    /// What the observer may fail with, besides the evaluation's own errors.
    type Error: From<InterpError>;
    fn read(&mut self, t: TensorId, offset: i64) -> Result<(), Self::Error>;
}

/// Observes nothing: [`Machine::eval`].
pub struct NoReads;

impl Reads for NoReads {
    type Error = InterpError;
    #[inline(always)]
    fn read(&mut self, _: TensorId, _: i64) -> Result<(), InterpError> {
        Ok(())
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
