//! Inputs and outputs of `texc run`: `.npz` archives, random data inside
//! the domain of the operators it feeds, and the AST dump with and without
//! source spans.

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

fn tmp(name: &str) -> PathBuf {
    let d = common::scratch("io");
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

/// `texc ARGS` killed (and the test failed) after `secs` seconds: a FIFO
/// output that nobody reads must not hang the suite.
fn texc_within(args: &[&str], secs: u64) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(args)
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("texc runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().expect("waits").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("texc {args:?} did not finish in {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

fn mkfifo(p: &Path) {
    let _ = std::fs::remove_file(p);
    let o = Command::new("mkfifo").arg(p).output().expect("mkfifo runs");
    assert!(o.status.success(), "mkfifo {}: {}", p.display(), err(&o));
}

fn kind(p: &Path) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(p).map(|m| m.file_type()) {
        Ok(t) if t.is_fifo() => "fifo",
        Ok(t) if t.is_symlink() => "symlink",
        Ok(t) if t.is_char_device() => "char device",
        Ok(t) if t.is_file() => "file",
        Ok(_) => "other",
        Err(_) => "missing",
    }
}

/// A reader of the FIFO `p` on a thread; [`FifoReader::bytes`] gives up
/// after 30 s, so that a writer that replaced the FIFO instead of writing
/// through it (the reader then waits forever) fails the test.
struct FifoReader(std::sync::mpsc::Receiver<Vec<u8>>);

impl FifoReader {
    fn new(p: &Path) -> FifoReader {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = p.to_path_buf();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Ok(mut f) = std::fs::File::open(&p) {
                let _ = std::io::Read::read_to_end(&mut f, &mut v);
            }
            let _ = tx.send(v);
        });
        FifoReader(rx)
    }

    fn bytes(self) -> Vec<u8> {
        self.0.recv_timeout(std::time::Duration::from_secs(30)).expect("the FIFO was written to")
    }
}

/// Issue 35, item 7: outputs are renamed over a regular file or a new path
/// only. A FIFO is written through (the reader gets the `.npy` or `.npz`
/// bytes) and stays a FIFO; a symbolic link to a file stays a link and the
/// file it names gets the output; a character device is written through; a
/// link to nothing is refused before the run.
#[test]
fn outputs_that_are_not_regular_files_are_not_replaced() {
    let dir = tmp("not-files");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let run = ["run", "examples/matmul.tex", "--shape", "M=3,N=4,K=5", "--output"];
    // `.npy` and `.npz` (written with seeks) through a FIFO.
    for (name, arg) in [("c.npy", "C="), ("all.npz", "")] {
        let fifo = dir.join(name);
        mkfifo(&fifo);
        let reader = FifoReader::new(&fifo);
        let out = format!("{arg}{}", fifo.display());
        let o = texc_within(&[&run[..], &[&out]].concat(), 60);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        let bytes = reader.bytes();
        assert_eq!(kind(&fifo), "fifo", "{name}: the FIFO was replaced");
        let copy = dir.join(format!("copy-{name}"));
        std::fs::write(&copy, &bytes).expect("write");
        let shape = if name.ends_with(".npz") {
            let arrays = texc_runtime::read_npz_limited(&copy, u64::MAX).expect("an .npz came through");
            assert_eq!(arrays[0].0, "C");
            arrays[0].1.shape.clone()
        } else {
            texc_runtime::read_npy(&copy).expect("an .npy came through").shape
        };
        assert_eq!(shape, vec![3, 4]);
    }
    // A link to a file in another directory: the link stays, the file is replaced.
    std::fs::create_dir_all(dir.join("elsewhere")).expect("dir");
    let real = dir.join("elsewhere/real.npy");
    std::fs::write(&real, "old").expect("write");
    let link = dir.join("link.npy");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let o = texc_within(&[&run[..], &[&format!("C={}", link.display())]].concat(), 60);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(kind(&link), "symlink");
    assert_eq!(texc_runtime::read_npy(&real).expect("the linked file has the output").shape, vec![3, 4]);
    // A link to nothing: refused before the run, nothing created.
    let dangling = dir.join("dangling.npy");
    std::os::unix::fs::symlink(dir.join("nowhere/x.npy"), &dangling).expect("symlink");
    let o = texc_within(&[&run[..], &[&format!("C={}", dangling.display())]].concat(), 60);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("is a symbolic link to") && err(&o).contains("which does not exist"), "{}", err(&o));
    assert!(stdout(&o).is_empty() && kind(&dangling) == "symlink" && !dir.join("nowhere").exists());
    // A character device: a null device node made here as root (so that a
    // regression replaces it, not the system's), `/dev/null` otherwise.
    let null = if Command::new("id").arg("-u").output().is_ok_and(|o| stdout(&o).trim() == "0") {
        let p = dir.join("null");
        let made = Command::new("mknod").arg(&p).args(["c", "1", "3"]).status().is_ok_and(|s| s.success());
        made.then_some(p)
    } else {
        Some(PathBuf::from("/dev/null"))
    };
    if let Some(null) = null {
        let o = texc_within(&[&run[..], &[&format!("C={}", null.display())]].concat(), 60);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        assert_eq!(kind(&null), "char device", "{} was replaced", null.display());
    }
    // `db merge -o` through a FIFO, and onto a link to a file.
    let db = dir.join("a.jsonl");
    std::fs::write(&db, "").expect("write");
    let merged = dir.join("merged.jsonl");
    mkfifo(&merged);
    let reader = FifoReader::new(&merged);
    let db_s = db.to_str().expect("utf8");
    let o = texc_within(&["db", "merge", db_s, "-o", merged.to_str().expect("utf8")], 60);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let _ = reader.bytes();
    assert_eq!(kind(&merged), "fifo", "db merge replaced the FIFO");
    let db_link = dir.join("db-link.jsonl");
    std::os::unix::fs::symlink(&db, &db_link).expect("symlink");
    let o = texc_within(&["db", "merge", db_s, "-o", db_link.to_str().expect("utf8")], 60);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(kind(&db_link), "symlink");
}
