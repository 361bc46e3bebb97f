//! `.loops` files on the command line: a kernel's printed loop nest, edited
//! by hand, runs, is checked against the kernel its `source` line names, is
//! timed and compiled ahead of time; malformed ones are spanned errors.

#[path = "../../tests/src/scratch.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn texc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_texc")).args(args).current_dir(root()).output().expect("texc runs")
}

fn tmp(name: &str) -> PathBuf {
    let d = common::scratch("loops-cli");
    std::fs::create_dir_all(&d).expect("tmp");
    d.join(name)
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
}

/// The default x86-avx2 nest of a 13×7×19 matmul, with its vectorized loop
/// made serial and one loop unrolled, written to `name`.
fn edited_matmul(name: &str) -> PathBuf {
    let o =
        texc(&["emit", "examples/matmul.tex", "--stage", "loops", "--target", "x86-avx2", "--shape", "M=13,K=7,N=19"]);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(out.contains("  source \"examples/matmul.tex\"\n"), "{out}");
    let edited = out.replacen(" vectorized:", ":", 1).replacen("for ii in 0..13:", "for ii in 0..13 unrolled:", 1);
    assert_ne!(edited, out);
    let path = tmp(name);
    // The source line is relative to the workspace root, where texc runs.
    std::fs::write(&path, edited).expect("write");
    path
}

#[test]
fn an_edited_nest_runs_checks_benches_and_compiles() {
    let path = edited_matmul("mm.loops");
    let p = path.to_str().expect("utf-8");
    for target in ["interp", "x86-avx2", "cranelift"] {
        let args: Vec<&str> = if target == "interp" {
            vec!["run", p, "--target", target]
        } else {
            vec!["run", p, "--target", target, "--check"]
        };
        let o = texc(&args);
        let (out, e) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{target}: {e}");
        assert!(out.contains("ran `matmul`"), "{out}");
        if target != "interp" {
            assert!(out.contains("check `C` against interp"), "{out}");
        }
    }
    let o = texc(&["bench", p, "--target", "x86-avx2", "--repeat", "3", "--check"]);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(out.contains("bench `matmul`") && out.contains("check `C`"), "{out}");
    let so = tmp("mm.so");
    let o = texc(&["compile", p, "--target", "x86-avx2", "-o", so.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let header = std::fs::read_to_string(so.with_extension("h")).expect("header");
    assert!(header.contains("int texc_matmul_run("), "{header}");
}

#[test]
fn a_wrong_nest_is_caught_by_check() {
    // The nest reads one column of A only: it runs, and --check says it is wrong.
    let path = edited_matmul("wrong.loops");
    let t = std::fs::read_to_string(&path).expect("read");
    let wrong = t.replace("A[io * 13 + ii, ko * 4 + ki]", "A[io * 13 + ii, 0]");
    assert_ne!(wrong, t, "{t}");
    std::fs::write(&path, wrong).expect("write");
    let o = texc(&["run", path.to_str().expect("utf-8"), "--target", "x86-avx2", "--check"]);
    let (_, e) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("differs from the interpreter"), "{e}");
}

#[test]
fn malformed_nests_and_misuse_exit_1_and_2() {
    let path = edited_matmul("bad.loops");
    let t = std::fs::read_to_string(&path).expect("read");
    let bad = t.replace("A[io * 13 + ii, ko * 4 + ki]", "A[io * 13 + ii, ko * 4 + ki + 1]");
    assert_ne!(bad, t);
    std::fs::write(&path, bad).expect("write");
    let p = path.to_str().expect("utf-8");
    let o = texc(&["run", p, "--target", "x86-avx2"]);
    let (_, e) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("bad.loops:") && e.contains("cannot prove this read of `A` in bounds"), "{e}");
    let o = texc(&["run", p, "--target", "x86-avx2", "--shape", "M=3"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o).1);
    assert!(text(&o).1.contains("a .loops file names its kernel and sizes itself"));
}

/// An integer product's `@dot4` (emitted for an x86 target with VNNI) and
/// `@dot2` (without) in a `.loops` file run on Cranelift, which has no such
/// instruction, and with too few operands: spanned errors at the call,
/// exit 1, no panic.
#[test]
fn dot4_where_the_target_lacks_it_is_located() {
    let path = tmp("q.loops");
    let p = path.to_str().expect("utf-8");
    for (target, dot) in [("x86-avx2-vnni", "@dot4"), ("x86-avx2", "@dot2")] {
        let shape = "M=4,K=8,N=16";
        let o = texc(&["emit", "examples/qlinear.tex", "--target", target, "--stage", "loops", "--shape", shape]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        let nest = String::from_utf8(o.stdout).expect("utf-8");
        assert!(nest.contains(&format!("{dot}(0i32, ")), "{nest}");
        std::fs::write(&path, &nest).expect("write");
        let o = texc(&["run", p, "--target", "x86-avx2", "--check"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        let o = texc(&["run", p, "--target", "cranelift"]);
        let (_, e) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        let lacks = format!("`{dot}` is an instruction target `cranelift` does not have");
        assert!(e.contains("q.loops:") && e.contains(&lacks), "{e}");
        assert!(!e.contains("internal error"), "{e}");
        std::fs::write(&path, nest.replace(&format!("{dot}(0i32, "), &format!("{dot}("))).expect("write");
        let o = texc(&["run", p, "--target", "x86-avx2"]);
        let (_, e) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(e.contains("q.loops:") && e.contains(&format!("`{dot}` takes 3 arguments, not 2")), "{e}");
    }
}

/// `@dot2` and `@dot4sat` on arbitrary words — halves from −2¹⁵ to
/// 2¹⁵ − 1 and bytes whose pair sums saturate, not only what packing
/// makes — give the loop evaluator's results on every x86 target here, in
/// vectors no instruction width divides (13 lanes: padded) and one lane at
/// a time (the tail): the one sum that leaves `i32` (`2 · (−2¹⁵)²`)
/// wrapped as `vpmaddwd` wraps it, pair sums clamped as `vpmaddubsw`
/// clamps them.
#[test]
fn dot_instructions_on_any_words_match_the_evaluator() {
    use texc_runtime::{DType, Tensor};
    for dot in ["@dot2", "@dot4sat"] {
        let nest = "func q []\n  input A: i32[3, 29]\n  input B: i32[3, 29]\n  input C: i32[3, 29]\n  output D: i32[3, 29]\n\
                    \x20 for i in 0..3:\n    for j.o in 0..2:\n      for j.v in 0..13 vectorized:\n\
                    \x20       D[i, j.o * 13 + j.v] = DOT(C[i, j.o * 13 + j.v], A[i, j.o * 13 + j.v], B[i, j.o * 13 + j.v])\n\
                    \x20   for j in 26..29:\n      D[i, j] = DOT(C[i, j], A[i, j], B[i, j])\n";
        let path = tmp("dot.loops");
        std::fs::write(&path, nest.replace("DOT", dot)).expect("write");
        // Words spread over the whole i32 range (a multiplicative hash), the
        // first of A and B both `(-2^15, -2^15)`; in the second all bytes
        // of A 255 and of B 127 (pairs that saturate up), in the third B's -128.
        let words = |seed: u32, sat: [u32; 2]| -> Vec<f64> {
            (0..87u32)
                .map(|i| match i {
                    0 => f64::from(0x8000_8000u32 as i32),
                    1 | 2 => f64::from(sat[i as usize - 1] as i32),
                    _ => f64::from(i.wrapping_mul(seed) as i32),
                })
                .collect()
        };
        let mut args = vec!["run".to_string(), path.to_str().expect("utf-8").to_string()];
        let inputs = [
            ("A", 0x9e37_79b9u32, [0xffff_ffffu32, 0xffff_ffff]),
            ("B", 0x85eb_ca6b, [0x7f7f_7f7f, 0x8080_8080]),
            ("C", 0xc2b2_ae35, [0, 0]),
        ];
        for (name, seed, sat) in inputs {
            let file = tmp(&format!("dot_{name}.npy"));
            texc_runtime::write_npy(&file, &Tensor::from_f64(DType::I32, vec![3, 29], &words(seed, sat))).expect("npy");
            args.extend(["--input".to_string(), format!("{name}={}", file.display())]);
        }
        let run = |target: &str| {
            let out = tmp(&format!("dot_D_{target}.npy"));
            let mut a: Vec<String> = args.clone();
            a.extend(["--target".into(), target.into(), "--output".into(), format!("D={}", out.display())]);
            let o = texc(&a.iter().map(String::as_str).collect::<Vec<_>>());
            (o, out)
        };
        let (o, want) = run("interp");
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        let want = std::fs::read(want).expect("read");
        for target in ["x86-avx2", "x86-avx512", "x86-avx2-vnni"] {
            let (o, got) = run(target);
            let (_, e) = text(&o);
            if e.contains("this CPU lacks") {
                eprintln!("skipped {target}: {e}");
                continue;
            }
            assert_eq!(o.status.code(), Some(0), "{dot} on {target}: {e}");
            assert!(std::fs::read(got).expect("read") == want, "{dot} on {target}: not the evaluator's results");
        }
        // Cranelift has neither instruction: a spanned error at the call, exit 1, no panic.
        let (o, _) = run("cranelift");
        let (_, e) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{dot} on cranelift: {e}");
        let lacks = format!("`{dot}` is an instruction target `cranelift` does not have");
        assert!(e.contains("dot.loops:") && e.contains(&lacks) && !e.contains("internal error"), "{e}");
    }
}

/// A bf16 kernel on a backend without bf16 (Cranelift) is an error at the
/// tensor's declaration before code generation (for a `.tex` file and a
/// `.loops` file); the LLVM backends move and convert bf16, and refuse
/// arithmetic on it by name.
#[test]
fn unsupported_element_types_are_located() {
    let src = tmp("bf.tex");
    std::fs::write(&src, "kernel h(X: bf16[N = 8]) -> Y: bf16[N] {\n    Y[i] = X[i] * X[i];\n}\n").expect("write");
    let s = src.to_str().expect("utf-8");
    let o = texc(&["run", s, "--target", "cranelift"]);
    let (_, e) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("`X` is bf16") && e.contains("bf.tex:1:10"), "{e}");
    let o = texc(&["run", s, "--target", "x86-avx2"]);
    let (_, e) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("computes on bf16 values") && e.contains("f32(x)"), "{e}");
    let nest = "func h [N=8]\n  input X: bf16[8]\n  output Y: bf16[8]\n  for i in 0..8:\n    Y[i] = X[i] * X[i]\n";
    let path = tmp("bf.loops");
    std::fs::write(&path, nest).expect("write");
    let o = texc(&["run", path.to_str().expect("utf-8"), "--target", "cranelift"]);
    let (_, e) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("bf.loops:2:9"), "{e}");
}

#[test]
fn check_and_emit_read_loops_files() {
    let path = edited_matmul("emit.loops");
    let p = path.to_str().expect("utf-8");
    let o = texc(&["check", p]);
    let (out, e) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(
        out.contains("every access proven in bounds; it has the parameters of kernel `matmul` at [M=13, K=7, N=19]"),
        "{out}"
    );
    // The nest prints back as it was read, and compiles to assembly.
    let o = texc(&["emit", p, "--stage", "loops", "--target", "x86-avx2"]);
    assert_eq!(text(&o).0, std::fs::read_to_string(&path).expect("read"));
    let o = texc(&["emit", p, "--stage", "asm", "--target", "x86-avx2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    assert!(text(&o).0.contains("texc_matmul"));
    let o = texc(&["emit", p, "--stage", "tir", "--target", "x86-avx2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("already loop IR"), "{}", text(&o).1);
}

/// A convolution's bias (hoisted out of its reduction) and the activation
/// after it are applied to each register block of sums as it is stored:
/// one pass over the output, no temporary of sums, and the result matches
/// the interpreter. With `--knob acc=0` the sums are a temporary, zeroed by
/// a pass of its own, and the bias and activation one pass after them.
#[test]
fn a_convolutions_bias_and_activation_are_one_pass() {
    let src = "import std.nn;
kernel pw(X: f32[N = 1, C = 16, H = 112, W = 112], Wt: f32[K = 96, C, 1, 1], b: f32[K]) -> Y: f32[N, K, H, W] {
    y0 = conv2d_1x1_bias(X, Wt, b);
    Y = relu6(y0);
}";
    let path = tmp("pw.tex");
    std::fs::write(&path, src).expect("write");
    let file = path.to_str().expect("utf-8");
    let temps_and_passes = |knobs: &[&str]| {
        let o = texc(&[&["emit", file, "--stage", "loops", "--target", "x86-avx2"], knobs].concat());
        let (out, e) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{e}");
        let temps: Vec<String> =
            out.lines().filter(|l| l.trim_start().starts_with("temp ")).map(str::to_string).collect();
        let passes = out.lines().filter(|l| l.starts_with("  for ")).count();
        let locals = out.lines().filter(|l| l.trim_start().starts_with("local y0.r0.acc: f32[6, 16]")).count();
        (temps, passes, locals, out)
    };
    let (temps, passes, locals, out) = temps_and_passes(&[]);
    assert_eq!((temps.len(), passes, locals), (0, 1, 1), "one pass, the sums in a local block:\n{out}");
    assert!(out.contains("Y[0, k.b * 6 + k.r, n.h, w.o * 16 + w.v] = min(max(f32(y0.r0.acc[k.r, w.v] + b[k.b * 6 + k.r]), 0.0f32), 6.0f32)"), "{out}");
    let (temps, passes, locals, out) = temps_and_passes(&["--knob", "acc=0"]);
    assert_eq!(temps, vec!["  temp y0.r0: f32[1, 96, 112, 112]"], "no biased copy of the sums:\n{out}");
    assert_eq!((passes, locals), (3, 0), "zeroing, sums, then bias and relu6 in one pass:\n{out}");
    for knob in ["acc=1", "acc=0"] {
        let o = texc(&["run", file, "--target", "x86-avx2", "--check", "--knob", knob]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    }
}

/// Of two convolutions added together, the second's write-back applies the
/// bias, the sum and the activation (it is the last stage before them); the
/// first's sums are a temporary written in full — folding the epilogue into
/// the first would read the second's sums before they exist. Odd sizes
/// (blocks with tails), checked against the interpreter.
#[test]
fn an_epilogue_is_folded_only_where_what_it_reads_exists() {
    let src = "import std.nn;
kernel two(X: f32[N = 1, C = 5, H = 9, W = 19], A: f32[K = 13, C, 1, 1], B: f32[K, C, 1, 1], b: f32[K]) -> Y: f32[N, K, H, W] {
    y0 = conv2d_1x1(X, A);
    y1 = conv2d_1x1_bias(X, B, b);
    s[n, k, h, w] = y0[n, k, h, w] + y1[n, k, h, w];
    Y = relu(s);
}";
    let path = tmp("two.tex");
    std::fs::write(&path, src).expect("write");
    let file = path.to_str().expect("utf-8");
    for target in ["x86-avx2", "x86-avx512"] {
        let o = texc(&["emit", file, "--stage", "loops", "--target", target]);
        let (out, e) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{e}");
        let temps: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("temp ")).collect();
        assert_eq!(temps, vec!["  temp y0: f32[1, 13, 9, 19]"], "{out}");
        let stores_y = out.lines().filter(|l| l.trim_start().starts_with("Y[")).collect::<Vec<_>>();
        assert!(
            !stores_y.is_empty() && stores_y.iter().all(|l| l.contains("y1.r0.acc[") && l.contains("y0[")),
            "{out}"
        );
        if runs_here(target) {
            let o = texc(&["run", file, "--target", target, "--check"]);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        }
    }
}

/// Whether `target`'s code runs on this CPU; where not, says why the run is skipped.
fn runs_here(target: &str) -> bool {
    let t = texc_compiler::target::lookup(target).expect("a known target");
    t.check_runs_here().map_err(|e| eprintln!("skipped the run on {target}: {e}")).is_ok()
}

/// Issue 35, item 9: the nest of a kernel the e-graph rewrote (conv2d →
/// batch_norm → relu) names the file as written in its `source` line, not
/// `<rewritten>/F.tex`, so the printed `.loops` runs and is checked against
/// that kernel. Property: on every example that builds, the `source` line
/// of the printed nest names a file that exists.
#[test]
fn a_rewritten_kernels_nest_names_its_file() {
    for target in ["x86-avx2", "cranelift"] {
        let o = texc(&["emit", "examples/conv_bn_relu.tex", "--stage", "loops", "--target", target]);
        let (out, e) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{e}");
        assert!(out.contains("  source \"examples/conv_bn_relu.tex\"\n"), "{target}: {out}");
        let path = tmp(&format!("conv_bn_relu-{target}.loops"));
        std::fs::write(&path, &out).expect("write");
        let o = texc(&["run", path.to_str().expect("utf-8"), "--target", target, "--check"]);
        let (out, e) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{target}: {e}");
        assert!(out.contains("check `Y` against interp"), "{target}: {out}");
    }
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .expect("examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "tex"))
        .collect();
    examples.sort();
    let mut printed = 0;
    for ex in &examples {
        let name = format!("examples/{}", ex.file_name().expect("name").to_string_lossy());
        let o = texc(&["check", &name]);
        // `ok: 4 kernels checked: bn, ln, inorm, gn`
        let (out, _) = text(&o);
        let listed = out.lines().next().and_then(|l| l.split_once("checked: ")).map_or("", |(_, ks)| ks);
        let kernels: Vec<String> = listed.split(", ").filter(|k| !k.is_empty()).map(str::to_string).collect();
        assert!(!kernels.is_empty(), "{name}: {out}");
        for k in kernels {
            let o = texc(&["emit", &name, "--kernel", &k, "--stage", "loops", "--target", "x86-avx2"]);
            let (out, _) = text(&o);
            let Some(source) = out.lines().find_map(|l| l.trim().strip_prefix("source ")) else { continue };
            let file = source.trim_matches('"');
            assert!(root().join(file).is_file(), "{name} --kernel {k}: source {source} is no file");
            printed += 1;
        }
    }
    assert!(printed >= 10, "only {printed} nests printed");
}
