//! Regression tests for issue 13 (hostile and extreme inputs): memory
//! budgets and allocation failure, compile blow-ups (deep nesting, long
//! element-wise chains, thousands of kernels), range extents near the i64
//! limits, atomic `.npy` writes, f16/bf16 sums, i32 reductions of index
//! terms, `gelu` in the tail, and CR line endings. The command-line side
//! (exit statuses, argument checks) is in `texc/tests/robust_cli.rs`.
//!
//! Wall-clock limits here only guard against hangs (each case used to take
//! minutes or never end); they are not performance assertions.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;
use texc_compiler::interp::{self, Arg};
use texc_compiler::target::Target;
use texc_compiler::Bindings;
use texc_runtime::{AlignedBuf, DType, SplitMix64, Tensor};
use texc_tests::rel_error;

/// Run `f` on its own thread; fail the test if it has not finished after
/// `secs` (the thread is left behind, but the test reports instead of hanging).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawns");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("sent nothing and did not panic"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: not finished after {secs} s (a hang?)"),
    }
}

/// Compiled targets that run on this machine.
fn compiled_targets() -> Vec<&'static Target> {
    let (run, skipped) = texc_tests::runnable_targets();
    for why in skipped {
        eprintln!("skipped: {why}");
    }
    run
}

/// Every runnable compiled target by name, and `interp`.
fn all_target_names() -> Vec<&'static str> {
    std::iter::once("interp").chain(compiled_targets().into_iter().map(|t| t.name)).collect()
}

/// The only kernel of `src`, specialized with `shapes`, run on `target`
/// (the interpreter, or the pipeline's loop nests compiled) with `args`.
fn run_on(target: &str, src: &str, shapes: &[(&str, i64)], args: &dyn Fn() -> Vec<Arg>) -> Vec<Tensor> {
    try_run_on(target, src, shapes, args).unwrap_or_else(|e| panic!("{target}: {e}"))
}

/// [`run_on`], with code generation's error (a type a backend lacks) returned.
fn try_run_on(
    target: &str,
    src: &str,
    shapes: &[(&str, i64)],
    args: &dyn Fn() -> Vec<Arg>,
) -> Result<Vec<Tensor>, String> {
    let (mut pl, k) = texc_tests::load_text(target, "case.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
    let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
    let p = texc_tests::specialize(&mut pl, k, &b);
    if target == "interp" {
        return Ok(interp::run(&p, args()).expect("interp runs"));
    }
    let t = texc_compiler::target::lookup(target).expect("a target");
    let f = texc_tests::loops(&mut pl, k, &p);
    Ok(texc_tests::compile_loops(t, &f)?.run(args()).expect("runs"))
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = texc_tests::scratch("limits").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

// ---- 1. memory -------------------------------------------------------------

const ADD: &str = "kernel add(A: f32[N], B: f32[N]) -> C: f32[N] { C[i] = A[i] + B[i]; }";

/// A run whose buffers exceed the budget is refused by `prepare`, before
/// anything is allocated, on the interpreter and on compiled targets.
#[test]
fn runs_beyond_the_memory_budget_are_refused_before_allocating() {
    for target in all_target_names() {
        // 2^35 elements: hundreds of GiB, beyond any machine's budget.
        let (mut pl, k) = texc_tests::load_text(target, "add.tex", ADD, None).expect("loads");
        let b = Bindings { shapes: vec![("N".into(), 1 << 35)], ..Bindings::default() };
        let e = pl.prepare(k, &b, HashMap::new(), &[], 0, false).err().expect("refused");
        let msg = texc_tests::rendered(&pl, e);
        assert!(msg.contains("this run needs about") && msg.contains("of memory"), "{target}: {msg}");
        // A moderate size under a 1 MiB limit.
        let (mut pl, k) = texc_tests::load_text(target, "add.tex", ADD, None).expect("loads");
        pl.options.max_memory = Some(1 << 20);
        let b = Bindings { shapes: vec![("N".into(), 1 << 20)], ..Bindings::default() };
        let e = pl.prepare(k, &b, HashMap::new(), &[], 0, false).err().expect("refused");
        let msg = texc_tests::rendered(&pl, e);
        assert!(msg.contains("more than the limit given by --max-memory (1.0 MiB)"), "{target}: {msg}");
        // The same size fits a larger limit.
        pl.options.max_memory = Some(1 << 30);
        pl.prepare(k, &b, HashMap::new(), &[], 0, false)
            .unwrap_or_else(|e| panic!("{target}: {}", texc_tests::rendered(&pl, e)));
    }
}

/// Allocation failure is an error, never an abort.
#[test]
fn absurd_allocations_are_errors() {
    assert!(AlignedBuf::zeroed(DType::F32, vec![usize::MAX, 2]).is_err(), "overflowing shape");
    assert!(AlignedBuf::zeroed(DType::F64, vec![1 << 20, 1 << 20, 1 << 20]).is_err(), "overflowing bytes");
    // 2^62 bytes: a valid layout that no machine can back.
    assert!(AlignedBuf::zeroed(DType::F32, vec![1 << 60]).is_err(), "4 EiB");
    let big = Tensor::from_f64(DType::F32, vec![2], &[1.0, 2.0]);
    assert_eq!(AlignedBuf::from_tensor(&big).expect("small").len(), 2);
    let mut rng = SplitMix64::new(1);
    for dtype in [DType::F16, DType::F32, DType::F64, DType::I8, DType::I32, DType::Bool] {
        assert!(Tensor::random(dtype, vec![1 << 61], &mut rng).is_err(), "{dtype:?}: 2^61 elements");
        assert!(Tensor::random(dtype, vec![usize::MAX, 3], &mut rng).is_err(), "{dtype:?}: overflowing shape");
    }
    assert_eq!(Tensor::random(DType::F32, vec![3, 5], &mut rng).expect("small").len(), 15);
}

/// A `.npy` header that promises more data than the file holds, or more
/// than the budget, is an error found before the data is read.
#[test]
fn npy_reads_are_bounded_by_the_header_and_the_budget() {
    let dir = temp_dir("npy");
    let path = dir.join("a.npy");
    let t = Tensor::from_f64(DType::F32, vec![1000], &[0.5; 1000]);
    texc_runtime::write_npy(&path, &t).expect("writes");
    assert_eq!(texc_runtime::read_npy_limited(&path, 4000).expect("fits exactly"), t);
    let e = texc_runtime::read_npy_limited(&path, 3999).expect_err("over the budget");
    assert!(e.to_string().contains("exceed the memory available"), "{e}");
    // Cut the data short: the header still promises 4000 bytes.
    let bytes = std::fs::read(&path).expect("reads");
    let short = dir.join("short.npy");
    std::fs::write(&short, &bytes[..bytes.len() - 100]).expect("writes");
    let e = texc_runtime::read_npy_limited(&short, u64::MAX).expect_err("truncated");
    assert!(e.to_string().contains("the header promises 4000 bytes of data but the file is only"), "{e}");
    // A header promising 2^40 elements in a file of a hundred bytes.
    let huge = dir.join("huge.npy");
    std::fs::write(&huge, npy_header("<f4", 1 << 40)).expect("writes");
    let e = texc_runtime::read_npy_limited(&huge, 1 << 30).expect_err("over the budget");
    assert!(e.to_string().contains("exceed the memory available"), "{e}");
    let e = texc_runtime::read_npy_limited(&huge, u64::MAX).expect_err("no data");
    assert!(e.to_string().contains("promises"), "{e}");
    // An endless file is not read to its end.
    let e = within(20, "/dev/zero", || texc_runtime::read_npy_limited(std::path::Path::new("/dev/zero"), 1 << 30))
        .expect_err("not a .npy file");
    assert!(e.to_string().contains("magic"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A version-1 `.npy` header for a 1-d array of `n` elements of `descr`.
fn npy_header(descr: &str, n: u64) -> Vec<u8> {
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({n},), }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((dict.len() as u16).to_le_bytes());
    out.extend(dict.as_bytes());
    out
}

/// A stream that never ends (a FIFO fed with zeros forever): the reader
/// takes exactly the bytes the header promises, or refuses the header.
#[test]
fn endless_npy_streams_are_read_only_as_far_as_the_header_says() {
    let dir = temp_dir("fifo");
    for (n, ok) in [(4u64, true), (1 << 40, false)] {
        let fifo = dir.join(format!("s{n}.npy"));
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mkfifo is not available");
            return;
        }
        let header = npy_header("<f4", n);
        let writer_path = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let Ok(mut w) = std::fs::OpenOptions::new().write(true).open(&writer_path) else { return };
            if w.write_all(&header).is_err() {
                return;
            }
            let zeros = vec![0u8; 1 << 16];
            // Until the reader goes away (EPIPE: Rust ignores SIGPIPE).
            while w.write_all(&zeros).is_ok() {}
        });
        let r = within(20, "endless .npy stream", move || texc_runtime::read_npy_limited(&fifo, 1 << 30));
        match r {
            Ok(t) => {
                assert!(ok, "2^40 elements accepted");
                assert_eq!(t, Tensor::from_f64(DType::F32, vec![4], &[0.0; 4]));
            }
            Err(e) => {
                assert!(!ok, "4 elements refused: {e}");
                assert!(e.to_string().contains("exceed the memory available"), "{e}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 2. compile blow-ups ------------------------------------------------------

const ELEMENTWISE: [&str; 6] = ["relu", "sigmoid", "tanh", "gelu", "silu", "relu6"];

/// `relu(sigmoid(tanh(gelu(silu(relu6(…X…))))))` nested 200 deep: overload
/// resolution used to classify every argument again for every enclosing
/// call (60 deep took 19 s, 200 deep never ended).
#[test]
fn std_calls_nested_200_deep_check_and_compile() {
    let mut e = String::from("X");
    for i in 0..200 {
        e = format!("{}({e})", ELEMENTWISE[i % 6]);
    }
    let src = format!("import std.nn;\nkernel deep(X: f32[N = 37]) -> Y: f32[N] {{ Y = {e}; }}\n");
    within(20, "200 nested calls", move || {
        texc_tests::check_text("deep.tex", &src).unwrap_or_else(|e| panic!("{e}"));
        agree_with_interp("deep", &src, &[]);
    });
}

/// `T1 = gelu(X); T2 = silu(T1); …`: `n` element-wise statements.
fn chain_source(n: usize) -> String {
    let mut src = String::from("import std.nn;\nkernel chain(X: f32[N = 37]) -> Y: f32[N] {\n");
    let mut prev = "X".to_string();
    for i in 0..n {
        let t = if i + 1 == n { "Y".to_string() } else { format!("T{}", i + 1) };
        src.push_str(&format!("    {t} = {}({prev});\n", ELEMENTWISE[(i + 3) % 6]));
        prev = t;
    }
    src + "}\n"
}

/// The only kernel of `src` on `x86-avx2` and `cranelift` (where they run) against the interpreter.
fn agree_with_interp(name: &str, src: &str, shapes: &[(&str, i64)]) {
    let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
    for t in compiled_targets().into_iter().filter(|t| ["x86-avx2", "cranelift"].contains(&t.name)) {
        let (mut pl, k) = texc_tests::load_text(t.name, &format!("{name}.tex"), src, None).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &b);
        let args = || interp::bind_args(&p, HashMap::new(), &[], 7).expect("binds");
        let want = interp::run(&p, args()).expect("interp");
        let f = texc_tests::loops(&mut pl, k, &p);
        let got = texc_tests::compile_loops(t, &f).unwrap_or_else(|e| panic!("{name} on {t}: {e}"));
        let got = got.run(args()).expect("runs");
        for (w, g) in want.iter().zip(&got) {
            let tol = if w.dtype().is_float() { 1e-5 } else { 0.0 };
            let err = rel_error(g, w);
            assert!(err <= tol, "{name} on {t}: relative error {err:e}");
        }
    }
}

/// Code generation's work for the chain grows linearly with its length:
/// inlining producers that are read twice (gelu, silu) used to copy
/// expression trees, k^depth (50 deep: over a minute; 200 deep: 6.4 GB).
#[test]
fn element_wise_chains_compile_in_linear_size_and_agree() {
    within(20, "a chain of 200 statements", || {
        let size = |n: usize| {
            let (mut pl, k) = texc_tests::load_text("x86-avx2", "chain.tex", &chain_source(n), None).expect("loads");
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            texc_schedules::ir::emitted_size(&texc_tests::loops(&mut pl, k, &p))
        };
        let sizes: Vec<(usize, u64)> = [25, 50, 100, 200].into_iter().map(|n| (n, size(n))).collect();
        let per = |(n, s): (usize, u64)| s as f64 / n as f64;
        for w in sizes.windows(2) {
            assert!(
                per(w[1]) <= 1.5 * per(w[0]),
                "emitted size grows faster than the chain: {sizes:?} (chain length, expression nodes)"
            );
        }
        agree_with_interp("chain", &chain_source(200), &[]);
    });
}

/// A file of thousands of small kernels, and a chain of thousands of
/// definitions, check in (near-)linear time: duplicate signatures and
/// schedule lookups used to scan every kernel for every kernel
/// (32 000 kernels: over a minute).
#[test]
fn thousands_of_kernels_check_quickly() {
    within(20, "32 000 kernels", || {
        let mut src = String::new();
        for i in 0..32_000 {
            src.push_str(&format!("kernel k{i}(A: f32[N = 4]) -> B: f32[N] {{ B[i] = A[i] * 2.0 + {i}.0; }}\n"));
        }
        src.push_str("schedule k31999 for x86-avx2 { parallel B.i; }\n");
        texc_tests::check_text("many.tex", &src).unwrap_or_else(|e| panic!("{}", &e[..e.len().min(2000)]));
    });
    within(20, "5 000 chained definitions", || {
        let mut src = String::from("kernel k0(A: f32[N]) -> B: f32[N] { B[i] = A[i] * 2.0; }\n");
        for i in 1..5000 {
            src.push_str(&format!(
                "kernel k{i}(A: f32[N]) -> B: f32[N] {{ T = k{p}(A); B[i] = T[i] + 1.0; }}\n",
                p = i - 1
            ));
        }
        let (mut pl, k) = texc_tests::load_text("interp", "defs.tex", &src, Some("k4999")).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &Bindings { shapes: vec![("N".into(), 3)], ..Bindings::default() });
        let x = Tensor::from_f64(DType::F32, vec![3], &[0.0, 0.0, 0.0]);
        let y = interp::run(&p, vec![Arg::Tensor(x)]).expect("runs");
        assert_eq!(y[0].to_f64(), vec![4999.0; 3]);
    });
}

// ---- 3. ranges ----------------------------------------------------------------

/// Reduction ranges whose length is huge, or whose `hi − lo` overflows,
/// are spanned errors: they used to run forever or silently give 0.
#[test]
fn extreme_ranges_are_spanned_errors() {
    let cases = [
        ("sum[k in 5..-9223372036854775807](A[i])", "overflow"),
        ("sum[k in -9223372036854775000..9223372036854775000](1.0)", "overflow"),
        ("max[k in -9223372036854775000..9223372036854775000](1.0)", "overflow"),
        ("sum[k in -9223372036854775000..0](1.0)", "more than 68719476736 values"),
        ("sum[k in 0..9223372036854775807](A[i])", "more than 68719476736 values"),
    ];
    for (expr, want) in cases {
        let src = format!("kernel r(A: f32[N = 3]) -> Y: f32[N] {{\n    Y[i] = {expr};\n}}\n");
        let err = within(20, expr, move || texc_tests::check_text("range.tex", &src)).expect_err(expr);
        assert!(err.contains("range.tex:2:"), "{expr}: no location in\n{err}");
        assert!(err.contains(want), "{expr}: no `{want}` in\n{err}");
    }
    // Empty ranges whose length does not overflow give the identity.
    let src = "kernel r(A: f32[N = 3]) -> Y: f32[N] { Y[i] = sum[k in 0..-9223372036854775807](A[i]) + 1.0; }";
    texc_tests::check_text("range.tex", src).expect("an empty range");
}

/// Random range bounds near the i64 limits (and at ±2^36, the longest
/// range): specialization never panics or hangs, accepts exactly the ranges
/// whose length `hi − lo` fits i64 and is at most 2^36, and the accepted
/// short ones sum to their length.
#[test]
fn random_extents_near_the_i64_limits() {
    const CAP: i128 = 1 << 36;
    let anchors: [i128; 9] =
        [i64::MIN as i128, -(1 << 36), -(1 << 62), 0, 1 << 36, 1 << 62, i64::MAX as i128, -(1 << 40), 1 << 40];
    let mut rng = SplitMix64::new(13);
    let draw = |rng: &mut SplitMix64| -> i128 {
        let a = anchors[(rng.next_u64() % anchors.len() as u64) as usize];
        a + (rng.next_u64() % 9) as i128 - 4
    };
    // The edges themselves, then random pairs near them.
    let (min, max) = (i64::MIN as i128, i64::MAX as i128);
    let mut cases = vec![
        (0, CAP),
        (0, CAP + 1),
        (-CAP, 0),
        (-CAP - 1, 0),
        (max - CAP, max),
        (min + 1, min + 1 + CAP),
        (max, min + 1),
        (min + 1, max),
        (max - 1, max),
        (min + 1, min + 2),
        (0, min + 1),
        (1, min + 1),
    ];
    for _ in 0..120 {
        let lo = draw(&mut rng);
        let hi = if rng.next_u64() & 1 == 0 { lo + (rng.next_u64() % 11) as i128 - 3 } else { draw(&mut rng) };
        cases.push((lo, hi));
    }
    within(60, "random extents", move || {
        let lit = |v: i128| if v < 0 { format!("({v})") } else { v.to_string() };
        for (lo, hi) in cases {
            let src = format!(
                "kernel r(A: f32[N = 2]) -> Y: f32[N] {{ Y[i] = sum[k in {}..{}](1.0) + A[i] * 0.0; }}",
                lit(lo),
                lit(hi)
            );
            let fits = |v: i128| i64::MIN as i128 <= v && v <= i64::MAX as i128;
            // Literals are i64 magnitudes: `-9223372036854775808` is `-(2^63)`, whose 2^63 overflows.
            let literal_ok = |v: i128| fits(v.abs());
            let expect_ok = literal_ok(lo) && literal_ok(hi) && fits(hi - lo) && hi - lo <= CAP;
            let got = std::panic::catch_unwind(|| {
                let (mut pl, k) = texc_tests::load_text("interp", "r.tex", &src, None)?;
                pl.specialize(k, &Bindings::default()).map_err(|e| texc_tests::rendered(&pl, e))
            });
            let got = got.unwrap_or_else(|_| panic!("panicked on {src}"));
            match got {
                Ok(p) => {
                    assert!(expect_ok, "accepted: {src}");
                    let n = (hi - lo).max(0);
                    if n <= 1000 {
                        let x = Tensor::from_f64(DType::F32, vec![2], &[0.0, 0.0]);
                        let y = interp::run(&p, vec![Arg::Tensor(x)]).expect("runs");
                        assert_eq!(y[0].to_f64(), vec![n as f64; 2], "{src}");
                    }
                }
                Err(e) => {
                    assert!(!expect_ok, "refused: {src}\n{e}");
                    assert!(e.contains("r.tex:1:"), "no location: {src}\n{e}");
                }
            }
        }
    });
}

/// Short ranges at the very top and bottom of i64 compile and agree.
#[test]
fn short_ranges_at_the_i64_limits_agree_on_every_target() {
    let src = "kernel r(A: f32[N = 5]) -> (Y: f32[N], Z: i64[N]) {
    Y[i] = sum[k in 9223372036854775800..9223372036854775807](A[i]) + sum[k in (-9223372036854775807)..(-9223372036854775805)](1.0);
    Z[i] = max[k in 9223372036854775800..9223372036854775807](k) - 9223372036854775800 + min[k in (-9223372036854775807)..(-9223372036854775805)](k) + 9223372036854775807;
}";
    within(30, "short ranges at the limits", move || {
        for t in all_target_names() {
            let x = Tensor::from_f64(DType::F32, vec![5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
            let out = run_on(t, src, &[], &|| vec![Arg::Tensor(x.clone())]);
            assert_eq!(out[0].to_f64(), vec![9.0, 16.0, 23.0, 30.0, 37.0], "{t}");
            assert_eq!(out[1].to_i64(), Some(vec![6; 5]), "{t}");
        }
    });
}

/// Several reductions in one statement (found with the ranges above):
/// each hoisted reduction used to loop over the variables of all the
/// others as well (`sum[d](A[i, d]) + sum[e](A[i, e] * A[i, e])` came out
/// 4 times too large on compiled targets).
#[test]
fn several_reductions_in_one_statement_agree() {
    let src = "kernel several(A: f32[N = 5, D = 4]) -> (Y: f32[N], Z: f32[N], W: f32[N], V: f32[N]) {
    Y[i] = sum[d](A[i, d]) + sum[e in 0..D](A[i, e] * A[i, e]);
    Z[i] = sum[k in 0..3](A[i, 0] * sum[j in 0..2](A[i, j]));
    W[i] = sum[k in 0..3](A[i, k]) / 3.0 + max[j in 0..2](A[i, j]) - min[d](A[i, d]);
    V[i] = sum[k in 0..2](sum[j in 0..3](A[i, j] * f32(k)) + max[d](A[i, d]));
}";
    agree_with_interp("several", src, &[]);
}

// ---- 5. concurrent writers -------------------------------------------------------

/// Several writers of one `.npy` path (and a reader meanwhile): every read
/// sees one writer's complete file, the last one left is complete, and no
/// temporary file stays behind. `File::create` and writing in place used to
/// leave files mixing several writers' data.
#[test]
fn concurrent_npy_writers_leave_one_whole_file() {
    const WRITERS: usize = 4;
    const LEN: usize = 1 << 18;
    let dir = temp_dir("writers");
    let path = dir.join("out.npy");
    let data: Vec<Tensor> =
        (0..WRITERS).map(|w| Tensor::from_f64(DType::F32, vec![LEN], &vec![w as f64 + 1.0; LEN])).collect();
    texc_runtime::write_npy(&path, &data[0]).expect("first write");
    let whole = |t: &Tensor| data.iter().any(|d| d == t);
    for round in 0..3 {
        let barrier = std::sync::Barrier::new(WRITERS + 1);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                barrier.wait();
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = texc_runtime::read_npy(&path).unwrap_or_else(|e| panic!("round {round}: torn read: {e}"));
                    assert!(whole(&t), "round {round}: a read mixes writers' data");
                    reads += 1;
                }
                reads
            });
            let writers: Vec<_> = data
                .iter()
                .map(|d| {
                    s.spawn(|| {
                        barrier.wait();
                        for _ in 0..2 {
                            texc_runtime::write_npy(&path, d).expect("writes");
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().expect("writer");
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().expect("reader");
        });
        let t = texc_runtime::read_npy(&path).expect("a whole file");
        assert!(whole(&t), "round {round}: the file mixes writers' data");
    }
    let left: Vec<String> =
        std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
    assert_eq!(left, vec!["out.npy".to_string()], "temporary files left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 7. half-precision sums --------------------------------------------------------

/// A sum of f16 values 60000 (32 times), −60000 (32 times) and 1: a running
/// f16 sum overflows to inf at 120000 (x86 used to give inf, the
/// interpreter 1). Sums accumulate in f32 on every target: exactly 1.
/// Likewise a bf16 sum of 256 and sixteen 1s is 272 (a running bf16 sum stays 256).
#[test]
fn half_precision_sums_agree_on_every_target() {
    let mut v = vec![60000.0; 32];
    v.extend([-60000.0; 32]);
    v.push(1.0);
    let x = Tensor::from_f64(DType::F16, vec![65], &v);
    let mut w = vec![256.0];
    w.extend([1.0; 16]);
    let xb = Tensor::from_f64(DType::BF16, vec![17], &w);
    for t in all_target_names() {
        let y = run_on(t, "kernel hs(X: f16[N]) -> Y: f16 { Y = sum[n](X[n]); }", &[("N", 65)], &|| {
            vec![Arg::Tensor(x.clone())]
        });
        assert_eq!(y[0].to_f64(), vec![1.0], "f16 sum on {t}");
        let y = run_on(
            t,
            "kernel hs(X: f16[N, M]) -> Y: f16[M] { Y[m] = sum[n](X[n, m]); }",
            &[("N", 65), ("M", 1)],
            &|| vec![Arg::Tensor(Tensor::from_f64(DType::F16, vec![65, 1], &v))],
        );
        assert_eq!(y[0].to_f64(), vec![1.0], "f16 column sum on {t}");
        let y = try_run_on(t, "kernel bs(X: bf16[N]) -> Y: bf16 { Y = sum[n](X[n]); }", &[("N", 17)], &|| {
            vec![Arg::Tensor(xb.clone())]
        });
        match y {
            Ok(y) => assert_eq!(y[0].to_f64(), vec![272.0], "bf16 sum on {t}"),
            Err(e) if e.contains("not support") => eprintln!("skipped bf16 on {t}: {e}"),
            Err(e) => panic!("bf16 sum on {t}: {e}"),
        }
    }
}

/// bf16 conversions on every target that has them (the LLVM ones; Cranelift
/// refuses bf16 by name): f32 to bf16 rounds to nearest, ties to even, as
/// the interpreter does (1 + 2⁻⁸ to 1, 1 + 3·2⁻⁸ to 1 + 2⁻⁶), keeps signed
/// zeros, infinities and NaN, and overflows to infinity; bf16 to f32 is
/// exact. Scalar and vector code (a row of 17 elements).
#[test]
fn bf16_conversions_round_to_nearest_even_on_every_target() {
    let mut v: Vec<f64> = vec![1.0, 1.00390625, 1.01171875, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 3.4e38];
    v.extend([1e-40, -2.5, 0.1, 65504.0, 1.0e-3, -7.75, 3.0e38, 1.5, 2.0f64.powi(-130)]);
    let x = Tensor::from_f64(DType::F32, vec![v.len()], &v);
    let src = "kernel c(X: f32[N]) -> (Y: bf16[N], Z: f32[N]) {\n    Y[i] = bf16(X[i]);\n    \
               Z[i] = f32(bf16(X[i] * 3.0)) + 1.0;\n}\n";
    let want = run_on("interp", src, &[("N", v.len() as i64)], &|| vec![Arg::Tensor(x.clone())]);
    let same =
        |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
    assert_eq!(want[0].to_f64()[..3], [1.0, 1.0, 1.015625]);
    for t in all_target_names() {
        match try_run_on(t, src, &[("N", v.len() as i64)], &|| vec![Arg::Tensor(x.clone())]) {
            Ok(got) => {
                for (g, w) in got.iter().zip(&want) {
                    assert!(same(&g.to_f64(), &w.to_f64()), "{t}: {:?} against {:?}", g.to_f64(), w.to_f64());
                }
            }
            Err(e) if t == "cranelift" && e.contains("not support bf16") => eprintln!("skipped bf16 on {t}: {e}"),
            Err(e) => panic!("bf16 on {t}: {e}"),
        }
    }
}

// ---- 9. i32 reductions of index terms ----------------------------------------------

/// i32 reductions whose body reads no tensor (`sum[r in 0..3](1)`, the
/// count of a window's taps) used to hang scheduling (`emit --stage loops`)
/// and compilation for x86: hoisting wrapped the reduction in a cast and
/// hoisted it again, forever.
#[test]
fn i32_reductions_of_index_terms_compile_and_agree() {
    let bodies = [
        "sum[r in 0..3](1)",
        "sum[r in 0..3](h)",
        "sum[r in 0..3](r)",
        "max[r in 0..3](r)",
        "min[r in 0..3](h - r)",
        "sum[r in 0..3](select(h + r >= 1 && h + r <= H, 1, 0))",
    ];
    for ty in ["i32", "i8", "i64"] {
        for body in bodies {
            let src = format!("kernel case(X: f32[H]) -> Y: {ty}[H] {{ Y[h] = {body}; }}");
            let what = format!("{ty}: {body}");
            within(20, &what.clone(), move || {
                let x = Tensor::from_f64(DType::F32, vec![7], &[0.0; 7]);
                let args = || vec![Arg::Tensor(x.clone())];
                let want = run_on("interp", &src, &[("H", 7)], &args);
                for t in compiled_targets() {
                    let (mut pl, k) = texc_tests::load_text(t.name, "case.tex", &src, None).expect("loads");
                    let b = Bindings { shapes: vec![("H".into(), 7)], ..Bindings::default() };
                    let p = texc_tests::specialize(&mut pl, k, &b);
                    let f = texc_tests::loops(&mut pl, k, &p);
                    assert!(!texc_schedules::ir::print(&f).is_empty());
                    let got = texc_tests::compile_loops(t, &f).expect("compiles").run(args()).expect("runs");
                    assert_eq!(got, want, "{what} on {t}");
                }
            });
        }
    }
}

// ---- 10. gelu in the tail ----------------------------------------------------------

/// Distance in units in the last place between two f32 values.
fn ulps(a: f32, b: f32) -> u64 {
    let key = |x: f32| {
        let b = x.to_bits() as i64;
        if b & 0x8000_0000 != 0 {
            -(b & 0x7fff_ffff)
        } else {
            b
        }
    };
    (key(a) - key(b)).unsigned_abs()
}

/// `erfc` in f64 (libm's, through the interpreter's math table).
fn erfc(x: f64) -> f64 {
    use texc_compiler::{ops::MathFn, semantics, tir::Ty, types::ElemType};
    semantics::math(MathFn::Erfc, Ty::Elem(ElemType::F64), &[semantics::V::F(x)]).f()
}

/// std `gelu` stays within 4 ulps of `0.5·x·erfc(−x/√2)` over [−10, 10] on
/// every target. `0.5·x·(1 + erf(x/√2))` cancels in f32 for negative x:
/// gelu(−5.4944735) was −1.637e-7 against −1.0766e-7.
#[test]
fn gelu_is_accurate_in_the_tail() {
    let mut xs: Vec<f32> = (0..=2000).map(|i| -10.0 + i as f32 * 0.01).collect();
    xs.extend([-5.4944735, -9.999, -7.77, -3.3333, -0.0, 0.0, 1e-30, -1e-30, 1e-6, -1e-6]);
    let mut rng = SplitMix64::new(10);
    while xs.len() < 2100 {
        xs.push((rng.next_f64() * 20.0 - 10.0) as f32);
    }
    let n = xs.len();
    let exact: Vec<f32> =
        xs.iter().map(|&x| (0.5 * x as f64 * erfc(-(x as f64) / std::f64::consts::SQRT_2)) as f32).collect();
    let x = Tensor::from_f64(DType::F32, vec![n], &xs.iter().map(|&v| v as f64).collect::<Vec<_>>());
    let src = "import std.nn;\nkernel g(X: f32[N]) -> Y: f32[N] { Y = gelu(X); }";
    for t in all_target_names() {
        let y = run_on(t, src, &[("N", n as i64)], &|| vec![Arg::Tensor(x.clone())]);
        let y = y[0].to_f64();
        for ((&x, &e), &g) in xs.iter().zip(&exact).zip(&y) {
            let d = ulps(g as f32, e);
            assert!(d <= 4, "gelu({x:e}) = {g:e} on {t}, exactly {e:e}: {d} ulps");
        }
    }
}

// ---- 11. line endings --------------------------------------------------------------

/// CR-only line endings (old Mac files) end lines: the file is not one long
/// comment, and errors name the right line (and column).
#[test]
fn cr_line_endings_end_lines() {
    let lines = [
        "# two kernels",
        "kernel a(A: f32[N = 4]) -> B: f32[N] { B[i] = A[i]; }",
        "kernel f(A: f32[N = 4]) -> B: f32[N] { B[i] = A[i + 1]; }",
    ];
    for eol in ["\r", "\r\n", "\n"] {
        let good = format!("{}{eol}{}{eol}", lines[0], lines[1]);
        texc_tests::check_text("cr.tex", &good).unwrap_or_else(|e| panic!("{eol:?}: {e}"));
        texc_tests::load_text("interp", "cr.tex", &good, Some("a")).expect("kernel `a` defined");
        let bad = lines.join(eol) + eol;
        let err = texc_tests::check_text("cr.tex", &bad).expect_err("out of bounds");
        assert!(err.contains("cr.tex:3:49"), "{eol:?}: expected line 3, column 49:\n{err}");
        assert!(err.contains(lines[2]), "{eol:?}: the source line is shown:\n{err}");
    }
}
