//! The `texc` binary under hostile arguments (issue 13): runs beyond the
//! machine's memory, endless or lying input files, out-of-range and
//! contradictory arguments and environment settings, concurrent writers of
//! one output, CR line endings, and random argument values. Every command
//! ends with status 0, 1 or 2 and a clear message: never a signal, a panic
//! (101) or a hang.

#[path = "../../tests/src/scratch.rs"]
mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

/// What a finished command left: its exit code (`None`: a signal), stdout and stderr.
struct Ran {
    code: Option<i32>,
    out: String,
    err: String,
}

/// Run texc with `args` and `env`, killing it (and failing) after `secs` seconds.
fn texc_env(args: &[&str], env: &[(&str, &str)], secs: u64) -> Ran {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_texc"));
    cmd.args(args).current_dir(root()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Never measure the roofline (two seconds) unless a test sets it.
    cmd.env("TEXC_ROOFLINE", "100,20").env_remove("TEXC_NUM_THREADS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("texc starts");
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let mut b = Vec::new();
                let _ = r.read_to_end(&mut b);
                s = String::from_utf8_lossy(&b).into_owned();
            }
            s
        })
    };
    let out = pipe(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = pipe(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().expect("waits") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("texc {args:?} (env {env:?}) did not finish in {secs} s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ran { code: status.code(), out: out.join().expect("stdout"), err: err.join().expect("stderr") }
}

fn texc(args: &[&str]) -> Ran {
    texc_env(args, &[], 60)
}

fn tmp(name: &str) -> PathBuf {
    let d = common::scratch("robust-cli");
    std::fs::create_dir_all(&d).expect("tmp");
    d.join(name)
}

/// Write `text` to a fresh file in the test's temporary directory; its path.
fn file(name: &str, text: &str) -> String {
    let p = tmp(name);
    std::fs::write(&p, text).expect("writes");
    p.to_str().expect("utf8").to_string()
}

fn npy(name: &str, t: &texc_runtime::Tensor) -> String {
    let p = tmp(name);
    texc_runtime::write_npy(&p, t).expect("writes");
    p.to_str().expect("utf8").to_string()
}

/// A clean error: the status wanted, one `error:` line first, no panic.
#[track_caller]
fn refused(r: &Ran, code: i32, want: &str, what: &str) {
    assert_eq!(r.code, Some(code), "{what}: status {:?}\n{}", r.code, r.err);
    assert!(r.err.starts_with("error: "), "{what}: {}", r.err);
    assert!(r.err.contains(want), "{what}: no `{want}` in\n{}", r.err);
    assert!(!r.err.contains("panicked") && !r.err.contains("internal error"), "{what}: {}", r.err);
}

const ADD: &str = "kernel add(A: f32[N], B: f32[N]) -> C: f32[N] { C[i] = A[i] + B[i]; }\n";
const SCALE: &str = "kernel scale(A: f32[N = 4], k: i32, eps: f32) -> C: f32[N] { C[i] = A[i] * f32(k) + eps; }\n";

/// 2^31 − 1 elements (24 GiB and more) used to end in "memory allocation
/// failed" and SIGABRT; the run is refused before anything is allocated.
#[test]
fn runs_beyond_memory_exit_1() {
    let add = file("add.tex", ADD);
    // On a machine with more memory than such a run needs, ask for 2^35 elements instead.
    let big = texc_runtime::memory::available().is_some_and(|m| m > 64 << 30);
    let n = if big { "N=34359738368" } else { "N=2147483647" };
    for target in ["interp", "x86-avx2", "cranelift"] {
        let r = texc(&["run", &add, "--shape", n, "--target", target]);
        refused(&r, 1, "this run needs about", &format!("run on {target}"));
        assert!(r.err.contains("more than what this machine has available"), "{}", r.err);
    }
    let r = texc(&["bench", &add, "--shape", n, "--target", "x86-avx2"]);
    refused(&r, 1, "this run needs about", "bench");
    // A moderate size over a given limit.
    let r = texc(&["run", &add, "--shape", "N=1000000", "--max-memory", "1M"]);
    refused(&r, 1, "more than the limit given by --max-memory (1.0 MiB)", "--max-memory 1M");
    let r = texc(&["run", &add, "--shape", "N=1000", "--max-memory", "1M"]);
    assert_eq!(r.code, Some(0), "{}", r.err);
    for bad in ["abc", "1e400", "12Q", "", "99999999999T"] {
        let r = texc(&["run", &add, "--shape", "N=4", "--max-memory", bad]);
        refused(&r, 2, "--max-memory", &format!("--max-memory {bad:?}"));
    }
}

/// `/dev/zero` as an input used to be read until memory ran out; a file
/// whose header promises more data than it holds is an error.
#[test]
fn endless_and_lying_input_files_exit_1() {
    let add = file("add.tex", ADD);
    let r = texc_env(&["run", &add, "--input", "A=/dev/zero"], &[], 20);
    refused(&r, 1, "input `A`", "/dev/zero");
    let t = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![1000], &[1.0; 1000]);
    let whole = npy("whole.npy", &t);
    let bytes = std::fs::read(&whole).expect("reads");
    let short = tmp("short.npy");
    std::fs::write(&short, &bytes[..bytes.len() / 2]).expect("writes");
    let r = texc(&["run", &add, "--input", &format!("A={}", short.display())]);
    refused(&r, 1, "the header promises 4000 bytes of data", "a short .npy");
    // Within the budget it is read; over --max-memory it is refused before reading.
    let r = texc(&["run", &add, "--input", &format!("A={whole}"), "--max-memory", "2K"]);
    refused(&r, 1, "exceed the memory available to this run", "input over --max-memory");
}

/// Out-of-range and contradictory arguments and environment settings used
/// to be taken silently (truncated, saturated, ignored) or to panic
/// (`--repeat 18446744073709551615`: capacity overflow); each is a clear
/// error, status 2.
#[test]
fn bad_arguments_exit_2() {
    let add = file("add.tex", ADD);
    let sc = file("scale.tex", SCALE);
    let eps = npy("eps.npy", &texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![], &[0.5]));
    let eps_arg = format!("eps={eps}");
    let cases: &[(&[&str], &str)] = &[
        (&["bench", &add, "--shape", "N=16", "--target", "x86-avx2", "--repeat", "18446744073709551615"], "--repeat"),
        (&["bench", &add, "--shape", "N=16", "--target", "x86-avx2", "--repeat", "4000000000"], "--repeat"),
        (&["bench", &add, "--shape", "N=16", "--target", "x86-avx2", "--repeat", "0"], "--repeat"),
        (&["bench", &add, "--shape", "N=16", "--target", "x86-avx2", "--warmup", "4000000000"], "--warmup"),
        (&["run", &sc, "--scalar", "k=1.5"], "`k` is i32"),
        (&["run", &sc, "--scalar", "k=99999999999"], "`k` is i32"),
        (&["run", &sc, "--scalar", "k=nan"], "`k` is i32"),
        (&["run", &sc, "--scalar", "A=3"], "`A` is a tensor"),
        (&["run", &sc, "--scalar", "k=2", "--scalar", "k=3"], "given twice"),
        (&["run", &sc, "--input", &eps_arg, "--scalar", "eps=0.25"], "both as --input and as --scalar"),
        (&["run", &add, "--shape", "N=64", "--shape", "N=32"], "given twice"),
        (&["run", &add, "--shape", "N=64,N=32"], "given twice"),
        (&["run", &add, "--shape", "N=-1"], "cannot be negative"),
        (&["run", &add, "--shape", "N=99999999999999999999"], "not an integer"),
    ];
    for (args, want) in cases {
        let r = texc(args);
        refused(&r, 2, want, &format!("{args:?}"));
    }
    for (var, value) in [
        ("TEXC_NUM_THREADS", "abc"),
        ("TEXC_NUM_THREADS", "0"),
        ("TEXC_NUM_THREADS", "99999999999"),
        ("TEXC_ROOFLINE", "abc"),
        ("TEXC_ROOFLINE", "-1,5"),
        ("TEXC_ROOFLINE", "100"),
    ] {
        for args in [&["run", &add, "--shape", "N=4"][..], &["bench", &add, "--shape", "N=4", "--target", "x86-avx2"]] {
            let r = texc_env(args, &[(var, value)], 60);
            refused(&r, 2, &format!("{var}={value}"), &format!("{var}={value} {args:?}"));
        }
    }
    // The same values, well formed, are accepted.
    let r = texc(&["run", &sc, "--scalar", "k=-2147483648", "--input", &eps_arg]);
    assert_eq!(r.code, Some(0), "{}", r.err);
    let r = texc_env(&["run", &add, "--shape", "N=4"], &[("TEXC_NUM_THREADS", "3")], 60);
    assert_eq!(r.code, Some(0), "{}", r.err);
    let r = texc(&["bench", &add, "--shape", "N=16", "--target", "x86-avx2", "--repeat", "3", "--warmup", "0"]);
    assert_eq!(r.code, Some(0), "{}", r.err);
}

/// A scalar given a `.npy` of another dtype is refused, as a tensor is. This
/// is a problem in an input file, so its status is 1 like the tensor's
/// (`cli.rs`: `wrong_npy_inputs_exit_1`), not 2.
#[test]
fn scalar_files_of_the_wrong_dtype_are_refused() {
    let sc = file("scale.tex", SCALE);
    let k64 = npy("k64.npy", &texc_runtime::Tensor::from_i64(texc_runtime::DType::I64, vec![], &[3]));
    let r = texc(&["run", &sc, "--input", &format!("k={k64}")]);
    refused(&r, 1, "the file holds i64 data, but the scalar `k` is declared i32", "k from an i64 file");
    let e64 = npy("e64.npy", &texc_runtime::Tensor::from_f64(texc_runtime::DType::F64, vec![], &[0.5]));
    let r = texc(&["run", &sc, "--input", &format!("eps={e64}")]);
    refused(&r, 1, "the file holds f64 data, but the scalar `eps` is declared f32", "eps from an f64 file");
    let k32 = npy("k32.npy", &texc_runtime::Tensor::from_i64(texc_runtime::DType::I32, vec![], &[3]));
    let r = texc(&["run", &sc, "--input", &format!("k={k32}")]);
    assert_eq!(r.code, Some(0), "{}", r.err);
}

/// Four `texc run` processes writing one 4 MiB output at once used to leave
/// a file mixing several runs' data; it holds one run's whole output.
#[test]
fn concurrent_runs_leave_one_whole_output() {
    const N: usize = 1 << 20;
    let copy = file("copy.tex", "kernel copy(A: f32[N]) -> Y: f32[N] { Y[i] = A[i]; }\n");
    let dir = tmp("concurrent");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let out = dir.join("y.npy");
    let inputs: Vec<String> = (0..4)
        .map(|w| {
            let t = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![N], &vec![w as f64 + 1.0; N]);
            npy(&format!("in{w}.npy"), &t)
        })
        .collect();
    for _ in 0..2 {
        let children: Vec<_> = inputs
            .iter()
            .map(|i| {
                Command::new(env!("CARGO_BIN_EXE_texc"))
                    .args(["run", &copy, "--input", &format!("A={i}"), "--output"])
                    .arg(format!("Y={}", out.display()))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("starts")
            })
            .collect();
        for mut c in children {
            assert_eq!(c.wait().expect("waits").code(), Some(0));
        }
        let y = texc_runtime::read_npy(&out).expect("a whole .npy file").to_f64();
        assert_eq!(y.len(), N);
        assert!((1..=4).any(|w| y.iter().all(|&v| v == w as f64)), "the output mixes several runs' data");
    }
    let left: Vec<String> =
        std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
    assert_eq!(left, vec!["y.npy".to_string()], "temporary files left behind");
}

/// A file with CR-only line endings used to be one long comment ("the file
/// defines no kernel"); it checks, and errors name the right line.
#[test]
fn cr_only_files_check_and_errors_name_the_line() {
    let good = file(
        "good_cr.tex",
        "# a comment\rkernel add(A: f32[N = 4], B: f32[N]) -> C: f32[N] {\r  C[i] = A[i] + B[i];\r}\r",
    );
    let r = texc(&["check", &good]);
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert!(r.out.contains("1 kernel checked"), "{}", r.out);
    let bad = file("bad_cr.tex", "# a comment\r\rkernel f(A: f32[N = 4]) -> B: f32[N] { B[i] = A[i + 1]; }\r");
    let r = texc(&["check", &bad]);
    refused(&r, 1, "bad_cr.tex:3:49", "an error on line 3");
}

/// Ranges whose length is huge or overflows used to run forever (or give 0
/// silently): spanned errors, at once.
#[test]
fn extreme_ranges_exit_1_with_a_location() {
    for (i, expr) in [
        "sum[k in 5..-9223372036854775807](A[i])",
        "sum[k in -9223372036854775000..9223372036854775000](1.0)",
        "sum[k in 0..9223372036854775807](A[i])",
    ]
    .iter()
    .enumerate()
    {
        let f =
            file(&format!("range{i}.tex"), &format!("kernel r(A: f32[N = 3]) -> Y: f32[N] {{\n  Y[i] = {expr};\n}}\n"));
        for target in ["interp", "x86-avx2"] {
            let r = texc_env(&["run", &f, "--target", target], &[], 20);
            refused(&r, 1, &format!("range{i}.tex:2:"), &format!("{expr} on {target}"));
        }
    }
}

/// `emit --stage loops` of i32 reductions over index terms used to never end.
#[test]
fn i32_index_reductions_emit_loops() {
    let f = file(
        "taps.tex",
        "kernel taps(X: f32[H]) -> Y: i32[H] { Y[h] = sum[r in 0..3](1); }\n\
         kernel rsum(X: f32[H]) -> Y: i32[H] { Y[h] = sum[r in 0..3](r); }\n",
    );
    for k in ["taps", "rsum"] {
        let r = texc_env(
            &["emit", &f, "--kernel", k, "--shape", "H=7", "--stage", "loops", "--target", "x86-avx2"],
            &[],
            20,
        );
        assert_eq!(r.code, Some(0), "{k}: {}", r.err);
        let r = texc_env(&["run", &f, "--kernel", k, "--shape", "H=7", "--target", "x86-avx2", "--check"], &[], 20);
        assert_eq!(r.code, Some(0), "{k}: {}", r.err);
    }
}

/// Random values for `--shape`, `--scalar`, `--repeat`, `--warmup`,
/// `--knob`, `--max-memory`, `--seed`, `--target` and the environment
/// (each well formed two times in three, else hostile): texc always ends
/// with 0, 1 or 2 (never a signal or 101), and explains every failure on
/// stderr.
#[test]
fn random_argument_values_never_crash() {
    let k = file(
        "prop.tex",
        "kernel p(A: f32[N = 4], k: i32, eps: f32) -> C: f32[N] { C[i] = A[i] * f32(k) + eps; }\n\
         schedule p for x86-avx2 { split C.i by ?ti -> (io, ii); unroll C.ii; }\n",
    );
    let garbage =
        ["", "x", "1.5", "0x10", "1e3", "-0", " 3", "\u{ff13}", "=", ",", "N", "--", "99999999999999999999999"];
    let mut rng = texc_runtime::SplitMix64::new(2024);
    let mut codes = [0; 3];
    for trial in 0..60 {
        let mut r = || rng.next_u64();
        let pick = |r: u64, n: usize| (r % n as u64) as usize;
        let junk = |r: u64| garbage[pick(r, garbage.len())].to_string();
        // Hostile one time in three: out of range, of the wrong kind, or not a number.
        let hostile = |r: &mut dyn FnMut() -> u64| pick(r(), 3) == 0;
        let mut args: Vec<String> = Vec::new();
        let bench = pick(r(), 3) == 0;
        args.extend([if bench { "bench" } else { "run" }.to_string(), k.clone()]);
        let targets = if bench {
            ["x86-avx2", "cranelift", "x86-avx2", "interp", "nope"]
        } else {
            ["interp", "x86-avx2", "cranelift", "interp", "nope"]
        };
        let t = targets[if hostile(&mut r) { 3 + pick(r(), 2) } else { pick(r(), 3) }];
        args.push(format!("--target={t}"));
        for _ in 0..[0, 1, 1, 1, 2][pick(r(), 5)] {
            let v = if !hostile(&mut r) {
                format!("N={}", r() % 17)
            } else {
                match pick(r(), 5) {
                    // Beyond the 2^36-element cap (never a size that would really run for long).
                    0 => format!("N={}", (1u64 << 36) + 1 + r() % (i64::MAX as u64 - (1 << 36))),
                    1 => format!("N=-{}", r() % 1000),
                    2 => format!("N={}", u64::MAX - r() % 1000),
                    3 => format!("{}={}", ["M", "", "k", "A"][pick(r(), 4)], r() % 17),
                    _ => format!("N={}", junk(r())),
                }
            };
            args.push(format!("--shape={v}"));
        }
        for name in ["k", "eps"].into_iter().take([0, 1, 1, 2][pick(r(), 4)]) {
            let v = if !hostile(&mut r) {
                format!("{name}={}", (r() % 2001) as i64 - 1000)
            } else {
                match pick(r(), 5) {
                    0 => format!("{name}={:e}", f64::from_bits(r())),
                    1 => format!(
                        "{name}={}",
                        ["nan", "inf", "-inf", "1e308", "-2147483649", "2147483648", "0.5"][pick(r(), 7)]
                    ),
                    2 => format!("{}={}", ["A", "C", "zz", "N"][pick(r(), 4)], r() % 10),
                    3 => format!("{name}={}", r()),
                    _ => format!("{name}={}", junk(r())),
                }
            };
            args.push(format!("--scalar={v}"));
        }
        if pick(r(), 2) == 0 {
            let v = if !hostile(&mut r) {
                (1 + r() % 16).to_string()
            } else {
                [r().to_string(), "0".into(), "-3".into(), junk(r())][pick(r(), 4)].clone()
            };
            args.push(format!("--knob={}={v}", if pick(r(), 4) == 0 { "tj" } else { "ti" }));
        }
        if pick(r(), 3) == 0 {
            // At most 1 GiB, or not a size: a random budget never lets a huge run start.
            let v = if !hostile(&mut r) {
                [(r() % (1 << 30)).to_string(), format!("{}K", r() % 1000), format!("{}M", r() % 1024), "1G".into()]
                    [pick(r(), 4)]
                .clone()
            } else {
                ["-5".into(), "1e400".into(), "0".into(), "12Q".into(), junk(r())][pick(r(), 5)].clone()
            };
            args.push(format!("--max-memory={v}"));
        }
        if pick(r(), 3) == 0 {
            let v = if !hostile(&mut r) {
                r().to_string()
            } else {
                ["-1".into(), "18446744073709551616".into(), junk(r())][pick(r(), 3)].clone()
            };
            args.push(format!("--seed={v}"));
        }
        if bench {
            // 1 to 5 timed runs, or far too many (never a real long bench).
            let n = |r: &mut dyn FnMut() -> u64| {
                if !hostile(r) {
                    (1 + r() % 5).to_string()
                } else {
                    [
                        (1_000_001 + r() % 1_000_000_000_000).to_string(),
                        u64::MAX.to_string(),
                        "0".into(),
                        "-1".into(),
                        junk(r()),
                    ][pick(r(), 5)]
                    .clone()
                }
            };
            args.push(format!("--repeat={}", n(&mut r)));
            if pick(r(), 2) == 0 {
                args.push(format!("--warmup={}", n(&mut r)));
            }
        }
        let mut env: Vec<(&str, String)> = Vec::new();
        if pick(r(), 4) == 0 {
            let v = if !hostile(&mut r) {
                (1 + r() % 4).to_string()
            } else {
                ["0".into(), "abc".into(), r().to_string()][pick(r(), 3)].clone()
            };
            env.push(("TEXC_NUM_THREADS", v));
        }
        if pick(r(), 4) == 0 {
            let v = if !hostile(&mut r) {
                format!("{},{}", 1 + r() % 500, 1 + r() % 100)
            } else {
                ["abc".into(), "0,0".into(), format!("{},", r() % 500), junk(r())][pick(r(), 4)].clone()
            };
            env.push(("TEXC_ROOFLINE", v));
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let envv: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let ran = texc_env(&argv, &envv, 60);
        let what = format!("trial {trial}: texc {argv:?} env {envv:?}");
        assert!(matches!(ran.code, Some(0..=2)), "{what}: status {:?}\n{}", ran.code, ran.err);
        assert!(!ran.err.contains("panicked"), "{what}: {}", ran.err);
        if ran.code != Some(0) {
            assert!(ran.err.contains("error:"), "{what}: no error message in\n{}", ran.err);
        }
        codes[ran.code.expect("checked") as usize] += 1;
    }
    // The draw reaches every outcome.
    assert!(codes.iter().all(|&c| c > 0), "statuses 0, 1, 2: {codes:?}");
}

/// A bad `--output` path is refused before the work starts: a 4096³ matrix
/// product (minutes on the interpreter) fails at once, status 1, with a
/// message naming the path; nothing is run.
#[test]
fn bad_output_paths_fail_before_the_run() {
    let big = ["run", "examples/sgemm.tex", "--shape", "M=4096,N=4096,K=4096", "--output"];
    let dir = tmp("outputs");
    std::fs::create_dir_all(&dir).expect("dir");
    let plain = file("not-a-dir", "x");
    let missing = dir.join("missing").join("c.npy");
    let under_file = Path::new(&plain).join("c.npy");
    let mut cases = vec![
        (format!("C={}", missing.display()), "does not exist"),
        (format!("C={}", dir.display()), "is a directory"),
        (format!("C={}", under_file.display()), "is not a directory"),
    ];
    // A read-only directory (only where this process is refused too: root writes anywhere).
    let locked = dir.join("locked");
    std::fs::create_dir_all(&locked).expect("dir");
    let mut perms = std::fs::metadata(&locked).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o555);
    std::fs::set_permissions(&locked, perms).expect("chmod");
    if std::fs::write(locked.join("probe"), "x").is_err() {
        cases.push((format!("C={}", locked.join("c.npy").display()), "cannot write in"));
    }
    for (arg, why) in &cases {
        let mut args = big.to_vec();
        args.push(arg);
        let start = Instant::now();
        let r = texc_env(&args, &[], 30);
        let path = arg.trim_start_matches("C=");
        refused(&r, 1, path, arg);
        assert!(r.err.contains(why), "{arg}: no `{why}` in\n{}", r.err);
        assert!(r.out.is_empty(), "{arg}: ran anyway:\n{}", r.out);
        assert!(start.elapsed() < Duration::from_secs(20), "{arg}: took {:?}", start.elapsed());
    }
    // An output the kernel does not have is input misuse, like an unknown `--input` (status 1).
    let mut args = big.to_vec();
    let z = format!("Z={}", dir.join("z.npy").display());
    args.push(&z);
    let r = texc_env(&args, &[], 30);
    refused(&r, 1, "`Z` is not an output of kernel `sgemm`", "unknown output");
    assert!(r.out.is_empty(), "ran anyway:\n{}", r.out);
    // A good path in the same directory still works, and the probe leaves nothing behind.
    let c = dir.join("c.npy");
    let r = texc(&["run", "examples/matmul.tex", "--shape", "M=3,N=4,K=5", "--output", &format!("C={}", c.display())]);
    assert_eq!(r.code, Some(0), "{}", r.err);
    let mut left: Vec<String> =
        std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
    left.sort();
    assert_eq!(left, ["c.npy", "locked"], "only the output is left");
}

/// Long work shows progress on a terminal only: with stderr piped, a run
/// that takes seconds (a 1024³ product checked against the interpreter)
/// prints exactly its results, no bar, spinner or control characters.
#[test]
fn piped_output_has_no_progress_noise() {
    let start = Instant::now();
    let r = texc(&["run", "examples/sgemm.tex", "--target", "x86-avx2", "--check"]);
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert!(start.elapsed() > Duration::from_secs(1), "too quick to tell: a bar would not have been drawn yet");
    assert_eq!(r.err, "", "stderr");
    assert!(!r.out.contains('\r') && !r.out.contains('\x1b'), "control characters in\n{}", r.out);
    let lines: Vec<&str> = r.out.lines().collect();
    assert_eq!(lines.len(), 4, "{}", r.out);
    assert!(lines[0].starts_with("compiled `sgemm` for x86-avx2 in "), "{}", r.out);
    assert!(lines[3].starts_with("  check `C` against interp: relative error "), "{}", r.out);
}

/// On a terminal (a pseudo-terminal from `script`, where it exists) the same
/// kind of run draws a bar with the interpreter's progress, and clears it.
#[test]
fn a_terminal_shows_interpreter_progress() {
    let has_script = Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success());
    if !has_script {
        eprintln!("skipped: no `script` to make a pseudo-terminal");
        return;
    }
    let cmd = format!("{} run examples/sgemm.tex", env!("CARGO_BIN_EXE_texc"));
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).current_dir(root()).output().expect("script runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(tty.contains("interpreting `sgemm`") && tty.contains('%'), "no progress bar in\n{tty}");
    assert!(tty.contains("ran `sgemm` on interp"), "{tty}");
}
