//! The x86 backend against the interpreter: every example and std.nn
//! operator with the default schedule, the example schedules, and random
//! legal schedules, at sizes no tile divides.

use std::collections::HashMap;
use texc_compiler::interp;
use texc_compiler::{Bindings, Program, Session};
use texc_runtime::SplitMix64;
use texc_schedules::LoopFunc;
use texc_tests::rel_error;

fn check(name: &str, p: &Program, f: &LoopFunc, target: &str, seed: u64) {
    let args = || interp::bind_args(p, HashMap::new(), &[], seed).expect("binds");
    let want = interp::run(p, args()).expect("interp");
    let k =
        texc_codegen::compile(f, target).unwrap_or_else(|e| panic!("{name}: {e}\n{}", texc_schedules::ir::print(f)));
    let got = k.run(args()).expect("runs");
    for (w, g) in want.iter().zip(&got) {
        let err = rel_error(g, w);
        let tol = if w.dtype().is_float() { 1e-5 } else { 0.0 };
        assert!(err <= tol, "{name} on {target}: error {err:e}\n{}", texc_schedules::ir::print(f));
    }
}

#[test]
fn examples_with_default_schedules() {
    for (name, p) in texc_tests::example_programs(2e8) {
        let f = texc_schedules::schedule_and_lower(p.clone(), "x86-avx2", None).expect("schedules");
        check(&name, &p, &f, "x86-avx2", 3);
    }
}

#[test]
fn example_schedules_at_odd_sizes() {
    let cases: [(&str, Vec<(&str, i64)>); 3] = [
        ("examples/sgemm.tex", vec![("M", 37), ("K", 130), ("N", 70)]),
        ("examples/conv_resnet.tex", vec![("C", 5), ("H", 11), ("W", 19), ("K", 7)]),
        ("examples/conv_resnet.tex", vec![("N", 2), ("C", 3), ("H", 56), ("W", 56), ("K", 9)]),
    ];
    for (file, shapes) in cases {
        let (p, f) = texc_tests::example_with_its_schedule(file, &shapes);
        check(&format!("{file} {shapes:?}"), &p, &f, "x86-avx2", 6);
    }
}

#[test]
fn std_operators_with_default_schedules() {
    // AVX-512 code runs only where the CPU has it (CI machines do).
    let targets: &[&str] =
        if std::arch::is_x86_feature_detected!("avx512f") { &["x86-avx2", "x86-avx512"] } else { &["x86-avx2"] };
    for (name, p) in texc_tests::std_op_programs(11) {
        for &target in targets {
            let f = texc_schedules::schedule_and_lower(p.clone(), target, None).expect("schedules");
            check(&name, &p, &f, target, 4);
        }
    }
}

#[test]
fn example_schedule_of_matmul_at_odd_sizes() {
    for (m, k, n) in [(37, 19, 70), (64, 64, 64), (1, 1, 1), (33, 65, 129)] {
        let (p, f) = texc_tests::example_with_its_schedule("examples/matmul.tex", &[("M", m), ("K", k), ("N", n)]);
        check(&format!("matmul {m}x{k}x{n}"), &p, &f, "x86-avx2", 5);
    }
}

#[test]
fn random_legal_schedules_on_x86() {
    let mut rng = SplitMix64::new(7);
    for (file, kernel, shapes) in texc_tests::RANDOM_SCHEDULE_CASES {
        let base = texc_tests::random_case_program(file, kernel, shapes);
        for trial in 0..8 {
            let f = texc_tests::randomly_scheduled(&base, &mut rng);
            check(&format!("{file} trial {trial}"), &base, &f, "x86-avx2", trial);
        }
    }
}

#[test]
fn vector_exp_matches_the_interpreter_elementwise() {
    let src = "kernel e(X: f32[N = 64]) -> Y: f32[N] { Y[i] = exp(X[i]); }";
    let mut s = Session::new();
    let m = s.load_text("e.tex", src, None).expect("front end");
    let k = s.entry_kernel(m, None).expect("kernel");
    let p = texc_compiler::build_program(&s, k, &Bindings::default()).expect("specializes");
    let f = texc_schedules::schedule_and_lower(p.clone(), "x86-avx2", None).expect("schedules");
    let mut xs: Vec<f64> = (0..56).map(|i| -87.0 + 175.0 * i as f64 / 55.0).collect();
    xs.extend([0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 88.8, -95.0, -110.0]);
    let x = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![64], &xs);
    let args = || vec![interp::Arg::Tensor(x.clone())];
    let want = interp::run(&p, args()).expect("interp")[0].to_f64();
    let got = texc_codegen::compile(&f, "x86-avx2").expect("compiles").run(args()).expect("runs")[0].to_f64();
    for ((g, w), x) in got.iter().zip(&want).zip(&xs) {
        // Denormal results (below 2^-126) keep fewer significant bits.
        let tol = if w.abs() < 1.2e-38 { 1e-3 } else { 2e-7 };
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * w.abs();
        assert!(ok, "exp({x}) = {g}, interpreter says {w}");
    }
}
