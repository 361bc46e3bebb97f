//! The conformance set every backend runs: each compiled target that this
//! machine can run, against the interpreter, on every example and std.nn
//! operator with its default schedule, the example schedules, and random
//! legal schedules (GPU ones for GPU targets, whose kernels run in the CPU
//! emulation), at sizes no tile divides. Targets come from the
//! registry, so a new target or backend is run here without being listed;
//! [`every_backend_runs_the_conformance_set`] fails if a backend has no
//! target that does.

use std::collections::HashMap;
use texc_codegen::{ArgRef, TensorMut, TensorRef};
use texc_compiler::interp;
use texc_compiler::target::{BackendKind, Target, TargetKind};
use texc_compiler::{Bindings, Program};
use texc_runtime::{AlignedBuf, DType, SplitMix64, Tensor};
use texc_schedules::LoopFunc;
use texc_tests::rel_error;

/// Tolerance of a backend's f32 results against the interpreter (which
/// computes in f64). Every backend must be listed.
fn tolerance(kind: BackendKind) -> f64 {
    match kind {
        BackendKind::Interp => 0.0,
        BackendKind::Llvm | BackendKind::Cranelift | BackendKind::Nvptx => 1e-5,
    }
}

fn targets() -> Vec<&'static Target> {
    let (run, skipped) = texc_tests::runnable_targets();
    for why in skipped {
        eprintln!("skipped: {why}");
    }
    run
}

fn check(name: &str, p: &Program, f: &LoopFunc, target: &Target, seed: u64) {
    let args = || interp::bind_args(p, HashMap::new(), &[], seed).expect("binds");
    let want = interp::run(p, args()).expect("interp");
    let k = texc_tests::compile_loops(target, f)
        .unwrap_or_else(|e| panic!("{name} on {target}: {e}\n{}", texc_schedules::ir::print(f)));
    let got = k.run(args()).expect("runs");
    let tol = tolerance(target.backend().expect("a compiled target"));
    for (w, g) in want.iter().zip(&got) {
        let err = rel_error(g, w);
        let tol = if w.dtype().is_float() { tol } else { 0.0 };
        assert!(err <= tol, "{name} on {target}: error {err:e}\n{}", texc_schedules::ir::print(f));
    }
    if k.runs_in_place() {
        let placed = in_place(&k, &args());
        for (i, (a, b)) in placed.iter().zip(&got).enumerate() {
            let (a, b) = (a.bytes(), b.bytes());
            if let Some(at) = (0..a.len()).find(|&j| a[j] != b[j]) {
                panic!("{name} on {target}: output {i} run in place differs from run at byte {at} of {}", a.len());
            }
        }
    }
}

fn tref(t: &Tensor) -> ArgRef<'_> {
    ArgRef::Tensor(TensorRef::of(t))
}

/// `k` run on memory the caller owns (no copies), its outputs filled with
/// garbage beforehand: `run_in_place` must zero them as `run` does.
fn in_place(k: &texc_codegen::Compiled, args: &[interp::Arg]) -> Vec<Tensor> {
    let refs: Vec<ArgRef<'_>> = args
        .iter()
        .map(|a| match a {
            interp::Arg::Tensor(t) => tref(t),
            interp::Arg::Scalar(v) => ArgRef::Scalar(*v),
        })
        .collect();
    let mut bufs: Vec<AlignedBuf> = k
        .output_shapes()
        .into_iter()
        .map(|(dtype, shape)| {
            let mut b = AlignedBuf::zeroed(dtype, shape).expect("memory");
            b.bytes_mut().fill(0x7f);
            b
        })
        .collect();
    let shapes: Vec<Vec<usize>> = bufs.iter().map(|b| b.shape.clone()).collect();
    let mut outs: Vec<TensorMut<'_>> = Vec::new();
    for (b, shape) in bufs.iter_mut().zip(&shapes) {
        outs.push(TensorMut { dtype: b.dtype, shape, bytes: b.bytes_mut() });
    }
    k.run_in_place(&refs, &mut outs).expect("runs in place");
    drop(outs);
    bufs.iter().map(AlignedBuf::to_tensor).collect()
}

/// `run_in_place` checks what it is given: the number of arguments, each
/// tensor's type, shape, size and alignment; nothing runs on bad memory.
#[test]
fn run_in_place_refuses_memory_that_does_not_fit() {
    let sizes = [("M", 5), ("K", 3), ("N", 4)].map(|(n, v)| (n.to_string(), v)).to_vec();
    let b = Bindings { shapes: sizes, ..Bindings::default() };
    let p = texc_tests::compile("examples/matmul.tex", None, &b).expect("specializes");
    let f = texc_tests::default_lowered("x86-avx2", &p);
    let k =
        texc_tests::compile_loops(texc_compiler::target::lookup("cranelift").expect("a target"), &f).expect("compiles");
    let args = interp::bind_args(&p, HashMap::new(), &[], 1).expect("binds");
    let good = in_place(&k, &args);
    assert_eq!(good, k.run(args.clone()).expect("runs"));
    let a = match &args[0] {
        interp::Arg::Tensor(t) => t,
        _ => unreachable!("matmul takes tensors"),
    };
    let b = match &args[1] {
        interp::Arg::Tensor(t) => t,
        _ => unreachable!("matmul takes tensors"),
    };
    let mut out = AlignedBuf::zeroed(DType::F32, vec![5, 4]).expect("memory");
    let run = |refs: &[ArgRef<'_>], out: &mut AlignedBuf| {
        let shape = out.shape.clone();
        k.run_in_place(refs, &mut [TensorMut { dtype: DType::F32, shape: &shape, bytes: out.bytes_mut() }])
            .map_err(|e| e.to_string())
    };
    assert!(run(&[tref(a)], &mut out).unwrap_err().contains("expected 2 arguments"));
    assert!(run(&[tref(b), tref(a)], &mut out).unwrap_err().contains("expected f32[5, 3]"));
    let bytes = vec![0u8; a.bytes().len() + 4];
    let skew = (0..4).find(|o| (bytes.as_ptr() as usize + o) % 4 != 0).expect("one of four offsets is odd");
    let misaligned = &bytes[skew..];
    let shape = a.shape.clone();
    let odd = ArgRef::Tensor(TensorRef { dtype: DType::F32, shape: &shape, bytes: &misaligned[..a.bytes().len()] });
    assert!(run(&[odd, tref(b)], &mut out).unwrap_err().contains("not aligned"));
    let short = ArgRef::Tensor(TensorRef { dtype: DType::F32, shape: &shape, bytes: &a.bytes()[4..] });
    assert!(run(&[short, tref(b)], &mut out).unwrap_err().contains("bytes for"));
}

#[test]
fn every_backend_runs_the_conformance_set() {
    if std::env::var_os("TEXC_TEST_TARGETS").is_some() {
        eprintln!("skipped: TEXC_TEST_TARGETS chooses the targets");
        return;
    }
    let registry = texc_compiler::target::all();
    let run = targets();
    for kind in BackendKind::ALL.into_iter().filter(|&k| k != BackendKind::Interp) {
        let of_kind: Vec<&Target> = registry.iter().filter(|t| t.backend().ok() == Some(kind)).collect();
        assert!(!of_kind.is_empty(), "backend {} has no target", kind.name());
        assert!(
            of_kind.iter().any(|t| run.iter().any(|r| r.name == t.name)),
            "no target of backend {} runs on this machine, so the conformance set does not run it",
            kind.name()
        );
    }
}

#[test]
fn examples_with_default_schedules() {
    for target in targets() {
        for (name, p) in texc_tests::example_programs(2e8) {
            let f = texc_tests::default_lowered(target.name, &p);
            check(&name, &p, &f, target, 3);
        }
    }
}

#[test]
fn std_operators_with_default_schedules() {
    for target in targets() {
        for (name, p) in texc_tests::std_op_programs(11) {
            let f = texc_tests::default_lowered(target.name, &p);
            check(&name, &p, &f, target, 4);
        }
    }
}

/// The examples' own x86-avx2 schedules (wide vectors, packing, cache_write),
/// lowered once and compiled by every backend.
#[test]
fn example_schedules_at_odd_sizes() {
    let cases: [(&str, Vec<(&str, i64)>); 7] = [
        ("examples/sgemm.tex", vec![("M", 37), ("K", 130), ("N", 70)]),
        ("examples/conv_resnet.tex", vec![("C", 5), ("H", 11), ("W", 19), ("K", 7)]),
        ("examples/conv_resnet.tex", vec![("N", 2), ("C", 3), ("H", 56), ("W", 56), ("K", 9)]),
        ("examples/matmul.tex", vec![("M", 37), ("K", 19), ("N", 70)]),
        ("examples/matmul.tex", vec![("M", 64), ("K", 64), ("N", 64)]),
        ("examples/matmul.tex", vec![("M", 1), ("K", 1), ("N", 1)]),
        ("examples/matmul.tex", vec![("M", 33), ("K", 65), ("N", 129)]),
    ];
    // GPU targets run GPU schedules: random ones below, and those of tests/tests/gpu.rs.
    for target in targets().into_iter().filter(|t| t.kind != TargetKind::Gpu) {
        for (file, shapes) in &cases {
            let (p, f) = texc_tests::example_with_its_schedule(file, shapes);
            check(&format!("{file} {shapes:?}"), &p, &f, target, 6);
        }
    }
}

#[test]
fn random_legal_schedules() {
    for target in targets() {
        let mut rng = SplitMix64::new(7);
        for (file, kernel, shapes) in texc_tests::RANDOM_SCHEDULE_CASES {
            let base = texc_tests::random_case_program(file, kernel, shapes);
            for trial in 0..8 {
                let f = match target.kind {
                    TargetKind::Gpu => texc_tests::randomly_gpu_scheduled(&base, &mut rng),
                    _ => texc_tests::randomly_scheduled(&base, &mut rng),
                };
                check(&format!("{file} trial {trial}"), &base, &f, target, trial);
            }
        }
    }
}

/// `conv_transpose2d` as `std.nn` writes it (each output column phase a
/// stage row reading its taps only, then interleaved) against the
/// definition by scattering — every input pixel times every tap added at
/// `y·stride − pad + r` — which shares nothing with it; then every CPU
/// target's default schedule against the interpreter. Kernels smaller than,
/// equal to and larger than the stride, not multiples of it, padding,
/// output padding, odd sizes.
#[test]
fn conv_transpose_matches_its_scatter_definition() {
    // (C, K, H, W, R, S, stride, pad, output_padding)
    let cases = [
        (3, 5, 5, 7, 2, 2, 2, 0, 0),
        (2, 3, 4, 6, 3, 3, 2, 1, 1),
        (3, 2, 5, 3, 1, 1, 2, 0, 1),
        (2, 4, 3, 5, 5, 4, 3, 2, 0),
        (4, 3, 6, 17, 4, 4, 2, 1, 0),
        (2, 2, 3, 4, 3, 2, 1, 1, 0),
    ];
    for (c, k, h, w, r, s, stride, pad, op) in cases {
        let oh = (h - 1) * stride - 2 * pad + r + op;
        let ow = (w - 1) * stride - 2 * pad + s + op;
        let src = format!(
            "import std.nn;\n\
             kernel t(X: f32[1, {c}, {h}, {w}], Wt: f32[{c}, {k}, {r}, {s}], b: f32[{k}]) -> Y: f32[1, {k}, {oh}, {ow}] {{\n\
             \x20   Y = conv_transpose2d_bias(X, Wt, b, stride = {stride}, pad = {pad}, output_padding = {op});\n}}\n"
        );
        let name = format!("conv_transpose C={c} K={k} {h}×{w} {r}×{s} stride {stride} pad {pad} op {op}");
        let (mut pl, kr) =
            texc_tests::load_text("interp", "t.tex", &src, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = texc_tests::specialize(&mut pl, kr, &Bindings::default());
        let args = interp::bind_args(&p, HashMap::new(), &[], 3).expect("binds");
        let t = |i: usize| match &args[i] {
            interp::Arg::Tensor(t) => t.to_f64(),
            _ => panic!("a tensor"),
        };
        let (x, wt, bias) = (t(0), t(1), t(2));
        let mut want = vec![0.0f64; k * oh * ow];
        for kk in 0..k {
            want[kk * oh * ow..(kk + 1) * oh * ow].iter_mut().for_each(|v| *v = bias[kk]);
        }
        for cc in 0..c {
            for y in 0..h {
                for xx in 0..w {
                    for kk in 0..k {
                        for rr in 0..r {
                            for ss in 0..s {
                                let (oy, ox) =
                                    ((y * stride + rr) as i64 - pad as i64, (xx * stride + ss) as i64 - pad as i64);
                                if oy >= 0 && ox >= 0 && (oy as usize) < oh && (ox as usize) < ow {
                                    want[(kk * oh + oy as usize) * ow + ox as usize] +=
                                        x[(cc * h + y) * w + xx] * wt[((cc * k + kk) * r + rr) * s + ss];
                                }
                            }
                        }
                    }
                }
            }
        }
        let got = interp::run(&p, args.clone()).expect("interp")[0].to_f64();
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let err = got.iter().zip(&want).fold(0f64, |m, (g, w)| m.max((g - w).abs())) / scale;
        assert!(err <= 1e-6, "{name}: the interpreter is {err:e} from the scatter definition");
        for target in targets().into_iter().filter(|t| t.kind == TargetKind::Cpu) {
            let f = texc_tests::default_lowered(target.name, &p);
            check(&name, &p, &f, target, 3);
        }
    }
}

/// Products with rows on two axes (`h, w`, a channels-last 1×1 convolution
/// or a `Linear` over an image) and columns in blocks: the blocks' loop is
/// outside the outer row axis, so that a block of the weight is read once
/// for all rows; a batch axis the weight is indexed by stays outside it.
/// Products of one row (a classifier's head) have blocks of columns too.
/// Sizes no block or vector divides, every CPU target against the interpreter.
#[test]
fn column_blocks_enclose_the_rows_they_serve() {
    let cases = [
        ("rows", "kernel t(X: f32[5, 7, 37], B: f32[37, 600]) -> Y: f32[5, 7, 600] { Y[h, w, j] = sum[k](X[h, w, k] * B[k, j]); }", "j.oo"),
        ("batch", "kernel t(X: f32[3, 7, 37], B: f32[3, 37, 600]) -> Y: f32[3, 7, 600] { Y[b, i, j] = sum[k](X[b, i, k] * B[b, k, j]); }", "b"),
        // One row: blocks of columns outside the reduction, their accumulators in registers.
        ("one row", "kernel t(X: f32[1, 37], B: f32[37, 203]) -> Y: f32[1, 203] { Y[i, j] = sum[k](X[i, k] * B[k, j]); }", "j.ob"),
        ("one row, a batch", "kernel t(X: f32[2, 1, 45], B: f32[2, 45, 1000]) -> Y: f32[2, 1, 1000] { Y[b, i, j] = sum[k](X[b, i, k] * B[b, k, j]) + 1.0; }", "j.ob"),
    ];
    for (name, src, outer) in cases {
        let (mut pl, k) = texc_tests::load_text("interp", "t.tex", src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        for target in targets().into_iter().filter(|t| t.kind == TargetKind::Cpu) {
            let f = texc_tests::default_lowered(target.name, &p);
            let text = texc_schedules::ir::print(&f);
            if outer == "j.ob" {
                // Too little work to run in parallel: the order is what counts.
                let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{name} on {target}: no `{s}` in\n{text}"));
                assert!(at("for j.ob in") < at("for k in"), "{name} on {target}:\n{text}");
            } else {
                let parallel =
                    text.lines().find(|l| l.contains(" parallel:")).unwrap_or_else(|| panic!("{name}: {text}"));
                assert!(parallel.trim_start().starts_with(&format!("for {outer}")), "{name} on {target}:\n{text}");
            }
            check(name, &p, &f, target, 5);
        }
    }
}

/// A channels-last product over short image rows (ConvNeXt's and Swin's
/// MLPs) runs over the whole map's rows as one axis where that saves
/// register-block steps (`merge_rows`), the
/// element-wise stage after it reading the merged temporary at `y · W + x`;
/// sizes no block or vector divides, a batch of two, every CPU target
/// against the interpreter.
#[test]
fn products_over_short_image_rows_run_over_the_whole_map() {
    let cases = [
        "kernel t(A: f32[1, 7, 7, 37], W: f32[37, 70]) -> Z: f32[1, 7, 7, 70] {\n\
         \x20   Y[n, y, x, j] = sum[k](A[n, y, x, k] * W[k, j]);\n\
         \x20   Z[n, y, x, j] = 0.5 * Y[n, y, x, j] * (1.0 + erf(Y[n, y, x, j] / 1.4142135));\n}\n",
        "kernel t(A: f32[2, 13, 11, 19], W: f32[19, 40], b: f32[40]) -> Z: f32[2, 13, 11, 40] {\n\
         \x20   Y[n, y, x, j] = sum[k](A[n, y, x, k] * W[k, j]);\n\
         \x20   Z[n, y, x, j] = Y[n, y, x, j] + b[j] + Y[n, 12 - y, 10 - x, j];\n}\n",
    ];
    for src in cases {
        let (mut pl, k) = texc_tests::load_text("interp", "t.tex", src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        for target in targets().into_iter().filter(|t| t.kind == TargetKind::Cpu) {
            let f = texc_tests::default_lowered(target.name, &p);
            let text = texc_schedules::ir::print(&f);
            // AVX2's blocks of 5 or 6 rows end every image row of 7 or 11 in
            // a short block (AVX-512's of 7 or 11 divide them: its count decides).
            let merged = text.contains("for y.x.") || text.contains("y.x in");
            assert!(merged || target.name != "x86-avx2", "{src} on {target}:\n{text}");
            check("merged rows", &p, &f, target, 9);
        }
    }
}

/// The vector `exp` (a polynomial; on AVX-512 scaled by `vscalefps`) and
/// the `sigmoid` built on it, lane by lane: overflow to ∞ past 88.72,
/// denormal results down to −103.97, 0 below, NaN and infinities through;
/// a dense sweep crosses every rounding of x·log2 e to the next integer
/// (the exponent `k`, and both halves of 2^k where 2^k is denormal).
#[test]
fn vector_exp_matches_the_interpreter_elementwise() {
    let mut xs: Vec<f64> = (0..48).map(|i| -87.0 + 175.0 * i as f64 / 47.0).collect();
    xs.extend([0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 88.8, -95.0, -110.0]);
    xs.extend([88.72283, 88.7228, 88.81, -103.97, -104.0, -104.01, 1e30, -1e30]);
    xs.extend((0..2000).map(|i| -105.0 + 195.0 * i as f64 / 1999.0));
    // Halfway between two exponents: x·log2 e = k + 1/2, and a step either side.
    xs.extend((-150..=128).flat_map(|k| {
        let x = (k as f64 + 0.5) * std::f64::consts::LN_2;
        [x, x * (1.0 + 1e-7), x * (1.0 - 1e-7)]
    }));
    let src = format!(
        "kernel e(X: f32[N = {}]) -> (Y: f32[N], S: f32[N]) {{ Y[i] = exp(X[i]); S[i] = sigmoid(X[i]); }}",
        xs.len()
    );
    for target in targets() {
        let (mut pl, k) = texc_tests::load_text(target.name, "e.tex", &src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let x = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![xs.len()], &xs);
        let args = || vec![interp::Arg::Tensor(x.clone())];
        let want = interp::run(&p, args()).expect("interp");
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args()).expect("runs");
        // On a GPU, `exp` is libdevice's `__nv_expf`, within 2 units in the
        // last place (CUDA's documented bound; a real H200 is 2 off at
        // sigmoid(−4.82)), and the sigmoid rounds 1 + e and the quotient
        // after it. The CPU emulation of GPU targets has no libdevice.
        let on_device = target.kind == TargetKind::Gpu && target.check_runs_here().is_ok();
        for (o, name) in ["exp", "sigmoid"].iter().enumerate() {
            let gpu_ulps = if on_device { [2, 3][o] } else { 0 };
            for ((g, w), x) in got[o].to_f64().iter().zip(want[o].to_f64()).zip(&xs) {
                // Denormal results (below 2^-126) keep fewer significant bits.
                // The sigmoid's exponential takes ln 2 as one constant
                // (`Ln2::OnePart`): r, and e^−|x|, off by up to |k|·1.9e-9.
                let reduction = if o == 1 { 1.9e-9 * (x.abs() * std::f64::consts::LOG2_E).round() } else { 0.0 };
                let tol = if w.abs() < 1.2e-38 { 1e-3 } else { 2e-7 + reduction };
                let ok = (g.is_nan() && w.is_nan())
                    || *g == w
                    || (g - w).abs() <= tol * w.abs()
                    || ulps_apart(*g as f32, w as f32) <= gpu_ulps;
                assert!(ok, "{name}({x}) = {g} on {target}, interpreter says {w}");
            }
        }
    }
}

/// `sigmoid` of f16 and f64, vectors and their scalar tails, on every
/// target against the interpreter: its numerator is picked by the sign
/// bit, read from an integer as wide as the float (an f16 was once cast to
/// 32 bits, which LLVM's verifier refused).
#[test]
fn sigmoid_of_every_float_width_matches_the_interpreter() {
    let xs: Vec<f64> = (0..37).map(|i| -9.0 + 18.0 * i as f64 / 36.0).chain([0.0, -0.0]).collect();
    for (elem, dtype, tol) in [("f16", texc_runtime::DType::F16, 1e-2), ("f64", texc_runtime::DType::F64, 1e-12)] {
        let src = format!("kernel s(X: {elem}[N = {}]) -> Y: {elem}[N] {{ Y[n] = sigmoid(X[n]); }}", xs.len());
        for target in targets().into_iter().filter(|t| t.kind == TargetKind::Cpu) {
            let (mut pl, k) = texc_tests::load_text(target.name, "s.tex", &src, None).expect("front end");
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            let f = texc_tests::loops(&mut pl, k, &p);
            let x = texc_runtime::Tensor::from_f64(dtype, vec![xs.len()], &xs);
            let args = || vec![interp::Arg::Tensor(x.clone())];
            let want = interp::run(&p, args()).expect("interp");
            let run = texc_tests::compile_loops(target, &f).unwrap_or_else(|e| panic!("{elem} on {target}: {e}"));
            let got = run.run(args()).expect("runs");
            for ((g, w), x) in got[0].to_f64().iter().zip(want[0].to_f64()).zip(&xs) {
                assert!(
                    (g - w).abs() <= tol * w.abs(),
                    "sigmoid({x}) as {elem} = {g} on {target}, interpreter says {w}"
                );
            }
        }
    }
}

/// How many floats lie between `a` and `b` of the same sign (finite):
/// their distance in units in the last place.
fn ulps_apart(a: f32, b: f32) -> u32 {
    if a.is_sign_negative() != b.is_sign_negative() || !a.is_finite() || !b.is_finite() {
        return u32::MAX;
    }
    a.to_bits().abs_diff(b.to_bits())
}

/// A SiLU's vector loop on `x86-avx2` (16 registers) keeps its constants
/// where they are: with one value more live than fit, LLVM's register
/// allocator once cycled them through the registers, 21 copies per vector
/// (now the exponential of a known sign builds 2^k in one field, and its
/// polynomial holds no r²), and in a loop unrolled over eight vectors it
/// reloaded seven constants per vector by `vbroadcastss` (now the sigmoid
/// needs no zero and its exponential one ln 2): each constant is loaded
/// once, before the loop. Compiled, not run, so any x86-64 checks it; a
/// copy or two per vector is a destructive FMA's operand.
#[test]
fn avx2_silu_loop_does_not_cycle_its_constants() {
    for shape in ["C = 2, H = 112, W = 112", "C = 1, H = 1024, W = 64"] {
        let src = format!(
            "kernel s(X: f32[{shape}]) -> Y: f32[C, H, W] {{\n\
             \x20   Y[c, h, w] = X[c, h, w] * sigmoid(X[c, h, w]);\n}}\n"
        );
        let (mut pl, k) = texc_tests::load_text("x86-avx2", "silu.tex", &src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let legal = pl.legalize(f).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
        let asm = pl.emit_text(&legal, "asm").unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
        let instr = |l: &str, op: &str| l.trim_start().starts_with(op);
        let divisions = asm.lines().filter(|l| instr(l, "vdivps")).count();
        let copies =
            asm.lines().filter(|l| instr(l, "vmovaps") && l.matches("%ymm").count() == 2 && !l.contains('(')).count();
        let constants = asm.lines().filter(|l| l.starts_with(".LCPI")).count();
        let broadcasts = asm.lines().filter(|l| instr(l, "vbroadcastss")).count();
        assert!(divisions >= 1, "no vector division:\n{asm}");
        assert!(copies <= 3 * divisions, "{copies} register copies for {divisions} vectors:\n{asm}");
        assert!(broadcasts <= constants, "{broadcasts} broadcasts of {constants} constants:\n{asm}");
    }
}

/// The vector `tanh` and `erf` (polynomials and the vector `exp`, instead
/// of a library call per lane) agree with the interpreter's to a few units
/// in the last place on a dense sweep across their branches (tanh's at
/// |x| = 0.625, erf's quotient up to its saturation at 3.84), tiny and huge
/// arguments, signed zeros, infinities and NaN.
#[test]
fn vector_tanh_and_erf_match_the_interpreter_elementwise() {
    let src = "kernel t(X: f32[N = 1045]) -> (T: f32[N], E: f32[N]) { T[i] = tanh(X[i]); E[i] = erf(X[i]); }";
    for target in targets() {
        let (mut pl, k) = texc_tests::load_text(target.name, "t.tex", src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let mut xs: Vec<f64> = (0..1000).map(|i| -6.0 + 12.0 * i as f64 / 999.0).collect();
        xs.extend([0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e-30, -1e-30, 1e-7, -3e-5, 1e30, -1e30]);
        xs.extend([0.625, -0.625, 0.62499994, 0.6250001, 1.0, -1.0, 0.99999994, 1.0000001, 4.0, -4.0, 3.9999998]);
        xs.extend([3.84, -3.84, 3.8399997, -3.8399997, 3.555331, 2.8650937, 1e-38, -2e-20]);
        xs.extend([4.0000005, 8.9, -9.1, 44.0, -88.0, 0.3, -0.7, 2.5, -3.7, 1e-3, 12.0, -0.05, 0.001, 5.5, -1.5]);
        let x = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![xs.len()], &xs);
        let args = || vec![interp::Arg::Tensor(x.clone())];
        let want = interp::run(&p, args()).expect("interp");
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args()).expect("runs");
        for (o, name) in ["tanh", "erf"].iter().enumerate() {
            for ((g, w), x) in got[o].to_f64().iter().zip(want[o].to_f64()).zip(&xs) {
                let ok = (g.is_nan() && w.is_nan()) || *g == w || (g - w).abs() <= 4e-7 * w.abs();
                assert!(ok, "{name}({x}) = {g} on {target}, interpreter says {w}");
            }
        }
    }
}

/// Kernels scheduled for AVX-512 are correct even where the CPU cannot run
/// AVX-512 code: their loop nests (16- and 32-lane vectors) compiled for
/// this machine's widest target.
#[test]
fn avx512_schedules_on_this_machine() {
    let Some(here) = targets().into_iter().find(|t| t.name == "host") else {
        assert!(std::env::var_os("TEXC_TEST_TARGETS").is_some(), "host runs");
        eprintln!("skipped: TEXC_TEST_TARGETS leaves `host` out");
        return;
    };
    for (name, p) in texc_tests::example_programs(2e7).into_iter().chain(texc_tests::std_op_programs(11)) {
        let f = texc_tests::default_lowered("x86-avx512", &p);
        check(&format!("{name} (x86-avx512 schedule)"), &p, &f, here, 8);
    }
    let b = Bindings {
        shapes: [("M", 13), ("K", 520), ("N", 270)].iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Bindings::default()
    };
    let p = texc_tests::compile("benches/matmul.tex", None, &b).expect("compiles");
    let f = texc_tests::default_lowered("x86-avx512", &p);
    let text = texc_schedules::ir::print(&f);
    assert!(text.contains("local B.packed: f32[4, 512, 32]:"), "32-wide panels for the 32-wide micro-kernel:\n{text}");
    check("default gemm (x86-avx512 schedule)", &p, &f, here, 9);
}

/// `max`, `min` and their composition agree with the interpreter bit for
/// bit on every target that runs here, vectorized: NaN in either operand
/// gives NaN, −0 is below +0 (IEEE 754-2019 `maximum`/`minimum`, which the
/// interpreter now follows too), infinities and denormals order as numbers.
/// (On AVX-512 two vectors go through `vrangeps`/`vrangepd`, which order signed zeros
/// but return the other operand for a NaN, and a NaN lane takes `a + b`.)
#[test]
fn vector_max_and_min_match_the_interpreter_elementwise() {
    let special = [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e-40, -1e-40, 1.0, -1.0, 3.5];
    let mut pairs = Vec::new();
    for (i, &a) in special.iter().enumerate() {
        for &b in &special[i % 3..i % 3 + 6] {
            pairs.push((a, b));
        }
    }
    pairs.truncate(64);
    while pairs.len() < 64 {
        pairs.push((pairs.len() as f64 - 30.0, 19.0 - pairs.len() as f64));
    }
    // 512-bit vectors of f32 and f64, and (`vec=256`) AVX-512's 256-bit form.
    for (elem, n, dtype, vec) in
        [("f32", 64, DType::F32, None), ("f64", 64, DType::F64, None), ("f32", 61, DType::F32, Some(256))]
    {
        let src = format!(
            "kernel m(X: {elem}[N = {n}], Z: {elem}[N]) -> (A: {elem}[N], B: {elem}[N], C: {elem}[N]) {{
    A[i] = max(X[i], Z[i]);
    B[i] = min(X[i], Z[i]);
    C[i] = min(max(X[i], -1.5), Z[i]);
}}"
        );
        // Every ninth pair for the shorter kernel: a different order, a tail.
        let (xs, zs): (Vec<f64>, Vec<f64>) = (0..n).map(|i| pairs[i * if n < 64 { 9 } else { 1 } % 64]).unzip();
        for target in targets() {
            let (mut pl, k) = texc_tests::load_text(target.name, "m.tex", &src, None).expect("front end");
            if let Some(bits) = vec {
                pl.options.knobs.insert("vec".into(), bits);
            }
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            let f = texc_tests::loops(&mut pl, k, &p);
            let x = texc_runtime::Tensor::from_f64(dtype, vec![n], &xs);
            let z = texc_runtime::Tensor::from_f64(dtype, vec![n], &zs);
            let args = || vec![interp::Arg::Tensor(x.clone()), interp::Arg::Tensor(z.clone())];
            let want = interp::run(&p, args()).expect("interp");
            let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args()).expect("runs");
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                for (i, (g, w)) in g.to_f64().iter().zip(w.to_f64()).enumerate() {
                    let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
                    assert!(
                        same,
                        "{elem}[{n}] output {o}, ({}, {}): {g} on {target}, interpreter says {w}",
                        xs[i], zs[i]
                    );
                }
            }
        }
    }
}

/// The same semantics where vectors are not one register: a maximum over
/// rows whose register block holds 32 lanes and whose row ends in 15
/// (`vrangeps` a register at a time, a short piece padded), of special
/// values — NaN, signed zeros, infinities — in every position.
#[test]
fn vector_max_in_pieces_matches_the_interpreter() {
    let special =
        [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e-40, -1e-40, 1.0, -1.0, 3.5, -0.0, 0.0, 2.0];
    for (elem, dtype) in [("f32", DType::F32), ("f64", DType::F64)] {
        let src = format!(
            "kernel m(X: {elem}[H = 11, W = 111]) -> (P: {elem}[5, W], Q: {elem}[5, W]) {{
    P[h, x] = max[r in 0..3](X[2 * h + r, x]);
    Q[h, x] = min[r in 0..3](X[2 * h + r, x]);
}}"
        );
        // Mostly ordinary values, so that a NaN or a zero meets each kind of neighbour.
        let xs: Vec<f64> = (0..11 * 111)
            .map(|i| if i % 5 == 0 { special[i / 5 % special.len()] } else { (i % 17) as f64 - 8.0 })
            .collect();
        for target in targets() {
            let (mut pl, k) = texc_tests::load_text(target.name, "m.tex", &src, None).expect("front end");
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            let f = texc_tests::loops(&mut pl, k, &p);
            let x = texc_runtime::Tensor::from_f64(dtype, vec![11, 111], &xs);
            let args = || vec![interp::Arg::Tensor(x.clone())];
            let want = interp::run(&p, args()).expect("interp");
            let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args()).expect("runs");
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                for (i, (g, w)) in g.to_f64().iter().zip(w.to_f64()).enumerate() {
                    let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
                    assert!(same, "{elem} output {o} at {i}: {g} on {target}, interpreter says {w}");
                }
            }
        }
    }
}

/// Float to byte conversions truncate, saturate and send NaN to 0 on every
/// backend, from f32 and f64, in vectors and in the scalar tail (67 lanes),
/// bit for bit as the interpreter does, bounds and their neighbours included.
#[test]
fn float_to_byte_casts_saturate_on_every_backend() {
    let src = "kernel c(X: f32[N = 67], D: f64[N]) -> (U: u8[N], S: i8[N], V: u8[N], T: i8[N]) {
    U[i] = u8(X[i]); S[i] = i8(X[i]); V[i] = u8(D[i]); T[i] = i8(D[i]);
}";
    let mut xs: Vec<f64> = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 0.99, -0.99, 1e30, -1e30];
    xs.extend([255.0, 255.99, 256.0, 300.5, 127.0, 127.99, 128.0, -128.0, -128.99, -129.0, -1.5, 1.5]);
    xs.extend((0..67 - xs.len()).map(|k| (k as f64 - 23.0) * 7.3));
    let x = Tensor::from_f64(DType::F32, vec![67], &xs);
    let d = Tensor::from_f64(DType::F64, vec![67], &xs);
    for target in targets() {
        let (mut pl, k) = texc_tests::load_text(target.name, "c.tex", src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let args = || vec![interp::Arg::Tensor(x.clone()), interp::Arg::Tensor(d.clone())];
        let want = interp::run(&p, args()).expect("interp");
        assert_eq!(&want[1].to_i64().expect("ints")[..3], &[0, 127, -128], "NaN to 0, infinities saturate");
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args()).expect("runs");
        for (o, name) in ["u8 of f32", "i8 of f32", "u8 of f64", "i8 of f64"].iter().enumerate() {
            assert_eq!(got[o].bytes(), want[o].bytes(), "{name} on {target}: {:?} vs {:?}", got[o], want[o]);
        }
    }
}

/// `round` rounds half to even on every target (LLVM's `roundeven`,
/// Cranelift's `nearest`), vectorized and not, and ONNX's requantization
/// written as the importer writes it, `sat(round(f32(x / s)) + z)`, agrees
/// with the interpreter bit for bit, ties and saturation included.
#[test]
fn round_and_requantization_are_half_to_even_on_every_backend() {
    let src =
        "kernel q(X: f32[N = 67], A: u8[N, K = 19], W: i8[M = 5, K]) -> (R: f32[N], Q: u8[N], S: i8[N], P: u8[N, M]) {
    R[i] = round(X[i]);
    Q[i] = u8(clamp(round(f32(X[i] / 0.5)) + 3.0, 0.0, 255.0));
    S[i] = i8(clamp(round(f32(X[i] / 0.1)) - 128.0, -128.0, 127.0));
    P[i, j] = u8(clamp(round(f32(f32(sum[k](i32(A[i, k]) * i32(W[j, k])) - 128 * 7) * 0.0625)) + 9.0, 0.0, 255.0));
}";
    let mut xs: Vec<f64> = (-24..24).map(|k| k as f64 + 0.5).collect();
    xs.extend([0.25, -0.25, 0.75, -0.75, 0.05, 0.15, 0.25, -0.35, 1e9, -1e9, f64::NAN, 0.0, -0.0, 2.5, 3.5]);
    xs.extend([12.8, -12.85, 127.5, -0.45]);
    xs.truncate(67);
    let x = Tensor::from_f64(DType::F32, vec![67], &xs);
    let mut rng = SplitMix64::new(5);
    let a: Vec<i64> = (0..67 * 19).map(|_| (rng.next_u64() % 256) as i64).collect();
    let w: Vec<i64> = (0..5 * 19).map(|_| (rng.next_u64() % 256) as i64 - 128).collect();
    let a = Tensor::from_i64(DType::U8, vec![67, 19], &a);
    let w = Tensor::from_i64(DType::I8, vec![5, 19], &w);
    for target in targets() {
        let (mut pl, k) = texc_tests::load_text(target.name, "q.tex", src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let args =
            || vec![interp::Arg::Tensor(x.clone()), interp::Arg::Tensor(a.clone()), interp::Arg::Tensor(w.clone())];
        let want = interp::run(&p, args()).expect("interp");
        assert_eq!(&want[0].to_f64()[..6], &[-24.0, -22.0, -22.0, -20.0, -20.0, -18.0], "half to even");
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args()).expect("runs");
        for (o, name) in ["round", "quantize u8", "quantize i8", "requantized product"].iter().enumerate() {
            assert!(same_bits(&got[o], &want[o]), "{name} on {target}: {:?} vs {:?}", got[o], want[o]);
        }
    }
}

/// `got` is `want` bit for bit, except that a NaN matches any NaN: a GPU
/// returns its canonical NaN (0x7fffffff), not the payload it was given.
fn same_bits(got: &Tensor, want: &Tensor) -> bool {
    let (g, w) = (got.to_f64(), want.to_f64());
    got.dtype() == want.dtype()
        && g.len() == w.len()
        && g.iter().zip(&w).all(|(a, b)| (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits())
}

/// Winograd called on an image with no output row (unpadded, 2 × 2) and a
/// strided 1 × 1 convolution next to it: the empty tile loops, fused with
/// their neighbours by the default schedules, compile and run on every
/// backend (a fused loop over an empty one once divided by its extent 0).
#[test]
fn empty_winograd_outputs_compile_and_run() {
    for form in ["f2", "f2k", "f4"] {
        let src = format!(
            "import std.nn;
kernel e(X: f32[N = 1, C = 2, H = 2, W = 2], Wt: f32[K = 3, C, 3, 3], W1: f32[K, C, 1, 1])
    -> (Y: f32[N, K, H - 2, W - 2], Z: f32[N, K, (H - 1) / 2 + 1, (W - 1) / 2 + 1]) {{
    Y = conv2d_winograd_{form}(X, Wt, pad = 0);
    Z = conv2d_1x1_strided(X, W1, stride = 2);
}}"
        );
        for target in targets() {
            let (mut pl, k) = texc_tests::load_text(target.name, "e.tex", &src, None).expect("front end");
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            let f = texc_tests::loops(&mut pl, k, &p);
            check(&format!("empty {form}"), &p, &f, target, 2);
            assert_eq!(p.tensor(p.outputs[0]).shape, vec![1, 3, 0, 0]);
        }
    }
}

/// A vector select whose condition joins parts the same in every lane (a
/// padding's rows, `y`) with parts that are not (its columns, `x`)
/// branches on the former and masks with the latter only (the branches
/// meet in LLVM's `sel.end` blocks), for `&&` and `||` chains in any
/// order; each side reads only the lanes it is taken for (the padding's
/// reads are in bounds only there). Both match the interpreter on every
/// target this machine runs, at sizes no vector divides (reads the
/// earlier parts guard: `guard_pages::transposed_reads_in_a_select_stay_inside_their_tensors`).
#[test]
fn selects_branch_on_their_lane_uniform_part() {
    let and = "kernel pad(X: f32[C = 3, H = 13, W = 21]) -> Y: f32[C, H + 2, W + 2] {
    Y[c, y, x] = select(x >= 1 && y >= 1 && x < W + 1 && y < H + 1, X[c, y - 1, x - 1], 0.5);
}
";
    let or = "kernel marks(X: f32[C = 3, H = 13, W = 21]) -> Z: f32[C, H, W] {
    Z[c, y, x] = select(x % 3 == 0 || y == 0 || x == W - 1, 2.0, X[c, y, x]);
}
";
    for (name, src) in [("and", and), ("or", or)] {
        let (mut pl, k) =
            texc_tests::load_text("interp", &format!("{name}.tex"), src, None).unwrap_or_else(|e| panic!("{e}"));
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        for target in targets().into_iter().filter(|t| matches!(t.backend(), Ok(BackendKind::Llvm))) {
            let f = texc_tests::default_lowered_on(target, &p);
            let mut pl = texc_tests::pipeline_on(target);
            let legal = pl.legalize(f.clone()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
            let ir = pl.emit_text(&legal, "llvm").unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
            assert!(ir.contains("sel.end"), "{name} on {target}: no branch on the rows:\n{ir}");
            check(name, &p, &f, target, 7);
        }
    }
}

/// The reduction loop around a register block of eight rows of one vector
/// each is kept rolled (*keep-rolled* marks it `rolled` in the legal loop
/// nest, and the LLVM backend gives it `llvm.loop.unroll.disable`: LLVM's
/// partial unroller would copy the step and spill its accumulators); the
/// one around rows of two vectors, or around six rows, is left to LLVM, as
/// are rows of AVX-512's 16 lanes (its rows of 8 are kept rolled). Each
/// matches the interpreter at
/// sizes the blocks do not divide.
#[test]
fn only_blocks_of_one_vector_rows_are_kept_rolled() {
    for (target, rows, cols, rolled) in [
        ("x86-avx2", 8, 8, true),
        ("x86-avx2", 8, 16, false),
        ("x86-avx2", 6, 8, false),
        ("x86-avx512", 8, 8, true),
        ("x86-avx512", 8, 16, false),
    ] {
        let what = format!("{target}, {rows} rows of {cols} lanes");
        let (mut pl, k) = texc_tests::load_text(target, "mm.tex", &blocked_product(target, rows, cols), None)
            .unwrap_or_else(|e| panic!("{e}"));
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        let text = texc_schedules::ir::print(&f);
        assert_eq!(text.contains("for k in 0..37 rolled:"), rolled, "{what}:\n{text}");
        assert!(rolled || !text.contains(" rolled:"), "{what}: no loop kept rolled:\n{text}");
        let ir = pl.emit_text(&f, "llvm").unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
        assert_eq!(ir.contains("!\"llvm.loop.unroll.disable\""), rolled, "{what}:\n{ir}");
        let t = texc_compiler::target::lookup(target).expect("registered");
        if targets().iter().any(|r| r.name == t.name) {
            check(&what, &p, &f, t, 11);
        }
    }
}

/// `A · B` of 29 × 37 × 43 in register blocks of `rows × cols`, the rows
/// unrolled around one vectorized loop of `cols` lanes.
fn blocked_product(target: &str, rows: i64, cols: i64) -> String {
    format!(
        "kernel mm(A: f32[M = 29, K = 37], B: f32[K, N = 43]) -> C: f32[M, N] {{
    C[i, j] = sum[k](A[i, k] * B[k, j]);
}}
schedule mm for {target} {{
    tile C(i, j) by ({rows}, {cols}) -> (io, jo, ii, ji);
    reorder C(io, jo, k, ii, ji);
    vectorize C.ji;
    unroll C.ii;
}}
"
    )
}

/// The mark, not the shape, decides: a loop written `rolled` in a `.loops`
/// file gets `llvm.loop.unroll.disable` around any block, and the text
/// reads back as it was printed; `rolled` on a loop that is neither serial
/// nor parallel is an error at its line.
#[test]
fn a_loop_written_rolled_is_kept_rolled() {
    let (mut pl, k) = texc_tests::load_text("x86-avx2", "mm.tex", &blocked_product("x86-avx2", 8, 16), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let f = texc_tests::loops(&mut pl, k, &p);
    let text = texc_schedules::ir::print(&f);
    assert!(!text.contains(" rolled:"), "rows of two vectors are left to LLVM:\n{text}");
    let marked = text.replacen("for k in 0..37:", "for k in 0..37 rolled:", 1);
    assert_ne!(marked, text, "the reduction loop is `for k in 0..37:`:\n{text}");
    let g = texc_schedules::text::parse(&marked, texc_grammar::FileId(0)).unwrap_or_else(|e| panic!("{e:?}")).func;
    assert_eq!(texc_schedules::ir::print(&g), marked);
    let ir = pl.emit_text(&g, "llvm").unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    assert!(ir.contains("!\"llvm.loop.unroll.disable\""), "{ir}");
    // Legalized again, as `texc run` does a `.loops` file, the file's mark stays.
    let again = pl.legalize(g).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    assert!(texc_schedules::ir::print(&again).contains("for k in 0..37 rolled:"));
    let vector = text.lines().find(|l| l.ends_with(" vectorized:")).expect("a vectorized loop");
    let bad = text.replacen(vector, &vector.replace(" vectorized:", " vectorized rolled:"), 1);
    let err = texc_schedules::text::parse(&bad, texc_grammar::FileId(0)).expect_err("a vector loop kept rolled");
    assert!(
        format!("{err:?}").contains("only a serial or parallel loop is kept `rolled`; this one is vectorized"),
        "{err:?}"
    );
}

/// An ungrouped convolution over channels blocked by eight reads its
/// input through no group (`Xb[n, cb, ..]`, every filter block sharing
/// its broadcasts, each reading a block of filters of its own): its
/// default block takes filter blocks beside positions (`nchw8c` of
/// `benches/grouped_conv_blocked.tex`: 3 × 3 of 6 blocks and 9 positions
/// on AVX2, 6 × 3 on AVX-512), so does the 1 × 1 one with its bias and
/// ReLU (`pointwise_nchw8c`: 3 of 9 blocks × 4 of 13 positions), while a
/// channels-first product over an 8 × 8 map (`X[n, c, h, w]`, its image
/// rows read inside the channels it sums) takes no rows of the image: its
/// map fused into one row (`vectorize::fused_row`), the micro-kernel's 6
/// filters × 2 vectors on AVX2; over rows that do not fuse (its input 9
/// wide), a batch of two blocks neither images nor rows (`filter_block`:
/// the input reads the image's axes beside the batch), only filters; each
/// matches the interpreter.
#[test]
fn ungrouped_blocked_convolutions_block_their_filter_blocks() {
    let bind = |shapes: &[(&str, i64)]| Bindings {
        shapes: shapes.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Bindings::default()
    };
    let channels_first =
        "kernel channels_first(X: f32[N = 1, C = 16, H = 8, W = 8], Wt: f32[K = 24, C]) -> Y: f32[N, K, H, W] {
    Y[n, k, h, w] = sum[c](X[n, c, h, w] * Wt[k, c]);
}
";
    let unfused = "kernel unfused(X: f32[N = 2, C = 16, H = 8, 9], Wt: f32[K = 24, C]) -> Y: f32[N, K, H, 8] {
    Y[n, k, h, w] = sum[c](X[n, c, h, w] * Wt[k, c]);
}
";
    let load = |target: &str, kernel: &str| match kernel {
        "channels_first" => texc_tests::load_text(target, "cf.tex", channels_first, None),
        "unfused" => texc_tests::load_text(target, "cf.tex", unfused, None),
        _ => texc_tests::load_file(target, "benches/grouped_conv_blocked.tex", Some(kernel)),
    };
    let cases = [
        (
            "nchw8c",
            bind(&[("N", 1), ("CB", 4), ("HP", 9), ("WP", 11), ("KB", 6)]),
            ["kb.r in 0..3 unrolled", "w.r in 0..3 unrolled"],
        ),
        (
            "pointwise_nchw8c",
            bind(&[("N", 1), ("CB", 5), ("H", 3), ("W", 13), ("KB", 9)]),
            ["kb.r in 0..3 unrolled", "w.r in 0..4 unrolled"],
        ),
        ("channels_first", Bindings::default(), ["k.r in 0..6 unrolled", "h.w.v in 0..16 vectorized"]),
        ("unfused", Bindings::default(), ["k.r in 0..12 unrolled", "w.v in 0..8 vectorized"]),
    ];
    for target in targets().into_iter().filter(|t| t.kind == TargetKind::Cpu) {
        for (i, (kernel, b, block)) in cases.iter().enumerate() {
            let (mut pl, k) = load(target.name, kernel).unwrap_or_else(|e| panic!("{e}"));
            let p = pl.specialize(k, b).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
            let f = texc_tests::loops(&mut pl, k, &p);
            let text = texc_schedules::ir::print(&f);
            let what = format!("{kernel} on {}", target.name);
            assert!(!text.contains("kb.i") && !text.contains("kb.g"), "{what}: no group split:\n{text}");
            assert!(!text.contains("h.r") && !text.contains("n.r"), "{what}: no image rows, no batch rows:\n{text}");
            if target.name == "x86-avx2" {
                assert!(block.iter().all(|w| text.contains(w)), "{what}: the block {block:?}:\n{text}");
            }
            check(&what, &p, &f, target, 43 + i as u64);
        }
    }
    // AVX-512's block, compiled here whatever the CPU: 6 blocks × 3 positions.
    let (mut pl, k) = load("x86-avx512", "nchw8c").unwrap_or_else(|e| panic!("{e}"));
    let p = pl.specialize(k, &cases[0].1).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    let text = texc_schedules::ir::print(&texc_tests::loops(&mut pl, k, &p));
    assert!(text.contains("kb.r in 0..6 unrolled") && text.contains("w.r in 0..3 unrolled"), "{text}");
}

/// On x86 every function realigns its frame where a spill asks for it
/// (`stackrealign`): the default block of a grouped convolution over
/// channels blocked by eight spills vectors from its parallel loop's task
/// function on AVX2, each to a slot of its own cache line (an aligned
/// store), not to one 16 bytes aligned that a reload could not take
/// forwarded (the kernel ran 6 × slower so, `codegen/src/llvm/mod.rs`).
#[test]
fn vectors_spill_to_aligned_slots() {
    let b = Bindings {
        shapes: [("N", 1), ("CB", 21), ("HP", 30), ("WP", 30), ("KB", 21)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        ..Bindings::default()
    };
    let (mut pl, k) = texc_tests::load_file("x86-avx2", "benches/grouped_conv_blocked.tex", Some("grouped_nchw8c"))
        .unwrap_or_else(|e| panic!("{e}"));
    let p = pl.specialize(k, &b).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    let f = texc_tests::loops(&mut pl, k, &p);
    let ir = pl.emit_text(&f, "llvm").unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    let defines = ir.lines().filter(|l| l.starts_with("define ")).count();
    let groups: Vec<&str> = ir.lines().filter(|l| l.starts_with("attributes #") && l.contains("target-cpu")).collect();
    assert!(defines >= 2 && !groups.is_empty(), "the entry and the task function:\n{ir}");
    assert!(groups.iter().all(|g| g.contains("\"stackrealign\"")), "every function realigns: {groups:?}");
    let asm = pl.emit_text(&f, "asm").unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    let spills: Vec<&str> = asm
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("vmov") && l.contains("%ymm") && l.ends_with("(%rsp)"))
        .collect();
    assert!(!spills.is_empty(), "the 4 × 3 block spills on AVX2:\n{asm}");
    assert!(spills.iter().all(|l| l.starts_with("vmovaps")), "unaligned spills: {spills:?}");
}

/// `benches/grouped_conv_blocked.tex`: the grouped convolution in blocked
/// channels, by default and with its register block of a group's three
/// filter blocks × four positions (`cache_write`, the group's input blocks
/// read through `kb / 3`), matches the interpreter at sizes the blocks do
/// not divide (9 positions a row in the schedule's blocks of 4, 7 in the
/// default's), as does the channels-first form it stands beside. The
/// default block takes a group's filter blocks as its second axis.
#[test]
fn grouped_convolutions_in_blocked_channels_match_the_interpreter() {
    let bind = |shapes: &[(&str, i64)], consts: &[(&str, i64)]| Bindings {
        shapes: shapes.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        consts: consts.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Bindings::default()
    };
    let blocked = bind(&[("N", 1), ("CB", 6), ("HP", 9), ("WP", 11), ("KB", 6)], &[]);
    let cases = [
        ("grouped_nchw", bind(&[("N", 1), ("C", 48), ("H", 7), ("W", 9), ("K", 48), ("Cg", 24)], &[("groups", 2)])),
        ("grouped_nchw8c", blocked.clone()),
        ("grouped_nchw8c", bind(&[("N", 1), ("CB", 6), ("HP", 5), ("WP", 9), ("KB", 6)], &[])),
        ("grouped_nchw8c_blocked", blocked),
    ];
    // The default blocks on AVX2 (accumulators, then positions a block):
    // 9 positions in blocks of 3, 7 in a block of 4 and a shorter one.
    let default_block = |w: i64| match w {
        9 => ("local Y.acc: f32[3, 3, 1, 8]:", "for w.r in 0..3 unrolled:"),
        _ => ("local Y.acc: f32[3, 4, 1, 8]:", "for w.r in 0..4 unrolled:"),
    };
    for target in targets().into_iter().filter(|t| t.kind == TargetKind::Cpu) {
        for (i, (kernel, b)) in cases.iter().enumerate() {
            let (mut pl, k) = texc_tests::load_file(target.name, "benches/grouped_conv_blocked.tex", Some(kernel))
                .unwrap_or_else(|e| panic!("{e}"));
            let p = pl.specialize(k, b).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
            let f = texc_tests::loops(&mut pl, k, &p);
            if *kernel == "grouped_nchw8c_blocked" && target.name == "x86-avx2" {
                let text = texc_schedules::ir::print(&f);
                assert!(text.contains("local Yl: f32[3, 4, 8]:"), "the schedule's register block:\n{text}");
            }
            if *kernel == "grouped_nchw8c" && target.name == "x86-avx2" {
                // A group's three filter blocks (each its own vector of
                // filters), the group's rows outside, × positions (each its
                // own broadcast of the input).
                let text = texc_schedules::ir::print(&f);
                let (acc, positions) = default_block(b.shapes.iter().find(|(n, _)| n == "WP").map_or(0, |s| s.1) - 2);
                let lines: Vec<&str> = text.lines().map(str::trim).collect();
                let nested = lines.windows(2).any(|w| w == ["for kb.i.r in 0..3 unrolled:", positions]);
                assert!(text.contains(acc) && nested, "the default block:\n{text}");
            }
            check(kernel, &p, &f, target, 30 + i as u64);
        }
    }
    // AVX-512's 24 accumulators (compiled, whether or not this CPU runs
    // it): 7 of 28 positions × the group's 3 blocks, each row a vector of
    // eight lanes (half of AVX-512's).
    let (mut pl, k) = texc_tests::load_file("x86-avx512", "benches/grouped_conv_blocked.tex", Some("grouped_nchw8c"))
        .unwrap_or_else(|e| panic!("{e}"));
    let b = bind(&[("N", 1), ("CB", 21), ("HP", 30), ("WP", 30), ("KB", 21)], &[]);
    let p = pl.specialize(k, &b).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    let text = texc_schedules::ir::print(&texc_tests::loops(&mut pl, k, &p));
    assert!(text.contains("local Y.acc: f32[3, 7, 8]:"), "AVX-512's default block:\n{text}");
}
