//! README's rule: exit status 2 is command-line misuse (an unknown target, a
//! bad or repeated flag value, a missing choice), with one `error:` line
//! that names the flag.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn texc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_texc")).args(args).current_dir(root()).output().expect("texc runs")
}

#[test]
fn misuse_exits_2_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "examples/matmul.tex", "--target", "foo"], "unknown target `foo`; targets: interp,"),
        (&["run", "examples/matmul.tex", "--target=auto"], "unknown target `auto`"),
        (
            &["run", "examples/norms.tex"],
            "examples/norms.tex: the file defines several kernels; choose one with --kernel (kernels: bn, ln, inorm, gn)",
        ),
        (&["check", "examples/norms.tex", "--shape", "M=-1"], "--shape: `M=-1`: a size cannot be negative"),
        (&["run", "examples/matmul.tex", "--shape", "M=-1"], "--shape: `M=-1`: a size cannot be negative"),
        (&["run", "examples/matmul.tex", "--shape", "M=abc"], "--shape: `M=abc`: `abc` is not an integer"),
        (
            &["run", "examples/matmul.tex", "--shape", "M=64", "--shape", "M=32"],
            "--shape: `M` is given twice (`M=64` and `M=32`)",
        ),
        (&["run", "examples/matmul.tex", "--shape", "M=64,M=64"], "--shape: `M` is given twice"),
        (&["analyze", "examples/norms.tex", "--target", "x86-avx2"], "choose one with --kernel"),
    ];
    for (args, want) in cases {
        let o = texc(args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.starts_with("error: ") && e.contains(want), "{args:?}: want {want:?} in\n{e}");
        assert_eq!(e.lines().count(), 1, "{args:?}: one line of reason:\n{e}");
    }
}

/// A name the file does not have is a problem in the input (exit 1), unlike
/// a missing `--kernel`.
#[test]
fn a_kernel_the_file_lacks_is_exit_1() {
    let o = texc(&["run", "examples/norms.tex", "--kernel", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no kernel named `nope`"));
    let o = texc(&["run", "examples/norms.tex", "--kernel", "ln"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
}
