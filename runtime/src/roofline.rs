//! The machine's roofline: peak f32 FMA throughput and memory bandwidth,
//! measured per target and thread count and cached in
//! `$XDG_CACHE_HOME/texc/roofline.txt` (or `~/.cache/texc/`), one line
//! `TARGET THREADS GFLOPS GBS` each, or given by `TEXC_ROOFLINE=GFLOPS,GBS`.
//!
//! Peak: independent FMA chains on 8 (AVX2) or 16 (AVX-512) f32 lanes on
//! every thread, best of several runs. Bandwidth: STREAM triad over three
//! arrays of 1.2 GB in total (the L3 of these machines is large), best of
//! three. A measurement on a busy machine can come out low; a kernel that
//! then beats it makes `texc bench` measure again ([`remeasure`]), and the
//! cache keeps the better of the two.

use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    pub peak_gflops: f64,
    pub bandwidth_gbs: f64,
}

impl Roofline {
    /// FLOP/byte at which a kernel stops being memory-bound.
    pub fn ridge(&self) -> f64 {
        self.peak_gflops / self.bandwidth_gbs
    }
}

fn cache_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("texc").join("roofline.txt"))
}

/// The roofline `TEXC_ROOFLINE=GFLOPS,GBS` gives, if set; an error if it is
/// not two positive numbers.
pub fn roofline_from_env() -> Result<Option<Roofline>, String> {
    let Ok(v) = std::env::var("TEXC_ROOFLINE") else { return Ok(None) };
    let parsed =
        v.split_once(',').and_then(|(a, b)| Some((a.trim().parse::<f64>().ok()?, b.trim().parse::<f64>().ok()?)));
    match parsed {
        Some((p, bw)) if p > 0.0 && bw > 0.0 && p.is_finite() && bw.is_finite() => {
            Ok(Some(Roofline { peak_gflops: p, bandwidth_gbs: bw }))
        }
        _ => Err(format!("TEXC_ROOFLINE={v}: expected GFLOPS,GBS (two positive numbers, e.g. 240,31)")),
    }
}

/// The roofline for `lanes`-wide FMA on `threads` threads: from the
/// environment, the cache, or a measurement (a few seconds), which is then
/// cached. The second value tells which: `TEXC_ROOFLINE`, `measured`,
/// `cached`, or `re-measured` (cached after [`remeasure`]: measured twice).
/// `threads` should not exceed the cores ([`crate::pool::available_cores`]):
/// more threads than cores cannot compute more.
pub fn roofline(key: &str, lanes: usize, threads: usize) -> (Roofline, &'static str) {
    if let Ok(Some(r)) = roofline_from_env() {
        return (r, "TEXC_ROOFLINE");
    }
    if let Some((r, twice)) = cached(key, threads) {
        return (r, if twice { "re-measured" } else { "cached" });
    }
    let r = measure(lanes, threads);
    store(key, threads, r, false);
    (r, "measured")
}

/// Measure again after a kernel ran faster than `old` allows: the better of
/// the two for each number, which replaces the cached line.
pub fn remeasure(key: &str, lanes: usize, threads: usize, old: Roofline) -> Roofline {
    let now = measure(lanes, threads);
    let r = Roofline {
        peak_gflops: now.peak_gflops.max(old.peak_gflops),
        bandwidth_gbs: now.bandwidth_gbs.max(old.bandwidth_gbs),
    };
    store(key, threads, r, true);
    r
}

fn measure(lanes: usize, threads: usize) -> Roofline {
    Roofline { peak_gflops: measure_peak(lanes, threads), bandwidth_gbs: measure_bandwidth(threads) }
}

/// The cached line `key threads GFLOPS GBS [re-measured]`, if there is a
/// valid one, and whether it was measured twice.
fn cached(key: &str, threads: usize) -> Option<(Roofline, bool)> {
    let text = std::fs::read_to_string(cache_file()?).ok()?;
    text.lines().rev().find_map(|line| {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let twice = parts.get(4) == Some(&"re-measured");
        if !(parts.len() == 4 || parts.len() == 5 && twice) || parts[0] != key {
            return None;
        }
        if parts[1].parse::<usize>().ok()? != threads {
            return None;
        }
        let (p, b) = (parts[2].parse::<f64>().ok()?, parts[3].parse::<f64>().ok()?);
        let valid = p > 0.0 && b > 0.0 && p.is_finite() && b.is_finite();
        valid.then_some((Roofline { peak_gflops: p, bandwidth_gbs: b }, twice))
    })
}

/// Replace the line of `key threads` in the cache (best effort: without a
/// cache directory texc measures every time).
fn store(key: &str, threads: usize, r: Roofline, twice: bool) {
    let Some(f) = cache_file() else { return };
    let _ = std::fs::create_dir_all(f.parent().expect("has a parent"));
    let old = std::fs::read_to_string(&f).unwrap_or_default();
    let mut text: String = old
        .lines()
        .filter(|line| {
            let mut w = line.split_whitespace();
            !(w.next() == Some(key) && w.next().and_then(|t| t.parse::<usize>().ok()) == Some(threads))
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let mark = if twice { " re-measured" } else { "" };
    text += &format!("{key} {threads} {:.1} {:.1}{mark}\n", r.peak_gflops, r.bandwidth_gbs);
    let _ = crate::atomic::write(&f, text.as_bytes());
}

const CHAINS: usize = 12;

#[target_feature(enable = "avx2,fma")]
unsafe fn fma8(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut out = [0f32; 8];
    let mut s = acc[0];
    for x in &acc[1..] {
        s = _mm256_add_ps(s, *x);
    }
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    out.iter().sum()
}

#[target_feature(enable = "avx512f")]
unsafe fn fma16(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    let mut s = acc[0];
    for x in &acc[1..] {
        s = _mm512_add_ps(s, *x);
    }
    _mm512_reduce_add_ps(s)
}

fn measure_peak(lanes: usize, threads: usize) -> f64 {
    let wide = lanes >= 16 && is_x86_feature_detected!("avx512f");
    if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("fma") {
        return 0.0;
    }
    let iters = 20_000_000u64;
    let run = move || {
        // SAFETY: the features were detected above.
        unsafe {
            if wide {
                fma16(iters)
            } else {
                fma8(iters)
            }
        }
    };
    run(); // warm up clocks
           // The best of a few runs: another process taking a core slows one run, not all.
    let mut best = 0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let sink: f32 = std::thread::scope(|s| {
            (0..threads).map(|_| s.spawn(run)).collect::<Vec<_>>().into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(sink);
        let l = if wide { 16.0 } else { 8.0 };
        best = best.max(iters as f64 * CHAINS as f64 * l * 2.0 * threads as f64 / secs / 1e9);
    }
    best
}

fn measure_bandwidth(threads: usize) -> f64 {
    let n = 100_000_000usize; // 3 arrays of f32: 1.2 GB
    let mut a = vec![0f32; n];
    let b = vec![1f32; n];
    let c = vec![2f32; n];
    let chunk = n.div_ceil(threads);
    let mut best = 0f64;
    for _ in 0..3 {
        let start = Instant::now();
        std::thread::scope(|s| {
            for ((ac, bc), cc) in a.chunks_mut(chunk).zip(b.chunks(chunk)).zip(c.chunks(chunk)) {
                s.spawn(move || {
                    for ((x, y), z) in ac.iter_mut().zip(bc).zip(cc) {
                        *x = y + 3.0 * z;
                    }
                });
            }
        });
        let secs = start.elapsed().as_secs_f64();
        best = best.max(3.0 * 4.0 * n as f64 / secs / 1e9);
    }
    std::hint::black_box(&a);
    best
}
