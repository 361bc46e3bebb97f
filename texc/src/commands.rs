//! What each subcommand does: read arguments and files, call the pipeline
//! (`texc-pipeline`, which owns every pass), print results.

use crate::args::{BenchArgs, Cli, Command, Common, RunArgs};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use texc_compiler::target::Target;
use texc_compiler::{Bindings, KernelRef};
use texc_grammar::Diagnostic;
use texc_pipeline::{Dump, Error, Options, Pipeline};
use texc_runtime::{write_npy, Tensor};

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

const STAGES: [&str; 11] = ["ast", "tir", "graph", "egraph", "loops", "llvm", "asm", "clif", "vcode", "ptx", "mlir"];

/// How a command ended when it failed: rendered diagnostics (exit 1) or misuse (exit 2).
enum Fail {
    Input(String),
    Usage(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        match e {
            Error::Input(d) => Fail::Input(texc_grammar::diagnostic::render_all(&d, &Default::default())),
            Error::Usage(m) => Fail::Usage(m),
        }
    }
}

pub fn run(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Check(c) => with_pipeline(&c, |pl| check(pl, &c)),
        Command::Emit { common, stage } => with_pipeline(&common, |pl| emit(pl, &common, &stage)),
        Command::Run(r) => with_pipeline(&r.common, |pl| run_kernel(pl, &r)),
        Command::Bench(b) => with_pipeline(&b.run.common, |pl| bench(pl, &b)),
        Command::Tune(_) => Err(not_built("`texc tune`", "the autotuner")),
        Command::Compile { common, output } => with_pipeline(&common, |pl| compile_aot(pl, &common, output.as_deref())),
        Command::Analyze { common, plot } => with_pipeline(&common, |pl| analyze(pl, &common, plot.as_deref())),
    };
    match result {
        Ok(()) => 0,
        Err(Fail::Input(text)) => {
            eprint!("{text}");
            1
        }
        Err(Fail::Usage(msg)) => {
            eprintln!("error: {msg}");
            2
        }
    }
}

/// Build the pipeline a command asks for, run `body` on it, and render its
/// errors with its sources; `--time-passes` prints the table at the end.
fn with_pipeline(c: &Common, body: impl FnOnce(&mut Pipeline) -> Result<(), Error>) -> Result<(), Fail> {
    let mut pl = Pipeline::new(options(c)?);
    let result = body(&mut pl);
    if c.time_passes {
        eprint!("{}", pl.timing_table());
    }
    result.map_err(|e| match e {
        Error::Input(d) => Fail::Input(pl.render(&d)),
        Error::Usage(m) => Fail::Usage(m),
    })
}

fn options(c: &Common) -> Result<Options, Fail> {
    // Settings from the environment are checked once, here, like flags.
    texc_runtime::pool::threads_from_env().map_err(Fail::Usage)?;
    texc_runtime::roofline::roofline_from_env().map_err(Fail::Usage)?;
    let target = texc_pipeline::target(&c.target)?;
    // A target texc describes but cannot compile for is refused here, once, for every command.
    target.backend().map_err(|e| Fail::Usage(e.to_string()))?;
    let mut o = Options::from_env(target).map_err(Fail::Usage)?;
    if let Some(spec) = &c.dump_ir {
        o.dump = Dump::parse(spec).map_err(|e| Fail::Usage(format!("--dump-ir: {e}")))?;
    }
    o.verify |= c.verify_ir;
    o.time_passes = c.time_passes;
    o.rewrite = !c.no_rewrite;
    o.exact = c.exact;
    if let Some(t) = c.tolerance {
        if !(t.is_finite() && t > 0.0 && t < 1.0) {
            return Err(Fail::Usage(format!("--tolerance {t}: expected a relative error between 0 and 1, like 1e-4")));
        }
        o.tolerance = Some(t);
    }
    if let Some(m) = &c.max_memory {
        let bytes = texc_runtime::memory::parse_size(m)
            .ok_or_else(|| Fail::Usage(format!("--max-memory {m}: expected a size like 512M, 8G or 1000000")))?;
        o.max_memory = Some(bytes);
    }
    for (name, value) in parse_ints("--knob", &c.knob)? {
        o.knobs.insert(name, value);
    }
    Ok(o)
}

fn not_built(what: &str, needs: &str) -> Fail {
    Fail::Usage(format!("{what} is not built yet: it needs {needs}, which texc does not have yet"))
}

fn usage(m: impl Into<String>) -> Error {
    Error::Usage(m.into())
}

/// Parse `A=1,B=2` lists (repeatable flags) into pairs; a name given twice is an error.
fn parse_pairs(flag: &str, values: &[String]) -> Result<Vec<(String, String)>, Error> {
    let mut out: Vec<(String, String)> = Vec::new();
    for v in values {
        for part in v.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((n, x)) = part.split_once('=') else {
                return Err(usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            };
            let (n, x) = (n.trim(), x.trim());
            if n.is_empty() || x.is_empty() {
                return Err(usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            }
            if let Some((_, first)) = out.iter().find(|(m, _)| m == n) {
                return Err(usage(format!("{flag}: `{n}` is given twice (`{n}={first}` and `{n}={x}`)")));
            }
            out.push((n.to_string(), x.to_string()));
        }
    }
    Ok(out)
}

fn parse_ints(flag: &str, values: &[String]) -> Result<Vec<(String, i64)>, Error> {
    parse_pairs(flag, values)?
        .into_iter()
        .map(|(n, v)| match v.parse::<i64>() {
            Ok(x) => Ok((n, x)),
            Err(_) => Err(usage(format!("{flag}: `{n}={v}`: `{v}` is not an integer"))),
        })
        .collect()
}

fn bindings(c: &Common) -> Result<Bindings, Error> {
    let shapes = parse_ints("--shape", &c.shape)?;
    if let Some((n, v)) = shapes.iter().find(|(_, v)| *v < 0) {
        return Err(usage(format!("--shape: `{n}={v}`: a size cannot be negative")));
    }
    Ok(Bindings { shapes, consts: parse_ints("--const", &c.consts)?, input_shapes: HashMap::new() })
}

/// Load the file and pick the kernel.
fn kernel(pl: &mut Pipeline, c: &Common) -> Result<KernelRef, Error> {
    let m = pl.load(&c.file)?;
    pl.kernel(m, c.kernel.as_deref())
}

fn check(pl: &mut Pipeline, c: &Common) -> Result<(), Error> {
    let b = bindings(c)?;
    let m = pl.load(&c.file)?;
    let kernels: Vec<KernelRef> = match &c.kernel {
        Some(k) => vec![pl.kernel(m, Some(k))?],
        None => {
            (0..pl.session.module(m).kernels.len()).map(|i| KernelRef { module: m as u32, index: i as u32 }).collect()
        }
    };
    let mut specialized = 0;
    let mut diags = Vec::new();
    for k in &kernels {
        // Bounds and ranges need sizes: check at the sizes the source and flags give, when they give all.
        let info = pl.session.kernel(*k);
        let own = |n: &String| info.symbol_index(n).is_some() || info.param_index(n).is_some();
        let b = Bindings {
            shapes: b.shapes.iter().filter(|(n, _)| own(n)).cloned().collect(),
            consts: b.consts.iter().filter(|(n, _)| own(n)).cloned().collect(),
            input_shapes: HashMap::new(),
        };
        let sized = info.symbols.iter().all(|s| s.default.is_some() || b.shapes.iter().any(|(n, _)| *n == s.name))
            && info.params.iter().all(|p| match &p.info {
                texc_compiler::kernel::ParamInfo::Const { default } => {
                    default.is_some() || b.consts.iter().any(|(n, _)| *n == p.name)
                }
                _ => true,
            });
        if sized {
            match pl.specialize(*k, &b) {
                Ok(p) => {
                    specialized += 1;
                    diags.extend(pl.check_schedules(*k, &p));
                }
                Err(Error::Input(d)) => diags.extend(d),
                Err(e) => return Err(e),
            }
        }
    }
    if !diags.is_empty() {
        return Err(Error::Input(diags));
    }
    outln!(
        "ok: {} kernel{} checked; {} at concrete sizes (bounds proven)",
        kernels.len(),
        if kernels.len() == 1 { "" } else { "s" },
        specialized
    );
    Ok(())
}

fn emit(pl: &mut Pipeline, c: &Common, stage: &str) -> Result<(), Error> {
    if !STAGES.contains(&stage) {
        return Err(usage(format!("unknown stage `{stage}`; stages: {}", STAGES.join(", "))));
    }
    let t = pl.target();
    let backend_stage = !matches!(stage, "ast" | "tir" | "graph" | "egraph" | "loops");
    if stage == "loops" || backend_stage {
        pl.require_compiled(&format!("`--stage {stage}`"))?;
    }
    if backend_stage && !pl.text_stages().contains(&stage) {
        let printing: Vec<&str> = texc_compiler::target::all()
            .iter()
            .filter(|t| texc_codegen::backend_for(t).is_ok_and(|b| b.text_stages().contains(&stage)))
            .map(|t| t.name)
            .collect();
        return Err(if printing.is_empty() {
            usage(format!("stage `{stage}` is not built yet: it needs a later part of the compiler"))
        } else {
            usage(format!("target `{t}` has no stage `{stage}`; targets that print it: {}", printing.join(", ")))
        });
    }
    let m = pl.load(&c.file)?;
    if stage == "ast" {
        outp!("{}", texc_grammar::print::print_ast(&pl.session.module(m).ast));
        return Ok(());
    }
    let k = pl.kernel(m, c.kernel.as_deref())?;
    let b = bindings(c)?;
    match stage {
        "egraph" => {
            let written = pl.specialize(k, &b)?;
            let built = pl.rewrite(k, &b, written)?;
            let plan = built.plan.as_ref().expect("the rewrite pass makes a plan");
            outp!("{}", texc_compiler::rewrite::print_plan(plan, t, built.kept_original.as_deref()));
        }
        "graph" => outp!("{}", texc_compiler::graph::print_graph(&pl.specialize(k, &b)?)),
        "tir" => outp!("{}", texc_compiler::print::print_program(&pl.specialize(k, &b)?)),
        "loops" => {
            let (_, loops) = pl.build(k, &b)?;
            outp!("{}", texc_schedules::ir::print(&loops.lowered));
        }
        _ => {
            let (_, loops) = pl.build(k, &b)?;
            outp!("{}", pl.emit_text(&loops.legal, stage)?);
        }
    }
    Ok(())
}

/// Tensor files and scalar values of a run, read and parsed.
fn run_inputs(
    r: &RunArgs,
    budget: u64,
) -> Result<(HashMap<String, Tensor>, Vec<(String, f64)>, Vec<(String, String)>), Error> {
    let inputs = parse_pairs("--input", &r.input)?;
    let outputs = parse_pairs("--output", &r.output)?;
    let mut scalars = Vec::new();
    for (n, text) in parse_pairs("--scalar", &r.scalar)? {
        let v = text.parse::<f64>().map_err(|_| usage(format!("--scalar: `{n}={text}`: `{text}` is not a number")))?;
        scalars.push((n, v));
    }
    if let Some((n, _)) = inputs.iter().find(|(n, _)| scalars.iter().any(|(m, _)| m == n)) {
        return Err(usage(format!("`{n}` is given both as --input and as --scalar")));
    }
    let mut files = HashMap::new();
    for (n, path) in &inputs {
        let t = texc_runtime::read_npy_limited(&PathBuf::from(path), budget)
            .map_err(|e| Diagnostic::error(format!("input `{n}`: {e}")))?;
        files.insert(n.clone(), t);
    }
    Ok((files, scalars, outputs))
}

fn run_kernel(pl: &mut Pipeline, r: &RunArgs) -> Result<(), Error> {
    let c = &r.common;
    let t = pl.target();
    if r.check {
        pl.require_compiled("--check compares a compiled target with `interp`:")?;
    }
    let (files, scalars, outputs) = run_inputs(r, pl.options.memory_budget())?;
    let k = kernel(pl, c)?;
    let prep = pl.prepare(k, &bindings(c)?, files, &scalars, r.seed, r.check)?;
    if let Some(why) = prep.built.kept_original.as_ref().filter(|w| *w != "no cheaper plan") {
        eprintln!("note: {why}; running the graph as written");
    }
    let p = &prep.built.written;
    for (n, _) in &outputs {
        if !p.outputs.iter().any(|&o| p.tensor(o).name == *n) {
            return Err(Diagnostic::error(format!("`{n}` is not an output of kernel `{}`", p.name)).into());
        }
    }
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let results = match &prep.loops {
        None => texc_pipeline::interpret(p, prep.args.clone())?,
        Some(loops) => {
            let compiled = pl.compile(&loops.legal)?;
            outln!("compiled `{}` for {t} in {:.3} s", p.name, compiled.compile_time.as_secs_f64());
            compiled.run(prep.args.clone()).map_err(|e| Diagnostic::error(e.to_string()))?
        }
    };
    outln!("ran `{}` on {t} [{}]", p.name, sizes.join(", "));
    for (&o, x) in p.outputs.iter().zip(&results) {
        outln!("  {}", summary(&p.tensor(o).name, x));
    }
    for (n, path) in &outputs {
        let i = p.outputs.iter().position(|&o| p.tensor(o).name == *n).expect("checked above");
        write_npy(&PathBuf::from(path), &results[i]).map_err(|e| Diagnostic::error(e.to_string()))?;
        outln!("  wrote `{n}` to {path}");
    }
    if r.check {
        let want = texc_pipeline::interpret(p, prep.args)?;
        let names: Vec<String> = p.outputs.iter().map(|&o| p.tensor(o).name.clone()).collect();
        let mut bad = Vec::new();
        for ch in texc_pipeline::oracle::compare(&names, &results, &want, pl.options.tolerance) {
            outln!(
                "  check `{}` against interp: relative error {:.3e} (max |Δ| / max |exact|; tolerance {:e})",
                ch.name,
                ch.error,
                ch.tolerance
            );
            if !ch.passed() {
                bad.push(Diagnostic::error(format!(
                    "`{}` differs from the interpreter: relative error {:.3e} > {:e}",
                    ch.name, ch.error, ch.tolerance
                )));
            }
        }
        if !bad.is_empty() {
            return Err(Error::Input(bad));
        }
    }
    Ok(())
}

/// The machine's roofline for a target at the pool's thread count.
fn machine(t: &Target) -> (texc_runtime::roofline::Roofline, &'static str, usize) {
    let threads = texc_runtime::pool::num_threads();
    let lanes = t.lanes(texc_compiler::types::ElemType::F32) as usize;
    let (roof, source) = texc_runtime::roofline::roofline(t.name, lanes, threads);
    (roof, source, threads)
}

fn bench(pl: &mut Pipeline, a: &BenchArgs) -> Result<(), Error> {
    let t = pl.target();
    pl.require_compiled("`texc bench` times compiled code:")?;
    const MAX_RUNS: usize = 1_000_000;
    if a.repeat == 0 || a.repeat > MAX_RUNS {
        return Err(usage(format!("--repeat {}: expected 1 to {MAX_RUNS} timed runs", a.repeat)));
    }
    if a.warmup > MAX_RUNS {
        return Err(usage(format!("--warmup {}: expected at most {MAX_RUNS} runs", a.warmup)));
    }
    // FLOPs and bytes are those of the program as written (a rewritten plan,
    // e.g. Winograd, is credited with the work it replaces: effective rates).
    let (files, scalars, _) = run_inputs(&a.run, pl.options.memory_budget())?;
    let k = kernel(pl, &a.run.common)?;
    let prep = pl.prepare(k, &bindings(&a.run.common)?, files, &scalars, a.run.seed, false)?;
    let p = &prep.built.written;
    let compiled = pl.compile(&prep.loops.as_ref().expect("a compiled target").legal)?;
    let mut bufs = compiled.prepare(prep.args.clone()).map_err(|e| Diagnostic::error(e.to_string()))?;
    for _ in 0..a.warmup {
        compiled.call(&mut bufs);
    }
    let mut times: Vec<f64> = (0..a.repeat)
        .map(|_| {
            let start = std::time::Instant::now();
            compiled.call(&mut bufs);
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let counts = texc_compiler::cost::count(p);
    let (roof, source, threads) = machine(t);
    let gflops = counts.flops / median / 1e9;
    let gbs = counts.bytes / median / 1e9;
    let bound = roof.peak_gflops.min(counts.intensity() * roof.bandwidth_gbs);
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    outln!("bench `{}` on {t} [{}], {threads} thread{}", p.name, sizes.join(", "), if threads == 1 { "" } else { "s" });
    outln!("  compile   {:.4} s", compiled.compile_time.as_secs_f64());
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
fn compile_aot(pl: &mut Pipeline, c: &Common, output: Option<&Path>) -> Result<(), Error> {
    let Some(out) = output else {
        return Err(usage("`texc compile` needs `-o out.o` or `-o out.so`"));
    };
    pl.require_compiled("`texc compile`")?;
    let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext != "o" && ext != "so" {
        return Err(usage(format!("`-o {}`: the output must end in .o or .so", out.display())));
    }
    let k = kernel(pl, c)?;
    let (_, loops) = pl.build(k, &bindings(c)?)?;
    let (object_bytes, header) = pl.emit_object(&loops.legal)?;
    let fail = |e: String| Error::from(Diagnostic::error(e));
    // Every output is written beside its path and renamed over it, so a
    // reader (or a concurrent texc) never sees half a file.
    let cannot = |p: &Path, e: std::io::Error| fail(format!("cannot write {}: {e}", p.display()));
    if ext == "o" {
        texc_runtime::atomic::write(out, &object_bytes).map_err(|e| cannot(out, e))?;
    } else {
        let object = texc_runtime::atomic::temporary_beside(&out.with_extension("o"));
        let linked = texc_runtime::atomic::temporary_beside(out);
        texc_runtime::atomic::write(&object, &object_bytes).map_err(|e| cannot(&object, e))?;
        let status = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-o"])
            .arg(&linked)
            .arg(&object)
            .status();
        let _ = std::fs::remove_file(&object);
        let status = status.map_err(|e| fail(format!("cannot run the C compiler to link {}: {e}", out.display())))?;
        if !status.success() {
            let _ = std::fs::remove_file(&linked);
            return Err(fail(format!("linking {} failed", out.display())));
        }
        texc_runtime::atomic::replace(&linked, out).map_err(|e| cannot(out, e))?;
    }
    let header_path = out.with_extension("h");
    texc_runtime::atomic::write(&header_path, header.as_bytes()).map_err(|e| cannot(&header_path, e))?;
    outln!("wrote {} and {} (int texc_{}_run(...))", out.display(), header_path.display(), loops.legal.p.name);
    Ok(())
}

fn analyze(pl: &mut Pipeline, c: &Common, plot: Option<&Path>) -> Result<(), Error> {
    let t = pl.target();
    pl.require_compiled("`texc analyze` needs the machine of a target:")?;
    if let Some(path) = plot {
        if path.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(usage(format!("--plot {}: the plot is an .svg file", path.display())));
        }
    }
    let k = kernel(pl, c)?;
    let p = pl.specialize(k, &bindings(c)?)?;
    let (roof, source, threads) = machine(t);
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    outln!("analyze `{}` for {t} [{}]", p.name, sizes.join(", "));
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
    let moved: f64 = ops.iter().map(|(_, c)| c.bytes).sum();
    outln!(
        "  {:<36} {:>12.3} {:>12.1} {:>9.2} {:>8} {:>12.2}",
        "total (operators run one by one)",
        all.flops / 1e6,
        moved / 1e3,
        all.flops / moved.max(1.0),
        "",
        total_us
    );
    if let Some(path) = plot {
        texc_runtime::atomic::write(path, roofline_svg(&p.name, &roof, &ops).as_bytes())
            .map_err(|e| Error::from(Diagnostic::error(format!("cannot write {}: {e}", path.display()))))?;
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
