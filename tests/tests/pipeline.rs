//! The pipeline's seams: legalization keeps texc's integer semantics on
//! every backend, knob values reach schedules, targets are resolved in one
//! place, verifiers catch broken IR, and compiled kernels cross threads.

use std::collections::HashMap;
use texc_compiler::interp::{self, Arg};
use texc_compiler::target::{self, Target, TargetKind};
use texc_compiler::Bindings;
use texc_runtime::{DType, Tensor};

/// Edge values of an integer type: zero, ±1, ±2, small primes, the extremes.
fn edges(t: DType) -> Vec<i64> {
    let (lo, hi) = match t {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    };
    let mut v = vec![0, 1, -1, 2, -2, 3, -3, 7, -7, lo, lo + 1, hi, hi - 1];
    v.retain(|x| *x >= lo && *x <= hi);
    v
}

/// A guard that the loop ranges decide is dropped (`guards.rs`): on
/// x86-avx512 a 784-column product is 6 blocks of 4 panels of 32 and a last
/// panel of 16; the full blocks keep no `j < 784` test (which made every
/// vector a masked one), the last panel's loops stop at its 16 columns
/// instead of testing 32, and the result is the interpreter's on every
/// runnable backend.
#[test]
fn guards_the_loop_ranges_decide_are_dropped() {
    let src =
        "import std.nn;\nkernel mm(A: f32[M = 128, K = 300], B: f32[K, N = 784]) -> C: f32[M, N] { C = matmul(A, B); }";
    let (mut pl, k) = texc_tests::load_text("x86-avx512", "mm.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let f = texc_tests::loops(&mut pl, k, &p);
    let text = texc_schedules::ir::print(&f);
    // One launch (`launches`): the full blocks' branch, then the last one's.
    let full_block = text.split("if j.oo >= 6:").next().and_then(|t| t.split("if j.oo < 6:").nth(1));
    let full_block = full_block.expect("the full blocks' branch");
    assert!(!full_block.contains("if "), "the full blocks are unguarded:\n{text}");
    assert!(!text.contains("< 784"), "the last panel is cut to its columns:\n{text}");
    assert!(text.contains("j.v in 0..16 vectorized"), "the last panel's 16 columns:\n{text}");
    let mut rng = texc_runtime::SplitMix64::new(3);
    let mut t = |shape: Vec<usize>| {
        let n = shape.iter().product();
        Tensor::from_f64(DType::F32, shape, &(0..n).map(|_| rng.next_f64() - 0.5).collect::<Vec<_>>())
    };
    let args = vec![Arg::Tensor(t(vec![128, 300])), Arg::Tensor(t(vec![300, 784]))];
    let want = interp::run(&p, args.clone()).expect("interp");
    let (targets, _) = texc_tests::runnable_targets();
    for target in &targets {
        let (mut pl, k) = texc_tests::load_text(target.name, "mm.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args.clone()).expect("runs");
        let err = texc_pipeline::oracle::compare(&["C".into()], &got, &want, None);
        assert!(err[0].passed(), "{target}: relative error {}", err[0].error);
    }
}

/// A `select` whose condition the loop ranges decide becomes the operand
/// it picks (`guards.rs`), after `versioning.rs` cut the loops where its
/// comparisons are decided: a padding copy's interior rows and vectors, a
/// concatenation's two halves (along a fused loop: `c % 6 < 3` within one
/// block) and a reduction's full chunks read unmasked; a data-dependent
/// `select` stays. Odd sizes, against the interpreter on every runnable
/// backend.
#[test]
fn selects_the_loop_ranges_decide_are_folded() {
    let src = "kernel k(X: f32[C = 3, H = 11, W = 37], A: f32[C, H, W]) -> (P: f32[H + 2, W + 2], Cat: f32[1, 2 * C, H, W], S: f32[C, H, W], M: f32[C]) {
    P[y, x] = select(y >= 1 && y < H + 1 && x >= 1 && x < W + 1, X[1, y - 1, x - 1] * sigmoid(X[1, y - 1, x - 1]), 0.0);
    Cat[n, c, y, x] = select(c < C, X[c, y, x], A[c - C, y, x]);
    S[c, y, x] = select(X[c, y, x] > A[c, y, x], X[c, y, x], A[c, y, x]);
    M[c] = max[y, x](X[c, y, x]);
}";
    let mut rng = texc_runtime::SplitMix64::new(5);
    let mut t = |shape: Vec<usize>| {
        let n = shape.iter().product();
        Tensor::from_f64(DType::F32, shape, &(0..n).map(|_| rng.next_f64() * 4.0 - 2.0).collect::<Vec<_>>())
    };
    let args = vec![Arg::Tensor(t(vec![3, 11, 37])), Arg::Tensor(t(vec![3, 11, 37]))];
    for name in ["x86-avx2", "x86-avx512"] {
        let (mut pl, k) = texc_tests::load_text(name, "k.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let text = texc_schedules::ir::print(&f);
        let stores =
            |t: &str| text.lines().filter(move |l| l.trim_start().starts_with(&format!("{t}["))).collect::<Vec<_>>();
        let (padded, cat, s) = (stores("P"), stores("Cat"), stores("S"));
        assert!(
            padded.iter().any(|l| l.contains("sigmoid") && !l.contains("select")),
            "{name}: an unmasked interior:\n{text}"
        );
        assert!(
            padded.iter().any(|l| !l.contains("select") && l.ends_with("= 0.0f32")),
            "{name}: zero border rows:\n{text}"
        );
        for half in ["= X[", "= A["] {
            assert!(cat.iter().any(|l| l.contains(half) && !l.contains("select")), "{name}: `{half}` alone:\n{text}");
        }
        assert!(s.iter().all(|l| l.contains("select")), "{name}: data decides `S`:\n{text}");
        runs_like_the_interpreter(name, &p, &f, &args, &["P", "Cat", "S", "M"], None);
    }
}

/// `f`, the loops of `p` for target `name`, run on every runnable target
/// that runs them (`name` itself, `host`, Cranelift), give the
/// interpreter's `outputs` of `p` within `tolerance`.
fn runs_like_the_interpreter(
    name: &str,
    p: &texc_compiler::tir::Program,
    f: &texc_schedules::LoopFunc,
    args: &[Arg],
    outputs: &[&str],
    tolerance: Option<f64>,
) {
    let (runnable, _) = texc_tests::runnable_targets();
    let want = interp::run(p, args.to_vec()).expect("interp");
    let names: Vec<String> = outputs.iter().map(|s| s.to_string()).collect();
    for target in runnable.iter().filter(|t| t.name == name || t.name == "host" || t.name == "cranelift") {
        let got = texc_tests::compile_loops(target, f).expect("compiles").run(args.to_vec()).expect("runs");
        for e in texc_pipeline::oracle::compare(&names, &got, &want, tolerance) {
            assert!(e.passed(), "{name} loops on {target}: `{}` relative error {}", e.name, e.error);
        }
    }
}

/// A convolution over 17 × 17 pixels (289: 10 panels of 32 lanes on
/// AVX-512, 19 of 16 on AVX2, each ending in a panel of one pixel): its
/// column blocks split the panels evenly between the two cores of the
/// nominal machine (5 and 5 on AVX-512; 9 and 9 + the one-pixel panel on
/// AVX2, in one launch: not 4 and 4 + 2, or 8 and 8 + 3), and the last panel's
/// loops run one lane, not 32 or 16 guarded ones. Results equal the
/// interpreter's on every runnable backend.
#[test]
fn column_blocks_share_the_panels_evenly() {
    let src = "import std.nn;
kernel k(X: f32[1, C = 24, H = 17, W = 17], F: f32[K = 24, C, 7, 1], B: f32[K]) -> Y: f32[1, K, H, W] {
    Xp = pad(X, b0 = 0, b1 = 0, b2 = 3, b3 = 0, a0 = 0, a1 = 0, a2 = 3, a3 = 0);
    Y = relu(conv2d_bias(Xp, F, B));
}";
    let mut rng = texc_runtime::SplitMix64::new(11);
    let mut random = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.next_f64() * 2.0 - 1.0).collect() };
    let args = vec![
        Arg::Tensor(Tensor::from_f64(DType::F32, vec![1, 24, 17, 17], &random(24 * 289))),
        Arg::Tensor(Tensor::from_f64(DType::F32, vec![24, 24, 7, 1], &random(24 * 24 * 7))),
        Arg::Tensor(Tensor::from_f64(DType::F32, vec![24], &random(24))),
    ];
    for (name, blocks) in [
        ("x86-avx512", ["h.w.oo in 0..2 parallel", "(h.w.oo * 5 + h.w.oi) * 32"]),
        ("x86-avx2", ["h.w.oo in 0..3 parallel", "(h.w.oo * 9 + h.w.oi) * 16"]),
    ] {
        let (mut pl, k) = texc_tests::load_text(name, "k.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let text = texc_schedules::ir::print(&f);
        for want in blocks.iter().chain(&["h.w.v in 0..1 vectorized"]) {
            assert!(text.contains(want), "{name}: `{want}` expected:\n{text}");
        }
        runs_like_the_interpreter(name, &p, &f, &args, &["Y"], None);
    }
}

/// Max pools (std.nn's with and without padding, of stride 1 and 2, and a
/// `u8` window written out) run as a maximum over rows and then one over
/// columns (`schedules::separable`); a window whose column index moves with
/// its row stays one reduction. Results equal the interpreter's on every
/// runnable backend at sizes no vector width divides.
#[test]
fn window_maxima_run_as_rows_then_columns() {
    let src = "import std.nn;
kernel k(X: f32[1, C = 3, H = 17, W = 37], Q: u8[1, C, H, W]) -> (P: f32[1, C, 9, 19], S: f32[1, C, H, W], T: f32[1, C, 8, 18], B: u8[C, 8, 18], D: f32[C, 15, 33]) {
    P = max_pool2d(X, 3, stride = 2, pad = 1);
    S = max_pool2d(X, 3, stride = 1, pad = 1);
    T = max_pool2d(X, 2);
    B[c, h, w] = max[r in 0..2, s in 0..2](Q[0, c, 2 * h + r, 2 * w + s]);
    D[c, y, x] = max[r in 0..3, s in 0..3](X[0, c, y + r, x + s + 2 - r]);
}";
    let mut rng = texc_runtime::SplitMix64::new(7);
    let x: Vec<f64> = (0..3 * 17 * 37).map(|_| rng.next_f64() * 4.0 - 2.0).collect();
    let q: Vec<f64> = (0..3 * 17 * 37).map(|_| (rng.next_f64() * 256.0).floor()).collect();
    let args = vec![
        Arg::Tensor(Tensor::from_f64(DType::F32, vec![1, 3, 17, 37], &x)),
        Arg::Tensor(Tensor::from_f64(DType::U8, vec![1, 3, 17, 37], &q)),
    ];
    for name in ["x86-avx2", "x86-avx512"] {
        let (mut pl, k) = texc_tests::load_text(name, "k.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let text = texc_schedules::ir::print(&f);
        for t in ["P", "S", "T", "B"] {
            assert!(text.contains(&format!("local {t}.rows")), "{name}: `{t}` by rows, then columns:\n{text}");
        }
        assert!(!text.contains("D.rows"), "{name}: `D`'s window is not separable:\n{text}");
        runs_like_the_interpreter(name, &p, &f, &args, &["P", "S", "T", "B", "D"], Some(0.0));
    }
}

/// Index arithmetic below zero (`x - 3` over a loop variable, a padded
/// image's index) divided by a constant: legalization shifts the dividend up
/// by a multiple of the divisor so that unsigned division applies (no
/// truncating division and sign fix-up is left), and the results — quotients
/// and remainders of negative values among them — equal the interpreter's
/// on every runnable backend, at sizes no vector width divides.
#[test]
fn floor_division_of_indices_below_zero() {
    let src = "kernel d(A: f32[C = 3, T = 9]) -> (Y: f32[C, X = 37], Q: i64[X], R: i64[X]) {
    Y[c, x] = select(x >= 3 && x < 35, A[c, (x - 3) / 4] + f32((x - 3) % 4), 0.0);
    Q[x] = (x - 7) / 3 + (2 * x - 5) / 4;
    R[x] = (x - 7) % 3 + (x - 1) % 8;
}";
    let (targets, _) = texc_tests::runnable_targets();
    let a: Vec<f64> = (0..27).map(|i| i as f64 * 0.5 - 3.0).collect();
    let args = || vec![Arg::Tensor(Tensor::from_f64(DType::F32, vec![3, 9], &a))];
    for t in &targets {
        let (mut pl, k) = texc_tests::load_text(t.name, "d.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let want = interp::run(&p, args()).expect("interp");
        let f = texc_tests::loops(&mut pl, k, &p);
        let text = texc_schedules::ir::print(&f);
        assert!(!text.contains("@tdiv") && !text.contains("@trem"), "{t}: only unsigned division is left:\n{text}");
        let compiled = texc_tests::compile_loops(t, &f).expect("compiles").run(args()).expect("runs");
        assert_eq!(compiled, want, "{t}");
    }
}

/// `a / b` and `a % b` (and by constants) for every pair of edge values of
/// every integer type: the interpreter, the legalized loop nest on the loop
/// evaluator, and each runnable backend agree exactly.
#[test]
fn floor_division_is_the_same_everywhere() {
    let (targets, _) = texc_tests::runnable_targets();
    for ty in [DType::I8, DType::U8, DType::I32, DType::I64] {
        let e = edges(ty);
        let n = e.len() * e.len();
        let (a, b): (Vec<i64>, Vec<i64>) = e.iter().flat_map(|&x| e.iter().map(move |&y| (x, y))).unzip();
        let src = format!(
            "kernel d(A: {ty}[N = {n}], B: {ty}[N]) -> (Q: {ty}[N], R: {ty}[N], Q3: {ty}[N], Rm3: {ty}[N], Q1: {ty}[N]) {{
    Q[i] = A[i] / B[i];
    R[i] = A[i] % B[i];
    Q3[i] = A[i] / 3;
    Rm3[i] = A[i] % {m3};
    Q1[i] = A[i] / {m1};
}}",
            m3 = if ty == DType::U8 { "5" } else { "(0 - 3)" },
            m1 = if ty == DType::U8 { "1" } else { "(0 - 1)" },
        );
        let args =
            || vec![Arg::Tensor(Tensor::from_i64(ty, vec![n], &a)), Arg::Tensor(Tensor::from_i64(ty, vec![n], &b))];
        for t in &targets {
            let (mut pl, k) = texc_tests::load_text(t.name, "d.tex", &src, None).unwrap_or_else(|e| panic!("{e}"));
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            let want = interp::run(&p, args()).expect("interp");
            let f = texc_tests::loops(&mut pl, k, &p);
            assert!(!texc_schedules::ir::print(&f).contains(" / B"), "legalized: no floor division left");
            let evaluated = texc_schedules::eval::run(&f, args()).expect("loop evaluator");
            let compiled = texc_tests::compile_loops(t, &f).expect("compiles").run(args()).expect("runs");
            for (o, w) in want.iter().enumerate() {
                assert_eq!(&evaluated[o], w, "{ty} output {o}: legalized loop nest on the evaluator");
                assert_eq!(&compiled[o], w, "{ty} output {o} on {t}");
            }
        }
    }
}

fn runs_here(t: &Target) -> bool {
    t.check_runs_here().is_ok()
}

#[test]
fn targets_are_resolved_in_one_place() {
    let err = target::lookup("x86-sse").expect_err("unknown");
    assert!(
        err.to_string().contains(
            "targets: interp, x86-avx2, x86-avx512, x86-avx2-vnni, x86-avx512-vnni, x86-avx512-amx, host, cranelift"
        ),
        "{err}"
    );
    let avx2 = target::lookup("x86-avx2").expect("known");
    assert_eq!((avx2.lanes(DType::F32), avx2.lanes(DType::F64), avx2.lanes(DType::I8)), (8, 4, 32));
    let avx512 = target::lookup("x86-avx512").expect("known");
    assert_eq!((avx512.lanes(DType::F32), avx512.vector_registers), (16, 32));
    // `host` reads the CPU: AVX-512 lanes exactly where the CPU has AVX-512.
    let host = target::lookup("host").expect("known");
    let wide = ["avx512f", "avx512vl", "avx512bw", "avx512dq"].iter().all(|f| target::cpu_has(f));
    assert_eq!(host.lanes(DType::F32), if wide { 16 } else { 8 });
    assert!(runs_here(host));
    assert_eq!(avx512.lineage().iter().map(|t| t.name).collect::<Vec<_>>(), ["x86-avx512", "x86-avx2"]);
    let gpu = target::lookup("nvptx-sm90").expect("described");
    assert_eq!(gpu.backend().expect("compiles"), target::BackendKind::Nvptx);
    match (texc_runtime::cuda::device(), gpu.check_runs_here()) {
        (Ok(d), r) => assert_eq!(r.is_ok(), d.sm >= 90, "{} is sm_{}", d.name, d.sm),
        (Err(_), r) => assert!(r.expect_err("no GPU").to_string().contains("--emulate-gpu")),
    }
}

/// Knobs give tunables their values; an unknown knob and a value outside a
/// `tune` list are errors, the latter at the `tune` statement.
#[test]
fn knobs_reach_the_schedule() {
    let src =
        "kernel mm(A: f32[M = 64, K = 32], B: f32[K, N = 64]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]); }
schedule mm for x86-avx2 {
    tune tj in [8, 16, 32];
    split C.j by ?tj -> (jo, ji);
    split C.i by ?ti -> (io, ii);
    reorder C(io, jo, k, ii, ji);
    vectorize C.ji;
}";
    let lowered = |knobs: &[(&str, i64)]| {
        let (mut pl, k) = texc_tests::load_text("x86-avx2", "k.tex", src, None).expect("front end");
        pl.options.knobs = knobs.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        pl.schedule(k, p)
            .and_then(|s| pl.lower(s))
            .map(|f| texc_schedules::ir::print(&f))
            .map_err(|e| texc_tests::rendered(&pl, e))
    };
    let default = lowered(&[]).expect("defaults");
    assert!(default.contains("for ji in 0..8 vectorized") && default.contains("for ii in 0..32"), "{default}");
    let tuned = lowered(&[("tj", 32), ("ti", 5)]).expect("tuned");
    assert!(tuned.contains("for ji in 0..32 vectorized") && tuned.contains("for ii in 0..5"), "{tuned}");
    let unknown = lowered(&[("tk", 4)]).expect_err("unknown knob");
    assert!(unknown.contains("knob `tk` is not a tunable") && unknown.contains("its tunables: ti, tj"), "{unknown}");
    let outside = lowered(&[("tj", 12)]).expect_err("not a candidate");
    assert!(outside.contains("not one of its candidates [8, 16, 32]") && outside.contains("k.tex:3:"), "{outside}");
}

/// The schedule verifier rejects what lowering cannot handle.
#[test]
fn schedule_verifier_catches_broken_schedules() {
    let p = texc_tests::compile("examples/matmul.tex", None, &Bindings::default()).expect("compiles");
    let mut s = texc_schedules::schedule::Schedules::new(&p);
    s.verify(&p).expect("a fresh schedule is fine");
    let leaf = s.stages[0].leaves[0];
    s.stages[0].leaves.push(leaf);
    let twice = s.verify(&p).expect_err("twice");
    assert_eq!(twice.stage.as_deref(), Some("C"), "{twice}");
    assert!(twice.fault.contains("appears twice"), "{twice}");
    s.stages[0].leaves.clear();
    assert!(s.verify(&p).expect_err("uncovered").fault.contains("is not covered"));
}

/// The verifiers' errors are typed and name what is at fault: the stage
/// and expression node of a tensor program, the loop or buffer of a nest.
#[test]
fn verifier_errors_name_what_is_at_fault() {
    use texc_compiler::verify::{ExprFault, TirError};
    use texc_schedules::verify::LoopError;
    let mut p = texc_tests::compile("examples/matmul.tex", None, &Bindings::default()).expect("compiles");
    let value = p.stages[0].value;
    let st = p.stages[0].clone();
    p.exprs[value.0 as usize] = texc_compiler::tir::TExpr::Var(st.vars.len() as u32 + 3);
    match texc_compiler::verify::verify(&p) {
        Err(TirError::Expr { stage: 0, tensor, node, fault: ExprFault::Var(_) }) => {
            assert_eq!((tensor.as_str(), node), ("C", value.0))
        }
        other => panic!("{other:?}"),
    }
    let p = texc_tests::compile("examples/matmul.tex", None, &Bindings::default()).expect("compiles");
    let mut f = texc_tests::default_lowered("x86-avx2", &p);
    let texc_schedules::ir::Stmt::For { var, .. } = f.body[0].clone() else { panic!("a loop") };
    f.body.push(f.body[0].clone());
    assert_eq!(texc_schedules::verify::verify(&f), Err(LoopError::BoundTwice(f.vars[var as usize].name.clone())));
}

/// A kernel compiled on one thread runs on others, concurrently: the
/// example's CPU schedule on CPU targets, the default schedule on GPUs.
#[test]
fn compiled_kernels_cross_threads() {
    let (p, cpu) = texc_tests::example_with_its_schedule("examples/matmul.tex", &[("M", 33), ("K", 17), ("N", 40)]);
    let args = || interp::bind_args(&p, HashMap::new(), &[], 3).expect("binds");
    let want = interp::run(&p, args()).expect("interp");
    for t in texc_tests::runnable_targets().0 {
        let f = if t.kind == TargetKind::Gpu { texc_tests::default_lowered(t.name, &p) } else { cpu.clone() };
        let compiled = std::thread::scope(|s| s.spawn(|| texc_tests::compile_loops(t, &f).expect("compiles")).join())
            .expect("compile thread");
        let compiled = std::sync::Arc::new(compiled);
        let outs: Vec<Vec<Tensor>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|_| {
                    let k = compiled.clone();
                    let a = args();
                    s.spawn(move || k.run(a).expect("runs"))
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("run thread")).collect()
        });
        for got in outs {
            assert!(texc_tests::rel_error(&got[0], &want[0]) <= 1e-5, "{t}");
        }
    }
}

/// Loop nests a target cannot run are refused before code generation,
/// whoever made them: a CPU schedule's `parallel` loops handed to a GPU
/// target through the pipeline's API (a GPU's backend has no thread pool;
/// its code generator once panicked on them, seen only on a real GPU, as
/// the CPU emulation runs any loop).
#[test]
fn nests_for_another_target_are_refused_before_codegen() {
    let (_, cpu) = texc_tests::example_with_its_schedule("examples/matmul.tex", &[("M", 33), ("K", 17), ("N", 40)]);
    assert!(texc_schedules::ir::print(&cpu).contains(" parallel:"), "{}", texc_schedules::ir::print(&cpu));
    for name in ["nvptx-sm80", "nvptx-sm90"] {
        let t = target::lookup(name).expect("registered");
        let err = texc_tests::compile_loops(t, &cpu).err().expect("refused");
        assert!(err.contains("cannot run on") && err.contains("is parallel, which target"), "{name}: {err}");
        let mut pl = texc_tests::pipeline(name);
        let legal = pl.legalize(cpu.clone()).expect("legalizes");
        let e = pl.emit_text(&legal, "ptx").expect_err("refused");
        let err = texc_tests::rendered(&pl, e);
        assert!(err.contains("is parallel, which target"), "{name}: {err}");
        let e = pl.emit_gpu(&[&legal]).expect_err("refused");
        let err = texc_tests::rendered(&pl, e);
        assert!(err.contains("is parallel, which target"), "{name}: {err}");
    }
}

/// Every pass dumps, verifies and times; the dump of a chosen pass shows its IR.
#[test]
fn every_pass_is_timed_and_dumped() {
    let (mut pl, k) = texc_tests::load_file("x86-avx2", "examples/softmax.tex", None).expect("loads");
    let (_, loops) = pl.build(k, &Bindings::default()).expect("builds");
    pl.compile(&loops.legal).expect("compiles");
    let timed: Vec<&str> = pl.timings().iter().map(|t| t.pass.name()).collect();
    let prepare = texc_schedules::prepare::steps(pl.target()).iter().map(|s| s.name);
    let mut want: Vec<&str> = vec!["parse", "resolve", "specialize", "rewrite"];
    want.extend(prepare);
    want.extend([
        "schedule",
        "lower",
        "zero",
        "forward",
        "one-launch",
        "legalize",
        "prefetch",
        "keep-rolled",
        "codegen",
    ]);
    assert_eq!(timed, want);
    let table = pl.timing_table();
    assert!(table.contains("legalize") && table.contains("rfactor") && table.contains("total"), "{table}");
    // GPU targets run their own preparation passes, and the loop-IR passes of bound loops.
    let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "examples/softmax.tex", None).expect("loads");
    pl.build(k, &Bindings::default()).expect("builds");
    let timed: Vec<&str> = pl.timings().iter().map(|t| t.pass.name()).collect();
    for pass in ["im2col", "tensorize", "cross-thread", "multistage", "pad-ldmatrix"] {
        assert!(timed.contains(&pass), "{pass} in {timed:?}");
    }
    assert!(!["rfactor", "prefetch", "forward", "keep-rolled"].iter().any(|p| timed.contains(p)), "{timed:?}");
    // Each pass's dump is asked for by its name.
    for pass in ["rfactor", "cross-thread", "zero"] {
        assert!(texc_pipeline::Dump::parse(pass).is_ok(), "{pass}");
    }
}

/// A library caller compiles what `texc run` runs: `use_tuning_db` takes
/// the best valid record's knobs of the kernel at its sizes, leaves knobs
/// given by the caller alone, and reports the invalid records it skipped.
#[test]
fn the_pipeline_takes_the_tuning_databases_knobs() {
    use texc_schedules::tuning::db::{Db, Measured, Record};
    let src = "kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]); }";
    let (mut pl, k) = texc_tests::load_text("x86-avx2", "mm.tex", src, None).expect("loads");
    let shapes = ["M", "K", "N"].iter().map(|n| (n.to_string(), 64)).collect();
    let b = Bindings { shapes, ..Bindings::default() };
    let ts = pl.tunables(k);
    let t = ts.first().expect("the default schedule has knobs");
    let written = pl.specialize(k, &b).expect("specializes");
    let dir = texc_tests::scratch("db");
    std::fs::create_dir_all(&dir).expect("dir");
    let db = Db::new(dir.join("db.jsonl"));
    let record = |value: i64, time_ms: f64| Record {
        key: pl.tuning_key(k, &written),
        kernel: "mm".into(),
        texc_version: texc_pipeline::tuning::TEXC_VERSION.into(),
        knobs: vec![(t.name.clone(), value)],
        space: Some(texc_schedules::tuning::space::table(&ts)),
        schedule: String::new(),
        time_ms,
        measured: Measured { runs: 1, warmup: 0, threads: 1, duel: None },
        unix_time: 0,
        plan: None,
    };
    let (slow, fast) = (t.candidates[0], *t.candidates.last().expect("candidates"));
    db.append(&record(slow, 2.0)).expect("writes");
    db.append(&record(fast, 1.0)).expect("writes");
    db.append(&record(-5, 0.5)).expect("writes");
    let used = pl.use_tuning_db(&db, k, &b).expect("reads");
    assert_eq!(used.knobs_of.as_ref().map(|r| r.time_ms), Some(1.0), "the fastest valid record");
    assert_eq!(pl.options.knobs.get(&t.name), Some(&fast));
    assert!(used.skipped.is_some_and(|s| s.contains("skipped 1 invalid record")));
    // Knobs given by the caller win; the database then only corrects the cost model.
    pl.options.knobs = [(t.name.clone(), slow)].into_iter().collect();
    let used = pl.use_tuning_db(&db, k, &b).expect("reads");
    assert!(used.knobs_of.is_none());
    assert_eq!(pl.options.knobs.get(&t.name), Some(&slow));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tuner's search runs from the library with any way of measuring:
/// here a model of the machine in which the time falls with the first
/// knob's value. A space smaller than the trials is measured whole,
/// candidate zero first; every measurement is recorded; the fastest wins
/// its head-to-head and the database then holds it as the kernel's best.
#[test]
fn the_tuners_search_runs_with_any_measure() {
    use texc_pipeline::tune::{Knobs, Measure, Measurement, TuneEvents, TuneSettings, TuneStart};
    use texc_schedules::tuning::db::Db;
    struct Model(usize);
    impl Measure for Model {
        fn measure(&mut self, batch: &[Knobs], _: bool, _: Option<f64>) -> Vec<Result<Measurement, String>> {
            self.0 += batch.len();
            batch.iter().map(|k| Ok((100.0 / (1 + k.first().map_or(0, |(_, v)| *v)) as f64, None, false))).collect()
        }
        fn runs(&self) -> (u64, u64) {
            (1, 0)
        }
    }
    #[derive(Default)]
    struct Seen(Vec<usize>, Option<u64>, usize);
    impl TuneEvents for Seen {
        fn started(&mut self, s: &TuneStart) {
            self.1 = Some(s.points);
        }
        fn trial(&mut self, n: usize, _: &Knobs, _: &Result<f64, String>, _: f64) {
            self.0.push(n);
        }
        fn note(&mut self, _: &str) {}
        fn searched(&mut self, duplicates: usize) {
            self.2 = duplicates;
        }
    }
    let src = "kernel t(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * 2.0; }\n\
               schedule t for x86-avx2 { tune ti in [4, 8, 16]; split Y.i by ?ti -> (io, ii); }";
    let (mut pl, k) = texc_tests::load_text("x86-avx2", "t.tex", src, None).expect("loads");
    let b = Bindings { shapes: vec![("N".into(), 64)], ..Bindings::default() };
    let dir = texc_tests::scratch("tune");
    std::fs::create_dir_all(&dir).expect("dir");
    let db = Db::new(dir.join("db.jsonl"));
    let settings = TuneSettings { trials: 10, time_budget: 60.0, seed: 1, shard: None, jobs: 1, no_model: true };
    let (mut measure, mut seen) = (Model(0), Seen::default());
    let o = pl.tune((k, &b), &db, &settings, &mut measure, &mut seen).expect("tunes");
    assert_eq!(seen.1, Some(3), "three points");
    assert_eq!(o.trials.len(), 3, "the whole space, once each");
    assert_eq!(seen.0, vec![1, 2, 3]);
    assert_eq!(o.trials[0].knobs, o.zero, "candidate zero first");
    assert_eq!(o.zero, vec![("ti".to_string(), 4)]);
    let h = o.head_to_head.as_ref().expect("the fastest challenges the default");
    assert_eq!(h.winner.0, vec![("ti".to_string(), 16)]);
    assert_eq!(o.kept, Some(vec![("ti".to_string(), 16)]), "the database's best is the winner");
    assert_eq!(measure.0, 3 + 2 * 3, "three trials, three rounds of two");
    // A second search continues the first: nothing left to measure.
    let o = pl.tune((k, &b), &db, &settings, &mut Model(0), &mut Seen::default()).expect("tunes");
    assert!(o.trials.iter().all(|t| t.from_db));
    let _ = std::fs::remove_dir_all(&dir);
}
