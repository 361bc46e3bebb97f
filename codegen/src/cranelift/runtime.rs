//! Functions compiled Cranelift code calls where Cranelift has no
//! instruction: the C math library (by its C names, so that objects link
//! against libm like LLVM's do) and half-precision conversions (JIT only).

/// A callable symbol: name, address, parameter and result types.
pub(super) struct Symbol {
    pub name: &'static str,
    pub addr: *const u8,
}

macro_rules! unary {
    ($name:ident, $t:ty, $f:expr) => {
        extern "C" fn $name(x: $t) -> $t {
            let f: fn($t) -> $t = $f;
            f(x)
        }
    };
}

unary!(expf, f32, f32::exp);
unary!(exp, f64, f64::exp);
unary!(logf, f32, f32::ln);
unary!(log, f64, f64::ln);
unary!(tanhf, f32, f32::tanh);
unary!(tanh, f64, f64::tanh);
unary!(erff, f32, |x| libm_erf(x as f64) as f32);
unary!(erf, f64, libm_erf);
unary!(erfcf, f32, |x| libm_math(texc_compiler::ops::MathFn::Erfc, x as f64) as f32);
unary!(erfc, f64, |x| libm_math(texc_compiler::ops::MathFn::Erfc, x));

extern "C" fn powf(x: f32, y: f32) -> f32 {
    x.powf(y)
}

extern "C" fn pow(x: f64, y: f64) -> f64 {
    x.powf(y)
}

/// A math function as the interpreter computes it (in f64; the f32 forms round it).
fn libm_math(f: texc_compiler::ops::MathFn, x: f64) -> f64 {
    use texc_compiler::{semantics, tir::Ty, types::ElemType};
    semantics::math(f, Ty::Elem(ElemType::F64), &[semantics::V::F(x)]).f()
}

fn libm_erf(x: f64) -> f64 {
    libm_math(texc_compiler::ops::MathFn::Erf, x)
}

/// f16 bits to the f32 that holds the value in registers.
extern "C" fn texc_f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// An f32 holding an f16 value, to its bits (exact: the value is representable).
extern "C" fn texc_f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// Round an f32 to the nearest f16 value (the result of an f16 operation).
extern "C" fn texc_round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Round an f64 to the nearest f16 value, once.
extern "C" fn texc_f64_to_f16(x: f64) -> f32 {
    half::f16::from_f64(x).to_f32()
}

/// Names of the half-precision helpers (they exist only in the JIT).
pub(super) const HALF_HELPERS: [&str; 4] = ["texc_f16_to_f32", "texc_f32_to_f16", "texc_round_f16", "texc_f64_to_f16"];

/// Every symbol the JIT resolves for compiled code.
pub(super) fn symbols() -> Vec<Symbol> {
    let s = |name: &'static str, addr: *const u8| Symbol { name, addr };
    vec![
        s("expf", expf as *const u8),
        s("exp", exp as *const u8),
        s("logf", logf as *const u8),
        s("log", log as *const u8),
        s("tanhf", tanhf as *const u8),
        s("tanh", tanh as *const u8),
        s("erff", erff as *const u8),
        s("erf", erf as *const u8),
        s("erfcf", erfcf as *const u8),
        s("erfc", erfc as *const u8),
        s("powf", powf as *const u8),
        s("pow", pow as *const u8),
        s("texc_f16_to_f32", texc_f16_to_f32 as *const u8),
        s("texc_f32_to_f16", texc_f32_to_f16 as *const u8),
        s("texc_round_f16", texc_round_f16 as *const u8),
        s("texc_f64_to_f16", texc_f64_to_f16 as *const u8),
        s(crate::abi::PARALLEL_FOR, crate::abi::runtime_parallel_for()),
    ]
    .into_iter()
    .chain(crate::abi::runtime_local_memory().map(|(name, addr)| s(name, addr)))
    .collect()
}
