//! Concurrent iterations and unwritten memory (issue 35, items 1–4):
//! loop nests whose `parallel` or `vectorized` iterations, or GPU threads
//! and blocks, may touch one element where one of them writes it are
//! refused (`texc_schedules::independence`, the launch rules), and the
//! loop-IR evaluator reports a race where it runs one; a buffer read
//! before it is stored holds zeros on every backend, as in the evaluator
//! (`texc_schedules::zeroing`), while the default schedules need no zeros.
//! Properties: random GPU index maps against a brute-force count of who
//! writes what, and random edits of parallel and vectorized loops against
//! the evaluator.

use std::collections::HashMap;
use texc_compiler::Bindings;
use texc_grammar::span::SourceMap;
use texc_runtime::SplitMix64;
use texc_schedules::ir::{ForKind, Stmt};
use texc_schedules::LoopFunc;

/// `text` parsed as a `.loops` file: the nest, or the rendered error.
fn parse(text: &str) -> Result<LoopFunc, String> {
    let mut sm = SourceMap::new();
    let id = sm.add("t.loops".to_string(), text.to_string());
    texc_schedules::text::parse(text, id).map(|p| p.func).map_err(|d| d.render(&sm))
}

fn args(f: &LoopFunc, seed: u64) -> Vec<texc_compiler::interp::Arg> {
    texc_compiler::interp::bind_args(&f.p, Default::default(), &[], seed).expect("binds")
}

const HEAD: &str = "func k [N=64]\n  input X: f32[64]\n  output Y: f32[65]\n  output S: f32[1]\n";

/// The issue's cases: a sum into one element from a parallel loop, two
/// halves of a parallel loop writing the same elements, a vectorized loop
/// carrying a dependence. Each is refused at its loop, and the evaluator,
/// made to run it anyway, reports the race.
#[test]
fn racing_parallel_and_vectorized_loops_are_refused() {
    let cases = [
        ("  S[0] = 0.0f32\n  for i in 0..64 parallel:\n    S[0] = S[0] + X[i]\n", "parallel loop `i`", "`S`"),
        ("  for h in 0..2 parallel:\n    for i in 0..32:\n      Y[i] = X[h * 32 + i]\n", "parallel loop `h`", "`Y`"),
        (
            "  Y[0] = 0.0f32\n  for i in 0..64 vectorized:\n    Y[i + 1] = Y[i] + X[i]\n",
            "lanes of vectorized loop `i`",
            "`Y`",
        ),
        // Iterations read what others write.
        ("  for i in 0..64 parallel:\n    Y[i] = X[i]\n    Y[i + 1] = Y[i] * 2.0f32\n", "parallel loop `i`", "`Y`"),
    ];
    for (body, loop_, tensor) in cases {
        let text = format!("{HEAD}{body}");
        let err = parse(&text).expect_err("refused");
        assert!(err.contains(loop_) && err.contains(tensor) && err.contains("t.loops:"), "{err}");
        // The same nest with the loop serial parses; made concurrent again, the evaluator sees the race.
        let serial = text.replace(" parallel:", ":").replace(" vectorized:", ":");
        let mut f = parse(&serial).unwrap_or_else(|e| panic!("{e}"));
        let kind = if body.contains("vectorized") { ForKind::Vectorized } else { ForKind::Parallel };
        let Some(Stmt::For { kind: k, .. }) = f.body.iter_mut().find(|s| matches!(s, Stmt::For { .. })) else {
            panic!("a loop")
        };
        *k = kind;
        let err = texc_schedules::eval::run(&f, args(&f, 1)).expect_err("a race");
        assert!(err.to_string().contains("a race"), "{err}");
    }
}

/// Accesses that the proof tells apart: a fused loop's div/mod pair, a
/// transposed one, rows padded past their length, a split's tail, a
/// register block's private accumulators.
#[test]
fn independent_iterations_are_proven() {
    let bodies = [
        "  for f in 0..64 parallel:\n    Y[f / 8 * 8 + f % 8] = X[f]\n",
        "  for f in 0..64 parallel:\n    Z[f % 8, f / 8] = X[f]\n",
        "  for f in 0..80 parallel:\n    if f % 10 < 8:\n      Z[f / 10, f % 10] = X[f / 10 * 8 + f % 10]\n",
        "  for o in 0..7 parallel:\n    for v in 0..8 vectorized:\n      Y[o * 8 + v] = X[o * 8 + v]\n  for o in 7..8 parallel:\n    \
         for v in 0..8 vectorized:\n      Y[o * 8 + v] = X[o * 8 + v]\n",
        "  for i in 0..8 parallel:\n    local acc: f32[8]:\n      for v in 0..8 vectorized:\n        acc[v] = 0.0f32\n      \
         for v in 0..8 vectorized:\n        acc[v] = acc[v] + X[i * 8 + v]\n      for v in 0..8 vectorized:\n        Z[i, v] = acc[v]\n",
    ];
    for body in bodies {
        let text = format!("{HEAD}  output Z: f32[8, 8]\n{body}");
        let f = parse(&text).unwrap_or_else(|e| panic!("{body}\n{e}"));
        assert_eq!(texc_schedules::independence::from_indices(&f), Ok(()), "proven from the indices:\n{body}");
        texc_schedules::eval::run(&f, args(&f, 2)).unwrap_or_else(|e| panic!("{body}\n{e}"));
    }
}

/// A little index expression over a launch's variables, printed and evaluated alike.
#[derive(Clone, Debug)]
enum Ix {
    Var(usize),
    Int(i64),
    Add(Box<Ix>, Box<Ix>),
    Mul(Box<Ix>, i64),
    Div(Box<Ix>, i64),
    Mod(Box<Ix>, i64),
}

const VARS: [&str; 4] = ["b", "k", "ty", "tx"];

impl Ix {
    fn print(&self) -> String {
        match self {
            Ix::Var(v) => VARS[*v].to_string(),
            Ix::Int(c) => c.to_string(),
            Ix::Add(a, b) => format!("({} + {})", a.print(), b.print()),
            Ix::Mul(a, c) => format!("{} * {c}", a.print()),
            Ix::Div(a, c) => format!("({}) / {c}", a.print()),
            Ix::Mod(a, c) => format!("({}) % {c}", a.print()),
        }
    }

    fn eval(&self, env: &[i64; 4]) -> i64 {
        match self {
            Ix::Var(v) => env[*v],
            Ix::Int(c) => *c,
            Ix::Add(a, b) => a.eval(env) + b.eval(env),
            Ix::Mul(a, c) => a.eval(env) * c,
            Ix::Div(a, c) => a.eval(env).div_euclid(*c),
            Ix::Mod(a, c) => a.eval(env).rem_euclid(*c),
        }
    }

    fn random(rng: &mut SplitMix64, depth: u32) -> Ix {
        let pick = |rng: &mut SplitMix64, n: u64| rng.next_u64() % n;
        let leaf = |rng: &mut SplitMix64| match pick(rng, 5) {
            0 => Ix::Int(pick(rng, 4) as i64),
            v => Ix::Var(v as usize - 1),
        };
        if depth == 0 {
            return leaf(rng);
        }
        let small = |rng: &mut SplitMix64| 1 + pick(rng, 8) as i64;
        match pick(rng, 6) {
            0 => leaf(rng),
            1 | 2 => Ix::Add(Box::new(Ix::random(rng, depth - 1)), Box::new(Ix::random(rng, depth - 1))),
            3 => Ix::Mul(Box::new(Ix::random(rng, depth - 1)), small(rng)),
            4 => Ix::Div(Box::new(Ix::random(rng, depth - 1)), small(rng)),
            _ => Ix::Mod(Box::new(Ix::random(rng, depth - 1)), small(rng)),
        }
    }
}

/// Random launches storing to `B[(e0) % 8, (e1) % 8]` for random index
/// maps `e0`, `e1` of a block, a serial loop and two thread coordinates:
/// wherever the launch rules prove from the indices that distinct
/// threads and blocks store distinct elements, a brute-force count agrees;
/// the rules with their fallback (running the nest) accept exactly the
/// launches the count finds race-free; and the evaluator reports a race
/// in the others.
#[test]
fn random_gpu_index_maps_against_the_launch_rules() {
    let t = texc_compiler::target::lookup("nvptx-sm90").expect("registered");
    let mut rng = SplitMix64::new(0x35_1);
    let (mut proven, mut free_of_races) = (0, 0);
    for case in 0..400 {
        let pick = |rng: &mut SplitMix64, n: u64| 1 + (rng.next_u64() % n) as i64;
        let ext = [pick(&mut rng, 3), pick(&mut rng, 2), pick(&mut rng, 3), pick(&mut rng, 8)];
        let ix = [Ix::random(&mut rng, 3), Ix::random(&mut rng, 3)];
        let guard = (rng.next_u64() % 3 == 0).then(|| (Ix::random(&mut rng, 2), 1 + (rng.next_u64() % 6) as i64));
        let store = format!("B[({}) % 8, ({}) % 8] = A[0]", ix[0].print(), ix[1].print());
        let store = match &guard {
            Some((g, c)) => format!("if {} < {c}:\n            {store}", g.print()),
            None => store,
        };
        let text = format!(
            "func k [N=1]\n  input A: f32[1]\n  output B: f32[8, 8]\n  for b in 0..{} block.x:\n    for k in 0..{}:\n      \
             for ty in 0..{} thread.y:\n        for tx in 0..{} thread.x:\n          {store}\n",
            ext[0], ext[1], ext[2], ext[3]
        );
        // Guards no index satisfies leave accesses the bounds check cannot place.
        let Ok(f) = parse(&text) else { continue };
        // Who stores each element: a party is (b, ty, tx).
        let mut owner: HashMap<(i64, i64), (i64, i64, i64)> = HashMap::new();
        let mut race = false;
        for b in 0..ext[0] {
            for k in 0..ext[1] {
                for ty in 0..ext[2] {
                    for tx in 0..ext[3] {
                        let env = [b, k, ty, tx];
                        if guard.as_ref().is_some_and(|(g, c)| g.eval(&env) >= *c) {
                            continue;
                        }
                        let at = (ix[0].eval(&env).rem_euclid(8), ix[1].eval(&env).rem_euclid(8));
                        race |= *owner.entry(at).or_insert((b, ty, tx)) != (b, ty, tx);
                    }
                }
            }
        }
        let from_indices = texc_schedules::gpu::launches_from_indices(&f, t).is_ok();
        assert!(!from_indices || !race, "case {case}: proven, yet two threads store one element:\n{text}");
        assert_eq!(texc_schedules::gpu::launches(&f, t).is_ok(), !race, "case {case}:\n{text}");
        assert_eq!(texc_schedules::eval::run(&f, args(&f, 0)).is_ok(), !race, "case {case}: the evaluator\n{text}");
        proven += from_indices as u32;
        free_of_races += !race as u32;
    }
    eprintln!("{proven} of {free_of_races} race-free launches proven from their indices");
    assert!(proven * 2 > free_of_races, "the proof tells most race-free launches apart");
}

/// Random edits of printed CPU nests — a loop made parallel, vectorized or
/// serial, an index moved by one, a variable swapped for another — that
/// the `.loops` reader accepts run race-free on the evaluator and compute
/// what it computes on every CPU backend this machine runs.
#[test]
fn random_loop_edits_that_are_accepted_match_the_evaluator() {
    let mut rng = SplitMix64::new(0x35_2);
    let cpus: Vec<&str> = ["x86-avx2", "x86-avx512", "cranelift"]
        .into_iter()
        .filter(|t| {
            let ok = texc_compiler::target::lookup(t).expect("registered").check_runs_here();
            ok.map_err(|e| eprintln!("skipped runs on {t}: {e}")).is_ok()
        })
        .collect();
    let bases: Vec<String> = texc_tests::RANDOM_SCHEDULE_CASES
        .iter()
        .map(|(file, kernel, shapes)| {
            let p = texc_tests::random_case_program(file, *kernel, shapes);
            texc_schedules::ir::print(&texc_tests::default_lowered("x86-avx2", &p))
        })
        .collect();
    let (mut accepted, mut tried) = (0, 0);
    for case in 0..60 {
        let base = &bases[case % bases.len()];
        let edited = edit(base, &mut rng);
        tried += 1;
        let Ok(f) = parse(&edited) else { continue };
        accepted += 1;
        let want = texc_schedules::eval::run(&f, args(&f, 3))
            .unwrap_or_else(|e| panic!("case {case}: accepted, yet the evaluator says: {e}\n{edited}"));
        for t in &cpus {
            let target = texc_compiler::target::lookup(t).expect("registered");
            // A backend may refuse a nest it cannot build (a loop inside a vectorized one), with an error.
            let Ok(code) = texc_tests::compile_loops(target, &f) else { continue };
            let got = code.run(args(&f, 3)).expect("runs");
            for (g, w) in got.iter().zip(&want) {
                let err = texc_tests::rel_error(g, w);
                assert!(err <= 1e-5, "case {case} on {t}: error {err:e}\n{edited}");
            }
        }
    }
    eprintln!("{accepted} of {tried} edited nests accepted");
    assert!(accepted > 0);
}

/// One to three random edits of a printed nest.
fn edit(text: &str, rng: &mut SplitMix64) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let loops: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].trim_start().starts_with("for ")).collect();
    let stores: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains(" = ")).collect();
    for _ in 0..1 + rng.next_u64() % 3 {
        match rng.next_u64() % 4 {
            0 | 1 if !loops.is_empty() => {
                let i = loops[(rng.next_u64() % loops.len() as u64) as usize];
                let head = lines[i].trim_end_matches(':').trim_end_matches(" parallel").trim_end_matches(" vectorized");
                let head = head.trim_end_matches(" unrolled");
                let kind = ["", " parallel", " vectorized"][(rng.next_u64() % 3) as usize];
                lines[i] = format!("{head}{kind}:");
            }
            2 if !stores.is_empty() => {
                let i = stores[(rng.next_u64() % stores.len() as u64) as usize];
                if let Some(at) = lines[i].find(']') {
                    let shift = if rng.next_u64() % 2 == 0 { " + 1" } else { " - 1" };
                    lines[i].insert_str(at, shift);
                }
            }
            _ if !stores.is_empty() && !loops.is_empty() => {
                // Swap a loop variable for another loop's in one store.
                let i = stores[(rng.next_u64() % stores.len() as u64) as usize];
                let name =
                    |l: &String| l.trim_start().trim_start_matches("for ").split(' ').next().unwrap_or("").to_string();
                let a = name(&lines[loops[(rng.next_u64() % loops.len() as u64) as usize]]);
                let b = name(&lines[loops[(rng.next_u64() % loops.len() as u64) as usize]]);
                if !a.is_empty() && !b.is_empty() {
                    lines[i] = lines[i].replacen(&format!("[{a}"), &format!("[{b}"), 1);
                }
            }
            _ => {}
        }
    }
    lines.join("\n") + "\n"
}

/// A local of which only one element is stored, read whole after a larger
/// heap local held other data: zeros on every backend, as on the
/// evaluator (before, x86 returned the earlier local's bytes).
#[test]
fn locals_read_before_they_are_stored_hold_zeros() {
    let text = "func s [N=4]\n  input X: f32[70000]\n  output Y: f32[70000]\n  output Z: f32[8]\n  \
                local A: f32[70000]:\n    for i in 0..70000:\n      A[i] = X[i] + 1.0f32\n    for i in 0..70000:\n      \
                Y[i] = A[i]\n  local B: f32[70000]:\n    B[0] = X[0]\n    for i in 0..8:\n      Z[i] = B[i]\n  \
                for r in 0..2:\n    local C: f32[4]:\n      if r == 1:\n        C[0] = X[r]\n      for i in 0..4:\n        \
                Z[4 + i] = Z[4 + i] + C[i]\n";
    let f = parse(text).unwrap_or_else(|e| panic!("{e}"));
    let want = texc_schedules::eval::run(&f, args(&f, 5)).expect("evaluates");
    let z = want[1].to_f64();
    assert!(z[1..4].iter().all(|&v| v == 0.0) && z[0] != 0.0, "{z:?}");
    for t in ["x86-avx2", "cranelift"] {
        let target = texc_compiler::target::lookup(t).expect("registered");
        if target.check_runs_here().is_err() {
            continue;
        }
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args(&f, 5)).expect("runs");
        assert_eq!(got[1].to_f64(), z, "{t}");
    }
    // What the zero pass did: stores zeros first in `B` and `C`, not in `A`.
    let mut g = f.clone();
    let zeroed = texc_schedules::zeroing::zero_uncovered(&mut g, false);
    let names: Vec<&str> = zeroed.iter().map(|&t| g.p.tensor(t).name.as_str()).collect();
    assert_eq!(names, ["B", "C"]);
}

/// A store guarded by its block's bound (`b * 6 + i < 10`: the last block
/// of rows is shorter) writes, in every block, the rows the last one
/// keeps: reads of those need no zeros, a read of one more does (in the
/// last block it was never stored); the evaluator and the compiled code
/// agree either way.
#[test]
fn guarded_stores_cover_what_every_block_writes() {
    let nest = |rows: i64| {
        format!(
            "func k []\n  input X: f32[10]\n  output Y: f32[2, 6]\n  for b in 0..2:\n    local A: f32[6]:\n\
             \x20     for i in 0..6:\n        if b * 6 + i < 10:\n          A[i] = X[b * 6 + i] + 1.0f32\n\
             \x20     for i in 0..{rows}:\n        Y[b, i] = A[i]\n"
        )
    };
    for (rows, want) in [(4, Vec::<&str>::new()), (5, vec!["A"])] {
        zeroed_and_run(&nest(rows), &want, 7, &format!("reading {rows} rows"));
    }
}

/// A read past the first iteration of a sequential loop (a guard says so)
/// of what a store after it in the loop's body writes in every iteration
/// reads what the iteration before stored (a product's register block
/// resumed per slice): no zeros. Each change that breaks that needs them:
/// a guard the first iteration passes, a loop that starts past the value
/// the guard names, a store whose element moves with the loop, a store
/// that skips an element; the evaluator and compiled code agree throughout.
/// (Loop text must store an element of a buffer above its first read: `T[0]`.)
#[test]
fn a_later_iteration_reads_what_the_one_before_stored() {
    let nest = |first: i64, guard: &str, index: &str, skip: &str| {
        format!(
            "func k []\n  input X: f32[3, 8]\n  output Y: f32[8]\n  local T: f32[8]:\n    T[0] = 0.0f32\n\
             \x20   for s in {first}..3:\n      for i in 0..8:\n        local A: f32[1]:\n\
             \x20         A[0] = select({guard}, T[i], 0.0f32)\n          {skip}T[{index}] = A[0] + X[s, i]\n\
             \x20   for i in 0..8:\n      Y[i] = T[i]\n"
        )
    };
    for (case, text, want) in [
        ("resumed", nest(0, "s > 0", "i", ""), vec![]),
        ("a guard the first iteration passes", nest(0, "s >= 0", "i", ""), vec!["T"]),
        ("a loop from 1", nest(1, "s > 0", "i", ""), vec!["T"]),
        ("a store moving with the loop", nest(0, "s > 0", "(i + s) % 8", ""), vec!["T"]),
        ("a store skipping an element", nest(0, "s > 0", "i", "if i < 7:\n            "), vec!["T"]),
    ] {
        zeroed_and_run(&text, &want, 3, case);
    }
}

/// The temporaries the zero pass zeroes in loop text `text` are `want`;
/// the evaluator and the compiled `x86-avx2` code (where it runs) agree on
/// its first output, with inputs of `seed`.
fn zeroed_and_run(text: &str, want: &[&str], seed: u64, case: &str) {
    let f = parse(text).unwrap_or_else(|e| panic!("{e}"));
    let mut g = f.clone();
    let zeroed = texc_schedules::zeroing::zero_uncovered(&mut g, false);
    let names: Vec<&str> = zeroed.iter().map(|&t| g.p.tensor(t).name.as_str()).collect();
    assert_eq!(names, want, "{case}");
    let expect = texc_schedules::eval::run(&f, args(&f, seed)).expect("evaluates");
    let target = texc_compiler::target::lookup("x86-avx2").expect("registered");
    if target.check_runs_here().is_ok() {
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args(&f, seed)).expect("runs");
        assert_eq!(got[0].to_f64(), expect[0].to_f64(), "{case}");
    }
}

/// What the default schedules make (accumulators, packs, attached stages,
/// fused and padded loops, Winograd's transforms, GPU launches) reads
/// only what it has stored: the zero pass adds nothing to them, so it
/// costs them nothing.
#[test]
fn default_schedules_need_no_zeroing() {
    let mut zeroed = Vec::new();
    let mut check = |what: &str, f: &LoopFunc, gpu: bool| {
        let mut g = f.clone();
        let z = texc_schedules::zeroing::zero_uncovered(&mut g, gpu);
        if !z.is_empty() {
            zeroed.push(format!("{what}: {:?}", z.iter().map(|&t| g.p.tensor(t).name.clone()).collect::<Vec<_>>()));
        }
    };
    for target in ["x86-avx2", "x86-avx512", "cranelift", "nvptx-sm90"] {
        let gpu = target.starts_with("nvptx");
        for file in texc_tests::example_files() {
            let (mut pl, kernels) = texc_tests::kernels_of_file(target, &file);
            for k in kernels {
                let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
                if let Ok(loops) = pl.loops(k, p) {
                    check(&format!("{file} on {target}"), &loops.lowered, gpu);
                }
            }
        }
        for (name, p) in texc_tests::std_op_programs(7) {
            check(&format!("{name} on {target}"), &texc_tests::default_lowered(target, &p), gpu);
        }
        for (file, shapes, winograd) in [
            ("benches/conv_layer.tex", "C=64,H=28,W=28,K=64", 4),
            ("benches/conv_layer.tex", "C=16,H=14,W=14,K=32", 2),
            ("benches/matmul.tex", "M=37,K=19,N=70", 0),
        ] {
            let (mut pl, k) = texc_tests::load_file(target, file, None).expect("loads");
            pl.options.rewrite = true;
            pl.options.knobs.insert(texc_pipeline::KNOB_WINOGRAD.into(), winograd);
            let shapes = shapes.split(',').map(|kv| {
                let (n, v) = kv.split_once('=').expect("name=value");
                (n.to_string(), v.parse().expect("a number"))
            });
            let b = Bindings { shapes: shapes.collect(), ..Default::default() };
            let (_, loops) = pl.build(k, &b).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
            check(&format!("{file} {b:?} on {target}"), &loops.lowered, gpu);
        }
    }
    assert!(zeroed.is_empty(), "zeroed:\n{}", zeroed.join("\n"));
}
/// Nests a review of the proofs found accepted though they race (a scalar,
/// data-dependent `select`, a local's value, wrapping index arithmetic,
/// padded pairs of two accesses, unsigned division): refused now.
const REVIEWED_RACES: [&str; 7] = [
    r#"func k [N=64]
  input X: f32[64]
  scalar k: i32 = 0
  output Y: f32[65]
  Y[64] = 0.0f32
  for o in 0..8:
    for v in 0..8 vectorized:
      Y[o * 8 + v + index(k) % 2] = Y[o * 8 + v] + X[o * 8 + v]
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[65]
  Y[64] = 0.0f32
  for o in 0..8:
    for v in 0..8 vectorized:
      Y[o * 8 + v + 1] = select(X[o * 8 + v] > 100.0f32, Y[o * 8 + v] + 1.0f32, X[o * 8 + v])
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[72]
  for i in 0..64 parallel:
    local L: i32[1]:
      L[0] = i32(7 - i % 8)
      Y[i + index(L[0]) % 8] = X[i]
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[8]
  Y[0] = 0.0f32
  for o in 0..8:
    for i in 0..8 vectorized:
      if i + 9223372036854775807 <= 9223372036854775807:
        Y[0] = Y[0] + X[o * 8 + i]
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[4]
  Y[3] = 0.0f32
  for o in 0..1:
    for j in 0..3 vectorized:
      Y[(j + max(j, 0) * 3 * 4611686018427387904) % 3] = Y[(j + max(j, 0) * 3 * 4611686018427387904) % 3] + X[j]
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[36]
  Y[35] = 0.0f32
  for i in 0..16 vectorized:
    if i % 3 <= 2 && i % 8 < 3:
      Y[4 * (i / 8) + i % 8] = X[i]
    if i % 8 >= 5:
      Y[4 * (i / 8) + i % 8] = Y[4 * (i / 8) + i % 8] * 2.0f32 + X[i]
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[8]
  Y[1] = 0.0f32
  for o in 0..1:
    for i in 0..33 vectorized:
      if i % 2 == 0 && @udiv(i - 10, 2) > 10:
        Y[0] = Y[0] + X[i]
"#,
];

/// GPU nests the review found accepted though threads or blocks race (two
/// blocks on one `mma` tile, a thread's local or a shared value in an
/// index, two stores of one thread loop to a shared buffer).
const REVIEWED_GPU_RACES: [&str; 4] = [
    r#"func k [M=16]
  input A: f16[16, 32]
  input B: f16[32, 8]
  output C: f32[16, 8]
  for t in 0..128 thread.x:
    C[t / 8, t % 8] = 0.0f32
  for b in 0..2 block.x:
    mma m16n8k16.f16.f32 C[0, 0] @ (0, 1) += A[0, b * 16] @ (0, 1) * B[b * 16, 0] @ (0, 1)
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[128]
  for b in 0..2 block.x:
    for t in 0..32 thread.x:
      local L: i32[1]:
        L[0] = i32(32 - b * 32)
        Y[b * 32 + t + index(L[0]) % 64] = X[b * 32 + t]
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[64]
  for b in 0..2 block.x:
    shared S: f32[33]:
      for t in 0..32 thread.x:
        S[t] = X[b * 32 + t]
        S[t + 1] = X[b * 32 + t] * 2.0f32
      barrier
      for t in 0..32 thread.x:
        Y[b * 32 + t] = S[t]
"#,
    r#"func k [N=64]
  input X: f32[64]
  output Y: f32[128]
  for b in 0..2 block.x:
    shared S: i32[1]:
      for t in 0..1 thread.x:
        S[0] = i32(32 - b * 32)
      barrier
      for t in 0..32 thread.x:
        Y[b * 32 + t + index(S[0]) % 64] = X[b * 32 + t]
"#,
];

/// Locals the zero proof took as stored everywhere: under `!=`, by a loop
/// of no iterations, under a guard whose sides wrap.
const REVIEWED_UNWRITTEN: [&str; 3] = [
    r#"func k [N=8]
  input X: f32[8]
  output Y: f32[8]
  output Z: f32[8]
  local M: f32[8]:
    for j in 0..8:
      M[j] = X[j] + 100.0f32
    for j in 0..8:
      Z[j] = M[j]
  local L: f32[8]:
    for j in 0..8:
      if j != 3:
        L[j] = 1.0f32
    for j in 0..8:
      Y[j] = L[j]
"#,
    r#"func k [N=8]
  input X: f32[8]
  output Y: f32[8]
  output Z: f32[8]
  local M: f32[8]:
    for j in 0..8:
      M[j] = X[j] + 100.0f32
    for j in 0..8:
      Z[j] = M[j]
  local L: f32[8]:
    L[0] = 2.0f32
    for e in 5..5:
      for j in 0..8:
        L[j] = 1.0f32
    for j in 0..8:
      Y[j] = L[j]
"#,
    r#"func k [N=8]
  input X: f32[8]
  output Y: f32[8]
  output Z: f32[8]
  local M: f32[8]:
    for j in 0..8:
      M[j] = X[j] + 100.0f32
    for j in 0..8:
      Z[j] = M[j]
  local L: f32[8]:
    L[0] = 1.0f32
    for j in 0..8:
      if j + 9223372036854775807 <= 9223372036854775807:
        Y[j] = L[j]
"#,
];

/// A tile product's `m × n` output tile in a buffer of rows longer than
/// `n` (an adversarial review, 2026-12-07): joined into one flat run, its
/// rows and columns looked like the interval from its origin to its last
/// element, so a read in the gap between two of its rows (`T[0, 5]` of a
/// 2 × 4 tile at `T[0, 0]` in rows of 8), never stored, took no zeros —
/// directly, or through a later iteration's read (`crate::zeroing`'s
/// iteration before). Both are zeroed now; a read inside the tile is not.
#[test]
fn a_tile_store_covers_its_rows_not_the_gaps_between_them() {
    let nest = |read: &str, looped: bool| {
        let head = "func k []\n  input A: i32[2, 16]\n  input B: i32[16, 4]\n  output Y: i32[2]\n  temp T: i32[2, 8]\n";
        let tile = "amx_dpbusd 2x4x16 T[0, 0] @ (0, 1) = A[0, 0] @ (0, 1) * B[0, 0] @ (0, 1)";
        match looped {
            false => format!("{head}  {tile}\n  Y[0] = {read}\n"),
            true => format!(
                "{head}  T[1, 7] = 0i32\n  for s in 0..2:\n    Y[s] = select(s > 0, {read}, 0i32)\n    {tile}\n"
            ),
        }
    };
    for (read, looped, zeroed) in
        [("T[0, 5]", false, true), ("T[0, 5]", true, true), ("T[1, 3]", false, false), ("T[1, 3]", true, false)]
    {
        let mut f = parse(&nest(read, looped)).unwrap_or_else(|e| panic!("{e}"));
        let z = texc_schedules::zeroing::zero_uncovered(&mut f, false);
        let names: Vec<&str> = z.iter().map(|&t| f.p.tensor(t).name.as_str()).collect();
        assert_eq!(names.contains(&"T"), zeroed, "{read} (in a loop: {looped}): zeroed {names:?}");
    }
}

/// The review's nests: the racing ones are refused (for GPU nests, by the
/// launch rules), and the ones reading unwritten elements compute on every
/// CPU backend what the evaluator does (zeros there).
#[test]
fn reviewed_holes_are_closed() {
    for text in REVIEWED_RACES {
        let err = parse(text).expect_err("refused");
        assert!(err.contains("may touch one element"), "{err}\n{text}");
    }
    let t = texc_compiler::target::lookup("nvptx-sm90").expect("registered");
    for text in REVIEWED_GPU_RACES {
        let f = parse(text).unwrap_or_else(|e| panic!("{e}"));
        let err = texc_schedules::gpu::launches(&f, t).expect_err("refused");
        assert!(err.message.contains("may write an element"), "{}\n{text}", err.message);
        assert!(texc_schedules::eval::run(&f, args(&f, 1)).is_err(), "the evaluator sees the race:\n{text}");
    }
    for text in REVIEWED_UNWRITTEN {
        let f = parse(text).unwrap_or_else(|e| panic!("{e}"));
        let want = texc_schedules::eval::run(&f, args(&f, 4)).expect("evaluates");
        for name in ["x86-avx2", "cranelift"] {
            let target = texc_compiler::target::lookup(name).expect("registered");
            if target.check_runs_here().is_err() {
                continue;
            }
            let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args(&f, 4)).expect("runs");
            assert_eq!(got[0].to_f64(), want[0].to_f64(), "{name}:\n{text}");
        }
    }
}

/// A read's guards bound each dimension of its index where the proof
/// joins dimensions into one run (`zeroing::run_bounds`): a padding copy's
/// `select(y >= 1, T[y - 1, x], 0)` reads rows 0–3 of a buffer its writer
/// stored as one flat run (`T[(o * 8 + v) / 6, (o * 8 + v) % 6]`, no box
/// per dimension), so it needs no zeros; with the writer stopping short
/// (`o * 8 + v < 20`: the last row's four last elements) it still does.
/// The evaluator and compiled code agree either way.
#[test]
fn guards_bound_each_dimension_of_a_joined_run() {
    let nest = |stop: &str| {
        format!(
            "func k []\n  input X: f32[24]\n  output Y: f32[5, 6]\n  temp T: f32[4, 6]\n  for o in 0..3:\n\
             \x20   for v in 0..8:\n      if o * 8 + v < {stop}:\n        T[(o * 8 + v) / 6, (o * 8 + v) % 6] = X[o * 8 + v]\n\
             \x20 for y in 0..5:\n    for x in 0..6:\n      Y[y, x] = select(y >= 1, T[y - 1, x], 0.0f32)\n"
        )
    };
    for (stop, want) in [("24", Vec::<&str>::new()), ("20", vec!["T"])] {
        zeroed_and_run(&nest(stop), &want, 9, &format!("stores below {stop}"));
    }
}
