//! What `texc bench` reports: run-time statistics, the roofline bound that
//! limits a kernel, and a small JSON writer (keys in the order written, so
//! the output is deterministic; no dependency for a dozen fields).

pub use texc_pipeline::stats::Stats;

/// The side of the roofline a kernel is on, and so the unit its bound is in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// No FLOPs, or fewer per byte than the ridge: bandwidth limits it (GB/s).
    Memory,
    /// Compute limits it (GFLOP/s).
    Compute,
}

impl Limit {
    pub fn of(flops: f64, intensity: f64, ridge: f64) -> Limit {
        if flops <= 0.0 || intensity < ridge {
            Limit::Memory
        } else {
            Limit::Compute
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Compute => "compute",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Limit::Memory => "GB/s",
            Limit::Compute => "GFLOP/s",
        }
    }
}

/// A JSON value written as text.
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn obj<K: Into<String>>(fields: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Obj(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    pub fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            // JSON has no NaN or infinity.
            Json::Num(x) if !x.is_finite() => out.push_str("null"),
            Json::Num(x) => out.push_str(&format!("{x}")),
            Json::Str(s) => quote(s, out),
            Json::Arr(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    x.write(out);
                }
                out.push(']');
            }
            Json::Obj(v) => {
                out.push('{');
                for (i, (k, x)) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    quote(k, out);
                    out.push_str(": ");
                    x.write(out);
                }
                out.push('}');
            }
        }
    }
}

impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        self.write(&mut s);
        f.write_str(&s)
    }
}

fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_of_known_times() {
        let s = Stats::of(&[5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!((s.min, s.median, s.max, s.mean), (1.0, 3.0, 5.0, 3.0));
        assert!((s.std_dev - 2.5f64.sqrt()).abs() < 1e-12);
        assert_eq!((s.p90, s.p99), (5.0, 5.0));
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::of(&hundred);
        assert_eq!((s.median, s.p90, s.p99, s.max), (50.5, 90.0, 99.0, 100.0));
        let one = Stats::of(&[7.0]);
        assert_eq!((one.std_dev, one.p99, one.median), (0.0, 7.0, 7.0));
    }

    #[test]
    fn json_escapes_and_has_no_nan() {
        let j = Json::obj([
            ("a\"b", Json::str("x\\y\n\u{1}")),
            ("n", Json::Num(f64::NAN)),
            ("v", Json::Arr(vec![Json::Num(1.5), Json::Bool(true), Json::Null])),
        ]);
        assert_eq!(j.to_string(), r#"{"a\"b": "x\\y\n\u0001", "n": null, "v": [1.5, true, null]}"#);
    }

    #[test]
    fn kernels_without_flops_are_memory_bound() {
        assert_eq!(Limit::of(0.0, 0.0, 5.0), Limit::Memory);
        assert_eq!(Limit::of(1e6, 1.0, 5.0), Limit::Memory);
        assert_eq!(Limit::of(1e6, 10.0, 5.0), Limit::Compute);
    }
}
