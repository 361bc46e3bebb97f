//! The interpreter's fast path (`interp::run`: compiled stage expressions,
//! elements on several threads) against its definition
//! (`interp::run_reference`: the tree walk, one element after another),
//! bit for bit: on random programs over every element type with extreme
//! inputs, on every example and standard operator, and on the corners the
//! semantics pin down.

use std::collections::HashMap;
use texc_compiler::interp::{self, Arg};
use texc_compiler::tir::Program;
use texc_compiler::Bindings;
use texc_runtime::{DType, SplitMix64, Tensor};

/// Every output, bit for bit (NaN payloads and the sign of zero included).
fn assert_identical(what: &str, p: &Program, args: Vec<Arg>) {
    let fast = interp::run(p, args.clone());
    let reference = interp::run_reference(p, args);
    match (fast, reference) {
        (Ok(fast), Ok(reference)) => {
            for ((f, r), &o) in fast.iter().zip(&reference).zip(&p.outputs) {
                let name = &p.tensor(o).name;
                assert_eq!((f.dtype(), &f.shape), (r.dtype(), &r.shape), "{what}: `{name}`");
                match (f.to_i64(), r.to_i64()) {
                    (Some(a), Some(b)) => assert_eq!(a, b, "{what}: `{name}`"),
                    _ => {
                        let bits = |t: &Tensor| t.to_f64().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(f), bits(r), "{what}: `{name}`");
                    }
                }
            }
        }
        (fast, reference) => assert_eq!(fast.err(), reference.err(), "{what}"),
    }
}

fn program(src: &str, shapes: &[(&str, i64)]) -> Program {
    let (mut pl, k) = texc_tests::load_text("interp", "t.tex", src, None).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
    match pl.specialize(k, &b) {
        Ok(p) => p,
        Err(e) => panic!("{}\n{src}", texc_tests::rendered(&pl, e)),
    }
}

const FLOATS: [&str; 4] = ["f32", "f64", "f16", "bf16"];
const INTS: [&str; 4] = ["i32", "i8", "u8", "i64"];

/// Values that exercise wrapping, saturation, NaN, infinities, signed zeros
/// and half-precision rounding, mixed with ordinary ones.
fn extreme_tensor(dtype: DType, shape: Vec<usize>, rng: &mut SplitMix64) -> Tensor {
    let n: usize = shape.iter().product();
    if dtype.is_float() {
        let special = [0.0, -0.0, 1.0, -1.5, 0.5, 65504.0, 1e-8, 3.0e38, f64::NAN, f64::INFINITY, -f64::INFINITY, 2.5];
        let v: Vec<f64> = (0..n)
            .map(|_| match rng.next_u64() % 4 {
                0 => special[(rng.next_u64() % special.len() as u64) as usize],
                _ => rng.next_f64() * 8.0 - 4.0,
            })
            .collect();
        return Tensor::from_f64(dtype, shape, &v);
    }
    let special = [0, 1, -1, 2, -7, 127, -128, 255, 300, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN];
    let v: Vec<i64> = (0..n)
        .map(|_| {
            let x = match rng.next_u64() % 3 {
                0 => special[(rng.next_u64() % special.len() as u64) as usize],
                _ => (rng.next_u64() % 21) as i64 - 10,
            };
            texc_runtime::wrap_to(dtype, x)
        })
        .collect();
    Tensor::from_i64(dtype, shape, &v)
}

/// Random well-typed expressions over the inputs `X_<type>[N, M]`.
struct Gen<'r> {
    rng: &'r mut SplitMix64,
    /// Variables usable as the first index (range N) and the second (range M).
    rows: Vec<String>,
    cols: Vec<String>,
    fresh: usize,
}

impl Gen<'_> {
    fn pick<'a>(&mut self, xs: &'a [&'a str]) -> &'a str {
        xs[(self.rng.next_u64() % xs.len() as u64) as usize]
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n
    }

    fn row(&mut self) -> String {
        let at = self.below(self.rows.len() as u64) as usize;
        let v = self.rows[at].clone();
        match self.below(4) {
            0 => format!("(N - 1 - {v})"),
            1 => format!("({v} + {}) % N", self.below(5)),
            _ => v,
        }
    }

    fn col(&mut self) -> String {
        let at = self.below(self.cols.len() as u64) as usize;
        let v = self.cols[at].clone();
        match self.below(4) {
            0 => format!("({v} * 3 - 2) % M"),
            1 => format!("(M - 1 - {v})"),
            _ => v,
        }
    }

    fn leaf(&mut self, ty: &str) -> String {
        let (r, c) = (self.row(), self.col());
        let float = FLOATS.contains(&ty);
        match self.below(6) {
            // A guarded read: proven in bounds only through the guard.
            0 => {
                let zero = if float { "0.0" } else { "0" };
                let v = self.rows[0].clone();
                format!("select({v} >= 1, X_{ty}[{v} - 1, {c}], {zero})")
            }
            1 => format!("{ty}({})", self.rows[0]),
            _ => format!("X_{ty}[{r}, {c}]"),
        }
    }

    fn reduce(&mut self, ty: &str, depth: u32) -> String {
        let op = self.pick(&["sum", "max", "min", "prod", "sum"]);
        let k = format!("k{}", self.fresh);
        self.fresh += 1;
        let over_rows = self.below(2) == 0;
        let range = if over_rows { "0..N" } else { "0..M" };
        // Odd lower bounds too: the range need not start at 0.
        let range = if self.below(4) == 0 {
            if over_rows {
                "1..N"
            } else {
                "2..M"
            }
        } else {
            range
        };
        if over_rows {
            self.rows.push(k.clone())
        } else {
            self.cols.push(k.clone())
        }
        let body = self.expr(ty, depth);
        if over_rows {
            self.rows.pop()
        } else {
            self.cols.pop()
        };
        format!("{op}[{k} in {range}]({body})")
    }

    fn boolean(&mut self, depth: u32) -> String {
        if depth == 0 {
            let (r, c) = (self.row(), self.col());
            return format!("X_bool[{r}, {c}]");
        }
        match self.below(6) {
            0 => format!("({} && {})", self.boolean(depth - 1), self.boolean(depth - 1)),
            1 => format!("({} || {})", self.boolean(depth - 1), self.boolean(depth - 1)),
            2 => format!("!{}", self.boolean(depth - 1)),
            3 => format!("({} == {})", self.boolean(depth - 1), self.boolean(depth - 1)),
            _ => {
                let ty = self.pick(&["f32", "f16", "i32", "u8", "i64", "f64"]);
                let op = self.pick(&["<", "<=", ">", ">=", "==", "!="]);
                format!("({} {op} {})", self.expr(ty, depth - 1), self.expr(ty, depth - 1))
            }
        }
    }

    fn expr(&mut self, ty: &str, depth: u32) -> String {
        if depth == 0 {
            return self.leaf(ty);
        }
        let float = FLOATS.contains(&ty);
        let d = depth - 1;
        match self.below(12) {
            0..=2 => {
                let op = if float { self.pick(&["+", "-", "*", "/"]) } else { self.pick(&["+", "-", "*", "/", "%"]) };
                format!("({} {op} {})", self.expr(ty, d), self.expr(ty, d))
            }
            3 => {
                let lit =
                    if float { self.pick(&["0.1", "3.0", "1e-3", "0.5"]) } else { self.pick(&["3", "-2", "0", "7"]) };
                let op = if float { self.pick(&["+", "*", "/"]) } else { self.pick(&["*", "/", "%", "+"]) };
                format!("({} {op} {lit})", self.expr(ty, d))
            }
            4 => format!("-{}", self.expr(ty, d)),
            5 => {
                let f = self.pick(&["max", "min"]);
                format!("{f}({}, {})", self.expr(ty, d), self.expr(ty, d))
            }
            6 if float => {
                let f = self.pick(&["exp", "sqrt", "abs", "tanh", "floor", "round", "sigmoid"]);
                format!("{f}({})", self.expr(ty, d))
            }
            6 => format!("abs({})", self.expr(ty, d)),
            7 => format!("select({}, {}, {})", self.boolean(d), self.expr(ty, d), self.expr(ty, d)),
            8 => {
                let from = self.pick(&["f32", "f64", "f16", "i32", "i8", "u8", "i64", "bf16"]);
                format!("{ty}({})", self.expr(from, d))
            }
            9 if float => format!("clamp({}, -1.0, 2.0)", self.expr(ty, d)),
            9 => format!("{ty}({})", self.boolean(d)),
            _ => self.reduce(ty, d),
        }
    }
}

fn random_program(rng: &mut SplitMix64) -> String {
    let types: Vec<&str> = FLOATS.iter().chain(INTS.iter()).copied().chain(["bool"]).collect();
    let params: Vec<String> = types.iter().map(|t| format!("X_{t}: {t}[N, M]")).collect();
    let outs = 1 + rng.next_u64() % 3;
    let mut gen = Gen { rng, rows: vec!["i".into()], cols: vec!["j".into()], fresh: 0 };
    let mut results = Vec::new();
    let mut body = String::new();
    for o in 0..outs {
        let ty = types[(gen.rng.next_u64() % (types.len() as u64 - 1)) as usize];
        let depth = 1 + (gen.rng.next_u64() % 4) as u32;
        results.push(format!("Y{o}: {ty}[N, M]"));
        body.push_str(&format!("    Y{o}[i, j] = {};\n", gen.expr(ty, depth)));
    }
    format!("kernel f({}) -> ({}) {{\n{body}}}\n", params.join(", "), results.join(", "))
}

fn extreme_args(p: &Program, rng: &mut SplitMix64) -> Vec<Arg> {
    let mut files = HashMap::new();
    for t in p.input_tensors() {
        let d = p.tensor(t);
        let shape = d.shape.iter().map(|&x| x as usize).collect();
        files.insert(d.name.clone(), extreme_tensor(d.elem, shape, rng));
    }
    interp::bind_args(p, files, &[], 0).expect("binds")
}

#[test]
fn random_programs_agree_bit_for_bit_with_the_definition() {
    let mut rng = SplitMix64::new(2024);
    let (mut stages, mut compiled) = (0, 0);
    for trial in 0..150 {
        let src = random_program(&mut rng);
        // Small sizes run on one thread; every third program is large
        // enough that its stages are spread over threads.
        let shapes: &[(&str, i64)] = if trial % 3 == 0 { &[("N", 37), ("M", 45)] } else { &[("N", 5), ("M", 7)] };
        let p = program(&src, shapes);
        let args = extreme_args(&p, &mut rng);
        let which = interp::compiled_stages(&p, args.clone()).expect("runs");
        stages += which.len();
        compiled += which.iter().filter(|&&c| c).count();
        assert_identical(&format!("trial {trial}:\n{src}"), &p, args);
    }
    // The comparison means something only if the fast path is what ran.
    eprintln!("{compiled} of {stages} compiled");
    assert!(compiled * 10 >= stages * 9, "only {compiled} of {stages} random stages took the compiled path");
}

#[test]
fn examples_and_standard_operators_agree_and_take_the_compiled_path() {
    let mut rng = SplitMix64::new(5);
    let mut all = texc_tests::example_programs(2e7);
    all.extend(texc_tests::std_op_programs(6));
    for (name, p) in &all {
        let args = interp::bind_args(p, HashMap::new(), &[], rng.next_u64()).expect("binds");
        let which = interp::compiled_stages(p, args.clone()).expect("runs");
        assert!(which.iter().all(|&c| c), "{name}: stages {which:?} fell back to the tree walk");
        assert_identical(name, p, args);
        assert_identical(&format!("{name} (extreme inputs)"), p, extreme_args(p, &mut rng));
    }
}

/// The corners the semantics define, each large enough to run on several threads.
#[test]
fn semantic_corners_agree_bit_for_bit() {
    let cases = [
        // Integer wrap at every width, floor division and modulo by zero.
        "kernel f(A: i8[N, M], B: i8[N, M], C: i32[N, M], D: u8[N, M]) -> (P: i8[N, M], Q: i32[N, M], R: i32[N, M], S: u8[N, M]) {
            P[i, j] = A[i, j] * B[i, j] + A[j % N, i % M];
            Q[i, j] = C[i, j] / i32(B[i, j]);
            R[i, j] = C[i, j] % i32(B[i, j]) - C[i, j] / 0;
            S[i, j] = D[i, j] * 3 - D[N - 1 - i, j];
        }",
        // f16/bf16 rounding on store and in casts, mixed int/float.
        "kernel f(A: f16[N, M], B: bf16[N, M], C: i32[N, M]) -> (P: f16[N, M], Q: bf16[N, M], R: f32[N, M]) {
            P[i, j] = A[i, j] + 0.0001 + f16(C[i, j]);
            Q[i, j] = B[i, j] * bf16(A[i, j]) * bf16(3.0);
            R[i, j] = f32(A[i, j]) * f32(C[i, j]) + f32(i32(f32(B[i, j])));
        }",
        // Every reduction, float and integer, with NaN and empty ranges about.
        "kernel f(A: f32[N, M], C: i32[N, M]) -> (S: f32[N], X: f32[N], Y: f32[N], P: f64[N], I: i32[N], J: i32[N], K: i8[N], E: f32[N]) {
            S[i] = sum[k](A[i, k]);
            X[i] = max[k](A[i, k] * A[i, (k + 1) % M]);
            Y[i] = min[k](A[i, k] - 1.0);
            P[i] = prod[k](f64(A[i, k]));
            I[i] = sum[k](C[i, k] * C[i, k]);
            J[i] = max[k, l in 0..5](C[i, k] - C[l % N, (k + l) % M]);
            K[i] = prod[k](i8(C[i, k]));
            E[i] = sum[k in 3..3](A[i, k]);
        }",
        // The strided inner loop of products and convolutions, with every operator and outer variables.
        "kernel f(A: f32[N, M], B: f64[M, N]) -> (Q: f32[N], R: f32[N], S: f64[N], T: f64[N, N]) {
            Q[i] = sum[k](A[i, k] / A[N - 1 - i, M - 1 - k]);
            R[i] = max[l in 0..5, k](A[i, k] - A[l, k]);
            S[i] = prod[k, l in 1..4](B[k, i] * B[M - k - 1, l]);
            T[i, j] = min[l in 0..3, k](B[k, i] + B[k, j] * f64(l));
        }",
    ];
    let mut rng = SplitMix64::new(11);
    for (n, src) in cases.iter().enumerate() {
        for shapes in [&[("N", 9), ("M", 11)][..], &[("N", 150), ("M", 130)][..]] {
            let p = program(src, shapes);
            let args = extreme_args(&p, &mut rng);
            assert!(interp::compiled_stages(&p, args.clone()).expect("runs").iter().all(|&c| c), "case {n}");
            assert_identical(&format!("case {n} at {shapes:?}"), &p, args);
        }
    }
}

/// `run` reports its progress: all the work it announced is done at the end.
#[test]
fn progress_counts_all_the_work() {
    let p = program(
        "kernel f(A: f32[N, K], B: f32[K, M]) -> C: f32[N, M] { C[i, j] = sum[k](A[i, k] * B[k, j]); }",
        &[("N", 70), ("K", 40), ("M", 90)],
    );
    let progress = interp::Progress::default();
    let args = interp::bind_args(&p, HashMap::new(), &[], 1).expect("binds");
    interp::run_with_progress(&p, args, &progress).expect("runs");
    assert!(progress.total() >= 70 * 40 * 90, "total {}", progress.total());
    assert_eq!(progress.done(), progress.total());
}
