//! Inputs and outputs of `texc run`: `.npz` archives, random data inside
//! the domain of the operators it feeds, and the AST dump with and without
//! source spans.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn texc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_texc")).args(args).current_dir(root()).output().expect("texc runs")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("texc-io-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmp");
    d.join(name)
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// `--output FILE.npz` holds every output by name; `--input FILE.npz` feeds
/// every array it holds; `NAME=FILE.npz` picks one array.
#[test]
fn npz_archives_round_trip() {
    let both = tmp("pools.npz");
    let o = texc(&["run", "examples/pooling.tex", "--output", both.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(stdout(&o).contains(&format!("wrote `Ymax`, `Yavg` to {}", both.display())), "{}", stdout(&o));
    let arrays = texc_runtime::read_npz_limited(&both, u64::MAX).expect("readable .npz");
    let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Ymax", "Yavg"]);
    assert_eq!(arrays[0].1.shape, vec![2, 4, 9, 8]);
    // Max pooling is never below average pooling.
    let (mx, avg) = (arrays[0].1.to_f64(), arrays[1].1.to_f64());
    assert!(mx.iter().zip(&avg).all(|(m, a)| m >= a));

    // Inputs A and B in one archive, fed back; C compared with a matmul here.
    let a = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let ab = tmp("ab.npz");
    texc_runtime::write_npz(&ab, &[("A", &a), ("B", &b)]).expect("write");
    let c = tmp("c.npz");
    let o = texc(&[
        "run",
        "examples/matmul.tex",
        "--input",
        ab.to_str().expect("utf8"),
        "--output",
        &format!("C={}", c.display()),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(stdout(&o).contains("[M=2, K=3, N=2]"), "{}", stdout(&o));
    let got = texc_runtime::read_npz_limited(&c, u64::MAX).expect("read");
    assert_eq!(got[0].0, "C");
    assert_eq!(got[0].1.to_f64(), vec![4.0, 5.0, 10.0, 11.0]);

    // One array picked by name; a missing one is named, with what there is.
    let o = texc(&[
        "run",
        "examples/matmul.tex",
        "--input",
        &format!("A={}", ab.display()),
        "--input",
        &format!("B={}", ab.display()),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = texc(&["run", "examples/matmul.tex", "--input", &format!("X={}", ab.display())]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("has no array `X`") && err(&o).contains("holds A, B"), "{}", err(&o));
    // The same input twice is misuse.
    let o = texc(&[
        "run",
        "examples/matmul.tex",
        "--input",
        ab.to_str().expect("utf8"),
        "--input",
        &format!("A={}", ab.display()),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("`A` is given twice"), "{}", err(&o));
    // Not a zip archive.
    let junk = tmp("junk.npz");
    std::fs::write(&junk, b"not a zip").expect("w");
    let o = texc(&["run", "examples/matmul.tex", "--input", junk.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("is not a valid .npz archive"), "{}", err(&o));
}

/// NumPy reads what texc writes and texc reads what NumPy writes, compressed
/// or not (python3 with NumPy comes with scripts/bootstrap.sh).
#[test]
fn npz_agrees_with_numpy() {
    let dir = tmp("numpy");
    std::fs::create_dir_all(&dir).expect("dir");
    let script = format!(
        "import numpy as np\n\
         np.savez_compressed(r'{d}/in.npz', A=np.arange(12, dtype=np.float32).reshape(4, 3), B=np.eye(3, 5, dtype=np.float32))\n",
        d = dir.display()
    );
    let py = Command::new("python3").args(["-c", &script]).output().expect("python3 runs (scripts/bootstrap.sh)");
    assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
    let out = dir.join("out.npz");
    let o = texc(&[
        "run",
        "examples/matmul.tex",
        "--input",
        dir.join("in.npz").to_str().expect("utf8"),
        "--output",
        out.to_str().expect("utf8"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let check = format!(
        "import numpy as np\n\
         i = np.load(r'{d}/in.npz'); o = np.load(r'{d}/out.npz')\n\
         assert list(o.keys()) == ['C'], list(o.keys())\n\
         assert o['C'].dtype == np.float32 and o['C'].shape == (4, 5)\n\
         assert np.array_equal(o['C'], i['A'] @ i['B'])\n\
         print('numpy agrees')\n",
        d = dir.display()
    );
    let py = Command::new("python3").args(["-c", &check]).output().expect("python3 runs");
    assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
    assert!(String::from_utf8_lossy(&py.stdout).contains("numpy agrees"));
}

/// The variance of batch_norm is drawn from its domain, [0, 1): the shipped
/// example runs on its own random inputs without NaN, on every target.
#[test]
fn conv_bn_relu_runs_on_random_inputs_without_nan() {
    for target in ["interp", "x86-avx2", "cranelift"] {
        let o = texc(&["run", "examples/conv_bn_relu.tex", "--target", target]);
        assert_eq!(o.status.code(), Some(0), "{target}: {}", err(&o));
        let out = stdout(&o).to_lowercase();
        assert!(out.contains("y: f32[1, 32, 14, 14]") && !out.contains("nan"), "{target}: {out}");
    }
    let o = texc(&["run", "examples/norms.tex", "--kernel", "bn", "--seed", "7"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(!stdout(&o).to_lowercase().contains("nan"), "{}", stdout(&o));
    // A variance given in a file is used as it is: negative values still give NaN.
    let var = tmp("var.npy");
    texc_runtime::write_npy(&var, &texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![6], &[-1.0; 6]))
        .expect("w");
    let o = texc(&["run", "examples/norms.tex", "--kernel", "bn", "--input", &format!("var={}", var.display())]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(stdout(&o).to_lowercase().contains("nan"), "{}", stdout(&o));
}

#[test]
fn ast_dump_has_spans_only_when_asked() {
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "ast"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(!stdout(&o).contains('@') && stdout(&o).contains("kernel matmul\n"), "{}", stdout(&o));
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "ast", "--spans"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let text = std::fs::read_to_string(root().join("examples/matmul.tex")).expect("read");
    let at = text.find("matmul(").expect("kernel name");
    assert!(stdout(&o).contains(&format!("kernel matmul@{}..{}", at, at + 6)), "{}", stdout(&o));
    let o = texc(&["emit", "examples/matmul.tex", "--stage", "tir", "--spans"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("--spans shows source spans in `--stage ast`"), "{}", err(&o));
}
