//! The loop IR as text (`.loops`): every printed loop nest reads back into
//! one that prints the same and computes the same, and malformed or unsafe
//! text is a spanned error.

use texc_compiler::Bindings;
use texc_grammar::span::SourceMap;
use texc_runtime::SplitMix64;
use texc_schedules::ir::print;
use texc_schedules::LoopFunc;
use texc_tests::kernels_of_file;

/// Parse the printed `f`, assert that it prints the same, return it.
fn round_trip(name: &str, f: &LoopFunc) -> LoopFunc {
    let text = print(f);
    let mut sm = SourceMap::new();
    let id = sm.add(format!("{name}.loops"), text.clone());
    let parsed =
        texc_schedules::text::parse(&text, id).unwrap_or_else(|d| panic!("{name}:\n{}\n{text}", d.render(&sm)));
    let again = print(&parsed.func);
    assert_eq!(again, text, "{name}: print(parse(text)) differs from text");
    parsed.func
}

/// Errors of `text`, rendered.
fn errors(name: &str, text: &str) -> String {
    let mut sm = SourceMap::new();
    let id = sm.add(format!("{name}.loops"), text.to_string());
    match texc_schedules::text::parse(text, id) {
        Ok(_) => panic!("{name}: parsed:\n{text}"),
        Err(d) => d.render(&sm),
    }
}

#[test]
fn every_example_and_std_op_round_trips_on_every_target() {
    let mut n = 0;
    for target in ["x86-avx2", "x86-avx512", "x86-avx512-amx", "cranelift"] {
        for file in texc_tests::example_files() {
            let (mut pl, kernels) = kernels_of_file(target, &file);
            for k in kernels {
                let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
                let loops = pl.loops(k, p).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
                let name = format!("{file}:{k:?}:{target}");
                round_trip(&name, &loops.lowered);
                round_trip(&format!("{name}:legal"), &loops.legal);
                n += 2;
            }
        }
        for (name, p) in texc_tests::std_op_programs(7) {
            round_trip(&format!("{name}:{target}"), &texc_tests::default_lowered(target, &p));
            n += 1;
        }
    }
    assert!(n > 100, "only {n} loop nests");
}

/// Random legal schedules (splits, reorders, fusions, attachments) read
/// back into nests that the loop evaluator runs to bit-identical outputs.
#[test]
fn random_schedules_round_trip_and_compute_the_same() {
    let mut rng = SplitMix64::new(0x100b5);
    for (file, kernel, shapes) in texc_tests::RANDOM_SCHEDULE_CASES {
        let base = texc_tests::random_case_program(file, kernel, shapes);
        for i in 0..10 {
            let f = texc_tests::randomly_scheduled(&base, &mut rng);
            let g = round_trip(&format!("{file}#{i}"), &f);
            let args = texc_compiler::interp::bind_args(&f.p, Default::default(), &[], i).expect("binds");
            let want = texc_schedules::eval::run(&f, args.clone()).expect("runs");
            let got = texc_schedules::eval::run(&g, args).expect("runs");
            for (a, b) in want.iter().zip(&got) {
                assert_eq!(a.to_f64(), b.to_f64(), "{file}#{i}: parsed nest computes differently");
            }
        }
    }
}

#[test]
fn malformed_and_unsafe_loops_are_spanned_errors() {
    let head = "func k [N=4]\n  input X: f32[4]\n  output Y: f32[4]\n";
    let cases: &[(&str, String)] = &[
        ("empty", String::new()),
        ("no_func", "  input X: f32[4]\n".into()),
        ("syntax", format!("{head}  for i in 0..4:\n    Y[i] = X[i] +\n")),
        ("unknown_name", format!("{head}  for i in 0..4:\n    Y[i] = X[j]\n")),
        ("unknown_tensor", format!("{head}  for i in 0..4:\n    Z[i] = X[i]\n")),
        ("indentation", format!("{head}  for i in 0..4:\n     Y[i] = X[i]\n")),
        ("empty_body", format!("{head}  for i in 0..4:\n  Y[0] = X[0]\n")),
        ("type_mismatch", format!("{head}  for i in 0..4:\n    Y[i] = X[i] + 1.0f64\n")),
        ("untyped_float", format!("{head}  for i in 0..4:\n    Y[i] = X[i] * 2.0\n")),
        ("out_of_bounds_read", format!("{head}  for i in 0..4:\n    Y[i] = X[i + 1]\n")),
        ("out_of_bounds_write", format!("{head}  for i in 0..5:\n    Y[i] = 0.0f32\n")),
        ("data_dependent_index", "func k [N=4]\n  input X: f32[4]\n  input I: i32[4]\n  output Y: f32[4]\n  for i in 0..4:\n    Y[i] = X[index(I[i])]\n".into()),
        ("store_to_input", format!("{head}  for i in 0..4:\n    X[i] = 0.0f32\n")),
        ("rank", format!("{head}  for i in 0..4:\n    Y[i, i] = X[i]\n")),
        ("declared_twice", "func k [N=4]\n  input X: f32[4]\n  output X: f32[4]\n".into()),
        ("too_many_iterations", format!("{head}  for i in 0..1099511627776:\n    for j in 0..4:\n      Y[j] = X[j]\n")),
        ("bool_condition", format!("{head}  for i in 0..4:\n    if i + 1:\n      Y[i] = X[i]\n")),
        ("unknown_function", format!("{head}  for i in 0..4:\n    Y[i] = swish(X[i])\n")),
        ("rolled_vector_loop", format!("{head}  for i in 0..4 vectorized rolled:\n    Y[i] = X[i]\n")),
    ];
    let mut out = String::new();
    for (name, text) in cases {
        out.push_str(&format!("--- {name}\n{}\n", errors(name, text)));
    }
    insta::assert_snapshot!("loops_text_errors", out);
}

/// What the checker proves: guarded tails, padding selects and the right
/// operand of `&&` are in bounds; the same accesses without their guards are not.
#[test]
fn guards_and_selects_prove_accesses() {
    let head = "func k [N=10]\n  input X: f32[10]\n  output Y: f32[10]\n";
    let ok = [
        format!("{head}  for i.o in 0..3:\n    for i.v in 0..4:\n      if i.o * 4 + i.v < 10:\n        Y[i.o * 4 + i.v] = X[i.o * 4 + i.v]\n"),
        format!("{head}  for i in 0..10:\n    Y[i] = select(i >= 1, X[i - 1], 0.0f32)\n"),
        format!("{head}  for i in 0..10:\n    Y[i] = select(i + 1 < 10 && X[i + 1] > 0.0f32, 1.0f32, 0.0f32)\n"),
        format!("{head}  for i in 0..10:\n    Y[i / 2] = X[19 - i - i / 2 * 0 - i % 1 - 10 + 0 * i]\n"),
    ];
    for (n, text) in ok.iter().enumerate() {
        let mut sm = SourceMap::new();
        let id = sm.add("ok.loops", text.clone());
        if let Err(d) = texc_schedules::text::parse(text, id) {
            panic!("case {n} should be proven:\n{}\n{text}", d.render(&sm));
        }
    }
    let bad = [
        format!("{head}  for i.o in 0..3:\n    for i.v in 0..4:\n      Y[i.o * 4 + i.v] = X[i.o * 4 + i.v]\n"),
        format!("{head}  for i in 0..10:\n    Y[i] = select(i >= 0, X[i - 1], 0.0f32)\n"),
        format!("{head}  for i in 0..10:\n    Y[i] = select(X[i + 1] > 0.0f32 && i + 1 < 10, 1.0f32, 0.0f32)\n"),
    ];
    for text in &bad {
        assert!(errors("bad", text).contains("cannot prove"), "{text}");
    }
}

#[test]
fn comments_blank_lines_and_crlf_are_accepted() {
    let text = "# a hand-edited nest\r\nfunc k [N=4]\r\n  input X: f32[4]\r\n\r\n  output Y: f32[4]\r\n  # double it\r\n  for i in 0..4 vectorized:\r\n    Y[i] = X[i] * 2.0f32\r\n";
    let mut sm = SourceMap::new();
    let id = sm.add("c.loops", text.to_string());
    let f = texc_schedules::text::parse(text, id).unwrap_or_else(|d| panic!("{}", d.render(&sm))).func;
    assert_eq!(
        print(&f),
        "func k [N=4]\n  input X: f32[4]\n  output Y: f32[4]\n  for i in 0..4 vectorized:\n    Y[i] = X[i] * 2.0f32\n"
    );
}

/// A `.loops` file written from a kernel's printed nest, edited by hand
/// (an inner loop unrolled, a vectorized loop made serial), runs through the
/// pipeline on every runnable target and matches the interpreter's run of
/// the kernel its `source` line names; a nest whose parameters differ from
/// that kernel's is refused.
#[test]
fn edited_loops_files_run_against_their_oracle() {
    let dir = texc_tests::scratch("loops");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let b = Bindings { shapes: vec![("M".into(), 13), ("K".into(), 7), ("N".into(), 19)], ..Bindings::default() };
    let (mut pl, k) = texc_tests::load_file("x86-avx2", "examples/matmul.tex", None).expect("loads");
    let p = texc_tests::specialize(&mut pl, k, &b);
    let text = print(&texc_tests::loops(&mut pl, k, &p));
    // The source line is relative to the workspace root; the file lives elsewhere.
    let text = text.replace("source \"examples/", &format!("source \"{}/examples/", texc_tests::root().display()));
    let edited = text.replacen(" vectorized:", ":", 1);
    assert_ne!(edited, text, "the nest has a vectorized loop to edit:\n{text}");
    let path = dir.join("mm.loops");
    std::fs::write(&path, &edited).expect("write");
    let (targets, _) = texc_tests::runnable_targets();
    // A CPU nest (parallel, vectorized loops): GPU targets refuse it (tests/tests/gpu.rs).
    let cpus = targets.iter().filter(|t| t.kind != texc_compiler::target::TargetKind::Gpu);
    for target in std::iter::once("interp").chain(cpus.map(|t| t.name)) {
        let mut pl = texc_tests::pipeline(target);
        let lf = pl.load_loops(&path).unwrap_or_else(|e| panic!("{target}: {}", texc_tests::rendered(&pl, e)));
        let oracle = lf.oracle.clone().expect("the source line names the oracle");
        let args = pl.prepare_loops(&lf, Default::default(), &[], 5, true).expect("arguments");
        let got = match &lf.legal {
            Some(legal) => pl.compile(legal).expect("compiles").run(args.clone()).expect("runs"),
            None => texc_schedules::eval::run(&lf.lowered, args.clone()).expect("runs"),
        };
        let want = texc_pipeline::interpret(&oracle, args).expect("interprets");
        let err = texc_tests::rel_error(&want[0], &got[0]);
        assert!(err < 1e-5, "{target}: relative error {err}");
    }
    // Another size than the kernel's: the nest's tensors no longer match.
    let wrong = edited.replace("A: f32[13, 7]", "A: f32[13, 8]");
    std::fs::write(&path, &wrong).expect("write");
    let mut pl = texc_tests::pipeline("x86-avx2");
    let e = pl.load_loops(&path).err().expect("refused");
    let msg = texc_tests::rendered(&pl, e);
    assert!(msg.contains("does not have the parameters of kernel `matmul`"), "{msg}");
    // No source line: it runs, but cannot be checked.
    let unsourced: String =
        edited.lines().filter(|l| !l.trim_start().starts_with("source ")).map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, &unsourced).expect("write");
    let mut pl = texc_tests::pipeline("x86-avx2");
    let lf = pl.load_loops(&path).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    assert!(lf.oracle.is_none());
    assert!(matches!(pl.prepare_loops(&lf, Default::default(), &[], 5, true), Err(texc_pipeline::Error::Usage(_))));
    std::fs::remove_dir_all(&dir).ok();
}

/// Integer arithmetic wraps at its width: an index whose value may have
/// wrapped on the way is not what interval arithmetic says, and is refused
/// (`(i32(i) + 2147483647i32) / 2147483647i32` is 1 in exact arithmetic, but
/// −2 at i = 1 once the sum wraps).
#[test]
fn wrapping_index_arithmetic_is_not_trusted() {
    let head = "func k [N=4]\n  input X: f32[4]\n  output Y: f32[4]\n";
    let bad = [
        format!("{head}  for i in 0..4:\n    Y[i] = X[index((i32(i) + 2147483647i32) / 2147483647i32)]\n"),
        format!("{head}  for i in 0..4:\n    Y[i] = X[(i * 4611686018427387904 * 4 + i * 4) / 4 % 4 + i * 4611686018427387904 * 4 / 4611686018427387904]\n"),
        // A guard on a value that may have wrapped says nothing of the index.
        format!("{head}  for i in 0..4:\n    Y[i] = select(i32(i) * 2147483647i32 < 3i32 && i32(i) * 2147483647i32 >= 0i32, X[index(i32(i) * 2147483647i32)], 0.0f32)\n"),
        // `i8(x)` and `i32(x)` are different terms.
        format!("{head}  for i in 0..4:\n    Y[i] = select(i8(i * 100) < 4i8 && i8(i * 100) >= 0i8, X[index(i32(i * 100))], 0.0f32)\n"),
    ];
    for text in &bad {
        assert!(errors("wrap", text).contains("cannot prove"), "{text}");
    }
    // The same shapes without overflow are proven.
    let ok = format!("{head}  for i in 0..4:\n    Y[i] = X[index((i32(i) + 2000i32) / 1000i32) - 2]\n");
    let mut sm = SourceMap::new();
    let id = sm.add("ok.loops", ok.clone());
    assert!(texc_schedules::text::parse(&ok, id).is_ok(), "{ok}");
}

/// A `local` buffer takes at most 16 MiB (a 400 MB one overflowed the stack
/// of compiled code). Each frame — the kernel's body, or a parallel loop's —
/// keeps its stack arrays within 256 KiB: one per buffer, shared by unrolled
/// copies; past that (nested or sibling buffers) they come from the heap.
#[test]
fn locals_are_bounded_like_attached_buffers() {
    let head = "func k [N=4]\n  input X: f32[4]\n  output Y: f32[4]\n";
    let big = format!("{head}  for i in 0..4:\n    local T: f32[100000000]:\n      T[0] = X[i]\n      Y[i] = T[0]\n");
    assert!(errors("big", &big).contains("local buffers here take 400000000 bytes, more than 16777216"));
    let heap_of = |name: &str, text: &str| {
        let mut sm = SourceMap::new();
        let id = sm.add(format!("{name}.loops"), text.to_string());
        let f = texc_schedules::text::parse(text, id).unwrap_or_else(|d| panic!("{name}: {}", d.render(&sm))).func;
        let heap: Vec<String> = f.heap_locals().iter().map(|&t| f.p.tensor(t).name.clone()).collect();
        heap.join(" ")
    };
    let nested = format!(
        "{head}  local A: f32[40000]:\n    local B: f32[40000]:\n      A[0] = X[0]\n      B[0] = A[0]\n      Y[0] = B[0]\n"
    );
    assert_eq!(heap_of("nested", &nested), "B");
    let siblings = format!(
        "{head}  local A: f32[40000]:\n    A[0] = X[0]\n    Y[0] = A[0]\n  local B: f32[40000]:\n    B[0] = X[1]\n    Y[1] = B[0]\n"
    );
    assert_eq!(heap_of("siblings", &siblings), "B");
    let unrolled =
        format!("{head}  for u in 0..4 unrolled:\n    local A: f32[60000]:\n      A[u] = X[u]\n      Y[u] = A[u]\n");
    assert_eq!(heap_of("unrolled", &unrolled), "");
    let frames = format!(
        "{head}  local A: f32[60000]:\n    A[0] = X[0]\n    Y[0] = A[0]\n  for i in 1..4 parallel:\n    local B: f32[60000]:\n      B[i] = X[i]\n      Y[i] = B[i]\n"
    );
    assert_eq!(heap_of("frames", &frames), "");
    let two_big = format!(
        "{head}  local A: f32[3000000]:\n    local B: f32[3000000]:\n      A[0] = X[0]\n      B[0] = A[0]\n      Y[0] = B[0]\n"
    );
    assert_eq!(heap_of("two big", &two_big), "A B");
    // A split's tail runs its full tiles' body again in the kernel's frame
    // (a parallel loop of one iteration is not a task): the buffer counts
    // there too, and pushes a sibling of the same size to the heap.
    let split = format!(
        "{head}  for i in 0..2 parallel:\n    local P: f32[51200]:\n      P[0] = X[i]\n      Y[i] = P[0]\n  local Q: f32[51200]:\n    Q[0] = X[2]\n    Y[2] = Q[0]\n"
    );
    let mut sm = SourceMap::new();
    let id = sm.add("split.loops", split.clone());
    let mut f = texc_schedules::text::parse(&split, id).expect("parses").func;
    let texc_schedules::ir::Stmt::For { var, body, .. } = f.body[0].clone() else { panic!("a loop first") };
    let tail =
        texc_schedules::ir::Stmt::For { var, lo: 2, extent: 1, kind: texc_schedules::ir::ForKind::Parallel, body };
    f.body.insert(1, tail);
    let heap: Vec<String> = f.heap_locals().iter().map(|&t| f.p.tensor(t).name.clone()).collect();
    assert_eq!(heap, ["Q"]);
}

/// Buffers on the heap and the stack, as `locals_are_bounded_like_attached_buffers`
/// places them, compute what the loop evaluator does on every CPU backend:
/// a heap buffer written by a parallel loop's tasks and read after it, one
/// taken by each task, nested heap buffers, a stack array shared by unrolled
/// copies, and a sibling pushed onto the heap by the frame's budget.
#[test]
fn heap_and_stack_locals_compute_like_the_evaluator() {
    let text = "func k [N=64]
  input X: f32[64]
  output Y: f32[64]
  output Z: f32[64]
  local T: f32[100000]:
    for i in 0..64 parallel:
      T[i * 1000] = X[i] * 2.0f32
    for u in 0..4 unrolled:
      local S: f32[60000]:
        for i in 0..16:
          S[i * 1000] = T[(u * 16 + i) * 1000] + 1.0f32
        for i in 0..16:
          local R: f32[70000]:
            R[69999] = S[i * 1000] * 3.0f32
            Y[u * 16 + i] = R[69999]
  for j in 0..4 parallel:
    local P: f32[40000]:
      for i in 0..16:
        P[i * 2000] = X[j * 16 + i] - 1.0f32
      local Q: f32[40000]:
        for i in 0..16:
          Q[i] = P[i * 2000] * P[i * 2000]
        for i in 0..16:
          Z[j * 16 + i] = Q[i]
";
    let mut sm = SourceMap::new();
    let id = sm.add("heap.loops", text.to_string());
    let f = texc_schedules::text::parse(text, id).unwrap_or_else(|d| panic!("{}", d.render(&sm))).func;
    let heap: Vec<String> = f.heap_locals().iter().map(|&t| f.p.tensor(t).name.clone()).collect();
    assert_eq!(heap.join(" "), "T R Q", "T and R over 256 KiB, Q past a task's share with P");
    let args = texc_compiler::interp::bind_args(&f.p, Default::default(), &[], 3).expect("binds");
    let want = texc_schedules::eval::run(&f, args.clone()).expect("runs");
    let (targets, _) = texc_tests::runnable_targets();
    let mut ran = 0;
    for t in targets.iter().filter(|t| t.kind != texc_compiler::target::TargetKind::Gpu) {
        let got = texc_tests::compile_loops(t, &f).unwrap_or_else(|e| panic!("{}: {e}", t.name)).run(args.clone());
        let got = got.unwrap_or_else(|e| panic!("{}: {e}", t.name));
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.to_f64(), g.to_f64(), "{}", t.name);
        }
        ran += 1;
    }
    assert!(ran >= 2, "LLVM and Cranelift ran");
}

/// A temporary or local read before any statement above stores to it has no
/// value (a temporary read but never written had no buffer, and LLVM codegen
/// panicked; an unwritten local read stack garbage).
#[test]
fn temporaries_are_stored_before_they_are_read() {
    let head = "func k [N=4]\n  input X: f32[4]\n  output Y: f32[4]\n";
    let temp = format!("{head}  temp T: f32[4]\n  for i in 0..4:\n    Y[i] = T[i] + X[i]\n");
    assert!(errors("temp", &temp).contains("`T` is read before any statement above stores to it"));
    let local = format!("{head}  for i in 0..4:\n    local T: f32[4]:\n      Y[i] = T[i] + X[i]\n");
    assert!(errors("local", &local).contains("`T` is read before"));
    // Each `local` is a fresh array: a store in the previous iteration does not count.
    let ok = format!(
        "{head}  temp T: f32[4]\n  for i in 0..4:\n    T[i] = X[i]\n  for i in 0..4:\n    local L: f32[1]:\n      L[0] = T[i]\n      Y[i] = L[0] * 2.0f32\n"
    );
    let mut sm = SourceMap::new();
    let id = sm.add("ok.loops", ok.clone());
    assert!(texc_schedules::text::parse(&ok, id).is_ok(), "{ok}");
}

/// AMX tile products read back: both forms (`+=` and `=`, from zero) print
/// the same and compute the same in the loop evaluator; a `+=` into
/// accumulators nothing stored is refused, and a block past 32 × 32 too.
#[test]
fn tile_products_round_trip() {
    let src = "kernel q(A: u8[37, 250], W: i8[250, 70]) -> C: i32[37, 70] {\n    \
               C[i, j] = sum[k](i32(A[i, k]) * i32(W[k, j]));\n}\n";
    let (mut pl, k) = texc_tests::load_text("x86-avx512-amx", "q.tex", src, None).expect("loads");
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let loops = pl.loops(k, p).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
    let text = print(&loops.legal);
    assert!(text.contains("amx_dpbusd 5x32x64 C.acc[0, 0] @ (0, 1) = "), "{text}");
    let g = round_trip("tiles", &loops.legal);
    let args = texc_compiler::interp::bind_args(&g.p, Default::default(), &[], 5).expect("binds");
    let want = texc_schedules::eval::run(&loops.legal, args.clone()).expect("runs");
    let got = texc_schedules::eval::run(&g, args).expect("runs");
    for (a, b) in want.iter().zip(&got) {
        assert_eq!(a.bytes(), b.bytes(), "the parsed tile products compute differently");
    }
    let unstored = errors("unstored", &text.replacen("@ (0, 1) = ", "@ (0, 1) += ", 1));
    assert!(unstored.contains("`C.acc` is read before any statement above stores to it"), "{unstored}");
    let wide = texc_schedules::text::parse(&text.replacen("amx_dpbusd 32x32x64", "amx_dpbusd 32x48x64", 1), {
        let mut sm = SourceMap::new();
        sm.add("wide.loops".to_string(), String::new())
    });
    let wide = wide.map(|p| texc_schedules::verify::verify(&p.func).map_err(|e| e.to_string()));
    assert!(matches!(&wide, Ok(Err(e)) if e.contains("at most 32 × 32")) || wide.is_err(), "{:?}", wide.map(|_| ()));
}

/// `prefetch T at OFFSET` reads back as written and is proven inside its
/// tensor like an access; LLVM's CPU targets compile it (a hint: the
/// outputs are the evaluator's, which runs it as the nothing it computes),
/// Cranelift refuses it with the reason.
#[test]
fn prefetches_round_trip_are_bounded_and_run_where_compiled() {
    let src = "func k []\n  input X: f32[67]\n  output Y: f32[67]\n  for i in 0..67:\n    prefetch X at min(i + 16, 66)\n    Y[i] = X[i] * 2.0f32\n";
    let mut sm = SourceMap::new();
    let id = sm.add("p.loops".to_string(), src.to_string());
    let parsed = texc_schedules::text::parse(src, id).unwrap_or_else(|d| panic!("{}", d.render(&sm)));
    assert_eq!(print(&round_trip("prefetch", &parsed.func)), src);
    let e = errors("unbounded", &src.replace("min(i + 16, 66)", "i + 16"));
    assert!(e.contains("cannot prove this prefetch of `X` in bounds: its element ranges over 16..=82"), "{e}");
    let e = errors("not_an_index", &src.replace("min(i + 16, 66)", "1.0f32"));
    assert!(e.contains("a prefetch's element offset must be an index"), "{e}");
    let e = errors("unknown", &src.replace("prefetch X", "prefetch Z"));
    assert!(e.contains("unknown tensor `Z`"), "{e}");

    let dir = texc_tests::scratch("prefetch");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("p.loops");
    std::fs::write(&path, src).expect("write");
    let mut rng = SplitMix64::new(3);
    let x: Vec<f32> = (0..67).map(|_| rng.next_f64() as f32 - 0.5).collect();
    let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    for target in ["interp", "x86-avx2", "x86-avx512"] {
        let t = texc_compiler::target::lookup(target).expect("target");
        if let Err(why) = t.check_runs_here() {
            eprintln!("skipped the run on {target}: {why}");
            continue;
        }
        let mut pl = texc_tests::pipeline(target);
        let lf = pl.load_loops(&path).unwrap_or_else(|e| panic!("{target}: {}", texc_tests::rendered(&pl, e)));
        let input = texc_runtime::Tensor { shape: vec![67], data: texc_runtime::Data::F32(x.clone()) };
        let args = vec![texc_compiler::interp::Arg::Tensor(input)];
        let got = match &lf.legal {
            Some(legal) => {
                assert!(print(legal).contains("prefetch X at"), "{target}: the prefetch is compiled");
                pl.compile(legal).expect("compiles").run(args).expect("runs")
            }
            None => texc_schedules::eval::run(&lf.lowered, args).expect("runs"),
        };
        assert!(matches!(&got[0].data, texc_runtime::Data::F32(y) if *y == want), "{target}: {:?}", got[0].data);
    }
    let mut pl = texc_tests::pipeline("cranelift");
    let e = pl.load_loops(&path).err().expect("cranelift refuses");
    let msg = texc_tests::rendered(&pl, e);
    assert!(msg.contains("takes no software prefetches") && msg.contains("p.loops:2:"), "{msg}");

    // A prefetch is scalar: refused inside a vectorized loop, with its place.
    let vector = "func k []\n  input X: f32[64]\n  output Y: f32[64]\n  for i in 0..64 vectorized:\n    \
                  prefetch X at i\n    Y[i] = X[i]\n";
    let path_v = dir.join("v.loops");
    std::fs::write(&path_v, vector).expect("write");
    let mut pl = texc_tests::pipeline("x86-avx2");
    let e = pl.load_loops(&path_v).err().expect("refused");
    let msg = texc_tests::rendered(&pl, e);
    assert!(msg.contains("cannot be inside a vectorized loop") && msg.contains("v.loops:2:"), "{msg}");
    // A temporary that is only prefetched is still a buffer of the function.
    let temp = src
        .replace("  output Y: f32[67]\n", "  output Y: f32[67]\n  temp T: f32[67]\n")
        .replace("prefetch X", "prefetch T");
    let path_t = dir.join("t.loops");
    std::fs::write(&path_t, &temp).expect("write");
    for target in ["x86-avx2", "interp"] {
        if texc_compiler::target::lookup(target).expect("target").check_runs_here().is_err() {
            continue;
        }
        let mut pl = texc_tests::pipeline(target);
        let lf = pl.load_loops(&path_t).unwrap_or_else(|e| panic!("{target}: {}", texc_tests::rendered(&pl, e)));
        let input = texc_runtime::Tensor { shape: vec![67], data: texc_runtime::Data::F32(x.clone()) };
        let args = vec![texc_compiler::interp::Arg::Tensor(input)];
        let got = match &lf.legal {
            Some(legal) => pl.compile(legal).expect("compiles").run(args).expect("runs"),
            None => texc_schedules::eval::run(&lf.lowered, args).expect("runs"),
        };
        assert!(matches!(&got[0].data, texc_runtime::Data::F32(y) if *y == want), "{target}: {:?}", got[0].data);
    }
    std::fs::remove_dir_all(&dir).ok();
}
