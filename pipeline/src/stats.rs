//! Statistics of timed runs (`texc bench`, the Python package's `Kernel.bench`).

/// Statistics of timed runs, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub mean: f64,
    /// Sample standard deviation (n - 1); 0 for a single run.
    pub std_dev: f64,
    pub min: f64,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    /// Statistics of `times` (not empty). Percentiles are nearest-rank: the
    /// smallest time that at least p % of the runs did not exceed, so every
    /// one is a time some run took (with 20 runs, p99 is the slowest).
    pub fn of(times: &[f64]) -> Stats {
        assert!(!times.is_empty(), "at least one timed run");
        let mut t = times.to_vec();
        t.sort_by(f64::total_cmp);
        let n = t.len();
        let mean = t.iter().sum::<f64>() / n as f64;
        let var = if n > 1 { t.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
        let rank = |p: f64| t[((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1];
        let median = if n % 2 == 1 { t[n / 2] } else { (t[n / 2 - 1] + t[n / 2]) / 2.0 };
        Stats { mean, std_dev: var.sqrt(), min: t[0], median, p90: rank(90.0), p99: rank(99.0), max: t[n - 1] }
    }

    /// `(name, seconds)` in the order reports print them.
    pub fn fields(&self) -> [(&'static str, f64); 7] {
        [
            ("mean", self.mean),
            ("std_dev", self.std_dev),
            ("min", self.min),
            ("median", self.median),
            ("p90", self.p90),
            ("p99", self.p99),
            ("max", self.max),
        ]
    }
}
