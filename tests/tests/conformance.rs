//! Every std.nn operator and every example, run on the interpreter and
//! compared with NumPy references computed in the same test run by
//! `tests/reference/cases.py` (float outputs within 1e-5 normwise relative
//! error, integer outputs bit-exact).

use std::collections::HashMap;
use std::process::Command;
use texc_compiler::Bindings;
use texc_runtime::read_npy;
use texc_tests::{compile, rel_error, root, run};

#[test]
fn interpreter_matches_numpy() {
    let out = texc_tests::scratch("conformance");
    let status = Command::new("python3")
        .arg(root().join("tests/reference/cases.py"))
        .arg(&out)
        .status()
        .expect("python3 runs (scripts/bootstrap.sh installs it with NumPy)");
    assert!(status.success(), "tests/reference/cases.py failed; is NumPy installed? (scripts/bootstrap.sh)");
    let manifest = std::fs::read_to_string(out.join("manifest.txt")).expect("manifest written");
    let mut failures = Vec::new();
    let mut count = 0;
    for line in manifest.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('\t').collect();
        let (case, file, kernel, outputs, consts) = (f[0], f[1], f[2], f[3], f.get(4).copied().unwrap_or(""));
        let dir = out.join(case);
        let mut inputs = HashMap::new();
        for e in std::fs::read_dir(&dir).expect("case dir") {
            let path = e.expect("entry").path();
            let name = path.file_stem().expect("stem").to_string_lossy().to_string();
            if !name.starts_with("ref_") {
                inputs.insert(name, read_npy(&path).expect("input reads"));
            }
        }
        let consts = consts
            .split(',')
            .filter(|c| !c.is_empty())
            .map(|c| {
                let (n, v) = c.split_once('=').expect("NAME=V");
                (n.to_string(), v.parse().expect("int"))
            })
            .collect();
        let b = Bindings {
            shapes: vec![],
            consts,
            input_shapes: inputs
                .iter()
                .map(|(n, t)| (n.clone(), t.shape.iter().map(|&d| d as i64).collect()))
                .collect(),
        };
        let p = match compile(file, Some(kernel), &b) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{case}: does not compile:\n{e}"));
                continue;
            }
        };
        let results = run(&p, inputs);
        for name in outputs.split(',') {
            let i = p.outputs.iter().position(|&o| p.tensor(o).name == name).expect("output exists");
            let want = read_npy(&dir.join(format!("ref_{name}.npy"))).expect("reference reads");
            let got = &results[i];
            count += 1;
            if got.dtype() != want.dtype() || got.shape != want.shape {
                failures.push(format!(
                    "{case}.{name}: got {}{:?}, want {}{:?}",
                    got.dtype(),
                    got.shape,
                    want.dtype(),
                    want.shape
                ));
                continue;
            }
            let err = rel_error(got, &want);
            let tol = if want.dtype().is_float() { 1e-5 } else { 0.0 };
            if err > tol {
                failures.push(format!("{case}.{name}: relative error {err:e} > {tol:e}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(count >= 50, "only {count} outputs compared");
    assert!(failures.is_empty(), "{} of {count} outputs differ from NumPy:\n{}", failures.len(), failures.join("\n"));
}
