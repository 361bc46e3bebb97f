//! Snapshots of every IR stage for every example and std.nn operator, and
//! of one diagnostic of each kind (tests/diagnostics/*.tex).

use texc_compiler::Bindings;
use texc_tests::{check_text, compile, kernels_of_file, root};

/// Example file names (`conv2d.tex`, ...).
fn example_files() -> Vec<String> {
    texc_tests::example_files().iter().map(|f| f.trim_start_matches("examples/").to_string()).collect()
}

#[test]
fn ast_of_examples_and_std() {
    for f in example_files() {
        let text = std::fs::read_to_string(root().join("examples").join(&f)).expect("read");
        let ast = texc_grammar::parse(texc_grammar::FileId(0), &text).expect("examples parse");
        insta::assert_snapshot!(format!("ast_{}", f.trim_end_matches(".tex")), texc_grammar::print::print_ast(&ast));
    }
    let ast = texc_grammar::parse(texc_grammar::FileId(0), texc_compiler::session::STD_NN).expect("std parses");
    // One snapshot keeps the byte spans (`emit --stage ast --spans`), so that source positions stay pinned.
    insta::assert_snapshot!("ast_std_nn", texc_grammar::print::print_ast_spanned(&ast));
}

#[test]
fn tir_of_examples() {
    for f in example_files() {
        let (mut pl, kernels) = kernels_of_file("interp", &format!("examples/{f}"));
        let mut out = String::new();
        for k in kernels {
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            out.push_str(&texc_compiler::print::print_program(&p));
        }
        insta::assert_snapshot!(format!("tir_{}", f.trim_end_matches(".tex")), out);
    }
}

#[test]
fn tir_of_std_operators() {
    let out: String =
        texc_tests::std_op_programs(7).iter().map(|(_, p)| texc_compiler::print::print_program(p)).collect();
    insta::assert_snapshot!("tir_std_ops", out);
}

#[test]
fn one_snapshot_per_diagnostic() {
    let dir = root().join("tests/diagnostics");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").path()).collect();
    files.sort();
    assert!(files.len() >= 25, "expected a diagnostic case per kind");
    for path in files {
        let name = path.file_stem().expect("stem").to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).expect("read");
        let shown = format!("tests/diagnostics/{name}.tex");
        let err = check_text(&shown, &text).expect_err(&format!("{name} must be rejected"));
        assert!(err.contains(&format!("{shown}:")), "{name}: no file:line:col in\n{err}");
        insta::assert_snapshot!(format!("diag_{name}"), err);
    }
}

/// What `texc check` prints for files that pass: the warnings (accesses in
/// bounds only under a condition on the sizes) and the summary of what was
/// verified (tests/check/*.tex).
#[test]
fn one_snapshot_per_check_summary() {
    let dir = root().join("tests/check");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").path()).collect();
    files.sort();
    assert!(files.len() >= 4, "expected the check cases");
    for path in files {
        let name = path.file_stem().expect("stem").to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).expect("read");
        let shown = format!("tests/check/{name}.tex");
        let out = texc_tests::check_report(&shown, &text).unwrap_or_else(|e| panic!("{name} must pass:\n{e}"));
        assert!(out.contains("kernel"), "{name}: no summary in\n{out}");
        insta::assert_snapshot!(format!("check_{name}"), out);
    }
}

#[test]
fn graph_of_examples() {
    let mut out = String::new();
    for f in example_files() {
        let (mut pl, kernels) = kernels_of_file("interp", &format!("examples/{f}"));
        for k in kernels {
            let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
            out.push_str(&texc_compiler::graph::print_graph(&p));
        }
    }
    insta::assert_snapshot!("graph_examples", out);
}

#[test]
fn emit_is_deterministic() {
    let a = compile("examples/conv_bn_relu.tex", None, &Bindings::default()).expect("compiles");
    let b = compile("examples/conv_bn_relu.tex", None, &Bindings::default()).expect("compiles");
    assert_eq!(texc_compiler::print::print_program(&a), texc_compiler::print::print_program(&b));
}

/// The loop nests `texc emit --stage loops` prints: every example and bench
/// kernel on x86-avx2 (its own schedule or the default), and a set of
/// kernels on the targets whose vector width differs.
#[test]
fn loops_of_examples_and_benches() {
    let mut files = texc_tests::example_files();
    files.extend(["benches/matmul.tex", "benches/layer_norm.tex", "benches/conv_layer.tex"].map(String::from));
    let wide = ["examples/softmax.tex", "examples/matmul.tex", "benches/matmul.tex", "benches/layer_norm.tex"];
    for target in ["x86-avx2", "x86-avx512", "cranelift"] {
        for file in files.iter().filter(|f| target == "x86-avx2" || wide.contains(&f.as_str())) {
            let (mut pl, kernels) = kernels_of_file(target, file);
            let mut out = String::new();
            for k in kernels {
                let (_, loops) =
                    pl.build(k, &Bindings::default()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
                out.push_str(&texc_schedules::ir::print(&loops.lowered));
            }
            let stem = file.trim_end_matches(".tex").replace('/', "_");
            insta::assert_snapshot!(format!("loops_{target}_{stem}"), out);
        }
    }
}
