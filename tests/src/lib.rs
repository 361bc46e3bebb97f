//! Helpers shared by texc's integration tests. Everything that compiles
//! goes through `texc-pipeline`, as the CLI does.

pub mod scratch;
pub use scratch::scratch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::{Bindings, KernelRef, Program};
use texc_pipeline::{Error, Options, Pipeline};
use texc_runtime::{SplitMix64, Tensor};

pub use texc_pipeline::oracle::rel_error;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// A pipeline for a target, with every verifier on; GPU targets run their
/// kernels on the GPU where there is one, else in the CPU emulation (CI has no GPU).
pub fn pipeline(target: &str) -> Pipeline {
    pipeline_on(texc_compiler::target::lookup(target).expect("a registered target"))
}

/// [`pipeline`] for a target that need not be registered (one made for a
/// simulated machine by `target::with_caches`).
pub fn pipeline_on(t: &'static Target) -> Pipeline {
    let mut o = Options::new(t);
    o.verify = true;
    o.emulate_gpu = t.kind == TargetKind::Gpu && t.check_runs_here().is_err();
    Pipeline::new(o)
}

/// An error of the pipeline, rendered as the CLI prints it.
pub fn rendered(pl: &Pipeline, e: Error) -> String {
    match e {
        Error::Input(d) => pl.render(&d),
        Error::Usage(m) => format!("error: {m}\n"),
    }
}

/// Load `file` (relative to the workspace root) under its relative name, so
/// that printed IR (the `source` line of loop nests) is the same in every checkout.
fn load_relative(pl: &mut Pipeline, file: &str) -> Result<usize, texc_pipeline::Error> {
    let path = root().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    pl.load_text(file, &text, Some(path))
}

/// Load a file (relative to the workspace root) for `target` and pick a kernel.
pub fn load_file(target: &str, file: &str, kernel: Option<&str>) -> Result<(Pipeline, KernelRef), String> {
    let mut pl = pipeline(target);
    let k = load_relative(&mut pl, file).and_then(|m| pl.kernel(m, kernel)).map_err(|e| rendered(&pl, e))?;
    Ok((pl, k))
}

/// Load source text (no file of its own: it may import `std.nn` only) for `target` and pick a kernel.
pub fn load_text(target: &str, name: &str, text: &str, kernel: Option<&str>) -> Result<(Pipeline, KernelRef), String> {
    let mut pl = pipeline(target);
    let k = pl.load_text(name, text, None).and_then(|m| pl.kernel(m, kernel)).map_err(|e| rendered(&pl, e))?;
    Ok((pl, k))
}

/// Load a file for `target`: the pipeline and every kernel the file defines.
pub fn kernels_of_file(target: &str, file: &str) -> (Pipeline, Vec<KernelRef>) {
    let mut pl = pipeline(target);
    let m = load_relative(&mut pl, file).unwrap_or_else(|e| panic!("{file}: {}", rendered(&pl, e)));
    let n = pl.session.module(m).kernels.len();
    (pl, (0..n).map(|i| KernelRef { module: m as u32, index: i as u32 }).collect())
}

/// Every example file, sorted (`examples/…`).
pub fn example_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .map(|e| format!("examples/{}", e.expect("entry").file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".tex"))
        .collect();
    files.sort();
    files
}

/// Specialize, panicking with the rendered diagnostic.
pub fn specialize(pl: &mut Pipeline, k: KernelRef, b: &Bindings) -> Program {
    pl.specialize(k, b).unwrap_or_else(|e| panic!("{}", rendered(pl, e)))
}

/// Load a file (relative to the workspace root) and specialize one kernel.
/// Errors come back rendered, as the CLI prints them.
pub fn compile(file: &str, kernel: Option<&str>, b: &Bindings) -> Result<Program, String> {
    let (mut pl, k) = load_file("interp", file, kernel)?;
    pl.specialize(k, b).map_err(|e| rendered(&pl, e))
}

/// Check source text the way `texc check` does, without touching the disk
/// (imports of `std.nn` work; file imports resolve against the workspace root).
/// Returns rendered diagnostics on failure (warnings do not fail it). Kernels
/// whose sizes all have defaults are specialized and their schedules applied
/// for compiled targets; every schedule block is validated.
pub fn check_text(name: &str, text: &str) -> Result<(), String> {
    check_report(name, text).map(|_| ())
}

/// [`check_text`], with what `texc check` prints on success: the rendered
/// warnings, then the summary.
pub fn check_report(name: &str, text: &str) -> Result<String, String> {
    let mut pl = pipeline("interp");
    let m = pl.load_text(name, text, Some(root().join(name))).map_err(|e| rendered(&pl, e))?;
    let kernels: Vec<KernelRef> =
        (0..pl.session.module(m).kernels.len()).map(|i| KernelRef { module: m as u32, index: i as u32 }).collect();
    let checked = texc_pipeline::check::check(&mut pl, &kernels, &Bindings::default()).map_err(|e| rendered(&pl, e))?;
    Ok(format!("{}{}", pl.render(&checked.warnings), checked.summary()))
}

/// The loop nests of `p` (kernel `k`) for the pipeline's target: its own
/// schedule or the default, lowered and legalized.
pub fn loops(pl: &mut Pipeline, k: KernelRef, p: &Program) -> texc_schedules::LoopFunc {
    pl.loops(k, p.clone()).unwrap_or_else(|e| panic!("{}", rendered(pl, e))).legal
}

/// `p` lowered with `target`'s default schedule (not yet legalized).
pub fn default_lowered(target: &str, p: &Program) -> texc_schedules::LoopFunc {
    default_lowered_on(texc_compiler::target::lookup(target).expect("a registered target"), p)
}

/// [`default_lowered`] for a target that need not be registered.
pub fn default_lowered_on(t: &'static Target, p: &Program) -> texc_schedules::LoopFunc {
    let mut pl = pipeline_on(t);
    pl.default_loops(p.clone()).unwrap_or_else(|e| panic!("{}", rendered(&pl, e))).lowered
}

/// The only kernel of `src` with its own `target` schedule applied: the
/// program, and its loop nests (lowered, not yet legalized), or the rendered error.
pub fn own_schedule(target: &str, name: &str, src: &str) -> Result<(Program, texc_schedules::LoopFunc), String> {
    let (mut pl, k) = load_text(target, name, src, None)?;
    let p = pl.specialize(k, &Bindings::default()).map_err(|e| rendered(&pl, e))?;
    assert!(texc_schedules::find_schedule(&pl.session, k, pl.target()).is_some(), "{name} has a {target} schedule");
    let lowered = pl.schedule(k, p.clone()).and_then(|s| pl.lower(s)).map_err(|e| rendered(&pl, e))?;
    Ok((p, lowered))
}

/// Compile loop nests (lowered for any target, legal or not) with `target`'s backend.
pub fn compile_loops(target: &Target, f: &texc_schedules::LoopFunc) -> Result<texc_codegen::Compiled, String> {
    let mut pl = pipeline(target.name);
    let legal = pl.legalize(f.clone()).map_err(|e| rendered(&pl, e))?;
    pl.compile(&legal).map_err(|e| rendered(&pl, e))
}

/// Targets whose code the conformance tests run on this machine, with the
/// reason for each compiled target that is skipped. GPU targets run on the
/// GPU, or without one in the CPU emulation of their kernels ([`pipeline`]),
/// whose bodies are the ones their PTX has.
pub fn runnable_targets() -> (Vec<&'static Target>, Vec<String>) {
    let (mut run, mut skipped) = (Vec::new(), Vec::new());
    // `TEXC_TEST_TARGETS=nvptx-sm80,nvptx-sm90`: only these (scripts/gpu.sh on a GPU machine).
    let only: Option<Vec<String>> =
        std::env::var("TEXC_TEST_TARGETS").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let wanted = |t: &Target| only.as_ref().is_none_or(|o| o.iter().any(|n| n == t.name));
    for t in texc_compiler::target::all().iter().filter(|t| t.is_compiled() && wanted(t)) {
        match t.check_runs_here() {
            Ok(()) => run.push(t),
            Err(_) if t.kind == TargetKind::Gpu => run.push(t),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    (run, skipped)
}

/// Run a program on the interpreter with the given input tensors (by name).
pub fn run(p: &Program, inputs: HashMap<String, Tensor>) -> Vec<Tensor> {
    let args = texc_compiler::interp::bind_args(p, inputs, &[], 0).expect("arguments bind");
    texc_compiler::interp::run(p, args).expect("interpreter runs")
}

/// Draw a random legal schedule for one stage.
pub fn random_schedule(ss: &mut texc_schedules::schedule::StageSchedule, rng: &mut SplitMix64) {
    let span = Default::default();
    let pick = |rng: &mut SplitMix64, n: usize| (rng.next_u64() % n as u64) as usize;
    random_shape(ss, rng);
    let last = *ss.leaves.last().expect("leaves");
    if !ss.ivs[last].reduce && ss.ivs[last].extent <= 64 && pick(rng, 2) == 0 {
        ss.annotate(last, texc_schedules::ir::ForKind::Vectorized, span).expect("vectorize");
    }
    let first = ss.leaves[0];
    if !ss.ivs[first].reduce && ss.ivs[first].kind == texc_schedules::ir::ForKind::Serial {
        ss.annotate(first, texc_schedules::ir::ForKind::Parallel, span).expect("parallel");
    }
    let any = ss.leaves[pick(rng, ss.leaves.len())];
    if ss.ivs[any].kind == texc_schedules::ir::ForKind::Serial
        && ss.ivs[any].extent <= texc_schedules::schedule::MAX_UNROLLED_COPIES
    {
        ss.annotate(any, texc_schedules::ir::ForKind::Unrolled, span).expect("unroll");
    }
}

/// Random splits, reorders and fusions of one stage's loops.
fn random_shape(ss: &mut texc_schedules::schedule::StageSchedule, rng: &mut SplitMix64) {
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
}

/// Draw a random legal GPU schedule for one stage: random splits, reorders
/// and fusions; then some of the leading spatial loops bound to blocks, and
/// some spatial loops inside them to threads (at most 1024 per block).
pub fn random_gpu_schedule(ss: &mut texc_schedules::schedule::StageSchedule, rng: &mut SplitMix64) {
    use texc_schedules::ir::{ForKind, GpuDim};
    let span = Default::default();
    random_shape(ss, rng);
    let coin = |rng: &mut SplitMix64| !rng.next_u64().is_multiple_of(3);
    let leaves = ss.leaves.clone();
    let mut at = 0;
    for d in [GpuDim::X, GpuDim::Y] {
        match leaves.get(at) {
            Some(&l) if !ss.ivs[l].reduce && coin(rng) => {
                ss.annotate(l, ForKind::Block(d), span).expect("bind a block");
                at += 1;
            }
            _ => break,
        }
    }
    let mut threads = 1;
    let mut dims = [GpuDim::X, GpuDim::Y].into_iter();
    let mut any_thread = false;
    for &l in &leaves[at..] {
        let ext = ss.ivs[l].extent;
        if !ss.ivs[l].reduce && threads * ext <= 1024 && coin(rng) {
            let Some(d) = dims.next() else { break };
            ss.annotate(l, ForKind::Thread(d), span).expect("bind threads");
            threads *= ext;
            any_thread = true;
        }
    }
    // Without threads on the elements, a reduction over the block's threads,
    // where the reduction loops are the innermost.
    let first_reduce = leaves.iter().position(|&l| ss.ivs[l].reduce);
    let reductions_inside = first_reduce.is_some_and(|r| leaves[r..].iter().all(|&l| ss.ivs[l].reduce));
    if !any_thread && reductions_inside && coin(rng) {
        let reduce: Vec<usize> =
            leaves.iter().copied().filter(|&l| ss.ivs[l].reduce && ss.ivs[l].extent <= 1024).collect();
        if !reduce.is_empty() {
            let l = reduce[(rng.next_u64() % reduce.len() as u64) as usize];
            ss.annotate(l, ForKind::Thread(GpuDim::X), span).expect("a reduction over threads");
        }
    }
}

/// `base` with a random GPU schedule ([`random_gpu_schedule`]) for every
/// stage (inlined or not), lowered and verified.
pub fn randomly_gpu_scheduled(base: &Program, rng: &mut SplitMix64) -> texc_schedules::LoopFunc {
    let p = randomly_inlined(base, rng);
    let mut s = texc_schedules::schedule::Schedules::new(&p);
    for ss in &mut s.stages {
        random_gpu_schedule(ss, rng);
    }
    s.verify(&p).expect("random GPU schedules verify");
    let regions = texc_schedules::attach::infer(&p, &mut s).expect("no attachments");
    let mut f = texc_schedules::lower::lower(p, &s, &regions);
    texc_schedules::cross_thread::lower_cross_thread(&mut f, &s).expect("reductions over threads lower");
    texc_schedules::verify::verify(&f).expect("verifies");
    f
}

/// Every kernel of every example at its default sizes, or, when that is more
/// than `max_flops` of work, at sizes of at most 13 (odd, so no tile divides
/// them) — the interpreter and the loop evaluator are slow by design.
pub fn example_programs(max_flops: f64) -> Vec<(String, Program)> {
    let mut out = Vec::new();
    for file in example_files() {
        let (mut pl, kernels) = kernels_of_file("interp", &file);
        for k in kernels {
            let mut p = specialize(&mut pl, k, &Bindings::default());
            if texc_compiler::cost::count(&p).flops > max_flops {
                let shapes = p
                    .bindings
                    .iter()
                    .filter(|(n, _)| pl.session.kernel(k).symbol_index(n).is_some())
                    .map(|(n, v)| (n.clone(), (*v).min(13)))
                    .collect();
                p = specialize(&mut pl, k, &Bindings { shapes, ..Bindings::default() });
            }
            out.push((format!("{file}:{}", pl.session.kernel(k).name), p));
        }
    }
    out
}

/// Every wrapper kernel of `tests/conformance/std_ops.tex`, specialized with
/// every shape symbol at `size` (a few kernels need related sizes).
pub fn std_op_programs(size: i64) -> Vec<(String, Program)> {
    let mut pl = pipeline("interp");
    let m = pl.load(&root().join("tests/conformance/std_ops.tex")).expect("loads");
    (0..pl.session.module(m).kernels.len())
        .map(|i| {
            let k = KernelRef { module: m as u32, index: i as u32 };
            let info = pl.session.kernel(k).clone();
            let shapes = info
                .symbols
                .iter()
                .map(|sym| {
                    let v = match (info.name.as_str(), sym.name.as_str()) {
                        ("t_conv2d_groups", "Cg") => 3,
                        ("t_conv1d", "Cg" | "R") => 3,
                        ("t_conv1d", "C") => 6,
                        ("t_conv1d", "K") => 4,
                        ("t_conv2d_groups", "K") => 4,
                        ("t_conv2d_groups", "C") => 6,
                        ("t_group_norm", "C") => 8,
                        ("t_conv2d" | "t_conv2d_im2col" | "t_conv2d_im2col_t", "R" | "S") => 3,
                        // Sides that are not multiples of the tiles (their last tiles
                        // reach past the image); the unpadded forms take `size`.
                        ("t_winograd_f2" | "t_winograd_f4", "H") => 7,
                        ("t_winograd_f2" | "t_winograd_f4", "W") => 9,
                        ("t_winograd_f2k", "H") => 6,
                        ("t_winograd_f2k", "W") => 10,
                        ("t_conv_transpose2d" | "t_conv_transpose2d_bias" | "t_conv3d" | "t_conv3d_bias", "C") => 3,
                        ("t_conv_transpose2d" | "t_conv_transpose2d_bias" | "t_conv3d" | "t_conv3d_bias", "K") => 4,
                        (
                            "t_conv_transpose2d" | "t_conv_transpose2d_bias" | "t_conv3d" | "t_conv3d_bias",
                            "T" | "R" | "S",
                        ) => 3,
                        _ => size,
                    };
                    (sym.name.clone(), v)
                })
                .collect();
            let b = Bindings { shapes, ..Bindings::default() };
            let p = pl.specialize(k, &b).unwrap_or_else(|e| panic!("{}: {}", info.name, rendered(&pl, e)));
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
        trial.attach[pi] = Some(texc_schedules::schedule::Attach { owner, leaf, layout: None, shared: false, span });
        if texc_schedules::attach::infer(p, &mut trial.clone()).is_ok() {
            *s = trial;
        }
    }
}

fn reads(p: &Program, e: texc_compiler::tir::TExprId, t: texc_compiler::tir::TensorId) -> bool {
    matches!(p.expr(e), texc_compiler::tir::TExpr::Load(x, _) if *x == t)
        || p.children(e).into_iter().any(|c| reads(p, c, t))
}

/// `base` with, at random, the default inlining, and its reductions hoisted.
fn randomly_inlined(base: &Program, rng: &mut SplitMix64) -> Program {
    let mut p = base.clone();
    if rng.next_u64().is_multiple_of(2) {
        texc_schedules::strategy::default_inlining(&mut p);
    }
    texc_schedules::normalize::hoist_reductions(&mut p);
    p
}

/// Lower `base` with a random legal schedule (and, at random, default inlining).
pub fn randomly_scheduled(base: &Program, rng: &mut SplitMix64) -> texc_schedules::LoopFunc {
    let p = randomly_inlined(base, rng);
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
/// the specialized program and its (legalized) loop nests.
pub fn example_with_its_schedule(file: &str, shapes: &[(&str, i64)]) -> (Program, texc_schedules::LoopFunc) {
    let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
    let (mut pl, k) = load_file("x86-avx2", file, None).expect("loads");
    assert!(texc_schedules::find_schedule(&pl.session, k, pl.target()).is_some(), "{file} has an x86-avx2 schedule");
    let p = specialize(&mut pl, k, &b);
    let f = loops(&mut pl, k, &p);
    (p, f)
}
