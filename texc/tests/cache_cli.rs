//! The compile cache and nest-by-nest compilation (docs/compile-cache.md):
//! a kernel of repeated layers compiles fewer functions than it has nests
//! and agrees with the interpreter; a second compile reads every function
//! from the cache; another target misses; a corrupt or cut entry is
//! recompiled; `--no-cache` and `TEXC_NO_CACHE` write nothing; the code and
//! the results do not depend on the number of compile threads.
//!
//! Each test gives texc a cache directory of its own.

#[path = "../../tests/src/scratch.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = common::scratch("cache-cli").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp");
    dir
}

/// Four same-shaped dense layers (distinct weights): their nests are equal up to buffers.
const LAYERS: &str = "import std.nn;

kernel layers(X: f32[N = 5, K = 37], W1: f32[K, K], W2: f32[K, K], W3: f32[K, K], W4: f32[K, K])
    -> Y: f32[N, K] {
    A = relu(matmul(X, W1));
    B = relu(matmul(A, W2));
    C = relu(matmul(B, W3));
    Y = relu(matmul(C, W4));
}
";

fn model(dir: &Path) -> String {
    let path = dir.join("layers.tex");
    std::fs::write(&path, LAYERS).expect("write");
    path.display().to_string()
}

/// Run `texc args` with the cache in `cache` (`None`: the environment's setting removed) and `env`.
fn texc(args: &[&str], cache: Option<&Path>, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_texc"));
    c.args(args).current_dir(root()).env_remove("TEXC_NO_CACHE");
    match cache {
        Some(dir) => c.env("TEXC_CACHE_DIR", dir),
        None => c.env_remove("TEXC_CACHE_DIR"),
    };
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("texc runs")
}

/// The `--time-passes` note: (nests, distinct functions, from the cache).
fn counts(o: &Output) -> (usize, usize, Option<usize>) {
    let t = text(o);
    let line = t.lines().find(|l| l.starts_with("codegen `")).unwrap_or_else(|| panic!("no codegen note:\n{t}"));
    let num = |before: &str| -> usize {
        let head = &line[..line.find(before).unwrap_or_else(|| panic!("`{before}` in {line}"))];
        head.rsplit(|c: char| !c.is_ascii_digit()).find(|w| !w.is_empty()).expect("a number").parse().expect("n")
    };
    let cached = (!line.contains("cache is off")).then(|| num(" from the compile cache"));
    (num(" loop nests"), num(" distinct functions"), cached)
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "o")).collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn run_args<'a>(file: &'a str, target: &'a str, out: &'a str) -> Vec<&'a str> {
    vec!["run", file, "--target", target, "--time-passes", "--check", "--seed", "3", "--output", out]
}

#[test]
fn repeated_layers_compile_once_and_a_second_compile_reads_the_cache() {
    let dir = fresh_dir("hit");
    let cache = dir.join("cache");
    let file = model(&dir);
    let y1 = dir.join("y1.npy").display().to_string();
    let first = texc(&run_args(&file, "host", &format!("Y={y1}")), Some(&cache), &[]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(text(&first).contains("check `Y` against interp"), "{}", text(&first));
    let (nests, distinct, cached) = counts(&first);
    assert!(distinct < nests, "repeated layers share functions: {nests} nests, {distinct} distinct");
    assert_eq!(cached, Some(0));
    assert_eq!(entries(&cache).len(), distinct);

    let y2 = dir.join("y2.npy").display().to_string();
    let second = texc(&run_args(&file, "host", &format!("Y={y2}")), Some(&cache), &[]);
    assert!(second.status.success(), "{}", text(&second));
    assert_eq!(counts(&second), (nests, distinct, Some(distinct)));
    assert_eq!(std::fs::read(&y1).unwrap(), std::fs::read(&y2).unwrap());
}

#[test]
fn another_target_misses() {
    let dir = fresh_dir("target");
    let cache = dir.join("cache");
    let file = model(&dir);
    let y = format!("Y={}", dir.join("y.npy").display());
    let host = texc(&run_args(&file, "host", &y), Some(&cache), &[]);
    assert!(host.status.success(), "{}", text(&host));
    // Cranelift does not compile nest by nest; x86-avx2 is another LLVM target.
    let avx2 = texc(&run_args(&file, "x86-avx2", &y), Some(&cache), &[]);
    if !avx2.status.success() && text(&avx2).contains("cannot run") {
        return; // a machine without AVX2
    }
    assert!(avx2.status.success(), "{}", text(&avx2));
    assert_eq!(counts(&avx2).2, Some(0), "{}", text(&avx2));
    assert_eq!(entries(&cache).len(), counts(&host).1 + counts(&avx2).1);
}

#[test]
fn corrupt_or_cut_entries_are_recompiled() {
    let dir = fresh_dir("corrupt");
    let cache = dir.join("cache");
    let file = model(&dir);
    let y1 = dir.join("y1.npy").display().to_string();
    let first = texc(&run_args(&file, "host", &format!("Y={y1}")), Some(&cache), &[]);
    assert!(first.status.success(), "{}", text(&first));
    let (nests, distinct, _) = counts(&first);
    let files = entries(&cache);
    for (i, f) in files.iter().enumerate() {
        let mut bytes = std::fs::read(f).unwrap();
        match i % 3 {
            0 => bytes.truncate(bytes.len() / 2),
            1 => {
                let k = bytes.len() - 100;
                bytes[k] ^= 0x40;
            }
            _ => bytes = b"garbage".to_vec(),
        }
        std::fs::write(f, bytes).unwrap();
    }
    let y2 = dir.join("y2.npy").display().to_string();
    let second = texc(&run_args(&file, "host", &format!("Y={y2}")), Some(&cache), &[]);
    assert!(second.status.success(), "{}", text(&second));
    assert_eq!(counts(&second), (nests, distinct, Some(0)));
    assert_eq!(std::fs::read(&y1).unwrap(), std::fs::read(&y2).unwrap());
    // Rewritten whole: the next compile hits.
    let third = texc(&run_args(&file, "host", &format!("Y={y2}")), Some(&cache), &[]);
    assert_eq!(counts(&third).2, Some(distinct));
}

#[test]
fn the_cache_can_be_turned_off() {
    let dir = fresh_dir("off");
    let cache = dir.join("cache");
    let file = model(&dir);
    let y = format!("Y={}", dir.join("y.npy").display());
    let mut args = run_args(&file, "host", &y);
    args.push("--no-cache");
    let flag = texc(&args, Some(&cache), &[]);
    assert!(flag.status.success(), "{}", text(&flag));
    assert_eq!(counts(&flag).2, None);
    let env = texc(&run_args(&file, "host", &y), Some(&cache), &[("TEXC_NO_CACHE", "1")]);
    assert!(env.status.success(), "{}", text(&env));
    assert_eq!(counts(&env).2, None);
    assert!(!cache.exists(), "nothing written to {}", cache.display());
}

#[test]
fn code_and_results_do_not_depend_on_the_number_of_compile_threads() {
    let dir = fresh_dir("threads");
    let file = model(&dir);
    let mut outputs = Vec::new();
    let mut caches = Vec::new();
    for threads in ["1", "2", "3"] {
        let cache = dir.join(format!("cache{threads}"));
        let y = dir.join(format!("y{threads}.npy"));
        let o = texc(
            &run_args(&file, "host", &format!("Y={}", y.display())),
            Some(&cache),
            &[("TEXC_NUM_THREADS", threads)],
        );
        assert!(o.status.success(), "{}", text(&o));
        outputs.push(std::fs::read(&y).unwrap());
        let files: Vec<(std::ffi::OsString, Vec<u8>)> = entries(&cache)
            .into_iter()
            .map(|p| (p.file_name().unwrap().to_owned(), std::fs::read(&p).unwrap()))
            .collect();
        caches.push(files);
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
    assert!(!caches[0].is_empty());
    assert!(caches.windows(2).all(|w| w[0] == w[1]), "the same functions, byte for byte");
}
