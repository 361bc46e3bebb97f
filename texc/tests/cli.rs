//! The `texc` binary: exit statuses, spanned errors, .npy round trips.

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
    let d = common::scratch("cli");
    std::fs::create_dir_all(&d).expect("tmp");
    d.join(name)
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn runs_an_example_and_writes_outputs() {
    let out = tmp("c.npy");
    let o = texc(&["run", "examples/matmul.tex", "--shape", "M=5,N=7", "--output", &format!("C={}", out.display())]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let c = texc_runtime::read_npy(&out).expect("output written");
    assert_eq!(c.shape, vec![5, 7]);
    // Feed it back as an input of a kernel with matching shapes.
    let o = texc(&["run", "examples/softmax.tex", "--input", &format!("X={}", out.display())]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("N=5, D=7"));
}

#[test]
fn emit_is_byte_identical_across_runs() {
    for stage in ["ast", "tir", "loops", "graph", "egraph"] {
        let args = [
            "emit",
            "examples/conv_bn_relu.tex",
            "--stage",
            stage,
            "--target",
            if stage == "loops" { "x86-avx2" } else { "interp" },
        ];
        let a = texc(&args);
        let b = texc(&args);
        assert_eq!(a.status.code(), Some(0), "{}", err(&a));
        assert_eq!(a.stdout, b.stdout);
    }
}

#[test]
fn user_errors_exit_1_with_a_location() {
    let bad = tmp("bad.tex");
    std::fs::write(&bad, "kernel f(A: f32[N = 4]) -> B: f32[N] { B[i] = A[i + 1]; }\n").expect("write");
    let o = texc(&["check", bad.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("bad.tex:1:49"), "{}", err(&o));

    let cases: &[&[&str]] = &[
        &["run", "examples/matmul.tex", "--input", "A=/no/such.npy"],
        &["run", "examples/matmul.tex", "--kernel", "nope"],
        &["run", "examples/matmul.tex", "--shape", "Q=3"],
        &["run", "tests/conformance/std_ops.tex", "--kernel", "t_matmul"],
        &["check", "/no/such/file.tex"],
    ];
    for args in cases {
        let o = texc(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
        assert!(err(&o).starts_with("error: "), "{args:?}: {}", err(&o));
    }
}

#[test]
fn wrong_npy_inputs_exit_1() {
    let f64_file = tmp("a64.npy");
    texc_runtime::write_npy(
        &f64_file,
        &texc_runtime::Tensor::from_f64(texc_runtime::DType::F64, vec![4, 4], &[0.0; 16]),
    )
    .expect("w");
    let o = texc(&["run", "examples/matmul.tex", "--input", &format!("A={}", f64_file.display())]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("f64 data, but `A` is declared f32"), "{}", err(&o));

    let shape_file = tmp("a3.npy");
    texc_runtime::write_npy(
        &shape_file,
        &texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![4, 4], &[0.0; 16]),
    )
    .expect("w");
    let o =
        texc(&["run", "examples/matmul.tex", "--shape", "M=4,K=8", "--input", &format!("A={}", shape_file.display())]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("dimension 1 of `A` is 4 from its input file"), "{}", err(&o));

    let corrupt = tmp("corrupt.npy");
    std::fs::write(&corrupt, b"\x93NUMPY garbage").expect("w");
    let o = texc(&["run", "examples/matmul.tex", "--input", &format!("A={}", corrupt.display())]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("not a valid .npy file"), "{}", err(&o));
}

#[test]
fn misuse_and_unbuilt_features_exit_2() {
    let cases: &[&[&str]] = &[
        &["run"],
        &["frobnicate"],
        &["run", "examples/matmul.tex", "--shape", "M"],
        &["run", "examples/matmul.tex", "--shape", "M=x"],
        &["emit", "examples/matmul.tex", "--stage", "nonsense"],
        &["emit", "examples/matmul.tex", "--stage", "ptx"],
        &["emit", "examples/matmul.tex", "--stage", "loops"],
        &["run", "examples/matmul.tex", "--target", "nvptx-sm80"],
        &["run", "examples/matmul.tex", "--target", "x86-sse"],
        &["run", "examples/matmul.tex", "--knob", "t=abc"],
        &["run", "examples/norms.tex"],
        &["run", "examples/matmul.tex", "--check"],
        &["bench", "examples/matmul.tex"],
        &["tune", "examples/matmul.tex"],
        &["analyze", "examples/matmul.tex"],
        &["compile", "examples/matmul.tex", "-o", "x.o"],
    ];
    for args in cases {
        let o = texc(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
    }
}

#[test]
fn compiled_targets_run_check_and_emit() {
    let o = texc(&["run", "examples/conv_bn_relu.tex", "--target", "x86-avx2", "--check"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("check `Y` against interp: relative error"), "{out}");
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "llvm", "--target", "x86-avx2"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("define void @texc_matmul"));
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "asm", "--target", "x86-avx2"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("vfmadd"), "FMA expected in the matmul loop");
}

/// A softmax on AVX-512: the row maximum in `vrangeps` (not LLVM's six
/// instructions for `maximum`), the exponentials' 2^k in `vscalefps`, their
/// polynomial in FMAs; on AVX2 FMAs and neither AVX-512 instruction. (Their
/// results against the interpreter: `vector_max_and_min_match_the_interpreter_elementwise`
/// and `vector_exp_matches_the_interpreter_elementwise` in tests/tests/backends.rs.)
#[test]
fn softmax_uses_range_scalef_and_fma_instructions() {
    let asm = |target: &str| {
        let o = texc(&["emit", "examples/softmax.tex", "--stage", "asm", "--target", target, "--shape", "N=64,D=1024"]);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let wide = asm("x86-avx512");
    for want in ["vrangeps", "vscalefps", "vfmadd"] {
        assert!(wide.contains(want), "{want} expected in the AVX-512 softmax");
    }
    let narrow = asm("x86-avx2");
    assert!(narrow.contains("vfmadd"), "FMA expected in the AVX2 exponentials");
    assert!(!narrow.contains("vrange") && !narrow.contains("vscalef"), "AVX-512 instructions on AVX2");
}

/// Integer products (`examples/qlinear.tex`): `vpdpbusd` on 512-bit
/// registers with AVX-512 VNNI, VEX-encoded with AVX-VNNI, `vpmaddwd` on
/// bytes widened to 16 bits without either (emitting needs no such CPU); the
/// results are checked bit for bit in tests/tests/int8.rs.
#[test]
fn integer_products_use_dot_product_instructions() {
    let asm_at = |target: &str, n: &str| {
        let o = texc(&["emit", "examples/qlinear.tex", "--stage", "asm", "--target", target, "--shape", n]);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let asm = |target: &str| asm_at(target, "N=96");
    let zmm = asm("x86-avx512-vnni");
    assert!(zmm.lines().any(|l| l.contains("vpdpbusd") && l.contains("%zmm")), "vpdpbusd on zmm expected");
    // Rows of 12 and 28 lanes (16 + 12): whole zmm instructions, padded, not
    // xmm pieces and the shuffles between them.
    for n in ["N=12", "N=28"] {
        let code = asm_at("x86-avx512-vnni", n);
        let dots: Vec<&str> = code.lines().filter(|l| l.contains("vpdpbusd")).collect();
        assert!(!dots.is_empty() && dots.iter().all(|l| l.contains("%zmm")), "{n}: {dots:?}");
    }
    assert!(asm("x86-avx2-vnni").contains("{vex}\tvpdpbusd"), "AVX-VNNI's vpdpbusd expected");
    // Requantization converts whole vectors to bytes, not lane by lane
    // (LLVM's saturating conversion to i8 was 384 scalar `vcvttss2si` here).
    for target in ["x86-avx512-vnni", "x86-avx2"] {
        let code = asm(target);
        assert!(code.contains("vcvttps2dq") && !code.contains("vcvttss2si"), "{target}: vector conversions");
    }
    for target in ["x86-avx2", "x86-avx512"] {
        let code = asm(target);
        assert!(code.contains("vpmaddwd") && !code.contains("vpdpbusd"), "{target}: vpmaddwd, no VNNI");
        // Each lane's byte pairs are widened in place: no lane crossing
        // (gathering neighbouring pair sums took 24–32 permutes here).
        let moves = ["vshufps", "vpermpd", "vpermq", "vpermd", "vpermt2"];
        assert!(!moves.iter().any(|m| code.contains(m)), "{target}: lanes moved");
    }
}

/// A 1×1 integer convolution over a 7×7 map computes its 49 columns as
/// 16-lane vectors thrice and one lane: that lane's products are lane 0 of
/// a 4-lane `vpdpbusd` with VNNI (the widening form, `vpmaddwd` and the
/// horizontal additions after it, cost more than the three vectors beside
/// it). Results: tests/tests/int8.rs, `one_column_and_biased_sums_are_exact`.
#[test]
fn a_products_lone_column_uses_vpdpbusd() {
    let src = "kernel c7(X: u8[1, 40, 7, 7], W: i8[96, 40], b: i32[96], s: f32[96]) -> Y: u8[1, 96, 7, 7] {\n\
               \x20   Y[n, f, y, x] = u8(clamp(round(f32(sum[c](i32(X[n, c, y, x]) * i32(W[f, c])) + b[f]) * s[f]), 0.0, 255.0));\n}\n";
    let code = exact_asm("c7", src, "x86-avx512-vnni");
    assert!(code.lines().any(|l| l.contains("vpdpbusd") && l.contains("%xmm")), "a 4-lane vpdpbusd expected");
    assert!(!code.contains("vpmaddwd"), "the lone column widened");
}

/// A float temporary inlined keeps its store's rounding as a cast to its
/// own type (`texc_schedules`' `inline_stage`); code generation sees
/// through it, so a saturating conversion of `clamp(round(x) + z, lo, hi)`
/// stored first is still one `vcvtps2dq` (rounding as it converts), not a
/// `vrndscaleps` and a truncating conversion after it.
#[test]
fn a_stored_requantization_still_converts_in_one_instruction() {
    let src = "kernel ub(X: f32[4096]) -> Y: u8[4096] {\n\
               \x20   T[i] = clamp(round(X[i] * 0.37) + 3.0, 0.0, 255.0);\n\
               \x20   Y[i] = u8(T[i]);\n}\n";
    let code = exact_asm("ub", src, "x86-avx512");
    assert!(code.contains("vcvtps2dq") && !code.contains("vrndscaleps"), "{code}");
}

/// A 3 × 3 convolution over a 7 × 7 map: each 7-wide row of the image is
/// one masked load (`vmaskmovps` on AVX2, a `{k}`-masked `vmovups` on
/// AVX-512), not LLVM's 4 + 2 + 1 pieces and the inserts between them;
/// a sum kept in its output (stored in pieces) is loaded as it is stored.
/// Results: tests/tests/backends.rs and guard_pages.rs run such rows on
/// every CPU target.
#[test]
fn odd_row_tails_load_masked() {
    let src = "kernel c(X: f32[1, 16, 9, 9], W: f32[16, 16, 3, 3]) -> Y: f32[1, 16, 7, 7] {\n\
               \x20   Y[n, f, y, x] = sum[c, r, s](X[n, c, y + r, x + s] * W[f, c, r, s]);\n}\n";
    let avx2 = exact_asm("c7", src, "x86-avx2");
    assert!(avx2.contains("vmaskmovps"), "x86-avx2: masked row loads expected");
    let avx512 = exact_asm("c7", src, "x86-avx512");
    assert!(
        avx512.lines().any(|l| l.contains("vmovups") && l.contains("{%k")),
        "x86-avx512: k-masked row loads expected"
    );
}

/// `texc emit --stage asm --exact` of kernel `src` for `target` (written to
/// a file named after `name`).
fn exact_asm(name: &str, src: &str, target: &str) -> String {
    let path = common::scratch("cli").join(format!("{name}-{target}.tex"));
    std::fs::write(&path, src).expect("write");
    let o = texc(&["emit", path.to_str().expect("utf-8"), "--stage", "asm", "--target", target, "--exact"]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A vectorized loop whose lanes past its last full register fill at most
/// half a register runs that tail as a narrower vector: a 147-wide row in
/// blocks of 32 lanes ends with 19, emitted as 16 + 3 (one 16-lane and one
/// 4-lane FMA), not as LLVM's widening to 32 lanes (two 16-lane ones).
/// Results at such widths: tests/tests/backends.rs.
#[test]
fn vector_tails_run_in_narrower_registers() {
    let src = "kernel c(X: f32[1, 4, 3, 149], W: f32[8, 4, 3, 3]) -> Y: f32[1, 8, 1, 147] {\n\
               \x20   Y[n, f, y, x] = sum[c, r, s](X[n, c, y + r, x + s] * W[f, c, r, s]);\n}\n";
    let asm = exact_asm("c147", src, "x86-avx512");
    let fmas = |reg: &str| asm.lines().filter(|l| l.trim_start().starts_with("vfmadd") && l.contains(reg)).count();
    let (zmm, xmm) = (fmas("%zmm"), fmas("%xmm"));
    assert!(xmm > 0 && zmm <= 3 * xmm, "the 19-lane tail as 16 + 3 lanes expected: {zmm} zmm and {xmm} xmm FMAs");
}

/// A vectorized loop of three registers (`--knob nvec=3`: blocks of 48
/// lanes on AVX-512) runs as 32 + 16 lanes — three 16-lane FMAs per
/// broadcast weight, where LLVM's widening to 64 lanes took four and built
/// every operand lane by lane (`vinsertps`, 12× slower); the same blocks
/// on `host` (48 lanes as 32 + 16 with AVX-512, 24 as 16 + 8 with AVX2)
/// match the interpreter at a width no block divides.
#[test]
fn three_register_vectors_run_as_powers_of_two() {
    let src = "kernel c(X: f32[4, 3, 149], W: f32[16, 4, 3, 3]) -> Y: f32[16, 147] {\n\
               \x20   Y[f, x] = sum[c, r, s](X[c, r, x + s] * W[f, c, r, s]);\n}\n";
    let path = tmp("nvec3.tex");
    std::fs::write(&path, src).expect("write");
    let path = path.to_str().expect("utf-8");
    let knob = ["--knob", "rows=8,nvec=3"];
    let o = texc(&[&["emit", path, "--stage", "asm", "--target", "x86-avx512"][..], &knob[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let asm = String::from_utf8_lossy(&o.stdout);
    let body = hot_loop(&asm, "vfmadd");
    let zmm = body.iter().filter(|l| l.trim_start().starts_with("vfmadd") && l.contains("%zmm")).count();
    let weights = body.iter().filter(|l| l.trim_start().starts_with("vbroadcastss")).count();
    let built: Vec<_> = body.iter().filter(|l| l.contains("vinsert") || l.contains("vpinsr")).collect();
    assert!(weights > 0 && zmm == 3 * weights, "{zmm} zmm FMAs for {weights} broadcast weights");
    assert!(built.is_empty(), "lanes inserted one by one: {built:#?}");
    let o = texc(&[&["run", path, "--target", "host", "--check"][..], &knob[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("relative error"), "{}", String::from_utf8_lossy(&o.stdout));
}

/// A kernel named like the library operator it is rewritten to (a
/// hand-written `conv2d`, recognized as `std.nn`'s `conv2d`) runs the
/// rewritten plan: the generated kernel has a name of its own, so its call
/// of the operator is not a call of itself (which failed to compile, and
/// the kernel ran as written); the compiled function keeps the kernel's
/// name, and the result matches the interpreter.
#[test]
fn a_kernel_named_like_a_library_operator_is_rewritten() {
    let o = texc(&["emit", "examples/conv2d.tex", "--stage", "egraph", "--target", "x86-avx2"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("chosen plan") && !out.contains("is kept"), "{out}");
    // Shown under the kernel's own name, its call of `std.nn`'s named so.
    assert!(out.contains("kernel conv2d(") && out.contains("compiles as `rewritten_conv2d`"), "{out}");
    let o = texc(&["emit", "examples/conv2d.tex", "--stage", "llvm", "--target", "x86-avx2"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("define void @texc_conv2d("), "{}", err(&o));
    let o = texc(&["run", "examples/conv2d.tex", "--target", "host", "--check"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("relative error"));
}

/// The instructions of the loop that `insn` first appears in: from the
/// label before it to the branch back there.
fn hot_loop<'a>(asm: &'a str, insn: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = asm.lines().collect();
    let first = lines.iter().position(|l| l.trim_start().starts_with(insn)).unwrap_or_else(|| panic!("no {insn}"));
    let label = (0..first).rev().find(|&i| lines[i].starts_with(".LBB")).expect("a loop label");
    let name = lines[label].trim_end_matches(':');
    let back = (first..lines.len())
        .find(|&i| lines[i].trim_start().starts_with('j') && lines[i].split_whitespace().last() == Some(name))
        .expect("a branch back");
    lines[label..=back].to_vec()
}

/// `@dot2` register blocks on AVX2 keep their accumulators in registers:
/// a 3 × 3 convolution's block (whose taps LLVM unrolls, and whose
/// accumulations it regrouped into trees of partial sums across 16-lane
/// rows of two registers) reads and writes nothing on the stack in its
/// inner loop; a product whose sum is sliced, accumulating in its output,
/// stores nothing in its inner loop (the register barrier that keeps the
/// sums apart touches no memory). Each failed before (spills; an output
/// stored every step). Results: `products_are_bit_exact_on_every_target`
/// in tests/tests/int8.rs.
#[test]
fn dot2_blocks_keep_their_accumulators_in_registers() {
    let conv = "kernel c(X: u8[1, 16, 58, 58], W: i8[24, 16, 3, 3]) -> Y: i32[1, 24, 56, 56] {\n\
                \x20   Y[n, f, y, x] = sum[c, r, s](i32(X[n, c, y + r, x + s]) * i32(W[f, c, r, s]));\n}\n";
    let gemm = "kernel g(A: u8[96, 1024], W: i8[1024, 256]) -> C: i32[96, 256] {\n\
                \x20   C[i, j] = sum[k](i32(A[i, k]) * i32(W[k, j]));\n}\n";
    let asm = exact_asm("dot2c", conv, "x86-avx2");
    let body = hot_loop(&asm, "vpmaddwd");
    let stack: Vec<_> = body.iter().filter(|l| l.contains("(%rsp)")).collect();
    assert!(stack.is_empty(), "the convolution's block spills: {stack:#?}");
    let asm = exact_asm("dot2g", gemm, "x86-avx2");
    let body = hot_loop(&asm, "vpmaddwd");
    let stores: Vec<_> = body
        .iter()
        .filter(|l| {
            l.trim_start().starts_with("vmov")
                && l.split(',').next().is_some_and(|src| src.contains("mm"))
                && l.contains('(')
        })
        .collect();
    assert!(
        body.iter().any(|l| l.contains("vpmaddwd")) && stores.is_empty(),
        "the product stores its sums: {stores:#?}"
    );
}

/// Byte windows of stride 2 (an int8 depthwise convolution of stride 2)
/// on AVX2: each row of 16 lanes spans 31 bytes, loaded as two
/// overlapping 16-byte pieces, not element by element (LLVM legalizes a
/// 31-byte load with 15 `vpinsrb` a row); behind a padding copy, the
/// padding's lane masks are not compared in 64-bit lanes (`vpcmpgtq`) —
/// nor at all: its rows branch — and its partial vectors are not loaded
/// lane by lane.
/// Results and bounds: `byte_windows_stay_inside_their_tensors`
/// and `index_comparisons_in_lanes_match_the_interpreter` in
/// tests/tests/guard_pages.rs.
#[test]
fn strided_byte_rows_load_whole_and_pad_masks_need_no_compares() {
    let asm = |name: &str, padding: &str, rows: &str| {
        let path = common::scratch("cli").join(format!("{name}.tex"));
        let src = format!(
            "kernel dw(X: u8[1, 24, 57, 57], W: i8[24, 3, 3], s: f32[24]) -> Y: u8[1, 24, 28, 28] {{\n{padding}\
             \x20   Y[n, c, y, x] = u8(clamp(round(f32(f32(sum[r, q](i32({rows}[n, c, 2 * y + r, 2 * x + q]) * i32(W[c, r, q]))) * s[c])), 0.0, 255.0));\n}}\n"
        );
        std::fs::write(&path, src).expect("write");
        let o = texc(&["emit", path.to_str().expect("utf-8"), "--stage", "asm", "--target", "x86-avx2"]);
        let _ = std::fs::remove_file(&path);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let count = |asm: &str, insn: &str| asm.lines().filter(|l| l.trim_start().starts_with(insn)).count();
    let plain = asm("dw2", "", "X");
    assert_eq!(count(&plain, "vpinsrb"), 0, "strided byte rows assembled element by element");
    let pad = "    Xp[n, c, y in 0..59, x in 0..59] = select(y >= 1 && y < 58 && x >= 1 && x < 58, X[n, c, y - 1, x - 1], u8(0));\n";
    let padded = asm("dw2p", pad, "Xp");
    assert_eq!(count(&padded, "vpcmpgtq"), 0, "padding masks compared in 64-bit lanes");
    // Its partial vectors (a row's first and last) are copied through the
    // stack whole, not loaded byte by byte (`vpinsrb $k, (mem)`).
    let byte_loads = padded.lines().filter(|l| l.trim_start().starts_with("vpinsrb") && l.contains('(')).count();
    assert_eq!(byte_loads, 0, "partial byte vectors loaded lane by lane");
    // Its row condition, the same in every lane, is a branch, and its
    // columns' masks are constants of each partial piece: no compare per
    // vector at all (four byte compares when the row condition was
    // combined into the masks, 64-bit ones before that).
    assert_eq!(count(&padded, "vpcmpgt"), 0, "padding masks compared per vector");
}

/// A roofline no CPU reaches, so the measured rates never raise it (bench
/// raises a given peak a measurement beats, with a note) and the reported
/// peaks stay those given. Its ridge (5 FLOP/byte) puts a 64³ matmul on the
/// compute side.
const UNREACHABLE_ROOFLINE: &str = "50000,10000";

/// A kernel of integer arithmetic mostly is rated in operations against the 8-bit peak.
#[test]
fn bench_rates_integer_kernels_in_operations() {
    let o = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(["bench", "examples/qlinear.tex", "--target", "x86-avx2", "--repeat", "3", "--warmup", "1"])
        .args(["--shape", "M=8,K=16,N=16"])
        .env("TEXC_ROOFLINE", UNREACHABLE_ROOFLINE)
        .current_dir(root())
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // x86-avx2's 8-bit peak is twice its f32 peak.
    for want in ["GOP/s (0.0000 GOP, integer)", "% of peak 100000.0 GOP/s", "OP/byte"] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

#[test]
fn bench_reports_rates_and_the_roofline() {
    let o = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(["bench", "examples/matmul.tex", "--target", "x86-avx2", "--repeat", "3", "--warmup", "1"])
        .env("TEXC_ROOFLINE", UNREACHABLE_ROOFLINE)
        .current_dir(root())
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for want in [
        "GFLOP/s (0.0005 GFLOP)",
        "% of peak 50000.0 GFLOP/s",
        "GB/s",
        "compute-bound",
        "machine numbers TEXC_ROOFLINE",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

#[test]
fn ahead_of_time_object_links_into_a_c_program() {
    for target in ["x86-avx2", "cranelift"] {
        aot_object_links_into_a_c_program(target);
    }
}

/// C program `main` linked with object `obj` (its header in `dir`) into `dir/name`.
fn link_c(dir: &Path, main: &Path, obj: &Path, name: &str) -> PathBuf {
    let exe = dir.join(name);
    let cc = Command::new("cc")
        .arg("-I")
        .arg(dir)
        .arg(main)
        .arg(obj)
        .arg("-o")
        .arg(&exe)
        .arg("-lm")
        .output()
        .expect("cc runs (scripts/bootstrap.sh installs gcc)");
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    exe
}

fn aot_object_links_into_a_c_program(target: &str) {
    let dir = tmp(&format!("aot-{target}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let obj = dir.join("matmul.o");
    let o = texc(&["compile", "examples/matmul.tex", "--target", target, "-o", obj.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let header = std::fs::read_to_string(dir.join("matmul.h")).expect("header written");
    assert!(header.contains("int texc_matmul_run(const float *A, const float *B, float *C);"), "{header}");
    assert!(header.contains("static inline int texc_matmul_run_sized(const float *A, size_t A_len,"), "{header}");
    let exe = link_c(&dir, &root().join("examples/c/matmul_main.c"), &obj, "matmul");
    let run = Command::new(&exe).output().expect("runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stdout));
    assert!(String::from_utf8_lossy(&run.stdout).contains("relative error"));
    // A shared library exports the typed entry.
    let so = dir.join("libcbr.so");
    let o = texc(&["compile", "examples/conv_bn_relu.tex", "--target", target, "-o", so.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(so.exists() && dir.join("libcbr.h").exists());
}

/// An object whose kernel packs more than the stack's share (a product
/// sliced 1024 deep: 512 KiB per block of columns) takes it from
/// `texc_local_alloc`: the object's weak definition by default, the
/// program's own when it links one. Both runs match C's product
/// (`benches/matmul.tex` has no schedule: the default one's knobs apply).
#[test]
fn ahead_of_time_heap_locals_take_the_programs_allocator_when_it_has_one() {
    for target in ["x86-avx2", "cranelift"] {
        let dir = tmp(&format!("aot-heap-{target}"));
        std::fs::create_dir_all(&dir).expect("dir");
        let obj = dir.join("matmul.o");
        let o = texc(&[
            "compile",
            "benches/matmul.tex",
            "--target",
            target,
            "--shape",
            "M=13,K=1100,N=300",
            "--knob",
            "kslice=1024,cols=128",
            "-o",
            obj.to_str().expect("utf8"),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        let header = std::fs::read_to_string(dir.join("matmul.h")).expect("header written");
        assert!(header.contains("void *texc_local_alloc(uint64_t bytes);"), "{header}");
        // The object's own definitions are weak, so that a program's take precedence.
        let nm = Command::new("nm").arg(&obj).output().expect("nm runs (binutils)");
        let symbols = String::from_utf8_lossy(&nm.stdout);
        for name in ["texc_local_alloc", "texc_local_free"] {
            assert!(
                symbols.lines().any(|l| l.ends_with(&format!(" W {name}"))),
                "{target}: {name} not weak:\n{symbols}"
            );
        }
        let own = dir.join("own_alloc.c");
        std::fs::write(
            &own,
            "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\nstatic int calls;\n\
             void *texc_local_alloc(uint64_t n) { calls++; return aligned_alloc(64, (n + 63) / 64 * 64); }\n\
             void texc_local_free(void *p) { free(p); }\n\
             __attribute__((destructor)) static void report(void) { printf(\"own allocator calls: %d\\n\", calls); }\n",
        )
        .expect("written");
        for with_own in [false, true] {
            let exe = dir.join(if with_own { "own" } else { "weak" });
            let mut cc = Command::new("cc");
            cc.arg("-I").arg(&dir).arg(root().join("examples/c/matmul_main.c")).arg(&obj);
            if with_own {
                cc.arg(&own);
            }
            let cc = cc.arg("-o").arg(&exe).arg("-lm").output().expect("cc runs");
            assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
            let run = Command::new(&exe).output().expect("runs");
            let out = String::from_utf8_lossy(&run.stdout);
            assert!(run.status.success() && out.contains("relative error"), "{target}: {out}");
            let calls: Option<u32> =
                out.lines().find_map(|l| l.strip_prefix("own allocator calls: ")).map(|n| n.parse().expect("a count"));
            match with_own {
                true => assert!(calls.is_some_and(|n| n > 0), "{target}: the program's allocator unused: {out}"),
                false => assert_eq!(calls, None),
            }
        }
    }
}

#[test]
fn analyze_agrees_with_hand_counts() {
    let svg = tmp("roof.svg");
    let o = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(["analyze", "examples/conv_bn_relu.tex", "--target", "x86-avx2", "--as-written"])
        .args(["--plot", svg.to_str().expect("utf8")])
        .env("TEXC_ROOFLINE", "130,37")
        .current_dir(root())
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // conv: 2·K·C·R·S·N·H·W = 2·32·16·9·196 FLOPs; X + Wt + Y = 12544 + 18432 + 25088 bytes.
    assert!(out.contains("_conv2d0 = conv2d                           1.806         56.1     32.22  compute"), "{out}");
    // batch_norm: 6 FLOPs per element (sub, add, sqrt, div, mul, add) over 6272 elements.
    assert!(out.contains("_batch_norm1 = batch_norm                   0.038"), "{out}");
    assert!(out.contains(" memory "), "{out}");
    let plot = std::fs::read_to_string(&svg).expect("plot written");
    assert!(plot.starts_with("<svg") && plot.contains("polyline") && plot.matches("<circle").count() == 3);
}

#[test]
fn a_closed_stdout_ends_texc_quietly() {
    // `texc emit ... | head -1`: the reader goes away before texc has written everything.
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(["emit", "tests/conformance/std_ops.tex", "--stage", "ast"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    drop(child.stdout.take()); // close the read end at once
    let status = child.wait().expect("exits");
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("reads");
    assert!(!err.contains("panicked") && !err.contains("crashed"), "{err}");
    assert!(status.code() == Some(0) || status.code() == Some(1), "{status:?}: {err}");
}

/// `TEXC_EXTRACT` picks the extraction; an unknown one, or `ilp` in a texc
/// built without it, is a clear error (exit 2, like any misuse), never a silent fallback.
#[test]
fn extraction_is_chosen_by_environment() {
    let run = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_texc"))
            .args(["emit", "examples/conv_bn_relu.tex", "--stage", "egraph", "--target", "x86-avx2"])
            .env("TEXC_EXTRACT", value)
            .current_dir(root())
            .output()
            .expect("texc runs")
    };
    let o = run("greedy");
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("(greedy extraction)"));
    let o = run("simplex");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("TEXC_EXTRACT=simplex: expected `greedy` or `ilp`"));
    let o = run("ilp");
    if cfg!(feature = "ilp") {
        assert!(String::from_utf8_lossy(&o.stdout).contains("(ilp extraction)"));
    } else {
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("built without ILP extraction"));
    }
}

/// `--time-passes` prints every pass that ran; `--dump-ir` and
/// `TEXC_DUMP_IR` print the IR after the passes asked for.
#[test]
fn passes_are_timed_and_dumped() {
    let o = texc(&["run", "examples/softmax.tex", "--target", "x86-avx2", "--time-passes"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    for pass in [
        "parse",
        "resolve",
        "specialize",
        "rewrite",
        "schedule",
        "lower",
        "zero",
        "one-launch",
        "legalize",
        "codegen",
        "total",
    ] {
        assert!(err(&o).contains(pass), "no `{pass}` in\n{}", err(&o));
    }
    let o = texc(&[
        "emit",
        "examples/matmul.tex",
        "--stage",
        "loops",
        "--target",
        "x86-avx2",
        "--dump-ir",
        "schedule,legalize",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(err(&o).contains("// ---- after schedule (schedules)\nschedules of matmul"), "{}", err(&o));
    assert!(err(&o).contains("// ---- after legalize (loops)"), "{}", err(&o));
    assert!(!err(&o).contains("after parse"), "{}", err(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(["emit", "examples/matmul.tex", "--stage", "tir"])
        .env("TEXC_DUMP_IR", "1")
        .current_dir(root())
        .output()
        .expect("runs");
    assert!(err(&o).contains("// ---- after parse (ast)") && err(&o).contains("// ---- after specialize (tir)"));
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "tir", "--dump-ir", "lowr"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("no pass `lowr` to dump"), "{}", err(&o));
}

/// `--knob` sets a schedule's tunables from the command line.
#[test]
fn knobs_from_the_command_line() {
    let o = texc(&["emit", "examples/sgemm.tex", "--stage", "loops", "--target", "x86-avx2", "--knob", "nope=3"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("knob `nope` is not a tunable"), "{}", err(&o));
}

/// The Cranelift target prints its own stages and says which targets print the others.
#[test]
fn cranelift_stages_and_limits() {
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "clif", "--target", "cranelift"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("; texc_matmul\nfunction"));
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "asm", "--target", "cranelift"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "llvm", "--target", "cranelift"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("target `cranelift` has no stage `llvm`; targets that print it: x86-avx2"), "{}", err(&o));
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "clif", "--target", "x86-avx2"]);
    assert_eq!(o.status.code(), Some(2));
    // f16 objects would need texc's own conversion helpers: refused, clearly.
    let obj = tmp("f16.o");
    let o = texc(&["compile", "examples/gemm_f16.tex", "--target", "cranelift", "-o", obj.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("f16 in Cranelift objects"), "{}", err(&o));
    let o = texc(&["run", "examples/gemm_f16.tex", "--target", "cranelift", "--check"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
}

/// `texc check` says what it verified: the kernels, bounds for all sizes
/// (a condition on the sizes is a warning on stderr, exit 0), kernels
/// specialized at concrete sizes, schedule blocks validated; `--shape`
/// adds the concrete check, and `--target` refuses element types it cannot run.
#[test]
fn check_summarizes_what_it_verified() {
    let o = texc(&["check", "tests/check/transposed_operand.tex"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.starts_with("ok: 1 kernel checked: mm\n"), "{out}");
    assert!(out.contains("3 valid only when N = K"), "{out}");
    assert!(out.contains("at concrete sizes: none"), "{out}");
    assert!(err(&o).contains("warning: this access is in bounds only when N <= K"), "{}", err(&o));
    assert!(err(&o).contains("transposed_operand.tex:3:34"), "{}", err(&o));
    // At sizes that break the condition, the concrete check fails.
    let o = texc(&["check", "tests/check/transposed_operand.tex", "--shape", "M=2,K=3,N=4"]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    let o = texc(&["check", "tests/check/transposed_operand.tex", "--shape", "M=2,K=3,N=3"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 of 1 kernel specialized"), "{}", err(&o));

    let o = texc(&["check", "tests/check/unsized_kernels.tex"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("3 kernels checked: matmul_t, pad1, act"), "{out}");
    assert!(
        out.contains(
            "schedules: 3 blocks validated (matmul_t for x86-avx2, matmul_t for nvptx-sm80, matmul_t for interp)"
        ),
        "{out}"
    );

    let bf16 = tmp("bf16.tex");
    std::fs::write(&bf16, "kernel h(X: bf16[N]) -> Y: bf16[N] { Y[n] = X[n] * X[n]; }\n").expect("write");
    let o = texc(&["check", bf16.to_str().expect("utf8"), "--target", "cranelift"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("`X` is bf16, which target `cranelift` cannot run") && err(&o).contains("bf16.tex:1:10"),
        "{}",
        err(&o)
    );
    let o = texc(&["check", bf16.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
}

fn texc_with_caches(caches: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(args)
        .env("TEXC_HOST_CACHES", caches)
        .current_dir(root())
        .output()
        .expect("texc runs")
}

/// Issue 36, item 4: `host`'s caches and cores come from the machine or
/// `TEXC_HOST_CACHES`, and size its default schedule; the named targets'
/// are nominal, so their code is the same on every machine. `texc targets`
/// shows them; a malformed variable is a usage error naming it.
#[test]
fn host_caches_size_its_schedule_and_named_targets_stay_fixed() {
    let o = texc(&["targets"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(out.contains("caches l1d=32K,l2=1M,l3=32M/2,cores=2 (nominal"), "{out}");
    let o = texc_with_caches("l1d=16K,l2=128K,cores=1", &["targets"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("caches l1d=16K,l2=128K,") && out.contains(",cores=1 (TEXC_HOST_CACHES)"), "{out}");

    let mm = ["benches/matmul.tex", "--shape", "M=37,K=1100,N=1200", "--stage", "loops"];
    let emit = |caches: &str, target: &str| {
        let o = texc_with_caches(caches, &[&["emit", "--target", target][..], &mm[..]].concat());
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    // The named targets ignore the variable; host's slices and parallel loops follow it.
    assert_eq!(emit("l2=128K", "x86-avx2"), emit("l2=8M,cores=64", "x86-avx2"));
    let (small, one_core) = (emit("l1d=32K,l2=256K,cores=2", "host"), emit("l1d=32K,l2=1M,cores=1", "host"));
    assert!(small.contains(", 256, ") && small.contains(" parallel:"), "slices of 256:\n{small}");
    assert!(one_core.contains(", 512, ") && !one_core.contains(" parallel:"), "slices of 512, one thread:\n{one_core}");

    // Code for simulated machines computes what the interpreter does.
    for caches in ["l1d=16K,l2=64K,cores=1", "l1d=64K,l2=8M,l3=64M,cores=16"] {
        for (file, shape) in [("benches/matmul.tex", "M=37,K=700,N=1040"), ("examples/conv2d.tex", "H=21,W=19")] {
            let o = texc_with_caches(caches, &["run", file, "--shape", shape, "--target", "host", "--check"]);
            let out = String::from_utf8_lossy(&o.stdout).to_string();
            assert!(o.status.code() == Some(0) && out.contains("relative error"), "{caches} {file}: {out}{}", err(&o));
        }
    }

    for bad in ["l2=1.5M", "l4=1M", "cores=0", "l2"] {
        let o = texc_with_caches(bad, &["run", "examples/matmul.tex", "--target", "host"]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", err(&o));
        assert!(err(&o).contains("TEXC_HOST_CACHES: "), "{bad}: {}", err(&o));
        let o = texc_with_caches(bad, &["run", "examples/matmul.tex", "--target", "x86-avx2"]);
        assert_eq!(o.status.code(), Some(0), "a named target does not read it: {}", err(&o));
    }
}

/// An object whose integer products run on AMX tiles works in a C program
/// that never asked Linux for the tile state (the kernel asks itself, once),
/// and computes exactly what C computes, the blocks' short last tiles
/// included; skipped, saying why, where the CPU lacks AMX-INT8.
#[test]
fn ahead_of_time_amx_products_ask_for_the_tile_state_themselves() {
    if !texc_runtime::amx::amx_int8() {
        eprintln!("skipped: this CPU (or its OS) gives no AMX-INT8 tiles");
        return;
    }
    let dir = tmp("aot-amx");
    std::fs::create_dir_all(&dir).expect("dir");
    let src = dir.join("q.tex");
    std::fs::write(
        &src,
        "kernel q(A: u8[37, 250], W: i8[70, 250]) -> C: i32[37, 70] {\n\
         \x20   C[i, j] = sum[k](i32(A[i, k]) * i32(W[j, k]));\n}\n",
    )
    .expect("write");
    let obj = dir.join("q.o");
    let o = texc(&[
        "compile",
        src.to_str().expect("utf8"),
        "--target",
        "x86-avx512-amx",
        "-o",
        obj.to_str().expect("utf8"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let main = dir.join("main.c");
    std::fs::write(
        &main,
        r#"#include <stdio.h>
#include <stdint.h>
#include "q.h"
int main(void) {
    static uint8_t a[37 * 250]; static int8_t w[70 * 250]; static int32_t c[37 * 70];
    unsigned s = 1;
    for (int i = 0; i < 37 * 250; i++) { s = s * 1103515245u + 12345u; a[i] = s >> 24; }
    for (int i = 0; i < 70 * 250; i++) { s = s * 1103515245u + 12345u; w[i] = (int8_t)(s >> 24); }
    if (texc_q_run(a, w, c) != TEXC_Q_OK) { fprintf(stderr, "run failed\n"); return 1; }
    for (int i = 0; i < 37; i++)
        for (int j = 0; j < 70; j++) {
            int32_t r = 0;
            for (int k = 0; k < 250; k++) r += (int32_t)a[i * 250 + k] * (int32_t)w[j * 250 + k];
            if (r != c[i * 70 + j]) { fprintf(stderr, "C[%d, %d] = %d, not %d\n", i, j, c[i * 70 + j], r); return 1; }
        }
    printf("exact\n");
    return 0;
}
"#,
    )
    .expect("write");
    let exe = link_c(&dir, &main, &obj, "q");
    let run = Command::new(&exe).output().expect("runs");
    assert!(run.status.success(), "{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stdout).contains("exact"));
}

/// `texc/build.rs` links the executable at a fixed address, so LLVM's
/// pointer tables need no relocating at start (ELF `ET_EXEC`; a
/// position-independent executable is `ET_DYN`).
#[test]
#[cfg(target_os = "linux")]
fn the_executable_is_linked_at_a_fixed_address() {
    use object::read::elf::FileHeader;
    let bytes = std::fs::read(env!("CARGO_BIN_EXE_texc")).expect("the texc executable reads");
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&*bytes).expect("an ELF64 executable");
    let e_type = header.e_type(header.endian().expect("an endianness"));
    assert_eq!(e_type, object::elf::ET_EXEC, "texc is not linked at a fixed address (ELF type {e_type})");
}

/// The functions a run uses are laid out together (`texc/build.rs`'s
/// symbol ordering): LLVM's static constructors, which all run before
/// `main` and lie 30 MB apart in the default layout (each page fault
/// mapping the 64 KiB around it), lie within 2 MB. Where the linker is not
/// LLD (Rust before 1.90) the list is not passed and the test says so.
#[test]
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn the_static_constructors_are_laid_out_together() {
    use object::{Object, ObjectSymbol, SymbolKind};
    if env!("TEXC_FUNCTIONS_ORDERED") != "1" {
        eprintln!("skipped: this toolchain's linker is not LLD, so texc/build.rs passed no symbol ordering");
        return;
    }
    let bytes = std::fs::read(env!("CARGO_BIN_EXE_texc")).expect("the texc executable reads");
    let file = object::File::parse(&*bytes).expect("an object file");
    let constructors: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter(|s| s.name().is_ok_and(|n| n.starts_with("_GLOBAL__sub_I_")))
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    let count = constructors.len();
    assert!(count > 100, "only {count} static constructors found (is the executable stripped?)");
    let lo = constructors.iter().map(|c| c.0).min().unwrap_or(0);
    let hi = constructors.iter().map(|c| c.1).max().unwrap_or(0);
    assert!(hi - lo <= 2 << 20, "{count} static constructors span {} KiB", (hi - lo) >> 10);
}
