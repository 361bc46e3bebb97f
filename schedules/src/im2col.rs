//! GPU convolutions as matrix products on tensor cores (run by the default
//! GPU schedule before it schedules the stages).
//!
//! A stage `Y[n, k, h, w] = sum[c, r, s](f32(X[n, c, h + r, w + s]) *
//! f32(F[k, c, r, s]))` with f16 `X` and `F` becomes four stages:
//!
//! ```text
//! Y.filters[k, q] = F[k, q / (R*S), q / S % R, q % S]                       f16 [K, C*R*S]
//! Y.cols[q, m]    = X[m / (H*W), q / (R*S), m / W % H + q / S % R, m % W + q % S]   f16 [C*R*S, N*H*W]
//! Y.gemm[k, m]    = sum[q](f32(Y.filters[k, q]) * f32(Y.cols[q, m]))       f32 [K, N*H*W]
//! Y[n, k, h, w]   = Y.gemm[k, n*H*W + h*W + w]
//! ```
//!
//! The product is the one the default schedule runs through shared memory
//! on tensor cores (`strategy/gpu/tensor_cores.rs`), with the image's
//! positions as its columns: the copies into `Y.cols` and out of `Y.gemm`
//! walk `w`, the innermost axis of `X` and `Y`, with consecutive threads. The default
//! schedule then inlines `Y.cols` into its copy into shared memory, so the
//! columns are gathered from the image slice by slice inside the product
//! (an implicit GEMM), not written out (`R*S` times the image; the knob
//! `gather=0` keeps that explicit im2col).
//!
//! Applied where that product's tiles divide it: `K` a multiple of 64, the
//! positions `N*H*W` of 64 and `C*R*S` of 32 (else the stage keeps its
//! direct schedule). Results are equal up to the order of the f32 sums.
//!
//! A convolution of `i8` (or `u8`) images and `i8` filters into `i32` sums
//! (`sum[c, r, s](i32(X[..]) * i32(F[..]))`) becomes the same four stages
//! in those types, its product one of 8-bit tensor-core operations
//! (`mma.sync` m16n8k32, `s8.s8` or `s8.u8`); its results are exact, as
//! the direct ones.

use texc_compiler::ops::{BinOp, ReduceOp};
use texc_compiler::tir::{Program, Stage, TExpr, TExprId, TensorDecl, TensorId, TensorRole, Ty, VarDecl};
use texc_compiler::types::ElemType;

/// Rewrites every convolution stage of `p` that fits (see the module header).
pub fn convolutions_to_gemm(p: &mut Program) {
    let mut si = 0;
    while si < p.stages.len() {
        match conv_of(p, &p.stages[si]) {
            Some(c) if fits(&c) => si += rewrite(p, si, &c),
            _ => si += 1,
        }
    }
}

/// A direct convolution stage: its tensors, their element types (`f16`;
/// or `i8` filters and an `i8` or `u8` image) and the sums' (`f32` or
/// `i32`), and extents.
struct Conv {
    x: TensorId,
    f: TensorId,
    /// The filters' element type, and the image's.
    elem: ElemType,
    x_elem: ElemType,
    acc: ElemType,
    /// n, k, h, w (the output's), then c, r, s.
    ext: [i64; 7],
}

fn fits(c: &Conv) -> bool {
    let [n, k, h, w, ch, r, s] = c.ext;
    k % 64 == 0 && (n * h * w) % 64 == 0 && (ch * r * s) % 32 == 0 && n * h * w <= i32::MAX as i64
}

fn conv_of(p: &Program, st: &Stage) -> Option<Conv> {
    let acc = p.tensor(st.tensor).elem;
    let elem = match acc {
        ElemType::F32 => ElemType::F16,
        ElemType::I32 => ElemType::I8,
        _ => return None,
    };
    if st.n_axes != 4 || st.vars.len() != 7 {
        return None;
    }
    let TExpr::Reduce(ReduceOp::Sum, _, body) = p.expr(st.value) else { return None };
    let TExpr::Binary(BinOp::Mul, a, b) = p.expr(*body) else { return None };
    // An unsigned image beside signed filters: 8-bit ones only.
    let unsigned = if elem == ElemType::I8 { Some(ElemType::U8) } else { None };
    let of_type = |t: TensorId| p.tensor(t).elem == elem || Some(p.tensor(t).elem) == unsigned;
    let load = |e: TExprId| match p.expr(e) {
        TExpr::Cast(l) => match p.expr(*l) {
            TExpr::Load(t, idx) if of_type(*t) && idx.len() == 4 => Some((*t, idx.clone())),
            _ => None,
        },
        _ => None,
    };
    let (la, lb) = (load(*a)?, load(*b)?);
    let var = |e: TExprId| match p.expr(e) {
        TExpr::Var(v) => Some(*v),
        _ => None,
    };
    // `F[k, c, r, s]`: the filter's indices are four variables, `k` the second axis.
    let filter = |l: &(TensorId, Vec<TExprId>)| -> Option<[u32; 4]> {
        let v = [var(l.1[0])?, var(l.1[1])?, var(l.1[2])?, var(l.1[3])?];
        (v[0] == 1 && v[1..].iter().all(|&x| x >= 4)).then_some(v)
    };
    let ((x, xi), (f, fv)) = match (filter(&la), filter(&lb)) {
        (None, Some(v)) => (la, (lb.0, v)),
        (Some(v), None) => (lb, (la.0, v)),
        _ => return None,
    };
    let [_, c, r, s] = fv;
    if c == r || r == s || c == s {
        return None;
    }
    // `X[n, c, h + r, w + s]`.
    let sum_of = |e: TExprId, axis: u32, red: u32| match p.expr(e) {
        TExpr::Binary(BinOp::Add, u, v) => {
            (var(*u) == Some(axis) && var(*v) == Some(red)) || (var(*u) == Some(red) && var(*v) == Some(axis))
        }
        _ => false,
    };
    let image = var(xi[0]) == Some(0) && var(xi[1]) == Some(c) && sum_of(xi[2], 2, r) && sum_of(xi[3], 3, s);
    if !image || x == f || p.tensor(f).elem != elem {
        return None;
    }
    let e = |v: u32| st.vars[v as usize].extent;
    let x_elem = p.tensor(x).elem;
    Some(Conv { x, f, elem, x_elem, acc, ext: [e(0), e(1), e(2), e(3), e(c), e(r), e(s)] })
}

/// Replaces stage `si` by the four stages; returns how many stages now stand
/// where it stood.
fn rewrite(p: &mut Program, si: usize, c: &Conv) -> usize {
    let [n, k, h, w, ch, r, s] = c.ext;
    let (q_len, m_len) = (ch * r * s, n * h * w);
    let y = p.stages[si].tensor;
    let span = p.stages[si].span;
    let name = p.tensor(y).name.clone();
    let mut b = Build { p: &mut *p, span };
    let (elem, x_elem, acc) = (c.elem, c.x_elem, c.acc);
    let filters = b.temp(&format!("{name}.filters"), elem, vec![k, q_len]);
    let cols = b.temp(&format!("{name}.cols"), x_elem, vec![q_len, m_len]);
    let gemm = b.temp(&format!("{name}.gemm"), acc, vec![k, m_len]);
    // Y.filters[k, q] = F[k, q / (R*S), q / S % R, q % S]
    let (kv, q) = (b.var(0), b.var(1));
    let fc = b.div(q, r * s);
    let fr = b.div_mod(q, s, r);
    let fs = b.rem(q, s);
    let fval = b.load(c.f, vec![kv, fc, fr, fs], elem);
    let st_filters = b.stage(filters, &[("k", k), ("q", q_len)], 2, fval);
    // Y.cols[q, m] = X[m / (H*W), q / (R*S), m / W % H + q / S % R, m % W + q % S]
    let (q, m) = (b.var(0), b.var(1));
    let xn = b.div(m, h * w);
    let xc = b.div(q, r * s);
    let (mh, qr) = (b.div_mod(m, w, h), b.div_mod(q, s, r));
    let xh = b.bin(BinOp::Add, mh, qr);
    let (mw, qs) = (b.rem(m, w), b.rem(q, s));
    let xw = b.bin(BinOp::Add, mw, qs);
    let xval = b.load(c.x, vec![xn, xc, xh, xw], x_elem);
    let st_cols = b.stage(cols, &[("q", q_len), ("m", m_len)], 2, xval);
    // Y.gemm[k, m] = sum[q](f32(Y.filters[k, q]) * f32(Y.cols[q, m])) (or i32)
    let (kv, m, q) = (b.var(0), b.var(1), b.var(2));
    let a = b.load(filters, vec![kv, q], elem);
    let a = b.cast(a, acc);
    let x = b.load(cols, vec![q, m], x_elem);
    let x = b.cast(x, acc);
    let prod = b.p.alloc(TExpr::Binary(BinOp::Mul, a, x), Ty::Elem(acc), span);
    let sum = b.p.alloc(TExpr::Reduce(ReduceOp::Sum, vec![2], prod), Ty::Elem(acc), span);
    let st_gemm = b.stage(gemm, &[("k", k), ("m", m_len), ("q", q_len)], 2, sum);
    // Y[n, k, h, w] = Y.gemm[k, n*H*W + h*W + w]
    let (nv, kv, hv, wv) = (b.var(0), b.var(1), b.var(2), b.var(3));
    let at_n = b.mul(nv, h * w);
    let at_h = b.mul(hv, w);
    let at = b.bin(BinOp::Add, at_n, at_h);
    let at = b.bin(BinOp::Add, at, wv);
    let yval = b.load(gemm, vec![kv, at], acc);
    let vars = p.stages[si].vars[..4].to_vec();
    p.stages[si] = Stage { tensor: y, vars, n_axes: 4, value: yval, span };
    p.stages.splice(si..si, [st_filters, st_cols, st_gemm]);
    4
}

/// Builds the rewritten stages' expressions.
struct Build<'p> {
    p: &'p mut Program,
    span: texc_grammar::Span,
}

impl Build<'_> {
    fn temp(&mut self, name: &str, elem: ElemType, shape: Vec<i64>) -> TensorId {
        let role = TensorRole::Temp;
        self.p.tensors.push(TensorDecl { name: name.into(), elem, shape, role, span: self.span });
        TensorId(self.p.tensors.len() as u32 - 1)
    }

    fn stage(&mut self, tensor: TensorId, vars: &[(&str, i64)], n_axes: usize, value: TExprId) -> Stage {
        let vars = vars.iter().map(|(n, e)| VarDecl { name: n.to_string(), extent: *e }).collect();
        Stage { tensor, vars, n_axes, value, span: self.span }
    }

    fn var(&mut self, v: u32) -> TExprId {
        self.p.alloc(TExpr::Var(v), Ty::Index, self.span)
    }

    fn int(&mut self, k: i64) -> TExprId {
        self.p.alloc(TExpr::Int(k), Ty::Index, self.span)
    }

    fn bin(&mut self, op: BinOp, a: TExprId, b: TExprId) -> TExprId {
        self.p.alloc(TExpr::Binary(op, a, b), Ty::Index, self.span)
    }

    fn mul(&mut self, a: TExprId, k: i64) -> TExprId {
        let k = self.int(k);
        self.bin(BinOp::Mul, a, k)
    }

    fn div(&mut self, a: TExprId, k: i64) -> TExprId {
        let k = self.int(k);
        self.bin(BinOp::FloorDiv, a, k)
    }

    fn rem(&mut self, a: TExprId, k: i64) -> TExprId {
        let k = self.int(k);
        self.bin(BinOp::FloorMod, a, k)
    }

    /// `a / d % m`.
    fn div_mod(&mut self, a: TExprId, d: i64, m: i64) -> TExprId {
        let x = self.div(a, d);
        self.rem(x, m)
    }

    fn load(&mut self, t: TensorId, idx: Vec<TExprId>, elem: ElemType) -> TExprId {
        self.p.alloc(TExpr::Load(t, idx), Ty::Elem(elem), self.span)
    }

    fn cast(&mut self, e: TExprId, to: ElemType) -> TExprId {
        self.p.alloc(TExpr::Cast(e), Ty::Elem(to), self.span)
    }
}
