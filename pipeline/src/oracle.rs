//! Checking compiled results against the interpreter (`run --check`, the
//! tests): one error measure and one tolerance table for everyone.

use texc_runtime::{DType, Tensor};

/// The one error measure of texc (`run --check`, the tests, the rewriter's
/// error models): the max-norm relative error max |got − want| / max |want|
/// (‖got − want‖∞ / ‖want‖∞), with NaN where exactly one side is NaN
/// counting as infinite; integers must be equal.
pub fn rel_error(got: &Tensor, want: &Tensor) -> f64 {
    if got.shape != want.shape {
        return f64::INFINITY;
    }
    let (a, b) = (got.to_f64(), want.to_f64());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
    a.iter().zip(&b).fold(0.0f64, |m, (x, y)| {
        if x.is_nan() != y.is_nan() {
            f64::INFINITY
        } else if x.is_nan() || x == y {
            m
        } else {
            m.max((x - y).abs())
        }
    }) / scale
}

/// Tolerance of the check for an output type, unless `--tolerance` gives one.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1e-2,
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

/// Whether `p` rounds values to a half-precision type (`f16`, `bf16`) on
/// the way to its outputs: arithmetic, a reduction, a cast or a temporary of
/// that type. The interpreter rounds only where values are stored or cast,
/// compiled code after every half-precision operation, so the two agree to
/// the half type's precision, not to that of an `f32` output computed
/// through it (`f32(sum[k](A[i, k] * B[k, j]))` with f16 `A` and `B`).
pub fn rounds_to_half(p: &texc_compiler::tir::Program) -> bool {
    use texc_compiler::tir::{TExpr, TensorRole, Ty};
    let half = |ty: Ty| matches!(ty, Ty::Elem(e) if matches!(e, texc_compiler::types::ElemType::F16 | texc_compiler::types::ElemType::BF16));
    let rounded_temp = p.stages.iter().any(|st| {
        let t = p.tensor(st.tensor);
        t.role != TensorRole::Output && half(Ty::Elem(t.elem))
    });
    let rounding_expr = p.exprs.iter().zip(&p.tys).any(|(e, &ty)| {
        half(ty) && !matches!(e, TExpr::Load(..) | TExpr::Float(_) | TExpr::Int(_) | TExpr::Var(_) | TExpr::Scalar(_))
    });
    rounded_temp || rounding_expr
}

/// One output compared with the interpreter's.
#[derive(Clone, Debug)]
pub struct OutputCheck {
    pub name: String,
    pub error: f64,
    pub tolerance: f64,
}

impl OutputCheck {
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }
}

/// Compare outputs (in order) with the interpreter's; `tolerance`, when
/// given, replaces the table for float outputs (integers stay exact).
pub fn compare(names: &[String], got: &[Tensor], want: &[Tensor], tolerance: Option<f64>) -> Vec<OutputCheck> {
    names
        .iter()
        .zip(got.iter().zip(want))
        .map(|(name, (g, w))| OutputCheck {
            name: name.clone(),
            error: rel_error(g, w),
            tolerance: match tolerance {
                Some(t) if w.dtype().is_float() => t,
                _ => self::tolerance(w.dtype()),
            },
        })
        .collect()
}
