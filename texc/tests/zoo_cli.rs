//! Models as PyTorch's exporters write them, in CI without PyTorch: the
//! zoo's hand-written models (BERT- and GPT-2-style transformers, a ViT,
//! SDPA with causal and padding masks, a bidirectional LSTM and GRU, a UNet
//! with ConvTranspose and Resize), exported with both exporters by
//! `benches/zoo.py`, are kept in tests/onnx/zoo without their large weights
//! (tests/onnx/zoo_graphs.py). Each is given random weights with the
//! statistics of the exported ones, run by `texc run` on `x86-avx2` and by
//! ONNX Runtime on the stored inputs, and every output compared (max |Δ| /
//! max |ONNX Runtime| ≤ 1e-4).
//!
//! The models need Python with `onnx` and `onnxruntime` (scripts/bootstrap.sh
//! installs them); without them the test prints why and passes, except under
//! CI (`CI` set).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn python(args: &[&str]) -> Output {
    Command::new("python3").args(args).current_dir(root()).output().expect("python3 runs")
}

/// Every output of `got` against `want` (two .npz files with the same names):
/// the largest max |Δ| / max |want|, or why they cannot be compared.
const COMPARE: &str = r#"
import sys, numpy as np
got, want = np.load(sys.argv[1]), np.load(sys.argv[2])
worst = 0.0
for k in want.files:
    if k not in got.files:
        sys.exit(f"texc wrote no output {k!r} (it wrote {got.files})")
    x, y = got[k].astype(np.float64), want[k].astype(np.float64)
    if x.shape != y.shape:
        sys.exit(f"output {k}: shape {x.shape}, ONNX Runtime's {y.shape}")
    worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
print(worst)
"#;

#[test]
fn pytorch_exported_models_match_onnx_runtime() {
    let dir = root().join("tests/onnx/zoo");
    let mut models: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/onnx/zoo")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
        .collect();
    models.sort();
    assert!(models.len() >= 14, "seven models, two exporters each: {models:?}");
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("zoo_cli");
    for model in &models {
        let name = model.file_stem().expect("a name").to_string_lossy().to_string();
        let out = scratch.join(&name);
        let _ = std::fs::remove_dir_all(&out);
        let s = |p: &Path| p.display().to_string();
        let o = python(&["tests/onnx/zoo_graphs.py", "materialize", &s(model), &s(&out)]);
        if !o.status.success() {
            let why = text(&o);
            if why.contains("No module named") && std::env::var_os("CI").is_none() {
                eprintln!("skipped: Python lacks onnx or onnxruntime (scripts/bootstrap.sh installs them): {why}");
                return;
            }
            panic!("materializing {name}: {why}");
        }
        let got = out.join("texc.npz");
        let o = Command::new(env!("CARGO_BIN_EXE_texc"))
            .args(["run", &s(&out.join("model.onnx")), "--input", &s(&out.join("inputs.npz"))])
            .args(["--output", &s(&got), "--target", "x86-avx2", "--no-cache"])
            .current_dir(root())
            .output()
            .expect("texc runs");
        assert!(o.status.success(), "{name}: {}", text(&o));
        let o = python(&["-c", COMPARE, &s(&got), &s(&out.join("ort.npz"))]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let err: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().expect("a number");
        eprintln!("{name}: max relative error {err:.2e} against ONNX Runtime");
        assert!(err <= 1e-4, "{name}: error {err:.2e} against ONNX Runtime");
    }
}
