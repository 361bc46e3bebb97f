//! Calibration statistics for `texc quantize`: each tensor's range over the
//! calibration data, streamed batch by batch, and the range each method
//! keeps; then scales and zero points as ONNX Runtime computes them.
//!
//! Invariants: memory per tensor is a fixed-size histogram (`BINS` counts),
//! never the data; every method is deterministic in the data's order only
//! through sums of counts (order-independent).

/// Bins of the histograms (TensorRT's entropy calibration and ONNX Runtime's
/// percentile calibration both use 2048).
pub const BINS: usize = 2048;
/// Bins of the quantized distribution the entropy method compares against
/// (128: the magnitudes of int8).
const QUANT_BINS: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Method {
    MinMax,
    Entropy,
    /// The share of |x| kept, in percent (ONNX Runtime's default 99.999).
    Percentile(f64),
}

impl Method {
    pub fn parse(s: &str) -> Result<Method, String> {
        match s {
            "minmax" => Ok(Method::MinMax),
            "entropy" => Ok(Method::Entropy),
            "percentile" => Ok(Method::Percentile(99.999)),
            _ => {
                let p = s.strip_prefix("percentile=").ok_or_else(|| {
                    format!("--method {s}: expected minmax, entropy, percentile or percentile=P (like 99.99)")
                })?;
                match p.parse::<f64>() {
                    Ok(v) if v > 0.0 && v <= 100.0 => Ok(Method::Percentile(v)),
                    _ => Err(format!("--method {s}: the percentile must be a number in (0, 100], like 99.99")),
                }
            }
        }
    }

    pub fn needs_histogram(self) -> bool {
        self != Method::MinMax
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Method::MinMax => write!(f, "minmax"),
            Method::Entropy => write!(f, "entropy"),
            Method::Percentile(p) => write!(f, "percentile={p}"),
        }
    }
}

/// Smallest and largest value seen (first pass).
#[derive(Clone, Copy, Debug)]
pub struct MinMax {
    pub min: f32,
    pub max: f32,
    pub count: u64,
}

impl Default for MinMax {
    fn default() -> Self {
        MinMax { min: f32::INFINITY, max: f32::NEG_INFINITY, count: 0 }
    }
}

impl MinMax {
    pub fn add(&mut self, xs: &[f32]) {
        for &x in xs {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        self.count += xs.len() as u64;
    }

    pub fn abs_max(&self) -> f32 {
        self.min.abs().max(self.max.abs())
    }
}

/// A histogram of |x| over `[0, top]` in `BINS` equal bins (second pass,
/// once the first has found `top`, so that no bin is ever re-spread).
#[derive(Clone, Debug)]
pub struct Histogram {
    pub top: f32,
    pub counts: Vec<u64>,
}

impl Histogram {
    pub fn new(top: f32) -> Histogram {
        Histogram { top, counts: vec![0; BINS] }
    }

    pub fn add(&mut self, xs: &[f32]) {
        if self.top <= 0.0 {
            self.counts[0] += xs.len() as u64;
            return;
        }
        let per = BINS as f32 / self.top;
        for &x in xs {
            let b = ((x.abs() * per) as usize).min(BINS - 1);
            self.counts[b] += 1;
        }
    }

    fn edge(&self, i: usize) -> f32 {
        self.top * i as f32 / BINS as f32
    }

    /// ONNX Runtime's percentile threshold (its symmetric form): the
    /// upper edge where the cumulative share of |x| first reaches `p`%.
    pub fn percentile(&self, p: f64) -> f32 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let want = p / 100.0;
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen as f64 / total as f64 >= want {
                return self.edge(i + 1);
            }
        }
        self.top
    }

    /// TensorRT's entropy calibration: the threshold `t` (a bin edge from
    /// 128 bins up) whose clipped distribution P, quantized to 128 levels
    /// and expanded back (Q), has the least KL divergence KL(P‖Q).
    pub fn entropy(&self) -> f32 {
        let h = &self.counts;
        if h.iter().sum::<u64>() == 0 {
            return 0.0;
        }
        let mut best = (f64::INFINITY, BINS);
        for i in QUANT_BINS..=BINS {
            // Reference: the first i bins, outliers folded into the last.
            let mut p: Vec<f64> = h[..i].iter().map(|&c| c as f64).collect();
            p[i - 1] += h[i..].iter().sum::<u64>() as f64;
            let q = quantized(&h[..i], &p);
            let kl = kl_divergence(&p, &q);
            if kl < best.0 {
                best = (kl, i);
            }
        }
        self.edge(best.1)
    }
}

/// The first `i` bins merged into `QUANT_BINS` groups of `i / 128` bins
/// (the remainder joins the last), each group's count spread evenly over
/// the bins where `p` is non-zero (as TensorRT's algorithm, in MXNet's and
/// TVM's published form, does).
fn quantized(h: &[u64], p: &[f64]) -> Vec<f64> {
    let i = h.len();
    let merged = i / QUANT_BINS;
    let mut q = vec![0.0; i];
    for g in 0..QUANT_BINS {
        let lo = g * merged;
        let hi = if g == QUANT_BINS - 1 { i } else { lo + merged };
        let sum: u64 = h[lo..hi].iter().sum();
        let nonzero = p[lo..hi].iter().filter(|&&c| c != 0.0).count();
        if nonzero > 0 {
            for j in lo..hi {
                if p[j] != 0.0 {
                    q[j] = sum as f64 / nonzero as f64;
                }
            }
        }
    }
    q
}

/// Counts made strictly positive without changing their sum: `eps` added
/// to each empty bin, taken evenly from the others (MXNet's
/// `_smooth_distribution`, eps 1e-4); `None` when all are empty.
fn smoothed(p: &[f64]) -> Option<Vec<f64>> {
    const EPS: f64 = 1e-4;
    let zeros = p.iter().filter(|&&x| x == 0.0).count();
    let nonzeros = p.len() - zeros;
    if nonzeros == 0 {
        return None;
    }
    let eps1 = EPS * zeros as f64 / nonzeros as f64;
    Some(p.iter().map(|&x| if x == 0.0 { EPS } else { x - eps1 }).collect())
}

/// KL(P‖Q) of two count vectors, each normalized (scipy's `entropy`).
fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    let (Some(p), Some(q)) = (smoothed(p), smoothed(q)) else { return f64::INFINITY };
    let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
    let mut kl = 0.0;
    for (&a, &b) in p.iter().zip(&q) {
        let (a, b) = (a / sp, b / sq);
        if a > 0.0 && b > 0.0 {
            kl += a * (a / b).ln();
        }
    }
    kl
}

/// The range a method keeps of a tensor: `(rmin, rmax)`.
pub fn range(method: Method, mm: &MinMax, hist: Option<&Histogram>) -> (f32, f32) {
    let t = match (method, hist) {
        (Method::MinMax, _) | (_, None) => return (mm.min, mm.max),
        (Method::Entropy, Some(h)) => h.entropy(),
        (Method::Percentile(p), Some(h)) => h.percentile(p),
    };
    // Symmetric about 0, never wider than what was seen (as ORT clamps).
    ((-t).max(mm.min), t.min(mm.max))
}

/// Quantization of a tensor: `q = saturate(round_half_even(x / scale) + zero_point)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QParams {
    pub scale: f32,
    pub zero_point: i32,
    pub qmin: i32,
    pub qmax: i32,
}

impl QParams {
    #[cfg(test)]
    pub fn fake(&self, x: f32) -> f32 {
        let q = ((x / self.scale).round_ties_even() as i64 + self.zero_point as i64)
            .clamp(self.qmin as i64, self.qmax as i64);
        (q - self.zero_point as i64) as f32 * self.scale
    }
}

/// Activations: u8 asymmetric, or i8 symmetric (`symmetric`); ONNX
/// Runtime's `compute_scale_zp`: the range widened to hold 0, made
/// symmetric when asked, a zero range given scale 1.
pub fn activation_params(rmin: f32, rmax: f32, symmetric: bool) -> QParams {
    let (qmin, qmax) = if symmetric { (-127, 127) } else { (0, 255) };
    compute_scale_zp(rmin, rmax, qmin, qmax, symmetric)
}

/// Weights: i8 symmetric in [-127, 127], or in [-64, 64] with
/// `reduce_range` (ONNX Runtime's 7-bit range), zero point 0.
pub fn weight_params(abs_max: f32, reduce_range: bool) -> QParams {
    let q = if reduce_range { 64 } else { 127 };
    compute_scale_zp(-abs_max, abs_max, -q, q, true)
}

fn compute_scale_zp(rmin: f32, rmax: f32, qmin: i32, qmax: i32, symmetric: bool) -> QParams {
    let (mut rmin, mut rmax) = (rmin.min(0.0), rmax.max(0.0));
    if symmetric {
        let a = rmin.abs().max(rmax.abs());
        (rmin, rmax) = (-a, a);
    }
    let scale = (rmax - rmin) / (qmax - qmin) as f32;
    if scale.is_nan() || scale <= f32::EPSILON {
        return QParams { scale: 1.0, zero_point: if symmetric { (qmin + qmax + 1) / 2 } else { qmin }, qmin, qmax };
    }
    let zero_point = if symmetric {
        ((qmin + qmax) as f32 / 2.0).round_ties_even() as i32
    } else {
        (qmin as f32 - rmin / scale).round_ties_even() as i32
    };
    QParams { scale, zero_point: zero_point.clamp(qmin, qmax), qmin, qmax }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_and_zero_point_are_ort_s() {
        let p = activation_params(-1.0, 3.0, false);
        assert_eq!(p.scale, 4.0 / 255.0);
        assert_eq!(p.zero_point, 64); // round(0 + 1 / (4/255)) = round(63.75)
        let p = activation_params(0.5, 2.0, false); // widened to hold 0
        assert_eq!((p.scale, p.zero_point), (2.0 / 255.0, 0));
        let p = activation_params(-1.0, 3.0, true);
        assert_eq!((p.scale, p.zero_point), (6.0 / 254.0, 0));
        let p = activation_params(0.0, 0.0, false);
        assert_eq!((p.scale, p.zero_point), (1.0, 0));
        let w = weight_params(2.54, false);
        assert_eq!((w.scale, w.zero_point), (0.02, 0));
        assert_eq!(w.fake(1.0), 0.02 * 50.0);
        assert_eq!(w.fake(100.0), 0.02 * 127.0);
        // ORT's reduce_range: 7 bits, [-64, 64].
        let w = weight_params(2.56, true);
        assert_eq!((w.scale, w.zero_point, w.qmin, w.qmax), (0.04, 0, -64, 64));
    }

    #[test]
    fn methods_parse_and_bad_ones_are_named() {
        assert_eq!(Method::parse("percentile=99.99"), Ok(Method::Percentile(99.99)));
        assert!(Method::parse("kl").unwrap_err().contains("--method kl"));
        assert!(Method::parse("percentile=101").is_err());
    }

    #[test]
    fn percentile_and_entropy_clip_outliers() {
        // 100000 values spread over [-1, 1) and one outlier at 8.
        let mut xs: Vec<f32> = (0..100_000).map(|i| (i as f32 / 50_000.0) - 1.0).collect();
        xs.push(8.0);
        let mut mm = MinMax::default();
        mm.add(&xs);
        let mut h = Histogram::new(mm.abs_max());
        h.add(&xs);
        let (lo, hi) = range(Method::Percentile(99.9), &mm, Some(&h));
        assert!((0.99..1.01).contains(&hi) && lo == -1.0, "{lo} {hi}");
        let (_, hi) = range(Method::Entropy, &mm, Some(&h));
        assert!((0.9..1.5).contains(&hi), "entropy kept the outlier or cut the data: {hi}");
        assert_eq!(range(Method::MinMax, &mm, None), (-1.0, 8.0));
    }
}
