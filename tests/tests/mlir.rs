//! The MLIR export means what texc means: every example and std operator,
//! exported with `texc_mlir`, lowered by MLIR's own upstream passes
//! (`mlir-opt`), translated to LLVM IR (`mlir-translate`), compiled
//! (`llc`), linked with a small C driver and run on the interpreter's
//! inputs; its outputs must agree with the interpreter's.
//!
//! The MLIR 19 tools come from apt (`mlir-19-tools`, installed by
//! scripts/bootstrap.sh); where they are missing the tests say so and skip.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use texc_compiler::interp::{self, Arg};
use texc_compiler::tir::ProgramParam;
use texc_compiler::Program;
use texc_runtime::{DType, Tensor};
use texc_schedules::LoopFunc;

const LLVM: &str = "/usr/lib/llvm-19/bin";

/// Upstream lowering of the export to the LLVM dialect. Locals are
/// `memref.alloca_scope`s inside `scf` loops: lowering either first leaves
/// the other with a region of several blocks for a moment, so verification
/// runs at the end (mlir-translate verifies the result).
const LOWER: &[&str] = &[
    "--verify-each=false",
    "--convert-math-to-llvm",
    "--convert-math-to-libm",
    "--convert-scf-to-cf",
    "--convert-vector-to-llvm",
    "--expand-strided-metadata",
    "--finalize-memref-to-llvm",
    "--convert-arith-to-llvm",
    "--convert-func-to-llvm=use-bare-ptr-memref-call-conv=1",
    "--convert-cf-to-llvm",
    "--reconcile-unrealized-casts",
];

/// Bufferization of the linalg export first: tensors become buffers, the
/// returned tensors out-parameters after the inputs (the loop export's
/// convention), generics loops.
const BUFFERIZE: &[&str] = &[
    "--one-shot-bufferize=bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map",
    "--buffer-results-to-out-params",
    "--convert-linalg-to-loops",
    "--lower-affine",
];

/// Why the MLIR tools cannot run here, if they cannot.
fn tools_missing() -> Option<String> {
    for tool in ["mlir-opt", "mlir-translate", "llc"] {
        if !Path::new(LLVM).join(tool).exists() {
            return Some(format!("{LLVM}/{tool} is missing (apt install mlir-19-tools llvm-19)"));
        }
    }
    if Command::new("cc").arg("--version").output().is_err() {
        return Some("no C compiler (cc)".into());
    }
    None
}

fn skip() -> bool {
    match tools_missing() {
        Some(why) => {
            eprintln!("skipped: the MLIR export cannot be executed here: {why}");
            true
        }
        None => false,
    }
}

fn run_tool(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn c_type(e: DType) -> &'static str {
    match e {
        DType::F16 => "_Float16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "int8_t",
        DType::U8 => "uint8_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::Bool => "_Bool",
        DType::BF16 => "__bf16",
    }
}

fn bytes_of(e: DType, vals: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * e.size());
    for &v in vals {
        match e {
            DType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F64 => out.extend(v.to_le_bytes()),
            DType::I8 | DType::U8 | DType::Bool => out.push(v as i64 as u8),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::I64 => out.extend((v as i64).to_le_bytes()),
        }
    }
    out
}

fn values_of(e: DType, b: &[u8]) -> Vec<f64> {
    b.chunks(e.size())
        .map(|c| match e {
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
            DType::I8 => c[0] as i8 as f64,
            DType::U8 | DType::Bool => c[0] as f64,
            DType::I32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
        })
        .collect()
}

/// A C program that reads each parameter from its file (tensors whole,
/// scalars as one value), calls the kernel, and writes each output to its file.
fn driver(p: &Program) -> String {
    let mut decl = Vec::new();
    let mut body = String::new();
    let mut call = Vec::new();
    let mut arg = 1;
    for param in &p.params {
        match param {
            ProgramParam::Tensor(t) => {
                let d = p.tensor(*t);
                decl.push("void *".to_string());
                body += &format!("  void *a{arg} = rd(argv[{arg}], {});\n", d.len() as usize * d.elem.size());
            }
            ProgramParam::Scalar(s) => {
                let ty = c_type(p.scalars[*s as usize].elem);
                decl.push(ty.to_string());
                body += &format!("  {ty} a{arg} = *({ty} *)rd(argv[{arg}], sizeof({ty}));\n");
            }
        }
        call.push(format!("a{arg}"));
        arg += 1;
    }
    let mut outs = String::new();
    for &t in &p.outputs {
        let d = p.tensor(t);
        let n = d.len() as usize * d.elem.size();
        decl.push("void *".to_string());
        body += &format!("  void *a{arg} = rd(argv[{arg}], {n});\n");
        outs += &format!("  wr(argv[{arg}], a{arg}, {n});\n");
        call.push(format!("a{arg}"));
        arg += 1;
    }
    format!(
        r#"#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
extern void {name}({decl});
static void *rd(const char *path, size_t n) {{
  void *b = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
  FILE *f = fopen(path, "rb");
  if (!f || fread(b, 1, n, f) != n) {{ fprintf(stderr, "cannot read %s\n", path); exit(2); }}
  fclose(f);
  return b;
}}
static void wr(const char *path, const void *b, size_t n) {{
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b, 1, n, f) != n) {{ fprintf(stderr, "cannot write %s\n", path); exit(2); }}
  fclose(f);
}}
int main(int argc, char **argv) {{
  (void)argc;
{body}  {name}({call});
{outs}  return 0;
}}
"#,
        name = p.name,
        decl = decl.join(", "),
        call = call.join(", "),
    )
}

/// Compile `mlir` (a module exporting `p.name` with the loop export's
/// calling convention), run it on `args`, and return its outputs.
fn execute(dir: &Path, p: &Program, mlir: &str, pre: &[&str], args: &[Arg]) -> Vec<Tensor> {
    std::fs::create_dir_all(dir).expect("scratch directory");
    let f = |n: &str| dir.join(n);
    std::fs::write(f("k.mlir"), mlir).unwrap();
    run_tool(
        Command::new(format!("{LLVM}/mlir-opt")).args(pre).args(LOWER).arg(f("k.mlir")).arg("-o").arg(f("k.llvm.mlir")),
        "mlir-opt",
    );
    run_tool(
        Command::new(format!("{LLVM}/mlir-translate"))
            .arg("--mlir-to-llvmir")
            .arg(f("k.llvm.mlir"))
            .arg("-o")
            .arg(f("k.ll")),
        "mlir-translate",
    );
    run_tool(
        Command::new(format!("{LLVM}/llc"))
            .args(["-O2", "-filetype=obj", "--relocation-model=pic"])
            .arg(f("k.ll"))
            .arg("-o")
            .arg(f("k.o")),
        "llc",
    );
    std::fs::write(f("main.c"), driver(p)).unwrap();
    run_tool(Command::new("cc").arg("-O1").arg(f("main.c")).arg(f("k.o")).arg("-lm").arg("-o").arg(f("k")), "cc");
    let mut cmd = Command::new(f("k"));
    let mut i = 1;
    for (param, a) in p.params.iter().zip(args) {
        let (e, vals) = match (param, a) {
            (ProgramParam::Tensor(_), Arg::Tensor(t)) => (t.dtype(), t.to_f64()),
            (ProgramParam::Scalar(s), Arg::Scalar(v)) => (p.scalars[*s as usize].elem, vec![*v]),
            _ => panic!("arguments in parameter order"),
        };
        std::fs::write(f(&format!("a{i}")), bytes_of(e, &vals)).unwrap();
        cmd.arg(f(&format!("a{i}")));
        i += 1;
    }
    let mut outs = Vec::new();
    for &t in &p.outputs {
        let d = p.tensor(t);
        std::fs::write(f(&format!("a{i}")), vec![0u8; d.len() as usize * d.elem.size()]).unwrap();
        cmd.arg(f(&format!("a{i}")));
        outs.push((i, d.elem, d.shape.iter().map(|&x| x as usize).collect::<Vec<_>>()));
        i += 1;
    }
    run_tool(&mut cmd, "the compiled kernel");
    outs.into_iter()
        .map(|(i, e, shape)| Tensor::from_f64(e, shape, &values_of(e, &std::fs::read(f(&format!("a{i}"))).unwrap())))
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    texc_tests::scratch("mlir").join(clean)
}

/// Export `f` (loops of `p`), run it, compare with the interpreter.
fn agree(name: &str, p: &Program, f: &LoopFunc, seed: u64) {
    let mlir = texc_mlir::export_loops(f).unwrap_or_else(|e| panic!("{name}: {e}"));
    agree_text(name, p, &mlir, &[], seed);
}

/// Export `p` as linalg on tensors, run it, compare with the interpreter.
fn agree_linalg(name: &str, p: &Program, seed: u64) {
    let mlir = texc_mlir::export_linalg(p).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(mlir.contains("linalg.generic"), "{name}: no linalg.generic in\n{mlir}");
    agree_text(name, p, &mlir, BUFFERIZE, seed);
}

fn agree_text(name: &str, p: &Program, mlir: &str, pre: &[&str], seed: u64) {
    let args = interp::bind_args(p, HashMap::new(), &[], seed).expect("binds");
    let want = interp::run(p, args.clone()).expect("interp");
    let dir = scratch(name);
    let got = execute(&dir, p, mlir, pre, &args);
    for ((w, g), t) in want.iter().zip(&got).zip(&p.outputs) {
        let err = texc_tests::rel_error(g, w);
        let tol = if w.dtype().is_float() { 1e-5 } else { 0.0 };
        let out = &p.tensor(*t).name;
        assert!(
            err <= tol,
            "{name}: output `{out}` of the exported MLIR differs from the interpreter by {err:e}\nwant {:?}\ngot  {:?}\n{mlir}",
            w.to_f64(),
            g.to_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn legal(target: &str, p: &Program) -> LoopFunc {
    let lowered = texc_tests::default_lowered(target, p);
    let mut pl = texc_tests::pipeline(target);
    pl.legalize(lowered).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)))
}

#[test]
fn exported_examples_run_like_the_interpreter() {
    if skip() {
        return;
    }
    for (name, p) in texc_tests::example_programs(2e7) {
        agree(&format!("{name} avx2"), &p, &legal("x86-avx2", &p), 3);
    }
}

#[test]
fn exported_std_operators_run_like_the_interpreter() {
    if skip() {
        return;
    }
    for (name, p) in texc_tests::std_op_programs(11) {
        agree(&format!("{name} avx2"), &p, &legal("x86-avx2", &p), 4);
        agree(&format!("{name} avx512"), &p, &legal("x86-avx512", &p), 5);
    }
}

#[test]
fn exported_linalg_runs_like_the_interpreter() {
    if skip() {
        return;
    }
    for (name, p) in texc_tests::example_programs(2e7) {
        agree_linalg(&format!("{name} linalg"), &p, 6);
    }
    for (name, p) in texc_tests::std_op_programs(11) {
        agree_linalg(&format!("{name} linalg"), &p, 7);
    }
}

/// Random legal schedules (tiles that do not divide, vectorized tails,
/// parallel loops, attached stages) export and run like the interpreter.
#[test]
fn exported_random_schedules_run_like_the_interpreter() {
    if skip() {
        return;
    }
    let mut rng = texc_runtime::SplitMix64::new(17);
    for (file, kernel, shapes) in texc_tests::RANDOM_SCHEDULE_CASES {
        let base = texc_tests::random_case_program(file, kernel, shapes);
        for trial in 0..4 {
            let f = texc_tests::randomly_scheduled(&base, &mut rng);
            let mut pl = texc_tests::pipeline("x86-avx2");
            let f = pl.legalize(f).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
            agree(&format!("{file} trial {trial}"), &base, &f, trial);
        }
    }
}

/// A local over the stack's share (a 512 KiB packed block of a product
/// sliced 1024 deep) is `memref.alloc`ed and `memref.dealloc`ed in its
/// scope, and runs like the interpreter.
#[test]
fn exported_heap_locals_run_like_the_interpreter() {
    let src = "kernel mm(A: f32[M = 13, K = 1100], B: f32[K, N = 300]) -> C: f32[M, N] {\n    C[i, j] = sum[k](A[i, k] * B[k, j]);\n}\n";
    let (mut pl, k) = texc_tests::load_text("x86-avx2", "heap.tex", src, None).expect("loads");
    let p = pl.specialize(k, &texc_compiler::Bindings::default()).expect("specializes");
    pl.options.knobs = [("kslice".to_string(), 1024), ("cols".to_string(), 128)].into();
    let f = pl.default_loops(p.clone()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e))).legal;
    assert!(!f.heap_locals().is_empty(), "the pack is on the heap");
    let mlir = texc_mlir::export_loops(&f).expect("exports");
    assert!(
        mlir.contains("memref.alloc() {alignment = 64 : i64} : memref<") && mlir.contains("memref.dealloc"),
        "{mlir}"
    );
    if skip() {
        return;
    }
    agree("heap locals", &p, &f, 5);
}

/// Saturating float-to-integer conversions, unsigned and bool results,
/// floor division and modulo of negative values, through both exports.
#[test]
fn integer_semantics_survive_the_export() {
    if skip() {
        return;
    }
    let src = "kernel q(X: f32[N = 37], s: f32 = 300.0) -> (Y: i8[N], Z: u8[N], B: bool[N], D: i32[N]) {
        Y[i] = i8(X[i] * s);
        Z[i] = u8(X[i] * s);
        B[i] = X[i] > 0.0;
        D[i] = (i32(X[i] * 1000.0) / 7) % 5 + i32(i) / 3 - i32(X[i] * 1000.0) / i32(i);
    }";
    for target in ["x86-avx2", "x86-avx512"] {
        let (mut pl, k) = texc_tests::load_text(target, "q.tex", src, None).expect("front end");
        let p = texc_tests::specialize(&mut pl, k, &texc_compiler::Bindings::default());
        let f = texc_tests::loops(&mut pl, k, &p);
        agree(&format!("ints {target}"), &p, &f, 11);
        agree_linalg(&format!("ints linalg {target}"), &p, 12);
    }
}
