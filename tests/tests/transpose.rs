//! Products that read their vector operand across its rows
//! (`texc_schedules::transpose`): `x · Wᵀ`, batched and converted forms
//! match the interpreter on every CPU target here at sizes no vector or
//! block divides, and the transposed copy is made only where rows are many.

use texc_compiler::interp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::{Bindings, Program};

fn program(text: &str) -> Program {
    let (mut pl, k) = texc_tests::load_text("interp", "t.tex", text, None).unwrap_or_else(|e| panic!("{e}"));
    texc_tests::specialize(&mut pl, k, &Bindings::default())
}

fn loops_text(target: &str, p: &Program) -> (String, texc_schedules::LoopFunc) {
    let mut pl = texc_tests::pipeline(target);
    let f = pl.default_loops(p.clone()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e))).legal;
    (texc_schedules::ir::print(&f), f)
}

fn check(name: &str, text: &str, transposed: bool) {
    check_layout(name, text, "W.t", &|_| transposed);
}

/// `text` matches the interpreter on every CPU target here, and its loops
/// hold `marker` (a tensor the layout pass made) where `made` says.
fn check_layout(name: &str, text: &str, marker: &str, made: &dyn Fn(&Target) -> bool) {
    let p = program(text);
    let args = || interp::bind_args(&p, Default::default(), &[], 5).expect("binds");
    let want = interp::run(&p, args()).expect("interp");
    let (run, skipped) = texc_tests::runnable_targets();
    for why in skipped {
        eprintln!("skipped: {why}");
    }
    for target in run.into_iter().filter(|t| t.kind == TargetKind::Cpu) {
        let (text, f) = loops_text(target.name, &p);
        assert_eq!(text.contains(marker), made(target), "{name} on {target}:\n{text}");
        let k = texc_tests::compile_loops(target, &f).unwrap_or_else(|e| panic!("{name} on {target}: {e}"));
        let got = k.run(args()).expect("runs");
        for (g, w) in got.iter().zip(&want) {
            let (g, w) = (g.to_f64(), w.to_f64());
            let scale = w.iter().fold(0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
            let err = g.iter().zip(&w).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
            assert!(err <= 1e-5, "{name} on {target}: relative error {err:e}");
        }
        eprintln!("{name} on {target}: matches");
    }
}

#[test]
fn transposed_products_match_the_interpreter() {
    for (m, k, n) in [(17, 13, 21), (64, 70, 33), (16, 1, 5)] {
        let text = format!(
            "kernel l(X: f32[{m}, {k}], W: f32[{n}, {k}]) -> Y: f32[{m}, {n}] {{\n\
             \x20   Y[i, j] = max(sum[k](X[i, k] * W[j, k]) + 0.5, 0.0);\n}}\n"
        );
        check(&format!("x·Wᵀ {m}×{k}×{n}"), &text, true);
    }
    let batched = "kernel l(X: f32[3, 20, 9], W: f32[3, 11, 9]) -> Y: f32[3, 20, 11] {\n\
                   \x20   Y[b, i, j] = sum[k](X[b, i, k] * W[b, j, k]);\n}\n";
    check("batched", batched, true);
    let half = "kernel l(X: f32[18, 24], W: f16[10, 24]) -> Y: f32[18, 10] {\n\
                \x20   Y[i, j] = sum[k](X[i, k] * f32(W[j, k]));\n}\n";
    check("f16 weights", half, true);
}

#[test]
fn few_rows_keep_reading_along_rows() {
    let gemv = "kernel l(X: f32[1, 40], W: f32[30, 40]) -> Y: f32[1, 30] {\n\
                \x20   Y[i, j] = sum[k](X[i, k] * W[j, k]);\n}\n";
    check("matrix-vector", gemv, false);
}

/// A float convolution over rows too short for the vectors (`filters_last`):
/// 7-wide rows of 16-lane vectors, 576 products per output, filters read
/// `f` last — computed as `Y.t[n, y, x, f]` on AVX-512 (7 of 8 AVX2 lanes
/// are full enough), bit for bit the same sums. Shallow sums stay as
/// written. A 1×1 convolution's 7×7 map, which the schedule fuses into rows
/// of 49 (49 of 64 AVX-512 lanes), is computed filters-last too, its map
/// one axis (`Y.t[n, p, k]`: rows of the block over the whole map); a 14×14
/// map (196 of 208 lanes) and AVX2's 49 of 56 stay as written.
#[test]
fn short_float_rows_run_along_the_filters_where_the_sums_are_deep() {
    let conv = |c: i64, f: i64| {
        format!(
            "kernel c(X: f32[1, {c}, 9, 9], W: f32[{c}, 3, 3, {f}]) -> Y: f32[1, {f}, 7, 7] {{\n\
             \x20   Y[n, k, y, x] = max(sum[c, r, s](X[n, c, y + r, x + s] * W[c, r, s, k]), 0.0);\n}}\n"
        )
    };
    let avx512 = |text: &str| loops_text("x86-avx512", &program(text)).0.contains("Y.t");
    assert!(avx512(&conv(64, 48)), "576 products per output");
    assert!(!avx512(&conv(8, 48)), "72 products per output");
    assert!(!loops_text("x86-avx2", &program(&conv(64, 48))).0.contains("Y.t"), "7 of 8 lanes");
    let pointwise = |hw: i64| {
        format!(
            "kernel c(X: f32[1, 600, {hw}, {hw}], W: f32[600, 40]) -> Y: f32[1, 40, {hw}, {hw}] {{\n\
             \x20   Y[n, k, y, x] = max(sum[c](X[n, c, y, x] * W[c, k]), 0.0);\n}}\n"
        )
    };
    let (text, _) = loops_text("x86-avx512", &program(&pointwise(7)));
    // (`Y.t.r0`: the sums, before the activation.)
    assert!(text.contains("temp Y.t.r0: f32[1, 49, 40]"), "a 7×7 map is one axis:\n{text}");
    assert!(!avx512(&pointwise(14)), "196 of 208 lanes");
    check_layout("filters-last 3×3", &conv(64, 48), "Y.t", &|t| t.vector_bits >= 512);
    check_layout("filters-last 1×1 on 7×7", &pointwise(7), "Y.t", &|t| t.vector_bits >= 512);
}
