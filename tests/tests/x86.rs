//! The x86 backend against the interpreter: every example and std.nn
//! operator with the default schedule, the example schedules, and random
//! legal schedules, at sizes no tile divides.

use std::collections::HashMap;
use texc_compiler::interp;
use texc_compiler::{Bindings, Program, Session};
use texc_runtime::SplitMix64;
use texc_schedules::schedule::Schedules;
use texc_schedules::{lower, normalize, LoopFunc};
use texc_tests::{compile, rel_error, root};

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
        let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
        let mut s = Session::new();
        let m = s.load_root(&root().join(file)).expect("loads");
        let k = s.entry_kernel(m, None).expect("kernel");
        let p = texc_compiler::build_program(&s, k, &b).expect("specializes");
        let sched = texc_schedules::find_schedule(&s, k, "x86-avx2").expect("schedule");
        let f = texc_schedules::schedule_and_lower(p.clone(), "x86-avx2", Some(sched)).expect("applies");
        check(&format!("{file} {shapes:?}"), &p, &f, "x86-avx2", 6);
    }
}

#[test]
fn std_operators_with_default_schedules() {
    let mut s = Session::new();
    let m = s.load_root(&root().join("tests/conformance/std_ops.tex")).expect("loads");
    for i in 0..s.module(m).kernels.len() {
        let k = texc_compiler::KernelRef { module: m as u32, index: i as u32 };
        let info = s.kernel(k);
        // Odd sizes; a few kernels need related ones.
        let shapes = info
            .symbols
            .iter()
            .map(|sym| {
                let v = match (info.name.as_str(), sym.name.as_str()) {
                    ("t_conv2d_groups", "Cg") => 3,
                    ("t_conv2d_groups", "K") => 4,
                    ("t_conv2d_groups", "C") => 6,
                    ("t_group_norm", "C") => 8,
                    ("t_conv2d", "R" | "S") => 3,
                    _ => 11,
                };
                (sym.name.clone(), v)
            })
            .collect();
        let b = Bindings { shapes, ..Bindings::default() };
        let p = texc_compiler::build_program(&s, k, &b).expect("specializes");
        // AVX-512 code runs only where the CPU has it (CI machines do).
        let targets: &[&str] =
            if std::arch::is_x86_feature_detected!("avx512f") { &["x86-avx2", "x86-avx512"] } else { &["x86-avx2"] };
        for &target in targets {
            let f = texc_schedules::schedule_and_lower(p.clone(), target, None).expect("schedules");
            check(&info.name, &p, &f, target, 4);
        }
    }
}

#[test]
fn example_schedule_of_matmul_at_odd_sizes() {
    for (m, k, n) in [(37, 19, 70), (64, 64, 64), (1, 1, 1), (33, 65, 129)] {
        let b = Bindings { shapes: vec![("M".into(), m), ("K".into(), k), ("N".into(), n)], ..Bindings::default() };
        let mut s = Session::new();
        let module = s.load_root(&root().join("examples/matmul.tex")).expect("loads");
        let kr = s.entry_kernel(module, None).expect("kernel");
        let p = texc_compiler::build_program(&s, kr, &b).expect("specializes");
        let sched = texc_schedules::find_schedule(&s, kr, "x86-avx2").expect("schedule");
        let f = texc_schedules::schedule_and_lower(p.clone(), "x86-avx2", Some(sched)).expect("applies");
        check(&format!("matmul {m}x{k}x{n}"), &p, &f, "x86-avx2", 5);
    }
}

#[test]
fn random_legal_schedules_on_x86() {
    let cases: [(&str, Option<&str>, Vec<(&str, i64)>); 4] = [
        ("examples/matmul.tex", None, vec![("M", 13), ("K", 7), ("N", 19)]),
        ("examples/conv2d.tex", None, vec![("C", 3), ("H", 9), ("W", 7), ("K", 5)]),
        ("examples/softmax.tex", None, vec![("N", 5), ("D", 21)]),
        ("examples/norms.tex", Some("ln"), vec![("N", 6), ("D", 17)]),
    ];
    let mut rng = SplitMix64::new(7);
    for (file, kernel, shapes) in cases {
        let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
        let base = compile(file, kernel, &b).expect("compiles");
        for trial in 0..8 {
            let mut p = base.clone();
            if rng.next_u64() % 2 == 0 {
                texc_schedules::default::default_inlining(&mut p);
            }
            normalize::hoist_reductions(&mut p);
            let mut s = Schedules::new(&p);
            for ss in &mut s.stages {
                texc_tests::random_schedule(ss, &mut rng);
            }
            let f = lower::lower(p, &s);
            check(&format!("{file} trial {trial}"), &base, &f, "x86-avx2", trial);
        }
    }
}
