//! Products that read their vector operand across its rows
//! (`texc_schedules::transpose`): `x · Wᵀ`, batched and converted forms
//! match the interpreter on every CPU target here at sizes no vector or
//! block divides, and the transposed copy is made only where rows are many.

use texc_compiler::interp;
use texc_compiler::target::TargetKind;
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
    let p = program(text);
    let args = || interp::bind_args(&p, Default::default(), &[], 5).expect("binds");
    let want = interp::run(&p, args()).expect("interp");
    let (run, skipped) = texc_tests::runnable_targets();
    for why in skipped {
        eprintln!("skipped: {why}");
    }
    for target in run.into_iter().filter(|t| t.kind == TargetKind::Cpu) {
        let (text, f) = loops_text(target.name, &p);
        assert_eq!(text.contains("W.t"), transposed, "{name} on {target}:\n{text}");
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
