//! Schedules change speed, never results: default schedules of every
//! example and std operator, and random legal schedules of matmul, conv2d,
//! softmax and layer_norm, lowered to loop nests and run by the loop-nest
//! evaluator, must match the interpreter (at sizes no tile divides).

use std::collections::HashMap;
use texc_compiler::interp::{self, Arg};
use texc_compiler::{Bindings, Program, Session};
use texc_runtime::SplitMix64;
use texc_schedules::eval;
use texc_tests::rel_error;

fn random_args(p: &Program, seed: u64) -> Vec<Arg> {
    interp::bind_args(p, HashMap::new(), &[], seed).expect("binds")
}

fn assert_same(name: &str, p: &Program, f: &texc_schedules::LoopFunc, seed: u64) {
    let want = interp::run(p, random_args(p, seed)).expect("interp");
    let got = eval::run(f, random_args(p, seed)).expect("loop eval");
    for (w, g) in want.iter().zip(&got) {
        let err = rel_error(g, w);
        assert!(err <= 1e-5, "{name}: loop nest differs from interp by {err:e}\n{}", texc_schedules::ir::print(f));
    }
}

#[test]
fn default_schedules_match_the_interpreter() {
    for (name, p) in texc_tests::example_programs(2e7) {
        let f = texc_schedules::schedule_and_lower(p.clone(), "x86-avx2", None).expect("default schedule");
        assert_same(&name, &p, &f, 1);
    }
}

#[test]
fn example_schedules_match_the_interpreter() {
    let cases = [
        ("examples/matmul.tex", vec![("M", 37), ("K", 19), ("N", 70)]),
        ("examples/sgemm.tex", vec![("M", 37), ("K", 19), ("N", 70)]),
        ("examples/conv_resnet.tex", vec![("C", 5), ("H", 11), ("W", 19), ("K", 7)]),
    ];
    for (file, shapes) in cases {
        let (p, f) = texc_tests::example_with_its_schedule(file, &shapes);
        assert_same(file, &p, &f, 2);
    }
}

#[test]
fn random_legal_schedules_match_the_interpreter() {
    let mut rng = SplitMix64::new(99);
    for (file, kernel, shapes) in texc_tests::RANDOM_SCHEDULE_CASES {
        let base = texc_tests::random_case_program(file, kernel, shapes);
        for trial in 0..25 {
            let f = texc_tests::randomly_scheduled(&base, &mut rng);
            assert_same(&format!("{file} trial {trial}"), &base, &f, trial);
        }
    }
}

#[test]
fn illegal_schedules_are_spanned_errors() {
    let cases = [
        ("vectorize C.k;", "cannot vectorize `k`: it is a reduction axis"),
        ("parallel C.k;", "cannot parallelize `k`"),
        ("vectorize C.i;", "is not the innermost loop"),
        ("split C.q by 4 -> (a, b);", "`C` has no axis `q`"),
        ("split D.i by 4 -> (a, b);", "no stage named `D`"),
        ("split C.i by 4 -> (a, b); split C.i by 2 -> (c, d);", "already split or fused"),
        ("split C.i by 4 -> (j, b);", "already used"),
        ("fuse C(j, k) -> f;", "cannot fuse a spatial axis with a reduction axis"),
        ("fuse C(i, k) -> f;", "not adjacent"),
        ("inline C;", "cannot inline `C`: it is an output"),
        ("bind C.i to block.x;", "GPU primitive"),
        ("split C.i by 0 -> (a, b);", "at least 1"),
        ("cache_write C at C.k -> Cl;", "needs every reduction loop inside it, but `k` is outside"),
        ("reorder C(k, i, j); cache_write C at C.i -> Cl;", "but `k` is outside"),
        ("cache_write C at C.j in shared -> Cl;", "memory scope `shared` is for GPUs"),
        ("cache_write C at C.j -> A;", "already a tensor"),
        ("compute_at C C.i;", "not implemented yet"),
    ];
    for (prims, want) in cases {
        let src = format!(
            "kernel mm(A: f32[M = 8, K = 8], B: f32[K, N = 8]) -> C: f32[M, N] {{ C[i, j] = sum[k](A[i, k] * B[k, j]); }}\nschedule mm for x86-avx2 {{ {prims} }}"
        );
        let mut s = Session::new();
        let m = s.load_text("s.tex", &src, None).expect("front end accepts");
        let k = s.entry_kernel(m, None).expect("kernel");
        let p = texc_compiler::build_program(&s, k, &Bindings::default()).expect("specializes");
        let sched = texc_schedules::find_schedule(&s, k, "x86-avx2").expect("schedule");
        let d = texc_schedules::schedule_and_lower(p, "x86-avx2", Some(sched)).expect_err(prims);
        let text = texc_grammar::diagnostic::render_all(&[d], &s.sources);
        assert!(text.contains(want), "{prims}: expected `{want}` in\n{text}");
        assert!(text.contains("s.tex:2:"), "{prims}: not spanned:\n{text}");
    }
}

#[test]
fn cache_write_keeps_results() {
    let src =
        "kernel mm(A: f32[M = 37, K = 19], B: f32[K, N = 70]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]); }
schedule mm for x86-avx2 {
    tile C(i, j) by (6, 16) -> (io, jo, ii, ji);
    reorder C(io, jo, k, ii, ji);
    cache_write C at C.jo -> Cl;
    unroll C.ii; vectorize C.ji; parallel C.io;
}";
    let mut s = Session::new();
    let m = s.load_text("cw.tex", src, None).expect("front end");
    let k = s.entry_kernel(m, None).expect("kernel");
    let p = texc_compiler::build_program(&s, k, &Bindings::default()).expect("specializes");
    let sched = texc_schedules::find_schedule(&s, k, "x86-avx2").expect("schedule");
    let f = texc_schedules::schedule_and_lower(p.clone(), "x86-avx2", Some(sched)).expect("applies");
    assert!(texc_schedules::ir::print(&f).contains("local Cl: f32[6, 16]:"));
    assert_same("cache_write", &p, &f, 9);
    let got = texc_codegen::compile(&f, "x86-avx2").expect("compiles").run(random_args(&p, 9)).expect("runs");
    let want = interp::run(&p, random_args(&p, 9)).expect("interp");
    assert!(rel_error(&got[0], &want[0]) <= 1e-5);
}
