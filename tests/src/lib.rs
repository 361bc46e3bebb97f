//! Helpers shared by texc's integration tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use texc_compiler::{Bindings, Program, Session};
use texc_grammar::diagnostic::render_all;
use texc_runtime::{SplitMix64, Tensor};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Load a file (relative to the workspace root) and specialize one kernel.
/// Errors come back rendered, as the CLI prints them.
pub fn compile(file: &str, kernel: Option<&str>, b: &Bindings) -> Result<Program, String> {
    let mut s = Session::new();
    let path = root().join(file);
    let m = s.load_root(&path).map_err(|d| render_all(&d, &s.sources))?;
    let k = s.entry_kernel(m, kernel).map_err(|d| render_all(&[d], &s.sources))?;
    texc_compiler::build_program(&s, k, b).map_err(|d| render_all(&[d], &s.sources))
}

/// Check source text the way `texc check` does, without touching the disk
/// (imports of `std.nn` work; file imports resolve against the workspace root).
/// Returns rendered diagnostics on failure. Specializes every kernel whose
/// sizes all have defaults, and applies its CPU schedules.
pub fn check_text(name: &str, text: &str) -> Result<(), String> {
    let mut s = Session::new();
    let m = s.load_text(name, text, Some(root().join(name))).map_err(|d| render_all(&d, &s.sources))?;
    for i in 0..s.module(m).kernels.len() {
        let k = texc_compiler::KernelRef { module: m as u32, index: i as u32 };
        let info = s.kernel(k);
        let sized = info.symbols.iter().all(|x| x.default.is_some())
            && info
                .params
                .iter()
                .all(|p| !matches!(p.info, texc_compiler::resolve::ParamInfo::Const { default: None }));
        if sized {
            let p =
                texc_compiler::build_program(&s, k, &Bindings::default()).map_err(|d| render_all(&[d], &s.sources))?;
            for target in ["x86-avx2", "x86-avx512", "host"] {
                if let Some(sc) = texc_schedules::find_schedule(&s, k, target) {
                    texc_schedules::schedule_and_lower(p.clone(), target, Some(sc))
                        .map_err(|d| render_all(&[d], &s.sources))?;
                }
            }
        }
    }
    Ok(())
}

/// Run a program on the interpreter with the given input tensors (by name).
pub fn run(p: &Program, inputs: HashMap<String, Tensor>) -> Vec<Tensor> {
    let args = texc_compiler::interp::bind_args(p, inputs, &[], 0).expect("arguments bind");
    texc_compiler::interp::run(p, args).expect("interpreter runs")
}

/// Normwise relative error: max |a - b| / max |b| (exact comparison for integers).
pub fn rel_error(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape, want.shape, "shapes differ");
    let (a, b) = (got.to_f64(), want.to_f64());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
    a.iter().zip(&b).fold(0.0f64, |m, (x, y)| {
        if x.is_nan() != y.is_nan() {
            f64::INFINITY
        } else if x.is_nan() {
            m
        } else {
            m.max((x - y).abs())
        }
    }) / scale
}

/// Draw a random legal schedule for one stage.
pub fn random_schedule(ss: &mut texc_schedules::schedule::StageSchedule, rng: &mut SplitMix64) {
    let span = Default::default();
    let pick = |rng: &mut SplitMix64, n: usize| (rng.next_u64() % n as u64) as usize;
    for step in 0..(2 + pick(rng, 5)) {
        let leaf = ss.leaves[pick(rng, ss.leaves.len())];
        match pick(rng, 3) {
            0 => {
                let ext = ss.ivs[leaf].extent.max(1);
                let factor = 1 + (rng.next_u64() % (ext as u64 + 2)) as i64;
                let base = format!("{}_{step}", ss.ivs[leaf].name);
                ss.split(leaf, factor, (&format!("{base}o"), span), (&format!("{base}i"), span), span).expect("split");
            }
            1 => {
                let mut order = ss.leaves.clone();
                for i in (1..order.len()).rev() {
                    order.swap(i, pick(rng, i + 1));
                }
                ss.reorder(&order, span).expect("permutation");
            }
            _ => {
                let pos = ss.leaves.iter().position(|&l| l == leaf).expect("leaf");
                if pos + 1 < ss.leaves.len() {
                    let next = ss.leaves[pos + 1];
                    if ss.ivs[leaf].reduce == ss.ivs[next].reduce {
                        ss.fuse(leaf, next, (&format!("f{step}"), span), span).expect("adjacent");
                    }
                }
            }
        }
    }
    let last = *ss.leaves.last().expect("leaves");
    if !ss.ivs[last].reduce && ss.ivs[last].extent <= 64 && pick(rng, 2) == 0 {
        ss.annotate(last, texc_schedules::ir::ForKind::Vectorized, span).expect("vectorize");
    }
    let first = ss.leaves[0];
    if !ss.ivs[first].reduce && ss.ivs[first].kind == texc_schedules::ir::ForKind::Serial {
        ss.annotate(first, texc_schedules::ir::ForKind::Parallel, span).expect("parallel");
    }
    let any = ss.leaves[pick(rng, ss.leaves.len())];
    if ss.ivs[any].kind == texc_schedules::ir::ForKind::Serial {
        ss.annotate(any, texc_schedules::ir::ForKind::Unrolled, span).expect("unroll");
    }
}

/// Every kernel of every example at its default sizes, or, when that is more
/// than `max_flops` of work, at sizes of at most 13 (odd, so no tile divides
/// them) — the interpreter and the loop evaluator are slow by design.
pub fn example_programs(max_flops: f64) -> Vec<(String, Program)> {
    let mut files: Vec<String> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .map(|e| format!("examples/{}", e.expect("entry").file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".tex"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let mut s = Session::new();
        let m = s.load_root(&root().join(&file)).expect("examples load");
        for i in 0..s.module(m).kernels.len() {
            let k = texc_compiler::KernelRef { module: m as u32, index: i as u32 };
            let mut p =
                texc_compiler::build_program(&s, k, &Bindings::default()).expect("examples specialize at defaults");
            if texc_compiler::cost::count(&p).flops > max_flops {
                let shapes = p
                    .bindings
                    .iter()
                    .filter(|(n, _)| s.kernel(k).symbol_index(n).is_some())
                    .map(|(n, v)| (n.clone(), (*v).min(13)))
                    .collect();
                p = texc_compiler::build_program(&s, k, &Bindings { shapes, ..Bindings::default() })
                    .expect("small sizes specialize");
            }
            out.push((format!("{file}:{}", s.kernel(k).name), p));
        }
    }
    out
}

/// Every wrapper kernel of `tests/conformance/std_ops.tex`, specialized with
/// every shape symbol at `size` (a few kernels need related sizes).
pub fn std_op_programs(size: i64) -> Vec<(String, Program)> {
    let mut s = Session::new();
    let m = s.load_root(&root().join("tests/conformance/std_ops.tex")).expect("loads");
    (0..s.module(m).kernels.len())
        .map(|i| {
            let k = texc_compiler::KernelRef { module: m as u32, index: i as u32 };
            let info = s.kernel(k);
            let shapes = info
                .symbols
                .iter()
                .map(|sym| {
                    let v = match (info.name.as_str(), sym.name.as_str()) {
                        ("t_conv2d_groups", "Cg") => 3,
                        ("t_conv2d_groups", "K") => 4,
                        ("t_conv2d_groups", "C") => 6,
                        ("t_group_norm", "C") => 8,
                        ("t_conv2d" | "t_conv2d_im2col", "R" | "S") => 3,
                        ("t_winograd_f2" | "t_winograd_f4", "H" | "W") => 8,
                        _ => size,
                    };
                    (sym.name.clone(), v)
                })
                .collect();
            let b = Bindings { shapes, ..Bindings::default() };
            let p = texc_compiler::build_program(&s, k, &b).unwrap_or_else(|d| panic!("{}: {}", info.name, d.message));
            (info.name.clone(), p)
        })
        .collect()
}

/// Kernels and odd sizes that the random-schedule property tests draw from.
pub const RANDOM_SCHEDULE_CASES: [(&str, Option<&str>, &[(&str, i64)]); 4] = [
    ("examples/matmul.tex", None, &[("M", 13), ("K", 7), ("N", 19)]),
    ("examples/conv2d.tex", None, &[("C", 3), ("H", 9), ("W", 7), ("K", 5)]),
    ("examples/softmax.tex", None, &[("N", 5), ("D", 21)]),
    ("examples/norms.tex", Some("ln"), &[("N", 6), ("D", 17)]),
];

/// Specialize a case of [`RANDOM_SCHEDULE_CASES`].
pub fn random_case_program(file: &str, kernel: Option<&str>, shapes: &[(&str, i64)]) -> Program {
    let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
    compile(file, kernel, &b).expect("compiles")
}

/// At random, compute temporaries inside a random loop of their last reader
/// (`compute_at`), keeping those attachments that are legal.
pub fn random_attachments(p: &Program, s: &mut texc_schedules::schedule::Schedules, rng: &mut SplitMix64) {
    use texc_compiler::tir::TensorRole;
    for pi in (0..p.stages.len()).rev() {
        let t = p.stages[pi].tensor;
        if rng.next_u64() % 3 == 0 || p.tensor(t).role != TensorRole::Temp {
            continue;
        }
        let Some(owner) = (pi + 1..p.stages.len()).rev().find(|&q| reads(p, p.stages[q].value, t)) else { continue };
        let leaves = &s.stages[owner].leaves;
        let leaf = leaves[(rng.next_u64() % leaves.len() as u64) as usize];
        let mut trial = s.clone();
        let span = Default::default();
        trial.attach[pi] = Some(texc_schedules::schedule::Attach { owner, leaf, layout: None, span });
        if texc_schedules::attach::infer(p, &mut trial.clone()).is_ok() {
            *s = trial;
        }
    }
}

fn reads(p: &Program, e: texc_compiler::tir::TExprId, t: texc_compiler::tir::TensorId) -> bool {
    matches!(p.expr(e), texc_compiler::tir::TExpr::Load(x, _) if *x == t)
        || p.children(e).into_iter().any(|c| reads(p, c, t))
}

/// Lower `base` with a random legal schedule (and, at random, default inlining).
pub fn randomly_scheduled(base: &Program, rng: &mut SplitMix64) -> texc_schedules::LoopFunc {
    let mut p = base.clone();
    if rng.next_u64() % 2 == 0 {
        texc_schedules::default::default_inlining(&mut p);
    }
    texc_schedules::normalize::hoist_reductions(&mut p);
    let mut s = texc_schedules::schedule::Schedules::new(&p);
    for ss in &mut s.stages {
        random_schedule(ss, rng);
    }
    random_attachments(&p, &mut s, rng);
    let regions = texc_schedules::attach::infer(&p, &mut s).expect("kept attachments are legal");
    let f = texc_schedules::lower::lower(p, &s, &regions);
    texc_schedules::verify::verify(&f).expect("verifies");
    f
}

/// An example at the given sizes, with its own `x86-avx2` schedule applied:
/// the specialized program and its loop nests.
pub fn example_with_its_schedule(file: &str, shapes: &[(&str, i64)]) -> (Program, texc_schedules::LoopFunc) {
    let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
    let mut s = Session::new();
    let m = s.load_root(&root().join(file)).expect("loads");
    let k = s.entry_kernel(m, None).expect("one kernel");
    let p = texc_compiler::build_program(&s, k, &b).expect("specializes");
    let sched = texc_schedules::find_schedule(&s, k, "x86-avx2").expect("the example has an x86-avx2 schedule");
    let f = texc_schedules::schedule_and_lower(p.clone(), "x86-avx2", Some(sched)).expect("the schedule applies");
    (p, f)
}
