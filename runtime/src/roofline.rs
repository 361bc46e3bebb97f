//! The machine's roofline: peak f32 FMA throughput and memory bandwidth,
//! measured once per target and thread count and cached in
//! `$XDG_CACHE_HOME/texc/roofline.txt` (or `~/.cache/texc/`), or given by
//! `TEXC_ROOFLINE=GFLOPS,GBS`.
//!
//! Peak: independent FMA chains on 8 (AVX2) or 16 (AVX-512) f32 lanes on
//! every thread. Bandwidth: STREAM triad over three arrays of 1.2 GB in
//! total (the L3 of these machines is large).

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

/// The roofline for `lanes`-wide FMA on `threads` threads: from the
/// environment, the cache, or a measurement (about two seconds), which is
/// then cached. `measured` tells which.
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

pub fn roofline(key: &str, lanes: usize, threads: usize) -> (Roofline, &'static str) {
    if let Ok(Some(r)) = roofline_from_env() {
        return (r, "TEXC_ROOFLINE");
    }
    let tag = format!("{key} {threads}");
    let file = cache_file();
    if let Some(text) = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        for line in text.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() == 4 && format!("{} {}", parts[0], parts[1]) == tag {
                if let (Ok(p), Ok(b)) = (parts[2].parse(), parts[3].parse()) {
                    return (Roofline { peak_gflops: p, bandwidth_gbs: b }, "cached");
                }
            }
        }
    }
    let r = Roofline { peak_gflops: measure_peak(lanes, threads), bandwidth_gbs: measure_bandwidth(threads) };
    if let Some(f) = file {
        let _ = std::fs::create_dir_all(f.parent().expect("has a parent"));
        let old = std::fs::read_to_string(&f).unwrap_or_default();
        let _ =
            crate::atomic::write(&f, format!("{old}{tag} {:.1} {:.1}\n", r.peak_gflops, r.bandwidth_gbs).as_bytes());
    }
    (r, "measured")
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
    let start = Instant::now();
    let sink: f32 = std::thread::scope(|s| {
        (0..threads).map(|_| s.spawn(run)).collect::<Vec<_>>().into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    });
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    let l = if wide { 16.0 } else { 8.0 };
    iters as f64 * CHAINS as f64 * l * 2.0 * threads as f64 / secs / 1e9
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
