//! `texc compile`: several kernels in one library or object, called from C;
//! errors that name the output.

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
    let d = common::scratch("compile").join(name);
    std::fs::create_dir_all(&d).expect("tmp");
    d
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Build examples/c/norms_main.c against `lib` (with `norms.h` beside it) and run it.
fn link_and_run(dir: &Path, lib: &Path) {
    let exe = dir.join("norms");
    let mut cc = Command::new("cc");
    cc.arg("-I").arg(dir).arg(root().join("examples/c/norms_main.c")).arg(lib).arg("-o").arg(&exe).arg("-lm");
    if lib.extension().is_some_and(|e| e == "so") {
        cc.arg(format!("-Wl,-rpath,{}", dir.display()));
    }
    let cc = cc.output().expect("cc runs (scripts/bootstrap.sh installs gcc)");
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    let run = Command::new(&exe).output().expect("runs");
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{out}{}", String::from_utf8_lossy(&run.stderr));
    assert!(out.contains("texc_bn_run: max error") && out.contains("texc_ln_run: max error"), "{out}");
}

#[test]
fn several_kernels_in_one_library_or_object() {
    for (target, ext) in [("x86-avx2", "so"), ("cranelift", "so"), ("x86-avx2", "o"), ("cranelift", "o")] {
        let dir = tmp(&format!("{target}-{ext}"));
        let lib = dir.join(format!("norms.{ext}"));
        let o = texc(&[
            "compile",
            "examples/norms.tex",
            "--kernel",
            "bn,ln",
            "--target",
            target,
            "-o",
            lib.to_str().expect("utf8"),
        ]);
        assert_eq!(o.status.code(), Some(0), "{target} {ext}: {}", err(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("(int texc_bn_run(...), int texc_ln_run(...))"), "{out}");
        let header = std::fs::read_to_string(dir.join("norms.h")).expect("header");
        assert!(header.contains("#define TEXC_BN_X_SIZE 420") && header.contains("#define TEXC_LN_X_SIZE 330"));
        assert_eq!(header.matches("#ifndef TEXC_BN_LN_H").count(), 1, "{header}");
        link_and_run(&dir, &lib);
        // Nothing but the outputs is left beside them.
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into())
            .collect();
        left.sort();
        let mut want = vec!["norms".to_string(), format!("norms.{ext}"), "norms.h".into()];
        want.sort();
        assert_eq!(left, want);
    }
}

/// Without `--kernel`, every kernel of the file goes into the library.
#[test]
fn every_kernel_of_the_file_by_default() {
    let dir = tmp("all");
    let lib = dir.join("norms.so");
    let o = texc(&["compile", "examples/norms.tex", "--target", "x86-avx2", "-o", lib.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let header = std::fs::read_to_string(dir.join("norms.h")).expect("header");
    for k in ["bn", "ln", "inorm", "gn"] {
        assert!(header.contains(&format!("int texc_{k}_run(")), "{k}: {header}");
    }
    link_and_run(&dir, &lib);
}

#[test]
fn compile_errors_name_the_output_and_the_flag() {
    for out in ["/nonexistent/d/m.so", "/nonexistent/d/m.o"] {
        let o = texc(&["compile", "examples/matmul.tex", "--target", "x86-avx2", "-o", out]);
        assert_eq!(o.status.code(), Some(1), "{}", err(&o));
        assert!(err(&o).contains(&format!("cannot write {out}: there is no directory /nonexistent/d")), "{}", err(&o));
    }
    let x = tmp("errors").join("x.so");
    let x = x.to_str().expect("utf8");
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--kernel", "bn,bn"], 2, "--kernel: `bn` is given twice"),
        (&["--kernel", "bn,"], 2, "expected kernel names separated by commas"),
        (&["--kernel", "bn,nope"], 1, "no kernel named `nope`"),
        (&["--kernel", "bn,ln", "--shape", "Q=3"], 1, "`Q` is not a size or constant of any of the kernels bn, ln"),
    ];
    for (extra, code, want) in cases {
        let mut args = vec!["compile", "examples/norms.tex", "--target", "x86-avx2", "-o", x];
        args.extend_from_slice(extra);
        let o = texc(&args);
        assert_eq!(o.status.code(), Some(*code), "{extra:?}: {}", err(&o));
        assert!(err(&o).contains(want), "{extra:?}: want {want:?} in {}", err(&o));
    }
}

/// Issue 35, item 7: `compile -o` renames over a regular file or a new path
/// only. A link to a library stays a link (the library it names is
/// replaced), a FIFO gets the object written through and stays a FIFO, and a
/// link to nothing is refused before anything is compiled.
#[test]
fn compile_outputs_that_are_not_files_are_not_replaced() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tmp("not-files");
    std::fs::create_dir_all(dir.join("elsewhere")).expect("dir");
    let real = dir.join("elsewhere/real.so");
    std::fs::write(&real, "old").expect("write");
    let link = dir.join("norms.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let o = texc(&["compile", "examples/norms.tex", "--target", "x86-avx2", "-o", link.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink(), "the link was replaced");
    assert!(std::fs::read(&real).expect("library").starts_with(b"\x7fELF"), "the linked file is the library");
    link_and_run(&dir, &link);
    // One object written through a FIFO (its reader gives up after 30 s:
    // a FIFO replaced by a file is never written, and must not hang the test).
    let fifo = dir.join("matmul.o");
    let _ = std::fs::remove_file(&fifo);
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs").success());
    let (tx, rx) = std::sync::mpsc::channel();
    let reading = fifo.clone();
    std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&reading) {
            let _ = std::io::Read::read_to_end(&mut f, &mut v);
        }
        let _ = tx.send(v);
    });
    let o = texc(&["compile", "examples/matmul.tex", "--target", "x86-avx2", "-o", fifo.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let object = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("the FIFO was written to");
    assert!(object.starts_with(b"\x7fELF"), "an object came through");
    assert!(std::fs::symlink_metadata(&fifo).expect("fifo").file_type().is_fifo(), "the FIFO was replaced");
    // A link to nothing.
    let dangling = dir.join("dangling.so");
    let _ = std::fs::remove_file(&dangling);
    std::os::unix::fs::symlink(dir.join("nowhere/x.so"), &dangling).expect("symlink");
    let o = texc(&["compile", "examples/matmul.tex", "--target", "x86-avx2", "-o", dangling.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("which does not exist"), "{}", err(&o));
    assert!(!dir.join("nowhere").exists());
}

#[test]
fn compile_help_describes_every_option() {
    let o = texc(&["compile", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(!help.contains("not built"), "{help}");
    assert!(help.contains("-o <OUT.o|OUT.so>") && help.contains("the header is written beside it"), "{help}");
    assert!(help.contains("--kernel <NAME,...>") && help.contains("every kernel of the file"), "{help}");
}

/// GPU targets: `-o k.ptx` (PTX and a header with the launches), `-o k.cubin`
/// through ptxas (with registers and spills), a header that compiles as C,
/// and the clear errors of what is not built.
#[test]
fn compile_for_a_gpu_writes_ptx_cubin_and_a_header() {
    let dir = tmp("gpu");
    let ptx = dir.join("norms.ptx");
    let o = texc(&["compile", "examples/norms.tex", "--target", "nvptx-sm90", "-o", ptx.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", err(&o));
    let text = std::fs::read_to_string(&ptx).expect("ptx written");
    assert!(text.contains(".target sm_90") && text.contains(".visible .entry"), "{text}");
    let header = dir.join("norms.h");
    let h = std::fs::read_to_string(&header).expect("header written");
    assert!(h.contains("texc_launch") && h.contains("_k0"), "{h}");
    // The header is valid C: include it and read the launch table.
    let c = dir.join("launches.c");
    std::fs::write(&c, "#include \"norms.h\"\nint main(void) { return texc_bn_launches[0].block[0] == 0; }\n")
        .expect("write");
    let cc = Command::new("cc").arg("-I").arg(&dir).arg(&c).arg("-o").arg(dir.join("launches")).output().expect("cc");
    assert!(cc.status.success(), "{}\n{h}", String::from_utf8_lossy(&cc.stderr));

    let cubin = dir.join("norms.cubin");
    let o = texc(&["compile", "examples/norms.tex", "--target", "nvptx-sm80", "-o", cubin.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(std::fs::read(&cubin).expect("cubin").starts_with(b"\x7fELF"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("registers") && out.contains("(sm_80)"), "{out}");

    let o = texc(&["compile", "examples/norms.tex", "--target", "nvptx-sm90", "-o", "norms.o"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("the output ends in .ptx or .cubin"), "{}", err(&o));
}

#[test]
fn gpu_runs_need_a_gpu_or_the_emulation() {
    let o = texc(&["run", "examples/softmax.tex", "--target", "nvptx-sm80", "--shape", "N=3,D=50", "--check"]);
    match texc_runtime::cuda::device() {
        Ok(d) => assert!(o.status.success(), "on {}: {}", d.name, err(&o)),
        Err(why) => {
            eprintln!("no GPU here ({why}): `run` on a GPU target is refused");
            assert_eq!(o.status.code(), Some(2), "{}", err(&o));
            assert!(err(&o).contains(&why) && err(&o).contains("--emulate-gpu"), "{}", err(&o));
        }
    }
    let args = ["run", "examples/softmax.tex", "--target", "nvptx-sm90", "--shape", "N=3,D=50", "--emulate-gpu"];
    let o = texc(&[&args[..], &["--check"]].concat());
    assert!(o.status.success(), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("relative error"));
    let o = texc(&["run", "examples/softmax.tex", "--target", "x86-avx2", "--emulate-gpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("--emulate-gpu: target `x86-avx2` is not a GPU"), "{}", err(&o));
}

#[test]
fn ptx_is_the_same_on_every_run() {
    let emit = || texc(&["emit", "examples/conv_bn_relu.tex", "--target", "nvptx-sm90", "--stage", "ptx"]).stdout;
    let first = emit();
    assert!(String::from_utf8_lossy(&first).contains(".visible .entry"));
    assert_eq!(first, emit());
}

/// `--check` of a kernel on TF32 tensor cores uses their rounding's tolerance
/// (saying so), unless `--tolerance` asks for another.
#[test]
fn tf32_kernels_are_checked_at_their_own_tolerance() {
    let dir = tmp("tf32");
    let src = dir.join("sgemm.tex");
    std::fs::write(
        &src,
        "kernel sgemm(A: f32[M = 32, K = 16], B: f32[K, N = 16]) -> C: f32[M, N] {\n    \
         C[i, j] = sum[k](A[i, k] * B[k, j]);\n}\nschedule sgemm for nvptx-sm80 {\n    \
         tile C(i, j) by (16, 8) -> (io, jo, ii, ji);\n    split C.k by 8 -> (ko, ki);\n    \
         reorder C(io, jo, ko, ii, ji, ki);\n    bind C.io to block.y;\n    bind C.jo to block.x;\n    \
         tensorize C(ii, ji, ki) with mma_m16n8k8_tf32f32;\n}\n",
    )
    .expect("write");
    let path = src.to_str().expect("utf-8");
    let o = texc(&["run", path, "--target", "nvptx-sm80", "--emulate-gpu", "--check"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        err(&o).contains("TF32 tensor cores round their inputs") && err(&o).contains("tolerance 1e-2"),
        "{}",
        err(&o)
    );
    let o = texc(&["run", path, "--target", "nvptx-sm80", "--emulate-gpu", "--check", "--tolerance", "1e-6"]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("differs from the interpreter"), "{}", err(&o));
}

/// An f32 output computed through f16 values (a sum of f16 products, which
/// compiled code rounds to f16 and the interpreter keeps exact) is checked
/// at f16's tolerance, saying so; f16 inputs converted to f32 first keep
/// f32's, and `--tolerance` still asks for another.
#[test]
fn outputs_computed_through_f16_are_checked_at_its_tolerance() {
    let dir = tmp("f16sum");
    let src = dir.join("h.tex");
    std::fs::write(
        &src,
        "kernel h(A: f16[M = 37, K = 70], B: f16[K, N = 45]) -> C: f32[M, N] {\n    \
         C[i, j] = f32(sum[k](A[i, k] * B[k, j])) * 3.0;\n}\n",
    )
    .expect("write");
    let path = src.to_str().expect("utf-8");
    for t in ["x86-avx2", "cranelift"] {
        let o = texc(&["run", path, "--target", t, "--check"]);
        assert!(o.status.success(), "{t}: {}", err(&o));
        assert!(err(&o).contains("pass through f16 or bf16") && out(&o).contains("tolerance 1e-2"), "{}", err(&o));
        let o = texc(&["run", path, "--target", t, "--check", "--tolerance", "1e-5"]);
        assert_eq!(o.status.code(), Some(1), "{t}: {}", err(&o));
    }
    let o = texc(&["run", "examples/gemm_f16.tex", "--target", "x86-avx2", "--check"]);
    assert!(o.status.success() && out(&o).contains("tolerance 1e-5") && !err(&o).contains("note"), "{}", err(&o));
}

/// Tensors whose names differ only in case (`X`, `x`, as ONNX models have),
/// and one named like another's length parameter (`x_len`): the header's
/// macros and the sized entry's parameters are still distinct, so it
/// compiles (warnings as errors) and the kernel runs from C.
#[test]
fn names_that_clash_in_c_get_distinct_macros_and_parameters() {
    let dir = tmp("clash");
    let src = dir.join("clash.tex");
    std::fs::write(
        &src,
        "kernel clash(X: f32[N = 4], x: f32[N], x_len: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i] + x[i] * x_len[i];\n}\n",
    )
    .expect("write");
    let lib = dir.join("clash.so");
    let o = texc(&["compile", src.to_str().expect("utf8"), "--target", "x86-avx2", "-o", lib.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let h = std::fs::read_to_string(dir.join("clash.h")).expect("header");
    assert!(h.contains("#define TEXC_CLASH_X_SIZE 4") && h.contains("#define TEXC_CLASH_X_2_SIZE 4"), "{h}");
    assert!(h.contains("size_t x_len_,") || h.contains("size_t x_len_)"), "a fresh length parameter:\n{h}");
    let c = dir.join("main.c");
    std::fs::write(
        &c,
        "#include \"clash.h\"\nint main(void) {\n    float a[4] = {1, 2, 3, 4}, b[4] = {1, 1, 1, 1}, c[4] = {2, 2, 2, 2}, y[4];\n    \
         if (texc_clash_run_sized(a, TEXC_CLASH_X_SIZE, b, TEXC_CLASH_X_2_SIZE, c, TEXC_CLASH_X_LEN_SIZE, y,\n                             \
         TEXC_CLASH_Y_SIZE))\n        return 1;\n    return y[3] == 6.0f ? 0 : 2;\n}\n",
    )
    .expect("write");
    let exe = dir.join("clash");
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-I"])
        .arg(&dir)
        .arg(&c)
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc runs");
    assert!(cc.status.success(), "{}\n{h}", String::from_utf8_lossy(&cc.stderr));
    let run = Command::new(&exe).output().expect("runs");
    assert_eq!(run.status.code(), Some(0), "Y = X + x * x_len");
}
