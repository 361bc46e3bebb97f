//! Integer products (`texc_schedules::dot4`): sums of `u8 × i8` products
//! widened to `i32` are bit-exact against the interpreter on every CPU
//! target that runs here — on the LLVM x86 targets as `@dot4` (`vpdpbusd`)
//! with VNNI, as `@dot2` (`vpmaddwd` on bytes widened when packed) without,
//! or `@dot4sat` (`vpmaddubsw`) where known weights cannot saturate it,
//! on Cranelift as written — at sizes no vector, register block or group of
//! four divides; `i8` activations offset by 128 with the weights' sums
//! subtracted (VNNI); products the instruction cannot take (two unsigned
//! operands with VNNI, a reduction variable read elsewhere) left alone. The
//! instructions themselves: texc/tests/cli.rs.

use texc_compiler::interp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::{Bindings, Program};
use texc_schedules::LoopFunc;

fn cpu_targets() -> Vec<&'static Target> {
    let (run, skipped) = texc_tests::runnable_targets();
    for why in skipped {
        eprintln!("skipped: {why}");
    }
    run.into_iter().filter(|t| t.kind == TargetKind::Cpu).collect()
}

fn program(text: &str) -> Program {
    let (mut pl, k) = texc_tests::load_text("interp", "int8.tex", text, None).unwrap_or_else(|e| panic!("{e}"));
    texc_tests::specialize(&mut pl, k, &Bindings::default())
}

/// The legalized default loop nests of `p` for `target` (code generation needs no CPU).
fn legal_loops(target: &str, p: &Program) -> LoopFunc {
    let mut pl = texc_tests::pipeline(target);
    pl.default_loops(p.clone()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e))).legal
}

/// Every CPU target here computes exactly the interpreter's outputs (random
/// inputs over each integer type's whole range, two seeds).
fn check_exact(name: &str, p: &Program) {
    check_exact_on(name, p, |_| true)
}

/// [`check_exact`] on the CPU targets here that `on` accepts.
fn check_exact_on(name: &str, p: &Program, on: impl Fn(&Target) -> bool) {
    for seed in [3, 11] {
        let args = || interp::bind_args(p, Default::default(), &[], seed).expect("binds");
        let want = interp::run(p, args()).expect("interp");
        for target in cpu_targets().into_iter().filter(|t| on(t)) {
            let f = legal_loops(target.name, p);
            let k = texc_tests::compile_loops(target, &f).unwrap_or_else(|e| panic!("{name} on {target}: {e}"));
            let got = k.run(args()).expect("runs");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.bytes(), w.bytes(), "{name} on {target} (seed {seed}): not bit-exact");
            }
            eprintln!("{name} on {target}: bit-exact");
        }
    }
}

fn gemm(m: i64, k: i64, n: i64, a: &str) -> String {
    format!(
        "kernel q(A: {a}[{m}, {k}], W: i8[{n}, {k}]) -> C: i32[{m}, {n}] {{\n\
         \x20   C[i, j] = sum[k](i32(A[i, k]) * i32(W[j, k]));\n}}\n"
    )
}

/// The requantized form of docs/language.md: bias in `i32`, per-channel
/// scale, output zero point, rounding half to even, saturation.
fn qlinear(m: i64, k: i64, n: i64) -> String {
    format!(
        "kernel q(A: u8[{m}, {k}], W: i8[{n}, {k}], bias: i32[{n}], scale: f32[{n}]) -> Y: u8[{m}, {n}] {{\n\
         \x20   Y[i, j] = u8(clamp(round(f32(sum[k](i32(A[i, k]) * i32(W[j, k])) + bias[j]) * scale[j] * 0.001) + 7.0, 0.0, 255.0));\n}}\n"
    )
}

/// A convolution reducing over channels, rows and columns: `c` is the
/// packed variable, an inner index of both operands.
fn conv(c: i64, k: i64, hw: i64) -> String {
    format!(
        "kernel q(X: u8[1, {c}, {hw}, {hw}], W: i8[{k}, {c}, 3, 3]) -> Y: i32[1, {k}, {o}, {o}] {{\n\
         \x20   Y[n, f, y, x] = sum[c, r, s](i32(X[n, c, y + r, x + s]) * i32(W[f, c, r, s]));\n}}\n",
        o = hw - 2
    )
}

/// A grouped convolution (`groups` groups of `cg` input and `kg` output
/// channels), written as the importer writes it.
fn grouped(groups: i64, cg: i64, kg: i64, x: &str) -> String {
    format!(
        "kernel q(X: {x}[1, {c}, 6, 6], W: i8[{k}, {cg}, 3, 3]) -> Y: i32[1, {k}, 4, 4] {{\n\
         \x20   Y[n, f, y, z] = sum[c, r, s](i32(X[n, (f / {kg}) * {cg} + c, y + r, z + s]) * i32(W[f, c, r, s]));\n}}\n",
        c = groups * cg,
        k = groups * kg
    )
}

/// Whether the loop nests call `@dot4`, and with the accumulator inside it.
fn dot4_form(f: &LoopFunc) -> (bool, bool) {
    dot_form(f, "@dot4")
}

/// Whether the loop nests call `dot` (`@dot4`, `@dot2`), and with the accumulator inside it.
fn dot_form(f: &LoopFunc, dot: &str) -> (bool, bool) {
    let text = texc_schedules::ir::print(f);
    (text.contains(&format!("{dot}(")), text.contains(&format!("{dot}(0i32")))
}

#[test]
fn products_are_bit_exact_on_every_target() {
    for (m, k, n) in [(7, 13, 21), (1, 1, 1), (5, 4, 33), (33, 67, 130), (2, 3, 17)] {
        check_exact(&format!("u8 × i8 {m}×{k}×{n}"), &program(&gemm(m, k, n, "u8")));
    }
    check_exact("i8 × i8 9×10×19", &program(&gemm(9, 10, 19, "i8")));
    check_exact("requantized 6×29×35", &program(&qlinear(6, 29, 35)));
    check_exact("convolution 5→7 channels", &program(&conv(5, 7, 9)));
    // Rows of 58 (more than 6 vectors: a register block of filters × two
    // vectors, 4 filters on AVX2 and a tail of 2); a sum of 1030 products
    // cut into slices accumulated in the output.
    check_exact("convolution 5→10 channels, 60²", &program(&conv(5, 10, 60)));
    check_exact("u8 × i8 6×1030×40", &program(&gemm(6, 1030, 40, "u8")));
    check_exact("grouped convolution", &program(&grouped(2, 8, 3, "u8")));
    check_exact("grouped convolution, i8 activations", &program(&grouped(3, 4, 2, "i8")));
    check_exact("grouped convolution, 6 channels a group", &program(&grouped(2, 6, 3, "u8")));
    check_exact("grouped convolution, 5 channels a group", &program(&grouped(2, 5, 3, "i8")));
    check_exact("u8 × u8 7×9×20", &program(&gemm(7, 9, 20, "u8").replace("W: i8", "W: u8")));
}

/// A product over rows too short for the vectors (a 7×7 map: 7 of 16
/// lanes) runs with the filters last: vectors along the filters, the
/// result copied back; bit-exact, a tail of filters included. Where the
/// row fills its vectors (8 lanes of AVX2) or the filters would not, as written.
#[test]
fn short_rows_run_along_the_filters() {
    let text = |target: &str, src: &str| texc_schedules::ir::print(&legal_loops(target, &program(src)));
    let wide = text("x86-avx512-vnni", &conv(8, 32, 9));
    assert!(wide.contains("temp Y.t: i32[1, 7, 7, 32]") && wide.contains("temp W.q4.f: i32[2, 3, 3, 32]"), "{wide}");
    assert!(text("x86-avx512", &conv(8, 32, 9)).contains("Y.t"), "vpmaddwd's 16 lanes too");
    assert!(!text("x86-avx2", &conv(8, 32, 9)).contains("Y.t"), "7 of 8 lanes fill the row");
    assert!(!text("x86-avx512-vnni", &conv(8, 20, 9)).contains("Y.t"), "20 filters fill 16-lane vectors worse");
    assert!(!text("x86-avx512-vnni", &conv(8, 32, 18)).contains("Y.t"), "rows of 16");
    check_exact("filters-last convolution", &program(&conv(8, 32, 9)));
    check_exact("filters-last convolution, a tail of filters and of channels", &program(&conv(5, 24, 8)));
}

/// `@dot2` register blocks on AVX2 (16 registers; a product is added in
/// an instruction of its own): a window sliding along the rows (`x + s`),
/// whose taps' overlapping panels LLVM loads ahead, blocks 4 filters of
/// two vectors, not 6, so that nothing spills; so does a window of stride
/// 2, whose columns are split into phases first (contiguous panels); a
/// product without taps, and a window of stride and dilation 2 (its
/// panels gathered: more filters share them), keep 6; AVX-512's 32
/// registers keep the block whole. The generated
/// code: `dot2_blocks_keep_their_accumulators_in_registers` in
/// texc/tests/cli.rs.
#[test]
fn dot2_blocks_leave_registers_for_the_taps_panels() {
    let strided = conv(16, 24, 121).replace("y + r, x + s", "2 * y + r, 2 * x + s").replace("119, 119", "60, 60");
    let dilated = conv(16, 24, 121).replace("y + r, x + s", "2 * y + r, 2 * x + 2 * s").replace("119, 119", "59, 59");
    let rows = |target: &str, src: &str| {
        let text = texc_schedules::ir::print(&legal_loops(target, &program(src)));
        let block = text.lines().find(|l| l.contains("local Y.acc") || l.contains("for i.r in")).map(str::trim);
        block.unwrap_or_else(|| panic!("{target}: no register block:\n{text}")).to_string()
    };
    assert_eq!(rows("x86-avx2", &conv(16, 24, 58)), "local Y.acc: i32[4, 16]:");
    assert_eq!(rows("x86-avx2", &strided), "local Y.acc: i32[4, 16]:");
    assert_eq!(rows("x86-avx2", &dilated), "local Y.acc: i32[6, 16]:");
    assert_eq!(
        rows(
            "x86-avx2",
            &gemm(96, 1024, 256, "u8").replace("W: i8[256, 1024]", "W: i8[1024, 256]").replace("W[j, k]", "W[k, j]")
        ),
        "for i.r in 0..6 unrolled:"
    );
    assert_eq!(rows("x86-avx512", &conv(16, 24, 58)), "local Y.acc: i32[6, 4, 16]:");
}

/// A 1 × 1 convolution of stride `stride` (`at`: the index of a row, as
/// the importer writes it with a sum of one, `stride · y + r`, or plainly
/// `stride · y`, plus `offset`) over a `c`-channel `hw × hw` map.
fn strided_1x1(c: i64, k: i64, hw: i64, stride: i64, offset: i64, taps: bool) -> String {
    let o = (hw - 1 - offset) / stride + 1;
    let (r, s, sums) = if taps { (" + r", " + s", "c, r, s") } else { ("", "", "c") };
    let w = if taps { "W[f, c, r, s]" } else { "W[f, c, 0, 0]" };
    format!(
        "kernel q(X: u8[1, {c}, {hw}, {hw}], W: i8[{k}, {c}, 1, 1]) -> Y: i32[1, {k}, {o}, {o}] {{\n\
         \x20   Y[n, f, y, x] = sum[{sums}](i32(X[n, c, {stride} * y + {offset}{r}, {stride} * x + {offset}{s}]) * i32({w}));\n}}\n"
    )
}

/// A convolution of `taps × taps` windows at stride `stride`, each
/// window's first column at `stride · x + offset`, over a `c`-channel
/// `hw × hw` map.
fn strided_window(c: i64, k: i64, hw: i64, stride: i64, offset: i64, taps: i64) -> String {
    let o = (hw - taps - offset) / stride + 1;
    format!(
        "kernel q(X: u8[1, {c}, {hw}, {hw}], W: i8[{k}, {c}, {taps}, {taps}]) -> Y: i32[1, {k}, {o}, {o}] {{\n\
         \x20   Y[n, f, y, x] = sum[c, r, s](i32(X[n, c, {stride} * y + r, {stride} * x + s + {offset}]) * i32(W[f, c, r, s]));\n}}\n"
    )
}

/// Strided convolutions read their activations rearranged into a copy
/// first (`texc_schedules::subsample`): a 1 × 1 one's positions subsampled
/// (`X.sub`), a window's columns split into phases (`X.ph`), so that every
/// vector of a row is contiguous. Bit-exact on every target at strides 2
/// and 3, offsets 0 and 1, 1 × 1, 2 × 2, 3 × 3 and 7 × 7 windows, odd sizes
/// (phases whose last positions lie past the row, guarded); the copy only
/// where the last index is strided and in bounds for every position (a
/// read under a guard that would leave the tensor is not copied whole),
/// none at stride 1.
#[test]
fn strided_products_read_a_rearranged_copy() {
    let loops = |target: &str, src: &str| texc_schedules::ir::print(&legal_loops(target, &program(src)));
    for target in ["x86-avx2", "x86-avx512-vnni", "x86-avx512"] {
        let text = loops(target, &strided_1x1(16, 24, 56, 2, 0, true));
        assert!(text.contains("X.sub"), "{target}:\n{text}");
        let text = loops(target, &strided_window(16, 24, 57, 2, 0, 3));
        assert!(text.contains("X.ph") && !text.contains("X.sub"), "{target}:\n{text}");
        let stride1 = [strided_1x1(16, 24, 56, 1, 0, true), strided_window(16, 24, 58, 1, 0, 3)];
        for src in stride1 {
            let text = loops(target, &src);
            assert!(!text.contains("X.sub") && !text.contains("X.ph"), "{target}: stride 1:\n{text}");
        }
    }
    for (c, k, hw, stride, offset, taps) in [(5, 7, 13, 2, 0, true), (6, 9, 17, 2, 1, false), (3, 20, 20, 3, 1, true)] {
        let name = format!("strided 1×1, {c}→{k} at {hw}², stride {stride}, offset {offset}");
        check_exact(&name, &program(&strided_1x1(c, k, hw, stride, offset, taps)));
    }
    // 2 × 2 at stride 2 and 4 × 4 at stride 4 (a ViT's patches): the
    // window's taps are the variable the words pack (along `2·x + s`),
    // which stays as it is.
    let windows = [(5, 7, 15, 2, 0, 3), (3, 10, 40, 2, 1, 7), (4, 6, 23, 3, 0, 3), (6, 5, 18, 2, 1, 2)];
    for (c, k, hw, stride, offset, taps) in windows.into_iter().chain([(3, 6, 18, 2, 0, 2), (2, 5, 24, 4, 0, 4)]) {
        let name = format!("{taps}×{taps} window, {c}→{k} at {hw}², stride {stride}, offset {offset}");
        check_exact(&name, &program(&strided_window(c, k, hw, stride, offset, taps)));
    }
    let signed = strided_window(5, 7, 15, 2, 0, 3).replace("X: u8", "X: i8");
    check_exact("3×3 window, stride 2, i8 activations (offset by 128 with VNNI)", &program(&signed));
    // Rows past 2 · 2 + 1 lie outside X: only the columns are copied.
    let guarded = "kernel q(X: u8[1, 4, 6, 14], W: i8[3, 4]) -> Y: i32[1, 3, 5, 7] {\n\
                   \x20   Y[n, f, y, x] = select(y < 3, sum[c](i32(X[n, c, 2 * y, 2 * x]) * i32(W[f, c])), 0);\n}\n";
    let mut p = program(guarded);
    let avx2 = texc_compiler::target::lookup("x86-avx2").expect("a target");
    texc_schedules::dot4::pack_products(&mut p, avx2, &texc_schedules::dot4::nothing_known);
    let sub = p.tensors.iter().find(|t| t.name == "X.sub").expect("a copy of the columns");
    assert_eq!(sub.shape, [1, 4, 6, 7], "every row, every other column");
    check_exact("strided 1×1 under a guard", &program(guarded));
}

/// A depthwise convolution (`r × r` windows, stride `stride`) over a
/// `c`-channel `hw × hw` map: no index is a sum's variable alone.
fn depthwise(c: i64, hw: i64, r: i64, stride: i64) -> String {
    format!(
        "kernel q(X: u8[1, {c}, {hw}, {hw}], W: i8[{c}, 1, {r}, {r}]) -> Y: i32[1, {c}, {o}, {o}] {{\n\
         \x20   Y[n, c, y, x] = sum[r, s](i32(X[n, c, y * {stride} + r, x * {stride} + s]) * i32(W[c, 0, r, s]));\n}}\n",
        o = (hw - r) / stride + 1
    )
}

/// A depthwise convolution's window rows are the words of its products,
/// read in place: with VNNI `@dot4`'s (four bytes of the row a lane; a
/// window wider than four chains two words), without `@dot2`'s (two
/// bytes, each widened to 16 bits), the filters packed alike; bit-exact at
/// strides 1 and 2, windows of 2, 3, 5 and 7, rows no vector divides.
#[test]
fn depthwise_windows_are_dot4_words() {
    let text = |target: &str, src: &str| texc_schedules::ir::print(&legal_loops(target, &program(src)));
    let three = text("x86-avx512-vnni", &depthwise(5, 19, 3, 2));
    assert!(three.contains("temp W.q4: i32[1, 5, 1, 3]") && three.contains("@dot4("), "{three}");
    assert!(three.contains("* 256i32 + i32(X["), "the window's bytes, in place:\n{three}");
    let seven = text("x86-avx2-vnni", &depthwise(3, 20, 7, 1));
    assert!(seven.contains("temp W.q4: i32[2, 3, 1, 7]") && seven.contains("@dot4(@dot4("), "{seven}");
    let halves = text("x86-avx512", &depthwise(5, 19, 3, 2));
    assert!(halves.contains("temp W.q2: i32[2, 5, 1, 3]") && halves.contains("@dot2(@dot2("), "{halves}");
    assert!(halves.contains("* 65536i32"), "two bytes a word, widened:\n{halves}");
    let cranelift = text("cranelift", &depthwise(5, 19, 3, 2));
    assert!(!cranelift.contains("@dot"), "cranelift has neither:\n{cranelift}");
    for (c, hw, r, stride) in [(5, 19, 3, 2), (3, 20, 3, 1), (2, 23, 5, 2), (3, 20, 7, 1), (4, 9, 2, 1)] {
        check_exact(&format!("depthwise {c}×{hw}², {r}×{r}, stride {stride}"), &program(&depthwise(c, hw, r, stride)));
    }
}

#[test]
fn grouped_convolutions_pack_when_groups_are_whole_words() {
    let packed = |text: &str| texc_schedules::ir::print(&legal_loops("x86-avx512-vnni", &program(text)));
    assert!(packed(&grouped(2, 8, 3, "u8")).contains("X.q4"), "8 channels a group: two words each");
    // 6 channels a group: a word of channels would straddle two groups; the
    // window's rows are the words instead.
    let rows = packed(&grouped(2, 6, 3, "u8"));
    assert!(!rows.contains("X.q4") && rows.contains("* 256i32 + i32(X["), "{rows}");
    // Without VNNI a word holds two channels.
    let halves = |text: &str| texc_schedules::ir::print(&legal_loops("x86-avx2", &program(text)));
    assert!(halves(&grouped(2, 6, 3, "u8")).contains("X.q2"), "6 channels a group: three words each");
    let rows = halves(&grouped(2, 5, 3, "u8"));
    assert!(!rows.contains("X.q2") && rows.contains("* 65536i32") && rows.contains("@dot2("), "{rows}");
}

/// The extremes: every product 255 × −128 (and 255 × 127), over a reduction
/// long enough that the packed path's 16-bit intermediates would saturate
/// if it had any.
#[test]
fn extreme_values_are_exact() {
    use texc_runtime::{DType, Tensor};
    let (m, k, n) = (3, 1001, 19);
    for (ty, dtype, value) in [("u8", DType::U8, 255.0), ("i8", DType::I8, -128.0)] {
        let p = program(&gemm(m, k, n, ty));
        let a = Tensor::from_f64(dtype, vec![m as usize, k as usize], &vec![value; (m * k) as usize]);
        let w: Vec<f64> = (0..n * k).map(|i| if (i / k) % 2 == 0 { -128.0 } else { 127.0 }).collect();
        let w = Tensor::from_f64(DType::I8, vec![n as usize, k as usize], &w);
        let files = std::collections::HashMap::from([("A".to_string(), a), ("W".to_string(), w)]);
        let args = || interp::bind_args(&p, files.clone(), &[], 0).expect("binds");
        let want = interp::run(&p, args()).expect("interp");
        assert_eq!(want[0].to_f64()[0], 1001.0 * value * -128.0);
        for target in cpu_targets() {
            let k = texc_tests::compile_loops(target, &legal_loops(target.name, &p)).expect("compiles");
            assert_eq!(k.run(args()).expect("runs")[0].bytes(), want[0].bytes(), "{ty} on {target}");
        }
    }
}

/// A requantization's saturation, `u8(clamp(x, lo, hi))` (code generation
/// clamps once and sends NaN to 0 itself: `clamped_to_byte`, through the
/// clamp where `lo` is 0; `round(y) + z` as `cvtps2dq` on x86), at NaN, the
/// infinities, values far past the bounds and halves, `u8` and `i8`, at a
/// length no vector divides: the interpreter's bytes on every CPU target.
#[test]
fn saturating_byte_conversions_match_the_interpreter() {
    use texc_runtime::{DType, Tensor};
    let p = program(
        "kernel q(X: f32[37]) -> (Y: u8[37], Z: i8[37], V: u8[37], S: i8[37], T: u8[37], U: i8[37]) {\n\
         \x20   Y[i] = u8(clamp(round(X[i]) + 3.0, 2.0, 250.5));\n\
         \x20   Z[i] = i8(clamp(X[i] * 0.5, -100.0, 120.0));\n\
         \x20   V[i] = u8(clamp(X[i], 0.0, 255.0));\n\
         \x20   S[i] = i8(clamp(round(X[i]), 0.0, 100.0));\n\
         \x20   T[i] = u8(clamp(round(X[i] * 0.5) + 3.0, 2.0, 250.0));\n\
         \x20   U[i] = i8(clamp(round(X[i]) + -7.0, -128.0, 120.0));\n}\n",
    );
    let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e30, -1e30, -0.0, 0.0, 0.5, 1.5, 2.5, -2.5, 249.5];
    let more = [250.7, 254.9, 255.5, 300.0, -3.0, 3e9, -3e9, 127.9, -128.7, 247.5, -201.0, 240.0];
    let x: Vec<f64> = special.iter().chain(&more).copied().cycle().take(37).collect();
    let files = std::collections::HashMap::from([("X".to_string(), Tensor::from_f64(DType::F32, vec![37], &x))]);
    let args = || interp::bind_args(&p, files.clone(), &[], 0).expect("binds");
    let want = interp::run(&p, args()).expect("interp");
    assert_eq!(&want[0].to_f64()[..3], &[0.0, 250.0, 2.0], "NaN, +inf, -inf");
    assert_eq!(&want[1].to_f64()[..3], &[0.0, 120.0, -100.0], "NaN, +inf, -inf");
    // A lower bound of 0 takes NaN there without a test of its own.
    assert_eq!(&want[3].to_f64()[..3], &[0.0, 100.0, 0.0], "NaN, +inf, -inf");
    // `round(y) + z` with whole bounds: `cvtps2dq` of the clamped `y`, the
    // zero point added as an integer (`rounded_to_byte`), halves to even.
    assert_eq!(&want[4].to_f64()[..12], &[0.0, 250.0, 2.0, 250.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 2.0, 128.0]);
    assert_eq!(&want[5].to_f64()[..3], &[0.0, 120.0, -128.0], "NaN, +inf, -inf");
    for target in cpu_targets() {
        let k = texc_tests::compile_loops(target, &legal_loops(target.name, &p)).expect("compiles");
        for (g, w) in k.run(args()).expect("runs").iter().zip(&want) {
            assert_eq!(g.bytes(), w.bytes(), "{target}: {:?} vs {:?}", g.to_f64(), w.to_f64());
        }
    }
}

#[test]
fn x86_targets_compute_packed_products_and_cranelift_does_not() {
    let p = program(&gemm(16, 70, 48, "u8"));
    for target in ["x86-avx512-vnni", "x86-avx2-vnni"] {
        let f = legal_loops(target, &p);
        let text = texc_schedules::ir::print(&f);
        // Seventy products: eighteen groups of four, the last two bytes zero.
        assert!(text.contains("W.q4: i32[18, 48]"), "{target}:\n{text}");
        assert!(text.contains("A.q4"), "{target}: the activations are packed too:\n{text}");
        assert_eq!(dot4_form(&f), (true, false), "{target}: the accumulator goes into @dot4:\n{text}");
    }
    // Without VNNI: thirty-five pairs, each byte widened to 16 bits.
    for target in ["x86-avx512", "x86-avx2"] {
        let f = legal_loops(target, &p);
        let text = texc_schedules::ir::print(&f);
        assert!(text.contains("W.q2: i32[35, 48]") && text.contains("A.q2"), "{target}:\n{text}");
        assert_eq!(dot_form(&f, "@dot2"), (true, false), "{target}: the accumulator goes into @dot2:\n{text}");
        assert!(!text.contains("@dot4"), "{target}:\n{text}");
    }
    let f = legal_loops("cranelift", &p);
    assert_eq!((dot4_form(&f), dot_form(&f, "@dot2")), ((false, false), (false, false)), "cranelift has neither");
}

#[test]
fn signed_activations_are_offset_and_corrected() {
    // `i8 × i8`: the activations packed plus 128, `128 · Σ W` subtracted,
    // the weights' sums a stage of their own (folded for constant weights).
    let p = program(&gemm(8, 30, 32, "i8"));
    let f = legal_loops("x86-avx512-vnni", &p);
    let text = texc_schedules::ir::print(&f);
    assert!(dot4_form(&f).0 && text.contains("W.sum: i32[32]") && text.contains("128i32 * W.sum["), "{text}");
    // A convolution's activations are read through `y + r`: only they can be
    // the offset side, the filters' sums are per output channel.
    let conv8 = conv(6, 5, 7).replace("X: u8", "X: i8");
    let f = legal_loops("x86-avx2-vnni", &program(&conv8));
    assert!(texc_schedules::ir::print(&f).contains("W.sum: i32[5]"), "{}", texc_schedules::ir::print(&f));
    // In 16-bit halves both sides are signed: no offset, no correction.
    let text = texc_schedules::ir::print(&legal_loops("x86-avx2", &program(&conv8)));
    assert!(text.contains("@dot2(") && !text.contains(".sum"), "{text}");
    check_exact("i8 × i8 convolution", &program(&conv8));
}

#[test]
fn products_the_instruction_cannot_take_stay_as_written() {
    let as_written = |text: &str| {
        let p = program(text);
        assert!(!dot4_form(&legal_loops("x86-avx512-vnni", &p)).0, "packed:\n{text}");
        check_exact("as written", &p);
    };
    // Two unsigned operands: `vpdpbusd`'s second is signed.
    as_written(&gemm(8, 16, 32, "u8").replace("W: i8", "W: u8"));
    // `k` read outside the loads: packing it would change what it counts.
    as_written(
        "kernel q(A: u8[8, 16], W: i8[32, 16]) -> C: i32[8, 32] {\n\
         \x20   C[i, j] = sum[k](i32(A[i, k]) * i32(W[j, (k + 1) % 16]));\n}\n",
    );
    // Two signed operands, neither indexed by plain variables: no sum of
    // either is a stage of its own.
    as_written(
        "kernel q(A: i8[8, 16], W: i8[32, 16]) -> C: i32[8, 32] {\n\
         \x20   C[i, j] = sum[k](i32(A[(i + 1) % 8, k]) * i32(W[(j + 3) % 32, k]));\n}\n",
    );
}

#[test]
fn dot4_is_vpdpbusd_lane_semantics() {
    use texc_compiler::semantics::dot4;
    // Bytes little-endian: a = [1, 2, 3, 255] unsigned, b = [-1, 2, -3, 127] signed.
    let a = i64::from(u32::from_le_bytes([1, 2, 3, 255]));
    let b = i64::from(u32::from_le_bytes([0xff, 2, 0xfd, 127]));
    assert_eq!(dot4(a, b), -1 + 4 - 9 + 255 * 127);
    assert_eq!(dot4(0xffff_ffff, 0x8080_8080), 4 * 255 * -128);
}

#[test]
fn dot2_is_vpmaddwd_lane_semantics() {
    use texc_compiler::ops::Intrinsic;
    use texc_compiler::semantics::{dot2, intrinsic, V};
    use texc_compiler::tir::Ty;
    use texc_compiler::types::ElemType;
    // Halves little-endian and signed: a = [3, -2], b = [-7, 255].
    let word = |lo: i16, hi: i16| i64::from(u32::from(lo as u16) | u32::from(hi as u16) << 16);
    assert_eq!(dot2(word(3, -2), word(-7, 255)), -21 - 510);
    // The one sum that leaves i32: vpmaddwd wraps it to i32::MIN; so does `@dot2`.
    let min = word(i16::MIN, i16::MIN);
    let i32t = Ty::Elem(ElemType::I32);
    let got = intrinsic(Intrinsic::Dot2, i32t, &[V::I(0), V::I(min), V::I(min)]);
    assert_eq!(got.i(), i64::from(i32::MIN));
}

#[test]
fn dot4sat_is_vpmaddubsw_lane_semantics() {
    use texc_compiler::semantics::{dot4, dot4sat};
    let word = |b: [u8; 4]| i64::from(u32::from_le_bytes(b));
    // Pair sums inside 16 bits: the exact products, as `@dot4`.
    let (a, b) = (word([1, 2, 3, 255]), word([0xff, 2, 0xfd, 64]));
    assert_eq!(dot4sat(a, b), dot4(a, b));
    // 255 · 127 twice saturates to 32767 per pair; 255 · −128 twice to −32768.
    assert_eq!(dot4sat(0xffff_ffff, 0x7f7f_7f7f), 2 * 32767);
    assert_eq!(dot4sat(0xffff_ffff, 0x8080_8080), 2 * -32768);
    // Mixed signs within a pair cannot saturate: 255 · (127 − 128).
    assert_eq!(dot4sat(0xffff_ffff, i64::from(u32::from_le_bytes([127, 0x80, 127, 0x80]))), 2 * -255);
}

/// Without VNNI, a product whose weights are known when compiling (a
/// model's) and cannot saturate a 16-bit pair sum (every neighbouring
/// pair's positive weights summing to at most 128, negative ones to at
/// least −128: 7-bit weights always) is packed in bytes on `@dot4sat`
/// (`vpmaddubsw`); one pair beyond that keeps `@dot2`; with VNNI, `@dot4`
/// whatever the weights. The packed product equals the product as written
/// with those weights, bit for bit, on every CPU target here (unsigned
/// activations up to 255, the worst case for saturation).
#[test]
fn weights_known_to_fit_take_vpmaddubsw() {
    use texc_compiler::target::lookup;
    use texc_runtime::{DType, Tensor};
    use texc_schedules::dot4::pack_products;
    let (m, k, n) = (7, 70, 37);
    let src = gemm(m, k, n, "u8");
    // Weights in −64..=64, pairs of 64 + 64 included.
    let fitting: Vec<i8> = (0..n * k).map(|i| if i < 2 { 64 } else { ((i * 37 % 129) - 64) as i8 }).collect();
    let packed = |weights: &[i8], target: &str| {
        let mut p = program(&src);
        let known = |name: &str| (name == "W").then_some(weights);
        assert_eq!(pack_products(&mut p, lookup(target).expect("a target"), &known), 1);
        p
    };
    let print = texc_compiler::print::print_program;
    for target in ["x86-avx2", "x86-avx512"] {
        let text = print(&packed(&fitting, target));
        assert!(text.contains("@dot4sat(0i32, ") && text.contains("W.q4: i32[18, 37]"), "{target}:\n{text}");
    }
    let mut beyond = fitting.clone();
    (beyond[2 * k as usize + 10], beyond[2 * k as usize + 11]) = (100, 29);
    let text = print(&packed(&beyond, "x86-avx2"));
    assert!(text.contains("@dot2(") && !text.contains("@dot4sat"), "{text}");
    let mut mixed = fitting.clone();
    mixed[4..8].copy_from_slice(&[0, 127, -128, 0]);
    assert!(print(&packed(&mixed, "x86-avx2")).contains("@dot4sat("));
    let text = print(&packed(&beyond, "x86-avx2-vnni"));
    assert!(text.contains("@dot4(") && !text.contains("@dot4sat"), "{text}");
    // A long row (200 columns) runs as a micro-kernel whose step holds the
    // product and the ones beside its accumulators: on AVX2's 16 registers
    // 5 rows of 2 vectors, not 6.
    // (10 rows: blocks of 5 with no short last block, which fewer rows take.)
    let wide_src = gemm(10, k, 200, "u8");
    let wide: Vec<i8> = (0..200 * k).map(|i| ((i * 37 % 129) - 64) as i8).collect();
    let mut p = program(&wide_src);
    let known = |name: &str| (name == "W").then_some(&wide[..]);
    assert_eq!(pack_products(&mut p, lookup("x86-avx2").expect("a target"), &known), 1);
    let loops = texc_schedules::ir::print(&legal_loops("x86-avx2", &p));
    assert!(loops.contains("acc: i32[5, 16]") && !loops.contains("acc: i32[6, 16]"), "{loops}");
    // Bit-exact against the product as written, with activations of 255 and random ones.
    let written = program(&src);
    for weights in [&fitting, &mixed] {
        let p = packed(weights, "x86-avx2");
        let w = Tensor::from_i64(
            DType::I8,
            vec![n as usize, k as usize],
            &weights.iter().map(|&x| i64::from(x)).collect::<Vec<_>>(),
        );
        for a in [vec![255i64; (m * k) as usize], (0..m * k).map(|i| i * 97 % 256).collect()] {
            let a = Tensor::from_i64(DType::U8, vec![m as usize, k as usize], &a);
            let files = || [("A".to_string(), a.clone()), ("W".to_string(), w.clone())].into_iter().collect();
            let args = |p: &Program| interp::bind_args(p, files(), &[], 0).expect("binds");
            let want = interp::run(&written, args(&written)).expect("interp");
            assert_eq!(interp::run(&p, args(&p)).expect("interp")[0].bytes(), want[0].bytes(), "the evaluator");
            for target in cpu_targets().into_iter().filter(|t| t.has_intrinsic(texc_compiler::ops::Intrinsic::Dot4Sat))
            {
                let f = legal_loops(target.name, &p);
                let code = texc_tests::compile_loops(target, &f).unwrap_or_else(|e| panic!("{target}: {e}"));
                assert_eq!(code.run(args(&p)).expect("runs")[0].bytes(), want[0].bytes(), "{target}: not bit-exact");
            }
        }
    }
}

/// AMX tiles (`x86-avx512-amx`): matrix products become `amx_dpbusd`
/// blocks, which the loop evaluator computes as the statement defines them
/// and which match the interpreter bit for bit on any machine; on a CPU
/// with AMX-INT8 the machine code does too (else that part is skipped,
/// saying why). The sizes leave a block's last rows and columns short and
/// pad the sum to 64 bytes; `i8` activations are offset; a requantized
/// product's sum is tiled and its epilogue stays exact. Convolutions,
/// whose unsigned operand runs along the columns, keep `vpdpbusd`.
#[test]
fn matrix_products_run_on_amx_tiles() {
    let amx = "x86-avx512-amx";
    let runs = texc_compiler::target::lookup(amx).expect("known").check_runs_here();
    if let Err(why) = &runs {
        eprintln!("skipped running AMX code: {why}");
    }
    let cases = [
        ("u8 × i8 33×67×130", gemm(33, 67, 130, "u8")),
        ("u8 × i8 16×64×16", gemm(16, 64, 16, "u8")),
        ("i8 × i8 9×40×19", gemm(9, 40, 19, "i8")),
        ("requantized 40×29×35", qlinear(40, 29, 35)),
    ];
    for (name, src) in cases {
        let p = program(&src);
        let f = legal_loops(amx, &p);
        let text = texc_schedules::ir::print(&f);
        assert!(text.contains("amx_dpbusd"), "{name}: no tile product\n{text}");
        // The accumulators' zeroing is the tile product's own (`tilezero`;
        // a last, partial block of columns inside a group of blocks keeps
        // a nest zeroing the rest of its block).
        let accumulating = text.lines().any(|l| l.contains("amx_dpbusd") && l.contains(" += "));
        assert!(text.contains("@ (0, 1) = ") && !accumulating, "{name}:\n{text}");
        tiles_exact(name, &p, &f, [3, 11], runs.is_ok());
    }
    // Sums that fill under half of their 64-byte rows (8 channels: 8 of
    // 64 bytes), and blocks under half a tile of rows, keep `vpdpbusd`.
    for (name, src) in [("8 channels", conv(8, 32, 9)), ("5 rows", gemm(5, 64, 32, "u8"))] {
        let text = texc_schedules::ir::print(&legal_loops(amx, &program(&src)));
        assert!(
            !text.contains("amx_dpbusd") && text.contains("@dot4("),
            "{name}:
{text}"
        );
    }
}

/// Convolutions whose channels fill the tiles' rows run on AMX tiles:
/// those of stride 1 directly (rows along the output row `x`, columns
/// along the filters, the filter's rows and columns summed around one tile
/// product whose accumulators stay in tiles); those of stride 2 and those
/// on maps of rows shorter than 8 with the input's positions gathered into
/// rows (`X.q4.rows`); those that make at least 128 products per input
/// byte (the input's pack moves its channels last) and sum at least 256
/// per output. Odd sizes: 67 channels (17 words, padded to 32), 45
/// filters (a block of 13), rows of 35 (a block of 3), i8 activations
/// (offset by 128), a batch of 2.
#[test]
fn convolutions_run_on_amx_tiles() {
    let amx = "x86-avx512-amx";
    let runs = texc_compiler::target::lookup(amx).expect("known").check_runs_here();
    if let Err(why) = &runs {
        eprintln!("skipped running AMX code: {why}");
    }
    let cases = [
        ("3×3, 64 → 40 channels, 20²", conv(64, 40, 20)),
        ("3×3, 67 → 45 channels, 37²", conv(67, 45, 37)),
        ("3×3, i8 activations", conv(64, 33, 12).replace("X: u8", "X: i8")),
        ("3×3 stride 2, 64 → 70 channels, 17²", strided(64, 70, 17)),
        ("3×3 stride 2, i8 activations", strided(64, 90, 12).replace("X: u8", "X: i8")),
        ("3×3, 7² map", conv(96, 32, 9)),
        (
            "1×1 stride 2, 260 → 460 channels, a batch of 2",
            "kernel q(X: u8[2, 260, 15, 15], W: i8[460, 260]) -> Y: i32[2, 460, 8, 8] {\n\
             \x20   Y[n, f, y, x] = sum[c](i32(X[n, c, 2 * y, 2 * x]) * i32(W[f, c]));\n}\n"
                .to_string(),
        ),
        (
            "1×1, 260 → 144 channels",
            "kernel q(X: u8[2, 260, 9, 18], W: i8[144, 260]) -> Y: i32[2, 144, 9, 18] {\n\
             \x20   Y[n, f, y, x] = sum[c](i32(X[n, c, y, x]) * i32(W[f, c]));\n}\n"
                .to_string(),
        ),
    ];
    for (name, src) in cases {
        let p = program(&src);
        let f = legal_loops(amx, &p);
        let text = texc_schedules::ir::print(&f);
        assert!(text.contains("amx_dpbusd"), "{name}: no tile product\n{text}");
        tiles_exact(name, &p, &f, [5, 8], runs.is_ok());
    }
    for (name, src, gathered) in [("stride 1", conv(64, 40, 20), false), ("stride 2", strided(64, 70, 17), true)] {
        let text = texc_schedules::ir::print(&legal_loops(amx, &program(&src)));
        assert_eq!(text.contains(".rows"), gathered, "{name}:\n{text}");
    }
    // A 1×1 convolution to 48 filters makes 48 products per input byte
    // (packing its input channels last would cost more than the tiles
    // save); one from 96 channels sums 96 products per output.
    let one = |c: i64, f: i64| {
        format!(
            "kernel q(X: u8[1, {c}, 9, 18], W: i8[{f}, {c}]) -> Y: i32[1, {f}, 9, 18] {{\n\
             \x20   Y[n, f, y, x] = sum[c](i32(X[n, c, y, x]) * i32(W[f, c]));\n}}\n"
        )
    };
    for (name, src) in [("48 filters", one(260, 48)), ("96 channels", one(96, 300))] {
        let text = texc_schedules::ir::print(&legal_loops(amx, &program(&src)));
        assert!(!text.contains("amx_dpbusd") && text.contains("@dot4("), "{name}:\n{text}");
    }
}

/// A 3×3 convolution of stride 2 (`hw` input rows and columns).
fn strided(c: i64, k: i64, hw: i64) -> String {
    let o = (hw - 3) / 2 + 1;
    conv(c, k, hw)
        .replace("y + r, x + s", "2 * y + r, 2 * x + s")
        .replace(&format!("{0}, {0}]", hw - 2), &format!("{o}, {o}]"))
}

/// The loop nests `f` of `p` bit-exact against the interpreter in the loop
/// evaluator, and as AMX machine code where it `runs`, for each seed.
fn tiles_exact(name: &str, p: &Program, f: &LoopFunc, seeds: [u64; 2], runs: bool) {
    for seed in seeds {
        let args = || interp::bind_args(p, Default::default(), &[], seed).expect("binds");
        let want = interp::run(p, args()).expect("interp");
        let evaluated = texc_schedules::eval::run(f, args()).expect("evaluates");
        for (g, w) in evaluated.iter().zip(&want) {
            assert_eq!(g.bytes(), w.bytes(), "{name} (seed {seed}): the loop evaluator is not bit-exact");
        }
        if runs {
            let target = texc_compiler::target::lookup("x86-avx512-amx").expect("known");
            let k = texc_tests::compile_loops(target, f).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (g, w) in k.run(args()).expect("runs").iter().zip(&want) {
                assert_eq!(g.bytes(), w.bytes(), "{name} (seed {seed}): AMX code is not bit-exact");
            }
        }
    }
}

/// `tensorize ... with amx_dpbusd` is refused, with the reason, on targets
/// without AMX and on loops longer than a block.
#[test]
fn amx_tile_products_need_the_target_and_a_block() {
    let src = |target: &str, rows: i64| {
        format!(
            "kernel q(A: u8[64, 64], W: i8[64, 64]) -> C: i32[64, 64] {{\n\
             \x20   C[i, j] = sum[k](i32(A[i, k]) * i32(W[k, j]));\n}}\n\
             schedule q for {target} {{\n    split C.i by {rows} -> (io, ii);\n    split C.j by 32 -> (jo, ji);\n    \
             reorder C(io, jo, k, ii, ji);\n    tensorize C(ii, ji, k) with amx_dpbusd;\n}}\n"
        )
    };
    let err = |target: &str, rows: i64| match texc_tests::load_text(target, "t.tex", &src(target, rows), None) {
        Ok((mut pl, k)) => {
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            match pl.loops(k, p) {
                Ok(_) => String::new(),
                Err(e) => texc_tests::rendered(&pl, e),
            }
        }
        Err(e) => e,
    };
    let vnni = err("x86-avx512-vnni", 32);
    assert!(vnni.contains("does not have AMX-INT8"), "{vnni}");
    let long = err("x86-avx512-amx", 64);
    assert!(long.contains("at most 32"), "{long}");
}

/// A costly activation between two products (a quantized encoder's GELU,
/// `erf` and a requantization per element) is not computed inside the
/// next product's pack where that pack's parts are two or four elements of
/// a row (it ran in vectors of that many lanes: BERT-base's layer 27.8 →
/// 23.0 ms on AVX2): its vectors stay at least 8 lanes wide; results
/// bit-exact.
#[test]
fn costly_activations_are_not_computed_in_narrow_packs() {
    let text = |m: i64, k: i64, n: i64| {
        format!(
            "kernel q(A: f32[{m}, {k}], W: i8[{n}, {k}]) -> C: i32[{m}, {n}] {{\n\
             \x20   Q[i, k] = u8(clamp(round(erf(A[i, k]) * 100.0) + 128.0, 0.0, 255.0));\n\
             \x20   C[i, j] = sum[k](i32(Q[i, k]) * i32(W[j, k]));\n}}\n"
        )
    };
    // BERT's second feed-forward product: 128 tokens, 3072 → 768.
    let p = program(&text(128, 3072, 768));
    for target in ["x86-avx2", "x86-avx512", "x86-avx2-vnni", "x86-avx512-vnni"] {
        let loops = texc_schedules::ir::print(&legal_loops(target, &p));
        let narrow: Vec<&str> = loops
            .lines()
            .filter(|l| l.trim_start().starts_with("for Q.") && l.ends_with("vectorized:"))
            .filter(|l| {
                let extent =
                    l.rsplit("..").next().and_then(|e| e.split(' ').next()).and_then(|e| e.parse::<i64>().ok());
                extent.is_some_and(|e| e < 8)
            })
            .collect();
        assert!(narrow.is_empty(), "{target}: the activation in narrow vectors: {narrow:?}");
    }
    check_exact("erf before a product", &program(&text(9, 70, 24)));
}

/// A 1×1 convolution over a 7×7 map with its bias and requantization, at
/// depths no group of four divides: its 49 columns are 16-lane vectors
/// thrice and one lane (with VNNI, lane 0 of a 4-lane `vpdpbusd`:
/// texc/tests/cli.rs), and each block's sums start from the bias (one
/// addition fewer per output); bit-exact on every CPU target.
#[test]
fn one_column_and_biased_sums_are_exact() {
    for c in [40, 21] {
        let p = program(&format!(
            "kernel c7(X: u8[1, {c}, 7, 7], W: i8[96, {c}], b: i32[96], s: f32[96]) -> Y: u8[1, 96, 7, 7] {{\n\
             \x20   Y[n, f, y, x] = u8(clamp(round(f32(sum[c](i32(X[n, c, y, x]) * i32(W[f, c])) + b[f]) * s[f] * 0.001), 0.0, 255.0));\n}}\n"
        ));
        let text = texc_schedules::ir::print(&legal_loops("x86-avx512-vnni", &p));
        assert!(text.contains("vectorized:") && text.contains(" in 0..1 vectorized:"), "one column alone:\n{text}");
        assert!(text.contains("acc[f.r, y.x.o, y.x.v] = b["), "sums start from the bias:\n{text}");
        check_exact(&format!("c7 at depth {c}"), &p);
    }
}

/// A residual sum of two dequantized tensors, requantized, as the ONNX
/// importer writes it — each node's `f32` output a temporary — computes the
/// same bytes on every target as the interpreter: inlined, each temporary
/// is cast to `f32` where it was stored, so the interpreter rounds it there
/// and the code does not fuse its product into the next addition (uncast,
/// 174 of 4096 outputs were a step off on every compiled target).
#[test]
fn inlined_float_temporaries_round_as_stored() {
    let p = program(
        "kernel res(A: u8[4096], B: u8[4096]) -> Y: u8[4096] {\n\
         \x20   DA[i] = f32(i32(A[i]) - 123) * 0.023;\n\
         \x20   DB[i] = f32(i32(B[i]) - 131) * 0.026;\n\
         \x20   T[i] = DA[i] + DB[i];\n\
         \x20   Y[i] = u8(clamp(round(f32(T[i] / 0.018)), 0.0, 255.0));\n}\n",
    );
    let text = texc_schedules::ir::print(&legal_loops("x86-avx512", &p));
    assert!(!text.contains("temp "), "the temporaries inlined:\n{text}");
    assert!(text.contains("f32(f32(f32(i32(A["), "each temporary rounded where it was stored:\n{text}");
    check_exact("res", &p);
}

/// Inverted residual blocks of MobileNetV2 in integers at `hw × hw`, one
/// after another (`blocks` of them, the last writing `Y`): a 1 × 1
/// expansion of `c` channels to `e`, its zero padding, a 3 × 3 depthwise
/// convolution of stride `stride` and a 1 × 1 projection back to `c`, each
/// requantized to `u8`. `extra` is appended to the kernel's body, writing
/// `Z` (an `i32` of the depthwise's shape) where it is not empty.
fn inverted_blocks(blocks: usize, c: i64, e: i64, hw: i64, stride: i64, extra: &str) -> String {
    let o = (hw - 1) / stride + 1;
    let out = if extra.is_empty() { String::new() } else { format!(", Z: i32[1, {e}, {o}, {o}]") };
    let mut body = String::new();
    for b in 0..blocks {
        let (x, y) = (if b == 0 { "X".to_string() } else { format!("Y{}", b - 1) }, format!("Y{b}"));
        let y = if b + 1 == blocks { "Y".to_string() } else { y };
        let (size, p) = (if b == 0 { hw } else { o }, if b == 0 { stride } else { 1 });
        let q = (size - 1) / p + 1;
        body += &format!(
            "    T{b}[n, f, y, x] = u8(clamp(round(f32(f32(sum[k](i32({x}[n, k, y, x]) * i32(We[f, k])) + be[f]) * 0.0007)), 0.0, 255.0));\n\
             \x20   P{b}[n in 0..1, f in 0..{e}, y in 0..{pd}, x in 0..{pd}] = select(y >= 1 && y < {s1} && x >= 1 && x < {s1}, T{b}[n, f, y - 1, x - 1], u8(0));\n\
             \x20   D{b}[n, f, y in 0..{q}, x in 0..{q}] = u8(clamp(round(f32(f32(sum[g in 0..1, r in 0..3, s in 0..3](i32(P{b}[n, f + g, y * {p} + r, x * {p} + s]) * i32(Wd[f, g, r, s])) + bd[f]) * 0.0021)), 0.0, 255.0));\n\
             \x20   {y}[n, f, y, x] = u8(clamp(round(f32(f32(sum[k](i32(D{b}[n, k, y, x]) * i32(Wp[f, k])) + bp[f]) * 0.0003)), 0.0, 255.0));\n",
            pd = size + 2,
            s1 = size + 1,
        );
    }
    format!(
        "kernel blk(X: u8[1, {c}, {hw}, {hw}], We: i8[{e}, {c}], be: i32[{e}], Wd: i8[{e}, 1, 3, 3], bd: i32[{e}], \
         Wp: i8[{c}, {e}], bp: i32[{c}]) -> (Y: u8[1, {c}, {o}, {o}]{out}) {{\n{body}{extra}}}\n"
    )
}

/// One such block of stride 1.
fn inverted_block(c: i64, e: i64, hw: i64, extra: &str) -> String {
    inverted_blocks(1, c, e, hw, 1, extra)
}

/// `p` after `texc_schedules::channels_last` for `target`, the weights and
/// biases constant; the number of depthwise convolutions it moved.
fn stored_channels_last(p: &Program, target: &str) -> (Program, usize) {
    let (q, tops) = channels_last_and_tops(p, target);
    (q, tops.len())
}

/// The weights and biases of [`inverted_blocks`], which a model's would be.
fn weight(p: &Program, t: texc_compiler::tir::TensorId) -> bool {
    let weights = ["We", "be", "Wd", "bd", "Wp", "bp"];
    p.tensors.get(t.0 as usize).is_some_and(|d| weights.contains(&&*d.name))
}

fn channels_last_and_tops(p: &Program, target: &str) -> (Program, Vec<texc_compiler::tir::TensorId>) {
    let mut q = p.clone();
    let target = texc_compiler::target::lookup(target).expect("a target");
    let tops = texc_schedules::channels_last::channels_last(&mut q, target, &|t| weight(p, t));
    (q, tops)
}

/// `p` stored channels last and packed as the pipeline does before
/// constants fold: products packed, then `filters_last` given the products
/// `channels_last` named.
fn packed_channels_last(p: &Program, target: &str) -> Program {
    let (mut q, tops) = channels_last_and_tops(p, target);
    let t = texc_compiler::target::lookup(target).expect("a target");
    texc_schedules::dot4::pack_products(&mut q, t, &texc_schedules::dot4::nothing_known);
    let movable = |u| weight(p, u);
    texc_schedules::filters_last::filters_last(&mut q, t, &movable, &|u| tops.contains(&u));
    q
}

/// The interpreter computes the same bytes for `p` and `q`.
fn same_outputs(p: &Program, q: &Program) {
    for seed in [5, 9] {
        let args = |p: &Program| interp::bind_args(p, Default::default(), &[], seed).expect("binds");
        let (want, got) = (interp::run(p, args(p)).expect("interp"), interp::run(q, args(q)).expect("interp"));
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.bytes(), w.bytes(), "the same bytes, stored elsewhere");
        }
    }
}

/// A depthwise convolution on rows shorter than three quarters of its
/// vectors, whose output a product packs into AMX tile rows, is stored
/// channels last, with the padding copy before it: its vectors then run
/// along the channels, and the projection packs its tile rows from
/// contiguous bytes. The expansion that makes its channels is left to
/// `filters_last`, which computes it filters-last for such a reader, its
/// copy back inlined. The interpreter computes the same bytes before and
/// after, and every CPU target the bytes of the interpreter, at maps of 7
/// and 5, channels that leave a tail of a vector, stride 2, and two blocks
/// in a row (the filters' copies inserted before each).
#[test]
fn short_depthwise_rows_are_stored_channels_last() {
    const AMX: &str = "x86-avx512-amx";
    for (c, e, hw) in [(128, 256, 7), (136, 264, 5)] {
        let p = program(&inverted_block(c, e, hw, ""));
        let (q, moved) = stored_channels_last(&p, AMX);
        assert_eq!(moved, 1);
        let tir = texc_compiler::print::print_program(&q);
        let pad = hw + 2;
        assert!(tir.contains(&format!("temp P0: u8[1, {pad}, {pad}, {e}]")), "{tir}");
        assert!(tir.contains(&format!("temp D0: u8[1, {hw}, {hw}, {e}]")), "{tir}");
        assert!(tir.contains(&format!("temp T0: u8[1, {e}, {hw}, {hw}]")), "the expansion is filters_last's:\n{tir}");
        assert!(tir.contains("Wd.f["), "the filters read with their channels last:\n{tir}");
        same_outputs(&p, &q);
        let packed = packed_channels_last(&p, AMX);
        let loops = texc_schedules::ir::print(&legal_loops(AMX, &packed));
        // Stored as computed, or (`texc_schedules::forward`, where the
        // channels fill whole vectors of 64 bytes, so that the padding
        // copy is one loop) stored by its accumulators into the padding
        // `P0` where the copy would have.
        let stored = format!("temp T0.t: u8[1, {}, {e}]", hw * hw);
        assert!(!loops.contains("temp T0: "), "filters-last:\n{loops}");
        assert_eq!(loops.contains(&stored), e % 64 != 0, "read as stored, or forwarded:\n{loops}");
        assert!(loops.contains("amx_dpbusd"), "the projection on tiles:\n{loops}");
        check_exact(&format!("block {c} → {e} at {hw}², channels last"), &q);
        let amx = |t: &Target| t.has_amx_int8();
        check_exact_on(&format!("block {c} → {e} at {hw}², channels last, packed"), &packed, amx);
    }
    for (hw, stride) in [(7, 1), (13, 2)] {
        let p = program(&inverted_blocks(2, 128, 256, hw, stride, ""));
        let (q, moved) = stored_channels_last(&p, AMX);
        assert_eq!(moved, 2, "two blocks from {hw}², the first of stride {stride}");
        same_outputs(&p, &q);
        check_exact(&format!("two blocks from {hw}², the first of stride {stride}, channels last"), &q);
    }
}

/// What `channels_last` leaves as it is: a projection on `vpdpbusd` (which
/// packs its activations along their rows: channels last would gather
/// them), rows that fill AVX2's 8 lanes or 14 of 16, targets without
/// packed products, filters that are arguments (a transposed copy per
/// call), a depthwise output read elementwise or written out, an expansion
/// or a padding read twice, and an expansion on AMX tiles (its write-back
/// keeps the rows last).
#[test]
fn channels_last_moves_whole_chains_only() {
    const AMX: &str = "x86-avx512-amx";
    let kept = |src: &str, target: &str| stored_channels_last(&program(src), target).1 == 0;
    let block = inverted_block(128, 256, 7, "");
    assert_eq!(stored_channels_last(&program(&block), AMX).1, 1, "moved on tiles");
    assert!(kept(&block, "x86-avx512-vnni"), "a projection on vpdpbusd");
    assert!(kept(&block, "x86-avx2-vnni"), "7 of 8 lanes");
    assert!(kept(&block, "cranelift"), "no packed products");
    assert!(kept(&inverted_block(128, 256, 14, ""), AMX), "rows of 14 of 16");
    let read_elementwise = "    Z[n, f, y, x] = i32(D0[n, f, y, x]) + 1;\n";
    assert!(kept(&inverted_block(128, 256, 7, read_elementwise), AMX), "the depthwise read elementwise");
    let expansion_twice = "    Z[n, f, y, x] = i32(T0[n, f, y, x]);\n";
    assert!(kept(&inverted_block(128, 256, 7, expansion_twice), AMX), "the expansion read twice");
    let padding_twice = "    Z[n, f, y, x] = i32(P0[n, f, y, x]);\n";
    assert!(kept(&inverted_block(128, 256, 7, padding_twice), AMX), "the padding read twice");
    let written_out = block
        .replace("-> (Y: u8[1, 128, 7, 7])", "-> (Y: u8[1, 128, 7, 7], D0: u8[1, 256, 7, 7])")
        .replace("D0[n, f, y in 0..7, x in 0..7]", "D0[n, f, y, x]");
    assert!(written_out.contains("D0: u8"), "{written_out}");
    assert!(kept(&written_out, AMX), "the depthwise an output");
    assert!(kept(&inverted_block(256, 256, 7, ""), AMX), "an expansion on tiles");
    let mut q = program(&block);
    let t = texc_compiler::target::lookup(AMX).expect("a target");
    assert!(texc_schedules::channels_last::channels_last(&mut q, t, &|_| false).is_empty(), "filters as arguments");
    // Float products are the float region's (`schedules::short_float_depthwise_regions_are_stored_channels_last`):
    // its expansion and projection returned, not the chain's one top.
    let float = block.replace("i32(", "f32(").replace(": i8[", ": f32[").replace(": i32[", ": f32[");
    assert_eq!(stored_channels_last(&program(&float), AMX).1, 2, "float products: the region's top and bottom");
}
