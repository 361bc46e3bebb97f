//! `texc bench`: statistics, `--json`, `--threads`, `--check`, `--output`,
//! and a roofline that is never exceeded (re-measured when a kernel beats a
//! cached one, keyed by thread count).

#[path = "../../tests/src/scratch.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn tmp(name: &str) -> PathBuf {
    let d = common::scratch("bench");
    std::fs::create_dir_all(&d).expect("tmp");
    d.join(name)
}

/// texc with its own roofline cache directory (`cache`), no `TEXC_ROOFLINE`.
fn bench(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_texc"))
        .arg("bench")
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .env_remove("TEXC_ROOFLINE")
        .env_remove("TEXC_NUM_THREADS")
        .current_dir(root())
        .output()
        .expect("texc runs")
}

fn json(o: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().count(), 1, "one JSON object on one line:\n{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

fn num(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// A cache file holding `line`, in a fresh cache directory.
fn cache_with(name: &str, line: &str) -> PathBuf {
    let dir = tmp(name);
    std::fs::create_dir_all(dir.join("texc")).expect("dir");
    std::fs::write(dir.join("texc/roofline.txt"), line).expect("write cache");
    dir
}

#[test]
fn json_has_every_statistic_and_the_bound() {
    let cache = cache_with("cache-json", "x86-avx2 1 1000000.0 1000000.0\n");
    let o =
        bench(&["examples/matmul.tex", "--target", "x86-avx2", "--repeat", "7", "--threads", "1", "--json"], &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let j = json(&o);
    assert_eq!(j["kernel"], "matmul");
    assert_eq!(j["target"], "x86-avx2");
    assert_eq!(j["sizes"]["M"], 64);
    assert_eq!(j["threads"], 1);
    assert_eq!(j["roofline_threads"], 1);
    assert_eq!(j["runs"], 7);
    let t: Vec<f64> = ["min", "median", "p90", "p99", "max"].iter().map(|k| num(&j, &["time_ms", k])).collect();
    assert!(t.windows(2).all(|w| w[0] <= w[1]) && t[0] > 0.0, "ordered times: {t:?}");
    let mean = num(&j, &["time_ms", "mean"]);
    assert!(t[0] <= mean && mean <= t[4]);
    assert!(num(&j, &["time_ms", "std_dev"]) >= 0.0);
    // 2·64³ FLOPs; A, B and C once each.
    assert_eq!(num(&j, &["flops"]), 2.0 * 64.0 * 64.0 * 64.0);
    assert_eq!(num(&j, &["bytes"]), 3.0 * 64.0 * 64.0 * 4.0);
    assert_eq!(j["bound"]["limit"], "compute");
    assert_eq!(j["bound"]["unit"], "GFLOP/s");
    assert_eq!(j["machine"]["source"], "cached", "the cached line for 1 thread is used");
    assert_eq!(num(&j, &["machine", "peak_gflops"]), 1e6);
    assert!(j["check"].is_null());
    // A and B are the arguments; the product has no temporaries.
    assert_eq!(num(&j, &["memory", "argument_bytes"]), 2.0 * 64.0 * 64.0 * 4.0);
    assert_eq!(num(&j, &["memory", "arena_bytes"]), 0.0);
    // The same run, twice: the same keys in the same order.
    let keys = |v: &serde_json::Value| v.as_object().expect("object").keys().cloned().collect::<Vec<_>>();
    let o2 =
        bench(&["examples/matmul.tex", "--target", "x86-avx2", "--repeat", "2", "--threads", "1", "--json"], &cache);
    assert_eq!(keys(&j), keys(&json(&o2)));
}

/// `memory` in `--json`: the arguments' bytes (a scalar takes none) and
/// the arena of the temporaries, as `texc analyze` plans it.
#[test]
fn json_memory_is_the_arguments_and_the_planned_arena() {
    let cache = cache_with("cache-memory", "x86-avx2 1 1000000.0 1000000.0\n");
    let args = ["examples/conv_bn_relu.tex", "--target", "x86-avx2"];
    let o = bench(&[&args[..], &["--repeat", "2", "--threads", "1", "--json"]].concat(), &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let j = json(&o);
    // X 1×16×14×14, Wt 32×16×3×3, four vectors of 32, and `eps`, a scalar.
    let floats = 16 * 14 * 14 + 32 * 16 * 9 + 4 * 32;
    assert_eq!(num(&j, &["memory", "argument_bytes"]), (4 * floats) as f64);
    let arena = num(&j, &["memory", "arena_bytes"]);
    assert!(arena > 0.0, "conv, batch norm and relu leave temporaries: {j}");
    let analyzed = Command::new(env!("CARGO_BIN_EXE_texc"))
        .arg("analyze")
        .args(args)
        .current_dir(root())
        .output()
        .expect("texc runs");
    let text = String::from_utf8_lossy(&analyzed.stdout);
    // "… in one arena of 34,944 bytes, …"
    let planned: f64 = text
        .split_once("in one arena of ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(|n| n.replace(',', ""))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("`analyze` prints no arena:\n{text}"));
    assert_eq!(arena, planned, "`bench` and `analyze` plan different arenas:\n{text}");
}

#[test]
fn text_report_has_mean_std_dev_and_percentiles() {
    let cache = cache_with("cache-text", "x86-avx2 1 1000000.0 1000000.0\n");
    let o = bench(&["examples/matmul.tex", "--target", "x86-avx2", "--repeat", "5", "--threads", "1"], &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for want in ["median of 5 runs; mean ", "(std dev), min ", ", p90 ", ", p99 ", ", max ", "1 thread\n"] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

/// A kernel that beats a cached roofline makes texc measure again: the
/// cache line is replaced (marked re-measured) and nothing is over 100 %.
#[test]
fn a_beaten_roofline_is_measured_again_and_never_exceeded() {
    let cache = cache_with("cache-low", "x86-avx2 1 0.001 0.001\nx86-avx2 2 7.0 7.0\n");
    let o =
        bench(&["examples/conv2d.tex", "--target", "x86-avx2", "--repeat", "3", "--threads", "1", "--json"], &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let j = json(&o);
    assert_eq!(j["machine"]["source"], "re-measured now");
    assert!(err(&o).contains("ran faster than the cached roofline (0.0 GFLOP/s, 0.0 GB/s): measured it again"));
    for p in [&["bound", "percent"][..], &["percent_of_peak"], &["percent_of_bandwidth"]] {
        let x = num(&j, p);
        assert!(x > 0.0 && x <= 100.0, "{p:?} = {x}");
    }
    let text = std::fs::read_to_string(cache.join("texc/roofline.txt")).expect("cache");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "the 1-thread line is replaced, the 2-thread one kept:\n{text}");
    assert_eq!(lines[0], "x86-avx2 2 7.0 7.0");
    assert!(lines[1].starts_with("x86-avx2 1 ") && lines[1].ends_with(" re-measured"), "{text}");
    let peak: f64 = lines[1].split_whitespace().nth(2).expect("peak").parse().expect("number");
    assert!(peak > 1.0, "{text}");
    // A line measured twice is not measured a third time: the kernel is
    // reported against what it achieved, at most 100 %.
    std::fs::write(cache.join("texc/roofline.txt"), "x86-avx2 1 0.001 0.001 re-measured\n").expect("write");
    let o =
        bench(&["examples/conv2d.tex", "--target", "x86-avx2", "--repeat", "3", "--threads", "1", "--json"], &cache);
    let j = json(&o);
    assert_eq!(j["machine"]["source"], "re-measured");
    assert_eq!(num(&j, &["bound", "percent"]), 100.0);
    assert!(num(&j, &["percent_of_bandwidth"]) <= 100.0 && num(&j, &["percent_of_peak"]) <= 100.0);
    assert!(err(&o).contains("is above the re-measured peak"), "{}", err(&o));
}

/// An integer kernel is rated against the 8-bit peak, a multiple of the f32
/// one; measuring again keeps the cache in f32 (it once stored the multiple,
/// and every later f32 kernel was rated against a peak 2–4× too high).
#[test]
fn a_roofline_measured_again_for_an_integer_kernel_stays_f32() {
    let cache = cache_with("cache-int8", "x86-avx2 1 100000.0 0.001\n");
    let o = bench(&["examples/qlinear.tex", "--target", "x86-avx2", "--repeat", "3", "--threads", "1"], &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(err(&o).contains("measured it again"), "{}", err(&o));
    let text = std::fs::read_to_string(cache.join("texc/roofline.txt")).expect("cache");
    let peak: f64 = text.split_whitespace().nth(2).expect("peak").parse().expect("number");
    assert_eq!(peak, 100000.0, "the f32 peak is kept, not the 8-bit one:\n{text}");
}

/// A kernel without FLOPs is bounded by bandwidth, reported in GB/s.
#[test]
fn memory_bound_kernels_are_reported_in_gb_per_s() {
    let cache = cache_with("cache-mem", "x86-avx2 1 100.0 1000000.0\n");
    let o = bench(&["examples/im2col.tex", "--target", "x86-avx2", "--repeat", "3", "--threads", "1"], &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("% of the memory bound 1000000.0 GB/s (memory-bound at 0.00 FLOP/byte"), "{out}");
    assert!(!out.contains("bound 0.0 GFLOP/s"), "{out}");
}

/// More threads than cores run (sharing them); the roofline is that of the cores.
#[test]
fn threads_beyond_the_cores_use_the_roofline_of_the_cores() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cache = cache_with("cache-threads", &format!("x86-avx2 {cores} 1000000.0 1000000.0\n"));
    let n = (cores * 4).to_string();
    let o = bench(&["examples/matmul.tex", "--target", "x86-avx2", "--repeat", "2", "--threads", &n, "--json"], &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let j = json(&o);
    assert_eq!(num(&j, &["threads"]), (cores * 4) as f64);
    assert_eq!(num(&j, &["roofline_threads"]), cores as f64);
    assert_eq!(j["machine"]["source"], "cached");
    for bad in ["0", "100000", "two"] {
        let o = bench(&["examples/matmul.tex", "--target", "x86-avx2", "--threads", bad], &cache);
        assert_eq!(o.status.code(), Some(2), "--threads {bad}: {}", err(&o));
        assert!(err(&o).contains("--threads"), "{}", err(&o));
    }
}

#[test]
fn check_compares_with_the_interpreter_and_fails_beyond_the_tolerance() {
    let cache = cache_with("cache-check", "x86-avx2 1 1000000.0 1000000.0\n");
    let args = ["examples/conv2d.tex", "--target", "x86-avx2", "--repeat", "2", "--threads", "1", "--check"];
    let o = bench(&args, &cache);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("check `Y` against interp: relative error"), "{out}");
    // No f32 convolution matches the interpreter to 1e-12.
    let mut strict = args.to_vec();
    strict.extend(["--tolerance", "1e-12", "--json"]);
    let o = bench(&strict, &cache);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("`Y` differs from the interpreter: relative error"), "{}", err(&o));
    let j = json(&o);
    assert_eq!(j["check"][0]["output"], "Y");
    assert_eq!(j["check"][0]["passed"], false);
    assert!(num(&j["check"][0], &["error"]) > 1e-12);
}

#[test]
fn output_writes_what_the_timed_runs_computed() {
    let cache = cache_with("cache-out", "x86-avx2 1 1000000.0 1000000.0\n");
    let y = tmp("bench-y.npy");
    let o = bench(
        &[
            "examples/matmul.tex",
            "--target",
            "x86-avx2",
            "--repeat",
            "2",
            "--threads",
            "1",
            "--shape",
            "M=5,N=7",
            "--output",
            &format!("C={}", y.display()),
        ],
        &cache,
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("wrote `C` to {}", y.display())));
    let c = texc_runtime::read_npy(&y).expect("a readable .npy");
    assert_eq!(c.shape, vec![5, 7]);
    // The same seed on the interpreter gives the same matrix.
    let z = tmp("run-y.npy");
    let r = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(["run", "examples/matmul.tex", "--shape", "M=5,N=7", "--output", &format!("C={}", z.display())])
        .current_dir(root())
        .output()
        .expect("runs");
    assert_eq!(r.status.code(), Some(0));
    let want = texc_runtime::read_npy(&z).expect("npy").to_f64();
    let got = c.to_f64();
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-5 * scale), "{got:?} vs {want:?}");
    let o = bench(&["examples/matmul.tex", "--target", "x86-avx2", "--output", "Z=/tmp/z.npy"], &cache);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("`Z` is not an output of kernel `matmul`"), "{}", err(&o));
}

/// `--profile` times every top-level loop nest alone, compiled as a kernel
/// of its own on the whole kernel's buffers: one row per nest (the weights
/// folded with the batch norm, the padded input, the convolution, the
/// epilogue), slowest first, named by what it writes; the results are
/// still checked. On both CPU backends.
#[test]
fn profile_times_each_loop_nest() {
    let cache = cache_with("cache-profile", "x86-avx2 1 1000000.0 1000000.0\ncranelift 1 1000000.0 1000000.0\n");
    for target in ["x86-avx2", "cranelift"] {
        let args = [
            "examples/conv_bn_relu.tex",
            "--target",
            target,
            "--repeat",
            "3",
            "--threads",
            "1",
            "--check",
            "--profile",
        ];
        let o = bench(&[&args[..], &["--json"]].concat(), &cache);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        let j = json(&o);
        assert_eq!(j["check"][0]["passed"], true, "{j}");
        let rows = j["profile"].as_array().expect("profile rows");
        let mut nests: Vec<u64> = rows.iter().map(|r| r["nest"].as_u64().expect("index")).collect();
        let times: Vec<f64> = rows.iter().map(|r| r["median_ms"].as_f64().expect("ms")).collect();
        assert!(times.iter().all(|&t| t > 0.0) && times.windows(2).all(|w| w[0] >= w[1]), "{target}: {times:?}");
        nests.sort();
        assert_eq!(nests, (0..rows.len() as u64).collect::<Vec<_>>(), "{target}: each nest once");
        let labels: Vec<&str> = rows.iter().map(|r| r["label"].as_str().expect("label")).collect();
        // The padded input is `Y.Xp` for the direct convolution, `Y.T.Xp` for Winograd's.
        assert!(labels.contains(&"Y"), "{target}: no nest writing Y: {labels:?}");
        assert!(labels.iter().any(|l| l.ends_with(".Xp")), "{target}: no nest writing the padded input: {labels:?}");
        let o = bench(&args, &cache);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let want = format!("profile   {} loop nests, each timed alone (median of 3 runs)", rows.len());
        assert!(out.contains(&want), "{out}");
    }
}

/// `--profile` rates each nest by the operations its code executes
/// (`texc_schedules::work`): a product with a bias, at sizes no vector or
/// block divides (13 × 37, 29 deep: masked tails and guarded blocks),
/// executes exactly the FLOPs of the program as written, 2·M·N·K + M·N,
/// summed over its nests, on both CPU backends; the table has the rate.
#[test]
fn profile_counts_what_each_nest_executes() {
    let cache = cache_with("cache-profile-work", "x86-avx2 1 1000000.0 1000000.0\ncranelift 1 1000000.0 1000000.0\n");
    let src = tmp("profile_work.tex");
    std::fs::write(
        &src,
        "kernel mmb(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C: f32[M, N] {\n    C[i, j] = sum[k](A[i, k] * B[k, j]) + b[j];\n}\n",
    )
    .expect("write");
    let (m, n, k) = (13.0, 37.0, 29.0);
    for target in ["x86-avx2", "cranelift"] {
        let src = src.to_str().expect("utf-8");
        let args =
            [src, "--shape", "M=13,N=37,K=29", "--target", target, "--repeat", "2", "--threads", "1", "--profile"];
        let o = bench(&[&args[..], &["--json"]].concat(), &cache);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        let j = json(&o);
        let rows = j["profile"].as_array().expect("profile rows");
        let executed: f64 = rows.iter().map(|r| r["flops"].as_f64().expect("flops")).sum();
        assert_eq!(executed, 2.0 * m * n * k + m * n, "{target}: {j}");
        assert_eq!(num(&j, &["flops"]), executed, "{target}");
        assert!(rows.iter().any(|r| r["gops"].as_f64().is_some_and(|g| g > 0.0)), "{target}: no rate: {j}");
        let o = bench(&args, &cache);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("GFLOP/s   peak"),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}
