//! `texc emit --stage mlir|mlir-linalg`: deterministic, verified MLIR from
//! `.tex` and `.loops` files when texc is built with the `mlir` feature, and
//! a clear error (exit 1) when it is not. What the export computes is tested
//! by running it (tests/tests/mlir.rs).

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

fn out(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[cfg(feature = "mlir")]
#[test]
fn emit_mlir_prints_the_same_verified_module_every_time() {
    // Large enough for the default schedule's parallel loop (2^15 iterations), with a vector tail.
    let args = ["emit", "examples/softmax.tex", "--stage", "mlir", "--target", "x86-avx2", "--shape", "N=64,D=517"];
    let first = out(&texc(&args));
    assert_eq!(first, out(&texc(&args)), "byte-identical across runs");
    assert!(first.contains("func.func @softmax(%arg0: memref<64x517xf32>, %arg1: memref<64x517xf32>)"), "{first}");
    for op in ["scf.parallel", "scf.for", "vector.load", "vector.maskedload", "vector.store", "math.exp"] {
        assert!(first.contains(op), "{op} in\n{first}");
    }
    let linalg = ["emit", "examples/softmax.tex", "--stage", "mlir-linalg", "--shape", "N=5,D=21"];
    let l = out(&texc(&linalg));
    assert_eq!(l, out(&texc(&linalg)));
    assert!(l.contains("iterator_types = [\"parallel\", \"reduction\"]"), "{l}");
    assert!(l.contains("-> tensor<5x21xf32>"), "{l}");
    // A .loops file exports its loop nest; it has no tensor IR for linalg.
    let dir = common::scratch("mlir-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let loops = dir.join("s.loops");
    let nest = out(&texc(&[
        "emit",
        "examples/softmax.tex",
        "--stage",
        "loops",
        "--target",
        "x86-avx2",
        "--shape",
        "N=64,D=517",
    ]));
    std::fs::write(&loops, nest).unwrap();
    let path = loops.to_str().unwrap();
    assert_eq!(out(&texc(&["emit", path, "--stage", "mlir", "--target", "x86-avx2"])), first);
    let o = texc(&["emit", path, "--stage", "mlir-linalg", "--target", "x86-avx2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no tensor IR to export as linalg"));
    // The loop export needs a target's schedule.
    let o = texc(&["emit", "examples/softmax.tex", "--stage", "mlir"]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
}

#[cfg(not(feature = "mlir"))]
#[test]
fn emit_mlir_without_the_feature_says_how_to_get_it() {
    let o = texc(&["emit", "examples/softmax.tex", "--stage", "mlir-linalg"]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("built without MLIR export") && e.contains("--features mlir"), "{e}");
}
