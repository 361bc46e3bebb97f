//! What each subcommand does.

use crate::args::{BenchArgs, Cli, Command, Common, RunArgs};
use std::collections::HashMap;
use std::path::PathBuf;
use texc_compiler::interp;
use texc_compiler::{Bindings, KernelRef, Session};
use texc_grammar::{diagnostic::render_all, Diagnostic};
use texc_runtime::{read_npy, write_npy, Tensor};

const TARGETS: [&str; 7] = ["interp", "x86-avx2", "x86-avx512", "host", "cranelift", "nvptx-sm80", "nvptx-sm90"];
/// Write to stdout. A closed pipe (`texc emit ... | head`) ends texc
/// quietly, as it does other command-line tools; other write errors are
/// reported.
fn out(args: std::fmt::Arguments) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

macro_rules! outln {
    ($($t:tt)*) => { out(format_args!("{}\n", format_args!($($t)*))) };
}

macro_rules! outp {
    ($($t:tt)*) => { out(format_args!($($t)*)) };
}

const CPU_TARGETS: [&str; 3] = ["x86-avx2", "x86-avx512", "host"];
const STAGES: [&str; 9] = ["ast", "tir", "graph", "egraph", "loops", "llvm", "asm", "ptx", "mlir"];

/// How a command failed: user input (exit 1) or usage / not built (exit 2).
enum Fail {
    Input(Vec<Diagnostic>),
    Usage(String),
}

impl From<Diagnostic> for Fail {
    fn from(d: Diagnostic) -> Fail {
        Fail::Input(vec![d])
    }
}

impl From<Vec<Diagnostic>> for Fail {
    fn from(d: Vec<Diagnostic>) -> Fail {
        Fail::Input(d)
    }
}

pub fn run(cli: Cli) -> i32 {
    let mut session = Session::new();
    let result = match cli.command {
        Command::Check(c) => check(&mut session, &c),
        Command::Emit { common, stage } => emit(&mut session, &common, &stage),
        Command::Run(r) => run_kernel(&mut session, &r),
        Command::Bench(b) => bench(&mut session, &b),
        Command::Tune(_) => Err(not_built("`texc tune`", "the autotuner")),
        Command::Compile { common, output } => compile_aot(&mut session, &common, output.as_deref()),
        Command::Analyze { common, plot } => analyze(&mut session, &common, plot.as_deref()),
    };
    match result {
        Ok(()) => 0,
        Err(Fail::Input(diags)) => {
            eprint!("{}", render_all(&diags, &session.sources));
            1
        }
        Err(Fail::Usage(msg)) => {
            eprintln!("error: {msg}");
            2
        }
    }
}

fn not_built(what: &str, needs: &str) -> Fail {
    Fail::Usage(format!("{what} is not built yet: it needs {needs}, which texc does not have yet"))
}

fn check_target(t: &str) -> Result<(), Fail> {
    if t == "interp" || CPU_TARGETS.contains(&t) {
        Ok(())
    } else if TARGETS.contains(&t) {
        Err(Fail::Usage(format!("target `{t}` is not built yet; today `interp`, {} run", CPU_TARGETS.join(", "))))
    } else {
        Err(Fail::Input(vec![
            Diagnostic::error(format!("unknown target `{t}`")).with_note(format!("targets: {}", TARGETS.join(", ")))
        ]))
    }
}

/// Parse `A=1,B=2` lists (repeatable flags) into pairs.
fn parse_pairs(flag: &str, values: &[String]) -> Result<Vec<(String, String)>, Fail> {
    let mut out = Vec::new();
    for v in values {
        for part in v.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((n, x)) = part.split_once('=') else {
                return Err(Fail::Usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            };
            let (n, x) = (n.trim(), x.trim());
            if n.is_empty() || x.is_empty() {
                return Err(Fail::Usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            }
            out.push((n.to_string(), x.to_string()));
        }
    }
    Ok(out)
}

fn parse_ints(flag: &str, values: &[String]) -> Result<Vec<(String, i64)>, Fail> {
    parse_pairs(flag, values)?
        .into_iter()
        .map(|(n, v)| match v.parse::<i64>() {
            Ok(x) => Ok((n, x)),
            Err(_) => Err(Fail::Usage(format!("{flag}: `{n}={v}`: `{v}` is not an integer"))),
        })
        .collect()
}

fn bindings(c: &Common) -> Result<Bindings, Fail> {
    Ok(Bindings {
        shapes: parse_ints("--shape", &c.shape)?,
        consts: parse_ints("--const", &c.consts)?,
        input_shapes: HashMap::new(),
    })
}

fn load(session: &mut Session, c: &Common) -> Result<usize, Fail> {
    Ok(session.load_root(&c.file)?)
}

fn check(session: &mut Session, c: &Common) -> Result<(), Fail> {
    check_target(&c.target)?;
    let m = load(session, c)?;
    let b = bindings(c)?;
    let kernels: Vec<KernelRef> = match &c.kernel {
        Some(k) => vec![session.entry_kernel(m, Some(k))?],
        None => (0..session.module(m).kernels.len()).map(|i| KernelRef { module: m as u32, index: i as u32 }).collect(),
    };
    let mut specialized = 0;
    let mut diags = Vec::new();
    for k in &kernels {
        // Bounds and ranges need sizes: check at the sizes the source and flags give, when they give all.
        let info = session.kernel(*k);
        let own = |n: &String| info.symbol_index(n).is_some() || info.param_index(n).is_some();
        let b = Bindings {
            shapes: b.shapes.iter().filter(|(n, _)| own(n)).cloned().collect(),
            consts: b.consts.iter().filter(|(n, _)| own(n)).cloned().collect(),
            input_shapes: HashMap::new(),
        };
        let sized = info.symbols.iter().all(|s| s.default.is_some() || b.shapes.iter().any(|(n, _)| *n == s.name))
            && info.params.iter().all(|p| match &p.info {
                texc_compiler::resolve::ParamInfo::Const { default } => {
                    default.is_some() || b.consts.iter().any(|(n, _)| *n == p.name)
                }
                _ => true,
            });
        if sized {
            match texc_compiler::build_program(session, *k, &b) {
                Ok(p) => {
                    specialized += 1;
                    diags.extend(check_cpu_schedules(session, *k, &p));
                }
                Err(d) => diags.push(d),
            }
        }
    }
    if !diags.is_empty() {
        return Err(Fail::Input(diags));
    }
    outln!(
        "ok: {} kernel{} checked; {} at concrete sizes (bounds proven)",
        kernels.len(),
        if kernels.len() == 1 { "" } else { "s" },
        specialized
    );
    Ok(())
}

/// Apply every CPU `schedule` block of a kernel, to report illegal primitives.
fn check_cpu_schedules(session: &Session, k: KernelRef, p: &texc_compiler::Program) -> Vec<Diagnostic> {
    CPU_TARGETS
        .iter()
        .filter_map(|t| texc_schedules::find_schedule(session, k, t).map(|sc| (t, sc)))
        .filter_map(|(t, sc)| texc_schedules::schedule_and_lower(p.clone(), t, Some(sc)).err())
        .collect()
}

fn emit(session: &mut Session, c: &Common, stage: &str) -> Result<(), Fail> {
    if !STAGES.contains(&stage) {
        return Err(Fail::Usage(format!("unknown stage `{stage}`; stages: {}", STAGES.join(", "))));
    }
    if matches!(stage, "loops" | "llvm" | "asm") {
        if !CPU_TARGETS.contains(&c.target.as_str()) {
            return Err(Fail::Usage(format!(
                "`--stage {stage}` is for a CPU target; add --target x86-avx2 (or {})",
                CPU_TARGETS[1..].join(", ")
            )));
        }
    } else {
        check_target(&c.target)?;
    }
    let m = load(session, c)?;
    match stage {
        "ast" => outp!("{}", texc_grammar::print::print_ast(&session.module(m).ast)),
        "egraph" => {
            let k = session.entry_kernel(m, c.kernel.as_deref())?;
            let target = if c.target == "interp" { "x86-avx2" } else { c.target.as_str() };
            let r = texc_compiler::build_rewritten(session, k, &bindings(c)?, target)?;
            outp!("{}", texc_compiler::rewrite::print_plan(&r.plan, target, r.kept_original.as_deref()));
        }
        "graph" => {
            let k = session.entry_kernel(m, c.kernel.as_deref())?;
            let p = texc_compiler::build_program(session, k, &bindings(c)?)?;
            outp!("{}", texc_compiler::graph::print_graph(&p));
        }
        "tir" => {
            let k = session.entry_kernel(m, c.kernel.as_deref())?;
            let p = texc_compiler::build_program(session, k, &bindings(c)?)?;
            outp!("{}", texc_compiler::print::print_program(&p));
        }
        "loops" => {
            let k = session.entry_kernel(m, c.kernel.as_deref())?;
            let p = program_for_target(session, k, &bindings(c)?, c)?;
            let sched = texc_schedules::find_schedule(session, k, &c.target);
            let f = texc_schedules::schedule_and_lower(p, &c.target, sched)?;
            outp!("{}", texc_schedules::ir::print(&f));
        }
        "llvm" | "asm" => {
            let k = session.entry_kernel(m, c.kernel.as_deref())?;
            let p = program_for_target(session, k, &bindings(c)?, c)?;
            let sched = texc_schedules::find_schedule(session, k, &c.target);
            let f = texc_schedules::schedule_and_lower(p, &c.target, sched)?;
            let text = if stage == "llvm" {
                texc_codegen::emit_llvm(&f, &c.target)
            } else {
                texc_codegen::emit_asm(&f, &c.target)
            };
            outp!("{}", text.map_err(|e| Diagnostic::error(format!("code generation failed: {e}")))?);
        }
        other => return Err(not_built(&format!("stage `{other}`"), "a later part of the compiler")),
    }
    Ok(())
}

/// Everything `run` and `bench` need: the specialized program, the loop
/// nests for a compiled target, and the arguments.
struct Prepared {
    p: texc_compiler::Program,
    loops: Option<texc_schedules::LoopFunc>,
    args: Vec<interp::Arg>,
    outputs: Vec<(String, String)>,
}

fn prepare(session: &mut Session, r: &RunArgs) -> Result<Prepared, Fail> {
    let c = &r.common;
    check_target(&c.target)?;
    let inputs = parse_pairs("--input", &r.input)?;
    let outputs = parse_pairs("--output", &r.output)?;
    let scalars = parse_pairs("--scalar", &r.scalar)?;
    let mut scalar_values = Vec::new();
    for (n, text) in &scalars {
        let v = text
            .parse::<f64>()
            .map_err(|_| Fail::Usage(format!("--scalar: `{n}={text}`: `{text}` is not a number")))?;
        scalar_values.push((n.clone(), v));
    }
    let m = load(session, c)?;
    let k = session.entry_kernel(m, c.kernel.as_deref())?;
    let info = session.kernel(k);
    let kname = info.name.clone();
    for (n, _) in inputs.iter().chain(&scalars) {
        if info.param_index(n).is_none() {
            return Err(Diagnostic::error(format!("`{n}` is not a parameter of kernel `{kname}`")).into());
        }
    }
    let mut files: HashMap<String, Tensor> = HashMap::new();
    for (n, path) in &inputs {
        let t = read_npy(&PathBuf::from(path)).map_err(|e| Diagnostic::error(format!("input `{n}`: {e}")))?;
        files.insert(n.clone(), t);
    }
    let mut b = bindings(c)?;
    b.input_shapes = files.iter().map(|(n, t)| (n.clone(), t.shape.iter().map(|&d| d as i64).collect())).collect();
    let p = texc_compiler::build_program(session, k, &b)?;
    for (n, _) in &outputs {
        if !p.outputs.iter().any(|&o| p.tensor(o).name == *n) {
            return Err(Diagnostic::error(format!("`{n}` is not an output of kernel `{kname}`")).into());
        }
    }
    let loops = if c.target == "interp" {
        None
    } else {
        let sched = texc_schedules::find_schedule(session, k, &c.target);
        let q = program_for_target(session, k, &b, c)?;
        Some(texc_schedules::schedule_and_lower(q, &c.target, sched)?)
    };
    let args = interp::bind_args(&p, files, &scalar_values, r.seed).map_err(Diagnostic::error)?;
    Ok(Prepared { p, loops, args, outputs })
}

/// The program a compiled target runs: rewritten by the e-graph unless the
/// kernel has its own schedule for the target or `--no-rewrite` is given.
fn program_for_target(
    session: &Session,
    k: KernelRef,
    b: &Bindings,
    c: &Common,
) -> Result<texc_compiler::Program, Fail> {
    if c.no_rewrite || c.target == "interp" || texc_schedules::find_schedule(session, k, &c.target).is_some() {
        return Ok(texc_compiler::build_program(session, k, b)?);
    }
    let r = texc_compiler::build_rewritten(session, k, b, &c.target)?;
    if let Some(why) = r.kept_original.filter(|w| w != "no cheaper plan") {
        eprintln!("note: {why}; running the graph as written");
    }
    Ok(r.program)
}

fn jit(f: &texc_schedules::LoopFunc, target: &str) -> Result<texc_codegen::Compiled, Fail> {
    texc_codegen::compile(f, target)
        .map_err(|e| Fail::Input(vec![Diagnostic::error(format!("code generation failed: {e}"))]))
}

/// Tolerance of `--check` for an output type (normwise relative error).
fn tolerance(dtype: texc_runtime::DType) -> f64 {
    use texc_runtime::DType::*;
    match dtype {
        F16 | BF16 => 1e-2,
        F32 => 1e-5,
        F64 => 1e-12,
        _ => 0.0,
    }
}

fn run_kernel(session: &mut Session, r: &RunArgs) -> Result<(), Fail> {
    let c = &r.common;
    if r.check && c.target == "interp" {
        return Err(Fail::Usage(
            "--check compares a compiled target with `interp`; add --target x86-avx2 (or x86-avx512, host)".into(),
        ));
    }
    let Prepared { p, loops, args, outputs } = prepare(session, r)?;
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let results = match &loops {
        None => interp::run(&p, args.clone()).map_err(|e| Diagnostic::error(e.to_string()))?,
        Some(f) => {
            let k = jit(f, &c.target)?;
            outln!("compiled `{}` for {} in {:.3} s", p.name, c.target, k.compile_time.as_secs_f64());
            k.run(args.clone()).map_err(|e| Diagnostic::error(e.to_string()))?
        }
    };
    outln!("ran `{}` on {} [{}]", p.name, c.target, sizes.join(", "));
    for (&o, t) in p.outputs.iter().zip(&results) {
        outln!("  {}", summary(&p.tensor(o).name, t));
    }
    for (n, path) in &outputs {
        let i = p.outputs.iter().position(|&o| p.tensor(o).name == *n).expect("checked above");
        write_npy(&PathBuf::from(path), &results[i]).map_err(|e| Diagnostic::error(e.to_string()))?;
        outln!("  wrote `{n}` to {path}");
    }
    if r.check {
        let want = interp::run(&p, args).map_err(|e| Diagnostic::error(e.to_string()))?;
        let mut bad = Vec::new();
        for ((&o, got), want) in p.outputs.iter().zip(&results).zip(&want) {
            let err = rel_error(got, want);
            let tol = tolerance(want.dtype());
            let name = &p.tensor(o).name;
            outln!("  check `{name}` against interp: max relative error {err:.3e} (tolerance {tol:.0e})");
            if err > tol {
                bad.push(format!("`{name}` differs from the interpreter: relative error {err:.3e} > {tol:.0e}"));
            }
        }
        if !bad.is_empty() {
            return Err(Fail::Input(bad.into_iter().map(Diagnostic::error).collect()));
        }
    }
    Ok(())
}

/// Normwise relative error: max |a - b| / max |b|; NaN where exactly one side is NaN counts as infinite.
fn rel_error(got: &Tensor, want: &Tensor) -> f64 {
    let (a, b) = (got.to_f64(), want.to_f64());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
    a.iter().zip(&b).fold(0.0f64, |m, (x, y)| {
        if x.is_nan() != y.is_nan() {
            f64::INFINITY
        } else if x.is_nan() || x == y {
            m
        } else {
            m.max((x - y).abs())
        }
    }) / scale
}

fn bench(session: &mut Session, a: &BenchArgs) -> Result<(), Fail> {
    let target = a.run.common.target.clone();
    if !CPU_TARGETS.contains(&target.as_str()) {
        check_target(&target)?;
        return Err(Fail::Usage(format!(
            "`texc bench` times compiled code; add --target x86-avx2 (or {})",
            CPU_TARGETS[1..].join(", ")
        )));
    }
    if a.repeat == 0 {
        return Err(Fail::Usage("--repeat must be at least 1".into()));
    }
    // FLOPs and bytes are those of the program as written (a rewritten plan,
    // e.g. Winograd, is credited with the work it replaces: effective rates).
    let Prepared { p, loops, args, .. } = prepare(session, &a.run)?;
    let f = loops.expect("a compiled target");
    let k = jit(&f, &target)?;
    let mut bufs = k.prepare(args).map_err(|e| Diagnostic::error(e.to_string()))?;
    for _ in 0..a.warmup {
        k.call(&mut bufs);
    }
    let mut times: Vec<f64> = (0..a.repeat)
        .map(|_| {
            let t = std::time::Instant::now();
            k.call(&mut bufs);
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let counts = texc_compiler::cost::count(&p);
    let threads = texc_runtime::pool::num_threads();
    let lanes = texc_schedules::default::vector_lanes(&target) as usize;
    let (roof, source) = texc_runtime::roofline::roofline(&target, lanes, threads);
    let gflops = counts.flops / median / 1e9;
    let gbs = counts.bytes / median / 1e9;
    let bound = roof.peak_gflops.min(counts.intensity() * roof.bandwidth_gbs);
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    outln!(
        "bench `{}` on {target} [{}], {threads} thread{}",
        p.name,
        sizes.join(", "),
        if threads == 1 { "" } else { "s" }
    );
    outln!("  compile   {:.3} s", k.compile_time.as_secs_f64());
    outln!(
        "  time      {:.4} ms median of {} (min {:.4}, max {:.4})",
        median * 1e3,
        times.len(),
        times[0] * 1e3,
        times[times.len() - 1] * 1e3
    );
    outln!(
        "  compute   {gflops:.2} GFLOP/s ({:.4} GFLOP), {:.1}% of peak {:.1} GFLOP/s",
        counts.flops / 1e9,
        100.0 * gflops / roof.peak_gflops,
        roof.peak_gflops
    );
    outln!(
        "  memory    {gbs:.2} GB/s ({:.2} MB compulsory), {:.1}% of {:.1} GB/s",
        counts.bytes / 1e6,
        100.0 * gbs / roof.bandwidth_gbs,
        roof.bandwidth_gbs
    );
    outln!(
        "  roofline  {:.1}% of the bound {bound:.1} GFLOP/s ({} at {:.2} FLOP/byte; ridge {:.2}; machine numbers {source})",
        100.0 * gflops / bound.max(f64::MIN_POSITIVE),
        if counts.intensity() < roof.ridge() { "memory-bound" } else { "compute-bound" },
        counts.intensity(),
        roof.ridge()
    );
    Ok(())
}

/// `texc compile FILE -o out.o|out.so`: an object or shared library with
/// `int texc_<kernel>_run(...)`, and `out.h` declaring it.
fn compile_aot(session: &mut Session, c: &Common, output: Option<&std::path::Path>) -> Result<(), Fail> {
    let Some(out) = output else {
        return Err(Fail::Usage("`texc compile` needs `-o out.o` or `-o out.so`".into()));
    };
    if !CPU_TARGETS.contains(&c.target.as_str()) {
        check_target(&c.target)?;
        return Err(Fail::Usage(format!(
            "`texc compile` needs a CPU target: add --target x86-avx2 (or {})",
            CPU_TARGETS[1..].join(", ")
        )));
    }
    let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext != "o" && ext != "so" {
        return Err(Fail::Usage(format!("`-o {}`: the output must end in .o or .so", out.display())));
    }
    let m = load(session, c)?;
    let k = session.entry_kernel(m, c.kernel.as_deref())?;
    let p = program_for_target(session, k, &bindings(c)?, c)?;
    let sched = texc_schedules::find_schedule(session, k, &c.target);
    let f = texc_schedules::schedule_and_lower(p, &c.target, sched)?;
    let fail = |e: String| Fail::Input(vec![Diagnostic::error(e)]);
    let object = if ext == "o" { out.to_path_buf() } else { out.with_extension("tmp.o") };
    texc_codegen::write_object(&f, &c.target, &object).map_err(|e| fail(format!("code generation failed: {e}")))?;
    if ext == "so" {
        let status = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-o"])
            .arg(out)
            .arg(&object)
            .status()
            .map_err(|e| fail(format!("cannot run the C compiler to link {}: {e}", out.display())))?;
        let _ = std::fs::remove_file(&object);
        if !status.success() {
            return Err(fail(format!("linking {} failed", out.display())));
        }
    }
    let header = out.with_extension("h");
    std::fs::write(&header, texc_codegen::header::header(&f, &c.target))
        .map_err(|e| fail(format!("cannot write {}: {e}", header.display())))?;
    outln!("wrote {} and {} (int texc_{}_run(...))", out.display(), header.display(), f.p.name);
    Ok(())
}

fn analyze(session: &mut Session, c: &Common, plot: Option<&std::path::Path>) -> Result<(), Fail> {
    if !CPU_TARGETS.contains(&c.target.as_str()) {
        check_target(&c.target)?;
        return Err(Fail::Usage(format!(
            "`texc analyze` needs the machine of a target: add --target x86-avx2 (or {})",
            CPU_TARGETS[1..].join(", ")
        )));
    }
    if let Some(path) = plot {
        if path.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(Fail::Usage(format!("--plot {}: the plot is an .svg file", path.display())));
        }
    }
    let m = load(session, c)?;
    let k = session.entry_kernel(m, c.kernel.as_deref())?;
    let p = texc_compiler::build_program(session, k, &bindings(c)?)?;
    let threads = texc_runtime::pool::num_threads();
    let lanes = texc_schedules::default::vector_lanes(&c.target) as usize;
    let (roof, source) = texc_runtime::roofline::roofline(&c.target, lanes, threads);
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    outln!("analyze `{}` for {} [{}]", p.name, c.target, sizes.join(", "));
    outln!(
        "  machine: {:.1} GFLOP/s peak, {:.1} GB/s, ridge {:.2} FLOP/byte ({threads} thread{}, {source})",
        roof.peak_gflops,
        roof.bandwidth_gbs,
        roof.ridge(),
        if threads == 1 { "" } else { "s" }
    );
    outln!(
        "  {:<36} {:>12} {:>12} {:>9} {:>8} {:>12}",
        "operator",
        "MFLOP",
        "KB moved",
        "FLOP/B",
        "bound",
        "roofline µs"
    );
    let ops = texc_compiler::graph::op_costs(&p);
    let mut total_us = 0.0;
    for (label, cnt) in &ops {
        let us = (cnt.flops / (roof.peak_gflops * 1e3)).max(cnt.bytes / (roof.bandwidth_gbs * 1e3));
        total_us += us;
        let bound = if cnt.intensity() < roof.ridge() { "memory" } else { "compute" };
        outln!(
            "  {:<36} {:>12.3} {:>12.1} {:>9.2} {:>8} {:>12.2}",
            label,
            cnt.flops / 1e6,
            cnt.bytes / 1e3,
            cnt.intensity(),
            bound,
            us
        );
    }
    let all = texc_compiler::cost::count(&p);
    outln!(
        "  {:<36} {:>12.3} {:>12.1} {:>9.2} {:>8} {:>12.2}",
        "total (operators run one by one)",
        all.flops / 1e6,
        ops.iter().map(|(_, c)| c.bytes).sum::<f64>() / 1e3,
        all.flops / ops.iter().map(|(_, c)| c.bytes).sum::<f64>().max(1.0),
        "",
        total_us
    );
    if let Some(path) = plot {
        std::fs::write(path, roofline_svg(&p.name, &roof, &ops))
            .map_err(|e| Fail::Input(vec![Diagnostic::error(format!("cannot write {}: {e}", path.display()))]))?;
        outln!("  wrote {}", path.display());
    }
    Ok(())
}

/// A log-log roofline chart with one point per operator.
fn roofline_svg(
    name: &str,
    roof: &texc_runtime::roofline::Roofline,
    ops: &[(String, texc_compiler::cost::Counts)],
) -> String {
    let (w, h, ml, mb, mt, mr) = (720.0, 460.0, 70.0, 50.0, 30.0, 200.0);
    let (x0, x1) = (-2.0f64, 4.0f64); // log10 FLOP/byte
    let y1 = (roof.peak_gflops * 3.0).log10().ceil();
    let y0 = y1 - 5.0; // log10 GFLOP/s
    let px = |i: f64| ml + (i.log10().clamp(x0, x1) - x0) / (x1 - x0) * (w - ml - mr);
    let py = |g: f64| h - mb - (g.max(1e-9).log10().clamp(y0, y1) - y0) / (y1 - y0) * (h - mb - mt);
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n");
    s += &format!(
        "<text x=\"{ml}\" y=\"18\" font-size=\"13\">roofline of {name}: {:.1} GFLOP/s, {:.1} GB/s</text>\n",
        roof.peak_gflops, roof.bandwidth_gbs
    );
    s += &format!(
        "<rect x=\"{ml}\" y=\"{mt}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n",
        w - ml - mr,
        h - mb - mt
    );
    for e in x0 as i32..=x1 as i32 {
        let x = px(10f64.powi(e));
        s += &format!("<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">1e{e}</text>\n", h - mb + 16.0);
    }
    for e in y0 as i32..=y1 as i32 {
        let y = py(10f64.powi(e));
        s += &format!("<text x=\"{:.1}\" y=\"{y:.1}\" text-anchor=\"end\">1e{e}</text>\n", ml - 6.0);
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">operational intensity (FLOP/byte)</text>\n",
        (ml + w - mr) / 2.0,
        h - 10.0
    );
    s += &format!(
        "<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">GFLOP/s</text>\n",
        (mt + h - mb) / 2.0,
        (mt + h - mb) / 2.0
    );
    // The roof: bandwidth slope up to the ridge, then the peak.
    let pts: Vec<String> = (0..=120)
        .map(|i| {
            let oi = 10f64.powf(x0 + (x1 - x0) * i as f64 / 120.0);
            format!("{:.1},{:.1}", px(oi), py((oi * roof.bandwidth_gbs).min(roof.peak_gflops)))
        })
        .collect();
    s += &format!("<polyline points=\"{}\" fill=\"none\" stroke=\"#c33\" stroke-width=\"2\"/>\n", pts.join(" "));
    for (i, (label, c)) in ops.iter().enumerate() {
        let oi = c.intensity().clamp(1e-3, 1e5);
        let g = (oi * roof.bandwidth_gbs).min(roof.peak_gflops);
        let (x, y) = (px(oi), py(g));
        s += &format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"#36c\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            x + 6.0,
            y - 6.0 + 12.0 * (i % 2) as f64,
            i
        );
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{i}: {}</text>\n",
            w - mr + 10.0,
            mt + 14.0 * (i + 1) as f64,
            label.replace('&', "&amp;").replace('<', "&lt;")
        );
    }
    s += "</svg>\n";
    s
}

fn summary(name: &str, t: &Tensor) -> String {
    let v = t.to_f64();
    let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    let head = format!("{name}: {}[{}]", t.dtype(), dims.join(", "));
    if v.is_empty() {
        return format!("{head}  (empty)");
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let first: Vec<String> = v.iter().take(4).map(|x| format!("{x:.6}")).collect();
    format!(
        "{head}  min {min:.6}  max {max:.6}  mean {mean:.6}  first [{}{}]",
        first.join(", "),
        if v.len() > 4 { ", …" } else { "" }
    )
}
