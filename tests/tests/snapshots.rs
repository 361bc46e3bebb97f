//! Snapshots of every IR stage for every example and std.nn operator, and
//! of one diagnostic of each kind (tests/diagnostics/*.tex).

use texc_compiler::{Bindings, Session};
use texc_tests::{check_text, compile, root};

fn example_files() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".tex"))
        .collect();
    v.sort();
    v
}

#[test]
fn ast_of_examples_and_std() {
    for f in example_files() {
        let text = std::fs::read_to_string(root().join("examples").join(&f)).expect("read");
        let ast = texc_grammar::parse(texc_grammar::FileId(0), &text).expect("examples parse");
        insta::assert_snapshot!(format!("ast_{}", f.trim_end_matches(".tex")), texc_grammar::print::print_ast(&ast));
    }
    let ast = texc_grammar::parse(texc_grammar::FileId(0), texc_compiler::session::STD_NN).expect("std parses");
    insta::assert_snapshot!("ast_std_nn", texc_grammar::print::print_ast(&ast));
}

#[test]
fn tir_of_examples() {
    for f in example_files() {
        let mut s = Session::new();
        let m = s.load_root(&root().join("examples").join(&f)).expect("loads");
        let mut out = String::new();
        for i in 0..s.module(m).kernels.len() {
            let k = texc_compiler::KernelRef { module: m as u32, index: i as u32 };
            let p = texc_compiler::build_program(&s, k, &Bindings::default()).expect("specializes at defaults");
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

#[test]
fn graph_of_examples() {
    let mut out = String::new();
    for f in example_files() {
        let mut s = Session::new();
        let m = s.load_root(&root().join("examples").join(&f)).expect("loads");
        for i in 0..s.module(m).kernels.len() {
            let k = texc_compiler::KernelRef { module: m as u32, index: i as u32 };
            let p = texc_compiler::build_program(&s, k, &Bindings::default()).expect("specializes at defaults");
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
