//! Built-in functions: LLVM intrinsics where they exist, a polynomial `exp`
//! for f32 vectors, the C math library (lane by lane) for the rest; and
//! target intrinsics.

use super::expr::{float_ty, unsigned_ty};
use super::gen::{Gen, Mode};
use super::R;
use inkwell::module::Linkage;
use inkwell::types::{BasicMetadataTypeEnum, VectorType};
use inkwell::values::{BasicValueEnum, VectorValue};
use texc_compiler::ops::{BinOp, Intrinsic, MathFn};
use texc_compiler::tir::Ty;
use texc_compiler::types::ElemType;

impl<'ctx> Gen<'ctx, '_> {
    /// A target intrinsic (legalization introduced it because the target has it).
    pub(super) fn intrinsic_op(
        &self,
        i: Intrinsic,
        a: &[BasicValueEnum<'ctx>],
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        match i {
            Intrinsic::Fma => self.call(self.intrinsic("llvm.fma", &[self.ty_in(ty, mode)])?, &[a[0], a[1], a[2]]),
        }
    }

    pub(super) fn math(
        &mut self,
        f: MathFn,
        a: &[BasicValueEnum<'ctx>],
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        if self.libdevice {
            if let Some(name) = libdevice_fn(f, ty) {
                return self.device_call(name, a, ty);
            }
        }
        let t = self.ty_in(ty, mode);
        let float = float_ty(ty);
        let un = |name: &str| -> R<BasicValueEnum<'ctx>> {
            let f = self.intrinsic(name, &[t])?;
            self.call(f, &[a[0]])
        };
        match f {
            MathFn::Exp if ty == Ty::Elem(ElemType::F32) && mode.lanes().is_some() => self.vector_expf(a[0], mode),
            MathFn::Exp => un("llvm.exp"),
            MathFn::Log => un("llvm.log"),
            MathFn::Sqrt => un("llvm.sqrt"),
            MathFn::Floor => un("llvm.floor"),
            MathFn::Ceil => un("llvm.ceil"),
            MathFn::Round => un("llvm.roundeven"),
            MathFn::Abs if float => un("llvm.fabs"),
            MathFn::Abs => {
                let f = self.intrinsic("llvm.abs", &[t])?;
                self.call(f, &[a[0], self.cx.bool_type().const_zero().into()])
            }
            MathFn::Rsqrt => {
                let s = un("llvm.sqrt")?;
                let one = self.const_of(ty, 1, 1.0, mode)?;
                self.arith(BinOp::Div, one, s, ty)
            }
            // 1 / (1 + e^−x) for x ≥ 0, e^x / (1 + e^x) below: e^−|x| never
            // overflows, so sigmoid(−95) is the denormal e^−95, not 1 / ∞.
            MathFn::Sigmoid => {
                let zero = self.const_of(ty, 0, 0.0, mode)?;
                let neg = self.arith(BinOp::Sub, zero, un("llvm.fabs")?, ty)?;
                let e = match libdevice_fn(MathFn::Exp, ty) {
                    Some(name) if self.libdevice => self.device_call(name, &[neg], ty)?,
                    _ if ty == Ty::Elem(ElemType::F32) && mode.lanes().is_some() => self.vector_expf(neg, mode)?,
                    _ => self.call(self.intrinsic("llvm.exp", &[t])?, &[neg])?,
                };
                let one = self.const_of(ty, 1, 1.0, mode)?;
                let d = self.arith(BinOp::Add, one, e, ty)?;
                let t = self.arith(BinOp::Div, one, d, ty)?;
                let nonnegative = self.compare(BinOp::Ge, a[0], zero, ty)?;
                let below = self.arith(BinOp::Mul, e, t, ty)?;
                self.sel(nonnegative, t, below)
            }
            MathFn::Tanh => self.libm(if ty == Ty::Elem(ElemType::F64) { "tanh" } else { "tanhf" }, a[0], ty, mode),
            MathFn::Erf => self.libm(if ty == Ty::Elem(ElemType::F64) { "erf" } else { "erff" }, a[0], ty, mode),
            MathFn::Erfc => self.libm(if ty == Ty::Elem(ElemType::F64) { "erfc" } else { "erfcf" }, a[0], ty, mode),
            MathFn::Pow => {
                let f = self.intrinsic("llvm.pow", &[t])?;
                self.call(f, &[a[0], a[1]])
            }
            MathFn::Max | MathFn::Min | MathFn::Clamp => {
                let (mx, mn) = if float {
                    ("llvm.maximum", "llvm.minimum")
                } else if unsigned_ty(ty) {
                    ("llvm.umax", "llvm.umin")
                } else {
                    ("llvm.smax", "llvm.smin")
                };
                if f != MathFn::Clamp {
                    if let Some(r) = self.vrange(f == MathFn::Max, a[0], a[1], ty, mode)? {
                        return Ok(r);
                    }
                }
                let fmax = self.intrinsic(mx, &[t])?;
                let fmin = self.intrinsic(mn, &[t])?;
                match f {
                    MathFn::Max => self.call(fmax, &[a[0], a[1]]),
                    MathFn::Min => self.call(fmin, &[a[0], a[1]]),
                    _ => {
                        let lo = self.call(fmax, &[a[0], a[1]])?;
                        self.call(fmin, &[lo, a[2]])
                    }
                }
            }
        }
    }

    /// IEEE `maximum`/`minimum` of two float vectors that are not constants
    /// in three AVX-512DQ instructions: `vrangeps` orders −0 below +0 but
    /// returns the other operand for a NaN, so lanes where either is NaN take
    /// `a + b` (NaN) instead. LLVM 19 lowers `llvm.maximum` to six (a sign
    /// blend of each operand, then `vmaxps` and a NaN blend): the chain of a
    /// softmax's row maximum. `None` where the target lacks the instruction
    /// or an operand is constant (`relu`'s `max(x, 0)` is two for LLVM).
    fn vrange(
        &self,
        max: bool,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<Option<BasicValueEnum<'ctx>>> {
        let (Some(lanes), BasicValueEnum::VectorValue(va), BasicValueEnum::VectorValue(vb)) = (mode.lanes(), a, b)
        else {
            return Ok(None);
        };
        let (suffix, bits) = match ty {
            Ty::Elem(ElemType::F32) => ("ps", 32),
            Ty::Elem(ElemType::F64) => ("pd", 64),
            _ => return Ok(None),
        };
        if va.is_const() || vb.is_const() {
            return Ok(None);
        }
        // imm8: bits 1:0 pick max (01) or min (00), bits 3:2 the sign from the comparison (01).
        let imm = self.cx.i32_type().const_int(if max { 0b0101 } else { 0b0100 }, false);
        let Some(ranged) =
            self.avx512_masked(&format!("range.{suffix}"), "+avx512dq", lanes * bits, vec![a, b, imm.into()])?
        else {
            return Ok(None);
        };
        let ranged = ranged.into_vector_value();
        let nan = self.b.build_float_compare(inkwell::FloatPredicate::UNO, va, vb, "nan")?;
        let sum = self.b.build_float_add(va, vb, "nan_sum")?;
        Ok(Some(self.b.build_select(nan, sum, ranged, if max { "maximum" } else { "minimum" })?))
    }

    /// `exp` on f32 vectors without a libm call per lane (Cephes `expf`):
    /// exp(x) = 2^k · p(r), k = round(x·log2 e), r = x − k·ln 2 in two parts,
    /// p a degree-7 polynomial; about 1 ulp, denormal results included.
    /// Fused multiply-adds where the target has them (half the instructions
    /// of a softmax's exponentials), and on AVX-512 `vscalefps` for 2^k · p,
    /// which rounds overflow to ∞ and underflow to denormals or 0 itself.
    pub(super) fn vector_expf(&self, x: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let ty = Ty::Elem(ElemType::F32);
        let t = self.ty_in(ty, mode);
        let c = |v: f64| self.const_of(ty, 0, v, mode);
        let mul = |a, b| self.arith(BinOp::Mul, a, b, ty);
        let add = |a, b| self.arith(BinOp::Add, a, b, ty);
        let fma = |a: BasicValueEnum<'ctx>, b: BasicValueEnum<'ctx>, c: BasicValueEnum<'ctx>| {
            self.call(self.intrinsic("llvm.fmuladd", &[t])?, &[a, b, c])
        };
        // Clamped by compares, not `maximum`/`minimum`: a NaN compares false
        // and passes through unchanged (and to the result) in two instructions.
        let clamp = |x, bound: f64, op: BinOp| -> R<BasicValueEnum<'ctx>> {
            let b = c(bound)?;
            let out = self.compare(op, x, b, ty)?;
            self.sel(out, b, x)
        };
        // Beyond 88.8 the result is ∞ and below −104 it is 0 (e^−104 is under half the least denormal).
        let xc = clamp(clamp(x, 88.8, BinOp::Gt)?, -104.0, BinOp::Lt)?;
        let k = self.call(self.intrinsic("llvm.roundeven", &[t])?, &[mul(xc, c(std::f64::consts::LOG2_E)?)?])?;
        let r = fma(k, c(-0.693359375)?, xc)?;
        let r = fma(k, c(2.121_944_4e-4)?, r)?;
        let mut poly = c(1.987_569_15e-4)?;
        for coef in [1.398_199_950_7e-3, 8.333_451_907_3e-3, 4.166_579_589_4e-2, 1.666_666_545_9e-1, 5.000_000_120_1e-1]
        {
            poly = fma(poly, r, c(coef)?)?;
        }
        let p = add(fma(poly, mul(r, r)?, r)?, c(1.0)?)?;
        let lanes = mode.lanes().expect("vector mode");
        if let Some(y) = self.scalef(p, k, lanes)? {
            return Ok(y);
        }
        // 2^k = 2^(k>>1) · 2^(k - (k>>1)), each a biased exponent field, so
        // that k ∈ [-150, 128] (denormal results included) never overflows the field.
        let i32v = self.cx.i32_type().vec_type(lanes);
        // k is in [-150, 128] or NaN (then the result is NaN anyway): make it
        // a number so that the plain conversion is defined.
        let is_num = self.compare(BinOp::Eq, k, k, ty)?;
        let k = self.sel(is_num, k, c(0.0)?)?;
        let ki = self.b.build_float_to_signed_int(k.into_vector_value(), i32v, "k")?;
        let splat_i = |v: u64| VectorType::const_vector(&vec![self.cx.i32_type().const_int(v, false); lanes as usize]);
        let half = self.b.build_right_shift(ki, splat_i(1), true, "kh")?;
        let rest = self.b.build_int_sub(ki, half, "kr")?;
        let field = |e: VectorValue<'ctx>| -> R<BasicValueEnum<'ctx>> {
            let biased = self.b.build_int_add(e, splat_i(127), "e")?;
            let shifted = self.b.build_left_shift(biased, splat_i(23), "e")?;
            Ok(self.b.build_bit_cast(shifted, t, "pow2")?)
        };
        mul(mul(p, field(half)?)?, field(rest)?)
    }

    /// `p · 2^k` for f32 vectors in one AVX-512 `vscalefps` (k integral),
    /// rounded once, ∞ on overflow, denormal or 0 on underflow, NaN through;
    /// `None` on targets without it.
    fn scalef(&self, p: BasicValueEnum<'ctx>, k: BasicValueEnum<'ctx>, lanes: u32) -> R<Option<BasicValueEnum<'ctx>>> {
        self.avx512_masked("scalef.ps", "+avx512f", lanes * 32, vec![p, k])
    }

    /// `llvm.x86.avx512.mask.{op}.{width}` on `args` (vectors of `width`
    /// bits, then any immediate), with an undefined pass-through, every lane
    /// enabled and, at 512 bits, the current rounding mode; `None` where the
    /// target lacks `feature`, or AVX512VL for 128- and 256-bit vectors.
    fn avx512_masked(
        &self,
        op: &str,
        feature: &str,
        width: u32,
        mut args: Vec<BasicValueEnum<'ctx>>,
    ) -> R<Option<BasicValueEnum<'ctx>>> {
        let has = |f: &str| self.spec.features.split(',').any(|x| x == f);
        if !has(feature) || !(width == 512 || ((width == 128 || width == 256) && has("+avx512vl"))) {
            return Ok(None);
        }
        let f = self.intrinsic(&format!("llvm.x86.avx512.mask.{op}.{width}"), &[])?;
        let vt = args[0].into_vector_value().get_type();
        let mask = if vt.get_size() > 8 { self.cx.i16_type() } else { self.cx.i8_type() };
        args.push(vt.get_undef().into());
        args.push(mask.const_all_ones().into());
        if width == 512 {
            // _MM_FROUND_CUR_DIRECTION
            args.push(self.cx.i32_type().const_int(4, false).into());
        }
        Ok(Some(self.call(f, &args)?))
    }

    /// A call of libdevice function `name`, lane by lane in vector code
    /// (libdevice is scalar); f16 goes through f32.
    fn device_call(&self, name: &str, args: &[BasicValueEnum<'ctx>], ty: Ty) -> R<BasicValueEnum<'ctx>> {
        let Some(BasicValueEnum::VectorValue(first)) = args.first() else {
            return self.device_call_scalar(name, args, ty);
        };
        let i32t = self.cx.i32_type();
        let mut out = first.get_type().get_undef();
        for l in 0..first.get_type().get_size() {
            let at = i32t.const_int(l as u64, false);
            let lane: Vec<BasicValueEnum> = args
                .iter()
                .map(|v| self.b.build_extract_element(v.into_vector_value(), at, "lane"))
                .collect::<Result<_, _>>()?;
            let r = self.device_call_scalar(name, &lane, ty)?;
            out = self.b.build_insert_element(out, r, at, "lanes")?;
        }
        Ok(out.into())
    }

    fn device_call_scalar(&self, name: &str, args: &[BasicValueEnum<'ctx>], ty: Ty) -> R<BasicValueEnum<'ctx>> {
        let half = ty == Ty::Elem(ElemType::F16);
        let cty = if ty == Ty::Elem(ElemType::F64) { self.cx.f64_type() } else { self.cx.f32_type() };
        let params: Vec<BasicMetadataTypeEnum> = args.iter().map(|_| cty.into()).collect();
        let f = self
            .m
            .get_function(name)
            .unwrap_or_else(|| self.m.add_function(name, cty.fn_type(&params, false), Some(Linkage::External)));
        let mut wide = Vec::new();
        for &v in args {
            wide.push(if half { self.b.build_float_ext(v.into_float_value(), cty, "ext")?.into() } else { v });
        }
        let r = self.call(f, &wide)?;
        Ok(if half { self.b.build_float_trunc(r.into_float_value(), self.cx.f16_type(), "tr")?.into() } else { r })
    }

    /// A C math library call, lane by lane in vector code; f16 goes through f32.
    pub(super) fn libm(
        &self,
        name: &str,
        x: BasicValueEnum<'ctx>,
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let half = ty == Ty::Elem(ElemType::F16);
        let cty = if ty == Ty::Elem(ElemType::F64) { self.cx.f64_type() } else { self.cx.f32_type() };
        let f = self
            .m
            .get_function(name)
            .unwrap_or_else(|| self.m.add_function(name, cty.fn_type(&[cty.into()], false), Some(Linkage::External)));
        let one = |v: BasicValueEnum<'ctx>| -> R<BasicValueEnum<'ctx>> {
            let v = if half { self.b.build_float_ext(v.into_float_value(), cty, "ext")?.into() } else { v };
            let r = self.call(f, &[v])?;
            Ok(if half { self.b.build_float_trunc(r.into_float_value(), self.cx.f16_type(), "tr")?.into() } else { r })
        };
        match mode.lanes() {
            None => one(x),
            Some(l) => {
                let v = x.into_vector_value();
                let mut out = v.get_type().get_poison();
                for i in 0..l {
                    let idx = self.cx.i32_type().const_int(i as u64, false);
                    let e = self.b.build_extract_element(v, idx, "lane")?;
                    let r = one(e)?;
                    out = self.b.build_insert_element(out, r, idx, "lane")?;
                }
                Ok(out.into())
            }
        }
    }
}

/// The libdevice function computing `f` on `ty`, where LLVM's NVPTX
/// backend has no instruction for it (the rest are intrinsics it lowers).
fn libdevice_fn(f: MathFn, ty: Ty) -> Option<&'static str> {
    let double = ty == Ty::Elem(ElemType::F64);
    if !float_ty(ty) {
        return None;
    }
    Some(match (f, double) {
        (MathFn::Exp, false) => "__nv_expf",
        (MathFn::Exp, true) => "__nv_exp",
        (MathFn::Log, false) => "__nv_logf",
        (MathFn::Log, true) => "__nv_log",
        (MathFn::Tanh, false) => "__nv_tanhf",
        (MathFn::Tanh, true) => "__nv_tanh",
        (MathFn::Erf, false) => "__nv_erff",
        (MathFn::Erf, true) => "__nv_erf",
        (MathFn::Erfc, false) => "__nv_erfcf",
        (MathFn::Erfc, true) => "__nv_erfc",
        (MathFn::Pow, false) => "__nv_powf",
        (MathFn::Pow, true) => "__nv_pow",
        _ => return None,
    })
}
