//! Schedules change speed, never results: default schedules of every
//! example and std operator, and random legal schedules of matmul, conv2d,
//! softmax and layer_norm, lowered to loop nests and run by the loop-nest
//! evaluator, must match the interpreter (at sizes no tile divides).

use std::collections::HashMap;
use texc_compiler::interp::{self, Arg};
use texc_compiler::{Bindings, Program};
use texc_runtime::SplitMix64;
use texc_schedules::eval;
use texc_tests::rel_error;

fn random_args(p: &Program, seed: u64) -> Vec<Arg> {
    interp::bind_args(p, HashMap::new(), &[], seed).expect("binds")
}

/// Every output of `got` within 1e-5 of the interpreter's on the same arguments.
fn assert_outputs(what: &str, p: &Program, f: &texc_schedules::LoopFunc, seed: u64, got: Vec<texc_runtime::Tensor>) {
    let want = interp::run(p, random_args(p, seed)).expect("interp");
    for (w, g) in want.iter().zip(&got) {
        let err = rel_error(g, w);
        assert!(err <= 1e-5, "{what} differs from interp by {err:e}\n{}", texc_schedules::ir::print(f));
    }
}

/// `f` compiled for `t` and run, against the interpreter; where `t` cannot
/// run on this machine, a printed reason instead.
fn assert_runs_as_interp(
    what: &str,
    t: &texc_compiler::target::Target,
    p: &Program,
    f: &texc_schedules::LoopFunc,
    seed: u64,
) {
    match t.check_runs_here() {
        Ok(()) => {
            let got = texc_tests::compile_loops(t, f).expect("compiles").run(random_args(p, seed)).expect("runs");
            assert_outputs(what, p, f, seed, got);
        }
        Err(why) => eprintln!("skipped running {what}: {why}"),
    }
}

fn assert_same(name: &str, p: &Program, f: &texc_schedules::LoopFunc, seed: u64) {
    let got = eval::run(f, random_args(p, seed)).expect("loop eval");
    assert_outputs(&format!("{name}: loop nest"), p, f, seed, got);
}

#[test]
fn default_schedules_match_the_interpreter() {
    for (name, p) in texc_tests::example_programs(2e7) {
        let f = texc_tests::default_lowered("x86-avx2", &p);
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
    let mut attached = 0;
    for (file, kernel, shapes) in texc_tests::RANDOM_SCHEDULE_CASES {
        let base = texc_tests::random_case_program(file, kernel, shapes);
        for trial in 0..25 {
            let f = texc_tests::randomly_scheduled(&base, &mut rng);
            attached += usize::from(texc_schedules::ir::print(&f).contains("local "));
            assert_same(&format!("{file} trial {trial}"), &base, &f, trial);
        }
    }
    // Random `compute_at`s are among the schedules drawn.
    assert!(attached >= 10, "only {attached} random schedules attached a stage");
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
    ];
    let kernel =
        "kernel mm(A: f32[M = 8, K = 8], B: f32[K, N = 8]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]); }";
    expect_schedule_errors(kernel, &cases);
}

#[test]
fn illegal_attachments_are_spanned_errors() {
    let cases = [
        ("compute_at C C.i;", "cannot compute `C` inside another stage: it is an output"),
        ("compute_at T C.q;", "`C` has no axis `q`"),
        ("compute_at T X.i;", "no stage named `X`"),
        ("reorder C(i, k, j); vectorize C.j; compute_at T C.j;", "inside the vectorized loop `j`"),
        ("compute_at T C.i; split C.i by 2 -> (a, b);", "was split or fused after"),
        ("compute_at T C.i; compute_at T C.j;", "already computed inside another stage"),
        ("parallel C.i; parallel T.i; compute_at T C.i;", "has a parallel loop but runs inside a parallel loop"),
        ("compute_at U C.i;", "`V` also reads `U`, but it does not run inside `C.i`"),
        ("compute_at U V.i;", "`C` also reads `U`"),
        ("compute_at W C.j;", "index `i / 2` is not affine"),
        ("reorder C(j, i, k); compute_at T C.j;", "an attached buffer may take at most 16777216"),
        ("compute_at T V.i;", "`C` also reads `T`, but it does not run inside `V.i`"),
        ("cache_read A for C at C.k in shared -> As;", "memory scope `shared` is for GPUs"),
        ("cache_read Q for C at C.k -> As;", "no tensor named `Q`"),
        ("cache_read B for C at C.k -> A;", "already a tensor"),
        ("cache_read A for C at V.i -> As;", "must name an axis of `C` itself"),
        ("cache_read B for V at V.i -> Bs;", "`V` does not read `B`"),
        ("cache_read B for C at C.k layout (k) -> Bs;", "does not cover axis `j`"),
        ("cache_read B for C at C.k layout (j, k / 4, k % 8) -> Bs;", "does not cover axis `k`"),
        ("cache_read B for C at C.k layout (j, q) -> Bs;", "the cache has no axis `q`"),
        ("cache_read B for C at C.k layout (j, k * 2) -> Bs;", "a layout dimension is an axis"),
    ];
    // T whole is 2100 × 2100 floats, over what a local buffer may take.
    let kernel = "kernel two(A: f32[M = 2100, K = 2100], B: f32[K, N = 8]) -> C: f32[M, N] {
    T[i, k] = A[i, k] * 2.0;
    U[i, k] = A[i, k] + 1.0;
    V[i, k] = U[i, k] * U[i, k];
    W[i, k] = A[i, k] - 1.0;
    C[i, j] = sum[k](T[i, k] * B[k, j] + U[i, k] + V[i, k] + W[i / 2, k]);
}";
    expect_schedule_errors(kernel, &cases);
}

/// Each schedule body in `cases` must be rejected by the scheduler with a
/// message containing the expected text, at a span in the schedule line.
fn expect_schedule_errors(kernel: &str, cases: &[(&str, &str)]) {
    for &(prims, want) in cases {
        let src = format!("{kernel}\nschedule {} for x86-avx2 {{ {prims} }}", kernel_name(kernel));
        let line = src.lines().count();
        let text = match texc_tests::own_schedule("x86-avx2", "s.tex", &src) {
            Ok(_) => panic!("{prims}: accepted"),
            Err(text) => text,
        };
        assert!(text.contains(want), "{prims}: expected `{want}` in\n{text}");
        assert!(text.contains(&format!("s.tex:{line}:")), "{prims}: not spanned:\n{text}");
    }
}

fn kernel_name(src: &str) -> &str {
    src.trim_start_matches("kernel ").split('(').next().expect("a kernel")
}

/// Specialize the only kernel of `src` and apply its `x86-avx2` schedule.
fn scheduled(name: &str, src: &str) -> (Program, texc_schedules::LoopFunc) {
    texc_tests::own_schedule("x86-avx2", name, src).unwrap_or_else(|e| panic!("{e}"))
}

/// The loop nest and its x86 code both match the interpreter.
fn assert_same_compiled(name: &str, p: &Program, f: &texc_schedules::LoopFunc, seed: u64) {
    assert_same(name, p, f, seed);
    let target = texc_compiler::target::lookup("x86-avx2").expect("registered");
    let got = texc_tests::compile_loops(target, f).expect("compiles").run(random_args(p, seed)).expect("runs");
    assert_outputs(&format!("{name}: x86"), p, f, seed, got);
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
    let (p, f) = scheduled("cw.tex", src);
    assert!(texc_schedules::ir::print(&f).contains("local Cl: f32[6, 16]:"));
    assert_same_compiled("cache_write", &p, &f, 9);
}

/// `compute_at` of a padded input per block of output rows (boxes that
/// overlap and leave the tensor at the borders), sibling attachments of
/// row statistics (`mu`, `var` with their hoisted reductions), and
/// `cache_read` packing of a GEMM operand into panels, at sizes no tile
/// divides.
#[test]
fn attachments_keep_results() {
    let pad =
        "kernel conv(X: f32[N = 2, C = 3, H = 11, W = 13], Wt: f32[K = 5, C, R = 3, S = 3]) -> Y: f32[N, K, H, W] {
    Xp[n, c, y in 0..H + 2, x in 0..W + 2] =
        select(y >= 1 && y < H + 1 && x >= 1 && x < W + 1, X[n, c, y - 1, x - 1], 0.0);
    Y[n, k, h, w] = sum[c, r, s](Xp[n, c, h + r, w + s] * Wt[k, c, r, s]);
}
schedule conv for x86-avx2 {
    split Y.h by 4 -> (ho, hi);
    split Y.w by 8 -> (wo, wi);
    reorder Y(n, ho, k, hi, c, r, s, wo, wi);
    compute_at Xp Y.ho;
    split Xp.x by 8 -> (xo, xi);
    vectorize Xp.xi;
    vectorize Y.wi;
    parallel Y.n;
}";
    let rows = "kernel ln(X: f32[N = 7, D = 37]) -> Y: f32[N, D] {
    mu[n] = sum[d](X[n, d]) / D;
    xc[n, d] = X[n, d] - mu[n];
    var[n] = sum[d](xc[n, d] * xc[n, d]) / D;
    Y[n, d] = xc[n, d] / sqrt(var[n] + 1e-5);
}
schedule ln for x86-avx2 {
    split Y.d by 8 -> (do, dv);
    vectorize Y.dv;
    parallel Y.n;
    compute_at mu Y.n;
    compute_at xc Y.n;
    compute_at var Y.n;
    split xc.d by 8 -> (do, dv);
    vectorize xc.dv;
}";
    let pack = "kernel sgemm(A: f32[M = 37, K = 19], B: f32[K, N = 70]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j]);
}
schedule sgemm for x86-avx2 {
    tile C(i, j) by (6, 16) -> (io, jo, ii, ji);
    split C.k by 8 -> (ko, ki);
    split C.jo by 2 -> (jb, jo2);
    reorder C(jb, ko, io, jo2, ki, ii, ji);
    cache_read B for C at C.ko layout (j / 16, k, j % 16) -> Bp;
    cache_read A for C at C.io -> Ap;
    split Bp.j by 16 -> (jo, ji);
    vectorize Bp.ji;
    unroll C.ii;
    vectorize C.ji;
    parallel C.jb;
}";
    // Read at `h / 2`, `(h - 1) / 2` and `h % 2`: the block of 4 rows
    // `4·ho + hi` reads rows `2·ho + [-1, 1]` of each phase (the first
    // block's row -1 and the last block's past 7 are not computed).
    let halves = "kernel up(X: f32[H = 7, W = 9]) -> Y: f32[2 * H, 2 * W] {
    T[p in 0..2, i, j] = select(p == 0, X[i, j], 2.0 * X[i, j] + 1.0);
    Y[h, w] = T[h % 2, h / 2, w / 2] - T[(h + 1) % 2, h / 2, w / 2]
        + select(h >= 1, T[1, (h - 1) / 2, w / 2], 0.0);
}
schedule up for x86-avx2 {
    split Y.h by 4 -> (ho, hi);
    compute_at T Y.ho;
    parallel Y.ho;
}";
    for (name, src, expect) in [
        ("halves", halves, "local T: f32[2, 3, 9]:"),
        ("pad", pad, "local Xp: f32[1, 3, 6, 15]:"),
        ("rows", rows, "local xc: f32[1, 37]:"),
        ("pack", pack, "local Bp: f32[2, 8, 16]:"),
    ] {
        let (p, f) = scheduled(name, src);
        let text = texc_schedules::ir::print(&f);
        assert!(text.contains(expect), "{name}: expected `{expect}` in\n{text}");
        assert_same_compiled(name, &p, &f, 5);
    }
}

/// `src`'s one kernel, specialized at its default sizes.
fn program(name: &str, src: &str) -> Program {
    let (mut pl, k) = texc_tests::load_text("interp", name, src, None).expect("loads");
    texc_tests::specialize(&mut pl, k, &Bindings::default())
}

/// The only kernel of `src` at its declared sizes, lowered with the default
/// schedule for each x86 target: `check(target, loops as text)`, then the
/// loop nest and, where this CPU runs it, its compiled code against the
/// interpreter (seed 4).
fn default_on_x86(name: &str, src: &str, check: impl Fn(&str, &str)) {
    let p = program(&format!("{name}.tex"), src);
    for target in ["x86-avx2", "x86-avx512"] {
        let t = texc_compiler::target::lookup(target).expect("registered");
        let f = texc_tests::default_lowered(target, &p);
        check(target, &texc_schedules::ir::print(&f));
        assert_same(&format!("{name} {target}"), &p, &f, 4);
        assert_runs_as_interp(&format!("{name} {target}: x86"), t, &p, &f, 4);
    }
}

/// `N=67,D=501` as bindings.
fn shape_bindings(text: &str) -> Bindings {
    let shapes = text.split(',').map(|kv| kv.split_once('=').expect("k=v"));
    Bindings { shapes: shapes.map(|(k, v)| (k.into(), v.parse().expect("int"))).collect(), ..Bindings::default() }
}

/// The default schedule runs a normalization or a softmax as one pass over
/// the rows: the statistics (and exponentials) of each row are computed
/// inside the row loop, in buffers private to it.
#[test]
fn default_schedule_fuses_row_passes() {
    for (file, shapes) in [
        // Rows enough for the parallel loop (2^15 iterations), of a length no vector divides.
        ("benches/layer_norm.tex", "N=67,D=501"),
        ("examples/softmax.tex", "N=67,D=501"),
        ("examples/norms.tex", "N=67,D=501"),
    ] {
        let b = shape_bindings(shapes);
        let kernel = (file == "examples/norms.tex").then_some("ln");
        let p = texc_tests::compile(file, kernel, &b).expect("compiles");
        let f = texc_tests::default_lowered("x86-avx2", &p);
        let text = texc_schedules::ir::print(&f);
        assert_eq!(f.body.len(), 1, "{file}: expected one pass over the rows:\n{text}");
        assert!(text.contains("parallel:\n    local "), "{file}: expected row-private buffers:\n{text}");
        assert_same_compiled(file, &p, &f, 3);
    }
}

/// Short rows (`W = 3`, `H·W = 36`) by default: an element-wise stage fuses
/// its trailing axes into one vectorized row whose reads are contiguous; a
/// reduction over `h, w` (and over `c, h, w` of a group, once `(g·Cg + c) /
/// Cg` is known to be `g`) becomes one long row, factored into vector
/// partial results. Results match the interpreter, at sizes where the fused
/// rows leave tails, on every x86 target that runs here.
#[test]
fn default_schedule_fuses_short_rows() {
    for (kernel, shapes, must) in [
        ("gn", "N=2,C=6,H=5,W=3", &["for h.w.v in 0..8 vectorized", "local Y.mu.r0.rf:", "local Y.var.r0.rf:"][..]),
        ("inorm", "N=2,C=3,H=9,W=4", &["for h.w.v in 0..8 vectorized", "local Y.mu.r0.rf:", "local Y.var.r0.rf:"][..]),
        ("inorm", "N=3,C=5,H=7,W=5", &["for h.w.v in 0..8 vectorized", "local Y.var.r0.rf:"][..]),
    ] {
        let b = shape_bindings(shapes);
        let p = texc_tests::compile("examples/norms.tex", Some(kernel), &b).expect("compiles");
        let f = texc_tests::default_lowered("x86-avx2", &p);
        let text = texc_schedules::ir::print(&f);
        for m in must {
            assert!(text.contains(m), "{kernel} {shapes}: expected `{m}`:\n{text}");
        }
        assert_same_compiled(kernel, &p, &f, 5);
        for target in ["x86-avx512", "cranelift"] {
            let t = texc_compiler::target::lookup(target).expect("registered");
            if t.check_runs_here().is_err() {
                continue;
            }
            let f = texc_tests::default_lowered(target, &p);
            let got = texc_tests::compile_loops(t, &f).expect("compiles").run(random_args(&p, 5)).expect("runs");
            assert_outputs(&format!("{kernel} {shapes}: {target}"), &p, &f, 5, got);
        }
    }
}

/// Long GEMM rows get BLIS's structure by default: a 16-wide register
/// block, 256-deep reduction slices (512-deep beyond 512) and the vector
/// operand packed into panels per slice — at sizes where every split
/// leaves a tail.
#[test]
fn default_gemm_schedule_packs_panels() {
    let default_loops_of = |elem: &str, shapes: &str| {
        let src = std::fs::read_to_string(texc_tests::root().join("benches/matmul.tex")).expect("reads");
        let (mut pl, k) = texc_tests::load_text("interp", "mm.tex", &src.replace("f32", elem), None).expect("loads");
        let p = pl.specialize(k, &shape_bindings(shapes)).expect("specializes");
        let f = texc_tests::default_lowered("x86-avx2", &p);
        (texc_schedules::ir::print(&f), p, f)
    };
    let default_loops = |shapes: &str| default_loops_of("f32", shapes);
    for (shapes, pack) in [("M=13,K=500,N=270", "f32[8, 256, 16]"), ("M=13,K=1100,N=270", "f32[8, 512, 16]")] {
        let (text, p, f) = default_loops(shapes);
        assert!(text.contains(&format!("local B.packed: {pack}:")), "expected packed panels:\n{text}");
        assert_same_compiled(&format!("default gemm {shapes}"), &p, &f, 4);
    }
    // A reduction of one slice (K ≤ 256) under long rows: packed once per
    // block of 256 columns (the outer, parallel loop, not fused with the
    // row blocks where neither has a tail, as at 12 × 2048), its
    // accumulators in registers; 2100 columns leave a partial block and panel.
    for n in [2048, 2100] {
        let one_slice = format!(
            "kernel mm(A: f32[M = 12, K = 100], B: f32[K, N = {n}]) -> C: f32[M, N] {{
    C[i, j] = sum[k](A[i, k] * B[k, j]);
}}"
        );
        default_on_x86("one slice", &one_slice, |target, text| {
            let panels = if target == "x86-avx2" { "f32[16, 100, 16]" } else { "f32[8, 100, 32]" };
            let want = format!("  for j.oo in 0..8 parallel:\n    local B.packed: {panels}:");
            assert!(text.contains(&want) && text.contains("local C.acc"), "{target}: `{want}`, accumulators:\n{text}");
        });
    }
    // f64 panels are twice as large: 256 columns of 200 would take 400 KiB.
    let (text, _, _) = default_loops_of("f64", "M=13,K=200,N=4100");
    assert!(text.contains("local B.packed: f64[16, 200, 8]:"), "128 columns a block:\n{text}");
    // An operand of two products gets a packed copy per product, each named apart.
    let two = "kernel two(A: f32[M = 13, K = 300], B: f32[K, N = 270], E: f32[M, K]) -> (C: f32[M, N], D: f32[M, N]) {
    C[i, j] = sum[k](A[i, k] * B[k, j]);
    D[i, j] = sum[k](E[i, k] * B[k, j]);
}";
    let (mut pl, k) = texc_tests::load_text("x86-avx2", "two.tex", two, None).expect("front end");
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let f = texc_tests::default_lowered("x86-avx2", &p);
    let text = texc_schedules::ir::print(&f);
    assert!(text.contains("local B.packed:") && text.contains("local B.packed1:"), "{text}");
    assert_same_compiled("two products", &p, &f, 6);
}

/// An unpacked product cut into slices (a 1×1 convolution from 600
/// channels whose rows are the image's `h, w`, 143 long) keeps each
/// slice's register block in a local, started from the sums the output
/// holds past the first slice and from zero at the first — `Y.acc =
/// select(c.o > 0, Y[..], 0)`, not from an init nest that stored zeros in
/// the whole output first (a pass over it, and a parallel loop to hand
/// out), the zero pass proving that each later slice reads what the one
/// before stored (it adds nothing) — and a bias and activation after it
/// stay a stage of their own (the block holds one slice's sums, not the
/// result): results match the interpreter where the slices, rows and
/// filters all leave tails.
#[test]
fn sliced_products_resume_their_sums_in_registers() {
    let src = "kernel p(X: f32[1, 600, 13, 11], W: f32[20, 600], B: f32[20]) -> Z: f32[1, 20, 13, 11] {
    Y[n, k, h, w] = sum[c](X[n, c, h, w] * W[k, c]);
    Z[n, k, h, w] = max(Y[n, k, h, w] + B[k], 0.0);
}";
    default_on_x86("sliced", src, |target, text| {
        let lines = |start: &'static str| text.lines().filter(move |l| l.trim_start().starts_with(start));
        assert!(
            text.contains("for c.o in 0..1") && text.contains("for c.o in 1..2"),
            "{target}: slices of 600:\n{text}"
        );
        assert!(
            lines("Y.acc[").any(|l| l.contains("= select(c.o > 0, Y[")),
            "{target}: the block resumes the output's sums past the first slice:\n{text}"
        );
        assert!(lines("Y[").all(|l| !l.ends_with("= 0.0f32")), "{target}: no init nest:\n{text}");
        assert!(lines("Y[").all(|l| !l.contains("W[") && !l.contains("W_")), "{target}: no product in memory:\n{text}");
        assert!(lines("Z[").count() > 0 && lines("Z[").all(|l| !l.contains(".acc[")), "{target}:\n{text}");
    });
    let p = program("sliced.tex", src);
    for target in ["x86-avx2", "x86-avx512"] {
        let mut f = texc_tests::default_lowered(target, &p);
        let zeroed = texc_schedules::zeroing::zero_uncovered(&mut f, false);
        assert!(zeroed.is_empty(), "{target}: zeroed {zeroed:?}:\n{}", texc_schedules::ir::print(&f));
    }
    for target in ["cranelift", "host"] {
        let t = texc_compiler::target::lookup(target).expect("registered");
        let f = texc_tests::default_lowered(target, &p);
        assert_runs_as_interp(&format!("sliced {target}"), t, &p, &f, 7);
    }
}

/// A reduction no deeper than the slices the caches allow, over a row
/// too short for blocks of packed panels, is one slice: 400 channels over
/// 13 × 11 positions keep the bias and activation in the register block's
/// epilogue, with no slice loop and no zeroing nest; the same depth over
/// 23 × 13 positions (299 columns: two column blocks) stays two slices of
/// 256.
#[test]
fn short_rows_keep_a_reduction_up_to_the_deepest_slice_whole() {
    let src = |h: i64, w: i64| {
        format!(
            "kernel p(X: f32[1, 400, {h}, {w}], W: f32[20, 400], B: f32[20]) -> Z: f32[1, 20, {h}, {w}] {{
    Y[n, k, h, w] = sum[c](X[n, c, h, w] * W[k, c]);
    Z[n, k, h, w] = max(Y[n, k, h, w] + B[k], 0.0);
}}"
        )
    };
    default_on_x86("short", &src(13, 11), |target, text| {
        assert!(!text.contains("for c.o in"), "{target}: one slice of 400:\n{text}");
        let epilogue = text.lines().filter(|l| l.trim_start().starts_with("Z[")).collect::<Vec<_>>();
        assert!(
            !epilogue.is_empty() && epilogue.iter().all(|l| l.contains(".acc[") && l.contains("B[")),
            "{target}: bias and activation applied to the block:\n{text}"
        );
    });
    default_on_x86("long", &src(23, 13), |target, text| {
        assert!(text.contains("for c.o in 0..1") && text.contains("for c.o in 1..2"), "{target}: two slices:\n{text}");
    });
}

/// A reduction's trailing axes fuse into one row while it would take a
/// short register block (at most six vectors): a 1 × 1 convolution's rows
/// of 35 are five vectors on AVX2, whose short block held two filters and
/// swept the whole image once per pair; fused, `h, w` is one row for the
/// packed micro-kernel (AVX-512's rows of 35, under four vectors, fused
/// before). An element-wise stage keeps rows of four vectors or more as
/// they are.
#[test]
fn product_rows_of_few_vectors_fuse_with_the_axes_before_them() {
    let conv = "kernel p(X: f32[1, 40, 9, 35], W: f32[16, 40]) -> Y: f32[1, 16, 9, 35] {
    Y[n, k, h, w] = sum[c](X[n, c, h, w] * W[k, c]);
}";
    default_on_x86("fused", conv, |target, text| {
        assert!(text.contains("for h.w.") && !text.contains("for w.o"), "{target}: h, w fused:\n{text}");
    });
    let p = program("scale.tex", "kernel s(X: f32[9, 35]) -> Y: f32[9, 35] {\n    Y[h, w] = X[h, w] * 2.0;\n}");
    let text = texc_schedules::ir::print(&texc_tests::default_lowered("x86-avx2", &p));
    assert!(text.contains("for w.o") && !text.contains("h.w"), "element-wise rows of 35 stay:\n{text}");
}

/// Vector loads whose lanes read a fixed pattern (`X[h, w / 4]` with `w`
/// split by 16: lanes 0–3 read one element, 4–7 the next) are one load of
/// the span and a shuffle, not a gather; `(w + 2) / 3` with `w = 16·wo + wv`
/// is not such a pattern (16·wo is not known modulo 3) and stays a gather.
/// Under a `select`, the loads of each side are masked: the span is loaded
/// under the mask of the positions active lanes read. All match the
/// interpreter on every x86 target that runs here, at a width 16 does not
/// divide.
#[test]
fn lane_pattern_loads_keep_results() {
    let src = "kernel up(X: f32[H = 5, W = 21]) -> Y: f32[H, 4 * W] {
    Y[h, w] = X[h, w / 4] * 2.0 + X[h, w / 8 + w % 2] - X[h, (w + 2) / 3 % W]
        + select(w % 3 == 1, X[h, w / 4], 0.5 * X[h, W - 1 - w / 8]);
}
schedule up for x86-avx2 {
    split Y.w by 16 -> (wo, wv);
    vectorize Y.wv;
}";
    let (p, f) = scheduled("pattern.tex", src);
    assert_same("pattern loops", &p, &f, 3);
    let mut pl = texc_tests::pipeline("x86-avx2");
    let legal = pl.legalize(f.clone()).expect("legal");
    let ir = pl.emit_text(&legal, "llvm").expect("llvm text");
    // One gather in the 16-lane body and one in the 4-lane tail (84 = 5·16 + 4).
    let gathers = ir.lines().filter(|l| l.contains("call") && l.contains("@llvm.masked.gather")).count();
    assert_eq!(gathers, 2, "only `(w + 2) / 3` gathers:\n{ir}");
    assert!(ir.contains("span"), "pattern loads load a span:\n{ir}");
    let (targets, _) = texc_tests::runnable_targets();
    for t in targets.iter().filter(|t| t.name.starts_with("x86")) {
        let got = texc_tests::compile_loops(t, &f).expect("compiles").run(random_args(&p, 3)).expect("runs");
        assert_outputs(&format!("pattern loads on {}", t.name), &p, &f, 3, got);
    }
}

/// Indices in `lo..hi` for `I`, random data for the rest.
fn args_with_indices(p: &Program, lo: i64, hi: i64, seed: u64) -> Vec<Arg> {
    let i = p.params.iter().find_map(|param| match param {
        texc_compiler::tir::ProgramParam::Tensor(t) if p.tensor(*t).name == "I" => Some(p.tensor(*t).clone()),
        _ => None,
    });
    let i = i.expect("an index input `I`");
    let shape: Vec<usize> = i.shape.iter().map(|&d| d as usize).collect();
    let mut rng = SplitMix64::new(seed);
    let n: usize = shape.iter().product();
    let span = (hi - lo) as u64;
    let data: Vec<i64> = (0..n).map(|_| lo + (rng.next_u64() % span) as i64).collect();
    let data = match i.elem {
        texc_runtime::DType::I32 => texc_runtime::Data::I32(data.into_iter().map(|x| x as i32).collect()),
        texc_runtime::DType::I8 => texc_runtime::Data::I8(data.into_iter().map(|x| x as i8).collect()),
        _ => texc_runtime::Data::I64(data),
    };
    let ids = texc_runtime::Tensor { shape, data };
    interp::bind_args(p, HashMap::from([("I".to_string(), ids)]), &[], seed).expect("binds")
}

/// A one-hot sum (how `std.nn`'s `embedding` is written) runs as one load
/// of the picked row (`normalize::one_hot_gather`), with the same results
/// as the interpreter's sum, indices outside the table included, on every
/// target; a sum whose condition involves the summed variable on both
/// sides, or whose index type is narrower than 32 bits, is left as it is.
#[test]
fn one_hot_sums_run_as_gathers() {
    let emb = "import std.nn;\nkernel e1(I: i64[N], W: f32[V, D]) -> Y: f32[N, D] { Y = embedding(I, W); }\n\
               kernel e2(I: i64[B, N], W: f32[V, D]) -> Y: f32[B, N, D] { Y = embedding(I, W); }\n\
               kernel e3(I: i32[N], W: f32[D, V]) -> Y: f32[N, D] {\n    \
               Y[n, d] = sum[v](select(i32(v) == I[n] - 1, W[d, v], 0.0));\n}\n\
               kernel e4(I: i64[N], W: f32[V, D]) -> Y: f32[N, D] {\n    \
               Y[n, d] = sum[v](select(I[n] + i64(v) == i64(2 * v), W[v, d], 0.0));\n}\n\
               kernel e5(I: i8[N], W: f32[V, D]) -> Y: f32[N, D] {\n    \
               Y[n, d] = sum[v](select(I[n] == i8(v), W[v, d], 0.0));\n}\n";
    for (kernel, shapes, gather) in [
        ("e1", "N=9,V=13,D=7", true),
        ("e2", "B=3,N=5,V=40,D=33", true),
        ("e3", "N=17,V=6,D=9", true),
        ("e4", "N=8,V=10,D=4", false),
        // i8 indices wrap (`i8(v)` for v ≥ 128): several terms can match, so no gather.
        ("e5", "N=6,V=130,D=3", false),
    ] {
        let b = shape_bindings(shapes);
        let (mut pl, k) = texc_tests::load_text("interp", "emb.tex", emb, Some(kernel)).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &b);
        let v = shapes.split(',').find_map(|kv| kv.strip_prefix("V=")).and_then(|x| x.parse::<i64>().ok());
        let v = v.expect("V");
        for target in ["x86-avx2", "x86-avx512", "cranelift", "nvptx-sm90"] {
            let t = texc_compiler::target::lookup(target).expect("registered");
            let f = texc_tests::default_lowered(target, &p);
            let text = texc_schedules::ir::print(&f);
            assert_eq!(text.contains("index(clamp("), gather, "{kernel} on {target}:\n{text}");
            let args = || args_with_indices(&p, -3, v + 3, 7);
            let want = interp::run(&p, args()).expect("interp");
            let eval = eval::run(&f, args()).expect("evaluates");
            assert_eq!(rel_error(&eval[0], &want[0]), 0.0, "{kernel} on {target}: loop IR");
            if t.check_runs_here().is_err() && t.gpu.is_none() {
                continue;
            }
            let mut pl = texc_tests::pipeline(target);
            let legal = pl.legalize(f).expect("legal");
            let got = pl.compile(&legal).expect("compiles").run(args()).expect("runs");
            assert_eq!(rel_error(&got[0], &want[0]), 0.0, "{kernel} on {target}");
        }
    }
}

/// `schedule K for T = auto;` hands the kernel to the autotuner: it runs the
/// default schedule for `T`, with the knobs given (or the tuning
/// database's), not the schedule of a target `T` extends; `texc check`
/// accepts it.
#[test]
fn an_auto_schedule_is_the_default_schedule_and_its_knobs() {
    let src = "kernel mm(A: f32[M = 96, K = 64], B: f32[K, N = 80]) -> C: f32[M, N] {\n    \
               C[i, j] = sum[k](A[i, k] * B[k, j]);\n}\n\
               schedule mm for x86-avx2 {\n    split C.j by 8 -> (jo, ji);\n    reorder C(i, jo, k, ji);\n    \
               vectorize C.ji;\n}\nschedule mm for x86-avx512 = auto;\nschedule mm for nvptx-sm90 = auto;\n";
    texc_tests::check_text("auto.tex", src).unwrap_or_else(|e| panic!("{e}"));
    let lowered = |target: &str, knobs: &[(&str, i64)]| {
        let (mut pl, k) = texc_tests::load_text(target, "auto.tex", src, None).expect("loads");
        pl.options.knobs = knobs.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        (texc_schedules::ir::print(&texc_tests::loops(&mut pl, k, &p)), p)
    };
    let (hand, _) = lowered("x86-avx2", &[]);
    assert!(hand.contains("for jo in 0..10"), "{hand}");
    for target in ["x86-avx512", "nvptx-sm90"] {
        let (auto, p) = lowered(target, &[]);
        let mut pl = texc_tests::pipeline(target);
        let legal = pl.legalize(texc_tests::default_lowered(target, &p)).expect("legal");
        assert_eq!(auto, texc_schedules::ir::print(&legal), "{target}: the default schedule");
    }
    let (rows, _) = lowered("x86-avx512", &[("rows", 2)]);
    assert_ne!(rows, lowered("x86-avx512", &[]).0, "a knob of the default schedule applies");
}

/// The default schedule's `vec` and `par` knobs: 256-bit vectors on an
/// AVX-512 target, and no loop on the thread pool; results unchanged.
#[test]
fn vector_width_and_threads_are_knobs_of_the_default_schedule() {
    for (file, shapes) in [("benches/layer_norm.tex", "N=300,D=200"), ("benches/matmul.tex", "M=67,K=45,N=129")] {
        let b = shape_bindings(shapes);
        let p = texc_tests::compile(file, None, &b).expect("compiles");
        let lowered = |knobs: &[(&str, i64)]| {
            let mut pl = texc_tests::pipeline("x86-avx512");
            pl.options.knobs = knobs.iter().map(|(n, v)| (n.to_string(), *v)).collect();
            pl.default_loops(p.clone()).expect("schedules and lowers").lowered
        };
        let wide = texc_schedules::ir::print(&lowered(&[]));
        let narrow = lowered(&[("vec", 256), ("par", 0)]);
        let text = texc_schedules::ir::print(&narrow);
        let widest = |t: &str| {
            t.lines()
                .filter_map(|l| l.trim().strip_suffix(" vectorized:")?.rsplit("..").next()?.parse::<i64>().ok())
                .max()
                .unwrap_or(0)
        };
        assert_eq!(widest(&wide), 2 * widest(&text), "{file}: half the lanes:\n{text}");
        assert!(wide.contains("parallel") && !text.contains("parallel"), "{file}:\n{text}");
        assert_same(file, &p, &narrow, 3);
        let t = texc_compiler::target::lookup("x86-avx512").expect("registered");
        assert_runs_as_interp(&format!("{file}: x86-avx512"), t, &p, &narrow, 3);
    }
}

/// The space `texc tune` searches for a kernel without a schedule block is
/// the default schedule's knobs (`texc_schedules::knobs`): every point of it
/// must compute what the interpreter computes. Random points, on odd sizes
/// that no block, panel or vector divides, of each kind of kernel the space
/// was made for: long products (packed panels, k slices), short-row
/// contractions (a convolution, a 1×1 convolution), a depthwise
/// convolution, and row reductions with their element-wise passes.
#[test]
fn random_points_of_the_default_schedules_space_match_the_interpreter() {
    let space = texc_schedules::knobs::space(texc_schedules::knobs::Family::Cpu);
    let cases = [
        ("benches/matmul.tex", "M=45,K=530,N=203"),
        ("benches/matmul.tex", "M=13,K=7,N=61"),
        ("benches/conv_layer.tex", "C=5,H=9,W=11,K=14"),
        ("benches/conv1x1.tex", "C=6,H=7,W=9,K=19"),
        ("examples/depthwise.tex", "N=1,C=5,H=11,W=13"),
        ("examples/softmax.tex", "N=37,D=300"),
        ("benches/layer_norm.tex", "N=9,D=77"),
    ];
    let target = texc_compiler::target::lookup("x86-avx512").expect("registered");
    let runs_here = target.check_runs_here().is_ok();
    let mut rng = SplitMix64::new(2026);
    for (file, shapes) in cases {
        let p = texc_tests::compile(file, None, &shape_bindings(shapes)).expect("compiles");
        let mut nests = std::collections::HashSet::new();
        for seed in 0..4 {
            let knobs: Vec<(String, i64)> = space
                .iter()
                .map(|(name, values)| (name.to_string(), values[(rng.next_u64() % values.len() as u64) as usize]))
                .collect();
            let mut pl = texc_tests::pipeline(target.name);
            pl.options.knobs = knobs.iter().cloned().collect();
            let f = pl.default_loops(p.clone()).expect("schedules and lowers").lowered;
            let what = format!("{file} [{shapes}] with {knobs:?}");
            nests.insert(texc_schedules::ir::print(&f));
            let got = eval::run(&f, random_args(&p, seed)).expect("loop eval");
            assert_outputs(&format!("{what}: loop nest"), &p, &f, seed, got);
            if runs_here {
                let got = texc_tests::compile_loops(target, &f).expect("compiles").run(random_args(&p, seed));
                assert_outputs(&format!("{what}: x86-avx512"), &p, &f, seed, got.expect("runs"));
            }
        }
        assert!(nests.len() >= 2, "{file}: the knobs change the loop nest");
    }
}

/// The default schedule multiplies by the reciprocal of a row's divisor
/// only where that keeps the kernel's meaning: not inside a `select`
/// branch (the divisor may be a read that only the guard keeps in bounds),
/// not for integer results (an ulp can move a floor or a rounding), and
/// each reciprocal stage under a name of its own; results match the
/// interpreter, compiled and in the evaluator on the reparsed loop text.
#[test]
fn reciprocals_of_row_divisors_keep_guards_and_integers() {
    let cases = [
        (
            "guarded",
            "kernel g(X: f32[N = 6, D = 40], S: f32[M = 3]) -> Y: f32[N, D] {\n    \
                     Y[n, d] = select(n >= 3, X[n, d] / S[n - 3], 0.0);\n}\n",
            0,
        ),
        (
            "integer",
            "kernel q(X: f32[N = 5, D = 40], S: f32[N]) -> Q: i32[N, D] {\n    \
                     Q[n, d] = i32(floor(X[n, d] * 1000.0 / S[n]));\n}\n",
            0,
        ),
        (
            "two",
            "kernel t(X: f32[N = 5, D = 40], S: f32[N], T: f32[N]) -> Y: f32[N, D] {\n    \
                 Y[n, d] = X[n, d] / S[n] + X[n, d] / T[n];\n}\n",
            2,
        ),
        (
            "softmax-like",
            "kernel s(X: f32[N = 5, D = 40]) -> Y: f32[N, D] {\n    \
                          e[n, d] = exp(X[n, d]);\n    s[n] = sum[d](e[n, d]);\n    Y[n, d] = e[n, d] / s[n];\n}\n",
            1,
        ),
    ];
    for (name, src, reciprocals) in cases {
        let (mut pl, k) = texc_tests::load_text("x86-avx2", &format!("{name}.tex"), src, None).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
        let f = pl.default_loops(p.clone()).expect("schedules and lowers").lowered;
        let text = texc_schedules::ir::print(&f);
        let declared = |l: &str| l.trim_start().starts_with("local ") || l.trim_start().starts_with("temp ");
        let stages = text.lines().filter(|l| l.contains(".inv") && declared(l)).count();
        assert_eq!(stages, reciprocals, "{name}:\n{text}");
        let again =
            texc_schedules::text::parse(&text, texc_grammar::FileId(0)).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_same(name, &p, &again.func, 5);
        assert_same_compiled(name, &p, &f, 5);
    }
}

/// Which element-wise temporaries the default schedule stores once rather
/// than recomputes in each reader: one that branches on a layout change
/// along its rows (a Winograd output transform's `A[n, w / 4]` under
/// `w % 4`), and one with more loads than storing it costs when it has two
/// readers; a one-load temporary with two readers, and a broadcast of a
/// per-group value (`M[n, w / 8]`, no branch) are inlined. Results match the
/// interpreter.
#[test]
fn costly_or_relaid_temporaries_are_stored_once() {
    let src = "kernel k(A: f32[N = 3, W = 37], B: f32[N, W], M: f32[N, G = 5]) -> Y: f32[N, W] {
    r[n, w in 0..W] = select(w % 4 == 0, A[n, w / 4] + 1.0, A[n, w / 4 + 1] * 2.0);
    five[n, w] = A[n, w] + B[n, w] * A[n, w] - B[n, w] + A[n, w] * A[n, w];
    one[n, w] = A[n, w] * 3.0;
    g[n, w] = B[n, w] - M[n, w / 8];
    s[n] = sum[w](five[n, w] * one[n, w]);
    Y[n, w] = r[n, w] + five[n, w] + one[n, w] + g[n, w] + s[n];
}";
    let p = program("relaid.tex", src);
    let f = texc_tests::default_lowered("x86-avx2", &p);
    let text = texc_schedules::ir::print(&f);
    let buffers: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("temp ").or(l.trim_start().strip_prefix("local ")))
        .filter_map(|l| l.split(':').next())
        .filter(|&b| !b.starts_with("s"))
        .collect();
    assert_eq!(buffers, ["r", "five"], "{text}");
    assert_same_compiled("relaid", &p, &f, 7);
}

/// An im2col gather (`cols[q, p] = X[p / W * 2 + q / 3, p % W * 2 + q % 3]`)
/// runs its flattened positions `p` as rows of `W`, each one vector (`W`
/// not a multiple of the vector width) or whole vectors, so that its lanes
/// read at constant offsets instead of gathering; results match the
/// interpreter at every width, on each x86 target that runs here.
#[test]
fn flattened_positions_run_as_rows() {
    for (w, piece) in [(28, "p.col in 0..28 vectorized"), (14, "p.col in 0..14 vectorized"), (32, "p.col.v in 0..")] {
        let src = format!(
            "kernel im2col(X: f32[H = {h}, V = {v}]) -> C: f32[Q = 9, P = {p}] {{
    C[q, p] = X[p / {w} * 2 + q / 3, p % {w} * 2 + q % 3];
}}",
            h = 2 * w + 1,
            v = 2 * w + 1,
            p = w * w,
        );
        let p = program("im2col.tex", &src);
        for target in ["x86-avx2", "x86-avx512"] {
            let t = texc_compiler::target::lookup(target).expect("registered");
            let f = texc_tests::default_lowered(target, &p);
            let text = texc_schedules::ir::print(&f);
            assert!(text.contains(piece), "{w}, {target}: `{piece}`:\n{text}");
            if t.check_runs_here().is_ok() {
                let got = texc_tests::compile_loops(t, &f).expect("compiles").run(random_args(&p, 3)).expect("runs");
                assert_outputs(&format!("im2col {w} {target}"), &p, &f, 3, got);
            }
        }
    }
}

/// A long product whose only outer loops are its reduction slices (no
/// column blocks: 196 columns; one batch) runs its row blocks in parallel
/// inside each slice instead of on one thread; results match the
/// interpreter at sizes with tails.
#[test]
fn long_products_without_column_blocks_run_their_row_blocks_in_parallel() {
    let src = "kernel gemm(W: f32[K = 70, Q = 1100], C: f32[N = 1, Q, P = 196]) -> Y: f32[N, K, P] {
    Y[n, k, p] = sum[q](W[k, q] * C[n, q, p]);
}";
    default_on_x86("slices", src, |target, text| {
        let slice = text.find("for q.o in 0..").expect("reduction slices");
        let parallel = text[slice..].find(" parallel:").map(|i| slice + i);
        let vector = text[slice..].find(" vectorized:").map(|i| slice + i);
        assert!(
            matches!((parallel, vector), (Some(a), Some(b)) if a < b),
            "{target}: a parallel loop inside the slices:\n{text}"
        );
    });
}

/// A depthwise convolution's register block, whose rows share only the
/// loads their window's taps meet at (`depthwise_windows_share_their_rows_loads`),
/// keeps 16 accumulator vectors on AVX-512 (4 rows of 4 vectors at 56
/// wide, 8 rows of 2 at 28), half the registers, where a convolution's,
/// whose rows share all their loads, keeps up to 24; results match the
/// interpreter, with tails (56 = 3 vectors and a half).
#[test]
fn depthwise_register_blocks_keep_fewer_accumulators() {
    for (w, acc) in [(56, "acc: f32[4, 4, 16]"), (28, "acc: f32[8, 2, 16]")] {
        let src = format!(
            "import std.nn;
kernel dw(X: f32[N = 1, C = 3, H = {w}, W = {w}], Wt: f32[C, 1, 3, 3]) -> Y: f32[N, C, H, W] {{
    Y = conv2d(X, Wt, pad = 1, groups = C);
}}"
        );
        let p = program("dw.tex", &src);
        let t = texc_compiler::target::lookup("x86-avx512").expect("registered");
        let f = texc_tests::default_lowered(t.name, &p);
        let text = texc_schedules::ir::print(&f);
        assert!(text.contains(acc), "{w}: `{acc}`:\n{text}");
        if t.check_runs_here().is_ok() {
            let got = texc_tests::compile_loops(t, &f).expect("compiles").run(random_args(&p, 5)).expect("runs");
            assert_outputs(&format!("depthwise {w}"), &p, &f, 5, got);
        }
    }
}

/// A stage that only moves and compares bytes (a `u8` padding copy, a max
/// pool of stride 1) fills a register with bytes — 32 lanes on AVX2, 64 on
/// AVX-512 — where one that widens them, or reads its row at stride 2,
/// keeps the f32 width (8 and 16 lanes); results are the interpreter's on
/// the targets this CPU runs.
#[test]
fn byte_stages_fill_registers_with_bytes() {
    let src = "kernel b(X: u8[N = 1, C = 3, H = 21, W = 70]) -> (P: u8[N, C, H + 2, W + 2], M: u8[N, C, H, W], \
               S: u8[N, C, H / 2, W / 2], Q: i32[N, C, H, W]) {
    P[n, c, y, x] = select(y >= 1 && y < H + 1 && x >= 1 && x < W + 1, X[n, c, y - 1, x - 1], u8(0));
    M[n, c, y, x] = max[r in 0..3, s in 0..3](select(y + r >= 1 && y + r < H + 1 && x + s >= 1 && x + s < W + 1, X[n, c, y + r - 1, x + s - 1], u8(0)));
    S[n, c, y, x] = max[r in 0..3, s in 0..3](select(2 * y + r >= 1 && 2 * x + s >= 1, X[n, c, 2 * y + r - 1, 2 * x + s - 1], u8(0)));
    Q[n, c, y, x] = i32(X[n, c, y, x]) * 3;
}";
    let p = program("b.tex", src);
    for (target, bytes, words) in [("x86-avx2", 32, 8), ("x86-avx512", 64, 16)] {
        let t = texc_compiler::target::lookup(target).expect("registered");
        let f = texc_tests::default_lowered(t.name, &p);
        let text = texc_schedules::ir::print(&f);
        let widest = |tensor: &str| {
            let at = text.find(&format!("  {tensor}[")).unwrap_or_else(|| panic!("{tensor} stored:\n{text}"));
            let before = &text[..at];
            let line = before.lines().rev().find(|l| l.trim_end().ends_with(" vectorized:")).expect("vectorized");
            line.trim()
                .strip_suffix(" vectorized:")
                .and_then(|l| l.rsplit("..").next())
                .and_then(|n| n.parse::<i64>().ok())
        };
        assert_eq!(widest("P"), Some(bytes), "{target}: padding copy:\n{text}");
        assert_eq!(widest("M"), Some(bytes), "{target}: max pool:\n{text}");
        assert_eq!(widest("S"), Some(words), "{target}: max pool of stride 2:\n{text}");
        assert_eq!(widest("Q"), Some(words), "{target}: widened bytes:\n{text}");
        match t.check_runs_here() {
            Ok(()) => {
                let got = texc_tests::compile_loops(t, &f).expect("compiles").run(random_args(&p, 5)).expect("runs");
                assert_outputs(&format!("bytes on {target}"), &p, &f, 5, got);
            }
            Err(e) => println!("skipped running on {target}: {e}"),
        }
    }
}

/// A depthwise convolution's rows each load their own input, through a
/// window along them (`Xp[n, c, y + r, x + s]`): by default the window's
/// tap `r` is unrolled inside `s`, just outside the block's unrolled rows,
/// so that the rows and taps that meet at one input row share its load,
/// and the block takes rows for half the vector registers, a short last
/// block allowed (a 7 × 7 window over rows of 14, two vectors each: 4 rows
/// a block on AVX2, 8 on AVX-512, not 2). Also
/// where the rows are long (the BLIS structure's blocks of two vectors)
/// and strided (a stride-2 window read from phases). A window of more than
/// seven taps, a pooling's window (max or average: memory bound, nothing
/// weighted by the tap), or a product whose rows share their loads (a
/// convolution's filters), keeps the reduction's order. Results match the interpreter
/// at sizes no block divides.
#[test]
fn depthwise_windows_share_their_rows_loads() {
    let dw = |c: i64, h: i64, w: i64, k: i64, stride: i64| {
        format!(
            "import std.nn;\nkernel dw(X: f32[N = 1, C = {c}, H = {h}, W = {w}], Wt: f32[C, 1, {k}, {k}]) \
             -> Y: f32[N, C, (H - 1) / {stride} + 1, (W - 1) / {stride} + 1] {{\n    \
             Y = conv2d(X, Wt, pad = {}, stride = {stride}, groups = {c});\n}}",
            k / 2
        )
    };
    let tap = |k: i64| format!("for s in 0..{k}:\n");
    for (src, k, rows, taps) in [
        (dw(5, 14, 14, 7, 1), 7, Some(["for h.r in 0..4 unrolled:", "for h.r in 0..8 unrolled:"]), true),
        (dw(3, 9, 100, 3, 1), 3, None, true),
        (dw(4, 13, 30, 5, 2), 5, None, true),
        (dw(3, 12, 14, 9, 1), 9, None, false),
    ] {
        default_on_x86("dw", &src, |target, text| {
            let unrolled = format!("for r in 0..{k} unrolled:");
            let inside_s = text
                .lines()
                .zip(text.lines().skip(1))
                .any(|(a, b)| a.trim_start().starts_with(tap(k).trim_end()) && b.trim_start() == unrolled);
            assert_eq!(inside_s, taps, "{target}: `r` unrolled inside `s`:\n{text}");
            if let Some([avx2, avx512]) = rows {
                let rows = if target == "x86-avx2" { avx2 } else { avx512 };
                assert!(text.contains(rows), "{target}: `{rows}`:\n{text}");
            }
        });
    }
    // Poolings (memory bound, nothing weighted by the tap) keep their
    // order: no window row `r` (or a separated pass's `….rows.r`) unrolled.
    for (pool, out) in [
        ("max_pool2d(X, 3, stride = 2, pad = 1)", "10, 15"),
        ("avg_pool2d(X, 2)", "10, 15"),
        ("avg_pool2d(X, 3, stride = 1, pad = 1)", "20, 30"),
    ] {
        let src = format!(
            "import std.nn;\nkernel pl(X: f32[N = 1, C = 3, H = 20, W = 30]) -> Y: f32[N, C, {out}] {{\n    Y = {pool};\n}}"
        );
        default_on_x86("pl", &src, |target, text| {
            let tap_unrolled = text.lines().any(|l| {
                let mut words = l.split_whitespace();
                let var = words.nth(1).unwrap_or("");
                (var == "r" || var.ends_with(".rows.r")) && l.ends_with(" unrolled:")
            });
            assert!(!tap_unrolled, "{target} {pool}:\n{text}");
        });
    }
    // A convolution's filters share their loads: its reduction keeps its order.
    let conv = "import std.nn;\nkernel cv(X: f32[N = 1, C = 3, H = 10, W = 12], Wt: f32[K = 16, C, 3, 3]) \
                -> Y: f32[N, K, H, W] {\n    Y = conv2d(X, Wt, pad = 1);\n}";
    default_on_x86("cv", conv, |target, text| {
        assert!(!text.contains("for r in 0..3 unrolled:"), "{target}: reduction order kept:\n{text}");
    });
}

/// A stage that transposes gathers each vector from one cache line per
/// lane: by default its loops run a block of lanes outermost and walk the
/// gathered tensor's lines in order inside it (`T[q, c, k] = A[k, c, q]`:
/// `k.o, c, q, k.v`); the axis along the lines (`q`, stride 1) is cut into
/// unrolled blocks of a vector's lanes, which codegen transposes in
/// registers, with two blocks of lanes inside each on AVX2 (a vector is
/// half a line); the axes the tensor does not move with (a filter
/// transform's `i, j`) are unrolled so that their copies share the gathers,
/// except where the blocks along the lines are made: there such an axis (a
/// batch of one read at a literal `0`) runs outside them. Results match the
/// interpreter at sizes whose lanes leave tails (also where one read of the
/// tensor is not affine). Where the blocks of lanes are too few to share
/// between threads (with a partial one), the blocks along the lines run
/// outermost instead; a gathered tensor that fits in L1, or blocks too few
/// both ways, keep the axes' order.
#[test]
fn transposing_stages_run_blocks_of_lanes_outermost() {
    let transpose = "kernel tr(A: f32[K = 140, C = 50, Q = 16]) -> T: f32[Q, C, K] { T[q, c, k] = A[k, c, q]; }";
    let filters = "import std.nn;
kernel wk(X: f32[N = 1, C = 40, H = 6, W = 10], Wt: f32[K = 140, C, 3, 3]) -> Y: f32[N, K, H, W] {
    Y = conv2d_winograd_f2k(X, Wt);
}";
    let small = "kernel tr(A: f32[K = 9, C = 50, Q = 16]) -> T: f32[Q, C, K] { T[q, c, k] = A[k, c, q]; }";
    // Large enough, but 21 filters make 2 blocks and a part on AVX2: too
    // little parallel work for the blocks as the outer loop (two cores
    // need two full blocks each; 37 filters' 4 and a part are taken).
    let few = "kernel tr(A: f32[K = 21, C = 50, Q = 16]) -> T: f32[Q, C, K] { T[q, c, k] = A[k, c, q]; }";
    // The same 21 filters along lines of 64: the blocks along the lines
    // (8 of 8 lanes, 4 of 16) share out instead, outermost.
    let lines = "kernel tr(A: f32[K = 21, C = 50, Q = 64]) -> T: f32[Q, C, K] { T[q, c, k] = A[k, c, q]; }";
    // A residual add reading a filters-last product of one batch at a
    // literal `0` (ConvNeXt's `x + γ · permute(block(x))`): the batch axis,
    // which moves no line of `A`, runs outside the blocks along the lines.
    let batch = "kernel tr(A: f32[1, K = 140, Q = 64], X: f32[N = 1, Q, K]) -> T: f32[N, Q, K] {
    T[n, q, k] = A[0, k, q] + X[n, q, k];
}";
    // A transposed tensor added to each of a batch: the batch axis, which
    // moves no line of `A`, runs outside the blocks too (each block then
    // loaded once per batch element, from L1 or L2).
    let broadcast = "kernel tr(A: f32[K = 140, Q = 64], X: f32[B = 3, Q, K]) -> T: f32[B, Q, K] {
    T[b, q, k] = A[k, q] + X[b, q, k];
}";
    // Read twice, once through a remainder: the strides come from the other read.
    let twice = "kernel tr(A: f32[K = 140, C = 200]) -> T: f32[C, K] { T[c, k] = A[k, c] + 2.0 * A[k, (c + 1) % C]; }";
    // The nest of the first block of lanes on (x86-avx2, x86-avx512).
    for (src, nest) in [
        (
            transpose,
            Some([
                "\n  for k.o.o in 0..9 parallel:\n    if k.o.o < 8:\n      for c in 0..50:\n        for q.o in 0..2:\n          \
                 for k.o.i in 0..2:\n            for q.i in 0..8 unrolled:\n              for k.v in 0..8 vectorized:",
                "\n  for k.o in 0..8 parallel:\n    for c in 0..50:\n      for q.o in 0..1:\n        \
                 for q.i in 0..16 unrolled:\n          for k.v in 0..16 vectorized:",
            ]),
        ),
        (
            filters,
            Some([
                "\n  for k.o in 0..17 parallel:\n    for c in 0..40:\n      for i in 0..4 unrolled:\n        \
                 for j in 0..4 unrolled:\n          for k.v in 0..8 vectorized:",
                "\n  for k.o in 0..8 parallel:\n    for c in 0..40:\n      for i in 0..4 unrolled:\n        \
                 for j in 0..4 unrolled:\n          for k.v in 0..16 vectorized:",
            ]),
        ),
        (
            twice,
            Some([
                "\n  for k.o.o in 0..8:\n    for c.o in 0..25:\n      for k.o.i in 0..2:\n        \
                 for c.i in 0..8 unrolled:\n          for k.v in 0..8 vectorized:",
                "\n  for k.o in 0..8:\n    for c.o in 0..12:\n      for c.i in 0..16 unrolled:\n        \
                 for k.v in 0..16 vectorized:",
            ]),
        ),
        (
            lines,
            Some([
                "\n  for q.o in 0..8 parallel:\n    for k.o.o in 0..1:\n      for c in 0..50:\n        \
                 for k.o.i in 0..2:\n          for q.i in 0..8 unrolled:\n            for k.v in 0..8 vectorized:",
                "\n  for q.o in 0..4 parallel:\n    for k.o in 0..1:\n      for c in 0..50:\n        \
                 for q.i in 0..16 unrolled:\n          for k.v in 0..16 vectorized:",
            ]),
        ),
        (
            batch,
            Some([
                "\n  for k.o.o in 0..8:\n    for n in 0..1:\n      for q.o in 0..8:\n        \
                 for k.o.i in 0..2:\n          for q.i in 0..8 unrolled:\n            for k.v in 0..8 vectorized:",
                "\n  for k.o in 0..8:\n    for n in 0..1:\n      for q.o in 0..4:\n        \
                 for q.i in 0..16 unrolled:\n          for k.v in 0..16 vectorized:",
            ]),
        ),
        (
            broadcast,
            Some([
                "\n  for k.o.o in 0..8:\n    for b in 0..3:\n      for q.o in 0..8:\n        \
                 for k.o.i in 0..2:\n          for q.i in 0..8 unrolled:\n            for k.v in 0..8 vectorized:",
                "\n  for k.o in 0..8:\n    for b in 0..3:\n      for q.o in 0..4:\n        \
                 for q.i in 0..16 unrolled:\n          for k.v in 0..16 vectorized:",
            ]),
        ),
        (small, None),
        (few, None),
    ] {
        default_on_x86("tr", src, |target, text| match nest {
            Some([avx2, avx512]) => {
                let n = if target == "x86-avx2" { avx2 } else { avx512 };
                assert!(text.contains(n), "{target}: `{n}`:\n{text}");
            }
            None => assert!(text.contains("\n  for q.c in 0..800"), "{target}: axes' order kept:\n{text}"),
        });
    }
}

/// Locals larger than the stack's share (`attach::MAX_STACK_BYTES`) live on
/// the heap: a product sliced 1024 deep with blocks of 128 columns packs
/// 512 KiB per block, inside the parallel loop over column blocks (each
/// worker takes its own), with a partial slice and a partial block. The
/// loop nest, both x86 targets and Cranelift agree with the interpreter.
#[test]
fn heap_locals_run_like_the_interpreter() {
    let src = "kernel mm(A: f32[M = 13, K = 1100], B: f32[K, N = 300]) -> C: f32[M, N] {\n    C[i, j] = sum[k](A[i, k] * B[k, j]);\n}\n";
    let p = program("heap.tex", src);
    for target in ["x86-avx2", "x86-avx512", "cranelift"] {
        let t = texc_compiler::target::lookup(target).expect("registered");
        let mut pl = texc_tests::pipeline(target);
        pl.options.knobs = [("kslice".to_string(), 1024), ("cols".to_string(), 128)].into();
        let loops = pl.default_loops(p.clone()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
        let f = &loops.legal;
        let heap: Vec<&str> = f.heap_locals().iter().map(|&t| f.p.tensor(t).name.as_str()).collect();
        assert_eq!(heap, ["B.packed"], "{target}: the pack is on the heap");
        let pack = f.p.tensors.iter().find(|d| d.name == "B.packed").expect("packed");
        assert_eq!(pack.shape[1], 1024, "{target}: slices 1024 deep");
        assert_same(&format!("heap locals {target}"), &p, &loops.lowered, 5);
        if t.check_runs_here().is_ok() {
            let got = pl.compile(&loops.legal).expect("compiles").run(random_args(&p, 5)).expect("runs");
            assert_outputs(&format!("heap locals {target}: compiled"), &p, &loops.legal, 5, got);
        }
    }
}

/// Issue 36, item 4: the default CPU schedule sizes its blocks by the
/// target's caches and its parallel work by the cores. Products, a
/// convolution with long rows, a depthwise convolution and a softmax, at
/// sizes no tile divides, scheduled for simulated machines (the nominal
/// one, a small L2, a large L1 and L2, one core, 64 cores) run as x86 code
/// like the interpreter; and the blocking is the one each machine's caches
/// give: the packed block of the product is `[cols / 16, kslice, 16]` on
/// AVX2 (`cols / 32, kslice, 32` on AVX-512), and one core runs nothing in
/// parallel. (The product's N = 2080 is whole vectors but not whole blocks:
/// with a partial vector at the end of B's last row, AVX2 code loads past
/// B's end — a known codegen bug, issue 36's report — which can fault.)
#[test]
fn default_schedules_follow_the_caches_and_match_the_interpreter() {
    use texc_compiler::target::{lookup, with_caches, CpuCaches};
    let nominal = CpuCaches::NOMINAL;
    // (name, caches, packed columns and slice of the product, whether anything runs in parallel)
    let machines = [
        ("nominal", nominal, (256, 512), true),
        ("small L2", CpuCaches { l2: 256 << 10, ..nominal }, (128, 256), true),
        ("large L1 and L2", CpuCaches { l1d: 64 << 10, l2: 4 << 20, ..nominal }, (256, 1024), true),
        ("one core", CpuCaches { cores: 1, l3_cores: 1, ..nominal }, (256, 512), false),
        // 64 cores: blocks of 6 panels (4 on AVX-512 cut to 3), as many blocks as cores take.
        ("64 cores", CpuCaches { cores: 64, l3_cores: 64, ..nominal }, (96, 512), true),
    ];
    let sources = [
        ("mm", "kernel mm(A: f32[M = 5, K = 1100], B: f32[K, N = 2080]) -> C: f32[M, N] {\n    C[i, j] = sum[k](A[i, k] * B[k, j]);\n}"),
        ("conv", "import std.nn;\nkernel conv(X: f32[N = 1, C = 20, H = 9, W = 130], Wt: f32[K = 7, C, 3, 3]) -> Y: f32[N, K, H, W] {\n    Y = conv2d(X, Wt, pad = 1);\n}"),
        ("dw", "import std.nn;\nkernel dw(X: f32[N = 1, C = 3, H = 15, W = 37], Wt: f32[C, 1, 3, 3]) -> Y: f32[N, C, H, W] {\n    Y = conv2d(X, Wt, pad = 1, groups = C);\n}"),
        ("softmax", "kernel softmax(X: f32[N = 131, D = 300]) -> Y: f32[N, D] {\n    m[n] = max[d](X[n, d]);\n    e[n, d] = exp(X[n, d] - m[n]);\n    s[n] = sum[d](e[n, d]);\n    Y[n, d] = e[n, d] / s[n];\n}"),
    ];
    for (name, src) in sources {
        let p = program(&format!("{name}.tex"), src);
        let want = interp::run(&p, random_args(&p, 7)).expect("interp");
        for base in ["x86-avx2", "x86-avx512"] {
            let base = lookup(base).expect("registered");
            let mut texts = Vec::new();
            for (machine, caches, (cols, kslice), parallel) in machines {
                let t = with_caches(base, caches);
                let f = texc_tests::default_lowered_on(t, &p);
                let text = texc_schedules::ir::print(&f);
                let what = format!("{name} on {} with {machine} caches", base.name);
                if name == "mm" {
                    let width = base.vector_bits as i64 / 16;
                    let packed = format!("local B.packed: f32[{}, {kslice}, {width}]", cols / width);
                    assert!(text.contains(&packed), "{what}: `{packed}`:\n{text}");
                }
                if name == "mm" || name == "softmax" {
                    assert_eq!(text.contains(" parallel:"), parallel, "{what}: parallel loops?\n{text}");
                }
                if base.check_runs_here().is_ok() {
                    let got =
                        texc_tests::compile_loops(t, &f).expect("compiles").run(random_args(&p, 7)).expect("runs");
                    for (w, g) in want.iter().zip(&got) {
                        let err = rel_error(g, w);
                        assert!(err <= 1e-5, "{what} differs from interp by {err:e}\n{text}");
                    }
                }
                texts.push(text);
            }
            // The machines' blocking differs where their caches do.
            if name == "mm" {
                assert!(
                    texts[0] != texts[1] && texts[0] != texts[2] && texts[0] != texts[4],
                    "{name}: one blocking for all"
                );
            }
        }
    }
}

/// A BLIS micro-kernel's rows of A stay within the ways of L1 where they
/// meet in one set (issue 36, ViT-B/16's 3072-deep product): on AVX-512
/// (24 accumulators, 12 rows of two vectors) with an 8-way 32 KiB L1, rows
/// 3072 floats apart (12 KiB: one set) are blocks of 8 (197 rows too,
/// which no block size divides), rows 768 apart (3 KiB: three a set) stay
/// 12, and a 12-way 48 KiB L1 keeps 12 for both. Each runs like the
/// interpreter where the CPU has AVX-512.
#[test]
fn micro_kernel_rows_of_a_stay_within_the_ways_of_l1() {
    use texc_compiler::target::{lookup, with_caches, CpuCaches};
    let base = lookup("x86-avx512").expect("registered");
    for (m, depth, l1d, rows) in [(48, 3072, 32, 8), (197, 3072, 32, 8), (48, 768, 32, 12), (48, 3072, 48, 12)] {
        let src = format!(
            "kernel mm(A: f32[M = {m}, K = {depth}], B: f32[K, N = 128]) -> C: f32[M, N] {{\n    C[i, j] = sum[k](A[i, k] * B[k, j]);\n}}"
        );
        let p = program("mm.tex", &src);
        let t = with_caches(base, CpuCaches { l1d: l1d << 10, ..CpuCaches::NOMINAL });
        let f = texc_tests::default_lowered_on(t, &p);
        let text = texc_schedules::ir::print(&f);
        let what = format!("M = {m}, K = {depth}, {l1d} KiB of L1");
        assert!(text.contains(&format!("for i.r in 0..{rows} unrolled")), "{what}: blocks of {rows} rows:\n{text}");
        if base.check_runs_here().is_ok() {
            let want = interp::run(&p, random_args(&p, 3)).expect("interp");
            let got = texc_tests::compile_loops(t, &f).expect("compiles").run(random_args(&p, 3)).expect("runs");
            let err = rel_error(&got[0], &want[0]);
            assert!(err <= 1e-5, "{what}: differs from interp by {err:e}");
        }
    }
}

/// A row reduction whose streamed operand stays as the innermost axis moves
/// (`S[l, s] = sum[d](Q[l, d] · K[s, d])`, attention's scores, with fewer
/// rows than `texc_schedules::transpose` transposes `K` for) combines its
/// partial results for many outputs in one loop, which LLVM vectorizes
/// across them: it keeps 8 partial results (one 256-bit vector on
/// AVX-512; 16 made that loop 30× slower, one gather per partial result).
/// A row reduction of one operand (`max[s](X[l, s])`) keeps its 32. Both
/// match the interpreter at sizes no vector divides.
#[test]
fn row_reductions_combined_across_outputs_keep_eight_partial_results() {
    let scores = "kernel scores(Q: f32[L = 9, D = 200], K: f32[S = 45, D]) -> Y: f32[L, S] {
    Y[l, s] = sum[d](Q[l, d] * K[s, d]);
}";
    default_on_x86("scores", scores, |target, text| {
        assert!(text.contains("temp Y.rf: f32[9, 45, 8]"), "{target}: 8 partial results:\n{text}");
    });
    let row_max = "kernel row_max(X: f32[L = 37, S = 300]) -> Y: f32[L] {
    Y[l] = max[s](X[l, s]);
}";
    default_on_x86("row max", row_max, |target, text| {
        assert!(text.contains("local Y.rf: f32[1, 32]"), "{target}: 32 partial results:\n{text}");
    });
}

/// Iterations of `body`'s stores to `tensor`, and of those under a guard.
/// `ranges` are the enclosing loops' (lo, hi), narrowed by the guards that
/// compare a loop variable with a constant (the versions of a loop's body).
fn store_work(
    body: &[texc_schedules::ir::Stmt],
    tensor: &str,
    f: &texc_schedules::LoopFunc,
    ranges: &mut HashMap<u32, (i64, i64)>,
    guarded: bool,
) -> (i64, i64) {
    use texc_compiler::ops::BinOp;
    use texc_compiler::tir::TExpr;
    use texc_schedules::ir::Stmt;
    let mut total = (0, 0);
    for s in body {
        let (all, under) = match s {
            Stmt::For { var, lo, extent, body, .. } => {
                ranges.insert(*var, (*lo, lo + extent - 1));
                let w = store_work(body, tensor, f, ranges, guarded);
                ranges.remove(var);
                w
            }
            Stmt::If { cond, then } => {
                let version = match f.p.expr(*cond) {
                    TExpr::Binary(op @ (BinOp::Lt | BinOp::Ge), a, b) => match (f.p.expr(*a), f.p.expr(*b)) {
                        (TExpr::Var(v), TExpr::Int(k)) => Some((*op, *v, *k)),
                        _ => None,
                    },
                    _ => None,
                };
                match version {
                    Some((op, v, k)) => {
                        let saved = ranges[&v];
                        let r = ranges.get_mut(&v).expect("a loop variable");
                        if op == BinOp::Lt {
                            r.1 = r.1.min(k - 1)
                        } else {
                            r.0 = r.0.max(k)
                        }
                        let w = store_work(then, tensor, f, ranges, guarded);
                        ranges.insert(v, saved);
                        w
                    }
                    None => store_work(then, tensor, f, ranges, true),
                }
            }
            Stmt::Alloc { body, .. } => store_work(body, tensor, f, ranges, guarded),
            Stmt::Store { tensor: t, .. } if f.p.tensor(*t).name == tensor => {
                let n: i64 = ranges.values().map(|(lo, hi)| (hi - lo + 1).max(0)).product();
                (n, if guarded { n } else { 0 })
            }
            _ => (0, 0),
        };
        total = (total.0 + all, total.1 + under);
    }
    total
}

/// A product whose sizes no panel divides runs unguarded outside its last
/// partial panel and reduction slice: the loops around a tail are cut where
/// the guard is decided (`crate::versioning`), so the guarded (masked)
/// share of the work is that of the tail, not all of it; results stay the
/// interpreter's, on the evaluator and compiled.
#[test]
fn tails_are_cut_from_the_loops_around_them() {
    for (m, k, n) in [(1000, 1000, 1000), (197, 768, 1000), (5, 1100, 2100)] {
        let b = Bindings { shapes: vec![("M".into(), m), ("K".into(), k), ("N".into(), n)], ..Bindings::default() };
        let p = texc_tests::compile("examples/matmul.tex", None, &b).expect("specializes");
        for target in ["x86-avx512", "x86-avx2"] {
            let f = texc_tests::default_lowered(target, &p);
            let (all, guarded) = store_work(&f.body, "C", &f, &mut HashMap::new(), false);
            assert!(all >= m * n * k, "{target} {m}×{k}×{n}: every product term is stored ({all})");
            let share = guarded as f64 / all as f64;
            assert!(
                share < 0.1,
                "{target} {m}×{k}×{n}: {:.0}% of C's stores guarded\n{}",
                share * 100.0,
                texc_schedules::ir::print(&f)
            );
        }
    }
    for (m, k, n) in [(13, 600, 200), (7, 530, 97)] {
        let b = Bindings { shapes: vec![("M".into(), m), ("K".into(), k), ("N".into(), n)], ..Bindings::default() };
        let p = texc_tests::compile("examples/matmul.tex", None, &b).expect("specializes");
        for target in ["x86-avx512", "x86-avx2"] {
            let f = texc_tests::default_lowered(target, &p);
            assert_same(&format!("matmul {m}×{k}×{n} on {target}"), &p, &f, 3);
            assert_same_compiled(&format!("matmul {m}×{k}×{n} on {target}"), &p, &f, 3);
        }
    }
}

/// A grouped convolution reads its input through the filter's group (`k /
/// 8 * 8 + c`): no axis shares the vector loads whole, but the 8 filters of
/// a group do, so the register block's rows are filters of one group
/// (`k.i`), not rows of the image each loading its own input. At odd sizes,
/// against the interpreter, on every x86 target that runs here.
#[test]
fn grouped_convolutions_block_the_filters_of_a_group() {
    let src = "kernel g(X: f32[1, 24, 13, 19], W: f32[24, 8, 3, 3]) -> Y: f32[1, 24, 11, 17] {\n\
               \x20   Y[n, k, y, x] = sum[c, r, s](X[n, k / 8 * 8 + c, y + r, x + s] * W[k, c, r, s]);\n}\n";
    default_on_x86("grouped", src, |target, text| {
        assert!(
            text.contains("for k.i.r in 0..") && text.contains("unrolled"),
            "{target}: rows among a group:\n{text}"
        );
        // The rows' group, `(… + k.i.r) / 8`, is one for the whole block
        // (`guards::decided_division`): every row reads the same vector of X.
        for line in text.lines().filter(|l| l.contains("+ X[")) {
            let x = &line[line.find("+ X[").expect("found")..];
            let x = &x[..x.find(']').expect("closed")];
            assert!(!x.contains("k.i.r"), "{target}: X read per row: {line}\n{text}");
        }
    });
}

/// A channel shuffle as exporters write it (concatenate, reshape to two
/// groups, transpose, reshape back) reads its rows whole: the flattened
/// position's divisions by 2·H·W and H·W split by H·W (`k / 2`, `k % 2`)
/// instead of dividing every lane; results match the interpreter at odd
/// sizes (H·W = 21, not a multiple of any vector).
#[test]
fn channel_shuffles_read_whole_rows() {
    let src = "kernel shuffle(A: f32[N = 1, C = 5, H = 3, W = 7], B: f32[N, C, H, W]) -> Y: f32[N, 2*C, H, W] {
    Cat[n, c in 0..2*C, h, w] = select(c < C, A[n, c, h, w], B[n, c - C, h, w]);
    R[n, g in 0..2, c in 0..C, h in 0..H, w in 0..W] = Cat[n, (g*C*H*W + c*H*W + h*W + w) / (H*W), ((g*C*H*W + c*H*W + h*W + w) / W) % H, (g*C*H*W + c*H*W + h*W + w) % W];
    T[n, c in 0..C, g in 0..2, h in 0..H, w in 0..W] = R[n, g, c, h, w];
    Y[n, k, h, w] = T[n, (k*H*W + h*W + w) / (2*H*W), ((k*H*W + h*W + w) / (H*W)) % 2, ((k*H*W + h*W + w) / W) % H, (k*H*W + h*W + w) % W];
}
";
    default_on_x86("shuffle", src, |target, text| {
        for division in ["/ 42", "% 42", "/ 21", "% 21", "/ 210"] {
            assert!(!text.contains(division), "{target}: `{division}` left:\n{text}");
        }
    });
}

/// A convolution whose row is one vector (13 of AVX-512's 16 lanes) blocks
/// rows of the image as well as filters, each filter's broadcast shared by
/// the block's image rows (6 filters × 4 rows: 10 loads for 24 FMAs, not
/// 17 for 16); a strided one (`2·x + s`, its vectors gathered) keeps the
/// one-axis block. Tails of filters (20) and rows (13) match the interpreter.
#[test]
fn one_vector_rows_block_rows_of_the_image_too() {
    let src = "kernel c(X: f32[1, 5, 15, 15], W: f32[20, 5, 3, 3]) -> Y: f32[1, 20, 13, 13] {\n\
               \x20   Y[n, k, y, x] = sum[c, r, s](X[n, c, y + r, x + s] * W[k, c, r, s]);\n}\n";
    default_on_x86("conv13", src, |target, text| {
        if target == "x86-avx512" {
            assert!(text.contains("for y.r in 0..") && text.contains("for k.r in 0.."), "{target}:\n{text}");
        }
    });
    let strided = "kernel c(X: f32[1, 5, 27, 27], W: f32[20, 5, 3, 3]) -> Y: f32[1, 20, 13, 13] {\n\
                   \x20   Y[n, k, y, x] = sum[c, r, s](X[n, c, 2 * y + r, 2 * x + s] * W[k, c, r, s]);\n}\n";
    default_on_x86("conv13s2", strided, |target, text| {
        assert!(!text.contains("for y.r in 0.."), "{target}:\n{text}");
    });
}

/// Window tests that the sizes decide are folded (a pool without padding
/// whose windows all fit loads unguarded); those they do not decide stay
/// (padding 1): both match the interpreter.
#[test]
fn pools_drop_the_edge_tests_their_sizes_decide() {
    let src = "kernel pools(X: f32[C = 3, H = 13, W = 13], Z: f32[C, 14, 14]) -> (Y: f32[C, 6, 6], P: f32[C, 7, 7]) {
    Y[c, h, w] = max[r in 0..3, s in 0..3](
        select(h*2 + r >= 0 && h*2 + r < H && w*2 + s >= 0 && w*2 + s < W, X[c, h*2 + r, w*2 + s], -inf));
    P[c, h, w] = max[r in 0..3, s in 0..3](
        select(h*2 + r >= 1 && h*2 + r < 15 && w*2 + s >= 1 && w*2 + s < 15, Z[c, h*2 + r - 1, w*2 + s - 1], -inf));
}
";
    default_on_x86("pools", src, |target, text| {
        let y_stores: Vec<&str> = text.lines().filter(|l| l.contains("X[")).collect();
        assert!(!y_stores.is_empty() && y_stores.iter().all(|l| !l.contains("select")), "{target}:\n{text}");
        assert!(text.contains(">= 1"), "{target}: P keeps its tests:\n{text}");
    });
}

/// A producer worth threads (a global average pool over 2240 channels
/// before a classifier) is not computed inside a consumer's loop that runs
/// on one thread (the batch of one, outside the classifier's parallel
/// columns): it stays in nests of its own with their parallel loops;
/// results match the interpreter.
#[test]
fn producers_worth_threads_keep_them() {
    let src = "kernel head(X: f32[1, 2240, 8, 8], F: f32[2240, 1000], b: f32[1000]) -> Y: f32[1, 1000] {
    G[n, k in 0..2240, i in 0..1, j in 0..1] = sum[h in 0..8, w in 0..8](max(X[n, k, h, w], 0.0)) / 64.0;
    L[n, k in 0..2240] = G[n, k, 0, 0];
    Y[n, j] = sum[k](L[n, k] * F[k, j]) + b[j];
}
";
    default_on_x86("head", src, |target, text| {
        // (On AVX2 the pool's final sum, over 8 lanes a channel, is not worth threads.)
        if target != "x86-avx512" {
            return;
        }
        let nests: Vec<&str> = text.split("\n  for ").collect();
        let classifier = nests.iter().find(|n| n.contains("Y.r0.acc")).expect("the classifier's nest");
        assert!(!classifier.contains("local G.r0:"), "{target}: the pooling runs on threads of its own:\n{text}");
    });
}

/// A product whose reduction is several loops (a direct convolution's
/// `c, r, s`, here computed filters-last as `texc_schedules::filters_last`
/// writes it) is not cut into slices, so a block of packed panels spans the
/// whole depth: the default schedule takes as many panels to a block as
/// half of L2 holds (here 256 · 9 · 32 floats, 295 KB, a panel), so the
/// image rows inside the block re-read its filters from L2 rather than
/// from L3 (ResNet-50's 3×3 convolutions at 7×7 on a Xeon: 2.1 → 1.2 ms);
/// with a larger L2 the blocks of four panels stay. Both match the
/// interpreter, with a partial last panel (272 filters).
#[test]
fn deep_unsliced_products_block_their_panels_by_l2() {
    use texc_compiler::target::{lookup, with_caches, CpuCaches};
    let src = "kernel fl(X: f32[N = 1, C = 256, H = 9, W = 9], Wt: f32[C, 3, 3, F = 272]) -> Y: f32[N, 7, 7, F] {
    Y[n, y, x, f] = sum[c, r, s](X[n, c, y + r, x + s] * Wt[c, r, s, f]);
}";
    let p = program("fl.tex", src);
    let base = lookup("x86-avx512").expect("registered");
    let nominal = CpuCaches::NOMINAL;
    for (machine, caches, panels) in [("nominal", nominal, 1), ("4 MiB L2", CpuCaches { l2: 4 << 20, ..nominal }, 4)] {
        let t = with_caches(base, caches);
        let f = texc_tests::default_lowered_on(t, &p);
        let text = texc_schedules::ir::print(&f);
        let block = format!("for f.oi in 0..{panels}:");
        assert!(text.contains(&block), "{machine}: `{block}`:\n{text}");
        let (blocks, rows) = (text.find("for f.oo in"), text.find("for y in"));
        assert!(matches!((blocks, rows), (Some(b), Some(r)) if b < r), "{machine}: blocks outside the rows:\n{text}");
        assert_runs_as_interp(machine, t, &p, &f, 3);
    }
}

/// A stride-2 convolution with its rows' vectors along `x` (a 7 × 7 stem,
/// 3 channels, where 16 filters share each vector; a grouped 3 × 3, where
/// the 4 filters of each group share their group's channels) reads copies
/// of its input's two phases (`X.ph`), one contiguous vector per tap,
/// rather than a stride-2 vector per tap (two loads and a shuffle); so
/// does a depthwise one (3 × 3 and 5 × 5), whose rows each read their own
/// input: a pass over it still costs less than the taps' shuffles. A
/// stride-1 depthwise reads its input as it is. All match the interpreter
/// at sizes no vector divides.
#[test]
fn strided_windows_read_phases() {
    let stem = "import std.nn;\nkernel stem(X: f32[N = 1, C = 3, H = 45, W = 45], Wt: f32[K = 16, C, 7, 7]) -> Y: f32[N, K, 23, 23] {
    Y = conv2d(X, Wt, stride = 2, pad = 3);
}";
    default_on_x86("stem", stem, |target, text| {
        assert!(text.contains(".ph: f32[1, 3, "), "{target}: the phases of the input:\n{text}");
    });
    let grouped = "import std.nn;\nkernel g(X: f32[N = 1, C = 12, H = 45, W = 45], Wt: f32[K = 16, 3, 3, 3]) -> Y: f32[N, K, 23, 23] {
    Y = conv2d(X, Wt, stride = 2, pad = 1, groups = 4);
}";
    default_on_x86("grouped", grouped, |target, text| {
        assert!(text.contains(".ph: f32[1, 12, "), "{target}: the phases of the input:\n{text}");
    });
    for (k, pad) in [(3, 1), (5, 2)] {
        let dw = format!(
            "import std.nn;\nkernel dw(X: f32[N = 1, C = 16, H = 45, W = 45], Wt: f32[C, 1, {k}, {k}]) -> Y: f32[N, C, 23, 23] {{
    Y = conv2d(X, Wt, stride = 2, pad = {pad}, groups = C);
}}"
        );
        default_on_x86(&format!("depthwise {k}x{k}"), &dw, |target, text| {
            assert!(text.contains(".Xp.ph: f32["), "{target}: the phases of the padded input:\n{text}");
            let mut taps = text.lines().filter(|l| l.contains(" * Wt[")).peekable();
            assert!(taps.peek().is_some(), "{target}: the product:\n{text}");
            assert!(taps.all(|l| l.contains(".Xp.ph[")), "{target}: every tap read from the phases:\n{text}");
        });
    }
    let dw1 = "import std.nn;\nkernel dw(X: f32[N = 1, C = 16, H = 45, W = 45], Wt: f32[C, 1, 3, 3]) -> Y: f32[N, C, 45, 45] {
    Y = conv2d(X, Wt, stride = 1, pad = 1, groups = C);
}";
    default_on_x86("depthwise stride 1", dw1, |target, text| {
        assert!(!text.contains(".ph"), "{target}: no phases:\n{text}");
    });
}

/// Products over an empty reduction (K = 0: each output a sum of nothing)
/// compile on the default x86 schedules, long rows (the BLIS blocking,
/// whose blocks are sized by the depth) and several reduction loops alike,
/// and are zeros like the interpreter's: the blocking once divided by the
/// depth.
#[test]
fn products_over_empty_reductions_are_zeros() {
    let mm = "kernel mm(A: f32[M = 64, K = 0], B: f32[K, N = 256]) -> C: f32[M, N] {\n    C[i, j] = sum[k](A[i, k] * B[k, j]);\n}";
    let deep = "kernel fl(X: f32[N = 1, C = 0, H = 9, W = 9], Wt: f32[C, 3, 3, F = 272]) -> Y: f32[N, 7, 7, F] {\n    Y[n, y, x, f] = sum[c, r, s](X[n, c, y + r, x + s] * Wt[c, r, s, f]);\n}";
    for (name, src) in [("mm", mm), ("fl", deep)] {
        default_on_x86(name, src, |_, _| {});
    }
}

/// A BLIS-style register block takes as many rows as the target's L1 has
/// ways (its size over 4 KiB): on a 48 KiB L1 (12 ways) AVX-512's 12 rows of
/// two vectors, a last block of 4 after eight; on the nominal 32 KiB (8
/// ways), 10 rows dividing the 100; and 8 dividing 64 rather than five
/// blocks of 12 and one of 4, on either. All match the interpreter.
#[test]
fn register_blocks_take_the_rows_the_l1_ways_hold() {
    use texc_compiler::target::{lookup, with_caches, CpuCaches};
    let base = lookup("x86-avx512").expect("registered");
    let nominal = CpuCaches::NOMINAL;
    let wide_l1 = CpuCaches { l1d: 48 << 10, ..nominal };
    for (m, cases) in [
        (100, [("32 KiB", nominal, 10), ("48 KiB", wide_l1, 12)]),
        (64, [("32 KiB", nominal, 8), ("48 KiB", wide_l1, 8)]),
    ] {
        let src = format!(
            "kernel mm(A: f32[M = {m}, K = 300], B: f32[K, N = 256]) -> C: f32[M, N] {{\n    C[i, j] = sum[k](A[i, k] * B[k, j]);\n}}"
        );
        let p = program("mm.tex", &src);
        for (l1, caches, rows) in cases {
            let t = with_caches(base, caches);
            let f = texc_tests::default_lowered_on(t, &p);
            let text = texc_schedules::ir::print(&f);
            let block = format!("for i.r in 0..{rows} unrolled:");
            assert!(text.contains(&block), "M = {m}, L1 {l1}: `{block}`:\n{text}");
            assert_runs_as_interp(&format!("M = {m}, L1 {l1}"), t, &p, &f, 5);
        }
    }
}

/// Integer products on AMX tiles group their column blocks by L2 (half of
/// it holds a group's panels of the weights, packed inside the loop over
/// groups), run their row blocks outside a group's column blocks, and
/// share the groups among the cores where the rows are fewer than the
/// columns, the rows elsewhere. A last, partial block of columns inside a
/// group still starts from `tilezero` (its block's other accumulators zeroed
/// by the nest before it).
#[test]
fn tile_products_group_their_columns_by_l2() {
    use texc_compiler::target::{lookup, with_caches, CpuCaches};
    let base = lookup("x86-avx512-amx").expect("registered");
    // 64 KiB of L2: a 32-column panel of a 256-byte sum is 8 KiB, four to half of it.
    let t = with_caches(base, CpuCaches { l2: 64 << 10, cores: 2, ..CpuCaches::NOMINAL });
    for (m, n, wants) in [
        // 10 column blocks, groups of at most 4 on two cores: two groups of
        // 4 on the cores, then one of 2 (busiest core: 6 blocks; groups of
        // 3 would make it 7).
        (40, 320, &["for j.t.g in 0..2 parallel:", "local W.q4", "for i.t in 0..1:", "for j.t.b in 0..4:"][..]),
        // Rows outnumber columns: one group, the row blocks on the cores.
        (300, 96, &["for j.t.g in 0..1:", "for i.t in 0..9 parallel:", "for j.t.b in 0..3:"][..]),
        // The last block of the last group 12 columns wide, on tiles.
        (
            40,
            300,
            &[
                "for j.t.g in 0..2 parallel:",
                "for j.t.g in 2..3 parallel:",
                "amx_dpbusd 32x12x64",
                "amx_dpbusd 8x12x64",
            ][..],
        ),
    ] {
        let src = format!(
            "kernel q(A: u8[M = {m}, K = 256], W: i8[K, N = {n}]) -> C: i32[M, N] {{\n    C[i, j] = sum[k](i32(A[i, k]) * i32(W[k, j]));\n}}"
        );
        let p = program("q.tex", &src);
        let f = texc_tests::default_lowered_on(t, &p);
        let text = texc_schedules::ir::print(&f);
        let mut at = 0;
        for want in wants {
            let found =
                text[at..].find(want).unwrap_or_else(|| panic!("{m}×256×{n}: `{want}` after the last:\n{text}"));
            at += found;
        }
        let accumulating = text.lines().filter(|l| l.contains("amx_dpbusd") && l.contains(" += ")).count();
        assert_eq!(accumulating, 0, "{m}×256×{n}: every block from `tilezero`:\n{text}");
        let what = format!("{m}×256×{n} on tiles");
        assert_same(&what, &p, &f, 3);
        assert_runs_as_interp(&what, t, &p, &f, 3);
    }
}

/// A requantized product's bytes are stored by its own nest where the
/// reader is another product's epilogue (a residual `Add` of two
/// requantized convolutions): that reader reads one product's sums and the
/// other's bytes, never both products' `i32` sums.
#[test]
fn requantized_sums_stay_in_their_own_nest() {
    let src = "kernel rq(X: u8[1, 16, 9, 9], Wd: i8[32, 16], bd: i32[32], sd: f32[32], Z: u8[1, 24, 9, 9], Wc: i8[32, 24], bc: i32[32], sc: f32[32]) -> Y: u8[1, 32, 9, 9] {
    Dq[n, f, y, x] = u8(clamp(round(f32(sum[c](i32(X[n, c, y, x]) * i32(Wd[f, c])) + bd[f]) * sd[f]) + 131.0, 0.0, 255.0));
    Cq[n, f, y, x] = u8(clamp(round(f32(sum[c](i32(Z[n, c, y, x]) * i32(Wc[f, c])) + bc[f]) * sc[f]) + 123.0, 0.0, 255.0));
    Y[n, f, y, x] = u8(clamp(round((f32(i32(Cq[n, f, y, x]) - 123) * 0.023 + f32(i32(Dq[n, f, y, x]) - 131) * 0.026) / 0.018), 0.0, 255.0));
}";
    let p = program("rq.tex", src);
    for target in ["x86-avx512-vnni", "x86-avx2"] {
        let t = texc_compiler::target::lookup(target).expect("registered");
        let f = texc_tests::default_lowered_on(t, &p);
        let text = texc_schedules::ir::print(&f);
        assert!(text.contains("temp Dq: u8[1, 32, 9, 9]"), "{target}: the first product's bytes stored:\n{text}");
        assert!(!text.contains("r0: i32"), "{target}: no product's sums stored:\n{text}");
        assert_same(target, &p, &f, 4);
        assert_runs_as_interp(target, t, &p, &f, 4);
    }
}

/// A transposing stage of bytes that reads two byte tensors along one axis
/// and stores along another vectorizes along its store: no pack widens
/// there, and scattering bytes one per lane cost three times the gathers.
#[test]
fn byte_transposes_vectorize_along_their_store() {
    let src = "kernel tr(A: u8[1, 49, 64], B: u8[1, 49, 64]) -> Y: u8[1, 64, 49] {
    Y[n, f, p] = u8(clamp(i32(A[n, p, f]) + i32(B[n, p, f]) - 100, 0, 255));
}";
    let p = program("tr.tex", src);
    let t = texc_compiler::target::lookup("x86-avx512-vnni").expect("registered");
    let f = texc_tests::default_lowered_on(t, &p);
    let text = texc_schedules::ir::print(&f);
    assert!(text.contains("for p.v in 0..16 vectorized:"), "vectors along the stored rows:\n{text}");
    assert!(!text.contains("for f.v"), "no vectors along the read rows:\n{text}");
    assert_same("tr", &p, &f, 6);
    assert_runs_as_interp("tr", t, &p, &f, 6);
}

/// An integer sum whose epilogue adds a term to it (a bias, on either side)
/// starts each block of its accumulators from that term, one addition fewer
/// per output (integer addition wraps, so it associates); a float sum
/// starts from zero and adds the term after (float additions do not
/// associate), and so does an integer sum its epilogue reads twice (the
/// term would reach one read only). At sizes no vector or register block
/// divides.
#[test]
fn integer_sums_start_from_their_epilogues_term() {
    let int = "kernel bi(A: u8[37, 45], B: i8[29, 45], b: i32[29]) -> Y: f32[37, 29] {
    Y[i, j] = f32(sum[k](i32(A[i, k]) * i32(B[j, k])) + b[j]) * 0.5;
}";
    let term_first = "kernel bl(A: u8[37, 45], B: i8[29, 45], b: i32[29]) -> Y: i32[37, 29] {
    S[i, j] = sum[k](i32(A[i, k]) * i32(B[j, k]));
    Y[i, j] = max(b[j] + S[i, j], 0);
}";
    let twice = "kernel b2(A: u8[37, 45], B: i8[29, 45], b: i32[29]) -> Y: i32[37, 29] {
    S[i, j] = sum[k](i32(A[i, k]) * i32(B[j, k]));
    Y[i, j] = (S[i, j] + b[j]) * (S[i, j] / 64);
}";
    let float = "kernel bf(A: f32[37, 45], B: f32[29, 45], b: f32[29]) -> Y: f32[37, 29] {
    Y[i, j] = (sum[k](A[i, k] * B[j, k]) + b[j]) * 0.5;
}";
    for (src, from_term) in [(int, true), (term_first, true), (twice, false), (float, false)] {
        let p = program("b.tex", src);
        for target in ["x86-avx512-vnni", "x86-avx2"] {
            let t = texc_compiler::target::lookup(target).expect("registered");
            let f = texc_tests::default_lowered_on(t, &p);
            let text = texc_schedules::ir::print(&f);
            let stores_acc = |l: &&str| l.split(" = ").next().is_some_and(|to| to.contains(".acc["));
            let inits: Vec<&str> = text.lines().filter(stores_acc).filter(|l| !l.contains("] + ")).collect();
            assert!(!inits.is_empty(), "{target}: accumulators expected:\n{text}");
            let starts_from_b = inits.iter().all(|l| l.trim_end().ends_with(']') && l.contains("= b["));
            assert_eq!(starts_from_b, from_term, "{target}: {inits:?}\n{text}");
            assert_eq!(text.contains("+ b["), !from_term, "{target}: the term added after:\n{text}");
            assert_same(target, &p, &f, 7);
            assert_runs_as_interp(target, t, &p, &f, 7);
        }
    }
}

/// An inverted-residual block's depthwise convolution, between 1 × 1
/// convolutions whose threads share out rows of the image, shares out
/// rows too: its rows cut into one part per core (the nominal two), fused
/// with its channels, its padding copy made per part and channel — so
/// that each thread reads rows it wrote — where its row blocks divide
/// evenly (40 rows: 10 blocks of 4); where they do not (36: 9), and with
/// the knob `follow=0`, its channels run in parallel as before (on
/// AVX-512; AVX2's blocks differ). No buffer needs zeros first (`zeroing`
/// proves every read of the padding copies written). Results
/// match the interpreter in every case, with tails (40 = 2 vectors and 8).
#[test]
fn depthwise_convolutions_share_out_their_producers_rows() {
    for (h, follows) in [(40, true), (36, false)] {
        let src = format!(
            "import std.nn;
kernel blk(X: f32[N = 1, C = 16, H = {h}, W = {h}], We: f32[K = 64, C, 1, 1], Wd: f32[K, 1, 3, 3],
           Wp: f32[C, K, 1, 1]) -> Z: f32[N, C, H, W] {{
    E = relu6(conv2d(X, We));
    D = relu6(conv2d(E, Wd, pad = 1, groups = K));
    Z = conv2d(D, Wp);
}}"
        );
        let p = program("blk.tex", &src);
        for (target, follow) in [("x86-avx512", 1), ("x86-avx512", 0), ("x86-avx2", 1)] {
            let t = texc_compiler::target::lookup(target).expect("registered");
            let mut pl = texc_tests::pipeline(t.name);
            pl.options.knobs = [("follow".to_string(), follow)].into();
            let f = pl.default_loops(p.clone()).expect("schedules and lowers").lowered;
            let text = texc_schedules::ir::print(&f);
            let what = format!("{h} {target} follow={follow}");
            if target == "x86-avx512" {
                let by_rows = text.lines().any(|l| l.starts_with("  for h.b.t.") && l.ends_with(" parallel:"));
                assert_eq!(by_rows, follows && follow == 1, "{what}: rows in parallel:\n{text}");
            }
            let attached = text.contains("\n    local _conv2d1.Xp: f32[1, 1, ");
            assert!(attached, "{what}: the padding copy made per channel inside the depthwise nest:\n{text}");
            // No buffer needs zeros first: the proof bounds each dimension
            // of the padding copy's reads of rows cut among threads.
            let zeroed = texc_schedules::zeroing::zero_uncovered(&mut f.clone(), false);
            assert!(zeroed.is_empty(), "{what}: nothing zeroed:\n{text}");
            assert_same(&what, &p, &f, 6);
            assert_runs_as_interp(&what, t, &p, &f, 6);
        }
    }
}

/// A grouped convolution (groups of 4 channels, a 3 × 3 window: 36 terms,
/// within a depthwise window's size) sums over its group's channels, not a
/// window only: it keeps the loops its own schedule runs in parallel,
/// whatever its producer's threads shared out.
#[test]
fn grouped_convolutions_keep_their_own_threads() {
    let src = "import std.nn;
kernel grp(X: f32[N = 1, C = 16, H = 40, W = 40], We: f32[K = 64, C, 1, 1], Wg: f32[K, 4, 3, 3]) -> Y: f32[N, K, H, W] {
    E = relu6(conv2d(X, We));
    Y = conv2d(E, Wg, pad = 1, groups = 16);
}";
    let p = program("grp.tex", src);
    let text = texc_schedules::ir::print(&texc_tests::default_lowered("x86-avx512", &p));
    assert!(!text.lines().any(|l| l.contains(".t.") && l.ends_with(" parallel:")), "its own loops:\n{text}");
}

/// A `.loops` file's `rolled` on either piece of a parallel loop marks the
/// one launch that runs both.
#[test]
fn one_launch_keeps_a_pieces_rolled_mark() {
    for (first, second) in [(" rolled", ""), ("", " rolled")] {
        let text = format!(
            "func two [N=10]
  input A: f32[10]
  output B: f32[10]
  for i in 0..8 parallel{first}:
    B[i] = A[i] * 2.0f32
  for i in 8..10 parallel{second}:
    B[i] = A[i] * 3.0f32
"
        );
        let mut f = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("parses").func;
        assert_eq!(texc_schedules::launches::merge_parallel_pieces(&mut f), 1);
        let out = texc_schedules::ir::print(&f);
        assert!(out.contains("for i in 0..10 parallel rolled:"), "{out}");
        assert_eq!(f.rolled.len(), 1, "{out}");
    }
}

/// Two parallel loops of one leaf, the second over the last, partial tile
/// (`for i in 0..8` then `for i in 8..10`), run as one launch whose
/// iterations take one body or the other; loops whose iterations would
/// depend on each other (the second reads what the first writes) stay two.
/// The evaluator and compiled code compute the same either way.
#[test]
fn a_parallel_loops_partial_tile_runs_in_the_same_launch() {
    let pieces = |second: &str| {
        format!(
            "func two [N=10]
  input A: f32[10]
  output B: f32[10]
  for i in 0..8 parallel:
    B[i] = A[i] * 2.0f32
  for i in 8..10 parallel:
    B[i] = {second} * 3.0f32
"
        )
    };
    for (second, merged) in [("A[i]", true), ("B[i - 8]", false)] {
        let text = pieces(second);
        let mut sm = texc_grammar::span::SourceMap::new();
        let id = sm.add("two.loops".to_string(), text.clone());
        let parsed = texc_schedules::text::parse(&text, id).unwrap_or_else(|d| panic!("{}", d.render(&sm)));
        let mut f = parsed.func;
        let n = texc_schedules::launches::merge_parallel_pieces(&mut f);
        let out = texc_schedules::ir::print(&f);
        assert_eq!(n, usize::from(merged), "{second}:\n{out}");
        let one = out.contains("for i in 0..10 parallel:\n    if i < 8:") && out.contains("    if i >= 8:");
        assert_eq!(one, merged, "{second}:\n{out}");
        assert!(texc_schedules::independence::check_loops(&f).is_ok(), "{second}: the merged loop is race-free");
        let a: Vec<f64> = (0..10).map(f64::from).collect();
        let args = || vec![Arg::Tensor(texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![10], &a))];
        let want: Vec<f64> = (0..10)
            .map(|i| match i {
                0..8 => 2.0 * a[i],
                _ if merged => 3.0 * a[i],
                _ => 6.0 * a[i - 8],
            })
            .collect();
        let got = eval::run(&f, args()).expect("evaluates");
        assert_eq!(got[0].to_f64(), want, "{second}: evaluator");
        let t = texc_compiler::target::lookup("x86-avx2").expect("registered");
        if t.check_runs_here().is_ok() {
            let got = texc_tests::compile_loops(t, &f).expect("compiles").run(args()).expect("runs");
            assert_eq!(got[0].to_f64(), want, "{second}: compiled");
        }
    }
}

/// A BLIS-style register block does not leave a last block of one row
/// among few (its two accumulators wait on the FMA latency): on `x86-avx2`
/// (6 rows of two vectors at most) 7 rows are 4 + 3, 13 are 5 + 5 + 3 and
/// 49 (a 7 × 7 map) 9 × 5 + 4; 32 keep 6 and a last 2, and 67 (eleven
/// blocks of 6, where 5 or 4 rows would save 2 steps in 70) their last
/// row. All match the interpreter.
#[test]
fn register_blocks_leave_no_lone_last_row_among_few() {
    let base = texc_compiler::target::lookup("x86-avx2").expect("registered");
    let cases = [
        (7, &[4, 3][..], false),
        (13, &[5, 3], false),
        (32, &[6, 2], false),
        (49, &[5, 4], false),
        (67, &[6, 1], true),
    ];
    for (m, blocks, lone) in cases {
        let src = format!(
            "kernel mm(A: f32[M = {m}, K = 300], B: f32[K, N = 256]) -> C: f32[M, N] {{\n    C[i, j] = sum[k](A[i, k] * B[k, j]);\n}}"
        );
        let p = program("mm.tex", &src);
        let f = texc_tests::default_lowered_on(base, &p);
        let text = texc_schedules::ir::print(&f);
        for rows in blocks {
            let block = format!("for i.r in 0..{rows} unrolled:");
            assert!(text.contains(&block), "M = {m}: `{block}`:\n{text}");
        }
        assert_eq!(text.contains("for i.r in 0..1 unrolled:"), lone, "M = {m}: a last block of one row:\n{text}");
        assert_runs_as_interp(&format!("M = {m}"), base, &p, &f, 5);
    }
}

/// Whether programs `p` and `q` (`p` with temporaries stored elsewhere)
/// compute the same bits in the interpreter on random inputs of `seeds`.
fn assert_same_bits(name: &str, p: &Program, q: &Program, seeds: &[u64]) {
    for &seed in seeds {
        let args = |p: &Program| random_args(p, seed);
        let (want, got) = (interp::run(p, args(p)).expect("interp"), interp::run(q, args(q)).expect("interp"));
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.bytes(), b.bytes(), "{name}: the same bits, stored elsewhere");
        }
    }
}

/// A float inverted-residual block as the ONNX importer writes
/// EfficientNet's (`se`: with its squeeze-and-excite) or MobileNetV2's:
/// a 1 × 1 expansion of `c` channels to `e`, its bias and SiLU, zero
/// padding, a depthwise `k` × `k` convolution of stride `stride` on a
/// `hw` × `hw` map, its bias and SiLU, the squeeze-and-excite's pooling,
/// two products and sigmoid scaling, and a 1 × 1 projection to `c`.
fn float_inverted_block(c: i64, e: i64, hw: i64, k: i64, stride: i64, se: bool) -> String {
    let (pad, o) = (k / 2, (hw + 2 * (k / 2) - k) / stride + 1);
    let sq = (c / 4).max(1);
    let scaled = if se {
        format!(
            "    M[n, f, i in 0..1, j in 0..1] = sum[y, x](G[n, f, y, x]) / {area}.0;\n\
             \x20   Z1[n, q, i, j] = sum[f](W1[q, f] * M[n, f, i, j]) + b1[q];\n\
             \x20   Z2[n, q, i, j] = Z1[n, q, i, j] * sigmoid(Z1[n, q, i, j]);\n\
             \x20   Z3[n, f, i, j] = sum[q](W2[f, q] * Z2[n, q, i, j]) + b2[f];\n\
             \x20   S[n, f, y in 0..{o}, x in 0..{o}] = sigmoid(Z3[n, f, 0, 0]) * G[n, f, y, x];\n",
            area = o * o
        )
    } else {
        format!("    S[n, f, y in 0..{o}, x in 0..{o}] = G[n, f, y, x];\n")
    };
    format!(
        "kernel blk(X: f32[1, {c}, {hw}, {hw}], We: f32[{e}, {c}], be: f32[{e}], Wd: f32[{e}, 1, {k}, {k}], bd: f32[{e}], \
         W1: f32[{sq}, {e}], b1: f32[{sq}], W2: f32[{e}, {sq}], b2: f32[{e}], Wp: f32[{c}, {e}], bp: f32[{c}]) -> Y: f32[1, {c}, {o}, {o}] {{\n\
         \x20   T[n, f, y, x] = sum[q](X[n, q, y, x] * We[f, q]);\n\
         \x20   B[n, f, y, x] = T[n, f, y, x] + be[f];\n\
         \x20   A[n, f, y, x] = B[n, f, y, x] * sigmoid(B[n, f, y, x]);\n\
         \x20   P[n, f, y in 0..{pd}, x in 0..{pd}] = select(y >= {pad} && y < {hp} && x >= {pad} && x < {hp}, A[n, f, y - {pad}, x - {pad}], 0.0);\n\
         \x20   D[n, f, y in 0..{o}, x in 0..{o}] = sum[g in 0..1, r in 0..{k}, s in 0..{k}](P[n, f + g, y * {stride} + r, x * {stride} + s] * Wd[f, g, r, s]) + bd[f];\n\
         \x20   G[n, f, y, x] = D[n, f, y, x] * sigmoid(D[n, f, y, x]);\n\
         {scaled}\
         \x20   Y[n, q, y, x] = sum[f](Wp[q, f] * S[n, f, y, x]) + bp[q];\n}}\n",
        pd = hw + 2 * pad,
        hp = hw + pad,
    )
}

/// The weights and biases of [`float_inverted_block`], which a model's are.
fn block_weight(p: &Program, t: texc_compiler::tir::TensorId) -> bool {
    let weights = ["We", "be", "Wd", "bd", "W1", "b1", "W2", "b2", "Wp", "bp"];
    p.tensors.get(t.0 as usize).is_some_and(|d| weights.contains(&&*d.name))
}

/// A float depthwise convolution whose rows idle an eighth of their lanes
/// or more (7, 13 and 14 of AVX2's 8 lanes and AVX-512's 16), its weights
/// constant, is stored channels last with the region around it: the
/// padding, the activations and the squeeze-and-excite's pooled channels
/// (laid out as before: one element a channel) and scaling; the expansion
/// and the projection, which sums over its channels, are returned, to be
/// computed filters-last, the expansion's copy back inlined. The
/// interpreter computes the same bits before and after, and every x86
/// target (where this CPU runs it) the interpreter's outputs, at channel
/// counts that leave a tail of a vector, stride 2 and 5 × 5 windows. Left
/// as it is: full rows (16 of AVX2's 8 lanes), filters that are arguments,
/// a projection whose filters fill too few of the lanes to be computed
/// filters-last (20 of AVX-512's 32) or whose sums are too shallow to pay
/// for its copy back (120 products), and a depthwise output written out.
#[test]
fn short_float_depthwise_regions_are_stored_channels_last() {
    use texc_compiler::target::lookup;
    for (c, e, hw, k, stride, se) in [(24, 136, 7, 3, 1, true), (24, 136, 27, 5, 2, true), (16, 152, 13, 3, 1, false)] {
        let o = (hw + 2 * (k / 2) - k) / stride + 1;
        let name = format!("{c} → {e} at {hw}², {k} × {k} of stride {stride}{}", if se { ", SE" } else { "" });
        let p = program("blk.tex", &float_inverted_block(c, e, hw, k, stride, se));
        for target in ["x86-avx2", "x86-avx512"] {
            let t = lookup(target).expect("registered");
            let mut q = p.clone();
            let wanted = texc_schedules::channels_last::channels_last(&mut q, t, &|u| block_weight(&p, u));
            let tir = texc_compiler::print::print_program(&q);
            for moved in [format!("temp D: f32[1, {o}, {o}, {e}]"), format!("temp G: f32[1, {o}, {o}, {e}]")] {
                assert!(tir.contains(&moved), "{name} {target}: `{moved}`:\n{tir}");
            }
            let pd = hw + 2 * (k / 2);
            assert!(tir.contains(&format!("temp P: f32[1, {pd}, {pd}, {e}]")), "{name} {target}: the padding:\n{tir}");
            assert!(
                tir.contains(&format!("temp T: f32[1, {e}, {hw}, {hw}]")),
                "{name} {target}: the top stays:\n{tir}"
            );
            assert_eq!(wanted.len(), 2, "{name} {target}: the expansion and the projection");
            let names: Vec<&str> = wanted.iter().map(|&u| &*q.tensor(u).name).collect();
            assert!(names.contains(&"T") && names.contains(&"Y"), "{name} {target}: {names:?}");
            assert_same_bits(&format!("{name} {target}"), &p, &q, &[5, 9]);
            let movable = |u| block_weight(&p, u);
            texc_schedules::filters_last::filters_last(&mut q, t, &movable, &|u| wanted.contains(&u));
            let tir = texc_compiler::print::print_program(&q);
            assert!(
                tir.contains(&format!("temp T.t: f32[1, {}, {e}]", hw * hw)),
                "{name} {target}: merged rows:\n{tir}"
            );
            assert!(!tir.contains("stage T["), "{name} {target}: read as stored:\n{tir}");
            assert!(tir.contains("temp Y.t: "), "{name} {target}: the projection filters-last:\n{tir}");
            let f = texc_tests::default_lowered_on(t, &q);
            assert_same(&format!("{name} {target}"), &q, &f, 4);
            assert_runs_as_interp(&format!("{name} {target}"), t, &q, &f, 4);
        }
    }
    let kept = |src: &str, target: &str, weights: &dyn Fn(texc_compiler::tir::TensorId) -> bool| {
        let mut q = program("blk.tex", src);
        let t = lookup(target).expect("registered");
        texc_schedules::channels_last::channels_last(&mut q, t, weights).is_empty()
    };
    let block = float_inverted_block(24, 136, 7, 3, 1, true);
    let p = program("blk.tex", &block);
    assert!(!kept(&block, "x86-avx2", &|u| block_weight(&p, u)), "moved");
    assert!(kept(&block, "x86-avx2", &|_| false), "filters as arguments");
    let full = float_inverted_block(24, 120, 16, 3, 1, true);
    let pf = program("blk.tex", &full);
    assert!(kept(&full, "x86-avx2", &|u| block_weight(&pf, u)), "rows of 16 fill AVX2's vectors");
    let shallow = float_inverted_block(24, 120, 7, 3, 1, true);
    let ps = program("blk.tex", &shallow);
    assert!(kept(&shallow, "x86-avx2", &|u| block_weight(&ps, u)), "a projection summing 120 products");
    let narrow = float_inverted_block(20, 136, 7, 3, 1, true);
    let pn = program("blk.tex", &narrow);
    assert!(kept(&narrow, "x86-avx512", &|u| block_weight(&pn, u)), "a projection to 20 filters, 20 of 32 lanes");
    assert!(!kept(&narrow, "x86-avx2", &|u| block_weight(&pn, u)), "20 filters in 24 of AVX2's lanes");
    let written_out = block
        .replace("-> Y: f32[1, 24, 7, 7]", "-> (Y: f32[1, 24, 7, 7], D: f32[1, 136, 7, 7])")
        .replace("D[n, f, y in 0..7, x in 0..7]", "D[n, f, y, x]");
    let pw = program("blk.tex", &written_out);
    assert!(kept(&written_out, "x86-avx2", &|u| block_weight(&pw, u)), "the depthwise an output");
}

/// A RegNet block as the ONNX importer writes it: a 1 × 1 expansion of `c`
/// channels to `e`, its bias and ReLU, zero padding, a 3 × 3 convolution
/// in groups of `g` channels on a `hw` × `hw` map, its bias and ReLU, and a
/// 1 × 1 projection to `c`.
fn grouped_block(c: i64, e: i64, g: i64, hw: i64) -> String {
    format!(
        "kernel blk(X: f32[1, {c}, {hw}, {hw}], We: f32[{e}, {c}], be: f32[{e}], Wd: f32[{e}, {g}, 3, 3], bd: f32[{e}], \
         Wp: f32[{c}, {e}], bp: f32[{c}]) -> Y: f32[1, {c}, {hw}, {hw}] {{\n\
         \x20   T[n, f, y, x] = sum[q](X[n, q, y, x] * We[f, q]);\n\
         \x20   A[n, f, y, x] = max(T[n, f, y, x] + be[f], 0.0);\n\
         \x20   P[n, f, y in 0..{pd}, x in 0..{pd}] = select(y >= 1 && y < {hp} && x >= 1 && x < {hp}, A[n, f, y - 1, x - 1], 0.0);\n\
         \x20   D[n, k, y in 0..{hw}, x in 0..{hw}] = sum[q in 0..{g}, r in 0..3, s in 0..3](P[n, k / {g} * {g} + q, y + r, x + s] * Wd[k, q, r, s]);\n\
         \x20   G[n, k, y, x] = max(D[n, k, y, x] + bd[k], 0.0);\n\
         \x20   Y[n, q, y, x] = sum[f](Wp[q, f] * G[n, f, y, x]) + bp[q];\n}}\n",
        pd = hw + 2,
        hp = hw + 1,
    )
}

/// A grouped convolution whose groups are whole vectors and whose rows
/// idle an eighth of the lanes or more (RegNet's groups of 16 and 24 on
/// 7 × 7 and 14 × 14 maps) starts a region as a depthwise convolution
/// does: its padded input and its output are stored channels last (the
/// input read through the group, one element per vector of a group's
/// filters), the expansion and the projection returned to be computed
/// filters-last. The interpreter computes the same bits, every x86 target
/// this CPU runs the interpreter's outputs, and the register block's
/// vectors each lie in one group, never gathered across two (groups of 24
/// on AVX2: the block takes the group's three vectors, which share each
/// broadcast of its input). Left as it is: groups of 4 (half of AVX2's
/// vector), rows of 16 that fill AVX2's vectors.
#[test]
fn short_grouped_regions_are_stored_channels_last() {
    use texc_compiler::target::lookup;
    let weight = |p: &Program, t: texc_compiler::tir::TensorId| {
        p.tensors.get(t.0 as usize).is_some_and(|d| ["We", "be", "Wd", "bd", "Wp", "bp"].contains(&&*d.name))
    };
    for (c, e, g, hw, targets) in [
        (40, 144, 16, 7, &["x86-avx2", "x86-avx512"][..]),
        (24, 168, 24, 14, &["x86-avx2"][..]),
        (32, 160, 16, 13, &["x86-avx2", "x86-avx512"][..]),
    ] {
        let name = format!("{c} → {e} in groups of {g} at {hw}²");
        let p = program("blk.tex", &grouped_block(c, e, g, hw));
        for &target in targets {
            let t = lookup(target).expect("registered");
            let mut q = p.clone();
            let wanted = texc_schedules::channels_last::channels_last(&mut q, t, &|u| weight(&p, u));
            let tir = texc_compiler::print::print_program(&q);
            let pd = hw + 2;
            for moved in [
                format!("temp P: f32[1, {pd}, {pd}, {e}]"),
                format!("temp D: f32[1, {hw}, {hw}, {e}]"),
                format!("temp G: f32[1, {hw}, {hw}, {e}]"),
            ] {
                assert!(tir.contains(&moved), "{name} {target}: `{moved}`:\n{tir}");
            }
            let names: Vec<&str> = wanted.iter().map(|&u| &*q.tensor(u).name).collect();
            assert!(names.contains(&"T") && names.contains(&"Y") && names.len() == 2, "{name} {target}: {names:?}");
            assert_same_bits(&format!("{name} {target}"), &p, &q, &[3, 8]);
            let movable = |u| weight(&p, u);
            texc_schedules::filters_last::filters_last(&mut q, t, &movable, &|u| wanted.contains(&u));
            let f = texc_tests::default_lowered_on(t, &q);
            let text = texc_schedules::ir::print(&f);
            assert!(!text.contains(&format!("k.v) / {g}")), "{name} {target}: a vector across groups:\n{text}");
            if g == 24 {
                let block =
                    text.lines().find(|l| l.contains("local D.") && l.contains(".acc: f32[")).unwrap_or_default();
                assert!(block.contains(", 24]"), "{name} {target}: not a whole group's filters: {block}\n{text}");
            }
            assert_same(&format!("{name} {target}"), &q, &f, 4);
            assert_runs_as_interp(&format!("{name} {target}"), t, &q, &f, 4);
        }
    }
    let kept = |src: &str| {
        let mut q = program("blk.tex", src);
        let p = q.clone();
        let t = lookup("x86-avx2").expect("registered");
        texc_schedules::channels_last::channels_last(&mut q, t, &|u| weight(&p, u)).is_empty()
    };
    assert!(kept(&grouped_block(40, 144, 4, 7)), "groups of 4 in 8 lanes");
    assert!(kept(&grouped_block(40, 144, 16, 16)), "rows of 16 fill AVX2's vectors");
}

/// Two RegNet blocks with residual sums (`R1 = relu(S + Y1)`, `R2 =
/// relu(R1 + Y2)`; `S` the first block's shortcut, a 1 × 1 convolution of
/// the stage's input), pooled, as a stage of RegNetX: `c` channels in groups of `g` on a `hw` × `hw` map. `outputs`
/// adds outputs.
fn grouped_stage(c: i64, g: i64, hw: i64, outputs: &str) -> String {
    let block = |i: usize, t: &str, x: &str| {
        format!(
            "    T{i}[n, f, y, x] = sum[q]({t}[n, q, y, x] * We{i}[f, q]);\n\
             \x20   A{i}[n, f, y, x] = max(T{i}[n, f, y, x] + be{i}[f], 0.0);\n\
             \x20   P{i}[n, f, y in 0..{pd}, x in 0..{pd}] = select(y >= 1 && y < {hp} && x >= 1 && x < {hp}, A{i}[n, f, y - 1, x - 1], 0.0);\n\
             \x20   D{i}[n, k, y in 0..{hw}, x in 0..{hw}] = sum[q in 0..{g}, r in 0..3, s in 0..3](P{i}[n, k / {g} * {g} + q, y + r, x + s] * Wd{i}[k, q, r, s]);\n\
             \x20   G{i}[n, k, y, x] = max(D{i}[n, k, y, x] + bd{i}[k], 0.0);\n\
             \x20   Y{i}[n, q, y, x] = sum[f](Wp{i}[q, f] * G{i}[n, f, y, x]);\n\
             \x20   R{i}[n, q, y, x] = max({x}[n, q, y, x] + Y{i}[n, q, y, x] + bp{i}[q], 0.0);\n",
            pd = hw + 2,
            hp = hw + 1,
        )
    };
    let weights = |i: usize| {
        format!("We{i}: f32[{c}, {c}], be{i}: f32[{c}], Wd{i}: f32[{c}, {g}, 3, 3], bd{i}: f32[{c}], Wp{i}: f32[{c}, {c}], bp{i}: f32[{c}]")
    };
    format!(
        "kernel stage(X: f32[1, {c}, {hw}, {hw}], W0: f32[{c}, {c}], {}, {}) -> (Y: f32[1, {c}]{outputs}) {{\n\
         \x20   S[n, q, y, x] = sum[p](X[n, p, y, x] * W0[q, p]);\n{}{}\
         \x20   M[n, q, i in 0..1, j in 0..1] = sum[y, x](R2[n, q, y, x]) / {area}.0;\n\
         \x20   Y[n, q] = M[n, q, 0, 0];\n}}\n",
        weights(1),
        weights(2),
        block(1, "X", "S"),
        block(2, "R1", "R1"),
        area = hw * hw,
    )
}

/// Across blocks: a region goes on through its projection, whose residual
/// sum keeps the channels, to the next block (its expansion a bottom and a
/// top, its grouped convolution a seed), so that a stage of blocks keeps
/// its channels last throughout — the residual sums, the pooling — and
/// every product inside reads and writes them so, no copy back left. The
/// interpreter computes the same bits, the x86 targets the interpreter's
/// outputs. Where the walk across cannot close (a residual sum written
/// out), each block's own region is taken, as before.
#[test]
fn grouped_regions_go_across_blocks() {
    use texc_compiler::target::lookup;
    let weight = |p: &Program, t: texc_compiler::tir::TensorId| {
        p.tensors.get(t.0 as usize).is_some_and(|d| d.name.starts_with('W') || d.name.starts_with('b'))
    };
    let (c, g, hw) = (144, 16, 7);
    let p = program("stage.tex", &grouped_stage(c, g, hw, ""));
    for target in ["x86-avx2", "x86-avx512"] {
        let t = lookup(target).expect("registered");
        let mut q = p.clone();
        let wanted = texc_schedules::channels_last::channels_last(&mut q, t, &|u| weight(&p, u));
        let tir = texc_compiler::print::print_program(&q);
        for moved in ["R1", "R2", "P1", "P2", "G1", "G2", "A2"] {
            let shape = if moved.starts_with('P') { [hw + 2, hw + 2] } else { [hw, hw] };
            let decl = format!("temp {moved}: f32[1, {}, {}, {c}]", shape[0], shape[1]);
            assert!(tir.contains(&decl), "{target}: `{decl}`:\n{tir}");
        }
        let names: Vec<&str> = wanted.iter().map(|&u| &*q.tensor(u).name).collect();
        for product in ["S", "T1", "Y1", "T2", "Y2"] {
            assert!(names.contains(&product), "{target}: {product} in {names:?}");
        }
        assert_same_bits(target, &p, &q, &[2, 6]);
        let movable = |u| weight(&p, u);
        texc_schedules::filters_last::filters_last(&mut q, t, &movable, &|u| wanted.contains(&u));
        let tir = texc_compiler::print::print_program(&q);
        for copy in ["stage S[", "stage T1[", "stage Y1[", "stage T2[", "stage Y2["] {
            assert!(!tir.contains(copy), "{target}: `{copy}` read as stored:\n{tir}");
        }
        let f = texc_tests::default_lowered_on(t, &q);
        assert_same(target, &q, &f, 4);
        assert_runs_as_interp(target, t, &q, &f, 4);
    }
    let written = program("stage.tex", &grouped_stage(c, g, hw, &format!(", R1: f32[1, {c}, {hw}, {hw}]")));
    let mut q = written.clone();
    let t = lookup("x86-avx2").expect("registered");
    texc_schedules::channels_last::channels_last(&mut q, t, &|u| weight(&written, u));
    let tir = texc_compiler::print::print_program(&q);
    assert!(tir.contains(&format!("temp G1: f32[1, {hw}, {hw}, {c}]")), "block 1's own region:\n{tir}");
    assert!(tir.contains(&format!("temp G2: f32[1, {hw}, {hw}, {c}]")), "block 2's own region:\n{tir}");
    assert!(!tir.contains(&format!("temp R2: f32[1, {hw}, {hw}, {c}]")), "no region across:\n{tir}");
}

/// `texc_schedules::forward` on inverted residual blocks stored channels
/// last (`channels_last`, `filters_last`): with a ReLU after the expansion,
/// at maps of 7, 13 and 27 (stride 2, 5 × 5), the expansion's write-back
/// stores the padding `P` where the padding copy would (the expansion's
/// own tensor `T.t` is neither stored nor read), the copy keeps its frame,
/// and the nests compute the interpreter's outputs — in the loop evaluator
/// and compiled for each x86 target this CPU runs; the pipeline runs the
/// pass after *zero* (`forward=0` leaves it out). With the block's SiLU, a
/// transcendental function, on an expansion that fits the L2 (7² × 144
/// floats), the copy stays.
#[test]
fn padding_copies_are_stored_by_their_producers() {
    use texc_compiler::target::lookup;
    let moved = |p: &Program, t: &'static texc_compiler::target::Target| {
        let mut q = p.clone();
        let weights = |u| block_weight(p, u);
        let wanted = texc_schedules::channels_last::channels_last(&mut q, t, &weights);
        texc_schedules::filters_last::filters_last(&mut q, t, &weights, &|u| wanted.contains(&u));
        q
    };
    let loops = |t: &'static texc_compiler::target::Target, q: &Program, forward: bool| {
        let mut pl = texc_tests::pipeline_on(t);
        if !forward {
            pl.options.knobs.insert(texc_pipeline::KNOB_FORWARD.into(), 0);
        }
        pl.default_loops(q.clone()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)))
    };
    let lowered = |t, q: &Program| loops(t, q, true).lowered;
    for (c, e, hw, k, stride) in [(24, 144, 7, 3, 1), (16, 144, 13, 3, 1), (24, 160, 27, 5, 2)] {
        let name = format!("{c} → {e} at {hw}², {k} × {k} of stride {stride}");
        let relu = float_inverted_block(c, e, hw, k, stride, false)
            .replace("B[n, f, y, x] * sigmoid(B[n, f, y, x])", "max(B[n, f, y, x], 0.0)");
        let p = program("blk.tex", &relu);
        for target in ["x86-avx2", "x86-avx512"] {
            let t = lookup(target).expect("registered");
            let q = moved(&p, t);
            let plain = lowered(t, &q);
            let before = texc_schedules::ir::print(&plain);
            assert!(before.contains("T.t["), "{name} {target}: the expansion's tensor:\n{before}");
            let mut f = plain.clone();
            let done = texc_schedules::forward::forward_copies(&mut f, t);
            let text = texc_schedules::ir::print(&f);
            assert_eq!(
                done.iter().map(|&u| f.p.tensor(u).name.as_str()).collect::<Vec<_>>(),
                ["P"],
                "{name} {target}\n{before}"
            );
            assert!(!text.contains("T.t["), "{name} {target}: T.t stored or read:\n{text}");
            // The pipeline runs the pass (after *zero*), unless told not to.
            let legal = |forward| texc_schedules::ir::print(&loops(t, &q, forward).legal);
            assert!(!legal(true).contains("T.t[") && legal(false).contains("T.t["), "{name} {target}");
            assert_same(&format!("{name} {target}"), &q, &f, 4);
            assert_runs_as_interp(&format!("{name} {target}"), t, &q, &f, 4);
        }
    }
    let silu = program("blk.tex", &float_inverted_block(24, 144, 7, 3, 1, false));
    let t = lookup("x86-avx2").expect("registered");
    let mut f = lowered(t, &moved(&silu, t));
    assert!(texc_schedules::forward::forward_copies(&mut f, t).is_empty(), "a SiLU over 7² × 144 floats stays");
}

/// A transposing stage (`T[c, p] = 2 · X[p, c]`: each vector of `T`
/// gathered from lines 256 bytes apart) read by two stages stays a pass of
/// its own, which both read contiguously: inlined, each would gather the
/// lines again (DenseNet's transition, pooled before its 1×1 convolution,
/// stores a 7 × 7 product filters-last, whose copy back sixteen to
/// thirty-two concatenations read). Read by one stage, it is inlined.
#[test]
fn a_transposing_stage_read_twice_stays_a_pass() {
    let two = "kernel tr(X: f32[P = 49, C = 64]) -> (A: f32[C, P], B: f32[C, P]) {
    T[c, p] = X[p, c] * 2.0;
    A[c, p] = T[c, p] + 1.0;
    B[c, p] = max(T[c, p], 0.0);
}";
    default_on_x86("tr2", two, |target, loops| {
        let starts = |l: &str, with: &str| l.trim_start().starts_with(with);
        assert!(loops.lines().any(|l| starts(l, "T[")), "{target}: T stays a pass:\n{loops}");
        let readers = loops.lines().filter(|l| starts(l, "A[") || starts(l, "B["));
        assert!(
            readers.clone().count() > 0 && readers.clone().all(|l| !l.contains("X[")),
            "{target}: A and B read T:\n{loops}"
        );
    });
    let one = "kernel tr(X: f32[P = 49, C = 64]) -> A: f32[C, P] {
    T[c, p] = X[p, c] * 2.0;
    A[c, p] = T[c, p] + 1.0;
}";
    default_on_x86("tr1", one, |target, loops| {
        assert!(!loops.lines().any(|l| l.trim_start().starts_with("T[")), "{target}: T inlined:\n{loops}");
    });
}

/// A grouped convolution's register block takes rows among the filters of
/// one group, which all read the same input channels: once its loops are
/// fused, the input's channel `k / Kg · Cg + c`, with `k` the fused loop's
/// group, row block and the block's row, is the group's `g · Cg + c`, the
/// same for every row (the lowering divides exactly where intervals bound
/// the remainder), so the rows share each load of the input. Kept as
/// `(… + row) / 24 · 24 + c`, every row loaded its own (AVX2, 6 rows of
/// 14 lanes: RegNetY-1.6GF's 336-channel layers 0.75 → 0.36 ms).
#[test]
fn a_grouped_convolutions_rows_share_their_input() {
    let src = "import std.nn;
kernel g(X: f32[N = 1, C = 48, H = 14, W = 14], Wt: f32[C, 24, 3, 3], b: f32[C]) -> Y: f32[N, C, H, W] {
    Y = relu(conv2d_bias(X, Wt, b, pad = 1, groups = 2));
}";
    default_on_x86("grouped", src, |target, loops| {
        let row = loops
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("for ")?.strip_suffix(" unrolled:")?.split(" in ").next())
            .unwrap_or_else(|| panic!("{target}: a register block of rows:\n{loops}"));
        let channels: Vec<&str> = loops
            .lines()
            .filter(|l| l.contains(".acc["))
            .flat_map(|l| l.split(".Xp[").skip(1))
            .map(|rest| rest.split(", ").nth(1).expect("the channel index"))
            .collect();
        assert!(!channels.is_empty(), "{target}: the block reads the padded input:\n{loops}");
        for ch in channels {
            assert!(!ch.contains(row) && !ch.contains('%'), "{target}: channel `{ch}` varies with the row `{row}`");
        }
    });
}

/// A 1 × 1 convolution of 300 channels to 128 over a 12² map stored
/// channels-first, computed filters-last (its weights moved): 144 rows read
/// along `X`'s lines, a line apart at each step, too many to stay in L1
/// whole. On `x86-avx2`, whose register blocks wait on L2, its reduction is
/// cut into slices no deeper than 128 (a quarter of the nominal 32 KiB L1
/// in the lines of a block's rows; `LongBlocking::row_block_slice`): three
/// of 104, the last 92 deep. AVX-512's blocks keep one slice. Both compute
/// the interpreter's outputs.
#[test]
fn many_rows_along_lines_are_sliced_as_the_interpreter_computes() {
    use texc_compiler::target::lookup;
    let src = "kernel pw(X: f32[1, 300, 12, 12], W: f32[128, 300], b: f32[128]) -> Y: f32[1, 128, 12, 12] {
    Y[n, f, y, x] = sum[q](X[n, q, y, x] * W[f, q]) + b[f];
}";
    let p = program("pw.tex", src);
    let weight = |u: texc_compiler::tir::TensorId| p.tensors.get(u.0 as usize).is_some_and(|d| d.name != "X");
    for target in ["x86-avx2", "x86-avx512"] {
        let t = lookup(target).expect("registered");
        let mut q = p.clone();
        texc_schedules::filters_last::filters_last(&mut q, t, &weight, &|_| true);
        let f = texc_tests::default_lowered_on(t, &q);
        let text = texc_schedules::ir::print(&f);
        let sliced = text.contains("for q.i in 0..104:") && text.contains("for q.i in 0..92:");
        assert_eq!(sliced, target == "x86-avx2", "{target}:\n{text}");
        assert_same(&format!("pw {target}"), &q, &f, 4);
        assert_runs_as_interp(&format!("pw {target}"), t, &q, &f, 4);
    }
}

/// A grouped 3 × 3 convolution over rows of 27 (four AVX2 vectors, the
/// last of 3 lanes), 36 channels in groups of 12: on `x86-avx2` its register
/// blocks take 2 filters of the row's 4 vectors, whose step keeps the row
/// and a broadcast beside the 8 accumulators (3 filters, which divide the
/// group, spilled); AVX-512's take the group's 12 filters of 2 vectors.
/// Over a 7² map, the blocks take image rows too. Both x86 targets compute
/// the interpreter's outputs.
#[test]
fn grouped_convolutions_over_short_rows_keep_their_rows_in_registers() {
    let src = "import std.nn;
kernel gconv(X: f32[N = 1, C = 36, H = 5, W = 27], Wt: f32[C, 12, 3, 3], b: f32[C]) -> Y: f32[N, C, H, W] {
    Y = relu(conv2d_bias(X, Wt, b, pad = 1, groups = 3));
}";
    default_on_x86("gconv", src, |target, loops| {
        let block = loops.lines().find(|l| l.contains(".r0.acc: f32[")).unwrap_or_default();
        let want = if target == "x86-avx2" { "f32[2, 4, 8]" } else { "f32[12, 2, 16]" };
        assert!(block.contains(want), "{target}: {block}\n{loops}");
    });
    // A 7² map, 48 channels in groups of 16: rows of one vector, blocked
    // over filters and image rows as a convolution's (2 filters × 4 rows
    // on AVX2, 4 × 4 on AVX-512), not filters alone (8 and 16).
    let seven = src.replace("C = 36, H = 5, W = 27], Wt: f32[C, 12", "C = 48, H = 7, W = 7], Wt: f32[C, 16");
    default_on_x86("gconv7", &seven, |target, loops| {
        let block = loops.lines().find(|l| l.contains(".r0.acc: f32[")).unwrap_or_default();
        let want = if target == "x86-avx2" { "f32[2, 4, 7]" } else { "f32[4, 4, 7]" };
        assert!(block.contains(want), "{target}: {block}\n{loops}");
    });
}
