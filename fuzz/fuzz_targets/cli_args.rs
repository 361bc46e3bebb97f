//! `cargo fuzz run cli_args`: argument vectors built from the fuzz input run
//! through the whole `texc` command in-process (`texc::run_from_args`: clap,
//! every subcommand, the pipeline, the interpreter, LLVM and Cranelift code,
//! `.npy` reading and writing). Whatever the arguments, texc must return 0,
//! 1 or 2: never panic (libFuzzer's panic hook aborts, so a panic on texc's
//! worker thread is a finding too), abort, hang or exhaust memory.
//!
//! The input is read as a little program: a command, a source (a shipped
//! example, one of a few embedded kernels, an example with fuzz bytes
//! spliced in, fuzz bytes as a whole file, or an odd path), then flags with
//! values chosen from tables of ordinary, extreme and malformed values, or
//! raw fuzz strings. Every file texc reads or writes is in one temporary
//! directory per process (input `.npy` files are written there from fuzz
//! bytes, outputs go there).
//!
//! One execution is kept small on purpose (the goal is crashes and hangs,
//! not slow runs that are slow for honest reasons):
//! - sizes given with `--shape`/`--const` are small (0..=32), or extreme
//!   values (negative, ≥ 2^31, near i64 limits) that texc must refuse; the
//!   two examples with large default sizes (sgemm, conv_resnet) get small
//!   `--shape` values for the symbols the input leaves unset;
//! - `--max-memory` is always given, at most 1.5 GiB (or malformed, which is
//!   refused before anything runs), so the memory budget refuses big runs
//!   below libFuzzer's `-rss_limit_mb=4096`;
//! - `bench --repeat/--warmup` take values up to 5 or values above texc's own
//!   limit of 1 000 000 (which it must refuse); honest large counts in
//!   between are left out, as they only make a run long;
//! - a source the fuzzer wrote (or spliced) is only run (`run`, `bench`) when
//!   its numbers have at most two digits, so its default sizes stay small;
//! - `TEXC_NUM_THREADS=1` (the fuzzer runs beside other work) and
//!   `TEXC_ROOFLINE` is set, so `bench`/`analyze` never measure the machine
//!   or write its cache under `$HOME`.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Shipped examples, with the symbols whose default sizes are too big for
/// one fuzz execution and small values for them.
const EXAMPLES: &[(&str, &str, &[(&str, i64)])] = &[
    ("matmul.tex", include_str!("../../examples/matmul.tex"), &[]),
    ("conv2d.tex", include_str!("../../examples/conv2d.tex"), &[]),
    ("conv_bn_relu.tex", include_str!("../../examples/conv_bn_relu.tex"), &[]),
    ("depthwise.tex", include_str!("../../examples/depthwise.tex"), &[]),
    ("gelu.tex", include_str!("../../examples/gelu.tex"), &[]),
    ("gemm_f16.tex", include_str!("../../examples/gemm_f16.tex"), &[]),
    ("im2col.tex", include_str!("../../examples/im2col.tex"), &[]),
    ("norms.tex", include_str!("../../examples/norms.tex"), &[]),
    ("pooling.tex", include_str!("../../examples/pooling.tex"), &[]),
    ("quantize.tex", include_str!("../../examples/quantize.tex"), &[]),
    ("softmax.tex", include_str!("../../examples/softmax.tex"), &[]),
    ("sgemm.tex", include_str!("../../examples/sgemm.tex"), &[("M", 12), ("K", 16), ("N", 32)]),
    ("conv_resnet.tex", include_str!("../../examples/conv_resnet.tex"), &[("C", 4), ("H", 6), ("W", 9), ("K", 8)]),
];

/// Small kernels that reach what the examples do not: schedule tunables
/// (`--knob`), an i32 reduction of index terms, f16 sums, index arithmetic.
const EMBEDDED: &[(&str, &str)] = &[
    (
        "tuned.tex",
        "kernel mm(A: f32[M = 16, K = 8], B: f32[K, N = 16]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]); }
schedule mm for x86-avx2 {
    tune tj in [8, 16, 32];
    split C.j by ?tj -> (jo, ji);
    split C.i by ?ti -> (io, ii);
    reorder C(io, jo, k, ii, ji);
    vectorize C.ji;
}
",
    ),
    ("count.tex", "kernel count(X: f32[H = 7]) -> Y: i32[H] { Y[h] = sum[r in 0..3](h + r); }\n"),
    ("half.tex", "kernel hsum(X: f16[N = 9, D = 5]) -> Y: f16[N] { Y[n] = sum[d](X[n, d]); }\n"),
    (
        "shift.tex",
        "kernel shift(A: f32[N = 10], const s: int = 1) -> B: f32[N] { B[i] = select(i + s < N, A[(i + s) % N], 0.0); }\n",
    ),
];

const COMMANDS: &[&str] = &["check", "emit", "run", "bench", "compile", "analyze", "tune"];
const TARGETS: &[&str] =
    &["interp", "x86-avx2", "x86-avx512", "host", "cranelift", "nvptx-sm80", "nvptx-sm90", "x86", "", "INTERP"];
const STAGES: &[&str] =
    &["ast", "tir", "graph", "egraph", "loops", "llvm", "asm", "clif", "vcode", "ptx", "mlir", "nope", ""];
const SYMBOLS: &[&str] = &["M", "N", "K", "C", "H", "W", "D", "R", "S", "x", ""];
const CONSTS: &[&str] = &["pad", "stride", "R", "S", "s", "dilation", "M"];
const KERNELS: &[&str] = &["matmul", "bn", "ln", "gn", "inorm", "mm", "relu", "conv2d", "nope", ""];
const TENSORS: &[&str] = &["A", "B", "C", "X", "Y", "Q", "Wt", "gamma", "beta", "mean", "var", "scale", "zero_point"];
const KNOBS: &[&str] = &["ti", "tj", "tk", "t"];
/// Integers texc must refuse or handle without trouble (never a large honest size).
const EXTREME: &[i64] = &[
    -1,
    -2,
    i64::MIN,
    i64::MIN + 1,
    i64::MAX,
    i64::MAX - 1,
    (1 << 31) - 1,
    1 << 31,
    1 << 32,
    (1 << 36) + 1,
    1 << 40,
    1 << 62,
    -(1 << 40),
];
const MALFORMED_INTS: &[&str] =
    &["", "x", "1.5", "1e3", "+3", "-0", " 4", "0x10", "9223372036854775808", "-9223372036854775809", "٣", "4 4"];
const SCALARS: &[&str] = &[
    "0",
    "1",
    "-3",
    "1.5",
    "0.02",
    "1e-5",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1e400",
    "99999999999",
    "abc",
    "",
    "1,5",
    "0x1p3",
    "2147483648",
    "-2147483649",
];
const SIZES: &[&str] = &[
    "64M",
    "1G",
    "512m",
    "100000",
    "0",
    "1",
    "1.5GiB",
    "16KiB",
    "abc",
    "-1",
    "1e3k",
    "nan",
    "inf",
    "",
    "1 G",
    "2Q",
    "18446744073709551616",
    "99999999999999999999T",
];
const SEEDS: &[&str] = &["0", "1", "18446744073709551615", "18446744073709551616", "-1", "x", ""];
/// `--repeat`/`--warmup`: small counts, or counts texc must refuse (see the module comment).
const COUNTS: &[&str] =
    &["0", "1", "2", "3", "5", "1000001", "4000000000", "18446744073709551615", "18446744073709551616", "-1", "x", ""];
const DUMPS: &[&str] = &["all", "1", "0", "", "lower,legalize", "parse", "codegen,nope", "nope"];
const DTYPES: &[&str] =
    &["<f4", "<f8", "<f2", "<i4", "<i8", "|i1", "|u1", "<u2", ">f4", "|b1", "<c8", "<bf16", "", "O"];

struct Dir(PathBuf);

fn dir() -> &'static Path {
    static DIR: OnceLock<Dir> = OnceLock::new();
    &DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("texc-fuzz-cli-{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).expect("temporary directory");
        std::fs::write(d.join("std.tex"), EXAMPLES[0].1).expect("write");
        // Settings from the environment, once, before any thread starts.
        std::env::set_var("TEXC_NUM_THREADS", "1");
        std::env::set_var("TEXC_ROOFLINE", "100,20");
        std::env::set_var("XDG_CACHE_HOME", d.join("cache"));
        std::env::remove_var("TEXC_DUMP_IR");
        std::env::remove_var("TEXC_VERIFY");
        std::env::remove_var("TEXC_EXTRACT");
        Dir(d)
    })
    .0
}

fn pick<'a>(u: &mut Unstructured, xs: &[&'a str]) -> Result<&'a str> {
    Ok(xs[u.choose_index(xs.len())?])
}

/// A short string from the input (at most `max` bytes, UTF-8 or not).
fn raw(u: &mut Unstructured, max: usize) -> Result<Vec<u8>> {
    let n = u.int_in_range(0..=max)?;
    Ok(u.bytes(n)?.to_vec())
}

fn text(u: &mut Unstructured, max: usize) -> Result<String> {
    Ok(String::from_utf8_lossy(&raw(u, max)?).into_owned())
}

/// An integer value as text: small, extreme or malformed.
fn int(u: &mut Unstructured, small: std::ops::RangeInclusive<i64>) -> Result<String> {
    Ok(match u.int_in_range(0..=9u8)? {
        0..=6 => u.int_in_range(small)?.to_string(),
        7 | 8 => EXTREME[u.choose_index(EXTREME.len())?].to_string(),
        _ => MALFORMED_INTS[u.choose_index(MALFORMED_INTS.len())?].to_string(),
    })
}

/// `NAME=VALUE,...` lists; returns the names it set.
fn pairs(
    u: &mut Unstructured,
    names: &[&str],
    value: &mut dyn FnMut(&mut Unstructured) -> Result<String>,
) -> Result<(String, Vec<String>)> {
    let mut parts = Vec::new();
    let mut set = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        let name = if u.ratio(1, 8)? { text(u, 4)? } else { pick(u, names)?.to_string() };
        let v = value(u)?;
        parts.push(match u.int_in_range(0..=15u8)? {
            0 => name.clone(),
            1 => format!("{name}={v}={v}"),
            2 => format!(" {name} = {v} "),
            _ => format!("{name}={v}"),
        });
        set.push(name);
    }
    Ok((parts.join(if u.ratio(1, 10)? { ";" } else { "," }), set))
}

/// A `.npy` file: fuzz bytes as they are, or a header of a fuzz-chosen
/// dtype and shape followed by fuzz bytes (often too few for the shape).
fn npy(u: &mut Unstructured) -> Result<Vec<u8>> {
    if u.ratio(1, 4)? {
        return raw(u, 256);
    }
    let dtype = pick(u, DTYPES)?;
    let rank = u.int_in_range(0..=4)?;
    let mut dims = Vec::new();
    for _ in 0..rank {
        dims.push(match u.int_in_range(0..=12u8)? {
            0 => EXTREME[u.choose_index(EXTREME.len())?].to_string(),
            1 => text(u, 4)?,
            _ => u.int_in_range(0..=24u32)?.to_string(),
        });
    }
    let shape = if rank == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let fortran = if u.ratio(1, 10)? { "True" } else { "False" };
    let mut header = format!("{{'descr': '{dtype}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    let n = u.int_in_range(0..=4096)?;
    // The data: fuzz bytes, or a pattern (most of the input is not data).
    match u.int_in_range(0..=2u8)? {
        0 => out.extend_from_slice(u.bytes(n.min(u.len()))?),
        1 => out.extend(std::iter::repeat_n(0u8, n)),
        _ => out.extend((0..n).map(|i| (i * 37 % 251) as u8)),
    }
    Ok(out)
}

/// Whether every number literal in `text` has at most two digits.
fn small_numbers(text: &[u8]) -> bool {
    text.split(|b| !b.is_ascii_digit()).all(|run| run.len() <= 2)
}

fn build(u: &mut Unstructured) -> Result<Option<Vec<OsString>>> {
    let d = dir();
    let mut argv: Vec<OsString> = vec!["texc".into()];
    let cmd = match u.int_in_range(0..=40u8)? {
        0 => text(u, 8)?,
        1 => "--help".into(),
        2 => "--version".into(),
        _ => pick(u, COMMANDS)?.to_string(),
    };
    argv.push(cmd.clone().into());
    let runs = cmd == "run" || cmd == "bench";
    // Most inputs should get past clap: `emit` needs a stage, and all but
    // `check` and `run` need a compiled target.
    if cmd == "emit" && !u.ratio(1, 8)? {
        argv.extend(["--stage".into(), pick(u, STAGES)?.into()]);
    }
    if !u.ratio(1, 4)? {
        argv.extend(["--target".into(), pick(u, &["interp", "x86-avx2", "x86-avx512", "cranelift", "host"])?.into()]);
    }

    // The source.
    let mut forced: &[(&str, i64)] = &[];
    let file: PathBuf = match u.int_in_range(0..=15u8)? {
        0..=6 => {
            let (name, _, big) = EXAMPLES[u.choose_index(EXAMPLES.len())?];
            forced = big;
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name)
        }
        7 | 8 => {
            let (name, src) = EMBEDDED[u.choose_index(EMBEDDED.len())?];
            let p = d.join(name);
            std::fs::write(&p, src).expect("write");
            p
        }
        9..=11 => {
            // An example (or embedded kernel) with fuzz bytes spliced in.
            let i = u.choose_index(EXAMPLES.len() - 2 + EMBEDDED.len())?;
            let base = if i < EXAMPLES.len() - 2 { EXAMPLES[i].1 } else { EMBEDDED[i - (EXAMPLES.len() - 2)].1 };
            let at = u.int_in_range(0..=base.len())?;
            let cut = u.int_in_range(0..=16usize)?.min(base.len() - at);
            let insert = raw(u, 24)?;
            let mut src = base.as_bytes()[..at].to_vec();
            src.extend_from_slice(&insert);
            src.extend_from_slice(&base.as_bytes()[at + cut..]);
            if runs && !small_numbers(&src) {
                return Ok(None);
            }
            let p = d.join("spliced.tex");
            std::fs::write(&p, src).expect("write");
            p
        }
        12 | 13 => {
            let src = raw(u, 512)?;
            if runs && !small_numbers(&src) {
                return Ok(None);
            }
            let p = d.join("fuzz.tex");
            std::fs::write(&p, src).expect("write");
            p
        }
        14 => d.join("missing.tex"),
        _ => PathBuf::from(pick(u, &["/dev/null", "/dev/zero", "/", ""])?),
    };
    let file_first = !u.ratio(1, 16)?;
    if file_first {
        argv.push(file.clone().into());
    }

    // `--max-memory`: always, so that the budget (not the machine) refuses big runs.
    argv.push("--max-memory".into());
    argv.push(pick(u, SIZES)?.into());

    let mut shapes_set: Vec<String> = Vec::new();
    for _ in 0..u.int_in_range(0..=10)? {
        match u.int_in_range(0..=22u8)? {
            0 | 1 => {
                let (v, set) = pairs(u, SYMBOLS, &mut |u| int(u, 0..=32))?;
                shapes_set.extend(set);
                argv.extend(["--shape".into(), v.into()]);
            }
            2 => {
                let (v, _) = pairs(u, CONSTS, &mut |u| int(u, -3..=5))?;
                argv.extend(["--const".into(), v.into()]);
            }
            3 | 4 => argv.extend(["--target".into(), pick(u, TARGETS)?.into()]),
            5 => argv.extend(["--stage".into(), pick(u, STAGES)?.into()]),
            6 => argv.extend(["--kernel".into(), pick(u, KERNELS)?.into()]),
            7 => {
                let (v, _) = pairs(u, KNOBS, &mut |u| int(u, 0..=40))?;
                argv.extend(["--knob".into(), v.into()]);
            }
            8 => {
                let (v, _) = pairs(u, TENSORS, &mut |u| Ok(pick(u, SCALARS)?.to_string()))?;
                argv.extend(["--scalar".into(), v.into()]);
            }
            9 | 10 => {
                let name = pick(u, TENSORS)?;
                let path = match u.int_in_range(0..=12u8)? {
                    0 => PathBuf::from(pick(u, &["/dev/zero", "/dev/null", "/", "", "missing.npy"])?),
                    n => {
                        let p = d.join(format!("in{}.npy", n % 4));
                        std::fs::write(&p, npy(u)?).expect("write");
                        p
                    }
                };
                let mut v = OsString::from(format!("{name}="));
                v.push(path.as_os_str());
                argv.extend(["--input".into(), v]);
            }
            11 => {
                let name = pick(u, TENSORS)?;
                let path = d.join(pick(u, &["out.npy", "out2.npy", "sub/out.npy", "nodir/out.npy", "", "sub"])?);
                let mut v = OsString::from(format!("{name}="));
                v.push(path.as_os_str());
                argv.extend(["--output".into(), v]);
            }
            12 => {
                argv.push("-o".into());
                argv.push(d.join(pick(u, &["k.o", "k.so", "k.txt", "sub/k.o", "nodir/k.o", "sub", "k"])?).into());
            }
            13 => argv.extend(["--seed".into(), pick(u, SEEDS)?.into()]),
            14 => argv.extend(["--repeat".into(), pick(u, COUNTS)?.into()]),
            15 => argv.extend(["--warmup".into(), pick(u, COUNTS)?.into()]),
            16 => {
                argv.push("--plot".into());
                argv.push(d.join(pick(u, &["r.svg", "r.png", "nodir/r.svg", "sub"])?).into());
            }
            17 => {
                argv.push("--dump-ir".into());
                if u.ratio(2, 3)? {
                    argv.push(pick(u, DUMPS)?.into());
                }
            }
            18 => argv.push(pick(u, &["--check", "--no-rewrite", "--verify-ir", "--time-passes"])?.into()),
            19 => argv.push(pick(u, &["--help", "-h", "--version", "--", "-", "--bogus", "--shape"])?.into()),
            20 => argv.push(OsString::from_vec(raw(u, 12)?)),
            _ => argv.extend(["--max-memory".into(), pick(u, SIZES)?.into()]),
        }
    }
    for (sym, v) in forced {
        if !shapes_set.iter().any(|s| s == sym) {
            argv.extend(["--shape".into(), format!("{sym}={v}").into()]);
        }
    }
    if !file_first {
        argv.push(file.into());
    }
    Ok(Some(argv))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(Some(argv)) = build(&mut u) else { return };
    // `CLI_ARGS_SHOW=1 cargo fuzz run cli_args ARTIFACT` shows what an input runs.
    if std::env::var_os("CLI_ARGS_SHOW").is_some() {
        eprintln!("texc {:?}", &argv[1..]);
    }
    let code = texc::run_from_args(argv.clone());
    assert!(matches!(code, 0..=2), "texc returned {code} for {argv:?}");
});
