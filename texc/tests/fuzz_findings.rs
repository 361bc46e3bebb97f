//! Regressions found by `cargo fuzz run cli_args` (fuzz/fuzz_targets/cli_args.rs),
//! and the library face that target runs texc through.

#[path = "../../tests/src/scratch.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

/// Run the texc binary with its address space limited to 4 GiB, so that a
/// regression that reads without bound fails the test instead of exhausting
/// the machine.
fn texc_limited(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4194304; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_texc"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("texc runs")
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// `texc run /dev/zero` read the "source file" until memory ran out (an
/// abort under libFuzzer, the OOM killer on a machine). Sources are read up
/// to 64 MiB, files and imports alike.
#[test]
fn endless_source_files_are_refused() {
    let o = texc_limited(&["check", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("cannot read `/dev/zero`: the file is larger than 64 MiB"), "{}", err(&o));

    let dir = common::scratch("fuzz-findings");
    std::fs::create_dir_all(&dir).expect("tmp");
    let src = dir.join("imports_zero.tex");
    std::fs::write(&src, "import \"/dev/zero\";\nkernel f(A: f32[N = 4]) -> B: f32[N] { B[i] = A[i]; }\n").expect("w");
    let o = texc_limited(&["check", src.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("cannot import `/dev/zero`: the file is larger than 64 MiB"), "{}", err(&o));
}

/// `texc::run_from_args` is the binary without the exit: clap's help and
/// version are status 0, misuse 2, input errors 1.
#[test]
fn run_from_args_returns_the_exit_status() {
    let ex = root().join("examples/matmul.tex");
    let ex = ex.to_str().expect("utf8");
    assert_eq!(texc::run_from_args(["texc", "--version"]), 0);
    assert_eq!(texc::run_from_args(["texc", "run", "--help"]), 0);
    assert_eq!(texc::run_from_args(["texc", "frobnicate"]), 2);
    assert_eq!(texc::run_from_args(["texc", "run", ex, "--shape", "M=x"]), 2);
    assert_eq!(texc::run_from_args(["texc", "run", ex, "--kernel", "nope"]), 1);
    assert_eq!(texc::run_from_args(["texc", "run", ex, "--shape", "M=3,K=2,N=5"]), 0);
}
