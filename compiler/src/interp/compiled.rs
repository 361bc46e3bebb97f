//! The interpreter's fast path: a stage's expression compiled once into a
//! tree of closures, so that evaluating an element does no expression
//! lookup, no `V` matching and no allocation on the hot shapes.
//!
//! Why it computes exactly what the tree walk ([`Machine::eval`]) computes:
//!
//! - **Same operators.** Every operator calls its one definition in
//!   [`crate::semantics`] (`arith_f64`, `compare`, `math_f64`,
//!   `reduce_step_i64`, ... are the pieces `binary`, `math` and
//!   `reduce_step` are made of); operands are evaluated in the same order,
//!   `&&`/`||` and `select` evaluate the same operands.
//! - **Same values.** A compiled node returns the payload of the very `V`
//!   variant the tree walk returns for it ([`Code::eval`] wraps it back).
//!   The variant is fixed by the node's type: the tree walk returns `V::F`
//!   for float-typed nodes, `V::I` for integer- and index-typed ones, `V::B`
//!   for bool-typed ones. Each case below produces one variant and
//!   [`compile`] refuses a node whose variant would not match its type (a
//!   constant whose type disagrees with it, bool arithmetic, ...); the stage
//!   then runs on the tree walk instead. Unwrapping is therefore lossless.
//! - **Same addresses.** A load whose indices are affine in the stage's
//!   variables reads at `base + Σ coef·var`, which is the tree walk's
//!   `Σ index_d · stride_d` multiplied out. Its bounds check is done once,
//!   here, by interval arithmetic: every variable always holds a value in
//!   `0..extent` (axes and reduction variables are only ever set inside
//!   their range and reset to 0, and an empty range is never entered), so
//!   when every index's range over those boxes lies inside its dimension,
//!   no evaluation can be out of bounds. Any other load computes each index
//!   and checks it at run time exactly like the tree walk.
//! - **Same order.** Reductions visit their points in the tree walk's order
//!   (last variable fastest), accumulate with the same step from the same
//!   identity, and leave their variables at 0 as it does.

use super::{Buf, Machine};
use crate::affine::affine_in_vars;
use crate::ops::{BinOp, ReduceOp};
use crate::semantics::{self as sem, V};
use crate::tir::*;
use crate::types::ElemType;

/// A load outside its tensor, found at run time (reported as the tree walk reports it).
#[derive(Clone, Copy, Debug)]
pub(super) struct Oob(pub TensorId);

type R<T> = Result<T, Oob>;
type Fx<'m, T> = Box<dyn Fn(&mut [i64]) -> R<T> + Send + Sync + 'm>;

/// A compiled expression, by the `V` variant it produces.
pub(super) enum Code<'m> {
    F(Fx<'m, f64>),
    I(Fx<'m, i64>),
    B(Fx<'m, bool>),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    F,
    I,
    B,
}

impl Code<'_> {
    /// The value, as the tree walk returns it.
    pub fn eval(&self, env: &mut [i64]) -> R<V> {
        Ok(match self {
            Code::F(f) => V::F(f(env)?),
            Code::I(f) => V::I(f(env)?),
            Code::B(f) => V::B(f(env)?),
        })
    }

    fn kind(&self) -> Kind {
        match self {
            Code::F(_) => Kind::F,
            Code::I(_) => Kind::I,
            Code::B(_) => Kind::B,
        }
    }
}

/// The variant the tree walk returns for a node of type `ty`.
fn kind_of(ty: Ty) -> Kind {
    match ty {
        Ty::Elem(ElemType::Bool) => Kind::B,
        Ty::Elem(e) if e.is_float() => Kind::F,
        _ => Kind::I,
    }
}

/// A node computed by a generic definition on `V`s whose result variant is
/// `kind` (the caller knows it from the definition).
fn generic<'m>(kind: Kind, f: impl Fn(&mut [i64]) -> R<V> + Send + Sync + 'm) -> Code<'m> {
    match kind {
        Kind::F => Code::F(Box::new(move |e| Ok(f(e)?.f()))),
        Kind::I => Code::I(Box::new(move |e| Ok(f(e)?.i()))),
        Kind::B => Code::B(Box::new(move |e| Ok(f(e)?.b()))),
    }
}

fn constant<'m>(v: V) -> Code<'m> {
    match v {
        V::F(x) => Code::F(Box::new(move |_| Ok(x))),
        V::I(x) => Code::I(Box::new(move |_| Ok(x))),
        V::B(x) => Code::B(Box::new(move |_| Ok(x))),
    }
}

/// Compile expression `e` of a stage whose variables are `vars`, reading the
/// machine's current buffers; `None` when some node is outside what this
/// path handles (the caller then uses the tree walk).
pub(super) fn compile<'m>(m: &'m Machine<'_>, vars: &'m [VarDecl], e: TExprId) -> Option<Code<'m>> {
    Compiler { m, vars }.expr(e)
}

struct Compiler<'m, 'p> {
    m: &'m Machine<'p>,
    vars: &'m [VarDecl],
}

impl<'m> Compiler<'m, '_> {
    fn expr(&self, e: TExprId) -> Option<Code<'m>> {
        let p = self.m.p;
        let ty = p.ty(e);
        let kind = kind_of(ty);
        let code = match p.expr(e) {
            // The tree walk gives `V::B` for bool-typed integer constants, `V::I` otherwise.
            TExpr::Int(v) if kind == Kind::B => constant(V::B(*v != 0)),
            TExpr::Int(v) => constant(V::I(*v)),
            TExpr::Float(v) => constant(V::F(*v)),
            TExpr::Var(v) => {
                let v = *v as usize;
                Code::I(Box::new(move |env| Ok(env[v])))
            }
            TExpr::Scalar(s) => constant(*self.m.scalars.get(*s as usize)?),
            TExpr::Load(t, idx) => self.load(*t, idx)?,
            TExpr::Unary(op, a) => {
                // `!` gives a bool; `-` keeps its operand's variant (and type).
                let op = *op;
                let a = self.expr(*a)?;
                let out = if op == crate::ops::UnOp::Not { Kind::B } else { a.kind() };
                generic(out, move |env| Ok(sem::unary(op, ty, a.eval(env)?)))
            }
            TExpr::Binary(op, a, b) => self.binary(*op, ty, p.ty(*a), *a, *b)?,
            TExpr::Select(c, a, b) => {
                let (Code::B(c), a, b) = (self.expr(*c)?, self.expr(*a)?, self.expr(*b)?) else {
                    return None;
                };
                match (a, b) {
                    (Code::F(a), Code::F(b)) => Code::F(Box::new(move |e| if c(e)? { a(e) } else { b(e) })),
                    (Code::I(a), Code::I(b)) => Code::I(Box::new(move |e| if c(e)? { a(e) } else { b(e) })),
                    (Code::B(a), Code::B(b)) => Code::B(Box::new(move |e| if c(e)? { a(e) } else { b(e) })),
                    _ => return None,
                }
            }
            TExpr::Math(f, args) => {
                let f = *f;
                let args = args.iter().map(|&a| self.expr(a)).collect::<Option<Vec<_>>>()?;
                let float = kind == Kind::F;
                if float && args.len() <= 3 && args.iter().all(|a| a.kind() == Kind::F) {
                    let args: Vec<Fx<'m, f64>> = args
                        .into_iter()
                        .map(|a| match a {
                            Code::F(a) => a,
                            _ => unreachable!("all float"),
                        })
                        .collect();
                    Code::F(Box::new(move |e| {
                        let mut x = [0.0; 3];
                        for (slot, a) in x.iter_mut().zip(&args) {
                            *slot = a(e)?;
                        }
                        Ok(sem::math_f64(f, &x[..args.len()]))
                    }))
                } else {
                    let out = if float { Kind::F } else { Kind::I };
                    generic(out, move |e| {
                        let vals = args.iter().map(|a| a.eval(e)).collect::<R<Vec<_>>>()?;
                        Ok(sem::math(f, ty, &vals))
                    })
                }
            }
            TExpr::Intrinsic(i, args) => {
                let i = *i;
                let args = args.iter().map(|&a| self.expr(a)).collect::<Option<Vec<_>>>()?;
                let out = if kind == Kind::F { Kind::F } else { Kind::I };
                generic(out, move |e| {
                    let vals = args.iter().map(|a| a.eval(e)).collect::<R<Vec<_>>>()?;
                    Ok(sem::intrinsic(i, ty, &vals))
                })
            }
            TExpr::Cast(a) => {
                // `cast` gives exactly the variant of its target type.
                let a = self.expr(*a)?;
                generic(kind, move |e| Ok(sem::cast(a.eval(e)?, ty)))
            }
            TExpr::Reduce(op, rvars, body) => self.reduce(*op, ty, rvars, *body)?,
        };
        (code.kind() == kind).then_some(code)
    }

    fn binary(&self, op: BinOp, ty: Ty, operand_ty: Ty, a: TExprId, b: TExprId) -> Option<Code<'m>> {
        let (x, y) = (self.expr(a)?, self.expr(b)?);
        let logic = matches!(op, BinOp::And | BinOp::Or);
        Some(match (x, y) {
            // Rust's `&&`/`||` short-circuit exactly as the tree walk does on `V::B`.
            (Code::B(x), Code::B(y)) if op == BinOp::And => Code::B(Box::new(move |e| Ok(x(e)? && y(e)?))),
            (Code::B(x), Code::B(y)) if op == BinOp::Or => Code::B(Box::new(move |e| Ok(x(e)? || y(e)?))),
            (Code::F(x), Code::F(y)) if op.is_comparison() => {
                Code::B(Box::new(move |e| Ok(sem::compare(op, x(e)?, y(e)?))))
            }
            (Code::I(x), Code::I(y)) if op.is_comparison() => {
                Code::B(Box::new(move |e| Ok(sem::compare(op, x(e)?, y(e)?))))
            }
            (Code::F(x), Code::F(y)) if !logic => Code::F(Box::new(move |e| Ok(sem::arith_f64(op, x(e)?, y(e)?)))),
            (Code::I(x), Code::I(y)) if !logic => Code::I(Box::new(move |e| Ok(sem::arith_i64(op, ty, x(e)?, y(e)?)))),
            (x, y) => {
                // Anything else (bool `==`, mixed operands): the definition on `V`s,
                // with the tree walk's short-circuit.
                let out = if op.is_comparison() || logic {
                    Kind::B
                } else if kind_of(operand_ty) == Kind::F {
                    Kind::F
                } else {
                    Kind::I
                };
                generic(out, move |e| {
                    let xv = x.eval(e)?;
                    match (op, xv) {
                        (BinOp::And, V::B(false)) => return Ok(V::B(false)),
                        (BinOp::Or, V::B(true)) => return Ok(V::B(true)),
                        _ => {}
                    }
                    Ok(sem::binary(op, ty, operand_ty, xv, y.eval(e)?))
                })
            }
        })
    }

    fn reduce(&self, op: ReduceOp, ty: Ty, rvars: &[VarId], body: TExprId) -> Option<Code<'m>> {
        if let Some(code) = self.strided_reduce(op, ty, rvars, body) {
            return Some(code);
        }
        let body = self.expr(body)?;
        let ext: Vec<i64> =
            rvars.iter().map(|&v| self.vars.get(v as usize).map(|d| d.extent)).collect::<Option<_>>()?;
        let rv: Vec<usize> = rvars.iter().map(|&v| v as usize).collect();
        let empty = ext.contains(&0);
        Some(match (body, sem::reduce_identity(op, ty)) {
            (Code::F(body), V::F(id)) => Code::F(Box::new(move |env| {
                let mut acc = id;
                if !empty {
                    for_each_point(&rv, &ext, env, |env| {
                        acc = sem::reduce_step_f64(op, acc, body(env)?);
                        Ok(())
                    })?;
                }
                Ok(acc)
            })),
            (Code::I(body), V::I(id)) => Code::I(Box::new(move |env| {
                let mut acc = id;
                if !empty {
                    for_each_point(&rv, &ext, env, |env| {
                        acc = sem::reduce_step_i64(op, acc, body(env)?);
                        Ok(())
                    })?;
                }
                Ok(sem::wrap(ty, acc))
            })),
            _ => return None,
        })
    }

    /// The inner loop of matrix products and convolutions,
    /// `op[.., k](X[..] ⊙ Y[..])` with float loads proven in bounds: the
    /// points are visited in the same order, but along the last variable the
    /// two offsets step by their strides instead of being recomputed.
    fn strided_reduce(&self, op: ReduceOp, ty: Ty, rvars: &[VarId], body: TExprId) -> Option<Code<'m>> {
        let p = self.m.p;
        let (&last, outer) = rvars.split_last()?;
        let TExpr::Binary(bop, a, b) = p.expr(body) else { return None };
        let bop = *bop;
        if bop.is_comparison() || matches!(bop, BinOp::And | BinOp::Or) || kind_of(p.ty(body)) != Kind::F {
            return None;
        }
        let V::F(id) = sem::reduce_identity(op, ty) else { return None };
        let (x, y) = (self.float_load(*a)?, self.float_load(*b)?);
        let ext: Vec<i64> =
            rvars.iter().map(|&v| self.vars.get(v as usize).map(|d| d.extent)).collect::<Option<_>>()?;
        let empty = ext.contains(&0);
        let (&n, outer_ext) = ext.split_last()?;
        let outer_ext = outer_ext.to_vec();
        let outer: Vec<usize> = outer.iter().map(|&v| v as usize).collect();
        let k = last as usize;
        let (sx, sy) = (x.stride(k), y.stride(k));
        Some(Code::F(Box::new(move |env| {
            let mut acc = id;
            if empty {
                return Ok(acc);
            }
            // `k` stays 0 in `env` (where the tree walk leaves it) while the offsets step.
            env[k] = 0;
            for_each_point(&outer, &outer_ext, env, |env| {
                let (mut i, mut j) = (x.offset(env), y.offset(env));
                for _ in 0..n {
                    acc = sem::reduce_step_f64(op, acc, sem::arith_f64(bop, x.buf[i as usize], y.buf[j as usize]));
                    i += sx;
                    j += sy;
                }
                Ok(())
            })?;
            Ok(acc)
        })))
    }

    /// A load of a float buffer, proven in bounds.
    fn float_load(&self, e: TExprId) -> Option<Strided<'m>> {
        let TExpr::Load(t, idx) = self.m.p.expr(e) else { return None };
        let Some(Buf::F(buf)) = self.m.bufs[t.0 as usize].as_ref() else { return None };
        if kind_of(self.m.p.ty(e)) != Kind::F || idx.len() != self.m.p.tensor(*t).shape.len() {
            return None;
        }
        let (base, terms) = self.proven_offset(*t, idx)?;
        Some(Strided { buf, base, terms })
    }

    fn load(&self, t: TensorId, idx: &[TExprId]) -> Option<Code<'m>> {
        let decl = self.m.p.tensor(t);
        if idx.len() != decl.shape.len() {
            return None;
        }
        let addr = match self.proven_offset(t, idx) {
            Some((base, terms)) => Addr::Proven { base, terms },
            None => {
                let dims = idx
                    .iter()
                    .map(|&i| match self.expr(i)? {
                        Code::I(f) => Some(f),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?;
                Addr::Checked { t, dims, shape: decl.shape.clone(), strides: self.m.strides[t.0 as usize].clone() }
            }
        };
        Some(match self.m.bufs[t.0 as usize].as_ref()? {
            Buf::F(v) => Code::F(read(v, addr, |x| x)),
            Buf::I(v) if decl.elem == ElemType::Bool => Code::B(read(v, addr, |x| x != 0)),
            Buf::I(v) => Code::I(read(v, addr, |x| x)),
        })
    }

    /// `(base, [(var, coef)])` with offset `base + Σ coef·var` when every
    /// index is affine in the variables and provably inside its dimension.
    fn proven_offset(&self, t: TensorId, idx: &[TExprId]) -> Option<(i64, Vec<(usize, i64)>)> {
        let p = self.m.p;
        let shape = &p.tensor(t).shape;
        let strides = &self.m.strides[t.0 as usize];
        let mut base: i128 = 0;
        let mut coef: std::collections::BTreeMap<usize, i128> = Default::default();
        for (d, &i) in idx.iter().enumerate() {
            let a = affine_in_vars(p, i)?;
            let (mut lo, mut hi) = (a.c, a.c);
            for (&v, &k) in &a.terms {
                let top = i128::from(self.vars.get(v as usize)?.extent.max(1) - 1);
                let far = k.checked_mul(top)?;
                lo = lo.checked_add(far.min(0))?;
                hi = hi.checked_add(far.max(0))?;
            }
            if lo < 0 || hi >= i128::from(shape[d]) {
                return None;
            }
            let s = i128::from(strides[d]);
            base = base.checked_add(s.checked_mul(a.c)?)?;
            for (&v, &k) in &a.terms {
                let c = coef.entry(v as usize).or_insert(0);
                *c = c.checked_add(s.checked_mul(k)?)?;
            }
        }
        let terms = coef
            .into_iter()
            .filter(|&(_, k)| k != 0)
            .map(|(v, k)| Some((v, i64::try_from(k).ok()?)))
            .collect::<Option<Vec<_>>>()?;
        Some((i64::try_from(base).ok()?, terms))
    }
}

/// A proven load's buffer and offset `base + Σ coef·var`.
struct Strided<'m> {
    buf: &'m [f64],
    base: i64,
    terms: Vec<(usize, i64)>,
}

impl Strided<'_> {
    fn offset(&self, env: &[i64]) -> i64 {
        self.terms.iter().fold(self.base, |off, &(v, k)| off + k * env[v])
    }

    fn stride(&self, var: usize) -> i64 {
        self.terms.iter().find(|&&(v, _)| v == var).map_or(0, |&(_, k)| k)
    }
}

enum Addr<'m> {
    /// Proven in bounds (see the module documentation).
    Proven { base: i64, terms: Vec<(usize, i64)> },
    /// Each index computed and checked, in order, as the tree walk does.
    Checked { t: TensorId, dims: Vec<Fx<'m, i64>>, shape: Vec<i64>, strides: Vec<i64> },
}

/// A load from `buf` at `addr`, converted by `conv`. The common affine
/// shapes (one or two variables) get their own closures.
fn read<'m, T, U>(buf: &'m [T], addr: Addr<'m>, conv: fn(T) -> U) -> Fx<'m, U>
where
    T: Copy + Send + Sync,
    U: 'm,
{
    match addr {
        Addr::Proven { base, terms } => match terms[..] {
            [] => Box::new(move |_| Ok(conv(buf[base as usize]))),
            [(v, k)] => Box::new(move |e| Ok(conv(buf[(base + k * e[v]) as usize]))),
            [(v, k), (w, l)] => Box::new(move |e| Ok(conv(buf[(base + k * e[v] + l * e[w]) as usize]))),
            _ => Box::new(move |e| {
                let off = terms.iter().fold(base, |off, &(v, k)| off + k * e[v]);
                Ok(conv(buf[off as usize]))
            }),
        },
        Addr::Checked { t, dims, shape, strides } => Box::new(move |e| {
            let mut off = 0i64;
            for (d, index) in dims.iter().enumerate() {
                let x = index(e)?;
                if x < 0 || x >= shape[d] {
                    return Err(Oob(t));
                }
                off += x * strides[d];
            }
            buf.get(off as usize).map(|&x| conv(x)).ok_or(Oob(t))
        }),
    }
}

/// Visit every point of the box `0..ext` over variables `vars` in the tree
/// walk's order (last variable fastest), leaving the variables at 0.
/// Every extent is at least 1.
#[inline]
fn for_each_point(vars: &[usize], ext: &[i64], env: &mut [i64], mut f: impl FnMut(&mut [i64]) -> R<()>) -> R<()> {
    if let ([v], [n]) = (vars, ext) {
        for x in 0..*n {
            env[*v] = x;
            f(env)?;
        }
        env[*v] = 0;
        return Ok(());
    }
    for &v in vars {
        env[v] = 0;
    }
    loop {
        f(env)?;
        let mut done = true;
        for (&v, &n) in vars.iter().zip(ext).rev() {
            env[v] += 1;
            if env[v] < n {
                done = false;
                break;
            }
            env[v] = 0;
        }
        if done {
            return Ok(());
        }
    }
}
