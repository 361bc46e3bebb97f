//! Interpreter semantics that the language documents (docs/language.md),
//! checked value by value, and the kernels of LANGUAGE.md exactly as written.

use std::collections::HashMap;
use texc_compiler::Bindings;
use texc_runtime::{DType, Tensor};

/// Compile `src` (one kernel, default sizes) and run it on `inputs`.
fn eval(src: &str, inputs: &[(&str, Tensor)]) -> Vec<Tensor> {
    let (mut pl, k) = texc_tests::load_text("interp", "t.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
    let b = Bindings {
        input_shapes: inputs
            .iter()
            .map(|(n, t)| (n.to_string(), t.shape.iter().map(|&d| d as i64).collect()))
            .collect(),
        ..Bindings::default()
    };
    let p = texc_tests::specialize(&mut pl, k, &b);
    let files: HashMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    let args = texc_compiler::interp::bind_args(&p, files, &[], 0).expect("binds");
    texc_compiler::interp::run(&p, args).expect("runs")
}

fn f32s(v: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F32, vec![v.len()], v)
}

fn i32s(v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I32, vec![v.len()], v)
}

#[test]
fn integer_division_is_floor_division_with_zero_divisors_defined() {
    let src = "kernel f(A: i32[N], B: i32[N]) -> (Q: i32[N], R: i32[N]) { Q[i] = A[i] / B[i]; R[i] = A[i] % B[i]; }";
    let out = eval(src, &[("A", i32s(&[7, -7, 7, -7, 5])), ("B", i32s(&[2, 2, -2, -2, 0]))]);
    assert_eq!(out[0].to_i64().expect("ints"), vec![3, -4, -4, 3, 0]);
    assert_eq!(out[1].to_i64().expect("ints"), vec![1, 1, -1, -1, 5]);
}

#[test]
fn casts_truncate_saturate_and_map_nan_to_zero() {
    let src = "kernel f(A: f32[N]) -> (Q: i8[N], U: u8[N]) { Q[i] = i8(A[i]); U[i] = u8(A[i]); }";
    let out = eval(src, &[("A", f32s(&[1.9, -1.9, 300.0, -300.0, f64::NAN]))]);
    assert_eq!(out[0].to_i64().expect("ints"), vec![1, -1, 127, -128, 0]);
    assert_eq!(out[1].to_i64().expect("ints"), vec![1, 0, 255, 0, 0]);
}

#[test]
fn integer_arithmetic_wraps_at_its_width() {
    let src = "kernel f(A: i8[N]) -> (B: i8[N], C: i32[N]) { B[i] = A[i] * A[i]; C[i] = i32(A[i]) * i32(A[i]); }";
    let out = eval(src, &[("A", Tensor::from_i64(DType::I8, vec![2], &[100, -128]))]);
    assert_eq!(out[0].to_i64().expect("ints"), vec![(10000i64 as i8) as i64, 0]);
    assert_eq!(out[1].to_i64().expect("ints"), vec![10000, 16384]);
}

#[test]
fn round_is_half_to_even_and_max_propagates_nan() {
    let src = "kernel f(A: f32[N]) -> (R: f32[N], M: f32[N]) { R[i] = round(A[i]); M[i] = max(A[i], 0.0); }";
    let out = eval(src, &[("A", f32s(&[0.5, 1.5, 2.5, -0.5, f64::NAN]))]);
    let r = out[0].to_f64();
    assert_eq!(&r[..4], &[0.0, 2.0, 2.0, -0.0]);
    assert!(out[1].to_f64()[4].is_nan());
}

#[test]
fn adaptable_integers_stay_exact_until_they_meet_a_float() {
    // C / G is integer floor division (7 / 2 = 3) before it meets the float.
    let src =
        "kernel f(A: f32[N = 1], const C: int = 7, const G: int = 2) -> B: f32[N] { B[i] = A[i] * (C / G) + 0.5 * i; }";
    let out = eval(src, &[("A", f32s(&[2.0]))]);
    assert_eq!(out[0].to_f64(), vec![6.0]);
}

#[test]
fn f16_values_round_on_store_and_literals_round_to_their_context() {
    let src = "kernel f(A: f16[N]) -> (B: f16[N], C: f32[N]) { B[i] = A[i] + 0.0001; C[i] = f32(A[i]) + 0.0001; }";
    let a = Tensor::from_f64(DType::F16, vec![1], &[1.0]);
    let out = eval(src, &[("A", a)]);
    assert_eq!(out[0].to_f64(), vec![1.0], "1 + f16(0.0001) rounds back to 1 in f16");
    assert!((out[1].to_f64()[0] - 1.0001).abs() < 1e-6);
}

#[test]
fn empty_reductions_give_the_identity() {
    let src = "kernel f(A: f32[N], const K: int = 0) -> (S: f32[N], M: f32[N]) {
        S[i] = A[i] + sum[k in 0..K](A[i]); M[i] = max[k in 0..K](A[i]); }";
    let out = eval(src, &[("A", f32s(&[3.0]))]);
    assert_eq!(out[0].to_f64(), vec![3.0]);
    assert_eq!(out[1].to_f64(), vec![f64::NEG_INFINITY]);
}

#[test]
fn reduction_ranges_may_start_above_zero() {
    let src = "kernel f(A: f32[N = 5]) -> S: f32 { S = sum[k in 2..N](A[k]); }";
    let out = eval(src, &[("A", f32s(&[1.0, 2.0, 3.0, 4.0, 5.0]))]);
    assert_eq!(out[0].to_f64(), vec![12.0]);
}

#[test]
fn linear_shape_expressions_are_solved_from_inputs() {
    let src = "kernel f(A: f32[2 * M + 1]) -> B: f32[M] { B[i] = A[2 * i + 1]; }";
    let out = eval(src, &[("A", f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))]);
    assert_eq!(out[0].to_f64(), vec![1.0, 3.0, 5.0]);
}

#[test]
fn overloads_are_chosen_by_rank_and_nested_calls_compose() {
    let src = "import std.nn;
kernel f(X: f32[N = 2, C = 3]) -> Y: f32[N, C] { Y = relu(sub(X, relu6(X))); }";
    let x = Tensor::from_f64(DType::F32, vec![2, 3], &[-1.0, 2.0, 7.0, 8.0, 0.5, -3.0]);
    let out = eval(src, &[("X", x)]);
    assert_eq!(out[0].to_f64(), vec![0.0, 0.0, 1.0, 2.0, 0.0, 0.0]);
}

#[test]
fn guarded_reads_are_never_performed_out_of_bounds() {
    // Both a `select` guard and a short-circuiting `&&` protect the read.
    let src = "kernel f(A: f32[N = 4]) -> B: f32[N + 2] {
        B[i] = select(i >= 1 && i < N + 1 && A[i - 1] > 0.0, A[i - 1], -1.0); }";
    let out = eval(src, &[("A", f32s(&[1.0, -2.0, 3.0, 4.0]))]);
    assert_eq!(out[0].to_f64(), vec![-1.0, 1.0, -1.0, 3.0, 4.0, -1.0]);
}

#[test]
fn the_kernels_of_the_language_spec_run_as_written() {
    let spec_matmul = "kernel matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j]);
}

schedule matmul for x86-avx2 {
    tile C(i, j) by (32, 64) -> (io, jo, ii, ji);
    split C.k by 4 -> (ko, ki);
    reorder C(io, jo, ko, ii, ki, ji);
    vectorize C.ji;
    unroll C.ki;
    parallel C.io;
}";
    let a = Tensor::from_f64(DType::F32, vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = Tensor::from_f64(DType::F32, vec![3, 1], &[1.0, 0.0, -1.0]);
    assert_eq!(eval(spec_matmul, &[("A", a), ("B", b)])[0].to_f64(), vec![-2.0, -2.0]);

    let spec_conv = "kernel conv2d(X: f32[N, C, H, W], Wt: f32[K, C, R, S], const pad: int = 1, const stride: int = 1)
    -> Y: f32[N, K, (H + 2*pad - R) / stride + 1, (W + 2*pad - S) / stride + 1] {
    Xp[n, c, y in 0..H + 2*pad, x in 0..W + 2*pad] =
        select(y >= pad && y < H + pad && x >= pad && x < W + pad, X[n, c, y - pad, x - pad], 0.0);
    Y[n, k, h, w] = sum[c, r, s](Xp[n, c, h*stride + r, w*stride + s] * Wt[k, c, r, s]);
}";
    let x = Tensor::from_f64(DType::F32, vec![1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let w = Tensor::from_f64(DType::F32, vec![1, 1, 3, 3], &[1.0; 9]);
    // Every output sees the whole 2×2 image through the padded 3×3 window.
    assert_eq!(eval(spec_conv, &[("X", x), ("Wt", w)])[0].to_f64(), vec![10.0; 4]);
}
